/* The interface: its address in the shared engine, the events engine callbacks queue for it,
 * progress that delivers them, its wake-up eventfd (when it sleeps: sleep.c), RMA tasks in
 * pooled batches, bounce slots and the pending queue. */
#include <errno.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <ucs/time/time.h>

#include "uct_mc.h"
#include "util/log.h" /* MC_TLS_HOT */

#define BATCH_TASKS 512

ucs_config_field_t uct_mc_iface_config_table[] = {
    {"", "", NULL, ucs_offsetof(uct_mc_iface_config_t, super),
     UCS_CONFIG_TYPE_TABLE(uct_iface_config_table)},
    {"SEG_SIZE", "32k", "largest active message, and the size of one bounce slot",
     ucs_offsetof(uct_mc_iface_config_t, seg_size), UCS_CONFIG_TYPE_MEMUNITS},
    {"BOUNCE_SLOTS", "64", "put_short/put_bcopy/get_bcopy operations in flight per interface",
     ucs_offsetof(uct_mc_iface_config_t, bounce_slots), UCS_CONFIG_TYPE_UINT},
    {"MAX_TASKS", "4096", "RMA tasks in flight per interface",
     ucs_offsetof(uct_mc_iface_config_t, max_tasks), UCS_CONFIG_TYPE_UINT},
    {"BW", "10000MBs", "bandwidth UCP is told, for its choice of lanes",
     ucs_offsetof(uct_mc_iface_config_t, bandwidth), UCS_CONFIG_TYPE_BW},
    {"AM_BW", "1500MBs",
     "bandwidth of active messages UCP is told (the engine's message path, measured): with BW, "
     "where UCP moves from eager messages to rendezvous over RMA",
     ucs_offsetof(uct_mc_iface_config_t, am_bandwidth), UCS_CONFIG_TYPE_BW},
    {"LATENCY", "5us", "latency UCP is told, for its choice of lanes",
     ucs_offsetof(uct_mc_iface_config_t, latency), UCS_CONFIG_TYPE_TIME},
    {"CLOSE_TIMEOUT", "30s",
     "how long closing an interface waits for the engine to let go of its transfers (a peer "
     "that stopped answering holds them up to MC_TRANSFER_TIMEOUT); what it holds then is left "
     "to it",
     ucs_offsetof(uct_mc_iface_config_t, close_timeout), UCS_CONFIG_TYPE_TIME},
    {NULL, NULL, NULL, 0, {NULL, NULL, NULL, NULL, NULL, NULL}}};

/* ---- events from engine callbacks ---- */

static uct_mc_iface_lock_t *lock_new(uct_mc_md_t *md)
{
    uct_mc_iface_lock_t *l = calloc(1, sizeof(*l));

    if (!l)
        return NULL;
    pthread_mutex_init(&l->mutex, NULL);
    l->refs = 1; /* the interface's */
    l->md = md;
    return l;
}

/* Let go of l (the interface as it closes, or a task the engine let go of after that); caller
 * holds l->mutex, which this releases. */
static void lock_put(uct_mc_iface_lock_t *l)
{
    bool last = --l->refs == 0;

    pthread_mutex_unlock(&l->mutex);
    if (last) {
        pthread_mutex_destroy(&l->mutex);
        free(l);
    }
}

static void wake_locked(uct_mc_iface_t *iface)
{
    if (iface->armed) {
        uint64_t one = 1;
        iface->armed = false;
        if (write(iface->efd, &one, sizeof(one)) < 0 && errno != EAGAIN)
            ucs_warn("mooncake: waking the interface: %m");
    }
}

/* Caller holds iface->lock, so that a closing interface, which takes it last, sees the event
 * queued and its eventfd written. */
static void queue_locked(uct_mc_iface_t *iface, uct_mc_ev_t *ev)
{
    ev->next = NULL;
    __atomic_store_n(iface->evq_tail, ev, __ATOMIC_RELAXED); /* (deliver_all peeks at the head) */
    iface->evq_tail = &ev->next;
    wake_locked(iface);
}

void uct_mc_iface_wake(uct_mc_iface_t *iface)
{
    pthread_mutex_lock(&iface->lock->mutex);
    wake_locked(iface);
    pthread_mutex_unlock(&iface->lock->mutex);
}

void uct_mc_iface_queue(uct_mc_iface_t *iface, uct_mc_ev_t *ev)
{
    pthread_mutex_lock(&iface->lock->mutex);
    queue_locked(iface, ev);
    pthread_mutex_unlock(&iface->lock->mutex);
}

/* Active message buffers come from a cache by size class (util/bufcache.h): a peer's window of
 * 4 KiB messages allocated and freed at every pass cost the receiver a page fault per message
 * (glibc gave the heap's top back each time), and UCP's tag_bw ran at 0.2 GB/s. */
#define AM_LARGE (MC_MSG_MAX - UCT_MC_AM_HDR)

static uct_mc_am_t *am_get(uct_mc_iface_t *iface, size_t len, bool own)
{
    uct_mc_am_t *am = mc_buf_alloc(own ? &iface->am_own : &iface->am_bufs, sizeof(*am) + len);

    if (am) {
        am->ev.kind = EV_AM;
        am->own = own;
    }
    return am;
}

static void am_put(uct_mc_iface_t *iface, uct_mc_am_t *am)
{
    mc_buf_free(am->own ? &iface->am_own : &iface->am_bufs, am, sizeof(*am) + am->len);
}

/* The interface whose progress call runs the engine on this thread (iface_progress). */
static __thread uct_mc_iface_t *progressing MC_TLS_HOT;

