/*
 * Metadata interface (internal to the engine and the P2P store).
 *
 * A small key-value store with revisions, leases and watches. Backends: "file://DIR" (embedded,
 * single machine, the default) and "etcd://host:port[,host:port]". Keys are byte strings
 * (binary allowed, given with an explicit length); values are byte strings (JSON by convention).
 *
 * Revisions: every successful put/delete raises the store's revision by one; a key's mod_revision
 * is the revision of its last put. Compare-and-swap compares a key's mod_revision (0 = the key
 * must not exist).
 *
 * Leases: a key put with a lease disappears when the lease expires (not kept alive) or is revoked.
 *
 * Thread safety: one mc_meta_t may be used from several threads at once.
 */
#ifndef MC_META_H
#define MC_META_H

#include <stddef.h>
#include <stdint.h>

/* The public types (mc_meta_t, mc_meta_watch_t, mc_meta_kv_t, mc_meta_event_t) and the public
 * functions (mc_meta_*, wrappers over these) are in <mooncake/meta.h>. */
#include <mooncake/meta.h>

/* How to reach the service (etcd only): credentials, TLS files and the bound of every call but
 * watches. Empty strings and 0 mean "none" and the default (3000 ms). */
typedef struct mc_meta_opts {
    const char *user, *password; /* both or neither */
    const char *cacert;          /* switches to https */
    const char *cert, *key;      /* client certificate: both or neither */
    unsigned timeout_ms;
} mc_meta_opts_t;

/* Backend operations. Starts with size and version; new entries go at the end only, and callers
 * probe them with MC_META_HAS. Version 2: list reports the store revision, del takes the
 * mod_revision to compare, delete_prefix added. */
typedef struct mc_meta_ops {
    size_t size;
    unsigned version;
    const char *scheme; /* "file", "etcd" */
    int (*open)(const char *rest_of_url, const mc_meta_opts_t *opts, mc_meta_t **meta_p);
    void (*close)(mc_meta_t *meta);
    int (*get)(mc_meta_t *meta, const void *key, size_t key_len, mc_meta_kv_t *kv_p);
    int (*put)(mc_meta_t *meta, const void *key, size_t key_len, const void *val, size_t val_len,
               int64_t lease, int64_t *revision_p);
    /* mod_revision 0: unconditionally; otherwise only if the key's is that one. */
    int (*del)(mc_meta_t *meta, const void *key, size_t key_len, int64_t mod_revision);
    /* *revision_p (may be NULL): the store revision the listing reflects. */
    int (*list)(mc_meta_t *meta, const void *prefix, size_t prefix_len, mc_meta_kv_t **kvs_p,
                size_t *count_p, int64_t *revision_p);
    int (*cas)(mc_meta_t *meta, const void *key, size_t key_len, int64_t expected_mod_revision,
               const void *val, size_t val_len, int64_t lease, int64_t *revision_p);
    int (*lease_grant)(mc_meta_t *meta, unsigned ttl_s, int64_t *lease_p);
    int (*lease_keepalive)(mc_meta_t *meta, int64_t lease);
    int (*lease_revoke)(mc_meta_t *meta, int64_t lease);
    int (*watch_create)(mc_meta_t *meta, const void *prefix, size_t prefix_len,
                        int64_t start_revision, mc_meta_watch_t **watch_p);
    int (*watch_next)(mc_meta_watch_t *watch, int timeout_ms, mc_meta_event_t *event_p);
    void (*watch_destroy)(mc_meta_watch_t *watch);
    /* Delete every key under a non-empty prefix; *deleted_p gets how many. */
    int (*delete_prefix)(mc_meta_t *meta, const void *prefix, size_t prefix_len, size_t *deleted_p);
} mc_meta_ops_t;

/* Whether a backend's table has the entry field (set and inside the size it declares). */
#define MC_META_HAS(ops, field)                                                                    \
    ((ops)->size >= offsetof(mc_meta_ops_t, field) + sizeof((ops)->field) && (ops)->field)

