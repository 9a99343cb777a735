/* softverbs: queue pairs (RC only): creation, the state machine, posting and flushing. */
#include "sv_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static uint32_t sv_pow2(uint32_t n)
{
    uint32_t p = 1;

    while (p < n)
        p <<= 1;
    return p;
}

/* The abstract socket name of a QP: fabric, device GUID and QPN. */
static socklen_t sv_qp_name(struct sockaddr_un *sa, uint64_t guid, uint32_t qpn)
{
    int n;

    memset(sa, 0, sizeof(*sa));
    sa->sun_family = AF_UNIX;
    n = snprintf(sa->sun_path + 1, sizeof(sa->sun_path) - 1, "softverbs/%s/%016llx/%06x",
                 sv_fabric(), (unsigned long long)guid, qpn);
    return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)n);
}

/* Binds the socket to a free QPN; the bind is what makes QPNs unique on the machine. */
static int sv_qp_bind(struct sv_context *ctx, int fd, uint32_t *qpn_p)
{
    static unsigned int seq;
    struct sockaddr_un sa;
    uint32_t qpn;
    socklen_t len;
    int i;

    for (i = 0; i < 256; i++) {
        qpn = ((uint32_t)getpid() * 2654435761u + __atomic_fetch_add(&seq, 7919, 0)) & 0xffffff;
        if (qpn < 2)
            continue;
        len = sv_qp_name(&sa, ctx->dev->guid, qpn);
        if (bind(fd, (struct sockaddr *)&sa, len) == 0) {
            *qpn_p = qpn;
            return 0;
        }
        if (errno != EADDRINUSE)
            return errno;
    }
    return EADDRINUSE;
}

static int sv_qp_check_cap(struct ibv_qp_init_attr *init)
{
    struct ibv_qp_cap *c = &init->cap;

    if (init->qp_type != IBV_QPT_RC && init->qp_type != IBV_QPT_UC) {
        fprintf(stderr, "softverbs: only RC and UC QPs are implemented\n");
        return EOPNOTSUPP;
    }
    if (!init->send_cq || !init->recv_cq || c->max_send_wr > SV_MAX_WR ||
        c->max_recv_wr > SV_MAX_WR || c->max_send_sge > SV_MAX_SGE ||
        c->max_recv_sge > SV_MAX_SGE || c->max_inline_data > SV_MAX_INLINE)
        return EINVAL;
    return 0;
}

static int sv_qp_socket(struct sv_context *ctx, struct sv_qp *qp)
{
    int sz = 4 << 20;
    int err;

    qp->fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (qp->fd < 0)
        return errno;
    /* Room for a window of chunks; SO_SNDBUFFORCE works as root, SO_SNDBUF is capped. */
    if (setsockopt(qp->fd, SOL_SOCKET, SO_SNDBUFFORCE, &sz, sizeof(sz)) != 0)
        setsockopt(qp->fd, SOL_SOCKET, SO_SNDBUF, &sz, sizeof(sz));
    err = sv_qp_bind(ctx, qp->fd, &qp->ibqp.qp_num);
    if (err) {
        close(qp->fd);
        return err;
    }
    return 0;
}

SV_EXPORT struct ibv_qp *ibv_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *init)
{
    struct sv_context *ctx = sv_ctx(pd->context);
    struct sv_qp *qp;
    int err;

    err = sv_qp_check_cap(init);
    if (err)
        goto err;
    err = ENOMEM;
    qp = calloc(1, sizeof(*qp));
    if (!qp)
        goto err;
    qp->sq_size = sv_pow2(init->cap.max_send_wr ? init->cap.max_send_wr : 1);
    qp->rq_size = sv_pow2(init->cap.max_recv_wr ? init->cap.max_recv_wr : 1);
    qp->sq = calloc(qp->sq_size, sizeof(*qp->sq));
    qp->rq = calloc(qp->rq_size, sizeof(*qp->rq));
    if (!qp->sq || !qp->rq)
        goto err_free_qp;
    err = sv_qp_socket(ctx, qp);
    if (err)
        goto err_free_qp;
    init->cap.max_send_wr = qp->sq_size;
    init->cap.max_recv_wr = qp->rq_size;
    init->cap.max_inline_data = SV_MAX_INLINE;
    qp->cap = init->cap;
    qp->sq_sig_all = init->sq_sig_all != 0;
    qp->ibqp.context = pd->context;
    qp->ibqp.qp_context = init->qp_context;
    qp->ibqp.pd = pd;
    qp->ibqp.send_cq = init->send_cq;
    qp->ibqp.recv_cq = init->recv_cq;
    qp->ibqp.srq = init->srq;
    qp->ibqp.qp_type = init->qp_type;
    qp->ibqp.state = IBV_QPS_RESET;
    qp->attr.qp_state = IBV_QPS_RESET;
    pthread_mutex_init(&qp->ibqp.mutex, NULL);
    pthread_cond_init(&qp->ibqp.cond, NULL);
    pthread_mutex_lock(&ctx->lock);
    err = sv_qp_watch(qp, false);
    if (err) {
        pthread_mutex_unlock(&ctx->lock);
        goto err_close_fd;
    }
    qp->next = ctx->qps;
    ctx->qps = qp;
    pthread_mutex_unlock(&ctx->lock);
    return &qp->ibqp;

err_close_fd:
    close(qp->fd);
err_free_qp:
    free(qp->sq);
    free(qp->rq);
    free(qp);
err:
    errno = err;
    return NULL;
}

