/*
 * Messages between same-host peers through shared memory.
 *
 * Each sender makes one ring per peer it sends to (a memfd, RING_BYTES of records) and hands it
 * over a message connection to the peer's socket (HELLO as ROLE_MSG, then SHM_RING with the
 * memfd), all without blocking: the ring is usable at once, and the peer starts reading it once
 * its progress accepts the connection. Records, consumption and answers are msg_ring.h's: a
 * record the receiver cannot take now stays where it is, and the receiver tries again on a
 * later pass (a pop, or handlers run, make room and wake it), so a full ring stops the sender,
 * whose window then fills.
 *
 * In a pass that runs the host's callbacks the receiver runs handlers on the records where they
 * are (msg_ring.h's loans), and moves its tail, and so the sender's answers, past them once
 * they ran, at the end of that pass. A pass that keeps the callbacks for the host (a quiet one,
 * a serving thread's) copies what it takes: the sender hears at once that it was taken, as
 * over the other carriers, and the ring does not wait for a host that is away. With
 * MC_MSG_ACK_AFTER_HANDLER it lends them too, and they are answered once the host's handlers
 * ran (what a UCT flush means: UCP has them).
 *
 * The sender reads the receiver's tail, and answers what it consumed, only when an answer is
 * waited for: a message with a callback, a flush of the peer, a ring or fifo that is full, every
 * ANSWER_BATCH records and every ANSWER_NS, and before it sleeps. The tail's cache line is the
 * receiver's to write: reading it at every pass took it away from the receiver at every message
 * and put a cache miss on the path of both sides' next message (UCX's FIFO, likewise, reads its
 * tail only when it looks full).
 *
 * A receiver that takes records of a one-way stream looks at that ring only every PACE_NS
 * (rx_paced): a look at every pass took the lines the sender was writing.
 *
 * Wake-ups (shm_wake.h): a side about to sleep arms its wake word in the ring; the other side,
 * after moving head (or tail), sends one SHM_KICK datagram on the connection if it finds it
 * armed. Spinning hosts (caller-progress mode without the event fd) never arm: no syscall per
 * message at all, and, with membarrier(2), no fence for their peers either.
 *
 * The connection is the ring's lifeline. The receiver's end closing (its engine or process
 * went, or it would not take the ring) makes the sender answer what was consumed and give the
 * rest back to the control link (go-back-N there; the receiver drops what it saw): whether the
 * peer is dead is for the control link and the owner's pidfd to say. The sender's end closing
 * (closed peer, exited process, our own engine stopping) makes the receiver drop the ring
 * without taking more: the sender answered what it could and failed the rest.
 *
 * A message sent from the progress context is written from its sender's bytes (msg_direct), so
 * the record is its only copy until the receiver consumed it: a ring that goes copies what it
 * still holds back into those messages first (tx_keep), for the control link to send again.
 */
#include <errno.h>
#include <stdalign.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../../sys/memfd.h"
#include "shm_int.h"
#include "shm_wake.h"

#define RING_BYTES   (512u << 10)
#define RING_MAGIC   0x33474e4952434du   /* "MCRING3" */
#define FIFO_CAP     (2 * MC_MSG_WINDOW) /* records in the ring, resends included */
#define RX_BUDGET    1024u               /* records taken per ring per pass */
#define ANSWER_BATCH 64u                 /* records answered together at most, unless waited for */
#define ANSWER_NS    (100 * 1000)        /* and at least this often */
#define PACE_NS      500                 /* a one-way stream's ring: no look for this long */

enum { TX_NONE, TX_UP, TX_OFF };

struct shm_ring {
    uint64_t magic, bytes, stream;
    char sender[MC_NAME_MAX];
    alignas(64) _Atomic uint64_t head; /* written by the sender */
    alignas(64) _Atomic uint64_t tail; /* written by the receiver */
    /* A line of their own, read after every move and written only to sleep: next to head or
     * tail the read missed, the other side's polling having taken the line. */
    alignas(64) _Atomic uint32_t rx_wake; /* the receiver's WAKE_* (it sleeps waiting for head) */
    _Atomic uint32_t tx_wake;             /* the sender's WAKE_* (it sleeps waiting for tail) */
    alignas(64) uint8_t data[];
};

