/* Keys hosts put on the engine's lease (mc_engine_publish), against a real etcd: they vanish
 * with the process that put them, come back when the lease is lost and granted anew, survive
 * etcd restarting, and go on unpublish. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cmocka.h>

#include <mooncake/engine.h>

#include "etcd_proc.h"
#include "metadata/meta.h"

static etcd_proc_t etcd;
static mc_meta_t *meta;

static mc_engine_t *engine_on(const char *url)
{
    mc_config_t *cfg;
    mc_engine_t *e = NULL;

    assert_int_equal(mc_config_create(&cfg), 0);
    assert_int_equal(mc_config_set(cfg, "METADATA", url), 0);
    assert_int_equal(mc_config_set(cfg, "LISTEN", "127.0.0.1:0"), 0);
    assert_int_equal(mc_config_set(cfg, "METADATA_TTL", "2"), 0);
    assert_int_equal(mc_config_set(cfg, "LOG_LEVEL", "off"), 0);
    assert_int_equal(mc_engine_create(cfg, &e), 0);
    mc_config_destroy(cfg);
    return e;
}

/* Wait up to ms for key to hold want (NULL: to be absent). */
static int wait_key(const char *key, const char *want, int ms)
{
    int64_t end = etcd_test_now_ms() + ms;

    do {
        mc_meta_kv_t kv;
        int rc = mc__meta_get(meta, key, strlen(key), &kv);
        int match = want ? rc == 0 && !strcmp(kv.value, want) : rc == -ENOENT;

        if (rc == 0)
            mc__meta_kv_free(&kv);
        if (match)
            return 1;
        etcd_test_sleep_ms(50);
    } while (etcd_test_now_ms() < end);
    return 0;
}

static int64_t key_lease(const char *key)
{
    mc_meta_kv_t kv;
    int64_t lease;

    assert_int_equal(mc__meta_get(meta, key, strlen(key), &kv), 0);
    lease = kv.lease;
    mc__meta_kv_free(&kv);
    return lease;
}

static void test_publish_replace_unpublish(void **state)
{
    mc_engine_t *e = engine_on(etcd.url);
    const char *k = "mooncake/test/pub/a";

    (void)state;
    assert_int_equal(mc_engine_publish(e, k, "one", 3), 0);
    assert_true(wait_key(k, "one", 0));
    assert_true(key_lease(k) != 0);
    assert_int_equal(mc_engine_publish(e, k, "two", 3), 0);
    assert_true(wait_key(k, "two", 0));
    assert_int_equal(mc_engine_unpublish(e, k), 0);
    assert_true(wait_key(k, NULL, 0));
    assert_int_equal(mc_engine_unpublish(e, k), -ENOENT);
    assert_non_null(strstr(mc_last_error(), "was not published by this engine"));
    assert_int_equal(mc_engine_publish(e, "", "x", 1), -EINVAL);
    mc_engine_destroy(e); /* revokes the lease */
}

/* A key etcd refuses (a value past its request limit) is not kept: the publisher does not put
 * it again forever, and the host's other keys go on as ever. A key published before keeps the
 * value the store has, and can still be withdrawn. */
static void test_refused_key(void **state)
{
    mc_engine_t *e = engine_on(etcd.url);
    const char *k = "mooncake/test/pub/big", *ok = "mooncake/test/pub/fine";
    size_t big = 3u << 20;
    char *v = malloc(big);
    int rc;

    (void)state;
    memset(v, 'v', big);
    rc = mc_engine_publish(e, k, v, big);
    print_message("  a %zu-byte value: %d (%s)\n", big, rc, mc_last_error());
    assert_true(rc < 0);
    assert_true(rc != -MC_EMETA && rc != -MC_ETIMEOUT && rc != -ECONNREFUSED && rc != -EAGAIN);
    assert_int_equal(mc_engine_unpublish(e, k), -ENOENT); /* not kept */
    assert_int_equal(mc_engine_publish(e, ok, "v", 1), 0);
    assert_true(wait_key(ok, "v", 0));
    assert_int_equal(mc_engine_publish(e, ok, v, big), rc);
    assert_true(wait_key(ok, "v", 0));
    assert_int_equal(mc_engine_unpublish(e, ok), 0);
    assert_true(wait_key(ok, NULL, 0));
    free(v);
    mc_engine_destroy(e);
}

static void test_no_metadata(void **state)
{
    mc_engine_t *e = engine_on("none");

    (void)state;
    assert_int_equal(mc_engine_publish(e, "mooncake/test/x", "1", 1), -ENOTSUP);
    assert_non_null(strstr(mc_last_error(), "METADATA=none"));
    mc_engine_destroy(e);
}

/* The lease is revoked behind the engine's back (what an etcd that lost its data does to it):
 * the engine notices at its next keepalive, takes a new lease and puts the key again. */
