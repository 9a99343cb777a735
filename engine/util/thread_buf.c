/* Per-thread buffers on the heap (thread_buf.h). */
#include <stdalign.h>
#include <stdlib.h>

#include "thread_buf.h"

/* Ahead of each buffer: its thread's pointer to it, cleared as the buffer goes (a destructor of
 * another key that runs later on that thread, and reports an error, gets a new one). */
typedef struct head {
    alignas(max_align_t) void **mine;
} head_t;

/* The buffers whose key was made, for the unload below. */
static pthread_mutex_t made_lock = PTHREAD_MUTEX_INITIALIZER;
static mc_thread_buf_t *made;

static void buf_free(void *p)
{
    head_t *h = p;

    *h->mine = NULL;
    free(h);
}

/* The library is unloaded (dlclose of a module that carries the engine) or the process ends: no
 * key may keep buf_free, which is about to be unmapped, as the destructor a thread runs when it
 * exits later. The buffers of threads still alive are left to them, lost. */
__attribute__((destructor)) static void keys_delete(void)
{
    pthread_mutex_lock(&made_lock);
    for (mc_thread_buf_t *b = made; b; b = b->next_made) {
        pthread_key_delete(b->key);
        atomic_store(&b->ready, false); /* (a call after this, at exit, makes a new one) */
    }
    made = NULL;
    pthread_mutex_unlock(&made_lock);
}

void *mc__thread_buf(mc_thread_buf_t *b, void **mine)
{
    head_t *h;

    if (*mine)
        return *mine;
    if (!atomic_load_explicit(&b->ready, memory_order_acquire)) {
        pthread_mutex_lock(&b->lock);
        if (!atomic_load_explicit(&b->ready, memory_order_relaxed) &&
            !pthread_key_create(&b->key, buf_free)) {
            pthread_mutex_lock(&made_lock);
            b->next_made = made;
            made = b;
            pthread_mutex_unlock(&made_lock);
            atomic_store_explicit(&b->ready, true, memory_order_release);
        }
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
