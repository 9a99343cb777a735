/*
 * Messages and notifications: exactly once and in order while connections are killed under
 * them (ss -K, as root), every unacknowledged one reported when the peer dies, flush, standalone
 * and batch notifications, back-pressure from a receiver that does not keep up, and a destroy
 * that waits for its peer to take what it sent (MC_LINGER_MS).
 *
 * TH_TRANSPORT picks what carries them: tcp (the default: MC_FORCE_TCP=1 on both sides), shm
 * (same-host peers: the shared-memory ring) or rdma (MC_PROTOCOL=rdma: the ring written with
 * RDMA WRITE, on the software RDMA device; the first messages go over tcp while its QP is set
 * up). TH_MESSAGES sets how many messages the first test
 * sends (default 10^6). Targets run in child processes (harness.c) on loopback.
 */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
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
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cmocka.h>

#include "harness.h"

static struct {
    mc_engine_t *e, *e2; /* the engines of a test, destroyed by the teardown */
    th_target_t t;
} g;

/* The killer (connections killed, the target stopped, while messages flow) running now, if
 * any: the teardown stops it when its test failed, since an assertion leaves the test before
 * the test's own stop. Killers are static: one outlives its test's stack frame. */
typedef struct killer killer_t;
static killer_t *running_killer;
static void killer_stop(killer_t *k);

static int teardown(void **state)
{
    (void)state;
    killer_stop(running_killer);
    th_kill_all();
    if (g.e)
        mc_engine_destroy(g.e);
    if (g.e2)
        mc_engine_destroy(g.e2);
    memset(&g, 0, sizeof(g));
    return 0;
}

/* The transport under test: tcp, shm or rdma. */
static const char *transport(void)
{
    const char *v = getenv("TH_TRANSPORT");

    return v && (!strcmp(v, "shm") || !strcmp(v, "rdma")) ? v : "tcp";
}

static bool over_tcp(void)
{
    return !strcmp(transport(), "tcp");
}

static bool over_rdma(void)
{
    return !strcmp(transport(), "rdma");
}

/* Test settings for the transport under test. */
static void config(th_cfg_t *cfg)
{
    th_config(cfg);
    if (over_tcp())
        th_set(cfg, "FORCE_TCP", "1");
    if (over_rdma())
        th_set(cfg, "PROTOCOL", "rdma");
}

/* How many messages went over transport name (NULL: the one under test). */
static uint64_t carried_by(mc_engine_t *e, const char *name)
{
    mc_counters_t c;

    assert_int_equal(mc_stats_transport(e, name ? name : transport(), &c), 0);
    return c.msgs_sent;
}

static uint64_t carried(mc_engine_t *e)
{
    return carried_by(e, NULL);
}

static th_target_t *spawn(const th_cfg_t *cfg, size_t len)
{
    th_target_opts_t o;

    th_target_opts_init(&o, cfg, len);
    assert_int_equal(th_target_spawn(&o, &g.t), 0);
    return &g.t;
}

/* Completion callbacks: how many with each outcome. */
typedef struct done {
    atomic_uint ok, failed;
    atomic_int last_error;
} done_t;

static void on_done(void *arg, int status)
{
    done_t *d = arg;

    atomic_fetch_add(status == 0 ? &d->ok : &d->failed, 1);
    if (status)
        atomic_store(&d->last_error, status);
}

typedef struct flushed {
    atomic_int status;
    atomic_bool done;
} flushed_t;

static void on_flushed(void *arg, int status)
{
    flushed_t *f = arg;

    atomic_store(&f->status, status);
    atomic_store(&f->done, true);
}

/* Flush the peer and wait (up to 30 s) for the callback: its status. */
static int flush_wait(mc_engine_t *e, mc_segment_id_t id)
{
    static flushed_t f;

    memset(&f, 0, sizeof(f));
    assert_int_equal(mc_peer_flush(e, id, on_flushed, &f), 0);
    int64_t dl = th_now_ms() + 30000;
    while (!atomic_load(&f.done) && th_now_ms() < dl)
        th_sleep_ms(1);
    assert_true(atomic_load(&f.done));
    return atomic_load(&f.status);
}

/* Message n of the stream the target checks (harness.c): u32 n then stream 1000 + n. */
static size_t make_msg(uint8_t *buf, uint32_t n, size_t len)
{
    uint8_t head[4];

    memcpy(head, &n, 4);
    memcpy(buf, head, len < 4 ? len : 4);
    if (len > 4)
        th_fill(buf + 4, len - 4, 1000 + n);
    return len;
}

/* Send, driving progress while the window is full (bounded). */
static int send_msg(mc_engine_t *e, mc_segment_id_t id, uint8_t mid, const void *buf, size_t len,
                    const mc_msg_opts_t *o)
{
    int64_t dl = th_now_ms() + 30000;
    int rc;

    while ((rc = mc_msg_send_ex(e, id, mid, buf, len, o)) == -EAGAIN && th_now_ms() < dl)
        mc_engine_progress(e);
    return rc;
}

/* ---- exactly once while connections die ----------------------------------------------------- */

struct killer {
    pthread_t thr;
    unsigned port;   /* 0: no connections to kill */
    unsigned port2;  /* and those to or from this one too (0: none) */
    pid_t pid;       /* the target, stopped now and then */
    const char *ctl; /* rdma: the software devices' control dir (both processes use it) */
    atomic_bool stop;
    unsigned rounds, killed, stops, downs, drops;
};

/* Every few milliseconds, kill every established connection to or from the port (both ends,
 * both processes): what was in flight on them is lost; or stop the target for a few
 * milliseconds (a receiver that does not progress: the sender fills up and waits). Over rdma
 * also: the first device's port down for a few milliseconds (its QPs fail, the second device
 * takes over), or 10% of its packets dropped (retransmitted). */
static void *killer_main(void *arg)
{
    killer_t *k = arg;
    char cmd[160], line[512];
    unsigned r = 12345;

    snprintf(cmd, sizeof(cmd),
             "ss -HK state established '( sport = :%u or dport = :%u or sport = :%u or dport = "
             ":%u )' 2>/dev/null",
             k->port, k->port, k->port2 ? k->port2 : k->port, k->port2 ? k->port2 : k->port);
    while (!atomic_load(&k->stop)) {
        r = r * 1103515245 + 12345;
        th_sleep_ms(2 + (int)((r >> 16) % 40));
        if (k->ctl && (r >> 8) % 8 >= 6) {
            bool down = (r >> 8) % 8 == 6;
            th_sv_ctl(k->ctl, "softverbs0", down ? "port=down\n" : "drop=10\n");
            th_sleep_ms(2 + (int)((r >> 12) % 20));
            th_sv_ctl(k->ctl, "softverbs0", "port=up\n");
            *(down ? &k->downs : &k->drops) += 1;
            continue;
        }
        if (!k->port || (r >> 8) % 4 == 0) {
            kill(k->pid, SIGSTOP);
            th_sleep_ms(1 + (int)((r >> 12) % 20));
            kill(k->pid, SIGCONT);
            k->stops++;
            continue;
        }
        FILE *f = popen(cmd, "r");
        if (!f)
            continue;
        while (fgets(line, sizeof(line), f))
            k->killed++;
        pclose(f);
        k->rounds++;
    }
    return NULL;
}

