/*
 * The rdma transport beyond the conformance suite, on the software RDMA device (tools/softverbs,
 * two devices per process, selected with LD_LIBRARY_PATH by the ctest entry): striping over
 * several devices, a port that goes down in the middle of a transfer and comes back, every
 * device of the initiator going down or dying (the transfers go on over tcp), requests
 * the target's NIC must refuse (corrupted, stale or forged keys, ranges outside the buffers),
 * and a target that dies during a transfer. The target engine is a child process (harness.c);
 * both engines use rdma although they share the host (protocol "rdma").
 *
 * Faults are injected through softverbs' control files. The initiator (this process) and the
 * target child use different control directories, so that a fault hits one side only:
 * softverbs watches the directory SOFTVERBS_CTL_DIR names when a device is opened and reads
 * the variable again at each reload, so the variable is set before the child is spawned (it
 * inherits it) and set to the initiator's directory before the initiator's engine is created,
 * and left alone while an engine of this process lives.
 */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>
#include <infiniband/verbs.h>
#include <jansson.h>

#include "harness.h"

#define MIB           (1ull << 20)
#define TARGET_SEED   0x7a7aull /* th_target_opts_init's seed: buffer i has seed + i */
#define FAULT_SETTLE  200       /* ms for softverbs' progress threads to apply a control file */
#define MAX_RAILS_SEE 32

/* ---- fixture ------------------------------------------------------------------------------ */

typedef struct rdma_case {
    size_t target_buf; /* bytes per target buffer */
    unsigned n_bufs;
    unsigned n_engines;  /* in the target process (0: 1) */
    const char *max_qps; /* the initiator's MC_RDMA_MAX_QPS (NULL: the default) */
} rdma_case_t;

typedef struct fx {
    char tdir[64], idir[64]; /* softverbs control directories: target's, initiator's */
    th_cfg_t cfg;            /* the initiator's */
    th_target_t t;
    mc_engine_t *e;
    mc_segment_id_t seg;
    uint8_t *local;
    size_t local_len;
} fx_t;

static void rdma_config(th_cfg_t *cfg)
{
    th_config(cfg);
    th_set(cfg, "FORCE_TCP", "0");
    th_set(cfg, "PROTOCOL", "rdma"); /* also to a peer on this host */
    th_set(cfg, "PROGRESS_THREAD", "1");
}

static int fx_setup(void **state)
{
    const rdma_case_t *cs = *state;
    th_target_opts_t o;
    fx_t *fx = calloc(1, sizeof(*fx));

    assert_non_null(fx);
    th_tmpdir(fx->tdir, sizeof(fx->tdir));
    th_tmpdir(fx->idir, sizeof(fx->idir));
    rdma_config(&fx->cfg);
    th_target_opts_init(&o, &fx->cfg, cs->target_buf);
    o.n_bufs = cs->n_bufs; /* mmap'ed + registered: stays mapped after unregistering */
    if (cs->n_engines)
        o.n_engines = cs->n_engines;
    assert_int_equal(setenv("SOFTVERBS_CTL_DIR", fx->tdir, 1), 0);
    assert_int_equal(th_target_spawn(&o, &fx->t), 0);
    assert_int_equal(setenv("SOFTVERBS_CTL_DIR", fx->idir, 1), 0);
    if (cs->max_qps) /* ours only: the target was configured above */
        th_set(&fx->cfg, "RDMA_MAX_QPS", "%s", cs->max_qps);
    fx->e = th_engine(&fx->cfg);
    fx->seg = th_open(fx->e, &fx->t, 0);
    *state = fx;
    return 0;
}

static int fx_teardown(void **state)
{
    fx_t *fx = *state;

    th_kill_all();
    th_rmdir(fx->tdir); /* first: what follows may fail after a failed test */
    th_rmdir(fx->idir);
    if (fx->local)
        th_buf_free(fx->e, fx->local, fx->local_len);
    if (fx->e)
        mc_engine_destroy(fx->e);
    free(fx);
    return 0;
}

static uint8_t *fx_local(fx_t *fx, size_t len)
{
    assert_null(fx->local);
    fx->local = th_buf(fx->e, len);
    fx->local_len = len;
    return fx->local;
}

static uint64_t tbuf(const fx_t *fx, unsigned i)
{
    return fx->t.eng[0].buf[i];
}

/* ---- helpers ------------------------------------------------------------------------------ */

/* Replace the fault state of one device (written whole, then renamed into place, as softverbs
 * asks), then give every process using the device settle_ms to apply it (softverbs' progress
 * threads read the file on an inotify event). */
static void ctl_write(const char *dir, const char *dev, const char *text, int settle_ms)
{
    assert_int_equal(th_sv_ctl(dir, dev, text), 0);
    th_sleep_ms(settle_ms);
}

typedef struct rails {
    mc_rail_stats_t r[MAX_RAILS_SEE];
    size_t n;
} rails_t;

static void rails_get(fx_t *fx, rails_t *rs)
{
    assert_int_equal(mc_stats_rails(fx->e, fx->seg, rs->r, MAX_RAILS_SEE, &rs->n), 0);
    assert_true(rs->n <= MAX_RAILS_SEE);
}

static const mc_rail_stats_t *rail(const rails_t *rs, const char *name)
{
    for (size_t i = 0; i < rs->n; i++)
        if (!strcmp(rs->r[i].name, name))
            return &rs->r[i];
    return NULL;
}

static uint64_t rail_bytes(fx_t *fx, const char *name)
{
    rails_t rs;
    const mc_rail_stats_t *r;

    rails_get(fx, &rs);
    r = rail(&rs, name);
    assert_non_null(r);
    return r->bytes;
}

static void rails_print(const rails_t *rs)
{
    for (size_t i = 0; i < rs->n; i++)
        print_message("  rail %-28s state %d conns %u bytes %10llu slices %7llu errors %llu\n",
                      rs->r[i].name, rs->r[i].state, rs->r[i].conns,
                      (unsigned long long)rs->r[i].bytes, (unsigned long long)rs->r[i].slices,
                      (unsigned long long)rs->r[i].errors);
}

static bool is_rdma_rail(const char *name)
{
    return !strncmp(name, "softverbs", 9);
}

static uint64_t rdma_rail_bytes(const rails_t *rs)
{
    uint64_t sum = 0;

    for (size_t i = 0; i < rs->n; i++)
        if (is_rdma_rail(rs->r[i].name))
            sum += rs->r[i].bytes;
    return sum;
}

static void counters(mc_engine_t *e, const char *transport, mc_counters_t *c)
{
    assert_int_equal(mc_stats_transport(e, transport, c), 0);
}

