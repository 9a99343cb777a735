/* The file:// store's deletion log (see meta_file_int.h): appended under the exclusive lock
 * before a key file is unlinked, compacted past its bound, read by watches that start from a
 * past revision so that they report what was deleted since. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <mooncake/error.h>

#include "metadata/meta_file_int.h"
#include "util/log.h"

/* Read a whole file into a malloc'ed NUL-terminated buffer. -ENOENT if it does not exist. */
static int file_read_all(mc_meta_file_t *f, int dir_fd, const char *name, char **buf_p,
                         size_t *len_p)
{
    int fd = openat(dir_fd, name, O_RDONLY | O_CLOEXEC);
    struct stat st;
    char *buf;
    ssize_t n;

    if (fd < 0)
        return errno == ENOENT ? -ENOENT : mc__meta_file_err(f, "open", name);
    if (fstat(fd, &st) < 0) {
        close(fd);
        return mc__meta_file_err(f, "stat", name);
    }
    buf = malloc((size_t)st.st_size + 1);
    n = buf ? pread(fd, buf, (size_t)st.st_size, 0) : 0;
    close(fd);
    if (!buf)
        return mc__set_error(-ENOMEM, "no memory to read %s/%s", f->dir, name);
    if (n < 0) {
        free(buf);
        return mc__meta_file_err(f, "read", name);
    }
    buf[n] = '\0';
    *buf_p = buf;
    *len_p = (size_t)n;
    return 0;
}

/* Parse "<rev> <name>\n" at p; returns the next line, or NULL if p holds no whole valid line
 * (a torn append is skipped by the caller going on at the next '\n'). */
static const char *file_dellog_line(const char *p, int64_t *rev_p, char name[NAME_MAX + 1])
{
    char *end;
    const char *nl = strchr(p, '\n'), *sp;
    long long rev = strtoll(p, &end, 10);

    if (!nl || end == p || *end != ' ' || rev <= 0)
        return NULL;
    sp = end + 1;
    if (nl == sp || (size_t)(nl - sp) > NAME_MAX || memchr(sp, ' ', (size_t)(nl - sp)))
        return NULL;
    memcpy(name, sp, (size_t)(nl - sp));
    name[nl - sp] = '\0';
    *rev_p = rev;
    return nl + 1;
}

/* The first entry: after the header line "MCDL1 <floor>" (the newest revision dropped). */
static const char *file_dellog_entries(const char *buf, int64_t *floor_p)
{
    long long dropped = 0;
    const char *nl = strchr(buf, '\n');

    if (strncmp(buf, "MCDL1 ", 6) != 0 || !nl)
        return buf;
    if (sscanf(buf, "MCDL1 %lld", &dropped) == 1)
        *floor_p = dropped;
    return nl + 1;
}

/* Keep the newer half of the log, cut between two revisions (a delete_prefix shares one), and
 * name the newest revision dropped in the header. */
static int file_dellog_compact(mc_meta_file_t *f)
{
    char *buf, head[48], name[NAME_MAX + 1];
    const char *p, *next, *cut = NULL;
    int64_t rev, prev = 0, dropped = 0;
    size_t len;
    int rc = file_read_all(f, f->dir_fd, MC_META_FILE_DELLOG, &buf, &len);

    if (rc)
        return rc;
    for (p = file_dellog_entries(buf, &dropped); *p; p = next) {
        next = file_dellog_line(p, &rev, name);
        if (!next) {
            next = strchr(p, '\n');
            next = next ? next + 1 : p + strlen(p);
            continue;
        }
        if ((size_t)(p - buf) >= len / 2 && rev != prev) {
            cut = p;
            break;
        }
        prev = dropped = rev;
    }
    if (!cut)
        cut = buf + len;
    snprintf(head, sizeof(head), "MCDL1 %" PRId64 "\n", dropped);
    rc = mc__meta_file_write_atomic(f, f->dir_fd, MC_META_FILE_DELLOG, head, cut,
                                    len - (size_t)(cut - buf));
    free(buf);
    return rc;
}

/* Caller holds the exclusive lock. A new log starts with its header. */
int mc__meta_file_dellog_append(mc_meta_file_t *f, int64_t rev, const char *name)
{
    char line[NAME_MAX + 64];
    struct stat st;
    int n, fd = openat(f->dir_fd, MC_META_FILE_DELLOG, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC,
                       0600);

    if (fd < 0)
        return mc__meta_file_err(f, "open", MC_META_FILE_DELLOG);
    if (fstat(fd, &st) < 0) {
        close(fd);
        return mc__meta_file_err(f, "stat", MC_META_FILE_DELLOG);
    }
    n = snprintf(line, sizeof(line), "%s%" PRId64 " %s\n", st.st_size ? "" : "MCDL1 0\n", rev,
                 name);
    if (mc__meta_file_write_full(fd, line, (size_t)n) < 0) {
        close(fd);
        return mc__meta_file_err(f, "append to", MC_META_FILE_DELLOG);
    }
    close(fd);
    /* The deletion is logged; a log that could not be cut is only longer, until the next try. */
    if ((size_t)st.st_size + (size_t)n > MC_META_FILE_DELLOG_MAX && file_dellog_compact(f) != 0)
        mc_warn("metadata store %s: cannot shorten %s: %s", f->dir, MC_META_FILE_DELLOG,
                mc_last_error());
    return 0;
}

/* Append the entry to r if its key is under the prefix and its revision in range. */
static int file_dellog_take(mc_meta_file_dellog_t *r, const char *name, int64_t rev)
{
    mc_meta_kv_t kv = {.mod_revision = rev};

    if (rev < r->since || rev > r->until ||
        mc__meta_file_key_decode(name, &kv.key, &kv.key_len) != 0)
        return 0;
    if (kv.key_len < r->prefix_len || memcmp(kv.key, r->prefix, r->prefix_len) != 0) {
        free(kv.key);
        return 0;
    }
    if (r->count == r->cap) {
        size_t cap = r->cap ? r->cap * 2 : 16;
        mc_meta_kv_t *e = realloc(r->entries, cap * sizeof(*e));
        if (!e) {
            free(kv.key);
            return mc__set_error(-ENOMEM, "no memory for %zu deletions", cap);
        }
        r->entries = e;
        r->cap = cap;
    }
    r->entries[r->count++] = kv;
    return 0;
}

int mc__meta_file_dellog_read(mc_meta_file_t *f, mc_meta_file_dellog_t *r)
{
    char *buf, name[NAME_MAX + 1];
    const char *p, *next;
    int64_t rev;
    size_t len;
    int rc = file_read_all(f, f->dir_fd, MC_META_FILE_DELLOG, &buf, &len);

    r->floor = 0;
    if (rc)
        return rc == -ENOENT ? 0 : rc; /* nothing was ever deleted */
    for (p = file_dellog_entries(buf, &r->floor); rc == 0 && *p; p = next) {
        next = file_dellog_line(p, &rev, name);
        if (next) {
            rc = file_dellog_take(r, name, rev);
            continue;
        }
        next = strchr(p, '\n');
        next = next ? next + 1 : p + strlen(p);
    }
    free(buf);
    return rc;
}
