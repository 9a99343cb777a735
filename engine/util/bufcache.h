/*
 * Buffers kept for reuse by size class: powers of two from MC_BUF_MIN up to the largest the
 * user needs (its own last class), each class holding at most MC_BUF_KEEP bytes of spare
 * buffers (and at least 8). A stream of messages otherwise grows the heap and gives it back at
 * every pass: glibc trims the top of the heap once 128 KiB there are free, and the next pass
 * takes a page fault per page it reuses (64 KiB messages over tcp: 6 k/s, 55 k/s without the
 * trims).
 *
 * A buffer is asked for by size and given back with the same size. A shared cache takes its
 * own lock (buffers asked for by one thread and given back by another: a host's messages, let
 * go of by the progress thread); an unshared one relies on its owner's.
 */
#ifndef MC_UTIL_BUFCACHE_H
#define MC_UTIL_BUFCACHE_H

#include <pthread.h>
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
    bool shared;
    pthread_mutex_t lock; /* shared: the classes */
} mc_bufcache_t;

static inline void mc_buf_init(mc_bufcache_t *c, size_t max, bool shared)
{
    for (unsigned k = 0; k < MC_BUF_CLASSES; k++)
        mc_stash_init(&c->cls[k]);
    c->max = max;
    c->shared = shared;
    pthread_mutex_init(&c->lock, NULL);
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

/* A buffer of at least size bytes, or NULL. (One larger than c->max is not cached.) */
static inline void *mc_buf_alloc(mc_bufcache_t *c, size_t size)
{
    unsigned k = mc_buf_class(size);
    mc_list_t *kept = NULL;

    if (size > c->max)
        return malloc(size);
    if (c->shared)
        pthread_mutex_lock(&c->lock);
    kept = mc_stash_take(&c->cls[k]);
    if (c->shared)
        pthread_mutex_unlock(&c->lock);
    return kept ? (void *)kept : malloc(mc_buf_cap(c, k));
}

/* Give back p, asked for with size; kept unless its class has enough spare. */
static inline void mc_buf_free(mc_bufcache_t *c, void *p, size_t size)
{
    unsigned k = mc_buf_class(size);
    size_t cap = mc_buf_cap(c, k);
    unsigned most = MC_BUF_KEEP / cap > 8 ? (unsigned)(MC_BUF_KEEP / cap) : 8;
    bool kept = false;

    if (size <= c->max) {
        if (c->shared)
            pthread_mutex_lock(&c->lock);
        kept = mc_stash_keep(&c->cls[k], (mc_list_t *)p, most);
        if (c->shared)
            pthread_mutex_unlock(&c->lock);
    }
    if (!kept)
        free(p);
}

static inline void mc_buf_fini(mc_bufcache_t *c)
{
    mc_list_t *n;

    for (unsigned k = 0; k < MC_BUF_CLASSES; k++)
        while ((n = mc_stash_take(&c->cls[k])))
            free(n);
    pthread_mutex_destroy(&c->lock);
}

#endif