/* th_xfer, telling why a transfer did not complete. */
static int xfer(mc_engine_t *e, mc_segment_id_t seg, mc_opcode_t op, void *local, uint64_t remote,
                uint64_t len, char *why, size_t why_size)
{
    int st = th_xfer(e, op, local, seg, remote, len, why, why_size);

    if (st != MC_TASK_COMPLETED && why)
        print_message("  %s of %llu bytes: state %d: %s\n", op == MC_WRITE ? "WRITE" : "READ",
                      (unsigned long long)len, st, why);
    return st;
}

/* A batch of n requests of len bytes each, covering [local, local + n*len) and the same span
 * of the target from remote. */
static mc_batch_t *submit_span(fx_t *fx, mc_opcode_t op, uint8_t *local, uint64_t remote, size_t n,
                               uint64_t len)
{
    mc_request_t *reqs = calloc(n, sizeof(*reqs));
    mc_batch_t *b;

    assert_non_null(reqs);
    for (size_t i = 0; i < n; i++)
        reqs[i] = (mc_request_t){.opcode = op,
                                 .local = local + i * len,
                                 .target = fx->seg,
                                 .target_offset = remote + i * len,
                                 .length = len};
    assert_int_equal(mc_batch_create(fx->e, n, &b), 0);
    assert_int_equal(mc_batch_submit(b, reqs, n, NULL), 0);
    free(reqs);
    return b;
}

/* ---- 1. striping over two devices ----------------------------------------------------------- */

/* One 256 MiB WRITE then READ back: the slices spread over both same-index device pairs (the
 * crossed pairs rank lower and stay idle while those work), every byte lands in place on both
 * sides, and nothing goes over tcp or shm. */
static void test_striping(void **state)
{
    fx_t *fx = *state;
    const size_t len = 256 * MIB;
    uint8_t *buf = fx_local(fx, len);
    uint64_t rb = tbuf(fx, 0);
    mc_counters_t c;
    rails_t rs;
    char why[512];

    th_fill(buf, len, 501);
    int64_t t0 = th_now_ms();
    assert_int_equal(xfer(fx->e, fx->seg, MC_WRITE, buf, rb, len, why, sizeof(why)),
                     MC_TASK_COMPLETED);
    int64_t t1 = th_now_ms();
    assert_int_equal(th_remote_check(&fx->t, 0, rb, len, 501, 0), -1);
    memset(buf, 0, len);
    int64_t t2 = th_now_ms();
    assert_int_equal(xfer(fx->e, fx->seg, MC_READ, buf, rb, len, why, sizeof(why)),
                     MC_TASK_COMPLETED);
    int64_t t3 = th_now_ms();
    assert_int_equal(th_check(buf, len, 501), -1);
    assert_int_equal(th_remote_check(&fx->t, 0, rb, len, 501, 0), -1);
    print_message("  256 MiB WRITE %lld ms, READ %lld ms (softverbs: not a performance figure)\n",
                  (long long)(t1 - t0), (long long)(t3 - t2));

    rails_get(fx, &rs);
    rails_print(&rs);
    const mc_rail_stats_t *r00 = rail(&rs, "softverbs0->softverbs0");
    const mc_rail_stats_t *r11 = rail(&rs, "softverbs1->softverbs1");
    assert_non_null(r00);
    assert_non_null(r11);
    assert_non_null(rail(&rs, "softverbs0->softverbs1"));
    assert_non_null(rail(&rs, "softverbs1->softverbs0"));
    assert_true(is_rdma_rail(rs.r[0].name)); /* rdma rails are listed first */
    assert_true(r00->bytes > 0 && r11->bytes > 0);
    assert_true(r00->errors == 0 && r11->errors == 0);
    assert_int_equal(rdma_rail_bytes(&rs), 2 * len);
    counters(fx->e, "rdma", &c);
    assert_int_equal(c.bytes_written, len);
    assert_int_equal(c.bytes_read, len);
    assert_int_equal(c.errors, 0);
    counters(fx->e, "tcp", &c);
    assert_int_equal(c.bytes_written + c.bytes_read, 0);
    counters(fx->e, "shm", &c);
    assert_int_equal(c.bytes_written + c.bytes_read, 0);
}

/* ---- 2. a port goes down in the middle of a transfer, then comes back ---------------------- */

static void both_devices(fx_t *fx, const char *fault);

/* A WRITE of n requests of each bytes from buf (filled with seed) to rb, and fault written to
 * the initiator's softverbs0 control file (both: softverbs1's too) once softverbs0 carried
 * 16 MiB of it: every task completes and every byte arrives. Returns how many ms after the
 * fault the batch completed. */
static int64_t write_through_faults(fx_t *fx, uint8_t *buf, uint64_t rb, size_t n, size_t each,
                                    unsigned seed, const char *fault, bool both)
{
    const size_t len = n * each;
    mc_batch_status_t bs;

    th_fill(buf, len, seed);
    mc_batch_t *b = submit_span(fx, MC_WRITE, buf, rb, n, each);
    int64_t dl = th_now_ms() + 30000;
    while (rail_bytes(fx, "softverbs0->softverbs0") < 16 * MIB && th_now_ms() < dl)
        th_sleep_ms(2);
    assert_true(rail_bytes(fx, "softverbs0->softverbs0") >= 16 * MIB);
    assert_int_equal(mc_batch_status(b, &bs), 0);
    assert_true(bs.bytes < len / 2); /* the fault hits the transfer, not its aftermath */
    if (both)
        both_devices(fx, fault);
    else
        ctl_write(fx->idir, "softverbs0", fault, 0);
    int64_t at = th_now_ms();
    print_message("  %.*s after %llu of %llu MiB\n", (int)strcspn(fault, "\n"), fault,
                  (unsigned long long)(bs.bytes / MIB), (unsigned long long)(len / MIB));

    assert_int_equal(mc_batch_wait(b, 90000), 0);
    int64_t took = th_now_ms() - at;
    for (size_t i = 0; i < n; i++) {
        mc_task_status_t ts;
        assert_int_equal(mc_task_status(b, i, &ts), 0);
        if (ts.state != MC_TASK_COMPLETED)
            print_message("  task %zu: state %d: %s\n", i, ts.state, ts.reason);
        assert_int_equal(ts.state, MC_TASK_COMPLETED);
    }
    print_message("  completed %lld ms after it\n", (long long)took);
    th_batch_destroy(fx->e, b);
    assert_int_equal(th_remote_check(&fx->t, 0, rb, len, seed, 0), -1);
    return took;
}

