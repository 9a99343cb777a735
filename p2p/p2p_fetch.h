/*
 * One fetch (mc_p2p_get_replica), internal: its shards, the holders it knows, the shards in
 * flight, and the two threads that keep it in step with the store.
 *
 * Threads: the caller's runs the fetch (p2p_fetch.c): it picks shards and holders
 * (p2p_holders.c), starts and finishes transfers (p2p_slot.c). The watch thread (p2p_watch.c)
 * lists the replica entries and then follows them with a watch from the listed revision, so it
 * misses no holder; the publish thread puts this node's entry as shards are verified, the
 * first at once and the next ones at most every P2P_PUBLISH_MS. Both of them wait on the store
 * and may take seconds when it is down; the fetch goes on meanwhile with the holders it knows.
 * Completion callbacks run in the engine's progress thread and only count and wake.
 */
#ifndef MC_P2P_FETCH_H
#define MC_P2P_FETCH_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "p2p_codec.h"
#include "p2p_int.h"

#define P2P_PUBLISH_MS   50 /* coalescing of replica entry updates */
#define P2P_REPORT_MS    100
#define P2P_MAX_TRIES    16  /* attempts at one shard before the fetch gives up */
#define P2P_HOLDER_FAILS 3   /* failures in a row that make a holder the last choice */
#define P2P_HOLDER_LOST  3   /* times in a row unreachable that make a holder dead */
#define P2P_LOST_REST_MS 250 /* an unreachable holder's first rest, doubled each time after */
#define P2P_ORIGIN_INFLIGHT                                                                        \
    2 /* our shards in flight from the origin, for shards no replica has                           \
       */
#define P2P_CANCEL_GRACE_MS 2000
#define P2P_RECOUNT_MS      50 /* holders per shard are recounted at most this often */

enum { SHARD_MISSING = 0, SHARD_INFLIGHT, SHARD_DONE };

typedef struct p2p_holder {
    char segment[MC_NAME_MAX];
    bool present;           /* its entry is in the store (as last seen) */
    bool withdrawn;         /* its entry went from the store (rm, its unregister): still tried,
                             * last of all, until a read says it no longer serves (a gone holder
                             * fails them: -MC_EACCESS or unreachable) */
    bool origin;            /* the object's origin */
    bool dead;              /* its process is gone or it refused our reads: skipped from now on */
    bool bad;               /* it sent a corrupt shard: skipped from now on */
    unsigned fails;         /* failed or slow shards in a row */
    unsigned lost;          /* times in a row it was unreachable (mc__p2p_holder_lost) */
    uint64_t rest_until_ms; /* unreachable: skipped until then; 0: not resting */
    unsigned inflight;
    uint64_t moved_ms;   /* when a shard of ours in flight from it last gained bytes */
    mc_segment_id_t seg; /* MC_SEGMENT_INVALID until opened */
    p2p_entry_t e;       /* what it serves, and where */
} p2p_holder_t;

typedef struct p2p_fetch p2p_fetch_t;

/* One shard in flight: a batch of READs from one holder. */
typedef struct p2p_slot {
    p2p_fetch_t *f;
    bool busy, canceled;
    uint32_t shard;
    size_t holder;
    mc_batch_t *batch;
    uint64_t started_ms;
    uint64_t moved_bytes, moved_ms; /* its bytes so far, and when they last grew */
    unsigned pending; /* tasks whose callback has not run; protected by f->wake_lock */
    int error;        /* the first task failure; protected by f->wake_lock */
} p2p_slot_t;

struct p2p_fetch {
    mc_p2p_t *p2p;
    p2p_held_t *h;
    p2p_desc_t d;
    mc_p2p_get_opts_t o;
    mc_p2p_progress_t prog;
    uint64_t rng;
    uint64_t started_ms, stalled_ms, reported_ms, bytes_started;
    int last_error;  /* of the latest failed attempt, for the final verdict */
    int local_error; /* a shard refused at submit for our own range: the fetch ends with it */

