/* Integration test harness: see harness.h. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <fcntl.h>
#include <dirent.h>
#include <ftw.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#include "harness.h"

#define SETUP_TIMEOUT_MS 30000
#define MAX_CHILDREN     64

static th_target_t *children[MAX_CHILDREN]; /* spawned and not yet reaped */

/* ---- small utilities ---------------------------------------------------------------------- */

/* Whether every thread of pid is stopped ('T' in /proc/PID/task/TID/stat). */
static int all_stopped(pid_t pid)
{
    char path[320], buf[512];
    struct dirent *d;
    int n = 0, stopped = 0;

    snprintf(path, sizeof(path), "/proc/%d/task", (int)pid);
    DIR *dir = opendir(path);
    while (dir && (d = readdir(dir))) {
        if (d->d_name[0] == '.')
            continue;
        snprintf(path, sizeof(path), "/proc/%d/task/%s/stat", (int)pid, d->d_name);
        FILE *f = fopen(path, "r");
        const char *p = f && fgets(buf, sizeof(buf), f) ? strrchr(buf, ')') : NULL;
        n++;
        stopped += p && p[1] == ' ' && p[2] == 'T';
        if (f)
            fclose(f);
    }
    if (dir)
        closedir(dir);
    return n > 0 && stopped == n;
}

void th_stop(pid_t pid)
{
    int64_t dl = th_now_ms() + 5000;

    assert_int_equal(kill(pid, SIGSTOP), 0);
    while (!all_stopped(pid) && th_now_ms() < dl)
        th_sleep_ms(1);
    assert_true(all_stopped(pid));
}

unsigned th_listen_port(pid_t pid)
{
    char line[512], pat[32];
    unsigned port = 0;
    FILE *f = popen("ss -Htlnp 2>/dev/null", "r");

    if (!f)
        return 0;
    snprintf(pat, sizeof(pat), "pid=%d,", (int)pid);
    while (fgets(line, sizeof(line), f)) {
        char *a = strstr(line, "127.0.0.1:");
        if (strstr(line, pat) && a)
            port = (unsigned)atoi(a + 10);
    }
    pclose(f);
    return port;
}

unsigned th_kill_conns(unsigned port)
{
    char cmd[160], line[512];
    unsigned n = 0;

    snprintf(cmd, sizeof(cmd),
             "ss -HK state established '( sport = :%u or dport = :%u )' 2>/dev/null", port, port);
    FILE *f = popen(cmd, "r");
    if (!f)
        return 0;
    while (fgets(line, sizeof(line), f))
        n++;
    pclose(f);
    return n;
}

int64_t th_now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int th_sv_ctl(const char *dir, const char *dev, const char *text)
{
    char tmp[600], path[600];
    FILE *f;

    snprintf(tmp, sizeof(tmp), "%s/.%s.tmp", dir, dev);
    snprintf(path, sizeof(path), "%s/%s", dir, dev);
    if (!(f = fopen(tmp, "w")))
        return -1;
    int rc = fputs(text, f) >= 0 ? 0 : -1;
    if (fclose(f) || rc || rename(tmp, path))
        return -1;
    return 0;
}

void th_sleep_ms(int ms)
{
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000};

    while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
        ;
}

int th_contains(const char *haystack, const char *needle)
{
    return haystack && strcasestr(haystack, needle) != NULL;
}

int th_listed(const char *list, const char *item)
{
    size_t n = strlen(item);

    for (const char *p = list; *p; p += strcspn(p, ",") + (p[strcspn(p, ",")] == ','))
        if (strcspn(p, ",") == n && !strncmp(p, item, n))
            return 1;
    return 0;
}

static uint64_t splitmix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static uint8_t pattern_byte(uint64_t seed, uint64_t i)
{
    return (uint8_t)(splitmix(seed * 0x100000001b3ull + i / 8) >> (8 * (i % 8)));
}

void th_fill_at(void *dst, size_t len, uint64_t seed, uint64_t off)
{
    uint8_t *p = dst;

    for (size_t i = 0; i < len; i++) {
        uint64_t pos = off + i;
        if (pos % 8 == 0 && i + 8 <= len) {
            uint64_t w = splitmix(seed * 0x100000001b3ull + pos / 8);
            memcpy(p + i, &w, 8); /* little-endian host: the same bytes as pattern_byte */
            i += 7;
            continue;
        }
        p[i] = pattern_byte(seed, pos);
    }
}

void th_fill(void *dst, size_t len, uint64_t seed)
{
    th_fill_at(dst, len, seed, 0);
}

