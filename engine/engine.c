/* Engine lifecycle and the progress loop. */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

#include "callbacks.h"
#include "msg.h"
#include "scheduler.h"
#include "task.h"
#include "topology/topology.h"
#include "transport/transport.h"
#include "util/crypto.h"

#define MAX_EVENTS    64
#define TICK_BUSY_MS  50    /* timer granularity while tasks are active */
#define TICK_IDLE_MS  1000  /* while connections exist but nothing is submitted */
#define TICK_SOON_MS  1     /* while a transport keeps work for the next pass (pass_soon) */
#define EPOLL_SPIN_NS 1000  /* caller-progress mode: epoll at least this often */
#define EPOLL_SOLO_NS 16000 /* ... and this often while one descriptor is read directly */

/* ... unless the watch says (epoll_due): once epoll found nothing for EPOLL_QUIET_NS; then at
 * least every EPOLL_LATE_NS. */
#define EPOLL_QUIET_NS 1000000
#define EPOLL_LATE_NS  1000000

/* A host's send runs a whole pass when none ran for this long (mc__progress_send). */
#define SEND_PASS_NS (100 * 1000)

/* A host spinning on mc_engine_progress: light passes between two whole ones, at most this
 * many and for this long after it. */
#define LIGHT_PASSES 7
#define LIGHT_US     2

/* The engine whose pass this thread is in, or NULL. MC_TLS_HOT (util/log.h): a spinning host
 * reads it several times per call, each a __tls_get_addr call otherwise. */
static __thread const mc_engine_t *pass_engine MC_TLS_HOT;

bool mc__in_progress(void)
{
    return pass_engine != NULL;
}

bool mc__in_pass_of(const mc_engine_t *e)
{
    return pass_engine == e;
}

bool mc__progress_solo(const mc_engine_t *e)
{
    return e->solo != NULL;
}

void mc__doorbell(mc_engine_t *e)
{
    uint64_t one = 1;

    if (write(e->doorbell, &one, sizeof(one)) < 0 && errno != EAGAIN)
        mc_error("doorbell write: %s", strerror(errno));
}

int mc__epoll_add(mc_engine_t *e, mc_pollable_t *p, uint32_t events)
{
    struct epoll_event ev = {.events = events, .data.ptr = p};

    if (epoll_ctl(e->epfd, EPOLL_CTL_ADD, p->fd, &ev) < 0)
        return mc__set_error(-errno, "epoll_ctl ADD fd %d: %s", p->fd, strerror(errno));
    return 0;
}

int mc__epoll_mod(mc_engine_t *e, mc_pollable_t *p, uint32_t events)
{
    struct epoll_event ev = {.events = events, .data.ptr = p};

    if (epoll_ctl(e->epfd, EPOLL_CTL_MOD, p->fd, &ev) < 0)
        return mc__set_error(-errno, "epoll_ctl MOD fd %d: %s", p->fd, strerror(errno));
    return 0;
}

void mc__epoll_del(mc_engine_t *e, mc_pollable_t *p)
{
    if (e->solo == p)
        e->solo = NULL;
    if (e->solo_next == p)
        e->solo_next = NULL;
    epoll_ctl(e->epfd, EPOLL_CTL_DEL, p->fd, NULL);
}

/* Move everything other threads queued into the progress context. */
static void drain_submissions(mc_engine_t *e)
{
    mc_list_t tasks, msgs, flushes, cancels, *pos, *tmp, *n;

    mc_list_init(&tasks);
    mc_list_init(&msgs);
    mc_list_init(&flushes);
    mc_list_init(&cancels);
    /* Most passes of a spinning host find nothing queued: two lock pairs were a sixth of an
     * idle ping-pong's samples. A push racing with this look rings the doorbell after it. */
    if (!atomic_load_explicit(&e->sub_any, memory_order_acquire))
        return;
    pthread_mutex_lock(&e->sub_lock);
    atomic_store_explicit(&e->sub_any, false, memory_order_relaxed);
    mc_list_splice_back(&tasks, &e->subq);
    mc_list_splice_back(&msgs, &e->msgq_in);
    atomic_store_explicit(&e->msgs_in, false, memory_order_relaxed);
    mc_list_splice_back(&flushes, &e->flushq_in);
    mc_list_splice_back(&cancels, &e->cancelq);
    pthread_mutex_unlock(&e->sub_lock);
    /* Peers first (opens to start, newer descriptors to install): the tasks see them. One at a
     * time off the queue, which other threads may append to meanwhile. */
    for (;;) {
        pthread_mutex_lock(&e->sub_lock);
        n = mc_list_pop_front(&e->descq);
        if (n)
            mc_container_of(n, mc_peer_t, desc_link)->desc_kick = false;
        pthread_mutex_unlock(&e->sub_lock);
        if (!n)
            break;
        mc__peer_kicked(e, mc_container_of(n, mc_peer_t, desc_link));
    }

    mc_list_for_each_safe(pos, tmp, &tasks)
    {
        mc_list_del(pos);
        mc__sched_route(e, mc_container_of(pos, mc_task_t, qlink));
    }
    mc_list_for_each_safe(pos, tmp, &msgs)
    {
        mc_list_del(pos);
        mc__msg_route(e, mc_container_of(pos, mc_msg_t, link));
    }
    /* After the tasks and messages queued before them. */
    while ((n = mc_list_pop_front(&flushes)))
        mc__flush_start(e, mc_container_of(n, mc_flush_t, link));
    mc_list_for_each_safe(pos, tmp, &cancels)
    {
        mc_list_del(pos);
        mc__sched_cancel(e, mc_container_of(pos, mc_batch_t, cancel_link));
    }
}