static int64_t write_through_fault(fx_t *fx, uint8_t *buf, uint64_t rb, size_t n, size_t each,
                                   unsigned seed, const char *fault)
{
    return write_through_faults(fx, buf, rb, n, each, seed, fault, false);
}

/* 512 MiB WRITE in 64 requests while the initiator's softverbs0 port goes down: the requests
 * in flight on its QPs flush and are retried on softverbs1, so every task completes and every
 * byte arrives; the softverbs0 rails are charged errors. Once the port is up again, the paused
 * rail is re-probed (after a back-off of 1 s, doubling) and carries bytes again. Between the
 * two, further transfers while the port is down pause the rail. */
static void test_port_down(void **state)
{
    fx_t *fx = *state;
    const size_t n = 64, each = 8 * MIB, len = n * each;
    uint8_t *buf = fx_local(fx, len);
    uint64_t rb = tbuf(fx, 0);
    rails_t rs;
    char why[512];

    write_through_fault(fx, buf, rb, n, each, 601, "port=down\n");

    rails_get(fx, &rs);
    rails_print(&rs);
    const mc_rail_stats_t *r00 = rail(&rs, "softverbs0->softverbs0");
    const mc_rail_stats_t *r01 = rail(&rs, "softverbs0->softverbs1");
    const mc_rail_stats_t *r11 = rail(&rs, "softverbs1->softverbs1");
    assert_non_null(r00);
    assert_non_null(r01);
    assert_non_null(r11);
    assert_true(r00->errors + r01->errors > 0);
    assert_true(r11->bytes >= len / 2);
    for (size_t i = 0; i < rs.n; i++)
        assert_true(rs.r[i].bytes <= r11->bytes);
    assert_int_equal(rdma_rail_bytes(&rs), len); /* each byte counted once: no tcp fallback */
    uint64_t r00_bytes = r00->bytes;

    /* Still down, more transfers: the engine re-probes softverbs0->softverbs0 when the other
     * rail's QP is full, the new QP's requests go nowhere (retry exceeded) and are retried on
     * softverbs1, until three failures in 10 s pause the rail. Every transfer completes. */
    int64_t t_pause = th_now_ms();
    const mc_rail_stats_t *p00 = NULL;
    for (uint64_t k = 0; th_now_ms() - t_pause < 30000; k++) {
        th_fill(buf, 64 * MIB, 650 + k);
        assert_int_equal(
            xfer(fx->e, fx->seg, MC_WRITE, buf, rb + k % 8 * 64 * MIB, 64 * MIB, why, sizeof(why)),
            MC_TASK_COMPLETED);
        assert_int_equal(th_remote_check(&fx->t, 0, rb + k % 8 * 64 * MIB, 64 * MIB, 650 + k, 0),
                         -1);
        rails_get(fx, &rs);
        p00 = rail(&rs, "softverbs0->softverbs0");
        if (p00->state == 1)
            break;
    }
    rails_print(&rs);
    print_message("  softverbs0->softverbs0 paused after %lld ms more\n",
                  (long long)(th_now_ms() - t_pause));
    assert_int_equal(p00->state, 1);
    assert_true(p00->errors >= 3);
    assert_int_equal(p00->bytes, r00_bytes); /* nothing got through the dead port */

    /* Back up: transfers go on, and within the back-off softverbs0 carries bytes again. The
     * engine sets up a QP on a rail without one only when the working rails' QPs are full, so
     * each probe is larger than one QP's window (MC_RDMA_QP_DEPTH slices). */
    ctl_write(fx->idir, "softverbs0", "port=up\n", FAULT_SETTLE);
    uint64_t before = rail_bytes(fx, "softverbs0->softverbs0");
    int64_t up_at = th_now_ms(), rejoined = -1;
    const size_t probe = 16 * MIB;
    for (uint64_t k = 0; th_now_ms() - up_at < 40000; k++) {
        th_fill(buf, probe, 700 + k);
        assert_int_equal(
            xfer(fx->e, fx->seg, MC_WRITE, buf, rb + k % 32 * probe, probe, why, sizeof(why)),
            MC_TASK_COMPLETED);
        assert_int_equal(th_remote_check(&fx->t, 0, rb + k % 32 * probe, probe, 700 + k, 0), -1);
        if (rail_bytes(fx, "softverbs0->softverbs0") > before) {
            rejoined = th_now_ms() - up_at;
            break;
        }
        th_sleep_ms(100);
    }
    rails_get(fx, &rs);
    rails_print(&rs);
    print_message("  softverbs0->softverbs0 rejoined %lld ms after the port came up\n",
                  (long long)rejoined);
    assert_true(rejoined >= 0);
    /* And a large transfer uses it again, with every byte in place. */
    th_fill(buf, 64 * MIB, 799);
    before = rail_bytes(fx, "softverbs0->softverbs0");
    assert_int_equal(xfer(fx->e, fx->seg, MC_WRITE, buf, rb, 64 * MIB, why, sizeof(why)),
                     MC_TASK_COMPLETED);
    assert_int_equal(th_remote_check(&fx->t, 0, rb, 64 * MIB, 799, 0), -1);
    assert_true(rail_bytes(fx, "softverbs0->softverbs0") > before);
}

/* ---- 2b. a device dies in the middle of a transfer ------------------------------------------ */

/* 512 MiB WRITE in 64 requests while the initiator's softverbs0 dies (fatal=1): it completes
 * nothing any more, not even a flush, so what its QPs had posted is failed by the engine at once
 * and retried on softverbs1. Every task completes, well before the transfer timeout (30 s) that
 * used to end them, every byte arrives, and softverbs0 carries nothing afterwards. */
static void test_device_fatal(void **state)
{
    fx_t *fx = *state;
    const size_t n = 64, each = 8 * MIB;
    uint8_t *buf = fx_local(fx, n * each);
    uint64_t rb = tbuf(fx, 0);
    char why[512];

    assert_true(write_through_fault(fx, buf, rb, n, each, 611, "fatal=1\n") < 20000);

    uint64_t dead_bytes =
        rail_bytes(fx, "softverbs0->softverbs0") + rail_bytes(fx, "softverbs0->softverbs1");
    th_fill(buf, 64 * MIB, 612);
    assert_int_equal(xfer(fx->e, fx->seg, MC_WRITE, buf, rb, 64 * MIB, why, sizeof(why)),
                     MC_TASK_COMPLETED);
    assert_int_equal(th_remote_check(&fx->t, 0, rb, 64 * MIB, 612, 0), -1);
    assert_int_equal(rail_bytes(fx, "softverbs0->softverbs0") +
                         rail_bytes(fx, "softverbs0->softverbs1"),
                     dead_bytes);
}

