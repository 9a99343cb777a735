/* P2P tests: nodes as processes (see p2p_test.h). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "p2p_test.h"

uint64_t p2p_now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

void p2p_sleep_ms(int ms)
{
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000};

    while (nanosleep(&ts, &ts) && errno == EINTR)
        ;
}

static char test_dir[128];

/* Nodes started and not reaped yet, by value: a failed assertion leaves a test's p2p_proc_t
 * behind on a dead stack frame, and p2p_node_cleanup() must still find its process. */
#define LIVE_MAX 64
static struct live {
    pid_t pid;
    int in, out;
} live[LIVE_MAX];

static void live_add(pid_t pid, int in, int out)
{
    for (int i = 0; i < LIVE_MAX; i++)
        if (live[i].pid == 0) {
            live[i] = (struct live){pid, in, out};
            return;
        }
}

static void live_remove(pid_t pid)
{
    for (int i = 0; i < LIVE_MAX; i++)
        if (live[i].pid == pid)
            live[i].pid = 0;
}

int p2p_node_cleanup(void **state)
{
    (void)state;
    for (int i = 0; i < LIVE_MAX; i++)
        if (live[i].pid > 0) {
            kill(live[i].pid, SIGKILL);
            waitpid(live[i].pid, NULL, 0);
            close(live[i].in);
            close(live[i].out);
            live[i].pid = 0;
        }
    return 0;
}

/* At exit, threads of an engine still open in this process (a test that failed, or one whose
 * engine goes with the process) may put a file into the store while it is being removed:
 * removed again until it is gone (a few tries). */
static void remove_dir(void)
{
    char cmd[256];
    struct stat st;

    if (!test_dir[0])
        return;
    snprintf(cmd, sizeof(cmd), "rm -rf '%s' 2>/dev/null", test_dir);
    for (int i = 0; i < 20 && stat(test_dir, &st) == 0; i++) {
        if (system(cmd) != 0 || stat(test_dir, &st) == 0)
            p2p_sleep_ms(50);
    }
    if (stat(test_dir, &st) == 0)
        fprintf(stderr, "cannot remove %s\n", test_dir);
}

const char *p2p_test_dir(void)
{
    char url[256];

    if (test_dir[0])
        return test_dir;
    snprintf(test_dir, sizeof(test_dir), "/tmp/mc-p2p-test-XXXXXX");
    if (!mkdtemp(test_dir)) {
        perror("mkdtemp");
        exit(1);
    }
    atexit(remove_dir);
    snprintf(url, sizeof(url), "file://%s/meta", test_dir);
    setenv("MC_METADATA", url, 0); /* an etcd test sets it first */
    return test_dir;
}

static int node_exe(char *path, size_t size)
{
    ssize_t n = readlink("/proc/self/exe", path, size - 16);
    char *slash;

    if (n <= 0)
        return -1;
    path[n] = '\0';
    slash = strrchr(path, '/');
    strcpy(slash + 1, "p2p_node");
    return 0;
}

/* Read one line into n->reply within timeout_ms. */
static int read_line(p2p_proc_t *n, int timeout_ms)
{
    uint64_t end = p2p_now_ms() + (uint64_t)timeout_ms;

    for (;;) {
        char *nl = memchr(n->buf, '\n', n->len);
        if (nl) {
            size_t k = (size_t)(nl - n->buf);
            memcpy(n->reply, n->buf, k);
            n->reply[k] = '\0';
            memmove(n->buf, nl + 1, n->len - k - 1);
            n->len -= k + 1;
            return 0;
        }
        uint64_t now = p2p_now_ms();
        struct pollfd pfd = {.fd = n->out, .events = POLLIN};
        if (now >= end)
            return -ETIMEDOUT;
        if (poll(&pfd, 1, (int)(end - now)) <= 0)
            continue;
        ssize_t r = read(n->out, n->buf + n->len, sizeof(n->buf) - 1 - n->len);
        if (r <= 0)
            return -EPIPE;
        n->len += (size_t)r;
    }
}

