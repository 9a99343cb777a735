/*
 * mooncake-kv-bench: descriptor throughput of a KV backend plugin (include/mooncake/kv_plugin.h)
 * between two processes, loaded by path through the loader the way a serving host loads it.
 *
 *   mooncake-kv-bench --plugin build/lib/libmooncake_kv.so --block_size 4096 --num_descs 100000
 *   mooncake-kv-bench --plugin build/lib/libmooncake_kv.so --json        # sweep, JSON lines
 *
 * Two instances: the initiator (this process) and a peer that owns the remote buffer. Without
 * --peer the initiator starts the peer itself (this program in its --serve mode, talking over a
 * socketpair). Across hosts or namespaces start the peer first, then point the initiator at it:
 *
 *   host B: mooncake-kv-bench --plugin P --serve --listen_side 10.0.0.2:7000 --listen 10.0.0.2:0
 *   host A: mooncake-kv-bench --plugin P --peer 10.0.0.2:7000 --listen 10.0.0.1:0 ...
 *
 * --listen_side is the side channel (TCP; the peer prints "listening: HOST:PORT" once ready and
 * serves one initiator), --listen the engine's own LISTEN address. The side channel carries
 * length-framed messages: the peer's agent name and connection info, per point a buffer request
 * answered with the region's address and public data, a verification request, and "done".
 *
 * Per point (block size B, N descriptors): both sides hold N*B bytes; local and remote block
 * slots come from two independent random permutations, redrawn until no two consecutive
 * descriptors are contiguous on both sides, so the plugin cannot merge any of them. The transfer
 * is prepared once (prep_us), posted once untimed and verified (unless --no_verify), then posted
 * --iters times, each post polled with check_xfer until SUCCESS (post_us avg and p99). The poll
 * spins (sched_yield between checks) as a NIXL host does; --poll_us U sleeps U us between checks
 * once a post has run 100 us, for a host that leaves the cores to the progress threads.
 *   gbps                     N*B / average post-to-completion time (1e9 B/s)
 *   descs_per_sec            N / average post-to-completion time
 *   descs_per_sec_incl_prep  N / (the first prep's time + average post-to-completion time)
 *   descs_per_sec_cycle      N / average time of a whole cycle (prep_xfer, post, poll to the
 *                            end, release_xfer), --iters of them after the timed posts: a host
 *                            that prepares every transfer it posts (cycle_us)
 * Without --block_size and --num_descs: a sweep over 4 KiB..64 MiB blocks and 1..32768
 * descriptors with N*B <= 128 MiB per side; fewer iterations for large points (see sweep_iters).
 *
 * --remote_file PATH (on the peer's host): the peer's region is that file, created or truncated
 * to N*B bytes of its pattern and registered as a FILE region (the plugin's FILE type: a file
 * descriptor, offsets in the file), instead of memory: KV blocks offloaded to and loaded from a
 * disk. The file is written and synced before each point and read back to verify a WRITE.
 */
#include <arpa/inet.h>
#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <netdb.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <mooncake/kv_loader.h>
#include <mooncake/kv_plugin.h>

#define MAX_OPTS        16
#define MSG_MAX         4096           /* largest side-channel payload */
#define SWEEP_CAP       (128ull << 20) /* N*B per side in the sweep */
#define SWEEP_BYTES     (512ull << 20) /* bytes a sweep point aims to move in its timed posts */
#define XFER_LIMIT_US   (120.0 * 1e6)  /* one post that has not completed by then fails */
#define INIT_WAIT_MS    (120 * 1000)   /* the initiator's wait for a peer's answer */
#define SERVE_WAIT_MS   (900 * 1000)   /* the peer's wait for the next request */
#define ACCEPT_WAIT_MS  (300 * 1000)   /* --listen_side: wait for the initiator */
#define CONNECT_WAIT_MS (10 * 1000)    /* --peer: retry a refused connection this long */
#define SALT_REMOTE     0x52454d4f54455341ull
#define SALT_LOCAL      0x4c4f43414c53414cull

static struct {
    const char *plugin, *op, *peer, *protocol, *listen, *listen_side, *remote_file;
    uint64_t block_size, num_descs, iters, seed, poll_us;
    bool json, verify, serve;
    int side_fd;
    const char *opts[MAX_OPTS]; /* --opt KEY=VALUE */
    size_t n_opts;
} opt = {.op = "write", .protocol = "auto", .iters = 10, .seed = 1, .verify = true, .side_fd = -1};

static const mc_kv_plugin_t *P;
static mc_kv_loaded_t *loaded;
static int side = -1;       /* the side channel */
static pid_t child = -1;    /* the peer we started */
static bool remote_is_file; /* the peer's region is a file (its --remote_file) */
static const char *role = "mooncake-kv-bench";

/* ---- errors ---- */

static void send_error(const char *text);

/* Print "role: message" and exit 1; a peer also tells its initiator why it is going. */
__attribute__((format(printf, 1, 2), noreturn)) static void fail(const char *fmt, ...)
{
    char text[1024];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(text, sizeof(text), fmt, ap);
    va_end(ap);
    fprintf(stderr, "%s: %s\n", role, text);
    if (opt.serve)
        send_error(text);
    exit(1);
}

static void check(mc_kv_backend_t *b, mc_kv_status_t st, const char *what)
{
    if (st != MC_KV_SUCCESS)
        fail("%s: %s (%s)", what, P->last_error(b), mc_kv_status_name(st));
}

