/*
 * The "etcd://host:port[,host:port...]" metadata backend, internal: shared by meta_etcd.c (the
 * operations), meta_etcd_http.c (calls to etcd's v3 JSON gateway over libcurl, endpoint
 * failover, authentication, TLS) and meta_etcd_watch.c (watch streams).
 *
 * Every unary call is a POST of a JSON body to http(s)://<endpoint>/v3/<path>, bounded by
 * MC_ETCD_TIMEOUT_MS (default 3000 ms). Keys and values travel as standard base64 with padding;
 * int64 fields come back as JSON strings. Watches are long-lived chunked streams, each served by
 * its own thread (meta_etcd_watch.c).
 *
 * Configuration, read once by open from the environment:
 *   MC_ETCD_USER, MC_ETCD_PASSWORD  both or neither: authenticate with /v3/auth/authenticate and
 *                                   send the token; re-authenticate when etcd rejects it.
 *   MC_ETCD_CACERT                  CA bundle that verifies etcd's certificate; implies https.
 *   MC_ETCD_CERT, MC_ETCD_KEY       client certificate and key (both or neither); imply https.
 *   MC_ETCD_TIMEOUT_MS              bound of every unary call (default 3000, 100..600000).
 */
#ifndef MC_META_ETCD_INT_H
#define MC_META_ETCD_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <curl/curl.h>
#include <jansson.h>

#include "metadata/meta.h"

#define MC_ETCD_MAX_ENDPOINTS 16
#define MC_ETCD_POOL_MAX      8
#define MC_ETCD_CONNECT_MS    1000
/* The largest answer, or line of a watch stream, taken from a gateway (etcd's own are bounded by
 * its request limit, 1.5 MiB by default, times what a range lists): a gateway, or what poses as
 * one, that sends more does not make this process grow without end. */
#define MC_ETCD_BODY_MAX (64u << 20)

typedef struct mc_meta_etcd {
    mc_meta_t base;
    char *endpoints[MC_ETCD_MAX_ENDPOINTS]; /* "http(s)://host:port", immutable after open */
    unsigned n_endpoints;
    atomic_uint current; /* index of the endpoint that answered last */
    long timeout_ms;
    char *user, *password;        /* NULL: no authentication */
    char *cacert, *cert, *key;    /* NULL: not set */
    pthread_mutex_t lock;         /* protects token and pool */
    char *token;                  /* protected by lock; NULL until authenticated */
    unsigned token_gen;           /* protected by lock; bumped by every authentication */
    CURL *pool[MC_ETCD_POOL_MAX]; /* protected by lock: idle handles, keeping connections */
    unsigned pool_n;              /* protected by lock */
} mc_meta_etcd_t;

#define MC_META_ETCD(meta) ((mc_meta_etcd_t *)(meta))

/* base64, standard alphabet with padding. encode returns a malloc'ed NUL-terminated string (NULL
 * on no memory); decode returns 0 or -EINVAL and a malloc'ed NUL-terminated buffer. */
char *mc__etcd_b64_encode(const void *data, size_t len);
int mc__etcd_b64_decode(const char *s, void **out_p, size_t *len_p);

/* One call: POST req (not consumed) to /v3/<path>, failing over between endpoints on connection
 * errors and re-authenticating once when the token is refused. On success *resp_p holds the
 * decoded answer (json_decref it). Errors: -MC_EMETA (unreachable, protocol), -MC_ETIMEOUT,
 * -MC_EAUTH (authentication, permission, TLS), -EMSGSIZE (request too large), -ENOENT (lease
 * not found), with the reason in mc_last_error(). */
int mc__etcd_call(mc_meta_etcd_t *m, const char *path, json_t *req, json_t **resp_p);

/* Authenticate now (no-op without a user); replaces the token. */
int mc__etcd_authenticate(mc_meta_etcd_t *m);

/* Copy of the current token, or NULL (caller frees); *gen_p gets its generation. */
char *mc__etcd_token(mc_meta_etcd_t *m, unsigned *gen_p);

/* Re-authenticate unless someone did since generation gen. */
int mc__etcd_reauth(mc_meta_etcd_t *m, unsigned gen);

/* Set the TLS options of a handle (no-op for http). */
void mc__etcd_tls_setopt(mc_meta_etcd_t *m, CURL *h);

/* Read an int64 field sent as a JSON string (or number); 0 when absent. */
int64_t mc__etcd_int(json_t *obj, const char *field);

/* Fill kv from an etcd KeyValue object. */
int mc__etcd_kv_decode(json_t *jkv, mc_meta_kv_t *kv);

/* A key range for a prefix: *key_p and *end_p are base64 strings to free. */
int mc__etcd_prefix_range(const void *prefix, size_t len, char **key_p, char **end_p);

/* Open and close (meta_etcd_http.c). */
int mc__etcd_http_init(mc_meta_etcd_t *m, const char *rest_of_url, const mc_meta_opts_t *opts);
void mc__etcd_http_fini(mc_meta_etcd_t *m);

/* Watches (meta_etcd_watch.c). */
int mc__etcd_watch_create(mc_meta_t *meta, const void *prefix, size_t prefix_len,
                          int64_t start_revision, mc_meta_watch_t **watch_p);
int mc__etcd_watch_next(mc_meta_watch_t *watch, int timeout_ms, mc_meta_event_t *event_p);
void mc__etcd_watch_destroy(mc_meta_watch_t *watch);

#endif
