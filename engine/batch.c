/* Batches and tasks: the caller-facing half (submit, status, cancel, wait) and the task state
 * machine shared with the scheduler. */
#include <errno.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "msg.h"
#include "transport/transport.h"

/* mc_batch_wait in caller-progress mode: passes without sleeping this long after the last that
 * handled an event (a wake-up from poll costs tens of microseconds on a VM, a tcp round trip
 * less than twenty). */
#define WAIT_SPIN_NS (50 * 1000)

int mc_batch_create(mc_engine_t *e, size_t max_tasks, mc_batch_t **batch_p)
{
    mc_batch_t *b;

    if (!e || !batch_p || max_tasks == 0 || max_tasks > (1u << 26))
        return mc__set_error(-EINVAL, "mc_batch_create: need an engine and 1..2^26 tasks");
    b = calloc(1, sizeof(*b));
    if (!b)
        return mc__set_error(-ENOMEM, "out of memory");
    b->tasks = calloc(max_tasks, sizeof(*b->tasks));
    if (!b->tasks) {
        free(b);
        return mc__set_error(-ENOMEM, "out of memory for %zu tasks", max_tasks);
    }
    b->engine = e;
    b->cap = max_tasks;
    *batch_p = b;
    return 0;
}

/* Free the reasons of failed tasks (a batch that completed has none). */
static void batch_forget_tasks(mc_batch_t *b)
{
    if (atomic_load(&b->n_completed) == atomic_load(&b->n_final))
        return;
    for (size_t i = 0; i < atomic_load(&b->n); i++) {
        free(b->tasks[i].reason);
        b->tasks[i].reason = NULL;
    }
}

static void batch_free(mc_batch_t *b)
{
    batch_forget_tasks(b);
    free(b->tasks);
    free(b);
}

int mc_batch_destroy(mc_batch_t *b)
{
    if (!b)
        return 0;
    if (atomic_load(&b->busy))
        return mc__set_error(-EBUSY, "batch has %zu tasks still in flight", atomic_load(&b->busy));
    batch_free(b); /* busy 0 and not released: the engine holds nothing of it */
    return 0;
}

int mc_batch_reset(mc_batch_t *b)
{
    if (!b)
        return mc__set_error(-EINVAL, "mc_batch_reset: NULL batch");
    if (atomic_load(&b->busy))
        return mc__set_error(-EBUSY, "batch has %zu tasks still in flight", atomic_load(&b->busy));
    batch_forget_tasks(b);
    atomic_store(&b->n_final, 0);
    atomic_store(&b->n_completed, 0);
    atomic_store(&b->first_bad, 0);
    atomic_store(&b->bytes, 0);
    atomic_store_explicit(&b->n, 0, memory_order_release);
    return 0;
}

/* A released batch is freed by whoever takes its count to MC_BATCH_RELEASED alone: the host if
 * the engine holds nothing of it, else the engine with its last reference. One atomic decides,
 * and nobody touches the batch after giving up its part. */
void mc_batch_release(mc_batch_t *b)
{
    if (!b)
        return;
    mc_batch_cancel(b);
    if (atomic_fetch_or(&b->busy, MC_BATCH_RELEASED) == 0)
        batch_free(b);
}

bool mc__task_finish(mc_task_t *t, int state, int err, const char *fmt, ...)
{
    mc_batch_t *b = t->batch;
    int cur = atomic_load(&t->state), none = 0;
    va_list ap;

    do {
        if (cur >= MC_TASK_COMPLETED)
            return false;
    } while (!atomic_compare_exchange_weak(&t->state, &cur, MC_TASK_FINISHING));
    t->error = state == MC_TASK_COMPLETED ? 0 : err;
    if (fmt && state != MC_TASK_COMPLETED) { /* a reason is kept for a failure only */
        va_start(ap, fmt);
        if (vasprintf(&t->reason, fmt, ap) < 0)
            t->reason = NULL;
        va_end(ap);
    }
    if (state == MC_TASK_COMPLETED)
        atomic_fetch_add(&b->n_completed, 1);
    else
        atomic_compare_exchange_strong(&b->first_bad, &none, state);
    atomic_store_explicit(&t->state, state, memory_order_release);
    /* Sleepers are woken (at the end of the pass) only for a batch that just became final:
     * one wake per waited batch, not one per task. */
    if (atomic_fetch_add(&b->n_final, 1) + 1 >= atomic_load(&b->n) && atomic_load(&b->waited))
        atomic_store(&b->engine->finished_any, true);
    return true;
}

