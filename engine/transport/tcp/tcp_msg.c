/*
 * TCP: messages.
 *
 * A peer's messages ride one ready connection at a time, which keeps them in order, and each is
 * answered (MSG_ACK) on the same connection once it is in the receiver's queue; answers go at
 * the end of the receiver's progress pass, after what its handlers sent. Either end of a
 * connection sends them: between two engines that both send, the connection opened by the one
 * with the smaller instance carries both directions, so a reply travels in the same write as
 * the answer to the message it replies to (one write and one read per message on each side, as
 * UCX's active messages), and the kernel's acknowledgements find data going back. The one with
 * the larger instance sends on the connection the other's messages last came on (before it
 * has one, on its own, which the other then answers on). A peer's messages move to another
 * connection only while none is unanswered.
 *
 * A connection that fails takes the messages sent on it: they go back to the front of the
 * peer's queue and leave again on the next connection; the receiver drops what it saw.
 *
 * A receiver with MC_MSG_ACK_AFTER_HANDLER answers MSG_ACK_LATER instead (queued, its handler
 * not run yet), and a MSG_DONE (stream, seq) once the handlers ran, on the connection the
 * stream's messages came on last, held for a pass like an answer.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "tcp_int.h"

/* The ready inbound connection from p (instance) its messages came on last, or its oldest one. */
static mc_tcp_conn_t *inbound_from(mc_engine_t *e, mc_peer_t *p, uint64_t instance)
{
    mc_tcp_conn_t *best = NULL;
    mc_list_t *pos;

    for (pos = tcp_of(e)->inbound.next; pos != &tcp_of(e)->inbound; pos = pos->next) {
        mc_tcp_conn_t *c = mc_container_of(pos, mc_tcp_conn_t, node);
        if (c->state == CS_READY && c->link.instance == instance &&
            !strcmp(c->remote_name, p->name) && (!best || c->msg_rx_seq > best->msg_rx_seq))
            best = c;
    }
    return best;
}

/* The connection p's messages go on now, or NULL (one is being opened). The one chosen stays
 * while it lives (msgs_lost forgets it) and some are unanswered on it, or while it is inbound
 * (the best there is), or while no inbound connection became ready since: no walk of the
 * inbound list each time the window drains. p's instance is its descriptor's or, while that is
 * still being fetched (a peer opened by a handler to answer a sender), what our connection's
 * handshake said: deciding without it sent each side's messages on its own connection for good
 * (two writes and two reads per message on each side, 1.4 us more one way). */
static mc_tcp_conn_t *msg_conn(mc_engine_t *e, mc_peer_t *p)
{
    tcp_peer_t *tp = tcp_peer(p);
    mc_tcp_conn_t *c = tp->msg_conn, *own;

    if (c &&
        (!mc_list_empty(&p->msg_unacked) || !c->outbound || tp->msg_gen == tcp_of(e)->inbound_gen))
        return c;
    own = p->desc.instance ? NULL : mc__tcp_ctrl_conn(e, p);
    uint64_t instance = p->desc.instance ? p->desc.instance : own ? own->link.instance : 0;
    if (!instance)
        return NULL; /* which side's connection carries both is not known yet */
    c = instance < e->instance ? inbound_from(e, p, instance) : NULL;
    if (!c)
        c = own ? own : mc__tcp_ctrl_conn(e, p);
    tp->msg_conn = c;
    tp->msg_gen = tcp_of(e)->inbound_gen;
    return c;
}

void mc__tcp_msgs_send(mc_engine_t *e, mc_peer_t *p)
{
    mc_tcp_conn_t *c = msg_conn(e, p);
    mc_msg_t *m;

    if (!c)
        return;
    while ((m = mc__msg_take(e, p, e->ctrl))) {
        mc_slice_t *s = mc__slice_alloc(e);
        if (!s) { /* it goes back to the queue, for a later pass */
            mc__msg_answered(e, p, m, m->tx, -EAGAIN);
            mc__msg_put(e, m);
            break;
        }
        mc_frame_t f = {.type = MC_FR_MSG,
                        .flags = m->id,
                        .id = ++tcp_of(e)->next_cookie,
                        .length = m->len,
                        .addr = m->seq,
                        .aux = p->msg_stream};
        s->kind = TCP_SL_MSG;
        s->ctx = m;
        s->offset = m->tx;
        s->payload = m->data;
        s->payload_len = m->len;
        tcp_sl(s)->cookie = f.id;
        mc__tcp_frame_encode(&f, tcp_sl(s)->hdr);
        if (c->window_used + c->msgs_out++ == 0)
            c->last_io_ns = mc__now_ns(); /* unanswered, it times out like a data request */
        mc_list_push_back(&c->sendq, &s->link);
    }
    if (!c->outbound && !c->in_later) /* outbound ones are flushed by the fill */
        mc__tcp_conn_flush(e, c);
}