static void killer_start(killer_t *k)
{
    assert_true(k->pid > 0);
    atomic_store(&k->stop, false);
    assert_int_equal(pthread_create(&k->thr, NULL, killer_main, k), 0);
    running_killer = k;
}

static void killer_stop(killer_t *k)
{
    if (!k || k != running_killer)
        return;
    atomic_store(&k->stop, true);
    pthread_join(k->thr, NULL);
    running_killer = NULL;
}

static unsigned n_messages(void)
{
    const char *v = getenv("TH_MESSAGES");
    return v && atoi(v) > 0 ? (unsigned)atoi(v) : 1000000;
}

/* A target and our engine (g.e) for a test whose connections may be killed: a patient connect.
 * The target's segment id. */
static mc_segment_id_t start_pair(th_target_t **t_p)
{
    th_cfg_t cfg;

    config(&cfg);
    th_set(&cfg, "CONNECT_TIMEOUT_MS", "10000");
    *t_p = spawn(&cfg, 4096);
    g.e = th_engine(&cfg);
    return th_open(g.e, *t_p, 0);
}

/* The length of message i: log-uniform from 0 B to 64 KiB (most are small, as control messages
 * are), every 97th empty. */
static size_t msg_len(unsigned *rnd, uint32_t i)
{
    *rnd = *rnd * 1103515245 + 12345;
    unsigned bits = (*rnd >> 8) % 17;
    size_t len = ((*rnd >> 13) & ((1u << bits) - 1)) + (bits ? 1u << (bits - 1) : 0);
    return len > MC_MSG_MAX ? MC_MSG_MAX : i % 97 == 0 ? 0 : len;
}

/* Random sizes from 0 B to 64 KiB (log-uniform, so most are small, as control messages are),
 * to a target whose handler checks each one's number and bytes, while connections are killed
 * (tcp) and the target is stopped at random: every message arrives once, in order, intact, and
 * every send completes with 0. */
static void test_exactly_once(void **state)
{
    const unsigned n = n_messages();
    static uint8_t buf[MC_MSG_MAX];
    static done_t d;
    static killer_t k;
    memset(&k, 0, sizeof(k));
    th_reply_t r;
    th_target_t *t;
    unsigned rnd = 777;
    uint64_t bytes = 0;

    (void)state;
    mc_segment_id_t id = start_pair(&t);
    mc_engine_t *e = g.e;
    memset(&d, 0, sizeof(d));

    /* over rdma, a killed control link takes the QPs set up over it, and their messages go back
     * to tcp until a new QP is up */
    bool kill_conns = !strcmp(transport(), "shm")
                          ? false
                          : geteuid() == 0 && (k.port = th_listen_port(t->pid)) != 0;
    if (!kill_conns && strcmp(transport(), "shm"))
        print_message("  not root (or no ss): no connections killed\n");
    k.pid = t->pid;
    char ctl[512];
    if (over_rdma() && getenv("SOFTVERBS_CTL_DIR")) {
        mkdir(getenv("SOFTVERBS_CTL_DIR"), 0755); /* the device may have made it already */
        k.ctl = getenv("SOFTVERBS_CTL_DIR");
        snprintf(ctl, sizeof(ctl), "%s/softverbs0", k.ctl);
    }
    killer_start(&k);
    int64_t t0 = th_now_ms();
    mc_msg_opts_t o = {.size = sizeof(o), .cb = on_done, .cb_arg = &d};
    for (uint32_t i = 0; i < n; i++) {
        size_t len = msg_len(&rnd, i);
        make_msg(buf, i, len);
        bytes += len;
        int rc = send_msg(e, id, TH_MSG_ID, buf, len, &o);
        if (rc)
            print_error("send %u: %s (%s)\n", i, mc_err_name(rc), mc_last_error());
        assert_int_equal(rc, 0);
    }
    th_cmd_t c = {.op = TH_CMD_MSGS, .a0 = n, .a3 = 120000};
    assert_int_equal(th_target_cmd(t, &c, &r, 150000), 0);
    int64_t dl = th_now_ms() + 30000;
    while (atomic_load(&d.ok) + atomic_load(&d.failed) < n && th_now_ms() < dl)
        th_sleep_ms(1);
    killer_stop(&k);
    if (k.ctl) {
        print_message("  the first RDMA port went down %u times, dropped packets %u times\n",
                      k.downs, k.drops);
        unlink(ctl);
    }
    print_message("  %u messages (%.1f MiB) in %lld ms, %u kill rounds killed %u connections, "
                  "%u stops\n",
                  n, bytes / 1048576.0, (long long)(th_now_ms() - t0), k.rounds, k.killed, k.stops);
    if (r.v[0] != n || r.v[1] || r.v[2] || r.v[3])
        print_error("received %lld, out of order %lld, bad payload %lld, bad sender %lld\n",
                    (long long)r.v[0], (long long)r.v[1], (long long)r.v[2], (long long)r.v[3]);
    assert_int_equal(r.v[0], n);
    assert_int_equal(r.v[1], 0);
    assert_int_equal(r.v[2], 0);
    assert_int_equal(r.v[3], 0);
    assert_int_equal(atomic_load(&d.ok), n);
    assert_int_equal(atomic_load(&d.failed), 0);
    if (over_rdma()) { /* tcp carries them while no QP is up */
        print_message("  over rdma %llu, over tcp %llu\n", (unsigned long long)carried(e),
                      (unsigned long long)carried_by(e, "tcp"));
        assert_int_equal(carried(e) + carried_by(e, "tcp"), n);
        assert_true(carried(e) > 0);
    } else {
        assert_int_equal(carried(e), n); /* all of them over the transport under test */
    }
    if (kill_conns)
        assert_true(k.killed > 0);
    /* Nothing more arrives afterwards (no late duplicate). */
    th_sleep_ms(200);
    c.a3 = 0;
    assert_int_equal(th_target_cmd(t, &c, &r, 10000), 0);
    assert_int_equal(r.v[0], n);
    assert_int_equal(r.v[1], 0);
    th_close(e, id);
}

/* ---- both ways ------------------------------------------------------------------------------ */

static struct {
    atomic_uint received, bad;
    uint32_t *lens; /* the length of each message sent */
} echoes;

/* Echo n must be message n, whole. */
static void on_echo(void *arg, const char *sender, uint8_t id, const void *data, size_t len)
{
    uint32_t n = atomic_load(&echoes.received);

    (void)arg;
    (void)sender;
    if (id != TH_ECHO_ID || len != echoes.lens[n] || (len && memcmp(data, &n, len < 4 ? len : 4)) ||
        (len > 4 && th_check((const uint8_t *)data + 4, len - 4, 1000 + n) >= 0))
        atomic_fetch_add(&echoes.bad, 1);
    atomic_store(&echoes.received, n + 1);
}

