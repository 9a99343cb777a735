/* TCP, target role: inbound connections whose requests we serve against our registrations.
 * Every request is checked against the registration table before a byte moves; a refused
 * WRITE's payload is read and dropped so the stream stays in step. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "tcp_int.h"

/* Queue a response: data from registered memory (zero-copy, ref held) or a status/reason. */
static void respond(mc_engine_t *e, mc_tcp_conn_t *c, uint8_t type, int status, void *data,
                    uint32_t len, mc_buffer_t *ref, const char *reason)
{
    mc_slice_t *s = mc__slice_alloc(e);
    mc_frame_t f = {.type = type, .id = c->fr.id, .aux = (uint64_t)(int64_t)status};

    if (!s) {
        if (ref)
            mc__mem_put(e, ref);
        mc__tcp_conn_fail(e, c, -ENOMEM, "out of memory for a response");
        return;
    }
    s->kind = TCP_SL_RESP;
    if (status) {
        size_t rl = strlen(reason);
        s->payload = strdup(reason);
        s->payload_owned = s->payload != NULL;
        s->payload_len = s->payload ? (uint32_t)rl : 0;
    } else {
        s->payload = data;
        s->payload_len = len;
        tcp_sl(s)->ref = ref;
    }
    f.length = s->payload_len;
    mc__tcp_frame_encode(&f, tcp_sl(s)->hdr);
    mc_list_push_back(&c->sendq, &s->link);
    c->n_resp++;
}

static void refuse_reason(mc_engine_t *e, const mc_frame_t *f, uint64_t len, char *buf, size_t size)
{
    snprintf(buf, size,
             "range 0x%llx+%llu is not inside a registered host buffer of %s (its VRAM is "
             "reached over rdma, or staged by the file transport)",
             (unsigned long long)f->addr, (unsigned long long)len, e->name);
}

/* The registered host buffer holding the range, referenced; never VRAM, which the CPU cannot
 * touch. */
static mc_buffer_t *host_buf_get(mc_engine_t *e, uint64_t addr, uint64_t len)
{
    mc_buffer_t *b = mc__mem_get(e, addr, len);

    if (b && b->vram) {
        mc__mem_put(e, b);
        return NULL;
    }
    return b;
}

/* Fatal problem: tell the initiator why (best effort), then drop the connection. The ERROR
 * frame is written only between two frames: on a connection whose response is half sent it
 * would land inside that response's payload (the initiator would take it for data), so there
 * the close alone says it. */
static void reject(mc_engine_t *e, mc_tcp_conn_t *c, int code, const char *reason)
{
    uint8_t hdr[MC_FRAME_HDR_LEN];
    size_t rl = strlen(reason);
    mc_frame_t f = {.type = MC_FR_ERROR, .length = (uint32_t)rl, .aux = (uint64_t)(int64_t)code};
    struct iovec iov[2] = {{hdr, sizeof(hdr)}, {(void *)reason, rl}};
    struct msghdr mh = {.msg_iov = iov, .msg_iovlen = 2};

    mc__tcp_frame_encode(&f, hdr);
    if (c->send_off)
        mc_debug("error frame not sent: a response is half sent");
    else if (sendmsg(c->pollable.fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT) < 0)
        mc_debug("error frame not sent: %s", strerror(errno));
    mc__tcp_conn_fail(e, c, code, "%s", reason);
}

int mc__tcp_in_header(mc_engine_t *e, mc_tcp_conn_t *c)
{
    uint8_t t = c->fr.type;

    if ((t == MC_FR_HELLO && c->state == CS_HELLO) || (t == MC_FR_AUTH && c->state == CS_AUTH)) {
        c->dst_kind = DST_CTRL;
        return 0;
    }
    if (c->state != CS_READY) {
        mc__tcp_conn_fail(e, c, -MC_EPROTO, "%s frame before the handshake completed",
                          mc__tcp_frame_type_name(t));
        return -MC_EPROTO;
    }
    switch (t) {
    case MC_FR_WRITE:
        c->rx_ref = host_buf_get(e, c->fr.addr, c->fr.length);
        c->rx_read_only = c->rx_ref && c->rx_ref->read_only;
        if (c->rx_read_only) {
            mc__mem_put(e, c->rx_ref);
            c->rx_ref = NULL;
        }
        c->rx_status = c->rx_ref ? 0 : -MC_EACCESS;
        c->dst_kind = c->rx_ref ? DST_MEM : DST_DISCARD;
        c->dst = (uint8_t *)(uintptr_t)c->fr.addr;
        return 0;
    case MC_FR_READ:
    case MC_FR_DESC_REQ:
        return 0;
    case MC_FR_MSG:
    case MC_FR_MSG_DONE:
    case MC_FR_RETIRE:
    case MC_FR_CTRL_REQ:
        c->dst_kind = DST_CTRL;
        return 0;
    case MC_FR_MSG_ACK: /* to a message of ours (tcp_msg.c) */
        return mc__tcp_msg_ack_expect(e, c);
    }
    mc__tcp_conn_fail(e, c, -MC_EPROTO, "unexpected %s frame from initiator",
                      mc__tcp_frame_type_name(t));
    return -MC_EPROTO;
}

