/*
 * The P2P store between real processes on one machine (file:// store, every engine on
 * 127.0.0.1:0): bytes identical after publish and fetch, replicas serving the next fetchers,
 * holders dying or lying mid-fetch, and the errors callers see.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <cmocka.h>

#include <mooncake/engine.h>
#include <mooncake/error.h>
#include <mooncake/meta.h>
#include <mooncake/p2p.h>

#include "p2p_pattern.h"
#include "p2p_test.h"

#define MiB (1ull << 20)
#define KiB (1ull << 10)

#define CMD_MS   20000
#define FETCH_MS 60000

/* A command that must succeed; the node's reply in the failure message otherwise. */
#define OK(n, ...)                                                                                 \
    do {                                                                                           \
        int ok_rc_ = p2p_node_cmd((n), CMD_MS, __VA_ARGS__);                                       \
        if (ok_rc_)                                                                                \
            fail_msg("command failed (%d): %s", ok_rc_, (n)->reply);                               \
    } while (0)

/* A command that must fail with code. */
#define FAILS(code, n, ...)                                                                        \
    do {                                                                                           \
        int f_rc_ = p2p_node_cmd((n), CMD_MS, __VA_ARGS__);                                        \
        if (f_rc_ != (code))                                                                       \
            fail_msg("expected %d, got %d: %s", (code), f_rc_, (n)->reply);                        \
    } while (0)

/* Stop a node that must exit cleanly. */
#define STOP(n) assert_int_equal(p2p_node_stop(n), 0)

static void start(p2p_proc_t *n)
{
    assert_int_equal(p2p_node_start(n), 0);
}

static p2p_result_t wait_fetch(p2p_proc_t *n)
{
    p2p_result_t r;
    int rc = p2p_node_wait(n, FETCH_MS, &r);

    if (rc)
        fail_msg("wait: %d: %s", rc, n->reply);
    return r;
}

/* Fetch name into n's memory (nbufs buffers) with options, wait, check every byte. */
static p2p_result_t fetch_check(p2p_proc_t *n, const char *name, uint64_t size, unsigned nbufs,
                                uint64_t seed, const char *opts)
{
    p2p_result_t r;

    OK(n, "fetch %s %" PRIu64 " %u %s", name, size, nbufs, opts);
    r = wait_fetch(n);
    if (r.rc)
        fail_msg("fetch %s failed: %d", name, r.rc);
    OK(n, "check %" PRIu64, seed);
    return r;
}

/* ---- bytes ---- */

/* Sizes that are no multiple of the shard size, one shard, a one-byte object, 1000+ shards,
 * buffers cut differently on both sides, both orders; with the engine's choice of transport
 * (on one host: shared memory) and over tcp. */
static void same_bytes(const char *protocol)
{
    static const struct {
        uint64_t size, shard;
        unsigned origin_bufs, fetch_bufs;
        const char *opts;
    } cases[] = {
        {5000, 4 * KiB, 1, 1, ""},
        {1, 4 * KiB, 1, 1, ""},
        {100000, 1 * MiB, 2, 1, ""},
        {3 * MiB + 123, 64 * KiB, 3, 2, "random=1"},
        {4 * MiB + 77, 4 * KiB, 2, 3, "inflight=16"},
        {2 * MiB, 64 * KiB, 4, 4, "inflight=1"},
    };
    p2p_proc_t o, f;

    setenv("MC_PROTOCOL", protocol, 1);
    start(&o);
    start(&f);
    unsetenv("MC_PROTOCOL");
    for (unsigned i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        uint64_t seed = 100 + i;
        char name[32];
        snprintf(name, sizeof(name), "same/%s/%u", protocol, i);
        OK(&o, "publish %s %" PRIu64 " %" PRIu64 " %" PRIu64 " %u", name, cases[i].size, seed,
           cases[i].shard, cases[i].origin_bufs);
        p2p_result_t r =
            fetch_check(&f, name, cases[i].size, cases[i].fetch_bufs, seed, cases[i].opts);
        assert_int_equal(r.shards, (cases[i].size - 1) / cases[i].shard + 1);
        assert_int_equal(r.from_origin, cases[i].size);
        OK(&f, "delete %s", name);
        OK(&o, "unregister %s 0", name);
    }
    STOP(&f);
    STOP(&o);
}

static void test_identical(void **state)
{
    (void)state;
    same_bytes("auto");
}

static void test_identical_tcp(void **state)
{
    (void)state;
    same_bytes("tcp");
}

/* ---- replicas ---- */

