/* The file:// metadata backend: operations, open and close. See meta_file_int.h for the layout. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <mooncake/error.h>

#include "metadata/meta_file_int.h"
#include "util/log.h"

static int file_get(mc_meta_t *meta, const void *key, size_t key_len, mc_meta_kv_t *kv_p)
{
    mc_meta_file_t *f = MC_META_FILE(meta);
    char name[NAME_MAX + 1];
    mc_meta_kv_t kv = {0};
    mc_meta_file_hdr_t hdr;
    int fd, rc = mc__meta_file_key_encode(key, key_len, name);

    if (rc || (rc = mc__meta_file_record_open(f, name, &hdr, &fd)) != 0)
        goto out_absent;
    if (hdr.lease && !mc__meta_file_lease_alive(f, hdr.lease)) {
        close(fd);
        mc__meta_file_reap(f);
        rc = -ENOENT;
        goto out_absent;
    }
    rc = mc__meta_file_record_value(f, fd, &hdr, &kv.value);
    close(fd);
    if (rc)
        return rc;
    kv.key = malloc(key_len + 1);
    if (!kv.key) {
        free(kv.value);
        return mc__set_error(-ENOMEM, "no memory for a metadata key");
    }
    memcpy(kv.key, key, key_len);
    kv.key[key_len] = '\0';
    kv.key_len = key_len;
    kv.value_len = hdr.value_len;
    kv.mod_revision = hdr.mod_rev;
    kv.lease = hdr.lease;
    *kv_p = kv;
    return 0;

out_absent:
    return rc == -ENOENT ? mc__set_error(-ENOENT, "metadata key %s not found", name) : rc;
}

/* The key's mod_revision, 0 if absent or its lease is dead. Caller holds the exclusive lock. */
static int file_current_rev(mc_meta_file_t *f, const char *name, int64_t *rev_p)
{
    mc_meta_file_hdr_t hdr;
    int fd, rc = mc__meta_file_record_open(f, name, &hdr, &fd);

    if (rc == -ENOENT) {
        *rev_p = 0;
        return 0;
    }
    if (rc)
        return rc;
    close(fd);
    *rev_p = hdr.lease && !mc__meta_file_lease_alive(f, hdr.lease) ? 0 : hdr.mod_rev;
    return 0;
}

/* Put under the exclusive lock; expected < 0 means unconditionally. */
static int file_update_locked(mc_meta_file_t *f, const char *name, int64_t expected,
                              const void *val, size_t val_len, int64_t lease, int64_t *rev_p)
{
    int64_t cur, rev;
    int rc;

    if (lease && !mc__meta_file_lease_alive(f, lease))
        return mc__set_error(-ENOENT, "lease %" PRId64 " does not exist or expired", lease);
    if (expected >= 0) {
        rc = file_current_rev(f, name, &cur);
        if (rc)
            return rc;
        if (cur != expected)
            return mc__set_error(-MC_ECONFLICT,
                                 "CAS on %s: mod_revision is %" PRId64 ", expected %" PRId64, name,
                                 cur, expected);
    }
    rc = mc__meta_file_rev_bump(f, &rev);
    if (rc == 0)
        rc = mc__meta_file_record_write(f, name, rev, lease, val, val_len);
    if (rc == 0)
        *rev_p = rev;
    return rc;
}

static int file_update(mc_meta_t *meta, const void *key, size_t key_len, int64_t expected,
                       const void *val, size_t val_len, int64_t lease, int64_t *revision_p)
{
    mc_meta_file_t *f = MC_META_FILE(meta);
    char name[NAME_MAX + 1];
    int64_t rev = 0;
    int lock_fd = -1, rc = mc__meta_file_key_encode(key, key_len, name);

    if (rc)
        return rc;
    if (val_len > MC_META_FILE_VALUE_MAX)
        return mc__set_error(-EMSGSIZE, "metadata value of %zu bytes exceeds %u", val_len,
                             MC_META_FILE_VALUE_MAX);
    rc = mc__meta_file_lock(f, LOCK_EX, &lock_fd);
    if (rc)
        return rc;
    rc = file_update_locked(f, name, expected, val, val_len, lease, &rev);
    mc__meta_file_unlock(lock_fd);
    if (rc == 0 && revision_p)
        *revision_p = rev;
    return rc;
}

