/*
 * The cryptography peer authentication needs (internal): HMAC-SHA-256 and a constant-time
 * comparison from OpenSSL's libcrypto (already in the process through libcurl), and random
 * bytes from the kernel. None of these allocate on the caller's behalf; all are thread-safe.
 */
#ifndef MC_UTIL_CRYPTO_H
#define MC_UTIL_CRYPTO_H

#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#define MC_HMAC_LEN 32

/* HMAC-SHA-256 over the concatenation of n (iov_base, iov_len) parts, keyed with key_len bytes
 * of key. Returns 0, or -EIO if libcrypto fails (reason set). */
int mc__hmac_sha256(const void *key, size_t key_len, const struct iovec *parts, size_t n,
                    uint8_t out[MC_HMAC_LEN]);

/* 1 if the len bytes at a and b are equal, 0 if not; time independent of where they differ. */
int mc__ct_equal(const void *a, const void *b, size_t len);

/* Fill buf with len cryptographically random bytes (getrandom(2), retried on EINTR and short
 * reads). Returns 0 or -errno. */
int mc__random_bytes(void *buf, size_t len);

#endif
