/*
 * Messages over rdma: a ring in the receiver's memory, written with RDMA WRITE.
 *
 * The first QP an engine sets up to a peer carries its messages there (msg_open asks for one
 * when none exists). With its set-up request the initiator sends its stream and the address of
 * a cell in its own registered memory; the target answers with a ring it registered (records
 * and consumption as msg_ring.h says) and the number of receives it keeps posted.
 *
 * Sender: records go into a local mirror of the ring, and each fill pass writes what it added
 * to the same place of the peer's ring, the last work request with an immediate (the low 32
 * bits of the new head) that consumes one of the receiver's receives and wakes it. Such writes
 * in flight are bounded by the receives (credits); one is retired when the consumed position
 * passes its head (the receiver had re-posted its receive long before).
 * Receiver: a receive's completion says how far the ring is written; records are taken as far
 * as the queues allow (a blocked record is tried again every pass, as shm does) and the
 * consumed position goes back by a write with immediate into the sender's cell, at most one
 * per pass and MC_RDMA_MSG_UPD in flight (the latest value; the sender reads the cell). A
 * sender whose receives for these run short only delays them (RNR retries for ever). Where
 * handlers get their messages where they lie (callbacks in the pass, MC_MSG_ACK_AFTER_HANDLER),
 * the ring lends its records, as shm's does: the consumed position passes a record once its
 * handler ran (the reap sends it), so that the sender hears then that it was delivered.
 *
 * Failures: the QP going (an error completion, its control link lost, the peer closed) makes
 * the sender answer what the receiver consumed and hand the rest back to the control link
 * (go-back-N there; the receiver drops what it saw), as a closed shm ring does. A record that
 * cannot be one closes the QP on the receiver's side.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../msg_ring.h"
#include "rdma_int.h"

#define RING_BYTES (512u << 10)
#define FIFO_CAP   (2 * MC_MSG_WINDOW) /* records in the ring, resends included */
#define RX_BUDGET  1024u               /* records taken per ring per pass */

_Static_assert(RING_BYTES >= 4 * (MC_MSG_MAX + MC_RING_REC_HDR),
               "a ring holds a few largest messages");

struct rdma_msg_tx {
    mc_peer_t *peer; /* NULL once the QP stopped carrying messages */
    struct ibv_mr *mr;
    uint8_t *area;                        /* the mirror of the peer's ring, then the cell */
    _Atomic uint64_t *cell;               /* the receiver's consumed position, written by it */
    uint64_t head, posted;                /* bytes in the mirror; bytes written to the peer */
    uint64_t raddr;                       /* the peer's ring */
    uint32_t rkey, credits;               /* ... its rkey, and its receives */
    bool up;                              /* the peer took the ring */
    unsigned wr_out;                      /* ring writes posted, not completed */
    mc_ring_fifo_t fifo;                  /* records not consumed yet */
    uint64_t imm_end[MC_RDMA_MSG_RX_RCV]; /* heads of writes with immediate not passed yet */
    unsigned imm_first, imm_n;
};

struct rdma_msg_rx {
    mc_list_t link; /* in mc_rdma_t.msg_rx while the QP receives, then in msg_rx_lent while
                       records of its ring are lent (its QP draining or gone) */
    mc_rdma_qp_t *qp;
    struct ibv_mr *mr;
    uint8_t *area;                  /* the ring, then the value updates are written from */
    uint64_t head, tail, tail_sent; /* written (as the last immediate said), taken, told */
    mc_ring_lend_t lend;            /* records taken and lent to their handlers */
    uint64_t stream, cell;          /* the sender's stream and cell */
    uint32_t cell_rkey;
    unsigned upd_out; /* updates posted, not completed */
    bool blocked;     /* the next record was refused: tried every pass */
    char sender[MC_NAME_MAX];
};

static uint64_t wr_id(mc_rdma_qp_t *qp, unsigned kind)
{
    return (uint64_t)(uintptr_t)qp | kind;
}

static void *area_alloc(size_t len)
{
    void *p = NULL;

    return posix_memalign(&p, 4096, len) ? NULL : memset(p, 0, len);
}

