/* Messages (ordered per peer, dispatched to handlers), notifications (message id 0) and
 * flushes (internal). The control transport carries messages; the core numbers them, keeps
 * them until the receiver acknowledges them and resends them after a failure; the receiver
 * drops what it saw already.
 *
 * Sender: each peer has a stream (a random id and sequence numbers from 1). A message goes
 * msgq -> unacked when the transport takes it (mc__msg_take), and leaves when the receiver
 * acknowledges it in order. An answer -EAGAIN (the receiver is full, or got it out of order),
 * or a lost link, sends every unacknowledged message back to the front of msgq (go-back-N).
 * Receiver: per stream, the next sequence number expected; a message is delivered only if it
 * is that one (a smaller one is a duplicate: acknowledged, dropped).
 *
 * A receiver with MC_MSG_ACK_AFTER_HANDLER acknowledges a message once its handler ran. A ring
 * that lends its records to the handlers answers then; a carrier that answers as it takes
 * (tcp) answers MC__MSG_LATER (queued, not handled), and tells the sender when the handler ran
 * (the transport's msg_handled op, which says that of every message of the stream up to then:
 * mc__msg_handled at the sender). The sender keeps such a message (taken) in msg_unacked, in
 * its window, until then; after a lost link, or 2 x MC_IO_TIMEOUT_MS without a word
 * (mc__msgs_tick), it sends it again, and the receiver answers the duplicate 0 or
 * MC__MSG_LATER as its handler ran or not. A peer closed or dead meanwhile completes it with 0
 * (it was queued there). A duplicate of a message a ring still lends to its handler (the ring
 * went, and what it had not given back came again over the control link or a new ring) is
 * answered -EAGAIN (transport.h, msg_lending): sent again later, once the loans came back.
 *
 * Everything here runs in the progress context unless said otherwise. */
#ifndef MC_MSG_H
#define MC_MSG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <mooncake/engine.h>

#include "fwd.h"
#include "util/list.h"

struct mc_notify_group; /* task.h */

struct mc_msg {
    mc_list_t link; /* in e->msgq_in, then its peer's msgq or msg_unacked */
    mc_segment_id_t target;
    uint8_t id;    /* 0: a notification */
    uint8_t tp;    /* the transport that took it last */
    bool inflight; /* taken by the transport, not answered yet */
    bool taken;    /* answered MC__MSG_LATER: in the receiver's queue, waiting for its handler */
    bool in_ring;  /* its payload is only in a ring's record, put there from src (the ring
                      copies it into data before it goes) */
    uint32_t len;
    uint64_t seq;  /* in its peer's stream, from 1 (progress numbers it) */
    uint32_t tx;   /* times taken: an answer to an earlier take is stale */
    unsigned refs; /* its list, and the transport's frames that point at it */
    bool pass_buf; /* made under e->lock: its record is from e->msg_bufs_pass, its window place
                      in the peer's queued_pass */
    int status;    /* done, in e->done_msgs: what its callback is told */
    mc_done_cb cb;
    void *cb_arg;
    const void *src; /* while its send is on the stack: the sender's bytes, not yet in data */
    char data[];
};

/* Where m's payload is now. */
static inline const void *mc__msg_payload(const mc_msg_t *m)
{
    return m->src ? m->src : m->data;
}

typedef struct mc_notify_item {
    mc_list_t link;
    char sender[MC_NAME_MAX];
    size_t len;
    char msg[];
} mc_notify_item_t;

/* A flush of one peer (mc_peer_flush): done when the tasks it waits for are let go of, the
 * batch notifications it waits for are routed, and the messages up to msg_seq (the last of those
 * notifications, if later) are acknowledged, after the flushes before it. */
typedef struct mc_flush {
    mc_list_t link; /* in e->flushq_in, then its peer's flushes; done: in e->done_flushes */
    mc_segment_id_t target;
    unsigned tasks; /* tasks (their mc_task_t.flush) and notifications (mc_notify_group_t.flush)
                       it waits for */
    uint64_t msg_seq;
    mc_done_cb cb;
    void *cb_arg;
    int status; /* done, in e->done_flushes: what its callback is told */
} mc_flush_t;

/* Queue a message from the submission queue onto its peer (numbered here): its number, or 0
 * when it failed at once (its peer is closed or dead). */
uint64_t mc__msg_route(mc_engine_t *e, mc_msg_t *m);
/* A batch's notification, made at submit (any thread) with its place in the target's window
 * taken (-EAGAIN when the window is full), so that it cannot be refused when its tasks end: then
 * mc__msg_route sends it, or mc__msg_unreserve lets it go (progress context). */
