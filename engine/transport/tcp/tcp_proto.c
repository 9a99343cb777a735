/* Frame header and hello codecs. Pure functions: fuzzed by fuzz/fuzz_frame.c. */
#include <string.h>

#include <mooncake/error.h>

#include "tcp_proto.h"
#include "../../util/bytes.h"
#include "../../util/log.h"

void mc__tcp_frame_encode(const mc_frame_t *f, uint8_t out[MC_FRAME_HDR_LEN])
{
    mc__put32(out, MC_PROTO_MAGIC);
    out[4] = MC_PROTO_VERSION;
    out[5] = f->type;
    mc__put16(out + 6, f->flags);
    mc__put32(out + 8, f->length);
    mc__put32(out + 12, f->id);
    mc__put64(out + 16, f->addr);
    mc__put64(out + 24, f->aux);
}

static const char *const type_names[MC_FR_TYPE_MAX] = {
    [MC_FR_HELLO] = "HELLO",
    [MC_FR_HELLO_REPLY] = "HELLO_REPLY",
    [MC_FR_AUTH] = "AUTH",
    [MC_FR_READY] = "READY",
    [MC_FR_ERROR] = "ERROR",
    [MC_FR_WRITE] = "WRITE",
    [MC_FR_WRITE_ACK] = "WRITE_ACK",
    [MC_FR_READ] = "READ",
    [MC_FR_READ_RESP] = "READ_RESP",
    [MC_FR_MSG] = "MSG",
    [MC_FR_MSG_ACK] = "MSG_ACK",
    [MC_FR_DESC_REQ] = "DESC_REQ",
    [MC_FR_DESC_REPLY] = "DESC_REPLY",
    [MC_FR_RETIRE] = "RETIRE",
    [MC_FR_CTRL_REQ] = "CTRL_REQ",
    [MC_FR_CTRL_RESP] = "CTRL_RESP",
    [MC_FR_MSG_DONE] = "MSG_DONE",
};

const char *mc__tcp_frame_type_name(unsigned type)
{
    if (type == 0 || type >= MC_FR_TYPE_MAX)
        return "UNKNOWN";
    return type_names[type];
}

/* Largest payload each frame type may carry. */
static uint64_t frame_limit(uint8_t type, uint64_t desc_max)
{
    switch (type) {
    case MC_FR_AUTH:
        return 32;
    case MC_FR_READY:
    case MC_FR_READ:
    case MC_FR_DESC_REQ:
    case MC_FR_MSG_DONE:
        return 0;
    case MC_FR_WRITE:
    case MC_FR_READ_RESP:
        return MC_PROTO_MAX_DATA;
    case MC_FR_MSG:
        return 64 * 1024;
    case MC_FR_DESC_REPLY:
        return desc_max;
    case MC_FR_RETIRE:
        return MC_PROTO_MAX_RETIRE * 4;
    default:
        return MC_PROTO_MAX_CTRL;
    }
}

int mc__tcp_frame_decode(const uint8_t in[MC_FRAME_HDR_LEN], uint64_t desc_max, mc_frame_t *out)
{
    mc_frame_t f;

    if (mc__get32(in) != MC_PROTO_MAGIC)
        return mc__set_error(-MC_EPROTO, "bad frame magic 0x%08x", mc__get32(in));
    if (in[4] != MC_PROTO_VERSION)
        return mc__set_error(-MC_EVERSION, "protocol version %u, expected %u", in[4],
                             MC_PROTO_VERSION);
    if (in[5] == 0 || in[5] >= MC_FR_TYPE_MAX)
        return mc__set_error(-MC_EPROTO, "unknown frame type %u", in[5]);
    f.type = in[5];
    f.flags = mc__get16(in + 6);
    f.length = mc__get32(in + 8);
    f.id = mc__get32(in + 12);
    f.addr = mc__get64(in + 16);
    f.aux = mc__get64(in + 24);
    if (f.length > frame_limit(f.type, desc_max))
        return mc__set_error(-MC_EPROTO, "%s frame of %u bytes exceeds the limit of %llu",
                             mc__tcp_frame_type_name(f.type), f.length,
                             (unsigned long long)frame_limit(f.type, desc_max));
    if (f.type == MC_FR_READ_RESP && f.aux && f.length > MC_PROTO_MAX_CTRL)
        return mc__set_error(-MC_EPROTO, "READ_RESP refusal with a %u-byte reason", f.length);
    if (f.type == MC_FR_READ && f.aux > MC_PROTO_MAX_DATA)
        return mc__set_error(-MC_EPROTO, "READ of %llu bytes exceeds the slice limit",
                             (unsigned long long)f.aux);
    if (f.type == MC_FR_RETIRE && f.length % 4)
        return mc__set_error(-MC_EPROTO, "RETIRE payload of %u bytes", f.length);
    *out = f;
    return 0;
}

