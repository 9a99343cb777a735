/*
 * The public metadata API (<mooncake/meta.h>, nothing else): one suite run against each
 * backend, as a host sees them. `test_meta_public file` runs it on a fresh file:// directory,
 * `test_meta_public etcd` on a real etcd (etcd_proc.h; 77 without one). The tests share one
 * store and use a prefix each; nothing else writes to it, so revisions are exact.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* nftw */
#endif
#include <errno.h>
#include <ftw.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cmocka.h>

#include <mooncake/meta.h>

#include "etcd_proc.h"

static const char *backend; /* "file" or "etcd" */
static etcd_proc_t etcd;
static char store_dir[64], store_url[160];
static mc_meta_t *meta;

#define S(lit) lit, sizeof(lit) - 1 /* a string literal as bytes and length */

static int64_t put(const char *key, size_t key_len, const char *val, int64_t lease)
{
    int64_t rev = -1;

    assert_int_equal(mc_meta_put(meta, key, key_len, val, strlen(val), lease, &rev), 0);
    assert_true(rev > 0);
    return rev;
}

static void assert_kv(const mc_meta_kv_t *kv, const char *key, size_t key_len, const char *val,
                      int64_t mod_revision)
{
    assert_int_equal(kv->key_len, key_len);
    assert_memory_equal(kv->key, key, key_len);
    assert_int_equal(kv->key[key_len], '\0');
    assert_int_equal(kv->value_len, strlen(val));
    assert_memory_equal(kv->value, val, kv->value_len);
    assert_int_equal(kv->value[kv->value_len], '\0');
    assert_int_equal(kv->mod_revision, mod_revision);
}

static void assert_get(const char *key, size_t key_len, const char *val, int64_t mod_revision)
{
    mc_meta_kv_t kv;

    assert_int_equal(mc_meta_get(meta, key, key_len, &kv), 0);
    assert_kv(&kv, key, key_len, val, mod_revision);
    mc_meta_kv_free(&kv);
}

static void assert_absent(const char *key, size_t key_len)
{
    mc_meta_kv_t kv;

    assert_int_equal(mc_meta_get(meta, key, key_len, &kv), -ENOENT);
}

/* The current store revision: a put outside every test's prefix takes the next one. */
static int64_t next_revision(void)
{
    return put(S("~clock"), "", 0);
}

/* ---- watches: collect events, compare them in revision order ---- */

typedef struct want_event {
    mc_meta_event_type_t type;
    const char *key, *val; /* val "" for DELETE */
    int64_t rev;
} want_event_t;

static int event_cmp(const void *a, const void *b)
{
    const mc_meta_event_t *x = a, *y = b;

    if (x->kv.mod_revision != y->kv.mod_revision)
        return x->kv.mod_revision < y->kv.mod_revision ? -1 : 1;
    return strcmp(x->kv.key, y->kv.key);
}

/* Exactly the n events of want (in any order across keys), then none for quiet_ms. Events of
 * one key must come in revision order. */
static void expect_events(mc_meta_watch_t *w, const want_event_t *want, size_t n, int quiet_ms)
{
    mc_meta_event_t got[16], extra;

    assert_true(n <= 16);
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(mc_meta_watch_next(w, 10000, &got[i]), 0);
        for (size_t j = 0; j < i; j++)
            if (strcmp(got[j].kv.key, got[i].kv.key) == 0)
                assert_true(got[j].kv.mod_revision < got[i].kv.mod_revision);
    }
    if (mc_meta_watch_next(w, quiet_ms, &extra) == 0)
        fail_msg("unexpected event %s %s at revision %lld",
                 extra.type == MC_META_PUT ? "PUT" : "DELETE", extra.kv.key,
                 (long long)extra.kv.mod_revision);
    qsort(got, n, sizeof(got[0]), event_cmp);
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(got[i].type, want[i].type);
        assert_kv(&got[i].kv, want[i].key, strlen(want[i].key), want[i].val, want[i].rev);
        mc_meta_kv_free(&got[i].kv);
    }
}

/* ---- cases ---- */

