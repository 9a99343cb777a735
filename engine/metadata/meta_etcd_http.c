/* The etcd backend's HTTP side: configuration, a pool of curl handles, one bounded call with
 * endpoint failover and re-authentication, and the translation of curl and gRPC errors. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <mooncake/error.h>

#include "metadata/meta_etcd_int.h"
#include "util/log.h"

static const char b64_alphabet[] =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

char *mc__etcd_b64_encode(const void *data, size_t len)
{
    const unsigned char *p = data;
    char *out = malloc((len + 2) / 3 * 4 + 1), *o = out;

    if (!out)
        return NULL;
    for (size_t i = 0; i < len; i += 3) {
        unsigned v = (unsigned)p[i] << 16;
        if (i + 1 < len)
            v |= (unsigned)p[i + 1] << 8;
        if (i + 2 < len)
            v |= p[i + 2];
        *o++ = b64_alphabet[(v >> 18) & 63];
        *o++ = b64_alphabet[(v >> 12) & 63];
        *o++ = i + 1 < len ? b64_alphabet[(v >> 6) & 63] : '=';
        *o++ = i + 2 < len ? b64_alphabet[v & 63] : '=';
    }
    *o = '\0';
    return out;
}

static int b64_val(char c)
{
    const char *p = c ? strchr(b64_alphabet, c) : NULL;

    return p ? (int)(p - b64_alphabet) : -1;
}

int mc__etcd_b64_decode(const char *s, void **out_p, size_t *len_p)
{
    size_t n = strlen(s), len = 0;
    unsigned char *out;

    if (n % 4)
        return -EINVAL;
    out = malloc(n / 4 * 3 + 1);
    if (!out)
        return -ENOMEM;
    for (size_t i = 0; i < n; i += 4) {
        int a = b64_val(s[i]), b = b64_val(s[i + 1]);
        int c = s[i + 2] == '=' ? 0 : b64_val(s[i + 2]);
        int d = s[i + 3] == '=' ? 0 : b64_val(s[i + 3]);
        bool pad = s[i + 2] == '=' || s[i + 3] == '=';
        if (a < 0 || b < 0 || c < 0 || d < 0 || (pad && i + 4 != n) ||
            (s[i + 2] == '=' && s[i + 3] != '=')) {
            free(out);
            return -EINVAL;
        }
        unsigned v = (unsigned)a << 18 | (unsigned)b << 12 | (unsigned)c << 6 | (unsigned)d;
        out[len++] = (unsigned char)(v >> 16);
        if (s[i + 2] != '=')
            out[len++] = (unsigned char)(v >> 8);
        if (s[i + 3] != '=')
            out[len++] = (unsigned char)v;
    }
    out[len] = '\0';
    *out_p = out;
    *len_p = len;
    return 0;
}

int64_t mc__etcd_int(json_t *obj, const char *field)
{
    json_t *v = obj ? json_object_get(obj, field) : NULL;

    if (json_is_string(v))
        return strtoll(json_string_value(v), NULL, 10);
    if (json_is_integer(v))
        return (int64_t)json_integer_value(v);
    return 0;
}

/* ---- configuration ---------------------------------------------------------------------- */

/* The option's value (the environment variable's when opts is NULL), copied; NULL if empty. */
static int opt_copy(const char *opt, const char *name, char **out_p)
{
    const char *v = opt ? opt : getenv(name);

    *out_p = NULL;
    if (!v || !*v)
        return 0;
    *out_p = strdup(v);
    return *out_p ? 0 : mc__set_error(-ENOMEM, "no memory for %s", name);
}

static int opt_file(const char *opt, const char *name, char **out_p)
{
    int rc = opt_copy(opt, name, out_p);

    if (rc == 0 && *out_p && access(*out_p, R_OK) != 0)
        return mc__set_error(-MC_ECONFIG, "%s=%s: cannot read the file: %s", name, *out_p,
                             strerror(errno));
    return rc;
}

