/* The cases of the softverbs verbs test; see sv_verbs_test.c. A is the requester, B mostly
 * passive. Both processes call every case in the same order. */
#include "sv_verbs_test.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void say(struct ep *e, const char *what)
{
    if (e->role[0] == 'A') {
        printf("case: %s\n", what);
        fflush(stdout);
    }
}

static void drain_cq(struct ep *e)
{
    struct ibv_wc wc;

    while (poll_one(e, &wc, 100))
        ;
}

static enum ibv_qp_state qp_state(struct ibv_qp *qp)
{
    struct ibv_qp_attr a;
    struct ibv_qp_init_attr ia;

    if (ibv_query_qp(qp, &a, IBV_QP_STATE, &ia))
        return (enum ibv_qp_state) - 1;
    return a.qp_state;
}

/* Waits for an async event of the given type, ignoring others. */
static bool wait_async(struct ep *e, enum ibv_event_type type, int timeout_ms)
{
    uint64_t end = now_ms() + (uint64_t)timeout_ms;
    struct pollfd pfd = {.fd = e->ctx->async_fd, .events = POLLIN};
    struct ibv_async_event ev;

    fcntl(e->ctx->async_fd, F_SETFL, fcntl(e->ctx->async_fd, F_GETFL) | O_NONBLOCK);
    while (now_ms() < end) {
        if (poll(&pfd, 1, 100) <= 0)
            continue;
        if (ibv_get_async_event(e->ctx, &ev))
            continue;
        ibv_ack_async_event(&ev);
        if (ev.event_type == type)
            return true;
    }
    return false;
}

/* UC has the RC table without the RC-only attributes. */
static void case_uc_transitions(struct ep *e)
{
    struct ibv_qp_init_attr ia = {
        .send_cq = e->cq,
        .recv_cq = e->cq,
        .cap = {.max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1},
        .qp_type = IBV_QPT_UC,
    };
    struct ibv_qp *qp = ibv_create_qp(e->pd, &ia);
    struct ibv_qp_attr a = {.qp_state = IBV_QPS_RTR, .path_mtu = IBV_MTU_1024};

    if (!qp) {
        fail(e, "create UC QP");
        return;
    }
    CHECK(e, qp_to_init(qp) == 0, "UC RESET->INIT refused");
    a.dest_qp_num = 2;
    a.ah_attr.dlid = e->self.lid;
    a.ah_attr.is_global = e->eth;
    a.ah_attr.grh.dgid = e->self.gid;
    a.ah_attr.grh.sgid_index = e->eth ? 1 : 0;
    a.ah_attr.port_num = 1;
    CHECK(e,
          ibv_modify_qp(qp, &a,
                        IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                            IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC) == EINVAL,
          "UC INIT->RTR with MAX_DEST_RD_ATOMIC accepted");
    CHECK(e,
          ibv_modify_qp(qp, &a,
                        IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                            IBV_QP_RQ_PSN) == 0,
          "UC INIT->RTR refused");
    a.qp_state = IBV_QPS_RTS;
    CHECK(e, ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT) == EINVAL,
          "UC RTR->RTS with TIMEOUT accepted");
    CHECK(e, ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN) == 0, "UC RTR->RTS refused");
    ibv_destroy_qp(qp);
}

