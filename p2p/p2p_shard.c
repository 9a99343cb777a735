/* Shards over lists of buffers: checksums, request pieces, and their pages backed. */
#include <errno.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#define XXH_INLINE_ALL /* the one-shot and streaming XXH3 calls, inlined: no call per shard */
#include <xxhash.h>

#include "p2p_int.h"
#include "p2p_shard.h"

/* A position in a list of buffers: buffer index and offset into it. */
typedef struct pos {
    size_t i;
    uint64_t off;
} pos_t;

/* Where object offset off lies in local buffers; past the end: {n, remainder}. */
static pos_t seek_local(const mc_p2p_buf_t *b, size_t n, uint64_t off)
{
    pos_t p = {0, off};

    while (p.i < n && p.off >= b[p.i].len)
        p.off -= b[p.i++].len;
    return p;
}

static pos_t seek_remote(const p2p_rbuf_t *b, size_t n, uint64_t off)
{
    pos_t p = {0, off};

    while (p.i < n && p.off >= b[p.i].len)
        p.off -= b[p.i++].len;
    return p;
}

uint64_t mc__p2p_hash(const mc_p2p_buf_t *bufs, size_t n, uint64_t off, uint64_t len)
{
    pos_t p = seek_local(bufs, n, off);
    XXH3_state_t st;

    if (p.i < n && bufs[p.i].len - p.off >= len) /* the usual case: within one buffer */
        return XXH3_64bits((const char *)bufs[p.i].addr + p.off, len);
    XXH3_64bits_reset(&st);
    for (; len > 0 && p.i < n; p.i++, p.off = 0) {
        uint64_t k = bufs[p.i].len - p.off < len ? bufs[p.i].len - p.off : len;
        XXH3_64bits_update(&st, (const char *)bufs[p.i].addr + p.off, k);
        len -= k;
    }
    return XXH3_64bits_digest(&st);
}

void mc__p2p_prefault(const mc_p2p_buf_t *bufs, size_t n, uint64_t off, uint64_t len)
{
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);

    for (pos_t p = seek_local(bufs, n, off); len > 0 && p.i < n; p.i++, p.off = 0) {
        uint64_t k = bufs[p.i].len - p.off < len ? bufs[p.i].len - p.off : len;
        uintptr_t from = (uintptr_t)bufs[p.i].addr + p.off, to = from + k;
        from &= ~(page - 1);
        to = (to + page - 1) & ~(page - 1);
        (void)madvise((void *)from, to - from, MADV_POPULATE_WRITE); /* a hint: see p2p_shard.h */
        len -= k;
    }
}

int mc__p2p_checksum_all(p2p_desc_t *d, const mc_p2p_buf_t *bufs, size_t n)
{
    d->sums = malloc(d->shards * sizeof(*d->sums));
    if (!d->sums)
        return mc__p2p_error(-ENOMEM, "out of memory for %u checksums", d->shards);
    for (uint32_t i = 0; i < d->shards; i++)
        d->sums[i] = mc__p2p_hash(bufs, n, p2p_shard_off(d, i), p2p_shard_len(d, i));
    return 0;
}

uint32_t mc__p2p_verify_all(const p2p_desc_t *d, const mc_p2p_buf_t *bufs, size_t n)
{
    uint32_t i = 0;

    while (i < d->shards &&
           mc__p2p_hash(bufs, n, p2p_shard_off(d, i), p2p_shard_len(d, i)) == d->sums[i])
        i++;
    return i;
}

size_t mc__p2p_pieces(const mc_p2p_buf_t *lb, size_t ln, const p2p_rbuf_t *rb, size_t rn,
                      mc_segment_id_t target, uint64_t off, uint64_t len, mc_request_t *reqs,
                      size_t max)
{
    pos_t l = seek_local(lb, ln, off), r = seek_remote(rb, rn, off);
    size_t count = 0;

    while (len > 0 && l.i < ln && r.i < rn) {
        uint64_t k = len;
        if (lb[l.i].len - l.off < k)
            k = lb[l.i].len - l.off;
        if (rb[r.i].len - r.off < k)
            k = rb[r.i].len - r.off;
        if (count < max)
            reqs[count] = (mc_request_t){.opcode = MC_READ,
                                         .local = (char *)lb[l.i].addr + l.off,
                                         .target = target,
                                         .target_offset = rb[r.i].addr + r.off,
                                         .length = k};
        count++;
        len -= k;
        l.off += k;
        r.off += k;
        if (l.off == lb[l.i].len)
            l = (pos_t){l.i + 1, 0};
        if (r.off == rb[r.i].len)
            r = (pos_t){r.i + 1, 0};
    }
    return count;
}
