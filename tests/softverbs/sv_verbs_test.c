/* Verbs-level test of the softverbs device: two processes (A = parent, requester; B = child,
 * responder) talk RC over softverbs, synchronised through a socketpair.
 *
 * Built against the system libibverbs and run with LD_LIBRARY_PATH pointing at the stand-in.
 * Without softverbs devices (e.g. run against the real library) it exits 77 (skipped).
 * Environment: SOFTVERBS_CTL_DIR must be set for the fault-injection cases; with two devices
 * A uses softverbs1 and B softverbs0, so that B's port can go down alone.
 */
#include <errno.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "sv_verbs_test.h"

int failures;

void fail(struct ep *e, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    fprintf(stderr, "[%s] FAIL: ", e->role);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    failures++;
}

uint64_t now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

void oob_xfer(struct ep *e, const void *out, void *in, size_t len)
{
    size_t done;
    ssize_t n;

    for (done = 0; done < len; done += (size_t)n) {
        n = write(e->oob, (const char *)out + done, len - done);
        if (n <= 0)
            exit(2);
    }
    for (done = 0; done < len; done += (size_t)n) {
        n = read(e->oob, (char *)in + done, len - done);
        if (n <= 0)
            exit(2);
    }
}

void barrier(struct ep *e)
{
    char a = 'b', b;

    oob_xfer(e, &a, &b, 1);
}

void fill(uint8_t *p, size_t len, unsigned seed)
{
    for (size_t i = 0; i < len; i++)
        p[i] = (uint8_t)(i * 131 + seed + (i >> 12));
}

bool verify(const uint8_t *p, size_t len, unsigned seed)
{
    for (size_t i = 0; i < len; i++)
        if (p[i] != (uint8_t)(i * 131 + seed + (i >> 12)))
            return false;
    return true;
}

/* Waits for one completion; returns false on timeout. */
bool poll_one(struct ep *e, struct ibv_wc *wc, int timeout_ms)
{
    uint64_t end = now_ms() + (uint64_t)timeout_ms;
    int n;

    while (now_ms() < end) {
        n = ibv_poll_cq(e->cq, 1, wc);
        if (n == 1)
            return true;
        if (n < 0)
            return false;
        usleep(200);
    }
    return false;
}

