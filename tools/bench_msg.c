/*
 * mooncake-bench --operation msg: messages between two engines.
 *
 * Latency: the initiator sends PING; the target's handler answers with a PONG of the same size
 * from its own buffer, carrying the PING's number (the only bytes of the PING it reads, as
 * ucx_perftest -t am_lat's responder), or with --verify the PING's own bytes (PING_ECHO); the
 * next PING leaves when the PONG is in. One-way latency is half a round trip (median and p99
 * over every round trip, as ucx_perftest -t am_lat reports). Rate: the initiator sends DATA as fast
 * as the window lets it, then flushes (every message in the target's queue); messages/s counts up
 * to the flush. Last it asks the target (REPORT) how many DATA it received and how many were out of
 * order or (with --verify) corrupt: all of them, once, in order, or the run fails.
 *
 * Message n carries n in its first 8 bytes (fewer for smaller messages); with --verify the rest
 * is a pattern of n, checked by the target (DATA) or the initiator (PONG).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mooncake_bench.h"

enum {
    MSG_PING = 1,
    MSG_PONG,
    MSG_DATA,
    MSG_DATA_CHECKED,
    MSG_REPORT,
    MSG_REPORT_ANSWER,
    MSG_PING_ECHO /* --verify: the PONG carries the PING's bytes back */
};

#define MAX_SAMPLES (1u << 20)

static void put_seq(uint8_t *p, size_t len, uint64_t n)
{
    memcpy(p, &n, len < 8 ? len : 8);
}

/* Whether p holds the first len bytes of n. */
static bool has_seq(const uint8_t *p, size_t len, uint64_t n)
{
    return !len || !memcmp(p, &n, len < 8 ? len : 8);
}

static uint8_t pattern_byte(uint64_t n, size_t i)
{
    return (uint8_t)(n * 131 + i * 7 + (i >> 8));
}

static void fill_msg(uint8_t *p, size_t len, uint64_t n, bool pattern)
{
    put_seq(p, len, n);
    for (size_t i = 8; pattern && i < len; i++)
        p[i] = pattern_byte(n, i);
}

static bool msg_ok(const uint8_t *p, size_t len, uint64_t n, bool pattern)
{
    if (!has_seq(p, len, n))
        return false;
    for (size_t i = 8; pattern && i < len; i++)
        if (p[i] != pattern_byte(n, i))
            return false;
    return true;
}

/* ---- target ---- */

static struct {
    mc_engine_t *e;
    char sender[MC_NAME_MAX];
    mc_segment_id_t peer;
    uint64_t received, bad; /* DATA since the last REPORT */
    uint8_t pong[MC_MSG_MAX];
} tgt;

/* The initiator, opened (without blocking) the first time it sends. */
static mc_segment_id_t reply_to(const char *sender)
{
    if (strcmp(tgt.sender, sender)) {
        int rc = mc_segment_open_nb(tgt.e, sender, &tgt.peer);
        if (rc) {
            fprintf(stderr, "mooncake-bench: cannot answer %s: %s\n", sender, mc_last_error());
            return 0;
        }
        snprintf(tgt.sender, sizeof(tgt.sender), "%s", sender);
    }
    return tgt.peer;
}

static void on_target_msg(void *arg, const char *sender, uint8_t id, const void *data, size_t len)
{
    uint64_t ans[2];
    int rc = 0;

    (void)arg;
    switch (id) {
    case MSG_PING: /* as ucx_perftest's am_lat: a message of the same size from our own buffer,
                    * with the PING's number, the only bytes of it read here */
        memcpy(tgt.pong, data, len < 8 ? len : 8);
        data = tgt.pong;
        /* fall through */
    case MSG_PING_ECHO:
        rc = mc_msg_send(tgt.e, reply_to(sender), MSG_PONG, data, len);
        break;
    case MSG_DATA:
    case MSG_DATA_CHECKED:
        tgt.bad += !msg_ok(data, len, tgt.received, id == MSG_DATA_CHECKED);
        tgt.received++;
        break;
    case MSG_REPORT:
        ans[0] = tgt.received;
        ans[1] = tgt.bad;
        tgt.received = tgt.bad = 0;
        rc = mc_msg_send(tgt.e, reply_to(sender), MSG_REPORT_ANSWER, ans, sizeof(ans));
        break;
    }
    if (rc) /* the initiator's window is one message: never full */
        fprintf(stderr, "mooncake-bench: answer to %s: %s\n", sender, mc_last_error());
}

