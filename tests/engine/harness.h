/*
 * Integration test harness: target engines in child processes, data patterns, helpers.
 *
 * A test program calls th_main(argc, argv) first thing in main(): the same binary re-executes
 * itself as a target child ("--th-child FD"), which creates one or more engines from the
 * settings (th_cfg_t) the parent sends, registers buffers, reports each engine's descriptor blob,
 * segment name and buffer addresses, then serves commands on a socket until told to exit or
 * the socket closes (PR_SET_PDEATHSIG also kills it if the parent dies). Children are exec'ed,
 * not just forked, so they never inherit the parent's engine threads or locks.
 *
 * Only the public API (mooncake/engine.h) is used, in both roles.
 */
#ifndef MC_TEST_HARNESS_H
#define MC_TEST_HARNESS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include <mooncake/engine.h>

#define TH_MAX_ENGINES 16 /* per child process */
#define TH_MAX_BUFS    4  /* per engine */
#define TH_MSG_ID      7  /* message id the child's handler counts */
#define TH_ECHO_ID     8  /* ... and, once TH_CMD_ECHO said so, sends back to its sender */

#define TH_CFG_MAX 24

/* Engine settings as name/value text (mc_config_set), a plain value that can be copied and sent
 * to a child. Applied over mc_config_create()'s defaults and environment. */
typedef struct th_cfg {
    unsigned n;
    struct {
        char name[40];
        char value[512];
    } v[TH_CFG_MAX];
} th_cfg_t;

/* What a target child sets up. */
typedef struct th_target_opts {
    th_cfg_t cfg;       /* used for every engine of the child (SEGMENT_NAME: engine 0) */
    unsigned n_engines; /* 1..TH_MAX_ENGINES */
    unsigned n_bufs;    /* 1..TH_MAX_BUFS buffers per engine */
    size_t buf_size;    /* bytes per buffer */
    char location[MC_LOCATION_MAX]; /* "" = "cpu:0"; "*" to test detection */
    int use_alloc;                  /* buffers from mc_mem_alloc instead of malloc + register */
    uint64_t seed;                  /* initial pattern: buffer i of engine j gets seed + 16j + i */
    char log_path[256];             /* "": the child's stderr is ours; else that file's */
} th_target_opts_t;

typedef struct th_engine_info {
    char name[MC_NAME_MAX];
    uint64_t buf[TH_MAX_BUFS];
    size_t blob_len;
    uint8_t *blob;
} th_engine_info_t;

typedef struct th_target {
    pid_t pid; /* 0 once reaped */
    int sock;
    unsigned n_engines;
    size_t buf_size;
    th_engine_info_t eng[TH_MAX_ENGINES];
} th_target_t;

enum th_cmd_op {
    TH_CMD_PING = 1,
    TH_CMD_UNREGISTER, /* a0 = buffer index; a1 = 1: register the same memory again after */
    TH_CMD_FILL,       /* a0 = addr, a1 = len, a2 = seed, a4 = stream offset */
    TH_CMD_CHECK,      /* like FILL; rc = 0 or 1 + first bad offset */
    TH_CMD_NOTIFY,     /* a3 = timeout ms; pop loop, then check [a0, a0+a1) against seed a2 */
    TH_CMD_MSGS,       /* a0 = count expected, a3 = timeout ms: wait for the message handler
                          (message n: u32 n then stream 1000 + n, cut to any length) */
    TH_CMD_STATS,      /* counters of "tcp" */
    TH_CMD_REGISTER,   /* a1 = len, a2 = seed: a new buffer with that pattern; v[0] = its addr;
                          a0 = 1: mapped read-only (PROT_READ), whatever the setup */
    TH_CMD_KEY,        /* a0 = addr: msg = mc_buffer_key_pack of its buffer */
    TH_CMD_ADDRESS,    /* msg = mc_engine_address, v[0] = its length */
    TH_CMD_POPS,       /* a0 = count, a3 = timeout ms (0: only what is queued): pop notifications,
                          each a2 bytes (0: 4) starting with a u32 from a1 on; v[0] = popped,
                          v[1] = wrong ones */
    TH_CMD_ECHO,       /* a0 = 1: the message handler sends every message back (TH_ECHO_ID),
                          in order, what the window refuses again from a thread; its send errors
                          counted in STATS v[5]; a0 = 0: no more (echoes still refused count) */
    TH_CMD_DESTROY,    /* mc_engine_destroy; the process and its (non-engine) memory stay */
    TH_CMD_EXIT,
};

typedef struct th_cmd {
    uint32_t op;
    uint32_t eng; /* engine index inside the child */
    uint64_t a0, a1, a2, a3, a4;
} th_cmd_t;

typedef struct th_reply {
    int64_t rc;
    int64_t v[6];
    char str[MC_NAME_MAX];
    char msg[512];
} th_reply_t;

/* Call first in main(). Returns only in the parent. */
void th_main(int argc, char **argv);

