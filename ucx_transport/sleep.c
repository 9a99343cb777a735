/* Sleeping: an interface's wake-up fd, and which of a domain's interfaces drives the engine
 * they share while their workers sleep (UCT's iface_event_fd_get and iface_event_arm). */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/epoll.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <ucs/time/time.h>

#include "uct_mc.h"

ucs_status_t uct_mc_iface_event_fd_get(uct_iface_h tl_iface, int *fd_p)
{
    *fd_p = ucs_derived_of(tl_iface, uct_mc_iface_t)->epfd;
    return UCS_OK;
}

/* The interfaces of a domain share its engine, which any of them drives while its worker calls
 * progress. UCP arms the interfaces it does not use (each interface device's, an endpoint-less
 * worker's) from its progress loop while it spins on another. Arming the engine for them
 * turned the spinning side's sends into wake-ups: each one after such an arm wrote the
 * engine's doorbell, which woke UCP's async thread to arm again (UCP's tag_bw, 50,000 messages
 * of 4 KiB: 1,611 doorbells; 34 now). So an interface about to sleep drives the engine (arms
 * it, and takes its fd into its own) only when no other interface of the domain is awake
 * (called progress since its last arm). Otherwise it sleeps on its own events, which the awake
 * one's progress queues: that one's worker, if it is this worker, arms that interface before
 * it sleeps, which then drives; another worker may stop calling progress without arming, or
 * close its interface, so then a timer makes this one look again after ENGINE_STALE_MS, when
 * an awake interface whose progress calls did not move for that long (since another's arm
 * first saw them move) is not counted. The engine's wake-ups are the driver's alone: another
 * worker's progress may take them (a shm ring's kick) and stop without arming, so that
 * worker's first progress after the driver's arm sets the driver's timer too (take_over), and
 * the next interface that arms to drive stops it again (the engine is armed then: waking the
 * old driver at once made two idle workers wake each other for ever). An interface that
 * closes wakes those asleep. */
#define ENGINE_STALE_MS 10

static void timer_set(uct_mc_iface_t *iface, bool on)
{
    /* a millisecond more: UCS's clock (the staleness) and the timer's may differ a little, and
     * a timer that found the other not stale yet would cost another round */
    struct itimerspec its = {.it_value.tv_nsec = on ? (ENGINE_STALE_MS + 1) * 1000000L : 0};

    if (timerfd_settime(iface->tfd, 0, &its, NULL))
        ucs_warn("mooncake: the interface's timer: %m");
}

/* Caller holds md->lock. */
void uct_mc_iface_wake_sleepers(uct_mc_md_t *md)
{
    for (unsigned i = 0; i < UCT_MC_MAX_IFACES; i++) {
        uct_mc_iface_t *x = md->ifaces[i];
        if (x && __atomic_load_n(&x->asleep, __ATOMIC_RELAXED))
            uct_mc_iface_wake(x);
    }
}

/* Another interface drove the engine while it slept: iface's progress has just been the
 * engine's. Once per arm of the driver. */
void uct_mc_iface_take_over(uct_mc_iface_t *iface)
{
    uct_mc_md_t *md = iface->md;
    uct_mc_iface_t *d;

    pthread_mutex_lock(&md->lock);
    d = md->driver;
    if (d && d != iface) {
        __atomic_store_n(&md->driver, NULL, __ATOMIC_RELAXED);
        if (d->super.worker != iface->super.worker) { /* (its own worker arms it again) */
            timer_set(d, true);
            md->handed = d;
        }
    }
    pthread_mutex_unlock(&md->lock);
}

/* Whether other interfaces of the domain are awake: on this worker, on another. Caller holds
 * md->lock. */
static void others_awake(uct_mc_iface_t *iface, bool *same, bool *other)
{
    ucs_time_t now = ucs_get_time(), stale = ucs_time_from_msec(ENGINE_STALE_MS);
    uct_mc_md_t *md = iface->md;

    *same = *other = false;
    for (unsigned i = 0; i < UCT_MC_MAX_IFACES; i++) {
        uct_mc_iface_t *x = md->ifaces[i];
        if (!x || x == iface || __atomic_load_n(&x->asleep, __ATOMIC_RELAXED))
            continue;
        if (x->super.worker == iface->super.worker) {
            *same = true;
            continue;
        }
        uint64_t round = __atomic_load_n(&x->round, __ATOMIC_RELAXED);
        if (round != x->seen_round) {
            x->seen_round = round;
            x->seen_time = now;
        }
        *other |= now - x->seen_time < stale;
    }
}

/* Ready to sleep unless something is queued, or this interface drives the engine and the engine
 * has work. */
ucs_status_t uct_mc_iface_event_arm(uct_iface_h tl_iface, unsigned events)
{
    uct_mc_iface_t *iface = ucs_derived_of(tl_iface, uct_mc_iface_t);
    uct_mc_md_t *md = iface->md;
    struct epoll_event eev = {.events = EPOLLIN};
    bool busy, same, other, drive;
    uct_mc_iface_t *prev;
    uint64_t x;

    (void)events;
    pthread_mutex_lock(&iface->lock->mutex);
    busy = iface->evq_head != NULL;
    if (!busy) {
        while (read(iface->efd, &x, sizeof(x)) > 0)
            ;
        while (read(iface->tfd, &x, sizeof(x)) > 0)
            ;
        iface->armed = true;
    }
    pthread_mutex_unlock(&iface->lock->mutex);
    if (busy)
        return UCS_ERR_BUSY;
    pthread_mutex_lock(&md->lock);
    others_awake(iface, &same, &other);
    drive = !same && !other;
    prev = md->driver;
    /* set before the engine's arm: a progress that takes the wake-ups it asks for sees it */
    if (drive || prev == iface)
        __atomic_store_n(&md->driver, drive ? iface : NULL, __ATOMIC_RELAXED);
    busy = drive && mc_engine_arm(md->engine);
    if (busy) {
        __atomic_store_n(&md->driver, prev, __ATOMIC_RELAXED);
    } else {
        /* from here on the others' arms count it out */
        __atomic_store_n(&iface->asleep, true, __ATOMIC_RELAXED);
        if (md->handed && (drive || md->handed == iface)) { /* the engine is armed again */
            if (md->handed != iface)
                timer_set(md->handed, false);
            md->handed = NULL;
        }
        timer_set(iface, other); /* (under the lock: take_over sets it too) */
    }
    pthread_mutex_unlock(&md->lock);
    if (busy)
        return UCS_ERR_BUSY;
    if (drive != iface->engine_fd_in) {
        if (epoll_ctl(iface->epfd, drive ? EPOLL_CTL_ADD : EPOLL_CTL_DEL,
                      mc_engine_event_fd(md->engine), &eev)) {
            ucs_error("mooncake: the engine's event fd: %m");
            return UCS_ERR_IO_ERROR;
        }
        iface->engine_fd_in = drive;
    }
    return UCS_OK;
}