/* A message for the interface whose progress runs this pass, on the worker's thread: no lock is
 * needed to reach it (it cannot close meanwhile) nor for its own queue, which its progress
 * empties right after the pass. Five mutexes a message less (the domain's, the buffer cache's
 * twice, the queue's twice). It is used only while the shared queue is empty, so that
 * everything in it comes before everything there (that queue's events come from other
 * workers' passes, which come before or after this one, and from this pass's other callbacks:
 * a task's end, a flush, a peer's failure); events stay in the order they came. */
static bool on_own_msg(uct_mc_iface_t *iface, uint8_t am_id, const uint8_t *data, unsigned len)
{
    uct_mc_am_t *am;

    if (__atomic_load_n(&iface->evq_head, __ATOMIC_RELAXED))
        return false;
    if (!(am = am_get(iface, len, true)))
        return false;
    am->id = am_id;
    am->len = len;
    am->kept = mc_msg_keep(iface->md->engine); /* released once UCP took it (deliver) */
    memcpy(am->data, data, len);
    am->ev.next = NULL;
    *iface->own_tail = &am->ev;
    iface->own_tail = &am->ev.next;
    return true;
}

/* Bytes of active messages released to the engine after which a progress call tells their
 * senders at once (iface_progress). */
#define RELEASED_PASS 4096

/* A message of sender's for an interface of ours that is closed: its endpoints to it are told
 * (UCT_MC_AM_GONE), so that they fail, as over UCX's tcp, rather than flush and check as if it
 * were there. (The segment opened to tell it stays open: closing it would cancel the notice.) */
static void gone_tell(uct_mc_md_t *md, const char *sender, const uint8_t *hdr)
{
    uint8_t m[UCT_MC_AM_HDR];
    mc_segment_id_t seg;

    memcpy(m, hdr, 6);
    m[6] = UCT_MC_AM_GONE;
    if (mc_segment_open_nb(md->engine, sender, &seg) ||
        mc_msg_send(md->engine, seg, MC_UCT_MSG_ID, m, sizeof(m)))
        ucs_debug("mooncake: cannot tell %s its interface here is closed: %s", sender,
                  mc_last_error());
}

/* A copy of like, an event about a peer, for every interface of md (their progress acts on it). */
static void peer_ev_all(uct_mc_md_t *md, const uct_mc_peer_ev_t *like)
{
    pthread_mutex_lock(&md->lock);
    for (unsigned i = 0; i < UCT_MC_MAX_IFACES; i++) {
        uct_mc_iface_t *iface = md->ifaces[i];
        uct_mc_peer_ev_t *ev;
        if (!iface)
            continue;
        if (!(ev = malloc(sizeof(*ev)))) {
            ucs_error("mooncake: no memory to report peer segment %u's failure", like->seg);
            continue;
        }
        *ev = *like;
        uct_mc_iface_queue(iface, &ev->ev);
    }
    pthread_mutex_unlock(&md->lock);
}

/* The notice: every interface of ours fails its endpoints to that one of sender's. */
static void gone_heard(uct_mc_md_t *md, const char *sender, const uint8_t *hdr)
{
    uct_mc_peer_ev_t like = {.ev.kind = EV_GONE};

    if (mc_segment_open_nb(md->engine, sender, &like.seg)) /* (the open one: a reference more) */
        return;
    memcpy(like.hdr, hdr, 6);
    peer_ev_all(md, &like);
    uct_mc_md_defer_close(md, like.seg);
}

/* An active message: [u16 interface id][u32 its nonce][u8 AM id][AM data]. */
void uct_mc_md_on_msg(void *arg, const char *sender, uint8_t id, const void *data, size_t len)
{
    uct_mc_md_t *md = arg;
    const uint8_t *p = data;
    uct_mc_iface_t *iface;
    uct_mc_am_t *am;
    unsigned iid;
    uint8_t am_id; /* read once: a same-host message is read where the sender wrote it */

    (void)id;
    if (len == UCT_MC_AM_HDR && p[6] == UCT_MC_AM_GONE) {
        gone_heard(md, sender, p);
        return;
    }
    if (len < UCT_MC_AM_HDR || len - UCT_MC_AM_HDR > AM_LARGE || (am_id = p[6]) >= UCT_AM_ID_MAX) {
        ucs_error("mooncake: a malformed active message (%zu bytes) from %s", len, sender);
        return;
    }
    iid = (unsigned)p[0] | (unsigned)p[1] << 8;
    iface = progressing;
    if (iface && iface->md == md && iface->id == iid && !memcmp(&iface->nonce, p + 2, 4) &&
        on_own_msg(iface, am_id, p + UCT_MC_AM_HDR, (unsigned)(len - UCT_MC_AM_HDR)))
        return;
    pthread_mutex_lock(&md->lock);
    iface = iid < UCT_MC_MAX_IFACES ? md->ifaces[iid] : NULL;
    if (iface && memcmp(&iface->nonce, p + 2, 4)) /* for an earlier interface of that id */
        iface = NULL;
    am = iface ? am_get(iface, len - UCT_MC_AM_HDR, false) : NULL;
    if (am) {
        am->id = am_id;
        am->len = (unsigned)(len - UCT_MC_AM_HDR);
        am->kept = mc_msg_keep(md->engine);
        memcpy(am->data, p + UCT_MC_AM_HDR, am->len);
        uct_mc_iface_queue(iface, &am->ev);
    }
    pthread_mutex_unlock(&md->lock);
    if (!iface) {
        ucs_debug("mooncake: active message %u from %s for interface %u, which is closed", am_id,
                  sender, iid);
        gone_tell(md, sender, p);
    } else if (!am)
        ucs_error("mooncake: no memory for an active message of %zu bytes from %s", len, sender);
}

