/* Watches of the file:// store: diff successive scans of the prefix. A watch keeps the last
 * scan (keys and mod_revisions, no values); a key new or changed since is a PUT, a key gone is a
 * DELETE at the revision the deletion log gives it. A watch from a past revision also reports,
 * from the log, the keys deleted since then that are still absent. Changes of one key between
 * two scans come as one event (its state now). inotify on keys/ wakes the watcher early; a tick
 * notices lease expiry, which changes no file until someone reaps it. */
#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <time.h>
#include <unistd.h>

#include <mooncake/error.h>

#include "metadata/meta_file_int.h"
#include "util/log.h"

#define FILE_WATCH_TICK_MS 100

/* A watch is used by one thread at a time; it shares nothing with other watches. */
typedef struct file_watch {
    mc_meta_watch_t base;
    char *prefix;
    size_t prefix_len;
    int64_t start_rev;
    int64_t rev;        /* the store revision of the last scan */
    bool primed;        /* the first scan has been taken */
    bool leased;        /* the snapshot holds leased keys, which may expire without an event */
    int ino_fd;         /* -1: no inotify, poll only */
    mc_meta_kv_t *snap; /* the last scan, sorted by key, without values */
    size_t nsnap;
    mc_meta_event_t *events; /* pending, in delivery order */
    size_t ev_head, ev_count, ev_cap;
} file_watch_t;

static mc_meta_kv_t *file_snap_find(file_watch_t *w, const mc_meta_kv_t *kv)
{
    /* bsearch and qsort must not see NULL, even with a count of 0. */
    return w->nsnap ? bsearch(kv, w->snap, w->nsnap, sizeof(*kv), mc__meta_file_kv_cmp) : NULL;
}

/* Read the value (and so report a PUT) of keys new or changed since the last scan. */
static bool file_watch_want(void *arg, const mc_meta_kv_t *kv)
{
    file_watch_t *w = arg;
    mc_meta_kv_t *old;

    if (!w->primed)
        return w->start_rev > 0 && kv->mod_revision >= w->start_rev;
    old = file_snap_find(w, kv);
    return !old || old->mod_revision != kv->mod_revision;
}

static int file_watch_push(file_watch_t *w, mc_meta_event_type_t type, mc_meta_kv_t *kv)
{
    if (w->ev_count == w->ev_cap) {
        size_t cap = w->ev_cap ? w->ev_cap * 2 : 16;
        mc_meta_event_t *ev = realloc(w->events, cap * sizeof(*ev));
        if (!ev)
            return mc__set_error(-ENOMEM, "no memory for %zu watch events", cap);
        w->events = ev;
        w->ev_cap = cap;
    }
    w->events[w->ev_count].type = type;
    w->events[w->ev_count++].kv = *kv;
    return 0;
}

static int file_event_rev_cmp(const void *a, const void *b)
{
    const mc_meta_event_t *x = a, *y = b;

    return (x->kv.mod_revision > y->kv.mod_revision) - (x->kv.mod_revision < y->kv.mod_revision);
}

/* PUT events for the scanned entries that carry a value, ordered by revision. The values move
 * into the events; the keys are copied, since the entries become the next snapshot. */
static int file_watch_queue_puts(file_watch_t *w, mc_meta_file_scan_t *s)
{
    for (size_t i = 0; i < s->count; i++) {
        mc_meta_kv_t kv = s->kvs[i];
        if (!kv.value)
            continue;
        kv.key = malloc(kv.key_len + 1);
        if (kv.key)
            memcpy(kv.key, s->kvs[i].key, kv.key_len + 1);
        if (!kv.key || file_watch_push(w, MC_META_PUT, &kv) != 0) {
            free(kv.key);
            return mc__set_error(-ENOMEM, "no memory for a watch event");
        }
        s->kvs[i].value = NULL;
    }
    return 0;
}

static int file_watch_push_del(file_watch_t *w, const mc_meta_kv_t *key, int64_t rev)
{
    mc_meta_kv_t kv = {.key_len = key->key_len, .mod_revision = rev};

    kv.key = malloc(key->key_len + 1);
    kv.value = calloc(1, 1);
    if (kv.key)
        memcpy(kv.key, key->key, key->key_len + 1);
    if (!kv.key || !kv.value || file_watch_push(w, MC_META_DELETE, &kv) != 0) {
        mc__meta_kv_free(&kv);
        return mc__set_error(-ENOMEM, "no memory for a watch event");
    }
    return 0;
}

static const mc_meta_kv_t *file_kvs_find(const mc_meta_kv_t *kvs, size_t n, const mc_meta_kv_t *kv)
{
    return n ? bsearch(kv, kvs, n, sizeof(*kv), mc__meta_file_kv_cmp) : NULL;
}

