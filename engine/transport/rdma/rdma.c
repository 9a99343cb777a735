/* RDMA transport: devices, memory regions, completion and async event handlers. See
 * rdma_int.h for the design. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <unistd.h>

#include <jansson.h>

#include "../../sys/verbs.h"
#include "../../util/bytes.h"
#include "rdma_int.h"

unsigned mc__rdma_slot;

/* ---- devices ---- */

/* MC_DEVICES, when set, names the devices to use (network interfaces too: ignored here). */
static bool device_wanted(const char *list, const char *name)
{
    size_t n = strlen(name);

    if (!*list)
        return true;
    for (const char *p = list; *p; p += strcspn(p, ",") + (p[strcspn(p, ",")] == ',')) {
        if (strcspn(p, ",") == n && !strncmp(p, name, n))
            return true;
    }
    return false;
}

static bool gid_is_v4_mapped(const union ibv_gid *g)
{
    static const uint8_t prefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    return !memcmp(g->raw, prefix, sizeof(prefix));
}

/* MC_GID_INDEX, or: on Ethernet the first RoCE v2 GID with an IPv4 address (routable, what
 * RoCE fabrics are set up for), else the first RoCE v2 one; index 0 otherwise. */
static int gid_pick(const mc_rdma_t *r, mc_rdma_dev_t *d, int table_len)
{
    int fallback = -1;

    if (r->gid_index >= 0)
        return r->gid_index;
    if (d->link != IBV_LINK_LAYER_ETHERNET)
        return 0;
    for (int i = 0; i < table_len; i++) {
        struct ibv_gid_entry ent;
        if (ibv_query_gid_ex(d->ctx, d->port, (uint32_t)i, &ent, 0) ||
            ent.gid_type != IBV_GID_TYPE_ROCE_V2)
            continue;
        if (gid_is_v4_mapped((union ibv_gid *)&ent.gid))
            return i;
        if (fallback < 0)
            fallback = i;
    }
    return fallback < 0 ? 0 : fallback;
}

static void async_handler(mc_engine_t *e, mc_pollable_t *p, uint32_t events);
static void cq_handler(mc_engine_t *e, mc_pollable_t *p, uint32_t events);

static int nonblocking(int fd)
{
    int fl = fcntl(fd, F_GETFL);
    return fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0 ? -errno : 0;
}

static int dev_setup(mc_engine_t *e, const mc_rdma_t *r, mc_rdma_dev_t *d)
{
    struct ibv_device_attr da;
    struct ibv_port_attr pa;

    if (ibv_query_device(d->ctx, &da) || ibv_query_port(d->ctx, d->port, &pa))
        return mc__set_error(-EIO, "%s: cannot query the device or port %u", d->name, d->port);
    if (pa.state != IBV_PORT_ACTIVE)
        return mc__set_error(-MC_ENODEV, "%s port %u is %s", d->name, d->port,
                             ibv_port_state_str(pa.state));
    d->link = pa.link_layer == IBV_LINK_LAYER_ETHERNET ? IBV_LINK_LAYER_ETHERNET
                                                       : IBV_LINK_LAYER_INFINIBAND;
    d->lid = pa.lid;
    d->mtu = (uint16_t)(128u << pa.active_mtu);
    if (r->mtu && r->mtu < d->mtu)
        d->mtu = (uint16_t)r->mtu;
    d->gid_index = gid_pick(r, d, pa.gid_tbl_len);
    if (ibv_query_gid(d->ctx, d->port, d->gid_index, &d->gid))
        return mc__set_error(-MC_ECONFIG, "%s: no GID at index %d (MC_GID_INDEX)", d->name,
                             d->gid_index);
    /* Pieces of at most 1 TiB keep offsets and JSON integers small. */
    d->max_mr = (da.max_mr_size < (1ull << 40) ? da.max_mr_size : 1ull << 40) & ~4095ull;
    if (!d->max_mr)
        return mc__set_error(-MC_ENODEV, "%s: max_mr_size %llu is below a page", d->name,
                             (unsigned long long)da.max_mr_size);
    d->rd_init = da.max_qp_init_rd_atom < 16 ? (unsigned)da.max_qp_init_rd_atom : 16;
    d->rd_resp = da.max_qp_rd_atom < 16 ? (unsigned)da.max_qp_rd_atom : 16;
    d->cq_size = da.max_cqe < MC_RDMA_CQ_MAX ? (unsigned)da.max_cqe : MC_RDMA_CQ_MAX;
    /* Relaxed ordering is an optional flag: devices without it ignore it. */
    d->access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
                IBV_ACCESS_RELAXED_ORDERING;
    d->pd = ibv_alloc_pd(d->ctx);
    d->ch = d->pd ? ibv_create_comp_channel(d->ctx) : NULL;
    d->cq = d->ch ? ibv_create_cq(d->ctx, (int)d->cq_size, d, d->ch, 0) : NULL;
    if (!d->cq)
        return mc__set_error(-ENOMEM, "%s: cannot create a PD, completion channel or CQ", d->name);
    d->cq_poll.fd = d->ch->fd;
    d->cq_poll.handler = cq_handler;
    d->async_poll.fd = d->ctx->async_fd;
    d->async_poll.handler = async_handler;
    if (nonblocking(d->ch->fd) || nonblocking(d->ctx->async_fd) || ibv_req_notify_cq(d->cq, 0) ||
        mc__epoll_add(e, &d->cq_poll, EPOLLIN) || mc__epoll_add(e, &d->async_poll, EPOLLIN))
        return mc__set_error(-EIO, "%s: cannot watch its completion channel", d->name);
    return 0;
}

