/* Object names, the keys they map to, and the buffers calls take. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "p2p_int.h"

static bool name_char_ok(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
           c == '_' || c == '-' || c == '/';
}

/* One '/'-separated component of a name: not empty, not "." or "..", not "replica". */
static int name_component_check(const char *name, const char *c, size_t len)
{
    if (len == 0)
        return mc__p2p_error(-EINVAL,
                             "object name \"%s\": empty component (\"//\", or '/' at "
                             "an end)",
                             name);
    if ((len == 1 && c[0] == '.') || (len == 2 && !memcmp(c, "..", 2)))
        return mc__p2p_error(-EINVAL,
                             "object name \"%s\": \".\" and \"..\" are not allowed as "
                             "components",
                             name);
    if (len == 7 && !memcmp(c, "replica", 7))
        return mc__p2p_error(-EINVAL,
                             "object name \"%s\": \"replica\" is reserved as a "
                             "component",
                             name);
    return 0;
}

int mc__p2p_name_check(const char *name)
{
    size_t len;

    if (!name)
        return mc__p2p_error(-EINVAL, "object name is NULL");
    len = strlen(name);
    if (len == 0 || len >= MC_P2P_NAME_MAX)
        return mc__p2p_error(-EINVAL, "object name \"%.40s%s\": 1 to %d characters (it has %zu)",
                             name, len > 40 ? "..." : "", MC_P2P_NAME_MAX - 1, len);
    for (size_t i = 0; i < len; i++)
        if (!name_char_ok(name[i]))
            return mc__p2p_error(-EINVAL,
                                 "object name \"%s\": character %zu (0x%02x) is not "
                                 "one of A-Z a-z 0-9 . _ - /",
                                 name, i, (unsigned char)name[i]);
    for (const char *c = name;;) {
        const char *end = strchr(c, '/');
        size_t clen = end ? (size_t)(end - c) : strlen(c);
        int rc = name_component_check(name, c, clen);
        if (rc || !end)
            return rc;
        c = end + 1;
    }
}

int mc__p2p_key(const mc_p2p_t *p2p, const char *name, const char *tail, char *buf)
{
    char rel[P2P_KEY_MAX];
    int n = snprintf(rel, sizeof(rel), "%s/%s", name, tail);

    if (n < 0 || (size_t)n >= sizeof(rel))
        return mc__p2p_error(-ENAMETOOLONG, "metadata key of %s/%s is too long", name, tail);
    n = mc_meta_key(buf, P2P_KEY_MAX, p2p->cluster, "p2p", rel);
    return n < 0 ? mc__p2p_error(n, "%s", mc_last_error()) : n;
}

int mc__p2p_replica_key(const mc_p2p_t *p2p, const char *name, char *buf)
{
    char tail[P2P_KEY_MAX];

    snprintf(tail, sizeof(tail), "replica/%.*s", P2P_KEY_MAX - 16, p2p->segment);
    return mc__p2p_key(p2p, name, tail, buf);
}

int mc__p2p_bufs_check(const char *what, const mc_p2p_buf_t *bufs, size_t n, uint64_t *total_p)
{
    uint64_t total = 0;

    if (!bufs || n == 0)
        return mc__p2p_error(-EINVAL, "%s: no buffers", what);
    for (size_t i = 0; i < n; i++) {
        if (!bufs[i].addr || bufs[i].len == 0)
            return mc__p2p_error(-EINVAL, "%s: buffer %zu is %s", what, i,
                                 bufs[i].addr ? "empty" : "NULL");
        if (total + bufs[i].len < total)
            return mc__p2p_error(-EINVAL, "%s: the buffers' total length overflows", what);
        total += bufs[i].len;
    }
    *total_p = total;
    return 0;
}

typedef struct span {
    uint64_t lo, hi;
} span_t;

static int span_cmp(const void *a, const void *b)
{
    uint64_t x = ((const span_t *)a)->lo, y = ((const span_t *)b)->lo;

    return (x > y) - (x < y);
}

int mc__p2p_bufs_disjoint(const char *what, const mc_p2p_buf_t *bufs, size_t n)
{
    span_t *v = malloc(n * sizeof(*v));
    int rc = 0;

    if (!v)
        return mc__p2p_error(-ENOMEM, "out of memory");
    for (size_t i = 0; i < n && !rc; i++) {
        v[i].lo = (uint64_t)(uintptr_t)bufs[i].addr;
        v[i].hi = v[i].lo + bufs[i].len;
        if (v[i].hi < v[i].lo)
            rc = mc__p2p_error(-EINVAL, "%s: buffer %zu wraps around the address space", what, i);
    }
    if (!rc)
        qsort(v, n, sizeof(*v), span_cmp);
    for (size_t i = 1; i < n && !rc; i++)
        if (v[i].lo < v[i - 1].hi)
            rc = mc__p2p_error(-EINVAL,
                               "%s: two buffers overlap at %#llx: a shard fetched into "
                               "one would overwrite another's",
                               what, (unsigned long long)v[i].lo);
    free(v);
    return rc;
}
