/* The same-host (shm) transport beyond the conformance suite: the unregister protocol with a
 * peer that has the memory mapped (and with one whose first mapping of it races the
 * revocation, or whose revocation the owner has not sent yet), an owner that dies during
 * traffic, a task from progress to a buffer not mapped yet, CMA after the owner's engine is
 * destroyed, a long CMA run shared out to helper threads (and an ORDERED one, which is not), a
 * request larger than one CMA call, and a registration table left mid-rewrite. The target is a
 * child process (harness.c) on this host, or an engine of this process. */
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>
#include <cmocka.h>

#include "harness.h"
#include "sys/memfd.h"
#include "transport/shm/shm_int.h"

#define BUF (4u << 20)

/* Gates that hold one call of this process's engines in a race's window: this program's mmap
 * and sendmsg stand in for libc's where the engine (linked in statically) and the harness call
 * them, and pass every call on, but the first one that an armed gate matches waits there until
 * the test opens it. */
enum { GATE_OFF, GATE_ARMED, GATE_HELD, GATE_OPEN };

typedef struct gate {
    atomic_int state;
    _Atomic uint64_t arg; /* what the held call must be: map_gate a length, revoke_gate none */
} gate_t;

static gate_t map_gate;    /* an mmap of a descriptor, of arg bytes */
static gate_t revoke_gate; /* a send of SHM_REVOKE */

static void gate_pass(gate_t *g, bool match)
{
    int armed = GATE_ARMED;

    if (match && atomic_compare_exchange_strong(&g->state, &armed, GATE_HELD))
        while (atomic_load(&g->state) == GATE_HELD)
            usleep(1000);
}

static void gate_arm(gate_t *g, uint64_t arg)
{
    atomic_store(&g->arg, arg);
    atomic_store(&g->state, GATE_ARMED);
}

static void gate_wait_held(gate_t *g)
{
    for (int64_t dl = th_now_ms() + 30000; atomic_load(&g->state) != GATE_HELD;) {
        assert_true(th_now_ms() < dl);
        th_sleep_ms(1);
    }
}

static void *libc_fn(const char *name)
{
    void *f = dlsym(RTLD_NEXT, name);

    if (!f)
        abort();
    return f;
}

void *mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off)
{
    static void *_Atomic real;
    void *f = atomic_load(&real);

    if (!f)
        atomic_store(&real, f = libc_fn("mmap"));
    gate_pass(&map_gate, fd >= 0 && atomic_load(&map_gate.state) == GATE_ARMED &&
                             len == atomic_load(&map_gate.arg));
    return ((void *(*)(void *, size_t, int, int, int, off_t))f)(addr, len, prot, flags, fd, off);
}

ssize_t sendmsg(int fd, const struct msghdr *mh, int flags)
{
    static void *_Atomic real;
    void *f = atomic_load(&real);

    if (!f)
        atomic_store(&real, f = libc_fn("sendmsg"));
    gate_pass(&revoke_gate, atomic_load(&revoke_gate.state) == GATE_ARMED && mh->msg_iovlen == 1 &&
                                mh->msg_iov[0].iov_len == sizeof(shm_msg_t) &&
                                ((const shm_msg_t *)mh->msg_iov[0].iov_base)->type == SHM_REVOKE);
    return ((ssize_t(*)(int, const struct msghdr *, int))f)(fd, mh, flags);
}

typedef struct fx {
    th_target_t t;
    mc_engine_t *e;
    mc_segment_id_t seg;
    uint8_t *src;
} fx_t;

/* caller: the initiator spins on progress itself, and runs none but its own. cma_threads: its
 * MC_SHM_CMA_THREADS (NULL: the default). */
static int setup_kind(void **state, int use_alloc, bool caller, const char *cma_threads)
{
    fx_t *fx = calloc(1, sizeof(*fx));
    th_cfg_t cfg;
    th_target_opts_t o;

    th_config(&cfg);
    th_set(&cfg, "FORCE_TCP", "0");
    th_target_opts_init(&o, &cfg, BUF);
    o.n_bufs = 2;
    o.use_alloc = use_alloc;
    assert_int_equal(th_target_spawn(&o, &fx->t), 0);
    if (caller) {
        th_set(&cfg, "PROGRESS_THREAD", "0");
        th_set(&cfg, "PROGRESS_IMPLICIT", "0");
    }
    if (cma_threads)
        th_set(&cfg, "SHM_CMA_THREADS", "%s", cma_threads);
    fx->e = th_engine(&cfg);
    fx->seg = th_open(fx->e, &fx->t, 0);
    fx->src = th_buf(fx->e, BUF);
    *state = fx;
    return 0;
}

static int setup(void **state)
{
    return setup_kind(state, 1, false, NULL);
}

/* Target memory that is not engine memory: same-host copies go through CMA. */
static int setup_malloc(void **state)
{
    return setup_kind(state, 0, false, NULL);
}

static int teardown(void **state)
{
    fx_t *fx = *state;

    th_kill_all();
    th_buf_free(fx->e, fx->src, BUF);
    mc_engine_destroy(fx->e);
    free(fx);
    return 0;
}

static uint64_t shm_bytes(mc_engine_t *e)
{
    mc_counters_t c;

    assert_int_equal(mc_stats_transport(e, "shm", &c), 0);
    return c.bytes_written + c.bytes_read;
}

/* The owner frees a buffer this process has mapped: mc_mem_free returns once we unmapped it
 * (promptly: we acknowledge from our progress thread), and a later write to it fails instead of
 * landing in orphaned pages. The other buffer keeps working through shm. */
