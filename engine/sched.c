/* The scheduler: cuts tasks into slices lazily, as connections have room, so memory follows
 * what is in flight rather than what was submitted; completes, retries and times out work.
 * Everything here runs in the progress context. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "transport/transport.h"

#define SLICE_CHUNK 256

mc_slice_t *mc__slice_alloc(mc_engine_t *e)
{
    mc_slice_t *s = e->slice_free;

    if (!s) {
        /* Out-of-line growth; the fast path is a pop from the free list. The first slot of
         * each chunk links the chunks together for mc__sched_fini. */
        mc_slice_t *chunk = calloc(SLICE_CHUNK, sizeof(*chunk));
        if (!chunk)
            return NULL;
        chunk[0].next_free = e->slice_chunks;
        e->slice_chunks = chunk;
        for (int i = 1; i < SLICE_CHUNK; i++) {
            chunk[i].next_free = e->slice_free;
            e->slice_free = &chunk[i];
        }
        s = e->slice_free;
    }
    e->slice_free = s->next_free;
    memset(s, 0, sizeof(*s));
    mc_list_init(&s->link);
    return s;
}

void mc__slice_free(mc_engine_t *e, mc_slice_t *s)
{
    if (s->payload_owned)
        free(s->payload);
    s->next_free = e->slice_free;
    e->slice_free = s;
}

void mc__sched_fini(mc_engine_t *e)
{
    while (e->slice_chunks) {
        mc_slice_t *chunk = e->slice_chunks;
        e->slice_chunks = chunk[0].next_free;
        free(chunk);
    }
    e->slice_free = NULL;
}

void mc__peer_activate(mc_engine_t *e, mc_peer_t *p)
{
    if (!p->active) {
        p->active = true;
        mc_list_push_back(&e->active_peers, &p->active_link);
    }
}

void mc__sched_route(mc_engine_t *e, mc_task_t *t)
{
    mc_list_push_back(&e->active_tasks, &t->alink);
    if (t->peer->state == MC_SEGMENT_DEAD) /* it died after the submit looked */
        mc__task_finish(t, MC_TASK_FAILED, -MC_EPEERDEAD, "%s", t->peer->dead_reason);
    if (atomic_load(&t->state) >= MC_TASK_COMPLETED) { /* canceled before we saw it */
        t->queued = false;
        mc__task_maybe_release(e, t);
        return;
    }
    if (t->rbuf == MC_RBUF_NONE) { /* its range is not in the descriptor we have */
        mc__peer_park(e, t);
        return;
    }
    mc_list_push_back(&t->peer->q[t->tp].pending, &t->qlink);
    mc__peer_activate(e, t->peer);
}

static void task_dequeue(mc_engine_t *e, mc_task_t *t)
{
    if (t->queued) {
        mc_list_del(&t->qlink);
        t->queued = false;
    }
    mc__task_maybe_release(e, t);
}

static void slice_release(mc_engine_t *e, mc_slice_t *s)
{
    mc_task_t *t = s->task;

    t->inflight--;
    mc__slice_free(e, s);
    mc__task_maybe_release(e, t);
}

mc_slice_t *mc__sched_next_slice(mc_engine_t *e, mc_peer_t *p, unsigned tp)
{
    const mc_transport_ops_t *ops = mc__transports[tp];
    uint64_t max = MC_TP_HAS(ops, slice_max) ? ops->slice_max(e, p) : e->cfg.slice_size;
    mc_list_t *n;
    mc_slice_t *s;
    mc_task_t *t;

    while ((n = mc_list_pop_front(&p->q[tp].retry))) {
        s = mc_container_of(n, mc_slice_t, link);
        if (atomic_load(&s->task->state) < MC_TASK_COMPLETED)
            return s;
        slice_release(e, s); /* its task ended meanwhile (timeout, cancel) */
    }
    while (!mc_list_empty(&p->q[tp].pending)) {
        t = mc_container_of(p->q[tp].pending.next, mc_task_t, qlink);
        if (atomic_load(&t->state) >= MC_TASK_COMPLETED) {
            task_dequeue(e, t);
            continue;
        }
        s = mc__slice_alloc(e);
        if (!s)
            return NULL;
        s->kind = MC_SL_DATA;
        s->tp = (uint8_t)tp;
        s->opcode = (uint8_t)t->req.opcode;
        s->task = t;
        s->offset = t->carved;
        s->len = (uint32_t)(t->req.length - t->carved < max ? t->req.length - t->carved : max);
        if (!t->carved) /* its clock starts with its first bytes */
            t->deadline_ns = mc__now_ns() + (uint64_t)t->timeout_ms * MC_MS;
        t->carved += s->len;
        t->inflight++;
        int waiting = MC_TASK_WAITING;
        atomic_compare_exchange_strong(&t->state, &waiting, MC_TASK_PENDING);
        if (t->carved == t->req.length)
            task_dequeue(e, t);
        return s;
    }
    return NULL;
}

