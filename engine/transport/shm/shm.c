/*
 * Same-host transport for engine-allocated (memfd) memory.
 *
 * A peer on the same host (same boot id and network namespace) maps the owner's memfd buffers
 * once and then moves data with plain loads and stores in the submitting thread: no syscall and
 * no round trip per request. The owner hands out a mapping only for a registered memfd buffer
 * (the mapping is exactly that buffer), over an abstract unix socket whose peer must have our
 * uid; with MC_AUTH_TOKEN or MC_FORCE_TCP set the transport is off.
 *
 * Each peer keeps two sockets to an owner: a request socket used synchronously by submitters
 * (MAP), and an event socket in the progress loop (REVOKE from the owner, HUP when it dies).
 *
 * Unregister protocol: mc_mem_free() of a memfd buffer sends REVOKE to every peer's event
 * socket and waits (up to MC_IO_TIMEOUT_MS) for each REVOKE_ACK. A peer unmaps under its
 * mappings' write lock (copies hold the read lock), so once it acknowledged, no copy of it can
 * touch the buffer. A peer that does not answer in time has its sockets closed, which makes it
 * drop every mapping of ours. After mc_mem_free() returns, no peer writes into those pages.
 * The peer connects its event socket again REDIAL_MS later (the wait doubling with each cut,
 * since each cost the owner's unregister its I/O timeout), as long as the owner's process and
 * its request socket live, and maps again once the owner answered on it: until then other
 * transports carry its tasks.
 *
 * The event socket also carries what other transports open directly (CUDA IPC, file
 * transport: the owner cannot see those copies): a peer asks the owner (GRANT) before its
 * first access to a buffer, and the owner says whether it is registered, so that an access
 * starts only on a connection that the owner's next REVOKE reaches. Unregistering VRAM sends
 * REVOKE as for memfd buffers; the peer acknowledges once no copy of it uses the buffer any
 * more (mc__revoke, asked again each pass until none does).
 *
 * Dead owner: a copy into the memory of a process that died lands in orphaned pages. After the
 * copies of one submit, one poll of the owner's pidfd per peer decides: if it exited, those
 * tasks end FAILED ("owner exited"), never COMPLETED. The pidfd also sits in the progress loop:
 * when the owner exits, the peer is DEAD for every transport (mc__peer_dead).
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#include "../../sys/memfd.h"
#include "shm_int.h"
#include "shm_wake.h"

#define REDIAL_MS        1000 /* after the owner cut our event socket: connect again then, */
#define REDIAL_DOUBLINGS 6    /* the wait doubling with each cut, up to 64 s, */
#define REDIAL_FORGET_NS (600 * MC_MS * 1000) /* and from 1 s again after 10 min up */

/* Owner side: one accepted connection. Progress-owned. */
typedef struct shm_conn {
    mc_pollable_t p;
    mc_list_t link; /* in the conns of shm_engine_t, then its grave */
    uint32_t role;
    uint64_t instance;
    int slot;      /* request connections: this peer's slot in the registration table, or -1 */
    shm_rx_t *rx;  /* message connections: the ring they deliver from */
    bool owes_ack; /* event connections: the revocation under way waits for its REVOKE_ACK */
} shm_conn_t;

unsigned mc__shm_slot;

static socklen_t sun_of(const char *name, struct sockaddr_un *sun)
{
    memset(sun, 0, sizeof(*sun));
    sun->sun_family = AF_UNIX;
    size_t n = strnlen(name, sizeof(sun->sun_path) - 2);
    memcpy(sun->sun_path + 1, name, n); /* abstract: leading NUL */
    return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + n);
}

int mc__shm_send(int fd, const shm_msg_t *m, int pass_fd)
{
    struct iovec iov = {(void *)m, sizeof(*m)};
    char cbuf[CMSG_SPACE(sizeof(int))];
    struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};

    if (pass_fd >= 0) {
        memset(cbuf, 0, sizeof(cbuf));
        mh.msg_control = cbuf;
        mh.msg_controllen = sizeof(cbuf);
        struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int));
        memcpy(CMSG_DATA(c), &pass_fd, sizeof(int));
    }
    return sendmsg(fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT) == sizeof(*m) ? 0 : -EIO;
}

/* One message; a passed descriptor lands in *fd_p (or is closed when fd_p is NULL). */
static int msg_recv(int fd, shm_msg_t *m, int *fd_p, int flags)
{
    struct iovec iov = {m, sizeof(*m)};
    char cbuf[CMSG_SPACE(sizeof(int))];
    struct msghdr mh = {
        .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf, .msg_controllen = sizeof(cbuf)};
    ssize_t n = recvmsg(fd, &mh, MSG_CMSG_CLOEXEC | flags);
    int got = -1;

    for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); n > 0 && c; c = CMSG_NXTHDR(&mh, c))
        if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS)
            memcpy(&got, CMSG_DATA(c), sizeof(int));
    if (fd_p)
        *fd_p = got;
    else if (got >= 0)
        close(got);
    if (n < 0)
        return errno == EAGAIN ? -EAGAIN : -EIO;
    return n == sizeof(*m) ? 0 : -EIO;
}

/* ---- owner side ---- */

static void conn_bury(mc_engine_t *e, shm_conn_t *c)
{
    shm_engine_t *se = shm_of(e);

    mc__shm_regtab_slot_put(e, c->slot);
    c->slot = -1;
    if (c->rx)
        mc__shm_rx_detach(e, c->rx);
    c->rx = NULL;
    mc__epoll_del(e, &c->p);
    close(c->p.fd);
    c->p.fd = -1;
    mc_list_del(&c->link);
    mc_list_push_back(&se->grave, &c->link);
    mc__reap_mark(e, mc__shm_slot);
    atomic_fetch_sub(&e->n_links, 1);
    if (c->owes_ack) { /* counts as acknowledged */
        c->owes_ack = false;
        se->revoke_left--;
        mc__mem_wake(e);
    }
}

static void on_map(mc_engine_t *e, shm_conn_t *c, const shm_msg_t *m)
{
    mc_buffer_t *b = mc__mem_get(e, m->addr, m->len);
    shm_msg_t r = {.type = SHM_MAP_ERR, .addr = m->addr, .instance = m->instance};

    if (b && b->memfd >= 0) {
        r = (shm_msg_t){
            .type = SHM_MAP_OK, .addr = b->addr, .len = b->len, .instance = m->instance};
        if (mc__shm_send(c->p.fd, &r, b->memfd))
            conn_bury(e, c);
    } else if (mc__shm_send(c->p.fd, &r, -1)) {
        conn_bury(e, c);
    }
    if (b)
        mc__mem_put(e, b);
}

/* A peer asks before it opens our buffer at addr directly: yes while it is registered VRAM.
 * It asks on its event connection, so our REVOKE of it reaches that peer. */