struct sv_qp *sv_qp_find(struct sv_context *ctx, uint32_t qpn)
{
    struct sv_qp *qp;

    for (qp = ctx->qps; qp; qp = qp->next)
        if (qp->ibqp.qp_num == qpn)
            return qp;
    return NULL;
}

SV_EXPORT int ibv_destroy_qp(struct ibv_qp *ibqp)
{
    struct sv_context *ctx = sv_ctx(ibqp->context);
    struct sv_qp *qp = sv_qp(ibqp), **pp;

    pthread_mutex_lock(&ctx->lock);
    for (pp = &ctx->qps; *pp && *pp != qp; pp = &(*pp)->next)
        ;
    if (*pp)
        *pp = qp->next;
    sv_qp_unwatch(qp);
    sv_fault_drop_delayed(ctx, ibqp->qp_num);
    close(qp->fd);
    pthread_mutex_unlock(&ctx->lock);
    free(qp->sq);
    free(qp->rq);
    free(qp);
    return 0;
}

SV_EXPORT int ibv_query_qp(struct ibv_qp *ibqp, struct ibv_qp_attr *attr, int attr_mask,
                           struct ibv_qp_init_attr *init)
{
    struct sv_context *ctx = sv_ctx(ibqp->context);
    struct sv_qp *qp = sv_qp(ibqp);

    (void)attr_mask; /* everything is returned */
    pthread_mutex_lock(&ctx->lock);
    *attr = qp->attr;
    attr->cur_qp_state = qp->attr.qp_state;
    attr->cap = qp->cap;
    memset(init, 0, sizeof(*init));
    init->qp_context = ibqp->qp_context;
    init->send_cq = ibqp->send_cq;
    init->recv_cq = ibqp->recv_cq;
    init->srq = ibqp->srq;
    init->cap = qp->cap;
    init->qp_type = ibqp->qp_type;
    init->sq_sig_all = qp->sq_sig_all;
    pthread_mutex_unlock(&ctx->lock);
    return 0;
}

void sv_send_completion(struct sv_qp *qp, struct sv_swqe *w, enum ibv_wc_status status)
{
    struct ibv_wc wc = {0};

    if (status == IBV_WC_SUCCESS && !qp->sq_sig_all && !(w->flags & IBV_SEND_SIGNALED))
        return;
    wc.wr_id = w->wr_id;
    wc.status = status;
    wc.qp_num = qp->ibqp.qp_num;
    wc.byte_len = (uint32_t)w->len;
    switch (w->opcode) {
    case IBV_WR_RDMA_WRITE:
    case IBV_WR_RDMA_WRITE_WITH_IMM:
        wc.opcode = IBV_WC_RDMA_WRITE;
        break;
    case IBV_WR_RDMA_READ:
        wc.opcode = IBV_WC_RDMA_READ;
        break;
    default:
        wc.opcode = IBV_WC_SEND;
        break;
    }
    sv_cq_push(sv_cq(qp->ibqp.send_cq), &wc);
}

static void sv_recv_flush(struct sv_qp *qp, struct sv_rwqe *r)
{
    struct ibv_wc wc = {0};

    wc.wr_id = r->wr_id;
    wc.status = IBV_WC_WR_FLUSH_ERR;
    wc.opcode = IBV_WC_RECV;
    wc.qp_num = qp->ibqp.qp_num;
    sv_cq_push(sv_cq(qp->ibqp.recv_cq), &wc);
}

