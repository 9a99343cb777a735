/*
 * kv_disagg: the plumbing kv_prefill and kv_decode share (see kv_common.h).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "kv_common.h"

const char *kv_prog = "kv_disagg";

/* ---- messages and time ---- */

/* One write per message, so that lines of two processes sharing a terminal do not mix. */
void kv_err(const char *fmt, ...)
{
    char line[1024];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(line, sizeof(line), fmt, ap);
    va_end(ap);
    fprintf(stderr, "%s: %s\n", kv_prog, line);
}

uint64_t kv_now_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

void kv_sleep_us(unsigned us)
{
    nanosleep(&(struct timespec){.tv_sec = us / 1000000, .tv_nsec = (us % 1000000) * 1000L}, NULL);
}

/* ---- flags ---- */

void kv_config_defaults(struct kv_config *c, const char *agent)
{
    memset(c, 0, sizeof(*c));
    c->agent = agent;
    c->listen = "127.0.0.1:0";
    c->layers = 32;
    c->blocks = 128;
    c->block_size = 32 * 1024;
    c->timeout_ms = 30 * 1000;
    c->n_opts = 1; /* opts[0] is LISTEN, filled in by kv_node_open */
}

int kv_parse_u32(const char *flag, const char *arg, uint32_t min, uint32_t max, uint32_t *v)
{
    char *end;
    unsigned long long x;

    errno = 0;
    x = strtoull(arg, &end, 0);
    if (errno || end == arg || *end || x < min || x > max || arg[0] == '-') {
        kv_err("--%s: '%s' is not a number in %u..%u", flag, arg, min, max);
        return -1;
    }
    *v = (uint32_t)x;
    return 0;
}

/* --opt KEY=VALUE: split in place (the string is argv's, alive for the whole run). */
static int add_opt(struct kv_config *c, char *arg)
{
    char *eq = strchr(arg, '=');

    if (eq == NULL || eq == arg) {
        kv_err("--opt: '%s' is not KEY=VALUE", arg);
        return -1;
    }
    if (c->n_opts == KV_MAX_OPTS) {
        kv_err("--opt: at most %d options", KV_MAX_OPTS - 1);
        return -1;
    }
    *eq = '\0';
    c->opts[c->n_opts++] = (mc_kv_option_t){.key = arg, .value = eq + 1};
    return 0;
}

int kv_config_flag(struct kv_config *c, int opt, const char *arg)
{
    uint32_t secs;

    switch (opt) {
    case KV_OPT_PLUGIN:
        c->plugin = arg;
        return 1;
    case KV_OPT_AGENT:
        c->agent = arg;
        return 1;
    case KV_OPT_LISTEN:
        c->listen = arg;
        return 1;
    case KV_OPT_SIDE:
        c->side = arg;
        return 1;
    case KV_OPT_LAYERS:
        return kv_parse_u32("layers", arg, 1, 4096, &c->layers) ? -1 : 1;
    case KV_OPT_BLOCKS:
        return kv_parse_u32("blocks", arg, 1, 1u << 20, &c->blocks) ? -1 : 1;
    case KV_OPT_BLOCK_SIZE:
        return kv_parse_u32("block-size", arg, 8, 64u << 20, &c->block_size) ? -1 : 1;
    case KV_OPT_OPT:
        return add_opt(c, (char *)arg) ? -1 : 1;
    case KV_OPT_TIMEOUT:
        if (kv_parse_u32("timeout", arg, 1, 3600, &secs))
            return -1;
        c->timeout_ms = (int)secs * 1000;
        return 1;
    }
    return 0;
}

int kv_config_check(const struct kv_config *c)
{
    if (c->plugin == NULL || c->side == NULL) {
        kv_err("--plugin and --side are required (--help for usage)");
        return -1;
    }
    if (c->block_size % 8) {
        kv_err("--block-size %u is not a multiple of 8", c->block_size);
        return -1;
    }
    if ((uint64_t)c->blocks * c->block_size > (4ull << 30)) {
        kv_err("a layer of %u blocks of %u bytes is over 4 GiB", c->blocks, c->block_size);
        return -1;
    }
    return 0;
}

/* ---- the plugin instance and its KV cache ---- */

