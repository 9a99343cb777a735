/*
 * Engine internals shared by the files of engine/.
 *
 * Threads and locks
 * -----------------
 * All connection, slice and scheduling state is owned by the progress context: the one thread
 * that currently holds e->lock inside a progress pass (the internal progress thread, or a caller
 * of mc_engine_progress). It needs no further locks. Other threads reach it only through:
 *   - e->sub_lock: the submission queue (tasks, messages, cancel kicks) + the doorbell eventfd;
 *   - e->mem.lock: the registration table (read by submit and by the target side);
 *   - atomics in tasks and batches (state, bytes, counters) read by pollers.
 * Peers are created under e->peers_lock; they are destroyed only with e->lock held too.
 * Connections are freed only at the end of a progress pass (e->graveyard), so an event fetched
 * outside the lock can never point at freed memory.
 */
#ifndef MC_ENGINE_INT_H
#define MC_ENGINE_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/socket.h>
#include <time.h>

#include <mooncake/engine.h>

#include "metadata/meta.h"
#include "proto.h"
#include "util/list.h"
#include "util/log.h"

typedef struct mc_peer mc_peer_t;
typedef struct mc_task mc_task_t;
typedef struct mc_slice mc_slice_t;
typedef struct mc_tcp_conn mc_tcp_conn_t;
typedef struct mc_rdma_qp mc_rdma_qp_t;

/* Transports that carry slices through the scheduler (shm moves data at submit). */
enum { MC_TP_TCP, MC_TP_RDMA, MC_TP_N };
#define MC_RDMA_MAX_DEVS 8

/* ---- time ---- */
uint64_t mc__now_ns(void);
/* CLOCK_REALTIME deadline ms from now, for pthread_cond_timedwait. */
void mc__abstime_in(struct timespec *ts, unsigned ms);
#define MC_MS (1000000ull)

/* ---- registered memory (memory.c) ---- */

typedef struct mc_buffer {
    uint64_t addr, len;
    char location[MC_LOCATION_MAX];
    int memfd;               /* >= 0 for mc_mem_alloc() memory */
    atomic_uint refs;        /* requests in flight that touch this buffer */
    atomic_bool dead;        /* unregistered: waiting for refs to drain */
    struct mc_rdma_mrs *mrs; /* memory regions on every RDMA device, or NULL */
    bool vram;               /* CUDA device memory: moved over rdma only */
} mc_buffer_t;

typedef struct mc_memtab {
    pthread_rwlock_t lock;
    mc_buffer_t **v; /* sorted by addr, non-overlapping */
    size_t n, cap;
    pthread_mutex_t drain_lock; /* with drain_cond: unregister waits for refs == 0 */
    pthread_cond_t drain_cond;
} mc_memtab_t;

int mc__memtab_init(mc_memtab_t *t);
void mc__memtab_fini(mc_engine_t *e);
/* Find the buffer holding [addr, addr+len) and take a reference; NULL if none. The _locked
 * form is for callers that hold e->mem.lock already (for a batch of lookups). */
mc_buffer_t *mc__mem_get(mc_engine_t *e, uint64_t addr, uint64_t len);
mc_buffer_t *mc__mem_get_locked(mc_engine_t *e, uint64_t addr, uint64_t len);
void mc__mem_put(mc_engine_t *e, mc_buffer_t *b);

/* ---- descriptors (descriptor.c) ---- */

typedef struct mc_desc_buffer {
    uint64_t addr, len;
    char location[MC_LOCATION_MAX];
    bool shm;          /* engine-allocated (memfd): same-host peers may map it */
    uint32_t n_chunks; /* memory regions per RDMA device (0: not reachable over rdma) */
    uint32_t rkey_off; /* rkeys of device d, chunk c: desc->rkeys[rkey_off + d*n_chunks + c] */
    uint64_t chunk;    /* bytes per memory region, the last one shorter */
} mc_desc_buffer_t;

/* An RDMA device of a peer, as its descriptor publishes it. */
typedef struct mc_desc_rdma {
    char name[64];
    uint8_t link; /* IBV_LINK_LAYER_INFINIBAND or _ETHERNET */
    uint16_t lid;
    uint8_t gid[16];
} mc_desc_rdma_t;

#define MC_MAX_RAILS 16