/* Whether message i of len bytes may go: fewer than window unechoed, and their bytes and its
 * own within a quarter of MC_MSG_WINDOW_BYTES. The target's window for the echoes also holds
 * those we took and have not answered yet (an answer waits for a connection that was killed):
 * the slack keeps it from filling, as window (256) does for MC_MSG_WINDOW. */
static bool echo_room(uint32_t i, size_t len, unsigned window)
{
    uint32_t from = atomic_load(&echoes.received);
    size_t bytes = len;

    if (i - from >= window)
        return false;
    for (uint32_t j = from; j < i; j++)
        bytes += echoes.lens[j];
    return i == from || bytes <= MC_MSG_WINDOW_BYTES / 4;
}

/* Both engines send: the target's handler sends every message back as it gets it, while the
 * connections both ways are killed (tcp, rdma) and the target is stopped at random. Over tcp
 * both directions then share one connection (the reply travels with the answer): every message
 * and every echo arrives once, in order, intact. */
static void test_both_ways(void **state)
{
    const unsigned n = n_messages() / 10, window = 256;
    static uint8_t buf[MC_MSG_MAX];
    static killer_t k;
    memset(&k, 0, sizeof(k));
    th_reply_t r;
    th_target_t *t;
    unsigned rnd = 4242;

    (void)state;
    mc_segment_id_t id = start_pair(&t);
    mc_engine_t *e = g.e;
    memset(&echoes, 0, sizeof(echoes));
    echoes.lens = calloc(n, sizeof(*echoes.lens));
    assert_non_null(echoes.lens);
    assert_int_equal(mc_msg_handler_set(e, TH_ECHO_ID, on_echo, NULL), 0);
    th_cmd_t c = {.op = TH_CMD_ECHO, .a0 = 1};
    assert_int_equal(th_target_cmd(t, &c, &r, 10000), 0);

    if (strcmp(transport(), "shm") && geteuid() == 0) {
        k.port = th_listen_port(t->pid);
        k.port2 = th_listen_port(getpid());
    }
    k.pid = t->pid;
    killer_start(&k);
    int64_t t0 = th_now_ms();
    for (uint32_t i = 0; i < n; i++) {
        size_t len = msg_len(&rnd, i);
        echoes.lens[i] = (uint32_t)len;
        make_msg(buf, i, len);
        /* at most `window` unechoed, and their bytes within a quarter of
         * MC_MSG_WINDOW_BYTES, so the target's own window never fills */
        int64_t dl = th_now_ms() + 60000;
        while (!echo_room(i, len, window) && th_now_ms() < dl)
            mc_engine_progress(e);
        assert_int_equal(send_msg(e, id, TH_MSG_ID, buf, len, NULL), 0);
    }
    int64_t dl = th_now_ms() + 60000;
    while (atomic_load(&echoes.received) < n && th_now_ms() < dl)
        th_sleep_ms(1);
    killer_stop(&k);
    print_message("  %u messages each way in %lld ms, %u connections killed, %u stops, over "
                  "tcp %llu\n",
                  n, (long long)(th_now_ms() - t0), k.killed, k.stops,
                  (unsigned long long)carried_by(e, "tcp"));
    c = (th_cmd_t){.op = TH_CMD_MSGS, .a0 = n, .a3 = 30000};
    assert_int_equal(th_target_cmd(t, &c, &r, 40000), 0);
    assert_int_equal(r.v[0], n);
    assert_int_equal(r.v[1] + r.v[2] + r.v[3], 0);
    c = (th_cmd_t){.op = TH_CMD_STATS};
    assert_int_equal(th_target_cmd(t, &c, &r, 10000), 0);
    assert_int_equal(r.v[5], 0); /* every echo was accepted for sending */
    assert_int_equal(atomic_load(&echoes.received), n);
    assert_int_equal(atomic_load(&echoes.bad), 0);
    th_sleep_ms(200); /* and none twice */
    assert_int_equal(atomic_load(&echoes.received), n);
    if (k.port)
        assert_true(k.killed > 0);
    c = (th_cmd_t){.op = TH_CMD_ECHO, .a0 = 0};
    assert_int_equal(th_target_cmd(t, &c, &r, 10000), 0);
    th_close(e, id);
    free(echoes.lens);
    echoes.lens = NULL;
}

/* A peer opened by its address gets messages at once, while it is OPENING: those go over tcp
 * (its descriptor, and so its shm socket, is not known yet); once they are answered the rest
 * may go through the ring. Every one arrives once, in order, and the two carriers' counts add
 * up. */
static void test_carrier_switch(void **state)
{
    const unsigned n = 50000;
    uint8_t buf[300];
    th_cfg_t cfg;
    th_reply_t r;
    mc_segment_id_t id;
    mc_counters_t tcp, ring;

    (void)state;
    config(&cfg);
    th_target_t *t = spawn(&cfg, 4096);
    mc_engine_t *e = g.e = th_engine(&cfg);
    th_cmd_t c = {.op = TH_CMD_ADDRESS};
    assert_int_equal(th_target_cmd(t, &c, &r, 10000), 0);
    assert_int_equal(mc_segment_open_address(e, r.msg, (size_t)r.v[0], &id), 0);
    for (uint32_t i = 0; i < n; i++)
        assert_int_equal(send_msg(e, id, TH_MSG_ID, buf, make_msg(buf, i, 1 + i % 300), NULL), 0);
    c = (th_cmd_t){.op = TH_CMD_MSGS, .a0 = n, .a3 = 60000};
    assert_int_equal(th_target_cmd(t, &c, &r, 70000), 0);
    assert_int_equal(r.v[0], n);
    assert_int_equal(r.v[1] + r.v[2] + r.v[3], 0);
    assert_int_equal(flush_wait(e, id), 0);
    assert_int_equal(mc_stats_transport(e, "tcp", &tcp), 0);
    assert_int_equal(mc_stats_transport(e, over_tcp() ? "shm" : transport(), &ring), 0);
    print_message("  over tcp %llu, through the ring %llu\n", (unsigned long long)tcp.msgs_sent,
                  (unsigned long long)ring.msgs_sent);
    assert_int_equal(tcp.msgs_sent + ring.msgs_sent, n);
    if (!over_tcp())
        assert_true(ring.msgs_sent > 0);
    th_close(e, id);
}

/* ---- a ring cut with records in it ----------------------------------------------------------- */

/* Our Unix-domain sockets connected to a named peer (as the ones to a target's shm socket are),
 * as a bitmap of fd numbers below 1024. */
static void unix_conns(uint8_t map[128])
{
    memset(map, 0, 128);
    for (int fd = 0; fd < 1024; fd++) {
        struct sockaddr_un a;
        socklen_t alen = sizeof(a);
        int domain;
        socklen_t dlen = sizeof(domain);
        if (getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &domain, &dlen) == 0 && domain == AF_UNIX &&
            getpeername(fd, (struct sockaddr *)&a, &alen) == 0 && alen > sizeof(sa_family_t))
            map[fd / 8] |= (uint8_t)(1u << (fd % 8));
    }
}

