/* softverbs: protection domains and memory regions.
 *
 * An MR's lkey and rkey are equal: the slot in ctx->mrs shifted left by 8, plus a byte that
 * changes on every registration, so a stale key of a reused slot does not match.
 */
#include "sv_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#define SV_PIN_BATCH 1024 /* pages checked per process_vm_readv */

SV_EXPORT struct ibv_pd *ibv_alloc_pd(struct ibv_context *ibctx)
{
    struct sv_pd *pd = calloc(1, sizeof(*pd));

    if (!pd) {
        errno = ENOMEM;
        return NULL;
    }
    pd->ibpd.context = ibctx;
    return &pd->ibpd;
}

SV_EXPORT int ibv_dealloc_pd(struct ibv_pd *pd)
{
    free(container_of(pd, struct sv_pd, ibpd));
    return 0;
}

/* Finds a free slot, growing the table; called with ctx->lock held. */
static int sv_mr_slot(struct sv_context *ctx, uint32_t *slot_p)
{
    uint32_t i, cap;
    struct sv_mr **t;

    for (i = 1; i < ctx->mr_cap; i++) {
        if (!ctx->mrs[i]) {
            *slot_p = i;
            return 0;
        }
    }
    cap = ctx->mr_cap ? ctx->mr_cap * 2 : 64;
    if (cap > (1u << 24))
        return ENOMEM;
    t = realloc(ctx->mrs, cap * sizeof(*t));
    if (!t)
        return ENOMEM;
    memset(t + ctx->mr_cap, 0, (cap - ctx->mr_cap) * sizeof(*t));
    *slot_p = ctx->mr_cap ? ctx->mr_cap : 1;
    ctx->mrs = t;
    ctx->mr_cap = cap;
    return 0;
}

static bool sv_access_valid(unsigned int access)
{
    unsigned int need_local = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC;

    return !(access & need_local) || (access & IBV_ACCESS_LOCAL_WRITE);
}

/* The kernel pins a region's pages at registration and fails with EFAULT when one of them is
 * unmapped or inaccessible (PROT_NONE, like the VA the CUDA runtime reserves for device memory).
 * process_vm_readv on ourselves asks the kernel the same question without faulting: it reads
 * one byte of every page and stops at the first page it cannot read. Returns 0 or an errno. */
static int sv_mem_check(const void *addr, size_t length)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE), i, n;
    uintptr_t start = (uintptr_t)addr;
    size_t npages;
    struct iovec remote[SV_PIN_BATCH];
    char sink[SV_PIN_BATCH];
    struct iovec local = {.iov_base = sink};
    ssize_t got;

    if (length > UINTPTR_MAX - start)
        return EFAULT;
    npages = length ? (start + length - 1) / page - start / page + 1 : 0;
    for (i = 0; i < npages; i += n) {
        for (n = 0; n < SV_PIN_BATCH && i + n < npages; n++) {
            /* The first page is read at addr, the others at their start: all inside the range. */
            remote[n].iov_base = (void *)(i + n ? (start / page + i + n) * page : start);
            remote[n].iov_len = 1;
        }
        local.iov_len = n;
        got = process_vm_readv(getpid(), &local, 1, remote, n, 0);
        if (got == (ssize_t)n)
            continue;
        if (got < 0 && (errno == ENOSYS || errno == EPERM))
            return 0; /* forbidden here (seccomp): register unchecked, as before */
        return got < 0 && errno != EFAULT ? errno : EFAULT;
    }
    return 0;
}

/* The kernel pins the pages of a region with write access (local or remote write) for writing,
 * which fails with EFAULT where a mapping lacks write permission (PROT_READ: a file mapped
 * read-only). /proc/self/maps says which ones do; 0 or EFAULT (0 when it cannot be read). */
static int sv_mem_check_write(const void *addr, size_t length)
{
    FILE *f = fopen("/proc/self/maps", "re");
    uintptr_t start = (uintptr_t)addr;
    char line[512], perms[5];
    unsigned long long lo, hi;
    int err = 0;

    while (f && !err && fgets(line, sizeof(line), f)) {
        if (!strchr(line, '\n')) /* (a long path: the rest of the line is skipped below) */
            for (int c; (c = fgetc(f)) != EOF && c != '\n';)
                ;
        if (sscanf(line, "%llx-%llx %4s", &lo, &hi, perms) != 3)
            continue;
        if (lo >= start + length)
            break;
        if (hi > start && perms[1] != 'w')
            err = EFAULT;
    }
    if (f)
        fclose(f);
    return err;
}