/* ---- 2c. every device of ours goes ---------------------------------------------------------- */

/* Write fault into the control files of both of the initiator's devices. */
static void both_devices(fx_t *fx, const char *fault)
{
    ctl_write(fx->idir, "softverbs0", fault, 0);
    ctl_write(fx->idir, "softverbs1", fault, FAULT_SETTLE);
}

/* 512 MiB WRITE in 64 requests while every port of the initiator goes down: no rail to the
 * target can carry, so what rdma had queued (and what flushed from its QPs) goes over tcp, and
 * every task completes well before the transfer timeout (30 s) that used to end them. While
 * the ports stay down, a READ and a WRITE go over tcp too; once they are up, a probe of the rails
 * brings the transfers back to rdma. Every byte is checked. */
static void test_devices_down(void **state)
{
    fx_t *fx = *state;
    const size_t n = 64, each = 8 * MIB, len = n * each;
    uint8_t *buf = fx_local(fx, len);
    uint64_t rb = tbuf(fx, 0);
    mc_counters_t tcp0, tcp1;
    rails_t rs;
    char why[512];

    counters(fx->e, "tcp", &tcp0);
    int64_t took = write_through_faults(fx, buf, rb, n, each, 621, "port=down\n", true);
    counters(fx->e, "tcp", &tcp1);
    rails_get(fx, &rs);
    rails_print(&rs);
    print_message("  rdma %llu MiB, tcp %llu MiB\n",
                  (unsigned long long)(rdma_rail_bytes(&rs) / MIB),
                  (unsigned long long)((tcp1.bytes_written - tcp0.bytes_written) / MIB));
    assert_true(took < 20000);
    assert_true(tcp1.bytes_written - tcp0.bytes_written > 0);
    assert_true(rdma_rail_bytes(&rs) < len);

    /* Still down: new transfers go over tcp at once. */
    uint64_t rdma_before = rdma_rail_bytes(&rs);
    th_remote_fill(&fx->t, 0, rb, 64 * MIB, 622, 0);
    assert_int_equal(xfer(fx->e, fx->seg, MC_READ, buf, rb, 64 * MIB, why, sizeof(why)),
                     MC_TASK_COMPLETED);
    assert_int_equal(th_check(buf, 64 * MIB, 622), -1);
    th_fill(buf, 64 * MIB, 623);
    assert_int_equal(xfer(fx->e, fx->seg, MC_WRITE, buf, rb + 64 * MIB, 64 * MIB, why, sizeof(why)),
                     MC_TASK_COMPLETED);
    assert_int_equal(th_remote_check(&fx->t, 0, rb + 64 * MIB, 64 * MIB, 623, 0), -1);
    rails_get(fx, &rs);
    assert_int_equal(rdma_rail_bytes(&rs), rdma_before);

    /* Up again: within the connect back-off (at most 1.6 s) a transfer probes the rails, and
     * the ones after it go over rdma. */
    both_devices(fx, "port=up\n");
    int64_t up_at = th_now_ms(), back = -1;
    for (uint64_t k = 0; th_now_ms() - up_at < 20000; k++) {
        th_fill(buf, 16 * MIB, 630 + k);
        assert_int_equal(
            xfer(fx->e, fx->seg, MC_WRITE, buf, rb + k % 16 * 16 * MIB, 16 * MIB, why, sizeof(why)),
            MC_TASK_COMPLETED);
        assert_int_equal(th_remote_check(&fx->t, 0, rb + k % 16 * 16 * MIB, 16 * MIB, 630 + k, 0),
                         -1);
        rails_get(fx, &rs);
        if (rdma_rail_bytes(&rs) > rdma_before) {
            back = th_now_ms() - up_at;
            break;
        }
        th_sleep_ms(50);
    }
    print_message("  rdma carried again %lld ms after the ports came up\n", (long long)back);
    assert_true(back >= 0);
}

/* Every device of the initiator dies (fatal=1) during a 512 MiB WRITE: the transfer completes
 * over tcp, and so do the ones after it, for good (no device of ours may connect again). */
static void test_devices_fatal(void **state)
{
    fx_t *fx = *state;
    const size_t n = 64, each = 8 * MIB;
    uint8_t *buf = fx_local(fx, n * each);
    uint64_t rb = tbuf(fx, 0);
    rails_t rs;
    char why[512];

    assert_true(write_through_faults(fx, buf, rb, n, each, 641, "fatal=1\n", true) < 20000);
    rails_get(fx, &rs);
    uint64_t rdma_before = rdma_rail_bytes(&rs);
    th_sleep_ms(2000); /* past every connect back-off */
    for (unsigned k = 0; k < 3; k++) {
        th_fill(buf, 32 * MIB, 642 + k);
        assert_int_equal(xfer(fx->e, fx->seg, MC_WRITE, buf, rb, 32 * MIB, why, sizeof(why)),
                         MC_TASK_COMPLETED);
        assert_int_equal(th_remote_check(&fx->t, 0, rb, 32 * MIB, 642 + k, 0), -1);
    }
    rails_get(fx, &rs);
    assert_int_equal(rdma_rail_bytes(&rs), rdma_before);
}

/* ---- 3. requests the target's NIC must refuse --------------------------------------------- */

#define SMALL (1 * MIB)

/* (a) Every WRITE/READ the initiator's devices send carries a corrupted rkey: the target's NIC
 * answers with a remote access error, the task fails with that reason (not retried), and no
 * byte moves on either side. With the fault cleared, transfers work again. */
