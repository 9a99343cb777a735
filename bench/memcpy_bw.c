/* mc-memcpy-bw: single-thread memcpy bandwidth over a working set, the ceiling for any
 * same-host copy path (shm transport, CMA).  Source and destination are pre-faulted; blocks are
 * copied at the same offset in both, cycling through the working set. */
#include "bench_common.h"

#include <stdio.h>
#include <string.h>

/* Reading the clock every ~1 MiB keeps its cost out of small-block figures. */
#define MC_MEMCPY_CLOCK_BYTES (1u << 20)

static uint64_t mc_memcpy_run(char *dst, const char *src, const mc_bench_opts_t *opts,
                              double *seconds_p)
{
    size_t span = opts->buffer_size - opts->buffer_size % opts->block_size;
    size_t off = 0, since_clock = 0;
    uint64_t bytes = 0;
    double start = mc_bench_now(), end = start + opts->duration, now = start;

    while (now < end) {
        memcpy(dst + off, src + off, opts->block_size);
        bytes += opts->block_size;
        off += opts->block_size;
        if (off == span) {
            off = 0;
        }
        since_clock += opts->block_size;
        if (since_clock >= MC_MEMCPY_CLOCK_BYTES) {
            since_clock = 0;
            now = mc_bench_now();
        }
    }
    *seconds_p = mc_bench_now() - start;
    return bytes;
}

int main(int argc, char **argv)
{
    mc_bench_opts_t opts;
    char *src, *dst;
    uint64_t bytes;
    double seconds;
    int rc;

    mc_bench_opts_init(&opts);
    rc = mc_bench_parse_args(argc, argv, &opts, NULL, NULL, "");
    if (rc != 0) {
        return rc > 0 ? 0 : 2;
    }
    if (mc_bench_opts_check(&opts) != 0) {
        return 2;
    }
    src = mc_bench_alloc(opts.buffer_size);
    dst = mc_bench_alloc(opts.buffer_size);
    if (src == NULL || dst == NULL) {
        mc_bench_free(src, opts.buffer_size);
        return 1;
    }
    bytes = mc_memcpy_run(dst, src, &opts, &seconds);
    mc_bench_report("memcpy", &opts, NULL, bytes, seconds);
    mc_bench_free(dst, opts.buffer_size);
    mc_bench_free(src, opts.buffer_size);
    return 0;
}