void case_transitions(struct ep *e, bool is_a)
{
    struct ibv_qp *qp = qp_create(e);
    struct ibv_qp_attr a = {0};
    struct ibv_sge sge = {.addr = (uintptr_t)e->buf, .length = 8, .lkey = e->mr->lkey};
    struct ibv_send_wr swr = {.wr_id = 1, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND};
    struct ibv_recv_wr rwr = {.wr_id = 77, .sg_list = &sge, .num_sge = 1};
    struct ibv_send_wr *sbad;
    struct ibv_recv_wr *rbad;
    int init_mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;

    say(e, "illegal transitions, a not-implemented entry");
    if (!qp) {
        fail(e, "create_qp");
        return;
    }
    a.qp_state = IBV_QPS_RTR;
    CHECK(e, ibv_modify_qp(qp, &a, IBV_QP_STATE) == EINVAL, "RESET->RTR accepted");
    a.qp_state = IBV_QPS_INIT;
    a.port_num = 1;
    CHECK(e, ibv_modify_qp(qp, &a, init_mask & ~IBV_QP_ACCESS_FLAGS) == EINVAL,
          "RESET->INIT without ACCESS_FLAGS accepted");
    CHECK(e, ibv_modify_qp(qp, &a, init_mask | IBV_QP_SQ_PSN) == EINVAL,
          "RESET->INIT with SQ_PSN accepted");
    a.port_num = 2;
    CHECK(e, ibv_modify_qp(qp, &a, init_mask) == EINVAL, "port 2 accepted");
    CHECK(e, ibv_post_send(qp, &swr, &sbad) == EINVAL, "post_send in RESET accepted");
    CHECK(e, ibv_post_recv(qp, &rwr, &rbad) == EINVAL, "post_recv in RESET accepted");
    a.port_num = 1;
    CHECK(e, ibv_modify_qp(qp, &a, init_mask) == 0, "RESET->INIT refused");
    CHECK(e, qp_state(qp) == IBV_QPS_INIT, "state is not INIT");
    a.qp_state = IBV_QPS_RTS;
    CHECK(e, ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN) == EINVAL, "INIT->RTS accepted");
    CHECK(e, ibv_post_send(qp, &swr, &sbad) == EINVAL, "post_send in INIT accepted");
    CHECK(e, ibv_post_recv(qp, &rwr, &rbad) == 0, "post_recv in INIT refused");
    a.qp_state = IBV_QPS_RTR;
    CHECK(e, ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU) == EINVAL,
          "INIT->RTR without DEST_QPN etc. accepted");
    a.qp_state = IBV_QPS_ERR;
    CHECK(e, ibv_modify_qp(qp, &a, IBV_QP_STATE) == 0, "INIT->ERR refused");
    expect_wc(e, IBV_WC_WR_FLUSH_ERR, 77, "recv flushed on ERR");
    a.qp_state = IBV_QPS_RTS;
    CHECK(e, ibv_modify_qp(qp, &a, IBV_QP_STATE) == EINVAL, "ERR->RTS accepted");
    a.qp_state = IBV_QPS_RESET;
    CHECK(e, ibv_modify_qp(qp, &a, IBV_QP_STATE) == 0, "ERR->RESET refused");
    CHECK(e, qp_to_init(qp) == 0, "RESET->INIT after reset refused");
    CHECK(e, ibv_destroy_qp(qp) == 0, "destroy_qp");
    case_uc_transitions(e);
    if (is_a) {
        struct ibv_ah_attr ah = {.dlid = 1, .port_num = 1};

        errno = 0;
        CHECK(e, ibv_create_ah(e->pd, &ah) == NULL && errno == EOPNOTSUPP,
              "not-implemented ibv_create_ah did not fail with EOPNOTSUPP");
    }
}