struct shm_rx {
    mc_list_t link; /* in shm_engine_t.rx_rings */
    int fd;         /* the connection (the conn owns it) */
    shm_ring_t *ring;
    uint64_t tail;       /* records taken up to here */
    uint64_t given;      /* the ring's tail: records given back (their handlers ran) */
    mc_ring_lend_t lend; /* records taken and lent to their handlers */
    uint64_t stream;
    char sender[MC_NAME_MAX];
    uint64_t pace_until;  /* mc__cycles(): no look before then (0: look at every pass) */
    uint64_t writes_seen; /* shm_engine_t.writes at the last look that took records */
    bool blocked;         /* the head record was refused: the next pass tries it again */
    bool corrupt;         /* not read any more: its connection is being shut */
    bool sleeper;         /* our wake word is marked, and its membarrier ran (shm_wake.h) */
    bool mb;              /* our process is registered for membarriers (shm_wake.h) */
};

_Static_assert(RING_BYTES >= 4 * (MC_MSG_MAX + MC_RING_REC_HDR),
               "a ring holds a few largest messages");

static size_t ring_size(void)
{
    return sizeof(shm_ring_t) + RING_BYTES;
}

/* After moving our index: kick the other side if mc__wake_check says so. A kick that cannot go
 * (other than a full socket, which holds kicks already) leaves it armed for the next one. */
static void kick_if_armed(_Atomic uint32_t *w, int fd, bool mb)
{
    shm_msg_t k = {.type = SHM_KICK};

    if (mc__wake_check(w, mb) && mc__shm_send(fd, &k, -1) && errno != EAGAIN)
        atomic_fetch_or(w, WAKE_ARMED);
}

/* ---- sender ---- */

void mc__shm_tx_init(shm_tx_t *tx, mc_peer_t *p)
{
    memset(tx, 0, sizeof(*tx));
    tx->chan.fd = -1;
    tx->peer = p;
    mc_list_init(&tx->busy_link);
    mc_list_init(&tx->slept_link);
}

/* Answer the records the receiver consumed. */
static void tx_poll(mc_engine_t *e, shm_tx_t *tx)
{
    uint64_t tail = atomic_load_explicit(&tx->ring->tail, memory_order_acquire);
    bool room = mc__ring_fifo_answer(e, tx->peer, &tx->fifo, tail) > 0;

    tx->tail = tail;
    tx->polled_ns = e->last_pass_ns;
    tx->due = false;

    if (!tx->fifo.n)
        mc_list_del(&tx->busy_link);
    if (room && !mc_list_empty(&tx->peer->msgq)) /* a full ring held some back */
        mc__peer_activate(e, tx->peer);
}

/* Whether the pass reads the tail (see the top of the file). */
static bool tx_due(mc_engine_t *e, shm_tx_t *tx)
{
    return tx->due || tx->wait_end > tx->tail || tx->fifo.n >= ANSWER_BATCH ||
           !mc_list_empty(&tx->peer->flushes) || e->last_pass_ns - tx->polled_ns >= ANSWER_NS;
}

static void tx_stop(mc_engine_t *e, shm_tx_t *tx)
{
    if (tx->chan.fd >= 0) {
        mc__epoll_del(e, &tx->chan);
        close(tx->chan.fd);
        tx->chan.fd = -1;
    }
    tx->state = TX_OFF;
}

/* The channel: kicks (the receiver consumed), or its end went away: what it consumed was
 * delivered, the rest goes back to the control link. */
static void tx_on_chan(mc_engine_t *e, mc_pollable_t *pl, uint32_t events)
{
    shm_tx_t *tx = mc_container_of(pl, shm_tx_t, chan);
    mc_peer_t *p = tx->peer;
    shm_msg_t m;
    ssize_t n;

    if (tx->state != TX_UP)
        return;
    while ((n = recv(tx->chan.fd, &m, sizeof(m), MSG_DONTWAIT)) > 0)
        ;
    tx_poll(e, tx);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR) ||
        (events & (EPOLLHUP | EPOLLERR))) {
        mc_info("shm message channel to %s closed: its messages go over %s", p->name,
                mc__transports[e->ctrl]->name);
        mc__shm_tx_close(e, tx);
        mc__msg_link_lost(e, p, mc__shm_slot);
        p->msg_tp = (uint8_t)e->ctrl;
        mc__peer_activate(e, p);
    }
}

