/*
 * Transport conformance suite: the same cases run once per transport setup (like UCX's
 * UCT_INSTANTIATE_TEST_CASE). An initiator engine in this process moves data to and from a
 * target engine in a child process over loopback; every case checks bytes or exact outcomes.
 */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
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
#include <cmocka.h>
#include <infiniband/verbs.h>

#include "harness.h"

/* ---- transport setups ---------------------------------------------------------------------- */

typedef struct conf_transport {
    const char *name;
    const char *counters;         /* as mc_stats_transport() knows it */
    void (*apply)(th_cfg_t *cfg); /* applied to both engines' configurations */
    int (*available)(void);       /* NULL or 1: run; 0: the cases are skipped */
    int target_alloc;             /* target memory from mc_mem_alloc (memfd) */
    int sync_submit;              /* moves the data inside mc_batch_submit */
} conf_transport_t;

static void tcp_apply(th_cfg_t *cfg)
{
    th_set(cfg, "FORCE_TCP", "1");
}

static void shm_apply(th_cfg_t *cfg)
{
    th_set(cfg, "FORCE_TCP", "0"); /* same host, engine memory: the shm transport */
}

/* rdma between two processes of this host: on the software RDMA device (tools/softverbs,
 * selected with LD_LIBRARY_PATH by the rdma ctest entry). */
static void rdma_apply(th_cfg_t *cfg)
{
    th_set(cfg, "FORCE_TCP", "0");
    th_set(cfg, "PROTOCOL", "rdma");
}

static int rdma_available(void)
{
    int n = 0;
    struct ibv_device **l = ibv_get_device_list(&n);

    if (l)
        ibv_free_device_list(l);
    return n > 0;
}

static const conf_transport_t transports[] = {
    {"tcp", "tcp", tcp_apply, NULL, 0, 0},
    {"tcp-engine-memory", "tcp", tcp_apply, NULL, 1, 0},
    {"shm", "shm", shm_apply, NULL, 1, 1},     /* engine memory: mapped, memcpy */
    {"shm-cma", "shm", shm_apply, NULL, 0, 1}, /* other memory: process_vm_readv/writev */
    {"rdma", "rdma", rdma_apply, rdma_available, 0, 0},
    {"rdma-engine-memory", "rdma", rdma_apply, rdma_available, 1, 0},
};

/* ---- fixture ------------------------------------------------------------------------------ */

typedef struct conf_case {
    const char *name;
    void (*fn)(void **state);
    size_t target_buf; /* bytes per target buffer */
    unsigned n_bufs;
    int progress_thread;
    unsigned flags;
} conf_case_t;

/* The case needs work still in flight after submit returns (cancel, kill mid-batch, wake-ups):
 * it does not apply to a transport that moves the data inside submit. */
#define CASE_ASYNC 0x1
/* The case reads target memory after the target unregistered it: that memory must stay mapped,
 * which engine memory (freed by mc_mem_free) does not. */
#define CASE_KEEPS_MAPPED 0x2

typedef struct conf_param {
    const conf_transport_t *tr;
    const conf_case_t *cs;
    char name[128];
} conf_param_t;

#define FX_MAX_BUFS 4

typedef struct fx {
    const conf_param_t *p;
    th_cfg_t cfg; /* the initiator's */
    mc_engine_t *e;
    th_target_t t;
    mc_segment_id_t seg;
    void *buf[FX_MAX_BUFS];
    size_t len[FX_MAX_BUFS];
    unsigned n_buf;
} fx_t;

static int fx_setup(void **state)
{
    const conf_param_t *p = *state;
    th_target_opts_t o;
    fx_t *fx = calloc(1, sizeof(*fx));

    assert_non_null(fx);
    fx->p = p;
    th_config(&fx->cfg);
    p->tr->apply(&fx->cfg);
    th_set(&fx->cfg, "PROGRESS_THREAD", "%d", p->cs->progress_thread);
    th_target_opts_init(&o, &fx->cfg, p->cs->target_buf);
    o.n_bufs = p->cs->n_bufs;
    o.use_alloc = p->tr->target_alloc;
    assert_int_equal(th_target_spawn(&o, &fx->t), 0);
    fx->e = th_engine(&fx->cfg);
    fx->seg = th_open(fx->e, &fx->t, 0);
    *state = fx;
    return 0;
}

static int fx_teardown(void **state)
{
    fx_t *fx = *state;

    th_kill_all();
    for (unsigned i = 0; i < fx->n_buf && fx->e; i++) {
        mc_mem_unregister(fx->e, fx->buf[i]);
        munmap(fx->buf[i], fx->len[i]);
    }
    if (fx->e)
        mc_engine_destroy(fx->e);
    free(fx);
    return 0;
}

static uint8_t *fx_buf(fx_t *fx, size_t len)
{
    assert_true(fx->n_buf < FX_MAX_BUFS);
    fx->buf[fx->n_buf] = th_buf(fx->e, len);
    fx->len[fx->n_buf] = len;
    return fx->buf[fx->n_buf++];
}

static uint64_t tbuf(fx_t *fx, unsigned i)
{
    return fx->t.eng[0].buf[i];
}

static uint64_t target_seed(unsigned i)
{
    return 0x7a7a + i; /* th_target_opts_init's seed, engine 0 */
}

/* ---- WRITE then READ, one task per size --------------------------------------------------- */

static void test_sizes(void **state)
{
    static const size_t sizes[] = {1, 7, 4096, 65535, 65536, 65537, 1u << 20, 16u << 20, 64u << 20};
    fx_t *fx = *state;
    const size_t max = 64u << 20, lo = 3, lo2 = 11, ro = 5;
    uint8_t *src = fx_buf(fx, max + 64), *dst = fx_buf(fx, max + 64);
    uint64_t rb = tbuf(fx, 0);
    char why[512];

    for (size_t k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++) {
        size_t n = sizes[k];
        uint64_t seed = 100 + k;
        th_fill(src + lo, n, seed);
        memset(dst, 0xee, n + 64);
        int st = th_xfer(fx->e, MC_WRITE, src + lo, fx->seg, rb + ro, n, why, sizeof(why));
        if (st != MC_TASK_COMPLETED)
            print_error("WRITE %zu: state %d: %s\n", n, st, why);
        assert_int_equal(st, MC_TASK_COMPLETED);
        /* The target's memory itself, and the bytes around the range untouched. */
        assert_int_equal(th_remote_check(&fx->t, 0, rb + ro, n, seed, 0), -1);
        assert_int_equal(th_remote_check(&fx->t, 0, rb, ro, target_seed(0), 0), -1);
        assert_int_equal(th_remote_check(&fx->t, 0, rb + ro + n, 4096, target_seed(0), ro + n), -1);
        st = th_xfer(fx->e, MC_READ, dst + lo2, fx->seg, rb + ro, n, why, sizeof(why));
        if (st != MC_TASK_COMPLETED)
            print_error("READ %zu: state %d: %s\n", n, st, why);
        assert_int_equal(st, MC_TASK_COMPLETED);
        assert_int_equal(th_check(dst + lo2, n, seed), -1);
        for (size_t i = 0; i < lo2; i++)
            assert_int_equal(dst[i], 0xee);
        for (size_t i = lo2 + n; i < n + 64; i++)
            assert_int_equal(dst[i], 0xee);
    }
    /* The bytes went through the transport under test. */
    mc_counters_t c;
    assert_int_equal(mc_stats_transport(fx->e, fx->p->tr->counters, &c), 0);
    assert_true(c.bytes_written > 0 && c.bytes_read > 0);
}

