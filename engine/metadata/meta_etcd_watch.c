/*
 * etcd watches. Each watch owns a thread that holds one /v3/watch stream open with a curl multi
 * handle (so that destroy can wake it), splits the chunked answer on '\n', parses each line as
 * it completes and queues the events for watch_next.
 *
 * The thread remembers the revision after the last event it queued. Whatever ends a stream (the
 * server stopping cleanly, which curl reports as success; a killed server; a refused token; a
 * network error) it opens a new one from that revision on, trying the next endpoint after a
 * connection error and backing off up to 1 s while etcd is away, so no event is lost or repeated.
 * When etcd has compacted that revision away, the thread lists the prefix instead, queues a
 * DELETE for every key it knew that the listing lacks and a PUT for every key listed, and
 * watches on from the revision of the listing. The keys it knows are those under the prefix at
 * the start revision (listed, keys only, before the first stream) and those its events put
 * since; a start revision already compacted when the watch starts (or a listing that failed
 * WATCH_SEED_TRIES times) leaves it knowing only what it hears from then on (deletions before
 * that, as the file:// backend's beyond its log, are not reported). Listings are plain calls,
 * bounded by MC_ETCD_TIMEOUT_MS per endpoint: a destroy waits for one under way. The queue is
 * not bounded: a consumer that never calls watch_next keeps the events in memory.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <mooncake/error.h>

#include "metadata/meta_etcd_int.h"
#include "util/log.h"

#define WATCH_BACKOFF_MIN_MS 50
#define WATCH_BACKOFF_MAX_MS 1000
#define WATCH_SEED_TRIES     3 /* listings of the start revision's keys before it opens without */

typedef struct watch_node {
    struct watch_node *next;
    mc_meta_event_t ev;
} watch_node_t;

/* A key the watch knows to be there. */
typedef struct known_key {
    char *key;
    size_t len;
} known_key_t;

typedef struct etcd_watch {
    mc_meta_watch_t base;
    mc_meta_etcd_t *m;
    char *key_b64, *end_b64; /* the watched range, immutable */
    CURLM *multi;            /* used by the thread; curl_multi_wakeup from destroy */
    pthread_t tid;
    atomic_bool stop;
    pthread_mutex_t lock;
    pthread_cond_t cond;        /* signaled on a new event or on stop */
    watch_node_t *head, **tail; /* protected by lock */
    /* Stream state, touched by the watch thread only. */
    int64_t next_rev;
    char *line;
    size_t line_len, line_cap;
    bool created, compacted, auth_err;
    bool seed_tried; /* the keys at the start revision were listed, or cannot be */
    bool seeded;     /* known holds every key there (since the start revision or a listing) */
    unsigned seed_failures;
    known_key_t *known; /* sorted by key bytes */
    size_t n_known, cap_known;
} etcd_watch_t;

static int key_cmp(const char *a, size_t a_len, const char *b, size_t b_len)
{
    int c = memcmp(a, b, a_len < b_len ? a_len : b_len);

    return c ? c : (a_len > b_len) - (a_len < b_len);
}

/* Where key is in w->known, or would go (*found false). */
static size_t known_find(const etcd_watch_t *w, const char *key, size_t len, bool *found)
{
    size_t lo = 0, hi = w->n_known;

    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = key_cmp(w->known[mid].key, w->known[mid].len, key, len);
        if (c == 0) {
            *found = true;
            return mid;
        }
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    *found = false;
    return lo;
}

/* A key that is there now (false: no memory, so deletions may go unreported after a
 * compaction). */
static bool known_put(etcd_watch_t *w, const char *key, size_t len)
{
    bool found;
    size_t at = known_find(w, key, len, &found);
    char *copy;

    if (found)
        return true;
    if (w->n_known == w->cap_known) {
        size_t cap = w->cap_known ? 2 * w->cap_known : 64;
        known_key_t *v = realloc(w->known, cap * sizeof(*v));
        if (!v)
            return false;
        w->known = v;
        w->cap_known = cap;
    }
    if (!(copy = malloc(len ? len : 1)))
        return false;
    memcpy(copy, key, len);
    memmove(&w->known[at + 1], &w->known[at], (w->n_known - at) * sizeof(*w->known));
    w->known[at] = (known_key_t){.key = copy, .len = len};
    w->n_known++;
    return true;
}

