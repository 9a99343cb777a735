/* Messages (exactly once, in order, per peer), notifications (message id 0) and flushes. See
 * msg.h for the protocol. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "callbacks.h"
#include "engine_int.h"
#include "msg.h"
#include "task.h"
#include "transport/transport.h"
#include "util/crypto.h"

#define MAX_NOTIFY       65536       /* received, not yet popped: past it, senders are held back */
#define MAX_NOTIFY_BYTES (64u << 20) /* and their bytes (one is always taken) */
#define RESEND_DELAY_NS  (1 * MC_MS) /* after a receiver said -EAGAIN */
#define RX_STREAMS_MAX   65536       /* streams remembered; the least recently used go first */
#define SRC_MIN          256u /* smaller payloads are copied at once (msg_route_src costs more) */

int mc_msg_handler_set(mc_engine_t *e, uint8_t id, mc_msg_cb cb, void *arg)
{
    if (!e || id == 0)
        return mc__set_error(-EINVAL, "mc_msg_handler_set: id 0 is reserved for notifications");
    mc__handler_set(e, id, cb, NULL, arg);
    return 0;
}

/* ---- sending ---- */

/* Whether one more message of len bytes fits a window that holds msgs of bytes. */
static bool window_fits(unsigned msgs, unsigned bytes, size_t len)
{
    return msgs < MC_MSG_WINDOW && (!msgs || bytes + len <= MC_MSG_WINDOW_BYTES);
}

/* Take a place in the target's window (queued or unacknowledged messages, and their payload
 * bytes: a peer's 4096 queued 4 KiB messages held 16 MiB, which the heap grew for and gave back
 * at every pass). The peer table's lock is for other threads: a pass's own callbacks hold
 * e->lock, under which peers go. A place taken under e->lock is counted apart, without a locked
 * instruction (the window may then be passed by as many as other threads take meanwhile). */
static int window_take(mc_engine_t *e, mc_segment_id_t target, size_t len)
{
    bool own = mc__in_pass_of(e);
    int rc = 0;

    if (!own)
        pthread_rwlock_rdlock(&e->peers_lock);
    mc_peer_t *p = mc__peer_get(e, target);
    if (!p) {
        rc = mc__set_error(-MC_ENOSEGMENT, "message target %u is not open", target);
    } else if (p->state == MC_SEGMENT_DEAD) {
        rc = mc__set_error(-MC_EPEERDEAD, "%s", p->dead_reason);
    } else {
        unsigned pass = atomic_load_explicit(&p->queued_pass, memory_order_relaxed);
        unsigned pass_bytes = atomic_load_explicit(&p->queued_pass_bytes, memory_order_relaxed);
        if (own) {
            if (window_fits(pass + atomic_load_explicit(&p->queued_msgs, memory_order_relaxed),
                            pass_bytes +
                                atomic_load_explicit(&p->queued_bytes, memory_order_relaxed),
                            len)) {
                atomic_store_explicit(&p->queued_pass, pass + 1, memory_order_relaxed);
                atomic_store_explicit(&p->queued_pass_bytes, pass_bytes + (unsigned)len,
                                      memory_order_relaxed);
            } else {
                rc = -EAGAIN;
            }
        } else if (!window_fits(atomic_fetch_add(&p->queued_msgs, 1) + pass,
                                atomic_fetch_add(&p->queued_bytes, (unsigned)len) + pass_bytes,
                                len)) {
            atomic_fetch_sub(&p->queued_msgs, 1);
            atomic_fetch_sub(&p->queued_bytes, (unsigned)len);
            rc = -EAGAIN;
        }
    }
    if (rc == -EAGAIN)
        mc__set_error_str(rc, "the target's message window is full (MC_MSG_WINDOW messages or "
                              "MC_MSG_WINDOW_BYTES bytes queued or unacknowledged)");
    if (!own)
        pthread_rwlock_unlock(&e->peers_lock);
    return rc;
}

/* Give the place back (the message left: acknowledged, failed, or never queued); pass: it was
 * taken under e->lock. */
static void window_give(mc_peer_t *p, bool pass, size_t len)
{
    if (pass) {
        atomic_store_explicit(&p->queued_pass,
                              atomic_load_explicit(&p->queued_pass, memory_order_relaxed) - 1,
                              memory_order_relaxed);
        atomic_store_explicit(&p->queued_pass_bytes,
                              atomic_load_explicit(&p->queued_pass_bytes, memory_order_relaxed) -
                                  (unsigned)len,
                              memory_order_relaxed);
    } else {
        atomic_fetch_sub(&p->queued_msgs, 1);
        atomic_fetch_sub(&p->queued_bytes, (unsigned)len);
    }
}

static int msg_check(const void *data, size_t len, const mc_msg_opts_t *opts)
{
    if (len > MC_MSG_MAX || (len && !data))
        return mc__set_error(-EINVAL, "message of %zu bytes (max %d)", len, MC_MSG_MAX);
    if (opts && (opts->size < sizeof(size_t) || opts->size > sizeof(*opts)))
        return mc__set_error(-EINVAL, "mc_msg_opts_t.size is %zu, expected %zu", opts->size,
                             sizeof(*opts));
    return 0;
}