static int etcd_config(mc_meta_etcd_t *m, const mc_meta_opts_t *o)
{
    static const mc_meta_opts_t none;
    const char *t = o ? NULL : getenv("MC_ETCD_TIMEOUT_MS");
    int rc;

    m->timeout_ms = o && o->timeout_ms ? o->timeout_ms : 3000;
    if (t && *t) {
        char *end;
        long v = strtol(t, &end, 10);
        if (*end || v < 100 || v > 600000)
            return mc__set_error(-MC_ECONFIG, "MC_ETCD_TIMEOUT_MS=%s: want 100..600000", t);
        m->timeout_ms = v;
    }
    if (!o)
        o = &none; /* every field NULL: from the environment */
    if ((rc = opt_copy(o->user, "MC_ETCD_USER", &m->user)) ||
        (rc = opt_copy(o->password, "MC_ETCD_PASSWORD", &m->password)))
        return rc;
    if (!m->user != !m->password)
        return mc__set_error(-MC_ECONFIG, "%s is set but %s is not: set both or neither",
                             m->user ? "MC_ETCD_USER" : "MC_ETCD_PASSWORD",
                             m->user ? "MC_ETCD_PASSWORD" : "MC_ETCD_USER");
    if ((rc = opt_file(o->cacert, "MC_ETCD_CACERT", &m->cacert)) ||
        (rc = opt_file(o->cert, "MC_ETCD_CERT", &m->cert)) ||
        (rc = opt_file(o->key, "MC_ETCD_KEY", &m->key)))
        return rc;
    if (!m->cert != !m->key)
        return mc__set_error(-MC_ECONFIG, "%s is set but %s is not: set both or neither",
                             m->cert ? "MC_ETCD_CERT" : "MC_ETCD_KEY",
                             m->cert ? "MC_ETCD_KEY" : "MC_ETCD_CERT");
    return 0;
}

/* "host:port[,host:port...]", an optional trailing '/' accepted. */
static int etcd_parse_endpoints(mc_meta_etcd_t *m, const char *rest)
{
    const char *scheme = m->cacert || m->cert ? "https" : "http";
    const char *p = rest;

    while (*p && *p != '/') {
        size_t n = strcspn(p, ",/");
        const char *colon = memchr(p, ':', n);
        if (n == 0 || !colon || colon == p || colon + 1 == p + n)
            return mc__set_error(-EINVAL, "metadata URL etcd://%s: want host:port[,host:port...]",
                                 rest);
        if (m->n_endpoints == MC_ETCD_MAX_ENDPOINTS)
            return mc__set_error(-EINVAL, "metadata URL etcd://%s: more than %d endpoints", rest,
                                 MC_ETCD_MAX_ENDPOINTS);
        char *ep = malloc(n + 16);
        if (!ep)
            return mc__set_error(-ENOMEM, "no memory for an etcd endpoint");
        snprintf(ep, n + 16, "%s://%.*s", scheme, (int)n, p);
        m->endpoints[m->n_endpoints++] = ep;
        p += n;
        if (*p == ',')
            p++;
    }
    if (m->n_endpoints == 0 || (*p == '/' && p[1]))
        return mc__set_error(-EINVAL, "metadata URL etcd://%s: want host:port[,host:port...]",
                             rest);
    return 0;
}

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static CURLcode curl_init_rc;

static void curl_init(void)
{
    curl_init_rc = curl_global_init(CURL_GLOBAL_ALL);
}

int mc__etcd_http_init(mc_meta_etcd_t *m, const char *rest_of_url, const mc_meta_opts_t *opts)
{
    int rc;

    pthread_mutex_init(&m->lock, NULL); /* first: fini destroys it whatever failed */
    pthread_once(&curl_once, curl_init);
    if (curl_init_rc != CURLE_OK)
        return mc__set_error(-MC_EMETA, "curl_global_init: %s", curl_easy_strerror(curl_init_rc));
    rc = etcd_config(m, opts);
    if (rc == 0)
        rc = etcd_parse_endpoints(m, rest_of_url);
    if (rc == 0)
        rc = mc__etcd_authenticate(m);
    return rc;
}