/* Timer ticks: fast while tasks are active or an unregister waits (a peer's request that holds
 * the buffer too long is cut), slow while connections or peers are open (connections time out,
 * rails re-probe, peers' leases are checked), none otherwise. */
static int tick_ms(mc_engine_t *e)
{
    if (!mc_list_empty(&e->active_tasks) || !mc_list_empty(&e->active_peers) ||
        atomic_load_explicit(&e->mem.dying, memory_order_relaxed))
        return TICK_BUSY_MS; /* active peers: a message may wait to be sent again */
    if (atomic_load_explicit(&e->n_links, memory_order_relaxed) ||
        atomic_load_explicit(&e->n_open_peers, memory_order_relaxed))
        return TICK_IDLE_MS;
    return -1;
}

/* In caller-progress mode the event fd must also wake the caller for timeouts. */
static void arm_timer(mc_engine_t *e)
{
    static const struct itimerspec off;
    struct itimerspec its = {0};
    int ms = tick_ms(e);

    if (e->has_thread)
        return;
    if (e->last_pass_ns < e->soon_until_ns) /* a reap kept work lately: in caller mode, the */
        ms = TICK_SOON_MS;                  /* serve thread sends it if the host stops */
    if (ms == e->armed_ms)
        return;
    e->armed_ms = ms;
    if (ms > 0) {
        its.it_value.tv_sec = ms / 1000;
        its.it_value.tv_nsec = (long)(ms % 1000) * 1000000;
        its.it_interval = its.it_value;
    }
    timerfd_settime(e->timerfd, 0, ms > 0 ? &its : &off, NULL);
}

static void drain_fd(int fd)
{
    uint64_t v;

    while (read(fd, &v, sizeof(v)) > 0)
        ;
}

/* The end of a pass: the transports send what it prepared. whole: every transport's reap;
 * otherwise (a light pass, a host's send section) those marked due and those that do not mark
 * (transport.h, reap_marked), unless one kept work for this pass. */
static void transports_reap(mc_engine_t *e, bool whole)
{
    unsigned due = e->reapers & (whole || e->pass_soon ? ~0u : e->reap_due | e->reap_always);

    e->reap_due = 0;
    e->pass_soon = false; /* a reap that keeps work for the next pass says so again */
    for (; due; due &= due - 1)
        mc__transports[__builtin_ctz(due)]->reap(e);
}

/* The end of a pass: threads waiting for tasks (mc_batch_wait) look again if some finished. */
static void wake_waiters(mc_engine_t *e)
{
    if (atomic_load_explicit(&e->finished_any, memory_order_relaxed) && /* no locked op per pass */
        atomic_exchange(&e->finished_any, false) && atomic_load(&e->waiters)) {
        pthread_mutex_lock(&e->done_lock);
        pthread_cond_broadcast(&e->done_cond);
        pthread_mutex_unlock(&e->done_lock);
    }
}

/* The host's callbacks, if any are held, and what they queued (messages, notifications of the
 * tasks they end) sent in the same pass. */
static void pass_callbacks(mc_engine_t *e)
{
    if (!mc__callbacks_pending(e))
        return;
    mc__callbacks_run(e);
    if (!mc_list_empty(&e->active_peers))
        mc__sched_run(e);
}

/* The end of a pass (whole: with the clock and timers). */
static void pass_end(mc_engine_t *e, bool whole)
{
    transports_reap(e, whole);
    if (e->pass_soon) /* the fast tick lasts a while: no timer syscall per pass meanwhile */
        e->soon_until_ns = e->last_pass_ns + TICK_BUSY_MS * MC_MS;
    if ((e->pass_callbacks && mc__callbacks_pending(e)) || /* let go of, or read by a reap, */
        atomic_load_explicit(&e->kept_released, memory_order_relaxed)) /* released, just now */
        mc__doorbell(e);
    arm_timer(e); /* (a light pass too: what it or a send before it started may need the tick) */
    e->pass_callbacks = false;
    pass_engine = NULL;
    wake_waiters(e);
}

/* One pass over ready events, starting at now (one clock read per pass, another when timers
 * are due). Caller holds e->lock. callbacks: run the host's at its end (a quiet pass keeps
 * them, and the event fd says there is work). now 0: a light pass (mc_engine_progress), no
 * events, no timers run, no clock. */
