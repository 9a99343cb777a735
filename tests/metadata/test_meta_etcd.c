/* The metadata interface through the etcd:// backend, against a real etcd (tests/fixtures). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cmocka.h>

#include <mooncake/error.h>

#include "etcd_proc.h"
#include "metadata/meta.h"
#include "metadata/meta_etcd_int.h"

static etcd_proc_t etcd;
static mc_meta_t *meta;

static int64_t put_str(const char *key, const char *val, int64_t lease)
{
    int64_t rev = -1;

    assert_int_equal(mc__meta_put(meta, key, strlen(key), val, strlen(val), lease, &rev), 0);
    assert_true(rev > 0);
    return rev;
}

static void assert_value(const void *key, size_t klen, const char *val)
{
    mc_meta_kv_t kv;

    assert_int_equal(mc__meta_get(meta, key, klen, &kv), 0);
    assert_int_equal(kv.value_len, strlen(val));
    assert_memory_equal(kv.value, val, kv.value_len);
    assert_int_equal(kv.key_len, klen);
    assert_memory_equal(kv.key, key, klen);
    mc__meta_kv_free(&kv);
}

static void test_base64(void **state)
{
    unsigned char buf[300];
    void *out;
    size_t len;

    (void)state;
    for (size_t i = 0; i < sizeof(buf); i++)
        buf[i] = (unsigned char)(i * 37 + 11);
    for (size_t n = 0; n <= sizeof(buf); n++) {
        char *s = mc__etcd_b64_encode(buf, n);
        assert_non_null(s);
        assert_int_equal(strlen(s), (n + 2) / 3 * 4);
        assert_int_equal(mc__etcd_b64_decode(s, &out, &len), 0);
        assert_int_equal(len, n);
        assert_memory_equal(out, buf, n);
        free(out);
        free(s);
    }
    char *s = mc__etcd_b64_encode("\xff\xfe", 2);
    assert_string_equal(s, "//4=");
    free(s);
    assert_int_equal(mc__etcd_b64_decode("YQ", &out, &len), -EINVAL);
    assert_int_equal(mc__etcd_b64_decode("Y=Q=", &out, &len), -EINVAL);
    assert_int_equal(mc__etcd_b64_decode("YQ==YQ==", &out, &len), -EINVAL);
    assert_int_equal(mc__etcd_b64_decode("-_==", &out, &len), -EINVAL);
}

static void test_prefix_range(void **state)
{
    static const struct {
        const char *prefix;
        size_t len;
        const char *end;
        size_t end_len;
    } cases[] = {
        {"ab", 2, "ac", 2},   {"a\xff", 2, "b", 1}, {"a\xff\xff", 3, "b", 1},
        {"\xff", 1, "\0", 1}, {"", 0, "\0", 1},     {"a\xfe", 2, "a\xff", 2},
    };
    (void)state;
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char *k, *e;
        void *end;
        size_t len;
        assert_int_equal(mc__etcd_prefix_range(cases[i].prefix, cases[i].len, &k, &e), 0);
        assert_int_equal(mc__etcd_b64_decode(e, &end, &len), 0);
        assert_int_equal(len, cases[i].end_len);
        assert_memory_equal(end, cases[i].end, len);
        free(end);
        free(k);
        free(e);
    }
}

static void test_put_get_delete(void **state)
{
    mc_meta_kv_t kv;
    int64_t r1, r2;

    (void)state;
    r1 = put_str("pgd/a", "one", 0);
    assert_value("pgd/a", 5, "one");
    r2 = put_str("pgd/a", "two", 0);
    assert_true(r2 > r1);
    assert_int_equal(mc__meta_get(meta, "pgd/a", 5, &kv), 0);
    assert_int_equal(kv.mod_revision, r2);
    assert_int_equal(kv.lease, 0);
    mc__meta_kv_free(&kv);
    assert_int_equal(mc__meta_del(meta, "pgd/a", 5), 0);
    assert_int_equal(mc__meta_get(meta, "pgd/a", 5, &kv), -ENOENT);
    assert_int_equal(mc__meta_del(meta, "pgd/a", 5), -ENOENT);
    /* An empty value is a value. */
    assert_int_equal(mc__meta_put(meta, "pgd/e", 5, "", 0, 0, NULL), 0);
    assert_value("pgd/e", 5, "");
}