static void test_corrupt_rkey(void **state)
{
    fx_t *fx = *state;
    uint8_t *buf = fx_local(fx, SMALL);
    uint64_t rb = tbuf(fx, 0);
    char why[512];

    ctl_write(fx->idir, "softverbs0", "corrupt_rkey=1\n", FAULT_SETTLE);
    ctl_write(fx->idir, "softverbs1", "corrupt_rkey=1\n", FAULT_SETTLE);
    th_fill(buf, SMALL, 801);
    assert_int_equal(xfer(fx->e, fx->seg, MC_WRITE, buf, rb, SMALL, why, sizeof(why)),
                     MC_TASK_FAILED);
    assert_true(th_contains(why, "remote access error"));
    assert_int_equal(th_remote_check(&fx->t, 0, rb, fx->t.buf_size, TARGET_SEED, 0), -1);

    assert_int_equal(xfer(fx->e, fx->seg, MC_READ, buf, rb, SMALL, why, sizeof(why)),
                     MC_TASK_FAILED);
    assert_true(th_contains(why, "remote access error"));
    assert_int_equal(th_check(buf, SMALL, 801), -1);

    ctl_write(fx->idir, "softverbs0", "corrupt_rkey=0\n", FAULT_SETTLE);
    ctl_write(fx->idir, "softverbs1", "corrupt_rkey=0\n", FAULT_SETTLE);
    assert_int_equal(xfer(fx->e, fx->seg, MC_WRITE, buf, rb, SMALL, why, sizeof(why)),
                     MC_TASK_COMPLETED);
    assert_int_equal(th_remote_check(&fx->t, 0, rb, SMALL, 801, 0), -1);
    memset(buf, 0, SMALL);
    assert_int_equal(xfer(fx->e, fx->seg, MC_READ, buf, rb + SMALL, SMALL, why, sizeof(why)),
                     MC_TASK_COMPLETED);
    assert_int_equal(th_check_at(buf, SMALL, TARGET_SEED, SMALL), -1);
}

/* (b) The target unregisters a buffer while we still hold its old descriptor (with its rkeys):
 * a WRITE into it fails, naming the refused access, and the memory (still mapped at the
 * target) is unchanged; a READ fails too and leaves our buffer alone. The other buffer works. */
static void test_stale_descriptor(void **state)
{
    fx_t *fx = *state;
    uint8_t *buf = fx_local(fx, SMALL);
    uint64_t b0 = tbuf(fx, 0), b1 = tbuf(fx, 1);
    th_cmd_t c = {.op = TH_CMD_UNREGISTER, .a0 = 1};
    th_reply_t r;
    char why[512];

    /* Warm up: QPs exist on the rails before the buffer goes. */
    th_fill(buf, SMALL, 901);
    assert_int_equal(xfer(fx->e, fx->seg, MC_WRITE, buf, b0, SMALL, why, sizeof(why)),
                     MC_TASK_COMPLETED);
    assert_int_equal(th_target_cmd(&fx->t, &c, &r, 30000), 0);
    assert_int_equal(r.rc, 0);

    th_fill(buf, SMALL, 902);
    assert_int_equal(xfer(fx->e, fx->seg, MC_WRITE, buf, b1, SMALL, why, sizeof(why)),
                     MC_TASK_FAILED);
    assert_true(th_contains(why, "access") || th_contains(why, "registered"));
    assert_int_equal(th_remote_check(&fx->t, 0, b1, fx->t.buf_size, TARGET_SEED + 1, 0), -1);
    assert_int_equal(xfer(fx->e, fx->seg, MC_READ, buf, b1, SMALL, why, sizeof(why)),
                     MC_TASK_FAILED);
    assert_true(th_contains(why, "access") || th_contains(why, "registered"));
    assert_int_equal(th_check(buf, SMALL, 902), -1);

    assert_int_equal(xfer(fx->e, fx->seg, MC_WRITE, buf, b0, SMALL, why, sizeof(why)),
                     MC_TASK_COMPLETED);
    assert_int_equal(th_remote_check(&fx->t, 0, b0, SMALL, 902, 0), -1);
}

/* (b') The target registers a buffer again at the same address: its memory regions, and their
 * rkeys, are new. The buffer key it packs then, added to the segment, replaces what our copy
 * of its descriptor said (the old rkeys would be refused), and the same key added twice is
 * taken once. */
static void test_reregistered_key(void **state)
{
    fx_t *fx = *state;
    uint8_t *buf = fx_local(fx, SMALL);
    uint64_t b1 = tbuf(fx, 1);
    th_cmd_t c = {.op = TH_CMD_UNREGISTER, .a0 = 1, .a1 = 1};
    th_reply_t r;
    char why[512];

    th_fill(buf, SMALL, 911);
    assert_int_equal(xfer(fx->e, fx->seg, MC_WRITE, buf, b1, SMALL, why, sizeof(why)),
                     MC_TASK_COMPLETED);
    assert_int_equal(th_target_cmd(&fx->t, &c, &r, 30000), 0);
    assert_int_equal(r.rc, 0);
    c = (th_cmd_t){.op = TH_CMD_KEY, .a0 = b1};
    assert_int_equal(th_target_cmd(&fx->t, &c, &r, 30000), 0);
    assert_int_equal(r.rc, 0);
    for (int i = 0; i < 2; i++)
        assert_int_equal(mc_segment_add_buffer(fx->e, fx->seg, r.msg, MC_BUFFER_KEY_SIZE), 0);
    th_fill(buf, SMALL, 912);
    int st = xfer(fx->e, fx->seg, MC_WRITE, buf, b1, SMALL, why, sizeof(why));
    if (st != MC_TASK_COMPLETED)
        print_error("WRITE after the new key: %s\n", why);
    assert_int_equal(st, MC_TASK_COMPLETED);
    assert_int_equal(th_remote_check(&fx->t, 0, b1, SMALL, 912, 0), -1);
    memset(buf, 0, SMALL);
    assert_int_equal(xfer(fx->e, fx->seg, MC_READ, buf, b1, SMALL, why, sizeof(why)),
                     MC_TASK_COMPLETED);
    assert_int_equal(th_check(buf, SMALL, 912), -1);
}

/* The target's descriptor blob, rewritten by edit(root, arg). Free with free(). */
static char *blob_edit(const fx_t *fx, void (*edit)(json_t *root, void *arg), void *arg,
                       size_t *len_p)
{
    json_error_t err;
    json_t *root = json_loadb((const char *)fx->t.eng[0].blob, fx->t.eng[0].blob_len, 0, &err);
    char *text;

    if (!root)
        print_error("descriptor blob: %s\n", err.text);
    assert_non_null(root);
    edit(root, arg);
    text = json_dumps(root, JSON_COMPACT);
    json_decref(root);
    assert_non_null(text);
    *len_p = strlen(text);
    return text;
}

/* Flip bits of the key byte of every rkey: softverbs' keys are slot << 8 | key byte, so the
 * result names no memory region of the target. */
static void edit_rkeys(json_t *root, void *arg)
{
    json_t *bufs = json_object_get(root, "buffers"), *jb, *dev, *key;
    size_t i, j, k, *changed = arg;

    assert_true(json_is_array(bufs));
    json_array_foreach(bufs, i, jb)
    {
        json_t *rk = json_object_get(jb, "rkey");
        assert_true(json_is_array(rk) && json_array_size(rk) > 0);
        json_array_foreach(rk, j, dev)
        {
            json_array_foreach(dev, k, key)
            {
                assert_true(json_is_integer(key));
                json_integer_set(key, json_integer_value(key) ^ 0x3c);
                (*changed)++;
            }
        }
    }
}