/* A message that passed msg_check, in the target's window. Its record comes from
 * e->msg_bufs_pass when this thread holds e->lock (a pass, a host's send section: no lock of
 * its own on a message's path), else from e->msg_bufs (shared: a host thread makes it,
 * progress lets go of it). Both are given back under e->lock, each to its own. data NULL: the
 * payload is copied later (msg_route_src). */
static int msg_new(mc_engine_t *e, mc_segment_id_t target, uint8_t id, const void *data, size_t len,
                   const mc_msg_opts_t *opts, mc_msg_t **m_p)
{
    mc_msg_opts_t o = {0};
    mc_msg_t *m;
    int rc;

    if (opts)
        memcpy(&o, opts, opts->size);
    rc = window_take(e, target, len);
    if (rc)
        return rc;
    bool pass = mc__in_pass_of(e);
    m = mc_buf_alloc(pass ? &e->msg_bufs_pass : &e->msg_bufs, sizeof(*m) + len);
    if (!m) {
        if (!pass)
            pthread_rwlock_rdlock(&e->peers_lock);
        mc_peer_t *p = mc__peer_get(e, target); /* (closed meanwhile: its window went with it) */
        if (p)
            window_give(p, pass, len);
        if (!pass)
            pthread_rwlock_unlock(&e->peers_lock);
        return mc__set_error(-ENOMEM, "out of memory");
    }
    memset(m, 0, sizeof(*m)); /* the header: the payload is copied over */
    m->target = target;
    m->id = id;
    m->len = (uint32_t)len;
    m->refs = 1;
    m->pass_buf = pass;
    m->cb = o.cb;
    m->cb_arg = o.cb_arg;
    if (len && data)
        memcpy(m->data, data, len);
    *m_p = m;
    return 0;
}

static uint64_t route(mc_engine_t *e, mc_msg_t *m, bool now);

/* Route m, made in the progress context with its payload still at the sender's data: a carrier
 * of its peer's messages that keeps payloads where it writes them (msg_direct: shm's ring) takes
 * it at once, straight from there; otherwise m gets its copy before the send returns. A
 * same-host message is copied once instead of twice (copies were a third of a 4 KiB one's path,
 * and more of larger ones'). */
static void msg_route_src(mc_engine_t *e, mc_msg_t *m, const void *data)
{
    m->src = data;
    m->refs++; /* (a route that fails at once lets go of it) */
    route(e, m, true);
    if (!m->in_ring && m->len)
        memcpy(m->data, data, m->len);
    m->src = NULL;
    mc__msg_put(e, m);
}

/* Before a message routed at once: those other threads queued meanwhile, which their sends
 * returned for before this one began (a thread that sent, then told a handler, which sends:
 * "in the order sent"; routed with the pass's next drain, they came after the handler's). */
static void route_queued(mc_engine_t *e)
{
    mc_list_t msgs, *n;

    if (!atomic_load_explicit(&e->msgs_in, memory_order_acquire))
        return;
    mc_list_init(&msgs);
    pthread_mutex_lock(&e->sub_lock);
    mc_list_splice_back(&msgs, &e->msgq_in);
    atomic_store_explicit(&e->msgs_in, false, memory_order_relaxed);
    pthread_mutex_unlock(&e->sub_lock);
    while ((n = mc_list_pop_front(&msgs)))
        route(e, mc_container_of(n, mc_msg_t, link), false);
}

/* Make m and hand it to progress: routed at once where this thread may (a callback, whose
 * message goes out at the end of the pass; a host's send section), else queued. */
static int msg_make(mc_engine_t *e, mc_segment_id_t target, uint8_t id, const void *data,
                    size_t len, const mc_msg_opts_t *opts)
{
    mc_msg_t *m = NULL;
    int rc;

    if (atomic_load_explicit(&e->stop, memory_order_relaxed)) /* a callback during destroy */
        return mc__set_error(-MC_ECANCELED, "the engine is being destroyed");
    bool section = !mc__in_pass_of(e) && mc__send_begin(e);

    if (section || mc__in_pass_of(e)) {
        bool src = len >= SRC_MIN;
        route_queued(e);
        rc = msg_new(e, target, id, src ? NULL : data, len, opts, &m);
        if (!rc && src)
            msg_route_src(e, m, data);
        else if (!rc)
            route(e, m, true);
        if (!section)
            return rc;
        if (!rc) {
            mc__send_end(e);
            return 0;
        }
        char why[512]; /* the pass that may end the section must not replace it */
        snprintf(why, sizeof(why), "%s", mc_last_error());
        mc__send_end(e);
        return mc__set_error(rc, "%s", why);
    }
    rc = msg_new(e, target, id, data, len, opts, &m);
    if (rc)
        return rc;
    pthread_mutex_lock(&e->sub_lock);
    mc_list_push_back(&e->msgq_in, &m->link);
    atomic_store_explicit(&e->msgs_in, true, memory_order_release);
    mc__sub_mark(e);
    pthread_mutex_unlock(&e->sub_lock);
    mc__doorbell(e);
    return 0;
}

