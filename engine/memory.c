/* Registered memory: the table peers' requests are checked against, locations, and the
 * memfd-backed allocator. */
#include <errno.h>
#include <numaif.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>
#if MC_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

#include "sys/memfd.h"
#include "sys/cudart.h"
#include "sys/maps.h"
#include "transport/transport.h"

int mc__memtab_init(mc_memtab_t *t)
{
    memset(t, 0, sizeof(*t));
    pthread_rwlock_init(&t->lock, NULL);
    pthread_mutex_init(&t->drain_lock, NULL);
    pthread_cond_init(&t->drain_cond, NULL);
    t->opaque_next = MC_OPAQUE_BASE;
    return 0;
}

/* Whether transport i is in use and deals with b (an opaque buffer: its owner only). */
static bool tp_sees(mc_engine_t *e, unsigned i, const mc_buffer_t *b)
{
    return e->tp[i] && mc__buffer_visible(b, i);
}

/* Every transport's registration of b, in table order; undone in reverse on failure. */
static int tp_register(mc_engine_t *e, mc_buffer_t *b)
{
    for (unsigned i = 0; i < mc__n_transports; i++) {
        const mc_transport_ops_t *ops = mc__transports[i];
        int rc = tp_sees(e, i, b) && MC_TP_HAS(ops, mem_register) ? ops->mem_register(e, b) : 0;
        if (rc) {
            while (i-- > 0)
                if (tp_sees(e, i, b) && MC_TP_HAS(mc__transports[i], mem_deregister))
                    mc__transports[i]->mem_deregister(e, b);
            return rc;
        }
    }
    return 0;
}

static void tp_deregister(mc_engine_t *e, mc_buffer_t *b)
{
    for (unsigned i = mc__n_transports; i-- > 0;)
        if (tp_sees(e, i, b) && MC_TP_HAS(mc__transports[i], mem_deregister))
            mc__transports[i]->mem_deregister(e, b);
}

/* The table changed (caller holds mem.lock for writing). */
static void tp_changed(mc_engine_t *e)
{
    for (unsigned i = 0; i < mc__n_transports; i++)
        if (e->tp[i] && MC_TP_HAS(mc__transports[i], mem_changed))
            mc__transports[i]->mem_changed(e);
}

/* b, out of the table and drained, goes (an allocation's memory with it). */
static void buffer_free(mc_engine_t *e, mc_buffer_t *b)
{
    tp_deregister(e, b);
    if (b->memfd >= 0) {
        if (!e->mem.keep_mapped)
            munmap((void *)(uintptr_t)b->addr, b->len);
        close(b->memfd);
    }
    free(b);
}

void mc__memtab_fini(mc_engine_t *e)
{
    mc_memtab_t *t = &e->mem;

    for (size_t i = 0; i < t->on; i++) /* files first: nothing moves into memory any more */
        buffer_free(e, t->ov[i]);
    free(t->ov);
    for (size_t i = 0; i < t->n; i++)
        buffer_free(e, t->v[i]);
    free(t->v);
    while (t->dead) { /* their requests went with the engine's */
        mc_buffer_t *b = t->dead;
        t->dead = b->next_dead;
        buffer_free(e, b);
    }
    pthread_rwlock_destroy(&t->lock);
    pthread_mutex_destroy(&t->drain_lock);
    pthread_cond_destroy(&t->drain_cond);
}

/* Index of the last of the n buffers of v with addr <= a, or -1. */
static ssize_t vec_floor(mc_buffer_t *const *v, size_t n, uint64_t a)
{
    ssize_t lo = 0, hi = (ssize_t)n - 1, ans = -1;

    while (lo <= hi) {
        ssize_t mid = (lo + hi) / 2;
        if (v[mid]->addr <= a) {
            ans = mid;
            lo = mid + 1;
        } else {
            hi = mid - 1;
        }
    }
    return ans;
}

/* Index of the last memory buffer with addr <= a, or -1. Caller holds t->lock. */
static ssize_t memtab_floor(const mc_memtab_t *t, uint64_t a)
{
    return vec_floor(t->v, t->n, a);
}

/* The nearest memory buffer below addr that holds [addr, addr+len) (overlapping ones start
 * further back), or NULL. Caller holds t->lock. */