static void test_open_bad_url(void **state)
{
    mc_meta_t *m = NULL;

    (void)state;
    assert_int_equal(mc_meta_open("nope://x", &m), -EINVAL);
    assert_string_equal(mc_last_error(), "metadata URL 'nope://x': unknown scheme 'nope'");
    assert_int_equal(mc_meta_open("/tmp/store", &m), -EINVAL);
    assert_string_equal(mc_last_error(),
                        "metadata URL '/tmp/store' is not of the form scheme://...");
    assert_int_equal(mc_meta_open(NULL, &m), -EINVAL);
    assert_string_equal(mc_last_error(), "metadata URL '(null)' is not of the form scheme://...");
    assert_int_equal(mc_meta_open("file://relative/dir", &m), -EINVAL);
    assert_string_equal(mc_last_error(),
                        "metadata URL file://relative/dir: the path must be absolute");
    assert_int_equal(mc_meta_open("etcd://host", &m), -EINVAL);
    assert_string_equal(mc_last_error(), "metadata URL etcd://host: want host:port[,host:port...]");
    assert_null(m); /* never set on failure */
    assert_int_equal(mc_meta_open(store_url, NULL), -EINVAL);
    assert_string_equal(mc_last_error(), "mc_meta_open: meta_p is NULL");
}

static void test_bad_arguments(void **state)
{
    mc_meta_kv_t kv;
    size_t n = 99;

    (void)state;
    assert_int_equal(mc_meta_get(NULL, S("k"), &kv), -EINVAL);
    assert_string_equal(mc_last_error(), "mc_meta_get: meta is NULL");
    assert_int_equal(mc_meta_delete_prefix(meta, "", 0, &n), -EINVAL);
    assert_string_equal(mc_last_error(),
                        "mc_meta_delete_prefix: the prefix is empty (it would delete every key)");
    assert_int_equal(n, 99);
    assert_int_equal(mc_meta_delete(meta, S("k"), -1), -EINVAL);
    assert_string_equal(mc_last_error(), "mc_meta_delete: mod_revision -1 is negative");
    assert_int_equal(mc_meta_put(meta, S("k"), NULL, 3, 0, NULL), -EINVAL);
    assert_string_equal(mc_last_error(), "mc_meta_put: val is NULL with length 3");
}

static void test_put_get_binary(void **state)
{
    static const char key[] = "bin/\0k\xff", val[] = "v\0\xfe";
    mc_meta_kv_t kv;
    int64_t rev;

    (void)state;
    assert_int_equal(mc_meta_put(meta, key, sizeof(key) - 1, val, sizeof(val) - 1, 0, &rev), 0);
    assert_int_equal(mc_meta_get(meta, key, sizeof(key) - 1, &kv), 0);
    assert_int_equal(kv.key_len, sizeof(key) - 1);
    assert_memory_equal(kv.key, key, sizeof(key));
    assert_int_equal(kv.value_len, sizeof(val) - 1);
    assert_memory_equal(kv.value, val, sizeof(val));
    assert_int_equal(kv.mod_revision, rev);
    assert_int_equal(kv.lease, 0);
    mc_meta_kv_free(&kv);
    assert_null(kv.key);
    assert_int_equal(next_revision(), rev + 1);
}

static void test_cas(void **state)
{
    int64_t r1, r2;

    (void)state;
    assert_int_equal(mc_meta_cas(meta, S("cas/k"), 0, S("a"), 0, &r1), 0);
    assert_int_equal(mc_meta_cas(meta, S("cas/k"), 0, S("b"), 0, &r2), -MC_ECONFLICT);
    assert_int_equal(mc_meta_cas(meta, S("cas/k"), r1, S("b"), 0, &r2), 0);
    assert_int_equal(r2, r1 + 1);
    assert_get(S("cas/k"), "b", r2);
}

/* The listing is of revision R: a watch from R + 1 reports exactly the changes after it, also
 * those made between the list and the watch's creation. */
