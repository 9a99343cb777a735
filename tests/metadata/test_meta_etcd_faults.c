/* The etcd:// backend while etcd dies and comes back: watches resume without losing or repeating
 * an event, calls fail within their bound while etcd is away, compacted history is re-listed,
 * and a watch cut off from a live etcd (through a proxy the test cuts) while keys went and
 * history was compacted reports those deletions when it is back. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <cmocka.h>

#include <mooncake/error.h>

#include "etcd_proc.h"
#include "metadata/meta.h"

static etcd_proc_t etcd;
static mc_meta_t *meta;

/* Put seq/<i> = i, retrying while etcd comes back. */
static void put_seq(const char *prefix, int i)
{
    char key[64], val[16];
    int rc = -1;

    snprintf(key, sizeof(key), "%s%04d", prefix, i);
    snprintf(val, sizeof(val), "%d", i);
    for (int t = 0; t < 100 && rc; t++) {
        rc = mc__meta_put(meta, key, strlen(key), val, strlen(val), 0, NULL);
        if (rc)
            etcd_test_sleep_ms(100);
    }
    assert_int_equal(rc, 0);
}

/* The next n events are PUTs of prefix<from..from+n-1>, in order. */
static void expect_seq(mc_meta_watch_t *w, const char *prefix, int from, int n)
{
    for (int i = from; i < from + n; i++) {
        mc_meta_event_t ev;
        char key[64];
        snprintf(key, sizeof(key), "%s%04d", prefix, i);
        assert_int_equal(mc__meta_watch_next(w, 10000, &ev), 0);
        assert_int_equal(ev.type, MC_META_PUT);
        if (ev.kv.key_len != strlen(key) || memcmp(ev.kv.key, key, ev.kv.key_len))
            fail_msg("event %d: got key %.*s, want %s", i, (int)ev.kv.key_len, ev.kv.key, key);
        assert_int_equal(atoi(ev.kv.value), i);
        mc__meta_kv_free(&ev.kv);
    }
}

static void watch_across_restart(int sig, const char *prefix)
{
    mc_meta_watch_t *w;
    mc_meta_event_t ev;
    mc_meta_kv_t kv;
    int64_t t0;

    assert_int_equal(mc__meta_watch_create(meta, prefix, strlen(prefix), 0, &w), 0);
    for (int i = 0; i < 10; i++)
        put_seq(prefix, i);
    expect_seq(w, prefix, 0, 5); /* the stream is up; 5 more are queued or in flight */
    etcd_proc_kill(&etcd, sig);
    /* While etcd is away, calls fail within their bound. */
    t0 = etcd_test_now_ms();
    assert_true(mc__meta_get(meta, "x", 1, &kv) < 0);
    assert_true(etcd_test_now_ms() - t0 < 4000);
    assert_true(mc__meta_lease_keepalive(meta, 12345) < 0);
    etcd_test_sleep_ms(1500); /* the watcher backs off */
    assert_int_equal(etcd_proc_restart(&etcd), 0);
    /* Made before the watcher is back on its feet: none may be lost. */
    for (int i = 10; i < 30; i++)
        put_seq(prefix, i);
    expect_seq(w, prefix, 5, 25);
    assert_int_equal(mc__meta_watch_next(w, 500, &ev), -ETIMEDOUT); /* and none repeated */
    mc__meta_watch_destroy(w);
}

static void test_watch_survives_sigkill(void **state)
{
    (void)state;
    watch_across_restart(SIGKILL, "kill/");
}

static void test_watch_survives_sigterm(void **state)
{
    (void)state;
    watch_across_restart(SIGTERM, "term/");
}

/* A lease outlives a short outage when kept alive before and after it. */
static void test_lease_across_restart(void **state)
{
    int64_t lease;
    mc_meta_kv_t kv;

    (void)state;
    assert_int_equal(mc__meta_lease_grant(meta, 30, &lease), 0);
    assert_int_equal(mc__meta_put(meta, "lr/k", 4, "v", 1, lease, NULL), 0);
    etcd_proc_kill(&etcd, SIGKILL);
    assert_true(mc__meta_lease_keepalive(meta, lease) < 0);
    assert_int_equal(etcd_proc_restart(&etcd), 0);
    int rc = -1;
    for (int t = 0; t < 50 && rc; t++) {
        rc = mc__meta_lease_keepalive(meta, lease);
        if (rc)
            etcd_test_sleep_ms(100);
    }
    assert_int_equal(rc, 0);
    assert_int_equal(mc__meta_get(meta, "lr/k", 4, &kv), 0);
    mc__meta_kv_free(&kv);
    assert_int_equal(mc__meta_lease_revoke(meta, lease), 0);
}

/* Compact etcd's history up to rev. */
static void compact(int64_t rev)
{
    assert_int_equal(etcd_proc_sh(&etcd,
                                  "curl -sf -m 5 %s/v3/kv/compaction -d '{\"revision\":\"%lld\"}'"
                                  " >/dev/null",
                                  etcd.http, (long long)rev),
                     0);
}

