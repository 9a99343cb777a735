/* softverbs: fault injection driven from outside the process.
 *
 * Each device has a control file, <SOFTVERBS_CTL_DIR>/<device name> (default directory
 * /tmp/softverbs). It holds the device's fault state, one "key=value" per line:
 *     port=down|up       the port state; down moves every QP to ERR (flushing its work requests)
 *                        and raises IBV_EVENT_PORT_ERR and IBV_EVENT_QP_FATAL; while down
 *                        nothing is sent or received, so peers end with retry-exceeded
 *     drop=PCT           drop PCT percent of the packets this device sends
 *     delay_ms=N         hold every packet this device sends for N ms
 *     corrupt_rkey=0|1   flip the key byte of the rkey of every WRITE and READ request sent
 *     fatal=1            the device dies: IBV_EVENT_DEVICE_FATAL, the port goes down, and from
 *                        then on nothing is sent or received and no completion is ever
 *                        reported (work requests posted before or after are never answered,
 *                        as on a NIC whose firmware is gone); for good, whatever the file says
 *                        later
 * A missing file or key means no fault. Every context watches the directory with inotify and
 * rereads the file when it is closed after writing or renamed into place (in its progress thread,
 * and at every ibv_post_send, so a post that follows the write sees it), so writing the file
 * (echo port=down > $dir/softverbs0) acts at once in every process that uses the device.
 */
#include "sv_int.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

struct sv_delayed {
    struct sv_delayed *next;
    uint64_t due_ns;
    uint32_t qpn;
    struct sv_pkt pkt;
    uint8_t payload[];
};

int sv_fault_open(struct sv_context *ctx)
{
    const char *dir = sv_ctl_dir();

    mkdir(dir, 0777); /* it may exist already */
    ctx->inotify_fd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
    if (ctx->inotify_fd < 0)
        return 0; /* no fault injection, but a working device */
    if (inotify_add_watch(ctx->inotify_fd, dir,
                          IN_CLOSE_WRITE | IN_MOVED_TO | IN_DELETE | IN_MOVED_FROM) < 0) {
        close(ctx->inotify_fd);
        ctx->inotify_fd = -1;
        return 0;
    }
    pthread_mutex_lock(&ctx->lock);
    sv_fault_reload(ctx);
    pthread_mutex_unlock(&ctx->lock);
    return 0;
}

void sv_fault_close(struct sv_context *ctx)
{
    struct sv_delayed *d;

    while ((d = ctx->delayed_head)) {
        ctx->delayed_head = d->next;
        free(d);
    }
    if (ctx->inotify_fd >= 0)
        close(ctx->inotify_fd);
}

static void sv_fault_parse(FILE *f, struct sv_fault *fl)
{
    char line[256], key[64], val[64];

    while (fgets(line, sizeof(line), f)) {
        if (sscanf(line, " %63[^= \t\n] = %63s", key, val) != 2)
            continue;
        if (strcmp(key, "port") == 0)
            fl->port_down = strcmp(val, "down") == 0;
        else if (strcmp(key, "drop") == 0)
            fl->drop_pct = (unsigned)strtoul(val, NULL, 10);
        else if (strcmp(key, "delay_ms") == 0)
            fl->delay_ms = (unsigned)strtoul(val, NULL, 10);
        else if (strcmp(key, "corrupt_rkey") == 0)
            fl->corrupt_rkey = strtoul(val, NULL, 10) != 0;
        else if (strcmp(key, "fatal") == 0)
            fl->fatal = strtoul(val, NULL, 10) != 0;
    }
}

static void sv_port_down(struct sv_context *ctx)
{
    struct sv_qp *qp;
    enum ibv_qp_state st;

    ctx->port_state = IBV_PORT_DOWN;
    sv_async_event(ctx, IBV_EVENT_PORT_ERR, NULL);
    for (qp = ctx->qps; qp; qp = qp->next) {
        st = qp->attr.qp_state;
        if (st != IBV_QPS_RTR && st != IBV_QPS_RTS && st != IBV_QPS_SQD)
            continue;
        sv_qp_flush(qp);
        sv_async_event(ctx, IBV_EVENT_QP_FATAL, &qp->ibqp);
    }
}

