/* softverbs: a userspace software RDMA device behind a stand-in libibverbs.so.1.
 *
 * Internal header shared by the files of the stand-in. The model: every process that opens a
 * device gets a context with one progress thread; every QP owns one AF_UNIX datagram socket
 * bound to an abstract name made of the fabric, the device GUID and the QPN. At RTR the socket
 * is connected to the peer's name. Requests (SEND, WRITE, READ) travel in chunks of at most
 * SV_CHUNK bytes, one PSN per chunk; the responder executes them in PSN order and answers each
 * with an ACK, a NAK or a READ response. The requester keeps at most SV_WINDOW chunks
 * unacknowledged and goes back to the oldest one on timeout (go-back-N).
 *
 * Locking: one mutex per context (ctx->lock) protects every PD, MR, CQ and QP of that context.
 * Application threads take it in the verbs; the progress thread takes it while it handles a
 * batch of events. It is a correctness device, so simplicity wins over speed here.
 */
#ifndef SV_INT_H
#define SV_INT_H

#include <infiniband/verbs.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/un.h>

#define SV_EXPORT __attribute__((visibility("default")))

#define container_of(ptr, type, member) ((type *)((char *)(ptr)-offsetof(type, member)))

#define SV_MAX_DEVICES 16
#define SV_MAX_GIDS    8
#define SV_CHUNK       32768u /* payload bytes per packet (one PSN) */
#define SV_WINDOW      16u    /* unacknowledged packets per QP */
#define SV_MAX_SGE     16
#define SV_MAX_INLINE  256
#define SV_MAX_WR      4096
#define SV_MAX_CQE     65536
#define SV_PSN_MASK    0xffffffu

enum sv_link { SV_LINK_IB, SV_LINK_ETH };

/* One configured device. The table is built once per process from the environment and is the
 * same in every process that uses the same configuration: that is what makes LIDs, GUIDs and
 * GIDs agree between processes. */
struct sv_device {
    struct ibv_device ibdev; /* first: ibv_device pointers are sv_device pointers */
    int index;
    enum sv_link link;
    uint64_t guid; /* host order */
    uint16_t lid;  /* 0 on Ethernet */
    int gid_cnt;
    union ibv_gid gid[SV_MAX_GIDS];
    char netdev[32];
};

/* Fault state of one device, read from the control file <ctl_dir>/<device name>. */
struct sv_fault {
    bool port_down;
    bool fatal;         /* the device is dead: see fault.c */
    unsigned drop_pct;  /* drop this percentage of outgoing packets */
    unsigned delay_ms;  /* hold every outgoing packet this long */
    bool corrupt_rkey;  /* flip bits of the rkey of outgoing WRITE and READ requests */
    unsigned rand_seed; /* protected by ctx->lock */
};

struct sv_delayed;

struct sv_context {
    struct verbs_context vctx; /* first */
    struct sv_device *dev;
    pthread_mutex_t lock;
    pthread_t thread;
    int epfd;
    int kick_fd;  /* eventfd: wakes the progress thread */
    int async_wr; /* write end of the async event pipe; the read end is context.async_fd */
    int inotify_fd;
    bool stopping; /* protected by lock */
    enum ibv_port_state port_state;
    bool fatal; /* IBV_EVENT_DEVICE_FATAL raised: nothing completes again (protected by lock) */
    struct sv_fault fault;
    struct sv_delayed *delayed_head, *delayed_tail; /* protected by lock */
    struct sv_qp *qps;                              /* protected by lock */
    struct sv_mr **mrs;                             /* index = key >> 8; protected by lock */
    uint32_t mr_cap;
    uint32_t key_seq;
    uint8_t *rxbuf; /* progress thread only */
    uint8_t *txbuf; /* gathered payload of one packet; protected by lock */
};

struct sv_pd {
    struct ibv_pd ibpd;
};

struct sv_mr {
    struct ibv_mr ibmr; /* first */
    uint64_t iova;      /* the address RDMA operations use for ibmr.addr */
    int access;
};

struct sv_cq {
    struct ibv_cq ibcq;
    struct ibv_wc *ring; /* protected by ctx->lock */
    uint32_t size;       /* power of two */
    uint32_t head, tail; /* free-running */
    bool armed;
    bool overflow;
};

