/*
 * Mooncake-C P2P store: distribution of large objects (checkpoints) where every node that has
 * fetched a piece serves it to the next, with the object's metadata in the metadata service
 * (etcd across hosts, the embedded file:// store on one machine) and no central server.
 *
 * An object is a list of registered buffers cut into shards of a fixed size (the last one
 * shorter). Its origin publishes, once, the object's description (size, shard size, each
 * shard's XXH3-64 checksum, xxHash's XXH3_64bits with seed 0). Every holder (the origin, and
 * each fetcher as soon as a shard of it has been verified) publishes one replica entry of its
 * own, tied to its engine's lease, saying which shards it serves and where they are: many
 * fetchers never write one document, and a dead holder's entry vanishes with its process. The
 * description has no lease: it outlives its origin, so that replicas go on serving an object
 * whose origin died, until someone removes it (mc_p2p_unregister, mc_p2p_remove).
 *
 * Keys, under mooncake/[cluster/]p2p/<name>/ (the trailing separator keeps "foo" apart from
 * "foo2"): "object" (the description), "replica/<segment>" (one per holder). Names: 1 to 128
 * characters of [A-Za-z0-9._-] and '/', not starting or ending with '/', no "//", no "." or
 * ".." component, and no component "replica" (which would make the replica entries of
 * "a/replica" those of "a").
 *
 * Conventions as in error.h, except that the reason of a failure is read with
 * mc_p2p_last_error() (it includes the engine's or the store's reason when one of them
 * failed). Functions block (they wait for the metadata service and for transfers); every one
 * may be called from any thread, on different objects at once.
 *
 * Buffers: a call that lets go of them (mc_p2p_unregister, mc_p2p_delete_replica, and a
 * failing mc_p2p_register, mc_p2p_get_replica or mc_p2p_serve) returns -EBUSY when the engine
 * may still use them: a registration could not be dropped (mc_mem_unregister said
 * -MC_ETIMEOUT: something in flight still touched the memory after the engine's transfer
 * timeout), or another call on the name is under way. They
 * must then stay valid until mc_p2p_destroy returns; after any other return they may be freed.
 */
#ifndef MOONCAKE_P2P_H
#define MOONCAKE_P2P_H

#include <stddef.h>
#include <stdint.h>

#include <mooncake/engine.h>