void uct_mc_md_on_peer(void *arg, mc_segment_id_t id, mc_peer_event_t event, int error,
                       const char *reason)
{
    uct_mc_md_t *md = arg;

    (void)error; /* the reason says it: UCX gets a status from the kind of event */
    if (event == MC_PEER_CONNECTED)
        return;
    ucs_debug("mooncake: peer segment %u %s: %s", id,
              event == MC_PEER_DEAD ? "is dead" : "is unreachable", reason);
    peer_ev_all(md, &(uct_mc_peer_ev_t){.ev.kind = EV_PEER, .seg = id, .event = event});
}

/* ---- RMA tasks: batches from a pool, bounce slots ---- */

ucs_status_t uct_mc_iface_reserve(uct_mc_iface_t *iface, unsigned tasks)
{
    if (iface->tasks_inflight + tasks > iface->config.max_tasks) {
        iface->blocked = true;
        return UCS_ERR_NO_RESOURCE;
    }
    if (iface->cur && iface->cur->used + tasks <= BATCH_TASKS)
        return UCS_OK;
    if (iface->cur) { /* full: it goes back to the pool once every task is let go of */
        iface->cur->next = iface->full;
        iface->full = iface->cur;
        iface->cur = NULL;
    }
    if (iface->free_batches) {
        iface->cur = iface->free_batches;
        iface->free_batches = iface->cur->next;
        return UCS_OK;
    }
    uct_mc_batch_t *b = calloc(1, sizeof(*b));
    if (!b || mc_batch_create(iface->md->engine, BATCH_TASKS, &b->batch)) {
        free(b);
        iface->blocked = true;
        return UCS_ERR_NO_RESOURCE;
    }
    iface->cur = b;
    return UCS_OK;
}

/* A task of an interface that closed before the engine let go of it (leave_tasks): its op
 * left its endpoint, and goes with its last task. */
static void task_late(uct_mc_iface_lock_t *l, uct_mc_op_t *op)
{
    if (--op->tasks_left == 0)
        free(op);
    atomic_store(&l->md->segs_retry, true); /* its segment may close now */
    lock_put(l);
}

static void task_done(void *arg, const mc_task_status_t *st)
{
    uct_mc_op_t *op = arg;
    uct_mc_iface_lock_t *l = op->lock; /* op->iface may be gone: the lock says */

    /* one critical section: once a closing interface sees the batch done, the op is queued */
    pthread_mutex_lock(&l->mutex);
    if (l->closed) {
        task_late(l, op);
        return;
    }
    uct_mc_iface_t *iface = op->iface;
    op->batch->done++;
    if (st->state != MC_TASK_COMPLETED && !op->error) {
        op->error = st->error ? st->error : -EIO;
        snprintf(op->reason, sizeof(op->reason), "%s", st->reason ? st->reason : "failed");
    }
    if (--op->tasks_left == 0)
        queue_locked(iface, &op->ev);
    pthread_mutex_unlock(&l->mutex);
}

/* A put's task let go of its source (mc_submit_opts_t.on_sent). */
static void task_sent(void *arg, const mc_task_status_t *st)
{
    uct_mc_op_t *op = arg;
    uct_mc_iface_lock_t *l = op->lock;

    pthread_mutex_lock(&l->mutex);
    if (l->closed) { /* its task_done comes later: the lock is still there */
        pthread_mutex_unlock(&l->mutex);
        return;
    }
    uct_mc_iface_t *iface = op->iface;
    if (st->state > MC_TASK_COMPLETED && !op->error) {
        op->error = st->error ? st->error : -EIO;
        snprintf(op->reason, sizeof(op->reason), "%s", st->reason ? st->reason : "failed");
    }
    if (--op->sent_left == 0)
        queue_locked(iface, &op->sent_ev);
    pthread_mutex_unlock(&l->mutex);
}

/* Submit count requests for op (room reserved with uct_mc_iface_reserve). */
ucs_status_t uct_mc_iface_submit(uct_mc_iface_t *iface, uct_mc_op_t *op, mc_request_t *reqs,
                                 unsigned count)
{
    /* Overlapping operations of one endpoint in the order issued without waiting, where the
     * engine's transport keeps order (ep.c, rma_conflict). */
    mc_submit_opts_t opts = {
        .size = sizeof(opts), .flags = MC_SUBMIT_ORDERED, .on_sent = task_sent};
    int rc;

    op->ev.kind = EV_OP;
    op->sent_ev.kind = EV_SENT;
    op->iface = iface;
    op->lock = iface->lock;
    op->batch = iface->cur;
    op->tasks_left = op->sent_left = count;
    for (unsigned i = 0; i < count; i++) {
        reqs[i].cb = task_done;
        reqs[i].cb_arg = op;
    }
    rc = mc_batch_submit_ex(iface->cur->batch, reqs, count, &opts);
    if (rc) {
        ucs_error("mooncake: submit: %s", mc_last_error());
        return uct_mc_status(rc);
    }
    iface->cur->used += count;
    iface->tasks_inflight += count;
    return UCS_OK;
}

int uct_mc_iface_slot_get(uct_mc_iface_t *iface)
{
    if (!iface->n_free_slots) {
        iface->blocked = true;
        return -1;
    }
    return iface->free_slots[--iface->n_free_slots];
}

void uct_mc_iface_slot_put(uct_mc_iface_t *iface, int slot)
{
    iface->free_slots[iface->n_free_slots++] = slot;
}

/* Batches whose tasks the engine let go of go back to the pool. */
static void recycle_batches(uct_mc_iface_t *iface)
{
    uct_mc_batch_t **pp = &iface->full;

    while (*pp) {
        uct_mc_batch_t *b = *pp;
        size_t done;
        pthread_mutex_lock(&iface->lock->mutex);
        done = b->done;
        pthread_mutex_unlock(&iface->lock->mutex);
        if (done == b->used && mc_batch_reset(b->batch) == 0) {
            b->used = b->done = 0;
            *pp = b->next;
            b->next = iface->free_batches;
            iface->free_batches = b;
        } else {
            pp = &b->next;
        }
    }
}

