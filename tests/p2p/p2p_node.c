/*
 * p2p_node: one P2P node in its own process, driven line by line on stdin by the P2P tests
 * (tests/p2p/p2p_test.h). Settings come from the environment (MC_METADATA, MC_LISTEN, ...).
 * Every command gets one reply line on stdout: "ok ..." or "err CODE reason".
 *
 *   segment                                   ok SEGMENT
 *   publish NAME SIZE SEED SHARD NBUFS [force]   the pattern of SEED in NBUFS buffers
 *   serve NAME SIZE SEED NBUFS                ok, or err (-EILSEQ if SEED is not the object's)
 *   fetch NAME SIZE NBUFS [inflight=N] [random=1] [origin_only=1] [no_serve=1]
 *         [timeout=MS] [rate=B/s]             starts a fetch in a thread: ok
 *   wait MS                                   ok RC DONE ORIGIN REPLICAS CORRUPT RETRIES, or
 *                                             err -ETIMEDOUT if the fetch is still running
 *   progress                                  ok DONE ORIGIN REPLICAS CORRUPT RETRIES
 *   check SEED                                ok, or err 1 OFFSET (first wrong byte)
 *   flip OFFSET                               one byte of the held buffers inverted
 *   stat NAME                                 ok SIZE SHARDS HOLDERS COMPLETE
 *   unregister NAME KEEP | delete NAME | remove NAME KEEP
 *   exit
 *
 * One object at a time: unregister/delete frees the buffers for the next command. The node
 * dies with its parent (PR_SET_PDEATHSIG), so a crashed test leaves no process behind.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <mooncake/p2p.h>

#include "p2p_pattern.h"

#define NODE_MAX_BUFS 8

static mc_p2p_t *node;

/* A set of buffers holding one object. */
typedef struct bufset {
    mc_p2p_buf_t b[NODE_MAX_BUFS];
    size_t n;
} bufset_t;

/* The object of the node's latest publish, serve or fetch. held: the library may use it (a
 * command that fails must not free it: a publish of a name held already, for one). */
static bufset_t cur;
static bool cur_held;

/* The fetch thread's state, under fetch_lock. */
static pthread_mutex_t fetch_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t fetch_cond = PTHREAD_COND_INITIALIZER;
static pthread_t fetch_tid;
static bool fetching, fetch_ended;
static int fetch_rc;
static mc_p2p_progress_t fetch_prog;
static char fetch_name[MC_P2P_NAME_MAX];
static mc_p2p_get_opts_t fetch_opts;
static bufset_t fetch_set;

static void reply_err(int rc)
{
    printf("err %d %s\n", rc, mc_p2p_last_error());
}

static void bufset_free(bufset_t *s)
{
    for (size_t i = 0; i < s->n; i++)
        free(s->b[i].addr);
    s->n = 0;
}

/* Cut size bytes into n buffers of uneven lengths, so that shards straddle them. */
static int bufset_alloc(bufset_t *s, uint64_t size, size_t n)
{
    uint64_t left = size;

    s->n = 0;
    if (n < 1 || n > NODE_MAX_BUFS || n > size)
        return -EINVAL;
    for (size_t i = 0; i < n; i++) {
        uint64_t len = size / n;
        if (i % 2 == 0 && len > 2 * 1237)
            len -= 1237;
        else if (i % 2 == 1)
            len += 1237;
        if (i == n - 1 || len > left - (n - 1 - i))
            len = i == n - 1 ? left : left - (n - 1 - i);
        s->b[i].len = len ? len : 1;
        s->b[i].addr = malloc(s->b[i].len);
        if (!s->b[i].addr) {
            bufset_free(s);
            return -ENOMEM;
        }
        s->n = i + 1;
        left -= s->b[i].len;
    }
    return 0;
}

/* s becomes the current object (the previous one is freed unless the library holds it). */
static void bufset_adopt(bufset_t *s)
{
    if (!cur_held)
        bufset_free(&cur);
    cur = *s;
    cur_held = true;
}

static void fill(bufset_t *s, uint64_t seed)
{
    uint64_t off = 0;

    for (size_t i = 0; i < s->n; off += s->b[i].len, i++)
        pattern_fill(s->b[i].addr, s->b[i].len, seed, off);
}

static int progress_cb(void *arg, const mc_p2p_progress_t *p)
{
    (void)arg;
    pthread_mutex_lock(&fetch_lock);
    fetch_prog = *p;
    pthread_mutex_unlock(&fetch_lock);
    return 0;
}

