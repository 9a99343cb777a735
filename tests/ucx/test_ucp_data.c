/* UCP over the mooncake UCT transport between real processes on loopback, every byte checked.
 *
 * The parent forks and re-executes itself twice (--role peer --name A|B --fd N) before it
 * initialises UCP; each process has its own context and worker. A socketpair made before the
 * fork is the control channel: worker addresses, packed remote keys, and commands the peer
 * carries out (receive these messages and check them, map a region, check a region, ...), each
 * answered with OK or FAIL and a reason.
 *
 * Data: tag messages of sizes 0 .. 4 MiB+3 both ways (receives posted first, and unexpected),
 * 1000 tag messages in flight in order, put and get at unaligned offsets with endpoint and
 * worker flush, put from the peer, active messages (eager and rendezvous, handler side
 * ucp_am_recv_data_nbx) and stream, both ways.
 * Faults: a put past the end of a mapped region (an error, nothing written there or after it),
 * a get through the key of memory the peer unmapped (an error, no data), and peer B killed with
 * SIGKILL in the middle of 4 MiB puts and rendezvous sends (the error handler within 10 s,
 * every outstanding request completed); after each, data again with peer A.
 *
 * Exit: 0 passed, 1 failed, 77 skipped (UCX_TLS does not select mooncake, or the module is not
 * loaded). Every wait progresses the worker and ends at a deadline. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <ucp/api/ucp.h>

#define WAIT_S        20.0  /* the deadline of every wait */
#define IDLE_S        120.0 /* a peer waiting for its next command */
#define ERR_HANDLER_S 10.0  /* a killed peer's error handler is called within */
#define AM_ID         7
#define GUARD         64   /* bytes around every message buffer that must stay untouched */
#define CANARY        4096 /* bytes around every mapped region that must stay untouched */
#define MAX_ITEMS     64
#define BLOB_MAX      4096
#define MAX_REGIONS   8
#define MAX_REMOTES   8
#define GUARD_BYTE    0x5a
#define MiB           (1024u * 1024u)

/* ---- the process ---- */

typedef struct child {
    const char *name;
    pid_t pid; /* 0: not running (reaped) */
    int fd;
    bool dying; /* we are killing it or it is quitting: its hang-up is expected */
} child_t;

typedef struct op {
    void *req;
    int done;
    ucs_status_t status;
    size_t length;
    ucp_tag_recv_info_t info;
} op_t;

/* A packed remote key and, while an endpoint is open, its unpacked form on it. */
typedef struct remote {
    uint64_t raddr;
    size_t len;
    uint8_t *image; /* what the peer's region holds (the parent's mirror) */
    char packed[BLOB_MAX];
    size_t packed_len;
    ucp_rkey_h rkey;
} remote_t;

typedef struct conn {
    const char *name;
    ucp_ep_h ep;
    char addr[BLOB_MAX]; /* the peer's worker address */
    size_t addr_len;
    int errors; /* error handler calls */
    ucs_status_t fail_status;
    double fail_time;
    remote_t *remotes[MAX_REMOTES];
} conn_t;

static struct {
    const char *role;
    bool parent;
    ucp_context_h ctx;
    ucp_worker_h worker;
    ucp_address_t *addr;
    size_t addr_len;
    int ctl_fd;          /* a peer's end of the control channel */
    child_t kids[2];     /* the parent's peers */
    const char *waiting; /* what the current wait is for */
    unsigned ticks;
    double t_start;
} g = {.role = "parent", .ctl_fd = -1};

static char err_msg[1024];

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void reap_all(void)
{
    for (int i = 0; i < 2; i++) {
        child_t *k = &g.kids[i];
        if (k->pid > 0) {
            kill(k->pid, SIGKILL);
            waitpid(k->pid, NULL, 0);
            k->pid = 0;
        }
    }
}

__attribute__((format(printf, 1, 2), noreturn)) static void fail(const char *fmt, ...)
{
    char buf[1536];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    fprintf(stderr, "FAIL [%s]: %s\n", g.role, buf);
    fflush(NULL);
    exit(1); /* the parent's atexit handler kills and reaps its peers */
}

/* Record why a check failed (for the caller to report); returns -1. */
__attribute__((format(printf, 1, 2))) static int errf(const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(err_msg, sizeof(err_msg), fmt, ap);
    va_end(ap);
    return -1;
}

static const char *exit_text(int st)
{
    static char buf[64];

    if (WIFEXITED(st))
        snprintf(buf, sizeof(buf), "exit status %d", WEXITSTATUS(st));
    else if (WIFSIGNALED(st))
        snprintf(buf, sizeof(buf), "killed by signal %d", WTERMSIG(st));
    else
        snprintf(buf, sizeof(buf), "status 0x%x", st);
    return buf;
}

/* A peer that hung up while we wait for something else has died (or the parent has, for a
 * peer): fail at once rather than at the deadline. */
static void watch_peers(void)
{
    if (g.parent) {
        for (int i = 0; i < 2; i++) {
            child_t *k = &g.kids[i];
            struct pollfd p = {.fd = k->fd, .events = POLLRDHUP};
            int st = 0;
            if (k->pid <= 0 || k->dying || poll(&p, 1, 0) <= 0 ||
                !(p.revents & (POLLRDHUP | POLLHUP | POLLERR)))
                continue;
            for (double dl = now() + 5; waitpid(k->pid, &st, WNOHANG) == 0 && now() < dl;)
                usleep(1000);
            k->pid = 0;
            fail("%s went away (%s) while the parent waited for %s", k->name, exit_text(st),
                 g.waiting);
        }
    } else {
        struct pollfd p = {.fd = g.ctl_fd, .events = POLLRDHUP};
        if (poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)))
            fail("the parent went away while waiting for %s", g.waiting);
    }
}

static void progress(void)
{
    ucp_worker_progress(g.worker);
    if (++g.ticks % 512 == 0)
        watch_peers();
}

/* Progress until cond holds (evaluated once a round: it may consume something); fail after
 * secs saying what was awaited. */
#define WAIT_FOR(cond, secs, ...)                                                                  \
    do {                                                                                           \
        double dl_ = now() + (secs);                                                               \
        g.waiting = #cond;                                                                         \
        for (;;) {                                                                                 \
            if (cond)                                                                              \
                break;                                                                             \
            if (now() > dl_) {                                                                     \
                char w_[512];                                                                      \
                snprintf(w_, sizeof(w_), __VA_ARGS__);                                             \
                fail("timed out after %.0f s waiting for %s", (double)(secs), w_);                 \
            }                                                                                      \
            progress();                                                                            \
        }                                                                                          \
    } while (0)

/* ---- data patterns: every byte depends on the seed, the message size and its offset ---- */

static inline uint8_t pat(uint32_t seed, uint64_t size, uint64_t off)
{
    uint64_t x = off * 0x9e3779b97f4a7c15ull ^ (seed + 1) * 0xc2b2ae3d27d4eb4full ^
                 (size + 7) * 0x165667b19e3779f9ull;
    x ^= x >> 29;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 32;
    return (uint8_t)(x ^ (x >> 11));
}

static void fill(uint8_t *buf, size_t n, uint32_t seed, uint64_t size, uint64_t base)
{
    for (size_t i = 0; i < n; i++)
        buf[i] = pat(seed, size, base + i);
}

static int check_pat(const uint8_t *buf, size_t n, uint32_t seed, uint64_t size, uint64_t base,
                     const char *what)
{
    for (size_t i = 0; i < n; i++) {
        uint8_t e = pat(seed, size, base + i);
        if (buf[i] != e) {
            size_t bad = 0;
            for (size_t j = i; j < n; j++)
                bad += buf[j] != pat(seed, size, base + j);
            return errf("%s: first difference at offset %zu of %zu: expected 0x%02x, got 0x%02x "
                        "(%zu bytes differ)",
                        what, i, n, e, buf[i], bad);
        }
    }
    return 0;
}

static int check_same(const uint8_t *got, const uint8_t *exp, size_t n, const char *what)
{
    if (!memcmp(got, exp, n))
        return 0;
    for (size_t i = 0; i < n; i++)
        if (got[i] != exp[i]) {
            size_t bad = 0;
            for (size_t j = i; j < n; j++)
                bad += got[j] != exp[j];
            return errf("%s: first difference at offset %zu of %zu: expected 0x%02x, got 0x%02x "
                        "(%zu bytes differ)",
                        what, i, n, exp[i], got[i], bad);
        }
    return 0;
}

static int check_byte(const uint8_t *buf, size_t n, uint8_t v, const char *what)
{
    for (size_t i = 0; i < n; i++)
        if (buf[i] != v)
            return errf("%s: byte %zu of %zu is 0x%02x, expected 0x%02x (untouched)", what, i, n,
                        buf[i], v);
    return 0;
}

/* ---- the control channel: fixed-size messages over a socketpair ---- */

enum {
    C_ADDR = 1,  /* blob: the sender's worker address */
    C_START,     /* peer B: initialise UCP now */
    C_CONNECT,   /* blob: the parent's worker address: create the endpoint */
    C_RECONNECT, /* close the endpoint, create it again */
    C_OK,        /* blob: a note */
    C_READY,     /* receives posted */
    C_FAIL,      /* blob: why */
    C_TAG_RECV,  /* receive count tagged messages of sizes[] at tag + i*arg, seed + i; F_ACK */
    C_TAG_SEND,
    C_BURST_RECV, /* count messages of burst_size(i), all at one tag, in order */
    C_BURST_SEND,
    C_MAP,       /* region arg of sizes[0] bytes, offs[0] bytes off alignment, seed */
    C_MAPPED,    /* addr; blob: the packed remote key */
    C_CHECK,     /* region arg must hold what it held plus count writes (offs, sizes, seeds) */
    C_UNMAP,     /* ucp_mem_unmap region arg, then fill it with seed's pattern */
    C_PUT_TO,    /* put count writes into the parent's region at addr (blob: its key), flush */
    C_AM_EXPECT, /* count active messages (am_size), seed; C_READY, then C_OK */
    C_AM_SEND,
    C_STREAM_RECV, /* count stream messages of sizes[], seed + i */
    C_STREAM_SEND,
    C_QUIT,
};

#define F_ACK 1u /* answer C_READY once the receives are posted */

typedef struct msg {
    uint32_t type, flags, seed, count;
    uint64_t tag, arg, addr;
    uint64_t sizes[MAX_ITEMS];
    uint64_t offs[MAX_ITEMS];
    uint32_t seeds[MAX_ITEMS];
    uint32_t blob_len;
    char blob[BLOB_MAX];
} msg_t;

