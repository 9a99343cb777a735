/* Listing objects and their holders. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "p2p_codec.h"
#include "p2p_int.h"

/* An object found while listing: its figures and the id its holders' entries must name. */
typedef struct listed {
    mc_p2p_object_info_t info;
    uint64_t id;
} listed_t;

static int listed_cmp(const void *a, const void *b)
{
    return strcmp(((const listed_t *)a)->info.name, ((const listed_t *)b)->info.name);
}

static void info_set(mc_p2p_object_info_t *info, const char *name, size_t name_len,
                     const p2p_desc_t *d)
{
    memset(info, 0, sizeof(*info));
    memcpy(info->name, name, name_len);
    info->size = d->size;
    info->shard_size = d->shard_size;
    info->shards = d->shards;
    snprintf(info->origin, sizeof(info->origin), "%s", d->origin);
}

/* One replica entry counted for the object it belongs to (if it is of this publication). */
static void info_count(listed_t *l, const char *json, size_t len)
{
    p2p_entry_t e;

    if (mc__p2p_entry_decode(json, len, l->info.size, &e))
        return;
    if (e.id == l->id && e.shards == l->info.shards) {
        l->info.holders++;
        l->info.complete_holders += e.complete;
    }
    mc__p2p_entry_free(&e);
}

/* Listing with retries while the store does not answer. */
static int list_retry(mc_p2p_t *p2p, const char *prefix, mc_meta_kv_t **kvs_p, size_t *n_p)
{
    uint64_t end = mc__p2p_now_ms() + p2p->connect_timeout_ms;
    int rc;

    while ((rc = mc_meta_list(p2p->meta, prefix, strlen(prefix), kvs_p, n_p, NULL)) != 0 &&
           mc__p2p_meta_down(rc) && mc__p2p_now_ms() < end)
        mc__p2p_sleep_ms(100);
    if (rc)
        return mc__p2p_error(mc__p2p_meta_down(rc) ? -MC_EMETA : rc, "metadata list %s: %s", prefix,
                             mc_last_error());
    return 0;
}

/* Pass 1: the descriptions ("<name>/object", name free of a "replica" component). */
static size_t collect_objects(const mc_meta_kv_t *kvs, size_t n, size_t base, listed_t *out)
{
    size_t count = 0;

    for (size_t i = 0; i < n; i++) {
        const char *rel = kvs[i].key + base;
        size_t len = strlen(rel);
        p2p_desc_t d;
        if (strstr(rel, "/replica/") || len <= 7 || strcmp(rel + len - 7, "/object") ||
            len - 7 >= MC_P2P_NAME_MAX || mc__p2p_desc_decode(kvs[i].value, kvs[i].value_len, &d))
            continue;
        info_set(&out[count].info, rel, len - 7, &d);
        out[count++].id = d.id;
        mc__p2p_desc_free(&d);
    }
    return count;
}

/* Pass 2: the replica entries ("<name>/replica/<segment>"), each to its object. */
static void count_holders(const mc_meta_kv_t *kvs, size_t n, size_t base, listed_t *objs,
                          size_t count)
{
    for (size_t i = 0; i < n; i++) {
        const char *rel = kvs[i].key + base, *sep = strstr(rel, "/replica/");
        listed_t key, *l;
        if (!sep || (size_t)(sep - rel) >= MC_P2P_NAME_MAX)
            continue;
        memset(key.info.name, 0, sizeof(key.info.name));
        memcpy(key.info.name, rel, (size_t)(sep - rel));
        l = bsearch(&key, objs, count, sizeof(*objs), listed_cmp);
        if (l)
            info_count(l, kvs[i].value, kvs[i].value_len);
    }
}

static int list_args(mc_p2p_t *p2p, const char *prefix, void *infos_p, void *count_p)
{
    if (!p2p || !infos_p || !count_p)
        return mc__p2p_error(-EINVAL, "mc_p2p_list: NULL argument");
    for (const char *c = prefix; *c; c++)
        if (!strchr("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-/", *c))
            return mc__p2p_error(-EINVAL, "prefix \"%s\": character 0x%02x is in no name", prefix,
                                 (unsigned char)*c);
    return 0;
}

int mc_p2p_list(mc_p2p_t *p2p, const char *prefix, mc_p2p_object_info_t **infos_p, size_t *count_p)
{
    char key[P2P_KEY_MAX];
    mc_meta_kv_t *kvs;
    listed_t *objs;
    size_t n, count, base;
    int rc = list_args(p2p, prefix ? prefix : "", infos_p, count_p);

    if (rc)
        return rc;
    if ((rc = mc_meta_key(key, sizeof(key), p2p->cluster, "p2p", "")) < 0)
        return mc__p2p_error(rc, "%s", mc_last_error());
    base = (size_t)rc;
    if (strlen(key) + strlen(prefix ? prefix : "") >= sizeof(key))
        return mc__p2p_error(-ENAMETOOLONG, "prefix \"%s\" is too long", prefix);
    strcat(key, prefix ? prefix : "");
    if ((rc = list_retry(p2p, key, &kvs, &n)) != 0)
        return rc;
    objs = calloc(n ? n : 1, sizeof(*objs));
    if (!objs) {
        mc_meta_kvs_free(kvs, n);
        return mc__p2p_error(-ENOMEM, "out of memory");
    }
    count = collect_objects(kvs, n, base, objs);
    qsort(objs, count, sizeof(*objs), listed_cmp);
    count_holders(kvs, n, base, objs, count);
    mc_meta_kvs_free(kvs, n);
    mc_p2p_object_info_t *infos = malloc((count ? count : 1) * sizeof(*infos));
    for (size_t i = 0; infos && i < count; i++)
        infos[i] = objs[i].info;
    free(objs);
    if (!infos)
        return mc__p2p_error(-ENOMEM, "out of memory");
    *infos_p = infos;
    *count_p = count;
    return 0;
}

int mc_p2p_stat(mc_p2p_t *p2p, const char *name, mc_p2p_object_info_t *info_p)
{
    char key[P2P_KEY_MAX];
    mc_meta_kv_t *kvs;
    listed_t l;
    p2p_desc_t d;
    size_t n;
    int rc = p2p && info_p ? mc__p2p_name_check(name)
                           : mc__p2p_error(-EINVAL, "mc_p2p_stat: NULL argument");

    if (rc || (rc = mc__p2p_desc_get(p2p, name, &d)) != 0)
        return rc;
    info_set(&l.info, name, strlen(name), &d);
    l.id = d.id;
    mc__p2p_desc_free(&d);
    if ((rc = mc__p2p_key(p2p, name, "replica/", key)) < 0 ||
        (rc = list_retry(p2p, key, &kvs, &n)) != 0)
        return rc;
    for (size_t i = 0; i < n; i++)
        info_count(&l, kvs[i].value, kvs[i].value_len);
    mc_meta_kvs_free(kvs, n);
    *info_p = l.info;
    return 0;
}