static void test_binary_keys_and_list(void **state)
{
    static const char *keys[] = {"bin/\x00z",     "bin/a\xff", "bin/a\xff\xff",
                                 "bin/a\xff\x01", "bin/b",     "bin/\xff\xff"};
    static const size_t lens[] = {6, 6, 7, 7, 5, 6};
    mc_meta_kv_t *kvs;
    size_t n;

    (void)state;
    put_str("bim", "outside", 0);
    put_str("bio", "outside", 0);
    for (int i = 0; i < 6; i++)
        assert_int_equal(mc__meta_put(meta, keys[i], lens[i], keys[i], lens[i], 0, NULL), 0);
    for (int i = 0; i < 6; i++) {
        mc_meta_kv_t kv;
        assert_int_equal(mc__meta_get(meta, keys[i], lens[i], &kv), 0);
        assert_int_equal(kv.value_len, lens[i]);
        assert_memory_equal(kv.value, keys[i], lens[i]);
        mc__meta_kv_free(&kv);
    }
    assert_int_equal(mc__meta_list(meta, "bin/", 4, &kvs, &n), 0);
    assert_int_equal(n, 6);
    for (size_t i = 1; i < n; i++) { /* sorted by bytes */
        size_t m = kvs[i - 1].key_len < kvs[i].key_len ? kvs[i - 1].key_len : kvs[i].key_len;
        int c = memcmp(kvs[i - 1].key, kvs[i].key, m);
        assert_true(c < 0 || (c == 0 && kvs[i - 1].key_len < kvs[i].key_len));
    }
    mc__meta_kvs_free(kvs, n);
    /* A prefix ending in 0xff: its range end carries over. */
    assert_int_equal(mc__meta_list(meta, "bin/a\xff", 6, &kvs, &n), 0);
    assert_int_equal(n, 3);
    mc__meta_kvs_free(kvs, n);
    assert_int_equal(mc__meta_list(meta, "bin/\xff", 5, &kvs, &n), 0);
    assert_int_equal(n, 1);
    assert_int_equal(kvs[0].key_len, 6);
    mc__meta_kvs_free(kvs, n);
    assert_int_equal(mc__meta_list(meta, "nothing/", 8, &kvs, &n), 0);
    assert_int_equal(n, 0);
    mc__meta_kvs_free(kvs, n);
    /* The empty prefix lists everything. */
    assert_int_equal(mc__meta_list(meta, "", 0, &kvs, &n), 0);
    assert_true(n >= 8);
    mc__meta_kvs_free(kvs, n);
}

static void test_cas(void **state)
{
    int64_t r1, r2, r3;

    (void)state;
    assert_int_equal(mc__meta_cas(meta, "cas/k", 5, 0, "a", 1, 0, &r1), 0);
    assert_int_equal(mc__meta_cas(meta, "cas/k", 5, 0, "b", 1, 0, &r2), -MC_ECONFLICT);
    assert_non_null(strstr(mc_last_error(), "mod_revision is"));
    assert_int_equal(mc__meta_cas(meta, "cas/k", 5, r1 + 1000, "b", 1, 0, &r2), -MC_ECONFLICT);
    assert_int_equal(mc__meta_cas(meta, "cas/k", 5, r1, "b", 1, 0, &r2), 0);
    assert_true(r2 > r1);
    assert_int_equal(mc__meta_cas(meta, "cas/k", 5, r1, "c", 1, 0, &r3), -MC_ECONFLICT);
    assert_value("cas/k", 5, "b");
}