void mc__shm_msg_settle(mc_engine_t *e, mc_peer_t *p)
{
    shm_tx_t *tx = mc__shm_peer_tx(p);

    if (tx && tx->state == TX_UP)
        tx_poll(e, tx);
}

bool mc__shm_msg_open(mc_engine_t *e, mc_peer_t *p)
{
    shm_tx_t *tx = mc__shm_peer_tx(p);
    const char *addr = mc__shm_peer_addr(p);
    shm_msg_t m = {.type = SHM_RING};
    int fd = -1, rc = 0;

    if (!tx || tx->state != TX_NONE)
        return tx && tx->state == TX_UP;
    int mfd = -1;
    if (mc__ring_fifo_init(&tx->fifo, FIFO_CAP)) {
        rc = -errno;
        goto fail;
    }
    if ((mfd = mc__memfd_fixed("mooncake-msg-ring", ring_size())) < 0) {
        rc = mfd;
        goto fail;
    }
    tx->ring = mmap(NULL, ring_size(), PROT_READ | PROT_WRITE, MAP_SHARED, mfd, 0);
    if (tx->ring == MAP_FAILED) {
        tx->ring = NULL;
        rc = -errno;
        goto fail;
    }
    tx->ring->magic = RING_MAGIC;
    tx->ring->bytes = RING_BYTES;
    tx->ring->stream = p->msg_stream;
    tx->ring->tx_wake = shm_of(e)->mb ? WAKE_MB : 0;
    snprintf(tx->ring->sender, sizeof(tx->ring->sender), "%s", e->name);
    fd = mc__shm_connect(addr, ROLE_MSG, e->instance, 0);
    if (fd < 0) {
        rc = fd;
        goto fail;
    }
    if (mc__shm_send(fd, &m, mfd)) {
        rc = -EIO;
        goto fail;
    }
    close(mfd);
    mfd = -1;
    tx->chan.fd = fd;
    tx->chan.handler = tx_on_chan;
    if (mc__epoll_add(e, &tx->chan, EPOLLIN)) {
        tx->chan.fd = -1;
        rc = -EIO;
        goto fail;
    }
    tx->state = TX_UP;
    return true;
fail:
    mc_info("shm messages to %s unavailable (%s): they go over %s", p->name, strerror(-rc),
            mc__transports[e->ctrl]->name);
    if (fd >= 0)
        close(fd);
    if (mfd >= 0)
        close(mfd);
    if (tx->ring)
        munmap(tx->ring, ring_size());
    tx->ring = NULL;
    mc__ring_fifo_free(e, &tx->fifo);
    tx->state = TX_OFF;
    return false;
}

/* Write m into the ring: false if it does not fit now (the ring or the fifo is full). The tail
 * last answered mostly says there is room; when it does not, the tail is read. A payload put
 * from its sender's bytes (m->src) is in the ring alone until the ring goes (tx_keep). */
static bool tx_put(shm_tx_t *tx, mc_msg_t *m)
{
    shm_ring_t *r = tx->ring;

    if (tx->fifo.n == FIFO_CAP)
        return false;
    if (mc__ring_put(r->data, RING_BYTES, &tx->head, tx->tail, m)) {
        /* The records it consumed are answered on the next pass: the messages of a ring that
         * went round since the last answer are let go of by then. */
        tx->due = true;
        if (mc__ring_put(r->data, RING_BYTES, &tx->head,
                         atomic_load_explicit(&r->tail, memory_order_acquire), m))
            return false;
    }
    m->in_ring = m->src != NULL;
    return true;
}

/* The ring is going: the payloads only it holds go into their messages, which the control link
 * sends again. */
static void tx_keep(shm_tx_t *tx)
{
    for (unsigned i = 0; i < tx->fifo.n; i++) {
        const struct mc_ring_rec *rec = &tx->fifo.v[(tx->fifo.first + i) % tx->fifo.cap];
        mc_msg_t *m = rec->m;
        if (!m->in_ring)
            continue;
        uint64_t at = (rec->end - mc__ring_rec_bytes(m->len)) % RING_BYTES;
        memcpy(m->data, tx->ring->data + at + MC_RING_REC_HDR, m->len);
        m->in_ring = false;
    }
}

