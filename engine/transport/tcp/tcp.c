/* TCP transport: its ops table, setup, teardown, peers and timeouts. */
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "tcp_int.h"

_Static_assert(MC_SLICE_MAX <= MC_PROTO_MAX_DATA, "a slice must fit in a frame");

unsigned mc__tcp_slot;

/* MC_LISTEN: comma-separated ip:port, at most MC_MAX_RAILS. */
static int parse_listen(const char *v, uint64_t *num_p)
{
    struct sockaddr_storage sa;
    socklen_t len;
    char item[MC_NAME_MAX];
    unsigned n = 0;

    for (const char *p = v; *p; n++) {
        size_t l = strcspn(p, ",");
        if (l >= sizeof(item) || n == MC_MAX_RAILS)
            return mc__set_error(-MC_ECONFIG, "at most %d addresses", MC_MAX_RAILS);
        memcpy(item, p, l);
        item[l] = 0;
        if (mc__parse_ip_port(item, &sa, &len))
            return mc__set_error(-MC_ECONFIG, "\"%s\" is not IPv4:port or [IPv6]:port", item);
        p += l + (p[l] == ',');
    }
    *num_p = n;
    return n ? 0 : mc__set_error(-MC_ECONFIG, "no address");
}

static const mc_setting_t tcp_settings[] = {
    {"LISTEN", "127.0.0.1:0", 0, 0, parse_listen,
     "addresses to listen on, one per link (ip:port, [v6]:port; port 0: any)"},
    {"TCP_CONNS", "2", 1, 64, NULL, "tcp connections per rail"},
    {"TCP_WINDOW", "16", 1, 1024, NULL, "slices in flight per tcp connection"},
    {"MAX_CONNS", "256", 1, 65536, NULL, "outbound tcp connections over all peers"},
    {"MAX_INBOUND", "1024", 1, 1 << 20, NULL,
     "inbound tcp connections; beyond it the unauthenticated, then the idle, are closed"},
    {0},
};

static int tcp_init(mc_engine_t *e)
{
    tcp_engine_t *t = calloc(1, sizeof(*t));

    if (!t)
        return mc__set_error(-ENOMEM, "out of memory");
    t->conns_per_rail = (unsigned)mc__config_num(e->conf, "TCP_CONNS");
    t->window = (unsigned)mc__config_num(e->conf, "TCP_WINDOW");
    t->max_conns = (unsigned)mc__config_num(e->conf, "MAX_CONNS");
    t->max_inbound = (unsigned)mc__config_num(e->conf, "MAX_INBOUND");
    mc_list_init(&t->inbound);
    mc_list_init(&t->graveyard);
    mc_list_init(&t->acks_later);
    mc_list_init(&t->acks_held);
    e->tp[mc__tcp_slot] = t;
    return mc__tcp_listen(e);
}

static void close_conns(mc_engine_t *e, mc_list_t *conns, bool fail)
{
    while (!mc_list_empty(conns)) {
        mc_tcp_conn_t *c = mc_container_of(conns->next, mc_tcp_conn_t, node);
        if (fail)
            mc__tcp_conn_fail(e, c, -MC_ECANCELED, "engine destroyed");
        else
            mc__tcp_conn_close(e, c);
    }
}

/* Engine teardown: every connection fails, so that its slices and link-bound state go. */
static void tcp_stop(mc_engine_t *e)
{
    tcp_engine_t *t = tcp_of(e);

    mc__tcp_idle(e); /* answers held for a pass go before the connections close */
    for (size_t i = 0; i < e->n_peers; i++) {
        mc_peer_t *p = mc__peer_at(e, i);
        if (p && tcp_peer(p))
            close_conns(e, &tcp_peer(p)->conns, true);
    }
    close_conns(e, &t->inbound, false);
    for (unsigned i = 0; i < t->n_listens; i++) {
        mc__epoll_del(e, &t->listens[i]);
        close(t->listens[i].fd);
    }
    t->n_listens = 0;
}

static void tcp_fini(mc_engine_t *e)
{
    mc__tcp_reap(e);
    free(tcp_of(e)->dones);
    free(tcp_of(e));
    e->tp[mc__tcp_slot] = NULL;
}

static const char *tcp_address(mc_engine_t *e)
{
    return tcp_of(e)->listen_addrs[0];
}

/* Our endpoints: one "endpoints" entry per listen address (the descriptor's first entry is the
 * one handshakes go to). */
