/* Publishing the local segment in metadata: the descriptor under mooncake/ram/<name> and the
 * endpoint under mooncake/rpc_meta/<name>, both tied to a lease that a background thread keeps
 * alive. A dead process's entries expire with its lease; a lost lease is re-granted and the
 * entries re-published. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>

#include "transport/transport.h"

/* Registrations come in bursts (a pool registered block by block, a registration cache): a
 * change is published at once, then the changes that follow within this long are published
 * together when it has passed. */
#define PUBLISH_COALESCE_MS 20

static int put_key(mc_engine_t *e, const char *kind, const char *val, size_t len)
{
    char key[512];
    int n = mc__meta_key(key, sizeof(key), e->cfg.cluster_id, kind, e->name);

    if (n < 0)
        return mc__set_error(-ENAMETOOLONG, "segment name too long for a metadata key");
    return mc__meta_put(e->meta, key, (size_t)n, val, len, e->lease, NULL);
}

/* Whether the store refused a put for good (the key or the value will never do), rather than
 * failing it for now (unreachable, busy, our lease gone, out of memory): it is put again later
 * then. */
static bool store_refuses(int rc)
{
    return rc == -ENAMETOOLONG || rc == -EMSGSIZE || rc == -EINVAL || rc == -E2BIG;
}

/* A key a host put on our lease (mc_engine_publish), kept to be put again with a new one; or,
 * val NULL, one it took back (mc_engine_unpublish) whose delete failed: deleted again then. */
typedef struct mc_hosted_key {
    struct mc_hosted_key *next;
    size_t len;
    void *val;
    char key[];
} mc_hosted_key_t;

/* Unlink *pp, the key it points at, and free it. */
static void hosted_drop(mc_hosted_key_t **pp)
{
    mc_hosted_key_t *h = *pp;

    *pp = h->next;
    free(h->val);
    free(h);
}

/* Put the hosts' keys again when the lease they were put with is gone, and delete again those
 * they took back while the store did not answer. A key the store refuses now goes (said once)
 * instead of holding back the keys after it. */
static int publish_hosted(mc_engine_t *e)
{
    int64_t lease = atomic_load(&e->lease);
    int rc = 0;

    pthread_mutex_lock(&e->hosted_lock);
    for (mc_hosted_key_t **pp = &e->hosted, *h; e->hosted_lease != lease && (h = *pp);) {
        if (!h->val) { /* taken back */
            int del = mc__meta_del(e->meta, h->key, strlen(h->key));
            if (del == 0 || del == -ENOENT) {
                hosted_drop(pp);
                continue;
            }
            if (!rc)
                rc = del;
            pp = &h->next;
            continue;
        }
        int put = mc__meta_put(e->meta, h->key, strlen(h->key), h->val, h->len, lease, NULL);
        if (store_refuses(put)) {
            mc_warn("metadata key %s refused by the store (%s): no longer published", h->key,
                    mc_last_error());
            hosted_drop(pp);
            continue;
        }
        if (put && !rc)
            rc = put;
        pp = &h->next;
    }
    if (!rc)
        e->hosted_lease = lease;
    pthread_mutex_unlock(&e->hosted_lock);
    return rc;
}

/* Called without meta_lock. */
static int publish_once(mc_engine_t *e)
{
    char *json;
    size_t len;
    json_t *endpoint;
    int rc;

    if (!e->lease) {
        int64_t lease;

        rc = mc__meta_lease_grant(e->meta, e->cfg.metadata_ttl_s, &lease);
        if (rc)
            return rc;
        e->lease = lease;
    }
    rc = mc__desc_encode_local(e, &json, &len);
    if (rc)
        return rc;
    rc = put_key(e, "ram", json, len);
    free(json);
    if (rc == -ENOENT)
        e->lease = 0; /* the store lost our lease (restarted empty, or it expired): re-grant */
    if (rc)
        return rc;
    const mc_transport_ops_t *ctrl = mc__transports[e->ctrl];
    endpoint = json_pack("{s:s}", ctrl->name, ctrl->address(e));
    json = endpoint ? json_dumps(endpoint, JSON_COMPACT) : NULL;
    json_decref(endpoint);
    if (!json)
        return mc__set_error(-ENOMEM, "cannot encode the endpoint of segment %s", e->name);
    rc = put_key(e, "rpc_meta", json, strlen(json));
    free(json);
    return rc ? rc : publish_hosted(e);
}

