/*
 * The KV backend plugin's internals: an instance (backend.c), its agents and metadata (md.c),
 * transfers (xfer.c) and notifications (notif.c) on one engine.
 */
#ifndef MC_KV_H
#define MC_KV_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

#include <mooncake/engine.h>
#include <mooncake/kv_plugin.h>

#define KV_PUBLIC_MAGIC 0x4b50434du /* "MCPK": a region's public data */
#define KV_CONN_MAGIC   0x4b43434du /* "MCCK": an instance's connection info */
#define KV_WIRE_VERSION 2           /* of a region's public data; 2: the engine address */
#define KV_NOTIF_MAGIC  0x4e4b434du /* "MCKN": a notification this plugin sent */
/* of connection info; 2: the segment name follows the address; 3: notifications start with
 * KV_NOTIF_MAGIC (an agent of 2 would send ones that read as plain engine notifications) */
#define KV_CONN_VERSION 3

/* A remote agent: its connection info and the segment that reaches it. */
typedef struct kv_agent {
    struct kv_agent *next;
    char name[MC_KV_AGENT_MAX];
    unsigned char info[MC_KV_CONN_MAX];
    size_t info_len;
    char segment[MC_NAME_MAX]; /* its engine's segment name: its notifications' sender */
    mc_segment_id_t seg;
    unsigned mds;      /* remote regions loaded for it */
    atomic_uint xfers; /* transfers prepared to it, not yet released */
} kv_agent_t;

enum kv_md_kind { KV_MD_LOCAL, KV_MD_REMOTE };

/* A region: registered here (LOCAL), or one of an agent's (REMOTE, also the loopback view of a
 * local one, whose agent is this instance). */
struct mc_kv_md {
    struct mc_kv_md *prev, *next; /* in backend->mds */
    enum kv_md_kind kind;
    uint64_t addr, len; /* as the host names it: a FILE region's addr is its offset in the file */
    uint64_t base;      /* the engine's address of addr: addr itself, but for FILE regions */
    mc_kv_mem_type_t type;
    uint64_t dev_id;
    atomic_uint users; /* prepared transfers that name it, plus loopback views of a local one */
    kv_agent_t *agent; /* REMOTE */
    mc_kv_md_t *local; /* REMOTE loopback view: the local region it shows */
    unsigned char key[MC_BUFFER_KEY_SIZE]; /* REMOTE: its buffer key, added again at each post */
};

struct mc_kv_backend {
    mc_engine_t *engine;
    char agent[MC_KV_AGENT_MAX];
    unsigned connect_timeout_ms;
    unsigned transfer_timeout_s; /* MC_TRANSFER_TIMEOUT */
    bool drives_progress; /* PROGRESS_THREAD=0 and PROGRESS_IMPLICIT=0: checks run the passes */
    pthread_rwlock_t agents_lock; /* agents; exclusive calls write, transfers read */
    kv_agent_t *agents;
    mc_kv_md_t *mds; /* every handle of a region or a loaded one, for destroy (exclusive calls) */
    pthread_mutex_t lock;     /* error, xfers */
    char error[512];          /* protected by lock */
    struct mc_kv_xfer *xfers; /* protected by lock: live transfer handles, for destroy */
    struct mc_kv_xfer *spare; /* protected by lock: released handles kept for reuse */
    unsigned n_spare;
    mc_notify_t *notif;             /* get_notif's buffer (an exclusive call) */
    _Atomic uint64_t xfer_ids;      /* the last transfer handle's id */
    _Atomic uint64_t last_check_id; /* the handle checked last, by any thread */
};

struct mc_kv_xfer {
    struct mc_kv_xfer *prev, *next; /* protected by backend->lock */
    mc_kv_op_t op;
    kv_agent_t *agent;
    mc_request_t *reqs; /* the descriptors, merged */
    size_t n_reqs, reqs_cap;
    mc_kv_md_t **mds; /* regions this transfer holds (users counted), each once in a row */
    size_t n_mds;
    mc_batch_t *batch; /* of the latest post */
    size_t batch_cap;  /* the tasks it has room for */
    enum { KV_X_PREPARED, KV_X_POSTED, KV_X_DONE, KV_X_FAILED } state;
    uint64_t id;            /* in its backend, from 1 */
    uint64_t check_ns;      /* when check last found it in progress */
    unsigned fast_checks;   /* checks in a row that came soon after the one before */
    mc_kv_status_t failure; /* FAILED: what check says, and why */
    char why[384];
};

