/*
 * The P2P store over a real etcd (tests/fixtures/etcd.sh through etcd_proc): publish and fetch
 * across processes, and etcd stopped for seconds in the middle of a fetch: the fetch goes on
 * with the holders it knows and completes, and once etcd is back the fetcher's replica entry
 * is there (the metadata catches up). Skipped (77) without etcd.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <inttypes.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include <mooncake/meta.h>

#include "../metadata/etcd_proc.h"
#include "p2p_test.h"

#define MiB (1ull << 20)
#define KiB (1ull << 10)

static etcd_proc_t etcd;

#define OK(n, ...)                                                                                 \
    do {                                                                                           \
        int ok_rc_ = p2p_node_cmd((n), 20000, __VA_ARGS__);                                        \
        if (ok_rc_)                                                                                \
            fail_msg("command failed (%d): %s", ok_rc_, (n)->reply);                               \
    } while (0)

/* Whether key holds a value containing want within ms (store errors count as "not yet"). */
static int wait_value(const char *key, const char *want, int ms)
{
    uint64_t end = p2p_now_ms() + (uint64_t)ms;
    mc_meta_t *meta = NULL;
    int found = 0;

    do {
        mc_meta_kv_t kv;
        if (!meta && mc_meta_open(etcd.url, &meta))
            meta = NULL;
        if (meta && mc_meta_get(meta, key, strlen(key), &kv) == 0) {
            found = strstr(kv.value, want) != NULL;
            mc_meta_kv_free(&kv);
        }
        if (!found)
            p2p_sleep_ms(100);
    } while (!found && p2p_now_ms() < end);
    mc_meta_close(meta);
    return found;
}

#define STOP(n) assert_int_equal(p2p_node_stop(n), 0)

static void segment_of(p2p_proc_t *n, char *out, size_t size)
{
    OK(n, "segment");
    snprintf(out, size, "%s", n->reply + 3);
}

static void test_publish_fetch(void **state)
{
    const uint64_t size = 3 * MiB + 5;
    p2p_proc_t o, f;
    p2p_result_t r;

    (void)state;
    assert_int_equal(p2p_node_start(&o), 0);
    assert_int_equal(p2p_node_start(&f), 0);
    OK(&o, "publish etcd/basic %" PRIu64 " 31 %llu 2", size, 64 * KiB);
    OK(&f, "fetch etcd/basic %" PRIu64 " 1", size);
    assert_int_equal(p2p_node_wait(&f, 60000, &r), 0);
    assert_int_equal(r.rc, 0);
    OK(&f, "check 31");
    OK(&o, "stat etcd/basic");
    assert_string_equal(o.reply, "ok 3145733 49 2 2");
    STOP(&f);
    STOP(&o);
}

/* etcd killed 0.5 s into a 2 s fetch: the fetch completes while etcd is down, from the
 * holders it knows; once etcd is started again (same data) the fetcher's entry, complete, is
 * there: put again by the engine, which kept it when the put failed. */
static void test_etcd_outage(void **state)
{
    const uint64_t size = 16 * MiB;
    char seg[128], key[512];
    p2p_proc_t o, f;
    p2p_result_t r;

    (void)state;
    assert_int_equal(p2p_node_start(&o), 0);
    assert_int_equal(p2p_node_start(&f), 0);
    segment_of(&f, seg, sizeof(seg));
    snprintf(key, sizeof(key), "mooncake/p2p/etcd/outage/replica/%s", seg);
    OK(&o, "publish etcd/outage %" PRIu64 " 41 %llu 1", size, 64 * KiB);
    OK(&f, "fetch etcd/outage %" PRIu64 " 1 rate=%llu timeout=20000", size, 8 * MiB);
    p2p_sleep_ms(500);
    etcd_proc_kill(&etcd, SIGKILL);
    uint64_t down = p2p_now_ms();
    assert_int_equal(p2p_node_wait(&f, 10000, &r), 0);
    print_message("fetch done %.1f s into the outage: rc %d\n",
                  (double)(p2p_now_ms() - down) / 1000, r.rc);
    assert_int_equal(r.rc, 0);
    OK(&f, "check 41");
    assert_true(p2p_now_ms() - down < 8000); /* the fetch did not wait for etcd */
    assert_int_equal(etcd_proc_restart(&etcd), 0);
    assert_true(wait_value(key, "\"complete\":true", 15000));
    STOP(&f);
    STOP(&o);
}

static int setup(void **state)
{
    (void)state;
    setenv("MC_METADATA", etcd.url, 1);
    setenv("MC_METADATA_TTL", "10", 1); /* outlives the outage: the lease survives it */
    setenv("MC_LOG_LEVEL", "error", 1); /* the engines retry loudly while etcd is down */
    p2p_test_dir();
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_publish_fetch, p2p_node_cleanup),
        cmocka_unit_test_teardown(test_etcd_outage, p2p_node_cleanup),
    };
    int rc = etcd_proc_start(&etcd, NULL);

    if (rc == 77) {
        fprintf(stderr, "etcd not installed: skipped\n");
        return 77;
    }
    if (rc) {
        fprintf(stderr, "cannot start etcd\n");
        return 1;
    }
    rc = cmocka_run_group_tests(tests, setup, NULL);
    etcd_proc_stop(&etcd);
    return rc;
}