void mc__tcp_msg_in(mc_engine_t *e, mc_tcp_conn_t *c)
{
    int rc = mc__msg_deliver(e, e->ctrl, c->remote_name, c->fr.aux, c->fr.addr,
                             (uint8_t)c->fr.flags, c->msg, c->ctrl_len, NULL, 0);
    static const char full[] = "the receiver's queue is full";
    mc_frame_t f = {.type = MC_FR_MSG_ACK,
                    .id = c->fr.id,
                    .flags = rc == MC__MSG_LATER ? MC_MSG_ACK_LATER : 0,
                    .aux = (uint64_t)(int64_t)(rc == MC__MSG_LATER ? 0 : rc),
                    .length = rc < 0 ? (uint32_t)strlen(full) : 0};
    mc_slice_t *s = mc__slice_alloc(e);

    c->msg_rx_seq = ++tcp_of(e)->msg_rx_seq;
    c->rx_stream = c->fr.aux;
    if (!s) {
        mc__tcp_conn_fail(e, c, -ENOMEM, "out of memory for an answer");
        return;
    }
    s->kind = TCP_SL_ANSWER;
    s->payload = rc < 0 ? (void *)full : NULL; /* static: not owned */
    s->payload_len = f.length;
    mc__tcp_frame_encode(&f, tcp_sl(s)->hdr);
    mc_list_push_back(&c->sendq, &s->link);
    c->n_resp++;
    mc__tcp_answer_later(e, c); /* after the messages its handlers send, with the others read */
}

int mc__tcp_msg_ack_expect(mc_engine_t *e, mc_tcp_conn_t *c)
{
    mc_slice_t *s = NULL;

    /* the oldest request awaiting its answer in order: control requests are answered by id,
     * perhaps later (transport.h MC_CTRL_LATER), so an answer may pass them */
    for (mc_list_t *pos = c->ackq.next; pos != &c->ackq && !s; pos = pos->next)
        if (mc_container_of(pos, mc_slice_t, link)->kind != MC_SL_CTRL)
            s = mc_container_of(pos, mc_slice_t, link);
    if (!s || s->kind != TCP_SL_MSG || tcp_sl(s)->cookie != c->fr.id) {
        mc__tcp_conn_fail(e, c, -MC_EPROTO, "MSG_ACK for message %u, which awaits none", c->fr.id);
        return -MC_EPROTO;
    }
    c->resp = s;
    c->dst_kind = DST_CTRL;
    return 0;
}

void mc__tcp_msg_acked(mc_engine_t *e, mc_tcp_conn_t *c, mc_slice_t *s)
{
    mc_msg_t *m = s->ctx;

    mc_list_del(&s->link);
    c->msgs_out--;
    c->last_io_ns = mc__now_ns();
    /* its peer, unless closed since (then m is no longer in flight and the answer is dropped) */
    mc__msg_answered(e, mc__peer_get(e, m->target), m, (uint32_t)s->offset,
                     c->fr.flags & MC_MSG_ACK_LATER ? MC__MSG_LATER : (int)(int64_t)c->fr.aux);
    mc__msg_put(e, m);
    mc__slice_free(e, s);
}

