/*
 * VRAM through the staging pipeline: a peer process's VRAM and host memory, and our own, read
 * and written from our VRAM and host memory, whatever the ends (VRAM to host, host to VRAM,
 * VRAM to VRAM, our own segment), every byte checked on the device; the owner's file transport
 * stages its VRAM (bytes_served); a peer killed with copies in flight fails every task, none
 * hangs; after the owner unregisters its VRAM, a WRITE there fails. VT_TRANSPORT picks what carries
 * the host bytes: tcp (default), shm, or rdma on the software device (which cannot reach a GPU:
 * staging, as for a NIC without GPUDirect). With shm (MC_PROTOCOL auto) the peer's VRAM is opened
 * here with CUDA IPC instead of staged.
 *
 * Needs a CUDA device: exits 77 without one (CI; the lent GPU machine runs it).
 */
#include <errno.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cmocka.h>

#include "../engine/harness.h"

#if MC_HAVE_CUDA
#include <cuda_runtime_api.h>

#define MIB     (1024u * 1024u)
#define SIZE    (16u * MIB)
#define SEED_OV 9100 /* the owner's VRAM */
#define SEED_OM 9200 /* the owner's host memory */

enum { VC_CHECK_VRAM = 1, VC_CHECK_MEM, VC_FILL_VRAM, VC_SERVED, VC_UNREGISTER, VC_EXIT };

typedef struct vt_hello {
    int32_t rc;
    char err[300];
    uint64_t vram, mem;
    uint32_t blob_len;
} vt_hello_t;

typedef struct vt_cmd {
    uint32_t op;
    uint64_t addr, len, seed, off;
} vt_cmd_t;

static uint64_t ptr(const void *p)
{
    return (uint64_t)(uintptr_t)p;
}

/* th_fill_at for VRAM: [vram, +len) := seed's pattern from stream offset off. */
static void vfill(uint8_t *vram, uint64_t len, uint64_t seed, uint64_t off)
{
    uint8_t *h = malloc(len);

    th_fill_at(h, len, seed, off);
    assert_int_equal(cudaMemcpy(vram, h, len, cudaMemcpyHostToDevice), cudaSuccess);
    free(h);
}

/* th_check_at for VRAM: -1 if [vram, +len) holds seed's pattern from stream offset off, else
 * the first bad offset (-2: the copy out failed). */
static int64_t vcheck(const uint8_t *vram, uint64_t len, uint64_t seed, uint64_t off)
{
    uint8_t *h = malloc(len);
    int64_t bad = -2;

    if (cudaMemcpy(h, vram, len, cudaMemcpyDeviceToHost) == cudaSuccess)
        bad = th_check_at(h, len, seed, off);
    free(h);
    return bad;
}

/* ---- the owner: a child process with VRAM and host memory ---- */

static void owner_main(int fd)
{
    th_cfg_t cfg;
    vt_hello_t h = {0};
    mc_engine_t *e = NULL;
    mc_config_t *conf = NULL;
    uint8_t *vram = NULL, *mem = NULL, *blob = NULL;
    size_t blen = 0;
    int rc;

    if (th_io_full(fd, &cfg, sizeof(cfg), 0, 30000))
        _exit(2);
    th_set(&cfg, "PROGRESS_THREAD", "1");
    rc = mc_config_create(&conf);
    for (unsigned i = 0; !rc && i < cfg.n; i++)
        rc = mc_config_set(conf, cfg.v[i].name, cfg.v[i].value);
    if (!rc)
        rc = mc_engine_create(conf, &e);
    mc_config_destroy(conf);
    if (!rc && cudaMalloc((void **)&vram, SIZE) != cudaSuccess)
        rc = -ENOMEM;
    if (!rc) {
        vfill(vram, SIZE, SEED_OV, 0);
        rc = mc_mem_register(e, vram, SIZE, "*");
    }
    if (!rc && posix_memalign((void **)&mem, 4096, SIZE))
        rc = -ENOMEM;
    if (!rc) {
        th_fill(mem, SIZE, SEED_OM);
        rc = mc_mem_register(e, mem, SIZE, "cpu:0");
    }
    if (!rc) {
        mc_segment_export(e, NULL, &blen);
        blob = malloc(blen);
        rc = mc_segment_export(e, blob, &blen);
    }
    h.rc = rc;
    if (rc)
        snprintf(h.err, sizeof(h.err), "%s", mc_last_error());
    h.vram = ptr(vram);
    h.mem = ptr(mem);
    h.blob_len = (uint32_t)blen;
    if (th_io_full(fd, &h, sizeof(h), 1, 30000) || rc || th_io_full(fd, blob, blen, 1, 30000))
        _exit(3);
    for (;;) {
        vt_cmd_t c;
        int64_t r = 0;
        mc_counters_t cnt;
        if (th_io_full(fd, &c, sizeof(c), 0, INT32_MAX))
            _exit(0);
        uint8_t *at = (uint8_t *)(uintptr_t)c.addr;
        switch (c.op) {
        case VC_CHECK_VRAM:
            r = vcheck(at, c.len, c.seed, c.off);
            break;
        case VC_CHECK_MEM:
            r = th_check_at(at, c.len, c.seed, c.off);
            break;
        case VC_FILL_VRAM:
            vfill(at, c.len, c.seed, c.off);
            break;
        case VC_SERVED:
            r = mc_stats_transport(e, "file", &cnt) ? -1 : (int64_t)cnt.bytes_served;
            break;
        case VC_UNREGISTER: /* (the memory stays allocated: its bytes are checked after) */
            r = mc_mem_unregister(e, at);
            break;
        case VC_EXIT:
            mc_engine_destroy(e);
            th_io_full(fd, &r, sizeof(r), 1, 5000);
            _exit(0);
        }
        if (th_io_full(fd, &r, sizeof(r), 1, 30000))
            _exit(4);
    }
}

