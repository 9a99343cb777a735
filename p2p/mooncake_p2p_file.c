/* mooncake-p2p: the files it serves from and fetches into, mapped so that the engine moves
 * their bytes without a copy. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "mooncake_p2p_tool.h"

static int fail(const char *what, const char *path)
{
    fprintf(stderr, "mooncake-p2p: %s %s: %s\n", what, path, strerror(errno));
    return EXIT_LOCAL;
}

/* Shared and read-only: the pages are the page cache's, never copied (a private writable
 * mapping was copied page by page when rdma pinned it for write access), and the engine lets
 * peers only read memory mapped without write permission (its WRITEs are refused). */
int tool_map_in(const char *path, tool_map_t *m)
{
    struct stat st;
    int fd = open(path, O_RDONLY | O_CLOEXEC);

    memset(m, 0, sizeof(*m));
    m->part_fd = -1;
    if (fd < 0 || fstat(fd, &st)) {
        int rc = fail("cannot open", path);
        if (fd >= 0)
            close(fd);
        return rc;
    }
    if (!S_ISREG(st.st_mode) || st.st_size == 0) {
        fprintf(stderr, "mooncake-p2p: %s: %s\n", path,
                S_ISREG(st.st_mode) ? "empty file (an object has at least one byte)"
                                    : "not a regular file");
        close(fd);
        return EXIT_USAGE;
    }
    m->len = (size_t)st.st_size;
    m->addr = mmap(NULL, m->len, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (m->addr == MAP_FAILED) {
        m->addr = NULL;
        return fail("cannot map", path);
    }
    return 0;
}

/* The part file, open and locked: a descriptor, or -EXIT_*. A fetch that held the lock may have
 * renamed (committed) or removed the file the descriptor names between the open and the lock:
 * then the name is opened again. */
static int part_lock(const char *path, const char *part)
{
    struct stat by_fd, by_name;

    for (int tries = 0; tries < 100; tries++) {
        int fd = open(part, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
        if (fd < 0)
            return -fail("cannot create", part);
        if (flock(fd, LOCK_EX | LOCK_NB)) {
            if (errno == EWOULDBLOCK)
                fprintf(stderr, "mooncake-p2p: %s: another fetch writes into it (%s is locked)\n",
                        path, part);
            else
                fail("cannot lock", part);
            close(fd);
            return -EXIT_LOCAL;
        }
        if (!fstat(fd, &by_fd) && !stat(part, &by_name) && by_fd.st_dev == by_name.st_dev &&
            by_fd.st_ino == by_name.st_ino)
            return fd;
        close(fd); /* renamed or removed meanwhile */
    }
    fprintf(stderr, "mooncake-p2p: %s keeps changing under this fetch\n", part);
    return -EXIT_LOCAL;
}

/* Shared, so that what the engine writes lands in the file; the space is reserved first, so
 * that a full disk is an error here and not a SIGBUS in the middle of a transfer. The part
 * file is locked while this process writes it: a second fetch into the same file emptied the
 * first one's, whose verified shards then went out as zeros (the lock of one that died goes
 * with it, so its part file is taken over). */
int tool_map_out(const char *path, size_t len, tool_map_t *m)
{
    int fd, err;

    memset(m, 0, sizeof(*m));
    m->part_fd = -1;
    if ((size_t)snprintf(m->part, sizeof(m->part), "%s.p2p-part", path) >= sizeof(m->part)) {
        fprintf(stderr, "mooncake-p2p: %s: path too long\n", path);
        m->part[0] = '\0';
        return EXIT_USAGE;
    }
    if ((fd = part_lock(path, m->part)) < 0) {
        m->part[0] = '\0'; /* (not ours to remove) */
        return -fd;
    }
    m->part_fd = fd;
    if (ftruncate(fd, 0))
        err = fail("cannot empty", m->part);
    else if ((errno = posix_fallocate(fd, 0, (off_t)len)) != 0)
        err = fail("cannot reserve space for", m->part);
    else if ((m->addr = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)) == MAP_FAILED)
        err = fail("cannot map", m->part);
    else
        err = 0;
    if (err) {
        m->addr = NULL;
        tool_map_close(m); /* the part file goes */
        return err;
    }
    m->len = len;
    return 0;
}

int tool_map_commit(const char *path, tool_map_t *m)
{
    if (msync(m->addr, m->len, MS_SYNC))
        return fail("cannot write", m->part);
    if (rename(m->part, path))
        return fail("cannot rename to", path);
    m->part[0] = '\0';
    close(m->part_fd); /* (its lock) */
    m->part_fd = -1;
    return 0;
}

void tool_map_close(tool_map_t *m)
{
    if (m->addr)
        munmap(m->addr, m->len);
    if (m->part[0])
        unlink(m->part); /* (before its lock goes: no other fetch took it meanwhile) */
    if (m->part_fd >= 0)
        close(m->part_fd);
    memset(m, 0, sizeof(*m));
    m->part_fd = -1;
}

void tool_map_done(tool_map_t *m, int rc)
{
    if (rc == -EBUSY && m->addr) {
        fputs("mooncake-p2p: the engine may still use the mapped file: it stays mapped until "
              "the process exits\n",
              stderr);
        m->addr = NULL;
    }
    tool_map_close(m);
}