/* Rereads the control file; called with ctx->lock held (or before the thread starts). */
void sv_fault_reload(struct sv_context *ctx)
{
    struct sv_fault fl = {.rand_seed = ctx->fault.rand_seed};
    char path[PATH_MAX], evbuf[4096];
    FILE *f;

    while (ctx->inotify_fd >= 0 && read(ctx->inotify_fd, evbuf, sizeof(evbuf)) > 0)
        ;
    snprintf(path, sizeof(path), "%s/%s", sv_ctl_dir(), ctx->dev->ibdev.name);
    f = fopen(path, "r");
    if (f) {
        sv_fault_parse(f, &fl);
        fclose(f);
    }
    if (fl.fatal && !ctx->fatal) {
        ctx->fatal = true;
        ctx->port_state = IBV_PORT_DOWN;
        sv_async_event(ctx, IBV_EVENT_DEVICE_FATAL, NULL);
    }
    if (!ctx->fatal && fl.port_down && ctx->port_state == IBV_PORT_ACTIVE) {
        sv_port_down(ctx);
    } else if (!ctx->fatal && !fl.port_down && ctx->port_state != IBV_PORT_ACTIVE) {
        ctx->port_state = IBV_PORT_ACTIVE;
        sv_async_event(ctx, IBV_EVENT_PORT_ACTIVE, NULL);
    }
    ctx->fault = fl;
}

/* Applies a change of the control file already signalled to this process. Called where work is
 * posted, so that a post which follows a write of the file (by any process) sees the new faults,
 * not only the progress thread's next pass; costs one non-blocking read. */
void sv_fault_sync(struct sv_context *ctx)
{
    char evbuf[4096];

    if (ctx->inotify_fd >= 0 && read(ctx->inotify_fd, evbuf, sizeof(evbuf)) > 0)
        sv_fault_reload(ctx);
}

/* Applies drop, corruption and port state to an outgoing packet; false means drop it. */
bool sv_fault_filter_tx(struct sv_context *ctx, struct sv_pkt *pkt)
{
    struct sv_fault *fl = &ctx->fault;

    if (ctx->port_state != IBV_PORT_ACTIVE)
        return false;
    if (fl->drop_pct && (unsigned)(rand_r(&fl->rand_seed) % 100) < fl->drop_pct)
        return false;
    if (fl->corrupt_rkey && (pkt->op == SV_OP_WRITE || pkt->op == SV_OP_READ_REQ))
        pkt->rkey ^= 0xa5;
    return true;
}

int sv_fault_delay(struct sv_qp *qp, const struct sv_pkt *pkt, const void *payload)
{
    struct sv_context *ctx = sv_ctx(qp->ibqp.context);
    size_t len = payload ? pkt->len : 0;
    struct sv_delayed *d = malloc(sizeof(*d) + len);

    if (!d)
        return 0; /* lost */
    d->next = NULL;
    d->due_ns = sv_now_ns() + (uint64_t)ctx->fault.delay_ms * 1000000ull;
    d->qpn = qp->ibqp.qp_num;
    d->pkt = *pkt;
    if (!payload)
        d->pkt.len = pkt->op == SV_OP_READ_REQ ? pkt->len : 0;
    memcpy(d->payload, payload ? payload : "", len);
    if (ctx->delayed_tail)
        ctx->delayed_tail->next = d;
    else
        ctx->delayed_head = d;
    ctx->delayed_tail = d;
    return 0;
}

uint64_t sv_fault_next_ns(struct sv_context *ctx)
{
    return ctx->delayed_head ? ctx->delayed_head->due_ns : 0;
}

/* Sends the delayed packets that are due; the delay is constant, so the list is in order. */
void sv_fault_flush_delayed(struct sv_context *ctx, uint64_t now)
{
    struct sv_delayed *d;
    struct sv_qp *qp;

    while ((d = ctx->delayed_head) && d->due_ns <= now) {
        ctx->delayed_head = d->next;
        if (!ctx->delayed_head)
            ctx->delayed_tail = NULL;
        qp = sv_qp_find(ctx, d->qpn);
        if (qp && ctx->port_state == IBV_PORT_ACTIVE)
            sv_raw_send(qp->fd, &d->pkt, d->pkt.op == SV_OP_READ_REQ ? NULL : d->payload);
        free(d);
    }
}

void sv_fault_drop_delayed(struct sv_context *ctx, uint32_t qpn)
{
    struct sv_delayed **pp = &ctx->delayed_head, *d;

    ctx->delayed_tail = NULL;
    while ((d = *pp)) {
        if (d->qpn == qpn) {
            *pp = d->next;
            free(d);
            continue;
        }
        ctx->delayed_tail = d;
        pp = &d->next;
    }
}
