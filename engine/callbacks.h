/*
 * Host callbacks, held until the end of the progress pass (internal).
 *
 * Completion callbacks (tasks let go of: task.h), message handlers and the peer handler run
 * only at the end of a pass, with nothing of a transport's on the stack and no lock but
 * e->lock: a callback may call back into the engine (submit, open without blocking, send).
 * A quiet pass (mc__progress_quiet: unregister waiting for I/O in caller-progress mode with
 * MC_PROGRESS_IMPLICIT=0) moves bytes but keeps them for the host's next mc_engine_progress.
 */
#ifndef MC_CALLBACKS_H
#define MC_CALLBACKS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "fwd.h"

/* Hold a message for its handler (id 1..255): 0, or -EAGAIN when MC_MSG_WINDOW are held
 * already (the sender keeps it); a peer event for the peer handler; a completion (a send, a
 * flush). Progress context.
 * A message from a ring that lends its records (lend not NULL: in a pass that runs the
 * callbacks, and with MC_MSG_ACK_AFTER_HANDLER in a serving thread's too, whose loans last until
 * the host's pass) is not copied: the handler gets data and
 * sender where they are, and the record, which ends at ring position end, counts in lend until
 * the handler ran (lend->returned then moves to end). A copied message whose sender waits to
 * hear that its handler ran (tell not NULL) is told so then (mc__msg_ran). */
int mc__cb_hold_msg(mc_engine_t *e, const char *sender, uint8_t id, const void *data, size_t len,
                    mc_ring_lend_t *lend, uint64_t end, const mc_msg_tell_t *tell);
void mc__cb_hold_event(mc_engine_t *e, mc_segment_id_t id, int event, int error, const char *why);
/* A completion: false when no record could be had for it (memory ran out): the caller keeps
 * it (mc__msgs_done_run), so that no completion is ever lost. */
bool mc__cb_hold_done(mc_engine_t *e, mc_done_cb cb, void *arg, int status);
/* Run everything held, in the order it came (tasks let go of first), then the completions that
 * got no record. A message is acknowledged (its ring's record given back, its sender told that
 * its handler ran) as its handler returns, or, kept (mc_msg_keep), once released. */
void mc__callbacks_run(mc_engine_t *e);
/* Whether anything is held. */
bool mc__callbacks_pending(const mc_engine_t *e);
/* Messages kept by their handlers (mc_msg_keep) were released (any thread): acknowledge them,
 * with those behind them. Every pass, first. */
void mc__callbacks_released(mc_engine_t *e);
/* A notification delivered behind messages whose senders wait for their handlers (tell): its
 * turn in the held queue tells its sender too. unhold: take the last mark back (its
 * notification could not be queued). Progress context. */
int mc__cb_hold_mark(mc_engine_t *e, const mc_msg_tell_t *tell);
void mc__cb_unhold_mark(mc_engine_t *e);
/* Set the handler of message id (1..255, mcb) or the peer handler (id 0, pcb), from any thread.
 * Passes read them without a lock (a sequence lock: a handler and its argument are read as one
 * pair), so a message's path has no locked instruction for it. */
void mc__handler_set(mc_engine_t *e, unsigned id, mc_msg_cb mcb, mc_peer_cb pcb, void *arg);
/* Engine creation: the held records' cache. */
void mc__callbacks_init(mc_engine_t *e);
/* Engine destroy, after the last pass: run the completions of sends and flushes held, drop
 * the rest (messages, peer events). */
void mc__callbacks_fini(mc_engine_t *e);

#endif