uint64_t mc__task_add_bytes(mc_task_t *t, uint64_t n)
{
    atomic_fetch_add_explicit(&t->batch->bytes, n, memory_order_relaxed);
    return atomic_fetch_add(&t->bytes, n) + n;
}

static void notify_group_done(mc_engine_t *e, mc_task_t *t)
{
    mc_notify_group_t *g = t->group;
    uint64_t seq = 0;

    if (atomic_load(&t->state) != MC_TASK_COMPLETED)
        g->failed = true;
    if (--g->left)
        return;
    if (!g->m) /* its target was dead at submit */
        ;
    else if (g->failed)
        mc__msg_unreserve(e, g->m);
    else
        seq = mc__msg_route(e, g->m); /* (a target that died meanwhile fails it there) */
    mc__flush_group_done(e, g, seq);
    free(g);
}

static void task_status_fill(mc_task_t *t, int state, mc_task_status_t *st)
{
    bool failed = state > MC_TASK_COMPLETED && state != MC_TASK_FINISHING;

    st->state = state == MC_TASK_FINISHING ? MC_TASK_PENDING : (mc_task_state_t)state;
    st->bytes = atomic_load(&t->bytes);
    st->reason = failed ? t->reason : NULL;
    st->error = failed ? t->error : 0;
}

void mc__task_maybe_release(mc_engine_t *e, mc_task_t *t)
{
    int state = atomic_load_explicit(&t->state, memory_order_acquire);

    if (t->released || t->queued || t->inflight || state < MC_TASK_COMPLETED ||
        state == MC_TASK_FINISHING)
        return;
    t->released = true;
    mc_list_del(&t->alink);
    mc_list_push_back(&e->releaseq, &t->alink);
    /* Nothing touches its local buffer any more: an unregister need not wait for the callbacks
     * (in a quiet pass they wait for the host, which may be the one unregistering, after
     * on_sent gave the buffer back). */
    if (t->lbuf)
        mc__mem_put(e, t->lbuf);
    t->lbuf = NULL;
}

/* Tell the host that t's local bytes are its own again (mc_submit_opts_t.on_sent). */
static void sent_fire(mc_task_t *t)
{
    mc_task_status_t st;

    mc_list_del(&t->slink);
    t->sent_fired = true;
    task_status_fill(t, atomic_load(&t->state), &st);
    t->on_sent(t->req.cb_arg, &st);
}

void mc__tasks_release(mc_engine_t *e)
{
    mc_list_t *n;

    while ((n = e->sentq.next) != &e->sentq)
        sent_fire(mc_container_of(n, mc_task_t, slink));
    while ((n = mc_list_pop_front(&e->releaseq))) {
        mc_task_t *t = mc_container_of(n, mc_task_t, alink);
        mc_task_status_t st;
        if (t->on_sent && !t->sent_fired) /* a transport that is done only when all is */
            sent_fire(t);
        if (t->ordered_counted)
            atomic_fetch_sub(&t->peer->ordered_busy, 1);
        if (t->group)
            notify_group_done(e, t);
        if (t->flush)
            mc__flush_task_done(e, t);
        if (t->req.cb) {
            task_status_fill(t, atomic_load(&t->state), &st);
            t->req.cb(t->req.cb_arg, &st);
        }
        atomic_fetch_sub(&t->peer->busy_tasks, 1);
        mc__batch_unbusy(t->batch); /* last: the caller may destroy the batch from here on */
    }
}

void mc__batch_unbusy_n(mc_batch_t *b, size_t n)
{
    if (atomic_fetch_sub(&b->busy, n) == (MC_BATCH_RELEASED | n))
        batch_free(b);
}

