/* The public face of file buffers (engine.h): register a file or block device range, unregister
 * it, describe one of ours or a peer's. */
#include <errno.h>
#include <fcntl.h>
#include <linux/fs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "file_int.h"

#define FILE_FLAGS (MC_FILE_READONLY | MC_FILE_DURABLE | MC_FILE_CREATE | MC_FILE_BUFFERED)

/* The size of a regular file or a block device. */
static int file_size(int fd, const char *path, uint64_t *size_p, bool *blk_p)
{
    struct stat st;

    if (fstat(fd, &st) < 0)
        return mc__set_error(-errno, "file %s: fstat: %s", path, strerror(errno));
    *blk_p = S_ISBLK(st.st_mode);
    if (S_ISREG(st.st_mode)) {
        *size_p = (uint64_t)st.st_size;
        return 0;
    }
    if (*blk_p && ioctl(fd, BLKGETSIZE64, size_p) == 0)
        return 0;
    return mc__set_error(-EINVAL, "file %s: %s", path,
                         *blk_p ? "cannot read the device's size"
                                : "neither a regular file nor a block device");
}

/* What O_DIRECT needs of offsets, lengths and memory: the file system says (statx, 6.1+), else
 * the device's logical block size, else a page. */
static unsigned dio_align(int fd, bool blk)
{
    unsigned a = 0;
#ifdef STATX_DIOALIGN
    struct statx sx;
    if (statx(fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &sx) == 0 && (sx.stx_mask & STATX_DIOALIGN) &&
        sx.stx_dio_offset_align)
        a = sx.stx_dio_offset_align > sx.stx_dio_mem_align ? sx.stx_dio_offset_align
                                                           : sx.stx_dio_mem_align;
#endif
    int ss;
    if (!a && blk && ioctl(fd, BLKSSZGET, &ss) == 0 && ss > 0)
        a = (unsigned)ss;
    return a && a <= (1u << 20) && !(a & (a - 1)) ? a : 4096;
}

/* The same file again, with O_DIRECT (through /proc/self/fd: the very inode, whatever became
 * of the path); -1 where the file system has none. */
static int open_direct(int fd, int flags, const char *path)
{
    char proc[64];
    int dfd;

    snprintf(proc, sizeof(proc), "/proc/self/fd/%d", fd);
    dfd = open(proc, (flags & ~(O_CREAT | O_TRUNC)) | O_DIRECT | O_CLOEXEC);
    if (dfd < 0)
        mc_info("file %s: no O_DIRECT (%s): its I/O goes through the page cache", path,
                strerror(errno));
    return dfd;
}

/* The range [o->offset, +length) of path, checked (and the file extended with CREATE). */
static int range_check(int fd, const char *path, const mc_file_opts_t *o, uint64_t *len_p,
                       bool *blk_p)
{
    uint64_t size, len;
    int rc = file_size(fd, path, &size, blk_p);

    if (rc)
        return rc;
    len = o->length ? o->length : size > o->offset ? size - o->offset : 0;
    if (!len)
        return mc__set_error(-EINVAL, "file %s: nothing to register at offset %llu (%llu bytes)",
                             path, (unsigned long long)o->offset, (unsigned long long)size);
    if (o->offset + len < o->offset || o->offset + len > (uint64_t)INT64_MAX)
        return mc__set_error(-EINVAL, "file %s: %llu+%llu wraps around", path,
                             (unsigned long long)o->offset, (unsigned long long)len);
    bool grow = (o->flags & MC_FILE_CREATE) && !*blk_p;
    if (o->offset + len > size && !grow)
        return mc__set_error(-EINVAL, "file %s: %llu+%llu is beyond its end (%llu bytes)", path,
                             (unsigned long long)o->offset, (unsigned long long)len,
                             (unsigned long long)size);
    if (o->offset + len > size && ftruncate(fd, (off_t)(o->offset + len)) < 0)
        return mc__set_error(-errno, "file %s: cannot extend it to %llu bytes: %s", path,
                             (unsigned long long)(o->offset + len), strerror(errno));
    *len_p = len;
    return 0;
}

/* Open path as o says. Non-blocking until its type is checked: a FIFO opened for reading would
 * wait for a writer. created: the file did not exist (CREATE made it). */
static int open_path(const char *path, const mc_file_opts_t *o, int flags, bool *created)
{
    int fd = open(path, flags | O_NONBLOCK);

    *created = false;
    if (fd < 0 && errno == ENOENT && (o->flags & MC_FILE_CREATE)) {
        fd = open(path, flags | O_NONBLOCK | O_CREAT | O_EXCL, 0644);
        *created = fd >= 0;
    }
    if (fd < 0)
        return mc__set_error(-errno, "file %s: %s", path, strerror(errno));
    return fd;
}

static int file_open(const char *path, const mc_file_opts_t *o, file_buf_t **f_p, uint64_t *len_p,
                     bool *created_p)
{
    int flags = ((o->flags & MC_FILE_READONLY) ? O_RDONLY : O_RDWR) | O_CLOEXEC, rc;
    size_t plen = strlen(path);
    file_buf_t *f;
    bool blk = false, created;
    int fd = open_path(path, o, flags, &created);

    if (fd < 0)
        return fd;
    *created_p = created;
    rc = range_check(fd, path, o, len_p, &blk);
    if (!rc && fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK) < 0)
        rc = mc__set_error(-errno, "file %s: %s", path, strerror(errno));
    f = rc ? NULL : calloc(1, sizeof(*f) + plen + 1);
    if (!f) {
        close(fd);
        return rc ? rc : mc__set_error(-ENOMEM, "out of memory");
    }
    f->fd = fd;
    f->fd_direct = (o->flags & MC_FILE_BUFFERED) ? -1 : open_direct(fd, flags, path);
    f->fixed = f->fixed_direct = -1;
    f->offset = o->offset;
    f->flags = o->flags;
    f->align = dio_align(fd, blk);
    memcpy(f->path, path, plen + 1);
    *f_p = f;
    return 0;
}