int64_t th_check_at(const void *p, size_t len, uint64_t seed, uint64_t off)
{
    const uint8_t *b = p;

    for (size_t i = 0; i < len; i++) {
        uint64_t pos = off + i;
        if (pos % 8 == 0 && i + 8 <= len) {
            uint64_t w = splitmix(seed * 0x100000001b3ull + pos / 8), got;
            memcpy(&got, b + i, 8);
            if (got == w) {
                i += 7;
                continue;
            }
        }
        if (b[i] != pattern_byte(seed, pos))
            return (int64_t)i;
    }
    return -1;
}

int64_t th_check(const void *p, size_t len, uint64_t seed)
{
    return th_check_at(p, len, seed, 0);
}

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st, (void)flag, (void)ftw;
    return remove(path);
}

void th_tmpdir(char *out, size_t size)
{
    snprintf(out, size, "/tmp/mc-test-XXXXXX");
    assert_non_null(mkdtemp(out));
}

void th_rmdir(const char *dir)
{
    if (dir && dir[0])
        nftw(dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

/* ---- socket I/O with deadlines ------------------------------------------------------------ */

static int io_full(int fd, void *buf, size_t len, int writing, int64_t deadline)
{
    uint8_t *p = buf;

    while (len) {
        struct pollfd pfd = {.fd = fd, .events = writing ? POLLOUT : POLLIN};
        int64_t left = deadline - th_now_ms();
        if (left <= 0)
            return -ETIMEDOUT;
        int n = poll(&pfd, 1, (int)(left > 1000 ? 1000 : left));
        if (n < 0 && errno != EINTR)
            return -errno;
        if (n <= 0)
            continue;
        ssize_t r = writing ? send(fd, p, len, MSG_NOSIGNAL) : recv(fd, p, len, 0);
        if (r == 0)
            return -EPIPE;
        if (r < 0) {
            if (errno == EINTR || errno == EAGAIN)
                continue;
            return -errno;
        }
        p += r;
        len -= (size_t)r;
    }
    return 0;
}

int th_io_full(int fd, void *buf, size_t len, int writing, int timeout_ms)
{
    return io_full(fd, buf, len, writing,
                   timeout_ms == INT32_MAX ? INT64_MAX : th_now_ms() + timeout_ms);
}

pid_t th_spawn_self(const char *flag, int *sock_p)
{
    char exe[4096], fdstr[16];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    pid_t parent = getpid(), pid;
    int sv[2];

    assert_true(n > 0);
    exe[n] = 0;
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    snprintf(fdstr, sizeof(fdstr), "%d", sv[1]);
    pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent)
            _exit(1);
        fcntl(sv[1], F_SETFD, 0);
        execl(exe, exe, flag, fdstr, (char *)NULL);
        _exit(127);
    }
    close(sv[1]);
    *sock_p = sv[0];
    return pid;
}

void th_child_reap(pid_t *pid_p, int *sock_p)
{
    if (*pid_p > 0) {
        kill(*pid_p, SIGKILL);
        while (waitpid(*pid_p, NULL, 0) < 0 && errno == EINTR)
            ;
        *pid_p = 0;
    }
    if (*sock_p >= 0)
        close(*sock_p);
    *sock_p = -1;
}

/* ---- the child ---------------------------------------------------------------------------- */

typedef struct child_engine {
    mc_engine_t *e;
    void *buf[TH_MAX_BUFS];
    atomic_uint received, bad_order, bad_payload, bad_sender;
    char first_sender[MC_NAME_MAX];
    atomic_bool echo;          /* send every message back */
    atomic_uint echo_errors;   /* sends back that failed (a full window is not a failure) */
    mc_segment_id_t echo_peer; /* the sender, opened on its first message */
    bool echo_opened;
    /* Echoes the window refused (-EAGAIN), in order: echo_retry sends them from a thread of
     * its own, and later ones queue behind them (a callback cannot wait for room: the answers
     * that make it come in the pass it runs in). */
    pthread_mutex_t echo_lock;
    struct echo_item *echo_head, **echo_tail;
    pthread_t echo_thread; /* runs while echo is on */
    bool echo_thread_on;
} child_engine_t;

typedef struct echo_item {
    struct echo_item *next;
    size_t len;
    uint8_t data[];
} echo_item_t;

static th_target_opts_t c_opts;
static child_engine_t c_eng[TH_MAX_ENGINES];

/* Message payload: u32 sequence number, then pattern bytes of seed 1000 + seq. */
/* Message n (from 0) is the u32 n then stream 1000 + n, cut to its length (0 to 3 bytes: the
 * first bytes of n only). */
