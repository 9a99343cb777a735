/*
 * The engine object (internal).
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
 * Transports free what epoll may report (connections) only at the end of a progress pass (their
 * reap op), so an event fetched outside the lock can never point at freed memory.
 */
#ifndef MC_ENGINE_INT_H
#define MC_ENGINE_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include <mooncake/engine.h>

#include "buffer.h"
#include "config.h"
#include "descriptor.h"
#include "fwd.h"
#include "metadata/meta.h"
#include "peer.h"
#include "sys/epwatch.h"
#include "util/bufcache.h"
#include "util/list.h"
#include "util/lock.h"
#include "util/log.h"
#include "topology/topology.h"
#include "util/time.h"

#define MC_SLICE_MAX (64u << 20) /* largest MC_SLICE_SIZE */

/* Something in the engine's epoll set: epoll hands back this pointer. */
typedef struct mc_pollable {
    int fd;
    void (*handler)(mc_engine_t *e, struct mc_pollable *p, uint32_t events);
    /* Optional: read fd as if epoll had said it is readable (it may have nothing); whether it
     * found anything. A host spinning on progress calls this instead of epoll_wait while fd is
     * the one busy descriptor (engine.c, progress_locked). */
    bool (*poll)(mc_engine_t *e, struct mc_pollable *p);
} mc_pollable_t;

struct mc_engine {
    mc_engine_cfg_t cfg; /* the core's settings */
    mc_config_t *conf;   /* every setting (transports read theirs at init); strings of cfg */
    char name[MC_NAME_MAX];
    char host_id[MC_HOST_ID_MAX];
    uint64_t instance;
    int epfd, doorbell, timerfd;

    mc_lock_t lock; /* the progress context (util/lock.h) */
    pthread_t progress_tid;
    pthread_t serve_tid; /* caller mode with PROGRESS_SERVE_US */
    bool has_serve_thread;
    _Atomic uint64_t host_pass_ns; /* when the host last drove progress */
    _Atomic uint64_t host_passes;  /* how often it did */
    atomic_bool host_armed;        /* it sleeps on the event fd (mc_engine_arm said 0) */
    bool has_thread;
    bool implicit_progress; /* no thread, and API calls may drive progress (PROGRESS_IMPLICIT) */
    atomic_bool stop; /* mc_engine_destroy began: threads end, sends and flushes are refused */

    pthread_mutex_t sub_lock; /* protects subq, msgq_in, flushq_in, cancelq, descq */
    mc_list_t subq;           /* mc_task_t.qlink */
    mc_list_t msgq_in;        /* mc_msg_t.link */
    mc_list_t flushq_in;      /* mc_flush_t.link */
    mc_list_t cancelq;        /* mc_batch_t.cancel_link */
    mc_list_t descq;          /* peers with work from other threads (mc__peer_kicked): desc_link */
    atomic_bool sub_any; /* one of them may hold something: set with every push (mc__sub_mark) */
    atomic_bool msgs_in; /* msgq_in may: set with its pushes, cleared as it is taken (sub_lock) */

    pthread_mutex_t done_lock; /* with done_cond: mc_batch_wait sleepers */
    pthread_cond_t done_cond;
    atomic_int waiters;
    atomic_bool finished_any; /* a waited batch became final: wake mc_batch_wait sleepers */
    atomic_uint lingering;    /* destroy's flushes not completed yet (mc__msgs_linger) */

    pthread_rwlock_t peers_lock;
    mc_peer_t **_Atomic peers; /* by id; NULL once closed. Grows by copy (peer.c) */
    _Atomic size_t n_peers;    /* ids in use */
    atomic_uint n_open_peers;  /* not closed yet: timer ticks run while any is */
    size_t peers_cap;

    mc_memtab_t mem;

