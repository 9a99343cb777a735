/* softverbs: the requester side of an RC QP.
 *
 * Send work requests are cut into packets of at most SV_CHUNK bytes, one PSN each, and sent
 * while fewer than SV_WINDOW packets are unacknowledged. ACKs are cumulative; a READ request
 * is acknowledged only by its response. On timeout or on a PSN sequence NAK the requester goes
 * back to the oldest unacknowledged packet (go-back-N). Invariant: while packets are
 * outstanding, sq[sq_head] is the work request that holds psn_una.
 *
 * Every function here is called with ctx->lock held.
 */
#include "sv_int.h"

#include <errno.h>
#include <pthread.h>
#include <string.h>

#define SQ(qp, i) (&(qp)->sq[(i) & ((qp)->sq_size - 1)])

uint64_t sv_timeout_ns(const struct sv_qp *qp)
{
    uint64_t ns = qp->attr.timeout ? 4096ull << qp->attr.timeout : 0;
    uint64_t min = sv_min_timeout_ns();

    return ns > min ? ns : min;
}

/* IB's RNR timer encoding, in units of 10 us; waits shorter than 1 ms are rounded up so that
 * an application that never posts receives costs a few packets per millisecond, not a core. */
static uint64_t sv_rnr_ns(uint8_t code)
{
    static const uint32_t t[32] = {65536, 1,    2,    3,     4,     6,     8,     12,
                                   16,    24,   32,   48,    64,    96,    128,   192,
                                   256,   384,  512,  768,   1024,  1536,  2048,  3072,
                                   4096,  6144, 8192, 12288, 16384, 24576, 32768, 49152};
    uint64_t ns = (uint64_t)t[code & 31] * 10000ull;

    return ns < 1000000ull ? 1000000ull : ns;
}

static enum ibv_wc_status sv_req_check(struct sv_qp *qp, struct sv_swqe *w)
{
    struct sv_context *ctx = sv_ctx(qp->ibqp.context);
    int access = w->opcode == IBV_WR_RDMA_READ ? IBV_ACCESS_LOCAL_WRITE : 0;

    if (w->flags & IBV_SEND_INLINE)
        return IBV_WC_SUCCESS;
    if (!sv_sge_valid(ctx, qp->ibqp.pd, w->sge, w->num_sge, access))
        return IBV_WC_LOC_PROT_ERR;
    return IBV_WC_SUCCESS;
}

/* Builds and sends packet k of w. Returns 0 (sent, or lost on the way), -EAGAIN when the
 * socket is full, -EFAULT when the local memory can no longer be read. */
static int sv_req_send_pkt(struct sv_qp *qp, struct sv_swqe *w, uint32_t k)
{
    struct sv_context *ctx = sv_ctx(qp->ibqp.context);
    uint64_t off = (uint64_t)k * SV_CHUNK;
    struct sv_pkt pkt = {0};
    bool last = k + 1 == w->npkts;
    const void *payload = NULL;

    pkt.psn = sv_psn_add(w->first_psn, k);
    pkt.flags = (k == 0 ? SV_F_FIRST : 0) | (last ? SV_F_LAST : 0);
    pkt.msg_off = off;
    pkt.msg_len = w->len;
    pkt.len = (uint32_t)(w->len - off < SV_CHUNK ? w->len - off : SV_CHUNK);
    pkt.raddr = w->raddr + off;
    pkt.rkey = w->rkey;
    switch (w->opcode) {
    case IBV_WR_RDMA_READ:
        pkt.op = SV_OP_READ_REQ;
        return sv_pkt_send(qp, &pkt, NULL);
    case IBV_WR_RDMA_WRITE:
    case IBV_WR_RDMA_WRITE_WITH_IMM:
        pkt.op = SV_OP_WRITE;
        break;
    default:
        pkt.op = SV_OP_SEND;
        break;
    }
    if (last && (w->opcode == IBV_WR_SEND_WITH_IMM || w->opcode == IBV_WR_RDMA_WRITE_WITH_IMM)) {
        pkt.flags |= SV_F_IMM;
        pkt.imm = w->imm;
    }
    if (pkt.len && (w->flags & IBV_SEND_INLINE)) {
        payload = w->inl + off;
    } else if (pkt.len) {
        if (sv_sge_copy(ctx, qp->ibqp.pd, w->sge, w->num_sge, off, ctx->txbuf, pkt.len, false))
            return -EFAULT;
        payload = ctx->txbuf;
    }
    return sv_pkt_send(qp, &pkt, payload ? payload : "");
}

