/* Clocks (internal). */
#ifndef MC_UTIL_TIME_H
#define MC_UTIL_TIME_H

#include <stdint.h>
#include <time.h>

#define MC_MS (1000000ull) /* nanoseconds per millisecond */

/* CLOCK_MONOTONIC in nanoseconds. */
static inline uint64_t mc__now_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* A counter that only says how far apart two readings of one thread are, cheaper than the clock
 * (x86: the TSC, about a third of a vDSO clock_gettime over kvm-clock; arm64: the virtual
 * counter): no unit, 0 where there is none. For bounds that may be off by a few times. */
static inline uint64_t mc__cycles(void)
{
#if defined(__x86_64__) || defined(__i386__)
    return __builtin_ia32_rdtsc();
#elif defined(__aarch64__)
    uint64_t v;
    __asm__ volatile("mrs %0, cntvct_el0" : "=r"(v));
    return v;
#else
    return 0;
#endif
}

/* About how many mc__cycles() a microsecond is (x86: a guess, the TSC runs at 1-4 GHz), 0 where
 * there is no counter. */
static inline uint64_t mc__cycles_per_us(void)
{
#if defined(__x86_64__) || defined(__i386__)
    return 2000;
#elif defined(__aarch64__)
    uint64_t hz;
    __asm__ volatile("mrs %0, cntfrq_el0" : "=r"(hz));
    return hz / 1000000 ? hz / 1000000 : 1;
#else
    return 0;
#endif
}

/* A CLOCK_REALTIME deadline ms from now, for pthread_cond_timedwait. */
static inline void mc__abstime_in(struct timespec *ts, unsigned ms)
{
    clock_gettime(CLOCK_REALTIME, ts);
    ts->tv_sec += ms / 1000;
    ts->tv_nsec += (long)(ms % 1000) * 1000000;
    if (ts->tv_nsec >= 1000000000) {
        ts->tv_sec++;
        ts->tv_nsec -= 1000000000;
    }
}

#endif
