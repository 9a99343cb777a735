/* Everything that follows UCX's internal layouts of one version (1.13 here): the memory domain
 * operations, the interface's internal operations, the component, and the registration at load
 * time, refused when the running libuct is not the one this was built against. */
#include <dlfcn.h>
#include <stdio.h>

#include "uct_mc.h"

uct_md_ops_t uct_mc_md_ops = {
    .close = uct_mc_md_close,
    .query = uct_mc_md_query,
    .mem_alloc = (uct_md_mem_alloc_func_t)ucs_empty_function_return_unsupported,
    .mem_free = (uct_md_mem_free_func_t)ucs_empty_function_return_unsupported,
    .mem_advise = (uct_md_mem_advise_func_t)ucs_empty_function_return_unsupported,
    .mem_reg = uct_mc_mem_reg,
    .mem_dereg = uct_mc_mem_dereg,
    .mem_query = (uct_md_mem_query_func_t)ucs_empty_function_return_unsupported,
    .mkey_pack = uct_mc_mkey_pack,
    .is_sockaddr_accessible = (uct_md_is_sockaddr_accessible_func_t)ucs_empty_function_return_zero,
    .detect_memory_type = (uct_md_detect_memory_type_func_t)ucs_empty_function_return_unsupported,
};

uct_iface_internal_ops_t uct_mc_iface_internal_ops = {
    .iface_estimate_perf = uct_mc_iface_estimate_perf,
    .iface_vfs_refresh = (uct_iface_vfs_refresh_func_t)ucs_empty_function,
    .ep_query = (uct_ep_query_func_t)ucs_empty_function_return_unsupported,
    .ep_invalidate = (uct_ep_invalidate_func_t)ucs_empty_function_return_unsupported,
};

static uct_component_t component = {
    .name = UCT_MC_NAME,
    .query_md_resources = uct_md_query_single_md_resource,
    .md_open = uct_mc_md_open,
    .cm_open = (uct_component_cm_open_func_t)ucs_empty_function_return_unsupported,
    .rkey_unpack = uct_mc_rkey_unpack,
    .rkey_ptr = (uct_component_rkey_ptr_func_t)ucs_empty_function_return_unsupported,
    .rkey_release = uct_mc_rkey_release,
    .md_config =
        {
            .name = "Mooncake transfer engine memory domain",
            .prefix = "MOONCAKE_",
            .table = uct_mc_md_config_table,
            .size = sizeof(uct_mc_md_config_t),
        },
    .cm_config = UCS_CONFIG_EMPTY_GLOBAL_LIST_ENTRY,
    .tl_list = UCT_COMPONENT_TL_LIST_INITIALIZER(&component),
    .flags = 0,
    .md_vfs_init = (uct_component_md_vfs_init_func_t)ucs_empty_function,
};

int uct_mc_compat_check(char *reason, size_t len)
{
    void (*ucp_version)(unsigned *, unsigned *, unsigned *) =
        (void (*)(unsigned *, unsigned *, unsigned *))dlsym(RTLD_DEFAULT, "ucp_get_version");
    unsigned major, minor, release;

    if (uct_base_iface_t_class.size != sizeof(uct_base_iface_t) ||
        uct_base_ep_t_class.size != sizeof(uct_base_ep_t)) {
        snprintf(reason, len, "libuct's interface structure has %zu bytes, UCX %s's %zu",
                 (size_t)uct_base_iface_t_class.size, UCT_VERNO_STRING, sizeof(uct_base_iface_t));
        return -1;
    }
    /* the memory domain operations changed in 1.14, which added this */
    if (dlsym(RTLD_DEFAULT, "uct_md_mem_reg_v2")) {
        snprintf(reason, len, "libuct is newer than UCX %s (it has uct_md_mem_reg_v2)",
                 UCT_VERNO_STRING);
        return -1;
    }
    if (ucp_version) {
        ucp_version(&major, &minor, &release);
        if (major != UCT_VERNO_MAJOR || minor != UCT_VERNO_MINOR) {
            snprintf(reason, len, "UCX %u.%u.%u runs here, the module is built for %s", major,
                     minor, release, UCT_VERNO_STRING);
            return -1;
        }
    }
    return 0;
}

static bool registered;

UCS_F_CTOR static void uct_mc_init(void)
{
    char reason[160];

    if (uct_mc_compat_check(reason, sizeof(reason))) {
        fprintf(stderr, "libuct_mooncake: not registering transport %s: %s\n", UCT_MC_NAME, reason);
        return;
    }
    uct_component_register(&component);
    uct_tl_register(&component, &uct_mc_tl);
    registered = true;
}

UCS_F_DTOR static void uct_mc_cleanup(void)
{
    if (!registered)
        return;
    uct_tl_unregister(&uct_mc_tl);
    uct_component_unregister(&component);
}