int kv_fail(const struct kv_node *n, const char *what, int status)
{
    const char *why = n->p ? n->p->last_error(n->b) : "";

    kv_err("%s: %s: %s", what, mc_kv_status_name(status), why[0] ? why : "(no message)");
    return -1;
}

static int load_plugin(struct kv_node *n, const char *path)
{
    char why[512];
    int rc = mc_kv_load(path, MC_KV_ABI_CURRENT, &n->loaded, why, sizeof(why));

    if (rc < 0) {
        kv_err("loading the plugin: %s", why);
        return -1;
    }
    n->p = n->loaded->plugin;
    return 0;
}

static int create_instance(struct kv_node *n, struct kv_config *c)
{
    mc_kv_init_t init = {.size = sizeof(init), .agent = c->agent};
    mc_kv_status_t st;

    c->opts[0] = (mc_kv_option_t){.key = "LISTEN", .value = c->listen};
    init.options = c->opts;
    init.n_options = c->n_opts;
    st = n->p->create(&init, &n->b);
    if (st != MC_KV_SUCCESS) {
        /* No instance yet: last_error(NULL) holds create()'s reason. */
        kv_err("create (agent %s, LISTEN %s): %s: %s", c->agent, c->listen, mc_kv_status_name(st),
               n->p->last_error(NULL));
        return -1;
    }
    snprintf(n->agent, sizeof(n->agent), "%s", c->agent);
    return 0;
}

/* One layer: page-aligned memory, touched now so that page faults are not part of the timing,
 * then registered as one region. */
static int register_layer(struct kv_node *n, uint32_t l)
{
    mc_kv_region_t region = {.len = kv_layer_bytes(n), .type = MC_KV_DRAM};
    mc_kv_status_t st;
    char what[64];

    if (posix_memalign((void **)&n->layer[l], 4096, region.len)) {
        kv_err("allocating layer %u (%llu bytes): out of memory", l,
               (unsigned long long)region.len);
        return -1;
    }
    memset(n->layer[l], 0, region.len);
    region.addr = (uintptr_t)n->layer[l];
    st = n->p->register_mem(n->b, &region, &n->md[l]);
    if (st != MC_KV_SUCCESS) {
        snprintf(what, sizeof(what), "register_mem (layer %u)", l);
        return kv_fail(n, what, st);
    }
    return 0;
}

int kv_node_open(struct kv_node *n, const struct kv_config *c)
{
    struct kv_config cfg = *c; /* create() reads the options through a pointer into it */

    memset(n, 0, sizeof(*n));
    n->layers = c->layers;
    n->blocks = c->blocks;
    n->block_size = c->block_size;
    n->layer = calloc(n->layers, sizeof(*n->layer));
    n->md = calloc(n->layers, sizeof(*n->md));
    if (n->layer == NULL || n->md == NULL) {
        kv_err("out of memory");
        kv_node_close(n);
        return -1;
    }
    if (load_plugin(n, c->plugin) || create_instance(n, &cfg))
        goto fail;
    for (uint32_t l = 0; l < n->layers; l++) {
        if (register_layer(n, l))
            goto fail;
    }
    return 0;
fail:
    kv_node_close(n);
    return -1;
}

void kv_node_close(struct kv_node *n)
{
    mc_kv_status_t st;

    for (uint32_t l = 0; n->b && n->md && l < n->layers; l++) {
        if (n->md[l] && (st = n->p->deregister_mem(n->b, n->md[l])) != MC_KV_SUCCESS)
            kv_fail(n, "deregister_mem", st);
    }
    if (n->b)
        n->p->destroy(n->b);
    if (n->loaded)
        mc_kv_unload(n->loaded);
    for (uint32_t l = 0; n->layer && l < n->layers; l++)
        free(n->layer[l]);
    free(n->layer);
    free(n->md);
    memset(n, 0, sizeof(*n));
}

/* ---- the KV pattern ---- */

/* A 64-bit mixer (splitmix64's finalizer): every (layer, block, word) gets its own value, so a
 * block landing in the wrong place, or shifted by any number of bytes, is caught. */