int mc__msg_reserve(mc_engine_t *e, mc_segment_id_t target, const void *data, size_t len,
                    mc_msg_t **m_p);
void mc__msg_unreserve(mc_engine_t *e, mc_msg_t *m);

/* An answer, and what mc__msg_deliver returns: in the receiver's queue, the sender is told when
 * its handler ran (see above). */
#define MC__MSG_LATER 1

/* For the transport that carries p's messages (p->msg_tp; others get nothing). peek: the next
 * message it may take now, left queued. take: that message, taken (it stays p's until answered;
 * one more reference for the transport), or NULL. answered: the receiver's answer to take
 * number tx of m (0: in its queue, and so is everything taken before it; MC__MSG_LATER: so,
 * their handlers not run yet; -EAGAIN: not taken, send it again later). link_lost: what
 * carrier tp sent to p on a link that failed is sent again. put: the transport no longer
 * points at m. handled: p's receiver says the handlers of its messages of stream up to seq
 * ran (over any transport). */
mc_msg_t *mc__msg_peek(mc_peer_t *p, unsigned tp);
mc_msg_t *mc__msg_take(mc_engine_t *e, mc_peer_t *p, unsigned tp);
void mc__msg_answered(mc_engine_t *e, mc_peer_t *p, mc_msg_t *m, uint32_t tx, int status);
void mc__msg_link_lost(mc_engine_t *e, mc_peer_t *p, unsigned tp);
void mc__msg_put(mc_engine_t *e, mc_msg_t *m);
void mc__msg_handled(mc_engine_t *e, mc_peer_t *p, uint64_t stream, uint64_t seq);

/* A message arrived from sender (its stream and sequence number) over transport tp: delivered
 * (or a duplicate) 0 or MC__MSG_LATER (only over a transport with msg_handled), or -EAGAIN
 * when it cannot be taken now (the queue it goes to is full: a progress pass comes once there
 * is room; or it is not the next one of its stream). lend: the ring it sits in lends it to its
 * handler (mc__cb_hold_msg), its record ending at end; NULL: it is copied. ran: the handler
 * of a message answered MC__MSG_LATER ran (callbacks.c): its transport tells the sender. */
int mc__msg_deliver(mc_engine_t *e, unsigned tp, const char *sender, uint64_t stream, uint64_t seq,
                    uint8_t id, const void *data, size_t len, mc_ring_lend_t *lend, uint64_t end);
void mc__msg_ran(mc_engine_t *e, const mc_msg_tell_t *t);

/* Peers: fail everything p will not deliver (err, the reason), with its flushes; returns how
 * many messages that was. peer_fini: drop what p still holds (it goes away). */
unsigned mc__msgs_fail_peer(mc_engine_t *e, mc_peer_t *p, int err);
void mc__msgs_peer_fini(mc_engine_t *e, mc_peer_t *p);

/* Flushes: start the ones queued (after the tasks and messages queued before them), and
 * check p's once one of its tasks is let go of or a message acknowledged. */
void mc__flush_start(mc_engine_t *e, mc_flush_t *f);
void mc__flushes_check(mc_engine_t *e, mc_peer_t *p);
void mc__flush_task_done(mc_engine_t *e, mc_task_t *t);
/* g's notification was routed as message seq of its target, or let go of (seq 0): a flush that
 * waited for it waits for that message instead. */
void mc__flush_group_done(mc_engine_t *e, struct mc_notify_group *g, uint64_t seq);

/* The completions of sends and flushes that ended when no held record could be had for them
 * (memory ran out: mc__cb_hold_done failed): they wait, with their message or flush, in
 * e->done_msgs and e->done_flushes. Run them (callbacks.c, after what was held), then let go. */
void mc__msgs_done_run(mc_engine_t *e);

/* Timer tick: a peer whose messages answered MC__MSG_LATER heard nothing more for 2 x
 * MC_IO_TIMEOUT_MS (a "handled" lost, or a host that is away) gets them again: the answers to
 * the duplicates settle them. */
void mc__msgs_tick(mc_engine_t *e, uint64_t now);

/* Engine destroy, first (MC_LINGER_MS): a flush of every live peer that has messages not
 * acknowledged yet, the engine driven until they completed or the time is up. Not from a pass
 * (a callback that destroys an engine: nothing could be driven). */
void mc__msgs_linger(mc_engine_t *e);
/* Engine destroy: every message and flush not answered yet fails with -MC_ECANCELED (their
 * callbacks then run as the engine goes). fini: free what is left. */
void mc__msgs_cancel_all(mc_engine_t *e);
void mc__msgs_fini(mc_engine_t *e);

#endif
