/* The tcp wire codec's limits (engine/transport/tcp/tcp_proto.c): what a peer's frame header may
 * announce before the receiver allocates for it. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>

#include "mooncake/error.h"
#include "transport/tcp/tcp_proto.h"

static int decode(uint8_t type, uint32_t length, uint64_t aux)
{
    mc_frame_t f = {.type = type, .length = length, .id = 7, .aux = aux}, out;
    uint8_t h[MC_FRAME_HDR_LEN];

    mc__tcp_frame_encode(&f, h);
    int rc = mc__tcp_frame_decode(h, 1u << 20, &out);
    if (!rc) {
        assert_int_equal(out.type, type);
        assert_int_equal(out.length, length);
        assert_int_equal(out.aux, aux);
    }
    return rc;
}

/* A READ_RESP carries data up to a slice's limit, but a refusal only a reason: a target that
 * announces a 64 MiB "reason" must not make the initiator hold 64 MiB per connection. */
static void test_refusal_bounded(void **state)
{
    (void)state;
    assert_int_equal(decode(MC_FR_READ_RESP, MC_PROTO_MAX_DATA, 0), 0);
    assert_int_equal(decode(MC_FR_READ_RESP, 300, (uint64_t)-MC_EACCESS), 0);
    assert_int_equal(decode(MC_FR_READ_RESP, MC_PROTO_MAX_CTRL, (uint64_t)-MC_EACCESS), 0);
    assert_int_equal(decode(MC_FR_READ_RESP, MC_PROTO_MAX_CTRL + 1, (uint64_t)-MC_EACCESS),
                     -MC_EPROTO);
    assert_int_equal(decode(MC_FR_READ_RESP, MC_PROTO_MAX_DATA, (uint64_t)-MC_EACCESS), -MC_EPROTO);
    assert_int_equal(decode(MC_FR_WRITE_ACK, MC_PROTO_MAX_CTRL + 1, (uint64_t)-MC_EACCESS),
                     -MC_EPROTO);
    assert_int_equal(decode(MC_FR_READ_RESP, MC_PROTO_MAX_DATA + 1, 0), -MC_EPROTO);
}

/* A HELLO's retire list survives the round trip (the target applies it once READY). */
static void test_hello_retired(void **state)
{
    mc_hello_t h = {.instance = 0x1122334455667788ull, .n_retired = MC_PROTO_MAX_RETIRE}, d;
    uint8_t buf[MC_PROTO_MAX_CTRL];

    (void)state;
    strcpy(h.name, "initiator");
    strcpy(h.peer_name, "target");
    for (unsigned i = 0; i < h.n_retired; i++)
        h.retired[i] = 1000 + i;
    size_t n = mc__tcp_hello_encode(&h, buf);
    assert_true(n <= sizeof(buf));
    assert_int_equal(mc__tcp_hello_decode(buf, n, &d), 0);
    assert_int_equal(d.instance, h.instance);
    assert_string_equal(d.name, "initiator");
    assert_string_equal(d.peer_name, "target");
    assert_int_equal(d.n_retired, MC_PROTO_MAX_RETIRE);
    for (unsigned i = 0; i < d.n_retired; i++)
        assert_int_equal(d.retired[i], 1000 + i);
    assert_int_equal(mc__tcp_hello_decode(buf, n - 1, &d), -MC_EPROTO); /* one id cut short */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_refusal_bounded),
        cmocka_unit_test(test_hello_retired),
    };

    return cmocka_run_group_tests_name("tcp_proto", tests, NULL, NULL);
}
