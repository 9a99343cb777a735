/*
 * The public engine API end to end: configuration from the environment, memory registration,
 * the three ways to open a segment, messages, notifications, statistics, authentication and
 * many peers. Targets run in child processes (harness.c) on loopback.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include <cmocka.h>

#include "harness.h"

#define N_ENG 4
#define N_TGT 4

/* Whatever a test created, so the teardown can release it even after a failed assertion. */
static struct {
    mc_engine_t *e[N_ENG];
    th_target_t t[N_TGT];
    char dir[64];
} g;

static int teardown(void **state)
{
    (void)state;
    th_kill_all();
    for (int i = 0; i < N_ENG; i++) {
        if (g.e[i])
            mc_engine_destroy(g.e[i]);
    }
    th_rmdir(g.dir);
    memset(&g, 0, sizeof(g));
    return 0;
}

/* Spawn target slot i with cfg (progress thread on) and buffers of len bytes. */
static th_target_t *spawn(int i, const th_cfg_t *cfg, size_t len, const char *location)
{
    th_target_opts_t o;

    th_target_opts_init(&o, cfg, len);
    if (location)
        snprintf(o.location, sizeof(o.location), "%s", location);
    assert_int_equal(th_target_spawn(&o, &g.t[i]), 0);
    return &g.t[i];
}

/* A verified round trip of len bytes through segment seg at remote address ra. */
static void roundtrip(mc_engine_t *e, th_target_t *t, unsigned eng, mc_segment_id_t seg,
                      uint64_t ra, size_t len, uint64_t seed)
{
    uint8_t *src = th_buf(e, len), *dst = th_buf(e, len);
    char why[512] = "";

    th_fill(src, len, seed);
    int st = th_xfer(e, MC_WRITE, src, seg, ra, len, why, sizeof(why));
    if (st != MC_TASK_COMPLETED)
        print_error("WRITE: state %d: %s\n", st, why);
    assert_int_equal(st, MC_TASK_COMPLETED);
    assert_int_equal(th_remote_check(t, eng, ra, len, seed, 0), -1);
    assert_int_equal(th_xfer(e, MC_READ, dst, seg, ra, len, why, sizeof(why)), MC_TASK_COMPLETED);
    assert_int_equal(th_check(dst, len, seed), -1);
    th_buf_free(e, src, len);
    th_buf_free(e, dst, len);
}

/* ---- configuration ------------------------------------------------------------------------ */

static void test_config_env(void **state)
{
    static const struct {
        const char *var, *bad;
    } vars[] = {
        {"MC_LISTEN", "not-an-address"},
        {"MC_SEGMENT_NAME", NULL}, /* too long: filled below */
        {"MC_METADATA", "bogus://x"},
        {"MC_METADATA_CLUSTER_ID", "a/b"},
        {"MC_LOG_LEVEL", "loud"},
        {"MC_FORCE_TCP", "maybe"},
        {"MC_PROTOCOL", "carrier-pigeon"},
        {"MC_PROGRESS_THREAD", "2"},
        {"MC_SLICE_SIZE", "abc"},
        {"MC_RETRY_CNT", "-1"},
        {"MC_TRANSFER_TIMEOUT", "0"},
        {"MC_IO_TIMEOUT_MS", "10x"},
        {"MC_CONNECT_TIMEOUT_MS", "99999999999999999999999"},
        {"MC_TCP_CONNS", "0"},
        {"MC_TCP_WINDOW", "100000"},
        {"MC_MAX_CONNS", "abc"},
        {"MC_METADATA_TTL", "1"},
        {"MC_HANDSHAKE_MAX_LENGTH", "12"},
        {"MC_GID_INDEX", "256"},
        {"MC_MTU", "1000"},
        {"MC_RDMA_QP_DEPTH", "0"},
    };
    char longval[600];
    mc_config_t *cfg;

    (void)state;
    memset(longval, 'x', sizeof(longval) - 1);
    longval[sizeof(longval) - 1] = 0;
    for (size_t i = 0; i < sizeof(vars) / sizeof(vars[0]); i++) {
        assert_int_equal(setenv(vars[i].var, vars[i].bad ? vars[i].bad : longval, 1), 0);
        cfg = (mc_config_t *)&longval; /* must stay untouched on failure */
        int rc = mc_config_create(&cfg);
        const char *err = mc_last_error();
        unsetenv(vars[i].var);
        if (rc != -MC_ECONFIG || !strstr(err, vars[i].var))
            print_error("%s: rc %d, error \"%s\"\n", vars[i].var, rc, err);
        assert_int_equal(rc, -MC_ECONFIG);
        assert_non_null(strstr(err, vars[i].var));
        assert_ptr_equal(cfg, (mc_config_t *)&longval);
    }
    /* Good values are applied; the defaults otherwise. */
    setenv("MC_SLICE_SIZE", "131072", 1);
    setenv("MC_FORCE_TCP", "yes", 1);
    setenv("MC_RDMA_QP_DEPTH", "8", 1);
    assert_int_equal(mc_config_create(&cfg), 0);
    unsetenv("MC_SLICE_SIZE");
    unsetenv("MC_FORCE_TCP");
    unsetenv("MC_RDMA_QP_DEPTH");
    assert_string_equal(mc_config_get(cfg, "SLICE_SIZE"), "131072");
    assert_string_equal(mc_config_get(cfg, "MC_FORCE_TCP"), "yes");
    assert_string_equal(mc_config_get(cfg, "RDMA_QP_DEPTH"), "8");
    assert_string_equal(mc_config_get(cfg, "TCP_WINDOW"), "16");
    assert_string_equal(mc_config_get(cfg, "PROTOCOL"), "auto");
    mc_config_destroy(cfg);
}

