/* What depends on the exact UCX version: its internal headers (from Debian's source package of
 * the installed UCX, found by CMake) and the layouts ucx_compat.c fills. Built against one UCX
 * version; the module refuses to register in a process whose libuct is another one. */
#ifndef UCT_MC_UCX_COMPAT_H
#define UCT_MC_UCX_COMPAT_H

#include <uct/api/version.h>
#include <uct/base/uct_iface.h>
#include <uct/base/uct_md.h>
#include <ucs/memory/rcache.h>
#include <ucs/type/class.h>

#if UCT_API != UCT_VERSION(1, 13)
#error "ucx_transport is written against UCX 1.13's internal structures (ucx_compat.c)"
#endif

/* The memory domain operations, the interface's internal operations and the component, in
 * this UCX version's layout. */
extern uct_md_ops_t uct_mc_md_ops;
extern uct_iface_internal_ops_t uct_mc_iface_internal_ops;

/* 0 if the libuct this process runs is the one the module was built against; otherwise -1,
 * with why in reason. */
int uct_mc_compat_check(char *reason, size_t len);

#endif
