/*
 * TCP transport internals. tcp is also the control transport: its connections are the control
 * links that carry handshakes, messages and other transports' control requests.
 *
 * Each peer has up to MC_TCP_CONNS outbound connections per rail; this engine initiates
 * requests on them (WRITE with data, READ) and the peer answers each in order (WRITE_ACK,
 * READ_RESP); control requests of other transports are answered by id, in any order relative to
 * the rest (one answered later, MC_CTRL_LATER, lets the responses after it pass). Inbound
 * connections are the mirror image: we serve requests against our registration table. Payloads move
 * straight between sockets and registered memory (writev / recv into place); small frames are
 * parsed out of a per-connection staging buffer so that a batch of small requests costs few
 * syscalls.
 *
 * A rail pairs one of our listen addresses with a peer endpoint on the same IPv4 /24; its
 * connections bind to our address so traffic leaves through that link.
 *
 * A connection that fails is closed before its slices are retried elsewhere, and the target is
 * told (RETIRE, or the retire list of a later HELLO) to drop whatever of it is still unread, so
 * a late duplicate can never overwrite newer data.
 */
#ifndef MC_TCP_INT_H
#define MC_TCP_INT_H

#include <sys/socket.h>

#include "../../util/sockaddr.h"
#include "../transport.h"
#include "tcp_proto.h"

#define MC_TCP_RX_BUF    (64 * 1024)
#define MC_TCP_RX_DIRECT (16 * 1024) /* payload left at least this large: recv into place */
#define MC_TCP_RESP_MAX  1024        /* inbound: queued responses before we stop reading */
#define MC_TCP_IOV_MAX   128
/* The kernel gives up on a peer whose host stops answering after this x MC_IO_TIMEOUT_MS. */
#define MC_TCP_LIVENESS_FACTOR 10
#define MC_TCP_ACCEPT_PAUSE_MS 100 /* out of descriptors: accept nothing for this long */
#define MC_TCP_RECHECKS        3   /* reconnections after handshakes cut short, in a row */

extern unsigned mc__tcp_slot;

/* A MSG_DONE to send (tcp_msg.c). */
typedef struct tcp_done {
    uint64_t stream, seq;
} tcp_done_t;

/* e->tp[mc__tcp_slot] */
typedef struct tcp_engine {
    unsigned conns_per_rail; /* MC_TCP_CONNS */
    unsigned window;         /* MC_TCP_WINDOW: requests in flight per connection */
    unsigned max_conns;      /* MC_MAX_CONNS: outbound connections, all peers */
    mc_pollable_t listens[MC_MAX_RAILS];
    char listen_addrs[MC_MAX_RAILS][MC_NAME_MAX];
    unsigned n_listens;
    mc_list_t inbound; /* inbound connections, oldest first */
    unsigned n_inbound;
    unsigned max_inbound;      /* MC_MAX_INBOUND */
    uint64_t accept_resume_ns; /* accepting is paused until then (0: it is not) */
    uint64_t accept_said_ns;   /* the next accept failure is logged from then on */
    unsigned accept_errors;    /* accept failures since the last one logged */
    unsigned n_outbound;
    uint32_t next_conn_id;
    uint32_t next_cookie;
    mc_list_t graveyard;  /* connections freed at the end of the pass (tcp_reap) */
    mc_list_t acks_later; /* connections whose message answers go at the end of the pass
                           * (tcp_reap), after what the handlers sent: not in their way */
    uint64_t msg_rx_seq;  /* messages received (the connections' msg_rx_seq) */
    uint32_t inbound_gen; /* inbound connections that became ready (tcp_msg.c looks again) */
    mc_list_t acks_held;  /* connections with only answers to send, held for one pass: a
                           * reply sent meanwhile takes them along */
    tcp_done_t *dones;    /* streams to tell that handlers ran, up to seq (tcp_msg.c) */
    unsigned n_dones, cap_dones;
} tcp_engine_t;

