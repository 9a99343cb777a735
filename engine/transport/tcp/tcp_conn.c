/* TCP connection mechanics shared by both roles: the receive loop (staging buffer, payloads
 * into place), the send path (one writev for many queued frames), events and teardown. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "tcp_int.h"

#define RX_READS   64 /* socket reads per connection per pass, so none starves the others */
#define RX_SYSCALL 2  /* step result: progress made with a socket read */

static bool conn_poll(mc_engine_t *e, mc_pollable_t *p);

mc_tcp_conn_t *mc__tcp_conn_new(mc_engine_t *e, int fd, bool outbound)
{
    mc_tcp_conn_t *c = calloc(1, sizeof(*c));

    if (!c)
        return NULL;
    c->rx = malloc(MC_TCP_RX_BUF);
    if (!c->rx) {
        free(c);
        return NULL;
    }
    c->pollable.fd = fd;
    c->pollable.handler = mc__tcp_conn_handler;
    c->pollable.poll = conn_poll;
    c->outbound = outbound;
    c->state = outbound ? CS_CONNECTING : CS_HELLO;
    c->since_ns = c->last_io_ns = mc__now_ns();
    mc_list_init(&c->sendq);
    mc_list_init(&c->ackq);
    mc_list_init(&c->node);
    mc__link_init(&c->link);
    c->link.remote = c->remote_name;
    atomic_fetch_add(&e->n_links, 1);
    return c;
}

void mc__tcp_conn_update_events(mc_engine_t *e, mc_tcp_conn_t *c)
{
    uint32_t ev = 0;

    if (c->state == CS_DEAD)
        return;
    if (c->outbound || c->n_resp < MC_TCP_RESP_MAX)
        ev |= EPOLLIN;
    if (c->state == CS_CONNECTING || !mc_list_empty(&c->sendq))
        ev |= EPOLLOUT;
    if (ev != c->events && mc__epoll_mod(e, &c->pollable, ev) == 0)
        c->events = ev;
}

int mc__tcp_conn_ctrl_reserve(mc_engine_t *e, mc_tcp_conn_t *c, uint32_t len)
{
    (void)e;
    if (len > c->ctrl_cap) {
        uint8_t *p = realloc(c->ctrl, len);
        if (!p)
            return -ENOMEM;
        c->ctrl = p;
        c->ctrl_cap = len;
    }
    return 0;
}

int mc__tcp_conn_send_ctrl(mc_engine_t *e, mc_tcp_conn_t *c, const mc_frame_t *f,
                           const void *payload, uint32_t len)
{
    mc_slice_t *s = mc__slice_alloc(e);

    if (!s)
        return -ENOMEM;
    s->kind = TCP_SL_FRAME;
    if (len) {
        s->payload = malloc(len);
        if (!s->payload) {
            mc__slice_free(e, s);
            return -ENOMEM;
        }
        memcpy(s->payload, payload, len);
        s->payload_owned = true;
        s->payload_len = len;
    }
    mc_frame_t fr = *f;
    fr.length = len;
    mc__tcp_frame_encode(&fr, tcp_sl(s)->hdr);
    mc_list_push_back(&c->sendq, &s->link);
    return 0;
}

/* ---- teardown ---- */

static void conn_bury(mc_engine_t *e, mc_tcp_conn_t *c)
{
    if (c->in_later || c->held) { /* freed at the end of this pass: out of acks_later/held */
        mc_list_del(&c->later);
        c->in_later = c->held = false;
    }
    c->state = CS_DEAD;
    mc__epoll_del(e, &c->pollable);
    close(c->pollable.fd);
    mc_list_del(&c->node);
    mc_list_push_back(&tcp_of(e)->graveyard, &c->node);
    mc__reap_mark(e, mc__tcp_slot);
    atomic_fetch_sub(&e->n_links, 1);
}

void mc__tcp_conn_fail(mc_engine_t *e, mc_tcp_conn_t *c, int err, const char *fmt, ...)
{
    char reason[256];
    va_list ap;

    if (c->state == CS_DEAD)
        return;
    va_start(ap, fmt);
    vsnprintf(reason, sizeof(reason), fmt, ap);
    va_end(ap);
    if (c->outbound)
        mc__tcp_out_failed(e, c, err, reason); /* logs, then requeues its slices */
    else
        mc__tcp_in_failed(e, c);
    conn_bury(e, c);
}

