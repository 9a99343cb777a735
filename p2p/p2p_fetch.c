/* mc_p2p_get_replica: the fetch loop in the caller's thread. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "p2p_fetch.h"
#include "p2p_shard.h"

/* ---- arguments and set-up ---- */

static int get_args(mc_p2p_t *p2p, const char *name, const mc_p2p_buf_t *bufs, size_t n,
                    const mc_p2p_get_opts_t *opts, mc_p2p_get_opts_t *o, uint64_t *total_p)
{
    int rc = p2p ? mc__p2p_name_check(name) : mc__p2p_error(-EINVAL, "NULL node");

    if (!rc)
        rc = mc__p2p_bufs_check(name, bufs, n, total_p);
    if (!rc)
        rc = mc__p2p_bufs_disjoint(name, bufs, n);
    if (rc)
        return rc;
    memset(o, 0, sizeof(*o));
    /* Callers built against an older header pass a shorter struct: the rest is defaults. */
    if (opts)
        memcpy(o, opts, opts->size && opts->size < sizeof(*o) ? opts->size : sizeof(*o));
    if (o->order != MC_P2P_RAREST_FIRST && o->order != MC_P2P_RANDOM)
        return mc__p2p_error(-EINVAL, "%s: unknown shard order %d", name, (int)o->order);
    if (!o->max_inflight)
        o->max_inflight = P2P_DEFAULT_INFLIGHT;
    if (!o->shard_timeout_ms)
        o->shard_timeout_ms = P2P_DEFAULT_TIMEOUT;
    return 0;
}

static int fetch_alloc(p2p_fetch_t *f)
{
    uint32_t k = f->d.shards;

    f->state = calloc(k, 1);
    f->tries = calloc(k, 1);
    f->perm = malloc(k * sizeof(*f->perm));
    f->avail = calloc(k, sizeof(*f->avail));
    f->last_holder = malloc(k * sizeof(*f->last_holder));
    f->have = calloc((k + 7) / 8, 1);
    f->n_slots = f->o.max_inflight < k ? f->o.max_inflight : k;
    f->slots = calloc(f->n_slots, sizeof(*f->slots));
    if (!f->state || !f->tries || !f->perm || !f->avail || !f->last_holder || !f->have || !f->slots)
        return mc__p2p_error(-ENOMEM, "%s: out of memory for %u shards", f->h->name, k);
    for (uint32_t i = 0; i < k; i++) {
        uint32_t j = (uint32_t)(p2p_rand(f) % (i + 1)); /* Fisher-Yates, inside out */
        f->perm[i] = f->perm[j];
        f->perm[j] = i;
        f->last_holder[i] = SIZE_MAX;
    }
    for (unsigned i = 0; i < f->n_slots; i++)
        f->slots[i].f = f;
    return 0;
}

static void fetch_locks_init(p2p_fetch_t *f)
{
    pthread_condattr_t ca;

    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_mutex_init(&f->lock, NULL);
    pthread_cond_init(&f->pub_cond, &ca);
    pthread_mutex_init(&f->wake_lock, NULL);
    pthread_cond_init(&f->wake_cond, &ca);
    pthread_condattr_destroy(&ca);
}

static int fetch_setup(p2p_fetch_t *f)
{
    int rc = mc__p2p_key(f->p2p, f->h->name, "replica/", f->replica_prefix);

    if (rc < 0 || (rc = mc__p2p_replica_key(f->p2p, f->h->name, f->h->replica_key)) < 0)
        return rc;
    f->rng = mc__p2p_random() | 1;
    f->prog.bytes_total = f->d.size;
    f->prog.shards_total = f->d.shards;
    return fetch_alloc(f);
}

static void fetch_free(p2p_fetch_t *f)
{
    mc__p2p_holders_free(f);
    mc__p2p_desc_free(&f->d);
    free(f->state);
    free(f->tries);
    free(f->perm);
    free(f->avail);
    free(f->last_holder);
    free(f->have);
    free(f->slots);
    pthread_mutex_destroy(&f->lock);
    pthread_cond_destroy(&f->pub_cond);
    pthread_mutex_destroy(&f->wake_lock);
    pthread_cond_destroy(&f->wake_cond);
    free(f);
}

/* ---- the loop ---- */

