/*
 * TCP transport internals.
 *
 * Each peer has up to MC_TCP_CONNS outbound connections; this engine initiates requests on them
 * (WRITE with data, READ) and the peer answers each in order (WRITE_ACK, READ_RESP). Inbound
 * connections are the mirror image: we serve requests against our registration table.
 * Payloads move straight between sockets and registered memory (writev / recv into place);
 * small frames are parsed out of a per-connection staging buffer so that a batch of small
 * requests costs few syscalls.
 *
 * A connection that fails is closed before its slices are retried elsewhere, and the target is
 * told (RETIRE, or the retire list of a later HELLO) to drop whatever of it is still unread, so
 * a late duplicate can never overwrite newer data.
 */
#ifndef MC_TCP_INT_H
#define MC_TCP_INT_H

#include "../engine_int.h"

#define MC_TCP_RX_BUF    (64 * 1024)
#define MC_TCP_RX_DIRECT (16 * 1024) /* payload left at least this large: recv into place */
#define MC_TCP_RESP_MAX  1024        /* inbound: queued responses before we stop reading */
#define MC_TCP_IOV_MAX   128

enum mc_conn_state { CS_CONNECTING, CS_HELLO, CS_AUTH, CS_READY, CS_DEAD };
enum mc_dst_kind { DST_NONE, DST_MEM, DST_CTRL, DST_DISCARD };

struct mc_tcp_conn {
    mc_pollable_t pollable; /* first: epoll hands us this pointer */
    bool outbound;
    uint8_t state;
    mc_peer_t *peer; /* outbound only */
    mc_rail_t *rail; /* outbound only: the path it runs over */
    mc_list_t link;  /* in peer->conns (outbound) or e->inbound; then e->graveyard */
    uint32_t id;     /* the initiator's connection id */
    uint64_t remote_instance;
    char remote_name[MC_NAME_MAX];
    uint8_t nonce[MC_PROTO_NONCE_LEN], peer_nonce[MC_PROTO_NONCE_LEN];
    uint64_t since_ns;   /* creation */
    uint64_t last_io_ns; /* last byte moved, or when work was first queued */
    uint32_t events;     /* current epoll mask */

    mc_list_t sendq;      /* slices to write, in order */
    uint32_t send_off;    /* bytes of the first one already written */
    mc_list_t ackq;       /* outbound: data slices written, awaiting their response */
    unsigned window_used; /* outbound: data slices in sendq + ackq */
    unsigned n_resp;      /* inbound: responses in sendq */

    uint8_t *rx; /* staging buffer of MC_TCP_RX_BUF bytes */
    uint32_t rx_start, rx_end;
    bool have_hdr;
    bool expect_large; /* the last payload was large: read headers alone */
    mc_frame_t fr;
    uint8_t dst_kind;
    uint8_t *dst;
    uint64_t left; /* payload bytes of the current frame still to come */
    uint8_t *ctrl; /* control payload (hello, message, reason) */
    uint32_t ctrl_cap, ctrl_len;
    mc_list_t qps;       /* rdma QPs set up over this connection (see rdma_int.h) */
    mc_buffer_t *rx_ref; /* inbound WRITE: buffer being written */
    int rx_status;       /* inbound WRITE: refusal code, payload discarded */
};

/* tcp_conn.c: connection mechanics */
mc_tcp_conn_t *mc__tcp_conn_new(mc_engine_t *e, int fd, bool outbound);
void mc__tcp_conn_handler(mc_engine_t *e, mc_pollable_t *p, uint32_t events);
void mc__tcp_conn_flush(mc_engine_t *e, mc_tcp_conn_t *c);
void mc__tcp_conn_update_events(mc_engine_t *e, mc_tcp_conn_t *c);
void mc__tcp_conn_fail(mc_engine_t *e, mc_tcp_conn_t *c, int err, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
void mc__tcp_conn_close(mc_engine_t *e, mc_tcp_conn_t *c); /* idle close, no error */
int mc__tcp_conn_ctrl_reserve(mc_engine_t *e, mc_tcp_conn_t *c, uint32_t len);
/* Queue a control frame (payload copied). */
int mc__tcp_conn_send_ctrl(mc_engine_t *e, mc_tcp_conn_t *c, const mc_frame_t *f,
                           const void *payload, uint32_t len);

/* tcp_initiator.c / tcp_target.c: frame handlers for each role */
int mc__tcp_out_header(mc_engine_t *e, mc_tcp_conn_t *c);
void mc__tcp_out_frame(mc_engine_t *e, mc_tcp_conn_t *c);
void mc__tcp_out_connected(mc_engine_t *e, mc_tcp_conn_t *c);
void mc__tcp_out_failed(mc_engine_t *e, mc_tcp_conn_t *c, int err, const char *reason);
int mc__tcp_in_header(mc_engine_t *e, mc_tcp_conn_t *c);
void mc__tcp_in_frame(mc_engine_t *e, mc_tcp_conn_t *c);
void mc__tcp_in_failed(mc_engine_t *e, mc_tcp_conn_t *c);

void mc__tcp_sockopts(mc_engine_t *e, int fd);
int mc__tcp_listen(mc_engine_t *e);
void mc__format_ip_port(const struct sockaddr_storage *sa, char *buf, size_t size);

/* tcp_auth.c: handshake proofs, shared by both roles and the one-shot client */
/* HMAC of role, both nonces and the speaker's name under MC_AUTH_TOKEN. 0 or -EIO. */
int mc__tcp_proof(const char *token, const char *role, const uint8_t *a, const uint8_t *b,
                  const char *name, uint8_t out[32]);

#endif
