/* mc-cuda-copy-bw: cudaMemcpy bandwidth between pinned host memory and a GPU (h2d, d2h), or
 * within one GPU (d2d), in blocks cycling through a working set: the limit for any VRAM path
 * through host memory (bench/vram.sh runs it next to the engine). Exits 77 without a device. */
#include "bench_common.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

typedef struct cuda_opts {
    const char *direction; /* h2d, d2h, d2d */
    int device;
} cuda_opts_t;

static int cuda_opt(void *ctx, const char *name, const char *value)
{
    cuda_opts_t *c = ctx;

    if (!strcmp(name, "direction")) {
        if (strcmp(value, "h2d") && strcmp(value, "d2h") && strcmp(value, "d2d"))
            return -EINVAL;
        c->direction = value;
        return 1;
    }
    if (!strcmp(name, "device")) {
        c->device = atoi(value);
        return 1;
    }
    return 0;
}

static int fail(cudaError_t err, const char *what)
{
    fprintf(stderr, "mc-cuda-copy-bw: %s: %s\n", what, cudaGetErrorString(err));
    return 1;
}

int main(int argc, char **argv)
{
    mc_bench_opts_t opts;
    cuda_opts_t c = {.direction = "h2d"};
    char *host = NULL, *dev = NULL, *dev2 = NULL;
    cudaError_t err;
    int n = 0, rc;

    mc_bench_opts_init(&opts);
    opts.block_size = 1 << 20;
    opts.buffer_size = 256u << 20;
    rc = mc_bench_parse_args(argc, argv, &opts, cuda_opt, &c,
                             "  --direction h2d|d2h|d2d   (h2d)\n  --device N   (0)\n");
    if (rc != 0)
        return rc > 0 ? 0 : 2;
    if (mc_bench_opts_check(&opts) != 0)
        return 2;
    err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess || c.device >= n) {
        fprintf(stderr, "mc-cuda-copy-bw: no CUDA device %d (%s): skipped\n", c.device,
                err != cudaSuccess ? cudaGetErrorString(err) : "fewer devices");
        return MC_BENCH_EXIT_SKIP;
    }
    if ((err = cudaSetDevice(c.device)) != cudaSuccess)
        return fail(err, "cudaSetDevice");
    if ((err = cudaMallocHost((void **)&host, opts.buffer_size)) != cudaSuccess)
        return fail(err, "cudaMallocHost");
    if ((err = cudaMalloc((void **)&dev, opts.buffer_size)) != cudaSuccess ||
        (err = cudaMalloc((void **)&dev2, opts.buffer_size)) != cudaSuccess)
        return fail(err, "cudaMalloc");
    memset(host, 1, opts.buffer_size);
    char *dst = !strcmp(c.direction, "h2d") ? dev : !strcmp(c.direction, "d2h") ? host : dev2;
    char *src = !strcmp(c.direction, "h2d") ? host : dev;
    size_t span = opts.buffer_size - opts.buffer_size % opts.block_size, off = 0;
    uint64_t bytes = 0;
    double start = mc_bench_now(), end = start + opts.duration;

    while (mc_bench_now() < end) {
        if ((err = cudaMemcpy(dst + off, src + off, opts.block_size, cudaMemcpyDefault)) !=
            cudaSuccess)
            return fail(err, "cudaMemcpy");
        bytes += opts.block_size;
        off = off + opts.block_size == span ? 0 : off + opts.block_size;
    }
    double seconds = mc_bench_now() - start;
    char name[32];
    snprintf(name, sizeof(name), "cudaMemcpy %s", c.direction);
    mc_bench_report(name, &opts, json_pack("{s:s}", "direction", c.direction), bytes, seconds);
    cudaFree(dev);
    cudaFree(dev2);
    cudaFreeHost(host);
    return 0;
}