static void test_list_revision_then_watch(void **state)
{
    mc_meta_watch_t *w;
    mc_meta_kv_t *kvs;
    size_t n;
    int64_t r, rev;

    (void)state;
    put(S("lw/a"), "1", 0);
    put(S("lw/b"), "2", 0);
    rev = put(S("lw/c"), "3", 0);
    assert_int_equal(mc_meta_list(meta, S("lw/"), &kvs, &n, &r), 0);
    assert_int_equal(r, rev);
    assert_int_equal(n, 3);
    assert_kv(&kvs[0], S("lw/a"), "1", rev - 2);
    assert_kv(&kvs[1], S("lw/b"), "2", rev - 1);
    assert_kv(&kvs[2], S("lw/c"), "3", rev);
    mc_meta_kvs_free(kvs, n);
    /* Between the list and the watch. */
    assert_int_equal(put(S("lw/b"), "2b", 0), r + 1);
    assert_int_equal(mc_meta_delete(meta, S("lw/a"), 0), 0); /* r + 2 */
    assert_int_equal(put(S("lw/d"), "4", 0), r + 3);
    assert_int_equal(put(S("lwx"), "outside", 0), r + 4);
    assert_int_equal(mc_meta_watch_create(meta, S("lw/"), r + 1, &w), 0);
    /* After it. */
    assert_int_equal(mc_meta_delete(meta, S("lw/c"), 0), 0); /* r + 5 */
    assert_int_equal(put(S("lw/e"), "5", 0), r + 6);
    const want_event_t want[] = {
        {MC_META_PUT, "lw/b", "2b", r + 1}, {MC_META_DELETE, "lw/a", "", r + 2},
        {MC_META_PUT, "lw/d", "4", r + 3},  {MC_META_DELETE, "lw/c", "", r + 5},
        {MC_META_PUT, "lw/e", "5", r + 6},
    };
    expect_events(w, want, sizeof(want) / sizeof(want[0]), 500);
    mc_meta_watch_destroy(w);
}

/* ---- list + watch under a concurrent writer: the listing plus the events is the store ---- */

#define CW_KEYS 6
#define CW_OPS  240

static atomic_int cw_done, cw_error;

/* Not cmocka's asserts: they must not jump out of another thread. */
static void *cw_writer(void *arg)
{
    unsigned seed = 12345;

    (void)arg;
    for (int i = 0; i < CW_OPS; i++) {
        char key[16], val[16];
        int k = (int)(rand_r(&seed) % CW_KEYS), len = snprintf(key, sizeof(key), "cw/%d", k), rc;
        if (rand_r(&seed) % 3 == 0) {
            rc = mc_meta_delete(meta, key, (size_t)len, 0);
            rc = rc == -ENOENT ? 0 : rc;
        } else {
            snprintf(val, sizeof(val), "v%d", i);
            rc = mc_meta_put(meta, key, (size_t)len, val, strlen(val), 0, NULL);
        }
        if (rc) {
            atomic_store(&cw_error, rc);
            atomic_store(&cw_done, CW_OPS);
            break;
        }
        atomic_store(&cw_done, i + 1);
    }
    return NULL;
}

static void cw_wait(int ops)
{
    while (atomic_load(&cw_done) < ops)
        etcd_test_sleep_ms(1);
}

typedef struct cw_state {
    char val[CW_KEYS][16];
    int64_t rev[CW_KEYS]; /* 0: absent */
} cw_state_t;

static int cw_index(const mc_meta_kv_t *kv)
{
    assert_true(kv->key_len == 4 && memcmp(kv->key, "cw/", 3) == 0);
    return kv->key[3] - '0';
}

static void cw_load(cw_state_t *st, const mc_meta_kv_t *kvs, size_t n)
{
    memset(st, 0, sizeof(*st));
    for (size_t i = 0; i < n; i++) {
        int k = cw_index(&kvs[i]);
        snprintf(st->val[k], sizeof(st->val[k]), "%s", kvs[i].value);
        st->rev[k] = kvs[i].mod_revision;
    }
}

/* Apply one event: it must be newer than what the state holds for its key (no repeat). */
static void cw_apply(cw_state_t *st, mc_meta_event_t *ev, int64_t listed)
{
    int k = cw_index(&ev->kv);

    assert_true(ev->kv.mod_revision > listed);
    assert_true(ev->kv.mod_revision > st->rev[k]);
    if (ev->type == MC_META_PUT) {
        snprintf(st->val[k], sizeof(st->val[k]), "%s", ev->kv.value);
        st->rev[k] = ev->kv.mod_revision;
    } else {
        st->val[k][0] = '\0';
        st->rev[k] = 0;
    }
    mc_meta_kv_free(&ev->kv);
}

