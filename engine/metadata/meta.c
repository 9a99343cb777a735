/* Metadata interface: scheme dispatch, thin wrappers over the backend ops (mc__meta_*, used
 * inside the engine) and the public API of <mooncake/meta.h> (mc_meta_*) over them. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mooncake/error.h>

#include "config.h"
#include "metadata/meta.h"
#include "util/log.h"

/* Backends, defined in meta_<scheme>.c. Adding one is a declaration here and a table line. */
extern const mc_meta_ops_t mc__meta_file_ops;
extern const mc_meta_ops_t mc__meta_etcd_ops;

static const mc_meta_ops_t *const meta_backends[] = {
    &mc__meta_file_ops,
    &mc__meta_etcd_ops,
};

#define MC_META_NBACKENDS (sizeof(meta_backends) / sizeof(meta_backends[0]))

static const mc_meta_ops_t *meta_backend_find(const char *scheme, size_t len)
{
    for (size_t i = 0; i < MC_META_NBACKENDS; i++) {
        const mc_meta_ops_t *ops = meta_backends[i];
        if (strlen(ops->scheme) == len && memcmp(ops->scheme, scheme, len) == 0)
            return ops;
    }
    return NULL;
}

int mc__meta_open(const char *url, const mc_meta_opts_t *opts, mc_meta_t **meta_p)
{
    const char *sep = url ? strstr(url, "://") : NULL;
    const mc_meta_ops_t *ops;

    if (!sep || sep == url)
        return mc__set_error(-EINVAL, "metadata URL '%s' is not of the form scheme://...",
                             url ? url : "(null)");
    ops = meta_backend_find(url, (size_t)(sep - url));
    if (!ops)
        return mc__set_error(-EINVAL, "metadata URL '%s': unknown scheme '%.*s'", url,
                             (int)(sep - url), url);
    return ops->open(sep + 3, opts, meta_p);
}

void mc__meta_close(mc_meta_t *meta)
{
    if (meta)
        meta->ops->close(meta);
}

static int meta_check_key(const void *key, size_t key_len)
{
    if (!key || key_len == 0)
        return mc__set_error(-EINVAL, "metadata key is empty");
    return 0;
}

int mc__meta_get(mc_meta_t *meta, const void *key, size_t key_len, mc_meta_kv_t *kv_p)
{
    int rc = meta_check_key(key, key_len);

    return rc ? rc : meta->ops->get(meta, key, key_len, kv_p);
}

int mc__meta_put(mc_meta_t *meta, const void *key, size_t key_len, const void *val, size_t val_len,
                 int64_t lease, int64_t *revision_p)
{
    int rc = meta_check_key(key, key_len);

    return rc ? rc : meta->ops->put(meta, key, key_len, val, val_len, lease, revision_p);
}

int mc__meta_del(mc_meta_t *meta, const void *key, size_t key_len)
{
    int rc = meta_check_key(key, key_len);

    return rc ? rc : meta->ops->del(meta, key, key_len, 0);
}

int mc__meta_list(mc_meta_t *meta, const void *prefix, size_t prefix_len, mc_meta_kv_t **kvs_p,
                  size_t *count_p)
{
    return meta->ops->list(meta, prefix, prefix_len, kvs_p, count_p, NULL);
}

int mc__meta_cas(mc_meta_t *meta, const void *key, size_t key_len, int64_t expected_mod_revision,
                 const void *val, size_t val_len, int64_t lease, int64_t *revision_p)
{
    int rc = meta_check_key(key, key_len);

    if (rc)
        return rc;
    if (expected_mod_revision < 0)
        return mc__set_error(-EINVAL, "CAS expected revision %lld is negative",
                             (long long)expected_mod_revision);
    return meta->ops->cas(meta, key, key_len, expected_mod_revision, val, val_len, lease,
                          revision_p);
}

int mc__meta_lease_grant(mc_meta_t *meta, unsigned ttl_s, int64_t *lease_p)
{
    if (ttl_s == 0)
        return mc__set_error(-EINVAL, "lease TTL must be at least 1 s");
    return meta->ops->lease_grant(meta, ttl_s, lease_p);
}

int mc__meta_lease_keepalive(mc_meta_t *meta, int64_t lease)
{
    return meta->ops->lease_keepalive(meta, lease);
}

int mc__meta_lease_revoke(mc_meta_t *meta, int64_t lease)
{
    return meta->ops->lease_revoke(meta, lease);
}

