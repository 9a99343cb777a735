/* mc-cma-bw: raw cross-memory-attach bandwidth (process_vm_readv / process_vm_writev) between
 * this process and a forked child, the ceiling for the engine's CMA path.  "read" pulls the
 * child's (target's) memory into ours, "write" pushes ours into the child's; --batch iovec pairs
 * of block_size go in each call, cycling through a working set on both sides: block after block,
 * or (--pattern random) the blocks of two independent random permutations, one per side, as a
 * KV transfer's scattered blocks. --threads N calls from N threads at once, each from its own
 * place in the cycle. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* accept4, process_vm_readv */
#endif
#include "bench_common.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#define MC_CMA_THREADS_MAX 64

typedef struct mc_cma_opts {
    int write; /* 0: process_vm_readv, 1: process_vm_writev */
    size_t batch;
    unsigned threads;
    int random;                /* --pattern random */
    uint32_t *perm_l, *perm_r; /* random: block order on each side */
} mc_cma_opts_t;

typedef struct mc_cma_peer {
    pid_t pid;
    int down_fd; /* closing it tells the child to exit */
    char *addr;  /* the child's working set, in its address space */
} mc_cma_peer_t;

static int mc_cma_opt(void *ctx, const char *name, const char *value)
{
    mc_cma_opts_t *co = ctx;
    char *end;
    unsigned long v;

    if (strcmp(name, "operation") == 0) {
        if (strcmp(value, "read") != 0 && strcmp(value, "write") != 0) {
            return -EINVAL;
        }
        co->write = strcmp(value, "write") == 0;
        return 1;
    }
    if (strcmp(name, "batch") == 0) {
        v = strtoul(value, &end, 0);
        if (end == value || *end != '\0' || v == 0 || v > IOV_MAX) {
            return -EINVAL;
        }
        co->batch = v;
        return 1;
    }
    if (strcmp(name, "threads") == 0) {
        v = strtoul(value, &end, 0);
        if (end == value || *end != '\0' || v == 0 || v > MC_CMA_THREADS_MAX) {
            return -EINVAL;
        }
        co->threads = (unsigned)v;
        return 1;
    }
    if (strcmp(name, "pattern") == 0) {
        if (strcmp(value, "seq") != 0 && strcmp(value, "random") != 0) {
            return -EINVAL;
        }
        co->random = strcmp(value, "random") == 0;
        return 1;
    }
    return 0;
}

/* The child: fault in its working set, report where it is, then wait for the parent to go. */
static void mc_cma_child(size_t size, int up_fd, int down_fd, pid_t parent)
{
    char *buf, c;

    /* Never outlive the benchmark, even if it is killed. */
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) {
        _exit(1);
    }
    buf = mc_bench_alloc(size);
    if (buf == NULL || write(up_fd, &buf, sizeof(buf)) != (ssize_t)sizeof(buf)) {
        _exit(1);
    }
    while (read(down_fd, &c, 1) > 0) {
    }
    _exit(0);
}

static void mc_cma_peer_stop(mc_cma_peer_t *peer)
{
    close(peer->down_fd);
    waitpid(peer->pid, NULL, 0);
}

static int mc_cma_peer_start(mc_cma_peer_t *peer, size_t size)
{
    int up[2], down[2];
    pid_t parent = getpid();

    if (pipe(up) != 0 || pipe(down) != 0) {
        perror("pipe");
        return -errno;
    }
    fflush(stdout);
    peer->pid = fork();
    if (peer->pid < 0) {
        perror("fork");
        return -errno;
    }
    if (peer->pid == 0) {
        close(up[0]);
        close(down[1]);
        mc_cma_child(size, up[1], down[0], parent);
    }
    close(up[1]);
    close(down[0]);
    peer->down_fd = down[1];
    if (read(up[0], &peer->addr, sizeof(peer->addr)) != (ssize_t)sizeof(peer->addr)) {
        fprintf(stderr, "the child could not set up its %zu-byte buffer\n", size);
        close(up[0]);
        mc_cma_peer_stop(peer);
        return -EIO;
    }
    close(up[0]);
    return 0;
}

