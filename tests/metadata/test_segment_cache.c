/* Peer descriptors cached and refreshed by watch: with etcd down, a segment seen before can be
 * opened again, and memory it registered while etcd was up (learned through the watch) can be
 * written. A burst of registrations is published a few times, not once each. A peer whose
 * lease expires because its process stopped answering is reported dead. Engines in this
 * process and in a child (this program again), a real etcd from the fixture. */
#include <errno.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include <mooncake/engine.h>

#include "etcd_proc.h"

#define LEN (1u << 20)

static etcd_proc_t etcd;

static mc_engine_t *engine_ttl(const char *url, const char *ttl)
{
    mc_config_t *cfg;
    mc_engine_t *e;

    assert_int_equal(mc_config_create(&cfg), 0);
    assert_int_equal(mc_config_set(cfg, "METADATA", url), 0);
    assert_int_equal(mc_config_set(cfg, "METADATA_TTL", ttl), 0);
    assert_int_equal(mc_engine_create(cfg, &e), 0);
    mc_config_destroy(cfg);
    return e;
}

static mc_engine_t *engine(void)
{
    return engine_ttl(etcd.url, "5");
}

static int xfer(mc_engine_t *e, mc_opcode_t op, void *local, mc_segment_id_t seg, void *remote)
{
    mc_batch_t *b;
    mc_batch_status_t st;
    mc_request_t r = {.opcode = op,
                      .local = local,
                      .target = seg,
                      .target_offset = (uint64_t)(uintptr_t)remote,
                      .length = LEN};

    assert_int_equal(mc_batch_create(e, 1, &b), 0);
    assert_int_equal(mc_batch_submit(b, &r, 1, NULL), 0);
    assert_int_equal(mc_batch_wait(b, 30000), 0);
    assert_int_equal(mc_batch_status(b, &st), 0);
    while (mc_batch_destroy(b) == -EBUSY)
        etcd_test_sleep_ms(1);
    return st.state;
}

static void test_cache(void **state)
{
    (void)state;
    mc_engine_t *a = engine(), *b = engine();
    uint8_t *abuf, *abuf2, *bbuf;
    mc_segment_id_t seg;

    assert_int_equal(mc_mem_alloc(a, LEN, "*", (void **)&abuf), 0);
    assert_int_equal(mc_mem_alloc(b, LEN, "*", (void **)&bbuf), 0);
    memset(bbuf, 0x5a, LEN);

    /* Opened once through etcd: the descriptor is cached and the prefix watched. */
    assert_int_equal(mc_segment_open(b, mc_engine_segment_name(a), &seg), 0);
    assert_int_equal(xfer(b, MC_WRITE, bbuf, seg, abuf), MC_TASK_COMPLETED);
    assert_memory_equal(abuf, bbuf, LEN);

    /* A registers more memory while etcd is up; b learns of it only through the watch. */
    assert_int_equal(mc_mem_alloc(a, LEN, "*", (void **)&abuf2), 0);
    etcd_test_sleep_ms(1500);

    etcd_proc_kill(&etcd, SIGKILL);
    memset(bbuf, 0xc3, LEN);
    assert_int_equal(xfer(b, MC_WRITE, bbuf, seg, abuf2), MC_TASK_COMPLETED);
    assert_memory_equal(abuf2, bbuf, LEN);

    /* Closed and opened again by name with etcd still down: served from the cache. */
    assert_int_equal(mc_segment_close(b, seg), 0);
    assert_int_equal(mc_segment_open(b, mc_engine_segment_name(a), &seg), 0);
    memset(bbuf, 0x17, LEN);
    assert_int_equal(xfer(b, MC_WRITE, bbuf, seg, abuf), MC_TASK_COMPLETED);
    assert_memory_equal(abuf, bbuf, LEN);

    /* A name never seen fails cleanly (no cache entry, no etcd). */
    mc_segment_id_t none;
    int rc = mc_segment_open(b, "never-published", &none);
    assert_true(rc < 0);

    assert_int_equal(etcd_proc_restart(&etcd), 0);
    assert_int_equal(mc_segment_close(b, seg), 0);
    mc_mem_free(a, abuf);
    mc_mem_free(a, abuf2);
    mc_mem_free(b, bbuf);
    mc_engine_destroy(b);
    mc_engine_destroy(a);
}

/* The publish count of a's descriptor key so far (etcd's per-key version). */
static int key_version(mc_engine_t *a)
{
    char cmd[512], out[64] = "";

    snprintf(cmd, sizeof(cmd),
             "etcdctl --endpoints=$ETCD_ENDPOINT get mooncake/ram/%s -w json | "
             "grep -o '\"version\":[0-9]*' | cut -d: -f2 > %s/version",
             mc_engine_segment_name(a), etcd.dir);
    assert_int_equal(etcd_proc_sh(&etcd, "%s", cmd), 0);
    snprintf(cmd, sizeof(cmd), "%s/version", etcd.dir);
    FILE *f = fopen(cmd, "r");
    assert_non_null(f);
    assert_non_null(fgets(out, sizeof(out), f));
    fclose(f);
    return atoi(out);
}

/* 1000 registrations in a row, as a pool registered block by block: the descriptor is
 * published a handful of times, not a thousand, and the last publish lists them all. */
