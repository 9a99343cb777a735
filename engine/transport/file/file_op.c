/* The initiator's side: each slice of a task with a file at one end becomes an op, a short
 * plan of steps run one after the other:
 *   - I/O between one of our files and memory (ours: the task's, the far end's, or a chunk);
 *   - STAGE / COMMIT: the owner of a peer file reads the range into one of its chunks, or writes
 *     one to the file, and answers (later, once its disk did it);
 *   - CHILD: the bytes move between our memory (or chunk) and the peer's memory (or chunk) as a
 *     task of the engine's own, over the best other transport that reaches the peer;
 *   - RELEASE: the owner's chunk is given back (batched, not waited for).
 * A task to our own segment needs no peer: its I/O goes straight between the file and memory.
 * What other transports report inside their own code (an answer, a lost link) is noted and
 * acted upon from our progress hooks. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../util/bytes.h"
#include "file_int.h"

enum {
    ST_READ_L,
    ST_WRITE_L,
    ST_READ_R,
    ST_WRITE_R,
    ST_STAGE,
    ST_CHILD,
    ST_RELEASE,
    ST_COMMIT,
    ST_IPC, /* one copy between our memory and a same-host peer's VRAM, opened here */
};

static file_peer_t *file_peer(mc_peer_t *p)
{
    return p->tp[mc__file_slot];
}

static bool is_self(mc_engine_t *e, const mc_peer_t *p)
{
    return p->desc.instance == e->instance;
}

static uint64_t local_addr(const file_op_t *op)
{
    return (uint64_t)(uintptr_t)op->s->task->req.local + op->s->offset;
}

static uint64_t remote_addr(const file_op_t *op)
{
    return op->s->task->req.target_offset + op->s->offset;
}

/* ---- life ---- */

static file_op_t *op_alloc(mc_engine_t *e)
{
    file_engine_t *fe = file_of(e);
    mc_list_t *n = mc_list_pop_front(&fe->ops_free);
    file_op_t *op = n ? mc_container_of(n, file_op_t, link) : calloc(1, sizeof(*op));

    if (!op)
        return NULL;
    mc_batch_t *child = op->child;
    memset(op, 0, sizeof(*op));
    op->child = child;
    op->e = e;
    op->bound.kind = FB_OP;
    mc_list_init(&op->link);
    fe->n_ops++;
    mc__reap_mark(e, mc__file_slot);
    return op;
}

/* Give the owner's chunk back, with the next batch of releases to that peer. */
static void release_queue(mc_engine_t *e, file_op_t *op);

/* ---- a same-host peer's VRAM, opened here (CUDA IPC) ---- */

static void op_run(mc_engine_t *e, file_op_t *op);
static void op_staged(mc_engine_t *e, file_op_t *op);

/* The slice goes through m, as one copy: a reference held. */
static void op_ipc(mc_engine_t *e, file_op_t *op, file_ipc_map_t *m)
{
    op->ipc = m;
    m->refs++;
    op->steps[0] = ST_IPC;
    op->n_steps = 1;
    op_run(e, op);
}

static bool ipc_usable(const file_ipc_map_t *m)
{
    return m->base && !m->gone;
}

/* The ops waiting for m's grant go on: through m if it is open, else staged. */
static void ipc_resume(mc_engine_t *e, file_ipc_map_t *m)
{
    mc_list_t *n;

    m->asked = false;
    while ((n = mc_list_pop_front(&m->asking))) {
        file_op_t *op = mc_container_of(n, file_op_t, link);
        op->waiting = false;
        if (ipc_usable(m))
            op_ipc(e, op, m);
        else
            op_staged(e, op);
    }
}

static void ipc_unmap(mc_engine_t *e, file_ipc_map_t *m)
{
    if (m->base)
        file_of(e)->copy.ops->ipc_close(m->dev, m->base);
    m->base = NULL;
}

static void ipc_close(mc_engine_t *e, file_ipc_map_t *m)
{
    ipc_unmap(e, m);
    mc_list_del(&m->link);
    free(m);
}

static void ipc_put(mc_engine_t *e, file_ipc_map_t *m)
{
    if (!--m->refs && m->gone)
        ipc_close(e, m);
}

/* m's VRAM may go (its peer revoked it or went, or registered another buffer there): closed
 * once no copy of ours uses it. */
static void ipc_let_go(mc_engine_t *e, file_ipc_map_t *m)
{
    m->gone = true;
    ipc_resume(e, m);
    if (!m->refs)
        ipc_close(e, m);
}

/* The peer granted m: open it (a handle that does not open, or an allocation shorter than the
 * descriptor says, leaves it staged: said once). */
