/* Shared memory handed to a same-host peer: a memfd whose size nobody can change once it is
 * made, so that what the peer maps of it never faults (a peer that shrank its memfd under our
 * mapping of it made the next look at it a SIGBUS). */
#ifndef MC_SYS_MEMFD_H
#define MC_SYS_MEMFD_H

#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* A memfd of len bytes, sealed against shrinking and growing: the descriptor, or -errno. */
static inline int mc__memfd_fixed(const char *name, size_t len)
{
    int fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING), err;

    if (fd < 0)
        return -errno;
    if (ftruncate(fd, (off_t)len) < 0 ||
        fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0) {
        err = -errno;
        close(fd);
        return err;
    }
    return fd;
}

/* Whether a peer's fd is a memfd of len bytes at least that cannot shrink: mapping len bytes of
 * it is safe. */
static inline bool mc__memfd_holds(int fd, size_t len)
{
    struct stat st;
    int seals = fcntl(fd, F_GET_SEALS);

    return seals >= 0 && (seals & F_SEAL_SHRINK) && fstat(fd, &st) == 0 &&
           (uint64_t)st.st_size >= (uint64_t)len;
}

#endif