/* Settings by name: unknown names and bad values are refused and change nothing. */
static void test_config_set(void **state)
{
    mc_config_t *cfg;
    const char *name, *def, *help;
    char seen[4096] = ",";

    (void)state;
    assert_int_equal(mc_config_create(&cfg), 0);
    assert_int_equal(mc_config_set(cfg, "SLICE_SIZE", "1048576"), 0);
    assert_string_equal(mc_config_get(cfg, "SLICE_SIZE"), "1048576");
    assert_int_equal(mc_config_set(cfg, "MC_SLICE_SIZE", "12"), -MC_ECONFIG);
    /* The whole reason: the setting, the value, then why (built on the parser's own). */
    assert_string_equal(mc_last_error(),
                        "MC_SLICE_SIZE=12: expected an integer in [4096, 67108864]");
    assert_string_equal(mc_config_get(cfg, "SLICE_SIZE"), "1048576");
    assert_int_equal(mc_config_set(cfg, "NO_SUCH_SETTING", "1"), -ENOENT);
    assert_null(mc_config_get(cfg, "NO_SUCH_SETTING"));
    assert_int_equal(mc_config_set(cfg, "PROTOCOL", "rdma"), 0);
    assert_int_equal(mc_config_set(cfg, "LOG_LEVEL", "off"), 0);
    assert_int_equal(mc_config_set(NULL, "LOG_LEVEL", "off"), -EINVAL);
    /* Every setting is listed once, the transports' (LISTEN, RDMA_QP_DEPTH) with the core's,
     * and has a default that the configuration accepts. */
    size_t n = 0;
    for (; mc_config_setting(n, &name, &def, &help) == 0; n++) {
        char key[64];
        snprintf(key, sizeof(key), ",%s,", name);
        assert_null(strstr(seen, key));
        snprintf(seen + strlen(seen), sizeof(seen) - strlen(seen), "%s,", name);
        assert_non_null(mc_config_get(cfg, name));
        assert_true(help && *help);
    }
    assert_true(n > 25);
    assert_non_null(strstr(seen, ",LISTEN,"));
    assert_non_null(strstr(seen, ",RDMA_QP_DEPTH,"));
    assert_int_equal(mc_config_setting(n, &name, &def, &help), -ENOENT);
    mc_config_destroy(cfg);
}

/* Two engines in one process with different settings: each logs at its own MC_LOG_LEVEL and
 * publishes its own NIC priority matrix (MC_NIC_PRIORITY_MATRIX). */
