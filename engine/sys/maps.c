/* This process's mappings: see maps.h. */
#include "sys/maps.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

/* PROCMAP_QUERY of linux/fs.h (Linux 6.11), which Debian 12's headers predate: the kernel's ABI,
 * 104 bytes. Only the fields asked for are named; the names and build id are not asked for. */
struct maps_query {
    uint64_t size;       /* in: sizeof */
    uint64_t flags;      /* in: QUERY_* */
    uint64_t addr;       /* in */
    uint64_t vma_start;  /* out */
    uint64_t vma_end;    /* out */
    uint64_t vma_flags;  /* out: VMA_* */
    uint64_t unused[4];  /* out: page size, offset, inode, device */
    uint32_t name_size;  /* in/out: 0, no name */
    uint32_t build_size; /* in/out: 0, no build id */
    uint64_t name_addr, build_addr;
};
_Static_assert(sizeof(struct maps_query) == 104, "PROCMAP_QUERY's struct is 104 bytes");

#define MAPS_QUERY          _IOWR('f', 17, struct maps_query)
#define VMA_READABLE        0x01u
#define VMA_WRITABLE        0x02u
#define QUERY_COVERING_NEXT 0x10u /* the mapping at addr, else the first one after it */

static int maps_open(void)
{
    int fd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);

    return fd < 0 ? -errno : fd;
}

static int query(int fd, uint64_t addr, uint64_t len)
{
    for (uint64_t at = addr; at < addr + len;) {
        struct maps_query q = {.size = sizeof(q), .flags = QUERY_COVERING_NEXT, .addr = at};
        if (ioctl(fd, MAPS_QUERY, &q) < 0) {
            if (errno == ENOENT) /* nothing from here on */
                return 0;
            return errno == ENOTTY || errno == EINVAL ? -ENOTSUP : -errno;
        }
        if (q.vma_start >= addr + len)
            return 0;
        if ((q.vma_flags & VMA_READABLE) && !(q.vma_flags & VMA_WRITABLE))
            return 1;
        if (q.vma_end <= at) /* (cannot be: a kernel that answers so is not trusted further) */
            return -EIO;
        at = q.vma_end;
    }
    return 0;
}

/* Lines "lo-hi perms ...", sorted by address, read with read(2) (stdio's names are the file
 * transport's words for check_transport_seam) up to the first mapping past the range. */
static int text(int fd, uint64_t addr, uint64_t len)
{
    char buf[8192]; /* (a line is at most a path of PATH_MAX and ~80 bytes) */
    size_t have = 0;
    int ro = 0;
    bool done = false;

    while (!done) {
        ssize_t n = read(fd, buf + have, sizeof(buf) - 1 - have);
        if (n < 0)
            return -errno;
        if (n == 0)
            break;
        have += (size_t)n;
        char *line = buf, *nl;
        while (!done && (nl = memchr(line, '\n', have - (size_t)(line - buf)))) {
            unsigned long long lo, hi;
            char perms[5];
            *nl = 0;
            if (sscanf(line, "%llx-%llx %4s", &lo, &hi, perms) == 3) {
                done = lo >= addr + len;
                ro = !done && hi > addr && perms[0] == 'r' && perms[1] != 'w';
                done |= ro;
            }
            line = nl + 1;
        }
        have -= (size_t)(line - buf);
        if (have == sizeof(buf) - 1)
            have = 0; /* no line that long: drop it */
        memmove(buf, line, have);
    }
    return ro;
}

/* how, on a maps file of its own. */
static int on_maps(int (*how)(int fd, uint64_t addr, uint64_t len), uint64_t addr, uint64_t len)
{
    int fd = maps_open();
    if (fd < 0)
        return fd;
    int rc = how(fd, addr, len);
    close(fd);
    return rc;
}

int mc__maps_read_only_query(uint64_t addr, uint64_t len)
{
    return on_maps(query, addr, len);
}

int mc__maps_read_only_text(uint64_t addr, uint64_t len)
{
    return on_maps(text, addr, len);
}

bool mc__maps_read_only(uint64_t addr, uint64_t len)
{
    int fd = maps_open();
    if (fd < 0)
        return false;
    int rc = query(fd, addr, len);
    if (rc < 0) /* an older kernel: the text, from the start (the ioctl read nothing of it) */
        rc = text(fd, addr, len);
    close(fd);
    return rc > 0;
}
