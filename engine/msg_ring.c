/* Message rings: records, the receiver's consumption, the sender's unanswered records. See
 * msg_ring.h. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "msg_ring.h"

#define REC_SKIP UINT32_MAX

typedef struct rec {
    uint32_t len;
    uint8_t id;
    uint8_t pad[3];
    uint64_t seq;
} rec_t;
_Static_assert(sizeof(rec_t) == MC_RING_REC_HDR, "record header");

int mc__ring_put(uint8_t *data, uint64_t bytes, uint64_t *head, uint64_t tail, const mc_msg_t *m)
{
    uint64_t need = mc__ring_rec_bytes(m->len), at = *head % bytes;
    uint64_t skip = bytes - at < need ? bytes - at : 0;

    if (*head + skip + need - tail > bytes)
        return -ENOSPC;
    if (skip) {
        ((rec_t *)(void *)(data + at))->len = REC_SKIP;
        *head += skip;
        at = 0;
    }
    rec_t *h = (rec_t *)(void *)(data + at);
    h->len = m->len;
    h->id = m->id;
    h->seq = m->seq;
    memcpy(h + 1, mc__msg_payload(m), m->len);
    *head += need;
    return 0;
}

int mc__ring_take(mc_engine_t *e, unsigned tp, const uint8_t *data, uint64_t bytes, uint64_t head,
                  uint64_t *tail, const char *sender, uint64_t stream, unsigned budget,
                  bool *blocked, mc_ring_lend_t *lend)
{
    unsigned n = 0;

    *blocked = false;
    while (*tail != head && n < budget) {
        uint64_t at = *tail % bytes;
        const rec_t *h = (const rec_t *)(const void *)(data + at);
        uint32_t len = h->len;
        if (head - *tail > bytes)
            return -EIO;
        /* A skip ends the ring before a record at its start, written with it: one at the start
         * (a whole lap), or one that reaches head, is not one the sender wrote. */
        if (len == REC_SKIP && bytes - at >= head - *tail)
            return -EIO;
        if (len == REC_SKIP) {
            *tail += bytes - at;
            continue;
        }
        if (len > MC_MSG_MAX || at + mc__ring_rec_bytes(len) > bytes ||
            head - *tail < mc__ring_rec_bytes(len))
            return -EIO;
        if (lend && !lend->n) /* nothing lent before it: what precedes it is given back */
            lend->returned = *tail;
        if (mc__msg_deliver(e, tp, sender, stream, h->seq, h->id, h + 1, len, lend,
                            *tail + mc__ring_rec_bytes(len))) {
            *blocked = true; /* full, or the control link still has the ones before it */
            return 0;
        }
        *tail += mc__ring_rec_bytes(len);
        n++;
    }
    return 0;
}

bool mc__ring_list_lends(const mc_list_t *l, size_t link_off, size_t stream_off, size_t lend_off,
                         uint64_t stream)
{
    for (const mc_list_t *pos = l->next; pos != l; pos = pos->next) {
        const char *rx = (const char *)pos - link_off;
        uint64_t s;
        memcpy(&s, rx + stream_off, sizeof(s));
        if (s == stream && ((const mc_ring_lend_t *)(const void *)(rx + lend_off))->n)
            return true;
    }
    return false;
}

int mc__ring_fifo_init(mc_ring_fifo_t *f, unsigned cap)
{
    memset(f, 0, sizeof(*f));
    f->v = calloc(cap, sizeof(*f->v));
    f->cap = cap;
    return f->v ? 0 : -ENOMEM;
}

void mc__ring_fifo_push(mc_ring_fifo_t *f, mc_msg_t *m, uint64_t end)
{
    f->v[(f->first + f->n++) % f->cap] = (struct mc_ring_rec){.m = m, .tx = m->tx, .end = end};
}

unsigned mc__ring_fifo_answer(mc_engine_t *e, mc_peer_t *p, mc_ring_fifo_t *f, uint64_t tail)
{
    unsigned n = 0;

    while (f->n && f->v[f->first].end <= tail) {
        struct mc_ring_rec *r = &f->v[f->first];
        mc__msg_answered(e, p, r->m, r->tx, 0);
        mc__msg_put(e, r->m);
        f->first = (f->first + 1) % f->cap;
        f->n--;
        n++;
    }
    return n;
}

void mc__ring_fifo_free(mc_engine_t *e, mc_ring_fifo_t *f)
{
    for (; f->n; f->n--, f->first = (f->first + 1) % f->cap)
        mc__msg_put(e, f->v[f->first].m);
    free(f->v);
    memset(f, 0, sizeof(*f));
}