/* A watch from a revision etcd compacted away re-lists the prefix, then goes on. */
static void test_watch_compacted(void **state)
{
    mc_meta_watch_t *w;
    int64_t r0, rev;

    (void)state;
    assert_int_equal(mc__meta_put(meta, "cmp/a", 5, "1", 1, 0, &r0), 0);
    assert_int_equal(mc__meta_put(meta, "cmp/a", 5, "2", 1, 0, NULL), 0);
    assert_int_equal(mc__meta_put(meta, "cmp/b", 5, "3", 1, 0, &rev), 0);
    compact(rev);
    assert_int_equal(mc__meta_watch_create(meta, "cmp/", 4, r0, &w), 0);
    mc_meta_event_t ev;
    assert_int_equal(mc__meta_watch_next(w, 10000, &ev), 0);
    assert_int_equal(ev.type, MC_META_PUT);
    assert_memory_equal(ev.kv.key, "cmp/a", 5);
    assert_memory_equal(ev.kv.value, "2", 1);
    mc__meta_kv_free(&ev.kv);
    assert_int_equal(mc__meta_watch_next(w, 10000, &ev), 0);
    assert_memory_equal(ev.kv.key, "cmp/b", 5);
    mc__meta_kv_free(&ev.kv);
    assert_int_equal(mc__meta_put(meta, "cmp/c", 5, "4", 1, 0, NULL), 0);
    assert_int_equal(mc__meta_watch_next(w, 10000, &ev), 0);
    assert_memory_equal(ev.kv.key, "cmp/c", 5);
    mc__meta_kv_free(&ev.kv);
    assert_int_equal(mc__meta_watch_next(w, 300, &ev), -ETIMEDOUT);
    mc__meta_watch_destroy(w);
}

/* ---- a TCP proxy to etcd whose connections the test can cut ---- */

static struct {
    int lfd, port;
    struct sockaddr_in to;
    atomic_bool cut, stop;
    pthread_t tid;
} proxy;

/* Copy both ways until either side closes or the proxy is cut. */
static void *proxy_relay(void *arg)
{
    int a = (int)(intptr_t)arg, b = socket(AF_INET, SOCK_STREAM, 0);
    char buf[16384];

    if (b >= 0 && connect(b, (struct sockaddr *)&proxy.to, sizeof(proxy.to)) == 0) {
        struct pollfd p[2] = {{.fd = a, .events = POLLIN}, {.fd = b, .events = POLLIN}};
        while (!atomic_load(&proxy.cut) && !atomic_load(&proxy.stop)) {
            if (poll(p, 2, 20) <= 0)
                continue;
            bool done = false;
            for (int i = 0; i < 2 && !done; i++) {
                if (!p[i].revents)
                    continue;
                ssize_t n = read(p[i].fd, buf, sizeof(buf));
                done = n <= 0 || send(p[1 - i].fd, buf, (size_t)n, MSG_NOSIGNAL) != n;
            }
            if (done)
                break;
        }
    }
    close(a);
    if (b >= 0)
        close(b);
    return NULL;
}

/* Accept; while cut, close what comes at once (the client sees its stream end). */
static void *proxy_accept(void *arg)
{
    (void)arg;
    while (!atomic_load(&proxy.stop)) {
        struct pollfd p = {.fd = proxy.lfd, .events = POLLIN};
        if (poll(&p, 1, 50) <= 0)
            continue;
        int c = accept(proxy.lfd, NULL, NULL);
        pthread_t t;
        if (c < 0)
            continue;
        if (atomic_load(&proxy.cut) || pthread_create(&t, NULL, proxy_relay, (void *)(intptr_t)c))
            close(c);
        else
            pthread_detach(t);
    }
    return NULL;
}

static void proxy_start(void)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof(a);
    int port;

    atomic_store(&proxy.cut, false);
    atomic_store(&proxy.stop, false);
    assert_int_equal(sscanf(etcd.endpoint, "127.0.0.1:%d", &port), 1);
    proxy.to = a;
    proxy.to.sin_port = htons((uint16_t)port);
    proxy.lfd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(proxy.lfd >= 0);
    assert_int_equal(bind(proxy.lfd, (struct sockaddr *)&a, sizeof(a)), 0);
    assert_int_equal(listen(proxy.lfd, 16), 0);
    assert_int_equal(getsockname(proxy.lfd, (struct sockaddr *)&a, &len), 0);
    proxy.port = ntohs(a.sin_port);
    assert_int_equal(pthread_create(&proxy.tid, NULL, proxy_accept, NULL), 0);
}

/* (also from the teardown, after an assertion left it running) */
static void proxy_stop(void)
{
    if (!proxy.tid)
        return;
    atomic_store(&proxy.stop, true);
    pthread_join(proxy.tid, NULL);
    proxy.tid = 0;
    close(proxy.lfd);
    etcd_test_sleep_ms(100); /* the relays see stop within a poll of 20 ms */
}

/* The next event, which must come within 10 s. */
static mc_meta_event_t next_event(mc_meta_watch_t *w)
{
    mc_meta_event_t ev;

    assert_int_equal(mc__meta_watch_next(w, 10000, &ev), 0);
    return ev;
}

