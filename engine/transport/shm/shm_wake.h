/*
 * Wake-ups across a ring in shared memory (shm_msg.c's message rings).
 *
 * Each side has a wake word in the ring. A side about to sleep (the transport's idle op) sets
 * WAKE_ARMED in its word and looks at the other side's index once more; the other side, after
 * moving its index, takes WAKE_ARMED if it finds it set and kicks the sleeper (a datagram on the
 * ring's connection). The store of the index and the load of the word, and the store of the
 * word and the load of the index, sit on both sides of a sequentially consistent fence: a
 * record is either seen before sleeping or kicked. Sides that spin never arm.
 *
 * Nor need the side that moves an index fence, where membarrier(2) allows (MC_SHM_MEMBARRIER):
 * the fence waits for the store buffer to drain, a wait for the other core at every message.
 * A side whose process registered for global expedited membarriers sets WAKE_MB in its word:
 * "I run a membarrier before I first sleep". The other side, if its own process registered,
 * skips the fence while that word shows WAKE_MB without WAKE_SLEEPER. Before its first sleep, a
 * WAKE_MB side sets WAKE_SLEEPER and runs one membarrier, which puts a full barrier on every CPU
 * that runs a thread of a registered process at that moment (a thread not running has passed
 * one since). The skipping side's instructions fall on either side of that barrier: an index it
 * stored before is visible once the membarrier returns, and a check after it sees WAKE_SLEEPER
 * and fences. So a side that sleeps pays one membarrier per ring (some 25 us in a VM, IPIs;
 * one for all the rings it first sleeps on at once), and a side that only spins costs its peer
 * no fence per message. A side that then spins through a whole timer tick without sleeping (a
 * host that waited once: mc_batch_wait, an unregister) takes WAKE_SLEEPER back
 * (mc__wake_unmark), and its peers skip their fence again; its next sleep marks and runs a
 * membarrier as a first one does, so at most one a tick (50 ms while busy). Its WAKE_ARMED stays
 * as it was: set a tick ago or more, any peer sees it and kicks. A membarrier that fails after
 * the first one (-ENOMEM) keeps its side awake until one succeeds.
 *
 * The kernel may leave a CPU out of a global expedited membarrier although a thread of a
 * registered process runs there: it sends the IPI where the CPU's runqueue noted the
 * registration, and a runqueue notes it when it switches from another process's task to one of
 * ours. A CPU that ran one of our threads before the registration and since then only ours and
 * kernel threads never does (a kernel thread keeps our mm lazily, so the switch back to ours
 * looks like no switch). On 6.18 here: a thread spinning on such a CPU got no IPI in 10,000
 * membarriers, and all 10,000 once another process had run there. A side that skips its fence
 * on such a CPU may hold its index in its store buffer while the sleeper looks. So after its
 * membarrier a side stays awake for WAKE_SETTLE_NS, looking as it spins, and looks once more
 * after that before it sleeps: a store buffer drains in far less (an interrupt or a VM exit
 * drains it too). It costs a side that sleeps some 50 us of spinning at most once a tick.
 */
#ifndef MC_SHM_WAKE_H
#define MC_SHM_WAKE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

/* After a membarrier, how long a side stays awake before it sleeps (above). */
#define WAKE_SETTLE_NS 50000u

enum {
    WAKE_ARMED = 1,   /* may sleep now: kick */
    WAKE_SLEEPER = 2, /* has slept since its last unmark, or is about to: the other fences */
    WAKE_MB = 4,      /* runs a membarrier before its first sleep */
};

/* Register this process for global expedited membarriers if want (the first call in each
 * process that wants them tries): whether it is registered. */
bool mc__wake_mb_init(bool want);

/* After moving our index (a release store): whether to kick the other side, whose word is w
 * (WAKE_ARMED taken if so). mb: our process is registered. */
static inline bool mc__wake_check(_Atomic uint32_t *w, bool mb)
{
    /* The compiler keeps the index store before the load (the CPU may not, and need not: the
     * membarrier's IPI comes between two instructions, in program order). */
    atomic_signal_fence(memory_order_seq_cst);
    uint32_t v = atomic_load_explicit(w, memory_order_relaxed);

    if (!mb || (v & (WAKE_MB | WAKE_SLEEPER)) != WAKE_MB) {
        atomic_thread_fence(memory_order_seq_cst);
        v = atomic_load_explicit(w, memory_order_relaxed);
    }
    return (v & WAKE_ARMED) && (atomic_fetch_and(w, ~(uint32_t)WAKE_ARMED) & WAKE_ARMED);
}

/* About to sleep for the first time on a ring (or the first since it was unmarked), our word
 * w: WAKE_SLEEPER set. Whether a membarrier must follow (mc__wake_barrier, one for all the rings
 * marked) before the first arm: we said WAKE_MB, so the other side may be skipping its fence. */
static inline bool mc__wake_mark(_Atomic uint32_t *w)
{
    return atomic_fetch_or(w, WAKE_SLEEPER) & WAKE_MB;
}

/* Our word w, marked before, when this side has not armed it for a whole tick (another thread
 * of the host may still sleep armed: its WAKE_ARMED stays): WAKE_SLEEPER taken back (the other
 * side may skip its fence again). The next sleep on the ring marks it again. */
static inline void mc__wake_unmark(_Atomic uint32_t *w)
{
    atomic_fetch_and(w, ~(uint32_t)WAKE_SLEEPER);
}

/* The membarrier after marks; false if it failed (the marks stay: mark again, and try again
 * later, before arming those rings). */
bool mc__wake_barrier(void);

/* About to sleep, our word w (marked, and its barrier run, once): armed, with what the other
 * side wrote before visible after the call (look at its index then). */
static inline void mc__wake_arm(_Atomic uint32_t *w)
{
    atomic_fetch_or(w, WAKE_ARMED);
    atomic_thread_fence(memory_order_seq_cst);
}

#endif
