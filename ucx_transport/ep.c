/* Endpoints: an open segment of the peer's engine and the peer interface's id. Active messages
 * are engine messages; put and get are READ/WRITE tasks (short and bcopy ones through the
 * interface's bounce slots); flush is mc_peer_flush; fence holds new operations until the
 * endpoint's earlier ones are remotely complete. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "uct_mc.h"
#include <uct/base/uct_iov.inl>

/* ---- the pending queue: a list threaded through the requests' priv space ---- */

typedef struct pending_priv {
    uct_pending_req_t *next;
    uct_mc_ep_t *ep;
    bool fence; /* a fence came after it: it takes effect once this request went */
} pending_priv_t;

_Static_assert(sizeof(pending_priv_t) <= UCT_PENDING_REQ_PRIV_LEN, "pending priv space");

static pending_priv_t *priv(uct_pending_req_t *req)
{
    return (pending_priv_t *)req->priv;
}

/* Whether a fence holds ep's new operations: what came before is not remotely complete. */
static bool fence_holds(const uct_mc_ep_t *ep)
{
    return ep->fence && (ep->refs || ep->dirty);
}

/* Whether ep takes no new operation this round, not even from its turn in the pending queue:
 * its peer's message window was full, or a fence holds them, or a message it took waits to be
 * sent (am_stash). */
static bool ep_waits(const uct_mc_ep_t *ep)
{
    return ep->blocked_round == ep->iface->round || fence_holds(ep) || ep->stash;
}

/* ep_waits, or requests of ep wait in the pending queue (outside their dispatch: a new
 * operation would overtake them). */
static bool ep_held(uct_mc_ep_t *ep)
{
    return ep_waits(ep) || (ep->n_pending && !ep->iface->dispatching);
}

static void ep_block(uct_mc_ep_t *ep)
{
    ep->blocked_round = ep->iface->round;
}

static void fence_now(uct_mc_ep_t *ep);

ucs_status_t uct_mc_ep_pending_add(uct_ep_h tl_ep, uct_pending_req_t *req, unsigned flags)
{
    uct_mc_ep_t *ep = ucs_derived_of(tl_ep, uct_mc_ep_t);
    uct_mc_iface_t *iface = ep->iface;

    (void)flags;
    if (!iface->blocked && !ep_held(ep))
        return UCS_ERR_BUSY; /* resources are there: send now */
    priv(req)->next = NULL;
    priv(req)->ep = ep;
    priv(req)->fence = false;
    *iface->pending_tail = req;
    iface->pending_tail = &priv(req)->next;
    ep->n_pending++;
    ep->pending_last = req;
    return UCS_OK;
}

/* Out of the queue first, then the callbacks: a callback may add requests (UCP completes
 * the purged ones, and its user may send on another endpoint). A purge from a request's func
 * (dispatch) keeps dispatch's place true. */
void uct_mc_ep_pending_purge(uct_ep_h tl_ep, uct_pending_purge_callback_t cb, void *arg)
{
    uct_mc_ep_t *ep = ucs_derived_of(tl_ep, uct_mc_ep_t);
    uct_mc_iface_t *iface = ep->iface;
    uct_pending_req_t **pp = &iface->pending_head, *prev = NULL, *gone = NULL, **gone_tail = &gone;

    while (*pp) {
        uct_pending_req_t *req = *pp;
        if (priv(req)->ep != ep) {
            prev = req;
            pp = &priv(req)->next;
            continue;
        }
        *pp = priv(req)->next;
        if (iface->pending_tail == &priv(req)->next)
            iface->pending_tail = pp;
        if (iface->dispatch_kept == req)
            iface->dispatch_kept = prev;
        if (iface->dispatch_current == req)
            iface->dispatch_current = NULL;
        ep->n_pending--;
        if (priv(req)->fence) /* what comes later still waits for what went before */
            ep->fence = true;
        priv(req)->next = NULL;
        *gone_tail = req;
        gone_tail = &priv(req)->next;
    }
    while (gone) {
        uct_pending_req_t *req = gone;
        gone = priv(req)->next;
        if (cb)
            cb(req, arg);
    }
}

static void cover_messages(uct_mc_ep_t *ep);

/* Where dispatch is: the next pointer of the last request it kept. */
static uct_pending_req_t **dispatch_at(uct_mc_iface_t *iface)
{
    return iface->dispatch_kept ? &priv(iface->dispatch_kept)->next : &iface->pending_head;
}

/* From progress: each request in order, skipping endpoints that could not take one this round
 * (their order holds), until an interface-wide resource runs out. UCS_OK: done, out of the
 * queue, and a fence that came after it takes effect now, before the endpoint's next request;
 * anything else (INPROGRESS: part of it went) keeps it for a later round. A func may purge
 * any endpoint's requests, its own too, and add requests (at the tail). */
