/*
 * What hosts that embed the engine in their own process and event loop rely on (the UCX
 * module, the KV plugin, the P2P store): batches reused without allocating, per-submit
 * timeouts, release that never blocks, progress only where the host drives it (and a host
 * that only sends still moving its messages), connections
 * that survive a host computing for seconds, overlapping registrations, non-blocking opens (to
 * unreachable peers, by a name metadata learns later, to self), and a target flooded with
 * connections while out of descriptors. Targets run in child processes (harness.c).
 */
#include <errno.h>
#include <fcntl.h>
#include <malloc.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/resource.h>
#include <sched.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <cmocka.h>

#include "harness.h"

#define N_ENG 4
#define N_TGT 2
#define KIB   1024ull
#define MIB   (1024ull * 1024)

static struct {
    mc_engine_t *e[N_ENG];
    th_target_t t[N_TGT];
    int *fds;
    size_t n_fds;
    char dir[64];
} g;

static int teardown(void **state)
{
    (void)state;
    for (int i = 0; i < N_TGT; i++)
        if (g.t[i].pid > 0)
            kill(g.t[i].pid, SIGCONT);
    th_kill_all();
    for (int i = 0; i < N_ENG; i++)
        if (g.e[i])
            mc_engine_destroy(g.e[i]);
    for (size_t i = 0; i < g.n_fds; i++)
        close(g.fds[i]);
    free(g.fds);
    th_rmdir(g.dir);
    memset(&g, 0, sizeof(g));
    return 0;
}

static th_target_t *spawn(int i, const th_cfg_t *cfg, size_t len, int use_alloc)
{
    th_target_opts_t o;

    th_target_opts_init(&o, cfg, len);
    o.use_alloc = use_alloc;
    assert_int_equal(th_target_spawn(&o, &g.t[i]), 0);
    return &g.t[i];
}

/* One task with a timeout of its own (0: the default). */
static mc_task_status_t xfer_opts(mc_engine_t *e, mc_opcode_t op, void *local, mc_segment_id_t seg,
                                  uint64_t remote, uint64_t len, unsigned timeout_ms)
{
    mc_submit_opts_t o = {.size = sizeof(o), .timeout_ms = timeout_ms};
    mc_request_t r = {
        .opcode = op, .local = local, .target = seg, .target_offset = remote, .length = len};

    return th_xfer_req(e, &r, &o);
}

/* ---- counting allocations ------------------------------------------------------------------ */

/* Every malloc/calloc/realloc of the process while counting is on (glibc's own are forwarded
 * to). Not under AddressSanitizer, which owns the allocator. */
#if defined(__SANITIZE_ADDRESS__)
#define COUNT_ALLOCS 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define COUNT_ALLOCS 0
#endif
#endif
#ifndef COUNT_ALLOCS
#define COUNT_ALLOCS 1
#endif

static atomic_ulong n_allocs;
static atomic_bool counting;

#if COUNT_ALLOCS
extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);

void *malloc(size_t n)
{
    if (atomic_load_explicit(&counting, memory_order_relaxed))
        atomic_fetch_add_explicit(&n_allocs, 1, memory_order_relaxed);
    return __libc_malloc(n);
}

void *calloc(size_t n, size_t m)
{
    if (atomic_load_explicit(&counting, memory_order_relaxed))
        atomic_fetch_add_explicit(&n_allocs, 1, memory_order_relaxed);
    return __libc_calloc(n, m);
}

void *realloc(void *p, size_t n)
{
    if (atomic_load_explicit(&counting, memory_order_relaxed))
        atomic_fetch_add_explicit(&n_allocs, 1, memory_order_relaxed);
    return __libc_realloc(p, n);
}
#endif

/* ---- reusable batches ---------------------------------------------------------------------- */

/* A batch of 10^5 small WRITEs, reset and resubmitted 100 times: every round moves its bytes
 * (checked at the target after the first and the last round), its status comes from counters,
 * and from the second round on nothing is allocated per task: the process's allocations over
 * 99 rounds stay far below one per task, and the heap does not grow. */
static void test_batch_reuse(void **state)
{
    const size_t n = 100000, sz = 64, len = n * sz, rounds = COUNT_ALLOCS ? 100 : 10;
    th_cfg_t cfg;
    mc_batch_status_t bs;
    mc_batch_t *b;

    (void)state;
    th_config(&cfg);
    th_set(&cfg, "FORCE_TCP", "0"); /* same host, engine memory: shm moves 10^7 tasks quickly */
    th_target_t *t = spawn(0, &cfg, len, 1);
    mc_engine_t *e = g.e[0] = th_engine(&cfg);
    mc_segment_id_t seg = th_open(e, t, 0);
    uint8_t *src = th_buf(e, len);
    mc_request_t *reqs = calloc(n, sizeof(*reqs));
    assert_non_null(reqs);
    for (size_t i = 0; i < n; i++)
        reqs[i] = (mc_request_t){.opcode = MC_WRITE,
                                 .local = src + i * sz,
                                 .target = seg,
                                 .target_offset = t->eng[0].buf[0] + i * sz,
                                 .length = sz};
    assert_int_equal(mc_batch_create(e, n, &b), 0);
    size_t in_use = 0;
    unsigned long allocs = 0;
    for (size_t r = 0; r < rounds; r++) {
        th_fill(src, len, 9000 + r);
        if (r == 1) {
            in_use = mallinfo2().uordblks;
            atomic_store(&n_allocs, 0);
            atomic_store(&counting, true);
        }
        assert_int_equal(mc_batch_submit(b, reqs, n, NULL), 0);
        assert_int_equal(mc_batch_wait(b, 60000), 0);
        assert_int_equal(mc_batch_status(b, &bs), 0);
        assert_int_equal(bs.state, MC_TASK_COMPLETED);
        assert_int_equal(bs.tasks, n);
        assert_int_equal(bs.completed, n);
        assert_int_equal(bs.bytes, len);
        if (r == 0 || r == rounds - 1) {
            atomic_store(&counting, false);
            assert_int_equal(th_remote_check(t, 0, t->eng[0].buf[0], len, 9000 + r, 0), -1);
            atomic_store(&counting, r > 0);
        }
        while (mc_batch_reset(b) == -EBUSY)
            mc_engine_progress(e);
        assert_int_equal(mc_batch_status(b, &bs), 0);
        assert_int_equal(bs.tasks, 0);
    }
    atomic_store(&counting, false);
    allocs = atomic_load(&n_allocs);
    ssize_t growth = (ssize_t)mallinfo2().uordblks - (ssize_t)in_use;
    print_message("  %zu rounds of %zu tasks: %lu allocations after the first round, heap %+zd "
                  "bytes\n",
                  rounds, n, allocs, growth);
    if (COUNT_ALLOCS) {
        assert_true(allocs < rounds * 100); /* timers, wake-ups: never per task (10^7) */
        assert_true(growth < (ssize_t)(1 * MIB));
    }
    assert_int_equal(mc_batch_destroy(b), 0);
    free(reqs);
    th_buf_free(e, src, len);
}

/* ---- per-submit timeouts ------------------------------------------------------------------- */

/* Stop t (SIGSTOP: alive, its tcp connections up) and submit a READ of len bytes of its buffer
 * into dst, with a timeout of its own: the batch, its task in flight. */
static mc_batch_t *read_from_stopped(mc_engine_t *e, th_target_t *t, mc_segment_id_t seg, void *dst,
                                     size_t len, unsigned timeout_ms)
{
    mc_submit_opts_t o = {.size = sizeof(o), .timeout_ms = timeout_ms};
    mc_request_t r = {.opcode = MC_READ,
                      .local = dst,
                      .target = seg,
                      .target_offset = t->eng[0].buf[0],
                      .length = len};
    mc_batch_t *b;

    th_stop(t->pid);
    assert_int_equal(mc_batch_create(e, 1, &b), 0);
    assert_int_equal(mc_batch_submit_ex(b, &r, 1, &o), 0);
    return b;
}

/* A READ that times out against a stalled target (SIGSTOP: alive, its tcp connection up)
 * writes nothing into the host's memory afterwards: the answers that come once the target goes
 * on are read and dropped, so memory the host reused keeps what it put there. */
static void test_late_read_dropped(void **state)
{
    const size_t len = 4 * MIB;
    mc_task_status_t st;
    th_cfg_t cfg;

    (void)state;
    th_config(&cfg);
    th_set(&cfg, "FORCE_TCP", "1");
    th_set(&cfg, "TCP_CONNS", "1");
    th_target_t *t = spawn(0, &cfg, len, 0);
    mc_engine_t *e = g.e[0] = th_engine(&cfg);
    mc_segment_id_t seg = th_open(e, t, 0);
    uint8_t *src = th_buf(e, len), *dst = th_buf(e, len);
    th_fill(src, len, 41);
    assert_int_equal(th_xfer(e, MC_WRITE, src, seg, t->eng[0].buf[0], len, NULL, 0),
                     MC_TASK_COMPLETED);

    mc_batch_t *b = read_from_stopped(e, t, seg, dst, len, 300);
    int rc = mc_batch_wait(b, 10000);
    memset(dst, 0xee, len); /* the host's again */
    assert_int_equal(kill(t->pid, SIGCONT), 0);
    assert_int_equal(rc, 0);
    assert_int_equal(mc_task_status(b, 0, &st), 0);
    assert_int_equal(st.state, MC_TASK_TIMEOUT);
    th_batch_destroy(e, b); /* once the engine let go of the task: its answers came */
    for (size_t i = 0; i < len; i++)
        if (dst[i] != 0xee)
            fail_msg("byte %zu of the timed-out READ's memory changed after the timeout", i);
    assert_int_equal(th_xfer(e, MC_READ, dst, seg, t->eng[0].buf[0], len, NULL, 0),
                     MC_TASK_COMPLETED); /* the connection still serves */
    assert_int_equal(th_check(dst, len, 41), -1);
}

/* An unregister that timed out may be called again. The host's own READ, whose timeout is
 * longer than the engine's, holds the buffer while its target is stopped: the unregister gives
 * up after the transfer timeout (and 2 s). The host registers the range again: unregistering
 * that registration does not say the range is free while the READ still holds the earlier one.
 * Once the target goes on and the READ ends, the call succeeds, and one more finds nothing. */
static void test_unregister_again(void **state)
{
    const size_t len = MIB;
    th_cfg_t cfg;

    (void)state;
    th_config(&cfg);
    th_set(&cfg, "FORCE_TCP", "1");
    th_set(&cfg, "TRANSFER_TIMEOUT", "1");
    th_set(&cfg, "IO_TIMEOUT_MS", "30000"); /* the stalled connection is not torn down */
    th_target_t *t = spawn(0, &cfg, len, 0);
    mc_engine_t *e = g.e[0] = th_engine(&cfg);
    mc_segment_id_t seg = th_open(e, t, 0);
    uint8_t *dst = aligned_alloc(4096, len);
    assert_non_null(dst);
    assert_int_equal(mc_mem_register(e, dst, len, "*"), 0);
    assert_int_equal(th_xfer(e, MC_READ, dst, seg, t->eng[0].buf[0], len, NULL, 0),
                     MC_TASK_COMPLETED);

    mc_batch_t *b = read_from_stopped(e, t, seg, dst, len, 30000);
    int64_t t0 = th_now_ms();
    int rc = mc_mem_unregister(e, dst), rc_again = 0, rc_reg;
    int64_t took = th_now_ms() - t0;
    if ((rc_reg = mc_mem_register(e, dst, len, "*")) == 0)
        rc_again = mc_mem_unregister(e, dst);
    assert_int_equal(kill(t->pid, SIGCONT), 0);
    print_message("  unregister with the READ in flight: %s after %lld ms; again, the range "
                  "registered anew meanwhile: %s\n",
                  mc_err_name(rc), (long long)took, mc_err_name(rc_again));
    assert_int_equal(rc, -MC_ETIMEOUT);
    assert_true(took >= 2900);
    assert_int_equal(rc_reg, 0);
    assert_int_equal(rc_again, -MC_ETIMEOUT);
    assert_int_equal(mc_batch_wait(b, 20000), 0);
    th_batch_destroy(e, b);
    assert_int_equal(mc_mem_unregister(e, dst), 0);
    assert_int_equal(mc_mem_unregister(e, dst), -ENOENT);
    free(dst);
}

/* Two targets; X stops answering (SIGSTOP). A submit to X with a 300 ms timeout ends TIMEOUT
 * with -MC_ETIMEOUT soon after; Y, busy with 2 GiB of writes, also gets a small submit with a
 * 200 ms timeout queued behind them: it waits longer than that and still completes, since its
 * clock starts with its first bytes. */
static void test_submit_timeout(void **state)
{
    const size_t big = 64 * MIB, small = 64 * KIB;
    th_cfg_t cfg;

    (void)state;
    th_config(&cfg);
    th_set(&cfg, "FORCE_TCP", "1");
    th_target_t *x = spawn(0, &cfg, big, 0), *y = spawn(1, &cfg, big, 0);
    mc_engine_t *e = g.e[0] = th_engine(&cfg);
    mc_segment_id_t sx = th_open(e, x, 0), sy = th_open(e, y, 0);
    uint8_t *src = th_buf(e, big);
    th_fill(src, big, 303);
    assert_int_equal(th_xfer(e, MC_WRITE, src, sx, x->eng[0].buf[0], small, NULL, 0),
                     MC_TASK_COMPLETED);

    th_stop(x->pid);
    int64_t t0 = th_now_ms();
    mc_task_status_t st = xfer_opts(e, MC_WRITE, src, sx, x->eng[0].buf[0], 1 * MIB, 300);
    int64_t took = th_now_ms() - t0;
    print_message("  stopped target: %s after %lld ms: %s\n", mc_err_name(st.error),
                  (long long)took, st.reason);
    assert_int_equal(st.state, MC_TASK_TIMEOUT);
    assert_int_equal(st.error, -MC_ETIMEOUT);
    assert_true(took >= 300 && took < 2000);
    /* Stopped longer than MC_IO_TIMEOUT_MS: its connections are torn down, but a stopped
     * process is not a dead one. */
    th_sleep_ms(2500);
    assert_int_equal(kill(x->pid, SIGCONT), 0);

    /* Y: 32 x 64 MiB, then 64 KiB with 200 ms of its own. */
    mc_batch_t *b;
    mc_request_t r[32];
    for (int i = 0; i < 32; i++)
        r[i] = (mc_request_t){.opcode = MC_WRITE,
                              .local = src,
                              .target = sy,
                              .target_offset = y->eng[0].buf[0],
                              .length = big};
    assert_int_equal(mc_batch_create(e, 33, &b), 0);
    assert_int_equal(mc_batch_submit(b, r, 32, NULL), 0);
    mc_submit_opts_t o = {.size = sizeof(o), .timeout_ms = 200};
    mc_request_t late = {.opcode = MC_WRITE,
                         .local = src + big - small,
                         .target = sy,
                         .target_offset = y->eng[0].buf[0] + 4096,
                         .length = small};
    t0 = th_now_ms();
    assert_int_equal(mc_batch_submit_ex(b, &late, 1, &o), 0);
    assert_int_equal(mc_batch_wait(b, 60000), 0);
    took = th_now_ms() - t0;
    mc_batch_status_t bs;
    assert_int_equal(mc_batch_status(b, &bs), 0);
    print_message("  queued behind 2 GiB: final after %lld ms (its timeout: 200 ms)\n",
                  (long long)took);
    assert_true(took > 200);
    assert_int_equal(bs.completed, 33);
    th_batch_destroy(e, b);
    assert_int_equal(th_remote_check(y, 0, y->eng[0].buf[0] + 4096, small, 303, big - small), -1);
    /* X answers again: a new request to it completes. */
    assert_int_equal(th_xfer(e, MC_WRITE, src, sx, x->eng[0].buf[0], small, NULL, 0),
                     MC_TASK_COMPLETED);
    assert_int_equal(mc_segment_state(e, sx), MC_SEGMENT_READY);
    th_buf_free(e, src, big);
}

