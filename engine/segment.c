/* Peer segments: open by name (metadata, or handshake with the peer), by descriptor blob,
 * close, export; and which transports reach each peer. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "msg.h"
#include "transport/transport.h"

mc_peer_t *mc__peer_get(mc_engine_t *e, mc_segment_id_t id)
{
    return id < e->n_peers ? e->peers[id] : NULL;
}

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

static void peer_free(mc_engine_t *e, mc_peer_t *p)
{
    for (unsigned i = 0; i < mc__n_transports; i++)
        if (p->tp[i] && MC_TP_HAS(mc__transports[i], peer_close))
            mc__transports[i]->peer_close(e, p);
    mc__desc_free(&p->desc);
    free(p);
}

static int peer_create(mc_engine_t *e, mc_desc_t *d, mc_peer_t **p_p)
{
    mc_peer_t *p = calloc(1, sizeof(*p));
    int rc;

    if (!p)
        return mc__set_error(-ENOMEM, "out of memory");
    snprintf(p->name, sizeof(p->name), "%s", d->name);
    p->desc = *d;
    p->local_host = !strcmp(d->host_id, e->host_id);
    p->refcnt = 1;
    for (int tp = 0; tp < MC_TP_MAX; tp++) {
        mc_list_init(&p->q[tp].pending);
        mc_list_init(&p->q[tp].retry);
    }
    mc_list_init(&p->msgq);
    mc_list_init(&p->active_link);
    rc = peer_route(e, p);
    if (rc) {
        peer_free(e, p);
        return rc;
    }
    *p_p = p;
    return 0;
}

/* Find an open peer by name and take a reference. Caller holds peers_lock for writing. */
static mc_peer_t *peer_find_ref(mc_engine_t *e, const char *name)
{
    for (size_t i = 0; i < e->n_peers; i++) {
        if (e->peers[i] && !strcmp(e->peers[i]->name, name)) {
            e->peers[i]->refcnt++;
            return e->peers[i];
        }
    }
    return NULL;
}

/* Insert p (or reuse an equal one opened meanwhile). Takes ownership of p. */
static int peer_insert(mc_engine_t *e, mc_peer_t *p, mc_segment_id_t *id_p)
{
    mc_peer_t *old;
    int rc = 0;

    pthread_rwlock_wrlock(&e->peers_lock);
    old = peer_find_ref(e, p->name);
    if (old) {
        *id_p = old->id;
        pthread_rwlock_unlock(&e->peers_lock);
        peer_free(e, p);
        return 0;
    }
    mc_peer_t **v = realloc(e->peers, (e->n_peers + 1) * sizeof(*v));
    if (!v) {
        rc = mc__set_error(-ENOMEM, "out of memory");
    } else {
        e->peers = v;
        p->id = (mc_segment_id_t)e->n_peers;
        v[e->n_peers++] = p;
        *id_p = p->id;
    }
    pthread_rwlock_unlock(&e->peers_lock);
    if (rc)
        peer_free(e, p);
    return rc;
}

static int open_desc(mc_engine_t *e, const void *blob, size_t len, bool by_meta,
                     mc_segment_id_t *id_p)
{
    mc_desc_t d;
    mc_peer_t *p = NULL;
    int rc = mc__desc_decode(blob, len, &d);

    if (rc)
        return rc;
    rc = peer_create(e, &d, &p); /* owns d from here */
    if (rc)
        return rc;
    p->by_metadata = by_meta;
    return peer_insert(e, p, id_p);
}

