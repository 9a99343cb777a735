/* Peers: their life (create, descriptor changes, destroy), the transports that reach each one,
 * the work waiting for a descriptor, and the events hosts hear about them.
 *
 * A peer is OPENING while its descriptor is not known yet (opened by address, or by a name the
 * metadata cache has not seen), READY once it is, DEAD once its process is known to be gone.
 * Tasks whose remote range the descriptor lacks (the peer may have registered memory since)
 * wait on the peer, parked, while the descriptor is asked of the peer itself over the control
 * link, or (by name, before any link) found in the metadata cache; they go on when it comes and
 * fail if it does not within MC_CONNECT_TIMEOUT_MS. Nothing here blocks the submitting thread
 * or the progress context. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "callbacks.h"
#include "msg.h"
#include "transport/transport.h"

mc_peer_t *mc__peer_get(mc_engine_t *e, mc_segment_id_t id)
{
    return id < e->n_peers ? mc__peer_at(e, id) : NULL;
}

/* ---- which transports reach it ---- */

/* Let every transport look at p's (new) descriptor, and order those that reach it, best first.
 * Caller holds peers_lock for writing, or owns p alone. The control transport must reach it. */
static int peer_route(mc_engine_t *e, mc_peer_t *p)
{
    int score[MC_TP_MAX] = {0};
    unsigned n = 0;

    for (unsigned i = 0; i < mc__n_transports; i++) {
        const mc_transport_ops_t *ops = mc__transports[i];
        if (!e->tp[i] || !MC_TP_HAS(ops, peer_update))
            continue;
        score[i] = ops->peer_update(e, p);
        if (score[i] < 0)
            return score[i];
    }
    if (score[e->ctrl] <= 0)
        return mc__set_error(-MC_EPROTO, "segment %s cannot be reached over %s: %s", p->name,
                             mc__transports[e->ctrl]->name, mc_last_error());
    for (unsigned i = 0; i < mc__n_transports; i++) { /* insertion by score, stable */
        unsigned k = n++;
        if (score[i] <= 0) {
            n--;
            continue;
        }
        while (k > 0 && score[p->order[k - 1]] < score[i]) {
            p->order[k] = p->order[k - 1];
            k--;
        }
        p->order[k] = (uint8_t)i;
    }
    p->n_order = n;
    return 0;
}

/* Make d p's descriptor (taking it over) and let the transports see it. Caller holds
 * peers_lock for writing, or owns p alone. On failure p keeps its old descriptor and d is
 * freed. */
static int peer_install(mc_engine_t *e, mc_peer_t *p, mc_desc_t *d)
{
    mc_desc_t old = p->desc;
    int rc;

    d->layout = old.layout + 1;
    d->serials = old.serials;
    for (size_t i = 0; i < d->n_buffers; i++) /* (a descriptor may list one range twice) */
        d->buffers[i].serial = ++d->serials;
    p->desc = *d;
    if (p->state == MC_SEGMENT_OPENING)
        snprintf(p->name, sizeof(p->name), "%s", d->name);
    if (d->host_id[0])
        p->local_host = !strcmp(d->host_id, e->host_id);
    rc = peer_route(e, p);
    if (rc) {
        p->desc = old;
        mc__desc_free(d);
        if (old.n_buffers || old.tp[e->ctrl])
            peer_route(e, p); /* back to what worked */
        return rc;
    }
    mc__desc_free(&old);
    return 0;
}

/* p's state, with the reason when it is DEAD (submitters read both under peers_lock). */
static void set_state(mc_engine_t *e, mc_peer_t *p, int state, const char *why)
{
    pthread_rwlock_wrlock(&e->peers_lock);
    p->state = state;
    if (why)
        snprintf(p->dead_reason, sizeof(p->dead_reason), "%s", why);
    pthread_rwlock_unlock(&e->peers_lock);
}

static void peer_free(mc_engine_t *e, mc_peer_t *p)
{
    for (unsigned i = 0; i < mc__n_transports; i++)
        if (p->tp[i] && MC_TP_HAS(mc__transports[i], peer_close))
            mc__transports[i]->peer_close(e, p);
    if (p->active) /* after the transports: closing a link may activate it (a request lost) */
        mc_list_del(&p->active_link);
    mc__desc_free(&p->desc);
    free(p);
}

