/* The receiver's memory of message streams (engine/msg.c): the next sequence number of each
 * sender's stream, so that a message resent after a lost acknowledgement is dropped. Past
 * RX_STREAMS_MAX streams it forgets the least recently heard from half, not more: after 65,535
 * streams of one message each and 40,000 messages of one busy stream, a new stream makes it
 * forget; a stream heard from after the middle of them is still known, and its duplicate is
 * dropped (before, the streams of the last 32,768 messages alone were kept: the busy one).
 * And the notification queue's bound in bytes. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <cmocka.h>

#include <mooncake/engine.h>

#include "msg.h"
#include "unit_engine.h"

#define STREAMS 65535u /* RX_STREAMS_MAX - 1 */

static mc_engine_t *engine_new(void)
{
    return unit_engine((const char *const[]){"PROGRESS_THREAD", "0", NULL});
}

/* Deliver notification seq of stream; then pop what is queued: how many came. */
static unsigned deliver(mc_engine_t *e, uint64_t stream, uint64_t seq)
{
    mc_notify_t n;
    unsigned got = 0;

    assert_int_equal(mc__msg_deliver(e, 0, "sender", stream, seq, 0, "x", 1, NULL, 0), 0);
    while (mc_notify_pop(e, &n) == 1)
        got++;
    return got;
}

static void test_forget_half(void **state)
{
    mc_engine_t *e = engine_new();

    (void)state;
    for (uint64_t s = 1; s <= STREAMS; s++)
        assert_int_equal(deliver(e, s, 1), 1);
    for (uint64_t seq = 2; seq <= 40001; seq++) /* stream 1 is busy */
        assert_int_equal(deliver(e, 1, seq), 1);
    assert_int_equal(deliver(e, STREAMS + 1, 1), 1); /* a new one: the table forgets a half */
    /* heard from late: known, its resent message dropped */
    assert_int_equal(deliver(e, 65000, 1), 0);
    assert_int_equal(deliver(e, 1, 40001), 0);
    assert_int_equal(deliver(e, STREAMS + 1, 1), 0);
    /* heard from first: forgotten, so its resent message comes again (the documented limit) */
    assert_int_equal(deliver(e, 2, 1), 1);
    mc_engine_destroy(e);
}

/* Notifications not popped are bounded in bytes too (64 MiB), not only in number (65,536 of up
 * to 64 KiB each: 4 GiB): past it the next is refused (its sender keeps it), and taken once one
 * is popped. */
static void test_notify_bytes(void **state)
{
    static char big[MC_MSG_MAX];
    mc_engine_t *e = engine_new();
    mc_notify_t *n = malloc(sizeof(*n));
    uint64_t seq = 1;
    int rc;

    (void)state;
    assert_non_null(n);
    while ((rc = mc__msg_deliver(e, 0, "sender", 7, seq, 0, big, sizeof(big), NULL, 0)) == 0)
        seq++;
    assert_int_equal(rc, -EAGAIN);
    assert_int_equal(seq - 1, (64u << 20) / sizeof(big));
    assert_int_equal(mc_notify_pop(e, n), 1);
    assert_int_equal(n->len, sizeof(big));
    assert_int_equal(mc__msg_deliver(e, 0, "sender", 7, seq, 0, big, sizeof(big), NULL, 0), 0);
    free(n);
    mc_engine_destroy(e);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_forget_half),
                                       cmocka_unit_test(test_notify_bytes)};

    return cmocka_run_group_tests_name("msg_streams", tests, NULL, NULL);
}
