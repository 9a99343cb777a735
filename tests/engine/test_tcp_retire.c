/*
 * A WRITE held in the network by a partition must not land over a newer WRITE to the same bytes
 * once the partition heals. The engine reaches its target (a child process) through a proxy in
 * this test. The proxy partitions: what is sent on the connection there at that moment waits
 * (as the kernel keeps retransmitting a closed socket's bytes), the target's answers are lost,
 * and new connections reach nothing. The engine gives up on the connection and retires it; the
 * partition lasts longer than retired ids used to be remembered (2 x MC_IO_TIMEOUT_MS +
 * MC_CONNECT_TIMEOUT_MS), so the first HELLO after it must still list the connection. Then a
 * newer WRITE completes, and the stale bytes are let through: the target must have dropped
 * that connection, and still hold the newer data.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <cmocka.h>

#include "harness.h"

#define LEN       (64 * 1024)
#define RELAYS    64
#define PARTITION 1500 /* ms: 2.5 x the old memory of retired ids with the timeouts below */

enum { RELAY, PARTITIONED, HEALED };

typedef struct relay {
    int down, up;  /* the engine's connection (accepted), the target's (connected); -1: closed */
    bool held;     /* there when the partition began: what the engine sends on it waits */
    uint8_t *hold; /* ... here */
    size_t n_hold;
} relay_t;

static struct {
    int lfd;
    struct sockaddr_in target;
    relay_t r[RELAYS];
    int n;
    atomic_int phase, seen_phase;
    atomic_bool release, released, stop;
} px;

static void fd_close(int *fd)
{
    if (*fd >= 0)
        close(*fd);
    *fd = -1;
}

static void send_all(int fd, const uint8_t *p, size_t len)
{
    while (len) {
        ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
        if (n <= 0)
            return; /* (the target closed it: what is left goes nowhere) */
        p += n;
        len -= (size_t)n;
    }
}

static void accept_one(void)
{
    int fd = accept(px.lfd, NULL, NULL);

    if (fd < 0)
        return;
    if (px.n == RELAYS) {
        close(fd);
        return;
    }
    relay_t *r = &px.r[px.n++];
    *r = (relay_t){.down = fd, .up = -1};
    if (atomic_load(&px.phase) == PARTITIONED)
        return; /* it reaches nothing */
    r->up = socket(AF_INET, SOCK_STREAM, 0);
    if (r->up < 0 || connect(r->up, (struct sockaddr *)&px.target, sizeof(px.target)))
        fd_close(&r->up);
}

/* Bytes on one side of r (from_down: the engine's). */
static void relay_read(relay_t *r, bool from_down)
{
    uint8_t buf[1 << 16];
    ssize_t n = recv(from_down ? r->down : r->up, buf, sizeof(buf), 0);

    if (n <= 0) {
        if (!from_down) { /* the target closed it */
            fd_close(&r->up);
            fd_close(&r->down);
        } else if (r->held) {
            fd_close(&r->down); /* the engine let go of it; its bytes still wait */
        } else {
            fd_close(&r->down);
            fd_close(&r->up);
        }
        return;
    }
    if (r->held && from_down) {
        uint8_t *h = realloc(r->hold, r->n_hold + (size_t)n);
        assert_non_null(h);
        memcpy(h + r->n_hold, buf, (size_t)n);
        r->hold = h;
        r->n_hold += (size_t)n;
    } else if (!r->held) {
        int to = from_down ? r->up : r->down;
        if (to >= 0)
            send_all(to, buf, (size_t)n);
    } /* (a held one's answers are lost) */
}

static void *proxy_thread(void *arg)
{
    (void)arg;
    while (!atomic_load(&px.stop)) {
        int phase = atomic_load(&px.phase);
        if (phase != atomic_load(&px.seen_phase)) {
            for (int i = 0; phase == PARTITIONED && i < px.n; i++)
                px.r[i].held = px.r[i].down >= 0 || px.r[i].up >= 0;
            atomic_store(&px.seen_phase, phase);
        }
        if (atomic_load(&px.release) && !atomic_load(&px.released)) {
            for (int i = 0; i < px.n; i++) {
                relay_t *r = &px.r[i];
                if (r->held && r->up >= 0) {
                    send_all(r->up, r->hold, r->n_hold);
                    shutdown(r->up, SHUT_WR);
                }
                r->n_hold = 0;
            }
            atomic_store(&px.released, true);
        }
        struct pollfd p[1 + 2 * RELAYS];
        int who[1 + 2 * RELAYS], n = 0;
        p[n] = (struct pollfd){.fd = px.lfd, .events = POLLIN};
        who[n++] = -1;
        for (int i = 0; i < px.n; i++) {
            if (px.r[i].down >= 0) {
                p[n] = (struct pollfd){.fd = px.r[i].down, .events = POLLIN};
                who[n++] = 2 * i;
            }
            if (px.r[i].up >= 0) {
                p[n] = (struct pollfd){.fd = px.r[i].up, .events = POLLIN};
                who[n++] = 2 * i + 1;
            }
        }
        if (poll(p, (nfds_t)n, 10) <= 0)
            continue;
        for (int k = 0; k < n; k++) {
            if (!p[k].revents)
                continue;
            if (who[k] < 0)
                accept_one();
            else
                relay_read(&px.r[who[k] / 2], who[k] % 2 == 0);
        }
    }
    return NULL;
}

static void phase_set(int phase)
{
    atomic_store(&px.phase, phase);
    while (atomic_load(&px.seen_phase) != phase)
        th_sleep_ms(1);
}

