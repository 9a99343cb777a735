/* The segment cache (engine/segment_cache.c) keeps the newest descriptor of each peer when a
 * blocking lookup's answer arrives after a change that the watch delivered first: a restarted
 * peer's new descriptor, a departed peer's deletion, and a deletion that the listing which
 * starts the watch already reflects. The engine's metadata (the file backend) is wrapped by a
 * gate that holds a lookup between its get and its return, and the listing before it lists. */
#include <errno.h>
#include <pthread.h>
#include <semaphore.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#include <mooncake/engine.h>

#include "engine_int.h"
#include "metadata/meta.h"

#define PEER "peer-x" /* a name no engine has: its descriptors are the test's strings */

static struct gate {
    mc_meta_t base;
    mc_meta_t *inner;
    char key[512]; /* the peer's key */
    size_t key_len;
    atomic_bool hold_get, hold_list;
    sem_t get_in, get_go, list_in, list_go, watching;
} g;

static int gate_get(mc_meta_t *m, const void *key, size_t len, mc_meta_kv_t *kv)
{
    (void)m;
    int rc = g.inner->ops->get(g.inner, key, len, kv);
    if (len == g.key_len && !memcmp(key, g.key, len) && atomic_exchange(&g.hold_get, false)) {
        sem_post(&g.get_in);
        sem_wait(&g.get_go);
    }
    return rc;
}

static int gate_list(mc_meta_t *m, const void *prefix, size_t len, mc_meta_kv_t **kvs, size_t *n,
                     int64_t *rev)
{
    (void)m;
    if (len && !memcmp(prefix, g.key, len) && atomic_exchange(&g.hold_list, false)) {
        sem_post(&g.list_in);
        sem_wait(&g.list_go);
    }
    return g.inner->ops->list(g.inner, prefix, len, kvs, n, rev);
}

static int gate_watch_create(mc_meta_t *m, const void *prefix, size_t len, int64_t rev,
                             mc_meta_watch_t **w)
{
    (void)m;
    int rc = g.inner->ops->watch_create(g.inner, prefix, len, rev, w);
    if (!rc)
        sem_post(&g.watching); /* (the watch's own ops are the inner store's) */
    return rc;
}

static void gate_close(mc_meta_t *m)
{
    (void)m;
    mc__meta_close(g.inner);
}

static int gate_put(mc_meta_t *m, const void *k, size_t kl, const void *v, size_t vl, int64_t l,
                    int64_t *r)
{
    (void)m;
    return g.inner->ops->put(g.inner, k, kl, v, vl, l, r);
}

static int gate_del(mc_meta_t *m, const void *k, size_t kl, int64_t r)
{
    (void)m;
    return g.inner->ops->del(g.inner, k, kl, r);
}

static int gate_cas(mc_meta_t *m, const void *k, size_t kl, int64_t x, const void *v, size_t vl,
                    int64_t l, int64_t *r)
{
    (void)m;
    return g.inner->ops->cas(g.inner, k, kl, x, v, vl, l, r);
}

static int gate_grant(mc_meta_t *m, unsigned ttl, int64_t *l)
{
    (void)m;
    return g.inner->ops->lease_grant(g.inner, ttl, l);
}

static int gate_keepalive(mc_meta_t *m, int64_t l)
{
    (void)m;
    return g.inner->ops->lease_keepalive(g.inner, l);
}

static int gate_revoke(mc_meta_t *m, int64_t l)
{
    (void)m;
    return g.inner->ops->lease_revoke(g.inner, l);
}

static const mc_meta_ops_t gate_ops = {.size = sizeof(mc_meta_ops_t),
                                       .version = 2,
                                       .scheme = "gate",
                                       .close = gate_close,
                                       .get = gate_get,
                                       .put = gate_put,
                                       .del = gate_del,
                                       .list = gate_list,
                                       .cas = gate_cas,
                                       .lease_grant = gate_grant,
                                       .lease_keepalive = gate_keepalive,
                                       .lease_revoke = gate_revoke,
                                       .watch_create = gate_watch_create};

typedef struct fixture {
    char dir[64];
    mc_engine_t *e;
    mc_meta_t *m; /* the test's own handle on the store */
} fixture_t;

/* An engine on a fresh file store, its metadata behind the gate (swapped in before any lookup:
 * the publisher's threads find the same store through it). */
static void setup(fixture_t *f)
{
    char url[96];
    mc_config_t *cfg;

    snprintf(f->dir, sizeof(f->dir), "/tmp/mc-cache-order-XXXXXX");
    assert_non_null(mkdtemp(f->dir));
    snprintf(url, sizeof(url), "file://%s", f->dir);
    assert_int_equal(mc_config_create(&cfg), 0);
    assert_int_equal(mc_config_set(cfg, "METADATA", url), 0);
    assert_int_equal(mc_config_set(cfg, "LOG_LEVEL", "error"), 0);
    assert_int_equal(mc_config_set(cfg, "LISTEN", "127.0.0.1:0"), 0);
    assert_int_equal(mc_engine_create(cfg, &f->e), 0);
    mc_config_destroy(cfg);
    assert_int_equal(mc_meta_open(url, &f->m), 0);

    memset(&g, 0, sizeof(g));
    int n = mc__meta_key(g.key, sizeof(g.key), f->e->cfg.cluster_id, "ram", PEER);
    assert_true(n > 0);
    g.key_len = (size_t)n;
    sem_init(&g.get_in, 0, 0);
    sem_init(&g.get_go, 0, 0);
    sem_init(&g.list_in, 0, 0);
    sem_init(&g.list_go, 0, 0);
    sem_init(&g.watching, 0, 0);
    g.base.ops = &gate_ops;
    g.inner = f->e->meta;
    f->e->meta = &g.base;
}