static void *fetch_thread(void *arg)
{
    mc_p2p_progress_t p = {0};
    int rc = mc_p2p_get_replica(node, fetch_name, fetch_set.b, fetch_set.n, &fetch_opts, &p);

    (void)arg;
    if (rc)
        fprintf(stderr, "p2p_node: fetch %s: %s\n", fetch_name, mc_p2p_last_error());
    pthread_mutex_lock(&fetch_lock);
    fetch_rc = rc;
    fetch_prog = p;
    if (rc && rc != -EBUSY)
        cur_held = false; /* nothing is held after a failed fetch (-EBUSY: the engine may) */
    fetch_ended = true;
    pthread_cond_broadcast(&fetch_cond);
    pthread_mutex_unlock(&fetch_lock);
    return NULL;
}

/* key=value options of fetch. */
static int fetch_option(const char *kv)
{
    unsigned long long v;
    char key[32];

    if (sscanf(kv, "%31[a-z_]=%llu", key, &v) != 2)
        return -EINVAL;
    if (!strcmp(key, "inflight"))
        fetch_opts.max_inflight = (unsigned)v;
    else if (!strcmp(key, "random"))
        fetch_opts.order = v ? MC_P2P_RANDOM : MC_P2P_RAREST_FIRST;
    else if (!strcmp(key, "origin_only"))
        fetch_opts.origin_only = (int)v;
    else if (!strcmp(key, "no_serve"))
        fetch_opts.no_serve = (int)v;
    else if (!strcmp(key, "timeout"))
        fetch_opts.shard_timeout_ms = (unsigned)v;
    else if (!strcmp(key, "rate"))
        fetch_opts.max_rate = v;
    else
        return -EINVAL;
    return 0;
}

static void cmd_fetch(char *args)
{
    unsigned long long size;
    unsigned n;
    int pos = 0;
    char *tok;

    if (fetching || sscanf(args, "%128s %llu %u %n", fetch_name, &size, &n, &pos) < 3) {
        printf("err %d usage, or a fetch is under way\n", -EINVAL);
        return;
    }
    fetch_opts = (mc_p2p_get_opts_t){.size = sizeof(fetch_opts), .cb = progress_cb};
    for (tok = strtok(args + pos, " "); tok; tok = strtok(NULL, " "))
        if (fetch_option(tok)) {
            printf("err %d bad option %s\n", -EINVAL, tok);
            return;
        }
    if (bufset_alloc(&fetch_set, size, n)) {
        printf("err %d cannot allocate\n", -ENOMEM);
        return;
    }
    bufset_adopt(&fetch_set);
    fetch_ended = false;
    fetch_prog = (mc_p2p_progress_t){0};
    fetching = pthread_create(&fetch_tid, NULL, fetch_thread, NULL) == 0;
    printf(fetching ? "ok\n" : "err -1 no thread\n");
}

static void cmd_wait(char *args)
{
    struct timespec ts;
    int ms = atoi(args);

    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += ms / 1000;
    ts.tv_nsec += (long)(ms % 1000) * 1000000;
    if (ts.tv_nsec >= 1000000000) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000;
    }
    pthread_mutex_lock(&fetch_lock);
    while (fetching && !fetch_ended && pthread_cond_timedwait(&fetch_cond, &fetch_lock, &ts) == 0)
        ;
    bool ended = fetch_ended;
    pthread_mutex_unlock(&fetch_lock);
    if (!fetching || !ended) {
        printf("err %d %s\n", -ETIMEDOUT, fetching ? "still fetching" : "no fetch");
        return;
    }
    pthread_join(fetch_tid, NULL);
    fetching = false;
    printf("ok %d %u %" PRIu64 " %" PRIu64 " %u %u\n", fetch_rc, fetch_prog.shards_done,
           fetch_prog.bytes_from_origin, fetch_prog.bytes_from_replicas, fetch_prog.corrupt,
           fetch_prog.retries);
}

static void cmd_progress(void)
{
    pthread_mutex_lock(&fetch_lock);
    mc_p2p_progress_t p = fetch_prog;
    pthread_mutex_unlock(&fetch_lock);
    printf("ok %u %" PRIu64 " %" PRIu64 " %u %u\n", p.shards_done, p.bytes_from_origin,
           p.bytes_from_replicas, p.corrupt, p.retries);
}