static void dev_close(mc_engine_t *e, mc_rdma_dev_t *d)
{
    if (d->cq_poll.fd > 0) /* (-1 once fatal: out of the loop already) */
        mc__epoll_del(e, &d->cq_poll);
    if (d->async_poll.fd > 0)
        mc__epoll_del(e, &d->async_poll);
    if (d->cq)
        ibv_destroy_cq(d->cq);
    if (d->ch)
        ibv_destroy_comp_channel(d->ch);
    if (d->pd)
        ibv_dealloc_pd(d->pd);
    if (d->ctx)
        ibv_close_device(d->ctx);
    memset(d, 0, sizeof(*d));
}

/* Open the devices we may use. None is not an error: peers are then reached otherwise. */
static int rdma_init(mc_engine_t *e)
{
    mc_rdma_t *r;
    struct ibv_device **list;
    const char *why;
    uint8_t port;
    int n = 0;

    if (!mc__verbs_available(&why)) {
        mc_info("rdma unavailable: %s", why);
        return 0;
    }
    list = ibv_get_device_list(&n);
    if (!list || n == 0) {
        if (list)
            ibv_free_device_list(list);
        mc_info("rdma: no RDMA device");
        return 0;
    }
    r = calloc(1, sizeof(*r));
    if (!r) {
        ibv_free_device_list(list);
        return mc__set_error(-ENOMEM, "out of memory");
    }
    mc_list_init(&r->qps);
    mc_list_init(&r->to_post);
    mc_list_init(&r->msg_rx);
    mc_list_init(&r->msg_rx_lent);
    r->chunk = UINT64_MAX;
    r->qp_depth = (unsigned)mc__config_num(e->conf, "RDMA_QP_DEPTH");
    r->max_qps = (unsigned)mc__config_num(e->conf, "RDMA_MAX_QPS");
    r->mtu = (unsigned)mc__config_num(e->conf, "MTU");
    r->gid_index = (int)(int64_t)mc__config_num(e->conf, "GID_INDEX");
    port = (uint8_t)mc__config_num(e->conf, "IB_PORT");
    for (int i = 0; i < n && r->n_devs < MC_RDMA_MAX_DEVS; i++) {
        mc_rdma_dev_t *d = &r->devs[r->n_devs];
        snprintf(d->name, sizeof(d->name), "%s", ibv_get_device_name(list[i]));
        if (!device_wanted(e->cfg.devices, d->name))
            continue;
        d->port = port;
        d->index = r->n_devs;
        d->ctx = ibv_open_device(list[i]);
        if (!d->ctx || dev_setup(e, r, d)) {
            mc_warn("rdma: %s not used: %s", d->name, d->ctx ? mc_last_error() : strerror(errno));
            dev_close(e, d);
            continue;
        }
        if (d->max_mr < r->chunk)
            r->chunk = d->max_mr;
        mc_info("rdma: %s port %u %s lid %u gid[%d] mtu %u", d->name, d->port,
                d->link == IBV_LINK_LAYER_ETHERNET ? "RoCE" : "IB", d->lid, d->gid_index, d->mtu);
        r->n_devs++;
    }
    ibv_free_device_list(list);
    if (!r->n_devs) {
        free(r);
        return 0;
    }
    e->tp[mc__rdma_slot] = r;
    return 0;
}