/* References taken (or let go of) by a run of tasks, added to (taken from) their objects once
 * per run rather than once per task: runs of 10^5 requests to one peer and one buffer are what
 * KV hosts submit. */
typedef struct ref_run {
    mc_engine_t *e;
    bool put; /* letting go */
    mc_peer_t *peer;
    unsigned peer_n;
    mc_buffer_t *buf;
    unsigned buf_n;
} ref_run_t;

static void run_flush_peer(ref_run_t *r)
{
    if (r->peer_n && r->put)
        atomic_fetch_sub(&r->peer->busy_tasks, r->peer_n);
    else if (r->peer_n)
        atomic_fetch_add(&r->peer->busy_tasks, r->peer_n);
    r->peer_n = 0;
}

static void run_flush_buf(ref_run_t *r)
{
    if (r->buf_n && r->put)
        mc__mem_put_n(r->e, r->buf, r->buf_n);
    else if (r->buf_n)
        atomic_fetch_add(&r->buf->refs, r->buf_n);
    r->buf_n = 0;
}

static void run_peer(ref_run_t *r, mc_peer_t *p)
{
    if (p != r->peer) {
        run_flush_peer(r);
        r->peer = p;
    }
    r->peer_n++;
}

static void run_buf(ref_run_t *r, mc_buffer_t *b)
{
    if (b != r->buf) {
        run_flush_buf(r);
        r->buf = b;
    }
    r->buf_n++;
}

static void run_flush(ref_run_t *r)
{
    run_flush_peer(r);
    run_flush_buf(r);
}

/* The local buffer holding [addr, addr+len), its reference counted in r, or NULL. Caller holds
 * mem.lock for reading, so that nothing leaves the table before r is flushed. (Each lookup
 * searches: with nested registrations, the innermost one holds the range, which a cache of the
 * last buffer found would miss.) */
static mc_buffer_t *run_lookup(ref_run_t *r, uint64_t addr, uint64_t len)
{
    mc_buffer_t *b = mc__mem_find_any_locked(r->e, addr, len);

    if (b)
        run_buf(r, b);
    return b;
}

/* Let go of what t holds (its local buffer, its peer's count), in r. */
static void run_let_go(ref_run_t *r, mc_task_t *t)
{
    if (t->lbuf)
        run_buf(r, t->lbuf);
    t->lbuf = NULL;
    run_peer(r, t->peer);
}

/* Check the requests, make their tasks from tmpl and take their references (peer, local
 * buffer). The two tables are read under their locks once for the whole call. Returns the
 * number validated: count on success, else the index of the first bad request (its reason set
 * in *rc_p). */
static size_t validate_requests(mc_engine_t *e, const mc_request_t *reqs, mc_task_t *tasks,
                                size_t count, const mc_task_t *tmpl, int *rc_p)
{
    ref_run_t run = {.e = e};
    size_t i;
    int rc = 0;

    pthread_rwlock_rdlock(&e->peers_lock);
    pthread_rwlock_rdlock(&e->mem.lock);
    for (i = 0; i < count && !rc; i++) {
        const mc_request_t *r = &reqs[i];
        mc_task_t *t = &tasks[i];
        memcpy(t, tmpl, sizeof(*t));
        t->req = *r;
        mc_list_init(&t->alink);
        mc_list_init(&t->slink);
        if (r->opcode != MC_WRITE)
            t->on_sent = NULL;
        if (r->opcode != MC_READ && r->opcode != MC_WRITE)
            rc = mc__set_error(-EINVAL, "request %zu: opcode %d is neither READ nor WRITE", i,
                               (int)r->opcode);
        else if (r->target_offset + r->length < r->target_offset)
            rc = mc__set_error(-EINVAL, "request %zu: 0x%llx+%llu wraps around", i,
                               (unsigned long long)r->target_offset, (unsigned long long)r->length);
        else if (!(t->peer = mc__peer_get(e, r->target)))
            rc = mc__set_error(-MC_ENOSEGMENT, "request %zu: segment id %u is not open", i,
                               r->target);
        else if (r->length && /* zero length: a no-op, nothing to check */
                 !(t->lbuf = run_lookup(&run, (uint64_t)(uintptr_t)r->local, r->length)))
            rc = mc__set_error(-EINVAL, "request %zu: local range %p+%llu is not registered", i,
                               r->local, (unsigned long long)r->length);
        else if (t->lbuf && t->lbuf->read_only && r->opcode == MC_READ) {
            run.buf_n--; /* (the reference run_lookup just counted) */
            t->lbuf = NULL;
            rc = mc__set_error(-EINVAL,
                               "request %zu: local range %p+%llu is mapped without write "
                               "permission: a READ cannot land in it",
                               i, r->local, (unsigned long long)r->length);
        } else
            run_peer(&run, t->peer);
    }
    run_flush(&run);
    pthread_rwlock_unlock(&e->mem.lock);
    pthread_rwlock_unlock(&e->peers_lock);
    *rc_p = rc;
    return rc ? i - 1 : count;
}

