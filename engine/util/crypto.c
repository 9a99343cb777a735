/* HMAC-SHA-256 and constant-time comparison through libcrypto; random bytes from getrandom. */
#include <errno.h>
#include <sys/random.h>

#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>

#include "mooncake/error.h"
#include "crypto.h"
#include "log.h"

int mc__hmac_sha256(const void *key, size_t key_len, const struct iovec *parts, size_t n,
                    uint8_t out[MC_HMAC_LEN])
{
    static char digest[] = "SHA256";
    OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, digest, 0),
                           OSSL_PARAM_construct_end()};
    EVP_MAC *mac = EVP_MAC_fetch(NULL, "HMAC", NULL);
    EVP_MAC_CTX *ctx = mac ? EVP_MAC_CTX_new(mac) : NULL;
    size_t len = 0;
    int ok = ctx && EVP_MAC_init(ctx, key, key_len, params);

    for (size_t i = 0; ok && i < n; i++)
        ok = EVP_MAC_update(ctx, parts[i].iov_base, parts[i].iov_len);
    ok = ok && EVP_MAC_final(ctx, out, &len, MC_HMAC_LEN) && len == MC_HMAC_LEN;
    EVP_MAC_CTX_free(ctx);
    EVP_MAC_free(mac);
    if (!ok)
        return mc__set_error(-EIO, "HMAC-SHA-256 through libcrypto failed: %s",
                             ERR_reason_error_string(ERR_get_error()));
    return 0;
}

int mc__ct_equal(const void *a, const void *b, size_t len)
{
    return CRYPTO_memcmp(a, b, len) == 0;
}

int mc__random_bytes(void *buf, size_t len)
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
