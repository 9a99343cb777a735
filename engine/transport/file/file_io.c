/* File I/O: pieces between a file buffer and memory, through io_uring (registered files and
 * bounce buffer, completions reaped from the progress loop through the ring's eventfd), or,
 * where io_uring is missing or MC_FILE_IO=thread says so, through a few threads doing
 * pread/pwrite that signal the same eventfd. O_DIRECT for pieces whose offset, length and memory
 * are aligned to what the file needs, the page cache for the others. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/uio.h>
#include <unistd.h>

#include "file_int.h"

#define FTAB_SLOTS   1024 /* the ring's file table: two per file buffer, the rest go unfixed */
#define REAP_BATCH   64
#define STOP_WAIT_MS 10000

/* ---- the ring ---- */

/* A no-op through the ring and back: a sandbox may let io_uring_setup pass and refuse the
 * rest. */
static int ring_check(struct io_uring *r, char *why, size_t size)
{
    struct io_uring_probe *pr = io_uring_get_probe_ring(r);
    struct __kernel_timespec ts = {.tv_sec = 1};
    struct io_uring_cqe *cqe;
    int rc;

    if (!pr || !io_uring_opcode_supported(pr, IORING_OP_READ) ||
        !io_uring_opcode_supported(pr, IORING_OP_WRITE)) {
        if (pr)
            io_uring_free_probe(pr);
        snprintf(why, size, "the kernel's io_uring lacks IORING_OP_READ/WRITE");
        return -ENOTSUP;
    }
    io_uring_free_probe(pr);
    io_uring_prep_nop(io_uring_get_sqe(r));
    rc = io_uring_submit(r);
    if (rc >= 0)
        rc = io_uring_wait_cqe_timeout(r, &cqe, &ts);
    if (rc < 0) {
        snprintf(why, size, "io_uring_enter: %s", strerror(-rc));
        return rc;
    }
    io_uring_cqe_seen(r, cqe);
    return 0;
}

static int ring_start(file_ioe_t *io, unsigned depth)
{
    struct io_uring_params p = {.flags = IORING_SETUP_CLAMP};
    int rc = io_uring_queue_init_params(depth, &io->ring, &p);

    if (rc < 0) {
        snprintf(io->why, sizeof(io->why), "io_uring_setup: %s", strerror(-rc));
        return rc;
    }
    rc = ring_check(&io->ring, io->why, sizeof(io->why));
    if (!rc) {
        rc = io_uring_register_eventfd(&io->ring, io->ev.fd);
        if (rc)
            snprintf(io->why, sizeof(io->why), "io_uring_register_eventfd: %s", strerror(-rc));
    }
    if (rc) {
        io_uring_queue_exit(&io->ring);
        return rc;
    }
    /* A sparse table that files join and leave (5.19+); without it, plain descriptors. */
    io->ftab = calloc(FTAB_SLOTS, 1);
    io->fixed_files = io->ftab && io_uring_register_files_sparse(&io->ring, FTAB_SLOTS) == 0;
    io->ftab_n = io->fixed_files ? FTAB_SLOTS : 0;
    io->depth = p.sq_entries < io->depth ? p.sq_entries : io->depth;
    io->ring_up = true;
    return 0;
}

int mc__file_io_probe(char *why, size_t size)
{
    struct io_uring r;
    int rc = io_uring_queue_init(4, &r, 0);

    if (rc < 0) {
        snprintf(why, size, "io_uring_setup: %s", strerror(-rc));
        return 0;
    }
    rc = ring_check(&r, why, size);
    io_uring_queue_exit(&r);
    return rc == 0;
}

const char *mc__file_io_name(const file_ioe_t *io)
{
    if (!atomic_load(&io->up))
        return "none"; /* VRAM only: no file I/O started */
    return io->mode == FILE_IO_URING ? "io_uring" : "thread";
}

void mc__file_io_add_file(file_ioe_t *io, file_buf_t *f)
{
    int *slots[2] = {&f->fixed, &f->fixed_direct}, fds[2] = {f->fd, f->fd_direct};

    f->fixed = f->fixed_direct = -1;
    if (!io->fixed_files)
        return;
    pthread_mutex_lock(&io->ftab_lock);
    for (unsigned k = 0, i = 0; k < 2 && i < io->ftab_n; i++) {
        if (fds[k] < 0) {
            k++;
            i--;
            continue;
        }
        if (io->ftab[i])
            continue;
        if (io_uring_register_files_update(&io->ring, i, &fds[k], 1) != 1)
            break; /* this one goes unfixed */
        io->ftab[i] = 1;
        *slots[k++] = (int)i;
    }
    pthread_mutex_unlock(&io->ftab_lock);
}

