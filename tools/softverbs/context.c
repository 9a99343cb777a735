/* softverbs: opening a device (the context), device/port/GID queries and async events. */
#include "sv_int.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* One record in the async event pipe; written whole (smaller than PIPE_BUF). */
struct sv_async_rec {
    uint32_t type;
    uint32_t port;
    void *element;
};

void sv_async_event(struct sv_context *ctx, enum ibv_event_type type, void *element)
{
    struct sv_async_rec rec = {.type = type, .port = 1, .element = element};

    /* The write end is non-blocking: when the application never reads its events, new ones are
     * lost rather than stalling the progress thread. */
    if (write(ctx->async_wr, &rec, sizeof(rec)) != (ssize_t)sizeof(rec))
        fprintf(stderr, "softverbs: async event %d lost\n", type);
}

static int sv_query_port_ex(struct ibv_context *ibctx, uint8_t port, struct ibv_port_attr *a,
                            size_t size);

static void sv_context_init_ops(struct sv_context *ctx)
{
    struct ibv_context *c = &ctx->vctx.context;

    c->ops.poll_cq = sv_poll_cq;
    c->ops.req_notify_cq = sv_req_notify_cq;
    c->ops.post_send = sv_post_send;
    c->ops.post_recv = sv_post_recv;
    c->ops.post_srq_recv = sv_post_srq_recv;
    ctx->vctx.query_port = sv_query_port_ex;
    ctx->vctx.sz = sizeof(ctx->vctx);
    c->abi_compat = __VERBS_ABI_IS_EXTENDED;
}

SV_EXPORT struct ibv_context *ibv_open_device(struct ibv_device *device)
{
    struct sv_context *ctx;
    int fds[2];

    ctx = calloc(1, sizeof(*ctx));
    if (!ctx)
        goto err;
    ctx->dev = (struct sv_device *)device;
    ctx->vctx.context.device = device;
    ctx->vctx.context.cmd_fd = -1;
    ctx->vctx.context.num_comp_vectors = 1;
    ctx->port_state = IBV_PORT_ACTIVE;
    ctx->epfd = ctx->kick_fd = ctx->inotify_fd = -1;
    ctx->fault.rand_seed = (unsigned)getpid();
    sv_context_init_ops(ctx);
    pthread_mutex_init(&ctx->vctx.context.mutex, NULL);
    pthread_mutex_init(&ctx->lock, NULL);
    ctx->rxbuf = malloc(sizeof(struct sv_pkt) + SV_CHUNK);
    ctx->txbuf = malloc(SV_CHUNK);
    if (!ctx->rxbuf || !ctx->txbuf)
        goto err_free_rxbuf;
    if (pipe2(fds, O_CLOEXEC) != 0)
        goto err_free_rxbuf;
    ctx->vctx.context.async_fd = fds[0];
    ctx->async_wr = fds[1];
    fcntl(ctx->async_wr, F_SETFL, O_NONBLOCK);
    if (sv_fault_open(ctx) != 0)
        goto err_close_pipe;
    if (sv_progress_start(ctx) != 0)
        goto err_close_fault;
    return &ctx->vctx.context;

err_close_fault:
    sv_fault_close(ctx);
err_close_pipe:
    close(fds[0]);
    close(fds[1]);
err_free_rxbuf:
    free(ctx->rxbuf);
    free(ctx->txbuf);
    free(ctx);
err:
    errno = ENOMEM;
    return NULL;
}

SV_EXPORT int ibv_close_device(struct ibv_context *ibctx)
{
    struct sv_context *ctx = sv_ctx(ibctx);

    sv_progress_stop(ctx);
    sv_fault_close(ctx);
    close(ctx->vctx.context.async_fd);
    close(ctx->async_wr);
    free(ctx->mrs);
    free(ctx->rxbuf);
    free(ctx->txbuf);
    pthread_mutex_destroy(&ctx->lock);
    free(ctx);
    return 0;
}