void msg_target_setup(mc_engine_t *e)
{
    tgt.e = e;
    for (uint8_t id = MSG_PING; id <= MSG_PING_ECHO; id++) /* those it does not expect: ignored */
        mc_msg_handler_set(e, id, on_target_msg, NULL);
}

/* ---- initiator ---- */

static struct {
    mc_engine_t *e;
    bool caller; /* progress driven here, not by the engine's thread */
    const uint8_t *ping;
    size_t len;
    uint64_t ping_seq; /* the number of the PING in flight */
    atomic_uint_fast64_t pongs, bad_pongs;
    atomic_bool answered;
    uint64_t answer[2];
} ini;

static void on_initiator_msg(void *arg, const char *sender, uint8_t id, const void *data,
                             size_t len)
{
    (void)arg;
    (void)sender;
    if (id == MSG_PONG) { /* its number always, every byte with --verify */
        if (len != ini.len ||
            (o.verify ? memcmp(data, ini.ping, len) != 0 : !has_seq(data, len, ini.ping_seq)))
            atomic_fetch_add(&ini.bad_pongs, 1);
        atomic_fetch_add_explicit(&ini.pongs, 1, memory_order_release);
    } else if (id == MSG_REPORT_ANSWER && len == sizeof(ini.answer)) {
        memcpy(ini.answer, data, sizeof(ini.answer));
        atomic_store(&ini.answered, true);
    }
}

static void on_flushed(void *arg, int status)
{
    *(atomic_int *)arg = status ? status : 1;
}

/* Send, retrying while the window is full; 0 or the error. */
static int send_msg(mc_segment_id_t seg, uint8_t id, const void *data, size_t len)
{
    int rc;

    while ((rc = mc_msg_send(ini.e, seg, id, data, len)) == -EAGAIN) {
        if (ini.caller)
            mc_engine_progress(ini.e);
    }
    return rc;
}

/* Spin (driving progress in caller mode) until *flag is set or 10 s pass. */
static bool wait_for(bool (*done)(void *), void *arg)
{
    double dl = now_s() + 10;
    unsigned spins = 0;

    while (!done(arg)) {
        if (ini.caller)
            mc_engine_progress(ini.e);
        if (++spins % 1024 == 0 && now_s() > dl)
            return false;
    }
    return true;
}

static bool pongs_reached(void *arg)
{
    return atomic_load_explicit(&ini.pongs, memory_order_acquire) >= *(uint64_t *)arg;
}

static bool flag_set(void *arg)
{
    return atomic_load((atomic_int *)arg) != 0;
}

static bool answered(void *arg)
{
    (void)arg;
    return atomic_load(&ini.answered);
}

/* The round trips' clock, as ucx_perftest's (UCS reads the TSC on x86 where it runs at a
 * constant rate): the TSC, its rate measured against CLOCK_MONOTONIC, where /proc/cpuinfo says
 * it is constant and does not stop; now_s() otherwise. Read once per round trip: a vDSO
 * clock_gettime costs 31 ns on this VM, a TSC read 10.6, and the difference was 10 ns of the
 * same-host one-way figure that UCX's did not carry. */
#if defined(__x86_64__)
static double tsc_per_s; /* 0: now_s() */
static uint64_t tsc_base;

