/* The CUDA runtime through dlopen: the functions of it the engine calls, forwarded (see
 * cudart.h). */
#include <stdbool.h>

#include "cudart.h"

#if MC_HAVE_CUDA
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>

#include <cuda_runtime_api.h>

#define MC_HIDDEN __attribute__((visibility("hidden")))
#ifndef MC_CUDART_SONAME
#define MC_CUDART_SONAME "libcudart.so"
#endif

/* X(name, (parameters), (arguments)): each returns cudaError_t. */
#define CUDART_FUNCS(X)                                                                            \
    X(cudaGetDeviceCount, (int *n), (n))                                                           \
    X(cudaPointerGetAttributes, (struct cudaPointerAttributes * a, const void *p), (a, p))         \
    X(cudaDeviceGetPCIBusId, (char *id, int len, int dev), (id, len, dev))                         \
    X(cudaMalloc, (void **p, size_t len), (p, len))                                                \
    X(cudaFree, (void *p), (p))                                                                    \
    X(cudaGetDevice, (int *dev), (dev))                                                            \
    X(cudaSetDevice, (int dev), (dev))                                                             \
    X(cudaStreamCreateWithFlags, (cudaStream_t * s, unsigned int flags), (s, flags))               \
    X(cudaStreamDestroy, (cudaStream_t s), (s))                                                    \
    X(cudaStreamSynchronize, (cudaStream_t s), (s))                                                \
    X(cudaEventCreateWithFlags, (cudaEvent_t * ev, unsigned int flags), (ev, flags))               \
    X(cudaEventDestroy, (cudaEvent_t ev), (ev))                                                    \
    X(cudaEventRecord, (cudaEvent_t ev, cudaStream_t s), (ev, s))                                  \
    X(cudaEventQuery, (cudaEvent_t ev), (ev))                                                      \
    X(cudaEventSynchronize, (cudaEvent_t ev), (ev))                                                \
    X(cudaMemcpyAsync,                                                                             \
      (void *dst, const void *src, size_t len, enum cudaMemcpyKind kind, cudaStream_t s),          \
      (dst, src, len, kind, s))                                                                    \
    X(cudaHostRegister, (void *p, size_t len, unsigned int flags), (p, len, flags))                \
    X(cudaHostUnregister, (void *p), (p))                                                          \
    X(cudaIpcGetMemHandle, (cudaIpcMemHandle_t * h, void *p), (h, p))                              \
    X(cudaIpcOpenMemHandle, (void **p, cudaIpcMemHandle_t h, unsigned int flags), (p, h, flags))   \
    X(cudaIpcCloseMemHandle, (void *p), (p))                                                       \
    X(cudaGetDriverEntryPointByVersion,                                                            \
      (const char *sym, void **fp, unsigned int version, unsigned long long flags,                 \
       enum cudaDriverEntryPointQueryResult *status),                                              \
      (sym, fp, version, flags, status))

static struct {
#define X(name, params, args) cudaError_t(*name) params;
    CUDART_FUNCS(X)
#undef X
    const char *(*cudaGetErrorString)(cudaError_t);
} fn;

static pthread_once_t once = PTHREAD_ONCE_INIT;
static bool loaded;
static char why[256];

static void load(void)
{
    const char *names[] = {MC_CUDART_SONAME, "libcudart.so"}, *missing = NULL;
    void *h = NULL;

    for (int i = 0; i < 2 && !h; i++)
        h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        snprintf(why, sizeof(why), "cannot load %s: %s", MC_CUDART_SONAME, dlerror());
        return;
    }
#define X(name, params, args)                                                                      \
    if (!(*(void **)&fn.name = dlsym(h, #name)) && !missing)                                       \
        missing = #name;
    CUDART_FUNCS(X)
    X(cudaGetErrorString, (), ())
#undef X
    if (missing) {
        snprintf(why, sizeof(why), "%s has no %s", MC_CUDART_SONAME, missing);
        dlclose(h);
        return;
    }
    loaded = true;
}

bool mc__cudart_available(const char **why_p)
{
    pthread_once(&once, load);
    if (!loaded && why_p)
        *why_p = why;
    return loaded;
}

#define X(name, params, args)                                                                      \
    MC_HIDDEN cudaError_t name params                                                              \
    {                                                                                              \
        return mc__cudart_available(NULL) ? fn.name args : cudaErrorInsufficientDriver;            \
    }
CUDART_FUNCS(X)
#undef X

MC_HIDDEN const char *cudaGetErrorString(cudaError_t err)
{
    return mc__cudart_available(NULL) ? fn.cudaGetErrorString(err) : "CUDA runtime not loaded";
}
#else
bool mc__cudart_available(const char **why_p)
{
    if (why_p)
        *why_p = "built without CUDA";
    return false;
}
#endif