/* ---- batches of small requests ------------------------------------------------------------ */

static uint64_t rnd(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* n requests of sz bytes to distinct, non-adjacent, shuffled slots of target buffer 0; a
 * shadow copy of the target buffer follows every write, then one READ of the whole buffer
 * proves each byte went to the right place and nothing else moved. */
static void run_batch(fx_t *fx, size_t n, size_t sz, int drive_by_poll)
{
    size_t tlen = fx->p->cs->target_buf, slot = 2 * sz + 64;
    uint8_t *src = fx_buf(fx, n * (sz + 16)), *shadow = malloc(tlen), *whole = fx_buf(fx, tlen);
    mc_request_t *reqs = calloc(n, sizeof(*reqs));
    size_t *perm = calloc(tlen / slot, sizeof(*perm)), nslots = tlen / slot;
    uint64_t rs = 0x1234567 + n, rb = tbuf(fx, 0);
    mc_batch_t *b;
    mc_batch_status_t bs;

    assert_true(nslots >= n);
    assert_non_null(shadow);
    th_fill(shadow, tlen, target_seed(0));
    for (size_t i = 0; i < nslots; i++)
        perm[i] = i;
    for (size_t i = nslots - 1; i > 0; i--) {
        size_t j = rnd(&rs) % (i + 1), x = perm[i];
        perm[i] = perm[j];
        perm[j] = x;
    }
    th_fill(src, n * (sz + 16), 777 + n);
    for (size_t i = 0; i < n; i++) {
        uint64_t off = perm[i] * slot + 1 + rnd(&rs) % 32; /* unaligned, never adjacent */
        reqs[i] = (mc_request_t){.opcode = MC_WRITE,
                                 .local = src + i * (sz + 16) + i % 7,
                                 .target = fx->seg,
                                 .target_offset = rb + off,
                                 .length = sz};
        memcpy(shadow + off, reqs[i].local, sz);
    }
    assert_int_equal(mc_batch_create(fx->e, n, &b), 0);
    assert_int_equal(mc_batch_submit(b, reqs, n, NULL), 0);
    if (drive_by_poll) {
        /* Caller progress: sleep in poll(2) on the event fd, then progress. */
        int fd = mc_engine_event_fd(fx->e), wakeups = 0;
        int64_t dl = th_now_ms() + 30000;
        assert_true(fd >= 0);
        do {
            struct pollfd pfd = {.fd = fd, .events = POLLIN};
            if (poll(&pfd, 1, 1000) > 0)
                wakeups++;
            mc_engine_progress(fx->e);
            assert_int_equal(mc_batch_status(b, &bs), 0);
        } while (bs.state == MC_TASK_PENDING && th_now_ms() < dl);
        assert_true(wakeups > 0);
    } else {
        assert_int_equal(mc_batch_wait(b, 30000), 0);
    }
    assert_int_equal(mc_batch_status(b, &bs), 0);
    assert_int_equal(bs.state, MC_TASK_COMPLETED);
    assert_int_equal(bs.tasks, n);
    assert_int_equal(bs.completed, n);
    assert_int_equal(bs.failed, 0);
    assert_int_equal(bs.bytes, (uint64_t)n * sz);
    for (size_t i = 0; i < n; i++) {
        mc_task_status_t ts;
        assert_int_equal(mc_task_status(b, i, &ts), 0);
        assert_int_equal(ts.state, MC_TASK_COMPLETED);
        assert_int_equal(ts.bytes, sz);
        assert_null(ts.reason);
    }
    th_batch_destroy(fx->e, b);

    /* READ each range back to a fresh place, then the whole buffer. */
    memset(src, 0, n * (sz + 16));
    for (size_t i = 0; i < n; i++)
        reqs[i].opcode = MC_READ;
    assert_int_equal(mc_batch_create(fx->e, n, &b), 0);
    assert_int_equal(mc_batch_submit(b, reqs, n, NULL), 0);
    assert_int_equal(mc_batch_wait(b, 30000), 0);
    assert_int_equal(mc_batch_status(b, &bs), 0);
    assert_int_equal(bs.completed, n);
    for (size_t i = 0; i < n; i++)
        assert_memory_equal(reqs[i].local, shadow + (reqs[i].target_offset - rb), sz);
    th_batch_destroy(fx->e, b);
    assert_int_equal(th_xfer(fx->e, MC_READ, whole, fx->seg, rb, tlen, NULL, 0), MC_TASK_COMPLETED);
    assert_memory_equal(whole, shadow, tlen);
    free(perm);
    free(reqs);
    free(shadow);
}

static void test_batch_1(void **state)
{
    run_batch(*state, 1, 4096, 0);
}

static void test_batch_100(void **state)
{
    run_batch(*state, 100, 4096, 0);
}

static void test_batch_10000(void **state)
{
    run_batch(*state, 10000, 512, 0);
}

static void test_batch_poll_fd(void **state)
{
    run_batch(*state, 100, 4096, 1);
}

/* ---- completion callbacks ----------------------------------------------------------------- */

#define CB_TASKS     200
#define CB_BAD_EVERY 20

typedef struct cb_rec {
    atomic_int calls;
    int state;
    int had_reason;
    uint64_t bytes;
} cb_rec_t;

static void on_complete(void *arg, const mc_task_status_t *st)
{
    cb_rec_t *r = arg;

    r->state = st->state;
    r->had_reason = st->reason && st->reason[0];
    r->bytes = st->bytes;
    atomic_fetch_add(&r->calls, 1);
}

static void test_callbacks(void **state)
{
    fx_t *fx = *state;
    const size_t sz = 8192;
    uint8_t *src = fx_buf(fx, CB_TASKS * sz);
    static cb_rec_t rec[CB_TASKS];
    mc_request_t reqs[CB_TASKS];
    mc_batch_t *b;

    memset(rec, 0, sizeof(rec));
    th_fill(src, CB_TASKS * sz, 4242);
    for (size_t i = 0; i < CB_TASKS; i++) {
        bool bad = i % CB_BAD_EVERY == 3;
        reqs[i] = (mc_request_t){.opcode = MC_WRITE,
                                 .local = src + i * sz,
                                 .target = fx->seg,
                                 .target_offset = bad ? tbuf(fx, 0) + fx->p->cs->target_buf
                                                      : tbuf(fx, 0) + i * sz,
                                 .length = sz,
                                 .cb = on_complete,
                                 .cb_arg = &rec[i]};
    }
    assert_int_equal(mc_batch_create(fx->e, CB_TASKS, &b), 0);
    assert_int_equal(mc_batch_submit(b, reqs, CB_TASKS, NULL), 0);
    assert_int_equal(mc_batch_wait(b, 30000), 0);
    int states[CB_TASKS];
    for (size_t i = 0; i < CB_TASKS; i++) {
        mc_task_status_t ts;
        assert_int_equal(mc_task_status(b, i, &ts), 0);
        states[i] = ts.state;
        assert_int_equal(ts.state, i % CB_BAD_EVERY == 3 ? MC_TASK_FAILED : MC_TASK_COMPLETED);
    }
    /* Once the batch is destroyable the engine let go of every task: all callbacks ran. */
    th_batch_destroy(fx->e, b);
    for (size_t i = 0; i < CB_TASKS; i++) {
        assert_int_equal(atomic_load(&rec[i].calls), 1);
        assert_int_equal(rec[i].state, states[i]);
        assert_int_equal(rec[i].had_reason, states[i] != MC_TASK_COMPLETED);
        if (states[i] == MC_TASK_COMPLETED)
            assert_int_equal(rec[i].bytes, sz);
    }
    th_sleep_ms(200); /* no late second call */
    mc_engine_progress(fx->e);
    for (size_t i = 0; i < CB_TASKS; i++)
        assert_int_equal(atomic_load(&rec[i].calls), 1);
}

/* ---- cancel ------------------------------------------------------------------------------- */

/* Every one of b's n tasks ended CANCELED, saying so, or COMPLETED with its sz bytes, and the
 * batch's counts agree. Which completed in done[] (n of them) if not NULL. The number
 * canceled. */
static size_t expect_canceled_or_done(mc_batch_t *b, size_t n, size_t sz, bool *done)
{
    size_t canceled = 0;
    mc_batch_status_t bs;

    for (size_t i = 0; i < n; i++) {
        mc_task_status_t ts;
        assert_int_equal(mc_task_status(b, i, &ts), 0);
        if (ts.state == MC_TASK_CANCELED) {
            canceled++;
            assert_true(th_contains(ts.reason, "cancel"));
        } else {
            assert_int_equal(ts.state, MC_TASK_COMPLETED);
            assert_int_equal(ts.bytes, sz);
        }
        if (done)
            done[i] = ts.state == MC_TASK_COMPLETED;
    }
    assert_int_equal(mc_batch_status(b, &bs), 0);
    assert_int_equal(bs.tasks, n);
    assert_int_equal(bs.completed, n - canceled);
    assert_int_equal(bs.failed, canceled);
    return canceled;
}

static void test_cancel(void **state)
{
    fx_t *fx = *state;
    const size_t n = 2000, sz = 64 * 1024, span = 128; /* targets wrap over 8 MiB */
    uint8_t *src = fx_buf(fx, span * sz);
    mc_request_t *reqs = calloc(n, sizeof(*reqs));
    mc_batch_t *b;
    mc_batch_status_t bs;
    char why[512];

    th_fill(src, span * sz, 99);
    for (size_t i = 0; i < n; i++)
        reqs[i] = (mc_request_t){.opcode = MC_WRITE,
                                 .local = src + (i % span) * sz,
                                 .target = fx->seg,
                                 .target_offset = tbuf(fx, 0) + (i % span) * sz,
                                 .length = sz};
    assert_int_equal(mc_batch_create(fx->e, n, &b), 0);
    assert_int_equal(mc_batch_submit(b, reqs, n, NULL), 0);
    assert_int_equal(mc_batch_cancel(b), 0);
    assert_int_equal(mc_batch_wait(b, 20000), 0);
    assert_true(expect_canceled_or_done(b, n, sz, NULL) > 0);
    assert_int_equal(mc_batch_status(b, &bs), 0);
    assert_int_equal(bs.state, MC_TASK_CANCELED);
    int rc = mc_batch_destroy(b);
    assert_true(rc == 0 || rc == -EBUSY);
    if (rc)
        th_batch_destroy(fx->e, b);
    /* The connection is still usable: a fresh transfer lands exactly. */
    th_fill(src, sz, 31337);
    assert_int_equal(th_xfer(fx->e, MC_WRITE, src, fx->seg, tbuf(fx, 0), sz, why, sizeof(why)),
                     MC_TASK_COMPLETED);
    assert_int_equal(th_remote_check(&fx->t, 0, tbuf(fx, 0), sz, 31337, 0), -1);
    free(reqs);
}

/* ---- cancel while another thread submits to the batch ------------------------------------ */

typedef struct canceler {
    mc_batch_t *b;
    atomic_bool stop;
    atomic_uint calls;
    atomic_int rc; /* the first failed cancel's (cmocka asserts on the test's thread only) */
} canceler_t;

static void *cancel_loop(void *arg)
{
    canceler_t *c = arg;

    while (!atomic_load(&c->stop)) {
        int rc = mc_batch_cancel(c->b), none = 0;
        if (rc)
            atomic_compare_exchange_strong(&c->rc, &none, rc);
        atomic_fetch_add(&c->calls, 1);
        sched_yield();
    }
    return NULL;
}

/* A thread cancels the batch over and over while this one submits READs to it, chunk after
 * chunk: tasks end while their submit still routes, moves and hands them over. Every task ends
 * COMPLETED with its bytes or CANCELED, the engine lets go of the batch, and every block a
 * completed task read holds the target's bytes. */
static void test_cancel_racing_submit(void **state)
{
    fx_t *fx = *state;
    /* chunk <= span: no two tasks of one submit read into the same block at once */
    const size_t chunk = 256, rounds = 80, n = chunk * rounds, sz = 4096, span = 256;
    uint8_t *dst = fx_buf(fx, span * sz);
    mc_request_t *reqs = calloc(chunk, sizeof(*reqs));
    bool *done = calloc(n, sizeof(*done));
    canceler_t c = {0};
    pthread_t th;

    assert_non_null(reqs);
    assert_non_null(done);
    assert_int_equal(mc_batch_create(fx->e, n, &c.b), 0);
    assert_int_equal(pthread_create(&th, NULL, cancel_loop, &c), 0);
    while (!atomic_load(&c.calls))
        sched_yield();
    for (size_t r = 0; r < rounds; r++) {
        for (size_t i = 0; i < chunk; i++) {
            size_t k = (r * chunk + i) % span;
            reqs[i] = (mc_request_t){.opcode = MC_READ,
                                     .local = dst + k * sz,
                                     .target = fx->seg,
                                     .target_offset = tbuf(fx, 0) + k * sz,
                                     .length = sz};
        }
        assert_int_equal(mc_batch_submit(c.b, reqs, chunk, NULL), 0);
    }
    atomic_store(&c.stop, true);
    assert_int_equal(pthread_join(th, NULL), 0);
    assert_int_equal(atomic_load(&c.rc), 0);
    assert_int_equal(mc_batch_wait(c.b, 20000), 0);
    size_t canceled = expect_canceled_or_done(c.b, n, sz, done);
    print_message("  %zu tasks: %zu completed, %zu canceled, %u cancels\n", n, n - canceled,
                  canceled, atomic_load(&c.calls));
    th_batch_destroy(fx->e, c.b);  /* fails the test if the engine never lets go */
    for (size_t i = 0; i < n; i++) /* block i % span was read by task i */
        if (done[i])
            assert_int_equal(th_check_at(dst + i % span * sz, sz, target_seed(0), i % span * sz),
                             -1);
    free(done);
    free(reqs);
}

/* ---- dead peer ---------------------------------------------------------------------------- */

typedef struct peer_events {
    atomic_int n[4]; /* by mc_peer_event_t */
    atomic_uint last_id;
    atomic_int last_error;
} peer_events_t;

static void on_peer_event(void *arg, mc_segment_id_t id, mc_peer_event_t ev, int error,
                          const char *reason)
{
    peer_events_t *pe = arg;

    assert_true(ev >= MC_PEER_CONNECTED && ev <= MC_PEER_DEAD);
    assert_true(ev == MC_PEER_CONNECTED || (reason && reason[0] && error < 0));
    atomic_store(&pe->last_id, id);
    atomic_store(&pe->last_error, error);
    atomic_fetch_add(&pe->n[ev], 1);
}

/* Wait (driving progress) until pe has seen event ev, or ms pass. */
static bool wait_event(mc_engine_t *e, peer_events_t *pe, mc_peer_event_t ev, int ms)
{
    int64_t dl = th_now_ms() + ms;

    while (!atomic_load(&pe->n[ev]) && th_now_ms() < dl) {
        mc_engine_progress(e);
        th_sleep_ms(1);
    }
    return atomic_load(&pe->n[ev]) > 0;
}

/* After a peer is known dead, everything to it fails at once with -MC_EPEERDEAD. */
static void expect_dead_fails(fx_t *fx, uint8_t *src)
{
    mc_request_t r = {.opcode = MC_WRITE,
                      .local = src,
                      .target = fx->seg,
                      .target_offset = tbuf(fx, 0),
                      .length = 4096};

    assert_int_equal(mc_segment_state(fx->e, fx->seg), MC_SEGMENT_DEAD);
    mc_task_status_t ts = th_xfer_req(fx->e, &r, NULL);
    assert_int_equal(ts.state, MC_TASK_FAILED);
    assert_int_equal(ts.error, -MC_EPEERDEAD);
    assert_true(th_contains(ts.reason, "dead"));
    assert_int_equal(mc_msg_send(fx->e, fx->seg, TH_MSG_ID, "x", 1), -MC_EPEERDEAD);
}

/* The target is killed while 1000 tasks move: the DEAD event comes and every task is final
 * within 2 s, each COMPLETED (before the death) or FAILED with -MC_EPEERDEAD. */
static void test_dead_peer(void **state)
{
    fx_t *fx = *state;
    const size_t n = 1000, sz = 256 * 1024, span = 32;
    uint8_t *src;
    mc_request_t *reqs = calloc(n, sizeof(*reqs));
    mc_batch_t *b;
    mc_batch_status_t bs;
    static peer_events_t pe;
    char why[512];

    /* Short timeouts: rebuild the initiator with them. */
    mc_engine_destroy(fx->e);
    th_set(&fx->cfg, "IO_TIMEOUT_MS", "1000");
    th_set(&fx->cfg, "TRANSFER_TIMEOUT", "5");
    fx->e = th_engine(&fx->cfg);
    memset(&pe, 0, sizeof(pe));
    assert_int_equal(mc_peer_handler_set(fx->e, on_peer_event, &pe), 0);
    fx->seg = th_open(fx->e, &fx->t, 0);
    src = fx_buf(fx, span * sz);
    for (size_t i = 0; i < n; i++)
        reqs[i] = (mc_request_t){.opcode = i % 2 ? MC_READ : MC_WRITE,
                                 .local = src + (i % span) * sz,
                                 .target = fx->seg,
                                 .target_offset = tbuf(fx, 0) + (i % span) * sz,
                                 .length = sz};
    assert_int_equal(mc_batch_create(fx->e, n, &b), 0);
    assert_int_equal(mc_batch_submit(b, reqs, n, NULL), 0);
    int64_t dl = th_now_ms() + 20000;
    do {
        mc_engine_progress(fx->e);
        assert_int_equal(mc_batch_status(b, &bs), 0);
    } while (bs.bytes == 0 && th_now_ms() < dl);
    assert_true(bs.bytes > 0);
    assert_int_equal(atomic_load(&pe.n[MC_PEER_CONNECTED]), 1);
    th_target_kill(&fx->t);
    int64_t t0 = th_now_ms();
    assert_int_equal(mc_batch_wait(b, 2000), 0);
    assert_true(wait_event(fx->e, &pe, MC_PEER_DEAD, 2000 - (int)(th_now_ms() - t0)));
    print_message("  DEAD event and every task final %lld ms after the kill\n",
                  (long long)(th_now_ms() - t0));
    assert_int_equal(atomic_load(&pe.last_id), fx->seg);
    assert_int_equal(atomic_load(&pe.last_error), -MC_EPEERDEAD);
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        mc_task_status_t ts;
        assert_int_equal(mc_task_status(b, i, &ts), 0);
        if (ts.state == MC_TASK_COMPLETED)
            continue;
        if (bad++ == 0)
            print_message("  first failure: %s\n", ts.reason);
        assert_int_equal(ts.state, MC_TASK_FAILED);
        assert_int_equal(ts.error, -MC_EPEERDEAD);
        assert_non_null(ts.reason);
        assert_true(ts.reason[0] != 0);
    }
    assert_true(bad > 0);
    th_batch_destroy(fx->e, b);
    /* A new request to the dead segment fails at once. */
    t0 = th_now_ms();
    expect_dead_fails(fx, src);
    assert_true(th_now_ms() - t0 <= 2000);
    (void)why;
    assert_int_equal(atomic_load(&pe.n[MC_PEER_DEAD]), 1); /* once */
    th_close(fx->e, fx->seg);
    for (unsigned i = 0; i < fx->n_buf; i++)
        assert_int_equal(mc_mem_unregister(fx->e, fx->buf[i]), 0), munmap(fx->buf[i], fx->len[i]);
    fx->n_buf = 0;
    t0 = th_now_ms();
    mc_engine_destroy(fx->e);
    fx->e = NULL;
    assert_true(th_now_ms() - t0 <= 10000);
    free(reqs);
}

