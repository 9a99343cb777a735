/*
 * Fault tests: malformed input from a raw socket to a target's listening port, and a buffer
 * unregistered under a stream of writes. After each fault the target process must still be
 * alive and serve a normal engine client, and the raw client must not have changed its memory.
 *
 * The raw frames are written by hand from the wire layout (DESIGN.md "Wire protocol"): a
 * 32-byte little-endian header {u32 magic "MCTE", u8 version, u8 type, u16 flags, u32 length,
 * u32 id, u64 addr, u64 aux}. Nothing here includes an engine-internal header.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cmocka.h>

#include "harness.h"

#define WIRE_VERSION   3
#define FR_HELLO       1
#define FR_HELLO_REPLY 2
#define FR_ERROR       5
#define FR_WRITE       6
#define FR_WRITE_ACK   7
#define FR_READ        8
#define FR_READ_RESP   9
#define HDR            32
#define TBUF           (1u << 20)
#define SCRATCH        (64 * 1024) /* the first bytes of the target buffer: normal transfers land here */

static struct {
    mc_engine_t *e;
    th_target_t t;
    mc_segment_id_t seg;
    uint8_t *src, *dst;
    uint64_t rb;
    unsigned rounds;
} g;

/* The target and our engine, with one setting more (name NULL: none), for the target alone if
 * target_only. */
static int setup_cfg(const char *name, const char *value, bool target_only)
{
    th_cfg_t cfg, tcfg;
    th_target_opts_t o;

    memset(&g, 0, sizeof(g));
    th_config(&cfg);
    th_set(&cfg, "IO_TIMEOUT_MS", "1000"); /* the target drops stalled raw clients quickly */
    tcfg = cfg;
    if (name)
        th_set(&tcfg, name, "%s", value);
    th_target_opts_init(&o, &tcfg, TBUF);
    o.n_bufs = 2;
    assert_int_equal(th_target_spawn(&o, &g.t), 0);
    g.e = th_engine(target_only ? &cfg : &tcfg);
    g.seg = th_open(g.e, &g.t, 0);
    g.src = th_buf(g.e, SCRATCH);
    g.dst = th_buf(g.e, SCRATCH);
    g.rb = g.t.eng[0].buf[0];
    return 0;
}

static int setup_with(const char *name, const char *value)
{
    return setup_cfg(name, value, false);
}

static int setup(void **state)
{
    (void)state;
    return setup_with(NULL, NULL);
}

static int setup_auth(void **state)
{
    (void)state;
    return setup_with("AUTH_TOKEN", "faults-token");
}

static int setup_short_timeout(void **state)
{
    (void)state;
    return setup_with("TRANSFER_TIMEOUT", "2");
}

/* A target with the least MC_HANDSHAKE_MAX_LENGTH (a DESC_REQ is refused with an ERROR frame
 * once its descriptor is larger: buffers added grow past it); our engine has the default. */
static int setup_small_handshake(void **state)
{
    (void)state;
    return setup_cfg("HANDSHAKE_MAX_LENGTH", "4096", true);
}

static int teardown(void **state)
{
    (void)state;
    th_kill_all();
    if (g.e)
        mc_engine_destroy(g.e);
    memset(&g, 0, sizeof(g));
    return 0;
}

/* The target is alive, serves a verified round trip, and the rest of its memory is intact. */
static void target_still_serves(void)
{
    uint64_t seed = 9000 + g.rounds++;
    int status;

    assert_int_equal(waitpid(g.t.pid, &status, WNOHANG), 0);
    th_fill(g.src, SCRATCH, seed);
    assert_int_equal(th_xfer(g.e, MC_WRITE, g.src, g.seg, g.rb, SCRATCH, NULL, 0),
                     MC_TASK_COMPLETED);
    memset(g.dst, 0, SCRATCH);
    assert_int_equal(th_xfer(g.e, MC_READ, g.dst, g.seg, g.rb, SCRATCH, NULL, 0),
                     MC_TASK_COMPLETED);
    assert_int_equal(th_check(g.dst, SCRATCH, seed), -1);
    assert_int_equal(th_remote_check(&g.t, 0, g.rb + SCRATCH, TBUF - SCRATCH, 0x7a7a, SCRATCH), -1);
    assert_int_equal(th_remote_check(&g.t, 0, g.t.eng[0].buf[1], TBUF, 0x7a7b, 0), -1);
}

