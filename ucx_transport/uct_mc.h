/* The engine as a UCT transport: component "mooncake", transport "mooncake", device "engine"
 * and, for UCP's client-server mode, a device per network interface (active messages only).
 *
 * One engine per memory domain (md_open creates it in caller-progress mode, with a thread that
 * serves peers' RMA while the application is away); every interface of the MD shares it and
 * has an id and a nonce in it. An interface address is the engine's compact address plus those;
 * an endpoint is an open segment of the peer's engine plus the peer interface's id and nonce.
 * UCT active messages (ids 0..31) travel as engine messages of one id (MC_UCT_MSG_ID) whose
 * first bytes name the destination interface and the AM id; RMA is READ/WRITE tasks, with
 * remote keys made of the engine's buffer keys.
 *
 * Threads: engine callbacks may run on any thread that progresses the engine (several
 * interfaces, one per UCP worker, share it). They only queue events onto the interface they
 * are for; uct_iface_progress of that interface delivers them (AM handlers, completions, peer
 * failures), so UCT callbacks run only from its own progress. */
#ifndef UCT_MC_H
#define UCT_MC_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

#include <mooncake/engine.h>

#include "ucx_compat.h"
#include "util/bufcache.h"

#define UCT_MC_NAME       "mooncake"
#define UCT_MC_DEV_NAME   "engine"
#define MC_UCT_MSG_ID     250  /* the engine message id UCT active messages travel as */
#define UCT_MC_AM_HDR     7    /* destination interface: u16 id, u32 nonce; u8 AM id */
#define UCT_MC_AM_GONE    0xff /* that AM id: "your message's interface is closed here" */
#define UCT_MC_ADDR_HDR   7    /* interface address: u16 id, u32 nonce, u8 length, engine address */
#define UCT_MC_MAX_IFACES 1024
#define UCT_MC_MAX_IOV    16

typedef struct uct_mc_iface uct_mc_iface_t;
typedef struct uct_mc_ep uct_mc_ep_t;

/* MD settings (UCX_MOONCAKE_*): each non-empty text is an engine setting set over the MC_*
 * environment; "engine" is a list of NAME=VALUE for any other engine setting. */
typedef struct uct_mc_md_config {
    uct_md_config_t super;
    char *devices;
    char *slice_size;
    char *metadata;
    char *auth_token;
    char *listen;
    char *protocol;
    char *engine;
    int rcache_enable;
    uct_md_rcache_config_t rcache;
} uct_mc_md_config_t;

typedef struct uct_mc_md {
    struct uct_md super;
    mc_engine_t *engine;
    pthread_rwlock_t engine_lock; /* the engine going, against the cache's late releases */
    ucs_rcache_t *rcache;         /* NULL: every registration goes to the engine */
    _Atomic unsigned long memhs;  /* handles from the cache not yet released */
    pthread_mutex_t lock;         /* ifaces, driver */
    uct_mc_iface_t *ifaces[UCT_MC_MAX_IFACES];
    uct_mc_iface_t *driver; /* armed the engine to sleep on it (atomic reads; iface.c) */
    uct_mc_iface_t *handed; /* a driver whose timer take_over set (sleep.c) */
    /* Segments of freed endpoints, closed from progress (uct_mc_md_close_segments) */
    pthread_mutex_t segs_lock;
    mc_segment_id_t *segs_to_close;
    size_t n_segs_to_close, cap_segs_to_close;
    _Atomic bool segs_retry; /* some may close now: at the next progress of any interface */
} uct_mc_md_t;

/* A memory handle: one engine registration (a region of the registration cache, which covers
 * whole pages, or one of its own without the cache). */
typedef struct uct_mc_memh {
    ucs_rcache_region_t region; /* first: the cache allocates handles */
    void *addr;
    size_t len;
    bool cached; /* a region of the cache: released to it, not unregistered */
} uct_mc_memh_t;

/* An unpacked remote key: the buffer key. */
typedef struct uct_mc_rkey {
    uint8_t key[MC_BUFFER_KEY_SIZE];
} uct_mc_rkey_t;

typedef struct uct_mc_iface_config {
    uct_iface_config_t super;
    size_t seg_size;       /* bounce slot and largest AM */
    unsigned bounce_slots; /* put_short/bcopy and get_bcopy in flight */
    unsigned max_tasks;    /* RMA tasks in flight */
    double bandwidth;      /* what UCP is told, for its lane choice */
    double am_bandwidth;
    double latency;
    double close_timeout; /* closing waits this long for the engine to let go of our tasks */
} uct_mc_iface_config_t;

/* What the engine callbacks of an interface's RMA tasks lock: the interface's lock, allocated
 * apart so that it outlives an interface whose close gave up waiting for the engine
 * (drain_batches). Callbacks that come after that find it closed: they only free their
 * operations, and the last of them frees this. */