static int msg_submit(mc_engine_t *e, mc_segment_id_t target, uint8_t id, const void *data,
                      size_t len, const mc_msg_opts_t *opts)
{
    int rc;

    if (!e)
        return mc__set_error(-EINVAL, "NULL engine");
    MC_LOG_SCOPE(e->cfg.log_level);
    if ((rc = msg_check(data, len, opts)))
        return rc;
    rc = msg_make(e, target, id, data, len, opts);
    if (rc == -EAGAIN && !mc__in_pass_of(e) && mc__progress_implicit(e))
        rc = msg_make(e, target, id, data, len, opts); /* the pass took answers in */
    return rc;
}

int mc_msg_send_ex(mc_engine_t *e, mc_segment_id_t target, uint8_t id, const void *data, size_t len,
                   const mc_msg_opts_t *opts)
{
    if (id == 0)
        return mc__set_error(-EINVAL, "mc_msg_send: id 0 is reserved for notifications");
    return msg_submit(e, target, id, data, len, opts);
}

int mc_msg_send(mc_engine_t *e, mc_segment_id_t target, uint8_t id, const void *data, size_t len)
{
    return mc_msg_send_ex(e, target, id, data, len, NULL);
}

int mc_notify_send(mc_engine_t *e, mc_segment_id_t target, const void *msg, size_t len)
{
    return msg_submit(e, target, 0, msg, len, NULL);
}

int mc__msg_reserve(mc_engine_t *e, mc_segment_id_t target, const void *data, size_t len,
                    mc_msg_t **m_p)
{
    int rc = msg_check(data, len, NULL);

    if (!rc && atomic_load_explicit(&e->stop, memory_order_relaxed)) /* a callback's, at destroy */
        rc = mc__set_error(-MC_ECANCELED, "the engine is being destroyed");
    return rc ? rc : msg_new(e, target, 0, data, len, NULL, m_p);
}

void mc__msg_put(mc_engine_t *e, mc_msg_t *m)
{
    if (--m->refs)
        return;
    mc_buf_free(m->pass_buf ? &e->msg_bufs_pass : &e->msg_bufs, m, sizeof(*m) + m->len);
}

/* m leaves its peer's window: delivered (status 0) or never will be. */
static void msg_done(mc_engine_t *e, mc_peer_t *p, mc_msg_t *m, int status)
{
    if (m->cb && !mc__cb_hold_done(e, m->cb, m->cb_arg, status)) { /* it carries its own */
        m->status = status;
        m->refs++;
        mc_list_push_back(&e->done_msgs, &m->link);
    }
    if (p)
        window_give(p, m->pass_buf, m->len);
    m->inflight = false;
    mc__msg_put(e, m);
}

void mc__msg_unreserve(mc_engine_t *e, mc_msg_t *m)
{
    msg_done(e, mc__peer_get(e, m->target), m, -MC_ECANCELED);
}

/* A transport faster than the control link (same-host shared memory, rdma) carries p's
 * messages once it is up: tried when one is routed, answered or sent again. It takes them only
 * once nothing is unanswered, so that all a carrier ever holds can be taken in order (a ring
 * cannot skip a record whose predecessors went another way): meanwhile the control link takes
 * no more (msg_hold), so a steady stream switches too. */
static void faster_carrier(mc_engine_t *e, mc_peer_t *p)
{
    p->msg_hold = false;
    for (unsigned i = 0; p->msg_tp == e->ctrl && i < mc__n_transports; i++) {
        if (i == e->ctrl || !p->tp[i] || !MC_TP_HAS(mc__transports[i], msg_open) ||
            !mc__transports[i]->msg_open(e, p))
            continue;
        if (!mc_list_empty(&p->msg_unacked)) {
            p->msg_hold = true;
            return;
        }
        p->msg_tp = (uint8_t)i;
        mc__peer_activate(e, p); /* its fill takes what is queued */
    }
}

/* Queue m on its peer, numbered. now: a carrier that keeps payloads where it writes them
 * (msg_direct: shm's ring) takes it at once, and the peer is left for the scheduler only if it
 * could not (a message sent from a send section or a callback; the scheduler's walk of the
 * active peers was a tenth of a same-host message's path). */
static uint64_t route(mc_engine_t *e, mc_msg_t *m, bool now)
{
    mc_peer_t *p = mc__peer_get(e, m->target); /* the table is read without its lock here */

    if (!p || p->state == MC_SEGMENT_DEAD) { /* closed or dead since it was sent */
        msg_done(e, p, m, p ? -MC_EPEERDEAD : -MC_ECANCELED);
        return 0;
    }
    uint64_t seq = m->seq = ++p->msg_seq;
    mc_list_push_back(&p->msgq, &m->link);
    faster_carrier(e, p);
    const mc_transport_ops_t *tp = mc__transports[p->msg_tp];
    if (now && p->tp[p->msg_tp] && MC_TP_HAS(tp, msg_direct))
        tp->fill(e, p);
    if (!mc_list_empty(&p->msgq))
        mc__peer_activate(e, p);
    return seq;
}