/* At exit: the peer we started goes too (TERM, then KILL), and is reaped. */
static void reap_child(void)
{
    if (child <= 0)
        return;
    kill(child, SIGTERM);
    for (int i = 0; i < 50 && waitpid(child, NULL, WNOHANG) == 0; i++)
        usleep(20 * 1000);
    if (waitpid(child, NULL, WNOHANG) == 0) {
        kill(child, SIGKILL);
        waitpid(child, NULL, 0);
    }
    child = -1;
}

static double now_us(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

/* ---- arguments ---- */

static void usage(int code)
{
    fprintf(code ? stderr : stdout,
            "usage: mooncake-kv-bench --plugin PATH [--block_size B] [--num_descs N]\n"
            "  [--op read|write] [--protocol tcp|shm|rdma|auto] [--iters K] [--json]\n"
            "  [--peer HOST:PORT] [--listen ADDR] [--opt KEY=VALUE]... [--seed S]\n"
            "  [--verify | --no_verify] [--poll_us U] [--remote_file PATH]\n"
            "peer: mooncake-kv-bench --plugin PATH --serve --listen_side HOST:PORT "
            "[--listen ADDR] [--remote_file PATH]\n"
            "Without --block_size and --num_descs: a sweep. Sizes take K, M, G (binary).\n");
    exit(code);
}

static uint64_t parse_num(const char *s, const char *name, bool suffixes)
{
    char *end;
    errno = 0;
    uint64_t v = strtoull(s, &end, 10);
    int shift = 0;

    if (suffixes && *end)
        shift = *end == 'K' || *end == 'k'   ? 10
                : *end == 'M' || *end == 'm' ? 20
                : *end == 'G' || *end == 'g' ? 30
                                             : -1;
    if (shift > 0)
        end++;
    if (errno || end == s || *end || shift < 0 || v == 0 || v > (UINT64_MAX >> shift)) {
        fprintf(stderr, "mooncake-kv-bench: --%s=%s: expected a positive %s\n", name, s,
                suffixes ? "size" : "integer");
        exit(2);
    }
    return v << shift;
}

static void check_args(void)
{
    if (!opt.plugin) {
        fprintf(stderr, "mooncake-kv-bench: --plugin PATH is required\n");
        usage(2);
    }
    if (strcmp(opt.op, "read") && strcmp(opt.op, "write"))
        usage(2);
    if (strcmp(opt.protocol, "tcp") && strcmp(opt.protocol, "shm") &&
        strcmp(opt.protocol, "rdma") && strcmp(opt.protocol, "auto")) {
        fprintf(stderr, "mooncake-kv-bench: --protocol %s: expected tcp, shm, rdma or auto\n",
                opt.protocol);
        exit(2);
    }
    if (opt.block_size % 8) {
        fprintf(stderr, "mooncake-kv-bench: --block_size must be a multiple of 8\n");
        exit(2);
    }
    if (opt.peer && opt.remote_file) {
        fprintf(stderr, "mooncake-kv-bench: --remote_file goes to the peer's own command line "
                        "(--serve) when it runs apart (--peer)\n");
        exit(2);
    }
    if (opt.serve && opt.side_fd < 0 && !opt.listen_side) {
        fprintf(stderr, "mooncake-kv-bench: --serve needs --listen_side HOST:PORT\n");
        exit(2);
    }
}

static void parse_args(int argc, char **argv)
{
    static const struct option lo[] = {{"plugin", 1, 0, 'P'},      {"block_size", 1, 0, 'b'},
                                       {"num_descs", 1, 0, 'n'},   {"op", 1, 0, 'o'},
                                       {"peer", 1, 0, 'r'},        {"protocol", 1, 0, 'p'},
                                       {"iters", 1, 0, 'i'},       {"json", 0, 0, 'j'},
                                       {"verify", 0, 0, 'v'},      {"no_verify", 0, 0, 'V'},
                                       {"listen", 1, 0, 'l'},      {"opt", 1, 0, 'O'},
                                       {"seed", 1, 0, 's'},        {"serve", 0, 0, 'S'},
                                       {"listen_side", 1, 0, 'L'}, {"side_fd", 1, 0, 'F'},
                                       {"poll_us", 1, 0, 'u'},     {"remote_file", 1, 0, 'f'},
                                       {"help", 0, 0, 'h'},        {0, 0, 0, 0}};
    int c;

    while ((c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
        switch (c) {
        case 'P':
            opt.plugin = optarg;
            break;
        case 'b':
            opt.block_size = parse_num(optarg, "block_size", true);
            break;
        case 'n':
            opt.num_descs = parse_num(optarg, "num_descs", false);
            break;
        case 'o':
            opt.op = optarg;
            break;
        case 'r':
            opt.peer = optarg;
            break;
        case 'p':
            opt.protocol = optarg;
            break;
        case 'i':
            opt.iters = parse_num(optarg, "iters", false);
            break;
        case 'j':
            opt.json = true;
            break;
        case 'v':
            opt.verify = true;
            break;
        case 'V':
            opt.verify = false;
            break;
        case 'l':
            opt.listen = optarg;
            break;
        case 's':
            opt.seed = parse_num(optarg, "seed", false);
            break;
        case 'S':
            opt.serve = true;
            break;
        case 'L':
            opt.listen_side = optarg;
            break;
        case 'u':
            opt.poll_us = strcmp(optarg, "0") ? parse_num(optarg, "poll_us", false) : 0;
            break;
        case 'f':
            opt.remote_file = optarg;
            break;
        case 'F':
            opt.side_fd = (int)parse_num(optarg, "side_fd", false);
            break;
        case 'O':
            if (opt.n_opts == MAX_OPTS || !strchr(optarg, '='))
                usage(2);
            opt.opts[opt.n_opts++] = optarg;
            break;
        case 'h':
            usage(0);
            break;
        default:
            usage(2);
        }
    }
    if (optind < argc)
        usage(2);
    check_args();
}

/* ---- data: patterns and descriptor orders ---- */

static uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Word w of the pattern "salt": a buffer's byte offset, not its address, picks it. */
static uint64_t pattern_word(uint64_t salt, uint64_t w)
{
    return mix64(salt + w * 0x9e3779b97f4a7c15ull);
}

static void pattern_fill(void *p, uint64_t len, uint64_t salt)
{
    uint64_t *q = p;

    for (uint64_t w = 0; w < len / 8; w++)
        q[w] = pattern_word(salt, w);
}

static uint64_t rng_next(uint64_t *state)
{
    *state += 0x9e3779b97f4a7c15ull;
    return mix64(*state);
}

static void shuffle(uint64_t *a, uint64_t n, uint64_t *state)
{
    for (uint64_t i = 0; i < n; i++)
        a[i] = i;
    for (uint64_t i = n; i > 1; i--) { /* Fisher-Yates */
        uint64_t j = rng_next(state) % i, t = a[i - 1];
        a[i - 1] = a[j];
        a[j] = t;
    }
}

static bool mergeable(const uint64_t *l, const uint64_t *r, uint64_t n)
{
    for (uint64_t i = 0; i + 1 < n; i++)
        if (l[i + 1] == l[i] + 1 && r[i + 1] == r[i] + 1)
            return true;
    return false;
}

/* The block slots of descriptor i: l[i] locally, r[i] remotely. Both sides derive them from
 * the seed. Redrawn while some neighbours are contiguous on both sides (the plugin would merge
 * them): that happens with probability about 1/n, so a few draws always do. */
static void make_orders(uint64_t seed, uint64_t n, uint64_t *l, uint64_t *r)
{
    uint64_t state = seed;

    for (int tries = 0; tries < 1000; tries++) {
        shuffle(l, n, &state);
        shuffle(r, n, &state);
        if (!mergeable(l, r, n))
            return;
    }
    fail("could not draw descriptor orders without contiguous neighbours (n=%" PRIu64 ")", n);
}

/* Block dst[i] of buf must hold the pattern "salt" as at byte offset src[i] * bs. Returns
 * false with a description of the first mismatch in why. */
static bool check_blocks(const void *buf, uint64_t bs, uint64_t n, const uint64_t *dst,
                         const uint64_t *src, uint64_t salt, char *why, size_t why_len)
{
    const uint64_t *q = buf;
    uint64_t words = bs / 8;

    for (uint64_t i = 0; i < n; i++) {
        const uint64_t *blk = q + dst[i] * words;
        for (uint64_t w = 0; w < words; w++) {
            if (blk[w] != pattern_word(salt, src[i] * words + w)) {
                snprintf(why, why_len,
                         "descriptor %" PRIu64 " (block %" PRIu64 " from %" PRIu64
                         "): first wrong byte at %" PRIu64 " of %" PRIu64,
                         i, dst[i], src[i], w * 8, bs);
                return false;
            }
        }
    }
    return true;
}

static void *map_buffer(uint64_t len)
{
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

    if (p == MAP_FAILED)
        fail("cannot map a buffer of %" PRIu64 " bytes: %s", len, strerror(errno));
    return p;
}

/* ---- the side channel: frames of {type, length} (big endian) and a payload ---- */

enum msg_type {
    MSG_HELLO = 1, /* peer: agent name, connection info */
    MSG_REGION,    /* initiator: length, salt -> peer: MSG_REGION_OK */
    MSG_REGION_OK, /* peer: address, whether it is a file, public data */
    MSG_VERIFY,    /* initiator: block size, count, seed, salt -> peer: MSG_OK */
    MSG_DONE,      /* initiator: tear down -> peer: MSG_OK */
    MSG_OK,
    MSG_ERROR, /* text */
};

typedef struct msg {
    uint32_t type, len, pos;
    unsigned char data[MSG_MAX];
} msg_t;

static void msg_init(msg_t *m, uint32_t type)
{
    m->type = type;
    m->len = m->pos = 0;
}

static void put_bytes(msg_t *m, const void *p, size_t n)
{
    if (m->len + 4 + n > MSG_MAX)
        fail("side channel: message too long");
    uint32_t be = htonl((uint32_t)n);
    memcpy(m->data + m->len, &be, 4);
    memcpy(m->data + m->len + 4, p, n);
    m->len += 4 + (uint32_t)n;
}

static void put_u64(msg_t *m, uint64_t v)
{
    uint64_t be = htobe64(v);

    if (m->len + 8 > MSG_MAX)
        fail("side channel: message too long");
    memcpy(m->data + m->len, &be, 8);
    m->len += 8;
}

static uint64_t get_u64(msg_t *m)
{
    uint64_t be;

    if (m->pos + 8 > m->len)
        fail("side channel: message %u is short", m->type);
    memcpy(&be, m->data + m->pos, 8);
    m->pos += 8;
    return be64toh(be);
}

static const void *get_bytes(msg_t *m, size_t *n)
{
    uint32_t be;

    if (m->pos + 4 > m->len)
        fail("side channel: message %u is short", m->type);
    memcpy(&be, m->data + m->pos, 4);
    *n = ntohl(be);
    if (*n > m->len - m->pos - 4)
        fail("side channel: message %u is short", m->type);
    m->pos += 4 + (uint32_t)*n;
    return m->data + m->pos - *n;
}

/* Wait until fd is ready for ev, at most until deadline (now_us() scale). 0, or -1 on a
 * timeout (errno ETIMEDOUT) or poll error. */
static int wait_fd(int fd, short ev, double deadline)
{
    for (;;) {
        double left = deadline - now_us();
        struct pollfd pfd = {.fd = fd, .events = ev};
        if (left <= 0) {
            errno = ETIMEDOUT;
            return -1;
        }
        int n = poll(&pfd, 1, (int)(left / 1000) + 1);
        if (n > 0)
            return 0;
        if (n < 0 && errno != EINTR)
            return -1;
    }
}

/* All n bytes, or -1 with errno (ECONNRESET when the other end closed). */
static int io_full(int fd, void *buf, size_t n, bool out, double deadline)
{
    char *p = buf;

    while (n) {
        if (wait_fd(fd, out ? POLLOUT : POLLIN, deadline))
            return -1;
        ssize_t k = out ? send(fd, p, n, MSG_NOSIGNAL) : recv(fd, p, n, 0);
        if (k == 0)
            errno = ECONNRESET;
        if (k <= 0 && (k == 0 || (errno != EINTR && errno != EAGAIN)))
            return -1;
        if (k > 0) {
            p += k;
            n -= (size_t)k;
        }
    }
    return 0;
}

static int send_msg_raw(const msg_t *m)
{
    uint32_t hdr[2] = {htonl(m->type), htonl(m->len)};
    double deadline = now_us() + INIT_WAIT_MS * 1e3;

    if (io_full(side, hdr, sizeof(hdr), true, deadline))
        return -1;
    return io_full(side, (void *)m->data, m->len, true, deadline);
}

static void send_msg(const msg_t *m)
{
    if (send_msg_raw(m))
        fail("side channel: sending message %u: %s", m->type, strerror(errno));
}

static void send_error(const char *text)
{
    msg_t m;

    if (side < 0)
        return;
    msg_init(&m, MSG_ERROR);
    put_bytes(&m, text, strlen(text));
    send_msg_raw(&m);
}

/* The next message; false if the other end closed the channel cleanly between messages. */
static bool recv_msg(msg_t *m, int wait_ms)
{
    uint32_t hdr[2];
    double deadline = now_us() + wait_ms * 1e3;

    if (io_full(side, hdr, sizeof(hdr), false, deadline)) {
        if (errno == ECONNRESET)
            return false;
        fail("side channel: receiving: %s", strerror(errno));
    }
    m->type = ntohl(hdr[0]);
    m->len = ntohl(hdr[1]);
    m->pos = 0;
    if (m->len > MSG_MAX)
        fail("side channel: a message of %u bytes (at most %d)", m->len, MSG_MAX);
    if (io_full(side, m->data, m->len, false, deadline))
        fail("side channel: receiving: %s", strerror(errno));
    return true;
}

/* The initiator's receive: the expected type, or the peer's error. */
static void expect(msg_t *m, uint32_t type, const char *what)
{
    size_t n;

    if (!recv_msg(m, INIT_WAIT_MS))
        fail("%s: the peer closed the side channel (it died?)", what);
    if (m->type == MSG_ERROR) {
        const char *t = get_bytes(m, &n);
        fail("%s: the peer failed: %.*s", what, (int)n, t);
    }
    if (m->type != type)
        fail("%s: message %u from the peer, expected %u", what, m->type, type);
}

/* ---- TCP side channel (--peer, --listen_side) ---- */

static struct addrinfo *resolve(const char *hostport, bool passive)
{
    char host[256];
    const char *colon = strrchr(hostport, ':');
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM,
                             .ai_flags =
                                 AI_NUMERICHOST | AI_NUMERICSERV | (passive ? AI_PASSIVE : 0)};
    struct addrinfo *ai;

    if (!colon || colon == hostport || (size_t)(colon - hostport) >= sizeof(host))
        fail("'%s': expected HOST:PORT with a numeric host", hostport);
    snprintf(host, sizeof(host), "%.*s", (int)(colon - hostport), hostport);
    int rc = getaddrinfo(host, colon + 1, &hints, &ai);
    if (rc)
        fail("'%s': %s", hostport, gai_strerror(rc));
    return ai;
}

static int tcp_connect(const char *hostport)
{
    struct addrinfo *ai = resolve(hostport, false);
    double deadline = now_us() + CONNECT_WAIT_MS * 1e3;
    struct timeval tv = {.tv_sec = 5}; /* bounds connect() on Linux */

    for (;;) {
        int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0)
            fail("socket: %s", strerror(errno));
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
        if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0) {
            freeaddrinfo(ai);
            return fd;
        }
        int err = errno;
        close(fd);
        if (err != ECONNREFUSED || now_us() > deadline)
            fail("connecting to the peer at %s: %s", hostport, strerror(err));
        usleep(100 * 1000);
    }
}

