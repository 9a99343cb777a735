/* RDMA transport: RC queue pairs, rails, and their connection over the engine's tcp link
 * (QP_CONNECT / QP_ACCEPT). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../util/bytes.h"
#include "rdma_int.h"

#define QP_TIMEOUT   14 /* 4.096 us * 2^14 = 67 ms per try */
#define QP_RETRY_CNT 7

static enum ibv_mtu mtu_enum(unsigned bytes)
{
    return bytes >= 4096   ? IBV_MTU_4096
           : bytes >= 2048 ? IBV_MTU_2048
           : bytes >= 1024 ? IBV_MTU_1024
           : bytes >= 512  ? IBV_MTU_512
                           : IBV_MTU_256;
}

mc_rdma_qp_t *mc__rdma_qp_create(mc_engine_t *e, mc_rdma_dev_t *dev, bool initiator, bool msg)
{
    mc_rdma_qp_t *qp = calloc(1, sizeof(*qp));
    unsigned sq = initiator ? rdma_of(e)->qp_depth + MC_RDMA_SQ_SLACK : 1;
    unsigned rq = !msg ? 1 : initiator ? MC_RDMA_MSG_TX_RCV : MC_RDMA_MSG_RX_RCV;
    struct ibv_qp_init_attr ia = {
        .send_cq = dev->cq,
        .recv_cq = dev->cq,
        .cap = {.max_send_wr = sq + (!msg        ? 0
                                     : initiator ? MC_RDMA_MSG_SQ
                                                 : MC_RDMA_MSG_UPD),
                .max_recv_wr = rq,
                .max_send_sge = 1,
                .max_recv_sge = 1},
        .qp_type = IBV_QPT_RC,
    };
    struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT,
                            .port_num = dev->port,
                            .qp_access_flags = IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE |
                                               IBV_ACCESS_LOCAL_WRITE};

    if (!qp) {
        mc__set_error(-ENOMEM, "out of memory");
        return NULL;
    }
    qp->qp = ibv_create_qp(dev->pd, &ia);
    if (!qp->qp) {
        mc__set_error(-errno, "%s: ibv_create_qp: %s", dev->name, strerror(errno));
        free(qp);
        return NULL;
    }
    if (ibv_modify_qp(qp->qp, &a,
                      IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS)) {
        mc__set_error(-errno, "%s: QP to INIT: %s", dev->name, strerror(errno));
        ibv_destroy_qp(qp->qp);
        free(qp);
        return NULL;
    }
    if (initiator)
        rdma_of(e)->n_qps++;
    mc__random_bytes(&qp->psn, sizeof(qp->psn));
    qp->psn &= 0xffffff;
    qp->dev = dev;
    qp->initiator = initiator;
    mc_list_init(&qp->link);
    mc_list_init(&qp->bound.node);
    mc_list_init(&qp->post_link);
    mc_list_init(&qp->posted);
    return qp;
}

void mc__rdma_qp_info(const mc_rdma_qp_t *qp, mc_qp_info_t *q)
{
    memset(q, 0, sizeof(*q));
    q->dev = (uint8_t)qp->dev->index;
    q->link = qp->dev->link;
    q->lid = qp->dev->lid;
    q->mtu = qp->dev->mtu;
    q->qpn = qp->qp->qp_num;
    q->psn = qp->psn;
    q->rd_resp = (uint8_t)qp->dev->rd_resp;
    memcpy(q->gid, qp->dev->gid.raw, 16);
}

/* INIT -> RTR -> RTS towards the remote end. remote->mtu is the MTU both ends use; READs in
 * flight are bounded by what our device may issue and what the remote one takes (a remote NIC
 * answers more with a NAK, which would fail the request). */
