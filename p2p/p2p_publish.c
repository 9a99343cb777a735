/* Publishing and withdrawing: register, unregister, remove, serve, delete_replica. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "p2p_codec.h"
#include "p2p_int.h"
#include "p2p_shard.h"

int mc__p2p_entry_publish(mc_p2p_t *p2p, p2p_held_t *h, const p2p_entry_t *e)
{
    char *json;
    size_t len;
    int rc = mc__p2p_entry_encode(e, &json, &len);

    if (rc)
        return rc;
    rc = mc_engine_publish(p2p->engine, h->replica_key, json, len);
    free(json);
    if (rc == 0 || mc__p2p_meta_down(rc))
        return rc ? 1 : 0;
    return mc__p2p_error(rc, "%s: publishing the replica entry: %s", h->name, mc_last_error());
}

/* This node's entry for a copy of every shard of d in h's buffers. */
static int publish_complete(mc_p2p_t *p2p, p2p_held_t *h, const p2p_desc_t *d)
{
    p2p_rbuf_t *rb = calloc(h->n, sizeof(*rb));
    int rc = mc__p2p_replica_key(p2p, h->name, h->replica_key);

    if (rc >= 0 && !rb)
        rc = mc__p2p_error(-ENOMEM, "out of memory");
    if (rc >= 0) {
        for (size_t i = 0; i < h->n; i++)
            rb[i] = (p2p_rbuf_t){(uint64_t)(uintptr_t)h->bufs[i].addr, h->bufs[i].len};
        p2p_entry_t e = {.id = d->id,
                         .origin = h->origin,
                         .complete = true, /* no bitmap then */
                         .shards = d->shards,
                         .bufs = rb,
                         .n_bufs = h->n};
        rc = mc__p2p_entry_publish(p2p, h, &e);
    }
    free(rb);
    return rc < 0 ? rc : 0;
}

/* ---- register ---- */

static int register_args(mc_p2p_t *p2p, const char *name, const mc_p2p_buf_t *bufs, size_t n,
                         const mc_p2p_register_opts_t *opts, mc_p2p_register_opts_t *o,
                         p2p_desc_t *d)
{
    int rc = p2p ? mc__p2p_name_check(name) : mc__p2p_error(-EINVAL, "NULL node");

    if (!rc)
        rc = mc__p2p_bufs_check(name, bufs, n, &d->size);
    if (rc)
        return rc;
    /* Callers built against an older header pass a shorter struct: the rest is defaults. */
    memset(o, 0, sizeof(*o));
    if (opts)
        memcpy(o, opts, opts->size && opts->size < sizeof(*o) ? opts->size : sizeof(*o));
    d->shard_size = o->shard_size ? o->shard_size : P2P_DEFAULT_SHARD;
    /* one shard all the same, and within JSON's signed integers (a size below the smallest
     * shard is still refused below) */
    if (d->shard_size > d->size && d->shard_size >= P2P_MIN_SHARD)
        d->shard_size = d->size < P2P_MIN_SHARD ? P2P_MIN_SHARD : d->size;
    if (d->shard_size < P2P_MIN_SHARD)
        return mc__p2p_error(-EINVAL, "%s: shard size %llu is below %u", name,
                             (unsigned long long)d->shard_size, P2P_MIN_SHARD);
    if ((d->size - 1) / d->shard_size + 1 > MC_P2P_SHARDS_MAX)
        return mc__p2p_error(-EINVAL, "%s: %llu bytes in shards of %llu are more than %d shards",
                             name, (unsigned long long)d->size, (unsigned long long)d->shard_size,
                             MC_P2P_SHARDS_MAX);
    d->shards = (uint32_t)((d->size - 1) / d->shard_size + 1);
    d->id = mc__p2p_random();
    snprintf(d->origin, sizeof(d->origin), "%s", p2p->segment);
    return 0;
}

/* Whether two descriptions describe the same bytes. */
static bool same_object(const p2p_desc_t *a, const p2p_desc_t *b)
{
    return a->size == b->size && a->shard_size == b->shard_size && a->shards == b->shards &&
           !memcmp(a->sums, b->sums, a->shards * sizeof(*a->sums));
}