typedef struct uct_mc_iface_lock {
    pthread_mutex_t mutex;
    bool closed; /* the interface closed: callbacks of its tasks only let go (under mutex) */
    size_t refs; /* the interface, and after it closed the tasks the engine still holds */
    uct_mc_md_t *md;
} uct_mc_iface_lock_t;

/* What an interface's progress delivers. */
typedef enum { EV_AM, EV_OP, EV_SENT, EV_FLUSH, EV_PEER, EV_GONE } uct_mc_ev_kind_t;

typedef struct uct_mc_ev {
    struct uct_mc_ev *next;
    uct_mc_ev_kind_t kind;
} uct_mc_ev_t;

typedef struct uct_mc_batch {
    struct uct_mc_batch *next;
    mc_batch_t *batch;
    size_t used, done; /* tasks submitted; tasks let go of (under iface->lock) */
} uct_mc_batch_t;

/* An RMA operation: one engine task per iov piece, or one through a bounce slot. A put is
 * complete for UCT once the engine let go of its source (sent_ev: tcp hands the bytes to the
 * kernel), and leaves its endpoint once the target has them (ev). */
typedef struct uct_mc_op {
    uct_mc_ev_t ev;
    uct_mc_ev_t sent_ev;
    uct_mc_iface_t *iface;
    uct_mc_iface_lock_t *lock; /* iface's: what the callbacks of its tasks lock */
    uct_mc_ep_t *ep;
    uct_mc_batch_t *batch;
    struct uct_mc_op *ep_prev, *ep_next; /* in its endpoint's ops */
    uct_completion_t *comp;              /* NULL once delivered or canceled */
    unsigned ntasks, tasks_left;         /* tasks_left under iface->lock */
    unsigned sent_left;                  /* puts: tasks whose source is still read (iface->lock) */
    int error;                           /* the first failure of its tasks */
    char reason[96];
    uint64_t raddr, rlen; /* the remote range */
    bool write;
    bool sent;       /* a put whose source the engine let go of: in order before later operations
                        (MC_SUBMIT_ORDERED), or complete */
    bool error_told; /* its completion carried the error already */
    bool canceled;   /* by a cancelling flush: it completes as canceled when the engine let go */
    int slot;        /* bounce slot, or -1 */
    size_t length;
    uct_unpack_callback_t unpack_cb;
    void *unpack_arg;
} uct_mc_op_t;

/* A flush waiting for the engine's mc_peer_flush. */
typedef struct uct_mc_flush {
    uct_mc_ev_t ev;
    uct_mc_md_t *md;
    uct_mc_iface_t *iface; /* NULL once the interface closed (under md->lock) */
    uct_mc_ep_t *ep;
    struct uct_mc_flush *ep_next, *if_next;
    uct_completion_t *comp; /* NULL: one the endpoint issued itself, or canceled */
    uint64_t gen;           /* the endpoint's messages it covers (its sent count then) */
    int status;
} uct_mc_flush_t;

typedef struct uct_mc_am {
    uct_mc_ev_t ev;
    uint8_t id;
    bool own; /* from am_own (queued by the interface's own progress) */
    unsigned len;
    uint64_t kept; /* mc_msg_keep's token: released once UCP took it */
    char data[];
} uct_mc_am_t;

typedef struct uct_mc_peer_ev {
    uct_mc_ev_t ev;
    mc_segment_id_t seg;
    mc_peer_event_t event;
    uint8_t hdr[6]; /* EV_GONE: the closed interface's id and nonce */
} uct_mc_peer_ev_t;

struct uct_mc_iface {
    uct_base_iface_t super;
    uct_mc_md_t *md;
    uint16_t id;
    uint32_t nonce; /* tells this interface from an earlier one with its id */
    uint8_t addr[UCT_MC_ADDR_HDR + MC_ADDRESS_MAX];
    size_t addr_len;
    uct_mc_iface_config_t config;
    size_t am_max; /* largest AM payload */
    bool netdev;   /* on a network interface's device: active messages only (query_devices) */

    /* Events from engine callbacks (any thread), for this interface's progress. */
    uct_mc_iface_lock_t *lock;
    uct_mc_ev_t *evq_head, **evq_tail;
    int efd, epfd; /* an eventfd raised when armed; epoll over it, tfd and maybe the engine's fd */
    bool armed;
    mc_bufcache_t am_bufs; /* active message buffers for reuse */
    /* Active messages that the engine's pass in this interface's own progress call handed over,
     * and their buffers: the worker's alone, no lock (iface.c, uct_mc_md_on_msg) */
    uct_mc_ev_t *own_head, **own_tail;
    mc_bufcache_t am_own;