/* Why transport slot may not carry t: an end of it is an opaque buffer (a file) another
 * transport owns. NULL if it may. */
static const char *not_owner(const mc_task_t *t, const mc_desc_buffer_t *rb, unsigned slot)
{
    if ((t->lbuf->owner && t->lbuf->owner != slot + 1) || (rb->owner && rb->owner != slot + 1))
        return "an end is not memory, and only the transport that owns it moves it";
    return NULL;
}

/* Give t to the first transport from position k of its peer's order that accepts it. Caller
 * holds peers_lock for reading; rb is t's remote buffer. If none does: false, and t failed (with
 * every transport's reason) unless keep (then left as it was). */
static bool route_from(mc_engine_t *e, mc_task_t *t, const mc_desc_buffer_t *rb, unsigned k,
                       bool keep)
{
    mc_peer_t *p = t->peer;
    const char *no[MC_TP_MAX]; /* why each transport from k refused (static strings) */
    char why[512];
    size_t n = 0;
    /* While ORDERED tasks are in flight on a transport that keeps them in order, the next
     * ones go there too if it takes them (the first pass), so that they stay behind. */
    unsigned pass = t->ordered && atomic_load(&p->ordered_busy) ? 0 : 1;

    for (; pass < 2; pass++)
        for (unsigned i = k; i < p->n_order; i++) {
            const mc_transport_ops_t *ops = mc__transports[p->order[i]];
            if (pass == 0 && !(ops->flags & MC_TP_ORDERED))
                continue;
            no[i] = not_owner(t, rb, p->order[i]);
            if (!no[i])
                no[i] = MC_TP_HAS(ops, accept) ? ops->accept(e, t, rb) : NULL;
            if (!no[i]) {
                t->tp = p->order[i];
                if (t->ordered && (ops->flags & MC_TP_ORDERED) && !t->ordered_counted) {
                    t->ordered_counted = true;
                    atomic_fetch_add(&p->ordered_busy, 1);
                }
                return true;
            }
        }
    if (keep)
        return false;
    /* Every one refused: only now is the message worth its snprintf (a transport before the
     * one that takes a task may refuse each of 10^5 of them). */
    why[0] = 0;
    for (unsigned i = k; i < p->n_order && n < sizeof(why); i++)
        n += (size_t)snprintf(why + n, sizeof(why) - n, "%s%s: %s", n ? "; " : "",
                              mc__transports[p->order[i]]->name, no[i]);
    mc__task_finish(t, MC_TASK_FAILED, -MC_ENODEV, "no transport to segment %s can carry it (%s)",
                    p->name, why[0] ? why : "none reaches it");
    return false;
}

/* t goes with entry b of d. */
static void rbuf_note(mc_task_t *t, const mc_desc_t *d, const mc_desc_buffer_t *b)
{
    t->rbuf = (uint32_t)(b - d->buffers);
    t->rbuf_layout = d->layout;
    t->rbuf_addr = b->addr;
    t->rbuf_len = b->len;
    t->rbuf_serial = b->serial;
}

