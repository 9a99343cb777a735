/*
 * The owner's registration table, shared with same-host peers (shm transport, CMA path).
 *
 * CMA (process_vm_readv/writev) reaches any memory of the owner, so a peer must check every
 * range against what the owner has registered *now*, without a round trip: the owner keeps its
 * registrations in this memfd-backed table (seqlock), and each peer gets a slot of lanes, each
 * lane's counter odd while a CMA call of that peer is in flight on it (one call per lane at a
 * time: a peer moves a long run of requests on several lanes at once). A peer makes its lane
 * odd, then checks the table; the owner removes an entry, then waits until every odd lane has
 * moved on. With sequentially consistent operations on both sides, either the peer sees the
 * removal (and does not copy) or the owner sees the odd lane (and waits): after unregister
 * returns, no CMA of any peer touches the buffer. The owner says in SHM_REGTAB_OK how many
 * lanes it watches (an owner that says none watches lane 0 only).
 */
#ifndef MC_SHM_INT_H
#define MC_SHM_INT_H

#include "../../msg_ring.h"
#include "../../util/crew.h"
#include "../transport.h"

#define MC_REGTAB_ENTRIES 4096
#define MC_REGTAB_SLOTS   256
#define MC_REGTAB_LANES   8 /* a slot's lanes fill one cache line */

typedef struct mc_regtab {
    _Atomic uint64_t seq; /* odd while the owner rewrites the entries */
    _Atomic uint32_t n;   /* entries in use; overflow: more registrations than fit */
    _Atomic uint32_t overflow;
    struct {
        _Atomic uint64_t addr, len;
    } ent[MC_REGTAB_ENTRIES]; /* sorted by addr */
    struct {
        _Atomic uint64_t lane[MC_REGTAB_LANES]; /* odd: a CMA call on it is in flight */
    } slot[MC_REGTAB_SLOTS];
} mc_regtab_t;

extern unsigned mc__shm_slot;

/* What goes over the unix sockets (SOCK_SEQPACKET: one message per send). */
enum {
    SHM_HELLO = 1,
    SHM_MAP,
    SHM_MAP_OK,
    SHM_MAP_ERR,
    SHM_REVOKE, /* addr, len = the buffer's serial */
    SHM_REVOKE_ACK,
    SHM_REGTAB,    /* request: the registration table and a slot in it */
    SHM_REGTAB_OK, /* arg = slot, len = lanes watched; the table's memfd attached */
    SHM_RING,      /* message channel: the sender's ring, its memfd attached */
    SHM_KICK,      /* message channel, either way: look at the ring */
    SHM_GRANT,     /* event connection, request: is the buffer at addr, registration len (its
                      serial), still registered (CUDA IPC)? */
    SHM_GRANT_OK,  /* its answers, with addr and len */
    SHM_GRANT_NO,
};
enum { ROLE_REQUEST = 1, ROLE_EVENT = 2, ROLE_MSG = 3 };

typedef struct shm_msg {
    uint32_t type, arg; /* arg: role for HELLO */
    uint64_t addr, len;
    uint64_t instance; /* HELLO: the sender's engine; a request: its id, which the answer echoes */
} shm_msg_t;

/* One message on fd (without blocking), with a descriptor attached if pass_fd >= 0. */
int mc__shm_send(int fd, const shm_msg_t *m, int pass_fd);
/* Connect to the owner socket called name as role (HELLO sent); the fd or a negative errno.
 * wait_ms: how long a full accept queue is waited for (-EAGAIN then); 0: not at all, and the
 * socket is non-blocking. */
int mc__shm_connect(const char *name, uint32_t role, uint64_t instance, unsigned wait_ms);

/* Messages to one peer through a ring in shared memory (shm_msg.c). */
typedef struct shm_ring shm_ring_t;
typedef struct shm_tx {
    mc_pollable_t chan; /* the channel socket: kicks, and the receiver's end */
    int state;          /* TX_NONE, TX_UP, TX_OFF */
    shm_ring_t *ring;
    uint64_t head;        /* bytes written */
    mc_ring_fifo_t fifo;  /* records not answered yet */
    mc_list_t busy_link;  /* in shm_engine_t.tx_busy while fifo.n */
    uint64_t tail;        /* the receiver's tail as last read: answered up to there (shm_msg.c) */
    uint64_t wait_end;    /* head after the last record whose sender waits for its answer */
    uint64_t polled_ns;   /* the pass that last read the tail */
    bool due;             /* read it at the next pass: the ring or fifo is full, or idle */
    bool sleeper;         /* our wake word is marked, and its membarrier ran (shm_wake.h) */
    mc_list_t slept_link; /* in shm_engine_t.tx_slept while its word is marked */
    mc_peer_t *peer;
} shm_tx_t;
/* The receiving end of one ring, on an accepted message connection. */
typedef struct shm_rx shm_rx_t;

