/*
 * The CUDA runtime, opened at run time (internal).
 *
 * As for libibverbs (verbs.h): nothing links libcudart; cudart.c defines the runtime functions
 * the engine calls (hidden) and forwards them to the runtime of the toolkit the engine was built
 * with (libcudart.so.<major>), opened on first use. Without it every call fails with
 * cudaErrorInsufficientDriver: no CUDA device, and VRAM locations are refused as they are on a
 * host without a GPU.
 */
#ifndef MC_SYS_CUDART_H
#define MC_SYS_CUDART_H

#include <stdbool.h>

/* Whether the CUDA runtime is loaded (tried once per process); *why_p gets the reason when it
 * is not ("built without CUDA" in a build without the toolkit). Thread-safe. */
bool mc__cudart_available(const char **why_p);

#endif