static void on_grant(mc_engine_t *e, shm_conn_t *c, const shm_msg_t *m)
{
    mc_buffer_t *b = mc__mem_get(e, m->addr, 1);
    bool ok = b && b->addr == m->addr && b->serial == m->len && b->vram;
    shm_msg_t r = {.type = ok ? SHM_GRANT_OK : SHM_GRANT_NO, .addr = m->addr, .len = m->len};

    if (b)
        mc__mem_put(e, b);
    if (mc__shm_send(c->p.fd, &r, -1))
        conn_bury(e, c);
}

static void owner_handler(mc_engine_t *e, mc_pollable_t *p, uint32_t events)
{
    shm_conn_t *c = mc_container_of(p, shm_conn_t, p);
    shm_engine_t *se = shm_of(e);
    shm_msg_t m;
    int rc, fd = -1;

    (void)events;
    while (c->p.fd >= 0 && (rc = msg_recv(c->p.fd, &m, &fd, MSG_DONTWAIT)) == 0) {
        if (m.type == SHM_HELLO && !c->role && m.arg >= ROLE_REQUEST && m.arg <= ROLE_MSG) {
            c->role = m.arg;
            c->instance = m.instance;
        } else if (m.type == SHM_RING && c->role == ROLE_MSG && !c->rx && fd >= 0) {
            c->rx = mc__shm_rx_attach(e, c->p.fd, fd);
            if (!c->rx) {
                mc_warn("shm: a message ring that is not one (or of another version of the "
                        "engine): dropping it, its messages go over the control link");
                rc = -EIO;
            }
        } else if (m.type == SHM_KICK && c->role == ROLE_MSG) {
            /* the ring is read every pass */
        } else if (m.type == SHM_MAP && c->role == ROLE_REQUEST) {
            on_map(e, c, &m);
        } else if (m.type == SHM_REGTAB && c->role == ROLE_REQUEST && c->slot < 0 && se->regtab) {
            struct ucred cr;
            socklen_t cl = sizeof(cr);
            c->slot = mc__shm_regtab_slot_get(e);
            if (c->slot >= 0) /* (grace tells a dead peer's odd lane by it) */
                atomic_store(&se->regtab_pid[c->slot],
                             getsockopt(c->p.fd, SOL_SOCKET, SO_PEERCRED, &cr, &cl) ? 0 : cr.pid);
            shm_msg_t r = {.type = SHM_REGTAB_OK,
                           .arg = (uint32_t)c->slot,
                           .len = MC_REGTAB_LANES,
                           .instance = m.instance};
            if (c->slot < 0 || mc__shm_send(c->p.fd, &r, se->regtab_fd)) {
                rc = -EIO;
                break;
            }
        } else if (m.type == SHM_GRANT && c->role == ROLE_EVENT) {
            on_grant(e, c, &m);
        } else if (m.type == SHM_REVOKE_ACK && c->role == ROLE_EVENT) {
            if (m.addr == se->revoke_addr && c->owes_ack) {
                c->owes_ack = false;
                se->revoke_left--;
                mc__mem_wake(e);
            }
        } else {
            mc_warn("shm: unexpected message %u from a peer: dropping it", m.type);
            rc = -EIO;
        }
        if (fd >= 0)
            close(fd);
        fd = -1;
        if (rc)
            break;
    }
    if (fd >= 0)
        close(fd);
    if (c->p.fd >= 0 && rc != -EAGAIN)
        conn_bury(e, c);
}

static bool same_user(int fd)
{
    struct ucred cr;
    socklen_t len = sizeof(cr);

    return getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &len) == 0 &&
           (cr.uid == getuid() || cr.uid == 0);
}

static void on_accept(mc_engine_t *e, mc_pollable_t *p, uint32_t events)
{
    (void)events;
    for (int i = 0; i < 64; i++) {
        int fd = accept4(p->fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0)
            return;
        shm_conn_t *c = same_user(fd) ? calloc(1, sizeof(*c)) : NULL;
        if (!c) {
            close(fd);
            continue;
        }
        c->p.fd = fd;
        c->slot = -1;
        c->p.handler = owner_handler;
        mc_list_push_back(&shm_of(e)->conns, &c->link);
        atomic_fetch_add(&e->n_links, 1);
        if (mc__epoll_add(e, &c->p, EPOLLIN))
            conn_bury(e, c);
    }
}

/* Progress context: send REVOKE for revoke_addr to every event connection. The request is
 * taken only once every REVOKE went out and revoke_left counts their ACKs: until then the
 * unregistering thread, which waits for both to be clear, sees it pending. */
static void revoke_start(mc_engine_t *e)
{
    shm_engine_t *se = shm_of(e);
    mc_list_t *pos, *tmp;
    shm_msg_t m = {.type = SHM_REVOKE, .addr = se->revoke_addr, .len = se->revoke_serial};

    se->revoke_left = 0;
    mc_list_for_each_safe(pos, tmp, &se->conns)
    {
        shm_conn_t *c = mc_container_of(pos, shm_conn_t, link);
        if (c->role != ROLE_EVENT)
            continue;
        if (mc__shm_send(c->p.fd, &m, -1) == 0) {
            c->owes_ack = true;
            se->revoke_left++;
        } else {
            conn_bury(e, c); /* it will drop its mappings on HUP */
        }
    }
    atomic_store(&se->revoke_req, false);
    mc__mem_wake(e);
}

/* Progress context: a revoke timed out; close the event connections still owing an ACK (their
 * peers drop every mapping of ours, and what they opened directly). */
static void revoke_abort(mc_engine_t *e)
{
    shm_engine_t *se = shm_of(e);
    mc_list_t *pos, *tmp;

    mc_list_for_each_safe(pos, tmp, &se->conns)
    {
        shm_conn_t *c = mc_container_of(pos, shm_conn_t, link);
        if (c->owes_ack)
            conn_bury(e, c);
    }
    se->revoke_left = 0;
}

static void revokes_settle(mc_engine_t *e);

/* Every pass: an unregistering thread may have asked for a revocation. */
static void shm_progress(mc_engine_t *e)
{
    shm_engine_t *se = shm_of(e);

    if (se->n_owed)
        revokes_settle(e);

    /* Looked at before they are taken: a locked exchange every pass costs a spinning host. The
     * unregistering thread sets no new request before this one is taken (revoked). */
    if (atomic_load_explicit(&se->revoke_req, memory_order_acquire))
        revoke_start(e);
    if (atomic_load_explicit(&se->revoke_abort, memory_order_relaxed) &&
        atomic_exchange(&se->revoke_abort, false))
        revoke_abort(e);
    mc__shm_msg_progress(e);
}

/* ---- initiator side ---- */

