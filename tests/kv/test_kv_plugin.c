/*
 * The KV backend plugin as a host uses it: loaded by path through the loader (this program
 * links no Mooncake library), every operation, ABI negotiation, large and concurrent transfers,
 * notifications, and a peer process killed mid-transfer.
 *
 * Peers in other processes are this program re-executed with "--kv-peer FD PROTOCOL": it
 * creates an instance "peer", registers one region filled with a pattern, sends its connection
 * info and public data over the socket, then answers commands (check a range, wait for a
 * notification) until told to exit.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <dlfcn.h>

#include <mooncake/engine.h> /* (types only) */
#include <mooncake/kv_loader.h>

static const mc_kv_plugin_t *P;
static mc_kv_loaded_t *loaded;
static char plugin_path[4096];

/* ---- helpers ------------------------------------------------------------------------------ */

static int64_t now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void sleep_ms(int ms)
{
    nanosleep(&(struct timespec){.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L}, NULL);
}

/* Byte off of pattern seed. */
static uint8_t pat(uint64_t seed, uint64_t off)
{
    uint64_t x = (off >> 3) * 0x9e3779b97f4a7c15ull + seed * 0xbf58476d1ce4e5b9ull;

    x ^= x >> 31;
    return (uint8_t)(x >> (8 * (off & 7)));
}

static void fill(uint8_t *p, uint64_t len, uint64_t seed, uint64_t off)
{
    for (uint64_t i = 0; i < len; i++)
        p[i] = pat(seed, off + i);
}

/* -1 if p holds the pattern, else the first bad offset. */
static int64_t check(const uint8_t *p, uint64_t len, uint64_t seed, uint64_t off)
{
    for (uint64_t i = 0; i < len; i++)
        if (p[i] != pat(seed, off + i))
            return (int64_t)i;
    return -1;
}

/* An instance on loopback; extra: NULL, or further options up to a {NULL} one (at most 4). */
static mc_kv_backend_t *agent_create_with(const char *name, const char *protocol,
                                          const mc_kv_option_t *extra)
{
    mc_kv_option_t opts[7] = {{"LISTEN", "127.0.0.1:0", NULL},
                              {"PROTOCOL", protocol ? protocol : "auto", NULL},
                              {"LOG_LEVEL", "error", NULL}};
    mc_kv_init_t init = {.size = sizeof(init), .agent = name, .options = opts, .n_options = 3};
    mc_kv_backend_t *b = NULL;
    mc_kv_status_t st;

    for (; extra && extra->key && init.n_options < 7; extra++)
        opts[init.n_options++] = *extra;
    if ((st = P->create(&init, &b)))
        fail_msg("create %s: %s: %s", name, mc_kv_status_name(st), P->last_error(NULL));
    return b;
}

static mc_kv_backend_t *agent_create(const char *name, const char *protocol)
{
    return agent_create_with(name, protocol, NULL);
}