void uct_mc_pending_dispatch(uct_mc_iface_t *iface)
{
    uct_pending_req_t **pp, *req;

    iface->dispatching = true;
    iface->dispatch_kept = NULL;
    while (!iface->blocked && (req = *(pp = dispatch_at(iface)))) {
        uct_mc_ep_t *ep = priv(req)->ep;
        ucs_status_t st = UCS_ERR_NO_RESOURCE;
        if (!ep_waits(ep)) {
            iface->dispatch_current = req;
            st = req->func(req);
            if (!iface->dispatch_current)
                continue; /* purged meanwhile (its endpoint may be gone) */
            iface->dispatch_current = NULL;
            pp = dispatch_at(iface); /* (a purge may have moved the kept one back) */
        } else if (fence_holds(ep)) {
            cover_messages(ep); /* a message sent since the fence's flush needs one of its own */
        }
        if (st == UCS_OK) {
            *pp = priv(req)->next;
            if (iface->pending_tail == &priv(req)->next)
                iface->pending_tail = pp;
            ep->n_pending--;
            if (priv(req)->fence)
                fence_now(ep);
            continue;
        }
        ep_block(ep); /* its later requests wait behind this one */
        iface->dispatch_kept = req;
    }
    iface->dispatching = false;
}

/* ---- active messages taken while the peer's window was full ---- */

static void stash_drop(uct_mc_ep_t *ep)
{
    if (!ep->stash)
        return;
    free(ep->stash);
    ep->stash = NULL;
    ep->iface->n_stashed--;
}

/* ---- lifetime ---- */

ucs_status_t uct_mc_ep_create(const uct_ep_params_t *params, uct_ep_h *ep_p)
{
    uct_mc_iface_t *iface = ucs_derived_of(params->iface, uct_mc_iface_t);
    const uint8_t *a = (const uint8_t *)params->iface_addr;
    uct_mc_ep_t *ep;
    int rc;

    if (!(params->field_mask & UCT_EP_PARAM_FIELD_IFACE_ADDR) || !a) {
        ucs_error("mooncake: an endpoint needs the peer interface's address");
        return UCS_ERR_INVALID_PARAM;
    }
    ep = calloc(1, sizeof(*ep));
    if (!ep)
        return UCS_ERR_NO_MEMORY;
    rc = UCS_CLASS_INIT(uct_base_ep_t, &ep->super, &iface->super);
    if (rc != UCS_OK) {
        free(ep);
        return (ucs_status_t)rc;
    }
    rc = a[6] <= MC_ADDRESS_MAX
             ? mc_segment_open_address(iface->md->engine, a + UCT_MC_ADDR_HDR, a[6], &ep->seg)
             : -MC_EPROTO;
    if (rc) {
        ucs_error("mooncake: connecting to a peer interface: %s",
                  rc == -MC_EPROTO ? "not an interface address" : mc_last_error());
        free(ep);
        return uct_mc_status(rc);
    }
    ep->iface = iface;
    memcpy(ep->peer_hdr, a, 6); /* its id and nonce start every active message to it */
    ep->next = iface->eps;
    iface->eps = ep;
    *ep_p = &ep->super.super;
    return UCS_OK;
}

static void ep_free(uct_mc_ep_t *ep)
{
    for (uct_mc_ep_t **pp = &ep->iface->zombies; *pp; pp = &(*pp)->next)
        if (*pp == ep) {
            *pp = ep->next;
            break;
        }
    uct_mc_md_defer_close(ep->iface->md, ep->seg);
    free(ep);
}

/* Flushes waiting complete as canceled now (what they wait for guards no buffer). */
static void flushes_cancel(uct_mc_ep_t *ep)
{
    for (uct_mc_flush_t *f = ep->flushes; f; f = f->ep_next) {
        uct_completion_t *comp = f->comp;
        f->comp = NULL;
        if (comp)
            uct_invoke_completion(comp, UCS_ERR_CANCELED);
    }
}

/* At destroy: operations and flushes in flight complete as canceled now (the engine still
 * finishes the tasks: a get's buffer may be written until then; UCP's force close cancels them
 * with a flush first, which waits for that: uct_mc_ep_flush). */
static void ep_cancel(uct_mc_ep_t *ep)
{
    stash_drop(ep);
    for (uct_mc_op_t *op = ep->ops; op; op = op->ep_next) {
        uct_completion_t *comp = op->comp;
        op->comp = NULL;
        op->unpack_cb = NULL;
        if (comp)
            uct_invoke_completion(comp, UCS_ERR_CANCELED);
    }
    flushes_cancel(ep);
    if (ep->cancel_comp) {
        uct_completion_t *comp = ep->cancel_comp;
        ep->cancel_comp = NULL;
        uct_invoke_completion(comp, UCS_ERR_CANCELED);
    }
}

/* Operations still in flight complete as canceled now; the endpoint's memory goes when the
 * engine has let go of them. */