static int tcp_encode(mc_engine_t *e, json_t *root)
{
    tcp_engine_t *t = tcp_of(e);
    json_t *eps = json_object_get(root, "endpoints");

    if (!eps && (json_object_set_new(root, "endpoints", json_array()) ||
                 !(eps = json_object_get(root, "endpoints"))))
        return -ENOMEM;
    for (unsigned i = 0; i < t->n_listens; i++)
        if (json_array_append_new(
                eps, json_pack("{s:s,s:s}", "transport", "tcp", "addr", t->listen_addrs[i])))
            return -ENOMEM;
    return 0;
}

/* Every peer is reachable over tcp through at least one of its endpoints. */
static int tcp_peer_update(mc_engine_t *e, mc_peer_t *p)
{
    tcp_peer_t *tp = tcp_peer(p);

    if (!tp) {
        tp = calloc(1, sizeof(*tp));
        if (!tp)
            return mc__set_error(-ENOMEM, "out of memory");
        mc_list_init(&tp->conns);
        p->tp[mc__tcp_slot] = tp;
    }
    mc__tcp_rails_build(e, p);
    if (!tp->n_rails)
        mc__set_error(-MC_EPROTO, "no usable endpoint in its descriptor");
    return tp->n_rails ? 10 : 0;
}

static void tcp_peer_close(mc_engine_t *e, mc_peer_t *p)
{
    tcp_peer_t *tp = tcp_peer(p);

    close_conns(e, &tp->conns, false);
    free(tp->retired);
    free(tp);
    p->tp[mc__tcp_slot] = NULL;
}

/* tcp moves host memory only: the CPU cannot touch VRAM. */
static const char *tcp_accept(mc_engine_t *e, mc_task_t *t, const mc_desc_buffer_t *rb)
{
    (void)e;
    (void)rb;
    return t->vram ? "host memory only (VRAM is staged by the file transport)" : NULL;
}

/* How long c has moved nothing while we ran progress: a gap in our own progress calls (the
 * application computing) is not the connection's fault. */
static uint64_t io_idle(const mc_engine_t *e, const mc_tcp_conn_t *c, uint64_t now)
{
    uint64_t since = c->last_io_ns > e->resumed_ns ? c->last_io_ns : e->resumed_ns;

    return now > since ? now - since : 0;
}

/* How long c exists (0 for one opened since `now` was read, in this same pass). */
static uint64_t since(const mc_tcp_conn_t *c, uint64_t now)
{
    return now > c->since_ns ? now - c->since_ns : 0;
}

static void outbound_timers(mc_engine_t *e, mc_peer_t *p, uint64_t now)
{
    mc_list_t *pos, *tmp;

    mc_list_for_each_safe(pos, tmp, &tcp_peer(p)->conns)
    {
        mc_tcp_conn_t *c = mc_container_of(pos, mc_tcp_conn_t, node);
        uint64_t idle = io_idle(e, c, now);
        if (c->state != CS_READY && since(c, now) > e->cfg.connect_timeout_ms * MC_MS)
            mc__tcp_conn_fail(e, c, -MC_ETIMEOUT, "no handshake with %s within %u ms", p->name,
                              e->cfg.connect_timeout_ms);
        else if (c->state == CS_READY && (c->window_used || c->msgs_out || c->ctrl_out) &&
                 idle > e->cfg.io_timeout_ms * MC_MS)
            mc__tcp_conn_fail(e, c, -MC_ETIMEOUT,
                              "no progress for %llu ms with %u requests in flight",
                              (unsigned long long)(idle / MC_MS), c->window_used);
    }
}

static bool unregistered_long_ago(const mc_engine_t *e, mc_buffer_t *b, uint64_t now)
{
    uint64_t dead = b ? atomic_load(&b->dead_ns) : 0;

    return dead && now - dead > (uint64_t)e->cfg.transfer_timeout_ms * MC_MS;
}

/* Whether c still holds a buffer unregistered a transfer timeout ago, the longest that
 * mc_mem_unregister waits for it: a WRITE it is still sending (a byte now and then keeps its
 * I/O from stalling), or a READ's response it does not read. */
