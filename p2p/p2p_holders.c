/* The holders a fetch knows, which shard to start next and from whom. All under f->lock. */
#include <errno.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "p2p_fetch.h"

/* A source of this fetch, as far as the store told: listed, or listed until lately. */
static bool holder_known(const p2p_holder_t *h)
{
    return h->present || h->withdrawn;
}

bool mc__p2p_holder_usable(const p2p_fetch_t *f, const p2p_holder_t *h)
{
    return holder_known(h) && !h->dead && !h->bad && !h->rest_until_ms &&
           (!f->o.origin_only || h->origin);
}

/* The engine never revives a segment it declared dead: a holder tried again after a rest gets
 * a fresh one, once nothing of ours is in flight to the old. */
static void holder_seg_close(p2p_fetch_t *f, p2p_holder_t *h)
{
    if (h->seg != MC_SEGMENT_INVALID && !h->inflight &&
        mc_segment_close(f->p2p->engine, h->seg) == 0)
        h->seg = MC_SEGMENT_INVALID;
}

/* A holder we could not reach may be gone, or may have had a blip: an unanswered request for
 * its descriptor, a segment that would not open in time (the engine reports both as it does a
 * dead peer). It rests, P2P_LOST_REST_MS doubled each time, and is tried again; P2P_HOLDER_LOST
 * times in a row make it dead for the rest of the fetch (a gone one is: nothing listens, so
 * each try fails at once). The shards in flight from it when it failed fail together: they
 * count once. Its segment is closed now, or when its rest ends if shards were in flight to it. */
void mc__p2p_holder_lost(p2p_fetch_t *f, p2p_holder_t *h, int err)
{
    f->holders_gen++;
    if (h->rest_until_ms)
        return;
    if (++h->lost >= P2P_HOLDER_LOST) {
        h->dead = true;
        mc__p2p_warn(f->p2p, "%s: %s unreachable %u times in a row (%s): dropping it", f->h->name,
                     h->segment, h->lost, mc_strerror(err));
        return;
    }
    h->rest_until_ms = mc__p2p_now_ms() + ((uint64_t)P2P_LOST_REST_MS << (h->lost - 1));
    holder_seg_close(f, h);
}

bool mc__p2p_holders_rest(p2p_fetch_t *f, uint64_t now)
{
    bool resting = false;

    for (size_t k = 0; k < f->n_holders; k++) {
        p2p_holder_t *h = &f->holders[k];
        if (h->rest_until_ms && now >= h->rest_until_ms) {
            h->rest_until_ms = 0;
            f->holders_gen++;
            holder_seg_close(f, h); /* (shards were in flight to it when it failed) */
        }
        resting |= h->rest_until_ms && holder_known(h) && !h->dead && !h->bad;
    }
    return resting;
}

/* Usable holders per shard, the origin apart: avail counts the replicas, and the origin (which
 * has every shard) is a source only while few of our shards are in flight from it. Recounting costs
 * holders x shards, and every fetcher's entry changes up to 1000 / P2P_PUBLISH_MS times a second: a
 * change is counted at most every P2P_RECOUNT_MS unless force (a pick that found the counts stale).
 */
static void count_avail(p2p_fetch_t *f, bool force)
{
    uint64_t now = mc__p2p_now_ms();

    if (f->avail_gen == f->holders_gen ||
        (!force && f->avail_ms && now - f->avail_ms < P2P_RECOUNT_MS))
        return;
    memset(f->avail, 0, f->d.shards * sizeof(*f->avail));
    for (size_t k = 0; k < f->n_holders; k++) {
        const p2p_holder_t *h = &f->holders[k];
        if (!mc__p2p_holder_usable(f, h) || h->origin)
            continue;
        for (uint32_t i = 0; i < f->d.shards; i++)
            f->avail[i] += h->e.complete || p2p_bit(h->e.have, i);
    }
    f->avail_gen = f->holders_gen;
    f->avail_ms = now;
}

/* Lower is better: other replicas first, the origin after them (it is everyone's last
 * resort), then holders that keep failing, and those whose entry went last of all. */
static unsigned holder_class(const p2p_holder_t *h)
{
    return h->withdrawn ? 3 : h->fails >= P2P_HOLDER_FAILS ? 2 : h->origin ? 1 : 0;
}