/* A watch whose stream is cut while etcd lives on, a key it knew is deleted and the history is
 * compacted past its revision: back, it reports that key deleted (at the listing's revision),
 * then the keys there, each once. The key deleted was there before the watch started, so only
 * the keys it listed at its start revision know it. */
static void test_watch_gap_deletions(void **state)
{
    char url[64];
    mc_meta_t *via;
    mc_meta_watch_t *w;
    mc_meta_event_t ev;
    int64_t rev;

    (void)state;
    proxy_start();
    snprintf(url, sizeof(url), "etcd://127.0.0.1:%d", proxy.port);
    assert_int_equal(mc__meta_put(meta, "gap/a", 5, "a", 1, 0, NULL), 0);
    assert_int_equal(mc__meta_put(meta, "gap/b", 5, "b1", 2, 0, NULL), 0);
    assert_int_equal(mc__meta_open(url, NULL, &via), 0);
    assert_int_equal(mc__meta_watch_create(via, "gap/", 4, 0, &w), 0);
    assert_int_equal(mc__meta_put(meta, "gap/c", 5, "c", 1, 0, NULL), 0);
    ev = next_event(w); /* the stream is up */
    assert_int_equal(ev.type, MC_META_PUT);
    assert_memory_equal(ev.kv.key, "gap/c", 5);
    mc__meta_kv_free(&ev.kv);

    atomic_store(&proxy.cut, true);
    etcd_test_sleep_ms(300);
    assert_int_equal(mc__meta_del(meta, "gap/a", 5), 0);
    assert_int_equal(mc__meta_put(meta, "gap/b", 5, "b2", 2, 0, NULL), 0);
    assert_int_equal(mc__meta_put(meta, "gap/d", 5, "d", 1, 0, &rev), 0);
    compact(rev);
    assert_int_equal(mc__meta_watch_next(w, 500, &ev), -ETIMEDOUT); /* cut off */
    atomic_store(&proxy.cut, false);

    ev = next_event(w);
    assert_int_equal(ev.type, MC_META_DELETE);
    assert_int_equal(ev.kv.key_len, 5);
    assert_memory_equal(ev.kv.key, "gap/a", 5);
    assert_true(ev.kv.mod_revision >= rev);
    mc__meta_kv_free(&ev.kv);
    static const char *const keys[] = {"gap/b", "gap/c", "gap/d"}, *const vals[] = {"b2", "c", "d"};
    for (int i = 0; i < 3; i++) {
        ev = next_event(w);
        assert_int_equal(ev.type, MC_META_PUT);
        assert_int_equal(ev.kv.key_len, 5);
        assert_memory_equal(ev.kv.key, keys[i], 5);
        assert_int_equal(ev.kv.value_len, strlen(vals[i]));
        assert_memory_equal(ev.kv.value, vals[i], strlen(vals[i]));
        mc__meta_kv_free(&ev.kv);
    }
    assert_int_equal(mc__meta_watch_next(w, 300, &ev), -ETIMEDOUT);
    /* and on from there */
    assert_int_equal(mc__meta_del(meta, "gap/c", 5), 0);
    ev = next_event(w);
    assert_int_equal(ev.type, MC_META_DELETE);
    assert_memory_equal(ev.kv.key, "gap/c", 5);
    mc__meta_kv_free(&ev.kv);

    /* Cut off again while every key goes: an empty listing reports each one deleted. */
    atomic_store(&proxy.cut, true);
    etcd_test_sleep_ms(300);
    assert_int_equal(mc__meta_del(meta, "gap/b", 5), 0);
    assert_int_equal(mc__meta_del(meta, "gap/d", 5), 0);
    assert_int_equal(mc__meta_put(meta, "other", 5, "x", 1, 0, &rev), 0);
    compact(rev);
    atomic_store(&proxy.cut, false);
    for (int i = 0; i < 2; i++) {
        ev = next_event(w);
        assert_int_equal(ev.type, MC_META_DELETE);
        assert_memory_equal(ev.kv.key, i ? "gap/d" : "gap/b", 5);
        mc__meta_kv_free(&ev.kv);
    }
    assert_int_equal(mc__meta_watch_next(w, 300, &ev), -ETIMEDOUT);
    mc__meta_watch_destroy(w);
    mc__meta_close(via);
    proxy_stop();
}

static int group_setup(void **state)
{
    (void)state;
    etcd_proc_start_or_skip(&etcd, NULL);
    setenv("MC_ETCD_TIMEOUT_MS", "2000", 1);
    return mc__meta_open(etcd.url, NULL, &meta);
}

static int group_teardown(void **state)
{
    (void)state;
    proxy_stop();
    mc__meta_close(meta);
    etcd_proc_stop(&etcd);
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_watch_survives_sigkill),
        cmocka_unit_test(test_watch_survives_sigterm),
        cmocka_unit_test(test_lease_across_restart),
        cmocka_unit_test(test_watch_compacted),
        cmocka_unit_test(test_watch_gap_deletions),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