int mc_segment_open(mc_engine_t *e, const char *name, mc_segment_id_t *id_p)
{
    const mc_transport_ops_t *ctrl = mc__transports[e->ctrl];
    mc_meta_kv_t kv;
    char *json;
    size_t len;
    int rc;

    if (!e || !name || !id_p || !*name || strlen(name) >= MC_NAME_MAX)
        return mc__set_error(-EINVAL, "mc_segment_open: invalid argument");
    pthread_rwlock_wrlock(&e->peers_lock);
    mc_peer_t *p = peer_find_ref(e, name);
    if (p)
        *id_p = p->id;
    pthread_rwlock_unlock(&e->peers_lock);
    if (p)
        return 0;
    if (e->meta) {
        rc = mc__meta_lookup(e, name, false, &kv);
        if (rc == 0) {
            rc = open_desc(e, kv.value, kv.value_len, true, id_p);
            mc__meta_kv_free(&kv);
            return rc;
        }
        if (rc != -ENOENT)
            return rc;
    }
    rc = ctrl->fetch_desc(e, name, NULL, &json, &len);
    if (rc == -EINVAL)
        return mc__set_error(-MC_ENOSEGMENT,
                             "segment %s is not in metadata %s and is not an %s "
                             "address to ask directly",
                             name, e->cfg.metadata, ctrl->name);
    if (rc)
        return rc;
    rc = open_desc(e, json, len, false, id_p);
    free(json);
    return rc;
}

int mc_segment_open_blob(mc_engine_t *e, const void *blob, size_t len, mc_segment_id_t *id_p)
{
    if (!e || !blob || !id_p)
        return mc__set_error(-EINVAL, "mc_segment_open_blob: NULL argument");
    if (len > e->cfg.handshake_max)
        return mc__set_error(-EINVAL, "descriptor of %zu bytes exceeds MC_HANDSHAKE_MAX_LENGTH",
                             len);
    return open_desc(e, blob, len, false, id_p);
}

int mc_segment_export(mc_engine_t *e, void *buf, size_t *len_p)
{
    char *json;
    size_t len;
    int rc;

    if (!e || !len_p || (!buf && *len_p))
        return mc__set_error(-EINVAL, "mc_segment_export: invalid argument");
    rc = mc__desc_encode_local(e, &json, &len);
    if (rc)
        return rc;
    if (len > *len_p) {
        *len_p = len;
        free(json);
        return mc__set_error(-ENOSPC, "descriptor needs %zu bytes", len);
    }
    memcpy(buf, json, len);
    *len_p = len;
    free(json);
    return 0;
}

int mc_segment_buffers(mc_engine_t *e, mc_segment_id_t id, mc_buffer_info_t *out, size_t max,
                       size_t *count_p)
{
    int rc = 0;

    if (!e || !count_p || (max && !out))
        return mc__set_error(-EINVAL, "mc_segment_buffers: invalid argument");
    pthread_rwlock_rdlock(&e->peers_lock); /* also guards descriptor refreshes */
    mc_peer_t *p = mc__peer_get(e, id);
    if (!p) {
        rc = mc__set_error(-ENOENT, "no open segment with id %u", id);
    } else {
        for (size_t i = 0; i < p->desc.n_buffers && i < max; i++) {
            out[i].addr = p->desc.buffers[i].addr;
            out[i].length = p->desc.buffers[i].len;
            memcpy(out[i].location, p->desc.buffers[i].location, MC_LOCATION_MAX);
        }
        *count_p = p->desc.n_buffers;
    }
    pthread_rwlock_unlock(&e->peers_lock);
    return rc;
}

int mc_segment_is_local_host(mc_engine_t *e, mc_segment_id_t id)
{
    int rc;

    if (!e)
        return mc__set_error(-EINVAL, "NULL engine");
    pthread_rwlock_rdlock(&e->peers_lock);
    mc_peer_t *p = mc__peer_get(e, id);
    rc = p ? p->local_host : mc__set_error(-ENOENT, "no open segment with id %u", id);
    pthread_rwlock_unlock(&e->peers_lock);
    return rc;
}

