/* Host callbacks held until the end of the progress pass (see callbacks.h). */
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "callbacks.h"
#include "engine_int.h"
#include "msg.h"
#include "task.h"

enum { HELD_MSG, HELD_EVENT, HELD_DONE, HELD_MARK };

typedef struct held {
    mc_list_t link;
    int kind;
    uint8_t msg_id;
    mc_segment_id_t peer;
    int event, error;
    mc_done_cb done;
    void *done_arg;
    const char *from;     /* the message's sender: sender[], or in the ring that lent it */
    const void *msg;      /* the message: data[], or in the ring that lent it */
    mc_ring_lend_t *lend; /* that ring's loans, or NULL */
    uint64_t end;         /* where its record ends in that ring */
    mc_msg_tell_t tell;   /* a message whose sender waits for its handler (tell.stream != 0) */
    size_t len;
    size_t size; /* as allocated (e->held_bufs) */
    char sender[MC_NAME_MAX];
    char data[]; /* a copied message, or the event's reason (NUL-terminated) */
} held_t;

static const char *const kind_name[] = {"message", "peer event", "completion", "mark"};

/* A record for len bytes of payload. */
static held_t *held_new(mc_engine_t *e, int kind, const void *data, size_t len)
{
    held_t *h = mc_buf_alloc(&e->held_bufs, sizeof(*h) + len + 1);

    if (!h) {
        if (kind == HELD_MSG || kind == HELD_EVENT) /* (the others' callers keep them) */
            mc_error("a %s was dropped: out of memory", kind_name[kind]);
        return NULL;
    }
    h->size = sizeof(*h) + len + 1;
    h->kind = kind;
    h->len = len;
    h->from = h->sender;
    h->msg = h->data;
    h->lend = NULL;
    h->tell.stream = 0;
    if (len)
        memcpy(h->data, data, len);
    h->data[len] = 0;
    mc_list_push_back(&e->heldq, &h->link);
    return h;
}

static void held_free(mc_engine_t *e, held_t *h)
{
    mc_buf_free(&e->held_bufs, h, h->size);
}

int mc__cb_hold_msg(mc_engine_t *e, const char *sender, uint8_t id, const void *data, size_t len,
                    mc_ring_lend_t *lend, uint64_t end, const mc_msg_tell_t *tell)
{
    if (e->n_held_msgs >= MC_MSG_WINDOW) {
        e->rx_held_full = true;
        return -EAGAIN;
    }
    /* Ahead of everything held, it runs first: only while nothing is. */
    if (lend && e->n_quick < MC_QUICK_MAX && mc_list_empty(&e->heldq)) {
        e->quick[e->n_quick++] = (mc_quick_t){
            .from = sender, .msg = data, .len = len, .lend = lend, .end = end, .id = id};
        lend->n++;
        e->n_held_msgs++;
        return 0;
    }
    held_t *h = held_new(e, HELD_MSG, data, lend ? 0 : len);
    if (!h)
        return -EAGAIN;
    h->msg_id = id;
    if (lend) {
        h->len = len;
        h->msg = data;
        h->from = sender;
        h->lend = lend;
        h->end = end;
        lend->n++;
    } else {
        mc__copy_name(h->sender, sender);
        if (tell)
            h->tell = *tell;
    }
    e->n_held_msgs++;
    return 0;
}

int mc__cb_hold_mark(mc_engine_t *e, const mc_msg_tell_t *tell)
{
    held_t *h = held_new(e, HELD_MARK, NULL, 0);

    if (!h)
        return -EAGAIN;
    h->tell = *tell;
    return 0;
}

void mc__cb_unhold_mark(mc_engine_t *e)
{
    held_t *h = mc_container_of(e->heldq.prev, held_t, link);

    mc_list_del(&h->link);
    held_free(e, h);
}