static void ctl_send(int fd, const msg_t *m)
{
    const char *p = (const char *)m;
    size_t left = sizeof(*m);

    while (left) {
        ssize_t n = send(fd, p, left, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            fail("control channel: send: %s", strerror(errno));
        p += n;
        left -= (size_t)n;
    }
}

static void msg_init(msg_t *m, uint32_t type)
{
    memset(m, 0, sizeof(*m));
    m->type = type;
}

static void msg_text(msg_t *m, const char *text)
{
    snprintf(m->blob, sizeof(m->blob), "%s", text);
    m->blob_len = (uint32_t)strlen(m->blob) + 1;
}

/* 1: a whole message was read; 0: none there; fails on a closed channel. */
static int ctl_try_recv(int fd, msg_t *m)
{
    struct pollfd p = {.fd = fd, .events = POLLIN};
    ssize_t n;

    if (poll(&p, 1, 0) <= 0 || !(p.revents & (POLLIN | POLLHUP | POLLERR)))
        return 0;
    do
        n = recv(fd, m, sizeof(*m), MSG_WAITALL);
    while (n < 0 && errno == EINTR);
    if (n == (ssize_t)sizeof(*m))
        return 1;
    if (n == 0 && !g.parent)
        fail("the parent closed the control channel");
    if (n == 0)
        return -1;
    fail("control channel: read %zd of %zu bytes: %s", n, sizeof(*m), n < 0 ? strerror(errno) : "");
}

static const char *type_name(uint32_t t)
{
    static const char *names[] = {
        "?",       "ADDR",        "START",       "CONNECT",  "RECONNECT",  "OK",
        "READY",   "FAIL",        "TAG_RECV",    "TAG_SEND", "BURST_RECV", "BURST_SEND",
        "MAP",     "MAPPED",      "CHECK",       "UNMAP",    "PUT_TO",     "AM_EXPECT",
        "AM_SEND", "STREAM_RECV", "STREAM_SEND", "QUIT"};
    return t < sizeof(names) / sizeof(names[0]) ? names[t] : "?";
}

/* The parent waits for a peer's answer of type want (progressing); a FAIL ends the test. */
static void ctl_wait(child_t *k, msg_t *m, uint32_t want, const char *what)
{
    int r = 0;

    WAIT_FOR((r = ctl_try_recv(k->fd, m)) != 0, WAIT_S, "%s's answer to %s", k->name, what);
    if (r < 0) {
        int st = 0;
        for (double dl = now() + 5; waitpid(k->pid, &st, WNOHANG) == 0 && now() < dl;)
            usleep(1000);
        k->pid = 0;
        fail("%s closed the control channel (%s) instead of answering %s", k->name, exit_text(st),
             what);
    }
    if (m->type == C_FAIL)
        fail("%s: %s: %.*s", k->name, what, (int)m->blob_len, m->blob);
    if (m->type != want)
        fail("%s answered %s with %s, expected %s", k->name, what, type_name(m->type),
             type_name(want));
}

/* ---- requests ---- */

static void send_cb(void *req, ucs_status_t status, void *user_data)
{
    op_t *o = user_data;
    (void)req;
    o->status = status;
    o->done = 1;
}

static void tag_recv_cb(void *req, ucs_status_t status, const ucp_tag_recv_info_t *info,
                        void *user_data)
{
    op_t *o = user_data;
    (void)req;
    if (info)
        o->info = *info;
    o->status = status;
    o->done = 1;
}

static void len_cb(void *req, ucs_status_t status, size_t length, void *user_data)
{
    op_t *o = user_data;
    (void)req;
    o->length = length;
    o->status = status;
    o->done = 1;
}

static ucp_request_param_t send_param(op_t *o)
{
    ucp_request_param_t p;

    memset(&p, 0, sizeof(p));
    memset(o, 0, sizeof(*o));
    p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    p.cb.send = send_cb;
    p.user_data = o;
    return p;
}

/* Always a request and a callback: UCP 1.13 does not fill recv_info.tag_info when a receive
 * matches an unexpected eager message at once. */
static ucp_request_param_t tag_recv_param(op_t *o)
{
    ucp_request_param_t p;

    memset(&p, 0, sizeof(p));
    memset(o, 0, sizeof(*o));
    p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                     UCP_OP_ATTR_FIELD_RECV_INFO | UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
    p.cb.recv = tag_recv_cb;
    p.user_data = o;
    p.recv_info.tag_info = &o->info;
    return p;
}

static ucp_request_param_t stream_recv_param(op_t *o)
{
    ucp_request_param_t p;

    memset(&p, 0, sizeof(p));
    memset(o, 0, sizeof(*o));
    p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                     UCP_OP_ATTR_FIELD_RECV_INFO | UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = UCP_STREAM_RECV_FLAG_WAITALL;
    p.cb.recv_stream = len_cb;
    p.user_data = o;
    p.recv_info.length = &o->length;
    return p;
}

/* What an nbx call returned: NULL (done, recv_info filled), an error, or a request. */
static void op_begin(op_t *o, ucs_status_ptr_t p)
{
    if (p == NULL) {
        o->done = 1;
        o->status = UCS_OK;
    } else if (UCS_PTR_IS_ERR(p)) {
        o->done = 1;
        o->status = UCS_PTR_STATUS(p);
    } else {
        o->req = p;
    }
}

static void op_release(op_t *o)
{
    if (o->req) {
        ucp_request_free(o->req);
        o->req = NULL;
    }
}

static bool all_done(const op_t *ops, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!ops[i].done)
            return false;
    return true;
}

static size_t first_not_done(const op_t *ops, size_t n)
{
    size_t i = 0;
    while (i < n && ops[i].done)
        i++;
    return i;
}

/* ---- UCP ---- */

static void ucx_init(void)
{
    ucp_params_t p;
    ucp_worker_params_t wp;
    ucs_status_t st;

    memset(&p, 0, sizeof(p));
    p.field_mask = UCP_PARAM_FIELD_FEATURES;
    p.features = UCP_FEATURE_TAG | UCP_FEATURE_RMA | UCP_FEATURE_AM | UCP_FEATURE_STREAM;
    st = ucp_init(&p, NULL, &g.ctx);
    if (st != UCS_OK)
        fail("ucp_init: %s", ucs_status_string(st));
    memset(&wp, 0, sizeof(wp));
    wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wp.thread_mode = UCS_THREAD_MODE_SINGLE;
    st = ucp_worker_create(g.ctx, &wp, &g.worker);
    if (st != UCS_OK)
        fail("ucp_worker_create: %s", ucs_status_string(st));
    st = ucp_worker_get_address(g.worker, &g.addr, &g.addr_len);
    if (st != UCS_OK)
        fail("ucp_worker_get_address: %s", ucs_status_string(st));
    if (g.addr_len > BLOB_MAX)
        fail("a worker address of %zu bytes", g.addr_len);
}

static void ucx_fini(void)
{
    ucp_worker_release_address(g.worker, g.addr);
    ucp_worker_destroy(g.worker);
    ucp_cleanup(g.ctx);
}

/* Whether the context has the mooncake transport as a resource (the module is loaded and
 * UCX_TLS names it). */
static bool has_mooncake(void)
{
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    bool found;

    if (!f)
        fail("open_memstream: %s", strerror(errno));
    ucp_context_print_info(g.ctx, f);
    fclose(f);
    found = text && strstr(text, "mooncake/"); /* a device per network interface */
    free(text);
    return found;
}

static void ep_err_cb(void *arg, ucp_ep_h ep, ucs_status_t status)
{
    conn_t *c = arg;

    (void)ep;
    if (!c->errors++) {
        c->fail_status = status;
        c->fail_time = now();
    }
}

static void rkeys_unpack(conn_t *c)
{
    for (int i = 0; i < MAX_REMOTES; i++) {
        remote_t *r = c->remotes[i];
        ucs_status_t st;
        if (!r || r->rkey)
            continue;
        st = ucp_ep_rkey_unpack(c->ep, r->packed, &r->rkey);
        if (st != UCS_OK)
            fail("ucp_ep_rkey_unpack (%s): %s", c->name, ucs_status_string(st));
    }
}

static void conn_open(conn_t *c)
{
    ucp_ep_params_t p;
    ucs_status_t st;

    memset(&p, 0, sizeof(p));
    p.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                   UCP_EP_PARAM_FIELD_ERR_HANDLER;
    p.address = (const ucp_address_t *)c->addr;
    p.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    p.err_handler.cb = ep_err_cb;
    p.err_handler.arg = c;
    c->errors = 0;
    c->fail_status = UCS_OK;
    st = ucp_ep_create(g.worker, &p, &c->ep);
    if (st != UCS_OK)
        fail("ucp_ep_create (to %s): %s", c->name, ucs_status_string(st));
    rkeys_unpack(c);
}

/* Remote keys go first (they belong to the endpoint); force: the endpoint failed. */
static void conn_close(conn_t *c, bool force)
{
    ucp_request_param_t p;
    op_t o;

    for (int i = 0; i < MAX_REMOTES; i++)
        if (c->remotes[i] && c->remotes[i]->rkey) {
            ucp_rkey_destroy(c->remotes[i]->rkey);
            c->remotes[i]->rkey = NULL;
        }
    p = send_param(&o);
    p.op_attr_mask |= UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = force ? UCP_EP_CLOSE_FLAG_FORCE : 0;
    op_begin(&o, ucp_ep_close_nbx(c->ep, &p));
    WAIT_FOR(o.done, WAIT_S, "closing the endpoint to %s", c->name);
    op_release(&o);
    if (!force && o.status != UCS_OK)
        fail("closing the endpoint to %s: %s", c->name, ucs_status_string(o.status));
    c->ep = NULL;
}

static void remote_add(conn_t *c, remote_t *r)
{
    for (int i = 0; i < MAX_REMOTES; i++)
        if (!c->remotes[i]) {
            c->remotes[i] = r;
            r->rkey = NULL;
            rkeys_unpack(c);
            return;
        }
    fail("too many remote keys");
}

static void remote_drop(conn_t *c, remote_t *r)
{
    for (int i = 0; i < MAX_REMOTES; i++)
        if (c->remotes[i] == r) {
            if (r->rkey)
                ucp_rkey_destroy(r->rkey);
            r->rkey = NULL;
            c->remotes[i] = NULL;
        }
}