void uct_mc_ep_destroy(uct_ep_h tl_ep)
{
    uct_mc_ep_t *ep = ucs_derived_of(tl_ep, uct_mc_ep_t);
    uct_mc_iface_t *iface = ep->iface;

    for (uct_mc_ep_t **pp = &iface->eps; *pp; pp = &(*pp)->next)
        if (*pp == ep) {
            *pp = ep->next;
            break;
        }
    uct_mc_ep_pending_purge(tl_ep, NULL, NULL);
    ep_cancel(ep);
    ep->destroyed = true;
    if (!ep->refs) {
        ep_free(ep);
        return;
    }
    ep->next = iface->zombies;
    iface->zombies = ep;
}

void uct_mc_ep_orphan_all(uct_mc_iface_t *iface)
{
    while (iface->eps)
        uct_mc_ep_destroy(&iface->eps->super.super);
}

static void ep_unref(uct_mc_ep_t *ep)
{
    if (--ep->refs == 0 && ep->destroyed)
        ep_free(ep);
}

static void op_unlink(uct_mc_ep_t *ep, uct_mc_op_t *op)
{
    if (op->ep_prev)
        op->ep_prev->ep_next = op->ep_next;
    else
        ep->ops = op->ep_next;
    if (op->ep_next)
        op->ep_next->ep_prev = op->ep_prev;
}

/* The closing interface left to the engine the tasks it still holds (caller holds the
 * interface's lock, under which their callbacks now free the ops): their ops leave their
 * endpoints, all destroyed by now. uct_mc_ep_free_zombies frees those nothing holds then. */
void uct_mc_ep_leave_ops(uct_mc_iface_t *iface)
{
    for (uct_mc_ep_t *ep = iface->zombies; ep; ep = ep->next)
        for (uct_mc_op_t *op = ep->ops, *next; op; op = next) {
            next = op->ep_next;
            if (!op->tasks_left) /* complete: its event is queued */
                continue;
            op_unlink(ep, op);
            ep->refs--;
        }
}

void uct_mc_ep_free_zombies(uct_mc_iface_t *iface)
{
    for (uct_mc_ep_t *ep = iface->zombies, *next; ep; ep = next) {
        next = ep->next;
        if (!ep->refs)
            ep_free(ep);
    }
}

/* ---- failures ---- */

static void ep_fail(uct_mc_ep_t *ep, ucs_status_t status)
{
    if (ep->failed || ep->destroyed)
        return;
    ep->failed = true;
    ep->fail_status = status;
    uct_iface_handle_ep_err(&ep->iface->super.super, &ep->super.super, status);
}

void uct_mc_ep_peer_failed(uct_mc_iface_t *iface, mc_segment_id_t seg, const uint8_t *hdr,
                           ucs_status_t status)
{
    /* the handler may destroy endpoints: one at a time, from the start of the list again */
    for (bool again = true; again;) {
        again = false;
        for (uct_mc_ep_t *ep = iface->eps; ep; ep = ep->next)
            if (ep->seg == seg && !ep->failed && (!hdr || !memcmp(ep->peer_hdr, hdr, 6))) {
                ep_fail(ep, status);
                again = true;
                break;
            }
    }
}

static void sent_one(uct_mc_ep_t *ep)
{
    ep->dirty = true;
    ep->sent++;
}

/* From progress, before the pending queue: stashed messages go first, each before anything
 * else of its endpoint. One the engine refuses for good fails its endpoint, as a failed write
 * does (it was taken: UCP saw it sent). */
void uct_mc_ep_send_stashed(uct_mc_iface_t *iface)
{
    for (uct_mc_ep_t *ep = iface->eps; ep && iface->n_stashed; ep = ep->next) {
        int rc;
        if (!ep->stash)
            continue;
        rc = ep->failed
                 ? 0
                 : mc_msg_send(iface->md->engine, ep->seg, MC_UCT_MSG_ID, ep->stash, ep->stash_len);
        if (rc == -EAGAIN)
            continue;
        stash_drop(ep);
        if (!rc && !ep->failed) {
            sent_one(ep);
        } else if (rc) {
            ucs_debug("mooncake: an active message taken earlier: %s", mc_last_error());
            ep_fail(ep, uct_mc_status(rc));
            return; /* its handler may have destroyed endpoints: the others next time */
        }
    }
}

/* Reported from progress, as every failure is (the handler may destroy endpoints, and UCP
 * walks its endpoints while it checks them). */
ucs_status_t uct_mc_ep_check(uct_ep_h tl_ep, unsigned flags, uct_completion_t *comp)
{
    uct_mc_ep_t *ep = ucs_derived_of(tl_ep, uct_mc_ep_t);
    uct_mc_peer_ev_t *ev;

    (void)flags;
    (void)comp;
    if (ep->failed || mc_segment_state(ep->iface->md->engine, ep->seg) != MC_SEGMENT_DEAD)
        return UCS_OK;
    ev = malloc(sizeof(*ev));
    if (!ev)
        return UCS_ERR_NO_MEMORY;
    *ev = (uct_mc_peer_ev_t){.ev.kind = EV_PEER, .seg = ep->seg, .event = MC_PEER_DEAD};
    uct_mc_iface_queue(ep->iface, &ev->ev);
    return UCS_OK;
}

/* ---- what every operation checks first ---- */

static ucs_status_t flush_start(uct_mc_ep_t *ep, uct_completion_t *comp);

