/*
 * Shards over lists of buffers: checksums, the requests that move one shard between two
 * holders whose buffers are cut differently, and the local pages backed before a shard lands.
 */
#ifndef MC_P2P_SHARD_H
#define MC_P2P_SHARD_H

#include <stddef.h>
#include <stdint.h>

#include <mooncake/p2p.h>

#include "p2p_codec.h"

/* XXH3-64 (seed 0) of object bytes [off, off+len) of the concatenation of bufs. */
uint64_t mc__p2p_hash(const mc_p2p_buf_t *bufs, size_t n, uint64_t off, uint64_t len);

/* Back the local pages of object bytes [off, off+len) of bufs, writable, before a shard's
 * READs land there: memory never written yet (a file mapped to fetch into) would otherwise
 * take a page fault per 4 KiB inside the engine's copies. Only a hint: where the kernel refuses
 * (before Linux 5.14), the pages fault in as before. */
void mc__p2p_prefault(const mc_p2p_buf_t *bufs, size_t n, uint64_t off, uint64_t len);

/* Checksum every shard of d (d->size, shard_size and shards set) into d->sums (malloc'ed). */
int mc__p2p_checksum_all(p2p_desc_t *d, const mc_p2p_buf_t *bufs, size_t n);

/* The first shard of bufs whose checksum differs from d's, or d->shards if none. */
uint32_t mc__p2p_verify_all(const p2p_desc_t *d, const mc_p2p_buf_t *bufs, size_t n);

/* Requests that READ object bytes [off, off+len) from remote buffers rb (segment target) into
 * local buffers lb: one per piece that lies within one buffer on both sides. Writes up to max
 * into reqs (cb and cb_arg zero) and returns how many there are. */
size_t mc__p2p_pieces(const mc_p2p_buf_t *lb, size_t ln, const p2p_rbuf_t *rb, size_t rn,
                      mc_segment_id_t target, uint64_t off, uint64_t len, mc_request_t *reqs,
                      size_t max);

#endif