    /* Progress-owned. */
    mc_list_t active_peers;
    mc_list_t active_tasks;
    mc_list_t releaseq;   /* tasks let go of in this pass: callbacks at its end (mc_task_t.alink) */
    mc_list_t sentq;      /* tasks whose on_sent runs at the end of the pass (mc_task_t.slink) */
    mc_list_t heldq;      /* messages, peer events, completions for the host (callbacks.c) */
    unsigned n_held_msgs; /* messages in heldq and quick: past MC_MSG_WINDOW, senders wait */
    mc_quick_t quick[MC_QUICK_MAX]; /* messages lent while nothing else is held: they run */
    unsigned n_quick;               /* first, without a held record each (callbacks.c) */
    bool rx_held_full;           /* a message was refused for that: wake progress once they ran */
    struct mc_ran *ran_now;      /* the message whose handler runs (callbacks.c, mc_msg_keep) */
    uint64_t ran_kept;           /* ... its token, once kept */
    mc_list_t kept;              /* messages kept, and those acknowledged behind them */
    atomic_bool kept_released;   /* one was released since the last pass looked */
    unsigned msgs_taken;         /* messages sent, answered MC__MSG_LATER, not handled yet */
    mc_bufcache_t held_bufs;     /* held records kept for reuse (callbacks.c) */
    mc_list_t done_msgs;         /* sends and flushes whose completion got no held record: */
    mc_list_t done_flushes;      /* they carry it themselves (mc__msgs_done_run) */
    mc_bufcache_t msg_bufs;      /* message records kept for reuse (msg.c): a host thread's */
    mc_bufcache_t msg_bufs_pass; /* and those made under e->lock (a pass, a send section) */
    unsigned reap_due;           /* transports (bit = slot) with reap_marked whose reap has work */
    unsigned reapers, reap_always; /* transports with a reap; of them, those that do not mark */
    bool express_ok;     /* every transport started can take part in an express pass (engine.c) */
    bool pass_callbacks; /* the pass under way runs them at its end: rings may lend records */
    struct mc_rx_streams *rx_streams; /* next message expected of each stream (msg.c) */
    mc_slice_t *slice_free;           /* free list */
    mc_slice_t *slice_chunks;         /* allocations, linked through their first slot */
    uint64_t next_timer_ns;
    uint64_t last_pass_ns;     /* when the last progress pass started */
    unsigned sends_since_pass; /* host send sections since (mc__send_end) */
    uint64_t whole_cycles;     /* mc__cycles() after the host's last whole pass, */
    uint64_t light_cycles;     /* how long after it light passes may run (0: never), */
    unsigned light_left;       /* and how many more (engine.c, mc_engine_progress) */
    uint64_t resumed_ns;       /* when progress resumed after a gap longer than MC_IO_TIMEOUT_MS/2:
                                  I/O timeouts count from here, not across our own absence */
    int armed_ms;              /* current timerfd interval (caller-progress mode) */
    bool pass_soon;            /* a transport's reap kept work for the next pass (tcp's held
                                  answers): in caller-progress mode the timer ticks in 1 ms until
                                  soon_until_ns, so the serve thread sends it if the host stops */
    uint64_t soon_until_ns;
    uint64_t epoll_ns;        /* caller-progress mode: the last epoll_wait, and whether it found */
    bool epoll_found;         /* events (then the next pass asks again at once) */
    mc_pollable_t *solo;      /* the socket read without asking epoll, and when it last */
    uint64_t solo_ns;         /* brought something (engine.c, progress_locked, solo_pick) */
    mc_pollable_t *solo_next; /* the last ask that found a socket found it readable alone: */
                              /* it is solo if the next one does too */

    /* The last epoll_wait that found events; the watch asked instead of epoll while none did
     * for a while (engine.c, epoll_due). */
    uint64_t epoll_hit_ns;
    mc_epwatch_t epwatch;

    mc_topo_t topo; /* the process's devices (shared, read-only) and this engine's matrix */
    bool has_topo;

    /* Transports (transport/table.c order). */
    void *tp[MC_TP_MAX]; /* each one's private state; NULL: not in use here */
    unsigned ctrl;       /* the control transport (MC_TP_CONTROL) */
    atomic_uint n_links; /* open connections of every transport (and a paused listener): timer
                            ticks run while any is */
    _Atomic uint64_t c[MC_TP_MAX][MC_CNT_N]; /* counters per transport (mc_counters_t order) */

    /* messages and notifications */
    /* Handlers: set under handlers_lock, read by passes without it (run_one, callbacks.c):
     * handlers_seq is odd while a setter writes. */
    pthread_mutex_t handlers_lock;
    atomic_uint handlers_seq;
    _Atomic(mc_peer_cb) peer_cb;
    _Atomic(void *) peer_cb_arg;
    _Atomic(mc_msg_cb) handlers[256];
    _Atomic(void *) handler_args[256];
    pthread_mutex_t notify_lock;
    mc_list_t notifyq;
    size_t n_notify, notify_bytes; /* received notifications not popped yet, and their bytes */
    atomic_bool rx_notify_full;    /* a notification was refused (queue full): wake on a pop */
    atomic_bool event_fd_taken;    /* caller mode: the host may sleep on the event fd */
    atomic_bool arm_explicit;      /* ... and says when with mc_engine_arm */

    /* metadata */
    mc_meta_t *meta;
    pthread_t meta_tid;
    bool has_meta_thread;
    pthread_mutex_t meta_lock; /* with meta_cond: wakes the publisher */
    pthread_cond_t meta_cond;
    bool meta_dirty, meta_stop;
    _Atomic int64_t lease;
    pthread_mutex_t hosted_lock;    /* hosted, hosted_lease */
    struct mc_hosted_key *hosted;   /* keys hosts put on our lease (mc_engine_publish) */
    int64_t hosted_lease;           /* the lease they were last put with */
    struct mc_seg_cache *seg_cache; /* created under meta_lock */
    unsigned seen_deletions;        /* progress-owned: mc__meta_cache_deletions last looked at */
};

