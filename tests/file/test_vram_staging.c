/*
 * The VRAM staging pipeline end to end, without a device: two engines of this process (tcp or
 * shm between them, their progress threads running) with host memory that the test marks as
 * VRAM of GPU 0 once registered, and a test runtime in place of CUDA's that does each "device"
 * copy with memcpy when the copier polls it done (never at submit: a chunk used before its copy
 * was reported done would show). Everything else is the engine's own: routing a VRAM task to the
 * file transport, the plans for every pair of ends, our bounce chunks, the owner's STAGE and
 * COMMIT of its "VRAM", child tasks over tcp or shm, and a copy that fails failing its own
 * task with the runtime's reason while the others of its batch complete. What it cannot show is
 * the CUDA runtime itself: test_vram does, on a GPU.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <sys/mman.h>
#include <unistd.h>
#include <cmocka.h>

#include "../engine/harness.h"
#include "buffer.h"
#include "transport/file/file_int.h"

#define MIB  (1024u * 1024u)
#define SIZE (16u * MIB)

/* ---- the test runtime ---- */

typedef struct tev {
    unsigned polls;
    void *dst;
    const void *src;
    size_t len;
} tev_t;

static atomic_int copies;
static atomic_bool stall; /* copies are not done while set */
static uint8_t *poison;   /* copies touching [poison, poison + MIB) fail */

static int t_stream_create(int dev, void **s_p, char *why, size_t size)
{
    (void)dev, (void)why, (void)size;
    *s_p = (void *)1;
    return 0;
}

static void t_stream_destroy(int dev, void *s)
{
    (void)dev, (void)s;
}

static int t_event_create(int dev, void **ev_p, char *why, size_t size)
{
    (void)dev, (void)why, (void)size;
    *ev_p = calloc(1, sizeof(tev_t));
    return *ev_p ? 0 : -ENOMEM;
}

static void t_event_destroy(int dev, void *ev)
{
    (void)dev;
    free(ev);
}

static int t_copy(int dev, void *s, void *evp, void *dst, const void *src, size_t len, char *why,
                  size_t size)
{
    tev_t *ev = evp;

    (void)dev, (void)s, (void)why, (void)size;
    *ev = (tev_t){.dst = dst, .src = src, .len = len};
    atomic_fetch_add(&copies, 1);
    return 0;
}

static bool poisoned(const void *p, size_t len)
{
    const uint8_t *b = p;
    return poison && b < poison + MIB && b + len > poison;
}

/* Done at the second look: the loop polls. The bytes move then. */
static int t_done(tev_t *ev, char *why, size_t size)
{
    if (poisoned(ev->dst, ev->len) || poisoned(ev->src, ev->len)) {
        snprintf(why, size, "copy: an illegal memory access was encountered (test)");
        return -EIO;
    }
    memcpy(ev->dst, ev->src, ev->len);
    return 0;
}

static int t_query(int dev, void *evp, char *why, size_t size)
{
    tev_t *ev = evp;

    (void)dev;
    return ev->polls++ && !atomic_load(&stall) ? t_done(ev, why, size) : -EAGAIN;
}

static int t_wait(int dev, void *evp, char *why, size_t size)
{
    (void)dev;
    return t_done(evp, why, size);
}

/* CUDA IPC in one process: each fake VRAM buffer sits ALLOC_PAD bytes into an "allocation"
 * (so offsets are not 0); a handle is the allocation's address, and opening it gives that
 * address back (or fails, or says the allocation is shorter than the buffer needs, when the
 * test says so). */
#define MAX_FAKE  8
#define ALLOC_PAD 4096u
static struct {
    uint8_t *base[MAX_FAKE];
    size_t n;
    atomic_int opens, closes;
    bool refuse, short_len;
} ipc;

static int t_ipc_export(int dev, uint64_t addr, uint64_t len, uint8_t handle[FILE_IPC_HANDLE],
                        uint64_t *off_p, char *why, size_t size)
{
    (void)dev;
    for (size_t i = 0; i < ipc.n; i++) {
        uint64_t alloc = (uint64_t)(uintptr_t)ipc.base[i] - ALLOC_PAD;
        if (addr >= alloc && addr + len <= alloc + ALLOC_PAD + SIZE) {
            memset(handle, 0, FILE_IPC_HANDLE);
            memcpy(handle, &alloc, sizeof(alloc));
            *off_p = addr - alloc;
            return 0;
        }
    }
    snprintf(why, size, "not an allocation of the test");
    return -EINVAL;
}