static uint64_t mix64(uint64_t x)
{
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static uint64_t pattern_word(uint32_t layer, uint32_t block, uint64_t word)
{
    return mix64(((uint64_t)layer << 40) ^ ((uint64_t)block << 20) ^
                 (word * 0x9e3779b97f4a7c15ull));
}

void kv_fill_block(unsigned char *dst, uint32_t layer, uint32_t block, uint32_t block_size)
{
    for (uint64_t w = 0; w < block_size / 8; w++) {
        uint64_t v = pattern_word(layer, block, w);

        memcpy(dst + w * 8, &v, 8);
    }
}

int64_t kv_check_block(const unsigned char *got, uint32_t layer, uint32_t block,
                       uint32_t block_size)
{
    for (uint64_t w = 0; w < block_size / 8; w++) {
        uint64_t v = pattern_word(layer, block, w);
        const unsigned char *want = (const unsigned char *)&v;

        if (memcmp(got + w * 8, want, 8) == 0)
            continue;
        for (int i = 0; i < 8; i++) {
            if (got[w * 8 + i] != want[i])
                return (int64_t)(w * 8 + i);
        }
    }
    return -1;
}

/* ---- the side channel ---- */

static const char *msg_name(uint32_t type)
{
    static const char *const names[] = {"?",     "HELLO",   "CONN",  "LAYER",
                                        "READY", "REQUEST", "RESULT"};

    return type < sizeof(names) / sizeof(names[0]) ? names[type] : "?";
}

/* "HOST:PORT" (HOST may be "[v6]") to an address. */
static int resolve(const char *hostport, struct sockaddr_storage *sa, socklen_t *len)
{
    char host[256];
    const char *colon = strrchr(hostport, ':');
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV}, *ai;
    size_t hl;
    int rc;

    if (colon == NULL || colon == hostport || (hl = (size_t)(colon - hostport)) >= sizeof(host)) {
        kv_err("side channel address '%s' is not HOST:PORT", hostport);
        return -1;
    }
    memcpy(host, hostport, hl);
    host[hl] = '\0';
    if (host[0] == '[' && host[hl - 1] == ']') {
        memmove(host, host + 1, hl - 2);
        host[hl - 2] = '\0';
    }
    if ((rc = getaddrinfo(host, colon + 1, &hints, &ai)) != 0) {
        kv_err("side channel address '%s': %s", hostport, gai_strerror(rc));
        return -1;
    }
    memcpy(sa, ai->ai_addr, ai->ai_addrlen);
    *len = ai->ai_addrlen;
    freeaddrinfo(ai);
    return 0;
}

/* Wait until fd is ready for events; 0, or -1 with errno (ETIMEDOUT when the time ran out). */
static int wait_fd(int fd, short events, uint64_t deadline_ns)
{
    struct pollfd pfd = {.fd = fd, .events = events};
    uint64_t now = kv_now_ns();
    int rc;

    if (now >= deadline_ns) {
        errno = ETIMEDOUT;
        return -1;
    }
    rc = poll(&pfd, 1, (int)((deadline_ns - now) / 1000000 + 1));
    if (rc == 0)
        errno = ETIMEDOUT;
    return rc > 0 ? 0 : -1;
}

int kv_side_accept(const char *hostport, int timeout_ms)
{
    struct sockaddr_storage sa;
    socklen_t len;
    int one = 1, lfd, fd = -1;

    if (resolve(hostport, &sa, &len))
        return -1;
    lfd = socket(sa.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (lfd < 0 || setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) ||
        bind(lfd, (struct sockaddr *)&sa, len) || listen(lfd, 1)) {
        kv_err("side channel: listening on %s: %s", hostport, strerror(errno));
    } else if (wait_fd(lfd, POLLIN, kv_now_ns() + (uint64_t)timeout_ms * 1000000)) {
        kv_err("side channel: nobody connected to %s: %s", hostport, strerror(errno));
    } else if ((fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC)) < 0) {
        kv_err("side channel: accept on %s: %s", hostport, strerror(errno));
    }
    if (lfd >= 0)
        close(lfd);
    if (fd >= 0)
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    return fd;
}

/* One connect attempt; 0, or -1 with errno. */
static int try_connect(const struct sockaddr_storage *sa, socklen_t len, int *fd_p)
{
    int one = 1, fd = socket(sa->ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);

    if (fd < 0)
        return -1;
    if (connect(fd, (const struct sockaddr *)sa, len)) {
        int e = errno;

        close(fd);
        errno = e;
        return -1;
    }
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    *fd_p = fd;
    return 0;
}

