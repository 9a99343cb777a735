/*
 * The engine lock (e->lock, the progress context).
 *
 * A host spinning on progress takes and drops it at every call and every send, and a pthread
 * mutex's unlock is a locked instruction, which waits for the stores of the pass before it to
 * drain: the two unlocks of a same-host message's trip were about a tenth of it. Here the unlock
 * is a plain store, unless a thread marked the lock as one it may sleep on; a thread that waits
 * spins a little, then marks it and sleeps on a futex for at most MC_LOCK_NAP_US at a time. The
 * unlocker looks at the mark without a fence, so it can miss a sleeper that marked it just then:
 * that sleeper takes the lock after its nap instead, late but never stuck.
 */
#ifndef MC_UTIL_LOCK_H
#define MC_UTIL_LOCK_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#define MC_LOCK_NAP_US 200

typedef struct mc_lock {
    _Atomic uint32_t v; /* 0 free; 1 held; 2 held, and a thread may sleep on it */
} mc_lock_t;

static inline bool mc_lock_try(mc_lock_t *l)
{
    uint32_t free_ = 0;

    return atomic_compare_exchange_strong_explicit(&l->v, &free_, 1, memory_order_acquire,
                                                   memory_order_relaxed);
}

void mc__lock_wait(mc_lock_t *l); /* (lock.c: the contended case) */
void mc__lock_wake(mc_lock_t *l);

static inline void mc_lock(mc_lock_t *l)
{
    if (!mc_lock_try(l))
        mc__lock_wait(l);
}

static inline void mc_unlock(mc_lock_t *l)
{
    if (atomic_load_explicit(&l->v, memory_order_relaxed) == 2)
        mc__lock_wake(l);
    else
        atomic_store_explicit(&l->v, 0, memory_order_release);
}

#endif
