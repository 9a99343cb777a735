/*
 * Loading a KV backend plugin (kv_plugin.h) the way a host does: dlopen by path or by name,
 * mc_kv_plugin_init, ABI checks. Library libmooncake_kv_loader (static, no dependency beyond
 * libdl); errors name the file and the reason.
 */
#ifndef MOONCAKE_KV_LOADER_H
#define MOONCAKE_KV_LOADER_H

#include <stddef.h>
#include <stdint.h>

#include <mooncake/kv_plugin.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mc_kv_loaded {
    const mc_kv_plugin_t *plugin; /* the checked table */
    char path[4096];              /* the file that was loaded */
    void *dl;                     /* dlopen handle */
} mc_kv_loaded_t;

/* Load a plugin. what is a path (it contains a '/') or a name: "mooncake_kv" means
 * lib<name>.so, looked for in each directory of MC_PLUGIN_DIR (':'-separated), then in the
 * directory the plugins were installed to. host_abi is normally MC_KV_ABI_CURRENT. On failure
 * returns a negative errno-style code (-ENOENT: no such file, -ENOEXEC: not a plugin or not
 * loadable, -EPROTO: ABI refused) and writes "FILE: reason" into err (room err_len). Free with
 * mc_kv_unload(). */
int mc_kv_load(const char *what, uint32_t host_abi, mc_kv_loaded_t **loaded_p, char *err,
               size_t err_len);

/* Forget a loaded plugin. Its code stays mapped (RTLD_NODELETE, as NIXL loads its plugins), so
 * loading it again is cheap; destroy every instance of it first all the same. */
void mc_kv_unload(mc_kv_loaded_t *loaded);

/* The name of a status value ("IN_PROG", "ERR_REMOTE_DISCONNECT"). Never NULL. */
const char *mc_kv_status_name(int status);

#ifdef __cplusplus
}
#endif
#endif