/* Defaults for tests: METADATA none, LISTEN 127.0.0.1:0, no logging (info with TH_VERBOSE). */
void th_config(th_cfg_t *cfg);
/* Set (or replace) one setting, the value printf-formatted. */
void th_set(th_cfg_t *cfg, const char *name, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* The value set for name, or NULL. */
const char *th_get(const th_cfg_t *cfg, const char *name);
/* An mc_config_t with cfg applied (asserts every setting is accepted); free with
 * mc_config_destroy. */
mc_config_t *th_mc_config(const th_cfg_t *cfg);
void th_target_opts_init(th_target_opts_t *o, const th_cfg_t *cfg, size_t buf_size);

/* Spawn a target child and read what it set up. 0 or a negative errno. */
int th_target_spawn(const th_target_opts_t *o, th_target_t *t);
/* Send one command and wait (bounded by timeout_ms) for its reply. 0 or negative errno. */
int th_target_cmd(th_target_t *t, const th_cmd_t *cmd, th_reply_t *rep, int timeout_ms);
/* A new buffer of len bytes in the target (its first engine), filled with stream seed, made
 * known to e's open segment seg by its key (mc_segment_add_buffer): its address, or 0. */
uint64_t th_register_keyed(th_target_t *t, mc_engine_t *e, mc_segment_id_t seg, size_t len,
                           uint64_t seed);
/* The same, the target's buffer mapped read-only (PROT_READ). */
uint64_t th_register_keyed_ro(th_target_t *t, mc_engine_t *e, mc_segment_id_t seg, size_t len,
                              uint64_t seed, bool read_only);
/* The two halves of th_target_cmd, for a command that runs while the parent works. */
int th_target_send(th_target_t *t, const th_cmd_t *cmd);
int th_target_recv(th_target_t *t, th_reply_t *rep, int timeout_ms);
/* SIGKILL (if still running) and reap. Safe to call twice. */
void th_target_kill(th_target_t *t);

/* A child of a test's own making: this binary again, exec'ed with argv[1] = flag and argv[2] =
 * the number of its end of a socket pair (killed if we die); the pid, our end in *sock_p. The
 * test's main() recognizes the flag first thing. */
pid_t th_spawn_self(const char *flag, int *sock_p);
/* Kill such a child (SIGKILL), reap it, close our end; both set to "none" (0, -1). */
void th_child_reap(pid_t *pid_p, int *sock_p);
/* Send (writing) or receive exactly len bytes on fd within timeout_ms (INT32_MAX: no limit):
 * 0, -ETIMEDOUT, -EPIPE (closed) or -errno. */
int th_io_full(int fd, void *buf, size_t len, int writing, int timeout_ms);
/* Ask the child to exit cleanly (destroying its engines); returns its exit status, or -1 if
 * it had to be killed after timeout_ms. */
int th_target_stop(th_target_t *t, int timeout_ms);
/* SIGSTOP pid and wait (asserting, up to 5 s) until every thread of it is stopped indeed. */
void th_stop(pid_t pid);
/* The loopback TCP port process pid listens on (from ss), or 0. */
unsigned th_listen_port(pid_t pid);
/* Kill (ss -K) every established TCP connection to or from port; how many ends went. */
unsigned th_kill_conns(unsigned port);
/* Kill every child this process spawned and has not reaped; for teardowns. */
void th_kill_all(void);

/* Engine helpers (assert on failure). */
mc_engine_t *th_engine(const th_cfg_t *cfg);
mc_segment_id_t th_open(mc_engine_t *e, const th_target_t *t, unsigned eng);
/* A page-aligned malloc'ed region, registered; unregister + free with th_buf_free. */
void *th_buf(mc_engine_t *e, size_t len);
void th_buf_free(mc_engine_t *e, void *p, size_t len);

/* Deterministic patterns: byte i of stream `seed` depends on (seed, i). The _at forms start
 * at position off of the stream (dst[k] = byte off + k). */
void th_fill(void *dst, size_t len, uint64_t seed);
void th_fill_at(void *dst, size_t len, uint64_t seed, uint64_t off);
/* -1 if [p, p+len) holds stream `seed`, else the first differing offset. */
int64_t th_check(const void *p, size_t len, uint64_t seed);
int64_t th_check_at(const void *p, size_t len, uint64_t seed, uint64_t off);
/* Ask target child t to check (or fill) [addr, addr+len) against stream seed at offset off.
 * Returns -1 if it matches, else the first differing offset (asserts the command works). */
int64_t th_remote_check(th_target_t *t, unsigned eng, uint64_t addr, uint64_t len, uint64_t seed,
                        uint64_t off);
void th_remote_fill(th_target_t *t, unsigned eng, uint64_t addr, uint64_t len, uint64_t seed,
                    uint64_t off);

/* One request, waited for (progress driven in caller mode); returns the final status. */
/* Returns the final mc_task_state_t (>= 0), or the negative code mc_batch_submit returned. */
int th_xfer(mc_engine_t *e, mc_opcode_t op, void *local, mc_segment_id_t seg, uint64_t remote,
            uint64_t len, char *reason, size_t reason_size);
/* One request (opts may be NULL) in a batch of its own, waited for up to 30 s: its final status,
 * the reason copied (valid until the next call). The batch is released, not destroyed, so this
 * returns as soon as the task is final even with slices still on the wire. */
mc_task_status_t th_xfer_req(mc_engine_t *e, const mc_request_t *r, const mc_submit_opts_t *opts);
/* Close a segment, driving progress while it is -EBUSY (released batches the engine still
 * holds); asserts it succeeds within 10 s. */
void th_close(mc_engine_t *e, mc_segment_id_t seg);
/* Destroy a batch, driving progress while it is -EBUSY; asserts it succeeds within 10 s. */
void th_batch_destroy(mc_engine_t *e, mc_batch_t *b);

int64_t th_now_ms(void);
void th_sleep_ms(int ms);

/* Set the fault state of software RDMA device dev ("port=down\n", "drop=10\n", ...) through
 * its control file in dir, in one go (a rename); 0 or -1. Its progress threads apply it within
 * a few milliseconds. */
int th_sv_ctl(const char *dir, const char *dev, const char *text);

/* mkdtemp under /tmp; th_rmdir removes the tree. */
void th_tmpdir(char *out, size_t size);
void th_rmdir(const char *dir);

/* Whether haystack contains needle, ignoring case. */
int th_contains(const char *haystack, const char *needle);

/* Whether item is one of the comma-separated list. */
int th_listed(const char *list, const char *item);

#endif