bool mc__cb_hold_done(mc_engine_t *e, mc_done_cb cb, void *arg, int status)
{
    held_t *h = held_new(e, HELD_DONE, NULL, 0);

    if (h) {
        h->done = cb;
        h->done_arg = arg;
        h->error = status;
    }
    return h != NULL;
}

void mc__cb_hold_event(mc_engine_t *e, mc_segment_id_t id, int event, int error, const char *why)
{
    held_t *h = held_new(e, HELD_EVENT, why ? why : "", why ? strlen(why) : 0);

    if (h) {
        h->peer = id;
        h->event = event;
        h->error = error;
    }
}

void mc__handler_set(mc_engine_t *e, unsigned id, mc_msg_cb mcb, mc_peer_cb pcb, void *arg)
{
    pthread_mutex_lock(&e->handlers_lock); /* one setter at a time */
    unsigned seq = atomic_load_explicit(&e->handlers_seq, memory_order_relaxed);
    atomic_store_explicit(&e->handlers_seq, seq + 1, memory_order_relaxed); /* odd: writing */
    atomic_thread_fence(memory_order_release);
    if (id) {
        atomic_store_explicit(&e->handlers[id], mcb, memory_order_relaxed);
        atomic_store_explicit(&e->handler_args[id], arg, memory_order_relaxed);
    } else {
        atomic_store_explicit(&e->peer_cb, pcb, memory_order_relaxed);
        atomic_store_explicit(&e->peer_cb_arg, arg, memory_order_relaxed);
    }
    atomic_store_explicit(&e->handlers_seq, seq + 2, memory_order_release);
    pthread_mutex_unlock(&e->handlers_lock);
}

/* Read the handler of message id (1..255) or, id 0, the peer handler, with its argument. */
static void handler_get(mc_engine_t *e, unsigned id, mc_msg_cb *mcb, mc_peer_cb *pcb, void **arg)
{
    /* A pair a setter is writing, or wrote meanwhile, is read again. */
    for (unsigned tries = 0;; tries++) {
        if (tries >= 64)
            sched_yield(); /* its setter was descheduled between its two stores */
        unsigned seq = atomic_load_explicit(&e->handlers_seq, memory_order_acquire);
        if (id) {
            *mcb = atomic_load_explicit(&e->handlers[id], memory_order_relaxed);
            *arg = atomic_load_explicit(&e->handler_args[id], memory_order_relaxed);
        } else {
            *pcb = atomic_load_explicit(&e->peer_cb, memory_order_relaxed);
            *arg = atomic_load_explicit(&e->peer_cb_arg, memory_order_relaxed);
        }
        atomic_thread_fence(memory_order_acquire);
        if (!(seq & 1) && seq == atomic_load_explicit(&e->handlers_seq, memory_order_relaxed))
            return;
    }
}

static void run_msg(mc_engine_t *e, uint8_t id, const char *from, const void *msg, size_t len)
{
    mc_msg_cb mcb;
    void *arg;

    handler_get(e, id, &mcb, NULL, &arg);
    if (mcb)
        mcb(arg, from, id, msg, len);
    else
        mc_warn("message id %u from %s dropped: no handler", id, from);
}

/* What acknowledges a message whose handler ran (or, kept, was released). */
struct mc_ran {
    mc_ring_lend_t *lend; /* the ring that lent it, or NULL */
    uint64_t end;
    mc_msg_tell_t tell; /* its sender waits to hear (tell.stream != 0) */
};

/* A message acknowledged in order behind one kept by its handler (mc_msg_keep), or that one
 * (its address is its token). Acknowledgements say "up to here" (a ring's position, a stream's
 * number): one may not pass a message kept before it on the same ring or stream (its channel;
 * others go their way: a UCX worker that stops progressing holds back only its own peers). */
typedef struct kept {
    mc_list_t link; /* in e->kept, oldest first */
    struct mc_ran r;
    atomic_bool released;
} kept_t;