/* After a lost answer, a retried CAS finds our own description: that is a success. So is one
 * this node left without an owner: a CAS applied whose answer was lost while the store stayed
 * down failed its register, and nobody else may delete or serve that description. It names our
 * segment as its origin (no other live node has it) and the same bytes: it is adopted, with
 * its id (copies fetched from it stay valid), and d->id becomes that id. */
static int existing_is_ours(mc_p2p_t *p2p, const char *key, p2p_desc_t *d, int64_t *rev_p,
                            char *origin, size_t size, uint64_t *id_p)
{
    mc_meta_kv_t kv;
    p2p_desc_t old;
    int ours = 0;

    *id_p = 0;
    if (mc_meta_get(p2p->meta, key, strlen(key), &kv))
        return 0;
    if (mc__p2p_desc_decode(kv.value, kv.value_len, &old) == 0) {
        ours = old.id == d->id || (!strcmp(old.origin, p2p->segment) && same_object(&old, d));
        if (ours)
            d->id = old.id;
        *id_p = old.id;
        snprintf(origin, size, "%s", old.origin);
        mc__p2p_desc_free(&old);
    }
    *rev_p = kv.mod_revision;
    mc_meta_kv_free(&kv);
    return ours;
}

/* Whether object id of name, published by origin, was left by a publisher that is gone with
 * every copy: origin's segment is not in the store (its lease expired: the process died) and no
 * holder's entry names the object. Nobody can fetch it, and nobody would ever remove it (only
 * its origin may, by its revision): a register without force may replace it. A publisher
 * killed between its description and its entry left such a one; so does one killed after, once
 * its entry went with its lease, if no fetcher kept a copy. A live publisher between the two
 * steps has its segment in the store. */
static bool abandoned(mc_p2p_t *p2p, const char *name, const char *origin, uint64_t id)
{
    char key[P2P_KEY_MAX];
    mc_meta_kv_t kv, *kvs = NULL;
    size_t n = 0;
    bool gone = false;

    if (mc_meta_key(key, sizeof(key), p2p->cluster, "ram", origin) < 0)
        return false;
    int rc = mc_meta_get(p2p->meta, key, strlen(key), &kv);
    if (rc != -ENOENT) {
        if (!rc)
            mc_meta_kv_free(&kv);
        return false;
    }
    if (mc__p2p_key(p2p, name, "replica/", key) < 0 ||
        mc_meta_list(p2p->meta, key, strlen(key), &kvs, &n, NULL) < 0)
        return false;
    gone = true;
    for (size_t i = 0; gone && i < n; i++) {
        uint64_t eid;
        gone = mc__p2p_entry_id(kvs[i].value, kvs[i].value_len, &eid) || eid != id;
    }
    mc_meta_kvs_free(kvs, n);
    return gone;
}

/* Replace the abandoned description read at revision *rev_p with d's (json), until end while
 * the store is down: a CAS applied whose answer was lost finds ours there (existing_is_ours),
 * and one that finds another's in its place (written meanwhile) is -MC_ECONFLICT. */
static int replace_abandoned(mc_p2p_t *p2p, const char *key, p2p_desc_t *d, const char *json,
                             size_t len, int64_t *rev_p, uint64_t end)
{
    char origin[MC_NAME_MAX];
    int64_t rev = *rev_p;
    uint64_t id;

    for (;;) {
        int rc = mc_meta_cas(p2p->meta, key, strlen(key), rev, json, len, 0, rev_p);
        if (!mc__p2p_meta_down(rc) || mc__p2p_now_ms() >= end)
            return rc;
        mc__p2p_sleep_ms(100);
        if (existing_is_ours(p2p, key, d, rev_p, origin, sizeof(origin), &id))
            return 0;
    }
}

/* The id of a replaced description that does not decode (a newer format). */
#define REPLACED_UNKNOWN UINT64_MAX

/* Write d's description (json) in place of whatever stands at key: by CAS on the revision just
 * read, so that each of two forced publishes at once replaces exactly what it read, and the
 * entries it deletes afterwards are those of the object it replaced, never those of the one
 * that replaced it (a plain put made the loser delete the winner's entry). *replaced: the id of
 * the object replaced (0: none; REPLACED_UNKNOWN), left as it was when the one standing is d
 * itself (written by an attempt whose answer was lost). */