static int file_put(mc_meta_t *meta, const void *key, size_t key_len, const void *val,
                    size_t val_len, int64_t lease, int64_t *revision_p)
{
    return file_update(meta, key, key_len, -1, val, val_len, lease, revision_p);
}

static int file_cas(mc_meta_t *meta, const void *key, size_t key_len, int64_t expected,
                    const void *val, size_t val_len, int64_t lease, int64_t *revision_p)
{
    return file_update(meta, key, key_len, expected, val, val_len, lease, revision_p);
}

/* Caller holds the exclusive lock. mod_revision 0: whatever the key's is. Errors name the key
 * as given (name is its file). */
static int file_del_locked(mc_meta_file_t *f, const void *key, size_t key_len, const char *name,
                           int64_t mod_revision)
{
    int64_t cur;
    int rc = file_current_rev(f, name, &cur);

    if (rc)
        return rc;
    if (cur == 0)
        return mc__set_error(-ENOENT, "metadata key %.*s not found", (int)key_len,
                             (const char *)key);
    if (mod_revision && cur != mod_revision)
        return mc__set_error(-MC_ECONFLICT,
                             "delete of %.*s: mod_revision is %" PRId64 ", expected %" PRId64,
                             (int)key_len, (const char *)key, cur, mod_revision);
    return mc__meta_file_key_remove(f, name);
}

static int file_del(mc_meta_t *meta, const void *key, size_t key_len, int64_t mod_revision)
{
    mc_meta_file_t *f = MC_META_FILE(meta);
    char name[NAME_MAX + 1];
    int lock_fd = -1, rc = mc__meta_file_key_encode(key, key_len, name);

    if (rc || (rc = mc__meta_file_lock(f, LOCK_EX, &lock_fd)) != 0)
        return rc;
    rc = file_del_locked(f, key, key_len, name, mod_revision);
    mc__meta_file_unlock(lock_fd);
    return rc;
}

/* Remove every key under the prefix at one revision, as etcd's deleterange does; keys whose
 * lease is dead go too (reaped) but are not counted: they were absent already. */
static int file_delete_prefix_locked(mc_meta_file_t *f, const void *prefix, size_t prefix_len,
                                     size_t *deleted_p)
{
    DIR *d = mc__meta_file_opendir(f, "keys");
    struct dirent *de;
    int64_t cur, rev = 0;
    int rc = d ? 0 : -MC_EMETA;

    while (rc == 0 && (de = readdir(d))) {
        if (!mc__meta_file_name_match(de->d_name, prefix, prefix_len))
            continue;
        rc = file_current_rev(f, de->d_name, &cur);
        if (rc == 0 && rev == 0)
            rc = mc__meta_file_rev_bump(f, &rev);
        if (rc == 0)
            rc = mc__meta_file_key_unlink(f, de->d_name, rev);
        if (rc == 0 && cur)
            (*deleted_p)++;
    }
    if (d)
        closedir(d);
    return rc;
}

static int file_delete_prefix(mc_meta_t *meta, const void *prefix, size_t prefix_len,
                              size_t *deleted_p)
{
    mc_meta_file_t *f = MC_META_FILE(meta);
    size_t deleted = 0;
    int lock_fd = -1, rc = mc__meta_file_lock(f, LOCK_EX, &lock_fd);

    if (rc)
        return rc;
    rc = file_delete_prefix_locked(f, prefix, prefix_len, &deleted);
    mc__meta_file_unlock(lock_fd);
    if (rc == 0)
        *deleted_p = deleted;
    return rc;
}

