/* RDMA transport and VRAM: GPUDirect registration of CUDA memory (a dmabuf exported by the CUDA
 * driver, else the peer-memory path of ibv_reg_mr), and, when the NIC cannot reach the GPU,
 * staging through pinned host memory registered on every device.
 *
 * Staging serves the initiator's own VRAM only: a WRITE copies the slice to a staging slot and
 * posts from there, a READ lands in a slot and is copied to the GPU on completion. A target's
 * VRAM that no NIC can reach is not published with rkeys, so peers cannot address it over rdma
 * (and tcp refuses VRAM): such requests fail at submit with a reason. The copies are
 * synchronous cudaMemcpy calls in the progress context, which is correct but not fast. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "rdma_int.h"

#if MC_HAVE_CUDA
#include <cuda.h>
#include <cuda_runtime_api.h>

typedef CUresult (*handle_fn)(void *, CUdeviceptr, size_t, CUmemRangeHandleType,
                              unsigned long long);

/* A dmabuf fd for [addr, addr+len) rounded out to pages, or -1 (reason in why). */
static int dmabuf_export(uint64_t addr, uint64_t len, uint64_t *base_p, char *why, size_t size)
{
    static handle_fn get_handle;
    enum cudaDriverEntryPointQueryResult q;
    uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE), base = addr & ~(page - 1);
    uint64_t end = (addr + len + page - 1) & ~(page - 1);
    int fd = -1;

    if (!get_handle &&
        (cudaGetDriverEntryPointByVersion("cuMemGetHandleForAddressRange", (void **)&get_handle,
                                          11070, cudaEnableDefault, &q) != cudaSuccess ||
         q != cudaDriverEntryPointSuccess)) {
        get_handle = NULL;
        snprintf(why, size, "the CUDA driver cannot export dmabufs");
        return -1;
    }
    CUresult r =
        get_handle(&fd, (CUdeviceptr)base, end - base, CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0);
    if (r != CUDA_SUCCESS) {
        snprintf(why, size, "cuMemGetHandleForAddressRange: error %d", (int)r);
        return -1;
    }
    *base_p = base;
    return fd;
}

struct ibv_mr *mc__rdma_vram_reg(mc_rdma_dev_t *d, uint64_t addr, uint64_t len, char *why,
                                 size_t size)
{
    uint64_t base;
    struct ibv_mr *mr = NULL;
    char dmabuf_why[128];
    int fd = dmabuf_export(addr, len, &base, dmabuf_why, sizeof(dmabuf_why));

    if (fd >= 0) {
        mr = ibv_reg_dmabuf_mr(d->pd, addr - base, len, addr, fd, d->access);
        if (!mr)
            snprintf(dmabuf_why, sizeof(dmabuf_why), "ibv_reg_dmabuf_mr: %s", strerror(errno));
        close(fd); /* the region holds its own reference */
    }
    if (!mr) /* peer memory (nvidia-peermem) lets ibv_reg_mr pin GPU pages */
        mr = ibv_reg_mr(d->pd, (void *)(uintptr_t)addr, len, d->access);
    if (!mr)
        snprintf(why, size, "dmabuf: %s; peer memory: %s", dmabuf_why, strerror(errno));
    return mr;
}

static int copy(void *dst, const void *src, size_t len, enum cudaMemcpyKind kind)
{
    cudaError_t err = cudaMemcpy(dst, src, len, kind);

    if (err != cudaSuccess)
        return mc__set_error(-EIO, "cudaMemcpy: %s", cudaGetErrorString(err));
    return 0;
}

static void *host_alloc(size_t len)
{
    void *p = NULL;
    return cudaHostAlloc(&p, len, cudaHostAllocPortable) == cudaSuccess ? p : NULL;
}

static void host_free(void *p)
{
    cudaFreeHost(p);
}
#else
struct ibv_mr *mc__rdma_vram_reg(mc_rdma_dev_t *d, uint64_t addr, uint64_t len, char *why,
                                 size_t size)
{
    (void)d;
    (void)addr;
    (void)len;
    snprintf(why, size, "built without CUDA");
    return NULL;
}