/* By key, then by revision. */
static int file_del_cmp(const void *a, const void *b)
{
    const mc_meta_kv_t *x = a, *y = b;
    int c = mc__meta_file_kv_cmp(a, b);

    return c ? c : (x->mod_revision > y->mod_revision) - (x->mod_revision < y->mod_revision);
}

/* The deletions under the prefix at revisions since..until, the last one of each key only,
 * sorted by key. */
static int file_watch_read_dels(file_watch_t *w, int64_t since, int64_t until,
                                mc_meta_file_dellog_t *r)
{
    size_t n = 0;
    int rc;

    r->prefix = w->prefix;
    r->prefix_len = w->prefix_len;
    r->since = since;
    r->until = until;
    rc = mc__meta_file_dellog_read(MC_META_FILE(w->base.meta), r);
    if (rc)
        return rc; /* the caller frees r->entries, whatever happened */
    if (r->count > 1)
        qsort(r->entries, r->count, sizeof(*r->entries), file_del_cmp);
    for (size_t i = 0; i < r->count; i++) {
        if (i + 1 < r->count && mc__meta_file_kv_cmp(&r->entries[i], &r->entries[i + 1]) == 0)
            mc__meta_kv_free(&r->entries[i]);
        else
            r->entries[n++] = r->entries[i];
    }
    r->count = n;
    return 0;
}

/* First scan of a watch from a past revision: the keys deleted since that are absent now. */
static int file_watch_dels_since(file_watch_t *w, mc_meta_file_scan_t *s)
{
    mc_meta_file_dellog_t r = {.entries = NULL};
    int rc = file_watch_read_dels(w, w->start_rev, s->rev, &r);

    if (rc == 0 && r.floor >= w->start_rev)
        mc_warn("metadata watch of %.*s from revision %lld: deletions up to revision %lld are "
                "no longer in the deletion log of %s and are not reported",
                (int)w->prefix_len, w->prefix, (long long)w->start_rev, (long long)r.floor,
                MC_META_FILE(w->base.meta)->dir);
    for (size_t i = 0; rc == 0 && i < r.count; i++)
        if (!file_kvs_find(s->kvs, s->count, &r.entries[i]))
            rc = file_watch_push_del(w, &r.entries[i], r.entries[i].mod_revision);
    mc__meta_kvs_free(r.entries, r.count);
    return rc;
}

/* Later scans: snapshot keys missing from this scan, deleted after the last one. The log says
 * when; a deletion it no longer holds is reported at the scan's revision. */
static int file_watch_dels_gone(file_watch_t *w, mc_meta_file_scan_t *s)
{
    mc_meta_file_dellog_t r = {.entries = NULL};
    bool read = false;
    int rc = 0;

    for (size_t i = 0; rc == 0 && i < w->nsnap; i++) {
        const mc_meta_kv_t *old = &w->snap[i], *del;
        if (file_kvs_find(s->kvs, s->count, old))
            continue;
        if (!read && (rc = file_watch_read_dels(w, w->rev + 1, s->rev, &r)) != 0)
            break;
        read = true;
        del = file_kvs_find(r.entries, r.count, old);
        rc = file_watch_push_del(w, old, del ? del->mod_revision : s->rev);
    }
    mc__meta_kvs_free(r.entries, r.count);
    return rc;
}

/* Queue the events of a scan, in revision order (keys differ: one event per key per scan). */
static int file_watch_queue(file_watch_t *w, mc_meta_file_scan_t *s)
{
    size_t first = w->ev_count;
    int rc = file_watch_queue_puts(w, s);

    if (rc == 0 && w->primed)
        rc = file_watch_dels_gone(w, s);
    else if (rc == 0 && w->start_rev > 0)
        rc = file_watch_dels_since(w, s);
    if (rc) {
        for (size_t i = first; i < w->ev_count; i++)
            mc__meta_kv_free(&w->events[i].kv);
        w->ev_count = first;
        return rc;
    }
    if (w->ev_count - first > 1)
        qsort(w->events + first, w->ev_count - first, sizeof(*w->events), file_event_rev_cmp);
    return 0;
}

