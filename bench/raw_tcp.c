/* mc-raw-tcp: the best-case TCP peer for the engine's tcp transport.  Plain blocking send/recv
 * loops, TCP_NODELAY, one thread per connection, each cycling through its slice of a working set
 * in block_size steps.  Data always flows from the target to the initiator for "read" and from
 * the initiator to the target for "write"; the initiator measures.
 *
 *   --mode local                 fork a target on 127.0.0.1 and measure against it (default)
 *   --mode target [--host H] [--port P]   serve one session (for runs across namespaces)
 *   --mode initiator --host H --port P    run against such a target
 *
 * Per connection: the initiator sends a hello (operation, sizes, duration); the target answers
 * one byte once its buffer is faulted in, so the clock starts with both sides ready.  For write
 * the initiator sends for the duration, shuts down its side and reads the target's 8-byte count
 * of received bytes (so only delivered data counts); for read the target sends for the duration
 * and shuts down, and the initiator counts until EOF. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* accept4, process_vm_readv */
#endif
#include "bench_common.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#define MC_TCP_MAGIC     0x6d637274u /* "mcrt" */
#define MC_TCP_MAX_CONNS 64

enum { MC_TCP_LOCAL, MC_TCP_TARGET, MC_TCP_INITIATOR };

typedef struct mc_tcp_opts {
    int mode;
    int write;
    unsigned conns;
    const char *host;
    unsigned port;
} mc_tcp_opts_t;

/* Sent once per connection by the initiator; both ends run on the same architecture. */
typedef struct mc_tcp_hello {
    uint32_t magic;
    uint32_t write;
    uint64_t block_size;
    uint64_t buffer_size;
    uint64_t duration_us;
    uint32_t conn;
    uint32_t conns;
} mc_tcp_hello_t;

/* One connection's work, run by its own thread. */
typedef struct mc_tcp_conn {
    int fd;
    int send;      /* this end sends (else receives) */
    int initiator; /* this end measures */
    char *slice;   /* this connection's part of the working set */
    size_t span;   /* bytes of slice used, a multiple of block */
    size_t block;
    double deadline;     /* senders stop at this time */
    uint64_t bytes;      /* sent or received payload */
    uint64_t peer_bytes; /* write: what the target reports it received */
    double end;          /* when this connection's transfer was over */
    int rc;
} mc_tcp_conn_t;

static int mc_tcp_opt(void *ctx, const char *name, const char *value)
{
    mc_tcp_opts_t *to = ctx;
    char *end;
    unsigned long v;

    if (strcmp(name, "mode") == 0) {
        if (strcmp(value, "local") == 0) {
            to->mode = MC_TCP_LOCAL;
        } else if (strcmp(value, "target") == 0) {
            to->mode = MC_TCP_TARGET;
        } else if (strcmp(value, "initiator") == 0) {
            to->mode = MC_TCP_INITIATOR;
        } else {
            return -EINVAL;
        }
        return 1;
    }
    if (strcmp(name, "operation") == 0) {
        if (strcmp(value, "read") != 0 && strcmp(value, "write") != 0) {
            return -EINVAL;
        }
        to->write = strcmp(value, "write") == 0;
        return 1;
    }
    if (strcmp(name, "host") == 0) {
        to->host = value;
        return 1;
    }
    if (strcmp(name, "connections") == 0 || strcmp(name, "port") == 0) {
        v = strtoul(value, &end, 0);
        if (end == value || *end != '\0') {
            return -EINVAL;
        }
        if (name[0] == 'c') {
            if (v == 0 || v > MC_TCP_MAX_CONNS) {
                return -EINVAL;
            }
            to->conns = (unsigned)v;
        } else {
            if (v > 65535) {
                return -EINVAL;
            }
            to->port = (unsigned)v;
        }
        return 1;
    }
    return 0;
}

