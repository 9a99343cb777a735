/* Messages (ordered per peer, dispatched to handlers) and notifications (message id 0). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "callbacks.h"
#include "engine_int.h"
#include "msg.h"

#define MAX_QUEUED_MSGS 4096  /* per peer, not yet on the wire */
#define MAX_NOTIFY      65536 /* received, not yet popped */

int mc_msg_handler_set(mc_engine_t *e, uint8_t id, mc_msg_cb cb, void *arg)
{
    if (!e || id == 0)
        return mc__set_error(-EINVAL, "mc_msg_handler_set: id 0 is reserved for notifications");
    pthread_mutex_lock(&e->handlers_lock);
    e->handlers[id] = cb;
    e->handler_args[id] = arg;
    pthread_mutex_unlock(&e->handlers_lock);
    return 0;
}

/* Reserve a queue slot on the target peer. */
static int msg_reserve(mc_engine_t *e, mc_segment_id_t target)
{
    int rc = 0;

    pthread_rwlock_rdlock(&e->peers_lock);
    mc_peer_t *p = mc__peer_get(e, target);
    if (!p)
        rc = mc__set_error(-MC_ENOSEGMENT, "message target %u is not open", target);
    else if (p->state == MC_SEGMENT_DEAD)
        rc = mc__set_error(-MC_EPEERDEAD, "%s", p->dead_reason);
    else if (atomic_fetch_add(&p->queued_msgs, 1) >= MAX_QUEUED_MSGS) {
        atomic_fetch_sub(&p->queued_msgs, 1);
        rc = mc__set_error(-EAGAIN, "%d messages to segment %u already queued", MAX_QUEUED_MSGS,
                           target);
    }
    pthread_rwlock_unlock(&e->peers_lock);
    return rc;
}

static void msg_unreserve(mc_engine_t *e, mc_segment_id_t target)
{
    pthread_rwlock_rdlock(&e->peers_lock);
    mc_peer_t *p = mc__peer_get(e, target);
    if (p)
        atomic_fetch_sub(&p->queued_msgs, 1);
    pthread_rwlock_unlock(&e->peers_lock);
}

static int msg_new(mc_engine_t *e, mc_segment_id_t target, uint8_t id, const void *data, size_t len,
                   mc_msg_t **m_p)
{
    mc_msg_t *m;
    int rc;

    if (len > MC_MSG_MAX || (len && !data))
        return mc__set_error(-EINVAL, "message of %zu bytes (max %d)", len, MC_MSG_MAX);
    rc = msg_reserve(e, target);
    if (rc)
        return rc;
    m = malloc(sizeof(*m) + len);
    if (!m) {
        msg_unreserve(e, target);
        return mc__set_error(-ENOMEM, "out of memory");
    }
    m->target = target;
    m->id = id;
    m->len = (uint32_t)len;
    if (len)
        memcpy(m->data, data, len);
    *m_p = m;
    return 0;
}

int mc_msg_send(mc_engine_t *e, mc_segment_id_t target, uint8_t id, const void *data, size_t len)
{
    mc_msg_t *m = NULL;
    int rc;

    if (!e || id == 0)
        return mc__set_error(-EINVAL, "mc_msg_send: id 0 is reserved for notifications");
    rc = msg_new(e, target, id, data, len, &m);
    if (rc)
        return rc;
    pthread_mutex_lock(&e->sub_lock);
    mc_list_push_back(&e->msgq_in, &m->link);
    pthread_mutex_unlock(&e->sub_lock);
    mc__doorbell(e);
    mc__progress_implicit(e);
    return 0;
}

/* From the progress context: queue straight onto the peer. */
int mc__msg_enqueue(mc_engine_t *e, mc_segment_id_t target, uint8_t id, const void *data,
                    size_t len)
{
    mc_msg_t *m = NULL;
    int rc = msg_new(e, target, id, data, len, &m);

    if (!rc)
        mc__msg_route(e, m);
    return rc;
}

void mc__msg_sent(mc_peer_t *p, mc_msg_t *m)
{
    (void)m;
    atomic_fetch_sub(&p->queued_msgs, 1);
}

void mc__msg_route(mc_engine_t *e, mc_msg_t *m)
{
    pthread_rwlock_rdlock(&e->peers_lock);
    mc_peer_t *p = mc__peer_get(e, m->target);
    pthread_rwlock_unlock(&e->peers_lock);

    if (!p) { /* closed since: nothing to deliver to */
        free(m);
        return;
    }
    mc_list_push_back(&p->msgq, &m->link);
    mc__peer_activate(e, p);
}

static void notify_push(mc_engine_t *e, const char *sender, const void *data, size_t len)
{
    mc_notify_item_t *it = malloc(sizeof(*it) + len + 1);

    if (!it) {
        mc_error("notification from %s dropped: out of memory", sender);
        return;
    }
    snprintf(it->sender, sizeof(it->sender), "%s", sender);
    it->len = len;
    memcpy(it->msg, data, len);
    it->msg[len] = 0;
    pthread_mutex_lock(&e->notify_lock);
    if (e->n_notify >= MAX_NOTIFY) {
        pthread_mutex_unlock(&e->notify_lock);
        mc_error("notification from %s dropped: %d are waiting to be popped", sender, MAX_NOTIFY);
        free(it);
        return;
    }
    mc_list_push_back(&e->notifyq, &it->link);
    e->n_notify++;
    pthread_mutex_unlock(&e->notify_lock);
}

void mc__msg_deliver(mc_engine_t *e, const char *sender, uint8_t id, const void *data, size_t len)
{
    if (id == 0)
        notify_push(e, sender, data, len);
    else
        mc__cb_hold_msg(e, sender, id, data, len); /* its handler runs at the end of the pass */
}

int mc_notify_pop(mc_engine_t *e, mc_notify_t *out)
{
    mc_list_t *n;

    if (!e || !out)
        return mc__set_error(-EINVAL, "mc_notify_pop: NULL argument");
    mc__progress_implicit(e);
    pthread_mutex_lock(&e->notify_lock);
    n = mc_list_pop_front(&e->notifyq);
    if (n)
        e->n_notify--;
    pthread_mutex_unlock(&e->notify_lock);
    if (!n)
        return 0;
    mc_notify_item_t *it = mc_container_of(n, mc_notify_item_t, link);
    memcpy(out->sender, it->sender, sizeof(out->sender));
    out->len = it->len;
    memcpy(out->msg, it->msg, it->len);
    if (it->len < sizeof(out->msg))
        out->msg[it->len] = 0;
    free(it);
    return 1;
}

void mc__msgs_fini(mc_engine_t *e)
{
    mc_list_t *n;

    while ((n = mc_list_pop_front(&e->notifyq)))
        free(mc_container_of(n, mc_notify_item_t, link));
    while ((n = mc_list_pop_front(&e->msgq_in)))
        free(mc_container_of(n, mc_msg_t, link));
}
