/* mc-msg-path: what a message costs the engine itself, without the wait for the other core.
 *
 * Two engines in one process, both driven by this one thread (caller progress): A sends a
 * message to B, B is progressed until its handler ran, B answers, A is progressed until its
 * handler ran. Each one-way trip is a send and the pass that hands the message to its handler,
 * in one core's cache, so the figure moves with the engine's code, not with where the VM puts
 * its vCPUs (which swings two-process latency 2-5x here). Then the part of a trip a peer in
 * another process waits for (the send and the pass up to the handler), and an idle pass. Two
 * processes' latency is mooncake-bench --operation msg's; UCX has no such figure, so there is
 * no peer here. */
#include "bench_common.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mooncake/engine.h>

enum { MSG_PING = 1, MSG_PONG };

static unsigned long got[3]; /* handler calls, by message id */
static uint64_t handled_at;  /* stamp() in the last handler call, when timing */
static bool timing;

/* A cheap time stamp: the cycle counter where there is one, else the clock in ns. */
static uint64_t stamp(void)
{
#if defined(__x86_64__) || defined(__i386__)
    return __builtin_ia32_rdtsc();
#else
    return (uint64_t)(mc_bench_now() * 1e9);
#endif
}

static void on_msg(void *arg, const char *sender, uint8_t id, const void *data, size_t len)
{
    (void)arg;
    (void)sender;
    (void)data;
    (void)len;
    got[id]++;
    if (timing)
        handled_at = stamp();
}

static mc_engine_t *engine(const char *protocol)
{
    mc_config_t *cfg;
    mc_engine_t *e = NULL;
    int rc = mc_config_create(&cfg);

    if (!rc)
        rc = mc_config_set(cfg, "PROGRESS_THREAD", "0");
    if (!rc && !strcmp(protocol, "tcp"))
        rc = mc_config_set(cfg, "FORCE_TCP", "1");
    if (!rc)
        rc = mc_engine_create(cfg, &e);
    mc_config_destroy(cfg);
    if (rc) {
        fprintf(stderr, "mc-msg-path: engine: %s\n", mc_last_error());
        exit(1);
    }
    return e;
}

/* One message from e to its peer seg; the peer is progressed until its handler of id ran. */
static void one_way(mc_engine_t *e, mc_segment_id_t seg, mc_engine_t *peer, uint8_t id,
                    const void *msg, size_t len)
{
    unsigned long want = got[id] + 1;
    int rc;

    while ((rc = mc_msg_send(e, seg, id, msg, len)) == -EAGAIN) {
        mc_engine_progress(e);
        mc_engine_progress(peer);
    }
    if (rc) {
        fprintf(stderr, "mc-msg-path: send: %s\n", mc_last_error());
        exit(1);
    }
    while (got[id] < want)
        mc_engine_progress(peer);
}

static int protocol_opt(void *ctx, const char *name, const char *value)
{
    if (strcmp(name, "protocol"))
        return 0;
    if (strcmp(value, "shm") && strcmp(value, "tcp"))
        return -EINVAL;
    *(const char **)ctx = value;
    return 1;
}

