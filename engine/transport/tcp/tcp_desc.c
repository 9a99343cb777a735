/* The tcp part of a peer's descriptor: its "endpoints" entries with transport "tcp", one per
 * interface it listens on; the first is the one handshakes go to. A descriptor without any is
 * refused: tcp is the control transport. Pure: fuzzed with the descriptor decoder. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "tcp_int.h"

static int tcp_decode(json_t *root, const char *name, void **part_p)
{
    json_t *eps = json_object_get(root, "endpoints"), *ep;
    tcp_desc_t *d;
    size_t i;

    if (!json_is_array(eps))
        return mc__set_error(-MC_EPROTO, "descriptor: \"endpoints\" is not an array");
    d = calloc(1, sizeof(*d));
    if (!d)
        return mc__set_error(-ENOMEM, "out of memory decoding a descriptor");
    json_array_foreach(eps, i, ep)
    {
        const char *t = json_string_value(json_object_get(ep, "transport"));
        const char *a = json_string_value(json_object_get(ep, "addr"));
        if (!t || strcmp(t, "tcp") || d->n == MC_MAX_RAILS)
            continue;
        if (!a || !*a || strlen(a) >= sizeof(d->addrs[0])) {
            free(d);
            return mc__set_error(-MC_EPROTO, "descriptor: a tcp endpoint's \"addr\" is missing, "
                                             "empty or too long");
        }
        memcpy(d->addrs[d->n++], a, strlen(a) + 1);
    }
    if (!d->n) {
        free(d);
        return mc__set_error(-MC_EPROTO, "descriptor of %s has no tcp endpoint", name);
    }
    *part_p = d;
    return 0;
}

const mc_desc_codec_t mc__tcp_codec = {
    .decode = tcp_decode,
    .free_part = free,
};