static int force_put(mc_p2p_t *p2p, const char *key, const p2p_desc_t *d, const char *json,
                     size_t len, int64_t *rev_p, uint64_t *replaced)
{
    mc_meta_kv_t kv;
    p2p_desc_t old;
    int64_t rev = 0;
    int rc = mc_meta_get(p2p->meta, key, strlen(key), &kv);

    if (rc == -ENOENT)
        *replaced = 0;
    else if (rc)
        return rc;
    else {
        rev = kv.mod_revision;
        if (mc__p2p_desc_decode(kv.value, kv.value_len, &old))
            *replaced = REPLACED_UNKNOWN;
        else {
            if (old.id != d->id)
                *replaced = old.id;
            mc__p2p_desc_free(&old);
        }
        mc_meta_kv_free(&kv);
    }
    return mc_meta_cas(p2p->meta, key, strlen(key), rev, json, len, 0, rev_p);
}

/* Publish d as name's description: only where there is none (or ours: existing_is_ours; or one
 * abandoned), or, forced, in place of any (*replaced: which, as force_put says). */
static int write_desc(mc_p2p_t *p2p, const char *name, p2p_desc_t *d, int force, int64_t *rev_p,
                      uint64_t *replaced)
{
    char key[P2P_KEY_MAX], *json, origin[MC_NAME_MAX] = "?";
    uint64_t end = mc__p2p_now_ms() + p2p->connect_timeout_ms, id = 0;
    size_t len;
    int rc = mc__p2p_key(p2p, name, "object", key);

    *replaced = 0;
    if (rc < 0 || (rc = mc__p2p_desc_encode(d, &json, &len)) != 0)
        return rc;
    for (;;) { /* no lease: the description outlives its origin */
        rc = force ? force_put(p2p, key, d, json, len, rev_p, replaced)
                   : mc_meta_cas(p2p->meta, key, strlen(key), 0, json, len, 0, rev_p);
        if (force && rc == -MC_ECONFLICT && mc__p2p_now_ms() < end)
            continue; /* written meanwhile by another publish: read it again */
        if (!mc__p2p_meta_down(rc) || mc__p2p_now_ms() >= end)
            break;
        mc__p2p_sleep_ms(100);
    }
    if (rc == -MC_ECONFLICT && !force &&
        existing_is_ours(p2p, key, d, rev_p, origin, sizeof(origin), &id))
        rc = 0;
    else if (rc == -MC_ECONFLICT && !force && id && abandoned(p2p, name, origin, id) &&
             (rc = replace_abandoned(p2p, key, d, json, len, rev_p, end)) == 0) {
        mc__p2p_warn(p2p, "%s: replacing the object %s published (gone, with every copy)", name,
                     origin);
        *replaced = id;
    }
    free(json);
    if (rc == 0)
        return 0;
    if (rc == -MC_ECONFLICT && !force)
        return mc__p2p_error(-EEXIST, "%s is published already (origin %s); force replaces it",
                             name, origin);
    return mc__p2p_error(mc__p2p_meta_down(rc) ? -MC_EMETA : rc, "%s: writing the description: %s",
                         name, mc_last_error());
}

/* Delete name's replica entries of the registration whose description had id (of_id), or of
 * every other one (!of_id); one that does not decode goes either way. A registration of the
 * name made meanwhile by another node keeps its entries (they carry its id), and an entry is
 * deleted only at the revision it was listed at. */
static void drop_entries(mc_p2p_t *p2p, const char *name, uint64_t id, bool of_id)
{
    char key[P2P_KEY_MAX];
    mc_meta_kv_t *kvs = NULL;
    size_t n = 0;
    int rc = mc__p2p_key(p2p, name, "replica/", key);

    if (rc >= 0)
        rc = mc_meta_list(p2p->meta, key, strlen(key), &kvs, &n, NULL);
    for (size_t i = 0; rc >= 0 && i < n; i++) {
        uint64_t eid;
        if (!mc__p2p_entry_id(kvs[i].value, kvs[i].value_len, &eid) && (eid == id) != of_id)
            continue;
        rc = mc_meta_delete(p2p->meta, kvs[i].key, kvs[i].key_len, kvs[i].mod_revision);
        if (rc == -ENOENT || rc == -MC_ECONFLICT) /* gone, or written again meanwhile */
            rc = 0;
    }
    if (rc < 0)
        mc__p2p_warn(p2p, "%s: deleting the replica entries: %s", name, mc_last_error());
    mc_meta_kvs_free(kvs, n);
}

