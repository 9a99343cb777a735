/* TCP, initiator role: outbound connections that carry our requests to one peer. */
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "tcp_int.h"

#define RETIRED_MAX          4096 /* a peer's retired ids not known dropped (the oldest go past) */
#define CONNECT_FAILURES_MAX 3

/* Liveness is the kernel's: a peer whose host stops acknowledging is given up after
 * MC_TCP_LIVENESS_FACTOR x MC_IO_TIMEOUT_MS (instead of TCP's minutes of retransmissions), and
 * an idle connection is probed by keepalives after as long; neither depends on the application
 * calling progress. A live peer that is merely not reading (its host computes between progress
 * calls) keeps its connections for that long: our own I/O timeout judges only the data we are
 * moving while we run progress (tcp.c). */
void mc__tcp_sockopts(mc_engine_t *e, int fd)
{
    int one = 1;
    unsigned timeout = MC_TCP_LIVENESS_FACTOR * e->cfg.io_timeout_ms;
    int idle = (int)(timeout / 1000 ? timeout / 1000 : 1), intvl = idle / 4 ? idle / 4 : 1, cnt = 4;

    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &timeout, sizeof(timeout));
    setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof(intvl));
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof(cnt));
}

/* A failure of rail r (mc__rail_failed), the last if no other rail of the peer may connect. */
static void rail_failed(tcp_peer_t *tp, tcp_rail_t *r, bool connecting)
{
    uint64_t now = mc__now_ns();
    bool others = false;

    for (unsigned i = 0; i < tp->n_rails; i++)
        others = others || (&tp->rails[i] != r && mc__rail_usable(&tp->rails[i].base, now));
    mc__rail_failed(&r->base, now, connecting, !others);
}