static int t_ipc_open(int dev, const uint8_t handle[FILE_IPC_HANDLE], void **base_p,
                      uint64_t *len_p, char *why, size_t size)
{
    (void)dev;
    atomic_fetch_add(&ipc.opens, 1);
    if (ipc.refuse) {
        snprintf(why, size, "cudaIpcOpenMemHandle: invalid resource handle (test)");
        return -EIO;
    }
    memcpy(base_p, handle, sizeof(*base_p));
    *len_p = ipc.short_len ? SIZE / 2 : ALLOC_PAD + SIZE;
    return 0;
}

static void t_ipc_close(int dev, void *base)
{
    (void)dev, (void)base;
    atomic_fetch_add(&ipc.closes, 1);
}

static const file_copy_ops_t test_ops = {
    .stream_create = t_stream_create,
    .stream_destroy = t_stream_destroy,
    .event_create = t_event_create,
    .event_destroy = t_event_destroy,
    .copy = t_copy,
    .query = t_query,
    .wait = t_wait,
};

static file_copy_ops_t test_ops_ipc; /* test_ops with IPC (setup_ipc) */

static const file_copy_ops_t *ops_now = &test_ops;

/* ---- fixture ---- */

/* e stages VRAM as an engine whose VRAM registered: its chunks, the copier on our runtime. */
static void fake_gpu(mc_engine_t *e)
{
    assert_int_equal(mc__file_setup(e, false), 0);
    file_of(e)->copy.ops = ops_now;
}

/* Host memory of e, registered, then taken for VRAM of GPU 0 (before any peer sees it). */
static uint8_t *fake_vram(mc_engine_t *e)
{
    uint8_t *p = th_buf(e, SIZE);
    mc_buffer_t *b = mc__mem_get(e, (uint64_t)(uintptr_t)p, 1);

    assert_non_null(b);
    b->vram = true;
    snprintf(b->location, sizeof(b->location), "cuda:0");
    assert_true(ipc.n < MAX_FAKE);
    ipc.base[ipc.n++] = p;
    mc__file_vram_register(e, b); /* its IPC handle, as a registration of VRAM makes */
    mc__mem_put(e, b);
    return p;
}

static uint64_t ptr(const void *p)
{
    return (uint64_t)(uintptr_t)p;
}

typedef struct fx {
    const char *carrier; /* the transport the host bytes take between a and b */
    mc_engine_t *a, *b;  /* a moves; b owns the far ends */
    mc_segment_id_t seg, self;
    uint8_t *vram, *vram2, *mem; /* a's */
    uint8_t *bvram, *bmem;       /* b's */
} fx_t;

static int setup(void **state, const char *force_tcp)
{
    fx_t *fx = calloc(1, sizeof(*fx));
    th_cfg_t cfg;

    th_config(&cfg);
    th_set(&cfg, "FORCE_TCP", "%s", force_tcp);
    fx->carrier = strcmp(force_tcp, "1") ? "shm" : "tcp";
    fx->a = th_engine(&cfg);
    fx->b = th_engine(&cfg);
    fake_gpu(fx->a);
    fake_gpu(fx->b);
    fx->vram = fake_vram(fx->a);
    fx->vram2 = fake_vram(fx->a);
    fx->mem = th_buf(fx->a, SIZE);
    fx->bvram = fake_vram(fx->b);
    fx->bmem = th_buf(fx->b, SIZE);
    th_fill(fx->bvram, SIZE, 71);
    th_fill(fx->bmem, SIZE, 72);
    assert_int_equal(mc_segment_open(fx->a, mc_engine_segment_name(fx->b), &fx->seg), 0);
    assert_int_equal(mc_segment_open(fx->a, mc_engine_segment_name(fx->a), &fx->self), 0);
    /* a transfer of memory first, from this thread: shm is up before the first staged piece
     * (pieces alone, from progress, would go over tcp until it is) */
    mc_request_t warm = {.opcode = MC_READ,
                         .local = fx->mem,
                         .target = fx->seg,
                         .target_offset = ptr(fx->bmem),
                         .length = 4096};
    assert_int_equal(th_xfer_req(fx->a, &warm, NULL).state, MC_TASK_COMPLETED);
    atomic_store(&copies, 0);
    poison = NULL;
    *state = fx;
    return 0;
}