typedef struct owner {
    pid_t pid;
    int sock;
    uint64_t vram, mem;
    uint8_t *blob;
    uint32_t blob_len;
} owner_t;

static void owner_spawn(owner_t *ow, const th_cfg_t *cfg)
{
    vt_hello_t h;

    ow->pid = th_spawn_self("--vram-owner", &ow->sock);
    assert_int_equal(th_io_full(ow->sock, (void *)cfg, sizeof(*cfg), 1, 30000), 0);
    assert_int_equal(th_io_full(ow->sock, &h, sizeof(h), 0, 60000), 0);
    if (h.rc)
        print_error("owner: %s\n", h.err);
    assert_int_equal(h.rc, 0);
    ow->vram = h.vram;
    ow->mem = h.mem;
    ow->blob_len = h.blob_len;
    ow->blob = malloc(h.blob_len);
    assert_int_equal(th_io_full(ow->sock, ow->blob, h.blob_len, 0, 30000), 0);
}

/* A command about [addr, addr+len) of the owner (the pattern's stream offset: addr - base). */
static int64_t owner_cmd(owner_t *ow, uint32_t op, uint64_t base, uint64_t addr, uint64_t len,
                         uint64_t seed)
{
    vt_cmd_t c = {.op = op, .addr = addr, .len = len, .seed = seed, .off = addr - base};
    int64_t r;

    assert_int_equal(th_io_full(ow->sock, &c, sizeof(c), 1, 10000), 0);
    assert_int_equal(th_io_full(ow->sock, &r, sizeof(r), 0, 60000), 0);
    return r;
}

static void owner_kill(owner_t *ow)
{
    th_child_reap(&ow->pid, &ow->sock);
    free(ow->blob);
    ow->blob = NULL;
}

/* ---- fixture ---- */

typedef struct fx {
    bool ipc; /* a same-host peer's VRAM is opened here (CUDA IPC), not staged */
    th_cfg_t cfg;
    owner_t ow;
    mc_engine_t *e;
    mc_segment_id_t seg, self;
    uint8_t *vram, *vram2, *mem; /* ours, registered: SIZE each */
} fx_t;

static int setup(void **state)
{
    fx_t *fx = calloc(1, sizeof(*fx));
    const char *tp = getenv("VT_TRANSPORT");

    fx->ow.sock = -1;
    th_config(&fx->cfg);
    th_set(&fx->cfg, "FORCE_TCP", tp && strcmp(tp, "tcp") ? "0" : "1");
    if (tp && !strcmp(tp, "rdma"))
        th_set(&fx->cfg, "PROTOCOL", "rdma");
    fx->ipc = tp && !strcmp(tp, "shm");
    owner_spawn(&fx->ow, &fx->cfg);
    fx->e = th_engine(&fx->cfg);
    assert_int_equal(mc_segment_open_blob(fx->e, fx->ow.blob, fx->ow.blob_len, &fx->seg), 0);
    assert_int_equal(mc_segment_open(fx->e, mc_engine_segment_name(fx->e), &fx->self), 0);
    assert_int_equal(cudaMalloc((void **)&fx->vram, SIZE), cudaSuccess);
    assert_int_equal(cudaMalloc((void **)&fx->vram2, SIZE), cudaSuccess);
    assert_int_equal(mc_mem_register(fx->e, fx->vram, SIZE, "*"), 0);
    assert_int_equal(mc_mem_register(fx->e, fx->vram2, SIZE, "cuda:0"), 0);
    fx->mem = th_buf(fx->e, SIZE);
    *state = fx;
    return 0;
}

