/* Cache of peer descriptors read from metadata, kept current by a watch on the ram/ prefix, so
 * that opening or re-reading a segment still works while the metadata service is briefly
 * unreachable. Started by the first lookup through metadata; stopped by mc_engine_destroy.
 *
 * Three writers: the cache thread's listings and watch events, and blocking lookups, whose get
 * may be answered before a change the watch then delivers first. Revisions order them: an entry
 * is replaced only by a newer descriptor (its mod_revision), and deleted only by a deletion
 * newer than it; a lookup does not bring back a key the cache has seen the store go past (its
 * descriptor no newer than the revision the cache caught up with, and the key not cached: it
 * was deleted since). Before, a lookup that raced a restarted peer's new descriptor put the old
 * one back, and one that raced its deletion (or the listing that started the watch) brought a
 * departed peer back until the next change of its key: opens reached its old address. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine_int.h"

#define WATCH_POLL_MS  200
#define WATCH_RETRY_US (500 * 1000)

typedef struct cache_entry {
    char name[MC_NAME_MAX];
    char *value;
    size_t len;
    int64_t rev;  /* its mod_revision (0: the backend gave none) */
    unsigned gen; /* the listing it was last seen in (0: none) */
} cache_entry_t;

/* Who puts a descriptor into the cache. */
enum put_by { BY_LOOKUP, BY_LISTING, BY_EVENT };

struct mc_seg_cache {
    pthread_mutex_t lock;
    cache_entry_t *v;
    size_t n, cap;
    pthread_t tid;
    atomic_bool stop;
    char prefix[256];
    size_t prefix_len;
    unsigned gen;          /* listings so far (under lock) */
    int64_t known_rev;     /* the store's revision the cache caught up with (under lock) */
    atomic_uint deletions; /* entries deleted (a lease expired, an engine left) */
};

static cache_entry_t *find(struct mc_seg_cache *c, const char *name)
{
    for (size_t i = 0; i < c->n; i++)
        if (!strcmp(c->v[i].name, name))
            return &c->v[i];
    return NULL;
}

/* Whether a descriptor of revision rev from a lookup is older than what the cache knows of its
 * key: a newer descriptor cached, or none although the cache caught up with the store past rev
 * (the key was deleted since). Under lock. */
static bool lookup_stale(const struct mc_seg_cache *c, const cache_entry_t *en, int64_t rev)
{
    if (!rev)
        return false;
    return en ? en->rev > rev : rev <= c->known_rev;
}

static void cache_put(struct mc_seg_cache *c, const char *name, const mc_meta_kv_t *kv,
                      enum put_by by)
{
    char *copy = malloc(kv->value_len + 1);
    int64_t rev = kv->mod_revision;

    if (!copy || strlen(name) >= MC_NAME_MAX) {
        free(copy);
        return;
    }
    memcpy(copy, kv->value, kv->value_len);
    copy[kv->value_len] = 0;
    pthread_mutex_lock(&c->lock);
    cache_entry_t *en = find(c, name);
    if (by == BY_EVENT && rev > c->known_rev)
        c->known_rev = rev;
    if (by == BY_LISTING && en)
        en->gen = c->gen;
    if ((by == BY_LOOKUP && lookup_stale(c, en, rev)) || (rev && en && en->rev > rev)) {
        pthread_mutex_unlock(&c->lock);
        free(copy);
        return;
    }
    if (!en && c->n == c->cap) {
        size_t cap = c->cap ? 2 * c->cap : 16;
        cache_entry_t *v = realloc(c->v, cap * sizeof(*v));
        if (v) {
            c->v = v;
            c->cap = cap;
        }
    }
    if (!en && c->n < c->cap) {
        en = &c->v[c->n++];
        snprintf(en->name, sizeof(en->name), "%s", name);
        en->value = NULL;
        en->gen = 0;
    }
    if (en) {
        free(en->value);
        en->value = copy;
        en->len = kv->value_len;
        en->rev = rev;
        if (by == BY_LISTING)
            en->gen = c->gen;
    } else {
        free(copy);
    }
    pthread_mutex_unlock(&c->lock);
}

/* A watch's DELETE at revision rev: not of a descriptor newer than it (a lookup's). */
static void cache_del(struct mc_seg_cache *c, const char *name, int64_t rev)
{
    pthread_mutex_lock(&c->lock);
    cache_entry_t *en = find(c, name);
    if (rev > c->known_rev)
        c->known_rev = rev;
    if (en && !(rev && en->rev > rev)) {
        free(en->value);
        *en = c->v[--c->n];
        atomic_fetch_add(&c->deletions, 1);
    }
    pthread_mutex_unlock(&c->lock);
}

/* The segment name of a key under the prefix, or NULL. */
static const char *key_name(struct mc_seg_cache *c, const mc_meta_kv_t *kv)
{
    if (kv->key_len <= c->prefix_len || memcmp(kv->key, c->prefix, c->prefix_len))
        return NULL;
    return kv->key + c->prefix_len;
}

/* Entries not in the latest listing, of revision rev: deleted while no watch was running (one
 * newer than the listing is a lookup's, which the watch follows from there). */
static void drop_unlisted(struct mc_seg_cache *c, int64_t rev)
{
    pthread_mutex_lock(&c->lock);
    for (size_t i = 0; i < c->n;) {
        if (c->v[i].gen == c->gen || (rev && c->v[i].rev > rev)) {
            i++;
            continue;
        }
        free(c->v[i].value);
        c->v[i] = c->v[--c->n];
        atomic_fetch_add(&c->deletions, 1);
    }
    pthread_mutex_unlock(&c->lock);
}