static int progress_pass(mc_engine_t *e, uint64_t now, struct epoll_event *evs, int n,
                         mc_pollable_t *direct, bool callbacks)
{
    pass_engine = e;
    e->pass_callbacks = callbacks;
    if (now) {
        if (now - e->last_pass_ns > (uint64_t)e->cfg.io_timeout_ms * MC_MS / 2)
            e->resumed_ns = now;
        e->last_pass_ns = now;
    }
    e->sends_since_pass = 0;
    for (int i = 0; i < n; i++) {
        mc_pollable_t *p = evs[i].data.ptr;
        if (p == NULL)
            drain_fd(e->doorbell);
        else if (p == (mc_pollable_t *)&e->timerfd)
            drain_fd(e->timerfd);
        else
            p->handler(e, p, evs[i].events);
    }
    if (direct && direct == e->solo && direct->poll(e, direct)) {
        e->solo_ns = now;
        n++; /* handled as if epoll had reported it: the caller looks again at once */
    }
    drain_submissions(e);
    mc__callbacks_released(e);
    for (unsigned i = 0; i < mc__n_transports; i++)
        if (e->tp[i] && MC_TP_HAS(mc__transports[i], progress))
            mc__transports[i]->progress(e);
    if (!mc_list_empty(&e->active_peers))
        mc__sched_run(e);
    if (now && now >= e->next_timer_ns) {
        now = mc__now_ns(); /* later than what the pass recorded meanwhile (last_done_ns) */
        mc__sched_timers(e, now);
        mc__peers_tick(e, now);
        mc__msgs_tick(e, now);
        for (unsigned i = 0; i < mc__n_transports; i++)
            if (e->tp[i] && MC_TP_HAS(mc__transports[i], timers))
                mc__transports[i]->timers(e, now);
        mc__rails_tick(e, now);
        e->next_timer_ns = now + TICK_BUSY_MS * MC_MS;
        mc__sched_run(e);
    }
    /* Callbacks last, with nothing of a transport's on the stack. */
    if (callbacks)
        pass_callbacks(e);
    pass_end(e, now != 0);
    return n;
}

/* About to sleep (progress context): the transports arm what wakes us (transport.h idle).
 * False if work came meanwhile. */
static bool idle_arm(mc_engine_t *e)
{
    bool busy = false;

    for (unsigned i = 0; i < mc__n_transports; i++)
        if (e->tp[i] && MC_TP_HAS(mc__transports[i], idle))
            busy |= mc__transports[i]->idle(e);
    return !busy;
}

bool mc__progress_may_sleep(mc_engine_t *e)
{
    bool ok;

    if (pass_engine || !mc_lock_try(&e->lock))
        return false; /* another thread is in a pass: look again soon */
    ok = idle_arm(e);
    mc_unlock(&e->lock);
    return ok;
}

/* A host that sleeps on the event fd may do so after any pass. Caller holds e->lock. */
static void arm_for_host(mc_engine_t *e)
{
    if (atomic_load_explicit(&e->event_fd_taken, memory_order_relaxed) &&
        !atomic_load_explicit(&e->arm_explicit, memory_order_relaxed) && !idle_arm(e))
        mc__doorbell(e);
}

/* Whether a host's pass asks epoll (one that found events asks again at once). While the
 * descriptors are quiet (no event for EPOLL_QUIET_NS: what moves goes through shared memory),
 * the watch (sys/epwatch.h) says whether the set has events, so that spinning costs no syscall;
 * EPOLL_LATE_NS bounds what a watch that missed one could cost. While they are busy, and for a
 * thread the watch does not belong to, epoll is asked every EPOLL_SPIN_NS: the watch's task work
 * runs on the return of the very epoll_wait that takes an event, on the path of a busy socket's
 * every message (a tcp ping-pong took 12.5 us one way with the watch always on, 9.1 without). */
static bool epoll_due(mc_engine_t *e, uint64_t now)
{
    /* (signed: a clock read before another thread's pass counts as just now) */
    int64_t since_hit = (int64_t)(now - e->epoll_hit_ns), since = (int64_t)(now - e->epoll_ns);

    if (since_hit >= (int64_t)EPOLL_QUIET_NS) {
        int w = mc__epwatch_look(&e->epwatch, e->epfd, now);
        if (w >= 0)
            return w > 0 || since >= (int64_t)EPOLL_LATE_NS;
    }
    return since >= EPOLL_SPIN_NS;
}

/* Which descriptor is read without asking epoll (progress_locked): one with a poll that two
 * asks that found such descriptors busy (one after the other) found readable and alone.
 * Another one busy ends it, and so does a result that may be cut short. */
static void solo_pick(mc_engine_t *e, const struct epoll_event *evs, int n, uint64_t now)
{
    mc_pollable_t *one = NULL;
    uint32_t events = 0;
    int busy = 0;

    for (int i = 0; i < n; i++) {
        mc_pollable_t *p = evs[i].data.ptr;
        if (p && p != (mc_pollable_t *)&e->timerfd && p->poll) {
            one = p;
            events = evs[i].events;
            busy++;
        }
    }
    if (busy > 1 || n == MAX_EVENTS) {
        e->solo = e->solo_next = NULL;
    } else if (!busy) {
        return;
    } else if (!(events & (EPOLLIN | EPOLLERR | EPOLLHUP))) { /* only writable again */
        if (one != e->solo)
            e->solo = e->solo_next = NULL;
    } else if (one == e->solo || one == e->solo_next) {
        e->solo = one;
        e->solo_ns = now;
    } else {
        e->solo = NULL;
        e->solo_next = one;
    }
}

