/*
 * The transport interface: the one header a transport includes.
 *
 * A transport moves the bytes of tasks between this engine's registered memory and a peer's:
 * slice by slice on its rails (tcp, rdma), or whole tasks inside mc_batch_submit (shm). It is one
 * directory under engine/transport/ (its sources listed in its transport.cmake) and one line in
 * table.c; the core (the files directly in engine/) names no transport and reaches each one through
 * its ops table, the way libfabric reaches its providers and UCX its UCT transports.
 *
 * Where a transport keeps its state (i = its slot, the index of its line in table.c, which it
 * learns through ops->slot before any engine starts):
 *   e->tp[i]             its engine state (NULL: not in use in this engine);
 *   p->tp[i], p->rails[i] its state for one peer and the rails it offers to it;
 *   b->tp[i]             its registration of a local buffer (memory regions, handles);
 *   d->tp[i], mc__desc_part(d, b, i)   what its codec decoded of a peer's descriptor;
 *   s->priv              MC_SLICE_PRIV bytes per slice it carries;
 *   t->tp_hint           one byte per task routed to it (set by its accept op).
 *
 * The control transport (flag MC_TP_CONTROL; tcp) also carries what is not data: the handshake
 * that fetches a descriptor, messages and notifications, and the control requests other
 * transports exchange with their counterpart on the peer (rdma's queue-pair set-up). Those go
 * through mc__ctrl_request / ctrl_recv / ctrl_reply here, never through direct calls; state that
 * must live and die with the control link (a target's queue pairs) is bound to the link. A
 * request that takes time to answer (a read from a disk) is answered later (MC_CTRL_LATER).
 *
 * A transport may own buffers that are not memory (flag MC_TP_LOCAL; file): opaque buffers
 * (buffer.h) that only it registers, publishes and moves, at either end of a task (the core
 * routes such a task to it alone, and its codec marks the peer's ones: mc_desc_buffer_t.owner).
 * It may move their bytes through the other transports, as the engine's own host would.
 *
 * Threads: every operation runs in the progress context (e->lock held) unless its comment says
 * otherwise. Every entry except size, name and slot may be NULL (not needed by this transport);
 * entries are only appended, and the core checks ops->size before using one (MC_TP_HAS), so a
 * transport built against an older table keeps working.
 */
#ifndef MC_TRANSPORT_H
#define MC_TRANSPORT_H

#include <stddef.h>

#include <jansson.h>

#include "../descriptor.h"
#include "../engine_int.h"
#include "../buffer.h"
#include "../msg.h"
#include "../peer.h"
#include "../scheduler.h"
#include "../task.h"
#include "../util/crypto.h"
#include "../util/list.h"
#include "../util/log.h"
#include "../util/time.h"

/* Flags. LOCAL: it reaches no peer by itself but owns buffers that are not memory; it starts
 * whatever MC_PROTOCOL says, and is never its value. */
#define MC_TP_CONTROL 0x1u /* carries the control link (exactly one transport has it) */
#define MC_TP_LOCAL   0x2u
#define MC_TP_ORDERED                                                                              \
    0x4u                   /* carries a peer's ORDERED tasks in the order submitted (one path):    \
                              a WRITE takes effect before every later task */
#define MC_CTRL_MAX   1024 /* largest control request or answer */
#define MC_CTRL_LATER 1    /* ctrl_recv: answered later, through mc__ctrl_answer */

/* Something a transport keeps that must go when a control link goes (a queue pair set up over
 * it). Embedded in the transport's object; link_lost gets it back. */
typedef struct mc_link_bound {
    mc_list_t node; /* in mc_link_t.bound */
    uint8_t tp;     /* the owner's slot */
    uint8_t kind;   /* the owner's own tag: what kind of object embeds it */
} mc_link_bound_t;

/* A control link: an authenticated, ordered channel to one peer process (a tcp connection). */
struct mc_link {
    mc_list_t bound;    /* mc_link_bound_t of objects that live and die with it */
    mc_peer_t *peer;    /* links we opened: the peer; links the peer opened: NULL */
    const char *remote; /* the peer's segment name */
    uint64_t instance;  /* the peer engine's instance */
    uint32_t req_id;    /* the control request being delivered (what mc__ctrl_defer keeps) */
};