/* Write what p has queued into its ring, as far as room allows. */
void mc__shm_msg_fill(mc_engine_t *e, mc_peer_t *p)
{
    shm_tx_t *tx = mc__shm_peer_tx(p);
    shm_ring_t *r;
    mc_msg_t *m;
    bool wrote = false;

    if (!tx || tx->state != TX_UP)
        return;
    r = tx->ring;
    while ((m = mc__msg_peek(p, mc__shm_slot))) {
        if (!tx_put(tx, m)) {
            tx->due = true; /* full: the next pass answers, the receiver's kick resumes */
            break;
        }
        m = mc__msg_take(e, p, mc__shm_slot);
        mc__ring_fifo_push(&tx->fifo, m, tx->head);
        if (m->cb)
            tx->wait_end = tx->head;
        wrote = true;
    }
    if (!wrote)
        return;
    shm_of(e)->writes++;
    atomic_store_explicit(&r->head, tx->head, memory_order_release);
    kick_if_armed(&r->rx_wake, tx->chan.fd, shm_of(e)->mb);
    if (mc_list_empty(&tx->busy_link))
        mc_list_push_back(&shm_of(e)->tx_busy, &tx->busy_link);
}

void mc__shm_tx_close(mc_engine_t *e, shm_tx_t *tx)
{
    tx_stop(e, tx);
    if (tx->ring)
        tx_keep(tx);
    mc__ring_fifo_free(e, &tx->fifo);
    mc_list_del(&tx->busy_link);
    mc_list_del(&tx->slept_link);
    tx->sleeper = false;
    if (tx->ring)
        munmap(tx->ring, ring_size());
    tx->ring = NULL;
}

/* ---- receiver ---- */

shm_rx_t *mc__shm_rx_attach(mc_engine_t *e, int fd, int ring_fd)
{
    shm_rx_t *rx;
    shm_ring_t *r;

    if (!mc__memfd_holds(ring_fd, ring_size())) /* (a sender could shrink it under us) */
        return NULL;
    r = mmap(NULL, ring_size(), PROT_READ | PROT_WRITE, MAP_SHARED, ring_fd, 0);
    if (r == MAP_FAILED)
        return NULL;
    rx = calloc(1, sizeof(*rx));
    if (!rx || r->magic != RING_MAGIC || r->bytes != RING_BYTES ||
        !memchr(r->sender, 0, sizeof(r->sender))) {
        munmap(r, ring_size());
        free(rx);
        return NULL;
    }
    rx->fd = fd;
    rx->ring = r;
    rx->lend.slot = mc__shm_slot;
    rx->mb = shm_of(e)->mb;
    if (rx->mb) /* before it can sleep: the sender reads it as it likes */
        atomic_fetch_or(&r->rx_wake, WAKE_MB);
    rx->tail = rx->given = atomic_load(&r->tail);
    rx->stream = r->stream; /* read once: the sender cannot change who it is */
    memcpy(rx->sender, r->sender, sizeof(rx->sender));
    mc_list_push_back(&shm_of(e)->rx_rings, &rx->link);
    return rx;
}

/* Let the sender write over what was taken and is no longer lent. */
static void rx_give(shm_rx_t *rx)
{
    uint64_t given = mc__ring_given(&rx->lend, rx->tail);

    if (given == rx->given)
        return;
    rx->given = given;
    atomic_store_explicit(&rx->ring->tail, given, memory_order_release);
    kick_if_armed(&rx->ring->tx_wake, rx->fd, rx->mb);
}

static uint64_t pace_cycles(void)
{
    return PACE_NS * mc__cycles_per_us() / 1000;
}

/* Whether the ring waits before its next look. One that brought records while this side wrote
 * none into a ring since it last did (a one-way stream: a ping-pong's receiver answers in
 * between, over shm) is not looked at for PACE_NS (by the CPU's counter: about that). A receiver
 * that looks at every pass reads each record as it lands, and the next one's line with it,
 * before the sender wrote that line: the sender then waited at every message for the line to
 * come back (its stores queued behind that one), and a two-process stream of 8 B messages ran
 * at 2.6-2.8 M/s where looks every 300 ns gave 4.1-4.3 M. A message of a one-way burst waits up
 * to PACE_NS for it. A counter that went back (another CPU's) ends the wait. */
