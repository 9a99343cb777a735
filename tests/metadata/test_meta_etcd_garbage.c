/* The etcd:// backend against a gateway that answers without end: a body, or a watch line, that
 * never stops must not make this process grow without bound. The "gateway" is a thread of this
 * test on loopback that answers every request with 200 and an endless run of bytes without a
 * newline, counting what each connection took before the client hung up. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
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
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#include <mooncake/error.h>
#include <mooncake/meta.h>

#define MiB        (1ull << 20)
#define SEND_LIMIT (512 * MiB) /* the gateway gives up on a connection after this much */
#define MAX_CONNS  16

static struct {
    int lfd, port;
    pthread_t thread;
    atomic_bool stop;
    atomic_uint conns;                 /* connections served to the end */
    _Atomic uint64_t taken[MAX_CONNS]; /* bytes each took before it hung up (or the limit) */
} gw;

static void serve(int fd, unsigned i)
{
    static char chunk[MiB];
    char req[4096];
    size_t have = 0;
    uint64_t sent = 0;

    /* The request's headers (its small body is left unread). */
    while (have < sizeof(req) - 1) {
        ssize_t r = recv(fd, req + have, sizeof(req) - 1 - have, 0);
        if (r <= 0)
            return;
        have += (size_t)r;
        req[have] = 0;
        if (strstr(req, "\r\n\r\n"))
            break;
    }
    const char *head =
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n";
    if (send(fd, head, strlen(head), MSG_NOSIGNAL) < 0)
        return;
    memset(chunk, 'x', sizeof(chunk));
    while (sent < SEND_LIMIT && !atomic_load(&gw.stop)) {
        ssize_t w = send(fd, chunk, sizeof(chunk), MSG_NOSIGNAL);
        if (w <= 0)
            break;
        sent += (uint64_t)w;
    }
    atomic_store(&gw.taken[i], sent);
}

static void *gateway(void *arg)
{
    (void)arg;
    while (!atomic_load(&gw.stop)) {
        int fd = accept(gw.lfd, NULL, NULL);
        if (fd < 0)
            break;
        unsigned i = atomic_load(&gw.conns);
        if (i < MAX_CONNS)
            serve(fd, i);
        close(fd);
        atomic_fetch_add(&gw.conns, 1);
    }
    return NULL;
}

static int setup(void **state)
{
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof(sa);

    (void)state;
    memset(&gw, 0, sizeof(gw));
    gw.lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_true(gw.lfd >= 0);
    assert_int_equal(bind(gw.lfd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    assert_int_equal(listen(gw.lfd, 8), 0);
    assert_int_equal(getsockname(gw.lfd, (struct sockaddr *)&sa, &len), 0);
    gw.port = ntohs(sa.sin_port);
    assert_int_equal(pthread_create(&gw.thread, NULL, gateway, NULL), 0);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    atomic_store(&gw.stop, true);
    shutdown(gw.lfd, SHUT_RDWR);
    pthread_join(gw.thread, NULL);
    close(gw.lfd);
    return 0;
}

static mc_meta_t *open_gateway(void)
{
    char url[64];
    mc_meta_t *m;

    snprintf(url, sizeof(url), "etcd://127.0.0.1:%d", gw.port);
    assert_int_equal(mc_meta_open(url, &m), 0);
    return m;
}

static uint64_t now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* A unary call fails with a clear reason once the answer passes the limit (64 MiB), and the
 * connection is given up then. */
static void test_endless_answer(void **state)
{
    mc_meta_t *m = open_gateway();
    mc_meta_kv_t kv;

    (void)state;
    int rc = mc_meta_get(m, "k", 1, &kv);
    assert_int_equal(rc, -MC_EMETA);
    assert_non_null(strstr(mc_last_error(), "more than 64 MiB"));
    uint64_t end = now_ms() + 10000;
    while (atomic_load(&gw.conns) < 1 && now_ms() < end)
        usleep(10 * 1000);
    assert_int_equal(atomic_load(&gw.conns), 1);
    uint64_t taken = atomic_load(&gw.taken[0]);
    print_message("the client hung up after %.1f MiB\n", (double)taken / MiB);
    assert_true(taken < 80 * MiB);
    mc_meta_close(m);
}

/* A watch stream whose line never ends is dropped at the limit and started again. */
static void test_endless_watch_line(void **state)
{
    mc_meta_t *m = open_gateway();
    mc_meta_watch_t *w;
    mc_meta_event_t ev;

    (void)state;
    assert_int_equal(mc_meta_watch_create(m, "p/", 2, 1, &w), 0);
    uint64_t end = now_ms() + 20000;
    while (atomic_load(&gw.conns) < 2 && now_ms() < end)
        usleep(10 * 1000);
    assert_true(atomic_load(&gw.conns) >= 2); /* hung up on, and came back */
    for (unsigned i = 0; i < 2; i++) {
        uint64_t taken = atomic_load(&gw.taken[i]);
        print_message("stream %u: the client hung up after %.1f MiB\n", i, (double)taken / MiB);
        assert_true(taken < 80 * MiB);
    }
    assert_int_equal(mc_meta_watch_next(w, 0, &ev), -ETIMEDOUT); /* nothing made of it */
    mc_meta_watch_destroy(w);
    mc_meta_close(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_endless_answer, setup, teardown),
        cmocka_unit_test_setup_teardown(test_endless_watch_line, setup, teardown),
    };

    return cmocka_run_group_tests_name("meta_etcd_garbage", tests, NULL, NULL);
}
