/* The etcd:// metadata backend: the operations over etcd's v3 JSON gateway. See meta_etcd_int.h
 * for the configuration and meta_etcd_http.c for the transport. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mooncake/error.h>

#include "metadata/meta_etcd_int.h"
#include "util/log.h"

int mc__etcd_kv_decode(json_t *jkv, mc_meta_kv_t *kv_p)
{
    const char *k = json_string_value(json_object_get(jkv, "key"));
    const char *v = json_string_value(json_object_get(jkv, "value"));
    mc_meta_kv_t kv = {0};
    void *key, *val;
    int rc;

    rc = mc__etcd_b64_decode(k ? k : "", &key, &kv.key_len);
    if (rc)
        return mc__set_error(-MC_EMETA, "etcd sent a key that is not base64");
    rc = mc__etcd_b64_decode(v ? v : "", &val, &kv.value_len);
    if (rc) {
        free(key);
        return mc__set_error(-MC_EMETA, "etcd sent a value that is not base64");
    }
    kv.key = key;
    kv.value = val;
    kv.mod_revision = mc__etcd_int(jkv, "mod_revision");
    kv.lease = mc__etcd_int(jkv, "lease");
    *kv_p = kv;
    return 0;
}

/* The range [prefix, end) of every key starting with prefix: the prefix with its last byte that
 * is not 0xff raised by one and what follows dropped. A prefix of 0xff bytes only (or none) has
 * no upper bound: etcd spells that "\0". An empty prefix starts at "\0", the smallest key. */
int mc__etcd_prefix_range(const void *prefix, size_t len, char **key_p, char **end_p)
{
    unsigned char *end = malloc(len + 1);
    size_t n = len;
    char *k, *e;

    if (!end)
        return mc__set_error(-ENOMEM, "no memory for a key range");
    memcpy(end, prefix, len);
    while (n > 0 && end[n - 1] == 0xff)
        n--;
    if (n > 0)
        end[n - 1]++;
    else
        end[n++] = 0;
    k = len ? mc__etcd_b64_encode(prefix, len) : mc__etcd_b64_encode("", 1);
    e = mc__etcd_b64_encode(end, n);
    free(end);
    if (!k || !e) {
        free(k);
        free(e);
        return mc__set_error(-ENOMEM, "no memory for a key range");
    }
    *key_p = k;
    *end_p = e;
    return 0;
}

static char *fmt_i64(char buf[24], int64_t v)
{
    snprintf(buf, 24, "%" PRId64, v);
    return buf;
}

/* A request object with "key" (base64); optional value and lease. */
static json_t *req_kv(const void *key, size_t key_len, const void *val, size_t val_len,
                      int64_t lease)
{
    char *k = mc__etcd_b64_encode(key, key_len), *v = NULL, lb[24];
    json_t *req = k ? json_object() : NULL;

    if (req && json_object_set_new(req, "key", json_string(k)))
        goto err;
    if (req && val) {
        v = mc__etcd_b64_encode(val, val_len);
        if (!v || json_object_set_new(req, "value", json_string(v)))
            goto err;
    }
    if (req && lease && json_object_set_new(req, "lease", json_string(fmt_i64(lb, lease))))
        goto err;
    free(k);
    free(v);
    return req;
err:
    free(k);
    free(v);
    json_decref(req);
    return NULL;
}

static int no_memory(void)
{
    return mc__set_error(-ENOMEM, "no memory for an etcd request");
}

/* Send req (consumed; NULL when building it ran out of memory) to path. */
static int call(mc_meta_t *meta, const char *path, json_t *req, json_t **resp_p)
{
    int rc;

    if (!req)
        return no_memory();
    rc = mc__etcd_call(MC_META_ETCD(meta), path, req, resp_p);
    json_decref(req);
    return rc;
}

static int etcd_get(mc_meta_t *meta, const void *key, size_t key_len, mc_meta_kv_t *kv_p)
{
    json_t *req = req_kv(key, key_len, NULL, 0, 0), *resp = NULL;
    int rc;

    rc = call(meta, "kv/range", req, &resp);
    if (rc)
        return rc;
    json_t *kvs = json_object_get(resp, "kvs");
    if (json_array_size(kvs) == 0)
        rc = mc__set_error(-ENOENT, "metadata key %.*s not found in etcd", (int)key_len,
                           (const char *)key);
    else
        rc = mc__etcd_kv_decode(json_array_get(kvs, 0), kv_p);
    json_decref(resp);
    return rc;
}

static int etcd_put(mc_meta_t *meta, const void *key, size_t key_len, const void *val,
                    size_t val_len, int64_t lease, int64_t *revision_p)
{
    json_t *req = req_kv(key, key_len, val ? val : "", val_len, lease), *resp = NULL;
    int rc;

    rc = call(meta, "kv/put", req, &resp);
    if (rc)
        return rc;
    if (revision_p)
        *revision_p = mc__etcd_int(json_object_get(resp, "header"), "revision");
    json_decref(resp);
    return 0;
}