/* Options are checked: an unknown size is refused and nothing is submitted. */
static void test_submit_opts(void **state)
{
    th_cfg_t cfg;
    mc_batch_t *b;
    mc_batch_status_t bs;
    uint8_t *src;

    (void)state;
    th_config(&cfg);
    th_target_t *t = spawn(0, &cfg, MIB, 0);
    mc_engine_t *e = g.e[0] = th_engine(&cfg);
    mc_segment_id_t seg = th_open(e, t, 0);
    src = th_buf(e, 4096);
    mc_request_t r = {.opcode = MC_WRITE,
                      .local = src,
                      .target = seg,
                      .target_offset = t->eng[0].buf[0],
                      .length = 4096};
    mc_submit_opts_t o = {.size = sizeof(o) + 8};
    assert_int_equal(mc_batch_create(e, 4, &b), 0);
    assert_int_equal(mc_batch_submit_ex(b, &r, 1, &o), -EINVAL);
    o.size = 1;
    assert_int_equal(mc_batch_submit_ex(b, &r, 1, &o), -EINVAL);
    o = (mc_submit_opts_t){.size = sizeof(o), .flags = 0x100};
    assert_int_equal(mc_batch_submit_ex(b, &r, 1, &o), -EINVAL);
    assert_true(th_contains(mc_last_error(), "unknown flags"));
    /* an older, smaller struct: no flags, no on_sent */
    o = (mc_submit_opts_t){.size = offsetof(mc_submit_opts_t, flags), .flags = 0x100};
    assert_int_equal(mc_batch_submit_ex(b, &r, 1, &o), 0);
    assert_int_equal(mc_batch_wait(b, 30000), 0);
    assert_int_equal(mc_batch_status(b, &bs), 0);
    assert_int_equal(bs.tasks, 1); /* the refused ones added nothing */
    assert_int_equal(bs.completed, 1);
    th_batch_destroy(e, b);
    assert_int_equal(mc_batch_create(e, 4, &b), 0);
    assert_int_equal(mc_batch_submit_ex(b, &r, 1, NULL), 0); /* NULL: the defaults */
    assert_int_equal(mc_batch_wait(b, 30000), 0);
    assert_int_equal(mc_batch_status(b, &bs), 0);
    assert_int_equal(bs.completed, 1);
    th_batch_destroy(e, b);
    th_buf_free(e, src, 4096);
}

/* ---- ORDERED submits, on_sent -------------------------------------------------------------- */

typedef struct sent_probe {
    atomic_int sent, done;
    atomic_int sent_state; /* the task's state when on_sent ran */
} sent_probe_t;

static void probe_sent(void *arg, const mc_task_status_t *st)
{
    sent_probe_t *p = arg;

    atomic_store(&p->sent_state, (int)st->state);
    atomic_fetch_add(&p->sent, 1);
}

static void probe_done(void *arg, const mc_task_status_t *st)
{
    sent_probe_t *p = arg;

    (void)st;
    if (!atomic_load(&p->sent)) /* on_sent always runs first */
        atomic_store(&p->sent_state, -1);
    atomic_fetch_add(&p->done, 1);
}

static bool wait_flag(atomic_int *v, int64_t ms)
{
    int64_t dl = th_now_ms() + ms;

    while (!atomic_load(v) && th_now_ms() < dl)
        th_sleep_ms(1);
    return atomic_load(v) != 0;
}

/* Overlapping ORDERED WRITEs take effect in the order submitted, over four connections with
 * 16 KiB slices. First eight 240 KiB WRITEs of different bytes to one remote range while the
 * target reads nothing (their slices pile up; unordered, they would spread over the four
 * connections and land in any order): the range ends with the eighth's bytes. Then the way the
 * UCX module completes a zcopy put, 200 times: one source range refilled with the next round's
 * bytes as soon as on_sent says the engine let go of it, while unordered writes keep the other
 * connections busy: the range ends with the last round's bytes exactly (an earlier round
 * landing late, or a source read after on_sent, would show), every task completes, and on_sent
 * ran once per WRITE, before its completion. */
static void test_ordered_sent(void **state)
{
    enum { PILED = 8, ROUNDS = 200 };
    const size_t len = 15 * 16 * KIB, side = MIB; /* 15 slices: offsets move between connections */
    static sent_probe_t probes[ROUNDS], piled;
    mc_submit_opts_t o = {.size = sizeof(o), .flags = MC_SUBMIT_ORDERED, .on_sent = probe_sent};
    th_cfg_t cfg;
    mc_batch_t *b;
    mc_batch_status_t bs;
    int early = 0;

    (void)state;
    th_config(&cfg);
    th_set(&cfg, "FORCE_TCP", "1");
    th_set(&cfg, "TCP_CONNS", "4");
    th_set(&cfg, "SLICE_SIZE", "16384");
    th_target_t *t = spawn(0, &cfg, 4 * MIB, 0);
    mc_engine_t *e = g.e[0] = th_engine(&cfg);
    mc_segment_id_t seg = th_open(e, t, 0);
    uint64_t dst = t->eng[0].buf[0];
    uint8_t *src = th_buf(e, PILED * len), *other = th_buf(e, side);
    mc_request_t r = {
        .opcode = MC_WRITE, .target = seg, .target_offset = dst, .length = len, .cb_arg = &piled};

    th_fill(other, side, 77);
    assert_int_equal(mc_batch_create(e, PILED + 2 * ROUNDS, &b), 0);
    for (int i = 0; i < 4; i++) /* every connection up */
        assert_int_equal(th_xfer(e, MC_WRITE, other, seg, dst + MIB, side, NULL, 0),
                         MC_TASK_COMPLETED);
    th_stop(t->pid);
    for (int i = 0; i < PILED; i++) {
        r.local = src + (size_t)i * len;
        th_fill(r.local, len, 500 + (uint64_t)i);
        assert_int_equal(mc_batch_submit_ex(b, &r, 1, &o), 0);
    }
    th_sleep_ms(100);
    assert_int_equal(kill(t->pid, SIGCONT), 0);
    assert_int_equal(mc_batch_wait(b, 30000), 0);
    assert_int_equal(mc_batch_status(b, &bs), 0);
    assert_int_equal(bs.completed, PILED);
    for (int64_t dl = th_now_ms() + 10000; atomic_load(&piled.sent) < PILED && th_now_ms() < dl;)
        th_sleep_ms(1); /* the pass that ended them runs their on_sent at its end */
    assert_int_equal(atomic_load(&piled.sent), PILED);
    assert_int_equal(th_remote_check(t, 0, dst, len, 500 + PILED - 1, 0), -1);

    memset(probes, 0, sizeof(probes));
    r.local = src;
    for (int i = 0; i < ROUNDS; i++) {
        r.cb = probe_done;
        r.cb_arg = &probes[i];
        th_fill(src, len, 1000 + (uint64_t)i);
        assert_int_equal(mc_batch_submit_ex(b, &r, 1, &o), 0);
        if (i % 4 == 0) {
            mc_request_t u = {.opcode = MC_WRITE,
                              .local = other,
                              .target = seg,
                              .target_offset = dst + MIB,
                              .length = side};
            assert_int_equal(mc_batch_submit(b, &u, 1, NULL), 0);
        }
        assert_true(wait_flag(&probes[i].sent, 10000));
        early += atomic_load(&probes[i].sent_state) < MC_TASK_COMPLETED;
    }
    th_fill(src, len, 999); /* the host's: nothing may read it any more */
    assert_int_equal(mc_batch_wait(b, 30000), 0);
    assert_int_equal(mc_batch_status(b, &bs), 0);
    assert_int_equal(bs.completed, bs.tasks);
    for (int i = 0; i < ROUNDS; i++) {
        assert_int_equal(atomic_load(&probes[i].sent), 1);
        assert_true(wait_flag(&probes[i].done, 10000));
        assert_int_not_equal(atomic_load(&probes[i].sent_state), -1);
    }
    print_message("  %d of %d WRITEs let go of their source before the target confirmed them\n",
                  early, ROUNDS);
    assert_true(early > 0); /* tcp: in the kernel, the target's answer a pass later at least */
    assert_int_equal(th_remote_check(t, 0, dst, len, 1000 + ROUNDS - 1, 0), -1);
    assert_int_equal(th_remote_check(t, 0, dst + MIB, side, 77, 0), -1);
    th_batch_destroy(e, b);
    th_buf_free(e, src, PILED * len);
    th_buf_free(e, other, side);
}

/* A WRITE whose source the engine gave back (on_sent, while the stopped target had confirmed
 * nothing) is not sent again when its connection is killed: it fails, saying so, and the next
 * WRITE to that target moves over a new connection. */
static void test_sent_then_lost(void **state)
{
    static sent_probe_t probe;
    char reason[512];
    th_cfg_t cfg;
    mc_batch_t *b;
    mc_task_status_t st;

    (void)state;
    if (geteuid() != 0)
        skip(); /* ss -K */
    th_config(&cfg);
    th_set(&cfg, "FORCE_TCP", "1");
    th_set(&cfg, "TCP_CONNS", "1");
    th_target_t *t = spawn(0, &cfg, MIB, 0);
    mc_engine_t *e = g.e[0] = th_engine(&cfg);
    mc_segment_id_t seg = th_open(e, t, 0);
    uint8_t *src = th_buf(e, 64 * KIB);
    th_fill(src, 64 * KIB, 5);
    assert_int_equal(th_xfer(e, MC_WRITE, src, seg, t->eng[0].buf[0], 64 * KIB, NULL, 0),
                     MC_TASK_COMPLETED);
    unsigned port = th_listen_port(t->pid);
    assert_int_not_equal(port, 0);

    th_stop(t->pid);
    memset(&probe, 0, sizeof(probe));
    mc_submit_opts_t o = {.size = sizeof(o), .flags = MC_SUBMIT_ORDERED, .on_sent = probe_sent};
    mc_request_t r = {.opcode = MC_WRITE,
                      .local = src,
                      .target = seg,
                      .target_offset = t->eng[0].buf[0],
                      .length = 64 * KIB,
                      .cb = probe_done,
                      .cb_arg = &probe};
    assert_int_equal(mc_batch_create(e, 1, &b), 0);
    assert_int_equal(mc_batch_submit_ex(b, &r, 1, &o), 0);
    assert_true(wait_flag(&probe.sent, 10000));
    assert_int_equal(atomic_load(&probe.sent_state), MC_TASK_PENDING);
    th_fill(src, 64 * KIB, 6); /* the host's again */
    if (!th_kill_conns(port)) {
        assert_int_equal(kill(t->pid, SIGCONT), 0);
        skip(); /* no ss -K here (CONFIG_INET_DIAG_DESTROY) */
    }
    assert_int_equal(mc_batch_wait(b, 10000), 0);
    assert_int_equal(mc_task_status(b, 0, &st), 0);
    snprintf(reason, sizeof(reason), "%s", st.reason ? st.reason : "");
    print_message("  %s\n", reason);
    assert_int_equal(st.state, MC_TASK_FAILED);
    assert_true(th_contains(reason, "not sent again"));
    assert_int_equal(kill(t->pid, SIGCONT), 0);
    th_batch_destroy(e, b);

    assert_int_equal(th_xfer(e, MC_WRITE, src, seg, t->eng[0].buf[0], 64 * KIB, NULL, 0),
                     MC_TASK_COMPLETED);
    assert_int_equal(th_remote_check(t, 0, t->eng[0].buf[0], 64 * KIB, 6, 0), -1);
    th_buf_free(e, src, 64 * KIB);
}

/* ---- reachability of an address ------------------------------------------------------------ */

/* In a network namespace of its own (only lo, then a veth pair with 10.200.0.2/24 on one end):
 * what mc_address_reachable says of this engine's address, of the same address from another
 * host (its host part changed: 127.0.0.1 is then that host's own), of that host at 10.200.0.1
 * before and after the veth link gives a route there, and of bytes that are not an address.
 * The child's exit code is the number of the first check that failed. */
static int reachable_child(void)
{
    uint8_t a[MC_ADDRESS_MAX], other[MC_ADDRESS_MAX];
    size_t len = sizeof(a);
    mc_engine_t *e;
    th_cfg_t cfg;

    if (unshare(CLONE_NEWNET) || system("ip link set lo up"))
        return 1;
    th_config(&cfg);
    mc_config_t *c = th_mc_config(&cfg);
    if (mc_engine_create(c, &e))
        return 2;
    mc_config_destroy(c);
    if (mc_engine_address(e, a, &len) || len != 25 || a[18] != 4)
        return 3; /* header (18 bytes), then IPv4: family, port, address */
    if (mc_address_reachable(e, a, len) != 1)
        return 4;
    memcpy(other, a, len);
    other[10] ^= 0xff; /* another host */
    if (mc_address_reachable(e, other, len) != 0)
        return 5;
    memcpy(other + 21, (uint8_t[]){10, 200, 0, 1}, 4);
    if (mc_address_reachable(e, other, len) != 0)
        return 6;
    if (system("ip link add mcreach0 type veth peer name mcreach1 && ip addr add 10.200.0.2/24 "
               "dev mcreach0 && ip link set mcreach1 up && ip link set mcreach0 up"))
        return 7;
    if (mc_address_reachable(e, other, len) != 1)
        return 8;
    if (mc_address_reachable(e, other, 10) != -MC_EPROTO ||
        mc_address_reachable(e, other, len - 1) != -MC_EPROTO)
        return 9;
    mc_engine_destroy(e);
    return 0;
}

static void test_address_reachable(void **state)
{
    int status;

    (void)state;
    if (geteuid() != 0)
        skip();         /* a network namespace */
    pid_t pid = fork(); /* before this test starts an engine: no threads to copy */
    assert_true(pid >= 0);
    if (pid == 0)
        _exit(reachable_child());
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
}

/* ---- release ------------------------------------------------------------------------------- */

static atomic_int released_calls, released_bad;

static void on_released(void *arg, const mc_task_status_t *st)
{
    (void)arg;
    if (st->state != MC_TASK_COMPLETED &&
        !(st->state == MC_TASK_CANCELED && st->error == -MC_ECANCELED))
        atomic_fetch_add(&released_bad, 1);
    atomic_fetch_add(&released_calls, 1);
}

/* A batch released right after a big submit: the call returns at once, every callback runs
 * (COMPLETED or CANCELED with -MC_ECANCELED), and the engine frees the batch itself. */
static void test_release(void **state)
{
    const size_t n = 1000, sz = 256 * KIB;
    th_cfg_t cfg;

    (void)state;
    th_config(&cfg);
    th_set(&cfg, "FORCE_TCP", "1");
    th_target_t *t = spawn(0, &cfg, 8 * MIB, 0);
    mc_engine_t *e = g.e[0] = th_engine(&cfg);
    mc_segment_id_t seg = th_open(e, t, 0);
    uint8_t *src = th_buf(e, 8 * MIB);
    mc_request_t *reqs = calloc(n, sizeof(*reqs));
    mc_batch_t *b;

    atomic_store(&released_calls, 0);
    atomic_store(&released_bad, 0);
    for (size_t i = 0; i < n; i++)
        reqs[i] = (mc_request_t){.opcode = MC_WRITE,
                                 .local = src + (i % 32) * sz,
                                 .target = seg,
                                 .target_offset = t->eng[0].buf[0] + (i % 32) * sz,
                                 .length = sz,
                                 .cb = on_released};
    assert_int_equal(mc_batch_create(e, n, &b), 0);
    assert_int_equal(mc_batch_submit(b, reqs, n, NULL), 0);
    int64_t t0 = th_now_ms();
    mc_batch_release(b);
    assert_true(th_now_ms() - t0 < 100);
    int64_t dl = th_now_ms() + 10000;
    while (atomic_load(&released_calls) < (int)n && th_now_ms() < dl)
        th_sleep_ms(1);
    assert_int_equal(atomic_load(&released_calls), n);
    assert_int_equal(atomic_load(&released_bad), 0);
    /* The engine is fine afterwards. */
    assert_int_equal(th_xfer(e, MC_WRITE, src, seg, t->eng[0].buf[0], sz, NULL, 0),
                     MC_TASK_COMPLETED);
    free(reqs);
    th_buf_free(e, src, 8 * MIB);
}