static int64_t relist(mc_engine_t *e, struct mc_seg_cache *c)
{
    mc_meta_kv_t *kvs;
    size_t n;
    int64_t rev = 0;

    /* The listing's revision: a watch from the next one neither misses nor replays a change. */
    if (mc_meta_list(e->meta, c->prefix, c->prefix_len, &kvs, &n, &rev))
        return -1;
    pthread_mutex_lock(&c->lock);
    c->gen++;
    if (rev < c->known_rev) /* a store that went back (etcd's data wiped): its revisions anew */
        for (size_t i = 0; i < c->n; i++)
            c->v[i].rev = 0;
    c->known_rev = rev;
    pthread_mutex_unlock(&c->lock);
    for (size_t i = 0; i < n; i++) {
        const char *name = key_name(c, &kvs[i]);
        if (name)
            cache_put(c, name, &kvs[i], BY_LISTING);
    }
    mc__meta_kvs_free(kvs, n);
    drop_unlisted(c, rev);
    return rev;
}

/* List, then follow the watch; on any error start over after a pause. */
static void *cache_thread(void *arg)
{
    mc_engine_t *e = arg;
    struct mc_seg_cache *c = e->seg_cache;

    mc__log_enter(e->cfg.log_level);
    while (!atomic_load(&c->stop)) {
        mc_meta_watch_t *w;
        int64_t rev = relist(e, c);
        if (rev < 0 || mc__meta_watch_create(e->meta, c->prefix, c->prefix_len, rev + 1, &w)) {
            usleep(WATCH_RETRY_US);
            continue;
        }
        while (!atomic_load(&c->stop)) {
            mc_meta_event_t ev;
            int rc = mc__meta_watch_next(w, WATCH_POLL_MS, &ev);
            if (rc == -ETIMEDOUT)
                continue;
            if (rc)
                break;
            const char *name = key_name(c, &ev.kv);
            if (name && ev.type == MC_META_PUT)
                cache_put(c, name, &ev.kv, BY_EVENT);
            else if (name)
                cache_del(c, name, ev.kv.mod_revision);
            mc__meta_kv_free(&ev.kv);
        }
        mc__meta_watch_destroy(w);
    }
    return NULL;
}

static void cache_start(mc_engine_t *e)
{
    struct mc_seg_cache *c = calloc(1, sizeof(*c));
    int n;

    if (!c)
        return;
    pthread_mutex_init(&c->lock, NULL);
    n = mc__meta_key(c->prefix, sizeof(c->prefix), e->cfg.cluster_id, "ram", "");
    c->prefix_len = n > 0 ? (size_t)n : 0;
    e->seg_cache = c;
    if (n <= 0 || pthread_create(&c->tid, NULL, cache_thread, e)) {
        c->tid = 0;
        mc_warn("segment descriptors will not be watched");
    }
}

/* Copy a cached descriptor into kv. Returns 0, or -ENOENT if not cached. */
static int cache_get(struct mc_seg_cache *c, const char *key, size_t key_len, const char *name,
                     mc_meta_kv_t *kv)
{
    int rc = -ENOENT;

    pthread_mutex_lock(&c->lock);
    cache_entry_t *en = find(c, name);
    memset(kv, 0, sizeof(*kv));
    if (en) {
        kv->value = malloc(en->len + 1);
        kv->key = strdup(key);
        if (kv->value && kv->key) {
            memcpy(kv->value, en->value, en->len + 1);
            kv->value_len = en->len;
            kv->key_len = key_len;
            rc = 0;
        } else {
            mc__meta_kv_free(kv);
        }
    }
    pthread_mutex_unlock(&c->lock);
    return rc;
}

int mc__meta_lookup(mc_engine_t *e, const char *name, bool cached_only, mc_meta_kv_t *kv)
{
    char key[512];
    int n = mc__meta_key(key, sizeof(key), e->cfg.cluster_id, "ram", name);
    int rc;

    if (n < 0)
        return mc__set_error(-ENAMETOOLONG, "segment name too long: %s", name);
    pthread_mutex_lock(&e->meta_lock);
    if (!e->seg_cache)
        cache_start(e);
    pthread_mutex_unlock(&e->meta_lock);
    struct mc_seg_cache *c = e->seg_cache;
    if (cached_only)
        return c ? cache_get(c, key, (size_t)n, name, kv) : -ENOENT;
    rc = mc__meta_get(e->meta, key, (size_t)n, kv);
    if (!c || rc == -ENOENT)
        return rc;
    if (rc == 0) {
        cache_put(c, name, kv, BY_LOOKUP);
        return 0;
    }
    /* The metadata service did not answer: serve the last descriptor we saw. */
    if (cache_get(c, key, (size_t)n, name, kv))
        return rc;
    mc_info("metadata unreachable: using the cached descriptor of %s", name);
    return 0;
}

unsigned mc__meta_cache_deletions(mc_engine_t *e)
{
    pthread_mutex_lock(&e->meta_lock);
    struct mc_seg_cache *c = e->seg_cache;
    pthread_mutex_unlock(&e->meta_lock);
    return c ? atomic_load(&c->deletions) : 0;
}

void mc__meta_cache_stop(mc_engine_t *e)
{
    struct mc_seg_cache *c = e->seg_cache;

    if (!c)
        return;
    atomic_store(&c->stop, true);
    if (c->tid)
        pthread_join(c->tid, NULL);
    for (size_t i = 0; i < c->n; i++)
        free(c->v[i].value);
    free(c->v);
    pthread_mutex_destroy(&c->lock);
    free(c);
    e->seg_cache = NULL;
}
