/* The file:// store on disk: key names, atomic writes, the lock, revisions, records, leases,
 * reaping and scans. The layout is described in meta_file_int.h. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <mooncake/error.h>

#include "metadata/meta_file_int.h"
#include "util/log.h"

#define FILE_HDR_MAX 96

int mc__meta_file_err(mc_meta_file_t *f, const char *what, const char *name)
{
    return mc__set_error(-MC_EMETA, "metadata store %s: %s %s: %s", f->dir, what, name,
                         strerror(errno));
}

int64_t mc__meta_file_now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* ---- key names ---- */

static bool file_char_plain(unsigned char c, size_t pos)
{
    if (c == '.')
        return pos > 0;
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
           c == '-';
}

int mc__meta_file_key_encode(const void *key, size_t len, char name[NAME_MAX + 1])
{
    const unsigned char *k = key;
    size_t n = 0;

    for (size_t i = 0; i < len; i++) {
        if (n + 3 > NAME_MAX)
            return mc__set_error(-ENAMETOOLONG, "metadata key of %zu bytes is too long", len);
        if (file_char_plain(k[i], i))
            name[n++] = (char)k[i];
        else
            n += (size_t)sprintf(name + n, "%%%02X", k[i]);
    }
    name[n] = '\0';
    return 0;
}