/* Fetchers of the second generation take what the first one holds, not the origin's. */
static void test_second_generation(void **state)
{
    const uint64_t size = 8 * MiB;
    p2p_proc_t o, a, b, c;

    (void)state;
    start(&o);
    start(&a);
    start(&b);
    start(&c);
    OK(&o, "publish gen %" PRIu64 " 7 %llu 1", size, 64 * KiB);
    fetch_check(&a, "gen", size, 1, 7, "");
    OK(&b, "fetch gen %" PRIu64 " 2", size);
    OK(&c, "fetch gen %" PRIu64 " 1", size);
    p2p_result_t rb = wait_fetch(&b), rc = wait_fetch(&c);
    assert_int_equal(rb.rc, 0);
    assert_int_equal(rc.rc, 0);
    OK(&b, "check 7");
    OK(&c, "check 7");
    print_message("b: origin %" PRIu64 " replicas %" PRIu64 "; c: origin %" PRIu64
                  " replicas %" PRIu64 "\n",
                  rb.from_origin, rb.from_replicas, rc.from_origin, rc.from_replicas);
    assert_true(rb.from_replicas > 0 && rc.from_replicas > 0);
    assert_true(rb.from_origin < rb.from_replicas && rc.from_origin < rc.from_replicas);
    assert_int_equal(rb.from_origin + rb.from_replicas, size);
    OK(&o, "stat gen");
    assert_string_equal(o.reply, "ok 8388608 128 4 4");
    STOP(&c);
    STOP(&b);
    STOP(&a);
    STOP(&o);
}

/* Fetchers that start together feed each other: each shard is served as soon as it is
 * verified, not when the whole object is. */
static void test_feed_each_other(void **state)
{
    const uint64_t size = 8 * MiB;
    p2p_proc_t o, n[3];
    uint64_t replicas = 0;

    (void)state;
    start(&o);
    OK(&o, "publish together %" PRIu64 " 11 %llu 1", size, 64 * KiB);
    for (int i = 0; i < 3; i++)
        start(&n[i]);
    for (int i = 0; i < 3; i++) /* 4 MiB/s each: about two seconds side by side */
        OK(&n[i], "fetch together %" PRIu64 " 1 rate=%llu", size, 4 * MiB);
    for (int i = 0; i < 3; i++) {
        p2p_result_t r = wait_fetch(&n[i]);
        assert_int_equal(r.rc, 0);
        OK(&n[i], "check 11");
        replicas += r.from_replicas;
        print_message("fetcher %d: origin %" PRIu64 " replicas %" PRIu64 "\n", i, r.from_origin,
                      r.from_replicas);
    }
    assert_true(replicas > 0);
    for (int i = 0; i < 3; i++)
        STOP(&n[i]);
    STOP(&o);
}

/* With --no-p2p's option only the origin serves, replicas or not. */
static void test_origin_only(void **state)
{
    const uint64_t size = 2 * MiB;
    p2p_proc_t o, a, b;

    (void)state;
    start(&o);
    start(&a);
    start(&b);
    OK(&o, "publish solo %" PRIu64 " 3 %llu 1", size, 64 * KiB);
    fetch_check(&a, "solo", size, 1, 3, "");
    p2p_result_t r = fetch_check(&b, "solo", size, 1, 3, "origin_only=1 no_serve=1");
    assert_int_equal(r.from_replicas, 0);
    assert_int_equal(r.from_origin, size);
    OK(&o, "stat solo");
    assert_string_equal(o.reply, "ok 2097152 32 2 2"); /* b serves nobody */
    STOP(&b);
    STOP(&a);
    STOP(&o);
}

/* A shard size past the object (and past JSON's signed integers): one shard, readable. (A test
 * node holds one object: nodes of its own.) */
static void test_one_shard(void **state)
{
    p2p_proc_t o, a;

    (void)state;
    start(&o);
    start(&a);
    OK(&o, "publish onebig 65536 4 9223372036854775808 1");
    fetch_check(&a, "onebig", 65536, 1, 4, "");
    OK(&o, "stat onebig");
    assert_non_null(strstr(o.reply, "ok 65536 1 "));
    STOP(&a);
    STOP(&o);
}

/* ---- faults ---- */