/* A pass by a thread that took e->lock; now: the clock as the caller read it, or 0.
 *
 * A host spinning on progress asks epoll only when it may have something (epoll_due): what
 * arrives through shared memory is seen without a syscall per pass. With one busy socket (a
 * ping-pong, a stream on one connection) each arrival still took two syscalls, epoll_wait and
 * the read, about a microsecond each on a VM. Once two asks that found sockets busy found one
 * readable and no other (solo_pick; a socket is one with a mc_pollable_t.poll), each pass reads
 * it instead, and epoll is asked every EPOLL_SOLO_NS for the rest; this ends once it brought
 * nothing for EPOLL_QUIET_NS, once an ask finds another socket busy, and when the host arms to
 * sleep. */
static int progress_locked(mc_engine_t *e, bool callbacks, uint64_t now)
{
    struct epoll_event evs[MAX_EVENTS];
    bool solo, ask;
    int n = 0, rc;

    MC_LOG_SCOPE(e->cfg.log_level);
    if (!now)
        now = mc__now_ns();
    /* (signed: a clock read before another thread's pass counts as just now) */
    solo = e->solo && (int64_t)(now - e->solo_ns) < (int64_t)EPOLL_QUIET_NS;
    if (e->solo && !solo) /* quiet for EPOLL_QUIET_NS: light passes may run again */
        e->solo = NULL;
    ask = solo ? (int64_t)(now - e->epoll_ns) >= (int64_t)EPOLL_SOLO_NS
               : e->epoll_found || epoll_due(e, now);
    if (ask) {
        n = epoll_wait(e->epfd, evs, MAX_EVENTS, 0);
        e->epoll_ns = now;
        e->epoll_found = n > 0;
        if (n > 0) {
            e->epoll_hit_ns = now;
            mc__epwatch_stop(&e->epwatch);
            solo_pick(e, evs, n, now);
        }
    }
    rc = progress_pass(e, now, evs, n < 0 ? 0 : n, solo && !ask ? e->solo : NULL, callbacks);
    arm_for_host(e);
    return rc;
}

/* now: the clock as the caller read it, or 0 (read here). */
static int progress_try(mc_engine_t *e, bool callbacks, bool *ran, uint64_t now)
{
    int rc;

    *ran = false;
    if (pass_engine || !mc_lock_try(&e->lock))
        return 0;
    *ran = true;
    rc = progress_locked(e, callbacks, now);
    mc_unlock(&e->lock);
    return rc;
}

int mc__progress_try(mc_engine_t *e)
{
    bool ran;

    return progress_try(e, true, &ran, 0);
}

/* A ping-pong's sender otherwise pays a whole pass per message (UCX's sends write straight
 * into the peer's FIFO). A host that only sends still gets whole passes, one every
 * SEND_PASS_NS: they connect, take the answers that free its window, and run the timers (the
 * clock is read from the second send after a pass on: a host that drives progress between its
 * sends reads none per message). With
 * MC_PROGRESS_IMPLICIT=0 only the send's own part runs, never a pass or a callback: the host
 * drives those (a doorbell, an epoll_wait and a read per message otherwise, UCX's am_short). */
bool mc__send_begin(mc_engine_t *e)
{
    if (e->has_thread || pass_engine || !mc_lock_try(&e->lock))
        return false;
    pass_engine = e;
    drain_submissions(e); /* what this thread queued before goes first */
    return true;
}

void mc__send_end(mc_engine_t *e)
{
    uint64_t now = e->implicit_progress && e->sends_since_pass++ ? mc__now_ns() : 0;
    if (now && now - e->last_pass_ns >= SEND_PASS_NS) {
        pass_engine = NULL;
        progress_locked(e, true, now);
        mc_unlock(&e->lock);
        return;
    }
    mc__sched_run(e);
    transports_reap(e, false);
    pass_engine = NULL;
    /* A host that armed and then sent (another fd woke it, another thread sent) sleeps on the
     * event fd: what this send started (a ring the receiver now consumes, an answer to come)
     * was not armed, so it is woken to run a pass and arm again. */
    if (mc__callbacks_pending(e) || e->pass_soon || atomic_load(&e->host_armed))
        mc__doorbell(e);
    arm_for_host(e);
    mc_unlock(&e->lock);
}

bool mc__progress_implicit(mc_engine_t *e)
{
    bool ran = false;

    if (e->implicit_progress)
        progress_try(e, true, &ran, 0);
    return ran;
}

int mc__progress_quiet(mc_engine_t *e)
{
    bool ran;

    return progress_try(e, false, &ran, 0);
}

/* Whether this call of a host spinning on mc_engine_progress may start with a light pass: what
 * comes through memory (rings, completion queues), the host's callbacks and the transports'
 * reaps, without the clock, epoll or the timers. A whole pass (the clock read alone was a fifth
 * of a same-host message's path) runs at least every LIGHT_PASSES + 1 calls and LIGHT_US (the
 * cycle counter, read after the light pass: light_over), and at every call while sockets are
 * busy. */
static bool light_may(const mc_engine_t *e)
{
    return e->light_left && !e->solo && !e->epoll_found;
}

/* After a light pass: whether LIGHT_US went by since the last whole pass (then one follows in
 * the same call). Read after the pass, so that what arrived was handed over first: the
 * counter costs some 9 ns on an AMD core, on the way of every message otherwise. */