#define OK(b, call)                                                                                \
    do {                                                                                           \
        mc_kv_status_t st_ = (call);                                                               \
        if (st_ != MC_KV_SUCCESS)                                                                  \
            fail_msg("%s: %s: %s", #call, mc_kv_status_name(st_), P->last_error(b));               \
    } while (0)

/* Expect status want from call, and a message that contains word. */
#define EXPECT(b, want, word, call)                                                                \
    do {                                                                                           \
        mc_kv_status_t st_ = (call);                                                               \
        if (st_ != (want))                                                                         \
            fail_msg("%s: %s, expected %s (%s)", #call, mc_kv_status_name(st_),                    \
                     mc_kv_status_name(want), P->last_error(b));                                   \
        if (!strstr(P->last_error(b), (word)))                                                     \
            fail_msg("%s: message '%s' lacks '%s'", #call, P->last_error(b), (word));              \
    } while (0)

static mc_kv_md_t *reg(mc_kv_backend_t *b, void *p, size_t len)
{
    mc_kv_region_t r = {.addr = (uintptr_t)p, .len = len, .type = MC_KV_DRAM};
    mc_kv_md_t *md = NULL;

    OK(b, P->register_mem(b, &r, &md));
    return md;
}

/* Make b know agent `name` of instance peer, and load peer's region pmd into b. */
static void introduce(mc_kv_backend_t *b, mc_kv_backend_t *peer, const char *name)
{
    unsigned char info[MC_KV_CONN_MAX];
    size_t len = sizeof(info);

    OK(peer, P->conn_info(peer, info, &len));
    OK(b, P->load_remote_conn_info(b, name, info, len));
}

static mc_kv_md_t *load_region(mc_kv_backend_t *b, const char *name, mc_kv_backend_t *peer,
                               mc_kv_md_t *pmd)
{
    unsigned char data[MC_KV_PUBLIC_MAX];
    size_t len = sizeof(data);
    mc_kv_md_t *md = NULL;

    OK(peer, P->public_data(peer, pmd, data, &len));
    OK(b, P->load_remote_md(b, name, data, len, &md));
    return md;
}

/* Post and wait (30 s at most) for a final status. */
static mc_kv_status_t run(mc_kv_backend_t *b, mc_kv_xfer_t *x, const char *notif)
{
    mc_kv_status_t st = P->post_xfer(b, x, notif, notif ? strlen(notif) : 0);
    int64_t end = now_ms() + 30000;

    while (st == MC_KV_IN_PROG && now_ms() < end)
        st = P->check_xfer(b, x);
    return st;
}

/* Wait for one notification (timeout_ms); 1 if one came. */
static int wait_notif(mc_kv_backend_t *b, mc_kv_notif_t *n, int timeout_ms)
{
    int64_t end = now_ms() + timeout_ms;
    int rc;

    while ((rc = P->get_notif(b, n)) == 0 && now_ms() < end)
        sleep_ms(1);
    assert_true(rc >= 0);
    return rc;
}

/* count scattered descriptor pairs of blk bytes: block i of local at slot perm_l[i], of remote
 * at slot perm_r[i] (two independent permutations, so that no two neighbours are contiguous
 * on both sides). */
static void scatter(mc_kv_desc_t *l, mc_kv_desc_t *r, size_t count, size_t blk, uint8_t *lbase,
                    mc_kv_md_t *lmd, uint64_t rbase, mc_kv_md_t *rmd, unsigned seed)
{
    size_t *pl = malloc(count * sizeof(*pl)), *pr = malloc(count * sizeof(*pr));

    for (size_t i = 0; i < count; i++)
        pl[i] = pr[i] = i;
    srand(seed);
    for (size_t i = count - 1; i > 0; i--) {
        size_t j = (size_t)rand() % (i + 1), k = (size_t)rand() % (i + 1), t;

        t = pl[i], pl[i] = pl[j], pl[j] = t;
        t = pr[i], pr[i] = pr[k], pr[k] = t;
    }
    for (size_t i = 0; i < count; i++) {
        l[i] = (mc_kv_desc_t){(uintptr_t)(lbase + pl[i] * blk), blk, 0, lmd};
        r[i] = (mc_kv_desc_t){rbase + pr[i] * blk, blk, 0, rmd};
    }
    free(pl);
    free(pr);
}

/* ---- the peer process --------------------------------------------------------------------- */

#define PEER_SIZE (256u << 20)
#define PEER_SEED 77

enum { PEER_CHECK = 1, PEER_NOTIF, PEER_EXIT };

typedef struct peer_cmd {
    uint32_t op;
    uint64_t off, len, seed;
    int32_t timeout_ms;
} peer_cmd_t;

typedef struct peer_reply {
    int64_t rc;
    char agent[MC_KV_AGENT_MAX];
    char msg[256];
} peer_reply_t;

typedef struct peer {
    pid_t pid;
    int sock;
    unsigned char info[MC_KV_CONN_MAX], pub[MC_KV_PUBLIC_MAX];
    size_t info_len, pub_len;
} peer_t;

static int xfull(int fd, void *buf, size_t len, int writing)
{
    for (size_t done = 0; done < len;) {
        ssize_t n = writing ? write(fd, (char *)buf + done, len - done)
                            : read(fd, (char *)buf + done, len - done);
        if (n <= 0)
            return -1;
        done += (size_t)n;
    }
    return 0;
}

static void peer_answer(mc_kv_backend_t *b, int fd, uint8_t *mem, const peer_cmd_t *c)
{
    peer_reply_t rep = {.rc = -1};
    mc_kv_notif_t *n = malloc(sizeof(*n));

    if (c->op == PEER_CHECK) {
        rep.rc = c->off + c->len <= PEER_SIZE ? check(mem + c->off, c->len, c->seed, c->off) : -2;
    } else if (c->op == PEER_NOTIF) {
        int64_t end = now_ms() + c->timeout_ms;
        int rc;

        while ((rc = P->get_notif(b, n)) == 0 && now_ms() < end)
            sleep_ms(1);
        if (rc == 1) {
            rep.rc = (int64_t)n->len;
            snprintf(rep.agent, sizeof(rep.agent), "%s", n->agent);
            memcpy(rep.msg, n->msg, n->len < sizeof(rep.msg) - 1 ? n->len : sizeof(rep.msg) - 1);
            /* The data a notification announces is in place when it is delivered. */
            if (c->len && check(mem + c->off, c->len, c->seed, c->off) >= 0)
                rep.rc = -3;
        }
    }
    free(n);
    xfull(fd, &rep, sizeof(rep), 1);
}

static int peer_main(int fd, const char *protocol)
{
    uint8_t *mem = aligned_alloc(4096, PEER_SIZE);
    unsigned char info[MC_KV_CONN_MAX], pub[MC_KV_PUBLIC_MAX];
    size_t info_len = sizeof(info), pub_len = sizeof(pub);
    mc_kv_backend_t *b = agent_create("peer", protocol);
    mc_kv_md_t *md;
    peer_cmd_t c;

    fill(mem, PEER_SIZE, PEER_SEED, 0);
    md = reg(b, mem, PEER_SIZE);
    if (P->conn_info(b, info, &info_len) || P->public_data(b, md, pub, &pub_len))
        return 1;
    if (xfull(fd, &info_len, sizeof(info_len), 1) || xfull(fd, info, info_len, 1) ||
        xfull(fd, &pub_len, sizeof(pub_len), 1) || xfull(fd, pub, pub_len, 1))
        return 1;
    while (!xfull(fd, &c, sizeof(c), 0) && c.op != PEER_EXIT)
        peer_answer(b, fd, mem, &c);
    P->deregister_mem(b, md);
    P->destroy(b);
    free(mem);
    return 0;
}

static void peer_spawn(peer_t *p, const char *protocol)
{
    int sv[2];
    char fdstr[16];

    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    p->pid = fork();
    assert_true(p->pid >= 0);
    if (!p->pid) {
        int fd = dup(sv[1]); /* without CLOEXEC */

        snprintf(fdstr, sizeof(fdstr), "%d", fd);
        execl("/proc/self/exe", "test_kv_plugin", "--kv-peer", fdstr, protocol, (char *)NULL);
        _exit(127);
    }
    close(sv[1]);
    p->sock = sv[0];
    assert_int_equal(xfull(p->sock, &p->info_len, sizeof(size_t), 0), 0);
    assert_true(p->info_len <= sizeof(p->info));
    assert_int_equal(xfull(p->sock, p->info, p->info_len, 0), 0);
    assert_int_equal(xfull(p->sock, &p->pub_len, sizeof(size_t), 0), 0);
    assert_true(p->pub_len <= sizeof(p->pub));
    assert_int_equal(xfull(p->sock, p->pub, p->pub_len, 0), 0);
}

static peer_reply_t peer_cmd(peer_t *p, uint32_t op, uint64_t off, uint64_t len, uint64_t seed,
                             int timeout_ms)
{
    peer_cmd_t c = {op, off, len, seed, timeout_ms};
    peer_reply_t rep;

    assert_int_equal(xfull(p->sock, &c, sizeof(c), 1), 0);
    assert_int_equal(xfull(p->sock, &rep, sizeof(rep), 0), 0);
    return rep;
}

static void peer_stop(peer_t *p)
{
    int status;

    if (!p->pid)
        return;
    peer_cmd_t c = {.op = PEER_EXIT};
    xfull(p->sock, &c, sizeof(c), 1);
    for (int i = 0; i < 500 && waitpid(p->pid, &status, WNOHANG) == 0; i++)
        sleep_ms(10);
    kill(p->pid, SIGKILL);
    waitpid(p->pid, &status, 0);
    close(p->sock);
    p->pid = 0;
}

/* ---- ABI and loading ---------------------------------------------------------------------- */

static void test_load_and_symbols(void **state)
{
    mc_kv_loaded_t *l = NULL;
    char err[512];

    (void)state;
    assert_string_equal(P->name, "mooncake");
    assert_int_equal(P->abi_major, MC_KV_ABI_MAJOR);
    assert_true(P->size >= sizeof(mc_kv_plugin_t));
    assert_true(P->mem_types & (1u << MC_KV_DRAM));
    assert_true(P->n_options > 10);
    for (size_t i = 0; i < P->n_options; i++)
        assert_non_null(P->options[i].value);
    /* By name from MC_PLUGIN_DIR. */
    char dir[4096];
    snprintf(dir, sizeof(dir), "%s", plugin_path);
    *strrchr(dir, '/') = 0;
    setenv("MC_PLUGIN_DIR", dir, 1);
    assert_int_equal(mc_kv_load("mooncake_kv", MC_KV_ABI_CURRENT, &l, err, sizeof(err)), 0);
    assert_ptr_equal(l->plugin, P); /* the same file: dlopen gives the same table */
    mc_kv_unload(l);
    assert_int_equal(mc_kv_load("no_such_plugin", MC_KV_ABI_CURRENT, &l, err, sizeof(err)),
                     -ENOENT);
    assert_non_null(strstr(err, "libno_such_plugin.so: not found in MC_PLUGIN_DIR"));
    assert_int_equal(mc_kv_load("/nonexistent/libx.so", MC_KV_ABI_CURRENT, &l, err, sizeof(err)),
                     -ENOENT);
    assert_non_null(strstr(err, "/nonexistent/libx.so"));
    unsetenv("MC_PLUGIN_DIR");
}

static void test_abi_negotiation(void **state)
{
    mc_kv_plugin_init_fn init;
    char why[256];
    mc_kv_loaded_t *l = NULL;
    char err[512];

    (void)state;
    *(void **)&init = dlsym(loaded->dl, MC_KV_PLUGIN_INIT_SYMBOL);
    assert_non_null(init);
    /* A host of this major and an older or equal minor is served. */
    assert_ptr_equal(init(MC_KV_ABI_VERSION(MC_KV_ABI_MAJOR, 0), why, sizeof(why)), P);
    /* A newer minor is refused, with the reason. */
    assert_null(init(MC_KV_ABI_VERSION(MC_KV_ABI_MAJOR, MC_KV_ABI_MINOR + 1), why, sizeof(why)));
    assert_non_null(strstr(why, "the host is newer"));
    assert_int_equal(mc_kv_load(plugin_path,
                                MC_KV_ABI_VERSION(MC_KV_ABI_MAJOR, MC_KV_ABI_MINOR + 1), &l, err,
                                sizeof(err)),
                     -EPROTO);
    assert_non_null(strstr(err, plugin_path));
    assert_non_null(strstr(err, "refused this host"));
    /* Another major, either way. */
    assert_null(init(MC_KV_ABI_VERSION(MC_KV_ABI_MAJOR + 1, 0), why, sizeof(why)));
    assert_non_null(strstr(why, "another major"));
    assert_null(init(MC_KV_ABI_VERSION(MC_KV_ABI_MAJOR - 1, 9), why, sizeof(why)));
}

/* Plugins built for this test (kv_fixture_plugin.c): a newer minor with a bigger table (an
 * older host loads it), another major (the host refuses it), no entry point at all. */
static void test_host_checks(void **state)
{
    const char *dir = getenv("MC_KV_FIXTURES");
    mc_kv_loaded_t *l = NULL;
    char path[4096], err[512];

    (void)state;
    assert_non_null(dir);
    snprintf(path, sizeof(path), "%s/libkv_fixture_newer.so", dir);
    assert_int_equal(mc_kv_load(path, MC_KV_ABI_CURRENT, &l, err, sizeof(err)), 0);
    assert_int_equal(l->plugin->abi_minor, MC_KV_ABI_MINOR + 3);
    assert_true(l->plugin->size > sizeof(mc_kv_plugin_t));
    mc_kv_unload(l);
    snprintf(path, sizeof(path), "%s/libkv_fixture_major.so", dir);
    assert_int_equal(mc_kv_load(path, MC_KV_ABI_CURRENT, &l, err, sizeof(err)), -EPROTO);
    assert_non_null(strstr(err, "plugin ABI 2.0, this host speaks major 1"));
    assert_non_null(strstr(err, "libkv_fixture_major.so"));
    snprintf(path, sizeof(path), "%s/libkv_fixture_nosym.so", dir);
    assert_int_equal(mc_kv_load(path, MC_KV_ABI_CURRENT, &l, err, sizeof(err)), -ENOEXEC);
    assert_non_null(strstr(err, "not a KV plugin: no symbol mc_kv_plugin_init"));
    /* A file that is no shared object. */
    assert_int_equal(mc_kv_load("/proc/self/status", MC_KV_ABI_CURRENT, &l, err, sizeof(err)),
                     -ENOEXEC);
    assert_non_null(strstr(err, "cannot be loaded"));
}

static void test_bad_options(void **state)
{
    mc_kv_option_t bad_key[] = {{"NO_SUCH_SETTING", "1", NULL}};
    mc_kv_option_t bad_val[] = {{"slice_size", "lots", NULL}};
    mc_kv_init_t init = {.size = sizeof(init), .agent = "a", .options = bad_key, .n_options = 1};
    mc_kv_backend_t *b = NULL;

    (void)state;
    assert_int_equal(P->create(&init, &b), MC_KV_ERR_INVALID_PARAM);
    assert_non_null(strstr(P->last_error(NULL), "unknown option 'NO_SUCH_SETTING'"));
    init.options = bad_val;
    assert_int_equal(P->create(&init, &b), MC_KV_ERR_INVALID_PARAM);
    assert_non_null(strstr(P->last_error(NULL), "slice_size=lots"));
    init.agent = "";
    init.n_options = 0;
    assert_int_equal(P->create(&init, &b), MC_KV_ERR_INVALID_PARAM);
    assert_non_null(strstr(P->last_error(NULL), "agent name"));
    init = (mc_kv_init_t){.size = 8, .agent = "a"};
    assert_int_equal(P->create(&init, &b), MC_KV_ERR_INVALID_PARAM);
    assert_null(b);
}

/* ---- operations in one process ------------------------------------------------------------ */

#define SZ (4u << 20)

typedef struct pair {
    mc_kv_backend_t *a, *b;
    uint8_t *ma, *mb;
    mc_kv_md_t *mda, *mdb, *rb; /* rb: b's region as a knows it */
} pair_t;

static void pair_up(pair_t *p, const char *protocol)
{
    p->a = agent_create("A", protocol);
    p->b = agent_create("B", protocol);
    p->ma = aligned_alloc(4096, SZ);
    p->mb = aligned_alloc(4096, SZ);
    fill(p->ma, SZ, 1, 0);
    fill(p->mb, SZ, 2, 0);
    p->mda = reg(p->a, p->ma, SZ);
    p->mdb = reg(p->b, p->mb, SZ);
    introduce(p->a, p->b, "B");
    introduce(p->b, p->a, "A");
    p->rb = load_region(p->a, "B", p->b, p->mdb);
}

static void pair_down(pair_t *p)
{
    OK(p->a, P->unload_md(p->a, p->rb));
    OK(p->a, P->disconnect(p->a, "B"));
    OK(p->b, P->disconnect(p->b, "A"));
    OK(p->a, P->deregister_mem(p->a, p->mda));
    OK(p->b, P->deregister_mem(p->b, p->mdb));
    P->destroy(p->a);
    P->destroy(p->b);
    free(p->ma);
    free(p->mb);
}

static void test_every_operation(void **state)
{
    unsigned char buf[MC_KV_PUBLIC_MAX];
    size_t len = 4;
    mc_kv_caps_t caps;
    mc_kv_xfer_t *x = NULL;
    mc_kv_md_t *md = NULL, *self = NULL;
    pair_t p;

    (void)state;
    pair_up(&p, NULL);
    OK(p.a, P->caps(p.a, &caps));
    assert_true(caps.supports_remote && caps.supports_local && caps.supports_notif);
    assert_true(caps.mem_types & (1u << MC_KV_DRAM));
    /* Sizes: too small a buffer says how much is needed. */
    EXPECT(p.a, MC_KV_ERR_INVALID_PARAM, "bytes needed", P->public_data(p.a, p.mda, buf, &len));
    assert_true(len > 4 && len <= MC_KV_PUBLIC_MAX);
    len = 4;
    EXPECT(p.a, MC_KV_ERR_INVALID_PARAM, "bytes needed", P->conn_info(p.a, buf, &len));
    assert_true(len > 4 && len <= MC_KV_CONN_MAX);
    /* Registration: empty region, unsupported type. */
    mc_kv_region_t r = {.addr = (uintptr_t)p.ma, .len = 0};
    EXPECT(p.a, MC_KV_ERR_INVALID_PARAM, "empty region", P->register_mem(p.a, &r, &md));
    r = (mc_kv_region_t){.addr = (uintptr_t)p.ma, .len = 4096, .type = MC_KV_OBJ};
    EXPECT(p.a, MC_KV_ERR_NOT_SUPPORTED, "memory type 3", P->register_mem(p.a, &r, &md));
    /* Connection info: of another agent, loaded twice, other info for a loaded agent. */
    len = sizeof(buf);
    OK(p.b, P->conn_info(p.b, buf, &len));
    EXPECT(p.a, MC_KV_ERR_MISMATCH, "not 'C''s", P->load_remote_conn_info(p.a, "C", buf, len));
    OK(p.a, P->load_remote_conn_info(p.a, "B", buf, len));
    size_t alen = sizeof(buf);
    unsigned char ainfo[MC_KV_CONN_MAX];
    OK(p.a, P->conn_info(p.a, ainfo, &alen));
    EXPECT(p.a, MC_KV_ERR_INVALID_PARAM, "not a Mooncake agent's",
           P->load_remote_conn_info(p.a, "B", "garbage", 7));
    OK(p.a, P->connect(p.a, "B"));
    EXPECT(p.a, MC_KV_ERR_NOT_FOUND, "'Z' is not loaded", P->connect(p.a, "Z"));
    /* Public data: unknown agent, garbage. */
    len = sizeof(buf);
    OK(p.b, P->public_data(p.b, p.mdb, buf, &len));
    EXPECT(p.a, MC_KV_ERR_NOT_FOUND, "agent 'Z' is not loaded",
           P->load_remote_md(p.a, "Z", buf, len, &md));
    EXPECT(p.a, MC_KV_ERR_INVALID_PARAM, "not a Mooncake region",
           P->load_remote_md(p.a, "B", buf, len - 1, &md));
    /* A's own region's public data loaded as if it were B's: another instance. */
    len = sizeof(buf);
    OK(p.a, P->public_data(p.a, p.mda, buf, &len));
    EXPECT(p.a, MC_KV_ERR_MISMATCH, "another instance", P->load_remote_md(p.a, "B", buf, len, &md));
    /* Transfers: lengths differ, outside the region, region of another agent, no agent. */
    mc_kv_desc_t l = {(uintptr_t)p.ma, 4096, 0, p.mda}, rd = {(uintptr_t)p.mb, 8192, 0, p.rb};
    EXPECT(p.a, MC_KV_ERR_INVALID_PARAM, "local length 4096, remote length 8192",
           P->prep_xfer(p.a, MC_KV_WRITE, &l, &rd, 1, "B", &x));
    rd = (mc_kv_desc_t){(uintptr_t)p.mb + SZ - 100, 4096, 0, p.rb};
    EXPECT(p.a, MC_KV_ERR_INVALID_PARAM, "is not inside its region",
           P->prep_xfer(p.a, MC_KV_WRITE, &l, &rd, 1, "B", &x));
    l.addr = (uintptr_t)p.ma + SZ - 1;
    rd.addr = (uintptr_t)p.mb;
    EXPECT(p.a, MC_KV_ERR_INVALID_PARAM, "local descriptor 0",
           P->prep_xfer(p.a, MC_KV_WRITE, &l, &rd, 1, "B", &x));
    l.addr = (uintptr_t)p.ma;
    EXPECT(p.a, MC_KV_ERR_NOT_FOUND, "'Q' is not loaded",
           P->prep_xfer(p.a, MC_KV_WRITE, &l, &rd, 1, "Q", &x));
    /* Prepared, not posted. */
    OK(p.a, P->prep_xfer(p.a, MC_KV_WRITE, &l, &rd, 1, "B", &x));
    EXPECT(p.a, MC_KV_ERR_NOT_POSTED, "not posted", P->check_xfer(p.a, x));
    /* Busy handles refuse to go. */
    EXPECT(p.a, MC_KV_ERR_NOT_ALLOWED, "release them first", P->unload_md(p.a, p.rb));
    EXPECT(p.a, MC_KV_ERR_NOT_ALLOWED, "release or unload", P->deregister_mem(p.a, p.mda));
    EXPECT(p.a, MC_KV_ERR_NOT_ALLOWED, "unload them first", P->disconnect(p.a, "B"));
    assert_int_equal(run(p.a, x, NULL), MC_KV_SUCCESS);
    assert_int_equal(check(p.mb, 4096, 1, 0), -1);
    OK(p.a, P->release_xfer(p.a, x));
    /* Loopback: A to itself through load_local_md. */
    OK(p.a, P->load_local_md(p.a, p.mda, &self));
    l = (mc_kv_desc_t){(uintptr_t)p.ma + SZ / 2, SZ / 4, 0, p.mda};
    rd = (mc_kv_desc_t){(uintptr_t)p.ma, SZ / 4, 0, self};
    OK(p.a, P->prep_xfer(p.a, MC_KV_READ, &l, &rd, 1, "A", &x));
    assert_int_equal(run(p.a, x, NULL), MC_KV_SUCCESS);
    assert_int_equal(check(p.ma + SZ / 2, SZ / 4, 1, 0), -1);
    OK(p.a, P->release_xfer(p.a, x));
    EXPECT(p.a, MC_KV_ERR_NOT_ALLOWED, "loopback", P->deregister_mem(p.a, p.mda));
    OK(p.a, P->unload_md(p.a, self));
    OK(p.a, P->disconnect(p.a, "A"));
    pair_down(&p);
}

/* Connection info whose agent name does not fit (or holds a NUL) is refused, not copied. */
static void test_bad_conn_info(void **state)
{
    unsigned char info[MC_KV_CONN_MAX], bad[MC_KV_CONN_MAX];
    size_t len = sizeof(info);
    pair_t p;

    (void)state;
    pair_up(&p, NULL);
    OK(p.b, P->conn_info(p.b, info, &len));
    memcpy(bad, info, 5); /* magic and version, a 200-byte name, a 47-byte address, "z" */
    bad[5] = 200;
    memset(bad + 6, 'x', 200);
    bad[206] = 47;
    memset(bad + 207, 'y', 47);
    bad[254] = 1;
    bad[255] = 'z';
    EXPECT(p.a, MC_KV_ERR_INVALID_PARAM, "agent name of 200 bytes",
           P->load_remote_conn_info(p.a, "B", bad, sizeof(bad)));
    memcpy(bad, info, len); /* B's own, its name "B" made "\0": empty after all */
    bad[6] = 0;
    EXPECT(p.a, MC_KV_ERR_INVALID_PARAM, "no NUL", P->load_remote_conn_info(p.a, "", bad, len));
    memcpy(bad, info, len); /* B's address bytes garbled, for an agent that knows no B yet */
    memset(bad + 8, 0xee, bad[7]);
    mc_kv_backend_t *c = agent_create("C", NULL);
    EXPECT(c, MC_KV_ERR_INVALID_PARAM, "not an engine address",
           P->load_remote_conn_info(c, "B", bad, len));
    char long_name[200];
    memset(long_name, 'x', sizeof(long_name) - 1);
    long_name[sizeof(long_name) - 1] = 0;
    EXPECT(c, MC_KV_ERR_INVALID_PARAM, "at most 127 characters",
           P->load_remote_conn_info(c, long_name, info, len));
    P->destroy(c);
    memcpy(bad, info, len); /* an agent of version 2: its notifications carry no marker */
    bad[4] = 2;
    EXPECT(p.a, MC_KV_ERR_MISMATCH, "of version 2", P->load_remote_conn_info(p.a, "B2", bad, len));
    pair_down(&p);
}

/* A transfer of empty descriptors holds no region, yet names its agent: the agent cannot be
 * disconnected until the transfer is released (its post still sends the notification). What
 * was sent to the agent before a disconnect reaches it: the post's notification and one of
 * gen_notif just before (a close used to cancel the messages the agent had not taken yet). */
static void test_empty_transfer_keeps_agent(void **state)
{
    mc_kv_notif_t *n = malloc(sizeof(*n));
    mc_kv_desc_t l, rd;
    mc_kv_xfer_t *x = NULL;
    pair_t p;

    (void)state;
    pair_up(&p, NULL);
    l = (mc_kv_desc_t){(uintptr_t)p.ma, 0, 0, p.mda};
    rd = (mc_kv_desc_t){(uintptr_t)p.mb, 0, 0, p.rb};
    OK(p.a, P->prep_xfer(p.a, MC_KV_WRITE, &l, &rd, 1, "B", &x));
    OK(p.a, P->unload_md(p.a, p.rb));
    EXPECT(p.a, MC_KV_ERR_NOT_ALLOWED, "transfers to agent 'B' are prepared",
           P->disconnect(p.a, "B"));
    assert_int_equal(run(p.a, x, "empty"), MC_KV_SUCCESS);
    OK(p.a, P->release_xfer(p.a, x));
    OK(p.a, P->gen_notif(p.a, "B", "bye", 3));
    OK(p.a, P->disconnect(p.a, "B"));
    assert_int_equal(wait_notif(p.b, n, 5000), 1);
    assert_int_equal(n->len, 5);
    assert_memory_equal(n->msg, "empty", 5);
    assert_int_equal(wait_notif(p.b, n, 5000), 1);
    assert_int_equal(n->len, 3);
    assert_memory_equal(n->msg, "bye", 3);
    free(n);
    introduce(p.a, p.b, "B"); /* as pair_down expects */
    p.rb = load_region(p.a, "B", p.b, p.mdb);
    pair_down(&p);
}

/* Destroy frees what the host did not: regions still registered, remote regions and loopback
 * views still loaded, agents still known, a transfer still prepared (LeakSanitizer, in the
 * ASan build, finds none of them left). */
static void test_destroy_with_handles(void **state)
{
    mc_kv_region_t half = {.addr = 0, .len = SZ / 2, .type = MC_KV_DRAM};
    mc_kv_md_t *h = NULL, *self = NULL;
    mc_kv_desc_t l, rd;
    mc_kv_xfer_t *x = NULL;
    pair_t p;

    (void)state;
    pair_up(&p, NULL);
    half.addr = (uintptr_t)p.ma + SZ / 2;
    OK(p.a, P->register_mem(p.a, &half, &h));
    OK(p.a, P->load_local_md(p.a, p.mda, &self));
    l = (mc_kv_desc_t){(uintptr_t)p.ma + SZ / 2, 4096, 0, h};
    rd = (mc_kv_desc_t){(uintptr_t)p.mb, 4096, 0, p.rb};
    OK(p.a, P->prep_xfer(p.a, MC_KV_READ, &l, &rd, 1, "B", &x));
    assert_int_equal(run(p.a, x, NULL), MC_KV_SUCCESS);
    assert_int_equal(check(p.ma + SZ / 2, 4096, 2, 0), -1);
    P->destroy(p.a);
    P->destroy(p.b);
    free(p.ma);
    free(p.mb);
}

/* A transfer of more than MC_KV_XFER_MAX descriptor pairs is refused at prepare, saying so
 * (the lists, 2 GiB each, are mapped without memory behind them: the plugin must not read
 * them). */
static void test_xfer_limit(void **state)
{
    size_t n = (size_t)MC_KV_XFER_MAX + 1, bytes = n * sizeof(mc_kv_desc_t);
    mc_kv_desc_t *l, *rd;
    mc_kv_xfer_t *x = NULL;
    pair_t p;

    (void)state;
    l = mmap(NULL, bytes, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    rd = mmap(NULL, bytes, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    assert_true(l != MAP_FAILED && rd != MAP_FAILED);
    pair_up(&p, NULL);
    EXPECT(p.a, MC_KV_ERR_INVALID_PARAM, "at most 67108864 (MC_KV_XFER_MAX)",
           P->prep_xfer(p.a, MC_KV_READ, l, rd, n, "B", &x));
    assert_null(x);
    pair_down(&p); /* nothing holds B's region or the agent */
    munmap(l, bytes);
    munmap(rd, bytes);
}

/* Scattered blocks both ways, merged runs too, with a notification that arrives after the
 * data. */
static void transfer_case(const char *protocol, size_t count, size_t blk)
{
    mc_kv_desc_t *l = malloc(count * sizeof(*l)), *r = malloc(count * sizeof(*r));
    mc_kv_xfer_t *x;
    mc_kv_notif_t *n = malloc(sizeof(*n));
    pair_t p;

    assert_true(count * blk <= SZ / 2);
    pair_up(&p, protocol);
    /* WRITE A's first half, scattered, into B's second half. */
    scatter(l, r, count, blk, p.ma, p.mda, (uintptr_t)p.mb + SZ / 2, p.rb, 1);
    OK(p.a, P->prep_xfer(p.a, MC_KV_WRITE, l, r, count, "B", &x));
    assert_int_equal(run(p.a, x, "layer-0"), MC_KV_SUCCESS);
    assert_int_equal(wait_notif(p.b, n, 10000), 1);
    assert_string_equal(n->agent, "A");
    assert_int_equal(n->len, 7);
    assert_memory_equal(n->msg, "layer-0", 7);
    for (size_t i = 0; i < count; i++) {
        uint64_t lo = l[i].addr - (uintptr_t)p.ma;

        if (check((uint8_t *)(uintptr_t)r[i].addr, blk, 1, lo) >= 0)
            fail_msg("block %zu of %zu wrong after WRITE", i, count);
    }
    OK(p.a, P->release_xfer(p.a, x));
    /* READ them back into A's second half, by the same permutation. */
    for (size_t i = 0; i < count; i++)
        l[i].addr += SZ / 2;
    memset(p.ma + SZ / 2, 0, SZ / 2);
    OK(p.a, P->prep_xfer(p.a, MC_KV_READ, l, r, count, "B", &x));
    assert_int_equal(run(p.a, x, NULL), MC_KV_SUCCESS);
    for (size_t i = 0; i < count; i++) {
        uint64_t lo = l[i].addr - SZ / 2 - (uintptr_t)p.ma;

        if (check((uint8_t *)(uintptr_t)l[i].addr, blk, 1, lo) >= 0)
            fail_msg("block %zu of %zu wrong after READ", i, count);
    }
    OK(p.a, P->release_xfer(p.a, x));
    assert_int_equal(P->get_notif(p.b, n), 0); /* exactly once */
    pair_down(&p);
    free(n);
    free(l);
    free(r);
}

static void test_transfer_shm(void **state)
{
    (void)state;
    transfer_case("auto", 256, 4096);
}

static void test_transfer_tcp(void **state)
{
    (void)state;
    transfer_case("tcp", 256, 4096);
}

/* 100 000 descriptors of 16 bytes, none contiguous on both sides with its neighbour. */
static void test_100k_descriptors(void **state)
{
    (void)state;
    transfer_case("auto", 100000, 16);
    transfer_case("tcp", 100000, 16);
}

/* Contiguous descriptors become one request: a transfer of 4096 adjacent 16-byte pieces
 * moves as fast as one piece (checked by its outcome: the bytes), and a run that crosses from
 * one region into another is not merged across. */
static void test_merging(void **state)
{
    enum { N = 4096, B = 16 };
    mc_kv_desc_t *l = malloc(2 * N * sizeof(*l)), *r = malloc(2 * N * sizeof(*r));
    mc_kv_region_t half = {.addr = 0, .len = N * B, .type = MC_KV_DRAM};
    mc_kv_md_t *h1, *h2;
    mc_kv_xfer_t *x;
    pair_t p;

    (void)state;
    pair_up(&p, NULL);
    /* Two more regions of A's memory, adjacent: [ma+SZ/2, +N*B) and [ma+SZ/2+N*B, +N*B). */
    half.addr = (uintptr_t)p.ma + SZ / 2;
    OK(p.a, P->register_mem(p.a, &half, &h1));
    half.addr += N * B;
    OK(p.a, P->register_mem(p.a, &half, &h2));
    for (size_t i = 0; i < 2 * N; i++) {
        l[i] = (mc_kv_desc_t){(uintptr_t)p.ma + SZ / 2 + i * B, B, 0, i < N ? h1 : h2};
        r[i] = (mc_kv_desc_t){(uintptr_t)p.mb + i * B, B, 0, p.rb};
    }
    OK(p.a, P->prep_xfer(p.a, MC_KV_READ, l, r, 2 * N, "B", &x));
    assert_int_equal(run(p.a, x, NULL), MC_KV_SUCCESS);
    assert_int_equal(check(p.ma + SZ / 2, 2 * N * B, 2, 0), -1);
    OK(p.a, P->release_xfer(p.a, x));
    OK(p.a, P->deregister_mem(p.a, h1));
    OK(p.a, P->deregister_mem(p.a, h2));
    pair_down(&p);
    free(l);
    free(r);
}

/* ---- FILE regions ------------------------------------------------------------------------- */

#define FILE_SZ   (2u << 20) /* the file; its region starts at FILE_OFF */
#define FILE_OFF  (64u << 10)
#define FILE_SEED 5

/* A temporary file of FILE_SZ bytes of pattern FILE_SEED, unlinked at once (its descriptor
 * keeps it); opened with flags. */
static int file_make(int flags)
{
    char path[] = "/tmp/mc-kv-file-XXXXXX";
    int fd = mkstemp(path);
    uint8_t *buf = malloc(FILE_SZ);

    assert_true(fd >= 0 && buf);
    fill(buf, FILE_SZ, FILE_SEED, 0);
    assert_int_equal(pwrite(fd, buf, FILE_SZ, 0), FILE_SZ);
    if (flags != O_RDWR) { /* the same file again, opened as asked */
        int fd2 = open(path, flags | O_CLOEXEC);
        assert_true(fd2 >= 0);
        close(fd);
        fd = fd2;
    }
    unlink(path);
    free(buf);
    return fd;
}

static mc_kv_md_t *reg_file(mc_kv_backend_t *b, int fd, uint64_t off, uint64_t len)
{
    mc_kv_region_t r = {.addr = off, .len = len, .dev_id = (uint64_t)fd, .type = MC_KV_FILE};
    mc_kv_md_t *md = NULL;

    OK(b, P->register_mem(b, &r, &md));
    return md;
}

/* -1 if the file holds pattern seed (of offset off + i at off + i) in [off, off + len). */
static int64_t file_check(int fd, uint64_t off, uint64_t len, uint64_t seed, uint64_t pat_off)
{
    uint8_t *buf = malloc(len);
    int64_t bad;

    assert_int_equal(pread(fd, buf, len, (off_t)off), (ssize_t)len);
    bad = check(buf, len, seed, pat_off);
    free(buf);
    return bad;
}

/* Prepare, run to SUCCESS and release a transfer of n pairs. */
static void move_ok(mc_kv_backend_t *b, mc_kv_op_t op, const mc_kv_desc_t *l, const mc_kv_desc_t *r,
                    size_t n, const char *agent, const char *notif)
{
    mc_kv_xfer_t *x;

    OK(b, P->prep_xfer(b, op, l, r, n, agent, &x));
    assert_int_equal(run(b, x, notif), MC_KV_SUCCESS);
    OK(b, P->release_xfer(b, x));
}

/* NIXL's FILE_SEG: a file descriptor as dev_id, offsets in the file as addresses. Blocks move
 * between memory and a file of the instance itself (the loopback view), a file of another
 * agent, and a local file and another agent's memory, scattered both ways; a read-only
 * descriptor takes READs only; bad regions are refused. */
static void file_case(const char *protocol)
{
    enum { N = 64, BLK = 4096 };
    mc_kv_desc_t l[N], r[N];
    mc_kv_md_t *fa, *self, *fb, *md = NULL;
    mc_kv_xfer_t *x;
    int fd = file_make(O_RDWR), ro = file_make(O_RDONLY);
    pair_t p;

    pair_up(&p, protocol);
    /* The region [FILE_OFF, end of file): len 0 is "to the end". */
    fa = reg_file(p.a, fd, FILE_OFF, 0);
    OK(p.a, P->load_local_md(p.a, fa, &self));
    /* READ from A's own file into A's memory: file offsets FILE_OFF + k * BLK, scattered. */
    scatter(l, r, N, BLK, p.ma, p.mda, FILE_OFF, self, 3);
    move_ok(p.a, MC_KV_READ, l, r, N, "A", NULL);
    for (size_t i = 0; i < N; i++)
        if (check((uint8_t *)(uintptr_t)l[i].addr, BLK, FILE_SEED, r[i].addr) >= 0)
            fail_msg("block %zu wrong after a READ from the file", i);
    /* WRITE A's memory (pattern 1) into its file, up to the file's last byte. */
    scatter(l, r, N, BLK, p.ma, p.mda, FILE_SZ - N * BLK, self, 4);
    fill(p.ma, N * BLK, 1, 0);
    move_ok(p.a, MC_KV_WRITE, l, r, N, "A", NULL);
    for (size_t i = 0; i < N; i++)
        if (file_check(fd, r[i].addr, BLK, 1, l[i].addr - (uintptr_t)p.ma) >= 0)
            fail_msg("block %zu wrong in the file after a WRITE", i);
    assert_int_equal(file_check(fd, FILE_OFF, FILE_SZ - FILE_OFF - N * BLK, FILE_SEED, FILE_OFF),
                     -1); /* the rest untouched */
    /* Past the file's end, before the region's start: refused at prepare. */
    l[0] = (mc_kv_desc_t){(uintptr_t)p.ma, BLK, 0, p.mda};
    r[0] = (mc_kv_desc_t){FILE_SZ - BLK + 1, BLK, 0, self};
    EXPECT(p.a, MC_KV_ERR_INVALID_PARAM, "is not inside its region",
           P->prep_xfer(p.a, MC_KV_READ, l, r, 1, "A", &x));
    r[0].addr = FILE_OFF - 1;
    EXPECT(p.a, MC_KV_ERR_INVALID_PARAM, "is not inside its region",
           P->prep_xfer(p.a, MC_KV_READ, l, r, 1, "A", &x));
    EXPECT(p.a, MC_KV_ERR_NOT_ALLOWED, "loopback", P->deregister_mem(p.a, fa));
    OK(p.a, P->unload_md(p.a, self));
    OK(p.a, P->disconnect(p.a, "A"));

    /* B reaches A's file through its public data: READ into B's memory, WRITE from it. */
    fb = load_region(p.b, "A", p.a, fa);
    scatter(l, r, N, BLK, p.mb, p.mdb, FILE_OFF, fb, 5);
    move_ok(p.b, MC_KV_READ, l, r, N, "A", NULL);
    for (size_t i = 0; i < N; i++)
        if (check((uint8_t *)(uintptr_t)l[i].addr, BLK, FILE_SEED, r[i].addr) >= 0)
            fail_msg("block %zu wrong after a READ from the peer's file", i);
    fill(p.mb, N * BLK, 9, 0);
    scatter(l, r, N, BLK, p.mb, p.mdb, FILE_OFF + N * BLK, fb, 6);
    OK(p.b, P->prep_xfer(p.b, MC_KV_WRITE, l, r, N, "A", &x));
    assert_int_equal(run(p.b, x, "file-written"), MC_KV_SUCCESS);
    mc_kv_notif_t *n = malloc(sizeof(*n));
    assert_int_equal(wait_notif(p.a, n, 10000), 1); /* after the bytes are in A's file */
    assert_memory_equal(n->msg, "file-written", 12);
    for (size_t i = 0; i < N; i++)
        if (file_check(fd, r[i].addr, BLK, 9, l[i].addr - (uintptr_t)p.mb) >= 0)
            fail_msg("block %zu wrong in the peer's file after a WRITE", i);
    free(n);
    OK(p.b, P->release_xfer(p.b, x));
    OK(p.b, P->unload_md(p.b, fb));
    /* A's file as the local end: WRITE blocks of it to B's memory, READ B's into it. */
    scatter(l, r, N, BLK, (uint8_t *)(uintptr_t)FILE_OFF, fa, (uintptr_t)p.mb, p.rb, 7);
    memset(p.mb, 0, N * BLK);
    move_ok(p.a, MC_KV_WRITE, l, r, N, "B", NULL);
    for (size_t i = 0; i < N; i++)
        if (check((uint8_t *)(uintptr_t)r[i].addr, BLK, FILE_SEED, l[i].addr) >= 0)
            fail_msg("block %zu wrong after a WRITE from the local file", i);
    fill(p.mb, N * BLK, 12, 0);
    scatter(l, r, N, BLK, (uint8_t *)(uintptr_t)FILE_OFF, fa, (uintptr_t)p.mb, p.rb, 8);
    move_ok(p.a, MC_KV_READ, l, r, N, "B", NULL);
    for (size_t i = 0; i < N; i++)
        if (file_check(fd, l[i].addr, BLK, 12, r[i].addr - (uintptr_t)p.mb) >= 0)
            fail_msg("block %zu wrong in the local file after a READ into it", i);
    OK(p.a, P->deregister_mem(p.a, fa));

    /* A read-only descriptor: READs work, WRITEs fail with the reason, the file unchanged. */
    fa = reg_file(p.a, ro, 0, FILE_SZ);
    fb = load_region(p.b, "A", p.a, fa);
    l[0] = (mc_kv_desc_t){(uintptr_t)p.mb, BLK, 0, p.mdb};
    r[0] = (mc_kv_desc_t){FILE_SZ - BLK, BLK, 0, fb};
    OK(p.b, P->prep_xfer(p.b, MC_KV_READ, l, r, 1, "A", &x));
    assert_int_equal(run(p.b, x, NULL), MC_KV_SUCCESS);
    assert_int_equal(check(p.mb, BLK, FILE_SEED, FILE_SZ - BLK), -1);
    OK(p.b, P->release_xfer(p.b, x));
    fill(p.mb, BLK, 11, 0);
    OK(p.b, P->prep_xfer(p.b, MC_KV_WRITE, l, r, 1, "A", &x));
    assert_int_equal(run(p.b, x, NULL), MC_KV_ERR_NOT_ALLOWED);
    assert_non_null(strstr(P->last_error(p.b), "read-only"));
    OK(p.b, P->release_xfer(p.b, x));
    assert_int_equal(file_check(ro, FILE_SZ - BLK, BLK, FILE_SEED, FILE_SZ - BLK), -1);
    OK(p.b, P->unload_md(p.b, fb));
    /* Public data of another release of the plugin: the version says so. */
    unsigned char pub[MC_KV_PUBLIC_MAX];
    size_t plen = sizeof(pub);
    OK(p.a, P->public_data(p.a, fa, pub, &plen));
    pub[4] = 1;
    EXPECT(p.b, MC_KV_ERR_MISMATCH, "version 1", P->load_remote_md(p.b, "A", pub, 160, &md));
    OK(p.a, P->deregister_mem(p.a, fa));

    /* Bad regions: not a descriptor, a pipe (opened without a writer: never reopened, which
     * would block), a write-only descriptor, past the file's end, empty. */
    mc_kv_region_t bad = {.addr = 0, .len = 0, .dev_id = 1u << 30, .type = MC_KV_FILE};
    EXPECT(p.a, MC_KV_ERR_INVALID_PARAM, "not an open file descriptor",
           P->register_mem(p.a, &bad, &md));
    char fifo[] = "/tmp/mc-kv-fifo-XXXXXX";
    int tmp = mkstemp(fifo);
    assert_true(tmp >= 0);
    close(tmp);
    unlink(fifo);
    assert_int_equal(mkfifo(fifo, 0600), 0);
    int pfd = open(fifo, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    assert_true(pfd >= 0);
    unlink(fifo);
    bad.dev_id = (uint64_t)pfd;
    EXPECT(p.a, MC_KV_ERR_INVALID_PARAM, "is a pipe", P->register_mem(p.a, &bad, &md));
    close(pfd);
    int wo = file_make(O_WRONLY);
    bad.dev_id = (uint64_t)wo;
    EXPECT(p.a, MC_KV_ERR_INVALID_PARAM, "write-only", P->register_mem(p.a, &bad, &md));
    close(wo);
    bad = (mc_kv_region_t){
        .addr = FILE_SZ - 10, .len = 20, .dev_id = (uint64_t)fd, .type = MC_KV_FILE};
    EXPECT(p.a, MC_KV_ERR_INVALID_PARAM, "FILE region", P->register_mem(p.a, &bad, &md));
    bad.addr = FILE_SZ;
    bad.len = 0;
    EXPECT(p.a, MC_KV_ERR_INVALID_PARAM, "FILE region", P->register_mem(p.a, &bad, &md));
    pair_down(&p);
    close(fd);
    close(ro);
}

static void test_file_regions(void **state)
{
    (void)state;
    file_case("auto");
    file_case("tcp");
}

/* Notifications: standalone and attached, from one sender, arrive in the order sent. */
static void test_notif_order(void **state)
{
    mc_kv_notif_t *n = malloc(sizeof(*n));
    mc_kv_desc_t l, r;
    mc_kv_xfer_t *x;
    char msg[32];
    pair_t p;

    (void)state;
    pair_up(&p, "tcp");
    for (int i = 0; i < 200; i++) {
        snprintf(msg, sizeof(msg), "n%d", i);
        if (i % 2) {
            OK(p.a, P->gen_notif(p.a, "B", msg, strlen(msg)));
            continue;
        }
        l = (mc_kv_desc_t){(uintptr_t)p.ma + i * 1024, 1024, 0, p.mda};
        r = (mc_kv_desc_t){(uintptr_t)p.mb + i * 1024, 1024, 0, p.rb};
        OK(p.a, P->prep_xfer(p.a, MC_KV_WRITE, &l, &r, 1, "B", &x));
        assert_int_equal(run(p.a, x, msg), MC_KV_SUCCESS);
        OK(p.a, P->release_xfer(p.a, x));
    }
    for (int i = 0; i < 200; i++) {
        assert_int_equal(wait_notif(p.b, n, 10000), 1);
        snprintf(msg, sizeof(msg), "n%d", i);
        if (n->len != strlen(msg) || memcmp(n->msg, msg, n->len))
            fail_msg("notification %d is '%.*s'", i, (int)n->len, n->msg);
        assert_string_equal(n->agent, "A");
    }
    /* Every transfer's data is there (each notification came after its data). */
    for (int i = 0; i < 200; i += 2)
        assert_int_equal(check(p.mb + i * 1024, 1024, 1, i * 1024), -1);
    EXPECT(p.a, MC_KV_ERR_NOT_FOUND, "'nobody' is not loaded", P->gen_notif(p.a, "nobody", "x", 1));
    EXPECT(p.a, MC_KV_ERR_INVALID_PARAM, "at most",
           P->gen_notif(p.a, "B", p.ma, MC_KV_NOTIF_MAX + 1));
    pair_down(&p);
    free(n);
}

/* Poll get_notif until it returns something other than 0 (10 s at most). */
static int get_notif_wait(mc_kv_backend_t *b, mc_kv_notif_t *n)
{
    int64_t end = now_ms() + 10000;
    int rc;

    while ((rc = P->get_notif(b, n)) == 0 && now_ms() < end)
        sleep_ms(1);
    return rc;
}

/* The sender's agent name in a notification is checked against the process it came from: B
 * has loaded agent A, so another instance that calls itself "A" is refused (MISMATCH, dropped),
 * and A's own still arrive; an agent B never loaded is taken at its word. */
static void test_notif_sender(void **state)
{
    mc_kv_notif_t *n = malloc(sizeof(*n));
    mc_kv_backend_t *fake, *d;
    pair_t p;

    (void)state;
    pair_up(&p, NULL);
    fake = agent_create("A", NULL); /* another process claiming to be A */
    d = agent_create("D", NULL);
    introduce(fake, p.b, "B");
    introduce(d, p.b, "B");
    OK(p.a, P->gen_notif(p.a, "B", "genuine", 7));
    assert_int_equal(get_notif_wait(p.b, n), 1);
    assert_string_equal(n->agent, "A");
    assert_int_equal(n->len, 7);
    assert_memory_equal(n->msg, "genuine", 7);
    OK(fake, P->gen_notif(fake, "B", "spoofed", 7));
    EXPECT(p.b, MC_KV_ERR_MISMATCH, "names agent 'A', whose segment is", get_notif_wait(p.b, n));
    OK(p.a, P->gen_notif(p.a, "B", "still", 5));
    assert_int_equal(get_notif_wait(p.b, n), 1);
    assert_string_equal(n->agent, "A");
    assert_memory_equal(n->msg, "still", 5);
    OK(d, P->gen_notif(d, "B", "unloaded", 8));
    assert_int_equal(get_notif_wait(p.b, n), 1);
    assert_string_equal(n->agent, "D");
    assert_memory_equal(n->msg, "unloaded", 8);
    assert_int_equal(P->get_notif(p.b, n), 0);
    OK(fake, P->disconnect(fake, "B"));
    OK(d, P->disconnect(d, "B"));
    P->destroy(fake);
    P->destroy(d);
    pair_down(&p);
    free(n);
}

/* Back-pressure on notifications: B does not pop, so A's gen_notif ends BACKEND once A's window
 * is full, and for good once B's queue is full too (B's acknowledgements free the window until
 * then); so does a post of empty descriptors with a notification (both with the documented
 * "queued or unacknowledged"). Once B pops, every one sent comes, in order, none refused. */
static void test_notif_window(void **state)
{
    mc_kv_notif_t *n = malloc(sizeof(*n));
    mc_kv_desc_t l, rd;
    mc_kv_xfer_t *x = NULL;
    mc_kv_status_t st = MC_KV_SUCCESS;
    unsigned sent = 0, got = 0;
    char msg[32];
    pair_t p;

    (void)state;
    pair_up(&p, NULL);
    /* until refused for 300 ms in a row: B's queue is full, not just slow to acknowledge */
    for (int64_t end = now_ms() + 60000, refused_since = 0;
         now_ms() < end && (!refused_since || now_ms() - refused_since < 300);) {
        snprintf(msg, sizeof(msg), "%u", sent);
        st = P->gen_notif(p.a, "B", msg, strlen(msg));
        if (st == MC_KV_SUCCESS) {
            sent++;
            refused_since = 0;
            continue;
        }
        EXPECT(p.a, MC_KV_ERR_BACKEND, "queued or unacknowledged", st);
        refused_since = refused_since ? refused_since : now_ms();
        sleep_ms(1);
    }
    assert_int_not_equal(st, MC_KV_SUCCESS);
    assert_true(sent > 4096); /* more than A's window: B took what fits in its queue */
    l = (mc_kv_desc_t){(uintptr_t)p.ma, 0, 0, p.mda};
    rd = (mc_kv_desc_t){(uintptr_t)p.mb, 0, 0, p.rb};
    OK(p.a, P->prep_xfer(p.a, MC_KV_WRITE, &l, &rd, 1, "B", &x));
    EXPECT(p.a, MC_KV_ERR_BACKEND, "queued or unacknowledged", P->post_xfer(p.a, x, "refused", 7));
    while (got < sent && get_notif_wait(p.b, n) == 1) {
        snprintf(msg, sizeof(msg), "%u", got);
        if (n->len != strlen(msg) || memcmp(n->msg, msg, n->len))
            fail_msg("notification %u is '%.*s'", got, (int)n->len, n->msg);
        got++;
    }
    assert_int_equal(got, sent);
    assert_int_equal(run(p.a, x, "last"), MC_KV_SUCCESS); /* room again */
    assert_int_equal(get_notif_wait(p.b, n), 1);
    assert_memory_equal(n->msg, "last", 4);
    assert_int_equal(P->get_notif(p.b, n), 0);
    OK(p.a, P->release_xfer(p.a, x));
    pair_down(&p);
    free(n);
}

/* The engine's own API, from libmooncake_te.so (this program links no Mooncake library). */
typedef struct engine_api {
    void *lib;
    int (*create)(mc_config_t *, mc_engine_t **);
    void (*destroy)(mc_engine_t *);
    const char *(*segment_name)(mc_engine_t *);
    int (*open_address)(mc_engine_t *, const void *, size_t, mc_segment_id_t *);
    int (*notify_send)(mc_engine_t *, mc_segment_id_t, const void *, size_t);
} engine_api_t;

static void engine_api_load(engine_api_t *api)
{
    char path[4200];

    snprintf(path, sizeof(path), "%s", plugin_path);
    snprintf(strrchr(path, '/'), sizeof(path) - (size_t)(strrchr(path, '/') - path),
             "/libmooncake_te.so");
    if (!(api->lib = dlopen(path, RTLD_NOW | RTLD_LOCAL)))
        fail_msg("dlopen %s: %s", path, dlerror());
    *(void **)&api->create = dlsym(api->lib, "mc_engine_create");
    *(void **)&api->destroy = dlsym(api->lib, "mc_engine_destroy");
    *(void **)&api->segment_name = dlsym(api->lib, "mc_engine_segment_name");
    *(void **)&api->open_address = dlsym(api->lib, "mc_segment_open_address");
    *(void **)&api->notify_send = dlsym(api->lib, "mc_notify_send");
    assert_true(api->create && api->destroy && api->segment_name && api->open_address &&
                api->notify_send);
}

/* A process that uses the engine itself sends B notifications: B's host gets each one whole,
 * named by the sender's segment, even one whose first bytes look like a name (the plugin marks
 * its own); one larger than a notification holds is refused by name and loses nothing after
 * it. */
static void test_notif_plain(void **state)
{
    mc_kv_notif_t *n = malloc(sizeof(*n));
    unsigned char info[MC_KV_CONN_MAX], looks_framed[] = "\x03"
                                                         "Bxxhello";
    size_t len = sizeof(info), big_len = MC_KV_NOTIF_MAX + 1;
    char *big = calloc(1, big_len);
    mc_segment_id_t seg;
    mc_engine_t *e = NULL;
    engine_api_t api;
    pair_t p;

    (void)state;
    pair_up(&p, NULL);
    engine_api_load(&api);
    assert_int_equal(api.create(NULL, &e), 0);
    OK(p.b, P->conn_info(p.b, info, &len)); /* [magic][version][1]"B"[address length][address] */
    assert_int_equal(api.open_address(e, info + 8, info[7], &seg), 0);
    const char *sender = api.segment_name(e);

    assert_int_equal(api.notify_send(e, seg, looks_framed, sizeof(looks_framed) - 1), 0);
    assert_int_equal(api.notify_send(e, seg, big, big_len), 0);
    assert_int_equal(api.notify_send(e, seg, "after", 5), 0);
    assert_int_equal(get_notif_wait(p.b, n), 1);
    assert_string_equal(n->agent, sender);
    assert_int_equal(n->len, sizeof(looks_framed) - 1);
    assert_memory_equal(n->msg, looks_framed, n->len);
    EXPECT(p.b, MC_KV_ERR_NOT_SUPPORTED, "of 64513 bytes from segment", get_notif_wait(p.b, n));
    assert_non_null(strstr(P->last_error(p.b), sender));
    assert_int_equal(get_notif_wait(p.b, n), 1);
    assert_string_equal(n->agent, sender);
    assert_int_equal(n->len, 5);
    assert_memory_equal(n->msg, "after", 5);
    OK(p.a, P->gen_notif(p.a, "B", "framed", 6)); /* the plugin's own still name their agent */
    assert_int_equal(get_notif_wait(p.b, n), 1);
    assert_string_equal(n->agent, "A");
    assert_memory_equal(n->msg, "framed", 6);
    assert_int_equal(P->get_notif(p.b, n), 0);
    api.destroy(e); /* (the library stays: what it set up once lives as long as the process) */
    pair_down(&p);
    free(big);
    free(n);
}

/* Several threads prepare, post, check and release their own handles and send notifications
 * at once, as NIXL's host does. */
#define THREADS 4
#define ROUNDS  50

typedef struct worker {
    pair_t *p;
    int id;
    int errors;
} worker_t;

static void *worker_main(void *arg)
{
    worker_t *w = arg;
    pair_t *p = w->p;
    size_t slice = SZ / 2 / THREADS, blk = 512, count = slice / blk / 4;
    mc_kv_desc_t *l = malloc(count * sizeof(*l)), *r = malloc(count * sizeof(*r));
    uint8_t *mine = p->ma + w->id * slice;
    uint64_t theirs = (uintptr_t)p->mb + SZ / 2 + w->id * slice;
    char msg[32];

    for (int round = 0; round < ROUNDS && !w->errors; round++) {
        mc_kv_xfer_t *x = NULL;

        scatter(l, r, count, blk, mine, p->mda, theirs, p->rb, (unsigned)(w->id * 1000 + round));
        fill(mine, slice, 100 + round, w->id * slice);
        snprintf(msg, sizeof(msg), "w%d", w->id);
        if (P->prep_xfer(p->a, round % 2 ? MC_KV_READ : MC_KV_WRITE, l, r, count, "B", &x) ||
            run(p->a, x, round % 2 ? NULL : msg) != MC_KV_SUCCESS ||
            P->gen_notif(p->a, "B", msg, strlen(msg)) || P->release_xfer(p->a, x))
            w->errors++;
        /* WRITE: B's blocks hold our pattern; READ: ours hold B's (pattern 2). */
        for (size_t i = 0; i < count && !w->errors && !(round % 2); i++)
            if (check((uint8_t *)(uintptr_t)r[i].addr, blk, 100 + round,
                      l[i].addr - (uintptr_t)p->ma) >= 0)
                w->errors++;
        for (size_t i = 0; i < count && !w->errors && round % 2; i++)
            if (check((uint8_t *)(uintptr_t)l[i].addr, blk, 2, r[i].addr - (uintptr_t)p->mb) >= 0)
                w->errors++;
        if (round % 2 == 0) /* B's memory back to its pattern for the next READ */
            fill(p->mb + SZ / 2 + w->id * slice, slice, 2, SZ / 2 + w->id * slice);
    }
    free(l);
    free(r);
    return NULL;
}

static void test_concurrent_handles(void **state)
{
    pthread_t th[THREADS];
    worker_t w[THREADS];
    mc_kv_notif_t *n = malloc(sizeof(*n));
    int got[THREADS] = {0};
    pair_t p;

    (void)state;
    pair_up(&p, NULL);
    for (int i = 0; i < THREADS; i++) {
        w[i] = (worker_t){&p, i, 0};
        pthread_create(&th[i], NULL, worker_main, &w[i]);
    }
    for (int i = 0; i < THREADS; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(w[i].errors, 0);
    }
    /* Per thread: ROUNDS standalone notifications and ROUNDS/2 attached ones. */
    for (int k = 0; k < THREADS * (ROUNDS + ROUNDS / 2); k++) {
        assert_int_equal(wait_notif(p.b, n, 10000), 1);
        assert_true(n->len == 2 && n->msg[0] == 'w' && n->msg[1] >= '0' &&
                    n->msg[1] < '0' + THREADS);
        got[n->msg[1] - '0']++;
    }
    for (int i = 0; i < THREADS; i++)
        assert_int_equal(got[i], ROUNDS + ROUNDS / 2);
    assert_int_equal(P->get_notif(p.b, n), 0);
    pair_down(&p);
    free(n);
}

/* Re-posting: an active handle is refused, a finished one moves the data again; a released
 * in-flight handle sends no notification, and the instance goes on working. */
static void test_repost_and_release(void **state)
{
    mc_kv_desc_t l = {0}, r = {0};
    mc_kv_notif_t *n = malloc(sizeof(*n));
    mc_kv_xfer_t *x;
    mc_kv_status_t st;
    pair_t p;

    (void)state;
    pair_up(&p, "tcp"); /* tcp: a 2 MiB post is still in progress when post returns */
    l = (mc_kv_desc_t){(uintptr_t)p.ma, SZ / 2, 0, p.mda};
    r = (mc_kv_desc_t){(uintptr_t)p.mb, SZ / 2, 0, p.rb};
    OK(p.a, P->prep_xfer(p.a, MC_KV_WRITE, &l, &r, 1, "B", &x));
    st = P->post_xfer(p.a, x, "first", 5);
    if (st == MC_KV_IN_PROG)
        EXPECT(p.a, MC_KV_ERR_REPOST_ACTIVE, "still in progress", P->post_xfer(p.a, x, NULL, 0));
    else
        assert_int_equal(st, MC_KV_SUCCESS);
    while ((st = P->check_xfer(p.a, x)) == MC_KV_IN_PROG)
        ;
    assert_int_equal(st, MC_KV_SUCCESS);
    assert_int_equal(check(p.mb, SZ / 2, 1, 0), -1);
    assert_int_equal(wait_notif(p.b, n, 10000), 1);
    assert_memory_equal(n->msg, "first", 5);
    /* Again, with new data. */
    fill(p.ma, SZ / 2, 9, 0);
    assert_int_equal(run(p.a, x, "second"), MC_KV_SUCCESS);
    assert_int_equal(check(p.mb, SZ / 2, 9, 0), -1);
    assert_int_equal(wait_notif(p.b, n, 10000), 1);
    assert_memory_equal(n->msg, "second", 6);
    /* A post refused (its notification too long) leaves none: check_xfer says so, not the
     * result of the one before. */
    EXPECT(p.a, MC_KV_ERR_INVALID_PARAM, "at most",
           P->post_xfer(p.a, x, p.ma, MC_KV_NOTIF_MAX + 1));
    EXPECT(p.a, MC_KV_ERR_NOT_POSTED, "not posted", P->check_xfer(p.a, x));
    /* Released in flight: no notification, never blocks. */
    for (int i = 0; i < 5; i++) {
        int64_t t0 = now_ms();

        st = P->post_xfer(p.a, x, "aborted", 7);
        assert_true(st == MC_KV_IN_PROG || st == MC_KV_SUCCESS);
        if (st == MC_KV_IN_PROG)
            break;
        assert_true(now_ms() - t0 < 1000);
    }
    OK(p.a, P->release_xfer(p.a, x));
    sleep_ms(300);
    while (P->get_notif(p.b, n) == 1) /* one that completed before its release notifies (exactly:
                                         test_release_notif) */
        assert_memory_equal(n->msg, "aborted", 7);
    /* The instance still works. */
    fill(p.ma, 4096, 11, 0);
    OK(p.a, P->prep_xfer(p.a, MC_KV_WRITE, &l, &r, 1, "B", &x));
    l.len = r.len = 4096;
    OK(p.a, P->release_xfer(p.a, x));
    OK(p.a, P->prep_xfer(p.a, MC_KV_WRITE, &l, &r, 1, "B", &x));
    assert_int_equal(run(p.a, x, NULL), MC_KV_SUCCESS);
    assert_int_equal(check(p.mb, 4096, 11, 0), -1);
    OK(p.a, P->release_xfer(p.a, x));
    pair_down(&p);
    free(n);
}

/* Every block of a transfer moved: l[i] holds what r[i] had (READ: B's pattern), or r[i] what
 * l[i] had (WRITE: A's). */
static void check_moved(const pair_t *p, mc_kv_op_t op, const mc_kv_desc_t *l,
                        const mc_kv_desc_t *r, size_t count)
{
    for (size_t i = 0; i < count; i++) {
        const uint8_t *dst = (const uint8_t *)(uintptr_t)(op == MC_KV_READ ? l[i].addr : r[i].addr);
        uint64_t src =
            op == MC_KV_READ ? r[i].addr - (uintptr_t)p->mb : l[i].addr - (uintptr_t)p->ma;

        if (check(dst, l[i].len, op == MC_KV_READ ? 2 : 1, src) >= 0)
            fail_msg("block %zu of %zu wrong", i, count);
    }
}

/* A released handle whose batch is idle is kept, and the next prepare of no more descriptors
 * takes it (a host that prepares every transfer maps no fresh memory for each): it comes back
 * as new (another op, other regions, fewer descriptors), it holds none of the regions it used
 * before (they deregister), and a larger prepare gets a handle of its own. */
static void test_spare_handles(void **state)
{
    enum { N = 1000, B = 16 };
    mc_kv_desc_t *l = malloc(2 * N * sizeof(*l)), *r = malloc(2 * N * sizeof(*r));
    mc_kv_region_t extra = {.addr = 0, .len = N * B, .type = MC_KV_DRAM};
    mc_kv_md_t *h;
    mc_kv_xfer_t *x, *y;
    pair_t p;

    (void)state;
    pair_up(&p, NULL);
    extra.addr = (uintptr_t)p.ma + SZ / 2;
    OK(p.a, P->register_mem(p.a, &extra, &h));
    scatter(l, r, N, B, p.ma + SZ / 2, h, (uintptr_t)p.mb, p.rb, 3);
    OK(p.a, P->prep_xfer(p.a, MC_KV_READ, l, r, N, "B", &x));
    assert_int_equal(run(p.a, x, NULL), MC_KV_SUCCESS);
    check_moved(&p, MC_KV_READ, l, r, N);
    OK(p.a, P->release_xfer(p.a, x));
    OK(p.a, P->deregister_mem(p.a, h)); /* the kept handle holds it no more */

    scatter(l, r, 8, 4096, p.ma, p.mda, (uintptr_t)p.mb + SZ / 2, p.rb, 4);
    OK(p.a, P->prep_xfer(p.a, MC_KV_WRITE, l, r, 8, "B", &y));
    assert_ptr_equal(y, x); /* the spare */
    assert_int_equal(run(p.a, y, NULL), MC_KV_SUCCESS);
    check_moved(&p, MC_KV_WRITE, l, r, 8);
    OK(p.a, P->release_xfer(p.a, y));

    scatter(l, r, 2 * N, B, p.ma, p.mda, (uintptr_t)p.mb + SZ / 4, p.rb, 5);
    OK(p.a, P->prep_xfer(p.a, MC_KV_WRITE, l, r, 2 * N, "B", &y));
    assert_ptr_not_equal(y, x); /* no spare has room for 2N */
    assert_int_equal(run(p.a, y, NULL), MC_KV_SUCCESS);
    check_moved(&p, MC_KV_WRITE, l, r, 2 * N);
    OK(p.a, P->release_xfer(p.a, y));
    pair_down(&p);
    free(l);
    free(r);
}

/* A peer in another process: data both ways; the notification reaches it although this side
 * never checks the transfer again after posting. */
static void test_peer_process(void **state)
{
    mc_kv_backend_t *a = agent_create("A", NULL);
    uint8_t *mem = aligned_alloc(4096, SZ);
    mc_kv_md_t *md = reg(a, mem, SZ), *rmd = NULL;
    mc_kv_desc_t l = {(uintptr_t)mem, SZ, 0, md}, r;
    mc_kv_xfer_t *x;
    peer_reply_t rep;
    peer_t peer;

    (void)state;
    peer_spawn(&peer, "auto");
    OK(a, P->load_remote_conn_info(a, "peer", peer.info, peer.info_len));
    OK(a, P->load_remote_md(a, "peer", peer.pub, peer.pub_len, &rmd));
    OK(a, P->connect(a, "peer"));
    memcpy(&r.addr, peer.pub + 8, 8); /* the region's address, from its public data */
    r = (mc_kv_desc_t){r.addr + 4096, SZ, 0, rmd};
    OK(a, P->prep_xfer(a, MC_KV_READ, &l, &r, 1, "peer", &x));
    assert_int_equal(run(a, x, NULL), MC_KV_SUCCESS);
    assert_int_equal(check(mem, SZ, PEER_SEED, 4096), -1);
    OK(a, P->release_xfer(a, x));
    /* WRITE a new pattern at offset 8 MiB with a notification, then only wait. */
    fill(mem, SZ, 5, 8u << 20);
    r.addr += (8u << 20) - 4096;
    OK(a, P->prep_xfer(a, MC_KV_WRITE, &l, &r, 1, "peer", &x));
    mc_kv_status_t st = P->post_xfer(a, x, "done:0", 6);
    assert_true(st == MC_KV_IN_PROG || st == MC_KV_SUCCESS);
    rep = peer_cmd(&peer, PEER_NOTIF, 8u << 20, SZ, 5, 10000);
    assert_int_equal(rep.rc, 6); /* arrived, and the data was there (else -3) */
    assert_string_equal(rep.agent, "A");
    assert_string_equal(rep.msg, "done:0");
    assert_int_equal(run(a, x, NULL) == MC_KV_SUCCESS || P->check_xfer(a, x) == MC_KV_SUCCESS, 1);
    OK(a, P->release_xfer(a, x));
    peer_stop(&peer);
    OK(a, P->unload_md(a, rmd));
    OK(a, P->disconnect(a, "peer"));
    OK(a, P->deregister_mem(a, md));
    P->destroy(a);
    free(mem);
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

/* A READ of the whole region of a peer process over tcp, prepared. */
typedef struct peer_read {
    mc_kv_backend_t *a;
    uint8_t *mem;
    mc_kv_md_t *md, *rmd;
    mc_kv_xfer_t *x;
    peer_t peer;
} peer_read_t;

static void peer_read_setup(peer_read_t *pr)
{
    mc_kv_desc_t l, r;

    pr->a = agent_create("A", "tcp");
    pr->mem = aligned_alloc(4096, PEER_SIZE);
    pr->md = reg(pr->a, pr->mem, PEER_SIZE);
    pr->rmd = NULL;
    peer_spawn(&pr->peer, "tcp");
    OK(pr->a, P->load_remote_conn_info(pr->a, "peer", pr->peer.info, pr->peer.info_len));
    OK(pr->a, P->load_remote_md(pr->a, "peer", pr->peer.pub, pr->peer.pub_len, &pr->rmd));
    l = (mc_kv_desc_t){(uintptr_t)pr->mem, PEER_SIZE, 0, pr->md};
    memcpy(&r.addr, pr->peer.pub + 8, 8); /* the region's address, from its public data */
    r = (mc_kv_desc_t){r.addr, PEER_SIZE, 0, pr->rmd};
    OK(pr->a, P->prep_xfer(pr->a, MC_KV_READ, &l, &r, 1, "peer", &pr->x));
}

/* After the peer process is gone (peer_stop, or killed and reaped). */
static void peer_read_teardown(peer_read_t *pr)
{
    OK(pr->a, P->release_xfer(pr->a, pr->x));
    OK(pr->a, P->unload_md(pr->a, pr->rmd));
    OK(pr->a, P->disconnect(pr->a, "peer"));
    OK(pr->a, P->deregister_mem(pr->a, pr->md));
    P->destroy(pr->a);
    free(pr->mem);
}

/* Post pr's READ again until one is caught in flight, then stop the peer (SIGSTOP) under it:
 * IN_PROG with the peer stopped, or SUCCESS (running) if every post finished first. */
static mc_kv_status_t post_and_stop(peer_read_t *pr)
{
    mc_kv_status_t st = MC_KV_SUCCESS;

    for (int i = 0; i < 20 && st == MC_KV_SUCCESS; i++) {
        st = P->post_xfer(pr->a, pr->x, NULL, 0);
        if (st == MC_KV_IN_PROG) {
            kill(pr->peer.pid, SIGSTOP);
            st = P->check_xfer(pr->a, pr->x);
            if (st == MC_KV_SUCCESS) /* it finished before the stop */
                kill(pr->peer.pid, SIGCONT);
        }
    }
    return st;
}

/* A host spinning on check_xfer (no pause between checks) is made to wait for the transfer a
 * little at a time instead of taking a core from the engine threads that move it: with the peer
 * stopped mid-READ, the spinning checks all say IN_PROG, some of them only after a wait, none
 * blocks for long; the peer resumed, the transfer completes with the data. */
static void test_spinning_check(void **state)
{
    peer_read_t pr;
    mc_kv_status_t st;
    int64_t waits_us[21], longest_us = 0, t0;
    int waits = 0;

    (void)state;
    peer_read_setup(&pr);
    st = post_and_stop(&pr);
    /* Spin until 21 checks waited (took 0.5 ms or more), or 5 s. */
    for (t0 = now_ms(); waits < 21 && st == MC_KV_IN_PROG && now_ms() - t0 < 5000;) {
        struct timespec a0, a1;
        clock_gettime(CLOCK_MONOTONIC, &a0);
        st = P->check_xfer(pr.a, pr.x);
        clock_gettime(CLOCK_MONOTONIC, &a1);
        int64_t us = (a1.tv_sec - a0.tv_sec) * 1000000 + (a1.tv_nsec - a0.tv_nsec) / 1000;
        longest_us = us > longest_us ? us : longest_us;
        if (us >= 500)
            waits_us[waits++] = us;
    }
    kill(pr.peer.pid, SIGCONT); /* before any assertion: a failed one leaves the peer running */
    assert_int_equal(st, MC_KV_IN_PROG);
    assert_int_equal(waits, 21); /* the spinning checks waited */
    qsort(waits_us, 21, sizeof(waits_us[0]), cmp_i64);
    assert_true(waits_us[10] < 10000); /* a millisecond at a time (the median: a loaded machine
                                          may deschedule a few) */
    assert_true(longest_us < 1000000);
    t0 = now_ms();
    while ((st = P->check_xfer(pr.a, pr.x)) == MC_KV_IN_PROG && now_ms() - t0 < 30000)
        ;
    assert_int_equal(st, MC_KV_SUCCESS);
    assert_int_equal(check(pr.mem, PEER_SIZE, PEER_SEED, 0), -1);
    peer_stop(&pr.peer);
    peer_read_teardown(&pr);
}

/* A READ that outlasts MC_TRANSFER_TIMEOUT because the peer stopped answering (SIGSTOP: alive,
 * not gone) ends BACKEND, not REMOTE_DISCONNECT, which a host takes for a dead peer; once the
 * peer goes on, the same handle posted again moves every byte. */
static void test_timeout_not_disconnect(void **state)
{
    peer_read_t pr;
    mc_kv_status_t st;
    int64_t t0;

    (void)state;
    setenv("MC_TRANSFER_TIMEOUT", "1", 1);
    peer_read_setup(&pr);
    unsetenv("MC_TRANSFER_TIMEOUT");
    st = post_and_stop(&pr);
    for (t0 = now_ms(); st == MC_KV_IN_PROG && now_ms() - t0 < 20000; sleep_ms(1))
        st = P->check_xfer(pr.a, pr.x);
    kill(pr.peer.pid, SIGCONT); /* before any assertion: a failed one leaves the peer running */
    if (st != MC_KV_ERR_BACKEND)
        fail_msg("a timed-out READ: %s: %s", mc_kv_status_name(st), P->last_error(pr.a));
    memset(pr.mem, 0, PEER_SIZE);
    /* The peer catches up after SIGCONT; the repost has the same 1 s timeout, which a loaded
     * machine (a sanitizer build beside other tests) may make it outlast once more: then it
     * ends BACKEND again, never REMOTE_DISCONNECT, and a later post moves every byte. */
    for (int tries = 0; (st = run(pr.a, pr.x, NULL)) == MC_KV_ERR_BACKEND && tries < 3; tries++)
        print_message("  repost %d timed out again: %s\n", tries + 1, P->last_error(pr.a));
    assert_int_equal(st, MC_KV_SUCCESS);
    assert_int_equal(check(pr.mem, PEER_SIZE, PEER_SEED, 0), -1);
    peer_stop(&pr.peer);
    peer_read_teardown(&pr);
}

/* The next notification the peer gets within timeout_ms is msg (NULL: none comes). */
static void peer_expect_notif(peer_t *peer, const char *msg, int timeout_ms)
{
    peer_reply_t rep = peer_cmd(peer, PEER_NOTIF, 0, 0, 0, timeout_ms);

    if (!msg && rep.rc >= 0)
        fail_msg("the peer got notification '%s' from '%s'; none was due", rep.msg, rep.agent);
    if (!msg)
        return;
    if (rep.rc < 0)
        fail_msg("the peer got no notification; '%s' was due", msg);
    assert_string_equal(rep.agent, "A");
    assert_string_equal(rep.msg, msg);
}

/* Release and a post's notification, seen at the target: a post released in flight (the peer
 * stopped, so its READ cannot complete) never notifies, even once the peer resumes and the
 * bytes on the wire settle; a post whose data all moved notifies exactly once although this
 * host never checked it and released it. */
static void test_release_notif(void **state)
{
    mc_kv_status_t st = MC_KV_SUCCESS;
    mc_kv_xfer_t *y;
    mc_kv_desc_t l, r;
    char msg[32];
    int tries, caught = 0;
    peer_read_t pr;

    (void)state;
    peer_read_setup(&pr);
    for (tries = 0; tries < 20 && !caught; tries++) { /* until a post is caught in flight */
        snprintf(msg, sizeof(msg), "try-%d", tries);
        st = P->post_xfer(pr.a, pr.x, msg, strlen(msg));
        assert_true(st == MC_KV_IN_PROG || st == MC_KV_SUCCESS);
        if (st == MC_KV_IN_PROG) {
            kill(pr.peer.pid, SIGSTOP);
            if ((st = P->check_xfer(pr.a, pr.x)) == MC_KV_IN_PROG)
                caught = 1;
            else
                kill(pr.peer.pid, SIGCONT); /* it finished before the stop */
        }
        while (!caught && (st = P->check_xfer(pr.a, pr.x)) == MC_KV_IN_PROG)
            ;
    }
    if (caught) {
        int64_t t0 = now_ms();
        OK(pr.a, P->release_xfer(pr.a, pr.x)); /* in flight, the peer stopped */
        assert_true(now_ms() - t0 < 1000);
    }
    kill(pr.peer.pid, SIGCONT); /* before any assertion: a failed one leaves the peer running */
    assert_true(caught);
    /* The bytes of the released READ settle: a READ of the same range completes after them. */
    l = (mc_kv_desc_t){(uintptr_t)pr.mem, 4096, 0, pr.md};
    memcpy(&r.addr, pr.peer.pub + 8, 8);
    r = (mc_kv_desc_t){r.addr, 4096, 0, pr.rmd};
    OK(pr.a, P->prep_xfer(pr.a, MC_KV_READ, &l, &r, 1, "peer", &pr.x));
    assert_int_equal(run(pr.a, pr.x, NULL), MC_KV_SUCCESS);
    sleep_ms(200);
    OK(pr.a, P->gen_notif(pr.a, "peer", "after", 5));
    for (int i = 0; i + 1 < tries; i++) { /* the posts that completed, then the marker */
        snprintf(msg, sizeof(msg), "try-%d", i);
        peer_expect_notif(&pr.peer, msg, 10000);
    }
    peer_expect_notif(&pr.peer, "after", 10000);
    peer_expect_notif(&pr.peer, NULL, 300); /* not the released one's, late */

    /* Completed, never checked, released: delivered once. */
    OK(pr.a, P->prep_xfer(pr.a, MC_KV_READ, &l, &r, 1, "peer", &y));
    st = P->post_xfer(pr.a, y, "kept", 4);
    assert_true(st == MC_KV_IN_PROG || st == MC_KV_SUCCESS);
    peer_expect_notif(&pr.peer, "kept", 10000);
    OK(pr.a, P->release_xfer(pr.a, y));
    OK(pr.a, P->gen_notif(pr.a, "peer", "marker", 6));
    peer_expect_notif(&pr.peer, "marker", 10000);
    peer_expect_notif(&pr.peer, NULL, 300);
    peer_stop(&pr.peer);
    peer_read_teardown(&pr);
}

/* The peer is killed while a large READ from it is in flight: check says REMOTE_DISCONNECT
 * within seconds, with a message; new transfers to it fail the same way. */
static void test_peer_death(void **state)
{
    peer_read_t pr;
    mc_kv_status_t st = MC_KV_IN_PROG;
    int64_t t0;

    (void)state;
    peer_read_setup(&pr);
    /* Repeat until a post is caught in flight (256 MiB over loopback tcp takes ~0.1 s). */
    for (int i = 0; i < 20 && st != MC_KV_ERR_REMOTE_DISCONNECT; i++) {
        st = P->post_xfer(pr.a, pr.x, NULL, 0);
        assert_true(st == MC_KV_IN_PROG || st == MC_KV_SUCCESS);
        if (st == MC_KV_SUCCESS)
            continue;
        kill(pr.peer.pid, SIGKILL);
        t0 = now_ms();
        while ((st = P->check_xfer(pr.a, pr.x)) == MC_KV_IN_PROG && now_ms() - t0 < 20000)
            sleep_ms(1);
        if (st == MC_KV_SUCCESS) /* it finished just before the kill */
            break;
        assert_int_equal(st, MC_KV_ERR_REMOTE_DISCONNECT);
        assert_true(now_ms() - t0 < 5000);
        assert_non_null(strstr(P->last_error(pr.a), "agent 'peer' failed"));
    }
    if (st != MC_KV_ERR_REMOTE_DISCONNECT) { /* killed after completing: a new post sees it */
        kill(pr.peer.pid, SIGKILL);
        t0 = now_ms();
        assert_int_equal(run(pr.a, pr.x, NULL), MC_KV_ERR_REMOTE_DISCONNECT);
        assert_true(now_ms() - t0 < 5000);
    }
    assert_int_equal(run(pr.a, pr.x, NULL), MC_KV_ERR_REMOTE_DISCONNECT);
    waitpid(pr.peer.pid, NULL, 0);
    pr.peer.pid = 0;
    close(pr.peer.sock);
    peer_read_teardown(&pr);
}

/* Two registrations that start at one address: a region's public data carries the key of that
 * registration, not of the other (the one the engine picks by address alone), so the region
 * stays reachable when the other goes. Over rdma (ctest test_kv_plugin_rdma) the other's key
 * is another memory region: a WRITE with it after its deregistration failed. */
static void test_public_key_of_region(void **state)
{
    const char *protocol = getenv("KV_TEST_PROTOCOL");
    mc_kv_backend_t *a = agent_create("A", protocol), *b = agent_create("B", protocol);
    uint8_t *ma = aligned_alloc(4096, SZ), *mb = aligned_alloc(4096, SZ);
    mc_kv_md_t *mda = reg(a, ma, SZ), *whole, *head, *rb;
    mc_kv_desc_t l = {(uintptr_t)ma, 4096, 0, mda}, r = {(uintptr_t)mb, 4096, 0, NULL};
    mc_kv_xfer_t *x;

    (void)state;
    fill(ma, SZ, 5, 0);
    memset(mb, 0, SZ);
    whole = reg(b, mb, SZ);
    head = reg(b, mb, 64 << 10); /* newer, the same start */
    introduce(a, b, "B");
    rb = load_region(a, "B", b, whole);
    OK(a, P->connect(a, "B"));
    OK(b, P->deregister_mem(b, head));
    r.md = rb;
    OK(a, P->prep_xfer(a, MC_KV_WRITE, &l, &r, 1, "B", &x));
    OK(a, run(a, x, NULL));
    assert_int_equal(check(mb, 4096, 5, 0), -1);
    OK(a, P->release_xfer(a, x));
    OK(a, P->unload_md(a, rb));
    OK(a, P->disconnect(a, "B"));
    OK(a, P->deregister_mem(a, mda));
    OK(b, P->deregister_mem(b, whole));
    P->destroy(a);
    P->destroy(b);
    free(ma);
    free(mb);
}

/* The plugin's table has no progress call: without the engine's thread, connect waits by
 * running passes itself, and with PROGRESS_IMPLICIT=0 as well check_xfer and get_notif are the
 * host's progress (a transfer stayed in progress for good, a connect timed out). */
static void test_host_progress(void **state)
{
    static const mc_kv_option_t no_thread[] = {{"PROGRESS_THREAD", "0", NULL}, {NULL, NULL, NULL}},
                                by_host[] = {{"PROGRESS_THREAD", "false", NULL},
                                             {"PROGRESS_IMPLICIT", "off", NULL},
                                             {NULL, NULL, NULL}};
    mc_kv_notif_t *n = malloc(sizeof(*n));

    (void)state;
    for (int mode = 0; mode < 2; mode++) {
        mc_kv_backend_t *a = agent_create_with("A", "tcp", mode ? by_host : no_thread),
                        *b = agent_create("B", "tcp");
        uint8_t *ma = aligned_alloc(4096, SZ), *mb = aligned_alloc(4096, SZ);
        mc_kv_md_t *mda = reg(a, ma, SZ), *mdb = reg(b, mb, SZ), *rb;
        mc_kv_desc_t l = {(uintptr_t)ma, SZ, 0, mda}, r = {(uintptr_t)mb, SZ, 0, NULL};
        mc_kv_status_t st;
        mc_kv_xfer_t *x;

        fill(ma, SZ, 6 + mode, 0);
        memset(mb, 0, SZ);
        introduce(a, b, "B");
        introduce(b, a, "A");
        OK(a, P->connect(a, "B"));
        r.md = rb = load_region(a, "B", b, mdb);
        OK(a, P->prep_xfer(a, MC_KV_WRITE, &l, &r, 1, "B", &x));
        st = P->post_xfer(a, x, "landed", 6);
        for (int64_t end = now_ms() + 30000; st == MC_KV_IN_PROG && now_ms() < end;) {
            sleep_ms(1); /* a host that checks now and then, not a spinning one */
            st = P->check_xfer(a, x);
        }
        assert_int_equal(st, MC_KV_SUCCESS);
        assert_int_equal(check(mb, SZ, 6 + mode, 0), -1);
        assert_int_equal(wait_notif(b, n, 10000), 1);
        assert_true(n->len == 6 && !memcmp(n->msg, "landed", 6));
        OK(b, P->gen_notif(b, "A", "seen", 4));
        assert_int_equal(wait_notif(a, n, 10000), 1);
        assert_true(n->len == 4 && !memcmp(n->msg, "seen", 4) && !strcmp(n->agent, "B"));
        OK(a, P->release_xfer(a, x));
        OK(a, P->unload_md(a, rb));
        OK(a, P->disconnect(a, "B"));
        OK(b, P->disconnect(b, "A"));
        OK(a, P->deregister_mem(a, mda));
        OK(b, P->deregister_mem(b, mdb));
        P->destroy(a);
        P->destroy(b);
        free(ma);
        free(mb);
    }
    free(n);
}

int main(int argc, char **argv)
{
    const char *dir = getenv("MC_BUILD_DIR");
    char err[512];

    snprintf(plugin_path, sizeof(plugin_path), "%s/lib/libmooncake_kv.so", dir ? dir : "build");
    if (mc_kv_load(plugin_path, MC_KV_ABI_CURRENT, &loaded, err, sizeof(err))) {
        fprintf(stderr, "test_kv_plugin: %s\n", err);
        return 1;
    }
    P = loaded->plugin;
    if (argc == 4 && !strcmp(argv[1], "--kv-peer"))
        return peer_main(atoi(argv[2]), argv[3]);
    signal(SIGPIPE, SIG_IGN);

    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_load_and_symbols),
        cmocka_unit_test(test_abi_negotiation),
        cmocka_unit_test(test_host_checks),
        cmocka_unit_test(test_bad_options),
        cmocka_unit_test(test_every_operation),
        cmocka_unit_test(test_bad_conn_info),
        cmocka_unit_test(test_empty_transfer_keeps_agent),
        cmocka_unit_test(test_destroy_with_handles),
        cmocka_unit_test(test_xfer_limit),
        cmocka_unit_test(test_transfer_shm),
        cmocka_unit_test(test_transfer_tcp),
        cmocka_unit_test(test_100k_descriptors),
        cmocka_unit_test(test_merging),
        cmocka_unit_test(test_file_regions),
        cmocka_unit_test(test_notif_order),
        cmocka_unit_test(test_notif_sender),
        cmocka_unit_test(test_notif_plain),
        cmocka_unit_test(test_notif_window),
        cmocka_unit_test(test_concurrent_handles),
        cmocka_unit_test(test_repost_and_release),
        cmocka_unit_test(test_spare_handles),
        cmocka_unit_test(test_peer_process),
        cmocka_unit_test(test_spinning_check),
        cmocka_unit_test(test_timeout_not_disconnect),
        cmocka_unit_test(test_release_notif),
        cmocka_unit_test(test_peer_death),
        cmocka_unit_test(test_public_key_of_region),
        cmocka_unit_test(test_host_progress),
    };
    if (getenv("KV_TEST_FILTER")) /* (a glob: one case, as the rdma run does) */
        cmocka_set_test_filter(getenv("KV_TEST_FILTER"));
    int rc = cmocka_run_group_tests(tests, NULL, NULL);

    mc_kv_unload(loaded);
    return rc;
}
