/*
 * Per-thread buffers on the heap, reached through a thread-local pointer.
 *
 * The library keeps its thread-local storage to a few pointers, so that the whole of it fits
 * the static TLS that glibc sets aside for libraries loaded later (the KV plugin and the UCX
 * module are dlopen'd, each with the engine inside): then the variables a spinning host reads
 * at every call (engine.c's pass_engine, the log scope) can be initial-exec, one load each
 * instead of a __tls_get_addr call. A buffer is allocated at its thread's first use and freed
 * when the thread exits. Each one takes a pthread key, never deleted: a module loaded and
 * unloaded again leaves its keys behind (PTHREAD_KEYS_MAX is 1024; the engine takes 3, the KV
 * plugin 4).
 */
#ifndef MC_UTIL_THREAD_BUF_H
#define MC_UTIL_THREAD_BUF_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>

typedef struct mc_thread_buf {
    size_t size;
    pthread_mutex_t lock; /* while the key is made */
    atomic_bool ready;
    pthread_key_t key; /* frees a thread's buffer as it exits */
} mc_thread_buf_t;

#define MC_THREAD_BUF_INIT(bytes)                                                                  \
    {                                                                                              \
        .size = (bytes), .lock = PTHREAD_MUTEX_INITIALIZER                                         \
    }

/* This thread's buffer of b->size bytes, zeroed at first, through *mine (the caller's
 * thread-local pointer); NULL when memory ran out. */
void *mc__thread_buf(mc_thread_buf_t *b, void **mine);

#endif