/* Drive a caller-progress engine until n sends completed (d), up to 30 s. */
static void progress_until_done(mc_engine_t *e, done_t *d, unsigned n)
{
    int64_t dl = th_now_ms() + 30000;

    while (atomic_load(&d->ok) + atomic_load(&d->failed) < n && th_now_ms() < dl)
        mc_engine_progress(e);
}

/* Same-host messages that a caller-progress host sends go from its bytes straight into the
 * ring, which then holds their only copy. The target is stopped before the first message, so
 * that the ring it is handed is not attached yet when 400 messages are written into it; the
 * ring's connection is then shut (as a killed socket would be), and the target, continued,
 * finds the ring and the end of its connection together and drops it unread. The 400 are sent
 * again over tcp from the copies the sender took out of the ring, and every one arrives once,
 * in order, intact. */
static void test_ring_cut(void **state)
{
    const unsigned n = 400;
    static uint8_t buf[2048];
    static done_t d;
    uint8_t before[128], after[128];
    th_cfg_t cfg;
    th_reply_t r;
    int chan = -1, st;

    (void)state;
    if (strcmp(transport(), "shm"))
        skip(); /* the ring is shm's */
    memset(&d, 0, sizeof(d));
    config(&cfg);
    th_set(&cfg, "PROGRESS_THREAD", "0");
    th_target_t *t = spawn(&cfg, 4096);
    mc_engine_t *e = g.e = th_engine(&cfg);
    mc_segment_id_t id = th_open(e, t, 0);
    mc_msg_opts_t o = {.size = sizeof(o), .cb = on_done, .cb_arg = &d};

    assert_int_equal(kill(t->pid, SIGSTOP), 0);
    assert_int_equal(waitpid(t->pid, &st, WUNTRACED), t->pid);
    assert_true(WIFSTOPPED(st));
    /* The first message opens the ring: its connection is the one Unix socket that is new. */
    unix_conns(before);
    for (uint32_t i = 0; i < n; i++)
        assert_int_equal(send_msg(e, id, TH_MSG_ID, buf, make_msg(buf, i, 256 + i * 3 % 1500), &o),
                         0);
    unix_conns(after);
    for (int fd = 0; fd < 1024; fd++)
        if ((after[fd / 8] & ~before[fd / 8]) & (1u << (fd % 8))) {
            assert_int_equal(chan, -1);
            chan = fd;
        }
    assert_true(chan >= 0);
    mc_engine_progress(e);
    assert_int_equal(carried(e) + carried_by(e, "tcp"), 0); /* none taken yet */
    assert_int_equal(shutdown(chan, SHUT_RDWR), 0);
    assert_int_equal(kill(t->pid, SIGCONT), 0);
    progress_until_done(e, &d, n);
    th_cmd_t c = {.op = TH_CMD_MSGS, .a0 = n, .a3 = 30000};
    assert_int_equal(th_target_cmd(t, &c, &r, 40000), 0);
    if (r.v[0] != n || r.v[1] || r.v[2] || r.v[3])
        print_error("received %lld, out of order %lld, bad payload %lld, bad sender %lld\n",
                    (long long)r.v[0], (long long)r.v[1], (long long)r.v[2], (long long)r.v[3]);
    assert_int_equal(r.v[0], n);
    assert_int_equal(r.v[1] + r.v[2] + r.v[3], 0);
    assert_int_equal(atomic_load(&d.ok), n);
    assert_int_equal(atomic_load(&d.failed), 0);
    print_message("  through the ring %llu, over tcp after the cut %llu\n",
                  (unsigned long long)carried(e), (unsigned long long)carried_by(e, "tcp"));
    assert_int_equal(carried(e), 0);
    assert_int_equal(carried_by(e, "tcp"), n);
    /* Nothing more arrives afterwards (no late duplicate). */
    th_sleep_ms(200);
    c.a3 = 0;
    assert_int_equal(th_target_cmd(t, &c, &r, 10000), 0);
    assert_int_equal(r.v[0], n);
    assert_int_equal(r.v[1] + r.v[2] + r.v[3], 0);
    th_close(e, id);
}

/* ---- a peer that dies with messages outstanding --------------------------------------------- */

typedef struct events {
    atomic_uint dead;
    char reason[256];
} events_t;

static void on_event(void *arg, mc_segment_id_t id, mc_peer_event_t ev, int error,
                     const char *reason)
{
    events_t *x = arg;

    (void)id;
    (void)error;
    if (ev == MC_PEER_DEAD) {
        snprintf(x->reason, sizeof(x->reason), "%s", reason);
        atomic_fetch_add(&x->dead, 1);
    }
}

/* Each of n messages (completions in d) and the flush after them (fd) fail with -MC_EPEERDEAD
 * within timeout_ms, and the DEAD event (ev) comes once. */
static void expect_lost(done_t *d, done_t *fd, events_t *ev, unsigned n, int64_t t0, int timeout_ms)
{
    int64_t dl = th_now_ms() + timeout_ms;

    while ((atomic_load(&d->failed) < n || !atomic_load(&fd->failed) || !atomic_load(&ev->dead)) &&
           th_now_ms() < dl)
        th_sleep_ms(1);
    print_message("  reported after %lld ms: %s\n", (long long)(th_now_ms() - t0), ev->reason);
    assert_int_equal(atomic_load(&d->ok), 0);
    assert_int_equal(atomic_load(&d->failed), n);
    assert_int_equal(atomic_load(&d->last_error), -MC_EPEERDEAD);
    assert_int_equal(atomic_load(&fd->failed), 1);
    assert_int_equal(atomic_load(&fd->last_error), -MC_EPEERDEAD);
    assert_int_equal(atomic_load(&ev->dead), 1);
}

/* The target stops (SIGSTOP) so nothing is acknowledged, then is killed: each of the messages
 * and the flush fails with -MC_EPEERDEAD, none hangs, the DEAD event counts them, and a send
 * afterwards is refused. Writes the flush waits for, most still queued over tcp, end too (the
 * flush is gone before they are let go of). */
