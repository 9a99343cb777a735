/*
 * RDMA transport internals (ibverbs RC).
 *
 * Devices: every RDMA device of the priority matrix whose port MC_IB_PORT is active, each with a
 * PD and one CQ whose completion channel sits in the engine's epoll (no thread per QP). Every
 * registered buffer has memory regions on every device (pieces of at most the smallest max MR
 * size), published as rkeys in the segment descriptor.
 *
 * Rails: a peer's rdma rails are pairs (our device, its device) on the same link layer, each
 * with at most one RC QP, created when a slice needs it and connected with a control request
 * to the peer's rdma transport over the control link (mc__ctrl_request: our LID/GID/QPN/PSN/MTU
 * out, its own back). Both ends' QPs are bound to that link and go with it; the target itself
 * stays passive.
 *
 * Slices become RDMA WRITE/READ work requests: one per slice unless it crosses a memory-region
 * boundary, chained per QP and posted once per fill pass (one doorbell per batch), at most
 * MC_RDMA_QP_DEPTH slices per QP and never more than the CQ holds. A completion error fails
 * the slice back to the scheduler: a remote access error (bad rkey or range) fails its task,
 * anything else retries it on another rail, pauses the failing one (mc__rail_failed) and
 * drains the QP (flushed requests are retried too); a drained QP is destroyed and the rail
 * re-probed later with a new one.
 *
 * Messages (rdma_msg.c) go through a ring in the receiver's registered memory, written with RDMA
 * WRITE on one QP per peer (the first one set up), the consumed position coming back the same
 * way; both ends' QPs then also hold receives and message work requests (msg_out).
 */
#ifndef MC_RDMA_INT_H
#define MC_RDMA_INT_H

#include <infiniband/verbs.h>

#include "../transport.h"

#define MC_RDMA_MAX_DEVS   8
#define MC_RDMA_CQ_MAX     65536
#define MC_RDMA_INBOUND_QP (4 * MC_MAX_RAILS) /* QPs one control link may set up here */

extern unsigned mc__rdma_slot;

typedef struct mc_rdma_dev {
    mc_pollable_t cq_poll;    /* first: epoll hands us this pointer (completion channel) */
    mc_pollable_t async_poll; /* async events (port up/down, QP fatal) */
    char name[64];
    unsigned index; /* in the engine's devices and in our descriptor */
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
    int access;                /* memory region access flags */
    unsigned rd_init, rd_resp; /* RDMA READs in flight it may issue on a QP, and take as target */
    bool port_down;            /* since IBV_EVENT_PORT_ERR, until IBV_EVENT_PORT_ACTIVE */
    bool fatal;                /* IBV_EVENT_DEVICE_FATAL: its ports stay down */
} mc_rdma_dev_t;

/* The memory regions of one local buffer (b->tp[mc__rdma_slot]): mr[dev * n_chunks + chunk]. */
typedef struct mc_rdma_mrs {
    uint64_t chunk;
    uint32_t n_chunks;
    unsigned n_devs;
    struct ibv_mr *mr[];
} mc_rdma_mrs_t;

/* An RDMA device of a peer, as its descriptor publishes it. */
typedef struct rdma_desc_dev {
    char name[64];
    uint8_t link; /* IBV_LINK_LAYER_INFINIBAND or _ETHERNET */
    uint16_t lid;
    uint8_t gid[16];
} rdma_desc_dev_t;

/* d->tp[mc__rdma_slot]: the peer's devices. */
typedef struct rdma_desc {
    rdma_desc_dev_t devs[MC_RDMA_MAX_DEVS];
    unsigned n;
} rdma_desc_t;

/* A peer buffer's rkeys (mc__desc_part): rkey[dev * n_chunks + chunk], each region covering
 * chunk bytes (the last one less). */
typedef struct rdma_desc_buf {
    uint64_t chunk;
    uint32_t n_chunks;
    uint32_t n_devs;
    uint32_t rkey[];
} rdma_desc_buf_t;

typedef struct mc_rdma_qp mc_rdma_qp_t;
typedef struct rdma_msg_tx rdma_msg_tx_t;
typedef struct rdma_msg_rx rdma_msg_rx_t;

