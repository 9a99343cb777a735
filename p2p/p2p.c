/* The P2P node: its engine and store handle, the table of what it holds, errors and logging. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "p2p_int.h"

/* ---- errors, logging, time ---- */

static __thread char p2p_reason[1024];

int mc__p2p_error(int code, const char *fmt, ...)
{
    char buf[sizeof(p2p_reason)];
    va_list ap;

    /* Formatted aside first: the arguments may include the previous reason itself. */
    va_start(ap, fmt);
    vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    memcpy(p2p_reason, buf, sizeof(buf));
    return code;
}

const char *mc_p2p_last_error(void)
{
    return p2p_reason;
}

void mc__p2p_warn(const mc_p2p_t *p2p, const char *fmt, ...)
{
    char buf[1024];
    va_list ap;

    if (p2p && p2p->log_level < 1)
        return;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    fprintf(stderr, "mooncake-p2p[%d] WARN: %s\n", (int)getpid(), buf);
}

uint64_t mc__p2p_now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

void mc__p2p_sleep_ms(unsigned ms)
{
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000};

    while (nanosleep(&ts, &ts) && errno == EINTR)
        ;
}

uint64_t mc__p2p_random(void)
{
    uint64_t v;

    if (getrandom(&v, sizeof(v), 0) != sizeof(v)) /* never short for 8 bytes; be safe anyway */
        v = mc__p2p_now_ms() * 0x9e3779b97f4a7c15ull ^ (uint64_t)getpid();
    return v;
}

/* ---- node ---- */

static const char *setting(const mc_config_t *config, const char *name)
{
    const char *v = mc_config_get(config, name);

    return v ? v : "";
}

static int p2p_log_level(const char *v)
{
    static const char *const names[] = {"off", "error", "warn", "info", "debug"};

    for (int i = 0; i < 5; i++)
        if (!strcasecmp(v, names[i]))
            return i - 1;
    return atoi(v);
}

static bool is_true(const char *v)
{
    return !strcasecmp(v, "1") || !strcasecmp(v, "true") || !strcasecmp(v, "yes") ||
           !strcasecmp(v, "on");
}

/* What the node needs of the engine's settings, checked before anything starts. */
static int p2p_read_settings(mc_p2p_t *p2p, const mc_config_t *config)
{
    const char *url = setting(config, "METADATA");

    if (!is_true(setting(config, "PROGRESS_THREAD")))
        return mc__p2p_error(-EINVAL,
                             "a P2P node serves peers at any time: it needs "
                             "PROGRESS_THREAD=1 (it is %s)",
                             setting(config, "PROGRESS_THREAD"));
    if (!*url || !strcmp(url, "none"))
        return mc__p2p_error(-EINVAL, "a P2P node needs a metadata store: METADATA is \"none\"");
    snprintf(p2p->cluster, sizeof(p2p->cluster), "%s", setting(config, "METADATA_CLUSTER_ID"));
    p2p->connect_timeout_ms = (unsigned)strtoul(setting(config, "CONNECT_TIMEOUT_MS"), NULL, 10);
    p2p->log_level = p2p_log_level(setting(config, "LOG_LEVEL"));
    return 0;
}

static int p2p_start(mc_p2p_t *p2p, const mc_config_t *config)
{
    const char *url = setting(config, "METADATA");
    int rc = p2p_read_settings(p2p, config);

    if (rc)
        return rc;
    rc = mc_meta_open_config(config, &p2p->meta); /* the engine's credentials too */
    if (rc)
        return mc__p2p_error(rc, "metadata %s: %s", url, mc_last_error());
    rc = mc_engine_create(config, &p2p->engine);
    if (rc) {
        mc__p2p_error(rc, "engine: %s", mc_last_error());
        mc_meta_close(p2p->meta);
        return rc;
    }
    snprintf(p2p->segment, sizeof(p2p->segment), "%s", mc_engine_segment_name(p2p->engine));
    pthread_mutex_init(&p2p->lock, NULL);
    return 0;
}