static void child_msg_cb(void *arg, const char *sender, uint8_t id, const void *data, size_t len)
{
    child_engine_t *ce = arg;
    unsigned n = atomic_load(&ce->received);
    uint32_t want = n;

    if (id != TH_MSG_ID || (len && memcmp(data, &want, len < 4 ? len : 4)))
        atomic_fetch_add(&ce->bad_order, 1);
    else if (len > 4 && th_check((const uint8_t *)data + 4, len - 4, 1000 + n) >= 0)
        atomic_fetch_add(&ce->bad_payload, 1);
    if (n == 0)
        snprintf(ce->first_sender, sizeof(ce->first_sender), "%s", sender);
    else if (strcmp(ce->first_sender, sender))
        atomic_fetch_add(&ce->bad_sender, 1);
    atomic_store(&ce->received, n + 1);
    if (!atomic_load(&ce->echo))
        return;
    if (!ce->echo_opened && mc_segment_open_nb(ce->e, sender, &ce->echo_peer) == 0)
        ce->echo_opened = true;
    if (!ce->echo_opened) {
        atomic_fetch_add(&ce->echo_errors, 1);
        return;
    }
    pthread_mutex_lock(&ce->echo_lock);
    if (!atomic_load(&ce->echo)) { /* stopped meanwhile: echo_set dropped what waited */
        pthread_mutex_unlock(&ce->echo_lock);
        return;
    }
    int rc = ce->echo_head ? -EAGAIN : mc_msg_send(ce->e, ce->echo_peer, TH_ECHO_ID, data, len);
    echo_item_t *it = rc == -EAGAIN ? malloc(sizeof(*it) + len) : NULL;
    if (it) {
        it->next = NULL;
        it->len = len;
        memcpy(it->data, data, len);
        *ce->echo_tail = it;
        ce->echo_tail = &it->next;
        rc = 0;
    }
    pthread_mutex_unlock(&ce->echo_lock);
    if (rc)
        atomic_fetch_add(&ce->echo_errors, 1);
}

/* Send the refused echoes again, in order, while echo is on. */
static void *echo_retry(void *arg)
{
    child_engine_t *ce = arg;

    while (atomic_load(&ce->echo)) {
        pthread_mutex_lock(&ce->echo_lock);
        echo_item_t *it = ce->echo_head; /* only this thread takes it off */
        pthread_mutex_unlock(&ce->echo_lock);
        int rc = it ? mc_msg_send(ce->e, ce->echo_peer, TH_ECHO_ID, it->data, it->len) : -EAGAIN;
        if (rc == -EAGAIN) {
            th_sleep_ms(1);
            continue;
        }
        if (rc)
            atomic_fetch_add(&ce->echo_errors, 1);
        pthread_mutex_lock(&ce->echo_lock);
        if (!(ce->echo_head = it->next))
            ce->echo_tail = &ce->echo_head;
        pthread_mutex_unlock(&ce->echo_lock);
        free(it);
    }
    return NULL;
}

/* Echo or not (TH_CMD_ECHO); echoes still refused when it stops are counted as errors. */
static void echo_set(child_engine_t *ce, bool on)
{
    atomic_store(&ce->echo, on);
    if (on && !ce->echo_thread_on)
        ce->echo_thread_on = !pthread_create(&ce->echo_thread, NULL, echo_retry, ce);
    if (on && !ce->echo_thread_on)
        atomic_store(&ce->echo, false);
    if (on || !ce->echo_thread_on)
        return;
    pthread_join(ce->echo_thread, NULL);
    ce->echo_thread_on = false;
    pthread_mutex_lock(&ce->echo_lock);
    while (ce->echo_head) {
        echo_item_t *it = ce->echo_head;
        ce->echo_head = it->next;
        free(it);
        atomic_fetch_add(&ce->echo_errors, 1);
    }
    ce->echo_tail = &ce->echo_head;
    pthread_mutex_unlock(&ce->echo_lock);
}