/* Batches destroyed while the engine lets go of their last task, many times over: the host's
 * destroy and the engine's release never both free (or touch a freed) batch. */
static void test_destroy_race(void **state)
{
    th_cfg_t cfg;
    mc_batch_t *b;

    (void)state;
    th_config(&cfg);
    th_set(&cfg, "FORCE_TCP", "1");
    th_target_t *t = spawn(0, &cfg, MIB, 0);
    mc_engine_t *e = g.e[0] = th_engine(&cfg);
    mc_segment_id_t seg = th_open(e, t, 0);
    uint8_t *src = th_buf(e, 4096);
    mc_request_t r = {.opcode = MC_WRITE,
                      .local = src,
                      .target = seg,
                      .target_offset = t->eng[0].buf[0],
                      .length = 64};
    for (int i = 0; i < 2000; i++) {
        assert_int_equal(mc_batch_create(e, 1, &b), 0);
        assert_int_equal(mc_batch_submit(b, &r, 1, NULL), 0);
        if (i % 2) {
            while (mc_batch_destroy(b) == -EBUSY)
                ;
        } else {
            mc_batch_release(b);
        }
    }
    th_buf_free(e, src, 4096);
}

/* ---- progress under the host's control ------------------------------------------------------ */

static __thread bool in_progress_call;
static atomic_int cb_calls, cb_outside;

static void on_done_check_context(void *arg, const mc_task_status_t *st)
{
    (void)arg;
    (void)st;
    if (!in_progress_call)
        atomic_fetch_add(&cb_outside, 1);
    atomic_fetch_add(&cb_calls, 1);
}

/* PROGRESS_IMPLICIT=0: submit, status, notify_pop and send run nothing; the callback runs
 * inside mc_engine_progress only. */
static void test_progress_explicit(void **state)
{
    th_cfg_t cfg;
    mc_batch_t *b;
    mc_task_status_t ts;
    mc_batch_status_t bs;
    mc_notify_t nt;

    (void)state;
    th_config(&cfg);
    th_set(&cfg, "FORCE_TCP", "1");
    th_target_t *t = spawn(0, &cfg, MIB, 0);
    th_set(&cfg, "PROGRESS_THREAD", "0");
    th_set(&cfg, "PROGRESS_IMPLICIT", "0");
    mc_engine_t *e = g.e[0] = th_engine(&cfg);
    mc_segment_id_t seg = th_open(e, t, 0);
    uint8_t *src = th_buf(e, MIB);
    th_fill(src, MIB, 77);
    mc_request_t r = {.opcode = MC_WRITE,
                      .local = src,
                      .target = seg,
                      .target_offset = t->eng[0].buf[0],
                      .length = MIB,
                      .cb = on_done_check_context};
    atomic_store(&cb_calls, 0);
    atomic_store(&cb_outside, 0);
    assert_int_equal(mc_batch_create(e, 1, &b), 0);
    assert_int_equal(mc_batch_submit(b, &r, 1, NULL), 0);
    int64_t dl = th_now_ms() + 300;
    while (th_now_ms() < dl) {
        assert_int_equal(mc_task_status(b, 0, &ts), 0);
        assert_int_equal(mc_batch_status(b, &bs), 0);
        assert_int_equal(mc_notify_pop(e, &nt), 0);
        assert_int_equal(mc_msg_send(e, seg, TH_MSG_ID, "ping", 4), 0);
        th_sleep_ms(1);
    }
    assert_true(ts.state == MC_TASK_WAITING || ts.state == MC_TASK_PENDING);
    assert_int_equal(atomic_load(&cb_calls), 0);
    dl = th_now_ms() + 30000;
    while (atomic_load(&cb_calls) == 0 && th_now_ms() < dl) {
        in_progress_call = true;
        mc_engine_progress(e);
        in_progress_call = false;
    }
    assert_int_equal(atomic_load(&cb_calls), 1);
    assert_int_equal(atomic_load(&cb_outside), 0);
    assert_int_equal(mc_task_status(b, 0, &ts), 0);
    assert_int_equal(ts.state, MC_TASK_COMPLETED);
    assert_int_equal(mc_batch_destroy(b), 0);
    assert_int_equal(th_remote_check(t, 0, t->eng[0].buf[0], MIB, 77, 0), -1);
    th_buf_free(e, src, MIB);
}

/* Message i of a stream, as the children check it: 4 bytes of i, then pattern 1000 + i. */
static void seq_msg(uint8_t *buf, uint32_t i, size_t len)
{
    memcpy(buf, &i, 4);
    th_fill(buf + 4, len - 4, 1000 + i);
}

/* A caller-progress host with implicit progress that only sends, never calling
 * mc_engine_progress: its sends alone connect to the peer, take in the answers that free its
 * window (4096 messages) and deliver every message once, in order; over shm, then over tcp. */
static void test_send_only(void **state)
{
    const uint32_t n = 3 * MC_MSG_WINDOW;
    uint8_t buf[4 + 64];
    th_reply_t r;

    (void)state;
    for (int tcp = 0; tcp < 2; tcp++) {
        th_cfg_t cfg;
        th_config(&cfg);
        if (tcp)
            th_set(&cfg, "FORCE_TCP", "1");
        th_target_t *t = spawn(0, &cfg, 4096, 0);
        th_set(&cfg, "PROGRESS_THREAD", "0");
        mc_engine_t *e = g.e[0] = th_engine(&cfg);
        mc_segment_id_t seg = th_open(e, t, 0); /* not connected yet */
        int64_t dl = th_now_ms() + 30000;
        for (uint32_t i = 0; i < n; i++) {
            size_t len = 4 + i % 64;
            int rc;
            seq_msg(buf, i, len);
            while ((rc = mc_msg_send(e, seg, TH_MSG_ID, buf, len)) == -EAGAIN && th_now_ms() < dl)
                th_sleep_ms(1);
            assert_int_equal(rc, 0);
        }
        th_cmd_t c = {.op = TH_CMD_MSGS, .a0 = n, .a3 = 20000};
        assert_int_equal(th_target_cmd(t, &c, &r, 30000), 0);
        if (r.v[0] != n || r.v[1] || r.v[2] || r.v[3])
            print_error("%s: received %lld of %u, out of order %lld, bad payload %lld\n",
                        tcp ? "tcp" : "shm", (long long)r.v[0], n, (long long)r.v[1],
                        (long long)r.v[2]);
        assert_int_equal(r.v[0], n);
        assert_int_equal(r.v[1] + r.v[2] + r.v[3], 0);
        mc_engine_destroy(e);
        g.e[0] = NULL;
        th_target_kill(t);
    }
}

static uint64_t tcp_errors(mc_engine_t *e)
{
    mc_counters_t c;

    assert_int_equal(mc_stats_transport(e, "tcp", &c), 0);
    return c.errors + c.retries;
}

/* A caller-progress engine that does not call into the library for 10 s (its host computes)
 * keeps its connections, and one that stops calling while 256 MiB of READs are in flight
 * (5 s, far beyond MC_IO_TIMEOUT_MS) finishes them without an error or a retry. */
static void test_caller_idle(void **state)
{
    const size_t len = 64 * MIB;
    th_cfg_t cfg;
    mc_rail_stats_t rs[2];
    size_t nr;

    (void)state;
    th_config(&cfg);
    th_set(&cfg, "FORCE_TCP", "1");
    th_set(&cfg, "IO_TIMEOUT_MS", "1000");
    th_target_t *t = spawn(0, &cfg, len, 0);
    th_set(&cfg, "PROGRESS_THREAD", "0");
    mc_engine_t *e = g.e[0] = th_engine(&cfg);
    mc_segment_id_t seg = th_open(e, t, 0);
    uint8_t *buf = th_buf(e, 4 * len);
    th_fill(buf, len, 1000);
    assert_int_equal(th_xfer(e, MC_WRITE, buf, seg, t->eng[0].buf[0], len, NULL, 0),
                     MC_TASK_COMPLETED);
    assert_int_equal(mc_stats_rails(e, seg, rs, 2, &nr), 0);
    unsigned conns = rs[0].conns;
    uint64_t errs = tcp_errors(e);
    assert_true(conns > 0);

    th_sleep_ms(10000);
    assert_int_equal(th_xfer(e, MC_READ, buf + len, seg, t->eng[0].buf[0], len, NULL, 0),
                     MC_TASK_COMPLETED);
    assert_int_equal(th_check(buf + len, len, 1000), -1);
    assert_int_equal(mc_stats_rails(e, seg, rs, 2, &nr), 0);
    assert_int_equal(rs[0].conns, conns);
    assert_int_equal(rs[0].errors, 0);
    assert_int_equal(tcp_errors(e), errs);

    mc_batch_t *b;
    mc_batch_status_t bs;
    mc_request_t r[4];
    memset(buf, 0, 4 * len);
    for (int i = 0; i < 4; i++)
        r[i] = (mc_request_t){.opcode = MC_READ,
                              .local = buf + i * len,
                              .target = seg,
                              .target_offset = t->eng[0].buf[0],
                              .length = len};
    assert_int_equal(mc_batch_create(e, 4, &b), 0);
    assert_int_equal(mc_batch_submit(b, r, 4, NULL), 0);
    int64_t dl = th_now_ms() + 10000;
    do {
        mc_engine_progress(e);
        assert_int_equal(mc_batch_status(b, &bs), 0);
    } while (bs.bytes == 0 && th_now_ms() < dl);
    assert_true(bs.bytes > 0 && bs.bytes < 4 * len);
    th_sleep_ms(5000); /* the host computes; the target's responses pile up */
    assert_int_equal(mc_batch_wait(b, 30000), 0);
    assert_int_equal(mc_batch_status(b, &bs), 0);
    assert_int_equal(bs.completed, 4);
    th_batch_destroy(e, b);
    for (int i = 0; i < 4; i++)
        assert_int_equal(th_check(buf + i * len, len, 1000), -1);
    assert_int_equal(tcp_errors(e), errs);
    th_buf_free(e, buf, 4 * len);
}

/* Sends message i of a stream (seq_msg), driving progress while the window is full. */
static void send_seq(mc_engine_t *e, mc_segment_id_t seg, uint32_t i, int64_t dl)
{
    uint8_t buf[4 + 60];
    size_t len = 4 + i % 60;
    int rc;

    seq_msg(buf, i, len);
    while ((rc = mc_msg_send(e, seg, TH_MSG_ID, buf, len)) == -EAGAIN && th_now_ms() < dl)
        mc_engine_progress(e);
    assert_int_equal(rc, 0);
}

static atomic_uint solo_echoes, solo_bad;

bool mc__progress_solo(const mc_engine_t *e); /* engine_int.h: the white-box checks below */

static void on_solo_echo(void *arg, const char *sender, uint8_t id, const void *data, size_t len)
{
    uint32_t n = atomic_load(&solo_echoes);

    (void)arg, (void)sender, (void)id;
    if (len != 4 + n % 60 || memcmp(data, &n, 4) ||
        th_check((const uint8_t *)data + 4, len - 4, 1000 + n) != -1)
        atomic_fetch_add(&solo_bad, 1);
    atomic_store(&solo_echoes, n + 1);
}

/* A caller-progress host reads the one connection that keeps busy without asking epoll
 * (engine.c, progress_locked); what its other connections bring still comes. It streams
 * messages to one peer over tcp, which sends each back (the echoes and the answers keep that
 * connection busy alone), until 20 READs from a second peer, issued one after the other
 * meanwhile, are in, and sends the second peer a message with each: every message and echo
 * arrives once, in order and intact, and every READ brings the second peer's bytes. Before
 * that, a ping-pong with the first peer: every mc_engine_progress that ran an echo's handler
 * says it handled an event, and the busy socket is then read directly; a pause with nothing
 * moving ends that within a few milliseconds (a spinning host's light passes come back), and
 * the ping-pong that follows starts it again. */
static void test_caller_solo(void **state)
{
    const size_t len = 256 * 1024;
    uint32_t sent = 0, to_other = 0, reads = 0;
    mc_batch_t *b = NULL;
    th_cfg_t cfg;
    th_reply_t r;

    (void)state;
    th_config(&cfg);
    th_set(&cfg, "FORCE_TCP", "1");
    th_target_t *busy = spawn(0, &cfg, 4096, 0), *other = spawn(1, &cfg, len, 0);
    th_set(&cfg, "PROGRESS_THREAD", "0");
    mc_engine_t *e = g.e[0] = th_engine(&cfg);
    mc_segment_id_t sb = th_open(e, busy, 0), so = th_open(e, other, 0);
    uint8_t *buf = th_buf(e, len);
    th_cmd_t c = {.op = TH_CMD_ECHO, .a0 = 1};
    assert_int_equal(th_target_cmd(busy, &c, &r, 10000), 0);
    atomic_store(&solo_echoes, 0);
    atomic_store(&solo_bad, 0);
    assert_int_equal(mc_msg_handler_set(e, TH_ECHO_ID, on_solo_echo, NULL), 0);
    mc_request_t req = {.opcode = MC_READ,
                        .local = buf,
                        .target = so,
                        .target_offset = other->eng[0].buf[0],
                        .length = len};
    th_remote_fill(other, 0, other->eng[0].buf[0], len, 77, 0);
    assert_int_equal(mc_batch_create(e, 1, &b), 0);
    int64_t dl = th_now_ms() + 60000;
    /* ping-pong first: the busy peer's socket soon is the one read directly, and each pass
     * that ran an echo's handler counts an event, whoever read it (mc_batch_wait sleeps after
     * a pass that counted none) */
    for (int round = 0; round < 2; round++) {
        for (int i = 0; i < 1000; i++) {
            unsigned echoes;
            int rc;
            send_seq(e, sb, sent++, dl);
            do {
                echoes = atomic_load(&solo_echoes);
                rc = mc_engine_progress(e);
            } while (atomic_load(&solo_echoes) == echoes && th_now_ms() < dl);
            assert_int_equal(atomic_load(&solo_echoes), sent);
            assert_true(rc > 0);
        }
        assert_true(mc__progress_solo(e));
        if (round)
            break;
        int64_t quiet = th_now_ms() + 3000; /* nothing moves: it ends (EPOLL_QUIET_NS, 1 ms) */
        while (mc__progress_solo(e) && th_now_ms() < quiet)
            mc_engine_progress(e);
        assert_false(mc__progress_solo(e));
    }
    while (reads < 20 && th_now_ms() < dl) {
        mc_batch_status_t bs = {.state = MC_TASK_COMPLETED};
        if (to_other) /* a READ was submitted */
            assert_int_equal(mc_batch_status(b, &bs), 0);
        if (bs.state == MC_TASK_COMPLETED) {
            if (to_other) { /* the last READ is in: check it, then the next one */
                assert_int_equal(th_check(buf, len, 77), -1);
                reads++;
                assert_int_equal(mc_batch_reset(b), 0);
            }
            if (reads < 20) {
                memset(buf, 0, len);
                assert_int_equal(mc_batch_submit(b, &req, 1, NULL), 0);
                send_seq(e, so, to_other++, dl);
            }
        }
        assert_true(bs.state <= MC_TASK_COMPLETED); /* waiting, moving or in */
        if (sent - atomic_load(&solo_echoes) < 64)
            send_seq(e, sb, sent++, dl);
        mc_engine_progress(e);
    }
    assert_int_equal(reads, 20);
    th_batch_destroy(e, b);
    while (atomic_load(&solo_echoes) < sent && th_now_ms() < dl)
        mc_engine_progress(e);
    assert_int_equal(atomic_load(&solo_echoes), sent);
    assert_int_equal(atomic_load(&solo_bad), 0);
    c = (th_cmd_t){.op = TH_CMD_MSGS, .a0 = sent, .a3 = 20000};
    assert_int_equal(th_target_cmd(busy, &c, &r, 30000), 0);
    assert_int_equal(r.v[0], sent);
    assert_int_equal(r.v[1] + r.v[2] + r.v[3], 0);
    c.a0 = to_other;
    assert_int_equal(th_target_cmd(other, &c, &r, 30000), 0);
    assert_int_equal(r.v[0], to_other);
    assert_int_equal(r.v[1] + r.v[2] + r.v[3], 0);
    th_buf_free(e, buf, len);
}

