/* softverbs: the responder side of an RC QP.
 *
 * Requests are executed strictly in PSN order. The expected PSN (epsn) advances by one per
 * executed packet; a packet ahead of it gets one sequence NAK, a packet behind it is a
 * duplicate: SEND and WRITE duplicates are acknowledged again, READ duplicates are executed
 * again, as IB requires. Errors the responder finds (bad rkey, missing rights, a receive buffer
 * that is too small) are answered with a NAK and move the responder QP to ERR.
 *
 * Every function here is called with ctx->lock held.
 */
#include "sv_int.h"

#include <string.h>

static void sv_resp_reply(struct sv_qp *qp, uint8_t op, uint32_t psn, uint8_t syndrome)
{
    struct sv_pkt pkt = {0};

    if (qp->ibqp.qp_type == IBV_QPT_UC)
        return; /* UC is unacknowledged */
    pkt.op = op;
    pkt.psn = psn;
    pkt.syndrome = syndrome;
    pkt.rnr_timer = qp->attr.min_rnr_timer;
    sv_pkt_send(qp, &pkt, NULL);
}

/* A responder error: NAK the request, complete the receive in progress (if any) with
 * recv_status, raise the affiliated event and flush. */
static void sv_resp_error(struct sv_qp *qp, const struct sv_pkt *pkt, uint8_t syndrome,
                          enum ibv_wc_status recv_status, enum ibv_event_type event)
{
    struct ibv_wc wc = {0};

    sv_resp_reply(qp, SV_OP_NAK, pkt->psn, syndrome);
    if (recv_status != IBV_WC_SUCCESS && qp->recv_busy) {
        wc.wr_id = qp->cur_rwqe.wr_id;
        wc.status = recv_status;
        wc.opcode = IBV_WC_RECV;
        wc.qp_num = qp->ibqp.qp_num;
        qp->recv_busy = false;
        sv_cq_push(sv_cq(qp->ibqp.recv_cq), &wc);
    }
    sv_async_event(sv_ctx(qp->ibqp.context), event, &qp->ibqp);
    sv_qp_flush(qp);
}

/* Completes cur_rwqe. */
static void sv_resp_recv_done(struct sv_qp *qp, const struct sv_pkt *pkt, enum ibv_wc_opcode op)
{
    struct ibv_wc wc = {0};

    wc.wr_id = qp->cur_rwqe.wr_id;
    wc.status = IBV_WC_SUCCESS;
    wc.opcode = op;
    wc.byte_len = (uint32_t)pkt->msg_len;
    wc.qp_num = qp->ibqp.qp_num;
    wc.src_qp = qp->attr.dest_qp_num;
    wc.slid = qp->attr.ah_attr.dlid;
    if (pkt->flags & SV_F_IMM) {
        wc.wc_flags = IBV_WC_WITH_IMM;
        wc.imm_data = pkt->imm;
    }
    if (qp->attr.ah_attr.is_global)
        wc.wc_flags |= IBV_WC_GRH;
    qp->recv_busy = false;
    sv_cq_push(sv_cq(qp->ibqp.recv_cq), &wc);
}

static uint64_t sv_rwqe_len(const struct sv_rwqe *r)
{
    uint64_t len = 0;
    int i;

    for (i = 0; i < r->num_sge; i++)
        len += r->sge[i].length;
    return len;
}

/* Returns false when the packet was answered with an RNR NAK or an error. */
static bool sv_resp_send(struct sv_qp *qp, const struct sv_pkt *pkt, const uint8_t *payload)
{
    struct sv_context *ctx = sv_ctx(qp->ibqp.context);
    struct sv_rwqe *r = &qp->cur_rwqe;

    /* A UC SEND cut short by a lost packet leaves cur_rwqe taken: the next message reuses it. */
    if (pkt->flags & SV_F_FIRST) {
        if (!qp->recv_busy && !sv_recv_take(qp, r)) {
            sv_resp_reply(qp, SV_OP_NAK, pkt->psn, SV_NAK_RNR);
            return false;
        }
        qp->recv_busy = true;
    }
    if (!qp->recv_busy)
        return false; /* cannot happen in PSN order; ignore */
    if (pkt->msg_len > sv_rwqe_len(r)) {
        sv_resp_error(qp, pkt, SV_NAK_INV_REQ, IBV_WC_LOC_LEN_ERR, IBV_EVENT_QP_REQ_ERR);
        return false;
    }
    if (pkt->len && sv_sge_copy(ctx, qp->ibqp.pd, r->sge, r->num_sge, pkt->msg_off,
                                (uint8_t *)payload, pkt->len, true)) {
        sv_resp_error(qp, pkt, SV_NAK_OP_ERR, IBV_WC_LOC_PROT_ERR, IBV_EVENT_QP_ACCESS_ERR);
        return false;
    }
    if (pkt->flags & SV_F_LAST)
        sv_resp_recv_done(qp, pkt, IBV_WC_RECV);
    return true;
}