static void known_del(etcd_watch_t *w, const char *key, size_t len)
{
    bool found;
    size_t at = known_find(w, key, len, &found);

    if (!found)
        return;
    free(w->known[at].key);
    memmove(&w->known[at], &w->known[at + 1], (w->n_known - at - 1) * sizeof(*w->known));
    w->n_known--;
}

static void known_clear(etcd_watch_t *w)
{
    for (size_t i = 0; i < w->n_known; i++)
        free(w->known[i].key);
    w->n_known = 0;
}

static void watch_node_free(watch_node_t *n)
{
    mc__meta_kv_free(&n->ev.kv);
    free(n);
}

static void watch_enqueue(etcd_watch_t *w, watch_node_t *n)
{
    pthread_mutex_lock(&w->lock);
    *w->tail = n;
    w->tail = &n->next;
    pthread_cond_broadcast(&w->cond);
    pthread_mutex_unlock(&w->lock);
}

static void watch_queue_kv(etcd_watch_t *w, mc_meta_event_type_t type, json_t *jkv)
{
    watch_node_t *n = calloc(1, sizeof(*n));

    if (!n || mc__etcd_kv_decode(jkv, &n->ev.kv)) {
        mc_warn("etcd watch: dropped an event: %s", n ? mc_last_error() : "no memory");
        free(n);
        return;
    }
    n->ev.type = type;
    if (n->ev.kv.mod_revision >= w->next_rev)
        w->next_rev = n->ev.kv.mod_revision + 1;
    if (type == MC_META_DELETE)
        known_del(w, n->ev.kv.key, n->ev.kv.key_len);
    else if (!known_put(w, n->ev.kv.key, n->ev.kv.key_len) && w->seeded) {
        mc_warn("etcd watch: no memory to remember a key: a compaction may hide its deletion");
        w->seeded = false;
    }
    watch_enqueue(w, n);
}

/* One complete line of the stream. Returns false to end the stream. */
static bool watch_line(etcd_watch_t *w, const char *s, size_t len)
{
    json_error_t jerr;
    json_t *j = json_loadb(s, len, 0, &jerr), *res, *err;
    bool go_on = true;

    if (!j) {
        mc_warn("etcd watch: unparsable line: %s", jerr.text);
        return false;
    }
    err = json_object_get(j, "error");
    res = json_object_get(j, "result");
    if (err) {
        const char *msg =
            json_string_value(json_object_get(json_is_object(err) ? err : j, "message"));
        int code = (int)mc__etcd_int(json_is_object(err) ? err : j,
                                     json_is_object(err) ? "grpc_code" : "code");
        mc_debug("etcd watch: stream error %d: %s", code, msg ? msg : "?");
        w->auth_err = code == 16 || (msg && strstr(msg, "auth token"));
        go_on = false;
    } else if (json_is_object(res)) {
        if (json_is_true(json_object_get(res, "created")))
            w->created = true;
        json_t *evs = json_object_get(res, "events"), *ev;
        size_t i;
        json_array_foreach(evs, i, ev)
        {
            const char *t = json_string_value(json_object_get(ev, "type"));
            watch_queue_kv(w, t && !strcmp(t, "DELETE") ? MC_META_DELETE : MC_META_PUT,
                           json_object_get(ev, "kv"));
        }
        if (json_is_true(json_object_get(res, "canceled"))) {
            w->compacted = mc__etcd_int(res, "compact_revision") > 0;
            go_on = false;
        }
    }
    json_decref(j);
    return go_on;
}

