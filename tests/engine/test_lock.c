/* The engine lock (engine/util/lock.h) and per-thread buffers (engine/util/thread_buf.h).
 *
 * Lock: four threads each add 10^5 times to a plain counter under it, and the total is exact;
 * a thread that waits while another holds the lock for 30 ms (many naps) marks it and takes it
 * once it is free, and mc_lock_try fails while it is held. Buffers: each thread gets its
 * own, zeroed, the same one at every call, and keeps what it wrote while others write theirs;
 * a thread that used one exits safely after the library that made it was unloaded. */
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#include "util/lock.h"
#include "util/thread_buf.h"

#define THREADS 4
#define ADDS    100000

static mc_lock_t lock;
static uint64_t counter; /* only under lock */

static void *adder(void *arg)
{
    (void)arg;
    for (int i = 0; i < ADDS; i++) {
        if (i % 2)
            mc_lock(&lock);
        else
            while (!mc_lock_try(&lock))
                ;
        counter++;
        mc_unlock(&lock);
    }
    return NULL;
}

static void test_lock_counts(void **state)
{
    pthread_t t[THREADS];

    (void)state;
    counter = 0;
    for (int i = 0; i < THREADS; i++)
        assert_int_equal(pthread_create(&t[i], NULL, adder, NULL), 0);
    for (int i = 0; i < THREADS; i++)
        pthread_join(t[i], NULL);
    assert_int_equal(counter, (uint64_t)THREADS * ADDS);
    assert_true(mc_lock_try(&lock)); /* left free */
    mc_unlock(&lock);
}

static double now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static atomic_bool waiter_in;
static double taken_ms;

static void *waiter(void *arg)
{
    (void)arg;
    atomic_store(&waiter_in, true);
    mc_lock(&lock);
    taken_ms = now_ms();
    mc_unlock(&lock);
    return NULL;
}

static void test_lock_sleeper(void **state)
{
    struct timespec hold = {0, 30 * 1000 * 1000};
    pthread_t t;

    (void)state;
    mc_lock(&lock);
    assert_false(mc_lock_try(&lock));
    assert_int_equal(pthread_create(&t, NULL, waiter, NULL), 0);
    while (!atomic_load(&waiter_in))
        ;
    nanosleep(&hold, NULL); /* the waiter spins, marks the lock and naps */
    for (double dl = now_ms() + 10000; atomic_load(&lock.v) != 2 && now_ms() < dl;)
        nanosleep(&hold, NULL); /* (a machine too busy to have run it yet) */
    assert_int_equal(atomic_load(&lock.v), 2);
    double freed_ms = now_ms();
    mc_unlock(&lock);
    pthread_join(t, NULL);
    assert_true(taken_ms - freed_ms < 50.0); /* a wake-up or a nap later, on a busy machine */
    assert_true(mc_lock_try(&lock));
    mc_unlock(&lock);
    assert_int_equal(atomic_load(&lock.v), 0);
}

static mc_thread_buf_t buf = MC_THREAD_BUF_INIT(64);
static __thread void *mine;
static atomic_int bad;

static void *buf_user(void *arg)
{
    char *b = mc__thread_buf(&buf, &mine);
    char want[64];

    if (!b || memchr(b, 0, 64) != b || memcmp(b, b + 1, 63)) /* zeroed */
        atomic_fetch_add(&bad, 1);
    memset(want, (int)(intptr_t)arg, sizeof(want));
    for (int i = 0; b && i < 1000; i++) {
        memcpy(b, want, sizeof(want));
        sched_yield();
        if (mc__thread_buf(&buf, &mine) != b || memcmp(b, want, sizeof(want)))
            atomic_fetch_add(&bad, 1);
    }
    return NULL;
}

static void test_thread_buf(void **state)
{
    pthread_t t[THREADS];

    (void)state;
    for (int i = 0; i < THREADS; i++)
        assert_int_equal(pthread_create(&t[i], NULL, buf_user, (void *)(intptr_t)(i + 1)), 0);
    for (int i = 0; i < THREADS; i++)
        pthread_join(t[i], NULL);
    assert_int_equal(atomic_load(&bad), 0);
    char *b = mc__thread_buf(&buf, &mine);
    assert_non_null(b);
    assert_ptr_equal(mc__thread_buf(&buf, &mine), b);
}

/* The library carries the buffers' keys; a host that dlopen'd it (the KV plugin and the UCX
 * module carry the engine inside) may dlclose it while a thread that used a buffer lives on.
 * That thread's exit must not run a destructor that went with the library (it crashed so). In
 * a child: a thread gets an error from the loaded engine (its message is in a buffer), the
 * library goes, then the thread exits. */
static struct {
    pthread_barrier_t meet;
    void *lib;
} unload;

static void *error_then_wait(void *arg)
{
    int (*progress)(void *);
    const char *(*last_error)(void);

    (void)arg;
    *(void **)&progress = dlsym(unload.lib, "mc_engine_progress");
    *(void **)&last_error = dlsym(unload.lib, "mc_last_error");
    if (!progress || !last_error || progress(NULL) != -EINVAL ||
        !strstr(last_error(), "NULL engine"))
        _exit(3);
    pthread_barrier_wait(&unload.meet); /* the library goes */
    pthread_barrier_wait(&unload.meet);
    return NULL;
}

static void test_buf_outlives_library(void **state)
{
    char path[4096];
    int status;

    (void)state;
    snprintf(path, sizeof(path), "%s/lib/libmooncake_te.so.0", getenv("MC_BUILD_DIR"));
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        pthread_t t;
        signal(SIGSEGV, SIG_DFL); /* not cmocka's: the parent reads how the child ended */
        if (!(unload.lib = dlopen(path, RTLD_NOW | RTLD_LOCAL)))
            _exit(2);
        pthread_barrier_init(&unload.meet, NULL, 2);
        if (pthread_create(&t, NULL, error_then_wait, NULL))
            _exit(2);
        pthread_barrier_wait(&unload.meet);
        if (dlclose(unload.lib))
            _exit(4);
        pthread_barrier_wait(&unload.meet);
        pthread_join(t, NULL); /* its exit ran what the keys left */
        _exit(0);
    }
    assert_int_equal(waitpid(pid, &status, 0), pid);
    if (WIFSIGNALED(status))
        fail_msg("the thread's exit after the unload died of signal %d", WTERMSIG(status));
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lock_counts),
        cmocka_unit_test(test_lock_sleeper),
        cmocka_unit_test(test_thread_buf),
        cmocka_unit_test(test_buf_outlives_library),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