/* Messages sent since the last flush that covers them are remotely complete only once such a
 * flush ends: start one unless one is on its way. */
static void cover_messages(uct_mc_ep_t *ep)
{
    if (ep->dirty && !(ep->flushes && ep->flushes->gen == ep->sent))
        flush_start(ep, NULL);
}

static ucs_status_t ep_ready(uct_mc_ep_t *ep)
{
    if (ep->failed)
        return ep->fail_status;
    if (fence_holds(ep)) {
        cover_messages(ep);
        ep_block(ep);
        return UCS_ERR_NO_RESOURCE;
    }
    ep->fence = false;
    if (ep_held(ep)) {
        ep_block(ep);
        return UCS_ERR_NO_RESOURCE;
    }
    return UCS_OK;
}

/* ---- active messages ---- */

static ucs_status_t am_send(uct_mc_ep_t *ep, uint8_t id, size_t len)
{
    uct_mc_iface_t *iface = ep->iface;
    uint8_t *h = (uint8_t *)iface->tx;
    int rc;

    memcpy(h, ep->peer_hdr, 6);
    h[6] = id;
    rc = mc_msg_send(iface->md->engine, ep->seg, MC_UCT_MSG_ID, h, UCT_MC_AM_HDR + len);
    if (rc == -EAGAIN) { /* this peer's window is full */
        ep_block(ep);
        return UCS_ERR_NO_RESOURCE;
    }
    if (rc) {
        ucs_debug("mooncake: active message %u: %s", id, mc_last_error());
        return uct_mc_status(rc);
    }
    sent_one(ep);
    return UCS_OK;
}

/* A put UCT was told complete (the engine let go of its source: over tcp its bytes are in the
 * kernel) that its target has not taken yet. */
static bool puts_landing(const uct_mc_ep_t *ep)
{
    for (const uct_mc_op_t *op = ep->ops; op; op = op->ep_next)
        if (op->write && op->sent)
            return true;
    return false;
}

static ucs_status_t am_check(uct_mc_ep_t *ep, uint8_t id, size_t len)
{
    ucs_status_t st = ep_ready(ep);

    if (st != UCS_OK)
        return st;
    /* A message travels apart from the data (the engine's message path): one sent now could
     * reach the peer before such a put's bytes, and UCP's rendezvous by put sends "the data is
     * there" as soon as its put completed (UCX's tcp gets away with it: one socket). It waits
     * until they landed, in the pending queue. */
    if (puts_landing(ep)) {
        ep_block(ep);
        return UCS_ERR_NO_RESOURCE;
    }
    if (id >= UCT_AM_ID_MAX || len > ep->iface->am_max) {
        ucs_error("mooncake: active message %u of %zu bytes (at most %zu)", id, len,
                  ep->iface->am_max);
        return UCS_ERR_INVALID_PARAM;
    }
    return UCS_OK;
}

ucs_status_t uct_mc_ep_am_short(uct_ep_h tl_ep, uint8_t id, uint64_t header, const void *payload,
                                unsigned length)
{
    uct_mc_ep_t *ep = ucs_derived_of(tl_ep, uct_mc_ep_t);
    char *d = ep->iface->tx + UCT_MC_AM_HDR;

    ucs_status_t st = am_check(ep, id, sizeof(header) + length);

    if (st != UCS_OK)
        return st;
    memcpy(d, &header, sizeof(header));
    memcpy(d + sizeof(header), payload, length);
    return am_send(ep, id, sizeof(header) + length);
}

/* The peer's window was full for a message already packed: the pack callback ran (it may have
 * moved its caller's state on), so the message is taken all the same and goes first once the
 * window has room (uct_mc_ep_send_stashed). Until then the endpoint takes nothing new: every
 * check that can refuse runs before the pack callback. */
static ucs_status_t am_stash(uct_mc_ep_t *ep, size_t len)
{
    size_t n = UCT_MC_AM_HDR + len;

    ep->stash = malloc(n);
    if (!ep->stash)
        return UCS_ERR_NO_MEMORY;
    memcpy(ep->stash, ep->iface->tx, n);
    ep->stash_len = n;
    ep->iface->n_stashed++;
    return UCS_OK;
}

ssize_t uct_mc_ep_am_bcopy(uct_ep_h tl_ep, uint8_t id, uct_pack_callback_t pack_cb, void *arg,
                           unsigned flags)
{
    uct_mc_ep_t *ep = ucs_derived_of(tl_ep, uct_mc_ep_t);
    size_t len;
    ucs_status_t st;

    (void)flags;
    st = am_check(ep, id, 0);
    if (st != UCS_OK)
        return st;
    len = pack_cb(ep->iface->tx + UCT_MC_AM_HDR, arg);
    if (len > ep->iface->am_max) {
        ucs_error("mooncake: am_bcopy packed %zu bytes (at most %zu)", len, ep->iface->am_max);
        return UCS_ERR_INVALID_PARAM;
    }
    st = am_send(ep, id, len);
    if (st == UCS_ERR_NO_RESOURCE)
        st = am_stash(ep, len);
    return st == UCS_OK ? (ssize_t)len : st;
}