static void test_unregister_mapped(void **state)
{
    fx_t *fx = *state;
    uint64_t b0 = fx->t.eng[0].buf[0], b1 = fx->t.eng[0].buf[1];
    th_cmd_t c = {.op = TH_CMD_UNREGISTER, .a0 = 1};
    th_reply_t r;
    char why[256];

    th_fill(fx->src, BUF, 71);
    assert_int_equal(th_xfer(fx->e, MC_WRITE, fx->src, fx->seg, b1, BUF, NULL, 0),
                     MC_TASK_COMPLETED);
    assert_true(shm_bytes(fx->e) >= BUF);
    assert_int_equal(th_remote_check(&fx->t, 0, b1, BUF, 71, 0), -1);

    int64_t t0 = th_now_ms();
    assert_int_equal(th_target_cmd(&fx->t, &c, &r, 30000), 0);
    assert_int_equal(r.rc, 0);
    assert_true(th_now_ms() - t0 < 1500); /* acknowledged, not timed out (2 s) */

    int st = th_xfer(fx->e, MC_WRITE, fx->src, fx->seg, b1, BUF, why, sizeof(why));
    assert_int_equal(st, MC_TASK_FAILED);
    assert_true(th_contains(why, "registered"));

    th_fill(fx->src, BUF, 72);
    uint64_t before = shm_bytes(fx->e);
    assert_int_equal(th_xfer(fx->e, MC_WRITE, fx->src, fx->seg, b0, BUF, NULL, 0),
                     MC_TASK_COMPLETED);
    assert_true(shm_bytes(fx->e) >= before + BUF);
    assert_int_equal(th_remote_check(&fx->t, 0, b0, BUF, 72, 0), -1);
}

/* The owner is killed while we keep writing: every task ends COMPLETED (before the death) or
 * FAILED, within seconds, and nothing hangs or crashes. */
static void test_owner_dies(void **state)
{
    fx_t *fx = *state;
    uint64_t b0 = fx->t.eng[0].buf[0];
    size_t completed = 0, failed = 0;
    int64_t killed_at = 0, deadline = th_now_ms() + 30000;
    char why[256];

    th_fill(fx->src, BUF, 73);
    while (th_now_ms() < deadline) {
        if (completed == 50 && !killed_at) {
            th_target_kill(&fx->t);
            killed_at = th_now_ms();
        }
        int st = th_xfer(fx->e, MC_WRITE, fx->src, fx->seg, b0, 64 * 1024, why, sizeof(why));
        if (st == MC_TASK_COMPLETED) {
            completed++;
        } else {
            assert_true(st == MC_TASK_FAILED || st == MC_TASK_TIMEOUT);
            assert_true(why[0] != 0);
            failed++;
        }
        if (killed_at && failed >= 3)
            break;
    }
    assert_true(killed_at > 0);
    assert_true(failed >= 3);
    assert_true(th_now_ms() - killed_at < 15000);
}

typedef struct writer {
    fx_t *fx;
    uint64_t addr;
    atomic_bool stop;
    atomic_llong unregistered_at; /* ms; 0 until the owner's unregister returned */
    size_t before, late_ok, late_failed;
} writer_t;

/* Write 64 KiB blocks until told to stop; count what succeeded after the unregister returned. */
static void *writer_main(void *arg)
{
    writer_t *w = arg;
    char why[256];

    while (!atomic_load(&w->stop)) {
        long long t0 = atomic_load(&w->unregistered_at);
        int st = th_xfer(w->fx->e, MC_WRITE, w->fx->src, w->fx->seg, w->addr + 65536, 64 * 1024,
                         why, sizeof(why));
        if (!t0)
            w->before += st == MC_TASK_COMPLETED;
        else if (st == MC_TASK_COMPLETED)
            w->late_ok++;
        else
            w->late_failed++;
    }
    return NULL;
}

/* CMA: the owner unregisters a buffer while another thread writes to it in a loop. Every write
 * submitted after the unregister returned fails, and the memory (which the harness keeps
 * mapped) never sees the pattern written from then on. */
static void test_cma_unregister_during_traffic(void **state)
{
    fx_t *fx = *state;
    uint64_t b1 = fx->t.eng[0].buf[1];
    th_cmd_t c = {.op = TH_CMD_UNREGISTER, .a0 = 1};
    th_reply_t r;
    writer_t w = {.fx = fx, .addr = b1};
    pthread_t tid;

    th_fill(fx->src, BUF, 81);
    assert_int_equal(th_xfer(fx->e, MC_WRITE, fx->src, fx->seg, b1, BUF, NULL, 0),
                     MC_TASK_COMPLETED);
    assert_true(shm_bytes(fx->e) >= BUF); /* CMA, not tcp */
    assert_int_equal(th_remote_check(&fx->t, 0, b1, BUF, 81, 0), -1);

    th_fill(fx->src, 64 * 1024, 82);
    assert_int_equal(pthread_create(&tid, NULL, writer_main, &w), 0);
    th_sleep_ms(200);
    assert_int_equal(th_target_cmd(&fx->t, &c, &r, 30000), 0);
    assert_int_equal(r.rc, 0);
    /* From here on the owner considers the buffer gone: nothing may land. */
    th_fill(fx->src, 64 * 1024, 83);
    atomic_store(&w.unregistered_at, th_now_ms());
    th_sleep_ms(300);
    atomic_store(&w.stop, true);
    pthread_join(tid, NULL);
    print_message("writes: %zu before, %zu failed after, %zu succeeded after\n", w.before,
                  w.late_failed, w.late_ok);
    assert_true(w.before > 0);
    assert_true(w.late_failed > 0);
    assert_int_equal(w.late_ok, 0);
    assert_int_equal(th_remote_check(&fx->t, 0, b1, 65536, 81, 0), -1);
    assert_int_equal(th_remote_check(&fx->t, 0, b1 + 65536, 65536, 82, 0), -1);
    assert_int_equal(th_remote_check(&fx->t, 0, b1 + 131072, BUF - 131072, 81, 131072), -1);
}