    /* Sleeping, with the other interfaces of the domain (sleep.c). */
    bool asleep;          /* armed since its last progress, or never progressed (atomic) */
    uint64_t seen_round;  /* under md->lock: its round when another's arm last saw it move, */
    ucs_time_t seen_time; /* and when that was */
    bool engine_fd_in;    /* the engine's fd is in epfd (it drives the engine) */
    int tfd; /* a timer in epfd: a sleeper that left the engine to another looks again */

    /* The rest is the worker's own (UCT operations and progress). */
    bool blocked;     /* an interface-wide resource ran out since the last progress */
    size_t released;  /* bytes of active messages the engine kept for UCP, since released */
    bool dispatching; /* in uct_mc_pending_dispatch */
    uint64_t round;   /* progress calls (atomic: other arms read it): an endpoint's block lasts
                       * one round */
    bool closing;
    uct_mc_batch_t *cur, *full, *free_batches;
    size_t tasks_inflight;
    char *bounce;
    int *free_slots;
    unsigned n_free_slots;
    char *tx; /* an active message being built */
    uct_mc_ep_t *eps;
    uct_mc_ep_t *zombies; /* destroyed, freed once their operations and flushes are done */
    unsigned n_stashed;   /* endpoints of eps with a stashed message */
    uct_mc_flush_t *flushes;
    uct_pending_req_t *pending_head, **pending_tail;
    /* While dispatching: the last request kept so far (NULL: none, the walk is at the head),
     * and the one whose func runs (NULL once a purge took it out). Purges keep both true. */
    uct_pending_req_t *dispatch_kept, *dispatch_current;
};

struct uct_mc_ep {
    uct_base_ep_t super;
    uct_mc_iface_t *iface;
    uct_mc_ep_t *next; /* in iface->eps, or once destroyed iface->zombies */
    mc_segment_id_t seg;
    uint8_t peer_hdr[6];    /* the peer interface's id and nonce, as its messages carry them */
    unsigned refs;          /* its ops and flushes in flight */
    unsigned n_pending;     /* its requests in the interface's pending queue */
    uint64_t blocked_round; /* it could take no operation in this round of progress */
    bool dirty;             /* messages sent since the last completed flush that covered them */
    uint64_t sent;          /* messages sent */
    bool fence;             /* new operations wait until the earlier ones are remotely complete */
    bool failed;            /* its peer failed: reported once */
    bool destroyed;         /* freed when refs reaches 0 */
    /* the last of its requests in the pending queue (while n_pending) */
    uct_pending_req_t *pending_last;
    ucs_status_t fail_status;
    uct_mc_op_t *ops;
    uint64_t span_lo, span_hi; /* covers the remote ranges of ops (while there are some) */
    uct_mc_flush_t *flushes;
    uct_completion_t *cancel_comp; /* a cancelling flush's, once no op is in flight */
    uint8_t *stash;                /* an active message packed but not sent yet (am_stash) */
    size_t stash_len;
};

/* md.c */
ucs_status_t uct_mc_md_open(uct_component_t *component, const char *md_name,
                            const uct_md_config_t *config, uct_md_h *md_p);
void uct_mc_md_close(uct_md_h tl_md);
ucs_status_t uct_mc_md_query(uct_md_h tl_md, uct_md_attr_t *attr);
ucs_status_t uct_mc_mem_reg(uct_md_h tl_md, void *address, size_t length, unsigned flags,
                            uct_mem_h *memh_p);
ucs_status_t uct_mc_mem_dereg(uct_md_h tl_md, const uct_md_mem_dereg_params_t *params);
ucs_status_t uct_mc_mkey_pack(uct_md_h tl_md, uct_mem_h tl_memh,
                              const uct_md_mkey_pack_params_t *params, void *rkey_buffer);
ucs_status_t uct_mc_rkey_unpack(uct_component_t *component, const void *rkey_buffer,
                                uct_rkey_t *rkey_p, void **handle_p);
ucs_status_t uct_mc_rkey_release(uct_component_t *component, uct_rkey_t rkey, void *handle);
ucs_status_t uct_mc_status(int rc);
int uct_mc_md_add_iface(uct_mc_md_t *md, uct_mc_iface_t *iface);
void uct_mc_md_defer_close(uct_mc_md_t *md, mc_segment_id_t seg);
void uct_mc_md_close_segments(uct_mc_md_t *md);
void uct_mc_md_remove_iface(uct_mc_md_t *md, uct_mc_iface_t *iface);
extern ucs_config_field_t uct_mc_md_config_table[];