/* ---- progress ---- */

static void deliver(uct_mc_iface_t *iface, uct_mc_ev_t *ev)
{
    switch (ev->kind) {
    case EV_AM: {
        uct_mc_am_t *am = (uct_mc_am_t *)ev;
        if (!iface->closing)
            uct_iface_invoke_am(&iface->super, am->id, am->data, am->len, 0);
        /* UCP has it now: its sender's flush may pass it. Answered as the engine's handler
         * returned, before UCP took it (a few microseconds later on this thread, or when the
         * interface it is for progresses), a close after that flush let UCP fail the endpoint
         * first: ucp_client_server lost its last rounds in one run of ten, over tcp too. */
        if (am->kept) {
            mc_msg_release(iface->md->engine, am->kept);
            iface->released += am->len;
        }
        am_put(iface, am);
        break;
    }
    case EV_OP:
        uct_mc_ep_op_done(iface, (uct_mc_op_t *)ev);
        break;
    case EV_SENT:
        uct_mc_ep_op_sent(iface, ucs_container_of(ev, uct_mc_op_t, sent_ev));
        break;
    case EV_FLUSH:
        uct_mc_ep_flush_done(iface, (uct_mc_flush_t *)ev);
        break;
    case EV_PEER:
    case EV_GONE: { /* the peer, or one interface of its (closed) */
        uct_mc_peer_ev_t *p = (uct_mc_peer_ev_t *)ev;
        bool gone = ev->kind == EV_GONE;
        uct_mc_ep_peer_failed(iface, p->seg, gone ? p->hdr : NULL,
                              gone || p->event == MC_PEER_DEAD ? UCS_ERR_CONNECTION_RESET
                                                               : UCS_ERR_ENDPOINT_TIMEOUT);
        free(p);
        break;
    }
    }
}

/* Deliver the events of list ev, in order; how many. */
static unsigned deliver_list(uct_mc_iface_t *iface, uct_mc_ev_t *ev)
{
    unsigned n = 0;

    for (uct_mc_ev_t *next; ev; ev = next, n++) {
        next = ev->next;
        deliver(iface, ev);
    }
    return n;
}

/* The worker's own queue first (on_own_msg), then the shared one. The shared queue's head is
 * looked at without the lock first: most calls of a worker that polls find it empty, and
 * taking the mutex for that was 3% of a UCT ping-pong's samples. An event queued just after
 * the look is taken by the next call (and a worker about to sleep looks under the lock:
 * uct_mc_iface_event_arm, sleep.c). */
static unsigned deliver_all(uct_mc_iface_t *iface)
{
    uct_mc_ev_t *ev = iface->own_head;
    unsigned n = 0;

    if (ev) {
        iface->own_head = NULL;
        iface->own_tail = &iface->own_head;
        n = deliver_list(iface, ev);
    }
    if (!__atomic_load_n(&iface->evq_head, __ATOMIC_RELAXED))
        return n;
    pthread_mutex_lock(&iface->lock->mutex);
    ev = iface->evq_head;
    __atomic_store_n(&iface->evq_head, NULL, __ATOMIC_RELAXED);
    iface->evq_tail = &iface->evq_head;
    pthread_mutex_unlock(&iface->lock->mutex);
    return n + deliver_list(iface, ev);
}

static unsigned iface_progress(uct_iface_h tl_iface)
{
    uct_mc_iface_t *iface = ucs_derived_of(tl_iface, uct_mc_iface_t);
    uct_mc_iface_t *driver;
    unsigned n;

    if (__atomic_load_n(&iface->asleep, __ATOMIC_RELAXED))
        __atomic_store_n(&iface->asleep, false, __ATOMIC_RELAXED);
    progressing = iface;
    mc_engine_progress(iface->md->engine);
    progressing = NULL;
    driver = __atomic_load_n(&iface->md->driver, __ATOMIC_RELAXED);
    if (driver && driver != iface)
        uct_mc_iface_take_over(iface);
    n = deliver_all(iface);
    /* UCP took what the engine kept for it: its senders hear so at the next call, or now, for a
     * ring to get its records back sooner once they are large (UCP's stream_bw at 16 KiB ran at
     * 0.65 of its rate with the answer at the handler's return without this call, 0.84 with it;
     * a call after every delivery cost a ping-pong 0.09 us) */
    if (iface->released >= RELEASED_PASS) {
        iface->released = 0;
        progressing = iface;
        mc_engine_progress(iface->md->engine);
        progressing = NULL;
        n += deliver_all(iface); /* (what that pass took: none waits for the next call) */
    }
    if (n)
        recycle_batches(iface);
    /* resources may have come back without an event (a peer's message window): try again */
    __atomic_store_n(&iface->round, iface->round + 1, __ATOMIC_RELAXED);
    iface->blocked = false;
    if (iface->n_stashed)
        uct_mc_ep_send_stashed(iface);
    if (iface->pending_head)
        uct_mc_pending_dispatch(iface);
    if (atomic_load_explicit(&iface->md->segs_retry, memory_order_relaxed))
        uct_mc_md_close_segments(iface->md);
    return n;
}

/* ---- flush and fence ---- */

