/* Per-thread buffers on the heap (thread_buf.h). */
#include <stdlib.h>

#include "thread_buf.h"

void *mc__thread_buf(mc_thread_buf_t *b, void **mine)
{
    void *p;

    if (*mine)
        return *mine;
    if (!atomic_load_explicit(&b->ready, memory_order_acquire)) {
        pthread_mutex_lock(&b->lock);
        if (!atomic_load_explicit(&b->ready, memory_order_relaxed) &&
            !pthread_key_create(&b->key, free))
            atomic_store_explicit(&b->ready, true, memory_order_release);
        pthread_mutex_unlock(&b->lock);
        if (!atomic_load_explicit(&b->ready, memory_order_acquire))
            return NULL;
    }
    p = calloc(1, b->size);
    if (p && pthread_setspecific(b->key, p)) {
        free(p);
        p = NULL;
    }
    return *mine = p;
}