static void test_list_watch_concurrent_writer(void **state)
{
    cw_state_t st, final;
    mc_meta_watch_t *w;
    mc_meta_event_t ev;
    mc_meta_kv_t *kvs;
    pthread_t th;
    size_t n;
    int64_t r;

    (void)state;
    atomic_store(&cw_done, 0);
    atomic_store(&cw_error, 0);
    assert_int_equal(pthread_create(&th, NULL, cw_writer, NULL), 0);
    cw_wait(CW_OPS / 3);
    assert_int_equal(mc_meta_list(meta, S("cw/"), &kvs, &n, &r), 0);
    cw_load(&st, kvs, n);
    mc_meta_kvs_free(kvs, n);
    cw_wait(CW_OPS / 2); /* changes between the list and the watch */
    assert_int_equal(mc_meta_watch_create(meta, S("cw/"), r + 1, &w), 0);
    pthread_join(th, NULL);
    assert_int_equal(atomic_load(&cw_error), 0);
    while (mc_meta_watch_next(w, 1000, &ev) == 0)
        cw_apply(&st, &ev, r);
    mc_meta_watch_destroy(w);
    assert_int_equal(mc_meta_list(meta, S("cw/"), &kvs, &n, NULL), 0);
    cw_load(&final, kvs, n);
    mc_meta_kvs_free(kvs, n);
    for (int k = 0; k < CW_KEYS; k++) {
        assert_string_equal(st.val[k], final.val[k]);
        assert_int_equal(st.rev[k], final.rev[k]);
    }
}

static void test_delete_if_revision(void **state)
{
    char why[128];
    int64_t r1, r2;

    (void)state;
    r1 = put(S("dr/k"), "one", 0);
    r2 = put(S("dr/k"), "two", 0);
    assert_int_equal(mc_meta_delete(meta, S("dr/k"), r1), -MC_ECONFLICT);
    snprintf(why, sizeof(why), "delete of dr/k: mod_revision is %lld, expected %lld", (long long)r2,
             (long long)r1);
    assert_string_equal(mc_last_error(), why);
    assert_get(S("dr/k"), "two", r2); /* kept, and the refusal took no revision: */
    assert_int_equal(next_revision(), r2 + 1);
    assert_int_equal(mc_meta_delete(meta, S("dr/k"), r2 + 100), -MC_ECONFLICT);
    assert_int_equal(mc_meta_delete(meta, S("dr/k"), r2), 0);
    assert_absent(S("dr/k"));
    assert_int_equal(next_revision(), r2 + 3);
    assert_int_equal(mc_meta_delete(meta, S("dr/k"), r2), -ENOENT);
    assert_int_equal(mc_meta_delete(meta, S("dr/k"), 0), -ENOENT);
    assert_int_equal(mc_meta_delete(meta, S("dr/none"), 7), -ENOENT);
}

/* A child of the race: its own handle, released by the pipe's EOF, deletes key if at rev. */
static void race_child(int start_fd, const char *key, int64_t rev)
{
    mc_meta_t *m;
    char c;
    int rc;

    if (mc_meta_open(store_url, &m) != 0)
        _exit(10);
    if (read(start_fd, &c, 1) != 0)
        _exit(11);
    rc = mc_meta_delete(m, key, strlen(key), rev);
    mc_meta_close(m);
    _exit(rc == 0 ? 0 : rc == -ENOENT ? 1 : rc == -MC_ECONFLICT ? 2 : 3);
}

/* Two processes delete the same key at the same revision: one does, the other finds it gone. */
static void test_delete_if_revision_race(void **state)
{
    (void)state;
    for (int round = 0; round < 10; round++) {
        int pipefd[2], status, outcome[2];
        char key[32];
        pid_t pids[2];
        snprintf(key, sizeof(key), "race/%d", round);
        int64_t rev = put(key, strlen(key), "v", 0);
        assert_int_equal(pipe(pipefd), 0);
        for (int i = 0; i < 2; i++) {
            pids[i] = fork();
            assert_true(pids[i] >= 0);
            if (pids[i] == 0) {
                close(pipefd[1]);
                race_child(pipefd[0], key, rev);
            }
        }
        close(pipefd[0]);
        close(pipefd[1]); /* both start at once */
        for (int i = 0; i < 2; i++) {
            assert_int_equal(waitpid(pids[i], &status, 0), pids[i]);
            assert_true(WIFEXITED(status));
            outcome[i] = WEXITSTATUS(status);
        }
        assert_true((outcome[0] == 0 && outcome[1] == 1) || (outcome[0] == 1 && outcome[1] == 0));
        assert_absent(key, strlen(key));
    }
}