/* A caller-progress target whose host never calls in (the passive side of one-sided
 * transfers): without PROGRESS_SERVE_US a peer's READ over tcp gets nothing; with it the
 * serving thread moves the bytes, both ways, and the host's own callbacks still wait for it. */
static void test_caller_serve(void **state)
{
    const size_t len = 4 * MIB;
    th_cfg_t cfg;
    mc_segment_id_t seg[2];
    mc_task_status_t st;

    (void)state;
    th_config(&cfg);
    th_set(&cfg, "FORCE_TCP", "1");
    mc_engine_t *ini = g.e[0] = th_engine(&cfg);
    th_set(&cfg, "PROGRESS_THREAD", "0");
    th_set(&cfg, "PROGRESS_IMPLICIT", "0");
    mc_engine_t *quiet = g.e[1] = th_engine(&cfg); /* never served */
    th_set(&cfg, "PROGRESS_SERVE_US", "100");
    mc_engine_t *served = g.e[2] = th_engine(&cfg);
    uint8_t *tq = th_buf(quiet, len), *ts = th_buf(served, len), *loc = th_buf(ini, 2 * len);
    th_fill(tq, len, 31);
    th_fill(ts, len, 32);
    assert_int_equal(mc_segment_open_nb(ini, mc_engine_segment_name(quiet), &seg[0]), 0);
    assert_int_equal(mc_segment_open_nb(ini, mc_engine_segment_name(served), &seg[1]), 0);

    /* unserved: nothing moves in 2 s (the descriptor itself needs the target) */
    st = xfer_opts(ini, MC_READ, loc, seg[0], (uint64_t)(uintptr_t)tq, len, 2000);
    assert_int_not_equal(st.state, MC_TASK_COMPLETED);
    /* served: a READ and a WRITE complete, bytes right */
    st = xfer_opts(ini, MC_READ, loc, seg[1], (uint64_t)(uintptr_t)ts, len, 0);
    assert_int_equal(st.state, MC_TASK_COMPLETED);
    assert_int_equal(th_check(loc, len, 32), -1);
    th_fill(loc + len, len, 33);
    st = xfer_opts(ini, MC_WRITE, loc + len, seg[1], (uint64_t)(uintptr_t)ts, len, 0);
    assert_int_equal(st.state, MC_TASK_COMPLETED);
    assert_int_equal(th_check(ts, len, 33), -1);
    th_buf_free(ini, loc, 2 * len);
}

static atomic_int arm_msgs;

static void on_arm_msg(void *arg, const char *sender, uint8_t id, const void *data, size_t len)
{
    (void)arg, (void)sender, (void)id, (void)data, (void)len;
    atomic_fetch_add(&arm_msgs, 1);
}

/* Two engines for the arm tests, both on protocol: a peer with its progress thread (g.e[0])
 * and a host as the UCX module runs one (g.e[1]: caller progress, nothing implicit, a serving
 * thread after serve_us, 0: none); *fd_p gets the host's event fd. */
static void arm_pair(const char *protocol, int serve_us, mc_engine_t **peer, mc_engine_t **host,
                     int *fd_p)
{
    th_cfg_t cfg;

    th_config(&cfg);
    th_set(&cfg, "PROTOCOL", "%s", protocol);
    *peer = g.e[0] = th_engine(&cfg);
    th_set(&cfg, "PROGRESS_THREAD", "0");
    th_set(&cfg, "PROGRESS_IMPLICIT", "0");
    th_set(&cfg, "PROGRESS_SERVE_US", "%d", serve_us);
    *host = g.e[1] = th_engine(&cfg);
    *fd_p = mc_engine_event_fd(*host);
    assert_true(*fd_p >= 0);
}

static void arm_pair_destroy(void)
{
    mc_engine_destroy(g.e[0]);
    mc_engine_destroy(g.e[1]);
    g.e[0] = g.e[1] = NULL;
}

/* Progress the host until mc_engine_arm lets it sleep, before dl. */
static void arm_host(mc_engine_t *host, int64_t dl)
{
    while (mc_engine_arm(host) == -EAGAIN && th_now_ms() < dl)
        mc_engine_progress(host);
    assert_true(th_now_ms() < dl);
}

/* mc_engine_arm: a caller-progress host that spins and sleeps on the event fd only after
 * arming wakes up for a message (over tcp and over the same-host ring), and gets it from
 * progress; arm says -EAGAIN while a message waits unhandled. With a serving thread too
 * (PROGRESS_SERVE_US), which must not take the host's wake-up and hold its message. */
static void test_engine_arm(void **state)
{
    const char *protocols[] = {"tcp", "shm", "tcp", "shm"};

    (void)state;
    for (int k = 0; k < 4; k++) {
        mc_segment_id_t seg;
        mc_engine_t *snd, *host;
        int fd;
        arm_pair(protocols[k], k < 2 ? 0 : 100, &snd, &host, &fd);
        assert_int_equal(mc_msg_handler_set(host, TH_MSG_ID, on_arm_msg, NULL), 0);
        assert_int_equal(mc_segment_open_nb(snd, mc_engine_segment_name(host), &seg), 0);
        atomic_store(&arm_msgs, 0);
        for (int round = 1; round <= 20; round++) {
            int64_t dl = th_now_ms() + 10000;
            arm_host(host, dl);
            th_sleep_ms(2); /* the host is away long enough for a serving thread to step in */
            assert_int_equal(mc_msg_send(snd, seg, TH_MSG_ID, "x", 1), 0);
            /* as UCX waits: sleep when armed, else progress; a sleep must end with a wake-up */
            bool armed = true;
            while (atomic_load(&arm_msgs) < round && th_now_ms() < dl) {
                if (armed) {
                    struct pollfd pfd = {.fd = fd, .events = POLLIN};
                    assert_int_equal(poll(&pfd, 1, 3000), 1); /* woken, not by a timeout */
                }
                mc_engine_progress(host);
                armed = atomic_load(&arm_msgs) < round && mc_engine_arm(host) == 0;
            }
            assert_int_equal(atomic_load(&arm_msgs), round);
        }
        arm_pair_destroy();
    }
}

static atomic_int arm_sent;

static void on_arm_sent(void *arg, int status)
{
    (void)arg;
    if (!status)
        atomic_fetch_add(&arm_sent, 1);
}

/* mc_engine_arm, the sending side, as UCX's module runs the engine (PROGRESS_IMPLICIT=0, a
 * serving thread): a host that armed and then sends before it sleeps (another fd woke it, or
 * another thread sent) is woken for what its send started, the connection and the message's
 * completion, not by the next timer tick a second later. Over tcp and over the same-host
 * ring (whose receiver kicks only a sender that armed it). */
static void test_engine_arm_send(void **state)
{
    const char *protocols[] = {"tcp", "shm"};

    (void)state;
    for (int k = 0; k < 2; k++) {
        mc_segment_id_t seg;
        mc_msg_opts_t o = {.size = sizeof(o), .cb = on_arm_sent};
        mc_engine_t *rcv, *host;
        int fd;
        arm_pair(protocols[k], 100, &rcv, &host, &fd);
        assert_int_equal(mc_msg_handler_set(rcv, TH_MSG_ID, on_arm_msg, NULL), 0);
        assert_int_equal(mc_segment_open_nb(host, mc_engine_segment_name(rcv), &seg), 0);
        atomic_store(&arm_msgs, 0);
        atomic_store(&arm_sent, 0);
        for (int round = 1; round <= 30; round++) {
            int64_t dl = th_now_ms() + 10000;
            arm_host(host, dl);
            assert_int_equal(mc_msg_send_ex(host, seg, TH_MSG_ID, "y", 1, &o), 0);
            while (atomic_load(&arm_sent) < round && th_now_ms() < dl) {
                struct pollfd pfd = {.fd = fd, .events = POLLIN};
                assert_int_equal(poll(&pfd, 1, 500), 1); /* woken, well before a 1 s tick */
                mc_engine_progress(host);
                while (atomic_load(&arm_sent) < round && mc_engine_arm(host) == -EAGAIN &&
                       th_now_ms() < dl)
                    mc_engine_progress(host);
            }
            assert_int_equal(atomic_load(&arm_sent), round);
        }
        assert_int_equal(atomic_load(&arm_msgs), 30);
        mc_counters_t c;
        assert_int_equal(mc_stats_transport(host, protocols[k], &c), 0);
        assert_true(c.msgs_sent > 0); /* the carrier under test took some */
        arm_pair_destroy();
    }
}

/* A same-host ring between a side that only spins and one that sleeps whenever it waits:
 * the spinner skips the fence before its wake-up check (MC_SHM_MEMBARRIER, shm_msg.c) until
 * the sleeper first arms, which runs a membarrier. Every sleep of the sleeper must still end
 * with a kick, for a ping (the spinner moved head) and for the answer to its pong (the spinner
 * moved tail), with either side's membarriers off too. Each pair is a fresh ring, whose first
 * arm is the switch from skipping to fencing. Halfway, the sleeper spins until its rings are
 * unmarked (a timer tick without a sleep: the spinner skips its fence again), then sleeps
 * again, which must mark them (and run a membarrier) as the first sleep did. */
#define SPIN_N 2000

unsigned mc__shm_msg_sleepers(mc_engine_t *e); /* shm_int.h: the white-box check below */

static struct {
    mc_engine_t *e; /* the spinner: caller progress, never arms */
    mc_segment_id_t seg;
    atomic_int pings, pongs, sent, bad;
    atomic_int pinged; /* pings the spinner sent */
    atomic_bool stop;
} spin;

static void spin_check(atomic_int *count, const void *data, size_t len)
{
    int v;

    if (len != sizeof(v) || (memcpy(&v, data, sizeof(v)), v != atomic_load(count) + 1))
        atomic_fetch_add(&spin.bad, 1);
    atomic_fetch_add(count, 1);
}

static void on_spin_ping(void *arg, const char *sender, uint8_t id, const void *data, size_t len)
{
    (void)arg, (void)sender, (void)id;
    spin_check(&spin.pings, data, len);
}

static void on_spin_pong(void *arg, const char *sender, uint8_t id, const void *data, size_t len)
{
    (void)arg, (void)sender, (void)id;
    spin_check(&spin.pongs, data, len);
}

static void on_spin_sent(void *arg, int status)
{
    (void)arg;
    if (status == 0)
        atomic_fetch_add(&spin.sent, 1);
}

/* Ping k once pong k-1 came, progressing all the time, and a little after it: the ping lands
 * anywhere on the sleeper's way from its handler to its sleep. */
static void *spinner(void *arg)
{
    int64_t dl = th_now_ms() + 20000;

    (void)arg;
    for (int k = 1; k <= SPIN_N && th_now_ms() < dl && !atomic_load(&spin.stop); k++) {
        while (atomic_load(&spin.pongs) < k - 1 && th_now_ms() < dl && !atomic_load(&spin.stop))
            mc_engine_progress(spin.e);
        for (int i = rand() % 1024; i > 0; i--) /* up to some 50 us */
            mc_engine_progress(spin.e);
        while (mc_msg_send(spin.e, spin.seg, TH_MSG_ID, &k, sizeof(k)) == -EAGAIN)
            mc_engine_progress(spin.e);
        atomic_store(&spin.pinged, k);
    }
    while (atomic_load(&spin.pongs) < SPIN_N && th_now_ms() < dl && !atomic_load(&spin.stop))
        mc_engine_progress(spin.e);
    return NULL;
}

static void test_arm_spinning_peer(void **state)
{
    const char *mb[][2] = {{"1", "1"}, {"0", "1"}, {"1", "0"}}; /* spinner, sleeper */

    (void)state;
    for (int k = 0; k < 6; k++) {
        mc_msg_opts_t o = {.size = sizeof(o), .cb = on_spin_sent};
        mc_segment_id_t seg;
        th_cfg_t cfg;
        pthread_t t;
        int fd;

        th_config(&cfg);
        th_set(&cfg, "PROTOCOL", "shm");
        th_set(&cfg, "PROGRESS_THREAD", "0");
        th_set(&cfg, "SHM_MEMBARRIER", "%s", mb[k % 3][0]);
        spin.e = g.e[0] = th_engine(&cfg);
        th_set(&cfg, "PROGRESS_IMPLICIT", "0");
        th_set(&cfg, "SHM_MEMBARRIER", "%s", mb[k % 3][1]);
        mc_engine_t *host = g.e[1] = th_engine(&cfg);
        fd = mc_engine_event_fd(host);
        assert_true(fd >= 0);
        assert_int_equal(mc_msg_handler_set(spin.e, TH_MSG_ID, on_spin_pong, NULL), 0);
        assert_int_equal(mc_msg_handler_set(host, TH_MSG_ID, on_spin_ping, NULL), 0);
        assert_int_equal(mc_segment_open_nb(spin.e, mc_engine_segment_name(host), &spin.seg), 0);
        assert_int_equal(mc_segment_open_nb(host, mc_engine_segment_name(spin.e), &seg), 0);
        atomic_store(&spin.pings, 0);
        atomic_store(&spin.pongs, 0);
        atomic_store(&spin.sent, 0);
        atomic_store(&spin.bad, 0);
        atomic_store(&spin.pinged, 0);
        atomic_store(&spin.stop, false);
        assert_int_equal(pthread_create(&t, NULL, spinner, NULL), 0);
        int64_t dl = th_now_ms() + 20000;
        int slept = 0;
        /* wait for ping n and the answer to pong n-1, sleeping whenever armed; then pong n */
        for (int n = 1; n <= SPIN_N + 1 && th_now_ms() < dl; n++) {
            bool armed = false;
            if (n == SPIN_N / 2) { /* marked by the sleeps so far; unmarked after a tick */
                assert_true(mc__shm_msg_sleepers(host) > 0);
                int64_t spun = th_now_ms() + 3000;
                while (mc__shm_msg_sleepers(host) > 0 && th_now_ms() < spun)
                    mc_engine_progress(host);
                assert_int_equal(mc__shm_msg_sleepers(host), 0);
            }
            while (((n <= SPIN_N && atomic_load(&spin.pings) < n) ||
                    atomic_load(&spin.sent) < n - 1) &&
                   th_now_ms() < dl) {
                if (armed) {
                    struct pollfd pfd = {.fd = fd, .events = POLLIN};
                    /* a kick is owed once the spinner sent ping n or took pong n-1 (a spinner
                     * starved that long did not yet): woken well before the 1 s tick */
                    if (poll(&pfd, 1, 500) == 0 &&
                        ((atomic_load(&spin.pings) < n && atomic_load(&spin.pinged) >= n) ||
                         (atomic_load(&spin.sent) < n - 1 && atomic_load(&spin.pongs) >= n - 1)) &&
                        poll(&pfd, 1, 200) == 0) {
                        atomic_store(&spin.stop, true);
                        pthread_join(t, NULL);
                        fail_msg("pair %d, message %d: a sleep without its kick", k, n);
                    }
                    slept++;
                }
                mc_engine_progress(host);
                armed = mc_engine_arm(host) == 0;
            }
            if (n <= SPIN_N)
                while (mc_msg_send_ex(host, seg, TH_MSG_ID, &n, sizeof(n), &o) == -EAGAIN)
                    mc_engine_progress(host);
        }
        assert_int_equal(pthread_join(t, NULL), 0);
        assert_int_equal(atomic_load(&spin.pings), SPIN_N);
        assert_int_equal(atomic_load(&spin.pongs), SPIN_N);
        assert_int_equal(atomic_load(&spin.sent), SPIN_N);
        assert_int_equal(atomic_load(&spin.bad), 0);
        assert_true(slept > 0);
        assert_true(mc__shm_msg_sleepers(host) > 0); /* the sleeps after the spin marked again */
        mc_counters_t c;
        assert_int_equal(mc_stats_transport(host, "shm", &c), 0);
        assert_true(c.msgs_sent > SPIN_N / 2); /* the ring (the first may go before it is up) */
        arm_pair_destroy();
    }
}

