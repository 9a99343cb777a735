/* SHA-256 per FIPS 180-4, HMAC per RFC 2104, written from the specifications. */
#include <errno.h>
#include <string.h>
#include <sys/random.h>

#include "sha256.h"

/* FIPS 180-4 4.2.2: first 32 bits of the fractional parts of the cube roots of the first 64
 * primes. */
static const uint32_t K[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
};

/* FIPS 180-4 5.3.3: first 32 bits of the fractional parts of the square roots of the first 8
 * primes. */
static const uint32_t H0[8] = {
    0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19,
};

static inline uint32_t rotr(uint32_t x, unsigned n)
{
    return (x >> n) | (x << (32 - n));
}

/* The message is big-endian regardless of the host (FIPS 180-4 3.1). */
static inline uint32_t load_be32(const uint8_t *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

static inline void store_be32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}

/* Plain memset may be dropped as a dead store; writing through volatile keeps the wipe. */
static void wipe(void *p, size_t len)
{
    volatile uint8_t *v = p;

    while (len--)
        *v++ = 0;
}

/* FIPS 180-4 6.2.1 step 1: the message schedule. */
static void schedule(uint32_t w[64], const uint8_t block[64])
{
    for (int t = 0; t < 16; t++)
        w[t] = load_be32(block + 4 * t);
    for (int t = 16; t < 64; t++) {
        uint32_t s0 = rotr(w[t - 15], 7) ^ rotr(w[t - 15], 18) ^ (w[t - 15] >> 3);
        uint32_t s1 = rotr(w[t - 2], 17) ^ rotr(w[t - 2], 19) ^ (w[t - 2] >> 10);

        w[t] = s1 + w[t - 7] + s0 + w[t - 16];
    }
}

/* FIPS 180-4 6.2.2 steps 2-4: 64 rounds over one block, then add into the chaining state. */
static void compress(uint32_t h[8], const uint8_t block[64])
{
    uint32_t w[64], v[8];

    schedule(w, block);
    memcpy(v, h, sizeof(v));
    for (int t = 0; t < 64; t++) {
        uint32_t e = v[4], a = v[0];
        uint32_t ch = (e & v[5]) ^ (~e & v[6]);
        uint32_t maj = (a & v[1]) ^ (a & v[2]) ^ (v[1] & v[2]);
        uint32_t t1 = v[7] + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ch + K[t] + w[t];
        uint32_t t2 = (rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + maj;

        /* v holds a..h; shifting it by one is the spec's h=g, g=f, ..., b=a renaming. */
        memmove(v + 1, v, 7 * sizeof(v[0]));
        v[4] += t1;
        v[0] = t1 + t2;
    }
    for (int i = 0; i < 8; i++)
        h[i] += v[i];
    wipe(w, sizeof(w));
}

void mc_sha256_init(mc_sha256_t *s)
{
    memcpy(s->h, H0, sizeof(s->h));
    s->len = 0;
    s->buf_len = 0;
}

void mc_sha256_update(mc_sha256_t *s, const void *data, size_t len)
{
    const uint8_t *p = data;

    /* memcpy from a NULL pointer is undefined even for zero bytes. */
    if (len == 0)
        return;
    s->len += len;
    if (s->buf_len > 0) {
        size_t take = MC_SHA256_BLOCK - s->buf_len;

        if (take > len)
            take = len;
        memcpy(s->buf + s->buf_len, p, take);
        s->buf_len += take;
        p += take;
        len -= take;
        if (s->buf_len < MC_SHA256_BLOCK)
            return;
        compress(s->h, s->buf);
        s->buf_len = 0;
    }
    /* Whole blocks are compressed straight from the caller's buffer, without copying. */
    for (; len >= MC_SHA256_BLOCK; p += MC_SHA256_BLOCK, len -= MC_SHA256_BLOCK)
        compress(s->h, p);
    if (len > 0)
        memcpy(s->buf, p, len);
    s->buf_len = len;
}

/* FIPS 180-4 5.1.1: append 0x80, zeros up to 56 mod 64, then the bit length as 64-bit BE. */
void mc_sha256_final(mc_sha256_t *s, uint8_t out[MC_SHA256_LEN])
{
    uint64_t bits = s->len * 8;

    s->buf[s->buf_len++] = 0x80;
    if (s->buf_len > MC_SHA256_BLOCK - 8) {
        memset(s->buf + s->buf_len, 0, MC_SHA256_BLOCK - s->buf_len);
        compress(s->h, s->buf);
        s->buf_len = 0;
    }
    memset(s->buf + s->buf_len, 0, MC_SHA256_BLOCK - 8 - s->buf_len);
    store_be32(s->buf + 56, (uint32_t)(bits >> 32));
    store_be32(s->buf + 60, (uint32_t)bits);
    compress(s->h, s->buf);
    for (int i = 0; i < 8; i++)
        store_be32(out + 4 * i, s->h[i]);
    wipe(s, sizeof(*s));
}

void mc_sha256(const void *data, size_t len, uint8_t out[MC_SHA256_LEN])
{
    mc_sha256_t s;

    mc_sha256_init(&s);
    mc_sha256_update(&s, data, len);
    mc_sha256_final(&s, out);
}

/* RFC 2104: H(K ^ opad, H(K ^ ipad, text)), with K hashed first when longer than a block. */
void mc_hmac_sha256(const void *key, size_t key_len, const struct iovec *parts, size_t n,
                    uint8_t out[MC_SHA256_LEN])
{
    uint8_t k[MC_SHA256_BLOCK] = {0}, pad[MC_SHA256_BLOCK], inner[MC_SHA256_LEN];
    mc_sha256_t s;

    if (key_len > MC_SHA256_BLOCK)
        mc_sha256(key, key_len, k);
    else if (key_len > 0)
        memcpy(k, key, key_len);

    for (int i = 0; i < MC_SHA256_BLOCK; i++)
        pad[i] = k[i] ^ 0x36;
    mc_sha256_init(&s);
    mc_sha256_update(&s, pad, sizeof(pad));
    for (size_t i = 0; i < n; i++)
        mc_sha256_update(&s, parts[i].iov_base, parts[i].iov_len);
    mc_sha256_final(&s, inner);

    for (int i = 0; i < MC_SHA256_BLOCK; i++)
        pad[i] = k[i] ^ 0x5c;
    mc_sha256_init(&s);
    mc_sha256_update(&s, pad, sizeof(pad));
    mc_sha256_update(&s, inner, sizeof(inner));
    mc_sha256_final(&s, out);

    wipe(k, sizeof(k));
    wipe(pad, sizeof(pad));
    wipe(inner, sizeof(inner));
}

/* Accumulate every difference instead of returning at the first, so timing reveals nothing
 * about where a forged MAC goes wrong. */
int mc_ct_equal(const void *a, const void *b, size_t len)
{
    const volatile uint8_t *x = a, *y = b;
    uint8_t diff = 0;

    for (size_t i = 0; i < len; i++)
        diff |= x[i] ^ y[i];
    return diff == 0;
}

int mc_random_bytes(void *buf, size_t len)
{
    uint8_t *p = buf;

    while (len > 0) {
        ssize_t got = getrandom(p, len, 0);

        if (got < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        /* Requests over 32 MiB may return short even from an initialised pool. */
        p += got;
        len -= (size_t)got;
    }
    return 0;
}