/* A control request whose answer comes later: ctrl_recv called mc__ctrl_defer with it and
 * returned MC_CTRL_LATER. Embedded in the answering transport's object and bound to the link
 * the request came on: if the link goes first, link_lost gets `bound` back (then there is
 * nowhere to answer, and link is NULL). */
typedef struct mc_ctrl_later {
    mc_link_bound_t bound;
    mc_link_t *link; /* NULL once answered or lost */
    uint32_t id;     /* the control transport's id of the request */
} mc_ctrl_later_t;

struct mc_transport_ops {
    size_t size; /* sizeof(mc_transport_ops_t) it was built with */
    const char *name;
    unsigned *slot; /* where the core writes this transport's slot (once per process) */
    unsigned flags; /* MC_TP_* */
    const mc_desc_codec_t *codec;
    const mc_setting_t *settings; /* its MC_* settings, ending with a NULL name; read in init */

    /* Engine lifetime, in the creating / destroying thread. init: 0 with e->tp[slot] set, or 0
     * with it left NULL when the transport cannot work here (said once, at info level), or an
     * error that fails mc_engine_create. stop: progress context; close links and fail what is
     * in flight (the control transport stops first). fini: after every peer was closed and all
     * memory unregistered; frees e->tp[slot]. */
    int (*init)(mc_engine_t *e);
    void (*stop)(mc_engine_t *e);
    void (*fini)(mc_engine_t *e);

    /* Its parts of our descriptor (any thread; encode_buffer with mem.lock held). */
    int (*encode)(mc_engine_t *e, json_t *root);
    int (*encode_buffer)(mc_engine_t *e, const mc_buffer_t *b, json_t *jb);

    /* Memory, in the registering thread. mem_register runs before b is visible to anyone;
     * mem_changed after every change of the table (mem.lock held for writing); mem_release in
     * unregister once our own references drained: 0 once no peer can touch b any more, or why
     * one still may (the unregister then fails, and b is kept). */
    int (*mem_register)(mc_engine_t *e, mc_buffer_t *b);
    void (*mem_deregister)(mc_engine_t *e, mc_buffer_t *b);
    void (*mem_changed)(mc_engine_t *e);
    int (*mem_release)(mc_engine_t *e, mc_buffer_t *b);

    /* Peers. peer_update: p is new or its descriptor changed (peers_lock held for writing, or p
     * not yet shared); creates p->tp[slot] on first call and sets p->rails[slot]. Returns how
     * well it reaches p: 0 not at all, else a preference (higher first), or a negative error.
     * peer_close: p goes away (e->lock held); free what it holds. */
    int (*peer_update)(mc_engine_t *e, mc_peer_t *p);
    void (*peer_close)(mc_engine_t *e, mc_peer_t *p);

    /* Tasks. accept (submitting thread, peers_lock held for reading): NULL if t may go over this
     * transport (rb: the remote buffer in p->desc), else why not (a static string). submit
     * (submitting thread): move the tasks routed here now; those it cannot take go on with
     * mc__task_reroute. fill: hand p's queued slices of this transport to its rails. */
    const char *(*accept)(mc_engine_t *e, mc_task_t *t, const mc_desc_buffer_t *rb);
    void (*submit)(mc_engine_t *e, mc_task_t *tasks, size_t n);
    void (*fill)(mc_engine_t *e, mc_peer_t *p);

    /* Progress hooks: every pass before the scheduler runs, except express ones (express,
     * below); every timer tick (50 ms while busy); and at the end of every whole pass, of the
     * others only when marked (reap_marked, below). */
    void (*progress)(mc_engine_t *e);
    void (*timers)(mc_engine_t *e, uint64_t now);
    void (*reap)(mc_engine_t *e);