static mc_buffer_t *mem_find(const mc_memtab_t *t, uint64_t addr, uint64_t len)
{
    for (ssize_t i = memtab_floor(t, addr); i >= 0 && addr - t->v[i]->addr < t->max_len; i--) {
        mc_buffer_t *b = t->v[i];
        if (len <= b->len && addr - b->addr <= b->len - len)
            return b;
    }
    return NULL;
}

/* The opaque buffer holding [addr, addr+len), or NULL. Caller holds t->lock. Opaque buffers
 * never overlap: the one starting at or below addr is the only candidate. */
static mc_buffer_t *opaque_find(const mc_memtab_t *t, uint64_t addr, uint64_t len)
{
    ssize_t i = vec_floor(t->ov, t->on, addr);
    mc_buffer_t *b = i >= 0 ? t->ov[i] : NULL;

    return b && len <= b->len && addr - b->addr <= b->len - len ? b : NULL;
}

static mc_buffer_t *ref(mc_buffer_t *b)
{
    if (b)
        atomic_fetch_add(&b->refs, 1);
    return b;
}

mc_buffer_t *mc__mem_get(mc_engine_t *e, uint64_t addr, uint64_t len)
{
    pthread_rwlock_rdlock(&e->mem.lock);
    mc_buffer_t *b = ref(mem_find(&e->mem, addr, len));
    pthread_rwlock_unlock(&e->mem.lock);
    return b;
}

mc_buffer_t *mc__mem_get_owned(mc_engine_t *e, unsigned slot, uint64_t addr, uint64_t len)
{
    pthread_rwlock_rdlock(&e->mem.lock);
    mc_buffer_t *b = ref(opaque_find(&e->mem, addr, len));
    pthread_rwlock_unlock(&e->mem.lock);
    if (b && b->owner != slot + 1) {
        mc__mem_put(e, b);
        b = NULL;
    }
    return b;
}

mc_buffer_t *mc__mem_find_reg_locked(mc_engine_t *e, uint64_t addr, uint64_t len)
{
    const mc_memtab_t *t = &e->mem;
    mc_buffer_t *best = NULL;
    bool exact = false;

    if (addr >= MC_OPAQUE_BASE)
        return opaque_find(t, addr, len);
    for (ssize_t i = memtab_floor(t, addr); i >= 0 && addr - t->v[i]->addr < t->max_len; i--) {
        mc_buffer_t *b = t->v[i];
        bool holds = len <= b->len && addr - b->addr <= b->len - len;
        bool is = b->addr == addr && b->len == len;
        if (holds && (!best || (is && !exact) || (is == exact && b->serial > best->serial))) {
            best = b;
            exact = is;
        }
    }
    return best;
}

mc_buffer_t *mc__mem_find_any_locked(mc_engine_t *e, uint64_t addr, uint64_t len)
{
    return addr >= MC_OPAQUE_BASE ? opaque_find(&e->mem, addr, len) : mem_find(&e->mem, addr, len);
}

void mc__mem_wake(mc_engine_t *e)
{
    pthread_mutex_lock(&e->mem.drain_lock);
    pthread_cond_broadcast(&e->mem.drain_cond);
    pthread_mutex_unlock(&e->mem.drain_lock);
}

/* dead_ns is read before the references go: once the last one has, an unregister that was waiting
 * may free b at once. (A buffer that dies just after that read misses its wake-up here; its
 * unregister looks again within 10 ms.) */
void mc__mem_put_n(mc_engine_t *e, mc_buffer_t *b, unsigned n)
{
    bool dead = atomic_load(&b->dead_ns) != 0;

    if (atomic_fetch_sub(&b->refs, n) == n && dead)
        mc__mem_wake(e);
}

static int location_parse(const char *loc, int *kind_p, int *index_p)
{
    char kind[8];
    int idx, n = 0;

    if (sscanf(loc, "%7[a-z]:%d%n", kind, &idx, &n) != 2 || loc[n] || idx < 0)
        return mc__set_error(-EINVAL, "location \"%s\": expected cpu:N, cuda:N or *", loc);
    if (!strcmp(kind, "cpu"))
        *kind_p = 0;
    else if (!strcmp(kind, "cuda"))
        *kind_p = 1;
    else
        return mc__set_error(-EINVAL, "location \"%s\": unknown kind \"%s\"", loc, kind);
    *index_p = idx;
    return 0;
}