static void ipc_open(mc_engine_t *e, mc_peer_t *p, file_ipc_map_t *m)
{
    const file_copy_ops_t *ops = file_of(e)->copy.ops;
    char why[256];

    if (ops->ipc_open(m->dev, m->handle, &m->base, &m->len, why, sizeof(why))) {
        m->base = NULL;
        mc_info("file: %s's VRAM at 0x%llx cannot be opened here (%s): staged instead", p->name,
                (unsigned long long)m->addr, why);
    } else if (m->off > m->len || m->blen > m->len - m->off) { /* the descriptor is wrong */
        ipc_unmap(e, m);
        mc_warn("file: %s's VRAM at 0x%llx does not fit the allocation its handle opens: staged "
                "instead",
                p->name, (unsigned long long)m->addr);
    }
}

/* The entry for p's VRAM buffer rb (handle x) on device dev's context: open, or asked for (the
 * op waits for the grant), or NULL: staged. A first use asks p for the grant (mc__grant_ask).
 * An entry of the same address under another handle or registration is the owner's earlier
 * buffer there: let go of. */
static file_ipc_map_t *ipc_get(mc_engine_t *e, mc_peer_t *p, const mc_desc_buffer_t *rb,
                               const file_desc_ipc_t *x, int dev)
{
    file_engine_t *fe = file_of(e);
    file_ipc_map_t *m;
    mc_list_t *pos, *tmp;
    int rc;

    mc_list_for_each_safe(pos, tmp, &fe->ipc_maps)
    {
        m = mc_container_of(pos, file_ipc_map_t, link);
        if (m->gone || m->instance != p->desc.instance || m->addr != rb->addr)
            continue;
        if (memcmp(m->handle, x->handle, sizeof(m->handle)) || m->gen != x->gen)
            ipc_let_go(e, m); /* stale */
        else if (m->dev == dev)
            goto found;
    }
    rc = mc__grant_ask(e, p, rb->addr, x->gen);
    if (rc == -EAGAIN || !(m = calloc(1, sizeof(*m))))
        return NULL; /* asked again by a later slice */
    m->instance = p->desc.instance;
    m->addr = rb->addr;
    m->blen = rb->len;
    m->off = x->off;
    m->gen = x->gen;
    m->dev = dev;
    memcpy(m->handle, x->handle, sizeof(m->handle));
    mc_list_init(&m->asking);
    mc_list_push_back(&fe->ipc_maps, &m->link);
    m->asked = rc == 0;
    if (rc)
        mc_info("file: %s's %s at 0x%llx: no same-host channel to be granted it (%s): staged",
                p->name, rb->location, (unsigned long long)rb->addr, strerror(-rc));
found:
    return m->asked || ipc_usable(m) ? m : NULL;
}

/* The entry p's VRAM buffer rb is moved through for t, or NULL (staged): a same-host peer's
 * VRAM with an IPC handle, an end of ours that is memory, unless MC_PROTOCOL asks for another
 * path or MC_AUTH_TOKEN is set (as shm, same-host peers are trusted by uid only). It is opened
 * from our VRAM's device when that is an end (a peer copy), else by the peer's number for its
 * GPU (the same where both see the same devices). */
static file_ipc_map_t *ipc_for(mc_engine_t *e, mc_peer_t *p, const mc_task_t *t,
                               const file_far_t *far, bool self)
{
    const file_copy_ops_t *ops = file_of(e)->copy.ops;
    const mc_desc_buffer_t *rb = &far->b;

    if (self || rb->owner || file_owned(t->lbuf) || e->cfg.auth_token[0] || !ops ||
        !ops->ipc_open || strcmp(p->desc.host_id, e->host_id) ||
        (strcmp(e->cfg.protocol, "auto") && strcmp(e->cfg.protocol, "shm")) || !far->has_ipc ||
        !far->ipc.gen) /* (no gen: cannot grant) */
        return NULL;
    return ipc_get(e, p, rb, &far->ipc,
                   atoi((t->lbuf->vram ? t->lbuf->location : rb->location) + 5));
}

void mc__file_grant_answer(mc_engine_t *e, mc_peer_t *p, uint64_t addr, uint64_t serial, bool ok)
{
    file_engine_t *fe = file_of(e);
    mc_list_t *pos, *tmp;

    mc_list_for_each_safe(pos, tmp, &fe->ipc_maps)
    {
        file_ipc_map_t *m = mc_container_of(pos, file_ipc_map_t, link);
        if (!m->asked || m->gone || m->instance != p->desc.instance || m->addr != addr ||
            m->gen != serial)
            continue;
        if (ok)
            ipc_open(e, p, m);
        ipc_resume(e, m); /* not granted: it is no longer registered, and staging says so */
    }
}

