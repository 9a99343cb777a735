/* Copies between VRAM and host memory, the staging pipeline's other kind of piece: each goes on
 * its device's stream with an event recorded behind it, and the progress loop polls the oldest
 * event of every stream (a stream runs its copies in order, so the oldest finishes first). The
 * copier bounds what is in flight (MC_FILE_QUEUE_DEPTH), queues the rest, and reports a copy
 * that failed to its own piece only. The device runtime is reached through file_copy_ops_t:
 * the CUDA runtime here, a test's own in the unit tests. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "file_int.h"

void mc__file_copy_init(file_copier_t *c, unsigned depth)
{
    memset(c, 0, sizeof(*c));
    c->depth = depth;
    mc_list_init(&c->waiting);
    mc_list_init(&c->failed);
    for (unsigned i = 0; i < FILE_COPY_DEVS; i++)
        mc_list_init(&c->dev[i].fifo);
}

/* A failed start: reported from the next reap, not from inside the submitter. */
static void start_failed(file_copier_t *c, file_io_t *io, int rc)
{
    io->res = rc;
    mc_list_push_back(&c->failed, &io->link);
}

static void start(file_copier_t *c, file_io_t *io)
{
    const file_copy_ops_t *ops = c->ops;
    file_copy_dev_t *d;
    void *dst = io->write ? (void *)(uintptr_t)io->pos : io->mem;
    const void *src = io->write ? (const void *)io->mem : (const void *)(uintptr_t)io->pos;
    int rc;

    io->why[0] = 0;
    io->ev = NULL;
    if (!ops) {
        snprintf(io->why, sizeof(io->why), "no CUDA runtime");
        start_failed(c, io, -MC_ENODEV);
        return;
    }
    if (io->dev < 0 || io->dev >= FILE_COPY_DEVS) {
        snprintf(io->why, sizeof(io->why), "device %d is beyond the %d the engine drives", io->dev,
                 FILE_COPY_DEVS);
        start_failed(c, io, -MC_ENODEV);
        return;
    }
    d = &c->dev[io->dev];
    if (!d->spare && !(d->spare = calloc(c->depth, sizeof(*d->spare)))) {
        snprintf(io->why, sizeof(io->why), "out of memory");
        start_failed(c, io, -ENOMEM);
        return;
    }
    if (!d->stream && (rc = ops->stream_create(io->dev, &d->stream, io->why, sizeof(io->why)))) {
        start_failed(c, io, rc);
        return;
    }
    if (d->n_spare)
        io->ev = d->spare[--d->n_spare];
    else if ((rc = ops->event_create(io->dev, &io->ev, io->why, sizeof(io->why)))) {
        start_failed(c, io, rc);
        return;
    }
    rc = ops->copy(io->dev, d->stream, io->ev, dst, src, io->len, io->why, sizeof(io->why));
    if (rc) {
        d->spare[d->n_spare++] = io->ev;
        io->ev = NULL;
        start_failed(c, io, rc);
        return;
    }
    c->inflight++;
    mc_list_push_back(&d->fifo, &io->link);
}

void mc__file_copy_submit(mc_engine_t *e, file_copier_t *c, file_io_t *io)
{
    (void)e;
    io->done = 0;
    if (c->inflight >= c->depth)
        mc_list_push_back(&c->waiting, &io->link);
    else
        start(c, io);
}

/* The oldest copy on d's stream, or NULL. */
static file_io_t *oldest(file_copy_dev_t *d)
{
    return mc_list_empty(&d->fifo) ? NULL : mc_container_of(d->fifo.next, file_io_t, link);
}

/* io's copy is over (rc from query or wait): its event is kept for the next copy. */
static void finish(mc_engine_t *e, file_copier_t *c, file_copy_dev_t *d, file_io_t *io, int rc)
{
    mc_list_del(&io->link);
    c->inflight--;
    if (d->n_spare < c->depth)
        d->spare[d->n_spare++] = io->ev;
    else
        c->ops->event_destroy(io->dev, io->ev);
    io->ev = NULL;
    if (!rc)
        io->done = io->len;
    io->cb(e, io, rc);
}

