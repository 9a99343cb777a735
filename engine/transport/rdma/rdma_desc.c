/* The rdma part of a peer's descriptor. Pure: fuzzed with the descriptor decoder.
 *
 *   "rdma": [{"name": "mlx5_0", "link": "ib", "lid": 3, "gid": "fe80::..."}, ...]
 *   buffers: "rkey": [[17, 18], [33, 34]], "mr_chunk": 1073741824
 *
 * A buffer's "rkey" holds, per device in "rdma" order, the rkeys of its memory regions, each
 * covering "mr_chunk" bytes (the last one less): a buffer larger than a device's largest memory
 * region is registered in pieces. A buffer without "rkey" is not reachable over rdma.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../util/bytes.h"
#include "rdma_int.h"

#define DESC_MIN_CHUNK 4096

static int decode_dev(json_t *jd, rdma_desc_dev_t *r)
{
    const char *name = json_string_value(json_object_get(jd, "name"));
    const char *link = json_string_value(json_object_get(jd, "link"));
    const char *gid = json_string_value(json_object_get(jd, "gid"));
    json_t *lid = json_object_get(jd, "lid");

    if (!name || !*name || strlen(name) >= sizeof(r->name))
        return mc__set_error(-MC_EPROTO, "descriptor: an RDMA device's \"name\" is missing, "
                                         "empty or too long");
    memcpy(r->name, name, strlen(name) + 1);
    if (!link || (strcmp(link, "ib") && strcmp(link, "eth")) || !gid ||
        inet_pton(AF_INET6, gid, r->gid) != 1 || !json_is_integer(lid) ||
        json_integer_value(lid) < 0 || json_integer_value(lid) > 0xffff)
        return mc__set_error(-MC_EPROTO,
                             "descriptor: RDMA device %s needs link ib|eth, a gid and a 16-bit lid",
                             r->name);
    r->link = !strcmp(link, "ib") ? IBV_LINK_LAYER_INFINIBAND : IBV_LINK_LAYER_ETHERNET;
    r->lid = (uint16_t)json_integer_value(lid);
    return 0;
}

static int rdma_decode(json_t *root, const char *name, void **part_p)
{
    json_t *arr = json_object_get(root, "rdma"), *jd;
    rdma_desc_t *d;
    size_t i;

    (void)name;
    if (!arr)
        return 0;
    if (!json_is_array(arr) || json_array_size(arr) > MC_RDMA_MAX_DEVS)
        return mc__set_error(-MC_EPROTO, "descriptor: \"rdma\" is not an array of at most %d",
                             MC_RDMA_MAX_DEVS);
    d = calloc(1, sizeof(*d));
    if (!d)
        return mc__set_error(-ENOMEM, "out of memory decoding a descriptor");
    json_array_foreach(arr, i, jd)
    {
        int rc = decode_dev(jd, &d->devs[i]);
        if (rc) {
            free(d);
            return rc;
        }
    }
    d->n = (unsigned)json_array_size(arr);
    *part_p = d;
    return 0;
}

/* One device's rkeys of buffer b into out[0..n_chunks). */
static int decode_dev_keys(json_t *dev, const mc_desc_buffer_t *b, uint32_t n_chunks, uint32_t *out)
{
    json_t *k;
    size_t j;

    if (!json_is_array(dev) || json_array_size(dev) != n_chunks)
        return mc__set_error(-MC_EPROTO, "descriptor: buffer 0x%llx: %u rkeys expected per device",
                             (unsigned long long)b->addr, n_chunks);
    json_array_foreach(dev, j, k)
    {
        if (!json_is_integer(k) || json_integer_value(k) < 0 ||
            json_integer_value(k) > 0xffffffffll)
            return mc__set_error(-MC_EPROTO, "descriptor: an rkey is not a 32-bit integer");
        out[j] = (uint32_t)json_integer_value(k);
    }
    return 0;
}

/* A buffer's rdma part for rd's devices in chunks of `chunk` bytes: checked, allocated with
 * room for its rkeys (free it). */