void mc__tcp_conn_close(mc_engine_t *e, mc_tcp_conn_t *c)
{
    if (c->state == CS_DEAD)
        return;
    if (c->outbound)
        mc__tcp_out_failed(e, c, 0, NULL);
    else
        mc__tcp_in_failed(e, c);
    conn_bury(e, c);
}

static void flush_resume(mc_engine_t *e, mc_tcp_conn_t *c);

void mc__tcp_answer_later(mc_engine_t *e, mc_tcp_conn_t *c)
{
    if (c->held) { /* answers held from the last pass go with these */
        mc_list_del(&c->later);
        c->held = false;
    }
    if (!c->in_later) {
        c->in_later = true;
        mc_list_push_back(&tcp_of(e)->acks_later, &c->later);
        mc__reap_mark(e, mc__tcp_slot);
    }
}

static bool rx_staged(const mc_tcp_conn_t *c);

/* Whether all c has to send is answers to messages (nothing staged to read either). */
static bool only_answers(mc_tcp_conn_t *c)
{
    mc_list_t *pos;

    if (c->send_off || rx_staged(c))
        return false;
    for (pos = c->sendq.next; pos != &c->sendq; pos = pos->next)
        if (mc_container_of(pos, mc_slice_t, link)->kind != TCP_SL_ANSWER)
            return false;
    return true;
}

/* Send the answers held since the last pass (nothing took them along meanwhile). */
static void send_held(mc_engine_t *e)
{
    mc_list_t *n;

    while ((n = mc_list_pop_front(&tcp_of(e)->acks_held))) {
        mc_tcp_conn_t *c = mc_container_of(n, mc_tcp_conn_t, later);
        c->held = false;
        if (c->state != CS_DEAD)
            mc__tcp_conn_flush(e, c);
    }
}

bool mc__tcp_idle(mc_engine_t *e)
{
    bool any = !mc_list_empty(&tcp_of(e)->acks_held);

    send_held(e);
    return any; /* a send may have failed a connection and given work back: one more pass */
}

/* Answers wait for the end of the pass (a handler's reply goes first, in the same write). When
 * only answers wait, they wait one pass more: a message to the same peer sent meanwhile (the
 * host's next request, as it reacts to what was answered) takes them along, and one write
 * carries both. Before the progress context sleeps they go anyway (mc__tcp_idle). */
void mc__tcp_reap(mc_engine_t *e)
{
    mc_list_t *n;

    mc__tcp_dones_send(e);
    send_held(e);
    while ((n = mc_list_pop_front(&tcp_of(e)->acks_later))) {
        mc_tcp_conn_t *c = mc_container_of(n, mc_tcp_conn_t, later);
        c->in_later = false;
        if (c->state != CS_DEAD && only_answers(c) && !mc_list_empty(&c->sendq)) {
            c->held = true;
            mc_list_push_back(&tcp_of(e)->acks_held, &c->later);
            e->pass_soon = true; /* a host that stops calling in: the serve thread sends them */
            continue;
        }
        if (c->state != CS_DEAD)
            flush_resume(e, c);
        if (c->in_later) { /* more messages read meanwhile: answer them now, no more reading */
            mc_list_del(&c->later);
            c->in_later = false;
            if (c->state != CS_DEAD)
                mc__tcp_conn_flush(e, c);
        }
    }
    while ((n = mc_list_pop_front(&tcp_of(e)->graveyard))) {
        mc_tcp_conn_t *c = mc_container_of(n, mc_tcp_conn_t, node);
        free(c->rx);
        free(c->ctrl);
        free(c);
    }
}

/* ---- sending ---- */

/* Gather up to MC_TCP_IOV_MAX iovecs from the send queue, skipping what was already sent. */
static int gather(mc_tcp_conn_t *c, struct iovec *iov)
{
    mc_list_t *pos;
    uint32_t skip = c->send_off;
    int n = 0;

    for (pos = c->sendq.next; pos != &c->sendq && n + 2 <= MC_TCP_IOV_MAX; pos = pos->next) {
        mc_slice_t *s = mc_container_of(pos, mc_slice_t, link);
        if (skip < MC_FRAME_HDR_LEN) {
            iov[n].iov_base = tcp_sl(s)->hdr + skip;
            iov[n++].iov_len = MC_FRAME_HDR_LEN - skip;
            skip = 0;
        } else {
            skip -= MC_FRAME_HDR_LEN;
        }
        if (s->payload_len > skip) {
            iov[n].iov_base = (uint8_t *)s->payload + skip;
            iov[n++].iov_len = s->payload_len - skip;
        }
        skip = 0;
    }
    return n;
}