/* The data is copied into the message: complete at once. */
ucs_status_t uct_mc_ep_am_zcopy(uct_ep_h tl_ep, uint8_t id, const void *header,
                                unsigned header_length, const uct_iov_t *iov, size_t iovcnt,
                                unsigned flags, uct_completion_t *comp)
{
    uct_mc_ep_t *ep = ucs_derived_of(tl_ep, uct_mc_ep_t);
    char *d = ep->iface->tx + UCT_MC_AM_HDR;
    size_t len = header_length;

    ucs_status_t st = am_check(ep, id, header_length + uct_iov_total_length(iov, iovcnt));

    (void)flags;
    (void)comp;
    if (st != UCS_OK)
        return st;
    memcpy(d, header, header_length);
    for (size_t i = 0; i < iovcnt; i++)
        for (unsigned c = 0; c < iov[i].count; c++) {
            memcpy(d + len, (const char *)iov[i].buffer + c * iov[i].stride, iov[i].length);
            len += iov[i].length;
        }
    return am_send(ep, id, len);
}

/* ---- put and get ---- */

/* Make the buffer the key describes usable in the endpoint's segment, and the one a request
 * into its bytes goes with: added at every use (cheap while it is the last key added), since
 * a key added later for some of the same bytes (another registration of the peer's, which may
 * be gone by now) would be taken first. */
static ucs_status_t add_rkey(uct_mc_ep_t *ep, uct_rkey_t tl_rkey)
{
    uct_mc_rkey_t *rkey = (uct_mc_rkey_t *)tl_rkey;
    int rc = mc_segment_add_buffer(ep->iface->md->engine, ep->seg, rkey->key, sizeof(rkey->key));

    if (rc) {
        ucs_error("mooncake: a remote key this peer cannot use: %s", mc_last_error());
        return UCS_ERR_INVALID_PARAM;
    }
    return UCS_OK;
}

static uct_mc_op_t *op_new(uct_mc_ep_t *ep, uct_completion_t *comp)
{
    uct_mc_op_t *op = calloc(1, sizeof(*op));

    if (!op)
        return NULL;
    op->ep = ep;
    op->comp = comp;
    op->slot = -1;
    return op;
}

/* Submit the op's requests; on success the endpoint holds it until it is delivered. */
static ucs_status_t op_start(uct_mc_ep_t *ep, uct_mc_op_t *op, mc_request_t *reqs, unsigned n,
                             uint64_t raddr, uint64_t rlen)
{
    uct_mc_iface_t *iface = ep->iface;
    ucs_status_t st = uct_mc_iface_submit(iface, op, reqs, n);

    if (st != UCS_OK)
        return st;
    op->raddr = raddr;
    op->rlen = rlen;
    op->write = reqs[0].opcode == MC_WRITE;
    if (!ep->ops || raddr < ep->span_lo)
        ep->span_lo = raddr;
    if (!ep->ops || raddr + rlen > ep->span_hi)
        ep->span_hi = raddr + rlen;
    op->ntasks = n;
    op->ep_prev = NULL;
    op->ep_next = ep->ops;
    if (ep->ops)
        ep->ops->ep_prev = op;
    ep->ops = op;
    ep->refs++;
    return UCS_OK;
}

/* Overlapping operations of one endpoint happen in the order issued, as on one RDMA queue
 * pair (the engine stripes a task over connections and rails, and tasks overtake each other):
 * one that overlaps a write in flight, or writes over a read in flight, waits for it. Not for a
 * write whose source the engine let go of: it is complete, or ahead of whatever is issued now
 * on tcp's ordered connection (MC_SUBMIT_ORDERED sends the next ones there too, as tcp carries
 * all the host memory this module registers). Cheap unless the range falls inside the span of
 * what is in flight. */
static bool rma_conflict(uct_mc_ep_t *ep, uint64_t raddr, uint64_t len, bool write)
{
    if (!ep->ops || raddr >= ep->span_hi || raddr + len <= ep->span_lo)
        return false;
    for (uct_mc_op_t *op = ep->ops; op; op = op->ep_next)
        if ((op->write ? !op->sent : write) && raddr < op->raddr + op->rlen &&
            op->raddr < raddr + len)
            return true;
    return false;
}

static ucs_status_t rma_begin(uct_mc_ep_t *ep, uct_rkey_t rkey, unsigned tasks)
{
    ucs_status_t st = ep_ready(ep);

    if (st == UCS_OK)
        st = uct_mc_iface_reserve(ep->iface, tasks);
    if (st == UCS_OK)
        st = add_rkey(ep, rkey);
    return st;
}

/* A put or get through a bounce slot; data == NULL: pack_cb fills it. Every check that can
 * refuse it runs first: a pack callback runs only for a put that goes. Its length is known
 * only then, so a slot's worth of bytes stands for it in the check against operations in
 * flight. */