int mc_p2p_create(const mc_config_t *config, mc_p2p_t **p2p_p)
{
    mc_config_t *own = NULL;
    mc_p2p_t *p2p;
    int rc;

    if (!p2p_p)
        return mc__p2p_error(-EINVAL, "mc_p2p_create: p2p_p is NULL");
    /* No config: the defaults and the environment, read once for the node and its engine. */
    if (!config && (rc = mc_config_create(&own)) != 0)
        return mc__p2p_error(rc, "engine settings: %s", mc_last_error());
    p2p = calloc(1, sizeof(*p2p));
    rc = p2p ? p2p_start(p2p, config ? config : own)
             : mc__p2p_error(-ENOMEM, "mc_p2p_create: out of memory");
    mc_config_destroy(own);
    if (rc) {
        free(p2p);
        return rc;
    }
    *p2p_p = p2p;
    return 0;
}

void mc_p2p_destroy(mc_p2p_t *p2p)
{
    if (!p2p)
        return;
    /* Calls under way must have returned: what is left is settled. */
    while (p2p->held) {
        p2p_held_t *h = p2p->held;

        if (h->origin)
            mc_p2p_unregister(p2p, h->name, 1);
        else
            mc_p2p_delete_replica(p2p, h->name);
        if (p2p->held == h) /* busy, or the withdrawal failed: drop it all the same */
            mc__p2p_drop(p2p, h, 0);
    }
    mc_engine_destroy(p2p->engine);
    mc_meta_close(p2p->meta);
    pthread_mutex_destroy(&p2p->lock);
    free(p2p);
}

mc_engine_t *mc_p2p_engine(mc_p2p_t *p2p)
{
    return p2p ? p2p->engine : NULL;
}

/* ---- the held table ---- */

static p2p_held_t **held_find(mc_p2p_t *p2p, const char *name)
{
    p2p_held_t **pp = &p2p->held;

    while (*pp && strcmp((*pp)->name, name))
        pp = &(*pp)->next;
    return pp;
}

int mc__p2p_claim(mc_p2p_t *p2p, const char *name, bool origin, p2p_held_t **held_p)
{
    p2p_held_t *h = calloc(1, sizeof(*h)), **pp;
    int rc = 0;

    if (!h)
        return mc__p2p_error(-ENOMEM, "out of memory");
    snprintf(h->name, sizeof(h->name), "%s", name);
    h->busy = true;
    h->origin = origin; /* before others see it (mc__p2p_take reads it) */
    pthread_mutex_lock(&p2p->lock);
    pp = held_find(p2p, name);
    if (*pp)
        rc = mc__p2p_error(-EEXIST, "%s: this node holds it already (%s)", name,
                           (*pp)->busy     ? "being set up or withdrawn"
                           : (*pp)->origin ? "published here"
                                           : "a replica");
    else
        *pp = h;
    pthread_mutex_unlock(&p2p->lock);
    if (rc)
        free(h);
    else
        *held_p = h;
    return rc;
}

int mc__p2p_take(mc_p2p_t *p2p, const char *name, bool origin, p2p_held_t **held_p)
{
    p2p_held_t *h;
    int rc = 0;

    pthread_mutex_lock(&p2p->lock);
    h = *held_find(p2p, name);
    if (!h || h->origin != origin)
        rc = mc__p2p_error(-ENOENT, "%s: this node %s", name,
                           !h       ? "holds no such object"
                           : origin ? "did not publish it (a replica: delete_replica)"
                                    : "published it (the origin: unregister)");
    else if (h->busy)
        rc = mc__p2p_error(-EBUSY, "%s: being set up or withdrawn by another call", name);
    else
        h->busy = true;
    pthread_mutex_unlock(&p2p->lock);
    if (!rc)
        *held_p = h;
    return rc;
}

void mc__p2p_settle(mc_p2p_t *p2p, p2p_held_t *h)
{
    pthread_mutex_lock(&p2p->lock);
    h->busy = false;
    pthread_mutex_unlock(&p2p->lock);
}

void mc__p2p_forget(mc_p2p_t *p2p, p2p_held_t *h)
{
    pthread_mutex_lock(&p2p->lock);
    p2p_held_t **pp = held_find(p2p, h->name);
    if (*pp == h)
        *pp = h->next;
    pthread_mutex_unlock(&p2p->lock);
    free(h->bufs);
    free(h);
}