/* Two processes race for the same absent key, round after round: exactly one wins each. */
static void test_cas_race_processes(void **state)
{
    enum { ROUNDS = 20 };
    pid_t pids[2];
    int pipes[2][2];

    (void)state;
    for (int p = 0; p < 2; p++) {
        assert_int_equal(pipe(pipes[p]), 0);
        pids[p] = fork();
        assert_true(pids[p] >= 0);
        if (pids[p] == 0) {
            mc_meta_t *m;
            char key[32];
            if (mc__meta_open(etcd.url, NULL, &m))
                _exit(2);
            for (int r = 0; r < ROUNDS; r++) {
                snprintf(key, sizeof(key), "race/%d", r);
                int rc = mc__meta_cas(m, key, strlen(key), 0, p ? "1" : "0", 1, 0, NULL);
                char c = rc == 0 ? 'W' : rc == -MC_ECONFLICT ? 'L' : 'E';
                if (write(pipes[p][1], &c, 1) != 1)
                    _exit(3);
            }
            mc__meta_close(m);
            _exit(0);
        }
        close(pipes[p][1]);
    }
    char res[2][ROUNDS];
    for (int p = 0; p < 2; p++) {
        int st;
        size_t got = 0;
        ssize_t n;
        while (got < ROUNDS && (n = read(pipes[p][0], res[p] + got, ROUNDS - got)) > 0)
            got += (size_t)n;
        assert_int_equal(got, ROUNDS);
        close(pipes[p][0]);
        assert_int_equal(waitpid(pids[p], &st, 0), pids[p]);
        assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    }
    for (int r = 0; r < ROUNDS; r++) {
        char key[32];
        mc_meta_kv_t kv;
        assert_true((res[0][r] == 'W') != (res[1][r] == 'W'));
        assert_true(res[0][r] != 'E' && res[1][r] != 'E');
        snprintf(key, sizeof(key), "race/%d", r);
        assert_int_equal(mc__meta_get(meta, key, strlen(key), &kv), 0);
        assert_int_equal(kv.value[0], res[0][r] == 'W' ? '0' : '1');
        mc__meta_kv_free(&kv);
    }
}

static void test_large_values(void **state)
{
    size_t ok = 1400 * 1024, big = 2 * 1024 * 1024;
    char *v = malloc(big);
    mc_meta_kv_t kv;

    (void)state;
    for (size_t i = 0; i < big; i++)
        v[i] = (char)(i * 131 + (i >> 13));
    assert_int_equal(mc__meta_put(meta, "big/ok", 6, v, ok, 0, NULL), 0);
    assert_int_equal(mc__meta_get(meta, "big/ok", 6, &kv), 0);
    assert_int_equal(kv.value_len, ok);
    assert_memory_equal(kv.value, v, ok);
    mc__meta_kv_free(&kv);
    assert_int_equal(mc__meta_put(meta, "big/no", 6, v, big, 0, NULL), -EMSGSIZE);
    assert_non_null(strstr(mc_last_error(), "max-request-bytes"));
    assert_int_equal(mc__meta_put(meta, "big/no", 6, v, 1600 * 1024, 0, NULL), -EMSGSIZE);
    assert_non_null(strstr(mc_last_error(), "too large"));
    assert_int_equal(mc__meta_cas(meta, "big/no", 6, 0, v, big, 0, NULL), -EMSGSIZE);
    free(v);
}

static void next_event(mc_meta_watch_t *w, int timeout_ms, mc_meta_event_type_t type,
                       const char *key, const char *val)
{
    mc_meta_event_t ev;

    assert_int_equal(mc__meta_watch_next(w, timeout_ms, &ev), 0);
    assert_int_equal(ev.type, type);
    assert_int_equal(ev.kv.key_len, strlen(key));
    assert_memory_equal(ev.kv.key, key, ev.kv.key_len);
    if (val) {
        assert_int_equal(ev.kv.value_len, strlen(val));
        assert_memory_equal(ev.kv.value, val, ev.kv.value_len);
    }
    assert_true(ev.kv.mod_revision > 0);
    mc__meta_kv_free(&ev.kv);
}