/* Milliseconds until max_rate lets a shard of len bytes start (0: now). */
static unsigned rate_wait(p2p_fetch_t *f, uint64_t len)
{
    double elapsed = (double)(mc__p2p_now_ms() - f->started_ms) / 1000;
    double over = (double)(f->bytes_started + len) - (double)f->o.max_rate * elapsed -
                  (double)f->d.shard_size; /* a burst of one shard is allowed */

    if (!f->o.max_rate || over <= 0)
        return 0;
    return (unsigned)(over * 1000 / (double)f->o.max_rate) + 1;
}

/* Start shards while slots are free. If max_rate holds the next one back, *wait_p is lowered
 * to when it may start and true returned: the fetch is waiting, not stalled. */
static bool start_shards(p2p_fetch_t *f, unsigned *wait_p)
{
    bool held_back = false;
    uint32_t backed = UINT32_MAX; /* the shard whose local pages were backed last */

    pthread_mutex_lock(&f->lock);
    mc__p2p_holders_rest(f, mc__p2p_now_ms());
    while (f->busy_slots < f->n_slots) {
        uint32_t shard;
        size_t holder;
        unsigned wait;
        if (!mc__p2p_pick(f, &shard, &holder))
            break;
        if ((wait = rate_wait(f, p2p_shard_len(&f->d, shard))) != 0) {
            *wait_p = wait < *wait_p ? wait : *wait_p;
            held_back = true;
            break;
        }
        if (shard != backed) {
            /* Backing a shard's pages (mc__p2p_prefault) takes milliseconds: not under f->lock,
             * which the store threads take (the replica watch, our entry's publisher). Holders
             * may have changed meanwhile: its holder is chosen again (only this thread starts
             * and ends shards, so the shard itself is still missing). */
            pthread_mutex_unlock(&f->lock);
            mc__p2p_prefault(f->h->bufs, f->h->n, p2p_shard_off(&f->d, shard),
                             p2p_shard_len(&f->d, shard));
            backed = shard;
            pthread_mutex_lock(&f->lock);
            if (!mc__p2p_choose_holder(f, shard, &holder))
                continue;
        }
        p2p_slot_t *s = f->slots;
        while (s->busy)
            s++;
        int rc = mc__p2p_slot_start(f, s, shard, holder);
        if (rc == -EINVAL || rc == -ENOMEM) { /* our buffers (read-only memory), or our memory:
                                               * no holder does better */
            f->local_error = rc;
            break;
        }
        if (rc) { /* not the shard's fault: the holder's segment */
            mc__p2p_warn(f->p2p, "%s: %s", f->h->name, mc_p2p_last_error());
            mc__p2p_holder_lost(f, &f->holders[holder], rc);
            continue;
        }
        f->busy_slots++;
    }
    pthread_mutex_unlock(&f->lock);
    return held_back;
}

/* Finish every slot whose tasks all ended. */
static int reap_slots(p2p_fetch_t *f)
{
    int rc = 0;

    for (unsigned i = 0; i < f->n_slots && !rc; i++)
        if (mc__p2p_slot_ended(f, &f->slots[i]))
            rc = mc__p2p_slot_finish(f, &f->slots[i]);
    return rc;
}

/* The engine times tasks out itself (submit timeout, from their first bytes); a batch whose
 * bytes have not grown for well over that, from a holder none of whose shards in flight gained
 * bytes either (a holder that completes nothing), is canceled, and retried elsewhere once its
 * callbacks have run. One whose bytes keep coming is left alone however long it takes, and so
 * is one queued behind others of a holder that keeps sending: the engine carves a peer's tasks
 * in order, so on a slow link the eighth shard in flight gets its first byte once seven are on
 * their way (8 of 64 MiB at 100 Mbit/s: 43 s). Shards were canceled at 32 s from their submit
 * first, then (until 2026-12-05) once they had waited that long without a byte: each a try of
 * 16, put back behind the same queue, and a fetch from one holder at 30 Mbit/s with 4 MiB shards
 * and a 3 s timeout retried 3 times (test_p2p_slow_link). */
static void expire_slots(p2p_fetch_t *f, uint64_t now)
{
    uint64_t limit = (uint64_t)f->o.shard_timeout_ms + P2P_CANCEL_GRACE_MS;

    for (unsigned i = 0; i < f->n_slots; i++) {
        p2p_slot_t *s = &f->slots[i];
        mc_batch_status_t bs;
        if (s->busy && !s->canceled && !mc_batch_status(s->batch, &bs) &&
            bs.bytes != s->moved_bytes) {
            s->moved_bytes = bs.bytes;
            s->moved_ms = now;
        }
    }
    pthread_mutex_lock(&f->lock); /* (the holders: the watch thread adds to them) */
    for (unsigned i = 0; i < f->n_slots; i++) {
        const p2p_slot_t *s = &f->slots[i];
        if (s->busy && s->moved_ms > f->holders[s->holder].moved_ms)
            f->holders[s->holder].moved_ms = s->moved_ms;
    }
    for (unsigned i = 0; i < f->n_slots; i++) {
        p2p_slot_t *s = &f->slots[i];
        if (s->busy && !s->canceled && now - s->moved_ms > limit &&
            now - f->holders[s->holder].moved_ms > limit) {
            s->canceled = true;
            mc_batch_cancel(s->batch); /* (its callbacks take wake_lock only) */
        }
    }
    pthread_mutex_unlock(&f->lock);
}