/* The scan reads the revision under the lock it scans with: the listing is that revision. */
static int file_list(mc_meta_t *meta, const void *prefix, size_t prefix_len, mc_meta_kv_t **kvs_p,
                     size_t *count_p, int64_t *revision_p)
{
    mc_meta_file_scan_t s = {.prefix = prefix, .prefix_len = prefix_len};
    int rc = mc__meta_file_scan(MC_META_FILE(meta), &s);

    if (rc)
        return rc;
    *kvs_p = s.kvs;
    *count_p = s.count;
    if (revision_p)
        *revision_p = s.rev;
    return 0;
}

/* A random positive 63-bit id: unique across processes without coordination. */
static int file_lease_new_id(mc_meta_file_t *f, int64_t *id_p)
{
    uint64_t r;
    int64_t expiry, ttl;

    do {
        if (getrandom(&r, sizeof(r), 0) != (ssize_t)sizeof(r))
            return mc__meta_file_err(f, "getrandom", "for a lease id");
        r &= INT64_MAX;
    } while (r == 0 || mc__meta_file_lease_read(f, (int64_t)r, &expiry, &ttl) != -ENOENT);
    *id_p = (int64_t)r;
    return 0;
}

static int file_lease_grant(mc_meta_t *meta, unsigned ttl_s, int64_t *lease_p)
{
    mc_meta_file_t *f = MC_META_FILE(meta);
    int64_t id = 0;
    int lock_fd = -1, rc = mc__meta_file_lock(f, LOCK_EX, &lock_fd);

    if (rc)
        return rc;
    mc__meta_file_sweep_leases(f); /* leases of dead processes that never bound a key */
    rc = file_lease_new_id(f, &id);
    if (rc == 0)
        rc = mc__meta_file_lease_write(f, id, (int64_t)ttl_s * 1000);
    mc__meta_file_unlock(lock_fd);
    if (rc == 0)
        *lease_p = id;
    return rc;
}

static int file_lease_keepalive(mc_meta_t *meta, int64_t lease)
{
    mc_meta_file_t *f = MC_META_FILE(meta);
    int64_t expiry, ttl;
    int lock_fd = -1, rc = mc__meta_file_lock(f, LOCK_EX, &lock_fd);

    if (rc)
        return rc;
    rc = mc__meta_file_lease_read(f, lease, &expiry, &ttl);
    if (rc == 0 && expiry <= mc__meta_file_now_ms()) {
        mc__meta_file_reap_locked(f);
        rc = -ENOENT;
    }
    if (rc == -ENOENT)
        rc = mc__set_error(-ENOENT, "lease %" PRId64 " does not exist or expired", lease);
    if (rc == 0)
        rc = mc__meta_file_lease_write(f, lease, ttl);
    mc__meta_file_unlock(lock_fd);
    return rc;
}

static int file_lease_revoke(mc_meta_t *meta, int64_t lease)
{
    mc_meta_file_t *f = MC_META_FILE(meta);
    char name[32];
    int lock_fd = -1, rc = mc__meta_file_lock(f, LOCK_EX, &lock_fd);
    bool existed;

    if (rc)
        return rc;
    snprintf(name, sizeof(name), "%" PRId64, lease);
    existed = unlinkat(f->leases_fd, name, 0) == 0;
    rc = lease ? mc__meta_file_sweep_keys(f, lease) : 0;
    mc__meta_file_unlock(lock_fd);
    if (rc == 0 && !existed)
        rc = mc__set_error(-ENOENT, "lease %" PRId64 " does not exist", lease);
    return rc;
}

static int file_mkdirs(char *path)
{
    for (char *p = path + 1;; p++) {
        bool end = *p == '\0';
        if (*p != '/' && !end)
            continue;
        *p = '\0';
        int rc = mkdir(path, 0700);
        if (!end)
            *p = '/';
        if (rc < 0 && errno != EEXIST)
            return mc__set_error(-MC_EMETA, "metadata store: mkdir %s: %s", path, strerror(errno));
        if (end)
            return 0;
    }
}