typedef struct mc_desc {
    char name[MC_NAME_MAX];
    char host_id[96];           /* boot id + network namespace: equal means same host */
    char tcp_addr[MC_NAME_MAX]; /* "ip:port" of the first endpoint (handshakes) */
    char tcp_addrs[MC_MAX_RAILS][MC_NAME_MAX]; /* every tcp endpoint, one per interface */
    unsigned n_tcp;
    char shm_addr[MC_NAME_MAX]; /* abstract unix socket name of the shm transport, or "" */
    int pid;
    size_t n_buffers;
    mc_desc_buffer_t *buffers; /* sorted by addr */
    mc_desc_rdma_t rdma[MC_RDMA_MAX_DEVS];
    unsigned n_rdma;
    uint32_t *rkeys;
} mc_desc_t;

/* Encode the local engine's descriptor (malloc'ed JSON text, *len_p without the NUL). */
int mc__desc_encode_local(mc_engine_t *e, char **json_p, size_t *len_p);
/* Decode a peer descriptor; bounded, strict; -MC_EPROTO with a reason on bad input. */
int mc__desc_decode(const void *buf, size_t len, mc_desc_t *d);
void mc__desc_free(mc_desc_t *d);
/* The buffer of d holding [addr, addr+len), or NULL (binary search: buffers are sorted). */
const mc_desc_buffer_t *mc__desc_find(const mc_desc_t *d, uint64_t addr, uint64_t len);

/* ---- host identity ---- */
int mc__host_id(char *buf, size_t size);

/* ---- peers (segment.c) ---- */

/* One path to a peer: a local interface address (or the default route) paired with one of the
 * peer's endpoints. Slices of one task spread over every usable rail. */
enum { MC_RAIL_ACTIVE = 0, MC_RAIL_PAUSED = 1 };

typedef struct mc_rail {
    char name[2 * MC_NAME_MAX + 4];        /* "local->remote" */
    struct sockaddr_storage local, remote; /* protected by e->peers_lock (reload) */
    socklen_t local_len, remote_len;       /* local_len 0: no bind */
    char dev[64];                          /* interface of the local address ("" if unbound) */
    char rank_loc[MC_LOCATION_MAX];        /* cache of mc__rail_rank: last location asked */
    int rank;
    /* Progress-owned. */
    unsigned n_conns;
    int state;
    unsigned connect_failures; /* consecutive */
    uint64_t next_connect_ns;  /* back-off after a failure */
    uint64_t fail_at[3];       /* recent failures, for pausing */
    uint64_t backoff_ns;       /* current pause length */
    _Atomic uint64_t bytes, slices, errors;
    _Atomic uint64_t rate;        /* bytes/s, moving average over timer ticks */
    uint64_t rate_bytes, rate_ns; /* bytes and time at the last tick */
    /* rdma rails: a pair of devices and the QP between them (progress-owned) */
    uint8_t ldev, rdev;
    bool crossed; /* not a same-index pair: ranks after those */
    mc_rdma_qp_t *qp;
} mc_rail_t;

struct mc_peer {
    mc_segment_id_t id;
    char name[MC_NAME_MAX];
    int refcnt;                    /* protected by e->peers_lock */
    mc_desc_t desc;                /* protected by e->peers_lock (reloaded on failure) */
    mc_rail_t rails[MC_MAX_RAILS]; /* tcp: interface pairs */
    unsigned n_rails;
    mc_rail_t rdma_rails[MC_MAX_RAILS]; /* rdma: device pairs (none: not reachable by rdma) */
    unsigned n_rdma_rails;
    bool local_host;
    bool by_metadata;                /* opened by name through metadata: may be refreshed */
    atomic_uint busy_tasks;          /* tasks to this peer not yet released */
    struct mc_shm_peer *_Atomic shm; /* same-host mappings (transport/shm.c), on first use */
    atomic_uint queued_msgs;
    _Atomic uint64_t c[6]; /* counters in MC_CNT_* order: written by progress */

    /* Progress-owned scheduling state, per transport (MC_TP_*). */
    struct {
        mc_list_t pending; /* tasks with bytes not yet sliced (mc_task_t.qlink) */
        mc_list_t retry;   /* slices to resend first (mc_slice_t.link) */
    } q[MC_TP_N];
    mc_list_t msgq;        /* messages to send, in order (mc_msg_t.link) */
    mc_list_t active_link; /* in e->active_peers while it has queued work */
    bool active;
    mc_list_t conns; /* outbound tcp connections of every rail (mc_tcp_conn_t.link) */
    unsigned n_conns;
    uint32_t retired[MC_PROTO_MAX_RETIRE]; /* ids of torn-down conns, newest last */
    uint64_t retired_at[MC_PROTO_MAX_RETIRE];
    unsigned n_retired;
};