/* Moves the QP to ERR and completes every outstanding work request with a flush error. Called
 * with ctx->lock held. */
void sv_qp_flush(struct sv_qp *qp)
{
    bool state_was_active = qp->attr.qp_state != IBV_QPS_ERR && qp->attr.qp_state != IBV_QPS_RESET;

    qp->attr.qp_state = IBV_QPS_ERR;
    qp->ibqp.state = IBV_QPS_ERR;
    while (qp->sq_head != qp->sq_tail)
        sv_send_completion(qp, &qp->sq[qp->sq_head++ & (qp->sq_size - 1)], IBV_WC_WR_FLUSH_ERR);
    if (qp->recv_busy)
        sv_recv_flush(qp, &qp->cur_rwqe);
    while (qp->rq_head != qp->rq_tail)
        sv_recv_flush(qp, &qp->rq[qp->rq_head++ & (qp->rq_size - 1)]);
    /* The SRQ's work requests stay there for the other QPs; tell the owner this QP is done. */
    if (qp->ibqp.srq && state_was_active)
        sv_async_event(sv_ctx(qp->ibqp.context), IBV_EVENT_QP_LAST_WQE_REACHED, &qp->ibqp);
    qp->sq_cur = qp->sq_tail;
    qp->cur_pkt = 0;
    qp->recv_busy = false;
    qp->timer_ns = 0;
    qp->rnr_ns = 0;
}

/* The oldest send work request failed with status: complete it, then flush the rest. */
void sv_qp_fatal(struct sv_qp *qp, enum ibv_wc_status status)
{
    if (qp->sq_head != qp->sq_tail)
        sv_send_completion(qp, &qp->sq[qp->sq_head++ & (qp->sq_size - 1)], status);
    sv_qp_flush(qp);
}

static void sv_qp_reset(struct sv_qp *qp)
{
    struct sockaddr sa = {.sa_family = AF_UNSPEC};

    qp->sq_head = qp->sq_cur = qp->sq_tail = 0;
    qp->rq_head = qp->rq_tail = 0;
    qp->cur_pkt = 0;
    qp->timer_ns = qp->rnr_ns = 0;
    qp->recv_busy = false;
    qp->nak_sent = false;
    if (qp->connected)
        connect(qp->fd, &sa, sizeof(sa));
    qp->connected = false;
    qp->peer_len = 0;
    memset(&qp->attr, 0, sizeof(qp->attr));
}

/* Which attributes each transition of an RC QP requires and allows, as hardware checks them
 * (IB spec table "QP state transition properties"). IBV_QP_STATE is always allowed. A UC QP
 * has the same table without the attributes that only RC has (SV_RC_ONLY). */
#define A(x) IBV_QP_##x
static const struct {
    enum ibv_qp_state cur, next;
    int req, opt;
} sv_trans[] = {
    {IBV_QPS_RESET, IBV_QPS_INIT, A(STATE) | A(PKEY_INDEX) | A(PORT) | A(ACCESS_FLAGS), 0},
    {IBV_QPS_INIT, IBV_QPS_INIT, 0, A(PKEY_INDEX) | A(PORT) | A(ACCESS_FLAGS)},
    {IBV_QPS_INIT, IBV_QPS_RTR,
     A(STATE) | A(AV) | A(PATH_MTU) | A(DEST_QPN) | A(RQ_PSN) | A(MAX_DEST_RD_ATOMIC) |
         A(MIN_RNR_TIMER),
     A(ALT_PATH) | A(ACCESS_FLAGS) | A(PKEY_INDEX)},
    {IBV_QPS_RTR, IBV_QPS_RTS,
     A(STATE) | A(SQ_PSN) | A(TIMEOUT) | A(RETRY_CNT) | A(RNR_RETRY) | A(MAX_QP_RD_ATOMIC),
     A(CUR_STATE) | A(ALT_PATH) | A(ACCESS_FLAGS) | A(MIN_RNR_TIMER) | A(PATH_MIG_STATE)},
    {IBV_QPS_RTS, IBV_QPS_RTS, 0,
     A(CUR_STATE) | A(ACCESS_FLAGS) | A(ALT_PATH) | A(PATH_MIG_STATE) | A(MIN_RNR_TIMER)},
    {IBV_QPS_RTS, IBV_QPS_SQD, A(STATE), A(EN_SQD_ASYNC_NOTIFY)},
    {IBV_QPS_SQE, IBV_QPS_RTS, A(STATE), A(CUR_STATE) | A(ACCESS_FLAGS)},
    {IBV_QPS_SQD, IBV_QPS_RTS, A(STATE),
     A(CUR_STATE) | A(ACCESS_FLAGS) | A(ALT_PATH) | A(PATH_MIG_STATE) | A(MIN_RNR_TIMER)},
    {IBV_QPS_SQD, IBV_QPS_SQD, 0,
     A(AV) | A(TIMEOUT) | A(RETRY_CNT) | A(RNR_RETRY) | A(MAX_QP_RD_ATOMIC) |
         A(MAX_DEST_RD_ATOMIC) | A(ACCESS_FLAGS) | A(PKEY_INDEX) | A(MIN_RNR_TIMER) |
         A(PATH_MIG_STATE) | A(ALT_PATH)},
};