/* ---- raw client --------------------------------------------------------------------------- */

/* A connection to the engine listening at name ("ip:port"). */
static int raw_connect_to(const char *name)
{
    const char *colon = strrchr(name, ':');
    struct sockaddr_in sa = {.sin_family = AF_INET};
    char host[64];

    assert_non_null(colon);
    snprintf(host, sizeof(host), "%.*s", (int)(colon - name), name);
    assert_int_equal(inet_pton(AF_INET, host, &sa.sin_addr), 1);
    sa.sin_port = htons((uint16_t)atoi(colon + 1));
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    return fd;
}

static int raw_connect(void)
{
    return raw_connect_to(g.t.eng[0].name);
}

static void put(uint8_t *p, uint64_t v, int n)
{
    for (int i = 0; i < n; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t get(const uint8_t *p, int n)
{
    uint64_t v = 0;

    for (int i = 0; i < n; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}

static void hdr(uint8_t *h, uint8_t type, uint32_t len, uint32_t id, uint64_t addr, uint64_t aux)
{
    memcpy(h, "MCTE", 4);
    h[4] = WIRE_VERSION;
    h[5] = type;
    put(h + 6, 0, 2);
    put(h + 8, len, 4);
    put(h + 12, id, 4);
    put(h + 16, addr, 8);
    put(h + 24, aux, 8);
}

static void raw_send(int fd, const void *p, size_t len)
{
    assert_int_equal(send(fd, p, len, MSG_NOSIGNAL), (ssize_t)len);
}

/* Read until the target closes the connection; true if it did within timeout_ms. Whatever
 * arrives first (an ERROR frame, say) is kept in buf. */
static bool raw_closed(int fd, int timeout_ms, uint8_t *buf, size_t size, size_t *got)
{
    int64_t dl = th_now_ms() + timeout_ms;
    size_t n = 0;

    while (th_now_ms() < dl) {
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        if (poll(&pfd, 1, 100) <= 0)
            continue;
        uint8_t tmp[4096];
        ssize_t r = recv(fd, tmp, sizeof(tmp), 0);
        if (r <= 0) {
            if (got)
                *got = n;
            return true;
        }
        size_t k = (size_t)r < size - n ? (size_t)r : size - n;
        if (buf)
            memcpy(buf + n, tmp, k);
        n += k;
    }
    return false;
}

/* Read one frame (header + payload up to size) with a deadline. */
static bool raw_frame(int fd, uint8_t *h, uint8_t *payload, size_t size)
{
    int64_t dl = th_now_ms() + 10000;
    size_t need = HDR, have = 0;
    uint8_t *dst = h;

    for (int part = 0; part < 2; part++) {
        while (have < need) {
            struct pollfd pfd = {.fd = fd, .events = POLLIN};
            if (th_now_ms() > dl)
                return false;
            if (poll(&pfd, 1, 100) <= 0)
                continue;
            ssize_t r = recv(fd, dst + have, need - have, 0);
            if (r <= 0)
                return false;
            have += (size_t)r;
        }
        need = get(h + 8, 4);
        assert_true(need < size);
        dst = payload;
        have = 0;
        payload[need] = 0;
    }
    return true;
}

/* A HELLO claiming to be engine instance, asking the target to retire connections 1 to
 * n_retired of that instance. */
static size_t hello_retiring(uint8_t *p, const char *name, const char *peer, uint64_t instance,
                             unsigned n_retired)
{
    size_t n = 0;

    memset(p, 0x42, 8 + 32 + 32); /* instance, nonce, proof */
    if (n_retired)
        put(p, instance, 8);
    n = 8 + 32 + 32;
    p[n++] = (uint8_t)strlen(name);
    memcpy(p + n, name, strlen(name));
    n += strlen(name);
    p[n++] = (uint8_t)strlen(peer);
    memcpy(p + n, peer, strlen(peer));
    n += strlen(peer);
    p[n++] = (uint8_t)n_retired;
    for (unsigned i = 1; i <= n_retired; i++, n += 4)
        put(p + n, i, 4);
    return n;
}

static size_t hello_payload(uint8_t *p, const char *name, const char *peer)
{
    return hello_retiring(p, name, peer, 0, 0);
}

/* Send bytes, expect the target to drop the connection, then check it still serves. */
static void expect_dropped(const void *bytes, size_t len)
{
    int fd = raw_connect();

    raw_send(fd, bytes, len);
    assert_true(raw_closed(fd, 10000, NULL, 0, NULL));
    close(fd);
    target_still_serves();
}

/* ---- malformed input ---------------------------------------------------------------------- */

static void test_wrong_magic(void **state)
{
    uint8_t h[HDR];

    (void)state;
    target_still_serves();
    hdr(h, FR_HELLO, 0, 1, 0, 0);
    memcpy(h, "XXXX", 4);
    expect_dropped(h, sizeof(h));
}

static void test_wrong_version(void **state)
{
    uint8_t f[HDR + 256];
    size_t n = hello_payload(f + HDR, "raw-client", "");

    (void)state;
    hdr(f, FR_HELLO, (uint32_t)n, 1, 0, 0);
    f[4] = 99;
    expect_dropped(f, HDR + n);
    f[4] = 0;
    expect_dropped(f, HDR + n);
    f[4] = WIRE_VERSION - 1; /* the version before messages were answered "handled" */
    expect_dropped(f, HDR + n);
}

static void test_oversized_length(void **state)
{
    uint8_t h[HDR];

    (void)state;
    hdr(h, FR_HELLO, 0x7fffffffu, 1, 0, 0);
    expect_dropped(h, sizeof(h));
    hdr(h, FR_HELLO, 0xffffffffu, 1, 0, 0);
    expect_dropped(h, sizeof(h));
    hdr(h, FR_WRITE, (64u << 20) + 1, 1, g.rb, 0);
    expect_dropped(h, sizeof(h));
}

static void test_truncated_header(void **state)
{
    uint8_t h[HDR];

    (void)state;
    hdr(h, FR_HELLO, 40, 1, 0, 0);
    for (size_t cut = 1; cut < HDR; cut += 9) {
        int fd = raw_connect();
        raw_send(fd, h, cut);
        close(fd);
    }
    /* Half a header, then silence: others are served meanwhile. */
    int fd = raw_connect();
    raw_send(fd, h, 10);
    target_still_serves();
    /* ... and the target gives up on the stalled client after its I/O timeout. */
    assert_true(raw_closed(fd, 15000, NULL, 0, NULL));
    close(fd);
    target_still_serves();
}

static void test_garbage_before_handshake(void **state)
{
    static uint8_t junk[8192];

    (void)state;
    th_fill(junk, sizeof(junk), 666);
    expect_dropped(junk, sizeof(junk));
    memset(junk, 0, sizeof(junk));
    expect_dropped(junk, sizeof(junk));
    /* A HELLO whose name lengths run past its payload. */
    uint8_t f[HDR + 128];
    memset(f + HDR, 0xff, 128);
    hdr(f, FR_HELLO, 128, 1, 0, 0);
    expect_dropped(f, sizeof(f));
}

static void test_write_before_handshake(void **state)
{
    static uint8_t f[HDR + 4096];

    (void)state;
    hdr(f, FR_WRITE, 4096, 1, g.rb + SCRATCH + 8192, 0);
    memset(f + HDR, 0xcc, 4096);
    expect_dropped(f, sizeof(f)); /* target_still_serves checks the bytes are untouched */
    hdr(f, FR_READ, 0, 1, g.rb, 4096);
    int fd = raw_connect();
    raw_send(fd, f, HDR);
    uint8_t got[256];
    size_t n = 0;
    assert_true(raw_closed(fd, 10000, got, sizeof(got), &n));
    close(fd);
    /* No READ_RESP with data came back. */
    assert_false(n >= HDR && got[5] == FR_READ_RESP);
    target_still_serves();
}

/* A client that completes the handshake still cannot touch memory outside registrations. */
static void test_handshaken_raw_client(void **state)
{
    uint8_t f[HDR + 4096], rh[HDR], rp[2048];

    (void)state;
    int fd = raw_connect();
    size_t n = hello_payload(f + HDR, "raw-client", "");
    hdr(f, FR_HELLO, (uint32_t)n, 77, 0, 0);
    raw_send(fd, f, HDR + n);
    assert_true(raw_frame(fd, rh, rp, sizeof(rp)));
    assert_int_equal(rh[5], FR_HELLO_REPLY);
    /* Outside both registered buffers (they may be adjacent). */
    uint64_t lo = g.rb < g.t.eng[0].buf[1] ? g.rb : g.t.eng[0].buf[1];
    uint64_t hi = (g.rb > g.t.eng[0].buf[1] ? g.rb : g.t.eng[0].buf[1]) + TBUF;
    const uint64_t outside[] = {hi, lo - 4096, hi - 100, 4096};
    for (size_t i = 0; i < 4; i++) {
        hdr(f, FR_WRITE, 4096, 100 + (uint32_t)i, outside[i], 0);
        memset(f + HDR, 0xcc, 4096);
        raw_send(fd, f, sizeof(f));
        assert_true(raw_frame(fd, rh, rp, sizeof(rp)));
        assert_int_equal(rh[5], FR_WRITE_ACK);
        assert_int_equal(get(rh + 12, 4), 100 + i);
        assert_true(get(rh + 24, 8) != 0);
        assert_true(th_contains((char *)rp, "registered"));
        hdr(f, FR_READ, 0, 200 + (uint32_t)i, outside[i], 4096);
        raw_send(fd, f, HDR);
        assert_true(raw_frame(fd, rh, rp, sizeof(rp)));
        assert_int_equal(rh[5], FR_READ_RESP);
        if (get(rh + 24, 8) == 0)
            print_error("READ 0x%llx+4096 (case %zu) served %llu bytes; buffers 0x%llx 0x%llx\n",
                        (unsigned long long)outside[i], i, (unsigned long long)get(rh + 8, 4),
                        (unsigned long long)g.rb, (unsigned long long)g.t.eng[0].buf[1]);
        assert_true(get(rh + 24, 8) != 0);
    }
    close(fd);
    target_still_serves();
    /* Naming the wrong segment in HELLO is refused with an ERROR frame. */
    fd = raw_connect();
    n = hello_payload(f + HDR, "raw-client", "not-this-segment");
    hdr(f, FR_HELLO, (uint32_t)n, 78, 0, 0);
    raw_send(fd, f, HDR + n);
    uint8_t got[512];
    size_t gn = 0;
    assert_true(raw_closed(fd, 10000, got, sizeof(got), &gn));
    assert_true(gn >= HDR);
    assert_int_equal(got[5], FR_ERROR);
    close(fd);
    target_still_serves();
}

/* A DESC_REQ the target refuses (its descriptor is over its limit) while READ responses are
 * half sent (the client reads slowly): the ERROR frame goes only between frames, or not at all,
 * and the connection closes. Before, it was written at once into the middle of a READ_RESP's
 * payload, where a client took its bytes for data. */
static void test_refusal_mid_response(void **state)
{
    enum { READS = 8, FR_DESC_REQ = 11 };
    uint8_t f[HDR + 256], rh[HDR], rp[2048];
    size_t cap = READS * (HDR + TBUF) + 4096, got = 0;
    uint8_t *in = malloc(cap), *want = malloc(TBUF);
    int rb = 65536;

    (void)state;
    assert_non_null(in);
    assert_non_null(want);
    th_fill(want, TBUF, 0x7a7b);    /* the target's second buffer */
    for (int i = 0; i < 100; i++) { /* its descriptor grows past 4096 bytes */
        th_cmd_t c = {.op = TH_CMD_REGISTER, .a1 = 4096, .a2 = (uint64_t)i};
        th_reply_t rep;
        assert_int_equal(th_target_cmd(&g.t, &c, &rep, 10000), 0);
        assert_int_equal(rep.rc, 0);
    }
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_int_equal(setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rb, sizeof(rb)), 0);
    close(fd);
    fd = raw_connect();
    assert_int_equal(setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rb, sizeof(rb)), 0);
    size_t n = hello_payload(f + HDR, "raw-client", "");
    hdr(f, FR_HELLO, (uint32_t)n, 79, 0, 0);
    raw_send(fd, f, HDR + n);
    assert_true(raw_frame(fd, rh, rp, sizeof(rp)));
    assert_int_equal(rh[5], FR_HELLO_REPLY);
    for (uint32_t i = 0; i < READS; i++) {
        hdr(f, FR_READ, 0, 300 + i, g.t.eng[0].buf[1], TBUF);
        raw_send(fd, f, HDR);
    }
    th_sleep_ms(200); /* the target's socket fills: a response is half sent */
    ssize_t r = recv(fd, in, 65536, 0);
    assert_true(r > 0);
    got = (size_t)r;
    hdr(f, FR_DESC_REQ, 0, 400, 0, 0);
    raw_send(fd, f, HDR);
    size_t more = 0;
    assert_true(raw_closed(fd, 20000, in + got, cap - got, &more));
    got += more;
    close(fd);
    /* whole frames: READ_RESPs of the buffer's bytes, then perhaps an ERROR; a frame may be cut
     * short by the close, never interrupted by another */
    size_t at = 0, resps = 0;
    while (at + HDR <= got) {
        assert_memory_equal(in + at, "MCTE", 4);
        uint8_t type = in[at + 5];
        size_t len = get(in + at + 8, 4), have = got - at - HDR < len ? got - at - HDR : len;
        if (type == FR_ERROR) {
            assert_int_equal(at + HDR + len, got); /* the last thing sent */
            break;
        }
        assert_int_equal(type, FR_READ_RESP);
        assert_int_equal(len, TBUF);
        assert_memory_equal(in + at + HDR, want, have);
        resps++;
        at += HDR + len;
    }
    assert_true(resps >= 1);
    free(in);
    free(want);
    target_still_serves();
}

/* ---- a peer that answers a byte at a time ---- */

static struct {
    int lfd;
    atomic_bool stop;
} drip;

/* Accepts one connection and sends it a HELLO_REPLY header, a byte every 200 ms. */
static void *dribble(void *arg)
{
    uint8_t h[HDR];
    int fd;

    (void)arg;
    hdr(h, FR_HELLO_REPLY, 16, 1, 0, 0);
    fd = accept(drip.lfd, NULL, NULL);
    for (size_t i = 0; fd >= 0 && i < sizeof(h) && !atomic_load(&drip.stop); i++) {
        if (send(fd, h + i, 1, MSG_NOSIGNAL) != 1)
            break;
        th_sleep_ms(200);
    }
    if (fd >= 0)
        close(fd);
    return NULL;
}

/* Opening a segment by address asks it for its descriptor on a connection of its own, waiting
 * at most MC_CONNECT_TIMEOUT_MS for each frame in all: a peer that sends a byte now and then
 * does not hold the open longer (before, each byte started the wait again: 32 bytes of header
 * at 200 ms took 6 s with a timeout of 1 s). */
static void test_open_dribbling_peer(void **state)
{
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof(sa);
    char name[64];
    pthread_t t;
    th_cfg_t cfg;
    mc_segment_id_t id;

    (void)state;
    drip.lfd = socket(AF_INET, SOCK_STREAM, 0);
    assert_int_equal(bind(drip.lfd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    assert_int_equal(listen(drip.lfd, 1), 0);
    assert_int_equal(getsockname(drip.lfd, (struct sockaddr *)&sa, &len), 0);
    snprintf(name, sizeof(name), "127.0.0.1:%u", ntohs(sa.sin_port));
    atomic_store(&drip.stop, false);
    assert_int_equal(pthread_create(&t, NULL, dribble, NULL), 0);
    th_config(&cfg);
    th_set(&cfg, "METADATA", "none");
    th_set(&cfg, "CONNECT_TIMEOUT_MS", "1000");
    mc_engine_t *e = th_engine(&cfg);
    int64_t t0 = th_now_ms();
    int rc = mc_segment_open(e, name, &id);
    int64_t took = th_now_ms() - t0;
    atomic_store(&drip.stop, true);
    assert_int_equal(pthread_join(t, NULL), 0);
    close(drip.lfd);
    mc_engine_destroy(e);
    assert_int_equal(rc, -MC_ETIMEOUT);
    if (took > 4000)
        fail_msg("the open took %lld ms with MC_CONNECT_TIMEOUT_MS=1000", (long long)took);
}

/* With MC_AUTH_TOKEN set, a client that never proves the token claims our engine's instance
 * (which any engine tells in its HELLO_REPLY) and asks the target to retire our connections.
 * They must survive: the retire list counts only once the handshake is done. */
static void test_unauthenticated_retire(void **state)
{
    uint8_t f[HDR + 1024], rh[HDR], rp[2048];
    mc_rail_stats_t r0[4], r1[4];
    mc_counters_t c0, c1;
    size_t n0, n1;

    (void)state;
    target_still_serves(); /* our connections to the target are up */
    assert_int_equal(mc_stats_rails(g.e, g.seg, r0, 4, &n0), 0);
    assert_int_equal(mc_stats_peer(g.e, g.seg, &c0), 0);
    assert_true(n0 >= 1 && r0[0].conns >= 1);
    /* Our instance, as our own listener tells anyone who says HELLO. */
    int fd = raw_connect_to(mc_engine_segment_name(g.e));
    size_t n = hello_payload(f + HDR, "raw-client", "");
    hdr(f, FR_HELLO, (uint32_t)n, 1, 0, 0);
    raw_send(fd, f, HDR + n);
    assert_true(raw_frame(fd, rh, rp, sizeof(rp)));
    assert_int_equal(rh[5], FR_HELLO_REPLY);
    uint64_t instance = get(rp, 8);
    close(fd);
    /* The forged HELLO: answered (the target asks for the proof), never followed by one. */
    fd = raw_connect();
    n = hello_retiring(f + HDR, "forger", "", instance, 64);
    hdr(f, FR_HELLO, (uint32_t)n, 1, 0, 0);
    raw_send(fd, f, HDR + n);
    assert_true(raw_frame(fd, rh, rp, sizeof(rp)));
    assert_int_equal(rh[5], FR_HELLO_REPLY);
    usleep(300 * 1000);
    assert_int_equal(mc_stats_rails(g.e, g.seg, r1, 4, &n1), 0);
    assert_int_equal(mc_stats_peer(g.e, g.seg, &c1), 0);
    assert_int_equal(r1[0].conns, r0[0].conns);
    assert_int_equal(c1.errors, c0.errors);
    close(fd);
    target_still_serves();
    assert_int_equal(mc_stats_peer(g.e, g.seg, &c1), 0);
    assert_int_equal(c1.errors, c0.errors);
    assert_int_equal(c1.retries, c0.retries);
}

/* ---- unregister under load ---------------------------------------------------------------- */

static void test_unregister_while_writing(void **state)
{
    const size_t sz = 64 * 1024, per = 8;
    uint64_t tb = g.t.eng[0].buf[1];
    uint8_t *src = th_buf(g.e, per * sz);
    mc_request_t reqs[8];
    th_reply_t r;
    int phase = 0, after = 0; /* 0 before the command, 1 in flight, 2 once it returned */
    size_t completed = 0, failed = 0;

    (void)state;
    th_fill(src, per * sz, 4321);
    for (size_t i = 0; i < per; i++)
        reqs[i] = (mc_request_t){.opcode = MC_WRITE,
                                 .local = src + i * sz,
                                 .target = g.seg,
                                 .target_offset = tb + i * sz,
                                 .length = sz};
    for (int iter = 0; iter < 2000 && after < 10; iter++) {
        mc_batch_t *b;
        if (iter == 10) {
            th_cmd_t c = {.op = TH_CMD_UNREGISTER, .a0 = 1};
            assert_int_equal(th_target_send(&g.t, &c), 0);
            phase = 1;
        }
        assert_int_equal(mc_batch_create(g.e, per, &b), 0);
        assert_int_equal(mc_batch_submit(b, reqs, per, NULL), 0);
        assert_int_equal(mc_batch_wait(b, 30000), 0);
        for (size_t i = 0; i < per; i++) {
            mc_task_status_t ts;
            assert_int_equal(mc_task_status(b, i, &ts), 0);
            if (phase == 0 || ts.state == MC_TASK_COMPLETED)
                assert_int_equal(ts.state, MC_TASK_COMPLETED);
            if (phase == 2 || ts.state != MC_TASK_COMPLETED) {
                assert_int_equal(ts.state, MC_TASK_FAILED);
                assert_true(th_contains(ts.reason, "registered"));
            }
            ts.state == MC_TASK_COMPLETED ? completed++ : failed++;
        }
        th_batch_destroy(g.e, b);
        struct pollfd pfd = {.fd = g.t.sock, .events = POLLIN};
        if (phase == 1 && poll(&pfd, 1, 0) > 0) {
            assert_int_equal(th_target_recv(&g.t, &r, 1000), 0);
            assert_int_equal(r.rc, 0);
            phase = 2;
        }
        after += phase == 2;
    }
    if (phase == 1) { /* the writes finished first; the unregister must still return */
        assert_int_equal(th_target_recv(&g.t, &r, 40000), 0);
        assert_int_equal(r.rc, 0);
    }
    assert_true(completed >= 10 * per);
    assert_true(failed > 0);
    /* Buffer 1 holds the last completed write and nothing else changed. */
    assert_int_equal(th_remote_check(&g.t, 0, tb, per * sz, 4321, 0), -1);
    assert_int_equal(th_remote_check(&g.t, 0, tb + per * sz, TBUF - per * sz, 0x7a7b, per * sz),
                     -1);
    int status;
    assert_int_equal(waitpid(g.t.pid, &status, WNOHANG), 0);
    th_buf_free(g.e, src, per * sz);
    /* Buffer 0 still serves (target_still_serves would also check buffer 1's original bytes,
     * which the completed writes changed). */
    th_fill(g.src, SCRATCH, 1);
    assert_int_equal(th_xfer(g.e, MC_WRITE, g.src, g.seg, g.rb, SCRATCH, NULL, 0),
                     MC_TASK_COMPLETED);
    assert_int_equal(th_remote_check(&g.t, 0, g.rb, SCRATCH, 1, 0), -1);
}

/* Two clients keep buffer 1 in use after the target unregisters it: one sends a WRITE into it
 * a byte every 300 ms (never stalling long enough to be dropped for that), the other asks for
 * READs of it and never reads the answers. The unregister must still succeed, in about the
 * transfer timeout (2 s here), by dropping both; and buffer 0 still serves. */
static void test_unregister_held_by_peers(void **state)
{
    uint8_t f[HDR + 1024], rh[HDR], rp[2048];
    uint64_t tb = g.t.eng[0].buf[1];
    int fd[2];
    th_reply_t r;

    (void)state;
    for (int i = 0; i < 2; i++) {
        fd[i] = raw_connect();
        size_t n = hello_payload(f + HDR, "raw-client", "");
        hdr(f, FR_HELLO, (uint32_t)n, 1, 0, 0);
        raw_send(fd[i], f, HDR + n);
        assert_true(raw_frame(fd[i], rh, rp, sizeof(rp)));
        assert_int_equal(rh[5], FR_HELLO_REPLY);
    }
    hdr(f, FR_WRITE, TBUF, 10, tb, 0);
    raw_send(fd[0], f, HDR);
    raw_send(fd[0], "\x01", 1);
    for (uint32_t i = 0; i < 64; i++) { /* 64 MiB of answers: far more than the socket takes */
        hdr(f, FR_READ, 0, 100 + i, tb, TBUF);
        raw_send(fd[1], f, HDR);
    }
    usleep(200 * 1000); /* the target has the WRITE's header and the READs */
    th_cmd_t c = {.op = TH_CMD_UNREGISTER, .a0 = 1};
    int64_t t0 = th_now_ms();
    assert_int_equal(th_target_send(&g.t, &c), 0);
    bool cut = false;
    while (th_target_recv(&g.t, &r, 300) != 0) {
        assert_true(th_now_ms() - t0 < 15000);
        if (send(fd[0], "\x02", 1, MSG_NOSIGNAL) != 1)
            cut = true;
    }
    int64_t took = th_now_ms() - t0;
    if (r.rc)
        print_error("unregister: %lld (%s) after %lld ms\n", (long long)r.rc, r.msg,
                    (long long)took);
    assert_int_equal(r.rc, 0);
    assert_true(took >= 1500 && took < 6000);
    /* Both connections are gone (the writer may have learnt it from a failed send). */
    assert_true(cut || raw_closed(fd[0], 5000, NULL, 0, NULL));
    assert_true(raw_closed(fd[1], 5000, NULL, 0, NULL));
    close(fd[0]);
    close(fd[1]);
    int status;
    assert_int_equal(waitpid(g.t.pid, &status, WNOHANG), 0);
    th_fill(g.src, SCRATCH, 3);
    assert_int_equal(th_xfer(g.e, MC_WRITE, g.src, g.seg, g.rb, SCRATCH, NULL, 0),
                     MC_TASK_COMPLETED);
    assert_int_equal(th_remote_check(&g.t, 0, g.rb, SCRATCH, 3, 0), -1);
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_wrong_magic, setup, teardown),
        cmocka_unit_test_setup_teardown(test_wrong_version, setup, teardown),
        cmocka_unit_test_setup_teardown(test_oversized_length, setup, teardown),
        cmocka_unit_test_setup_teardown(test_truncated_header, setup, teardown),
        cmocka_unit_test_setup_teardown(test_garbage_before_handshake, setup, teardown),
        cmocka_unit_test_setup_teardown(test_write_before_handshake, setup, teardown),
        cmocka_unit_test_setup_teardown(test_handshaken_raw_client, setup, teardown),
        cmocka_unit_test(test_open_dribbling_peer),
        cmocka_unit_test_setup_teardown(test_refusal_mid_response, setup_small_handshake, teardown),
        cmocka_unit_test_setup_teardown(test_unregister_while_writing, setup, teardown),
        cmocka_unit_test_setup_teardown(test_unauthenticated_retire, setup_auth, teardown),
        cmocka_unit_test_setup_teardown(test_unregister_held_by_peers, setup_short_timeout,
                                        teardown),
    };

    th_main(argc, argv);
    return cmocka_run_group_tests_name("faults", tests, NULL, NULL);
}