/* A peer that never went into the table (its install failed, or another thread opened the name
 * meanwhile), from any thread: its transports let go of it under e->lock, which guards what
 * they share with progress (shm's list of peers to free at the end of a pass). */
static void peer_discard(mc_engine_t *e, mc_peer_t *p)
{
    bool lock = !mc__in_pass_of(e);

    if (lock)
        mc_lock(&e->lock);
    peer_free(e, p);
    if (lock)
        mc_unlock(&e->lock);
}

int mc__peer_create(mc_engine_t *e, mc_desc_t *d, int state, mc_peer_t **p_p)
{
    mc_peer_t *p = calloc(1, sizeof(*p));
    int rc;

    if (!p) {
        mc__desc_free(d);
        return mc__set_error(-ENOMEM, "out of memory");
    }
    snprintf(p->name, sizeof(p->name), "%s", d->name);
    p->state = state;
    p->refcnt = 1;
    for (int tp = 0; tp < MC_TP_MAX; tp++) {
        mc_list_init(&p->q[tp].pending);
        mc_list_init(&p->q[tp].retry);
    }
    mc_list_init(&p->msgq);
    p->msg_tp = (uint8_t)e->ctrl;
    mc_list_init(&p->msg_unacked);
    mc_list_init(&p->flushes);
    while (!p->msg_stream) /* random, never 0 */
        mc__random_bytes(&p->msg_stream, sizeof(p->msg_stream));
    mc_list_init(&p->parked);
    mc_list_init(&p->active_link);
    rc = d->tp[e->ctrl] ? peer_install(e, p, d) : (p->desc = *d, 0);
    if (rc) {
        peer_discard(e, p);
        return rc;
    }
    *p_p = p;
    return 0;
}

/* The open peer with this name (or, instance non-zero, this instance, or this name, if given,
 * while its instance is not known yet: one opened by name, still OPENING, is the same engine,
 * not a second peer with a message stream of its own), with a reference taken; NULL if none. A DEAD
 * peer is not found: opening its name again gives a new peer. Caller holds peers_lock for
 * writing. */
static mc_peer_t *peer_find_ref(mc_engine_t *e, const char *name, uint64_t instance)
{
    for (size_t i = 0; i < e->n_peers; i++) {
        mc_peer_t *p = mc__peer_at(e, i);
        if (!p || p->state == MC_SEGMENT_DEAD)
            continue;
        if (instance && p->desc.instance ? p->desc.instance == instance
                                         : name && !strcmp(p->name, name)) {
            p->refcnt++;
            return p;
        }
    }
    return NULL;
}

int mc__peer_open_ref(mc_engine_t *e, const char *name, uint64_t instance, mc_segment_id_t *id_p)
{
    pthread_rwlock_wrlock(&e->peers_lock);
    mc_peer_t *p = peer_find_ref(e, name, instance);
    if (p)
        *id_p = p->id;
    pthread_rwlock_unlock(&e->peers_lock);
    return p != NULL;
}

void mc__peer_unref(mc_engine_t *e, mc_peer_t *p)
{
    pthread_rwlock_wrlock(&e->peers_lock);
    p->refcnt--;
    pthread_rwlock_unlock(&e->peers_lock);
}

/* Room for one more peer. The table grows by copy, and the old array stays readable (chained
 * through its extra last slot, freed with the engine): the progress context reads the table
 * without peers_lock while another thread opens a peer. Caller holds peers_lock for writing. */
static int peers_grow(mc_engine_t *e)
{
    size_t cap = e->peers_cap ? 2 * e->peers_cap : 16;
    mc_peer_t **v;

    if (e->n_peers < e->peers_cap)
        return 0;
    v = calloc(cap + 1, sizeof(*v));
    if (!v)
        return mc__set_error(-ENOMEM, "out of memory");
    if (e->n_peers)
        memcpy(v, e->peers, e->n_peers * sizeof(*v));
    v[cap] = (mc_peer_t *)(void *)e->peers; /* the chain of old arrays */
    e->peers = v;
    e->peers_cap = cap;
    return 0;
}

