/* Files and block devices as segment buffers (the file transport): every byte checked.
 *   - locally, between registered memory (or another file) and a file of this engine: pieces
 *     that are not aligned (through the page cache) and aligned ones (O_DIRECT: the written
 *     range is not left in the page cache), a file's range checks, read-only files, a file
 *     truncated under the engine, the pread/pwrite threads (MC_FILE_IO=thread), the same under
 *     caller-driven progress, and 10^4 registrations without a descriptor or a byte leaked;
 *   - from a peer, the owner being a child process that registers a file (and memory): reads and
 *     writes between its file and our memory or our own file, and between its memory and our
 *     file, over tcp, shm and rdma (the software device; FT_TRANSPORT selects, the rdma ctest
 *     entry sets it up); ranges refused by the initiator and by the owner with nothing written,
 *     a truncated file, and an owner killed mid-transfer: tasks fail, nothing hangs.
 * Temporary files live under /tmp and go with each test. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cmocka.h>
#include <infiniband/verbs.h>

#include "../engine/harness.h"

#define MIB       (1u << 20)
#define FILE_SIZE (8 * MIB)
#define SEED_FILE 0x51
#define SEED_MEM  0x52

/* ---- files ------------------------------------------------------------------------------- */

static void write_at(const char *path, uint64_t off, uint64_t len, uint64_t seed)
{
    uint8_t *buf = malloc(len);
    int fd = open(path, O_WRONLY | O_CREAT, 0644);

    assert_non_null(buf);
    assert_true(fd >= 0);
    th_fill_at(buf, len, seed, off);
    assert_int_equal(pwrite(fd, buf, len, (off_t)off), (ssize_t)len);
    close(fd);
    free(buf);
}

/* -1 if [off, off+len) of path holds stream seed from position soff on, else the first bad
 * offset. */
static int64_t check_stream(const char *path, uint64_t off, uint64_t len, uint64_t seed,
                            uint64_t soff)
{
    uint8_t *buf = malloc(len);
    int fd = open(path, O_RDONLY);
    int64_t bad;

    assert_non_null(buf);
    assert_true(fd >= 0);
    assert_int_equal(pread(fd, buf, len, (off_t)off), (ssize_t)len);
    bad = th_check_at(buf, len, seed, soff);
    close(fd);
    free(buf);
    return bad;
}

/* The same where the stream's position is the file offset. */
static int64_t check_at(const char *path, uint64_t off, uint64_t len, uint64_t seed)
{
    return check_stream(path, off, len, seed, off);
}

static uint64_t file_size(const char *path)
{
    struct stat st;

    assert_int_equal(stat(path, &st), 0);
    return (uint64_t)st.st_size;
}

static int count_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    int n = 0;

    while (d && readdir(d))
        n++;
    if (d)
        closedir(d);
    return n;
}

/* Pages of [off, off+len) of path in the page cache. */
static size_t cached_pages(const char *path, uint64_t off, uint64_t len)
{
    long pg = sysconf(_SC_PAGESIZE);
    size_t n = (len + (size_t)pg - 1) / (size_t)pg, resident = 0;
    unsigned char *vec = calloc(n, 1);
    int fd = open(path, O_RDONLY);
    void *p = mmap(NULL, len, PROT_READ, MAP_SHARED, fd, (off_t)off);

    assert_true(p != MAP_FAILED);
    assert_int_equal(mincore(p, len, vec), 0);
    for (size_t i = 0; i < n; i++)
        resident += vec[i] & 1;
    munmap(p, len);
    close(fd);
    free(vec);
    return resident;
}

static uint64_t file_reg(mc_engine_t *e, const char *path, uint64_t off, uint64_t len,
                         unsigned flags)
{
    mc_file_opts_t o = {.size = sizeof(o), .offset = off, .length = len, .flags = flags};
    uint64_t addr = 0;
    int rc = mc_file_register(e, path, &o, &addr);

    if (rc)
        print_error("mc_file_register %s: %s\n", path, mc_last_error());
    assert_int_equal(rc, 0);
    return addr;
}

static mc_task_status_t xfer(mc_engine_t *e, mc_opcode_t op, uint64_t local, mc_segment_id_t seg,
                             uint64_t remote, uint64_t len)
{
    mc_request_t r = {.opcode = op,
                      .local = (void *)(uintptr_t)local,
                      .target = seg,
                      .target_offset = remote,
                      .length = len};

    return th_xfer_req(e, &r, NULL);
}

static void xfer_ok(mc_engine_t *e, mc_opcode_t op, uint64_t local, mc_segment_id_t seg,
                    uint64_t remote, uint64_t len)
{
    mc_task_status_t st = xfer(e, op, local, seg, remote, len);

    if (st.state != MC_TASK_COMPLETED)
        print_error("%s of %llu bytes: %s\n", op == MC_READ ? "READ" : "WRITE",
                    (unsigned long long)len, st.reason);
    assert_int_equal(st.state, MC_TASK_COMPLETED);
    assert_int_equal(st.bytes, len);
}

static uint64_t ptr(const void *p)
{
    return (uint64_t)(uintptr_t)p;
}

/* ---- local fixture: one engine, its own segment ------------------------------------------- */

typedef struct lfx {
    char dir[256], path[300], path2[300];
    th_cfg_t cfg;
    mc_engine_t *e;
    mc_segment_id_t self;
    uint8_t *mem; /* FILE_SIZE, page-aligned, registered */
} lfx_t;

static int lfx_setup_cfg(void **state, const char *io, const char *progress)
{
    lfx_t *fx = calloc(1, sizeof(*fx));

    th_tmpdir(fx->dir, sizeof(fx->dir));
    snprintf(fx->path, sizeof(fx->path), "%s/a.bin", fx->dir);
    snprintf(fx->path2, sizeof(fx->path2), "%s/b.bin", fx->dir);
    th_config(&fx->cfg);
    if (io)
        th_set(&fx->cfg, "FILE_IO", "%s", io);
    if (progress)
        th_set(&fx->cfg, "PROGRESS_THREAD", "%s", progress);
    fx->e = th_engine(&fx->cfg);
    assert_int_equal(mc_segment_open(fx->e, mc_engine_segment_name(fx->e), &fx->self), 0);
    fx->mem = th_buf(fx->e, FILE_SIZE);
    *state = fx;
    return 0;
}

static int lfx_setup(void **state)
{
    return lfx_setup_cfg(state, NULL, NULL);
}

static int lfx_teardown(void **state)
{
    lfx_t *fx = *state;

    th_close(fx->e, fx->self);
    th_buf_free(fx->e, fx->mem, FILE_SIZE);
    mc_engine_destroy(fx->e); /* closes the files still registered */
    th_rmdir(fx->dir);
    free(fx);
    return 0;
}

/* DRAM -> file -> DRAM at offsets and lengths that are no multiple of anything: the page
 * cache. Requests straddle slices; the file buffer starts inside the file. */
