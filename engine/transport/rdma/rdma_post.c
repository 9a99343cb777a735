/* RDMA transport: slices as work requests (posted in chains, one doorbell per QP per pass) and
 * their completions. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rdma_int.h"

/* The remote side of a task: its buffer in the peer's descriptor and that buffer's rkeys. */
typedef struct remote {
    const mc_desc_buffer_t *b;
    const rdma_desc_buf_t *k;
} remote_t;

/* The peer's descriptor buffer the task goes with (mc__task_rbuf: t->rbuf while the entries have
 * not moved; a key added meanwhile shifts them, and the entry the index then names may hold the
 * range too, a registration the owner dropped, whose rkey its NIC refuses), with its rkeys.
 * Caller holds peers_lock. */
static bool remote_buf(mc_peer_t *p, mc_task_t *t, remote_t *r)
{
    const mc_desc_t *d = &p->desc;
    const mc_desc_buffer_t *b = mc__task_rbuf(d, t);

    r->b = b;
    r->k = b ? mc__desc_part(d, b, mc__rdma_slot) : NULL;
    return r->k != NULL;
}

static uint64_t min3(uint64_t a, uint64_t b, uint64_t c)
{
    uint64_t m = a < b ? a : b;
    return m < c ? m : c;
}

/* Work requests a slice needs: one per piece between memory-region boundaries on either side.
 * The local side is lb (the task's buffer) at la. */
static unsigned pieces(const mc_slice_t *s, const remote_t *rb, const mc_buffer_t *lb, uint64_t la)
{
    const mc_rdma_mrs_t *m = lb->tp[mc__rdma_slot];
    uint64_t l = la - lb->addr;
    uint64_t r = s->task->req.target_offset + s->offset - rb->b->addr;
    uint64_t ln = (l + s->len - 1) / m->chunk - l / m->chunk;
    uint64_t rn = (r + s->len - 1) / rb->k->chunk - r / rb->k->chunk;

    return (unsigned)(1 + ln + rn);
}

static void post_all(mc_engine_t *e);

static void chain_append(mc_engine_t *e, mc_rdma_qp_t *qp, struct ibv_send_wr *wr)
{
    if (!qp->head) {
        qp->head = wr;
        mc_list_push_back(&rdma_of(e)->to_post, &qp->post_link);
    } else {
        qp->tail->next = wr;
    }
    qp->tail = wr;
}

/* Build the work requests of slice s on rail r, the local side being lb at la. */
static void post_slice(mc_engine_t *e, mc_peer_t *p, rdma_rail_t *r, mc_slice_t *s,
                       const remote_t *rb, const mc_buffer_t *lb, uint64_t la)
{
    mc_rdma_t *rd = rdma_of(e);
    mc_rdma_qp_t *qp = r->qp;
    mc_task_t *t = s->task;
    const mc_rdma_mrs_t *m = lb->tp[mc__rdma_slot];
    const rdma_desc_buf_t *k = rb->k;
    uint64_t ra = t->req.target_offset + s->offset, left = s->len, rbase = rb->b->addr;

    rdma_sl(s)->qp = qp;
    rdma_sl(s)->wc_err = 0;
    mc_list_push_back(&qp->posted, &rdma_sl(s)->on_qp);
    s->rails_tried |= 1u << (r - rdma_peer(p)->rails);
    while (left) {
        uint64_t lc = (la - lb->addr) / m->chunk, rc = (ra - rbase) / k->chunk;
        uint64_t n =
            min3(left, lb->addr + (lc + 1) * m->chunk - la, rbase + (rc + 1) * k->chunk - ra);
        struct ibv_sge *sge = &rd->sge[rd->n_wr];
        struct ibv_send_wr *wr = &rd->wr[rd->n_wr++];
        sge->addr = la;
        sge->length = (uint32_t)n;
        sge->lkey = m->mr[(size_t)r->ldev * m->n_chunks + lc]->lkey;
        memset(wr, 0, sizeof(*wr));
        wr->wr_id = (uintptr_t)s;
        wr->sg_list = sge;
        wr->num_sge = 1;
        wr->opcode = s->opcode == MC_WRITE ? IBV_WR_RDMA_WRITE : IBV_WR_RDMA_READ;
        wr->send_flags = IBV_SEND_SIGNALED;
        wr->wr.rdma.remote_addr = ra;
        wr->wr.rdma.rkey = k->rkey[(size_t)r->rdev * k->n_chunks + rc];
        chain_append(e, qp, wr);
        rdma_sl(s)->wrs++;
        qp->outstanding++;
        qp->dev->cq_used++;
        la += n;
        ra += n;
        left -= n;
    }
}

