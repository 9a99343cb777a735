/*
 * Peers and rails (internal).
 *
 * A peer is an open remote segment: its descriptor, the transports that reach it (best first),
 * each transport's private state and rails, and the queues of work waiting for them.
 *
 * A rail is one path to a peer inside one transport (a local interface paired with one of the
 * peer's endpoints, a pair of RDMA devices). The core keeps its health and counters here:
 * repeated failures pause it with a growing back-off, and slices of one task spread over every
 * usable rail the buffer's location prefers (NIC priority matrix).
 *
 * Peers are created under e->peers_lock and destroyed only with e->lock held too. A peer's
 * descriptor and the transports' state for it change in the progress context only, under
 * peers_lock for writing (other threads hand a newer descriptor over: mc__peer_refresh_async);
 * other threads read them under peers_lock, progress without it. The one exception is the
 * buffer list, which grows from any thread when a buffer key is added: it is read under
 * peers_lock everywhere.
 */
#ifndef MC_PEER_H
#define MC_PEER_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "descriptor.h"
#include "fwd.h"
#include "util/list.h"

enum { MC_RAIL_ACTIVE = 0, MC_RAIL_PAUSED = 1 };

struct mc_rail {
    char name[2 * MC_NAME_MAX + 4]; /* "local->remote" */
    char dev[64];                   /* our device on it (interface, RDMA device), or "" */
    char rank_loc[MC_LOCATION_MAX]; /* cache of mc__rail_rank: the last location asked */
    int rank;
    /* Progress-owned. */
    unsigned n_conns; /* connections (or connected queue pairs) now */
    int state;
    unsigned connect_failures; /* consecutive */
    uint64_t next_connect_ns;  /* back-off after a failure */
    uint64_t fail_at[3];       /* recent failures, for pausing */
    uint64_t backoff_ns;       /* current pause length */
    _Atomic uint64_t bytes, slices, errors;
    _Atomic uint64_t rate;        /* bytes/s, moving average over timer ticks */
    uint64_t rate_bytes, rate_ns; /* bytes and time at the last tick */
};

/* The rails of one transport to one peer: pointers into the transport's own per-peer state,
 * set by its peer_update (peers_lock held for writing). A slice's rails_tried bit i is v[i]. */
typedef struct mc_rail_set {
    mc_rail_t *v[MC_MAX_RAILS];
    unsigned n;
} mc_rail_set_t;

enum {
    MC_CNT_READ,
    MC_CNT_WRITTEN,
    MC_CNT_SERVED,
    MC_CNT_REQUESTS,
    MC_CNT_ERRORS,
    MC_CNT_RETRIES,
    MC_CNT_MSGS_SENT,
    MC_CNT_MSGS_RECEIVED,
    MC_CNT_N
};

struct mc_peer {
    mc_segment_id_t id;
    char name[MC_NAME_MAX]; /* while OPENING by address: its "ip:port" */
    int refcnt;             /* protected by e->peers_lock */
    int state;              /* MC_PEER_*: written under peers_lock, by progress */
    char dead_reason[700];  /* why it is DEAD (written with state) */
    mc_desc_t desc;         /* protected by e->peers_lock (reloaded on failure) */
    /* the buffer key added last, while desc.layout is key_newest_layout: its entry is the
       newest, and adding it again changes nothing (peers_lock) */
    uint8_t key_newest[MC_BUFFER_KEY_SIZE];
    uint32_t key_newest_layout;
    bool local_host;          /* same host id as ours */
    bool by_metadata;         /* opened by name through metadata: may be refreshed from it */
    uint8_t order[MC_TP_MAX]; /* transports that reach it, best first (peers_lock) */
    unsigned n_order;
    void *tp[MC_TP_MAX]; /* each transport's private state for this peer */
    mc_rail_set_t rails[MC_TP_MAX];
    atomic_uint busy_tasks;        /* tasks to this peer not yet released */
    atomic_uint ordered_busy;      /* ORDERED tasks routed to an MC_TP_ORDERED transport, not
                                      yet released: later ORDERED ones go there too */
    atomic_uint queued_msgs;       /* queued or unacknowledged: at most MC_MSG_WINDOW together, */
    atomic_uint queued_pass;       /* these taken under e->lock (only its holder writes them); */
    atomic_uint queued_bytes;      /* their payload bytes: at most MC_MSG_WINDOW_BYTES together */
    atomic_uint queued_pass_bytes; /* ... of queued_pass */
    _Atomic uint64_t c[MC_CNT_N];  /* counters (mc_counters_t order), written by progress */
    bool desc_kick;                /* in e->descq (under e->sub_lock) */
    mc_list_t desc_link;
    mc_desc_t *pending_desc; /* newer descriptor from another thread (under e->sub_lock) */

