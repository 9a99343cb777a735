/*
 * The embedded "file://DIR" metadata backend, internal: shared by meta_file.c (operations),
 * meta_file_store.c (the files on disk) and meta_file_watch.c (watches).
 *
 * One machine, any number of processes.
 *
 * Layout of DIR (created with mode 0700):
 *   lock         flock()ed: exclusively by every change, shared by list and watch scans, so
 *                that a scan and the revision it reports are one consistent snapshot.
 *   rev          the store revision, decimal text.
 *   keys/<name>  one file per key: "MCKV1 <mod_revision> <lease> <value_len>\n" then the value.
 *                <name> is the key with every byte outside [A-Za-z0-9_.-] (and a leading '.')
 *                written as %XX, so binary keys are safe and `ls` stays readable. Listing sorts
 *                the decoded keys, so the encoding need not preserve order. A name is at most
 *                NAME_MAX bytes: keys whose encoding is longer fail with -ENAMETOOLONG.
 *   leases/<id>  "<expiry_ms> <ttl_ms>\n", expiry in CLOCK_REALTIME milliseconds.
 *   tmp/         files being written; each is renamed into place, so readers never see a torn
 *                file and get() needs no lock.
 *   dellog       the deletions, oldest first: a header "MCDL1 <floor>\n", then "<revision>
 *                <name>\n" for each key removed (appended under the exclusive lock before the
 *                unlink). A watch from a past revision learns from it which keys were deleted
 *                since, and at which revision: a key file, once gone, tells nothing. It keeps
 *                the newer half once it passes MC_META_FILE_DELLOG_MAX bytes; <floor> is the
 *                newest revision whose deletions it dropped.
 *
 * A key whose lease has expired (or whose lease file is gone) reads as absent. Whoever notices
 * one reaps all of them under the exclusive lock, each deletion raising the revision, so the
 * keys of a dead process vanish by themselves. Nothing is fsync()ed: the store describes live
 * processes and is not meant to survive a machine crash.
 */
#ifndef MC_META_FILE_INT_H
#define MC_META_FILE_INT_H

#include <dirent.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "metadata/meta.h"

#define MC_META_FILE_VALUE_MAX  (256u << 20)
#define MC_META_FILE_LEASE_MEMO 16
#define MC_META_FILE_DELLOG     "dellog"
#define MC_META_FILE_DELLOG_MAX (256u << 10)

typedef struct mc_meta_file {
    mc_meta_t base;
    char *dir;
    int dir_fd, keys_fd, leases_fd, tmp_fd; /* immutable after open */
    atomic_uint tmp_seq;
} mc_meta_file_t;

#define MC_META_FILE(meta) ((mc_meta_file_t *)(meta))

typedef struct mc_meta_file_hdr {
    int64_t mod_rev, lease;
    size_t value_len, hdr_len;
} mc_meta_file_hdr_t;

/* Remembers liveness of the leases seen during one scan of keys/. */
typedef struct mc_meta_file_lease_memo {
    int64_t id[MC_META_FILE_LEASE_MEMO];
    bool alive[MC_META_FILE_LEASE_MEMO];
    unsigned n;
} mc_meta_file_lease_memo_t;

/* Decides whether a scan reads the value of a live key (kv has key and revisions set). */
typedef bool (*mc_meta_file_want_cb)(void *arg, const mc_meta_kv_t *kv);

typedef struct mc_meta_file_scan {
    const void *prefix;
    size_t prefix_len;
    mc_meta_file_want_cb want; /* NULL: every value */
    void *arg;
    mc_meta_kv_t *kvs; /* sorted by key once the scan is done */
    size_t count, cap;
    int64_t rev; /* store revision at the scan */
    bool expired;
    mc_meta_file_lease_memo_t memo;
} mc_meta_file_scan_t;

/* Deletions from the log: keys under prefix deleted at revisions since..until, oldest first. */
typedef struct mc_meta_file_dellog {
    const void *prefix;
    size_t prefix_len;
    int64_t since, until;
    mc_meta_kv_t *entries; /* key and mod_revision (of the deletion) set, value NULL */
    size_t count, cap;
    int64_t floor; /* deletions up to this revision were dropped from the log */
} mc_meta_file_dellog_t;

