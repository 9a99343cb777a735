/*
 * Per-thread buffers on the heap, reached through a thread-local pointer.
 *
 * The library keeps its thread-local storage to a few pointers, so that the whole of it fits
 * the static TLS that glibc sets aside for libraries loaded later (the KV plugin and the UCX
 * module are dlopen'd, each with the engine inside): then the variables a spinning host reads
 * at every call (engine.c's pass_engine, the log scope) can be initial-exec, one load each
 * instead of a __tls_get_addr call. A buffer is allocated at its thread's first use and freed
 * when the thread exits. Each one takes a pthread key (the engine 3, the KV plugin 4, of
 * PTHREAD_KEYS_MAX 1024), deleted when the library is unloaded: the threads still alive then
 * lose their buffers instead of running a destructor that was unmapped.
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
    pthread_key_t key;               /* frees a thread's buffer as it exits */
    struct mc_thread_buf *next_made; /* the buffers whose key was made (thread_buf.c) */
} mc_thread_buf_t;

#define MC_THREAD_BUF_INIT(bytes)                                                                  \
    {                                                                                              \
        .size = (bytes), .lock = PTHREAD_MUTEX_INITIALIZER                                         \
    }

/* This thread's buffer of b->size bytes, zeroed at first, through *mine (the caller's
 * thread-local pointer); NULL when memory ran out. */
void *mc__thread_buf(mc_thread_buf_t *b, void **mine);

#endif