static ucs_status_t iface_flush(uct_iface_h tl_iface, unsigned flags, uct_completion_t *comp)
{
    uct_mc_iface_t *iface = ucs_derived_of(tl_iface, uct_mc_iface_t);
    ucs_status_t st = UCS_OK;

    if (comp)
        return UCS_ERR_UNSUPPORTED;
    /* an endpoint with requests still queued, or a message stashed, is not flushed either (UCP's
     * worker flush counts no operations of its own: it asks again until this says OK) */
    for (uct_mc_ep_t *ep = iface->eps; ep; ep = ep->next)
        if (((ep->n_pending || ep->stash) && !(flags & UCT_FLUSH_FLAG_CANCEL)) ||
            uct_mc_ep_flush(&ep->super.super, flags, NULL) == UCS_INPROGRESS)
            st = UCS_INPROGRESS;
    return st;
}

static ucs_status_t iface_fence(uct_iface_h tl_iface, unsigned flags)
{
    uct_mc_iface_t *iface = ucs_derived_of(tl_iface, uct_mc_iface_t);

    for (uct_mc_ep_t *ep = iface->eps; ep; ep = ep->next)
        uct_mc_ep_fence(&ep->super.super, flags);
    return UCS_OK;
}

/* ---- addresses ---- */

static ucs_status_t iface_query(uct_iface_h tl_iface, uct_iface_attr_t *attr)
{
    uct_mc_iface_t *iface = ucs_derived_of(tl_iface, uct_mc_iface_t);
    size_t seg = iface->config.seg_size, am_max = iface->am_max;

    uct_base_iface_query(&iface->super, attr);
    attr->iface_addr_len = iface->addr_len;
    attr->device_addr_len = 0;
    attr->ep_addr_len = 0;
    attr->cap.flags = UCT_IFACE_FLAG_CONNECT_TO_IFACE | UCT_IFACE_FLAG_AM_SHORT |
                      UCT_IFACE_FLAG_AM_BCOPY | UCT_IFACE_FLAG_AM_ZCOPY | UCT_IFACE_FLAG_PENDING |
                      UCT_IFACE_FLAG_CB_SYNC | UCT_IFACE_FLAG_ERRHANDLE_PEER_FAILURE |
                      UCT_IFACE_FLAG_EP_CHECK;
    if (!iface->netdev) /* an interface's device: UCP's first step only (query_devices) */
        attr->cap.flags |= UCT_IFACE_FLAG_PUT_SHORT | UCT_IFACE_FLAG_PUT_BCOPY |
                           UCT_IFACE_FLAG_PUT_ZCOPY | UCT_IFACE_FLAG_GET_BCOPY |
                           UCT_IFACE_FLAG_GET_ZCOPY;
    attr->cap.event_flags =
        UCT_IFACE_FLAG_EVENT_SEND_COMP | UCT_IFACE_FLAG_EVENT_RECV | UCT_IFACE_FLAG_EVENT_FD;
    attr->cap.put.max_short = (unsigned)seg;
    attr->cap.put.max_bcopy = seg;
    attr->cap.put.min_zcopy = 1;
    attr->cap.put.max_zcopy = SIZE_MAX >> 1;
    attr->cap.put.opt_zcopy_align = 1;
    attr->cap.put.align_mtu = 1;
    attr->cap.put.max_iov = UCT_MC_MAX_IOV;
    attr->cap.get.max_bcopy = seg;
    attr->cap.get.min_zcopy = 1;
    attr->cap.get.max_zcopy = SIZE_MAX >> 1;
    attr->cap.get.opt_zcopy_align = 1;
    attr->cap.get.align_mtu = 1;
    attr->cap.get.max_iov = UCT_MC_MAX_IOV;
    attr->cap.am.max_short = (unsigned)am_max;
    attr->cap.am.max_bcopy = am_max;
    attr->cap.am.min_zcopy = 0;
    attr->cap.am.max_zcopy = am_max;
    attr->cap.am.opt_zcopy_align = 1;
    attr->cap.am.align_mtu = 1;
    attr->cap.am.max_hdr = 128;
    attr->cap.am.max_iov = UCT_MC_MAX_IOV;
    /* a little later on an interface's device, so that UCP's lanes go to "engine" */
    attr->latency = ucs_linear_func_make(iface->config.latency + (iface->netdev ? 1e-6 : 0), 0);
    attr->bandwidth.dedicated = 0;
    attr->bandwidth.shared = iface->config.bandwidth;
    attr->overhead = 1e-6;
    attr->priority = 0;
    return UCS_OK;
}

/* As iface_query says, except that active messages move at AM_BW, not BW: each fragment costs
 * the difference as overhead, which is what UCP weighs eager against rendezvous with. */
ucs_status_t uct_mc_iface_estimate_perf(uct_iface_h tl_iface, uct_perf_attr_t *attr)
{
    uct_mc_iface_t *iface = ucs_derived_of(tl_iface, uct_mc_iface_t);
    ucs_status_t st = uct_base_iface_estimate_perf(tl_iface, attr);
    bool am = (attr->field_mask & UCT_PERF_ATTR_FIELD_OPERATION) &&
              (attr->operation == UCT_EP_OP_AM_SHORT || attr->operation == UCT_EP_OP_AM_BCOPY ||
               attr->operation == UCT_EP_OP_AM_ZCOPY);

    if (st != UCS_OK || !am)
        return st;
    if (attr->field_mask & UCT_PERF_ATTR_FIELD_BANDWIDTH)
        attr->bandwidth.shared = iface->config.am_bandwidth;
    if ((attr->field_mask & UCT_PERF_ATTR_FIELD_SEND_PRE_OVERHEAD) &&
        iface->config.am_bandwidth < iface->config.bandwidth)
        attr->send_pre_overhead += (double)iface->am_max / iface->config.am_bandwidth -
                                   (double)iface->am_max / iface->config.bandwidth;
    return UCS_OK;
}

static ucs_status_t iface_get_address(uct_iface_h tl_iface, uct_iface_addr_t *addr)
{
    uct_mc_iface_t *iface = ucs_derived_of(tl_iface, uct_mc_iface_t);

    memcpy(addr, iface->addr, iface->addr_len);
    return UCS_OK;
}