#if MC_HAVE_CUDA
/* The CUDA device of a pointer, or -1 for host memory / no CUDA device. */
static int cuda_device_of(const void *addr)
{
    struct cudaPointerAttributes attr;
    int count = 0;

    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0)
        return -1;
    if (cudaPointerGetAttributes(&attr, addr) != cudaSuccess)
        return -1;
    return attr.type == cudaMemoryTypeDevice ? attr.device : -1;
}

static int cuda_device_count(void)
{
    int count = 0;

    if (cudaGetDeviceCount(&count) != cudaSuccess)
        return 0;
    return count;
}
#else
static int cuda_device_of(const void *addr)
{
    (void)addr;
    return -1;
}

static int cuda_device_count(void)
{
    return 0;
}
#endif

/* Resolve "*" to a concrete location; check explicit ones exist. */
static int location_resolve(const void *addr, const char *loc, char *out)
{
    int kind, idx;

    if (!strcmp(loc, "*")) {
        void *page = (void *)((uintptr_t)addr & ~(uintptr_t)(sysconf(_SC_PAGESIZE) - 1));
        int status = -1, dev = cuda_device_of(addr);

        if (dev >= 0) {
            snprintf(out, MC_LOCATION_MAX, "cuda:%d", dev);
            return 0;
        }
        /* move_pages with no target nodes reports where each page lives; an untouched page
         * has no node yet (-ENOENT): call it node 0. */
        if (move_pages(0, 1, &page, NULL, &status, 0) != 0 || status < 0)
            status = 0;
        snprintf(out, MC_LOCATION_MAX, "cpu:%d", status);
        return 0;
    }
    int rc = location_parse(loc, &kind, &idx);
    if (rc)
        return rc;
    const char *why;
    if (kind == 1 && !mc__cudart_available(&why))
        return mc__set_error(-MC_ENODEV, "location %s: no CUDA device (%s)", loc, why);
    if (kind == 1 && idx >= cuda_device_count())
        return mc__set_error(-MC_ENODEV, "location %s: no CUDA device %d (%d found)", loc, idx,
                             cuda_device_count());
    snprintf(out, MC_LOCATION_MAX, "%s", loc);
    return 0;
}

/* The buffer registered (not allocated) as exactly [addr, addr+len) at location, or NULL.
 * Caller holds t->lock. */
static mc_buffer_t *memtab_same(const mc_memtab_t *t, uint64_t addr, uint64_t len,
                                const char *location)
{
    for (ssize_t i = memtab_floor(t, addr); i >= 0 && t->v[i]->addr == addr; i--)
        if (t->v[i]->len == len && t->v[i]->memfd < 0 && !strcmp(t->v[i]->location, location))
            return t->v[i];
    return NULL;
}

/* Insert b into the n buffers of *v_p (room for *cap_p), after every one starting at or below. */
static int vec_insert(mc_buffer_t ***v_p, size_t *n_p, size_t *cap_p, mc_buffer_t *b)
{
    ssize_t i = vec_floor(*v_p, *n_p, b->addr);

    if (*n_p == *cap_p) {
        size_t cap = *cap_p ? 2 * *cap_p : 16;
        mc_buffer_t **v = realloc(*v_p, cap * sizeof(*v));
        if (!v)
            return mc__set_error(-ENOMEM, "out of memory growing the registration table");
        *v_p = v;
        *cap_p = cap;
    }
    memmove(&(*v_p)[i + 2], &(*v_p)[i + 1], (*n_p - (size_t)(i + 1)) * sizeof(**v_p));
    (*v_p)[i + 1] = b;
    (*n_p)++;
    return 0;
}

static int memtab_insert(mc_memtab_t *t, mc_buffer_t *b)
{
    int rc;

    if (b->owner)
        return vec_insert(&t->ov, &t->on, &t->ocap, b);
    rc = vec_insert(&t->v, &t->n, &t->cap, b);
    if (!rc && b->len > t->max_len)
        t->max_len = b->len;
    return rc;
}

/* The same range registered again (a second layer of the host): one more registration of the
 * buffer, nothing else changes. 1 if so, 0 if it is new. */