    /* Progress-owned scheduling state. */
    struct {
        mc_list_t pending;            /* tasks with bytes not yet sliced (mc_task_t.qlink) */
        mc_list_t retry;              /* slices to resend first (mc_slice_t.link) */
    } q[MC_TP_MAX];                   /* per transport */
    uint64_t last_done_ns[MC_TP_MAX]; /* when a slice over each transport last completed */
    mc_list_t parked;                 /* tasks waiting for its descriptor (mc_task_t.qlink) */
    bool desc_wanted;                 /* a descriptor is awaited (parked tasks, or OPENING) */
    bool desc_asked;                  /* ... and was asked for over the control link */
    bool lease_lost;                  /* its metadata entry went: it must answer or be dead */
    uint64_t lease_deadline_ns;       /* ... by then */
    uint64_t desc_deadline_ns;
    int reported;            /* the last mc_peer_event_t the host heard (0: none yet) */
    uint64_t unreachable_ns; /* when it became UNREACHABLE (reported): messages to it wait */
    mc_list_t msgq;          /* messages to send, in order (mc_msg_t.link) */
    uint8_t msg_tp;          /* the transport that carries them: the control one, or a faster
                                one once it is up (ops->msg_open) */
    bool msg_hold;           /* a faster one is up: none go on the control link until those it
                                has are answered, then the faster one takes the rest */
    mc_list_t msg_unacked;   /* sent, not acknowledged yet, in order */
    uint64_t msg_stream;     /* our stream of messages to it (random) */
    uint64_t msg_seq;        /* the last sequence number given */
    uint64_t msg_acked;      /* everything up to it is in its queue */
    uint64_t msg_retry_ns;   /* it said -EAGAIN: send again from then on */
    uint64_t msg_taken_ns;   /* the last answer MC__MSG_LATER, or "handled", from it (msg.c) */
    mc_list_t flushes;       /* mc_peer_flush in progress, in order (mc_flush_t.link) */
    mc_list_t active_link;   /* in e->active_peers while it has queued work */
    bool active;
};

/* The open peer with this id, or NULL. Caller holds peers_lock (or is the progress context). */
mc_peer_t *mc__peer_get(mc_engine_t *e, mc_segment_id_t id);
/* Mark a peer as having work; the scheduler visits active peers each pass. Progress context. */
void mc__peer_activate(mc_engine_t *e, mc_peer_t *p);

/* Life (peer.c). create: a new peer from d (taken over; freed on failure); a descriptor with
 * no part of the control transport leaves the transports out until the real one comes. */
int mc__peer_create(mc_engine_t *e, mc_desc_t *d, int state, mc_peer_t **p_p);
/* Add p to the table (or, if one of that name, or of that instance when non-zero, is open by
 * now, take a reference on it and free p); *id_p gets the id. */
int mc__peer_insert(mc_engine_t *e, mc_peer_t *p, uint64_t instance, mc_segment_id_t *id_p);
/* A reference on the open peer of that name (or instance, when non-zero): 1 with *id_p set, or
 * 0 when there is none. */
int mc__peer_open_ref(mc_engine_t *e, const char *name, uint64_t instance, mc_segment_id_t *id_p);
/* Replace p's descriptor with d (taken over); the transports update their view under
 * peers_lock for writing. A READY peer whose new descriptor is of another engine instance is
 * not rebound: it is dead (its process was replaced). Progress context: descriptors and the
 * transports' state for a peer change there only (readers there need no lock). refresh_async: the
 * same from any thread, applied by progress before the tasks submitted after it. */
