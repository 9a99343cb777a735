/*
 * Transfers: a prepared list of requests, posted as one engine batch per post.
 *
 * Preparing does all the per-descriptor work once (checks, merging, the request array), so that
 * a post is one submit of an array the engine takes as it is, and posting the same handle again
 * costs no more than that submit.
 *
 * A host that prepares every transfer it posts (vLLM's connector does) would otherwise map
 * fresh memory for each one: the request array and the batch's tasks, some 25 MB for 10^5
 * descriptors, whose first touches cost more than the merging itself (a page fault is about
 * 10 us on a virtual machine). Released handles whose batch the engine let go of are kept
 * instead (SPARE_XFERS of them), and a prepare of no more descriptors than one has takes it.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kv.h"

/* A host that checks a transfer in a tight loop (NIXL's hosts spin on check_xfer) takes a core
 * from the engine threads that move its data: once SPIN_CHECKS checks of it in a row, with no
 * check of another transfer of the instance in between, came less than SPIN_GAP_NS after the
 * one before, a check that finds it in progress waits for it (up to SPIN_WAIT_MS) instead of
 * returning at once. A host that does other work between checks, or checks several transfers
 * in turn, never waits. */
#define SPIN_GAP_NS  20000
#define SPIN_CHECKS  64
#define SPIN_WAIT_MS 1
#define SPARE_XFERS  4

static bool desc_inside(const mc_kv_desc_t *d)
{
    const mc_kv_md_t *md = d->md;

    return d->addr >= md->addr && d->len <= md->len && d->addr - md->addr <= md->len - d->len;
}

static mc_kv_status_t desc_check(mc_kv_backend_t *b, const mc_kv_desc_t *l, const mc_kv_desc_t *r,
                                 size_t i, const kv_agent_t *a)
{
    if (l->len != r->len)
        return kv__fail(b, MC_KV_ERR_INVALID_PARAM,
                        "prep_xfer: descriptor %zu: local length %llu, remote length %llu", i,
                        (unsigned long long)l->len, (unsigned long long)r->len);
    if (!l->md || l->md->kind != KV_MD_LOCAL || !desc_inside(l))
        return kv__fail(b, MC_KV_ERR_INVALID_PARAM,
                        "prep_xfer: local descriptor %zu (0x%llx+%llu) is not inside the "
                        "registered region its handle names",
                        i, (unsigned long long)l->addr, (unsigned long long)l->len);
    if (!r->md || r->md->kind != KV_MD_REMOTE || r->md->agent != a)
        return kv__fail(b, MC_KV_ERR_INVALID_PARAM,
                        "prep_xfer: remote descriptor %zu has no region of agent '%s'", i, a->name);
    if (!desc_inside(r))
        return kv__fail(b, MC_KV_ERR_INVALID_PARAM,
                        "prep_xfer: remote descriptor %zu (0x%llx+%llu) is not inside its region "
                        "0x%llx+%llu",
                        i, (unsigned long long)r->addr, (unsigned long long)r->len,
                        (unsigned long long)r->md->addr, (unsigned long long)r->md->len);
    return MC_KV_SUCCESS;
}

/* Count the transfer as a user of md (once per run of descriptors in it). */
static int md_hold(mc_kv_xfer_t *x, mc_kv_md_t *md, size_t *room)
{
    if (x->n_mds == *room) {
        size_t n = *room ? *room * 2 : 4;
        mc_kv_md_t **mds = realloc(x->mds, n * sizeof(*mds));

        if (!mds)
            return -ENOMEM;
        x->mds = mds;
        *room = n;
    }
    x->mds[x->n_mds++] = md;
    atomic_fetch_add(&md->users, 1);
    return 0;
}

/* Let go of the regions x holds. */
static void xfer_unhold(mc_kv_xfer_t *x)
{
    for (size_t i = 0; i < x->n_mds; i++)
        atomic_fetch_sub(&x->mds[i]->users, 1);
    x->n_mds = 0;
}