/* ---- bad requests ------------------------------------------------------------------------- */

/* A range outside the target's registered buffers is refused whole: the task ends FAILED with a
 * reason that says so, and nothing of it lands. */
static void expect_refused(fx_t *fx, mc_opcode_t op, uint8_t *local, uint64_t remote, uint64_t len)
{
    char why[512];
    int st = th_xfer(fx->e, op, local, fx->seg, remote, len, why, sizeof(why));

    if (st != MC_TASK_FAILED || !th_contains(why, "registered"))
        print_error("%s 0x%llx+%llu: state %d, reason \"%s\"\n", op == MC_READ ? "READ" : "WRITE",
                    (unsigned long long)remote, (unsigned long long)len, st, why);
    assert_int_equal(st, MC_TASK_FAILED);
    assert_true(th_contains(why, "registered"));
}

static void test_bad_ranges(void **state)
{
    fx_t *fx = *state;
    const uint64_t tl = fx->p->cs->target_buf, rb = tbuf(fx, 0);
    uint8_t *src = fx_buf(fx, 1u << 20);
    const struct {
        uint64_t addr, len;
    } bad[] = {
        {rb - 4096, 4096},                  /* below */
        {rb - 2048, 4096},                  /* straddling the start */
        {rb + tl, 4096},                    /* above */
        {rb + tl - 2048, 4096},             /* straddling the end */
        {rb + tl - 1, 2},                   /* one byte too far */
        {rb + tl + (1ull << 30), 4096},     /* far above */
        {rb + tl - 128 * 1024, 512 * 1024}, /* several slices, the first ones inside */
    };

    th_fill(src, 1u << 20, 5150);
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        expect_refused(fx, MC_WRITE, src, bad[i].addr, bad[i].len);
        memset(src, 0xab, bad[i].len);
        expect_refused(fx, MC_READ, src, bad[i].addr, bad[i].len);
        th_fill(src, 1u << 20, 5150);
        /* Nothing of the registered buffer changed. */
        int64_t off = th_remote_check(&fx->t, 0, rb, tl, target_seed(0), 0);
        if (off >= 0)
            print_error("case %zu changed target memory at offset %lld\n", i, (long long)off);
        assert_int_equal(off, -1);
    }
    /* The connection survives: a good request right after still works. */
    assert_int_equal(th_xfer(fx->e, MC_WRITE, src, fx->seg, rb + tl - 4096, 4096, NULL, 0),
                     MC_TASK_COMPLETED);
    assert_int_equal(th_remote_check(&fx->t, 0, rb + tl - 4096, 4096, 5150, 0), -1);
}