static void test_local_unaligned(void **state)
{
    lfx_t *fx = *state;
    const uint64_t base = 4099; /* the buffer starts there in the file */
    uint64_t fa = file_reg(fx->e, fx->path, base, FILE_SIZE - 8192, MC_FILE_CREATE);
    mc_file_info_t fi;

    assert_int_equal(mc_file_info(fx->e, MC_SEGMENT_INVALID, fa + 10, &fi), 0);
    assert_int_equal(fi.addr, fa);
    assert_int_equal(fi.offset, base);
    assert_string_equal(fi.path, fx->path);
    th_fill(fx->mem, FILE_SIZE, SEED_MEM);
    /* WRITE 3 MiB + 17 from mem+333 to buffer offset 12345 */
    xfer_ok(fx->e, MC_WRITE, ptr(fx->mem) + 333, fx->self, fa + 12345, 3 * MIB + 17);
    uint8_t *chk = malloc(3 * MIB + 17);
    int fd = open(fx->path, O_RDONLY);
    assert_int_equal(pread(fd, chk, 3 * MIB + 17, base + 12345), 3 * MIB + 17);
    assert_memory_equal(chk, fx->mem + 333, 3 * MIB + 17);
    close(fd);
    /* READ it back elsewhere */
    memset(fx->mem + 4 * MIB, 0, 4 * MIB);
    xfer_ok(fx->e, MC_READ, ptr(fx->mem) + 4 * MIB + 1, fx->self, fa + 12345, 3 * MIB + 17);
    assert_memory_equal(fx->mem + 4 * MIB + 1, chk, 3 * MIB + 17);
    free(chk);
    assert_int_equal(mc_file_unregister(fx->e, fa), 0);
}

/* Aligned pieces go through O_DIRECT: what the engine wrote is on the file, not in the page
 * cache; a file registered MC_FILE_BUFFERED leaves it there. */
static void test_local_direct(void **state)
{
    lfx_t *fx = *state;
    uint64_t fa = file_reg(fx->e, fx->path, 0, FILE_SIZE, MC_FILE_CREATE);
    mc_file_info_t fi;

    assert_int_equal(mc_file_info(fx->e, MC_SEGMENT_INVALID, fa, &fi), 0);
    th_fill(fx->mem, FILE_SIZE, SEED_MEM);
    xfer_ok(fx->e, MC_WRITE, ptr(fx->mem), fx->self, fa, 4 * MIB);
    xfer_ok(fx->e, MC_WRITE, ptr(fx->mem) + 4 * MIB, fx->self, fa + 4 * MIB, 4 * MIB);
    uint8_t *chk = malloc(FILE_SIZE);
    int fd = open(fx->path, O_RDONLY);
    if (fi.direct_align) {
        print_message("  O_DIRECT alignment %u: %zu of 2048 pages cached after the write\n",
                      fi.direct_align, cached_pages(fx->path, 0, FILE_SIZE));
        assert_int_equal(cached_pages(fx->path, 0, FILE_SIZE), 0);
    } else {
        print_message("  no O_DIRECT on this file system: page cache only\n");
    }
    assert_int_equal(pread(fd, chk, FILE_SIZE, 0), FILE_SIZE);
    assert_memory_equal(chk, fx->mem, FILE_SIZE);
    close(fd);
    memset(fx->mem, 0, FILE_SIZE);
    xfer_ok(fx->e, MC_READ, ptr(fx->mem), fx->self, fa, FILE_SIZE);
    assert_memory_equal(chk, fx->mem, FILE_SIZE);
    free(chk);
    /* the same through the page cache */
    uint64_t fb = file_reg(fx->e, fx->path2, 0, 2 * MIB, MC_FILE_CREATE | MC_FILE_BUFFERED);
    assert_int_equal(mc_file_info(fx->e, MC_SEGMENT_INVALID, fb, &fi), 0);
    assert_int_equal(fi.direct_align, 0);
    th_fill(fx->mem, 2 * MIB, SEED_MEM + 9);
    xfer_ok(fx->e, MC_WRITE, ptr(fx->mem), fx->self, fb, 2 * MIB);
    assert_true(cached_pages(fx->path2, 0, 2 * MIB) > 0);
    assert_int_equal(check_at(fx->path2, 0, 2 * MIB, SEED_MEM + 9), -1);
}

/* File to file inside one engine (through a chunk of ours), in both directions. */
static void test_local_file_to_file(void **state)
{
    lfx_t *fx = *state;

    write_at(fx->path, 0, FILE_SIZE, SEED_FILE);
    uint64_t fa = file_reg(fx->e, fx->path, 0, 0, 0); /* length 0: the whole file */
    uint64_t fb = file_reg(fx->e, fx->path2, 0, FILE_SIZE, MC_FILE_CREATE);
    /* READ: local end fb, remote end fa */
    xfer_ok(fx->e, MC_READ, fb + 100, fx->self, fa + 100, 5 * MIB + 3);
    assert_int_equal(check_at(fx->path2, 100, 5 * MIB + 3, SEED_FILE), -1);
    /* WRITE: from fb back over another part of fa */
    write_at(fx->path2, 6 * MIB, MIB, SEED_MEM);
    xfer_ok(fx->e, MC_WRITE, fb + 6 * MIB, fx->self, fa + MIB, MIB);
    assert_int_equal(check_stream(fx->path, MIB, MIB, SEED_MEM, 6 * MIB), -1);
    assert_int_equal(check_at(fx->path, 2 * MIB, 6 * MIB, SEED_FILE), -1);
}

/* Ranges outside a file buffer are refused whole: nothing of the file (or past it) changes. */
static void test_local_out_of_range(void **state)
{
    lfx_t *fx = *state;

    write_at(fx->path, 0, FILE_SIZE, SEED_FILE);
    uint64_t fa = file_reg(fx->e, fx->path, MIB, 2 * MIB, 0);
    th_fill(fx->mem, FILE_SIZE, SEED_MEM);
    mc_task_status_t st = xfer(fx->e, MC_WRITE, ptr(fx->mem), fx->self, fa + MIB, MIB + 1);
    assert_int_equal(st.state, MC_TASK_FAILED);
    assert_int_equal(st.error, -MC_EACCESS);
    st = xfer(fx->e, MC_READ, ptr(fx->mem), fx->self, fa + 2 * MIB, 1);
    assert_int_equal(st.state, MC_TASK_FAILED);
    /* a local end past the file buffer: refused at submit */
    mc_batch_t *b;
    mc_request_t r = {.opcode = MC_READ,
                      .local = (void *)(uintptr_t)(fa + MIB),
                      .target = fx->self,
                      .target_offset = ptr(fx->mem),
                      .length = MIB + 1};
    assert_int_equal(mc_batch_create(fx->e, 1, &b), 0);
    assert_int_equal(mc_batch_submit(b, &r, 1, NULL), -EINVAL);
    assert_int_equal(mc_batch_destroy(b), 0);
    assert_int_equal(check_at(fx->path, 0, FILE_SIZE, SEED_FILE), -1);
    assert_int_equal(file_size(fx->path), FILE_SIZE);
}

