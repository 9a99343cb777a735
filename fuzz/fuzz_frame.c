/*
 * libFuzzer target for the tcp wire codecs (engine/transport/tcp/tcp_proto.c): the 32-byte frame
 * header and the HELLO payload. Both decoders take bytes straight from the network.
 *
 * Input layout:
 *   [0, 32)   a frame header, given to mc__tcp_frame_decode;
 *   [32]      selects desc_max, the DESC_REPLY limit (see desc_max_from);
 *   [33, ...) a HELLO payload, given to mc__tcp_hello_decode.
 * Shorter inputs fuzz only the parts they cover.
 *
 * Both codecs are bijections on what the decoder accepts, so every accepted input must survive
 * decode -> encode byte for byte, and its re-encoding must decode to the same value. Any
 * mismatch aborts, which libFuzzer reports as a crash.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "transport/tcp/tcp_proto.h"

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond);               \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

/* Spread one byte over the interesting limits: 0, 2^k - 1, 2^k and "no limit". */
static uint64_t desc_max_from(uint8_t sel)
{
    if (sel & 0x80)
        return UINT64_MAX;
    if (sel & 0x40)
        return (uint64_t)1 << (sel & 63);
    return ((uint64_t)1 << (sel & 63)) - 1;
}

static int frame_equal(const mc_frame_t *a, const mc_frame_t *b)
{
    return a->type == b->type && a->flags == b->flags && a->length == b->length && a->id == b->id &&
           a->addr == b->addr && a->aux == b->aux;
}

static void fuzz_frame(const uint8_t in[MC_FRAME_HDR_LEN], uint64_t desc_max)
{
    uint8_t out[MC_FRAME_HDR_LEN];
    mc_frame_t f, g;

    if (mc__tcp_frame_decode(in, desc_max, &f))
        return;
    CHECK(f.type != 0 && f.type < MC_FR_TYPE_MAX);
    CHECK(strcmp(mc__tcp_frame_type_name(f.type), "UNKNOWN") != 0);
    CHECK(f.type != MC_FR_DESC_REPLY || f.length <= desc_max);
    CHECK(f.type != MC_FR_READ || f.aux <= MC_PROTO_MAX_DATA);
    CHECK(f.type != MC_FR_RETIRE || f.length % 4 == 0);
    mc__tcp_frame_encode(&f, out);
    CHECK(memcmp(in, out, MC_FRAME_HDR_LEN) == 0);
    CHECK(mc__tcp_frame_decode(out, desc_max, &g) == 0);
    CHECK(frame_equal(&f, &g));
}

static int hello_equal(const mc_hello_t *a, const mc_hello_t *b)
{
    return a->instance == b->instance && !memcmp(a->nonce, b->nonce, sizeof(a->nonce)) &&
           !memcmp(a->proof, b->proof, sizeof(a->proof)) && !strcmp(a->name, b->name) &&
           !strcmp(a->peer_name, b->peer_name) && a->n_retired == b->n_retired &&
           !memcmp(a->retired, b->retired, a->n_retired * sizeof(a->retired[0]));
}

/* A decoded string must end inside its array and hold no byte the encoder would drop. */
static void check_str(const char *s, size_t size)
{
    CHECK(memchr(s, 0, size) != NULL);
}

static void fuzz_hello(const uint8_t *buf, size_t len)
{
    static uint8_t out[MC_PROTO_MAX_CTRL];
    static mc_hello_t h, g; /* 1 KiB each: keep them off the stack */
    size_t n;

    if (mc__tcp_hello_decode(buf, len, &h))
        return;
    check_str(h.name, sizeof(h.name));
    check_str(h.peer_name, sizeof(h.peer_name));
    CHECK(h.n_retired <= MC_PROTO_MAX_RETIRE);
    for (unsigned i = 0; i < h.n_retired; i++)
        CHECK(h.retired[i] <= UINT32_MAX);
    n = mc__tcp_hello_encode(&h, out);
    CHECK(n <= sizeof(out));
    CHECK(n == len && memcmp(buf, out, len) == 0);
    CHECK(mc__tcp_hello_decode(out, n, &g) == 0);
    CHECK(hello_equal(&h, &g));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint8_t hdr[MC_FRAME_HDR_LEN] = {0};

    /* Copy so that a short input still gives the decoder exactly 32 readable bytes. */
    memcpy(hdr, data, size < sizeof(hdr) ? size : sizeof(hdr));
    fuzz_frame(hdr, desc_max_from(size > MC_FRAME_HDR_LEN ? data[MC_FRAME_HDR_LEN] : 0));
    if (size > MC_FRAME_HDR_LEN + 1)
        fuzz_hello(data + MC_FRAME_HDR_LEN + 1, size - MC_FRAME_HDR_LEN - 1);
    return 0;
}