#define SV_RC_ONLY                                                                                 \
    (A(MAX_DEST_RD_ATOMIC) | A(MIN_RNR_TIMER) | A(TIMEOUT) | A(RETRY_CNT) | A(RNR_RETRY) |         \
     A(MAX_QP_RD_ATOMIC))

static bool sv_trans_ok(enum ibv_qp_type type, enum ibv_qp_state cur, enum ibv_qp_state next,
                        int mask)
{
    int strip = type == IBV_QPT_UC ? SV_RC_ONLY : 0;
    int req, opt;
    size_t i;

    if (next == IBV_QPS_RESET || next == IBV_QPS_ERR)
        return (mask & ~(A(STATE) | A(CUR_STATE))) == 0 && (mask & A(STATE));
    for (i = 0; i < sizeof(sv_trans) / sizeof(sv_trans[0]); i++) {
        if (sv_trans[i].cur != cur || sv_trans[i].next != next)
            continue;
        req = sv_trans[i].req & ~strip;
        opt = sv_trans[i].opt & ~strip;
        return (mask & req) == req && (mask & ~(req | opt | A(STATE))) == 0;
    }
    return false;
}

static int sv_check_values(struct sv_qp *qp, const struct ibv_qp_attr *a, int mask)
{
    struct sv_device *dev = sv_ctx(qp->ibqp.context)->dev;

    if ((mask & A(PORT)) && a->port_num != 1)
        return EINVAL;
    if ((mask & A(PKEY_INDEX)) && a->pkey_index != 0)
        return EINVAL;
    if ((mask & A(PATH_MTU)) && (a->path_mtu < IBV_MTU_256 || a->path_mtu > IBV_MTU_4096))
        return EINVAL;
    if ((mask & A(DEST_QPN)) && a->dest_qp_num > SV_PSN_MASK)
        return EINVAL;
    if ((mask & A(MAX_DEST_RD_ATOMIC)) && a->max_dest_rd_atomic > 16)
        return EINVAL;
    if ((mask & A(MAX_QP_RD_ATOMIC)) && a->max_rd_atomic > 16)
        return EINVAL;
    if ((mask & A(TIMEOUT)) && a->timeout > 31)
        return EINVAL;
    if ((mask & A(RETRY_CNT)) && a->retry_cnt > 7)
        return EINVAL;
    if ((mask & A(RNR_RETRY)) && a->rnr_retry > 7)
        return EINVAL;
    if ((mask & A(MIN_RNR_TIMER)) && a->min_rnr_timer > 31)
        return EINVAL;
    if (mask & A(AV)) {
        if (a->ah_attr.port_num != 1 && a->ah_attr.port_num != 0)
            return EINVAL;
        if (dev->link == SV_LINK_ETH && !a->ah_attr.is_global)
            return EINVAL; /* RoCE needs a GRH */
        if (a->ah_attr.is_global && a->ah_attr.grh.sgid_index >= dev->gid_cnt)
            return EINVAL;
    }
    return 0;
}