static int mem_register_again(mc_engine_t *e, uint64_t addr, size_t len, const char *location)
{
    mc_buffer_t *b;

    pthread_rwlock_wrlock(&e->mem.lock);
    b = memtab_same(&e->mem, addr, len, location);
    if (b)
        b->regs++;
    pthread_rwlock_unlock(&e->mem.lock);
    return b != NULL;
}

/* Make b visible: every transport that deals with it registers it, then it joins the table. */
static int mem_insert(mc_engine_t *e, mc_buffer_t *b)
{
    int rc = tp_register(e, b);

    if (rc)
        return rc;
    pthread_rwlock_wrlock(&e->mem.lock);
    rc = memtab_insert(&e->mem, b);
    if (!rc)
        tp_changed(e);
    pthread_rwlock_unlock(&e->mem.lock);
    if (rc) {
        tp_deregister(e, b);
        return rc;
    }
    mc__publish_kick(e);
    return 0;
}

static int mem_register(mc_engine_t *e, void *addr, size_t len, const char *location, int memfd,
                        bool internal)
{
    mc_buffer_t *b;
    int rc;

    if (!e || !addr || !location)
        return mc__set_error(-EINVAL, "mc_mem_register: NULL argument");
    if (len == 0)
        return mc__set_error(-EINVAL, "mc_mem_register: zero length at %p", addr);
    if ((uint64_t)(uintptr_t)addr + len < (uint64_t)(uintptr_t)addr ||
        (uint64_t)(uintptr_t)addr + len > MC_OPAQUE_BASE)
        return mc__set_error(-EINVAL, "mc_mem_register: %p+%zu is no user-space memory", addr, len);
    b = calloc(1, sizeof(*b));
    if (!b)
        return mc__set_error(-ENOMEM, "out of memory");
    b->addr = (uint64_t)(uintptr_t)addr;
    b->len = len;
    b->memfd = memfd;
    b->regs = 1;
    b->internal = internal;
    b->serial = atomic_fetch_add(&e->mem.serials, 1) + 1;
    rc = location_resolve(addr, location, b->location);
    if (!rc && memfd < 0 && mem_register_again(e, b->addr, len, b->location)) {
        free(b);
        return 0;
    }
    b->vram = !strncmp(b->location, "cuda:", 5);
    b->read_only = !rc && !b->vram && memfd < 0 && !internal && mc__maps_read_only(b->addr, len);
    if (b->read_only)
        mc_info("%p+%zu is mapped without write permission: peers may only read it", addr, len);
    if (!rc)
        rc = mem_insert(e, b);
    if (rc)
        free(b);
    return rc;
}

int mc_mem_register(mc_engine_t *e, void *addr, size_t len, const char *location)
{
    return mem_register(e, addr, len, location, -1, false);
}

int mc__mem_register_internal(mc_engine_t *e, void *addr, size_t len)
{
    return mem_register(e, addr, len, "*", -1, true);
}

/* A fresh range of the opaque address space for len bytes: 1 MiB-aligned (so that the low bits
 * of an address are those of the offset in the buffer), never given twice. Caller holds
 * t->lock for writing. */
static int opaque_range(mc_memtab_t *t, uint64_t len, uint64_t *addr_p)
{
    const uint64_t align = 1ull << 20;

    if (len > MC_OPAQUE_END - t->opaque_next - align)
        return mc__set_error(-ENOSPC, "no opaque address range left for %llu bytes",
                             (unsigned long long)len);
    *addr_p = t->opaque_next;
    t->opaque_next += (len + align - 1) & ~(align - 1);
    return 0;
}

