/*
 * Logging and the thread-local "last error" reason (internal).
 *
 * mc_log(level, fmt, ...) prints "mooncake[pid] LEVEL: message" to stderr when level is at or
 * below MC_LOG_LEVEL. mc__set_error(code, fmt, ...) records the reason of a failure for
 * mc_last_error() and returns code, so that `return mc__set_error(-EINVAL, "...")` reads well.
 * Log once, where the error is found.
 */
#ifndef MC_UTIL_LOG_H
#define MC_UTIL_LOG_H

#include <stdarg.h>

enum { MC_LOG_ERROR = 0, MC_LOG_WARN = 1, MC_LOG_INFO = 2, MC_LOG_DEBUG = 3 };

extern int mc__log_level;

void mc__log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define mc_log(level, ...)                                                                         \
    do {                                                                                           \
        if ((level) <= mc__log_level)                                                              \
            mc__log((level), __VA_ARGS__);                                                         \
    } while (0)
#define mc_error(...) mc_log(MC_LOG_ERROR, __VA_ARGS__)
#define mc_warn(...)  mc_log(MC_LOG_WARN, __VA_ARGS__)
#define mc_info(...)  mc_log(MC_LOG_INFO, __VA_ARGS__)
#define mc_debug(...) mc_log(MC_LOG_DEBUG, __VA_ARGS__)

/* Record a reason for mc_last_error() and return code. */
int mc__set_error(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Parse MC_LOG_LEVEL ("error|warn|info|debug" or 0-3) once; returns <0 if invalid. */
int mc__log_init_from_env(void);

#endif
