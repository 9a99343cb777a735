/* Peer segments as hosts see them: open by name (metadata, or the peer itself), by descriptor
 * blob, by compact address, to self, blocking or not; close, export, and what an open peer
 * published. The peers' life behind these calls is peer.c's. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "transport/transport.h"
#include "util/bytes.h"

#define ADDRESS_VERSION 1
#define ADDRESS_HDR     18 /* u8 version, u8 control transport, u64 instance, u64 host hash */

/* A READY peer from a descriptor (decoded into d, taken over), or a reference on the open peer
 * of that name, whose view it then refreshes: a newer blob of a peer must not be dropped. */
static int open_desc(mc_engine_t *e, mc_desc_t *d, bool by_meta, mc_segment_id_t *id_p)
{
    mc_peer_t *p = NULL;
    int rc;

    if (mc__peer_open_ref(e, d->name, 0, id_p)) {
        p = mc__peer_get(e, *id_p);
        if (d->instance && p->desc.instance && d->instance != p->desc.instance) {
            mc__peer_unref(e, p); /* a restarted peer is another peer: the old one stays */
            rc = mc__set_error(-EEXIST,
                               "segment %s is open as another instance (%016llx, this "
                               "descriptor is of %016llx): close it first",
                               d->name, (unsigned long long)p->desc.instance,
                               (unsigned long long)d->instance);
            mc__desc_free(d);
            return rc;
        }
        mc__peer_refresh_async(e, p, d); /* applied by progress, which owns p's state */
        return 0;
    }
    rc = mc__peer_create(e, d, MC_SEGMENT_READY, &p); /* owns d from here */
    if (rc)
        return rc;
    p->by_metadata = by_meta;
    return mc__peer_insert(e, p, 0, id_p);
}

static int open_json(mc_engine_t *e, const void *json, size_t len, bool by_meta,
                     mc_segment_id_t *id_p)
{
    mc_desc_t d;
    int rc = mc__desc_decode(json, len, &d);

    return rc ? rc : open_desc(e, &d, by_meta, id_p);
}

/* This engine as a peer of its own (a host that opens whatever addresses it is given may be
 * given its own): from our descriptor, without asking anyone. */
static int open_self(mc_engine_t *e, mc_segment_id_t *id_p)
{
    char *json;
    size_t len;
    int rc = mc__desc_encode_local(e, &json, &len);

    if (rc)
        return rc;
    rc = open_json(e, json, len, false, id_p);
    free(json);
    return rc;
}

static int check_name(const char *fn, mc_engine_t *e, const char *name, mc_segment_id_t *id_p)
{
    if (!e || !name || !id_p || !*name || strlen(name) >= MC_NAME_MAX)
        return mc__set_error(-EINVAL, "%s: invalid argument", fn);
    return 0;
}

int mc_segment_open(mc_engine_t *e, const char *name, mc_segment_id_t *id_p)
{
    const mc_transport_ops_t *ctrl;
    mc_meta_kv_t kv;
    char *json;
    size_t len;
    int rc = check_name("mc_segment_open", e, name, id_p);

    if (rc)
        return rc;
    if (mc__in_progress())
        return mc__set_error(-EDEADLK, "mc_segment_open blocks: use mc_segment_open_nb in a "
                                       "callback");
    if (mc__peer_open_ref(e, name, 0, id_p))
        return 0;
    if (!strcmp(name, e->name))
        return open_self(e, id_p);
    if (e->meta) {
        rc = mc__meta_lookup(e, name, false, &kv);
        if (rc == 0) {
            rc = open_json(e, kv.value, kv.value_len, true, id_p);
            mc__meta_kv_free(&kv);
            return rc;
        }
        if (rc != -ENOENT)
            return rc;
    }
    ctrl = mc__transports[e->ctrl];
    rc = ctrl->fetch_desc(e, name, &json, &len);
    if (rc == -EINVAL)
        return mc__set_error(-MC_ENOSEGMENT,
                             "segment %s is not in metadata %s and is not an %s "
                             "address to ask directly",
                             name, e->cfg.metadata, ctrl->name);
    if (rc)
        return rc;
    rc = open_json(e, json, len, false, id_p);
    free(json);
    return rc;
}