/* A task submitted from progress (here from another task's completion callback) to a buffer
 * not mapped yet cannot wait there for the owner to hand its memory over: it goes by CMA, still
 * through shared memory, not over tcp. The buffer is registered late and made known by its key
 * (whose shm part says it may be mapped). */
typedef struct later {
    mc_batch_t *b;
    mc_request_t req;
    atomic_int rc; /* 1 until the callback ran */
} later_t;

static void submit_from_callback(void *arg, const mc_task_status_t *ts)
{
    later_t *l = arg;

    atomic_store(&l->rc,
                 ts->state != MC_TASK_COMPLETED ? -EIO : mc_batch_submit(l->b, &l->req, 1, NULL));
}

static void test_unmapped_from_progress(void **state)
{
    fx_t *fx = *state;
    const size_t len = 1u << 20;
    mc_counters_t tcp0, tcp1;
    mc_batch_status_t st;
    mc_batch_t *first;
    uint64_t kb = th_register_keyed(&fx->t, fx->e, fx->seg, len, 4713);

    assert_true(kb != 0);

    uint8_t *dst = th_buf(fx->e, len);
    later_t l = {.req = {.opcode = MC_READ,
                         .local = dst,
                         .target = fx->seg,
                         .target_offset = kb,
                         .length = len},
                 .rc = 1};
    mc_request_t q = {.opcode = MC_WRITE,
                      .local = fx->src,
                      .target = fx->seg,
                      .target_offset = fx->t.eng[0].buf[0],
                      .length = 4096,
                      .cb = submit_from_callback,
                      .cb_arg = &l};
    assert_int_equal(mc_batch_create(fx->e, 1, &first), 0);
    assert_int_equal(mc_batch_create(fx->e, 1, &l.b), 0);
    uint64_t before = shm_bytes(fx->e);
    assert_int_equal(mc_stats_transport(fx->e, "tcp", &tcp0), 0);
    assert_int_equal(mc_batch_submit(first, &q, 1, NULL), 0);
    assert_int_equal(mc_batch_wait(first, 30000), 0);
    for (int64_t dl = th_now_ms() + 30000; atomic_load(&l.rc) == 1;) {
        assert_true(th_now_ms() < dl);
        th_sleep_ms(1);
    }
    assert_int_equal(atomic_load(&l.rc), 0);
    assert_int_equal(mc_batch_wait(l.b, 30000), 0);
    assert_int_equal(mc_batch_status(l.b, &st), 0);
    assert_int_equal(st.state, MC_TASK_COMPLETED);
    assert_int_equal(th_check(dst, len, 4713), -1);
    assert_true(shm_bytes(fx->e) >= before + 4096 + len);
    assert_int_equal(mc_stats_transport(fx->e, "tcp", &tcp1), 0);
    assert_true(tcp1.bytes_read - tcp0.bytes_read < len);
    th_batch_destroy(fx->e, first);
    th_batch_destroy(fx->e, l.b);
    th_buf_free(fx->e, dst, len);
}

static int setup_caller_malloc(void **state)
{
    return setup_kind(state, 0, true, NULL);
}

static int setup_caller(void **state)
{
    return setup_kind(state, 1, true, NULL);
}

/* Write seed's bytes to b0 of the target after a pass, check them there: the bytes shm moved. */
static uint64_t write_b0(fx_t *fx, int seed)
{
    uint64_t b0 = fx->t.eng[0].buf[0], before = shm_bytes(fx->e);

    mc_engine_progress(fx->e);
    th_fill(fx->src, BUF, seed);
    assert_int_equal(th_xfer(fx->e, MC_WRITE, fx->src, fx->seg, b0, BUF, NULL, 0),
                     MC_TASK_COMPLETED);
    assert_int_equal(th_remote_check(&fx->t, 0, b0, BUF, seed, 0), -1);
    return shm_bytes(fx->e) - before;
}

/* Our host does not drive progress while the owner unregisters a buffer we mapped: the owner
 * waits its I/O timeout for our acknowledgement, then closes our event socket. Our mappings go
 * and tcp carries the next writes; about a second later the event socket is connected again and
 * writes go through shared memory again, bytes checked each time. */
static void test_event_socket_cut(void **state)
{
    fx_t *fx = *state;
    th_cmd_t c = {.op = TH_CMD_UNREGISTER, .a0 = 1};
    th_reply_t r;
    int seed = 80;

    th_fill(fx->src, BUF, seed);
    assert_int_equal(th_xfer(fx->e, MC_WRITE, fx->src, fx->seg, fx->t.eng[0].buf[1], BUF, NULL, 0),
                     MC_TASK_COMPLETED);
    assert_true(shm_bytes(fx->e) >= BUF);
    int64_t t0 = th_now_ms();
    assert_int_equal(th_target_cmd(&fx->t, &c, &r, 30000), 0);
    assert_int_equal(r.rc, 0);
    int64_t cut = th_now_ms();
    assert_true(cut - t0 >= 1500); /* not acknowledged: the owner waited (2 s) */

    /* Before any pass of ours: the owner let go of b1, so a write to it through the mapping we
     * still have must not complete (it goes over tcp, where the owner refuses it) */
    char why[256] = "";
    th_fill(fx->src, BUF, ++seed);
    assert_int_equal(
        th_xfer(fx->e, MC_WRITE, fx->src, fx->seg, fx->t.eng[0].buf[1], BUF, why, sizeof(why)),
        MC_TASK_FAILED);
    printf("a write to the let-go buffer before a pass: %s\n", why);
    assert_int_equal(write_b0(fx, ++seed), 0); /* its pass takes the cut in: tcp */
    bool again = false;
    for (int64_t dl = th_now_ms() + 10000; !again && th_now_ms() < dl;) {
        th_sleep_ms(100);
        again = write_b0(fx, ++seed) >= BUF;
    }
    assert_true(again);
    printf("shm again %lld ms after the cut\n", (long long)(th_now_ms() - cut));
}