int mc__peer_insert(mc_engine_t *e, mc_peer_t *p, uint64_t instance, mc_segment_id_t *id_p)
{
    mc_peer_t *old;
    int rc;

    pthread_rwlock_wrlock(&e->peers_lock);
    old = peer_find_ref(e, p->name, instance);
    if (old) { /* opened meanwhile by another thread */
        *id_p = old->id;
        pthread_rwlock_unlock(&e->peers_lock);
        peer_discard(e, p);
        return 0;
    }
    rc = peers_grow(e);
    if (!rc) {
        p->id = (mc_segment_id_t)e->n_peers;
        e->peers[p->id] = p;
        e->n_peers = p->id + 1; /* after the slot is written: lock-free readers */
        atomic_fetch_add(&e->n_open_peers, 1);
        *id_p = p->id;
    }
    pthread_rwlock_unlock(&e->peers_lock);
    if (rc)
        peer_discard(e, p);
    else if (p->state == MC_SEGMENT_OPENING)
        mc__peer_want_desc_async(e, p);
    return rc;
}

int mc__peer_refresh(mc_engine_t *e, mc_peer_t *p, mc_desc_t *d)
{
    int rc;

    if (strcmp(d->name, p->name) && p->state != MC_SEGMENT_OPENING) {
        rc = mc__set_error(-MC_ENOSEGMENT, "segment %s now answers as %s", p->name, d->name);
        mc__desc_free(d);
        return rc;
    }
    if (p->state == MC_SEGMENT_READY && p->desc.instance && d->instance &&
        d->instance != p->desc.instance) { /* its process was replaced: never rebind to it */
        unsigned long long was = p->desc.instance, now = d->instance;
        mc__desc_free(d);
        mc__peer_dead(e, p, "another engine (instance %016llx, was %016llx) took its name", now,
                      was);
        return mc__set_error(-MC_ENOSEGMENT, "segment %s is another engine now", p->name);
    }
    pthread_rwlock_wrlock(&e->peers_lock);
    rc = peer_install(e, p, d);
    pthread_rwlock_unlock(&e->peers_lock);
    if (rc)
        mc_warn("segment %s: its new descriptor is unusable: %s", p->name, mc_last_error());
    return rc;
}

int mc__peer_reload_cached(mc_engine_t *e, mc_peer_t *p)
{
    mc_meta_kv_t kv;
    mc_desc_t d;
    int rc;

    if (!p->by_metadata || !e->meta || p->state != MC_SEGMENT_READY)
        return -ENOENT;
    rc = mc__meta_lookup(e, p->name, true, &kv);
    if (rc)
        return rc;
    rc = mc__desc_decode(kv.value, kv.value_len, &d);
    mc__meta_kv_free(&kv);
    return rc ? rc : mc__peer_refresh(e, p, &d);
}

/* ---- waiting for a descriptor ---- */

/* Ask for p's descriptor from the progress context: over the control link if p has one,
 * else (opened by name) from the metadata cache at every tick. */
static void want_desc(mc_engine_t *e, mc_peer_t *p)
{
    if (!p->desc_wanted) {
        p->desc_wanted = true;
        p->desc_asked = false;
        p->desc_deadline_ns = mc__now_ns() + (uint64_t)e->cfg.connect_timeout_ms * MC_MS;
    }
    mc__peer_activate(e, p);
}

/* Have progress look at p (mc__peer_kicked). Caller holds e->sub_lock. */
static void kick_locked(mc_engine_t *e, mc_peer_t *p)
{
    if (!p->desc_kick) {
        p->desc_kick = true;
        mc_list_push_back(&e->descq, &p->desc_link);
        mc__sub_mark(e);
    }
}

void mc__peer_want_desc_async(mc_engine_t *e, mc_peer_t *p)
{
    pthread_mutex_lock(&e->sub_lock);
    kick_locked(e, p);
    pthread_mutex_unlock(&e->sub_lock);
    mc__doorbell(e);
}

void mc__peer_refresh_async(mc_engine_t *e, mc_peer_t *p, mc_desc_t *d)
{
    mc_desc_t *held = malloc(sizeof(*held)), *old;

    if (!held) {
        mc__desc_free(d);
        return;
    }
    *held = *d;
    pthread_mutex_lock(&e->sub_lock);
    old = p->pending_desc;
    p->pending_desc = held;
    kick_locked(e, p);
    pthread_mutex_unlock(&e->sub_lock);
    if (old) { /* superseded before progress saw it */
        mc__desc_free(old);
        free(old);
    }
    mc__doorbell(e);
}

static void unpark(mc_engine_t *e, mc_peer_t *p, int err, const char *why, bool final);

