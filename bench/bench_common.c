/* Helpers shared by the baseline benchmarks; see bench_common.h. */
#include "bench_common.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <time.h>

double mc_bench_now(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int mc_bench_parse_size(const char *text, size_t *value_p)
{
    char *end;
    unsigned long long v;
    unsigned shift = 0;

    errno = 0;
    v = strtoull(text, &end, 0);
    if (errno != 0 || end == text || text[0] == '-') {
        return -EINVAL;
    }
    switch (*end) {
    case 'k':
    case 'K':
        shift = 10;
        break;
    case 'm':
    case 'M':
        shift = 20;
        break;
    case 'g':
    case 'G':
        shift = 30;
        break;
    case '\0':
        break;
    default:
        return -EINVAL;
    }
    if (*end != '\0') {
        end++;
        if (*end != '\0' && strcasecmp(end, "b") != 0 && strcasecmp(end, "ib") != 0) {
            return -EINVAL;
        }
    }
    if (shift != 0 && v > (SIZE_MAX >> shift)) {
        return -EINVAL;
    }
    *value_p = (size_t)(v << shift);
    return 0;
}

void mc_bench_opts_init(mc_bench_opts_t *opts)
{
    opts->block_size = 64 * 1024;
    opts->buffer_size = (size_t)1 << 30;
    opts->duration = 3.0;
    opts->json = 0;
}

int mc_bench_common_opt(mc_bench_opts_t *opts, const char *name, const char *value)
{
    char *end;

    if (strcmp(name, "block_size") == 0) {
        return mc_bench_parse_size(value, &opts->block_size) == 0 ? 1 : -EINVAL;
    }
    if (strcmp(name, "buffer_size") == 0) {
        return mc_bench_parse_size(value, &opts->buffer_size) == 0 ? 1 : -EINVAL;
    }
    if (strcmp(name, "duration") == 0) {
        opts->duration = strtod(value, &end);
        return (end != value && *end == '\0' && opts->duration > 0) ? 1 : -EINVAL;
    }
    return 0;
}

static int mc_bench_usage(const char *prog, const char *usage, int rc)
{
    fprintf(rc == 0 ? stdout : stderr,
            "usage: %s [options]\n%s"
            "  --block_size N    bytes per operation (64k)\n"
            "  --buffer_size N   working set each side cycles through (1G)\n"
            "  --duration S      seconds to measure (3)\n"
            "  --json            print a JSON result object as the last line\n",
            prog, usage);
    return rc == 0 ? 1 : rc;
}

int mc_bench_parse_args(int argc, char **argv, mc_bench_opts_t *opts, mc_bench_opt_cb cb, void *ctx,
                        const char *usage)
{
    char name[64];
    const char *arg, *value, *eq;
    int i, rc;

    for (i = 1; i < argc; i++) {
        arg = argv[i];
        if (strcmp(arg, "--json") == 0) {
            opts->json = 1;
            continue;
        }
        if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) {
            return mc_bench_usage(argv[0], usage, 0);
        }
        if (strncmp(arg, "--", 2) != 0) {
            fprintf(stderr, "unexpected argument '%s'\n", arg);
            return mc_bench_usage(argv[0], usage, -EINVAL);
        }
        arg += 2;
        eq = strchr(arg, '=');
        if (eq != NULL) {
            snprintf(name, sizeof(name), "%.*s", (int)(eq - arg), arg);
            value = eq + 1;
        } else if (i + 1 < argc) {
            snprintf(name, sizeof(name), "%s", arg);
            value = argv[++i];
        } else {
            fprintf(stderr, "option --%s needs a value\n", arg);
            return mc_bench_usage(argv[0], usage, -EINVAL);
        }
        rc = mc_bench_common_opt(opts, name, value);
        if (rc == 0 && cb != NULL) {
            rc = cb(ctx, name, value);
        }
        if (rc <= 0) {
            fprintf(stderr, rc == 0 ? "unknown option --%s\n" : "bad value for --%s: '%s'\n", name,
                    value);
            return mc_bench_usage(argv[0], usage, -EINVAL);
        }
    }
    return 0;
}

int mc_bench_opts_check(const mc_bench_opts_t *opts)
{
    if (opts->block_size == 0 || opts->buffer_size < opts->block_size) {
        fprintf(stderr, "block_size (%zu) must be > 0 and <= buffer_size (%zu)\n", opts->block_size,
                opts->buffer_size);
        return -EINVAL;
    }
    return 0;
}

void *mc_bench_alloc(size_t size)
{
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

    if (p == MAP_FAILED) {
        fprintf(stderr, "mmap %zu bytes: %s\n", size, strerror(errno));
        return NULL;
    }
    /* A forked peer must not share these pages: copy-on-write faults would be measured. */
    madvise(p, size, MADV_DONTFORK);
    /* Non-zero bytes: a zero page would let reads of untouched memory look faster. */
    memset(p, 0x5a, size);
    return p;
}

void mc_bench_free(void *ptr, size_t size)
{
    if (ptr != NULL) {
        munmap(ptr, size);
    }
}

void mc_bench_report(const char *name, const mc_bench_opts_t *opts, json_t *extra, uint64_t bytes,
                     double seconds)
{
    double gbps = seconds > 0 ? (double)bytes / seconds / 1e9 : 0.0;
    json_t *line = extra ? extra : json_object();
    char *text;

    printf("%s: block %zu B, working set %zu B: %.1f MB in %.3f s = %.3f GB/s\n", name,
           opts->block_size, opts->buffer_size, (double)bytes / 1e6, seconds, gbps);
    if (opts->json) {
        json_object_update_new(line,
                               json_pack("{s:s,s:I,s:I,s:I,s:f,s:f}", "name", name, "block_size",
                                         (json_int_t)opts->block_size, "buffer_size",
                                         (json_int_t)opts->buffer_size, "bytes", (json_int_t)bytes,
                                         "seconds", seconds, "gbps", gbps));
        text = json_dumps(line, JSON_COMPACT | JSON_PRESERVE_ORDER);
        if (text)
            puts(text);
        free(text);
    }
    json_decref(line);
    fflush(stdout);
}
