/*
 * The plugin's entry point and its table: the only symbol libmooncake_kv.so exports.
 */
#include <stdio.h>

#include "kv.h"

#ifndef MC_VERSION_STRING
#define MC_VERSION_STRING "0"
#endif

#if MC_HAVE_CUDA
#define KV_MEM_TYPES ((1u << MC_KV_DRAM) | (1u << MC_KV_VRAM) | (1u << MC_KV_FILE))
#else
#define KV_MEM_TYPES ((1u << MC_KV_DRAM) | (1u << MC_KV_FILE))
#endif

static mc_kv_plugin_t table = {
    .size = sizeof(mc_kv_plugin_t),
    .abi_major = MC_KV_ABI_MAJOR,
    .abi_minor = MC_KV_ABI_MINOR,
    .name = "mooncake",
    .version = MC_VERSION_STRING,
    .mem_types = KV_MEM_TYPES,
    .create = kv__create,
    .destroy = kv__destroy,
    .last_error = kv__last_error,
    .caps = kv__caps,
    .register_mem = kv__register_mem,
    .deregister_mem = kv__deregister_mem,
    .public_data = kv__public_data,
    .conn_info = kv__conn_info,
    .load_remote_conn_info = kv__load_remote_conn_info,
    .connect = kv__connect,
    .disconnect = kv__disconnect,
    .load_remote_md = kv__load_remote_md,
    .load_local_md = kv__load_local_md,
    .unload_md = kv__unload_md,
    .prep_xfer = kv__prep_xfer,
    .post_xfer = kv__post_xfer,
    .check_xfer = kv__check_xfer,
    .release_xfer = kv__release_xfer,
    .gen_notif = kv__gen_notif,
    .get_notif = kv__get_notif,
};

static pthread_once_t table_once = PTHREAD_ONCE_INIT;

static void table_init(void)
{
    table.options = kv__options(&table.n_options);
}

__attribute__((visibility("default"))) const mc_kv_plugin_t *
mc_kv_plugin_init(uint32_t host_abi, char *why, size_t why_len)
{
    unsigned major = MC_KV_ABI_MAJOR_OF(host_abi), minor = MC_KV_ABI_MINOR_OF(host_abi);

    if (major != MC_KV_ABI_MAJOR || minor > MC_KV_ABI_MINOR) {
        if (why && why_len)
            snprintf(why, why_len, "the host speaks ABI %u.%u, this plugin %u.%u%s", major, minor,
                     MC_KV_ABI_MAJOR, MC_KV_ABI_MINOR,
                     major == MC_KV_ABI_MAJOR ? " (the host is newer: update the plugin)"
                                              : " (another major version)");
        return NULL;
    }
    pthread_once(&table_once, table_init);
    return &table;
}