/* A frame left completely: requests (data, control, descriptor) now await their response, the
 * rest is done. */
static void sent_one(mc_engine_t *e, mc_tcp_conn_t *c, mc_slice_t *s)
{
    mc_list_del(&s->link);
    if (s->kind == MC_SL_DATA || s->kind == MC_SL_CTRL || s->kind == TCP_SL_DESC ||
        s->kind == TCP_SL_MSG) {
        mc_list_push_back(&c->ackq, &s->link);
        if (s->kind == MC_SL_DATA && s->opcode == MC_WRITE) /* in the kernel: the source is free */
            mc__slice_sent(e, s);
        return;
    }
    if (s->kind == TCP_SL_RESP || s->kind == TCP_SL_ANSWER) {
        c->n_resp--;
        if (tcp_sl(s)->ref) {
            mc__tp_count(e, mc__tcp_slot, MC_CNT_SERVED, s->payload_len);
            mc__mem_put(e, tcp_sl(s)->ref);
        }
    }
    mc__slice_free(e, s);
}

static void advance_sent(mc_engine_t *e, mc_tcp_conn_t *c, size_t n)
{
    while (n && !mc_list_empty(&c->sendq)) {
        mc_slice_t *s = mc_container_of(c->sendq.next, mc_slice_t, link);
        size_t total = MC_FRAME_HDR_LEN + s->payload_len;
        size_t rest = total - c->send_off;
        if (n < rest) {
            c->send_off += (uint32_t)n;
            return;
        }
        n -= rest;
        c->send_off = 0;
        sent_one(e, c, s);
    }
}

void mc__tcp_conn_flush(mc_engine_t *e, mc_tcp_conn_t *c)
{
    struct iovec iov[MC_TCP_IOV_MAX];

    while (c->state != CS_DEAD && c->state != CS_CONNECTING && !mc_list_empty(&c->sendq)) {
        struct msghdr mh = {.msg_iov = iov, .msg_iovlen = (size_t)gather(c, iov)};
        ssize_t n = sendmsg(c->pollable.fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n < 0) {
            if (errno == EAGAIN || errno == EINTR)
                break;
            if (c->outbound && c->state != CS_READY && (errno == ECONNRESET || errno == EPIPE))
                mc__tcp_handshake_cut(c);
            if (c->fail_later) { /* its handler sees the hang-up on the next pass */
                shutdown(c->pollable.fd, SHUT_RDWR);
                break;
            }
            mc__tcp_conn_fail(e, c, -MC_EPEERDEAD, "send: %s", strerror(errno));
            return;
        }
        c->last_io_ns = mc__now_ns();
        advance_sent(e, c, (size_t)n);
    }
    mc__tcp_conn_update_events(e, c);
}

/* ---- receiving ---- */

/* The peer closed c (err 0) or reset it; before the handshake completed (no ERROR frame said
 * why), see mc__tcp_handshake_cut. */
static void conn_lost(mc_engine_t *e, mc_tcp_conn_t *c, int err)
{
    if (c->outbound && c->state != CS_READY)
        mc__tcp_handshake_cut(c);
    if (err)
        mc__tcp_conn_fail(e, c, -MC_EPEERDEAD, "recv: %s", strerror(err));
    else
        mc__tcp_conn_fail(e, c, -MC_EPEERDEAD, "connection closed by peer");
}

/* Refill the staging buffer. RX_SYSCALL if bytes came, 0 would block, <0 the connection
 * failed. */