/* Drop the inbound connections the initiator gave up on, with whatever they still hold. */
static void retire(mc_engine_t *e, mc_tcp_conn_t *by, const uint32_t *ids, unsigned n)
{
    mc_list_t *pos, *tmp;

    mc_list_for_each_safe(pos, tmp, &tcp_of(e)->inbound)
    {
        mc_tcp_conn_t *c = mc_container_of(pos, mc_tcp_conn_t, node);
        if (c == by || c->link.instance != by->link.instance)
            continue;
        for (unsigned i = 0; i < n; i++) {
            if (c->id == ids[i]) {
                mc_info("dropping retired connection %u from %s", c->id, by->remote_name);
                mc__tcp_conn_close(e, c);
                break;
            }
        }
    }
}

/* The handshake is done. Only now does the HELLO's list of connections to retire take effect:
 * the instance it names is not proven before, and a client without the token must not drop
 * another initiator's connections. */
static void ready(mc_engine_t *e, mc_tcp_conn_t *c)
{
    c->state = CS_READY;
    tcp_of(e)->inbound_gen++; /* one more a peer's messages may ride (tcp_msg.c) */
    retire(e, c, c->hello_retired, c->n_hello_retired);
}

static void on_hello(mc_engine_t *e, mc_tcp_conn_t *c)
{
    uint8_t buf[MC_PROTO_MAX_CTRL];
    mc_hello_t h, r = {.instance = e->instance};
    bool auth = e->cfg.auth_token[0] != 0;
    mc_frame_t f = {.type = MC_FR_HELLO_REPLY, .flags = auth ? MC_HELLO_AUTH_REQUIRED : 0};

    if (mc__tcp_hello_decode(c->ctrl, c->ctrl_len, &h)) {
        reject(e, c, -MC_EPROTO, mc_last_error());
        return;
    }
    if (h.peer_name[0] && strcmp(h.peer_name, e->name)) {
        snprintf((char *)buf, sizeof(buf), "this is segment %s, not %s", e->name, h.peer_name);
        {
            reject(e, c, -MC_ENOSEGMENT, (char *)buf);
            return;
        }
    }
    c->id = c->fr.id;
    c->link.instance = h.instance;
    memcpy(c->peer_nonce, h.nonce, sizeof(c->peer_nonce));
    snprintf(c->remote_name, sizeof(c->remote_name), "%s", h.name);
    for (unsigned i = 0; i < h.n_retired; i++)
        c->hello_retired[i] = (uint32_t)h.retired[i];
    c->n_hello_retired = (uint8_t)h.n_retired;
    mc__random_bytes(c->nonce, sizeof(c->nonce));
    memcpy(r.nonce, c->nonce, sizeof(r.nonce));
    snprintf(r.name, sizeof(r.name), "%s", e->name);
    if (auth && mc__tcp_proof(e->cfg.auth_token, "target", h.nonce, c->nonce, e->name, r.proof)) {
        reject(e, c, -MC_EAUTH, mc_last_error());
        return;
    }
    size_t len = mc__tcp_hello_encode(&r, buf);
    if (mc__tcp_conn_send_ctrl(e, c, &f, buf, (uint32_t)len)) {
        mc__tcp_conn_fail(e, c, -ENOMEM, "out of memory");
        return;
    }
    if (auth)
        c->state = CS_AUTH;
    else
        ready(e, c);
}