static ssize_t bounce_op(uct_mc_ep_t *ep, mc_opcode_t opcode, const void *data, size_t length,
                         uct_pack_callback_t pack_cb, void *pack_arg, uint64_t remote_addr,
                         uct_rkey_t rkey, uct_mc_op_t *op)
{
    uct_mc_iface_t *iface = ep->iface;
    bool packed = opcode == MC_WRITE && !data;
    ucs_status_t st = rma_begin(ep, rkey, 1);
    char *buf;
    int slot;

    if (st != UCS_OK)
        goto err;
    if (!packed && length > iface->config.seg_size) {
        ucs_error("mooncake: %zu bytes through a bounce slot of %zu", length,
                  iface->config.seg_size);
        st = UCS_ERR_INVALID_PARAM;
        goto err;
    }
    if (rma_conflict(ep, remote_addr, packed ? iface->config.seg_size : length,
                     opcode == MC_WRITE)) {
        ep_block(ep);
        st = UCS_ERR_NO_RESOURCE;
        goto err;
    }
    slot = uct_mc_iface_slot_get(iface);
    if (slot < 0) {
        st = UCS_ERR_NO_RESOURCE;
        goto err;
    }
    buf = iface->bounce + (size_t)slot * iface->config.seg_size;
    if (packed) {
        length = pack_cb(buf, pack_arg);
        if (length > iface->config.seg_size) {
            ucs_error("mooncake: put_bcopy packed %zu bytes into a bounce slot of %zu", length,
                      iface->config.seg_size);
            st = UCS_ERR_INVALID_PARAM;
            goto err_slot;
        }
    } else if (opcode == MC_WRITE) {
        memcpy(buf, data, length);
    }
    op->slot = slot;
    op->length = length;
    mc_request_t req = {.opcode = opcode,
                        .local = buf,
                        .target = ep->seg,
                        .target_offset = remote_addr,
                        .length = length};
    st = op_start(ep, op, &req, 1, remote_addr, length);
    if (st != UCS_OK)
        goto err_slot;
    return (ssize_t)length;

err_slot:
    uct_mc_iface_slot_put(iface, slot);
err:
    free(op);
    return st;
}

ucs_status_t uct_mc_ep_put_short(uct_ep_h tl_ep, const void *buffer, unsigned length,
                                 uint64_t remote_addr, uct_rkey_t rkey)
{
    uct_mc_ep_t *ep = ucs_derived_of(tl_ep, uct_mc_ep_t);
    uct_mc_op_t *op = op_new(ep, NULL);
    ssize_t n;

    if (!op)
        return UCS_ERR_NO_MEMORY;
    if (!length) {
        free(op);
        return UCS_OK;
    }
    n = bounce_op(ep, MC_WRITE, buffer, length, NULL, NULL, remote_addr, rkey, op);
    return n < 0 ? (ucs_status_t)n : UCS_OK;
}

ssize_t uct_mc_ep_put_bcopy(uct_ep_h tl_ep, uct_pack_callback_t pack_cb, void *arg,
                            uint64_t remote_addr, uct_rkey_t rkey)
{
    uct_mc_ep_t *ep = ucs_derived_of(tl_ep, uct_mc_ep_t);
    uct_mc_op_t *op = op_new(ep, NULL);

    if (!op)
        return UCS_ERR_NO_MEMORY;
    return bounce_op(ep, MC_WRITE, NULL, 0, pack_cb, arg, remote_addr, rkey, op);
}

ucs_status_t uct_mc_ep_get_bcopy(uct_ep_h tl_ep, uct_unpack_callback_t unpack_cb, void *arg,
                                 size_t length, uint64_t remote_addr, uct_rkey_t rkey,
                                 uct_completion_t *comp)
{
    uct_mc_ep_t *ep = ucs_derived_of(tl_ep, uct_mc_ep_t);
    uct_mc_op_t *op = op_new(ep, comp);
    ssize_t n;

    if (!op)
        return UCS_ERR_NO_MEMORY;
    op->unpack_cb = unpack_cb;
    op->unpack_arg = arg;
    n = bounce_op(ep, MC_READ, NULL, length, NULL, NULL, remote_addr, rkey, op);
    return n < 0 ? (ucs_status_t)n : UCS_INPROGRESS;
}