mc_peer_t *mc__peer_get(mc_engine_t *e, mc_segment_id_t id);
/* Mark a peer as having work; the scheduler visits active peers each pass. */
void mc__peer_activate(mc_engine_t *e, mc_peer_t *p);
/* Re-read a peer's descriptor. may_block: from the peer itself (handshake, up to the connect
 * timeout), else metadata; otherwise only the watched metadata cache. Peer table writers are
 * excluded while it is swapped. */
int mc__peer_reload(mc_engine_t *e, mc_peer_t *p, bool may_block);

/* ---- batches, tasks, slices (batch.c, sched.c) ---- */

/* Internal state between "not final" and a final state, held while the reason is written. */
#define MC_TASK_FINISHING 100

typedef struct mc_notify_group {
    mc_segment_id_t target;
    unsigned left;
    bool failed;
    size_t len;
    char msg[];
} mc_notify_group_t;

struct mc_task {
    mc_list_t qlink; /* in peer->pending (progress-owned) */
    mc_list_t alink; /* in e->active_tasks until released (progress-owned) */
    mc_batch_t *batch;
    mc_request_t req;
    mc_peer_t *peer;
    mc_buffer_t *lbuf; /* reference on the local buffer, held until release */
    mc_notify_group_t *group;
    uint64_t carved; /* bytes cut into slices so far (progress-owned) */
    uint64_t deadline_ns;
    unsigned inflight; /* slices on the wire (progress-owned) */
    bool queued, released;
    bool remote_known; /* the remote range is inside a buffer of the peer's descriptor */
    bool remote_shm;   /* ... which a same-host peer may map */
    uint8_t tp;        /* MC_TP_*: the transport that carries its slices */
    bool vram;         /* either end is CUDA memory */
    uint32_t rbuf;     /* rdma: index of the remote buffer in the peer's descriptor (a hint) */
    atomic_int state;  /* mc_task_state_t or MC_TASK_FINISHING */
    _Atomic uint64_t bytes;
    char *reason; /* written by the finisher before the final state is published */
};

struct mc_batch {
    mc_engine_t *engine;
    size_t cap;
    atomic_size_t n;       /* tasks submitted */
    atomic_size_t n_final; /* tasks in a final state */
    atomic_size_t busy;    /* tasks still referenced by the engine */
    atomic_bool cancel_kick;
    mc_list_t cancel_link; /* in e->cancelq (under sub_lock) */
    mc_task_t *tasks;
};

/* A piece of a task on the wire, or a control frame. From a progress-owned pool. */
enum mc_slice_kind { MC_SL_DATA, MC_SL_CTRL, MC_SL_RESP, MC_SL_QP /* QP_CONNECT awaiting reply */ };

struct mc_slice {
    mc_list_t link;
    mc_slice_t *next_free;
    uint8_t kind;
    uint8_t opcode; /* MC_READ / MC_WRITE for data slices */
    uint8_t hdr[MC_FRAME_HDR_LEN];
    mc_task_t *task;
    uint64_t offset; /* within the task */
    uint32_t len;
    uint32_t cookie;
    unsigned attempts;
    uint32_t rails_tried; /* bit per rail index: named when the slice finally fails */
    void *payload;        /* bytes after the header (data, or owned ctrl bytes) */
    uint32_t payload_len;
    bool payload_owned; /* free(payload) when done */
    mc_buffer_t *ref;   /* target side: buffer reference held while the response is sent */
    mc_rdma_qp_t *qp;   /* rdma: the QP it is posted on (or, MC_SL_QP, being connected) */
    uint16_t wrs;       /* rdma: work requests of this slice not yet completed */
    uint16_t stage;     /* rdma: staging slot + 1 (VRAM without GPUDirect), 0 if none */
    int wc_err;         /* rdma: first error among them (negative), 0 if none */
    const char *wc_reason;
};

mc_slice_t *mc__slice_alloc(mc_engine_t *e);
void mc__slice_free(mc_engine_t *e, mc_slice_t *s);

