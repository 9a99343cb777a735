/* A fetch's two store threads: following the replica entries, and publishing our own. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "p2p_fetch.h"

#define P2P_WATCH_WAIT_MS   100
#define P2P_META_BACKOFF_MS 200

static void meta_state(p2p_fetch_t *f, int rc)
{
    pthread_mutex_lock(&f->lock);
    f->meta_down = rc != 0 && mc__p2p_meta_down(rc);
    pthread_mutex_unlock(&f->lock);
}

static bool stopping(p2p_fetch_t *f)
{
    pthread_mutex_lock(&f->lock);
    bool stop = f->stop;
    pthread_mutex_unlock(&f->lock);
    return stop;
}

/* ---- watch ---- */

/* List the entries and watch from the listing's revision: no change falls in between. */
static int watch_resync(p2p_fetch_t *f, mc_meta_watch_t **w_p)
{
    const char *prefix = f->replica_prefix;
    mc_meta_kv_t *kvs;
    size_t n;
    int64_t rev;
    int rc = mc_meta_list(f->p2p->meta, prefix, strlen(prefix), &kvs, &n, &rev);

    if (rc)
        return rc;
    pthread_mutex_lock(&f->lock);
    mc__p2p_holders_listed(f, kvs, n);
    pthread_mutex_unlock(&f->lock);
    mc_meta_kvs_free(kvs, n);
    mc__p2p_wake(f);
    return mc_meta_watch_create(f->p2p->meta, prefix, strlen(prefix), rev + 1, w_p);
}

/* One event applied; -ETIMEDOUT if none came. */
static int watch_step(p2p_fetch_t *f, mc_meta_watch_t *w)
{
    mc_meta_event_t ev;
    int rc = mc_meta_watch_next(w, P2P_WATCH_WAIT_MS, &ev);

    if (rc)
        return rc;
    pthread_mutex_lock(&f->lock);
    mc__p2p_holders_event(f, &ev);
    pthread_mutex_unlock(&f->lock);
    mc_meta_kv_free(&ev.kv);
    mc__p2p_wake(f);
    return 0;
}

static void *watch_thread(void *arg)
{
    p2p_fetch_t *f = arg;
    mc_meta_watch_t *w = NULL;

    while (!stopping(f)) {
        int rc = w ? watch_step(f, w) : watch_resync(f, &w);
        if (rc == -ETIMEDOUT)
            continue;
        meta_state(f, rc);
        if (rc) { /* start again from a fresh listing */
            mc_meta_watch_destroy(w);
            w = NULL;
            mc__p2p_sleep_ms(P2P_META_BACKOFF_MS);
        }
    }
    mc_meta_watch_destroy(w);
    return NULL;
}

/* ---- publish ---- */

/* Our entry as of now (under f->lock); the buffers and id do not change. */
static int entry_snapshot(p2p_fetch_t *f, p2p_entry_t *e)
{
    size_t nb = (f->d.shards + 7) / 8;

    memset(e, 0, sizeof(*e));
    e->have = malloc(nb);
    e->bufs = calloc(f->h->n, sizeof(*e->bufs));
    if (!e->have || !e->bufs) {
        mc__p2p_entry_free(e);
        return -ENOMEM;
    }
    memcpy(e->have, f->have, nb);
    for (size_t i = 0; i < f->h->n; i++)
        e->bufs[i] = (p2p_rbuf_t){(uint64_t)(uintptr_t)f->h->bufs[i].addr, f->h->bufs[i].len};
    e->n_bufs = f->h->n;
    e->id = f->d.id;
    e->shards = f->d.shards;
    e->complete = f->prog.shards_done == f->d.shards;
    return 0;
}

static void wait_until(p2p_fetch_t *f, uint64_t when_ms)
{
    struct timespec ts;
    uint64_t now = mc__p2p_now_ms();

    if (when_ms <= now)
        return;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    ts.tv_nsec += (long)(when_ms - now) * 1000000;
    ts.tv_sec += ts.tv_nsec / 1000000000;
    ts.tv_nsec %= 1000000000;
    pthread_cond_timedwait(&f->pub_cond, &f->lock, &ts);
}

/* Publish whenever shards were verified since the last time: the first at once, then at most
 * every P2P_PUBLISH_MS (each put is a round trip; fetchers need not see every shard at once).
 * On the way out, once more if something changed, so that the entry ends complete. */
static void *publish_thread(void *arg)
{
    p2p_fetch_t *f = arg;
    uint64_t last = 0;

    pthread_mutex_lock(&f->lock);
    while (!f->stop || f->pub_dirty) {
        p2p_entry_t e;
        if (!f->pub_dirty) {
            pthread_cond_wait(&f->pub_cond, &f->lock);
            continue;
        }
        if (!f->stop && last && mc__p2p_now_ms() < last + P2P_PUBLISH_MS) {
            wait_until(f, last + P2P_PUBLISH_MS);
            continue;
        }
        f->pub_dirty = false;
        int rc = entry_snapshot(f, &e);
        pthread_mutex_unlock(&f->lock);
        if (!rc) {
            rc = mc__p2p_entry_publish(f->p2p, f->h, &e);
            mc__p2p_entry_free(&e);
        }
        last = mc__p2p_now_ms();
        pthread_mutex_lock(&f->lock);
        f->meta_down = rc == 1;
        if (rc == -ENOMEM) { /* (the snapshot's or the encoding's): again at the next change */
            f->pub_dirty = !f->stop;
            mc__p2p_warn(f->p2p, "%s", mc_p2p_last_error());
        } else if (rc < 0 && !f->pub_error) { /* refused for good: the fetch loop fails */
            f->pub_error = rc;
            snprintf(f->pub_why, sizeof(f->pub_why), "%s", mc_p2p_last_error());
        }
    }
    pthread_mutex_unlock(&f->lock);
    return NULL;
}

/* ---- start, stop ---- */

int mc__p2p_threads_start(p2p_fetch_t *f)
{
    int rc = pthread_create(&f->watch_tid, NULL, watch_thread, f);

    if (rc)
        return mc__p2p_error(-rc, "cannot start a watch thread: %s", strerror(rc));
    f->has_watch = true;
    if (f->o.no_serve)
        return 0;
    rc = pthread_create(&f->pub_tid, NULL, publish_thread, f);
    if (rc)
        return mc__p2p_error(-rc, "cannot start a publish thread: %s", strerror(rc));
    f->has_pub = true;
    return 0;
}

void mc__p2p_threads_stop(p2p_fetch_t *f)
{
    pthread_mutex_lock(&f->lock);
    f->stop = true;
    pthread_cond_broadcast(&f->pub_cond);
    pthread_mutex_unlock(&f->lock);
    if (f->has_watch)
        pthread_join(f->watch_tid, NULL);
    if (f->has_pub)
        pthread_join(f->pub_tid, NULL);
    f->has_watch = f->has_pub = false;
}