static void test_lease_lost(void **state)
{
    mc_engine_t *e = engine_on(etcd.url);
    const char *k = "mooncake/test/pub/lost";
    int64_t old;

    (void)state;
    assert_int_equal(mc_engine_publish(e, k, "v", 1), 0);
    old = key_lease(k);
    assert_int_equal(mc__meta_lease_revoke(meta, old), 0);
    assert_true(wait_key(k, NULL, 0));
    assert_true(wait_key(k, "v", 5000)); /* keepalive every ttl/3, then re-grant + put */
    assert_true(key_lease(k) != old);
    mc_engine_destroy(e);
    assert_true(wait_key(k, NULL, 0));
}

/* etcd killed and started again (same data) while the key is published: it is there after. */
static void test_etcd_restart(void **state)
{
    mc_engine_t *e = engine_on(etcd.url);
    const char *k = "mooncake/test/pub/restart";

    (void)state;
    assert_int_equal(mc_engine_publish(e, k, "v", 1), 0);
    etcd_proc_kill(&etcd, SIGKILL);
    etcd_test_sleep_ms(3000); /* longer than the TTL: the lease may expire meanwhile */
    assert_int_equal(etcd_proc_restart(&etcd), 0);
    assert_true(wait_key(k, "v", 10000));
    mc_engine_destroy(e);
}

/* Registrations more often than every ttl/3 (a registration cache, per-shard registrations):
 * every one makes the descriptor dirty, and a put under the lease does not keep it alive, so
 * the keepalive must go out all the same. Before, the keys expired every TTL (2 s here). */
static void test_keepalive_under_churn(void **state)
{
    mc_engine_t *e = engine_on(etcd.url);
    const char *k = "mooncake/test/pub/churn";
    static char buf[4096];

    (void)state;
    assert_int_equal(mc_engine_publish(e, k, "v", 1), 0);
    for (int64_t end = etcd_test_now_ms() + 7000; etcd_test_now_ms() < end;) {
        assert_int_equal(mc_mem_register(e, buf, sizeof(buf), "cpu:0"), 0);
        etcd_test_sleep_ms(50);
        assert_int_equal(mc_mem_unregister(e, buf), 0);
        etcd_test_sleep_ms(50);
        if (!wait_key(k, "v", 0))
            fail_msg("the key expired after %lld ms of registrations",
                     (long long)(7000 - (end - etcd_test_now_ms())));
    }
    mc_engine_destroy(e);
}

/* An unpublish while the store does not answer fails with its error, and the engine deletes
 * the key once it is back (its lease lives on: the engine keeps it alive). Before, the key was
 * forgotten at the failed delete and stayed as long as the process; a second unpublish said
 * -ENOENT. */
static void test_unpublish_while_down(void **state)
{
    mc_engine_t *e = engine_on(etcd.url);
    const char *k = "mooncake/test/pub/down";

    (void)state;
    assert_int_equal(mc_engine_publish(e, k, "v", 1), 0);
    etcd_proc_kill(&etcd, SIGKILL);
    int rc = mc_engine_unpublish(e, k);
    assert_true(rc < 0 && rc != -ENOENT);
    assert_int_equal(etcd_proc_restart(&etcd), 0);
    assert_true(wait_key(k, NULL, 10000));
    assert_int_equal(mc_engine_unpublish(e, k), -ENOENT); /* taken back for good */
    mc_engine_destroy(e);
}

/* A process that published a key and is killed: the key vanishes with its lease. */
static void test_process_death(void **state)
{
    const char *k = "mooncake/test/pub/dead";
    int pipefd[2];
    char c;
    pid_t pid;

    (void)state;
    assert_int_equal(pipe(pipefd), 0);
    pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) { /* no thread of ours has started yet: safe to go on after fork */
        mc_engine_t *e = engine_on(etcd.url);
        if (mc_engine_publish(e, k, "alive", 5) == 0 && write(pipefd[1], "k", 1) == 1)
            pause();
        _exit(1);
    }
    close(pipefd[1]);
    assert_int_equal(read(pipefd[0], &c, 1), 1);
    close(pipefd[0]);
    assert_true(wait_key(k, "alive", 0));
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    assert_true(wait_key(k, NULL, 6000)); /* TTL 2 s */
}

static int group_setup(void **state)
{
    (void)state;
    etcd_proc_start_or_skip(&etcd, NULL);
    setenv("MC_ETCD_TIMEOUT_MS", "2000", 1);
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
        cmocka_unit_test(test_no_metadata),
        cmocka_unit_test(test_process_death),
        cmocka_unit_test(test_publish_replace_unpublish),
        cmocka_unit_test(test_refused_key),
        cmocka_unit_test(test_lease_lost),
        cmocka_unit_test(test_etcd_restart),
        cmocka_unit_test(test_keepalive_under_churn),
        cmocka_unit_test(test_unpublish_while_down),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