/* One ibv_post_send per QP for everything built this pass. */
static void post_all(mc_engine_t *e)
{
    mc_rdma_t *rd = rdma_of(e);
    mc_list_t *n;

    while ((n = mc_list_pop_front(&rd->to_post))) {
        mc_rdma_qp_t *qp = mc_container_of(n, mc_rdma_qp_t, post_link);
        struct ibv_send_wr *bad = NULL, *wr;
        mc_list_init(&qp->post_link);
        int rc = ibv_post_send(qp->qp, qp->head, &bad);
        qp->head = qp->tail = NULL;
        if (!rc)
            continue;
        /* What was not posted fails as a completion error would; the QP is unusable. */
        mc_warn("rdma: post on %s: %s", qp->rail ? qp->rail->base.name : qp->dev->name,
                strerror(rc));
        for (wr = bad; wr; wr = wr->next) {
            struct ibv_wc wc = {.wr_id = wr->wr_id, .status = IBV_WC_GENERAL_ERR};
            mc__rdma_complete(e, qp->dev, &wc);
        }
    }
    rd->n_wr = 0;
}

/* A slice of `need` work requests may start on qp: its window (MC_RDMA_QP_DEPTH) has room,
 * and its send queue and CQ hold them all. */
static bool qp_room(mc_engine_t *e, const mc_rdma_qp_t *qp, unsigned need)
{
    return qp && qp->state == QP_READY && qp->outstanding < rdma_of(e)->qp_depth &&
           qp->outstanding + need <= rdma_of(e)->qp_depth + MC_RDMA_SQ_SLACK &&
           qp->dev->cq_used + need <= qp->dev->cq_size;
}

/* Priority of a rail for a buffer at loc: the NIC matrix rank of our device, same-index device
 * pairs before crossed ones. Lower is better. */
static int rail_rank(mc_engine_t *e, rdma_rail_t *r, const char *loc)
{
    return 2 * mc__rail_rank(e, &r->base, loc) + r->crossed;
}

/* The best rank among rails with a QP that is ready or being connected: work waits the few
 * round trips a preferred rail's QP takes rather than spilling to a worse rail meanwhile. */
static int best_rank(mc_engine_t *e, rdma_peer_t *p, const char *loc)
{
    int best = 1 << 20;

    for (unsigned i = 0; i < p->n_rails; i++) {
        rdma_rail_t *r = &p->rails[i];
        int rank = r->qp && r->qp->state != QP_DRAINING ? rail_rank(e, r, loc) : 1 << 20;
        best = rank < best ? rank : best;
    }
    return best;
}

/* Set up QPs on usable rails that have none (a failover target is then ready too). */
static void connect_rails(mc_engine_t *e, mc_peer_t *p)
{
    rdma_peer_t *rp = rdma_peer(p);
    uint64_t now = mc__now_ns();

    for (unsigned i = 0; i < rp->n_rails; i++) {
        rdma_rail_t *r = &rp->rails[i];
        if (!r->qp && mc__rail_usable(&r->base, now) && now >= r->base.next_connect_ns)
            mc__rdma_rail_connect(e, p, r);
    }
}

/* Take the next slice for rail r, or fail it here if it cannot go over rdma any more. Caller
 * holds peers_lock for reading. */