mc_task_t *mc__sched_peek_task(mc_engine_t *e, mc_peer_t *p, unsigned tp)
{
    mc_list_t *n;

    /* What mc__sched_next_slice would drop goes now, so that the task seen is the one taken. */
    while ((n = p->q[tp].retry.next) != &p->q[tp].retry) {
        mc_slice_t *s = mc_container_of(n, mc_slice_t, link);
        if (atomic_load(&s->task->state) < MC_TASK_COMPLETED)
            return s->task;
        mc_list_del(n);
        slice_release(e, s);
    }
    while (!mc_list_empty(&p->q[tp].pending)) {
        mc_task_t *t = mc_container_of(p->q[tp].pending.next, mc_task_t, qlink);
        if (atomic_load(&t->state) < MC_TASK_COMPLETED)
            return t;
        task_dequeue(e, t);
    }
    return NULL;
}

const char *mc__sched_peek_location(mc_engine_t *e, mc_peer_t *p, unsigned tp)
{
    mc_task_t *t = mc__sched_peek_task(e, p, tp);

    return t ? t->lbuf->location : NULL;
}

void mc__sched_unslice(mc_peer_t *p, unsigned tp, mc_slice_t *s)
{
    mc_list_push_front(&p->q[tp].retry, &s->link);
}

/* s goes to its task's transport, which the task may have moved to since s was carved: a slice
 * another transport had (its private part is that one's) starts there afresh. */
static void slice_requeue(mc_slice_t *s)
{
    mc_task_t *t = s->task;

    if (s->tp != t->tp) {
        memset(s->priv, 0, sizeof(s->priv));
        s->rails_tried = 0;
        s->tp = t->tp;
    }
    mc_list_push_back(&t->peer->q[t->tp].retry, &s->link);
}

void mc__sched_move(mc_engine_t *e, mc_peer_t *p, unsigned tp)
{
    mc_list_t tasks, slices, *n;

    mc_list_init(&tasks);
    mc_list_init(&slices);
    mc_list_splice_back(&tasks, &p->q[tp].pending);
    mc_list_splice_back(&slices, &p->q[tp].retry);
    while ((n = mc_list_pop_front(&tasks))) {
        mc_task_t *t = mc_container_of(n, mc_task_t, qlink);
        if (atomic_load(&t->state) < MC_TASK_COMPLETED) {
            mc__task_move(e, t); /* (none other takes it: it stays, and waits) */
            mc_list_push_back(&p->q[t->tp].pending, &t->qlink);
        } else {
            t->queued = false;
            mc__task_maybe_release(e, t);
        }
    }
    while ((n = mc_list_pop_front(&slices))) {
        mc_slice_t *s = mc_container_of(n, mc_slice_t, link);
        mc_task_t *t = s->task;
        if (atomic_load(&t->state) >= MC_TASK_COMPLETED) {
            slice_release(e, s);
            continue;
        }
        if (t->tp == tp) /* carved whole: not among the tasks above */
            mc__task_move(e, t);
        slice_requeue(s);
    }
    mc__peer_activate(e, p);
}

static bool has_slices(mc_peer_t *p, unsigned tp)
{
    return !mc_list_empty(&p->q[tp].pending) || !mc_list_empty(&p->q[tp].retry);
}

/* Whether transport tp has work for p: slices, or messages if it carries p's. */
static bool tp_has_work(mc_peer_t *p, unsigned tp)
{
    return has_slices(p, tp) || (tp == p->msg_tp && !mc_list_empty(&p->msgq));
}

