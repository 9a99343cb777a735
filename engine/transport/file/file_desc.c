/* The file part of a peer's descriptor: its I/O backend and bounce chunk size ("file":
 * {"io": "io_uring", "chunk": 1048576}), and for each of its file buffers where it lies in the
 * file ("file": {"path", "offset", "flags", "align"}), which also marks the buffer as ours to
 * move (an opaque buffer: mc_desc_buffer_t.owner). Pure: fuzzed with the descriptor decoder. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../util/bytes.h"
#include "file_int.h"

#define PATH_LEN_MAX 4095

static int bad(const char *what)
{
    return mc__set_error(-MC_EPROTO, "descriptor: file part: %s", what);
}

static int file_decode(json_t *root, const char *name, void **part_p)
{
    json_t *f = json_object_get(root, "file"), *chunk;
    const char *io;
    file_desc_t *d;

    (void)name;
    if (!f)
        return 0;
    io = json_string_value(json_object_get(f, "io"));
    chunk = json_object_get(f, "chunk");
    if (!json_is_object(f) || !io || !*io || strlen(io) >= sizeof(d->io) ||
        !json_is_integer(chunk) || json_integer_value(chunk) < 4096 ||
        json_integer_value(chunk) > MC_SLICE_MAX)
        return bad("\"io\" or \"chunk\" missing or out of range");
    d = calloc(1, sizeof(*d));
    if (!d)
        return mc__set_error(-ENOMEM, "out of memory decoding a descriptor");
    memcpy(d->io, io, strlen(io) + 1);
    d->chunk = (uint32_t)json_integer_value(chunk);
    *part_p = d;
    return 0;
}

static bool is_uint(json_t *v, uint64_t max)
{
    return json_is_integer(v) && json_integer_value(v) >= 0 &&
           (uint64_t)json_integer_value(v) <= max;
}

/* align: 0 (no O_DIRECT), else a power of two up to 1 MiB. */
static bool align_ok(uint64_t a)
{
    return a <= (1u << 20) && !(a & (a - 1));
}

static int part_add(mc_desc_t *d, unsigned slot, mc_desc_buffer_t *b, uint64_t offset,
                    uint32_t flags, uint32_t align, const char *path)
{
    size_t plen = strlen(path), size = sizeof(file_desc_buf_t) + plen + 1;
    file_desc_buf_t *p = malloc(size);
    int rc;

    if (!p)
        return mc__set_error(-ENOMEM, "out of memory decoding a descriptor");
    p->offset = offset;
    p->flags = flags;
    p->align = align;
    memcpy(p->path, path, plen + 1);
    rc = mc__desc_part_add(d, b, slot, p, size);
    free(p);
    if (!rc)
        b->owner = (uint8_t)(slot + 1);
    return rc;
}

static int hex_digit(char c)
{
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

/* A VRAM buffer's "cuda_ipc": {"handle": 128 hex digits, "offset", "gen" (optional)}: its part
 * (the buffer stays memory: owner 0). */
static int ipc_decode(json_t *ipc, mc_desc_t *d, unsigned slot, mc_desc_buffer_t *b)
{
    const char *hex = json_string_value(json_object_get(ipc, "handle"));
    json_t *off = json_object_get(ipc, "offset"), *gen = json_object_get(ipc, "gen");
    file_desc_ipc_t x;

    if (!json_is_object(ipc) || !hex || strlen(hex) != 2 * FILE_IPC_HANDLE ||
        !is_uint(off, INT64_MAX) || (gen && !is_uint(gen, INT64_MAX)) ||
        strncmp(b->location, "cuda:", 5))
        return bad("a buffer's \"cuda_ipc\" is malformed, or not on VRAM");
    for (unsigned i = 0; i < FILE_IPC_HANDLE; i++) {
        int hi = hex_digit(hex[2 * i]), lo = hex_digit(hex[2 * i + 1]);
        if (hi < 0 || lo < 0)
            return bad("a buffer's \"cuda_ipc\" handle is not hex");
        x.handle[i] = (uint8_t)(hi << 4 | lo);
    }
    x.off = (uint64_t)json_integer_value(off);
    x.gen = gen ? (uint64_t)json_integer_value(gen) : 0;
    return mc__desc_part_add(d, b, slot, &x, sizeof(x));
}

static int file_decode_buffer(json_t *jb, const void *part, mc_desc_t *d, unsigned slot,
                              mc_desc_buffer_t *b)
{
    json_t *f = json_object_get(jb, "file"), *off, *flags, *align;
    json_t *ipc = json_object_get(jb, "cuda_ipc");
    const char *path;

    (void)part;
    if (ipc && !f)
        return ipc_decode(ipc, d, slot, b);
    if (!f)
        return 0;
    path = json_string_value(json_object_get(f, "path"));
    off = json_object_get(f, "offset");
    flags = json_object_get(f, "flags");
    align = json_object_get(f, "align");
    if (!json_is_object(f) || !path || !*path || strlen(path) > PATH_LEN_MAX ||
        !is_uint(off, INT64_MAX) || !is_uint(flags, UINT32_MAX) || !is_uint(align, 1u << 20) ||
        !align_ok((uint64_t)json_integer_value(align)))
        return bad("a buffer's \"path\", \"offset\", \"flags\" or \"align\" is missing or bad");
    if (strcmp(b->location, "file"))
        return bad("a file buffer whose location is not \"file\"");
    return part_add(d, slot, b, (uint64_t)json_integer_value(off),
                    (uint32_t)json_integer_value(flags), (uint32_t)json_integer_value(align), path);
}

/* In a buffer key: u64 offset, u32 flags, u32 align (the path does not fit), u32 the owner's
 * chunk size: a descriptor of the owner from before its first file has no file part, and
 * without the chunk a peer sliced by its own (larger) one, which the owner refused. */
static int file_decode_key(const uint8_t *in, size_t len, const void *part, mc_desc_t *d,
                           unsigned slot, mc_desc_buffer_t *b)
{
    uint32_t chunk = len == 20 ? mc__get32(in + 16) : 0; /* (16: a key of before, none) */
    file_desc_t *fd;
    int rc;

    if ((len != 16 && len != 20) || !align_ok(mc__get32(in + 12)) ||
        (len == 20 && (chunk < 4096 || chunk > MC_SLICE_MAX)) || strcmp(b->location, "file"))
        return mc__set_error(-MC_EPROTO, "buffer key: bad file part");
    rc = part_add(d, slot, b, mc__get64(in), mc__get32(in + 8), mc__get32(in + 12), "");
    if (!rc && !part && chunk && !d->tp[slot]) { /* the owner's part, until its descriptor */
        if (!(fd = calloc(1, sizeof(*fd))))
            return 0; /* (our own chunk size then, as before) */
        snprintf(fd->io, sizeof(fd->io), "?");
        fd->chunk = chunk;
        d->tp[slot] = fd;
    }
    return rc;
}

const mc_desc_codec_t mc__file_codec = {
    .decode = file_decode,
    .decode_buffer = file_decode_buffer,
    .decode_key = file_decode_key,
    .free_part = free,
};
