/*
 * Loading a KV backend plugin: find the file, dlopen it, call its entry point, check the ABI.
 * Every failure says which file and why, since a host that only says "unsupported backend"
 * (NIXL logs load failures at INFO) leaves its user guessing.
 */
#include <dlfcn.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <mooncake/kv_loader.h>

#ifndef MC_PLUGIN_INSTALL_DIR
#define MC_PLUGIN_INSTALL_DIR "/usr/local/lib"
#endif

static int say(char *err, size_t err_len, int rc, const char *fmt, ...)
{
    va_list ap;

    if (err && err_len) {
        va_start(ap, fmt);
        vsnprintf(err, err_len, fmt, ap);
        va_end(ap);
    }
    return rc;
}

/* lib<name>.so in each directory of MC_PLUGIN_DIR, then in the install directory. */
static int find_by_name(const char *name, char *path, size_t room, char *err, size_t err_len)
{
    const char *env = getenv("MC_PLUGIN_DIR");
    char dirs[4096];
    char *save = NULL;

    snprintf(dirs, sizeof(dirs), "%s%s%s", env ? env : "", env && *env ? ":" : "",
             MC_PLUGIN_INSTALL_DIR);
    for (char *d = strtok_r(dirs, ":", &save); d; d = strtok_r(NULL, ":", &save)) {
        if ((size_t)snprintf(path, room, "%s/lib%s.so", d, name) < room && !access(path, R_OK))
            return 0;
    }
    return say(err, err_len, -ENOENT, "lib%s.so: not found in MC_PLUGIN_DIR (%s) nor in %s", name,
               env ? env : "unset", MC_PLUGIN_INSTALL_DIR);
}

/* The checks a host makes on the table it got: the plugin checked the host already, but a
 * plugin of another major may check differently, or not at all. */
static int check_table(const mc_kv_plugin_t *t, uint32_t host_abi, const char *path, char *err,
                       size_t err_len)
{
    if (t->abi_major != MC_KV_ABI_MAJOR_OF(host_abi))
        return say(err, err_len, -EPROTO, "%s: plugin ABI %u.%u, this host speaks major %u", path,
                   t->abi_major, t->abi_minor, MC_KV_ABI_MAJOR_OF(host_abi));
    if (t->abi_minor < MC_KV_ABI_MINOR_OF(host_abi) || t->size < sizeof(mc_kv_plugin_t))
        return say(err, err_len, -EPROTO,
                   "%s: plugin ABI %u.%u (table of %zu bytes) is older than this host's %u.%u",
                   path, t->abi_major, t->abi_minor, t->size, MC_KV_ABI_MAJOR_OF(host_abi),
                   MC_KV_ABI_MINOR_OF(host_abi));
    return 0;
}

int mc_kv_load(const char *what, uint32_t host_abi, mc_kv_loaded_t **loaded_p, char *err,
               size_t err_len)
{
    mc_kv_loaded_t *l = calloc(1, sizeof(*l));
    mc_kv_plugin_init_fn init;
    char why[256] = "";
    int rc;

    if (!l)
        return say(err, err_len, -ENOMEM, "%s: out of memory", what);
    if (strchr(what, '/')) {
        if ((size_t)snprintf(l->path, sizeof(l->path), "%s", what) >= sizeof(l->path)) {
            rc = say(err, err_len, -ENAMETOOLONG, "%.64s...: path too long", what);
            goto err_free;
        }
        if (access(l->path, R_OK)) {
            rc = say(err, err_len, -ENOENT, "%s: %s", l->path, strerror(errno));
            goto err_free;
        }
    } else if ((rc = find_by_name(what, l->path, sizeof(l->path), err, err_len)) < 0) {
        goto err_free;
    }
    /* RTLD_LOCAL: the plugin's symbols stay its own; RTLD_NOW: a missing dependency is
     * reported here, not at the first call; RTLD_NODELETE: a plugin runs threads, and an
     * instance a host forgot to destroy must not find its code unmapped under it. */
    l->dl = dlopen(l->path, RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
    if (!l->dl) {
        rc = say(err, err_len, -ENOEXEC, "%s: cannot be loaded: %s", l->path, dlerror());
        goto err_free;
    }
    *(void **)&init = dlsym(l->dl, MC_KV_PLUGIN_INIT_SYMBOL);
    if (!init) {
        rc = say(err, err_len, -ENOEXEC, "%s: not a KV plugin: no symbol %s", l->path,
                 MC_KV_PLUGIN_INIT_SYMBOL);
        goto err_close;
    }
    l->plugin = init(host_abi, why, sizeof(why));
    if (!l->plugin) {
        rc = say(err, err_len, -EPROTO, "%s: refused this host (ABI %u.%u): %s", l->path,
                 MC_KV_ABI_MAJOR_OF(host_abi), MC_KV_ABI_MINOR_OF(host_abi),
                 *why ? why : "no reason given");
        goto err_close;
    }
    if ((rc = check_table(l->plugin, host_abi, l->path, err, err_len)) < 0)
        goto err_close;
    *loaded_p = l;
    return 0;

err_close:
    dlclose(l->dl);
err_free:
    free(l);
    return rc;
}

void mc_kv_unload(mc_kv_loaded_t *loaded)
{
    if (!loaded)
        return;
    dlclose(loaded->dl);
    free(loaded);
}

const char *mc_kv_status_name(int status)
{
    static const char *const names[] = {
        "IN_PROG",           "SUCCESS",       "ERR_NOT_POSTED",    "ERR_INVALID_PARAM",
        "ERR_BACKEND",       "ERR_NOT_FOUND", "ERR_MISMATCH",      "ERR_NOT_ALLOWED",
        "ERR_REPOST_ACTIVE", "ERR_UNKNOWN",   "ERR_NOT_SUPPORTED", "ERR_REMOTE_DISCONNECT",
        "ERR_CANCELED",
    };
    int i = 1 - status; /* IN_PROG=1 -> 0, SUCCESS=0 -> 1, ERR_CANCELED=-11 -> 12 */

    return i >= 0 && i < (int)(sizeof(names) / sizeof(names[0])) ? names[i] : "UNKNOWN_STATUS";
}
