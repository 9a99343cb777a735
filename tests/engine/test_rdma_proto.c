/* The rdma transport's QP info codec (engine/transport/rdma/rdma_qp.c): what a QP's end tells
 * the other when they connect, including how many RDMA READs it takes as target, which bounds
 * what the other end keeps in flight (an older peer says nothing: 0). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>

#include "mooncake/error.h"
#include "transport/rdma/rdma_int.h"

static void test_info_roundtrip(void **state)
{
    mc_qp_info_t q = {.dev = 1,
                      .peer_dev = 2,
                      .link = 1,
                      .rd_resp = 8,
                      .lid = 7,
                      .mtu = 1024,
                      .qpn = 0x123456,
                      .psn = 0xabcdef},
                 d;
    uint8_t buf[MC_QP_INFO_MSG_LEN];

    (void)state;
    memset(q.gid, 0x5a, sizeof(q.gid));
    size_t n = mc__rdma_qp_info_encode(&q, buf);
    assert_int_equal(n, MC_QP_INFO_LEN);
    assert_int_equal(mc__rdma_qp_info_decode(buf, n, &d), 0);
    assert_int_equal(d.rd_resp, 8);
    assert_int_equal(d.dev, 1);
    assert_int_equal(d.peer_dev, 2);
    assert_int_equal(d.qpn, 0x123456);
    assert_memory_equal(d.gid, q.gid, sizeof(q.gid));
    q.msg = true;
    q.msg_addr = 0x1000;
    q.msg_rkey = 77;
    q.msg_arg = 5;
    n = mc__rdma_qp_info_encode(&q, buf);
    assert_int_equal(n, MC_QP_INFO_MSG_LEN);
    assert_int_equal(mc__rdma_qp_info_decode(buf, n, &d), 0);
    assert_int_equal(d.rd_resp, 8);
    assert_true(d.msg && d.msg_addr == 0x1000 && d.msg_rkey == 77 && d.msg_arg == 5);
    buf[3] = 0; /* as an older peer sends it */
    assert_int_equal(mc__rdma_qp_info_decode(buf, n, &d), 0);
    assert_int_equal(d.rd_resp, 0);
    assert_int_equal(mc__rdma_qp_info_decode(buf, n - 1, &d), -MC_EPROTO);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_info_roundtrip),
    };

    return cmocka_run_group_tests_name("rdma_proto", tests, NULL, NULL);
}