static int etcd_del_any(mc_meta_t *meta, const void *key, size_t key_len)
{
    json_t *req = req_kv(key, key_len, NULL, 0, 0), *resp = NULL;
    int rc;

    rc = call(meta, "kv/deleterange", req, &resp);
    if (rc)
        return rc;
    if (mc__etcd_int(resp, "deleted") == 0)
        rc = mc__set_error(-ENOENT, "metadata key %.*s not found in etcd", (int)key_len,
                           (const char *)key);
    json_decref(resp);
    return rc;
}

/* A range request (kv/range, kv/deleterange) over every key under prefix. */
static int prefix_call(mc_meta_t *meta, const char *path, const void *prefix, size_t prefix_len,
                       json_t **resp_p)
{
    json_t *req;
    char *k, *e;
    int rc = mc__etcd_prefix_range(prefix, prefix_len, &k, &e);

    if (rc)
        return rc;
    req = json_pack("{s:s, s:s}", "key", k, "range_end", e);
    free(k);
    free(e);
    return call(meta, path, req, resp_p);
}

/* The range answer's header names the revision the listing is of. */
static int etcd_list(mc_meta_t *meta, const void *prefix, size_t prefix_len, mc_meta_kv_t **kvs_p,
                     size_t *count_p, int64_t *revision_p)
{
    json_t *resp = NULL;
    int rc = prefix_call(meta, "kv/range", prefix, prefix_len, &resp);

    if (rc)
        return rc;
    json_t *arr = json_object_get(resp, "kvs");
    int64_t rev = mc__etcd_int(json_object_get(resp, "header"), "revision");
    size_t n = json_array_size(arr), i;
    mc_meta_kv_t *kvs = calloc(n ? n : 1, sizeof(*kvs));
    if (!kvs)
        rc = no_memory();
    for (i = 0; rc == 0 && i < n; i++)
        rc = mc__etcd_kv_decode(json_array_get(arr, i), &kvs[i]);
    json_decref(resp);
    if (rc) {
        mc__meta_kvs_free(kvs, i);
        return rc;
    }
    *kvs_p = kvs;
    *count_p = n;
    if (revision_p)
        *revision_p = rev;
    return 0;
}

/* A kv/txn that compares the key's mod_revision with expected and runs success (consumed)
 * if it is equal, or reads the key if not; *resp_p gets etcd's answer. */
static int etcd_txn_mod(mc_meta_t *meta, const void *key, size_t key_len, int64_t expected,
                        const char *success_op, json_t *success, json_t **resp_p)
{
    json_t *cmp = req_kv(key, key_len, NULL, 0, 0), *get = req_kv(key, key_len, NULL, 0, 0);
    json_t *req = NULL;
    char rb[24];

    if (success && cmp && get) {
        json_object_set_new(cmp, "target", json_string("MOD"));
        json_object_set_new(cmp, "result", json_string("EQUAL"));
        json_object_set_new(cmp, "mod_revision", json_string(fmt_i64(rb, expected)));
        req = json_pack("{s:[o], s:[{s:o}], s:[{s:o}]}", "compare", cmp, "success", success_op,
                        success, "failure", "request_range", get);
        success = cmp = get = NULL; /* "o" stole them, even on failure */
    }
    json_decref(success);
    json_decref(cmp);
    json_decref(get);
    return call(meta, "kv/txn", req, resp_p);
}

/* The mod_revision of the key the failure branch of etcd_txn_mod read; 0 if it is absent. */
static int64_t txn_failed_mod(json_t *resp)
{
    json_t *r =
        json_object_get(json_array_get(json_object_get(resp, "responses"), 0), "response_range");

    return mc__etcd_int(json_array_get(json_object_get(r, "kvs"), 0), "mod_revision");
}

/* Delete if the key's mod_revision is that one: -ENOENT if it is absent, -MC_ECONFLICT if it
 * was rewritten since. */
static int etcd_del(mc_meta_t *meta, const void *key, size_t key_len, int64_t mod_revision)
{
    json_t *resp = NULL;
    int64_t cur;
    int rc;

    if (mod_revision == 0)
        return etcd_del_any(meta, key, key_len);
    rc = etcd_txn_mod(meta, key, key_len, mod_revision, "request_delete_range",
                      req_kv(key, key_len, NULL, 0, 0), &resp);
    if (rc)
        return rc;
    cur = json_is_true(json_object_get(resp, "succeeded")) ? mod_revision : txn_failed_mod(resp);
    json_decref(resp);
    if (cur == 0)
        return mc__set_error(-ENOENT, "metadata key %.*s not found in etcd", (int)key_len,
                             (const char *)key);
    if (cur != mod_revision)
        return mc__set_error(-MC_ECONFLICT,
                             "delete of %.*s: mod_revision is %" PRId64 ", expected %" PRId64,
                             (int)key_len, (const char *)key, cur, mod_revision);
    return 0;
}