/* Same-host messages that a serving thread takes for a host that does not progress: the
 * sender hears at once that they are taken (its flush completes; in a pass that runs the
 * handlers they are read in place, and answered once they ran), and its ring may then go:
 * the host's handlers still get every one, once, in order, bytes right. */
#define SERVED_N 64

static size_t served_len(int i)
{
    return (size_t)(i * 1237) % 6000; /* 0 (the first) to 5999 */
}

static struct {
    atomic_int got, bad, flushed;
} served;

static void on_served_msg(void *arg, const char *sender, uint8_t id, const void *data, size_t len)
{
    const uint8_t *b = data;
    int i = atomic_load(&served.got);

    (void)arg, (void)sender, (void)id;
    bool ok = i < SERVED_N && len == served_len(i) && (len == 0 || data);
    for (size_t j = 0; ok && j < len; j++)
        ok = b[j] == (uint8_t)(i * 31 + (int)j);
    if (!ok)
        atomic_fetch_add(&served.bad, 1);
    atomic_fetch_add(&served.got, 1);
}

static void on_served_flush(void *arg, int status)
{
    (void)arg;
    if (status == 0)
        atomic_fetch_add(&served.flushed, 1);
}

/* The message rings mapped into this process. */
static int rings_mapped(void)
{
    FILE *f = fopen("/proc/self/maps", "r");
    char line[512];
    int n = 0;

    assert_non_null(f);
    while (fgets(line, sizeof(line), f))
        n += strstr(line, "mooncake-msg-ring") != NULL;
    fclose(f);
    return n;
}

/* The SERVED_N messages from snd to seg, then a flush (on_served_flush). */
static void send_served(mc_engine_t *snd, mc_segment_id_t seg)
{
    static uint8_t buf[6000];

    atomic_store(&served.got, 0);
    atomic_store(&served.bad, 0);
    atomic_store(&served.flushed, 0);
    for (int i = 0; i < SERVED_N; i++) {
        for (size_t j = 0; j < served_len(i); j++)
            buf[j] = (uint8_t)(i * 31 + (int)j);
        assert_int_equal(mc_msg_send(snd, seg, TH_MSG_ID, buf, served_len(i)), 0);
    }
    assert_int_equal(mc_peer_flush(snd, seg, on_served_flush, NULL), 0);
}

static void test_served_messages(void **state)
{
    mc_engine_t *snd, *host;
    mc_segment_id_t seg;
    mc_counters_t c = {0};
    int fd;

    (void)state;
    arm_pair("shm", 100, &snd, &host, &fd);
    assert_int_equal(mc_msg_handler_set(host, TH_MSG_ID, on_served_msg, NULL), 0);
    assert_int_equal(mc_segment_open(snd, mc_engine_segment_name(host), &seg), 0);
    send_served(snd, seg);
    /* the serving thread takes them all over the ring and the sender hears so; no handler ran */
    int64_t dl = th_now_ms() + 10000;
    while (atomic_load(&served.flushed) == 0 && th_now_ms() < dl)
        usleep(1000);
    assert_int_equal(atomic_load(&served.flushed), 1);
    assert_int_equal(mc_stats_transport(host, "shm", &c), 0);
    assert_int_equal(c.msgs_received, SERVED_N);
    assert_int_equal(atomic_load(&served.got), 0);
    assert_int_equal(rings_mapped(), 2); /* the sender's end and the host's */
    /* the sender goes; the serving thread sees the ring's connection close and unmaps it */
    mc_engine_destroy(snd);
    g.e[0] = NULL;
    while (rings_mapped() > 0 && th_now_ms() < dl)
        usleep(1000);
    assert_int_equal(rings_mapped(), 0);
    while (atomic_load(&served.got) < SERVED_N && th_now_ms() < dl)
        mc_engine_progress(host);
    assert_int_equal(atomic_load(&served.got), SERVED_N);
    assert_int_equal(atomic_load(&served.bad), 0);
    arm_pair_destroy();
}

/* A config whose engines carry messages over tp: "tcp" (the control transport for every peer),
 * or a protocol. */
static void config_over(th_cfg_t *cfg, const char *tp)
{
    th_config(cfg);
    if (!strcmp(tp, "tcp"))
        th_set(cfg, "FORCE_TCP", "1");
    else
        th_set(cfg, "PROTOCOL", "%s", tp);
}

enum { PRIME_ID = TH_MSG_ID + 10 }; /* messages of ring_up's, and more of them */

static void on_prime(void *arg, const char *sender, uint8_t id, const void *data, size_t len)
{
    (void)arg;
    (void)sender;
    (void)id;
    (void)data;
    (void)len;
}

static void on_primed(void *arg, int status)
{
    *(atomic_int *)arg = status ? -1 : 1;
}

/* Messages host took over tp. */
static uint64_t received_over(mc_engine_t *host, const char *tp)
{
    mc_counters_t c = {0};

    assert_int_equal(mc_stats_transport(host, tp, &c), 0);
    return c.msgs_received;
}

/* Over rdma, tcp carries messages until the ring's QP is up: messages of another id until one
 * went over rdma, and their flush (host driven meanwhile). Elsewhere nothing. */
static void ring_up(mc_engine_t *snd, mc_segment_id_t seg, mc_engine_t *host, const char *tp)
{
    atomic_int flushed = 0;
    int64_t dl = th_now_ms() + 10000;

    if (strcmp(tp, "rdma"))
        return;
    assert_int_equal(mc_msg_handler_set(host, PRIME_ID, on_prime, NULL), 0);
    while (received_over(host, tp) == 0 && th_now_ms() < dl) {
        assert_int_equal(mc_msg_send(snd, seg, PRIME_ID, "up?", 3), 0);
        for (int i = 0; i < 10; i++, usleep(1000))
            mc_engine_progress(host);
    }
    assert_true(received_over(host, tp) > 0);
    assert_int_equal(mc_peer_flush(snd, seg, on_primed, &flushed), 0);
    while (atomic_load(&flushed) == 0 && th_now_ms() < dl)
        mc_engine_progress(host);
    assert_int_equal(atomic_load(&flushed), 1);
}

/* Whether the software RDMA device is there (the *_rdma tests run as test_host_api_rdma); its
 * ports up (a test that failed with them down does not leave them so for the next). */
static bool softverbs(void)
{
    const char *dir = getenv("SOFTVERBS_CTL_DIR");

    if (!getenv("SOFTVERBS_FABRIC"))
        return false;
    if (dir) {
        mkdir(dir, 0755);
        assert_int_equal(th_sv_ctl(dir, "softverbs0", "port=up\n"), 0);
        assert_int_equal(th_sv_ctl(dir, "softverbs1", "port=up\n"), 0);
        th_sleep_ms(50); /* (the device applies it within a few milliseconds) */
    }
    return true;
}

/* With MSG_ACK_AFTER_HANDLER (as the UCX module runs its engines: a UCT flush means UCP has the
 * messages) the serving thread still takes a host's messages from the same-host ring, but they
 * are answered only once the host's handlers ran: the sender's flush waits for the host, then
 * completes. Before, the flush completed while the messages waited for the host, and a UCP
 * peer that closed after it made the host's UCP fail the endpoint before it got them
 * (ucp_client_server lost its last rounds in about half the runs). */
static void served_ack_after_handler(const char *tp)
{
    mc_segment_id_t seg;
    th_cfg_t cfg;

    config_over(&cfg, tp);
    /* over tcp the sender sends the messages again while the host is away (2 x the I/O
     * timeout without "handled"): the duplicates are answered "queued" again, and dropped */
    bool tcp = !strcmp(tp, "tcp");
    if (tcp)
        th_set(&cfg, "IO_TIMEOUT_MS", "200");
    mc_engine_t *snd = g.e[0] = th_engine(&cfg);
    th_set(&cfg, "PROGRESS_THREAD", "0");
    th_set(&cfg, "PROGRESS_IMPLICIT", "0");
    th_set(&cfg, "PROGRESS_SERVE_US", "100");
    th_set(&cfg, "MSG_ACK_AFTER_HANDLER", "1");
    mc_engine_t *host = g.e[1] = th_engine(&cfg);
    assert_int_equal(mc_msg_handler_set(host, TH_MSG_ID, on_served_msg, NULL), 0);
    assert_int_equal(mc_segment_open(snd, mc_engine_segment_name(host), &seg), 0);
    ring_up(snd, seg, host, tp);
    uint64_t before = received_over(host, tp);
    send_served(snd, seg);
    /* the serving thread takes them all; no handler ran, and the flush waits */
    int64_t dl = th_now_ms() + 10000;
    while (received_over(host, tp) - before < SERVED_N && th_now_ms() < dl)
        usleep(1000);
    assert_int_equal(received_over(host, tp) - before, SERVED_N);
    usleep((tcp ? 1500 : 300) * 1000);
    assert_int_equal(atomic_load(&served.got), 0);
    assert_int_equal(atomic_load(&served.flushed), 0);
    /* the host runs its handlers: then the flush completes */
    while (atomic_load(&served.flushed) == 0 && th_now_ms() < dl)
        mc_engine_progress(host);
    assert_int_equal(atomic_load(&served.flushed), 1);
    assert_int_equal(atomic_load(&served.got), SERVED_N);
    assert_int_equal(atomic_load(&served.bad), 0);
    assert_int_equal(received_over(host, tp) - before, SERVED_N); /* each once */
    arm_pair_destroy();
}

static void test_served_ack_after_handler(void **state)
{
    (void)state;
    served_ack_after_handler("shm");
}

/* The same over tcp, which answers a message as it is queued (MSG_ACK_LATER here) and says
 * when its handler ran in a frame of its own (MSG_DONE). */
static void test_served_ack_after_handler_tcp(void **state)
{
    (void)state;
    served_ack_after_handler("tcp");
}

/* The same over rdma (the software device): the receiver's ring lends its records to the
 * handlers, as shm's does, and passes them back once they ran. */
static void test_served_ack_after_handler_rdma(void **state)
{
    (void)state;
    if (!softverbs())
        skip();
    served_ack_after_handler("rdma");
}

/* A handler that hands its messages on (mc_msg_keep, as UCX's module does for UCP): the sender's
 * flush waits until the last one is released, from outside the engine's passes, over the ring
 * and over tcp. Outside a handler nothing is kept. */
static uint64_t kept_tokens[SERVED_N];

static void on_kept_msg(void *arg, const char *sender, uint8_t id, const void *data, size_t len)
{
    int i = atomic_load(&served.got);

    on_served_msg(arg, sender, id, data, len);
    if (i < SERVED_N)
        kept_tokens[i] = mc_msg_keep(arg);
}

/* Engines g.e[0] (the sender) and g.e[1] (the host, which keeps every message: returned)
 * carrying messages over tp; the SERVED_N messages and their flush sent, every handler run,
 * every message kept. */
static mc_segment_id_t kept_seg; /* the host, opened by the sender */

static mc_engine_t *kept_all(const char *tp)
{
    mc_segment_id_t seg;
    th_cfg_t cfg;

    config_over(&cfg, tp);
    mc_engine_t *snd = g.e[0] = th_engine(&cfg);
    th_set(&cfg, "MSG_ACK_AFTER_HANDLER", "1");
    mc_engine_t *host = g.e[1] = th_engine(&cfg);
    assert_int_equal(mc_msg_keep(host), 0); /* not in a handler */
    assert_int_equal(mc_msg_handler_set(host, TH_MSG_ID, on_kept_msg, host), 0);
    assert_int_equal(mc_segment_open(snd, mc_engine_segment_name(host), &seg), 0);
    ring_up(snd, seg, host, tp);
    uint64_t before = received_over(host, tp);
    memset(kept_tokens, 0, sizeof(kept_tokens));
    send_served(snd, seg);
    int64_t dl = th_now_ms() + 10000;
    while (atomic_load(&served.got) < SERVED_N && th_now_ms() < dl)
        usleep(1000);
    assert_int_equal(atomic_load(&served.got), SERVED_N);
    assert_int_equal(atomic_load(&served.bad), 0);
    assert_int_equal(received_over(host, tp) - before, SERVED_N); /* all over tp */
    for (int i = 0; i < SERVED_N; i++)
        assert_true(kept_tokens[i] != 0);
    kept_seg = seg;
    return host;
}

/* QPs snd has connected to seg over its rdma rails. */
static unsigned rdma_qps(mc_engine_t *snd, mc_segment_id_t seg)
{
    mc_rail_stats_t r[16];
    size_t n = 0;
    unsigned qps = 0;

    assert_int_equal(mc_stats_rails(snd, seg, r, 16, &n), 0);
    for (size_t i = 0; i < n && i < 16; i++)
        qps += strncmp(r[i].name, "softverbs", 9) ? 0 : r[i].conns;
    return qps;
}

static void keep_release(const char *tp)
{
    mc_engine_t *host = kept_all(tp);
    int64_t dl = th_now_ms() + 10000;

    /* every handler ran; the flush waits for the last release */
    for (int i = 0; i < SERVED_N - 1; i++)
        mc_msg_release(host, kept_tokens[i]);
    usleep(300 * 1000);
    assert_int_equal(atomic_load(&served.flushed), 0);
    mc_msg_release(host, kept_tokens[SERVED_N - 1]);
    while (atomic_load(&served.flushed) == 0 && th_now_ms() < dl)
        usleep(1000);
    assert_int_equal(atomic_load(&served.flushed), 1);
    arm_pair_destroy();
}

static void test_keep_release(void **state)
{
    (void)state;
    keep_release("shm");
}

static void test_keep_release_tcp(void **state)
{
    (void)state;
    keep_release("tcp");
}

static void test_keep_release_rdma(void **state)
{
    (void)state;
    if (!softverbs())
        skip();
    keep_release("rdma");
}

/* Messages kept by the host, lent by the rdma ring they came on, and the ring goes (every port
 * of the software devices down): the sender sends what the ring did not give back again over
 * tcp, then over a new ring once the ports are up again. The duplicates must not be answered
 * "handled" while the old ring still lends them (they are asked for again later): the flush
 * waits for the releases, and each message was handled once. Before, a duplicate of a lent
 * message was answered 0, and the flush completed while the host still kept them. */
static void test_keep_ring_gone_rdma(void **state)
{
    const char *dir = getenv("SOFTVERBS_CTL_DIR");

    (void)state;
    if (!softverbs() || !dir)
        skip();
    mc_engine_t *host = kept_all("rdma");
    int64_t dl = th_now_ms() + 10000;
    assert_true(rdma_qps(g.e[0], kept_seg) > 0);
    assert_int_equal(th_sv_ctl(dir, "softverbs0", "port=down\n"), 0);
    assert_int_equal(th_sv_ctl(dir, "softverbs1", "port=down\n"), 0);
    /* the sender's QPs go, and tcp carries the kept messages again */
    while (rdma_qps(g.e[0], kept_seg) && th_now_ms() < dl)
        usleep(1000);
    assert_int_equal(rdma_qps(g.e[0], kept_seg), 0);
    usleep(500 * 1000);
    assert_int_equal(atomic_load(&served.flushed), 0); /* the host keeps them all */
    /* the ports come back and the sender sends more: a new ring carries the kept messages
     * again, and there too they are not answered while the old ring lends them */
    assert_int_equal(th_sv_ctl(dir, "softverbs0", "port=up\n"), 0);
    assert_int_equal(th_sv_ctl(dir, "softverbs1", "port=up\n"), 0);
    for (int i = 0; i < 40 && th_now_ms() < dl; i++) {
        int rc = mc_msg_send(g.e[0], kept_seg, PRIME_ID, "more", 4);
        assert_true(rc == 0 || rc == -EAGAIN);
        usleep(20 * 1000);
    }
    assert_true(rdma_qps(g.e[0], kept_seg) > 0);
    assert_int_equal(atomic_load(&served.flushed), 0);
    for (int i = 0; i < SERVED_N; i++)
        mc_msg_release(host, kept_tokens[i]);
    while (atomic_load(&served.flushed) == 0 && th_now_ms() < dl)
        usleep(1000);
    assert_int_equal(atomic_load(&served.flushed), 1);
    assert_int_equal(atomic_load(&served.got), SERVED_N); /* none handled twice */
    assert_int_equal(atomic_load(&served.bad), 0);
    arm_pair_destroy();
}