static int setup_tcp(void **state)
{
    ops_now = &test_ops;
    return setup(state, "1");
}

/* The runtime has CUDA IPC: a peer's VRAM on this host is opened here. */
static int setup_ipc(void **state)
{
    memset(&ipc, 0, sizeof(ipc));
    test_ops_ipc = test_ops;
    test_ops_ipc.ipc_export = t_ipc_export;
    test_ops_ipc.ipc_open = t_ipc_open;
    test_ops_ipc.ipc_close = t_ipc_close;
    ops_now = &test_ops_ipc;
    return setup(state, "0");
}

static int setup_shm(void **state)
{
    ops_now = &test_ops;
    return setup(state, "0");
}

static int teardown(void **state)
{
    fx_t *fx = *state;

    poison = NULL;
    ipc.n = 0;
    if (fx->seg != MC_SEGMENT_INVALID)
        th_close(fx->a, fx->seg);
    th_close(fx->a, fx->self);
    mc_engine_destroy(fx->a);
    mc_engine_destroy(fx->b);
    uint8_t *bufs[] = {fx->vram, fx->vram2, fx->mem, fx->bvram, fx->bmem};
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++)
        munmap(bufs[i], SIZE); /* (th_buf's: registrations went with their engines) */
    free(fx);
    return 0;
}

static void xfer_ok(mc_engine_t *e, mc_opcode_t op, void *local, mc_segment_id_t seg,
                    uint64_t remote, uint64_t len)
{
    mc_request_t r = {
        .opcode = op, .local = local, .target = seg, .target_offset = remote, .length = len};
    mc_task_status_t st = th_xfer_req(e, &r, NULL);

    if (st.state != MC_TASK_COMPLETED)
        print_error("%s of %llu bytes: %s\n", op == MC_READ ? "READ" : "WRITE",
                    (unsigned long long)len, st.reason);
    assert_int_equal(st.state, MC_TASK_COMPLETED);
    assert_int_equal(st.bytes, len);
}

static uint64_t file_bytes(mc_engine_t *e, bool served)
{
    mc_counters_t c;

    assert_int_equal(mc_stats_transport(e, "file", &c), 0);
    return served ? c.bytes_served : c.bytes_read + c.bytes_written;
}

/* ---- tests ---- */

/* Our VRAM to and from the peer's host memory, unaligned: through our chunks, one copy each. */
static void test_vram_to_host(void **state)
{
    fx_t *fx = *state;

    xfer_ok(fx->a, MC_READ, fx->vram + 17, fx->seg, ptr(fx->bmem) + 1001, 5 * MIB + 3);
    assert_int_equal(th_check_at(fx->vram + 17, 5 * MIB + 3, 72, 1001), -1);
    th_fill(fx->vram, SIZE, 31);
    xfer_ok(fx->a, MC_WRITE, fx->vram + 4 * MIB, fx->seg, ptr(fx->bmem) + 4 * MIB, 3 * MIB + 5);
    assert_int_equal(th_check_at(fx->bmem + 4 * MIB, 3 * MIB + 5, 31, 4 * MIB), -1);
    assert_int_equal(th_check_at(fx->bmem + 8 * MIB, 8 * MIB, 72, 8 * MIB), -1);
    assert_true(atomic_load(&copies) >= 9);       /* a 1 MiB piece each */
    assert_int_equal(file_bytes(fx->b, true), 0); /* the peer staged nothing */
}

/* Our host memory to and from the peer's VRAM: its owner stages it (STAGE, COMMIT). */
static void test_host_to_vram(void **state)
{
    fx_t *fx = *state;

    xfer_ok(fx->a, MC_READ, fx->mem + 7, fx->seg, ptr(fx->bvram) + 1001, 6 * MIB);
    assert_int_equal(th_check_at(fx->mem + 7, 6 * MIB, 71, 1001), -1);
    th_fill(fx->mem, SIZE, 32);
    xfer_ok(fx->a, MC_WRITE, fx->mem + 2 * MIB, fx->seg, ptr(fx->bvram) + 2 * MIB, 3 * MIB + 7);
    assert_int_equal(th_check_at(fx->bvram + 2 * MIB, 3 * MIB + 7, 32, 2 * MIB), -1);
    assert_int_equal(th_check_at(fx->bvram + 6 * MIB, 10 * MIB, 71, 6 * MIB), -1);
    assert_true(file_bytes(fx->b, true) >= 9 * MIB);
}