SV_EXPORT struct ibv_mr *ibv_reg_mr_iova2(struct ibv_pd *pd, void *addr, size_t length,
                                          uint64_t iova, unsigned int access)
{
    struct sv_context *ctx = sv_ctx(pd->context);
    struct sv_mr *mr;
    uint32_t slot;
    int err;

    if (!sv_access_valid(access) || (!addr && length) || length > sv_max_mr_size()) {
        errno = EINVAL;
        return NULL;
    }
    err = sv_mem_check(addr, length);
    if (!err && (access & (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                           IBV_ACCESS_REMOTE_ATOMIC | IBV_ACCESS_MW_BIND)))
        err = sv_mem_check_write(addr, length);
    if (err) {
        errno = err;
        return NULL;
    }
    mr = calloc(1, sizeof(*mr));
    if (!mr) {
        errno = ENOMEM;
        return NULL;
    }
    pthread_mutex_lock(&ctx->lock);
    err = sv_mr_slot(ctx, &slot);
    if (err) {
        pthread_mutex_unlock(&ctx->lock);
        free(mr);
        errno = err;
        return NULL;
    }
    mr->ibmr.context = pd->context;
    mr->ibmr.pd = pd;
    mr->ibmr.addr = addr;
    mr->ibmr.length = length;
    mr->ibmr.handle = slot;
    mr->ibmr.lkey = mr->ibmr.rkey = slot << 8 | (++ctx->key_seq & 0xff);
    mr->iova = iova;
    mr->access = (int)access;
    ctx->mrs[slot] = mr;
    pthread_mutex_unlock(&ctx->lock);
    return &mr->ibmr;
}

#undef ibv_reg_mr
SV_EXPORT struct ibv_mr *ibv_reg_mr(struct ibv_pd *pd, void *addr, size_t length, int access)
{
    return ibv_reg_mr_iova2(pd, addr, length, (uintptr_t)addr, (unsigned int)access);
}

#undef ibv_reg_mr_iova
SV_EXPORT struct ibv_mr *ibv_reg_mr_iova(struct ibv_pd *pd, void *addr, size_t length,
                                         uint64_t iova, int access)
{
    return ibv_reg_mr_iova2(pd, addr, length, iova, (unsigned int)access);
}

SV_EXPORT int ibv_dereg_mr(struct ibv_mr *ibmr)
{
    struct sv_context *ctx = sv_ctx(ibmr->context);

    pthread_mutex_lock(&ctx->lock);
    ctx->mrs[ibmr->handle] = NULL;
    pthread_mutex_unlock(&ctx->lock);
    free(container_of(ibmr, struct sv_mr, ibmr));
    return 0;
}

/* Translates [iova, iova + len) of the MR named by key to a local pointer after checking the
 * PD and the access rights; NULL when any check fails. Called with ctx->lock held. */
uint8_t *sv_mr_ptr(struct sv_context *ctx, struct ibv_pd *pd, uint32_t key, uint64_t iova,
                   uint64_t len, int access)
{
    uint32_t slot = key >> 8;
    struct sv_mr *mr;

    if (slot == 0 || slot >= ctx->mr_cap)
        return NULL;
    mr = ctx->mrs[slot];
    if (!mr || mr->ibmr.lkey != key || mr->ibmr.pd != pd)
        return NULL;
    if ((mr->access & access) != access)
        return NULL;
    if (iova < mr->iova || len > mr->ibmr.length || iova - mr->iova > mr->ibmr.length - len)
        return NULL;
    return (uint8_t *)mr->ibmr.addr + (iova - mr->iova);
}

/* Copies n bytes between buf and the scatter/gather list, starting at byte offset off of the
 * list; to_sge selects the direction (and requires local write access). Returns 0, or -1 when
 * an entry fails its key, range or access check or the list is too short. Called with
 * ctx->lock held. */
int sv_sge_copy(struct sv_context *ctx, struct ibv_pd *pd, const struct ibv_sge *sge, int nsge,
                uint64_t off, uint8_t *buf, uint64_t n, bool to_sge)
{
    int access = to_sge ? IBV_ACCESS_LOCAL_WRITE : 0;
    uint64_t part;
    uint8_t *p;
    int i;

    for (i = 0; i < nsge && n; i++) {
        if (off >= sge[i].length) {
            off -= sge[i].length;
            continue;
        }
        part = sge[i].length - off < n ? sge[i].length - off : n;
        p = sv_mr_ptr(ctx, pd, sge[i].lkey, sge[i].addr + off, part, access);
        if (!p)
            return -1;
        if (to_sge)
            memcpy(p, buf, part);
        else
            memcpy(buf, p, part);
        buf += part;
        n -= part;
        off = 0;
    }
    return n ? -1 : 0;
}

/* Checks every non-empty entry of a scatter/gather list. Called with ctx->lock held. */
bool sv_sge_valid(struct sv_context *ctx, struct ibv_pd *pd, const struct ibv_sge *sge, int nsge,
                  int access)
{
    int i;

    for (i = 0; i < nsge; i++)
        if (sge[i].length && !sv_mr_ptr(ctx, pd, sge[i].lkey, sge[i].addr, sge[i].length, access))
            return false;
    return true;
}