static bool place_one(mc_engine_t *e, mc_peer_t *p, rdma_rail_t *r, bool *empty_p)
{
    mc_slice_t *s = mc__sched_next_slice(e, p, mc__rdma_slot);
    remote_t rb;

    *empty_p = s == NULL;
    if (!s)
        return false;
    if (!remote_buf(p, s->task, &rb)) {
        mc__slice_failed(e, s, -MC_EACCESS, false,
                         "the remote range is no longer registered by the segment");
        return true;
    }
    if (r->rdev >= rb.k->n_devs) { /* the rails predate a descriptor with fewer devices */
        mc__slice_failed(e, s, -MC_EPEERDEAD, true,
                         "the segment's descriptor no longer lists the device of this rail");
        return true;
    }
    const mc_buffer_t *lb = s->task->lbuf;
    uint64_t la = (uint64_t)(uintptr_t)s->task->req.local + s->offset;
    unsigned need = pieces(s, &rb, lb, la), most = rdma_of(e)->qp_depth + MC_RDMA_SQ_SLACK;
    most = most < MC_RDMA_SCRATCH ? most : MC_RDMA_SCRATCH;
    /* What was built goes first if the slice's requests would not all fit after it: a post that
     * fails must not end a slice half built (it may take its QP with it: r->qp is read after). */
    if (need <= most && rdma_of(e)->n_wr + need > MC_RDMA_SCRATCH)
        post_all(e);
    if (need > most || !qp_room(e, r->qp, need)) {
        if (need > most) { /* only when MC_SLICE_SIZE exceeds a memory region many times */
            mc__slice_failed(e, s, -EINVAL, false,
                             "slice crosses more memory regions than a QP's send queue holds "
                             "(MC_RDMA_QP_DEPTH + 2, at most 512)");
            return true;
        }
        /* rare: a multi-piece slice at the end of the window; it fits once the QP drains */
        mc_list_push_front(&p->q[mc__rdma_slot].retry, &s->link);
        return false;
    }
    post_slice(e, p, r, s, &rb, lb, la);
    return true;
}

/* Hand slices to READY QPs with room, one each in turn, on the best-ranked rails for the
 * buffer's location. Caller holds peers_lock for reading. */
static void fill_qps(mc_engine_t *e, mc_peer_t *p)
{
    rdma_peer_t *rp = rdma_peer(p);
    const char *loc;

    while ((loc = mc__sched_peek_location(e, p, mc__rdma_slot))) {
        int best = best_rank(e, rp, loc);
        bool took = false, empty = false;
        for (unsigned i = 0; i < rp->n_rails && !empty; i++) {
            rdma_rail_t *r = &rp->rails[i];
            if (!qp_room(e, r->qp, 1) || rail_rank(e, r, loc) > best)
                continue;
            if (!place_one(e, p, r, &empty))
                continue;
            took = true;
            if (mc__sched_peek_location(e, p, mc__rdma_slot) != loc)
                break; /* the next task may live elsewhere: rank again */
        }
        if (!took)
            return;
    }
}

/* Connects in a row that failed before a rail without a QP counts as out (rails_down_until). */
#define RAIL_OUT_CONNECTS 3

/* When one of p's rails may carry again: 0 if one may now or soon (it has a QP, connect_rails
 * would connect it, or only a connect or two failed: its tasks wait for it), else when the
 * first one's next connect is due (UINT64_MAX: never, every one is on a dead device of ours). A
 * rail is out while its device of ours is dead or its port down, or after RAIL_OUT_CONNECTS
 * failed connects (its peer's device dead, or refusing): one failure that passes (a QP the
 * target could not make just then) does not send a peer's work to a slower transport. */
static uint64_t rails_down_until(mc_engine_t *e, rdma_peer_t *rp, uint64_t now)
{
    uint64_t until = UINT64_MAX;

    for (unsigned i = 0; i < rp->n_rails; i++) {
        rdma_rail_t *r = &rp->rails[i];
        const mc_rdma_dev_t *d = &rdma_of(e)->devs[r->ldev];
        if (r->qp && r->qp->state != QP_DRAINING)
            return 0;
        if (d->fatal)
            continue;
        if ((!d->port_down && r->base.connect_failures < RAIL_OUT_CONNECTS) ||
            (mc__rail_usable(&r->base, now) && now >= r->base.next_connect_ns))
            return 0;
        until = r->base.next_connect_ns < until ? r->base.next_connect_ns : until;
    }
    return until;
}