static void test_lease_expiry_seen_by_watch(void **state)
{
    mc_meta_watch_t *w;
    mc_meta_kv_t kv;
    int64_t lease, t0;

    (void)state;
    assert_int_equal(mc__meta_lease_grant(meta, 2, &lease), 0);
    assert_int_equal(mc__meta_watch_create(meta, "lease/", 6, 0, &w), 0);
    put_str("lease/k", "v", lease);
    next_event(w, 5000, MC_META_PUT, "lease/k", "v");
    assert_int_equal(mc__meta_get(meta, "lease/k", 7, &kv), 0);
    assert_int_equal(kv.lease, lease);
    mc__meta_kv_free(&kv);
    for (int i = 0; i < 3; i++) { /* kept alive past its TTL */
        etcd_test_sleep_ms(1000);
        assert_int_equal(mc__meta_lease_keepalive(meta, lease), 0);
    }
    assert_int_equal(mc__meta_get(meta, "lease/k", 7, &kv), 0);
    mc__meta_kv_free(&kv);
    t0 = etcd_test_now_ms();
    next_event(w, 8000, MC_META_DELETE, "lease/k", NULL); /* expires once left alone */
    assert_true(etcd_test_now_ms() - t0 >= 1000);
    assert_int_equal(mc__meta_get(meta, "lease/k", 7, &kv), -ENOENT);
    assert_int_equal(mc__meta_lease_keepalive(meta, lease), -ENOENT);
    assert_int_equal(mc__meta_put(meta, "lease/x", 7, "v", 1, lease, NULL), -ENOENT);
    mc__meta_watch_destroy(w);
}

static void test_lease_revoke(void **state)
{
    mc_meta_kv_t kv;
    int64_t lease;

    (void)state;
    assert_int_equal(mc__meta_lease_grant(meta, 30, &lease), 0);
    assert_true(lease > (int64_t)1 << 53 || lease > 0); /* ids beyond 2^53 survive parsing */
    put_str("rv/a", "1", lease);
    put_str("rv/b", "2", lease);
    assert_int_equal(mc__meta_lease_revoke(meta, lease), 0);
    assert_int_equal(mc__meta_get(meta, "rv/a", 4, &kv), -ENOENT);
    assert_int_equal(mc__meta_get(meta, "rv/b", 4, &kv), -ENOENT);
    assert_int_equal(mc__meta_lease_revoke(meta, lease), -ENOENT);
    assert_int_equal(mc__meta_lease_keepalive(meta, lease), -ENOENT);
}

static void test_watch_history_and_timeout(void **state)
{
    mc_meta_watch_t *w;
    mc_meta_event_t ev;
    int64_t r1;

    (void)state;
    r1 = put_str("wh/a", "1", 0);
    put_str("wh/b", "2", 0);
    put_str("whx", "outside", 0);
    assert_int_equal(mc__meta_del(meta, "wh/a", 4), 0);
    assert_int_equal(mc__meta_watch_create(meta, "wh/", 3, r1, &w), 0);
    next_event(w, 5000, MC_META_PUT, "wh/a", "1");
    next_event(w, 5000, MC_META_PUT, "wh/b", "2");
    next_event(w, 5000, MC_META_DELETE, "wh/a", NULL);
    int64_t t0 = etcd_test_now_ms();
    assert_int_equal(mc__meta_watch_next(w, 300, &ev), -ETIMEDOUT);
    assert_true(etcd_test_now_ms() - t0 >= 250);
    assert_int_equal(mc__meta_watch_next(w, 0, &ev), -ETIMEDOUT);
    put_str("wh/c", "3", 0);
    next_event(w, 5000, MC_META_PUT, "wh/c", "3");
    /* A big event arrives in many pieces. */
    size_t big = 1000 * 1024;
    char *v = malloc(big + 1);
    memset(v, 'q', big);
    v[big] = '\0';
    put_str("wh/big", v, 0);
    next_event(w, 5000, MC_META_PUT, "wh/big", v);
    free(v);
    mc__meta_watch_destroy(w);
}

