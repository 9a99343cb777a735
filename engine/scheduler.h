/*
 * The scheduler (internal, progress context): cuts tasks into slices lazily, as rails have
 * room, so memory follows what is in flight rather than what was submitted; completes, retries
 * and times out work. A transport's fill op pulls slices with mc__sched_next_slice and reports
 * each one back with mc__slice_done or mc__slice_failed.
 */
#ifndef MC_SCHEDULER_H
#define MC_SCHEDULER_H

#include <stdbool.h>
#include <stdint.h>

#include "fwd.h"

/* A new task from the submission queue. */
void mc__sched_route(mc_engine_t *e, mc_task_t *t);
/* Give every active peer's work to its transports. */
void mc__sched_run(mc_engine_t *e);
/* Next slice of transport tp for a peer: retries first, then carved from queued tasks. */
mc_slice_t *mc__sched_next_slice(mc_engine_t *e, mc_peer_t *p, unsigned tp);
/* The task whose slice transport tp gets next (unless a host cancels it meanwhile); NULL if it
 * has nothing queued. */
mc_task_t *mc__sched_peek_task(mc_engine_t *e, mc_peer_t *p, unsigned tp);
/* Location of the buffer whose slice transport tp gets next; NULL if it has nothing queued. */
const char *mc__sched_peek_location(mc_engine_t *e, mc_peer_t *p, unsigned tp);
/* Give back a slice just taken: mc__sched_next_slice returns it first. */
void mc__sched_unslice(mc_peer_t *p, unsigned tp, mc_slice_t *s);
/* Transport tp lost every path to p: what it has queued for p (tasks not carved yet, whole or
 * in part, and slices waiting for a retry) goes to the next transport of p's order that accepts
 * each task (mc__task_move); a task none other accepts stays queued on tp. Slices in flight on
 * tp that fail later follow their task (mc__slice_failed). */
void mc__sched_move(mc_engine_t *e, mc_peer_t *p, unsigned tp);
/* A WRITE slice's bytes left for good (a transport that hands them to the kernel before the
 * target confirms them): once all of a task's did, its on_sent runs at the end of the pass. */
void mc__slice_sent(mc_engine_t *e, mc_slice_t *s);
/* A slice's bytes are confirmed. */
void mc__slice_done(mc_engine_t *e, mc_slice_t *s);
/* Count v in counter cnt (MC_CNT_*) of t's peer, unless t is a transport's own task (a staged
 * transfer's child, whose parent counts the same bytes). */
void mc__peer_count(const mc_task_t *t, int cnt, uint64_t v);
/* A slice failed. retryable: resend it elsewhere (after its connection was torn down). */
void mc__slice_failed(mc_engine_t *e, mc_slice_t *s, int err, bool retryable, const char *reason);
/* Fail every task queued to a peer (it cannot be reached). */
void mc__sched_fail_peer(mc_engine_t *e, mc_peer_t *p, int err, const char *reason);
void mc__sched_timers(mc_engine_t *e, uint64_t now);
/* t is about to end FAILED or TIMEOUT: nothing more of its slices in flight may land in its
 * local memory after this returns (the transports' abandon). */
void mc__sched_abandon(mc_engine_t *e, mc_task_t *t);
/* A transport holds back a failure of t until its slices in flight ended: no more of t is cut
 * into slices (the rest fails with it). */
void mc__sched_stop_carving(mc_engine_t *e, mc_task_t *t);
/* Apply a batch cancel: drop its queued tasks. */
void mc__sched_cancel(mc_engine_t *e, mc_batch_t *b);
void mc__sched_fini(mc_engine_t *e);

#endif