/* Two engines over rdma for the key cases: the owner registers first, the sender src, and a
 * WRITE into first brings the owner's descriptor: what the owner registers next, only keys say.
 * caller: the sender is driven by its host alone (it posts nothing until then). */
static mc_segment_id_t keys_pair(bool caller, void *src, size_t n, void *first, size_t first_len,
                                 mc_engine_t **snd_p, mc_engine_t **owner_p)
{
    mc_segment_id_t seg;
    th_cfg_t cfg;
    char why[512] = "";

    config_over(&cfg, "rdma");
    mc_engine_t *owner = *owner_p = g.e[1] = th_engine(&cfg);
    if (caller) {
        th_set(&cfg, "PROGRESS_THREAD", "0");
        th_set(&cfg, "PROGRESS_IMPLICIT", "0");
    }
    mc_engine_t *snd = *snd_p = g.e[0] = th_engine(&cfg);
    assert_int_equal(mc_mem_register(owner, first, first_len, "cpu:0"), 0);
    assert_int_equal(mc_mem_register(snd, src, n, "cpu:0"), 0);
    assert_int_equal(mc_segment_open(snd, mc_engine_segment_name(owner), &seg), 0);
    int st =
        th_xfer(snd, MC_WRITE, src, seg, (uint64_t)(uintptr_t)first, first_len, why, sizeof(why));
    if (st != MC_TASK_COMPLETED)
        fail_msg("the first WRITE ended %d: %s", st, why);
    return seg;
}

/* Register [addr, addr+len) with owner and pack the key of that registration. */
static void key_of(mc_engine_t *owner, void *addr, size_t len, uint8_t *key)
{
    assert_int_equal(mc_mem_register(owner, addr, len, "cpu:0"), 0);
    assert_int_equal(mc_buffer_key_pack_range(owner, addr, len, key), 0);
}

/* Keys of two registrations that hold the same bytes, the one nearer them registered first;
 * then the owner drops that one. The peer's request goes with the newest key (before, with the
 * nearest buffer's: its rdma key was refused by the owner's NIC, as UCX's rendezvous over rdma
 * kept meeting when UCP's registrations came and went). mc_buffer_key_pack_range packs the key
 * of the registration of exactly that range, the newest. */
static void test_newest_key_rdma(void **state)
{
    enum { LEN = 256 << 10, AT = 8192, N = 16384 };
    static uint8_t own[LEN] __attribute__((aligned(4096))), src[N], first[64];
    uint8_t k1[MC_BUFFER_KEY_SIZE], k2[MC_BUFFER_KEY_SIZE];
    mc_counters_t c0 = {0}, c1 = {0};
    mc_engine_t *snd, *owner;
    char why[512] = "";

    (void)state;
    if (!softverbs())
        skip();
    mc_segment_id_t seg = keys_pair(false, src, N, first, sizeof(first), &snd, &owner);
    key_of(owner, own + 4096, LEN - 4096, k1);
    key_of(owner, own, LEN, k2);
    assert_int_equal(mc_buffer_key_pack_range(owner, own, 0, k2 + 0), -EINVAL);
    assert_int_equal(mc_buffer_key_pack_range(owner, why, 1, k2 + 0), -ENOENT); /* a stack's */
    assert_int_equal(mc_segment_add_buffer(snd, seg, k1, sizeof(k1)), 0);
    assert_int_equal(mc_segment_add_buffer(snd, seg, k2, sizeof(k2)), 0);
    assert_int_equal(mc_mem_unregister_range(owner, own + 4096, LEN - 4096), 0);
    memset(src, 0x77, N);
    assert_int_equal(mc_stats_transport(snd, "rdma", &c0), 0);
    int st = th_xfer(snd, MC_WRITE, src, seg, (uint64_t)(uintptr_t)(own + AT), N, why, sizeof(why));
    if (st != MC_TASK_COMPLETED)
        fail_msg("the WRITE ended %d: %s", st, why);
    for (size_t i = 0; i < N; i++)
        assert_int_equal(own[AT + i], 0x77);
    assert_int_equal(mc_stats_transport(snd, "rdma", &c1), 0);
    assert_true(c1.bytes_written - c0.bytes_written >= N); /* over rdma */
    /* the nearer range registered again: its key replaces the first one's entry and is the
     * newest; then the larger registration goes too */
    uint8_t k3[MC_BUFFER_KEY_SIZE];
    key_of(owner, own + 4096, LEN - 4096, k3);
    assert_int_equal(mc_segment_add_buffer(snd, seg, k3, sizeof(k3)), 0);
    assert_int_equal(mc_mem_unregister_range(owner, own, LEN), 0);
    memset(src, 0x99, N);
    st = th_xfer(snd, MC_WRITE, src, seg, (uint64_t)(uintptr_t)(own + AT), N, why, sizeof(why));
    if (st != MC_TASK_COMPLETED)
        fail_msg("the second WRITE ended %d: %s", st, why);
    for (size_t i = 0; i < N; i++)
        assert_int_equal(own[AT + i], 0x99);
    arm_pair_destroy();
}

/* A WRITE of n bytes of v from src to dst in seg, submitted by a sender that posts nothing
 * until it is driven (keys_pair(true, ...)); the sender's rdma counters then in *c0. */
static mc_batch_t *write_submit(mc_engine_t *snd, mc_segment_id_t seg, uint8_t *src, uint8_t *dst,
                                size_t n, uint8_t v, mc_counters_t *c0)
{
    mc_request_t req = {.opcode = MC_WRITE,
                        .local = src,
                        .target = seg,
                        .target_offset = (uint64_t)(uintptr_t)dst,
                        .length = n};
    mc_batch_t *b;

    memset(src, v, n);
    assert_int_equal(mc_stats_transport(snd, "rdma", c0), 0);
    assert_int_equal(mc_batch_create(snd, 1, &b), 0);
    assert_int_equal(mc_batch_submit(b, &req, 1, NULL), 0);
    return b;
}

/* ... then: it completes, over rdma, and dst holds the bytes. */
static void write_done(mc_engine_t *snd, mc_batch_t *b, const uint8_t *dst, size_t n, uint8_t v,
                       const mc_counters_t *c0)
{
    mc_counters_t c1 = {0};
    mc_task_status_t st;

    assert_int_equal(mc_batch_wait(b, -1), 0);
    assert_int_equal(mc_task_status(b, 0, &st), 0);
    if (st.state != MC_TASK_COMPLETED)
        fail_msg("the WRITE ended %d: %s", st.state, st.reason ? st.reason : "");
    th_batch_destroy(snd, b);
    for (size_t i = 0; i < n; i++)
        assert_int_equal(dst[i], v);
    assert_int_equal(mc_stats_transport(snd, "rdma", &c1), 0);
    assert_true(c1.bytes_written - c0->bytes_written >= n); /* over rdma */
}

/* A task notes where its remote buffer is in the peer's descriptor when it is submitted, and
 * the rdma transport used that note when it posted: a key added in between shifted the entries,
 * and the note then named the entry before, of a registration the owner had dropped that held
 * the same bytes (UCX's rendezvous over rdma met it: a GET refused by the owner's NIC, the send
 * never completed). */
static void test_key_shift_rdma(void **state)
{
    enum { LOW = 8192, LEN = 256 << 10, AT = 16384, N = 16384 };
    static uint8_t area[LOW + LEN] __attribute__((aligned(4096))), src[N], first[64];
    uint8_t *own = area + LOW;
    uint8_t k1[MC_BUFFER_KEY_SIZE], k2[MC_BUFFER_KEY_SIZE], k3[MC_BUFFER_KEY_SIZE];
    mc_counters_t c0 = {0};
    mc_engine_t *snd, *owner;

    (void)state;
    if (!softverbs())
        skip();
    /* the sender posts nothing until the wait below */
    mc_segment_id_t seg = keys_pair(true, src, N, first, sizeof(first), &snd, &owner);
    /* the peer's entries by address: [own, LEN) (dropped by the owner), then [own+4096, ...)
     * (the newest key: the task's buffer) */
    key_of(owner, own, LEN, k1);
    key_of(owner, own + 4096, LEN - 4096, k2);
    assert_int_equal(mc_segment_add_buffer(snd, seg, k1, sizeof(k1)), 0);
    assert_int_equal(mc_segment_add_buffer(snd, seg, k2, sizeof(k2)), 0);
    assert_int_equal(mc_mem_unregister_range(owner, own, LEN), 0);
    key_of(owner, area, 4096, k3);
    mc_batch_t *b = write_submit(snd, seg, src, own + AT, N, 0x5a, &c0);
    /* an entry below both: the task's buffer moves up one place before the task is posted */
    assert_int_equal(mc_segment_add_buffer(snd, seg, k3, sizeof(k3)), 0);
    write_done(snd, b, own + AT, N, 0x5a, &c0);
    arm_pair_destroy();
}

/* A task stays with the key it was routed with: a key of another registration that holds the
 * same bytes, added before the task is posted and dropped by the owner then, is not the one it
 * goes with (after the entries moved, the task took the newest holder), also after its own key
 * was given again meanwhile (which numbers its entry anew). */
static void test_key_routed_rdma(void **state)
{
    enum { LEN = 256 << 10, AT = 16384, N = 16384 };
    static uint8_t own[LEN] __attribute__((aligned(4096))), src[N], first[64];
    uint8_t k0[MC_BUFFER_KEY_SIZE], k1[MC_BUFFER_KEY_SIZE], kf[MC_BUFFER_KEY_SIZE];
    mc_counters_t c0 = {0};
    mc_engine_t *snd, *owner;

    (void)state;
    if (!softverbs())
        skip();
    /* the sender posts nothing until the wait below */
    mc_segment_id_t seg = keys_pair(true, src, N, first, sizeof(first), &snd, &owner);
    key_of(owner, own, LEN, k0);
    assert_int_equal(mc_segment_add_buffer(snd, seg, k0, sizeof(k0)), 0);
    mc_batch_t *b = write_submit(snd, seg, src, own + AT, N, 0x6b, &c0);
    /* another key, then the task's again: its entry is numbered anew */
    assert_int_equal(mc_buffer_key_pack_range(owner, first, sizeof(first), kf), 0);
    assert_int_equal(mc_segment_add_buffer(snd, seg, kf, sizeof(kf)), 0);
    assert_int_equal(mc_segment_add_buffer(snd, seg, k0, sizeof(k0)), 0);
    /* another registration of the task's bytes: its key is the newest, then it goes */
    key_of(owner, own + 4096, LEN - 4096, k1);
    assert_int_equal(mc_segment_add_buffer(snd, seg, k1, sizeof(k1)), 0);
    assert_int_equal(mc_mem_unregister_range(owner, own + 4096, LEN - 4096), 0);
    write_done(snd, b, own + AT, N, 0x6b, &c0);
    arm_pair_destroy();
}

/* ---- sends and flushes from a callback while the engine is destroyed ------------------------ */

static struct {
    mc_engine_t *e;
    mc_segment_id_t seg;
    atomic_int first, second, flushed; /* callbacks run */
    int send_rc, flush_rc;             /* what the calls made from the first one returned */
} late;

static void on_late_second(void *arg, int status)
{
    (void)arg, (void)status;
    atomic_fetch_add(&late.second, 1);
}

static void on_late_flush(void *arg, int status)
{
    (void)arg, (void)status;
    atomic_fetch_add(&late.flushed, 1);
}

/* The first message's completion runs while its engine is destroyed, and sends and flushes
 * from there: each call either fails or has its callback run, once, before destroy returns. */
static void on_late_first(void *arg, int status)
{
    static const uint8_t b[8];
    mc_msg_opts_t o = {.size = sizeof(o), .cb = on_late_second};

    (void)arg, (void)status;
    atomic_fetch_add(&late.first, 1);
    late.send_rc = mc_msg_send_ex(late.e, late.seg, TH_MSG_ID, b, sizeof(b), &o);
    late.flush_rc = mc_peer_flush(late.e, late.seg, on_late_flush, NULL);
}

static void test_send_during_destroy(void **state)
{
    static const uint8_t b[8];
    mc_engine_t *snd, *host;
    mc_msg_opts_t o = {.size = sizeof(o), .cb = on_late_first};
    int fd;

    (void)state;
    memset(&late, 0, sizeof(late));
    arm_pair("shm", 0, &host, &snd, &fd); /* snd: caller progress, never driven here */
    late.e = snd;
    assert_int_equal(mc_segment_open(snd, mc_engine_segment_name(host), &late.seg), 0);
    assert_int_equal(mc_msg_send_ex(snd, late.seg, TH_MSG_ID, b, sizeof(b), &o), 0);
    mc_engine_destroy(snd);
    g.e[1] = NULL;
    assert_int_equal(atomic_load(&late.first), 1);
    assert_int_equal(atomic_load(&late.second), late.send_rc ? 0 : 1);
    assert_int_equal(atomic_load(&late.flushed), late.flush_rc ? 0 : 1);
    print_message("  from the callback: send %d, flush %d\n", late.send_rc, late.flush_rc);
    arm_pair_destroy();
}

/* ---- an engine destroyed from a callback of another ---------------------------------------- */

bool mc__in_pass_of(const mc_engine_t *e); /* engine_int.h: the white-box check below */

static struct {
    mc_engine_t *victim, *host;
    atomic_int ran;
    bool in_pass_after; /* the host's pass, as this thread sees it once the victim is gone */
} doom;

static void on_doom_msg(void *arg, const char *sender, uint8_t id, const void *data, size_t len)
{
    (void)arg, (void)sender, (void)id, (void)data, (void)len;
    mc_engine_destroy(doom.victim);
    doom.victim = NULL;
    doom.in_pass_after = mc__in_pass_of(doom.host);
    atomic_fetch_add(&doom.ran, 1);
}

/* A message handler of one engine destroys another: the handler's own pass goes on as a pass
 * (destroy used to end it for this thread, so what the handler did next took the slow way). */
static void test_destroy_from_callback(void **state)
{
    mc_engine_t *snd, *host;
    mc_segment_id_t seg;
    th_cfg_t cfg;
    int fd;

    (void)state;
    memset(&doom, 0, sizeof(doom));
    arm_pair("shm", 100, &snd, &host, &fd); /* its serving thread answers the handshake */
    th_config(&cfg);
    doom.victim = th_engine(&cfg);
    doom.host = host;
    assert_int_equal(mc_msg_handler_set(host, TH_MSG_ID, on_doom_msg, NULL), 0);
    assert_int_equal(mc_segment_open(snd, mc_engine_segment_name(host), &seg), 0);
    assert_int_equal(mc_msg_send(snd, seg, TH_MSG_ID, "x", 1), 0);
    for (int64_t dl = th_now_ms() + 10000; !atomic_load(&doom.ran) && th_now_ms() < dl;)
        mc_engine_progress(host);
    assert_int_equal(atomic_load(&doom.ran), 1);
    assert_true(doom.in_pass_after);
    arm_pair_destroy();
}

/* ---- handlers set while messages arrive ------------------------------------------------------ */

#define SWAP_N 20000

static struct {
    int tag[2];             /* each handler's argument */
    atomic_ulong calls[2];  /* messages each handler took */
    atomic_ulong next, bad; /* the next message's number; a wrong argument or number */
    atomic_ulong swaps;     /* handlers set by the swapper */
    atomic_bool stop;
    mc_engine_t *host;
} swap;

static void on_swap(int k, void *arg, const void *data, size_t len)
{
    uint64_t n;

    if (arg != &swap.tag[k] || len != sizeof(n)) {
        atomic_fetch_add(&swap.bad, 1);
        return;
    }
    memcpy(&n, data, sizeof(n));
    if (n != atomic_load(&swap.next))
        atomic_fetch_add(&swap.bad, 1);
    atomic_store(&swap.next, n + 1);
    atomic_fetch_add(&swap.calls[k], 1);
}

static void on_swap_a(void *arg, const char *from, uint8_t id, const void *data, size_t len)
{
    (void)from;
    (void)id;
    on_swap(0, arg, data, len);
}

