/* Rails: the paths to a peer. For tcp a rail pairs one of our interface addresses with one of
 * the peer's endpoints, and its connections bind to that address so traffic leaves through that
 * link. A rail that fails repeatedly is paused and re-probed with a growing back-off. */
#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "engine_int.h"
#include "topology.h"

#define RAIL_FAIL_WINDOW_NS (10000 * MC_MS) /* 3 failures within this pause a rail */
#define RAIL_PAUSE_MIN_NS   (1000 * MC_MS)
#define RAIL_PAUSE_MAX_NS   (30000 * MC_MS)

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
    for (unsigned i = 0; i < e->n_listens; i++) {
        if (mc__parse_ip_port(e->listen_addrs[i], local, len_p) == 0 &&
            same_subnet24(local, remote)) {
            ((struct sockaddr_in *)local)->sin_port = 0;
            return true;
        }
    }
    return false;
}

static pthread_once_t topo_once = PTHREAD_ONCE_INIT;
static mc_topo_t *topo;
static int topo_rc;
static char topo_err[512];

static void topo_discover(void)
{
    topo_rc = mc__topo_discover(NULL, &topo);
    if (!topo_rc)
        topo_rc = mc__topo_matrix_build_env(topo);
    if (topo_rc)
        snprintf(topo_err, sizeof(topo_err), "%s", mc_last_error());
}

int mc__topo_init(mc_engine_t *e)
{
    pthread_once(&topo_once, topo_discover);
    if (topo_rc)
        return mc__set_error(topo_rc, "%s", topo_err);
    e->topo = topo;
    return 0;
}

/* The interface that holds a local IPv4 address. */
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

static bool listed(const char **devs, size_t n, const char *dev)
{
    for (size_t i = 0; i < n; i++)
        if (!strcmp(devs[i], dev))
            return true;
    return false;
}

int mc__rail_rank(mc_engine_t *e, mc_rail_t *r, const char *location)
{
    const char **pref, **avail;
    size_t np, na;

    if (!strcmp(r->rank_loc, location))
        return r->rank;
    if (!e->topo || !r->dev[0] || mc__topo_matrix_get(e->topo, location, &pref, &np, &avail, &na))
        r->rank = 1; /* nothing says otherwise: usable */
    else
        r->rank = listed(pref, np, r->dev) ? 0 : listed(avail, na, r->dev) ? 1 : 2;
    snprintf(r->rank_loc, sizeof(r->rank_loc), "%s", location);
    return r->rank;
}

void mc__rails_build(mc_engine_t *e, mc_peer_t *p)
{
    unsigned n = 0;

    for (unsigned i = 0; i < p->desc.n_tcp && n < MC_MAX_RAILS; i++) {
        mc_rail_t *r = &p->rails[n];
        char local[MC_NAME_MAX] = "*", remote[MC_NAME_MAX];
        memcpy(remote, p->desc.tcp_addrs[i], sizeof(remote));
        if (mc__parse_ip_port(remote, &r->remote, &r->remote_len))
            continue;
        if (local_for(e, &r->remote, &r->local, &r->local_len))
            inet_ntop(AF_INET, &((struct sockaddr_in *)&r->local)->sin_addr, local, sizeof(local));
        else
            r->local_len = 0;
        if (r->local_len)
            iface_of(&r->local, r->dev, sizeof(r->dev));
        r->rank_loc[0] = 0;
        snprintf(r->name, sizeof(r->name), "%s->%s", local, remote);
        n++;
    }
    /* Existing rails keep their state and counters; a shrinking list keeps the old tail
     * (connections may still point at it) but it gets no new connections. */
    if (n > p->n_rails)
        p->n_rails = n;
    mc__rdma_rails_build(e, p);
}

static void rail_tick(mc_rail_t *r, uint64_t now)
{
    uint64_t bytes = atomic_load(&r->bytes), dt = now - r->rate_ns;

    if (dt < 100 * MC_MS)
        return;
    if (r->rate_ns) {
        double sample = (double)(bytes - r->rate_bytes) * 1e9 / (double)dt;
        double avg = 0.7 * (double)atomic_load(&r->rate) + 0.3 * sample;
        atomic_store(&r->rate, (uint64_t)avg);
    }
    r->rate_bytes = bytes;
    r->rate_ns = now;
}