static int mc_tcp_send_all(int fd, const void *buf, size_t len)
{
    const char *p = buf;
    ssize_t n;

    while (len > 0) {
        n = send(fd, p, len, MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EINTR) {
                continue;
            }
            return -errno;
        }
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

/* Reads up to len bytes; returns how many (fewer only at EOF) or -errno. */
static ssize_t mc_tcp_recv_all(int fd, void *buf, size_t len)
{
    char *p = buf;
    size_t got = 0;
    ssize_t n;

    while (got < len) {
        n = recv(fd, p + got, len - got, 0);
        if (n < 0) {
            if (errno == EINTR) {
                continue;
            }
            return -errno;
        }
        if (n == 0) {
            break;
        }
        got += (size_t)n;
    }
    return (ssize_t)got;
}

static void mc_tcp_nodelay(int fd)
{
    int one = 1;

    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

/* Sends blocks until the deadline, then shuts down the sending side. */
static int mc_tcp_sender(mc_tcp_conn_t *c)
{
    size_t off = 0;
    int rc;

    do {
        rc = mc_tcp_send_all(c->fd, c->slice + off, c->block);
        if (rc != 0) {
            fprintf(stderr, "send: %s\n", strerror(-rc));
            return rc;
        }
        c->bytes += c->block;
        off = off + c->block == c->span ? 0 : off + c->block;
    } while (mc_bench_now() < c->deadline);
    shutdown(c->fd, SHUT_WR);
    return 0;
}

/* Receives block by block until EOF. */
static int mc_tcp_receiver(mc_tcp_conn_t *c)
{
    size_t off = 0;
    ssize_t n;

    for (;;) {
        n = mc_tcp_recv_all(c->fd, c->slice + off, c->block);
        if (n < 0) {
            fprintf(stderr, "recv: %s\n", strerror((int)-n));
            return (int)n;
        }
        c->bytes += (uint64_t)n;
        if ((size_t)n < c->block) {
            return 0;
        }
        off = off + c->block == c->span ? 0 : off + c->block;
    }
}

static void *mc_tcp_conn_main(void *arg)
{
    mc_tcp_conn_t *c = arg;
    uint64_t count;

    c->rc = c->send ? mc_tcp_sender(c) : mc_tcp_receiver(c);
    if (c->rc == 0 && c->send && c->initiator) {
        /* write: the transfer is over when the target has counted everything. */
        if (mc_tcp_recv_all(c->fd, &count, sizeof(count)) != (ssize_t)sizeof(count)) {
            fprintf(stderr, "the target did not report its byte count\n");
            c->rc = -EPROTO;
        }
        c->peer_bytes = count;
    } else if (c->rc == 0 && !c->send && !c->initiator) {
        count = c->bytes;
        c->rc = mc_tcp_send_all(c->fd, &count, sizeof(count));
    } else if (c->rc == 0 && c->send && !c->initiator) {
        /* read: wait for the initiator to close, so our data is never cut off by a reset. */
        mc_tcp_recv_all(c->fd, &count, sizeof(count));
    }
    c->end = mc_bench_now();
    return NULL;
}

/* Runs every connection in its own thread and waits for all of them. */
static int mc_tcp_run_conns(mc_tcp_conn_t *conns, unsigned n)
{
    pthread_t tids[MC_TCP_MAX_CONNS];
    unsigned i, started;
    int rc = 0;

    for (started = 0; started < n; started++) {
        if (pthread_create(&tids[started], NULL, mc_tcp_conn_main, &conns[started]) != 0) {
            fprintf(stderr, "pthread_create failed\n");
            rc = -EAGAIN;
            break;
        }
    }
    for (i = 0; i < started; i++) {
        pthread_join(tids[i], NULL);
        if (conns[i].rc != 0 && rc == 0) {
            rc = conns[i].rc;
        }
    }
    return rc;
}

/* Splits the working set into per-connection slices of whole blocks. */
static void mc_tcp_slices(mc_tcp_conn_t *conns, unsigned n, char *buf, size_t size, size_t block)
{
    size_t per = size / n - (size / n) % block;
    unsigned i;

    if (per == 0) {
        per = block; /* tiny working set: connections share the first block */
    }
    for (i = 0; i < n; i++) {
        conns[i].slice = per * (i + 1) <= size ? buf + per * i : buf;
        conns[i].span = per;
        conns[i].block = block;
    }
}

static int mc_tcp_listen(const char *host, unsigned port, unsigned *port_p)
{
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    socklen_t len = sizeof(sa);
    int fd, one = 1;

    if (inet_pton(AF_INET, host, &sa.sin_addr) != 1) {
        fprintf(stderr, "bad IPv4 address '%s'\n", host);
        return -EINVAL;
    }
    fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        return -errno;
    }
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0 || listen(fd, MC_TCP_MAX_CONNS) != 0 ||
        getsockname(fd, (struct sockaddr *)&sa, &len) != 0) {
        fprintf(stderr, "listen on %s:%u: %s\n", host, port, strerror(errno));
        close(fd);
        return -EADDRINUSE;
    }
    *port_p = ntohs(sa.sin_port);
    return fd;
}