/* Finish a task with a final state; returns true if this call won (first final state). */
bool mc__task_finish(mc_task_t *t, int state, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Release the engine's hold on a task once it is final, unqueued and has nothing in flight. */
void mc__task_maybe_release(mc_engine_t *e, mc_task_t *t);

/* Scheduler entry points (sched.c). */
void mc__sched_route(mc_engine_t *e, mc_task_t *t); /* new task from the queue */
void mc__sched_run(mc_engine_t *e);                 /* fill connections */
void mc__slice_done(mc_engine_t *e, mc_slice_t *s); /* data confirmed */
/* A slice failed. retryable: resend elsewhere (after its connection was torn down). */
void mc__slice_failed(mc_engine_t *e, mc_slice_t *s, int err, bool retryable, const char *reason);
/* Fail every task queued to a peer (it cannot be reached). */
void mc__sched_fail_peer(mc_engine_t *e, mc_peer_t *p, int err, const char *reason);
void mc__sched_timers(mc_engine_t *e, uint64_t now);
/* Apply a batch cancel: drop its queued tasks. */
void mc__sched_cancel(mc_engine_t *e, mc_batch_t *b);
/* Next slice of transport tp for a peer: retries first, then carved from queued tasks. */
mc_slice_t *mc__sched_next_slice(mc_engine_t *e, mc_peer_t *p, int tp);
void mc__sched_fini(mc_engine_t *e);
void mc__peers_fini(mc_engine_t *e);

/* ---- messages (msg.c) ---- */

typedef struct mc_msg {
    mc_list_t link;
    mc_segment_id_t target;
    uint8_t id;
    uint32_t len;
    char data[];
} mc_msg_t;

typedef struct mc_notify_item {
    mc_list_t link;
    char sender[MC_NAME_MAX];
    size_t len;
    char msg[];
} mc_notify_item_t;

void mc__msg_route(mc_engine_t *e, mc_msg_t *m);
void mc__msg_deliver(mc_engine_t *e, const char *sender, uint8_t id, const void *data, size_t len);
int mc__msg_enqueue(mc_engine_t *e, mc_segment_id_t target, uint8_t id, const void *data,
                    size_t len);
void mc__msgs_fini(mc_engine_t *e);

/* ---- tcp transport (transport/tcp*.c) ---- */

typedef struct mc_pollable {
    int fd;
    void (*handler)(mc_engine_t *e, struct mc_pollable *p, uint32_t events);
} mc_pollable_t;

int mc__tcp_init(mc_engine_t *e);
void mc__tcp_fini(mc_engine_t *e);
/* Give outbound connections of p as many slices as their windows allow; opens connections. */
void mc__tcp_fill(mc_engine_t *e, mc_peer_t *p);
void mc__tcp_peer_close(mc_engine_t *e, mc_peer_t *p);
void mc__tcp_timers(mc_engine_t *e, uint64_t now);
void mc__tcp_reap(mc_engine_t *e); /* free the graveyard: end of a progress pass */
/* Blocking one-shot exchange used to fetch a descriptor by handshake. */
int mc__tcp_fetch_desc(mc_engine_t *e, const char *ip_port, char **json_p, size_t *len_p);
int mc__parse_ip_port(const char *s, struct sockaddr_storage *sa, socklen_t *len_p);
/* Build a peer's rails from its descriptor (pairing each endpoint with a local address on the
 * same IPv4 /24 when this engine listens on several). Caller holds peers_lock for writing or
 * owns the peer alone. */
void mc__rails_build(mc_engine_t *e, mc_peer_t *p);
/* How much a buffer at `location` wants this rail, from the NIC priority matrix: 0 preferred,
 * 1 available, 2 not listed. Slices go to the best-ranked rails that have a ready connection. */
int mc__rail_rank(mc_engine_t *e, mc_rail_t *r, const char *location);
/* The process's topology and priority matrix (discovered once; MC_DEVICES and
 * MC_NIC_PRIORITY_MATRIX are checked here: -MC_ECONFIG naming the variable). */
int mc__topo_init(mc_engine_t *e);
/* Location of the buffer whose slice the peer sends next; NULL if it has nothing queued. */
const char *mc__sched_peek_location(mc_peer_t *p, int tp);
/* Update the rails' throughput averages (timer tick). */
void mc__rails_tick(mc_peer_t *p, uint64_t now);
/* A rail may get new connections (active, or paused and due for a re-probe). */
bool mc__rail_usable(const mc_rail_t *r, uint64_t now);
/* A connection of the rail failed (connecting: before its handshake completed). Three failures
 * within 10 s pause the rail, 1 s doubling to 30 s. */
void mc__rail_failed(mc_rail_t *r, uint64_t now, bool connecting);
/* A connection of the rail completed its handshake: the rail (re)joins. */
void mc__rail_ready(mc_rail_t *r);

int mc__epoll_add(mc_engine_t *e, mc_pollable_t *p, uint32_t events);
int mc__epoll_mod(mc_engine_t *e, mc_pollable_t *p, uint32_t events);
void mc__epoll_del(mc_engine_t *e, mc_pollable_t *p);

/* ---- the engine ---- */

struct mc_engine {
    mc_config_t cfg;
    char name[MC_NAME_MAX];
    char host_id[96];
    uint64_t instance;
    int epfd, doorbell, timerfd;

    pthread_mutex_t lock; /* the progress context */
    pthread_t progress_tid;
    bool has_thread;
    atomic_bool stop;

    pthread_mutex_t sub_lock; /* protects subq, msgq_in, cancelq */
    mc_list_t subq;           /* mc_task_t.qlink */
    mc_list_t msgq_in;        /* mc_msg_t.link */
    mc_list_t cancelq;        /* mc_batch_t.cancel_link */

    pthread_mutex_t done_lock; /* with done_cond: mc_batch_wait sleepers */
    pthread_cond_t done_cond;
    atomic_int waiters;
    atomic_bool finished_any; /* a task became final: wake mc_batch_wait sleepers */

    pthread_rwlock_t peers_lock;
    mc_peer_t **peers;
    size_t n_peers;

    mc_memtab_t mem;

    /* Progress-owned. */
    mc_list_t active_peers;
    mc_list_t active_tasks;
    mc_slice_t *slice_free;   /* free list */
    mc_slice_t *slice_chunks; /* allocations, linked through their first slot */
    mc_list_t graveyard;
    uint64_t next_timer_ns;
    uint32_t next_cookie;
    int armed_ms; /* current timerfd interval (caller-progress mode) */

    const struct mc_topo *topo; /* process-wide, from mc__topo_init */

    /* tcp transport */
    mc_pollable_t listens[MC_MAX_RAILS];
    char listen_addrs[MC_MAX_RAILS][MC_NAME_MAX];
    unsigned n_listens;
    mc_list_t inbound; /* inbound connections */
    unsigned n_outbound;
    uint32_t next_conn_id;
    _Atomic uint64_t tcp_c[6]; /* mc_counters_t order */

    /* rdma transport (transport/rdma*.c); NULL when no device is usable */
    struct mc_rdma *rdma;
    _Atomic uint64_t rdma_c[6];

    /* shm transport (transport/shm.c) */
    char shm_name[MC_NAME_MAX]; /* abstract unix socket name; "" when off */
    mc_pollable_t shm_listen;
    mc_list_t shm_conns, shm_grave; /* owner side, progress-owned */
    mc_list_t shm_peers;            /* initiator side, under shm_lock */
    pthread_mutex_t shm_lock;
    pthread_mutex_t revoke_mutex; /* one unregister revocation at a time */
    uint64_t revoke_addr;
    atomic_uint revoke_left; /* REVOKE_ACKs still expected */
    atomic_bool revoke_req, revoke_abort;
    _Atomic uint64_t shm_c[6];
    struct mc_regtab *regtab; /* our registrations, shared with same-host peers (CMA) */
    int regtab_fd;
    bool regtab_used[256]; /* peer slots in regtab, progress-owned */

    /* messages and notifications */
    pthread_mutex_t handlers_lock;
    mc_msg_cb handlers[256];
    void *handler_args[256];
    pthread_mutex_t notify_lock;
    mc_list_t notifyq;
    size_t n_notify;

    /* metadata */
    mc_meta_t *meta;
    pthread_t meta_tid;
    bool has_meta_thread;
    pthread_mutex_t meta_lock; /* with meta_cond: wakes the publisher */
    pthread_cond_t meta_cond;
    bool meta_dirty, meta_stop;
    int64_t lease;
    struct mc_seg_cache *seg_cache; /* created under meta_lock */
};

enum { MC_CNT_READ, MC_CNT_WRITTEN, MC_CNT_SERVED, MC_CNT_REQUESTS, MC_CNT_ERRORS, MC_CNT_RETRIES };

static inline void mc__count(_Atomic uint64_t *c, uint64_t v)
{
    atomic_fetch_add_explicit(c, v, memory_order_relaxed);
}

/* shm transport (transport/shm.c). */
int mc__shm_init(mc_engine_t *e);
void mc__shm_fini(mc_engine_t *e);
void mc__shm_reap(mc_engine_t *e);
/* Move what can go through same-host mappings now, in the submitting thread; those tasks end
 * COMPLETED (or FAILED if the owner exited) before they are queued. */
void mc__shm_submit(mc_engine_t *e, mc_task_t *tasks, size_t n);
void mc__shm_peer_close(mc_engine_t *e, mc_peer_t *p);
void mc__shm_revoke_start(mc_engine_t *e);
void mc__shm_revoke_abort(mc_engine_t *e);
/* Mirror the registration table into the shared one (caller holds e->mem.lock for writing). */
void mc__regtab_publish(mc_engine_t *e);
/* After a registration was removed: wait for same-host peers' CMA calls that may still use it. */
void mc__regtab_grace(mc_engine_t *e, uint64_t deadline_ns);
/* Wake threads waiting in unregister (buffer references or revocations changed). */
void mc__mem_wake(mc_engine_t *e);

/* ---- rdma transport (transport/rdma*.c) ----
 * Progress-context functions unless said otherwise. e->rdma is NULL when no device is usable
 * (or MC_PROTOCOL/MC_FORCE_TCP is tcp); every entry point accepts that. */
struct json_t;
int mc__rdma_init(mc_engine_t *e);
void mc__rdma_fini(mc_engine_t *e);  /* QPs: teardown, after every tcp link is closed */
void mc__rdma_close(mc_engine_t *e); /* devices: after every memory region is gone */
/* Register b on every device (any thread, before b is published); a buffer that no device can
 * register stays without regions (tcp only) unless it is host memory, which is an error. */
int mc__rdma_mr_register(mc_engine_t *e, mc_buffer_t *b);
void mc__rdma_mr_deregister(mc_buffer_t *b);
/* Descriptor pieces: the device list, and a buffer's rkeys (NULL when it has none). */
struct json_t *mc__rdma_devices_json(mc_engine_t *e);
struct json_t *mc__rdma_rkeys_json(const mc_buffer_t *b, uint64_t *chunk_p);
/* Build p->rdma_rails from its descriptor: device pairs on a common link layer. Same locking
 * as mc__rails_build. */
void mc__rdma_rails_build(mc_engine_t *e, mc_peer_t *p);
/* Post as many slices as the peer's QPs have room for; sets up QPs on demand. */
void mc__rdma_fill(mc_engine_t *e, mc_peer_t *p);
void mc__rdma_peer_close(mc_engine_t *e, mc_peer_t *p);
void mc__rdma_reap(mc_engine_t *e);
/* Target side: a QP_CONNECT arrived on inbound connection c; answers it. */
void mc__rdma_accept(mc_engine_t *e, mc_tcp_conn_t *c, const uint8_t *req, size_t len);
/* Initiator side: the QP_ACCEPT (status 0, payload) or refusal (status < 0, reason) for qp
 * (the slice's qp; NULL when the QP went away while its QP_CONNECT was out: ignore it). */
void mc__rdma_connected(mc_engine_t *e, mc_rdma_qp_t *qp, int status, const uint8_t *payload,
                        size_t len);
/* Connection c (either role) is going away: the QPs set up over it go with it. */
void mc__rdma_ctrl_lost(mc_engine_t *e, mc_tcp_conn_t *c);
/* A ready outbound connection of p for control frames, or NULL (one is being opened). */
mc_tcp_conn_t *mc__tcp_ctrl_conn(mc_engine_t *e, mc_peer_t *p);
/* Queue a QP_CONNECT slice on c; its answer comes back to mc__rdma_connected. */
void mc__tcp_send_qp(mc_engine_t *e, mc_tcp_conn_t *c, mc_slice_t *s);

/* Wake the progress context (one eventfd write). */
void mc__doorbell(mc_engine_t *e);
/* True on a thread that is running a progress pass (inside callbacks). */
bool mc__in_progress(void);
/* Run one progress pass if nobody else is (caller-progress mode). */
int mc__progress_try(mc_engine_t *e);
/* Look a segment's descriptor up in metadata; if the service does not answer, fall back to the
 * last one seen (segment_cache.c, kept current by a watch started on first use). cached_only:
 * never block on the service (progress context). */
int mc__meta_lookup(mc_engine_t *e, const char *name, bool cached_only, mc_meta_kv_t *kv);
void mc__meta_cache_stop(mc_engine_t *e);
/* Metadata publishing (publish.c). */
int mc__publish_start(mc_engine_t *e);
void mc__publish_stop(mc_engine_t *e);
void mc__publish_kick(mc_engine_t *e);

#endif