static size_t watch_write_cb(char *ptr, size_t size, size_t nmemb, void *arg)
{
    etcd_watch_t *w = arg;
    size_t n = size * nmemb;

    if (n > MC_ETCD_BODY_MAX - w->line_len) {
        mc_warn("etcd watch: a line of more than %u MiB: the stream starts again",
                MC_ETCD_BODY_MAX >> 20);
        w->line_len = 0;
        return 0; /* ends the transfer */
    }
    if (w->line_len + n > w->line_cap) {
        size_t cap = w->line_cap ? w->line_cap : 4096;
        while (cap < w->line_len + n)
            cap *= 2;
        char *p = realloc(w->line, cap);
        if (!p)
            return 0;
        w->line = p;
        w->line_cap = cap;
    }
    memcpy(w->line + w->line_len, ptr, n);
    w->line_len += n;
    /* A single event may span many callbacks: consume complete lines only. */
    size_t start = 0;
    char *nl;
    while ((nl = memchr(w->line + start, '\n', w->line_len - start)) != NULL) {
        size_t len = (size_t)(nl - (w->line + start));
        bool go_on = len == 0 || watch_line(w, w->line + start, len);
        start += len + 1;
        if (!go_on || atomic_load(&w->stop)) {
            w->line_len = 0;
            return 0; /* ends the transfer */
        }
    }
    memmove(w->line, w->line + start, w->line_len - start);
    w->line_len -= start;
    return n;
}

static char *watch_body(etcd_watch_t *w)
{
    char rb[24];
    json_t *req;
    char *body;

    snprintf(rb, sizeof(rb), "%" PRId64, w->next_rev);
    req = json_pack("{s:{s:s, s:s, s:s}}", "create_request", "key", w->key_b64, "range_end",
                    w->end_b64, "start_revision", rb);
    body = req ? json_dumps(req, JSON_COMPACT) : NULL;
    json_decref(req);
    return body;
}

/* One stream, until it ends or the watch stops. Returns its curl result. */
static CURLcode watch_stream(etcd_watch_t *w, unsigned ep)
{
    char url[512], auth[1024];
    struct curl_slist *hdrs = NULL;
    CURLcode res = CURLE_OUT_OF_MEMORY;
    char *body = watch_body(w), *token;
    unsigned gen;
    CURL *h = body ? curl_easy_init() : NULL;
    int running = 1;

    if (!h) {
        free(body);
        return res;
    }
    snprintf(url, sizeof(url), "%s/v3/watch", w->m->endpoints[ep]);
    hdrs = curl_slist_append(hdrs, "Content-Type: application/json");
    token = mc__etcd_token(w->m, &gen);
    if (token) {
        snprintf(auth, sizeof(auth), "Authorization: %s", token);
        hdrs = curl_slist_append(hdrs, auth);
        free(token);
    }
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdrs);
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    /* No total timeout on a stream: a dead peer is found by TCP keep-alive. */
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, (long)MC_ETCD_CONNECT_MS);
    curl_easy_setopt(h, CURLOPT_TCP_KEEPALIVE, 1L);
    curl_easy_setopt(h, CURLOPT_TCP_KEEPIDLE, 5L);
    curl_easy_setopt(h, CURLOPT_TCP_KEEPINTVL, 2L);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, watch_write_cb);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, w);
    mc__etcd_tls_setopt(w->m, h);
    w->line_len = 0;
    w->created = w->compacted = w->auth_err = false;
    curl_multi_add_handle(w->multi, h);
    while (running && !atomic_load(&w->stop)) {
        if (curl_multi_perform(w->multi, &running) != CURLM_OK || !running)
            break;
        curl_multi_poll(w->multi, NULL, 0, 1000, NULL);
    }
    CURLMsg *msg;
    int left;
    while ((msg = curl_multi_info_read(w->multi, &left)) != NULL)
        if (msg->msg == CURLMSG_DONE)
            res = msg->data.result;
    if (running)
        res = CURLE_ABORTED_BY_CALLBACK;
    if (w->line_len && !atomic_load(&w->stop)) /* an error body without a final newline */
        watch_line(w, w->line, w->line_len);
    curl_multi_remove_handle(w->multi, h);
    curl_easy_cleanup(h);
    curl_slist_free_all(hdrs);
    free(body);
    return res;
}