/* One rail: our device ldev and the peer's rdev, and the QP between them (progress-owned). */
typedef struct rdma_rail {
    mc_rail_t base;
    uint8_t ldev, rdev;
    bool crossed; /* not a same-index pair: ranks after those */
    mc_rdma_qp_t *qp;
} rdma_rail_t;

/* p->tp[mc__rdma_slot] */
typedef struct rdma_peer {
    rdma_rail_t rails[MC_MAX_RAILS];
    unsigned n_rails;
    mc_rdma_qp_t *msg_qp; /* the QP set up to carry our messages to it, if any */
    bool msg_off;         /* it did not take a message ring: they stay on the control link */
    /* No rail to it is up or may connect before this time (UINT64_MAX: each one is on a dead
     * device of ours; 0: one is up, or may connect): its tasks go to the next transport
     * meanwhile (mc__rdma_fill). Written by progress, read by rdma_accept in any thread. */
    _Atomic uint64_t down_until;
} rdma_peer_t;

enum mc_qp_state { QP_CONNECTING, QP_READY, QP_DRAINING };

struct mc_rdma_qp {
    mc_list_t link;        /* initiator: e's qps; then nothing */
    mc_link_bound_t bound; /* on the control link it was set up over (both ends) */
    struct ibv_qp *qp;
    mc_rdma_dev_t *dev;
    mc_peer_t *peer;           /* initiator */
    rdma_rail_t *rail;         /* initiator */
    mc_slice_t *connect_slice; /* its request awaiting an answer: unlinked if qp goes first */
    uint8_t state;
    bool initiator;
    unsigned outstanding; /* work requests posted, not completed */
    mc_list_t posted;     /* initiator: the slices they are of (rdma_slice_t.on_qp) */
    uint32_t psn;
    uint16_t pair; /* target: initiator device << 8 | ours; a new QP for a pair replaces it */
    /* The chain being built in this fill pass (posted by rdma_post_all). */
    struct ibv_send_wr *head, *tail;
    mc_list_t post_link; /* in to_post while it has a chain */
    rdma_msg_tx_t *mtx;  /* initiator: it carries messages to its peer */
    rdma_msg_rx_t *mrx;  /* target: it carries messages from the initiator */
    unsigned msg_out;    /* message work requests and receives posted, not completed */
};

/* A QP is destroyed once nothing it posted is left. */
static inline bool mc__rdma_qp_busy(const mc_rdma_qp_t *qp)
{
    return qp->outstanding || qp->msg_out;
}

/* wr_id of a work request: a slice (low bits 0), or a QP's message work: its pointer | kind
 * (MSG_SEND: a ring write on the initiator, a consumed-position update on the target). */
#define MC_RDMA_WR_KIND     7u
#define MC_RDMA_WR_MSG_SEND 1u
#define MC_RDMA_WR_MSG_RECV 2u

#define MC_RDMA_SCRATCH 512 /* work requests built per fill pass before posting */
/* Send queue entries beyond MC_RDMA_QP_DEPTH: a slice may start while fewer than DEPTH requests
 * are out, and one crossing a memory-region boundary on each side needs three. */
#define MC_RDMA_SQ_SLACK 2

/* e->tp[mc__rdma_slot] */
typedef struct mc_rdma {
    unsigned qp_depth; /* MC_RDMA_QP_DEPTH: slices in flight per QP */
    unsigned max_qps;  /* MC_RDMA_MAX_QPS: QPs this engine initiates, all peers */
    unsigned mtu;      /* MC_MTU: 0 = the port's */
    int gid_index;     /* MC_GID_INDEX: -1 = pick */
    mc_rdma_dev_t devs[MC_RDMA_MAX_DEVS];
    unsigned n_devs;
    uint64_t chunk; /* memory-region piece size: the smallest max MR size, page-aligned */
    mc_list_t qps;  /* initiator QPs */
    unsigned n_qps; /* initiator QPs, against MC_RDMA_MAX_QPS */
    mc_list_t to_post;
    struct ibv_send_wr wr[MC_RDMA_SCRATCH];
    struct ibv_sge sge[MC_RDMA_SCRATCH];
    unsigned n_wr;
    mc_list_t msg_rx;      /* rdma_msg_rx_t of target QPs receiving messages */
    mc_list_t msg_rx_lent; /* ... of QPs stopped, while records of their rings are lent */
} mc_rdma_t;