static int child_engine_setup(unsigned j, child_engine_t *ce, char *err, size_t errsz)
{
    th_cfg_t cfg = c_opts.cfg;
    const char *loc = c_opts.location[0] ? c_opts.location : "cpu:0";
    const char *name = th_get(&cfg, "SEGMENT_NAME");
    mc_config_t *conf = NULL;
    int rc;

    pthread_mutex_init(&ce->echo_lock, NULL);
    ce->echo_tail = &ce->echo_head;
    th_set(&cfg, "PROGRESS_THREAD", "1"); /* the child blocks on its command socket */
    if (j > 0 && name && *name)
        th_set(&cfg, "SEGMENT_NAME", "%s-%u", th_get(&c_opts.cfg, "SEGMENT_NAME"), j);
    rc = mc_config_create(&conf);
    for (unsigned i = 0; !rc && i < cfg.n; i++)
        rc = mc_config_set(conf, cfg.v[i].name, cfg.v[i].value);
    if (!rc)
        rc = mc_engine_create(conf, &ce->e);
    mc_config_destroy(conf);
    if (rc)
        goto fail;
    for (unsigned i = 0; i < c_opts.n_bufs; i++) {
        if (c_opts.use_alloc) {
            rc = mc_mem_alloc(ce->e, c_opts.buf_size, loc, &ce->buf[i]);
            if (rc)
                goto fail;
        } else {
            /* Stays mapped even after unregistering, so a late stray write would show. */
            ce->buf[i] = mmap(NULL, c_opts.buf_size, PROT_READ | PROT_WRITE,
                              MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
            if (ce->buf[i] == MAP_FAILED)
                return snprintf(err, errsz, "mmap: %s", strerror(errno)), -ENOMEM;
        }
        th_fill(ce->buf[i], c_opts.buf_size, c_opts.seed + 16 * j + i);
        if (!c_opts.use_alloc && (rc = mc_mem_register(ce->e, ce->buf[i], c_opts.buf_size, loc)))
            goto fail;
    }
    return mc_msg_handler_set(ce->e, TH_MSG_ID, child_msg_cb, ce);
fail:
    snprintf(err, errsz, "engine %u: %s: %s", j, mc_err_name(rc), mc_last_error());
    return rc;
}

static int child_report(int fd)
{
    int64_t dl = th_now_ms() + SETUP_TIMEOUT_MS;

    for (unsigned j = 0; j < c_opts.n_engines; j++) {
        th_engine_info_t info = {0};
        size_t len = 0;
        mc_segment_export(c_eng[j].e, NULL, &len);
        uint8_t *blob = malloc(len);
        if (!blob || mc_segment_export(c_eng[j].e, blob, &len))
            return -1;
        snprintf(info.name, sizeof(info.name), "%s", mc_engine_segment_name(c_eng[j].e));
        for (unsigned i = 0; i < c_opts.n_bufs; i++)
            info.buf[i] = (uint64_t)(uintptr_t)c_eng[j].buf[i];
        info.blob_len = len;
        if (io_full(fd, &info, sizeof(info), 1, dl) || io_full(fd, blob, len, 1, dl))
            return -1;
        free(blob);
    }
    return 0;
}

static void child_notify(child_engine_t *ce, const th_cmd_t *c, th_reply_t *r)
{
    static mc_notify_t n;
    int64_t dl = th_now_ms() + (int64_t)c->a3;

    /* Only pop and sleep: the progress thread alone must make the data visible. */
    while (mc_notify_pop(ce->e, &n) != 1) {
        if (th_now_ms() > dl)
            return;
        th_sleep_ms(1);
    }
    r->v[0] = 1;
    r->v[1] = (int64_t)n.len;
    snprintf(r->str, sizeof(r->str), "%s", n.sender);
    memcpy(r->msg, n.msg, n.len < sizeof(r->msg) - 1 ? n.len : sizeof(r->msg) - 1);
    if (c->a1) {
        int64_t bad = th_check((void *)(uintptr_t)c->a0, c->a1, c->a2);
        r->rc = bad < 0 ? 0 : bad + 1;
    }
}

/* Pop what is queued (at least once, even with a timeout of 0), up to a0 notifications. */
static void child_pops(child_engine_t *ce, const th_cmd_t *c, th_reply_t *r)
{
    static mc_notify_t n;
    int64_t dl = th_now_ms() + (int64_t)c->a3;
    uint32_t want = (uint32_t)c->a1, seq;
    size_t len = c->a2 ? (size_t)c->a2 : 4;

    while ((uint64_t)r->v[0] < c->a0) {
        if (mc_notify_pop(ce->e, &n) != 1) {
            if (th_now_ms() >= dl)
                break;
            th_sleep_ms(1);
            continue;
        }
        memcpy(&seq, n.msg, 4);
        r->v[1] += n.len != len || seq != want;
        want = seq + 1;
        r->v[0]++;
    }
}

static void child_msgs(child_engine_t *ce, const th_cmd_t *c, th_reply_t *r)
{
    int64_t dl = th_now_ms() + (int64_t)c->a3;

    while (atomic_load(&ce->received) < c->a0 && th_now_ms() < dl)
        th_sleep_ms(5);
    r->v[0] = atomic_load(&ce->received);
    r->v[1] = atomic_load(&ce->bad_order);
    r->v[2] = atomic_load(&ce->bad_payload);
    r->v[3] = atomic_load(&ce->bad_sender);
    snprintf(r->str, sizeof(r->str), "%s", ce->first_sender);
}

/* A buffer registered after the start (engine memory with use_alloc), filled with stream a2. */
static void child_register(child_engine_t *ce, const th_cmd_t *c, th_reply_t *r)
{
    void *p = NULL;
    bool alloc = c_opts.use_alloc && !c->a0; /* (read-only: mapped here whatever the setup) */

    if (alloc) {
        r->rc = mc_mem_alloc(ce->e, c->a1, "cpu:0", &p);
    } else {
        p = mmap(NULL, c->a1, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        r->rc = p == MAP_FAILED ? -ENOMEM : 0;
    }
    if (r->rc)
        return;
    th_fill(p, c->a1, c->a2);
    if (c->a0 && mprotect(p, c->a1, PROT_READ)) {
        r->rc = -errno;
        munmap(p, c->a1);
        return;
    }
    if (!alloc && !r->rc)
        r->rc = mc_mem_register(ce->e, p, c->a1, "cpu:0");
    r->v[0] = (int64_t)(uintptr_t)p;
}

static void child_command(const th_cmd_t *c, th_reply_t *r)
{
    child_engine_t *ce = &c_eng[c->eng < c_opts.n_engines ? c->eng : 0];
    mc_counters_t cnt;
    int64_t bad;

    switch (c->op) {
    case TH_CMD_UNREGISTER:
        if (c_opts.use_alloc) {
            mc_mem_free(ce->e, ce->buf[c->a0]);
            r->rc = 0;
        } else {
            r->rc = mc_mem_unregister(ce->e, ce->buf[c->a0]);
            if (!r->rc && c->a1)
                r->rc = mc_mem_register(ce->e, ce->buf[c->a0], c_opts.buf_size,
                                        c_opts.location[0] ? c_opts.location : "cpu:0");
        }
        break;
    case TH_CMD_FILL:
        th_fill_at((void *)(uintptr_t)c->a0, c->a1, c->a2, c->a4);
        break;
    case TH_CMD_CHECK:
        bad = th_check_at((void *)(uintptr_t)c->a0, c->a1, c->a2, c->a4);
        r->rc = bad < 0 ? 0 : bad + 1;
        break;
    case TH_CMD_NOTIFY:
        child_notify(ce, c, r);
        break;
    case TH_CMD_MSGS:
        child_msgs(ce, c, r);
        break;
    case TH_CMD_POPS:
        child_pops(ce, c, r);
        break;
    case TH_CMD_REGISTER:
        child_register(ce, c, r);
        break;
    case TH_CMD_KEY:
        r->rc = mc_buffer_key_pack(ce->e, (void *)(uintptr_t)c->a0, r->msg);
        break;
    case TH_CMD_DESTROY:
        echo_set(ce, false);
        mc_engine_destroy(ce->e);
        ce->e = NULL;
        break;
    case TH_CMD_ADDRESS: {
        size_t len = sizeof(r->msg);
        r->rc = mc_engine_address(ce->e, r->msg, &len);
        r->v[0] = (int64_t)len;
        break;
    }
    case TH_CMD_STATS:
        r->rc = mc_stats_transport(ce->e, "tcp", &cnt);
        r->v[0] = (int64_t)cnt.bytes_read;
        r->v[1] = (int64_t)cnt.bytes_written;
        r->v[2] = (int64_t)cnt.bytes_served;
        r->v[3] = (int64_t)cnt.requests;
        r->v[4] = (int64_t)cnt.errors;
        r->v[5] = atomic_load(&ce->echo_errors);
        break;
    case TH_CMD_ECHO:
        echo_set(ce, c->a0 != 0);
        break;
    default:
        break;
    }
    if (r->rc < 0)
        snprintf(r->msg, sizeof(r->msg), "%s", mc_last_error());
}

static void child_main(int fd)
{
    struct {
        int32_t rc;
        char err[300];
    } hdr = {0};
    int64_t dl = th_now_ms() + SETUP_TIMEOUT_MS;

    if (io_full(fd, &c_opts, sizeof(c_opts), 0, dl))
        _exit(2);
    for (unsigned j = 0; j < c_opts.n_engines && !hdr.rc; j++)
        hdr.rc = child_engine_setup(j, &c_eng[j], hdr.err, sizeof(hdr.err));
    if (io_full(fd, &hdr, sizeof(hdr), 1, dl) || hdr.rc || child_report(fd))
        _exit(3);
    for (;;) {
        th_cmd_t c;
        th_reply_t r;
        if (io_full(fd, &c, sizeof(c), 0, INT64_MAX))
            _exit(0); /* the parent went away */
        memset(&r, 0, sizeof(r));
        if (c.op == TH_CMD_EXIT) {
            for (unsigned j = 0; j < c_opts.n_engines; j++) {
                echo_set(&c_eng[j], false);
                mc_engine_destroy(c_eng[j].e);
            }
            io_full(fd, &r, sizeof(r), 1, th_now_ms() + 5000);
            _exit(0);
        }
        child_command(&c, &r);
        if (io_full(fd, &r, sizeof(r), 1, th_now_ms() + 10000))
            _exit(4);
    }
}

void th_main(int argc, char **argv)
{
    if (argc == 3 && !strcmp(argv[1], "--th-child"))
        child_main(atoi(argv[2]));
    signal(SIGPIPE, SIG_IGN);
    if (getenv("TH_FILTER")) /* run only the tests whose names match (cmocka's glob) */
        cmocka_set_test_filter(getenv("TH_FILTER"));
}

/* ---- the parent --------------------------------------------------------------------------- */

void th_config(th_cfg_t *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    th_set(cfg, "METADATA", "none");
    th_set(cfg, "LISTEN", "127.0.0.1:0");
    const char *v = getenv("TH_VERBOSE"); /* set: info; "debug": debug */
    th_set(cfg, "LOG_LEVEL", "%s", !v ? "off" : strcmp(v, "debug") ? "info" : "debug");
}

void th_set(th_cfg_t *cfg, const char *name, const char *fmt, ...)
{
    unsigned i = 0;
    va_list ap;

    while (i < cfg->n && strcmp(cfg->v[i].name, name))
        i++;
    assert_true(i < TH_CFG_MAX && strlen(name) < sizeof(cfg->v[i].name));
    if (i == cfg->n)
        cfg->n++;
    snprintf(cfg->v[i].name, sizeof(cfg->v[i].name), "%s", name);
    va_start(ap, fmt);
    vsnprintf(cfg->v[i].value, sizeof(cfg->v[i].value), fmt, ap);
    va_end(ap);
}

const char *th_get(const th_cfg_t *cfg, const char *name)
{
    for (unsigned i = 0; i < cfg->n; i++)
        if (!strcmp(cfg->v[i].name, name))
            return cfg->v[i].value;
    return NULL;
}

mc_config_t *th_mc_config(const th_cfg_t *cfg)
{
    mc_config_t *conf = NULL;

    assert_int_equal(mc_config_create(&conf), 0);
    for (unsigned i = 0; i < cfg->n; i++) {
        int rc = mc_config_set(conf, cfg->v[i].name, cfg->v[i].value);
        if (rc)
            print_error("%s=%s: %s\n", cfg->v[i].name, cfg->v[i].value, mc_last_error());
        assert_int_equal(rc, 0);
    }
    return conf;
}

void th_target_opts_init(th_target_opts_t *o, const th_cfg_t *cfg, size_t buf_size)
{
    memset(o, 0, sizeof(*o));
    o->cfg = *cfg;
    o->n_engines = 1;
    o->n_bufs = 1;
    o->buf_size = buf_size;
    o->seed = 0x7a7a;
}

static void child_track(th_target_t *t, int add)
{
    for (int i = 0; i < MAX_CHILDREN; i++) {
        if (add ? children[i] == NULL : children[i] == t) {
            children[i] = add ? t : NULL;
            return;
        }
    }
}

static int spawn_read(th_target_t *t)
{
    struct {
        int32_t rc;
        char err[300];
    } hdr;
    int64_t dl = th_now_ms() + SETUP_TIMEOUT_MS;
    int rc = io_full(t->sock, &hdr, sizeof(hdr), 0, dl);

    if (rc)
        return rc;
    if (hdr.rc) {
        print_error("target child setup failed: %s\n", hdr.err);
        return hdr.rc;
    }
    for (unsigned j = 0; j < t->n_engines; j++) {
        th_engine_info_t *in = &t->eng[j];
        if ((rc = io_full(t->sock, in, sizeof(*in), 0, dl)))
            return rc;
        in->blob = malloc(in->blob_len);
        if (!in->blob)
            return -ENOMEM;
        if ((rc = io_full(t->sock, in->blob, in->blob_len, 0, dl)))
            return rc;
    }
    return 0;
}

int th_target_spawn(const th_target_opts_t *o, th_target_t *t)
{
    char fdstr[16], exe[4096];
    int sv[2], rc;
    pid_t parent = getpid();
    ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);

    memset(t, 0, sizeof(*t));
    t->sock = -1;
    if (n < 0 || o->n_engines < 1 || o->n_engines > TH_MAX_ENGINES || o->n_bufs < 1 ||
        o->n_bufs > TH_MAX_BUFS)
        return -EINVAL;
    exe[n] = 0;
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0)
        return -errno;
    snprintf(fdstr, sizeof(fdstr), "%d", sv[1]);
    char *argv[] = {exe, "--th-child", fdstr, NULL};
    pid_t pid = fork();
    if (pid < 0) {
        rc = -errno;
        close(sv[0]);
        close(sv[1]);
        return rc;
    }
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent)
            _exit(1);
        fcntl(sv[1], F_SETFD, 0);
        if (o->log_path[0]) {
            int lfd = open(o->log_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
            if (lfd < 0 || dup2(lfd, 2) < 0)
                _exit(126);
        }
        execv(exe, argv);
        _exit(127);
    }
    close(sv[1]);
    child_track(t, 1);
    t->pid = pid;
    t->sock = sv[0];
    t->n_engines = o->n_engines;
    t->buf_size = o->buf_size;
    rc = io_full(t->sock, (void *)o, sizeof(*o), 1, th_now_ms() + SETUP_TIMEOUT_MS);
    if (!rc)
        rc = spawn_read(t);
    if (rc)
        th_target_kill(t);
    return rc;
}