static int reply_code(const p2p_proc_t *n)
{
    if (!strncmp(n->reply, "ok", 2))
        return 0;
    int code = 0;
    return sscanf(n->reply, "err %d", &code) == 1 && code ? code : -EPROTO;
}

int p2p_node_start(p2p_proc_t *n)
{
    char exe[PATH_MAX];
    int in[2], out[2];

    memset(n, 0, sizeof(*n));
    p2p_test_dir();
    if (node_exe(exe, sizeof(exe)) || pipe2(in, O_CLOEXEC) || pipe2(out, O_CLOEXEC))
        return -1;
    n->pid = fork();
    if (n->pid == 0) {
        dup2(in[0], 0);
        dup2(out[1], 1);
        execl(exe, exe, (char *)NULL);
        _exit(127);
    }
    close(in[0]);
    close(out[1]);
    n->in = in[1];
    n->out = out[0];
    if (n->pid > 0)
        live_add(n->pid, n->in, n->out);
    if (n->pid < 0 || read_line(n, 15000) || reply_code(n)) {
        fprintf(stderr, "p2p_node did not start: %s\n", n->reply);
        p2p_node_kill(n);
        return -1;
    }
    return 0;
}

int p2p_node_cmd(p2p_proc_t *n, int timeout_ms, const char *fmt, ...)
{
    char line[1024];
    va_list ap;
    int len, rc;

    va_start(ap, fmt);
    len = vsnprintf(line, sizeof(line) - 1, fmt, ap);
    va_end(ap);
    line[len++] = '\n';
    if (write(n->in, line, (size_t)len) != len)
        return -EPIPE;
    rc = read_line(n, timeout_ms);
    if (rc) {
        snprintf(n->reply, sizeof(n->reply), "no answer (%s)",
                 rc == -ETIMEDOUT ? "timeout" : "gone");
        return rc;
    }
    return reply_code(n);
}

int p2p_node_wait(p2p_proc_t *n, int timeout_ms, p2p_result_t *r)
{
    int rc = p2p_node_cmd(n, timeout_ms + 2000, "wait %d", timeout_ms);

    memset(r, 0, sizeof(*r));
    if (rc)
        return rc;
    if (sscanf(n->reply, "ok %d %u %" SCNu64 " %" SCNu64 " %u %u", &r->rc, &r->shards,
               &r->from_origin, &r->from_replicas, &r->corrupt, &r->retries) != 6)
        return -EPROTO;
    return 0;
}

/* Reap the node within ms (SIGKILL then); its exit status, or -1 if it did not exit by
 * itself with one. */
static int reap(p2p_proc_t *n, int ms)
{
    uint64_t end = p2p_now_ms() + (uint64_t)ms;
    int status = 0, rc = -1;
    pid_t got;

    while ((got = waitpid(n->pid, &status, WNOHANG)) == 0 && p2p_now_ms() < end)
        p2p_sleep_ms(20);
    if (got == 0) {
        fprintf(stderr, "p2p_node %d did not exit: killed\n", (int)n->pid);
        kill(n->pid, SIGKILL);
        waitpid(n->pid, NULL, 0);
    } else if (got == n->pid && WIFEXITED(status)) {
        rc = WEXITSTATUS(status);
    }
    live_remove(n->pid);
    n->pid = 0;
    if (n->in > 0)
        close(n->in);
    if (n->out > 0)
        close(n->out);
    n->in = n->out = -1;
    return rc;
}

int p2p_node_stop(p2p_proc_t *n)
{
    if (n->pid <= 0)
        return -1;
    if (write(n->in, "exit\n", 5) != 5)
        kill(n->pid, SIGKILL);
    return reap(n, 10000);
}

void p2p_node_kill(p2p_proc_t *n)
{
    if (n->pid <= 0)
        return;
    kill(n->pid, SIGKILL);
    reap(n, 5000);
}