static uint64_t moved(mc_engine_t *e, const char *tp)
{
    mc_counters_t c;

    assert_int_equal(mc_stats_transport(e, tp, &c), 0);
    return c.bytes_read + c.bytes_written;
}

/* VRAM to VRAM: staged at both ends, the host bytes between the chunks over the carrier. */
static void test_vram_to_vram(void **state)
{
    fx_t *fx = *state;
    uint64_t before = moved(fx->a, fx->carrier);

    xfer_ok(fx->a, MC_READ, fx->vram, fx->seg, ptr(fx->bvram), SIZE);
    assert_int_equal(th_check(fx->vram, SIZE, 71), -1);
    th_fill(fx->vram, SIZE, 33);
    xfer_ok(fx->a, MC_WRITE, fx->vram + 3, fx->seg, ptr(fx->bvram) + 3, 8 * MIB - 5);
    assert_int_equal(th_check_at(fx->bvram + 3, 8 * MIB - 5, 33, 3), -1);
    assert_int_equal(th_check_at(fx->bvram + 8 * MIB, 8 * MIB, 71, 8 * MIB), -1);
    assert_true(moved(fx->a, fx->carrier) - before >= SIZE + 8 * MIB - 5);
}

/* Our own segment: VRAM and host memory, and VRAM to VRAM through a chunk. */
static void test_self(void **state)
{
    fx_t *fx = *state;

    th_fill(fx->mem, SIZE, 34);
    xfer_ok(fx->a, MC_WRITE, fx->mem + 1, fx->self, ptr(fx->vram) + 1, 5 * MIB);
    assert_int_equal(th_check_at(fx->vram + 1, 5 * MIB, 34, 1), -1);
    xfer_ok(fx->a, MC_READ, fx->vram2, fx->self, ptr(fx->vram), 6 * MIB);
    assert_int_equal(th_check_at(fx->vram2 + 1, 5 * MIB, 34, 1), -1);
    memset(fx->mem, 0, SIZE);
    xfer_ok(fx->a, MC_READ, fx->mem + 1, fx->self, ptr(fx->vram2) + 1, 5 * MIB);
    assert_int_equal(th_check_at(fx->mem + 1, 5 * MIB, 34, 1), -1);
}

/* One copy fails (a poisoned MiB of our VRAM): its task fails with the runtime's reason, and
 * the other tasks of the batch, to either end, complete with their bytes right. */
static void test_copy_fails(void **state)
{
    fx_t *fx = *state;
#define REQ(op, l, r)                                                                              \
    {.opcode = op, .local = l, .target = fx->seg, .target_offset = r, .length = MIB}
    mc_request_t r[4] = {
        REQ(MC_WRITE, fx->vram + 2 * MIB, ptr(fx->bmem)),
        REQ(MC_WRITE, fx->vram + 5 * MIB, ptr(fx->bmem) + MIB),
        REQ(MC_READ, fx->vram + 8 * MIB, ptr(fx->bvram) + 2 * MIB),
        REQ(MC_WRITE, fx->mem, ptr(fx->bvram) + 4 * MIB),
    };
#undef REQ
    mc_task_status_t ts;
    mc_batch_t *b;

    th_fill(fx->vram, SIZE, 35);
    th_fill(fx->mem, SIZE, 36);
    poison = fx->vram + 5 * MIB;
    assert_int_equal(mc_batch_create(fx->a, 4, &b), 0);
    assert_int_equal(mc_batch_submit(b, r, 4, NULL), 0);
    assert_int_equal(mc_batch_wait(b, 30000), 0);
    for (size_t i = 0; i < 4; i++) {
        assert_int_equal(mc_task_status(b, i, &ts), 0);
        if (i == 1) {
            assert_int_equal(ts.state, MC_TASK_FAILED);
            assert_non_null(strstr(ts.reason, "cuda:0: copy of"));
            assert_non_null(strstr(ts.reason, "illegal memory access"));
        } else {
            if (ts.state != MC_TASK_COMPLETED)
                print_error("task %zu: %s\n", i, ts.reason);
            assert_int_equal(ts.state, MC_TASK_COMPLETED);
        }
    }
    th_batch_destroy(fx->a, b);
    poison = NULL;
    assert_int_equal(th_check_at(fx->bmem, MIB, 35, 2 * MIB), -1);
    assert_int_equal(th_check_at(fx->vram + 8 * MIB, MIB, 71, 2 * MIB), -1);
    assert_int_equal(th_check(fx->bvram + 4 * MIB, MIB, 36), -1);
}

