/* mc-cma-bw: raw cross-memory-attach bandwidth (process_vm_readv / process_vm_writev) between
 * this process and a forked child, the ceiling for the engine's CMA path.  "read" pulls the
 * child's (target's) memory into ours, "write" pushes ours into the child's; --batch iovec pairs
 * of block_size go in each call, cycling through a working set on both sides. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* accept4, process_vm_readv */
#endif
#include "bench_common.h"

#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

typedef struct mc_cma_opts {
    int write; /* 0: process_vm_readv, 1: process_vm_writev */
    size_t batch;
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

/* Fills n iovec pairs from *off_p on, wrapping at span; returns the bytes they cover. */
static size_t mc_cma_fill(struct iovec *local, struct iovec *remote, size_t n, char *lbuf,
                          char *rbuf, size_t block, size_t span, size_t *off_p)
{
    size_t i;

    for (i = 0; i < n; i++) {
        local[i].iov_base = lbuf + *off_p;
        remote[i].iov_base = rbuf + *off_p;
        local[i].iov_len = remote[i].iov_len = block;
        *off_p += block;
        if (*off_p == span) {
            *off_p = 0;
        }
    }
    return n * block;
}

static int mc_cma_run(const mc_bench_opts_t *opts, const mc_cma_opts_t *co,
                      const mc_cma_peer_t *peer, char *lbuf, uint64_t *bytes_p, double *seconds_p)
{
    size_t span = opts->buffer_size - opts->buffer_size % opts->block_size, off = 0, want;
    struct iovec local[IOV_MAX], remote[IOV_MAX];
    uint64_t bytes = 0;
    double start, end;
    ssize_t got;

    start = mc_bench_now();
    end = start + opts->duration;
    do {
        want =
            mc_cma_fill(local, remote, co->batch, lbuf, peer->addr, opts->block_size, span, &off);
        got = mc_cma_call(co, peer->pid, local, remote, co->batch);
        if (got < 0) {
            fprintf(stderr, "process_vm_%sv: %s\n", co->write ? "write" : "read", strerror(errno));
            return -errno;
        }
        if ((size_t)got != want) {
            fprintf(stderr, "short transfer: %zd of %zu bytes\n", got, want);
            return -EIO;
        }
        bytes += (uint64_t)got;
    } while (mc_bench_now() < end);
    *seconds_p = mc_bench_now() - start;
    *bytes_p = bytes;
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
    mc_cma_opts_t co = {.write = 0, .batch = 1};
    mc_cma_peer_t peer;
    char *lbuf;
    uint64_t bytes = 0;
    double seconds = 0;
    int rc;

    mc_bench_opts_init(&opts);
    rc = mc_bench_parse_args(argc, argv, &opts, mc_cma_opt, &co,
                             "  --operation read|write  pull from / push to the child (read)\n"
                             "  --batch N         iovec pairs per call (1)\n");
    if (rc != 0) {
        return rc > 0 ? 0 : 2;
    }
    if (mc_bench_opts_check(&opts) != 0) {
        return 2;
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
    if (rc == 0) {
        mc_bench_report("cma", &opts,
                        json_pack("{s:s,s:I}", "operation", co.write ? "write" : "read",
                                  "batch_size", (json_int_t)co.batch),
                        bytes, seconds);
    }
    return rc;
}