/* x no longer names its agent (released, or never prepared). */
static void xfer_agent_put(mc_kv_xfer_t *x)
{
    if (x->agent)
        atomic_fetch_sub(&x->agent->xfers, 1);
    x->agent = NULL;
}

static void xfer_free(mc_kv_xfer_t *x)
{
    xfer_unhold(x);
    mc_batch_release(x->batch); /* cancels what has not finished; never blocks */
    free(x->mds);
    free(x->reqs);
    free(x);
}

/* A handle for count descriptors: a spare one with room for them, or a new one. */
static mc_kv_xfer_t *xfer_new(mc_kv_backend_t *b, size_t count)
{
    mc_kv_xfer_t *x = NULL, **best = NULL;

    pthread_mutex_lock(&b->lock);
    for (mc_kv_xfer_t **q = &b->spare; *q; q = &(*q)->next) /* the smallest with room */
        if ((*q)->reqs_cap >= count && (!best || (*q)->reqs_cap < (*best)->reqs_cap))
            best = q;
    if (best) {
        x = *best;
        *best = x->next;
        b->n_spare--;
    }
    pthread_mutex_unlock(&b->lock);
    if (x) {
        mc_kv_xfer_t keep = *x; /* its memory; the rest starts anew */
        *x = (mc_kv_xfer_t){.reqs = keep.reqs,
                            .reqs_cap = keep.reqs_cap,
                            .mds = keep.mds,
                            .batch = keep.batch,
                            .batch_cap = keep.batch_cap};
        return x;
    }
    if (!(x = calloc(1, sizeof(*x))) || !(x->reqs = malloc(count * sizeof(*x->reqs)))) {
        free(x);
        return NULL;
    }
    x->reqs_cap = count;
    return x;
}

/* Keep a released x for a later prepare if its batch is idle and there is room: true. */
static bool xfer_spare(mc_kv_backend_t *b, mc_kv_xfer_t *x)
{
    bool kept = false;

    if (x->batch && mc_batch_reset(x->batch) < 0)
        return false; /* in flight: the release cancels it */
    xfer_unhold(x);
    pthread_mutex_lock(&b->lock);
    if (b->n_spare < SPARE_XFERS) {
        x->next = b->spare;
        b->spare = x;
        b->n_spare++;
        kept = true;
    }
    pthread_mutex_unlock(&b->lock);
    return kept;
}

/* Build x->reqs: one request per run of descriptors contiguous on both sides in one pair of
 * regions. */
static mc_kv_status_t xfer_build(mc_kv_backend_t *b, mc_kv_xfer_t *x, const mc_kv_desc_t *local,
                                 const mc_kv_desc_t *remote, size_t count)
{
    const mc_kv_md_t *prev_l = NULL, *prev_r = NULL;
    mc_request_t *last = NULL;
    size_t room = 0;
    mc_kv_status_t st;

    for (size_t i = 0; i < count; i++) {
        const mc_kv_desc_t *l = &local[i], *r = &remote[i];

        if ((st = desc_check(b, l, r, i, x->agent)))
            return st;
        if (!l->len)
            continue;
        uint64_t la = l->md->base + (l->addr - l->md->addr), /* the engine's addresses */
            ra = r->md->base + (r->addr - r->md->addr);
        if (last && l->md == prev_l && r->md == prev_r &&
            (uint64_t)(uintptr_t)last->local + last->length == la &&
            last->target_offset + last->length == ra) {
            last->length += l->len;
            continue;
        }
        if ((l->md != prev_l && md_hold(x, l->md, &room)) ||
            (r->md != prev_r && md_hold(x, r->md, &room)))
            return kv__fail(b, MC_KV_ERR_BACKEND, "prep_xfer: out of memory");
        prev_l = l->md;
        prev_r = r->md;
        last = &x->reqs[x->n_reqs++];
        *last = (mc_request_t){
            .opcode = x->op == MC_KV_READ ? MC_READ : MC_WRITE,
            .local = (void *)(uintptr_t)la,
            .target = x->agent->seg,
            .target_offset = ra,
            .length = l->len,
        };
    }
    return MC_KV_SUCCESS;
}