int th_target_cmd(th_target_t *t, const th_cmd_t *cmd, th_reply_t *rep, int timeout_ms)
{
    int64_t dl = th_now_ms() + timeout_ms;
    int rc = io_full(t->sock, (void *)cmd, sizeof(*cmd), 1, dl);

    if (!rc)
        rc = io_full(t->sock, rep, sizeof(*rep), 0, dl);
    return rc;
}

uint64_t th_register_keyed(th_target_t *t, mc_engine_t *e, mc_segment_id_t seg, size_t len,
                           uint64_t seed)
{
    return th_register_keyed_ro(t, e, seg, len, seed, false);
}

uint64_t th_register_keyed_ro(th_target_t *t, mc_engine_t *e, mc_segment_id_t seg, size_t len,
                              uint64_t seed, bool read_only)
{
    th_cmd_t c = {.op = TH_CMD_REGISTER, .a0 = read_only, .a1 = len, .a2 = seed};
    th_reply_t r;

    if (th_target_cmd(t, &c, &r, 30000) || r.rc)
        return 0;
    uint64_t addr = (uint64_t)r.v[0];
    c = (th_cmd_t){.op = TH_CMD_KEY, .a0 = addr + len - 1};
    if (th_target_cmd(t, &c, &r, 30000) || r.rc ||
        mc_segment_add_buffer(e, seg, r.msg, MC_BUFFER_KEY_SIZE))
        return 0;
    return addr;
}