/* A CLOCK_MONOTONIC reading and the TSC at it: the middle of the two TSC readings around it,
 * of the closest pair out of a few (a preemption between them would skew the rate). */
static void tsc_at(double *t, uint64_t *c)
{
    uint64_t best = UINT64_MAX;

    for (int i = 0; i < 5; i++) {
        uint64_t a = __builtin_ia32_rdtsc();
        double now = now_s();
        uint64_t b = __builtin_ia32_rdtsc();
        if (b - a < best) {
            best = b - a;
            *t = now;
            *c = a + (b - a) / 2;
        }
    }
}
#endif

static void lat_clock_init(void)
{
#if defined(__x86_64__)
    FILE *f = fopen("/proc/cpuinfo", "r");
    char *line = NULL;
    size_t cap = 0;
    bool constant = false;

    while (f && getline(&line, &cap, f) > 0) {
        if (!strncmp(line, "flags", 5)) {
            constant = strstr(line, " constant_tsc") && strstr(line, " nonstop_tsc");
            break;
        }
    }
    free(line);
    if (f)
        fclose(f);
    if (!constant)
        return;
    double t0 = 0, t1 = 0;
    uint64_t c0 = 0, c1 = 0;
    tsc_at(&t0, &c0);
    while (now_s() - t0 < 0.1)
        ;
    tsc_at(&t1, &c1);
    tsc_base = c0;
    tsc_per_s = (double)(c1 - c0) / (t1 - t0);
#endif
}