static bool holder_better(const p2p_holder_t *a, const p2p_holder_t *b)
{
    return holder_class(a) != holder_class(b) ? holder_class(a) < holder_class(b)
                                              : a->inflight < b->inflight;
}

bool mc__p2p_choose_holder(p2p_fetch_t *f, uint32_t shard, size_t *holder_p)
{
    size_t best = SIZE_MAX, ties = 0, last = f->last_holder[shard];

    for (size_t k = 0; k < f->n_holders; k++) {
        const p2p_holder_t *h = &f->holders[k];
        if (k == last || !mc__p2p_holder_usable(f, h) || !p2p_bit(h->e.have, shard))
            continue;
        if (best == SIZE_MAX || holder_better(h, &f->holders[best])) {
            best = k;
            ties = 1;
        } else if (!holder_better(&f->holders[best], h) && p2p_rand(f) % ++ties == 0) {
            best = k;
        }
    }
    if (best == SIZE_MAX && last != SIZE_MAX && last < f->n_holders &&
        mc__p2p_holder_usable(f, &f->holders[last]) && p2p_bit(f->holders[last].e.have, shard))
        best = last;
    if (best == SIZE_MAX)
        return false;
    *holder_p = best;
    return true;
}

/* The origin's link is the one every fetcher shares. Reading many shards from it at once
 * makes each crawl, so no replica appears for a long time, and fetchers that pick the same
 * shards fetch them from it twice; a few at a time, each done quickly, start the exchange at
 * once. Only for shards no replica has; unbounded when fetching from the origin alone. */
static bool origin_open(const p2p_fetch_t *f)
{
    for (size_t k = 0; k < f->n_holders; k++) {
        const p2p_holder_t *h = &f->holders[k];
        if (h->origin && mc__p2p_holder_usable(f, h))
            return f->o.origin_only || h->inflight < P2P_ORIGIN_INFLIGHT;
    }
    return false;
}

/* A missing shard some replica has (2), or only the origin while it takes more (1), or none. */
static int startable(const p2p_fetch_t *f, uint32_t i, bool origin)
{
    if (f->state[i] != SHARD_MISSING)
        return 0;
    return f->avail[i] > 0 ? 2 : origin ? 1 : 0;
}

/* MC_P2P_RANDOM: the next startable shard in the random permutation. */
static bool pick_random(p2p_fetch_t *f, uint32_t *shard_p)
{
    bool origin = origin_open(f);

    for (uint32_t k = 0; k < f->d.shards; k++) {
        uint32_t j = (f->random_next + k) % f->d.shards, i = f->perm[j];
        if (startable(f, i, origin)) {
            f->random_next = (j + 1) % f->d.shards;
            *shard_p = i;
            return true;
        }
    }
    return false;
}

/* MC_P2P_RAREST_FIRST: of the shards some replica has, the one with the fewest replicas;
 * else one only the origin has; the first of them in the random permutation (which breaks
 * ties at random and differently on every fetcher). */
static bool pick_rarest(p2p_fetch_t *f, uint32_t *shard_p)
{
    bool origin = origin_open(f);
    uint32_t best = UINT32_MAX;
    int best_kind = 0;

    for (uint32_t k = 0; k < f->d.shards; k++) {
        uint32_t i = f->perm[k];
        int kind = startable(f, i, origin);
        if (kind > best_kind || (kind && kind == best_kind && f->avail[i] < f->avail[best])) {
            best = i;
            best_kind = kind;
        }
    }
    *shard_p = best;
    return best != UINT32_MAX;
}

static bool pick_once(p2p_fetch_t *f, uint32_t *shard_p, size_t *holder_p)
{
    uint32_t shard;

    if (!(f->o.order == MC_P2P_RANDOM ? pick_random(f, &shard) : pick_rarest(f, &shard)))
        return false;
    if (!mc__p2p_choose_holder(f, shard, holder_p))
        return false;
    *shard_p = shard;
    return true;
}

bool mc__p2p_pick(p2p_fetch_t *f, uint32_t *shard_p, size_t *holder_p)
{
    count_avail(f, false);
    if (pick_once(f, shard_p, holder_p))
        return true;
    if (f->avail_gen == f->holders_gen)
        return false;
    count_avail(f, true); /* the counts were stale: a holder went, or came */
    return pick_once(f, shard_p, holder_p);
}