void mc__sched_run(mc_engine_t *e)
{
    mc_list_t *pos, *tmp;

    mc_list_for_each_safe(pos, tmp, &e->active_peers)
    {
        mc_peer_t *p = mc_container_of(pos, mc_peer_t, active_link);
        bool work = p->desc_wanted;
        mc__peer_desc_ask(e, p);
        for (unsigned tp = 0; tp < mc__n_transports; tp++)
            if (p->tp[tp] && tp_has_work(p, tp) && MC_TP_HAS(mc__transports[tp], fill))
                mc__transports[tp]->fill(e, p);
        /* (after every fill: one may have moved its work to another, mc__sched_move) */
        for (unsigned tp = 0; tp < mc__n_transports && !work; tp++)
            work = tp_has_work(p, tp);
        if (!work) {
            mc_list_del(&p->active_link);
            p->active = false;
        }
    }
}

void mc__slice_sent(mc_engine_t *e, mc_slice_t *s)
{
    mc_task_t *t = s->task;

    if (s->sent || !t->on_sent)
        return;
    s->sent = true;
    t->sent += s->len;
    if (t->sent == t->req.length)
        mc_list_push_back(&e->sentq, &t->slink);
}

/* Whether the host was (or is about to be) told that t's local bytes are its own again: none
 * of them may be sent again. */
static bool sent_for_good(const mc_task_t *t)
{
    return t->on_sent && t->sent == t->req.length;
}

void mc__peer_count(const mc_task_t *t, int cnt, uint64_t v)
{
    if (!t->batch->internal)
        mc__count(&t->peer->c[cnt], v);
}

void mc__slice_done(mc_engine_t *e, mc_slice_t *s)
{
    mc_task_t *t = s->task;
    mc_peer_t *p = t->peer;
    int cnt = s->opcode == MC_READ ? MC_CNT_READ : MC_CNT_WRITTEN;

    mc__peer_count(t, cnt, s->len);
    mc__peer_count(t, MC_CNT_REQUESTS, 1);
    mc__tp_count(e, s->tp, cnt, s->len); /* (the one that moved it: its task may have moved) */
    mc__tp_count(e, s->tp, MC_CNT_REQUESTS, 1);
    p->last_done_ns[s->tp] = mc__now_ns();
    if (mc__task_add_bytes(t, s->len) == t->req.length)
        mc__task_finish(t, MC_TASK_COMPLETED, 0, NULL);
    slice_release(e, s);
}

/* "a->b, c->d": the rails a slice was tried on. */
static void paths_tried(const mc_peer_t *p, unsigned tp, uint32_t mask, char *buf, size_t size)
{
    const mc_rail_set_t *rails = &p->rails[tp];
    size_t n = 0;

    buf[0] = 0;
    for (unsigned i = 0; i < rails->n && n < size; i++)
        if (mask & (1u << i))
            n += (size_t)snprintf(buf + n, size - n, "%s%s", n ? ", " : "", rails->v[i]->name);
    if (!buf[0])
        snprintf(buf, size, "no path");
}

void mc__sched_stop_carving(mc_engine_t *e, mc_task_t *t)
{
    task_dequeue(e, t);
}

/* t is about to fail or time out: the transports make sure that nothing more of its slices still
 * in flight lands in its local memory (transport.h, abandon). */
void mc__sched_abandon(mc_engine_t *e, mc_task_t *t)
{
    if (atomic_load(&t->state) >= MC_TASK_COMPLETED) /* ended before: done then */
        return;
    for (unsigned i = 0; i < mc__n_transports; i++)
        if (e->tp[i] && MC_TP_HAS(mc__transports[i], abandon))
            mc__transports[i]->abandon(e, t);
}