static void test_bad_submit(void **state)
{
    fx_t *fx = *state;
    uint8_t *src = fx_buf(fx, 65536), unreg[4096];
    mc_batch_t *b;
    mc_batch_status_t bs;
    mc_request_t r[3];

    for (int i = 0; i < 3; i++)
        r[i] = (mc_request_t){.opcode = MC_WRITE,
                              .local = src + 4096 * i,
                              .target = fx->seg,
                              .target_offset = tbuf(fx, 0) + 4096 * i,
                              .length = 4096};
    assert_int_equal(mc_batch_create(fx->e, 8, &b), 0);
    r[1].local = unreg;
    assert_int_equal(mc_batch_submit(b, r, 3, NULL), -EINVAL);
    r[1].local = src + 65536 - 100; /* runs past the end of the registered buffer */
    assert_int_equal(mc_batch_submit(b, r, 3, NULL), -EINVAL);
    r[1].local = src + 4096;
    r[1].target_offset = UINT64_MAX - 100; /* wraps */
    assert_int_equal(mc_batch_submit(b, r, 3, NULL), -EINVAL);
    r[1].target_offset = tbuf(fx, 0) + 4096;
    r[1].target = fx->seg + 12345;
    assert_int_equal(mc_batch_submit(b, r, 3, NULL), -MC_ENOSEGMENT);
    r[1].target = fx->seg;
    assert_int_equal(mc_batch_status(b, &bs), 0);
    assert_int_equal(bs.tasks, 0);
    mc_task_status_t ts;
    assert_int_equal(mc_task_status(b, 0, &ts), -EINVAL);
    /* Nothing leaked into the target either. */
    assert_int_equal(th_remote_check(&fx->t, 0, tbuf(fx, 0), 3 * 4096, target_seed(0), 0), -1);
    /* A valid submit now gets indices 0..2. */
    th_fill(src, 3 * 4096, 8);
    assert_int_equal(mc_batch_submit(b, r, 3, NULL), 0);
    assert_int_equal(mc_batch_wait(b, 30000), 0);
    assert_int_equal(mc_batch_status(b, &bs), 0);
    assert_int_equal(bs.tasks, 3);
    assert_int_equal(bs.completed, 3);
    assert_int_equal(bs.bytes, 3 * 4096);
    assert_int_equal(th_remote_check(&fx->t, 0, tbuf(fx, 0), 3 * 4096, 8, 0), -1);
    /* A zero-length request is a no-op that completes at once, whatever its addresses. */
    r[0] = (mc_request_t){.opcode = MC_READ, .local = NULL, .target = fx->seg, .length = 0};
    assert_int_equal(mc_batch_submit(b, r, 1, NULL), 0);
    assert_int_equal(mc_task_status(b, 3, &ts), 0);
    assert_int_equal(ts.state, MC_TASK_COMPLETED);
    assert_int_equal(ts.bytes, 0);
    assert_int_equal(ts.error, 0);
    assert_int_equal(mc_batch_wait(b, 30000), 0);
    assert_int_equal(th_remote_check(&fx->t, 0, tbuf(fx, 0), 3 * 4096, 8, 0), -1);
    th_batch_destroy(fx->e, b);
}

