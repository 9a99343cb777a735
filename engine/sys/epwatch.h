/*
 * Events on the engine's epoll set, seen without a syscall (internal).
 *
 * A host spinning on mc_engine_progress asks epoll_wait every EPOLL_SPIN_NS whether a
 * descriptor has work: on a VM a syscall of about 300 ns every microsecond, which also evicts
 * from the caches what the next pass needs. While its descriptors are quiet (engine.c,
 * epoll_due) it asks this watch instead: io_uring polls the epoll descriptor (multishot) in
 * cooperative task-running mode, so an event on the set only raises a flag in the ring's shared
 * memory (IORING_SQ_TASKRUN), which a look reads with one load. The epoll_wait that the answer
 * leads to takes the events; the return of that syscall runs the poll's task work, which lowers
 * the flag and leaves a completion for the next look. A completion queue that overflowed ends
 * the poll; the look after arms it again.
 *
 * The poll's task work runs only in the thread that armed it, so the ring belongs to that
 * thread: another thread's look answers -1 (it asks epoll by the clock as before) until the
 * owner has not looked for TAKEOVER_NS, and then takes the ring over. A kernel or sandbox
 * without io_uring (or without cooperative task running, before Linux 5.19), a poll that fails,
 * or a flag that another thread's work keeps up, turns the watch off: every look answers -1.
 *
 * Under the engine's progress lock.
 */
#ifndef MC_SYS_EPWATCH_H
#define MC_SYS_EPWATCH_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include <liburing.h>

typedef struct mc_epwatch {
    struct io_uring ring;
    pthread_t owner;   /* the thread whose task runs the poll */
    uint64_t owner_ns; /* its last look */
    uint64_t gen;      /* the armed poll's user_data (older ones end canceled) */
    unsigned flagged;  /* looks in a row that found the task-work flag up */
    bool up, armed, off;
} mc_epwatch_t;

/* Whether epoll on epfd may have events for the calling thread now (then it asks): 1 maybe,
 * 0 no, -1 this thread cannot tell (it asks by the clock). now: the caller's clock. */
int mc__epwatch_look(mc_epwatch_t *w, int epfd, uint64_t now);
/* Stop watching (the next look watches again). */
void mc__epwatch_stop(mc_epwatch_t *w);
void mc__epwatch_fini(mc_epwatch_t *w);

#endif