/* The per-slice state of a slice on a QP. */
typedef struct rdma_slice {
    mc_rdma_qp_t *qp;      /* the QP it is posted on */
    const char *wc_reason; /* the first completion error among its work requests */
    int wc_err;            /* ... as a code (negative), 0 if none */
    uint16_t wrs;          /* work requests not yet completed */
    mc_list_t on_qp;       /* in its QP's posted while wrs */
} rdma_slice_t;
_Static_assert(sizeof(rdma_slice_t) <= MC_SLICE_PRIV, "rdma_slice_t does not fit in a slice");

static inline rdma_slice_t *rdma_sl(mc_slice_t *s)
{
    return (rdma_slice_t *)(void *)s->priv;
}

static inline mc_slice_t *rdma_sl_of(mc_list_t *on_qp)
{
    return (mc_slice_t *)(void *)((char *)mc_container_of(on_qp, rdma_slice_t, on_qp) -
                                  offsetof(mc_slice_t, priv));
}

static inline mc_rdma_t *rdma_of(mc_engine_t *e)
{
    return e->tp[mc__rdma_slot];
}

static inline rdma_peer_t *rdma_peer(mc_peer_t *p)
{
    return p->tp[mc__rdma_slot];
}

/* A failure of rail r of peer p (mc__rail_failed): the last if no other rail of p may connect,
 * so that a peer's only rail is never paused (that would stop its traffic for up to 30 s). */
void mc__rdma_rail_failed(mc_peer_t *p, rdma_rail_t *r, bool connecting);

/* The QP set-up request and answer: one end of an RC connection. dev: the sender's device (its
 * index in the sender's descriptor); peer_dev: the receiver's device the QP is for. mtu in
 * bytes; the target answers with the one both use. */
#define MC_QP_INFO_LEN     32
#define MC_QP_INFO_MSG_LEN 52 /* with the message part */
typedef struct mc_qp_info {
    uint8_t dev, peer_dev, link;
    uint8_t rd_resp; /* READs in flight the sender's QP takes as target (0: an older peer's) */
    uint16_t lid, mtu;
    uint32_t qpn, psn; /* 24-bit values */
    uint8_t gid[16];
    /* The message part (msg set). Request: the initiator's consumed-position cell and its
     * stream; answer: the target's ring, its size (low 32 bits of arg) and receives (high). */
    bool msg;
    uint32_t msg_rkey;
    uint64_t msg_addr, msg_arg;
} mc_qp_info_t;

/* Its length: MC_QP_INFO_LEN, or MC_QP_INFO_MSG_LEN with the message part. */
size_t mc__rdma_qp_info_encode(const mc_qp_info_t *q, uint8_t out[MC_QP_INFO_MSG_LEN]);
/* -MC_EPROTO (reason set) unless len is one of those and the values are in range. */
int mc__rdma_qp_info_decode(const uint8_t *in, size_t len, mc_qp_info_t *q);

/* rdma_qp.c. msg: room for message work requests and receives. */
mc_rdma_qp_t *mc__rdma_qp_create(mc_engine_t *e, mc_rdma_dev_t *dev, bool initiator, bool msg);
int mc__rdma_qp_connect(mc_engine_t *e, mc_rdma_qp_t *qp, const mc_qp_info_t *remote);
void mc__rdma_qp_info(const mc_rdma_qp_t *qp, mc_qp_info_t *q);
/* A READ of t times out or fails: the QPs holding its requests go (transport op abandon). */
void mc__rdma_abandon(mc_engine_t *e, mc_task_t *t);
/* Stop using qp: to ERR so that posted requests flush; destroyed once none is left. */
void mc__rdma_qp_drain(mc_engine_t *e, mc_rdma_qp_t *qp);
void mc__rdma_qp_destroy(mc_engine_t *e, mc_rdma_qp_t *qp);
/* Start connecting the rail's QP over the control link (creating the QP). */
void mc__rdma_rail_connect(mc_engine_t *e, mc_peer_t *p, rdma_rail_t *r);
/* Build p's rails: device pairs on a common link layer. */
void mc__rdma_rails_build(mc_engine_t *e, mc_peer_t *p);
int mc__rdma_ctrl_recv(mc_engine_t *e, mc_link_t *l, const void *req, size_t len, void *ans,
                       size_t *ans_len);