void mc__file_copy_reap(mc_engine_t *e, file_copier_t *c)
{
    mc_list_t *n;

    for (unsigned i = 0; i < FILE_COPY_DEVS && c->inflight; i++) {
        file_copy_dev_t *d = &c->dev[i];
        file_io_t *io;
        while ((io = oldest(d))) {
            int rc = c->ops->query(io->dev, io->ev, io->why, sizeof(io->why));
            if (rc == -EAGAIN)
                break; /* the ones behind it on this stream are not done either */
            finish(e, c, d, io, rc);
        }
    }
    while ((n = mc_list_pop_front(&c->failed))) {
        file_io_t *io = mc_container_of(n, file_io_t, link);
        io->cb(e, io, io->res);
    }
    while (c->inflight < c->depth && (n = mc_list_pop_front(&c->waiting)))
        start(c, mc_container_of(n, file_io_t, link));
}

void mc__file_copy_stop(mc_engine_t *e, file_copier_t *c)
{
    mc_list_t *n;

    while ((n = mc_list_pop_front(&c->waiting))) {
        file_io_t *io = mc_container_of(n, file_io_t, link);
        io->cb(e, io, -ECANCELED);
    }
    for (unsigned i = 0; i < FILE_COPY_DEVS; i++) {
        file_copy_dev_t *d = &c->dev[i];
        file_io_t *io;
        while ((io = oldest(d)))
            finish(e, c, d, io, c->ops->wait(io->dev, io->ev, io->why, sizeof(io->why)));
    }
    while ((n = mc_list_pop_front(&c->failed))) {
        file_io_t *io = mc_container_of(n, file_io_t, link);
        io->cb(e, io, io->res);
    }
    /* What the callbacks queued meanwhile never starts. */
    while ((n = mc_list_pop_front(&c->waiting))) {
        file_io_t *io = mc_container_of(n, file_io_t, link);
        io->cb(e, io, -ECANCELED);
    }
    for (unsigned i = 0; i < FILE_COPY_DEVS; i++) {
        file_copy_dev_t *d = &c->dev[i];
        while (d->n_spare)
            c->ops->event_destroy((int)i, d->spare[--d->n_spare]);
        free(d->spare);
        d->spare = NULL;
        if (d->stream)
            c->ops->stream_destroy((int)i, d->stream);
        d->stream = NULL;
    }
}

/* ---- the CUDA runtime ---- */

#if MC_HAVE_CUDA
#include <pthread.h>

#include <cuda.h>
#include <cuda_runtime_api.h>

static int cuda_fail(cudaError_t err, const char *what, char *why, size_t size)
{
    snprintf(why, size, "%s: %s", what, cudaGetErrorString(err));
    return -EIO;
}

/* The allocation holding an address (the driver's cuMemGetAddressRange), for IPC. */
typedef CUresult (*range_fn)(CUdeviceptr *, size_t *, CUdeviceptr);
static range_fn range;

/* The driver's current context, to give a thread back the one it had. */
typedef CUresult (*ctx_get_fn)(CUcontext *);
typedef CUresult (*ctx_set_fn)(CUcontext);
static ctx_get_fn ctx_get;
static ctx_set_fn ctx_set;
static pthread_once_t ctx_once = PTHREAD_ONCE_INIT;

static void ctx_resolve(void)
{
    enum cudaDriverEntryPointQueryResult q;
    void *g = NULL, *s = NULL;

    if (cudaGetDriverEntryPointByVersion("cuCtxGetCurrent", &g, 4000, cudaEnableDefault, &q) ==
            cudaSuccess &&
        q == cudaDriverEntryPointSuccess &&
        cudaGetDriverEntryPointByVersion("cuCtxSetCurrent", &s, 4000, cudaEnableDefault, &q) ==
            cudaSuccess &&
        q == cudaDriverEntryPointSuccess) {
        ctx_get = (ctx_get_fn)g;
        ctx_set = (ctx_set_fn)s;
    }
    if (cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &g, 3020, cudaEnableDefault, &q) ==
            cudaSuccess &&
        q == cudaDriverEntryPointSuccess)
        range = (range_fn)g;
}