static int conn_open(mc_engine_t *e, mc_peer_t *p, tcp_rail_t *r)
{
    tcp_engine_t *t = tcp_of(e);
    tcp_peer_t *tp = tcp_peer(p);
    struct sockaddr_storage sa, local;
    socklen_t sa_len, local_len;
    mc_tcp_conn_t *c;

    sa = r->remote; /* rails change in the progress context only: ours */
    sa_len = r->remote_len;
    local = r->local;
    local_len = r->local_len;
    int fd = socket(sa.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return mc__set_error(-errno, "socket: %s", strerror(errno));
    mc__tcp_sockopts(e, fd);
    /* Bound to the rail's local address, the connection leaves through that link. */
    if ((local_len && bind(fd, (struct sockaddr *)&local, local_len) < 0) ||
        (connect(fd, (struct sockaddr *)&sa, sa_len) < 0 && errno != EINPROGRESS)) {
        int err = errno;
        close(fd);
        return mc__set_error(-err, "rail %s: %s", r->base.name, strerror(err));
    }
    c = mc__tcp_conn_new(e, fd, true);
    if (!c) {
        close(fd);
        return mc__set_error(-ENOMEM, "out of memory");
    }
    c->link.peer = p;
    snprintf(c->remote_name, sizeof(c->remote_name), "%s", p->name);
    c->rail = r;
    c->id = ++t->next_conn_id;
    c->events = EPOLLOUT | EPOLLIN;
    mc_list_push_back(&tp->conns, &c->node);
    tp->n_conns++;
    r->base.n_conns++;
    t->n_outbound++;
    if (mc__epoll_add(e, &c->pollable, c->events)) {
        mc__tcp_conn_close(e, c);
        return -EIO;
    }
    return 0;
}

static void send_hello(mc_engine_t *e, mc_tcp_conn_t *c)
{
    mc_peer_t *p = c->link.peer;
    tcp_peer_t *tp = tcp_peer(p);
    mc_hello_t h = {.instance = e->instance};
    uint8_t buf[MC_PROTO_MAX_CTRL];
    mc_frame_t f = {.type = MC_FR_HELLO, .id = c->id};

    mc__random_bytes(c->nonce, sizeof(c->nonce));
    memcpy(h.nonce, c->nonce, sizeof(h.nonce));
    snprintf(h.name, sizeof(h.name), "%s", e->name);
    if (p->state != MC_SEGMENT_OPENING) /* opened by address: whoever answers there, checked by
                                        its instance */
        snprintf(h.peer_name, sizeof(h.peer_name), "%s", p->name);
    for (unsigned i = 0; i < tp->n_retired && h.n_retired < MC_PROTO_MAX_RETIRE; i++)
        h.retired[h.n_retired++] = c->hello_retired[i] = tp->retired[i];
    c->n_hello_retired = (uint8_t)h.n_retired;
    size_t len = mc__tcp_hello_encode(&h, buf);
    if (mc__tcp_conn_send_ctrl(e, c, &f, buf, (uint32_t)len))
        mc__tcp_conn_fail(e, c, -ENOMEM, "out of memory");
}

void mc__tcp_out_connected(mc_engine_t *e, mc_tcp_conn_t *c)
{
    int err = 0;
    socklen_t len = sizeof(err);

    getsockopt(c->pollable.fd, SOL_SOCKET, SO_ERROR, &err, &len);
    if (err) {
        c->rail->refused = err == ECONNREFUSED;
        if (err == ECONNRESET)
            mc__tcp_handshake_cut(c);
        mc__tcp_conn_fail(e, c, -MC_EPEERDEAD, "connect to %s: %s", c->link.peer->name,
                          strerror(err));
        return;
    }
    c->state = CS_HELLO;
    c->last_io_ns = mc__now_ns();
    send_hello(e, c);
    mc__tcp_conn_flush(e, c);
}

static void maybe_open(mc_engine_t *e, mc_peer_t *p, const char *location, int best);
static void rail_open(mc_engine_t *e, mc_peer_t *p, tcp_rail_t *r);

/* ---- retire bookkeeping ----
 *
 * A connection that failed with requests on it is retired: the target must drop what it has
 * not read of it before it applies their retries, or a stale WRITE still in the network (the
 * kernel retransmits a closed socket's bytes; a partitioned target reads them when it heals)
 * could land over newer data. The target hears it in a RETIRE frame on each ready sibling, and
 * in the HELLO of every connection made after, ahead of any slice; an id is forgotten only once
 * a connection whose HELLO listed it is ready (the target drops the listed connections before
 * it answers the handshake). Before, ids were forgotten by age (2 x MC_IO_TIMEOUT_MS +
 * MC_CONNECT_TIMEOUT_MS): a partition that outlasted it with no sibling ready let the stale
 * WRITE land after the newer one. Only connections that were ready are retired, so a peer's list
 * holds about as many as it had connections; RETIRED_MAX bounds it anyway. */

static void retire_remember(tcp_peer_t *p, const char *name, uint32_t id)
{
    if (p->n_retired == p->cap_retired && p->cap_retired < RETIRED_MAX) {
        unsigned cap = p->cap_retired ? 2 * p->cap_retired : 16;
        uint32_t *v = realloc(p->retired, cap * sizeof(*v));
        if (v) {
            p->retired = v;
            p->cap_retired = cap;
        }
    }
    if (p->n_retired == p->cap_retired) {
        if (!p->cap_retired)
            return;
        mc_warn("%s: %u retired connections not known dropped by the target: forgetting the "
                "oldest",
                name, p->n_retired);
        memmove(p->retired, p->retired + 1, (p->n_retired - 1) * sizeof(*p->retired));
        p->n_retired--;
    }
    p->retired[p->n_retired++] = id;
}

/* c is ready: the ids its HELLO listed are dropped at the target. */
static void retire_confirmed(tcp_peer_t *p, const mc_tcp_conn_t *c)
{
    unsigned n = 0;

    for (unsigned i = 0; i < p->n_retired; i++) {
        bool listed = false;
        for (unsigned j = 0; j < c->n_hello_retired && !listed; j++)
            listed = c->hello_retired[j] == p->retired[i];
        if (!listed)
            p->retired[n++] = p->retired[i];
    }
    p->n_retired = n;
}

/* Tell the target, on a live connection, to drop what it has not read of the listed ones.
 * Queued before any retried slice, so the target drops stale data before applying new. */
static void retire_send(mc_engine_t *e, mc_tcp_conn_t *c, const uint32_t *list, unsigned count)
{
    uint8_t ids[MC_PROTO_MAX_RETIRE * 4];
    mc_frame_t f = {.type = MC_FR_RETIRE};

    for (unsigned i = 0; i < count && c->state != CS_DEAD;) {
        uint32_t n = 0;
        for (; i < count && n < MC_PROTO_MAX_RETIRE; i++, n++)
            for (int b = 0; b < 4; b++)
                ids[4 * n + (uint32_t)b] = (uint8_t)(list[i] >> (8 * b));
        if (mc__tcp_conn_send_ctrl(e, c, &f, ids, 4 * n))
            mc__tcp_conn_fail(e, c, -ENOMEM, "out of memory");
    }
}

/* Every rail of the peer has failed to connect several times in a row, or is paused. */
static bool all_rails_down(const tcp_peer_t *p)
{
    for (unsigned i = 0; i < p->n_rails; i++)
        if (p->rails[i].base.state == MC_RAIL_ACTIVE &&
            p->rails[i].base.connect_failures < CONNECT_FAILURES_MAX)
            return false;
    return true;
}

static void reset_rails(tcp_peer_t *p)
{
    for (unsigned i = 0; i < p->n_rails; i++)
        p->rails[i].base.connect_failures = 0;
}

/* Every rail's last connect was refused: the host is up and nothing listens at any of the
 * peer's endpoints, so its process is gone. */
static bool all_rails_refused(const tcp_peer_t *p)
{
    for (unsigned i = 0; i < p->n_rails; i++)
        if (!p->rails[i].refused)
            return false;
    return p->n_rails > 0;
}

/* Connect again at once on the rails whose connection was closed during its handshake. */
static bool recheck(mc_engine_t *e, mc_peer_t *p)
{
    tcp_peer_t *tp = tcp_peer(p);
    bool any = false;

    for (unsigned i = 0; i < tp->n_rails; i++) {
        tcp_rail_t *r = &tp->rails[i];
        if (!r->recheck)
            continue;
        r->recheck = false;
        r->rechecks++;
        any = true;
        rail_open(e, p, r);
    }
    return any;
}

/* A connection that never completed its handshake failed: the peer may have moved (its
 * descriptor in the metadata cache may say where), be gone (refused everywhere), or be
 * unreachable (every rail failed repeatedly): then what is queued to it fails. */
static void connect_failed(mc_engine_t *e, mc_peer_t *p, int err, const char *why)
{
    tcp_peer_t *tp = tcp_peer(p);

    if (err == -MC_ECANCELED) /* the engine goes down */
        return;
    mc__peer_reload_cached(e, p);
    if (all_rails_refused(tp) && p->state == MC_SEGMENT_READY) {
        mc__peer_dead(e, p, "nothing listens at its address%s any more (%s)",
                      tp->n_rails > 1 ? "es" : "", why);
    } else if (recheck(e, p)) {
        return; /* its answer decides */
    } else if (err == -MC_EAUTH || err == -MC_EVERSION || err == -MC_ENOSEGMENT ||
               all_rails_refused(tp) || all_rails_down(tp)) {
        char msg[512];
        snprintf(msg, sizeof(msg), "cannot reach segment %s over any of its %u paths: %s", p->name,
                 tp->n_rails, why);
        mc__peer_unreachable(e, p, err, msg);
        reset_rails(tp);
    }
}

/* The last link to p broke while established: connect once on every rail, paused or not, to
 * learn whether it is still there (a refusal everywhere says its process is gone). */
static void probe(mc_engine_t *e, mc_peer_t *p)
{
    tcp_peer_t *tp = tcp_peer(p);

    for (unsigned i = 0; i < tp->n_rails && p->state == MC_SEGMENT_READY; i++)
        if (!tp->rails[i].base.n_conns)
            rail_open(e, p, &tp->rails[i]);
}

void mc__tcp_out_failed(mc_engine_t *e, mc_tcp_conn_t *c, int err, const char *reason)
{
    mc_peer_t *p = c->link.peer;
    tcp_peer_t *tp = tcp_peer(p);
    tcp_rail_t *r = c->rail;
    /* A control request may commit staged data too (file): retire the connection after it. */
    bool connecting = c->state != CS_READY, had_data = c->window_used > 0 || c->ctrl_out > 0;
    mc_list_t failed, *n;
    char why[512];

    snprintf(why, sizeof(why), "rail %s: %s", r->base.name, reason ? reason : "closed");
    if (reason)
        mc_warn("connection %u to %s failed: %s", c->id, p->name, why);
    /* The socket is closed by our caller right after; collect its slices first. */
    mc_list_init(&failed);
    mc_list_splice_back(&failed, &c->ackq);
    mc_list_splice_back(&failed, &c->sendq);
    mc__link_lost(e, &c->link); /* before its control requests are freed below */
    mc_list_del(&c->node);
    if (tp->order_conn == c)
        tp->order_conn = NULL; /* what it carried is retried, in order, on the next one */
    tp->n_conns--;
    r->base.n_conns--;
    tcp_of(e)->n_outbound--;
    mc__tcp_msgs_lost(e, c, &failed); /* sent again, in order, on the next connection */
    if (reason)
        rail_failed(tp, r, connecting);
    if (had_data) {
        uint32_t id = c->id; /* (c is not touched below: a sibling failing adds its own) */
        retire_remember(tp, p->name, id);
        for (mc_list_t *pos = tp->conns.next; pos != &tp->conns; pos = pos->next) {
            mc_tcp_conn_t *o = mc_container_of(pos, mc_tcp_conn_t, node);
            if (o->state != CS_READY)
                continue;
            retire_send(e, o, &id, 1);
            if (o->state == CS_DEAD) /* could not queue it: o (and maybe others) left the */
                pos = &tp->conns;    /* list; again from the start (a RETIRE twice is harmless) */
        }
    }
    while ((n = mc_list_pop_front(&failed))) {
        mc_slice_t *s = mc_container_of(n, mc_slice_t, link);
        if (s->kind == MC_SL_DATA) {
            mc__slice_failed(e, s, err, true, why);
            continue;
        }
        if (s->kind == TCP_SL_DESC)
            mc__peer_desc_retry(e, p);
        mc__slice_free(e, s);
    }
    c->window_used = c->ctrl_out = 0;
    if (!reason)
        return;
    mc__tp_count(e, mc__tcp_slot, MC_CNT_ERRORS, 1);
    if (connecting)
        connect_failed(e, p, err, why);
    else if (err != -MC_ECANCELED && err != -EAGAIN && !tp->n_conns &&
             p->state == MC_SEGMENT_READY) /* EAGAIN: the target closed it to make room */
        probe(e, p);
    mc__peer_activate(e, p);
}

/* ---- frames from the target ---- */

/* The oldest request awaiting its response, control requests aside: their answers may come
 * later than those of the requests after them (expect_ctrl). NULL if there is none. */
static mc_slice_t *ack_head(mc_tcp_conn_t *c)
{
    for (mc_list_t *pos = c->ackq.next; pos != &c->ackq; pos = pos->next) {
        mc_slice_t *s = mc_container_of(pos, mc_slice_t, link);
        if (s->kind != MC_SL_CTRL)
            return s;
    }
    return NULL;
}

static int expect_head(mc_engine_t *e, mc_tcp_conn_t *c, mc_slice_t **s_p)
{
    mc_slice_t *s = c->state == CS_READY ? ack_head(c) : NULL;

    if (!s) {
        mc__tcp_conn_fail(e, c, -MC_EPROTO, "unexpected %s", mc__tcp_frame_type_name(c->fr.type));
        return -MC_EPROTO;
    }
    if (tcp_sl(s)->cookie != c->fr.id) {
        mc__tcp_conn_fail(e, c, -MC_EPROTO, "%s for request %u, expected %u",
                          mc__tcp_frame_type_name(c->fr.type), c->fr.id, tcp_sl(s)->cookie);
        return -MC_EPROTO;
    }
    *s_p = c->resp = s;
    return 0;
}

/* A control answer, matched by its id: the transport that answers may defer it (a disk read on
 * the peer, transport.h MC_CTRL_LATER), so it may come after the responses to later requests. */
static int expect_ctrl(mc_engine_t *e, mc_tcp_conn_t *c, mc_slice_t **s_p)
{
    mc_list_t *pos;

    if (c->state == CS_READY)
        for (pos = c->ackq.next; pos != &c->ackq; pos = pos->next) {
            mc_slice_t *s = mc_container_of(pos, mc_slice_t, link);
            if (tcp_sl(s)->cookie == c->fr.id && s->kind == MC_SL_CTRL) {
                *s_p = c->resp = s;
                return 0;
            }
        }
    mc__tcp_conn_fail(e, c, -MC_EPROTO, "%s for request %u, which awaits none",
                      mc__tcp_frame_type_name(c->fr.type), c->fr.id);
    return -MC_EPROTO;
}

int mc__tcp_out_header(mc_engine_t *e, mc_tcp_conn_t *c)
{
    mc_slice_t *s;

    switch (c->fr.type) {
    case MC_FR_HELLO_REPLY:
    case MC_FR_READY:
        if (c->state != (c->fr.type == MC_FR_READY ? CS_AUTH : CS_HELLO))
            break;
        c->dst_kind = DST_CTRL;
        return 0;
    case MC_FR_ERROR:
        c->dst_kind = DST_CTRL;
        return 0;
    case MC_FR_CTRL_RESP:
    case MC_FR_DESC_REPLY:
        if ((c->fr.type == MC_FR_CTRL_RESP ? expect_ctrl : expect_head)(e, c, &s))
            return -MC_EPROTO;
        if (s->kind != (c->fr.type == MC_FR_CTRL_RESP ? MC_SL_CTRL : TCP_SL_DESC))
            break;
        c->dst_kind = DST_CTRL;
        return 0;
    case MC_FR_MSG_ACK:
        return mc__tcp_msg_ack_expect(e, c);
    case MC_FR_MSG: /* the target's own message (tcp_msg.c) */
    case MC_FR_MSG_DONE:
        if (c->state != CS_READY)
            break;
        c->dst_kind = DST_CTRL;
        return 0;
    case MC_FR_WRITE_ACK:
    case MC_FR_READ_RESP:
        if (expect_head(e, c, &s))
            return -MC_EPROTO;
        if (s->kind != MC_SL_DATA || (c->fr.type == MC_FR_WRITE_ACK) != (s->opcode == MC_WRITE))
            break;
        if (c->fr.aux == 0 && c->fr.type == MC_FR_READ_RESP) {
            if (c->fr.length != s->len)
                break;
            c->dst_kind = DST_MEM; /* (dropped if its task ends: rx_payload) */
            c->dst = (uint8_t *)s->task->req.local + s->offset;
        } else {
            c->dst_kind = c->fr.aux == 0 && c->fr.length ? DST_DISCARD : DST_CTRL;
        }
        return 0;
    }
    mc__tcp_conn_fail(e, c, -MC_EPROTO, "unexpected %s frame from target",
                      mc__tcp_frame_type_name(c->fr.type));
    return -MC_EPROTO;
}

static void on_hello_reply(mc_engine_t *e, mc_tcp_conn_t *c)
{
    const char *token = e->cfg.auth_token;
    bool need = c->fr.flags & MC_HELLO_AUTH_REQUIRED;
    uint8_t proof[32];
    mc_hello_t h;

    if (mc__tcp_hello_decode(c->ctrl, c->ctrl_len, &h)) {
        mc__tcp_conn_fail(e, c, -MC_EPROTO, "%s", mc_last_error());
        return;
    }
    mc_peer_t *p = c->link.peer;
    if (p->desc.instance && h.instance != p->desc.instance) {
        if (p->state == MC_SEGMENT_READY) /* a new process took over its address */
            mc__peer_dead(e, p, "another engine (instance %016llx) answers at its address",
                          (unsigned long long)h.instance);
        mc__tcp_conn_fail(e, c, -MC_ENOSEGMENT, "%s is another engine now (instance %016llx)",
                          p->name, (unsigned long long)h.instance);
        return;
    }
    if (p->state != MC_SEGMENT_OPENING && strcmp(h.name, p->name)) {
        mc__tcp_conn_fail(e, c, -MC_ENOSEGMENT, "%s is now segment %s", p->name, h.name);
        return;
    }
    c->link.instance = h.instance;
    snprintf(c->remote_name, sizeof(c->remote_name), "%s", h.name); /* its messages' sender */
    if (need != (token[0] != 0)) {
        mc__tcp_conn_fail(e, c, -MC_EAUTH,
                          need ? "peer requires MC_AUTH_TOKEN"
                               : "peer does not authenticate (MC_AUTH_TOKEN "
                                 "is set here)");
        return;
    }
    if (!need) {
        c->state = CS_READY;
        return;
    }
    if (mc__tcp_proof(token, "target", c->nonce, h.nonce, h.name, proof) ||
        !mc__ct_equal(proof, h.proof, sizeof(proof))) {
        mc__tcp_conn_fail(e, c, -MC_EAUTH, "peer's proof of MC_AUTH_TOKEN is wrong");
        return;
    }
    if (mc__tcp_proof(token, "initiator", h.nonce, c->nonce, e->name, proof)) {
        mc__tcp_conn_fail(e, c, -MC_EAUTH, "%s", mc_last_error());
        return;
    }
    mc_frame_t f = {.type = MC_FR_AUTH};
    if (mc__tcp_conn_send_ctrl(e, c, &f, proof, sizeof(proof))) {
        mc__tcp_conn_fail(e, c, -ENOMEM, "out of memory");
        return;
    }
    c->state = CS_AUTH;
}

static void on_response(mc_engine_t *e, mc_tcp_conn_t *c)
{
    mc_slice_t *s = c->resp; /* what mc__tcp_out_header matched the frame to */
    char reason[300];

    mc_list_del(&s->link);
    c->last_io_ns = mc__now_ns();
    if (s->kind == TCP_SL_MSG) { /* outside the window */
        mc__tcp_msg_acked(e, c, s);
        return;
    }
    if (s->kind == MC_SL_CTRL) { /* outside the window */
        c->ctrl_out--;
        mc__ctrl_answered(e, s, &c->link, (int)(int64_t)c->fr.aux, c->ctrl, c->ctrl_len);
        mc__slice_free(e, s);
        return;
    }
    c->window_used--;
    if (s->kind == TCP_SL_DESC) {
        mc__slice_free(e, s);
        mc__peer_desc_arrived(e, c->link.peer, c->ctrl, c->ctrl_len);
        return;
    }
    if (c->fr.aux == 0) {
        mc__rail_moved(&c->rail->base, s->len);
        mc__slice_done(e, s);
        return;
    }
    /* The target refused: bad address, unregistered memory. Retrying cannot help. */
    snprintf(reason, sizeof(reason), "segment %s refused: %.*s", c->link.peer->name,
             (int)c->ctrl_len, c->ctrl ? (char *)c->ctrl : "");
    mc__slice_failed(e, s, (int)(int64_t)c->fr.aux, false, reason);
}

void mc__tcp_out_frame(mc_engine_t *e, mc_tcp_conn_t *c)
{
    switch (c->fr.type) {
    case MC_FR_HELLO_REPLY:
        on_hello_reply(e, c);
        break;
    case MC_FR_READY:
        c->state = CS_READY;
        break;
    case MC_FR_ERROR:
        mc__tcp_conn_fail(e, c, (int)(int64_t)c->fr.aux, "peer: %.*s", (int)c->ctrl_len,
                          (char *)c->ctrl);
        return;
    case MC_FR_MSG:
        mc__tcp_msg_in(e, c);
        return;
    case MC_FR_MSG_DONE:
        mc__tcp_msg_done_in(e, c);
        return;
    default:
        on_response(e, c);
        return;
    }
    if (c->state == CS_READY) {
        c->rail->refused = c->rail->recheck = false;
        c->rail->rechecks = 0;
        mc__rail_ready(&c->rail->base);
        tcp_peer_t *tp = tcp_peer(c->link.peer);
        retire_confirmed(tp, c);
        retire_send(e, c, tp->retired, tp->n_retired); /* retired since its HELLO, or past it */
        mc__peer_activate(e, c->link.peer);
        mc__peer_link_up(e, c->link.peer);
    }
}

/* ---- filling connections ---- */

static void assign(mc_engine_t *e, mc_tcp_conn_t *c, mc_slice_t *s)
{
    mc_task_t *t = s->task;
    mc_frame_t f = {.id = ++tcp_of(e)->next_cookie, .addr = t->req.target_offset + s->offset};

    tcp_sl(s)->cookie = f.id;
    s->rails_tried |= 1u << (c->rail - tcp_peer(t->peer)->rails);
    if (s->opcode == MC_WRITE) {
        f.type = MC_FR_WRITE;
        f.length = s->len;
        s->payload = (uint8_t *)t->req.local + s->offset;
        s->payload_len = s->len;
    } else {
        f.type = MC_FR_READ;
        f.aux = s->len;
        s->payload_len = 0;
    }
    mc__tcp_frame_encode(&f, tcp_sl(s)->hdr);
    if (c->window_used++ == 0)
        c->last_io_ns = mc__now_ns(); /* the no-progress clock starts now */
    mc_list_push_back(&c->sendq, &s->link);
}

static bool evict_idle(mc_engine_t *e);

static void rail_open(mc_engine_t *e, mc_peer_t *p, tcp_rail_t *r)
{
    if (tcp_of(e)->n_outbound >= tcp_of(e)->max_conns && !evict_idle(e))
        return;
    int rc = conn_open(e, p, r);
    if (rc) {
        r->refused = rc == -ECONNREFUSED;
        mc_warn("%s", mc_last_error());
        rail_failed(tcp_peer(p), r, true);
        connect_failed(e, p, -MC_EPEERDEAD, mc_last_error());
    }
}

/* Close one idle outbound connection of any peer to make room under MC_MAX_CONNS. */
static bool evict_idle(mc_engine_t *e)
{
    for (size_t i = 0; i < e->n_peers; i++) {
        mc_peer_t *p = mc__peer_at(e, i);
        mc_list_t *pos;
        if (!p || !tcp_peer(p))
            continue;
        for (pos = tcp_peer(p)->conns.next; pos != &tcp_peer(p)->conns; pos = pos->next) {
            mc_tcp_conn_t *c = mc_container_of(pos, mc_tcp_conn_t, node);
            /* A link that carries other transports' state (queue pairs) is not idle. */
            if (c->state == CS_READY && !c->window_used && !c->msgs_out && !c->ctrl_out &&
                mc_list_empty(&c->sendq) && !mc__link_busy(&c->link)) {
                mc__tcp_conn_close(e, c);
                return true;
            }
        }
    }
    return false;
}

mc_tcp_conn_t *mc__tcp_ctrl_conn(mc_engine_t *e, mc_peer_t *p)
{
    tcp_peer_t *tp = tcp_peer(p);
    mc_list_t *pos;

    for (pos = tp->conns.next; pos != &tp->conns; pos = pos->next) {
        mc_tcp_conn_t *c = mc_container_of(pos, mc_tcp_conn_t, node);
        if (c->state == CS_READY)
            return c;
    }
    if (mc_list_empty(&tp->conns))
        maybe_open(e, p, "", 3);
    return NULL;
}

bool mc__tcp_ctrl_ready(mc_engine_t *e, mc_peer_t *p)
{
    return mc__tcp_ctrl_conn(e, p) != NULL;
}

int mc__tcp_ctrl_send(mc_engine_t *e, mc_peer_t *p, mc_slice_t *s, mc_link_t **link_p)
{
    mc_tcp_conn_t *c = mc__tcp_ctrl_conn(e, p);

    if (!c)
        return -EAGAIN; /* its readiness activates p, whose fill asks again */
    mc_frame_t f = {.type = MC_FR_CTRL_REQ,
                    .flags = s->tp,
                    .id = ++tcp_of(e)->next_cookie,
                    .length = s->payload_len};
    tcp_sl(s)->cookie = f.id;
    mc__tcp_frame_encode(&f, tcp_sl(s)->hdr);
    if (c->window_used + c->msgs_out + c->ctrl_out++ == 0)
        c->last_io_ns = mc__now_ns(); /* an unanswered request times out like a data one */
    mc_list_push_back(&c->sendq, &s->link);
    *link_p = &c->link;
    /* A send that fails here leaves the failure to the next pass: the caller binds what lives
     * and dies with the link after this returns. */
    c->fail_later = true;
    mc__tcp_conn_flush(e, c);
    c->fail_later = false;
    return 0;
}

int mc__tcp_desc_request(mc_engine_t *e, mc_peer_t *p)
{
    mc_tcp_conn_t *c = mc__tcp_ctrl_conn(e, p);
    mc_slice_t *s;

    if (!c)
        return -EAGAIN; /* its readiness activates p, which asks again */
    s = mc__slice_alloc(e);
    if (!s)
        return mc__set_error(-ENOMEM, "out of memory");
    mc_frame_t f = {.type = MC_FR_DESC_REQ, .id = ++tcp_of(e)->next_cookie};
    s->kind = TCP_SL_DESC;
    tcp_sl(s)->cookie = f.id;
    mc__tcp_frame_encode(&f, tcp_sl(s)->hdr);
    if (c->window_used++ == 0)
        c->last_io_ns = mc__now_ns(); /* unanswered, it times out like a data request */
    mc_list_push_back(&c->sendq, &s->link);
    mc__tcp_conn_flush(e, c);
    return 0;
}

/* The best rank (see mc__rail_rank) among rails with a ready connection, for location. */
static int best_rank(mc_engine_t *e, tcp_peer_t *tp, const char *location)
{
    int best = 3;
    mc_list_t *pos;

    for (pos = tp->conns.next; pos != &tp->conns; pos = pos->next) {
        mc_tcp_conn_t *c = mc_container_of(pos, mc_tcp_conn_t, node);
        int rank = c->state == CS_READY ? mc__rail_rank(e, &c->rail->base, location) : 3;
        best = rank < best ? rank : best;
    }
    return best;
}

/* Open a connection on every usable rail that has none (so a failover target is ready), and,
 * when every connection of the best rails is full, one more on the least-connected of those,
 * up to MC_TCP_CONNS per rail. */
static void maybe_open(mc_engine_t *e, mc_peer_t *p, const char *location, int best)
{
    tcp_peer_t *tp = tcp_peer(p);
    uint64_t now = mc__now_ns();
    tcp_rail_t *extra = NULL;

    for (unsigned i = 0; i < tp->n_rails; i++) {
        tcp_rail_t *r = &tp->rails[i];
        if (!mc__rail_usable(&r->base, now) || now < r->base.next_connect_ns)
            continue;
        if (r->base.n_conns == 0)
            rail_open(e, p, r);
        else if (r->base.n_conns < tcp_of(e)->conns_per_rail &&
                 mc__rail_rank(e, &r->base, location) <= best &&
                 (!extra || r->base.n_conns < extra->base.n_conns))
            extra = r;
    }
    if (extra)
        rail_open(e, p, extra);
}

/* The connection that carries p's ORDERED tasks: one, so that the target takes them in the
 * order sent (MC_TP_ORDERED). Kept until it goes; then the first ready one. */
static mc_tcp_conn_t *order_conn(tcp_peer_t *tp)
{
    mc_list_t *pos;

    for (pos = tp->conns.next; !tp->order_conn && pos != &tp->conns; pos = pos->next) {
        mc_tcp_conn_t *c = mc_container_of(pos, mc_tcp_conn_t, node);
        if (c->state == CS_READY)
            tp->order_conn = c;
    }
    return tp->order_conn && tp->order_conn->state == CS_READY ? tp->order_conn : NULL;
}

/* Hand slices to ready connections with room, one each in turn so they run in parallel, on the
 * rails the buffer's location prefers most among those that have a ready connection; slices
 * of ORDERED tasks all to one (order_conn), in turn with the rest. When work is left that none
 * could take, open connections. */
static void fill_conns(mc_engine_t *e, mc_peer_t *p)
{
    tcp_peer_t *tp = tcp_peer(p);
    mc_task_t *t;

    while ((t = mc__sched_peek_task(e, p, mc__tcp_slot))) {
        const char *loc = t->lbuf->location;
        int best = best_rank(e, tp, loc);
        bool took = false;
        mc_list_t *pos;
        if (t->ordered) {
            mc_tcp_conn_t *c = order_conn(tp);
            if (!c || c->window_used >= tcp_of(e)->window) {
                if (!c)
                    maybe_open(e, p, loc, best);
                return; /* nothing may overtake it */
            }
            mc_slice_t *s = mc__sched_next_slice(e, p, mc__tcp_slot);
            if (!s)
                return;
            assign(e, c, s);
            continue;
        }
        for (pos = tp->conns.next; pos != &tp->conns; pos = pos->next) {
            mc_tcp_conn_t *c = mc_container_of(pos, mc_tcp_conn_t, node);
            if (c->state != CS_READY || c->window_used >= tcp_of(e)->window ||
                mc__rail_rank(e, &c->rail->base, loc) > best)
                continue;
            mc_slice_t *s = mc__sched_next_slice(e, p, mc__tcp_slot);
            if (!s)
                return;
            if (s->task->ordered) { /* the host canceled the one ahead just now */
                mc__sched_unslice(p, mc__tcp_slot, s);
                took = true; /* look again */
                break;
            }
            assign(e, c, s);
            took = true;
            t = mc__sched_peek_task(e, p, mc__tcp_slot);
            if (!t || t->ordered || t->lbuf->location != loc)
                break; /* the next task may live elsewhere, or go on order_conn: again */
        }
        if (!took) {
            maybe_open(e, p, loc, best);
            return;
        }
    }
}

void mc__tcp_fill(mc_engine_t *e, mc_peer_t *p)
{
    tcp_peer_t *tp = tcp_peer(p);
    mc_list_t *pos, *tmp;

    fill_conns(e, p);
    if (mc__msg_peek(p, e->ctrl))
        mc__tcp_msgs_send(e, p);
    mc_list_for_each_safe(pos, tmp, &tp->conns)
    {
        mc_tcp_conn_t *c = mc_container_of(pos, mc_tcp_conn_t, node);
        if (c->state == CS_READY && !mc_list_empty(&c->sendq))
            mc__tcp_conn_flush(e, c);
    }
}