void mc__file_io_remove_file(file_ioe_t *io, file_buf_t *f)
{
    int none = -1;

    pthread_mutex_lock(&io->ftab_lock);
    for (int *slot = &f->fixed; slot; slot = slot == &f->fixed ? &f->fixed_direct : NULL) {
        if (*slot < 0)
            continue;
        if (io->ring_up)
            io_uring_register_files_update(&io->ring, (unsigned)*slot, &none, 1);
        if (io->ftab)
            io->ftab[*slot] = 0;
        *slot = -1;
    }
    pthread_mutex_unlock(&io->ftab_lock);
}

void mc__file_io_add_buffer(file_ioe_t *io, uint8_t *base, uint64_t len)
{
    struct iovec iov = {.iov_base = base, .iov_len = len};

    /* Pinned memory: it counts against RLIMIT_MEMLOCK, and a buffer is at most 1 GiB. Where
     * that fails the chunks are plain memory to the ring. */
    if (!io->ring_up || len > (1ull << 30) || io_uring_register_buffers(&io->ring, &iov, 1))
        return;
    io->fixed_bufs = true;
    io->fixed_base = base;
    io->fixed_len = len;
}

/* ---- pieces ---- */

void mc__file_io_prep(file_io_t *io, const mc_buffer_t *b, uint64_t addr, uint8_t *mem,
                      uint32_t len, bool write)
{
    io->vram = b->vram;
    io->f = b->vram ? NULL : file_buf(b);
    io->dev = b->vram ? atoi(b->location + 5) : -1;
    io->pos = b->vram ? addr : io->f->offset + (addr - b->addr);
    io->mem = mem;
    io->len = len;
    io->write = write;
}

static uint64_t io_pos(const file_io_t *io)
{
    return io->pos + io->done;
}

/* Whether the rest of the piece may go through O_DIRECT; says once per file when an aligned
 * file gets a piece that is not. */
static bool use_direct(const file_io_t *io)
{
    file_buf_t *f = io->f;
    uint64_t a = f->align, left = io->len - io->done;
    uintptr_t mem = (uintptr_t)(io->mem + io->done);

    if (f->fd_direct < 0 || atomic_load_explicit(&f->no_direct, memory_order_relaxed))
        return false;
    if (!(io_pos(io) % a) && !(left % a) && !(mem % a))
        return true;
    if (!atomic_exchange(&f->said, true))
        mc_info("file %s: pieces not aligned to %u bytes (offset %llu, %llu bytes at %p) go "
                "through the page cache",
                f->path, f->align, (unsigned long long)io_pos(io), (unsigned long long)left,
                (void *)mem);
    return false;
}

static void ring_prep(file_ioe_t *io, file_io_t *p)
{
    struct io_uring_sqe *sqe = io_uring_get_sqe(&io->ring);
    file_buf_t *f = p->f;
    int fixed = p->direct ? f->fixed_direct : f->fixed;
    int fd = fixed >= 0 ? fixed : p->direct ? f->fd_direct : f->fd;
    uint8_t *mem = p->mem + p->done;
    unsigned len = p->len - p->done;
    bool fbuf =
        io->fixed_bufs && mem >= io->fixed_base && mem + len <= io->fixed_base + io->fixed_len;

    if (!sqe) { /* never: the ring holds depth entries and at most depth pieces are in flight */
        io_uring_submit(&io->ring);
        io->unsubmitted = 0;
        sqe = io_uring_get_sqe(&io->ring);
    }
    if (p->write && fbuf)
        io_uring_prep_write_fixed(sqe, fd, mem, len, io_pos(p), 0);
    else if (p->write)
        io_uring_prep_write(sqe, fd, mem, len, io_pos(p));
    else if (fbuf)
        io_uring_prep_read_fixed(sqe, fd, mem, len, io_pos(p), 0);
    else
        io_uring_prep_read(sqe, fd, mem, len, io_pos(p));
    if (p->write && (f->flags & MC_FILE_DURABLE))
        sqe->rw_flags = RWF_DSYNC;
    if (fixed >= 0)
        io_uring_sqe_set_flags(sqe, IOSQE_FIXED_FILE);
    io_uring_sqe_set_data(sqe, p);
    io->unsubmitted++;
}