/* Slot i (below e->n_peers, read before) of the peer table, read without its lock (peer.c). */
static inline mc_peer_t *mc__peer_at(mc_engine_t *e, size_t i)
{
    return atomic_load_explicit(&e->peers, memory_order_acquire)[i];
}

static inline void mc__count(_Atomic uint64_t *c, uint64_t v)
{
    atomic_fetch_add_explicit(c, v, memory_order_relaxed);
}

/* A counter that only passes write (under e->lock): a plain add, no locked instruction on a
 * message's path; readers still see whole values. */
static inline void mc__count_pass(_Atomic uint64_t *c, uint64_t v)
{
    atomic_store_explicit(c, atomic_load_explicit(c, memory_order_relaxed) + v,
                          memory_order_relaxed);
}

int mc__epoll_add(mc_engine_t *e, mc_pollable_t *p, uint32_t events);
int mc__epoll_mod(mc_engine_t *e, mc_pollable_t *p, uint32_t events);
void mc__epoll_del(mc_engine_t *e, mc_pollable_t *p);

/* After a push onto one of the submission queues, under e->sub_lock: a pass finds the queues
 * empty without taking the lock until the next push (the pusher then rings the doorbell, or
 * runs progress, as it did already). */
static inline void mc__sub_mark(mc_engine_t *e)
{
    atomic_store_explicit(&e->sub_any, true, memory_order_release);
}

/* Transport slot left work for its reap (transport.h, reap_marked). Progress context. */
static inline void mc__reap_mark(mc_engine_t *e, unsigned slot)
{
    e->reap_due |= 1u << slot;
}

/* Copy a segment name into a buffer of MC_NAME_MAX bytes (cut if longer; no printf per
 * message). */
static inline void mc__copy_name(char *dst, const char *src)
{
    size_t n = strnlen(src, MC_NAME_MAX - 1);

    memcpy(dst, src, n);
    dst[n] = 0;
}

/* Wake the progress context (one eventfd write). Any thread. */
void mc__doorbell(mc_engine_t *e);
/* True on a thread that is running a progress pass (inside callbacks). */
bool mc__in_progress(void);
/* Whether this thread is in a progress pass of e (its lock held: callbacks included). */
bool mc__in_pass_of(const mc_engine_t *e);
/* For tests (caller mode, between the host's calls): whether a socket is read without asking
 * epoll (engine.c, progress_locked), which keeps a spinning host from light passes. */
bool mc__progress_solo(const mc_engine_t *e);
/* Caller-progress mode, before an internal wait polls the event fd: whether it may sleep (the
 * transports armed their wake-ups and nothing came meanwhile). */
bool mc__progress_may_sleep(mc_engine_t *e);
/* Run one progress pass if nobody else is (caller-progress mode). quiet: one that keeps the
 * host's callbacks for a later pass (callbacks.h). */
int mc__progress_try(mc_engine_t *e);
int mc__progress_quiet(mc_engine_t *e);
/* What an API call does in caller-progress mode: a pass, unless MC_PROGRESS_IMPLICIT=0 keeps
 * progress (and callbacks) inside mc_engine_progress alone. Whether a pass ran (it took what
 * was queued before the call, so the doorbell is not needed). */
bool mc__progress_implicit(mc_engine_t *e);
/* mc__progress_implicit for a host thread's message: only what sends it (what is queued goes to
 * its carrier, the transports flush), not a whole pass (no epoll, timers or callbacks: the
 * host's next progress call has them, and the doorbell says so when callbacks wait), unless no
 * whole pass ran for a while (a host that only sends). begin: e->lock taken (false: another
 * thread has it, or a progress thread runs the passes) and what was queued routed, so that the
 * caller makes and routes its message as a callback would (mc__in_pass_of); end: it goes. */
bool mc__send_begin(mc_engine_t *e);
void mc__send_end(mc_engine_t *e);

/* Look a segment's descriptor up in metadata; if the service does not answer, fall back to the
 * last one seen (segment_cache.c, kept current by a watch started on first use). cached_only:
 * never block on the service (progress context). */
int mc__meta_lookup(mc_engine_t *e, const char *name, bool cached_only, mc_meta_kv_t *kv);
void mc__meta_cache_stop(mc_engine_t *e);
/* How many descriptors the watch saw deleted so far (their peers may be dead). */
unsigned mc__meta_cache_deletions(mc_engine_t *e);

/* Metadata publishing (publish.c). */
int mc__publish_start(mc_engine_t *e);
void mc__publish_stop(mc_engine_t *e);
void mc__publish_kick(mc_engine_t *e);

#endif
