/* Rails: the paths to a peer, whatever transport builds them. Their rank for a buffer's
 * location (NIC priority matrix), their health (a rail that fails repeatedly is paused and
 * re-probed with a growing back-off), their throughput, and mc_stats_rails. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "topology/topology.h"
#include "transport/transport.h"

#define RAIL_FAIL_WINDOW_NS (10000 * MC_MS) /* 3 failures within this pause a rail */
#define RAIL_PAUSE_MIN_NS   (1000 * MC_MS)
#define RAIL_PAUSE_MAX_NS   (30000 * MC_MS)

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
    if (!r->dev[0] || mc__topo_matrix_get(&e->topo, location, &pref, &np, &avail, &na))
        r->rank = 1; /* nothing says otherwise: usable */
    else
        r->rank = listed(pref, np, r->dev) ? 0 : listed(avail, na, r->dev) ? 1 : 2;
    snprintf(r->rank_loc, sizeof(r->rank_loc), "%s", location);
    return r->rank;
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

void mc__rails_tick(mc_engine_t *e, uint64_t now)
{
    /* Progress context: the table and the rails are read without peers_lock (peer.h). */
    for (size_t i = 0; i < e->n_peers; i++) {
        mc_peer_t *p = mc__peer_at(e, i);
        for (unsigned t = 0; p && t < mc__n_transports; t++)
            for (unsigned r = 0; r < p->rails[t].n; r++)
                rail_tick(p->rails[t].v[r], now);
    }
}

bool mc__rail_usable(const mc_rail_t *r, uint64_t now)
{
    return r->state == MC_RAIL_ACTIVE || now >= r->next_connect_ns;
}

/* How long a rail waits before the next connect after failed ones: 50 ms doubling to 1.6 s. */
static uint64_t connect_backoff_ns(const mc_rail_t *r)
{
    return 50 * MC_MS << (r->connect_failures < 5 ? r->connect_failures : 5);
}

void mc__rail_failed(mc_rail_t *r, uint64_t now, bool connecting, bool last)
{
    atomic_fetch_add_explicit(&r->errors, 1, memory_order_relaxed);
    if (connecting)
        r->connect_failures++;
    if (r->fail_at[2] && now - r->fail_at[2] > 2 * RAIL_PAUSE_MAX_NS)
        r->backoff_ns = 0; /* healthy for long: the next pause starts short again */
    memmove(r->fail_at, r->fail_at + 1, sizeof(r->fail_at) - sizeof(r->fail_at[0]));
    r->fail_at[2] = now;
    bool pause = r->fail_at[0] && now - r->fail_at[0] < RAIL_FAIL_WINDOW_NS;
    if (pause) {
        r->backoff_ns = r->backoff_ns ? r->backoff_ns * 2 : RAIL_PAUSE_MIN_NS;
        if (r->backoff_ns > RAIL_PAUSE_MAX_NS)
            r->backoff_ns = RAIL_PAUSE_MAX_NS;
        memset(r->fail_at, 0, sizeof(r->fail_at));
    }
    /* A pause steers the traffic to the peer's other rails; its last one is not paused, since
     * that would only stop its traffic (for up to 30 s): the connect backoff spaces its tries. */
    if (last && (pause || connecting || r->state == MC_RAIL_PAUSED)) {
        r->state = MC_RAIL_ACTIVE;
        r->next_connect_ns = now + connect_backoff_ns(r);
    } else if (pause) {
        if (r->state != MC_RAIL_PAUSED)
            mc_warn("rail %s paused for %llu ms after repeated failures", r->name,
                    (unsigned long long)(r->backoff_ns / MC_MS));
        r->state = MC_RAIL_PAUSED;
        r->next_connect_ns = now + r->backoff_ns;
    } else if (connecting) {
        r->next_connect_ns = now + connect_backoff_ns(r);
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
        /* The rails of the transports that reach it, best transport first. */
        const mc_rail_t *all[MC_TP_MAX * MC_MAX_RAILS];
        unsigned n = 0;
        uint64_t total = 0;
        for (unsigned k = 0; k < p->n_order; k++)
            for (unsigned i = 0; i < p->rails[p->order[k]].n; i++)
                all[n++] = p->rails[p->order[k]].v[i];
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