static void sv_copy_attrs(struct sv_qp *qp, const struct ibv_qp_attr *a, int mask)
{
    struct ibv_qp_attr *q = &qp->attr;

    if (mask & A(PKEY_INDEX))
        q->pkey_index = a->pkey_index;
    if (mask & A(PORT))
        q->port_num = a->port_num;
    if (mask & A(ACCESS_FLAGS))
        q->qp_access_flags = a->qp_access_flags;
    if (mask & A(AV))
        q->ah_attr = a->ah_attr;
    if (mask & A(PATH_MTU))
        q->path_mtu = a->path_mtu;
    if (mask & A(DEST_QPN))
        q->dest_qp_num = a->dest_qp_num;
    if (mask & A(RQ_PSN))
        q->rq_psn = a->rq_psn & SV_PSN_MASK;
    if (mask & A(SQ_PSN))
        q->sq_psn = a->sq_psn & SV_PSN_MASK;
    if (mask & A(MAX_DEST_RD_ATOMIC))
        q->max_dest_rd_atomic = a->max_dest_rd_atomic;
    if (mask & A(MAX_QP_RD_ATOMIC))
        q->max_rd_atomic = a->max_rd_atomic;
    if (mask & A(MIN_RNR_TIMER))
        q->min_rnr_timer = a->min_rnr_timer;
    if (mask & A(TIMEOUT))
        q->timeout = a->timeout;
    if (mask & A(RETRY_CNT))
        q->retry_cnt = a->retry_cnt;
    if (mask & A(RNR_RETRY))
        q->rnr_retry = a->rnr_retry;
    if (mask & A(PATH_MIG_STATE))
        q->path_mig_state = a->path_mig_state;
}

/* Resolves the destination of the address vector to the peer's socket name. A destination
 * that no configured device answers to leaves the QP unreachable: its requests will end with
 * retry-exceeded, as on a fabric without that port. */
static void sv_qp_route(struct sv_qp *qp)
{
    struct sv_device *self = sv_ctx(qp->ibqp.context)->dev;
    struct ibv_ah_attr *ah = &qp->attr.ah_attr;
    struct sv_device *dst;

    if (self->link == SV_LINK_ETH)
        dst = sv_device_by_gid(&ah->grh.dgid);
    else
        dst = sv_device_by_lid(ah->dlid);
    qp->peer_len = dst ? sv_qp_name(&qp->peer, dst->guid, qp->attr.dest_qp_num) : 0;
    qp->connected = false;
}

static void sv_qp_enter(struct sv_qp *qp, enum ibv_qp_state cur, enum ibv_qp_state next)
{
    if (next == IBV_QPS_RESET) {
        sv_qp_reset(qp);
    } else if (next == IBV_QPS_ERR) {
        sv_qp_flush(qp);
    } else if (next == IBV_QPS_RTR && cur == IBV_QPS_INIT) {
        sv_qp_route(qp);
        qp->epsn = qp->attr.rq_psn;
        qp->nak_sent = false;
        qp->uc_drop = false;
    } else if (next == IBV_QPS_RTS && cur == IBV_QPS_RTR) {
        qp->psn_next = qp->psn_una = qp->attr.sq_psn;
        qp->retries_left = qp->attr.retry_cnt;
        qp->rnr_left = qp->attr.rnr_retry;
    }
    qp->attr.qp_state = next;
    qp->ibqp.state = next;
}

SV_EXPORT int ibv_modify_qp(struct ibv_qp *ibqp, struct ibv_qp_attr *attr, int mask)
{
    struct sv_context *ctx = sv_ctx(ibqp->context);
    struct sv_qp *qp = sv_qp(ibqp);
    enum ibv_qp_state cur, next;
    int err;

    pthread_mutex_lock(&ctx->lock);
    cur = qp->attr.qp_state;
    next = (mask & A(STATE)) ? attr->qp_state : cur;
    err = EINVAL;
    if (!sv_trans_ok(ibqp->qp_type, cur, next, mask))
        goto out;
    err = sv_check_values(qp, attr, mask);
    if (err)
        goto out;
    if (next != IBV_QPS_RESET)
        sv_copy_attrs(qp, attr, mask);
    sv_qp_enter(qp, cur, next);
    if (next == IBV_QPS_RTS)
        sv_req_pump(qp);
out:
    pthread_mutex_unlock(&ctx->lock);
    return err;
}
#undef A