/* Register area[0, len) on qp's device for remote writes. */
static struct ibv_mr *area_reg(mc_rdma_qp_t *qp, void *area, size_t len)
{
    struct ibv_mr *mr =
        ibv_reg_mr(qp->dev->pd, area, len, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
    if (!mr)
        mc__set_error(-errno, "%s: registering a message ring: %s", qp->dev->name, strerror(errno));
    return mr;
}

/* Whether the device's CQ has room for n more message receives: together they take at most
 * half of it, so that data always has the rest. */
static int cq_room(const mc_rdma_qp_t *qp, unsigned n)
{
    const mc_rdma_dev_t *d = qp->dev;

    if (d->cq_used + n > d->cq_size / 2)
        return mc__set_error(-ENOSPC, "%s: its CQ is too busy for message receives", d->name);
    return 0;
}

/* Post n receives (no buffer: writes with immediate consume them). */
static int post_recvs(mc_rdma_qp_t *qp, unsigned n)
{
    for (unsigned i = 0; i < n; i++) {
        struct ibv_recv_wr wr = {.wr_id = wr_id(qp, MC_RDMA_WR_MSG_RECV)}, *bad;
        int rc = ibv_post_recv(qp->qp, &wr, &bad);
        if (rc)
            return mc__set_error(-rc, "%s: ibv_post_recv: %s", qp->dev->name, strerror(rc));
        qp->msg_out++;
        qp->dev->cq_used++;
    }
    return 0;
}

/* One signaled RDMA WRITE of local [laddr, +len) to raddr, with an immediate if imm. */
static int post_write(mc_rdma_qp_t *qp, struct ibv_mr *mr, uint8_t *laddr, uint32_t len,
                      uint64_t raddr, uint32_t rkey, bool imm, uint32_t imm_val)
{
    struct ibv_sge sge = {.addr = (uintptr_t)laddr, .length = len, .lkey = mr->lkey};
    struct ibv_send_wr wr = {.wr_id = wr_id(qp, MC_RDMA_WR_MSG_SEND),
                             .sg_list = &sge,
                             .num_sge = 1,
                             .opcode = imm ? IBV_WR_RDMA_WRITE_WITH_IMM : IBV_WR_RDMA_WRITE,
                             .send_flags = IBV_SEND_SIGNALED,
                             .imm_data = htonl(imm_val)},
                       *bad;
    int rc;

    wr.wr.rdma.remote_addr = raddr;
    wr.wr.rdma.rkey = rkey;
    rc = ibv_post_send(qp->qp, &wr, &bad);
    if (rc)
        return mc__set_error(-rc, "%s: ibv_post_send: %s", qp->dev->name, strerror(rc));
    qp->msg_out++;
    qp->dev->cq_used++;
    return 0;
}

/* The QP cannot carry messages any more (its error is in mc_last_error). */
static void msg_qp_failed(mc_engine_t *e, mc_rdma_qp_t *qp)
{
    mc_warn("rdma: message QP %u (%s): %s", qp->qp->qp_num, qp->dev->name, mc_last_error());
    if (qp->rail)
        mc__rdma_rail_failed(qp->peer, qp->rail, false);
    mc__rdma_qp_drain(e, qp);
}

/* ---- sender ---- */

int mc__rdma_msg_tx_create(mc_engine_t *e, mc_rdma_qp_t *qp, mc_peer_t *p, mc_qp_info_t *info)
{
    rdma_msg_tx_t *tx;
    int rc = cq_room(qp, MC_RDMA_MSG_TX_RCV);

    (void)e;
    if (rc)
        return rc;
    rc = -ENOMEM;
    tx = calloc(1, sizeof(*tx));
    if (!tx || mc__ring_fifo_init(&tx->fifo, FIFO_CAP) ||
        !(tx->area = area_alloc(RING_BYTES + sizeof(uint64_t))))
        goto fail;
    rc = -EIO;
    tx->cell = (_Atomic uint64_t *)(void *)(tx->area + RING_BYTES);
    if (!(tx->mr = area_reg(qp, tx->area, RING_BYTES + sizeof(uint64_t))))
        goto fail;
    qp->mtx = tx; /* the receives posted below belong to it */
    if ((rc = post_recvs(qp, MC_RDMA_MSG_TX_RCV)))
        return rc; /* the QP is dropped; mc__rdma_msg_free takes tx */
    tx->peer = p;
    info->msg = true;
    info->msg_addr = (uintptr_t)tx->cell;
    info->msg_rkey = tx->mr->rkey;
    info->msg_arg = p->msg_stream;
    return 0;
fail:
    if (rc == -ENOMEM)
        mc__set_error(rc, "out of memory");
    if (tx) {
        mc__ring_fifo_free(e, &tx->fifo);
        free(tx->area);
    }
    free(tx);
    return rc;
}

void mc__rdma_msg_tx_ready(mc_engine_t *e, mc_rdma_qp_t *qp, const mc_qp_info_t *remote)
{
    rdma_msg_tx_t *tx = qp->mtx;
    uint32_t bytes = (uint32_t)remote->msg_arg, credits = (uint32_t)(remote->msg_arg >> 32);

    if (!tx || !tx->peer)
        return;
    if (!remote->msg || bytes != RING_BYTES || !credits) {
        mc_info("rdma: %s keeps no message ring: messages to it go over %s", tx->peer->name,
                mc__transports[e->ctrl]->name);
        rdma_peer(tx->peer)->msg_off = true;
        rdma_peer(tx->peer)->msg_qp = NULL;
        tx->peer = NULL;
        return;
    }
    tx->raddr = remote->msg_addr;
    tx->rkey = remote->msg_rkey;
    tx->credits = credits < MC_RDMA_MSG_RX_RCV ? credits : MC_RDMA_MSG_RX_RCV;
    tx->up = true;
}

/* Answer what the receiver consumed; retire the writes it passed. */
static void tx_poll(mc_engine_t *e, rdma_msg_tx_t *tx)
{
    uint64_t tail = atomic_load_explicit(tx->cell, memory_order_acquire);
    bool room = false;

    if (tail > tx->posted) /* never past what was written */
        tail = tx->posted;
    while (tx->imm_n && tx->imm_end[tx->imm_first] <= tail) {
        tx->imm_first = (tx->imm_first + 1) % MC_RDMA_MSG_RX_RCV;
        tx->imm_n--;
        room = true;
    }
    room |= mc__ring_fifo_answer(e, tx->peer, &tx->fifo, tail) > 0;
    if (room && !mc_list_empty(&tx->peer->msgq))
        mc__peer_activate(e, tx->peer);
}

bool mc__rdma_msg_open(mc_engine_t *e, mc_peer_t *p)
{
    rdma_peer_t *rp = rdma_peer(p);
    uint64_t now = mc__now_ns();

    if (!rp || rp->msg_off)
        return false;
    if (rp->msg_qp)
        return rp->msg_qp->state == QP_READY && rp->msg_qp->mtx->up;
    /* None yet: set one up; once it is ready, messages routed from then on may take it. */
    for (unsigned i = 0; i < rp->n_rails; i++) {
        rdma_rail_t *r = &rp->rails[i];
        if (!r->qp && mc__rail_usable(&r->base, now) && now >= r->base.next_connect_ns) {
            mc__rdma_rail_connect(e, p, r);
            break;
        }
    }
    return false;
}

void mc__rdma_msg_fill(mc_engine_t *e, mc_peer_t *p)
{
    rdma_peer_t *rp = rdma_peer(p);
    mc_rdma_qp_t *qp = rp ? rp->msg_qp : NULL;
    rdma_msg_tx_t *tx = qp ? qp->mtx : NULL;
    uint64_t start, from, len, first;
    mc_msg_t *m;

    if (!tx || !tx->up || qp->state != QP_READY)
        return;
    tx_poll(e, tx);
    if (tx->imm_n >= tx->credits || tx->wr_out + 2 > MC_RDMA_MSG_SQ ||
        qp->dev->cq_used + 2 > qp->dev->cq_size)
        return; /* a completion (or the next pass) resumes */
    uint64_t tail = atomic_load_explicit(tx->cell, memory_order_acquire);
    tail = tail < tx->posted ? tail : tx->posted;
    start = tx->head;
    while (tx->fifo.n < FIFO_CAP && (m = mc__msg_peek(p, mc__rdma_slot))) {
        if (mc__ring_put(tx->area, RING_BYTES, &tx->head, tail, m))
            break; /* full: the receiver's update resumes */
        m = mc__msg_take(e, p, mc__rdma_slot);
        mc__ring_fifo_push(&tx->fifo, m, tx->head);
    }
    if (tx->head == start)
        return;
    /* [posted, head) of the ring, in one piece or two when it wraps; the last one wakes. */
    from = tx->posted % RING_BYTES;
    len = tx->head - tx->posted;
    first = from + len > RING_BYTES ? RING_BYTES - from : len;
    int rc = 0;
    if (first < len) {
        rc = post_write(qp, tx->mr, tx->area + from, (uint32_t)first, tx->raddr + from, tx->rkey,
                        false, 0);
        tx->wr_out += !rc;
        from = 0;
        len -= first;
    }
    if (!rc)
        rc = post_write(qp, tx->mr, tx->area + from, (uint32_t)len, tx->raddr + from, tx->rkey,
                        true, (uint32_t)tx->head);
    if (rc) {
        msg_qp_failed(e, qp); /* hands them back */
        return;
    }
    tx->wr_out++;
    tx->posted = tx->head;
    tx->imm_end[(tx->imm_first + tx->imm_n++) % MC_RDMA_MSG_RX_RCV] = tx->head;
}

bool mc__rdma_msg_tx_idle(const mc_rdma_qp_t *qp)
{
    const rdma_msg_tx_t *tx = qp->mtx;

    return !tx || !tx->peer || (!tx->fifo.n && !tx->wr_out);
}

void mc__rdma_msg_settle(mc_engine_t *e, mc_peer_t *p)
{
    rdma_peer_t *rp = rdma_peer(p);

    if (rp && rp->msg_qp && rp->msg_qp->mtx->up)
        tx_poll(e, rp->msg_qp->mtx);
}

/* ---- receiver ---- */

int mc__rdma_msg_rx_create(mc_engine_t *e, mc_rdma_qp_t *qp, const mc_link_t *l,
                           const mc_qp_info_t *in, mc_qp_info_t *out)
{
    rdma_msg_rx_t *rx;
    int rc = cq_room(qp, MC_RDMA_MSG_RX_RCV);

    if (rc)
        return rc;
    rx = calloc(1, sizeof(*rx));
    if (!rx || !(rx->area = area_alloc(RING_BYTES + sizeof(uint64_t)))) {
        free(rx);
        return mc__set_error(-ENOMEM, "out of memory");
    }
    rx->qp = qp;
    rx->lend.slot = mc__rdma_slot;
    qp->mrx = rx;
    mc_list_init(&rx->link);
    if (!(rx->mr = area_reg(qp, rx->area, RING_BYTES + sizeof(uint64_t))))
        return -EIO; /* the QP is dropped; mc__rdma_msg_free takes rx */
    rc = post_recvs(qp, MC_RDMA_MSG_RX_RCV);
    if (rc)
        return rc;
    rx->stream = in->msg_arg;
    rx->cell = in->msg_addr;
    rx->cell_rkey = in->msg_rkey;
    snprintf(rx->sender, sizeof(rx->sender), "%s", l->remote ? l->remote : "");
    mc_list_push_back(&rdma_of(e)->msg_rx, &rx->link);
    out->msg = true;
    out->msg_addr = (uintptr_t)rx->area;
    out->msg_rkey = rx->mr->rkey;
    out->msg_arg = RING_BYTES | (uint64_t)MC_RDMA_MSG_RX_RCV << 32;
    return 0;
}

/* Tell the sender how far we consumed, records still lent excepted (the latest value, if an
 * update may go now). */
static void rx_update(mc_engine_t *e, rdma_msg_rx_t *rx)
{
    mc_rdma_qp_t *qp = rx->qp;
    uint64_t *src = (uint64_t *)(void *)(rx->area + RING_BYTES);
    uint64_t given = mc__ring_given(&rx->lend, rx->tail);

    if (given == rx->tail_sent || rx->upd_out >= MC_RDMA_MSG_UPD ||
        qp->dev->cq_used >= qp->dev->cq_size)
        return; /* an update's completion (or the next pass, or the reap) sends it */
    *src = given;
    if (post_write(qp, rx->mr, (uint8_t *)src, sizeof(*src), rx->cell, rx->cell_rkey, true,
                   (uint32_t)given)) {
        msg_qp_failed(e, qp);
        return;
    }
    rx->tail_sent = given;
    rx->upd_out++;
}

/* Take what the ring holds; a corrupt ring closes the QP (the sender hands its messages to
 * the control link). */
static void rx_poll(mc_engine_t *e, rdma_msg_rx_t *rx)
{
    if (mc__ring_take(e, mc__rdma_slot, rx->area, RING_BYTES, rx->head, &rx->tail, rx->sender,
                      rx->stream, RX_BUDGET, &rx->blocked,
                      e->pass_callbacks || e->cfg.msg_ack_after_handler ? &rx->lend : NULL)) {
        mc__set_error(-MC_EPROTO, "the message ring from %s is corrupt", rx->sender);
        msg_qp_failed(e, rx->qp);
        return;
    }
    rx_update(e, rx);
}

/* A write with immediate arrived: the ring is written up to the head whose low bits it holds. */
static void rx_written(mc_engine_t *e, rdma_msg_rx_t *rx, const struct ibv_wc *wc)
{
    uint32_t imm = ntohl(wc->imm_data);
    uint64_t head = rx->head + (uint32_t)(imm - (uint32_t)rx->head);

    if (!(wc->wc_flags & IBV_WC_WITH_IMM) || head - rx->tail > RING_BYTES) {
        mc__set_error(-MC_EPROTO, "a message from %s that is not a ring write", rx->sender);
        msg_qp_failed(e, rx->qp);
        return;
    }
    rx->head = head;
    rx_poll(e, rx);
}

void mc__rdma_msg_progress(mc_engine_t *e)
{
    mc_list_t *pos, *tmp;

    mc_list_for_each_safe(pos, tmp, &rdma_of(e)->msg_rx)
    {
        rdma_msg_rx_t *rx = mc_container_of(pos, rdma_msg_rx_t, link);
        if (rx->head != rx->tail)
            rx_poll(e, rx);
        else /* an update the CQ had no room for */
            rx_update(e, rx);
    }
}

/* Handlers ran: their records go back to the senders; rings whose QP went are freed once
 * nothing of them is lent (all: at the end, after every QP, whatever they lent); one whose QP
 * still drains is freed with it (mc__rdma_msg_free). */
void mc__rdma_msg_reap(mc_engine_t *e, bool all)
{
    mc_list_t *pos, *tmp;

    if (!all) /* (at the end there is no QP left to tell) */
        mc_list_for_each_safe(pos, tmp, &rdma_of(e)->msg_rx)
            rx_update(e, mc_container_of(pos, rdma_msg_rx_t, link));
    mc_list_for_each_safe(pos, tmp, &rdma_of(e)->msg_rx_lent)
    {
        rdma_msg_rx_t *rx = mc_container_of(pos, rdma_msg_rx_t, link);
        if (!rx->qp && (all || !rx->lend.n)) { /* (one whose QP outlived the end: with it) */
            mc_list_del(&rx->link);
            free(rx->area);
            free(rx);
        }
    }
}

bool mc__rdma_msg_lending(mc_engine_t *e, uint64_t stream)
{
    return MC_RING_LENDS(&rdma_of(e)->msg_rx, rdma_msg_rx_t, stream) ||
           MC_RING_LENDS(&rdma_of(e)->msg_rx_lent, rdma_msg_rx_t, stream);
}

bool mc__rdma_msg_idle(mc_engine_t *e)
{
    mc_list_t *pos;

    for (pos = rdma_of(e)->msg_rx.next; pos != &rdma_of(e)->msg_rx; pos = pos->next) {
        rdma_msg_rx_t *rx = mc_container_of(pos, rdma_msg_rx_t, link);
        if (rx->head != rx->tail && !rx->blocked)
            return true;
    }
    return false;
}

/* ---- both ---- */

void mc__rdma_msg_complete(mc_engine_t *e, mc_rdma_dev_t *dev, const struct ibv_wc *wc)
{
    mc_rdma_qp_t *qp = (mc_rdma_qp_t *)(uintptr_t)(wc->wr_id & ~(uint64_t)MC_RDMA_WR_KIND);
    unsigned kind = (unsigned)(wc->wr_id & MC_RDMA_WR_KIND);

    qp->msg_out--;
    dev->cq_used--;
    if (qp->state == QP_DRAINING) { /* flushed, or done before the QP went: nothing to do */
        if (!mc__rdma_qp_busy(qp))
            mc__rdma_qp_destroy(e, qp);
        return;
    }
    if (wc->status != IBV_WC_SUCCESS) {
        mc__set_error(-MC_EPEERDEAD, "%s", ibv_wc_status_str(wc->status));
        msg_qp_failed(e, qp);
        return;
    }
    if (kind == MC_RDMA_WR_MSG_RECV && post_recvs(qp, 1)) {
        msg_qp_failed(e, qp);
        return;
    }
    if (qp->mtx) { /* initiator: our writes, and updates from the receiver */
        rdma_msg_tx_t *tx = qp->mtx;
        if (!tx->peer)
            return;
        if (kind == MC_RDMA_WR_MSG_SEND)
            tx->wr_out--;
        tx_poll(e, tx);
        if (!mc_list_empty(&tx->peer->msgq))
            mc__peer_activate(e, tx->peer);
    } else if (qp->mrx) { /* target: the sender's writes, and our updates */
        if (kind == MC_RDMA_WR_MSG_RECV) {
            rx_written(e, qp->mrx, wc);
        } else {
            qp->mrx->upd_out--;
            rx_update(e, qp->mrx);
        }
    }
}

void mc__rdma_msg_stop(mc_engine_t *e, mc_rdma_qp_t *qp)
{
    rdma_msg_tx_t *tx = qp->mtx;

    if (qp->mrx) { /* it receives no more; one that lends stays known (msg_lending) */
        mc_list_del(&qp->mrx->link);
        if (qp->mrx->lend.n)
            mc_list_push_back(&rdma_of(e)->msg_rx_lent, &qp->mrx->link);
    }
    if (!tx || !tx->peer)
        return;
    mc_peer_t *p = tx->peer;
    rdma_peer_t *rp = rdma_peer(p);
    if (tx->up)
        tx_poll(e, tx);
    mc__ring_fifo_free(e, &tx->fifo); /* the rest is sent again from p's queue */
    tx->peer = NULL;
    tx->up = false;
    if (rp && rp->msg_qp == qp)
        rp->msg_qp = NULL;
    if (p->msg_tp == mc__rdma_slot) {
        mc_info("rdma: the message QP to %s went: its messages go over %s", p->name,
                mc__transports[e->ctrl]->name);
        mc__msg_link_lost(e, p, mc__rdma_slot);
        p->msg_tp = (uint8_t)e->ctrl;
        mc__peer_activate(e, p);
    }
}

void mc__rdma_msg_free(mc_engine_t *e, mc_rdma_qp_t *qp)
{
    if (qp->mtx) {
        if (qp->mtx->mr)
            ibv_dereg_mr(qp->mtx->mr);
        mc__ring_fifo_free(e, &qp->mtx->fifo);
        free(qp->mtx->area);
        free(qp->mtx);
        qp->mtx = NULL;
    }
    if (qp->mrx) {
        rdma_msg_rx_t *rx = qp->mrx;
        if (rx->mr)
            ibv_dereg_mr(rx->mr);
        qp->mrx = NULL;
        rx->qp = NULL;
        mc_list_del(&rx->link);
        if (rx->lend.n) { /* handlers still read their records there: freed by the reap */
            mc_list_push_back(&rdma_of(e)->msg_rx_lent, &rx->link);
            mc__reap_mark(e, mc__rdma_slot);
            return;
        }
        free(rx->area);
        free(rx);
    }
}