/* e->tp[mc__shm_slot] */
typedef struct shm_engine {
    char name[MC_NAME_MAX]; /* our abstract unix socket */
    mc_pollable_t listen;
    mc_list_t conns, grave;       /* owner side: accepted connections, progress-owned */
    mc_list_t peers_grave;        /* initiator side: closed peers, freed at the end of a pass */
    pthread_mutex_t revoke_mutex; /* one unregister revocation at a time */
    uint64_t revoke_addr, revoke_serial;
    unsigned n_owed;         /* initiator side: REVOKE_ACKs we owe, waiting for copies (progress) */
    unsigned n_redial;       /* and peers whose event socket is to be connected again */
    atomic_uint revoke_left; /* REVOKE_ACKs still expected */
    atomic_bool revoke_req, revoke_abort;
    mc_regtab_t *regtab; /* our registrations, shared with same-host peers (CMA) */
    int regtab_fd;
    bool regtab_used[MC_REGTAB_SLOTS]; /* peer slots in regtab, progress-owned */
    /* the process each slot was last handed to: a dead one's odd lane is not waited for */
    _Atomic pid_t regtab_pid[MC_REGTAB_SLOTS];
    bool regtab_withdrawn;     /* the engine is going: regtab stays empty */
    mc_list_t rx_rings;        /* rings we receive from (shm_rx_t) */
    mc_list_t rx_lent;         /* detached rings whose records are still lent */
    mc_list_t tx_busy;         /* shm_tx_t with records not consumed yet */
    mc_list_t tx_slept;        /* shm_tx_t whose wake word we marked */
    bool slept;                /* an idle op since the last timer tick */
    uint64_t settle_ns;        /* after a membarrier: awake until then (shm_wake.h) */
    uint64_t writes;           /* times a tx ring was written (rx_poll's pacing) */
    bool mb;                   /* MC_SHM_MEMBARRIER, and this process registered (shm_wake.h) */
    unsigned cma_helpers;      /* MC_SHM_CMA_THREADS, resolved */
    pthread_mutex_t crew_lock; /* the helpers start with the first long CMA run */
    bool crew_tried;
    mc_crew_t *crew; /* NULL: none (off, not needed yet, or they could not start) */
} shm_engine_t;

static inline shm_engine_t *shm_of(mc_engine_t *e)
{
    return e->tp[mc__shm_slot];
}

/* A buffer of an owner's that we mapped. */
typedef struct shm_map {
    uint64_t raddr, len;
    uint8_t *local;
} shm_map_t;

/* Initiator side: what we hold of one owner (p->tp[mc__shm_slot]), connected on first use. */
typedef struct shm_peer {
    mc_peer_t *peer;
    pthread_mutex_t open_lock; /* the first submit connects; others wait */
    atomic_int state;          /* SP_NEW, SP_OPENING, SP_OPEN, SP_DEAD */
    char addr[MC_NAME_MAX];    /* the owner's socket name */
    pthread_mutex_t req_lock;  /* one MAP request at a time on req_fd */
    int req_fd;
    uint64_t req_id;           /* of the last request on req_fd (an answer to another is late) */
    mc_pollable_t regtab_wait; /* SP_OPENING: req_fd in the progress loop, for the table's answer */
    mc_pollable_t ev;          /* event socket, in the progress loop */
    mc_pollable_t exit;        /* its pidfd, in the progress loop: the owner's death */
    atomic_bool exit_watched;  /* set by the connecting thread, cleared by progress */
    int pidfd;
    pthread_rwlock_t lock; /* read: copies; write: mapping changes */
    shm_map_t *maps;
    size_t n, cap;
    /* Bumped under lock (write) by every revocation and unmap of all: a mapping asked for
     * before a bump may be of a buffer that one revoked before the mapping was in (map_buffer). */
    _Atomic uint64_t revokes;
    mc_list_t link;      /* in peers_grave once closed */
    mc_regtab_t *regtab; /* the owner's registrations, for CMA; NULL: no CMA */
    int slot;
    unsigned lanes;                            /* of the slot that the owner watches */
    pthread_mutex_t cma_lock[MC_REGTAB_LANES]; /* one CMA call at a time per lane */
    int pid;
    atomic_bool cma_off; /* CMA refused (EPERM): said once, other transports from then on */
    shm_tx_t tx;         /* messages to it (shm_msg.c), progress-owned */
    bool owes; /* a REVOKE_ACK for owed_addr, once no copy uses it (progress; the owner revokes
                  one buffer at a time) */
    uint64_t owed_addr, owed_serial;
    uint64_t redial_ns; /* SP_DEAD, the owner having cut the event socket: connect it again then */
    unsigned cuts;      /* how often the owner did (the wait doubles with each) */
    bool rejoining;     /* connected again, waiting for the owner's first answer (progress) */
    uint64_t up_ns;     /* when the event socket last came back */
} shm_peer_t;