void mc__etcd_http_fini(mc_meta_etcd_t *m)
{
    for (unsigned i = 0; i < m->pool_n; i++)
        curl_easy_cleanup(m->pool[i]);
    for (unsigned i = 0; i < m->n_endpoints; i++)
        free(m->endpoints[i]);
    free(m->token);
    free(m->user);
    free(m->password);
    free(m->cacert);
    free(m->cert);
    free(m->key);
    pthread_mutex_destroy(&m->lock);
}

/* ---- handles and one HTTP exchange ------------------------------------------------------- */

static CURL *handle_get(mc_meta_etcd_t *m)
{
    CURL *h = NULL;

    pthread_mutex_lock(&m->lock);
    if (m->pool_n)
        h = m->pool[--m->pool_n];
    pthread_mutex_unlock(&m->lock);
    if (h)
        curl_easy_reset(h); /* keeps its live connection */
    else
        h = curl_easy_init();
    return h;
}

static void handle_put(mc_meta_etcd_t *m, CURL *h)
{
    pthread_mutex_lock(&m->lock);
    if (m->pool_n < MC_ETCD_POOL_MAX) {
        m->pool[m->pool_n++] = h;
        h = NULL;
    }
    pthread_mutex_unlock(&m->lock);
    if (h)
        curl_easy_cleanup(h);
}

void mc__etcd_tls_setopt(mc_meta_etcd_t *m, CURL *h)
{
    if (m->cacert)
        curl_easy_setopt(h, CURLOPT_CAINFO, m->cacert);
    if (m->cert) {
        curl_easy_setopt(h, CURLOPT_SSLCERT, m->cert);
        curl_easy_setopt(h, CURLOPT_SSLKEY, m->key);
    }
}

char *mc__etcd_token(mc_meta_etcd_t *m, unsigned *gen_p)
{
    char *t;

    pthread_mutex_lock(&m->lock);
    t = m->token ? strdup(m->token) : NULL;
    *gen_p = m->token_gen;
    pthread_mutex_unlock(&m->lock);
    return t;
}

typedef struct http_buf {
    char *data;
    size_t len, cap;
    bool too_big; /* more than MC_ETCD_BODY_MAX came: the transfer was ended */
} http_buf_t;

static size_t http_write_cb(char *ptr, size_t size, size_t nmemb, void *arg)
{
    http_buf_t *b = arg;
    size_t n = size * nmemb;

    if (n > MC_ETCD_BODY_MAX - b->len) {
        b->too_big = true;
        return 0; /* ends the transfer (CURLE_WRITE_ERROR) */
    }
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 4096;
        while (cap < b->len + n + 1)
            cap *= 2;
        char *d = realloc(b->data, cap);
        if (!d)
            return 0;
        b->data = d;
        b->cap = cap;
    }
    memcpy(b->data + b->len, ptr, n);
    b->len += n;
    b->data[b->len] = '\0';
    return n;
}

/* A curl failure that another endpoint may not have: the server is unreachable or went away. */
static bool curl_is_connection_error(CURLcode c)
{
    return c == CURLE_COULDNT_CONNECT || c == CURLE_COULDNT_RESOLVE_HOST ||
           c == CURLE_GOT_NOTHING || c == CURLE_SEND_ERROR || c == CURLE_RECV_ERROR ||
           c == CURLE_OPERATION_TIMEDOUT || c == CURLE_PARTIAL_FILE;
}

/* The one place where curl codes become ours. */
static int curl_error(mc_meta_etcd_t *m, const char *url, CURLcode c, const char *detail)
{
    const char *why = *detail ? detail : curl_easy_strerror(c);

    switch (c) {
    case CURLE_OPERATION_TIMEDOUT:
        return mc__set_error(-MC_ETIMEOUT, "etcd %s: no answer within %ld ms (%s)", url,
                             m->timeout_ms, why);
    case CURLE_PEER_FAILED_VERIFICATION:
    case CURLE_SSL_CACERT_BADFILE:
    case CURLE_SSL_CONNECT_ERROR:
    case CURLE_SSL_CERTPROBLEM:
    case CURLE_USE_SSL_FAILED:
        return mc__set_error(-MC_EAUTH,
                             "etcd %s: TLS handshake failed: %s (check MC_ETCD_CACERT, "
                             "MC_ETCD_CERT, MC_ETCD_KEY)",
                             url, why);
    default:
        return mc__set_error(-MC_EMETA, "etcd %s: %s", url, why);
    }
}

