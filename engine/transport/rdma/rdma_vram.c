/* RDMA transport and VRAM: GPUDirect registration of CUDA memory (a dmabuf exported by the CUDA
 * driver, else the peer-memory path of ibv_reg_mr). VRAM that no NIC reaches gets no memory
 * region: rdma refuses its tasks, and the file transport stages them through host memory (its
 * own bounce chunks, or its owner's), moving the host bytes over rdma as over any transport. */
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
#endif