/* The engine at the address runs on this host, or a route leads to its endpoint, which is not
 * a loopback one (mc_address_reachable); an address of another kind is not. */
static int iface_is_reachable(const uct_iface_h tl_iface, const uct_device_addr_t *dev_addr,
                              const uct_iface_addr_t *iface_addr)
{
    uct_mc_iface_t *iface = ucs_derived_of(tl_iface, uct_mc_iface_t);
    const uint8_t *a = (const uint8_t *)iface_addr;

    (void)dev_addr;
    return a && a[6] <= MC_ADDRESS_MAX &&
           mc_address_reachable(iface->md->engine, a + UCT_MC_ADDR_HDR, a[6]) == 1;
}

/* ---- lifetime ---- */

static uct_iface_ops_t iface_ops;

static UCS_CLASS_INIT_FUNC(uct_mc_iface_t, uct_md_h tl_md, uct_worker_h worker,
                           const uct_iface_params_t *params, const uct_iface_config_t *tl_config)
{
    uct_mc_md_t *md = ucs_derived_of(tl_md, uct_mc_md_t);
    const uct_mc_iface_config_t *cfg = ucs_derived_of(tl_config, uct_mc_iface_config_t);
    struct epoll_event eev = {.events = EPOLLIN};
    size_t len = MC_ADDRESS_MAX;
    int rc, id;

    /* Nothing of an interface is locked against its own threads (its buffer for a message,
     * its pending queue, its endpoints), as UCX's tcp, ib and shared memory transports: a
     * worker several threads use at once is refused (UCP serializes its own). */
    if (ucs_derived_of(worker, uct_priv_worker_t)->thread_mode == UCS_THREAD_MODE_MULTI) {
        ucs_error("mooncake: a worker in UCS_THREAD_MODE_MULTI is not supported");
        return UCS_ERR_INVALID_PARAM;
    }
    UCS_CLASS_CALL_SUPER_INIT(uct_base_iface_t, &iface_ops, &uct_mc_iface_internal_ops, tl_md,
                              worker, params,
                              tl_config UCS_STATS_ARG(NULL) UCS_STATS_ARG(UCT_MC_NAME));
    /* UCS classes are not zero-filled */
    memset((char *)self + sizeof(self->super), 0, sizeof(*self) - sizeof(self->super));
    self->efd = self->epfd = self->tfd = -1;
    self->asleep = true; /* it drives nothing until its first progress */
    self->md = md;
    self->config = *cfg;
    self->netdev = (params->field_mask & UCT_IFACE_PARAM_FIELD_OPEN_MODE) &&
                   (params->open_mode & UCT_IFACE_OPEN_MODE_DEVICE) &&
                   strcmp(params->mode.device.dev_name, UCT_MC_DEV_NAME);
    if (self->config.seg_size < 256 || self->config.bounce_slots < 1 ||
        self->config.max_tasks < BATCH_TASKS) {
        ucs_error("mooncake: SEG_SIZE must be >= 256, BOUNCE_SLOTS >= 1, MAX_TASKS >= %d",
                  BATCH_TASKS);
        return UCS_ERR_INVALID_PARAM;
    }
    self->am_max = self->config.seg_size < MC_MSG_MAX - UCT_MC_AM_HDR ? self->config.seg_size
                                                                      : MC_MSG_MAX - UCT_MC_AM_HDR;
    self->lock = lock_new(md);
    if (!self->lock)
        return UCS_ERR_NO_MEMORY;
    mc_buf_init(&self->am_bufs, sizeof(uct_mc_am_t) + AM_LARGE, true);
    mc_buf_init(&self->am_own, sizeof(uct_mc_am_t) + AM_LARGE, false);
    self->evq_tail = &self->evq_head;
    self->own_tail = &self->own_head;
    self->pending_tail = &self->pending_head;
    self->round = 1; /* a new endpoint's blocked_round, 0, is no round */
    rc = mc_engine_address(md->engine, self->addr + UCT_MC_ADDR_HDR, &len);
    if (rc) {
        ucs_error("mooncake: the engine's address: %s", mc_last_error());
        goto err_fds;
    }
    self->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    self->tfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    self->epfd = epoll_create1(EPOLL_CLOEXEC);
    if (self->efd < 0 || self->tfd < 0 || self->epfd < 0 ||
        epoll_ctl(self->epfd, EPOLL_CTL_ADD, self->efd, &eev) ||
        epoll_ctl(self->epfd, EPOLL_CTL_ADD, self->tfd, &eev)) {
        ucs_error("mooncake: the interface's event fd: %m");
        goto err_fds;
    }
    if (self->netdev) /* no put or get there: no bounce slot */
        self->config.bounce_slots = 0;
    rc = self->netdev ? 0
                      : mc_mem_alloc(md->engine, self->config.seg_size * self->config.bounce_slots,
                                     "*", (void **)&self->bounce);
    self->free_slots = calloc(self->config.bounce_slots + 1, sizeof(int));
    self->tx = malloc(UCT_MC_AM_HDR + self->am_max);
    if (rc || !self->free_slots || !self->tx) {
        ucs_error("mooncake: bounce buffers: %s", rc ? mc_last_error() : "no memory");
        goto err_bounce;
    }
    for (unsigned i = 0; i < self->config.bounce_slots; i++)
        self->free_slots[i] = (int)(self->config.bounce_slots - 1 - i);
    self->n_free_slots = self->config.bounce_slots;
    id = uct_mc_md_add_iface(md, self);
    if (id < 0) {
        ucs_error("mooncake: more than %d interfaces on one memory domain", UCT_MC_MAX_IFACES);
        goto err_bounce;
    }
    self->id = (uint16_t)id;
    self->nonce = (uint32_t)ucs_generate_uuid((uintptr_t)self);
    self->addr[0] = (uint8_t)id;
    self->addr[1] = (uint8_t)(id >> 8);
    memcpy(self->addr + 2, &self->nonce, 4);
    self->addr[6] = (uint8_t)len;
    self->addr_len = UCT_MC_ADDR_HDR + len;
    return UCS_OK;

err_bounce:
    free(self->tx);
    free(self->free_slots);
    if (self->bounce)
        mc_mem_free(md->engine, self->bounce);
err_fds:
    if (self->efd >= 0)
        close(self->efd);
    if (self->tfd >= 0)
        close(self->tfd);
    if (self->epfd >= 0)
        close(self->epfd);
    mc_buf_fini(&self->am_bufs);
    mc_buf_fini(&self->am_own);
    pthread_mutex_lock(&self->lock->mutex);
    lock_put(self->lock);
    return UCS_ERR_IO_ERROR;
}