static void on_auth(mc_engine_t *e, mc_tcp_conn_t *c)
{
    uint8_t proof[32];
    mc_frame_t f = {.type = MC_FR_READY};

    if (mc__tcp_proof(e->cfg.auth_token, "initiator", c->nonce, c->peer_nonce, c->remote_name,
                      proof) ||
        c->ctrl_len != sizeof(proof) || !mc__ct_equal(proof, c->ctrl, sizeof(proof))) {
        reject(e, c, -MC_EAUTH, "authentication failed: wrong MC_AUTH_TOKEN");
        return;
    }
    if (mc__tcp_conn_send_ctrl(e, c, &f, NULL, 0)) {
        mc__tcp_conn_fail(e, c, -ENOMEM, "out of memory");
        return;
    }
    ready(e, c);
}

static void on_read(mc_engine_t *e, mc_tcp_conn_t *c)
{
    mc_buffer_t *b = host_buf_get(e, c->fr.addr, c->fr.aux);
    char reason[300];

    if (b) {
        respond(e, c, MC_FR_READ_RESP, 0, (void *)(uintptr_t)c->fr.addr, (uint32_t)c->fr.aux, b,
                NULL);
        return;
    }
    refuse_reason(e, &c->fr, c->fr.aux, reason, sizeof(reason));
    respond(e, c, MC_FR_READ_RESP, -MC_EACCESS, NULL, 0, NULL, reason);
}

static void on_write(mc_engine_t *e, mc_tcp_conn_t *c)
{
    char reason[300];

    if (c->rx_ref) {
        mc__tp_count(e, mc__tcp_slot, MC_CNT_SERVED, c->fr.length);
        mc__mem_put(e, c->rx_ref);
        c->rx_ref = NULL;
        respond(e, c, MC_FR_WRITE_ACK, 0, NULL, 0, NULL, NULL);
        return;
    }
    if (c->rx_read_only)
        snprintf(reason, sizeof(reason),
                 "range 0x%llx+%llu of %s is mapped without write permission: it may only be read",
                 (unsigned long long)c->fr.addr, (unsigned long long)c->fr.length, e->name);
    else
        refuse_reason(e, &c->fr, c->fr.length, reason, sizeof(reason));
    respond(e, c, MC_FR_WRITE_ACK, c->rx_status, NULL, 0, NULL, reason);
}

static void on_desc_req(mc_engine_t *e, mc_tcp_conn_t *c)
{
    char *json;
    size_t len;
    mc_frame_t f = {.type = MC_FR_DESC_REPLY, .id = c->fr.id};

    if (mc__desc_encode_local(e, &json, &len) || len > e->cfg.handshake_max) {
        reject(e, c, -EIO, "cannot encode the segment descriptor");
        return;
    }
    if (mc__tcp_conn_send_ctrl(e, c, &f, json, (uint32_t)len))
        mc__tcp_conn_fail(e, c, -ENOMEM, "out of memory");
    free(json);
}

static void on_retire(mc_engine_t *e, mc_tcp_conn_t *c)
{
    uint32_t ids[MC_PROTO_MAX_RETIRE];
    unsigned n = c->ctrl_len / 4;

    for (unsigned i = 0; i < n; i++) {
        const uint8_t *p = c->ctrl + 4 * i;
        ids[i] = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
    }
    retire(e, c, ids, n);
}

/* Send the answer to control request id: its status, and the answer or the reason. */
static void ctrl_resp(mc_engine_t *e, mc_tcp_conn_t *c, uint32_t id, int rc, const void *payload,
                      size_t len)
{
    mc_frame_t f = {.type = MC_FR_CTRL_RESP, .id = id, .aux = (uint64_t)(int64_t)rc};

    if (mc__tcp_conn_send_ctrl(e, c, &f, payload,
                               (uint32_t)(len < MC_CTRL_MAX ? len : MC_CTRL_MAX)))
        mc__tcp_conn_fail(e, c, -ENOMEM, "out of memory");
}

int mc__tcp_ctrl_answer(mc_engine_t *e, mc_link_t *l, uint32_t id, int status, const void *ans,
                        size_t len)
{
    mc_tcp_conn_t *c = mc_container_of(l, mc_tcp_conn_t, link);

    if (c->outbound || c->state != CS_READY)
        return mc__set_error(-ENOTCONN, "the connection the request came on is closing");
    ctrl_resp(e, c, id, status, ans, len);
    mc__tcp_answer_later(e, c); /* sent at the end of the pass: never inside the caller's work */
    return 0;
}