static void test_failover_and_down(void **state)
{
    char url[256];
    mc_meta_t *m;
    mc_meta_kv_t kv;
    int64_t t0;

    (void)state;
    put_str("fo/k", "v", 0);
    /* Port 1 refuses connections: the second endpoint answers. */
    snprintf(url, sizeof(url), "etcd://127.0.0.1:1,%s", etcd.endpoint);
    assert_int_equal(mc__meta_open(url, NULL, &m), 0);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(mc__meta_get(m, "fo/k", 4, &kv), 0);
        mc__meta_kv_free(&kv);
    }
    mc__meta_close(m);
    /* Nothing answers: a prompt, clear error. */
    assert_int_equal(mc__meta_open("etcd://127.0.0.1:1,127.0.0.1:2", NULL, &m), 0);
    t0 = etcd_test_now_ms();
    assert_int_equal(mc__meta_get(m, "fo/k", 4, &kv), -MC_EMETA);
    assert_true(etcd_test_now_ms() - t0 < 3000);
    assert_non_null(strstr(mc_last_error(), "127.0.0.1:2"));
    mc_meta_watch_t *w;
    assert_int_equal(mc__meta_watch_create(m, "fo/", 3, 0, &w), -MC_EMETA);
    mc__meta_close(m);
}

static void test_open_errors(void **state)
{
    mc_meta_t *m;

    (void)state;
    assert_int_equal(mc__meta_open("etcd://", NULL, &m), -EINVAL);
    assert_int_equal(mc__meta_open("etcd://host", NULL, &m), -EINVAL);
    assert_int_equal(mc__meta_open("etcd://127.0.0.1:2379,,", NULL, &m), -EINVAL);
    assert_int_equal(mc__meta_open("etcd://:2379", NULL, &m), -EINVAL);
    setenv("MC_ETCD_USER", "root", 1);
    assert_int_equal(mc__meta_open(etcd.url, NULL, &m), -MC_ECONFIG);
    assert_non_null(strstr(mc_last_error(), "MC_ETCD_PASSWORD"));
    unsetenv("MC_ETCD_USER");
    setenv("MC_ETCD_CERT", "/etc/hostname", 1);
    assert_int_equal(mc__meta_open(etcd.url, NULL, &m), -MC_ECONFIG);
    assert_non_null(strstr(mc_last_error(), "MC_ETCD_KEY"));
    unsetenv("MC_ETCD_CERT");
    setenv("MC_ETCD_CACERT", "/nonexistent/ca.pem", 1);
    assert_int_equal(mc__meta_open(etcd.url, NULL, &m), -MC_ECONFIG);
    assert_non_null(strstr(mc_last_error(), "MC_ETCD_CACERT"));
    unsetenv("MC_ETCD_CACERT");
    setenv("MC_ETCD_TIMEOUT_MS", "5", 1);
    assert_int_equal(mc__meta_open(etcd.url, NULL, &m), -MC_ECONFIG);
    unsetenv("MC_ETCD_TIMEOUT_MS");
    assert_int_equal(mc__meta_open(etcd.url, NULL, &m), 0);
    mc__meta_close(m);
}

static int group_setup(void **state)
{
    (void)state;
    etcd_proc_start_or_skip(&etcd, NULL);
    return mc__meta_open(etcd.url, NULL, &meta);
}

static int group_teardown(void **state)
{
    (void)state;
    mc__meta_close(meta);
    etcd_proc_stop(&etcd);
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_base64),
        cmocka_unit_test(test_prefix_range),
        cmocka_unit_test(test_put_get_delete),
        cmocka_unit_test(test_binary_keys_and_list),
        cmocka_unit_test(test_cas),
        cmocka_unit_test(test_cas_race_processes),
        cmocka_unit_test(test_large_values),
        cmocka_unit_test(test_lease_expiry_seen_by_watch),
        cmocka_unit_test(test_lease_revoke),
        cmocka_unit_test(test_watch_history_and_timeout),
        cmocka_unit_test(test_failover_and_down),
        cmocka_unit_test(test_open_errors),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