const mc_desc_buffer_t *mc__task_rbuf(const mc_desc_t *d, mc_task_t *t)
{
    const mc_desc_buffer_t *b = NULL;

    if (t->rbuf != MC_RBUF_NONE && t->rbuf_layout == d->layout && t->rbuf < d->n_buffers)
        return &d->buffers[t->rbuf];
    if (t->rbuf != MC_RBUF_NONE)
        b = mc__desc_entry(d, t->rbuf_addr, t->rbuf_len, t->rbuf_serial);
    if (!b)
        b = mc__desc_find(d, t->req.target_offset, t->req.length);
    if (b)
        rbuf_note(t, d, b);
    return b;
}

/* Route t after its remote range is looked up in its peer's descriptor. Caller holds peers_lock
 * for reading. A range the descriptor lacks leaves t unrouted (rbuf MC_RBUF_NONE): it waits on
 * its peer while the descriptor is asked for (the peer may have registered memory since). */
static void route_one(mc_engine_t *e, mc_task_t *t)
{
    mc_peer_t *p = t->peer;
    const mc_desc_buffer_t *b;

    if (p->state == MC_SEGMENT_DEAD) {
        mc__task_finish(t, MC_TASK_FAILED, -MC_EPEERDEAD, "%s", p->dead_reason);
        return;
    }
    b = mc__desc_find(&p->desc, t->req.target_offset, t->req.length);
    t->tp = (uint8_t)e->ctrl;
    t->vram = t->lbuf->vram || (b && !strncmp(b->location, "cuda:", 5));
    t->rbuf = MC_RBUF_NONE;
    if (b)
        rbuf_note(t, &p->desc, b);
    if (b && b->read_only && t->req.opcode == MC_WRITE)
        mc__task_finish(t, MC_TASK_FAILED, -MC_EACCESS,
                        "remote range 0x%llx+%llu: segment %s maps it without write permission: it "
                        "may only be read",
                        (unsigned long long)t->req.target_offset, (unsigned long long)t->req.length,
                        p->name);
    else if (b)
        route_from(e, t, b, 0, false);
}

/* Route every task of a submit (one lock for the batch). Every remote range must lie inside
 * one buffer of the peer's descriptor, so that a request is refused whole rather than partly
 * applied slice by slice; the owner still checks each slice, since our copy of its descriptor
 * may be older than an unregister. */
static void route(mc_engine_t *e, mc_task_t *tasks, size_t n)
{
    pthread_rwlock_rdlock(&e->peers_lock);
    for (size_t i = 0; i < n; i++)
        if (!tasks[i].req.length) /* a no-op: done */
            mc__task_finish(&tasks[i], MC_TASK_COMPLETED, 0, NULL);
        else if (atomic_load(&tasks[i].state) == MC_TASK_WAITING)
            route_one(e, &tasks[i]);
    pthread_rwlock_unlock(&e->peers_lock);
}

void mc__task_route_late(mc_engine_t *e, mc_task_t *t)
{
    const mc_transport_ops_t *ops;

    pthread_rwlock_rdlock(&e->peers_lock);
    route_one(e, t);
    pthread_rwlock_unlock(&e->peers_lock);
    if (atomic_load(&t->state) != MC_TASK_WAITING)
        return;
    if (t->rbuf == MC_RBUF_NONE) {
        mc__task_finish(t, MC_TASK_FAILED, -MC_EACCESS,
                        "remote range 0x%llx+%llu is not inside a buffer registered by segment %s",
                        (unsigned long long)t->req.target_offset, (unsigned long long)t->req.length,
                        t->peer->name);
        return;
    }
    ops = mc__transports[t->tp];
    if (MC_TP_HAS(ops, submit)) /* it moves data in the caller's thread: this one */
        ops->submit(e, t, 1);
}