static int file_watch_poll(file_watch_t *w)
{
    mc_meta_file_scan_t s = {.prefix = w->prefix, .prefix_len = w->prefix_len};
    int rc;

    s.want = file_watch_want;
    s.arg = w;
    rc = mc__meta_file_scan(MC_META_FILE(w->base.meta), &s);
    if (rc == 0)
        rc = file_watch_queue(w, &s);
    if (rc) {
        mc__meta_kvs_free(s.kvs, s.count);
        return rc;
    }
    mc__meta_kvs_free(w->snap, w->nsnap);
    w->snap = s.kvs;
    w->nsnap = s.count;
    w->rev = s.rev;
    w->primed = true;
    w->leased = false;
    for (size_t i = 0; i < s.count; i++) {
        free(s.kvs[i].value);
        s.kvs[i].value = NULL;
        w->leased |= s.kvs[i].lease != 0;
    }
    return 0;
}

void mc__meta_file_watch_destroy(mc_meta_watch_t *watch)
{
    file_watch_t *w = (file_watch_t *)watch;

    for (size_t i = w->ev_head; i < w->ev_count; i++)
        mc__meta_kv_free(&w->events[i].kv);
    free(w->events);
    mc__meta_kvs_free(w->snap, w->nsnap);
    if (w->ino_fd >= 0)
        close(w->ino_fd);
    free(w->prefix);
    free(w);
}

/* inotify only shortens the wait; without it the watch still works by polling. */
static int file_watch_inotify(mc_meta_file_t *f)
{
    char path[PATH_MAX];
    int fd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);

    snprintf(path, sizeof(path), "%s/keys", f->dir);
    if (fd >= 0 &&
        inotify_add_watch(fd, path, IN_MOVED_TO | IN_MOVED_FROM | IN_DELETE | IN_CLOSE_WRITE) < 0) {
        mc_warn("metadata watch on %s: inotify failed (%s), polling only", path, strerror(errno));
        close(fd);
        fd = -1;
    }
    return fd;
}

int mc__meta_file_watch_create(mc_meta_t *meta, const void *prefix, size_t prefix_len,
                               int64_t start_revision, mc_meta_watch_t **watch_p)
{
    file_watch_t *w = calloc(1, sizeof(*w));
    int rc;

    if (!w || !(w->prefix = malloc(prefix_len + 1))) {
        free(w);
        return mc__set_error(-ENOMEM, "no memory for a metadata watch");
    }
    w->base.meta = meta;
    if (prefix_len)
        memcpy(w->prefix, prefix, prefix_len);
    w->prefix_len = prefix_len;
    w->start_rev = start_revision;
    /* Watch before the first scan, so that no change falls between them. */
    w->ino_fd = file_watch_inotify(MC_META_FILE(meta));
    rc = file_watch_poll(w);
    if (rc) {
        mc__meta_file_watch_destroy(&w->base);
        return rc;
    }
    *watch_p = &w->base;
    return 0;
}

/* Timeouts follow CLOCK_MONOTONIC, so that a wall clock step neither hangs nor skips them. */
static int64_t file_mono_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static bool file_watch_pop(file_watch_t *w, mc_meta_event_t *event_p)
{
    if (w->ev_head == w->ev_count)
        return false;
    *event_p = w->events[w->ev_head++];
    if (w->ev_head == w->ev_count)
        w->ev_head = w->ev_count = 0;
    return true;
}

/* Wait up to wait_ms for an inotify event; true if the keys directory changed. */
static bool file_watch_wait(file_watch_t *w, int wait_ms)
{
    struct pollfd pfd = {.fd = w->ino_fd, .events = POLLIN};
    char buf[4096] __attribute__((aligned(__alignof__(struct inotify_event))));
    bool changed = false;

    if (w->ino_fd < 0) {
        poll(NULL, 0, wait_ms);
        return true;
    }
    if (poll(&pfd, 1, wait_ms) <= 0)
        return false;
    while (read(w->ino_fd, buf, sizeof(buf)) > 0)
        changed = true;
    return changed;
}

int mc__meta_file_watch_next(mc_meta_watch_t *watch, int timeout_ms, mc_meta_event_t *event_p)
{
    file_watch_t *w = (file_watch_t *)watch;
    int64_t deadline = file_mono_ms() + timeout_ms;
    bool changed = true;

    for (;;) {
        int64_t left;
        if (file_watch_pop(w, event_p))
            return 0;
        if (changed || w->leased) {
            int rc = file_watch_poll(w);
            if (rc)
                return rc;
            if (file_watch_pop(w, event_p))
                return 0;
        }
        left = deadline - file_mono_ms();
        if (timeout_ms >= 0 && left <= 0)
            return mc__set_error(-ETIMEDOUT, "no metadata event within %d ms", timeout_ms);
        if (timeout_ms < 0 || left > FILE_WATCH_TICK_MS)
            left = FILE_WATCH_TICK_MS;
        changed = file_watch_wait(w, (int)left);
    }
}
