/*
 * libFuzzer target for the segment-descriptor decoder (engine/descriptor.c). A descriptor is
 * JSON sent by a peer (DESC_REPLY) or read from metadata, so every byte is untrusted.
 *
 * The whole input is the descriptor text. On success the decoded value must satisfy what the
 * engine relies on without re-checking: the buffer count agrees with the JSON array, no buffer
 * wraps the address space, and every string is non-empty and ends inside its array. On failure
 * the output must be untouched ("set output parameters only after success").
 *
 * The decoder asks every transport's codec for its parts: this program links descriptor.c with
 * the codecs (the *_desc.c file of each transport) and lists them below in table.c order, without
 * the rest of the transports, which need devices and an engine.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "transport/transport.h"

extern const mc_desc_codec_t mc__tcp_codec, mc__shm_codec, mc__rdma_codec, mc__file_codec;
static unsigned slots[4];
static const mc_transport_ops_t codecs[] = {
    {.size = sizeof(mc_transport_ops_t), .name = "tcp", .slot = &slots[0], .codec = &mc__tcp_codec},
    {.size = sizeof(mc_transport_ops_t), .name = "shm", .slot = &slots[1], .codec = &mc__shm_codec},
    {.size = sizeof(mc_transport_ops_t),
     .name = "rdma",
     .slot = &slots[2],
     .codec = &mc__rdma_codec},
    {.size = sizeof(mc_transport_ops_t),
     .name = "file",
     .slot = &slots[3],
     .codec = &mc__file_codec},
};
const mc_transport_ops_t *const mc__transports[] = {&codecs[0], &codecs[1], &codecs[2], &codecs[3]};
const unsigned mc__n_transports = 4;

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond);               \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

static void check_str(const char *s, size_t size)
{
    CHECK(memchr(s, 0, size) != NULL);
    CHECK(s[0] != 0);
}

/* The decoder accepted the text, so jansson parses it too; count its buffers independently. */
static size_t json_buffer_count(const uint8_t *data, size_t size)
{
    json_t *root = json_loadb((const char *)data, size, JSON_REJECT_DUPLICATES, NULL);
    size_t n;

    CHECK(root != NULL);
    n = json_array_size(json_object_get(root, "buffers"));
    json_decref(root);
    return n;
}

static void check_desc(const mc_desc_t *d, const uint8_t *data, size_t size)
{
    check_str(d->name, sizeof(d->name));
    check_str(d->host_id, sizeof(d->host_id));
    CHECK(d->tp[0] != NULL); /* tcp, the control transport, has an endpoint */
    CHECK(d->n_buffers == json_buffer_count(data, size));
    CHECK(d->buffers != NULL);
    for (size_t i = 0; i < d->n_buffers; i++) {
        const mc_desc_buffer_t *b = &d->buffers[i];
        CHECK(b->len > 0);
        CHECK(b->addr + b->len >= b->addr);
        check_str(b->location, sizeof(b->location));
        for (unsigned t = 0; t < mc__n_transports; t++)
            CHECK(b->part[t] == 0 || b->part[t] - 1 + 1 <= d->parts_len);
        /* opaque (not memory) exactly above MC_OPAQUE_BASE; one a codec claims (a file) is one
         * whose part it stored */
        CHECK((b->owner != 0) == (b->addr >= MC_OPAQUE_BASE));
        CHECK(b->owner == 0 || b->owner == MC_OWNER_NONE ||
              (b->owner <= mc__n_transports && b->part[b->owner - 1]));
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    mc_desc_t d, before;

    memset(&d, 0xa5, sizeof(d));
    memcpy(&before, &d, sizeof(d));
    if (mc__desc_decode(data, size, &d)) {
        CHECK(memcmp(&d, &before, sizeof(d)) == 0);
        return 0;
    }
    check_desc(&d, data, size);
    mc__desc_free(&d);
    CHECK(d.buffers == NULL && d.n_buffers == 0 && d.parts == NULL);
    return 0;
}
