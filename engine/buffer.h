/*
 * Registered memory (internal): the table every request is checked against.
 *
 * Buffers are sorted by address and may overlap: two layers of a host may register the same
 * pages (a registration cache over a pool). Registering exactly the same range again counts
 * one more registration of the buffer; unregister drops one, and the last removes it. Readers
 * (submit, the target side of every transport) take mem.lock for reading; registration
 * changes take it for writing. A buffer in use by a request in flight holds a reference;
 * unregister removes it from the table at once (new requests are refused), then waits for the
 * references to drain.
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
    int memfd;           /* >= 0 for mc_mem_alloc() memory: same-host peers may map it */
    bool vram;           /* CUDA device memory */
    unsigned regs;       /* registrations of exactly this range (mem.lock) */
    atomic_uint refs;    /* requests in flight that touch this buffer */
    atomic_bool dead;    /* unregistered: waiting for refs to drain */
    void *tp[MC_TP_MAX]; /* each transport's registration (memory regions, handles), or NULL */
};

typedef struct mc_memtab {
    pthread_rwlock_t lock;
    mc_buffer_t **v; /* sorted by addr (equal ones in registration order); may overlap */
    size_t n, cap;
    uint64_t max_len; /* the longest buffer ever registered: how far back a lookup looks */
    pthread_mutex_t drain_lock; /* with drain_cond: unregister waits (mc__mem_wait) */
    pthread_cond_t drain_cond;
} mc_memtab_t;

int mc__memtab_init(mc_memtab_t *t);
void mc__memtab_fini(mc_engine_t *e);

/* Find the buffer holding [addr, addr+len) and take a reference; NULL if none. The _locked
 * form is for callers that hold e->mem.lock already (for a batch of lookups). */
mc_buffer_t *mc__mem_get(mc_engine_t *e, uint64_t addr, uint64_t len);
mc_buffer_t *mc__mem_get_locked(mc_engine_t *e, uint64_t addr, uint64_t len);
void mc__mem_put(mc_engine_t *e, mc_buffer_t *b);

/* Wait in an unregistering thread until done(e, arg) or the deadline; false on timeout. Drives
 * progress itself in caller-progress mode; otherwise sleeps until mc__mem_wake(). */
bool mc__mem_wait(mc_engine_t *e, bool (*done)(mc_engine_t *, void *), void *arg,
                  uint64_t deadline_ns);
/* Wake mc__mem_wait sleepers (a reference dropped, a peer acknowledged). */
void mc__mem_wake(mc_engine_t *e);

#endif