/* Make dev's primary context current for the calls that follow; dev_leave gives the thread the
 * context it had (none, often): a host thread that drives progress keeps its own, and no device
 * gets a context nobody asked for (setting the old device back would create one on it). */
static cudaError_t dev_enter(int dev, CUcontext *saved)
{
    pthread_once(&ctx_once, ctx_resolve);
    *saved = NULL;
    if (ctx_get && ctx_get(saved) != CUDA_SUCCESS)
        *saved = NULL;
    return cudaSetDevice(dev);
}

static void dev_leave(CUcontext saved)
{
    if (ctx_set)
        ctx_set(saved);
}

static int cuda_stream_create(int dev, void **s_p, char *why, size_t size)
{
    CUcontext saved;
    cudaError_t err = dev_enter(dev, &saved);
    const char *what = "cudaSetDevice";

    if (err == cudaSuccess) {
        what = "cudaStreamCreate";
        err = cudaStreamCreateWithFlags((cudaStream_t *)s_p, cudaStreamNonBlocking);
    }
    dev_leave(saved);
    return err == cudaSuccess ? 0 : cuda_fail(err, what, why, size);
}

static void cuda_stream_destroy(int dev, void *s)
{
    CUcontext saved;

    if (dev_enter(dev, &saved) == cudaSuccess)
        cudaStreamDestroy(s);
    dev_leave(saved);
}

static int cuda_event_create(int dev, void **ev_p, char *why, size_t size)
{
    CUcontext saved;
    cudaError_t err = dev_enter(dev, &saved);
    const char *what = "cudaSetDevice";

    if (err == cudaSuccess) {
        what = "cudaEventCreate";
        err = cudaEventCreateWithFlags((cudaEvent_t *)ev_p, cudaEventDisableTiming);
    }
    dev_leave(saved);
    return err == cudaSuccess ? 0 : cuda_fail(err, what, why, size);
}

static void cuda_event_destroy(int dev, void *ev)
{
    CUcontext saved;

    if (dev_enter(dev, &saved) == cudaSuccess)
        cudaEventDestroy(ev);
    dev_leave(saved);
}

/* A copy queued whose event could not be recorded behind it is waited for here: its piece is
 * about to be reported failed, and its chunk reused. */
static int cuda_copy(int dev, void *s, void *ev, void *dst, const void *src, size_t len, char *why,
                     size_t size)
{
    CUcontext saved;
    cudaError_t err = dev_enter(dev, &saved);
    const char *what = "cudaSetDevice";

    if (err == cudaSuccess) {
        what = "cudaMemcpyAsync";
        err = cudaMemcpyAsync(dst, src, len, cudaMemcpyDefault, s);
    }
    if (err == cudaSuccess) {
        what = "cudaEventRecord";
        err = cudaEventRecord(ev, s);
        if (err != cudaSuccess)
            cudaStreamSynchronize(s);
    }
    dev_leave(saved);
    return err == cudaSuccess ? 0 : cuda_fail(err, what, why, size);
}

static int cuda_query(int dev, void *ev, char *why, size_t size)
{
    CUcontext saved;
    cudaError_t err = dev_enter(dev, &saved);

    if (err == cudaSuccess)
        err = cudaEventQuery(ev);
    dev_leave(saved);
    if (err == cudaErrorNotReady)
        return -EAGAIN;
    return err == cudaSuccess ? 0 : cuda_fail(err, "copy", why, size);
}

static int cuda_wait(int dev, void *ev, char *why, size_t size)
{
    CUcontext saved;
    cudaError_t err = dev_enter(dev, &saved);

    if (err == cudaSuccess)
        err = cudaEventSynchronize(ev);
    dev_leave(saved);
    return err == cudaSuccess ? 0 : cuda_fail(err, "copy", why, size);
}