/* A read-only file refuses writes, and reading into it. */
static void test_local_readonly(void **state)
{
    lfx_t *fx = *state;

    write_at(fx->path, 0, FILE_SIZE, SEED_FILE);
    uint64_t fa = file_reg(fx->e, fx->path, 0, 0, MC_FILE_READONLY);
    mc_task_status_t st = xfer(fx->e, MC_WRITE, ptr(fx->mem), fx->self, fa, MIB);
    assert_int_equal(st.state, MC_TASK_FAILED);
    assert_int_equal(st.error, -MC_EACCESS);
    assert_true(th_contains(st.reason, "read-only"));
    st = xfer(fx->e, MC_READ, fa, fx->self, ptr(fx->mem), MIB);
    assert_int_equal(st.state, MC_TASK_FAILED);
    xfer_ok(fx->e, MC_READ, ptr(fx->mem), fx->self, fa + 7, MIB);
    assert_int_equal(th_check_at(fx->mem, MIB, SEED_FILE, 7), -1);
    assert_int_equal(check_at(fx->path, 0, FILE_SIZE, SEED_FILE), -1);
}

/* Writes with MC_FILE_DURABLE (RWF_DSYNC), aligned and not. */
static void test_local_durable(void **state)
{
    lfx_t *fx = *state;
    uint64_t fa = file_reg(fx->e, fx->path, 0, FILE_SIZE, MC_FILE_CREATE | MC_FILE_DURABLE);
    mc_file_info_t fi;

    assert_int_equal(mc_file_info(fx->e, MC_SEGMENT_INVALID, fa, &fi), 0);
    assert_int_equal(fi.flags & MC_FILE_DURABLE, MC_FILE_DURABLE);
    th_fill(fx->mem, FILE_SIZE, SEED_MEM);
    xfer_ok(fx->e, MC_WRITE, ptr(fx->mem), fx->self, fa, 2 * MIB);
    xfer_ok(fx->e, MC_WRITE, ptr(fx->mem) + 2 * MIB + 5, fx->self, fa + 2 * MIB + 5, 100000);
    uint8_t *chk = malloc(2 * MIB + 100005);
    int fd = open(fx->path, O_RDONLY);
    assert_int_equal(pread(fd, chk, 2 * MIB + 100005, 0), 2 * MIB + 100005);
    assert_memory_equal(chk, fx->mem, 2 * MIB);
    assert_memory_equal(chk + 2 * MIB + 5, fx->mem + 2 * MIB + 5, 100000);
    close(fd);
    free(chk);
}

/* The file shrinks under the engine: a READ past its new end fails, with the reason, at once;
 * what is still there reads fine. */
static void test_local_truncated(void **state)
{
    lfx_t *fx = *state;

    write_at(fx->path, 0, FILE_SIZE, SEED_FILE);
    uint64_t fa = file_reg(fx->e, fx->path, 0, 0, 0);
    assert_int_equal(truncate(fx->path, 3 * MIB + 100), 0);
    int64_t t0 = th_now_ms();
    mc_task_status_t st = xfer(fx->e, MC_READ, ptr(fx->mem), fx->self, fa + 2 * MIB, 4 * MIB);
    assert_int_equal(st.state, MC_TASK_FAILED);
    assert_int_equal(st.error, -EIO);
    print_message("  %s\n", st.reason);
    assert_true(th_contains(st.reason, "truncated"));
    assert_true(th_now_ms() - t0 < 5000);
    /* what is still there reads fine (elsewhere in the memory: test_local_failed_read_settled) */
    xfer_ok(fx->e, MC_READ, ptr(fx->mem) + 6 * MIB, fx->self, fa + MIB, MIB);
    assert_int_equal(th_check_at(fx->mem + 6 * MIB, MIB, SEED_FILE, MIB), -1);
}

/* READs of the whole of file fa (FILE_SIZE registered, the file shorter now) into mem, five
 * times: each fails, and nothing lands in mem once it did (the host reuses it at once); how
 * many rounds saw bytes land. */
static int settled_after_failure(mc_engine_t *e, mc_segment_id_t seg, uint64_t fa, uint8_t *mem)
{
    int late = 0;

    for (int round = 0; round < 5; round++) {
        memset(mem, 0xa5, FILE_SIZE);
        mc_task_status_t st = xfer(e, MC_READ, ptr(mem), seg, fa, FILE_SIZE);
        assert_int_equal(st.state, MC_TASK_FAILED);
        memset(mem, 0, FILE_SIZE);
        th_sleep_ms(50);
        for (uint64_t i = 0; i < FILE_SIZE; i++)
            if (mem[i]) {
                late++;
                print_message("  round %d: bytes landed at %llu after FAILED\n", round,
                              (unsigned long long)i);
                break;
            }
    }
    return late;
}

/* A READ that fails while its other slices are still reading into its memory is told FAILED
 * only once they ended: the host may reuse the memory as soon as it sees the state (before, the
 * reads went on landing in it). The file shrank to 1 MiB: the slices past it fail at once, the
 * first ones read through O_DIRECT meanwhile. */
static void test_local_failed_read_settled(void **state)
{
    lfx_t *fx = *state;

    write_at(fx->path, 0, FILE_SIZE, SEED_FILE);
    uint64_t fa = file_reg(fx->e, fx->path, 0, 0, 0);
    assert_int_equal(truncate(fx->path, MIB + 100), 0);
    assert_int_equal(settled_after_failure(fx->e, fx->self, fa, fx->mem), 0);
}

/* A peer's file known by its buffer key alone, the peer opened before it had any file (its
 * descriptor then has no file part): the READ is cut to the owner's chunk size, which the key
 * carries (before, it was cut to ours, 1 MiB, and the owner refused the stage requests). */
static void test_key_only_file(void **state)
{
    uint8_t key[MC_BUFFER_KEY_SIZE], addr[64];
    size_t addr_len = sizeof(addr);
    char dir[256], path[300];
    mc_segment_id_t seg;
    th_cfg_t ca, cb;

    (void)state;
    th_tmpdir(dir, sizeof(dir));
    snprintf(path, sizeof(path), "%s/k.bin", dir);
    th_config(&ca);
    th_set(&ca, "FILE_SLICE_SIZE", "65536");
    th_config(&cb);
    mc_engine_t *a = th_engine(&ca), *b = th_engine(&cb);
    uint8_t *mem = th_buf(b, 2 * MIB);
    assert_int_equal(mc_engine_address(a, addr, &addr_len), 0);
    assert_int_equal(mc_segment_open_address(b, addr, addr_len, &seg), 0);
    for (int64_t end = th_now_ms() + 10000;
         mc_segment_state(b, seg) != MC_SEGMENT_READY && th_now_ms() < end;)
        th_sleep_ms(1);
    assert_int_equal(mc_segment_state(b, seg), MC_SEGMENT_READY);
    write_at(path, 0, 2 * MIB, SEED_FILE);
    uint64_t fa = file_reg(a, path, 0, 2 * MIB, 0);
    assert_int_equal(mc_buffer_key_pack(a, (void *)(uintptr_t)fa, key), 0);
    assert_int_equal(mc_segment_add_buffer(b, seg, key, sizeof(key)), 0);
    xfer_ok(b, MC_READ, ptr(mem), seg, fa + 4096, 2 * MIB - 4096);
    assert_int_equal(th_check_at(mem, 2 * MIB - 4096, SEED_FILE, 4096), -1);
    th_close(b, seg);
    th_buf_free(b, mem, 2 * MIB);
    mc_engine_destroy(b);
    mc_engine_destroy(a);
    th_rmdir(dir);
}