static double lat_now(void)
{
#if defined(__x86_64__)
    if (tsc_per_s > 0)
        return (double)(__builtin_ia32_rdtsc() - tsc_base) / tsc_per_s;
#endif
    return now_s();
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Ping-pong until the time is up: one-way latencies (µs) sorted into lat, their count. One
 * clock reading per round trip (lat_now), as ucx_perftest takes: a round trip runs from the
 * reading after the previous PONG to the one after its own (the next PING's few bytes of number
 * in between; its whole pattern with --verify). */
static uint64_t run_latency(mc_segment_id_t seg, uint8_t *buf, double secs, double *lat)
{
    uint64_t n = 0, warmup = 200;
    double t, end;

    lat_clock_init();
    t = lat_now();
    end = t + secs;
    ini.ping = buf;
    ini.len = o.block_size;
    for (uint64_t i = 0; n < MAX_SAMPLES && (i <= warmup || t < end); i++) {
        if (i == warmup) /* secs of samples, however long the warm-up took */
            end = t + secs;
        uint64_t want = i + 1;
        double t0 = t;
        fill_msg(buf, o.block_size, i, o.verify);
        ini.ping_seq = i;
        int rc = send_msg(seg, o.verify ? MSG_PING_ECHO : MSG_PING, buf, o.block_size);
        if (rc)
            die("mc_msg_send", rc);
        if (!wait_for(pongs_reached, &want)) {
            fprintf(stderr, "mooncake-bench: no answer to message %" PRIu64 " in 10 s\n", i);
            exit(1);
        }
        t = lat_now();
        if (i >= warmup)
            lat[n++] = (t - t0) * 1e6 / 2;
    }
    qsort(lat, n, sizeof(*lat), cmp_double);
    return n;
}

/* Stream DATA until the time is up, then flush: messages sent, and the seconds it took. */
static uint64_t run_rate(mc_segment_id_t seg, uint8_t *buf, double secs, double *took)
{
    uint8_t id = o.verify ? MSG_DATA_CHECKED : MSG_DATA;
    atomic_int flushed = 0;
    uint64_t n = 0;
    double t0 = now_s(), end = t0 + secs;

    fill_msg(buf, o.block_size, 0, o.verify);
    while (n % 256 || now_s() < end) {
        if (o.verify)
            fill_msg(buf, o.block_size, n, true);
        else
            put_seq(buf, o.block_size, n);
        int rc = send_msg(seg, id, buf, o.block_size);
        if (rc)
            die("mc_msg_send", rc);
        n++;
    }
    int rc = mc_peer_flush(ini.e, seg, on_flushed, &flushed);
    if (rc)
        die("mc_peer_flush", rc);
    if (!wait_for(flag_set, &flushed) || atomic_load(&flushed) != 1) {
        fprintf(stderr, "mooncake-bench: the flush did not complete\n");
        exit(1);
    }
    *took = now_s() - t0;
    return n;
}

/* The transport that carried the most messages. */
static const char *carrier_of(mc_engine_t *e)
{
    static const char *const names[] = {"shm", "rdma", "tcp"};
    const char *best = "tcp";
    uint64_t most = 0;
    mc_counters_t c;

    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        if (mc_stats_transport(e, names[i], &c) == 0 && c.msgs_sent > most) {
            most = c.msgs_sent;
            best = names[i];
        }
    return best;
}

int msg_run_initiator(mc_engine_t *e, mc_segment_id_t seg)
{
    uint8_t *buf = calloc(1, o.block_size);
    double *lat = malloc(MAX_SAMPLES * sizeof(*lat)), took = 0;
    const char *verified = "ok";

    if (o.block_size > MC_MSG_MAX) {
        fprintf(stderr, "mooncake-bench: --block_size %" PRIu64 " > MC_MSG_MAX (%u)\n",
                o.block_size, MC_MSG_MAX);
        return 2;
    }
    ini.e = e;
    ini.caller = o.progress_thread == 0;
    mc_msg_handler_set(e, MSG_PONG, on_initiator_msg, NULL);
    mc_msg_handler_set(e, MSG_REPORT_ANSWER, on_initiator_msg, NULL);

    uint64_t samples = run_latency(seg, buf, o.duration / 2, lat);
    uint64_t sent = run_rate(seg, buf, o.duration / 2, &took);
    uint64_t zero = 0;
    if (send_msg(seg, MSG_REPORT, &zero, sizeof(zero)) || !wait_for(answered, NULL)) {
        fprintf(stderr, "mooncake-bench: the target did not report\n");
        exit(1);
    }
    if (ini.answer[0] != sent || ini.answer[1] || atomic_load(&ini.bad_pongs)) {
        fprintf(stderr,
                "mooncake-bench: sent %" PRIu64 ", the target received %" PRIu64 " (%" PRIu64
                " out of order or corrupt); %" PRIu64 " echoes corrupt\n",
                sent, ini.answer[0], ini.answer[1], (uint64_t)atomic_load(&ini.bad_pongs));
        verified = "FAILED";
    } else if (!o.verify) {
        verified = "counted";
    }

    const char *carrier = carrier_of(e);
    double p50 = lat[samples / 2], p99 = lat[samples * 99 / 100], rate = sent / took;
    printf("%-10s %-8s %10s %12s %12s %14s %10s\n", "operation", "protocol", "block_size",
           "lat_us_p50", "lat_us_p99", "msgs/s", "MB/s");
    printf("%-10s %-8s %10" PRIu64 " %12.2f %12.2f %14.0f %10.1f\n", "msg", carrier, o.block_size,
           p50, p99, rate, rate * o.block_size / 1e6);
    if (o.json) {
        json_t *line = json_pack("{s:s,s:s,s:s,s:I,s:f,s:f,s:f,s:I,s:I,s:s,s:s}", "operation",
                                 "msg", "protocol", carrier, "requested", o.protocol, "block_size",
                                 (json_int_t)o.block_size, "lat_us_p50", p50, "lat_us_p99", p99,
                                 "msgs_per_sec", rate, "round_trips", (json_int_t)samples,
                                 "messages", (json_int_t)sent, "progress",
                                 ini.caller ? "caller" : "thread", "verify", verified);
        print_json_line(line);
        json_decref(line);
    }
    free(buf);
    free(lat);
    return strcmp(verified, "FAILED") ? 0 : 1;
}