/* Listen on HOST:PORT, say "listening: HOST:PORT" on stdout, accept one initiator. */
static int tcp_accept_one(const char *hostport)
{
    struct addrinfo *ai = resolve(hostport, true);
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    char host[NI_MAXHOST], port[NI_MAXSERV];
    int one = 1, fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);

    if (fd < 0)
        fail("socket: %s", strerror(errno));
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, ai->ai_addr, ai->ai_addrlen) || listen(fd, 1) ||
        getsockname(fd, (struct sockaddr *)&ss, &sl))
        fail("listening on %s: %s", hostport, strerror(errno));
    freeaddrinfo(ai);
    getnameinfo((struct sockaddr *)&ss, sl, host, sizeof(host), port, sizeof(port),
                NI_NUMERICHOST | NI_NUMERICSERV);
    printf("listening: %s:%s\n", host, port);
    fflush(stdout);
    if (wait_fd(fd, POLLIN, now_us() + ACCEPT_WAIT_MS * 1e3))
        fail("no initiator connected to %s:%s within %d s", host, port, ACCEPT_WAIT_MS / 1000);
    int c = accept4(fd, NULL, NULL, SOCK_CLOEXEC);
    if (c < 0)
        fail("accept on %s:%s: %s", host, port, strerror(errno));
    close(fd);
    return c;
}