/* After every memory region is gone. */
static void rdma_fini(mc_engine_t *e)
{
    mc_rdma_t *r = rdma_of(e);

    mc__rdma_msg_reap(e, true);
    for (unsigned i = 0; i < r->n_devs; i++)
        dev_close(e, &r->devs[i]);
    free(r);
    e->tp[mc__rdma_slot] = NULL;
}

/* Stop using the initiator QPs of a device whose port went down, or one that went fatal:
 * requests in flight flush and are retried elsewhere; idle QPs go at once, so the rail shows
 * no connection and gets a new QP (a re-probe) on its next use. */
static void drain_dev_qps(mc_engine_t *e, mc_rdma_dev_t *d, struct ibv_qp *only)
{
    mc_list_t *pos, *tmp;

    mc_list_for_each_safe(pos, tmp, &rdma_of(e)->qps)
    {
        mc_rdma_qp_t *qp = mc_container_of(pos, mc_rdma_qp_t, link);
        if (qp->dev != d || (only && qp->qp != only) || qp->state == QP_DRAINING)
            continue;
        if (qp->rail) /* (its flushed requests won't charge it) */
            mc__rdma_rail_failed(qp->peer, qp->rail, false);
        mc__rdma_qp_drain(e, qp);
    }
}

/* A device that went fatal completes nothing any more, not even a flush: its CQ leaves the
 * loop, and what its QPs posted fails at once as flushed requests do (slices go to another
 * rail; the messages of its QPs went back to the control link when they drained, and a QP of a
 * dead device, a target's too, lets go of its message work as it drains: mc__rdma_qp_drain). */
static void dev_fatal(mc_engine_t *e, mc_rdma_dev_t *d)
{
    mc_list_t *pos, *tmp;

    mc__epoll_del(e, &d->cq_poll);
    d->cq_poll.fd = -1;
    mc_list_for_each_safe(pos, tmp, &rdma_of(e)->qps)
    {
        mc_rdma_qp_t *qp = mc_container_of(pos, mc_rdma_qp_t, link);
        if (qp->dev != d)
            continue;
        qp->msg_out = 0;
        if (!qp->outstanding) {
            mc__rdma_qp_drain(e, qp); /* destroyed: nothing is left */
            continue;
        }
        /* (a slice ended by a failed post while it was being built is no longer listed) */
        for (unsigned left = qp->outstanding; left && !mc_list_empty(&qp->posted); left--) {
            mc_slice_t *s = rdma_sl_of(qp->posted.next); /* the last may destroy qp */
            struct ibv_wc wc = {.wr_id = (uintptr_t)s, .status = IBV_WC_WR_FLUSH_ERR};
            mc__rdma_complete(e, d, &wc);
        }
    }
}

static void async_handler(mc_engine_t *e, mc_pollable_t *p, uint32_t events)
{
    mc_rdma_dev_t *d = mc_container_of(p, mc_rdma_dev_t, async_poll);
    struct ibv_async_event ev;

    (void)events;
    while (ibv_get_async_event(d->ctx, &ev) == 0) {
        enum ibv_event_type t = ev.event_type;
        struct ibv_qp *qp = ev.element.qp; /* (a QP event's: matched below, not dereferenced) */
        ibv_ack_async_event(&ev); /* first: destroying a QP waits until its events read are */
        if (t == IBV_EVENT_PORT_ACTIVE)
            mc_info("rdma: %s: %s", d->name, ibv_event_type_str(t));
        else
            mc_warn("rdma: %s: %s", d->name, ibv_event_type_str(t));
        bool was_fatal = d->fatal;
        d->fatal |= t == IBV_EVENT_DEVICE_FATAL; /* nothing works on it any more */
        if (t == IBV_EVENT_PORT_ACTIVE && !d->fatal)
            d->port_down = false;
        if (t == IBV_EVENT_PORT_ERR || t == IBV_EVENT_DEVICE_FATAL) {
            d->port_down = true;
            drain_dev_qps(e, d, NULL);
            if (d->fatal && !was_fatal)
                dev_fatal(e, d);
        } else if (t == IBV_EVENT_QP_FATAL || t == IBV_EVENT_QP_REQ_ERR ||
                   t == IBV_EVENT_QP_ACCESS_ERR) /* ours only: a target QP stays with its link */
            drain_dev_qps(e, d, qp);
    }
}

