/* softverbs: shared receive queues, and taking receive work requests for a QP from its own
 * receive queue or from its SRQ. */
#include "sv_int.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static uint32_t sv_pow2(uint32_t n)
{
    uint32_t p = 1;

    while (p < n)
        p <<= 1;
    return p;
}

SV_EXPORT struct ibv_srq *ibv_create_srq(struct ibv_pd *pd, struct ibv_srq_init_attr *init)
{
    struct ibv_srq_attr *a = &init->attr;
    struct sv_srq *srq;

    if (a->max_wr == 0 || a->max_wr > SV_MAX_WR || a->max_sge > SV_MAX_SGE ||
        a->srq_limit > a->max_wr) {
        errno = EINVAL;
        return NULL;
    }
    srq = calloc(1, sizeof(*srq));
    if (!srq)
        goto err;
    srq->size = sv_pow2(a->max_wr);
    srq->rq = calloc(srq->size, sizeof(*srq->rq));
    if (!srq->rq)
        goto err_free_srq;
    srq->max_sge = a->max_sge ? a->max_sge : 1;
    srq->ibsrq.context = pd->context;
    srq->ibsrq.srq_context = init->srq_context;
    srq->ibsrq.pd = pd;
    pthread_mutex_init(&srq->ibsrq.mutex, NULL);
    pthread_cond_init(&srq->ibsrq.cond, NULL);
    a->max_wr = srq->size;
    a->max_sge = srq->max_sge;
    return &srq->ibsrq;

err_free_srq:
    free(srq);
err:
    errno = ENOMEM;
    return NULL;
}

SV_EXPORT int ibv_modify_srq(struct ibv_srq *ibsrq, struct ibv_srq_attr *attr, int mask)
{
    struct sv_context *ctx = sv_ctx(ibsrq->context);
    struct sv_srq *srq = sv_srq(ibsrq);
    int err = 0;

    if (mask & ~(IBV_SRQ_MAX_WR | IBV_SRQ_LIMIT))
        return EINVAL;
    pthread_mutex_lock(&ctx->lock);
    if ((mask & IBV_SRQ_MAX_WR) && attr->max_wr > srq->size)
        err = EOPNOTSUPP; /* resizing is not implemented; shrinking is a no-op */
    else if ((mask & IBV_SRQ_LIMIT) && attr->srq_limit > srq->size)
        err = EINVAL;
    else if (mask & IBV_SRQ_LIMIT)
        srq->limit = attr->srq_limit;
    pthread_mutex_unlock(&ctx->lock);
    return err;
}

SV_EXPORT int ibv_query_srq(struct ibv_srq *ibsrq, struct ibv_srq_attr *attr)
{
    struct sv_context *ctx = sv_ctx(ibsrq->context);
    struct sv_srq *srq = sv_srq(ibsrq);

    pthread_mutex_lock(&ctx->lock);
    attr->max_wr = srq->size;
    attr->max_sge = srq->max_sge;
    attr->srq_limit = srq->limit;
    pthread_mutex_unlock(&ctx->lock);
    return 0;
}

SV_EXPORT int ibv_destroy_srq(struct ibv_srq *ibsrq)
{
    struct sv_context *ctx = sv_ctx(ibsrq->context);
    struct sv_srq *srq = sv_srq(ibsrq);
    struct sv_qp *qp;

    pthread_mutex_lock(&ctx->lock);
    for (qp = ctx->qps; qp; qp = qp->next) {
        if (qp->ibqp.srq == ibsrq) {
            pthread_mutex_unlock(&ctx->lock);
            return EBUSY;
        }
    }
    pthread_mutex_unlock(&ctx->lock);
    free(srq->rq);
    free(srq);
    return 0;
}

int sv_post_srq_recv(struct ibv_srq *ibsrq, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad_wr)
{
    struct sv_context *ctx = sv_ctx(ibsrq->context);
    struct sv_srq *srq = sv_srq(ibsrq);
    struct sv_rwqe *r;
    int err = 0;

    pthread_mutex_lock(&ctx->lock);
    for (; wr; wr = wr->next) {
        if (wr->num_sge < 0 || (uint32_t)wr->num_sge > srq->max_sge) {
            err = EINVAL;
            break;
        }
        if (srq->tail - srq->head >= srq->size) {
            err = ENOMEM;
            break;
        }
        r = &srq->rq[srq->tail++ & (srq->size - 1)];
        r->wr_id = wr->wr_id;
        r->num_sge = wr->num_sge;
        memcpy(r->sge, wr->sg_list, sizeof(r->sge[0]) * (size_t)wr->num_sge);
    }
    if (err && bad_wr)
        *bad_wr = wr;
    pthread_mutex_unlock(&ctx->lock);
    return err;
}

/* Whether a receive work request is available to the QP. Called with ctx->lock held. */
bool sv_recv_ready(struct sv_qp *qp)
{
    struct sv_srq *srq = qp->ibqp.srq ? sv_srq(qp->ibqp.srq) : NULL;

    return srq ? srq->head != srq->tail : qp->rq_head != qp->rq_tail;
}

/* Takes the next receive work request of the QP (from its SRQ if it has one) into *r; raises
 * the SRQ limit event when the SRQ falls below its armed limit. Called with ctx->lock held. */
bool sv_recv_take(struct sv_qp *qp, struct sv_rwqe *r)
{
    struct sv_srq *srq = qp->ibqp.srq ? sv_srq(qp->ibqp.srq) : NULL;

    if (!sv_recv_ready(qp))
        return false;
    if (!srq) {
        *r = qp->rq[qp->rq_head++ & (qp->rq_size - 1)];
        return true;
    }
    *r = srq->rq[srq->head++ & (srq->size - 1)];
    if (srq->limit && srq->tail - srq->head < srq->limit) {
        srq->limit = 0; /* the event disarms the limit */
        sv_async_event(sv_ctx(qp->ibqp.context), IBV_EVENT_SRQ_LIMIT_REACHED, &srq->ibsrq);
    }
    return true;
}
