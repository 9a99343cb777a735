/* Per-thread buffers on the heap (thread_buf.h). */
#include <stdalign.h>
#include <stdlib.h>

#include "thread_buf.h"

/* Ahead of each buffer: its thread's pointer to it, cleared as the buffer goes (a destructor of
 * another key that runs later on that thread, and reports an error, gets a new one). */
typedef struct head {
    alignas(max_align_t) void **mine;
} head_t;

static void buf_free(void *p)
{
    head_t *h = p;

    *h->mine = NULL;
    free(h);
}

void *mc__thread_buf(mc_thread_buf_t *b, void **mine)
{
    head_t *h;

    if (*mine)
        return *mine;
    if (!atomic_load_explicit(&b->ready, memory_order_acquire)) {
        pthread_mutex_lock(&b->lock);
        if (!atomic_load_explicit(&b->ready, memory_order_relaxed) &&
            !pthread_key_create(&b->key, buf_free))
            atomic_store_explicit(&b->ready, true, memory_order_release);
        pthread_mutex_unlock(&b->lock);
        if (!atomic_load_explicit(&b->ready, memory_order_acquire))
            return NULL;
    }
    h = calloc(1, sizeof(*h) + b->size);
    if (!h)
        return NULL;
    h->mine = mine;
    if (pthread_setspecific(b->key, h)) {
        free(h);
        return NULL;
    }
    return *mine = h + 1;
}