int mc__mem_register_opaque(mc_engine_t *e, unsigned slot, uint64_t len, const char *location,
                            void *priv, uint64_t *addr_p)
{
    const mc_transport_ops_t *ops = mc__transports[slot];
    mc_buffer_t tmp = {.owner = (uint8_t)(slot + 1)}, *b = calloc(1, sizeof(*b));
    int rc;

    if (!b) { /* the owner's state for it is released all the same */
        tmp.tp[slot] = priv;
        b = &tmp;
        rc = mc__set_error(-ENOMEM, "out of memory");
        goto err_dereg;
    }
    b->len = len;
    b->memfd = -1;
    b->regs = 1;
    b->owner = (uint8_t)(slot + 1);
    b->tp[slot] = priv;
    snprintf(b->location, sizeof(b->location), "%s", location);
    rc = MC_TP_HAS(ops, mem_register) ? ops->mem_register(e, b) : 0;
    if (rc)
        goto err_dereg;
    pthread_rwlock_wrlock(&e->mem.lock);
    rc = opaque_range(&e->mem, len, &b->addr);
    if (!rc)
        rc = memtab_insert(&e->mem, b);
    if (!rc)
        tp_changed(e);
    pthread_rwlock_unlock(&e->mem.lock);
    if (rc)
        goto err_dereg;
    mc__publish_kick(e);
    *addr_p = b->addr;
    return 0;

err_dereg:
    if (MC_TP_HAS(ops, mem_deregister))
        ops->mem_deregister(e, b);
    if (b != &tmp)
        free(b);
    return rc;
}

/* The index in v (the memory or the opaque table, by addr) of the latest buffer starting at
 * addr that is (allocated) or is not an mc_mem_alloc allocation, of length len unless len is 0,
 * or -1. Caller holds t->lock. */
static ssize_t memtab_start(const mc_memtab_t *t, uint64_t addr, uint64_t len, bool allocated)
{
    bool opaque = addr >= MC_OPAQUE_BASE;
    mc_buffer_t *const *v = opaque ? t->ov : t->v;

    for (ssize_t i = vec_floor(v, opaque ? t->on : t->n, addr); i >= 0 && v[i]->addr == addr; i--)
        if ((v[i]->memfd >= 0) == allocated && (!len || v[i]->len == len))
            return i;
    return -1;
}

/* Drop one registration of the buffer starting at addr (of length len, unless 0) that is
 * (allocated) or is not an mc_mem_alloc allocation: the latest one, when several start there.
 * The buffer if that was its last (out of the table), NULL if none; *again_p is set when
 * registrations remain. */
static mc_buffer_t *memtab_remove(mc_engine_t *e, uint64_t addr, uint64_t len, bool allocated,
                                  bool *again_p)
{
    mc_memtab_t *t = &e->mem;
    bool opaque = addr >= MC_OPAQUE_BASE;
    mc_buffer_t *b = NULL;
    ssize_t i;

    *again_p = false;
    pthread_rwlock_wrlock(&t->lock);
    mc_buffer_t **v = opaque ? t->ov : t->v;
    size_t *n = opaque ? &t->on : &t->n;
    i = memtab_start(t, addr, len, allocated);
    if (i >= 0 && v[i]->regs > 1) {
        v[i]->regs--;
        *again_p = true;
    } else if (i >= 0) {
        b = v[i];
        memmove(&v[i], &v[i + 1], (*n - (size_t)i - 1) * sizeof(*v));
        (*n)--;
        atomic_store(&b->dead_ns, mc__now_ns());
        atomic_fetch_add(&t->dying, 1);
        tp_changed(e);
    }
    pthread_rwlock_unlock(&t->lock);
    return b;
}

/* A buffer of mem.dead (its unregister timed out) starting at addr, of length len unless 0, that
 * is (allocated) or is not an mc_mem_alloc allocation, and that no call waits for: claimed for
 * another wait (mem_settle); NULL if none (*busy_p: some other call waits for one). */
static mc_buffer_t *dead_claim(mc_engine_t *e, uint64_t addr, uint64_t len, bool allocated,
                               bool *busy_p)
{
    mc_memtab_t *t = &e->mem;
    mc_buffer_t *b;

    *busy_p = false;
    pthread_rwlock_wrlock(&t->lock);
    for (b = t->dead; b; b = b->next_dead) {
        if (b->addr != addr || (len && b->len != len) || (b->memfd >= 0) != allocated)
            continue;
        if (!b->waited)
            break;
        *busy_p = true;
    }
    if (b) {
        b->waited = true;
        atomic_fetch_add(&t->dying, 1);
    }
    pthread_rwlock_unlock(&t->lock);
    return b;
}