uint64_t mc__msg_route(mc_engine_t *e, mc_msg_t *m)
{
    return route(e, m, false);
}

mc_msg_t *mc__msg_peek(mc_peer_t *p, unsigned tp)
{
    if (tp != p->msg_tp || p->msg_hold || mc_list_empty(&p->msgq))
        return NULL;
    if (p->msg_retry_ns) { /* refused: not before then */
        if (mc__now_ns() < p->msg_retry_ns)
            return NULL;
        p->msg_retry_ns = 0;
    }
    return mc_container_of(p->msgq.next, mc_msg_t, link);
}

mc_msg_t *mc__msg_take(mc_engine_t *e, mc_peer_t *p, unsigned tp)
{
    mc_msg_t *m = mc__msg_peek(p, tp);

    (void)e;
    if (!m)
        return NULL;
    mc_list_del(&m->link);
    mc_list_push_back(&p->msg_unacked, &m->link);
    m->inflight = true;
    m->tp = (uint8_t)tp;
    m->tx++;
    m->refs++;
    return m;
}

static mc_msg_t *first_msg(mc_list_t *list)
{
    return mc_container_of(list->next, mc_msg_t, link);
}

/* Every unacknowledged message goes back to the front of msgq, in order, to be sent again
 * (after delay_ns), but with keep_taken those in the receiver's queue (taken: the first ones),
 * which wait for their handlers there. */
static void go_back(mc_engine_t *e, mc_peer_t *p, uint64_t delay_ns, bool keep_taken)
{
    mc_list_t again;

    mc_list_init(&again);
    mc_list_splice_back(&again, &p->msg_unacked);
    while (keep_taken && !mc_list_empty(&again) && first_msg(&again)->taken)
        mc_list_push_back(&p->msg_unacked, mc_list_pop_front(&again));
    for (mc_list_t *pos = again.next; pos != &again; pos = pos->next) {
        mc_msg_t *m = mc_container_of(pos, mc_msg_t, link);
        m->inflight = false;
        e->msgs_taken -= m->taken;
        m->taken = false;
    }
    mc_list_splice_back(&again, &p->msgq);
    mc_list_splice_back(&p->msgq, &again);
    if (delay_ns)
        p->msg_retry_ns = mc__now_ns() + delay_ns;
}

/* The oldest message p has not had acknowledged leaves: in the receiver's queue (status 0; its
 * handler ran, if it answers so), or refused for good. */
static void msg_acked(mc_engine_t *e, mc_peer_t *p, int status)
{
    mc_msg_t *x = first_msg(&p->msg_unacked);

    mc_list_del(&x->link);
    p->msg_acked = x->seq;
    e->msgs_taken -= x->taken;
    if (!status) {
        mc__count_pass(&p->c[MC_CNT_MSGS_SENT], 1);
        mc__count_pass(&e->c[x->tp][MC_CNT_MSGS_SENT], 1);
    }
    msg_done(e, p, x, status);
}

/* Some of p's messages were acknowledged: the rest may switch carriers, flushes may end. */
static void acked_after(mc_engine_t *e, mc_peer_t *p)
{
    if (!mc_list_empty(&p->msgq) || p->msg_hold)
        faster_carrier(e, p);
    mc__flushes_check(e, p);
}

void mc__msg_answered(mc_engine_t *e, mc_peer_t *p, mc_msg_t *m, uint32_t tx, int status)
{
    if (!m->inflight || m->tx != tx) /* sent again since; this answer is of an earlier send */
        return;
    if (status == -EAGAIN) {
        go_back(e, p, RESEND_DELAY_NS, true);
        if (p->msg_hold)
            faster_carrier(e, p);
        mc__peer_activate(e, p);
        return;
    }
    /* Answers come in order: m and whatever was sent before it are in the receiver's queue (or
     * m was refused for good: status). */
    if (status == MC__MSG_LATER) { /* they leave once the receiver says their handlers ran */
        p->msg_taken_ns = mc__now_ns();
        for (mc_list_t *pos = p->msg_unacked.next;; pos = pos->next) {
            mc_msg_t *x = mc_container_of(pos, mc_msg_t, link);
            x->inflight = false;
            e->msgs_taken += !x->taken;
            x->taken = true;
            if (x == m)
                return;
        }
    }
    while (first_msg(&p->msg_unacked) != m)
        msg_acked(e, p, 0);
    msg_acked(e, p, status);
    acked_after(e, p);
}

void mc__msg_handled(mc_engine_t *e, mc_peer_t *p, uint64_t stream, uint64_t seq)
{
    if (stream != p->msg_stream)
        return; /* (an earlier stream's, before p was opened again) */
    while (!mc_list_empty(&p->msg_unacked) && first_msg(&p->msg_unacked)->seq <= seq)
        msg_acked(e, p, 0); /* (in flight again after a lost link: its answer is dropped) */
    p->msg_taken_ns = mc__now_ns();
    acked_after(e, p);
}