    /* Control requests between a transport and its counterpart on a peer. ctrl_recv: a request
     * arrived on link l; returns the status answered, the answer in ans (at most MC_CTRL_MAX
     * bytes, *ans_len set), or with a negative status the reason from mc_last_error().
     * ctrl_reply: the answer to our request s (s->ctx is non-NULL). link_lost: l is going away
     * with b bound to it. */
    int (*ctrl_recv)(mc_engine_t *e, mc_link_t *l, const void *req, size_t len, void *ans,
                     size_t *ans_len);
    void (*ctrl_reply)(mc_engine_t *e, mc_slice_t *s, mc_link_t *l, int status, const void *ans,
                       size_t len);
    void (*link_lost)(mc_engine_t *e, mc_link_bound_t *b);

    /* The control transport only. address: our first endpoint (the default segment name).
     * ctrl_ready: whether a link to p is ready (if not, one is being opened; its readiness
     * activates p). ctrl_send: queue a control request on a ready link to p (-EAGAIN: none is
     * ready). fetch_desc (any thread, blocking up to the connect timeout): the descriptor of
     * the peer at addr; -EINVAL when addr is not an address of this transport. */
    const char *(*address)(mc_engine_t *e);
    bool (*ctrl_ready)(mc_engine_t *e, mc_peer_t *p);
    int (*ctrl_send)(mc_engine_t *e, mc_peer_t *p, mc_slice_t *s, mc_link_t **link_p);
    int (*fetch_desc)(mc_engine_t *e, const char *addr, char **json_p, size_t *len_p);

    /* The control transport only. desc_request: ask p for its current descriptor over a ready
     * link; the answer goes to mc__peer_desc_arrived, or, if the link fails first, to
     * mc__peer_desc_retry. -EAGAIN while no link is ready (one is being opened; its readiness
     * activates p). address_pack (any thread): our first endpoint in at most cap bytes; its
     * length. address_unpack, address_text (any thread): the name and the control part of a
     * descriptor (d is zeroed) for a peer known only by a packed or a text address; -EINVAL if
     * it is not one. */
    int (*desc_request)(mc_engine_t *e, mc_peer_t *p);
    int (*address_pack)(mc_engine_t *e, uint8_t *out, size_t cap);
    int (*address_unpack)(mc_engine_t *e, const uint8_t *in, size_t len, mc_desc_t *d);
    int (*address_text)(mc_engine_t *e, const char *text, mc_desc_t *d);
    /* The control transport only (any thread): whether a route from this host leads to the
     * endpoint packed in [in, in+len) (address_pack's form) of an engine on another host: 1 or
     * 0 (loopback and unspecified endpoints are that host's own); -EINVAL if it is not one. */
    int (*address_reachable)(mc_engine_t *e, const uint8_t *in, size_t len);

    /* Buffer keys (mc_buffer_key_pack; any thread, mem.lock held): its bytes for local buffer
     * b in a key, at most cap, which its codec's decode_key reads back; the length, 0 for none,
     * -E2BIG when they cannot fit. */
    int (*key_pack)(mc_engine_t *e, const mc_buffer_t *b, uint8_t *out, size_t cap);

    /* Messages over a transport other than the control one. msg_open: messages to p are
     * queued and the control link carries them; true if this transport carries them from now
     * on (set up without blocking). Its fill then takes them (mc__msg_take with its slot) and
     * answers them (mc__msg_answered) as the receiver takes them; when it cannot reach p any
     * more, it gives them back (p->msg_tp = the control transport, mc__msg_link_lost with its
     * slot), and the control link carries them. A receiving transport hands what arrives to
     * mc__msg_deliver. */
    bool (*msg_open)(mc_engine_t *e, mc_peer_t *p);
    /* p's messages are about to fail (dead, closed, engine destroyed): answer those the
     * receiver took already. */
    void (*msg_settle)(mc_engine_t *e, mc_peer_t *p);

    /* The progress context is about to sleep (its thread, in epoll_wait; a host that took the
     * event fd; an internal wait): arm whatever must wake it through its epoll set, and return
     * true if work came meanwhile (it does not sleep then). */
    bool (*idle)(mc_engine_t *e);

