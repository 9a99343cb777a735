/* Handshake proofs, and the one-shot client that fetches a descriptor from a peer by its
 * ip:port (no metadata server needed).
 *
 * With a shared secret, each side proves it knows MC_AUTH_TOKEN by an HMAC over both nonces and
 * its own name; the roles are part of the MAC so one side's proof can't be replayed as the
 * other's. */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "tcp_int.h"

int mc__tcp_proof(const char *token, const char *role, const uint8_t *a, const uint8_t *b,
                  const char *name, uint8_t out[32])
{
    struct iovec parts[4] = {
        {(void *)role, strlen(role) + 1},
        {(void *)a, MC_PROTO_NONCE_LEN},
        {(void *)b, MC_PROTO_NONCE_LEN},
        {(void *)name, strlen(name)},
    };

    return mc__hmac_sha256(token, strlen(token), parts, 4, out);
}

/* ---- blocking helpers for the one-shot client ---- */

static int connect_timeout(const struct sockaddr_storage *sa, socklen_t len, unsigned ms)
{
    int fd = socket(sa->ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    struct pollfd pfd = {.fd = fd, .events = POLLOUT};
    int err = 0;
    socklen_t elen = sizeof(err);

    if (fd < 0)
        return -errno;
    if (connect(fd, (const struct sockaddr *)sa, len) < 0) {
        if (errno != EINPROGRESS || poll(&pfd, 1, (int)ms) != 1 ||
            getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &elen) < 0 || err) {
            err = err ? err : (errno == EINPROGRESS ? ETIMEDOUT : errno);
            close(fd);
            return -err;
        }
    }
    return fd;
}

/* All of buf by end (mc__now_ns; a peer that sends a byte now and then does not hold it
 * longer). */
static int io_all(int fd, void *buf, size_t len, bool out, uint64_t end)
{
    uint8_t *p = buf;

    while (len) {
        struct pollfd pfd = {.fd = fd, .events = out ? POLLOUT : POLLIN};
        uint64_t now = mc__now_ns();
        if (now >= end || poll(&pfd, 1, (int)((end - now + MC_MS - 1) / MC_MS)) != 1)
            return -MC_ETIMEOUT;
        ssize_t n = out ? send(fd, p, len, MSG_NOSIGNAL) : recv(fd, p, len, 0);
        if (n == 0 || (n < 0 && errno != EINTR && errno != EAGAIN))
            return -MC_EPEERDEAD;
        if (n > 0) {
            p += n;
            len -= (size_t)n;
        }
    }
    return 0;
}

/* One frame within ms in all. */
static int send_frame(int fd, mc_frame_t *f, const void *payload, uint32_t len, unsigned ms)
{
    uint64_t end = mc__now_ns() + (uint64_t)ms * MC_MS;
    uint8_t hdr[MC_FRAME_HDR_LEN];
    int rc;

    f->length = len;
    mc__tcp_frame_encode(f, hdr);
    rc = io_all(fd, hdr, sizeof(hdr), true, end);
    if (!rc && len)
        rc = io_all(fd, (void *)payload, len, true, end);
    return rc;
}

/* Receive one frame of the expected type into a malloc'ed payload. ERROR frames become the
 * peer's error code and reason. */
static int recv_frame(mc_engine_t *e, int fd, uint8_t type, mc_frame_t *f, char **payload_p)
{
    uint8_t hdr[MC_FRAME_HDR_LEN];
    uint64_t end = mc__now_ns() + (uint64_t)e->cfg.connect_timeout_ms * MC_MS; /* the frame's */
    int rc = io_all(fd, hdr, sizeof(hdr), false, end);
    char *p;

    if (!rc)
        rc = mc__tcp_frame_decode(hdr, e->cfg.handshake_max, f);
    if (!rc && f->type != type && f->type != MC_FR_ERROR) /* (before its payload's memory) */
        rc = mc__set_error(-MC_EPROTO, "expected %s, got %s", mc__tcp_frame_type_name(type),
                           mc__tcp_frame_type_name(f->type));
    if (rc)
        return rc;
    p = malloc((size_t)f->length + 1);
    if (!p)
        return -ENOMEM;
    rc = io_all(fd, p, f->length, false, end);
    p[f->length] = 0;
    if (!rc && f->type == MC_FR_ERROR)
        rc = mc__set_error((int)(int64_t)f->aux ? (int)(int64_t)f->aux : -MC_EPROTO, "peer: %s", p);
    if (rc) {
        free(p);
        return rc;
    }
    *payload_p = p;
    return 0;
}

