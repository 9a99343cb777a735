/* A shard in flight: started as one batch of READs from one holder, verified when its last
 * task ends. */
#include <errno.h>
#include <stdlib.h>

#include "p2p_fetch.h"
#include "p2p_shard.h"

void mc__p2p_wake(p2p_fetch_t *f)
{
    pthread_mutex_lock(&f->wake_lock);
    f->wakes++;
    pthread_cond_signal(&f->wake_cond);
    pthread_mutex_unlock(&f->wake_lock);
}

static int state_error(const mc_task_status_t *st)
{
    if (st->error)
        return st->error;
    return st->state == MC_TASK_TIMEOUT    ? -MC_ETIMEOUT
           : st->state == MC_TASK_CANCELED ? -MC_ECANCELED
                                           : -EIO;
}

/* From the engine's progress thread: count, keep the first failure, wake the fetch. The
 * decrement is under wake_lock, so that once the fetch sees pending at 0 no callback of the
 * slot can still be touching it (or the fetch, which may be freed next). */
static void slot_cb(void *arg, const mc_task_status_t *st)
{
    p2p_slot_t *s = arg;
    p2p_fetch_t *f = s->f;

    pthread_mutex_lock(&f->wake_lock);
    if (st->state != MC_TASK_COMPLETED && !s->error)
        s->error = state_error(st);
    if (--s->pending == 0) {
        f->wakes++;
        pthread_cond_signal(&f->wake_cond);
    }
    pthread_mutex_unlock(&f->wake_lock);
}

bool mc__p2p_slot_ended(p2p_fetch_t *f, p2p_slot_t *s)
{
    bool ended;

    pthread_mutex_lock(&f->wake_lock);
    ended = s->busy && s->pending == 0;
    pthread_mutex_unlock(&f->wake_lock);
    return ended;
}

static int slot_submit(p2p_fetch_t *f, p2p_slot_t *s, mc_request_t *reqs, size_t n)
{
    mc_submit_opts_t opts = {.size = sizeof(opts), .timeout_ms = f->o.shard_timeout_ms};
    int rc = mc_batch_create(f->p2p->engine, n, &s->batch);

    if (rc)
        return mc__p2p_error(rc, "creating a batch: %s", mc_last_error());
    for (size_t i = 0; i < n; i++) {
        reqs[i].cb = slot_cb;
        reqs[i].cb_arg = s;
    }
    /* Callbacks may run before submit returns: pending is set first. */
    pthread_mutex_lock(&f->wake_lock);
    s->pending = (unsigned)n;
    s->error = 0;
    pthread_mutex_unlock(&f->wake_lock);
    rc = mc_batch_submit_ex(s->batch, reqs, n, &opts);
    if (rc) { /* nothing will complete for it */
        pthread_mutex_lock(&f->wake_lock);
        s->pending = 0;
        pthread_mutex_unlock(&f->wake_lock);
        mc_batch_destroy(s->batch);
        s->batch = NULL;
        return mc__p2p_error(rc, "submitting: %s", mc_last_error());
    }
    return 0;
}

/* Under f->lock (the holder's entry may change under the watch thread otherwise). */
int mc__p2p_slot_start(p2p_fetch_t *f, p2p_slot_t *s, uint32_t shard, size_t holder)
{
    p2p_holder_t *h = &f->holders[holder];
    uint64_t off = p2p_shard_off(&f->d, shard), len = p2p_shard_len(&f->d, shard);
    mc_request_t *reqs;
    size_t n;
    int rc;

    if (h->seg == MC_SEGMENT_INVALID &&
        (rc = mc_segment_open_nb(f->p2p->engine, h->segment, &h->seg)) != 0) {
        h->seg = MC_SEGMENT_INVALID;
        /* the holder's (its name): not one the caller's fetch ends with (-EINVAL, -ENOMEM) */
        return mc__p2p_error(-MC_ENOSEGMENT, "opening %s: %s (%s)", h->segment, mc_last_error(),
                             mc_err_name(rc));
    }
    n = mc__p2p_pieces(f->h->bufs, f->h->n, h->e.bufs, h->e.n_bufs, h->seg, off, len, NULL, 0);
    reqs = malloc(n * sizeof(*reqs));
    if (!reqs)
        return mc__p2p_error(-ENOMEM, "out of memory");
    mc__p2p_pieces(f->h->bufs, f->h->n, h->e.bufs, h->e.n_bufs, h->seg, off, len, reqs, n);
    rc = slot_submit(f, s, reqs, n);
    free(reqs);
    if (rc)
        return rc;
    s->busy = true;
    s->canceled = false;
    s->shard = shard;
    s->holder = holder;
    s->started_ms = s->moved_ms = mc__p2p_now_ms();
    s->moved_bytes = 0;
    f->state[shard] = SHARD_INFLIGHT;
    f->bytes_started += len;
    h->inflight++;
    return 0;
}