/* io_uring-less: MC_FILE_IO=thread, everything above still holds (aligned and not). */
static int lfx_setup_thread(void **state)
{
    return lfx_setup_cfg(state, "thread", NULL);
}

static void test_thread_fallback(void **state)
{
    lfx_t *fx = *state;
    uint64_t fa = file_reg(fx->e, fx->path, 0, FILE_SIZE, MC_FILE_CREATE);
    mc_file_info_t fi;

    assert_int_equal(mc_file_info(fx->e, MC_SEGMENT_INVALID, fa, &fi), 0);
    assert_string_equal(fi.io, "thread");
    th_fill(fx->mem, FILE_SIZE, SEED_MEM);
    xfer_ok(fx->e, MC_WRITE, ptr(fx->mem), fx->self, fa, 4 * MIB);
    xfer_ok(fx->e, MC_WRITE, ptr(fx->mem) + 4 * MIB + 3, fx->self, fa + 4 * MIB + 3, MIB + 9);
    uint8_t *chk = malloc(FILE_SIZE);
    memcpy(chk, fx->mem, FILE_SIZE);
    memset(fx->mem, 0, FILE_SIZE);
    xfer_ok(fx->e, MC_READ, ptr(fx->mem), fx->self, fa, 4 * MIB);
    xfer_ok(fx->e, MC_READ, ptr(fx->mem) + 4 * MIB + 3, fx->self, fa + 4 * MIB + 3, MIB + 9);
    assert_memory_equal(fx->mem, chk, 4 * MIB);
    assert_memory_equal(fx->mem + 4 * MIB + 3, chk + 4 * MIB + 3, MIB + 9);
    free(chk);
    assert_int_equal(truncate(fx->path, MIB), 0);
    mc_task_status_t st = xfer(fx->e, MC_READ, ptr(fx->mem), fx->self, fa + 2 * MIB, MIB);
    assert_int_equal(st.state, MC_TASK_FAILED);
    assert_true(th_contains(st.reason, "truncated"));
}

/* MC_FILE_IO=uring: io_uring or nothing (skipped where the kernel has none). */
static void test_uring_forced(void **state)
{
    lfx_t *fx = *state;
    mc_file_opts_t o = {.size = sizeof(o), .length = MIB, .flags = MC_FILE_CREATE};
    uint64_t fa;
    th_cfg_t cfg = fx->cfg;

    th_set(&cfg, "FILE_IO", "uring");
    mc_engine_t *e = th_engine(&cfg);
    int rc = mc_file_register(e, fx->path, &o, &fa);
    if (rc == -MC_ENODEV) {
        print_message("  no io_uring here: %s\n", mc_last_error());
    } else {
        mc_file_info_t fi;
        assert_int_equal(rc, 0);
        assert_int_equal(mc_file_info(e, MC_SEGMENT_INVALID, fa, &fi), 0);
        assert_string_equal(fi.io, "io_uring");
    }
    mc_engine_destroy(e);
}

/* The engine destroyed right after reads of a file were submitted, through io_uring and through
 * the threads: it neither hangs nor crashes, and under the sanitizers leaks nothing. (Reads of a
 * local file are mostly done by then: this did not catch a stop that left its pieces in flight
 * unreaped, which a review found by reading.) */
static void destroy_in_flight(lfx_t *fx, const char *io)
{
    mc_file_opts_t o = {.size = sizeof(o), .length = FILE_SIZE, .flags = MC_FILE_CREATE};
    mc_request_t r[64];
    mc_batch_t *b;
    uint64_t fa;
    th_cfg_t cfg = fx->cfg;

    th_set(&cfg, "FILE_IO", "%s", io);
    mc_engine_t *e = th_engine(&cfg);
    uint8_t *mem = th_buf(e, FILE_SIZE);
    int rc = mc_file_register(e, fx->path, &o, &fa);
    if (rc == -MC_ENODEV) { /* no io_uring here */
        th_buf_free(e, mem, FILE_SIZE);
        mc_engine_destroy(e);
        return;
    }
    assert_int_equal(rc, 0);
    mc_segment_id_t self;
    assert_int_equal(mc_segment_open(e, mc_engine_segment_name(e), &self), 0);
    size_t each = FILE_SIZE / 64;
    for (size_t i = 0; i < 64; i++)
        r[i] = (mc_request_t){.opcode = MC_READ,
                              .local = mem + i * each,
                              .target = self,
                              .target_offset = fa + i * each,
                              .length = each};
    assert_int_equal(mc_batch_create(e, 64, &b), 0);
    assert_int_equal(mc_batch_submit(b, r, 64, NULL), 0);
    mc_batch_release(b);
    mc_engine_destroy(e); /* (the memory stays mapped: the engine let go of it) */
    munmap(mem, FILE_SIZE);
}

static void test_destroy_in_flight(void **state)
{
    destroy_in_flight(*state, "uring");
    destroy_in_flight(*state, "thread");
}

/* Caller-driven progress: the ring's completions come through the engine's event fd. */
static int lfx_setup_caller(void **state)
{
    return lfx_setup_cfg(state, NULL, "0");
}

static void test_caller_progress(void **state)
{
    lfx_t *fx = *state;
    uint64_t fa = file_reg(fx->e, fx->path, 0, FILE_SIZE, MC_FILE_CREATE);

    th_fill(fx->mem, FILE_SIZE, SEED_MEM);
    xfer_ok(fx->e, MC_WRITE, ptr(fx->mem), fx->self, fa, FILE_SIZE);
    memset(fx->mem, 0, FILE_SIZE);
    xfer_ok(fx->e, MC_READ, ptr(fx->mem) + 1, fx->self, fa + 1, FILE_SIZE - 2);
    assert_int_equal(th_check_at(fx->mem + 1, FILE_SIZE - 2, SEED_MEM, 1), -1);
}

/* Registration errors name the file and leave nothing behind; 10^4 registrations later the
 * process holds the same descriptors (ASan's leak check covers the memory). */