/* The origin dies once a complete replica exists: the others complete from replicas. */
static void test_origin_killed(void **state)
{
    const uint64_t size = 4 * MiB;
    p2p_proc_t o, a, b, c;

    (void)state;
    start(&o);
    start(&a);
    start(&b);
    start(&c);
    OK(&o, "publish orphan %" PRIu64 " 5 %llu 1", size, 64 * KiB);
    fetch_check(&a, "orphan", size, 1, 5, "");
    p2p_node_kill(&o);
    OK(&b, "fetch orphan %" PRIu64 " 1", size);
    OK(&c, "fetch orphan %" PRIu64 " 3 random=1", size);
    p2p_result_t rb = wait_fetch(&b), rc = wait_fetch(&c);
    assert_int_equal(rb.rc, 0);
    assert_int_equal(rc.rc, 0);
    OK(&b, "check 5");
    OK(&c, "check 5");
    assert_int_equal(rb.from_replicas, size);
    assert_int_equal(rc.from_replicas, size);
    STOP(&c);
    STOP(&b);
    STOP(&a);
}

/* The replica a fetch reads from dies mid-fetch: the fetch completes elsewhere. */
static void test_replica_killed(void **state)
{
    const uint64_t size = 16 * MiB;
    p2p_proc_t o, a, b;
    uint64_t from_a = 0;

    (void)state;
    start(&o);
    start(&a);
    start(&b);
    OK(&o, "publish victim %" PRIu64 " 9 %llu 1", size, 64 * KiB);
    fetch_check(&a, "victim", size, 1, 9, "");
    OK(&b, "fetch victim %" PRIu64 " 1 rate=%llu inflight=4", size, 6 * MiB); /* ~2.7 s */
    for (int i = 0; i < 100 && from_a < 2 * MiB; i++) {
        p2p_sleep_ms(50);
        OK(&b, "progress");
        assert_int_equal(sscanf(b.reply, "ok %*u %*u %" SCNu64, &from_a), 1);
    }
    assert_true(from_a >= 2 * MiB);
    p2p_node_kill(&a);
    p2p_result_t r = wait_fetch(&b);
    print_message("origin %" PRIu64 " replicas %" PRIu64 " retries %u\n", r.from_origin,
                  r.from_replicas, r.retries);
    assert_int_equal(r.rc, 0);
    OK(&b, "check 9");
    assert_true(r.from_replicas >= 2 * MiB && r.from_replicas < size);
    assert_true(r.from_origin > 0);
    STOP(&b);
    STOP(&o);
}

/* The replica a fetch reads from stops answering (SIGSTOP) mid-fetch: its shards time out and
 * are fetched again elsewhere; the fetch completes without waiting for it. Over tcp: on one
 * host the engine reads a peer's memory itself (CMA), which a stopped process cannot stall. */
static void test_replica_stalled(void **state)
{
    const uint64_t size = 16 * MiB;
    p2p_proc_t o, a, b;
    uint64_t from_a = 0;

    (void)state;
    setenv("MC_PROTOCOL", "tcp", 1);
    start(&o);
    start(&a);
    start(&b);
    unsetenv("MC_PROTOCOL");
    OK(&o, "publish stuck %" PRIu64 " 17 %llu 1", size, 64 * KiB);
    fetch_check(&a, "stuck", size, 1, 17, "");
    OK(&b, "fetch stuck %" PRIu64 " 1 rate=%llu timeout=1000", size, 8 * MiB); /* ~2 s */
    for (int i = 0; i < 100 && from_a < 1 * MiB; i++) {
        p2p_sleep_ms(20);
        OK(&b, "progress");
        assert_int_equal(sscanf(b.reply, "ok %*u %*u %" SCNu64, &from_a), 1);
    }
    kill(a.pid, SIGSTOP);
    uint64_t t0 = p2p_now_ms();
    p2p_result_t r = wait_fetch(&b);
    print_message("%.1f s after the stop: origin %" PRIu64 " replicas %" PRIu64 " retries %u\n",
                  (double)(p2p_now_ms() - t0) / 1000, r.from_origin, r.from_replicas, r.retries);
    kill(a.pid, SIGCONT);
    assert_int_equal(r.rc, 0);
    OK(&b, "check 17");
    assert_true(r.from_origin > 0);
    assert_true(r.retries > 0);
    assert_true(p2p_now_ms() - t0 < 20000);
    STOP(&b);
    STOP(&a);
    STOP(&o);
}

/* A replica whose memory changed under it serves a corrupt shard: the fetch detects it, avoids
 * that holder and gets the shard elsewhere. */