/* One rail: our address on a link and one of the peer's endpoints. */
typedef struct tcp_rail {
    mc_rail_t base;
    bool refused;      /* its last connect was refused: nothing listens there */
    bool recheck;      /* a connection was closed during its handshake: connect again at once */
    unsigned rechecks; /* ... done since its last ready connection (MC_TCP_RECHECKS at most) */
    struct sockaddr_storage local, remote; /* protected by e->peers_lock (reload) */
    socklen_t local_len, remote_len;       /* local_len 0: no bind */
} tcp_rail_t;

/* p->tp[mc__tcp_slot] */
typedef struct tcp_peer {
    tcp_rail_t rails[MC_MAX_RAILS]; /* a shrinking endpoint list keeps its old tail */
    unsigned n_rails;
    mc_list_t conns; /* outbound connections of every rail (mc_tcp_conn_t.node) */
    unsigned n_conns;
    /* Ids of torn-down connections that carried requests, oldest first, until the target is
     * known to have dropped them: a connection whose HELLO listed them is ready (tcp_initiator.c,
     * "retire bookkeeping"). */
    uint32_t *retired;
    unsigned n_retired, cap_retired;
    struct mc_tcp_conn *msg_conn;   /* its messages go on it (tcp_msg.c); NULL when it fails */
    uint32_t msg_gen;               /* tcp_engine_t.inbound_gen when msg_conn was chosen */
    struct mc_tcp_conn *order_conn; /* its ORDERED tasks go on it, in order; NULL when it goes */
} tcp_peer_t;

/* d->tp[mc__tcp_slot]: the peer's endpoints, one per interface. */
typedef struct tcp_desc {
    char addrs[MC_MAX_RAILS][MC_NAME_MAX];
    unsigned n;
} tcp_desc_t;

/* The per-slice state of a slice or frame in a connection's queues. */
typedef struct tcp_slice {
    uint8_t hdr[MC_FRAME_HDR_LEN];
    uint32_t cookie;
    mc_buffer_t *ref; /* target side: buffer reference held while the response is sent */
} tcp_slice_t;
_Static_assert(sizeof(tcp_slice_t) <= MC_SLICE_PRIV, "tcp_slice_t does not fit in a slice");

/* Slice kinds of tcp's own: a control frame of its own (hello, retire...), a response, a
 * descriptor request, a message (which await their answer like a data slice; a message's
 * slice points at it: ctx, and offset is the take it belongs to) and a message's answer (a
 * response that may wait a pass for a frame going the same way). */
enum { TCP_SL_FRAME = MC_SL_TP, TCP_SL_RESP, TCP_SL_DESC, TCP_SL_MSG, TCP_SL_ANSWER };

static inline tcp_slice_t *tcp_sl(mc_slice_t *s)
{
    return (tcp_slice_t *)(void *)s->priv;
}

static inline tcp_engine_t *tcp_of(mc_engine_t *e)
{
    return e->tp[mc__tcp_slot];
}

static inline tcp_peer_t *tcp_peer(mc_peer_t *p)
{
    return p->tp[mc__tcp_slot];
}

enum mc_conn_state { CS_CONNECTING, CS_HELLO, CS_AUTH, CS_READY, CS_DEAD };
enum mc_dst_kind { DST_NONE, DST_MEM, DST_CTRL, DST_DISCARD };

