/*
 * Buffers kept for reuse by size class: powers of two from MC_BUF_MIN up to the largest the
 * user needs (its own last class), each class holding at most MC_BUF_KEEP bytes of spare
 * buffers (and at least 8). A stream of messages otherwise grows the heap and gives it back at
 * every pass: glibc trims the top of the heap once 128 KiB there are free, and the next pass
 * takes a page fault per page it reuses (64 KiB messages over tcp: 6 k/s, 55 k/s without the
 * trims).
 *
 * A buffer is asked for by size and given back with the same size; one asked for without the
 * cache (another thread than its owner's) still has its class's capacity, so that the owner
 * can keep it when it is given back. Not thread-safe: the owner says when it may be used.
 */
#ifndef MC_UTIL_BUFCACHE_H
#define MC_UTIL_BUFCACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdlib.h>

#include "list.h"

#define MC_BUF_MIN     256u
#define MC_BUF_CLASSES 10u        /* 256 B .. 64 KiB, and the user's largest */
#define MC_BUF_KEEP    (2u << 20) /* spare bytes per class */

typedef struct mc_bufcache {
    mc_stash_t cls[MC_BUF_CLASSES];
    size_t max; /* the last class: nothing asked for is larger */
} mc_bufcache_t;

static inline void mc_buf_init(mc_bufcache_t *c, size_t max)
{
    for (unsigned k = 0; k < MC_BUF_CLASSES; k++)
        mc_stash_init(&c->cls[k]);
    c->max = max;
}

static inline unsigned mc_buf_class(size_t size)
{
    unsigned k = 0;

    while (k < MC_BUF_CLASSES - 1 && ((size_t)MC_BUF_MIN << k) < size)
        k++;
    return k;
}

static inline size_t mc_buf_cap(const mc_bufcache_t *c, unsigned k)
{
    return k == MC_BUF_CLASSES - 1 ? c->max : (size_t)MC_BUF_MIN << k;
}

/* A buffer of at least size bytes, or NULL; cached: the cache may be used. (One larger than
 * c->max is neither cached nor taken from the cache.) */
static inline void *mc_buf_alloc(mc_bufcache_t *c, size_t size, bool cached)
{
    unsigned k = mc_buf_class(size);
    mc_list_t *kept = cached && size <= c->max ? mc_stash_take(&c->cls[k]) : NULL;

    return kept ? (void *)kept : malloc(size <= c->max ? mc_buf_cap(c, k) : size);
}

/* Give back p, asked for with size; kept unless its class has enough spare. */
static inline void mc_buf_free(mc_bufcache_t *c, void *p, size_t size)
{
    unsigned k = mc_buf_class(size);
    size_t cap = mc_buf_cap(c, k);
    unsigned most = MC_BUF_KEEP / cap > 8 ? (unsigned)(MC_BUF_KEEP / cap) : 8;

    if (size > c->max || !mc_stash_keep(&c->cls[k], (mc_list_t *)p, most))
        free(p);
}

static inline void mc_buf_fini(mc_bufcache_t *c)
{
    mc_list_t *n;

    for (unsigned k = 0; k < MC_BUF_CLASSES; k++)
        while ((n = mc_stash_take(&c->cls[k])))
            free(n);
}

#endif
