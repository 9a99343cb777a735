/*
 * Message rings: records of messages in memory one side writes and the other reads, for the
 * transports that carry messages faster than the control link (shm: a ring in shared memory;
 * rdma: a ring in the receiver's registered memory, written with RDMA WRITE).
 *
 * A record is {u32 len, u8 id, u64 seq} and the payload, padded to 16 bytes; one that would
 * cross the end leaves a skip record there and starts at the beginning. The sender owns `head`
 * (bytes written), the receiver `tail` (bytes consumed); both only grow, and a position is
 * taken modulo the ring's size. The receiver consumes a record once mc__msg_deliver took it (or
 * saw it before); one it cannot take now stays where it is, so the ring itself is the
 * back-pressure. The sender answers each record once the receiver's tail passed it, in order.
 *
 * Progress context only.
 */
#ifndef MC_MSG_RING_H
#define MC_MSG_RING_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "msg.h"

#define MC_RING_REC_HDR 16u

/* Bytes a record of len payload bytes takes. */
static inline uint64_t mc__ring_rec_bytes(uint32_t len)
{
    return MC_RING_REC_HDR + (((uint64_t)len + 15) & ~(uint64_t)15);
}

/* Write m as a record at *head of the ring data[0, bytes), the receiver having consumed up to
 * tail: 0 with *head moved past it (and past a skip record written first when needed), or
 * -ENOSPC when it does not fit now. */
int mc__ring_put(uint8_t *data, uint64_t bytes, uint64_t *head, uint64_t tail, const mc_msg_t *m);

/* Deliver the records in [*tail, head) of the ring data[0, bytes), from sender's stream, in
 * order, at most budget of them, through transport tp: *tail moves past each one taken. Stops
 * at one the receiver cannot take now (*blocked set: a later pass tries it again). -EIO: a
 * record that cannot be one (the ring is corrupt), 0 otherwise.
 * lend (NULL: messages are copied): messages go to their handlers where they are, lent until
 * the handlers ran; the reader gives the sender back no more than mc__ring_given(). */
int mc__ring_take(mc_engine_t *e, unsigned tp, const uint8_t *data, uint64_t bytes, uint64_t head,
                  uint64_t *tail, const char *sender, uint64_t stream, unsigned budget,
                  bool *blocked, mc_ring_lend_t *lend);

/* How far a reader that took up to tail may let its sender write again. */
static inline uint64_t mc__ring_given(const mc_ring_lend_t *lend, uint64_t tail)
{
    return lend->n ? lend->returned : tail;
}

/* Whether list l of rings (entries of type with members link, stream and lend) holds one of
 * stream's that lends records to handlers. */
bool mc__ring_list_lends(const mc_list_t *l, size_t link_off, size_t stream_off, size_t lend_off,
                         uint64_t stream);
#define MC_RING_LENDS(l, type, s)                                                                  \
    mc__ring_list_lends(l, offsetof(type, link), offsetof(type, stream), offsetof(type, lend), s)

/* The sender's records not consumed yet, oldest first (a circle of cap entries). */
typedef struct mc_ring_fifo {
    struct mc_ring_rec {
        mc_msg_t *m;
        uint32_t tx;  /* the take it was written by */
        uint64_t end; /* head after it */
    } * v;
    unsigned first, n, cap;
} mc_ring_fifo_t;

int mc__ring_fifo_init(mc_ring_fifo_t *f, unsigned cap);
/* Remember m, just taken and written, ending at end (the caller checked n < cap). */
void mc__ring_fifo_push(mc_ring_fifo_t *f, mc_msg_t *m, uint64_t end);
/* Answer (delivered) every record of p that ends at or before tail; how many. */
unsigned mc__ring_fifo_answer(mc_engine_t *e, mc_peer_t *p, mc_ring_fifo_t *f, uint64_t tail);
/* Drop every record (their messages go back through mc__msg_link_lost) and free the fifo. */
void mc__ring_fifo_free(mc_engine_t *e, mc_ring_fifo_t *f);

#endif