/* ---- sets of messages: buffers with guards, one request each ---- */

typedef enum { X_TAG_SEND, X_TAG_RECV, X_STREAM_SEND, X_STREAM_RECV, X_AM_SEND } xkind_t;

typedef struct am_hdr {
    uint32_t idx, seed;
    uint64_t size;
} am_hdr_t;

typedef struct xfer {
    const char *what;
    xkind_t kind;
    uint32_t n, seed;
    uint64_t tag, step; /* tag of message i: tag + i * step */
    uint64_t *sizes;
    uint8_t **mem, **buf;
    op_t *ops;
    am_hdr_t *hdrs;
} xfer_t;

/* Message i: sizes[i] bytes of pat(seed + i, size, offset); odd ones start unaligned. */
static void xfer_init(xfer_t *x, const char *what, xkind_t kind, uint32_t n, const uint64_t *sizes,
                      uint32_t seed)
{
    bool tx = kind == X_TAG_SEND || kind == X_STREAM_SEND || kind == X_AM_SEND;

    memset(x, 0, sizeof(*x));
    x->what = what;
    x->kind = kind;
    x->n = n;
    x->seed = seed;
    x->sizes = malloc(n * sizeof(*x->sizes));
    x->mem = calloc(n, sizeof(*x->mem));
    x->buf = calloc(n, sizeof(*x->buf));
    x->ops = calloc(n, sizeof(*x->ops));
    x->hdrs = calloc(n, sizeof(*x->hdrs));
    if (!x->sizes || !x->mem || !x->buf || !x->ops || !x->hdrs)
        fail("no memory");
    for (uint32_t i = 0; i < n; i++) {
        size_t total = sizes[i] + 2 * GUARD + 1;
        x->sizes[i] = sizes[i];
        x->mem[i] = malloc(total);
        if (!x->mem[i])
            fail("no memory for %zu bytes", total);
        memset(x->mem[i], GUARD_BYTE, total);
        x->buf[i] = x->mem[i] + GUARD + (i & 1);
        if (tx)
            fill(x->buf[i], sizes[i], seed + i, sizes[i], 0);
    }
}

static void xfer_free(xfer_t *x)
{
    for (uint32_t i = 0; i < x->n; i++) {
        op_release(&x->ops[i]);
        free(x->mem[i]);
    }
    free(x->sizes);
    free(x->mem);
    free(x->buf);
    free(x->ops);
    free(x->hdrs);
}

/* Start every message of the set at once (the transport queues what it cannot take). */
static void xfer_post(xfer_t *x, conn_t *c, const uint32_t *am_flags)
{
    for (uint32_t i = 0; i < x->n; i++) {
        op_t *o = &x->ops[i];
        ucp_tag_t tag = x->tag + i * x->step;
        ucp_request_param_t p;
        switch (x->kind) {
        case X_TAG_SEND:
            p = send_param(o);
            op_begin(o, ucp_tag_send_nbx(c->ep, x->buf[i], x->sizes[i], tag, &p));
            break;
        case X_TAG_RECV:
            p = tag_recv_param(o);
            op_begin(o, ucp_tag_recv_nbx(g.worker, x->buf[i], x->sizes[i], tag, (ucp_tag_t)-1, &p));
            break;
        case X_STREAM_SEND:
            p = send_param(o);
            op_begin(o, ucp_stream_send_nbx(c->ep, x->buf[i], x->sizes[i], &p));
            break;
        case X_STREAM_RECV:
            p = stream_recv_param(o);
            op_begin(o, ucp_stream_recv_nbx(c->ep, x->buf[i], x->sizes[i], &o->length, &p));
            break;
        case X_AM_SEND:
            p = send_param(o);
            x->hdrs[i] = (am_hdr_t){.idx = i, .seed = x->seed, .size = x->sizes[i]};
            if (am_flags && am_flags[i]) {
                p.op_attr_mask |= UCP_OP_ATTR_FIELD_FLAGS;
                p.flags = am_flags[i];
            }
            op_begin(o, ucp_am_send_nbx(c->ep, AM_ID, &x->hdrs[i], sizeof(x->hdrs[i]), x->buf[i],
                                        x->sizes[i], &p));
            break;
        }
    }
}

static int xfer_wait(xfer_t *x)
{
    WAIT_FOR(all_done(x->ops, x->n), WAIT_S, "%s: message %zu of %u (%" PRIu64 " bytes)", x->what,
             first_not_done(x->ops, x->n), x->n, x->sizes[first_not_done(x->ops, x->n) % x->n]);
    for (uint32_t i = 0; i < x->n; i++)
        if (x->ops[i].status != UCS_OK)
            return errf("%s: message %u (%" PRIu64 " bytes): %s", x->what, i, x->sizes[i],
                        ucs_status_string(x->ops[i].status));
    return 0;
}

/* Every received message: its length, its tag, every byte, and the guards around it. */
static int xfer_verify(const xfer_t *x)
{
    char what[160];

    for (uint32_t i = 0; i < x->n; i++) {
        const op_t *o = &x->ops[i];
        uint64_t size = x->sizes[i];
        size_t got = x->kind == X_TAG_RECV ? o->info.length : o->length;
        const uint8_t *m = x->mem[i];
        size_t head = GUARD + (i & 1);
        if (got != size)
            return errf("%s: message %u: %zu bytes received, %" PRIu64 " sent", x->what, i, got,
                        size);
        if (x->kind == X_TAG_RECV && o->info.sender_tag != x->tag + i * x->step)
            return errf("%s: message %u: tag 0x%" PRIx64 ", expected 0x%" PRIx64, x->what, i,
                        (uint64_t)o->info.sender_tag, (uint64_t)(x->tag + i * x->step));
        snprintf(what, sizeof(what), "%s: message %u (%" PRIu64 " bytes)", x->what, i, size);
        if (check_pat(x->buf[i], size, x->seed + i, size, 0, what))
            return -1;
        snprintf(what, sizeof(what), "%s: message %u: the bytes before it", x->what, i);
        if (check_byte(m, head, GUARD_BYTE, what))
            return -1;
        snprintf(what, sizeof(what), "%s: message %u: the bytes after it", x->what, i);
        if (check_byte(m + head + size, 2 * GUARD + 1 - head, GUARD_BYTE, what))
            return -1;
    }
    return 0;
}

/* ---- what both sides send ---- */

static const uint64_t tag_sizes[] = {0,    1,    7,     8,     64,     1000,    4096,
                                     8191, 8192, 32768, 65536, 100000, 1 * MiB, 4 * MiB + 3};
#define N_TAG_SIZES (sizeof(tag_sizes) / sizeof(tag_sizes[0]))

static const uint64_t stream_sizes[] = {1, 7, 1000, 65536, 1 * MiB + 7};
#define N_STREAM_SIZES (sizeof(stream_sizes) / sizeof(stream_sizes[0]))

#define N_BURST 1000
/* Mostly small eager messages, some of several fragments, a few rendezvous ones. */
static uint64_t burst_size(uint32_t i)
{
    if (i % 250 == 249)
        return 70000 + i;
    if (i % 100 == 42)
        return 20000 + i;
    return 1 + (i * 37u) % 1500;
}

static const uint64_t am_big[] = {0,    1,     8,     100,    1000,    4096,
                                  8192, 32768, 65536, 100000, 1 * MiB, 4 * MiB + 3};
#define N_AM_BIG  (sizeof(am_big) / sizeof(am_big[0]))
#define AM_FORCED N_AM_BIG /* this one is sent with UCP_AM_SEND_FLAG_RNDV */
#define N_AM      (N_AM_BIG + 1 + 500)

static uint64_t am_size(uint32_t i)
{
    if (i < N_AM_BIG)
        return am_big[i];
    if (i == AM_FORCED)
        return 1000;
    return (i * 13u) % 300;
}

static uint64_t *sizes_of(uint32_t n, uint64_t (*fn)(uint32_t))
{
    uint64_t *s = malloc(n * sizeof(*s));

    if (!s)
        fail("no memory");
    for (uint32_t i = 0; i < n; i++)
        s[i] = fn(i);
    return s;
}

/* ---- active messages received: a handler that checks them or fetches rendezvous ones ---- */

typedef struct am_slot {
    int got, rndv;
    op_t op;
    uint8_t *mem;
    uint64_t size;
} am_slot_t;

static struct {
    uint32_t n, seed, received, dup, stray, rndv;
    am_slot_t *slots;
    int bad;
    char err[512];
} amr;

static ucs_status_t am_cb(void *arg, const void *header, size_t header_length, void *data,
                          size_t length, const ucp_am_recv_param_t *param)
{
    bool rndv = param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV;
    am_hdr_t h;
    am_slot_t *s;

    (void)arg;
    if (header_length != sizeof(h) || !amr.slots) {
        amr.stray++;
        if (rndv)
            ucp_am_data_release(g.worker, data);
        return UCS_OK;
    }
    memcpy(&h, header, sizeof(h));
    if (h.seed != amr.seed || h.idx >= amr.n || amr.slots[h.idx].got) {
        if (h.seed == amr.seed && h.idx < amr.n)
            amr.dup++;
        else
            amr.stray++;
        if (rndv)
            ucp_am_data_release(g.worker, data);
        return UCS_OK;
    }
    s = &amr.slots[h.idx];
    s->got = 1;
    amr.received++;
    s->size = am_size(h.idx);
    if (length != s->size || h.size != s->size) {
        if (!amr.bad++)
            snprintf(amr.err, sizeof(amr.err),
                     "active message %u: %zu bytes arrived, header says %" PRIu64 ", sent %" PRIu64,
                     h.idx, length, h.size, s->size);
        if (rndv)
            ucp_am_data_release(g.worker, data);
        s->op.done = 1;
        return UCS_OK;
    }
    if (rndv) {
        ucp_request_param_t p;
        amr.rndv++;
        s->rndv = 1;
        s->mem = malloc(length + 2 * GUARD);
        if (!s->mem)
            fail("no memory");
        memset(s->mem, GUARD_BYTE, length + 2 * GUARD);
        p = stream_recv_param(&s->op); /* the same callback shape: (req, status, length) */
        p.op_attr_mask &= ~(uint32_t)UCP_OP_ATTR_FIELD_FLAGS;
        p.flags = 0;
        p.cb.recv_am = len_cb;
        op_begin(&s->op, ucp_am_recv_data_nbx(g.worker, data, s->mem + GUARD, length, &p));
        return UCS_OK;
    }
    if (!(param->recv_attr & UCP_AM_RECV_ATTR_FLAG_DATA) && length && !data) {
        if (!amr.bad++)
            snprintf(amr.err, sizeof(amr.err), "active message %u: no data pointer", h.idx);
    } else if (check_pat(data, length, amr.seed + h.idx, length, 0, "active message")) {
        if (!amr.bad++)
            snprintf(amr.err, sizeof(amr.err), "message %u (eager): %.400s", h.idx, err_msg);
    }
    s->op.done = 1;
    s->op.status = UCS_OK;
    s->op.length = length;
    return UCS_OK;
}