static void test_register_leaks(void **state)
{
    lfx_t *fx = *state;
    mc_file_opts_t o = {.size = sizeof(o), .length = MIB};
    uint64_t fa, addrs[256];
    int fds;

    write_at(fx->path, 0, 4 * MIB, SEED_FILE);
    assert_int_equal(mc_file_register(fx->e, "/nonexistent/x", &o, &fa), -ENOENT);
    assert_true(th_contains(mc_last_error(), "/nonexistent/x"));
    o.offset = 4 * MIB;
    assert_int_equal(mc_file_register(fx->e, fx->path, &o, &fa), -EINVAL);
    assert_true(th_contains(mc_last_error(), "beyond its end"));
    o.offset = 0;
    assert_int_equal(mc_file_register(fx->e, fx->dir, &o, &fa), -EISDIR);
    /* a FIFO is refused, not waited on for a writer (read-only: O_RDONLY blocked) */
    char other[600];
    snprintf(other, sizeof(other), "%s/fifo", fx->dir);
    assert_int_equal(mkfifo(other, 0600), 0);
    o.flags = MC_FILE_READONLY;
    assert_int_equal(mc_file_register(fx->e, other, &o, &fa), -EINVAL);
    assert_true(th_contains(mc_last_error(), "neither a regular file"));
    assert_int_equal(unlink(other), 0);
    /* a file CREATE made for a registration refused leaves nothing behind */
    snprintf(other, sizeof(other), "%s/new.bin", fx->dir);
    o = (mc_file_opts_t){.size = sizeof(o), .flags = MC_FILE_CREATE};
    assert_int_equal(mc_file_register(fx->e, other, &o, &fa), -EINVAL);
    assert_true(th_contains(mc_last_error(), "nothing to register"));
    assert_int_equal(access(other, F_OK), -1);
    o = (mc_file_opts_t){.size = sizeof(o), .length = MIB};
    assert_int_equal(mc_file_unregister(fx->e, 0x4000000000000123ull), -ENOENT);
    assert_int_equal(mc_file_unregister(fx->e, ptr(fx->mem)), -ENOENT);
    /* The I/O backend and bounce chunks come with the first registration, and a connection to
     * ourselves with the first request for a range our view of us lacks: count after both. */
    fa = file_reg(fx->e, fx->path, 0, MIB, 0);
    xfer_ok(fx->e, MC_READ, ptr(fx->mem), fx->self, fa, 4096);
    assert_int_equal(mc_file_unregister(fx->e, fa), 0);
    fds = count_fds();
    int64_t t0 = th_now_ms();
    for (int i = 0; i < 10000; i++) {
        fa = file_reg(fx->e, fx->path, (uint64_t)(i % 4) * MIB, MIB, i % 2 ? MC_FILE_BUFFERED : 0);
        assert_int_equal(mc_file_unregister(fx->e, fa), 0);
    }
    for (int i = 0; i < 256; i++)
        addrs[i] = file_reg(fx->e, fx->path, 0, 4096, 0);
    xfer_ok(fx->e, MC_READ, ptr(fx->mem), fx->self, addrs[255], 4096);
    assert_int_equal(th_check(fx->mem, 4096, SEED_FILE), -1);
    for (int i = 0; i < 256; i++)
        assert_int_equal(mc_file_unregister(fx->e, addrs[i]), 0);
    print_message("  10000 registrations in %lld ms; descriptors %d before, %d after\n",
                  (long long)(th_now_ms() - t0), fds, count_fds());
    assert_int_equal(count_fds(), fds);
}

/* ---- the owner in a child process ---------------------------------------------------------- */

enum { FT_EXIT = 1, FT_UNREGISTER, FT_STATS };

#define FT_MSG_ID 9 /* messages to the owner: a u32 count from 0, checked by its handler */

/* The owner's message handler: v[1] of FT_STATS counts the messages in order, v[2] the others. */
static struct {
    atomic_uint in_order, bad;
} ft_msgs;

static void ft_on_msg(void *arg, const char *sender, uint8_t id, const void *data, size_t len)
{
    uint32_t n;

    (void)arg;
    (void)sender;
    if (id != FT_MSG_ID || len != sizeof(n) ||
        (memcpy(&n, data, sizeof(n)), n != atomic_load(&ft_msgs.in_order)))
        atomic_fetch_add(&ft_msgs.bad, 1);
    else
        atomic_fetch_add(&ft_msgs.in_order, 1);
}

typedef struct ft_setup {
    th_cfg_t cfg;
    char path[300];
    uint64_t len;
    unsigned flags;
} ft_setup_t;

typedef struct ft_hello {
    int32_t rc;
    char err[300];
    uint64_t file, mem; /* the file buffer, and a memory buffer of FILE_SIZE (SEED_MEM + 1) */
    uint32_t blob_len;
} ft_hello_t;

typedef struct ft_cmd {
    uint32_t op;
    uint64_t a0;
} ft_cmd_t;

typedef struct ft_reply {
    int64_t rc, v[4];
} ft_reply_t;

/* The child: an engine with one file buffer and one memory buffer, serving until told. */
static void owner_main(int fd)
{
    ft_setup_t su;
    ft_hello_t h = {0};
    mc_engine_t *e = NULL;
    mc_config_t *conf = NULL;
    uint8_t *blob = NULL, *mem = NULL;
    size_t blen = 0;
    int rc;

    if (th_io_full(fd, &su, sizeof(su), 0, 30000))
        _exit(2);
    th_set(&su.cfg, "PROGRESS_THREAD", "1");
    rc = mc_config_create(&conf);
    for (unsigned i = 0; !rc && i < su.cfg.n; i++)
        rc = mc_config_set(conf, su.cfg.v[i].name, su.cfg.v[i].value);
    if (!rc)
        rc = mc_engine_create(conf, &e);
    mc_config_destroy(conf);
    mc_file_opts_t o = {.size = sizeof(o), .length = su.len, .flags = su.flags};
    if (!rc)
        rc = mc_file_register(e, su.path, &o, &h.file);
    if (!rc)
        rc = mc_msg_handler_set(e, FT_MSG_ID, ft_on_msg, NULL);
    if (!rc && posix_memalign((void **)&mem, 4096, FILE_SIZE))
        rc = -ENOMEM;
    if (!rc) {
        th_fill(mem, FILE_SIZE, SEED_MEM + 1);
        rc = mc_mem_register(e, mem, FILE_SIZE, "cpu:0");
    }
    h.mem = ptr(mem);
    if (!rc) {
        mc_segment_export(e, NULL, &blen);
        blob = malloc(blen);
        rc = mc_segment_export(e, blob, &blen);
    }
    h.rc = rc;
    if (rc)
        snprintf(h.err, sizeof(h.err), "%s", mc_last_error());
    h.blob_len = (uint32_t)blen;
    if (th_io_full(fd, &h, sizeof(h), 1, 30000) || rc || th_io_full(fd, blob, blen, 1, 30000))
        _exit(3);
    for (;;) {
        ft_cmd_t c;
        ft_reply_t r = {0};
        mc_counters_t cnt;
        if (th_io_full(fd, &c, sizeof(c), 0, INT32_MAX))
            _exit(0);
        if (c.op == FT_EXIT) {
            mc_engine_destroy(e);
            th_io_full(fd, &r, sizeof(r), 1, 5000);
            _exit(0);
        }
        if (c.op == FT_UNREGISTER)
            r.rc = mc_file_unregister(e, c.a0);
        if (c.op == FT_STATS) {
            r.rc = mc_stats_transport(e, "file", &cnt);
            r.v[0] = (int64_t)cnt.bytes_served;
            r.v[1] = atomic_load(&ft_msgs.in_order);
            r.v[2] = atomic_load(&ft_msgs.bad);
        }
        if (th_io_full(fd, &r, sizeof(r), 1, 10000))
            _exit(4);
    }
}

