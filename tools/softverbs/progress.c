/* softverbs: the progress thread of a context and the packet send path.
 *
 * The thread blocks in epoll_wait on the QP sockets, an eventfd (kicks and stop) and the
 * inotify descriptor of the fault control directory, with a timeout set by the nearest
 * retransmit, RNR or delayed-packet deadline. It never polls: an idle context costs nothing.
 */
#include "sv_int.h"

#include <errno.h>
#include <stdio.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#define SV_TAG_KICK    (1ull << 40)
#define SV_TAG_INOTIFY (2ull << 40)
#define SV_RX_BATCH    64

uint64_t sv_now_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

void sv_progress_kick(struct sv_context *ctx)
{
    uint64_t one = 1;

    if (write(ctx->kick_fd, &one, sizeof(one)) != (ssize_t)sizeof(one))
        return; /* the counter is already non-zero: the thread will wake */
}

/* Registers the QP socket; want_out adds EPOLLOUT while the socket is full. */
int sv_qp_watch(struct sv_qp *qp, bool want_out)
{
    struct sv_context *ctx = sv_ctx(qp->ibqp.context);
    struct epoll_event ev = {.events = EPOLLIN | (want_out ? EPOLLOUT : 0)};

    ev.data.u64 = qp->ibqp.qp_num;
    if (epoll_ctl(ctx->epfd, EPOLL_CTL_MOD, qp->fd, &ev) == 0)
        return 0;
    if (errno == ENOENT && epoll_ctl(ctx->epfd, EPOLL_CTL_ADD, qp->fd, &ev) == 0)
        return 0;
    return errno;
}

void sv_qp_unwatch(struct sv_qp *qp)
{
    epoll_ctl(sv_ctx(qp->ibqp.context)->epfd, EPOLL_CTL_DEL, qp->fd, NULL);
}

/* Sends one packet on the QP socket, connecting it to the peer first if needed. Returns 0
 * when sent or lost (a missing peer is a lost packet, as on a fabric), -EAGAIN when full. */
int sv_raw_send(int fd, const struct sv_pkt *pkt, const void *payload)
{
    struct iovec iov[2] = {
        {.iov_base = (void *)pkt, .iov_len = sizeof(*pkt)},
        {.iov_base = (void *)payload, .iov_len = payload ? pkt->len : 0},
    };
    struct msghdr msg = {.msg_iov = iov, .msg_iovlen = 2};

    if (sendmsg(fd, &msg, MSG_DONTWAIT | MSG_NOSIGNAL) >= 0)
        return 0;
    return errno == EAGAIN || errno == EWOULDBLOCK ? -EAGAIN : 0;
}

static bool sv_qp_connect(struct sv_qp *qp)
{
    if (qp->connected)
        return true;
    if (!qp->peer_len)
        return false;
    if (connect(qp->fd, (struct sockaddr *)&qp->peer, qp->peer_len) != 0)
        return false;
    qp->connected = true;
    return true;
}

int sv_pkt_send(struct sv_qp *qp, struct sv_pkt *pkt, const void *payload)
{
    struct sv_context *ctx = sv_ctx(qp->ibqp.context);

    pkt->magic = SV_MAGIC;
    pkt->src_qpn = qp->ibqp.qp_num;
    pkt->dst_qpn = qp->attr.dest_qp_num;
    if (!sv_qp_connect(qp))
        return 0; /* no such peer (yet): lost */
    if (!sv_fault_filter_tx(ctx, pkt))
        return 0;
    if (ctx->fault.delay_ms)
        return sv_fault_delay(qp, pkt, payload);
    return sv_raw_send(qp->fd, pkt, payload);
}

static void sv_rx_one(struct sv_qp *qp, const uint8_t *buf, ssize_t n)
{
    const struct sv_pkt *pkt = (const struct sv_pkt *)buf;

    if (n < (ssize_t)sizeof(*pkt) || pkt->magic != SV_MAGIC)
        return;
    if (pkt->dst_qpn != qp->ibqp.qp_num || pkt->src_qpn != qp->attr.dest_qp_num)
        return; /* not from our peer: a stale or misrouted packet */
    if (pkt->len > SV_CHUNK)
        return;
    if (pkt->op != SV_OP_READ_REQ && pkt->op != SV_OP_ACK && pkt->op != SV_OP_NAK &&
        n != (ssize_t)(sizeof(*pkt) + pkt->len))
        return;
    if (pkt->op == SV_OP_ACK || pkt->op == SV_OP_NAK || pkt->op == SV_OP_READ_RESP)
        sv_req_rx(qp, pkt, buf + sizeof(*pkt));
    else
        sv_resp_rx(qp, pkt, buf + sizeof(*pkt));
}