static void test_corrupt_replica(void **state)
{
    const uint64_t size = 4 * MiB;
    p2p_proc_t o, a, b;

    (void)state;
    start(&o);
    start(&a);
    start(&b);
    OK(&o, "publish liar %" PRIu64 " 13 %llu 1", size, 64 * KiB);
    fetch_check(&a, "liar", size, 2, 13, "");
    OK(&a, "flip %llu", 15 * 64 * KiB + 1000); /* shard 15 */
    p2p_result_t r = fetch_check(&b, "liar", size, 1, 13, "");
    print_message("corrupt %u retries %u origin %" PRIu64 " replicas %" PRIu64 "\n", r.corrupt,
                  r.retries, r.from_origin, r.from_replicas);
    assert_true(r.corrupt >= 1);
    assert_true(r.retries >= 1);
    assert_true(r.from_origin >= 64 * KiB);
    STOP(&b);
    STOP(&a);
    STOP(&o);
}

/* Nobody alive holds the object: the fetch gives up after the shard timeout, and says why. */
static void test_no_live_holder(void **state)
{
    p2p_proc_t o, f;

    (void)state;
    start(&o);
    start(&f);
    OK(&o, "publish lonely %llu 1 %llu 1", 1 * MiB, 64 * KiB);
    p2p_node_kill(&o);
    uint64_t t0 = p2p_now_ms();
    OK(&f, "fetch lonely %llu 1 timeout=1000", 1 * MiB);
    p2p_result_t r = wait_fetch(&f);
    assert_int_equal(r.rc, -MC_EPEERDEAD);
    assert_true(p2p_now_ms() - t0 < 15000);
    OK(&f, "stat lonely"); /* the description outlives its origin */
    STOP(&f);
}

/* A reader that stops taking bytes mid-transfer holds the origin's memory. Unregistering it
 * must neither return while the engine may still send from that memory (the host frees it
 * then) nor wait for ever: the origin's engine drops the reader's connection once the transfer
 * timeout has passed, and the call returns 0 (the node frees its buffers); the reader's READ
 * then fails, and not all of the object reached it. (Were the memory still in use, the call
 * would say -EBUSY, and the node would keep its buffers.) The reader is an engine of this process
 * driven by hand over tcp: it sends its READs, then stops calling progress. */
static void test_unregister_stalled_reader(void **state)
{
    const uint64_t size = 64 * MiB;
    char seg[128], key[512], *bufs;
    unsigned long long addr;
    p2p_proc_t o;
    mc_meta_t *meta;
    mc_meta_kv_t kv;
    mc_config_t *cfg;
    mc_engine_t *e;
    mc_segment_id_t id;
    mc_batch_t *b;
    mc_batch_status_t st;

    (void)state;
    setenv("MC_PROTOCOL", "tcp", 1);
    setenv("MC_TRANSFER_TIMEOUT", "1", 1);  /* unregister waits 1 s + 1 s */
    setenv("MC_IO_TIMEOUT_MS", "60000", 1); /* and the stalled link is not torn down first */
    start(&o);
    OK(&o, "publish busy %" PRIu64 " 23 %" PRIu64 " 1", size, size);
    OK(&o, "segment");
    snprintf(seg, sizeof(seg), "%.127s", o.reply + 3);
    snprintf(key, sizeof(key), "mooncake/p2p/busy/replica/%s", seg);
    assert_int_equal(mc_meta_open(getenv("MC_METADATA"), &meta), 0);
    assert_int_equal(mc_meta_get(meta, key, strlen(key), &kv), 0);
    assert_non_null(bufs = strstr(kv.value, "\"bufs\":[["));
    assert_int_equal(sscanf(bufs, "\"bufs\":[[%llu,", &addr), 1);
    mc_meta_kv_free(&kv);
    mc_meta_close(meta);

    unsetenv("MC_PROTOCOL");
    unsetenv("MC_TRANSFER_TIMEOUT");
    unsetenv("MC_IO_TIMEOUT_MS");
    assert_int_equal(mc_config_create(&cfg), 0);
    assert_int_equal(mc_config_set(cfg, "PROTOCOL", "tcp"), 0);
    assert_int_equal(mc_config_set(cfg, "PROGRESS_THREAD", "0"), 0);
    assert_int_equal(mc_config_set(cfg, "PROGRESS_IMPLICIT", "0"), 0);
    /* Slices larger than the kernel's socket buffers: answers stay queued at the origin. */
    assert_int_equal(mc_config_set(cfg, "SLICE_SIZE", "16777216"), 0);
    assert_int_equal(mc_engine_create(cfg, &e), 0);
    mc_config_destroy(cfg);
    char *local = malloc(size);
    assert_non_null(local);
    assert_int_equal(mc_mem_register(e, local, size, "*"), 0);
    assert_int_equal(mc_segment_open(e, seg, &id), 0);
    assert_int_equal(mc_batch_create(e, 1, &b), 0);
    mc_request_t r = {
        .opcode = MC_READ, .local = local, .target = id, .target_offset = addr, .length = size};
    assert_int_equal(mc_batch_submit(b, &r, 1, NULL), 0);
    uint64_t end = p2p_now_ms() + 10000;
    mc_task_status_t ts;
    do { /* until the READs are handed to the link; then one pass sends them, and that is all */
        mc_engine_progress(e);
        assert_int_equal(mc_task_status(b, 0, &ts), 0);
    } while (ts.state == MC_TASK_WAITING && p2p_now_ms() < end);
    mc_engine_progress(e);
    p2p_sleep_ms(200);

    uint64_t t0 = p2p_now_ms();
    OK(&o, "unregister busy 0");
    uint64_t took = p2p_now_ms() - t0;
    print_message("unregister: %.1f s\n", (double)took / 1000);
    assert_true(took >= 900 && took < 5000); /* it waited for the reader, then cut it */

    end = p2p_now_ms() + 30000;
    do { /* the reader wakes up: its connection was dropped, and the memory is unregistered */
        mc_engine_progress(e);
        assert_int_equal(mc_batch_status(b, &st), 0);
    } while ((st.state == MC_TASK_WAITING || st.state == MC_TASK_PENDING) && p2p_now_ms() < end);
    assert_int_equal(st.state, MC_TASK_FAILED);
    assert_int_not_equal(pattern_check(local, size, 23, 0), -1); /* not all of it came */
    int rc;
    while ((rc = mc_batch_destroy(b)) == -EBUSY && p2p_now_ms() < end)
        mc_engine_progress(e); /* until the engine lets go of the task */
    assert_int_equal(rc, 0);
    assert_int_equal(mc_mem_unregister(e, local), 0);
    mc_engine_destroy(e);
    free(local);
    STOP(&o);
}

