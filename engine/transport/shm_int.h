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

#include "../engine_int.h"

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

/* Owner side (shm_regtab.c). */
int mc__regtab_create(mc_engine_t *e);
void mc__regtab_destroy(mc_engine_t *e);
int mc__regtab_slot_get(mc_engine_t *e);
void mc__regtab_slot_put(mc_engine_t *e, int slot);

/* Peer side: whether [addr, addr+len) is inside one registered buffer of the table now. */
bool mc__regtab_covers(const mc_regtab_t *t, uint64_t addr, uint64_t len);

#endif
