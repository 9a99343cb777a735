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

/* Done with h: the ring that lent its message gets the record back. */
static void held_free(mc_engine_t *e, held_t *h)
{
    if (h->lend) {
        h->lend->returned = h->end;
        h->lend->n--;
    }
    mc_buf_free(&e->held_bufs, h, h->size);
}

int mc__cb_hold_msg(mc_engine_t *e, const char *sender, uint8_t id, const void *data, size_t len,
                    mc_ring_lend_t *lend, uint64_t end)
{
    if (e->n_held_msgs >= MC_MSG_WINDOW) {
        e->rx_held_full = true;
        return -EAGAIN;
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

static void run_one(mc_engine_t *e, held_t *h)
{
    mc_msg_cb mcb = NULL;
    mc_peer_cb pcb = NULL;
    void *arg;
    unsigned seq;

    if (h->kind == HELD_DONE) {
        h->done(h->done_arg, h->error);
        return;
    }
    /* A pair a setter is writing, or wrote meanwhile, is read again. */
    for (unsigned tries = 0;; tries++) {
        if (tries >= 64)
            sched_yield(); /* its setter was descheduled between its two stores */
        seq = atomic_load_explicit(&e->handlers_seq, memory_order_acquire);
        if (h->kind == HELD_MSG) {
            mcb = atomic_load_explicit(&e->handlers[h->msg_id], memory_order_relaxed);
            arg = atomic_load_explicit(&e->handler_args[h->msg_id], memory_order_relaxed);
        } else {
            pcb = atomic_load_explicit(&e->peer_cb, memory_order_relaxed);
            arg = atomic_load_explicit(&e->peer_cb_arg, memory_order_relaxed);
        }
        atomic_thread_fence(memory_order_acquire);
        if (!(seq & 1) && seq == atomic_load_explicit(&e->handlers_seq, memory_order_relaxed))
            break;
    }
    if (h->kind == HELD_MSG && mcb)
        mcb(arg, h->from, h->msg_id, h->msg, h->len);
    else if (h->kind == HELD_MSG)
        mc_warn("message id %u from %s dropped: no handler", h->msg_id, h->from);
    else if (pcb)
        pcb(arg, h->peer, (mc_peer_event_t)h->event, h->error, h->len ? h->data : NULL);
}

void mc__callbacks_run(mc_engine_t *e)
{
    mc_list_t *n;

    mc__tasks_release(e);
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
    return !mc_list_empty(&e->releaseq) || !mc_list_empty(&e->sentq) || !mc_list_empty(&e->heldq) ||
           !mc_list_empty(&e->done_msgs) || !mc_list_empty(&e->done_flushes);
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
    mc__msgs_done_run(e);
    mc_buf_fini(&e->held_bufs);
}

void mc__callbacks_init(mc_engine_t *e)
{
    mc_list_init(&e->done_msgs);
    mc_list_init(&e->done_flushes);
    mc_buf_init(&e->held_bufs, sizeof(held_t) + MC_MSG_MAX + 1, false);
}