static void cq_handler(mc_engine_t *e, mc_pollable_t *p, uint32_t events)
{
    mc_rdma_dev_t *d = (mc_rdma_dev_t *)p;
    struct ibv_cq *cq;
    void *ctx;
    unsigned acks = 0;
    struct ibv_wc wc[32];
    int n;

    (void)events;
    if (d->fatal) /* what it might still report was failed already (dev_fatal) */
        return;
    while (ibv_get_cq_event(d->ch, &cq, &ctx) == 0)
        acks++;
    if (acks)
        ibv_ack_cq_events(d->cq, acks);
    /* Re-arm before polling, so a completion that lands after the last poll still wakes us. */
    ibv_req_notify_cq(d->cq, 0);
    while ((n = ibv_poll_cq(d->cq, 32, wc)) > 0) {
        for (int i = 0; i < n; i++)
            mc__rdma_complete(e, d, &wc[i]);
    }
}

/* ---- memory regions ---- */

static void mrs_free(mc_rdma_mrs_t *m)
{
    for (size_t i = 0; i < (size_t)m->n_devs * m->n_chunks; i++)
        if (m->mr[i])
            ibv_dereg_mr(m->mr[i]);
    free(m);
}

/* Memory mapped without write permission: peers read it, nothing writes it (the kernel would
 * refuse to pin it for writing). */
#define MC_RDMA_ACCESS_READ_ONLY IBV_ACCESS_REMOTE_READ

int mc__rdma_mr_register(mc_engine_t *e, mc_buffer_t *b)
{
    mc_rdma_t *r = rdma_of(e);
    mc_rdma_mrs_t *m;

    uint32_t n_chunks = (uint32_t)((b->len + r->chunk - 1) / r->chunk);
    m = calloc(1, sizeof(*m) + (size_t)r->n_devs * n_chunks * sizeof(m->mr[0]));
    if (!m)
        return mc__set_error(-ENOMEM, "out of memory");
    m->chunk = r->chunk;
    m->n_chunks = n_chunks;
    m->n_devs = r->n_devs;
    for (unsigned d = 0; d < r->n_devs; d++) {
        for (uint32_t c = 0; c < n_chunks; c++) {
            uint64_t off = (uint64_t)c * r->chunk, len = b->len - off;
            char why[256];
            len = len < r->chunk ? len : r->chunk;
            struct ibv_mr *mr =
                b->vram ? mc__rdma_vram_reg(&r->devs[d], b->addr + off, len, why, sizeof(why))
                        : ibv_reg_mr(r->devs[d].pd, (void *)(uintptr_t)(b->addr + off), len,
                                     b->read_only ? MC_RDMA_ACCESS_READ_ONLY : r->devs[d].access);
            if (!mr && b->vram) { /* no GPUDirect path: the file transport stages it */
                mc_info("rdma: VRAM %p+%llu (%s) has no GPUDirect registration (%s with %s): it "
                        "is staged through host memory",
                        (void *)(uintptr_t)b->addr, (unsigned long long)b->len, b->location, why,
                        r->devs[d].name);
                mrs_free(m);
                return 0;
            }
            if (!mr) {
                int err = errno ? errno : EIO;
                mrs_free(m);
                return mc__set_error(-err, "rdma: cannot register %p+%llu (%s) with %s: %s",
                                     (void *)(uintptr_t)(b->addr + off), (unsigned long long)len,
                                     b->location, r->devs[d].name, strerror(err));
            }
            m->mr[d * n_chunks + c] = mr;
        }
    }
    b->tp[mc__rdma_slot] = m;
    return 0;
}

void mc__rdma_mr_deregister(mc_engine_t *e, mc_buffer_t *b)
{
    (void)e;
    if (b->tp[mc__rdma_slot])
        mrs_free(b->tp[mc__rdma_slot]);
    b->tp[mc__rdma_slot] = NULL;
}

/* ---- descriptor ---- */