/* The owner destroys its engine (the process and its malloc'ed memory stay): from the moment
 * mc_engine_destroy returned, no CMA may reach that memory, even from a peer that has not heard
 * yet that the engine went (here: one that ran no progress since). */
static void test_cma_after_owner_destroy(void **state)
{
    fx_t *fx = *state;
    const size_t len = 65536;
    uint64_t b0 = fx->t.eng[0].buf[0];
    th_cmd_t c = {.op = TH_CMD_DESTROY};
    th_reply_t r;
    mc_batch_status_t st;
    mc_batch_t *b;

    th_fill(fx->src, len, 91);
    assert_int_equal(th_xfer(fx->e, MC_WRITE, fx->src, fx->seg, b0, len, NULL, 0),
                     MC_TASK_COMPLETED);
    assert_true(shm_bytes(fx->e) >= len); /* CMA */
    assert_int_equal(th_target_cmd(&fx->t, &c, &r, 30000), 0);
    assert_int_equal(r.rc, 0);

    memset(fx->src, 0, len);
    uint64_t before = shm_bytes(fx->e);
    mc_request_t q = {
        .opcode = MC_READ, .local = fx->src, .target = fx->seg, .target_offset = b0, .length = len};
    assert_int_equal(mc_batch_create(fx->e, 1, &b), 0);
    assert_int_equal(mc_batch_submit(b, &q, 1, NULL), 0);
    assert_true(shm_bytes(fx->e) == before); /* CMA refused at submit */
    mc_batch_wait(b, 20000);
    assert_int_equal(mc_batch_status(b, &st), 0);
    assert_int_equal(st.state, MC_TASK_FAILED);
    assert_int_not_equal(th_check(fx->src, len, 91), -1); /* nothing of the owner's read */
    th_batch_destroy(fx->e, b);
}

/* Mappings of length len of the owner's engine memory in this process. */
static int owner_maps(size_t len)
{
    FILE *f = fopen("/proc/self/maps", "r");
    char line[512];
    unsigned long lo, hi;
    int n = 0;

    assert_non_null(f);
    while (fgets(line, sizeof(line), f))
        if (strstr(line, "/memfd:mooncake") && sscanf(line, "%lx-%lx", &lo, &hi) == 2 &&
            hi - lo == len)
            n++;
    fclose(f);
    return n;
}

/* The owner stops (SIGSTOP) as our first transfer to it asks for its registration table and
 * a mapping: both requests time out (the transfer goes over tcp, once the owner runs again),
 * and their late answers are not taken for the answers of the next request: a buffer the owner
 * registers then is mapped here (a mapping of its size appears), its bytes right. */
static void test_late_answers(void **state)
{
    fx_t *fx = *state;
    const size_t len = 65536, len2 = 3u << 20;
    uint64_t b1 = fx->t.eng[0].buf[1];
    mc_request_t q = {
        .opcode = MC_READ, .local = fx->src, .target = fx->seg, .target_offset = b1, .length = len};
    mc_batch_status_t st;
    mc_batch_t *b;

    th_remote_fill(&fx->t, 0, b1, len, 95, 0);
    th_stop(fx->t.pid);
    assert_int_equal(mc_batch_create(fx->e, 1, &b), 0);
    assert_int_equal(mc_batch_submit(b, &q, 1, NULL), 0); /* waits for the answers, in vain */
    assert_int_equal(kill(fx->t.pid, SIGCONT), 0);
    assert_int_equal(mc_batch_wait(b, 30000), 0);
    assert_int_equal(mc_batch_status(b, &st), 0);
    assert_int_equal(st.state, MC_TASK_COMPLETED);
    assert_int_equal(th_check(fx->src, len, 95), -1);
    th_batch_destroy(fx->e, b);

    uint64_t b2 = th_register_keyed(&fx->t, fx->e, fx->seg, len2, 96);
    assert_true(b2 != 0);
    int before = owner_maps(len2);
    memset(fx->src, 0, len2);
    assert_int_equal(th_xfer(fx->e, MC_READ, fx->src, fx->seg, b2, len2, NULL, 0),
                     MC_TASK_COMPLETED);
    assert_int_equal(th_check(fx->src, len2, 96), -1);
    assert_int_equal(owner_maps(len2), before + 1);
}

/* Target memory that is not engine memory, and two CMA helper threads. */
static int setup_shared(void **state)
{
    return setup_kind(state, 0, false, "2");
}

/* MemAvailable, in bytes (0 when unknown). */
static size_t mem_available(void)
{
    FILE *f = fopen("/proc/meminfo", "r");
    char line[128];
    size_t kib = 0;

    while (f && fgets(line, sizeof(line), f))
        if (sscanf(line, "MemAvailable: %zu kB", &kib) == 1)
            break;
    if (f)
        fclose(f);
    return kib << 10;
}

static int threads_now(void)
{
    int n = 0;
    DIR *d = opendir("/proc/self/task");

    assert_non_null(d);
    for (struct dirent *de; (de = readdir(d));)
        n += de->d_name[0] != '.';
    closedir(d);
    return n;
}