static void test_delete_prefix(void **state)
{
    static const char *keep[] = {"dp/a", "dp/ab", "dp/b/1"};
    mc_meta_watch_t *w;
    mc_meta_kv_t *kvs;
    size_t n, deleted = 99;
    int64_t r;

    (void)state;
    for (size_t i = 0; i < 3; i++)
        put(keep[i], strlen(keep[i]), keep[i], 0);
    put(S("dp/a/1"), "x", 0);
    put(S("dp/a/x/y"), "y", 0);
    r = put(S("dp/a/2"), "z", 0);
    assert_int_equal(mc_meta_watch_create(meta, S("dp/"), r + 1, &w), 0);
    assert_int_equal(mc_meta_delete_prefix(meta, S("dp/a/"), &deleted), 0);
    assert_int_equal(deleted, 3);
    assert_int_equal(mc_meta_list(meta, S("dp/"), &kvs, &n, NULL), 0);
    assert_int_equal(n, 3);
    for (size_t i = 0; i < n; i++)
        assert_kv(&kvs[i], keep[i], strlen(keep[i]), keep[i], r - 5 + (int64_t)i);
    mc_meta_kvs_free(kvs, n);
    /* One revision for the three deletions, as etcd's deleterange. */
    const want_event_t want[] = {
        {MC_META_DELETE, "dp/a/1", "", r + 1},
        {MC_META_DELETE, "dp/a/2", "", r + 1},
        {MC_META_DELETE, "dp/a/x/y", "", r + 1},
    };
    expect_events(w, want, 3, 300);
    mc_meta_watch_destroy(w);
    assert_int_equal(next_revision(), r + 2);
    assert_int_equal(mc_meta_delete_prefix(meta, S("dp/a/"), &deleted), 0);
    assert_int_equal(deleted, 0);
    assert_int_equal(mc_meta_delete_prefix(meta, S("dp/"), NULL), 0);
    assert_int_equal(mc_meta_list(meta, S("dp/"), &kvs, &n, NULL), 0);
    assert_int_equal(n, 0);
    mc_meta_kvs_free(kvs, n);
}

/* A prefix ending in 0xff bytes: its range has no simple successor (etcd carries it over). */
static void test_delete_prefix_binary(void **state)
{
    static const struct {
        const char *key;
        size_t len;
    } keys[] = {{S("db/\xfe")}, {S("db/\xff")}, {S("db/\xff\x00")}, {S("db/\xff\xff")}, {S("dc")}};
    mc_meta_kv_t *kvs;
    size_t n, deleted = 0;
    int64_t rev = 0;

    (void)state;
    for (size_t i = 0; i < 5; i++)
        rev = put(keys[i].key, keys[i].len, "v", 0);
    assert_int_equal(mc_meta_delete_prefix(meta, S("db/\xff"), &deleted), 0);
    assert_int_equal(deleted, 3);
    assert_int_equal(mc_meta_list(meta, S("db/"), &kvs, &n, NULL), 0);
    assert_int_equal(n, 1);
    assert_int_equal(kvs[0].key_len, 4);
    assert_memory_equal(kvs[0].key, "db/\xfe", 4);
    mc_meta_kvs_free(kvs, n);
    assert_get(S("dc"), "v", rev);
    assert_int_equal(next_revision(), rev + 2);
}

