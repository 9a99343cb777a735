/* The owner side of same-host CMA (engine/transport/shm/shm_regtab.c): an unregister waits for
 * peers' calls on its memory, which hold a lane of their slot odd while they run.
 * - a lane odd past MC_IO_TIMEOUT_MS (a live peer's call): the unregister fails with
 *   -MC_ETIMEOUT and keeps the buffer (before, it returned 0 and the peer's call could still
 *   write the memory the host then reused); once the lane moved on, it succeeds;
 * - a lane left odd by a peer that died in its call, reaped or a zombie: not waited for (before,
 *   every unregister waited the whole timeout until another peer took the slot).
 * - an engine destroyed while a live peer's call still runs: its own allocations stay mapped
 *   (before, they were unmapped, and the peer's call could write whatever was mapped there
 *   next); without such a call they are unmapped.
 * The lanes are set here by hand, as a peer's call would leave them. */
#include <errno.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#include <mooncake/engine.h>

#include "transport/shm/shm_int.h"
#include "unit_engine.h"

static mc_engine_t *engine_new(void)
{
    return unit_engine((const char *const[]){"IO_TIMEOUT_MS", "300", NULL});
}

static int64_t now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* A process that has exited and been reaped: its pid names nobody. */
static pid_t dead_pid(void)
{
    pid_t pid = fork();

    assert_true(pid >= 0);
    if (!pid)
        _exit(0);
    assert_int_equal(waitpid(pid, NULL, 0), pid);
    return pid;
}

static void test_grace(void **state)
{
    static char buf[4096];
    mc_engine_t *e = engine_new();
    shm_engine_t *se = e->tp[mc__shm_slot];

    (void)state;
    if (!se || !se->regtab) {
        mc_engine_destroy(e);
        skip(); /* no shared registration table here: no CMA to wait for */
    }
    _Atomic uint64_t *lane = &se->regtab->slot[3].lane[1];

    /* a live peer's call that does not end */
    atomic_store(&se->regtab_pid[3], getpid());
    atomic_store(lane, 1);
    assert_int_equal(mc_mem_register(e, buf, sizeof(buf), "cpu:0"), 0);
    int64_t t0 = now_ms();
    assert_int_equal(mc_mem_unregister(e, buf), -MC_ETIMEOUT);
    assert_true(now_ms() - t0 >= 300);
    atomic_store(lane, 2); /* it ended */
    assert_int_equal(mc_mem_unregister(e, buf), 0);

    /* a peer that died in its call */
    atomic_store(&se->regtab_pid[3], dead_pid());
    atomic_store(lane, 3);
    assert_int_equal(mc_mem_register(e, buf, sizeof(buf), "cpu:0"), 0);
    t0 = now_ms();
    assert_int_equal(mc_mem_unregister(e, buf), 0);
    if (now_ms() - t0 >= 300)
        fail_msg("the unregister waited %lld ms for a dead peer's lane",
                 (long long)(now_ms() - t0));
    /* one that died in its call and is not reaped yet (a zombie makes no call) */
    pid_t z = fork();
    assert_true(z >= 0);
    if (!z)
        _exit(0);
    for (int64_t end = now_ms() + 5000; now_ms() < end;) { /* until it is a zombie */
        siginfo_t si = {0};
        if (!waitid(P_PID, (id_t)z, &si, WEXITED | WNOHANG | WNOWAIT) && si.si_pid == z)
            break;
        usleep(1000);
    }
    atomic_store(&se->regtab_pid[3], z);
    atomic_store(lane, 5);
    assert_int_equal(mc_mem_register(e, buf, sizeof(buf), "cpu:0"), 0);
    t0 = now_ms();
    assert_int_equal(mc_mem_unregister(e, buf), 0);
    if (now_ms() - t0 >= 300)
        fail_msg("the unregister waited %lld ms for a zombie's lane", (long long)(now_ms() - t0));
    assert_int_equal(waitpid(z, NULL, 0), z);
    atomic_store(lane, 0);
    atomic_store(&se->regtab_pid[3], 0);
    mc_engine_destroy(e);
}

/* Whether [a, a + len) is mapped. */
static bool mapped(void *a, size_t len)
{
    return msync(a, len, MS_ASYNC) == 0;
}

static void test_destroy_keeps_memory(void **state)
{
    const size_t len = 1 << 20;
    void *a;

    (void)state;
    for (int stuck = 0; stuck < 2; stuck++) {
        mc_engine_t *e = engine_new();
        shm_engine_t *se = e->tp[mc__shm_slot];
        if (!se || !se->regtab) {
            mc_engine_destroy(e);
            skip();
        }
        assert_int_equal(mc_mem_alloc(e, len, "cpu:0", &a), 0);
        memset(a, 0x5a, len);
        if (stuck) { /* a live peer's call on our memory that does not end */
            atomic_store(&se->regtab_pid[3], getpid());
            atomic_store(&se->regtab->slot[3].lane[1], 1);
        }
        int64_t t0 = now_ms();
        mc_engine_destroy(e);
        if (!stuck) {
            assert_false(mapped(a, len));
            continue;
        }
        assert_true(now_ms() - t0 >= 300); /* it waited for the call first */
        assert_true(mapped(a, len));
        assert_true(((uint8_t *)a)[0] == 0x5a && ((uint8_t *)a)[len - 1] == 0x5a);
        munmap(a, len);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_grace),
                                       cmocka_unit_test(test_destroy_keeps_memory)};

    return cmocka_run_group_tests_name("shm_regtab", tests, NULL, NULL);
}