static void xfer_link(mc_kv_backend_t *b, mc_kv_xfer_t *x)
{
    pthread_mutex_lock(&b->lock);
    x->next = b->xfers;
    if (x->next)
        x->next->prev = x;
    b->xfers = x;
    pthread_mutex_unlock(&b->lock);
}

mc_kv_status_t kv__prep_xfer(mc_kv_backend_t *b, mc_kv_op_t op, const mc_kv_desc_t *local,
                             const mc_kv_desc_t *remote, size_t count, const char *agent,
                             mc_kv_xfer_t **xfer_p)
{
    mc_kv_status_t st;
    mc_kv_xfer_t *x;
    kv_agent_t *a;

    if ((op != MC_KV_READ && op != MC_KV_WRITE) || !xfer_p || !agent || !count || !local || !remote)
        return kv__fail(b, MC_KV_ERR_INVALID_PARAM,
                        "prep_xfer: needs READ or WRITE, an agent, an output pointer and at "
                        "least one descriptor pair");
    /* A post is one engine batch, which holds at most 2^26 tasks (one per merged run). The
     * limit is on what the host passes, so that it is known before anything is allocated. */
    if (count > MC_KV_XFER_MAX)
        return kv__fail(b, MC_KV_ERR_INVALID_PARAM,
                        "prep_xfer: %zu descriptor pairs, at most %u (MC_KV_XFER_MAX) in one "
                        "transfer: split it",
                        count, MC_KV_XFER_MAX);
    /* The agent stays until the transfer is released: counted under the lock that disconnect
     * takes to look (its regions named here are held too, but a transfer of empty descriptors
     * holds none). */
    pthread_rwlock_rdlock(&b->agents_lock);
    if ((a = kv__agent_find(b, agent)))
        atomic_fetch_add(&a->xfers, 1);
    pthread_rwlock_unlock(&b->agents_lock);
    if (!a)
        return kv__fail(b, MC_KV_ERR_NOT_FOUND, "prep_xfer: agent '%s' is not loaded", agent);
    if (!(x = xfer_new(b, count))) {
        atomic_fetch_sub(&a->xfers, 1);
        return kv__fail(b, MC_KV_ERR_BACKEND, "prep_xfer: out of memory for %zu descriptors",
                        count);
    }
    x->op = op;
    x->agent = a;
    x->id = atomic_fetch_add(&b->xfer_ids, 1) + 1;
    if ((st = xfer_build(b, x, local, remote, count))) {
        xfer_agent_put(x);
        xfer_free(x);
        return st;
    }
    xfer_link(b, x);
    *xfer_p = x;
    return MC_KV_SUCCESS;
}

/* What ended a batch that did not complete: the first task that failed says. Kept in x, for
 * every later check. */
static mc_kv_status_t xfer_failure(mc_kv_backend_t *b, mc_kv_xfer_t *x, size_t tasks)
{
    mc_task_status_t ts = {.error = 0};
    size_t i;

    for (i = 0; i < tasks; i++)
        if (mc_task_status(x->batch, i, &ts) == 0 && ts.state > MC_TASK_COMPLETED)
            break;
    x->state = KV_X_FAILED;
    x->failure = kv__status_of(ts.error ? ts.error : -MC_ECANCELED);
    if (i == tasks)
        x->failure = MC_KV_ERR_UNKNOWN;
    /* The engine's reason names its error code already. */
    snprintf(x->why, sizeof(x->why), "transfer %s agent '%s' failed: %s",
             x->op == MC_KV_READ ? "from" : "to", x->agent->name,
             i == tasks  ? "no task says why"
             : ts.reason ? ts.reason
                         : mc_err_name(ts.error));
    return kv__fail(b, x->failure, "%s", x->why);
}

