/* Segment descriptors: decoding a peer's (pure: fuzzed by fuzz/fuzz_desc.c). local_segment.c
 * encodes ours. The same JSON text is stored in metadata (mooncake/ram/<name>), exported as a
 * blob, and sent in DESC_REPLY.
 *
 *   {"name": "127.0.0.1:4000", "version": 1, "host": "<boot id>/net:<inode>", "pid": 42,
 *    "endpoints": [{"transport": "tcp", "addr": "127.0.0.1:4000"},
 *                  {"transport": "shm", "addr": "mooncake/<instance>"}],
 *    "buffers": [{"addr": 140..., "length": 1048576, "location": "cpu:0", "shm": true,
 *                 "mr_chunk": 1048576, "rkey": [[17], [33]]}],
 *    "rdma": [{"name": "mlx5_0", "link": "ib", "lid": 3, "gid": "fe80::..."}, ...],
 *    "priority_matrix": {"cpu:0": [["eth0"], ["eth1"]]}}
 *
 * "rkey" holds, per RDMA device in "rdma" order, the rkeys of the buffer's memory regions, each
 * covering "mr_chunk" bytes (the last one less): a buffer larger than a device's largest memory
 * region is registered in pieces. A buffer without "rkey" is not reachable over rdma.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "engine_int.h"

#define DESC_MAX_BUFFERS (1u << 20)
#define DESC_MAX_RKEYS   (1u << 22)
#define DESC_MIN_CHUNK   4096

static int copy_str(json_t *v, const char *field, char *out, size_t size)
{
    const char *s = json_string_value(json_object_get(v, field));

    if (!s || strlen(s) >= size || !*s)
        return mc__set_error(-MC_EPROTO, "descriptor: \"%s\" missing, empty or too long", field);
    memcpy(out, s, strlen(s) + 1);
    return 0;
}

static int decode_endpoints(json_t *root, mc_desc_t *d)
{
    json_t *eps = json_object_get(root, "endpoints"), *ep;
    size_t i;

    if (!json_is_array(eps))
        return mc__set_error(-MC_EPROTO, "descriptor: \"endpoints\" is not an array");
    json_array_foreach(eps, i, ep)
    {
        const char *t = json_string_value(json_object_get(ep, "transport"));
        if (t && !strcmp(t, "shm")) {
            int rc = copy_str(ep, "addr", d->shm_addr, sizeof(d->shm_addr));
            if (rc)
                return rc;
            continue;
        }
        if (!t || strcmp(t, "tcp") || d->n_tcp == MC_MAX_RAILS)
            continue;
        int rc = copy_str(ep, "addr", d->tcp_addrs[d->n_tcp], sizeof(d->tcp_addrs[0]));
        if (rc)
            return rc;
        d->n_tcp++;
    }
    if (!d->n_tcp)
        return mc__set_error(-MC_EPROTO, "descriptor of %s has no tcp endpoint", d->name);
    memcpy(d->tcp_addr, d->tcp_addrs[0], sizeof(d->tcp_addr));
    return 0;
}

static int decode_buffer(json_t *jb, mc_desc_buffer_t *b)
{
    json_t *a = json_object_get(jb, "addr"), *l = json_object_get(jb, "length");

    if (!json_is_integer(a) || !json_is_integer(l) || json_integer_value(a) < 0 ||
        json_integer_value(l) <= 0)
        return mc__set_error(-MC_EPROTO, "descriptor: buffer without a valid addr/length");
    b->addr = (uint64_t)json_integer_value(a);
    b->len = (uint64_t)json_integer_value(l);
    b->shm = json_is_true(json_object_get(jb, "shm"));
    if (b->addr + b->len < b->addr)
        return mc__set_error(-MC_EPROTO, "descriptor: buffer wraps around");
    return copy_str(jb, "location", b->location, sizeof(b->location));
}

static int decode_rdma_dev(json_t *jd, mc_desc_rdma_t *r)
{
    const char *link = json_string_value(json_object_get(jd, "link"));
    const char *gid = json_string_value(json_object_get(jd, "gid"));
    json_t *lid = json_object_get(jd, "lid");
    int rc = copy_str(jd, "name", r->name, sizeof(r->name));

    if (rc)
        return rc;
    if (!link || (strcmp(link, "ib") && strcmp(link, "eth")) || !gid ||
        inet_pton(AF_INET6, gid, r->gid) != 1 || !json_is_integer(lid) ||
        json_integer_value(lid) < 0 || json_integer_value(lid) > 0xffff)
        return mc__set_error(-MC_EPROTO,
                             "descriptor: RDMA device %s needs link ib|eth, a gid "
                             "and a 16-bit lid",
                             r->name);
    r->link = !strcmp(link, "ib") ? 1 /* IBV_LINK_LAYER_INFINIBAND */ : 2 /* _ETHERNET */;
    r->lid = (uint16_t)json_integer_value(lid);
    return 0;
}