/* A same-host peer's VRAM opened here (CUDA IPC): one copy each way, from our host memory and
 * our VRAM, nothing staged by the owner, the buffer opened once for all of them and closed when
 * the segment is. */
static void test_ipc(void **state)
{
    fx_t *fx = *state;

    th_fill(fx->mem, SIZE, 37);
    xfer_ok(fx->a, MC_WRITE, fx->mem + 5, fx->seg, ptr(fx->bvram) + 5, 6 * MIB);
    assert_int_equal(th_check_at(fx->bvram + 5, 6 * MIB, 37, 5), -1);
    xfer_ok(fx->a, MC_READ, fx->vram + 9, fx->seg, ptr(fx->bvram) + 8 * MIB + 9, 4 * MIB);
    assert_int_equal(th_check_at(fx->vram + 9, 4 * MIB, 71, 8 * MIB + 9), -1);
    th_fill(fx->vram, SIZE, 38);
    xfer_ok(fx->a, MC_WRITE, fx->vram, fx->seg, ptr(fx->bvram) + 12 * MIB, 4 * MIB);
    assert_int_equal(th_check_at(fx->bvram + 12 * MIB, 4 * MIB, 38, 0), -1);
    assert_int_equal(file_bytes(fx->b, true), 0);
    assert_int_equal(atomic_load(&ipc.opens), 1);
    assert_int_equal(atomic_load(&ipc.closes), 0);
    th_close(fx->a, fx->seg);
    fx->seg = MC_SEGMENT_INVALID;
    assert_int_equal(atomic_load(&ipc.closes), 1);
}

/* The peer's VRAM cannot be opened here: its slices are staged by the owner instead, and the
 * opening is not tried again. */
static void test_ipc_refused(void **state)
{
    fx_t *fx = *state;

    ipc.refuse = true;
    xfer_ok(fx->a, MC_READ, fx->mem, fx->seg, ptr(fx->bvram), 4 * MIB);
    assert_int_equal(th_check(fx->mem, 4 * MIB, 71), -1);
    th_fill(fx->mem, SIZE, 39);
    xfer_ok(fx->a, MC_WRITE, fx->mem, fx->seg, ptr(fx->bvram), 2 * MIB);
    assert_int_equal(th_check(fx->bvram, 2 * MIB, 39), -1);
    assert_true(file_bytes(fx->b, true) >= 6 * MIB);
    assert_int_equal(atomic_load(&ipc.opens), 1);
}

/* The allocation a handle opens is shorter than the peer's buffer says (a wrong or hostile
 * descriptor): the mapping is let go of at once and the slices staged, nothing copied past it. */
static void test_ipc_does_not_fit(void **state)
{
    fx_t *fx = *state;

    ipc.short_len = true;
    xfer_ok(fx->a, MC_READ, fx->mem, fx->seg, ptr(fx->bvram), 4 * MIB);
    assert_int_equal(th_check(fx->mem, 4 * MIB, 71), -1);
    assert_true(file_bytes(fx->b, true) >= 4 * MIB);
    assert_int_equal(atomic_load(&ipc.opens), 1);
    assert_int_equal(atomic_load(&ipc.closes), 1);
}

/* The owner unregisters VRAM we opened: the mapping is closed before its unregister returns,
 * not opened again, and what we send there afterwards fails instead of landing. */