static void sv_req_arm(struct sv_qp *qp)
{
    struct sv_context *ctx = sv_ctx(qp->ibqp.context);

    if (qp->timer_ns)
        return;
    qp->timer_ns = sv_now_ns() + sv_timeout_ns(qp);
    /* The progress thread may sleep without a deadline: tell it about this one. */
    if (!pthread_equal(pthread_self(), ctx->thread))
        sv_progress_kick(ctx);
}

static void sv_req_complete_head(struct sv_qp *qp);

/* UC has no acknowledgements: a request is complete once its last packet is sent. */
static void sv_req_uc_sent(struct sv_qp *qp, struct sv_swqe *w)
{
    qp->psn_una = qp->psn_next;
    if (++qp->cur_pkt < w->npkts)
        return;
    qp->sq_cur++;
    qp->cur_pkt = 0;
    sv_req_complete_head(qp);
}

void sv_req_pump(struct sv_qp *qp)
{
    struct sv_swqe *w;
    int rc;

    if (qp->attr.qp_state != IBV_QPS_RTS || qp->want_out || qp->rnr_ns)
        return;
    while (qp->sq_cur != qp->sq_tail && sv_psn_diff(qp->psn_next, qp->psn_una) < (int)SV_WINDOW) {
        w = SQ(qp, qp->sq_cur);
        if (qp->cur_pkt == 0) {
            w->first_psn = qp->psn_next;
            w->err = sv_req_check(qp, w);
        }
        rc = w->err ? -EFAULT : sv_req_send_pkt(qp, w, qp->cur_pkt);
        if (rc == -EAGAIN) {
            qp->want_out = true;
            sv_qp_watch(qp, true);
            return;
        }
        if (rc == -EFAULT) {
            w->err = IBV_WC_LOC_PROT_ERR;
            /* Earlier requests complete first; the ACK that completes them pumps again. */
            if (qp->sq_head == qp->sq_cur)
                sv_qp_fatal(qp, w->err);
            return;
        }
        qp->psn_next = sv_psn_add(qp->psn_next, 1);
        if (qp->ibqp.qp_type == IBV_QPT_UC) {
            sv_req_uc_sent(qp, w);
            continue;
        }
        sv_req_arm(qp);
        if (++qp->cur_pkt == w->npkts) {
            qp->sq_cur++;
            qp->cur_pkt = 0;
        }
    }
}

/* Go back to the oldest unacknowledged packet. */
static void sv_req_rewind(struct sv_qp *qp)
{
    if (qp->psn_una == qp->psn_next)
        return;
    qp->psn_next = qp->psn_una;
    qp->sq_cur = qp->sq_head;
    qp->cur_pkt = (uint32_t)sv_psn_diff(qp->psn_una, SQ(qp, qp->sq_head)->first_psn);
}

static void sv_req_complete_head(struct sv_qp *qp)
{
    sv_send_completion(qp, SQ(qp, qp->sq_head), IBV_WC_SUCCESS);
    qp->sq_head++;
}

static void sv_req_progress(struct sv_qp *qp)
{
    qp->retries_left = qp->attr.retry_cnt;
    qp->rnr_left = qp->attr.rnr_retry;
    qp->timer_ns = 0;
    if (qp->psn_una != qp->psn_next)
        sv_req_arm(qp);
}

/* Acknowledges every packet up to psn, stopping at a READ (only its response completes it).
 * Returns whether psn_una moved. */
static bool sv_req_ack_upto(struct sv_qp *qp, uint32_t psn)
{
    bool moved = false;
    struct sv_swqe *w;
    uint32_t last;

    while (qp->psn_una != qp->psn_next && sv_psn_diff(psn, qp->psn_una) >= 0) {
        w = SQ(qp, qp->sq_head);
        if (w->opcode == IBV_WR_RDMA_READ)
            break;
        last = sv_psn_add(w->first_psn, w->npkts - 1);
        if (sv_psn_diff(psn, last) < 0) {
            qp->psn_una = sv_psn_add(psn, 1);
            return true;
        }
        qp->psn_una = sv_psn_add(last, 1);
        sv_req_complete_head(qp);
        moved = true;
    }
    return moved;
}

static bool sv_req_in_flight(const struct sv_qp *qp, uint32_t psn)
{
    return sv_psn_diff(psn, qp->psn_una) >= 0 && sv_psn_diff(psn, qp->psn_next) < 0;
}

