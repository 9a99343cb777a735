/*
 * libibverbs, opened at run time (internal).
 *
 * The engine, the UCX module and the KV plugin must load on hosts without rdma-core, so nothing
 * links libibverbs: verbs.c defines the library functions the engine calls (hidden, never
 * exported) and forwards each to libibverbs.so.1, opened on first use. The data path (posting,
 * polling) is inline in verbs.h and goes through the device context, so it costs nothing more.
 * Without the library every wrapper fails (NULL or an error, errno ENOSYS) and rdma is
 * unavailable; mc__verbs_available says why.
 */
#ifndef MC_SYS_VERBS_H
#define MC_SYS_VERBS_H

#include <stdbool.h>

/* Whether libibverbs is loaded (tried once per process). *why_p (may be NULL) gets the reason
 * when it is not. Thread-safe. */
bool mc__verbs_available(const char **why_p);

#endif