void mc__tcp_msgs_lost(mc_engine_t *e, mc_tcp_conn_t *c, mc_list_t *slices)
{
    mc_peer_t *p = NULL;
    mc_list_t *pos, *tmp;

    mc_list_for_each_safe(pos, tmp, slices)
    {
        mc_slice_t *s = mc_container_of(pos, mc_slice_t, link);
        if (s->kind != TCP_SL_MSG)
            continue;
        mc_msg_t *m = s->ctx;
        p = mc__peer_get(e, m->target); /* one peer's: they ride its connection only */
        mc_list_del(&s->link);
        mc__msg_put(e, m);
        mc__slice_free(e, s);
    }
    c->msgs_out = 0;
    for (size_t i = 0; i < e->n_peers; i++) {
        mc_peer_t *q = mc__peer_at(e, i);
        if (q && tcp_peer(q) && tcp_peer(q)->msg_conn == c) {
            tcp_peer(q)->msg_conn = NULL;
            if (q != p) /* answered MSG_ACK_LATER, they waited for a MSG_DONE on c */
                mc__msg_link_lost(e, q, e->ctrl);
        }
    }
    if (p) /* sent again, in order, on the next connection */
        mc__msg_link_lost(e, p, e->ctrl);
}

void mc__tcp_msg_handled(mc_engine_t *e, uint64_t stream, uint64_t seq)
{
    tcp_engine_t *t = tcp_of(e);

    mc__reap_mark(e, mc__tcp_slot);
    for (unsigned i = 0; i < t->n_dones; i++)
        if (t->dones[i].stream == stream) {
            if (seq > t->dones[i].seq)
                t->dones[i].seq = seq;
            return;
        }
    if (t->n_dones == t->cap_dones) {
        unsigned cap = t->cap_dones ? 2 * t->cap_dones : 8;
        tcp_done_t *d = realloc(t->dones, cap * sizeof(*d));
        if (!d) {
            mc_error("out of memory: a sender is not told that its messages' handlers ran");
            return;
        }
        t->dones = d;
        t->cap_dones = cap;
    }
    t->dones[t->n_dones++] = (tcp_done_t){stream, seq};
}

static void consider(mc_tcp_conn_t *c, uint64_t stream, mc_tcp_conn_t **best)
{
    if (c->state == CS_READY && c->rx_stream == stream &&
        (!*best || c->msg_rx_seq > (*best)->msg_rx_seq))
        *best = c;
}

/* The ready connection stream's messages came on last, or NULL. */
static mc_tcp_conn_t *conn_of_stream(mc_engine_t *e, uint64_t stream)
{
    mc_tcp_conn_t *best = NULL;
    mc_list_t *pos;

    for (pos = tcp_of(e)->inbound.next; pos != &tcp_of(e)->inbound; pos = pos->next)
        consider(mc_container_of(pos, mc_tcp_conn_t, node), stream, &best);
    for (size_t i = 0; i < e->n_peers; i++) {
        mc_peer_t *q = mc__peer_at(e, i);
        if (!q || !tcp_peer(q))
            continue;
        for (pos = tcp_peer(q)->conns.next; pos != &tcp_peer(q)->conns; pos = pos->next)
            consider(mc_container_of(pos, mc_tcp_conn_t, node), stream, &best);
    }
    return best;
}

void mc__tcp_dones_send(mc_engine_t *e)
{
    tcp_engine_t *t = tcp_of(e);

    for (unsigned i = 0; i < t->n_dones; i++) {
        mc_tcp_conn_t *c = conn_of_stream(e, t->dones[i].stream);
        mc_slice_t *s = c ? mc__slice_alloc(e) : NULL;
        if (!c) /* its sender lost the link: it sends them again on the next, and hears then */
            continue;
        if (!s) {
            mc_error("out of memory: a sender is not told that its messages' handlers ran");
            continue;
        }
        mc_frame_t f = {.type = MC_FR_MSG_DONE, .addr = t->dones[i].seq, .aux = t->dones[i].stream};
        s->kind = TCP_SL_ANSWER;
        mc__tcp_frame_encode(&f, tcp_sl(s)->hdr);
        mc_list_push_back(&c->sendq, &s->link);
        c->n_resp++;
        mc__tcp_answer_later(e, c);
    }
    t->n_dones = 0;
}

void mc__tcp_msg_done_in(mc_engine_t *e, mc_tcp_conn_t *c)
{
    uint64_t stream = c->fr.aux;
    mc_peer_t *p = c->outbound ? c->link.peer : NULL;

    for (size_t i = 0; (!p || p->msg_stream != stream) && i < e->n_peers; i++)
        p = mc__peer_at(e, i);
    if (p && p->msg_stream == stream)
        mc__msg_handled(e, p, stream, c->fr.addr);
}