static bool rx_paced(shm_rx_t *rx)
{
    if (!rx->pace_until)
        return false;
    uint64_t now = mc__cycles();
    if (now < rx->pace_until && rx->pace_until - now <= pace_cycles())
        return true;
    rx->pace_until = 0;
    return false;
}

/* Take what the ring holds, in order, up to RX_BUDGET records, and give back what was not lent
 * to handlers. A ring with a record that cannot be one (it is not a ring, or the sender wrote
 * over it) is closed. */
static void rx_poll(mc_engine_t *e, shm_rx_t *rx)
{
    shm_ring_t *r = rx->ring;
    uint64_t tail = rx->tail;

    if (rx->corrupt || rx_paced(rx))
        return;
    /* The next record's line is on its way by the time head says it is there: otherwise a
     * spinning receiver takes two cache misses in a row per message, head's and the record's. */
    __builtin_prefetch(r->data + rx->tail % RING_BYTES);
    uint64_t head = atomic_load_explicit(&r->head, memory_order_acquire);
    if (head != rx->tail &&
        mc__ring_take(e, mc__shm_slot, r->data, RING_BYTES, head, &rx->tail, rx->sender, rx->stream,
                      RX_BUDGET, &rx->blocked,
                      e->pass_callbacks || e->cfg.msg_ack_after_handler ? &rx->lend : NULL)) {
        mc_warn("shm: the message ring from %s is corrupt: closing it", rx->sender);
        rx->corrupt = true;
        shutdown(rx->fd, SHUT_RDWR); /* its connection goes, and the sender hears it */
    }
    /* Records taken: a one-way stream's ring waits, but not one left blocked (what unblocks
     * it wakes one pass, and nothing else would). */
    if (rx->tail != tail) {
        if (shm_of(e)->writes == rx->writes_seen && !rx->blocked)
            rx->pace_until = mc__cycles() + pace_cycles();
        rx->writes_seen = shm_of(e)->writes;
    }
    rx_give(rx);
}

void mc__shm_msg_give(mc_engine_t *e)
{
    mc_list_t *pos;

    for (pos = shm_of(e)->rx_rings.next; pos != &shm_of(e)->rx_rings; pos = pos->next)
        rx_give(mc_container_of(pos, shm_rx_t, link));
}

bool mc__shm_msg_lending(mc_engine_t *e, uint64_t stream)
{
    return MC_RING_LENDS(&shm_of(e)->rx_rings, shm_rx_t, stream) ||
           MC_RING_LENDS(&shm_of(e)->rx_lent, shm_rx_t, stream);
}

static void rx_free(shm_rx_t *rx)
{
    munmap(rx->ring, ring_size());
    free(rx);
}

/* Records lent stay lent until the end of the pass: a ring closed before then (nothing closes
 * one from a callback today) stays mapped until they ran, or the transport goes. */
void mc__shm_rx_detach(mc_engine_t *e, shm_rx_t *rx)
{
    mc_list_del(&rx->link);
    if (rx->lend.n) {
        mc_list_push_back(&shm_of(e)->rx_lent, &rx->link);
        mc__reap_mark(e, mc__shm_slot);
    } else
        rx_free(rx);
}

void mc__shm_rx_lent_free(mc_engine_t *e, bool all)
{
    mc_list_t *pos, *tmp;

    mc_list_for_each_safe(pos, tmp, &shm_of(e)->rx_lent)
    {
        shm_rx_t *rx = mc_container_of(pos, shm_rx_t, link);
        if (all || !rx->lend.n) {
            mc_list_del(&rx->link);
            rx_free(rx);
        }
    }
}

/* ---- both ---- */

/* Take what the rings hold. An express pass does only this: the answers to our own messages
 * wait for a whole pass (within LIGHT_US), as does everything else of a pass. */
bool mc__shm_msg_express(mc_engine_t *e)
{
    mc_list_t *pos, *tmp;

    mc_list_for_each_safe(pos, tmp, &shm_of(e)->rx_rings)
        rx_poll(e, mc_container_of(pos, shm_rx_t, link));
    return true;
}

void mc__shm_msg_progress(mc_engine_t *e)
{
    mc_list_t *pos, *tmp;

    mc__shm_msg_express(e);
    mc_list_for_each_safe(pos, tmp, &shm_of(e)->tx_busy)
    {
        shm_tx_t *tx = mc_container_of(pos, shm_tx_t, busy_link);
        if (tx_due(e, tx))
            tx_poll(e, tx);
    }
}

