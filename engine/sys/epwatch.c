/* Events on the epoll set without a syscall (see epwatch.h). */
#include <errno.h>
#include <poll.h>
#include <string.h>

#include "sys/epwatch.h"
#include "util/log.h"

#define TAKEOVER_NS (10 * 1000 * 1000ull) /* an owner that stopped looking gives the ring up */
#define CQ_ENTRIES  64u                   /* a completion per wake-up between two looks */
#define FLAG_STUCK  64u /* looks in a row with the flag up: the work is not this thread's */
#define FLAG_TRIES  4u  /* times the flag is lowered by hand before the watch gives up */

/* This thread cannot tell any more: every look answers -1 (asked by the clock). err: a
 * negative errno, or 0. */
static int give_up(mc_epwatch_t *w, const char *what, int err)
{
    mc_debug("epoll watch off: %s%s%s (epoll is asked by the clock)", what, err ? ": " : "",
             err ? strerror(-err) : "");
    mc__epwatch_stop(w);
    w->off = true;
    return -1;
}

/* Arm a multishot poll of epfd from this thread (canceling the last owner's). */
static int arm(mc_epwatch_t *w, int epfd, pthread_t self, uint64_t now)
{
    mc__epwatch_stop(w);
    struct io_uring_sqe *sqe = io_uring_get_sqe(&w->ring);
    io_uring_prep_poll_multishot(sqe, epfd, POLLIN);
    io_uring_sqe_set_data64(sqe, ++w->gen);
    int rc = io_uring_submit(&w->ring);
    if (rc < 0)
        return rc;
    w->armed = true;
    w->owner = self;
    w->owner_ns = now;
    return 0;
}

int mc__epwatch_look(mc_epwatch_t *w, int epfd, uint64_t now)
{
    pthread_t self = pthread_self();
    struct io_uring_cqe *cqe;
    unsigned head, n = 0;
    int rc = 0, failed = 0;

    if (w->off)
        return -1;
    if (!w->up) {
        struct io_uring_params p = {.flags = IORING_SETUP_COOP_TASKRUN | IORING_SETUP_TASKRUN_FLAG |
                                             IORING_SETUP_CQSIZE,
                                    .cq_entries = CQ_ENTRIES};
        rc = io_uring_queue_init_params(4, &w->ring, &p);
        if (rc < 0)
            return give_up(w, "io_uring_setup", rc);
        w->up = true;
    }
    bool takeover = w->armed && !pthread_equal(w->owner, self);
    if (takeover && (int64_t)(now - w->owner_ns) < (int64_t)TAKEOVER_NS)
        return -1; /* (a clock read before the owner's last look counts as just now) */
    unsigned flags = IO_URING_READ_ONCE(*w->ring.sq.kflags);
    if (flags & IORING_SQ_CQ_OVERFLOW) /* completions wait in the kernel: fetch them */
        io_uring_get_events(&w->ring);
    /* An event woke the poll: the return of the next syscall (the epoll_wait this answer
     * leads to) runs its task work, which lowers the flag. Up for many looks in a row, it is
     * another thread's work (the cancel of a former owner's poll, which that thread runs only
     * when it next enters the kernel, or never if it exited): running task work of our own
     * lowers it, so the poll is canceled (our work) and armed again below. */
    if (!takeover && (flags & IORING_SQ_TASKRUN)) {
        if (++w->flagged % FLAG_STUCK == 0) {
            if (w->flagged >= FLAG_STUCK * FLAG_TRIES)
                return give_up(w, "the ring's task-work flag stays up", 0);
            mc__epwatch_stop(w);
        }
        rc = 1;
    } else {
        w->flagged = 0;
    }
    io_uring_for_each_cqe(&w->ring, head, cqe)
    {
        n++;
        if (cqe->user_data != w->gen)
            continue; /* a cancel's own completion, or a canceled poll's last one */
        rc = 1;
        if (!(cqe->flags & IORING_CQE_F_MORE)) { /* it ended: overflow (armed again), or error */
            w->armed = false;
            if (cqe->res < 0 && cqe->res != -ECANCELED)
                failed = cqe->res;
        }
    }
    io_uring_cq_advance(&w->ring, n);
    if (failed)
        return give_up(w, "poll of the epoll descriptor", failed);
    w->owner_ns = now;
    if (!w->armed || takeover) {
        int err = arm(w, epfd, self, now);
        if (err)
            return give_up(w, "io_uring_submit", err);
        return 1; /* what came before it was armed */
    }
    return rc;
}

void mc__epwatch_stop(mc_epwatch_t *w)
{
    if (!w->armed)
        return;
    struct io_uring_sqe *sqe = io_uring_get_sqe(&w->ring);
    io_uring_prep_poll_remove(sqe, w->gen);
    io_uring_sqe_set_data64(sqe, 0);
    int rc = io_uring_submit(&w->ring);
    w->armed = false;
    if (rc < 0) { /* the poll may still raise the flag: no more looks */
        mc_debug("epoll watch off: io_uring_submit: %s (epoll is asked by the clock)",
                 strerror(-rc));
        w->off = true;
    }
}

void mc__epwatch_fini(mc_epwatch_t *w)
{
    if (w->up)
        io_uring_queue_exit(&w->ring);
    memset(w, 0, sizeof(*w));
}