static void am_handler_set(void)
{
    ucp_am_handler_param_t p;
    ucs_status_t st;

    memset(&p, 0, sizeof(p));
    p.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                   UCP_AM_HANDLER_PARAM_FIELD_ARG | UCP_AM_HANDLER_PARAM_FIELD_FLAGS;
    p.id = AM_ID;
    p.cb = am_cb;
    p.arg = NULL;
    p.flags = UCP_AM_FLAG_WHOLE_MSG;
    st = ucp_worker_set_am_recv_handler(g.worker, &p);
    if (st != UCS_OK)
        fail("ucp_worker_set_am_recv_handler: %s", ucs_status_string(st));
}

static void am_expect(uint32_t n, uint32_t seed)
{
    amr.n = n;
    amr.seed = seed;
    amr.received = amr.dup = amr.stray = amr.rndv = 0;
    amr.bad = 0;
    amr.err[0] = 0;
    amr.slots = calloc(n, sizeof(*amr.slots));
    if (!amr.slots)
        fail("no memory");
}

static bool am_complete(void)
{
    if (amr.received < amr.n)
        return false;
    for (uint32_t i = 0; i < amr.n; i++)
        if (!amr.slots[i].op.done)
            return false;
    return true;
}

/* After every message arrived: each byte of the rendezvous ones, the guards, the flags. */
static int am_finish(char *note, size_t note_len)
{
    int rc = 0;

    WAIT_FOR(am_complete(), WAIT_S, "active messages: %u of %u arrived", amr.received, amr.n);
    if (amr.bad)
        rc = errf("%s", amr.err);
    else if (amr.dup || amr.stray)
        rc = errf("active messages: %u duplicates, %u not expected", amr.dup, amr.stray);
    for (uint32_t i = 0; i < amr.n && !rc; i++) {
        am_slot_t *s = &amr.slots[i];
        char what[96];
        if (!s->rndv)
            continue;
        snprintf(what, sizeof(what), "active message %u (%" PRIu64 " bytes, rendezvous)", i,
                 s->size);
        if (s->op.status != UCS_OK)
            rc = errf("%s: ucp_am_recv_data_nbx: %s", what, ucs_status_string(s->op.status));
        else if (s->op.length != s->size)
            rc = errf("%s: %zu bytes received", what, s->op.length);
        else if (check_pat(s->mem + GUARD, s->size, amr.seed + i, s->size, 0, what) ||
                 check_byte(s->mem, GUARD, GUARD_BYTE, what) ||
                 check_byte(s->mem + GUARD + s->size, GUARD, GUARD_BYTE, what))
            rc = -1;
    }
    if (!rc && amr.n > AM_FORCED && !amr.slots[AM_FORCED].rndv)
        rc = errf("active message %u sent with UCP_AM_SEND_FLAG_RNDV arrived without "
                  "UCP_AM_RECV_ATTR_FLAG_RNDV",
                  (unsigned)AM_FORCED);
    snprintf(note, note_len, "%u messages, %u by rendezvous", amr.n, amr.rndv);
    for (uint32_t i = 0; i < amr.n; i++) {
        op_release(&amr.slots[i].op);
        free(amr.slots[i].mem);
    }
    free(amr.slots);
    amr.slots = NULL;
    return rc;
}

static int am_send_all(conn_t *c, uint32_t n, uint32_t seed)
{
    uint64_t *sizes = sizes_of(n, am_size);
    uint32_t *flags = calloc(n, sizeof(*flags));
    xfer_t x;
    int rc;

    if (!flags)
        fail("no memory");
    if (n > AM_FORCED)
        flags[AM_FORCED] = UCP_AM_SEND_FLAG_RNDV;
    xfer_init(&x, "active messages sent", X_AM_SEND, n, sizes, seed);
    xfer_post(&x, c, flags);
    rc = xfer_wait(&x);
    xfer_free(&x);
    free(flags);
    free(sizes);
    return rc;
}

/* ---- regions the peer maps, and puts and gets into them ---- */

typedef struct region {
    bool used, mapped;
    uint8_t *mem; /* CANARY + misalign, the region, CANARY: its own mapping */
    size_t mem_len, head;
    uint8_t *base;
    size_t len;
    uint8_t *image; /* what base must hold */
    ucp_mem_h memh;
} region_t;

typedef struct wr {
    uint64_t off, len;
    uint32_t seed;
} wr_t;

static region_t regions[MAX_REGIONS];

static void canary_fill(region_t *r)
{
    fill(r->mem, r->head, 0xca11, 0, 0);
    fill(r->base + r->len, CANARY, 0xca12, 0, 0);
}

static int canary_check(const region_t *r, const char *what)
{
    char w[160];

    snprintf(w, sizeof(w), "%s: the canary before the region", what);
    if (check_pat(r->mem, r->head, 0xca11, 0, 0, w))
        return -1;
    snprintf(w, sizeof(w), "%s: the canary after the region", what);
    return check_pat(r->base + r->len, CANARY, 0xca12, 0, 0, w);
}