/* mc__task_reroute; keep: mc__task_move. */
static bool reroute(mc_engine_t *e, mc_task_t *t, bool keep)
{
    const mc_peer_t *p = t->peer;
    unsigned k = 0;
    bool moved = false;

    pthread_rwlock_rdlock(&e->peers_lock);
    while (k < p->n_order && p->order[k] != t->tp)
        k++;
    const mc_desc_buffer_t *b = mc__task_rbuf(&p->desc, t);
    if (b)
        moved = route_from(e, t, b, k + 1, keep);
    else if (!keep)
        mc__task_finish(t, MC_TASK_FAILED, -MC_EACCESS,
                        "remote range is no longer registered by segment %s", p->name);
    pthread_rwlock_unlock(&e->peers_lock);
    return moved;
}

void mc__task_reroute(mc_engine_t *e, mc_task_t *t)
{
    reroute(e, t, false);
}

bool mc__task_move(mc_engine_t *e, mc_task_t *t)
{
    return reroute(e, t, true);
}

/* Transports that move data in the submitting thread take their tasks now. */
static void submit_now(mc_engine_t *e, mc_task_t *tasks, size_t n)
{
    for (unsigned i = 0; i < mc__n_transports; i++)
        if (e->tp[i] && MC_TP_HAS(mc__transports[i], submit))
            mc__transports[i]->submit(e, tasks, n);
}

/* Whether the submitting thread may let go of t itself: it ended there (moved by a transport
 * that moves in the caller's thread, or refused) and wants nothing of the progress thread,
 * which has not seen it: no callback, notification, on_sent or ordered count. */
static bool done_here(const mc_task_t *t)
{
    int state = atomic_load_explicit(&t->state, memory_order_acquire);

    return state >= MC_TASK_COMPLETED && state != MC_TASK_FINISHING && !t->req.cb && !t->group &&
           !t->on_sent && !t->ordered_counted;
}

/* The tasks of a submit go to the progress thread, but for those done_here: they are let go of
 * here, their references a run at a time. A same-host submit of 10^5 tasks ends in this thread,
 * and the progress thread would walk them all once more only to let go. Such a task never joins
 * e->active_tasks, which is what the progress thread looks at (a flush, a cancel). */
static void hand_over(mc_engine_t *e, mc_batch_t *b, mc_task_t *tasks, size_t n)
{
    ref_run_t run = {.e = e, .put = true};
    size_t done = 0;
    mc_list_t q;

    mc_list_init(&q);
    for (size_t i = 0; i < n; i++) {
        mc_task_t *t = &tasks[i];
        if (!done_here(t)) {
            mc_list_push_back(&q, &t->qlink);
            continue;
        }
        t->queued = false;
        t->released = true;
        run_let_go(&run, t);
        done++;
    }
    run_flush(&run);
    if (!mc_list_empty(&q)) {
        pthread_mutex_lock(&e->sub_lock);
        mc_list_splice_back(&e->subq, &q);
        mc__sub_mark(e);
        pthread_mutex_unlock(&e->sub_lock);
    }
    if (done)
        mc__batch_unbusy_n(b, done);
}

static void unwind_requests(mc_engine_t *e, mc_task_t *tasks, size_t count)
{
    ref_run_t run = {.e = e, .put = true};

    for (size_t i = 0; i < count; i++)
        run_let_go(&run, &tasks[i]);
    run_flush(&run);
}

/* The submit's notification, made once its requests are valid: they are submitted only if it
 * has its place in the target's window (else -EAGAIN), so that it is never refused once its
 * data landed. A target that is dead already never gets it (as its tasks, if it is theirs). */
static int make_group(mc_engine_t *e, const mc_notify_req_t *n, size_t count,
                      mc_notify_group_t **g_p)
{
    mc_notify_group_t *g;
    int rc;

    *g_p = NULL;
    if (!n)
        return 0;
    g = calloc(1, sizeof(*g));
    if (!g)
        return mc__set_error(-ENOMEM, "out of memory");
    rc = mc__msg_reserve(e, n->target, n->msg, n->len, &g->m);
    if (rc && rc != -MC_EPEERDEAD) {
        free(g);
        return rc;
    }
    g->target = n->target;
    g->left = (unsigned)count;
    g->failed = rc != 0;
    *g_p = g;
    return 0;
}

/* The options of a submit, checked: defaults for what the caller's (older, smaller) struct
 * lacks. */