static void sv_qp_drain(struct sv_context *ctx, struct sv_qp *qp)
{
    ssize_t n;
    int i;

    for (i = 0; i < SV_RX_BATCH; i++) {
        n = recv(qp->fd, ctx->rxbuf, sizeof(struct sv_pkt) + SV_CHUNK, MSG_DONTWAIT);
        if (n < 0)
            return;
        /* While the port is down nothing is received: the link is dead. */
        if (ctx->port_state == IBV_PORT_ACTIVE)
            sv_rx_one(qp, ctx->rxbuf, n);
    }
}

static void sv_handle_event(struct sv_context *ctx, const struct epoll_event *ev)
{
    uint64_t v;
    struct sv_qp *qp;

    if (ev->data.u64 == SV_TAG_KICK) {
        if (read(ctx->kick_fd, &v, sizeof(v)) < 0)
            return;
        return;
    }
    if (ev->data.u64 == SV_TAG_INOTIFY) {
        sv_fault_reload(ctx);
        return;
    }
    qp = sv_qp_find(ctx, (uint32_t)ev->data.u64);
    if (!qp)
        return;
    if (ev->events & (EPOLLIN | EPOLLERR))
        sv_qp_drain(ctx, qp);
    if ((ev->events & EPOLLOUT) && qp->want_out) {
        qp->want_out = false;
        sv_qp_watch(qp, false);
        sv_req_pump(qp);
    }
}

static int sv_next_timeout_ms(struct sv_context *ctx, uint64_t now)
{
    uint64_t next = sv_fault_next_ns(ctx);
    struct sv_qp *qp;

    for (qp = ctx->qps; qp; qp = qp->next)
        if (qp->timer_ns && (!next || qp->timer_ns < next))
            next = qp->timer_ns;
    if (!next)
        return -1;
    if (next <= now)
        return 0;
    return (int)((next - now + 999999) / 1000000);
}

static void sv_run_timers(struct sv_context *ctx)
{
    uint64_t now = sv_now_ns();
    struct sv_qp *qp;

    sv_fault_flush_delayed(ctx, now);
    for (qp = ctx->qps; qp; qp = qp->next)
        sv_req_timer(qp, now);
}

static void *sv_progress_main(void *arg)
{
    struct sv_context *ctx = arg;
    struct epoll_event evs[32];
    int i, n, timeout;

    pthread_mutex_lock(&ctx->lock);
    while (!ctx->stopping) {
        timeout = sv_next_timeout_ms(ctx, sv_now_ns());
        pthread_mutex_unlock(&ctx->lock);
        n = epoll_wait(ctx->epfd, evs, 32, timeout);
        pthread_mutex_lock(&ctx->lock);
        for (i = 0; i < n; i++)
            sv_handle_event(ctx, &evs[i]);
        sv_run_timers(ctx);
    }
    pthread_mutex_unlock(&ctx->lock);
    return NULL;
}

static int sv_epoll_add(int epfd, int fd, uint64_t tag)
{
    struct epoll_event ev = {.events = EPOLLIN, .data.u64 = tag};

    return epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &ev);
}

int sv_progress_start(struct sv_context *ctx)
{
    ctx->epfd = epoll_create1(EPOLL_CLOEXEC);
    if (ctx->epfd < 0)
        return -errno;
    ctx->kick_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (ctx->kick_fd < 0)
        goto err_close_ep;
    if (sv_epoll_add(ctx->epfd, ctx->kick_fd, SV_TAG_KICK) != 0)
        goto err_close_kick;
    if (ctx->inotify_fd >= 0 && sv_epoll_add(ctx->epfd, ctx->inotify_fd, SV_TAG_INOTIFY) != 0)
        goto err_close_kick;
    if (pthread_create(&ctx->thread, NULL, sv_progress_main, ctx) != 0)
        goto err_close_kick;
    return 0;

err_close_kick:
    close(ctx->kick_fd);
err_close_ep:
    close(ctx->epfd);
    return -1;
}

void sv_progress_stop(struct sv_context *ctx)
{
    pthread_mutex_lock(&ctx->lock);
    ctx->stopping = true;
    pthread_mutex_unlock(&ctx->lock);
    sv_progress_kick(ctx);
    pthread_join(ctx->thread, NULL);
    close(ctx->kick_fd);
    close(ctx->epfd);
}