/* Every backend object starts with this. */
struct mc_meta {
    const mc_meta_ops_t *ops;
};

/* Every backend watch starts with this, so that mc__meta_watch_next() can find the ops. */
struct mc_meta_watch {
    mc_meta_t *meta;
};

/* Open a backend from a URL ("file:///dir", "etcd://127.0.0.1:2379"); opts NULL: read them from
 * MC_ETCD_USER, MC_ETCD_PASSWORD, MC_ETCD_CACERT, MC_ETCD_CERT, MC_ETCD_KEY and
 * MC_ETCD_TIMEOUT_MS. Errors: -EINVAL for an unknown scheme or a malformed URL (reason in
 * mc_last_error()), -MC_ECONFIG for bad options (naming the setting), backend errors otherwise. */
int mc__meta_open(const char *url, const mc_meta_opts_t *opts, mc_meta_t **meta_p);
void mc__meta_close(mc_meta_t *meta);
/* The store config's METADATA names, with its ETCD_* settings. */
int mc__meta_open_config(const mc_config_t *config, mc_meta_t **meta_p);

/* Get one key. -ENOENT if absent (or its lease expired). Free with mc__meta_kv_free(). */
int mc__meta_get(mc_meta_t *meta, const void *key, size_t key_len, mc_meta_kv_t *kv_p);

/* Put a key (lease 0 = none). *revision_p (may be NULL) gets the new store revision. */
int mc__meta_put(mc_meta_t *meta, const void *key, size_t key_len, const void *val, size_t val_len,
                 int64_t lease, int64_t *revision_p);

/* Delete a key, whatever its mod_revision. -ENOENT if absent. (mc_meta_delete compares it.) */
int mc__meta_del(mc_meta_t *meta, const void *key, size_t key_len);

/* All keys starting with prefix (empty prefix = every key), sorted by key bytes. Free with
 * mc__meta_kvs_free(). (mc_meta_list also reports the store revision of the listing.) */
int mc__meta_list(mc_meta_t *meta, const void *prefix, size_t prefix_len, mc_meta_kv_t **kvs_p,
                  size_t *count_p);

/* Put only if the key's mod_revision equals expected (0 = key absent). -MC_ECONFLICT if not. */
int mc__meta_cas(mc_meta_t *meta, const void *key, size_t key_len, int64_t expected_mod_revision,
                 const void *val, size_t val_len, int64_t lease, int64_t *revision_p);

/* Leases: grant with a TTL in seconds (>= 1), keep alive (-ENOENT once expired), revoke
 * (deletes its keys). */
int mc__meta_lease_grant(mc_meta_t *meta, unsigned ttl_s, int64_t *lease_p);
int mc__meta_lease_keepalive(mc_meta_t *meta, int64_t lease);
int mc__meta_lease_revoke(mc_meta_t *meta, int64_t lease);

/* Watch keys under prefix from start_revision (0 = from now). watch_next waits up to
 * timeout_ms (-1 = forever) for the next event: 0 and *event_p filled (free its kv with
 * mc__meta_kv_free), or -ETIMEDOUT. Events of one key arrive in revision order. */
int mc__meta_watch_create(mc_meta_t *meta, const void *prefix, size_t prefix_len,
                          int64_t start_revision, mc_meta_watch_t **watch_p);
int mc__meta_watch_next(mc_meta_watch_t *watch, int timeout_ms, mc_meta_event_t *event_p);
void mc__meta_watch_destroy(mc_meta_watch_t *watch);

void mc__meta_kv_free(mc_meta_kv_t *kv);
void mc__meta_kvs_free(mc_meta_kv_t *kvs, size_t count);

/* Build "mooncake/[cluster/]<kind>/<name>" into buf (NUL-terminated). Returns its length, or
 * -ENAMETOOLONG. */
int mc__meta_key(char *buf, size_t size, const char *cluster_id, const char *kind,
                 const char *name);

#endif
