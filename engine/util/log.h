/*
 * Logging and the thread-local "last error" reason (internal).
 *
 * mc_log(level, fmt, ...) prints "mooncake[pid] LEVEL: message" to stderr when level is at or
 * below the level in force: that of the engine the thread works for (its threads, its progress
 * passes and its API calls enter MC_LOG_SCOPE with the engine's MC_LOG_LEVEL), else the
 * process's (MC_LOG_LEVEL when the library loaded). mc__set_error(code, fmt, ...) records the
 * reason of a failure for mc_last_error() and returns code, so that
 * `return mc__set_error(-EINVAL, "...")` reads well. Log once, where the error is found.
 */
#ifndef MC_UTIL_LOG_H
#define MC_UTIL_LOG_H

#include <stdarg.h>

enum { MC_LOG_OFF = -1, MC_LOG_ERROR = 0, MC_LOG_WARN = 1, MC_LOG_INFO = 2, MC_LOG_DEBUG = 3 };
#define MC_LOG_UNSET (-100)

/* The thread-locals read at every API call (this header's log scope, engine.c's pass engine):
 * initial-exec, one load each, unless built with -DMC_TLS_INITIAL_EXEC=OFF. A library that
 * has them needs its whole TLS block (util/thread_buf.h: 40-48 bytes) in glibc's static TLS
 * when it is dlopen'd; a process that used that up first gets "cannot allocate memory in
 * static TLS block" from dlopen. */
#ifdef MC_TLS_DYNAMIC
#define MC_TLS_HOT
#else
#define MC_TLS_HOT __attribute__((tls_model("initial-exec")))
#endif

extern int mc__log_level; /* the process's */
/* the engine's this thread works for, or MC_LOG_UNSET; initial-exec, as engine.c's pass_engine:
 * it is set and restored at every call of the API */
extern __thread int mc__log_scope MC_TLS_HOT;

static inline int mc__log_threshold(void)
{
    return mc__log_scope != MC_LOG_UNSET ? mc__log_scope : mc__log_level;
}

void mc__log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define mc_log(level, ...)                                                                         \
    do {                                                                                           \
        if ((level) <= mc__log_threshold())                                                        \
            mc__log((level), __VA_ARGS__);                                                         \
    } while (0)
#define mc_error(...) mc_log(MC_LOG_ERROR, __VA_ARGS__)
#define mc_warn(...)  mc_log(MC_LOG_WARN, __VA_ARGS__)
#define mc_info(...)  mc_log(MC_LOG_INFO, __VA_ARGS__)
#define mc_debug(...) mc_log(MC_LOG_DEBUG, __VA_ARGS__)

/* Record a reason for mc_last_error() and return code. */
int mc__set_error(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* The same for a fixed reason, without formatting it: for outcomes a caller meets at a high
 * rate (a full window, which a sender retries until it has room). */
int mc__set_error_str(int code, const char *reason);

/* Log at `level` (an engine's) until the end of the enclosing block. */
#define MC_LOG_SCOPE(level)                                                                        \
    int mc__log_saved __attribute__((cleanup(mc__log_leave), unused)) = mc__log_enter(level)

/* Returns the level it replaces. */
static inline int mc__log_enter(int level)
{
    int saved = mc__log_scope;

    mc__log_scope = level;
    return saved;
}

static inline void mc__log_leave(int *saved)
{
    mc__log_scope = *saved;
}

/* "off, error, warn, info, debug" or -1..3 into a level; -1 if it is none of them. */
int mc__log_level_parse(const char *v);

#endif