static void region_create(region_t *r, size_t len, size_t misalign, uint32_t seed)
{
    ucp_mem_map_params_t p;
    ucs_status_t st;

    memset(r, 0, sizeof(*r));
    r->used = true;
    r->head = CANARY + misalign;
    r->len = len;
    r->mem_len = r->head + len + CANARY;
    r->mem = mmap(NULL, r->mem_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    r->image = malloc(len);
    if (r->mem == MAP_FAILED || !r->image)
        fail("no memory for a region of %zu bytes", len);
    r->base = r->mem + r->head;
    fill(r->base, len, seed, len, 0);
    memcpy(r->image, r->base, len);
    canary_fill(r);
    memset(&p, 0, sizeof(p));
    p.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
    p.address = r->base;
    p.length = len;
    st = ucp_mem_map(g.ctx, &p, &r->memh);
    if (st != UCS_OK)
        fail("ucp_mem_map of %zu bytes: %s", len, ucs_status_string(st));
    r->mapped = true;
}

static void region_pack(region_t *r, char *out, size_t *len_p)
{
    void *buf;
    size_t len;
    ucs_status_t st = ucp_rkey_pack(g.ctx, r->memh, &buf, &len);

    if (st != UCS_OK)
        fail("ucp_rkey_pack: %s", ucs_status_string(st));
    if (len > BLOB_MAX)
        fail("a packed remote key of %zu bytes", len);
    memcpy(out, buf, len);
    *len_p = len;
    ucp_rkey_buffer_release(buf);
}

static void region_unmap(region_t *r)
{
    ucs_status_t st;

    if (!r->mapped)
        return;
    st = ucp_mem_unmap(g.ctx, r->memh);
    if (st != UCS_OK)
        fail("ucp_mem_unmap: %s", ucs_status_string(st));
    r->mapped = false;
}

static void region_destroy(region_t *r)
{
    region_unmap(r);
    munmap(r->mem, r->mem_len);
    free(r->image);
    memset(r, 0, sizeof(*r));
}

static void image_apply(uint8_t *image, const wr_t *w, size_t n)
{
    for (size_t i = 0; i < n; i++)
        fill(image + w[i].off, w[i].len, w[i].seed, w[i].len, 0);
}

/* The region holds what it held plus these writes, and its canaries are whole. */
static int region_check(region_t *r, const wr_t *w, size_t n, const char *what)
{
    image_apply(r->image, w, n);
    if (check_same(r->base, r->image, r->len, what))
        return -1;
    return canary_check(r, what);
}

/* Put every write at once from unaligned local buffers, then flush: the endpoint, or the
 * worker. The writes' data is pat(seed, len, offset in the write). */
static int put_writes(conn_t *c, remote_t *r, const wr_t *w, size_t n, bool worker_flush,
                      const char *what)
{
    op_t *ops = calloc(n + 1, sizeof(*ops));
    uint8_t **src = calloc(n, sizeof(*src));
    ucp_request_param_t p;
    int rc = 0;

    if (!ops || !src)
        fail("no memory");
    for (size_t i = 0; i < n; i++) {
        if (w[i].off + w[i].len > r->len)
            fail("%s: write %zu is outside the region", what, i);
        src[i] = malloc(w[i].len + 3);
        if (!src[i])
            fail("no memory");
        fill(src[i] + 3, w[i].len, w[i].seed, w[i].len, 0);
        p = send_param(&ops[i]);
        op_begin(&ops[i],
                 ucp_put_nbx(c->ep, src[i] + 3, w[i].len, r->raddr + w[i].off, r->rkey, &p));
    }
    p = send_param(&ops[n]);
    op_begin(&ops[n],
             worker_flush ? ucp_worker_flush_nbx(g.worker, &p) : ucp_ep_flush_nbx(c->ep, &p));
    WAIT_FOR(all_done(ops, n + 1), WAIT_S, "%s: put %zu of %zu, or the %s flush", what,
             first_not_done(ops, n + 1), n, worker_flush ? "worker" : "endpoint");
    for (size_t i = 0; i <= n && !rc; i++)
        if (ops[i].status != UCS_OK)
            rc = i < n ? errf("%s: put of %" PRIu64 " bytes at offset %" PRIu64 ": %s", what,
                              w[i].len, w[i].off, ucs_status_string(ops[i].status))
                       : errf("%s: %s flush: %s", what, worker_flush ? "worker" : "endpoint",
                              ucs_status_string(ops[i].status));
    for (size_t i = 0; i <= n; i++)
        op_release(&ops[i]);
    for (size_t i = 0; i < n; i++)
        free(src[i]);
    free(src);
    free(ops);
    if (!rc && r->image)
        image_apply(r->image, w, n);
    return rc;
}

/* Get every range at once into unaligned buffers with guards, flush the endpoint, and compare
 * with what the region holds. */
static int get_reads(conn_t *c, remote_t *r, const wr_t *rd, size_t n, const char *what)
{
    op_t *ops = calloc(n + 1, sizeof(*ops));
    uint8_t **dst = calloc(n, sizeof(*dst));
    ucp_request_param_t p;
    int rc = 0;

    if (!ops || !dst)
        fail("no memory");
    for (size_t i = 0; i < n; i++) {
        dst[i] = malloc(rd[i].len + 2 * GUARD + 1);
        if (!dst[i])
            fail("no memory");
        memset(dst[i], GUARD_BYTE, rd[i].len + 2 * GUARD + 1);
        p = send_param(&ops[i]);
        op_begin(&ops[i], ucp_get_nbx(c->ep, dst[i] + GUARD + 1, rd[i].len, r->raddr + rd[i].off,
                                      r->rkey, &p));
    }
    p = send_param(&ops[n]);
    op_begin(&ops[n], ucp_ep_flush_nbx(c->ep, &p));
    WAIT_FOR(all_done(ops, n + 1), WAIT_S, "%s: get %zu of %zu, or the endpoint flush", what,
             first_not_done(ops, n + 1), n);
    for (size_t i = 0; i <= n && !rc; i++) {
        char w[160];
        if (ops[i].status != UCS_OK) {
            rc = i < n ? errf("%s: get of %" PRIu64 " bytes at offset %" PRIu64 ": %s", what,
                              rd[i].len, rd[i].off, ucs_status_string(ops[i].status))
                       : errf("%s: endpoint flush: %s", what, ucs_status_string(ops[i].status));
            break;
        }
        if (i == n)
            break;
        snprintf(w, sizeof(w), "%s: get of %" PRIu64 " bytes at offset %" PRIu64, what, rd[i].len,
                 rd[i].off);
        if (check_same(dst[i] + GUARD + 1, r->image + rd[i].off, rd[i].len, w) ||
            check_byte(dst[i], GUARD + 1, GUARD_BYTE, w) ||
            check_byte(dst[i] + GUARD + 1 + rd[i].len, GUARD, GUARD_BYTE, w))
            rc = -1;
    }
    for (size_t i = 0; i <= n; i++)
        op_release(&ops[i]);
    for (size_t i = 0; i < n; i++)
        free(dst[i]);
    free(dst);
    free(ops);
    return rc;
}

/* ======================================================================================== */
/* The peer: carries out the parent's commands, progressing its worker all the while.        */
/* ======================================================================================== */

static conn_t peer_conn;

static void reply(uint32_t type, const char *text)
{
    msg_t *m = malloc(sizeof(*m));

    if (!m)
        fail("no memory");
    msg_init(m, type);
    if (text)
        msg_text(m, text);
    ctl_send(g.ctl_fd, m);
    free(m);
}

static void reply_rc(int rc, const char *note)
{
    if (rc)
        reply(C_FAIL, err_msg);
    else
        reply(C_OK, note);
}

static int peer_xfer(const msg_t *m, xkind_t kind, const char *what, const uint64_t *sizes)
{
    xfer_t x;
    int rc;

    xfer_init(&x, what, kind, m->count, sizes ? sizes : m->sizes, m->seed);
    x.tag = m->tag;
    x.step = m->arg;
    xfer_post(&x, &peer_conn, NULL);
    if (m->flags & F_ACK)
        reply(C_READY, NULL);
    rc = xfer_wait(&x);
    if (!rc && (kind == X_TAG_RECV || kind == X_STREAM_RECV))
        rc = xfer_verify(&x);
    xfer_free(&x);
    return rc;
}

static void peer_command(msg_t *m)
{
    char note[256] = "";
    int rc = 0;

    switch (m->type) {
    case C_CONNECT:
        if (m->blob_len > BLOB_MAX)
            fail("an address of %u bytes", m->blob_len);
        memcpy(peer_conn.addr, m->blob, m->blob_len);
        peer_conn.addr_len = m->blob_len;
        conn_open(&peer_conn);
        reply(C_OK, NULL);
        break;
    case C_RECONNECT:
        conn_close(&peer_conn, true);
        conn_open(&peer_conn);
        reply(C_OK, NULL);
        break;
    case C_TAG_RECV:
        if (m->count > MAX_ITEMS)
            fail("TAG_RECV of %u", m->count);
        reply_rc(peer_xfer(m, X_TAG_RECV, "tag messages received", NULL), NULL);
        break;
    case C_TAG_SEND:
        if (m->count > MAX_ITEMS)
            fail("TAG_SEND of %u", m->count);
        reply_rc(peer_xfer(m, X_TAG_SEND, "tag messages sent", NULL), NULL);
        break;
    case C_BURST_RECV:
    case C_BURST_SEND: {
        uint64_t *sizes = sizes_of(m->count, burst_size);
        rc = peer_xfer(m, m->type == C_BURST_RECV ? X_TAG_RECV : X_TAG_SEND,
                       m->type == C_BURST_RECV ? "tag messages in flight, received"
                                               : "tag messages in flight, sent",
                       sizes);
        free(sizes);
        reply_rc(rc, NULL);
        break;
    }
    case C_STREAM_RECV:
    case C_STREAM_SEND:
        if (m->count > MAX_ITEMS)
            fail("STREAM of %u", m->count);
        reply_rc(peer_xfer(m, m->type == C_STREAM_RECV ? X_STREAM_RECV : X_STREAM_SEND,
                           m->type == C_STREAM_RECV ? "stream received" : "stream sent", NULL),
                 NULL);
        break;
    case C_MAP: {
        region_t *r;
        msg_t *a = malloc(sizeof(*a));
        size_t len = 0;
        if (m->arg >= MAX_REGIONS || !a)
            fail("MAP %" PRIu64, m->arg);
        r = &regions[m->arg];
        if (r->used)
            region_destroy(r);
        region_create(r, m->sizes[0], m->offs[0], m->seed);
        msg_init(a, C_MAPPED);
        a->addr = (uint64_t)(uintptr_t)r->base;
        region_pack(r, a->blob, &len);
        a->blob_len = (uint32_t)len;
        ctl_send(g.ctl_fd, a);
        free(a);
        break;
    }
    case C_CHECK: {
        wr_t w[MAX_ITEMS];
        region_t *r = m->arg < MAX_REGIONS ? &regions[m->arg] : NULL;
        if (!r || !r->used || m->count > MAX_ITEMS)
            fail("CHECK %" PRIu64, m->arg);
        for (uint32_t i = 0; i < m->count; i++) {
            w[i] = (wr_t){.off = m->offs[i], .len = m->sizes[i], .seed = m->seeds[i]};
            if (w[i].off + w[i].len > r->len)
                fail("CHECK: write %u is outside the region", i);
        }
        snprintf(note, sizeof(note), "region %" PRIu64, m->arg);
        reply_rc(region_check(r, w, m->count, note), NULL);
        break;
    }
    case C_UNMAP: {
        region_t *r = m->arg < MAX_REGIONS ? &regions[m->arg] : NULL;
        if (!r || !r->used)
            fail("UNMAP %" PRIu64, m->arg);
        region_unmap(r);
        fill(r->base, r->len, m->seed, r->len, 0);
        memcpy(r->image, r->base, r->len);
        reply(C_OK, NULL);
        break;
    }
    case C_PUT_TO: {
        remote_t *r = calloc(1, sizeof(*r));
        wr_t w[MAX_ITEMS];
        if (!r || m->count > MAX_ITEMS || m->blob_len > BLOB_MAX)
            fail("PUT_TO");
        r->raddr = m->addr;
        r->len = m->arg;
        memcpy(r->packed, m->blob, m->blob_len);
        r->packed_len = m->blob_len;
        for (uint32_t i = 0; i < m->count; i++)
            w[i] = (wr_t){.off = m->offs[i], .len = m->sizes[i], .seed = m->seeds[i]};
        remote_add(&peer_conn, r);
        rc = put_writes(&peer_conn, r, w, m->count, false, "put from the peer");
        remote_drop(&peer_conn, r);
        free(r);
        reply_rc(rc, NULL);
        break;
    }
    case C_AM_EXPECT:
        am_expect(m->count, m->seed);
        reply(C_READY, NULL);
        rc = am_finish(note, sizeof(note));
        reply_rc(rc, note);
        break;
    case C_AM_SEND:
        reply_rc(am_send_all(&peer_conn, m->count, m->seed), NULL);
        break;
    case C_QUIT:
        if (peer_conn.ep)
            conn_close(&peer_conn, true);
        for (int i = 0; i < MAX_REGIONS; i++)
            if (regions[i].used)
                region_destroy(&regions[i]);
        ucx_fini();
        reply(C_OK, NULL);
        close(g.ctl_fd);
        exit(0);
    default:
        fail("unknown command %u", m->type);
    }
}

static int peer_main(const char *name, int fd)
{
    static char role[32];
    msg_t *m = malloc(sizeof(*m));

    snprintf(role, sizeof(role), "peer %s", name);
    g.role = role;
    g.ctl_fd = fd;
    peer_conn.name = "the parent";
    if (!m)
        fail("no memory");
    if (!strcmp(name, "B")) { /* it starts UCP when its test begins */
        struct pollfd p = {.fd = fd, .events = POLLIN};
        int r = poll(&p, 1, (int)(IDLE_S * 1000));
        if (r <= 0 || recv(fd, m, sizeof(*m), MSG_WAITALL) != (ssize_t)sizeof(*m))
            exit(1); /* the parent ended (or is gone) without needing us */
        if (m->type == C_QUIT)
            exit(0);
        if (m->type != C_START)
            fail("expected START, got %s", type_name(m->type));
    }
    ucx_init();
    am_handler_set();
    msg_init(m, C_ADDR);
    memcpy(m->blob, g.addr, g.addr_len);
    m->blob_len = (uint32_t)g.addr_len;
    ctl_send(fd, m);
    for (;;) {
        WAIT_FOR(ctl_try_recv(fd, m) > 0, IDLE_S, "the parent's next command");
        peer_command(m);
    }
}

/* ======================================================================================== */
/* The parent                                                                               */
/* ======================================================================================== */

static conn_t conn_a, conn_b;
static child_t *peer_a = &g.kids[0], *peer_b = &g.kids[1];

static void spawn(child_t *k, const char *name, const char *argv0)
{
    int sv[2];
    pid_t parent = getpid(), pid;

    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv))
        fail("socketpair: %s", strerror(errno));
    fflush(NULL);
    pid = fork();
    if (pid < 0)
        fail("fork: %s", strerror(errno));
    if (pid == 0) {
        char fdtext[16];
        int fd;
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* no peer outlives the parent, whatever ends it */
        if (getppid() != parent)
            _exit(1);
        fd = fcntl(sv[1], F_DUPFD, 3); /* without FD_CLOEXEC: it crosses the exec */
        if (fd < 0)
            _exit(1);
        snprintf(fdtext, sizeof(fdtext), "%d", fd);
        execl("/proc/self/exe", argv0, "--role", "peer", "--name", name, "--fd", fdtext,
              (char *)NULL);
        fprintf(stderr, "exec /proc/self/exe: %s\n", strerror(errno));
        _exit(127);
    }
    close(sv[1]);
    k->name = name[0] == 'A' ? "peer A" : "peer B";
    k->pid = pid;
    k->fd = sv[0];
    k->dying = false;
}