/* Our devices as "rdma", each buffer's rkeys as "rkey" with its "mr_chunk" (rdma_desc.c). */
static int rdma_encode(mc_engine_t *e, json_t *root)
{
    mc_rdma_t *r = rdma_of(e);
    json_t *arr = json_array();
    char gid[INET6_ADDRSTRLEN];

    for (unsigned i = 0; arr && i < r->n_devs; i++) {
        const mc_rdma_dev_t *d = &r->devs[i];
        inet_ntop(AF_INET6, d->gid.raw, gid, sizeof(gid));
        if (json_array_append_new(arr, json_pack("{s:s,s:s,s:i,s:s}", "name", d->name, "link",
                                                 d->link == IBV_LINK_LAYER_ETHERNET ? "eth" : "ib",
                                                 "lid", d->lid, "gid", gid))) {
            json_decref(arr);
            arr = NULL;
        }
    }
    return arr && !json_object_set_new(root, "rdma", arr) ? 0 : -ENOMEM;
}

static int rdma_encode_buffer(mc_engine_t *e, const mc_buffer_t *b, json_t *jb)
{
    const mc_rdma_mrs_t *m = b->tp[mc__rdma_slot];
    json_t *arr;

    (void)e;
    if (!m) /* VRAM without GPUDirect: staged by the file transport */
        return 0;
    arr = json_array();
    for (unsigned d = 0; arr && d < m->n_devs; d++) {
        json_t *keys = json_array();
        for (uint32_t c = 0; keys && c < m->n_chunks; c++)
            json_array_append_new(keys, json_integer(m->mr[d * m->n_chunks + c]->rkey));
        json_array_append_new(arr, keys);
    }
    if (!arr || json_object_set_new(jb, "rkey", arr) ||
        json_object_set_new(jb, "mr_chunk", json_integer((json_int_t)m->chunk)))
        return -ENOMEM;
    return 0;
}

/* Its part of a buffer key (read back by the codec's decode_key). */
static int rdma_key_pack(mc_engine_t *e, const mc_buffer_t *b, uint8_t *out, size_t cap)
{
    const mc_rdma_mrs_t *m = b->tp[mc__rdma_slot];
    size_t n = m ? (size_t)m->n_devs * m->n_chunks : 0;

    (void)e;
    if (!m)
        return 0;
    if (8 + 4 * n > cap)
        return mc__set_error(-E2BIG,
                             "buffer 0x%llx: %zu rkeys (%u devices x %u memory regions) do not "
                             "fit in a key",
                             (unsigned long long)b->addr, n, m->n_devs, m->n_chunks);
    mc__put64(out, m->chunk);
    for (unsigned d = 0; d < m->n_devs; d++)
        for (uint32_t c = 0; c < m->n_chunks; c++)
            mc__put32(out + 8 + 4 * ((size_t)d * m->n_chunks + c),
                      m->mr[d * m->n_chunks + c]->rkey);
    return (int)(8 + 4 * n);
}

/* ---- peers and tasks ---- */

/* Peers on another host that publish devices on a common link layer; peers on this host only
 * when MC_PROTOCOL names rdma (tests, benchmarks on one machine). */
static int rdma_peer_update(mc_engine_t *e, mc_peer_t *p)
{
    rdma_peer_t *rp = rdma_peer(p);

    if (p->local_host && strcmp(e->cfg.protocol, "rdma"))
        return 0;
    if (!rp) {
        rp = calloc(1, sizeof(*rp));
        if (!rp)
            return mc__set_error(-ENOMEM, "out of memory");
        p->tp[mc__rdma_slot] = rp;
    }
    mc__rdma_rails_build(e, p);
    return rp->n_rails ? 20 : 0;
}

static void rdma_peer_close(mc_engine_t *e, mc_peer_t *p)
{
    rdma_peer_t *rp = rdma_peer(p);

    for (unsigned i = 0; i < rp->n_rails; i++)
        if (rp->rails[i].qp)
            mc__rdma_qp_drain(e, rp->rails[i].qp);
    free(rp);
    p->tp[mc__rdma_slot] = NULL;
}

/* Both ends need memory regions (VRAM without GPUDirect has none: the file transport stages
 * it). */
