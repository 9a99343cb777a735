/*
 * A real etcd for the metadata tests, started through tests/fixtures/etcd.sh.
 *
 * etcd_proc_start() also forks a guardian process that outlives a crashing or killed test: when
 * the test process exits in any way, the guardian stops etcd (etcd.sh stop) and removes the
 * directory. It returns 77 when etcd is not installed, so that callers can skip.
 */
#ifndef MC_TESTS_ETCD_PROC_H
#define MC_TESTS_ETCD_PROC_H

#include <stdint.h>
#include <sys/types.h>

typedef struct etcd_proc {
    char dir[128];     /* fixture directory, removed by etcd_proc_stop */
    char endpoint[64]; /* 127.0.0.1:PORT */
    char url[128];     /* "etcd://" endpoint */
    char http[128];    /* http(s)://endpoint */
    pid_t pid;         /* the etcd process */
    char *cmdline;     /* argv of the etcd process, NUL-separated (for restarts) */
    size_t cmdline_len;
    pid_t restarted; /* non-zero when we started the current etcd ourselves */
} etcd_proc_t;

/* Start etcd with extra flags (may be NULL, split on spaces). 0, 77 (no etcd) or -1. */
int etcd_proc_start(etcd_proc_t *e, const char *flags);
/* etcd_proc_start, or exit: 77 (skipped) without etcd, 1 if it does not start. */
void etcd_proc_start_or_skip(etcd_proc_t *e, const char *flags);
/* The same in two steps, to create files in e->dir (certificates) before etcd starts. */
int etcd_proc_prepare(etcd_proc_t *e);
int etcd_proc_launch(etcd_proc_t *e, const char *flags);
/* Send sig to etcd and wait until it is gone. */
void etcd_proc_kill(etcd_proc_t *e, int sig);
/* Start etcd again with the same command line and data; wait until healthy. 0 or -1. */
int etcd_proc_restart(etcd_proc_t *e);
/* Stop etcd and remove its directory. */
void etcd_proc_stop(etcd_proc_t *e);
/* Run a shell command with ETCD_ENDPOINT/ETCD_DIR set; returns its exit status. */
int etcd_proc_sh(etcd_proc_t *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int64_t etcd_test_now_ms(void);
void etcd_test_sleep_ms(int ms);

#endif