/* The one place where etcd's gRPC error codes become ours. */
static int grpc_error(const char *url, long http, json_t *body)
{
    json_t *err = json_object_get(body, "error");
    const char *msg = json_string_value(json_object_get(body, "message"));
    int code = (int)json_integer_value(json_object_get(body, "code"));

    if (json_is_object(err)) { /* a stream error: {"error":{"grpc_code":..,"message":..}} */
        msg = json_string_value(json_object_get(err, "message"));
        code = (int)json_integer_value(json_object_get(err, "grpc_code"));
    }
    if (!msg)
        msg = "(no message)";
    if (code == 16 || code == 7 || http == 401 || http == 403 ||
        strstr(msg, "authentication failed") || strstr(msg, "invalid auth token") ||
        strstr(msg, "user name is empty") || strstr(msg, "permission denied"))
        return mc__set_error(-MC_EAUTH, "etcd %s: %s (check MC_ETCD_USER, MC_ETCD_PASSWORD)", url,
                             msg);
    if (strstr(msg, "too many requests") || strstr(msg, "space exceeded")) /* (also code 8) */
        return mc__set_error(-EAGAIN, "etcd %s: %s", url, msg);
    if (strstr(msg, "too large") || code == 8)
        return mc__set_error(-EMSGSIZE,
                             "etcd %s: %s (etcd's --max-request-bytes, 1.5 MiB by "
                             "default, bounds a key plus its value)",
                             url, msg);
    if (code == 5 || strstr(msg, "not found"))
        return mc__set_error(-ENOENT, "etcd %s: %s", url, msg);
    return mc__set_error(-MC_EMETA, "etcd %s: HTTP %ld, gRPC code %d: %s", url, http, code, msg);
}

/* One exchange with one endpoint. Returns 0 with *resp_p, or an error; *conn_err_p says if
 * another endpoint is worth a try, *auth_err_p if the token was refused. */
static int http_post(mc_meta_etcd_t *m, unsigned ep, const char *path, const char *body,
                     const char *token, json_t **resp_p, bool *conn_err_p, bool *auth_err_p)
{
    char url[512], auth[1024], errbuf[CURL_ERROR_SIZE] = "";
    struct curl_slist *hdrs = NULL;
    http_buf_t b = {0};
    long http = 0;
    json_error_t jerr;
    CURL *h = handle_get(m);
    int rc;

    *conn_err_p = *auth_err_p = false;
    if (!h)
        return mc__set_error(-ENOMEM, "curl_easy_init failed");
    snprintf(url, sizeof(url), "%s/v3/%s", m->endpoints[ep], path);
    hdrs = curl_slist_append(hdrs, "Content-Type: application/json");
    hdrs = curl_slist_append(hdrs, "Expect:");
    if (token) {
        snprintf(auth, sizeof(auth), "Authorization: %s", token);
        hdrs = curl_slist_append(hdrs, auth);
    }
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdrs);
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)strlen(body));
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, (long)MC_ETCD_CONNECT_MS);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, m->timeout_ms);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, http_write_cb);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &b);
    curl_easy_setopt(h, CURLOPT_ERRORBUFFER, errbuf);
    mc__etcd_tls_setopt(m, h);
    CURLcode c = curl_easy_perform(h);
    curl_easy_setopt(h, CURLOPT_ERRORBUFFER, NULL);
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &http);
    curl_slist_free_all(hdrs);
    if (c != CURLE_OK) {
        *conn_err_p = curl_is_connection_error(c);
        rc = b.too_big ? mc__set_error(-MC_EMETA, "etcd %s: an answer of more than %u MiB: refused",
                                       url, MC_ETCD_BODY_MAX >> 20)
                       : curl_error(m, url, c, errbuf);
        curl_easy_cleanup(h); /* its connection may be half-dead */
        free(b.data);
        return rc;
    }
    handle_put(m, h);
    json_t *resp = b.data ? json_loadb(b.data, b.len, 0, &jerr) : NULL;
    free(b.data);
    if (!json_is_object(resp)) {
        json_decref(resp);
        *conn_err_p = http >= 500; /* e.g. a proxy in front of a dead etcd */
        return mc__set_error(-MC_EMETA, "etcd %s: HTTP %ld with a body that is not a JSON object",
                             url, http);
    }
    if (http == 200 && !json_object_get(resp, "error")) {
        *resp_p = resp;
        return 0;
    }
    rc = grpc_error(url, http, resp);
    json_decref(resp);
    *auth_err_p = rc == -MC_EAUTH && strstr(mc_last_error(), "invalid auth token");
    /* gRPC Unavailable (14): this member lost its leader or is stopping. */
    *conn_err_p = http == 503 || strstr(mc_last_error(), "gRPC code 14:") != NULL;
    return rc;
}