/* SP_OPENING: connected from progress, which may not wait for the owner; the registration
 * table's answer, taken by progress, opens it. Meanwhile tasks go over other transports. */
enum { SP_NEW, SP_OPENING, SP_OPEN, SP_DEAD };

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
bool mc__shm_regtab_grace(mc_engine_t *e, uint64_t deadline_ns);
/* Engine destroy: nothing of ours in the table any more, and no CMA that saw it still running;
 * false when one still ran at MC_IO_TIMEOUT_MS. */
bool mc__shm_regtab_withdraw(mc_engine_t *e);

/* Initiator side (shm.c): a task moved; CMA (shm_cma.c): move the run of CMA tasks from
 * tasks[i] (below n), shared out to the helpers when it is long; the end of what it took care
 * of (moved, failed or sent to another transport), i when nothing could go. */
void mc__shm_task_done(mc_engine_t *e, mc_task_t *d);
size_t mc__shm_cma(mc_engine_t *e, shm_peer_t *s, mc_task_t *tasks, size_t i, size_t n);

/* Peer side: whether [addr, addr+len) is inside one registered buffer of the table now; false
 * as well when the owner does not finish rewriting the table within a few ms (it may have died
 * mid-way). */
bool mc__shm_regtab_covers(const mc_regtab_t *t, uint64_t addr, uint64_t len);

/* shm_msg.c. Sender: msg_open, fill and idle are the transport ops; tx_close when its peer goes.
 * Receiver: rx_attach a ring that arrived on message connection fd (NULL: refused), rx_detach
 * when the connection goes. progress: every pass, both sides. */
bool mc__shm_msg_open(mc_engine_t *e, mc_peer_t *p);
/* shm.c: p's message sender and the owner's socket name (NULL: shm does not reach p). */
shm_tx_t *mc__shm_peer_tx(mc_peer_t *p);
const char *mc__shm_peer_addr(mc_peer_t *p);
void mc__shm_msg_fill(mc_engine_t *e, mc_peer_t *p);
bool mc__shm_msg_idle(mc_engine_t *e);
void mc__shm_msg_timers(mc_engine_t *e);
unsigned mc__shm_msg_sleepers(mc_engine_t *e);
void mc__shm_msg_progress(mc_engine_t *e);
bool mc__shm_msg_express(mc_engine_t *e);
void mc__shm_msg_settle(mc_engine_t *e, mc_peer_t *p);
void mc__shm_tx_init(shm_tx_t *tx, mc_peer_t *p);
void mc__shm_tx_close(mc_engine_t *e, shm_tx_t *tx);
shm_rx_t *mc__shm_rx_attach(mc_engine_t *e, int fd, int ring_fd);
void mc__shm_rx_detach(mc_engine_t *e, shm_rx_t *rx);
/* After the pass's handlers ran: the rings get back the records they lent them. */
void mc__shm_msg_give(mc_engine_t *e);
bool mc__shm_msg_lending(mc_engine_t *e, uint64_t stream);
/* Free the detached rings whose records are all given back (all: every one; the transport
 * goes, after the held callbacks were dropped). */
void mc__shm_rx_lent_free(mc_engine_t *e, bool all);

/* shm_desc.c: its part of descriptors (our socket name; which buffers may be mapped) */
extern const mc_desc_codec_t mc__shm_codec;

#endif