static mc_segment_id_t open_text(mc_engine_t *e, const char *text, size_t len)
{
    mc_segment_id_t id = MC_SEGMENT_INVALID;
    int rc = mc_segment_open_blob(e, text, len, &id);

    if (rc)
        print_error("mc_segment_open_blob: %s: %s\n", mc_err_name(rc), mc_last_error());
    assert_int_equal(rc, 0);
    return id;
}

/* (c) A descriptor with forged rkeys, opened by a fresh engine: its WRITE and READ fail with
 * the remote access error and move nothing. */
static void test_forged_rkey(void **state)
{
    fx_t *fx = *state;
    size_t changed = 0, len;
    char *text = blob_edit(fx, edit_rkeys, &changed, &len);
    uint64_t b0 = tbuf(fx, 0);
    char why[512];

    /* 2 buffers x 2 devices x at least one region each. */
    assert_true(changed >= 4);
    mc_engine_t *e2 = th_engine(&fx->cfg);
    mc_segment_id_t seg2 = open_text(e2, text, len);
    uint8_t *buf = th_buf(e2, SMALL);

    th_fill(buf, SMALL, 1001);
    assert_int_equal(xfer(e2, seg2, MC_WRITE, buf, b0, SMALL, why, sizeof(why)), MC_TASK_FAILED);
    assert_true(th_contains(why, "remote access error"));
    assert_int_equal(th_remote_check(&fx->t, 0, b0, fx->t.buf_size, TARGET_SEED, 0), -1);
    assert_int_equal(xfer(e2, seg2, MC_READ, buf, b0, SMALL, why, sizeof(why)), MC_TASK_FAILED);
    assert_true(th_contains(why, "remote access error"));
    assert_int_equal(th_check(buf, SMALL, 1001), -1);
    mc_counters_t c;
    counters(e2, "rdma", &c);
    assert_int_equal(c.bytes_written + c.bytes_read, 0);

    th_buf_free(e2, buf, SMALL);
    assert_int_equal(mc_segment_close(e2, seg2), 0);
    mc_engine_destroy(e2);
    free(text);

    /* The target is fine: the genuine descriptor works. */
    buf = fx_local(fx, SMALL);
    th_fill(buf, SMALL, 1002);
    assert_int_equal(xfer(fx->e, fx->seg, MC_WRITE, buf, b0, SMALL, why, sizeof(why)),
                     MC_TASK_COMPLETED);
    assert_int_equal(th_remote_check(&fx->t, 0, b0, SMALL, 1002, 0), -1);
}

/* The descriptor as a peer on another host would publish it; arg: also relabel its RDMA
 * devices as Ethernet (a link layer we do not share). */
static void edit_other_host(json_t *root, void *arg)
{
    json_t *devs = json_object_get(root, "rdma"), *d;
    size_t i;

    json_object_set_new(root, "host", json_string("another-boot-id/net:1"));
    assert_true(json_is_array(devs) && json_array_size(devs) == 2);
    if (arg)
        json_array_foreach(devs, i, d) json_object_set_new(d, "link", json_string("eth"));
}

/* MC_PROTOCOL=auto: a peer on another host that publishes devices on our link layer is reached
 * over rdma; one whose devices are on another link layer over tcp. Verified both ways. */
static void test_auto(void **state)
{
    fx_t *fx = *state;
    uint64_t b0 = tbuf(fx, 0);
    th_cfg_t cfg;
    char why[512];

    th_config(&cfg);
    assert_null(th_get(&cfg, "PROTOCOL")); /* auto */
    for (int eth = 0; eth < 2; eth++) {
        size_t len;
        char *text = blob_edit(fx, edit_other_host, eth ? "eth" : NULL, &len);
        mc_engine_t *e2 = th_engine(&cfg);
        mc_segment_id_t seg2 = open_text(e2, text, len);
        uint8_t *buf = th_buf(e2, SMALL);
        mc_counters_t rdma, tcp, shm;

        th_fill(buf, SMALL, 1100 + (uint64_t)eth);
        assert_int_equal(xfer(e2, seg2, MC_WRITE, buf, b0, SMALL, why, sizeof(why)),
                         MC_TASK_COMPLETED);
        assert_int_equal(th_remote_check(&fx->t, 0, b0, SMALL, 1100 + (uint64_t)eth, 0), -1);
        memset(buf, 0, SMALL);
        assert_int_equal(xfer(e2, seg2, MC_READ, buf, b0, SMALL, why, sizeof(why)),
                         MC_TASK_COMPLETED);
        assert_int_equal(th_check(buf, SMALL, 1100 + (uint64_t)eth), -1);
        counters(e2, "rdma", &rdma);
        counters(e2, "tcp", &tcp);
        counters(e2, "shm", &shm);
        assert_int_equal(shm.bytes_written + shm.bytes_read, 0);
        assert_int_equal((eth ? tcp : rdma).bytes_written, SMALL);
        assert_int_equal((eth ? rdma : tcp).bytes_written, 0);
        th_buf_free(e2, buf, SMALL);
        assert_int_equal(mc_segment_close(e2, seg2), 0);
        mc_engine_destroy(e2);
        free(text);
    }
}

/* Stretch the lower target buffer by 64 KiB over the higher one (adjacent mappings) and drop
 * the higher one from the descriptor, keeping the lower one's rkeys. */
typedef struct stretch {
    uint64_t lo, hi, len;
} stretch_t;

static void edit_stretch(json_t *root, void *arg)
{
    const stretch_t *s = arg;
    json_t *bufs = json_object_get(root, "buffers"), *jb;
    size_t i, drop = SIZE_MAX;

    json_array_foreach(bufs, i, jb)
    {
        uint64_t a = (uint64_t)json_integer_value(json_object_get(jb, "addr"));
        if (a == s->lo)
            json_object_set_new(jb, "length", json_integer((json_int_t)(s->len + 64 * 1024)));
        else if (a == s->hi)
            drop = i;
    }
    assert_true(drop != SIZE_MAX);
    assert_int_equal(json_array_remove(bufs, drop), 0);
}

/* (d) Remote ranges outside the registered memory. Outside the descriptor's buffers: the task
 * fails at once with a reason, touching nothing. Inside a forged descriptor's (longer) buffer
 * but past the memory region: the target's NIC refuses it, and the neighbouring memory, even
 * though registered under another key, is unchanged. */