int mc__meta_watch_create(mc_meta_t *meta, const void *prefix, size_t prefix_len,
                          int64_t start_revision, mc_meta_watch_t **watch_p)
{
    if (start_revision < 0)
        return mc__set_error(-EINVAL, "watch start revision %lld is negative",
                             (long long)start_revision);
    return meta->ops->watch_create(meta, prefix, prefix_len, start_revision, watch_p);
}

int mc__meta_watch_next(mc_meta_watch_t *watch, int timeout_ms, mc_meta_event_t *event_p)
{
    return watch->meta->ops->watch_next(watch, timeout_ms, event_p);
}

void mc__meta_watch_destroy(mc_meta_watch_t *watch)
{
    if (watch)
        watch->meta->ops->watch_destroy(watch);
}

void mc__meta_kv_free(mc_meta_kv_t *kv)
{
    if (!kv)
        return;
    free(kv->key);
    free(kv->value);
    memset(kv, 0, sizeof(*kv));
}

void mc__meta_kvs_free(mc_meta_kv_t *kvs, size_t count)
{
    for (size_t i = 0; i < count; i++)
        mc__meta_kv_free(&kvs[i]);
    free(kvs);
}

int mc__meta_key(char *buf, size_t size, const char *cluster_id, const char *kind, const char *name)
{
    int n;

    if (cluster_id && *cluster_id)
        n = snprintf(buf, size, "mooncake/%s/%s/%s", cluster_id, kind, name);
    else
        n = snprintf(buf, size, "mooncake/%s/%s", kind, name);
    if (n < 0 || (size_t)n >= size)
        return mc__set_error(-ENAMETOOLONG, "metadata key for %s/%s does not fit in %zu bytes",
                             kind, name, size);
    return n;
}

/* ---- the public API (include/mooncake/meta.h) ---- */

/* Public calls check what the internal ones trust: a NULL argument fails instead of crashing. */
static int meta_null(const char *fn, const char *what)
{
    return mc__set_error(-EINVAL, "%s: %s is NULL", fn, what);
}

/* A byte range that is NULL but not empty. */
static int meta_check_range(const char *fn, const char *what, const void *p, size_t len)
{
    return !p && len ? mc__set_error(-EINVAL, "%s: %s is NULL with length %zu", fn, what, len) : 0;
}

int mc_meta_open(const char *url, mc_meta_t **meta_p)
{
    if (!meta_p)
        return meta_null("mc_meta_open", "meta_p");
    return mc__meta_open(url, NULL /* options from MC_ETCD_* */, meta_p);
}

/* The store a configuration names, with its ETCD_* settings (the engine opens its own so). */
int mc__meta_open_config(const mc_config_t *c, mc_meta_t **meta_p)
{
    mc_meta_opts_t opts = {
        .user = mc__config_str(c, "ETCD_USER"),
        .password = mc__config_str(c, "ETCD_PASSWORD"),
        .cacert = mc__config_str(c, "ETCD_CACERT"),
        .cert = mc__config_str(c, "ETCD_CERT"),
        .key = mc__config_str(c, "ETCD_KEY"),
        .timeout_ms = (unsigned)mc__config_num(c, "ETCD_TIMEOUT_MS"),
    };

    return mc__meta_open(mc__config_str(c, "METADATA"), &opts, meta_p);
}

int mc_meta_open_config(const mc_config_t *config, mc_meta_t **meta_p)
{
    mc_config_t *own = NULL;
    int rc;

    if (!meta_p)
        return meta_null("mc_meta_open_config", "meta_p");
    if (!config && (rc = mc_config_create(&own)) < 0)
        return rc;
    rc = mc__meta_open_config(config ? config : own, meta_p);
    mc_config_destroy(own);
    return rc;
}

void mc_meta_close(mc_meta_t *meta)
{
    mc__meta_close(meta);
}

int mc_meta_get(mc_meta_t *meta, const void *key, size_t key_len, mc_meta_kv_t *kv_p)
{
    if (!meta || !kv_p)
        return meta_null("mc_meta_get", meta ? "kv_p" : "meta");
    return mc__meta_get(meta, key, key_len, kv_p);
}

int mc_meta_put(mc_meta_t *meta, const void *key, size_t key_len, const void *val, size_t val_len,
                int64_t lease, int64_t *revision_p)
{
    int rc = meta ? meta_check_range("mc_meta_put", "val", val, val_len)
                  : meta_null("mc_meta_put", "meta");

    return rc ? rc : mc__meta_put(meta, key, key_len, val, val_len, lease, revision_p);
}