static void on_swap_b(void *arg, const char *from, uint8_t id, const void *data, size_t len)
{
    (void)from;
    (void)id;
    on_swap(1, arg, data, len);
}

static void *swapper(void *arg)
{
    (void)arg;
    for (unsigned i = 0; !atomic_load(&swap.stop); i++) {
        mc_msg_handler_set(swap.host, TH_MSG_ID, i % 2 ? on_swap_b : on_swap_a, &swap.tag[i % 2]);
        atomic_fetch_add(&swap.swaps, 1);
    }
    return NULL;
}

/* Handlers are read by progress without a lock (a sequence lock): a thread that swaps the
 * handler and its argument as fast as it can while 2*10^4 messages arrive over the same-host
 * ring never lets a handler run with the other's argument, every message runs one handler,
 * once, in order, and both handlers get some (the messages go in bursts, each once the swapper
 * ran since the last: a burst can be delivered while the swapper waits for a core). */
static void test_handler_swap(void **state)
{
    mc_segment_id_t seg;
    pthread_t t;
    th_cfg_t cfg;

    (void)state;
    memset(&swap, 0, sizeof(swap));
    th_config(&cfg);
    th_set(&cfg, "PROTOCOL", "shm");
    mc_engine_t *snd = g.e[0] = th_engine(&cfg);
    swap.host = g.e[1] = th_engine(&cfg);
    assert_int_equal(mc_msg_handler_set(swap.host, TH_MSG_ID, on_swap_a, &swap.tag[0]), 0);
    assert_int_equal(mc_segment_open(snd, mc_engine_segment_name(swap.host), &seg), 0);
    assert_int_equal(pthread_create(&t, NULL, swapper, NULL), 0);
    int64_t dl = th_now_ms() + 30000;
    int rc = 0;
    for (uint64_t n = 0; n < SWAP_N && th_now_ms() < dl && (!rc || rc == -EAGAIN);) {
        if (n % (SWAP_N / 20) == 0) {
            unsigned long seen = atomic_load(&swap.swaps);
            while (atomic_load(&swap.swaps) < seen + 2 && th_now_ms() < dl)
                sched_yield();
        }
        rc = mc_msg_send(snd, seg, TH_MSG_ID, &n, sizeof(n));
        if (rc == -EAGAIN)
            sched_yield();
        else if (!rc)
            n++;
    }
    while (!rc && atomic_load(&swap.next) < SWAP_N && th_now_ms() < dl)
        usleep(1000);
    atomic_store(&swap.stop, true); /* before any assert: teardown destroys its engine */
    pthread_join(t, NULL);
    assert_int_equal(rc, 0);
    assert_int_equal(atomic_load(&swap.next), SWAP_N);
    assert_int_equal(atomic_load(&swap.calls[0]) + atomic_load(&swap.calls[1]), SWAP_N);
    assert_int_equal(atomic_load(&swap.bad), 0);
    assert_true(atomic_load(&swap.calls[0]) > 0 && atomic_load(&swap.calls[1]) > 0);
    arm_pair_destroy();
}

/* ---- registrations --------------------------------------------------------------------------- */

/* The same pages registered twice by two layers, and a smaller range inside a larger one: a
 * peer (this engine itself, over tcp) reaches each range while any registration covers it; two
 * ranges from one address are unregistered each by its length. */
static void test_overlapping_registrations(void **state)
{
    const size_t len = 4 * MIB;
    th_cfg_t cfg;
    mc_segment_id_t self;
    uint8_t *m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

    (void)state;
    assert_true(m != MAP_FAILED);
    th_config(&cfg);
    mc_engine_t *e = g.e[0] = th_engine(&cfg);
    uint8_t *src = th_buf(e, MIB);
    assert_int_equal(mc_mem_register(e, m, len, "cpu:0"), 0);       /* a pool */
    assert_int_equal(mc_mem_register(e, m + MIB, MIB, "cpu:0"), 0); /* a cache inside it */
    assert_int_equal(mc_mem_register(e, m + MIB, MIB, "cpu:0"), 0); /* ... twice */
    assert_int_equal(mc_segment_open(e, mc_engine_segment_name(e), &self), 0);

    th_fill(src, MIB, 88);
    uint64_t inner = (uint64_t)(uintptr_t)(m + MIB), far = (uint64_t)(uintptr_t)(m + 3 * MIB);
    assert_int_equal(th_xfer(e, MC_WRITE, src, self, inner + 100, MIB - 200, NULL, 0),
                     MC_TASK_COMPLETED);
    assert_int_equal(th_check(m + MIB + 100, MIB - 200, 88), -1);
    /* A range across the inner one's end is inside the pool. */
    assert_int_equal(th_xfer(e, MC_WRITE, src, self, inner + MIB / 2, MIB, NULL, 0),
                     MC_TASK_COMPLETED);
    assert_int_equal(th_check(m + MIB + MIB / 2, MIB, 88), -1);

    assert_int_equal(mc_mem_unregister(e, m + MIB), 0); /* one of the two inner ones */
    assert_int_equal(mc_mem_unregister(e, m), 0);       /* the pool */
    th_fill(src, MIB, 89);
    assert_int_equal(th_xfer(e, MC_WRITE, src, self, inner, MIB, NULL, 0), MC_TASK_COMPLETED);
    assert_int_equal(th_check(m + MIB, MIB, 89), -1);
    mc_task_status_t st = xfer_opts(e, MC_WRITE, src, self, far, 4096, 0);
    assert_int_equal(st.state, MC_TASK_FAILED);
    assert_int_equal(st.error, -MC_EACCESS);
    assert_int_equal(mc_mem_unregister(e, m + MIB), 0); /* the last one */
    st = xfer_opts(e, MC_WRITE, src, self, inner, 4096, 0);
    assert_int_equal(st.state, MC_TASK_FAILED);
    assert_int_equal(st.error, -MC_EACCESS);
    assert_int_equal(th_check(m + MIB, MIB, 89), -1); /* untouched */

    /* Two ranges from one address (a registration cache that merged a region into a larger
     * one): mc_mem_unregister_range drops the one named, whichever came last. */
    assert_int_equal(mc_mem_register(e, m, MIB, "cpu:0"), 0);
    assert_int_equal(mc_mem_register(e, m, 2 * MIB, "cpu:0"), 0);
    assert_int_equal(mc_mem_unregister_range(e, m, 12345), -ENOENT);
    assert_int_equal(mc_mem_unregister_range(e, m, MIB), 0); /* the first, not the latest */
    th_fill(src, MIB, 90);
    assert_int_equal(th_xfer(e, MC_WRITE, src, self, (uint64_t)(uintptr_t)m + MIB, MIB, NULL, 0),
                     MC_TASK_COMPLETED);
    assert_int_equal(th_check(m + MIB, MIB, 90), -1);
    assert_int_equal(mc_mem_unregister_range(e, m, 2 * MIB), 0);
    st = xfer_opts(e, MC_WRITE, src, self, (uint64_t)(uintptr_t)m, 4096, 0);
    assert_int_equal(st.error, -MC_EACCESS);
    th_close(e, self);
    th_buf_free(e, src, MIB);
    munmap(m, len);
}

/* ---- opening without blocking ---------------------------------------------------------------- */

typedef struct events {
    atomic_int n[4];
    atomic_int error;
} events_t;

static void on_event(void *arg, mc_segment_id_t id, mc_peer_event_t ev, int error,
                     const char *reason)
{
    events_t *pe = arg;

    (void)id;
    (void)reason;
    atomic_store(&pe->error, error);
    atomic_fetch_add(&pe->n[ev], 1);
}

/* Nothing listens at the address: the open returns at once, the task submitted meanwhile
 * fails with -MC_EPEERDEAD within the connect timeout, the host hears UNREACHABLE and the
 * segment is DEAD. A name that is not an address, with no metadata, is refused at once. */