int th_target_send(th_target_t *t, const th_cmd_t *cmd)
{
    return io_full(t->sock, (void *)cmd, sizeof(*cmd), 1, th_now_ms() + 10000);
}

int th_target_recv(th_target_t *t, th_reply_t *rep, int timeout_ms)
{
    return io_full(t->sock, rep, sizeof(*rep), 0, th_now_ms() + timeout_ms);
}

static void target_release(th_target_t *t)
{
    if (t->sock >= 0)
        close(t->sock);
    t->sock = -1;
    for (unsigned j = 0; j < TH_MAX_ENGINES; j++) {
        free(t->eng[j].blob);
        t->eng[j].blob = NULL;
    }
}

void th_target_kill(th_target_t *t)
{
    if (t->pid > 0) {
        kill(t->pid, SIGKILL);
        while (waitpid(t->pid, NULL, 0) < 0 && errno == EINTR)
            ;
        child_track(t, 0);
        t->pid = 0;
    }
    target_release(t);
}

int th_target_stop(th_target_t *t, int timeout_ms)
{
    th_cmd_t c = {.op = TH_CMD_EXIT};
    th_reply_t r;
    int status = -1;
    int64_t dl = th_now_ms() + timeout_ms;

    if (t->pid <= 0)
        return -1;
    th_target_cmd(t, &c, &r, timeout_ms);
    while (th_now_ms() < dl) {
        pid_t p = waitpid(t->pid, &status, WNOHANG);
        if (p == t->pid) {
            child_track(t, 0);
            t->pid = 0;
            target_release(t);
            return status;
        }
        th_sleep_ms(10);
    }
    th_target_kill(t);
    return -1;
}