int mc_file_register(mc_engine_t *e, const char *path, const mc_file_opts_t *opts, uint64_t *addr_p)
{
    mc_file_opts_t o = {0};
    file_buf_t *f = NULL;
    uint64_t len = 0;
    bool created = false, direct = false;
    int rc;

    if (!e || !path || !*path || !addr_p)
        return mc__set_error(-EINVAL, "mc_file_register: NULL or empty argument");
    if (opts && (opts->size < offsetof(mc_file_opts_t, offset) || opts->size > sizeof(o)))
        return mc__set_error(-EINVAL, "mc_file_opts_t.size is %zu, expected %zu", opts->size,
                             sizeof(o));
    if (opts)
        memcpy(&o, opts, opts->size);
    if ((o.flags & ~FILE_FLAGS) || ((o.flags & MC_FILE_READONLY) && (o.flags & MC_FILE_CREATE)))
        return mc__set_error(-EINVAL, "mc_file_register: flags 0x%x", o.flags);
    MC_LOG_SCOPE(e->cfg.log_level);
    if (!file_of(e))
        return mc__set_error(-MC_ENODEV, "the file transport does not run in this engine");
    rc = mc__file_setup(e, true);
    if (!rc)
        rc = file_open(path, &o, &f, &len, &created);
    if (!rc) {
        direct = f->fd_direct >= 0;
        /* f is the buffer's from here on, freed by its deregistration (or this failing) */
        rc = mc__mem_register_opaque(e, mc__file_slot, len, "file", f, addr_p);
    }
    if (rc && created) /* a refused registration leaves no file behind */
        unlink(path);
    if (!rc)
        mc_info("file %s: %llu bytes from offset %llu registered at 0x%llx (%s)", path,
                (unsigned long long)len, (unsigned long long)o.offset, (unsigned long long)*addr_p,
                direct ? "O_DIRECT where aligned" : "page cache");
    return rc;
}

/* The file buffer of ours holding [addr, addr+len), referenced; NULL if none. */
static mc_buffer_t *own_file(mc_engine_t *e, uint64_t addr, uint64_t len)
{
    return file_of(e) ? mc__mem_get_owned(e, mc__file_slot, addr, len) : NULL;
}

int mc_file_unregister(mc_engine_t *e, uint64_t addr)
{
    mc_buffer_t *b;
    bool starts;

    if (!e)
        return mc__set_error(-EINVAL, "mc_file_unregister: NULL engine");
    b = own_file(e, addr, 1);
    starts = b && b->addr == addr;
    if (b)
        mc__mem_put(e, b);
    if (!starts)
        return mc__set_error(-ENOENT, "mc_file_unregister: no file buffer starts at 0x%llx",
                             (unsigned long long)addr);
    return mc_mem_unregister(e, (void *)(uintptr_t)addr);
}

static void info_fill(mc_file_info_t *out, uint64_t addr, uint64_t len, uint64_t offset,
                      unsigned flags, unsigned align, const char *io, const char *path)
{
    memset(out, 0, sizeof(*out));
    out->addr = addr;
    out->length = len;
    out->offset = offset;
    out->flags = flags;
    out->direct_align = align;
    snprintf(out->io, sizeof(out->io), "%s", io);
    snprintf(out->path, sizeof(out->path), "%s", path);
}

/* A peer's, from its descriptor. */
static int peer_file_info(mc_engine_t *e, mc_segment_id_t id, uint64_t addr, mc_file_info_t *out)
{
    int rc = 0;

    pthread_rwlock_rdlock(&e->peers_lock);
    mc_peer_t *p = mc__peer_get(e, id);
    const mc_desc_buffer_t *b = p ? mc__desc_find(&p->desc, addr, 1) : NULL;
    const file_desc_buf_t *fb =
        b && b->owner == mc__file_slot + 1 ? mc__desc_part(&p->desc, b, mc__file_slot) : NULL;
    const file_desc_t *d = p ? p->desc.tp[mc__file_slot] : NULL;
    if (!p)
        rc = mc__set_error(-ENOENT, "no open segment with id %u", id);
    else if (!fb)
        rc = mc__set_error(-ENOENT, "segment %s has no file buffer at 0x%llx", p->name,
                           (unsigned long long)addr);
    else
        info_fill(out, b->addr, b->len, fb->offset, fb->flags, fb->align, d ? d->io : "?",
                  fb->path);
    pthread_rwlock_unlock(&e->peers_lock);
    return rc;
}

int mc_file_info(mc_engine_t *e, mc_segment_id_t id, uint64_t addr, mc_file_info_t *out)
{
    mc_buffer_t *b;

    if (!e || !out)
        return mc__set_error(-EINVAL, "mc_file_info: NULL argument");
    if (id != MC_SEGMENT_INVALID)
        return peer_file_info(e, id, addr, out);
    b = own_file(e, addr, 1);
    if (!b)
        return mc__set_error(-ENOENT, "no file buffer of this engine at 0x%llx",
                             (unsigned long long)addr);
    const file_buf_t *f = file_buf(b);
    info_fill(out, b->addr, b->len, f->offset, f->flags,
              f->fd_direct >= 0 && !atomic_load(&f->no_direct) ? f->align : 0,
              mc__file_io_name(&file_of(e)->io), f->path);
    mc__mem_put(e, b);
    return 0;
}