/* Hello layout: u64 instance, nonce, proof, u8 name_len, name, u8 peer_len, peer_name,
 * u8 n_retired, u32 ids. */
size_t mc__tcp_hello_encode(const mc_hello_t *h, uint8_t *buf)
{
    size_t nl = strnlen(h->name, sizeof(h->name) - 1);
    size_t pl = strnlen(h->peer_name, sizeof(h->peer_name) - 1);
    unsigned nr = h->n_retired > MC_PROTO_MAX_RETIRE ? MC_PROTO_MAX_RETIRE : h->n_retired;
    uint8_t *p = buf;

    mc__put64(p, h->instance);
    p += 8;
    memcpy(p, h->nonce, MC_PROTO_NONCE_LEN);
    p += MC_PROTO_NONCE_LEN;
    memcpy(p, h->proof, sizeof(h->proof));
    p += sizeof(h->proof);
    *p++ = (uint8_t)nl;
    memcpy(p, h->name, nl);
    p += nl;
    *p++ = (uint8_t)pl;
    memcpy(p, h->peer_name, pl);
    p += pl;
    *p++ = (uint8_t)nr;
    for (unsigned i = 0; i < nr; i++, p += 4)
        mc__put32(p, (uint32_t)h->retired[i]);
    return (size_t)(p - buf);
}

static int take_str(const uint8_t **p, const uint8_t *end, char *out, size_t size)
{
    if (*p >= end)
        return -1;
    size_t n = **p;
    (*p)++;
    if (n >= size || (size_t)(end - *p) < n || memchr(*p, 0, n))
        return -1;
    memcpy(out, *p, n);
    out[n] = 0;
    *p += n;
    return 0;
}

int mc__tcp_hello_decode(const uint8_t *buf, size_t len, mc_hello_t *h)
{
    const uint8_t *p = buf, *end = buf + len;
    const size_t fixed = 8 + MC_PROTO_NONCE_LEN + sizeof(h->proof);

    memset(h, 0, sizeof(*h));
    if (len < fixed)
        return mc__set_error(-MC_EPROTO, "hello of %zu bytes is truncated", len);
    h->instance = mc__get64(p);
    memcpy(h->nonce, p + 8, MC_PROTO_NONCE_LEN);
    memcpy(h->proof, p + 8 + MC_PROTO_NONCE_LEN, sizeof(h->proof));
    p += fixed;
    if (take_str(&p, end, h->name, sizeof(h->name)) ||
        take_str(&p, end, h->peer_name, sizeof(h->peer_name)) || p >= end)
        return mc__set_error(-MC_EPROTO, "hello names are malformed");
    h->n_retired = *p++;
    if (h->n_retired > MC_PROTO_MAX_RETIRE || (size_t)(end - p) != 4 * (size_t)h->n_retired)
        return mc__set_error(-MC_EPROTO, "hello retire list is malformed");
    for (unsigned i = 0; i < h->n_retired; i++, p += 4)
        h->retired[i] = mc__get32(p);
    return 0;
}