void th_kill_all(void)
{
    for (int i = 0; i < MAX_CHILDREN; i++) {
        if (children[i])
            th_target_kill(children[i]);
    }
}

mc_engine_t *th_engine(const th_cfg_t *cfg)
{
    mc_config_t *conf = th_mc_config(cfg);
    mc_engine_t *e = NULL;
    int rc = mc_engine_create(conf, &e);

    mc_config_destroy(conf);
    if (rc)
        print_error("mc_engine_create: %s: %s\n", mc_err_name(rc), mc_last_error());
    assert_int_equal(rc, 0);
    return e;
}

mc_segment_id_t th_open(mc_engine_t *e, const th_target_t *t, unsigned eng)
{
    mc_segment_id_t id = MC_SEGMENT_INVALID;
    int rc = mc_segment_open_blob(e, t->eng[eng].blob, t->eng[eng].blob_len, &id);

    if (rc)
        print_error("mc_segment_open_blob: %s: %s\n", mc_err_name(rc), mc_last_error());
    assert_int_equal(rc, 0);
    return id;
}

void *th_buf(mc_engine_t *e, size_t len)
{
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

    assert_true(p != MAP_FAILED);
    assert_int_equal(mc_mem_register(e, p, len, "cpu:0"), 0);
    return p;
}

