/*
 * Mooncake-C KV-cache backend plugin: the C ABI.
 *
 * A serving stack moves KV cache between prefill and decode instances through a transfer
 * backend it loads at run time. libmooncake_kv.so is such a backend, with the semantics of
 * NIXL's backend plugins in plain C, so that a host in C, C++, Rust or Python (ctypes) can drop
 * it in. The plugin exports one symbol, mc_kv_plugin_init(), which returns a constant table of
 * operations; everything else in the .so (the whole engine) is hidden, so it loads on a host
 * with no other Mooncake library. include/mooncake/kv_loader.h loads it and checks the ABI.
 *
 * Model (NIXL's names in brackets):
 *   - An instance [backend engine] is one transfer engine with an agent name.
 *   - Memory is registered region by region [registerMem]; each region gets a metadata handle
 *     (mc_kv_md_t) that the host passes back with every descriptor in it.
 *   - A peer needs the instance's connection info [getConnInfo] (its agent name, address and
 *     segment name) and, per region it will access, the region's public data [getPublicData].
 *     The host carries both over its own side channel; the peer loads them [loadRemoteConnInfo,
 *     loadRemoteMD] and gets a metadata handle for each remote region.
 *   - A transfer [prepXfer] is two equal-length descriptor lists {addr, len, dev_id, md}: local
 *     and remote, with READ (remote to local) or WRITE (local to remote). It is prepared once,
 *     posted [postXfer] and checked [checkXfer] as often as the host likes, and released.
 *   - Notifications [genNotif, getNotifs] carry {sender agent, message}; one may ride on a
 *     post, and is then delivered after every byte of the transfer is in the remote memory.
 *
 * Conventions at this boundary: operations return mc_kv_status_t (NIXL's values). Every
 * failure also leaves a message, read with last_error(instance), that says what failed and
 * why. Output pointers are set only on success.
 *
 * Threads: register/deregister, load/unload of metadata and connection info, connect,
 * disconnect and get_notif are "exclusive": the host calls them from one thread at a time and
 * not while other calls run on the instance. prep/post/check/release_xfer and gen_notif may be
 * called from several threads at once on different transfer handles. Progress runs on the
 * instance's own thread: transfers move and notifications arrive whether or not the host
 * calls in.
 */
#ifndef MOONCAKE_KV_PLUGIN_H
#define MOONCAKE_KV_PLUGIN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The ABI's version. A host passes the version it was built with to mc_kv_plugin_init; the
 * plugin refuses a host whose major differs or whose minor is newer than its own (the table
 * would lack entries that host reads). The table only grows at its end within a major. */
#define MC_KV_ABI_MAJOR           1
#define MC_KV_ABI_MINOR           0
#define MC_KV_ABI_VERSION(ma, mi) (((uint32_t)(ma) << 16) | (uint32_t)(mi))
#define MC_KV_ABI_CURRENT         MC_KV_ABI_VERSION(MC_KV_ABI_MAJOR, MC_KV_ABI_MINOR)
#define MC_KV_ABI_MAJOR_OF(v)     ((uint32_t)(v) >> 16)
#define MC_KV_ABI_MINOR_OF(v)     ((uint32_t)(v)&0xffffu)

/* The one symbol a plugin exports, and its type (for dlsym). */
#define MC_KV_PLUGIN_INIT_SYMBOL "mc_kv_plugin_init"

/* Status values: NIXL's, so that a host maps them one to one. */
typedef enum mc_kv_status {
    MC_KV_IN_PROG = 1,
    MC_KV_SUCCESS = 0,
    MC_KV_ERR_NOT_POSTED = -1,
    MC_KV_ERR_INVALID_PARAM = -2,
    MC_KV_ERR_BACKEND = -3,
    MC_KV_ERR_NOT_FOUND = -4,
    MC_KV_ERR_MISMATCH = -5,
    MC_KV_ERR_NOT_ALLOWED = -6,
    MC_KV_ERR_REPOST_ACTIVE = -7,
    MC_KV_ERR_UNKNOWN = -8,
    MC_KV_ERR_NOT_SUPPORTED = -9,
    MC_KV_ERR_REMOTE_DISCONNECT = -10,
    MC_KV_ERR_CANCELED = -11,
} mc_kv_status_t;