/* No rail to p can carry now: its tasks go to the next transport of its order (tcp) until one
 * connects again (mc__rdma_ctrl_reply), and rdma_accept sends new ones there meanwhile; once
 * a rail may connect again, the next task routed here probes it. A task no other transport
 * takes (VRAM without staging) stays, as before, until a rail is back or its timeout. */
static void rails_down(mc_engine_t *e, mc_peer_t *p, uint64_t until)
{
    rdma_peer_t *rp = rdma_peer(p);

    if (!atomic_exchange(&rp->down_until, until))
        mc_warn("rdma: no rail to %s is up%s: its transfers go over the next transport until one "
                "is",
                p->name, until == UINT64_MAX ? " (our devices that reach it are dead)" : "");
    mc__sched_move(e, p, mc__rdma_slot);
}

void mc__rdma_fill(mc_engine_t *e, mc_peer_t *p)
{
    uint64_t down;

    if (!rdma_peer(p)) /* rails are built once: tasks come here only when it has some */
        return;
    if (p->msg_tp == mc__rdma_slot)
        mc__rdma_msg_fill(e, p);
    /* Rails without a QP get one first (a re-probed rail rejoins even under a light load, and
     * a failover target is ready). Outside peers_lock: a failed connect may reload p->desc. */
    connect_rails(e, p);
    if ((down = rails_down_until(e, rdma_peer(p), mc__now_ns()))) {
        rails_down(e, p, down);
        return;
    }
    /* The buffer list may grow from another thread (a buffer key): read it under the lock. */
    pthread_rwlock_rdlock(&e->peers_lock);
    fill_qps(e, p);
    pthread_rwlock_unlock(&e->peers_lock);
    post_all(e);
}

/* ---- completions ---- */

/* The remote NIC refused the access (bad rkey or range) or the request: retrying elsewhere
 * cannot help, and the rail is not at fault. */
static bool request_error(enum ibv_wc_status st)
{
    return st == IBV_WC_REM_ACCESS_ERR || st == IBV_WC_REM_INV_REQ_ERR ||
           st == IBV_WC_LOC_PROT_ERR || st == IBV_WC_LOC_LEN_ERR || st == IBV_WC_REM_OP_ERR;
}

static void slice_error(mc_slice_t *s, const struct ibv_wc *wc)
{
    rdma_slice_t *rs = rdma_sl(s);

    if (rs->wc_err && wc->status == IBV_WC_WR_FLUSH_ERR)
        return; /* keep the cause, not the flush that followed it */
    rs->wc_err = request_error(wc->status) ? -MC_EACCESS : -MC_EPEERDEAD;
    rs->wc_reason = ibv_wc_status_str(wc->status);
}

static void slice_end(mc_engine_t *e, mc_slice_t *s, rdma_rail_t *r)
{
    rdma_slice_t *rs = rdma_sl(s);
    mc_task_t *t = s->task;
    char why[512];

    if (!rs->wc_err) {
        mc__rail_moved(&r->base, s->len);
        mc__slice_done(e, s);
        return;
    }
    snprintf(why, sizeof(why), "rail %s: RDMA %s of 0x%llx+%u at segment %s: %s", r->base.name,
             s->opcode == MC_WRITE ? "WRITE" : "READ",
             (unsigned long long)(t->req.target_offset + s->offset), s->len, t->peer->name,
             rs->wc_reason);
    if (rs->wc_err == -MC_EACCESS)
        strncat(why,
                " (the target's NIC refused the key or range: stale descriptor, unregistered "
                "memory, or memory mapped without write permission there)",
                sizeof(why) - strlen(why) - 1);
    mc__slice_failed(e, s, rs->wc_err, rs->wc_err != -MC_EACCESS, why);
}

