/* SHA-256 and HMAC-SHA-256 against FIPS 180-4 / NIST and RFC 4231 vectors. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <cmocka.h>

#include "util/sha256.h"

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
    uint8_t want[MC_SHA256_LEN];

    from_hex(hex, want, len);
    assert_memory_equal(digest, want, len);
}

static void check_sha(const char *msg, const char *hex)
{
    uint8_t out[MC_SHA256_LEN];

    mc_sha256(msg, strlen(msg), out);
    assert_digest(out, hex, MC_SHA256_LEN);
}

static void test_nist_short(void **state)
{
    (void)state;
    check_sha("", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    check_sha("abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    check_sha("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq",
              "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
    check_sha("abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklmnopq"
              "klmnopqrlmnopqrsmnopqrstnopqrstu",
              "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1");
}

/* Lengths where the padding does or does not spill into an extra block. */
static void test_padding_boundaries(void **state)
{
    static const struct {
        size_t n;
        const char *hex;
    } cases[] = {
        {55, "9f4390f8d30c2dd92ec9f095b65e2b9ae9b0a925a5258e241c9f1e910f734318"},
        {56, "b35439a4ac6f0948b6d6f9e3c6af0f5f590ce20f1bde7090ef7970686ec6738a"},
        {63, "7d3e74a05d7db15bce4ad9ec0658ea98e3f06eeecf16b4c6fff2da457ddc2f34"},
        {64, "ffe054fe7ae0cb6dc65c3af9b61d5209f439851db43d0ba5997337df154668eb"},
        {119, "31eba51c313a5c08226adf18d4a359cfdfd8d2e816b13f4af952f7ea6584dcfb"},
        {120, "2f3d335432c70b580af0e8e1b3674a7c020d683aa5f73aaaedfdc55af904c21c"},
    };
    uint8_t msg[128], out[MC_SHA256_LEN];

    (void)state;
    memset(msg, 'a', sizeof(msg));
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        mc_sha256(msg, cases[i].n, out);
        assert_digest(out, cases[i].hex, MC_SHA256_LEN);
    }
}

/* One million 'a' in odd-sized chunks, so that most updates straddle block boundaries. */
static void test_million_a(void **state)
{
    static const size_t chunks[] = {1, 3, 7, 63, 65, 127, 1001, 4093};
    uint8_t a[4096 + 1], out[MC_SHA256_LEN];
    mc_sha256_t s;
    size_t left = 1000000;

    (void)state;
    memset(a, 'a', sizeof(a));
    mc_sha256_init(&s);
    for (size_t i = 0; left > 0; i++) {
        size_t n = chunks[i % (sizeof(chunks) / sizeof(chunks[0]))];

        n = n < left ? n : left;
        mc_sha256_update(&s, a, n);
        left -= n;
    }
    mc_sha256_final(&s, out);
    assert_digest(out, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0",
                  MC_SHA256_LEN);
}

static void test_incremental_matches_oneshot(void **state)
{
    uint8_t msg[1000], want[MC_SHA256_LEN], got[MC_SHA256_LEN];

    (void)state;
    for (size_t i = 0; i < sizeof(msg); i++)
        msg[i] = (uint8_t)(i * 131 + 7);
    mc_sha256(msg, sizeof(msg), want);
    for (size_t chunk = 1; chunk <= 130; chunk++) {
        mc_sha256_t s;

        mc_sha256_init(&s);
        for (size_t off = 0; off < sizeof(msg); off += chunk) {
            size_t n = sizeof(msg) - off < chunk ? sizeof(msg) - off : chunk;

            mc_sha256_update(&s, msg + off, n);
        }
        mc_sha256_update(&s, NULL, 0);
        mc_sha256_final(&s, got);
        assert_memory_equal(got, want, MC_SHA256_LEN);
    }
}

static void check_hmac(const void *key, size_t key_len, const void *data, size_t data_len,
                       const char *hex, size_t out_len)
{
    struct iovec part = {.iov_base = (void *)data, .iov_len = data_len};
    uint8_t out[MC_SHA256_LEN];

    mc_hmac_sha256(key, key_len, &part, 1, out);
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
    uint8_t msg[200], want[MC_SHA256_LEN], got[MC_SHA256_LEN];
    struct iovec one = {.iov_base = msg, .iov_len = sizeof(msg)};

    (void)state;
    for (size_t i = 0; i < sizeof(msg); i++)
        msg[i] = (uint8_t)(i ^ 0x5a);
    mc_hmac_sha256(key, strlen(key), &one, 1, want);

    /* Uneven parts, including an empty one, crossing block boundaries. */
    struct iovec parts[] = {
        {.iov_base = msg, .iov_len = 1},        {.iov_base = msg + 1, .iov_len = 0},
        {.iov_base = msg + 1, .iov_len = 70},   {.iov_base = msg + 71, .iov_len = 64},
        {.iov_base = msg + 135, .iov_len = 65},
    };
    mc_hmac_sha256(key, strlen(key), parts, sizeof(parts) / sizeof(parts[0]), got);
    assert_memory_equal(got, want, MC_SHA256_LEN);

    /* A different key must give a different MAC. */
    mc_hmac_sha256("shared-secreT", strlen(key), &one, 1, got);
    assert_memory_not_equal(got, want, MC_SHA256_LEN);
}

static void test_ct_equal(void **state)
{
    uint8_t a[32], b[32];

    (void)state;
    memset(a, 0x42, sizeof(a));
    memcpy(b, a, sizeof(b));
    assert_int_equal(mc_ct_equal(a, b, sizeof(a)), 1);
    assert_int_equal(mc_ct_equal(a, b, 0), 1);
    b[0] ^= 1;
    assert_int_equal(mc_ct_equal(a, b, sizeof(a)), 0);
    b[0] ^= 1;
    b[31] ^= 0x80;
    assert_int_equal(mc_ct_equal(a, b, sizeof(a)), 0);
    assert_int_equal(mc_ct_equal(a, b, 31), 1);
}

static void test_random_bytes(void **state)
{
    uint8_t a[32], b[32];

    (void)state;
    assert_int_equal(mc_random_bytes(a, sizeof(a)), 0);
    assert_int_equal(mc_random_bytes(b, sizeof(b)), 0);
    /* Equal outputs have probability 2^-256: only a broken generator produces them. */
    assert_memory_not_equal(a, b, sizeof(a));
    assert_int_equal(mc_random_bytes(a, 0), 0);
    assert_int_equal(mc_random_bytes(NULL, 0), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_nist_short), cmocka_unit_test(test_padding_boundaries),
        cmocka_unit_test(test_million_a),  cmocka_unit_test(test_incremental_matches_oneshot),
        cmocka_unit_test(test_rfc4231),    cmocka_unit_test(test_hmac_parts),
        cmocka_unit_test(test_ct_equal),   cmocka_unit_test(test_random_bytes),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
