/*
 * RDMA transport internals (ibverbs RC).
 *
 * Devices: every RDMA device of the priority matrix whose port MC_IB_PORT is active, each with a
 * PD and one CQ whose completion channel sits in the engine's epoll (no thread per QP). Every
 * registered buffer has memory regions on every device (pieces of at most the smallest max MR
 * size), published as rkeys in the segment descriptor.
 *
 * Rails: a peer's rdma rails are pairs (our device, its device) on the same link layer, each
 * with at most one RC QP, created when a slice needs it and connected over a tcp connection to
 * the peer (QP_CONNECT / QP_ACCEPT frames: LID/GID/QPN/PSN/MTU). The target's QP belongs to the
 * inbound connection that set it up and goes with it; the target itself stays passive.
 *
 * Slices become RDMA WRITE/READ work requests: one per slice unless it crosses a memory-region
 * boundary, chained per QP and posted once per fill pass (one doorbell per batch), at most
 * MC_RDMA_QP_DEPTH slices per QP and never more than the CQ holds. A completion error fails
 * the slice back to the scheduler: a remote access error (bad rkey or range) fails its task,
 * anything else retries it on another rail, pauses the failing one (mc__rail_failed) and
 * drains the QP (flushed requests are retried too); a drained QP is destroyed and the rail
 * re-probed later with a new one.
 */
#ifndef MC_RDMA_INT_H
#define MC_RDMA_INT_H

#include <infiniband/verbs.h>

#include "tcp_int.h"

#define MC_RDMA_CQ_MAX     65536
#define MC_RDMA_INBOUND_QP (4 * MC_MAX_RAILS) /* QPs one inbound connection may set up */

typedef struct mc_rdma_dev {
    mc_pollable_t cq_poll;    /* first: epoll hands us this pointer (completion channel) */
    mc_pollable_t async_poll; /* async events (port up/down, QP fatal) */
    char name[64];
    unsigned index; /* in e->rdma->devs and in our descriptor */
    struct ibv_context *ctx;
    struct ibv_pd *pd;
    struct ibv_comp_channel *ch;
    struct ibv_cq *cq;
    unsigned cq_size, cq_used; /* cq_used: work requests posted, not yet completed */
    uint8_t port, link;
    int gid_index;
    union ibv_gid gid;
    uint16_t lid;
    uint16_t mtu; /* bytes: the port's active MTU, capped by MC_MTU */
    uint64_t max_mr;
    int access; /* memory region access flags */
    unsigned max_rd_atomic;
    bool port_down; /* since IBV_EVENT_PORT_ERR, until IBV_EVENT_PORT_ACTIVE */
} mc_rdma_dev_t;

/* The memory regions of one buffer: mr[dev * n_chunks + chunk]. */
typedef struct mc_rdma_mrs {
    uint64_t chunk;
    uint32_t n_chunks;
    unsigned n_devs;
    struct ibv_mr *mr[];
} mc_rdma_mrs_t;

enum mc_qp_state { QP_CONNECTING, QP_READY, QP_DRAINING };

struct mc_rdma_qp {
    mc_list_t link;      /* e->rdma->qps (initiator), ctrl->qps (target); then rdma->grave */
    mc_list_t ctrl_link; /* initiator: in ctrl->qps */
    struct ibv_qp *qp;
    mc_rdma_dev_t *dev;
    mc_peer_t *peer;           /* initiator */
    mc_rail_t *rail;           /* initiator */
    mc_tcp_conn_t *ctrl;       /* the tcp connection it was set up over (NULL once that is gone) */
    mc_slice_t *connect_slice; /* its QP_CONNECT awaiting an answer: unlinked if qp goes first */
    uint8_t state;
    bool initiator;
    unsigned outstanding; /* work requests posted, not completed */
    uint32_t psn;
    uint16_t pair; /* target: initiator device << 8 | ours; a new QP for a pair replaces it */
    /* The chain being built in this fill pass (posted by rdma_post_all). */
    struct ibv_send_wr *head, *tail;
    mc_list_t post_link; /* in rdma->to_post while it has a chain */
};

#define MC_RDMA_SCRATCH 512 /* work requests built per fill pass before posting */
/* Send queue entries beyond MC_RDMA_QP_DEPTH: a slice may start while fewer than DEPTH requests
 * are out, and one crossing a memory-region boundary on each side needs three. */
#define MC_RDMA_SQ_SLACK    2
#define MC_RDMA_STAGE_SLOTS 64 /* staging slots of MC_SLICE_SIZE for VRAM without GPUDirect */

struct mc_rdma {
    mc_rdma_dev_t devs[MC_RDMA_MAX_DEVS];
    unsigned n_devs;
    uint64_t chunk;  /* memory-region piece size: the smallest max MR size, page-aligned */
    mc_list_t qps;   /* initiator QPs */
    unsigned n_qps;  /* initiator QPs, against MC_RDMA_MAX_QPS */
    mc_list_t grave; /* QPs to destroy at the end of the pass */
    mc_list_t to_post;
    struct ibv_send_wr wr[MC_RDMA_SCRATCH];
    struct ibv_sge sge[MC_RDMA_SCRATCH];
    unsigned n_wr;
    struct mc_rdma_stage *stage; /* created on first use (rdma_vram.c) */
};

/* rdma_qp.c */
mc_rdma_qp_t *mc__rdma_qp_create(mc_engine_t *e, mc_rdma_dev_t *dev, bool initiator);
int mc__rdma_qp_connect(mc_engine_t *e, mc_rdma_qp_t *qp, const mc_qp_info_t *remote);
void mc__rdma_qp_info(const mc_rdma_qp_t *qp, mc_qp_info_t *q);
/* Stop using qp: to ERR so that posted requests flush; destroyed once none is left. */
void mc__rdma_qp_drain(mc_engine_t *e, mc_rdma_qp_t *qp);
void mc__rdma_qp_destroy(mc_engine_t *e, mc_rdma_qp_t *qp);
/* Start connecting the rail's QP over a control connection (creating the QP). */
void mc__rdma_rail_connect(mc_engine_t *e, mc_peer_t *p, mc_rail_t *r);

/* rdma_vram.c */
struct ibv_mr *mc__rdma_vram_reg(mc_rdma_dev_t *d, uint64_t addr, uint64_t len, char *why,
                                 size_t size);
int mc__rdma_stage_get(mc_engine_t *e, mc_slice_t *s, const mc_buffer_t **buf_p, uint64_t *addr_p);
int mc__rdma_stage_put(mc_engine_t *e, mc_slice_t *s, bool ok);
void mc__rdma_stage_destroy(mc_engine_t *e);

/* rdma_post.c */
void mc__rdma_complete(mc_engine_t *e, mc_rdma_dev_t *dev, const struct ibv_wc *wc);

#endif