struct sv_srq {
    struct ibv_srq ibsrq; /* first */
    struct sv_rwqe *rq;   /* protected by ctx->lock */
    uint32_t size, head, tail;
    uint32_t max_sge;
    uint32_t limit; /* armed SRQ limit, 0 when not armed */
};

struct sv_comp_channel {
    struct ibv_comp_channel ch; /* first */
    int wr_fd;                  /* write end; ch.fd is the read end */
};

struct sv_swqe {
    uint64_t wr_id;
    enum ibv_wr_opcode opcode;
    unsigned int flags;
    uint32_t imm; /* network order, as posted */
    uint64_t raddr;
    uint32_t rkey;
    uint64_t len;
    uint32_t first_psn;
    uint32_t npkts;
    enum ibv_wc_status err; /* a local error found when the request was started */
    int num_sge;
    struct ibv_sge sge[SV_MAX_SGE];
    uint8_t inl[SV_MAX_INLINE];
};

struct sv_rwqe {
    uint64_t wr_id;
    int num_sge;
    struct ibv_sge sge[SV_MAX_SGE];
};

struct sv_qp {
    struct ibv_qp ibqp; /* first */
    struct sv_qp *next; /* ctx->qps list */
    int fd;
    struct ibv_qp_attr attr; /* the attributes set so far */
    struct ibv_qp_cap cap;
    bool sq_sig_all;
    bool connected;
    bool want_out; /* EPOLLOUT armed because the socket was full */
    struct sockaddr_un peer;
    socklen_t peer_len;
    /* Requester. Counters are free-running; the ring index is counter & (size - 1). */
    struct sv_swqe *sq;
    uint32_t sq_size, sq_head, sq_cur, sq_tail;
    uint32_t cur_pkt;  /* next packet of sq[sq_cur] to transmit */
    uint32_t psn_next; /* PSN of the next new packet */
    uint32_t psn_una;  /* oldest unacknowledged PSN */
    uint64_t timer_ns; /* retransmit deadline, 0 when idle */
    uint64_t rnr_ns;   /* no transmission before this time after an RNR NAK */
    int retries_left;
    int rnr_left;
    /* Responder. */
    struct sv_rwqe *rq;
    uint32_t rq_size, rq_head, rq_tail;
    uint32_t epsn;           /* expected PSN */
    bool nak_sent;           /* a sequence NAK for epsn was sent */
    bool uc_drop;            /* UC: dropping the rest of a message */
    bool recv_busy;          /* cur_rwqe holds a partly received SEND */
    struct sv_rwqe cur_rwqe; /* taken from the RQ or SRQ at the first packet */
};

/* Wire format. All fields are in host order: both ends run on the same machine. */
enum sv_op {
    SV_OP_SEND = 1,
    SV_OP_WRITE,
    SV_OP_READ_REQ,
    SV_OP_READ_RESP,
    SV_OP_ACK,
    SV_OP_NAK,
};

enum sv_pkt_flags {
    SV_F_FIRST = 1,
    SV_F_LAST = 2,
    SV_F_IMM = 4,
};

enum sv_nak {
    SV_NAK_PSN_SEQ = 1,
    SV_NAK_RNR,
    SV_NAK_INV_REQ,
    SV_NAK_ACCESS,
    SV_NAK_OP_ERR,
};

#define SV_MAGIC 0x53565231u /* "SVR1" */

struct sv_pkt {
    uint32_t magic;
    uint8_t op;
    uint8_t flags;
    uint8_t syndrome;
    uint8_t rnr_timer;
    uint32_t src_qpn;
    uint32_t dst_qpn;
    uint32_t psn;
    uint32_t imm;
    uint32_t rkey;
    uint32_t len; /* payload bytes; for READ_REQ the bytes asked for */
    uint64_t raddr;
    uint64_t msg_off;
    uint64_t msg_len;
};

/* device.c */
int sv_devices_get(struct sv_device **devs_p);
struct sv_device *sv_device_by_lid(uint16_t lid);
struct sv_device *sv_device_by_gid(const union ibv_gid *gid);
const char *sv_fabric(void);
const char *sv_ctl_dir(void);
uint64_t sv_min_timeout_ns(void);
uint64_t sv_max_mr_size(void);
void sv_async_event(struct sv_context *ctx, enum ibv_event_type type, void *element);

/* pd_mr.c */
uint8_t *sv_mr_ptr(struct sv_context *ctx, struct ibv_pd *pd, uint32_t key, uint64_t iova,
                   uint64_t len, int access);