static void test_lease_expiry(void **state)
{
    mc_meta_watch_t *w;
    mc_meta_event_t ev;
    mc_meta_kv_t *kvs, kv;
    int64_t lease, rput, r, t0;
    size_t n;

    (void)state;
    assert_int_equal(mc_meta_lease_grant(meta, 2, &lease), 0);
    rput = put(S("le/k"), "leased", lease);
    put(S("le/keep"), "kept", 0);
    assert_int_equal(mc_meta_get(meta, S("le/k"), &kv), 0);
    assert_int_equal(kv.lease, lease);
    mc_meta_kv_free(&kv);
    assert_int_equal(mc_meta_watch_create(meta, S("le/"), 0, &w), 0);
    t0 = etcd_test_now_ms();
    assert_int_equal(mc_meta_watch_next(w, 10000, &ev), 0);
    assert_true(etcd_test_now_ms() - t0 >= 500);
    assert_int_equal(ev.type, MC_META_DELETE);
    assert_kv(&ev.kv, S("le/k"), "", ev.kv.mod_revision);
    assert_true(ev.kv.mod_revision > rput + 1);
    assert_absent(S("le/k"));
    assert_int_equal(mc_meta_list(meta, S("le/"), &kvs, &n, &r), 0);
    assert_int_equal(r, ev.kv.mod_revision); /* the expiry was the last change */
    assert_int_equal(n, 1);
    assert_kv(&kvs[0], S("le/keep"), "kept", rput + 1);
    mc_meta_kvs_free(kvs, n);
    mc_meta_kv_free(&ev.kv);
    mc_meta_watch_destroy(w);
    assert_int_equal(mc_meta_lease_keepalive(meta, lease), -ENOENT);
    assert_int_equal(mc_meta_put(meta, S("le/x"), "v", 1, lease, NULL), -ENOENT);
}

static void test_lease_revoke(void **state)
{
    int64_t lease;

    (void)state;
    assert_int_equal(mc_meta_lease_grant(meta, 30, &lease), 0);
    put(S("lr/a"), "1", lease);
    assert_int_equal(mc_meta_lease_keepalive(meta, lease), 0);
    assert_int_equal(mc_meta_lease_revoke(meta, lease), 0);
    assert_absent(S("lr/a"));
    assert_int_equal(mc_meta_lease_revoke(meta, lease), -ENOENT);
}

static void test_meta_key(void **state)
{
    char buf[32];

    (void)state;
    assert_int_equal(mc_meta_key(buf, sizeof(buf), "c1", "segment", "n0"), 22);
    assert_string_equal(buf, "mooncake/c1/segment/n0");
    assert_int_equal(mc_meta_key(buf, sizeof(buf), NULL, "rpc", "n"), 14);
    assert_string_equal(buf, "mooncake/rpc/n");
    assert_int_equal(mc_meta_key(buf, 14, "", "rpc", "n"), -ENAMETOOLONG);
    assert_int_equal(mc_meta_key(buf, sizeof(buf), NULL, NULL, "n"), -EINVAL);
    assert_string_equal(mc_last_error(), "mc_meta_key: kind is NULL");
}

/* ---- the store ---- */

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st, (void)flag, (void)ftw;
    return remove(path);
}

static int group_setup(void **state)
{
    (void)state;
    if (strcmp(backend, "etcd") == 0) {
        etcd_proc_start_or_skip(&etcd, NULL);
        snprintf(store_url, sizeof(store_url), "%s", etcd.url);
    } else {
        strcpy(store_dir, "/tmp/mc-meta-public-XXXXXX");
        assert_non_null(mkdtemp(store_dir));
        snprintf(store_url, sizeof(store_url), "file://%s/store", store_dir);
    }
    return mc_meta_open(store_url, &meta);
}

static int group_teardown(void **state)
{
    (void)state;
    mc_meta_close(meta);
    if (strcmp(backend, "etcd") == 0)
        etcd_proc_stop(&etcd);
    else
        nftw(store_dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    return 0;
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_open_bad_url),
        cmocka_unit_test(test_bad_arguments),
        cmocka_unit_test(test_put_get_binary),
        cmocka_unit_test(test_cas),
        cmocka_unit_test(test_list_revision_then_watch),
        cmocka_unit_test(test_list_watch_concurrent_writer),
        cmocka_unit_test(test_delete_if_revision),
        cmocka_unit_test(test_delete_if_revision_race),
        cmocka_unit_test(test_delete_prefix),
        cmocka_unit_test(test_delete_prefix_binary),
        cmocka_unit_test(test_lease_revoke),
        cmocka_unit_test(test_lease_expiry),
        cmocka_unit_test(test_meta_key),
    };

    backend = argc > 1 ? argv[1] : "file";
    if (strcmp(backend, "file") != 0 && strcmp(backend, "etcd") != 0) {
        fprintf(stderr, "usage: %s [file|etcd]\n", argv[0]);
        return 2;
    }
    return cmocka_run_group_tests_name(backend, tests, group_setup, group_teardown);
}