static void peer_unmap_all(shm_peer_t *s)
{
    pthread_rwlock_wrlock(&s->lock);
    atomic_fetch_add(&s->revokes, 1);
    for (size_t i = 0; i < s->n; i++)
        munmap(s->maps[i].local, s->maps[i].len);
    s->n = 0;
    pthread_rwlock_unlock(&s->lock);
}

/* A connection made from progress stops waiting for the owner's table. */
static void regtab_wait_stop(mc_engine_t *e, shm_peer_t *s)
{
    if (s->regtab_wait.fd >= 0)
        mc__epoll_del(e, &s->regtab_wait);
    s->regtab_wait.fd = -1;
}

/* What one poll says of the owner after copies through its mappings: its process exited (the
 * pidfd), or it closed our event socket. It cuts a peer that did not acknowledge a revocation in
 * time, and its unregister has returned then (the memory our mappings show may be free, or
 * another buffer's); our progress drops the mappings when it takes the hang-up in, and a copy
 * before that must not count. */
enum { OWNER_LIVE, OWNER_EXITED, OWNER_CUT };

static int owner_state(shm_peer_t *s)
{
    struct pollfd pfd[2] = {{.fd = s->pidfd, .events = POLLIN},
                            {.fd = s->ev.fd, .events = POLLRDHUP}}; /* (-1: left out) */

    if (poll(pfd, 2, 0) <= 0)
        return OWNER_LIVE;
    if (pfd[0].revents)
        return OWNER_EXITED;
    return pfd[1].revents & (POLLRDHUP | POLLHUP | POLLERR) ? OWNER_CUT : OWNER_LIVE;
}

static void owe_drop(mc_engine_t *e, shm_peer_t *s)
{
    if (s->owes)
        shm_of(e)->n_owed--;
    s->owes = false;
}

static void revoke_ack(mc_engine_t *e, shm_peer_t *s, uint64_t addr)
{
    shm_msg_t m = {.type = SHM_REVOKE_ACK, .addr = addr}; /* (the owner revokes one at a time) */

    owe_drop(e, s);
    mc__shm_send(s->ev.fd, &m, -1);
}

/* The owner unregisters its buffer at addr: our mappings of it go now (copies hold the lock),
 * and the acknowledgement once no copy of another transport uses it either. */
static void peer_revoke(mc_engine_t *e, shm_peer_t *s, uint64_t addr, uint64_t serial)
{
    pthread_rwlock_wrlock(&s->lock);
    atomic_fetch_add(&s->revokes, 1);
    for (size_t i = 0; i < s->n;) {
        if (addr >= s->maps[i].raddr && addr < s->maps[i].raddr + s->maps[i].len) {
            munmap(s->maps[i].local, s->maps[i].len);
            s->maps[i] = s->maps[--s->n];
        } else {
            i++;
        }
    }
    pthread_rwlock_unlock(&s->lock);
    if (s->peer && mc__revoke(e, s->peer, addr, serial)) {
        if (!s->owes)
            shm_of(e)->n_owed++;
        s->owes = true;
        s->owed_addr = addr;
        s->owed_serial = serial;
        return;
    }
    revoke_ack(e, s, addr);
}

/* Acknowledge the revocations whose last copy ended. */
static void revokes_settle(mc_engine_t *e)
{
    for (size_t i = 0; i < e->n_peers && shm_of(e)->n_owed; i++) {
        mc_peer_t *p = mc__peer_at(e, i);
        shm_peer_t *s = p ? p->tp[mc__shm_slot] : NULL;
        if (s && s->owes && !mc__revoke(e, s->peer, s->owed_addr, s->owed_serial))
            revoke_ack(e, s, s->owed_addr);
    }
}

/* The wait before a peer cut `cuts` times (1 at least) connects again. */
static unsigned redial_ms(unsigned cuts)
{
    return REDIAL_MS << (cuts - 1 < REDIAL_DOUBLINGS ? cuts - 1 : REDIAL_DOUBLINGS);
}

static void redial_stop(mc_engine_t *e, shm_peer_t *s)
{
    if (s->redial_ns)
        shm_of(e)->n_redial--;
    s->redial_ns = 0;
}

/* The owner answered on the new event socket. A mapping made since the cut (a thread that saw
 * the peer open before it) was never revoked: they all go, and later ones see the bump. */
static void peer_rejoined(mc_engine_t *e, shm_peer_t *s)
{
    s->rejoining = false;
    redial_stop(e, s);
    peer_unmap_all(s);
    s->up_ns = mc__now_ns();
    atomic_store_explicit(&s->state, SP_OPEN, memory_order_release);
    mc_info("shm to %s: the event socket it closed (a revocation not acknowledged in time?) is "
            "connected again: same-host copies resume",
            s->peer->name);
}

/* Whether the owner's engine still answers our requests: its request socket is open (a late
 * answer may wait there; nothing is taken from it). */
static bool owner_engine_up(shm_peer_t *s)
{
    char c;
    ssize_t n = recv(s->req_fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);

    return n > 0 || (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK));
}

static void peer_on_event(mc_engine_t *e, mc_pollable_t *p, uint32_t events)
{
    shm_peer_t *s = mc_container_of(p, shm_peer_t, ev);
    shm_msg_t m;
    int rc;

    (void)events;
    while ((rc = msg_recv(s->ev.fd, &m, NULL, MSG_DONTWAIT)) == 0) {
        if (m.type == SHM_REVOKE) {
            peer_revoke(e, s, m.addr, m.len);
        } else if ((m.type == SHM_GRANT_OK || m.type == SHM_GRANT_NO) && !m.addr && s->rejoining &&
                   s->peer) {
            peer_rejoined(e, s);
        } else if ((m.type == SHM_GRANT_OK || m.type == SHM_GRANT_NO) && s->peer) {
            mc__grant_answer(e, s->peer, m.addr, m.len, m.type == SHM_GRANT_OK);
        } else {
            rc = -EIO;
            break;
        }
    }
    if (rc != -EAGAIN) { /* the owner went away, cut us, or misbehaved: forget it */
        atomic_store(&s->state, SP_DEAD);
        s->rejoining = false;
        mc__epoll_del(e, &s->ev);
        regtab_wait_stop(e, s);
        peer_unmap_all(s);
        owe_drop(e, s);
        if (s->peer) /* no revocation reaches us any more: what was granted goes */
            mc__revoke(e, s->peer, 0, 0);
        /* its process lives (so far), and its engine too */
        if (s->peer && atomic_load(&s->exit_watched) && owner_engine_up(s)) {
            uint64_t now = mc__now_ns();
            if (now - s->up_ns >= REDIAL_FORGET_NS)
                s->cuts = 0;
            unsigned ms = redial_ms(++s->cuts);
            if (!s->redial_ns)
                shm_of(e)->n_redial++;
            s->redial_ns = now + ms * MC_MS;
            mc_debug("shm: the event socket to %s closed: its mappings are dropped and other "
                     "transports carry its tasks; connecting again in %u ms unless it is gone",
                     s->peer->name, ms);
        }
    }
}

