/*
 * Batches, tasks and slices (internal).
 *
 * A task is one request of a batch. Its state moves WAITING -> PENDING -> a final state exactly
 * once (mc__task_finish); the engine holds it until nothing is queued or in flight for it
 * (mc__task_maybe_release), then runs its callback and lets the batch go.
 *
 * A slice is a piece of a task on one rail, or a control request of a transport; slices come
 * from a progress-owned pool. The transport carrying a slice keeps its own per-slice state in
 * priv (MC_SLICE_PRIV bytes, zeroed at allocation).
 */
#ifndef MC_TASK_H
#define MC_TASK_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "fwd.h"
#include "util/list.h"

/* Internal state between "not final" and a final state, held while the reason is written. */
#define MC_TASK_FINISHING 100
#define MC_RBUF_NONE      UINT32_MAX

typedef struct mc_notify_group {
    mc_segment_id_t target;
    unsigned left;
    bool failed;
    struct mc_msg *m;       /* the notification, its place in the window taken (mc__msg_reserve) */
    struct mc_flush *flush; /* a flush of its target waits for it to be routed */
} mc_notify_group_t;

struct mc_task {
    mc_list_t qlink; /* in the peer's pending queue of its transport (progress-owned) */
    mc_list_t alink; /* in e->active_tasks until released, then e->releaseq (progress-owned) */
    mc_batch_t *batch;
    mc_request_t req;
    mc_peer_t *peer;
    mc_buffer_t *lbuf; /* reference on the local buffer, held until release */
    mc_notify_group_t *group;
    struct mc_flush *flush; /* a flush of its peer waits for it to be let go of */
    uint64_t carved;        /* bytes cut into slices so far (progress-owned) */
    uint64_t queued_ns;     /* when it was submitted */
    uint64_t deadline_ns;   /* 0 until its first slice goes out, then that + timeout_ms */
    unsigned timeout_ms;
    unsigned inflight; /* slices on the wire (progress-owned) */
    bool queued, released;
    bool vram;            /* either end is CUDA memory */
    uint8_t tp;           /* the transport that carries it (index in transport/table.c) */
    uint8_t tp_hint;      /* that transport's note about it, set by its accept op */
    uint32_t rbuf;        /* index of the remote buffer in the peer's descriptor (a hint), or
                             MC_RBUF_NONE when the range is in none */
    uint32_t rbuf_layout; /* the descriptor's layout then: the index is good while it is that */
    /* that entry's range and serial: after entries moved, the task stays with it while it is
       there (mc__task_rbuf) */
    uint64_t rbuf_addr, rbuf_len, rbuf_serial;
    atomic_int state; /* mc_task_state_t or MC_TASK_FINISHING */
    _Atomic uint64_t bytes;
    int error;    /* 0 or a negative code; written with reason */
    char *reason; /* written by the finisher before the final state is published */

    /* MC_SUBMIT_ORDERED and on_sent (progress-owned but for the first two) */
    bool ordered;             /* submitted with MC_SUBMIT_ORDERED */
    bool ordered_counted;     /* counted in its peer's ordered_busy */
    bool sent_fired;          /* on_sent ran: its local bytes are the host's again */
    mc_completion_cb on_sent; /* mc_submit_opts_t.on_sent (WRITEs), or NULL */
    uint64_t sent;            /* bytes handed over for good (mc__slice_sent) */
    mc_list_t slink;          /* in e->sentq while its on_sent waits for the end of the pass */
};

struct mc_batch {
    mc_engine_t *engine;
    size_t cap;
    atomic_size_t n;       /* tasks submitted */
    atomic_size_t n_final; /* tasks in a final state */
    atomic_size_t n_completed;
    atomic_int first_bad; /* the first final state other than COMPLETED, or 0 */
    _Atomic uint64_t bytes;
    atomic_size_t busy; /* references the engine holds (tasks, a cancel kick), and
                           MC_BATCH_RELEASED once the host let go (mc_batch_release) */
    atomic_bool cancel_kick;
    atomic_int waited;     /* mc_batch_wait callers asleep on it, or about to be */
    mc_list_t cancel_link; /* in e->cancelq (under sub_lock) */
    mc_task_t *tasks;
    bool internal; /* a transport's own (a staged transfer's child): no per-peer counts */
};