static void sv_req_read_resp(struct sv_qp *qp, const struct sv_pkt *pkt, const uint8_t *payload)
{
    struct sv_context *ctx = sv_ctx(qp->ibqp.context);
    struct sv_swqe *w = SQ(qp, qp->sq_head);
    uint32_t k, expect;
    uint64_t off;

    if (pkt->psn != qp->psn_una || qp->psn_una == qp->psn_next || w->opcode != IBV_WR_RDMA_READ)
        return; /* a duplicate, or out of order: the timer goes back for it */
    k = (uint32_t)sv_psn_diff(pkt->psn, w->first_psn);
    off = (uint64_t)k * SV_CHUNK;
    expect = (uint32_t)(w->len - off < SV_CHUNK ? w->len - off : SV_CHUNK);
    if (pkt->len != expect)
        return;
    if (expect &&
        sv_sge_copy(ctx, qp->ibqp.pd, w->sge, w->num_sge, off, (uint8_t *)payload, expect, true)) {
        sv_qp_fatal(qp, IBV_WC_LOC_PROT_ERR);
        return;
    }
    qp->psn_una = sv_psn_add(pkt->psn, 1);
    if (k + 1 == w->npkts)
        sv_req_complete_head(qp);
    sv_req_progress(qp);
    sv_req_pump(qp);
}

static void sv_req_nak(struct sv_qp *qp, const struct sv_pkt *pkt)
{
    static const enum ibv_wc_status fatal[] = {
        [SV_NAK_INV_REQ] = IBV_WC_REM_INV_REQ_ERR,
        [SV_NAK_ACCESS] = IBV_WC_REM_ACCESS_ERR,
        [SV_NAK_OP_ERR] = IBV_WC_REM_OP_ERR,
    };

    if (!sv_req_in_flight(qp, pkt->psn))
        return;
    if (sv_req_ack_upto(qp, sv_psn_add(pkt->psn, SV_PSN_MASK)))
        sv_req_progress(qp);
    if (qp->psn_una != pkt->psn)
        return; /* an earlier READ response is missing; the timer goes back for it */
    switch (pkt->syndrome) {
    case SV_NAK_PSN_SEQ:
        sv_req_rewind(qp);
        sv_req_pump(qp);
        break;
    case SV_NAK_RNR:
        if (qp->attr.rnr_retry != 7) { /* 7 means retry for ever */
            if (qp->rnr_left == 0) {
                sv_qp_fatal(qp, IBV_WC_RNR_RETRY_EXC_ERR);
                return;
            }
            qp->rnr_left--;
        }
        sv_req_rewind(qp);
        qp->rnr_ns = sv_now_ns() + sv_rnr_ns(pkt->rnr_timer);
        qp->timer_ns = qp->rnr_ns;
        break;
    case SV_NAK_INV_REQ:
    case SV_NAK_ACCESS:
    case SV_NAK_OP_ERR:
        sv_qp_fatal(qp, fatal[pkt->syndrome]);
        break;
    default:
        break;
    }
}

void sv_req_rx(struct sv_qp *qp, const struct sv_pkt *pkt, const uint8_t *payload)
{
    if (qp->attr.qp_state != IBV_QPS_RTS && qp->attr.qp_state != IBV_QPS_SQD)
        return;
    switch (pkt->op) {
    case SV_OP_ACK:
        if (sv_req_in_flight(qp, pkt->psn) && sv_req_ack_upto(qp, pkt->psn)) {
            sv_req_progress(qp);
            sv_req_pump(qp);
        }
        break;
    case SV_OP_NAK:
        sv_req_nak(qp, pkt);
        break;
    case SV_OP_READ_RESP:
        sv_req_read_resp(qp, pkt, payload);
        break;
    default:
        break;
    }
}

void sv_req_timer(struct sv_qp *qp, uint64_t now)
{
    if (!qp->timer_ns || now < qp->timer_ns)
        return;
    qp->timer_ns = 0;
    if (qp->rnr_ns) {
        qp->rnr_ns = 0;
    } else if (qp->psn_una == qp->psn_next) {
        return;
    } else if (qp->attr.timeout != 0) { /* 0 means never give up */
        if (qp->retries_left == 0) {
            sv_qp_fatal(qp, IBV_WC_RETRY_EXC_ERR);
            return;
        }
        qp->retries_left--;
    }
    sv_req_rewind(qp);
    if (qp->psn_una != qp->psn_next || qp->sq_cur != qp->sq_tail)
        sv_req_arm(qp);
    sv_req_pump(qp);
}