static void test_unregistered_remote(void **state)
{
    fx_t *fx = *state;
    const uint64_t tl = fx->p->cs->target_buf;
    uint8_t *src = fx_buf(fx, 65536);
    th_cmd_t c = {.op = TH_CMD_UNREGISTER, .a0 = 1};
    th_reply_t r;

    th_fill(src, 65536, 61);
    assert_int_equal(th_xfer(fx->e, MC_WRITE, src, fx->seg, tbuf(fx, 1), 4096, NULL, 0),
                     MC_TASK_COMPLETED);
    assert_int_equal(th_target_cmd(&fx->t, &c, &r, 30000), 0);
    if (r.rc)
        print_error("unregister in target: %lld %s\n", (long long)r.rc, r.msg);
    assert_int_equal(r.rc, 0);
    th_fill(src, 65536, 62);
    expect_refused(fx, MC_WRITE, src, tbuf(fx, 1), 65536);
    expect_refused(fx, MC_WRITE, src, tbuf(fx, 1) + tl - 4096, 4096);
    expect_refused(fx, MC_READ, src, tbuf(fx, 1), 4096);
    assert_int_equal(th_remote_check(&fx->t, 0, tbuf(fx, 1), 4096, 61, 0), -1);
    assert_int_equal(
        th_remote_check(&fx->t, 0, tbuf(fx, 1) + 4096, tl - 4096, target_seed(1), 4096), -1);
    /* The other buffer still serves. */
    assert_int_equal(th_xfer(fx->e, MC_WRITE, src, fx->seg, tbuf(fx, 0), 65536, NULL, 0),
                     MC_TASK_COMPLETED);
    assert_int_equal(th_remote_check(&fx->t, 0, tbuf(fx, 0), 65536, 62, 0), -1);
}

/* An idle peer is killed: the DEAD event comes within 2 s without any work pending (the
 * owner's pidfd for shm, a refused reconnection for the others). */
