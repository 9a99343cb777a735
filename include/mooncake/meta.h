/*
 * Mooncake-C metadata service: the store the engine publishes its segments in, for hosts such
 * as the P2P store.
 *
 * A small key-value store with revisions, leases and watches, over two backends:
 * "etcd://HOST:PORT[,HOST:PORT]" (etcd's v3 JSON gateway; credentials and TLS from
 * MC_ETCD_USER, MC_ETCD_PASSWORD, MC_ETCD_CACERT, MC_ETCD_CERT, MC_ETCD_KEY, bound of each call
 * MC_ETCD_TIMEOUT_MS) and "file://DIR" (embedded, one machine, no server).
 *
 * Keys and values are byte strings with explicit lengths (values are JSON by convention). Every
 * successful put or delete raises the store's revision by one (a delete_prefix: by one for all
 * its keys); a key's mod_revision is the revision of its last put. A key put with a lease
 * disappears when the lease expires or is revoked. Keys of the project live under
 * mooncake/[cluster/]<kind>/ (mc_meta_key); a prefix a host lists or watches should end with a
 * separator, so that "foo/" never matches "foo2/".
 *
 * Conventions as in error.h: 0 or a negative code, the reason in mc_last_error(); a NULL handle
 * or required output pointer is -EINVAL. Every function may be called from any thread; one
 * mc_meta_t may be shared by several threads, one mc_meta_watch_t is used by one at a time.
 */
#ifndef MOONCAKE_META_H
#define MOONCAKE_META_H

#include <stddef.h>
#include <stdint.h>

#include <mooncake/engine.h>
#include <mooncake/error.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mc_meta mc_meta_t;
typedef struct mc_meta_watch mc_meta_watch_t;

typedef struct mc_meta_kv {
    char *key; /* malloc'ed, NUL-terminated for convenience; key_len is authoritative */
    size_t key_len;
    char *value; /* malloc'ed, NUL-terminated for convenience */
    size_t value_len;
    int64_t mod_revision;
    int64_t lease; /* 0 = none */
} mc_meta_kv_t;

typedef enum mc_meta_event_type { MC_META_PUT = 0, MC_META_DELETE = 1 } mc_meta_event_type_t;

typedef struct mc_meta_event {
    mc_meta_event_type_t type;
    mc_meta_kv_t kv; /* for DELETE: key set, value empty, mod_revision = revision of deletion */
} mc_meta_event_t;

/* Open a store by URL. -EINVAL for an unknown scheme or a malformed URL, -MC_ECONFIG for a bad
 * MC_ETCD_* setting, -MC_EMETA when the service cannot be reached. Close with mc_meta_close. */
MC_API int mc_meta_open(const char *url, mc_meta_t **meta_p);

/* Open the store a configuration names (its METADATA, with its ETCD_* credentials, TLS files
 * and bound: what an engine created from it uses); NULL: the defaults and the environment.
 * -EINVAL when METADATA is "none". */
MC_API int mc_meta_open_config(const mc_config_t *config, mc_meta_t **meta_p);
MC_API void mc_meta_close(mc_meta_t *meta);

/* Get one key: -ENOENT if absent (or its lease expired). Free with mc_meta_kv_free. */
MC_API int mc_meta_get(mc_meta_t *meta, const void *key, size_t key_len, mc_meta_kv_t *kv_p);

/* Put a key (lease 0: none). *revision_p (may be NULL) gets the new store revision. */
MC_API int mc_meta_put(mc_meta_t *meta, const void *key, size_t key_len, const void *val,
                       size_t val_len, int64_t lease, int64_t *revision_p);

/* Put only if the key's mod_revision equals expected (0: the key must not exist);
 * -MC_ECONFLICT otherwise, nothing written. */
MC_API int mc_meta_cas(mc_meta_t *meta, const void *key, size_t key_len,
                       int64_t expected_mod_revision, const void *val, size_t val_len,
                       int64_t lease, int64_t *revision_p);

/* Delete a key. mod_revision 0: whatever its revision; otherwise only if its mod_revision is
 * that one (-MC_ECONFLICT if not: someone rewrote it since it was read). -ENOENT if absent. */
MC_API int mc_meta_delete(mc_meta_t *meta, const void *key, size_t key_len, int64_t mod_revision);

/* Delete every key that starts with prefix (not empty: -EINVAL); *deleted_p (may be NULL) gets
 * how many. */
MC_API int mc_meta_delete_prefix(mc_meta_t *meta, const void *prefix, size_t prefix_len,
                                 size_t *deleted_p);

/* Every key that starts with prefix (empty: every key), sorted by key bytes, as of store
 * revision *revision_p (may be NULL): a watch from *revision_p + 1 misses no change and repeats
 * none. Free with mc_meta_kvs_free. */
MC_API int mc_meta_list(mc_meta_t *meta, const void *prefix, size_t prefix_len,
                        mc_meta_kv_t **kvs_p, size_t *count_p, int64_t *revision_p);

/* Leases: granted with a TTL in seconds (>= 1); kept alive (-ENOENT once expired); revoked
 * (its keys are deleted). */
MC_API int mc_meta_lease_grant(mc_meta_t *meta, unsigned ttl_s, int64_t *lease_p);
MC_API int mc_meta_lease_keepalive(mc_meta_t *meta, int64_t lease);
MC_API int mc_meta_lease_revoke(mc_meta_t *meta, int64_t lease);

/* Watch the keys under prefix from start_revision (0: from now). mc_meta_watch_next waits up to
 * timeout_ms (-1: forever) for the next event: 0 with *event_p filled (free event_p->kv with
 * mc_meta_kv_free), or -ETIMEDOUT. Events of one key come in revision order. The file://
 * backend looks at the store on every change (and every 100 ms while leased keys may expire):
 * several changes of one key between two looks come as one event, its latest state. A watch
 * from a revision too old for the service's history (etcd's compaction, the file:// deletion
 * log's bound) starts with the keys as they are, and misses deletions from before that; a
 * watch that falls that far behind later (its etcd stream cut off) reports the keys it knew
 * that went meanwhile as deleted. */
MC_API int mc_meta_watch_create(mc_meta_t *meta, const void *prefix, size_t prefix_len,
                                int64_t start_revision, mc_meta_watch_t **watch_p);
MC_API int mc_meta_watch_next(mc_meta_watch_t *watch, int timeout_ms, mc_meta_event_t *event_p);
MC_API void mc_meta_watch_destroy(mc_meta_watch_t *watch);

MC_API void mc_meta_kv_free(mc_meta_kv_t *kv);
MC_API void mc_meta_kvs_free(mc_meta_kv_t *kvs, size_t count);

/* Build "mooncake/[cluster_id/]<kind>/<name>" into buf (NUL-terminated): the project's key
 * layout (cluster_id NULL or "": none; MC_METADATA_CLUSTER_ID is the engine's). Returns its
 * length, -ENAMETOOLONG, or -EINVAL if buf, kind or name is NULL. */
MC_API int mc_meta_key(char *buf, size_t size, const char *cluster_id, const char *kind,
                       const char *name);

#ifdef __cplusplus
}
#endif
#endif