void mc__msgs_tick(mc_engine_t *e, uint64_t now)
{
    uint64_t quiet = 2 * (uint64_t)e->cfg.io_timeout_ms * MC_MS;

    for (size_t i = 0; e->msgs_taken && i < e->n_peers; i++) {
        mc_peer_t *p = mc__peer_at(e, i);
        if (!p || mc_list_empty(&p->msg_unacked) || !first_msg(&p->msg_unacked)->taken ||
            (int64_t)(now - p->msg_taken_ns) < (int64_t)quiet)
            continue;
        p->msg_taken_ns = now;
        go_back(e, p, 0, false);
        if (p->msg_hold)
            faster_carrier(e, p);
        mc__peer_activate(e, p);
    }
}

void mc__msg_link_lost(mc_engine_t *e, mc_peer_t *p, unsigned tp)
{
    if (tp != p->msg_tp || mc_list_empty(&p->msg_unacked))
        return;
    go_back(e, p, 0, false); /* those taken too: their receiver tells on the link they come on */
    if (p->msg_hold)
        faster_carrier(e, p);
    mc__peer_activate(e, p);
}

/* ---- receiving ---- */

/* The next sequence number expected of each stream that sent to us (open addressing; a full
 * table forgets the streams least recently heard from). */
typedef struct rx_stream {
    uint64_t stream, next, used;
    uint64_t handled; /* answered MC__MSG_LATER: the messages up to it ran their handlers */
    unsigned pending; /* ... these, answered so, wait for theirs */
} rx_stream_t;

struct mc_rx_streams {
    rx_stream_t *v;
    size_t cap, n;
    uint64_t clock;
};

static rx_stream_t *rx_slot(struct mc_rx_streams *r, uint64_t stream)
{
    size_t i = (size_t)(stream * 0x9e3779b97f4a7c15ull) & (r->cap - 1);

    while (r->v[i].stream && r->v[i].stream != stream)
        i = (i + 1) & (r->cap - 1);
    return &r->v[i];
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

    return (x > y) - (x < y);
}

/* The median of the streams' last uses: streams used at or after it are the newer half. (The
 * clock moves at every message, so clock - n/2 kept only the streams of the last n/2 messages:
 * one busy stream left a handful.) */
static int rx_median_use(const struct mc_rx_streams *r, uint64_t *median_p)
{
    uint64_t *u = malloc(r->n * sizeof(*u));
    size_t k = 0;

    if (!u)
        return -ENOMEM;
    for (size_t i = 0; i < r->cap; i++)
        if (r->v[i].stream)
            u[k++] = r->v[i].used;
    qsort(u, k, sizeof(*u), cmp_u64);
    *median_p = u[k / 2];
    free(u);
    return 0;
}

/* Rebuild into cap slots, keeping the most recently used half when there are too many. */
static int rx_rebuild(struct mc_rx_streams *r, size_t cap)
{
    rx_stream_t *old = r->v;
    size_t old_cap = r->cap;
    uint64_t keep_from = 0;

    if (r->n >= RX_STREAMS_MAX && rx_median_use(r, &keep_from))
        return -ENOMEM;
    r->v = calloc(cap, sizeof(*r->v));
    if (!r->v) {
        r->v = old;
        return -ENOMEM;
    }
    r->cap = cap;
    r->n = 0;
    for (size_t i = 0; i < old_cap; i++) {
        if (!old[i].stream || old[i].used < keep_from)
            continue;
        *rx_slot(r, old[i].stream) = old[i];
        r->n++;
    }
    free(old);
    return 0;
}

/* The stream's entry; a stream not known yet starts at seq (1 for a new one; a forgotten one
 * resumes where it is). */
static rx_stream_t *rx_find(mc_engine_t *e, uint64_t stream, uint64_t seq)
{
    struct mc_rx_streams *r = e->rx_streams;

    if (!r) {
        r = e->rx_streams = calloc(1, sizeof(*r));
        if (!r || rx_rebuild(r, 64))
            return NULL;
    }
    if (2 * (r->n + 1) > r->cap && rx_rebuild(r, r->n + 1 >= RX_STREAMS_MAX ? r->cap : 2 * r->cap))
        return NULL;
    rx_stream_t *s = rx_slot(r, stream);
    if (!s->stream) {
        s->stream = stream;
        s->next = seq;
        r->n++;
    }
    s->used = ++r->clock;
    return s;
}

/* The stream's entry, if it is known. */
static rx_stream_t *rx_get(mc_engine_t *e, uint64_t stream)
{
    rx_stream_t *s = e->rx_streams ? rx_slot(e->rx_streams, stream) : NULL;

    return s && s->stream == stream ? s : NULL;
}

static int notify_push(mc_engine_t *e, const char *sender, const void *data, size_t len)
{
    mc_notify_item_t *it;

    pthread_mutex_lock(&e->notify_lock);
    bool full =
        e->n_notify >= MAX_NOTIFY || (e->n_notify && e->notify_bytes + len > MAX_NOTIFY_BYTES);
    if (full) /* under the lock: the next pop sees it and wakes progress */
        atomic_store(&e->rx_notify_full, true);
    pthread_mutex_unlock(&e->notify_lock);
    if (full)
        return -EAGAIN; /* the sender keeps it and tries again */
    it = malloc(sizeof(*it) + len + 1);
    if (!it)
        return -EAGAIN;
    mc__copy_name(it->sender, sender);
    it->len = len;
    memcpy(it->msg, data, len);
    it->msg[len] = 0;
    pthread_mutex_lock(&e->notify_lock);
    mc_list_push_back(&e->notifyq, &it->link);
    e->n_notify++;
    e->notify_bytes += len;
    pthread_mutex_unlock(&e->notify_lock);
    return 0;
}

