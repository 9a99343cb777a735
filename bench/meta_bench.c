/*
 * mc-meta-bench: puts and gets per second through the metadata interface.
 *
 *   mc-meta-bench URL [COUNT [VALUE_BYTES [THREADS]]]
 *
 * Each thread puts COUNT/THREADS keys "mc-bench/<thread>/<i>" with VALUE_BYTES-byte values, then
 * gets them all back and checks them, then deletes them. Prints one JSON line.
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>

#include <mooncake/error.h>

#include "metadata/meta.h"
#include "util/log.h"

typedef struct job {
    pthread_t tid;
    mc_meta_t *meta;
    int id;
    long count;
    size_t vlen;
    int phase; /* 0 put, 1 get, 2 delete */
    int failed;
} job_t;

static double now_s(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void *run(void *arg)
{
    job_t *j = arg;
    char key[64], *val = malloc(j->vlen + 1);

    memset(val, 'a' + j->id % 26, j->vlen);
    for (long i = 0; i < j->count && !j->failed; i++) {
        int n = snprintf(key, sizeof(key), "mc-bench/%d/%08ld", j->id, i), rc;
        mc_meta_kv_t kv;
        if (j->phase == 0) {
            rc = mc__meta_put(j->meta, key, (size_t)n, val, j->vlen, 0, NULL);
        } else if (j->phase == 1) {
            rc = mc__meta_get(j->meta, key, (size_t)n, &kv);
            if (rc == 0 && (kv.value_len != j->vlen || memcmp(kv.value, val, j->vlen)))
                rc = -1;
            if (rc == 0)
                mc__meta_kv_free(&kv);
        } else {
            rc = mc__meta_del(j->meta, key, (size_t)n);
        }
        if (rc) {
            fprintf(stderr, "mc-meta-bench: %s %s: %s\n", j->phase ? "get" : "put", key,
                    mc_last_error());
            j->failed = 1;
        }
    }
    free(val);
    return NULL;
}

static double phase(job_t *jobs, int threads, int ph, int *failed)
{
    double t0 = now_s();

    for (int t = 0; t < threads; t++) {
        jobs[t].phase = ph;
        pthread_create(&jobs[t].tid, NULL, run, &jobs[t]);
    }
    for (int t = 0; t < threads; t++) {
        pthread_join(jobs[t].tid, NULL);
        *failed |= jobs[t].failed;
    }
    return now_s() - t0;
}

int main(int argc, char **argv)
{
    long count = argc > 2 ? atol(argv[2]) : 2000;
    size_t vlen = argc > 3 ? (size_t)atol(argv[3]) : 256;
    int threads = argc > 4 ? atoi(argv[4]) : 1, failed = 0;
    mc_meta_t *meta;
    job_t jobs[64];

    if (argc < 2 || count <= 0 || threads <= 0 || threads > 64) {
        fprintf(stderr, "usage: mc-meta-bench URL [COUNT [VALUE_BYTES [THREADS]]]\n");
        return 2;
    }
    if (mc__meta_open(argv[1], NULL, &meta)) {
        fprintf(stderr, "mc-meta-bench: %s: %s\n", argv[1], mc_last_error());
        return 1;
    }
    for (int t = 0; t < threads; t++)
        jobs[t] = (job_t){.meta = meta, .id = t, .count = count / threads, .vlen = vlen};
    count = count / threads * threads;
    double tp = phase(jobs, threads, 0, &failed);
    double tg = failed ? 0 : phase(jobs, threads, 1, &failed);
    if (!failed)
        phase(jobs, threads, 2, &failed);
    mc__meta_close(meta);
    if (failed)
        return 1;
    json_t *line = json_pack("{s:s,s:I,s:I,s:i,s:f,s:f}", "tool", "mc-meta-bench", "count",
                             (json_int_t)count, "value_bytes", (json_int_t)vlen, "threads", threads,
                             "puts_per_s", (double)count / tp, "gets_per_s", (double)count / tg);
    char *text = line ? json_dumps(line, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    if (text)
        puts(text);
    free(text);
    json_decref(line);
    return 0;
}