void th_buf_free(mc_engine_t *e, void *p, size_t len)
{
    assert_int_equal(mc_mem_unregister(e, p), 0);
    munmap(p, len);
}

void th_batch_destroy(mc_engine_t *e, mc_batch_t *b)
{
    int64_t dl = th_now_ms() + 10000;
    int rc;

    while ((rc = mc_batch_destroy(b)) == -EBUSY && th_now_ms() < dl) {
        mc_engine_progress(e);
        th_sleep_ms(1);
    }
    assert_int_equal(rc, 0);
}

int th_xfer(mc_engine_t *e, mc_opcode_t op, void *local, mc_segment_id_t seg, uint64_t remote,
            uint64_t len, char *reason, size_t reason_size)
{
    mc_batch_t *b;
    mc_request_t req = {
        .opcode = op, .local = local, .target = seg, .target_offset = remote, .length = len};
    mc_task_status_t st;
    int rc;

    assert_int_equal(mc_batch_create(e, 1, &b), 0);
    rc = mc_batch_submit(b, &req, 1, NULL);
    if (rc) {
        if (reason)
            snprintf(reason, reason_size, "%s", mc_last_error());
        assert_int_equal(mc_batch_destroy(b), 0);
        return rc;
    }
    assert_int_equal(mc_batch_wait(b, -1), 0);
    assert_int_equal(mc_task_status(b, 0, &st), 0);
    if (reason)
        snprintf(reason, reason_size, "%s", st.reason ? st.reason : "");
    rc = (int)st.state;
    if (st.state == MC_TASK_COMPLETED)
        assert_int_equal(st.bytes, len);
    th_batch_destroy(e, b);
    return rc;
}

void th_close(mc_engine_t *e, mc_segment_id_t seg)
{
    int64_t dl = th_now_ms() + 10000;
    int rc;

    while ((rc = mc_segment_close(e, seg)) == -EBUSY && th_now_ms() < dl) {
        mc_engine_progress(e);
        th_sleep_ms(1);
    }
    assert_int_equal(rc, 0);
}

mc_task_status_t th_xfer_req(mc_engine_t *e, const mc_request_t *r, const mc_submit_opts_t *opts)
{
    static char reason[512];
    mc_task_status_t st;
    mc_batch_t *b;

    assert_int_equal(mc_batch_create(e, 1, &b), 0);
    assert_int_equal(mc_batch_submit_ex(b, r, 1, opts), 0);
    assert_int_equal(mc_batch_wait(b, 30000), 0);
    assert_int_equal(mc_task_status(b, 0, &st), 0);
    snprintf(reason, sizeof(reason), "%s", st.reason ? st.reason : "");
    st.reason = reason;
    mc_batch_release(b);
    return st;
}

int64_t th_remote_check(th_target_t *t, unsigned eng, uint64_t addr, uint64_t len, uint64_t seed,
                        uint64_t off)
{
    th_cmd_t c = {.op = TH_CMD_CHECK, .eng = eng, .a0 = addr, .a1 = len, .a2 = seed, .a4 = off};
    th_reply_t r;

    assert_int_equal(th_target_cmd(t, &c, &r, 30000), 0);
    return r.rc - 1;
}

void th_remote_fill(th_target_t *t, unsigned eng, uint64_t addr, uint64_t len, uint64_t seed,
                    uint64_t off)
{
    th_cmd_t c = {.op = TH_CMD_FILL, .eng = eng, .a0 = addr, .a1 = len, .a2 = seed, .a4 = off};
    th_reply_t r;

    assert_int_equal(th_target_cmd(t, &c, &r, 30000), 0);
}