/* MC_SL_DATA: a piece of a task. MC_SL_CTRL: a control request of transport tp to the same
 * transport of a peer, carried by the control transport (transport.h). Transports number their
 * own kinds from MC_SL_TP. */
enum { MC_SL_DATA, MC_SL_CTRL, MC_SL_TP };

#define MC_SLICE_PRIV 48

struct mc_slice {
    mc_list_t link;
    mc_slice_t *next_free;
    uint8_t kind;
    uint8_t opcode; /* MC_READ / MC_WRITE for data slices */
    uint8_t tp;     /* MC_SL_CTRL: the transport that asked; MC_SL_DATA: the one whose queue
                       it came from (mc__sched_move may move its task meanwhile) */
    mc_task_t *task;
    uint64_t offset; /* within the task */
    uint32_t len;
    unsigned attempts;
    uint32_t rails_tried; /* bit per rail of its transport: named when the slice finally fails */
    void *payload;        /* bytes sent after the carrier's header (WRITE data, a request) */
    uint32_t payload_len;
    bool payload_owned; /* free(payload) when done */
    bool sent;          /* counted in its task's sent bytes (mc__slice_sent) */
    void *ctx;          /* MC_SL_CTRL: the asker's object; NULL once it went away */
    _Alignas(16) unsigned char priv[MC_SLICE_PRIV]; /* the carrying transport's */
};

mc_slice_t *mc__slice_alloc(mc_engine_t *e);
void mc__slice_free(mc_engine_t *e, mc_slice_t *s);

/* Finish a task with a final state and, unless COMPLETED, an error code and a reason; returns
 * true if this call won (first final state). Any thread. */
bool mc__task_finish(mc_task_t *t, int state, int err, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Bytes of t confirmed; returns its total so far. */
uint64_t mc__task_add_bytes(mc_task_t *t, uint64_t n);
/* Let go of a task once it is final, unqueued and has nothing in flight: its local buffer's
 * reference goes at once, and it joins e->releaseq, which mc__tasks_release empties at the end
 * of the progress pass (notification, completion callback, batch reference), so that callbacks
 * never run inside a transport's code or under a lock other than e->lock. */
void mc__task_maybe_release(mc_engine_t *e, mc_task_t *t);
void mc__tasks_release(mc_engine_t *e);
#define MC_BATCH_RELEASED ((size_t)1 << (8 * sizeof(size_t) - 1))

/* The engine lets go of one reference to b (a task, a cancel kick); a released batch is freed
 * with its last one. */
void mc__batch_unbusy_n(mc_batch_t *b, size_t n);
static inline void mc__batch_unbusy(mc_batch_t *b)
{
    mc__batch_unbusy_n(b, 1);
}
/* The transport t was routed to cannot take it after all: route it to the next one that
 * reaches its peer and accepts it, or fail it with the reasons. Submitting thread, or progress
 * (mc__sched_move). */
void mc__task_reroute(mc_engine_t *e, mc_task_t *t);
/* The same, except that a task no later transport accepts stays as it was: false. */
bool mc__task_move(mc_engine_t *e, mc_task_t *t);
/* The entry of its peer's descriptor d that t goes with (peers_lock held): the one it was routed
 * with while d has it (a key of another registration of the same bytes, added since, may be of
 * one that goes while t's stays), else the one a new task would take (mc__desc_find); noted in
 * t. NULL: none holds its range. */
const mc_desc_buffer_t *mc__task_rbuf(const mc_desc_t *d, mc_task_t *t);
/* Route a task that waited for its peer's descriptor (progress context): a transport, or
 * failed (range still unknown, nothing accepts it); a transport that moves data at submit
 * takes it at once. */
void mc__task_route_late(mc_engine_t *e, mc_task_t *t);

#endif