static void data_one(struct ep *e, bool is_a, uint32_t len, unsigned seed)
{
    char what[64];

    /* WRITE A -> B */
    if (is_a) {
        fill(e->buf, len, seed);
        post_rdma(e, IBV_WR_RDMA_WRITE, 0, 0, len, e->peer.rkey, 1, IBV_SEND_SIGNALED);
        snprintf(what, sizeof(what), "WRITE %u", len);
        expect_wc(e, IBV_WC_SUCCESS, 1, what);
    }
    barrier(e);
    if (!is_a)
        CHECK(e, verify(e->buf, len, seed), "WRITE %u: data differs", len);
    /* READ B -> A */
    if (!is_a)
        fill(e->buf, len, seed + 1);
    barrier(e);
    if (is_a) {
        memset(e->buf, 0, len);
        post_rdma(e, IBV_WR_RDMA_READ, 0, 0, len, e->peer.rkey, 2, IBV_SEND_SIGNALED);
        snprintf(what, sizeof(what), "READ %u", len);
        expect_wc(e, IBV_WC_SUCCESS, 2, what);
        CHECK(e, verify(e->buf, len, seed + 1), "READ %u: data differs", len);
    }
    barrier(e);
    /* SEND A -> B */
    if (!is_a) {
        memset(e->buf, 0, len);
        post_recv(e, 0, MAX_MSG, 3);
    }
    barrier(e);
    if (is_a) {
        fill(e->buf, len, seed + 2);
        post_rdma(e, IBV_WR_SEND, 0, 0, len, 0, 4, IBV_SEND_SIGNALED);
        expect_wc(e, IBV_WC_SUCCESS, 4, "SEND");
    } else {
        struct ibv_wc wc;

        if (!poll_one(e, &wc, POLL_MS)) {
            fail(e, "RECV %u: no completion", len);
        } else {
            CHECK(e, wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_RECV && wc.wr_id == 3,
                  "RECV %u: status %s opcode %d", len, ibv_wc_status_str(wc.status), wc.opcode);
            CHECK(e, wc.byte_len == len, "RECV: byte_len %u, expected %u", wc.byte_len, len);
            CHECK(e, verify(e->buf, len, seed + 2), "RECV %u: data differs", len);
        }
    }
    barrier(e);
}

static void data_imm(struct ep *e, bool is_a, uint32_t len)
{
    struct ibv_wc wc;

    if (!is_a)
        post_recv(e, 0, 0, 5);
    barrier(e);
    if (is_a) {
        fill(e->buf, len, 9);
        post_rdma(e, IBV_WR_RDMA_WRITE_WITH_IMM, 0, 4096, len, e->peer.rkey, 6, IBV_SEND_SIGNALED);
        expect_wc(e, IBV_WC_SUCCESS, 6, "WRITE_WITH_IMM");
    } else if (!poll_one(e, &wc, POLL_MS)) {
        fail(e, "WRITE_WITH_IMM: no receive completion");
    } else {
        CHECK(e, wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_RECV_RDMA_WITH_IMM,
              "WRITE_WITH_IMM: status %s opcode %d", ibv_wc_status_str(wc.status), wc.opcode);
        CHECK(e, (wc.wc_flags & IBV_WC_WITH_IMM) && be32toh(wc.imm_data) == 0x1234u,
              "WRITE_WITH_IMM: immediate missing");
        CHECK(e, verify(e->buf + 4096, len, 9), "WRITE_WITH_IMM: data differs");
    }
    barrier(e);
}

void case_data(struct ep *e, bool is_a)
{
    static const uint32_t sizes[] = {1,     7,         4096,     32767,          32768,
                                     32769, 65536 + 3, 1u << 20, (3u << 20) + 5, 16u << 20};
    size_t i;

    say(e, "WRITE/READ/SEND 1 B - 16 MiB");
    if (pair_new(e, 7, 7)) {
        fail(e, "connect");
        return;
    }
    for (i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++)
        data_one(e, is_a, sizes[i], (unsigned)i * 7);
    data_imm(e, is_a, 100000);
}