/* A proxy to the target's listening port: its own port. */
static unsigned proxy_start(unsigned target_port, pthread_t *t)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t alen = sizeof(a);

    memset(&px, 0, sizeof(px));
    px.target = a;
    px.target.sin_port = htons((uint16_t)target_port);
    px.lfd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(px.lfd >= 0);
    assert_int_equal(bind(px.lfd, (struct sockaddr *)&a, sizeof(a)), 0);
    assert_int_equal(listen(px.lfd, 64), 0);
    assert_int_equal(getsockname(px.lfd, (struct sockaddr *)&a, &alen), 0);
    assert_int_equal(pthread_create(t, NULL, proxy_thread, NULL), 0);
    return ntohs(a.sin_port);
}

static void proxy_stop(pthread_t t)
{
    atomic_store(&px.stop, true);
    pthread_join(t, NULL);
    for (int i = 0; i < px.n; i++) {
        fd_close(&px.r[i].down);
        fd_close(&px.r[i].up);
        free(px.r[i].hold);
    }
    close(px.lfd);
}

/* The target's engine 0 opened through the proxy: its blob with its tcp endpoint replaced. */
static mc_segment_id_t open_via(mc_engine_t *e, const th_target_t *t, unsigned from, unsigned to)
{
    char *blob = calloc(1, t->eng[0].blob_len + 32), old[32], new[32];
    mc_segment_id_t seg;

    assert_non_null(blob);
    memcpy(blob, t->eng[0].blob, t->eng[0].blob_len);
    snprintf(old, sizeof(old), "\"127.0.0.1:%u\"", from);
    snprintf(new, sizeof(new), "\"127.0.0.1:%u\"", to);
    char *at = strstr(blob, "\"endpoints\""); /* (the name is the same address) */
    assert_non_null(at);
    at = strstr(at, old);
    assert_non_null(at);
    memmove(at + strlen(new), at + strlen(old), strlen(at + strlen(old)) + 1);
    memcpy(at, new, strlen(new));
    assert_int_equal(mc_segment_open_blob(e, (uint8_t *)blob, strlen(blob), &seg), 0);
    free(blob);
    return seg;
}

typedef struct write_arg {
    mc_engine_t *e;
    void *src;
    mc_segment_id_t seg;
    uint64_t remote;
    int state;
    char why[512];
} write_arg_t;

static void *write_thread(void *arg)
{
    write_arg_t *w = arg;

    w->state = th_xfer(w->e, MC_WRITE, w->src, w->seg, w->remote, LEN, w->why, sizeof(w->why));
    return NULL;
}

static void test_stale_write_after_partition(void **state)
{
    th_cfg_t cfg;
    th_target_opts_t o;
    th_target_t t;
    pthread_t proxy, writer;
    char why[512];

    (void)state;
    th_config(&cfg);
    th_set(&cfg, "PROTOCOL", "tcp");
    th_set(&cfg, "IO_TIMEOUT_MS", "200");
    th_set(&cfg, "CONNECT_TIMEOUT_MS", "200");
    th_set(&cfg, "TCP_CONNS", "1");
    th_target_opts_init(&o, &cfg, 1 << 20);
    assert_int_equal(th_target_spawn(&o, &t), 0);
    unsigned port = th_listen_port(t.pid);
    assert_true(port != 0);
    unsigned via = proxy_start(port, &proxy);
    mc_engine_t *e = th_engine(&cfg);
    mc_segment_id_t seg = open_via(e, &t, port, via);
    uint64_t remote = t.eng[0].buf[0];
    uint8_t *src = th_buf(e, LEN), *stale = th_buf(e, LEN);

    th_fill(src, LEN, 1); /* the connection is up and has carried a WRITE */
    if (th_xfer(e, MC_WRITE, src, seg, remote, LEN, why, sizeof(why)) != MC_TASK_COMPLETED)
        fail_msg("the first WRITE through the proxy: %s", why);
    assert_int_equal(th_remote_check(&t, 0, remote, LEN, 1, 0), -1);

    phase_set(PARTITIONED);
    th_fill(stale, LEN, 2);
    write_arg_t w = {.e = e, .src = stale, .seg = seg, .remote = remote};
    assert_int_equal(pthread_create(&writer, NULL, write_thread, &w), 0);
    th_sleep_ms(PARTITION);
    phase_set(HEALED);
    pthread_join(writer, NULL); /* retried to completion after the partition, or failed */
    print_message("the WRITE during the partition: state %d %s\n", w.state, w.why);
    assert_true(w.state == MC_TASK_COMPLETED || w.state == MC_TASK_FAILED);

    th_fill(src, LEN, 3);
    assert_int_equal(th_xfer(e, MC_WRITE, src, seg, remote, LEN, why, sizeof(why)),
                     MC_TASK_COMPLETED);
    assert_int_equal(th_remote_check(&t, 0, remote, LEN, 3, 0), -1);

    atomic_store(&px.release, true); /* the stale bytes arrive */
    while (!atomic_load(&px.released))
        th_sleep_ms(1);
    th_sleep_ms(300);
    int64_t bad = th_remote_check(&t, 0, remote, LEN, 3, 0);
    if (bad != -1 && th_remote_check(&t, 0, remote, LEN, 2, 0) == -1)
        fail_msg("the WRITE held by the partition landed over the newer one");
    assert_int_equal(bad, -1);

    proxy_stop(proxy);
    mc_engine_destroy(e);
    th_kill_all();
}

int main(int argc, char **argv)
{
    th_main(argc, argv);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stale_write_after_partition),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
