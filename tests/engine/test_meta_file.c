/* The metadata interface through the file:// backend: each test gets a fresh store directory. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* nftw */
#endif
#include <errno.h>
#include <ftw.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#include <mooncake/error.h>

#include "metadata/meta.h"
#include "metadata/meta_file_int.h"

typedef struct fixture {
    char dir[64];
    char url[128];
    mc_meta_t *meta;
} fixture_t;

static int64_t now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void sleep_ms(int ms)
{
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000};

    nanosleep(&ts, NULL);
}

static int setup(void **state)
{
    fixture_t *fx = calloc(1, sizeof(*fx));

    strcpy(fx->dir, "/tmp/mc-meta-test-XXXXXX");
    assert_non_null(mkdtemp(fx->dir));
    /* A nested path: open must create the missing directories. */
    snprintf(fx->url, sizeof(fx->url), "file://%s/a/b/store", fx->dir);
    assert_int_equal(mc__meta_open(fx->url, NULL, &fx->meta), 0);
    *state = fx;
    return 0;
}

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st, (void)flag, (void)ftw;
    return remove(path);
}

static int teardown(void **state)
{
    fixture_t *fx = *state;

    mc__meta_close(fx->meta);
    nftw(fx->dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    free(fx);
    return 0;
}

static int64_t put_str(mc_meta_t *meta, const char *key, const char *val, int64_t lease)
{
    int64_t rev = -1;

    assert_int_equal(mc__meta_put(meta, key, strlen(key), val, strlen(val), lease, &rev), 0);
    assert_true(rev > 0);
    return rev;
}

static void assert_value(mc_meta_t *meta, const void *key, size_t key_len, const char *want,
                         int64_t want_rev)
{
    mc_meta_kv_t kv;

    assert_int_equal(mc__meta_get(meta, key, key_len, &kv), 0);
    assert_int_equal(kv.key_len, key_len);
    assert_memory_equal(kv.key, key, key_len);
    assert_int_equal(kv.value_len, strlen(want));
    assert_string_equal(kv.value, want);
    assert_int_equal(kv.mod_revision, want_rev);
    mc__meta_kv_free(&kv);
}

static void assert_absent(mc_meta_t *meta, const char *key)
{
    mc_meta_kv_t kv;

    assert_int_equal(mc__meta_get(meta, key, strlen(key), &kv), -ENOENT);
}

static void test_put_get_overwrite_delete(void **state)
{
    mc_meta_t *meta = ((fixture_t *)*state)->meta;
    int64_t r1 = put_str(meta, "k1", "v1", 0);
    int64_t r2;

    assert_int_equal(r1, 1);
    assert_value(meta, "k1", 2, "v1", 1);
    r2 = put_str(meta, "k1", "value two", 0);
    assert_int_equal(r2, 2);
    assert_value(meta, "k1", 2, "value two", 2);
    assert_int_equal(mc__meta_del(meta, "k1", 2), 0);
    assert_absent(meta, "k1");
    assert_int_equal(mc__meta_del(meta, "k1", 2), -ENOENT);
    /* The delete took revision 3. */
    assert_int_equal(put_str(meta, "k2", "", 0), 4);
    assert_value(meta, "k2", 2, "", 4);
    assert_int_equal(mc__meta_put(meta, "", 0, "x", 1, 0, NULL), -EINVAL);
}

static void test_revisions_increase(void **state)
{
    mc_meta_t *meta = ((fixture_t *)*state)->meta;
    int64_t prev = 0;

    for (int i = 0; i < 20; i++) {
        char key[16];
        snprintf(key, sizeof(key), "r/%d", i % 3);
        int64_t rev = put_str(meta, key, "x", 0);
        assert_int_equal(rev, prev + 1);
        prev = rev;
    }
    assert_value(meta, "r/1", 3, "x", 20); /* last written by i = 19 */
}

static const struct {
    const char *key;
    size_t len;
} binary_keys[] = {
    /* In raw byte order, which list must reproduce. */
    {"\x00\x01", 2}, {"a\x00z", 3},     {"ab", 2}, {"ab\x00", 3},
    {"ab\xff", 3},   {"ab\xff\xff", 4}, {"ac", 2}, {"\xff", 1},
};
#define NBINARY (sizeof(binary_keys) / sizeof(binary_keys[0]))

static void test_binary_keys(void **state)
{
    mc_meta_t *meta = ((fixture_t *)*state)->meta;
    mc_meta_kv_t *kvs;
    size_t n;

    /* Put in reverse so that the directory order is unlikely to be the sorted order. */
    for (size_t i = NBINARY; i-- > 0;) {
        char val[24];
        snprintf(val, sizeof(val), "v%zu", i);
        assert_int_equal(
            mc__meta_put(meta, binary_keys[i].key, binary_keys[i].len, val, strlen(val), 0, NULL),
            0);
    }
    for (size_t i = 0; i < NBINARY; i++) {
        char val[8];
        snprintf(val, sizeof(val), "v%zu", i);
        assert_value(meta, binary_keys[i].key, binary_keys[i].len, val, (int64_t)(NBINARY - i));
    }
    assert_int_equal(mc__meta_list(meta, "", 0, &kvs, &n), 0);
    assert_int_equal(n, NBINARY);
    for (size_t i = 0; i < NBINARY; i++) {
        assert_int_equal(kvs[i].key_len, binary_keys[i].len);
        assert_memory_equal(kvs[i].key, binary_keys[i].key, binary_keys[i].len);
    }
    mc__meta_kvs_free(kvs, n);
    /* "ab" lists ab, ab\0, ab\xff, ab\xff\xff but not ac. */
    assert_int_equal(mc__meta_list(meta, "ab", 2, &kvs, &n), 0);
    assert_int_equal(n, 4);
    for (size_t i = 0; i < n; i++)
        assert_memory_equal(kvs[i].key, binary_keys[2 + i].key, binary_keys[2 + i].len);
    mc__meta_kvs_free(kvs, n);
    assert_int_equal(mc__meta_list(meta, "ab\xff", 3, &kvs, &n), 0);
    assert_int_equal(n, 2);
    assert_string_equal(kvs[0].value, "v4");
    assert_string_equal(kvs[1].value, "v5");
    mc__meta_kvs_free(kvs, n);
}

static void test_list_prefix(void **state)
{
    mc_meta_t *meta = ((fixture_t *)*state)->meta;
    mc_meta_kv_t *kvs;
    size_t n;

    put_str(meta, "ac/1", "c1", 0);
    put_str(meta, "ab/2", "b2", 0);
    put_str(meta, "ab/1", "b1", 0);
    put_str(meta, "a", "a", 0);
    assert_int_equal(mc__meta_list(meta, "ab", 2, &kvs, &n), 0);
    assert_int_equal(n, 2);
    assert_string_equal(kvs[0].key, "ab/1");
    assert_string_equal(kvs[0].value, "b1");
    assert_int_equal(kvs[0].mod_revision, 3);
    assert_string_equal(kvs[1].key, "ab/2");
    assert_int_equal(kvs[1].mod_revision, 2);
    mc__meta_kvs_free(kvs, n);
    assert_int_equal(mc__meta_list(meta, NULL, 0, &kvs, &n), 0);
    assert_int_equal(n, 4);
    assert_string_equal(kvs[0].key, "a");
    assert_string_equal(kvs[3].key, "ac/1");
    mc__meta_kvs_free(kvs, n);
    assert_int_equal(mc__meta_list(meta, "zz", 2, &kvs, &n), 0);
    assert_int_equal(n, 0);
    mc__meta_kvs_free(kvs, n);
}

static void test_cas(void **state)
{
    mc_meta_t *meta = ((fixture_t *)*state)->meta;
    int64_t rev, rev2;

    assert_int_equal(mc__meta_cas(meta, "c", 1, 0, "one", 3, 0, &rev), 0);
    assert_int_equal(rev, 1);
    assert_int_equal(mc__meta_cas(meta, "c", 1, 0, "two", 3, 0, &rev2), -MC_ECONFLICT);
    assert_true(strlen(mc_last_error()) > 0);
    assert_int_equal(mc__meta_cas(meta, "c", 1, rev + 5, "two", 3, 0, &rev2), -MC_ECONFLICT);
    assert_int_equal(mc__meta_cas(meta, "d", 1, 1, "two", 3, 0, &rev2), -MC_ECONFLICT);
    assert_value(meta, "c", 1, "one", 1);
    assert_int_equal(mc__meta_cas(meta, "c", 1, rev, "two", 3, 0, &rev2), 0);
    assert_int_equal(rev2, 2);
    assert_value(meta, "c", 1, "two", 2);
    assert_int_equal(mc__meta_del(meta, "c", 1), 0);
    assert_int_equal(mc__meta_cas(meta, "c", 1, 0, "three", 5, 0, NULL), 0);
    assert_value(meta, "c", 1, "three", 4);
}

/* Child of the CAS race: open its own store, wait for the start signal, try to create key. */
static void cas_child(const char *url, int start_fd, const char *key, const char *me)
{
    mc_meta_t *meta;
    char c;
    int rc;

    if (mc__meta_open(url, NULL, &meta) != 0)
        _exit(3);
    if (read(start_fd, &c, 1) != 0)
        _exit(4);
    rc = mc__meta_cas(meta, key, strlen(key), 0, me, strlen(me), 0, NULL);
    mc__meta_close(meta);
    _exit(rc == 0 ? 0 : rc == -MC_ECONFLICT ? 1 : 2);
}

static void cas_race_round(fixture_t *fx, int round)
{
    char key[32], winner[8];
    int pipefd[2], status, wins = 0, losses = 0;
    pid_t pids[2];

    snprintf(key, sizeof(key), "race/%d", round);
    assert_int_equal(pipe(pipefd), 0);
    for (int i = 0; i < 2; i++) {
        char me[8];
        snprintf(me, sizeof(me), "child%d", i);
        pids[i] = fork();
        assert_true(pids[i] >= 0);
        if (pids[i] == 0) {
            close(pipefd[1]);
            cas_child(fx->url, pipefd[0], key, me);
        }
    }
    close(pipefd[0]);
    close(pipefd[1]); /* both children see EOF at once */
    for (int i = 0; i < 2; i++) {
        assert_int_equal(waitpid(pids[i], &status, 0), pids[i]);
        assert_true(WIFEXITED(status));
        assert_true(WEXITSTATUS(status) <= 1);
        if (WEXITSTATUS(status) == 0) {
            snprintf(winner, sizeof(winner), "child%d", i);
            wins++;
        } else {
            losses++;
        }
    }
    assert_int_equal(wins, 1);
    assert_int_equal(losses, 1);
    assert_value(fx->meta, key, strlen(key), winner, round + 1);
}

static void test_cas_race_processes(void **state)
{
    fixture_t *fx = *state;

    for (int round = 0; round < 50; round++)
        cas_race_round(fx, round);
}

/* Threads increment one counter with get + CAS; no increment may be lost. */
#define NTHREADS 4
#define NINCR    40

static void *incr_thread(void *arg)
{
    mc_meta_t *meta = arg;

    for (int done = 0; done < NINCR;) {
        mc_meta_kv_t kv;
        char val[16];
        assert_int_equal(mc__meta_get(meta, "ctr", 3, &kv), 0);
        snprintf(val, sizeof(val), "%d", atoi(kv.value) + 1);
        int rc = mc__meta_cas(meta, "ctr", 3, kv.mod_revision, val, strlen(val), 0, NULL);
        mc__meta_kv_free(&kv);
        assert_true(rc == 0 || rc == -MC_ECONFLICT);
        done += rc == 0;
    }
    return NULL;
}

static void test_cas_threads(void **state)
{
    mc_meta_t *meta = ((fixture_t *)*state)->meta;
    pthread_t th[NTHREADS];
    char want[16];
    mc_meta_kv_t kv;

    put_str(meta, "ctr", "0", 0);
    for (int i = 0; i < NTHREADS; i++)
        assert_int_equal(pthread_create(&th[i], NULL, incr_thread, meta), 0);
    for (int i = 0; i < NTHREADS; i++)
        pthread_join(th[i], NULL);
    snprintf(want, sizeof(want), "%d", NTHREADS * NINCR);
    assert_int_equal(mc__meta_get(meta, "ctr", 3, &kv), 0);
    assert_string_equal(kv.value, want);
    assert_int_equal(kv.mod_revision, 1 + NTHREADS * NINCR);
    mc__meta_kv_free(&kv);
}

static void test_large_value(void **state)
{
    mc_meta_t *meta = ((fixture_t *)*state)->meta;
    size_t len = 16u << 20;
    char *val = malloc(len);
    mc_meta_kv_t kv;

    for (size_t i = 0; i < len; i++)
        val[i] = (char)(i * 7 + (i >> 13));
    assert_int_equal(mc__meta_put(meta, "big", 3, val, len, 0, NULL), 0);
    assert_int_equal(mc__meta_get(meta, "big", 3, &kv), 0);
    assert_int_equal(kv.value_len, len);
    assert_memory_equal(kv.value, val, len);
    assert_int_equal(kv.value[len], '\0');
    mc__meta_kv_free(&kv);
    free(val);
}

/* Poll get() until key is absent; returns the ms waited, or -1 after limit_ms. */
static int64_t wait_absent(mc_meta_t *meta, const char *key, int64_t limit_ms)
{
    int64_t start = now_ms();
    mc_meta_kv_t kv;

    while (now_ms() - start < limit_ms) {
        if (mc__meta_get(meta, key, strlen(key), &kv) == -ENOENT)
            return now_ms() - start;
        mc__meta_kv_free(&kv);
        sleep_ms(50);
    }
    return -1;
}

static void test_lease_expiry(void **state)
{
    mc_meta_t *meta = ((fixture_t *)*state)->meta;
    int64_t lease, waited;
    mc_meta_kv_t *kvs;
    size_t n;

    assert_int_equal(mc__meta_lease_grant(meta, 1, &lease), 0);
    assert_true(lease > 0);
    int64_t rev = put_str(meta, "l/a", "A", lease);
    put_str(meta, "l/b", "B", 0);
    mc_meta_kv_t kv;
    assert_int_equal(mc__meta_get(meta, "l/a", 3, &kv), 0);
    assert_int_equal(kv.lease, lease);
    assert_int_equal(kv.mod_revision, rev);
    mc__meta_kv_free(&kv);
    waited = wait_absent(meta, "l/a", 3000);
    assert_true(waited >= 500 && waited < 2000);
    assert_int_equal(mc__meta_list(meta, "l/", 2, &kvs, &n), 0);
    assert_int_equal(n, 1);
    assert_string_equal(kvs[0].key, "l/b");
    mc__meta_kvs_free(kvs, n);
    assert_int_equal(mc__meta_lease_keepalive(meta, lease), -ENOENT);
    assert_int_equal(mc__meta_put(meta, "l/c", 3, "C", 1, lease, NULL), -ENOENT);
    /* The reaping deleted l/a with revision 3, so the next put gets 4. */
    assert_int_equal(put_str(meta, "l/d", "D", 0), 4);
}

static void test_lease_keepalive(void **state)
{
    mc_meta_t *meta = ((fixture_t *)*state)->meta;
    int64_t lease;

    assert_int_equal(mc__meta_lease_grant(meta, 1, &lease), 0);
    int64_t rev = put_str(meta, "k/a", "A", lease);
    for (int i = 0; i < 8; i++) { /* 2 s in all, twice the TTL */
        sleep_ms(250);
        assert_int_equal(mc__meta_lease_keepalive(meta, lease), 0);
    }
    assert_value(meta, "k/a", 3, "A", rev);
    assert_int_equal(mc__meta_lease_revoke(meta, lease), 0);
    assert_absent(meta, "k/a");
}

static void test_lease_revoke(void **state)
{
    mc_meta_t *meta = ((fixture_t *)*state)->meta;
    int64_t l1, l2;
    mc_meta_kv_t *kvs;
    size_t n;

    assert_int_equal(mc__meta_lease_grant(meta, 60, &l1), 0);
    assert_int_equal(mc__meta_lease_grant(meta, 60, &l2), 0);
    assert_true(l1 != l2);
    put_str(meta, "v/1", "1", l1);
    put_str(meta, "v/2", "2", l1);
    put_str(meta, "v/3", "3", l2);
    put_str(meta, "v/4", "4", 0);
    assert_int_equal(mc__meta_lease_revoke(meta, l1), 0);
    assert_int_equal(mc__meta_list(meta, "v/", 2, &kvs, &n), 0);
    assert_int_equal(n, 2);
    assert_string_equal(kvs[0].key, "v/3");
    assert_int_equal(kvs[0].lease, l2);
    assert_string_equal(kvs[1].key, "v/4");
    assert_int_equal(kvs[1].lease, 0);
    mc__meta_kvs_free(kvs, n);
    assert_int_equal(mc__meta_lease_revoke(meta, l1), -ENOENT);
    assert_int_equal(mc__meta_lease_keepalive(meta, l1), -ENOENT);
    assert_int_equal(mc__meta_lease_keepalive(meta, l2), 0);
    /* Two deletions: revisions 5 and 6. */
    assert_int_equal(put_str(meta, "v/5", "5", 0), 7);
}

static void next_event(mc_meta_watch_t *w, int timeout_ms, mc_meta_event_type_t type,
                       const char *key, const char *value, int64_t rev)
{
    mc_meta_event_t ev;

    assert_int_equal(mc__meta_watch_next(w, timeout_ms, &ev), 0);
    assert_int_equal(ev.type, type);
    assert_string_equal(ev.kv.key, key);
    assert_int_equal(ev.kv.key_len, strlen(key));
    assert_string_equal(ev.kv.value, value);
    assert_int_equal(ev.kv.mod_revision, rev);
    mc__meta_kv_free(&ev.kv);
}

static void test_watch_put_delete(void **state)
{
    mc_meta_t *meta = ((fixture_t *)*state)->meta;
    mc_meta_watch_t *w;
    mc_meta_event_t ev;

    put_str(meta, "w/old", "o", 0); /* before the watch: not reported */
    assert_int_equal(mc__meta_watch_create(meta, "w/", 2, 0, &w), 0);
    put_str(meta, "w/b", "B", 0); /* rev 2 */
    put_str(meta, "x/b", "X", 0); /* rev 3, outside the prefix */
    put_str(meta, "w/a", "A", 0); /* rev 4 */
    next_event(w, 1000, MC_META_PUT, "w/b", "B", 2);
    next_event(w, 1000, MC_META_PUT, "w/a", "A", 4);
    assert_int_equal(mc__meta_del(meta, "w/b", 3), 0); /* rev 5 */
    next_event(w, 1000, MC_META_DELETE, "w/b", "", 5);
    put_str(meta, "w/a", "A2", 0); /* rev 6 */
    next_event(w, 1000, MC_META_PUT, "w/a", "A2", 6);
    assert_int_equal(mc__meta_watch_next(w, 0, &ev), -ETIMEDOUT);
    mc__meta_watch_destroy(w);
}

static void test_watch_start_revision(void **state)
{
    mc_meta_t *meta = ((fixture_t *)*state)->meta;
    mc_meta_watch_t *w;
    mc_meta_event_t ev;

    put_str(meta, "s/1", "one", 0);
    put_str(meta, "s/3", "three", 0);
    put_str(meta, "s/2", "two", 0);
    assert_int_equal(mc__meta_watch_create(meta, "s/", 2, 2, &w), 0);
    next_event(w, 0, MC_META_PUT, "s/3", "three", 2);
    next_event(w, 0, MC_META_PUT, "s/2", "two", 3);
    assert_int_equal(mc__meta_watch_next(w, 50, &ev), -ETIMEDOUT);
    mc__meta_watch_destroy(w);
}

static void test_watch_timeout(void **state)
{
    mc_meta_t *meta = ((fixture_t *)*state)->meta;
    mc_meta_watch_t *w;
    mc_meta_event_t ev;
    int64_t start;

    put_str(meta, "t/1", "x", 0);
    assert_int_equal(mc__meta_watch_create(meta, "t/", 2, 0, &w), 0);
    start = now_ms();
    assert_int_equal(mc__meta_watch_next(w, 300, &ev), -ETIMEDOUT);
    assert_in_range(now_ms() - start, 290, 1000);
    mc__meta_watch_destroy(w);
}

static void test_watch_lease_expiry(void **state)
{
    mc_meta_t *meta = ((fixture_t *)*state)->meta;
    mc_meta_watch_t *w;
    mc_meta_event_t ev;
    int64_t lease, start;

    assert_int_equal(mc__meta_lease_grant(meta, 1, &lease), 0);
    put_str(meta, "e/a", "A", lease); /* rev 1 */
    put_str(meta, "e/b", "B", 0);     /* rev 2 */
    assert_int_equal(mc__meta_watch_create(meta, "e/", 2, 0, &w), 0);
    start = now_ms();
    /* Nobody else touches the store: the watch itself must notice and reap (rev 3). */
    next_event(w, 3000, MC_META_DELETE, "e/a", "", 3);
    assert_in_range(now_ms() - start, 500, 2000);
    assert_int_equal(mc__meta_watch_next(w, 0, &ev), -ETIMEDOUT);
    mc__meta_watch_destroy(w);
}

static void *delayed_put(void *arg)
{
    sleep_ms(200);
    put_str(arg, "d/k", "late", 0);
    return NULL;
}

/* A blocked watch_next wakes for a put from another thread well before its timeout. */
static void test_watch_wakes(void **state)
{
    mc_meta_t *meta = ((fixture_t *)*state)->meta;
    mc_meta_watch_t *w;
    pthread_t th;
    int64_t start;

    assert_int_equal(mc__meta_watch_create(meta, "d/", 2, 0, &w), 0);
    start = now_ms();
    assert_int_equal(pthread_create(&th, NULL, delayed_put, meta), 0);
    next_event(w, 5000, MC_META_PUT, "d/k", "late", 1);
    assert_in_range(now_ms() - start, 150, 1500);
    pthread_join(th, NULL);
    mc__meta_watch_destroy(w);
}

/* A process that dies without revoking its lease loses its keys once the TTL runs out. */
static void test_dead_process_keys_vanish(void **state)
{
    fixture_t *fx = *state;
    mc_meta_kv_t kv;
    int status;
    pid_t pid = fork();

    assert_true(pid >= 0);
    if (pid == 0) {
        mc_meta_t *meta;
        int64_t lease;
        if (mc__meta_open(fx->url, NULL, &meta) != 0 ||
            mc__meta_lease_grant(meta, 1, &lease) != 0 ||
            mc__meta_put(meta, "dead/k", 6, "bye", 3, lease, NULL) != 0)
            _exit(1);
        _exit(0); /* no close, no revoke: as if it crashed */
    }
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    assert_int_equal(mc__meta_get(fx->meta, "dead/k", 6, &kv), 0);
    assert_string_equal(kv.value, "bye");
    mc__meta_kv_free(&kv);
    assert_in_range(wait_absent(fx->meta, "dead/k", 3000), 1, 2000);
}

static void test_key_too_long(void **state)
{
    mc_meta_t *meta = ((fixture_t *)*state)->meta;
    char key[300];
    mc_meta_kv_t kv;

    memset(key, 'k', sizeof(key));
    assert_int_equal(mc__meta_put(meta, key, sizeof(key), "v", 1, 0, NULL), -ENAMETOOLONG);
    assert_int_equal(mc__meta_get(meta, key, sizeof(key), &kv), -ENAMETOOLONG);
    /* 200 plain bytes fit in one file name. */
    assert_int_equal(mc__meta_put(meta, key, 200, "v", 1, 0, NULL), 0);
    assert_value(meta, key, 200, "v", 1);
}

static void test_open_errors(void **state)
{
    fixture_t *fx = *state;
    mc_meta_t *meta = NULL;

    (void)fx;
    assert_int_equal(mc__meta_open("nope:///tmp/x", NULL, &meta), -EINVAL);
    assert_non_null(strstr(mc_last_error(), "nope"));
    assert_int_equal(mc__meta_open("file://relative/dir", NULL, &meta), -EINVAL);
    assert_non_null(strstr(mc_last_error(), "absolute"));
    assert_int_equal(mc__meta_open("file://", NULL, &meta), -EINVAL);
    assert_int_equal(mc__meta_open("/tmp/no-scheme", NULL, &meta), -EINVAL);
    assert_int_equal(mc__meta_open("://x", NULL, &meta), -EINVAL);
    assert_null(meta);
}

/* A second handle on the same directory sees the first one's data and revisions. */
static void test_reopen_shares_store(void **state)
{
    fixture_t *fx = *state;
    mc_meta_t *other;

    put_str(fx->meta, "shared", "yes", 0);
    assert_int_equal(mc__meta_open(fx->url, NULL, &other), 0);
    assert_value(other, "shared", 6, "yes", 1);
    assert_int_equal(put_str(other, "shared", "again", 0), 2);
    assert_value(fx->meta, "shared", 6, "again", 2);
    mc__meta_close(other);
}

static void test_meta_key(void **state)
{
    char buf[64];

    (void)state;
    assert_int_equal(mc__meta_key(buf, sizeof(buf), "c1", "segment", "node-0"),
                     (int)strlen("mooncake/c1/segment/node-0"));
    assert_string_equal(buf, "mooncake/c1/segment/node-0");
    assert_int_equal(mc__meta_key(buf, sizeof(buf), NULL, "segment", "node-0"),
                     (int)strlen("mooncake/segment/node-0"));
    assert_string_equal(buf, "mooncake/segment/node-0");
    assert_int_equal(mc__meta_key(buf, sizeof(buf), "", "rpc", "n"), 14);
    assert_string_equal(buf, "mooncake/rpc/n");
    /* Exactly fitting (14 chars + NUL) works; one byte less does not. */
    assert_int_equal(mc__meta_key(buf, 15, NULL, "rpc", "n"), 14);
    assert_int_equal(mc__meta_key(buf, 14, NULL, "rpc", "n"), -ENAMETOOLONG);
}

/* The deletion log stays bounded: past MC_META_FILE_DELLOG_MAX it keeps its newer half. A watch
 * from a revision it still covers gets each deletion at its own revision; one from before its
 * floor still gets every live key and the deletions the log kept. */
static void test_dellog_bounded(void **state)
{
    fixture_t *fx = *state;
    mc_meta_t *meta = fx->meta;
    char key[224], path[256];
    struct stat st;
    mc_meta_watch_t *w;
    mc_meta_event_t ev;
    int64_t rev = 0, r_recent = 0;
    int i, n = (int)(MC_META_FILE_DELLOG_MAX / 200) + 200; /* lines of ~210 bytes */

    memset(key, 'k', sizeof(key));
    for (i = 0; i < n; i++) {
        int len = snprintf(key, sizeof(key), "g/%06d-", i);
        key[len] = 'k'; /* the rest of the 200-byte key stays 'k' */
        assert_int_equal(mc__meta_put(meta, key, 200, "v", 1, 0, NULL), 0);
        assert_int_equal(mc_meta_delete(meta, key, 200, 0), 0);
    }
    snprintf(path, sizeof(path), "%s/a/b/store/dellog", fx->dir);
    assert_int_equal(stat(path, &st), 0);
    assert_true((size_t)st.st_size <= MC_META_FILE_DELLOG_MAX);
    assert_true((size_t)st.st_size >= MC_META_FILE_DELLOG_MAX / 3);
    rev = put_str(meta, "g/live", "L", 0); /* 2n + 1 */
    assert_int_equal(rev, 2 * n + 1);
    /* The last deletion is at 2n; a watch from 2n - 1 sees it there, and the live key's put. */
    r_recent = 2 * n - 1;
    assert_int_equal(mc_meta_watch_create(meta, "g/", 2, r_recent, &w), 0);
    assert_int_equal(mc_meta_watch_next(w, 1000, &ev), 0);
    assert_int_equal(ev.type, MC_META_DELETE);
    assert_int_equal(ev.kv.mod_revision, 2 * n);
    snprintf(key, sizeof(key), "g/%06d-", n - 1);
    assert_memory_equal(ev.kv.key, key, strlen(key));
    assert_int_equal(ev.kv.key_len, 200);
    mc_meta_kv_free(&ev.kv);
    next_event(w, 1000, MC_META_PUT, "g/live", "L", rev);
    assert_int_equal(mc_meta_watch_next(w, 0, &ev), -ETIMEDOUT);
    mc_meta_watch_destroy(w);
    /* From revision 1: the oldest deletions are gone from the log (a warning says so). */
    assert_int_equal(mc_meta_watch_create(meta, "g/", 2, 1, &w), 0);
    for (i = 0; mc_meta_watch_next(w, 0, &ev) == 0; i++) {
        assert_true(ev.type == MC_META_PUT || ev.kv.mod_revision > 2);
        mc_meta_kv_free(&ev.kv);
    }
    assert_true(i > 1 && i < n);
    mc_meta_watch_destroy(w);
}

/* delete_prefix removes a key whose lease is dead too, without counting it: it was absent. */
static void test_delete_prefix_dead_lease(void **state)
{
    mc_meta_t *meta = ((fixture_t *)*state)->meta;
    mc_meta_file_t *f = MC_META_FILE(meta);
    char lease_name[32];
    int64_t lease;
    size_t deleted = 99;

    assert_int_equal(mc__meta_lease_grant(meta, 60, &lease), 0);
    put_str(meta, "q/dead", "d", lease); /* 1 */
    put_str(meta, "q/live", "l", 0);     /* 2 */
    put_str(meta, "qx", "outside", 0);   /* 3 */
    /* The lease's file is gone, as after a crash of its owner before any reaping. */
    snprintf(lease_name, sizeof(lease_name), "%lld", (long long)lease);
    assert_int_equal(unlinkat(f->leases_fd, lease_name, 0), 0);
    assert_int_equal(mc_meta_delete_prefix(meta, "q/", 2, &deleted), 0);
    assert_int_equal(deleted, 1);
    assert_absent(meta, "q/live");
    assert_value(meta, "qx", 2, "outside", 3);
    assert_int_equal(put_str(meta, "q/new", "n", 0), 5); /* the deletion took one revision: 4 */
}

#define T(f) cmocka_unit_test_setup_teardown(f, setup, teardown)

int main(void)
{
    const struct CMUnitTest tests[] = {
        T(test_put_get_overwrite_delete),
        T(test_revisions_increase),
        T(test_binary_keys),
        T(test_list_prefix),
        T(test_cas),
        T(test_cas_race_processes),
        T(test_cas_threads),
        T(test_large_value),
        T(test_lease_expiry),
        T(test_lease_keepalive),
        T(test_lease_revoke),
        T(test_watch_put_delete),
        T(test_watch_start_revision),
        T(test_watch_timeout),
        T(test_watch_lease_expiry),
        T(test_watch_wakes),
        T(test_dead_process_keys_vanish),
        T(test_key_too_long),
        T(test_open_errors),
        T(test_reopen_shares_store),
        T(test_dellog_bounded),
        T(test_delete_prefix_dead_lease),
        cmocka_unit_test(test_meta_key),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