/* Whether a ring still lends records of stream to handlers that may not have run. */
static bool ring_lends(mc_engine_t *e, uint64_t stream)
{
    for (unsigned i = 0; i < mc__n_transports; i++)
        if (e->tp[i] && MC_TP_HAS(mc__transports[i], msg_lending) &&
            mc__transports[i]->msg_lending(e, stream))
            return true;
    return false;
}

int mc__msg_deliver(mc_engine_t *e, unsigned tp, const char *sender, uint64_t stream, uint64_t seq,
                    uint8_t id, const void *data, size_t len, mc_ring_lend_t *lend, uint64_t end)
{
    rx_stream_t *s = rx_find(e, stream, seq);
    /* the sender hears when the handler ran (msg.h): a copied message, over a carrier that tells */
    bool later =
        !lend && e->cfg.msg_ack_after_handler && MC_TP_HAS(mc__transports[tp], msg_handled);
    mc_msg_tell_t tell = {.stream = stream, .seq = seq, .tp = (uint8_t)tp};
    int rc;

    if (!s)
        return -EAGAIN;
    if (seq < s->next) { /* a duplicate: it was delivered already (its handler may not have run) */
        /* one a ring took and lends to its handler, sent again after the ring went (over the
         * control link, or a ring set up since): asked again later (a ring that brought it
         * stays blocked), once the loans came back (its handler ran then) */
        if ((later || (lend && e->cfg.msg_ack_after_handler)) && ring_lends(e, stream))
            return -EAGAIN;
        return later && s->pending && seq > s->handled ? MC__MSG_LATER : 0;
    }
    if (seq > s->next)
        return -EAGAIN; /* one before it is missing: the sender goes back to it */
    /* a notification is handled as it is queued, but its sender hears of it only after the
     * messages ahead of it: a mark in the held queue, if one still waits for its handler */
    bool mark = later && id == 0 && s->pending;
    if (mark && mc__cb_hold_mark(e, &tell))
        return -EAGAIN;
    rc = id == 0 ? notify_push(e, sender, data, len)
                 : mc__cb_hold_msg(e, sender, id, data, len, lend, end, later ? &tell : NULL);
    if (rc) {
        if (mark)
            mc__cb_unhold_mark(e);
        return rc;
    }
    s->next = seq + 1;
    mc__count_pass(&e->c[tp][MC_CNT_MSGS_RECEIVED], 1);
    if (!later)
        return 0;
    if (id == 0 && !mark) {
        s->handled = seq;
        return 0;
    }
    s->pending++;
    return MC__MSG_LATER;
}

void mc__msg_ran(mc_engine_t *e, const mc_msg_tell_t *t)
{
    rx_stream_t *s = rx_get(e, t->stream); /* (forgotten meanwhile: the sender is told anyway) */

    if (s && s->pending) {
        s->pending--;
        if (t->seq > s->handled)
            s->handled = t->seq;
    }
    mc__transports[t->tp]->msg_handled(e, t->stream, t->seq);
}

int mc_notify_pop(mc_engine_t *e, mc_notify_t *out)
{
    mc_list_t *n;

    if (!e || !out)
        return mc__set_error(-EINVAL, "mc_notify_pop: NULL argument");
    mc__progress_implicit(e);
    pthread_mutex_lock(&e->notify_lock);
    n = mc_list_pop_front(&e->notifyq);
    if (n) {
        e->n_notify--;
        e->notify_bytes -= mc_container_of(n, mc_notify_item_t, link)->len;
    }
    pthread_mutex_unlock(&e->notify_lock);
    if (!n)
        return 0;
    if (atomic_exchange(&e->rx_notify_full, false)) /* there is room: take what waits */
        mc__doorbell(e);
    mc_notify_item_t *it = mc_container_of(n, mc_notify_item_t, link);
    memcpy(out->sender, it->sender, sizeof(out->sender));
    out->len = it->len;
    memcpy(out->msg, it->msg, it->len);
    if (it->len < sizeof(out->msg))
        out->msg[it->len] = 0;
    free(it);
    return 1;
}

/* ---- flushes ---- */