typedef struct owner {
    pid_t pid;
    int sock;
    uint64_t file, mem;
    uint8_t *blob;
    uint32_t blob_len;
} owner_t;

static void owner_spawn(owner_t *ow, const th_cfg_t *cfg, const char *path, uint64_t len,
                        unsigned flags)
{
    ft_setup_t su = {.cfg = *cfg, .len = len, .flags = flags};
    ft_hello_t h;

    snprintf(su.path, sizeof(su.path), "%s", path);
    ow->pid = th_spawn_self("--file-owner", &ow->sock);
    assert_int_equal(th_io_full(ow->sock, &su, sizeof(su), 1, 30000), 0);
    assert_int_equal(th_io_full(ow->sock, &h, sizeof(h), 0, 30000), 0);
    if (h.rc)
        print_error("owner: %s\n", h.err);
    assert_int_equal(h.rc, 0);
    ow->file = h.file;
    ow->mem = h.mem;
    ow->blob_len = h.blob_len;
    ow->blob = malloc(h.blob_len);
    assert_int_equal(th_io_full(ow->sock, ow->blob, h.blob_len, 0, 30000), 0);
}

/* A command to the owner: its status, its values in v (4, or NULL). */
static int64_t owner_cmd_v(owner_t *ow, uint32_t op, uint64_t a0, int64_t *v)
{
    ft_cmd_t c = {.op = op, .a0 = a0};
    ft_reply_t r;

    assert_int_equal(th_io_full(ow->sock, &c, sizeof(c), 1, 10000), 0);
    assert_int_equal(th_io_full(ow->sock, &r, sizeof(r), 0, 30000), 0);
    if (v)
        memcpy(v, r.v, sizeof(r.v));
    return r.rc;
}

static int64_t owner_cmd(owner_t *ow, uint32_t op, uint64_t a0, int64_t *v0)
{
    int64_t v[4];
    int64_t rc = owner_cmd_v(ow, op, a0, v);

    if (v0)
        *v0 = v[0];
    return rc;
}

static void owner_kill(owner_t *ow)
{
    th_child_reap(&ow->pid, &ow->sock);
    free(ow->blob);
    ow->blob = NULL;
}

/* ---- remote fixture ------------------------------------------------------------------------ */

typedef struct rtr {
    const char *name;    /* a transport of FT_TRANSPORT */
    const char *counter; /* whose counters must have moved the bytes */
    void (*apply)(th_cfg_t *cfg);
} rtr_t;

static void tcp_apply(th_cfg_t *cfg)
{
    th_set(cfg, "FORCE_TCP", "1");
}

static void shm_apply(th_cfg_t *cfg)
{
    th_set(cfg, "FORCE_TCP", "0");
}

static void rdma_apply(th_cfg_t *cfg)
{
    th_set(cfg, "FORCE_TCP", "0");
    th_set(cfg, "PROTOCOL", "rdma"); /* also to a peer on this host */
}

/* One bounce chunk per side for peers and one for ourselves, one tcp connection with a window
 * of two: stages wait for chunks, in order, while the transfers that free them pass. */
static void small_apply(th_cfg_t *cfg)
{
    tcp_apply(cfg);
    th_set(cfg, "FILE_BOUNCE_SIZE", "%u", 2 * MIB);
    th_set(cfg, "TCP_CONNS", "1");
    th_set(cfg, "TCP_WINDOW", "2");
}

static const rtr_t tr_tcp = {"tcp", "tcp", tcp_apply};
static const rtr_t tr_small = {"tcp, 2 bounce chunks", "tcp", small_apply};
static const rtr_t tr_shm = {"shm", "shm", shm_apply};
static const rtr_t tr_rdma = {"rdma", "rdma", rdma_apply};

typedef struct rfx {
    const rtr_t *tr;
    char dir[256], path[300], local[300];
    th_cfg_t cfg;
    owner_t ow;
    mc_engine_t *e;
    mc_segment_id_t seg;
    uint8_t *mem;
} rfx_t;

static int rfx_setup(void **state)
{
    const rtr_t *tr = *state;
    rfx_t *fx = calloc(1, sizeof(*fx));

    fx->tr = tr;
    fx->ow.sock = -1;
    th_tmpdir(fx->dir, sizeof(fx->dir));
    snprintf(fx->path, sizeof(fx->path), "%s/owner.bin", fx->dir);
    snprintf(fx->local, sizeof(fx->local), "%s/local.bin", fx->dir);
    th_config(&fx->cfg);
    tr->apply(&fx->cfg);
    write_at(fx->path, 0, FILE_SIZE, SEED_FILE);
    owner_spawn(&fx->ow, &fx->cfg, fx->path, 0, 0);
    fx->e = th_engine(&fx->cfg);
    assert_int_equal(mc_segment_open_blob(fx->e, fx->ow.blob, fx->ow.blob_len, &fx->seg), 0);
    fx->mem = th_buf(fx->e, FILE_SIZE);
    *state = fx;
    return 0;
}

static int rfx_teardown(void **state)
{
    rfx_t *fx = *state;

    th_close(fx->e, fx->seg);
    th_buf_free(fx->e, fx->mem, FILE_SIZE);
    mc_engine_destroy(fx->e);
    owner_kill(&fx->ow);
    th_rmdir(fx->dir);
    free(fx);
    return 0;
}

static uint64_t moved(mc_engine_t *e, const char *tp)
{
    mc_counters_t c;

    assert_int_equal(mc_stats_transport(e, tp, &c), 0);
    return c.bytes_read + c.bytes_written;
}

/* A peer's file, read and written from our memory and from a file of ours, aligned and not,
 * and its memory from our file: the bytes travel over the transport under test. */