static void test_ipc_revoke(void **state)
{
    fx_t *fx = *state;
    int rc;

    th_fill(fx->mem, SIZE, 40);
    xfer_ok(fx->a, MC_WRITE, fx->mem, fx->seg, ptr(fx->bvram), 4 * MIB);
    assert_int_equal(atomic_load(&ipc.opens), 1);
    assert_int_equal(atomic_load(&ipc.closes), 0);
    assert_int_equal(mc_mem_unregister(fx->b, fx->bvram), 0);
    assert_int_equal(atomic_load(&ipc.closes), 1);
    th_fill(fx->mem, SIZE, 41);
    rc = th_xfer(fx->a, MC_WRITE, fx->mem, fx->seg, ptr(fx->bvram), 4 * MIB, NULL, 0);
    assert_true(rc < 0 || rc == MC_TASK_FAILED); /* refused at submit, or failed */
    assert_int_equal(th_check(fx->bvram, 4 * MIB, 40), -1);
    assert_int_equal(th_check_at(fx->bvram + 4 * MIB, 12 * MIB, 71, 4 * MIB), -1);
    assert_int_equal(atomic_load(&ipc.opens), 1);
}

typedef struct unreg {
    mc_engine_t *e;
    void *addr;
    int rc;
    atomic_bool done;
} unreg_t;

static void *unregister_thread(void *arg)
{
    unreg_t *u = arg;

    u->rc = mc_mem_unregister(u->e, u->addr);
    atomic_store(&u->done, true);
    return NULL;
}

/* The owner unregisters VRAM while our copy into it runs: its unregister waits for the copy
 * (the acknowledgement does), returns soon after it ended (not by timing out: the owner would
 * have disconnected us, and shm with us), and the bytes are there when it returns. */
static void test_ipc_revoke_waits(void **state)
{
    fx_t *fx = *state;
    mc_request_t r = {.opcode = MC_WRITE,
                      .local = fx->mem,
                      .target = fx->seg,
                      .target_offset = ptr(fx->bvram) + MIB,
                      .length = 2 * MIB};
    unreg_t u = {.e = fx->b, .addr = fx->bvram};
    mc_task_status_t st;
    pthread_t th;
    mc_batch_t *b;

    th_fill(fx->mem, SIZE, 42);
    atomic_store(&stall, true);
    assert_int_equal(mc_batch_create(fx->a, 1, &b), 0);
    assert_int_equal(mc_batch_submit(b, &r, 1, NULL), 0);
    for (int i = 0; i < 5000 && atomic_load(&copies) < 2; i++)
        usleep(1000);
    assert_int_equal(atomic_load(&copies), 2); /* a copy per MiB, both stalled */
    assert_int_equal(pthread_create(&th, NULL, unregister_thread, &u), 0);
    usleep(300 * 1000);
    bool early = atomic_load(&u.done);
    int closes = atomic_load(&ipc.closes);
    int64_t released = th_now_ms();
    atomic_store(&stall, false);
    assert_false(early);
    assert_int_equal(closes, 0);
    for (int i = 0; i < 5000 && !atomic_load(&u.done); i++)
        usleep(1000);
    int64_t took = th_now_ms() - released;
    assert_int_equal(pthread_join(th, NULL), 0);
    assert_int_equal(u.rc, 0);
    if (took > 900) /* MC_IO_TIMEOUT_MS is 2 s */
        fail_msg("unregister returned %lld ms after the copy could end", (long long)took);
    assert_int_equal(atomic_load(&ipc.closes), 1);
    assert_int_equal(th_check_at(fx->bvram + MIB, 2 * MIB, 42, 0), -1);
    assert_int_equal(mc_batch_wait(b, 30000), 0);
    assert_int_equal(mc_task_status(b, 0, &st), 0);
    assert_int_equal(st.state, MC_TASK_COMPLETED);
    th_batch_destroy(fx->a, b);
    assert_int_equal(file_bytes(fx->b, true), 0);
    uint64_t before = moved(fx->a, "shm"); /* still connected */
    xfer_ok(fx->a, MC_READ, fx->mem, fx->seg, ptr(fx->bmem), MIB);
    assert_true(moved(fx->a, "shm") - before >= MIB);
}

/* VRAM the owner unregistered before we first used it: the owner does not grant it, so it is
 * never opened here, whatever our copy of its descriptor still says. */
static void test_ipc_not_granted(void **state)
{
    fx_t *fx = *state;
    int rc;

    assert_int_equal(mc_mem_unregister(fx->b, fx->bvram), 0);
    th_fill(fx->mem, SIZE, 43);
    rc = th_xfer(fx->a, MC_WRITE, fx->mem, fx->seg, ptr(fx->bvram), 4 * MIB, NULL, 0);
    assert_true(rc < 0 || rc == MC_TASK_FAILED); /* refused at submit, or failed */
    assert_int_equal(th_check(fx->bvram, 4 * MIB, 71), -1);
    assert_int_equal(atomic_load(&ipc.opens), 0);
}