/* Another transport's request for its counterpart here: answered at once, or later by that
 * transport (MC_CTRL_LATER: a disk read), out of order then. */
static void on_ctrl_req(mc_engine_t *e, mc_tcp_conn_t *c)
{
    uint8_t ans[MC_CTRL_MAX];
    size_t len = 0;
    int rc;
    const void *payload = ans;

    c->link.req_id = c->fr.id;
    rc = mc__ctrl_deliver(e, &c->link, c->fr.flags, c->ctrl, c->ctrl_len, ans, &len);
    if (rc == MC_CTRL_LATER)
        return;
    if (rc) {
        payload = mc_last_error();
        len = strlen(payload);
        mc_warn("%s: control request from %s refused: %s",
                c->fr.flags < mc__n_transports ? mc__transports[c->fr.flags]->name : "?",
                c->remote_name, (const char *)payload);
    }
    ctrl_resp(e, c, c->fr.id, rc, payload, len);
}

/* The answer to a message of ours sent on this connection (tcp_msg.c). */
static void on_msg_ack(mc_engine_t *e, mc_tcp_conn_t *c)
{
    mc__tcp_msg_acked(e, c, c->resp);
}

/* mc__tcp_in_header admits only these frame types. */
static void (*const in_handlers[MC_FR_TYPE_MAX])(mc_engine_t *, mc_tcp_conn_t *) = {
    [MC_FR_HELLO] = on_hello,       [MC_FR_AUTH] = on_auth,
    [MC_FR_WRITE] = on_write,       [MC_FR_READ] = on_read,
    [MC_FR_DESC_REQ] = on_desc_req, [MC_FR_RETIRE] = on_retire,
    [MC_FR_MSG] = mc__tcp_msg_in,   [MC_FR_CTRL_REQ] = on_ctrl_req,
    [MC_FR_MSG_ACK] = on_msg_ack,   [MC_FR_MSG_DONE] = mc__tcp_msg_done_in,
};

void mc__tcp_in_frame(mc_engine_t *e, mc_tcp_conn_t *c)
{
    in_handlers[c->fr.type](e, c);
}

void mc__tcp_in_failed(mc_engine_t *e, mc_tcp_conn_t *c)
{
    mc_list_t *n;

    if (c->rx_ref) {
        mc__mem_put(e, c->rx_ref);
        c->rx_ref = NULL;
    }
    mc_list_splice_back(&c->sendq, &c->ackq);
    mc__tcp_msgs_lost(e, c, &c->sendq); /* ours, sent on it: again on another connection */
    while ((n = mc_list_pop_front(&c->sendq))) {
        mc_slice_t *s = mc_container_of(n, mc_slice_t, link);
        if (s->kind == TCP_SL_RESP && tcp_sl(s)->ref)
            mc__mem_put(e, tcp_sl(s)->ref);
        mc__slice_free(e, s);
    }
    c->n_resp = 0;
    tcp_of(e)->n_inbound--;
    mc__link_lost(e, &c->link);
}

/* ---- listening ---- */

/* Make room for one inbound connection: close the oldest that never completed its handshake,
 * else the one idle longest (nothing being received or sent, no state bound to it). False if
 * every one is busy. */
static bool inbound_evict(mc_engine_t *e)
{
    mc_tcp_conn_t *idle = NULL;
    mc_list_t *pos;

    for (pos = tcp_of(e)->inbound.next; pos != &tcp_of(e)->inbound; pos = pos->next) {
        mc_tcp_conn_t *c = mc_container_of(pos, mc_tcp_conn_t, node);
        if (c->state != CS_READY) { /* oldest first: the list is in accept order */
            reject(e, c, -EAGAIN, "too many inbound connections: closed before its handshake");
            return true;
        }
        if (!c->have_hdr && mc_list_empty(&c->sendq) && !c->msgs_out && !mc__link_busy(&c->link) &&
            (!idle || c->last_io_ns < idle->last_io_ns))
            idle = c;
    }
    if (idle) /* told why, so that it does not take it for a death and reconnect at once */
        reject(e, idle, -EAGAIN, "too many inbound connections: the idle one is closed");
    return idle != NULL;
}

/* Out of descriptors (or memory): stop accepting for a moment instead of spinning on a
 * listening socket that stays readable, and say so at most every 10 s. */