/* One attempt at the rest of a piece (an I/O thread). */
static int thread_do(file_io_t *p)
{
    file_buf_t *f = p->f;
    struct iovec iov = {.iov_base = p->mem + p->done, .iov_len = p->len - p->done};
    int fd = p->direct ? f->fd_direct : f->fd;
    ssize_t n;

    do {
        if (p->write)
            n = pwritev2(fd, &iov, 1, (off_t)io_pos(p),
                         (f->flags & MC_FILE_DURABLE) ? RWF_DSYNC : 0);
        else
            n = preadv2(fd, &iov, 1, (off_t)io_pos(p), 0);
    } while (n < 0 && errno == EINTR);
    return n < 0 ? -errno : (int)n;
}

static void *io_thread(void *arg)
{
    file_ioe_t *io = arg;
    uint64_t one = 1;

    pthread_mutex_lock(&io->lock);
    for (;;) {
        while (mc_list_empty(&io->q) && !io->stop)
            pthread_cond_wait(&io->cond, &io->lock);
        if (io->stop)
            break;
        file_io_t *p = mc_container_of(mc_list_pop_front(&io->q), file_io_t, link);
        pthread_mutex_unlock(&io->lock);
        p->res = thread_do(p);
        pthread_mutex_lock(&io->lock);
        mc_list_push_back(&io->done, &p->link);
        if (write(io->ev.fd, &one, sizeof(one)) < 0) /* cannot fail short of a full counter */
            mc_debug("file: eventfd: %s", strerror(errno));
    }
    pthread_mutex_unlock(&io->lock);
    return NULL;
}

static void attempt(mc_engine_t *e, file_ioe_t *io, file_io_t *p)
{
    if (io->stop) { /* the threads are gone (engine teardown) */
        p->cb(e, p, -ECANCELED);
        return;
    }
    p->direct = use_direct(p);
    io->inflight++;
    if (io->mode == FILE_IO_URING) {
        ring_prep(io, p);
        return;
    }
    pthread_mutex_lock(&io->lock);
    mc_list_push_back(&io->q, &p->link);
    pthread_cond_signal(&io->cond);
    pthread_mutex_unlock(&io->lock);
}

void mc__file_io_submit(mc_engine_t *e, file_io_t *p)
{
    file_ioe_t *io = &file_of(e)->io;

    if (p->vram) {
        mc__file_copy_submit(e, &file_of(e)->copy, p);
        return;
    }
    p->done = 0;
    if (io->inflight >= io->depth) {
        mc_list_push_back(&io->waiting, &p->link);
        return;
    }
    attempt(e, io, p);
}

/* The outcome of one attempt: done, or another attempt for what is left. */
static void attempt_done(mc_engine_t *e, file_ioe_t *io, file_io_t *p, int res)
{
    io->inflight--;
    if (res == -EINVAL && p->direct) {
        if (!atomic_exchange(&p->f->no_direct, true))
            mc_info("file %s: O_DIRECT refused (EINVAL): it goes through the page cache",
                    p->f->path);
        attempt(e, io, p);
        return;
    }
    if (res == -EAGAIN || res == -EINTR) {
        attempt(e, io, p);
        return;
    }
    if (res > 0)
        p->done += (uint32_t)res;
    if (res > 0 && p->done < p->len) { /* short: the rest, perhaps no longer aligned */
        attempt(e, io, p);
        return;
    }
    p->cb(e, p, res < 0 ? res : p->done == p->len ? 0 : p->write ? -EIO : -ENODATA);
}

/* Pieces that waited for room take it. */
static void start_waiting(mc_engine_t *e, file_ioe_t *io)
{
    while (io->inflight < io->depth && !mc_list_empty(&io->waiting))
        attempt(e, io, mc_container_of(mc_list_pop_front(&io->waiting), file_io_t, link));
}