/* Nothing in flight and nothing can start: wait for new holders, up to the shard timeout. */
static int check_stall(p2p_fetch_t *f, uint64_t now, bool held_back)
{
    uint32_t shard;
    int rc;

    pthread_mutex_lock(&f->lock);
    bool resting = mc__p2p_holders_rest(f, now); /* a holder tried again soon: no stall */
    pthread_mutex_unlock(&f->lock);
    if (f->busy_slots > 0 || held_back || resting || f->prog.shards_done == f->d.shards) {
        f->stalled_ms = 0;
        return 0;
    }
    if (!f->stalled_ms)
        f->stalled_ms = now;
    if (now - f->stalled_ms < f->o.shard_timeout_ms)
        return 0;
    pthread_mutex_lock(&f->lock);
    rc = mc__p2p_stall_reason(f, &shard);
    if (f->meta_down)
        rc = -MC_EMETA;
    pthread_mutex_unlock(&f->lock);
    return mc__p2p_error(rc, "%s: shard %u: %s for %u ms", f->h->name, shard,
                         rc == -EILSEQ     ? "every holder of it sent corrupt data"
                         : rc == -MC_EMETA ? "no holder known and the store unreachable"
                                           : "no live holder",
                         f->o.shard_timeout_ms);
}

static void progress_snapshot(p2p_fetch_t *f, mc_p2p_progress_t *out)
{
    pthread_mutex_lock(&f->lock);
    f->prog.holders_in_use = 0;
    for (size_t k = 0; k < f->n_holders; k++)
        f->prog.holders_in_use += f->holders[k].inflight > 0;
    *out = f->prog;
    pthread_mutex_unlock(&f->lock);
}

static int report(p2p_fetch_t *f, uint64_t now)
{
    mc_p2p_progress_t p;

    if (!f->o.cb || now - f->reported_ms < P2P_REPORT_MS)
        return 0;
    f->reported_ms = now;
    progress_snapshot(f, &p);
    if (f->o.cb(f->o.cb_arg, &p))
        return mc__p2p_error(-MC_ECANCELED, "%s: stopped by the caller", f->h->name);
    return 0;
}

static void fetch_wait(p2p_fetch_t *f, unsigned ms, unsigned *seen)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    ts.tv_nsec += (long)ms * 1000000;
    ts.tv_sec += ts.tv_nsec / 1000000000;
    ts.tv_nsec %= 1000000000;
    pthread_mutex_lock(&f->wake_lock);
    while (f->wakes == *seen && pthread_cond_timedwait(&f->wake_cond, &f->wake_lock, &ts) == 0)
        ;
    *seen = f->wakes;
    pthread_mutex_unlock(&f->wake_lock);
}

/* The store refused this node's replica entry for good (a key too long for it): it could be
 * no holder, so the fetch fails rather than end in a copy nobody is told of. */
static int published(p2p_fetch_t *f)
{
    int rc;

    pthread_mutex_lock(&f->lock);
    rc = f->pub_error ? mc__p2p_error(f->pub_error, "%s", f->pub_why) : 0;
    pthread_mutex_unlock(&f->lock);
    return rc;
}

static int fetch_loop(p2p_fetch_t *f)
{
    unsigned seen = 0;
    int rc = 0;

    while (!rc) {
        uint64_t now = mc__p2p_now_ms();
        unsigned wait = 50;
        if ((rc = reap_slots(f)) != 0 || f->prog.shards_done == f->d.shards)
            break;
        expire_slots(f, now);
        bool held_back = start_shards(f, &wait);
        if ((rc = f->local_error) != 0 || (rc = check_stall(f, now, held_back)) != 0 ||
            (rc = report(f, now)) != 0 || (rc = published(f)) != 0)
            break;
        fetch_wait(f, wait, &seen);
    }
    return rc;
}