void mc__peer_kicked(mc_engine_t *e, mc_peer_t *p)
{
    mc_desc_t *d;

    pthread_mutex_lock(&e->sub_lock);
    d = p->pending_desc;
    p->pending_desc = NULL;
    pthread_mutex_unlock(&e->sub_lock);
    if (d) {
        if (mc__peer_refresh(e, p, d) == 0 && !mc_list_empty(&p->parked))
            unpark(e, p, 0, NULL, false); /* those it now holds go on; the others wait */
        free(d);
    }
    if (p->state == MC_SEGMENT_OPENING)
        want_desc(e, p);
}

void mc__peer_park(mc_engine_t *e, mc_task_t *t)
{
    mc_list_push_back(&t->peer->parked, &t->qlink);
    want_desc(e, t->peer);
}

/* Send the pending descriptor request, if the control link can take it now. */
void mc__peer_desc_ask(mc_engine_t *e, mc_peer_t *p)
{
    const mc_transport_ops_t *ctrl = mc__transports[e->ctrl];

    if (!p->desc_wanted || p->desc_asked || !p->tp[e->ctrl])
        return;
    if (ctrl->desc_request(e, p) == 0)
        p->desc_asked = true; /* else no link yet: its readiness activates p */
}

/* Whether p's descriptor holds t's remote range (its buffer list may grow from any thread:
 * buffer keys). */
static bool desc_holds(mc_engine_t *e, mc_peer_t *p, const mc_task_t *t)
{
    pthread_rwlock_rdlock(&e->peers_lock);
    bool found = mc__desc_find(&p->desc, t->req.target_offset, t->req.length) != NULL;
    pthread_rwlock_unlock(&e->peers_lock);
    return found;
}

/* The parked tasks go on with the descriptor p has now, or fail (err). final: it is the peer's
 * current one, so a range it lacks is not registered there (-MC_EACCESS); else such a task
 * stays parked. */
static void unpark(mc_engine_t *e, mc_peer_t *p, int err, const char *why, bool final)
{
    mc_list_t tasks, *n;

    mc_list_init(&tasks);
    mc_list_splice_back(&tasks, &p->parked);
    if (final)
        p->desc_wanted = p->desc_asked = false;
    while ((n = mc_list_pop_front(&tasks))) {
        mc_task_t *t = mc_container_of(n, mc_task_t, qlink);
        if (err) {
            mc__task_finish(t, MC_TASK_FAILED, err, "%s", why);
        } else if (!final && !desc_holds(e, p, t)) {
            mc_list_push_back(&p->parked, &t->qlink);
            continue;
        } else {
            mc__task_route_late(e, t);
        }
        if (atomic_load(&t->state) >= MC_TASK_COMPLETED) {
            t->queued = false;
            mc__task_maybe_release(e, t);
        } else {
            mc_list_push_back(&p->q[t->tp].pending, &t->qlink);
        }
    }
    mc__peer_activate(e, p);
}

void mc__peer_desc_arrived(mc_engine_t *e, mc_peer_t *p, const void *json, size_t len)
{
    bool opening = p->state == MC_SEGMENT_OPENING;
    mc_desc_t d;
    int rc = mc__desc_decode(json, len, &d);

    if (!rc && opening && p->desc.instance && d.instance != p->desc.instance) {
        mc__desc_free(&d);
        rc = mc__set_error(-MC_ENOSEGMENT, "the engine at that address is another instance");
    }
    if (!rc)
        rc = mc__peer_refresh(e, p, &d);
    if (rc) {
        char why[512];
        snprintf(why, sizeof(why), "segment %s: its descriptor: %s", p->name, mc_last_error());
        if (opening)
            mc__peer_unreachable(e, p, rc, why);
        else
            unpark(e, p, rc, why, true);
        return;
    }
    p->lease_lost = false; /* it answers */
    if (opening) {
        set_state(e, p, MC_SEGMENT_READY, NULL);
        mc_info("segment %s is open", p->name);
    }
    unpark(e, p, 0, NULL, true);
    if (p->tp[e->ctrl] && mc__ctrl_ready(e, p))
        mc__peer_link_up(e, p);
}

void mc__peer_desc_retry(mc_engine_t *e, mc_peer_t *p)
{
    p->desc_asked = false;
    mc__peer_activate(e, p);
}

/* How long a peer whose lease expired has to answer: as long as the kernel gives a silent host
 * (10 x MC_IO_TIMEOUT_MS), since a live one may be computing between progress calls. */