void mc__file_io_reap(mc_engine_t *e)
{
    file_engine_t *fe = file_of(e);
    file_ioe_t *io;
    mc_list_t done, *n;

    if (!fe || !atomic_load_explicit(&fe->io.up, memory_order_acquire)) /* not yet, or stopped */
        return;
    io = &fe->io;
    if (io->mode == FILE_IO_URING) {
        struct io_uring_cqe *cqe;
        for (unsigned k = 0; k < REAP_BATCH && io_uring_peek_cqe(&io->ring, &cqe) == 0; k++) {
            file_io_t *p = io_uring_cqe_get_data(cqe);
            int res = cqe->res;
            io_uring_cqe_seen(&io->ring, cqe);
            attempt_done(e, io, p, res);
        }
        /* more than a batch: the eventfd was read already, so another pass must come */
        if (io_uring_cq_ready(&io->ring))
            mc__doorbell(e);
    } else {
        mc_list_init(&done);
        pthread_mutex_lock(&io->lock);
        mc_list_splice_back(&done, &io->done);
        pthread_mutex_unlock(&io->lock);
        while ((n = mc_list_pop_front(&done))) {
            file_io_t *p = mc_container_of(n, file_io_t, link);
            attempt_done(e, io, p, p->res);
        }
    }
    start_waiting(e, io);
}

void mc__file_io_flush(mc_engine_t *e)
{
    file_engine_t *fe = file_of(e);
    file_ioe_t *io = &fe->io;

    if (!atomic_load_explicit(&io->up, memory_order_acquire) || io->mode != FILE_IO_URING ||
        !io->unsubmitted)
        return;
    int rc = io_uring_submit(&io->ring);
    if (rc >= 0)
        io->unsubmitted -= (unsigned)rc < io->unsubmitted ? (unsigned)rc : io->unsubmitted;
    else if (rc != -EAGAIN && rc != -EINTR && rc != -EBUSY)
        mc_warn("file: io_uring_submit: %s", strerror(-rc));
}

static void on_event(mc_engine_t *e, mc_pollable_t *pl, uint32_t events)
{
    uint64_t v;

    (void)events;
    if (read(pl->fd, &v, sizeof(v)) < 0 && errno != EAGAIN)
        mc_debug("file: eventfd: %s", strerror(errno));
    mc__file_io_reap(e);
}

void mc__file_io_reason(const file_io_t *p, int err, char *buf, size_t size)
{
    if (p->vram)
        snprintf(buf, size, "cuda:%d: copy of %u bytes %s VRAM at 0x%llx: %s", p->dev, p->len,
                 p->write ? "to" : "from", (unsigned long long)p->pos,
                 err == -ECANCELED ? "canceled"
                 : p->why[0]       ? p->why
                                   : strerror(-err));
    else if (err == -ENODATA)
        snprintf(buf, size,
                 "file %s: it ends before offset %llu (%u of %u bytes read): truncated since it "
                 "was registered",
                 p->f->path, (unsigned long long)(p->pos + p->done), p->done, p->len);
    else
        snprintf(buf, size, "file %s: %s of %u bytes at offset %llu: %s", p->f->path,
                 p->write ? "write" : "read", p->len, (unsigned long long)p->pos, strerror(-err));
}

/* ---- start and stop ---- */

static int threads_start(file_ioe_t *io, unsigned n)
{
    io->threads = calloc(n, sizeof(*io->threads));
    if (!io->threads)
        return mc__set_error(-ENOMEM, "out of memory");
    for (; io->n_threads < n; io->n_threads++) {
        int rc = pthread_create(&io->threads[io->n_threads], NULL, io_thread, io);
        if (rc)
            return mc__set_error(-rc, "file: cannot start an I/O thread: %s", strerror(rc));
    }
    return 0;
}

/* A start that failed half way: nothing of it stays. */
static void start_unwind(file_ioe_t *io)
{
    pthread_mutex_lock(&io->lock);
    io->stop = true;
    pthread_cond_broadcast(&io->cond);
    pthread_mutex_unlock(&io->lock);
    for (unsigned i = 0; i < io->n_threads; i++)
        pthread_join(io->threads[i], NULL);
    free(io->threads);
    io->threads = NULL;
    io->n_threads = 0;
    io->stop = false;
    if (io->ring_up)
        io_uring_queue_exit(&io->ring);
    io->ring_up = io->fixed_files = false;
    free(io->ftab);
    io->ftab = NULL;
    close(io->ev.fd);
    io->ev.fd = -1;
}