/* Memory types, NIXL's order. mem_types in the table is a bit mask of 1u << type. */
typedef enum mc_kv_mem_type {
    MC_KV_DRAM = 0,
    MC_KV_VRAM = 1, /* dev_id is the CUDA device */
    MC_KV_BLK = 2,
    MC_KV_OBJ = 3,
    MC_KV_FILE = 4,
} mc_kv_mem_type_t;

typedef enum mc_kv_op {
    MC_KV_READ = 0,  /* remote -> local */
    MC_KV_WRITE = 1, /* local -> remote */
} mc_kv_op_t;

#define MC_KV_AGENT_MAX  128         /* agent names, including the terminating NUL */
#define MC_KV_NOTIF_MAX  (63 * 1024) /* largest notification message */
#define MC_KV_PUBLIC_MAX 256         /* largest public data of one region */
#define MC_KV_CONN_MAX   256         /* largest connection info */
#define MC_KV_XFER_MAX   (1u << 26)  /* most descriptor pairs in one transfer */

typedef struct mc_kv_backend mc_kv_backend_t; /* an instance */
typedef struct mc_kv_md mc_kv_md_t;           /* a local region, or a loaded remote one */
typedef struct mc_kv_xfer mc_kv_xfer_t;       /* a prepared transfer */

/* One option: a key, its value (and, in the table's list, a one-line description). */
typedef struct mc_kv_option {
    const char *key;
    const char *value;
    const char *help; /* NULL in options a host passes */
} mc_kv_option_t;

/* What create() needs. Zero-filled fields mean defaults; size makes room for more. */
typedef struct mc_kv_init {
    size_t size;                   /* sizeof(mc_kv_init_t) */
    const char *agent;             /* this instance's agent name (required, < MC_KV_AGENT_MAX) */
    const mc_kv_option_t *options; /* key=value, keys as in the table's option list */
    size_t n_options;
} mc_kv_init_t;

typedef struct mc_kv_caps {
    int supports_remote; /* transfers to other agents */
    int supports_local;  /* transfers within the instance (load_local_md) */
    int supports_notif;
    uint32_t mem_types; /* usable now: bit 1u << mc_kv_mem_type_t */
} mc_kv_caps_t;

/* A region to register. FILE (NIXL's FILE_SEG): addr is the offset in the file where the region
 * starts, len its length (0: to the end of the file), dev_id an open descriptor of a regular
 * file or a block device, read-only or read-write (O_DSYNC or O_SYNC: a WRITE completes once
 * its data is durable), which must stay open until deregister_mem; descriptors of a FILE region
 * name offsets in the file. */
typedef struct mc_kv_region {
    uint64_t addr;
    uint64_t len;
    uint64_t dev_id; /* NUMA node hint for DRAM (ignored), CUDA device for VRAM, a file
                        descriptor for FILE */
    mc_kv_mem_type_t type;
} mc_kv_region_t;

/* One descriptor of a transfer: a range inside the region whose metadata handle is md (local
 * lists: a handle from register_mem; remote lists: one from load_remote_md/load_local_md). */
typedef struct mc_kv_desc {
    uint64_t addr;
    uint64_t len;
    uint64_t dev_id;
    mc_kv_md_t *md;
} mc_kv_desc_t;

/* A received notification. */
typedef struct mc_kv_notif {
    char agent[MC_KV_AGENT_MAX]; /* the sender's agent name */
    size_t len;
    unsigned char msg[MC_KV_NOTIF_MAX];
} mc_kv_notif_t;

