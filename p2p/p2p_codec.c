/* JSON codecs of the description and the replica entry (layout in p2p_codec.h). */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "p2p_codec.h"
#include "p2p_int.h"

#define P2P_JSON_VERSION 1

static const char b64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

static char *b64_encode(const uint8_t *p, size_t n)
{
    char *out = malloc((n + 2) / 3 * 4 + 1), *o = out;

    for (size_t i = 0; out && i < n; i += 3) {
        uint32_t v = (uint32_t)p[i] << 16 | (i + 1 < n ? (uint32_t)p[i + 1] << 8 : 0) |
                     (i + 2 < n ? p[i + 2] : 0);
        *o++ = b64[v >> 18 & 63];
        *o++ = b64[v >> 12 & 63];
        *o++ = i + 1 < n ? b64[v >> 6 & 63] : '=';
        *o++ = i + 2 < n ? b64[v & 63] : '=';
    }
    if (out)
        *o = '\0';
    return out;
}

/* Decode exactly n bytes into out; -1 if s is not their base64. */
static int b64_decode(const char *s, uint8_t *out, size_t n)
{
    size_t len = strlen(s), k = 0;
    uint32_t v = 0;
    int bits = 0;

    if (len != (n + 2) / 3 * 4)
        return -1;
    for (size_t i = 0; i < len && s[i] != '='; i++) {
        const char *c = strchr(b64, s[i]);
        if (!c || !s[i])
            return -1;
        v = v << 6 | (uint32_t)(c - b64);
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            if (k < n)
                out[k++] = (uint8_t)(v >> bits);
        }
    }
    return k == n ? 0 : -1;
}

static int encode_done(json_t *o, char **json_p, size_t *len_p)
{
    char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;

    json_decref(o);
    if (!s)
        return mc__p2p_error(-ENOMEM, "out of memory encoding JSON");
    *json_p = s;
    *len_p = strlen(s);
    return 0;
}

static json_t *hex64(uint64_t v)
{
    char s[17];

    snprintf(s, sizeof(s), "%016" PRIx64, v);
    return json_string(s);
}

static int parse_hex64(json_t *j, uint64_t *v_p)
{
    const char *s = json_string_value(j);
    char *end;

    if (!s || strlen(s) != 16)
        return -1;
    *v_p = strtoull(s, &end, 16);
    return *end ? -1 : 0;
}

int mc__p2p_desc_encode(const p2p_desc_t *d, char **json_p, size_t *len_p)
{
    json_t *sums = json_array();
    json_t *o = json_pack("{s:i, s:o, s:I, s:I, s:I, s:s, s:o, s:s}", "v", P2P_JSON_VERSION, "id",
                          hex64(d->id), "size", (json_int_t)d->size, "shard_size",
                          (json_int_t)d->shard_size, "shards", (json_int_t)d->shards, "hash",
                          P2P_HASH_NAME, "checksums", sums, "origin", d->origin);

    for (uint32_t i = 0; o && i < d->shards; i++)
        if (json_array_append_new(sums, hex64(d->sums[i]))) {
            json_decref(o);
            o = NULL;
        }
    return encode_done(o, json_p, len_p);
}

static int proto(const char *what, const char *why)
{
    return mc__p2p_error(-EPROTO, "%s: %s", what, why);
}

/* The fields both documents start with: version, id. */
static int decode_head(json_t *o, const char *what, uint64_t *id_p)
{
    json_int_t v;

    if (!json_is_object(o))
        return proto(what, "not a JSON object");
    if (json_unpack(o, "{s:I}", "v", &v) || v != P2P_JSON_VERSION)
        return proto(what, "no \"v\":1 (written by another version?)");
    if (parse_hex64(json_object_get(o, "id"), id_p))
        return proto(what, "no 16-hex-digit \"id\"");
    return 0;
}

static int desc_sums(json_t *sums, p2p_desc_t *d)
{
    if (!json_is_array(sums) || json_array_size(sums) != d->shards)
        return proto("description", "\"checksums\" is not an array of one per shard");
    d->sums = malloc(d->shards * sizeof(*d->sums));
    if (!d->sums)
        return mc__p2p_error(-ENOMEM, "out of memory");
    for (uint32_t i = 0; i < d->shards; i++)
        if (parse_hex64(json_array_get(sums, i), &d->sums[i]))
            return proto("description", "a checksum is not 16 hex digits");
    return 0;
}

static int desc_fields(json_t *o, p2p_desc_t *d)
{
    json_int_t size, shard, shards;
    const char *hash, *origin;
    json_t *sums;

    if (json_unpack(o, "{s:I, s:I, s:I, s:s, s:o, s:s}", "size", &size, "shard_size", &shard,
                    "shards", &shards, "hash", &hash, "checksums", &sums, "origin", &origin))
        return proto("description", "a field is missing or of the wrong type");
    if (strcmp(hash, P2P_HASH_NAME))
        return proto("description", "a checksum other than xxh3-64");
    if (size <= 0 || shard <= 0 || shards <= 0 || shards > MC_P2P_SHARDS_MAX ||
        (size - 1) / shard + 1 != shards)
        return proto("description", "size, shard_size and shards do not agree");
    d->size = (uint64_t)size;
    d->shard_size = (uint64_t)shard;
    d->shards = (uint32_t)shards;
    snprintf(d->origin, sizeof(d->origin), "%s", origin);
    return desc_sums(sums, d);
}