static int file_open_sub(mc_meta_file_t *f, const char *sub, int *fd_p)
{
    if (mkdirat(f->dir_fd, sub, 0700) < 0 && errno != EEXIST)
        return mc__meta_file_err(f, "mkdir", sub);
    *fd_p = openat(f->dir_fd, sub, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    return *fd_p < 0 ? mc__meta_file_err(f, "open", sub) : 0;
}

/* Under the exclusive lock nobody is writing, so leftovers in tmp/ are from crashed writers. */
static int file_recover(mc_meta_file_t *f)
{
    DIR *d;
    struct dirent *de;
    int lock_fd = -1, rc = mc__meta_file_lock(f, LOCK_EX, &lock_fd);

    if (rc)
        return rc;
    d = mc__meta_file_opendir(f, "tmp");
    while (d && (de = readdir(d)))
        if (de->d_name[0] != '.')
            unlinkat(f->tmp_fd, de->d_name, 0);
    if (d)
        closedir(d);
    rc = d ? mc__meta_file_reap_locked(f) : -MC_EMETA;
    mc__meta_file_unlock(lock_fd);
    return rc;
}

static void file_close(mc_meta_t *meta)
{
    mc_meta_file_t *f = MC_META_FILE(meta);
    int *fds[] = {&f->tmp_fd, &f->leases_fd, &f->keys_fd, &f->dir_fd};

    for (size_t i = 0; i < sizeof(fds) / sizeof(fds[0]); i++)
        if (*fds[i] >= 0)
            close(*fds[i]);
    free(f->dir);
    free(f);
}

extern const mc_meta_ops_t mc__meta_file_ops;

static int file_open_dirs(mc_meta_file_t *f)
{
    int rc = file_mkdirs(f->dir);

    if (rc)
        return rc;
    f->dir_fd = open(f->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (f->dir_fd < 0)
        return mc__meta_file_err(f, "open", "");
    rc = file_open_sub(f, "keys", &f->keys_fd);
    if (rc == 0)
        rc = file_open_sub(f, "leases", &f->leases_fd);
    if (rc == 0)
        rc = file_open_sub(f, "tmp", &f->tmp_fd);
    return rc;
}

static int file_open(const char *path, const mc_meta_opts_t *opts, mc_meta_t **meta_p)
{
    (void)opts; /* a directory needs none */
    mc_meta_file_t *f;
    int rc;

    if (path[0] != '/')
        return mc__set_error(-EINVAL, "metadata URL file://%s: the path must be absolute", path);
    f = calloc(1, sizeof(*f));
    if (!f || !(f->dir = strdup(path))) {
        free(f);
        return mc__set_error(-ENOMEM, "no memory for metadata store %s", path);
    }
    f->base.ops = &mc__meta_file_ops;
    f->dir_fd = f->keys_fd = f->leases_fd = f->tmp_fd = -1;
    rc = file_open_dirs(f);
    if (rc == 0)
        rc = file_recover(f);
    if (rc) {
        file_close(&f->base);
        return rc;
    }
    *meta_p = &f->base;
    return 0;
}

const mc_meta_ops_t mc__meta_file_ops = {
    .size = sizeof(mc_meta_ops_t),
    .version = 2,
    .scheme = "file",
    .open = file_open,
    .close = file_close,
    .get = file_get,
    .put = file_put,
    .del = file_del,
    .list = file_list,
    .cas = file_cas,
    .lease_grant = file_lease_grant,
    .lease_keepalive = file_lease_keepalive,
    .lease_revoke = file_lease_revoke,
    .watch_create = mc__meta_file_watch_create,
    .watch_next = mc__meta_file_watch_next,
    .watch_destroy = mc__meta_file_watch_destroy,
    .delete_prefix = file_delete_prefix,
};