    /* The largest slice of its tasks to p (a disk wants larger pieces than a network); without
     * it, MC_SLICE_SIZE. */
    uint32_t (*slice_max)(mc_engine_t *e, mc_peer_t *p);

    /* The control transport only: send the answer to request id that arrived on link l and was
     * deferred (mc__ctrl_defer): answers may then leave out of order, each with its id. 0, or
     * an error when l cannot take it (it is failing: the asker hears of that). */
    int (*ctrl_answer)(mc_engine_t *e, mc_link_t *l, uint32_t id, int status, const void *ans,
                       size_t len);

    /* Direct access to a same-host owner's buffer (CUDA IPC: the owner cannot see the copies),
     * granted and revoked over the transport that watches same-host owners; progress context.
     * A buffer is its address and its registration's number (serial) at the owner.
     * grant_ask (that transport): ask p whether that buffer is still registered; the answer
     * goes to mc__grant_answer. 0: asked; -EAGAIN: not now (ask again later); another error:
     * never for p. grant_answer (the accessing transport): p's answer. revoke (the accessing
     * transport): p unregisters that buffer (addr 0: every buffer, p can no longer revoke):
     * no new copy may use it; returns how many copies still do. The owner's acknowledgement
     * waits until none does (revoke is asked again until it returns 0). */
    int (*grant_ask)(mc_engine_t *e, mc_peer_t *p, uint64_t addr, uint64_t serial);
    void (*grant_answer)(mc_engine_t *e, mc_peer_t *p, uint64_t addr, uint64_t serial, bool ok);
    unsigned (*revoke)(mc_engine_t *e, mc_peer_t *p, uint64_t addr, uint64_t serial);

    /* Messages over it: its fill writes a message's payload into memory it keeps until the
     * receiver took it (a ring), which may then be the payload's only copy (mc_msg_t.in_ring),
     * so a message sent from the progress context is filled at once, straight from the sender's
     * bytes (msg.c, msg_route_src); other carriers get messages copied first. */
    bool msg_direct;

    /* Its reap has work only where it said so (mc__reap_mark, engine_int.h): then it runs at
     * the end of a whole pass, and of a light pass or a host's send section only once marked
     * (a spinning host's passes and sends otherwise paid every transport's reap). */
    bool reap_marked;

    /* An express pass (engine.c): a light pass of an engine with nothing under way. Take what
     * arrived through memory for the host's handlers (mc__msg_deliver) and return true, or
     * return false, having done nothing, when this pass must be a whole light one (work of its
     * own). A transport with a progress hook and no express op never lets a pass be express. */
    bool (*express)(mc_engine_t *e);

    /* Task t of ours is about to end TIMEOUT or FAILED (progress context) and slices of it may
     * be in flight here: once this returns, nothing more of them may land in its local memory,
     * which the host may reuse as soon as it sees the state. Not needed where late answers are
     * dropped as they arrive (tcp reads and drops those of a final task). */
    void (*abandon)(mc_engine_t *e, mc_task_t *t);

    /* A carrier that answers messages as it takes them (msg.h, MC__MSG_LATER): tell the sender
     * of stream, on the link its messages came on last, that the handlers of its messages up to
     * seq ran (progress context; nothing if no such link is up: a sender that lost it, or
     * heard nothing for 2 x MC_IO_TIMEOUT_MS, sends them again, and hears of it in their
     * answers: msg.c, mc__msgs_tick). Without it, a receiver with MC_MSG_ACK_AFTER_HANDLER
     * answers this transport's messages as they are queued. */
    void (*msg_handled)(mc_engine_t *e, uint64_t stream, uint64_t seq);

    /* A ring that lends its records to the handlers (msg_ring.h): whether one of this
     * transport's still lends records of sender stream, whose handlers may not have run
     * (progress context). A duplicate of such a message, sent again over the control link after
     * the ring went, must not be answered "handled" (msg.c, mc__msg_deliver). */
    bool (*msg_lending)(mc_engine_t *e, uint64_t stream);
};

