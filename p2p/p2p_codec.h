/*
 * The two JSON documents of the P2P store, and shard arithmetic.
 *
 * Description ("object" key, written once by the origin):
 *   {"v":1, "id":"<16 hex: this publication>", "size":N, "shard_size":S, "shards":K,
 *    "hash":"xxh3-64", "checksums":["<16 hex>", ...K], "origin":"<segment>"}
 * Checksums are strings: 64-bit integers do not survive every JSON reader. The id tells a
 * replaced object (force) from the one replicas hold: an entry of another id is ignored.
 *
 * Replica entry ("replica/<segment>" key, on the holder's lease, rewritten only by it):
 *   {"v":1, "id":"<the description's id>", "origin":true|false, "complete":true|false,
 *    "shards":K, "have":"<base64 bitmap, shard i = bit i%8 of byte i/8>" (absent if complete),
 *    "bufs":[[addr,len], ...]}
 * bufs are the holder's buffers in object order: shard bytes at object offset o are at the
 * same offset into their concatenation. Addresses and lengths are 64-bit JSON integers.
 */
#ifndef MC_P2P_CODEC_H
#define MC_P2P_CODEC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <mooncake/engine.h>

#define P2P_HASH_NAME "xxh3-64"

typedef struct p2p_desc {
    uint64_t id;
    uint64_t size, shard_size;
    uint32_t shards;
    uint64_t *sums; /* one per shard, malloc'ed */
    char origin[MC_NAME_MAX];
} p2p_desc_t;

typedef struct p2p_rbuf {
    uint64_t addr, len;
} p2p_rbuf_t;

typedef struct p2p_entry {
    uint64_t id;
    bool origin, complete;
    uint32_t shards;
    uint8_t *have; /* (shards + 7) / 8 bytes, malloc'ed; all set when complete */
    p2p_rbuf_t *bufs;
    size_t n_bufs;
} p2p_entry_t;

static inline uint64_t p2p_shard_off(const p2p_desc_t *d, uint32_t i)
{
    return (uint64_t)i * d->shard_size;
}

static inline uint64_t p2p_shard_len(const p2p_desc_t *d, uint32_t i)
{
    uint64_t off = p2p_shard_off(d, i);

    return d->size - off < d->shard_size ? d->size - off : d->shard_size;
}

static inline bool p2p_bit(const uint8_t *map, uint32_t i)
{
    return map[i / 8] >> (i % 8) & 1;
}

static inline void p2p_bit_set(uint8_t *map, uint32_t i)
{
    map[i / 8] |= (uint8_t)(1u << (i % 8));
}

/* Encode into a malloc'ed NUL-terminated string; free() it. -ENOMEM. */
int mc__p2p_desc_encode(const p2p_desc_t *d, char **json_p, size_t *len_p);
/* -EPROTO (with the reason) for a document that is not a description this code understands. */
int mc__p2p_desc_decode(const char *json, size_t len, p2p_desc_t *d);
void mc__p2p_desc_free(p2p_desc_t *d);

int mc__p2p_entry_encode(const p2p_entry_t *e, char **json_p, size_t *len_p);
/* -EPROTO as above, also for bufs that do not cover size bytes. */
int mc__p2p_entry_decode(const char *json, size_t len, uint64_t size, p2p_entry_t *e);
void mc__p2p_entry_free(p2p_entry_t *e);
/* Only the id of the registration an entry is of: -EPROTO as above. */
int mc__p2p_entry_id(const char *json, size_t len, uint64_t *id_p);

#endif
