/* Segment descriptors: ours encoded, peers' decoded. The same JSON text is stored in metadata
 * (mooncake/ram/<name>), exported as a blob, and sent in the handshake's descriptor reply.
 *
 *   {"name": "127.0.0.1:4000", "version": 2, "host": "<boot id>/net:<inode>", "pid": 42,
 *    "instance": "<16 hex digits: the engine's random instance, optional>",
 *    "buffers": [{"addr": 140..., "length": 1048576, "location": "cpu:0", ...}],
 *    "priority_matrix": {"cpu:0": [["eth0"], ["eth1"]]}, ...}
 *
 * A buffer may say "internal": true (the engine's own bounce buffers) and "read_only": true
 * (mapped without write permission: peers' WRITEs into it are refused at submit).
 * The core writes and reads the fields above; each transport adds its own (its encode ops) and
 * reads them back (its codec): tcp and shm their "endpoints" entries, shm a buffer's "shm", rdma
 * its "rdma" device list and a buffer's "rkey" and "mr_chunk". Decoding is pure and strict
 * (fuzzed by fuzz/fuzz_desc.c): anything malformed is -MC_EPROTO with a reason. Our own is
 * encoded in descriptor_local.c, which needs the whole engine.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "transport/transport.h"

#define DESC_MAX_BUFFERS (1u << 20)
#define DESC_MAX_PARTS   (64u << 20) /* bytes of transport parts of all buffers */
#define DESC_DEAD_PACK   (64u << 10) /* dead bytes in parts before they are packed away */

/* ---- decoding ---- */

static int copy_str(json_t *v, const char *field, char *out, size_t size)
{
    const char *s = json_string_value(json_object_get(v, field));

    if (!s || strlen(s) >= size || !*s)
        return mc__set_error(-MC_EPROTO, "descriptor: \"%s\" missing, empty or too long", field);
    memcpy(out, s, strlen(s) + 1);
    return 0;
}

/* Bytes a part of len takes in parts (mc__desc_part_add: 8-byte aligned, one at least). */
static size_t part_room(uint32_t len)
{
    return ((size_t)(len ? len : 1) + 7) & ~(size_t)7;
}

static void parts_pack(mc_desc_t *d);

int mc__desc_part_add(mc_desc_t *d, mc_desc_buffer_t *b, unsigned slot, const void *data,
                      size_t len)
{
    size_t off = (d->parts_len + 7) & ~(size_t)7, need = off + (len ? len : 1);

    if (need > DESC_MAX_PARTS && d->parts_dead) { /* (b's parts so far move with the others) */
        parts_pack(d);
        off = (d->parts_len + 7) & ~(size_t)7;
        need = off + (len ? len : 1);
    }
    if (need > DESC_MAX_PARTS)
        return mc__set_error(-MC_EPROTO, "descriptor: more than %u bytes of transport data",
                             DESC_MAX_PARTS);
    if (need > d->parts_cap) {
        size_t cap = d->parts_cap ? 2 * d->parts_cap : 256;
        while (cap < need)
            cap *= 2;
        uint8_t *v = realloc(d->parts, cap);
        if (!v)
            return mc__set_error(-ENOMEM, "out of memory decoding a descriptor");
        d->parts = v;
        d->parts_cap = cap;
    }
    if (len)
        memcpy(d->parts + off, data, len);
    d->parts_len = need;
    b->part[slot] = (uint32_t)off + 1;
    b->part_len[slot] = (uint32_t)len;
    return 0;
}

/* Every transport's part of the descriptor. */
static int decode_parts(json_t *root, mc_desc_t *d)
{
    for (unsigned i = 0; i < mc__n_transports; i++) {
        const mc_desc_codec_t *c = mc__transports[i]->codec;
        int rc = c && c->decode ? c->decode(root, d->name, &d->tp[i]) : 0;
        if (rc)
            return rc;
    }
    return 0;
}

