/* The engine lock's contended case (lock.h). */
#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "lock.h"

/* Looks before the first nap: most holds are a pass, well under a microsecond. */
#define SPINS 128

static inline void relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ volatile("yield");
#endif
}

void mc__lock_wait(mc_lock_t *l)
{
    static const struct timespec nap = {0, MC_LOCK_NAP_US * 1000};

    for (unsigned i = 0; i < SPINS; i++) {
        relax();
        if (atomic_load_explicit(&l->v, memory_order_relaxed) == 0 && mc_lock_try(l))
            return;
    }
    /* Marked 2 from here on, and taken as 2: the unlock that ends this hold wakes the next. */
    while (atomic_exchange_explicit(&l->v, 2, memory_order_acquire) != 0)
        syscall(SYS_futex, &l->v, FUTEX_WAIT_PRIVATE, 2, &nap, NULL, 0);
}

void mc__lock_wake(mc_lock_t *l)
{
    atomic_store_explicit(&l->v, 0, memory_order_release);
    syscall(SYS_futex, &l->v, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
}