static void test_config_per_engine(void **state)
{
    char path[] = "/tmp/mc-log-XXXXXX", log[8192] = "", blob[65536];
    size_t len;
    th_cfg_t a, b;
    int fd = mkstemp(path), saved = dup(2);

    (void)state;
    assert_true(fd >= 0 && saved >= 0);
    th_config(&a);
    th_set(&a, "SEGMENT_NAME", "loud-engine");
    th_set(&a, "LOG_LEVEL", "info");
    th_set(&a, "NIC_PRIORITY_MATRIX", "{\"cpu:0\": [[], []]}");
    th_config(&b);
    th_set(&b, "SEGMENT_NAME", "quiet-engine");
    th_set(&b, "LOG_LEVEL", "off");
    fflush(stderr);
    assert_int_equal(dup2(fd, 2), 2);
    g.e[0] = th_engine(&a);
    g.e[1] = th_engine(&b);
    fflush(stderr);
    assert_int_equal(dup2(saved, 2), 2);
    close(saved);
    assert_true(pread(fd, log, sizeof(log) - 1, 0) >= 0);
    close(fd);
    unlink(path);
    assert_non_null(strstr(log, "engine loud-engine started"));
    assert_null(strstr(log, "quiet-engine"));

    len = sizeof(blob) - 1;
    assert_int_equal(mc_segment_export(g.e[0], blob, &len), 0);
    blob[len] = 0;
    assert_non_null(strstr(blob, "\"priority_matrix\":{\"cpu:0\":[[],[]]}"));
    len = sizeof(blob) - 1;
    assert_int_equal(mc_segment_export(g.e[1], blob, &len), 0);
    blob[len] = 0;
    assert_null(strstr(blob, "\"priority_matrix\":{\"cpu:0\":[[],[]]}"));
}

/* ---- memory ------------------------------------------------------------------------------- */