/* Whether a byte is in both sets of buffers. */
static bool bufs_meet(const mc_p2p_buf_t *x, size_t nx, const mc_p2p_buf_t *y, size_t ny)
{
    for (size_t i = 0; i < nx; i++)
        for (size_t j = 0; j < ny; j++) {
            uintptr_t a = (uintptr_t)x[i].addr, b = (uintptr_t)y[j].addr;
            if (a < b + y[j].len && b < a + x[i].len)
                return true;
        }
    return false;
}

int mc__p2p_hold_bufs(mc_p2p_t *p2p, p2p_held_t *h, const mc_p2p_buf_t *bufs, size_t n)
{
    mc_p2p_buf_t *copy = malloc(n * sizeof(*bufs));
    int rc = 0;

    if (!copy)
        return mc__p2p_error(-ENOMEM, "out of memory");
    memcpy(copy, bufs, n * sizeof(*bufs));
    /* A fetch writes its buffers: none of them may hold another object of this node (what a
     * shard overwrote would be served as that object's, verified), nor may another object's be
     * published from a fetch's. Objects published from the same bytes are fine. */
    pthread_mutex_lock(&p2p->lock);
    for (const p2p_held_t *o = p2p->held; o && !rc; o = o->next)
        if (o != h && (!o->origin || !h->origin) && o->bufs && bufs_meet(copy, n, o->bufs, o->n))
            rc = mc__p2p_error(-EINVAL, "%s: its buffers overlap those of %s, %s here", h->name,
                               o->name, o->origin ? "published" : "fetched or served");
    if (!rc) {
        h->bufs = copy;
        h->n = n;
    }
    pthread_mutex_unlock(&p2p->lock);
    if (rc) {
        free(copy);
        return rc;
    }
    /* A registration of our own on each, even of memory the host registered already: the
     * engine counts them, and unregister drops exactly ours. */
    for (; h->n_reg < n; h->n_reg++) {
        int rc = mc_mem_register(p2p->engine, bufs[h->n_reg].addr, bufs[h->n_reg].len, "*");
        if (rc)
            return mc__p2p_error(rc, "registering buffer %zu (%p, %llu bytes): %s", h->n_reg,
                                 bufs[h->n_reg].addr, (unsigned long long)bufs[h->n_reg].len,
                                 mc_last_error());
    }
    return 0;
}

/* The replica entry first, so that no fetcher starts on buffers about to go; then the
 * registrations, each of which waits until nothing in flight touches its buffer. */
static int p2p_release(mc_p2p_t *p2p, p2p_held_t *h)
{
    /* Whenever a publish was tried: the engine keeps a key that the store refused for a while
     * (not for good) and puts it again later. -ENOENT: never published, or gone already. */
    int rc = h->replica_key[0] ? mc_engine_unpublish(p2p->engine, h->replica_key) : 0, busy = 0;

    /* If the store is down, the entry stays until our lease ends: fetchers that try it are
     * refused (the memory is no longer registered) and go elsewhere. */
    if (rc && rc != -ENOENT)
        mc__p2p_warn(p2p, "%s: withdrawing the replica entry: %s", h->name, mc_last_error());
    while (h->n_reg > 0) {
        mc_p2p_buf_t *b = &h->bufs[--h->n_reg];
        /* A registration that is gone (-ENOENT) holds nothing. Any other failure (a request
         * still in flight past the transfer timeout) may leave the engine touching the
         * buffer: the caller must not free it, so it is told. */
        rc = mc_mem_unregister_range(p2p->engine, b->addr, b->len);
        if (rc && rc != -ENOENT && !busy)
            busy = mc__p2p_error(-EBUSY,
                                 "%s: unregistering buffer %zu (%p): %s; the engine may still "
                                 "use it: keep the buffers valid until mc_p2p_destroy returns",
                                 h->name, h->n_reg, b->addr, mc_last_error());
        else if (rc)
            mc__p2p_warn(p2p, "%s: unregistering %p: %s", h->name, b->addr, mc_last_error());
    }
    return busy;
}

int mc__p2p_drop(mc_p2p_t *p2p, p2p_held_t *h, int rc)
{
    char why[sizeof(p2p_reason)];
    int busy;

    memcpy(why, p2p_reason, sizeof(why)); /* rc's reason, which release may replace */
    busy = p2p_release(p2p, h);
    mc__p2p_forget(p2p, h);
    if (!busy)
        return rc;
    return rc ? mc__p2p_error(-EBUSY, "%s (after: %s)", p2p_reason, why) : busy;
}
