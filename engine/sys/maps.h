/*
 * This process's mappings (internal): whether memory about to be registered may be read but not
 * written. Asked with PROCMAP_QUERY (Linux 6.11), one ioctl per mapping that overlaps the
 * range; on an older kernel /proc/self/maps is read as text up to the range, which took 2.5 ms
 * with 10,000 mappings and 21 ms with 60,000 when the range lies past them.
 *
 * Any thread.
 */
#ifndef MC_SYS_MAPS_H
#define MC_SYS_MAPS_H

#include <stdbool.h>
#include <stdint.h>

/* Whether a mapping that overlaps [addr, addr+len) may be read but not written: a file mapped
 * PROT_READ (a model, a checkpoint served read-only), which peers may only read (a WRITE into it
 * would be a SIGSEGV of the target over tcp, and rdma's registration for write access fails).
 * A part not mapped at all, or mapped PROT_NONE (address space reserved, made writable later),
 * does not count: what it holds is the host's business. Nor does a maps file that cannot be
 * read. */
bool mc__maps_read_only(uint64_t addr, uint64_t len);

/* For tests: the answer by one way only. 1 read-only, 0 not, -ENOTSUP (query) when the kernel
 * has no PROCMAP_QUERY, another negative errno when the maps file cannot be read. */
int mc__maps_read_only_query(uint64_t addr, uint64_t len);
int mc__maps_read_only_text(uint64_t addr, uint64_t len);

#endif
