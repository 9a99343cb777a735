/*
 * P2P tests: nodes as real processes (p2p_node, exec'ed from the test binary's directory),
 * driven by one command line at a time, every wait bounded.
 */
#ifndef MC_TESTS_P2P_TEST_H
#define MC_TESTS_P2P_TEST_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

typedef struct p2p_proc {
    pid_t pid; /* 0 once reaped */
    int in, out;
    char buf[8192];
    size_t len;
    char reply[8192]; /* the last reply line */
} p2p_proc_t;

/* The reply of a finished fetch (the "wait" command). */
typedef struct p2p_result {
    int rc;
    unsigned shards;
    uint64_t from_origin, from_replicas;
    unsigned corrupt, retries;
} p2p_result_t;

/* A temporary directory for the file:// store (MC_METADATA set to it), removed at exit. */
const char *p2p_test_dir(void);
/* Start a node with the current environment; 0 or -1 (reason on stderr). */
int p2p_node_start(p2p_proc_t *n);
/* Send a command, wait up to timeout_ms for its reply (in n->reply). 0 if it begins with
 * "ok", its error code (err CODE ...) otherwise, -ETIMEDOUT / -EPIPE when the node does not
 * answer. */
int p2p_node_cmd(p2p_proc_t *n, int timeout_ms, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* "wait" for the node's fetch up to timeout_ms. */
int p2p_node_wait(p2p_proc_t *n, int timeout_ms, p2p_result_t *r);
/* Ask the node to exit and reap it (SIGKILL after 10 s): its exit status (0: it withdrew
 * everything and freed its memory; sanitizer builds fail here on a leak), -1 if killed. */
int p2p_node_stop(p2p_proc_t *n);
/* A cmocka teardown: kill the nodes a failed test left running. */
int p2p_node_cleanup(void **state);
/* SIGKILL the node and reap it. */
void p2p_node_kill(p2p_proc_t *n);
uint64_t p2p_now_ms(void);
void p2p_sleep_ms(int ms);

#endif