static bool light_over(mc_engine_t *e)
{
    if (mc__cycles() - e->whole_cycles >= e->light_cycles)
        return true;
    e->light_left--;
    return false;
}

/* The transports started: whose reaps run (reapers), which of them also when not marked, and
 * whether they allow express passes (each one with a progress hook has an express op). */
static void reapers_setup(mc_engine_t *e)
{
    e->express_ok = true;
    for (unsigned i = 0; i < mc__n_transports; i++) {
        const mc_transport_ops_t *t = mc__transports[i];
        if (!e->tp[i])
            continue;
        if (MC_TP_HAS(t, reap))
            e->reapers |= 1u << i;
        if (MC_TP_HAS(t, reap) && !MC_TP_HAS(t, reap_marked))
            e->reap_always |= 1u << i;
        if (MC_TP_HAS(t, progress) && !MC_TP_HAS(t, express))
            e->express_ok = false;
    }
}

/* A light pass of an engine with nothing under way (no peer active; nothing held, submitted or
 * kept for this pass), as a spinning host that exchanges messages makes most of its calls: the
 * transports take what arrived through memory (express ops), the handlers run, and what they
 * started (a reply, a submit) goes out as in any pass. The rest of a light pass (every hook,
 * reap and list) was most of such a call's cost. False: it is a whole light pass instead. */
static bool express_pass(mc_engine_t *e)
{
    if (!e->express_ok || !mc_list_empty(&e->active_peers) || e->pass_soon ||
        mc__callbacks_pending(e) || atomic_load_explicit(&e->sub_any, memory_order_relaxed))
        return false;
    pass_engine = e;
    e->pass_callbacks = true;
    e->sends_since_pass = 0;
    mc__callbacks_released(e);
    for (unsigned i = 0; i < mc__n_transports; i++) {
        if (e->tp[i] && MC_TP_HAS(mc__transports[i], express) && !mc__transports[i]->express(e)) {
            progress_pass(e, 0, NULL, 0, NULL, true); /* (what was taken is run there) */
            return true;
        }
    }
    pass_callbacks(e);
    pass_end(e, false);
    return true;
}

int mc_engine_progress(mc_engine_t *e)
{
    if (!e)
        return mc__set_error(-EINVAL, "mc_engine_progress: NULL engine");
    if (e->has_thread)
        return 0;
    uint64_t now = 0;
    int rc;
    if (atomic_load_explicit(&e->host_armed, memory_order_relaxed)) /* it is back */
        atomic_store_explicit(&e->host_armed, false, memory_order_relaxed);
    if (e->has_serve_thread) /* (one host thread's count may be lost to another's) */
        atomic_store_explicit(&e->host_passes,
                              atomic_load_explicit(&e->host_passes, memory_order_relaxed) + 1,
                              memory_order_relaxed);
    if (pass_engine || !mc_lock_try(&e->lock)) {
        if (e->has_serve_thread) /* it is in a pass: it leaves the next to us */
            atomic_store_explicit(&e->host_pass_ns, mc__now_ns(), memory_order_relaxed);
        return 0;
    }
    rc = 0;
    if (light_may(e)) {
        MC_LOG_SCOPE(e->cfg.log_level);
        if (!express_pass(e))
            rc = progress_pass(e, 0, NULL, 0, NULL, true);
        arm_for_host(e);
        if (!light_over(e)) {
            mc_unlock(&e->lock);
            return rc;
        }
    }
    if (e->has_serve_thread) { /* the pass below uses the same clock reading */
        now = mc__now_ns();
        atomic_store_explicit(&e->host_pass_ns, now, memory_order_relaxed);
    }
    rc += progress_locked(e, true, now);
    e->whole_cycles = mc__cycles();
    e->light_left = LIGHT_PASSES;
    mc_unlock(&e->lock);
    return rc;
}

int mc_engine_event_fd(const mc_engine_t *e)
{
    if (!e)
        return mc__set_error(-EINVAL, "mc_engine_event_fd: NULL engine");
    /* From now on every pass arms the wake-ups of work that epoll does not see by itself. */
    atomic_store(&((mc_engine_t *)e)->event_fd_taken, true);
    return e->epfd;
}

int mc_engine_arm(mc_engine_t *e)
{
    bool ok;

    if (!e)
        return mc__set_error(-EINVAL, "mc_engine_arm: NULL engine");
    if (e->has_thread)
        return 0;
    atomic_store(&e->arm_explicit, true);
    if (pass_engine || !mc_lock_try(&e->lock))
        return -EAGAIN; /* another thread is in a pass: look again */
    /* callbacks a serving pass held for the host are work too */
    ok = !mc__callbacks_pending(e) && !atomic_load(&e->kept_released) && idle_arm(e);
    if (ok) /* it sleeps on epoll: no descriptor read without it (progress_locked) */
        e->solo = e->solo_next = NULL;
    /* until the host calls in again, what arrives is its to handle: the serving thread would
     * take the wake-up from under it and hold the callbacks */
    atomic_store(&e->host_armed, ok);
    if (ok && atomic_load(&e->kept_released)) { /* mc_msg_release saw it not armed yet */
        atomic_store(&e->host_armed, false);
        ok = false;
    }
    mc_unlock(&e->lock);
    return ok ? 0 : -EAGAIN;
}