/* Try each endpoint once, starting with the one that answered last. */
static int call_once(mc_meta_etcd_t *m, const char *path, const char *body, const char *token,
                     json_t **resp_p, bool *auth_err_p)
{
    unsigned start = atomic_load(&m->current), n = m->n_endpoints;
    bool conn_err = false;
    int rc = -MC_EMETA;

    for (unsigned i = 0; i < n; i++) {
        unsigned ep = (start + i) % n;
        rc = http_post(m, ep, path, body, token, resp_p, &conn_err, auth_err_p);
        if (!conn_err) {
            if (rc == 0 && ep != start)
                atomic_store(&m->current, ep);
            return rc;
        }
        if (n > 1)
            mc_debug("etcd: %s, trying the next endpoint", mc_last_error());
    }
    return rc;
}

int mc__etcd_reauth(mc_meta_etcd_t *m, unsigned gen)
{
    unsigned cur;
    char *t = mc__etcd_token(m, &cur);

    free(t);
    return cur != gen ? 0 : mc__etcd_authenticate(m);
}

int mc__etcd_call(mc_meta_etcd_t *m, const char *path, json_t *req, json_t **resp_p)
{
    char *body = json_dumps(req, JSON_COMPACT);
    unsigned gen;
    bool auth_err;
    int rc;

    if (!body)
        return mc__set_error(-ENOMEM, "no memory for an etcd request");
    char *token = mc__etcd_token(m, &gen);
    rc = call_once(m, path, body, token, resp_p, &auth_err);
    free(token);
    if (rc == -MC_EAUTH && auth_err && m->user) {
        /* Simple tokens expire (--auth-token-ttl) and die with a restart: get a new one. */
        mc_debug("etcd: token refused, authenticating again");
        rc = mc__etcd_reauth(m, gen);
        if (rc == 0) {
            token = mc__etcd_token(m, &gen);
            rc = call_once(m, path, body, token, resp_p, &auth_err);
            free(token);
        }
    }
    free(body);
    return rc;
}

int mc__etcd_authenticate(mc_meta_etcd_t *m)
{
    json_t *req, *resp = NULL;
    char *body;
    bool auth_err;
    int rc;

    if (!m->user)
        return 0;
    req = json_pack("{s:s, s:s}", "name", m->user, "password", m->password);
    body = req ? json_dumps(req, JSON_COMPACT) : NULL;
    json_decref(req);
    if (!body)
        return mc__set_error(-ENOMEM, "no memory for an etcd request");
    rc = call_once(m, "auth/authenticate", body, NULL, &resp, &auth_err);
    free(body);
    if (rc == -MC_EAUTH || (rc == -MC_EMETA && strstr(mc_last_error(), "authentication")))
        return mc__set_error(-MC_EAUTH, "etcd: authenticating as MC_ETCD_USER=%s failed: %s",
                             m->user, mc_last_error());
    if (rc)
        return rc;
    const char *tok = json_string_value(json_object_get(resp, "token"));
    char *copy = tok ? strdup(tok) : NULL;
    json_decref(resp);
    if (!copy)
        return mc__set_error(-MC_EMETA, "etcd: authenticate answered without a token");
    pthread_mutex_lock(&m->lock);
    free(m->token);
    m->token = copy;
    m->token_gen++;
    pthread_mutex_unlock(&m->lock);
    return 0;
}
