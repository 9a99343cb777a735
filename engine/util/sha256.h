/*
 * SHA-256 (FIPS 180-4) and HMAC-SHA-256 (RFC 2104), plus the two helpers that the peer
 * authentication challenge-response needs: constant-time comparison and random bytes (internal).
 *
 * Written from the specifications, so that the engine needs no external crypto library. None
 * of these functions allocate. A mc_sha256_t belongs to one thread at a time; the one-shot
 * functions are thread-safe.
 */
#ifndef MC_UTIL_SHA256_H
#define MC_UTIL_SHA256_H

#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#define MC_SHA256_LEN   32
#define MC_SHA256_BLOCK 64

typedef struct mc_sha256 {
    uint32_t h[8];   /* chaining state */
    uint64_t len;    /* total bytes hashed so far */
    uint8_t buf[64]; /* partial block not yet compressed */
    size_t buf_len;  /* bytes valid in buf, always < 64 between calls */
} mc_sha256_t;

/* Start a new hash in s (caller-owned storage). */
void mc_sha256_init(mc_sha256_t *s);

/* Absorb len bytes of data; data may be NULL when len is 0. */
void mc_sha256_update(mc_sha256_t *s, const void *data, size_t len);

/* Write the digest to out. s must be re-initialised before it is used again. */
void mc_sha256_final(mc_sha256_t *s, uint8_t out[MC_SHA256_LEN]);

/* One-shot digest of len bytes of data. */
void mc_sha256(const void *data, size_t len, uint8_t out[MC_SHA256_LEN]);

/*
 * HMAC-SHA-256 over the concatenation of n (iov_base, iov_len) parts, keyed with key_len bytes
 * of key (any length; keys longer than a block are hashed first, as RFC 2104 says). parts may
 * be NULL when n is 0. Intermediate key material is wiped before returning.
 */
void mc_hmac_sha256(const void *key, size_t key_len, const struct iovec *parts, size_t n,
                    uint8_t out[MC_SHA256_LEN]);

/* 1 if the len bytes at a and b are equal, 0 if not; time independent of where they differ. */
int mc_ct_equal(const void *a, const void *b, size_t len);

/*
 * Fill buf with len cryptographically random bytes from getrandom(2), retrying on EINTR and
 * short reads. Returns 0, or -errno (e.g. -ENOSYS on kernels without getrandom). Thread-safe.
 */
int mc_random_bytes(void *buf, size_t len);

#endif