/* Connect the event socket of s again (progress), over the old descriptor, and ask the owner
 * for an answer on it (a GRANT of address 0, which it refuses): once it answered, it has taken
 * the HELLO, so every revocation it starts from then on reaches us (peer_rejoined). */
static void peer_redial(mc_engine_t *e, shm_peer_t *s, uint64_t now)
{
    unsigned ms = redial_ms(s->cuts);
    shm_msg_t m = {.type = SHM_GRANT};

    if (s->rejoining) /* the last try was not answered in time */
        mc__epoll_del(e, &s->ev);
    s->rejoining = false;
    if (!owner_engine_up(s)) {
        redial_stop(e, s); /* its engine is gone: so are its buffers */
        return;
    }
    s->redial_ns = now + ms * MC_MS; /* the next try, unless the owner answers first */
    int fd = mc__shm_connect(s->addr, ROLE_EVENT, e->instance, 0);
    bool in = fd >= 0 && fcntl(fd, F_SETFL, 0) == 0 && dup3(fd, s->ev.fd, O_CLOEXEC) >= 0;
    int err = fd < 0 ? -fd : errno;
    if (fd >= 0)
        close(fd);
    if (in && !mc__epoll_add(e, &s->ev, EPOLLIN)) {
        if (!mc__shm_send(s->ev.fd, &m, -1)) {
            s->rejoining = true;
            return;
        }
        err = errno;
        mc__epoll_del(e, &s->ev);
    }
    if (in) /* the owner must not wait for acknowledgements on a socket nobody reads */
        shutdown(s->ev.fd, SHUT_RDWR);
    mc_debug("shm to %s: cannot connect the event socket again (%s): in %u ms", s->peer->name,
             strerror(err), ms);
}

static void shm_timers(mc_engine_t *e, uint64_t now)
{
    mc__shm_msg_timers(e);
    for (size_t i = 0; i < e->n_peers && shm_of(e)->n_redial; i++) {
        mc_peer_t *p = mc__peer_at(e, i);
        shm_peer_t *s = p ? p->tp[mc__shm_slot] : NULL;
        if (s && s->redial_ns && now >= s->redial_ns)
            peer_redial(e, s, now);
    }
}

/* The owner's pidfd became readable: its process exited, it is dead for every transport. */
static void peer_on_exit(mc_engine_t *e, mc_pollable_t *p, uint32_t events)
{
    shm_peer_t *s = mc_container_of(p, shm_peer_t, exit);

    (void)events;
    if (!s->peer) /* closed since epoll reported it (freed at the end of this pass) */
        return;
    mc__epoll_del(e, &s->exit);
    s->exit_watched = false;
    mc__peer_dead(e, s->peer, "its process %d exited", s->pid);
}

int mc__shm_connect(const char *name, uint32_t role, uint64_t instance, unsigned wait_ms)
{
    struct timeval tv = {.tv_sec = wait_ms / 1000, .tv_usec = (wait_ms % 1000) * 1000};
    struct sockaddr_un sun;
    int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | (wait_ms ? 0 : SOCK_NONBLOCK), 0);
    shm_msg_t m = {.type = SHM_HELLO, .arg = role, .instance = instance};

    if (fd < 0)
        return -errno;
    /* A full accept queue (an owner that does not accept) is waited for that long, not for
     * ever: then -EAGAIN, as without waiting. */
    if ((wait_ms && setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv)) < 0) ||
        connect(fd, (struct sockaddr *)&sun, sun_of(name, &sun)) < 0 ||
        send(fd, &m, sizeof(m), MSG_NOSIGNAL) != sizeof(m)) {
        int err = errno;
        close(fd);
        return -err;
    }
    return fd;
}

/* Ask the owner for its registration table and our slot in it (CMA needs both). */
static bool regtab_ask(shm_peer_t *s)
{
    shm_msg_t m = {.type = SHM_REGTAB, .instance = ++s->req_id};

    return send(s->req_fd, &m, sizeof(m), MSG_NOSIGNAL) == sizeof(m);
}

/* The answer to our last request on req_fd (flags: MSG_DONTWAIT, or 0 to wait up to the I/O
 * timeout). An answer to an earlier request, late after it timed out, is dropped with the
 * descriptor it brought, so that no request ever takes another's answer for its own. */
static int req_answer(shm_peer_t *s, shm_msg_t *m, int *fd_p, int flags)
{
    int rc;

    while (!(rc = msg_recv(s->req_fd, m, fd_p, flags)) && m->instance != s->req_id) {
        if (*fd_p >= 0)
            close(*fd_p);
        *fd_p = -1;
    }
    return rc;
}

