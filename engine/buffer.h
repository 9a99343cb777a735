/*
 * Registered memory (internal): the table every request is checked against.
 *
 * Buffers are sorted by address and may overlap: two layers of a host may register the same
 * pages (a registration cache over a pool). Buffers that are not memory of this process (files)
 * are opaque: they belong to one transport (owner), which alone registers, publishes and moves
 * them; their addresses are names from MC_OPAQUE_BASE up, never pointers, and they live in a
 * table of their own, so that whoever walks the memory (shm's mirror of it) never meets one.
 * Registering exactly the same range again counts one more registration of the buffer; unregister
 * drops one, and the last removes it. Readers (submit, the target side of every transport) take
 * mem.lock for reading; registration changes take it for writing. A buffer in use by a request in
 * flight holds a reference; unregister removes it from the table at once (new requests are
 * refused), then waits for the references to drain. One whose wait timed out is kept apart
 * (mem.dead): the host may not free it yet, and unregistering it again waits for it again.
 */
#ifndef MC_BUFFER_H
#define MC_BUFFER_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "fwd.h"

struct mc_buffer {
    uint64_t addr, len;
    char location[MC_LOCATION_MAX];
    int memfd;                /* >= 0 for mc_mem_alloc() memory: same-host peers may map it */
    bool vram;                /* CUDA device memory */
    bool read_only;           /* mapped without write permission: WRITEs into it and READs that
                                 would land in it are refused (memory.c, mem_read_only) */
    uint64_t serial;          /* its registration's number in this engine, from 1: another buffer
                                 registered later at the same address has another */
    unsigned regs;            /* registrations of exactly this range (mem.lock) */
    atomic_uint refs;         /* requests in flight that touch this buffer */
    _Atomic uint64_t dead_ns; /* when it was unregistered (mc__now_ns), 0 while it is not: its
                                 unregister waits for refs to drain, and a peer's request
                                 that still holds it a transfer timeout later is cut */
    void *tp[MC_TP_MAX];      /* each transport's registration (memory regions, handles), or NULL */
    uint8_t owner;            /* 0: memory of this process; else 1 + the slot of the transport that
                                 owns this opaque buffer (see above) */
    bool internal;            /* the engine's own (bounce buffers): published, but not listed to
                                 hosts by mc_segment_buffers */
    struct mc_buffer *next_dead; /* in mem.dead (mem.lock) */
    bool in_dead, waited;        /* in mem.dead; a call waits for it (mem.lock) */
};

typedef struct mc_memtab {
    pthread_rwlock_t lock;
    mc_buffer_t **v; /* sorted by addr (equal ones in registration order); may overlap */
    size_t n, cap;
    uint64_t max_len; /* the longest buffer ever registered: how far back a lookup looks */
    mc_buffer_t **ov; /* opaque buffers, sorted by addr; they never overlap */
    size_t on, ocap;
    uint64_t opaque_next;       /* where the next opaque buffer starts */
    pthread_mutex_t drain_lock; /* with drain_cond: unregister waits (mc__mem_wait) */
    pthread_cond_t drain_cond;
    _Atomic uint64_t serials; /* registrations numbered so far (mc_buffer_t.serial) */
    atomic_uint dying;        /* buffers unregistered whose unregister still waits */
    mc_buffer_t *dead; /* out of the table, their unregister timed out: another waits again */
    bool keep_mapped;  /* set by a transport's stop: a peer may still be writing our memory (its
                          copy outlasted MC_IO_TIMEOUT_MS), so allocations stay mapped (leaked)
                          when the engine goes, never handed back to be reused */
} mc_memtab_t;

int mc__memtab_init(mc_memtab_t *t);
void mc__memtab_fini(mc_engine_t *e);

/* Find the memory buffer holding [addr, addr+len) and take a reference; NULL if none. */
mc_buffer_t *mc__mem_get(mc_engine_t *e, uint64_t addr, uint64_t len);
/* Let go of n references (one: mc__mem_put). */
void mc__mem_put_n(mc_engine_t *e, mc_buffer_t *b, unsigned n);
static inline void mc__mem_put(mc_engine_t *e, mc_buffer_t *b)
{
    mc__mem_put_n(e, b, 1);
}

/* The opaque buffer of transport slot holding [addr, addr+len), referenced; NULL if none. */
mc_buffer_t *mc__mem_get_owned(mc_engine_t *e, unsigned slot, uint64_t addr, uint64_t len);
/* The local end of a request: memory, else an opaque buffer of any owner; NULL if none. No
 * reference is taken: the caller holds e->mem.lock (a batch of lookups takes its references
 * before it lets go). */
mc_buffer_t *mc__mem_find_any_locked(mc_engine_t *e, uint64_t addr, uint64_t len);
/* The registration of [addr, addr+len): of those holding it, one of exactly that range before
 * others, the newest first; NULL if none. Caller holds e->mem.lock. */
mc_buffer_t *mc__mem_find_reg_locked(mc_engine_t *e, uint64_t addr, uint64_t len);

/* Register len bytes that are not memory (a file) as an opaque buffer of transport slot, at a
 * fresh address of the opaque range, with location (its kind, e.g. "file"). priv becomes
 * b->tp[slot], the transport's state for it, from this call on: its mem_deregister releases it
 * when the buffer goes, and also when this call fails. Only that transport's memory ops see the
 * buffer. *addr_p gets its address. Registering thread; mc_mem_unregister removes it as any
 * buffer. */
int mc__mem_register_opaque(mc_engine_t *e, unsigned slot, uint64_t len, const char *location,
                            void *priv, uint64_t *addr_p);
/* mc_mem_register for the engine's own memory (a transport's bounce buffers): internal. It is
 * not engine memory for same-host peers (no mapping: they reach it with CMA, which needs no
 * exchange with us, so also from inside progress). */
int mc__mem_register_internal(mc_engine_t *e, void *addr, size_t len);

/* Whether transport slot deals with b at all: everyone with memory, only its owner with an
 * opaque buffer. */
static inline bool mc__buffer_visible(const mc_buffer_t *b, unsigned slot)
{
    return !b->owner || b->owner == slot + 1;
}

/* Wait in an unregistering thread until done(e, arg) or the deadline; false on timeout. Drives
 * progress itself in caller-progress mode; otherwise sleeps until mc__mem_wake(). */
bool mc__mem_wait(mc_engine_t *e, bool (*done)(mc_engine_t *, void *), void *arg,
                  uint64_t deadline_ns);
/* Wake mc__mem_wait sleepers (a reference dropped, a peer acknowledged). */
void mc__mem_wake(mc_engine_t *e);

#endif
