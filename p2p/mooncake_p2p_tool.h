/* mooncake-p2p, internal: the tool's files and its progress display. */
#ifndef MC_P2P_TOOL_H
#define MC_P2P_TOOL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <mooncake/p2p.h>

/* Exit codes (also in --help): scripts rely on them. */
enum {
    EXIT_OK = 0,
    EXIT_USAGE = 1,       /* bad command line or argument (a bad name, a bad size) */
    EXIT_NOT_FOUND = 2,   /* no such object */
    EXIT_VERIFY = 3,      /* a checksum did not match (fetch: every holder of a shard; serve) */
    EXIT_META = 4,        /* the metadata store cannot be reached */
    EXIT_TRANSFER = 5,    /* peers or transfers failed (no live holder, timeouts) */
    EXIT_EXISTS = 6,      /* publish: the name is taken (--force replaces it) */
    EXIT_LOCAL = 7,       /* a local file or resource: cannot open, map, write, rename */
    EXIT_INTERRUPT = 130, /* fetch interrupted by SIGINT or SIGTERM */
};

/* ---- files (mooncake_p2p_file.c) ---- */

typedef struct tool_map {
    void *addr;
    size_t len;
    char part[4096]; /* fetch: the file written until verified, renamed to its name then */
    int part_fd;     /* fetch: the part file, locked (flock) until renamed or removed; else -1 */
} tool_map_t;

/* Map FILE for serving: private and writable (see the comment there). EXIT_* or 0, with the
 * reason printed. */
int tool_map_in(const char *path, tool_map_t *m);
/* Create OUT's ".p2p-part" sibling of len bytes (space reserved) and map it shared. */
int tool_map_out(const char *path, size_t len, tool_map_t *m);
/* Flush a fetched mapping and rename the part file to path. */
int tool_map_commit(const char *path, tool_map_t *m);
/* Unmap; for an uncommitted fetch also remove the part file. */
void tool_map_close(tool_map_t *m);
/* tool_map_close after a library call that let go of the memory returned rc: with -EBUSY the
 * engine may still use it (p2p.h), so it stays mapped (the process exits after destroying
 * the node); the part file goes all the same. */
void tool_map_done(tool_map_t *m, int rc);

/* ---- progress (mooncake_p2p_progress.c) ---- */

typedef struct tool_progress {
    const char *name;
    bool tty; /* redraw one line; otherwise a line every second */
    bool quiet;
    uint64_t start_ms, last_ms;
    volatile int *stop; /* set by the signal thread: the callback stops the fetch */
} tool_progress_t;

void tool_progress_init(tool_progress_t *p, const char *name, bool quiet, volatile int *stop);
/* An mc_p2p_progress_cb. */
int tool_progress_cb(void *arg, const mc_p2p_progress_t *pr);
/* The summary line on stdout (JSON with json). */
void tool_progress_done(tool_progress_t *p, const mc_p2p_progress_t *pr, int rc, bool json);
uint64_t tool_now_ms(void);
/* "1.5 GiB" */
const char *tool_human(uint64_t bytes, char *buf, size_t size);

#endif