int mc_meta_cas(mc_meta_t *meta, const void *key, size_t key_len, int64_t expected_mod_revision,
                const void *val, size_t val_len, int64_t lease, int64_t *revision_p)
{
    int rc = meta ? meta_check_range("mc_meta_cas", "val", val, val_len)
                  : meta_null("mc_meta_cas", "meta");

    return rc ? rc
              : mc__meta_cas(meta, key, key_len, expected_mod_revision, val, val_len, lease,
                             revision_p);
}

int mc_meta_delete(mc_meta_t *meta, const void *key, size_t key_len, int64_t mod_revision)
{
    int rc = meta ? meta_check_key(key, key_len) : meta_null("mc_meta_delete", "meta");

    if (rc == 0 && mod_revision < 0)
        rc = mc__set_error(-EINVAL, "mc_meta_delete: mod_revision %lld is negative",
                           (long long)mod_revision);
    return rc ? rc : meta->ops->del(meta, key, key_len, mod_revision);
}

int mc_meta_delete_prefix(mc_meta_t *meta, const void *prefix, size_t prefix_len, size_t *deleted_p)
{
    size_t deleted = 0;
    int rc;

    if (!meta)
        return meta_null("mc_meta_delete_prefix", "meta");
    if (!prefix || prefix_len == 0)
        return mc__set_error(
            -EINVAL, "mc_meta_delete_prefix: the prefix is empty (it would delete every key)");
    if (!MC_META_HAS(meta->ops, delete_prefix))
        return mc__set_error(-ENOTSUP, "metadata backend %s:// cannot delete a prefix",
                             meta->ops->scheme);
    rc = meta->ops->delete_prefix(meta, prefix, prefix_len, &deleted);
    if (rc == 0 && deleted_p)
        *deleted_p = deleted;
    return rc;
}

int mc_meta_list(mc_meta_t *meta, const void *prefix, size_t prefix_len, mc_meta_kv_t **kvs_p,
                 size_t *count_p, int64_t *revision_p)
{
    int rc;

    if (!meta || !kvs_p || !count_p)
        return meta_null("mc_meta_list", !meta ? "meta" : !kvs_p ? "kvs_p" : "count_p");
    rc = meta_check_range("mc_meta_list", "prefix", prefix, prefix_len);
    return rc ? rc : meta->ops->list(meta, prefix, prefix_len, kvs_p, count_p, revision_p);
}

int mc_meta_lease_grant(mc_meta_t *meta, unsigned ttl_s, int64_t *lease_p)
{
    if (!meta || !lease_p)
        return meta_null("mc_meta_lease_grant", meta ? "lease_p" : "meta");
    return mc__meta_lease_grant(meta, ttl_s, lease_p);
}

int mc_meta_lease_keepalive(mc_meta_t *meta, int64_t lease)
{
    return meta ? mc__meta_lease_keepalive(meta, lease)
                : meta_null("mc_meta_lease_keepalive", "meta");
}

int mc_meta_lease_revoke(mc_meta_t *meta, int64_t lease)
{
    return meta ? mc__meta_lease_revoke(meta, lease) : meta_null("mc_meta_lease_revoke", "meta");
}

int mc_meta_watch_create(mc_meta_t *meta, const void *prefix, size_t prefix_len,
                         int64_t start_revision, mc_meta_watch_t **watch_p)
{
    int rc;

    if (!meta || !watch_p)
        return meta_null("mc_meta_watch_create", meta ? "watch_p" : "meta");
    rc = meta_check_range("mc_meta_watch_create", "prefix", prefix, prefix_len);
    return rc ? rc : mc__meta_watch_create(meta, prefix, prefix_len, start_revision, watch_p);
}

int mc_meta_watch_next(mc_meta_watch_t *watch, int timeout_ms, mc_meta_event_t *event_p)
{
    if (!watch || !event_p)
        return meta_null("mc_meta_watch_next", watch ? "event_p" : "watch");
    return mc__meta_watch_next(watch, timeout_ms, event_p);
}

void mc_meta_watch_destroy(mc_meta_watch_t *watch)
{
    mc__meta_watch_destroy(watch);
}

void mc_meta_kv_free(mc_meta_kv_t *kv)
{
    mc__meta_kv_free(kv);
}

void mc_meta_kvs_free(mc_meta_kv_t *kvs, size_t count)
{
    mc__meta_kvs_free(kvs, count);
}

int mc_meta_key(char *buf, size_t size, const char *cluster_id, const char *kind, const char *name)
{
    if (!buf || !kind || !name)
        return meta_null("mc_meta_key", !buf ? "buf" : !kind ? "kind" : "name");
    return mc__meta_key(buf, size, cluster_id, kind, name);
}
