/* Message rings (engine/msg_ring.c): what the receiver takes from a ring its sender (a same-host
 * process, or an rdma peer that writes it with RDMA WRITE) wrote. Records written by
 * mc__ring_put, across the end of the ring, arrive in order; a ring that holds what no sender
 * writes is refused with -EIO, in bounded time (each take runs under an alarm). */
#include <errno.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "msg_ring.h"

#define BYTES  4096u
#define STREAM 77u

static _Alignas(16) uint8_t ring[BYTES];

/* The record header at offset at, as a sender writes it (msg_ring.c). */
static void put_header(uint64_t at, uint32_t len)
{
    memcpy(ring + at % BYTES, &len, sizeof(len));
}

static sigjmp_buf stuck;

static void on_alarm(int sig)
{
    (void)sig;
    siglongjmp(stuck, 1);
}

/* Take [*tail, head) with no engine: only what is refused before any delivery may be there.
 * -ETIMEDOUT: it was still taking after 5 s (a loop that never ends). */
static int take_corrupt(uint64_t head, uint64_t *tail)
{
    volatile int rc = -ETIMEDOUT;
    bool blocked;

    signal(SIGALRM, on_alarm);
    if (!sigsetjmp(stuck, 1)) {
        alarm(5);
        rc = mc__ring_take(NULL, 0, ring, BYTES, head, tail, "sender", STREAM, 64, &blocked, NULL);
    }
    alarm(0);
    return rc;
}

/* A skip record at the start of the ring would move tail a whole lap, forever. */
static void test_skip_at_start(void **state)
{
    (void)state;
    for (uint64_t lap = 0; lap < 3; lap++) {
        memset(ring, 0, sizeof(ring));
        put_header(0, UINT32_MAX);
        uint64_t tail = lap * BYTES;
        assert_int_equal(take_corrupt(tail + 32, &tail), -EIO);
        assert_int_equal(tail, lap * BYTES);
    }
}

/* A skip that claims more than the sender wrote (to the end of the ring, past head) is not one
 * either: the next record would be read past what the sender wrote. */
static void test_skip_past_head(void **state)
{
    uint64_t tail = 2 * BYTES - 64;

    (void)state;
    memset(ring, 0, sizeof(ring));
    put_header(tail, UINT32_MAX);
    put_header(0, UINT32_MAX);
    assert_int_equal(take_corrupt(tail + 32, &tail), -EIO);
    assert_int_equal(tail, 2 * BYTES - 64);
    /* and one that reaches head exactly: no record follows it */
    assert_int_equal(take_corrupt(tail + 64, &tail), -EIO);
}

/* What no record can be: a length past MC_MSG_MAX, a record across the end of the ring or past
 * head, a head more than a ring ahead. */
static void test_bad_records(void **state)
{
    uint64_t tail = 0;

    (void)state;
    memset(ring, 0, sizeof(ring));
    put_header(0, MC_MSG_MAX + 1);
    assert_int_equal(take_corrupt(BYTES, &tail), -EIO);
    put_header(0, 64);
    assert_int_equal(take_corrupt(32, &tail), -EIO);
    tail = BYTES - 32;
    put_header(tail, 64);
    assert_int_equal(take_corrupt(tail + 96, &tail), -EIO);
    tail = 0;
    put_header(0, 0);
    assert_int_equal(take_corrupt(BYTES + 16, &tail), -EIO);
    assert_int_equal(tail, 0);
}

/* Records put around the end of the ring (a skip record before the one that wraps) are
 * notifications delivered to an engine in order, once each; the tail ends at head. */
static void test_wrap_delivers(void **state)
{
    mc_config_t *conf;
    mc_engine_t *e;
    mc_notify_t n;
    uint64_t head = 3 * BYTES - 100, tail = head;
    _Alignas(mc_msg_t) uint8_t mbuf[sizeof(mc_msg_t) + 600];
    mc_msg_t *m = (mc_msg_t *)(void *)mbuf;
    bool blocked;

    (void)state;
    assert_int_equal(mc_config_create(&conf), 0);
    assert_int_equal(mc_config_set(conf, "METADATA", "none"), 0);
    assert_int_equal(mc_config_set(conf, "LOG_LEVEL", "off"), 0);
    assert_int_equal(mc_engine_create(conf, &e), 0);
    mc_config_destroy(conf);
    memset(ring, 0xee, sizeof(ring));
    head -= head % 16;
    tail = head;
    for (uint32_t i = 0; i < 8; i++) {
        memset(m, 0, sizeof(*m));
        m->seq = i + 1;
        m->len = 8 + i * 70;
        memset(m->data, 'a' + (int)i, m->len);
        assert_int_equal(mc__ring_put(ring, BYTES, &head, tail, m), 0);
    }
    assert_true(head / BYTES > tail / BYTES); /* it wrapped */
    assert_int_equal(
        mc__ring_take(e, 0, ring, BYTES, head, &tail, "sender", STREAM, 64, &blocked, NULL), 0);
    assert_false(blocked);
    assert_int_equal(tail, head);
    for (uint32_t i = 0; i < 8; i++) {
        assert_int_equal(mc_notify_pop(e, &n), 1);
        assert_int_equal(n.len, 8 + i * 70);
        for (size_t k = 0; k < n.len; k++)
            assert_int_equal(n.msg[k], 'a' + (int)i);
    }
    assert_int_equal(mc_notify_pop(e, &n), 0);
    mc_engine_destroy(e);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_skip_at_start),
        cmocka_unit_test(test_skip_past_head),
        cmocka_unit_test(test_bad_records),
        cmocka_unit_test(test_wrap_delivers),
    };

    return cmocka_run_group_tests_name("msg_ring", tests, NULL, NULL);
}
