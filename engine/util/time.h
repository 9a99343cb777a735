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