static msg_t *cmd(uint32_t type)
{
    static msg_t m;

    msg_init(&m, type);
    return &m;
}

static void send_cmd(child_t *k, msg_t *m)
{
    ctl_send(k->fd, m);
}

static msg_t answer;

static void expect_ok(child_t *k, const char *what)
{
    ctl_wait(k, &answer, C_OK, what);
}

__attribute__((format(printf, 1, 2))) static void ok(const char *fmt, ...)
{
    va_list ap;

    printf("ok ");
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n");
}

static void check(int rc)
{
    if (rc)
        fail("%s", err_msg);
}

/* The peer's worker address, our endpoint to it, its endpoint to us. */
static void connect_peer(child_t *k, conn_t *c)
{
    msg_t *m;

    ctl_wait(k, &answer, C_ADDR, "the worker address");
    if (answer.blob_len > BLOB_MAX)
        fail("%s sent an address of %u bytes", k->name, answer.blob_len);
    c->name = k->name;
    memcpy(c->addr, answer.blob, answer.blob_len);
    c->addr_len = answer.blob_len;
    conn_open(c);
    m = cmd(C_CONNECT);
    memcpy(m->blob, g.addr, g.addr_len);
    m->blob_len = (uint32_t)g.addr_len;
    send_cmd(k, m);
    expect_ok(k, "CONNECT");
}

/* A failed endpoint goes (force), a new one comes to the same worker address, and the peer
 * does the same on its side (so that stream endpoints pair up again). */
static void reconnect(child_t *k, conn_t *c)
{
    conn_close(c, true);
    conn_open(c);
    send_cmd(k, cmd(C_RECONNECT));
    expect_ok(k, "RECONNECT");
}

static void map_remote(child_t *k, conn_t *c, remote_t *r, uint32_t id, size_t len, size_t misalign,
                       uint32_t seed)
{
    msg_t *m = cmd(C_MAP);

    m->arg = id;
    m->sizes[0] = len;
    m->offs[0] = misalign;
    m->seed = seed;
    send_cmd(k, m);
    ctl_wait(k, &answer, C_MAPPED, "MAP");
    memset(r, 0, sizeof(*r));
    r->raddr = answer.addr;
    r->len = len;
    memcpy(r->packed, answer.blob, answer.blob_len);
    r->packed_len = answer.blob_len;
    r->image = malloc(len);
    if (!r->image)
        fail("no memory");
    fill(r->image, len, seed, len, 0);
    remote_add(c, r);
}

static void remote_check(child_t *k, uint32_t id, const wr_t *w, size_t n, const char *what)
{
    msg_t *m = cmd(C_CHECK);

    m->arg = id;
    m->count = (uint32_t)n;
    for (size_t i = 0; i < n; i++) {
        m->offs[i] = w[i].off;
        m->sizes[i] = w[i].len;
        m->seeds[i] = w[i].seed;
    }
    send_cmd(k, m);
    expect_ok(k, what);
}

/* Many small puts at once (more than the interface's bounce slots: most wait in the pending
 * queue), then a flush of the endpoint or the worker: it completes, and only once every put is
 * remotely complete (the peer checks before we wait for the puts themselves). One range, its
 * pattern cut into 8-byte puts. */
static void put_many_flush(child_t *peer, conn_t *c, remote_t *r, uint64_t off, uint32_t seed,
                           bool worker_flush, const char *what)
{
    enum { N = 300, SZ = 8 };
    op_t *ops = calloc(N + 1, sizeof(*ops));
    uint8_t *src = malloc(N * SZ);
    const wr_t w = {off, N * SZ, seed};
    ucp_request_param_t p;

    if (!ops || !src)
        fail("no memory");
    fill(src, N * SZ, seed, N * SZ, 0);
    for (size_t i = 0; i < N; i++) {
        p = send_param(&ops[i]);
        op_begin(&ops[i],
                 ucp_put_nbx(c->ep, src + i * SZ, SZ, r->raddr + off + i * SZ, r->rkey, &p));
    }
    p = send_param(&ops[N]);
    op_begin(&ops[N],
             worker_flush ? ucp_worker_flush_nbx(g.worker, &p) : ucp_ep_flush_nbx(c->ep, &p));
    WAIT_FOR(ops[N].done, WAIT_S, "%s: the %s flush", what, worker_flush ? "worker" : "endpoint");
    if (ops[N].status != UCS_OK)
        fail("%s: flush: %s", what, ucs_status_string(ops[N].status));
    remote_check(peer, 0, &w, 1, what);
    WAIT_FOR(all_done(ops, N), WAIT_S, "%s: put %zu of %d", what, first_not_done(ops, N), N);
    for (size_t i = 0; i < N; i++)
        if (ops[i].status != UCS_OK)
            fail("%s: put %zu: %s", what, i, ucs_status_string(ops[i].status));
    for (size_t i = 0; i <= N; i++)
        op_release(&ops[i]);
    if (r->image)
        image_apply(r->image, &w, 1);
    free(src);
    free(ops);
}

/* Tag messages of sizes[] to the peer: with F_ACK its receives are posted before we send;
 * unexpected: we send first and let the messages arrive before it posts them. */
static void tag_to_peer(child_t *k, conn_t *c, const uint64_t *sizes, uint32_t n, uint64_t tag,
                        uint32_t seed, bool unexpected, const char *what)
{
    msg_t *m = cmd(C_TAG_RECV);
    xfer_t x;

    m->count = n;
    m->seed = seed;
    m->tag = tag;
    m->arg = 1;
    memcpy(m->sizes, sizes, n * sizeof(*sizes));
    m->flags = unexpected ? 0 : F_ACK;
    xfer_init(&x, what, X_TAG_SEND, n, sizes, seed);
    x.tag = tag;
    x.step = 1;
    if (unexpected) {
        xfer_post(&x, c, NULL);
        for (double t = now() + 0.2; now() < t;)
            progress();
        send_cmd(k, m);
    } else {
        send_cmd(k, m);
        ctl_wait(k, &answer, C_READY, what);
        xfer_post(&x, c, NULL);
    }
    check(xfer_wait(&x));
    xfer_free(&x);
    expect_ok(k, what);
}

static void tag_from_peer(child_t *k, const uint64_t *sizes, uint32_t n, uint64_t tag,
                          uint32_t seed, const char *what)
{
    msg_t *m = cmd(C_TAG_SEND);
    xfer_t x;

    m->count = n;
    m->seed = seed;
    m->tag = tag;
    m->arg = 1;
    memcpy(m->sizes, sizes, n * sizeof(*sizes));
    xfer_init(&x, what, X_TAG_RECV, n, sizes, seed);
    x.tag = tag;
    x.step = 1;
    xfer_post(&x, NULL, NULL);
    send_cmd(k, m);
    check(xfer_wait(&x));
    check(xfer_verify(&x));
    xfer_free(&x);
    expect_ok(k, what);
}

static void burst(child_t *k, conn_t *c, bool to_peer, uint64_t tag, uint32_t seed)
{
    uint64_t *sizes = sizes_of(N_BURST, burst_size);
    msg_t *m = cmd(to_peer ? C_BURST_RECV : C_BURST_SEND);
    const char *what = to_peer ? "1000 tag messages in flight to the peer"
                               : "1000 tag messages in flight from the peer";
    xfer_t x;

    m->count = N_BURST;
    m->seed = seed;
    m->tag = tag;
    m->arg = 0; /* one tag: they must match in the order they were sent */
    m->flags = to_peer ? F_ACK : 0;
    xfer_init(&x, what, to_peer ? X_TAG_SEND : X_TAG_RECV, N_BURST, sizes, seed);
    x.tag = tag;
    x.step = 0;
    if (to_peer) {
        send_cmd(k, m);
        ctl_wait(k, &answer, C_READY, what);
        xfer_post(&x, c, NULL);
        check(xfer_wait(&x));
    } else {
        xfer_post(&x, NULL, NULL);
        send_cmd(k, m);
        check(xfer_wait(&x));
        check(xfer_verify(&x));
    }
    xfer_free(&x);
    free(sizes);
    expect_ok(k, what);
}

static void stream_to_peer(child_t *k, conn_t *c, const uint64_t *sizes, uint32_t n, uint32_t seed)
{
    msg_t *m = cmd(C_STREAM_RECV);
    xfer_t x;

    m->count = n;
    m->seed = seed;
    memcpy(m->sizes, sizes, n * sizeof(*sizes));
    send_cmd(k, m);
    xfer_init(&x, "stream to the peer", X_STREAM_SEND, n, sizes, seed);
    xfer_post(&x, c, NULL);
    check(xfer_wait(&x));
    xfer_free(&x);
    expect_ok(k, "stream to the peer");
}

static void stream_from_peer(child_t *k, conn_t *c, const uint64_t *sizes, uint32_t n,
                             uint32_t seed)
{
    msg_t *m = cmd(C_STREAM_SEND);
    xfer_t x;

    m->count = n;
    m->seed = seed;
    memcpy(m->sizes, sizes, n * sizeof(*sizes));
    xfer_init(&x, "stream from the peer", X_STREAM_RECV, n, sizes, seed);
    xfer_post(&x, c, NULL);
    send_cmd(k, m);
    check(xfer_wait(&x));
    check(xfer_verify(&x));
    xfer_free(&x);
    expect_ok(k, "stream from the peer");
}

