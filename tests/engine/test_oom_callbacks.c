/*
 * Completions when memory runs out: a send's or a flush's callback that finds no memory for
 * the record that holds it until the end of the pass still runs, exactly once, with its status.
 *
 * Linked with -Wl,--wrap=malloc: while fail_malloc is set, every malloc of the engine and of
 * this program fails. It is set only around the passes of the sending engine that take the
 * receiver's answers (and around its destroy), never around cmocka's own calls.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include <mooncake/engine.h>

void *__real_malloc(size_t n);
void *__wrap_malloc(size_t n);

static atomic_bool fail_malloc;
static atomic_ulong mallocs_failed;

void *__wrap_malloc(size_t n)
{
    if (atomic_load(&fail_malloc)) {
        atomic_fetch_add(&mallocs_failed, 1);
        errno = ENOMEM;
        return NULL;
    }
    return __real_malloc(n);
}

#define N_MSGS 32

typedef struct done {
    int calls, status;
} done_t;

static void on_done(void *arg, int status)
{
    done_t *d = arg;

    d->calls++;
    d->status = status;
}

static unsigned long delivered;

static void on_msg(void *arg, const char *sender, uint8_t id, const void *data, size_t len)
{
    (void)arg;
    (void)sender;
    (void)id;
    (void)data;
    (void)len;
    delivered++;
}

static double now_s(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static mc_engine_t *engine(bool tcp)
{
    mc_config_t *cfg;
    mc_engine_t *e = NULL;

    assert_int_equal(mc_config_create(&cfg), 0);
    assert_int_equal(mc_config_set(cfg, "PROGRESS_THREAD", "0"), 0);
    assert_int_equal(mc_config_set(cfg, "LOG_LEVEL", "off"), 0);
    if (tcp)
        assert_int_equal(mc_config_set(cfg, "FORCE_TCP", "1"), 0);
    assert_int_equal(mc_engine_create(cfg, &e), 0);
    mc_config_destroy(cfg);
    return e;
}

/* Both engines progressed (a with malloc failing when oom) until done() or 10 s. */
static bool drive(mc_engine_t *a, mc_engine_t *b, bool oom, bool (*done)(void *), void *arg)
{
    double end = now_s() + 10;
    bool ok;

    while (!(ok = done(arg)) && now_s() < end) {
        mc_engine_progress(b);
        atomic_store(&fail_malloc, oom);
        mc_engine_progress(a);
        atomic_store(&fail_malloc, false);
    }
    return ok;
}

typedef struct pair {
    mc_engine_t *a, *b;
    mc_segment_id_t ab, ba;
} pair_t;

static bool both_ready(void *arg)
{
    pair_t *p = arg;

    return mc_segment_state(p->a, p->ab) == MC_SEGMENT_READY &&
           mc_segment_state(p->b, p->ba) == MC_SEGMENT_READY;
}

static bool all_called(void *arg)
{
    done_t *d = arg;

    for (int i = 0; i < N_MSGS + 1; i++)
        if (!d[i].calls)
            return false;
    return true;
}

static void oom_case(bool tcp)
{
    pair_t p = {engine(tcp), engine(tcp), 0, 0};
    done_t d[N_MSGS + 1] = {{0}};
    char msg[64];

    delivered = 0;
    assert_int_equal(mc_msg_handler_set(p.b, 1, on_msg, NULL), 0);
    assert_int_equal(mc_segment_open_nb(p.a, mc_engine_segment_name(p.b), &p.ab), 0);
    assert_int_equal(mc_segment_open_nb(p.b, mc_engine_segment_name(p.a), &p.ba), 0);
    assert_true(drive(p.a, p.b, false, both_ready, &p));
    /* Sends with callbacks and a flush after them, made while memory is there; their answers
     * are taken by passes of a in which every malloc fails. */
    for (int i = 0; i < N_MSGS; i++) {
        mc_msg_opts_t o = {.size = sizeof(o), .cb = on_done, .cb_arg = &d[i]};
        snprintf(msg, sizeof(msg), "message %d", i);
        assert_int_equal(mc_msg_send_ex(p.a, p.ab, 1, msg, strlen(msg), &o), 0);
    }
    assert_int_equal(mc_peer_flush(p.a, p.ab, on_done, &d[N_MSGS]), 0);
    atomic_store(&mallocs_failed, 0);
    bool called = drive(p.a, p.b, true, all_called, d);
    unsigned long failed = atomic_load(&mallocs_failed);
    assert_true(called);
    assert_true(failed > 0); /* the passes did meet the failure */
    for (int i = 0; i <= N_MSGS; i++) {
        assert_int_equal(d[i].calls, 1);
        assert_int_equal(d[i].status, 0);
    }
    assert_int_equal(delivered, N_MSGS);
    /* A destroy with sends outstanding, memory failing: each is told it was canceled. */
    done_t late[4] = {{0}};
    for (int i = 0; i < 4; i++) {
        mc_msg_opts_t o = {.size = sizeof(o), .cb = on_done, .cb_arg = &late[i]};
        assert_int_equal(mc_msg_send_ex(p.a, p.ab, 1, "late", 4, &o), 0);
    }
    for (int i = 0; i < 4; i++) /* (b does not take them: it is not progressed) */
        assert_int_equal(late[i].calls, 0);
    atomic_store(&fail_malloc, true);
    mc_engine_destroy(p.a);
    atomic_store(&fail_malloc, false);
    for (int i = 0; i < 4; i++) {
        assert_int_equal(late[i].calls, 1);
        assert_int_equal(late[i].status, -MC_ECANCELED);
    }
    mc_engine_destroy(p.b);
}

static void test_oom_shm(void **state)
{
    (void)state;
    oom_case(false);
}

static void test_oom_tcp(void **state)
{
    (void)state;
    oom_case(true);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_oom_shm),
        cmocka_unit_test(test_oom_tcp),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