static bool holds_unregistered(const mc_engine_t *e, mc_tcp_conn_t *c, uint64_t now)
{
    mc_list_t *pos;

    if (unregistered_long_ago(e, c->rx_ref, now))
        return true;
    for (pos = c->sendq.next; pos != &c->sendq; pos = pos->next) {
        mc_slice_t *s = mc_container_of(pos, mc_slice_t, link);
        if (s->kind == TCP_SL_RESP && unregistered_long_ago(e, tcp_sl(s)->ref, now))
            return true;
    }
    return false;
}

/* An inbound connection that does not complete its handshake within the connect timeout, or
 * stalls in the middle of a frame it is sending us, is dropped (with the buffer references it
 * holds). Responses it leaves unread are not a fault: its application may be computing between
 * progress calls; the kernel gives up on it if its host stops answering (mc__tcp_sockopts).
 * But one that keeps an unregistered buffer from draining is dropped, whatever it does.
 * Messages of ours it leaves unanswered for MC_IO_TIMEOUT_MS are, as on an outbound one. */
static void inbound_timers(mc_engine_t *e, uint64_t now)
{
    bool dying = atomic_load_explicit(&e->mem.dying, memory_order_relaxed) != 0;
    mc_list_t *pos, *tmp;

    mc_list_for_each_safe(pos, tmp, &tcp_of(e)->inbound)
    {
        mc_tcp_conn_t *c = mc_container_of(pos, mc_tcp_conn_t, node);
        if (dying && holds_unregistered(e, c, now))
            mc__tcp_conn_fail(e, c, -MC_ETIMEOUT,
                              "%s holds a buffer unregistered %u ms ago: connection dropped",
                              c->remote_name, e->cfg.transfer_timeout_ms);
        else if (c->state != CS_READY && since(c, now) > e->cfg.connect_timeout_ms * MC_MS)
            mc__tcp_conn_fail(e, c, -MC_ETIMEOUT, "no handshake within %u ms",
                              e->cfg.connect_timeout_ms);
        else if (c->have_hdr && io_idle(e, c, now) > e->cfg.io_timeout_ms * MC_MS)
            mc__tcp_conn_fail(e, c, -MC_ETIMEOUT, "inbound connection from %s stalled mid-frame",
                              c->remote_name);
        else if (c->msgs_out && io_idle(e, c, now) > e->cfg.io_timeout_ms * MC_MS)
            mc__tcp_conn_fail(e, c, -MC_ETIMEOUT, /* ours on it: sent again on another one */
                              "no answer from %s to %u messages for %llu ms", c->remote_name,
                              c->msgs_out, (unsigned long long)(io_idle(e, c, now) / MC_MS));
    }
}

static void tcp_timers(mc_engine_t *e, uint64_t now)
{
    /* The table is read without its lock here (peer.c): peers go only under e->lock, ours. */
    for (size_t i = 0; i < e->n_peers; i++) {
        mc_peer_t *p = mc__peer_at(e, i);
        if (p && tcp_peer(p)) /* one known by name only has none yet */
            outbound_timers(e, p, now);
    }
    inbound_timers(e, now);
    mc__tcp_accept_resume(e, now);
}

/* ---- compact addresses: u8 4|6, u16 port, the 4 or 16 address bytes ---- */

static int tcp_address_pack(mc_engine_t *e, uint8_t *out, size_t cap)
{
    struct sockaddr_storage sa;
    socklen_t len;

    if (mc__parse_ip_port(tcp_address(e), &sa, &len))
        return mc__set_error(-EINVAL, "our address %s is not ip:port", tcp_address(e));
    if (sa.ss_family == AF_INET) {
        const struct sockaddr_in *v4 = (const void *)&sa;
        if (cap < 7)
            return mc__set_error(-ENOSPC, "no room for an address");
        out[0] = 4;
        memcpy(out + 1, &v4->sin_port, 2);
        memcpy(out + 3, &v4->sin_addr, 4);
        return 7;
    }
    const struct sockaddr_in6 *v6 = (const void *)&sa;
    if (cap < 19)
        return mc__set_error(-ENOSPC, "no room for an address");
    out[0] = 6;
    memcpy(out + 1, &v6->sin6_port, 2);
    memcpy(out + 3, &v6->sin6_addr, 16);
    return 19;
}

/* d names the peer by its endpoint, its only rail until its descriptor comes. */
static int desc_of_endpoint(const struct sockaddr_storage *sa, mc_desc_t *d)
{
    tcp_desc_t *td = calloc(1, sizeof(*td));

    if (!td)
        return mc__set_error(-ENOMEM, "out of memory");
    mc__format_ip_port(sa, td->addrs[0], sizeof(td->addrs[0]));
    td->n = 1;
    snprintf(d->name, sizeof(d->name), "%s", td->addrs[0]);
    d->tp[mc__tcp_slot] = td;
    return 0;
}