void case_unsignaled_sge(struct ep *e, bool is_a)
{
    struct ibv_sge sge[3];
    struct ibv_send_wr wr = {.wr_id = 20,
                             .sg_list = sge,
                             .num_sge = 3,
                             .opcode = IBV_WR_SEND,
                             .send_flags = IBV_SEND_SIGNALED};
    struct ibv_send_wr *bad;
    struct ibv_wc wc;
    int i;

    say(e, "unsignaled completions, gather lists");
    if (is_a) {
        fill(e->buf, 8192, 3);
        for (i = 0; i < 10; i++)
            post_rdma(e, IBV_WR_RDMA_WRITE, 0, 0, 8192, e->peer.rkey, 10 + i, 0);
        post_rdma(e, IBV_WR_RDMA_WRITE, 0, 0, 8192, e->peer.rkey, 99, IBV_SEND_SIGNALED);
        expect_wc(e, IBV_WC_SUCCESS, 99, "signaled WRITE after unsignaled ones");
        CHECK(e, !poll_one(e, &wc, 200), "completion for an unsignaled WRITE");
    } else {
        post_recv(e, 1 << 20, 1 << 20, 21);
    }
    barrier(e);
    if (is_a) {
        fill(e->buf, 3000, 4);
        sge[0] = (struct ibv_sge){(uintptr_t)e->buf, 1000, e->mr->lkey};
        sge[1] = (struct ibv_sge){(uintptr_t)e->buf + 1000, 1, e->mr->lkey};
        sge[2] = (struct ibv_sge){(uintptr_t)e->buf + 1001, 1999, e->mr->lkey};
        CHECK(e, ibv_post_send(e->qp, &wr, &bad) == 0, "post 3-SGE SEND");
        expect_wc(e, IBV_WC_SUCCESS, 20, "3-SGE SEND");
    } else {
        expect_wc(e, IBV_WC_SUCCESS, 21, "RECV of 3-SGE SEND");
        CHECK(e, verify(e->buf + (1 << 20), 3000, 4), "3-SGE SEND: data differs");
    }
    barrier(e);
}

void case_bad_rkey(struct ep *e, bool is_a)
{
    static const enum ibv_wr_opcode ops[] = {IBV_WR_RDMA_WRITE, IBV_WR_RDMA_READ};
    size_t i;

    say(e, "bad rkey -> REM_ACCESS_ERR, then flush");
    for (i = 0; i < 2; i++) {
        if (pair_new(e, 7, 7)) {
            fail(e, "connect");
            return;
        }
        if (is_a) {
            post_rdma(e, ops[i], 0, 0, 4096, e->peer.rkey ^ 0x100, 30, IBV_SEND_SIGNALED);
            expect_wc(e, IBV_WC_REM_ACCESS_ERR, 30, "bad rkey");
            post_rdma(e, ops[i], 0, 0, 4096, e->peer.rkey, 31, IBV_SEND_SIGNALED);
            expect_wc(e, IBV_WC_WR_FLUSH_ERR, 31, "post after error");
            CHECK(e, qp_state(e->qp) == IBV_QPS_ERR, "requester QP not in ERR");
        } else {
            CHECK(e, wait_async(e, IBV_EVENT_QP_ACCESS_ERR, POLL_MS), "no QP_ACCESS_ERR event");
            CHECK(e, qp_state(e->qp) == IBV_QPS_ERR, "responder QP not in ERR");
        }
        barrier(e);
    }
}

void case_rnr(struct ep *e, bool is_a)
{
    struct ibv_wc wc;

    say(e, "RNR retry exceeded, RNR retried until a receive is posted");
    if (pair_new(e, 0, 7)) {
        fail(e, "connect");
        return;
    }
    if (is_a) {
        post_rdma(e, IBV_WR_SEND, 0, 0, 64, 0, 40, IBV_SEND_SIGNALED);
        expect_wc(e, IBV_WC_RNR_RETRY_EXC_ERR, 40, "SEND without receive, rnr_retry 0");
    }
    barrier(e);
    if (pair_new(e, 7, 7)) {
        fail(e, "connect");
        return;
    }
    if (is_a) {
        fill(e->buf, 64, 5);
        post_rdma(e, IBV_WR_SEND, 0, 0, 64, 0, 41, IBV_SEND_SIGNALED);
        CHECK(e, !poll_one(e, &wc, 300), "SEND completed before the receive was posted");
        barrier(e);
        expect_wc(e, IBV_WC_SUCCESS, 41, "SEND after RNR waits");
    } else {
        barrier(e);
        post_recv(e, 0, 64, 42);
        expect_wc(e, IBV_WC_SUCCESS, 42, "late RECV");
        CHECK(e, verify(e->buf, 64, 5), "late RECV: data differs");
    }
    barrier(e);
}