/* Errors that say the holder will not serve us again in this fetch. */
static bool holder_gone(int err)
{
    return err == -MC_EACCESS || err == -MC_EAUTH || err == -MC_EVERSION;
}

/* Errors that say we could not reach the holder, for a while or for good. */
static bool holder_unreachable(int err)
{
    return err == -MC_EPEERDEAD || err == -MC_ENOSEGMENT;
}

static void shard_done(p2p_fetch_t *f, p2p_holder_t *h, uint32_t shard)
{
    uint64_t len = p2p_shard_len(&f->d, shard);

    f->state[shard] = SHARD_DONE;
    f->prog.shards_done++;
    f->prog.bytes_done += len;
    if (h->origin)
        f->prog.bytes_from_origin += len;
    else
        f->prog.bytes_from_replicas += len;
    h->fails = 0;
    h->lost = 0;
    p2p_bit_set(f->have, shard);
    f->pub_dirty = true;
    pthread_cond_signal(&f->pub_cond);
}

/* The attempt failed (err) or sent corrupt bytes (err 0): the shard goes back to missing. */
static int shard_failed(p2p_fetch_t *f, p2p_holder_t *h, const p2p_slot_t *s, int err)
{
    f->state[s->shard] = SHARD_MISSING;
    f->last_holder[s->shard] = s->holder;
    f->prog.retries++;
    f->holders_gen++;
    if (!err) {
        f->prog.corrupt++;
        h->bad = true;
        err = -EILSEQ;
        mc__p2p_warn(f->p2p, "%s: shard %u from %s does not match its checksum: avoiding %s",
                     f->h->name, s->shard, h->segment, h->segment);
    } else if (holder_gone(err)) {
        h->dead = true;
    } else if (holder_unreachable(err)) {
        mc__p2p_holder_lost(f, h, err);
    } else {
        h->fails++;
    }
    f->last_error = err;
    if (++f->tries[s->shard] < P2P_MAX_TRIES)
        return 0;
    return mc__p2p_error(err, "%s: shard %u failed %d times, the last from %s: %s", f->h->name,
                         s->shard, P2P_MAX_TRIES, h->segment, mc_strerror(err));
}

/* Every callback of the slot ran: the batch goes, the slot is free. Its error. */
static int slot_end(p2p_fetch_t *f, p2p_slot_t *s)
{
    int err;

    pthread_mutex_lock(&f->wake_lock);
    err = s->error;
    pthread_mutex_unlock(&f->wake_lock);
    if (s->canceled && err == -MC_ECANCELED) /* expire_slots gave up on it: it timed out */
        err = -MC_ETIMEOUT;
    if (mc_batch_destroy(s->batch))
        mc_batch_release(s->batch); /* never the case once every callback ran; be safe */
    s->batch = NULL;
    s->busy = false;
    f->busy_slots--;
    return err;
}

void mc__p2p_slot_discard(p2p_fetch_t *f, p2p_slot_t *s)
{
    slot_end(f, s);
    pthread_mutex_lock(&f->lock);
    f->holders[s->holder].inflight--;
    f->state[s->shard] = SHARD_MISSING;
    pthread_mutex_unlock(&f->lock);
}

int mc__p2p_slot_finish(p2p_fetch_t *f, p2p_slot_t *s)
{
    uint64_t off = p2p_shard_off(&f->d, s->shard), len = p2p_shard_len(&f->d, s->shard);
    bool ok = false;
    int err = slot_end(f, s), rc = 0;

    /* Verified outside f->lock: hashing a large shard must not hold up the watch thread. */
    if (!err)
        ok = mc__p2p_hash(f->h->bufs, f->h->n, off, len) == f->d.sums[s->shard];
    pthread_mutex_lock(&f->lock);
    p2p_holder_t *h = &f->holders[s->holder];
    h->inflight--;
    if (!err && ok)
        shard_done(f, h, s->shard);
    else
        rc = shard_failed(f, h, s, err);
    pthread_mutex_unlock(&f->lock);
    return rc;
}