typedef struct mc_kv_plugin {
    /* ---- ABI 1.0 ---- */
    size_t size; /* sizeof the table as the plugin built it */
    uint32_t abi_major, abi_minor;
    const char *name;    /* "mooncake" */
    const char *version; /* the plugin's own version, "0.1.0" */
    uint32_t mem_types;  /* what the plugin can handle at all: bit 1u << mc_kv_mem_type_t */
    const mc_kv_option_t *options; /* the options create() takes, with defaults */
    size_t n_options;

    /* Create an instance. Unknown keys and invalid values fail (INVALID_PARAM) naming the key;
     * the message is then last_error(NULL) on the calling thread. */
    mc_kv_status_t (*create)(const mc_kv_init_t *init, mc_kv_backend_t **backend_p);
    /* Destroy an instance: in-flight transfers end, every handle of it becomes invalid. */
    void (*destroy)(mc_kv_backend_t *b);
    /* The message of the last failure on this instance (NULL: of the last create() that
     * failed on this thread). Never NULL; "" if none. Valid until the next failing call. */
    const char *(*last_error)(mc_kv_backend_t *b);
    mc_kv_status_t (*caps)(mc_kv_backend_t *b, mc_kv_caps_t *caps_p);

    /* Register one contiguous region; the handle is freed by deregister_mem. The memory must
     * stay valid until then. */
    mc_kv_status_t (*register_mem)(mc_kv_backend_t *b, const mc_kv_region_t *region,
                                   mc_kv_md_t **md_p);
    /* NOT_ALLOWED while a prepared transfer or a loaded local view uses it. */
    mc_kv_status_t (*deregister_mem)(mc_kv_backend_t *b, mc_kv_md_t *md);

    /* The bytes a peer needs to access a local region: call with *len_p = room; on success
     * *len_p is the length (at most MC_KV_PUBLIC_MAX); INVALID_PARAM with *len_p set if short. */
    mc_kv_status_t (*public_data)(mc_kv_backend_t *b, mc_kv_md_t *md, void *buf, size_t *len_p);
    /* The instance's connection info (agent name, address and engine segment name), as
     * public_data. BACKEND if the names do not fit in MC_KV_CONN_MAX. */
    mc_kv_status_t (*conn_info)(mc_kv_backend_t *b, void *buf, size_t *len_p);

    /* Learn a remote agent from its connection info. MISMATCH if the info names another agent
     * or comes from another version of this plugin (their notifications differ); NOT_ALLOWED if the
     * agent is loaded with other info (disconnect it first). Never blocks: the connection is made
     * at connect() or at the first transfer. */
    mc_kv_status_t (*load_remote_conn_info)(mc_kv_backend_t *b, const char *agent, const void *info,
                                            size_t len);
    /* Wait (up to the connect timeout) until the agent answers: SUCCESS, NOT_FOUND (unknown
     * agent) or REMOTE_DISCONNECT. Optional. */
    mc_kv_status_t (*connect)(mc_kv_backend_t *b, const char *agent);
    /* Forget the agent: NOT_ALLOWED while remote metadata of it is loaded (unload it first),
     * which prepared transfers hold. Waits until the agent took the notifications sent to it
     * before (gen_notif, and those of posts that ended), up to MC_TRANSFER_TIMEOUT (then
     * BACKEND, and the agent stays: its host does not pop them), then (up to the connect
     * timeout) for released transfers' bytes still on the wire to settle. Load its connection
     * info again to reach a restarted process. */
    mc_kv_status_t (*disconnect)(mc_kv_backend_t *b, const char *agent);

    /* Load a remote region from the public data its owner produced; the handle is freed by
     * unload_md. NOT_FOUND if the agent's connection info is not loaded. */
    mc_kv_status_t (*load_remote_md)(mc_kv_backend_t *b, const char *agent, const void *data,
                                     size_t len, mc_kv_md_t **md_p);
    /* The loopback view of a local region, for transfers within the instance (the remote agent
     * of such a transfer is the instance's own name). */
    mc_kv_status_t (*load_local_md)(mc_kv_backend_t *b, mc_kv_md_t *local, mc_kv_md_t **md_p);
    /* NOT_ALLOWED while a prepared transfer uses it. */
    mc_kv_status_t (*unload_md)(mc_kv_backend_t *b, mc_kv_md_t *md);

    /* Prepare a transfer of count descriptor pairs: local[i] and remote[i] have equal lengths,
     * every descriptor lies inside its md's region, every remote md belongs to agent. count is
     * 1 to MC_KV_XFER_MAX (INVALID_PARAM past it: split the transfer); adjacent pairs
     * contiguous on both sides are merged. */
    mc_kv_status_t (*prep_xfer)(mc_kv_backend_t *b, mc_kv_op_t op, const mc_kv_desc_t *local,
                                const mc_kv_desc_t *remote, size_t count, const char *agent,
                                mc_kv_xfer_t **xfer_p);
    /* Start it, never blocking. notif (len bytes, NULL for none) is delivered to the agent once
     * every byte is in place there, exactly once, whether or not this host polls again or
     * releases the handle after that (see release_xfer).
     * SUCCESS if done already, IN_PROG, REPOST_ACTIVE if the previous post has not finished,
     * or an error (nothing moves then, and check_xfer says NOT_POSTED, except after
     * REPOST_ACTIVE; BACKEND with "queued or unacknowledged" in last_error when the agent has
     * not taken the notifications sent to it so far: post again later). A finished transfer may
     * be posted again. */
    mc_kv_status_t (*post_xfer)(mc_kv_backend_t *b, mc_kv_xfer_t *x, const void *notif, size_t len);
    /* IN_PROG, SUCCESS, or what ended it: REMOTE_DISCONNECT (the peer died or cannot be
     * reached), CANCELED, NOT_ALLOWED (the remote range is not registered there any more),
     * BACKEND (timeout, I/O error: see last_error). NOT_POSTED before the first post. */
    mc_kv_status_t (*check_xfer)(mc_kv_backend_t *b, mc_kv_xfer_t *x);
    /* Free a transfer handle; never blocks. A post still in flight is aborted: what has not
     * completed is canceled (bytes already on the wire may still land there) and its
     * notification is never sent. A post whose every descriptor completed is not undone: its
     * notification is delivered, exactly once, whether or not check_xfer had reported SUCCESS
     * yet. (Which of the two a release meets when the last descriptor completes at that very
     * moment is decided by the engine, once.) */
    mc_kv_status_t (*release_xfer)(mc_kv_backend_t *b, mc_kv_xfer_t *x);

    /* Send a notification on its own: in order with this instance's other gen_notifs to the
     * agent and with the notifications of its posts that ended before (check_xfer said SUCCESS).
     * A post's notification goes when its last byte is in place, so one sent while that post is
     * in flight may come first (as in NIXL's UCX backend). */
    mc_kv_status_t (*gen_notif)(mc_kv_backend_t *b, const char *agent, const void *msg, size_t len);
    /* Pop one received notification: 1 with *out filled, 0 if none is queued, or an error
     * status. Notifications of one sender come in the order it sent them. The sender's agent
     * name is checked against the process (engine segment) it came from: MISMATCH, the
     * notification dropped and last_error naming both, if it names a loaded agent but comes
     * from another process than that agent's connection info names, or comes from a loaded
     * agent's process but names another agent. A sender whose connection info is not loaded
     * here is taken at its word (a host may hear from agents it never loaded). A plain engine
     * notification (mc_notify_send by a process that uses the engine, not this plugin) comes
     * whole, its agent the sender's segment name; NOT_SUPPORTED, the notification dropped, for
     * one larger than MC_KV_NOTIF_MAX. */
    int (*get_notif)(mc_kv_backend_t *b, mc_kv_notif_t *out);
} mc_kv_plugin_t;

/* The entry point. host_abi is MC_KV_ABI_CURRENT as the host was built. Returns the table, or
 * NULL with a reason in why (room why_len; may be NULL) if the host's ABI is not served. */
typedef const mc_kv_plugin_t *(*mc_kv_plugin_init_fn)(uint32_t host_abi, char *why, size_t why_len);

#ifdef __cplusplus
}
#endif
#endif
