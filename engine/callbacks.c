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

enum { HELD_MSG, HELD_EVENT, HELD_DONE };

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
    size_t len;
    size_t size; /* as allocated (e->held_bufs) */
    char sender[MC_NAME_MAX];
    char data[]; /* a copied message, or the event's reason (NUL-terminated) */
} held_t;

static const char *const kind_name[] = {"message", "peer event", "completion"};

/* A record for len bytes of payload. */
static held_t *held_new(mc_engine_t *e, int kind, const void *data, size_t len)
{
    held_t *h = mc_buf_alloc(&e->held_bufs, sizeof(*h) + len + 1);

    if (!h) {
        if (kind != HELD_DONE) /* (a completion is kept by its caller instead) */
            mc_error("a %s was dropped: out of memory", kind_name[kind]);
        return NULL;
    }
    h->size = sizeof(*h) + len + 1;
    h->kind = kind;
    h->len = len;
    h->from = h->sender;
    h->msg = h->data;
    h->lend = NULL;
    if (len)
        memcpy(h->data, data, len);
    h->data[len] = 0;
    mc_list_push_back(&e->heldq, &h->link);
    return h;
}

/* Give a lent record back to its ring. */
static void lend_return(mc_engine_t *e, mc_ring_lend_t *lend, uint64_t end)
{
    lend->returned = end;
    lend->n--;
    mc__reap_mark(e, lend->slot);
}

/* Done with h: the ring that lent its message gets the record back. */
static void held_free(mc_engine_t *e, held_t *h)
{
    if (h->lend)
        lend_return(e, h->lend, h->end);
    mc_buf_free(&e->held_bufs, h, h->size);
}

int mc__cb_hold_msg(mc_engine_t *e, const char *sender, uint8_t id, const void *data, size_t len,
                    mc_ring_lend_t *lend, uint64_t end)
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
    }
    e->n_held_msgs++;
    return 0;
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

static void run_one(mc_engine_t *e, held_t *h)
{
    mc_peer_cb pcb;
    void *arg;

    if (h->kind == HELD_DONE) {
        h->done(h->done_arg, h->error);
    } else if (h->kind == HELD_MSG) {
        run_msg(e, h->msg_id, h->from, h->msg, h->len);
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
        e->n_held_msgs--;
        run_msg(e, q->id, q->from, q->msg, q->len);
        lend_return(e, q->lend, q->end);
    }
    e->n_quick = 0;
    while ((n = mc_list_pop_front(&e->heldq))) {
        held_t *h = mc_container_of(n, held_t, link);
        if (h->kind == HELD_MSG)
            e->n_held_msgs--;
        run_one(e, h);
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
    mc__msgs_done_run(e);
    mc_buf_fini(&e->held_bufs);
}

void mc__callbacks_init(mc_engine_t *e)
{
    mc_list_init(&e->done_msgs);
    mc_list_init(&e->done_flushes);
    mc_buf_init(&e->held_bufs, sizeof(held_t) + MC_MSG_MAX + 1, false);
}