static void test_peer_killed(void **state)
{
    const unsigned n = 300, nw = 64;
    const size_t sz = 256 * 1024;
    static done_t d, fd;
    static events_t ev;
    mc_request_t reqs[64];
    uint8_t buf[256];
    th_cfg_t cfg;
    mc_batch_t *b;

    (void)state;
    config(&cfg);
    th_target_t *t = spawn(&cfg, nw * sz);
    mc_engine_t *e = g.e = th_engine(&cfg);
    memset(&d, 0, sizeof(d));
    memset(&fd, 0, sizeof(fd));
    memset(&ev, 0, sizeof(ev));
    assert_int_equal(mc_peer_handler_set(e, on_event, &ev), 0);
    mc_segment_id_t id = th_open(e, t, 0);
    mc_msg_opts_t o = {.size = sizeof(o), .cb = on_done, .cb_arg = &d};
    th_stop(t->pid);
    for (uint32_t i = 0; i < n; i++)
        assert_int_equal(send_msg(e, id, TH_MSG_ID, buf, make_msg(buf, i, sizeof(buf)), &o), 0);
    uint8_t *src = th_buf(e, nw * sz);
    for (size_t i = 0; i < nw; i++)
        reqs[i] = (mc_request_t){.opcode = MC_WRITE,
                                 .local = src + i * sz,
                                 .target = id,
                                 .target_offset = t->eng[0].buf[0] + i * sz,
                                 .length = sz};
    assert_int_equal(mc_batch_create(e, nw, &b), 0);
    assert_int_equal(mc_batch_submit(b, reqs, nw, NULL), 0);
    assert_int_equal(mc_peer_flush(e, id, on_done, &fd), 0);
    th_sleep_ms(300);
    assert_int_equal(atomic_load(&d.ok) + atomic_load(&d.failed), 0);
    int64_t t0 = th_now_ms();
    th_target_kill(t);
    expect_lost(&d, &fd, &ev, n, t0, 20000);
    assert_int_equal(mc_batch_wait(b, 20000), 0);
    th_batch_destroy(e, b);
    th_buf_free(e, src, nw * sz);
    char want[64];
    snprintf(want, sizeof(want), "%u messages", n);
    assert_true(th_contains(ev.reason, want));
    assert_int_equal(mc_msg_send(e, id, TH_MSG_ID, buf, 8), -MC_EPEERDEAD);
    assert_int_equal(mc_notify_send(e, id, buf, 8), -MC_EPEERDEAD);
    assert_int_equal(mc_peer_flush(e, id, on_done, &fd), -MC_EPEERDEAD);
    th_close(e, id);
}

/* A target opened by address (no lease) stops answering for good (SIGSTOP, as a host that lost
 * power): nothing refuses our connections, nothing tells us it died. Once it has been
 * unreachable with messages waiting for it for as long as a lease would be probed (10 I/O
 * timeouts: 2 s here), it is dead: each message and the flush fail with -MC_EPEERDEAD. Over tcp
 * only (a same-host peer's process is watched: it lives, its ring fills, the sender waits). */
static void test_peer_silent(void **state)
{
    const unsigned n = 50;
    static done_t d, fd;
    static events_t ev;
    uint8_t buf[256];
    th_cfg_t cfg;

    (void)state;
    if (!over_tcp())
        skip();
    config(&cfg);
    th_set(&cfg, "IO_TIMEOUT_MS", "200");
    th_set(&cfg, "CONNECT_TIMEOUT_MS", "500");
    th_target_t *t = spawn(&cfg, 4096);
    mc_engine_t *e = g.e = th_engine(&cfg);
    memset(&d, 0, sizeof(d));
    memset(&fd, 0, sizeof(fd));
    memset(&ev, 0, sizeof(ev));
    assert_int_equal(mc_peer_handler_set(e, on_event, &ev), 0);
    mc_segment_id_t id = th_open(e, t, 0);
    assert_int_equal(flush_wait(e, id), 0); /* connected */
    mc_msg_opts_t o = {.size = sizeof(o), .cb = on_done, .cb_arg = &d};
    th_stop(t->pid);
    int64_t t0 = th_now_ms();
    for (uint32_t i = 0; i < n; i++)
        assert_int_equal(send_msg(e, id, TH_MSG_ID, buf, make_msg(buf, i, sizeof(buf)), &o), 0);
    assert_int_equal(mc_peer_flush(e, id, on_done, &fd), 0);
    expect_lost(&d, &fd, &ev, n, t0, 30000);
    assert_true(th_contains(ev.reason, "unreachable"));
    assert_true(th_now_ms() - t0 >= 2000); /* not before a lease would have been probed */
    th_target_kill(t);
    th_close(e, id);
}

/* ---- flush ----------------------------------------------------------------------------------- */

/* Writes (not waited for), notifications and handler messages, then a flush: when it completes
 * the target already holds every byte and every notification (checked at once, no waiting),
 * and its handler saw every message. */
static void test_flush(void **state)
{
    const size_t n = 64, sz = 256 * 1024;
    const unsigned nn = 500, nm = 500;
    mc_request_t reqs[64];
    uint8_t buf[4096];
    th_cfg_t cfg;
    th_reply_t r;
    mc_batch_t *b;

    (void)state;
    config(&cfg);
    th_target_t *t = spawn(&cfg, n * sz);
    mc_engine_t *e = g.e = th_engine(&cfg);
    mc_segment_id_t id = th_open(e, t, 0);
    uint64_t ra = t->eng[0].buf[0];
    uint8_t *src = th_buf(e, n * sz);

    for (int round = 0; round < 3; round++) {
        uint64_t seed = 4242 + (uint64_t)round;
        th_fill(src, n * sz, seed);
        for (size_t i = 0; i < n; i++)
            reqs[i] = (mc_request_t){.opcode = MC_WRITE,
                                     .local = src + i * sz,
                                     .target = id,
                                     .target_offset = ra + i * sz,
                                     .length = sz};
        assert_int_equal(mc_batch_create(e, n, &b), 0);
        assert_int_equal(mc_batch_submit(b, reqs, n, NULL), 0);
        for (uint32_t i = 0; i < nn; i++) {
            uint32_t v = round * nn + i;
            memcpy(buf, &v, 4);
            int64_t dl = th_now_ms() + 10000;
            int rc;
            while ((rc = mc_notify_send(e, id, buf, 4)) == -EAGAIN && th_now_ms() < dl)
                mc_engine_progress(e);
            assert_int_equal(rc, 0);
            uint32_t m = round * nm + i;
            assert_int_equal(send_msg(e, id, TH_MSG_ID, buf, make_msg(buf, m, 16 + i % 4000), NULL),
                             0);
        }
        assert_int_equal(flush_wait(e, id), 0);
        /* At once: the bytes and the notifications are there. */
        assert_int_equal(th_remote_check(t, 0, ra, n * sz, seed, 0), -1);
        th_cmd_t c = {.op = TH_CMD_POPS, .a0 = nn, .a1 = round * nn, .a3 = 0};
        assert_int_equal(th_target_cmd(t, &c, &r, 10000), 0);
        assert_int_equal(r.v[0], nn);
        assert_int_equal(r.v[1], 0);
        /* The handler runs in the target's progress pass that queued them. */
        c = (th_cmd_t){.op = TH_CMD_MSGS, .a0 = (round + 1) * nm, .a3 = 5000};
        assert_int_equal(th_target_cmd(t, &c, &r, 10000), 0);
        assert_int_equal(r.v[0], (round + 1) * nm);
        assert_int_equal(r.v[1] + r.v[2], 0);
        mc_batch_status_t bs;
        assert_int_equal(mc_batch_status(b, &bs), 0);
        assert_int_equal(bs.completed, n);
        th_batch_destroy(e, b);
    }
    /* A flush with nothing outstanding completes too (from progress, not inside the call). */
    assert_int_equal(flush_wait(e, id), 0);
    assert_int_equal(mc_peer_flush(e, id + 99, on_flushed, NULL), -MC_ENOSEGMENT);
    th_buf_free(e, src, n * sz);
    th_close(e, id);
    /* The same from a host without a progress thread, whose calls drive progress themselves
     * (MC_PROGRESS_IMPLICIT): the callback runs from its mc_engine_progress, not from the
     * pass mc_peer_flush runs. */
    th_set(&cfg, "PROGRESS_THREAD", "0");
    mc_engine_t *h = th_engine(&cfg);
    id = th_open(h, t, 0);
    for (int i = 0; i < 3; i++) {
        static flushed_t f;
        memset(&f, 0, sizeof(f));
        assert_int_equal(mc_peer_flush(h, id, on_flushed, &f), 0);
        assert_false(atomic_load(&f.done));
        for (int64_t dl = th_now_ms() + 30000; !atomic_load(&f.done) && th_now_ms() < dl;)
            mc_engine_progress(h);
        assert_true(atomic_load(&f.done));
        assert_int_equal(atomic_load(&f.status), 0);
    }
    th_close(h, id);
    mc_engine_destroy(h);
}