static int decode_buffer(json_t *jb, mc_desc_t *d, mc_desc_buffer_t *b)
{
    json_t *a = json_object_get(jb, "addr"), *l = json_object_get(jb, "length");
    int rc;

    if (!json_is_integer(a) || !json_is_integer(l) || json_integer_value(a) < 0 ||
        json_integer_value(l) <= 0)
        return mc__set_error(-MC_EPROTO, "descriptor: buffer without a valid addr/length");
    b->addr = (uint64_t)json_integer_value(a);
    b->len = (uint64_t)json_integer_value(l);
    if (b->addr + b->len < b->addr)
        return mc__set_error(-MC_EPROTO, "descriptor: buffer wraps around");
    rc = copy_str(jb, "location", b->location, sizeof(b->location));
    b->internal = json_is_true(json_object_get(jb, "internal"));
    b->read_only = json_is_true(json_object_get(jb, "read_only"));
    for (unsigned i = 0; !rc && i < mc__n_transports; i++) {
        const mc_desc_codec_t *c = mc__transports[i]->codec;
        if (c && c->decode_buffer)
            rc = c->decode_buffer(jb, d->tp[i], d, i, b);
    }
    /* Opaque addresses name buffers some transport owns. One that no transport of ours claims
     * (a kind of buffer this engine does not know) stays listed, and nothing here moves it; one
     * claimed outside the range would be taken for memory. */
    if (!rc && b->addr >= MC_OPAQUE_BASE && !b->owner)
        b->owner = MC_OWNER_NONE;
    if (!rc && b->addr < MC_OPAQUE_BASE && b->owner)
        rc = mc__set_error(-MC_EPROTO, "descriptor: buffer at 0x%llx is not memory",
                           (unsigned long long)b->addr);
    return rc;
}

/* "instance": 16 hex digits, optional (0: unknown). */
static int decode_instance(json_t *root, uint64_t *out)
{
    json_t *v = json_object_get(root, "instance");
    const char *s = json_string_value(v);
    char *end;

    *out = 0;
    if (!v)
        return 0;
    if (!s || strlen(s) != 16 || strspn(s, "0123456789abcdef") != 16)
        return mc__set_error(-MC_EPROTO, "descriptor: \"instance\" is not 16 hex digits");
    *out = strtoull(s, &end, 16);
    return 0;
}

static int buffer_cmp(const void *a, const void *b)
{
    const mc_desc_buffer_t *x = a, *y = b;
    return x->addr < y->addr ? -1 : x->addr > y->addr;
}

static int decode_buffers(json_t *root, mc_desc_t *d)
{
    json_t *arr = json_object_get(root, "buffers"), *jb;
    size_t i;

    if (!json_is_array(arr) || json_array_size(arr) > DESC_MAX_BUFFERS)
        return mc__set_error(-MC_EPROTO, "descriptor: \"buffers\" is not an array of sane size");
    d->n_buffers = json_array_size(arr);
    d->buffers = calloc(d->n_buffers ? d->n_buffers : 1, sizeof(*d->buffers));
    if (!d->buffers)
        return mc__set_error(-ENOMEM, "out of memory decoding a descriptor");
    json_array_foreach(arr, i, jb)
    {
        int rc = decode_buffer(jb, d, &d->buffers[i]);
        if (rc)
            return rc;
        if (!d->buffers[i].owner && d->buffers[i].len > d->max_len)
            d->max_len = d->buffers[i].len;
    }
    qsort(d->buffers, d->n_buffers, sizeof(*d->buffers), buffer_cmp);
    return 0;
}

int mc__desc_decode(const void *buf, size_t len, mc_desc_t *out)
{
    json_error_t jerr;
    mc_desc_t d = {0};
    json_t *root = json_loadb(buf, len, JSON_REJECT_DUPLICATES, &jerr);
    json_t *pid;
    int rc;

    if (!root)
        return mc__set_error(-MC_EPROTO, "descriptor is not JSON: %s (offset %d)", jerr.text,
                             jerr.position);
    rc = json_is_object(root) ? 0 : mc__set_error(-MC_EPROTO, "descriptor is not an object");
    if (!rc)
        rc = copy_str(root, "name", d.name, sizeof(d.name));
    if (!rc)
        rc = copy_str(root, "host", d.host_id, sizeof(d.host_id));
    if (!rc && json_integer_value(json_object_get(root, "version")) != MC_DESC_VERSION)
        rc = mc__set_error(-MC_EVERSION, "descriptor version is not %d", MC_DESC_VERSION);
    if (!rc)
        rc = decode_parts(root, &d);
    if (!rc)
        rc = decode_buffers(root, &d);
    if (!rc)
        rc = decode_instance(root, &d.instance);
    pid = json_object_get(root, "pid");
    d.pid = json_is_integer(pid) ? (int)json_integer_value(pid) : 0;
    json_decref(root);
    if (rc) {
        mc__desc_free(&d);
        return rc;
    }
    *out = d;
    return 0;
}