void mc__slice_failed(mc_engine_t *e, mc_slice_t *s, int err, bool retryable, const char *reason)
{
    mc_task_t *t = s->task;
    mc_peer_t *p = t->peer;

    mc__peer_count(t, MC_CNT_ERRORS, 1);
    mc__tp_count(e, s->tp, MC_CNT_ERRORS, 1);
    if (retryable && sent_for_good(t)) {
        mc__task_finish(t, MC_TASK_FAILED, err,
                        "%s (%s; its bytes had been sent and the buffer given back: not sent "
                        "again)",
                        reason, mc_err_name(err));
        slice_release(e, s);
        return;
    }
    if (s->sent) { /* sent again: on_sent waits for that */
        s->sent = false;
        t->sent -= s->len;
    }
    if (atomic_load(&t->state) < MC_TASK_COMPLETED && retryable && s->attempts < e->cfg.retry_cnt) {
        s->attempts++;
        mc__peer_count(t, MC_CNT_RETRIES, 1);
        mc__tp_count(e, s->tp, MC_CNT_RETRIES, 1);
        slice_requeue(s);
        mc__peer_activate(e, p);
        return;
    }
    mc__sched_abandon(e, t);
    if (retryable) {
        char paths[512];
        paths_tried(p, s->tp, s->rails_tried, paths, sizeof(paths));
        mc__task_finish(t, MC_TASK_FAILED, err, "%s (%s; gave up after %u attempts over %s)",
                        reason, mc_err_name(err), s->attempts + 1, paths);
    } else
        mc__task_finish(t, MC_TASK_FAILED, err, "%s (%s)", reason, mc_err_name(err));
    slice_release(e, s);
}

void mc__sched_fail_peer(mc_engine_t *e, mc_peer_t *p, int err, const char *reason)
{
    mc_list_t *n;

    for (unsigned tp = 0; tp < mc__n_transports; tp++) {
        while ((n = mc_list_pop_front(&p->q[tp].retry))) {
            mc_slice_t *s = mc_container_of(n, mc_slice_t, link);
            mc__task_finish(s->task, MC_TASK_FAILED, err, "%s (%s)", reason, mc_err_name(err));
            slice_release(e, s);
        }
        while (!mc_list_empty(&p->q[tp].pending)) {
            mc_task_t *t = mc_container_of(p->q[tp].pending.next, mc_task_t, qlink);
            mc__task_finish(t, MC_TASK_FAILED, err, "%s (%s)", reason, mc_err_name(err));
            task_dequeue(e, t);
        }
    }
}

void mc__sched_cancel(mc_engine_t *e, mc_batch_t *b)
{
    size_t n = atomic_load(&b->n);

    /* Cleared first: a cancel that ends tasks after this look queues the batch again, rather
     * than find it still queued and leave a task it ended (one finishing while the progress
     * thread routed it) to nobody. */
    atomic_store(&b->cancel_kick, false);
    /* Those it routed (in e->active_tasks): what is still in the submission queue is seen
     * there, and what its submitter let go of is not ours. */
    for (size_t i = 0; i < n; i++) {
        mc_task_t *t = &b->tasks[i];
        if (!mc_list_empty(&t->alink) && !t->released &&
            atomic_load(&t->state) >= MC_TASK_COMPLETED)
            task_dequeue(e, t);
    }
    mc__batch_unbusy(b);
}

/* A task that started times out timeout_ms after its first bytes; one still waiting in its
 * queue only when, besides, its peer has completed nothing over its transport for as long
 * (waiting behind work that moves is not a fault). */
static bool task_late(const mc_task_t *t, uint64_t now)
{
    uint64_t limit = (uint64_t)t->timeout_ms * MC_MS;

    if (t->deadline_ns)
        return now >= t->deadline_ns;
    return now - t->queued_ns >= limit && now - t->peer->last_done_ns[t->tp] >= limit;
}

void mc__sched_timers(mc_engine_t *e, uint64_t now)
{
    mc_list_t *pos, *tmp;

    mc_list_for_each_safe(pos, tmp, &e->active_tasks)
    {
        mc_task_t *t = mc_container_of(pos, mc_task_t, alink);
        if (atomic_load(&t->state) >= MC_TASK_COMPLETED || !task_late(t, now))
            continue;
        mc__sched_abandon(e, t);
        if (mc__task_finish(t, MC_TASK_TIMEOUT, -MC_ETIMEOUT,
                            "not completed within %u ms %s (%llu of %llu bytes done)",
                            t->timeout_ms, t->deadline_ns ? "of its start" : "of no progress",
                            (unsigned long long)atomic_load(&t->bytes),
                            (unsigned long long)t->req.length))
            task_dequeue(e, t);
    }
}