/* Keep the lease alive every ttl/3; republish when the descriptor changed or the lease was
 * lost (for example while the metadata service was unreachable). */
static void *publish_thread(void *arg)
{
    mc_engine_t *e = arg;
    unsigned period_ms = e->cfg.metadata_ttl_s * 1000 / 3;
    struct timespec ts;

    mc__log_enter(e->cfg.log_level);
    uint64_t published_ns = 0, kept_ns = mc__now_ns(); /* (the lease was granted just now) */
    int64_t kept_lease = e->lease;
    bool retrying = false;

    pthread_mutex_lock(&e->meta_lock);
    while (!e->meta_stop) {
        uint64_t quiet_ns = published_ns + PUBLISH_COALESCE_MS * MC_MS, now = mc__now_ns();
        if (e->meta_dirty && now < quiet_ns) { /* one publish for the rest of the burst */
            mc__abstime_in(&ts, (int)((quiet_ns - now) / MC_MS) + 1);
            while (!e->meta_stop &&
                   pthread_cond_timedwait(&e->meta_cond, &e->meta_lock, &ts) != ETIMEDOUT)
                ;
        }
        bool dirty = e->meta_dirty;
        e->meta_dirty = false;
        pthread_mutex_unlock(&e->meta_lock);
        /* A put under the lease does not keep it alive: a publish that is not retried skips the
         * keepalive only while one is not due (registrations more often than every ttl/3 let
         * the keys expire every ttl before). While a publish is retried it is kept alive too:
         * the keys put with it must not expire meanwhile. */
        bool keep = e->lease &&
                    (!dirty || retrying || mc__now_ns() - kept_ns >= (uint64_t)period_ms * MC_MS);
        int rc = keep ? mc__meta_lease_keepalive(e->meta, e->lease) : 0;
        if (keep && !rc)
            kept_ns = mc__now_ns();
        if (rc == -ENOENT)
            e->lease = 0;
        if (dirty || rc) {
            rc = publish_once(e);
            published_ns = mc__now_ns();
        }
        if (e->lease != kept_lease) { /* granted anew: alive from now */
            kept_lease = e->lease;
            kept_ns = mc__now_ns();
        }
        pthread_mutex_lock(&e->meta_lock);
        retrying = rc != 0;
        if (rc) {
            mc_warn("publishing segment %s failed: %s (will retry)", e->name, mc_last_error());
            e->meta_dirty = true;
        }
        mc__abstime_in(&ts, rc ? 500 : period_ms);
        if (!e->meta_stop && (rc || !e->meta_dirty))
            pthread_cond_timedwait(&e->meta_cond, &e->meta_lock, &ts);
    }
    pthread_mutex_unlock(&e->meta_lock);
    return NULL;
}

int mc__publish_start(mc_engine_t *e)
{
    int rc;

    if (!strcmp(e->cfg.metadata, "none"))
        return 0;
    rc = mc__meta_open_config(e->conf, &e->meta);
    if (rc)
        return mc__set_error(rc, "metadata %s: %s", e->cfg.metadata, mc_last_error());
    rc = publish_once(e);
    if (rc)
        return mc__set_error(rc, "publishing segment %s in %s: %s", e->name, e->cfg.metadata,
                             mc_last_error());
    rc = pthread_create(&e->meta_tid, NULL, publish_thread, e);
    if (rc)
        return mc__set_error(-rc, "cannot start the metadata thread: %s", strerror(rc));
    e->has_meta_thread = true;
    return 0;
}

void mc__publish_kick(mc_engine_t *e)
{
    if (!e->has_meta_thread)
        return;
    pthread_mutex_lock(&e->meta_lock);
    e->meta_dirty = true;
    pthread_cond_signal(&e->meta_cond);
    pthread_mutex_unlock(&e->meta_lock);
}