static int node_key_cmp(const void *a, const void *b)
{
    const mc_meta_kv_t *x = &(*(watch_node_t *const *)a)->ev.kv;
    const mc_meta_kv_t *y = &(*(watch_node_t *const *)b)->ev.kv;

    return key_cmp(x->key, x->key_len, y->key, y->key_len);
}

/* Queue a DELETE of k at revision rev. */
static void watch_queue_gone(etcd_watch_t *w, const known_key_t *k, int64_t rev)
{
    watch_node_t *n = calloc(1, sizeof(*n));

    if (n && (n->ev.kv.key = malloc(k->len + 1)) && (n->ev.kv.value = calloc(1, 1))) {
        memcpy(n->ev.kv.key, k->key, k->len);
        n->ev.kv.key[k->len] = 0;
        n->ev.kv.key_len = k->len;
        n->ev.kv.mod_revision = rev;
        n->ev.type = MC_META_DELETE;
        watch_enqueue(w, n);
        return;
    }
    mc_warn("etcd watch: no memory to report the deletion of a key");
    if (n)
        watch_node_free(n);
}

/* The start revision is compacted away: report the keys known that the listing lacks as
 * deleted at its revision, queue the keys listed as PUTs and go on from there. */
static int watch_relist(etcd_watch_t *w)
{
    json_t *req = json_pack("{s:s, s:s}", "key", w->key_b64, "range_end", w->end_b64), *resp;
    json_t *kvs;
    watch_node_t **put = NULL;
    size_t i, j, n = 0, gone = 0;
    int rc;

    if (!req)
        return -ENOMEM;
    rc = mc__etcd_call(w->m, "kv/range", req, &resp);
    json_decref(req);
    if (rc)
        return rc;
    int64_t rev = mc__etcd_int(json_object_get(resp, "header"), "revision");
    kvs = json_object_get(resp, "kvs");
    if (json_array_size(kvs) && !(put = calloc(json_array_size(kvs), sizeof(*put)))) {
        json_decref(resp);
        return -ENOMEM;
    }
    for (i = 0; i < json_array_size(kvs); i++) {
        watch_node_t *nd = calloc(1, sizeof(*nd));
        if (!nd || mc__etcd_kv_decode(json_array_get(kvs, i), &nd->ev.kv)) {
            /* (a key left out would be reported deleted: the next stream lists again) */
            rc = nd ? mc__set_error(-MC_EMETA, "%s", mc_last_error()) : -ENOMEM;
            mc_warn("etcd watch: a listing it could not read: %s", mc_last_error());
            free(nd);
            while (n)
                watch_node_free(put[--n]);
            free(put);
            json_decref(resp);
            return rc;
        }
        nd->ev.type = MC_META_PUT;
        put[n++] = nd;
    }
    json_decref(resp);
    if (n > 1)
        qsort(put, n, sizeof(*put), node_key_cmp);
    /* Both sorted: what known has and the listing lacks is gone. */
    for (i = j = 0; i < w->n_known; i++) {
        const known_key_t *k = &w->known[i];
        int c = 1;
        while (j < n && (c = key_cmp(put[j]->ev.kv.key, put[j]->ev.kv.key_len, k->key, k->len)) < 0)
            j++;
        if (j == n || c > 0) {
            watch_queue_gone(w, k, rev);
            gone++;
        }
    }
    mc_warn("etcd watch: revision %" PRId64 " was compacted; re-listed the prefix: %zu keys, "
            "%zu gone meanwhile%s",
            w->next_rev, n, gone, w->seeded ? "" : " (of the keys it knew: not all of them)");
    known_clear(w);
    w->seeded = true;
    w->next_rev = rev + 1;
    for (i = 0; i < n; i++) {
        if (!known_put(w, put[i]->ev.kv.key, put[i]->ev.kv.key_len))
            w->seeded = false;
        watch_enqueue(w, put[i]);
    }
    free(put);
    return 0;
}

/* Before the first stream: the keys there at the start revision, which a compaction later may
 * make it re-list (0, or an error to try again; a revision compacted already leaves the watch
 * without them: 0). */