static int backend_start(file_ioe_t *io, int mode, unsigned depth, unsigned threads)
{
    if (mode != FILE_IO_THREAD && ring_start(io, depth) == 0) {
        io->mode = FILE_IO_URING;
        mc_info("file: I/O through io_uring (%u entries, %s files)", io->depth,
                io->fixed_files ? "registered" : "plain");
        return 0;
    }
    if (mode == FILE_IO_URING)
        return mc__set_error(-MC_ENODEV, "MC_FILE_IO=uring, but io_uring is unavailable: %s",
                             io->why);
    io->mode = FILE_IO_THREAD;
    if (mode == FILE_IO_THREAD)
        snprintf(io->why, sizeof(io->why), "MC_FILE_IO=thread");
    /* The one line that says why file I/O is slower here. */
    mc_log(mode == FILE_IO_THREAD ? MC_LOG_INFO : MC_LOG_WARN,
           "file: io_uring unavailable (%s): file I/O goes through %u pread/pwrite threads",
           io->why, threads);
    return threads_start(io, threads);
}

int mc__file_io_start(mc_engine_t *e, file_ioe_t *io, int mode, unsigned depth, unsigned threads)
{
    int rc;

    mc_list_init(&io->waiting);
    mc_list_init(&io->q);
    mc_list_init(&io->done);
    io->depth = depth;
    io->ev.fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    io->ev.handler = on_event;
    if (io->ev.fd < 0)
        return mc__set_error(-errno, "file: eventfd: %s", strerror(errno));
    rc = backend_start(io, mode, depth, threads);
    if (!rc)
        rc = mc__epoll_add(e, &io->ev, EPOLLIN);
    if (rc)
        start_unwind(io);
    return rc;
}

/* Fail every piece of list (they never started). */
static void cancel_list(mc_engine_t *e, mc_list_t *list)
{
    mc_list_t *n;

    while ((n = mc_list_pop_front(list))) {
        file_io_t *p = mc_container_of(n, file_io_t, link);
        p->cb(e, p, -ECANCELED);
    }
}

/* Every piece that waits fails; those in flight are waited for (bounded) and reaped. */
void mc__file_io_stop(mc_engine_t *e, file_ioe_t *io)
{
    if (io->ev.fd < 0)
        return;
    cancel_list(e, &io->waiting);
    if (io->mode == FILE_IO_URING && io->ring_up) {
        struct __kernel_timespec ts = {.tv_nsec = 100 * 1000 * 1000};
        struct io_uring_cqe *cqe;
        io->depth = 0; /* what completes now starts nothing new: it waits, and is canceled */
        io_uring_submit(&io->ring);
        io->unsubmitted = 0;
        for (int waited = 0; io->inflight && waited < STOP_WAIT_MS; waited += 100) {
            if (io_uring_wait_cqe_timeout(&io->ring, &cqe, &ts) == 0)
                mc__file_io_reap(e);
            cancel_list(e, &io->waiting);
            io_uring_submit(&io->ring); /* the rest of short pieces */
        }
        if (io->inflight)
            mc_warn("file: %u pieces of I/O still in flight after %d ms", io->inflight,
                    STOP_WAIT_MS);
        io->ring_up = false;
        io_uring_queue_exit(&io->ring);
    } else if (io->mode == FILE_IO_THREAD) {
        pthread_mutex_lock(&io->lock);
        io->stop = true;
        pthread_cond_broadcast(&io->cond);
        mc_list_t q;
        mc_list_init(&q);
        mc_list_splice_back(&q, &io->q);
        pthread_mutex_unlock(&io->lock);
        for (unsigned i = 0; i < io->n_threads; i++)
            pthread_join(io->threads[i], NULL);
        for (mc_list_t *n; (n = mc_list_pop_front(&q));) {
            file_io_t *p = mc_container_of(n, file_io_t, link);
            io->inflight--;
            p->cb(e, p, -ECANCELED);
        }
        mc__file_io_reap(e); /* what the threads finished; their retries are canceled */
        cancel_list(e, &io->waiting);
    }
    free(io->threads);
    io->threads = NULL;
    io->n_threads = 0;
    atomic_store(&io->up, false); /* (after its reaps: they are this stop's own) */
    mc__epoll_del(e, &io->ev);
    close(io->ev.fd);
    io->ev.fd = -1;
    pthread_mutex_lock(&io->ftab_lock);
    free(io->ftab);
    io->ftab = NULL;
    io->fixed_files = io->fixed_bufs = false;
    pthread_mutex_unlock(&io->ftab_lock);
}