/* A flush whose callback notes how many messages its peer holds in its queue then. */
typedef struct flush_sent {
    flushed_t f;
    mc_engine_t *e;
    mc_segment_id_t id;
    atomic_uint_fast64_t sent;
} flush_sent_t;

static void on_flushed_sent(void *arg, int status)
{
    flush_sent_t *fs = arg;
    mc_counters_t c;

    atomic_store(&fs->sent, mc_stats_peer(fs->e, fs->id, &c) ? UINT64_MAX : c.msgs_sent);
    on_flushed(&fs->f, status);
}

/* One WRITE to dst with a notification to nt, then at once a flush of nt: when the flush
 * completes, the notification is in nt's queue (counted as sent in the callback, and popped at
 * once by nt's application, after the data when it went to the same target). */
static void flush_after_notify(mc_engine_t *e, th_target_t *dst, mc_segment_id_t dst_id,
                               th_target_t *nt, mc_segment_id_t nt_id, uint8_t *src, size_t sz,
                               uint64_t seed)
{
    static flush_sent_t fs;
    uint64_t ra = dst->eng[0].buf[0];
    mc_counters_t before;
    mc_batch_t *b;
    th_reply_t r;

    memset(&fs, 0, sizeof(fs));
    fs.e = e;
    fs.id = nt_id;
    th_fill(src, sz, seed);
    assert_int_equal(mc_stats_peer(e, nt_id, &before), 0);
    mc_request_t rq = {
        .opcode = MC_WRITE, .local = src, .target = dst_id, .target_offset = ra, .length = sz};
    mc_notify_req_t nr = {.target = nt_id, .msg = "landed", .len = 6};
    assert_int_equal(mc_batch_create(e, 1, &b), 0);
    assert_int_equal(mc_batch_submit(b, &rq, 1, &nr), 0);
    assert_int_equal(mc_peer_flush(e, nt_id, on_flushed_sent, &fs), 0);
    int64_t dl = th_now_ms() + 30000;
    while (!atomic_load(&fs.f.done) && th_now_ms() < dl)
        if (mc_engine_progress(e) <= 0) /* (nothing to do with a progress thread) */
            th_sleep_ms(1);
    assert_true(atomic_load(&fs.f.done));
    assert_int_equal(atomic_load(&fs.f.status), 0);
    assert_int_equal(atomic_load(&fs.sent), before.msgs_sent + 1);
    bool same = nt == dst;
    th_cmd_t c = {.op = TH_CMD_NOTIFY, .a0 = ra, .a1 = same ? sz : 0, .a2 = seed, .a3 = 0};
    assert_int_equal(th_target_cmd(nt, &c, &r, 10000), 0);
    assert_int_equal(r.v[0], 1);
    assert_string_equal(r.msg, "landed");
    assert_int_equal(r.rc, 0);
    assert_int_equal(mc_batch_wait(b, 30000), 0);
    assert_int_equal(th_remote_check(dst, 0, ra, sz, seed, 0), -1);
    th_batch_destroy(e, b);
}

/* A batch's notification goes once its data landed, after the flush that follows the submit
 * started: the flush waits for it too, whether the data went to the notification's target or
 * to another peer. With a progress thread, and with progress only in mc_engine_progress (where
 * the submit and the flush start in one pass, though the data went in the submit: shm). */
static void test_flush_notification(void **state)
{
    const size_t sz = 32u << 20;
    static th_target_t t2;
    th_target_opts_t o;
    th_cfg_t cfg;

    (void)state;
    config(&cfg);
    th_target_t *t = spawn(&cfg, sz);
    th_target_opts_init(&o, &cfg, 4096);
    assert_int_equal(th_target_spawn(&o, &t2), 0);
    for (int caller = 0; caller < 2; caller++) {
        if (caller) {
            th_set(&cfg, "PROGRESS_THREAD", "0");
            th_set(&cfg, "PROGRESS_IMPLICIT", "0");
        }
        mc_engine_t *e = g.e = th_engine(&cfg);
        mc_segment_id_t id = th_open(e, t, 0), id2 = th_open(e, &t2, 0);
        uint8_t *src = th_buf(e, sz);
        flush_after_notify(e, t, id, t, id, src, sz, 5150);
        flush_after_notify(e, t, id, &t2, id2, src, sz, 5151);
        th_buf_free(e, src, sz);
        th_close(e, id2);
        th_close(e, id);
        mc_engine_destroy(e);
        g.e = NULL;
    }
}

/* ---- notifications --------------------------------------------------------------------------- */

static void notify(mc_engine_t *e, mc_segment_id_t id, const char *s)
{
    assert_int_equal(mc_notify_send(e, id, s, strlen(s)), 0);
}

static void expect_pop(th_target_t *t, const char *msg, uint64_t addr, uint64_t len, uint64_t seed)
{
    th_reply_t r;
    th_cmd_t c = {.op = TH_CMD_NOTIFY, .a0 = addr, .a1 = len, .a2 = seed, .a3 = 20000};

    assert_int_equal(th_target_cmd(t, &c, &r, 30000), 0);
    assert_int_equal(r.v[0], 1);
    assert_string_equal(r.msg, msg);
    assert_int_equal(r.rc, 0); /* the data was there when it popped */
}

/* Standalone notifications come in the order sent; a batch's comes after its data is remotely
 * complete, though the initiator never waits for the batch (the progress thread sends it); each
 * comes once. An empty one and bad input are handled. */