static uint8_t *sv_resp_target(struct sv_qp *qp, const struct sv_pkt *pkt, int access)
{
    struct sv_context *ctx = sv_ctx(qp->ibqp.context);

    if (!(qp->attr.qp_access_flags & access))
        return NULL;
    return sv_mr_ptr(ctx, qp->ibqp.pd, pkt->rkey, pkt->raddr, pkt->len, access);
}

static bool sv_resp_write(struct sv_qp *qp, const struct sv_pkt *pkt, const uint8_t *payload)
{
    uint8_t *dst = NULL;

    /* A zero-length WRITE touches no memory, so its rkey is not checked. */
    if (pkt->msg_len) {
        dst = sv_resp_target(qp, pkt, IBV_ACCESS_REMOTE_WRITE);
        if (!dst && qp->ibqp.qp_type == IBV_QPT_UC)
            return false; /* UC drops what it cannot place */
        if (!dst) {
            sv_resp_error(qp, pkt, SV_NAK_ACCESS, IBV_WC_SUCCESS, IBV_EVENT_QP_ACCESS_ERR);
            return false;
        }
    }
    if ((pkt->flags & SV_F_IMM) && !sv_recv_ready(qp)) {
        sv_resp_reply(qp, SV_OP_NAK, pkt->psn, SV_NAK_RNR);
        return false;
    }
    if (pkt->len)
        memcpy(dst, payload, pkt->len);
    if ((pkt->flags & SV_F_IMM) && sv_recv_take(qp, &qp->cur_rwqe))
        sv_resp_recv_done(qp, pkt, IBV_WC_RECV_RDMA_WITH_IMM);
    return true;
}

static bool sv_resp_read(struct sv_qp *qp, const struct sv_pkt *req)
{
    struct sv_pkt pkt = {0};
    uint8_t *src = NULL;

    if (req->msg_len) {
        src = sv_resp_target(qp, req, IBV_ACCESS_REMOTE_READ);
        if (!src) {
            sv_resp_error(qp, req, SV_NAK_ACCESS, IBV_WC_SUCCESS, IBV_EVENT_QP_ACCESS_ERR);
            return false;
        }
    }
    pkt.op = SV_OP_READ_RESP;
    pkt.psn = req->psn;
    pkt.len = req->len;
    pkt.msg_off = req->msg_off;
    pkt.msg_len = req->msg_len;
    sv_pkt_send(qp, &pkt, src ? (const void *)src : "");
    return true;
}

/* UC: no ACK, NAK or retransmission. A PSN gap or a message that cannot be placed drops the
 * rest of that message; delivery resumes at the next first packet. */
static void sv_resp_uc(struct sv_qp *qp, const struct sv_pkt *pkt, const uint8_t *payload)
{
    bool ok = false;

    if (pkt->psn != qp->epsn)
        qp->uc_drop = true;
    qp->epsn = sv_psn_add(pkt->psn, 1);
    if (pkt->flags & SV_F_FIRST)
        qp->uc_drop = false;
    if (qp->uc_drop)
        return;
    if (pkt->op == SV_OP_SEND)
        ok = sv_resp_send(qp, pkt, payload);
    else if (pkt->op == SV_OP_WRITE)
        ok = sv_resp_write(qp, pkt, payload);
    if (!ok)
        qp->uc_drop = true;
}

void sv_resp_rx(struct sv_qp *qp, const struct sv_pkt *pkt, const uint8_t *payload)
{
    enum ibv_qp_state st = qp->attr.qp_state;
    int32_t d = sv_psn_diff(pkt->psn, qp->epsn);
    bool ok;

    if (st != IBV_QPS_RTR && st != IBV_QPS_RTS && st != IBV_QPS_SQD)
        return;
    if (qp->ibqp.qp_type == IBV_QPT_UC) {
        sv_resp_uc(qp, pkt, payload);
        return;
    }
    if (d > 0) {
        if (!qp->nak_sent)
            sv_resp_reply(qp, SV_OP_NAK, qp->epsn, SV_NAK_PSN_SEQ);
        qp->nak_sent = true;
        return;
    }
    if (d < 0) {
        if (pkt->op == SV_OP_READ_REQ)
            sv_resp_read(qp, pkt);
        else
            sv_resp_reply(qp, SV_OP_ACK, sv_psn_add(qp->epsn, SV_PSN_MASK), 0);
        return;
    }
    switch (pkt->op) {
    case SV_OP_SEND:
        ok = sv_resp_send(qp, pkt, payload);
        break;
    case SV_OP_WRITE:
        ok = sv_resp_write(qp, pkt, payload);
        break;
    case SV_OP_READ_REQ:
        ok = sv_resp_read(qp, pkt);
        break;
    default:
        return;
    }
    if (!ok)
        return;
    if (pkt->op != SV_OP_READ_REQ)
        sv_resp_reply(qp, SV_OP_ACK, pkt->psn, 0);
    qp->epsn = sv_psn_add(qp->epsn, 1);
    qp->nak_sent = false;
}