/* Record the failure of a call on b (NULL: create) and return status: the message is what
 * last_error shows. */
mc_kv_status_t kv__fail(mc_kv_backend_t *b, mc_kv_status_t status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* The status for an engine error code, with the engine's reason appended to what. */
mc_kv_status_t kv__fail_engine(mc_kv_backend_t *b, int rc, const char *what);
/* The same for an engine call on bytes the host passed in: -MC_EPROTO is INVALID_PARAM. */
mc_kv_status_t kv__fail_input(mc_kv_backend_t *b, int rc, const char *what);
mc_kv_status_t kv__status_of(int rc);

/* Agents (md.c). Callers of kv__agent_find hold agents_lock. */
kv_agent_t *kv__agent_find(mc_kv_backend_t *b, const char *name);
void kv__agents_free(mc_kv_backend_t *b);
/* Destroy: free every region handle still live (the engine let go of their memory). */
void kv__mds_free(mc_kv_backend_t *b);

/* The operations, by file. */
mc_kv_status_t kv__create(const mc_kv_init_t *init, mc_kv_backend_t **backend_p);
void kv__destroy(mc_kv_backend_t *b);
const char *kv__last_error(mc_kv_backend_t *b);
mc_kv_status_t kv__caps(mc_kv_backend_t *b, mc_kv_caps_t *caps_p);
mc_kv_status_t kv__conn_info(mc_kv_backend_t *b, void *buf, size_t *len_p);
const mc_kv_option_t *kv__options(size_t *n_p);

mc_kv_status_t kv__register_mem(mc_kv_backend_t *b, const mc_kv_region_t *r, mc_kv_md_t **md_p);
mc_kv_status_t kv__deregister_mem(mc_kv_backend_t *b, mc_kv_md_t *md);
mc_kv_status_t kv__public_data(mc_kv_backend_t *b, mc_kv_md_t *md, void *buf, size_t *len_p);
mc_kv_status_t kv__load_remote_conn_info(mc_kv_backend_t *b, const char *agent, const void *info,
                                         size_t len);
mc_kv_status_t kv__connect(mc_kv_backend_t *b, const char *agent);
mc_kv_status_t kv__disconnect(mc_kv_backend_t *b, const char *agent);
mc_kv_status_t kv__load_remote_md(mc_kv_backend_t *b, const char *agent, const void *data,
                                  size_t len, mc_kv_md_t **md_p);
mc_kv_status_t kv__load_local_md(mc_kv_backend_t *b, mc_kv_md_t *local, mc_kv_md_t **md_p);
mc_kv_status_t kv__unload_md(mc_kv_backend_t *b, mc_kv_md_t *md);

mc_kv_status_t kv__prep_xfer(mc_kv_backend_t *b, mc_kv_op_t op, const mc_kv_desc_t *local,
                             const mc_kv_desc_t *remote, size_t count, const char *agent,
                             mc_kv_xfer_t **xfer_p);
mc_kv_status_t kv__post_xfer(mc_kv_backend_t *b, mc_kv_xfer_t *x, const void *notif, size_t len);
mc_kv_status_t kv__check_xfer(mc_kv_backend_t *b, mc_kv_xfer_t *x);
mc_kv_status_t kv__release_xfer(mc_kv_backend_t *b, mc_kv_xfer_t *x);
/* Destroy: release every handle still live, and free the spare ones. */
void kv__xfers_release_all(mc_kv_backend_t *b);

/* Notifications travel as [u8 sender agent length][sender agent][message] (notif.c). */
mc_kv_status_t kv__notif_pack(mc_kv_backend_t *b, const void *msg, size_t len, void **out_p,
                              size_t *out_len_p);
mc_kv_status_t kv__gen_notif(mc_kv_backend_t *b, const char *agent, const void *msg, size_t len);
int kv__get_notif(mc_kv_backend_t *b, mc_kv_notif_t *out);

#endif