/* A completed post is done once the engine has let go of its batch (reset succeeds): only then
 * is its notification queued, so that a notification the host sends after seeing SUCCESS
 * arrives after it. */
static mc_kv_status_t xfer_poll(mc_kv_backend_t *b, mc_kv_xfer_t *x)
{
    mc_batch_status_t s;

    if (b->drives_progress)
        mc_engine_progress(b->engine);
    if (mc_batch_status(x->batch, &s) < 0)
        return kv__fail_engine(b, -EINVAL, "check_xfer");
    if (s.state == MC_TASK_PENDING)
        return MC_KV_IN_PROG;
    if (s.state != MC_TASK_COMPLETED)
        return xfer_failure(b, x, s.tasks);
    if (mc_batch_reset(x->batch) < 0)
        return MC_KV_IN_PROG;
    x->state = KV_X_DONE;
    return MC_KV_SUCCESS;
}

static uint64_t now_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* A check of a posted transfer: waits a little when the host spins on it (SPIN_CHECKS). */
static mc_kv_status_t xfer_check(mc_kv_backend_t *b, mc_kv_xfer_t *x)
{
    mc_kv_status_t st = xfer_poll(b, x);
    uint64_t now;

    if (st != MC_KV_IN_PROG)
        return st;
    now = now_ns();
    bool same = atomic_exchange(&b->last_check_id, x->id) == x->id;
    x->fast_checks = same && now - x->check_ns < SPIN_GAP_NS ? x->fast_checks + 1 : 0;
    if (x->fast_checks >= SPIN_CHECKS) {
        mc_batch_wait(x->batch, SPIN_WAIT_MS);
        st = xfer_poll(b, x);
        now = now_ns();
    }
    x->check_ns = now;
    return st;
}

mc_kv_status_t kv__check_xfer(mc_kv_backend_t *b, mc_kv_xfer_t *x)
{
    if (!x)
        return kv__fail(b, MC_KV_ERR_INVALID_PARAM, "check_xfer: NULL handle");
    switch (x->state) {
    case KV_X_PREPARED:
        return kv__fail(b, MC_KV_ERR_NOT_POSTED, "check_xfer: the transfer was not posted");
    case KV_X_DONE:
        return MC_KV_SUCCESS;
    case KV_X_FAILED:
        return kv__fail(b, x->failure, "%s", x->why);
    default:
        return xfer_check(b, x);
    }
}

/* The keys of the agent's regions the transfer names, added again before each post: the
 * engine routes a request with the key added last that holds it, and a descriptor of the agent
 * that arrived since the load (at connect, say) replaced what the keys had added; by the
 * descriptor alone the request could go with another registration of the same bytes, one the
 * agent may have dropped since (its rkey is refused over rdma). As the UCX module does at every
 * put and get; the key added last again costs a look under a read lock. */
static mc_kv_status_t keys_add(mc_kv_backend_t *b, mc_kv_xfer_t *x)
{
    const mc_kv_md_t *last = NULL;
    int rc;

    for (size_t i = 0; i < x->n_mds; i++) {
        const mc_kv_md_t *md = x->mds[i];

        if (md->kind != KV_MD_REMOTE || md == last)
            continue;
        last = md;
        rc = mc_segment_add_buffer(b->engine, x->agent->seg, md->key, MC_BUFFER_KEY_SIZE);
        if (rc < 0)
            return kv__fail_engine(b, rc, "post_xfer: a region's key");
    }
    return MC_KV_SUCCESS;
}