/* Asked again until it returns 0: entries let go of before (a busy one stays listed, gone)
 * count as well. */
unsigned mc__file_revoke(mc_engine_t *e, mc_peer_t *p, uint64_t addr, uint64_t serial)
{
    file_engine_t *fe = file_of(e);
    mc_list_t *pos, *tmp;
    unsigned busy = 0;

    mc_list_for_each_safe(pos, tmp, &fe->ipc_maps)
    {
        file_ipc_map_t *m = mc_container_of(pos, file_ipc_map_t, link);
        if (m->instance != p->desc.instance || (addr && (m->addr != addr || m->gen != serial)))
            continue;
        busy += m->refs;
        if (!m->gone)
            ipc_let_go(e, m); /* (m is freed here if no copy uses it) */
    }
    return busy;
}

static void io_done(mc_engine_t *e, file_io_t *io, int err);

/* One copy between our memory (host or VRAM) and the peer's VRAM, as mapped here. */
static void ipc_start(mc_engine_t *e, file_op_t *op)
{
    file_ipc_map_t *m = op->ipc;

    op->io.vram = true;
    op->io.f = NULL;
    op->io.dev = m->dev;
    /* (inside the mapping: the slice lies in rb, and rb fits it: ipc_open) */
    op->io.pos = (uint64_t)(uintptr_t)m->base + m->off + (remote_addr(op) - m->addr);
    op->io.mem = (uint8_t *)(uintptr_t)local_addr(op);
    op->io.len = op->s->len;
    op->io.write = op->s->opcode == MC_WRITE;
    op->io.cb = io_done;
    mc__file_io_submit(e, &op->io);
}

void mc__file_ipc_fini(mc_engine_t *e)
{
    file_engine_t *fe = file_of(e);

    while (!mc_list_empty(&fe->ipc_maps))
        ipc_close(e, mc_container_of(fe->ipc_maps.next, file_ipc_map_t, link));
}

/* ---- a failure held back ----
 * A slice that fails its task while other slices of the task are under way here does not fail
 * the task yet: their I/O, copies and child transfers may still write into the task's memory
 * (a READ's), which the host may reuse once it sees FAILED (transport.h, abandon). The failure
 * waits in fe->held, the task's other ops stop at their next step, and once the last of them
 * ended the failures are told, the first one's first. (A timeout is told at once: a TIMEOUT's
 * late bytes are allowed until the engine lets go of the task.) */

/* Whether an op of t other than op is under way. */
static bool task_live(const file_engine_t *fe, const mc_task_t *t, const file_op_t *op)
{
    for (const mc_list_t *n = fe->live.next; n != &fe->live; n = n->next) {
        const file_op_t *o = mc_container_of(n, file_op_t, live);
        if (o != op && o->s->task == t)
            return true;
    }
    return false;
}

/* Whether a failure of t is held back: its ops stop. */
static bool task_failing(const file_engine_t *fe, const mc_task_t *t)
{
    for (const mc_list_t *n = fe->held.next; n != &fe->held; n = n->next)
        if (mc_container_of(n, file_op_t, link)->s->task == t)
            return true;
    return false;
}

/* None of t's ops is under way any more: tell the failures held back. */
static void held_tell(mc_engine_t *e, mc_task_t *t)
{
    file_engine_t *fe = file_of(e);
    mc_list_t *pos, *tmp;

    mc_list_for_each_safe(pos, tmp, &fe->held)
    {
        file_op_t *op = mc_container_of(pos, file_op_t, link);
        if (op->s->task != t)
            continue;
        mc_list_del(&op->link);
        mc__slice_failed(e, op->s, op->held_err, false,
                         op->held_reason ? op->held_reason : "failed");
        free(op->held_reason);
        op->held_reason = NULL;
        op->s = NULL;
        mc_list_push_back(&fe->ops_free, &op->link);
    }
}

