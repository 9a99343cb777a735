/*
 * The tcp transport's wire protocol: a fixed 32-byte little-endian header before every frame,
 * then `length` payload bytes. Every length is checked against a per-type limit before anything
 * is allocated or read. See DESIGN.md "Wire protocol". Pure codecs, fuzzed (fuzz/fuzz_frame.c).
 *
 *   0  u32 magic "MCTE"   4  u8 version   5  u8 type   6  u16 flags
 *   8  u32 length        12  u32 id      16  u64 addr  24  u64 aux
 *
 * Connection: HELLO -> HELLO_REPLY [-> AUTH -> READY]; then requests flow initiator -> target
 * and responses come back in request order on the same connection.
 */
#ifndef MC_TCP_PROTO_H
#define MC_TCP_PROTO_H

#include <stddef.h>
#include <stdint.h>

#define MC_PROTO_MAGIC      0x4554434du /* bytes 'M' 'C' 'T' 'E' */
#define MC_PROTO_VERSION    3           /* 3: MSG_ACK_LATER and MSG_DONE */
#define MC_FRAME_HDR_LEN    32
#define MC_PROTO_MAX_DATA   (64u << 20) /* largest slice payload */
#define MC_PROTO_MAX_CTRL   1024u       /* hello, errors, acks with a reason */
#define MC_PROTO_NONCE_LEN  32
#define MC_PROTO_MAX_RETIRE 64 /* conn ids in one RETIRE frame */

enum mc_frame_type {
    MC_FR_HELLO = 1,   /* id = connection id; payload = mc_hello_t */
    MC_FR_HELLO_REPLY, /* flags = MC_HELLO_*; payload = mc_hello_t */
    MC_FR_AUTH,        /* payload = HMAC proof */
    MC_FR_READY,
    MC_FR_ERROR,      /* aux = negative error code; payload = reason; the sender then closes */
    MC_FR_WRITE,      /* id = cookie, addr = target address; payload = data */
    MC_FR_WRITE_ACK,  /* id = cookie, aux = status; payload = reason if status != 0 */
    MC_FR_READ,       /* id = cookie, addr = target address, aux = length */
    MC_FR_READ_RESP,  /* id = cookie, aux = status; payload = data, or reason if status != 0 */
    MC_FR_MSG,        /* flags = handler id, id = cookie, addr = seq, aux = stream; payload */
    MC_FR_DESC_REQ,   /* id = cookie; ask for the target's segment descriptor */
    MC_FR_DESC_REPLY, /* id = cookie; payload = descriptor JSON */
    MC_FR_RETIRE,     /* payload = u32 connection ids of this sender to drop unread */
    MC_FR_CTRL_REQ,   /* flags = transport slot, id = cookie; payload = that transport's request */
    MC_FR_CTRL_RESP,  /* id = cookie, aux = status; payload = the answer, or a reason */
    MC_FR_MSG_ACK,    /* id = cookie, aux = status (0, or -EAGAIN: send it again later); flags */
    MC_FR_MSG_DONE,   /* addr = seq, aux = stream: the handlers of that stream's messages up to seq
                         ran (what MSG_ACK_LATER answers promised); no answer */
    MC_FR_TYPE_MAX
};

/* HELLO_REPLY flags */
#define MC_HELLO_AUTH_REQUIRED 0x1
/* MSG_ACK flags: in the receiver's queue, its handler not run yet; a MSG_DONE says when it ran
 * (a receiver with MC_MSG_ACK_AFTER_HANDLER) */
#define MC_MSG_ACK_LATER 0x1

typedef struct mc_frame {
    uint8_t type;
    uint16_t flags;
    uint32_t length;
    uint32_t id;
    uint64_t addr;
    uint64_t aux;
} mc_frame_t;

void mc__tcp_frame_encode(const mc_frame_t *f, uint8_t out[MC_FRAME_HDR_LEN]);

/* Decode and validate a header: magic, version, type, and length against the type's limit
 * (desc_max bounds DESC_REPLY). Returns 0, -MC_EVERSION or -MC_EPROTO (reason set). */
int mc__tcp_frame_decode(const uint8_t in[MC_FRAME_HDR_LEN], uint64_t desc_max, mc_frame_t *f);

const char *mc__tcp_frame_type_name(unsigned type);

/* HELLO / HELLO_REPLY payload: who is speaking and the challenge material. */
typedef struct mc_hello {
    uint64_t instance; /* random per engine instance */
    uint8_t nonce[MC_PROTO_NONCE_LEN];
    uint8_t proof[32];                     /* HELLO_REPLY: target's proof (zero if no auth) */
    char name[128];                        /* speaker's segment name */
    char peer_name[128];                   /* HELLO: the segment the initiator expects */
    uint64_t retired[MC_PROTO_MAX_RETIRE]; /* HELLO: connection ids to drop (low 32 bits) */
    unsigned n_retired;
} mc_hello_t;

/* Encode into buf (size >= MC_PROTO_MAX_CTRL). Returns the length. */
size_t mc__tcp_hello_encode(const mc_hello_t *h, uint8_t *buf);
/* Decode; -MC_EPROTO on any inconsistency (reason set). */
int mc__tcp_hello_decode(const uint8_t *buf, size_t len, mc_hello_t *h);

#endif