static uint64_t lease_probe_ns(const mc_engine_t *e)
{
    uint64_t ms = 10ull * e->cfg.io_timeout_ms;

    return (ms > e->cfg.connect_timeout_ms ? ms : e->cfg.connect_timeout_ms) * MC_MS;
}

/* Peers opened through metadata whose entry was deleted: their lease expired or they left. A
 * process cut off from the metadata service alone still answers: each is asked for its
 * descriptor, and is dead if it does not answer in time (or refuses the connection). */
static void leases_check(mc_engine_t *e, uint64_t now)
{
    unsigned deletions = e->meta ? mc__meta_cache_deletions(e) : 0;

    if (deletions == e->seen_deletions)
        return;
    e->seen_deletions = deletions;
    for (size_t i = 0; i < e->n_peers; i++) {
        mc_peer_t *p = mc__peer_at(e, i);
        mc_meta_kv_t kv;
        if (!p || !p->by_metadata || p->state != MC_SEGMENT_READY)
            continue;
        if (mc__meta_lookup(e, p->name, true, &kv) == 0) {
            mc__meta_kv_free(&kv);
        } else if (!p->lease_lost) {
            p->lease_lost = true;
            p->lease_deadline_ns = now + lease_probe_ns(e);
            want_desc(e, p);
        }
    }
}

/* Whether messages to p, or flushes of them, wait for it. */
static bool msgs_wait(const mc_peer_t *p)
{
    return !mc_list_empty(&p->msgq) || !mc_list_empty(&p->msg_unacked) ||
           !mc_list_empty(&p->flushes);
}

/* Every tick: descriptors that did not come in time, peers opened by a name the metadata cache
 * may have learnt since, peers whose metadata entry went. A peer that stays unreachable while
 * messages wait for it is dead once a lease would have been probed: with no lease (opened by
 * address) nothing else would ever give up on those messages. */
void mc__peers_tick(mc_engine_t *e, uint64_t now)
{
    mc_list_t *pos, *tmp;

    leases_check(e, now);
    mc_list_for_each_safe(pos, tmp, &e->active_peers)
    {
        mc_peer_t *p = mc_container_of(pos, mc_peer_t, active_link);
        char why[512];
        if (p->lease_lost && now >= p->lease_deadline_ns) {
            mc__peer_dead(e, p,
                          "its metadata entry is gone (lease expired) and it does not "
                          "answer");
            continue;
        }
        if (p->reported == MC_PEER_UNREACHABLE && p->state == MC_SEGMENT_READY && msgs_wait(p) &&
            (int64_t)(now - p->unreachable_ns) >= (int64_t)lease_probe_ns(e)) {
            mc__peer_dead(e, p, "unreachable for %llu ms with messages waiting for it",
                          (unsigned long long)((now - p->unreachable_ns) / MC_MS));
            continue;
        }
        if (!p->desc_wanted)
            continue;
        if (p->state == MC_SEGMENT_OPENING && !p->tp[e->ctrl]) {
            mc_meta_kv_t kv;
            if (e->meta && mc__meta_lookup(e, p->name, true, &kv) == 0) {
                mc__peer_desc_arrived(e, p, kv.value, kv.value_len);
                mc__meta_kv_free(&kv);
                continue;
            }
        }
        if (now < p->desc_deadline_ns)
            continue;
        snprintf(why, sizeof(why), "segment %s: no descriptor within %u ms (%s)", p->name,
                 e->cfg.connect_timeout_ms,
                 p->state == MC_SEGMENT_OPENING ? "it could not be opened" : "for a remote range");
        if (p->state == MC_SEGMENT_OPENING) {
            mc__peer_unreachable(e, p, p->tp[e->ctrl] ? -MC_EPEERDEAD : -MC_ENOSEGMENT, why);
            continue;
        }
        unpark(e, p, -MC_EPEERDEAD, why, true);
        if (p->lease_lost) /* keep asking until its own deadline */
            want_desc(e, p);
    }
}

/* ---- events ---- */

int mc_peer_handler_set(mc_engine_t *e, mc_peer_cb cb, void *arg)
{
    if (!e)
        return mc__set_error(-EINVAL, "mc_peer_handler_set: NULL engine");
    mc__handler_set(e, 0, NULL, cb, arg);
    return 0;
}