/* An empty batch for the post: the previous one, once the engine let go of it. */
static mc_kv_status_t xfer_batch(mc_kv_backend_t *b, mc_kv_xfer_t *x)
{
    int rc;

    if (x->state == KV_X_POSTED && xfer_poll(b, x) == MC_KV_IN_PROG)
        return kv__fail(b, MC_KV_ERR_REPOST_ACTIVE,
                        "post_xfer: the previous post of this transfer is still in progress");
    /* (a reset that fails: the batch failed, and the engine still holds a task of it) */
    if (x->batch && (mc_batch_reset(x->batch) < 0 || x->batch_cap < x->n_reqs)) {
        mc_batch_release(x->batch);
        x->batch = NULL;
    }
    x->state = KV_X_PREPARED; /* the previous post is over: a refusal from here on leaves none */
    if (!x->batch) {
        x->batch_cap = x->n_reqs ? x->n_reqs : 1;
        if ((rc = mc_batch_create(b->engine, x->batch_cap, &x->batch)) < 0) {
            x->batch = NULL;
            return kv__fail_engine(b, rc, "post_xfer: batch");
        }
    }
    return MC_KV_SUCCESS;
}

mc_kv_status_t kv__post_xfer(mc_kv_backend_t *b, mc_kv_xfer_t *x, const void *notif, size_t len)
{
    mc_submit_opts_t opts = {.size = sizeof(opts)};
    mc_notify_req_t nr = {.target = MC_SEGMENT_INVALID};
    void *packed = NULL;
    mc_kv_status_t st;
    int rc;

    if (!x)
        return kv__fail(b, MC_KV_ERR_INVALID_PARAM, "post_xfer: NULL handle");
    if ((st = xfer_batch(b, x)))
        return st;
    if (!x->n_reqs) { /* only empty descriptors: nothing moves, the notification goes alone */
        st = notif ? kv__gen_notif(b, x->agent->name, notif, len) : MC_KV_SUCCESS;
        if (!st)
            x->state = KV_X_DONE;
        return st;
    }
    if ((st = keys_add(b, x)))
        return st;
    if (notif) {
        if ((st = kv__notif_pack(b, notif, len, &packed, &nr.len)))
            return st;
        nr.target = x->agent->seg;
        nr.msg = packed;
        opts.notify = &nr;
    }
    rc = mc_batch_submit_ex(x->batch, x->reqs, x->n_reqs, &opts);
    free(packed);
    if (rc < 0) /* nothing was submitted */
        return kv__fail_engine(b, rc, "post_xfer");
    x->state = KV_X_POSTED;
    x->fast_checks = 0; /* a new post: spinning is told anew */
    return xfer_poll(b, x);
}

/* Release aborts only what needs it (NIXL's releaseReqH): the batch's tasks not final are
 * canceled, and the engine then drops the notification; a post whose tasks all completed keeps
 * it, since its data is all in place, whether or not a check saw that (the engine sends it when
 * it lets go of the last task, which may be after this release). NIXL's UCX backend sends it
 * only from a check that sees the end, so there a release before that check drops it, and a
 * target waits for data that is there; ours goes whether or not the host polls. */
mc_kv_status_t kv__release_xfer(mc_kv_backend_t *b, mc_kv_xfer_t *x)
{
    if (!x)
        return kv__fail(b, MC_KV_ERR_INVALID_PARAM, "release_xfer: NULL handle");
    pthread_mutex_lock(&b->lock);
    if (x->prev)
        x->prev->next = x->next;
    else
        b->xfers = x->next;
    if (x->next)
        x->next->prev = x->prev;
    pthread_mutex_unlock(&b->lock);
    xfer_agent_put(x);
    if (!xfer_spare(b, x))
        xfer_free(x);
    return MC_KV_SUCCESS;
}

void kv__xfers_release_all(mc_kv_backend_t *b)
{
    while (b->xfers)
        kv__release_xfer(b, b->xfers);
    while (b->spare) {
        mc_kv_xfer_t *x = b->spare;
        b->spare = x->next;
        xfer_free(x);
    }
    b->n_spare = 0;
}