void case_err_qp_flush(struct ep *e, bool is_a)
{
    struct ibv_qp_attr a = {.qp_state = IBV_QPS_ERR};

    (void)is_a;
    say(e, "posting to an ERR QP completes with flush errors");
    if (pair_new(e, 7, 7)) {
        fail(e, "connect");
        return;
    }
    post_recv(e, 0, 64, 50);
    CHECK(e, ibv_modify_qp(e->qp, &a, IBV_QP_STATE) == 0, "RTS->ERR refused");
    expect_wc(e, IBV_WC_WR_FLUSH_ERR, 50, "posted RECV flushed");
    CHECK(e, post_rdma(e, IBV_WR_SEND, 0, 0, 64, 0, 51, 0) == 0, "post_send on ERR QP failed");
    expect_wc(e, IBV_WC_WR_FLUSH_ERR, 51, "SEND on ERR QP");
    CHECK(e, post_recv(e, 0, 64, 52) == 0, "post_recv on ERR QP failed");
    expect_wc(e, IBV_WC_WR_FLUSH_ERR, 52, "RECV on ERR QP");
    barrier(e);
}

static bool ctl_write(struct ep *e, const char *dev, const char *text)
{
    const char *dir = getenv("SOFTVERBS_CTL_DIR");
    char path[PATH_MAX], tmp[PATH_MAX];
    FILE *f;

    if (!dir)
        return false;
    snprintf(path, sizeof(path), "%s/%s", dir, dev);
    snprintf(tmp, sizeof(tmp), "%s/.%s.tmp", dir, dev);
    f = fopen(tmp, "w");
    if (!f || fputs(text, f) < 0 || fclose(f) != 0 || rename(tmp, path) != 0) {
        fail(e, "cannot write %s", path);
        return false;
    }
    return true;
}

void case_faults(struct ep *e, bool is_a)
{
    const char *dev = ibv_get_device_name(e->ctx->device);

    if (!getenv("SOFTVERBS_CTL_DIR")) {
        say(e, "faults: SOFTVERBS_CTL_DIR not set, skipped");
        return;
    }
    say(e, "drop 20% and delay 20 ms: data still exact");
    if (pair_new(e, 7, 7)) {
        fail(e, "connect");
        return;
    }
    if (is_a)
        ctl_write(e, dev, "drop=20\n");
    barrier(e);
    data_one(e, is_a, (1u << 20) + 11, 77);
    if (is_a)
        ctl_write(e, dev, "delay_ms=20\n");
    barrier(e);
    data_one(e, is_a, 100000, 78);
    say(e, "corrupt rkey -> REM_ACCESS_ERR");
    if (is_a)
        ctl_write(e, dev, "corrupt_rkey=1\n");
    barrier(e);
    if (is_a) {
        post_rdma(e, IBV_WR_RDMA_WRITE, 0, 0, 4096, e->peer.rkey, 60, IBV_SEND_SIGNALED);
        expect_wc(e, IBV_WC_REM_ACCESS_ERR, 60, "WRITE with corrupted rkey");
        ctl_write(e, dev, "\n");
    }
    barrier(e);
    drain_cq(e);
}

/* Keeps WRITEs flowing until one completes with an error; returns its status. */
static enum ibv_wc_status stream_until_error(struct ep *e, int timeout_ms, int *ok_p)
{
    uint64_t end = now_ms() + (uint64_t)timeout_ms;
    int outstanding = 0, ok = 0;
    struct ibv_wc wc;

    while (now_ms() < end) {
        while (outstanding < 8 && post_rdma(e, IBV_WR_RDMA_WRITE, 0, 65536, 65536, e->peer.rkey, 70,
                                            IBV_SEND_SIGNALED) == 0)
            outstanding++;
        if (ibv_poll_cq(e->cq, 1, &wc) != 1) {
            usleep(500);
            continue;
        }
        outstanding--;
        if (wc.status != IBV_WC_SUCCESS) {
            *ok_p = ok;
            return wc.status;
        }
        ok++;
    }
    *ok_p = ok;
    return IBV_WC_SUCCESS;
}