static int teardown(void **state)
{
    fx_t *fx = *state;

    th_close(fx->e, fx->self);
    th_close(fx->e, fx->seg);
    mc_mem_unregister(fx->e, fx->vram);
    mc_mem_unregister(fx->e, fx->vram2);
    cudaFree(fx->vram);
    cudaFree(fx->vram2);
    th_buf_free(fx->e, fx->mem, SIZE);
    mc_engine_destroy(fx->e);
    owner_kill(&fx->ow);
    free(fx);
    return 0;
}

static void xfer_ok(mc_engine_t *e, mc_opcode_t op, const void *local, mc_segment_id_t seg,
                    uint64_t remote, uint64_t len)
{
    mc_request_t r = {.opcode = op,
                      .local = (void *)local,
                      .target = seg,
                      .target_offset = remote,
                      .length = len};
    mc_task_status_t st = th_xfer_req(e, &r, NULL);

    if (st.state != MC_TASK_COMPLETED)
        print_error("%s of %llu bytes: %s\n", op == MC_READ ? "READ" : "WRITE",
                    (unsigned long long)len, st.reason);
    assert_int_equal(st.state, MC_TASK_COMPLETED);
    assert_int_equal(st.bytes, len);
}

/* ---- tests ---- */

/* Our VRAM to and from the peer's host memory, aligned and not. */
static void test_vram_to_host(void **state)
{
    fx_t *fx = *state;
    uint64_t m = fx->ow.mem;

    xfer_ok(fx->e, MC_READ, fx->vram + 17, fx->seg, m + 1001, 5 * MIB + 3);
    assert_int_equal(vcheck(fx->vram + 17, 5 * MIB + 3, SEED_OM, 1001), -1);
    vfill(fx->vram, SIZE, 31, 0);
    xfer_ok(fx->e, MC_WRITE, fx->vram + 4 * MIB, fx->seg, m + 4 * MIB, 3 * MIB + 5); /* 31 @4M */
    assert_int_equal(owner_cmd(&fx->ow, VC_CHECK_MEM, m, m + 4 * MIB, 3 * MIB + 5, 31), -1);
    assert_int_equal(owner_cmd(&fx->ow, VC_CHECK_MEM, m, m + 8 * MIB, 8 * MIB, SEED_OM), -1);
}

/* Our host memory to and from the peer's VRAM: its owner stages it. */
static void test_host_to_vram(void **state)
{
    fx_t *fx = *state;
    uint64_t v = fx->ow.vram;

    xfer_ok(fx->e, MC_READ, fx->mem + 7, fx->seg, v + 1001, 6 * MIB);
    assert_int_equal(th_check_at(fx->mem + 7, 6 * MIB, SEED_OV, 1001), -1);
    th_fill(fx->mem, SIZE, 32);
    xfer_ok(fx->e, MC_WRITE, fx->mem + 2 * MIB, fx->seg, v + 2 * MIB, 3 * MIB + 7);
    assert_int_equal(owner_cmd(&fx->ow, VC_CHECK_VRAM, v, v + 2 * MIB, 3 * MIB + 7, 32), -1);
    assert_int_equal(owner_cmd(&fx->ow, VC_CHECK_VRAM, v, v + 6 * MIB, 10 * MIB, SEED_OV), -1);
    /* over shm (MC_PROTOCOL auto) we open its VRAM with CUDA IPC; otherwise the owner stages */
    int64_t served = owner_cmd(&fx->ow, VC_SERVED, 0, 0, 0, 0);
    if (fx->ipc)
        assert_int_equal(served, 0);
    else
        assert_true(served >= 9 * MIB);
}

/* VRAM to VRAM: staged at both ends. */
static void test_vram_to_vram(void **state)
{
    fx_t *fx = *state;
    uint64_t v = fx->ow.vram;

    xfer_ok(fx->e, MC_READ, fx->vram, fx->seg, v, SIZE);
    assert_int_equal(vcheck(fx->vram, SIZE, SEED_OV, 0), -1);
    vfill(fx->vram, SIZE, 33, 0);
    xfer_ok(fx->e, MC_WRITE, fx->vram + 3, fx->seg, v + 3, 8 * MIB - 5);
    assert_int_equal(owner_cmd(&fx->ow, VC_CHECK_VRAM, v, v + 3, 8 * MIB - 5, 33), -1);
    assert_int_equal(owner_cmd(&fx->ow, VC_CHECK_VRAM, v, v + 8 * MIB, 8 * MIB, SEED_OV), -1);
}

