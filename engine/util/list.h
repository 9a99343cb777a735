/* Intrusive doubly-linked list (internal). A list head is a sentinel link. */
#ifndef MC_UTIL_LIST_H
#define MC_UTIL_LIST_H

#include <stdbool.h>
#include <stddef.h>

typedef struct mc_list {
    struct mc_list *prev, *next;
} mc_list_t;

#define mc_container_of(ptr, type, member) ((type *)((char *)(ptr)-offsetof(type, member)))

static inline void mc_list_init(mc_list_t *h)
{
    h->prev = h->next = h;
}

static inline int mc_list_empty(const mc_list_t *h)
{
    return h->next == h;
}

static inline void mc_list_insert_between(mc_list_t *n, mc_list_t *prev, mc_list_t *next)
{
    n->prev = prev;
    n->next = next;
    prev->next = n;
    next->prev = n;
}

static inline void mc_list_push_back(mc_list_t *h, mc_list_t *n)
{
    mc_list_insert_between(n, h->prev, h);
}

static inline void mc_list_push_front(mc_list_t *h, mc_list_t *n)
{
    mc_list_insert_between(n, h, h->next);
}

static inline void mc_list_del(mc_list_t *n)
{
    n->prev->next = n->next;
    n->next->prev = n->prev;
    n->prev = n->next = n;
}

/* Move every element of src to the end of dst; src becomes empty. */
static inline void mc_list_splice_back(mc_list_t *dst, mc_list_t *src)
{
    if (mc_list_empty(src))
        return;
    src->next->prev = dst->prev;
    dst->prev->next = src->next;
    src->prev->next = dst;
    dst->prev = src->prev;
    mc_list_init(src);
}

static inline mc_list_t *mc_list_pop_front(mc_list_t *h)
{
    mc_list_t *n = h->next;

    if (n == h)
        return NULL;
    mc_list_del(n);
    return n;
}

/* Spare records kept for reuse instead of freed, at most max of them (the caller's bound). */
typedef struct mc_stash {
    mc_list_t list;
    unsigned n;
} mc_stash_t;

static inline void mc_stash_init(mc_stash_t *s)
{
    mc_list_init(&s->list);
    s->n = 0;
}

/* A kept record's link, or NULL when none is. */
static inline mc_list_t *mc_stash_take(mc_stash_t *s)
{
    mc_list_t *n = mc_list_pop_front(&s->list);

    s->n -= n != NULL;
    return n;
}

/* Keep n unless max are kept already (false: the caller frees it). */
static inline bool mc_stash_keep(mc_stash_t *s, mc_list_t *n, unsigned max)
{
    if (s->n >= max)
        return false;
    mc_list_push_back(&s->list, n);
    s->n++;
    return true;
}

#define mc_list_for_each_safe(pos, tmp, head)                                                      \
    for ((pos) = (head)->next, (tmp) = (pos)->next; (pos) != (head);                               \
         (pos) = (tmp), (tmp) = (pos)->next)

#endif