#ifdef __cplusplus
extern "C" {
#endif

/* libmooncake_p2p's exports (the engine's own are MC_API). */
#define MC_P2P_API __attribute__((visibility("default")))

#define MC_P2P_NAME_MAX   129 /* object names, including the terminating NUL */
#define MC_P2P_SHARDS_MAX 65536

typedef struct mc_p2p mc_p2p_t;

/* One piece of an object's memory, in order: the object is the concatenation of its buffers. */
typedef struct mc_p2p_buf {
    void *addr;
    uint64_t len;
} mc_p2p_buf_t;

/* Create a node: an engine (config as for mc_engine_create, NULL: defaults and environment;
 * its METADATA must be a store, not "none", and PROGRESS_THREAD must be on, since a node
 * serves peers while the host does something else: -EINVAL otherwise) and a handle on its
 * metadata store (opened with MC_ETCD_* from the environment). Free with mc_p2p_destroy,
 * which withdraws everything the node published or holds; no call on the node may be under
 * way then. */
MC_P2P_API int mc_p2p_create(const mc_config_t *config, mc_p2p_t **p2p_p);
MC_P2P_API void mc_p2p_destroy(mc_p2p_t *p2p);

/* The node's engine (its segment serves the shards). */
MC_P2P_API mc_engine_t *mc_p2p_engine(mc_p2p_t *p2p);

/* The reason of the last failure of a mc_p2p_* call on the calling thread; "" if none. Valid
 * until the next failing mc_p2p_* call on this thread. */
MC_P2P_API const char *mc_p2p_last_error(void);

/* ---- publishing ------------------------------------------------------------------------- */

typedef struct mc_p2p_register_opts {
    size_t size;         /* sizeof(mc_p2p_register_opts_t) */
    uint64_t shard_size; /* 0: 64 MiB; at least 4096; at most MC_P2P_SHARDS_MAX shards */
    int force;           /* replace an object of that name published by anyone */
} mc_p2p_register_opts_t;

/* Publish an object: register the buffers with the engine (one registration of the node's own
 * on each, dropped by unregister), checksum every shard, publish the description and this
 * node's replica entry (all shards). The buffers must stay valid and unchanged until
 * mc_p2p_unregister. -EEXIST if the name is published already (unless force) or held by this
 * node (a description with this node's segment as origin and the same bytes, left by a register
 * that failed with -MC_EMETA after the store took it, is not: it is adopted; nor is one whose
 * origin is gone from the store with every copy: it is replaced), -EINVAL for a bad
 * name or buffers (the reason says which), -MC_EMETA if the store cannot be reached. opts may be
 * NULL. */
MC_P2P_API int mc_p2p_register(mc_p2p_t *p2p, const char *name, const mc_p2p_buf_t *bufs, size_t n,
                               const mc_p2p_register_opts_t *opts);

/* Withdraw an object this node published: its description goes (fetchers that have not
 * started fail with -ENOENT; those under way finish from the holders they know), and its
 * replica entry, then the buffers' registration. keep_replicas: other holders' entries stay
 * and they go on serving each other what they have; otherwise every entry of the object is
 * deleted. -ENOENT if this node did not publish it. */
MC_P2P_API int mc_p2p_unregister(mc_p2p_t *p2p, const char *name, int keep_replicas);

/* Remove an object from the store whoever published it (a command line's "rm"): its
 * description and, unless keep_replicas, every replica entry. Holders keep their memory
 * registered until they withdraw; fetchers under way finish from the holders they know.
 * -ENOENT if there is no such object, -EBUSY if it was replaced (force) while being removed.
 * For an object this node holds, use mc_p2p_unregister or mc_p2p_delete_replica. */
MC_P2P_API int mc_p2p_remove(mc_p2p_t *p2p, const char *name, int keep_replicas);

/* ---- fetching --------------------------------------------------------------------------- */

typedef enum mc_p2p_order {
    MC_P2P_RAREST_FIRST = 0, /* shards with the fewest holders first, ties at random */
    MC_P2P_RANDOM = 1,
} mc_p2p_order_t;

/* Where a fetch stands, for a progress display. */
typedef struct mc_p2p_progress {
    uint64_t bytes_done, bytes_total;
    uint32_t shards_done, shards_total;
    uint32_t holders_in_use;    /* distinct holders with a shard in flight now */
    uint64_t bytes_from_origin; /* verified bytes fetched from the object's origin */
    uint64_t bytes_from_replicas;
    uint32_t corrupt; /* shards whose checksum did not match (fetched again elsewhere) */
    uint32_t retries; /* shards started again after a failed or slow holder */
} mc_p2p_progress_t;

/* Progress report; return non-zero to stop the fetch (it then returns -MC_ECANCELED). */
typedef int (*mc_p2p_progress_cb)(void *arg, const mc_p2p_progress_t *progress);

typedef struct mc_p2p_get_opts {
    size_t size;           /* sizeof(mc_p2p_get_opts_t) */
    unsigned max_inflight; /* shards in flight at once; 0: 8 */
    mc_p2p_order_t order;
    int origin_only; /* fetch only from the origin (a comparison, "--no-p2p") */
    int no_serve;    /* do not become a holder */
    unsigned
        shard_timeout_ms;  /* a shard whose bytes do not come for this long (queued or
                              stalled) is started again elsewhere, as is one that takes longer
                              from its first bytes (the engine's task timeout); also how long
                              the fetch waits for a holder of a shard nobody live has; 0: 30 s */
    mc_p2p_progress_cb cb; /* optional, from the calling thread, every 100 ms and at the end */
    void *cb_arg;
    uint64_t max_rate; /* bytes per second this fetch may take (bursts of one shard); 0: any */
} mc_p2p_get_opts_t;

/* Fetch an object into local buffers (their total length must equal the object's, and no two
 * may overlap: -EINVAL),
 * registered with the node's engine (one registration of the node's own on each). Each shard
 * comes from a holder chosen when it starts (other replicas first, the least loaded of them;
 * the origin last, as everyone's last resort), is verified, and from then on this node serves it
 * (unless no_serve) and stays a holder until mc_p2p_delete_replica. A holder that fails or is slow
 * is skipped and the shard fetched elsewhere; one that sends a corrupt shard is avoided for the
 * rest of the fetch; one that cannot be reached is tried again after a rest (0.25 s, then 0.5 s)
 * and dropped the third time in a row. The store may be unreachable for a while mid-fetch:
 * transfers go on with the holders known, and the replica entry is put when it is back. Returns 0
 * when every shard is verified; -ENOENT if the object does not exist, -EEXIST if this node holds it
 * already, -MC_EPEERDEAD if some shard has no live holder left (for shard_timeout_ms), -EILSEQ if a
 * shard's every holder failed verification, -MC_EMETA if the store is unreachable at the start for
 * longer than the engine's CONNECT_TIMEOUT_MS or while no shard can proceed without it,
 * -MC_ECANCELED if the callback stopped it, or the last error of a shard that failed 16 times
 * (-MC_ETIMEOUT, ...). On failure nothing is held: the replica entry is withdrawn and the buffers
 * unregistered (or -EBUSY, see "Buffers" above). *progress_p (may be NULL) gets the final figures
 * either way. The buffers must stay valid until mc_p2p_delete_replica. */
MC_P2P_API int mc_p2p_get_replica(mc_p2p_t *p2p, const char *name, const mc_p2p_buf_t *bufs,
                                  size_t n, const mc_p2p_get_opts_t *opts,
                                  mc_p2p_progress_t *progress_p);

/* Serve a complete copy this node has already (a file fetched before): verify every shard of
 * the local buffers against the description, register them and publish this node's replica
 * entry with every shard. -EILSEQ naming the first shard that does not match, -EINVAL if their
 * total length is not the object's, -ENOENT if the object does not exist, -EEXIST if this node
 * holds it already. Withdraw with mc_p2p_delete_replica. */
MC_P2P_API int mc_p2p_serve(mc_p2p_t *p2p, const char *name, const mc_p2p_buf_t *bufs, size_t n);

/* Stop serving an object fetched or served here: the replica entry goes, then the buffers'
 * registration. -ENOENT if this node holds no replica of it (the origin uses unregister). */
MC_P2P_API int mc_p2p_delete_replica(mc_p2p_t *p2p, const char *name);

/* ---- listing ---------------------------------------------------------------------------- */

typedef struct mc_p2p_object_info {
    char name[MC_P2P_NAME_MAX];
    uint64_t size, shard_size;
    uint32_t shards;
    uint32_t holders;          /* replica entries, the origin's included */
    uint32_t complete_holders; /* holders of every shard */
    char origin[MC_NAME_MAX];  /* the segment that published it */
} mc_p2p_object_info_t;

/* Objects whose name starts with prefix ("" or NULL: all), sorted by name. Free *infos_p with
 * free(). */
MC_P2P_API int mc_p2p_list(mc_p2p_t *p2p, const char *prefix, mc_p2p_object_info_t **infos_p,
                           size_t *count_p);

/* One object by name (what a fetcher needs to size its buffers). -ENOENT if there is none. */
MC_P2P_API int mc_p2p_stat(mc_p2p_t *p2p, const char *name, mc_p2p_object_info_t *info_p);

#ifdef __cplusplus
}
#endif
#endif
