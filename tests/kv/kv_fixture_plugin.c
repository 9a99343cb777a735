/*
 * Plugins that exist to test the host side of ABI negotiation (kv_loader.c), one file built
 * three ways: KV_FIXTURE_NEWER (a minor newer than the host's, with a table grown at its end:
 * an older host loads it), KV_FIXTURE_MAJOR (ABI 2.0: the host refuses it), KV_FIXTURE_NOSYM
 * (no entry point at all).
 */
#include <stddef.h>

#include <mooncake/kv_plugin.h>

#ifndef KV_FIXTURE_NOSYM
typedef struct grown {
    mc_kv_plugin_t base;
    void (*added_in_a_later_minor)(void);
} grown_t;

static const grown_t table = {
    .base =
        {
            .size = sizeof(grown_t),
#ifdef KV_FIXTURE_MAJOR
            .abi_major = 2,
            .abi_minor = 0,
#else
            .abi_major = MC_KV_ABI_MAJOR,
            .abi_minor = MC_KV_ABI_MINOR + 3,
#endif
            .name = "fixture",
            .version = "0",
        },
};

/* Serves any host: the checks under test are the host's. */
__attribute__((visibility("default"))) const mc_kv_plugin_t *
mc_kv_plugin_init(uint32_t host_abi, char *why, size_t why_len)
{
    (void)host_abi, (void)why, (void)why_len;
    return &table.base;
}
#else
__attribute__((visibility("default"))) int kv_fixture_not_a_plugin(void)
{
    return 0;
}
#endif