static void test_out_of_bounds(void **state)
{
    fx_t *fx = *state;
    const size_t sz = fx->t.buf_size;
    uint8_t *buf = fx_local(fx, SMALL);
    uint64_t b0 = tbuf(fx, 0), b1 = tbuf(fx, 1);
    char why[512];

    th_fill(buf, SMALL, 1101);
    /* Straddling the end of buffer 0. */
    why[0] = 0;
    assert_int_equal(
        xfer(fx->e, fx->seg, MC_WRITE, buf, b0 + sz - 32 * 1024, 64 * 1024, why, sizeof(why)),
        MC_TASK_FAILED);
    assert_true(why[0] != 0);
    /* Far from every buffer, and before the first. */
    uint64_t far = (b0 > b1 ? b0 : b1) + sz + 1024 * MIB;
    assert_int_equal(xfer(fx->e, fx->seg, MC_WRITE, buf, far, 4096, why, sizeof(why)),
                     MC_TASK_FAILED);
    assert_true(why[0] != 0);
    assert_int_equal(xfer(fx->e, fx->seg, MC_READ, buf, 4096, 4096, why, sizeof(why)),
                     MC_TASK_FAILED);
    assert_true(why[0] != 0);
    assert_int_equal(th_check(buf, SMALL, 1101), -1);
    assert_int_equal(th_remote_check(&fx->t, 0, b0, sz, TARGET_SEED, 0), -1);
    assert_int_equal(th_remote_check(&fx->t, 0, b1, sz, TARGET_SEED + 1, 0), -1);
    mc_counters_t c;
    counters(fx->e, "rdma", &c);
    assert_int_equal(c.bytes_written + c.bytes_read, 0);

    /* Past the memory region, by a forged descriptor. */
    stretch_t s = {.lo = b0 < b1 ? b0 : b1, .hi = b0 < b1 ? b1 : b0, .len = sz};
    if (s.lo + sz != s.hi) {
        print_message("  target buffers not adjacent: forged-length check skipped\n");
        return;
    }
    size_t len;
    char *text = blob_edit(fx, edit_stretch, &s, &len);
    mc_engine_t *e2 = th_engine(&fx->cfg);
    mc_segment_id_t seg2 = open_text(e2, text, len);
    uint8_t *buf2 = th_buf(e2, SMALL);
    uint64_t hi_seed = TARGET_SEED + (s.hi == b1);

    th_fill(buf2, SMALL, 1102);
    assert_int_equal(xfer(e2, seg2, MC_WRITE, buf2, s.hi, 64 * 1024, why, sizeof(why)),
                     MC_TASK_FAILED);
    assert_true(th_contains(why, "remote access error"));
    assert_int_equal(th_remote_check(&fx->t, 0, s.hi, sz, hi_seed, 0), -1);
    assert_int_equal(xfer(e2, seg2, MC_READ, buf2, s.hi, 64 * 1024, why, sizeof(why)),
                     MC_TASK_FAILED);
    assert_true(th_contains(why, "remote access error"));
    assert_int_equal(th_check(buf2, SMALL, 1102), -1);
    /* The same forged descriptor still reaches the genuine range. */
    assert_int_equal(xfer(e2, seg2, MC_WRITE, buf2, s.lo, SMALL, why, sizeof(why)),
                     MC_TASK_COMPLETED);
    assert_int_equal(th_remote_check(&fx->t, 0, s.lo, SMALL, 1102, 0), -1);
    th_buf_free(e2, buf2, SMALL);
    assert_int_equal(mc_segment_close(e2, seg2), 0);
    mc_engine_destroy(e2);
    free(text);
}

/* ---- 4. the target dies during a transfer ------------------------------------------------- */

/* The target is killed while 256 MiB are being written over rdma: every task ends, COMPLETED
 * (before the death) or FAILED with a reason, within seconds and well before the transfer
 * timeout; a new request fails cleanly and the engine goes down in bounded time. */
static void test_dead_peer(void **state)
{
    fx_t *fx = *state;
    const size_t n = 64, each = 4 * MIB, len = n * each;
    uint64_t rb = tbuf(fx, 0);
    mc_batch_status_t bs;
    char why[512];

    /* A long transfer timeout, so that only the detection of the death can end the tasks. */
    mc_engine_destroy(fx->e);
    th_set(&fx->cfg, "TRANSFER_TIMEOUT", "120");
    fx->e = th_engine(&fx->cfg);
    fx->seg = th_open(fx->e, &fx->t, 0);
    uint8_t *buf = fx_local(fx, len);
    th_fill(buf, len, 1201);

    mc_batch_t *b = submit_span(fx, MC_WRITE, buf, rb, n, each);
    int64_t dl = th_now_ms() + 30000;
    do {
        th_sleep_ms(2);
        assert_int_equal(mc_batch_status(b, &bs), 0);
    } while (bs.bytes == 0 && th_now_ms() < dl);
    assert_true(bs.bytes > 0 && bs.bytes < len);
    th_target_kill(&fx->t);
    int64_t t0 = th_now_ms();
    assert_int_equal(mc_batch_wait(b, 10000), 0);
    int64_t took = th_now_ms() - t0;
    print_message("  all tasks final %lld ms after the kill\n", (long long)took);
    assert_true(took <= 10000);
    size_t failed = 0, done = 0;
    for (size_t i = 0; i < n; i++) {
        mc_task_status_t ts;
        assert_int_equal(mc_task_status(b, i, &ts), 0);
        if (ts.state == MC_TASK_COMPLETED) {
            done++;
            continue;
        }
        if (failed++ == 0)
            print_message("  first failure: state %d: %s\n", ts.state, ts.reason);
        assert_int_equal(ts.state, MC_TASK_FAILED);
        assert_non_null(ts.reason);
        assert_true(ts.reason[0] != 0);
    }
    print_message("  %zu completed, %zu failed\n", done, failed);
    assert_true(failed > 0);
    th_batch_destroy(fx->e, b);

    t0 = th_now_ms();
    int st = xfer(fx->e, fx->seg, MC_WRITE, buf, rb, SMALL, why, sizeof(why));
    assert_true(st < 0 || st == MC_TASK_FAILED);
    assert_true(th_now_ms() - t0 <= 10000);
    th_buf_free(fx->e, fx->local, fx->local_len);
    fx->local = NULL;
    t0 = th_now_ms();
    mc_engine_destroy(fx->e);
    fx->e = NULL;
    assert_true(th_now_ms() - t0 <= 10000);
}

/* ---- 10. a READ that times out ------------------------------------------------------------ */