static void teardown(fixture_t *f)
{
    char cmd[128];

    mc_engine_destroy(f->e);
    mc_meta_close(f->m);
    snprintf(cmd, sizeof(cmd), "rm -rf %s", f->dir);
    assert_int_equal(system(cmd), 0);
}

static void store_put(fixture_t *f, const char *val)
{
    assert_int_equal(mc_meta_put(f->m, g.key, g.key_len, val, strlen(val), 0, NULL), 0);
}

/* What the cache holds for the peer: its descriptor (static), or NULL. */
static const char *cached(fixture_t *f)
{
    static char val[64];
    mc_meta_kv_t kv;

    if (mc__meta_lookup(f->e, PEER, true, &kv))
        return NULL;
    snprintf(val, sizeof(val), "%s", kv.value);
    mc__meta_kv_free(&kv);
    return val;
}

/* Until the cache holds want (NULL: nothing), 10 s at most. */
static void wait_cached(fixture_t *f, const char *want)
{
    for (int i = 0; i < 1000; i++) {
        const char *v = cached(f);
        if (want ? v && !strcmp(v, want) : !v)
            return;
        usleep(10 * 1000);
    }
    fail_msg("the cache did not come to hold %s (it holds %s)", want ? want : "nothing",
             cached(f) ? cached(f) : "nothing");
}

static void *lookup_thread(void *arg)
{
    fixture_t *f = arg;
    mc_meta_kv_t kv;
    static char got[64];

    got[0] = 0;
    if (mc__meta_lookup(f->e, PEER, false, &kv) == 0) {
        snprintf(got, sizeof(got), "%s", kv.value);
        mc__meta_kv_free(&kv);
    }
    return got;
}

/* A blocking lookup answered v1, held until change() was seen by the cache; its result. */
static const char *lookup_held(fixture_t *f, void (*change)(fixture_t *), const char *then)
{
    pthread_t t;
    void *got;

    atomic_store(&g.hold_get, true);
    assert_int_equal(pthread_create(&t, NULL, lookup_thread, f), 0);
    sem_wait(&g.get_in);
    change(f);
    wait_cached(f, then);
    sem_post(&g.get_go);
    assert_int_equal(pthread_join(t, &got), 0);
    return got;
}

static void put_v2(fixture_t *f)
{
    store_put(f, "v2");
}

static void delete_peer(fixture_t *f)
{
    assert_int_equal(mc_meta_delete(f->m, g.key, g.key_len, 0), 0);
}

/* The peer restarted (v2) while a lookup's answer (v1) was on its way: v2 stays. */
static void test_newer_descriptor_stays(void **state)
{
    fixture_t f;

    (void)state;
    setup(&f);
    store_put(&f, "v1");
    (void)cached(&f); /* the first look starts the cache (which may list v1 at once) */
    wait_cached(&f, "v1");
    assert_string_equal(lookup_held(&f, put_v2, "v2"), "v1");
    assert_string_equal(cached(&f), "v2");
    store_put(&f, "v3"); /* later changes still land */
    wait_cached(&f, "v3");
    teardown(&f);
}

/* The peer left while a lookup's answer (v1) was on its way: it stays gone. */
static void test_deleted_stays_deleted(void **state)
{
    fixture_t f;

    (void)state;
    setup(&f);
    store_put(&f, "v1");
    (void)cached(&f);
    wait_cached(&f, "v1");
    assert_string_equal(lookup_held(&f, delete_peer, NULL), "v1");
    assert_null(cached(&f));
    store_put(&f, "v2"); /* and comes back when it does */
    wait_cached(&f, "v2");
    teardown(&f);
}

/* The first lookup starts the cache: its answer (v1) arrives after the listing that started the
 * watch, which the deletion came before (the watch will never report it). */
static void test_deleted_before_listing(void **state)
{
    fixture_t f;
    pthread_t t;
    void *got;

    (void)state;
    setup(&f);
    store_put(&f, "v1");
    atomic_store(&g.hold_list, true);
    atomic_store(&g.hold_get, true);
    assert_int_equal(pthread_create(&t, NULL, lookup_thread, &f), 0);
    sem_wait(&g.list_in);
    sem_wait(&g.get_in);
    delete_peer(&f);
    sem_post(&g.list_go);
    sem_wait(&g.watching); /* listed, and watching from after the deletion */
    assert_null(cached(&f));
    sem_post(&g.get_go);
    assert_int_equal(pthread_join(t, &got), 0);
    assert_string_equal(got, "v1");
    assert_null(cached(&f));
    store_put(&f, "v2");
    wait_cached(&f, "v2");
    teardown(&f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_newer_descriptor_stays),
        cmocka_unit_test(test_deleted_stays_deleted),
        cmocka_unit_test(test_deleted_before_listing),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
