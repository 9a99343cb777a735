/*
 * P2P store internals: the node, what it holds, errors, logging, names and keys.
 *
 * Everything here is hidden in libmooncake_p2p.so (the version script exports the MC_P2P_API
 * functions only); internal functions are named mc__p2p_*.
 */
#ifndef MC_P2P_INT_H
#define MC_P2P_INT_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include <mooncake/meta.h>
#include <mooncake/p2p.h>

#define P2P_KEY_MAX          512
#define P2P_DEFAULT_SHARD    (64ull << 20)
#define P2P_MIN_SHARD        4096u
#define P2P_DEFAULT_INFLIGHT 8u
#define P2P_DEFAULT_TIMEOUT  30000u

/* An object this node serves: published here (origin) or fetched / served (replica). */
typedef struct p2p_held {
    struct p2p_held *next;
    char name[MC_P2P_NAME_MAX];
    bool origin;
    bool busy; /* being set up or withdrawn: other calls on the name get -EBUSY */
    mc_p2p_buf_t *bufs;
    size_t n, n_reg;    /* bufs, and how many of them carry a registration of ours */
    int64_t object_rev; /* origin: the description's mod_revision (conditional delete) */
    uint64_t id;        /* origin: the description's id (its replica entries carry it) */
    char replica_key[P2P_KEY_MAX];
} p2p_held_t;

struct mc_p2p {
    mc_engine_t *engine;
    mc_meta_t *meta;
    char cluster[64];
    char segment[MC_NAME_MAX];
    unsigned connect_timeout_ms; /* how long the store may be unreachable at a call's start */
    int log_level;
    pthread_mutex_t lock; /* protects held */
    p2p_held_t *held;
};

/* ---- errors and logging (p2p.c) ---- */

/* Record the reason of a failure for mc_p2p_last_error() and return code. */
int mc__p2p_error(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Log a warning (reasons of things that are retried, not failures of a call). */
void mc__p2p_warn(const mc_p2p_t *p2p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
uint64_t mc__p2p_now_ms(void);
void mc__p2p_sleep_ms(unsigned ms);
uint64_t mc__p2p_random(void); /* from the kernel: object ids and fetch seeds */

/* ---- names and keys (p2p_keys.c) ---- */

/* 0, or -EINVAL with the rule a name breaks. */
int mc__p2p_name_check(const char *name);
/* "mooncake/[cluster/]p2p/<name>/<tail>" into buf (P2P_KEY_MAX); its length or -ENAMETOOLONG. */
int mc__p2p_key(const mc_p2p_t *p2p, const char *name, const char *tail, char *buf);
/* This node's replica key of name: ".../p2p/<name>/replica/<our segment>". */
int mc__p2p_replica_key(const mc_p2p_t *p2p, const char *name, char *buf);
/* The buffers of a call: not NULL, none empty, the total not overflowing. */
int mc__p2p_bufs_check(const char *what, const mc_p2p_buf_t *bufs, size_t n, uint64_t *total_p);
/* Buffers a fetch writes into: -EINVAL if two overlap. */
int mc__p2p_bufs_disjoint(const char *what, const mc_p2p_buf_t *bufs, size_t n);

/* ---- the held table (p2p.c) ---- */

/* Claim name for a call that sets it up: a busy entry (origin: this node publishes it), or
 * -EEXIST if it is held. */
int mc__p2p_claim(mc_p2p_t *p2p, const char *name, bool origin, p2p_held_t **held_p);
/* Take a held entry of that role for withdrawal (marks it busy); -ENOENT / -EBUSY. */
int mc__p2p_take(mc_p2p_t *p2p, const char *name, bool origin, p2p_held_t **held_p);
/* Set up: the entry is no longer busy. */
void mc__p2p_settle(mc_p2p_t *p2p, p2p_held_t *h);
/* Forget an entry (claimed or taken) and free it. */
void mc__p2p_forget(mc_p2p_t *p2p, p2p_held_t *h);
/* Copy the buffers into h and register each with the engine. */
int mc__p2p_hold_bufs(mc_p2p_t *p2p, p2p_held_t *h, const mc_p2p_buf_t *bufs, size_t n);
/* At the end of a call that returns rc (0, or a failure whose reason is recorded), undo what
 * a held entry did (its replica entry, its registrations) and forget it. Returns rc, or -EBUSY
 * if a registration could not be dropped (its reason tells both): the engine may still use
 * that memory, which must then stay valid until mc_p2p_destroy returns. */
int mc__p2p_drop(mc_p2p_t *p2p, p2p_held_t *h, int rc);

struct p2p_entry;
struct p2p_desc;
/* The description of name, decoded: -ENOENT, -MC_EMETA (after retries), -EPROTO. */
int mc__p2p_desc_get(mc_p2p_t *p2p, const char *name, struct p2p_desc *d);
/* Put h's replica entry on the engine's lease (h->replica_key set). A store that does not
 * answer is not an error: the engine keeps the key and puts it when the store is back; that
 * returns 1 instead of 0. */
int mc__p2p_entry_publish(mc_p2p_t *p2p, p2p_held_t *h, const struct p2p_entry *e);

/* ---- metadata with retries (p2p_meta.c) ---- */

/* Get a key, retrying an unreachable store for up to p2p->connect_timeout_ms. */
int mc__p2p_meta_get(mc_p2p_t *p2p, const char *key, mc_meta_kv_t *kv_p);
/* Whether an error means "the store did not answer" rather than an answer. */
bool mc__p2p_meta_down(int rc);

#endif