/* The table (table.c): every transport, best first when several reach a peer equally. */
extern const mc_transport_ops_t *const mc__transports[];
extern const unsigned mc__n_transports;

#define MC_TP_HAS(ops, field)                                                                      \
    ((ops)->size >= offsetof(mc_transport_ops_t, field) + sizeof((ops)->field) && (ops)->field)

/* Assign every transport its slot (once per process). */
void mc__transports_setup(void);
/* The slot of the control transport. */
unsigned mc__transport_control(void);
/* The slot of the transport called name, or -ENOENT. */
int mc__transport_find(const char *name);

/* Count v in counter cnt (MC_CNT_*) of transport slot. */
static inline void mc__tp_count(mc_engine_t *e, unsigned slot, int cnt, uint64_t v)
{
    mc__count(&e->c[slot][cnt], v);
}

/* Whether a control request to p can go now (if not, a link is being opened, and p is activated
 * once it is ready). */
bool mc__ctrl_ready(mc_engine_t *e, mc_peer_t *p);
/* Same-host grants and revocations (transport ops grant_ask, grant_answer, revoke), routed to
 * the transports that have them; progress context. mc__revoke: the copies still in flight. */
int mc__grant_ask(mc_engine_t *e, mc_peer_t *p, uint64_t addr, uint64_t serial);
void mc__grant_answer(mc_engine_t *e, mc_peer_t *p, uint64_t addr, uint64_t serial, bool ok);
unsigned mc__revoke(mc_engine_t *e, mc_peer_t *p, uint64_t addr, uint64_t serial);
/* Send control request s (kind MC_SL_CTRL; tp, ctx, payload set by the caller, at most
 * MC_CTRL_MAX bytes) to the same transport of peer p. 0: the answer comes to ctrl_reply (or,
 * if the link fails first, link_lost for what was bound to *link_p, and s is freed unanswered);
 * -EAGAIN: no link is ready yet, try again on a later fill. */
int mc__ctrl_request(mc_engine_t *e, mc_peer_t *p, mc_slice_t *s, mc_link_t **link_p);
/* In ctrl_recv of transport slot: the request being delivered on l will be answered later,
 * through mc__ctrl_answer with w; return MC_CTRL_LATER then. w is bound to l meanwhile. */
void mc__ctrl_defer(mc_link_t *l, unsigned slot, mc_ctrl_later_t *w);
/* Answer a deferred request (status 0 with ans, or a negative code with a reason in ans) if
 * its link still lives; w is unbound. Progress context. */
void mc__ctrl_answer(mc_engine_t *e, mc_ctrl_later_t *w, int status, const void *ans, size_t len);
/* For the control transport: a request for transport slot arrived on l; fills the answer (or
 * returns MC_CTRL_LATER: the transport answers through mc__ctrl_answer). l->req_id is set. */
int mc__ctrl_deliver(mc_engine_t *e, mc_link_t *l, unsigned slot, const void *req, size_t len,
                     void *ans, size_t *ans_len);
/* For the control transport: the answer to s arrived (status, ans) on l. */
void mc__ctrl_answered(mc_engine_t *e, mc_slice_t *s, mc_link_t *l, int status, const void *ans,
                       size_t len);

static inline void mc__link_init(mc_link_t *l)
{
    mc_list_init(&l->bound);
    l->peer = NULL;
    l->remote = "";
    l->instance = 0;
}

static inline void mc__link_bind(mc_link_t *l, mc_link_bound_t *b, unsigned slot)
{
    b->tp = (uint8_t)slot;
    mc_list_push_back(&l->bound, &b->node);
}

static inline void mc__link_unbind(mc_link_bound_t *b)
{
    mc_list_del(&b->node);
}

/* Whether anything is bound to l (a link that carries state is never closed as idle). */
static inline bool mc__link_busy(const mc_link_t *l)
{
    return !mc_list_empty(&l->bound);
}

/* For the control transport: l is going away; everything bound to it is handed to its owner. */
void mc__link_lost(mc_engine_t *e, mc_link_t *l);

#endif