static void test_dead_peer_idle(void **state)
{
    fx_t *fx = *state;
    uint8_t *src = fx_buf(fx, 65536);
    static peer_events_t pe;

    memset(&pe, 0, sizeof(pe));
    assert_int_equal(mc_peer_handler_set(fx->e, on_peer_event, &pe), 0);
    th_fill(src, 65536, 31);
    assert_int_equal(th_xfer(fx->e, MC_WRITE, src, fx->seg, tbuf(fx, 0), 65536, NULL, 0),
                     MC_TASK_COMPLETED);
    assert_int_equal(th_remote_check(&fx->t, 0, tbuf(fx, 0), 65536, 31, 0), -1);
    th_target_kill(&fx->t);
    int64_t t0 = th_now_ms();
    assert_true(wait_event(fx->e, &pe, MC_PEER_DEAD, 2000));
    print_message("  DEAD event %lld ms after the kill\n", (long long)(th_now_ms() - t0));
    expect_dead_fails(fx, src);
    th_close(fx->e, fx->seg);
}

/* ---- addresses, keys, late registrations ---------------------------------------------------- */

/* A buffer the target registers after we opened it: a request into it waits while the
 * descriptor is fetched from the target, then moves (no metadata anywhere). */
static void test_registered_later(void **state)
{
    fx_t *fx = *state;
    const size_t len = 1 << 20;
    uint8_t *src = fx_buf(fx, len), *dst = fx_buf(fx, len);
    th_cmd_t c = {.op = TH_CMD_REGISTER, .a1 = len, .a2 = 4711};
    th_reply_t r;

    assert_int_equal(th_target_cmd(&fx->t, &c, &r, 30000), 0);
    assert_int_equal(r.rc, 0);
    uint64_t nb = (uint64_t)r.v[0];
    assert_int_equal(th_xfer(fx->e, MC_READ, dst, fx->seg, nb + 4096, len - 8192, NULL, 0),
                     MC_TASK_COMPLETED);
    assert_int_equal(th_check_at(dst, len - 8192, 4711, 4096), -1);
    th_fill(src, len, 4712);
    assert_int_equal(th_xfer(fx->e, MC_WRITE, src, fx->seg, nb, len, NULL, 0), MC_TASK_COMPLETED);
    assert_int_equal(th_remote_check(&fx->t, 0, nb, len, 4712, 0), -1);

    /* One more, made known by its key this time: it goes over the transport under test at
     * once, with what the key carries (rdma: its rkeys; shm: that it may be mapped). */
    uint64_t kb = th_register_keyed(&fx->t, fx->e, fx->seg, len, 4713);
    assert_true(kb != 0);
    mc_buffer_info_t bi[8];
    size_t nbi = 0;
    bool listed = false;
    assert_int_equal(mc_segment_buffers(fx->e, fx->seg, bi, 8, &nbi), 0);
    for (size_t i = 0; i < nbi && i < 8; i++)
        listed |= bi[i].addr == kb && bi[i].length == len;
    assert_true(listed);
    mc_counters_t c0, c1;
    assert_int_equal(mc_stats_transport(fx->e, fx->p->tr->counters, &c0), 0);
    assert_int_equal(th_xfer(fx->e, MC_READ, dst, fx->seg, kb, len, NULL, 0), MC_TASK_COMPLETED);
    assert_int_equal(th_check(dst, len, 4713), -1);
    assert_int_equal(mc_stats_transport(fx->e, fx->p->tr->counters, &c1), 0);
    assert_int_equal(c1.bytes_read - c0.bytes_read, len);
    /* A range that no one buffer of it holds still fails, with the code that says so. */
    mc_request_t q = {.opcode = MC_WRITE,
                      .local = src,
                      .target = fx->seg,
                      .target_offset = nb + len / 2,
                      .length = len};
    mc_task_status_t ts = th_xfer_req(fx->e, &q, NULL);
    assert_int_equal(ts.state, MC_TASK_FAILED);
    assert_int_equal(ts.error, -MC_EACCESS);
}

/* Memory mapped without write permission (a model or checkpoint file served read-only):
 * - the target's: peers read it; a WRITE into it fails with a reason that says so, through the
 *   descriptor or a buffer key (refused before a byte moves), and through a key without the
 *   flag (an older packer's: the target refuses it, by tcp's check, the NIC's access rights or
 *   CMA's fault); nothing lands, and the target goes on serving (a tcp WRITE into it used to
 *   kill the target: SIGSEGV);
 * - ours: a READ into it is refused at submit, a WRITE from it moves. */
static void test_read_only(void **state)
{
    fx_t *fx = *state;
    const size_t len = 1 << 20;
    uint8_t *src = fx_buf(fx, len), *dst = fx_buf(fx, len);
    th_cmd_t c = {.op = TH_CMD_REGISTER, .a0 = 1, .a1 = len, .a2 = 4721};
    th_reply_t r;
    char why[512];

    assert_int_equal(th_target_cmd(&fx->t, &c, &r, 30000), 0);
    assert_int_equal(r.rc, 0);
    uint64_t rb = (uint64_t)r.v[0];
    assert_int_equal(th_xfer(fx->e, MC_READ, dst, fx->seg, rb, len, NULL, 0), MC_TASK_COMPLETED);
    assert_int_equal(th_check(dst, len, 4721), -1);
    th_fill(src, len, 4722);
    int st = th_xfer(fx->e, MC_WRITE, src, fx->seg, rb + 4096, 65536, why, sizeof(why));
    if (st != MC_TASK_FAILED || !th_contains(why, "without write permission"))
        print_error("WRITE into read-only memory: state %d, reason \"%s\"\n", st, why);
    assert_int_equal(st, MC_TASK_FAILED);
    assert_true(th_contains(why, "without write permission"));

    /* By its key, which carries the flag. */
    uint64_t kb = th_register_keyed_ro(&fx->t, fx->e, fx->seg, len, 4723, true);
    assert_true(kb != 0);
    st = th_xfer(fx->e, MC_WRITE, src, fx->seg, kb, 65536, why, sizeof(why));
    assert_int_equal(st, MC_TASK_FAILED);
    assert_true(th_contains(why, "without write permission"));
    /* By a key without the flag (an older packer's): the target refuses it itself. */
    c = (th_cmd_t){.op = TH_CMD_REGISTER, .a0 = 1, .a1 = len, .a2 = 4725};
    assert_int_equal(th_target_cmd(&fx->t, &c, &r, 30000), 0);
    assert_int_equal(r.rc, 0);
    uint64_t ob = (uint64_t)r.v[0];
    c = (th_cmd_t){.op = TH_CMD_KEY, .a0 = ob};
    assert_int_equal(th_target_cmd(&fx->t, &c, &r, 30000), 0);
    assert_int_equal(r.rc, 0);
    assert_int_equal((uint8_t)r.msg[MC_BUFFER_KEY_SIZE - 1], 1);
    r.msg[MC_BUFFER_KEY_SIZE - 1] = 0;
    assert_int_equal(mc_segment_add_buffer(fx->e, fx->seg, r.msg, MC_BUFFER_KEY_SIZE), 0);
    st = th_xfer(fx->e, MC_WRITE, src, fx->seg, ob, 65536, why, sizeof(why));
    print_message("  WRITE by a key without the flag: state %d: %s\n", st, why);
    assert_int_equal(st, MC_TASK_FAILED);
    assert_int_equal(th_remote_check(&fx->t, 0, rb, len, 4721, 0), -1);
    assert_int_equal(th_remote_check(&fx->t, 0, kb, len, 4723, 0), -1);
    assert_int_equal(th_remote_check(&fx->t, 0, ob, len, 4725, 0), -1);
    assert_int_equal(th_xfer(fx->e, MC_READ, dst, fx->seg, ob, len, NULL, 0), MC_TASK_COMPLETED);
    assert_int_equal(th_check(dst, len, 4725), -1);

    /* Ours. */
    uint8_t *ro = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    assert_true(ro != MAP_FAILED);
    th_fill(ro, len, 4724);
    assert_int_equal(mprotect(ro, len, PROT_READ), 0);
    assert_int_equal(mc_mem_register(fx->e, ro, len, "cpu:0"), 0);
    mc_batch_t *b;
    mc_request_t q = {.opcode = MC_READ,
                      .local = ro,
                      .target = fx->seg,
                      .target_offset = tbuf(fx, 0),
                      .length = 4096};
    assert_int_equal(mc_batch_create(fx->e, 1, &b), 0);
    assert_int_equal(mc_batch_submit(b, &q, 1, NULL), -EINVAL);
    assert_true(th_contains(mc_last_error(), "without write permission"));
    th_batch_destroy(fx->e, b);
    assert_int_equal(th_xfer(fx->e, MC_WRITE, ro, fx->seg, tbuf(fx, 0), len, NULL, 0),
                     MC_TASK_COMPLETED);
    assert_int_equal(th_remote_check(&fx->t, 0, tbuf(fx, 0), len, 4724, 0), -1);
    assert_int_equal(th_check(ro, len, 4724), -1);
    assert_int_equal(mc_mem_unregister(fx->e, ro), 0);
    munmap(ro, len);
}