int mc__p2p_desc_decode(const char *json, size_t len, p2p_desc_t *d)
{
    json_t *o = json_loadb(json, len, 0, NULL);
    int rc;

    memset(d, 0, sizeof(*d));
    rc = decode_head(o, "description", &d->id);
    if (!rc)
        rc = desc_fields(o, d);
    json_decref(o);
    if (rc)
        mc__p2p_desc_free(d);
    return rc;
}

void mc__p2p_desc_free(p2p_desc_t *d)
{
    free(d->sums);
    d->sums = NULL;
}

int mc__p2p_entry_encode(const p2p_entry_t *e, char **json_p, size_t *len_p)
{
    json_t *bufs = json_array();
    json_t *o = json_pack("{s:i, s:o, s:b, s:b, s:I, s:o}", "v", P2P_JSON_VERSION, "id",
                          hex64(e->id), "origin", e->origin, "complete", e->complete, "shards",
                          (json_int_t)e->shards, "bufs", bufs);
    char *have = NULL;

    for (size_t i = 0; o && i < e->n_bufs; i++)
        if (json_array_append_new(bufs, json_pack("[I,I]", (json_int_t)e->bufs[i].addr,
                                                  (json_int_t)e->bufs[i].len))) {
            json_decref(o);
            o = NULL;
        }
    if (o && !e->complete &&
        (!(have = b64_encode(e->have, (e->shards + 7) / 8)) ||
         json_object_set_new(o, "have", json_string(have)))) {
        json_decref(o);
        o = NULL;
    }
    free(have);
    return encode_done(o, json_p, len_p);
}

static int entry_bufs(json_t *bufs, uint64_t size, p2p_entry_t *e)
{
    uint64_t total = 0;
    size_t i;
    json_t *b;

    if (!json_is_array(bufs) || json_array_size(bufs) == 0)
        return proto("replica entry", "\"bufs\" is not a non-empty array");
    e->n_bufs = json_array_size(bufs);
    e->bufs = calloc(e->n_bufs, sizeof(*e->bufs));
    if (!e->bufs)
        return mc__p2p_error(-ENOMEM, "out of memory");
    json_array_foreach(bufs, i, b)
    {
        json_int_t addr, len;
        if (json_unpack(b, "[I,I]", &addr, &len) || addr <= 0 || len <= 0)
            return proto("replica entry", "a buffer is not [addr,len]");
        /* Checked before adding: lengths of a crafted entry could wrap the sum to size. */
        if ((uint64_t)len > size - total)
            return proto("replica entry", "its buffers hold more than the object");
        e->bufs[i] = (p2p_rbuf_t){(uint64_t)addr, (uint64_t)len};
        total += (uint64_t)len;
    }
    return total == size ? 0 : proto("replica entry", "its buffers do not hold the object");
}

static int entry_have(json_t *o, p2p_entry_t *e)
{
    size_t n = (e->shards + 7) / 8;
    const char *have;

    e->have = calloc(n ? n : 1, 1);
    if (!e->have)
        return mc__p2p_error(-ENOMEM, "out of memory");
    if (e->complete) {
        for (uint32_t i = 0; i < e->shards; i++)
            p2p_bit_set(e->have, i);
        return 0;
    }
    if (json_unpack(o, "{s:s}", "have", &have) || b64_decode(have, e->have, n))
        return proto("replica entry", "\"have\" is not the base64 bitmap of its shards");
    return 0;
}

int mc__p2p_entry_decode(const char *json, size_t len, uint64_t size, p2p_entry_t *e)
{
    json_t *o = json_loadb(json, len, 0, NULL), *bufs;
    json_int_t shards;
    int origin, complete, rc;

    memset(e, 0, sizeof(*e));
    rc = decode_head(o, "replica entry", &e->id);
    if (!rc && json_unpack(o, "{s:b, s:b, s:I, s:o}", "origin", &origin, "complete", &complete,
                           "shards", &shards, "bufs", &bufs))
        rc = proto("replica entry", "a field is missing or of the wrong type");
    if (!rc && (shards <= 0 || shards > MC_P2P_SHARDS_MAX))
        rc = proto("replica entry", "\"shards\" is out of range");
    if (!rc) {
        e->origin = origin;
        e->complete = complete;
        e->shards = (uint32_t)shards;
        rc = entry_bufs(bufs, size, e);
    }
    if (!rc)
        rc = entry_have(o, e);
    json_decref(o);
    if (rc)
        mc__p2p_entry_free(e);
    return rc;
}

int mc__p2p_entry_id(const char *json, size_t len, uint64_t *id_p)
{
    json_t *o = json_loadb(json, len, 0, NULL);
    int rc = decode_head(o, "replica entry", id_p);

    json_decref(o);
    return rc;
}

void mc__p2p_entry_free(p2p_entry_t *e)
{
    free(e->have);
    free(e->bufs);
    e->have = NULL;
    e->bufs = NULL;
}