static void cmd_publish(char *args, bool serve)
{
    char name[MC_P2P_NAME_MAX], force[8] = "";
    unsigned long long size, seed, shard = 0;
    unsigned n;
    int got =
        serve ? sscanf(args, "%128s %llu %llu %u", name, &size, &seed, &n)
              : sscanf(args, "%128s %llu %llu %llu %u %7s", name, &size, &seed, &shard, &n, force);
    bufset_t s;
    int rc;

    if (got < 4 || (!serve && got < 5) || bufset_alloc(&s, size, n)) {
        printf("err %d usage\n", -EINVAL);
        return;
    }
    fill(&s, seed);
    if (serve) {
        rc = mc_p2p_serve(node, name, s.b, s.n);
    } else {
        mc_p2p_register_opts_t o = {
            .size = sizeof(o), .shard_size = shard, .force = !strcmp(force, "force")};
        rc = mc_p2p_register(node, name, s.b, s.n, &o);
    }
    if (rc == -EBUSY) /* the engine may still use them: freed at exit, after the node */
        bufset_adopt(&s);
    else if (rc)
        bufset_free(&s);
    if (rc) {
        reply_err(rc);
        return;
    }
    bufset_adopt(&s);
    printf("ok\n");
}

static void cmd_check(char *args)
{
    uint64_t seed = strtoull(args, NULL, 10), off = 0;

    for (size_t i = 0; i < cur.n; off += cur.b[i].len, i++) {
        int64_t bad = pattern_check(cur.b[i].addr, cur.b[i].len, seed, off);
        if (bad >= 0) {
            printf("err 1 %" PRIu64 "\n", off + (uint64_t)bad);
            return;
        }
    }
    printf(cur.n ? "ok\n" : "err 1 no buffers\n");
}

static void cmd_flip(char *args)
{
    uint64_t at = strtoull(args, NULL, 10);

    for (size_t i = 0; i < cur.n; at -= cur.b[i].len, i++)
        if (at < cur.b[i].len) {
            ((volatile uint8_t *)cur.b[i].addr)[at] ^= 0xff;
            printf("ok\n");
            return;
        }
    printf("err %d offset past the object\n", -EINVAL);
}

static void cmd_stat(char *args)
{
    mc_p2p_object_info_t info;
    int rc = mc_p2p_stat(node, strtok(args, " \n"), &info);

    if (rc)
        reply_err(rc);
    else
        printf("ok %" PRIu64 " %u %u %u\n", info.size, info.shards, info.holders,
               info.complete_holders);
}

static void cmd_withdraw(const char *cmd, char *args)
{
    char name[MC_P2P_NAME_MAX];
    int keep = 0, rc;

    if (sscanf(args, "%128s %d", name, &keep) < 1) {
        printf("err %d usage\n", -EINVAL);
        return;
    }
    if (!strcmp(cmd, "unregister"))
        rc = mc_p2p_unregister(node, name, keep);
    else if (!strcmp(cmd, "delete"))
        rc = mc_p2p_delete_replica(node, name);
    else
        rc = mc_p2p_remove(node, name, keep);
    if (rc) {
        reply_err(rc);
        return;
    }
    if (strcmp(cmd, "remove")) {
        bufset_free(&cur);
        cur_held = false;
    }
    printf("ok\n");
}

static bool dispatch(char *line)
{
    char cmd[32];
    int pos = 0;

    if (sscanf(line, "%31s %n", cmd, &pos) < 1)
        return true;
    char *args = line + pos;
    if (!strcmp(cmd, "segment"))
        printf("ok %s\n", mc_engine_segment_name(mc_p2p_engine(node)));
    else if (!strcmp(cmd, "publish") || !strcmp(cmd, "serve"))
        cmd_publish(args, !strcmp(cmd, "serve"));
    else if (!strcmp(cmd, "fetch"))
        cmd_fetch(args);
    else if (!strcmp(cmd, "wait"))
        cmd_wait(args);
    else if (!strcmp(cmd, "progress"))
        cmd_progress();
    else if (!strcmp(cmd, "check"))
        cmd_check(args);
    else if (!strcmp(cmd, "flip"))
        cmd_flip(args);
    else if (!strcmp(cmd, "stat"))
        cmd_stat(args);
    else if (!strcmp(cmd, "unregister") || !strcmp(cmd, "delete") || !strcmp(cmd, "remove"))
        cmd_withdraw(cmd, args);
    else if (!strcmp(cmd, "exit"))
        return false;
    else
        printf("err %d unknown command %s\n", -EINVAL, cmd);
    return true;
}

int main(void)
{
    char line[1024];
    int rc;

    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() == 1)
        return 1;
    setvbuf(stdout, NULL, _IOLBF, 0);
    rc = mc_p2p_create(NULL, &node);
    if (rc) {
        printf("err %d %s\n", rc, mc_p2p_last_error());
        return 1;
    }
    printf("ok ready\n");
    while (fgets(line, sizeof(line), stdin) && dispatch(line))
        ;
    if (fetching) {
        pthread_join(fetch_tid, NULL);
        fetching = false;
    }
    mc_p2p_destroy(node);
    bufset_free(&cur);
    return 0;
}