/* Cancel what is in flight and wait until the engine has let go of it: the buffers may be
 * unregistered (or the fetch freed) only then. false if it did not within the grace. */
static bool fetch_drain(p2p_fetch_t *f)
{
    uint64_t end = mc__p2p_now_ms() + P2P_CANCEL_GRACE_MS + f->o.shard_timeout_ms;
    unsigned seen = 0;

    for (unsigned i = 0; i < f->n_slots; i++)
        if (f->slots[i].busy && !f->slots[i].canceled)
            mc_batch_cancel(f->slots[i].batch);
    while (f->busy_slots > 0 && mc__p2p_now_ms() < end) {
        for (unsigned i = 0; i < f->n_slots; i++)
            if (mc__p2p_slot_ended(f, &f->slots[i]))
                mc__p2p_slot_discard(f, &f->slots[i]);
        if (f->busy_slots > 0)
            fetch_wait(f, 50, &seen);
    }
    return f->busy_slots == 0;
}

static void close_segments(p2p_fetch_t *f)
{
    for (size_t k = 0; k < f->n_holders; k++)
        if (f->holders[k].seg != MC_SEGMENT_INVALID &&
            mc_segment_close(f->p2p->engine, f->holders[k].seg) == 0)
            f->holders[k].seg = MC_SEGMENT_INVALID;
}

/* ---- the call ---- */

/* Run the fetch; *leak_p when transfers would not let go of it (it must never be freed). */
static int fetch_run(p2p_fetch_t *f, bool *leak_p)
{
    int rc = mc__p2p_threads_start(f);

    f->started_ms = mc__p2p_now_ms();
    if (!rc)
        rc = fetch_loop(f);
    *leak_p = !fetch_drain(f);
    mc__p2p_threads_stop(f);
    if (!rc) /* the last entry, put as the threads stopped */
        rc = published(f);
    close_segments(f);
    if (*leak_p)
        mc__p2p_warn(f->p2p, "%s: transfers still in flight after cancel: leaking the fetch",
                     f->h->name);
    return rc;
}

/* The description, the buffers registered, the fetch's tables. */
static int fetch_prepare(p2p_fetch_t *f, const mc_p2p_buf_t *bufs, size_t n, uint64_t total)
{
    int rc = mc__p2p_desc_get(f->p2p, f->h->name, &f->d);

    if (rc)
        return rc;
    if (total != f->d.size)
        return mc__p2p_error(-EINVAL, "%s: the buffers hold %llu bytes, the object %llu",
                             f->h->name, (unsigned long long)total, (unsigned long long)f->d.size);
    rc = mc__p2p_hold_bufs(f->p2p, f->h, bufs, n);
    return rc ? rc : fetch_setup(f);
}

static p2p_fetch_t *fetch_new(mc_p2p_t *p2p, p2p_held_t *h, const mc_p2p_get_opts_t *o)
{
    p2p_fetch_t *f = calloc(1, sizeof(*f));

    if (!f)
        return NULL;
    f->p2p = p2p;
    f->h = h;
    f->o = *o;
    fetch_locks_init(f);
    return f;
}

int mc_p2p_get_replica(mc_p2p_t *p2p, const char *name, const mc_p2p_buf_t *bufs, size_t n,
                       const mc_p2p_get_opts_t *opts, mc_p2p_progress_t *progress_p)
{
    mc_p2p_get_opts_t o;
    mc_p2p_progress_t p;
    p2p_fetch_t *f;
    p2p_held_t *h;
    uint64_t total;
    bool leak = false;
    int rc;

    if (progress_p) /* (the final figures, also of a call that fails before it starts) */
        memset(progress_p, 0, sizeof(*progress_p));
    rc = get_args(p2p, name, bufs, n, opts, &o, &total);
    if (rc || (rc = mc__p2p_claim(p2p, name, false, &h)) != 0)
        return rc;
    if (!(f = fetch_new(p2p, h, &o))) {
        mc__p2p_forget(p2p, h);
        return mc__p2p_error(-ENOMEM, "out of memory");
    }
    rc = fetch_prepare(f, bufs, n, total);
    if (!rc)
        rc = fetch_run(f, &leak);
    progress_snapshot(f, &p);
    if (o.cb && f->d.shards)
        o.cb(o.cb_arg, &p); /* the final figures; too late to stop */
    if (progress_p)
        *progress_p = p;
    if (rc)
        rc = mc__p2p_drop(p2p, h, rc);
    else
        mc__p2p_settle(p2p, h);
    if (!leak)
        fetch_free(f);
    return rc;
}
