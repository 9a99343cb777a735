/* Logging, error names and the thread-local failure reason. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include <mooncake/error.h>

#include "log.h"
#include "thread_buf.h"

int mc__log_level = MC_LOG_WARN;
__thread int mc__log_scope MC_TLS_HOT = MC_LOG_UNSET;

#define ERROR_MAX 512
static mc_thread_buf_t last_error_buf = MC_THREAD_BUF_INIT(ERROR_MAX);
static __thread void *last_error; /* its ERROR_MAX bytes, once this thread had an error */

static const char *const level_names[] = {"ERROR", "WARN", "INFO", "DEBUG"};

void mc__log(int level, const char *fmt, ...)
{
    char line[1024];
    va_list ap;
    int n = snprintf(line, sizeof(line), "mooncake[%d] %s: ", (int)getpid(), level_names[level]);

    va_start(ap, fmt);
    vsnprintf(line + n, sizeof(line) - (size_t)n, fmt, ap);
    va_end(ap);
    fprintf(stderr, "%s\n", line);
}

/* Formatted apart first: callers wrap the previous reason ("...: %s", mc_last_error()), and
 * printing a buffer into itself garbles it. */
int mc__set_error(int code, const char *fmt, ...)
{
    char msg[ERROR_MAX];
    char *to = mc__thread_buf(&last_error_buf, &last_error);
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    if (to)
        memcpy(to, msg, sizeof(msg));
    return code;
}

int mc__set_error_str(int code, const char *reason)
{
    char *to = mc__thread_buf(&last_error_buf, &last_error);

    if (to) {
        size_t n = strnlen(reason, ERROR_MAX - 1);
        memcpy(to, reason, n);
        to[n] = 0;
    }
    return code;
}

const char *mc_last_error(void)
{
    return last_error ? last_error : ""; /* (none yet, or no memory to keep one) */
}

const char *mc_strerror(int err)
{
    if (err < 0)
        err = -err;
    switch (err) {
#define MC_ERR_STR(name, val, str)                                                                 \
    case val:                                                                                      \
        return str;
        MC_ERRNO_MAP(MC_ERR_STR)
#undef MC_ERR_STR
    }
    return strerror(err);
}

const char *mc_err_name(int err)
{
    if (err < 0)
        err = -err;
    switch (err) {
#define MC_ERR_NAME(name, val, str)                                                                \
    case val:                                                                                      \
        return #name;
        MC_ERRNO_MAP(MC_ERR_NAME)
#undef MC_ERR_NAME
    }
    const char *name = strerrorname_np(err);
    return name ? name : "EUNKNOWN";
}

int mc__log_level_parse(const char *v)
{
    static const char *const names[] = {"off", "error", "warn", "info", "debug"};

    for (int i = 0; i < 5; i++) {
        if (!strcasecmp(v, names[i]))
            return i - 1;
    }
    if (!strcmp(v, "-1"))
        return MC_LOG_OFF;
    if (v[0] >= '0' && v[0] <= '3' && !v[1])
        return v[0] - '0';
    return MC_LOG_UNSET;
}

/* The process's level, for what no engine logs: MC_LOG_LEVEL as the library loads (an invalid
 * value is reported when a configuration is created). */
__attribute__((constructor)) static void log_level_from_env(void)
{
    const char *v = getenv("MC_LOG_LEVEL");
    int level = v ? mc__log_level_parse(v) : MC_LOG_UNSET;

    if (level != MC_LOG_UNSET)
        mc__log_level = level;
}
