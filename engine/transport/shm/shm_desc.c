/* The shm part of a peer's descriptor: the owner's socket (an "endpoints" entry with transport
 * "shm"), and which buffers are engine memory it hands out as mappings ("shm": true). Pure:
 * fuzzed with the descriptor decoder. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "shm_int.h"

static int shm_decode(json_t *root, const char *name, void **part_p)
{
    json_t *eps = json_object_get(root, "endpoints"), *ep;
    size_t i;

    (void)name;
    json_array_foreach(eps, i, ep)
    {
        const char *t = json_string_value(json_object_get(ep, "transport"));
        const char *a = json_string_value(json_object_get(ep, "addr"));
        if (!t || strcmp(t, "shm"))
            continue;
        if (!a || !*a || strlen(a) >= MC_NAME_MAX)
            return mc__set_error(-MC_EPROTO, "descriptor: \"shm\" endpoint's \"addr\" is "
                                             "missing, empty or too long");
        *part_p = strdup(a);
        return *part_p ? 0 : mc__set_error(-ENOMEM, "out of memory decoding a descriptor");
    }
    return 0;
}

static int shm_decode_buffer(json_t *jb, const void *part, mc_desc_t *d, unsigned slot,
                             mc_desc_buffer_t *b)
{
    static const uint8_t mappable = 1;

    (void)part;
    return json_is_true(json_object_get(jb, "shm")) ? mc__desc_part_add(d, b, slot, &mappable, 1)
                                                    : 0;
}

/* In a buffer key: the same mark, one byte 1. */
static int shm_decode_key(const uint8_t *in, size_t len, const void *part, mc_desc_t *d,
                          unsigned slot, mc_desc_buffer_t *b)
{
    (void)part;
    if (len != 1 || in[0] != 1)
        return mc__set_error(-MC_EPROTO, "buffer key: bad shm part");
    return mc__desc_part_add(d, b, slot, in, 1);
}

const mc_desc_codec_t mc__shm_codec = {
    .decode = shm_decode,
    .decode_buffer = shm_decode_buffer,
    .decode_key = shm_decode_key,
    .free_part = free,
};