/* A fresh engine opens the target by its compact address and adds the key of a buffer the
 * target packed (no metadata, no descriptor blob): requests into it are routed at once, even
 * while the segment is still OPENING, and move the right bytes both ways. */
static void test_address_and_key(void **state)
{
    fx_t *fx = *state;
    const size_t len = 256 * 1024;
    th_cmd_t c = {.op = TH_CMD_ADDRESS};
    th_reply_t ra, rk;
    mc_segment_id_t id, id2;
    uint8_t *src = fx_buf(fx, len), *dst = fx_buf(fx, len);
    mc_buffer_info_t bi[4];
    size_t nbi;

    assert_int_equal(th_target_cmd(&fx->t, &c, &ra, 30000), 0);
    assert_int_equal(ra.rc, 0);
    assert_true(ra.v[0] > 0 && ra.v[0] <= MC_ADDRESS_MAX);
    assert_true(ra.v[0] <= 31); /* an IPv4 address fits UCX's smallest address field */
    c = (th_cmd_t){.op = TH_CMD_KEY, .a0 = tbuf(fx, 0) + 100};
    assert_int_equal(th_target_cmd(&fx->t, &c, &rk, 30000), 0);
    assert_int_equal(rk.rc, 0);

    /* Bad input is refused and changes nothing. */
    assert_int_equal(mc_segment_open_address(fx->e, ra.msg, 3, &id), -MC_EPROTO);
    uint8_t badkey[MC_BUFFER_KEY_SIZE];
    memcpy(badkey, rk.msg, sizeof(badkey));
    badkey[0] ^= 1;
    assert_int_equal(mc_segment_add_buffer(fx->e, fx->seg, badkey, sizeof(badkey)), -MC_EPROTO);
    assert_int_equal(mc_segment_add_buffer(fx->e, fx->seg, rk.msg, 100), -MC_EPROTO);

    /* The open segment (opened by blob) and the address are the same engine: same id. */
    assert_int_equal(mc_segment_open_address(fx->e, ra.msg, (size_t)ra.v[0], &id), 0);
    assert_int_equal(id, fx->seg);
    assert_int_equal(mc_segment_close(fx->e, id), 0);

    /* A second engine that knows nothing else about the target. */
    mc_engine_t *e2 = th_engine(&fx->cfg);
    void *l2 = th_buf(e2, len);
    assert_int_equal(mc_segment_open_address(e2, ra.msg, (size_t)ra.v[0], &id), 0);
    assert_int_equal(mc_segment_open_address(e2, ra.msg, (size_t)ra.v[0], &id2), 0);
    assert_int_equal(id, id2);
    assert_int_equal(mc_segment_add_buffer(e2, id, rk.msg, MC_BUFFER_KEY_SIZE), 0);
    assert_int_equal(mc_segment_add_buffer(e2, id, rk.msg, MC_BUFFER_KEY_SIZE), 0); /* known */
    assert_int_equal(mc_segment_buffers(e2, id, bi, 4, &nbi), 0);
    assert_true(nbi >= 1);
    th_fill(l2, len, 515);
    assert_int_equal(th_xfer(e2, MC_WRITE, l2, id, tbuf(fx, 0) + 8, len, NULL, 0),
                     MC_TASK_COMPLETED);
    assert_int_equal(th_remote_check(&fx->t, 0, tbuf(fx, 0) + 8, len, 515, 0), -1);
    memset(l2, 0, len);
    assert_int_equal(th_xfer(e2, MC_READ, l2, id, tbuf(fx, 0) + 8, len, NULL, 0),
                     MC_TASK_COMPLETED);
    assert_int_equal(th_check(l2, len, 515), -1);
    int64_t dl = th_now_ms() + 5000;
    while (mc_segment_state(e2, id) == MC_SEGMENT_OPENING && th_now_ms() < dl)
        mc_engine_progress(e2), th_sleep_ms(1);
    assert_int_equal(mc_segment_state(e2, id), MC_SEGMENT_READY);
    /* The key of our own engine is not the target's. */
    uint8_t ownkey[MC_BUFFER_KEY_SIZE];
    assert_int_equal(mc_buffer_key_pack(e2, l2, ownkey), 0);
    assert_int_equal(mc_segment_add_buffer(e2, id, ownkey, sizeof(ownkey)), -MC_ENOSEGMENT);
    assert_int_equal(mc_buffer_key_pack(e2, src, ownkey), -ENOENT);
    assert_int_equal(mc_segment_close(e2, id), 0);
    assert_int_equal(mc_segment_close(e2, id), 0);
    th_buf_free(e2, l2, len);
    mc_engine_destroy(e2);
    (void)dst;
}

/* From inside a completion callback: open our own engine by address and the target by name
 * without blocking, and submit to both from there; the bytes land. */
typedef struct cb_open {
    fx_t *fx;
    mc_batch_t *b2;
    uint8_t *src, *dst;
    size_t len;
    uint8_t self_addr[MC_ADDRESS_MAX];
    size_t self_len;
    atomic_int done, rc;
} cb_open_t;