static void test_notifications(void **state)
{
    const size_t sz = 32u << 20;
    th_cfg_t cfg;
    mc_batch_t *b;
    th_reply_t r;

    (void)state;
    config(&cfg);
    th_target_t *t = spawn(&cfg, sz);
    mc_engine_t *e = g.e = th_engine(&cfg);
    mc_segment_id_t id = th_open(e, t, 0);
    uint64_t ra = t->eng[0].buf[0];
    uint8_t *src = th_buf(e, sz);
    th_fill(src, sz, 9090);

    notify(e, id, "one");
    notify(e, id, "two");
    mc_request_t rq = {
        .opcode = MC_WRITE, .local = src, .target = id, .target_offset = ra, .length = sz};
    mc_notify_req_t nr = {.target = id, .msg = "data landed", .len = 11};
    assert_int_equal(mc_batch_create(e, 1, &b), 0);
    assert_int_equal(mc_batch_submit(b, &rq, 1, &nr), 0);
    expect_pop(t, "one", 0, 0, 0);
    expect_pop(t, "two", 0, 0, 0);
    notify(e, id, "three");
    /* "three" may overtake the batch's (sent when the data is complete), never the other way. */
    th_cmd_t c = {.op = TH_CMD_NOTIFY, .a0 = ra, .a1 = sz, .a2 = 9090, .a3 = 20000};
    assert_int_equal(th_target_cmd(t, &c, &r, 30000), 0);
    if (!strcmp(r.msg, "three")) {
        expect_pop(t, "data landed", ra, sz, 9090);
    } else {
        assert_string_equal(r.msg, "data landed");
        assert_int_equal(r.rc, 0);
        expect_pop(t, "three", 0, 0, 0);
    }
    /* An empty notification, then nothing more (each came once). */
    assert_int_equal(mc_notify_send(e, id, NULL, 0), 0);
    c = (th_cmd_t){.op = TH_CMD_NOTIFY, .a3 = 20000};
    assert_int_equal(th_target_cmd(t, &c, &r, 30000), 0);
    assert_int_equal(r.v[0], 1);
    assert_int_equal(r.v[1], 0);
    c.a3 = 500;
    assert_int_equal(th_target_cmd(t, &c, &r, 10000), 0);
    assert_int_equal(r.v[0], 0);
    static char big[MC_MSG_MAX + 1];
    assert_int_equal(mc_notify_send(e, id, big, sizeof(big)), -EINVAL);
    assert_int_equal(mc_notify_send(e, id, NULL, 4), -EINVAL);
    assert_int_equal(mc_notify_send(e, id + 99, "x", 1), -MC_ENOSEGMENT);
    th_batch_destroy(e, b);
    th_buf_free(e, src, sz);
    th_close(e, id);
}

/* ---- back-pressure --------------------------------------------------------------------------- */

/* Send notifications of len bytes (4 or more), numbered from *next in their first 4, until the
 * sender has said -EAGAIN for quiet_ms in a row; returns how many went. */
static unsigned fill_up(mc_engine_t *e, mc_segment_id_t id, uint32_t *next, int quiet_ms,
                        size_t len)
{
    static char msg[MC_MSG_MAX];
    unsigned sent = 0;
    int64_t since = 0;

    for (;;) {
        memcpy(msg, next, 4);
        int rc = mc_notify_send(e, id, msg, len);
        if (rc == 0) {
            (*next)++;
            sent++;
            since = 0;
            continue;
        }
        assert_int_equal(rc, -EAGAIN);
        if (!since)
            since = th_now_ms();
        else if (th_now_ms() - since >= quiet_ms)
            return sent;
        th_sleep_ms(1);
    }
}

/* A receiver whose application does not pop: past its queue limit it refuses, the sender's
 * window fills and sends return -EAGAIN; once it pops, everything arrives once and in order.
 * A receiver that does not progress at all (stopped) has the same effect. */
static void test_backpressure(void **state)
{
    th_cfg_t cfg;
    th_reply_t r;
    uint32_t next = 0;

    (void)state;
    config(&cfg);
    th_target_t *t = spawn(&cfg, 4096);
    mc_engine_t *e = g.e = th_engine(&cfg);
    mc_segment_id_t id = th_open(e, t, 0);

    /* Nobody pops at the target. */
    unsigned sent = fill_up(e, id, &next, 1000, 4);
    print_message("  %u notifications went before the sender was held back\n", sent);
    assert_true(sent >= MC_MSG_WINDOW);
    assert_true(sent <= 65536 + MC_MSG_WINDOW);
    th_cmd_t c = {.op = TH_CMD_POPS, .a0 = sent, .a1 = 0, .a3 = 30000};
    assert_int_equal(th_target_cmd(t, &c, &r, 40000), 0);
    assert_int_equal(r.v[0], sent);
    assert_int_equal(r.v[1], 0);

    /* Once all is acknowledged (a flush), the target stops; sends are held back after a
     * window, and go once it continues. */
    assert_int_equal(flush_wait(e, id), 0);
    th_stop(t->pid);
    uint32_t first = next;
    unsigned more = fill_up(e, id, &next, 300, 4);
    assert_int_equal(more, MC_MSG_WINDOW);
    /* A submit with a notification is refused then, before anything moves: its notification
     * would find no place once the data landed. */
    uint8_t *src = th_buf(e, 4096);
    mc_request_t rq = {.opcode = MC_WRITE,
                       .local = src,
                       .target = id,
                       .target_offset = t->eng[0].buf[0],
                       .length = 4096};
    mc_notify_req_t nr = {.target = id, .msg = "landed", .len = 6};
    mc_batch_t *b;
    th_fill(src, 4096, 4242);
    assert_int_equal(mc_batch_create(e, 1, &b), 0);
    assert_int_equal(mc_batch_submit(b, &rq, 1, &nr), -EAGAIN);
    assert_int_equal(kill(t->pid, SIGCONT), 0);
    c = (th_cmd_t){.op = TH_CMD_POPS, .a0 = more, .a1 = first, .a3 = 30000};
    assert_int_equal(th_target_cmd(t, &c, &r, 40000), 0);
    assert_int_equal(r.v[0], more);
    assert_int_equal(r.v[1], 0);
    c = (th_cmd_t){.op = TH_CMD_POPS, .a0 = 1, .a3 = 300};
    assert_int_equal(th_target_cmd(t, &c, &r, 10000), 0);
    assert_int_equal(r.v[0], 0); /* nothing twice */
    /* Now it goes, and its notification comes after its bytes. */
    assert_int_equal(mc_batch_submit(b, &rq, 1, &nr), 0);
    expect_pop(t, "landed", t->eng[0].buf[0], 4096, 4242);
    th_batch_destroy(e, b);
    th_buf_free(e, src, 4096);

    /* The window also bounds payload bytes: a stopped target takes MC_MSG_WINDOW_BYTES of the
     * largest notifications, and then not even a small one; they all arrive once it goes on. */
    assert_int_equal(flush_wait(e, id), 0);
    th_stop(t->pid);
    first = next;
    more = fill_up(e, id, &next, 300, MC_MSG_MAX);
    assert_int_equal(more, MC_MSG_WINDOW_BYTES / MC_MSG_MAX);
    assert_int_equal(mc_notify_send(e, id, &next, 4), -EAGAIN);
    assert_int_equal(kill(t->pid, SIGCONT), 0);
    c = (th_cmd_t){.op = TH_CMD_POPS, .a0 = more, .a1 = first, .a2 = MC_MSG_MAX, .a3 = 30000};
    assert_int_equal(th_target_cmd(t, &c, &r, 40000), 0);
    assert_int_equal(r.v[0], more);
    assert_int_equal(r.v[1], 0);
    th_close(e, id);
}