static int submit_opts(mc_engine_t *e, const mc_submit_opts_t *in, mc_submit_opts_t *out)
{
    memset(out, 0, sizeof(*out));
    if (in) {
        if (in->size < offsetof(mc_submit_opts_t, notify) || in->size > sizeof(*out))
            return mc__set_error(-EINVAL, "mc_submit_opts_t.size is %zu, expected %zu", in->size,
                                 sizeof(*out));
        memcpy(out, in, in->size);
    }
    if (out->flags & ~MC_SUBMIT_ORDERED)
        return mc__set_error(-EINVAL, "mc_submit_opts_t.flags 0x%x: unknown flags", out->flags);
    if (!out->timeout_ms)
        out->timeout_ms = e->cfg.transfer_timeout_ms;
    return 0;
}

int mc_batch_submit_ex(mc_batch_t *b, const mc_request_t *reqs, size_t count,
                       const mc_submit_opts_t *opts)
{
    mc_submit_opts_t o;
    mc_engine_t *e;
    mc_notify_group_t *g = NULL;
    size_t first, i;
    int rc = 0;

    if (!b || (!reqs && count))
        return mc__set_error(-EINVAL, "mc_batch_submit: NULL argument");
    e = b->engine;
    first = atomic_load(&b->n);
    if (count == 0 || count > b->cap - first)
        return mc__set_error(-EINVAL, "mc_batch_submit: %zu requests, %zu slots left", count,
                             b->cap - first);
    rc = submit_opts(e, opts, &o);
    if (rc)
        return rc;
    MC_LOG_SCOPE(e->cfg.log_level);
    mc_task_t *tasks = &b->tasks[first];
    const mc_task_t tmpl = {
        .batch = b,
        .queued_ns = mc__now_ns(),
        .timeout_ms = o.timeout_ms,
        .queued = true,
        .ordered = o.flags & MC_SUBMIT_ORDERED,
        .on_sent = o.on_sent, /* WRITEs only */
    };
    i = validate_requests(e, reqs, tasks, count, &tmpl, &rc); /* (count when all are valid) */
    if (!rc) {
        rc = make_group(e, o.notify, count, &g);
        if (rc == -EAGAIN && !mc__in_progress() && mc__progress_implicit(e))
            rc = make_group(e, o.notify, count, &g); /* the pass took answers in */
    }
    if (rc) {
        unwind_requests(e, tasks, i); /* the i requests validated so far */
        return rc;
    }
    for (i = 0; g && i < count; i++)
        tasks[i].group = g;
    /* Counted before any of them can end (a poller must never see more final than there are
     * tasks), then ended at once where they can. */
    atomic_fetch_add(&b->busy, count);
    atomic_store_explicit(&b->n, first + count, memory_order_release);
    route(e, tasks, count);
    submit_now(e, tasks, count);
    hand_over(e, b, tasks, count);
    mc__doorbell(e); /* also to wake a waiter of what ended here */
    mc__progress_implicit(e);
    return 0;
}

int mc_batch_submit(mc_batch_t *b, const mc_request_t *reqs, size_t count,
                    const mc_notify_req_t *notify)
{
    mc_submit_opts_t o = {.size = sizeof(o), .notify = notify};

    return mc_batch_submit_ex(b, reqs, count, &o);
}

int mc_task_status(mc_batch_t *b, size_t index, mc_task_status_t *st)
{
    if (!b || !st)
        return mc__set_error(-EINVAL, "mc_task_status: NULL argument");
    if (index >= atomic_load_explicit(&b->n, memory_order_acquire))
        return mc__set_error(-EINVAL, "mc_task_status: no task %zu", index);
    mc__progress_implicit(b->engine);
    mc_task_t *t = &b->tasks[index];
    task_status_fill(t, atomic_load_explicit(&t->state, memory_order_acquire), st);
    return 0;
}