int sv_sge_copy(struct sv_context *ctx, struct ibv_pd *pd, const struct ibv_sge *sge, int nsge,
                uint64_t off, uint8_t *buf, uint64_t n, bool to_sge);
bool sv_sge_valid(struct sv_context *ctx, struct ibv_pd *pd, const struct ibv_sge *sge, int nsge,
                  int access);

/* cq.c */
void sv_cq_push(struct sv_cq *cq, const struct ibv_wc *wc);
void sv_comp_channel_notify(struct ibv_comp_channel *ch, struct ibv_cq *cq);
int sv_poll_cq(struct ibv_cq *ibcq, int num, struct ibv_wc *wc);
int sv_req_notify_cq(struct ibv_cq *ibcq, int solicited_only);

/* qp.c */
int sv_post_send(struct ibv_qp *ibqp, struct ibv_send_wr *wr, struct ibv_send_wr **bad_wr);
int sv_post_recv(struct ibv_qp *ibqp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad_wr);
void sv_qp_fatal(struct sv_qp *qp, enum ibv_wc_status status);
void sv_qp_flush(struct sv_qp *qp);
struct sv_qp *sv_qp_find(struct sv_context *ctx, uint32_t qpn);

/* srq.c */
int sv_post_srq_recv(struct ibv_srq *ibsrq, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad_wr);
bool sv_recv_ready(struct sv_qp *qp);
bool sv_recv_take(struct sv_qp *qp, struct sv_rwqe *r);

/* requester.c */
void sv_req_pump(struct sv_qp *qp);
void sv_req_rx(struct sv_qp *qp, const struct sv_pkt *pkt, const uint8_t *payload);
void sv_req_timer(struct sv_qp *qp, uint64_t now);
uint64_t sv_timeout_ns(const struct sv_qp *qp);
void sv_send_completion(struct sv_qp *qp, struct sv_swqe *w, enum ibv_wc_status status);

/* responder.c */
void sv_resp_rx(struct sv_qp *qp, const struct sv_pkt *pkt, const uint8_t *payload);

/* progress.c */
int sv_progress_start(struct sv_context *ctx);
void sv_progress_stop(struct sv_context *ctx);
void sv_progress_kick(struct sv_context *ctx);
int sv_qp_watch(struct sv_qp *qp, bool want_out);
void sv_qp_unwatch(struct sv_qp *qp);
int sv_pkt_send(struct sv_qp *qp, struct sv_pkt *pkt, const void *payload);
uint64_t sv_now_ns(void);

/* fault.c */
int sv_fault_open(struct sv_context *ctx);
void sv_fault_close(struct sv_context *ctx);
void sv_fault_reload(struct sv_context *ctx);
void sv_fault_sync(struct sv_context *ctx);
bool sv_fault_filter_tx(struct sv_context *ctx, struct sv_pkt *pkt);
int sv_fault_delay(struct sv_qp *qp, const struct sv_pkt *pkt, const void *payload);
uint64_t sv_fault_next_ns(struct sv_context *ctx);
void sv_fault_flush_delayed(struct sv_context *ctx, uint64_t now);
void sv_fault_drop_delayed(struct sv_context *ctx, uint32_t qpn);
int sv_raw_send(int fd, const struct sv_pkt *pkt, const void *payload);

static inline struct sv_context *sv_ctx(struct ibv_context *ibctx)
{
    return container_of(ibctx, struct sv_context, vctx.context);
}

static inline struct sv_qp *sv_qp(struct ibv_qp *ibqp)
{
    return container_of(ibqp, struct sv_qp, ibqp);
}

static inline struct sv_srq *sv_srq(struct ibv_srq *ibsrq)
{
    return container_of(ibsrq, struct sv_srq, ibsrq);
}

static inline struct sv_cq *sv_cq(struct ibv_cq *ibcq)
{
    return container_of(ibcq, struct sv_cq, ibcq);
}

/* PSN distance a - b in the 24-bit sequence space, as a signed number. */
static inline int32_t sv_psn_diff(uint32_t a, uint32_t b)
{
    return (int32_t)((a - b) << 8) >> 8;
}

static inline uint32_t sv_psn_add(uint32_t a, uint32_t n)
{
    return (a + n) & SV_PSN_MASK;
}

#endif