/* ---- a file registered after VRAM, while another thread drives progress ---- */

static atomic_bool spinning;

static void *spin(void *arg)
{
    while (atomic_load(&spinning))
        mc_engine_progress(arg);
    return NULL;
}

/* VRAM's chunks come first (progress runs the file transport's reap from then on), then a
 * host thread registers a file, which starts the I/O backend: progress must not look at the
 * ring before it is whole (it took completions of a ring still zeroed: a crash in 3 runs of 3
 * of 20 engines each, before io.up). */
static void test_file_after_vram(void **state)
{
    char dir[256], path[300];

    (void)state;
    th_tmpdir(dir, sizeof(dir));
    snprintf(path, sizeof(path), "%s/f", dir);
    for (int i = 0; i < 20; i++) {
        th_cfg_t cfg;
        th_config(&cfg);
        th_set(&cfg, "PROGRESS_THREAD", "0");
        th_set(&cfg, "FILE_BOUNCE_SIZE", "8388608");
        mc_engine_t *e = th_engine(&cfg);
        pthread_t t;
        uint64_t addr;
        mc_file_opts_t o = {.size = sizeof(o), .length = MIB, .flags = MC_FILE_CREATE};
        assert_int_equal(mc__file_setup(e, false), 0); /* as VRAM's first registration */
        atomic_store(&spinning, true);
        assert_int_equal(pthread_create(&t, NULL, spin, e), 0);
        int rc = mc_file_register(e, path, &o, &addr);
        atomic_store(&spinning, false);
        assert_int_equal(pthread_join(t, NULL), 0);
        assert_int_equal(rc, 0);
        assert_int_equal(mc_file_unregister(e, addr), 0);
        mc_engine_destroy(e);
    }
    th_rmdir(dir);
}

int main(int argc, char **argv)
{
    th_main(argc, argv);
    const struct CMUnitTest tcp[] = {
        cmocka_unit_test_setup_teardown(test_vram_to_host, setup_tcp, teardown),
        cmocka_unit_test_setup_teardown(test_host_to_vram, setup_tcp, teardown),
        cmocka_unit_test_setup_teardown(test_vram_to_vram, setup_tcp, teardown),
        cmocka_unit_test_setup_teardown(test_self, setup_tcp, teardown),
        cmocka_unit_test_setup_teardown(test_copy_fails, setup_tcp, teardown),
    };
    const struct CMUnitTest shm[] = {
        cmocka_unit_test_setup_teardown(test_host_to_vram, setup_shm, teardown),
        cmocka_unit_test_setup_teardown(test_vram_to_vram, setup_shm, teardown),
        cmocka_unit_test_setup_teardown(test_copy_fails, setup_shm, teardown),
    };
    int rc = cmocka_run_group_tests_name("VRAM staged, host bytes over tcp", tcp, NULL, NULL);
    rc |= cmocka_run_group_tests_name("VRAM staged, host bytes over shm", shm, NULL, NULL);
    const struct CMUnitTest ipcs[] = {
        cmocka_unit_test_setup_teardown(test_ipc, setup_ipc, teardown),
        cmocka_unit_test_setup_teardown(test_ipc_refused, setup_ipc, teardown),
        cmocka_unit_test_setup_teardown(test_ipc_does_not_fit, setup_ipc, teardown),
        cmocka_unit_test_setup_teardown(test_ipc_revoke, setup_ipc, teardown),
        cmocka_unit_test_setup_teardown(test_ipc_revoke_waits, setup_ipc, teardown),
        cmocka_unit_test_setup_teardown(test_ipc_not_granted, setup_ipc, teardown),
    };
    rc |= cmocka_run_group_tests_name("VRAM of a same-host peer opened here (CUDA IPC)", ipcs, NULL,
                                      NULL);
    const struct CMUnitTest files[] = {cmocka_unit_test(test_file_after_vram)};
    rc |= cmocka_run_group_tests_name("a file after VRAM", files, NULL, NULL);
    return rc;
}