/* The internal progress thread: sleeps in epoll_wait, then handles the events it got under the
 * lock. Conns are freed only at the end of a pass, so the events stay valid. After a pass that
 * had events it looks once more without sleeping; it sleeps only once the transports armed
 * their wake-ups (idle_arm) and nothing came meanwhile. */
static void *progress_thread(void *arg)
{
    mc_engine_t *e = arg;
    struct epoll_event evs[MAX_EVENTS];
    int sleep_ms = 0;

    mc__log_enter(e->cfg.log_level);
    while (!atomic_load(&e->stop)) {
        int n = epoll_wait(e->epfd, evs, MAX_EVENTS, sleep_ms);
        if (n < 0 && errno != EINTR) {
            mc_error("epoll_wait: %s", strerror(errno));
            break;
        }
        mc_lock(&e->lock);
        progress_pass(e, mc__now_ns(), evs, n < 0 ? 0 : n, NULL, true);
        /* (the tick under the lock: the lists it looks at are the pass's; what changes them
         * after the unlock rings the doorbell) */
        sleep_ms = n <= 0 && idle_arm(e) ? tick_ms(e) : 0;
        mc_unlock(&e->lock);
    }
    return NULL;
}

/* Caller mode with PROGRESS_SERVE_US: peers reading or writing our memory need our progress
 * (tcp serves from the target), and a host may not call in for a long time (it computes, or it
 * is the passive side of a one-sided transfer). This thread waits for I/O and, once the host
 * has not driven progress for serve_us, runs passes without callbacks: bytes move, completions
 * wait for the host. While the host spins on progress, it looks once a millisecond. */
static void *serve_thread(void *arg)
{
    mc_engine_t *e = arg;
    const uint64_t serve_ns = e->cfg.progress_serve_us * 1000;
    uint64_t calls_seen = 0;

    mc__log_enter(e->cfg.log_level);
    while (!atomic_load(&e->stop)) {
        struct pollfd pfd = {.fd = e->epfd, .events = POLLIN};
        if (poll(&pfd, 1, 100) <= 0)
            continue;
        uint64_t now = mc__now_ns(), wait;
        uint64_t last = atomic_load_explicit(&e->host_pass_ns, memory_order_relaxed);
        uint64_t calls = atomic_load_explicit(&e->host_passes, memory_order_relaxed);
        bool spinning = calls - calls_seen > 1 && now - last < serve_ns;
        bool armed = atomic_load(&e->host_armed), ran = false;
        calls_seen = calls;
        if (!armed && now - last >= serve_ns && progress_try(e, false, &ran, 0) > 0)
            continue; /* served something: look again at once */
        /* The host spins and handles it (waking up at its every message costs a core a quarter
         * of its time: look again in a millisecond); or it called in just now (give it the rest
         * of serve_us); or it sleeps on the event fd and wakes up for this, or what is ready is
         * not ours to handle (callbacks). */
        if (spinning)
            wait = 1000000;
        else if (!armed && now - last < serve_ns)
            wait = serve_ns - (now - last);
        else
            wait = serve_ns;
        struct timespec ts = {(time_t)(wait / 1000000000u), (long)(wait % 1000000000u)};
        nanosleep(&ts, NULL);
    }
    return NULL;
}

static int engine_fds(mc_engine_t *e)
{
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = NULL};

    e->epfd = epoll_create1(EPOLL_CLOEXEC);
    e->doorbell = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    e->timerfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    if (e->epfd < 0 || e->doorbell < 0 || e->timerfd < 0)
        return mc__set_error(-errno, "cannot create engine descriptors: %s", strerror(errno));
    if (epoll_ctl(e->epfd, EPOLL_CTL_ADD, e->doorbell, &ev) < 0)
        return mc__set_error(-errno, "epoll_ctl doorbell: %s", strerror(errno));
    ev.data.ptr = &e->timerfd;
    if (epoll_ctl(e->epfd, EPOLL_CTL_ADD, e->timerfd, &ev) < 0)
        return mc__set_error(-errno, "epoll_ctl timerfd: %s", strerror(errno));
    return 0;
}

static void engine_init_state(mc_engine_t *e)
{
    pthread_mutex_init(&e->sub_lock, NULL);
    pthread_mutex_init(&e->done_lock, NULL);
    pthread_cond_init(&e->done_cond, NULL);
    pthread_rwlock_init(&e->peers_lock, NULL);
    pthread_mutex_init(&e->handlers_lock, NULL);
    pthread_mutex_init(&e->notify_lock, NULL);
    pthread_mutex_init(&e->meta_lock, NULL);
    pthread_mutex_init(&e->hosted_lock, NULL);
    pthread_cond_init(&e->meta_cond, NULL);
    mc_list_init(&e->subq);
    mc_list_init(&e->msgq_in);
    mc_list_init(&e->flushq_in);
    mc_list_init(&e->cancelq);
    mc_list_init(&e->descq);
    mc_list_init(&e->active_peers);
    mc_list_init(&e->active_tasks);
    mc_list_init(&e->releaseq);
    mc_list_init(&e->sentq);
    mc_list_init(&e->heldq);
    mc__callbacks_init(e);
    mc_buf_init(&e->msg_bufs, sizeof(mc_msg_t) + MC_MSG_MAX, true);
    mc_buf_init(&e->msg_bufs_pass, sizeof(mc_msg_t) + MC_MSG_MAX, false);
    mc_list_init(&e->notifyq);
    e->epfd = e->doorbell = e->timerfd = -1;
    e->armed_ms = -2;
    mc__memtab_init(&e->mem);
}