/* ---- the plugin ---- */

static void load_plugin(void)
{
    char err[4200];
    int rc = mc_kv_load(opt.plugin, MC_KV_ABI_CURRENT, &loaded, err, sizeof(err));

    if (rc)
        fail("loading the plugin: %s", err);
    P = loaded->plugin;
}

static mc_kv_backend_t *make_instance(const char *agent)
{
    mc_kv_option_t o[MAX_OPTS + 2];
    char keys[MAX_OPTS][128];
    size_t n = 0;
    mc_kv_backend_t *b;
    mc_kv_caps_t caps;

    o[n++] = (mc_kv_option_t){"PROTOCOL", opt.protocol, NULL};
    if (opt.listen)
        o[n++] = (mc_kv_option_t){"LISTEN", opt.listen, NULL};
    for (size_t i = 0; i < opt.n_opts; i++) { /* KEY=VALUE: the key copied, the value in place */
        const char *eq = strchr(opt.opts[i], '=');
        snprintf(keys[i], sizeof(keys[i]), "%.*s", (int)(eq - opt.opts[i]), opt.opts[i]);
        o[n++] = (mc_kv_option_t){keys[i], eq + 1, NULL};
    }
    mc_kv_init_t init = {.size = sizeof(init), .agent = agent, .options = o, .n_options = n};
    mc_kv_status_t st = P->create(&init, &b);
    if (st != MC_KV_SUCCESS)
        fail("creating an instance: %s (%s)", P->last_error(NULL), mc_kv_status_name(st));
    check(b, P->caps(b, &caps), "caps");
    if (!caps.supports_remote || !(caps.mem_types & (1u << MC_KV_DRAM)))
        fail("the plugin cannot move DRAM to other agents (caps: remote %d, mem_types 0x%x)",
             caps.supports_remote, caps.mem_types);
    return b;
}