void mc__rails_tick(mc_peer_t *p, uint64_t now)
{
    for (unsigned i = 0; i < p->n_rails; i++)
        rail_tick(&p->rails[i], now);
    for (unsigned i = 0; i < p->n_rdma_rails; i++)
        rail_tick(&p->rdma_rails[i], now);
}

bool mc__rail_usable(const mc_rail_t *r, uint64_t now)
{
    return r->state == MC_RAIL_ACTIVE || now >= r->next_connect_ns;
}

void mc__rail_failed(mc_rail_t *r, uint64_t now, bool connecting)
{
    atomic_fetch_add_explicit(&r->errors, 1, memory_order_relaxed);
    if (connecting)
        r->connect_failures++;
    if (r->fail_at[2] && now - r->fail_at[2] > 2 * RAIL_PAUSE_MAX_NS)
        r->backoff_ns = 0; /* healthy for long: the next pause starts short again */
    memmove(r->fail_at, r->fail_at + 1, sizeof(r->fail_at) - sizeof(r->fail_at[0]));
    r->fail_at[2] = now;
    if (r->fail_at[0] && now - r->fail_at[0] < RAIL_FAIL_WINDOW_NS) {
        r->backoff_ns = r->backoff_ns ? r->backoff_ns * 2 : RAIL_PAUSE_MIN_NS;
        if (r->backoff_ns > RAIL_PAUSE_MAX_NS)
            r->backoff_ns = RAIL_PAUSE_MAX_NS;
        if (r->state != MC_RAIL_PAUSED)
            mc_warn("rail %s paused for %llu ms after repeated failures", r->name,
                    (unsigned long long)(r->backoff_ns / MC_MS));
        r->state = MC_RAIL_PAUSED;
        r->next_connect_ns = now + r->backoff_ns;
        memset(r->fail_at, 0, sizeof(r->fail_at));
    } else if (connecting) {
        r->next_connect_ns =
            now + (50 * MC_MS << (r->connect_failures < 5 ? r->connect_failures : 5));
    }
}

void mc__rail_ready(mc_rail_t *r)
{
    if (r->state == MC_RAIL_PAUSED)
        mc_info("rail %s is back", r->name);
    r->state = MC_RAIL_ACTIVE;
    r->connect_failures = 0;
}

int mc_stats_rails(mc_engine_t *e, mc_segment_id_t id, mc_rail_stats_t *out, size_t max,
                   size_t *count_p)
{
    int rc = 0;

    if (!e || !count_p || (max && !out))
        return mc__set_error(-EINVAL, "mc_stats_rails: invalid argument");
    pthread_rwlock_rdlock(&e->peers_lock);
    mc_peer_t *p = mc__peer_get(e, id);
    if (!p) {
        rc = mc__set_error(-ENOENT, "no open segment with id %u", id);
    } else {
        /* rdma rails (device pairs) first, then tcp ones (interface pairs). */
        const mc_rail_t *all[2 * MC_MAX_RAILS];
        unsigned n = 0;
        uint64_t total = 0;
        for (unsigned i = 0; i < p->n_rdma_rails; i++)
            all[n++] = &p->rdma_rails[i];
        for (unsigned i = 0; i < p->n_rails; i++)
            all[n++] = &p->rails[i];
        for (unsigned i = 0; i < n; i++)
            total += atomic_load(&all[i]->rate);
        for (unsigned i = 0; i < n && i < max; i++) {
            const mc_rail_t *r = all[i];
            snprintf(out[i].name, sizeof(out[i].name), "%s", r->name);
            out[i].state = r->state;
            out[i].conns = r->n_conns;
            out[i].bytes = atomic_load(&r->bytes);
            out[i].slices = atomic_load(&r->slices);
            out[i].errors = atomic_load(&r->errors);
            out[i].rate = atomic_load(&r->rate);
            out[i].weight = total ? (double)out[i].rate / (double)total : 0.0;
        }
        *count_p = n;
    }
    pthread_rwlock_unlock(&e->peers_lock);
    return rc;
}
