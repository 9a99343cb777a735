/* Helpers shared by the baseline benchmarks (mc-raw-tcp, mc-memcpy-bw, mc-cma-bw): option
 * values, clocks, pre-faulted buffers and the common result line.  Not part of the engine. */
#ifndef MC_BENCH_COMMON_H
#define MC_BENCH_COMMON_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#define MC_BENCH_EXIT_SKIP 77

/* Options every baseline understands; each program adds its own. */
typedef struct mc_bench_opts {
    size_t block_size;  /* bytes per operation */
    size_t buffer_size; /* working set: each side cycles through this many bytes */
    double duration;    /* seconds of measured transfer */
    int json;           /* print the JSON result line last */
} mc_bench_opts_t;

/* Monotonic time in seconds. */
double mc_bench_now(void);

/* Parses "65536", "64k", "64KiB", "1m", "1G" (powers of 1024) into *value_p; 0 or -EINVAL. */
int mc_bench_parse_size(const char *text, size_t *value_p);

/* Parses a common option (name without the leading "--", value) into *opts.  Returns 1 if it
 * was one, 0 if the caller should handle it, -EINVAL on a bad value. */
int mc_bench_common_opt(mc_bench_opts_t *opts, const char *name, const char *value);

/* Sets defaults: block 64 KiB, working set 1 GiB, 3 s, no JSON. */
void mc_bench_opts_init(mc_bench_opts_t *opts);

/* A program's own options: returns 1 if it took (name, value), 0 if unknown, -EINVAL if bad. */
typedef int (*mc_bench_opt_cb)(void *ctx, const char *name, const char *value);

/* Parses argv: "--name value" or "--name=value", plus the flags --json and --help.  Common
 * options go to opts, the rest to cb.  On an unknown or bad option, or --help, prints usage
 * (the program's text) and returns -EINVAL (--help: 1).  0 when all were understood. */
int mc_bench_parse_args(int argc, char **argv, mc_bench_opts_t *opts, mc_bench_opt_cb cb, void *ctx,
                        const char *usage);

/* Checks the combination (block <= working set, both > 0); prints why not and returns -EINVAL. */
int mc_bench_opts_check(const mc_bench_opts_t *opts);

/* Page-aligned anonymous memory with every page written, so page faults are not measured.
 * Returns NULL on failure (with a message); free it with mc_bench_free(ptr, size). */
void *mc_bench_alloc(size_t size);
void mc_bench_free(void *ptr, size_t size);

/* Prints the human line and, when opts->json is set, a JSON object as the last line: extra's
 * members (a JSON object, taken over and freed; NULL for none) and the figures. */
void mc_bench_report(const char *name, const mc_bench_opts_t *opts, json_t *extra, uint64_t bytes,
                     double seconds);

#endif