/* Events queued for ops whose tasks the engine still holds: only their sent events can be. */
static void drop_held_events(uct_mc_iface_t *iface)
{
    uct_mc_ev_t **pp = &iface->evq_head;

    iface->evq_tail = &iface->evq_head;
    while (*pp) {
        uct_mc_ev_t *ev = *pp;
        if (ev->kind == EV_SENT && ucs_container_of(ev, uct_mc_op_t, sent_ev)->tasks_left) {
            *pp = ev->next;
            continue;
        }
        pp = &ev->next;
        iface->evq_tail = pp;
    }
}

/* The engine still holds tasks of ours as the interface closes: they are left to it. From
 * here on their callbacks find the interface closed (its lock outlives it, held by each such
 * task) and free their operations themselves, which leave their endpoints now. */
static void leave_tasks(uct_mc_iface_t *iface, uct_mc_batch_t *const *lists)
{
    uct_mc_iface_lock_t *l = iface->lock;

    pthread_mutex_lock(&l->mutex);
    l->closed = true;
    for (unsigned i = 0; i < 3; i++)
        for (const uct_mc_batch_t *b = lists[i]; b; b = i ? b->next : NULL)
            l->refs += b->used - b->done;
    drop_held_events(iface);
    uct_mc_ep_leave_ops(iface);
    pthread_mutex_unlock(&l->mutex);
    uct_mc_ep_free_zombies(iface);
}

/* Let the engine go of every task of ours: cancel them, then drive it until their callbacks
 * ran, for CLOSE_TIMEOUT at most (a transport lets go of a slice within its I/O timeout, which
 * may be longer); what it holds then is left to it. */
static void drain_batches(uct_mc_iface_t *iface)
{
    uct_mc_batch_t *lists[] = {iface->cur, iface->full, iface->free_batches};
    ucs_time_t limit = ucs_get_time() + ucs_time_from_sec(iface->config.close_timeout);
    bool busy = true;

    for (unsigned l = 0; l < 3; l++)
        for (uct_mc_batch_t *b = lists[l]; b; b = l ? b->next : NULL)
            mc_batch_cancel(b->batch);
    while (busy) {
        busy = false;
        mc_engine_progress(iface->md->engine);
        pthread_mutex_lock(&iface->lock->mutex);
        for (unsigned l = 0; l < 3; l++)
            for (uct_mc_batch_t *b = lists[l]; b; b = l ? b->next : NULL)
                busy |= b->done < b->used;
        pthread_mutex_unlock(&iface->lock->mutex);
        if (busy && ucs_get_time() >= limit) {
            ucs_warn("mooncake: closing an interface whose transfers the engine still holds "
                     "after %.1f s: they are left to it",
                     iface->config.close_timeout);
            leave_tasks(iface, lists);
            break;
        }
    }
    for (unsigned l = 0; l < 3; l++) {
        for (uct_mc_batch_t *b = lists[l], *next; b; b = next) {
            next = l ? b->next : NULL;
            mc_batch_release(b->batch); /* the engine frees it once it let go of its tasks */
            free(b);
        }
    }
    iface->cur = iface->full = iface->free_batches = NULL;
}

/* Flushes that ended between the last delivery and their detaching: their endpoints were let
 * go of with the detaching, only the flushes remain. (No task of ours queues anything now: the
 * engine let go of them all, or they were left to it.) */
static void drop_late_flushes(uct_mc_iface_t *iface)
{
    uct_mc_ev_t *ev, *next;

    pthread_mutex_lock(&iface->lock->mutex);
    ev = iface->evq_head;
    iface->evq_head = NULL;
    iface->evq_tail = &iface->evq_head;
    pthread_mutex_unlock(&iface->lock->mutex);
    for (; ev; ev = next) {
        next = ev->next;
        free(ev);
    }
}

static UCS_CLASS_CLEANUP_FUNC(uct_mc_iface_t)
{
    uct_base_iface_progress_disable(&self->super.super, UCT_PROGRESS_SEND | UCT_PROGRESS_RECV);
    uct_mc_md_remove_iface(self->md, self); /* no more messages or peer events */
    self->closing = true;
    uct_mc_ep_orphan_all(self);
    drain_batches(self);
    deliver_all(self);
    uct_mc_iface_detach_flushes(self);
    drop_late_flushes(self);
    if (self->bounce)
        mc_mem_free(self->md->engine, self->bounce);
    uct_mc_md_close_segments(self->md);
    mc_buf_fini(&self->am_bufs);
    mc_buf_fini(&self->am_own);
    free(self->tx);
    free(self->free_slots);
    close(self->efd);
    close(self->tfd);
    close(self->epfd);
    pthread_mutex_lock(&self->lock->mutex);
    self->lock->closed = true;
    lock_put(self->lock);
}