/* ---- errors ---- */

static void test_names(void **state)
{
    static const char *const bad[] = {"bad//name", "/abs",      "trail/", "a/../b",
                                      ".",         "x/./y",     "sp ace", "a/replica/b",
                                      "replica",   "semi;colon"};
    char longname[200];
    p2p_proc_t o;

    (void)state;
    start(&o);
    for (unsigned i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        FAILS(-EINVAL, &o, "publish %s 100 1 4096 1", bad[i]);
    memset(longname, 'n', 129);
    longname[129] = '\0';
    FAILS(-EINVAL, &o, "publish %s 100 1 4096 1", longname);
    longname[128] = '\0';
    OK(&o, "publish %s 100 1 4096 1", longname);
    OK(&o, "unregister %s 0", longname);
    OK(&o, "publish Ok.name-1/x_y/replicas 100 1 4096 1");
    OK(&o, "unregister Ok.name-1/x_y/replicas 0");
    FAILS(-EINVAL, &o, "publish small 100 1 1000 1"); /* shard below 4096 */
    STOP(&o);
}

static void test_errors(void **state)
{
    p2p_proc_t o, p, f;

    (void)state;
    start(&o);
    start(&p);
    start(&f);
    OK(&o, "publish taken 65536 21 4096 1");
    FAILS(-EEXIST, &p, "publish taken 65536 22 4096 1");
    FAILS(-EEXIST, &o, "publish taken 65536 21 4096 1"); /* held here already */
    OK(&f, "fetch missing 65536 1");
    p2p_result_t r = wait_fetch(&f);
    assert_int_equal(r.rc, -ENOENT);
    FAILS(-ENOENT, &f, "stat missing");
    OK(&f, "fetch taken 65535 1");
    r = wait_fetch(&f);
    assert_int_equal(r.rc, -EINVAL); /* not the object's size */
    FAILS(-ENOENT, &f, "delete taken");
    FAILS(-ENOENT, &f, "unregister taken 0");
    /* a shard size past JSON's signed integers, for an object below the smallest shard: one
     * shard of the smallest size, a description every node reads */
    OK(&p, "publish tiny 100 23 9223372036854775808 1"); /* (o holds an object already) */
    OK(&f, "stat tiny");
    assert_string_equal(f.reply, "ok 100 1 1 1");
    fetch_check(&f, "tiny", 100, 1, 23, "");
    OK(&f, "delete tiny");
    OK(&p, "unregister tiny 0");
    FAILS(-EILSEQ, &f, "serve taken 65536 99 1"); /* other bytes */
    OK(&f, "serve taken 65536 21 2");
    OK(&o, "stat taken");
    assert_string_equal(o.reply, "ok 65536 16 2 2");
    FAILS(-ENOENT, &f, "unregister taken 0"); /* f serves it, it did not publish it */
    OK(&f, "delete taken");
    /* force: p replaces o's object; entries of the old one no longer count */
    OK(&p, "publish taken 131072 22 4096 1 force");
    OK(&p, "stat taken");
    assert_string_equal(p.reply, "ok 131072 32 1 1");
    OK(&f, "fetch taken 131072 1");
    r = wait_fetch(&f);
    assert_int_equal(r.rc, 0);
    OK(&f, "check 22");
    OK(&o, "unregister taken 0"); /* withdraws its own, leaves p's description alone */
    OK(&f, "stat taken");
    /* An entry of another registration of the name (made by some node after the description
     * that remove reads was deleted) outlives the remove: only the removed object's go. */
    const char *other = "mooncake/p2p/taken/replica/192.0.2.1:1",
               *prefix = "mooncake/p2p/taken/replica/";
    const char *entry = "{\"v\":1,\"id\":\"00000000000000ab\"}";
    mc_meta_t *meta;
    mc_meta_kv_t *kvs;
    size_t n;
    assert_int_equal(mc_meta_open(getenv("MC_METADATA"), &meta), 0);
    assert_int_equal(mc_meta_put(meta, other, strlen(other), entry, strlen(entry), 0, NULL), 0);
    OK(&f, "remove taken 0");
    assert_int_equal(mc_meta_list(meta, prefix, strlen(prefix), &kvs, &n, NULL), 0);
    assert_int_equal(n, 1); /* p's and f's entries went */
    assert_string_equal(kvs[0].key, other);
    mc_meta_kvs_free(kvs, n);
    assert_int_equal(mc_meta_delete(meta, other, strlen(other), 0), 0);
    mc_meta_close(meta);
    FAILS(-ENOENT, &f, "stat taken");
    FAILS(-ENOENT, &f, "remove taken 0");
    STOP(&f);
    STOP(&p);
    STOP(&o);
}

/* The replica entries under name: how many. */
static size_t entries(mc_meta_t *meta, const char *name)
{
    char prefix[256];
    mc_meta_kv_t *kvs;
    size_t n;

    snprintf(prefix, sizeof(prefix), "mooncake/p2p/%s/replica/", name);
    assert_int_equal(mc_meta_list(meta, prefix, strlen(prefix), &kvs, &n, NULL), 0);
    mc_meta_kvs_free(kvs, n);
    return n;
}

/* An origin that withdraws without keeping replicas, after another node removed the object's
 * description and kept the entries (rm --keep-replicas): every entry of its object goes with
 * it, a holder's too (before, a description already gone left them all). */
static void test_unregister_after_remove(void **state)
{
    p2p_proc_t o, f, r;
    mc_meta_t *meta;

    (void)state;
    start(&o);
    start(&f);
    start(&r);
    assert_int_equal(mc_meta_open(getenv("MC_METADATA"), &meta), 0);
    OK(&o, "publish kept 65536 31 4096 1");
    fetch_check(&f, "kept", 65536, 1, 31, "");
    assert_int_equal(entries(meta, "kept"), 2);
    OK(&r, "remove kept 1");
    assert_int_equal(entries(meta, "kept"), 2);
    OK(&o, "unregister kept 0");
    assert_int_equal(entries(meta, "kept"), 0);
    mc_meta_close(meta);
    OK(&f, "delete kept");
    STOP(&r);
    STOP(&f);
    STOP(&o);
}

/* Delete the one replica entry of name, as if its holder had gone. */
static void entries_delete(mc_meta_t *meta, const char *name)
{
    char prefix[256];
    size_t n = 0;

    snprintf(prefix, sizeof(prefix), "mooncake/p2p/%s/replica/", name);
    assert_int_equal(mc_meta_delete_prefix(meta, prefix, strlen(prefix), &n), 0);
    assert_int_equal(n, 1);
}

/* A publisher killed: while a fetcher keeps a copy its object stands (another node's register
 * without force is refused), and once that copy is deleted too, nobody can fetch it and
 * nobody could ever remove it (only its origin may): a register without force replaces it,
 * and fetchers get the new bytes. Before, only --force could. An object without entries whose
 * origin lives (between its description and its entry) is not replaced. */
static void test_abandoned(void **state)
{
    p2p_proc_t o, a, p;
    mc_meta_t *meta;

    (void)state;
    start(&o);
    start(&a);
    start(&p);
    assert_int_equal(mc_meta_open(getenv("MC_METADATA"), &meta), 0);
    OK(&o, "publish live 65536 40 4096 1");
    entries_delete(meta, "live");
    FAILS(-EEXIST, &p, "publish live 65536 42 4096 1"); /* its origin lives */
    OK(&o, "unregister live 0");
    OK(&o, "publish left 65536 41 4096 1");
    fetch_check(&a, "left", 65536, 1, 41, "");
    p2p_node_kill(&o);
    /* o's entry (and its segment) go with its lease (MC_METADATA_TTL=3) */
    uint64_t dl = p2p_now_ms() + 20000;
    while (entries(meta, "left") > 1 && p2p_now_ms() < dl)
        p2p_sleep_ms(100);
    assert_int_equal(entries(meta, "left"), 1);
    FAILS(-EEXIST, &p, "publish left 65536 42 4096 1"); /* a still serves it */
    OK(&a, "delete left");
    assert_int_equal(entries(meta, "left"), 0);
    OK(&p, "publish left 65536 42 4096 1");
    fetch_check(&a, "left", 65536, 1, 42, "");
    OK(&a, "delete left");
    OK(&p, "unregister left 0");
    assert_int_equal(entries(meta, "left"), 0);
    mc_meta_close(meta);
    STOP(&p);
    STOP(&a);
}

/* Two nodes of this process force-publish one name at the same moment, round after round:
 * both calls succeed, one description stands, and its publisher's entry lists it as a holder.
 * Before, each forced publish deleted every entry that was not its own, after writing its
 * description: the loser deleted the winner's entry, and fetchers found no holder. */
enum { RACE_ROUNDS = 40, RACE_LEN = 16384 };

typedef struct racer {
    mc_p2p_t *node;
    pthread_barrier_t *start;
    uint8_t buf[RACE_LEN];
    int rc;
} racer_t;

static void *race_publish(void *arg)
{
    racer_t *r = arg;
    mc_p2p_buf_t b = {r->buf, RACE_LEN};
    mc_p2p_register_opts_t o = {.size = sizeof(o), .shard_size = 4096, .force = 1};

    pthread_barrier_wait(r->start);
    r->rc = mc_p2p_register(r->node, "race", &b, 1, &o);
    return NULL;
}

static void test_force_race(void **state)
{
    static racer_t r[2];
    pthread_barrier_t start;
    pthread_t th[2];
    mc_p2p_object_info_t info;

    (void)state;
    for (int i = 0; i < 2; i++) {
        assert_int_equal(mc_p2p_create(NULL, &r[i].node), 0);
        memset(r[i].buf, 'a' + i, RACE_LEN);
    }
    for (int round = 0; round < RACE_ROUNDS; round++) {
        assert_int_equal(pthread_barrier_init(&start, NULL, 2), 0);
        for (int i = 0; i < 2; i++) {
            r[i].start = &start;
            assert_int_equal(pthread_create(&th[i], NULL, race_publish, &r[i]), 0);
        }
        for (int i = 0; i < 2; i++)
            pthread_join(th[i], NULL);
        pthread_barrier_destroy(&start);
        for (int i = 0; i < 2; i++)
            if (r[i].rc)
                fail_msg("round %d: node %d: %d %s", round, i, r[i].rc, mc_p2p_last_error());
        assert_int_equal(mc_p2p_stat(r[0].node, "race", &info), 0);
        if (info.holders != 1 || info.complete_holders != 1)
            fail_msg("round %d: %u holders (%u complete) of the object published by %s", round,
                     info.holders, info.complete_holders, info.origin);
        for (int i = 0; i < 2; i++)
            assert_int_equal(mc_p2p_unregister(r[i].node, "race", 0), 0);
        assert_int_equal(mc_p2p_stat(r[0].node, "race", &info), -ENOENT);
    }
    for (int i = 0; i < 2; i++)
        mc_p2p_destroy(r[i].node);
}

/* A fetch into memory a READ cannot land in (mapped read-only) fails at once with the reason,
 * blaming no holder (before: the healthy origin was dropped as unreachable three times, and the
 * fetch failed -MC_EPEERDEAD after the shard timeout); the progress of a call that fails before
 * it starts is all zero. */
static void test_local_refusal(void **state)
{
    enum { LEN = 1 << 20 };
    mc_p2p_get_opts_t go = {.size = sizeof(go), .shard_timeout_ms = 20000};
    mc_p2p_register_opts_t ro = {.size = sizeof(ro), .shard_size = 65536};
    mc_p2p_progress_t pr;
    mc_p2p_t *a, *b;
    uint8_t *src = malloc(LEN), *dst;

    (void)state;
    pattern_fill(src, LEN, 31, 0);
    assert_int_equal(mc_p2p_create(NULL, &a), 0);
    assert_int_equal(mc_p2p_create(NULL, &b), 0);
    mc_p2p_buf_t sb = {src, LEN};
    assert_int_equal(mc_p2p_register(a, "local-refusal", &sb, 1, &ro), 0);
    dst = mmap(NULL, LEN, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    assert_true(dst != MAP_FAILED);
    mc_p2p_buf_t db = {dst, LEN};
    uint64_t t0 = p2p_now_ms();
    assert_int_equal(mc_p2p_get_replica(b, "local-refusal", &db, 1, &go, &pr), -EINVAL);
    print_message("  %s (%llu ms)\n", mc_p2p_last_error(), (unsigned long long)(p2p_now_ms() - t0));
    assert_true(strstr(mc_p2p_last_error(), "write permission") != NULL);
    assert_true(p2p_now_ms() - t0 < 10000);
    memset(&pr, 0xab, sizeof(pr));
    assert_int_equal(mc_p2p_get_replica(b, "no//such", &db, 1, &go, &pr), -EINVAL);
    assert_int_equal(pr.bytes_total, 0);
    assert_int_equal(pr.shards_done, 0);
    /* b publishes other bytes; a fetch into memory that overlaps them is refused (its shards
     * would be served as that object's), another publish of them is not */
    uint8_t *own = malloc(2 * LEN);
    mc_p2p_buf_t ob = {own, 2 * LEN}, into = {own + LEN / 2, LEN};
    pattern_fill(own, 2 * LEN, 32, 0);
    assert_int_equal(mc_p2p_register(b, "local-own", &ob, 1, &ro), 0);
    assert_int_equal(mc_p2p_register(b, "local-own-too", &ob, 1, &ro), 0);
    assert_int_equal(mc_p2p_get_replica(b, "local-refusal", &into, 1, &go, NULL), -EINVAL);
    assert_true(strstr(mc_p2p_last_error(), "overlap those of local-own") != NULL);
    assert_int_equal(pattern_check(own, 2 * LEN, 32, 0), -1);
    assert_int_equal(mc_p2p_unregister(b, "local-own-too", 0), 0);
    assert_int_equal(mc_p2p_unregister(b, "local-own", 0), 0);
    free(own);
    assert_int_equal(munmap(dst, LEN), 0);
    assert_int_equal(mc_p2p_unregister(a, "local-refusal", 0), 0);
    mc_p2p_destroy(b);
    mc_p2p_destroy(a);
    free(src);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_identical, p2p_node_cleanup),
        cmocka_unit_test_teardown(test_identical_tcp, p2p_node_cleanup),
        cmocka_unit_test_teardown(test_second_generation, p2p_node_cleanup),
        cmocka_unit_test_teardown(test_feed_each_other, p2p_node_cleanup),
        cmocka_unit_test_teardown(test_origin_only, p2p_node_cleanup),
        cmocka_unit_test_teardown(test_one_shard, p2p_node_cleanup),
        cmocka_unit_test_teardown(test_origin_killed, p2p_node_cleanup),
        cmocka_unit_test_teardown(test_replica_killed, p2p_node_cleanup),
        cmocka_unit_test_teardown(test_replica_stalled, p2p_node_cleanup),
        cmocka_unit_test_teardown(test_corrupt_replica, p2p_node_cleanup),
        cmocka_unit_test_teardown(test_no_live_holder, p2p_node_cleanup),
        cmocka_unit_test_teardown(test_unregister_stalled_reader, p2p_node_cleanup),
        cmocka_unit_test_teardown(test_names, p2p_node_cleanup),
        cmocka_unit_test_teardown(test_errors, p2p_node_cleanup),
        cmocka_unit_test_teardown(test_unregister_after_remove, p2p_node_cleanup),
        cmocka_unit_test_teardown(test_abandoned, p2p_node_cleanup),
        cmocka_unit_test_teardown(test_force_race, p2p_node_cleanup),
        cmocka_unit_test_teardown(test_local_refusal, p2p_node_cleanup),
    };

    setenv("MC_METADATA_TTL", "3", 0);
    p2p_test_dir();
    if (getenv("TH_FILTER")) /* run only the tests whose names match (cmocka's glob) */
        cmocka_set_test_filter(getenv("TH_FILTER"));
    return cmocka_run_group_tests(tests, NULL, NULL);
}
