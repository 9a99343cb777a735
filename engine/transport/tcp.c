/* TCP transport: setup, teardown and timeouts. */
#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tcp_int.h"

void mc__format_ip_port(const struct sockaddr_storage *sa, char *buf, size_t size)
{
    char ip[INET6_ADDRSTRLEN] = "?";

    if (sa->ss_family == AF_INET6) {
        const struct sockaddr_in6 *v6 = (const struct sockaddr_in6 *)sa;
        inet_ntop(AF_INET6, &v6->sin6_addr, ip, sizeof(ip));
        snprintf(buf, size, "[%s]:%u", ip, ntohs(v6->sin6_port));
    } else {
        const struct sockaddr_in *v4 = (const struct sockaddr_in *)sa;
        inet_ntop(AF_INET, &v4->sin_addr, ip, sizeof(ip));
        snprintf(buf, size, "%s:%u", ip, ntohs(v4->sin_port));
    }
}

int mc__tcp_init(mc_engine_t *e)
{
    return mc__tcp_listen(e);
}

void mc__tcp_peer_close(mc_engine_t *e, mc_peer_t *p)
{
    while (!mc_list_empty(&p->conns))
        mc__tcp_conn_close(e, mc_container_of(p->conns.next, mc_tcp_conn_t, link));
}

void mc__tcp_fini(mc_engine_t *e)
{
    for (size_t i = 0; i < e->n_peers; i++) {
        mc_peer_t *p = e->peers[i];
        if (!p)
            continue;
        while (!mc_list_empty(&p->conns))
            mc__tcp_conn_fail(e, mc_container_of(p->conns.next, mc_tcp_conn_t, link), -MC_ECANCELED,
                              "engine destroyed");
        mc__sched_fail_peer(e, p, -MC_ECANCELED, "engine destroyed");
    }
    while (!mc_list_empty(&e->inbound))
        mc__tcp_conn_close(e, mc_container_of(e->inbound.next, mc_tcp_conn_t, link));
    for (unsigned i = 0; i < e->n_listens; i++) {
        mc__epoll_del(e, &e->listens[i]);
        close(e->listens[i].fd);
    }
    e->n_listens = 0;
    mc__tcp_reap(e);
}

static void outbound_timers(mc_engine_t *e, mc_peer_t *p, uint64_t now)
{
    mc_list_t *pos, *tmp;

    mc_list_for_each_safe(pos, tmp, &p->conns)
    {
        mc_tcp_conn_t *c = mc_container_of(pos, mc_tcp_conn_t, link);
        uint64_t idle = now - c->last_io_ns;
        if (c->state != CS_READY && now - c->since_ns > e->cfg.connect_timeout_ms * MC_MS)
            mc__tcp_conn_fail(e, c, -MC_ETIMEOUT, "no handshake with %s within %u ms", p->name,
                              e->cfg.connect_timeout_ms);
        else if (c->state == CS_READY && c->window_used && idle > e->cfg.io_timeout_ms * MC_MS)
            mc__tcp_conn_fail(e, c, -MC_ETIMEOUT,
                              "no progress for %llu ms with %u requests in "
                              "flight",
                              (unsigned long long)(idle / MC_MS), c->window_used);
    }
}

/* An inbound connection stuck mid-frame, or whose responses are not read, is dropped so that
 * the buffer references it holds are released. */
static void inbound_timers(mc_engine_t *e, uint64_t now)
{
    mc_list_t *pos, *tmp;

    mc_list_for_each_safe(pos, tmp, &e->inbound)
    {
        mc_tcp_conn_t *c = mc_container_of(pos, mc_tcp_conn_t, link);
        bool busy = c->have_hdr || !mc_list_empty(&c->sendq) || c->state != CS_READY;
        if (busy && now - c->last_io_ns > e->cfg.io_timeout_ms * MC_MS)
            mc__tcp_conn_fail(e, c, -MC_ETIMEOUT, "inbound connection from %s stalled",
                              c->remote_name[0] ? c->remote_name : "(handshake)");
    }
}

void mc__tcp_timers(mc_engine_t *e, uint64_t now)
{
    /* Peers are destroyed only under e->lock, which we hold, so the pointers stay valid
     * after the table lock is dropped (a failing connection may refresh a descriptor, which
     * takes the table lock for writing). */
    pthread_rwlock_rdlock(&e->peers_lock);
    size_t n = e->n_peers;
    mc_peer_t **snap = malloc(n * sizeof(*snap) + 1);
    if (snap && n)
        memcpy(snap, e->peers, n * sizeof(*snap));
    pthread_rwlock_unlock(&e->peers_lock);
    for (size_t i = 0; snap && i < n; i++) {
        if (snap[i]) {
            outbound_timers(e, snap[i], now);
            mc__rails_tick(snap[i], now);
        }
    }
    free(snap);
    inbound_timers(e, now);
}
