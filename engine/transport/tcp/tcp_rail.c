/* tcp rails: one per endpoint of the peer, each paired with our listen address on the same
 * IPv4 /24 (its connections bind to it, so traffic leaves through that link), or with the
 * default route when we listen on none there. */
#include <arpa/inet.h>
#include <ifaddrs.h>
#include <stdio.h>
#include <string.h>

#include "tcp_int.h"

static bool same_subnet24(const struct sockaddr_storage *a, const struct sockaddr_storage *b)
{
    const struct sockaddr_in *x = (const void *)a, *y = (const void *)b;

    return a->ss_family == AF_INET && b->ss_family == AF_INET &&
           (ntohl(x->sin_addr.s_addr) >> 8) == (ntohl(y->sin_addr.s_addr) >> 8);
}

/* The listening address of ours on the remote endpoint's link, if any. */
static bool local_for(mc_engine_t *e, const struct sockaddr_storage *remote,
                      struct sockaddr_storage *local, socklen_t *len_p)
{
    tcp_engine_t *t = tcp_of(e);

    for (unsigned i = 0; i < t->n_listens; i++) {
        if (mc__parse_ip_port(t->listen_addrs[i], local, len_p) == 0 &&
            same_subnet24(local, remote)) {
            ((struct sockaddr_in *)local)->sin_port = 0;
            return true;
        }
    }
    return false;
}

/* The interface that holds a local IPv4 address: its rank in the NIC priority matrix. */
static void iface_of(const struct sockaddr_storage *sa, char *dev, size_t size)
{
    struct ifaddrs *ifs, *i;
    const struct sockaddr_in *want = (const void *)sa;

    dev[0] = 0;
    if (sa->ss_family != AF_INET || getifaddrs(&ifs))
        return;
    for (i = ifs; i; i = i->ifa_next) {
        const struct sockaddr_in *a = (const void *)i->ifa_addr;
        if (a && a->sin_family == AF_INET && a->sin_addr.s_addr == want->sin_addr.s_addr) {
            snprintf(dev, size, "%s", i->ifa_name);
            break;
        }
    }
    freeifaddrs(ifs);
}

void mc__tcp_rails_build(mc_engine_t *e, mc_peer_t *p)
{
    const tcp_desc_t *d = p->desc.tp[mc__tcp_slot];
    tcp_peer_t *tp = tcp_peer(p);
    unsigned n = 0;

    for (unsigned i = 0; d && i < d->n && n < MC_MAX_RAILS; i++) {
        tcp_rail_t *r = &tp->rails[n];
        char local[MC_NAME_MAX] = "*";
        if (mc__parse_ip_port(d->addrs[i], &r->remote, &r->remote_len))
            continue;
        if (local_for(e, &r->remote, &r->local, &r->local_len))
            inet_ntop(AF_INET, &((struct sockaddr_in *)&r->local)->sin_addr, local, sizeof(local));
        else
            r->local_len = 0;
        if (r->local_len)
            iface_of(&r->local, r->base.dev, sizeof(r->base.dev));
        r->base.rank_loc[0] = 0;
        snprintf(r->base.name, sizeof(r->base.name), "%s->%s", local, d->addrs[i]);
        n++;
    }
    /* Existing rails keep their state and counters; a shrinking list keeps the old tail
     * (connections may still point at it) but it gets no new connections. */
    if (n > tp->n_rails)
        tp->n_rails = n;
    p->rails[mc__tcp_slot].n = tp->n_rails;
    for (unsigned i = 0; i < tp->n_rails; i++)
        p->rails[mc__tcp_slot].v[i] = &tp->rails[i].base;
}