int kv_side_connect(const char *hostport, int timeout_ms)
{
    struct sockaddr_storage sa;
    socklen_t len;
    uint64_t deadline = kv_now_ns() + (uint64_t)timeout_ms * 1000000;
    int fd;

    if (resolve(hostport, &sa, &len))
        return -1;
    /* The peer may not be listening yet (the two programs start independently): retry. */
    while (try_connect(&sa, len, &fd)) {
        if ((errno != ECONNREFUSED && errno != ENETUNREACH) || kv_now_ns() >= deadline) {
            kv_err("side channel: connecting to %s: %s", hostport, strerror(errno));
            return -1;
        }
        kv_sleep_us(50 * 1000);
    }
    return fd;
}

static int write_all(int fd, const void *buf, size_t len)
{
    const unsigned char *p = buf;

    while (len) {
        ssize_t n = send(fd, p, len, MSG_NOSIGNAL);

        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return -1;
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

int kv_side_send(int fd, uint32_t type, const void *payload, size_t len)
{
    uint32_t hdr[2] = {htonl(type), htonl((uint32_t)len)};

    if (len > KV_FRAME_MAX) {
        kv_err("side channel: frame of %zu bytes is over the limit", len);
        return -1;
    }
    if (write_all(fd, hdr, sizeof(hdr)) || write_all(fd, payload, len)) {
        kv_err("side channel: sending %s: %s", msg_name(type), strerror(errno));
        return -1;
    }
    return 0;
}

/* Read exactly len bytes by the deadline; 0, or -1 with errno (0 bytes read: ECONNRESET). */
static int read_all(int fd, void *buf, size_t len, uint64_t deadline_ns)
{
    unsigned char *p = buf;

    while (len) {
        ssize_t n;

        if (wait_fd(fd, POLLIN, deadline_ns))
            return -1;
        n = recv(fd, p, len, 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            if (n == 0)
                errno = ECONNRESET; /* the peer closed the channel */
            return -1;
        }
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

int kv_side_recv(int fd, uint32_t type, void *buf, size_t cap, size_t *len, int timeout_ms)
{
    uint64_t deadline = kv_now_ns() + (uint64_t)timeout_ms * 1000000;
    uint32_t hdr[2];

    if (read_all(fd, hdr, sizeof(hdr), deadline)) {
        kv_err("side channel: waiting for %s: %s", msg_name(type),
               errno == ECONNRESET ? "the peer closed the channel" : strerror(errno));
        return -1;
    }
    if (ntohl(hdr[0]) != type || ntohl(hdr[1]) > cap) {
        kv_err("side channel: got %s of %u bytes, expected %s of at most %zu",
               msg_name(ntohl(hdr[0])), ntohl(hdr[1]), msg_name(type), cap);
        return -1;
    }
    *len = ntohl(hdr[1]);
    if (read_all(fd, buf, *len, deadline)) {
        kv_err("side channel: reading %s: %s", msg_name(type),
               errno == ECONNRESET ? "the peer closed the channel" : strerror(errno));
        return -1;
    }
    return 0;
}

int kv_side_wait_close(int fd, int timeout_ms)
{
    uint64_t deadline = kv_now_ns() + (uint64_t)timeout_ms * 1000000;
    char c;
    ssize_t n;

    do {
        if (wait_fd(fd, POLLIN, deadline))
            return -1;
    } while ((n = recv(fd, &c, 1, 0)) < 0 && errno == EINTR);
    return n == 0 ? 0 : -1;
}

/* ---- payload encoding ---- */

static unsigned char *wire_take(struct kv_wire *w, size_t n)
{
    unsigned char *p;

    if (w->bad || n > w->cap - w->pos) {
        w->bad = 1;
        return NULL;
    }
    p = w->buf + w->pos;
    w->pos += n;
    return p;
}

void kv_put_u32(struct kv_wire *w, uint32_t v)
{
    unsigned char *p = wire_take(w, 4);

    for (int i = 0; p && i < 4; i++)
        p[i] = (unsigned char)(v >> (24 - 8 * i));
}

void kv_put_u64(struct kv_wire *w, uint64_t v)
{
    kv_put_u32(w, (uint32_t)(v >> 32));
    kv_put_u32(w, (uint32_t)v);
}

void kv_put_bytes(struct kv_wire *w, const void *p, size_t n)
{
    unsigned char *dst;

    kv_put_u32(w, (uint32_t)n);
    if ((dst = wire_take(w, n)) != NULL)
        memcpy(dst, p, n);
}

uint32_t kv_get_u32(struct kv_wire *w)
{
    const unsigned char *p = wire_take(w, 4);

    return p ? (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3] : 0;
}

uint64_t kv_get_u64(struct kv_wire *w)
{
    uint64_t hi = kv_get_u32(w);

    return hi << 32 | kv_get_u32(w);
}

const void *kv_get_bytes(struct kv_wire *w, size_t *n)
{
    *n = kv_get_u32(w);
    return wire_take(w, *n);
}

void kv_get_str(struct kv_wire *w, char *dst, size_t cap)
{
    size_t n;
    const char *p = kv_get_bytes(w, &n);

    if (p == NULL || n >= cap || memchr(p, '\0', n)) {
        w->bad = 1;
        dst[0] = '\0';
        return;
    }
    memcpy(dst, p, n);
    dst[n] = '\0';
}

/* ---- the handshake ---- */

int kv_send_hello(int fd, const struct kv_node *n)
{
    unsigned char buf[MC_KV_AGENT_MAX + 64];
    struct kv_wire w = {.buf = buf, .cap = sizeof(buf)};

    kv_put_bytes(&w, n->agent, strlen(n->agent));
    kv_put_u32(&w, n->layers);
    kv_put_u32(&w, n->blocks);
    kv_put_u32(&w, n->block_size);
    return kv_side_send(fd, KV_MSG_HELLO, buf, w.pos);
}

static int parse_hello(const unsigned char *buf, size_t len, struct kv_peer *peer)
{
    struct kv_wire w = {.buf = (unsigned char *)buf, .cap = len};

    kv_get_str(&w, peer->agent, sizeof(peer->agent));
    peer->layers = kv_get_u32(&w);
    peer->blocks = kv_get_u32(&w);
    peer->block_size = kv_get_u32(&w);
    if (w.bad || w.pos != len || peer->agent[0] == '\0' || peer->blocks == 0) {
        kv_err("side channel: malformed HELLO (%zu bytes)", len);
        return -1;
    }
    return 0;
}

int kv_recv_hello(int fd, const struct kv_node *n, struct kv_peer *peer, int timeout_ms)
{
    unsigned char buf[MC_KV_AGENT_MAX + 64];
    size_t len;

    if (kv_side_recv(fd, KV_MSG_HELLO, buf, sizeof(buf), &len, timeout_ms) ||
        parse_hello(buf, len, peer))
        return -1;
    if (peer->layers != n->layers || peer->block_size != n->block_size) {
        kv_err("peer %s has %u layers of %u-byte blocks, we have %u of %u: use the same --layers "
               "and --block-size on both sides",
               peer->agent, peer->layers, peer->block_size, n->layers, n->block_size);
        return -1;
    }
    return 0;
}

int kv_send_conn(int fd, const struct kv_node *n)
{
    unsigned char info[MC_KV_CONN_MAX];
    size_t len = sizeof(info);
    mc_kv_status_t st = n->p->conn_info(n->b, info, &len);

    if (st != MC_KV_SUCCESS)
        return kv_fail(n, "conn_info", st);
    return kv_side_send(fd, KV_MSG_CONN, info, len);
}

int kv_recv_conn(int fd, struct kv_node *n, const struct kv_peer *peer, int timeout_ms)
{
    unsigned char info[MC_KV_CONN_MAX];
    size_t len;
    mc_kv_status_t st;

    if (kv_side_recv(fd, KV_MSG_CONN, info, sizeof(info), &len, timeout_ms))
        return -1;
    if ((st = n->p->load_remote_conn_info(n->b, peer->agent, info, len)) != MC_KV_SUCCESS)
        return kv_fail(n, "load_remote_conn_info", st);
    return 0;
}