void case_port_down(struct ep *e, bool is_a)
{
    struct ibv_port_attr pa;
    enum ibv_wc_status st;
    uint64_t t0;
    int ok;

    if (!getenv("SOFTVERBS_CTL_DIR") || e->self.lid == e->peer.lid) {
        say(e, "port down: needs SOFTVERBS_CTL_DIR and two devices, skipped");
        return;
    }
    say(e, "port down mid-stream: errors on both sides, recovery with new QPs");
    if (pair_new(e, 7, 3)) {
        fail(e, "connect");
        return;
    }
    t0 = now_ms();
    if (is_a) {
        /* B's device goes down while both stream. */
        st = stream_until_error(e, 300, &ok);
        CHECK(e, st == IBV_WC_SUCCESS && ok > 0, "stream before port down: %s after %d",
              ibv_wc_status_str(st), ok);
        ctl_write(e, "softverbs0", "port=down\n");
        t0 = now_ms();
        st = stream_until_error(e, 20000, &ok);
        CHECK(e, st == IBV_WC_RETRY_EXC_ERR, "A after port down: %s", ibv_wc_status_str(st));
        printf("  A: %s after %llu ms\n", ibv_wc_status_str(st),
               (unsigned long long)(now_ms() - t0));
    } else {
        st = stream_until_error(e, 30000, &ok);
        CHECK(e, st == IBV_WC_WR_FLUSH_ERR, "B after port down: %s", ibv_wc_status_str(st));
        CHECK(e, wait_async(e, IBV_EVENT_PORT_ERR, POLL_MS), "no PORT_ERR event");
        CHECK(e, qp_state(e->qp) == IBV_QPS_ERR, "B's QP not in ERR");
        CHECK(e, ibv_query_port(e->ctx, 1, &pa) == 0 && pa.state == IBV_PORT_DOWN, "port not DOWN");
    }
    barrier(e);
    drain_cq(e);
    if (is_a)
        ctl_write(e, "softverbs0", "port=up\n");
    else
        CHECK(e, wait_async(e, IBV_EVENT_PORT_ACTIVE, POLL_MS), "no PORT_ACTIVE event");
    barrier(e);
    if (pair_new(e, 7, 7)) {
        fail(e, "reconnect after port up");
        return;
    }
    data_one(e, is_a, 65536, 90);
}

void case_local_errors(struct ep *e, bool is_a)
{
    struct ibv_sge sge = {.addr = (uintptr_t)e->buf, .length = 64, .lkey = e->mr->lkey ^ 0x100};
    struct ibv_send_wr wr = {.wr_id = 80, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND};
    struct ibv_send_wr *bad;

    say(e, "bad lkey -> LOC_PROT_ERR; receive too small -> LOC_LEN_ERR / REM_INV_REQ_ERR");
    if (pair_new(e, 7, 7)) {
        fail(e, "connect");
        return;
    }
    if (is_a) {
        wr.send_flags = IBV_SEND_SIGNALED;
        CHECK(e, ibv_post_send(e->qp, &wr, &bad) == 0, "post with bad lkey refused");
        expect_wc(e, IBV_WC_LOC_PROT_ERR, 80, "SEND with bad lkey");
    }
    barrier(e);
    if (pair_new(e, 7, 7)) {
        fail(e, "connect");
        return;
    }
    if (!is_a)
        post_recv(e, 0, 16, 81);
    barrier(e);
    if (is_a) {
        post_rdma(e, IBV_WR_SEND, 0, 0, 100, 0, 82, IBV_SEND_SIGNALED);
        expect_wc(e, IBV_WC_REM_INV_REQ_ERR, 82, "SEND larger than the receive");
    } else {
        expect_wc(e, IBV_WC_LOC_LEN_ERR, 81, "receive too small");
    }
    barrier(e);
}