/* The number of buffers starting at or below addr (binary search). */
static size_t desc_floor(const mc_desc_t *d, uint64_t addr)
{
    size_t lo = 0, hi = d->n_buffers;

    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (d->buffers[mid].addr <= addr)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

const mc_desc_buffer_t *mc__desc_find(const mc_desc_t *d, uint64_t addr, uint64_t len)
{
    const mc_desc_buffer_t *best = NULL;

    /* Buffers may overlap (the same pages registered twice): look back over those that start
     * close enough below addr to hold it, nearest first. Opaque ones never overlap: the nearest
     * is the only one. Of buffers keys added, the newest holder: an older one may be of a
     * registration the owner has dropped since (keys are not withdrawn; only a descriptor
     * replaces them), whose rdma keys its NIC refuses; the newest key is the one the host was
     * just given for this request. */
    for (size_t i = desc_floor(d, addr); i-- > 0;) {
        const mc_desc_buffer_t *b = &d->buffers[i];
        bool holds = addr - b->addr <= b->len && len <= b->len - (addr - b->addr);
        if (addr >= MC_OPAQUE_BASE)
            return b->owner && holds ? b : NULL;
        if (addr - b->addr >= d->max_len)
            break;
        if (holds && !d->keys_added)
            return b;
        if (holds && (!best || b->added > best->added))
            best = b;
    }
    return best;
}

const mc_desc_buffer_t *mc__desc_entry(const mc_desc_t *d, uint64_t addr, uint64_t len,
                                       uint64_t serial)
{
    for (size_t i = desc_floor(d, addr); i-- > 0 && d->buffers[i].addr == addr;)
        if (d->buffers[i].len == len && d->buffers[i].serial == serial)
            return &d->buffers[i];
    return NULL;
}

int mc__desc_buffer_add(mc_desc_t *d, uint64_t addr, uint64_t len, const char *location,
                        mc_desc_buffer_t **b_p)
{
    size_t at = desc_floor(d, addr);
    mc_desc_buffer_t *v = realloc(d->buffers, (d->n_buffers + 1) * sizeof(*v));

    if (!v)
        return mc__set_error(-ENOMEM, "out of memory");
    d->buffers = v;
    memmove(&v[at + 1], &v[at], (d->n_buffers - at) * sizeof(*v));
    memset(&v[at], 0, sizeof(*v));
    v[at].addr = addr;
    v[at].len = len;
    snprintf(v[at].location, sizeof(v[at].location), "%s", location);
    d->n_buffers++;
    d->layout++;
    if (addr < MC_OPAQUE_BASE && len > d->max_len)
        d->max_len = len;
    *b_p = &v[at];
    return 0;
}

void mc__desc_buffer_remove(mc_desc_t *d, mc_desc_buffer_t *b)
{
    size_t at = (size_t)(b - d->buffers);

    memmove(b, b + 1, (d->n_buffers - at - 1) * sizeof(*b));
    d->n_buffers--;
    d->layout++;
}

/* Copy every buffer's parts into a new parts array, in order, without the dead ones' bytes.
 * Out of memory: they stay where they are. */
static void parts_pack(mc_desc_t *d)
{
    size_t cap = 8, len = 0;
    uint8_t *v;

    for (size_t i = 0; i < d->n_buffers; i++)
        for (unsigned slot = 0; slot < MC_TP_MAX; slot++)
            if (d->buffers[i].part[slot])
                cap += part_room(d->buffers[i].part_len[slot]);
    if (!(v = malloc(cap)))
        return;
    for (size_t i = 0; i < d->n_buffers; i++) {
        mc_desc_buffer_t *b = &d->buffers[i];
        for (unsigned slot = 0; slot < MC_TP_MAX; slot++) {
            if (!b->part[slot])
                continue;
            memcpy(v + len, d->parts + b->part[slot] - 1, b->part_len[slot]);
            b->part[slot] = (uint32_t)len + 1;
            len += part_room(b->part_len[slot]);
        }
    }
    free(d->parts);
    d->parts = v;
    d->parts_len = len;
    d->parts_cap = cap;
    d->parts_dead = 0;
    d->parts_packs++;
}

void mc__desc_buffer_replaced(mc_desc_t *d, mc_desc_buffer_t *b)
{
    for (unsigned slot = 0; slot < MC_TP_MAX; slot++)
        if (b->part[slot])
            d->parts_dead += part_room(b->part_len[slot]);
    mc__desc_buffer_remove(d, b);
    if (d->parts_dead >= DESC_DEAD_PACK && 2 * d->parts_dead >= d->parts_len)
        parts_pack(d);
}

void mc__desc_free(mc_desc_t *d)
{
    for (unsigned i = 0; i < mc__n_transports; i++) {
        const mc_desc_codec_t *c = mc__transports[i]->codec;
        if (d->tp[i] && c && c->free_part)
            c->free_part(d->tp[i]);
        d->tp[i] = NULL;
    }
    free(d->buffers);
    free(d->parts);
    d->buffers = NULL;
    d->parts = NULL;
    d->parts_len = d->parts_cap = d->parts_dead = 0;
    d->n_buffers = 0;
    d->max_len = 0;
}