/* The owner's answer m (with fd): the table, mapped; none if it sent something else. */
static void regtab_take(shm_peer_t *s, const shm_msg_t *m, int fd)
{
    if (m->type != SHM_REGTAB_OK || fd < 0 || m->arg >= MC_REGTAB_SLOTS ||
        (m->len && m->len != MC_REGTAB_LANES) || /* another size */
        !mc__memfd_holds(fd, sizeof(mc_regtab_t))) {
        if (fd >= 0)
            close(fd);
        return;
    }
    void *t = mmap(NULL, sizeof(mc_regtab_t), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (t != MAP_FAILED) {
        s->regtab = t;
        s->slot = (int)m->arg;
        s->lanes = m->len ? (unsigned)m->len : 1; /* an owner that says none watches one */
    }
}

/* Progress: the owner answered the table request of a connection made from progress. */
static void peer_on_regtab(mc_engine_t *e, mc_pollable_t *p, uint32_t events)
{
    shm_peer_t *s = mc_container_of(p, shm_peer_t, regtab_wait);
    shm_msg_t m;
    int fd = -1, rc;

    (void)events;
    if (!s->peer) /* closed since epoll reported it */
        return;
    if (atomic_load(&s->state) != SP_OPENING) { /* its owner went meanwhile */
        regtab_wait_stop(e, s);
        return;
    }
    rc = req_answer(s, &m, &fd, MSG_DONTWAIT);
    if (rc == -EAGAIN)
        return;
    regtab_wait_stop(e, s);
    if (!rc) {
        regtab_take(s, &m, fd);
    } else {
        if (fd >= 0)
            close(fd);
        mc_info("shm to %s unavailable (no answer to the table request): other transports "
                "carry its tasks",
                s->peer->name);
    }
    /* release: a host thread that sees SP_OPEN finds req_fd its own and the table set */
    atomic_store_explicit(&s->state, rc ? SP_DEAD : SP_OPEN, memory_order_release);
}

/* Connect to the owner: request and event sockets, its pidfd, its registration table. Without
 * wait (progress), the connections are made without blocking and the table's answer is taken
 * by progress (peer_on_regtab), which opens the peer. */
static int peer_connect(mc_engine_t *e, shm_peer_t *s, bool wait)
{
    struct timeval tv = {.tv_sec = e->cfg.io_timeout_ms / 1000,
                         .tv_usec = (e->cfg.io_timeout_ms % 1000) * 1000};
    struct ucred cred = {0};
    socklen_t cl = sizeof(cred);

    s->req_fd =
        mc__shm_connect(s->addr, ROLE_REQUEST, e->instance, wait ? e->cfg.io_timeout_ms : 0);
    s->ev.fd = mc__shm_connect(s->addr, ROLE_EVENT, e->instance, wait ? e->cfg.io_timeout_ms : 0);
    if (s->req_fd == -EAGAIN || s->ev.fd == -EAGAIN) { /* its accept queue is full: later */
        if (s->req_fd >= 0)
            close(s->req_fd);
        if (s->ev.fd >= 0)
            close(s->ev.fd);
        s->req_fd = s->ev.fd = -1;
        return -EAGAIN;
    }
    /* The owner's pid as our pid namespace sees it (0: not at all; the descriptor's is in its
     * own namespace): CMA and the death watch need the process itself. */
    if (s->req_fd >= 0 && getsockopt(s->req_fd, SOL_SOCKET, SO_PEERCRED, &cred, &cl) == 0)
        s->pid = cred.pid;
    s->pidfd = s->pid > 0 ? (int)syscall(SYS_pidfd_open, s->pid, 0) : -1;
    s->ev.handler = peer_on_event;
    if (s->req_fd < 0 || s->ev.fd < 0)
        return s->req_fd < 0 ? s->req_fd : s->ev.fd;
    if (s->pidfd < 0)
        return s->pid > 0 ? -errno : -ESRCH; /* its process is not in our pid namespace */
    /* blocking from here on, as a host thread's requests and the owner's events expect */
    if ((!wait && (fcntl(s->req_fd, F_SETFL, 0) < 0 || fcntl(s->ev.fd, F_SETFL, 0) < 0)) ||
        setsockopt(s->req_fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) < 0 ||
        mc__epoll_add(e, &s->ev, EPOLLIN))
        return -errno;
    s->exit.fd = s->pidfd;
    s->exit.handler = peer_on_exit;
    s->exit_watched = mc__epoll_add(e, &s->exit, EPOLLIN) == 0;
    if (!regtab_ask(s))
        return 0; /* no table: no CMA */
    if (wait) {
        shm_msg_t m;
        int fd = -1;
        if (!req_answer(s, &m, &fd, 0))
            regtab_take(s, &m, fd);
        else if (fd >= 0)
            close(fd);
        return 0;
    }
    s->regtab_wait.fd = s->req_fd;
    s->regtab_wait.handler = peer_on_regtab;
    if (mc__epoll_add(e, &s->regtab_wait, EPOLLIN)) {
        s->regtab_wait.fd = -1;
        return -errno;
    }
    return 0;
}

/* p's shm state, connected on first use (any submitting thread); NULL when it is unusable, or
 * not open yet. The progress context may not wait for the owner (whose progress may be waiting
 * for ours): there the first use starts the connection, and tasks take other transports until
 * progress has the owner's answer (SP_OPENING); so do a host thread's meanwhile. */
static shm_peer_t *peer_ready(mc_engine_t *e, mc_peer_t *p, bool may_block)
{
    shm_peer_t *s = p->tp[mc__shm_slot];
    int st = s ? atomic_load_explicit(&s->state, memory_order_acquire) : SP_DEAD;

    if (st == SP_NEW &&
        (may_block ? !pthread_mutex_lock(&s->open_lock) : !pthread_mutex_trylock(&s->open_lock))) {
        int rc = atomic_load(&s->state) == SP_NEW ? peer_connect(e, s, may_block) : -EAGAIN;
        if (rc && rc != -EAGAIN) /* -EAGAIN: its accept queue was full, a later use tries again */
            mc_info("shm to %s unavailable (%s): other transports carry its tasks", p->name,
                    strerror(-rc));
        /* from SP_NEW only: the owner's socket may have closed meanwhile (SP_DEAD) */
        int was = SP_NEW, next = rc ? SP_DEAD : s->regtab_wait.fd >= 0 ? SP_OPENING : SP_OPEN;
        if (rc != -EAGAIN)
            atomic_compare_exchange_strong_explicit(&s->state, &was, next, memory_order_release,
                                                    memory_order_relaxed);
        pthread_mutex_unlock(&s->open_lock);
        st = atomic_load_explicit(&s->state, memory_order_acquire);
    }
    return st == SP_OPEN ? s : NULL;
}

static void peer_free(shm_peer_t *s)
{
    peer_unmap_all(s);
    if (s->regtab)
        munmap(s->regtab, sizeof(mc_regtab_t));
    free(s->maps);
    if (s->req_fd >= 0)
        close(s->req_fd);
    if (s->ev.fd >= 0)
        close(s->ev.fd);
    if (s->pidfd >= 0)
        close(s->pidfd);
    pthread_mutex_destroy(&s->open_lock);
    pthread_mutex_destroy(&s->req_lock);
    for (unsigned l = 0; l < MC_REGTAB_LANES; l++)
        pthread_mutex_destroy(&s->cma_lock[l]);
    pthread_rwlock_destroy(&s->lock);
    free(s);
}

/* Room for one more mapping. Caller holds s->lock for writing. */
static int maps_grow(shm_peer_t *s)
{
    if (s->n < s->cap)
        return 0;
    size_t cap = s->cap ? 2 * s->cap : 8;
    shm_map_t *v = realloc(s->maps, cap * sizeof(*v));
    if (!v)
        return -ENOMEM;
    s->maps = v;
    s->cap = cap;
    return 0;
}

/* Map the owner's buffer [addr, addr+len). Caller holds nothing. -EAGAIN: a revocation ran
 * meanwhile, perhaps of this buffer (the owner sends it after its answer, and it found nothing
 * to unmap here yet): the mapping is dropped, and the caller goes by CMA, which asks the
 * owner's live table. */
static int map_buffer(shm_peer_t *s, uint64_t addr, uint64_t len)
{
    shm_msg_t m = {.type = SHM_MAP, .addr = addr, .len = len};
    uint64_t revokes = atomic_load(&s->revokes);
    int fd = -1, rc;
    void *p;

    pthread_mutex_lock(&s->req_lock);
    m.instance = ++s->req_id;
    rc = send(s->req_fd, &m, sizeof(m), MSG_NOSIGNAL) == sizeof(m) ? 0 : -EIO;
    if (!rc)
        rc = req_answer(s, &m, &fd, 0);
    pthread_mutex_unlock(&s->req_lock);
    if (!rc && (m.type != SHM_MAP_OK || fd < 0 || !mc__memfd_holds(fd, m.len)))
        rc = -MC_EACCESS;
    if (rc) {
        if (fd >= 0)
            close(fd);
        return rc;
    }
    p = mmap(NULL, m.len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED)
        return -errno;
    pthread_rwlock_wrlock(&s->lock);
    rc = atomic_load(&s->revokes) != revokes ? -EAGAIN : maps_grow(s);
    if (!rc)
        s->maps[s->n++] = (shm_map_t){.raddr = m.addr, .len = m.len, .local = p};
    pthread_rwlock_unlock(&s->lock);
    if (rc)
        munmap(p, m.len);
    return rc;
}

/* The local address of remote [addr, addr+len), or NULL. Caller holds s->lock. */
static uint8_t *find_map(shm_peer_t *s, uint64_t addr, uint64_t len)
{
    for (size_t i = 0; i < s->n; i++) {
        const shm_map_t *m = &s->maps[i];
        if (addr >= m->raddr && len <= m->len && addr - m->raddr <= m->len - len)
            return m->local + (addr - m->raddr);
    }
    return NULL;
}

/* Copy a run of tasks to one owner through its mappings, starting at tasks[i], under one read
 * lock (revocations wait for it). A buffer not mapped yet is mapped first if the caller may
 * block. Returns the end of the run: i if tasks[i] cannot go this way. */
static size_t copy_run(shm_peer_t *s, mc_task_t *tasks, size_t i, size_t n, bool may_block)
{
    size_t j = i;

    pthread_rwlock_rdlock(&s->lock);
    for (; j < n; j++) {
        const mc_request_t *r = &tasks[j].req;
        if (tasks[j].peer != tasks[i].peer || tasks[j].tp != mc__shm_slot ||
            tasks[j].tp_hint != SHM_BY_MAP || atomic_load(&tasks[j].state) != MC_TASK_WAITING)
            break;
        uint8_t *remote = find_map(s, r->target_offset, r->length);
        if (!remote && !may_block)
            break;
        if (!remote) { /* first use of this buffer: map it (takes the write lock) */
            pthread_rwlock_unlock(&s->lock);
            int rc = map_buffer(s, r->target_offset, r->length);
            pthread_rwlock_rdlock(&s->lock);
            if (rc || !(remote = find_map(s, r->target_offset, r->length)))
                break;
        }
        if (r->opcode == MC_WRITE)
            memcpy(remote, r->local, r->length);
        else
            memcpy(r->local, remote, r->length);
    }
    pthread_rwlock_unlock(&s->lock);
    return j;
}

void mc__shm_task_done(mc_engine_t *e, mc_task_t *d)
{
    int cnt = d->req.opcode == MC_READ ? MC_CNT_READ : MC_CNT_WRITTEN;

    mc__task_add_bytes(d, d->req.length);
    mc__peer_count(d, cnt, d->req.length);
    mc__peer_count(d, MC_CNT_REQUESTS, 1);
    mc__tp_count(e, mc__shm_slot, cnt, d->req.length);
    mc__tp_count(e, mc__shm_slot, MC_CNT_REQUESTS, 1);
    mc__task_finish(d, MC_TASK_COMPLETED, 0, NULL);
}

/* Tasks [i, j) moved (a copy through mappings): one look at the owner decides (owner_state).
 * Once it cut us the copies may have gone to memory it let go of, so the tasks go again over
 * the next transport, which the owner checks. */
static void settle(mc_engine_t *e, shm_peer_t *s, mc_task_t *tasks, size_t i, size_t j)
{
    int owner = owner_state(s);

    for (size_t k = i; k < j; k++) {
        if (owner == OWNER_EXITED)
            mc__task_finish(&tasks[k], MC_TASK_FAILED, -MC_EPEERDEAD,
                            "segment %s: owner process exited", tasks[k].peer->name);
        else if (owner == OWNER_CUT)
            mc__task_reroute(e, &tasks[k]);
        else
            mc__shm_task_done(e, &tasks[k]);
    }
}

/* In the submitting thread, or in progress for tasks that waited for a descriptor: there,
 * nothing that waits for the owner (a first connection, a first mapping). A buffer not mapped
 * there (or whose mapping failed) is reached by CMA, which needs nothing of the owner; what
 * neither reaches goes over the next transport. */
static void shm_submit(mc_engine_t *e, mc_task_t *tasks, size_t n)
{
    bool may_block = !mc__in_progress();

    for (size_t i = 0; i < n; i++) {
        mc_task_t *t = &tasks[i];
        shm_peer_t *s;
        size_t j = i;
        if (t->tp != mc__shm_slot || atomic_load(&t->state) != MC_TASK_WAITING)
            continue;
        s = peer_ready(e, t->peer, may_block);
        if (s && t->tp_hint == SHM_BY_MAP) {
            j = copy_run(s, tasks, i, n, may_block);
            if (j > i)
                settle(e, s, tasks, i, j);
            else /* not mapped, and mapping waits for the owner (not here) or failed */
                t->tp_hint = SHM_BY_CMA;
        }
        if (j == i && s && t->tp_hint == SHM_BY_CMA && s->regtab && !atomic_load(&s->cma_off))
            j = mc__shm_cma(e, s, tasks, i, n);
        if (j > i)
            i = j - 1;
        else /* it cannot go through shared memory after all */
            mc__task_reroute(e, t);
    }
}

/* Same host (boot id and network namespace), an owner that publishes its socket, our uid: a
 * peer reaches it, and it is preferred to every network transport. */
static int shm_peer_update(mc_engine_t *e, mc_peer_t *p)
{
    const char *addr = p->desc.tp[mc__shm_slot];
    shm_peer_t *s;

    if (p->tp[mc__shm_slot])
        return 30; /* reloads keep what is open */
    /* To ourselves, tcp: opening our own socket would wait for our own progress. */
    if (!p->local_host || !addr || p->desc.instance == e->instance)
        return 0;
    s = calloc(1, sizeof(*s));
    if (!s)
        return mc__set_error(-ENOMEM, "out of memory");
    snprintf(s->addr, sizeof(s->addr), "%s", addr);
    s->peer = p;
    s->pid = p->desc.pid;
    s->req_fd = s->ev.fd = s->pidfd = s->regtab_wait.fd = -1;
    pthread_mutex_init(&s->open_lock, NULL);
    pthread_mutex_init(&s->req_lock, NULL);
    for (unsigned l = 0; l < MC_REGTAB_LANES; l++)
        pthread_mutex_init(&s->cma_lock[l], NULL);
    pthread_rwlock_init(&s->lock, NULL);
    mc_list_init(&s->link);
    mc__shm_tx_init(&s->tx, p);
    p->tp[mc__shm_slot] = s;
    return 30;
}

/* The peer goes away: drop its mappings now; free the rest at the end of the pass (an event
 * of its socket may already be fetched). */
static void shm_peer_close(mc_engine_t *e, mc_peer_t *p)
{
    shm_peer_t *s = p->tp[mc__shm_slot];

    int st = atomic_exchange(&s->state, SP_DEAD);
    if (st == SP_OPEN || st == SP_OPENING || s->rejoining)
        mc__epoll_del(e, &s->ev);
    s->rejoining = false;
    regtab_wait_stop(e, s);
    if (s->exit_watched)
        mc__epoll_del(e, &s->exit);
    s->exit_watched = false;
    s->peer = NULL;
    owe_drop(e, s);
    redial_stop(e, s);
    mc__shm_tx_close(e, &s->tx);
    peer_unmap_all(s);
    mc_list_push_back(&shm_of(e)->peers_grave, &s->link);
    mc__reap_mark(e, mc__shm_slot);
    p->tp[mc__shm_slot] = NULL;
}

/* Host memory only; engine memory of the owner through a mapping, other registered memory by
 * CMA (checked against the owner's live table when it moves). */
static const char *shm_accept(mc_engine_t *e, mc_task_t *t, const mc_desc_buffer_t *rb)
{
    if (t->vram)
        return "host memory only";
    t->tp_hint = mc__desc_part(&t->peer->desc, rb, mc__shm_slot) ? SHM_BY_MAP : SHM_BY_CMA;
    (void)e;
    return NULL;
}

static void shm_reap(mc_engine_t *e)
{
    shm_engine_t *se = shm_of(e);
    mc_list_t *n;

    mc__shm_msg_give(e);
    mc__shm_rx_lent_free(e, false);
    while ((n = mc_list_pop_front(&se->grave)))
        free(mc_container_of(n, shm_conn_t, link));
    while ((n = mc_list_pop_front(&se->peers_grave)))
        peer_free(mc_container_of(n, shm_peer_t, link));
}

/* ---- setup, memory, descriptor ---- */

#define CMA_HELPERS_AUTO 3 /* at most, and one core less than the machine has */

static int parse_helpers(const char *value, uint64_t *num_p)
{
    char *end;

    if (!strcmp(value, "auto")) {
        cpu_set_t set;
        int cpus = sched_getaffinity(getpid(), sizeof(set), &set) ? 1 : CPU_COUNT(&set);
        *num_p = cpus <= 1                     ? 0
                 : cpus - 1 < CMA_HELPERS_AUTO ? (uint64_t)cpus - 1
                                               : CMA_HELPERS_AUTO;
        return 0;
    }
    errno = 0;
    *num_p = strtoull(value, &end, 10);
    if (errno || end == value || *end || *num_p >= MC_REGTAB_LANES)
        return mc__set_error(-MC_ECONFIG, "expected auto or 0 to %d", MC_REGTAB_LANES - 1);
    return 0;
}

static const mc_setting_t shm_settings[] = {
    {"SHM_CMA_THREADS", "auto", 0, 0, parse_helpers,
     "helper threads that move a long run of same-host CMA requests next to the submitting "
     "thread; auto: one less than the CPUs the process may use, at most 3; 0: none"},
    {"SHM_MEMBARRIER", "1", 0, 0, mc__parse_bool,
     "same-host message rings skip a fence per message while their other side spins, and "
     "that side runs one membarrier(2) before it first sleeps (and again after a timer tick "
     "spent spinning); 0: the fence every time"},
    {0},
};

static int shm_init(mc_engine_t *e)
{
    struct sockaddr_un sun;
    shm_engine_t *se;
    int fd;

    if (e->cfg.auth_token[0]) { /* it authenticates by uid only: keep it off then */
        mc_info("shm: off (MC_AUTH_TOKEN is set)");
        return 0;
    }
    se = calloc(1, sizeof(*se));
    if (!se)
        return mc__set_error(-ENOMEM, "out of memory");
    snprintf(se->name, sizeof(se->name), "mooncake/%016llx", (unsigned long long)e->instance);
    mc_list_init(&se->conns);
    mc_list_init(&se->grave);
    mc_list_init(&se->peers_grave);
    mc_list_init(&se->rx_rings);
    mc_list_init(&se->rx_lent);
    mc_list_init(&se->tx_busy);
    mc_list_init(&se->tx_slept);
    pthread_mutex_init(&se->revoke_mutex, NULL);
    pthread_mutex_init(&se->crew_lock, NULL);
    se->cma_helpers = (unsigned)mc__config_num(e->conf, "SHM_CMA_THREADS");
    se->mb = mc__wake_mb_init(mc__config_num(e->conf, "SHM_MEMBARRIER") != 0);
    se->listen.fd = -1;
    fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0 || bind(fd, (struct sockaddr *)&sun, sun_of(se->name, &sun)) < 0 ||
        listen(fd, 256) < 0) {
        mc_warn("shm transport off: cannot listen on a unix socket: %s", strerror(errno));
        if (fd >= 0)
            close(fd);
        pthread_mutex_destroy(&se->revoke_mutex);
        pthread_mutex_destroy(&se->crew_lock);
        free(se);
        return 0;
    }
    se->listen.fd = fd;
    se->listen.handler = on_accept;
    e->tp[mc__shm_slot] = se;
    if (mc__shm_regtab_create(e))
        mc_warn("shm: no shared registration table (%s): CMA off", strerror(errno));
    return mc__epoll_add(e, &se->listen, EPOLLIN);
}