/* Submit n requests as one batch and wait: each task's state in states. */
static void run_batch(mc_engine_t *e, const mc_request_t *q, size_t n, int *states)
{
    mc_task_status_t ts;
    mc_batch_t *b;

    assert_int_equal(mc_batch_create(e, n, &b), 0);
    assert_int_equal(mc_batch_submit(b, q, n, NULL), 0);
    assert_int_equal(mc_batch_wait(b, 30000), 0);
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(mc_task_status(b, i, &ts), 0);
        states[i] = ts.state;
    }
    th_batch_destroy(e, b);
}

/* A long run of CMA requests is shared out: the first one starts the helper threads
 * (MC_SHM_CMA_THREADS), which move pieces of it next to the submitting thread. Every block lands
 * where its request says, byte for byte, both ways. Requests of a run that the owner's table no
 * longer covers (a buffer it unregistered, still in our copy of its descriptor), at the edges
 * of pieces and inside them, fail alone and the rest still moves. */
static void test_cma_shared_run(void **state)
{
    enum { BLK = 4096, N = BUF / BLK, BAD = N / 2 + 3 };
    fx_t *fx = *state;
    uint64_t b0 = fx->t.eng[0].buf[0];
    uint8_t *back = th_buf(fx->e, BUF), *whole = th_buf(fx->e, BUF);
    mc_request_t *q = calloc(N, sizeof(*q));
    unsigned *perm = malloc(N * sizeof(*perm));
    int *states = malloc(N * sizeof(*states));

    for (unsigned i = 0; i < N; i++)
        perm[i] = i;
    srand(7);
    for (unsigned i = N - 1; i > 0; i--) {
        unsigned j = (unsigned)rand() % (i + 1), t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    th_fill(fx->src, BUF, 95);
    assert_int_equal(th_xfer(fx->e, MC_WRITE, fx->src, fx->seg, b0, BLK, NULL, 0),
                     MC_TASK_COMPLETED); /* connected: what starts threads later is the run */
    int threads = threads_now();
    uint64_t before = shm_bytes(fx->e);

    for (unsigned i = 0; i < N; i++)
        q[i] = (mc_request_t){.opcode = MC_WRITE,
                              .local = fx->src + (size_t)i * BLK,
                              .target = fx->seg,
                              .target_offset = b0 + (uint64_t)perm[i] * BLK,
                              .length = BLK};
    run_batch(fx->e, q, N, states);
    for (unsigned i = 0; i < N; i++)
        assert_int_equal(states[i], MC_TASK_COMPLETED);
    assert_int_equal(threads_now(), threads + 2);
    assert_int_equal(shm_bytes(fx->e) - before, BUF); /* CMA, not tcp */
    /* In one request: remote block perm[i] holds source block i. */
    assert_int_equal(th_xfer(fx->e, MC_READ, whole, fx->seg, b0, BUF, NULL, 0), MC_TASK_COMPLETED);
    for (unsigned i = 0; i < N; i++)
        assert_memory_equal(whole + (size_t)perm[i] * BLK, fx->src + (size_t)i * BLK, BLK);
    /* Back, scattered the same way. */
    for (unsigned i = 0; i < N; i++) {
        q[i].opcode = MC_READ;
        q[i].local = back + (size_t)i * BLK;
    }
    run_batch(fx->e, q, N, states);
    for (unsigned i = 0; i < N; i++)
        assert_int_equal(states[i], MC_TASK_COMPLETED);
    assert_memory_equal(back, fx->src, BUF);
    /* Requests of the run to a buffer the owner then unregistered. */
    static const unsigned gone[] = {0, 1, 255, 256, 257, 511, 700, N - 1};
    th_cmd_t c = {.op = TH_CMD_UNREGISTER, .a0 = 1};
    th_reply_t r;
    assert_int_equal(th_target_cmd(&fx->t, &c, &r, 30000), 0);
    assert_int_equal(r.rc, 0);
    memset(back, 0, BUF);
    for (unsigned g = 0; g < sizeof(gone) / sizeof(gone[0]); g++)
        q[gone[g]].target_offset = fx->t.eng[0].buf[1] + (uint64_t)gone[g] * BLK;
    run_batch(fx->e, q, N, states);
    for (unsigned i = 0, g = 0; i < N; i++) {
        bool bad = g < sizeof(gone) / sizeof(gone[0]) && gone[g] == i;
        assert_int_equal(states[i], bad ? MC_TASK_FAILED : MC_TASK_COMPLETED);
        for (unsigned k = 0; bad && k < BLK; k++) /* nothing read into a failed one's block */
            assert_int_equal(back[(size_t)i * BLK + k], 0);
        if (!bad)
            assert_memory_equal(back + (size_t)i * BLK, fx->src + (size_t)i * BLK, BLK);
        g += bad;
    }
    free(states);
    free(perm);
    free(q);
    th_buf_free(fx->e, whole, BUF);
    th_buf_free(fx->e, back, BUF);
}

/* MC_SUBMIT_ORDERED writes of one submit take effect in order even as a long CMA run (it is
 * not shared out): of 1024 writes to one block, the last one's bytes are there. */
static void test_cma_ordered_run(void **state)
{
    enum { BLK = 4096, N = BUF / BLK };
    fx_t *fx = *state;
    uint64_t b0 = fx->t.eng[0].buf[0];
    mc_request_t *q = calloc(N, sizeof(*q));
    int *states = malloc(N * sizeof(*states));
    uint8_t *got = th_buf(fx->e, BLK);
    mc_submit_opts_t o = {.size = sizeof(o), .flags = MC_SUBMIT_ORDERED};
    int threads = threads_now();
    mc_batch_t *b;

    for (unsigned round = 0; round < 10; round++) {
        th_fill(fx->src, BUF, 200 + round);
        for (unsigned i = 0; i < N; i++)
            q[i] = (mc_request_t){.opcode = MC_WRITE,
                                  .local = fx->src + (size_t)i * BLK,
                                  .target = fx->seg,
                                  .target_offset = b0,
                                  .length = BLK};
        assert_int_equal(mc_batch_create(fx->e, N, &b), 0);
        assert_int_equal(mc_batch_submit_ex(b, q, N, &o), 0);
        assert_int_equal(mc_batch_wait(b, 30000), 0);
        th_batch_destroy(fx->e, b);
        assert_int_equal(th_xfer(fx->e, MC_READ, got, fx->seg, b0, BLK, NULL, 0),
                         MC_TASK_COMPLETED);
        assert_memory_equal(got, fx->src + (size_t)(N - 1) * BLK, BLK);
    }
    assert_int_equal(threads_now(), threads); /* never shared out: no helper started */
    free(states);
    free(q);
    th_buf_free(fx->e, got, BLK);
}

/* One request larger than a CMA call may be (the kernel moves 2 GiB - 4 KiB at most; the engine
 * asks 1 GiB per call) is split over calls (the same code for READs), byte for byte. */
static void test_cma_over_one_call(void **state)
{
    const size_t len = (1ull << 30) + (4u << 20);
    th_cfg_t cfg;
    th_target_opts_t o;
    th_target_t t;

    (void)state;
    if (mem_available() < 3 * len) { /* both sides hold it */
        print_message("skipped: less than %zu MiB of memory available\n", 3 * len >> 20);
        skip();
    }
    th_config(&cfg);
    th_set(&cfg, "FORCE_TCP", "0");
    th_target_opts_init(&o, &cfg, len);
    o.n_bufs = 1;
    o.use_alloc = 0;
    assert_int_equal(th_target_spawn(&o, &t), 0);
    mc_engine_t *e = th_engine(&cfg);
    mc_segment_id_t seg = th_open(e, &t, 0);
    uint8_t *src = th_buf(e, len);
    uint64_t before = shm_bytes(e);

    th_fill(src, len, 301);
    assert_int_equal(th_xfer(e, MC_WRITE, src, seg, t.eng[0].buf[0], len, NULL, 0),
                     MC_TASK_COMPLETED);
    assert_int_equal(th_remote_check(&t, 0, t.eng[0].buf[0], len, 301, 0), -1);
    assert_int_equal(shm_bytes(e) - before, len); /* CMA, not tcp */
    th_kill_all();
    th_buf_free(e, src, len);
    mc_engine_destroy(e);
}

typedef struct xfer {
    fx_t *fx;
    uint64_t addr, len;
    int state;
} xfer_t;

static void *xfer_main(void *arg)
{
    xfer_t *x = arg;

    x->state = th_xfer(x->fx->e, MC_WRITE, x->fx->src, x->fx->seg, x->addr, x->len, NULL, 0);
    return NULL;
}

/* The owner frees a buffer while our first write to it has its answer to the mapping request
 * (the gate holds our mmap of it): the owner's REVOKE finds nothing mapped here, and its free
 * returns. The mapping that comes in then is not kept: the write fails (the buffer went before
 * its bytes moved), and a buffer the owner allocates next (at the same address, as a rule) gets
 * the bytes written to it, not the orphaned pages of the old one. */
static void test_map_racing_unregister(void **state)
{
    fx_t *fx = *state;
    uint64_t b0 = fx->t.eng[0].buf[0], b1 = fx->t.eng[0].buf[1];
    th_cmd_t c = {.op = TH_CMD_UNREGISTER, .a0 = 1};
    xfer_t x = {.fx = fx, .addr = b1, .len = 65536};
    th_reply_t r;
    pthread_t tid;

    th_fill(fx->src, BUF, 74);
    assert_int_equal(th_xfer(fx->e, MC_WRITE, fx->src, fx->seg, b0, 4096, NULL, 0),
                     MC_TASK_COMPLETED); /* connected, b0 mapped */
    gate_arm(&map_gate, BUF);
    assert_int_equal(pthread_create(&tid, NULL, xfer_main, &x), 0);
    gate_wait_held(&map_gate);
    assert_int_equal(th_target_cmd(&fx->t, &c, &r, 30000), 0);
    assert_int_equal(r.rc, 0);
    atomic_store(&map_gate.state, GATE_OPEN);
    pthread_join(tid, NULL);
    assert_int_equal(x.state, MC_TASK_FAILED);

    uint64_t nb = th_register_keyed(&fx->t, fx->e, fx->seg, BUF, 75);
    assert_true(nb != 0);
    print_message("the new buffer is %s the old one\n", nb == b1 ? "where" : "not where");
    th_fill(fx->src, BUF, 76);
    assert_int_equal(th_xfer(fx->e, MC_WRITE, fx->src, fx->seg, nb, BUF, NULL, 0),
                     MC_TASK_COMPLETED);
    assert_int_equal(th_remote_check(&fx->t, 0, nb, BUF, 76, 0), -1);
}

typedef struct freer {
    mc_engine_t *e;
    void *p;
    size_t len;
    atomic_bool done;
    int maps; /* mappings of the buffer in this process as mc_mem_free returned */
} freer_t;

static void *free_main(void *arg)
{
    freer_t *f = arg;

    mc_mem_free(f->e, f->p);
    f->maps = owner_maps(f->len);
    atomic_store(&f->done, true);
    return NULL;
}

/* Owner and peer engines of this process; the peer has written into the owner's allocation of
 * REVOKE_LEN bytes, which it maps; the owner frees it from a thread (free_main) while the gate
 * holds the owner's REVOKE. */
#define REVOKE_LEN (3u << 20) /* no other mapping of engine memory here has that size */

typedef struct revoke_fx {
    mc_engine_t *owner, *peer;
    mc_segment_id_t seg;
    uint8_t *src;
    freer_t f;
    pthread_t tid;
} revoke_fx_t;

static void revoke_start(revoke_fx_t *x, const char *io_timeout_ms)
{
    th_cfg_t cfg;

    th_config(&cfg);
    th_set(&cfg, "FORCE_TCP", "0");
    if (io_timeout_ms)
        th_set(&cfg, "IO_TIMEOUT_MS", "%s", io_timeout_ms);
    x->owner = th_engine(&cfg);
    x->peer = th_engine(&cfg);
    x->f = (freer_t){.e = x->owner, .len = REVOKE_LEN};
    assert_int_equal(mc_mem_alloc(x->owner, REVOKE_LEN, "cpu:0", &x->f.p), 0);
    x->src = th_buf(x->peer, REVOKE_LEN);
    assert_int_equal(mc_segment_open(x->peer, mc_engine_segment_name(x->owner), &x->seg), 0);
    th_fill(x->src, REVOKE_LEN, 78);
    assert_int_equal(th_xfer(x->peer, MC_WRITE, x->src, x->seg, (uint64_t)(uintptr_t)x->f.p,
                             REVOKE_LEN, NULL, 0),
                     MC_TASK_COMPLETED);
    assert_int_equal(th_check(x->f.p, REVOKE_LEN, 78), -1);
    assert_int_equal(owner_maps(REVOKE_LEN), 2); /* the owner's, and the peer's */
    gate_arm(&revoke_gate, 0);
    assert_int_equal(pthread_create(&x->tid, NULL, free_main, &x->f), 0);
    gate_wait_held(&revoke_gate);
}

/* The gate opens, the freeing thread ends, the engines go. */
static void revoke_end(revoke_fx_t *x)
{
    atomic_store(&revoke_gate.state, GATE_OPEN);
    pthread_join(x->tid, NULL);
    th_close(x->peer, x->seg);
    th_buf_free(x->peer, x->src, REVOKE_LEN);
    mc_engine_destroy(x->peer);
    mc_engine_destroy(x->owner);
}

/* While the owner's progress sends its REVOKE (the gate holds the send), mc_mem_free does not
 * return: when it does, no mapping of the buffer is left, neither the owner's nor the peer's. */
static void test_free_waits_for_revoke(void **state)
{
    revoke_fx_t x;

    (void)state;
    revoke_start(&x, NULL);
    /* It would return within its next look (10 ms); give it plenty. */
    for (int64_t dl = th_now_ms() + 500; !atomic_load(&x.f.done) && th_now_ms() < dl;)
        th_sleep_ms(1);
    revoke_end(&x);
    assert_int_equal(x.f.maps, 0);
}

/* The same, but the owner's progress stays stuck in that send past MC_IO_TIMEOUT_MS + 1 s (a
 * callback that blocks, say): mc_mem_free gives up, and keeps the buffer mapped, so that its
 * address is not handed out again while the peer may still map it (before, it unmapped it, and
 * the next allocation there took the peer's WRITEs through its old mapping). */
static void test_free_revoke_stuck(void **state)
{
    revoke_fx_t x;

    (void)state;
    revoke_start(&x, "200");
    for (int64_t dl = th_now_ms() + 10000; !atomic_load(&x.f.done) && th_now_ms() < dl;)
        th_sleep_ms(5);
    assert_true(atomic_load(&x.f.done)); /* it gave up (after 1.2 s), the send still held */
    assert_int_equal(x.f.maps, 2);       /* the owner's mapping kept, the peer's not revoked */
    revoke_end(&x);
}

typedef struct submitter {
    mc_batch_t *b;
    mc_request_t r;
    int rc;
    atomic_bool done;
} submitter_t;

static void *submit_main(void *arg)
{
    submitter_t *s = arg;

    s->rc = mc_batch_submit(s->b, &s->r, 1, NULL);
    atomic_store(&s->done, true);
    return NULL;
}

/* The owner accepts nothing (a caller-progress host away) and its accept queue is full: a
 * host thread's first submit to it, which connects to it, gives up on shm after
 * MC_IO_TIMEOUT_MS instead of waiting in connect(2) for ever; the task goes over tcp once the
 * owner progresses again. */
static void test_connect_queue_full(void **state)
{
    th_cfg_t oc, pc;
    mc_segment_id_t seg;
    pthread_t tid;
    int fds[1024], n = 0;
    submitter_t s = {.r = {.opcode = MC_WRITE, .length = 4096}};

    (void)state;
    th_config(&oc);
    th_set(&oc, "PROGRESS_THREAD", "0");
    th_config(&pc);
    th_set(&pc, "IO_TIMEOUT_MS", "300");
    mc_engine_t *owner = th_engine(&oc), *peer = th_engine(&pc);
    uint8_t *dst = th_buf(owner, 4096), *src = th_buf(peer, 4096);
    uint8_t addr[64];
    size_t alen = sizeof(addr);
    assert_int_equal(mc_engine_address(owner, addr, &alen), 0);
    assert_int_equal(mc_segment_open_address(peer, addr, alen, &seg), 0);
    for (int64_t dl = th_now_ms() + 10000;
         mc_segment_state(peer, seg) != MC_SEGMENT_READY && th_now_ms() < dl;)
        mc_engine_progress(owner);
    assert_int_equal(mc_segment_state(peer, seg), MC_SEGMENT_READY);
    struct sockaddr_un sun = {.sun_family = AF_UNIX};
    size_t nl = strlen(shm_of(owner)->name);
    memcpy(sun.sun_path + 1, shm_of(owner)->name, nl);
    for (; n < 1024; n++) { /* until the owner's queue is full */
        fds[n] = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (connect(fds[n], (struct sockaddr *)&sun,
                    (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + nl)) < 0) {
            close(fds[n]);
            break;
        }
    }
    assert_true(n > 0 && n < 1024);
    th_fill(src, 4096, 81);
    assert_int_equal(mc_batch_create(peer, 1, &s.b), 0);
    s.r.local = src;
    s.r.target = seg;
    s.r.target_offset = (uint64_t)(uintptr_t)dst;
    assert_int_equal(pthread_create(&tid, NULL, submit_main, &s), 0);
    for (int64_t dl = th_now_ms() + 10000; !atomic_load(&s.done) && th_now_ms() < dl;)
        th_sleep_ms(5);
    bool returned = atomic_load(&s.done);
    for (int i = 0; i < n; i++) /* (so that a submit still blocked gets in, and the test ends) */
        close(fds[i]);
    for (int64_t dl = th_now_ms() + 2000; !atomic_load(&s.done) && th_now_ms() < dl;)
        mc_engine_progress(owner);
    pthread_join(tid, NULL);
    assert_true(returned);
    assert_int_equal(s.rc, 0);
    mc_batch_status_t st = {0};
    for (int64_t dl = th_now_ms() + 20000; th_now_ms() < dl;) {
        mc_engine_progress(owner);
        assert_int_equal(mc_batch_status(s.b, &st), 0);
        if (st.state != MC_TASK_PENDING)
            break;
    }
    assert_int_equal(st.state, MC_TASK_COMPLETED);
    assert_int_equal(th_check(dst, 4096, 81), -1);
    th_batch_destroy(peer, s.b);
    th_close(peer, seg);
    th_buf_free(peer, src, 4096);
    th_buf_free(owner, dst, 4096);
    mc_engine_destroy(peer);
    mc_engine_destroy(owner);
}

/* What same-host peers are handed is a memfd sealed against changes of size, and a memfd
 * received is mapped only if it is so and as long as asked: a sender that shrank its ring
 * under the receiver's mapping made the receiver's next look a SIGBUS. */
static void test_memfd_seals(void **state)
{
    int fd = mc__memfd_fixed("test", 8192), plain = memfd_create("test", MFD_CLOEXEC);

    (void)state;
    assert_true(fd >= 0 && plain >= 0);
    assert_true(mc__memfd_holds(fd, 8192));
    assert_false(mc__memfd_holds(fd, 8193));
    assert_int_equal(ftruncate(fd, 0), -1); /* sealed */
    assert_int_equal(errno, EPERM);
    assert_int_equal(ftruncate(plain, 8192), 0);
    assert_false(mc__memfd_holds(plain, 8192)); /* it could shrink */
    close(fd);
    close(plain);
}

typedef struct cover {
    mc_regtab_t *t;
    atomic_int got; /* -1 until covers returned */
} cover_t;

static void *cover_main(void *arg)
{
    cover_t *c = arg;

    atomic_store(&c->got, mc__shm_regtab_covers(c->t, 0x10000, 4096));
    return NULL;
}

/* An owner killed while it rewrote its registration table leaves it so for good: a peer's
 * look at it gives up (the range is not covered, the task goes over another transport)
 * instead of spinning with a CMA lane taken. */
static void test_regtab_left_mid_rewrite(void **state)
{
    mc_regtab_t *t = calloc(1, sizeof(*t));
    cover_t c = {.t = t, .got = -1};
    pthread_t tid;

    (void)state;
    assert_non_null(t);
    atomic_store(&t->ent[0].addr, 0x10000);
    atomic_store(&t->ent[0].len, 4096);
    atomic_store(&t->n, 1);
    assert_true(mc__shm_regtab_covers(t, 0x10000, 4096));
    assert_false(mc__shm_regtab_covers(t, 0x10000, 4097));

    atomic_store(&t->seq, 1);
    assert_int_equal(pthread_create(&tid, NULL, cover_main, &c), 0);
    for (int64_t dl = th_now_ms() + 10000; atomic_load(&c.got) < 0;) {
        assert_true(th_now_ms() < dl); /* (without the bound, the thread spins on forever) */
        th_sleep_ms(1);
    }
    pthread_join(tid, NULL);
    assert_int_equal(atomic_load(&c.got), 0);
    free(t);
}

int main(int argc, char **argv)
{
    th_main(argc, argv);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_unregister_mapped, setup, teardown),
        cmocka_unit_test_setup_teardown(test_owner_dies, setup, teardown),
        cmocka_unit_test_setup_teardown(test_cma_unregister_during_traffic, setup_malloc, teardown),
        cmocka_unit_test_setup_teardown(test_owner_dies, setup_malloc, teardown),
        cmocka_unit_test_setup_teardown(test_unmapped_from_progress, setup, teardown),
        cmocka_unit_test_setup_teardown(test_late_answers, setup, teardown),
        cmocka_unit_test_setup_teardown(test_cma_after_owner_destroy, setup_caller_malloc,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_cma_shared_run, setup_shared, teardown),
        cmocka_unit_test_setup_teardown(test_cma_ordered_run, setup_shared, teardown),
        cmocka_unit_test(test_cma_over_one_call),
        cmocka_unit_test_setup_teardown(test_map_racing_unregister, setup, teardown),
        cmocka_unit_test(test_free_waits_for_revoke),
        cmocka_unit_test(test_free_revoke_stuck),
        cmocka_unit_test(test_connect_queue_full),
        cmocka_unit_test(test_memfd_seals),
        cmocka_unit_test(test_regtab_left_mid_rewrite),
        cmocka_unit_test_setup_teardown(test_event_socket_cut, setup_caller, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
