/* The epoll watch (sys/epwatch.h) on a real epoll set and eventfd: it stays quiet while nothing
 * happens, sees an event that another thread causes, belongs to one thread until that thread
 * stops looking, survives an overflowing completion queue, and turns itself off (every look
 * -1) when its poll fails. Skipped (77) where io_uring is not available. */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>
#include <cmocka.h>

#include "sys/epwatch.h"
#include "util/time.h"

#define MS 1000000ull

typedef struct fixture {
    int epfd, evfd;
    mc_epwatch_t w;
} fixture_t;

static int setup(void **state)
{
    fixture_t *f = calloc(1, sizeof(*f));
    struct epoll_event ev = {.events = EPOLLIN};

    f->epfd = epoll_create1(EPOLL_CLOEXEC);
    f->evfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    assert_true(f->epfd >= 0 && f->evfd >= 0);
    assert_int_equal(epoll_ctl(f->epfd, EPOLL_CTL_ADD, f->evfd, &ev), 0);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fixture_t *f = *state;

    mc__epwatch_fini(&f->w);
    close(f->evfd);
    close(f->epfd);
    free(f);
    return 0;
}

static void ring(int fd)
{
    uint64_t one = 1;
    assert_int_equal(write(fd, &one, sizeof(one)), (ssize_t)sizeof(one));
}

/* What the engine does after a look that says 1: ask epoll (and here, take the event). */
static int ask(fixture_t *f)
{
    struct epoll_event ev;
    uint64_t v;
    int n = epoll_wait(f->epfd, &ev, 1, 0);

    if (n > 0)
        assert_int_equal(read(f->evfd, &v, sizeof(v)), (ssize_t)sizeof(v));
    return n;
}

/* Look (asking epoll after each 1) until the watch answers 0 n times in a row; fails after 2 s.
 */
static void settle(fixture_t *f, int n)
{
    uint64_t end = mc__now_ns() + 2000 * MS;
    int quiet = 0;

    while (quiet < n) {
        int w = mc__epwatch_look(&f->w, f->epfd, mc__now_ns());
        assert_true(w >= 0);
        quiet = w ? 0 : quiet + 1;
        if (w)
            ask(f);
        assert_true(mc__now_ns() < end);
    }
}

/* Spin on looks until one says 1; fails after 2 s. */
static void until_seen(fixture_t *f)
{
    uint64_t end = mc__now_ns() + 2000 * MS;

    while (mc__epwatch_look(&f->w, f->epfd, mc__now_ns()) != 1)
        assert_true(mc__now_ns() < end);
}

/* The first look arms the watch (and says 1); -1 here means no io_uring: skip. */
static void start(fixture_t *f)
{
    int w = mc__epwatch_look(&f->w, f->epfd, mc__now_ns());
    if (w < 0) {
        print_message("io_uring is not available here: the watch is off\n");
        exit(77);
    }
    assert_int_equal(w, 1);
    ask(f);
}

static void *ring_later(void *arg)
{
    usleep(20 * 1000);
    ring(((fixture_t *)arg)->evfd);
    return NULL;
}

static void test_quiet_then_event_from_another_thread(void **state)
{
    fixture_t *f = *state;
    pthread_t t;

    start(f);
    uint64_t gen = f->w.gen;
    settle(f, 100000); /* nothing happens: it keeps saying so, the poll armed once */
    assert_true(f->w.gen == gen);
    assert_int_equal(pthread_create(&t, NULL, ring_later, f), 0);
    until_seen(f);
    assert_int_equal(ask(f), 1); /* the event the watch announced is there */
    pthread_join(t, NULL);
    settle(f, 1000);
    ring(f->evfd); /* and the next one too */
    until_seen(f);
    assert_int_equal(ask(f), 1);
}

typedef struct other {
    fixture_t *f;
    uint64_t now;
    int answer;
} other_t;

static void *look_from_other(void *arg)
{
    other_t *o = arg;
    o->answer = mc__epwatch_look(&o->f->w, o->f->epfd, o->now);
    return NULL;
}

static int look_elsewhere(fixture_t *f, uint64_t now)
{
    other_t o = {.f = f, .now = now};
    pthread_t t;

    assert_int_equal(pthread_create(&t, NULL, look_from_other, &o), 0);
    pthread_join(t, NULL);
    return o.answer;
}

static void test_one_owner(void **state)
{
    fixture_t *f = *state;
    uint64_t now = mc__now_ns();

    start(f);
    assert_int_equal(mc__epwatch_look(&f->w, f->epfd, now), 0);
    /* another thread cannot tell while the owner looks */
    assert_int_equal(look_elsewhere(f, now + 1 * MS), -1);
    assert_int_equal(mc__epwatch_look(&f->w, f->epfd, now + 2 * MS), 0);
    /* ... and takes the ring over once the owner stopped looking (it then asks once) */
    assert_int_equal(look_elsewhere(f, now + 30 * MS), 1);
    /* now the first thread is the other one */
    assert_int_equal(mc__epwatch_look(&f->w, f->epfd, now + 31 * MS), -1);
    /* The other thread has exited; the first takes the ring back: the cancel of the exited
     * thread's poll leaves the ring's task-work flag up, and the watch must get over that and
     * go on seeing events (not turn itself off). */
    assert_int_equal(mc__epwatch_look(&f->w, f->epfd, now + 60 * MS), 1);
    ask(f);
    settle(f, 1000);
    assert_false(f->w.off);
    ring(f->evfd);
    until_seen(f);
    assert_int_equal(ask(f), 1);
    settle(f, 1000);
    assert_false(f->w.off);
}

static void test_overflow(void **state)
{
    fixture_t *f = *state;

    start(f);
    settle(f, 1000);
    /* Every write here is a wake-up and, at its return, a completion: far more than the
     * completion queue holds, with no look in between. */
    for (int i = 0; i < 1000; i++)
        ring(f->evfd);
    if (!(IO_URING_READ_ONCE(*f->w.ring.sq.kflags) & IORING_SQ_CQ_OVERFLOW))
        print_message("this kernel did not overflow the queue: the test shows less\n");
    until_seen(f);
    settle(f, 1000); /* the poll ended on the overflow and was armed again */
    ring(f->evfd);
    until_seen(f);
    assert_int_equal(ask(f), 1);
}

static void test_failed_poll_turns_off(void **state)
{
    fixture_t *f = *state;
    uint64_t end = mc__now_ns() + 2000 * MS;
    int w, bad = -1; /* no descriptor at all */

    w = mc__epwatch_look(&f->w, bad, mc__now_ns());
    if (w < 0 && !f->w.up)
        skip();
    assert_int_equal(w, 1); /* armed: the failure comes as its completion */
    while ((w = mc__epwatch_look(&f->w, bad, mc__now_ns())) >= 0)
        assert_true(mc__now_ns() < end);
    assert_int_equal(w, -1);
    assert_int_equal(mc__epwatch_look(&f->w, f->epfd, mc__now_ns()), -1); /* off for good */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_quiet_then_event_from_another_thread, setup, teardown),
        cmocka_unit_test_setup_teardown(test_one_owner, setup, teardown),
        cmocka_unit_test_setup_teardown(test_overflow, setup, teardown),
        cmocka_unit_test_setup_teardown(test_failed_poll_turns_off, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