static int file_hex(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* Decode a file name into a malloc'ed NUL-terminated key; -EINVAL for foreign names. */
int mc__meta_file_key_decode(const char *name, char **key_p, size_t *len_p)
{
    size_t n = 0, len = strlen(name);
    char *key = malloc(len + 1);

    if (!key)
        return -ENOMEM;
    for (size_t i = 0; i < len; i++) {
        if (name[i] != '%') {
            key[n++] = name[i];
            continue;
        }
        if (i + 2 >= len || file_hex(name[i + 1]) < 0 || file_hex(name[i + 2]) < 0) {
            free(key);
            return -EINVAL;
        }
        key[n++] = (char)(file_hex(name[i + 1]) * 16 + file_hex(name[i + 2]));
        i += 2;
    }
    key[n] = '\0';
    *key_p = key;
    *len_p = n;
    return 0;
}

bool mc__meta_file_name_match(const char *name, const void *prefix, size_t prefix_len)
{
    char *key;
    size_t len;
    bool match;

    if (name[0] == '.' || mc__meta_file_key_decode(name, &key, &len) != 0)
        return false;
    match = len >= prefix_len && memcmp(key, prefix, prefix_len) == 0;
    free(key);
    return match;
}

/* ---- small files, atomic writes, the lock and the revision ---- */

int mc__meta_file_write_full(int fd, const void *buf, size_t len)
{
    const char *p = buf;

    while (len > 0) {
        ssize_t n = write(fd, p, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return -1;
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

/* Write head + body to tmp/ and rename it to dst_fd/name, so readers see old or new, whole. */
int mc__meta_file_write_atomic(mc_meta_file_t *f, int dst_fd, const char *name, const char *head,
                               const void *body, size_t body_len)
{
    char tmp[64];
    int fd;

    snprintf(tmp, sizeof(tmp), "%d.%u", (int)getpid(), atomic_fetch_add(&f->tmp_seq, 1));
    fd = openat(f->tmp_fd, tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0)
        return mc__meta_file_err(f, "create", tmp);
    if (mc__meta_file_write_full(fd, head, strlen(head)) < 0 ||
        mc__meta_file_write_full(fd, body, body_len) < 0)
        goto err_unlink_tmp;
    if (close(fd) < 0) {
        fd = -1;
        goto err_unlink_tmp;
    }
    if (renameat(f->tmp_fd, tmp, dst_fd, name) < 0)
        goto err_unlink_tmp;
    return 0;

err_unlink_tmp:
    mc__meta_file_err(f, "write", name);
    if (fd >= 0)
        close(fd);
    unlinkat(f->tmp_fd, tmp, 0);
    return -MC_EMETA;
}

/* Read a small text file into buf (NUL-terminated). -ENOENT if it does not exist. */
static int file_read_small(mc_meta_file_t *f, int dir_fd, const char *name, char *buf, size_t size)
{
    int fd = openat(dir_fd, name, O_RDONLY | O_CLOEXEC);
    ssize_t n;

    if (fd < 0)
        return errno == ENOENT ? -ENOENT : mc__meta_file_err(f, "open", name);
    n = pread(fd, buf, size - 1, 0);
    close(fd);
    if (n < 0)
        return mc__meta_file_err(f, "read", name);
    buf[n] = '\0';
    return 0;
}

/* Take flock(op) on DIR/lock through a fresh open file, so that threads exclude each other. */
int mc__meta_file_lock(mc_meta_file_t *f, int op, int *fd_p)
{
    int fd = openat(f->dir_fd, "lock", O_RDWR | O_CREAT | O_CLOEXEC, 0600);

    if (fd < 0)
        return mc__meta_file_err(f, "open", "lock");
    while (flock(fd, op) < 0) {
        if (errno != EINTR) {
            int rc = mc__meta_file_err(f, "flock", "lock");
            close(fd);
            return rc;
        }
    }
    *fd_p = fd;
    return 0;
}

void mc__meta_file_unlock(int lock_fd)
{
    close(lock_fd); /* drops the flock */
}

/* Caller holds the lock (shared or exclusive). */
static int file_rev_read(mc_meta_file_t *f, int64_t *rev_p)
{
    char buf[32];
    int rc = file_read_small(f, f->dir_fd, "rev", buf, sizeof(buf));

    if (rc == -ENOENT) {
        *rev_p = 0;
        return 0;
    }
    if (rc)
        return rc;
    *rev_p = strtoll(buf, NULL, 10);
    return 0;
}

/* Caller holds the exclusive lock. The revision is stored before the change it stands for, so
 * a crash in between only skips a number and never reuses one. */
int mc__meta_file_rev_bump(mc_meta_file_t *f, int64_t *rev_p)
{
    char buf[32];
    int64_t rev;
    int rc = file_rev_read(f, &rev);

    if (rc)
        return rc;
    snprintf(buf, sizeof(buf), "%" PRId64 "\n", ++rev);
    rc = mc__meta_file_write_atomic(f, f->dir_fd, "rev", buf, NULL, 0);
    if (rc)
        return rc;
    *rev_p = rev;
    return 0;
}

/* ---- key records ---- */

static int file_hdr_parse(const char *buf, size_t n, mc_meta_file_hdr_t *hdr)
{
    const char *nl = memchr(buf, '\n', n);
    char line[FILE_HDR_MAX + 1];
    long long rev, lease;
    unsigned long long len;
    int used = -1;

    if (!nl)
        return -1;
    memcpy(line, buf, (size_t)(nl - buf));
    line[nl - buf] = '\0';
    if (sscanf(line, "MCKV1 %lld %lld %llu%n", &rev, &lease, &len, &used) != 3 ||
        used != nl - buf || len > MC_META_FILE_VALUE_MAX)
        return -1;
    hdr->mod_rev = rev;
    hdr->lease = lease;
    hdr->value_len = (size_t)len;
    hdr->hdr_len = (size_t)(nl - buf) + 1;
    return 0;
}

/* Open keys/name and parse its header. -ENOENT if it does not exist. */
int mc__meta_file_record_open(mc_meta_file_t *f, const char *name, mc_meta_file_hdr_t *hdr_p,
                              int *fd_p)
{
    char buf[FILE_HDR_MAX];
    struct stat st;
    ssize_t n;
    int fd = openat(f->keys_fd, name, O_RDONLY | O_CLOEXEC);

    if (fd < 0)
        return errno == ENOENT ? -ENOENT : mc__meta_file_err(f, "open key", name);
    n = pread(fd, buf, sizeof(buf), 0);
    if (n < 0 || fstat(fd, &st) < 0) {
        mc__meta_file_err(f, "read key", name);
        goto err_close_fd;
    }
    if (file_hdr_parse(buf, (size_t)n, hdr_p) < 0 ||
        (size_t)st.st_size != hdr_p->hdr_len + hdr_p->value_len) {
        mc__set_error(-MC_EMETA, "metadata store %s: key file %s is corrupt", f->dir, name);
        goto err_close_fd;
    }
    *fd_p = fd;
    return 0;

err_close_fd:
    close(fd);
    return -MC_EMETA;
}

int mc__meta_file_record_value(mc_meta_file_t *f, int fd, const mc_meta_file_hdr_t *hdr,
                               char **value_p)
{
    char *value = malloc(hdr->value_len + 1);
    size_t done = 0;

    if (!value)
        return mc__set_error(-ENOMEM, "no memory for a %zu-byte value", hdr->value_len);
    while (done < hdr->value_len) {
        ssize_t n = pread(fd, value + done, hdr->value_len - done, (off_t)(hdr->hdr_len + done));
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            free(value);
            return mc__meta_file_err(f, "read", "value");
        }
        done += (size_t)n;
    }
    value[hdr->value_len] = '\0';
    *value_p = value;
    return 0;
}

int mc__meta_file_record_write(mc_meta_file_t *f, const char *name, int64_t rev, int64_t lease,
                               const void *val, size_t val_len)
{
    char head[FILE_HDR_MAX];

    snprintf(head, sizeof(head), "MCKV1 %" PRId64 " %" PRId64 " %zu\n", rev, lease, val_len);
    return mc__meta_file_write_atomic(f, f->keys_fd, name, head, val, val_len);
}

/* ---- leases ---- */

int mc__meta_file_lease_read(mc_meta_file_t *f, int64_t id, int64_t *expiry_p, int64_t *ttl_p)
{
    char name[32], buf[64];
    long long expiry, ttl;
    int rc;

    snprintf(name, sizeof(name), "%" PRId64, id);
    rc = file_read_small(f, f->leases_fd, name, buf, sizeof(buf));
    if (rc)
        return rc;
    if (sscanf(buf, "%lld %lld", &expiry, &ttl) != 2)
        return mc__set_error(-MC_EMETA, "metadata store %s: lease %s is corrupt", f->dir, name);
    *expiry_p = expiry;
    *ttl_p = ttl;
    return 0;
}

int mc__meta_file_lease_write(mc_meta_file_t *f, int64_t id, int64_t ttl_ms)
{
    char name[32], buf[64];

    snprintf(name, sizeof(name), "%" PRId64, id);
    snprintf(buf, sizeof(buf), "%" PRId64 " %" PRId64 "\n", mc__meta_file_now_ms() + ttl_ms,
             ttl_ms);
    return mc__meta_file_write_atomic(f, f->leases_fd, name, buf, NULL, 0);
}

/* A lease is alive while its file exists and has not expired; read errors count as alive so
 * that a transient failure never deletes keys. */
bool mc__meta_file_lease_alive(mc_meta_file_t *f, int64_t id)
{
    int64_t expiry = 0, ttl = 0;
    int rc = mc__meta_file_lease_read(f, id, &expiry, &ttl);

    if (rc == -ENOENT)
        return false;
    return rc != 0 || expiry > mc__meta_file_now_ms();
}

static bool file_lease_alive_memo(mc_meta_file_t *f, mc_meta_file_lease_memo_t *m, int64_t id)
{
    bool alive;

    if (id == 0)
        return true;
    for (unsigned i = 0; i < m->n; i++)
        if (m->id[i] == id)
            return m->alive[i];
    alive = mc__meta_file_lease_alive(f, id);
    if (m->n < MC_META_FILE_LEASE_MEMO) {
        m->id[m->n] = id;
        m->alive[m->n++] = alive;
    }
    return alive;
}

/* ---- reaping (caller holds the exclusive lock) ---- */

/* The deletion is logged first: a key the log names but that is still there (unlink failed)
 * is live to every reader, while a deletion missing from the log would be lost to watches. */
int mc__meta_file_key_unlink(mc_meta_file_t *f, const char *name, int64_t rev)
{
    int rc = mc__meta_file_dellog_append(f, rev, name);

    if (rc)
        return rc;
    if (unlinkat(f->keys_fd, name, 0) < 0 && errno != ENOENT)
        return mc__meta_file_err(f, "unlink key", name);
    return 0;
}

int mc__meta_file_key_remove(mc_meta_file_t *f, const char *name)
{
    int64_t rev;
    int rc = mc__meta_file_rev_bump(f, &rev);

    return rc ? rc : mc__meta_file_key_unlink(f, name, rev);
}

DIR *mc__meta_file_opendir(mc_meta_file_t *f, const char *sub)
{
    int fd = openat(f->dir_fd, sub, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    DIR *d = fd >= 0 ? fdopendir(fd) : NULL;

    if (!d) {
        mc__meta_file_err(f, "open", sub);
        if (fd >= 0)
            close(fd);
    }
    return d;
}

/* Delete the keys bound to lease (lease 0: to any dead lease). */
int mc__meta_file_sweep_keys(mc_meta_file_t *f, int64_t lease)
{
    mc_meta_file_lease_memo_t memo = {.n = 0};
    DIR *d = mc__meta_file_opendir(f, "keys");
    struct dirent *de;
    int rc = d ? 0 : -MC_EMETA;

    while (d && rc == 0 && (de = readdir(d))) {
        mc_meta_file_hdr_t hdr;
        int fd;
        if (de->d_name[0] == '.' || mc__meta_file_record_open(f, de->d_name, &hdr, &fd) != 0)
            continue;
        close(fd);
        if (hdr.lease == 0)
            continue;
        if (lease ? hdr.lease == lease : !file_lease_alive_memo(f, &memo, hdr.lease))
            rc = mc__meta_file_key_remove(f, de->d_name);
    }
    if (d)
        closedir(d);
    return rc;
}

void mc__meta_file_sweep_leases(mc_meta_file_t *f)
{
    DIR *d = mc__meta_file_opendir(f, "leases");
    struct dirent *de;

    while (d && (de = readdir(d))) {
        int64_t id = strtoll(de->d_name, NULL, 10);
        if (de->d_name[0] != '.' && !mc__meta_file_lease_alive(f, id))
            unlinkat(f->leases_fd, de->d_name, 0);
    }
    if (d)
        closedir(d);
}

/* Keys first: a key whose lease file is gone is dead anyway. */
int mc__meta_file_reap_locked(mc_meta_file_t *f)
{
    int rc = mc__meta_file_sweep_keys(f, 0);

    mc__meta_file_sweep_leases(f);
    return rc;
}

int mc__meta_file_reap(mc_meta_file_t *f)
{
    int lock_fd = -1, rc = mc__meta_file_lock(f, LOCK_EX, &lock_fd);

    if (rc)
        return rc;
    rc = mc__meta_file_reap_locked(f);
    mc__meta_file_unlock(lock_fd);
    return rc;
}

/* ---- scans ---- */

static int file_scan_grow(mc_meta_file_scan_t *s)
{
    size_t cap = s->cap ? s->cap * 2 : 16;
    mc_meta_kv_t *kvs = realloc(s->kvs, cap * sizeof(*kvs));

    if (!kvs)
        return mc__set_error(-ENOMEM, "no memory to list %zu metadata keys", cap);
    s->kvs = kvs;
    s->cap = cap;
    return 0;
}

static int file_scan_read(mc_meta_file_t *f, mc_meta_file_scan_t *s, mc_meta_kv_t *kv,
                          const char *name)
{
    mc_meta_file_hdr_t hdr;
    int fd, rc = mc__meta_file_record_open(f, name, &hdr, &fd);

    if (rc)
        return rc;
    kv->mod_revision = hdr.mod_rev;
    kv->lease = hdr.lease;
    kv->value_len = hdr.value_len;
    if (!file_lease_alive_memo(f, &s->memo, hdr.lease)) {
        s->expired = true;
        rc = -ENOENT;
    } else if (!s->want || s->want(s->arg, kv)) {
        rc = mc__meta_file_record_value(f, fd, &hdr, &kv->value);
    }
    close(fd);
    return rc;
}

static int file_scan_entry(mc_meta_file_t *f, mc_meta_file_scan_t *s, const char *name)
{
    mc_meta_kv_t *kv;
    int rc;

    if (s->count == s->cap && (rc = file_scan_grow(s)) != 0)
        return rc;
    kv = &s->kvs[s->count];
    memset(kv, 0, sizeof(*kv));
    if (mc__meta_file_key_decode(name, &kv->key, &kv->key_len) != 0)
        return 0; /* not ours */
    if (kv->key_len < s->prefix_len ||
        (s->prefix_len && memcmp(kv->key, s->prefix, s->prefix_len) != 0)) {
        free(kv->key);
        return 0;
    }
    rc = file_scan_read(f, s, kv, name);
    if (rc) {
        mc__meta_kv_free(kv);
        return rc == -ENOENT ? 0 : rc;
    }
    s->count++;
    return 0;
}

int mc__meta_file_kv_cmp(const void *a, const void *b)
{
    const mc_meta_kv_t *x = a, *y = b;
    size_t n = x->key_len < y->key_len ? x->key_len : y->key_len;
    int c = memcmp(x->key, y->key, n);

    if (c)
        return c;
    return (x->key_len > y->key_len) - (x->key_len < y->key_len);
}

static void file_scan_reset(mc_meta_file_scan_t *s)
{
    mc__meta_kvs_free(s->kvs, s->count);
    s->kvs = NULL;
    s->count = s->cap = 0;
    s->expired = false;
    s->memo.n = 0;
}

/* One pass over keys/ under the shared lock. On error s->kvs is freed. */
static int file_scan_once(mc_meta_file_t *f, mc_meta_file_scan_t *s)
{
    DIR *d;
    struct dirent *de;
    int lock_fd = -1, rc = mc__meta_file_lock(f, LOCK_SH, &lock_fd);

    if (rc)
        return rc;
    d = mc__meta_file_opendir(f, "keys");
    rc = d ? file_rev_read(f, &s->rev) : -MC_EMETA;
    while (rc == 0 && (de = readdir(d)))
        if (de->d_name[0] != '.')
            rc = file_scan_entry(f, s, de->d_name);
    if (d)
        closedir(d);
    mc__meta_file_unlock(lock_fd);
    if (rc) {
        file_scan_reset(s);
        return rc;
    }
    if (s->count > 1)
        qsort(s->kvs, s->count, sizeof(*s->kvs), mc__meta_file_kv_cmp);
    return 0;
}

/* Scan; if expired keys were seen, reap them and scan again so that their deletion has a
 * revision before anyone reports it. */
int mc__meta_file_scan(mc_meta_file_t *f, mc_meta_file_scan_t *s)
{
    int rc = file_scan_once(f, s);

    if (rc || !s->expired)
        return rc;
    file_scan_reset(s);
    rc = mc__meta_file_reap(f);
    return rc ? rc : file_scan_once(f, s);
}