typedef struct mc_tcp_conn {
    mc_pollable_t pollable; /* first: epoll hands us this pointer */
    mc_link_t link;         /* the control link it is (peer, remote name, bound state) */
    bool outbound;
    uint8_t state;
    tcp_rail_t *rail; /* outbound only: the path it runs over */
    mc_list_t node;   /* in the peer's conns (outbound) or inbound; then the graveyard */
    uint32_t id;      /* the initiator's connection id */
    /* Its HELLO's connections to retire: inbound, dropped once it is READY; outbound, known
     * dropped by the target then. */
    uint32_t hello_retired[MC_PROTO_MAX_RETIRE];
    uint8_t n_hello_retired;
    char remote_name[MC_NAME_MAX];
    uint8_t nonce[MC_PROTO_NONCE_LEN], peer_nonce[MC_PROTO_NONCE_LEN];
    uint64_t since_ns;   /* creation */
    uint64_t last_io_ns; /* last byte moved, or when work was first queued */
    uint32_t events;     /* current epoll mask */

    mc_list_t sendq;      /* slices to write, in order */
    uint32_t send_off;    /* bytes of the first one already written */
    mc_list_t ackq;       /* slices written, awaiting their response (inbound: messages) */
    unsigned window_used; /* outbound: slices in sendq + ackq that await a response */
    unsigned msgs_out;    /* messages among those (outbound: outside the window) */
    uint64_t msg_rx_seq;  /* when the peer's messages last came on it */
    uint64_t rx_stream;   /* ... their stream */
    unsigned ctrl_out;    /* outbound: other transports' control requests among those (outside
                             the window too: one may be answered late, and the data slices that
                             free what it waits for must not wait behind it) */
    unsigned n_resp;      /* responses in sendq (outbound: answers to messages) */
    mc_list_t later;      /* in acks_later (its answers wait for the end of the pass) */
    bool in_later;
    bool held;       /* in acks_held (through `later`) */
    bool fail_later; /* a send error now only shuts the socket (mc__tcp_ctrl_send) */

    uint8_t *rx; /* staging buffer of MC_TCP_RX_BUF bytes */
    uint32_t rx_start, rx_end;
    bool have_hdr;
    bool expect_large; /* the last payload was large: read headers alone */
    bool rx_drained;   /* this read pass: a short read found the socket empty */
    mc_frame_t fr;
    mc_slice_t *resp; /* outbound: the request the frame being read answers */
    uint8_t dst_kind;
    uint8_t *dst;
    uint64_t left; /* payload bytes of the current frame still to come */
    uint8_t *ctrl; /* control payload (hello, message, reason) */
    uint32_t ctrl_cap, ctrl_len;
    const uint8_t *msg;  /* a MSG frame's payload: in ctrl, or where it lies staged */
    mc_buffer_t *rx_ref; /* inbound WRITE: buffer being written */
    int rx_status;       /* inbound WRITE: refusal code, payload discarded */
    bool rx_read_only;   /* ... because the buffer may only be read */
} mc_tcp_conn_t;

/* An outbound connection was reset or closed before its handshake completed (a listener going
 * away with it queued): connect again at once, a few times in a row at most, to tell a dead
 * peer (refused) from a live one. */
static inline void mc__tcp_handshake_cut(mc_tcp_conn_t *c)
{
    if (c->rail->rechecks < MC_TCP_RECHECKS)
        c->rail->recheck = true;
}