static void delete_desc(mc_p2p_t *p2p, const char *name, int64_t rev)
{
    char key[P2P_KEY_MAX];
    int rc = mc__p2p_key(p2p, name, "object", key);

    if (rc >= 0)
        rc = mc_meta_delete(p2p->meta, key, strlen(key), rev);
    if (rc < 0 && rc != -ENOENT && rc != -MC_ECONFLICT)
        mc__p2p_warn(p2p, "%s: deleting the description: %s", name, mc_last_error());
}

int mc_p2p_register(mc_p2p_t *p2p, const char *name, const mc_p2p_buf_t *bufs, size_t n,
                    const mc_p2p_register_opts_t *opts)
{
    mc_p2p_register_opts_t o;
    p2p_desc_t d = {0};
    p2p_held_t *h;
    uint64_t replaced;
    int rc = register_args(p2p, name, bufs, n, opts, &o, &d);

    if (rc || (rc = mc__p2p_claim(p2p, name, true, &h)) != 0)
        return rc;
    rc = mc__p2p_checksum_all(&d, bufs, n);
    if (!rc)
        rc = mc__p2p_hold_bufs(p2p, h, bufs, n);
    if (!rc)
        rc = write_desc(p2p, name, &d, o.force, &h->object_rev, &replaced);
    if (rc)
        goto err_release;
    h->id = d.id; /* an adopted description's */
    /* A forced replacement: holders of the old object stop being listed (their entries name
     * its id, which fetchers ignore anyway); of one that did not decode, every other entry. */
    if (replaced == REPLACED_UNKNOWN)
        drop_entries(p2p, name, d.id, false);
    else if (replaced)
        drop_entries(p2p, name, replaced, true);
    rc = publish_complete(p2p, h, &d);
    if (rc)
        goto err_delete_desc;
    mc__p2p_desc_free(&d);
    mc__p2p_settle(p2p, h);
    return 0;

err_delete_desc:
    delete_desc(p2p, name, h->object_rev);
err_release:
    rc = mc__p2p_drop(p2p, h, rc);
    mc__p2p_desc_free(&d);
    return rc;
}

/* ---- withdrawing ---- */

int mc_p2p_unregister(mc_p2p_t *p2p, const char *name, int keep_replicas)
{
    char key[P2P_KEY_MAX];
    p2p_held_t *h;
    int rc = p2p ? mc__p2p_name_check(name) : mc__p2p_error(-EINVAL, "NULL node");

    if (rc || (rc = mc__p2p_take(p2p, name, true, &h)) != 0)
        return rc;
    rc = mc__p2p_key(p2p, name, "object", key);
    if (rc >= 0)
        rc = mc_meta_delete(p2p->meta, key, strlen(key), h->object_rev);
    /* Gone already (removed) or replaced by someone else's (force): ours is withdrawn. */
    if (rc == -ENOENT || rc == -MC_ECONFLICT)
        rc = 1;
    if (rc >= 0 && !keep_replicas) /* its entries, by its id (a newer object's stay) */
        drop_entries(p2p, name, h->id, true);
    if (rc < 0)
        rc = mc__p2p_error(mc__p2p_meta_down(rc) ? -MC_EMETA : rc,
                           "%s: deleting the description (remove it later): %s", name,
                           mc_last_error());
    return mc__p2p_drop(p2p, h, rc < 0 ? rc : 0);
}