static int ep_open(struct ep *e, const char *devname)
{
    struct ibv_device **list;
    struct ibv_port_attr pa;
    int i, n;

    list = ibv_get_device_list(&n);
    if (!list)
        return -1;
    for (i = 0; i < n; i++)
        if (strcmp(ibv_get_device_name(list[i]), devname) == 0)
            e->ctx = ibv_open_device(list[i]);
    ibv_free_device_list(list);
    if (!e->ctx)
        return -1;
    if (ibv_query_port(e->ctx, 1, &pa))
        return -1;
    e->eth = pa.link_layer == IBV_LINK_LAYER_ETHERNET;
    e->self.lid = pa.lid;
    if (ibv_query_gid(e->ctx, 1, e->eth ? 1 : 0, &e->self.gid))
        return -1;
    e->pd = ibv_alloc_pd(e->ctx);
    e->cq = ibv_create_cq(e->ctx, 4096, NULL, NULL, 0);
    e->buf = aligned_alloc(4096, BUF_SIZE);
    if (!e->pd || !e->cq || !e->buf)
        return -1;
    e->mr = ibv_reg_mr(e->pd, e->buf, BUF_SIZE,
                       IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
    if (!e->mr)
        return -1;
    e->self.addr = (uintptr_t)e->buf;
    e->self.rkey = e->mr->rkey;
    return 0;
}

struct ibv_qp *qp_create(struct ep *e)
{
    struct ibv_qp_init_attr ia = {
        .send_cq = e->cq,
        .recv_cq = e->cq,
        .cap = {.max_send_wr = 256, .max_recv_wr = 256, .max_send_sge = 4, .max_recv_sge = 4},
        .qp_type = IBV_QPT_RC,
    };

    return ibv_create_qp(e->pd, &ia);
}

int qp_to_init(struct ibv_qp *qp)
{
    struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT, .port_num = 1};

    a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
    return ibv_modify_qp(qp, &a,
                         IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
}

int qp_to_rtr(struct ep *e, struct ibv_qp *qp, const struct info *peer)
{
    struct ibv_qp_attr a = {
        .qp_state = IBV_QPS_RTR,
        .path_mtu = IBV_MTU_1024,
        .dest_qp_num = peer->qpn,
        .rq_psn = peer->psn,
        .max_dest_rd_atomic = 1,
        .min_rnr_timer = 12,
        .ah_attr = {.dlid = peer->lid, .port_num = 1},
    };

    if (e->eth) {
        a.ah_attr.is_global = 1;
        a.ah_attr.grh.dgid = peer->gid;
        a.ah_attr.grh.sgid_index = 1;
        a.ah_attr.grh.hop_limit = 1;
    }
    return ibv_modify_qp(qp, &a,
                         IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                             IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
}

int qp_to_rts(struct ibv_qp *qp, uint32_t psn, int rnr_retry, int retry_cnt)
{
    struct ibv_qp_attr a = {
        .qp_state = IBV_QPS_RTS,
        .timeout = QP_TIMEOUT,
        .retry_cnt = (uint8_t)retry_cnt,
        .rnr_retry = (uint8_t)rnr_retry,
        .sq_psn = psn,
        .max_rd_atomic = 1,
    };

    return ibv_modify_qp(qp, &a,
                         IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                             IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
}

/* Creates a QP and connects it to the peer's new QP (both sides call it together). */
int pair_new(struct ep *e, int rnr_retry, int retry_cnt)
{
    if (e->qp)
        ibv_destroy_qp(e->qp);
    e->qp = qp_create(e);
    if (!e->qp || qp_to_init(e->qp))
        return -1;
    e->self.qpn = e->qp->qp_num;
    e->self.psn = (uint32_t)(rand() & 0xffffff);
    oob_xfer(e, &e->self, &e->peer, sizeof(e->self));
    if (qp_to_rtr(e, e->qp, &e->peer) || qp_to_rts(e->qp, e->self.psn, rnr_retry, retry_cnt))
        return -1;
    barrier(e);
    return 0;
}

int post_rdma(struct ep *e, enum ibv_wr_opcode op, uint64_t loff, uint64_t roff, uint32_t len,
              uint32_t rkey, uint64_t wr_id, unsigned flags)
{
    struct ibv_sge sge = {.addr = (uintptr_t)e->buf + loff, .length = len, .lkey = e->mr->lkey};
    struct ibv_send_wr wr = {.wr_id = wr_id, .sg_list = &sge, .num_sge = 1, .opcode = op};
    struct ibv_send_wr *bad;

    wr.send_flags = flags;
    wr.wr.rdma.remote_addr = e->peer.addr + roff;
    wr.wr.rdma.rkey = rkey;
    wr.imm_data = htobe32(0x1234u);
    return ibv_post_send(e->qp, &wr, &bad);
}

int post_recv(struct ep *e, uint64_t off, uint32_t len, uint64_t wr_id)
{
    struct ibv_sge sge = {.addr = (uintptr_t)e->buf + off, .length = len, .lkey = e->mr->lkey};
    struct ibv_recv_wr wr = {.wr_id = wr_id, .sg_list = &sge, .num_sge = 1};
    struct ibv_recv_wr *bad;

    return ibv_post_recv(e->qp, &wr, &bad);
}

void expect_wc(struct ep *e, enum ibv_wc_status st, uint64_t wr_id, const char *what)
{
    struct ibv_wc wc;

    if (!poll_one(e, &wc, POLL_MS)) {
        fail(e, "%s: no completion", what);
        return;
    }
    CHECK(e, wc.status == st, "%s: status %s, expected %s", what, ibv_wc_status_str(wc.status),
          ibv_wc_status_str(st));
    CHECK(e, wc.wr_id == wr_id, "%s: wr_id %llu, expected %llu", what, (unsigned long long)wc.wr_id,
          (unsigned long long)wr_id);
}

static int run(struct ep *e, bool is_a, const char *dev)
{
    if (ep_open(e, dev)) {
        fprintf(stderr, "[%s] cannot open %s\n", e->role, dev);
        return 2;
    }
    case_transitions(e, is_a);
    case_data(e, is_a);
    case_unsignaled_sge(e, is_a);
    case_bad_rkey(e, is_a);
    case_rnr(e, is_a);
    case_err_qp_flush(e, is_a);
    case_local_errors(e, is_a);
    case_faults(e, is_a);
    case_port_down(e, is_a);
    return failures ? 1 : 0;
}

static int count_devices(void)
{
    struct ibv_device **list;
    int n = 0, i, sv = 0;

    list = ibv_get_device_list(&n);
    for (i = 0; list && i < n; i++)
        if (strncmp(ibv_get_device_name(list[i]), "softverbs", 9) == 0)
            sv++;
    if (list)
        ibv_free_device_list(list);
    return sv;
}

int main(void)
{
    struct ep a = {.role = "A"}, b = {.role = "B"};
    int sp[2], st = 0, rc, ndev;
    pid_t pid;

    ndev = count_devices();
    if (ndev == 0) {
        printf("no softverbs device (is LD_LIBRARY_PATH set?): skipped\n");
        return 77;
    }
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sp))
        return 2;
    fflush(NULL);
    pid = fork();
    if (pid < 0)
        return 2;
    if (pid == 0) {
        close(sp[0]);
        b.oob = sp[1];
        srand(2);
        _exit(run(&b, false, "softverbs0"));
    }
    close(sp[1]);
    a.oob = sp[0];
    srand(1);
    rc = run(&a, true, ndev > 1 ? "softverbs1" : "softverbs0");
    close(a.oob);
    if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        fprintf(stderr, "B failed (status %d)\n", st);
        rc = 1;
    }
    printf("%s\n", rc ? "FAILED" : "PASSED");
    return rc;
}