/* ---- linger ---------------------------------------------------------------------------------- */

static atomic_bool destroyed;

static void *destroy_thread(void *arg)
{
    mc_engine_destroy(arg);
    atomic_store(&destroyed, true);
    return NULL;
}

/* MC_LINGER_MS: an engine destroyed with notifications its peer has not taken (the peer is
 * stopped) waits for them; the peer, continued 300 ms later, gets every one once and in order,
 * and the destroy returns once it took them, long before the linger's 20 s. */
static void test_linger(void **state)
{
    const unsigned n = 200;
    th_cfg_t cfg;
    th_reply_t r;
    pthread_t tid;

    (void)state;
    config(&cfg);
    th_target_t *t = spawn(&cfg, 4096);
    th_set(&cfg, "LINGER_MS", "20000");
    mc_engine_t *e = th_engine(&cfg);
    mc_segment_id_t id = th_open(e, t, 0);
    assert_int_equal(flush_wait(e, id), 0); /* connected */
    th_stop(t->pid);
    for (uint32_t i = 0; i < n; i++)
        assert_int_equal(mc_notify_send(e, id, &i, 4), 0);
    int64_t t0 = th_now_ms();
    atomic_store(&destroyed, false);
    assert_int_equal(pthread_create(&tid, NULL, destroy_thread, e), 0);
    th_sleep_ms(300);
    assert_false(atomic_load(&destroyed)); /* lingering */
    assert_int_equal(kill(t->pid, SIGCONT), 0);
    assert_int_equal(pthread_join(tid, NULL), 0);
    int64_t took = th_now_ms() - t0;
    print_message("  the destroy returned after %lld ms\n", (long long)took);
    assert_true(took < 10000);
    th_cmd_t c = {.op = TH_CMD_POPS, .a0 = n, .a1 = 0, .a3 = 10000};
    assert_int_equal(th_target_cmd(t, &c, &r, 20000), 0);
    assert_int_equal(r.v[0], n);
    assert_int_equal(r.v[1], 0);
    c = (th_cmd_t){.op = TH_CMD_POPS, .a0 = 1, .a3 = 300};
    assert_int_equal(th_target_cmd(t, &c, &r, 10000), 0);
    assert_int_equal(r.v[0], 0); /* nothing twice */
}

/* ---- a host's send, then a handler's ----------------------------------------------------- */

enum { ORDER_GO = TH_MSG_ID + 1, ORDER_FIRST, ORDER_SECOND };

static struct {
    mc_engine_t *e;     /* the engine whose handler sends */
    mc_segment_id_t to; /* its peer */
    atomic_int stage;   /* 1: the handler runs; 2: the host's send returned */
    atomic_int got[2];  /* at the peer: the ids in the order they came */
    atomic_int n;
    atomic_int send_rc; /* the handler's send */
} order;

/* Waits until the host's send returned (the host sent while this pass ran), then sends. */
static void on_order_go(void *arg, const char *sender, uint8_t id, const void *data, size_t len)
{
    (void)arg, (void)sender, (void)id, (void)data, (void)len;
    atomic_store(&order.stage, 1);
    for (int64_t dl = th_now_ms() + 10000; atomic_load(&order.stage) != 2 && th_now_ms() < dl;)
        sched_yield();
    atomic_store(&order.send_rc, mc_msg_send(order.e, order.to, ORDER_SECOND, "2", 1));
}

static void on_order(void *arg, const char *sender, uint8_t id, const void *data, size_t len)
{
    int i = atomic_fetch_add(&order.n, 1);

    (void)arg, (void)sender, (void)data, (void)len;
    if (i < 2)
        atomic_store(&order.got[i], id);
}

/* A host thread sends while the progress thread runs a handler; the handler, told that the
 * send returned, sends too: the host's message comes first ("in the order sent"). Before, the
 * host's waited in the submission queue for the next pass, and the handler's, routed at once,
 * went ahead of it. */
static void test_host_then_handler(void **state)
{
    th_cfg_t cfg;
    mc_segment_id_t back;

    (void)state;
    config(&cfg);
    memset(&order, 0, sizeof(order));
    mc_engine_t *a = g.e = th_engine(&cfg);
    mc_engine_t *b = g.e2 = th_engine(&cfg);
    order.e = a;
    assert_int_equal(mc_segment_open(a, mc_engine_segment_name(b), &order.to), 0);
    assert_int_equal(mc_segment_open(b, mc_engine_segment_name(a), &back), 0);
    assert_int_equal(mc_msg_handler_set(a, ORDER_GO, on_order_go, NULL), 0);
    assert_int_equal(mc_msg_handler_set(b, ORDER_FIRST, on_order, NULL), 0);
    assert_int_equal(mc_msg_handler_set(b, ORDER_SECOND, on_order, NULL), 0);
    assert_int_equal(mc_msg_send(b, back, ORDER_GO, "g", 1), 0);
    for (int64_t dl = th_now_ms() + 10000; atomic_load(&order.stage) != 1 && th_now_ms() < dl;)
        th_sleep_ms(1);
    assert_int_equal(atomic_load(&order.stage), 1);
    assert_int_equal(mc_msg_send(a, order.to, ORDER_FIRST, "1", 1), 0);
    atomic_store(&order.stage, 2);
    for (int64_t dl = th_now_ms() + 10000; atomic_load(&order.n) < 2 && th_now_ms() < dl;)
        th_sleep_ms(1);
    assert_int_equal(atomic_load(&order.send_rc), 0);
    assert_int_equal(atomic_load(&order.n), 2);
    assert_int_equal(atomic_load(&order.got[0]), ORDER_FIRST);
    assert_int_equal(atomic_load(&order.got[1]), ORDER_SECOND);
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_exactly_once, teardown),
        cmocka_unit_test_teardown(test_both_ways, teardown),
        cmocka_unit_test_teardown(test_carrier_switch, teardown),
        cmocka_unit_test_teardown(test_ring_cut, teardown),
        cmocka_unit_test_teardown(test_peer_killed, teardown),
        cmocka_unit_test_teardown(test_peer_silent, teardown),
        cmocka_unit_test_teardown(test_flush, teardown),
        cmocka_unit_test_teardown(test_flush_notification, teardown),
        cmocka_unit_test_teardown(test_notifications, teardown),
        cmocka_unit_test_teardown(test_backpressure, teardown),
        cmocka_unit_test_teardown(test_linger, teardown),
        cmocka_unit_test_teardown(test_host_then_handler, teardown),
    };

    th_main(argc, argv);
    return cmocka_run_group_tests_name("messages", tests, NULL, NULL);
}