/* rdma_msg.c. Message work requests and receives per QP (sizes of its queues). */
#define MC_RDMA_MSG_SQ     8  /* initiator: ring writes in flight */
#define MC_RDMA_MSG_UPD    4  /* target: consumed-position updates in flight */
#define MC_RDMA_MSG_TX_RCV 32 /* initiator: receives for the updates */
#define MC_RDMA_MSG_RX_RCV 64 /* target: receives for the writes (the initiator's credits) */
/* Initiator: make qp (not connected yet) carry p's messages: its ring mirror and the cell the
 * target writes, receives posted, the message part of *info set. */
int mc__rdma_msg_tx_create(mc_engine_t *e, mc_rdma_qp_t *qp, mc_peer_t *p, mc_qp_info_t *info);
/* Initiator: qp is connected; remote is the target's answer (without a message part: it took
 * no ring, and p's messages stay on the control link). */
void mc__rdma_msg_tx_ready(mc_engine_t *e, mc_rdma_qp_t *qp, const mc_qp_info_t *remote);
/* Target: a ring for the messages qp brings from l's peer (request in), receives posted, the
 * message part of *out set. */
int mc__rdma_msg_rx_create(mc_engine_t *e, mc_rdma_qp_t *qp, const mc_link_t *l,
                           const mc_qp_info_t *in, mc_qp_info_t *out);
/* qp starts draining: what its ring held that the receiver took is answered, the rest goes
 * back to the control link; a receiving ring stops. */
void mc__rdma_msg_stop(mc_engine_t *e, mc_rdma_qp_t *qp);
/* qp is destroyed: free its message state. */
void mc__rdma_msg_free(mc_engine_t *e, mc_rdma_qp_t *qp);
void mc__rdma_msg_complete(mc_engine_t *e, mc_rdma_dev_t *dev, const struct ibv_wc *wc);
bool mc__rdma_msg_open(mc_engine_t *e, mc_peer_t *p);
/* Whether qp has no message of ours in flight (it may be closed to make room for another). */
bool mc__rdma_msg_tx_idle(const mc_rdma_qp_t *qp);
void mc__rdma_msg_fill(mc_engine_t *e, mc_peer_t *p);
void mc__rdma_msg_settle(mc_engine_t *e, mc_peer_t *p);
void mc__rdma_msg_progress(mc_engine_t *e);
/* The reap: records given back by their handlers are told to their senders; the rings of QPs
 * gone are freed once they lend nothing (all: whatever they lend, at the end). */
void mc__rdma_msg_reap(mc_engine_t *e, bool all);
bool mc__rdma_msg_lending(mc_engine_t *e, uint64_t stream);
bool mc__rdma_msg_idle(mc_engine_t *e);
void mc__rdma_ctrl_reply(mc_engine_t *e, mc_slice_t *s, mc_link_t *l, int status, const void *ans,
                         size_t len);
void mc__rdma_link_lost(mc_engine_t *e, mc_link_bound_t *b);

/* rdma_vram.c */
struct ibv_mr *mc__rdma_vram_reg(mc_rdma_dev_t *d, uint64_t addr, uint64_t len, char *why,
                                 size_t size);

/* rdma.c */
int mc__rdma_mr_register(mc_engine_t *e, mc_buffer_t *b);
void mc__rdma_mr_deregister(mc_engine_t *e, mc_buffer_t *b);

/* rdma_post.c */
void mc__rdma_fill(mc_engine_t *e, mc_peer_t *p);
void mc__rdma_complete(mc_engine_t *e, mc_rdma_dev_t *dev, const struct ibv_wc *wc);
/* Engine teardown: collect the flushed requests of every QP. */
void mc__rdma_drain_all(mc_engine_t *e);

/* rdma_desc.c: its part of descriptors */
extern const mc_desc_codec_t mc__rdma_codec;

#endif