SV_EXPORT int ibv_query_device(struct ibv_context *ibctx, struct ibv_device_attr *a)
{
    struct sv_context *ctx = sv_ctx(ibctx);

    memset(a, 0, sizeof(*a));
    snprintf(a->fw_ver, sizeof(a->fw_ver), "softverbs-1");
    a->node_guid = htobe64(ctx->dev->guid);
    a->sys_image_guid = a->node_guid;
    a->max_mr_size = sv_max_mr_size();
    a->page_size_cap = 4096;
    a->vendor_id = 0x5356; /* "SV": not a registered vendor */
    a->max_qp = 1 << 16;
    a->max_qp_wr = SV_MAX_WR;
    a->device_cap_flags =
        IBV_DEVICE_RC_RNR_NAK_GEN | IBV_DEVICE_PORT_ACTIVE_EVENT | IBV_DEVICE_SYS_IMAGE_GUID;
    a->max_sge = SV_MAX_SGE;
    a->max_sge_rd = SV_MAX_SGE;
    a->max_cq = 1 << 16;
    a->max_cqe = SV_MAX_CQE;
    a->max_mr = 1 << 20;
    a->max_pd = 1 << 16;
    a->max_qp_rd_atom = 16;
    a->max_res_rd_atom = 1 << 16;
    a->max_qp_init_rd_atom = 16;
    a->atomic_cap = IBV_ATOMIC_NONE;
    a->max_srq = 1 << 16;
    a->max_srq_wr = SV_MAX_WR;
    a->max_srq_sge = SV_MAX_SGE;
    a->max_pkeys = 1;
    a->local_ca_ack_delay = 15;
    a->phys_port_cnt = 1;
    return 0;
}

static void sv_port_fill(struct sv_context *ctx, struct ibv_port_attr *a)
{
    bool eth = ctx->dev->link == SV_LINK_ETH;

    memset(a, 0, sizeof(*a));
    pthread_mutex_lock(&ctx->lock);
    a->state = ctx->port_state;
    pthread_mutex_unlock(&ctx->lock);
    a->max_mtu = IBV_MTU_4096;
    a->active_mtu = eth ? IBV_MTU_1024 : IBV_MTU_4096;
    a->gid_tbl_len = ctx->dev->gid_cnt;
    a->max_msg_sz = 1u << 31;
    a->pkey_tbl_len = 1;
    a->lid = ctx->dev->lid;
    a->sm_lid = eth ? 0 : 1;
    a->max_vl_num = 1;
    a->subnet_timeout = 18;
    /* 1X SDR: a correctness device reports no meaningful speed. */
    a->active_width = 1;
    a->active_speed = 1;
    a->phys_state = a->state == IBV_PORT_ACTIVE ? 5 /* LinkUp */ : 3 /* Disabled */;
    a->link_layer = eth ? IBV_LINK_LAYER_ETHERNET : IBV_LINK_LAYER_INFINIBAND;
}

static int sv_query_port_ex(struct ibv_context *ibctx, uint8_t port, struct ibv_port_attr *a,
                            size_t size)
{
    struct ibv_port_attr full;

    if (port != 1)
        return EINVAL;
    sv_port_fill(sv_ctx(ibctx), &full);
    memcpy(a, &full, size < sizeof(full) ? size : sizeof(full));
    return 0;
}

#undef ibv_query_port
SV_EXPORT int ibv_query_port(struct ibv_context *ibctx, uint8_t port,
                             struct _compat_ibv_port_attr *a)
{
    /* The compatibility struct is a prefix of struct ibv_port_attr. */
    return sv_query_port_ex(ibctx, port, (struct ibv_port_attr *)a,
                            offsetof(struct ibv_port_attr, link_layer));
}

SV_EXPORT int ibv_query_gid(struct ibv_context *ibctx, uint8_t port, int index, union ibv_gid *gid)
{
    struct sv_device *dev = sv_ctx(ibctx)->dev;

    if (port != 1 || index < 0 || index >= dev->gid_cnt) {
        errno = EINVAL;
        return -1;
    }
    *gid = dev->gid[index];
    return 0;
}

/* Private to rdma-core (imported by ibv_devinfo); 0 is IB/RoCE v1, 1 is RoCE v2. */
SV_EXPORT int ibv_query_gid_type(struct ibv_context *ibctx, uint8_t port, unsigned int index,
                                 int *type);
SV_EXPORT int ibv_query_gid_type(struct ibv_context *ibctx, uint8_t port, unsigned int index,
                                 int *type)
{
    struct sv_device *dev = sv_ctx(ibctx)->dev;

    if (port != 1 || index >= (unsigned)dev->gid_cnt) {
        errno = EINVAL;
        return -1;
    }
    *type = dev->link == SV_LINK_ETH ? 1 : 0;
    return 0;
}