static ucs_status_t zcopy(uct_ep_h tl_ep, mc_opcode_t opcode, const uct_iov_t *iov, size_t iovcnt,
                          uint64_t remote_addr, uct_rkey_t rkey, uct_completion_t *comp)
{
    uct_mc_ep_t *ep = ucs_derived_of(tl_ep, uct_mc_ep_t);
    mc_request_t reqs[UCT_MC_MAX_IOV * 4];
    unsigned n = 0;
    uct_mc_op_t *op;
    ucs_status_t st;

    for (size_t i = 0; i < iovcnt; i++)
        for (unsigned c = 0; c < iov[i].count && iov[i].length; c++) {
            if (n == sizeof(reqs) / sizeof(reqs[0])) {
                ucs_error("mooncake: more than %zu iov pieces", sizeof(reqs) / sizeof(reqs[0]));
                return UCS_ERR_INVALID_PARAM;
            }
            reqs[n++] = (mc_request_t){.opcode = opcode,
                                       .local = (char *)iov[i].buffer + c * iov[i].stride,
                                       .target = ep->seg,
                                       .target_offset = remote_addr,
                                       .length = iov[i].length};
            remote_addr += iov[i].length;
        }
    if (!n)
        return UCS_OK;
    st = rma_begin(ep, rkey, n);
    if (st != UCS_OK)
        return st;
    uint64_t first = reqs[0].target_offset, total = remote_addr - first;
    if (rma_conflict(ep, first, total, opcode == MC_WRITE)) {
        ep_block(ep);
        return UCS_ERR_NO_RESOURCE;
    }
    op = op_new(ep, comp);
    if (!op)
        return UCS_ERR_NO_MEMORY;
    st = op_start(ep, op, reqs, n, first, total);
    if (st != UCS_OK) {
        free(op);
        return st;
    }
    return UCS_INPROGRESS;
}

ucs_status_t uct_mc_ep_put_zcopy(uct_ep_h tl_ep, const uct_iov_t *iov, size_t iovcnt,
                                 uint64_t remote_addr, uct_rkey_t rkey, uct_completion_t *comp)
{
    return zcopy(tl_ep, MC_WRITE, iov, iovcnt, remote_addr, rkey, comp);
}

ucs_status_t uct_mc_ep_get_zcopy(uct_ep_h tl_ep, const uct_iov_t *iov, size_t iovcnt,
                                 uint64_t remote_addr, uct_rkey_t rkey, uct_completion_t *comp)
{
    return zcopy(tl_ep, MC_READ, iov, iovcnt, remote_addr, rkey, comp);
}

/* From the interface's progress: the engine let go of the source of every task of put op. A
 * zcopy put completes for UCT now, as UCX's tcp completes one once its bytes are in the
 * socket; its endpoint keeps it until the target has it (flush, fence, a failure then). */
void uct_mc_ep_op_sent(uct_mc_iface_t *iface, uct_mc_op_t *op)
{
    uct_completion_t *comp = op->comp;
    int error;

    pthread_mutex_lock(&iface->lock->mutex); /* its other tasks may end meanwhile */
    error = op->error;
    pthread_mutex_unlock(&iface->lock->mutex);
    op->sent = true;
    op->comp = NULL;
    if (comp) {
        op->error_told = error != 0 || op->canceled;
        uct_invoke_completion(comp, op->canceled ? UCS_ERR_CANCELED : uct_mc_status(error));
    }
}

/* From the interface's progress: the engine let go of every task of op. */
void uct_mc_ep_op_done(uct_mc_iface_t *iface, uct_mc_op_t *op)
{
    uct_mc_ep_t *ep = op->ep;
    ucs_status_t st = op->canceled ? UCS_ERR_CANCELED : uct_mc_status(op->error);

    iface->tasks_inflight -= op->ntasks;
    if (op->error)
        ucs_debug("mooncake: %s to segment %u failed: %s", op->write ? "put" : "get", ep->seg,
                  op->reason);
    if (op->unpack_cb && st == UCS_OK)
        op->unpack_cb(op->unpack_arg, iface->bounce + (size_t)op->slot * iface->config.seg_size,
                      op->length);
    if (op->slot >= 0)
        uct_mc_iface_slot_put(iface, op->slot);
    op_unlink(ep, op);
    if (op->comp)
        uct_invoke_completion(op->comp, st);
    else if (st != UCS_OK && !op->error_told && !op->canceled) /* as an RDMA queue pair does:
                                                                  a failed write fails the ep */
        ep_fail(ep, st);
    if (!ep->ops && ep->cancel_comp) { /* the engine let go of the last one */
        uct_completion_t *comp = ep->cancel_comp;
        ep->cancel_comp = NULL;
        uct_invoke_completion(comp, UCS_OK);
    }
    free(op);
    ep_unref(ep);
}

/* ---- flush and fence ---- */

static void flush_cb(void *arg, int status)
{
    uct_mc_flush_t *f = arg;
    uct_mc_md_t *md = f->md;

    bool closed;

    f->status = status;
    pthread_mutex_lock(&md->lock);
    closed = !f->iface;
    if (!closed)
        uct_mc_iface_queue(f->iface, &f->ev);
    pthread_mutex_unlock(&md->lock);
    if (closed)
        free(f);
}

/* Ask the engine for a flush of everything issued so far to ep's peer. */
static ucs_status_t flush_start(uct_mc_ep_t *ep, uct_completion_t *comp)
{
    uct_mc_iface_t *iface = ep->iface;
    uct_mc_flush_t *f = calloc(1, sizeof(*f));
    int rc;

    if (!f)
        return UCS_ERR_NO_MEMORY;
    f->ev.kind = EV_FLUSH;
    f->md = iface->md;
    f->iface = iface;
    f->ep = ep;
    f->comp = comp;
    f->gen = ep->sent;
    rc = mc_peer_flush(iface->md->engine, ep->seg, flush_cb, f);
    if (rc) {
        free(f);
        return uct_mc_status(rc);
    }
    f->ep_next = ep->flushes;
    ep->flushes = f;
    f->if_next = iface->flushes;
    iface->flushes = f;
    ep->refs++;
    return UCS_INPROGRESS;
}