static ssize_t mc_cma_call(const mc_cma_opts_t *co, pid_t pid, struct iovec *local,
                           struct iovec *remote, size_t n)
{
    return co->write ? process_vm_writev(pid, local, n, remote, n, 0)
                     : process_vm_readv(pid, local, n, remote, n, 0);
}

/* Fills n iovec pairs from block *at_p of n_blocks on, wrapping; returns the bytes they cover. */
static size_t mc_cma_fill(const mc_cma_opts_t *co, struct iovec *local, struct iovec *remote,
                          size_t n, char *lbuf, char *rbuf, size_t block, size_t n_blocks,
                          size_t *at_p)
{
    size_t i;

    for (i = 0; i < n; i++) {
        size_t lb = co->random ? co->perm_l[*at_p] : *at_p;
        size_t rb = co->random ? co->perm_r[*at_p] : *at_p;
        local[i].iov_base = lbuf + lb * block;
        remote[i].iov_base = rbuf + rb * block;
        local[i].iov_len = remote[i].iov_len = block;
        if (++*at_p == n_blocks) {
            *at_p = 0;
        }
    }
    return n * block;
}

typedef struct mc_cma_worker {
    const mc_bench_opts_t *opts;
    const mc_cma_opts_t *co;
    const mc_cma_peer_t *peer;
    char *lbuf;
    size_t start; /* first block */
    double end;   /* when to stop */
    uint64_t bytes;
    int rc;
} mc_cma_worker_t;

static void *mc_cma_work(void *arg)
{
    mc_cma_worker_t *w = arg;
    const mc_cma_opts_t *co = w->co;
    size_t n_blocks = w->opts->buffer_size / w->opts->block_size, at = w->start, want;
    struct iovec *local = calloc(2 * co->batch, sizeof(*local)), *remote = local + co->batch;
    ssize_t got;

    if (!local) {
        w->rc = -ENOMEM;
        return NULL;
    }
    do {
        want = mc_cma_fill(co, local, remote, co->batch, w->lbuf, w->peer->addr,
                           w->opts->block_size, n_blocks, &at);
        got = mc_cma_call(co, w->peer->pid, local, remote, co->batch);
        if (got < 0) {
            fprintf(stderr, "process_vm_%sv: %s\n", co->write ? "write" : "read", strerror(errno));
            w->rc = -errno;
            break;
        }
        if ((size_t)got != want) {
            fprintf(stderr, "short transfer: %zd of %zu bytes\n", got, want);
            w->rc = -EIO;
            break;
        }
        w->bytes += (uint64_t)got;
    } while (mc_bench_now() < w->end);
    free(local);
    return NULL;
}

static int mc_cma_run(const mc_bench_opts_t *opts, const mc_cma_opts_t *co,
                      const mc_cma_peer_t *peer, char *lbuf, uint64_t *bytes_p, double *seconds_p)
{
    size_t n_blocks = opts->buffer_size / opts->block_size;
    mc_cma_worker_t w[MC_CMA_THREADS_MAX];
    pthread_t tid[MC_CMA_THREADS_MAX];
    double start = mc_bench_now();
    unsigned started = 0;
    int rc = 0;

    for (unsigned t = 0; t < co->threads; t++) {
        w[t] = (mc_cma_worker_t){.opts = opts,
                                 .co = co,
                                 .peer = peer,
                                 .lbuf = lbuf,
                                 .start = n_blocks * t / co->threads,
                                 .end = start + opts->duration};
        if (pthread_create(&tid[t], NULL, mc_cma_work, &w[t]) != 0) {
            fprintf(stderr, "pthread_create failed\n");
            rc = -EAGAIN;
            break;
        }
        started++;
    }
    *bytes_p = 0;
    for (unsigned t = 0; t < started; t++) {
        pthread_join(tid[t], NULL);
        *bytes_p += w[t].bytes;
        rc = rc ? rc : w[t].rc;
    }
    *seconds_p = mc_bench_now() - start;
    return rc;
}