    /* Shards, the caller's thread only. */
    uint8_t *state;
    uint8_t *tries;
    uint32_t *perm;       /* a random order of the shards: ties are broken by it */
    uint32_t *avail;      /* usable holders of each shard */
    uint64_t avail_gen;   /* holders_gen avail was counted at */
    uint64_t avail_ms;    /* and when */
    size_t *last_holder;  /* the holder of the shard's latest failure (SIZE_MAX: none) */
    uint32_t random_next; /* MC_P2P_RANDOM: where the scan of perm resumes */

    pthread_mutex_t lock; /* protects what follows, up to the slots */
    p2p_holder_t *holders;
    size_t n_holders, cap_holders;
    uint64_t holders_gen; /* bumped whenever a holder's usability or shards change */
    uint8_t *have;        /* shards verified here: what our entry says */
    bool pub_dirty, stop;
    bool meta_down;    /* the latest call of the watch or publish thread got no answer */
    int pub_error;     /* the store refused the replica entry for good (publish thread), */
    char pub_why[256]; /* and why: the fetch fails, as this node can be no holder */
    pthread_cond_t pub_cond;
    char replica_prefix[P2P_KEY_MAX];

    pthread_mutex_t wake_lock; /* completions and holder changes wake the caller's thread */
    pthread_cond_t wake_cond;
    unsigned wakes;

    p2p_slot_t *slots;
    unsigned n_slots, busy_slots;

    pthread_t watch_tid, pub_tid;
    bool has_watch, has_pub;
};

/* p2p_holders.c */
bool mc__p2p_holder_usable(const p2p_fetch_t *f, const p2p_holder_t *h);
/* Pick the next shard to start and its holder; false if none can start now. Under f->lock. */
bool mc__p2p_pick(p2p_fetch_t *f, uint32_t *shard_p, size_t *holder_p);
/* Replace the holder table by a listing / apply one event. Under f->lock. */
void mc__p2p_holders_listed(p2p_fetch_t *f, const mc_meta_kv_t *kvs, size_t n);
void mc__p2p_holders_event(p2p_fetch_t *f, const mc_meta_event_t *ev);
void mc__p2p_holders_free(p2p_fetch_t *f);
/* Why the missing shards cannot start: -EILSEQ (only corrupt holders), -MC_EPEERDEAD. */
int mc__p2p_stall_reason(p2p_fetch_t *f, uint32_t *shard_p);
/* Holder h could not be reached (err): it rests, or is dead once that happened
 * P2P_HOLDER_LOST times in a row. Under f->lock. */
void mc__p2p_holder_lost(p2p_fetch_t *f, p2p_holder_t *h, int err);
/* Holders whose rest is over are usable again; whether some holder still rests. Under
 * f->lock. */
bool mc__p2p_holders_rest(p2p_fetch_t *f, uint64_t now);
/* The least loaded usable holder of shard in the best class, ties at random; the holder that
 * failed it last only if there is no other. False: none. Under f->lock. */
bool mc__p2p_choose_holder(p2p_fetch_t *f, uint32_t shard, size_t *holder_p);

/* p2p_slot.c */
/* Start shard from holder in slot s: -EINVAL or -ENOMEM for our own range or memory (the
 * fetch ends), else an error of the holder's. */
int mc__p2p_slot_start(p2p_fetch_t *f, p2p_slot_t *s, uint32_t shard, size_t holder);
/* A slot whose tasks all ended: verify, count; -errno when the fetch must give up. */
int mc__p2p_slot_finish(p2p_fetch_t *f, p2p_slot_t *s);
/* A slot whose tasks all ended, of a fetch that is over: let go of it, count nothing. */
void mc__p2p_slot_discard(p2p_fetch_t *f, p2p_slot_t *s);
bool mc__p2p_slot_ended(p2p_fetch_t *f, p2p_slot_t *s);
void mc__p2p_wake(p2p_fetch_t *f);

/* p2p_watch.c */
int mc__p2p_threads_start(p2p_fetch_t *f);
void mc__p2p_threads_stop(p2p_fetch_t *f);

static inline uint64_t p2p_rand(p2p_fetch_t *f)
{
    f->rng ^= f->rng << 13; /* xorshift64: tie-breaks, not secrets */
    f->rng ^= f->rng >> 7;
    f->rng ^= f->rng << 17;
    return f->rng;
}

#endif