static int cuda_ipc_export(int dev, uint64_t addr, uint64_t blen, uint8_t handle[FILE_IPC_HANDLE],
                           uint64_t *off_p, char *why, size_t size)
{
    CUdeviceptr base = 0;
    size_t len = 0;
    cudaIpcMemHandle_t h;
    CUcontext saved;
    cudaError_t err = dev_enter(dev, &saved); /* (resolves range too) */

    _Static_assert(sizeof(h) == FILE_IPC_HANDLE, "an IPC handle is 64 bytes");
    if (!range) {
        dev_leave(saved);
        snprintf(why, size, "the CUDA driver has no cuMemGetAddressRange");
        return -ENOTSUP;
    }
    if (err == cudaSuccess && range(&base, &len, (CUdeviceptr)addr) != CUDA_SUCCESS)
        err = cudaErrorInvalidValue;
    if (err == cudaSuccess && addr - (uint64_t)base + blen > len) {
        dev_leave(saved);
        snprintf(why, size, "it spans more than one allocation");
        return -EINVAL;
    }
    if (err == cudaSuccess)
        err = cudaIpcGetMemHandle(&h, (void *)(uintptr_t)base);
    dev_leave(saved);
    if (err != cudaSuccess)
        return cuda_fail(err, "cudaIpcGetMemHandle", why, size);
    memcpy(handle, &h, sizeof(h));
    *off_p = addr - (uint64_t)base;
    return 0;
}

static int cuda_ipc_open(int dev, const uint8_t handle[FILE_IPC_HANDLE], void **base_p,
                         uint64_t *len_p, char *why, size_t size)
{
    cudaIpcMemHandle_t h;
    CUcontext saved;
    CUdeviceptr base = 0;
    size_t len = 0;
    cudaError_t err = dev_enter(dev, &saved);

    memcpy(&h, handle, sizeof(h));
    if (err == cudaSuccess)
        err = cudaIpcOpenMemHandle(base_p, h, cudaIpcMemLazyEnablePeerAccess);
    if (err == cudaSuccess &&
        (!range || range(&base, &len, (CUdeviceptr)(uintptr_t)*base_p) != CUDA_SUCCESS)) {
        cudaIpcCloseMemHandle(*base_p); /* its length unknown: no copy could be bounded */
        err = cudaErrorInvalidValue;
    }
    dev_leave(saved);
    if (err != cudaSuccess)
        return cuda_fail(err, "cudaIpcOpenMemHandle", why, size);
    *len_p = len;
    return 0;
}

static void cuda_ipc_close(int dev, void *base)
{
    CUcontext saved;

    if (dev_enter(dev, &saved) == cudaSuccess)
        cudaIpcCloseMemHandle(base);
    dev_leave(saved);
}

static const file_copy_ops_t cuda_ops = {
    .stream_create = cuda_stream_create,
    .stream_destroy = cuda_stream_destroy,
    .event_create = cuda_event_create,
    .event_destroy = cuda_event_destroy,
    .copy = cuda_copy,
    .query = cuda_query,
    .wait = cuda_wait,
    .ipc_export = cuda_ipc_export,
    .ipc_open = cuda_ipc_open,
    .ipc_close = cuda_ipc_close,
};

const file_copy_ops_t *const mc__file_copy_cuda = &cuda_ops;

int mc__file_cuda_pin(void *mem, size_t len, int dev, char *why, size_t size)
{
    CUcontext saved;
    cudaError_t err = dev_enter(dev, &saved);

    if (err == cudaSuccess)
        err = cudaHostRegister(mem, len, cudaHostRegisterPortable);
    dev_leave(saved);
    return err == cudaSuccess ? 0 : cuda_fail(err, "cudaHostRegister", why, size);
}

void mc__file_cuda_unpin(void *mem, int dev)
{
    CUcontext saved;

    if (dev_enter(dev, &saved) == cudaSuccess)
        cudaHostUnregister(mem);
    dev_leave(saved);
}
#else
const file_copy_ops_t *const mc__file_copy_cuda = NULL;

int mc__file_cuda_pin(void *mem, size_t len, int dev, char *why, size_t size)
{
    (void)mem;
    (void)len;
    (void)dev;
    snprintf(why, size, "built without CUDA");
    return -ENOTSUP;
}

void mc__file_cuda_unpin(void *mem, int dev)
{
    (void)mem;
    (void)dev;
}
#endif