static void test_register(void **state)
{
    th_cfg_t cfg;
    uint8_t *m = mmap(NULL, 64 * 1024, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    void *a = NULL;

    (void)state;
    assert_true(m != MAP_FAILED);
    th_config(&cfg);
    mc_engine_t *e = g.e[0] = th_engine(&cfg);
    assert_int_equal(mc_mem_register(e, m + 8192, 0, "cpu:0"), -EINVAL);
    assert_int_equal(mc_mem_register(e, m + 8192, 8192, "cpu:0"), 0);
    /* Two layers of a host may register the same pages: the same range again is counted, an
     * overlapping one is a registration of its own; each unregister drops one. */
    assert_int_equal(mc_mem_register(e, m + 8192, 8192, "cpu:0"), 0);
    assert_int_equal(mc_mem_register(e, m + 12288, 8192, "cpu:0"), 0);
    assert_int_equal(mc_mem_register(e, m, 65536, "cpu:0"), 0);
    assert_int_equal(mc_mem_unregister(e, m + 8193), -ENOENT);
    assert_int_equal(mc_mem_unregister(e, m + 40960), -ENOENT);
    assert_int_equal(mc_mem_unregister(e, m + 8192), 0);
    assert_int_equal(mc_mem_unregister(e, m + 8192), 0);
    assert_int_equal(mc_mem_unregister(e, m + 8192), -ENOENT);
    assert_int_equal(mc_mem_unregister(e, m + 12288), 0);
    assert_int_equal(mc_mem_unregister(e, m), 0);
    assert_int_equal(mc_mem_unregister(e, m), -ENOENT);
    assert_int_equal(mc_mem_register(e, m + 4096, 4096, "cpu:0"), 0);
    assert_int_equal(mc_mem_register(e, m + 16384, 4096, "*"), 0);
    assert_int_equal(mc_mem_register(e, m + 8192, 8192, "cpu:0"), 0);
    /* Locations: no GPU here, and nonsense is refused with a message that says why. */
    int rc = mc_mem_register(e, m + 32768, 4096, "cuda:0");
    assert_true(rc < 0);
    assert_true(th_contains(mc_last_error(), "cuda"));
    assert_true(mc_mem_register(e, m + 32768, 4096, "bogus:1") < 0);
    assert_true(th_contains(mc_last_error(), "bogus"));
    assert_true(mc_mem_register(e, m + 32768, 4096, "cpu:x") < 0);
    assert_int_equal(mc_mem_register(e, m + 32768, 4096, "cpu:0"), 0); /* none of it stuck */
    /* mc_mem_alloc: usable, registered, freed, reusable; a registration inside it is separate
     * and comes off with mc_mem_unregister; the allocation itself only with mc_mem_free. */
    assert_int_equal(mc_mem_alloc(e, 1 << 20, "*", &a), 0);
    memset(a, 0x11, 1 << 20);
    assert_int_equal(mc_mem_register(e, a, 1 << 20, "*"), 0);
    assert_int_equal(mc_mem_unregister(e, a), 0);
    assert_int_equal(mc_mem_unregister(e, a), -EINVAL);
    assert_true(th_contains(mc_last_error(), "mc_mem_free"));
    /* mc_mem_free takes the allocation, never a registration of the same start. */
    uint8_t key[MC_BUFFER_KEY_SIZE];
    assert_int_equal(mc_mem_register(e, a, 4096, "*"), 0);
    mc_mem_free(e, a);
    assert_int_equal(mc_buffer_key_pack(e, (uint8_t *)a + 8192, key), -ENOENT);
    assert_int_equal(mc_buffer_key_pack(e, (uint8_t *)a + 100, key), 0);
    assert_int_equal(mc_mem_unregister(e, a), 0);
    assert_int_equal(mc_mem_alloc(e, 1 << 20, "cpu:0", &a), 0);
    mc_mem_free(e, a);
    assert_true(mc_mem_alloc(e, 4096, "cuda:0", &a) < 0);
    assert_true(mc_mem_alloc(e, 0, "*", &a) < 0);
    mc_engine_destroy(e);
    g.e[0] = NULL;
    munmap(m, 64 * 1024);
}

/* "*" resolves to a concrete location that a peer sees in the descriptor. */
static void test_location_star(void **state)
{
    th_cfg_t cfg;
    mc_buffer_info_t info[4];
    size_t count = 0;

    (void)state;
    th_config(&cfg);
    th_target_t *t = spawn(0, &cfg, 1 << 20, "*");
    mc_engine_t *e = g.e[0] = th_engine(&cfg);
    mc_segment_id_t id = th_open(e, t, 0);
    assert_int_equal(mc_segment_buffers(e, id, info, 4, &count), 0);
    assert_int_equal(count, 1);
    assert_int_equal(info[0].addr, t->eng[0].buf[0]);
    assert_int_equal(info[0].length, 1 << 20);
    assert_int_equal(strncmp(info[0].location, "cpu:", 4), 0);
    assert_int_equal(mc_segment_buffers(e, id, NULL, 0, &count), 0);
    assert_int_equal(count, 1);
    assert_int_equal(mc_segment_buffers(e, id + 99, info, 4, &count), -ENOENT);
}

/* ---- opening segments --------------------------------------------------------------------- */

static void test_open_blob(void **state)
{
    th_cfg_t cfg;
    mc_segment_id_t id, id2;
    uint8_t small[4], garbage[64];
    size_t len;

    (void)state;
    th_config(&cfg);
    th_target_t *t = spawn(0, &cfg, 1 << 20, NULL);
    mc_engine_t *e = g.e[0] = th_engine(&cfg);
    len = sizeof(small);
    assert_int_equal(mc_segment_export(e, small, &len), -ENOSPC);
    assert_true(len > sizeof(small));
    size_t need = len;
    len = 0;
    assert_int_equal(mc_segment_export(e, NULL, &len), -ENOSPC);
    assert_int_equal(len, need);
    uint8_t *blob = malloc(need);
    assert_int_equal(mc_segment_export(e, blob, &len), 0);
    assert_int_equal(len, need);
    free(blob);
    id = th_open(e, t, 0);
    id2 = th_open(e, t, 0);
    assert_int_equal(id, id2); /* reference counted */
    assert_int_equal(mc_segment_is_local_host(e, id), 1);
    memset(garbage, 'z', sizeof(garbage));
    assert_true(mc_segment_open_blob(e, garbage, sizeof(garbage), &id2) < 0);
    roundtrip(e, t, 0, id, t->eng[0].buf[0] + 100, 300000, 1);
    assert_int_equal(mc_segment_close(e, id), 0);
    assert_int_equal(mc_segment_close(e, id), 0);
    assert_int_equal(mc_segment_close(e, id), -ENOENT);
}

static void test_open_handshake(void **state)
{
    th_cfg_t cfg;
    mc_segment_id_t id, id2;

    (void)state;
    th_config(&cfg);
    th_target_t *t = spawn(0, &cfg, 1 << 20, NULL);
    mc_engine_t *e = g.e[0] = th_engine(&cfg);
    int rc = mc_segment_open(e, t->eng[0].name, &id);
    if (rc)
        print_error("open %s: %s\n", t->eng[0].name, mc_last_error());
    assert_int_equal(rc, 0);
    assert_int_equal(mc_segment_open(e, t->eng[0].name, &id2), 0);
    assert_int_equal(id, id2);
    assert_int_equal(mc_segment_is_local_host(e, id), 1);
    roundtrip(e, t, 0, id, t->eng[0].buf[0] + 4097, 200000, 2);
    assert_int_equal(mc_segment_open(e, "no-such-segment", &id2), -MC_ENOSEGMENT);
    int64_t t0 = th_now_ms();
    assert_true(mc_segment_open(e, "127.0.0.1:1", &id2) < 0); /* nobody listens there */
    assert_true(th_now_ms() - t0 < 10000);
}

static void test_open_by_name_file_meta(void **state)
{
    th_cfg_t cfg, tcfg;
    mc_segment_id_t id;

    (void)state;
    th_tmpdir(g.dir, sizeof(g.dir));
    th_config(&cfg);
    th_set(&cfg, "METADATA", "file://%s", g.dir);
    tcfg = cfg;
    th_set(&tcfg, "SEGMENT_NAME", "target-by-name");
    th_target_t *t = spawn(0, &tcfg, 1 << 20, NULL);
    mc_engine_t *e = g.e[0] = th_engine(&cfg);
    int rc = mc_segment_open(e, "target-by-name", &id);
    if (rc)
        print_error("open by name: %s\n", mc_last_error());
    assert_int_equal(rc, 0);
    assert_string_equal(t->eng[0].name, "target-by-name");
    assert_int_equal(mc_segment_is_local_host(e, id), 1);
    roundtrip(e, t, 0, id, t->eng[0].buf[0] + 3, 500000, 3);
    assert_int_equal(mc_segment_open(e, "target-not-there", &id), -MC_ENOSEGMENT);
}

/* ---- messages and notifications ----------------------------------------------------------- */

static void test_messages(void **state)
{
    th_cfg_t cfg;
    uint8_t buf[4 + 300];
    th_reply_t r;

    (void)state;
    th_config(&cfg);
    th_target_t *t = spawn(0, &cfg, 4096, NULL);
    mc_engine_t *e = g.e[0] = th_engine(&cfg);
    mc_segment_id_t id = th_open(e, t, 0);
    for (uint32_t i = 0; i < 1000; i++) {
        size_t len = 4 + i % 300;
        memcpy(buf, &i, 4);
        th_fill(buf + 4, len - 4, 1000 + i);
        int rc, tries = 0;
        while ((rc = mc_msg_send(e, id, TH_MSG_ID, buf, len)) == -EAGAIN && tries++ < 10000) {
            mc_engine_progress(e);
            th_sleep_ms(1);
        }
        assert_int_equal(rc, 0);
    }
    th_cmd_t c = {.op = TH_CMD_MSGS, .a0 = 1000, .a3 = 20000};
    assert_int_equal(th_target_cmd(t, &c, &r, 30000), 0);
    if (r.v[0] != 1000 || r.v[1] || r.v[2] || r.v[3])
        print_error("received %lld, out of order %lld, bad payload %lld, bad sender %lld\n",
                    (long long)r.v[0], (long long)r.v[1], (long long)r.v[2], (long long)r.v[3]);
    assert_int_equal(r.v[0], 1000);
    assert_int_equal(r.v[1], 0); /* out of order */
    assert_int_equal(r.v[2], 0); /* payload */
    assert_int_equal(r.v[3], 0); /* sender changed */
    assert_string_equal(r.str, mc_engine_segment_name(e));
    static uint8_t big[MC_MSG_MAX + 1];
    assert_int_equal(mc_msg_send(e, id, TH_MSG_ID, big, sizeof(big)), -EINVAL);
    assert_int_equal(mc_msg_send(e, id, 0, buf, 4), -EINVAL);
    assert_int_equal(mc_msg_send(e, id + 77, TH_MSG_ID, buf, 4), -MC_ENOSEGMENT);
    assert_int_equal(mc_msg_handler_set(e, 0, NULL, NULL), -EINVAL);
}

/* Submit n writes of sz bytes from src (seed) to the target region, with a notification. */
static mc_batch_t *notify_batch(mc_engine_t *e, mc_segment_id_t id, uint8_t *src, uint64_t ra,
                                size_t n, size_t sz, bool one_bad, const char *msg)
{
    mc_request_t *reqs = calloc(n, sizeof(*reqs));
    mc_notify_req_t nr = {.target = id, .msg = msg, .len = strlen(msg)};
    mc_batch_t *b;

    for (size_t i = 0; i < n; i++)
        reqs[i] = (mc_request_t){.opcode = MC_WRITE,
                                 .local = src + i * sz,
                                 .target = id,
                                 .target_offset = ra + i * sz,
                                 .length = sz};
    if (one_bad)
        reqs[n / 2].target_offset = 4096; /* page zero is never registered */
    assert_int_equal(mc_batch_create(e, n, &b), 0);
    assert_int_equal(mc_batch_submit(b, reqs, n, &nr), 0);
    free(reqs);
    return b;
}

static void test_notify(void **state)
{
    const size_t n = 256, sz = 64 * 1024;
    th_cfg_t cfg;
    mc_batch_status_t bs;
    th_reply_t r;

    (void)state;
    th_config(&cfg);
    th_target_t *t = spawn(0, &cfg, n * sz, NULL);
    mc_engine_t *e = g.e[0] = th_engine(&cfg);
    mc_segment_id_t id = th_open(e, t, 0);
    uint64_t ra = t->eng[0].buf[0];
    uint8_t *src = th_buf(e, n * sz);

    /* The target starts popping before anything is sent; it checks its memory on the pop. */
    th_fill(src, n * sz, 555);
    th_cmd_t c = {.op = TH_CMD_NOTIFY, .a0 = ra, .a1 = n * sz, .a2 = 555, .a3 = 30000};
    assert_int_equal(th_target_send(t, &c), 0);
    mc_batch_t *b = notify_batch(e, id, src, ra, n, sz, false, "batch-one done");
    assert_int_equal(th_target_recv(t, &r, 40000), 0);
    assert_int_equal(r.v[0], 1);
    assert_int_equal(r.rc, 0); /* every byte was visible when the notification popped */
    assert_string_equal(r.str, mc_engine_segment_name(e));
    assert_int_equal(r.v[1], strlen("batch-one done"));
    assert_string_equal(r.msg, "batch-one done");
    assert_int_equal(mc_batch_wait(b, 30000), 0);
    assert_int_equal(mc_batch_status(b, &bs), 0);
    assert_int_equal(bs.state, MC_TASK_COMPLETED);
    th_batch_destroy(e, b);

    /* One task fails: no notification. */
    th_fill(src, n * sz, 556);
    b = notify_batch(e, id, src, ra, n, sz, true, "must not arrive");
    assert_int_equal(mc_batch_wait(b, 30000), 0);
    assert_int_equal(mc_batch_status(b, &bs), 0);
    assert_int_equal(bs.failed, 1);
    th_batch_destroy(e, b);
    c = (th_cmd_t){.op = TH_CMD_NOTIFY, .a3 = 1500};
    assert_int_equal(th_target_cmd(t, &c, &r, 10000), 0);
    assert_int_equal(r.v[0], 0);
    /* The channel still works and the next one is the next message, not the failed one. */
    b = notify_batch(e, id, src, ra, 4, sz, false, "third");
    assert_int_equal(mc_batch_wait(b, 30000), 0);
    th_batch_destroy(e, b);
    c = (th_cmd_t){.op = TH_CMD_NOTIFY, .a0 = ra, .a1 = 4 * sz, .a2 = 556, .a3 = 10000};
    assert_int_equal(th_target_cmd(t, &c, &r, 20000), 0);
    assert_int_equal(r.v[0], 1);
    assert_string_equal(r.msg, "third");
    assert_int_equal(r.rc, 0);
    th_buf_free(e, src, n * sz);
}

/* ---- statistics --------------------------------------------------------------------------- */

static void test_stats(void **state)
{
    const size_t w = (3u << 20) + 5, rd = (1u << 20) + 3;
    th_cfg_t cfg;
    mc_counters_t c, p;
    th_reply_t r;

    (void)state;
    th_config(&cfg);
    th_set(&cfg, "FORCE_TCP", "1"); /* the tcp counters are under test: no same-host shortcut */
    th_target_t *t = spawn(0, &cfg, 4u << 20, NULL);
    mc_engine_t *e = g.e[0] = th_engine(&cfg);
    mc_segment_id_t id = th_open(e, t, 0);
    uint8_t *buf = th_buf(e, w);
    assert_int_equal(mc_stats_transport(e, "tcp", &c), 0);
    assert_int_equal(c.bytes_written + c.bytes_read + c.bytes_served, 0);
    th_fill(buf, w, 9);
    assert_int_equal(th_xfer(e, MC_WRITE, buf, id, t->eng[0].buf[0], w, NULL, 0),
                     MC_TASK_COMPLETED);
    assert_int_equal(th_xfer(e, MC_READ, buf, id, t->eng[0].buf[0] + 1, rd, NULL, 0),
                     MC_TASK_COMPLETED);
    assert_int_equal(th_check_at(buf, rd, 9, 1), -1); /* read from one byte in */
    assert_int_equal(mc_stats_transport(e, "tcp", &c), 0);
    assert_int_equal(c.bytes_written, w);
    assert_int_equal(c.bytes_read, rd);
    assert_int_equal(c.errors, 0);
    assert_true(c.requests >= 2);
    assert_int_equal(mc_stats_peer(e, id, &p), 0);
    assert_int_equal(p.bytes_written, w);
    assert_int_equal(p.bytes_read, rd);
    assert_int_equal(mc_stats_peer(e, id + 5, &p), -ENOENT);
    assert_int_equal(mc_stats_transport(e, "no-such-transport", &c), -ENOENT);
    /* The target counts a response once its last byte left, which may be just after the
     * initiator got it: ask again until it is there (or 5 s). */
    th_cmd_t cmd = {.op = TH_CMD_STATS};
    int64_t dl = th_now_ms() + 5000;
    for (;;) {
        assert_int_equal(th_target_cmd(t, &cmd, &r, 10000), 0);
        assert_int_equal(r.rc, 0);
        if (r.v[2] >= (int64_t)(w + rd) || th_now_ms() > dl)
            break;
        th_sleep_ms(1);
    }
    assert_int_equal(r.v[2], w + rd); /* bytes_served */
    th_buf_free(e, buf, w);
}

/* ---- waiting from a callback ---------------------------------------------------------------- */

static struct {
    mc_batch_t *other;
    atomic_int rc;
    atomic_bool ran;
} waiter;

static void wait_in_cb(void *arg, const mc_task_status_t *st)
{
    (void)arg;
    (void)st;
    atomic_store(&waiter.rc, mc_batch_wait(waiter.other, 1000));
    atomic_store(&waiter.ran, true);
}

/* A completion callback that waits for a batch is refused (-EDEADLK) at once: the tasks it would
 * wait for end in passes of the engine, which wait for the callback. */
static void test_wait_in_callback(void **state)
{
    th_cfg_t cfg;
    mc_batch_t *b;

    (void)state;
    th_config(&cfg);
    th_target_t *t = spawn(0, &cfg, 1 << 20, NULL);
    mc_engine_t *e = g.e[0] = th_engine(&cfg);
    mc_segment_id_t id = th_open(e, t, 0);
    uint8_t *buf = th_buf(e, 8192);
    memset(&waiter, 0, sizeof(waiter));
    mc_request_t other = {.opcode = MC_WRITE,
                          .local = buf + 4096,
                          .target = id,
                          .target_offset = t->eng[0].buf[0] + 4096,
                          .length = 4096};
    mc_request_t r = {.opcode = MC_WRITE,
                      .local = buf,
                      .target = id,
                      .target_offset = t->eng[0].buf[0],
                      .length = 4096,
                      .cb = wait_in_cb};
    assert_int_equal(mc_batch_create(e, 1, &waiter.other), 0);
    assert_int_equal(mc_batch_create(e, 1, &b), 0);
    assert_int_equal(mc_batch_submit(b, &r, 1, NULL), 0);
    assert_int_equal(mc_batch_submit(waiter.other, &other, 1, NULL), 0);
    for (int64_t dl = th_now_ms() + 10000; !atomic_load(&waiter.ran) && th_now_ms() < dl;)
        th_sleep_ms(1);
    assert_true(atomic_load(&waiter.ran));
    assert_int_equal(atomic_load(&waiter.rc), -EDEADLK);
    assert_int_equal(mc_batch_wait(waiter.other, 10000), 0); /* from the host: it completes */
    th_batch_destroy(e, waiter.other);
    th_batch_destroy(e, b);
    th_buf_free(e, buf, 8192);
}

/* ---- authentication ----------------------------------------------------------------------- */

static void auth_case(int slot, const char *init_tok, const char *tgt_tok, bool ok)
{
    th_cfg_t cfg, tcfg;
    char why[512];

    th_config(&cfg);
    th_set(&cfg, "CONNECT_TIMEOUT_MS", "2000");
    tcfg = cfg;
    th_set(&cfg, "AUTH_TOKEN", "%s", init_tok);
    th_set(&tcfg, "AUTH_TOKEN", "%s", tgt_tok);
    th_target_t *t = spawn(slot, &tcfg, 1 << 20, NULL);
    mc_engine_t *e = g.e[slot] = th_engine(&cfg);
    mc_segment_id_t id = th_open(e, t, 0);
    uint8_t *src = th_buf(e, 65536);
    th_fill(src, 65536, 70 + slot);
    int64_t t0 = th_now_ms();
    int st = th_xfer(e, MC_WRITE, src, id, t->eng[0].buf[0], 65536, why, sizeof(why));
    if (ok) {
        assert_int_equal(st, MC_TASK_COMPLETED);
        assert_int_equal(th_remote_check(t, 0, t->eng[0].buf[0], 65536, 70 + slot, 0), -1);
        return;
    }
    if (st != MC_TASK_FAILED || !(th_contains(why, "auth") || th_contains(why, "token")))
        print_error("tokens \"%s\"/\"%s\": state %d, reason \"%s\"\n", init_tok, tgt_tok, st, why);
    assert_int_equal(st, MC_TASK_FAILED);
    assert_true(th_contains(why, "auth") || th_contains(why, "token"));
    assert_true(th_now_ms() - t0 < 15000);
    assert_int_equal(th_remote_check(t, 0, t->eng[0].buf[0], 65536, 0x7a7a, 0), -1);
}

static void test_auth(void **state)
{
    (void)state;
    auth_case(0, "s3cret", "s3cret", true);
    auth_case(1, "s3cret", "other", false);
    auth_case(2, "s3cret", "", false);
    auth_case(3, "", "s3cret", false);
}

/* ---- many peers --------------------------------------------------------------------------- */

static void test_64_peers(void **state)
{
    const size_t sz = 96 * 1024, per = 16, nt = 4, np = per * nt;
    th_cfg_t cfg;
    mc_segment_id_t ids[64];
    mc_request_t reqs[64];
    mc_batch_t *b;
    mc_batch_status_t bs;

    (void)state;
    th_config(&cfg);
    for (size_t i = 0; i < nt; i++) {
        th_target_opts_t o;
        th_target_opts_init(&o, &cfg, 256 * 1024);
        o.n_engines = per;
        assert_int_equal(th_target_spawn(&o, &g.t[i]), 0);
    }
    mc_engine_t *e = g.e[0] = th_engine(&cfg);
    uint8_t *src = th_buf(e, np * sz), *dst = th_buf(e, np * sz);
    for (size_t i = 0; i < np; i++) {
        th_target_t *t = &g.t[i / per];
        ids[i] = th_open(e, t, (unsigned)(i % per));
        for (size_t j = 0; j < i; j++)
            assert_int_not_equal(ids[i], ids[j]);
        th_fill(src + i * sz, sz, 6400 + i);
        reqs[i] = (mc_request_t){.opcode = MC_WRITE,
                                 .local = src + i * sz,
                                 .target = ids[i],
                                 .target_offset = t->eng[i % per].buf[0] + 1000 + i,
                                 .length = sz};
    }
    assert_int_equal(mc_batch_create(e, np, &b), 0);
    assert_int_equal(mc_batch_submit(b, reqs, np, NULL), 0);
    assert_int_equal(mc_batch_wait(b, 60000), 0);
    assert_int_equal(mc_batch_status(b, &bs), 0);
    assert_int_equal(bs.completed, np);
    th_batch_destroy(e, b);
    for (size_t i = 0; i < np; i++) {
        reqs[i].opcode = MC_READ;
        reqs[i].local = dst + i * sz;
        assert_int_equal(th_remote_check(&g.t[i / per], (unsigned)(i % per), reqs[i].target_offset,
                                         sz, 6400 + i, 0),
                         -1);
    }
    assert_int_equal(mc_batch_create(e, np, &b), 0);
    assert_int_equal(mc_batch_submit(b, reqs, np, NULL), 0);
    assert_int_equal(mc_batch_wait(b, 60000), 0);
    assert_int_equal(mc_batch_status(b, &bs), 0);
    assert_int_equal(bs.completed, np);
    th_batch_destroy(e, b);
    for (size_t i = 0; i < np; i++)
        assert_int_equal(th_check(dst + i * sz, sz, 6400 + i), -1);
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_config_env, teardown),
        cmocka_unit_test_teardown(test_config_set, teardown),
        cmocka_unit_test_teardown(test_config_per_engine, teardown),
        cmocka_unit_test_teardown(test_register, teardown),
        cmocka_unit_test_teardown(test_location_star, teardown),
        cmocka_unit_test_teardown(test_open_blob, teardown),
        cmocka_unit_test_teardown(test_open_handshake, teardown),
        cmocka_unit_test_teardown(test_open_by_name_file_meta, teardown),
        cmocka_unit_test_teardown(test_messages, teardown),
        cmocka_unit_test_teardown(test_notify, teardown),
        cmocka_unit_test_teardown(test_stats, teardown),
        cmocka_unit_test_teardown(test_wait_in_callback, teardown),
        cmocka_unit_test_teardown(test_auth, teardown),
        cmocka_unit_test_teardown(test_64_peers, teardown),
    };

    th_main(argc, argv);
    return cmocka_run_group_tests_name("engine_api", tests, NULL, NULL);
}