/* CANCEL: flushes waiting complete as canceled now, operations in flight when the engine lets
 * go of them (it may write a get's buffer or read a put's until then), and the endpoint is in
 * error from now on. The cancel is complete once no operation is in flight: UCS_OK at once if
 * none is, else INPROGRESS and comp then (without comp the caller asks again). */
static ucs_status_t flush_cancel(uct_mc_ep_t *ep, uct_completion_t *comp)
{
    for (uct_mc_op_t *op = ep->ops; op; op = op->ep_next)
        op->canceled = true;
    flushes_cancel(ep);
    stash_drop(ep);
    if (!ep->failed) {
        ep->failed = true;
        ep->fail_status = UCS_ERR_CANCELED;
    }
    if (!ep->ops)
        return UCS_OK;
    if (comp) {
        if (ep->cancel_comp)
            return UCS_ERR_BUSY; /* one at a time */
        ep->cancel_comp = comp;
    }
    return UCS_INPROGRESS;
}

ucs_status_t uct_mc_ep_flush(uct_ep_h tl_ep, unsigned flags, uct_completion_t *comp)
{
    uct_mc_ep_t *ep = ucs_derived_of(tl_ep, uct_mc_ep_t);

    if (flags & UCT_FLUSH_FLAG_CANCEL)
        return flush_cancel(ep, comp);
    if (ep->failed)
        return ep->fail_status;
    /* UCP queues the flush behind them; called from its own turn in the queue (dispatching),
     * it is no longer behind any of this endpoint's (its own request still counts). A stashed
     * message is not sent yet: no flush can cover it. */
    if (ep->stash || (ep->n_pending && !ep->iface->dispatching)) {
        ep_block(ep);
        return UCS_ERR_NO_RESOURCE;
    }
    if (!ep->dirty && !ep->refs)
        return UCS_OK;
    if (!comp && ep->flushes && ep->flushes->gen == ep->sent)
        return UCS_INPROGRESS; /* one is on its way for what was sent so far */
    return flush_start(ep, comp);
}

void uct_mc_ep_flush_done(uct_mc_iface_t *iface, uct_mc_flush_t *f)
{
    uct_mc_ep_t *ep = f->ep;

    for (uct_mc_flush_t **pp = &ep->flushes; *pp; pp = &(*pp)->ep_next)
        if (*pp == f) {
            *pp = f->ep_next;
            break;
        }
    for (uct_mc_flush_t **pp = &iface->flushes; *pp; pp = &(*pp)->if_next)
        if (*pp == f) {
            *pp = f->if_next;
            break;
        }
    /* everything sent before this flush is in: clean unless more was sent since */
    if (!f->status && f->gen == ep->sent)
        ep->dirty = false;
    /* an operation that failed meanwhile failed the endpoint: the flush says so too */
    if (f->comp)
        uct_invoke_completion(f->comp, f->status    ? uct_mc_status(f->status)
                                       : ep->failed ? ep->fail_status
                                                    : UCS_OK);
    free(f);
    ep_unref(ep);
}

/* Later operations wait until the earlier ones are remotely complete: messages are known to be
 * only through a flush, which starts here. */
static void fence_now(uct_mc_ep_t *ep)
{
    cover_messages(ep);
    if (ep->refs || ep->dirty || ep->stash)
        ep->fence = true;
}

/* Requests of ep still in the pending queue were issued before the fence, though they go
 * later: it stands behind the last of them, and takes effect when that one went (dispatch). */
ucs_status_t uct_mc_ep_fence(uct_ep_h tl_ep, unsigned flags)
{
    uct_mc_ep_t *ep = ucs_derived_of(tl_ep, uct_mc_ep_t);

    (void)flags;
    if (ep->n_pending)
        priv(ep->pending_last)->fence = true;
    else
        fence_now(ep);
    return UCS_OK;
}

/* The interface closes: flushes still in the engine free themselves when they end. */
void uct_mc_iface_detach_flushes(uct_mc_iface_t *iface)
{
    size_t n = 0, i = 0;
    uct_mc_ep_t **eps;

    for (uct_mc_flush_t *f = iface->flushes; f; f = f->if_next)
        n++;
    eps = calloc(n ? n : 1, sizeof(*eps));
    pthread_mutex_lock(&iface->md->lock);
    for (uct_mc_flush_t *f = iface->flushes; f; f = f->if_next) {
        if (eps)
            eps[i++] = f->ep;
        f->iface = NULL; /* from here on, flush_cb may free it */
    }
    pthread_mutex_unlock(&iface->md->lock);
    iface->flushes = NULL;
    for (size_t k = 0; k < i; k++)
        ep_unref(eps[k]);
    free(eps);
}