static mc_kv_md_t *register_region(mc_kv_backend_t *b, void *p, uint64_t len)
{
    mc_kv_region_t r = {.addr = (uintptr_t)p, .len = len, .dev_id = 0, .type = MC_KV_DRAM};
    mc_kv_md_t *md;

    check(b, P->register_mem(b, &r, &md), "register_mem");
    return md;
}

/* ---- the peer (--serve) ---- */

typedef struct serve_region {
    void *buf; /* the region, or with --remote_file the file's bytes as written and read back */
    uint64_t len;
    mc_kv_md_t *md;
    int fd; /* --remote_file: the region */
} serve_region_t;

static void serve_free(mc_kv_backend_t *b, serve_region_t *r)
{
    if (!r->buf)
        return;
    check(b, P->deregister_mem(b, r->md), "deregister_mem");
    munmap(r->buf, r->len);
    r->buf = NULL;
    if (r->fd >= 0)
        close(r->fd);
    r->fd = -1;
}

/* All of buf to (write) or from the file at offset 0. */
static void file_io(int fd, void *buf, uint64_t len, bool write)
{
    for (uint64_t done = 0; done < len;) {
        ssize_t n = write ? pwrite(fd, (char *)buf + done, len - done, (off_t)done)
                          : pread(fd, (char *)buf + done, len - done, (off_t)done);
        if (n <= 0)
            fail("%s %s: %s", write ? "writing" : "reading", opt.remote_file,
                 n ? strerror(errno) : "short file");
        done += (uint64_t)n;
    }
}

/* --remote_file: the file, len bytes of buf, synced and out of the page cache, as a FILE
 * region. */