static void am_to_peer(child_t *k, conn_t *c, uint32_t n, uint32_t seed, char *note, size_t len)
{
    msg_t *m = cmd(C_AM_EXPECT);

    m->count = n;
    m->seed = seed;
    send_cmd(k, m);
    ctl_wait(k, &answer, C_READY, "AM_EXPECT");
    check(am_send_all(c, n, seed));
    expect_ok(k, "active messages to the peer");
    snprintf(note, len, "%.*s", (int)answer.blob_len, answer.blob);
}

static void am_from_peer(child_t *k, uint32_t n, uint32_t seed, char *note, size_t len)
{
    msg_t *m = cmd(C_AM_SEND);

    m->count = n;
    m->seed = seed;
    am_expect(n, seed);
    send_cmd(k, m);
    check(am_finish(note, len));
    expect_ok(k, "active messages from the peer");
}

/* Region 0 of peer A, mapped once: everything "data again" puts into and gets from. */
static remote_t ra0;
static uint32_t seq = 1000; /* fresh seeds and tags */

/* Data both ways after a fault: tag, put and get, active messages, stream. */
static void data_again(const char *after)
{
    static const uint64_t sizes[] = {1, 8192, 100000, 1 * MiB + 3};
    static const uint64_t ssizes[] = {7, 65536};
    wr_t w[2] = {{5, 3000, seq}, {1 * MiB + 1, 70000, seq + 1}};
    char note[256];

    seq += 2;

    tag_to_peer(peer_a, &conn_a, sizes, 4, 0x7000 + seq, seq, false, "tag to peer A");
    seq += 8;
    tag_from_peer(peer_a, sizes, 4, 0x7100 + seq, seq, "tag from peer A");
    seq += 8;
    check(put_writes(&conn_a, &ra0, w, 2, false, "put to peer A"));
    remote_check(peer_a, 0, w, 2, "put to peer A");
    check(get_reads(&conn_a, &ra0, w, 2, "get from peer A"));
    am_to_peer(peer_a, &conn_a, N_AM_BIG + 1, seq++, note, sizeof(note));
    stream_to_peer(peer_a, &conn_a, ssizes, 2, seq);
    seq += 4;
    stream_from_peer(peer_a, &conn_a, ssizes, 2, seq);
    seq += 4;
    ok("data with peer A after %s (tag both ways, put, get, am, stream)", after);
}

static const char *st_text(ucs_status_t st)
{
    return ucs_status_string(st);
}

/* a) Puts that run past the end of a mapped region (short/bcopy and zcopy sizes), and one that
 * starts before it: each an error (the request, the flush after it, or the endpoint), and
 * neither the region nor the canaries around it change. */
static void test_oob_put(void)
{
    const size_t len = 64 * 1024;
    const struct {
        int64_t off;
        size_t n;
    } cases[] = {{(int64_t)len - 8, 4096}, {(int64_t)len - 8, 256 * 1024}, {-16, 4096}};
    char note[768] = "";
    remote_t r3;

    map_remote(peer_a, &conn_a, &r3, 3, len, 5, 0x3333);
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        size_t n = cases[i].n;
        uint8_t *src = malloc(n);
        uint64_t raddr = r3.raddr + (uint64_t)cases[i].off;
        ucp_request_param_t p;
        op_t o[2];
        char what[128];
        if (!src)
            fail("no memory");
        fill(src, n, 0x0b, n, 0);
        snprintf(what, sizeof(what),
                 "a put of %zu bytes at offset %" PRId64 " of a mapped region of %zu bytes", n,
                 cases[i].off, len);
        p = send_param(&o[0]);
        op_begin(&o[0], ucp_put_nbx(conn_a.ep, src, n, raddr, r3.rkey, &p));
        p = send_param(&o[1]);
        op_begin(&o[1], ucp_ep_flush_nbx(conn_a.ep, &p));
        WAIT_FOR(o[0].done && o[1].done, WAIT_S, "%s (%s) and the flush after it", what,
                 o[0].done ? "done" : "outstanding");
        op_release(&o[0]);
        op_release(&o[1]);
        if (o[0].status == UCS_OK && o[1].status == UCS_OK && !conn_a.errors)
            fail("%s succeeded (put, flush and endpoint all OK)", what);
        remote_check(peer_a, 3, NULL, 0, what);
        snprintf(note + strlen(note), sizeof(note) - strlen(note),
                 "%s%zu B at %+" PRId64 ": put %s, flush %s, handler %s", i ? "; " : "", n,
                 cases[i].off - (cases[i].off > 0 ? (int64_t)len : 0), st_text(o[0].status),
                 st_text(o[1].status), conn_a.errors ? st_text(conn_a.fail_status) : "-");
        free(src);
        if (conn_a.errors)
            reconnect(peer_a, &conn_a);
    }
    ok("out-of-bounds puts fail, region and canaries unchanged (%s)", note);
    remote_drop(&conn_a, &r3);
    free(r3.image);
    data_again("the out-of-bounds puts");
}

/* a) A get through the key of memory the peer has unmapped since: an error, and no data. */
static void test_get_unmapped(void)
{
    static const wr_t rd[] = {{100, 1000, 0}, {0, 128 * 1024, 0}};
    remote_t r4;
    const size_t len = 256 * 1024;
    msg_t *m;
    char note[512] = "";

    map_remote(peer_a, &conn_a, &r4, 4, len, 3, 0x4444);
    check(get_reads(&conn_a, &r4, rd, 2, "get before the unmap"));
    m = cmd(C_UNMAP);
    m->arg = 4;
    m->seed = 0x9999; /* what data a get still read would show */
    send_cmd(peer_a, m);
    expect_ok(peer_a, "UNMAP");
    for (size_t i = 0; i < 2; i++) {
        size_t n = rd[i].len;
        uint8_t *dst = malloc(n + 2 * GUARD);
        op_t o[2];
        ucp_request_param_t p;
        char w[128];
        if (!dst)
            fail("no memory");
        memset(dst, 0xee, n + 2 * GUARD);
        p = send_param(&o[0]);
        op_begin(&o[0], ucp_get_nbx(conn_a.ep, dst + GUARD, n, r4.raddr + rd[i].off, r4.rkey, &p));
        p = send_param(&o[1]);
        op_begin(&o[1], ucp_ep_flush_nbx(conn_a.ep, &p));
        WAIT_FOR(o[0].done && o[1].done, WAIT_S, "a get of %zu bytes of unmapped memory (%s)", n,
                 o[0].done ? "done, the flush not" : "outstanding");
        op_release(&o[0]);
        op_release(&o[1]);
        if (o[0].status == UCS_OK) {
            const char *got = !check_pat(dst + GUARD, n, 0x9999, len, rd[i].off, "")
                                  ? "what the peer wrote there after ucp_mem_unmap"
                              : !check_same(dst + GUARD, r4.image + rd[i].off, n, "")
                                  ? "what the region held before ucp_mem_unmap"
                              : !check_byte(dst + GUARD, n, 0xee, "") ? "nothing (untouched)"
                                                                      : "other bytes";
            fail("a get of %zu bytes through the key of memory the peer unmapped completed OK "
                 "(flush after it: %s, error handler: %s) and returned %s",
                 n, st_text(o[1].status), conn_a.errors ? st_text(conn_a.fail_status) : "no", got);
        }
        snprintf(w, sizeof(w), "the buffer of a failed get of %zu bytes", n);
        check(check_byte(dst, n + 2 * GUARD, 0xee, w));
        snprintf(note + strlen(note), sizeof(note) - strlen(note), "%s%zu bytes: %s%s",
                 i ? "; " : "", n, st_text(o[0].status),
                 conn_a.errors ? " and the endpoint failed" : "");
        free(dst);
        if (conn_a.errors)
            reconnect(peer_a, &conn_a);
    }
    ok("get through the key of unmapped memory fails, no data (%s)", note);
    remote_drop(&conn_a, &r4);
    free(r4.image);
    data_again("the failed gets");
}

/* b) Peer B killed while 4 MiB puts and rendezvous sends to it are in flight. */
static void test_peer_killed(void)
{
    enum { PUTS = 4, HELD = 2, PUT_LEN = 4 * MiB };
    static const uint64_t held_sizes[HELD] = {4 * MiB, 4 * MiB + 3};
    remote_t rb;
    xfer_t held;
    op_t puts[PUTS], more[2];
    uint8_t *src = malloc(PUT_LEN);
    unsigned puts_ok = 0, outstanding = 0, failed = 0;
    bool out_at_kill[PUTS];
    ucp_request_param_t p;
    double t_kill, t_handler;
    int st = 0;

    if (!src)
        fail("no memory");
    send_cmd(peer_b, cmd(C_START));
    connect_peer(peer_b, &conn_b);
    map_remote(peer_b, &conn_b, &rb, 0, PUT_LEN, 0, 0x5555);
    {
        wr_t w = {4096, 8192, 0x77};
        check(put_writes(&conn_b, &rb, &w, 1, false, "put to peer B"));
        remote_check(peer_b, 0, &w, 1, "put to peer B");
    }
    /* rendezvous sends peer B never receives: they can only end with an error */
    xfer_init(&held, "rendezvous sends to peer B", X_TAG_SEND, HELD, held_sizes, 0x66);
    held.tag = 0xdead0000;
    held.step = 1;
    xfer_post(&held, &conn_b, NULL);
    /* 4 MiB puts, PUTS in flight, for 300 ms */
    fill(src, PUT_LEN, 0x88, PUT_LEN, 0);
    memset(puts, 0, sizeof(puts));
    for (int i = 0; i < PUTS; i++)
        puts[i].done = 1, puts[i].status = UCS_OK;
    for (double t = now() + 0.3;;) { /* the last thing before the kill: new puts */
        for (int i = 0; i < PUTS; i++) {
            if (!puts[i].done)
                continue;
            op_release(&puts[i]);
            if (puts[i].status != UCS_OK)
                fail("a 4 MiB put to peer B (alive): %s", st_text(puts[i].status));
            puts_ok++;
            p = send_param(&puts[i]);
            op_begin(&puts[i], ucp_put_nbx(conn_b.ep, src, PUT_LEN, rb.raddr, rb.rkey, &p));
        }
        if (now() >= t)
            break;
        progress();
    }
    puts_ok -= PUTS; /* the first round was no put */
    for (int i = 0; i < PUTS; i++)
        outstanding += out_at_kill[i] = !puts[i].done;
    outstanding += (!held.ops[0].done) + (!held.ops[1].done);
    if (held.ops[0].done || held.ops[1].done)
        fail("a rendezvous send to peer B completed though B posted no receive for it (%s)",
             st_text(held.ops[held.ops[0].done ? 0 : 1].status));
    peer_b->dying = true;
    t_kill = now();
    if (kill(peer_b->pid, SIGKILL))
        fail("kill peer B: %s", strerror(errno));
    WAIT_FOR(conn_b.errors > 0, ERR_HANDLER_S,
             "the error handler of the endpoint to killed peer B");
    t_handler = conn_b.fail_time - t_kill;
    WAIT_FOR(all_done(held.ops, HELD) && all_done(puts, PUTS), WAIT_S,
             "the requests outstanding to killed peer B to complete");
    for (int i = 0; i < HELD; i++)
        if (held.ops[i].status == UCS_OK)
            fail("a rendezvous send to killed peer B, never received, completed OK");
    failed = HELD;
    for (int i = 0; i < PUTS; i++) {
        failed += out_at_kill[i] && puts[i].status != UCS_OK;
        op_release(&puts[i]);
    }
    /* the endpoint is failed: new operations on it fail too */
    p = send_param(&more[0]);
    op_begin(&more[0], ucp_put_nbx(conn_b.ep, src, 4096, rb.raddr, rb.rkey, &p));
    p = send_param(&more[1]);
    op_begin(&more[1], ucp_ep_flush_nbx(conn_b.ep, &p));
    WAIT_FOR(more[0].done && more[1].done, WAIT_S, "a put and a flush to killed peer B");
    op_release(&more[0]);
    op_release(&more[1]);
    if (more[0].status == UCS_OK && more[1].status == UCS_OK)
        fail("a put and a flush to killed peer B after its error handler completed OK");
    for (double dl = now() + WAIT_S; waitpid(peer_b->pid, &st, WNOHANG) == 0;) {
        if (now() > dl)
            fail("peer B was not reaped %.0f s after SIGKILL", WAIT_S);
        usleep(1000);
    }
    peer_b->pid = 0;
    if (!WIFSIGNALED(st) || WTERMSIG(st) != SIGKILL)
        fail("peer B ended with %s, not SIGKILL", exit_text(st));
    close(peer_b->fd);
    remote_drop(&conn_b, &rb);
    free(rb.image);
    conn_close(&conn_b, true);
    xfer_free(&held);
    free(src);
    ok("peer killed: error handler after %.0f ms (%s); %u puts of 4 MiB done before it; of %u "
       "requests outstanding at the kill, %u failed (the %d rendezvous sends never received "
       "among them) and %u puts whose data had moved completed OK",
       t_handler * 1e3, st_text(conn_b.fail_status), puts_ok, outstanding, failed, HELD,
       outstanding - failed);
    data_again("peer B was killed");
}