int main(int argc, char **argv)
{
    mc_bench_opts_t opts;
    const char *protocol = "shm";
    mc_segment_id_t ab, ba;
    unsigned long trips = 0;

    mc_bench_opts_init(&opts);
    opts.block_size = 8;
    opts.buffer_size = MC_MSG_MAX;
    if (mc_bench_parse_args(argc, argv, &opts, protocol_opt, &protocol,
                            "  --protocol shm|tcp  the carrier between the two engines (shm)\n"
                            "  (--block_size: the message size, 8 B; at most 64 KiB)\n"))
        return 2;
    if (opts.block_size > MC_MSG_MAX) {
        fprintf(stderr, "mc-msg-path: messages are at most %d bytes\n", MC_MSG_MAX);
        return 2;
    }
    setenv("MC_LOG_LEVEL", "error", 0); /* the engines' goodbyes to each other are no news */
    uint8_t *msg = calloc(1, opts.block_size ? opts.block_size : 1);
    mc_engine_t *a = engine(protocol), *b = engine(protocol);
    if (!msg || mc_msg_handler_set(a, MSG_PONG, on_msg, NULL) ||
        mc_msg_handler_set(b, MSG_PING, on_msg, NULL) ||
        mc_segment_open_nb(a, mc_engine_segment_name(b), &ab) ||
        mc_segment_open_nb(b, mc_engine_segment_name(a), &ba)) {
        fprintf(stderr, "mc-msg-path: setup: %s\n", mc_last_error());
        return 1;
    }
    double ready_by = mc_bench_now() + 10;
    while ((mc_segment_state(a, ab) != MC_SEGMENT_READY ||
            mc_segment_state(b, ba) != MC_SEGMENT_READY) &&
           mc_bench_now() < ready_by) {
        mc_engine_progress(a);
        mc_engine_progress(b);
    }
    if (mc_segment_state(a, ab) != MC_SEGMENT_READY ||
        mc_segment_state(b, ba) != MC_SEGMENT_READY) {
        fprintf(stderr, "mc-msg-path: the engines did not open each other within 10 s\n");
        return 1;
    }
    /* warm up (connections, rings, caches) for a fifth of the time, then measure */
    for (int measured = 0; measured < 2; measured++) {
        double start = mc_bench_now(), end = start + opts.duration / (measured ? 1 : 5), now;
        trips = 0;
        do {
            for (int i = 0; i < 1000; i++) {
                one_way(a, ab, b, MSG_PING, msg, opts.block_size);
                one_way(b, ba, a, MSG_PONG, msg, opts.block_size);
            }
            trips += 1000;
            now = mc_bench_now();
        } while (now < end);
        if (measured) {
            double ns = (now - start) * 1e9 / (double)trips / 2;
            printf("msg path: %s, %zu B: %.1f ns per one-way trip (send and the pass that hands "
                   "it over), %lu round trips in %.2f s\n",
                   protocol, opts.block_size, ns, trips, now - start);
            if (opts.json)
                printf("{\"bench\":\"msg_path\",\"protocol\":\"%s\",\"block_size\":%zu,"
                       "\"ns_per_one_way\":%.1f,\"round_trips\":%lu}\n",
                       protocol, opts.block_size, ns, trips);
        }
    }
    /* The part of a trip a peer in another process waits for: from the send to the handler
     * (the rest of the receiver's pass comes after the handler, in parallel with the peer).
     * Stamps at both ends (the cycle counter where there is one); one stamp's cost is taken
     * off, and the counter is timed against the clock over the run. */
    uint64_t ticks = 0, stamp_cost = stamp();
    for (int i = 0; i < 1000; i++)
        (void)stamp();
    stamp_cost = (stamp() - stamp_cost) / 1001;
    double start_s = mc_bench_now();
    uint64_t start_t = stamp(), n = 0;
    timing = true;
    do {
        for (int i = 0; i < 1000; i++, n++) {
            uint64_t t0 = stamp();
            one_way(a, ab, b, MSG_PING, msg, opts.block_size);
            ticks += handled_at - t0 - stamp_cost;
            one_way(b, ba, a, MSG_PONG, msg, opts.block_size);
        }
    } while (mc_bench_now() - start_s < opts.duration / 2);
    timing = false;
    double ns_per_tick = (mc_bench_now() - start_s) * 1e9 / (double)(stamp() - start_t);
    printf("to the handler: %.1f ns (the send and the receiving pass up to the handler: what a "
           "peer in another process waits for)\n",
           (double)ticks * ns_per_tick / (double)n);
    /* A pass that finds nothing: a spinning receiver sees a message half of one late, on
     * average, before handing it over (UCX's progress loop is a few loads). */
    double start = mc_bench_now(), now;
    unsigned long passes = 0;
    do {
        for (int i = 0; i < 10000; i++)
            mc_engine_progress(a);
        passes += 10000;
        now = mc_bench_now();
    } while (now - start < opts.duration / 2);
    printf("idle pass: %.1f ns (a spinning engine with a peer, nothing arriving)\n",
           (now - start) * 1e9 / (double)passes);
    mc_engine_destroy(a);
    mc_engine_destroy(b);
    free(msg);
    return 0;
}