bool mc__mem_wait(mc_engine_t *e, bool (*done)(mc_engine_t *, void *), void *arg,
                  uint64_t deadline_ns)
{
    bool ok = true;

    while (!done(e, arg)) {
        if (mc__now_ns() > deadline_ns) {
            ok = false;
            break;
        }
        if (!e->has_thread) { /* caller-progress mode: nobody else drives progress */
            /* With MC_PROGRESS_IMPLICIT=0 the bytes move but the host's callbacks wait for
             * its next mc_engine_progress (the event fd says so). */
            int moved = e->implicit_progress ? mc__progress_try(e) : mc__progress_quiet(e);
            if (!moved && mc__progress_may_sleep(e)) {
                struct pollfd pfd = {.fd = e->epfd, .events = POLLIN};
                poll(&pfd, 1, 1);
            }
            continue;
        }
        struct timespec ts;
        mc__abstime_in(&ts, 10);
        pthread_mutex_lock(&e->mem.drain_lock);
        if (!done(e, arg))
            pthread_cond_timedwait(&e->mem.drain_cond, &e->mem.drain_lock, &ts);
        pthread_mutex_unlock(&e->mem.drain_lock);
    }
    if (!e->has_thread && !e->implicit_progress)
        mc__doorbell(e); /* callbacks of quiet passes wait for the host's progress: wake it */
    return ok;
}

static bool refs_drained(mc_engine_t *e, void *arg)
{
    mc_buffer_t *b = arg;

    (void)e;
    return atomic_load(&b->refs) == 0;
}

/* Wait until nothing in flight references b, ours first, then whatever peers can still reach
 * through the transports (same-host mappings and copies). */
static int mem_drain(mc_engine_t *e, mc_buffer_t *b)
{
    /* (2 s past the transfer timeout: a peer that still holds b then is cut by its transport) */
    uint64_t deadline = mc__now_ns() + (uint64_t)e->cfg.transfer_timeout_ms * MC_MS + 2000 * MC_MS;

    if (!mc__mem_wait(e, refs_drained, b, deadline))
        return mc__set_error(-MC_ETIMEOUT, "unregister 0x%llx: %u requests still in flight",
                             (unsigned long long)b->addr, atomic_load(&b->refs));
    for (unsigned i = 0; i < mc__n_transports; i++)
        if (tp_sees(e, i, b) && MC_TP_HAS(mc__transports[i], mem_release)) {
            int rc = mc__transports[i]->mem_release(e, b);
            if (rc)
                return rc;
        }
    return 0;
}

/* Wait until b, out of the table, drains: 0 with b out of mem.dead (the caller frees it), or
 * -MC_ETIMEOUT with b in mem.dead, where a later unregister of its range waits again. */
static int mem_settle(mc_engine_t *e, mc_buffer_t *b)
{
    mc_memtab_t *t = &e->mem;
    int rc = mem_drain(e, b);

    pthread_rwlock_wrlock(&t->lock);
    if (!rc && b->in_dead) {
        mc_buffer_t **pp = &t->dead;
        while (*pp != b)
            pp = &(*pp)->next_dead;
        *pp = b->next_dead;
    } else if (rc && !b->in_dead) {
        b->next_dead = t->dead;
        t->dead = b;
    }
    b->in_dead = rc != 0;
    b->waited = false;
    pthread_rwlock_unlock(&t->lock);
    atomic_fetch_sub(&t->dying, 1);
    return rc;
}

static int mem_unregister(mc_engine_t *e, void *addr, uint64_t len, bool allocated, int *memfd_p,
                          uint64_t *len_p)
{
    uint64_t a = (uint64_t)(uintptr_t)addr;
    mc_buffer_t *b;
    bool again, busy;
    int rc;

    if (!e)
        return mc__set_error(-EINVAL, "mc_mem_unregister: NULL engine");
    if (mc__in_progress())
        return mc__set_error(-EDEADLK, "memory cannot be unregistered from a callback");
    b = memtab_remove(e, a, len, allocated, &again);
    if (again) {
        *memfd_p = -1; /* still registered by another caller */
        *len_p = 0;
        return 0;
    }
    if (b)
        mc__publish_kick(e);
    else if (!(b = dead_claim(e, a, len, allocated, &busy)))
        return busy ? mc__set_error(-EBUSY, "unregister 0x%llx: another call waits for it",
                                    (unsigned long long)a)
                    : -ENOENT;
    if ((rc = mem_settle(e, b)))
        return rc;
    *memfd_p = b->memfd;
    *len_p = len = b->len;
    /* Remote peers' NICs can no longer reach it once the regions are gone. */
    tp_deregister(e, b);
    free(b);
    /* An earlier registration of the range whose unregister timed out: the range is free only
     * once that one drained too. */
    while ((b = dead_claim(e, a, len, allocated, &busy))) {
        if ((rc = mem_settle(e, b)))
            return rc;
        buffer_free(e, b);
    }
    return busy ? mc__set_error(-EBUSY,
                                "unregister 0x%llx: another call waits for an earlier "
                                "registration of it",
                                (unsigned long long)a)
                : 0;
}