/* Drop a peer entirely. Caller holds e->lock; the peer has no tasks. */
static void peer_destroy(mc_engine_t *e, mc_peer_t *p)
{
    mc_list_t *n;

    while ((n = mc_list_pop_front(&p->msgq)))
        free(mc_container_of(n, mc_msg_t, link));
    if (p->active)
        mc_list_del(&p->active_link);
    peer_free(e, p);
}

int mc_segment_close(mc_engine_t *e, mc_segment_id_t id)
{
    mc_peer_t *p;
    bool destroy = false;
    int rc = 0;

    if (!e)
        return mc__set_error(-EINVAL, "NULL engine");
    if (mc__in_progress())
        return mc__set_error(-EDEADLK, "segments cannot be closed from a callback");
    pthread_mutex_lock(&e->lock);
    pthread_rwlock_wrlock(&e->peers_lock);
    p = mc__peer_get(e, id);
    if (!p)
        rc = mc__set_error(-ENOENT, "no open segment with id %u", id);
    else if (p->refcnt > 1)
        p->refcnt--;
    else if (atomic_load(&p->busy_tasks))
        rc = mc__set_error(-EBUSY, "segment %s has %u tasks in flight", p->name,
                           atomic_load(&p->busy_tasks));
    else
        destroy = true;
    if (destroy)
        e->peers[id] = NULL;
    pthread_rwlock_unlock(&e->peers_lock);
    if (destroy)
        peer_destroy(e, p);
    pthread_mutex_unlock(&e->lock);
    return rc;
}

void mc__peers_fini(mc_engine_t *e)
{
    for (size_t i = 0; i < e->n_peers; i++) {
        if (e->peers[i])
            peer_destroy(e, e->peers[i]);
    }
    free(e->peers);
    e->peers = NULL;
    e->n_peers = 0;
}

static int fetch_from_meta(mc_engine_t *e, mc_peer_t *p, bool cached_only, mc_desc_t *d)
{
    mc_meta_kv_t kv;
    int rc = mc__meta_lookup(e, p->name, cached_only, &kv);

    if (rc)
        return rc;
    rc = mc__desc_decode(kv.value, kv.value_len, d);
    mc__meta_kv_free(&kv);
    return rc;
}

static int fetch_from_peer(mc_engine_t *e, mc_peer_t *p, mc_desc_t *d)
{
    char *json;
    size_t len;
    int rc = mc__transports[e->ctrl]->fetch_desc(e, NULL, p, &json, &len);

    if (rc)
        return rc;
    rc = mc__desc_decode(json, len, d);
    free(json);
    return rc;
}

/* Fetch a peer's current descriptor. may_block: ask the peer itself first (it is the
 * authority: metadata lags behind its registrations), then metadata. Otherwise (progress
 * context) only the watched metadata cache is consulted. */
static int peer_fetch(mc_engine_t *e, mc_peer_t *p, bool may_block, mc_desc_t *d)
{
    bool meta = p->by_metadata && e->meta;

    if (!may_block)
        return meta ? fetch_from_meta(e, p, true, d) : -ENOTSUP;
    if (fetch_from_peer(e, p, d) == 0)
        return 0;
    return meta ? fetch_from_meta(e, p, false, d)
                : mc__set_error(-MC_EPEERDEAD, "%s", mc_last_error());
}

int mc__peer_reload(mc_engine_t *e, mc_peer_t *p, bool may_block)
{
    mc_desc_t d;
    int rc = peer_fetch(e, p, may_block, &d);

    if (rc)
        return rc;
    if (strcmp(d.name, p->name)) {
        mc__desc_free(&d);
        return mc__set_error(-MC_ENOSEGMENT, "segment %s now answers as %s", p->name, d.name);
    }
    pthread_rwlock_wrlock(&e->peers_lock);
    mc__desc_free(&p->desc);
    p->desc = d;
    rc = peer_route(e, p);
    pthread_rwlock_unlock(&e->peers_lock);
    if (rc)
        mc_warn("segment %s after reloading its descriptor: %s", p->name, mc_last_error());
    return rc;
}