/* The op is over: its slice done (err 0) or failed, what it holds given back. */
static void op_end(mc_engine_t *e, file_op_t *op, int err, bool retry, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

static void op_end(mc_engine_t *e, file_op_t *op, int err, bool retry, const char *fmt, ...)
{
    file_engine_t *fe = file_of(e);
    mc_task_t *t = op->s->task;
    bool held = false;
    char reason[700];
    va_list ap;

    if (op->lent)
        release_queue(e, op);
    if (op->waiting)
        mc_list_del(&op->link);
    mc_list_del(&op->live);
    if (err) {
        va_start(ap, fmt);
        vsnprintf(reason, sizeof(reason), fmt, ap);
        va_end(ap);
        bool failing = task_failing(fe, t);
        /* (a slice that is tried again ends nothing) */
        held =
            (!retry || op->s->attempts >= e->cfg.retry_cnt) && (failing || task_live(fe, t, NULL));
        if (held) {
            if (!failing) /* the first: what is not cut yet waits for nothing */
                mc__sched_stop_carving(e, t);
            op->held_err = err;
            op->held_reason = strdup(reason);
        } else {
            mc__slice_failed(e, op->s, err, retry, reason);
        }
    } else {
        mc__slice_done(e, op->s);
    }
    if (op->chunk)
        mc__file_chunk_put(e, op->chunk);
    if (op->rbuf)
        mc__mem_put(e, op->rbuf);
    if (op->ipc)
        ipc_put(e, op->ipc);
    mc__peer_activate(e, op->p); /* its next slices may go */
    fe->n_ops--;
    fe->kicked = true;
    mc__reap_mark(e, mc__file_slot);
    if (held) {
        mc_list_push_back(&fe->held, &op->link);
    } else {
        op->s = NULL;
        mc_list_push_back(&fe->ops_free, &op->link);
    }
    if (!mc_list_empty(&fe->held) && !task_live(fe, t, NULL))
        held_tell(e, t);
}

/* ---- steps ---- */

static void io_done(mc_engine_t *e, file_io_t *io, int err)
{
    file_op_t *op = mc_container_of(io, file_op_t, io);
    char reason[512];

    if (!err) {
        op_run(e, op);
        return;
    }
    mc__file_io_reason(io, err, reason, sizeof(reason));
    op_end(e, op, err == -ENODATA ? -EIO : err, false, "%s", reason);
}

static void io_start(mc_engine_t *e, file_op_t *op, int step)
{
    bool local = step == ST_READ_L || step == ST_WRITE_L;

    mc__file_io_prep(&op->io, local ? op->s->task->lbuf : op->rbuf,
                     local ? local_addr(op) : remote_addr(op), op->mem, op->s->len,
                     step == ST_WRITE_L || step == ST_WRITE_R);
    op->io.cb = io_done;
    mc__file_io_submit(e, &op->io);
}

/* A STAGE or COMMIT to the owner of the far file; -EAGAIN while no control link is ready (the
 * op waits for one). */
static int ctrl_send(mc_engine_t *e, file_op_t *op, int step)
{
    uint8_t *q = op->req;
    mc_link_t *link;
    mc_slice_t *s = mc__slice_alloc(e);
    int rc;

    if (!s)
        return mc__set_error(-ENOMEM, "out of memory");
    memset(q, 0, FREQ_HDR);
    q[0] = step == ST_STAGE ? FREQ_STAGE : FREQ_COMMIT;
    q[1] = op->s->opcode;
    mc__put32(q + 4, op->lend_id);
    mc__put64(q + 8, remote_addr(op));
    mc__put32(q + 16, op->s->len);
    s->kind = MC_SL_CTRL;
    s->tp = (uint8_t)mc__file_slot;
    s->ctx = op;
    s->payload = q; /* the op lives until the answer, or the link's loss */
    s->payload_len = FREQ_HDR;
    rc = mc__ctrl_request(e, op->p, s, &link);
    if (rc) {
        mc__slice_free(e, s);
        return rc;
    }
    op->asked = true;
    mc__link_bind(link, &op->bound, mc__file_slot);
    return 0;
}

static void ctrl_step(mc_engine_t *e, file_op_t *op, int step)
{
    int rc = ctrl_send(e, op, step);

    if (rc == -EAGAIN) { /* a link is being opened: its readiness lets us try again */
        op->step--;
        op->waiting = true;
        mc_list_push_back(&file_of(e)->ctrl_wait, &op->link);
    } else if (rc) {
        op_end(e, op, rc, false, "file: %s", mc_last_error());
    }
}

static void child_done(void *arg, const mc_task_status_t *st)
{
    file_op_t *op = arg;
    mc_engine_t *e = op->e;

    if (st->state == MC_TASK_COMPLETED) {
        op_run(e, op);
        return;
    }
    op_end(e, op, st->error ? st->error : -EIO, false, "%s %s's %s: %s",
           op->s->opcode == MC_READ ? "reading" : "writing", op->p->name,
           op->lent ? "bounce chunk" : "memory", st->reason ? st->reason : "failed");
}

/* The bytes between our memory and the peer's, as a task of our own over the other transports
 * (the core routes it: shm, rdma or tcp, whichever reaches the peer best). */
static void child_start(mc_engine_t *e, file_op_t *op)
{
    mc_task_t *t = op->s->task;
    mc_submit_opts_t o = {.size = sizeof(o), .timeout_ms = t->timeout_ms};
    mc_request_t r = {.opcode = (mc_opcode_t)op->s->opcode,
                      .local = op->mem,
                      .target = op->p->id,
                      .target_offset = op->lent ? op->lend_addr : remote_addr(op),
                      .length = op->s->len,
                      .cb = child_done,
                      .cb_arg = op};
    int rc = 0;

    /* The engine lets go of a batch just after its callback: one still held is left to it. */
    if (op->child && mc_batch_reset(op->child)) {
        mc_batch_release(op->child);
        op->child = NULL;
    }
    if (!op->child && !(rc = mc_batch_create(e, 1, &op->child)))
        op->child->internal = true; /* its parent counts these bytes for the peer */
    if (!rc)
        rc = mc_batch_submit_ex(op->child, &r, 1, &o);
    if (rc)
        op_end(e, op, rc, false, "file: cannot start the transfer to %s: %s", op->p->name,
               mc_last_error());
}

static void op_run(mc_engine_t *e, file_op_t *op)
{
    file_engine_t *fe = file_of(e);

    for (;;) {
        if (fe->stopping) {
            op_end(e, op, -MC_ECANCELED, false, "engine destroyed");
            return;
        }
        if (atomic_load(&op->s->task->state) >= MC_TASK_COMPLETED) { /* canceled, timed out */
            op_end(e, op, -MC_ECANCELED, false, "task ended");
            return;
        }
        if (!mc_list_empty(&fe->held) && task_failing(fe, op->s->task)) {
            op_end(e, op, -MC_ECANCELED, false, "another piece of its task failed");
            return;
        }
        if (op->step == op->n_steps) {
            op_end(e, op, 0, false, NULL);
            return;
        }
        int step = op->steps[op->step++];
        switch (step) {
        case ST_READ_L:
        case ST_WRITE_L:
        case ST_READ_R:
        case ST_WRITE_R:
            io_start(e, op, step);
            return;
        case ST_STAGE:
        case ST_COMMIT:
            ctrl_step(e, op, step);
            return;
        case ST_CHILD:
            child_start(e, op);
            return;
        case ST_RELEASE:
            release_queue(e, op);
            break;
        case ST_IPC:
            ipc_start(e, op);
            return;
        }
    }
}

/* ---- answers and lost links (noted inside tcp, acted upon from our hooks) ---- */

void mc__file_ctrl_reply(mc_engine_t *e, mc_slice_t *s, mc_link_t *l, int status, const void *ans,
                         size_t len)
{
    file_op_t *op = s->ctx;
    int step = op->steps[op->step - 1];

    (void)l;
    mc__link_unbind(&op->bound);
    op->asked = false;
    op->rstatus = status;
    if (status) {
        snprintf(op->rreason, sizeof(op->rreason), "%.*s", (int)(len < 400 ? len : 400),
                 (const char *)ans);
    } else if (step == ST_STAGE && len == 12) {
        op->lent = true;
        op->lend_addr = mc__get64(ans);
        op->lend_id = mc__get32((const uint8_t *)ans + 8);
    } else if (step == ST_STAGE) {
        op->rstatus = -MC_EPROTO;
        snprintf(op->rreason, sizeof(op->rreason), "a stage answer of %zu bytes", len);
    } else {
        op->lent = false; /* committed: the owner took its chunk back */
    }
    op->waiting = true;
    mc_list_push_back(&file_of(e)->answered, &op->link);
}

void mc__file_op_lost(mc_engine_t *e, mc_link_bound_t *b)
{
    file_op_t *op = mc_container_of(b, file_op_t, bound);

    op->asked = false;
    op->rstatus = -MC_EPEERDEAD;
    snprintf(op->rreason, sizeof(op->rreason), "the control link to %s went", op->p->name);
    op->retry = true;
    op->lent = false; /* the owner quarantines it */
    op->waiting = true;
    mc_list_push_back(&file_of(e)->answered, &op->link);
}

/* An answer, or the loss of its link. */
static void op_answered(mc_engine_t *e, file_op_t *op)
{
    int step = op->steps[op->step - 1];

    mc_list_del(&op->link);
    op->waiting = false;
    if (!op->rstatus) {
        op_run(e, op);
        return;
    }
    /* -EAGAIN: the owner lost our chunk (its link went): the slice starts over */
    op_end(e, op, op->rstatus, op->retry || op->rstatus == -EAGAIN, "%s %s: %s",
           step == ST_STAGE ? "staging at" : "committing at", op->p->name, op->rreason);
}

/* ---- releases ---- */

static void release_send(mc_engine_t *e, mc_peer_t *p)
{
    file_peer_t *fp = file_peer(p);
    mc_slice_t *s;
    mc_link_t *link;
    uint8_t *q;

    if (fp->n_release && (p->state == MC_SEGMENT_DEAD || file_of(e)->stopping)) {
        fp->n_release = 0; /* its chunks went with it */
        mc_list_del(&fp->rel_link);
    }
    if (!fp->n_release || !mc__ctrl_ready(e, p))
        return;
    s = mc__slice_alloc(e);
    q = malloc(8 + 4 * (size_t)fp->n_release);
    if (!s || !q) {
        free(q);
        if (s)
            mc__slice_free(e, s);
        return;
    }
    memset(q, 0, 8);
    q[0] = FREQ_RELEASE;
    mc__put16(q + 2, (uint16_t)fp->n_release);
    for (unsigned i = 0; i < fp->n_release; i++)
        mc__put32(q + 8 + 4 * i, fp->release[i]);
    s->kind = MC_SL_CTRL;
    s->tp = (uint8_t)mc__file_slot;
    s->payload = q;
    s->payload_len = 8 + 4 * fp->n_release;
    s->payload_owned = true; /* no ctx: the answer is not awaited */
    if (mc__ctrl_request(e, p, s, &link)) {
        mc__slice_free(e, s);
        return;
    }
    fp->n_release = 0;
    mc_list_del(&fp->rel_link);
}

static void release_queue(mc_engine_t *e, file_op_t *op)
{
    file_peer_t *fp = file_peer(op->p);

    op->lent = false;
    if (op->p->state == MC_SEGMENT_DEAD || file_of(e)->stopping)
        return;
    if (fp->n_release == FREQ_RELEASE_MAX) /* full: out now, or the oldest is dropped */
        release_send(e, op->p);
    if (fp->n_release == FREQ_RELEASE_MAX) {
        memmove(fp->release, fp->release + 1, (FREQ_RELEASE_MAX - 1) * sizeof(uint32_t));
        fp->n_release--;
    }
    if (!fp->n_release)
        mc_list_push_back(&file_of(e)->rel_peers, &fp->rel_link);
    mc__reap_mark(e, mc__file_slot);
    fp->release[fp->n_release++] = op->lend_id;
}

/* ---- starting ---- */

/* What a slice takes, by where its ends are (a staged end is a file or VRAM): our own segment
 * moves straight between a staged end and memory; a peer's staged end is staged by its owner;
 * ours goes through a chunk of ours. */
static void plan(file_op_t *op, bool self, bool lf, bool rf)
{
    static const uint8_t plans[2][3][2][4] = {
        /* a peer: [remote file][local file][read/write] */
        {{{ST_STAGE, ST_CHILD, ST_RELEASE}, {ST_STAGE, ST_CHILD, ST_COMMIT}},
         {{ST_CHILD, ST_WRITE_L}, {ST_READ_L, ST_CHILD}},
         {{ST_STAGE, ST_CHILD, ST_RELEASE, ST_WRITE_L},
          {ST_READ_L, ST_STAGE, ST_CHILD, ST_COMMIT}}},
        /* ourselves */
        {{{ST_READ_R}, {ST_WRITE_R}},
         {{ST_WRITE_L}, {ST_READ_L}},
         {{ST_READ_R, ST_WRITE_L}, {ST_READ_L, ST_WRITE_R}}},
    };
    static const uint8_t lens[2][3][2] = {{{3, 3}, {2, 2}, {4, 4}}, {{1, 1}, {1, 1}, {2, 2}}};
    int ends = rf && lf ? 2 : lf ? 1 : 0;
    int w = op->s->opcode == MC_WRITE;

    memcpy(op->steps, plans[self][ends][w], sizeof(op->steps));
    op->n_steps = lens[self][ends][w];
}

/* The memory the bytes pass through: a chunk, the task's memory, or ours at the far end. */
static void op_mem(file_op_t *op, bool lf)
{
    if (op->chunk)
        op->mem = op->chunk->mem;
    else if (!lf)
        op->mem = (uint8_t *)(uintptr_t)local_addr(op);
    else
        op->mem = (uint8_t *)(uintptr_t)remote_addr(op);
}

/* Our own segment: the far end is a buffer of ours (a file if rfile), checked as a peer's
 * request would be. */
static int self_far_end(mc_engine_t *e, file_op_t *op, bool rfile)
{
    uint64_t a = remote_addr(op);

    op->rbuf =
        rfile ? mc__mem_get_owned(e, mc__file_slot, a, op->s->len) : mc__mem_get(e, a, op->s->len);
    if (!op->rbuf)
        return mc__set_error(-MC_EACCESS, "range 0x%llx+%u is not inside a registered buffer of %s",
                             (unsigned long long)a, op->s->len, e->name);
    if (rfile && op->s->opcode == MC_WRITE && (file_buf(op->rbuf)->flags & MC_FILE_READONLY))
        return mc__set_error(-MC_EACCESS, "file %s is registered read-only",
                             file_buf(op->rbuf)->path);
    return 0;
}

/* The peer's buffer at the op's far end, copied with its IPC handle under peers_lock: a host
 * thread that adds a buffer key to the peer may move its buffer list meanwhile (peer.h). False
 * (the op ended) when its descriptor changed since the task was routed. */
static bool op_far_buffer(mc_engine_t *e, file_op_t *op, file_far_t *far)
{
    pthread_rwlock_rdlock(&e->peers_lock);
    const mc_desc_buffer_t *rb = mc__desc_find(&op->p->desc, remote_addr(op), op->s->len);
    /* (a file's part is not an IPC handle: only a memory buffer's of that length is) */
    const file_desc_ipc_t *x =
        rb && !rb->owner && rb->part_len[mc__file_slot] == sizeof(file_desc_ipc_t)
            ? mc__desc_part(&op->p->desc, rb, mc__file_slot)
            : NULL;
    if (rb)
        far->b = *rb;
    far->has_ipc = x != NULL;
    if (x)
        far->ipc = *x;
    pthread_rwlock_unlock(&e->peers_lock);
    if (!rb)
        op_end(e, op, -MC_EACCESS, false, "range 0x%llx+%u is no longer registered by %s",
               (unsigned long long)remote_addr(op), op->s->len, op->p->name);
    return rb != NULL;
}

static void op_start(mc_engine_t *e, mc_peer_t *p, mc_slice_t *s)
{
    file_op_t *op = op_alloc(e);
    file_far_t far;
    file_ipc_map_t *m;

    if (!op) {
        mc__slice_failed(e, s, -ENOMEM, true, "out of memory");
        return;
    }
    op->s = s;
    op->p = p;
    mc_list_push_back(&file_of(e)->live, &op->live);
    if (!op_far_buffer(e, op, &far))
        return;
    m = ipc_for(e, p, s->task, &far, is_self(e, p));
    if (m && m->asked) { /* its turn comes with the peer's grant */
        op->waiting = true;
        mc_list_push_back(&m->asking, &op->link);
    } else if (m) { /* same host: the peer's VRAM is opened here, no staging */
        op_ipc(e, op, m);
    } else {
        op_staged(e, op);
    }
}

/* Through our chunks and, for a peer's file or VRAM, the owner's. */
static void op_staged(mc_engine_t *e, file_op_t *op)
{
    mc_task_t *t = op->s->task;
    bool self = is_self(e, op->p), lf = file_staged(t->lbuf), rf;
    mc_slice_t *s = op->s;
    file_far_t far;

    if (!op_far_buffer(e, op, &far))
        return;
    rf = file_desc_staged(&far.b);
    plan(op, self, lf, rf);
    if (self && self_far_end(e, op, far.b.owner == mc__file_slot + 1)) {
        op_end(e, op, -MC_EACCESS, false, "%s", mc_last_error());
        return;
    }
    if (file_owned(t->lbuf) && s->opcode == MC_READ &&
        (file_buf(t->lbuf)->flags & MC_FILE_READONLY)) {
        op_end(e, op, -MC_EACCESS, false, "the local file %s is registered read-only",
               file_buf(t->lbuf)->path);
        return;
    }
    if (lf && (rf || !self) && !(op->chunk = mc__file_chunk_get(e, false))) {
        op->waiting = true; /* its turn comes when a chunk of ours is free */
        mc_list_push_back(&file_of(e)->chunk_wait, &op->link);
        return;
    }
    op_mem(op, lf);
    op_run(e, op);
}

void mc__file_fill(mc_engine_t *e, mc_peer_t *p)
{
    file_engine_t *fe = file_of(e);
    mc_slice_t *s;

    while (fe->n_ops < fe->depth && (s = mc__sched_next_slice(e, p, mc__file_slot)))
        op_start(e, p, s);
}

/* ---- hooks ---- */

/* What waited: answers, chunks of ours come free, control links come up, releases to send. */
void mc__file_ops_kick(mc_engine_t *e)
{
    file_engine_t *fe = file_of(e);
    mc_list_t *pos, *tmp, again;

    while (!mc_list_empty(&fe->answered))
        op_answered(e, mc_container_of(fe->answered.next, file_op_t, link));
    while (!mc_list_empty(&fe->chunk_wait) && !mc_list_empty(&fe->free_local)) {
        file_op_t *op = mc_container_of(mc_list_pop_front(&fe->chunk_wait), file_op_t, link);
        op->waiting = false;
        op->chunk = mc__file_chunk_get(e, false);
        op_mem(op, true);
        op_run(e, op);
    }
    mc_list_init(&again); /* those that try now and must wait again go back once */
    mc_list_splice_back(&again, &fe->ctrl_wait);
    while (!mc_list_empty(&again)) {
        file_op_t *op = mc_container_of(mc_list_pop_front(&again), file_op_t, link);
        mc_list_push_back(&fe->ctrl_wait, &op->link);
        if (op->p->state == MC_SEGMENT_DEAD || !mc__ctrl_ready(e, op->p))
            continue;
        mc_list_del(&op->link);
        op->waiting = false;
        op_run(e, op);
    }
    mc_list_for_each_safe(pos, tmp, &fe->rel_peers)
    {
        file_peer_t *fp = mc_container_of(pos, file_peer_t, rel_link);
        release_send(e, fp->peer);
    }
}

/* Ops that wait for a control link to a peer that died, or whose task ended, stop waiting. */
static void waits_end(mc_engine_t *e, mc_list_t *ops)
{
    mc_list_t *pos, *tmp;

    mc_list_for_each_safe(pos, tmp, ops)
    {
        file_op_t *op = mc_container_of(pos, file_op_t, link);
        if (op->p->state == MC_SEGMENT_DEAD)
            op_end(e, op, -MC_EPEERDEAD, false, "%s", op->p->dead_reason);
        else if (atomic_load(&op->s->task->state) >= MC_TASK_COMPLETED)
            op_end(e, op, -MC_ECANCELED, false, "task ended");
    }
}

void mc__file_ops_timers(mc_engine_t *e, uint64_t now)
{
    file_engine_t *fe = file_of(e);
    mc_list_t *pos;

    (void)now;
    waits_end(e, &fe->ctrl_wait);
    for (pos = fe->ipc_maps.next; pos != &fe->ipc_maps; pos = pos->next)
        waits_end(e, &mc_container_of(pos, file_ipc_map_t, link)->asking);
}

void mc__file_peer_gone(mc_engine_t *e, mc_peer_t *p)
{
    file_engine_t *fe = file_of(e);
    file_peer_t *fp = file_peer(p);
    mc_list_t *pos, *tmp;

    if (fp->n_release)
        mc_list_del(&fp->rel_link);
    mc_list_for_each_safe(pos, tmp, &fe->ipc_maps)
    {
        file_ipc_map_t *m = mc_container_of(pos, file_ipc_map_t, link);
        if (m->instance == p->desc.instance && !m->gone)
            ipc_let_go(e, m);
    }
}

/* Engine teardown: what waits ends now; what is in flight ends as its I/O, answer or child
 * does (each sees `stopping`). */
void mc__file_ops_stop(mc_engine_t *e)
{
    file_engine_t *fe = file_of(e);

    mc__file_ops_kick(e); /* answers and lost links noted so far */
    while (!mc_list_empty(&fe->chunk_wait))
        op_end(e, mc_container_of(fe->chunk_wait.next, file_op_t, link), -MC_ECANCELED, false,
               "engine destroyed");
    while (!mc_list_empty(&fe->ctrl_wait))
        op_end(e, mc_container_of(fe->ctrl_wait.next, file_op_t, link), -MC_ECANCELED, false,
               "engine destroyed");
    for (mc_list_t *pos = fe->ipc_maps.next; pos != &fe->ipc_maps; pos = pos->next) {
        file_ipc_map_t *m = mc_container_of(pos, file_ipc_map_t, link);
        while (!mc_list_empty(&m->asking))
            op_end(e, mc_container_of(m->asking.next, file_op_t, link), -MC_ECANCELED, false,
                   "engine destroyed");
    }
    while (!mc_list_empty(&fe->rel_peers)) {
        file_peer_t *fp = mc_container_of(fe->rel_peers.next, file_peer_t, rel_link);
        fp->n_release = 0;
        mc_list_del(&fp->rel_link);
    }
}

void mc__file_ops_fini(mc_engine_t *e)
{
    file_engine_t *fe = file_of(e);
    mc_list_t *n;

    while ((n = mc_list_pop_front(&fe->ops_free))) {
        file_op_t *op = mc_container_of(n, file_op_t, link);
        if (op->child && mc_batch_destroy(op->child))
            mc_batch_release(op->child);
        free(op);
    }
}
