/* A real etcd for the metadata tests: see etcd_proc.h. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "etcd_proc.h"

int64_t etcd_test_now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void etcd_test_sleep_ms(int ms)
{
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000};

    while (nanosleep(&ts, &ts) && errno == EINTR)
        ;
}

static const char *fixture(void)
{
    static char path[512];
    const char *src = getenv("MC_SOURCE_DIR");

    snprintf(path, sizeof(path), "%s/tests/fixtures/etcd.sh", src ? src : ".");
    return path;
}

int etcd_proc_sh(etcd_proc_t *e, const char *fmt, ...)
{
    char cmd[4096];
    va_list ap;
    int rc;

    va_start(ap, fmt);
    vsnprintf(cmd, sizeof(cmd), fmt, ap);
    va_end(ap);
    setenv("ETCD_ENDPOINT", e->endpoint, 1);
    setenv("ETCD_DIR", e->dir, 1);
    setenv("ETCD_FIXTURE", fixture(), 1);
    rc = system(cmd);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

/* The guardian: waits for the test process to go (EOF on the pipe), then cleans up. */
static void guardian(const char *dir, int rfd)
{
    char buf[1], cmd[1024];

    setsid(); /* not killed with the test's process group */
    signal(SIGINT, SIG_IGN);
    signal(SIGTERM, SIG_IGN);
    while (read(rfd, buf, 1) < 0 && errno == EINTR)
        ;
    snprintf(cmd, sizeof(cmd), "bash %s stop '%s' >/dev/null 2>&1; rm -rf '%s'", fixture(), dir,
             dir);
    if (system(cmd) != 0)
        _exit(1);
    _exit(0);
}

static int read_file(const char *path, char *buf, size_t size, size_t *len_p)
{
    int fd = open(path, O_RDONLY);
    ssize_t n;

    if (fd < 0)
        return -1;
    n = read(fd, buf, size - 1);
    close(fd);
    if (n < 0)
        return -1;
    buf[n] = '\0';
    if (len_p)
        *len_p = (size_t)n;
    return 0;
}

static int load_env(etcd_proc_t *e)
{
    char path[256], buf[512], pid[32];
    char *p;

    snprintf(path, sizeof(path), "%s/etcd.env", e->dir);
    if (read_file(path, buf, sizeof(buf), NULL))
        return -1;
    p = strstr(buf, "ETCD_ENDPOINT=");
    if (!p || sscanf(p, "ETCD_ENDPOINT=%63s", e->endpoint) != 1)
        return -1;
    p = strstr(buf, "ETCD_URL=");
    if (!p || sscanf(p, "ETCD_URL=%127s", e->http) != 1)
        return -1;
    snprintf(e->url, sizeof(e->url), "etcd://%s", e->endpoint);
    snprintf(path, sizeof(path), "%s/etcd.pid", e->dir);
    if (read_file(path, pid, sizeof(pid), NULL))
        return -1;
    e->pid = atoi(pid);
    return e->pid > 0 ? 0 : -1;
}

int etcd_proc_prepare(etcd_proc_t *e)
{
    int pfd[2];
    pid_t g;

    memset(e, 0, sizeof(*e));
    if (system("command -v etcd >/dev/null 2>&1") != 0)
        return 77;
    snprintf(e->dir, sizeof(e->dir), "/tmp/mc-etcd-test-XXXXXX");
    if (!mkdtemp(e->dir) || pipe(pfd))
        return -1;
    g = fork();
    if (g < 0)
        return -1;
    if (g == 0) {
        close(pfd[1]);
        guardian(e->dir, pfd[0]);
    }
    close(pfd[0]);
    fcntl(pfd[1], F_SETFD, FD_CLOEXEC); /* held by this process (and its forks) only */
    return 0;
}

int etcd_proc_launch(etcd_proc_t *e, const char *flags)
{
    if (etcd_proc_sh(e, "bash \"$ETCD_FIXTURE\" start \"$ETCD_DIR\" %s >/dev/null",
                     flags ? flags : "") != 0)
        return -1;
    return load_env(e);
}

int etcd_proc_start(etcd_proc_t *e, const char *flags)
{
    int rc = etcd_proc_prepare(e);

    return rc ? rc : etcd_proc_launch(e, flags);
}

void etcd_proc_start_or_skip(etcd_proc_t *e, const char *flags)
{
    int rc = etcd_proc_start(e, flags);

    if (rc == 77) {
        fprintf(stderr, "etcd is not installed: skipped\n");
        exit(77);
    }
    if (rc) {
        fprintf(stderr, "etcd did not start (see the fixture's output above)\n");
        exit(1);
    }
}

static int alive(pid_t pid)
{
    char path[64], st[512];
    char *p;

    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    if (read_file(path, st, sizeof(st), NULL))
        return 0;
    p = strrchr(st, ')');
    return p && p[1] == ' ' && p[2] != 'Z';
}

void etcd_proc_kill(etcd_proc_t *e, int sig)
{
    char path[64];

    free(e->cmdline);
    e->cmdline = malloc(65536);
    snprintf(path, sizeof(path), "/proc/%d/cmdline", (int)e->pid);
    if (!e->cmdline || read_file(path, e->cmdline, 65536, &e->cmdline_len))
        e->cmdline_len = 0;
    kill(e->pid, sig);
    for (int i = 0; i < 200 && alive(e->pid); i++)
        etcd_test_sleep_ms(50);
    if (e->restarted)
        waitpid(e->restarted, NULL, 0);
    e->restarted = 0;
}

int etcd_proc_restart(etcd_proc_t *e)
{
    char *argv[64], path[256], pidbuf[32];
    size_t n = 0;
    pid_t pid;

    for (size_t off = 0; off < e->cmdline_len && n < 63; off += strlen(e->cmdline + off) + 1)
        argv[n++] = e->cmdline + off;
    argv[n] = NULL;
    if (n == 0)
        return -1;
    for (int attempt = 0; attempt < 3; attempt++) {
        pid = fork();
        if (pid < 0)
            return -1;
        if (pid == 0) {
            char out[256];
            snprintf(out, sizeof(out), "%s/etcd.out", e->dir);
            int fd = open(out, O_WRONLY | O_CREAT | O_APPEND, 0644);
            setsid();
            dup2(fd, 1);
            dup2(fd, 2);
            execvp(argv[0], argv);
            _exit(127);
        }
        e->pid = e->restarted = pid;
        snprintf(path, sizeof(path), "%s/etcd.pid", e->dir);
        FILE *f = fopen(path, "w");
        if (f) {
            snprintf(pidbuf, sizeof(pidbuf), "%d\n", (int)pid);
            fputs(pidbuf, f);
            fclose(f);
        }
        for (int i = 0; i < 200 && alive(pid); i++) {
            if (etcd_proc_sh(e,
                             "curl -s -m 1 %s/health 2>/dev/null | grep -q '\"health\":\"true\"'",
                             e->http) == 0)
                return 0;
            etcd_test_sleep_ms(50);
        }
        /* The old listener's port may linger for a moment: try again. */
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        e->restarted = 0;
        etcd_test_sleep_ms(500);
    }
    return -1;
}

void etcd_proc_stop(etcd_proc_t *e)
{
    if (!e->dir[0])
        return;
    etcd_proc_sh(e,
                 "bash \"$ETCD_FIXTURE\" stop \"$ETCD_DIR\" >/dev/null 2>&1; rm -rf \"$ETCD_DIR\"");
    if (e->restarted)
        waitpid(e->restarted, NULL, 0);
    free(e->cmdline);
    memset(e, 0, sizeof(*e));
}