static void shm_stop(mc_engine_t *e)
{
    shm_engine_t *se = shm_of(e);

    /* before our memory goes (memtab_fini, or the host's free) */
    if (!mc__shm_regtab_withdraw(e)) {
        e->mem.keep_mapped = true;
        mc_warn("shm: a same-host peer's copy did not end within MC_IO_TIMEOUT_MS: the "
                "engine's allocations stay mapped (leaked), and memory the host registered may "
                "still be written after the engine is destroyed");
    }
    while (!mc_list_empty(&se->conns))
        conn_bury(e, mc_container_of(se->conns.next, shm_conn_t, link));
    if (se->listen.fd >= 0) {
        mc__epoll_del(e, &se->listen);
        close(se->listen.fd);
        se->listen.fd = -1;
    }
}

static void shm_fini(mc_engine_t *e)
{
    shm_engine_t *se = shm_of(e);

    shm_reap(e);
    mc__shm_rx_lent_free(e, true);
    mc__crew_destroy(se->crew);
    mc__shm_regtab_destroy(e);
    pthread_mutex_destroy(&se->revoke_mutex);
    pthread_mutex_destroy(&se->crew_lock);
    free(se);
    e->tp[mc__shm_slot] = NULL;
}

static void shm_mem_changed(mc_engine_t *e)
{
    mc__shm_regtab_publish(e);
}