static const char *rdma_accept(mc_engine_t *e, mc_task_t *t, const mc_desc_buffer_t *rb)
{
    rdma_peer_t *rp = rdma_peer(t->peer);
    uint64_t down = rp ? atomic_load_explicit(&rp->down_until, memory_order_relaxed) : 0;

    (void)e;
    if (down && (down == UINT64_MAX || mc__now_ns() < down))
        return "no rail to the segment is up (they failed to connect)";
    if (!mc__desc_part(&t->peer->desc, rb, mc__rdma_slot))
        return !strncmp(rb->location, "cuda:", 5) ? "the remote VRAM has no GPUDirect registration"
                                                  : "the remote buffer has no memory region";
    if (!t->lbuf->tp[mc__rdma_slot])
        return t->lbuf->vram ? "the local VRAM has no GPUDirect registration"
                             : "the local buffer has no memory region";
    return NULL;
}

/* Engine teardown (after the control links closed, which drained the QPs they carried). */
static void rdma_stop(mc_engine_t *e)
{
    mc__rdma_drain_all(e);
}

/* MC_GID_INDEX: "pick" (-1) or an index. */
static int parse_gid(const char *v, uint64_t *num_p)
{
    char *end;
    unsigned long x = strtoul(v, &end, 10);

    if (!strcmp(v, "pick")) {
        *num_p = (uint64_t)(int64_t)-1;
        return 0;
    }
    if (!*v || *end || v[0] == '-' || x > 255)
        return mc__set_error(-MC_ECONFIG, "expected pick or an integer in [0, 255]");
    *num_p = x;
    return 0;
}

/* MC_MTU: "port" (0: the port's active MTU) or a power of two from 256 to 4096. */
static int parse_mtu(const char *v, uint64_t *num_p)
{
    char *end;
    unsigned long x = strtoul(v, &end, 10);

    if (!strcmp(v, "port")) {
        *num_p = 0;
        return 0;
    }
    if (!*v || *end || x < 256 || x > 4096 || (x & (x - 1)))
        return mc__set_error(-MC_ECONFIG, "expected port, 256, 512, 1024, 2048 or 4096");
    *num_p = x;
    return 0;
}

static const mc_setting_t rdma_settings[] = {
    {"IB_PORT", "1", 1, 255, NULL, "port of every RDMA device"},
    {"GID_INDEX", "pick", 0, 0, parse_gid,
     "GID index; pick: the first RoCE v2 GID with an IPv4 address, else RoCE v2, else 0"},
    {"MTU", "port", 0, 0, parse_mtu, "path MTU cap (256-4096); port: the port's active MTU"},
    {"RDMA_QP_DEPTH", "64", 1, 4096, NULL, "slices in flight per QP"},
    {"RDMA_MAX_QPS", "256", 1, 65536, NULL, "QPs this engine initiates over all peers"},
    {0},
};

static void rdma_reap(mc_engine_t *e)
{
    mc__rdma_msg_reap(e, false);
}

const mc_transport_ops_t mc__rdma_ops = {
    .size = sizeof(mc_transport_ops_t),
    .name = "rdma",
    .slot = &mc__rdma_slot,
    .codec = &mc__rdma_codec,
    .settings = rdma_settings,
    .init = rdma_init,
    .stop = rdma_stop,
    .fini = rdma_fini,
    .encode = rdma_encode,
    .encode_buffer = rdma_encode_buffer,
    .key_pack = rdma_key_pack,
    .mem_register = mc__rdma_mr_register,
    .mem_deregister = mc__rdma_mr_deregister,
    .peer_update = rdma_peer_update,
    .peer_close = rdma_peer_close,
    .accept = rdma_accept,
    .fill = mc__rdma_fill,
    .ctrl_recv = mc__rdma_ctrl_recv,
    .ctrl_reply = mc__rdma_ctrl_reply,
    .link_lost = mc__rdma_link_lost,
    .msg_open = mc__rdma_msg_open,
    .msg_settle = mc__rdma_msg_settle,
    .msg_lending = mc__rdma_msg_lending,
    .progress = mc__rdma_msg_progress,
    .reap = rdma_reap,
    .idle = mc__rdma_msg_idle,
    .abandon = mc__rdma_abandon,
    .reap_marked = true,
};

void mc__rdma_rail_failed(mc_peer_t *p, rdma_rail_t *r, bool connecting)
{
    rdma_peer_t *rp = rdma_peer(p);
    uint64_t now = mc__now_ns();
    bool others = false;

    for (unsigned i = 0; i < rp->n_rails && !others; i++)
        others = &rp->rails[i] != r && mc__rail_usable(&rp->rails[i].base, now);
    mc__rail_failed(&r->base, now, connecting, !others);
}