/* tcp_conn.c: connection mechanics */
mc_tcp_conn_t *mc__tcp_conn_new(mc_engine_t *e, int fd, bool outbound);
void mc__tcp_conn_handler(mc_engine_t *e, mc_pollable_t *p, uint32_t events);
void mc__tcp_conn_flush(mc_engine_t *e, mc_tcp_conn_t *c);
void mc__tcp_conn_update_events(mc_engine_t *e, mc_tcp_conn_t *c);
void mc__tcp_conn_fail(mc_engine_t *e, mc_tcp_conn_t *c, int err, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
void mc__tcp_conn_close(mc_engine_t *e, mc_tcp_conn_t *c); /* idle close, no error */
int mc__tcp_conn_ctrl_reserve(mc_engine_t *e, mc_tcp_conn_t *c, uint32_t len);
/* Queue a frame of tcp's own (payload copied). */
int mc__tcp_conn_send_ctrl(mc_engine_t *e, mc_tcp_conn_t *c, const mc_frame_t *f,
                           const void *payload, uint32_t len);
/* Send c's answers to messages at the end of this pass rather than at once. */
void mc__tcp_answer_later(mc_engine_t *e, mc_tcp_conn_t *c);
/* End of a progress pass: send the answers left for it, free the graveyard. */
void mc__tcp_reap(mc_engine_t *e);
/* About to sleep: send the answers held (transport idle op). */
bool mc__tcp_idle(mc_engine_t *e);

/* tcp_initiator.c / tcp_target.c: frame handlers for each role */
int mc__tcp_out_header(mc_engine_t *e, mc_tcp_conn_t *c);
void mc__tcp_out_frame(mc_engine_t *e, mc_tcp_conn_t *c);
void mc__tcp_out_connected(mc_engine_t *e, mc_tcp_conn_t *c);
void mc__tcp_out_failed(mc_engine_t *e, mc_tcp_conn_t *c, int err, const char *reason);
int mc__tcp_in_header(mc_engine_t *e, mc_tcp_conn_t *c);
void mc__tcp_in_frame(mc_engine_t *e, mc_tcp_conn_t *c);
void mc__tcp_in_failed(mc_engine_t *e, mc_tcp_conn_t *c);
/* Give outbound connections of p as many slices as their windows allow; opens connections. */
void mc__tcp_fill(mc_engine_t *e, mc_peer_t *p);
/* The first ready outbound connection to p, or NULL after starting to open one. */
mc_tcp_conn_t *mc__tcp_ctrl_conn(mc_engine_t *e, mc_peer_t *p);

/* tcp_msg.c: messages, on either end of a connection. msgs_send: queue p's messages on its
 * message connection. msg_in: a MSG frame arrived on c (payload in c->ctrl): deliver it and
 * queue its answer. msg_ack_expect: a MSG_ACK header arrived on c: check it answers the oldest
 * message in flight (c->resp set) or fail c. msg_acked: its payload arrived too. msgs_lost: c is
 * failing; the messages among slices (its queues) go back to their peer's queue. */
void mc__tcp_msgs_send(mc_engine_t *e, mc_peer_t *p);
void mc__tcp_msg_in(mc_engine_t *e, mc_tcp_conn_t *c);
int mc__tcp_msg_ack_expect(mc_engine_t *e, mc_tcp_conn_t *c);
void mc__tcp_msg_acked(mc_engine_t *e, mc_tcp_conn_t *c, mc_slice_t *s);
void mc__tcp_msgs_lost(mc_engine_t *e, mc_tcp_conn_t *c, mc_list_t *slices);
/* MC__MSG_LATER (msg.h): msg_handled (the transport op) notes that the sender of stream is to
 * hear that its handlers ran up to seq; dones_send (reap) queues a MSG_DONE for each on the
 * connection its messages came on last; msg_done_in: a MSG_DONE arrived on c. */
void mc__tcp_msg_handled(mc_engine_t *e, uint64_t stream, uint64_t seq);
void mc__tcp_dones_send(mc_engine_t *e);
void mc__tcp_msg_done_in(mc_engine_t *e, mc_tcp_conn_t *c);
/* Whether a connection to p is ready for control requests (else one is being opened). */
bool mc__tcp_ctrl_ready(mc_engine_t *e, mc_peer_t *p);
/* Queue control request s on a ready connection to p (-EAGAIN while none is ready). */
int mc__tcp_ctrl_send(mc_engine_t *e, mc_peer_t *p, mc_slice_t *s, mc_link_t **link_p);
/* Ask p for its descriptor on a ready connection (-EAGAIN while none is ready). */
int mc__tcp_desc_request(mc_engine_t *e, mc_peer_t *p);
/* Answer a deferred control request (transport.h ctrl_answer) on inbound link l. */
int mc__tcp_ctrl_answer(mc_engine_t *e, mc_link_t *l, uint32_t id, int status, const void *ans,
                        size_t len);
/* Accept again once a pause for lack of descriptors is over (timer tick). */
void mc__tcp_accept_resume(mc_engine_t *e, uint64_t now);
/* Listen on every MC_LISTEN address. */
int mc__tcp_listen(mc_engine_t *e);
void mc__tcp_sockopts(mc_engine_t *e, int fd);

/* tcp_rail.c: rails from the peer's endpoints */
void mc__tcp_rails_build(mc_engine_t *e, mc_peer_t *p);

/* tcp_auth.c: handshake proofs, shared by both roles and the one-shot client */
/* HMAC of role, both nonces and the speaker's name under MC_AUTH_TOKEN. 0 or -EIO. */
int mc__tcp_proof(const char *token, const char *role, const uint8_t *a, const uint8_t *b,
                  const char *name, uint8_t out[32]);
/* Blocking one-shot exchange that fetches a descriptor by handshake. */
int mc__tcp_fetch_desc(mc_engine_t *e, const char *addr, char **json_p, size_t *len_p);

/* tcp_desc.c: its part of descriptors */
extern const mc_desc_codec_t mc__tcp_codec;

#endif