static pthread_once_t topo_once = PTHREAD_ONCE_INIT;
static mc_topo_t *topo;
static int topo_rc;
static char topo_err[512];

static void topo_discover(void)
{
    topo_rc = mc__topo_discover(NULL, &topo);
    if (topo_rc)
        snprintf(topo_err, sizeof(topo_err), "%s", mc_last_error());
}

/* The host's topology, discovered once per process (hwloc is slow) and shared read-only, with
 * this engine's priority matrix: MC_DEVICES and MC_NIC_PRIORITY_MATRIX are per engine. */
static int engine_topology(mc_engine_t *e)
{
    pthread_once(&topo_once, topo_discover);
    if (topo_rc)
        return mc__set_error(topo_rc, "%s", topo_err);
    e->topo = *topo;
    e->topo.matrix = NULL;
    e->has_topo = true;
    return mc__topo_matrix_build(&e->topo, e->cfg.devices, e->cfg.matrix);
}

/* Whether transport i is to start: with MC_PROTOCOL naming one, only that one and the control
 * transport do. */
static bool transport_wanted(const mc_engine_t *e, unsigned i)
{
    const mc_transport_ops_t *ops = mc__transports[i];

    return !strcmp(e->cfg.protocol, "auto") || !strcmp(e->cfg.protocol, ops->name) ||
           (ops->flags & (MC_TP_CONTROL | MC_TP_LOCAL));
}

static int transports_init(mc_engine_t *e)
{
    mc__transports_setup();
    for (unsigned i = 0; i < mc__n_transports; i++) {
        const mc_transport_ops_t *ops = mc__transports[i];
        if (ops->flags & MC_TP_CONTROL)
            e->ctrl = i;
        if (!transport_wanted(e, i) || !ops->init)
            continue;
        int rc = ops->init(e);
        if (rc)
            return rc;
        if (!e->tp[i] && (ops->flags & MC_TP_CONTROL))
            return mc__set_error(-MC_ENODEV, "the control transport %s is not available",
                                 ops->name);
    }
    return 0;
}

static int engine_start(mc_engine_t *e)
{
    const mc_transport_ops_t *ctrl;
    int rc;

    rc = mc__host_id(e->host_id, sizeof(e->host_id));
    if (!rc)
        rc = mc__random_bytes(&e->instance, sizeof(e->instance));
    if (!rc)
        rc = engine_topology(e);
    if (!rc)
        rc = engine_fds(e);
    if (!rc)
        rc = transports_init(e);
    if (rc)
        return rc;
    ctrl = mc__transports[e->ctrl];
    snprintf(e->name, sizeof(e->name), "%s",
             e->cfg.segment_name[0] ? e->cfg.segment_name : ctrl->address(e));
    rc = mc__publish_start(e);
    if (rc)
        return rc;
    e->implicit_progress = !e->cfg.progress_thread && e->cfg.progress_implicit;
    e->light_cycles = LIGHT_US * mc__cycles_per_us();
    reapers_setup(e);
    if (e->cfg.progress_thread) {
        e->has_thread = true; /* before the thread reads it (arm_timer) */
        rc = pthread_create(&e->progress_tid, NULL, progress_thread, e);
        if (rc) {
            e->has_thread = false;
            return mc__set_error(-rc, "cannot start the progress thread: %s", strerror(rc));
        }
    } else if (e->cfg.progress_serve_us) {
        e->has_serve_thread = true;
        rc = pthread_create(&e->serve_tid, NULL, serve_thread, e);
        if (rc) {
            e->has_serve_thread = false;
            return mc__set_error(-rc, "cannot start the serving thread: %s", strerror(rc));
        }
    }
    return 0;
}

int mc_engine_create(const mc_config_t *config, mc_engine_t **engine_p)
{
    mc_engine_t *e;
    int rc;

    if (!engine_p)
        return mc__set_error(-EINVAL, "mc_engine_create: NULL argument");
    e = calloc(1, sizeof(*e));
    if (!e)
        return mc__set_error(-ENOMEM, "out of memory");
    engine_init_state(e);
    if (!config) {
        rc = mc_config_create(&e->conf);
    } else {
        e->conf = mc__config_dup(config);
        rc = e->conf ? 0 : mc__set_error(-ENOMEM, "out of memory");
    }
    if (rc) {
        free(e);
        return rc;
    }
    mc__engine_cfg_read(e->conf, &e->cfg);
    MC_LOG_SCOPE(e->cfg.log_level);
    rc = engine_start(e);
    if (rc) {
        char reason[512];
        snprintf(reason, sizeof(reason), "%s", mc_last_error());
        mc_engine_destroy(e);
        return mc__set_error(rc, "%s", reason);
    }
    mc_info("engine %s started (metadata %s, %s progress)", e->name, e->cfg.metadata,
            e->has_thread ? "thread" : "caller");
    *engine_p = e;
    return 0;
}