static int client_auth(mc_engine_t *e, int fd, const uint8_t *nonce, const mc_frame_t *rf,
                       const mc_hello_t *r)
{
    const char *token = e->cfg.auth_token;
    bool need = rf->flags & MC_HELLO_AUTH_REQUIRED;
    uint8_t proof[32];
    mc_frame_t f = {.type = MC_FR_AUTH};
    char *ready;
    int rc;

    if (need != (token[0] != 0))
        return mc__set_error(-MC_EAUTH, need ? "peer requires MC_AUTH_TOKEN"
                                             : "peer does not authenticate (MC_AUTH_TOKEN set)");
    if (!need)
        return 0;
    rc = mc__tcp_proof(token, "target", nonce, r->nonce, r->name, proof);
    if (rc)
        return rc;
    if (!mc__ct_equal(proof, r->proof, sizeof(proof)))
        return mc__set_error(-MC_EAUTH, "peer's proof of MC_AUTH_TOKEN is wrong");
    rc = mc__tcp_proof(token, "initiator", r->nonce, nonce, e->name, proof);
    if (!rc)
        rc = send_frame(fd, &f, proof, sizeof(proof), e->cfg.connect_timeout_ms);
    if (!rc)
        rc = recv_frame(e, fd, MC_FR_READY, &f, &ready);
    if (!rc)
        free(ready);
    return rc;
}

static int client_hello(mc_engine_t *e, int fd)
{
    mc_hello_t h = {.instance = e->instance}, r;
    uint8_t buf[MC_PROTO_MAX_CTRL];
    mc_frame_t f = {.type = MC_FR_HELLO, .id = 0};
    char *reply;
    int rc;

    mc__random_bytes(h.nonce, sizeof(h.nonce));
    snprintf(h.name, sizeof(h.name), "%s", e->name);
    rc =
        send_frame(fd, &f, buf, (uint32_t)mc__tcp_hello_encode(&h, buf), e->cfg.connect_timeout_ms);
    if (!rc)
        rc = recv_frame(e, fd, MC_FR_HELLO_REPLY, &f, &reply);
    if (rc)
        return rc;
    rc = mc__tcp_hello_decode((uint8_t *)reply, f.length, &r);
    free(reply);
    if (!rc)
        rc = client_auth(e, fd, h.nonce, &f, &r);
    return rc;
}

int mc__tcp_fetch_desc(mc_engine_t *e, const char *ip_port, char **json_p, size_t *len_p)
{
    struct sockaddr_storage sa;
    socklen_t sa_len;
    mc_frame_t f = {.type = MC_FR_DESC_REQ};
    char *json;
    int fd, rc;

    if (mc__parse_ip_port(ip_port, &sa, &sa_len))
        return mc__set_error(-EINVAL, "\"%s\" is not ip:port", ip_port);
    fd = connect_timeout(&sa, sa_len, e->cfg.connect_timeout_ms);
    if (fd < 0)
        return mc__set_error(-MC_ENOSEGMENT, "segment %s: connect: %s", ip_port, strerror(-fd));
    rc = client_hello(e, fd);
    if (!rc)
        rc = send_frame(fd, &f, NULL, 0, e->cfg.connect_timeout_ms);
    if (!rc)
        rc = recv_frame(e, fd, MC_FR_DESC_REPLY, &f, &json);
    close(fd);
    if (rc) {
        if (!*mc_last_error() || rc == -MC_ETIMEOUT || rc == -MC_EPEERDEAD)
            mc__set_error(rc, "segment %s: handshake failed: %s", ip_port, mc_strerror(rc));
        return rc;
    }
    *json_p = json;
    *len_p = f.length;
    return 0;
}