static int decode_rdma(json_t *root, mc_desc_t *d)
{
    json_t *arr = json_object_get(root, "rdma"), *jd;
    size_t i;

    if (!arr)
        return 0;
    if (!json_is_array(arr) || json_array_size(arr) > MC_RDMA_MAX_DEVS)
        return mc__set_error(-MC_EPROTO, "descriptor: \"rdma\" is not an array of at most %d",
                             MC_RDMA_MAX_DEVS);
    json_array_foreach(arr, i, jd)
    {
        int rc = decode_rdma_dev(jd, &d->rdma[i]);
        if (rc)
            return rc;
    }
    d->n_rdma = (unsigned)json_array_size(arr);
    return 0;
}

/* The buffer's rkeys: one array per device of d, each with one rkey per memory region. */
static int decode_rkeys(json_t *jb, mc_desc_t *d, mc_desc_buffer_t *b, size_t *used)
{
    json_t *arr = json_object_get(jb, "rkey"), *chunk = json_object_get(jb, "mr_chunk"), *dev;
    size_t i;

    if (!arr)
        return 0;
    if (!json_is_array(arr) || json_array_size(arr) != d->n_rdma || !d->n_rdma ||
        !json_is_integer(chunk) || json_integer_value(chunk) < DESC_MIN_CHUNK)
        return mc__set_error(-MC_EPROTO,
                             "descriptor: buffer 0x%llx: \"rkey\" needs one array "
                             "per RDMA device and \"mr_chunk\" >= %d",
                             (unsigned long long)b->addr, DESC_MIN_CHUNK);
    b->chunk = (uint64_t)json_integer_value(chunk);
    b->n_chunks = (uint32_t)((b->len + b->chunk - 1) / b->chunk);
    if (*used + (size_t)b->n_chunks * d->n_rdma > DESC_MAX_RKEYS)
        return mc__set_error(-MC_EPROTO, "descriptor: more than %u rkeys", DESC_MAX_RKEYS);
    uint32_t *v = realloc(d->rkeys, (*used + (size_t)b->n_chunks * d->n_rdma) * sizeof(*v));
    if (!v)
        return mc__set_error(-ENOMEM, "out of memory decoding a descriptor");
    d->rkeys = v;
    b->rkey_off = (uint32_t)*used;
    json_array_foreach(arr, i, dev)
    {
        json_t *k;
        size_t j;
        if (!json_is_array(dev) || json_array_size(dev) != b->n_chunks)
            return mc__set_error(-MC_EPROTO,
                                 "descriptor: buffer 0x%llx: %u rkeys expected per "
                                 "device",
                                 (unsigned long long)b->addr, b->n_chunks);
        json_array_foreach(dev, j, k)
        {
            if (!json_is_integer(k) || json_integer_value(k) < 0 ||
                json_integer_value(k) > 0xffffffffll)
                return mc__set_error(-MC_EPROTO, "descriptor: an rkey is not a 32-bit integer");
            v[*used + i * b->n_chunks + j] = (uint32_t)json_integer_value(k);
        }
    }
    *used += (size_t)b->n_chunks * d->n_rdma;
    return 0;
}

static int buffer_cmp(const void *a, const void *b)
{
    const mc_desc_buffer_t *x = a, *y = b;
    return x->addr < y->addr ? -1 : x->addr > y->addr;
}

static int decode_buffers(json_t *root, mc_desc_t *d)
{
    size_t rkeys = 0;
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
        int rc = decode_buffer(jb, &d->buffers[i]);
        if (!rc)
            rc = decode_rkeys(jb, d, &d->buffers[i], &rkeys);
        if (rc)
            return rc;
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
    if (!rc && json_integer_value(json_object_get(root, "version")) != MC_PROTO_VERSION)
        rc = mc__set_error(-MC_EVERSION, "descriptor version is not %d", MC_PROTO_VERSION);
    if (!rc)
        rc = decode_endpoints(root, &d);
    if (!rc)
        rc = decode_rdma(root, &d);
    if (!rc)
        rc = decode_buffers(root, &d);
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

const mc_desc_buffer_t *mc__desc_find(const mc_desc_t *d, uint64_t addr, uint64_t len)
{
    size_t lo = 0, hi = d->n_buffers;

    while (lo < hi) { /* after the loop: buffers[lo - 1] is the last starting at or below addr */
        size_t mid = (lo + hi) / 2;
        if (d->buffers[mid].addr <= addr)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (!lo)
        return NULL;
    const mc_desc_buffer_t *b = &d->buffers[lo - 1];
    return addr - b->addr <= b->len && len <= b->len - (addr - b->addr) ? b : NULL;
}

void mc__desc_free(mc_desc_t *d)
{
    free(d->buffers);
    free(d->rkeys);
    d->buffers = NULL;
    d->rkeys = NULL;
    d->n_buffers = 0;
}