int mc_peer_flush(mc_engine_t *e, mc_segment_id_t target, mc_done_cb cb, void *arg)
{
    mc_flush_t *f;
    int rc = 0;

    if (!e || !cb)
        return mc__set_error(-EINVAL, "mc_peer_flush: NULL argument");
    if (atomic_load_explicit(&e->stop, memory_order_relaxed)) /* a callback during destroy */
        return mc__set_error(-MC_ECANCELED, "the engine is being destroyed");
    pthread_rwlock_rdlock(&e->peers_lock);
    mc_peer_t *p = mc__peer_get(e, target);
    if (!p)
        rc = mc__set_error(-MC_ENOSEGMENT, "segment %u is not open", target);
    else if (p->state == MC_SEGMENT_DEAD)
        rc = mc__set_error(-MC_EPEERDEAD, "%s", p->dead_reason);
    pthread_rwlock_unlock(&e->peers_lock);
    if (rc)
        return rc;
    f = calloc(1, sizeof(*f));
    if (!f)
        return mc__set_error(-ENOMEM, "out of memory");
    f->target = target;
    f->cb = cb;
    f->cb_arg = arg;
    pthread_mutex_lock(&e->sub_lock);
    mc_list_push_back(&e->flushq_in, &f->link);
    mc__sub_mark(e);
    pthread_mutex_unlock(&e->sub_lock);
    mc__doorbell(e);
    if (e->implicit_progress) /* without callbacks: this flush's must not run in this call */
        mc__progress_quiet(e);
    return 0;
}

static void linger_flushed(void *arg, int status)
{
    (void)status; /* acknowledged, or the peer died: either way nothing is left to wait for */
    atomic_fetch_sub((atomic_uint *)arg, 1);
}

void mc__msgs_linger(mc_engine_t *e)
{
    uint64_t end = mc__now_ns() + (uint64_t)e->cfg.linger_ms * MC_MS;
    mc_segment_id_t *ids = NULL;
    size_t n = 0;

    if (!e->cfg.linger_ms || mc__in_progress())
        return;
    pthread_rwlock_rdlock(&e->peers_lock);
    size_t n_peers = atomic_load(&e->n_peers);
    ids = calloc(n_peers ? n_peers : 1, sizeof(*ids));
    for (size_t i = 0; ids && i < n_peers; i++) {
        mc_peer_t *p = mc__peer_get(e, (mc_segment_id_t)i);
        if (p && p->state != MC_SEGMENT_DEAD &&
            atomic_load_explicit(&p->queued_msgs, memory_order_relaxed) +
                atomic_load_explicit(&p->queued_pass, memory_order_relaxed))
            ids[n++] = (mc_segment_id_t)i;
    }
    pthread_rwlock_unlock(&e->peers_lock);
    for (size_t i = 0; i < n; i++) {
        atomic_fetch_add(&e->lingering, 1);
        if (mc_peer_flush(e, ids[i], linger_flushed, &e->lingering))
            atomic_fetch_sub(&e->lingering, 1); /* closed or dead meanwhile */
    }
    free(ids);
    while (atomic_load(&e->lingering) && mc__now_ns() < end) {
        if (!e->has_thread)
            mc_engine_progress(e);
        if (atomic_load(&e->lingering)) /* a peer that is slow to answer: no core spun */
            nanosleep(&(struct timespec){.tv_nsec = 50000}, NULL);
    }
    if (atomic_load(&e->lingering))
        mc_warn("engine destroyed with messages to %u peers not acknowledged after %u ms "
                "(MC_LINGER_MS): they fail",
                atomic_load(&e->lingering), e->cfg.linger_ms);
}

static void flush_done(mc_engine_t *e, mc_flush_t *f, int status)
{
    if (mc__cb_hold_done(e, f->cb, f->cb_arg, status)) {
        free(f);
    } else { /* it carries its own */
        f->status = status;
        mc_list_push_back(&e->done_flushes, &f->link);
    }
}

void mc__msgs_done_run(mc_engine_t *e)
{
    mc_list_t *n;

    while ((n = mc_list_pop_front(&e->done_msgs))) {
        mc_msg_t *m = mc_container_of(n, mc_msg_t, link);
        m->cb(m->cb_arg, m->status);
        mc__msg_put(e, m);
    }
    while ((n = mc_list_pop_front(&e->done_flushes))) {
        mc_flush_t *f = mc_container_of(n, mc_flush_t, link);
        f->cb(f->cb_arg, f->status);
        free(f);
    }
}

/* f waits for what the tasks in list hold of its peer p: those to p, and the notifications to p
 * of their batches (wherever their data goes), which are routed only once their last task is
 * let go of. What a flush before f waits for is covered by waiting for that flush. */
static void flush_link(mc_list_t *list, mc_peer_t *p, mc_flush_t *f)
{
    for (mc_list_t *pos = list->next; pos != list; pos = pos->next) {
        mc_task_t *t = mc_container_of(pos, mc_task_t, alink);
        mc_notify_group_t *g = t->group;
        if (t->peer == p && !t->flush) {
            t->flush = f;
            f->tasks++;
        }
        if (g && g->m && g->target == f->target && !g->flush) {
            g->flush = f;
            f->tasks++;
        }
    }
}

/* f goes (failed): no task or notification points at it any more. */
static void flush_unlink(mc_list_t *list, mc_flush_t *f)
{
    for (mc_list_t *pos = list->next; pos != list; pos = pos->next) {
        mc_task_t *t = mc_container_of(pos, mc_task_t, alink);
        if (t->flush == f)
            t->flush = NULL;
        if (t->group && t->group->flush == f)
            t->group->flush = NULL;
    }
}