static int parent_main(const char *argv0)
{
    const char *tls = getenv("UCX_TLS");
    char note[256];
    int st = 0;

    g.parent = true;
    g.t_start = now();
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (!tls || !strstr(tls, "mooncake")) {
        printf("skip: UCX_TLS (%s) does not select the mooncake transport\n", tls ? tls : "unset");
        return 77;
    }
    /* the peers first: each process has its own context */
    spawn(peer_a, "A", argv0);
    spawn(peer_b, "B", argv0);
    atexit(reap_all);
    ucx_init();
    am_handler_set();
    if (!has_mooncake()) {
        printf("skip: the UCP context has no mooncake transport (is libuct_mooncake.so "
               "in LD_PRELOAD? LD_PRELOAD=%s)\n",
               getenv("LD_PRELOAD") ? getenv("LD_PRELOAD") : "");
        fflush(stdout);
        ucx_fini();
        exit(77);
    }
    connect_peer(peer_a, &conn_a);
    ok("connected to peer A (pid %d) and peer B (pid %d) started", (int)peer_a->pid,
       (int)peer_b->pid);

    /* ---- tag ---- */
    tag_to_peer(peer_a, &conn_a, tag_sizes, N_TAG_SIZES, 0x1000, 10, false,
                "tag sizes to the peer, receives posted first");
    ok("tag sizes 0 .. 4 MiB+3 to the peer, receives posted first");
    tag_to_peer(peer_a, &conn_a, tag_sizes, N_TAG_SIZES, 0x2000, 30, true,
                "tag sizes to the peer, unexpected");
    ok("tag sizes 0 .. 4 MiB+3 to the peer, unexpected");
    tag_from_peer(peer_a, tag_sizes, N_TAG_SIZES, 0x3000, 50, "tag sizes from the peer");
    ok("tag sizes 0 .. 4 MiB+3 from the peer");
    burst(peer_a, &conn_a, true, 0x4000, 100);
    ok("tag 1000 in flight to the peer, in order");
    burst(peer_a, &conn_a, false, 0x5000, 2000);
    ok("tag 1000 in flight from the peer, in order");

    /* ---- put and get ---- */
    {
        const size_t len = 2 * MiB + 4099;
        const wr_t w1[] = {{0, 1, 201},           {3, 7, 202},
                           {17, 64, 203},         {129, 1000, 204},
                           {2001, 4096, 205},     {7003, 8191, 206},
                           {20001, 32768, 207},   {60001, 65537, 208},
                           {131075, 100000, 209}, {300001, MiB + 3, 210},
                           {len - 9, 9, 211}};
        const wr_t w2[] = {{1, 4095, 221},
                           {9000, 33, 222},
                           {65536, 65536, 223},
                           {200003, 777, 224},
                           {1 * MiB + 5, 1 * MiB, 225},
                           {len - 1, 1, 226}};
        const wr_t rd[] = {
            {1, 1, 0},       {5, 7, 0},         {100, 64, 0},         {1001, 1000, 0},
            {4095, 8193, 0}, {33333, 32768, 0}, {MiB + 1, 100000, 0}, {7, MiB + 3, 0},
            {0, len, 0}};
        region_t *mine = &regions[1];
        msg_t *m;

        map_remote(peer_a, &conn_a, &ra0, 0, len, 5, 0x1111);
        check(put_writes(&conn_a, &ra0, w1, sizeof(w1) / sizeof(w1[0]), false,
                         "put, endpoint flush"));
        remote_check(peer_a, 0, w1, sizeof(w1) / sizeof(w1[0]), "put, endpoint flush");
        ok("put 1 B .. 1 MiB+3 at unaligned offsets + ucp_ep_flush_nbx, checked by the peer");
        check(put_writes(&conn_a, &ra0, w2, sizeof(w2) / sizeof(w2[0]), true, "put, worker flush"));
        remote_check(peer_a, 0, w2, sizeof(w2) / sizeof(w2[0]), "put, worker flush");
        ok("put over earlier puts + ucp_worker_flush_nbx, checked by the peer");
        put_many_flush(peer_a, &conn_a, &ra0, MiB + 100, 227, false, "300 puts, endpoint flush");
        ok("300 puts of 8 B (most queued) + ucp_ep_flush_nbx: done, and all in when it is");
        put_many_flush(peer_a, &conn_a, &ra0, MiB + 9000, 228, true, "300 puts, worker flush");
        ok("300 puts of 8 B (most queued) + ucp_worker_flush_nbx: done, and all in when it is");
        check(get_reads(&conn_a, &ra0, rd, sizeof(rd) / sizeof(rd[0]), "get"));
        ok("get 1 B .. the whole region (2 MiB+4099) at unaligned offsets + ucp_ep_flush_nbx");

        /* the other way: the peer puts into a region of ours */
        region_create(mine, 1 * MiB + 17, 3, 0x2222);
        m = cmd(C_PUT_TO);
        m->addr = (uint64_t)(uintptr_t)mine->base;
        m->arg = mine->len;
        {
            size_t klen = 0;
            region_pack(mine, m->blob, &klen);
            m->blob_len = (uint32_t)klen;
        }
        const wr_t wp[] = {{0, 3, 301},
                           {11, 999, 302},
                           {4097, 40000, 303},
                           {65537, 500000, 304},
                           {mine->len - 77, 77, 305}};
        m->count = sizeof(wp) / sizeof(wp[0]);
        for (uint32_t i = 0; i < m->count; i++) {
            m->offs[i] = wp[i].off;
            m->sizes[i] = wp[i].len;
            m->seeds[i] = wp[i].seed;
        }
        send_cmd(peer_a, m);
        expect_ok(peer_a, "PUT_TO");
        check(region_check(mine, wp, sizeof(wp) / sizeof(wp[0]), "put from the peer"));
        region_destroy(mine);
        ok("put from the peer into a region of ours + ucp_ep_flush_nbx");
    }

    /* ---- active messages ---- */
    am_to_peer(peer_a, &conn_a, N_AM, 3000, note, sizeof(note));
    ok("am to the peer (%s)", note);
    am_from_peer(peer_a, N_AM, 4000, note, sizeof(note));
    ok("am from the peer (%s)", note);

    /* ---- stream ---- */
    stream_to_peer(peer_a, &conn_a, stream_sizes, N_STREAM_SIZES, 5000);
    ok("stream 1 B .. 1 MiB+7 to the peer");
    stream_from_peer(peer_a, &conn_a, stream_sizes, N_STREAM_SIZES, 6000);
    ok("stream 1 B .. 1 MiB+7 from the peer");

    /* ---- faults ---- */
    test_oob_put();
    test_get_unmapped();
    test_peer_killed();

    /* ---- the end: a graceful close while peer A still progresses, then it quits ---- */
    remote_drop(&conn_a, &ra0);
    free(ra0.image);
    conn_close(&conn_a, false);
    peer_a->dying = true;
    send_cmd(peer_a, cmd(C_QUIT));
    expect_ok(peer_a, "QUIT");
    for (double dl = now() + WAIT_S; waitpid(peer_a->pid, &st, WNOHANG) == 0;) {
        if (now() > dl)
            fail("peer A did not exit %.0f s after QUIT", WAIT_S);
        usleep(1000);
    }
    peer_a->pid = 0;
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
        fail("peer A ended with %s", exit_text(st));
    close(peer_a->fd);
    ucx_fini();
    ok("closed; peers reaped (%.1f s in all)", now() - g.t_start);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc == 7 && !strcmp(argv[1], "--role") && !strcmp(argv[2], "peer") &&
        !strcmp(argv[3], "--name") && !strcmp(argv[5], "--fd"))
        return peer_main(argv[4], atoi(argv[6]));
    if (argc != 1) {
        fprintf(stderr, "usage: %s (it starts its peers itself)\n", argv[0]);
        return 1;
    }
    return parent_main(argv[0]);
}