static int mc_tcp_connect(const char *host, unsigned port)
{
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    int fd;

    if (inet_pton(AF_INET, host, &sa.sin_addr) != 1) {
        fprintf(stderr, "bad IPv4 address '%s'\n", host);
        return -EINVAL;
    }
    fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        return -errno;
    }
    if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0) {
        fprintf(stderr, "connect %s:%u: %s\n", host, port, strerror(errno));
        close(fd);
        return -ECONNREFUSED;
    }
    mc_tcp_nodelay(fd);
    return fd;
}

static void mc_tcp_close_all(mc_tcp_conn_t *conns, unsigned n)
{
    unsigned i;

    for (i = 0; i < n; i++) {
        if (conns[i].fd >= 0) {
            close(conns[i].fd);
        }
    }
}

/* The target: accept the session's connections, fault in the buffer, say ready, serve. */
static int mc_tcp_target(int lfd)
{
    mc_tcp_conn_t conns[MC_TCP_MAX_CONNS];
    mc_tcp_hello_t h = {0};
    unsigned n = 1, i;
    char *buf = NULL, ready = 1;
    double deadline;
    int rc = 0;

    for (i = 0; i < n; i++) {
        conns[i] = (mc_tcp_conn_t){.fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC)};
        if (conns[i].fd < 0 || mc_tcp_recv_all(conns[i].fd, &h, sizeof(h)) != (ssize_t)sizeof(h) ||
            h.magic != MC_TCP_MAGIC || h.conns == 0 || h.conns > MC_TCP_MAX_CONNS ||
            h.block_size == 0 || h.buffer_size < h.block_size) {
            fprintf(stderr, "target: bad or missing hello\n");
            mc_tcp_close_all(conns, i + 1);
            return -EPROTO;
        }
        mc_tcp_nodelay(conns[i].fd);
        n = h.conns;
    }
    buf = mc_bench_alloc(h.buffer_size);
    if (buf == NULL) {
        mc_tcp_close_all(conns, n);
        return -ENOMEM;
    }
    mc_tcp_slices(conns, n, buf, h.buffer_size, h.block_size);
    deadline = mc_bench_now() + (double)h.duration_us * 1e-6;
    for (i = 0; i < n; i++) {
        conns[i].send = !h.write;
        conns[i].deadline = deadline;
        if (rc == 0) {
            rc = mc_tcp_send_all(conns[i].fd, &ready, 1);
        }
    }
    if (rc == 0) {
        rc = mc_tcp_run_conns(conns, n);
    }
    mc_tcp_close_all(conns, n);
    mc_bench_free(buf, h.buffer_size);
    return rc;
}

static int mc_tcp_initiator(const mc_bench_opts_t *opts, const mc_tcp_opts_t *to, unsigned port,
                            uint64_t *bytes_p, double *seconds_p)
{
    mc_tcp_conn_t conns[MC_TCP_MAX_CONNS];
    mc_tcp_hello_t h = {MC_TCP_MAGIC,
                        (uint32_t)to->write,
                        opts->block_size,
                        opts->buffer_size,
                        (uint64_t)(opts->duration * 1e6),
                        0,
                        to->conns};
    char *buf, ready;
    double start, end = 0;
    uint64_t bytes = 0;
    unsigned i, n = 0;
    int rc = 0;

    buf = mc_bench_alloc(opts->buffer_size);
    if (buf == NULL) {
        return -ENOMEM;
    }
    for (n = 0; n < to->conns && rc == 0; n++) {
        conns[n] = (mc_tcp_conn_t){.fd = mc_tcp_connect(to->host, port)};
        h.conn = n;
        rc = conns[n].fd < 0 ? conns[n].fd : mc_tcp_send_all(conns[n].fd, &h, sizeof(h));
    }
    for (i = 0; i < n && rc == 0; i++) {
        if (mc_tcp_recv_all(conns[i].fd, &ready, 1) != 1) {
            fprintf(stderr, "the target did not get ready\n");
            rc = -EPROTO;
        }
    }
    if (rc == 0) {
        mc_tcp_slices(conns, n, buf, opts->buffer_size, opts->block_size);
        start = mc_bench_now();
        for (i = 0; i < n; i++) {
            conns[i].send = to->write;
            conns[i].initiator = 1;
            conns[i].deadline = start + opts->duration;
        }
        rc = mc_tcp_run_conns(conns, n);
        for (i = 0; i < n && rc == 0; i++) {
            if (to->write && conns[i].peer_bytes != conns[i].bytes) {
                fprintf(stderr, "connection %u: sent %llu bytes, target got %llu\n", i,
                        (unsigned long long)conns[i].bytes,
                        (unsigned long long)conns[i].peer_bytes);
                rc = -EIO;
            }
            bytes += conns[i].bytes;
            end = conns[i].end > end ? conns[i].end : end;
        }
        *bytes_p = bytes;
        *seconds_p = end - start;
    }
    mc_tcp_close_all(conns, n);
    mc_bench_free(buf, opts->buffer_size);
    return rc;
}