void mc__flush_start(mc_engine_t *e, mc_flush_t *f)
{
    mc_peer_t *p = mc__peer_get(e, f->target);

    if (!p || p->state == MC_SEGMENT_DEAD) {
        flush_done(e, f, p ? -MC_EPEERDEAD : -MC_ECANCELED);
        return;
    }
    /* Every task the engine still holds (tasks queued with it were drained before it), the
     * ones let go of in this pass included: their notifications are not routed yet. */
    flush_link(&e->active_tasks, p, f);
    flush_link(&e->releaseq, p, f);
    f->msg_seq = p->msg_seq;
    mc_list_push_back(&p->flushes, &f->link);
    mc__flushes_check(e, p);
}

void mc__flushes_check(mc_engine_t *e, mc_peer_t *p)
{
    mc_list_t *n;

    while (!mc_list_empty(&p->flushes)) {
        mc_flush_t *f = mc_container_of(p->flushes.next, mc_flush_t, link);
        if (f->tasks || p->msg_acked < f->msg_seq)
            return;
        n = mc_list_pop_front(&p->flushes);
        flush_done(e, mc_container_of(n, mc_flush_t, link), 0);
    }
}

void mc__flush_task_done(mc_engine_t *e, mc_task_t *t)
{
    mc_flush_t *f = t->flush;

    t->flush = NULL;
    if (f && --f->tasks == 0)
        mc__flushes_check(e, t->peer);
}

void mc__flush_group_done(mc_engine_t *e, mc_notify_group_t *g, uint64_t seq)
{
    mc_flush_t *f = g->flush;

    if (!f)
        return;
    g->flush = NULL;
    if (seq > f->msg_seq)
        f->msg_seq = seq;
    if (--f->tasks == 0)
        mc__flushes_check(e, mc__peer_get(e, g->target)); /* (open: f would have gone with it) */
}

/* ---- peers going away ---- */

unsigned mc__msgs_fail_peer(mc_engine_t *e, mc_peer_t *p, int err)
{
    const mc_transport_ops_t *carrier = mc__transports[p->msg_tp];
    unsigned n_msgs = 0;
    mc_list_t *n;

    if (MC_TP_HAS(carrier, msg_settle)) /* what the receiver took was delivered */
        carrier->msg_settle(e, p);
    while (!mc_list_empty(&p->msg_unacked) && first_msg(&p->msg_unacked)->taken)
        msg_acked(e, p, 0);  /* in its queue: delivered, its handler run or not */
    go_back(e, p, 0, false); /* the unacknowledged first, in order */
    while ((n = mc_list_pop_front(&p->msgq))) {
        msg_done(e, p, mc_container_of(n, mc_msg_t, link), err);
        n_msgs++;
    }
    while ((n = mc_list_pop_front(&p->flushes))) {
        mc_flush_t *f = mc_container_of(n, mc_flush_t, link);
        flush_unlink(&e->active_tasks, f);
        flush_unlink(&e->releaseq, f); /* (its tasks failed just now wait there) */
        flush_done(e, f, err);
    }
    return n_msgs;
}

void mc__msgs_peer_fini(mc_engine_t *e, mc_peer_t *p)
{
    mc__msgs_fail_peer(e, p, -MC_ECANCELED);
}

void mc__msgs_cancel_all(mc_engine_t *e)
{
    mc_list_t msgs, flushes, *n;

    mc_list_init(&msgs);
    mc_list_init(&flushes);
    pthread_mutex_lock(&e->sub_lock);
    mc_list_splice_back(&msgs, &e->msgq_in);
    mc_list_splice_back(&flushes, &e->flushq_in);
    pthread_mutex_unlock(&e->sub_lock);
    while ((n = mc_list_pop_front(&msgs))) {
        mc_msg_t *m = mc_container_of(n, mc_msg_t, link);
        msg_done(e, mc__peer_get(e, m->target), m, -MC_ECANCELED);
    }
    while ((n = mc_list_pop_front(&flushes)))
        flush_done(e, mc_container_of(n, mc_flush_t, link), -MC_ECANCELED);
    for (size_t i = 0; i < e->n_peers; i++) {
        mc_peer_t *p = mc__peer_at(e, i);
        if (p)
            mc__msgs_fail_peer(e, p, -MC_ECANCELED);
    }
}

void mc__msgs_fini(mc_engine_t *e)
{
    mc_list_t *n;

    while ((n = mc_list_pop_front(&e->notifyq)))
        free(mc_container_of(n, mc_notify_item_t, link));
    while ((n = mc_list_pop_front(&e->msgq_in)))
        free(mc_container_of(n, mc_msg_t, link));
    mc_buf_fini(&e->msg_bufs);
    mc_buf_fini(&e->msg_bufs_pass);
    while ((n = mc_list_pop_front(&e->flushq_in)))
        free(mc_container_of(n, mc_flush_t, link));
    if (e->rx_streams)
        free(e->rx_streams->v);
    free(e->rx_streams);
    e->rx_streams = NULL;
}