UCS_CLASS_DEFINE(uct_mc_iface_t, uct_base_iface_t);
static UCS_CLASS_DEFINE_NEW_FUNC(uct_mc_iface_t, uct_iface_t, uct_md_h, uct_worker_h,
                                 const uct_iface_params_t *, const uct_iface_config_t *);
static UCS_CLASS_DEFINE_DELETE_FUNC(uct_mc_iface_t, uct_iface_t);

/* An interface UCX's tcp would list for this address: up and running, an IPv4 address or an
 * IPv6 one that is neither loopback nor link-local (a container's veth has only those). */
static bool netif_usable(const struct ifaddrs *i)
{
    if (!i->ifa_addr || (i->ifa_flags & (IFF_UP | IFF_RUNNING)) != (IFF_UP | IFF_RUNNING))
        return false;
    if (i->ifa_addr->sa_family == AF_INET)
        return true;
    const struct in6_addr *a = &((const struct sockaddr_in6 *)(const void *)i->ifa_addr)->sin6_addr;
    return i->ifa_addr->sa_family == AF_INET6 && !IN6_IS_ADDR_LOOPBACK(a) &&
           !IN6_IS_ADDR_LINKLOCAL(a);
}

/* Add device name to devs[*n] unless it is there. */
static void device_add(uct_tl_device_resource_t *devs, unsigned *n, const char *name)
{
    for (unsigned k = 0; k < *n; k++)
        if (!strcmp(devs[k].name, name))
            return;
    snprintf(devs[*n].name, sizeof(devs[*n].name), "%s", name);
    devs[*n].type = UCT_DEVICE_TYPE_NET;
    devs[*n].sys_device = UCS_SYS_DEVICE_ID_UNKNOWN;
    (*n)++;
}

/* The device "engine", then one per network interface that is up with an IP address (as UCX's
 * tcp lists them). UCP's client-server mode (ucp_listener, connect by sockaddr) wires an
 * endpoint up only over transports whose device is the interface the connection came through;
 * an interface's device serves that first step (active messages only), after which UCP moves
 * its lanes to "engine". Every device is the whole engine. */
static ucs_status_t query_devices(uct_md_h md, uct_tl_device_resource_t **devices_p, unsigned *n_p)
{
    struct ifaddrs *ifs = NULL;
    unsigned n = 1;

    (void)md;
    if (getifaddrs(&ifs))
        ifs = NULL;
    for (struct ifaddrs *i = ifs; i; i = i->ifa_next)
        n++;
    uct_tl_device_resource_t *devs = ucs_calloc(n, sizeof(*devs), "mooncake devices");
    n = 0;
    if (devs)
        device_add(devs, &n, UCT_MC_DEV_NAME);
    for (struct ifaddrs *i = devs ? ifs : NULL; i; i = i->ifa_next)
        if (netif_usable(i) && strlen(i->ifa_name) < sizeof(devs->name))
            device_add(devs, &n, i->ifa_name);
    if (ifs)
        freeifaddrs(ifs);
    if (!devs)
        return UCS_ERR_NO_MEMORY;
    *devices_p = devs;
    *n_p = n;
    return UCS_OK;
}

static void progress_enable(uct_iface_h tl_iface, unsigned flags)
{
    uct_base_iface_progress_enable_cb(ucs_derived_of(tl_iface, uct_base_iface_t),
                                      (ucs_callback_t)iface_progress, flags);
}

static ucs_status_t no_device_address(uct_iface_h iface, uct_device_addr_t *addr)
{
    (void)iface;
    (void)addr;
    return UCS_OK;
}

static uct_iface_ops_t iface_ops = {
    .ep_put_short = uct_mc_ep_put_short,
    .ep_put_bcopy = uct_mc_ep_put_bcopy,
    .ep_put_zcopy = uct_mc_ep_put_zcopy,
    .ep_get_bcopy = uct_mc_ep_get_bcopy,
    .ep_get_zcopy = uct_mc_ep_get_zcopy,
    .ep_am_short = uct_mc_ep_am_short,
    .ep_am_short_iov = uct_base_ep_am_short_iov,
    .ep_am_bcopy = uct_mc_ep_am_bcopy,
    .ep_am_zcopy = uct_mc_ep_am_zcopy,
    .ep_pending_add = uct_mc_ep_pending_add,
    .ep_pending_purge = uct_mc_ep_pending_purge,
    .ep_flush = uct_mc_ep_flush,
    .ep_fence = uct_mc_ep_fence,
    .ep_check = uct_mc_ep_check,
    .ep_create = uct_mc_ep_create,
    .ep_destroy = uct_mc_ep_destroy,
    .iface_flush = iface_flush,
    .iface_fence = iface_fence,
    .iface_progress_enable = progress_enable,
    .iface_progress_disable = uct_base_iface_progress_disable,
    .iface_progress = iface_progress,
    .iface_event_fd_get = uct_mc_iface_event_fd_get,
    .iface_event_arm = uct_mc_iface_event_arm,
    .iface_close = UCS_CLASS_DELETE_FUNC_NAME(uct_mc_iface_t),
    .iface_query = iface_query,
    .iface_get_device_address = no_device_address,
    .iface_get_address = iface_get_address,
    .iface_is_reachable = iface_is_reachable,
};

uct_tl_t uct_mc_tl = {
    .name = UCT_MC_NAME,
    .query_devices = query_devices,
    .iface_open = UCS_CLASS_NEW_FUNC_NAME(uct_mc_iface_t),
    .config =
        {
            .name = UCT_MC_NAME " transport",
            .prefix = "MOONCAKE_",
            .table = uct_mc_iface_config_table,
            .size = sizeof(uct_mc_iface_config_t),
        },
};