/* local mode: the target is a forked child serving one session on a loopback port. */
static int mc_tcp_local(const mc_bench_opts_t *opts, mc_tcp_opts_t *to, uint64_t *bytes_p,
                        double *seconds_p)
{
    pid_t parent = getpid(), child;
    unsigned port;
    int lfd, rc, status;

    to->host = "127.0.0.1";
    lfd = mc_tcp_listen(to->host, 0, &port);
    if (lfd < 0) {
        return lfd;
    }
    fflush(stdout);
    child = fork();
    if (child < 0) {
        close(lfd);
        return -errno;
    }
    if (child == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlive the benchmark */
        _exit(getppid() == parent && mc_tcp_target(lfd) == 0 ? 0 : 1);
    }
    close(lfd);
    rc = mc_tcp_initiator(opts, to, port, bytes_p, seconds_p);
    if (rc != 0) {
        kill(child, SIGTERM);
    }
    if (waitpid(child, &status, 0) == child && rc == 0 &&
        (!WIFEXITED(status) || WEXITSTATUS(status) != 0)) {
        fprintf(stderr, "the target process failed\n");
        rc = -EIO;
    }
    return rc;
}

static int mc_tcp_serve(mc_tcp_opts_t *to)
{
    unsigned port;
    int lfd, rc;

    lfd = mc_tcp_listen(to->host != NULL ? to->host : "0.0.0.0", to->port, &port);
    if (lfd < 0) {
        return lfd;
    }
    printf("mc-raw-tcp target listening on %s:%u\n", to->host != NULL ? to->host : "0.0.0.0", port);
    fflush(stdout);
    rc = mc_tcp_target(lfd);
    close(lfd);
    return rc;
}

int main(int argc, char **argv)
{
    mc_bench_opts_t opts;
    mc_tcp_opts_t to = {.mode = MC_TCP_LOCAL, .write = 1, .conns = 1};
    uint64_t bytes = 0;
    double seconds = 0;
    int rc;

    mc_bench_opts_init(&opts);
    rc = mc_bench_parse_args(argc, argv, &opts, mc_tcp_opt, &to,
                             "  --mode local|target|initiator  (local)\n"
                             "  --operation write|read  data to / from the target (write)\n"
                             "  --connections N   parallel connections, a thread each (1)\n"
                             "  --host A --port P target address (target: bind address)\n");
    if (rc != 0) {
        return rc > 0 ? 0 : 2;
    }
    if (mc_bench_opts_check(&opts) != 0) {
        return 2;
    }
    if (to.mode == MC_TCP_TARGET) {
        return mc_tcp_serve(&to) == 0 ? 0 : 1;
    }
    if (to.mode == MC_TCP_INITIATOR) {
        if (to.host == NULL || to.port == 0) {
            fprintf(stderr, "--mode initiator needs --host and --port\n");
            return 2;
        }
        rc = mc_tcp_initiator(&opts, &to, to.port, &bytes, &seconds);
    } else {
        rc = mc_tcp_local(&opts, &to, &bytes, &seconds);
    }
    if (rc != 0) {
        return 1;
    }
    mc_bench_report("raw-tcp", &opts,
                    json_pack("{s:s,s:s,s:i}", "operation", to.write ? "write" : "read", "protocol",
                              "tcp", "connections", (int)to.conns),
                    bytes, seconds);
    return 0;
}