static void ack(mc_engine_t *e, const struct mc_ran *r)
{
    if (r->lend) { /* its ring gets the record back */
        r->lend->returned = r->end;
        r->lend->n--;
        mc__reap_mark(e, r->lend->slot);
    }
    if (r->tell.stream)
        mc__msg_ran(e, &r->tell);
}

/* What r's acknowledgement moves: its ring, or its stream. */
static uint64_t channel(const struct mc_ran *r)
{
    return r->lend ? (uint64_t)(uintptr_t)r->lend : r->tell.stream;
}

/* Whether a message of r's channel waits in e->kept (r must not pass it). */
static bool channel_held(mc_engine_t *e, const struct mc_ran *r)
{
    uint64_t ch = channel(r);

    for (mc_list_t *pos = e->kept.next; pos != &e->kept; pos = pos->next)
        if (channel(&mc_container_of(pos, kept_t, link)->r) == ch)
            return true;
    return false;
}

/* Queue r behind the messages kept (released: nothing else holds it back). */
static kept_t *kept_add(mc_engine_t *e, const struct mc_ran *r, bool released)
{
    kept_t *k = mc_buf_alloc(&e->held_bufs, sizeof(*k));

    if (!k)
        return NULL;
    k->r = *r;
    atomic_init(&k->released, released);
    mc_list_push_back(&e->kept, &k->link);
    return k;
}

/* A message's handler ran and did not keep it (or a notification's turn came): acknowledged
 * now, or behind the messages kept before it. */
static void acked(mc_engine_t *e, const struct mc_ran *r)
{
    if (!r->lend && !r->tell.stream)
        return;
    if (!channel_held(e, r) || !kept_add(e, r, true)) /* (no memory: now, early) */
        ack(e, r);
}

/* Run the handler of a message, then acknowledge it unless the handler kept it. */
static void run_acked(mc_engine_t *e, uint8_t id, const char *from, const void *msg, size_t len,
                      struct mc_ran *r)
{
    e->ran_now = r;
    e->ran_kept = 0;
    run_msg(e, id, from, msg, len);
    e->ran_now = NULL;
    if (!e->ran_kept)
        acked(e, r);
}

uint64_t mc_msg_keep(mc_engine_t *e)
{
    kept_t *k;

    if (!e || !mc__in_pass_of(e) || !e->ran_now)
        return 0; /* not in a message handler */
    if (e->ran_kept)
        return e->ran_kept;
    if (!e->cfg.msg_ack_after_handler || (!e->ran_now->lend && !e->ran_now->tell.stream))
        return 0; /* its sender heard already */
    if (!(k = kept_add(e, e->ran_now, false))) {
        mc_error("out of memory: a message handler's mc_msg_keep is acknowledged at once");
        return 0;
    }
    return e->ran_kept = (uint64_t)(uintptr_t)k;
}

void mc_msg_release(mc_engine_t *e, uint64_t token)
{
    kept_t *k = (kept_t *)(uintptr_t)token;

    if (!e || !token)
        return;
    atomic_store_explicit(&k->released, true, memory_order_release);
    atomic_store(&e->kept_released, true);
    /* The next pass takes it: a spinning host's, one of the progress thread (a release in a
     * pass rings at its end), or of a host that sleeps on the event fd: mc_engine_arm refuses
     * to sleep now (it looks again after it said yes), or one that does not arm is woken. A
     * doorbell each time woke the serving thread, which took the lock from a spinning host:
     * UCT's am_lat went 0.45 -> 5 us. */
    if (!mc__in_pass_of(e) && (e->has_thread || atomic_load(&e->host_armed) ||
                               (atomic_load(&e->event_fd_taken) && !atomic_load(&e->arm_explicit))))
        mc__doorbell(e);
}