static mc_kv_md_t *register_file(mc_kv_backend_t *b, serve_region_t *r)
{
    mc_kv_md_t *md;

    r->fd = open(opt.remote_file, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (r->fd < 0)
        fail("cannot open %s: %s", opt.remote_file, strerror(errno));
    file_io(r->fd, r->buf, r->len, true);
    if (fsync(r->fd))
        fail("fsync %s: %s", opt.remote_file, strerror(errno));
    posix_fadvise(r->fd, 0, 0, POSIX_FADV_DONTNEED);
    mc_kv_region_t reg = {.addr = 0, .len = r->len, .dev_id = (uint64_t)r->fd, .type = MC_KV_FILE};
    check(b, P->register_mem(b, &reg, &md), "register_mem (the file)");
    return md;
}

/* MSG_REGION: a fresh buffer of the asked length filled with the asked pattern. */
static void serve_region(mc_kv_backend_t *b, serve_region_t *r, msg_t *m)
{
    uint64_t len = get_u64(m), salt = get_u64(m);
    unsigned char pub[MC_KV_PUBLIC_MAX];
    size_t plen = sizeof(pub);

    serve_free(b, r);
    if (len == 0 || len % 8)
        fail("asked for a buffer of %" PRIu64 " bytes", len);
    r->buf = map_buffer(len);
    r->len = len;
    pattern_fill(r->buf, len, salt);
    r->md = opt.remote_file ? register_file(b, r) : register_region(b, r->buf, len);
    check(b, P->public_data(b, r->md, pub, &plen), "public_data");
    msg_init(m, MSG_REGION_OK);
    put_u64(m, opt.remote_file ? 0 : (uintptr_t)r->buf); /* a file's region starts at offset 0 */
    put_u64(m, opt.remote_file != NULL);
    put_bytes(m, pub, plen);
    send_msg(m);
}

/* MSG_VERIFY after a WRITE: every remote block holds the initiator's pattern of its source. */
static void serve_verify(serve_region_t *r, msg_t *m)
{
    uint64_t bs = get_u64(m), n = get_u64(m), seed = get_u64(m), salt = get_u64(m);
    char why[256];

    if (!r->buf || bs % 8 || n * bs != r->len)
        fail("verify: %" PRIu64 " blocks of %" PRIu64 " bytes do not fill the buffer", n, bs);
    uint64_t *l = malloc(n * sizeof(*l)), *rr = malloc(n * sizeof(*rr));
    if (!l || !rr)
        fail("out of memory");
    make_orders(seed, n, l, rr);
    if (r->fd >= 0)
        file_io(r->fd, r->buf, r->len, false);
    bool ok = check_blocks(r->buf, bs, n, rr, l, salt, why, sizeof(why));
    free(l);
    free(rr);
    msg_init(m, ok ? MSG_OK : MSG_ERROR);
    if (!ok)
        put_bytes(m, why, strlen(why));
    send_msg(m);
}

static void serve_hello(mc_kv_backend_t *b, const char *agent)
{
    unsigned char conn[MC_KV_CONN_MAX];
    size_t clen = sizeof(conn);
    msg_t m;

    check(b, P->conn_info(b, conn, &clen), "conn_info");
    msg_init(&m, MSG_HELLO);
    put_bytes(&m, agent, strlen(agent));
    put_bytes(&m, conn, clen);
    send_msg(&m);
}

static int serve_main(void)
{
    char agent[64];
    serve_region_t r = {.fd = -1};
    msg_t m;

    role = "mooncake-kv-bench (peer)";
    side = opt.side_fd >= 0 ? opt.side_fd : tcp_accept_one(opt.listen_side);
    snprintf(agent, sizeof(agent), "kvbench-peer-%d", (int)getpid());
    mc_kv_backend_t *b = make_instance(agent);
    serve_hello(b, agent);
    for (;;) {
        if (!recv_msg(&m, SERVE_WAIT_MS))
            fail("the initiator closed the side channel before 'done'");
        if (m.type == MSG_REGION) {
            serve_region(b, &r, &m);
        } else if (m.type == MSG_VERIFY) {
            serve_verify(&r, &m);
        } else if (m.type == MSG_DONE) {
            break;
        } else {
            fail("unexpected message %u from the initiator", m.type);
        }
    }
    serve_free(b, &r);
    P->destroy(b);
    msg_init(&m, MSG_OK);
    send_msg(&m);
    close(side);
    mc_kv_unload(loaded);
    return 0;
}

/* ---- the initiator ---- */

/* Start this program as the peer, its side channel one end of a socketpair. */
static void spawn_peer(void)
{
    int sv[2];
    char fdarg[16];

    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv))
        fail("socketpair: %s", strerror(errno));
    child = fork();
    if (child < 0)
        fail("fork: %s", strerror(errno));
    if (child == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlive the initiator */
        close(sv[0]);
        snprintf(fdarg, sizeof(fdarg), "%d", sv[1]);
        const char *argv[8 + 2 * MAX_OPTS + 6] = {"mooncake-kv-bench", "--plugin",  loaded->path,
                                                  "--serve",           "--side_fd", fdarg,
                                                  "--protocol",        opt.protocol};
        size_t n = 8;
        if (opt.listen) {
            argv[n++] = "--listen";
            argv[n++] = opt.listen;
        }
        if (opt.remote_file) {
            argv[n++] = "--remote_file";
            argv[n++] = opt.remote_file;
        }
        for (size_t i = 0; i < opt.n_opts; i++) {
            argv[n++] = "--opt";
            argv[n++] = opt.opts[i];
        }
        execv("/proc/self/exe", (char **)argv);
        fprintf(stderr, "mooncake-kv-bench: exec of the peer: %s\n", strerror(errno));
        _exit(127);
    }
    close(sv[1]);
    side = sv[0];
}

/* The peer's MSG_HELLO: learn its agent and connect. */
static void meet_peer(mc_kv_backend_t *b, char *agent, size_t agent_len)
{
    msg_t m;
    size_t n, clen;

    expect(&m, MSG_HELLO, "waiting for the peer's connection info");
    const char *name = get_bytes(&m, &n);
    if (n == 0 || n >= agent_len)
        fail("the peer's agent name has %zu bytes", n);
    memcpy(agent, name, n);
    agent[n] = '\0';
    const void *conn = get_bytes(&m, &clen);
    check(b, P->load_remote_conn_info(b, agent, conn, clen), "load_remote_conn_info");
    check(b, P->connect(b, agent), "connect");
}

typedef struct point {
    uint64_t bs, n, iters;
    mc_kv_op_t op;
    double prep_us, avg_us, p99_us, min_us, cycle_us;
    bool verified;
} point_t;

typedef struct side_state { /* what one point holds on this side */
    void *buf;
    mc_kv_md_t *lmd, *rmd;
    uint64_t raddr, *l, *r;
    mc_kv_desc_t *ld, *rd;
} side_state_t;