static int watch_seed(etcd_watch_t *w)
{
    char rb[24];
    json_t *req, *resp, *kv;
    size_t i;
    int rc;

    snprintf(rb, sizeof(rb), "%" PRId64, w->next_rev - 1);
    req = json_pack("{s:s, s:s, s:b, s:s}", "key", w->key_b64, "range_end", w->end_b64, "keys_only",
                    1, "revision", rb);
    if (!req)
        return -ENOMEM;
    rc = mc__etcd_call(w->m, "kv/range", req, &resp);
    json_decref(req);
    if (rc) {
        bool gone = strstr(mc_last_error(), "compacted") != NULL;
        if (!gone && ++w->seed_failures < WATCH_SEED_TRIES)
            return rc;
        mc_warn("etcd watch: the keys at its start revision %" PRId64 " %s: deletions of keys it "
                "does not hear about are not reported",
                w->next_rev, gone ? "are compacted away" : "cannot be listed");
        w->seed_tried = true; /* (its stream opens: a compaction re-lists) */
        return 0;
    }
    json_array_foreach(json_object_get(resp, "kvs"), i, kv)
    {
        mc_meta_kv_t k;
        if (mc__etcd_kv_decode(kv, &k) == 0) {
            bool ok = known_put(w, k.key, k.key_len);
            mc__meta_kv_free(&k);
            if (!ok) {
                json_decref(resp);
                return -ENOMEM;
            }
        }
    }
    json_decref(resp);
    w->seed_tried = w->seeded = true;
    return 0;
}

static void watch_sleep(etcd_watch_t *w, int ms)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    ts.tv_sec += ms / 1000;
    ts.tv_nsec += (long)(ms % 1000) * 1000000;
    if (ts.tv_nsec >= 1000000000) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000;
    }
    pthread_mutex_lock(&w->lock);
    if (!atomic_load(&w->stop))
        pthread_cond_timedwait(&w->cond, &w->lock, &ts);
    pthread_mutex_unlock(&w->lock);
}

static void *watch_thread(void *arg)
{
    etcd_watch_t *w = arg;
    unsigned ep = atomic_load(&w->m->current), gen;
    int backoff = WATCH_BACKOFF_MIN_MS;

    while (!atomic_load(&w->stop)) {
        if (!w->seed_tried && watch_seed(w) != 0) {
            mc_debug("etcd watch: listing its keys: %s", mc_last_error());
            watch_sleep(w, backoff);
            backoff = backoff * 2 > WATCH_BACKOFF_MAX_MS ? WATCH_BACKOFF_MAX_MS : backoff * 2;
            continue;
        }
        CURLcode res = watch_stream(w, ep);
        if (atomic_load(&w->stop))
            break;
        mc_debug("etcd watch on %s ended (%s), resuming from revision %" PRId64,
                 w->m->endpoints[ep], curl_easy_strerror(res), w->next_rev);
        if (w->compacted && watch_relist(w) != 0)
            w->compacted = false; /* retried with the next stream */
        if (w->auth_err) {
            free(mc__etcd_token(w->m, &gen));
            if (mc__etcd_reauth(w->m, gen))
                mc_warn("etcd watch: %s", mc_last_error());
        }
        if (!w->created && res != CURLE_OK)
            ep = (ep + 1) % w->m->n_endpoints; /* never got through: try another member */
        backoff = w->created ? WATCH_BACKOFF_MIN_MS : backoff * 2;
        if (backoff > WATCH_BACKOFF_MAX_MS)
            backoff = WATCH_BACKOFF_MAX_MS;
        watch_sleep(w, backoff);
    }
    return NULL;
}

/* The current store revision (a count-only range, so cheap). */
static int watch_current_rev(etcd_watch_t *w, int64_t *rev_p)
{
    json_t *req = json_pack("{s:s, s:s, s:b}", "key", w->key_b64, "range_end", w->end_b64,
                            "count_only", 1),
           *resp;
    int rc;

    if (!req)
        return mc__set_error(-ENOMEM, "no memory for an etcd request");
    rc = mc__etcd_call(w->m, "kv/range", req, &resp);
    json_decref(req);
    if (rc)
        return rc;
    *rev_p = mc__etcd_int(json_object_get(resp, "header"), "revision");
    json_decref(resp);
    return 0;
}