static void accept_pause(mc_engine_t *e, int err)
{
    tcp_engine_t *t = tcp_of(e);
    uint64_t now = mc__now_ns();

    for (unsigned i = 0; i < t->n_listens; i++)
        mc__epoll_mod(e, &t->listens[i], 0);
    t->accept_resume_ns = now + MC_TCP_ACCEPT_PAUSE_MS * MC_MS;
    atomic_fetch_add(&e->n_links, 1); /* timer ticks run until it resumes */
    t->accept_errors++;
    if (now >= t->accept_said_ns) {
        mc_warn("accept: %s; not accepting for %d ms at a time (%u times since last said)",
                strerror(err), MC_TCP_ACCEPT_PAUSE_MS, t->accept_errors);
        t->accept_errors = 0;
        t->accept_said_ns = now + 10000 * MC_MS;
    }
    inbound_evict(e); /* a descriptor for whoever comes next */
}

void mc__tcp_accept_resume(mc_engine_t *e, uint64_t now)
{
    tcp_engine_t *t = tcp_of(e);

    if (!t->accept_resume_ns || now < t->accept_resume_ns)
        return;
    t->accept_resume_ns = 0;
    atomic_fetch_sub(&e->n_links, 1);
    for (unsigned i = 0; i < t->n_listens; i++)
        mc__epoll_mod(e, &t->listens[i], EPOLLIN);
}

static void on_accept(mc_engine_t *e, mc_pollable_t *p, uint32_t events)
{
    tcp_engine_t *t = tcp_of(e);

    (void)events;
    for (int i = 0; i < 64 && !t->accept_resume_ns; i++) {
        int fd = accept4(p->fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM)
                accept_pause(e, errno);
            else if (errno != EAGAIN && errno != EINTR && errno != ECONNABORTED)
                mc_warn("accept: %s", strerror(errno));
            return;
        }
        if (t->n_inbound >= t->max_inbound && !inbound_evict(e)) {
            close(fd); /* every connection is busy: the initiator retries */
            continue;
        }
        mc_tcp_conn_t *c = mc__tcp_conn_new(e, fd, false);
        if (!c) {
            close(fd);
            continue;
        }
        mc__tcp_sockopts(e, fd);
        c->events = EPOLLIN;
        mc_list_push_back(&t->inbound, &c->node);
        t->n_inbound++;
        if (mc__epoll_add(e, &c->pollable, c->events))
            mc__tcp_conn_close(e, c);
    }
}

static int listen_one(mc_engine_t *e, const char *addr)
{
    tcp_engine_t *t = tcp_of(e);
    mc_pollable_t *l = &t->listens[t->n_listens];
    struct sockaddr_storage sa;
    socklen_t len;
    int one = 1, fd;

    if (mc__parse_ip_port(addr, &sa, &len))
        return mc__set_error(-MC_ECONFIG, "MC_LISTEN: \"%s\" is not ip:port", addr);
    fd = socket(sa.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return mc__set_error(-errno, "socket: %s", strerror(errno));
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, (struct sockaddr *)&sa, len) < 0 || listen(fd, 1024) < 0 ||
        getsockname(fd, (struct sockaddr *)&sa, &len) < 0) {
        int err = errno;
        close(fd);
        return mc__set_error(-err, "cannot listen on %s: %s", addr, strerror(err));
    }
    l->fd = fd;
    l->handler = on_accept;
    mc__format_ip_port(&sa, t->listen_addrs[t->n_listens], MC_NAME_MAX);
    if (mc__epoll_add(e, l, EPOLLIN)) {
        close(fd);
        l->fd = -1;
        return -EIO;
    }
    t->n_listens++;
    return 0;
}

/* One listening socket per MC_LISTEN address: each is an endpoint peers can reach us by, and
 * so one end of a rail. */
int mc__tcp_listen(mc_engine_t *e)
{
    char addr[MC_NAME_MAX];
    const char *p = mc__config_str(e->conf, "LISTEN");

    while (*p && tcp_of(e)->n_listens < MC_MAX_RAILS) {
        size_t l = strcspn(p, ",");
        if (l >= sizeof(addr))
            return mc__set_error(-MC_ECONFIG, "MC_LISTEN: address too long");
        memcpy(addr, p, l);
        addr[l] = 0;
        int rc = listen_one(e, addr);
        if (rc)
            return rc;
        p += l + (p[l] == ',');
    }
    return tcp_of(e)->n_listens ? 0 : mc__set_error(-MC_ECONFIG, "MC_LISTEN is empty");
}