static int copy(void *dst, const void *src, size_t len, int kind)
{
    (void)dst;
    (void)src;
    (void)len;
    (void)kind;
    return mc__set_error(-ENOTSUP, "built without CUDA");
}

static void *host_alloc(size_t len)
{
    (void)len;
    return NULL;
}

static void host_free(void *p)
{
    (void)p;
}
#define cudaMemcpyDeviceToHost 0
#define cudaMemcpyHostToDevice 0
#endif

/* ---- the staging pool ---- */

struct mc_rdma_stage {
    mc_buffer_t buf; /* the pinned host memory, registered like any buffer */
    uint32_t slot;   /* bytes per slot: MC_SLICE_SIZE */
    unsigned n_free;
    uint16_t free[MC_RDMA_STAGE_SLOTS];
};

static int stage_create(mc_engine_t *e)
{
    struct mc_rdma_stage *st = calloc(1, sizeof(*st));
    void *mem = st ? host_alloc(MC_RDMA_STAGE_SLOTS * e->cfg.slice_size) : NULL;

    if (!mem) {
        free(st);
        return mc__set_error(-ENOMEM, "no pinned host memory for VRAM staging");
    }
    st->buf.addr = (uint64_t)(uintptr_t)mem;
    st->buf.len = MC_RDMA_STAGE_SLOTS * e->cfg.slice_size;
    snprintf(st->buf.location, sizeof(st->buf.location), "cpu:0");
    st->buf.memfd = -1;
    int rc = mc__rdma_mr_register(e, &st->buf);
    if (rc) {
        host_free(mem);
        free(st);
        return rc;
    }
    st->slot = (uint32_t)e->cfg.slice_size;
    for (unsigned i = 0; i < MC_RDMA_STAGE_SLOTS; i++)
        st->free[st->n_free++] = (uint16_t)(MC_RDMA_STAGE_SLOTS - 1 - i);
    rdma_of(e)->stage = st;
    return 0;
}

void mc__rdma_stage_destroy(mc_engine_t *e)
{
    struct mc_rdma_stage *st = rdma_of(e)->stage;

    if (!st)
        return;
    mc__rdma_mr_deregister(e, &st->buf);
    host_free((void *)(uintptr_t)st->buf.addr);
    free(st);
    rdma_of(e)->stage = NULL;
}

/* Take a slot for s (the local side of its work requests is then the slot). A WRITE's bytes
 * are copied in now. Returns 0, -EAGAIN when every slot is busy, or an error (reason set). */
int mc__rdma_stage_get(mc_engine_t *e, mc_slice_t *s, const mc_buffer_t **buf_p, uint64_t *addr_p)
{
    mc_rdma_t *rd = rdma_of(e);
    int rc;

    if (!rd->stage && (rc = stage_create(e)))
        return rc;
    if (!rd->stage->n_free)
        return -EAGAIN;
    struct mc_rdma_stage *st = rd->stage;
    uint16_t i = st->free[--st->n_free];
    void *slot = (void *)(uintptr_t)(st->buf.addr + (uint64_t)i * st->slot);
    if (s->opcode == MC_WRITE && (rc = copy(slot, (uint8_t *)s->task->req.local + s->offset, s->len,
                                            cudaMemcpyDeviceToHost))) {
        st->free[st->n_free++] = i;
        return rc;
    }
    rdma_sl(s)->stage = (uint16_t)(i + 1);
    *buf_p = &st->buf;
    *addr_p = (uint64_t)(uintptr_t)slot;
    return 0;
}

/* The slice is done with its slot: a successful READ's bytes go to the GPU first. */
int mc__rdma_stage_put(mc_engine_t *e, mc_slice_t *s, bool ok)
{
    struct mc_rdma_stage *st = rdma_of(e)->stage;
    uint16_t i = (uint16_t)(rdma_sl(s)->stage - 1);
    int rc = 0;

    if (ok && s->opcode == MC_READ)
        rc = copy((uint8_t *)s->task->req.local + s->offset,
                  (void *)(uintptr_t)(st->buf.addr + (uint64_t)i * st->slot), s->len,
                  cudaMemcpyHostToDevice);
    st->free[st->n_free++] = i;
    rdma_sl(s)->stage = 0;
    return rc;
}