static void test_open_unreachable(void **state)
{
    th_cfg_t cfg;
    mc_segment_id_t id;
    static events_t ev;
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t sl = sizeof(sa);
    char name[64];

    (void)state;
    /* A port that was just free and that nobody listens on. */
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_int_equal(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    assert_int_equal(getsockname(fd, (struct sockaddr *)&sa, &sl), 0);
    close(fd);
    snprintf(name, sizeof(name), "127.0.0.1:%u", ntohs(sa.sin_port));

    th_config(&cfg);
    th_set(&cfg, "CONNECT_TIMEOUT_MS", "1000");
    mc_engine_t *e = g.e[0] = th_engine(&cfg);
    memset(&ev, 0, sizeof(ev));
    assert_int_equal(mc_peer_handler_set(e, on_event, &ev), 0);
    uint8_t *src = th_buf(e, 4096);
    assert_int_equal(mc_segment_open_nb(e, "no-such-segment", &id), -MC_ENOSEGMENT);
    int64_t t0 = th_now_ms();
    assert_int_equal(mc_segment_open_nb(e, name, &id), 0);
    assert_true(th_now_ms() - t0 < 100);
    mc_task_status_t st = xfer_opts(e, MC_WRITE, src, id, 0x10000, 4096, 0);
    print_message("  %s after %lld ms: %s\n", mc_err_name(st.error), (long long)(th_now_ms() - t0),
                  st.reason);
    assert_int_equal(st.state, MC_TASK_FAILED);
    assert_int_equal(st.error, -MC_EPEERDEAD);
    assert_true(th_now_ms() - t0 < 2000);
    int64_t dl = th_now_ms() + 2000;
    while (!atomic_load(&ev.n[MC_PEER_UNREACHABLE]) && th_now_ms() < dl)
        th_sleep_ms(1);
    assert_int_equal(atomic_load(&ev.n[MC_PEER_UNREACHABLE]), 1);
    assert_int_equal(atomic_load(&ev.n[MC_PEER_CONNECTED]), 0);
    assert_int_equal(mc_segment_state(e, id), MC_SEGMENT_DEAD);
    th_close(e, id);
    th_buf_free(e, src, 4096);
}

/* By a name metadata does not know yet: OPENING, work waits; once the segment is published
 * (an engine created later) it is READY and the waiting task moves its bytes. */
static void test_open_by_name_later(void **state)
{
    th_cfg_t cfg;
    mc_segment_id_t id;
    mc_batch_t *b;
    mc_task_status_t ts;
    static events_t ev;
    char url[128];

    (void)state;
    th_tmpdir(g.dir, sizeof(g.dir));
    snprintf(url, sizeof(url), "file://%s", g.dir);
    th_config(&cfg);
    th_set(&cfg, "METADATA", "%s", url);
    th_set(&cfg, "CONNECT_TIMEOUT_MS", "10000");
    mc_engine_t *e = g.e[0] = th_engine(&cfg);
    memset(&ev, 0, sizeof(ev));
    assert_int_equal(mc_peer_handler_set(e, on_event, &ev), 0);
    uint8_t *src = th_buf(e, 65536);
    th_fill(src, 65536, 4040);
    assert_int_equal(mc_segment_open_nb(e, "published-later", &id), 0);
    assert_int_equal(mc_segment_state(e, id), MC_SEGMENT_OPENING);

    th_set(&cfg, "SEGMENT_NAME", "published-later");
    mc_engine_t *late = g.e[1] = th_engine(&cfg);
    uint8_t *dst = th_buf(late, 65536);
    mc_request_t r = {.opcode = MC_WRITE,
                      .local = src,
                      .target = id,
                      .target_offset = (uint64_t)(uintptr_t)dst,
                      .length = 65536};
    assert_int_equal(mc_batch_create(e, 1, &b), 0);
    assert_int_equal(mc_batch_submit(b, &r, 1, NULL), 0);
    assert_int_equal(mc_batch_wait(b, 15000), 0);
    assert_int_equal(mc_task_status(b, 0, &ts), 0);
    if (ts.state != MC_TASK_COMPLETED)
        print_error("state %d: %s\n", ts.state, ts.reason);
    assert_int_equal(ts.state, MC_TASK_COMPLETED);
    th_batch_destroy(e, b);
    assert_int_equal(th_check(dst, 65536, 4040), -1);
    assert_int_equal(mc_segment_state(e, id), MC_SEGMENT_READY);
    int64_t dl = th_now_ms() + 3000; /* shm moved the bytes; the control link may come later */
    while (!atomic_load(&ev.n[MC_PEER_CONNECTED]) && th_now_ms() < dl)
        th_sleep_ms(1);
    assert_int_equal(atomic_load(&ev.n[MC_PEER_CONNECTED]), 1);
    assert_int_equal(mc_segment_close(e, id), 0);
    th_buf_free(late, dst, 65536);
    th_buf_free(e, src, 65536);
}

#define RACE_THREADS 4
#define RACE_ROUNDS  100

static struct {
    mc_engine_t *e;
    pthread_barrier_t go;
    mc_segment_id_t id[RACE_THREADS];
    int rc[RACE_THREADS];
} race;

static void *race_open(void *arg)
{
    int k = (int)(intptr_t)arg;

    pthread_barrier_wait(&race.go);
    race.rc[k] = mc_segment_open(race.e, "racy-open", &race.id[k]);
    if (race.rc[k])
        print_error("open %d: %s\n", k, mc_last_error());
    return NULL;
}

/* Threads that open one same-host segment at once: one peer wins, the others' copies (with
 * their shm state) are let go of under the engine's lock while progress frees the peers
 * closed the round before. Every thread gets the same id, every round; the peer still moves
 * bytes after 100 rounds. */
static void test_open_race(void **state)
{
    pthread_t t[RACE_THREADS];
    mc_segment_id_t id;
    th_cfg_t cfg;
    char url[128];

    (void)state;
    th_tmpdir(g.dir, sizeof(g.dir)); /* teardown removes it */
    snprintf(url, sizeof(url), "file://%s", g.dir);
    th_config(&cfg);
    th_set(&cfg, "METADATA", "%s", url);
    race.e = g.e[0] = th_engine(&cfg);
    th_set(&cfg, "SEGMENT_NAME", "racy-open");
    mc_engine_t *owner = g.e[1] = th_engine(&cfg);
    uint8_t *dst = th_buf(owner, 65536), *src = th_buf(race.e, 65536);
    for (int r = 0; r < RACE_ROUNDS; r++) {
        pthread_barrier_init(&race.go, NULL, RACE_THREADS);
        for (int k = 0; k < RACE_THREADS; k++)
            assert_int_equal(pthread_create(&t[k], NULL, race_open, (void *)(intptr_t)k), 0);
        for (int k = 0; k < RACE_THREADS; k++)
            pthread_join(t[k], NULL);
        pthread_barrier_destroy(&race.go);
        for (int k = 0; k < RACE_THREADS; k++) {
            assert_int_equal(race.rc[k], 0);
            assert_int_equal(race.id[k], race.id[0]);
        }
        for (int k = 0; k < RACE_THREADS; k++)
            assert_int_equal(mc_segment_close(race.e, race.id[k]), 0);
    }
    assert_int_equal(mc_segment_open(race.e, "racy-open", &id), 0);
    th_fill(src, 65536, 5150);
    mc_task_status_t ts = xfer_opts(race.e, MC_WRITE, src, id, (uint64_t)(uintptr_t)dst, 65536, 0);
    assert_int_equal(ts.state, MC_TASK_COMPLETED);
    assert_int_equal(th_check(dst, 65536, 5150), -1);
    assert_int_equal(mc_segment_close(race.e, id), 0);
    th_buf_free(owner, dst, 65536);
    th_buf_free(race.e, src, 65536);
    /* Without metadata, opened by name (OPENING: its instance not known yet) and at once by its
     * address: one peer, not a second one with a message stream of its own. */
    th_config(&cfg);
    th_set(&cfg, "METADATA", "none");
    mc_engine_t *a = g.e[2] = th_engine(&cfg), *b = g.e[3] = th_engine(&cfg);
    uint8_t addr[256];
    size_t alen = sizeof(addr);
    mc_segment_id_t by_name, by_addr;
    assert_int_equal(mc_engine_address(b, addr, &alen), 0);
    assert_int_equal(mc_segment_open_nb(a, mc_engine_segment_name(b), &by_name), 0);
    assert_int_equal(mc_segment_open_address(a, addr, alen, &by_addr), 0);
    assert_int_equal(by_addr, by_name);
    assert_int_equal(mc_segment_close(a, by_addr), 0);
    assert_int_equal(mc_segment_close(a, by_name), 0);
}

static uint8_t *export_blob(mc_engine_t *e, size_t *len_p)
{
    size_t len = 0;

    assert_int_equal(mc_segment_export(e, NULL, &len), -ENOSPC);
    uint8_t *blob = malloc(len);
    assert_non_null(blob);
    assert_int_equal(mc_segment_export(e, blob, &len), 0);
    *len_p = len;
    return blob;
}

/* A newer blob of a segment that is open refreshes it: the same id, and the buffers registered
 * since listed after the next progress pass (which applies the blob, before any submit that
 * follows it) and usable, without asking the peer. */
static void test_open_blob_refresh(void **state)
{
    th_cfg_t cfg;
    mc_segment_id_t id, id2;
    mc_buffer_info_t bi[4];
    size_t n, l1, l2;

    (void)state;
    th_config(&cfg);
    th_set(&cfg, "FORCE_TCP", "1");
    mc_engine_t *a = g.e[0] = th_engine(&cfg);
    th_set(&cfg, "PROGRESS_THREAD", "0");
    mc_engine_t *b = g.e[1] = th_engine(&cfg);
    uint8_t *a1 = th_buf(a, MIB), *src = th_buf(b, MIB);
    uint8_t *blob1 = export_blob(a, &l1);
    uint8_t *a2 = th_buf(a, MIB);
    uint8_t *blob2 = export_blob(a, &l2);
    assert_int_equal(mc_segment_open_blob(b, blob1, l1, &id), 0);
    assert_int_equal(mc_segment_buffers(b, id, bi, 4, &n), 0);
    assert_int_equal(n, 1);
    assert_int_equal(mc_segment_open_blob(b, blob2, l2, &id2), 0);
    assert_int_equal(id2, id);
    mc_engine_progress(b);
    assert_int_equal(mc_segment_buffers(b, id, bi, 4, &n), 0);
    assert_int_equal(n, 2);
    th_fill(src, MIB, 2024);
    assert_int_equal(th_xfer(b, MC_WRITE, src, id, (uint64_t)(uintptr_t)a2, MIB, NULL, 0),
                     MC_TASK_COMPLETED);
    assert_int_equal(th_check(a2, MIB, 2024), -1);
    th_close(b, id);
    th_close(b, id);
    free(blob1);
    free(blob2);
    th_buf_free(b, src, MIB);
    th_buf_free(a, a1, MIB);
    th_buf_free(a, a2, MIB);
}

/* A segment closed while its descriptor request is unanswered (its process stopped): the
 * request's connection goes with it and nothing of the peer is touched afterwards. */
static void test_close_waiting_peer(void **state)
{
    th_cfg_t cfg;

    (void)state;
    th_config(&cfg);
    th_set(&cfg, "FORCE_TCP", "1");
    th_set(&cfg, "CONNECT_TIMEOUT_MS", "500");
    th_target_t *t = spawn(0, &cfg, MIB, 0);
    mc_engine_t *e = g.e[0] = th_engine(&cfg);
    mc_segment_id_t seg = th_open(e, t, 0);
    uint8_t *src = th_buf(e, 65536);
    assert_int_equal(th_xfer(e, MC_WRITE, src, seg, t->eng[0].buf[0], 65536, NULL, 0),
                     MC_TASK_COMPLETED);
    th_stop(t->pid);
    /* Beyond what we know of it: the task waits for a descriptor that does not come. */
    mc_task_status_t st = xfer_opts(e, MC_WRITE, src, seg, t->eng[0].buf[0] + MIB, 4096, 0);
    assert_int_equal(st.state, MC_TASK_FAILED);
    assert_int_equal(st.error, -MC_EPEERDEAD);
    assert_true(th_contains(st.reason, "no descriptor"));
    th_close(e, seg);
    for (int i = 0; i < 50; i++) { /* passes after the close, with the peer gone */
        mc_engine_progress(e);
        th_sleep_ms(2);
    }
    kill(t->pid, SIGCONT);
    th_buf_free(e, src, 65536);
}

/* A peer opened by name restarts under the same name (another process, another instance): the
 * old segment is DEAD and never rebinds to the new process; opening the name again reaches it. */
static void test_restarted_peer(void **state)
{
    th_cfg_t cfg;
    static events_t ev;
    mc_segment_id_t seg, seg2;
    char url[128];

    (void)state;
    th_tmpdir(g.dir, sizeof(g.dir));
    snprintf(url, sizeof(url), "file://%s", g.dir);
    th_config(&cfg);
    th_set(&cfg, "FORCE_TCP", "1");
    th_set(&cfg, "METADATA", "%s", url);
    mc_engine_t *e = g.e[0] = th_engine(&cfg);
    th_set(&cfg, "SEGMENT_NAME", "restarting");
    th_target_t *t = spawn(0, &cfg, MIB, 0);
    memset(&ev, 0, sizeof(ev));
    assert_int_equal(mc_peer_handler_set(e, on_event, &ev), 0);
    uint8_t *src = th_buf(e, 65536);
    th_fill(src, 65536, 7);
    assert_int_equal(mc_segment_open(e, "restarting", &seg), 0);
    assert_int_equal(th_xfer(e, MC_WRITE, src, seg, t->eng[0].buf[0], 65536, NULL, 0),
                     MC_TASK_COMPLETED);
    th_target_kill(t);
    th_target_t *t2 = spawn(1, &cfg, MIB, 0);
    int64_t dl = th_now_ms() + 5000;
    while (mc_segment_state(e, seg) != MC_SEGMENT_DEAD && th_now_ms() < dl)
        th_sleep_ms(5);
    assert_int_equal(mc_segment_state(e, seg), MC_SEGMENT_DEAD);
    mc_task_status_t st = xfer_opts(e, MC_WRITE, src, seg, t2->eng[0].buf[0], 65536, 0);
    assert_int_equal(st.error, -MC_EPEERDEAD);
    assert_int_equal(th_remote_check(t2, 0, t2->eng[0].buf[0], 65536, 0x7a7a, 0), -1);
    assert_int_equal(mc_segment_open(e, "restarting", &seg2), 0);
    assert_true(seg2 != seg);
    assert_int_equal(th_xfer(e, MC_WRITE, src, seg2, t2->eng[0].buf[0], 65536, NULL, 0),
                     MC_TASK_COMPLETED);
    assert_int_equal(th_remote_check(t2, 0, t2->eng[0].buf[0], 65536, 7, 0), -1);
    th_close(e, seg);
    th_close(e, seg2);
    th_buf_free(e, src, 65536);
}

/* A caller-progress engine opens itself by name (blocking) and by address (not), and moves
 * bytes between two of its own buffers through its own listener. */
static void test_open_self(void **state)
{
    th_cfg_t cfg;
    mc_segment_id_t a, b;
    uint8_t addr[MC_ADDRESS_MAX];
    size_t alen = sizeof(addr);

    (void)state;
    th_config(&cfg);
    th_set(&cfg, "PROGRESS_THREAD", "0");
    mc_engine_t *e = g.e[0] = th_engine(&cfg);
    uint8_t *src = th_buf(e, MIB), *dst = th_buf(e, MIB);
    assert_int_equal(mc_engine_address(e, NULL, &alen), -EINVAL);
    alen = 4;
    assert_int_equal(mc_engine_address(e, addr, &alen), -ENOSPC);
    assert_true(alen > 4 && alen <= MC_ADDRESS_MAX);
    assert_int_equal(mc_engine_address(e, addr, &alen), 0);
    assert_int_equal(mc_segment_open_address(e, addr, alen, &a), 0);
    assert_int_equal(mc_segment_open(e, mc_engine_segment_name(e), &b), 0);
    assert_int_equal(a, b);
    assert_int_equal(mc_segment_state(e, a), MC_SEGMENT_READY);
    assert_int_equal(mc_segment_is_local_host(e, a), 1);
    th_fill(src, MIB, 123);
    assert_int_equal(th_xfer(e, MC_WRITE, src, a, (uint64_t)(uintptr_t)dst, MIB, NULL, 0),
                     MC_TASK_COMPLETED);
    assert_int_equal(th_check(dst, MIB, 123), -1);
    memset(src, 0, MIB);
    assert_int_equal(th_xfer(e, MC_READ, src, a, (uint64_t)(uintptr_t)dst, MIB, NULL, 0),
                     MC_TASK_COMPLETED);
    assert_int_equal(th_check(src, MIB, 123), -1);
    assert_int_equal(mc_segment_close(e, a), 0);
    assert_int_equal(mc_segment_close(e, b), 0);
    th_buf_free(e, src, MIB);
    th_buf_free(e, dst, MIB);
}

/* ---- a flooded target ----------------------------------------------------------------------- */

static uint64_t cpu_ticks(pid_t pid)
{
    char path[64], buf[1024];
    unsigned long ut = 0, st = 0;

    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    assert_non_null(fgets(buf, sizeof(buf), f));
    fclose(f);
    const char *p = strrchr(buf, ')'); /* fields after the command name */
    assert_non_null(p);
    assert_int_equal(sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st),
                     2);
    return ut + st;
}

static size_t count_lines(const char *path)
{
    FILE *f = fopen(path, "r");
    size_t n = 0;
    int c;

    if (!f)
        return 0;
    while ((c = fgetc(f)) != EOF)
        n += c == '\n';
    fclose(f);
    return n;
}

/* A target allowed 256 descriptors gets 600 connections that never say a word. It stays below
 * 50% of a CPU (no spinning on accept's EMFILE), logs a bounded number of lines, drops the
 * silent connections after MC_CONNECT_TIMEOUT_MS, and then serves a real peer. */
static void test_inbound_flood(void **state)
{
    const size_t n_flood = 600;
    th_cfg_t cfg;
    th_target_opts_t o;
    char log[128];
    struct rlimit rl = {256, 256}, mine;

    (void)state;
    th_tmpdir(g.dir, sizeof(g.dir));
    snprintf(log, sizeof(log), "%s/target.log", g.dir);
    th_config(&cfg);
    th_set(&cfg, "FORCE_TCP", "1");
    th_set(&cfg, "CONNECT_TIMEOUT_MS", "1000");
    th_set(&cfg, "LOG_LEVEL", "warn");
    th_target_opts_init(&o, &cfg, MIB);
    snprintf(o.log_path, sizeof(o.log_path), "%s", log);
    assert_int_equal(th_target_spawn(&o, &g.t[0]), 0);
    th_target_t *t = &g.t[0];
    assert_int_equal(prlimit(t->pid, RLIMIT_NOFILE, &rl, NULL), 0);

    assert_int_equal(getrlimit(RLIMIT_NOFILE, &mine), 0);
    if (mine.rlim_cur < n_flood + 64) {
        mine.rlim_cur = mine.rlim_max;
        setrlimit(RLIMIT_NOFILE, &mine);
    }
    struct sockaddr_in sa = {.sin_family = AF_INET};
    unsigned port = 0;
    assert_int_equal(sscanf(t->eng[0].name, "127.0.0.1:%u", &port), 1);
    sa.sin_port = htons((uint16_t)port);
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    g.fds = calloc(n_flood, sizeof(int));
    uint64_t c0 = cpu_ticks(t->pid);
    int64_t t0 = th_now_ms();
    for (size_t i = 0; i < n_flood; i++) {
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
        if (fd < 0)
            break;
        g.fds[g.n_fds++] = fd;
        if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 && errno != EINPROGRESS)
            break;
    }
    print_message("  %zu silent connections opened\n", g.n_fds);
    assert_true(g.n_fds > 300);
    th_sleep_ms(3000);
    double cpu = (double)(cpu_ticks(t->pid) - c0) / (double)sysconf(_SC_CLK_TCK) /
                 ((double)(th_now_ms() - t0) / 1000.0);
    print_message("  target CPU while flooded: %.0f%%\n", 100 * cpu);
    assert_true(cpu < 0.5);

    /* A real peer: served once the silent ones are reaped (they stay open on our side). */
    mc_engine_t *e = g.e[0] = th_engine(&cfg);
    mc_segment_id_t seg = th_open(e, t, 0);
    uint8_t *src = th_buf(e, MIB);
    th_fill(src, MIB, 606);
    int st = -1;
    for (int64_t dl = th_now_ms() + 20000; st != MC_TASK_COMPLETED && th_now_ms() < dl;)
        st = th_xfer(e, MC_WRITE, src, seg, t->eng[0].buf[0], MIB, NULL, 0);
    print_message("  a real peer served %lld ms after the flood began\n",
                  (long long)(th_now_ms() - t0));
    assert_int_equal(st, MC_TASK_COMPLETED);
    assert_int_equal(th_remote_check(t, 0, t->eng[0].buf[0], MIB, 606, 0), -1);
    size_t lines = count_lines(log);
    print_message("  target log: %zu lines\n", lines);
    assert_true(lines <= 10);
    th_buf_free(e, src, MIB);
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_batch_reuse, teardown),
        cmocka_unit_test_teardown(test_submit_timeout, teardown),
        cmocka_unit_test_teardown(test_late_read_dropped, teardown),
        cmocka_unit_test_teardown(test_unregister_again, teardown),
        cmocka_unit_test_teardown(test_submit_opts, teardown),
        cmocka_unit_test_teardown(test_ordered_sent, teardown),
        cmocka_unit_test_teardown(test_sent_then_lost, teardown),
        cmocka_unit_test_teardown(test_address_reachable, teardown),
        cmocka_unit_test_teardown(test_release, teardown),
        cmocka_unit_test_teardown(test_destroy_race, teardown),
        cmocka_unit_test_teardown(test_send_during_destroy, teardown),
        cmocka_unit_test_teardown(test_destroy_from_callback, teardown),
        cmocka_unit_test_teardown(test_close_waiting_peer, teardown),
        cmocka_unit_test_teardown(test_restarted_peer, teardown),
        cmocka_unit_test_teardown(test_progress_explicit, teardown),
        cmocka_unit_test_teardown(test_send_only, teardown),
        cmocka_unit_test_teardown(test_caller_idle, teardown),
        cmocka_unit_test_teardown(test_caller_serve, teardown),
        cmocka_unit_test_teardown(test_caller_solo, teardown),
        cmocka_unit_test_teardown(test_engine_arm, teardown),
        cmocka_unit_test_teardown(test_engine_arm_send, teardown),
        cmocka_unit_test_teardown(test_arm_spinning_peer, teardown),
        cmocka_unit_test_teardown(test_served_messages, teardown),
        cmocka_unit_test_teardown(test_served_ack_after_handler, teardown),
        cmocka_unit_test_teardown(test_served_ack_after_handler_tcp, teardown),
        cmocka_unit_test_teardown(test_served_ack_after_handler_rdma, teardown),
        cmocka_unit_test_teardown(test_keep_release, teardown),
        cmocka_unit_test_teardown(test_keep_release_tcp, teardown),
        cmocka_unit_test_teardown(test_keep_release_rdma, teardown),
        cmocka_unit_test_teardown(test_keep_ring_gone_rdma, teardown),
        cmocka_unit_test_teardown(test_newest_key_rdma, teardown),
        cmocka_unit_test_teardown(test_key_shift_rdma, teardown),
        cmocka_unit_test_teardown(test_key_routed_rdma, teardown),
        cmocka_unit_test_teardown(test_handler_swap, teardown),
        cmocka_unit_test_teardown(test_overlapping_registrations, teardown),
        cmocka_unit_test_teardown(test_open_unreachable, teardown),
        cmocka_unit_test_teardown(test_open_by_name_later, teardown),
        cmocka_unit_test_teardown(test_open_self, teardown),
        cmocka_unit_test_teardown(test_open_race, teardown),
        cmocka_unit_test_teardown(test_open_blob_refresh, teardown),
        cmocka_unit_test_teardown(test_inbound_flood, teardown),
    };

    th_main(argc, argv);
    return cmocka_run_group_tests_name("host_api", tests, NULL, NULL);
}