static void on_open_in_cb(void *arg, const mc_task_status_t *st)
{
    cb_open_t *co = arg;
    mc_segment_id_t self, tgt;
    int rc = st->state == MC_TASK_COMPLETED ? 0 : -EIO;

    if (!rc)
        rc = mc_segment_open_address(co->fx->e, co->self_addr, co->self_len, &self);
    if (!rc)
        rc = mc_segment_open_nb(co->fx->e, co->fx->t.eng[0].name, &tgt);
    if (!rc) {
        mc_request_t r[2] = {
            {.opcode = MC_WRITE,
             .local = co->src,
             .target = self,
             .target_offset = (uint64_t)(uintptr_t)co->dst,
             .length = co->len},
            {.opcode = MC_WRITE,
             .local = co->src,
             .target = tgt,
             .target_offset = tbuf(co->fx, 0) + co->len,
             .length = co->len},
        };
        rc = mc_batch_submit(co->b2, r, 2, NULL);
    }
    atomic_store(&co->rc, rc);
    atomic_store(&co->done, 1);
}

static void test_open_in_callback(void **state)
{
    fx_t *fx = *state;
    static cb_open_t co;
    mc_batch_t *b;
    mc_batch_status_t bs;

    memset(&co, 0, sizeof(co));
    co.fx = fx;
    co.len = 128 * 1024;
    co.src = fx_buf(fx, co.len);
    co.dst = fx_buf(fx, co.len);
    co.self_len = sizeof(co.self_addr);
    assert_int_equal(mc_engine_address(fx->e, co.self_addr, &co.self_len), 0);
    th_fill(co.src, co.len, 626);
    assert_int_equal(mc_batch_create(fx->e, 2, &co.b2), 0);
    mc_request_t r = {.opcode = MC_WRITE,
                      .local = co.src,
                      .target = fx->seg,
                      .target_offset = tbuf(fx, 0),
                      .length = co.len,
                      .cb = on_open_in_cb,
                      .cb_arg = &co};
    assert_int_equal(mc_batch_create(fx->e, 1, &b), 0);
    assert_int_equal(mc_batch_submit(b, &r, 1, NULL), 0);
    assert_int_equal(mc_batch_wait(b, 30000), 0);
    th_batch_destroy(fx->e, b);
    assert_int_equal(atomic_load(&co.done), 1);
    assert_int_equal(atomic_load(&co.rc), 0);
    assert_int_equal(mc_batch_wait(co.b2, 30000), 0);
    assert_int_equal(mc_batch_status(co.b2, &bs), 0);
    assert_int_equal(bs.completed, 2);
    th_batch_destroy(fx->e, co.b2);
    assert_int_equal(th_check(co.dst, co.len, 626), -1);
    assert_int_equal(th_remote_check(&fx->t, 0, tbuf(fx, 0), co.len, 626, 0), -1);
    assert_int_equal(th_remote_check(&fx->t, 0, tbuf(fx, 0) + co.len, co.len, 626, 0), -1);
}

/* ---- the case table ----------------------------------------------------------------------- */

static const conf_case_t cases[] = {
    {"sizes", test_sizes, (64u << 20) + 8192, 1, 1, 0},
    {"batch_1", test_batch_1, 1u << 20, 1, 1, 0},
    {"batch_100", test_batch_100, 1u << 20, 1, 1, 0},
    {"batch_10000", test_batch_10000, 12u << 20, 1, 1, 0},
    {"batch_1_caller", test_batch_1, 1u << 20, 1, 0, 0},
    {"batch_100_caller", test_batch_100, 1u << 20, 1, 0, 0},
    {"batch_10000_caller", test_batch_10000, 12u << 20, 1, 0, 0},
    {"batch_poll_event_fd", test_batch_poll_fd, 1u << 20, 1, 0, CASE_ASYNC},
    {"callbacks", test_callbacks, 2u << 20, 1, 1, 0},
    {"callbacks_caller", test_callbacks, 2u << 20, 1, 0, 0},
    {"cancel", test_cancel, 8u << 20, 1, 1, CASE_ASYNC},
    {"cancel_caller", test_cancel, 8u << 20, 1, 0, CASE_ASYNC},
    {"cancel_racing_submit", test_cancel_racing_submit, 1u << 20, 1, 1, 0},
    {"cancel_racing_submit_caller", test_cancel_racing_submit, 1u << 20, 1, 0, 0},
    {"dead_peer", test_dead_peer, 8u << 20, 1, 1, CASE_ASYNC},
    {"dead_peer_caller", test_dead_peer, 8u << 20, 1, 0, CASE_ASYNC},
    {"dead_peer_idle", test_dead_peer_idle, 1u << 20, 1, 1, 0},
    {"dead_peer_idle_caller", test_dead_peer_idle, 1u << 20, 1, 0, 0},
    {"registered_later", test_registered_later, 1u << 20, 1, 1, 0},
    {"address_and_key", test_address_and_key, 1u << 20, 1, 1, 0},
    {"open_in_callback", test_open_in_callback, 1u << 20, 1, 1, 0},
    {"open_in_callback_caller", test_open_in_callback, 1u << 20, 1, 0, 0},
    {"bad_ranges", test_bad_ranges, 1u << 20, 1, 1, 0},
    {"bad_submit", test_bad_submit, 1u << 20, 1, 1, 0},
    {"unregistered_remote", test_unregistered_remote, 1u << 20, 2, 1, CASE_KEEPS_MAPPED},
    {"read_only", test_read_only, 1u << 20, 1, 1, 0},
};

static void skip_case(void **state)
{
    (void)state;
    skip();
}

int main(int argc, char **argv)
{
    const size_t nt = sizeof(transports) / sizeof(transports[0]);
    const size_t nc = sizeof(cases) / sizeof(cases[0]);
    conf_param_t *params = calloc(nt * nc, sizeof(*params));
    struct CMUnitTest *tests = calloc(nt * nc, sizeof(*tests));
    const char *only = getenv("TH_CASE");
    const char *only_tr = getenv("TH_TRANSPORT"); /* a comma-separated list of setups */
    size_t n = 0, runnable = 0;

    th_main(argc, argv);
    for (size_t i = 0; i < nt; i++) {
        if (only_tr && !th_listed(only_tr, transports[i].name))
            continue;
        for (size_t j = 0; j < nc; j++) {
            if (only && !strstr(cases[j].name, only))
                continue;
            conf_param_t *p = &params[n];
            p->tr = &transports[i];
            p->cs = &cases[j];
            snprintf(p->name, sizeof(p->name), "%s/%s", transports[i].name, cases[j].name);
            bool na = (cases[j].flags & CASE_ASYNC && transports[i].sync_submit) ||
                      (cases[j].flags & CASE_KEEPS_MAPPED && transports[i].target_alloc);
            if ((transports[i].available && !transports[i].available()) || na) {
                tests[n++] = (struct CMUnitTest){.name = p->name, .test_func = skip_case};
                continue;
            }
            runnable++;
            tests[n++] = (struct CMUnitTest){.name = p->name,
                                             .test_func = cases[j].fn,
                                             .setup_func = fx_setup,
                                             .teardown_func = fx_teardown,
                                             .initial_state = p};
        }
    }
    if (runnable == 0)
        return 77;
    int rc = _cmocka_run_group_tests("conformance", tests, n, NULL, NULL);
    th_kill_all();
    free(tests);
    free(params);
    return rc;
}
