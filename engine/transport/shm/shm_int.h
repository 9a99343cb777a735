/*
 * The owner's registration table, shared with same-host peers (shm transport, CMA path).
 *
 * CMA (process_vm_readv/writev) reaches any memory of the owner, so a peer must check every
 * range against what the owner has registered *now*, without a round trip: the owner keeps its
 * registrations in this memfd-backed table (seqlock), and each peer gets a slot whose counter
 * is odd while one of its CMA calls is in flight. A peer makes its slot odd, then checks the
 * table; the owner removes an entry, then waits until every odd slot has moved on. With
 * sequentially consistent operations on both sides, either the peer sees the removal (and
 * does not copy) or the owner sees the odd slot (and waits): after unregister returns, no CMA
 * of any peer touches the buffer.
 */
#ifndef MC_SHM_INT_H
#define MC_SHM_INT_H

#include "../transport.h"

#define MC_REGTAB_ENTRIES 4096
#define MC_REGTAB_SLOTS   256

typedef struct mc_regtab {
    _Atomic uint64_t seq; /* odd while the owner rewrites the entries */
    _Atomic uint32_t n;   /* entries in use; overflow: more registrations than fit */
    _Atomic uint32_t overflow;
    struct {
        _Atomic uint64_t addr, len;
    } ent[MC_REGTAB_ENTRIES]; /* sorted by addr */
    struct {
        _Atomic uint64_t active; /* odd: a CMA call of this peer is in flight */
        char pad[56];
    } slot[MC_REGTAB_SLOTS];
} mc_regtab_t;

extern unsigned mc__shm_slot;

/* e->tp[mc__shm_slot] */
typedef struct shm_engine {
    char name[MC_NAME_MAX]; /* our abstract unix socket */
    mc_pollable_t listen;
    mc_list_t conns, grave;       /* owner side: accepted connections, progress-owned */
    mc_list_t peers_grave;        /* initiator side: closed peers, freed at the end of a pass */
    pthread_mutex_t revoke_mutex; /* one unregister revocation at a time */
    uint64_t revoke_addr;
    atomic_uint revoke_left; /* REVOKE_ACKs still expected */
    atomic_bool revoke_req, revoke_abort;
    mc_regtab_t *regtab; /* our registrations, shared with same-host peers (CMA) */
    int regtab_fd;
    bool regtab_used[MC_REGTAB_SLOTS]; /* peer slots in regtab, progress-owned */
} shm_engine_t;

static inline shm_engine_t *shm_of(mc_engine_t *e)
{
    return e->tp[mc__shm_slot];
}

/* What a task routed to shm goes by (mc_task_t.tp_hint). */
enum { SHM_BY_MAP = 1, SHM_BY_CMA = 2 };

/* Owner side (shm_regtab.c). */
int mc__shm_regtab_create(mc_engine_t *e);
void mc__shm_regtab_destroy(mc_engine_t *e);
int mc__shm_regtab_slot_get(mc_engine_t *e);
void mc__shm_regtab_slot_put(mc_engine_t *e, int slot);
/* Mirror the registration table into the shared one (caller holds e->mem.lock for writing). */
void mc__shm_regtab_publish(mc_engine_t *e);
/* After a registration was removed: wait for same-host peers' CMA calls that may still use it. */
void mc__shm_regtab_grace(mc_engine_t *e, uint64_t deadline_ns);

/* Peer side: whether [addr, addr+len) is inside one registered buffer of the table now. */
bool mc__shm_regtab_covers(const mc_regtab_t *t, uint64_t addr, uint64_t len);

/* shm_desc.c: its part of descriptors (our socket name; which buffers may be mapped) */
extern const mc_desc_codec_t mc__shm_codec;

#endif