/* A READ that times out against a stalled target (SIGSTOP: alive, its QPs up) writes nothing
 * into the host's memory afterwards, as over tcp: its QP goes to ERR before the task ends, so
 * the answers the target sends once it goes on are dropped by our device. The QP's rail gets a
 * new one, and the next READ moves the bytes. */
static void test_late_read_dropped(void **state)
{
    fx_t *fx = *state;
    const size_t len = 4 * MIB;
    uint64_t rb = tbuf(fx, 0);
    mc_submit_opts_t o = {.size = sizeof(o), .timeout_ms = 300};
    mc_task_status_t st;
    mc_batch_t *b;
    char why[512];

    uint8_t *dst = fx_local(fx, len);
    th_fill(dst, len, 77);
    assert_int_equal(xfer(fx->e, fx->seg, MC_WRITE, dst, rb, len, why, sizeof(why)),
                     MC_TASK_COMPLETED);
    th_stop(fx->t.pid);
    mc_request_t r = {
        .opcode = MC_READ, .local = dst, .target = fx->seg, .target_offset = rb, .length = len};
    assert_int_equal(mc_batch_create(fx->e, 1, &b), 0);
    assert_int_equal(mc_batch_submit_ex(b, &r, 1, &o), 0);
    int rc = mc_batch_wait(b, 10000);
    memset(dst, 0xee, len); /* the host's again */
    assert_int_equal(kill(fx->t.pid, SIGCONT), 0);
    assert_int_equal(rc, 0);
    assert_int_equal(mc_task_status(b, 0, &st), 0);
    assert_int_equal(st.state, MC_TASK_TIMEOUT);
    th_batch_destroy(fx->e, b); /* once the engine let go of the task */
    th_sleep_ms(300);           /* the target answers what it had */
    for (size_t i = 0; i < len; i++)
        if (dst[i] != 0xee)
            fail_msg("byte %zu of the timed-out READ's memory changed after the timeout", i);
    assert_int_equal(xfer(fx->e, fx->seg, MC_READ, dst, rb, len, why, sizeof(why)),
                     MC_TASK_COMPLETED);
    assert_int_equal(th_check(dst, len, 77), -1);
    mc_counters_t c;
    counters(fx->e, "rdma", &c);
    assert_true(c.bytes_read >= len); /* over rdma, not another transport */
}

/* ---- main --------------------------------------------------------------------------------- */

/* The cases inject faults through softverbs' control files: they need its devices, two of
 * them (SOFTVERBS_DEVICES=2). */
static int softverbs_ready(void)
{
    int n = 0, found = 0;
    struct ibv_device **l = ibv_get_device_list(&n);

    for (int i = 0; l && i < n; i++)
        found += !strcmp(ibv_get_device_name(l[i]), "softverbs0") ||
                 !strcmp(ibv_get_device_name(l[i]), "softverbs1");
    if (l)
        ibv_free_device_list(l);
    if (n == 0)
        fprintf(stderr, "test_rdma: no RDMA device: skipped\n");
    else if (found < 2)
        fprintf(stderr, "test_rdma: needs softverbs0 and softverbs1 (SOFTVERBS_DEVICES=2 with "
                        "LD_LIBRARY_PATH at build/lib/softverbs): skipped\n");
    return found == 2;
}

static rdma_case_t big256 = {256 * MIB, 1, 0, NULL};
static rdma_case_t big512 = {512 * MIB, 1, 0, NULL};
static rdma_case_t small2 = {4 * MIB, 2, 0, NULL};
static rdma_case_t two_peers_one_qp = {4 * MIB, 1, 2, "1"};

/* ---- 9. one QP for two peers ------------------------------------------------------------- */

/* MC_RDMA_MAX_QPS=1 and two peers (engines of the target process), each sent messages and
 * then read from, in turns: the one QP we may hold carries the first peer's messages; once they
 * are answered it is closed for the other peer's transfer (its messages go back to tcp, and on
 * to a new QP later). Every transfer completes, every message arrives once and in order. */
static void test_qp_limit(void **state)
{
    fx_t *fx = *state;
    mc_segment_id_t seg[2] = {fx->seg, th_open(fx->e, &fx->t, 1)};
    uint8_t *local = fx_local(fx, MIB);
    uint32_t sent[2] = {0, 0};
    mc_counters_t c;
    th_reply_t r;
    char why[256];

    for (int round = 0; round < 4; round++) {
        for (unsigned k = 0; k < 2; k++) {
            for (int i = 0; i < 50; i++, sent[k]++) /* message n is its number (harness.c) */
                assert_int_equal(mc_msg_send(fx->e, seg[k], TH_MSG_ID, &sent[k], 4), 0);
            memset(local, 0, MIB);
            assert_int_equal(xfer(fx->e, seg[k], MC_READ, local, fx->t.eng[k].buf[0] + MIB, MIB,
                                  why, sizeof(why)),
                             MC_TASK_COMPLETED);
            assert_int_equal(th_check_at(local, MIB, TARGET_SEED + 16 * k, MIB), -1);
        }
    }
    for (unsigned k = 0; k < 2; k++) {
        th_cmd_t cmd = {.op = TH_CMD_MSGS, .eng = k, .a0 = sent[k], .a3 = 30000};
        assert_int_equal(th_target_cmd(&fx->t, &cmd, &r, 40000), 0);
        assert_int_equal(r.v[0], sent[k]);
        assert_int_equal(r.v[1] + r.v[2] + r.v[3], 0);
    }
    counters(fx->e, "rdma", &c);
    print_message("  %llu of %u messages over rdma\n", (unsigned long long)c.msgs_sent,
                  sent[0] + sent[1]);
}

#define CASE(fn, cs) cmocka_unit_test_prestate_setup_teardown(fn, fx_setup, fx_teardown, &cs)

int main(int argc, char **argv)
{
    th_main(argc, argv);
    if (!softverbs_ready())
        return 77;
    const struct CMUnitTest tests[] = {
        CASE(test_striping, big256),
        CASE(test_port_down, big512),
        CASE(test_device_fatal, big512),
        CASE(test_devices_down, big512),
        CASE(test_devices_fatal, big512),
        CASE(test_corrupt_rkey, small2),
        CASE(test_stale_descriptor, small2),
        CASE(test_forged_rkey, small2),
        CASE(test_out_of_bounds, small2),
        CASE(test_dead_peer, big256),
        CASE(test_auto, small2),
        CASE(test_qp_limit, two_peers_one_qp),
        CASE(test_reregistered_key, small2),
        CASE(test_late_read_dropped, small2),
    };
    int rc = cmocka_run_group_tests_name("rdma", tests, NULL, NULL);
    th_kill_all();
    return rc;
}