bool mc__shm_msg_idle(mc_engine_t *e)
{
    shm_engine_t *se = shm_of(e);
    mc_list_t *pos;
    bool busy = false, barrier = false;

    se->slept = true;
    /* Rings this side never slept on (or not for a tick) are marked first, then one membarrier
     * covers them all. */
    for (pos = se->rx_rings.next; pos != &se->rx_rings; pos = pos->next) {
        shm_rx_t *rx = mc_container_of(pos, shm_rx_t, link);
        if (!rx->sleeper)
            barrier |= mc__wake_mark(&rx->ring->rx_wake);
    }
    for (pos = se->tx_busy.next; pos != &se->tx_busy; pos = pos->next) {
        shm_tx_t *tx = mc_container_of(pos, shm_tx_t, busy_link);
        if (tx->sleeper)
            continue;
        barrier |= mc__wake_mark(&tx->ring->tx_wake);
        /* marked: the timers unmark it, even if the membarrier fails now */
        if (mc_list_empty(&tx->slept_link))
            mc_list_push_back(&se->tx_slept, &tx->slept_link);
    }
    if (barrier) {
        if (!mc__wake_barrier())
            return true; /* not armed: the next look tries again */
        se->settle_ns = mc__now_ns() + WAKE_SETTLE_NS;
    }
    for (pos = se->rx_rings.next; pos != &se->rx_rings; pos = pos->next) {
        shm_rx_t *rx = mc_container_of(pos, shm_rx_t, link);
        rx->sleeper = true;
        mc__wake_arm(&rx->ring->rx_wake);
        busy |= !rx->blocked && !rx->corrupt &&
                atomic_load_explicit(&rx->ring->head, memory_order_relaxed) != rx->tail;
    }
    for (pos = se->tx_busy.next; pos != &se->tx_busy; pos = pos->next) {
        shm_tx_t *tx = mc_container_of(pos, shm_tx_t, busy_link);
        tx->sleeper = true;
        mc__wake_arm(&tx->ring->tx_wake);
        if (atomic_load_explicit(&tx->ring->tail, memory_order_relaxed) >=
            tx->fifo.v[tx->fifo.first].end)
            busy = tx->due = true; /* consumed: answered before sleeping */
    }
    if (se->settle_ns) { /* a membarrier that missed a CPU: look again before sleeping */
        if (mc__now_ns() < se->settle_ns)
            return true;
        se->settle_ns = 0;
    }
    return busy;
}

/* A timer tick: if this side did not go to sleep since the last one, it spins, and its rings'
 * other sides may skip their fence again (shm_wake.h, mc__wake_unmark). Every rx ring is
 * unmarked, and every tx ring on tx_slept: those marked before a membarrier that failed too. */
void mc__shm_msg_timers(mc_engine_t *e)
{
    shm_engine_t *se = shm_of(e);
    mc_list_t *pos;

    if (se->slept) {
        se->slept = false;
        return;
    }
    for (pos = se->rx_rings.next; pos != &se->rx_rings; pos = pos->next) {
        shm_rx_t *rx = mc_container_of(pos, shm_rx_t, link);
        mc__wake_unmark(&rx->ring->rx_wake);
        rx->sleeper = false;
    }
    while (!mc_list_empty(&se->tx_slept)) {
        shm_tx_t *tx = mc_container_of(se->tx_slept.next, shm_tx_t, slept_link);
        mc__wake_unmark(&tx->ring->tx_wake);
        tx->sleeper = false;
        mc_list_del(&tx->slept_link);
    }
}

/* For tests (progress context, or the host's thread between its calls in caller mode): the
 * rings whose wake word this side has marked (rx rings: and armed since). */
unsigned mc__shm_msg_sleepers(mc_engine_t *e)
{
    shm_engine_t *se = shm_of(e);
    unsigned n = 0;
    mc_list_t *pos;

    if (!se)
        return 0;
    for (pos = se->rx_rings.next; pos != &se->rx_rings; pos = pos->next)
        n += mc_container_of(pos, shm_rx_t, link)->sleeper;
    for (pos = se->tx_slept.next; pos != &se->tx_slept; pos = pos->next)
        n++;
    return n;
}