/* Fail whatever is still active: the engine is going away. */
static void engine_abort_tasks(mc_engine_t *e)
{
    mc_list_t *pos, *tmp;

    drain_submissions(e);
    mc_list_for_each_safe(pos, tmp, &e->active_tasks)
    {
        mc_task_t *t = mc_container_of(pos, mc_task_t, alink);
        mc__task_finish(t, MC_TASK_FAILED, -MC_ECANCELED, "engine destroyed");
    }
}

/* Close every link and fail what is in flight, so that tasks release: the control transport
 * first (other transports' link-bound state goes with its links), then the others. */
static void transports_stop(mc_engine_t *e)
{
    const mc_transport_ops_t *ctrl = mc__transports[e->ctrl];

    if (e->tp[e->ctrl] && ctrl->stop)
        ctrl->stop(e);
    for (unsigned i = 0; i < mc__n_transports; i++)
        if (i != e->ctrl && e->tp[i] && mc__transports[i]->stop)
            mc__transports[i]->stop(e);
}

static void transports_fini(mc_engine_t *e)
{
    for (unsigned i = 0; i < mc__n_transports; i++)
        if (e->tp[i] && mc__transports[i]->fini)
            mc__transports[i]->fini(e);
}

void mc_engine_destroy(mc_engine_t *e)
{
    if (!e)
        return;
    MC_LOG_SCOPE(e->cfg.log_level);
    mc__msgs_linger(e);
    /* From here messages and flushes are refused (a completion callback that runs during the
     * teardown may try one): what they would queue could only be dropped. */
    atomic_store(&e->stop, true);
    if (e->has_thread || e->has_serve_thread) {
        mc__doorbell(e);
        pthread_join(e->has_thread ? e->progress_tid : e->serve_tid, NULL);
    }
    mc__publish_stop(e);
    mc__meta_cache_stop(e);
    mc_lock(&e->lock);
    /* (this thread may be in a pass of another engine: a callback of it destroys this one) */
    const mc_engine_t *was_engine = pass_engine;
    pass_engine = e;
    engine_abort_tasks(e);
    transports_stop(e);
    for (size_t i = 0; i < e->n_peers; i++) {
        mc_peer_t *p = mc__peer_at(e, i);
        if (p)
            mc__peer_fail_all(e, p, -MC_ECANCELED, "engine destroyed");
    }
    mc__msgs_cancel_all(e);
    mc__tasks_release(e);  /* completion callbacks still run */
    mc__callbacks_fini(e); /* and those of sends and flushes; messages and events are dropped */
    for (unsigned i = 0; i < mc__n_transports; i++)
        if (e->tp[i] && MC_TP_HAS(mc__transports[i], reap))
            mc__transports[i]->reap(e);
    mc__sched_fini(e);
    pass_engine = was_engine;
    mc_unlock(&e->lock);
    mc__peers_fini(e);
    mc__memtab_fini(e);
    transports_fini(e); /* after the peers and the memory registrations are gone */
    mc__msgs_fini(e);   /* after the transports let go of their messages */
    if (e->meta)
        mc__meta_close(e->meta);
    mc__epwatch_fini(&e->epwatch);
    if (e->epfd >= 0)
        close(e->epfd);
    if (e->doorbell >= 0)
        close(e->doorbell);
    if (e->timerfd >= 0)
        close(e->timerfd);
    if (e->has_topo)
        mc__topo_matrix_free(e->topo.matrix); /* the rest is the process's */
    mc_config_destroy(e->conf);
    free(e);
}

const char *mc_engine_segment_name(const mc_engine_t *e)
{
    return e ? e->name : "";
}

static void counters_load(_Atomic uint64_t *c, mc_counters_t *out)
{
    out->bytes_read = atomic_load(&c[MC_CNT_READ]);
    out->bytes_written = atomic_load(&c[MC_CNT_WRITTEN]);
    out->bytes_served = atomic_load(&c[MC_CNT_SERVED]);
    out->requests = atomic_load(&c[MC_CNT_REQUESTS]);
    out->errors = atomic_load(&c[MC_CNT_ERRORS]);
    out->retries = atomic_load(&c[MC_CNT_RETRIES]);
    out->msgs_sent = atomic_load(&c[MC_CNT_MSGS_SENT]);
    out->msgs_received = atomic_load(&c[MC_CNT_MSGS_RECEIVED]);
}

int mc_stats_transport(mc_engine_t *e, const char *transport, mc_counters_t *out)
{
    int slot;

    if (!e || !transport || !out)
        return mc__set_error(-EINVAL, "mc_stats_transport: NULL argument");
    slot = mc__transport_find(transport);
    if (slot < 0)
        return mc__set_error(-ENOENT, "no transport \"%s\" in this engine", transport);
    counters_load(e->c[slot], out);
    return 0;
}

int mc_stats_peer(mc_engine_t *e, mc_segment_id_t id, mc_counters_t *out)
{
    mc_peer_t *p;

    if (!e || !out)
        return mc__set_error(-EINVAL, "mc_stats_peer: NULL argument");
    pthread_rwlock_rdlock(&e->peers_lock);
    p = mc__peer_get(e, id);
    if (p)
        counters_load(p->c, out);
    pthread_rwlock_unlock(&e->peers_lock);
    return p ? 0 : mc__set_error(-ENOENT, "no open segment with id %u", id);
}