void mc__rdma_complete(mc_engine_t *e, mc_rdma_dev_t *dev, const struct ibv_wc *wc)
{
    if (wc->wr_id & MC_RDMA_WR_KIND) {
        mc__rdma_msg_complete(e, dev, wc);
        return;
    }
    mc_slice_t *s = (mc_slice_t *)(uintptr_t)wc->wr_id;
    mc_rdma_qp_t *qp = rdma_sl(s)->qp;
    rdma_rail_t *r = qp->rail;

    if (rdma_sl(s)->wrs == 1) /* its last: off the QP before the QP may go */
        mc_list_del(&rdma_sl(s)->on_qp);
    qp->outstanding--;
    dev->cq_used--;
    if (wc->status != IBV_WC_SUCCESS) {
        slice_error(s, wc);
        if (qp->state != QP_DRAINING) {
            /* The first error of a QP: it is in ERR now. Charge the rail unless the request
             * itself was at fault; flushed requests follow and are retried. */
            mc_warn("rdma: rail %s to %s: %s", r->base.name, qp->peer->name,
                    ibv_wc_status_str(wc->status));
            if (!request_error(wc->status))
                mc__rdma_rail_failed(qp->peer, r, false);
            mc__rdma_qp_drain(e, qp); /* may free qp: not used below */
        } else if (!mc__rdma_qp_busy(qp)) {
            mc__rdma_qp_destroy(e, qp);
        }
    } else if (qp->state == QP_DRAINING && !mc__rdma_qp_busy(qp)) {
        mc__rdma_qp_destroy(e, qp);
    }
    if (--rdma_sl(s)->wrs == 0)
        slice_end(e, s, r);
}

/* A READ of t that times out or fails with requests on a QP: the QP goes to ERR before the task
 * ends, so that the answers still to come are dropped by the NIC instead of written into memory
 * the host may have reused (tcp drops them on arrival). The QP's other slices flush and go
 * elsewhere, as after any QP failure, without charging the rail. */
void mc__rdma_abandon(mc_engine_t *e, mc_task_t *t)
{
    rdma_peer_t *rp = rdma_peer(t->peer);

    if (!rp || t->req.opcode != MC_READ)
        return;
    for (unsigned i = 0; i < rp->n_rails; i++) {
        mc_rdma_qp_t *qp = rp->rails[i].qp;
        mc_list_t *pos;
        if (!qp || qp->state == QP_DRAINING)
            continue;
        for (pos = qp->posted.next; pos != &qp->posted; pos = pos->next)
            if (rdma_sl_of(pos)->task == t) {
                mc_info("rdma: rail %s to %s: a READ ended before its answers came: its QP "
                        "goes, so that they are dropped",
                        rp->rails[i].base.name, t->peer->name);
                mc__rdma_qp_drain(e, qp);
                break;
            }
    }
}

/* Engine teardown: every QP is draining (their control links are closed); collect the flushed
 * requests so their tasks release, then destroy what is left. */
void mc__rdma_drain_all(mc_engine_t *e)
{
    mc_rdma_t *rd = rdma_of(e);
    mc_list_t *pos, *tmp;
    uint64_t deadline = mc__now_ns() + 2000 * MC_MS;

    mc_list_for_each_safe(pos, tmp, &rd->qps)
        mc__rdma_qp_drain(e, mc_container_of(pos, mc_rdma_qp_t, link));
    while (!mc_list_empty(&rd->qps) && mc__now_ns() < deadline) {
        for (unsigned i = 0; i < rd->n_devs; i++) {
            struct ibv_wc wc[32];
            int n = rd->devs[i].fatal ? 0 : ibv_poll_cq(rd->devs[i].cq, 32, wc);
            for (int j = 0; j < n; j++)
                mc__rdma_complete(e, &rd->devs[i], &wc[j]);
        }
    }
    if (!mc_list_empty(&rd->qps))
        mc_warn("rdma: QPs still hold work requests after 2 s; their slices are leaked");
}