int mc__p2p_stall_reason(p2p_fetch_t *f, uint32_t *shard_p)
{
    for (uint32_t i = 0; i < f->d.shards; i++) {
        bool held = false, good = false;
        if (f->state[i] != SHARD_MISSING)
            continue;
        for (size_t k = 0; k < f->n_holders; k++) {
            const p2p_holder_t *h = &f->holders[k];
            if (holder_known(h) && p2p_bit(h->e.have, i) && (!f->o.origin_only || h->origin)) {
                held = true;
                good |= !h->bad;
            }
        }
        if (!good) {
            *shard_p = i;
            return held ? -EILSEQ : -MC_EPEERDEAD;
        }
    }
    *shard_p = 0;
    return -MC_EPEERDEAD;
}

/* ---- the table, from the store ---- */

static p2p_holder_t *holder_find(p2p_fetch_t *f, const char *segment)
{
    for (size_t k = 0; k < f->n_holders; k++)
        if (!strcmp(f->holders[k].segment, segment))
            return &f->holders[k];
    return NULL;
}

static p2p_holder_t *holder_add(p2p_fetch_t *f, const char *segment)
{
    if (f->n_holders == f->cap_holders) {
        size_t cap = f->cap_holders ? 2 * f->cap_holders : 8;
        p2p_holder_t *v = realloc(f->holders, cap * sizeof(*v));
        if (!v)
            return NULL;
        f->holders = v;
        f->cap_holders = cap;
    }
    p2p_holder_t *h = &f->holders[f->n_holders++];
    memset(h, 0, sizeof(*h));
    snprintf(h->segment, sizeof(h->segment), "%s", segment);
    h->seg = MC_SEGMENT_INVALID;
    h->origin = !strcmp(segment, f->d.origin);
    return h;
}

/* An entry of another publication of the name (a forced replacement), of ourselves, or one
 * this code cannot read is ignored, and replaces what that holder's key held before: the
 * holder no longer serves this object. */
static void holder_put(p2p_fetch_t *f, const char *segment, const char *json, size_t len)
{
    p2p_entry_t e;

    if (!strcmp(segment, f->p2p->segment))
        return;
    bool decoded = !mc__p2p_entry_decode(json, len, f->d.size, &e);
    bool ours = decoded && e.id == f->d.id && e.shards == f->d.shards;
    p2p_holder_t *h = holder_find(f, segment);
    if (ours && !h)
        h = holder_add(f, segment);
    if (!ours || !h) { /* (!h: out of memory for a new holder) */
        if (decoded)
            mc__p2p_entry_free(&e);
        if (h) /* it serves another object now */
            h->present = h->withdrawn = false;
        return;
    }
    mc__p2p_entry_free(&h->e);
    h->e = e;
    h->present = true;
    h->withdrawn = false;
}

/* Its entry went: a fetch under way goes on reading from it, last of all (p2p.h: an object
 * removed without its replicas is finished from the holders a fetch knows). */
static void holder_withdrawn(p2p_holder_t *h)
{
    h->withdrawn |= h->present;
    h->present = false;
}

static const char *key_segment(const p2p_fetch_t *f, const char *key)
{
    size_t n = strlen(f->replica_prefix);

    return strncmp(key, f->replica_prefix, n) || !key[n] ? NULL : key + n;
}

void mc__p2p_holders_listed(p2p_fetch_t *f, const mc_meta_kv_t *kvs, size_t n)
{
    for (size_t k = 0; k < f->n_holders; k++)
        holder_withdrawn(&f->holders[k]);
    for (size_t i = 0; i < n; i++) {
        const char *segment = key_segment(f, kvs[i].key);
        if (segment)
            holder_put(f, segment, kvs[i].value, kvs[i].value_len);
    }
    f->holders_gen++;
}

void mc__p2p_holders_event(p2p_fetch_t *f, const mc_meta_event_t *ev)
{
    const char *segment = key_segment(f, ev->kv.key);
    p2p_holder_t *h;

    if (!segment)
        return;
    if (ev->type == MC_META_PUT)
        holder_put(f, segment, ev->kv.value, ev->kv.value_len);
    else if ((h = holder_find(f, segment)) != NULL)
        holder_withdrawn(h);
    f->holders_gen++;
}

void mc__p2p_holders_free(p2p_fetch_t *f)
{
    for (size_t k = 0; k < f->n_holders; k++)
        mc__p2p_entry_free(&f->holders[k].e);
    free(f->holders);
    f->holders = NULL;
    f->n_holders = 0;
}
