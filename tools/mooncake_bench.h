/* mooncake-bench: what its parts share (options, helpers). */
#ifndef MOONCAKE_BENCH_H
#define MOONCAKE_BENCH_H

#include <stdint.h>

#include <jansson.h>

#include <mooncake/engine.h>

typedef struct opts {
    const char *mode, *segment_id, *operation, *protocol, *memory, *target_memory, *pattern,
        *metadata;
    uint64_t block_size, batch_size, threads, buffer_size;
    double duration, interval;
    int verify, json, progress_thread, reuse;
} opts_t;

extern opts_t o;

/* Print what failed with mc_last_error() and exit(1). */
void die(const char *what, int rc) __attribute__((noreturn));
double now_s(void);
/* An engine with the options' settings (progress_thread: 1 thread, 0 caller). */
mc_engine_t *make_engine(int progress_thread);
/* One compact JSON line on stdout (the --json summary). */
void print_json_line(const json_t *j);

/* --operation msg (bench_msg.c): the target's handlers, and the initiator's whole run. */
void msg_target_setup(mc_engine_t *e);
int msg_run_initiator(mc_engine_t *e, mc_segment_id_t seg);

#endif