static bool revoked(mc_engine_t *e, void *arg)
{
    shm_engine_t *se = shm_of(e);

    (void)arg;
    return !atomic_load(&se->revoke_req) && !atomic_load(&se->revoke_left);
}

/* Unregister: wait out peers' CMA calls that may have seen b, then, for engine memory, have
 * every same-host peer unmap it and acknowledge. One that does not answer within
 * MC_IO_TIMEOUT_MS is disconnected, which makes it drop every mapping of ours. -MC_ETIMEOUT if a
 * peer's call on our memory outlasted MC_IO_TIMEOUT_MS (it may still write b: the unregister
 * fails, and b stays until a later one finds no call left). */
static int shm_mem_release(mc_engine_t *e, mc_buffer_t *b)
{
    shm_engine_t *se = shm_of(e);

    if (!mc__shm_regtab_grace(e, mc__now_ns() + (uint64_t)e->cfg.io_timeout_ms * MC_MS))
        return mc__set_error(-MC_ETIMEOUT,
                             "unregister 0x%llx: a same-host peer's copy on our memory did not "
                             "finish within MC_IO_TIMEOUT_MS",
                             (unsigned long long)b->addr);
    if (b->memfd < 0 && !b->vram) /* VRAM: peers may have opened it (GRANT) */
        return 0;
    uint64_t end = mc__now_ns() + (uint64_t)e->cfg.io_timeout_ms * MC_MS;
    pthread_mutex_lock(&se->revoke_mutex);
    /* One an unregister gave up on goes first: its buffer stayed mapped, and the address it
     * names must not be overwritten before progress sent it. */
    if (!revoked(e, NULL) && !mc__mem_wait(e, revoked, NULL, end)) {
        pthread_mutex_unlock(&se->revoke_mutex);
        return mc__set_error(-MC_ETIMEOUT,
                             "unregister 0x%llx: the revocation of an earlier unregister is still "
                             "under way (the progress context did not run it)",
                             (unsigned long long)b->addr);
    }
    se->revoke_addr = b->addr;
    se->revoke_serial = b->serial;
    atomic_store(&se->revoke_req, true);
    mc__doorbell(e);
    if (!mc__mem_wait(e, revoked, NULL, end)) {
        mc_warn("unregister 0x%llx: %u same-host peers did not acknowledge; disconnecting them",
                (unsigned long long)b->addr, atomic_load(&se->revoke_left));
        atomic_store(&se->revoke_abort, true);
        mc__doorbell(e);
        if (!mc__mem_wait(e, revoked, NULL, mc__now_ns() + 1000 * MC_MS)) {
            /* Progress did not even send it (stuck in a callback, say): peers may still map b.
             * It stays registered and mapped, so that its address is not handed out again. */
            pthread_mutex_unlock(&se->revoke_mutex);
            return mc__set_error(-MC_ETIMEOUT,
                                 "unregister 0x%llx: same-host peers may still map it (the "
                                 "progress context did not revoke it within MC_IO_TIMEOUT_MS "
                                 "+ 1 s)",
                                 (unsigned long long)b->addr);
        }
    }
    pthread_mutex_unlock(&se->revoke_mutex);
    return 0;
}

