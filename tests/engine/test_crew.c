/* The crew (engine/util/crew.h): every piece of a job runs exactly once; pieces run side by side
 * (two pieces that each wait for the other finish); several threads' jobs share the helpers; a
 * job with no crew, one piece or none runs in the caller; helpers are not pinned like the thread
 * that started them. */
#include <pthread.h>
#include <sched.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#include "util/crew.h"

typedef struct count_job {
    size_t n;
    atomic_uint *runs; /* per piece */
    pthread_t caller;
    atomic_uint elsewhere; /* pieces run by another thread than the caller */
} count_job_t;

static void count_piece(void *arg, size_t i)
{
    count_job_t *j = arg;

    atomic_fetch_add(&j->runs[i], 1);
    if (!pthread_equal(pthread_self(), j->caller))
        atomic_fetch_add(&j->elsewhere, 1);
}

/* Run a job of n pieces on c and check that each ran once; how many ran elsewhere. */
static unsigned run_counted(mc_crew_t *c, size_t n)
{
    count_job_t j = {.n = n, .runs = calloc(n ? n : 1, sizeof(atomic_uint))};

    j.caller = pthread_self();
    mc__crew_run(c, n, count_piece, &j);
    for (size_t i = 0; i < n; i++)
        assert_int_equal(atomic_load(&j.runs[i]), 1);
    free(j.runs);
    return atomic_load(&j.elsewhere);
}

static void test_each_piece_once(void **state)
{
    mc_crew_t *c;

    (void)state;
    assert_int_equal(mc__crew_create(3, &c), 0);
    for (size_t n = 0; n < 40; n++)
        run_counted(c, n);
    run_counted(c, 100000);
    mc__crew_destroy(c);
}

static void test_without_crew(void **state)
{
    mc_crew_t *c = NULL;

    (void)state;
    assert_int_equal(run_counted(NULL, 1000), 0);
    assert_int_equal(mc__crew_create(0, &c), -22); /* -EINVAL */
    assert_null(c);
    assert_int_equal(mc__crew_create(1, &c), 0);
    assert_int_equal(run_counted(c, 1), 0); /* one piece: the caller's */
    mc__crew_destroy(c);
    mc__crew_destroy(NULL);
}

/* Two pieces that each wait (up to 10 s) for the other to start: only side by side do both see
 * the other. */
typedef struct meet {
    atomic_uint arrived, met;
} meet_t;

static void meet_piece(void *arg, size_t i)
{
    meet_t *m = arg;
    struct timespec t0, t;

    (void)i;
    atomic_fetch_add(&m->arrived, 1);
    clock_gettime(CLOCK_MONOTONIC, &t0);
    do {
        if (atomic_load(&m->arrived) == 2) {
            atomic_fetch_add(&m->met, 1);
            return;
        }
        clock_gettime(CLOCK_MONOTONIC, &t);
    } while (t.tv_sec - t0.tv_sec < 10);
}

static void test_side_by_side(void **state)
{
    meet_t m = {0};
    mc_crew_t *c;

    (void)state;
    assert_int_equal(mc__crew_create(1, &c), 0);
    mc__crew_run(c, 2, meet_piece, &m);
    assert_int_equal(atomic_load(&m.met), 2);
    mc__crew_destroy(c);
}

/* Four threads post jobs to one crew of two helpers at once. */
static mc_crew_t *shared;

static void *poster(void *arg)
{
    (void)arg;
    for (int k = 0; k < 200; k++)
        run_counted(shared, (size_t)(k % 17) * 31);
    return NULL;
}

static void test_threads_share(void **state)
{
    pthread_t t[4];

    (void)state;
    assert_int_equal(mc__crew_create(2, &shared), 0);
    for (int i = 0; i < 4; i++)
        assert_int_equal(pthread_create(&t[i], NULL, poster, NULL), 0);
    for (int i = 0; i < 4; i++)
        pthread_join(t[i], NULL);
    mc__crew_destroy(shared);
}

/* Helpers run on the CPUs of the process's main thread, not pinned like the thread that happened
 * to start them. */
typedef struct where {
    pthread_t caller;
    cpu_set_t one;          /* the caller's CPU */
    atomic_int helper_cpus; /* CPUs a piece run by a helper may use; 0: none ran there */
} where_t;

static void where_piece(void *arg, size_t i)
{
    where_t *w = arg;
    cpu_set_t set;
    struct timespec pause = {0, 20 * 1000 * 1000};

    (void)i;
    if (pthread_equal(pthread_self(), w->caller)) {
        nanosleep(&pause, NULL); /* leave the other piece to the helper */
        return;
    }
    /* (no assertion here: cmocka reports only from the test's own thread) */
    atomic_store(&w->helper_cpus, sched_getaffinity(0, sizeof(set), &set) ? -1 : CPU_COUNT(&set));
}

/* A thread pinned to one CPU starts a crew and runs jobs on it until a helper ran a piece. */
static void *pinned_poster(void *arg)
{
    where_t *w = arg;
    mc_crew_t *c;

    w->caller = pthread_self();
    if (pthread_setaffinity_np(pthread_self(), sizeof(w->one), &w->one) || mc__crew_create(1, &c))
        return NULL;
    for (int k = 0; k < 50 && !atomic_load(&w->helper_cpus); k++)
        mc__crew_run(c, 2, where_piece, w);
    mc__crew_destroy(c);
    return NULL;
}

static void test_helpers_not_pinned(void **state)
{
    cpu_set_t all;
    where_t w = {.helper_cpus = 0};
    pthread_t t;
    int cpu = -1;

    (void)state;
    assert_int_equal(sched_getaffinity(getpid(), sizeof(all), &all), 0);
    if (CPU_COUNT(&all) < 2)
        skip();
    for (int i = 0; i < CPU_SETSIZE && cpu < 0; i++)
        if (CPU_ISSET(i, &all))
            cpu = i;
    CPU_ZERO(&w.one);
    CPU_SET(cpu, &w.one);
    assert_int_equal(pthread_create(&t, NULL, pinned_poster, &w), 0);
    pthread_join(t, NULL);
    assert_int_equal(atomic_load(&w.helper_cpus), CPU_COUNT(&all));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_each_piece_once),    cmocka_unit_test(test_without_crew),
        cmocka_unit_test(test_side_by_side),       cmocka_unit_test(test_threads_share),
        cmocka_unit_test(test_helpers_not_pinned),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