/* An OPENING peer: d holds what is known so far (the control transport's part when there is an
 * address to ask; nothing but the name when only metadata can tell). */
static int open_later(mc_engine_t *e, mc_desc_t *d, bool by_meta, mc_segment_id_t *id_p)
{
    uint64_t instance = d->instance;
    mc_peer_t *p;
    int rc = mc__peer_create(e, d, MC_SEGMENT_OPENING, &p);

    if (rc)
        return rc;
    p->by_metadata = by_meta;
    return mc__peer_insert(e, p, instance, id_p);
}

int mc_segment_open_nb(mc_engine_t *e, const char *name, mc_segment_id_t *id_p)
{
    const mc_transport_ops_t *ctrl;
    mc_meta_kv_t kv;
    mc_desc_t d;
    int rc = check_name("mc_segment_open_nb", e, name, id_p);

    if (rc)
        return rc;
    if (mc__peer_open_ref(e, name, 0, id_p))
        return 0;
    if (!strcmp(name, e->name))
        return open_self(e, id_p);
    if (e->meta && mc__meta_lookup(e, name, true, &kv) == 0) {
        rc = open_json(e, kv.value, kv.value_len, true, id_p);
        mc__meta_kv_free(&kv);
        return rc;
    }
    memset(&d, 0, sizeof(d));
    ctrl = mc__transports[e->ctrl];
    rc = ctrl->address_text(e, name, &d);
    if (rc && rc != -EINVAL)
        return rc;
    if (rc && !e->meta)
        return mc__set_error(-MC_ENOSEGMENT,
                             "segment %s: metadata is \"none\" and it is not an %s address", name,
                             ctrl->name);
    if (rc) /* only metadata knows it: found in its cache, or the open fails in time */
        snprintf(d.name, sizeof(d.name), "%s", name);
    return open_later(e, &d, rc != 0, id_p);
}

int mc_segment_open_blob(mc_engine_t *e, const void *blob, size_t len, mc_segment_id_t *id_p)
{
    if (!e || !blob || !id_p)
        return mc__set_error(-EINVAL, "mc_segment_open_blob: NULL argument");
    if (len > e->cfg.handshake_max)
        return mc__set_error(-EINVAL, "descriptor of %zu bytes exceeds MC_HANDSHAKE_MAX_LENGTH",
                             len);
    return open_json(e, blob, len, false, id_p);
}

/* ---- compact addresses ---- */

/* A short stable hash of the host identity (FNV-1a): equal hashes mean the same host. */
static uint64_t host_hash(const char *host_id)
{
    uint64_t h = 0xcbf29ce484222325ull;

    for (const char *c = host_id; *c; c++)
        h = (h ^ (uint8_t)*c) * 0x100000001b3ull;
    return h;
}

int mc_engine_address(mc_engine_t *e, void *buf, size_t *len_p)
{
    uint8_t a[MC_ADDRESS_MAX];
    int n;

    if (!e || !len_p || (!buf && *len_p))
        return mc__set_error(-EINVAL, "mc_engine_address: invalid argument");
    a[0] = ADDRESS_VERSION;
    a[1] = (uint8_t)e->ctrl;
    mc__put64(a + 2, e->instance);
    mc__put64(a + 10, host_hash(e->host_id));
    n = mc__transports[e->ctrl]->address_pack(e, a + ADDRESS_HDR, sizeof(a) - ADDRESS_HDR);
    if (n < 0)
        return n;
    if ((size_t)n + ADDRESS_HDR > *len_p) {
        *len_p = (size_t)n + ADDRESS_HDR;
        return mc__set_error(-ENOSPC, "the address needs %zu bytes", *len_p);
    }
    *len_p = (size_t)n + ADDRESS_HDR;
    memcpy(buf, a, *len_p);
    return 0;
}