/* iface.c */
extern uct_tl_t uct_mc_tl;
ucs_status_t uct_mc_iface_estimate_perf(uct_iface_h tl_iface, uct_perf_attr_t *attr);
void uct_mc_iface_queue(uct_mc_iface_t *iface, uct_mc_ev_t *ev);
void uct_mc_iface_wake(uct_mc_iface_t *iface); /* raise its eventfd if it is armed */
/* sleep.c */
void uct_mc_iface_wake_sleepers(uct_mc_md_t *md); /* caller holds md->lock */
void uct_mc_iface_take_over(uct_mc_iface_t *iface);
ucs_status_t uct_mc_iface_event_fd_get(uct_iface_h tl_iface, int *fd_p);
ucs_status_t uct_mc_iface_event_arm(uct_iface_h tl_iface, unsigned events);
void uct_mc_md_on_msg(void *arg, const char *sender, uint8_t id, const void *data, size_t len);
void uct_mc_md_on_peer(void *arg, mc_segment_id_t id, mc_peer_event_t event, int error,
                       const char *reason);
ucs_status_t uct_mc_iface_reserve(uct_mc_iface_t *iface, unsigned tasks);
ucs_status_t uct_mc_iface_submit(uct_mc_iface_t *iface, uct_mc_op_t *op, mc_request_t *reqs,
                                 unsigned count);
int uct_mc_iface_slot_get(uct_mc_iface_t *iface);
void uct_mc_iface_slot_put(uct_mc_iface_t *iface, int slot);

/* ep.c */
ucs_status_t uct_mc_ep_create(const uct_ep_params_t *params, uct_ep_h *ep_p);
void uct_mc_ep_destroy(uct_ep_h tl_ep);
void uct_mc_ep_orphan_all(uct_mc_iface_t *iface);
void uct_mc_ep_leave_ops(uct_mc_iface_t *iface);
void uct_mc_ep_free_zombies(uct_mc_iface_t *iface);
ucs_status_t uct_mc_ep_put_short(uct_ep_h tl_ep, const void *buffer, unsigned length,
                                 uint64_t remote_addr, uct_rkey_t rkey);
ssize_t uct_mc_ep_put_bcopy(uct_ep_h tl_ep, uct_pack_callback_t pack_cb, void *arg,
                            uint64_t remote_addr, uct_rkey_t rkey);
ucs_status_t uct_mc_ep_put_zcopy(uct_ep_h tl_ep, const uct_iov_t *iov, size_t iovcnt,
                                 uint64_t remote_addr, uct_rkey_t rkey, uct_completion_t *comp);
ucs_status_t uct_mc_ep_get_bcopy(uct_ep_h tl_ep, uct_unpack_callback_t unpack_cb, void *arg,
                                 size_t length, uint64_t remote_addr, uct_rkey_t rkey,
                                 uct_completion_t *comp);
ucs_status_t uct_mc_ep_get_zcopy(uct_ep_h tl_ep, const uct_iov_t *iov, size_t iovcnt,
                                 uint64_t remote_addr, uct_rkey_t rkey, uct_completion_t *comp);
ucs_status_t uct_mc_ep_am_short(uct_ep_h tl_ep, uint8_t id, uint64_t header, const void *payload,
                                unsigned length);
ssize_t uct_mc_ep_am_bcopy(uct_ep_h tl_ep, uint8_t id, uct_pack_callback_t pack_cb, void *arg,
                           unsigned flags);
ucs_status_t uct_mc_ep_am_zcopy(uct_ep_h tl_ep, uint8_t id, const void *header,
                                unsigned header_length, const uct_iov_t *iov, size_t iovcnt,
                                unsigned flags, uct_completion_t *comp);
ucs_status_t uct_mc_ep_pending_add(uct_ep_h tl_ep, uct_pending_req_t *req, unsigned flags);
void uct_mc_ep_pending_purge(uct_ep_h tl_ep, uct_pending_purge_callback_t cb, void *arg);
void uct_mc_pending_dispatch(uct_mc_iface_t *iface);
void uct_mc_ep_send_stashed(uct_mc_iface_t *iface);

ucs_status_t uct_mc_ep_flush(uct_ep_h tl_ep, unsigned flags, uct_completion_t *comp);
ucs_status_t uct_mc_ep_fence(uct_ep_h tl_ep, unsigned flags);
ucs_status_t uct_mc_ep_check(uct_ep_h tl_ep, unsigned flags, uct_completion_t *comp);
void uct_mc_ep_op_done(uct_mc_iface_t *iface, uct_mc_op_t *op);
void uct_mc_ep_op_sent(uct_mc_iface_t *iface, uct_mc_op_t *op);
void uct_mc_ep_flush_done(uct_mc_iface_t *iface, uct_mc_flush_t *f);
/* The endpoints to peer seg fail, or only those to its interface hdr (its id and nonce) */
void uct_mc_ep_peer_failed(uct_mc_iface_t *iface, mc_segment_id_t seg, const uint8_t *hdr,
                           ucs_status_t status);
void uct_mc_iface_detach_flushes(uct_mc_iface_t *iface);

#endif