int mc__peer_refresh(mc_engine_t *e, mc_peer_t *p, mc_desc_t *d);
void mc__peer_refresh_async(mc_engine_t *e, mc_peer_t *p, mc_desc_t *d);
/* The same from the watched metadata cache (never blocks). */
int mc__peer_reload_cached(mc_engine_t *e, mc_peer_t *p);
/* Drop a reference taken by mc__peer_open_ref that cannot be the last one. */
void mc__peer_unref(mc_engine_t *e, mc_peer_t *p);
void mc__peer_destroy(mc_engine_t *e, mc_peer_t *p);
void mc__peers_fini(mc_engine_t *e);

/* Waiting for a descriptor (progress context unless said otherwise). park: t's remote range is
 * not in its peer's descriptor: t waits while it is asked for. want_desc_async: from any thread
 * (a peer just opened). kicked: what other threads queued for p (an open to start, a newer
 * descriptor). desc_ask: send the request if the control link can take it.
 * desc_arrived / desc_retry: for the control transport, with the answer, or when the link it
 * went on failed. */
void mc__peer_park(mc_engine_t *e, mc_task_t *t);
void mc__peer_want_desc_async(mc_engine_t *e, mc_peer_t *p);
void mc__peer_kicked(mc_engine_t *e, mc_peer_t *p);
void mc__peer_desc_ask(mc_engine_t *e, mc_peer_t *p);
void mc__peer_desc_arrived(mc_engine_t *e, mc_peer_t *p, const void *json, size_t len);
void mc__peer_desc_retry(mc_engine_t *e, mc_peer_t *p);
void mc__peers_tick(mc_engine_t *e, uint64_t now);

/* Fail everything queued to p, parked tasks too, and drop its unsent messages. */
void mc__peer_fail_all(mc_engine_t *e, mc_peer_t *p, int err, const char *why);

/* What transports learn about a peer (progress context): a link to it is up; it cannot be
 * reached (every path failed: what is queued to it fails with err); its process is gone
 * (everything fails with -MC_EPEERDEAD, and what is submitted to it later too). Each is
 * reported to the host's mc_peer_cb once per change. */
void mc__peer_link_up(mc_engine_t *e, mc_peer_t *p);
void mc__peer_unreachable(mc_engine_t *e, mc_peer_t *p, int err, const char *why);
void mc__peer_dead(mc_engine_t *e, mc_peer_t *p, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* How much a buffer at `location` wants rail r, from the NIC priority matrix: 0 preferred,
 * 1 available, 2 not listed. Slices go to the best-ranked rails that are ready. */
int mc__rail_rank(mc_engine_t *e, mc_rail_t *r, const char *location);
/* A rail may get new connections: active, or paused and due for a re-probe. */
bool mc__rail_usable(const mc_rail_t *r, uint64_t now);
/* A connection (or queue pair) of the rail failed; connecting: before it was ready. Three
 * failures within 10 s pause the rail, 1 s doubling to 30 s, unless it is the last: the last
 * rail of its peer that may connect, which nothing else would carry the traffic of (then only
 * the connect backoff, 50 ms doubling to 1.6 s, spaces its tries). */
void mc__rail_failed(mc_rail_t *r, uint64_t now, bool connecting, bool last);
/* A connection of the rail became ready: the rail (re)joins. */
void mc__rail_ready(mc_rail_t *r);
/* Moved bytes of one slice over r. */
static inline void mc__rail_moved(mc_rail_t *r, uint64_t bytes)
{
    atomic_fetch_add_explicit(&r->bytes, bytes, memory_order_relaxed);
    atomic_fetch_add_explicit(&r->slices, 1, memory_order_relaxed);
}
/* Update every rail's throughput average (timer tick). */
void mc__rails_tick(mc_engine_t *e, uint64_t now);

#endif
