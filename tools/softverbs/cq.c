/* softverbs: completion queues and completion channels.
 *
 * A CQ is a ring of struct ibv_wc filled by the progress thread (and by the posting thread for
 * flushed work requests) under ctx->lock. A completion channel is a pipe: when a completion is
 * added to an armed CQ, the CQ pointer is written to it, which is what ibv_get_cq_event reads.
 */
#include "sv_int.h"

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

SV_EXPORT struct ibv_comp_channel *ibv_create_comp_channel(struct ibv_context *ibctx)
{
    struct sv_comp_channel *ch = calloc(1, sizeof(*ch));
    int fds[2];

    if (!ch) {
        errno = ENOMEM;
        return NULL;
    }
    if (pipe2(fds, O_CLOEXEC) != 0) {
        free(ch);
        return NULL;
    }
    /* A full pipe means the application has thousands of unread events; drop, never block. */
    fcntl(fds[1], F_SETFL, O_NONBLOCK);
    ch->ch.context = ibctx;
    ch->ch.fd = fds[0];
    ch->wr_fd = fds[1];
    return &ch->ch;
}

SV_EXPORT int ibv_destroy_comp_channel(struct ibv_comp_channel *channel)
{
    struct sv_comp_channel *ch = container_of(channel, struct sv_comp_channel, ch);

    if (channel->refcnt)
        return EBUSY;
    close(ch->ch.fd);
    close(ch->wr_fd);
    free(ch);
    return 0;
}

void sv_comp_channel_notify(struct ibv_comp_channel *channel, struct ibv_cq *cq)
{
    struct sv_comp_channel *ch = container_of(channel, struct sv_comp_channel, ch);

    if (write(ch->wr_fd, &cq, sizeof(cq)) != (ssize_t)sizeof(cq))
        return; /* the pipe is full: the application is already far behind */
}

static uint32_t sv_pow2(uint32_t n)
{
    uint32_t p = 1;

    while (p < n)
        p <<= 1;
    return p;
}

SV_EXPORT struct ibv_cq *ibv_create_cq(struct ibv_context *ibctx, int cqe, void *cq_context,
                                       struct ibv_comp_channel *channel, int comp_vector)
{
    struct sv_cq *cq;

    if (cqe < 1 || cqe > SV_MAX_CQE || comp_vector < 0 || comp_vector >= ibctx->num_comp_vectors) {
        errno = EINVAL;
        return NULL;
    }
    cq = calloc(1, sizeof(*cq));
    if (!cq)
        goto err;
    cq->size = sv_pow2((uint32_t)cqe);
    cq->ring = calloc(cq->size, sizeof(*cq->ring));
    if (!cq->ring)
        goto err_free_cq;
    cq->ibcq.context = ibctx;
    cq->ibcq.channel = channel;
    cq->ibcq.cq_context = cq_context;
    cq->ibcq.cqe = (int)cq->size;
    pthread_mutex_init(&cq->ibcq.mutex, NULL);
    pthread_cond_init(&cq->ibcq.cond, NULL);
    if (channel)
        channel->refcnt++;
    return &cq->ibcq;

err_free_cq:
    free(cq);
err:
    errno = ENOMEM;
    return NULL;
}

static bool sv_cq_in_use(struct sv_context *ctx, struct ibv_cq *ibcq)
{
    struct sv_qp *qp;

    for (qp = ctx->qps; qp; qp = qp->next)
        if (qp->ibqp.send_cq == ibcq || qp->ibqp.recv_cq == ibcq)
            return true;
    return false;
}

SV_EXPORT int ibv_destroy_cq(struct ibv_cq *ibcq)
{
    struct sv_context *ctx = sv_ctx(ibcq->context);
    struct sv_cq *cq = sv_cq(ibcq);
    bool busy;

    pthread_mutex_lock(&ctx->lock);
    busy = sv_cq_in_use(ctx, ibcq);
    pthread_mutex_unlock(&ctx->lock);
    if (busy)
        return EBUSY;
    if (ibcq->channel)
        ibcq->channel->refcnt--;
    free(cq->ring);
    free(cq);
    return 0;
}

SV_EXPORT int ibv_resize_cq(struct ibv_cq *ibcq, int cqe)
{
    struct sv_context *ctx = sv_ctx(ibcq->context);
    struct sv_cq *cq = sv_cq(ibcq);
    struct ibv_wc *ring;
    uint32_t size, i, n;

    if (cqe < 1 || cqe > SV_MAX_CQE)
        return EINVAL;
    size = sv_pow2((uint32_t)cqe);
    ring = calloc(size, sizeof(*ring));
    if (!ring)
        return ENOMEM;
    pthread_mutex_lock(&ctx->lock);
    n = cq->tail - cq->head;
    if (n > size) {
        pthread_mutex_unlock(&ctx->lock);
        free(ring);
        return EINVAL;
    }
    for (i = 0; i < n; i++)
        ring[i] = cq->ring[(cq->head + i) & (cq->size - 1)];
    free(cq->ring);
    cq->ring = ring;
    cq->size = size;
    cq->head = 0;
    cq->tail = n;
    ibcq->cqe = (int)size;
    pthread_mutex_unlock(&ctx->lock);
    return 0;
}

/* Adds one completion; called with ctx->lock held. */
void sv_cq_push(struct sv_cq *cq, const struct ibv_wc *wc)
{
    if (sv_ctx(cq->ibcq.context)->fatal) /* a dead device reports nothing */
        return;
    if (cq->tail - cq->head >= cq->size) {
        if (!cq->overflow)
            sv_async_event(sv_ctx(cq->ibcq.context), IBV_EVENT_CQ_ERR, &cq->ibcq);
        cq->overflow = true;
        return;
    }
    cq->ring[cq->tail++ & (cq->size - 1)] = *wc;
    if (cq->armed && cq->ibcq.channel) {
        cq->armed = false;
        sv_comp_channel_notify(cq->ibcq.channel, &cq->ibcq);
    }
}

int sv_poll_cq(struct ibv_cq *ibcq, int num, struct ibv_wc *wc)
{
    struct sv_context *ctx = sv_ctx(ibcq->context);
    struct sv_cq *cq = sv_cq(ibcq);
    int n = 0;

    pthread_mutex_lock(&ctx->lock);
    while (n < num && cq->head != cq->tail)
        wc[n++] = cq->ring[cq->head++ & (cq->size - 1)];
    pthread_mutex_unlock(&ctx->lock);
    /* Busy-polling applications would otherwise starve the progress threads on small machines:
     * an empty poll gives the CPU away. */
    if (n == 0)
        sched_yield();
    return n;
}

int sv_req_notify_cq(struct ibv_cq *ibcq, int solicited_only)
{
    struct sv_context *ctx = sv_ctx(ibcq->context);

    (void)solicited_only; /* every completion is treated as solicited */
    pthread_mutex_lock(&ctx->lock);
    sv_cq(ibcq)->armed = true;
    pthread_mutex_unlock(&ctx->lock);
    return 0;
}

SV_EXPORT int ibv_get_cq_event(struct ibv_comp_channel *channel, struct ibv_cq **cq,
                               void **cq_context)
{
    struct ibv_cq *ev;

    if (read(channel->fd, &ev, sizeof(ev)) != (ssize_t)sizeof(ev))
        return -1;
    *cq = ev;
    *cq_context = ev->cq_context;
    return 0;
}

SV_EXPORT void ibv_ack_cq_events(struct ibv_cq *cq, unsigned int nevents)
{
    pthread_mutex_lock(&cq->mutex);
    cq->comp_events_completed += nevents;
    pthread_mutex_unlock(&cq->mutex);
}
