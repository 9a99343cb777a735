/* Logging, error names and the thread-local failure reason. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include <mooncake/error.h>

#include "log.h"

int mc__log_level = MC_LOG_WARN;

static __thread char last_error[512];

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

int mc__set_error(int code, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(last_error, sizeof(last_error), fmt, ap);
    va_end(ap);
    return code;
}

const char *mc_last_error(void)
{
    return last_error;
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

int mc__log_init_from_env(void)
{
    static const char *const names[] = {"error", "warn", "info", "debug"};
    const char *v = getenv("MC_LOG_LEVEL");

    if (!v || !*v)
        return 0;
    for (int i = 0; i < 4; i++) {
        if (!strcasecmp(v, names[i]) || (v[0] == '0' + i && !v[1])) {
            mc__log_level = i;
            return 0;
        }
    }
    return mc__set_error(-MC_ECONFIG, "MC_LOG_LEVEL=%s: expected error, warn, info, debug or 0-3",
                         v);
}