/* tcp_address_pack's form back into a socket address. */
static int unpack_sa(const uint8_t *in, size_t len, struct sockaddr_storage *sa, socklen_t *sa_len)
{
    memset(sa, 0, sizeof(*sa));
    if (len == 7 && in[0] == 4) {
        struct sockaddr_in *v4 = (void *)sa;
        v4->sin_family = AF_INET;
        memcpy(&v4->sin_port, in + 1, 2);
        memcpy(&v4->sin_addr, in + 3, 4);
        *sa_len = sizeof(*v4);
    } else if (len == 19 && in[0] == 6) {
        struct sockaddr_in6 *v6 = (void *)sa;
        v6->sin6_family = AF_INET6;
        memcpy(&v6->sin6_port, in + 1, 2);
        memcpy(&v6->sin6_addr, in + 3, 16);
        *sa_len = sizeof(*v6);
    } else {
        return mc__set_error(-EINVAL, "not a tcp address (%zu bytes)", len);
    }
    return 0;
}

static int tcp_address_unpack(mc_engine_t *e, const uint8_t *in, size_t len, mc_desc_t *d)
{
    struct sockaddr_storage sa;
    socklen_t sa_len;

    (void)e;
    return unpack_sa(in, len, &sa, &sa_len) ? -EINVAL : desc_of_endpoint(&sa, d);
}

/* Another host's endpoint: not loopback or unspecified, and the routing table has a way there
 * (connecting a UDP socket looks the route up and sends nothing). */
static int tcp_address_reachable(mc_engine_t *e, const uint8_t *in, size_t len)
{
    struct sockaddr_storage sa;
    socklen_t sa_len;

    (void)e;
    if (unpack_sa(in, len, &sa, &sa_len))
        return -EINVAL;
    if (sa.ss_family == AF_INET) {
        uint32_t ip = ntohl(((const struct sockaddr_in *)(const void *)&sa)->sin_addr.s_addr);
        if ((ip >> 24) == 127 || ip == 0)
            return 0;
    } else {
        const struct in6_addr *ip = &((const struct sockaddr_in6 *)(const void *)&sa)->sin6_addr;
        if (IN6_IS_ADDR_LOOPBACK(ip) || IN6_IS_ADDR_UNSPECIFIED(ip))
            return 0;
    }
    int fd = socket(sa.ss_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return 0;
    int ok = connect(fd, (const struct sockaddr *)&sa, sa_len) == 0;
    close(fd);
    return ok;
}

static int tcp_address_text(mc_engine_t *e, const char *text, mc_desc_t *d)
{
    struct sockaddr_storage sa;
    socklen_t len;

    (void)e;
    if (mc__parse_ip_port(text, &sa, &len))
        return mc__set_error(-EINVAL, "\"%s\" is not ip:port", text);
    return desc_of_endpoint(&sa, d);
}

const mc_transport_ops_t mc__tcp_ops = {
    .size = sizeof(mc_transport_ops_t),
    .name = "tcp",
    .slot = &mc__tcp_slot,
    .flags = MC_TP_CONTROL | MC_TP_ORDERED,
    .codec = &mc__tcp_codec,
    .settings = tcp_settings,
    .init = tcp_init,
    .stop = tcp_stop,
    .fini = tcp_fini,
    .encode = tcp_encode,
    .peer_update = tcp_peer_update,
    .peer_close = tcp_peer_close,
    .accept = tcp_accept,
    .fill = mc__tcp_fill,
    .timers = tcp_timers,
    .reap = mc__tcp_reap,
    .idle = mc__tcp_idle,
    .address = tcp_address,
    .ctrl_ready = mc__tcp_ctrl_ready,
    .ctrl_send = mc__tcp_ctrl_send,
    .fetch_desc = mc__tcp_fetch_desc,
    .desc_request = mc__tcp_desc_request,
    .address_pack = tcp_address_pack,
    .address_unpack = tcp_address_unpack,
    .address_text = tcp_address_text,
    .address_reachable = tcp_address_reachable,
    .ctrl_answer = mc__tcp_ctrl_answer,
    .reap_marked = true,
    .msg_handled = mc__tcp_msg_handled,
};