/* Two independent random permutations of n blocks (fixed seed: the same order every run). */
static int mc_cma_orders(mc_cma_opts_t *co, size_t n)
{
    co->perm_l = malloc(n * sizeof(*co->perm_l));
    co->perm_r = malloc(n * sizeof(*co->perm_r));
    if (!co->perm_l || !co->perm_r) {
        return -ENOMEM;
    }
    for (size_t i = 0; i < n; i++) {
        co->perm_l[i] = co->perm_r[i] = (uint32_t)i;
    }
    srand(12345);
    for (size_t i = n - 1; i > 0; i--) {
        size_t j = (size_t)rand() % (i + 1), k = (size_t)rand() % (i + 1);
        uint32_t t = co->perm_l[i];
        co->perm_l[i] = co->perm_l[j];
        co->perm_l[j] = t;
        t = co->perm_r[i];
        co->perm_r[i] = co->perm_r[k];
        co->perm_r[k] = t;
    }
    return 0;
}

/* One block before timing: tells "not permitted here" (skip) apart from a real failure. */
static int mc_cma_probe(const mc_cma_opts_t *co, const mc_cma_peer_t *peer, char *lbuf,
                        size_t block)
{
    struct iovec l = {lbuf, block}, r = {peer->addr, block};

    if (mc_cma_call(co, peer->pid, &l, &r, 1) >= 0) {
        return 0;
    }
    if (errno == EPERM || errno == ENOSYS) {
        printf("skipped: process_vm_%sv is not permitted here (%s); CMA needs ptrace access "
               "to the peer (kernel.yama.ptrace_scope, seccomp, or a container policy)\n",
               co->write ? "write" : "read", strerror(errno));
        return MC_BENCH_EXIT_SKIP;
    }
    fprintf(stderr, "process_vm_%sv: %s\n", co->write ? "write" : "read", strerror(errno));
    return 1;
}

int main(int argc, char **argv)
{
    mc_bench_opts_t opts;
    mc_cma_opts_t co = {.write = 0, .batch = 1, .threads = 1};
    mc_cma_peer_t peer;
    char *lbuf;
    uint64_t bytes = 0;
    double seconds = 0;
    int rc;

    mc_bench_opts_init(&opts);
    rc = mc_bench_parse_args(argc, argv, &opts, mc_cma_opt, &co,
                             "  --operation read|write  pull from / push to the child (read)\n"
                             "  --batch N         iovec pairs per call (1)\n"
                             "  --threads N       threads calling at once (1)\n"
                             "  --pattern seq|random  block order on both sides (seq)\n");
    if (rc != 0) {
        return rc > 0 ? 0 : 2;
    }
    if (mc_bench_opts_check(&opts) != 0) {
        return 2;
    }
    if (opts.buffer_size / opts.block_size > UINT32_MAX ||
        (co.random && mc_cma_orders(&co, opts.buffer_size / opts.block_size) != 0)) {
        fprintf(stderr, "mc-cma-bw: no room for the block orders\n");
        return 1;
    }
    lbuf = mc_bench_alloc(opts.buffer_size);
    if (lbuf == NULL) {
        return 1;
    }
    rc = mc_cma_peer_start(&peer, opts.buffer_size);
    if (rc != 0) {
        mc_bench_free(lbuf, opts.buffer_size);
        return 1;
    }
    rc = mc_cma_probe(&co, &peer, lbuf, opts.block_size);
    if (rc == 0) {
        rc = mc_cma_run(&opts, &co, &peer, lbuf, &bytes, &seconds) == 0 ? 0 : 1;
    }
    mc_cma_peer_stop(&peer);
    mc_bench_free(lbuf, opts.buffer_size);
    free(co.perm_l);
    free(co.perm_r);
    if (rc == 0) {
        mc_bench_report("cma", &opts,
                        json_pack("{s:s,s:I,s:I,s:s}", "operation", co.write ? "write" : "read",
                                  "batch_size", (json_int_t)co.batch, "threads",
                                  (json_int_t)co.threads, "pattern", co.random ? "random" : "seq"),
                        bytes, seconds);
    }
    return rc;
}