/* Ask the peer for its buffer of len bytes, and load its metadata. */
static void remote_region(mc_kv_backend_t *b, const char *agent, uint64_t len, uint64_t salt,
                          side_state_t *s)
{
    msg_t m;
    size_t plen;

    msg_init(&m, MSG_REGION);
    put_u64(&m, len);
    put_u64(&m, salt);
    send_msg(&m);
    expect(&m, MSG_REGION_OK, "asking the peer for its buffer");
    s->raddr = get_u64(&m);
    remote_is_file = get_u64(&m) != 0; /* the peer's word: it may have been started apart */
    const void *pub = get_bytes(&m, &plen);
    check(b, P->load_remote_md(b, agent, pub, plen, &s->rmd), "load_remote_md");
}

static void build_descs(point_t *pt, side_state_t *s, uint64_t seed)
{
    s->l = malloc(pt->n * sizeof(*s->l));
    s->r = malloc(pt->n * sizeof(*s->r));
    s->ld = malloc(pt->n * sizeof(*s->ld));
    s->rd = malloc(pt->n * sizeof(*s->rd));
    if (!s->l || !s->r || !s->ld || !s->rd)
        fail("out of memory for %" PRIu64 " descriptors", pt->n);
    make_orders(seed, pt->n, s->l, s->r);
    for (uint64_t i = 0; i < pt->n; i++) {
        s->ld[i] = (mc_kv_desc_t){(uintptr_t)s->buf + s->l[i] * pt->bs, pt->bs, 0, s->lmd};
        s->rd[i] = (mc_kv_desc_t){s->raddr + s->r[i] * pt->bs, pt->bs, 0, s->rmd};
    }
}

/* Post once and poll until it ends; its status, and the time it took in *us. */
static mc_kv_status_t post_wait(mc_kv_backend_t *b, mc_kv_xfer_t *x, double *us)
{
    double t0 = now_us();
    mc_kv_status_t st = P->post_xfer(b, x, NULL, 0);

    while (st == MC_KV_IN_PROG) {
        if (now_us() - t0 > XFER_LIMIT_US)
            fail("a transfer did not complete within %.0f s", XFER_LIMIT_US / 1e6);
        if (opt.poll_us && now_us() - t0 > 100) /* a short transfer is still spun on */
            usleep((useconds_t)opt.poll_us);
        else
            sched_yield(); /* on a small machine the progress threads need the core */
        st = P->check_xfer(b, x);
    }
    *us = now_us() - t0;
    return st;
}