static void test_publish_coalesced(void **state)
{
    enum { N = 1000, BLK = 4096 };
    (void)state;
    mc_engine_t *a = engine(), *b = engine();
    uint8_t *pool = aligned_alloc(BLK, (size_t)N * BLK);
    mc_segment_id_t seg;
    size_t n = 0;

    assert_non_null(pool);
    int v0 = key_version(a);
    for (int i = 0; i < N; i++)
        assert_int_equal(mc_mem_register(a, pool + (size_t)i * BLK, BLK, "cpu:0"), 0);
    etcd_test_sleep_ms(500);
    int published = key_version(a) - v0;
    print_message("  %d registrations, %d publishes\n", N, published);
    assert_true(published >= 1 && published < 50);
    assert_int_equal(mc_segment_open(b, mc_engine_segment_name(a), &seg), 0);
    assert_int_equal(mc_segment_buffers(b, seg, NULL, 0, &n), 0);
    assert_int_equal(n, N);
    assert_int_equal(mc_segment_close(b, seg), 0);
    for (int i = 0; i < N; i++)
        assert_int_equal(mc_mem_unregister(a, pool + (size_t)i * BLK), 0);
    mc_engine_destroy(b);
    mc_engine_destroy(a);
    free(pool);
}

static void on_dead(void *arg, mc_segment_id_t id, mc_peer_event_t ev, int error,
                    const char *reason)
{
    (void)id;
    (void)error;
    if (ev == MC_PEER_DEAD) {
        snprintf(arg, 512, "%s", reason);
        __atomic_store_n((char *)arg + 511, 1, __ATOMIC_RELEASE);
    }
}

/* Child: an engine with a 2 s lease and one buffer; prints "name addr", then waits. */
static int child_main(const char *url)
{
    mc_engine_t *e = engine_ttl(url, "2");
    void *buf;

    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (mc_mem_alloc(e, LEN, "*", &buf))
        return 1;
    printf("%s %llu\n", mc_engine_segment_name(e), (unsigned long long)(uintptr_t)buf);
    fflush(stdout);
    for (;;)
        pause();
}

/* A peer's process stops (SIGSTOP): its lease expires, etcd deletes its entry, and since it
 * does not answer either (for 10 x MC_IO_TIMEOUT_MS), the host hears DEAD and tasks to it fail
 * with -MC_EPEERDEAD. */
static void test_lease_expiry_dead(void **state)
{
    static char why[512];
    char exe[4096], name[MC_NAME_MAX];
    unsigned long long raddr;
    int fds[2];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);

    (void)state;
    assert_true(n > 0);
    exe[n] = 0;
    assert_int_equal(pipe(fds), 0);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fds[1], 1);
        execl(exe, exe, "--child", etcd.url, (char *)NULL);
        _exit(127);
    }
    close(fds[1]);
    FILE *f = fdopen(fds[0], "r");
    assert_int_equal(fscanf(f, "%127s %llu", name, &raddr), 2);
    fclose(f);

    setenv("MC_IO_TIMEOUT_MS", "500", 1); /* a silent peer gets 10x that to answer */
    mc_engine_t *b = engine();
    unsetenv("MC_IO_TIMEOUT_MS");
    uint8_t *buf;
    mc_segment_id_t seg;
    memset(why, 0, sizeof(why));
    assert_int_equal(mc_peer_handler_set(b, on_dead, why), 0);
    assert_int_equal(mc_mem_alloc(b, LEN, "*", (void **)&buf), 0);
    assert_int_equal(mc_segment_open(b, name, &seg), 0);
    assert_int_equal(xfer(b, MC_WRITE, buf, seg, (void *)(uintptr_t)raddr), MC_TASK_COMPLETED);

    assert_int_equal(kill(pid, SIGSTOP), 0);
    int64_t t0 = etcd_test_now_ms();
    while (!__atomic_load_n(&why[511], __ATOMIC_ACQUIRE) && etcd_test_now_ms() - t0 < 15000)
        etcd_test_sleep_ms(10);
    print_message("  DEAD %lld ms after SIGSTOP: %s\n", (long long)(etcd_test_now_ms() - t0), why);
    assert_true(why[511]);
    assert_non_null(strstr(why, "lease"));
    assert_int_equal(mc_segment_state(b, seg), MC_SEGMENT_DEAD);
    assert_int_equal(xfer(b, MC_WRITE, buf, seg, (void *)(uintptr_t)raddr), MC_TASK_FAILED);
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    assert_int_equal(mc_segment_close(b, seg), 0);
    mc_mem_free(b, buf);
    mc_engine_destroy(b);
}

int main(int argc, char **argv)
{
    if (argc == 3 && !strcmp(argv[1], "--child"))
        return child_main(argv[2]);
    int rc = etcd_proc_start(&etcd, NULL);

    if (rc == 77)
        return 77;
    if (rc)
        return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cache),
        cmocka_unit_test(test_publish_coalesced),
        cmocka_unit_test(test_lease_expiry_dead),
    };
    rc = cmocka_run_group_tests(tests, NULL, NULL);
    etcd_proc_stop(&etcd);
    return rc;
}