void mc__publish_stop(mc_engine_t *e)
{
    if (e->has_meta_thread) {
        pthread_mutex_lock(&e->meta_lock);
        e->meta_stop = true;
        pthread_cond_signal(&e->meta_cond);
        pthread_mutex_unlock(&e->meta_lock);
        pthread_join(e->meta_tid, NULL);
        e->has_meta_thread = false;
    }
    if (e->meta && e->lease && mc__meta_lease_revoke(e->meta, e->lease))
        mc_warn("revoking the lease of segment %s: %s", e->name, mc_last_error());
    e->lease = 0;
    while (e->hosted)
        hosted_drop(&e->hosted);
}

static mc_hosted_key_t **hosted_find(mc_engine_t *e, const char *key)
{
    mc_hosted_key_t **pp = &e->hosted;

    while (*pp && strcmp((*pp)->key, key))
        pp = &(*pp)->next;
    return pp;
}

static int publish_check(mc_engine_t *e, const char *what, const char *key)
{
    if (!e || !key || !*key)
        return mc__set_error(-EINVAL, "%s: NULL engine or empty key", what);
    if (!e->meta)
        return mc__set_error(-ENOTSUP, "%s %s: the engine has no metadata service (METADATA=none)",
                             what, key);
    if (mc__in_progress())
        return mc__set_error(-EDEADLK, "%s waits for the metadata service: not from a callback",
                             what);
    return 0;
}

/* The key is put under hosted_lock, so that a republish under a new lease cannot slip in
 * between and be overwritten with the old one. */
int mc_engine_publish(mc_engine_t *e, const char *key, const void *val, size_t len)
{
    mc_hosted_key_t **pp, *h;
    void *copy;
    int rc = publish_check(e, "mc_engine_publish", key);

    if (rc)
        return rc;
    if (!(copy = malloc(len ? len : 1)))
        return mc__set_error(-ENOMEM, "mc_engine_publish %s: out of memory", key);
    memcpy(copy, val, len);
    pthread_mutex_lock(&e->hosted_lock);
    pp = hosted_find(e, key);
    bool fresh = !*pp;
    if (!(h = *pp) && (h = calloc(1, sizeof(*h) + strlen(key) + 1))) {
        strcpy(h->key, key);
        *pp = h;
    }
    if (h) {
        int64_t lease = atomic_load(&e->lease); /* none while a lost one is granted anew: */
        rc = lease ? mc__meta_put(e->meta, key, strlen(key), val, len, lease, NULL)
                   : -ENOENT;    /* a key without one would outlive us: the new one carries it */
        if (store_refuses(rc)) { /* it never will take it: a new key is not kept, an old one
                                    keeps the value the store still has */
            free(copy);
            if (fresh)
                hosted_drop(pp);
            pthread_mutex_unlock(&e->hosted_lock);
            return rc;
        }
        free(h->val);
        h->val = copy;
        h->len = len;
    } else {
        free(copy);
        rc = mc__set_error(-ENOMEM, "mc_engine_publish %s: out of memory", key);
    }
    if (rc)
        e->hosted_lease = -1; /* the publisher puts every hosted key again */
    pthread_mutex_unlock(&e->hosted_lock);
    if (rc)
        mc__publish_kick(e);
    return rc == -ENOENT ? 0 : rc; /* our lease is gone: the new one will carry the key */
}

int mc_engine_unpublish(mc_engine_t *e, const char *key)
{
    mc_hosted_key_t **pp;
    int rc = publish_check(e, "mc_engine_unpublish", key);
    bool retry = false;

    if (rc)
        return rc;
    pthread_mutex_lock(&e->hosted_lock);
    pp = hosted_find(e, key);
    if (*pp) {
        rc = mc__meta_del(e->meta, key, strlen(key));
        if (rc == 0 || rc == -ENOENT) { /* (gone with a lost lease: it will not come back) */
            hosted_drop(pp);
            rc = 0;
        } else { /* the publisher deletes it again until the store takes it */
            free((*pp)->val);
            (*pp)->val = NULL;
            e->hosted_lease = -1;
            retry = true;
        }
    } else {
        rc =
            mc__set_error(-ENOENT, "mc_engine_unpublish: %s was not published by this engine", key);
    }
    pthread_mutex_unlock(&e->hosted_lock);
    if (retry)
        mc__publish_kick(e);
    return rc;
}