static int etcd_delete_prefix(mc_meta_t *meta, const void *prefix, size_t prefix_len,
                              size_t *deleted_p)
{
    json_t *resp = NULL;
    int rc = prefix_call(meta, "kv/deleterange", prefix, prefix_len, &resp);

    if (rc)
        return rc;
    *deleted_p = (size_t)mc__etcd_int(resp, "deleted");
    json_decref(resp);
    return 0;
}

/* kv/txn: if the key's mod_revision equals expected (an absent key compares as 0), put it;
 * otherwise read it, to name the revision that won in the error. */
static int etcd_cas(mc_meta_t *meta, const void *key, size_t key_len, int64_t expected,
                    const void *val, size_t val_len, int64_t lease, int64_t *revision_p)
{
    json_t *resp = NULL;
    int rc;

    rc = etcd_txn_mod(meta, key, key_len, expected, "request_put",
                      req_kv(key, key_len, val ? val : "", val_len, lease), &resp);
    if (rc)
        return rc;
    if (json_is_true(json_object_get(resp, "succeeded"))) {
        if (revision_p)
            *revision_p = mc__etcd_int(json_object_get(resp, "header"), "revision");
    } else {
        rc = mc__set_error(-MC_ECONFLICT,
                           "CAS on %.*s: mod_revision is %" PRId64 ", expected %" PRId64,
                           (int)key_len, (const char *)key, txn_failed_mod(resp), expected);
    }
    json_decref(resp);
    return rc;
}

static int lease_call(mc_meta_t *meta, const char *path, int64_t lease, json_t **resp_p)
{
    char lb[24];

    return call(meta, path, json_pack("{s:s}", "ID", fmt_i64(lb, lease)), resp_p);
}

static int etcd_lease_grant(mc_meta_t *meta, unsigned ttl_s, int64_t *lease_p)
{
    json_t *req = json_pack("{s:I}", "TTL", (json_int_t)ttl_s), *resp = NULL;
    int64_t id;
    int rc;

    rc = call(meta, "lease/grant", req, &resp);
    if (rc)
        return rc;
    id = mc__etcd_int(resp, "ID");
    json_decref(resp);
    if (id == 0)
        return mc__set_error(-MC_EMETA, "etcd granted no lease");
    *lease_p = id;
    return 0;
}

/* A keep-alive of an expired or unknown lease answers 200 without a TTL. */
static int etcd_lease_keepalive(mc_meta_t *meta, int64_t lease)
{
    json_t *resp = NULL;
    int rc = lease_call(meta, "lease/keepalive", lease, &resp);

    if (rc)
        return rc;
    if (mc__etcd_int(json_object_get(resp, "result"), "TTL") <= 0)
        rc = mc__set_error(-ENOENT, "etcd lease %" PRId64 " expired or does not exist", lease);
    json_decref(resp);
    return rc;
}

static int etcd_lease_revoke(mc_meta_t *meta, int64_t lease)
{
    json_t *resp = NULL;
    int rc = lease_call(meta, "lease/revoke", lease, &resp);

    json_decref(resp);
    return rc;
}

static void etcd_close(mc_meta_t *meta)
{
    mc_meta_etcd_t *m = MC_META_ETCD(meta);

    mc__etcd_http_fini(m);
    free(m);
}

extern const mc_meta_ops_t mc__meta_etcd_ops;

static int etcd_open(const char *rest_of_url, const mc_meta_opts_t *opts, mc_meta_t **meta_p)
{
    mc_meta_etcd_t *m = calloc(1, sizeof(*m));
    int rc;

    if (!m)
        return no_memory();
    m->base.ops = &mc__meta_etcd_ops;
    rc = mc__etcd_http_init(m, rest_of_url, opts);
    if (rc) {
        etcd_close(&m->base);
        return rc;
    }
    *meta_p = &m->base;
    return 0;
}

const mc_meta_ops_t mc__meta_etcd_ops = {
    .size = sizeof(mc_meta_ops_t),
    .version = 2,
    .scheme = "etcd",
    .open = etcd_open,
    .close = etcd_close,
    .get = etcd_get,
    .put = etcd_put,
    .del = etcd_del,
    .list = etcd_list,
    .cas = etcd_cas,
    .lease_grant = etcd_lease_grant,
    .lease_keepalive = etcd_lease_keepalive,
    .lease_revoke = etcd_lease_revoke,
    .watch_create = mc__etcd_watch_create,
    .watch_next = mc__etcd_watch_next,
    .watch_destroy = mc__etcd_watch_destroy,
    .delete_prefix = etcd_delete_prefix,
};