static void sv_gid_entry(struct sv_device *dev, uint32_t index, struct ibv_gid_entry *e)
{
    memset(e, 0, sizeof(*e));
    e->gid = dev->gid[index];
    e->gid_index = index;
    e->port_num = 1;
    e->gid_type = dev->link == SV_LINK_ETH ? IBV_GID_TYPE_ROCE_V2 : IBV_GID_TYPE_IB;
}

SV_EXPORT int _ibv_query_gid_ex(struct ibv_context *ibctx, uint32_t port, uint32_t index,
                                struct ibv_gid_entry *entry, uint32_t flags, size_t entry_size)
{
    struct sv_device *dev = sv_ctx(ibctx)->dev;
    struct ibv_gid_entry e;

    if (flags || port != 1 || entry_size < sizeof(e))
        return EINVAL;
    if (index >= (uint32_t)dev->gid_cnt)
        return ENODATA;
    sv_gid_entry(dev, index, &e);
    memcpy(entry, &e, sizeof(e));
    return 0;
}

SV_EXPORT ssize_t _ibv_query_gid_table(struct ibv_context *ibctx, struct ibv_gid_entry *entries,
                                       size_t max_entries, uint32_t flags, size_t entry_size)
{
    struct sv_device *dev = sv_ctx(ibctx)->dev;
    size_t i;

    if (flags || entry_size < sizeof(*entries))
        return -EINVAL;
    if (max_entries < (size_t)dev->gid_cnt)
        return -EINVAL;
    for (i = 0; i < (size_t)dev->gid_cnt; i++)
        sv_gid_entry(dev, (uint32_t)i, (struct ibv_gid_entry *)((char *)entries + i * entry_size));
    return dev->gid_cnt;
}

SV_EXPORT int ibv_query_pkey(struct ibv_context *ibctx, uint8_t port, int index, __be16 *pkey)
{
    (void)ibctx;
    if (port != 1 || index != 0) {
        errno = EINVAL;
        return -1;
    }
    *pkey = htobe16(0xffff);
    return 0;
}

SV_EXPORT int ibv_get_pkey_index(struct ibv_context *ibctx, uint8_t port, __be16 pkey)
{
    (void)ibctx;
    if (port == 1 && (be16toh(pkey) & 0x7fff) == 0x7fff)
        return 0;
    return -1;
}

static bool qp_event(enum ibv_event_type t)
{
    return t == IBV_EVENT_QP_FATAL || t == IBV_EVENT_QP_REQ_ERR || t == IBV_EVENT_QP_ACCESS_ERR ||
           t == IBV_EVENT_COMM_EST || t == IBV_EVENT_SQ_DRAINED || t == IBV_EVENT_PATH_MIG ||
           t == IBV_EVENT_PATH_MIG_ERR || t == IBV_EVENT_QP_LAST_WQE_REACHED;
}

/* Whether element is a QP of ctx that still exists. */
static bool qp_alive(struct sv_context *ctx, void *element)
{
    bool found = false;

    pthread_mutex_lock(&ctx->lock);
    for (struct sv_qp *q = ctx->qps; q && !found; q = q->next)
        found = &q->ibqp == element;
    pthread_mutex_unlock(&ctx->lock);
    return found;
}

SV_EXPORT int ibv_get_async_event(struct ibv_context *ibctx, struct ibv_async_event *event)
{
    struct sv_async_rec rec;

    /* Events of a QP destroyed before they were read are dropped, as the kernel does: the
     * caller must never see a pointer to a freed QP. */
    do {
        if (read(ibctx->async_fd, &rec, sizeof(rec)) != (ssize_t)sizeof(rec))
            return -1;
    } while (qp_event((enum ibv_event_type)rec.type) && !qp_alive(sv_ctx(ibctx), rec.element));
    memset(event, 0, sizeof(*event));
    event->event_type = (enum ibv_event_type)rec.type;
    switch (event->event_type) {
    case IBV_EVENT_PORT_ACTIVE:
    case IBV_EVENT_PORT_ERR:
    case IBV_EVENT_LID_CHANGE:
    case IBV_EVENT_PKEY_CHANGE:
    case IBV_EVENT_SM_CHANGE:
    case IBV_EVENT_CLIENT_REREGISTER:
    case IBV_EVENT_GID_CHANGE:
        event->element.port_num = (int)rec.port;
        break;
    case IBV_EVENT_CQ_ERR:
        event->element.cq = rec.element;
        break;
    default:
        event->element.qp = rec.element;
        break;
    }
    return 0;
}

SV_EXPORT void ibv_ack_async_event(struct ibv_async_event *event)
{
    (void)event;
}