static int rx_fill(mc_engine_t *e, mc_tcp_conn_t *c)
{
    if (c->rx_start == c->rx_end)
        c->rx_start = c->rx_end = 0;
    else if (c->rx_start > MC_TCP_RX_BUF / 2) {
        memmove(c->rx, c->rx + c->rx_start, c->rx_end - c->rx_start);
        c->rx_end -= c->rx_start;
        c->rx_start = 0;
    }
    /* After a large payload the next one is likely large too: fetch just the next header so
     * that its payload is received in place rather than copied out of the staging buffer. */
    size_t want = MC_TCP_RX_BUF - c->rx_end;
    if (c->expect_large && !c->have_hdr && c->rx_end - c->rx_start < MC_FRAME_HDR_LEN)
        want = MC_FRAME_HDR_LEN - (c->rx_end - c->rx_start);
    ssize_t n = recv(c->pollable.fd, c->rx + c->rx_end, want, 0);
    if (n > 0) {
        c->rx_drained = (size_t)n < want;
        c->rx_end += (uint32_t)n;
        c->last_io_ns = mc__now_ns();
        return RX_SYSCALL;
    }
    if (n < 0 && (errno == EAGAIN || errno == EINTR))
        return 0;
    conn_lost(e, c, n == 0 ? 0 : errno);
    return -1;
}

static void frame_done(mc_engine_t *e, mc_tcp_conn_t *c)
{
    c->have_hdr = false;
    if (c->outbound)
        mc__tcp_out_frame(e, c);
    else
        mc__tcp_in_frame(e, c);
}

/* Whether the payload's left bytes go from the socket straight to their place rather than
 * through the staging buffer: a large part of a transfer's data (no copy then), not a frame
 * the engine reads itself (a message) that several of fit in the staging buffer. Those come
 * several to a read (a 16 KiB message took two reads of its own: UCP's stream_bw over the UCX
 * module between two namespaces, 16 KiB, ran at half UCX tcp's rate) and are read where they
 * lie when staged whole. */
static bool rx_direct(const mc_tcp_conn_t *c, uint64_t left)
{
    return left >= MC_TCP_RX_DIRECT && c->dst_kind != DST_DISCARD &&
           (c->dst_kind != DST_CTRL || c->fr.length > MC_TCP_RX_BUF / 2);
}

static int parse_header(mc_engine_t *e, mc_tcp_conn_t *c)
{
    int rc = mc__tcp_frame_decode(c->rx + c->rx_start, e->cfg.handshake_max, &c->fr);

    c->rx_start += MC_FRAME_HDR_LEN;
    if (rc) {
        mc__tcp_conn_fail(e, c, rc, "%s", mc_last_error());
        return rc;
    }
    c->have_hdr = true;
    c->dst_kind = DST_NONE;
    c->left = c->fr.length;
    c->ctrl_len = c->fr.length;
    rc = c->outbound ? mc__tcp_out_header(e, c) : mc__tcp_in_header(e, c);
    if (rc)
        return rc;
    c->expect_large = rx_direct(c, c->fr.length);
    if (c->dst_kind == DST_CTRL && c->fr.type == MC_FR_MSG &&
        c->rx_end - c->rx_start >= c->fr.length) { /* staged whole: delivered where it lies */
        c->msg = c->rx + c->rx_start;
        c->rx_start += c->fr.length;
        c->left = 0;
        frame_done(e, c);
        return 0;
    }
    if (c->dst_kind == DST_CTRL && mc__tcp_conn_ctrl_reserve(e, c, c->fr.length)) {
        mc__tcp_conn_fail(e, c, -ENOMEM, "out of memory for a %u-byte frame", c->fr.length);
        return -ENOMEM;
    }
    if (c->dst_kind == DST_CTRL)
        c->dst = c->ctrl;
    c->msg = c->ctrl;
    if (c->left == 0)
        frame_done(e, c);
    return 0;
}

/* Move payload bytes from the staging buffer, or straight from the socket when a large part
 * is still to come. Returns 1 (staged bytes used), RX_SYSCALL, 0 would block, <0 failed. */