/* From the batch's counters: constant time whatever its size. */
int mc_batch_status(mc_batch_t *b, mc_batch_status_t *st)
{
    size_t n, final;

    if (!b || !st)
        return mc__set_error(-EINVAL, "mc_batch_status: NULL argument");
    mc__progress_implicit(b->engine);
    n = atomic_load_explicit(&b->n, memory_order_acquire);
    final = atomic_load(&b->n_final);
    memset(st, 0, sizeof(*st));
    st->tasks = n;
    st->completed = atomic_load(&b->n_completed);
    st->failed = final - st->completed;
    st->bytes = atomic_load(&b->bytes);
    if (final < n || n == 0)
        st->state = MC_TASK_PENDING;
    else
        st->state = atomic_load(&b->first_bad) ? (mc_task_state_t)atomic_load(&b->first_bad)
                                               : MC_TASK_COMPLETED;
    return 0;
}

int mc_batch_cancel(mc_batch_t *b)
{
    mc_engine_t *e;
    size_t n;

    if (!b)
        return mc__set_error(-EINVAL, "mc_batch_cancel: NULL batch");
    e = b->engine;
    n = atomic_load_explicit(&b->n, memory_order_acquire);
    for (size_t i = 0; i < n; i++)
        mc__task_finish(&b->tasks[i], MC_TASK_CANCELED, -MC_ECANCELED, "canceled by the caller");
    /* Hand the batch to progress so it drops queued tasks; the kick counts as busy so the
     * batch cannot be destroyed while it sits in the queue. */
    pthread_mutex_lock(&e->sub_lock);
    if (!atomic_exchange(&b->cancel_kick, true)) {
        atomic_fetch_add(&b->busy, 1);
        mc_list_push_back(&e->cancelq, &b->cancel_link);
        mc__sub_mark(e);
    }
    pthread_mutex_unlock(&e->sub_lock);
    mc__doorbell(e);
    mc__progress_implicit(e);
    return 0;
}

static bool batch_final(mc_batch_t *b)
{
    return atomic_load(&b->n_final) >= atomic_load(&b->n);
}

int mc_batch_wait(mc_batch_t *b, int timeout_ms)
{
    mc_engine_t *e;
    uint64_t deadline;

    if (!b)
        return mc__set_error(-EINVAL, "mc_batch_wait: NULL batch");
    if (mc__in_progress()) /* the tasks end in passes, and this one would not end first */
        return mc__set_error(-EDEADLK, "mc_batch_wait from a callback: poll the batch instead");
    e = b->engine;
    if (timeout_ms < 0)
        timeout_ms = (int)e->cfg.transfer_timeout_ms + 5000;
    uint64_t moved_ns = mc__now_ns();
    deadline = moved_ns + (uint64_t)timeout_ms * MC_MS;
    while (!batch_final(b)) {
        uint64_t now = mc__now_ns();
        if (now >= deadline)
            return mc__set_error(-MC_ETIMEOUT, "batch not final after %d ms", timeout_ms);
        unsigned left_ms = (unsigned)((deadline - now + MC_MS - 1) / MC_MS);
        if (!e->has_thread) { /* sleeps only after WAIT_SPIN_NS without an event */
            struct pollfd pfd = {.fd = e->epfd, .events = POLLIN};
            if (mc__progress_try(e) > 0)
                moved_ns = now;
            else if (now - moved_ns >= WAIT_SPIN_NS && mc__progress_may_sleep(e))
                poll(&pfd, 1, left_ms < 10 ? (int)left_ms : 10);
            continue;
        }
        struct timespec ts;
        /* bounded: guards against a missed wake-up; and no later than the deadline */
        mc__abstime_in(&ts, left_ms < 20 ? left_ms : 20);
        /* waited before the look at the batch, as mc__task_finish counts before it looks at
         * waited: one of the two sees the other. */
        atomic_fetch_add(&b->waited, 1);
        atomic_fetch_add(&e->waiters, 1);
        pthread_mutex_lock(&e->done_lock);
        if (!batch_final(b))
            pthread_cond_timedwait(&e->done_cond, &e->done_lock, &ts);
        pthread_mutex_unlock(&e->done_lock);
        atomic_fetch_sub(&e->waiters, 1);
        atomic_fetch_sub(&b->waited, 1);
    }
    return 0;
}
