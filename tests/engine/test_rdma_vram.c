/*
 * VRAM over rdma: CUDA memory of the initiator moves to and from a target's host memory over
 * the rdma transport (GPUDirect registration where the NIC can reach the GPU; otherwise the file
 * transport stages it through host memory and rdma carries those bytes, which is what the
 * software RDMA device gets). Needs a CUDA device and an RDMA device: exits 77 without either.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>
#include <infiniband/verbs.h>
#if MC_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

#include "harness.h"

#define BUF (16u << 20)

#if MC_HAVE_CUDA
typedef struct fx {
    mc_engine_t *e;
    th_target_t t;
    mc_segment_id_t seg;
    uint8_t *vram, *host;
} fx_t;

static void rdma_cfg(th_cfg_t *cfg)
{
    th_config(cfg);
    th_set(cfg, "PROTOCOL", "rdma");
}

static int setup(void **state)
{
    fx_t *fx = calloc(1, sizeof(*fx));
    th_cfg_t cfg;
    th_target_opts_t o;

    rdma_cfg(&cfg);
    th_target_opts_init(&o, &cfg, BUF);
    o.seed = 500;
    assert_int_equal(th_target_spawn(&o, &fx->t), 0);
    fx->e = th_engine(&cfg);
    fx->seg = th_open(fx->e, &fx->t, 0);
    assert_int_equal(cudaMalloc((void **)&fx->vram, 2 * BUF), cudaSuccess);
    assert_int_equal(mc_mem_register(fx->e, fx->vram, 2 * BUF, "*"), 0);
    fx->host = malloc(2 * BUF);
    *state = fx;
    return 0;
}

static int teardown(void **state)
{
    fx_t *fx = *state;

    assert_int_equal(mc_mem_unregister(fx->e, fx->vram), 0);
    cudaFree(fx->vram);
    mc_segment_close(fx->e, fx->seg);
    mc_engine_destroy(fx->e);
    th_target_stop(&fx->t, 10000);
    free(fx->host);
    free(fx);
    return 0;
}

/* The registration found the GPU, and says in the descriptor whether a NIC reaches it. */
static void test_location(void **state)
{
    fx_t *fx = *state;
    char blob[1 << 16];
    size_t len = sizeof(blob) - 1;

    assert_int_equal(mc_segment_export(fx->e, blob, &len), 0);
    blob[len] = 0;
    assert_non_null(strstr(blob, "\"cuda:0\""));
    print_message("VRAM buffer %s (descriptor: %s)\n",
                  strstr(strstr(blob, "\"cuda:0\""), "rkey") ? "registered with the NIC (GPUDirect)"
                                                             : "staged through host memory",
                  strstr(blob, "rkey") ? "has rkeys" : "no rkeys");
}

/* WRITE from VRAM, READ back into other VRAM, at unaligned offsets; bytes checked on the
 * target and, copied back from the GPU, here. */
static void test_write_read(void **state)
{
    fx_t *fx = *state;
    uint64_t rb = fx->t.eng[0].buf[0];
    const size_t sizes[] = {1, 4096, 65536 + 7, BUF - 64};
    char why[256];

    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        size_t n = sizes[i];
        uint64_t seed = 900 + i;
        th_fill(fx->host, n, seed);
        assert_int_equal(cudaMemcpy(fx->vram + 3, fx->host, n, cudaMemcpyHostToDevice),
                         cudaSuccess);
        int st = th_xfer(fx->e, MC_WRITE, fx->vram + 3, fx->seg, rb + 5, n, why, sizeof(why));
        if (st != MC_TASK_COMPLETED)
            print_error("WRITE %zu: %s\n", n, why);
        assert_int_equal(st, MC_TASK_COMPLETED);
        assert_int_equal(th_remote_check(&fx->t, 0, rb + 5, n, seed, 0), -1);

        assert_int_equal(cudaMemset(fx->vram + BUF, 0xee, BUF), cudaSuccess);
        st = th_xfer(fx->e, MC_READ, fx->vram + BUF + 11, fx->seg, rb + 5, n, why, sizeof(why));
        if (st != MC_TASK_COMPLETED)
            print_error("READ %zu: %s\n", n, why);
        assert_int_equal(st, MC_TASK_COMPLETED);
        memset(fx->host, 0, n + 64);
        assert_int_equal(cudaMemcpy(fx->host, fx->vram + BUF, n + 32, cudaMemcpyDeviceToHost),
                         cudaSuccess);
        for (size_t k = 0; k < 11; k++)
            assert_int_equal(fx->host[k], 0xee);
        assert_int_equal(th_check(fx->host + 11, n, seed), -1);
        assert_int_equal(fx->host[11 + n], 0xee);
    }
    mc_counters_t c;
    assert_int_equal(mc_stats_transport(fx->e, "rdma", &c), 0);
    assert_true(c.bytes_written > 0 && c.bytes_read > 0);
}

/* An engine forced to tcp moves VRAM too: staged through host memory, the bytes over tcp. */
static void test_vram_over_tcp(void **state)
{
    fx_t *fx = *state;
    th_cfg_t cfg;
    char why[256];

    th_config(&cfg);
    th_set(&cfg, "FORCE_TCP", "1");
    mc_engine_t *e = th_engine(&cfg);
    mc_segment_id_t seg = th_open(e, &fx->t, 0);
    assert_int_equal(mc_mem_register(e, fx->vram, BUF, "cuda:0"), 0);
    th_fill(fx->host, 4096, 778);
    assert_int_equal(cudaMemcpy(fx->vram, fx->host, 4096, cudaMemcpyHostToDevice), cudaSuccess);
    int st = th_xfer(e, MC_WRITE, fx->vram, seg, fx->t.eng[0].buf[0], 4096, why, sizeof(why));
    if (st != MC_TASK_COMPLETED)
        print_error("WRITE over tcp: %s\n", why);
    assert_int_equal(st, MC_TASK_COMPLETED);
    assert_int_equal(th_remote_check(&fx->t, 0, fx->t.eng[0].buf[0], 4096, 778, 0), -1);
    mc_counters_t c;
    assert_int_equal(mc_stats_transport(e, "tcp", &c), 0);
    assert_true(c.bytes_written >= 4096);
    assert_int_equal(mc_mem_unregister(e, fx->vram), 0);
    mc_segment_close(e, seg);
    mc_engine_destroy(e);
}
#endif

int main(int argc, char **argv)
{
#if MC_HAVE_CUDA
    int n = 0, gpus = 0;
    struct ibv_device **l;

    th_main(argc, argv); /* the target child runs from here and never returns */
    l = ibv_get_device_list(&n);

    if (l)
        ibv_free_device_list(l);
    if (cudaGetDeviceCount(&gpus) != cudaSuccess || gpus == 0 || n == 0) {
        fprintf(stderr, "test_rdma_vram: skipped (%d CUDA devices, %d RDMA devices)\n", gpus, n);
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_location),
        cmocka_unit_test(test_write_read),
        cmocka_unit_test(test_vram_over_tcp),
    };
    int rc = cmocka_run_group_tests(tests, setup, teardown);
    th_kill_all();
    return rc;
#else
    (void)argc;
    (void)argv;
    fprintf(stderr, "test_rdma_vram: skipped (built without CUDA)\n");
    return 77;
#endif
}