static int sv_swqe_fill(struct sv_qp *qp, struct sv_swqe *w, const struct ibv_send_wr *wr)
{
    uint64_t len = 0;
    int i;

    if (wr->num_sge < 0 || (uint32_t)wr->num_sge > qp->cap.max_send_sge)
        return EINVAL;
    switch (wr->opcode) {
    case IBV_WR_SEND:
    case IBV_WR_SEND_WITH_IMM:
    case IBV_WR_RDMA_WRITE:
    case IBV_WR_RDMA_WRITE_WITH_IMM:
        break;
    case IBV_WR_RDMA_READ:
        if (qp->ibqp.qp_type == IBV_QPT_RC)
            break;
        return EINVAL;
    default:
        return EINVAL;
    }
    for (i = 0; i < wr->num_sge; i++)
        len += wr->sg_list[i].length;
    if (len > (1ull << 31))
        return EINVAL;
    w->wr_id = wr->wr_id;
    w->opcode = wr->opcode;
    w->flags = wr->send_flags;
    w->imm = wr->imm_data;
    w->raddr = wr->wr.rdma.remote_addr;
    w->rkey = wr->wr.rdma.rkey;
    w->len = len;
    w->err = IBV_WC_SUCCESS;
    w->npkts = len ? (uint32_t)((len + SV_CHUNK - 1) / SV_CHUNK) : 1;
    w->num_sge = wr->num_sge;
    memcpy(w->sge, wr->sg_list, sizeof(w->sge[0]) * (size_t)wr->num_sge);
    if (!(wr->send_flags & IBV_SEND_INLINE))
        return 0;
    if (wr->opcode == IBV_WR_RDMA_READ || len > SV_MAX_INLINE)
        return EINVAL;
    for (len = 0, i = 0; i < wr->num_sge; i++) {
        memcpy(w->inl + len, (void *)(uintptr_t)wr->sg_list[i].addr, wr->sg_list[i].length);
        len += wr->sg_list[i].length;
    }
    return 0;
}

int sv_post_send(struct ibv_qp *ibqp, struct ibv_send_wr *wr, struct ibv_send_wr **bad_wr)
{
    struct sv_context *ctx = sv_ctx(ibqp->context);
    struct sv_qp *qp = sv_qp(ibqp);
    enum ibv_qp_state st;
    struct sv_swqe *w;
    int err = 0;

    pthread_mutex_lock(&ctx->lock);
    sv_fault_sync(ctx);
    st = qp->attr.qp_state;
    if (st == IBV_QPS_RESET || st == IBV_QPS_INIT || st == IBV_QPS_RTR)
        err = EINVAL;
    for (; wr && !err; wr = wr->next) {
        if (qp->sq_tail - qp->sq_head >= qp->sq_size) {
            err = ENOMEM;
            break;
        }
        w = &qp->sq[qp->sq_tail & (qp->sq_size - 1)];
        err = sv_swqe_fill(qp, w, wr);
        if (err)
            break;
        if (st == IBV_QPS_ERR)
            sv_send_completion(qp, w, IBV_WC_WR_FLUSH_ERR);
        else
            qp->sq_tail++;
    }
    if (err && bad_wr)
        *bad_wr = wr;
    if (qp->attr.qp_state == IBV_QPS_RTS)
        sv_req_pump(qp);
    pthread_mutex_unlock(&ctx->lock);
    return err;
}

int sv_post_recv(struct ibv_qp *ibqp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad_wr)
{
    struct sv_context *ctx = sv_ctx(ibqp->context);
    struct sv_qp *qp = sv_qp(ibqp);
    struct sv_rwqe *r;
    int err = 0;

    pthread_mutex_lock(&ctx->lock);
    if (qp->attr.qp_state == IBV_QPS_RESET || ibqp->srq)
        err = EINVAL;
    for (; wr && !err; wr = wr->next) {
        if (wr->num_sge < 0 || (uint32_t)wr->num_sge > qp->cap.max_recv_sge) {
            err = EINVAL;
            break;
        }
        if (qp->rq_tail - qp->rq_head >= qp->rq_size) {
            err = ENOMEM;
            break;
        }
        r = &qp->rq[qp->rq_tail & (qp->rq_size - 1)];
        r->wr_id = wr->wr_id;
        r->num_sge = wr->num_sge;
        if (wr->num_sge) /* none: a receive for a write with immediate */
            memcpy(r->sge, wr->sg_list, sizeof(r->sge[0]) * (size_t)wr->num_sge);
        if (qp->attr.qp_state == IBV_QPS_ERR)
            sv_recv_flush(qp, r);
        else
            qp->rq_tail++;
    }
    if (err && bad_wr)
        *bad_wr = wr;
    pthread_mutex_unlock(&ctx->lock);
    return err;
}