/* About to sleep: not while an acknowledgement waits for copies (they end in a reap, and it
 * goes at the next pass), else as the message rings say. */
static bool shm_idle(mc_engine_t *e)
{
    return mc__shm_msg_idle(e) || shm_of(e)->n_owed;
}

/* Ask p before a first direct access to its buffer at addr (see the top of the file): on the
 * event connection, made now without waiting if it is not yet. */
static int shm_grant_ask(mc_engine_t *e, mc_peer_t *p, uint64_t addr, uint64_t serial)
{
    shm_peer_t *s = p->tp[mc__shm_slot];
    shm_msg_t m = {.type = SHM_GRANT, .addr = addr, .len = serial};

    if (!s)
        return -ENOTCONN;
    peer_ready(e, p, false);
    int st = atomic_load_explicit(&s->state, memory_order_acquire);
    if (st == SP_NEW)
        return -EAGAIN;
    if (st == SP_DEAD)
        return -ENOTCONN;
    if (mc__shm_send(s->ev.fd, &m, -1))
        return errno == EAGAIN ? -EAGAIN : -ENOTCONN;
    return 0;
}

/* Our socket in "endpoints"; a buffer same-host peers may map is marked "shm": true. */
static int shm_encode(mc_engine_t *e, json_t *root)
{
    json_t *eps = json_object_get(root, "endpoints");

    if (!eps && (json_object_set_new(root, "endpoints", json_array()) ||
                 !(eps = json_object_get(root, "endpoints"))))
        return -ENOMEM;
    return json_array_append_new(
               eps, json_pack("{s:s,s:s}", "transport", "shm", "addr", shm_of(e)->name))
               ? -ENOMEM
               : 0;
}

static int shm_encode_buffer(mc_engine_t *e, const mc_buffer_t *b, json_t *jb)
{
    (void)e;
    return b->memfd >= 0 && json_object_set_new(jb, "shm", json_true()) ? -ENOMEM : 0;
}

/* Keys: one byte, 1, for a buffer same-host peers may map (as "shm": true). */
static int shm_key_pack(mc_engine_t *e, const mc_buffer_t *b, uint8_t *out, size_t cap)
{
    (void)e;
    if (b->memfd < 0 || cap < 1)
        return 0;
    out[0] = 1;
    return 1;
}

const mc_transport_ops_t mc__shm_ops = {
    .size = sizeof(mc_transport_ops_t),
    .name = "shm",
    .slot = &mc__shm_slot,
    .codec = &mc__shm_codec,
    .settings = shm_settings,
    .init = shm_init,
    .stop = shm_stop,
    .fini = shm_fini,
    .encode = shm_encode,
    .encode_buffer = shm_encode_buffer,
    .key_pack = shm_key_pack,
    .mem_changed = shm_mem_changed,
    .mem_release = shm_mem_release,
    .peer_update = shm_peer_update,
    .peer_close = shm_peer_close,
    .accept = shm_accept,
    .submit = shm_submit,
    .progress = shm_progress,
    .timers = shm_timers,
    .reap = shm_reap,
    .fill = mc__shm_msg_fill,
    .msg_open = mc__shm_msg_open,
    .msg_settle = mc__shm_msg_settle,
    .msg_lending = mc__shm_msg_lending,
    .idle = shm_idle,
    .grant_ask = shm_grant_ask,
    .msg_direct = true,
    .express = mc__shm_msg_express,
    .reap_marked = true,
};

shm_tx_t *mc__shm_peer_tx(mc_peer_t *p)
{
    shm_peer_t *s = p->tp[mc__shm_slot];

    return s ? &s->tx : NULL;
}

const char *mc__shm_peer_addr(mc_peer_t *p)
{
    shm_peer_t *s = p->tp[mc__shm_slot];

    return s ? s->addr : NULL;
}