static void test_remote(void **state)
{
    rfx_t *fx = *state;
    uint64_t f = fx->ow.file, before;
    mc_file_info_t fi;
    int64_t served;

    /* A transfer of memory first: every transport is up before the file's pieces go, so that
     * all of them count below (file tasks alone bring shm up too: test_remote_shm_first). */
    xfer_ok(fx->e, MC_READ, ptr(fx->mem), fx->seg, fx->ow.mem, 4096);
    before = moved(fx->e, fx->tr->counter);

    assert_int_equal(mc_file_info(fx->e, fx->seg, f + 5, &fi), 0);
    assert_string_equal(fi.path, fx->path);
    /* READ its file into our memory: aligned, then not; the peer's counters count it once
     * (not its child task as well) */
    mc_counters_t pc0, pc1;
    assert_int_equal(mc_stats_peer(fx->e, fx->seg, &pc0), 0);
    xfer_ok(fx->e, MC_READ, ptr(fx->mem), fx->seg, f, 4 * MIB);
    assert_int_equal(th_check(fx->mem, 4 * MIB, SEED_FILE), -1);
    assert_int_equal(mc_stats_peer(fx->e, fx->seg, &pc1), 0);
    assert_int_equal(pc1.bytes_read - pc0.bytes_read, 4 * MIB);
    xfer_ok(fx->e, MC_READ, ptr(fx->mem) + 4 * MIB + 7, fx->seg, f + 1001, 2 * MIB + 99);
    assert_int_equal(th_check_at(fx->mem + 4 * MIB + 7, 2 * MIB + 99, SEED_FILE, 1001), -1);
    /* WRITE our memory into its file */
    th_fill(fx->mem, FILE_SIZE, SEED_MEM);
    xfer_ok(fx->e, MC_WRITE, ptr(fx->mem), fx->seg, f, 2 * MIB);
    assert_int_equal(check_at(fx->path, 0, 2 * MIB, SEED_MEM), -1);
    xfer_ok(fx->e, MC_WRITE, ptr(fx->mem) + 2 * MIB + 3, fx->seg, f + 2 * MIB + 3, MIB + 5);
    assert_int_equal(check_at(fx->path, 2 * MIB + 3, MIB + 5, SEED_MEM), -1);
    assert_int_equal(check_at(fx->path, 4 * MIB, 4 * MIB, SEED_FILE), -1); /* untouched */
    /* our file <-> its file */
    uint64_t lf = file_reg(fx->e, fx->local, 0, FILE_SIZE, MC_FILE_CREATE);
    xfer_ok(fx->e, MC_READ, lf + 11, fx->seg, f + 4 * MIB + 11, 3 * MIB);
    assert_int_equal(check_stream(fx->local, 11, 3 * MIB, SEED_FILE, 4 * MIB + 11), -1);
    write_at(fx->local, 7 * MIB, MIB, SEED_MEM);
    xfer_ok(fx->e, MC_WRITE, lf + 7 * MIB, fx->seg, f + 7 * MIB, MIB);
    assert_int_equal(check_at(fx->path, 7 * MIB, MIB, SEED_MEM), -1);
    /* our file <-> its memory */
    xfer_ok(fx->e, MC_READ, lf, fx->seg, fx->ow.mem + 123, 2 * MIB);
    assert_int_equal(check_stream(fx->local, 0, 2 * MIB, SEED_MEM + 1, 123), -1);
    xfer_ok(fx->e, MC_WRITE, lf + 7 * MIB, fx->seg, fx->ow.mem + 4 * MIB, MIB);
    memset(fx->mem, 0, MIB);
    xfer_ok(fx->e, MC_READ, ptr(fx->mem), fx->seg, fx->ow.mem + 4 * MIB, MIB);
    assert_int_equal(th_check_at(fx->mem, MIB, SEED_MEM, 7 * MIB), -1);
    uint64_t over = moved(fx->e, fx->tr->counter) - before;
    print_message("  %s carried %llu bytes\n", fx->tr->counter, (unsigned long long)over);
    assert_true(over >= 16 * MIB);
    assert_int_equal(owner_cmd(&fx->ow, FT_STATS, 0, &served), 0);
    assert_true(served >= 10 * MIB); /* staged by the owner's file transport */
}

/* A same-host peer whose first and only traffic is its file: our staged pieces start in
 * progress, which connects shm without waiting for the owner; the first pieces go over tcp
 * meanwhile, and once the owner answered, whole READs go over shm. Every byte checked. */
static void test_remote_shm_first(void **state)
{
    rfx_t *fx = *state;
    uint64_t f = fx->ow.file, before = moved(fx->e, "shm");
    int64_t dl = th_now_ms() + 10000;
    unsigned reads = 0;

    do { /* until shm carries a piece */
        memset(fx->mem, 0, MIB);
        xfer_ok(fx->e, MC_READ, ptr(fx->mem), fx->seg, f + MIB, MIB);
        assert_int_equal(th_check_at(fx->mem, MIB, SEED_FILE, MIB), -1);
        reads++;
    } while (moved(fx->e, "shm") == before && th_now_ms() < dl);
    assert_true(moved(fx->e, "shm") > before);
    print_message("  shm carried a piece from READ %u on\n", reads);
    before = moved(fx->e, "shm");
    memset(fx->mem, 0, 8 * MIB);
    xfer_ok(fx->e, MC_READ, ptr(fx->mem), fx->seg, f, 8 * MIB);
    assert_int_equal(th_check(fx->mem, 8 * MIB, SEED_FILE), -1);
    assert_true(moved(fx->e, "shm") - before >= 8 * MIB);
}

static void on_flushed(void *arg, int status)
{
    atomic_store((atomic_int *)arg, status ? status : 1);
}

/* Messages to the owner ride the connection our file requests go on, whose answers the owner
 * defers (it stages from its disk first): a message answered meanwhile passes them, every
 * message arrives once and in order, every read completes, and no connection fails. */
static void test_remote_msgs(void **state)
{
    rfx_t *fx = *state;
    const unsigned rounds = 20, per = 8, msgs = 16, piece = 256 * 1024;
    mc_request_t req[8];
    mc_batch_status_t bs;
    mc_counters_t before, after;
    mc_batch_t *b;
    uint32_t n = 0;
    int64_t v[4];

    assert_int_equal(mc_stats_transport(fx->e, "tcp", &before), 0);
    assert_int_equal(mc_batch_create(fx->e, per, &b), 0);
    for (unsigned r = 0; r < rounds; r++) {
        for (unsigned i = 0; i < per; i++)
            req[i] = (mc_request_t){.opcode = MC_READ,
                                    .local = fx->mem + (size_t)i * piece,
                                    .target = fx->seg,
                                    .target_offset =
                                        fx->ow.file + (uint64_t)((r * per + i) % 32) * piece,
                                    .length = piece};
        assert_int_equal(mc_batch_submit(b, req, per, NULL), 0);
        for (unsigned k = 0; k < msgs; k++, n++)
            assert_int_equal(mc_msg_send(fx->e, fx->seg, FT_MSG_ID, &n, sizeof(n)), 0);
        assert_int_equal(mc_batch_wait(b, 30000), 0);
        assert_int_equal(mc_batch_status(b, &bs), 0);
        assert_int_equal(bs.state, MC_TASK_COMPLETED);
        for (unsigned i = 0; i < per; i++)
            assert_int_equal(th_check_at(fx->mem + (size_t)i * piece, piece, SEED_FILE,
                                         (uint64_t)((r * per + i) % 32) * piece),
                             -1);
        assert_int_equal(mc_batch_reset(b), 0);
    }
    static atomic_int flushed;
    atomic_store(&flushed, 0);
    assert_int_equal(mc_peer_flush(fx->e, fx->seg, on_flushed, (void *)&flushed), 0);
    for (int64_t dl = th_now_ms() + 30000; !atomic_load(&flushed) && th_now_ms() < dl;)
        th_sleep_ms(1);
    assert_int_equal(atomic_load(&flushed), 1);
    assert_int_equal(owner_cmd_v(&fx->ow, FT_STATS, 0, v), 0);
    assert_int_equal(v[1], n); /* all, in order */
    assert_int_equal(v[2], 0);
    assert_int_equal(mc_stats_transport(fx->e, "tcp", &after), 0);
    assert_int_equal(after.errors, before.errors); /* no connection failed */
    mc_batch_destroy(b);
}

