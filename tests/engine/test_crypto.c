/* The authentication primitives on libcrypto: HMAC-SHA-256 against RFC 4231's vectors (whole and
 * in parts), the constant-time comparison, random bytes. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <cmocka.h>

#include "util/crypto.h"

static void from_hex(const char *hex, uint8_t *out, size_t len)
{
    for (size_t i = 0; i < len; i++) {
        unsigned v;

        assert_int_equal(sscanf(hex + 2 * i, "%2x", &v), 1);
        out[i] = (uint8_t)v;
    }
}

/* Compare the first len bytes of digest against hex (RFC 4231 case 5 is truncated). */
static void assert_digest(const uint8_t *digest, const char *hex, size_t len)
{
    uint8_t want[MC_HMAC_LEN];

    from_hex(hex, want, len);
    assert_memory_equal(digest, want, len);
}

static void check_hmac(const void *key, size_t key_len, const void *data, size_t data_len,
                       const char *hex, size_t out_len)
{
    struct iovec part = {.iov_base = (void *)data, .iov_len = data_len};
    uint8_t out[MC_HMAC_LEN];

    assert_int_equal(mc__hmac_sha256(key, key_len, &part, 1, out), 0);
    assert_digest(out, hex, out_len);
}

static void test_rfc4231(void **state)
{
    uint8_t key[131], data[50];

    (void)state;
    memset(key, 0x0b, 20);
    check_hmac(key, 20, "Hi There", 8,
               "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7", 32);

    check_hmac("Jefe", 4, "what do ya want for nothing?", 28,
               "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843", 32);

    memset(key, 0xaa, 20);
    memset(data, 0xdd, 50);
    check_hmac(key, 20, data, 50,
               "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe", 32);

    for (int i = 0; i < 25; i++)
        key[i] = (uint8_t)(i + 1);
    memset(data, 0xcd, 50);
    check_hmac(key, 25, data, 50,
               "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b", 32);

    /* Case 5 specifies only the first 128 bits of the output. */
    memset(key, 0x0c, 20);
    check_hmac(key, 20, "Test With Truncation", 20, "a3b6167473100ee06e0c796c2955552b", 16);

    memset(key, 0xaa, 131);
    check_hmac(key, 131, "Test Using Larger Than Block-Size Key - Hash Key First", 54,
               "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54", 32);

    const char *m7 = "This is a test using a larger than block-size key and a larger than "
                     "block-size data. The key needs to be hashed before being used by the "
                     "HMAC algorithm.";
    check_hmac(key, 131, m7, strlen(m7),
               "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2", 32);
}

static void test_hmac_parts(void **state)
{
    static const char key[] = "shared-secret";
    uint8_t msg[200], want[MC_HMAC_LEN], got[MC_HMAC_LEN];
    struct iovec one = {.iov_base = msg, .iov_len = sizeof(msg)};

    (void)state;
    for (size_t i = 0; i < sizeof(msg); i++)
        msg[i] = (uint8_t)(i ^ 0x5a);
    assert_int_equal(mc__hmac_sha256(key, strlen(key), &one, 1, want), 0);

    /* Uneven parts, including an empty one, crossing block boundaries. */
    struct iovec parts[] = {
        {.iov_base = msg, .iov_len = 1},        {.iov_base = msg + 1, .iov_len = 0},
        {.iov_base = msg + 1, .iov_len = 70},   {.iov_base = msg + 71, .iov_len = 64},
        {.iov_base = msg + 135, .iov_len = 65},
    };
    assert_int_equal(
        mc__hmac_sha256(key, strlen(key), parts, sizeof(parts) / sizeof(parts[0]), got), 0);
    assert_memory_equal(got, want, MC_HMAC_LEN);

    /* A different key must give a different MAC. */
    assert_int_equal(mc__hmac_sha256("shared-secreT", strlen(key), &one, 1, got), 0);
    assert_memory_not_equal(got, want, MC_HMAC_LEN);
}

static void test_ct_equal(void **state)
{
    uint8_t a[32], b[32];

    (void)state;
    memset(a, 0x42, sizeof(a));
    memcpy(b, a, sizeof(b));
    assert_int_equal(mc__ct_equal(a, b, sizeof(a)), 1);
    assert_int_equal(mc__ct_equal(a, b, 0), 1);
    b[0] ^= 1;
    assert_int_equal(mc__ct_equal(a, b, sizeof(a)), 0);
    b[0] ^= 1;
    b[31] ^= 0x80;
    assert_int_equal(mc__ct_equal(a, b, sizeof(a)), 0);
    assert_int_equal(mc__ct_equal(a, b, 31), 1);
}

static void test_random_bytes(void **state)
{
    uint8_t a[32], b[32];

    (void)state;
    assert_int_equal(mc__random_bytes(a, sizeof(a)), 0);
    assert_int_equal(mc__random_bytes(b, sizeof(b)), 0);
    /* Equal outputs have probability 2^-256: only a broken generator produces them. */
    assert_memory_not_equal(a, b, sizeof(a));
    assert_int_equal(mc__random_bytes(a, 0), 0);
    assert_int_equal(mc__random_bytes(NULL, 0), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rfc4231),
        cmocka_unit_test(test_hmac_parts),
        cmocka_unit_test(test_ct_equal),
        cmocka_unit_test(test_random_bytes),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