int mc_p2p_remove(mc_p2p_t *p2p, const char *name, int keep_replicas)
{
    char key[P2P_KEY_MAX];
    mc_meta_kv_t kv;
    int rc = p2p ? mc__p2p_name_check(name) : mc__p2p_error(-EINVAL, "NULL node");

    if (rc || (rc = mc__p2p_key(p2p, name, "object", key)) < 0)
        return rc;
    rc = mc__p2p_meta_get(p2p, key, &kv);
    if (rc == -ENOENT)
        return mc__p2p_error(-ENOENT, "%s: no such object", name);
    if (rc)
        return rc;
    p2p_desc_t d = {0};
    bool known = mc__p2p_desc_decode(kv.value, kv.value_len, &d) == 0; /* else: every entry */
    if (known)
        mc__p2p_desc_free(&d);
    rc = mc_meta_delete(p2p->meta, key, strlen(key), kv.mod_revision);
    mc_meta_kv_free(&kv);
    if (rc == -ENOENT || rc == -MC_ECONFLICT)
        return mc__p2p_error(rc == -ENOENT ? -ENOENT : -EBUSY, "%s: removed or replaced meanwhile",
                             name);
    if (rc)
        return mc__p2p_error(mc__p2p_meta_down(rc) ? -MC_EMETA : rc, "%s: deleting: %s", name,
                             mc_last_error());
    if (!keep_replicas)
        drop_entries(p2p, name, known ? d.id : 0, known);
    return 0;
}

int mc_p2p_delete_replica(mc_p2p_t *p2p, const char *name)
{
    p2p_held_t *h;
    int rc = p2p ? mc__p2p_name_check(name) : mc__p2p_error(-EINVAL, "NULL node");

    if (rc || (rc = mc__p2p_take(p2p, name, false, &h)) != 0)
        return rc;
    return mc__p2p_drop(p2p, h, 0);
}

/* ---- serve ---- */

/* The description of name, decoded: -ENOENT, -MC_EMETA, -EPROTO. */
int mc__p2p_desc_get(mc_p2p_t *p2p, const char *name, p2p_desc_t *d)
{
    char key[P2P_KEY_MAX];
    mc_meta_kv_t kv;
    int rc = mc__p2p_key(p2p, name, "object", key);

    if (rc < 0)
        return rc;
    rc = mc__p2p_meta_get(p2p, key, &kv);
    if (rc == -ENOENT)
        return mc__p2p_error(-ENOENT, "%s: no such object", name);
    if (rc)
        return rc;
    rc = mc__p2p_desc_decode(kv.value, kv.value_len, d);
    mc_meta_kv_free(&kv);
    if (rc)
        return mc__p2p_error(rc, "%s: %s", name, mc_p2p_last_error());
    return 0;
}

int mc_p2p_serve(mc_p2p_t *p2p, const char *name, const mc_p2p_buf_t *bufs, size_t n)
{
    uint64_t total = 0;
    p2p_desc_t d = {0};
    p2p_held_t *h;
    uint32_t bad;
    int rc = p2p ? mc__p2p_name_check(name) : mc__p2p_error(-EINVAL, "NULL node");

    if (!rc)
        rc = mc__p2p_bufs_check(name, bufs, n, &total);
    if (rc || (rc = mc__p2p_desc_get(p2p, name, &d)) != 0)
        return rc;
    if (total != d.size)
        rc = mc__p2p_error(-EINVAL, "%s: the buffers hold %llu bytes, the object %llu", name,
                           (unsigned long long)total, (unsigned long long)d.size);
    else if ((bad = mc__p2p_verify_all(&d, bufs, n)) < d.shards)
        rc = mc__p2p_error(-EILSEQ, "%s: shard %u (bytes %llu..%llu) does not match its checksum",
                           name, bad, (unsigned long long)p2p_shard_off(&d, bad),
                           (unsigned long long)(p2p_shard_off(&d, bad) + p2p_shard_len(&d, bad)));
    if (!rc && (rc = mc__p2p_claim(p2p, name, false, &h)) == 0) {
        rc = mc__p2p_hold_bufs(p2p, h, bufs, n);
        if (!rc)
            rc = publish_complete(p2p, h, &d);
        if (rc)
            rc = mc__p2p_drop(p2p, h, rc);
        else
            mc__p2p_settle(p2p, h);
    }
    mc__p2p_desc_free(&d);
    return rc;
}