static int rx_payload(mc_engine_t *e, mc_tcp_conn_t *c)
{
    uint32_t avail = c->rx_end - c->rx_start;
    int rc = 1;

    /* A READ's answer to a task that ended (timed out against a stalled peer, failed) is read
     * and dropped: the host may have reused that memory already. */
    if (c->dst_kind == DST_MEM && c->outbound &&
        atomic_load_explicit(&c->resp->task->state, memory_order_relaxed) >= MC_TASK_COMPLETED)
        c->dst_kind = DST_DISCARD;
    if (avail) {
        uint32_t n = avail < c->left ? avail : (uint32_t)c->left;
        if (c->dst_kind != DST_DISCARD)
            memcpy(c->dst, c->rx + c->rx_start, n);
        c->dst += c->dst_kind != DST_DISCARD ? n : 0;
        c->rx_start += n;
        c->left -= n;
    } else if (rx_direct(c, c->left)) {
        ssize_t n = recv(c->pollable.fd, c->dst, c->left, 0);
        if (n <= 0) {
            if (n < 0 && (errno == EAGAIN || errno == EINTR))
                return 0;
            conn_lost(e, c, n == 0 ? 0 : errno);
            return -1;
        }
        c->last_io_ns = mc__now_ns();
        c->dst += n;
        c->left -= (uint64_t)n;
        rc = RX_SYSCALL;
    } else {
        rc = c->rx_drained ? 0 : rx_fill(e, c);
        if (rc <= 0)
            return rc;
    }
    if (c->left == 0)
        frame_done(e, c);
    return rc;
}

static bool rx_staged(const mc_tcp_conn_t *c)
{
    return c->rx_end - c->rx_start >= (c->have_hdr ? 1u : MC_FRAME_HDR_LEN);
}

/* Parse what is staged and read the socket, at most RX_READS times; what is staged after the
 * last read is parsed all the same (the socket may be empty by then: epoll would not call us
 * for it). Stops early, with frames still staged, only under back-pressure; the send path
 * resumes it (see the handler). Whether anything was read or parsed. */
static bool conn_readable(mc_engine_t *e, mc_tcp_conn_t *c)
{
    unsigned reads = 0;
    bool moved = false;

    c->rx_drained = false;
    while (c->state != CS_DEAD && (reads < RX_READS || rx_staged(c))) {
        int rc;
        if (c->have_hdr)
            rc = rx_payload(e, c);
        else if (!c->outbound && c->n_resp >= MC_TCP_RESP_MAX)
            break; /* back-pressure: let the responses drain first */
        else if (c->rx_end - c->rx_start >= MC_FRAME_HDR_LEN)
            rc = parse_header(e, c) ? -1 : 1;
        else if (c->rx_drained)
            break; /* a short read emptied the socket: no recv just to hear EAGAIN */
        else
            rc = rx_fill(e, c);
        if (rc <= 0)
            break;
        moved = true;
        reads += rc == RX_SYSCALL;
    }
    return moved;
}

void mc__tcp_conn_handler(mc_engine_t *e, mc_pollable_t *p, uint32_t events)
{
    mc_tcp_conn_t *c = (mc_tcp_conn_t *)p;

    if (c->state == CS_DEAD)
        return;
    if (c->state == CS_CONNECTING) {
        if (events & (EPOLLOUT | EPOLLERR | EPOLLHUP))
            mc__tcp_out_connected(e, c);
        return;
    }
    if (events & (EPOLLIN | EPOLLERR | EPOLLHUP) || rx_staged(c))
        conn_readable(e, c);
    if (!c->in_later) /* else at the end of the pass */
        flush_resume(e, c);
}

/* Read without epoll's word (engine.c, progress_locked): a recv that may find nothing. What
 * waits to be sent waits for epoll's EPOLLOUT as before, unless what came (or was parsed)
 * needs answers. Whether anything happened: bytes, frames, or the connection's end. */
static bool conn_poll(mc_engine_t *e, mc_pollable_t *p)
{
    mc_tcp_conn_t *c = (mc_tcp_conn_t *)p;

    if (c->state == CS_DEAD || c->state == CS_CONNECTING)
        return false;
    if (!conn_readable(e, c))
        return c->state == CS_DEAD; /* the peer closed or reset it: its tasks ended */
    if (!c->in_later)
        flush_resume(e, c);
    return true;
}

/* Send what is queued; frames left staged by back-pressure get another go as responses drain
 * (epoll would not report them, since they are no longer in the socket). */
static void flush_resume(mc_engine_t *e, mc_tcp_conn_t *c)
{
    for (int i = 0; c->state != CS_DEAD; i++) { /* ends on a flush */
        unsigned before = c->n_resp;
        mc__tcp_conn_flush(e, c);
        if (i == 15 || !rx_staged(c) || c->n_resp >= MC_TCP_RESP_MAX || c->n_resp == before)
            break;
        conn_readable(e, c);
    }
}