/* Refused whole, by us (outside what the owner published) and by the owner (it unregistered
 * the file; our view is older): nothing of its file changes. */
static void test_remote_refused(void **state)
{
    rfx_t *fx = *state;
    uint64_t f = fx->ow.file;

    th_fill(fx->mem, FILE_SIZE, SEED_MEM);
    mc_task_status_t st = xfer(fx->e, MC_WRITE, ptr(fx->mem), fx->seg, f + 7 * MIB, MIB + 1);
    assert_int_equal(st.state, MC_TASK_FAILED);
    assert_int_equal(st.error, -MC_EACCESS);
    assert_int_equal(owner_cmd(&fx->ow, FT_UNREGISTER, f, NULL), 0);
    st = xfer(fx->e, MC_WRITE, ptr(fx->mem), fx->seg, f, MIB);
    print_message("  %s\n", st.reason);
    assert_int_equal(st.state, MC_TASK_FAILED);
    assert_int_equal(st.error, -MC_EACCESS);
    st = xfer(fx->e, MC_READ, ptr(fx->mem), fx->seg, f, MIB);
    assert_int_equal(st.state, MC_TASK_FAILED);
    assert_int_equal(check_at(fx->path, 0, FILE_SIZE, SEED_FILE), -1);
    assert_int_equal(file_size(fx->path), FILE_SIZE);
}

/* The owner's file shrinks: our READ fails with its reason. */
static void test_remote_truncated(void **state)
{
    rfx_t *fx = *state;

    assert_int_equal(truncate(fx->path, MIB), 0);
    int64_t t0 = th_now_ms();
    mc_task_status_t st = xfer(fx->e, MC_READ, ptr(fx->mem), fx->seg, fx->ow.file + 2 * MIB, MIB);
    assert_int_equal(st.state, MC_TASK_FAILED);
    print_message("  %s\n", st.reason);
    assert_true(th_contains(st.reason, "truncated"));
    assert_true(th_now_ms() - t0 < 5000);
    assert_int_equal(settled_after_failure(fx->e, fx->seg, fx->ow.file, fx->mem), 0);
}

/* The owner dies with reads of its file in flight: every task ends, failed, soon. */
static void test_remote_owner_killed(void **state)
{
    rfx_t *fx = *state;
    enum { N = 64 };
    mc_request_t r[N];
    mc_batch_t *b;
    mc_batch_status_t bs;

    for (int i = 0; i < N; i++)
        r[i] = (mc_request_t){.opcode = MC_READ,
                              .local = fx->mem + (i % 8) * MIB,
                              .target = fx->seg,
                              .target_offset = fx->ow.file + (i % 8) * MIB,
                              .length = MIB};
    th_stop(fx->ow.pid); /* requests reach it, nothing is answered */
    assert_int_equal(mc_batch_create(fx->e, N, &b), 0);
    assert_int_equal(mc_batch_submit(b, r, N, NULL), 0);
    th_sleep_ms(100);
    int64_t t0 = th_now_ms();
    kill(fx->ow.pid, SIGKILL);
    assert_int_equal(mc_batch_wait(b, 20000), 0);
    assert_int_equal(mc_batch_status(b, &bs), 0);
    print_message("  all %zu final in %lld ms, %zu failed\n", bs.tasks,
                  (long long)(th_now_ms() - t0), bs.failed);
    assert_int_equal(bs.failed, N);
    th_batch_destroy(fx->e, b);
    waitpid(fx->ow.pid, NULL, 0);
    fx->ow.pid = 0;
}

/* ---- main ---------------------------------------------------------------------------------- */

/* The rdma entry runs on the software device (softverbs through LD_LIBRARY_PATH). */
static int rdma_ready(void)
{
    int n = 0;
    struct ibv_device **l = ibv_get_device_list(&n);

    if (l)
        ibv_free_device_list(l);
    if (n > 0)
        return 1;
    fprintf(stderr, "test_file: FT_TRANSPORT=rdma needs an RDMA device (the software one: "
                    "LD_LIBRARY_PATH at build/lib/softverbs): skipped\n");
    return 0;
}

#define LOCAL(fn)      cmocka_unit_test_setup_teardown(fn, lfx_setup, lfx_teardown)
#define LOCAL_S(fn, s) cmocka_unit_test_setup_teardown(fn, s, lfx_teardown)
#define REMOTE(fn, tr)                                                                             \
    cmocka_unit_test_prestate_setup_teardown(fn, rfx_setup, rfx_teardown, (void *)&tr)

int main(int argc, char **argv)
{
    if (argc == 3 && !strcmp(argv[1], "--file-owner"))
        owner_main(atoi(argv[2]));
    th_main(argc, argv);
    const char *only = getenv("FT_TRANSPORT"); /* remote cases over these; default tcp,shm */
    int rc = 0;

    if (!only) {
        const struct CMUnitTest local[] = {
            LOCAL(test_local_unaligned),
            LOCAL(test_local_direct),
            LOCAL(test_local_file_to_file),
            LOCAL(test_local_out_of_range),
            LOCAL(test_local_readonly),
            LOCAL(test_local_durable),
            LOCAL(test_local_truncated),
            LOCAL(test_local_failed_read_settled),
            LOCAL_S(test_local_failed_read_settled, lfx_setup_thread),
            LOCAL_S(test_thread_fallback, lfx_setup_thread),
            LOCAL(test_uring_forced),
            LOCAL(test_destroy_in_flight),
            LOCAL_S(test_caller_progress, lfx_setup_caller),
            LOCAL(test_register_leaks),
            cmocka_unit_test(test_key_only_file),
        };
        rc |= cmocka_run_group_tests_name("file, local", local, NULL, NULL);
        const struct CMUnitTest tcp[] = {
            REMOTE(test_remote, tr_tcp),           REMOTE(test_remote_refused, tr_tcp),
            REMOTE(test_remote_truncated, tr_tcp), REMOTE(test_remote_owner_killed, tr_tcp),
            REMOTE(test_remote, tr_small),         REMOTE(test_remote_msgs, tr_tcp),
        };
        rc |= cmocka_run_group_tests_name("file, remote over tcp", tcp, NULL, NULL);
        const struct CMUnitTest shm[] = {REMOTE(test_remote, tr_shm),
                                         REMOTE(test_remote_shm_first, tr_shm)};
        rc |= cmocka_run_group_tests_name("file, remote over shm", shm, NULL, NULL);
    } else if (th_listed(only, "rdma")) {
        if (!rdma_ready())
            return 77;
        const struct CMUnitTest rdma[] = {
            REMOTE(test_remote, tr_rdma),
            REMOTE(test_remote_refused, tr_rdma),
        };
        rc |= cmocka_run_group_tests_name("file, remote over rdma", rdma, NULL, NULL);
    }
    return rc;
}