static void peer_event(mc_engine_t *e, mc_peer_t *p, mc_peer_event_t ev, int err, const char *why)
{
    mc__cb_hold_event(e, p->id, ev, err, why); /* the handler runs at the end of the pass */
}

void mc__peer_link_up(mc_engine_t *e, mc_peer_t *p)
{
    if (p->reported == MC_PEER_CONNECTED || p->state != MC_SEGMENT_READY)
        return;
    p->reported = MC_PEER_CONNECTED;
    peer_event(e, p, MC_PEER_CONNECTED, 0, NULL);
}

void mc__peer_fail_all(mc_engine_t *e, mc_peer_t *p, int err, const char *why)
{
    mc__sched_fail_peer(e, p, err, why);
    unpark(e, p, err, why, true);
}

void mc__peer_unreachable(mc_engine_t *e, mc_peer_t *p, int err, const char *why)
{
    bool news = p->reported != MC_PEER_UNREACHABLE;

    if (p->state == MC_SEGMENT_DEAD)
        return;
    mc_warn("%s", why);
    if (news)
        p->unreachable_ns = mc__now_ns();
    p->reported = MC_PEER_UNREACHABLE;
    if (p->state == MC_SEGMENT_OPENING) { /* never opened: nothing will come of it */
        set_state(e, p, MC_SEGMENT_DEAD, why);
        mc__msgs_fail_peer(e, p, err);
    }
    mc__peer_fail_all(e, p, err, why);
    if (news)
        peer_event(e, p, MC_PEER_UNREACHABLE, err, why);
}

void mc__peer_dead(mc_engine_t *e, mc_peer_t *p, const char *fmt, ...)
{
    char why[512], reason[sizeof(p->dead_reason)];
    va_list ap;

    if (p->state == MC_SEGMENT_DEAD)
        return;
    va_start(ap, fmt);
    vsnprintf(why, sizeof(why), fmt, ap);
    va_end(ap);
    snprintf(reason, sizeof(reason), "segment %s is dead: %s", p->name, why);
    mc_warn("%s", reason);
    set_state(e, p, MC_SEGMENT_DEAD, reason);
    p->reported = MC_PEER_DEAD;
    mc__peer_fail_all(e, p, -MC_EPEERDEAD, reason);
    /* Tasks with slices still on the wire end now too: nothing will answer them (the slices
     * are let go of when their links do). */
    for (mc_list_t *pos = e->active_tasks.next; pos != &e->active_tasks; pos = pos->next) {
        mc_task_t *t = mc_container_of(pos, mc_task_t, alink);
        if (t->peer == p) { /* (a READ of it may still be answered: not into its memory) */
            mc__sched_abandon(e, t);
            mc__task_finish(t, MC_TASK_FAILED, -MC_EPEERDEAD, "%s", reason);
        }
    }
    unsigned lost = mc__msgs_fail_peer(e, p, -MC_EPEERDEAD);
    char event[sizeof(reason) + 64];
    snprintf(event, sizeof(event), "%s; %u message%s not delivered", reason, lost,
             lost == 1 ? "" : "s");
    peer_event(e, p, MC_PEER_DEAD, -MC_EPEERDEAD, event);
}

/* ---- the end ---- */

/* Drop a peer entirely. Caller holds e->lock; the peer has no tasks. */
void mc__peer_destroy(mc_engine_t *e, mc_peer_t *p)
{
    mc__msgs_peer_fini(e, p);
    pthread_mutex_lock(&e->sub_lock);
    if (p->desc_kick)
        mc_list_del(&p->desc_link);
    if (p->pending_desc) {
        mc__desc_free(p->pending_desc);
        free(p->pending_desc);
    }
    pthread_mutex_unlock(&e->sub_lock);
    atomic_fetch_sub(&e->n_open_peers, 1);
    peer_free(e, p);
}

void mc__peers_fini(mc_engine_t *e)
{
    mc_peer_t **v = e->peers;
    size_t cap = e->peers_cap;

    for (size_t i = 0; i < e->n_peers; i++) {
        if (v[i])
            mc__peer_destroy(e, v[i]);
    }
    while (v) { /* the table and the arrays it grew out of */
        mc_peer_t **prev = (mc_peer_t **)(void *)v[cap];
        free(v);
        v = prev;
        cap /= 2;
    }
    e->peers = NULL;
    e->n_peers = e->peers_cap = 0;
}