static void watch_free(etcd_watch_t *w)
{
    watch_node_t *n, *next;

    for (n = w->head; n; n = next) {
        next = n->next;
        watch_node_free(n);
    }
    if (w->multi)
        curl_multi_cleanup(w->multi);
    pthread_cond_destroy(&w->cond);
    pthread_mutex_destroy(&w->lock);
    known_clear(w);
    free(w->known);
    free(w->key_b64);
    free(w->end_b64);
    free(w->line);
    free(w);
}

int mc__etcd_watch_create(mc_meta_t *meta, const void *prefix, size_t prefix_len,
                          int64_t start_revision, mc_meta_watch_t **watch_p)
{
    etcd_watch_t *w = calloc(1, sizeof(*w));
    pthread_condattr_t ca;
    int rc;

    if (!w)
        return mc__set_error(-ENOMEM, "no memory for a watch");
    w->base.meta = meta;
    w->m = MC_META_ETCD(meta);
    w->tail = &w->head;
    pthread_mutex_init(&w->lock, NULL);
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&w->cond, &ca);
    pthread_condattr_destroy(&ca);
    rc = mc__etcd_prefix_range(prefix, prefix_len, &w->key_b64, &w->end_b64);
    if (rc)
        goto err_free;
    w->next_rev = start_revision;
    /* "From now" is fixed here, so events between create and the stream's start are kept. */
    if (start_revision == 0 && (rc = watch_current_rev(w, &w->next_rev)) == 0)
        w->next_rev++;
    if (rc)
        goto err_free;
    if (w->next_rev <= 1) /* (before the first revision: no key) */
        w->seed_tried = w->seeded = true;
    w->multi = curl_multi_init();
    if (!w->multi) {
        rc = mc__set_error(-ENOMEM, "curl_multi_init failed");
        goto err_free;
    }
    rc = pthread_create(&w->tid, NULL, watch_thread, w);
    if (rc) {
        rc = mc__set_error(-rc, "cannot start an etcd watch thread: %s", strerror(rc));
        goto err_free;
    }
    *watch_p = &w->base;
    return 0;

err_free:
    watch_free(w);
    return rc;
}

int mc__etcd_watch_next(mc_meta_watch_t *watch, int timeout_ms, mc_meta_event_t *event_p)
{
    etcd_watch_t *w = (etcd_watch_t *)watch;
    struct timespec ts;
    watch_node_t *n;

    if (timeout_ms > 0) {
        clock_gettime(CLOCK_MONOTONIC, &ts);
        ts.tv_sec += timeout_ms / 1000;
        ts.tv_nsec += (long)(timeout_ms % 1000) * 1000000;
        if (ts.tv_nsec >= 1000000000) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000;
        }
    }
    pthread_mutex_lock(&w->lock);
    while (!w->head && timeout_ms != 0) {
        if (timeout_ms < 0)
            pthread_cond_wait(&w->cond, &w->lock);
        else if (pthread_cond_timedwait(&w->cond, &w->lock, &ts) == ETIMEDOUT)
            break;
    }
    n = w->head;
    if (n) {
        w->head = n->next;
        if (!w->head)
            w->tail = &w->head;
    }
    pthread_mutex_unlock(&w->lock);
    if (!n)
        return -ETIMEDOUT;
    *event_p = n->ev;
    free(n);
    return 0;
}

void mc__etcd_watch_destroy(mc_meta_watch_t *watch)
{
    etcd_watch_t *w = (etcd_watch_t *)watch;

    pthread_mutex_lock(&w->lock);
    atomic_store(&w->stop, true);
    pthread_cond_broadcast(&w->cond);
    pthread_mutex_unlock(&w->lock);
    curl_multi_wakeup(w->multi);
    pthread_join(w->tid, NULL);
    watch_free(w);
}