int mc_mem_unregister_range(mc_engine_t *e, void *addr, size_t len)
{
    int memfd;
    uint64_t freed;
    int rc = mem_unregister(e, addr, len, false, &memfd, &freed);

    if (rc != -ENOENT)
        return rc;
    pthread_rwlock_rdlock(&e->mem.lock);
    bool allocated = memtab_start(&e->mem, (uint64_t)(uintptr_t)addr, 0, true) >= 0;
    pthread_rwlock_unlock(&e->mem.lock);
    if (allocated)
        return mc__set_error(-EINVAL, "%p comes from mc_mem_alloc: free it with mc_mem_free", addr);
    if (len)
        return mc__set_error(-ENOENT, "mc_mem_unregister_range: no buffer %p+%zu", addr, len);
    return mc__set_error(-ENOENT, "mc_mem_unregister: no buffer starts at %p", addr);
}

int mc_mem_unregister(mc_engine_t *e, void *addr)
{
    return mc_mem_unregister_range(e, addr, 0);
}

int mc_mem_alloc(mc_engine_t *e, size_t len, const char *location, void **addr_p)
{
    char where[MC_LOCATION_MAX];
    int kind = 0, node = -1, fd, rc;
    void *p;

    if (!e || !len || !location || !addr_p)
        return mc__set_error(-EINVAL, "mc_mem_alloc: invalid argument");
    if (strcmp(location, "*")) {
        rc = location_parse(location, &kind, &node);
        if (rc)
            return rc;
        if (kind != 0)
            return mc__set_error(-EINVAL, "mc_mem_alloc: %s: only cpu:N or * is supported",
                                 location);
    }
    fd = mc__memfd_fixed("mooncake", len); /* (same-host peers map it) */
    if (fd < 0)
        return mc__set_error(fd, "a memfd of %zu bytes: %s", len, strerror(-fd));
    p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        rc = mc__set_error(-errno, "mmap %zu bytes: %s", len, strerror(errno));
        goto err_close;
    }
    if (node >= 0) {
        unsigned long mask = 1ul << node;
        if (node >= (int)(8 * sizeof(mask)) ||
            mbind(p, len, MPOL_BIND, &mask, 8 * sizeof(mask), 0) < 0) {
            rc = mc__set_error(node >= 64 ? -EINVAL : -errno, "mc_mem_alloc: cannot place on %s",
                               location);
            goto err_unmap;
        }
    }
    /* Back every page now, on the chosen node: the first transfer into fresh shared memory
     * would otherwise pay a page fault per 4 KiB. */
    if (madvise(p, len, MADV_POPULATE_WRITE) < 0) {
        for (size_t off = 0; off < len; off += 4096)
            ((volatile char *)p)[off] = 0;
    }
    snprintf(where, sizeof(where), node >= 0 ? "cpu:%d" : "*", node);
    rc = mem_register(e, p, len, where, fd, false);
    if (rc)
        goto err_unmap;
    *addr_p = p;
    return 0;

err_unmap:
    munmap(p, len);
err_close:
    close(fd);
    return rc;
}

void mc_mem_free(mc_engine_t *e, void *addr)
{
    int memfd = -1;
    uint64_t len = 0;

    if (!addr)
        return;
    int rc = mem_unregister(e, addr, 0, true, &memfd, &len);
    if (rc == 0) {
        munmap(addr, len);
        close(memfd);
    } else {
        mc_error("mc_mem_free(%p): %s", addr,
                 rc == -ENOENT ? "no mc_mem_alloc allocation starts there" : mc_last_error());
    }
}