int mc_segment_open_address(mc_engine_t *e, const void *addr, size_t len, mc_segment_id_t *id_p)
{
    const uint8_t *a = addr;
    mc_desc_t d;
    uint64_t instance;
    int rc;

    if (!e || !addr || !id_p)
        return mc__set_error(-EINVAL, "mc_segment_open_address: NULL argument");
    if (len <= ADDRESS_HDR || len > MC_ADDRESS_MAX || a[0] != ADDRESS_VERSION)
        return mc__set_error(-MC_EPROTO, "not an engine address (%zu bytes, version %u)", len,
                             len ? a[0] : 0);
    if (a[1] != e->ctrl)
        return mc__set_error(-MC_EPROTO, "the address is of control transport %u, ours is %s", a[1],
                             mc__transports[e->ctrl]->name);
    instance = mc__get64(a + 2);
    if (instance == e->instance)
        return open_self(e, id_p);
    if (mc__peer_open_ref(e, NULL, instance, id_p))
        return 0;
    memset(&d, 0, sizeof(d));
    rc = mc__transports[e->ctrl]->address_unpack(e, a + ADDRESS_HDR, len - ADDRESS_HDR, &d);
    if (rc)
        return rc;
    d.instance = instance;
    if (host_hash(e->host_id) == mc__get64(a + 10))
        snprintf(d.host_id, sizeof(d.host_id), "%s", e->host_id); /* so shm is considered */
    return open_later(e, &d, false, id_p);
}

int mc_address_reachable(mc_engine_t *e, const void *addr, size_t len)
{
    const mc_transport_ops_t *ops;
    const uint8_t *a = addr;
    int rc;

    if (!e || !addr)
        return mc__set_error(-EINVAL, "mc_address_reachable: NULL argument");
    if (len <= ADDRESS_HDR || len > MC_ADDRESS_MAX || a[0] != ADDRESS_VERSION || a[1] != e->ctrl)
        return mc__set_error(-MC_EPROTO, "not an address of a %s engine (%zu bytes)",
                             mc__transports[e->ctrl]->name, len);
    if (host_hash(e->host_id) == mc__get64(a + 10))
        return 1;
    ops = mc__transports[e->ctrl];
    if (!MC_TP_HAS(ops, address_reachable))
        return 1; /* no way to tell: connecting will */
    rc = ops->address_reachable(e, a + ADDRESS_HDR, len - ADDRESS_HDR);
    return rc < 0 ? mc__set_error(-MC_EPROTO, "%s", mc_last_error()) : rc;
}

/* ---- what hosts ask about peers ---- */

int mc_segment_state(mc_engine_t *e, mc_segment_id_t id)
{
    int rc;

    if (!e)
        return mc__set_error(-EINVAL, "NULL engine");
    pthread_rwlock_rdlock(&e->peers_lock);
    mc_peer_t *p = mc__peer_get(e, id);
    rc = p ? p->state : mc__set_error(-ENOENT, "no open segment with id %u", id);
    pthread_rwlock_unlock(&e->peers_lock);
    return rc;
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
        size_t n = 0; /* the peer's own buffers (bounce buffers of its transports) left out */
        for (size_t i = 0; i < p->desc.n_buffers; i++) {
            const mc_desc_buffer_t *b = &p->desc.buffers[i];
            if (b->internal)
                continue;
            if (n < max) {
                out[n].addr = b->addr;
                out[n].length = b->len;
                memcpy(out[n].location, b->location, MC_LOCATION_MAX);
            }
            n++;
        }
        *count_p = n;
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

int mc_segment_close(mc_engine_t *e, mc_segment_id_t id)
{
    mc_peer_t *p;
    bool destroy = false;
    int rc = 0;

    if (!e)
        return mc__set_error(-EINVAL, "NULL engine");
    if (mc__in_progress())
        return mc__set_error(-EDEADLK, "segments cannot be closed from a callback");
    mc_lock(&e->lock);
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
        mc__peer_destroy(e, p);
    mc_unlock(&e->lock);
    return rc;
}