void mc__callbacks_released(mc_engine_t *e)
{
    uint64_t held[16]; /* channels with a message still kept ahead (past 16: the rest waits) */
    unsigned n_held = 0;
    mc_list_t *pos, *tmp;

    /* (an exchange: a plain store of false could land after a release's true, whose flag this
     * walk then missed: acknowledged only at the next release) */
    if (!atomic_load_explicit(&e->kept_released, memory_order_relaxed) ||
        !atomic_exchange(&e->kept_released, false))
        return;
    mc_list_for_each_safe(pos, tmp, &e->kept)
    {
        kept_t *k = mc_container_of(pos, kept_t, link);
        uint64_t ch = channel(&k->r);
        bool behind = false;
        for (unsigned i = 0; i < n_held && !behind; i++)
            behind = held[i] == ch;
        if (!behind && atomic_load_explicit(&k->released, memory_order_acquire)) {
            mc_list_del(&k->link);
            ack(e, &k->r);
            mc_buf_free(&e->held_bufs, k, sizeof(*k));
        } else if (!behind) {
            if (n_held == sizeof(held) / sizeof(held[0]))
                return;
            held[n_held++] = ch;
        }
    }
}

static void run_one(mc_engine_t *e, held_t *h)
{
    mc_peer_cb pcb;
    void *arg;

    if (h->kind == HELD_DONE) {
        h->done(h->done_arg, h->error);
    } else {
        handler_get(e, 0, NULL, &pcb, &arg);
        if (pcb)
            pcb(arg, h->peer, (mc_peer_event_t)h->event, h->error, h->len ? h->data : NULL);
    }
}

void mc__callbacks_run(mc_engine_t *e)
{
    mc_list_t *n;

    mc__tasks_release(e);
    for (unsigned i = 0; i < e->n_quick; i++) { /* (a handler holds nothing quick) */
        mc_quick_t *q = &e->quick[i];
        struct mc_ran r = {.lend = q->lend, .end = q->end};
        e->n_held_msgs--;
        run_acked(e, q->id, q->from, q->msg, q->len, &r);
    }
    e->n_quick = 0;
    while ((n = mc_list_pop_front(&e->heldq))) {
        held_t *h = mc_container_of(n, held_t, link);
        struct mc_ran r = {.lend = h->lend, .end = h->end, .tell = h->tell};
        if (h->kind == HELD_MSG) {
            e->n_held_msgs--;
            run_acked(e, h->msg_id, h->from, h->msg, h->len, &r);
        } else if (h->kind == HELD_MARK) {
            acked(e, &r);
        } else {
            run_one(e, h);
        }
        held_free(e, h);
    }
    mc__msgs_done_run(e);
    if (e->rx_held_full) { /* there is room again: take what waits */
        e->rx_held_full = false;
        mc__doorbell(e);
    }
}

bool mc__callbacks_pending(const mc_engine_t *e)
{
    return e->n_quick || !mc_list_empty(&e->releaseq) || !mc_list_empty(&e->sentq) ||
           !mc_list_empty(&e->heldq) || !mc_list_empty(&e->done_msgs) ||
           !mc_list_empty(&e->done_flushes);
}

void mc__callbacks_fini(mc_engine_t *e)
{
    mc_list_t *n;

    while ((n = mc_list_pop_front(&e->heldq))) {
        held_t *h = mc_container_of(n, held_t, link);
        if (h->kind == HELD_DONE) /* a send or flush: its owner may be waiting for it */
            h->done(h->done_arg, h->error);
        free(h); /* (a ring it was lent from is freed by its transport's fini) */
    }
    e->n_quick = 0; /* messages: dropped */
    /* kept messages: dropped (their rings and senders go too) */
    while ((n = mc_list_pop_front(&e->kept)))
        mc_buf_free(&e->held_bufs, mc_container_of(n, kept_t, link), sizeof(kept_t));
    mc__msgs_done_run(e);
    mc_buf_fini(&e->held_bufs);
}

void mc__callbacks_init(mc_engine_t *e)
{
    mc_list_init(&e->kept);
    mc_list_init(&e->done_msgs);
    mc_list_init(&e->done_flushes);
    mc_buf_init(&e->held_bufs, sizeof(held_t) + MC_MSG_MAX + 1, false);
}