/* Our own segment: VRAM and host memory, straight through the device's copies. */
static void test_self(void **state)
{
    fx_t *fx = *state;

    th_fill(fx->mem, SIZE, 34);
    xfer_ok(fx->e, MC_WRITE, fx->mem + 1, fx->self, ptr(fx->vram) + 1, 5 * MIB);
    assert_int_equal(vcheck(fx->vram + 1, 5 * MIB, 34, 1), -1);
    xfer_ok(fx->e, MC_READ, fx->vram2, fx->self, ptr(fx->vram), 6 * MIB); /* VRAM to VRAM */
    assert_int_equal(vcheck(fx->vram2 + 1, 5 * MIB, 34, 1), -1);
    memset(fx->mem, 0, SIZE);
    xfer_ok(fx->e, MC_READ, fx->mem + 1, fx->self, ptr(fx->vram2) + 1, 5 * MIB);
    assert_int_equal(th_check_at(fx->mem + 1, 5 * MIB, 34, 1), -1);
}

/* The owner is killed while it stages: 256 MiB of READs and WRITEs of its VRAM to and from
 * ours, the kill once it has served some, with copies in flight at both ends. Every task ends
 * within the timeout, those cut short failed, none hangs. With CUDA IPC (shm) nothing is
 * staged: the kill comes with copies in flight into its VRAM, opened here (which keeps that
 * memory alive: they may complete); every task ends, none hangs. */
static void test_owner_killed(void **state)
{
    fx_t *fx = *state;
    enum { N = 256 };
    mc_request_t *r = calloc(N, sizeof(*r));
    mc_batch_t *b;
    mc_batch_status_t bs;

    for (int i = 0; i < N; i++)
        r[i] = (mc_request_t){.opcode = i % 2 ? MC_WRITE : MC_READ,
                              .local = fx->vram + (i % 16) * MIB,
                              .target = fx->seg,
                              .target_offset = fx->ow.vram + (i % 16) * MIB,
                              .length = MIB};
    assert_int_equal(mc_batch_create(fx->e, N, &b), 0);
    assert_int_equal(mc_batch_submit(b, r, N, NULL), 0);
    for (int64_t dl = th_now_ms() + 10000;
         !fx->ipc && owner_cmd(&fx->ow, VC_SERVED, 0, 0, 0, 0) <= 0 && th_now_ms() < dl;)
        th_sleep_ms(1);
    kill(fx->ow.pid, SIGKILL);
    assert_int_equal(mc_batch_wait(b, 30000), 0);
    assert_int_equal(mc_batch_status(b, &bs), 0);
    print_message("  %zu tasks: %zu completed before the kill, %zu failed\n", bs.tasks,
                  bs.completed, bs.failed);
    assert_true(fx->ipc || bs.failed > 0);
    assert_int_equal(bs.completed + bs.failed, N);
    free(r);
    th_batch_destroy(fx->e, b);
    waitpid(fx->ow.pid, NULL, 0);
    fx->ow.pid = 0;
}

/* The owner unregisters its VRAM after we wrote into it (over shm: opened here with CUDA IPC,
 * which its unregister revokes): a WRITE there afterwards fails, and leaves its bytes as they
 * were. */
static void test_owner_unregisters(void **state)
{
    fx_t *fx = *state;
    uint64_t v = fx->ow.vram;

    th_fill(fx->mem, SIZE, 35);
    xfer_ok(fx->e, MC_WRITE, fx->mem, fx->seg, v, 4 * MIB);
    assert_int_equal(owner_cmd(&fx->ow, VC_UNREGISTER, v, v, 0, 0), 0);
    th_fill(fx->mem, SIZE, 36);
    int rc = th_xfer(fx->e, MC_WRITE, fx->mem, fx->seg, v, MIB, NULL, 0);
    assert_true(rc < 0 ||
                rc == MC_TASK_FAILED); /* refused at submit (no longer listed), or failed */
    assert_int_equal(owner_cmd(&fx->ow, VC_CHECK_VRAM, v, v, 4 * MIB, 35), -1);
    assert_int_equal(owner_cmd(&fx->ow, VC_CHECK_VRAM, v, v + 4 * MIB, 12 * MIB, SEED_OV), -1);
}

static int have_device(void)
{
    int n = 0;
    cudaError_t err = cudaGetDeviceCount(&n);

    if (err == cudaSuccess && n > 0)
        return 1;
    fprintf(stderr, "test_vram: no CUDA device (%s): skipped\n",
            err == cudaSuccess ? "none found" : cudaGetErrorString(err));
    return 0;
}

#define T(fn) cmocka_unit_test_setup_teardown(fn, setup, teardown)

int main(int argc, char **argv)
{
    if (argc == 3 && !strcmp(argv[1], "--vram-owner"))
        owner_main(atoi(argv[2]));
    th_main(argc, argv);
    if (!have_device())
        return 77;
    const struct CMUnitTest tests[] = {
        T(test_vram_to_host), T(test_host_to_vram),      T(test_vram_to_vram),
        T(test_self),         T(test_owner_unregisters), T(test_owner_killed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
#else
int main(void)
{
    fprintf(stderr, "test_vram: built without CUDA: skipped\n");
    return 77;
}
#endif