/* The data of the untimed first post: a READ is checked here, a WRITE by the peer. */
static void verify_point(point_t *pt, side_state_t *s, uint64_t seed)
{
    char why[256];
    msg_t m;

    if (pt->op == MC_KV_READ) {
        if (!check_blocks(s->buf, pt->bs, pt->n, s->l, s->r, seed ^ SALT_REMOTE, why, sizeof(why)))
            fail("verify: READ of %" PRIu64 " x %" PRIu64 " B: %s", pt->n, pt->bs, why);
    } else {
        msg_init(&m, MSG_VERIFY);
        put_u64(&m, pt->bs);
        put_u64(&m, pt->n);
        put_u64(&m, seed);
        put_u64(&m, seed ^ SALT_LOCAL);
        send_msg(&m);
        expect(&m, MSG_OK, "verify: WRITE");
    }
    pt->verified = true;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void timed_posts(mc_kv_backend_t *b, mc_kv_xfer_t *x, point_t *pt)
{
    double *lat = malloc(pt->iters * sizeof(*lat)), sum = 0;

    if (!lat)
        fail("out of memory");
    for (uint64_t i = 0; i < pt->iters; i++) {
        check(b, post_wait(b, x, &lat[i]), "transfer");
        sum += lat[i];
    }
    qsort(lat, pt->iters, sizeof(*lat), cmp_double);
    pt->avg_us = sum / (double)pt->iters;
    pt->p99_us = lat[(99 * pt->iters + 99) / 100 - 1]; /* nearest rank: ceil(0.99 K) */
    pt->min_us = lat[0];
    free(lat);
}

/* Whole cycles on the same descriptors, as a host that prepares every transfer it posts: prepare,
 * post, poll to the end, release; their average time in pt->cycle_us (as post_us_avg). */
static void timed_cycles(mc_kv_backend_t *b, const char *agent, point_t *pt, side_state_t *s)
{
    double us, t0 = now_us();
    mc_kv_xfer_t *x;

    for (uint64_t i = 0; i < pt->iters; i++) {
        check(b, P->prep_xfer(b, pt->op, s->ld, s->rd, pt->n, agent, &x), "prep_xfer");
        check(b, post_wait(b, x, &us), "transfer");
        check(b, P->release_xfer(b, x), "release_xfer");
    }
    pt->cycle_us = (now_us() - t0) / (double)pt->iters;
}

static void release_point(mc_kv_backend_t *b, side_state_t *s, uint64_t len)
{
    check(b, P->unload_md(b, s->rmd), "unload_md");
    check(b, P->deregister_mem(b, s->lmd), "deregister_mem");
    munmap(s->buf, len);
    free(s->l);
    free(s->r);
    free(s->ld);
    free(s->rd);
}

static void run_point(mc_kv_backend_t *b, const char *agent, point_t *pt, uint64_t seed)
{
    uint64_t len = pt->bs * pt->n;
    side_state_t s = {0};
    mc_kv_xfer_t *x;
    double t0, us;

    remote_region(b, agent, len, seed ^ SALT_REMOTE, &s);
    s.buf = map_buffer(len);
    pattern_fill(s.buf, len, seed ^ SALT_LOCAL);
    s.lmd = register_region(b, s.buf, len);
    build_descs(pt, &s, seed);
    t0 = now_us();
    check(b, P->prep_xfer(b, pt->op, s.ld, s.rd, pt->n, agent, &x), "prep_xfer");
    pt->prep_us = now_us() - t0;
    check(b, post_wait(b, x, &us), "first transfer");
    if (opt.verify)
        verify_point(pt, &s, seed);
    timed_posts(b, x, pt);
    check(b, P->release_xfer(b, x), "release_xfer");
    timed_cycles(b, agent, pt, &s);
    release_point(b, &s, len);
}

static const char *op_name(mc_kv_op_t op)
{
    return op == MC_KV_READ ? "read" : "write";
}

static void print_point(const point_t *pt, bool header)
{
    double bytes = (double)pt->bs * (double)pt->n;
    double gbps = bytes / pt->avg_us / 1e3, dps = (double)pt->n / pt->avg_us * 1e6;
    double dps_prep = (double)pt->n / (pt->prep_us + pt->avg_us) * 1e6;
    double dps_cycle = (double)pt->n / pt->cycle_us * 1e6;

    if (opt.json) {
        printf("{\"block_size\":%" PRIu64 ",\"num_descs\":%" PRIu64 ",\"op\":\"%s\","
               "\"protocol\":\"%s\",\"iters\":%" PRIu64 ",\"gbps\":%.4f,\"descs_per_sec\":%.0f,"
               "\"descs_per_sec_incl_prep\":%.0f,\"descs_per_sec_cycle\":%.0f,\"prep_us\":%.1f,"
               "\"cycle_us\":%.1f,\"post_us_avg\":%.1f,\"post_us_p99\":%.1f,"
               "\"post_us_min\":%.1f,\"verified\":%s,\"remote\":\"%s\"}\n",
               pt->bs, pt->n, op_name(pt->op), opt.protocol, pt->iters, gbps, dps, dps_prep,
               dps_cycle, pt->prep_us, pt->cycle_us, pt->avg_us, pt->p99_us, pt->min_us,
               pt->verified ? "true" : "false", remote_is_file ? "file" : "memory");
    } else {
        if (header)
            printf("%-5s %-5s %10s %8s %6s %11s %12s %12s %9s %12s %12s %12s %6s\n", "op", "proto",
                   "block_size", "descs", "iters", "prep_us", "post_us_avg", "post_us_p99", "GB/s",
                   "descs/s", "+prep", "cycle", "verify");
        printf("%-5s %-5s %10" PRIu64 " %8" PRIu64 " %6" PRIu64
               " %11.1f %12.1f %12.1f %9.3f %12.0f %12.0f %12.0f %6s\n",
               op_name(pt->op), opt.protocol, pt->bs, pt->n, pt->iters, pt->prep_us, pt->avg_us,
               pt->p99_us, gbps, dps, dps_prep, dps_cycle, pt->verified ? "ok" : "off");
    }
    fflush(stdout);
}

/* Sweep points move about SWEEP_BYTES in their timed posts: at least 3, at most --iters. */
static uint64_t sweep_iters(uint64_t len)
{
    uint64_t k = SWEEP_BYTES / len;
    return k < 3 ? 3 : k > opt.iters ? opt.iters : k;
}

static void run_all(mc_kv_backend_t *b, const char *agent)
{
    mc_kv_op_t op = strcmp(opt.op, "read") ? MC_KV_WRITE : MC_KV_READ;
    point_t pt = {.op = op, .iters = opt.iters};
    uint64_t k = 0;

    if (opt.block_size || opt.num_descs) { /* one point; the other flag has a default */
        pt.bs = opt.block_size ? opt.block_size : 65536;
        pt.n = opt.num_descs ? opt.num_descs : 1024;
        run_point(b, agent, &pt, opt.seed);
        print_point(&pt, true);
        return;
    }
    for (uint64_t bs = 4096; bs <= (64ull << 20); bs *= 4) {
        for (uint64_t n = 1; n <= 32768 && n * bs <= SWEEP_CAP; n *= 8) {
            pt = (point_t){.op = op, .bs = bs, .n = n, .iters = sweep_iters(n * bs)};
            run_point(b, agent, &pt, opt.seed + k);
            print_point(&pt, k++ == 0);
        }
    }
}

/* Tell the peer we are done; a peer we started is then reaped. */
static void finish_peer(void)
{
    msg_t m;

    msg_init(&m, MSG_DONE);
    send_msg(&m);
    expect(&m, MSG_OK, "closing the peer");
    close(side);
    side = -1;
    if (child > 0) {
        int status = 0;
        for (int i = 0; i < 500 && waitpid(child, &status, WNOHANG) == 0; i++)
            usleep(10 * 1000);
        reap_child(); /* a no-op unless it hangs on its way out */
    }
}

static int initiator_main(void)
{
    char agent[MC_KV_AGENT_MAX], me[64];

    atexit(reap_child);
    if (opt.peer)
        side = tcp_connect(opt.peer);
    else
        spawn_peer();
    snprintf(me, sizeof(me), "kvbench-initiator-%d", (int)getpid());
    mc_kv_backend_t *b = make_instance(me);
    meet_peer(b, agent, sizeof(agent));
    run_all(b, agent);
    check(b, P->disconnect(b, agent), "disconnect");
    P->destroy(b);
    finish_peer();
    mc_kv_unload(loaded);
    return 0;
}

int main(int argc, char **argv)
{
    parse_args(argc, argv);
    signal(SIGPIPE, SIG_IGN);
    load_plugin();
    return opt.serve ? serve_main() : initiator_main();
}