static int desc_buf_new(const rdma_desc_t *rd, const mc_desc_buffer_t *b, uint64_t chunk,
                        rdma_desc_buf_t **k_p, size_t *size_p)
{
    uint64_t n_chunks = chunk >= DESC_MIN_CHUNK ? (b->len + chunk - 1) / chunk : 0;
    rdma_desc_buf_t *k;

    if (!n_chunks)
        return mc__set_error(-MC_EPROTO, "descriptor: buffer 0x%llx: \"mr_chunk\" under %d",
                             (unsigned long long)b->addr, DESC_MIN_CHUNK);
    if (n_chunks > (1u << 20))
        return mc__set_error(-MC_EPROTO, "descriptor: buffer 0x%llx has %llu memory regions",
                             (unsigned long long)b->addr, (unsigned long long)n_chunks);
    *size_p = sizeof(*k) + (size_t)n_chunks * rd->n * sizeof(k->rkey[0]);
    k = malloc(*size_p);
    if (!k)
        return mc__set_error(-ENOMEM, "out of memory decoding a descriptor");
    k->chunk = chunk;
    k->n_chunks = (uint32_t)n_chunks;
    k->n_devs = rd->n;
    *k_p = k;
    return 0;
}

static int rdma_decode_buffer(json_t *jb, const void *part, mc_desc_t *d, unsigned slot,
                              mc_desc_buffer_t *b)
{
    const rdma_desc_t *rd = part;
    json_t *arr = json_object_get(jb, "rkey"), *chunk = json_object_get(jb, "mr_chunk"), *dev;
    rdma_desc_buf_t *k;
    size_t i, size;
    int rc;

    if (!arr)
        return 0;
    if (!rd || !json_is_array(arr) || json_array_size(arr) != rd->n || !json_is_integer(chunk) ||
        json_integer_value(chunk) < DESC_MIN_CHUNK)
        return mc__set_error(-MC_EPROTO,
                             "descriptor: buffer 0x%llx: \"rkey\" needs one array per RDMA "
                             "device and \"mr_chunk\" >= %d",
                             (unsigned long long)b->addr, DESC_MIN_CHUNK);
    rc = desc_buf_new(rd, b, (uint64_t)json_integer_value(chunk), &k, &size);
    if (rc)
        return rc;
    json_array_foreach(arr, i, dev)
    {
        if (!rc)
            rc = decode_dev_keys(dev, b, k->n_chunks, &k->rkey[i * k->n_chunks]);
    }
    if (!rc)
        rc = mc__desc_part_add(d, b, slot, k, size);
    free(k);
    return rc;
}

/* Its bytes in a buffer key (mc__rdma_key_pack): u64 mr_chunk, then the rkeys as u32, device by
 * device in the order of the descriptor's "rdma" list, chunk by chunk. */
static int rdma_decode_key(const uint8_t *in, size_t len, const void *part, mc_desc_t *d,
                           unsigned slot, mc_desc_buffer_t *b)
{
    const rdma_desc_t *rd = part;
    rdma_desc_buf_t *k;
    size_t size;
    int rc;

    if (!rd) /* no device list of the peer yet: reached otherwise */
        return 0;
    uint64_t chunk = len >= 8 ? mc__get64(in) : 0;
    uint64_t n_chunks = chunk ? b->len / chunk + (b->len % chunk != 0) : 0;
    if (len < 8 || (len - 8) % 4 || n_chunks * rd->n != (len - 8) / 4) /* before allocating */
        return mc__set_error(-MC_EPROTO,
                             "buffer key: %zu bytes of rdma part for %u devices and regions "
                             "of %llu bytes",
                             len, rd->n, (unsigned long long)chunk);
    rc = desc_buf_new(rd, b, chunk, &k, &size);
    if (rc)
        return rc;
    for (size_t j = 0; j < (size_t)k->n_chunks * k->n_devs; j++)
        k->rkey[j] = mc__get32(in + 8 + 4 * j);
    rc = mc__desc_part_add(d, b, slot, k, size);
    free(k);
    return rc;
}

const mc_desc_codec_t mc__rdma_codec = {
    .decode = rdma_decode,
    .decode_buffer = rdma_decode_buffer,
    .decode_key = rdma_decode_key,
    .free_part = free,
};