/* Store primitives (meta_file_store.c). Functions named _locked, and those that change the
 * store (rev_bump, record_write, lease_write, key_unlink, key_remove, sweep_*), need the exclusive
 * lock. */
int mc__meta_file_err(mc_meta_file_t *f, const char *what, const char *name);
int64_t mc__meta_file_now_ms(void);
int mc__meta_file_key_encode(const void *key, size_t len, char name[NAME_MAX + 1]);
/* Whether the file name in keys/ is of a key that starts with prefix. */
bool mc__meta_file_name_match(const char *name, const void *prefix, size_t prefix_len);
int mc__meta_file_lock(mc_meta_file_t *f, int op, int *fd_p);
void mc__meta_file_unlock(int lock_fd);
int mc__meta_file_rev_bump(mc_meta_file_t *f, int64_t *rev_p);
int mc__meta_file_record_open(mc_meta_file_t *f, const char *name, mc_meta_file_hdr_t *hdr_p,
                              int *fd_p);
int mc__meta_file_record_value(mc_meta_file_t *f, int fd, const mc_meta_file_hdr_t *hdr,
                               char **value_p);
int mc__meta_file_record_write(mc_meta_file_t *f, const char *name, int64_t rev, int64_t lease,
                               const void *val, size_t val_len);
int mc__meta_file_lease_read(mc_meta_file_t *f, int64_t id, int64_t *expiry_p, int64_t *ttl_p);
int mc__meta_file_lease_write(mc_meta_file_t *f, int64_t id, int64_t ttl_ms);
bool mc__meta_file_lease_alive(mc_meta_file_t *f, int64_t id);
/* Remove keys/name as a deletion at revision rev (already taken with rev_bump), logged. */
int mc__meta_file_key_unlink(mc_meta_file_t *f, const char *name, int64_t rev);
/* rev_bump + key_unlink. */
int mc__meta_file_key_remove(mc_meta_file_t *f, const char *name);
DIR *mc__meta_file_opendir(mc_meta_file_t *f, const char *sub);
int mc__meta_file_sweep_keys(mc_meta_file_t *f, int64_t lease);
void mc__meta_file_sweep_leases(mc_meta_file_t *f);
int mc__meta_file_reap_locked(mc_meta_file_t *f);
int mc__meta_file_reap(mc_meta_file_t *f);
int mc__meta_file_kv_cmp(const void *a, const void *b);
/* List the live keys under s->prefix into s->kvs (sorted; the caller frees them with
 * mc__meta_kvs_free), reaping expired leases first if it meets any. Takes the shared lock. */
int mc__meta_file_scan(mc_meta_file_t *f, mc_meta_file_scan_t *s);
/* Read the log into r->entries (the caller frees them with mc__meta_kvs_free). Needs no lock:
 * the log is only appended to and replaced by rename, and a deletion up to the revision of a
 * scan was logged before that scan took its lock. */
int mc__meta_file_dellog_read(mc_meta_file_t *f, mc_meta_file_dellog_t *r);
/* Log the deletion of name at rev (meta_file_dellog.c); caller holds the exclusive lock. */
int mc__meta_file_dellog_append(mc_meta_file_t *f, int64_t rev, const char *name);
/* Helpers of meta_file_store.c the log shares: a key file name back to the key, a whole write,
 * a file replaced atomically (head, then body, through a temporary and rename). */
int mc__meta_file_key_decode(const char *name, char **key_p, size_t *len_p);
int mc__meta_file_write_full(int fd, const void *buf, size_t len);
int mc__meta_file_write_atomic(mc_meta_file_t *f, int dst_fd, const char *name, const char *head,
                               const void *body, size_t body_len);

/* Watches (meta_file_watch.c). */
int mc__meta_file_watch_create(mc_meta_t *meta, const void *prefix, size_t prefix_len,
                               int64_t start_revision, mc_meta_watch_t **watch_p);
int mc__meta_file_watch_next(mc_meta_watch_t *watch, int timeout_ms, mc_meta_event_t *event_p);
void mc__meta_file_watch_destroy(mc_meta_watch_t *watch);

#endif