int mc__rdma_qp_connect(mc_engine_t *e, mc_rdma_qp_t *qp, const mc_qp_info_t *remote)
{
    mc_rdma_dev_t *d = qp->dev;
    unsigned rd = remote->rd_resp && remote->rd_resp < d->rd_init ? remote->rd_resp : d->rd_init;
    struct ibv_qp_attr a = {
        .qp_state = IBV_QPS_RTR,
        .path_mtu = mtu_enum(remote->mtu),
        .dest_qp_num = remote->qpn,
        .rq_psn = remote->psn,
        .max_dest_rd_atomic = (uint8_t)d->rd_resp,
        .min_rnr_timer = 12,
        .ah_attr = {.dlid = remote->lid, .port_num = d->port},
    };

    (void)e;
    /* RoCE always routes by GID; InfiniBand by LID, with a GRH only when there is no LID. */
    if (d->link == IBV_LINK_LAYER_ETHERNET || remote->lid == 0) {
        a.ah_attr.is_global = 1;
        memcpy(a.ah_attr.grh.dgid.raw, remote->gid, 16);
        a.ah_attr.grh.sgid_index = (uint8_t)d->gid_index;
        a.ah_attr.grh.hop_limit = 64;
    }
    if (ibv_modify_qp(qp->qp, &a,
                      IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                          IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
        return mc__set_error(-errno, "%s: QP %u to RTR: %s", d->name, qp->qp->qp_num,
                             strerror(errno));
    memset(&a, 0, sizeof(a));
    a.qp_state = IBV_QPS_RTS;
    a.timeout = QP_TIMEOUT;
    a.retry_cnt = QP_RETRY_CNT;
    a.rnr_retry = 7;
    a.sq_psn = qp->psn;
    a.max_rd_atomic = (uint8_t)rd;
    if (ibv_modify_qp(qp->qp, &a,
                      IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                          IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC))
        return mc__set_error(-errno, "%s: QP %u to RTS: %s", d->name, qp->qp->qp_num,
                             strerror(errno));
    return 0;
}

void mc__rdma_qp_destroy(mc_engine_t *e, mc_rdma_qp_t *qp)
{
    if (qp->connect_slice) /* the answer, if it comes, finds no QP */
        qp->connect_slice->ctx = NULL;
    mc_list_del(&qp->link);
    mc__link_unbind(&qp->bound);
    mc_list_del(&qp->post_link);
    if (qp->initiator)
        rdma_of(e)->n_qps--;
    /* a draining QP left its rail when it started (which may be gone with its peer since) */
    if (qp->state != QP_DRAINING && qp->rail && qp->rail->qp == qp)
        qp->rail->qp = NULL;
    if (ibv_destroy_qp(qp->qp))
        mc_warn("rdma: destroying QP %u: %s", qp->qp->qp_num, strerror(errno));
    mc__rdma_msg_free(e, qp);
    free(qp);
}

void mc__rdma_qp_drain(mc_engine_t *e, mc_rdma_qp_t *qp)
{
    struct ibv_qp_attr a = {.qp_state = IBV_QPS_ERR};

    if (qp->state != QP_DRAINING) {
        qp->state = QP_DRAINING;
        if (qp->rail && qp->rail->qp == qp) {
            qp->rail->qp = NULL; /* the rail may get a new QP meanwhile */
            qp->rail->base.n_conns = 0;
        }
        mc__link_unbind(&qp->bound); /* its link is idle once no QP of ours needs it */
        if (qp->connect_slice) {
            qp->connect_slice->ctx = NULL; /* its answer, if it comes, finds no QP */
            qp->connect_slice = NULL;
        }
        mc__rdma_msg_stop(e, qp);
        if (mc_list_empty(&qp->link)) /* a target's, or ours not sent yet: collected too */
            mc_list_push_back(&rdma_of(e)->qps, &qp->link);
        if (mc__rdma_qp_busy(qp) && ibv_modify_qp(qp->qp, &a, IBV_QP_STATE))
            mc_warn("rdma: QP %u to ERR: %s", qp->qp->qp_num, strerror(errno));
    }
    if (qp->dev->fatal) /* its device completes nothing: what it posted never ends */
        qp->msg_out = 0;
    if (!mc__rdma_qp_busy(qp))
        mc__rdma_qp_destroy(e, qp);
}

/* ---- the set-up exchange ----
 *   0 u8 dev   1 u8 peer_dev   2 u8 link   3 u8 0   4 u16 lid   6 u16 mtu
 *   8 u32 qpn 12 u32 psn      16 gid[16]            (little-endian)
 * and, when messages go over the QP (MC_QP_INFO_MSG_LEN bytes):
 *  32 u64 msg_addr   40 u32 msg_rkey   44 u64 msg_arg */

size_t mc__rdma_qp_info_encode(const mc_qp_info_t *q, uint8_t out[MC_QP_INFO_MSG_LEN])
{
    memset(out, 0, MC_QP_INFO_MSG_LEN);
    out[0] = q->dev;
    out[1] = q->peer_dev;
    out[2] = q->link;
    out[3] = q->rd_resp;
    mc__put16(out + 4, q->lid);
    mc__put16(out + 6, q->mtu);
    mc__put32(out + 8, q->qpn);
    mc__put32(out + 12, q->psn);
    memcpy(out + 16, q->gid, 16);
    if (!q->msg)
        return MC_QP_INFO_LEN;
    mc__put64(out + 32, q->msg_addr);
    mc__put32(out + 40, q->msg_rkey);
    mc__put64(out + 44, q->msg_arg);
    return MC_QP_INFO_MSG_LEN;
}

int mc__rdma_qp_info_decode(const uint8_t *in, size_t len, mc_qp_info_t *q)
{
    if (len != MC_QP_INFO_LEN && len != MC_QP_INFO_MSG_LEN)
        return mc__set_error(-MC_EPROTO, "QP info of %zu bytes, expected %d or %d", len,
                             MC_QP_INFO_LEN, MC_QP_INFO_MSG_LEN);
    memset(q, 0, sizeof(*q));
    q->dev = in[0];
    q->peer_dev = in[1];
    q->link = in[2];
    q->rd_resp = in[3];
    q->lid = mc__get16(in + 4);
    q->mtu = mc__get16(in + 6);
    q->qpn = mc__get32(in + 8);
    q->psn = mc__get32(in + 12);
    memcpy(q->gid, in + 16, 16);
    if (len == MC_QP_INFO_MSG_LEN) {
        q->msg = true;
        q->msg_addr = mc__get64(in + 32);
        q->msg_rkey = mc__get32(in + 40);
        q->msg_arg = mc__get64(in + 44);
    }
    if (q->qpn > 0xffffff || q->psn > 0xffffff || q->mtu < 256 || q->mtu > 4096 ||
        (q->mtu & (q->mtu - 1)))
        return mc__set_error(-MC_EPROTO, "QP info out of range (qpn %u, psn %u, mtu %u)", q->qpn,
                             q->psn, q->mtu);
    return 0;
}

/* ---- rails ---- */

static bool diagonal(unsigned i, unsigned j, unsigned n, unsigned m)
{
    return j == i % m || i == j % n;
}

/* Device pairs on a common link layer: the same-index pairs first (rail-optimised fabrics wire
 * NIC i of every host to the same switch), then the crossed ones, up to MC_MAX_RAILS. Built
 * once: devices a peer adds later are used after it is reopened. */
void mc__rdma_rails_build(mc_engine_t *e, mc_peer_t *p)
{
    const rdma_desc_t *d = p->desc.tp[mc__rdma_slot];
    mc_rdma_t *r = rdma_of(e);
    rdma_peer_t *rp = rdma_peer(p);
    unsigned n = 0;

    if (rp->n_rails || !d)
        return;
    for (unsigned pass = 0; pass < 2; pass++) {
        for (unsigned i = 0; i < r->n_devs; i++) {
            for (unsigned j = 0; j < d->n && n < MC_MAX_RAILS; j++) {
                rdma_rail_t *rl = &rp->rails[n];
                if (diagonal(i, j, r->n_devs, d->n) != (pass == 0) ||
                    r->devs[i].link != d->devs[j].link)
                    continue;
                char name[sizeof(rl->base.name)]; /* via a local: gcc cannot tell the two apart */
                memset(rl, 0, sizeof(*rl));
                rl->ldev = (uint8_t)i;
                rl->rdev = (uint8_t)j;
                rl->crossed = pass == 1;
                snprintf(rl->base.dev, sizeof(rl->base.dev), "%s", r->devs[i].name);
                snprintf(name, sizeof(name), "%s->%s", r->devs[i].name, d->devs[j].name);
                memcpy(rl->base.name, name, sizeof(name));
                n++;
            }
        }
    }
    rp->n_rails = n;
    p->rails[mc__rdma_slot].n = n;
    for (unsigned i = 0; i < n; i++)
        p->rails[mc__rdma_slot].v[i] = &rp->rails[i].base;
}

/* Close one idle initiator QP of another peer to stay under MC_RDMA_MAX_QPS (a peer never
 * takes its own: it would tear down the QP it is about to use for a spare rail). */
static bool evict_idle_qp(mc_engine_t *e, const mc_peer_t *p)
{
    mc_list_t *pos;

    for (pos = rdma_of(e)->qps.next; pos != &rdma_of(e)->qps; pos = pos->next) {
        mc_rdma_qp_t *qp = mc_container_of(pos, mc_rdma_qp_t, link);
        if (qp->state == QP_READY && !qp->outstanding && mc__rdma_msg_tx_idle(qp) &&
            qp->peer != p) { /* its messages, if it carries them, go back to the control link */
            mc__rdma_qp_drain(e, qp);
            return true;
        }
    }
    return false;
}

void mc__rdma_rail_connect(mc_engine_t *e, mc_peer_t *p, rdma_rail_t *r)
{
    mc_rdma_t *rd = rdma_of(e);
    rdma_peer_t *rp = rdma_peer(p);
    bool msg = !rp->msg_qp && !rp->msg_off; /* the first QP to p carries our messages */
    mc_qp_info_t info;
    mc_link_t *link;
    mc_slice_t *s;
    uint8_t *buf;

    if (rd->devs[r->ldev].port_down) { /* counts as a failed connect: backs off, pauses */
        mc__rdma_rail_failed(p, r, true);
        return;
    }
    if (!mc__ctrl_ready(e, p)) /* called again once a control link is ready */
        return;
    if (rd->n_qps >= rd->max_qps && !evict_idle_qp(e, p))
        return;
    mc_rdma_qp_t *qp = mc__rdma_qp_create(e, &rd->devs[r->ldev], true, msg);
    s = qp ? mc__slice_alloc(e) : NULL;
    buf = s ? malloc(MC_QP_INFO_MSG_LEN) : NULL;
    if (!buf) {
        mc_warn("rail %s: %s", r->base.name, qp ? "out of memory" : mc_last_error());
        if (s)
            mc__slice_free(e, s);
        if (qp)
            mc__rdma_qp_destroy(e, qp);
        mc__rdma_rail_failed(p, r, true);
        return;
    }
    mc__rdma_qp_info(qp, &info);
    info.peer_dev = r->rdev;
    if (msg && mc__rdma_msg_tx_create(e, qp, p, &info))
        mc_info("rail %s: messages stay on the control link: %s", r->base.name, mc_last_error());
    s->kind = MC_SL_CTRL;
    s->tp = (uint8_t)mc__rdma_slot;
    s->ctx = qp;
    s->payload = buf;
    s->payload_len = mc__rdma_qp_info_encode(&info, buf);
    s->payload_owned = true;
    qp->peer = p;
    qp->rail = r;
    if (mc__ctrl_request(e, p, s, &link)) { /* cannot happen right after ctrl_ready */
        mc__slice_free(e, s);
        mc__rdma_qp_drain(e, qp);
        mc__rdma_rail_failed(p, r, true);
        return;
    }
    qp->state = QP_CONNECTING;
    qp->connect_slice = s;
    r->qp = qp;
    if (info.msg) /* its message part was set up */
        rp->msg_qp = qp;
    mc_list_push_back(&rd->qps, &qp->link);
    mc__link_bind(link, &qp->bound, mc__rdma_slot);
}

/* The target's answer to our QP set-up request. */
void mc__rdma_ctrl_reply(mc_engine_t *e, mc_slice_t *s, mc_link_t *l, int status,
                         const void *payload, size_t len)
{
    mc_rdma_qp_t *qp = s->ctx;
    rdma_rail_t *r = qp->rail;
    mc_qp_info_t remote;
    int rc = status;

    (void)l;
    qp->connect_slice = NULL;
    if (qp->state != QP_CONNECTING)
        return;
    if (rc)
        mc__set_error(rc, "refused: %.*s", (int)len, (const char *)payload);
    else if (!(rc = mc__rdma_qp_info_decode(payload, len, &remote)) && remote.dev != r->rdev)
        rc = mc__set_error(-MC_EPROTO, "answered for device %u, asked %u", remote.dev, r->rdev);
    if (!rc)
        rc = mc__rdma_qp_connect(e, qp, &remote);
    if (rc) {
        mc_warn("rail %s to %s: %s", r->base.name, qp->peer->name, mc_last_error());
        mc__rdma_rail_failed(qp->peer, r, true);
        mc__peer_activate(e, qp->peer);
        mc__rdma_qp_drain(e, qp);
        return;
    }
    qp->state = QP_READY;
    mc__rdma_msg_tx_ready(e, qp, &remote);
    r->base.n_conns = 1;
    mc__rail_ready(&r->base);
    if (atomic_exchange(&rdma_peer(qp->peer)->down_until, 0))
        mc_info("rdma: rail %s to %s is up: its transfers go over rdma again", r->base.name,
                qp->peer->name);
    mc__peer_activate(e, qp->peer);
}

/* ---- target side ---- */

/* Count the QPs set up over l, destroying the one an initiator re-probing `pair` left behind. */
static unsigned count_qps(mc_engine_t *e, mc_link_t *l, uint16_t pair)
{
    mc_list_t *pos, *tmp;
    unsigned n = 0;

    mc_list_for_each_safe(pos, tmp, &l->bound)
    {
        mc_link_bound_t *b = mc_container_of(pos, mc_link_bound_t, node);
        mc_rdma_qp_t *qp = mc_container_of(b, mc_rdma_qp_t, bound);
        if (b->tp != mc__rdma_slot || qp->initiator)
            continue;
        if (qp->pair == pair)
            mc__rdma_qp_drain(e, qp);
        else
            n++;
    }
    return n;
}

int mc__rdma_ctrl_recv(mc_engine_t *e, mc_link_t *l, const void *req, size_t len, void *ans,
                       size_t *ans_len)
{
    mc_rdma_t *rd = rdma_of(e);
    mc_qp_info_t in, out;
    mc_rdma_dev_t *d;
    int rc = mc__rdma_qp_info_decode(req, len, &in);

    if (rc)
        return rc;
    if (in.peer_dev >= rd->n_devs)
        return mc__set_error(-MC_ENODEV, "%s has no RDMA device %u", e->name, in.peer_dev);
    d = &rd->devs[in.peer_dev];
    if (d->fatal)
        return mc__set_error(-MC_ENODEV, "%s is dead (a catastrophic error)", d->name);
    if (d->link != in.link)
        return mc__set_error(-MC_ENODEV, "%s is not on the link layer of the initiator", d->name);
    uint16_t pair = (uint16_t)(in.dev << 8 | in.peer_dev);
    if (count_qps(e, l, pair) >= MC_RDMA_INBOUND_QP)
        return mc__set_error(-ENOSPC, "at most %d QPs per connection", MC_RDMA_INBOUND_QP);
    mc_rdma_qp_t *qp = mc__rdma_qp_create(e, d, false, in.msg);
    if (!qp)
        return -EIO;
    mc__rdma_qp_info(qp, &out);
    if (in.msg && mc__rdma_msg_rx_create(e, qp, l, &in, &out)) /* then only data */
        mc_info("rdma: no message ring for %s: %s", l->remote ? l->remote : "?", mc_last_error());
    in.mtu = in.mtu < d->mtu ? in.mtu : d->mtu;
    rc = mc__rdma_qp_connect(e, qp, &in);
    if (rc) {
        mc__rdma_qp_drain(e, qp);
        return rc;
    }
    qp->state = QP_READY;
    qp->pair = pair;
    mc__link_bind(l, &qp->bound, mc__rdma_slot);
    out.peer_dev = in.dev;
    out.mtu = in.mtu;
    *ans_len = mc__rdma_qp_info_encode(&out, ans);
    return 0;
}

/* The control link a QP was set up over is gone: it drains (our requests are retried
 * elsewhere). */
void mc__rdma_link_lost(mc_engine_t *e, mc_link_bound_t *b)
{
    mc_rdma_qp_t *qp = mc_container_of(b, mc_rdma_qp_t, bound);

    mc__rdma_qp_drain(e, qp); /* a target's without receives goes at once */
}
