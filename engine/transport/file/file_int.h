/*
 * The file transport's internals. It owns the buffers that are files or block devices (opaque
 * buffers, buffer.h): their bytes move with io_uring, or pread/pwrite threads where io_uring is
 * missing (file_io.c), between the file and memory, in three ways:
 *   - between a file of ours and memory of ours, straight into and out of that memory (a task
 *     to our own segment: a shard loaded from NVMe, KV blocks spilled to it);
 *   - between a file of ours and a peer's memory, through a bounce chunk of ours and a child
 *     task of the engine to the peer over the best other transport (file_op.c);
 *   - between our memory and a peer's file: the owner stages the range in one of its bounce
 *     chunks (read from the file, or written to it once the data is in), which are registered
 *     memory any transport reaches, and our child task moves the bytes (file_pool.c). The
 *     requests that stage, commit and release go to the owner's file transport as control
 *     requests; the owner answers those that wait for its disk later (MC_CTRL_LATER).
 * Slices are MC_FILE_SLICE_SIZE, a disk's size, each one piece of I/O and at most one chunk.
 * Everything runs in the progress context except registration and the I/O threads.
 */
#ifndef MC_FILE_INT_H
#define MC_FILE_INT_H

#include <stdatomic.h>

#include <liburing.h>

#include "../transport.h"

extern unsigned mc__file_slot;

enum { FILE_IO_URING, FILE_IO_THREAD };

/* A file buffer: b->tp[mc__file_slot] of an opaque buffer. */
typedef struct file_buf {
    int fd;                /* through the page cache */
    int fd_direct;         /* O_DIRECT, or -1 */
    int fixed;             /* fd's slot in the ring's file table, or -1 */
    int fixed_direct;      /* fd_direct's, or -1 */
    uint64_t offset;       /* where the buffer starts in the file */
    unsigned flags;        /* MC_FILE_* */
    unsigned align;        /* what O_DIRECT needs of offset, length and memory */
    atomic_bool said;      /* "unaligned pieces go through the page cache" was logged */
    atomic_bool no_direct; /* O_DIRECT failed (EINVAL) once: not again */
    char path[];
} file_buf_t;

/* One piece of I/O between a file buffer (or VRAM) and memory. */
typedef struct file_io {
    mc_list_t link; /* queued for room in the ring, or for a thread; then done (threads) */
    file_buf_t *f;  /* NULL for VRAM */
    uint8_t *mem;
    uint64_t pos;  /* in the file; VRAM: its address */
    uint32_t len;  /* bytes */
    uint32_t done; /* bytes moved so far */
    bool write;    /* memory to the file (or VRAM) */
    bool direct;   /* the current attempt goes through fd_direct */
    bool vram;     /* a copy on CUDA device dev (file_copy.c), not file I/O */
    int dev;
    int res;       /* threads: the outcome of the attempt; a copy: of its start */
    void *ev;      /* a copy: the event recorded after it */
    char why[160]; /* a copy that failed: the runtime's reason */
    /* 0: every byte moved; -ENODATA: the file ends before (read); else a negative errno. */
    void (*cb)(mc_engine_t *e, struct file_io *io, int err);
} file_io_t;

/* The I/O backend: one ring (or a few threads), its completions through an eventfd in the
 * engine's epoll set. */
typedef struct file_ioe {
    int mode;
    mc_pollable_t ev;     /* the eventfd */
    unsigned depth;       /* MC_FILE_QUEUE_DEPTH: pieces in flight */
    unsigned inflight;    /* in the ring, or with the threads */
    unsigned unsubmitted; /* prepared in the ring, not yet submitted */
    mc_list_t waiting;    /* pieces waiting for room */
    /* Started whole (mc__file_setup publishes it once the buffers are in): until then progress
     * leaves the backend alone, though the chunks may be ready for VRAM and a host thread
     * sets the ring up. */
    atomic_bool up;
    struct io_uring ring;
    bool ring_up;
    bool fixed_files, fixed_bufs; /* tables registered with the ring */
    uint8_t *fixed_base;          /* the registered buffer (the bounce pool) */
    uint64_t fixed_len;
    pthread_mutex_t ftab_lock; /* ftab: registering threads */
    uint8_t *ftab;             /* slots of the file table in use */
    unsigned ftab_n;
    pthread_t *threads; /* thread mode */
    unsigned n_threads;
    pthread_mutex_t lock; /* q, done, stop */
    pthread_cond_t cond;
    mc_list_t q, done;
    bool stop;
    char why[256]; /* why not io_uring */
} file_ioe_t;

#define FILE_IPC_HANDLE 64 /* bytes of a CUDA IPC memory handle */

/* b->tp[mc__file_slot] of our VRAM: what a same-host peer opens it by (CUDA IPC). */
typedef struct file_vram {
    uint8_t handle[FILE_IPC_HANDLE];
    uint64_t off; /* of b->addr in the handle's allocation */
    uint64_t gen; /* the buffer's serial: a handle registered again is another buffer */
} file_vram_t;

/* A peer buffer's part when it is VRAM with an IPC handle (mc__desc_part; not a file: the
 * buffer's owner stays 0). */
typedef struct file_desc_ipc {
    uint8_t handle[FILE_IPC_HANDLE];
    uint64_t off, gen;
} file_desc_ipc_t;

/* A peer's buffer at an op's far end, as its descriptor said when the op started (copied: the
 * list may move under a host thread that adds a buffer key). */
typedef struct file_far {
    mc_desc_buffer_t b;
    file_desc_ipc_t ipc; /* its IPC handle (has_ipc) */
    bool has_ipc;
} file_far_t;

/* A peer's VRAM opened here (fe->ipc_maps), once the peer granted it (mc__grant_ask): ops in
 * flight hold it; closed and freed once none does after the peer revoked it or went. An entry
 * whose handle did not open stays, so that it is not opened again. */
typedef struct file_ipc_map {
    mc_list_t link;
    uint64_t instance; /* the peer engine's */
    uint64_t addr;     /* its buffer's address */
    uint8_t handle[FILE_IPC_HANDLE];
    uint64_t gen;     /* the buffer's serial at the peer */
    int dev;          /* whose context opened it, and whose stream copies */
    uint64_t off;     /* of the buffer in the allocation opened */
    void *base;       /* NULL: not granted (yet), opening failed, the buffer does not fit, or
                         no same-host channel: staged */
    uint64_t len;     /* of the allocation opened */
    uint64_t blen;    /* of the buffer, as the descriptor says */
    unsigned refs;    /* ops copying through it */
    mc_list_t asking; /* ops waiting for the peer's grant (file_op_t.link) */
    bool asked;       /* the grant is asked for, not answered yet */
    bool gone; /* its peer unregistered it (REVOKE), went, or registered another buffer there:
                  no op starts on it */
} file_ipc_map_t;

/* Copies between VRAM and host memory (file_copy.c): what the copier asks of a device runtime
 * (the CUDA runtime; unit tests bring their own). Each returns 0 or a negative errno, with the
 * reason in why. */
typedef struct file_copy_ops {
    int (*stream_create)(int dev, void **s_p, char *why, size_t size);
    void (*stream_destroy)(int dev, void *s);
    int (*event_create)(int dev, void **ev_p, char *why, size_t size);
    void (*event_destroy)(int dev, void *ev);
    /* Queue a copy of len bytes on stream s of device dev, then record ev behind it. */
    int (*copy)(int dev, void *s, void *ev, void *dst, const void *src, size_t len, char *why,
                size_t size);
    /* 0: the copy before ev is done; -EAGAIN: not yet; else it failed. */
    int (*query)(int dev, void *ev, char *why, size_t size);
    /* As query, but waits (teardown): never -EAGAIN. */
    int (*wait)(int dev, void *ev, char *why, size_t size);
    /* CUDA IPC (NULL where there is none). export: the handle of the allocation holding the
     * VRAM [addr, addr+len) (which must lie inside it), and addr's offset in it. open (from
     * device dev's context, in this process): its base and length here. close: let go of what
     * open gave. */
    int (*ipc_export)(int dev, uint64_t addr, uint64_t len, uint8_t handle[FILE_IPC_HANDLE],
                      uint64_t *off_p, char *why, size_t size);
    int (*ipc_open)(int dev, const uint8_t handle[FILE_IPC_HANDLE], void **base_p, uint64_t *len_p,
                    char *why, size_t size);
    void (*ipc_close)(int dev, void *base);
} file_copy_ops_t;

#define FILE_COPY_DEVS 64

/* One device's stream: copies run on it in the order queued, so they finish in that order. */
typedef struct file_copy_dev {
    void *stream;   /* created on its first copy */
    mc_list_t fifo; /* file_io_t queued on it, oldest first */
    void **spare;   /* events ready for reuse (depth of them at most) */
    unsigned n_spare;
} file_copy_dev_t;

/* The copier: at most depth copies in flight, the rest wait; completions found by polling
 * each stream's oldest event from the progress loop (a device has no descriptor to wait on). */
typedef struct file_copier {
    const file_copy_ops_t *ops; /* NULL until VRAM is registered */
    unsigned depth, inflight;
    mc_list_t waiting; /* for room */
    mc_list_t failed;  /* refused at start: their callbacks run from the next reap */
    file_copy_dev_t dev[FILE_COPY_DEVS];
} file_copier_t;

/* A bounce chunk. Lend chunks serve peers (file_pool.c), the others stage our own transfers:
 * separate, so that a transfer holding one of ours and waiting for a peer's never waits on
 * chunks that such transfers hold. */
typedef struct file_chunk {
    mc_list_t link; /* in a free list or the quarantine */
    uint8_t *mem;
    uint32_t index;
    uint16_t gen;            /* changes whenever it is given back: stale ids are refused */
    bool lend;               /* of the lend half */
    struct file_lend *owner; /* the lend that holds it */
    uint64_t free_at;        /* in quarantine: until then */
} file_chunk_t;

/* A peer's use of one lend chunk (owner side). */
enum { LEND_WAIT, LEND_READING, LEND_LENT, LEND_WRITING };

typedef struct file_lend {
    mc_list_t link;        /* in fe->lend_wait or fe->lent */
    mc_link_bound_t bound; /* kind FB_LENT: to the link of its STAGE while lent */
    mc_ctrl_later_t later; /* kind FB_LATER: the answer we owe */
    file_chunk_t *chunk;
    mc_buffer_t *fb;   /* the file buffer, referenced while its bytes may still move */
    uint64_t instance; /* the peer engine it serves */
    uint64_t addr;     /* the file range staged */
    uint32_t len;
    uint8_t opcode;
    uint8_t state;
    uint64_t since_ns;
    file_io_t io;
} file_lend_t;

/* What each bound object is (mc_link_bound_t.kind). */
enum { FB_OP, FB_LENT, FB_LATER };

/* The file transport's control requests, little-endian:
 *   0 u8 kind   1 u8 opcode   2 u16 count (RELEASE)   4 u32 lend id (COMMIT)
 *   8 u64 addr  16 u32 len    20 u32 0                 RELEASE: 8 u32 ids[count]
 * STAGE's answer: u64 address of the chunk, u32 lend id. */
enum { FREQ_STAGE = 1, FREQ_COMMIT, FREQ_RELEASE };
#define FREQ_HDR         24
#define FREQ_RELEASE_MAX ((MC_CTRL_MAX - 8) / 4)

/* One slice in the hands of the initiator (file_op.c). */
typedef struct file_op {
    mc_list_t link;        /* fe->ops_free, a waiting list, or fe->held */
    mc_list_t live;        /* in fe->live from its start to its end */
    mc_link_bound_t bound; /* kind FB_OP: to the link of its unanswered request */
    mc_engine_t *e;
    mc_slice_t *s;
    mc_peer_t *p;
    uint8_t steps[4], n_steps, step;
    bool waiting; /* in a waiting list (chunk_wait, ctrl_wait, answered) */
    bool lent;    /* the owner lent us a chunk: lend_addr, lend_id */
    bool asked;   /* a control request of it is unanswered */
    bool retry;   /* the request was lost with its link: the slice may start over */
    int rstatus;  /* the answer's status */
    char rreason[420];
    uint8_t req[FREQ_HDR]; /* the request in flight */
    file_chunk_t *chunk;
    mc_buffer_t *rbuf; /* our own segment: the buffer at the far end, referenced */
    uint8_t *mem;      /* the memory the data passes through */
    uint64_t lend_addr;
    uint32_t lend_id;
    mc_batch_t *child;
    file_ipc_map_t *ipc; /* the peer's VRAM, opened here: one copy, no staging */
    file_io_t io;
    int held_err;      /* held in fe->held: its slice's failure, told once its task's ops ended */
    char *held_reason; /* (allocated; NULL: out of memory, told without a reason of its own) */
} file_op_t;

/* p->tp[mc__file_slot] */
typedef struct file_peer {
    mc_peer_t *peer;
    uint32_t release[FREQ_RELEASE_MAX]; /* lend ids to give back to it */
    unsigned n_release;
    mc_list_t rel_link; /* in fe->rel_peers while n_release */
} file_peer_t;

/* d->tp[mc__file_slot]: what a peer says of its file transport. */
typedef struct file_desc {
    char io[16];
    uint32_t chunk; /* its bounce chunks: the largest slice it stages */
} file_desc_t;

/* A peer buffer's part (mc__desc_part). */
typedef struct file_desc_buf {
    uint64_t offset;
    uint32_t flags, align;
    char path[]; /* "" when it came in a buffer key */
} file_desc_buf_t;

/* e->tp[mc__file_slot] */
typedef struct file_engine {
    /* settings */
    int io_mode; /* -1: auto */
    unsigned depth, threads;
    uint32_t chunk;
    uint64_t bounce;

    pthread_mutex_t setup_lock; /* the first registration sets up what follows */
    atomic_bool ready;
    file_ioe_t io;
    file_copier_t copy;
    bool pinned;   /* the pool is page-locked for the device runtime (copies run asynchronously) */
    int pin_dev;   /* ... from this device's context */
    uint8_t *pool; /* MC_FILE_BOUNCE bytes of registered memory */
    file_chunk_t *chunks;
    unsigned n_chunks;
    mc_list_t free_local, free_lend, quarantine;

    /* progress-owned */
    bool stopping;
    bool kicked;    /* a chunk came free, an op ended: mc__file_work has something to do */
    unsigned n_ops; /* ops started (MC_FILE_QUEUE_DEPTH at most) */
    mc_list_t ops_free;
    mc_list_t live;       /* ops started and not ended (file_op_t.live) */
    mc_list_t held;       /* ended ops whose failure waits for the other ops of its task to end */
    mc_list_t chunk_wait; /* ops waiting for a chunk of ours */
    mc_list_t ctrl_wait;  /* ops waiting for a ready control link */
    mc_list_t answered;   /* ops whose answer came, or whose link went (inside tcp) */
    mc_list_t rel_peers;  /* peers with chunks to release */
    mc_list_t lend_wait;  /* lends waiting for a chunk */
    mc_list_t lent;       /* lends handed out, oldest first */
    mc_list_t ipc_maps;   /* file_ipc_map_t: peers' VRAM opened here */
    file_lend_t *lend_free;
} file_engine_t;

static inline file_engine_t *file_of(mc_engine_t *e)
{
    return e->tp[mc__file_slot];
}

static inline file_buf_t *file_buf(const mc_buffer_t *b)
{
    return b->tp[mc__file_slot];
}

static inline bool file_owned(const mc_buffer_t *b)
{
    return b->owner == mc__file_slot + 1;
}

/* Whether the bytes of b go through a chunk to reach a peer: a file, or VRAM. */
static inline bool file_staged(const mc_buffer_t *b)
{
    return file_owned(b) || b->vram;
}

/* Whether a peer's buffer is staged by its owner: a file, or VRAM. */
static inline bool file_desc_staged(const mc_desc_buffer_t *rb)
{
    return rb->owner == mc__file_slot + 1 || !strncmp(rb->location, "cuda:", 5);
}

/* file.c: the bounce chunks (ready once they are there), and with io the I/O backend, on the
 * first registration that needs them (any thread). */
int mc__file_setup(mc_engine_t *e, bool io);

/* file_io.c */
/* Point io at [addr, addr+len) of b (a file, or VRAM), to or from mem. */
void mc__file_io_prep(file_io_t *io, const mc_buffer_t *b, uint64_t addr, uint8_t *mem,
                      uint32_t len, bool write);
/* Start the backend of mode (or auto: io_uring, else threads, said once). */
int mc__file_io_start(mc_engine_t *e, file_ioe_t *io, int mode, unsigned depth, unsigned threads);
/* Cancel what waits, wait for what is in flight (its callbacks run with -ECANCELED), stop. */
void mc__file_io_stop(mc_engine_t *e, file_ioe_t *io);
/* Queue a piece (progress context); its callback runs from a later reap. */
void mc__file_io_submit(mc_engine_t *e, file_io_t *io);
/* Hand what was prepared to the kernel (one syscall), and run completions. */
void mc__file_io_flush(mc_engine_t *e);
void mc__file_io_reap(mc_engine_t *e);
/* The ring's file table (registering thread). */
void mc__file_io_add_file(file_ioe_t *io, file_buf_t *f);
void mc__file_io_remove_file(file_ioe_t *io, file_buf_t *f);
/* Register [base, base+len) as the ring's one fixed buffer. */
void mc__file_io_add_buffer(file_ioe_t *io, uint8_t *base, uint64_t len);
/* Whether io_uring works here (mooncake-info): 1, or 0 with the reason. */
int mc__file_io_probe(char *why, size_t size);
const char *mc__file_io_name(const file_ioe_t *io);
/* "file PATH: ..." for a failed piece. */
void mc__file_io_reason(const file_io_t *io, int err, char *buf, size_t size);

/* file_copy.c */
void mc__file_copy_init(file_copier_t *c, unsigned depth);
/* Queue a copy (io->vram; progress context); its callback runs from a later reap. */
void mc__file_copy_submit(mc_engine_t *e, file_copier_t *c, file_io_t *io);
/* Run the callbacks of the copies that finished, oldest first on each device, and start those
 * that waited for room. */
void mc__file_copy_reap(mc_engine_t *e, file_copier_t *c);
/* Waiting copies fail (-ECANCELED); those in flight are waited for; streams and events go. */
void mc__file_copy_stop(mc_engine_t *e, file_copier_t *c);
static inline bool mc__file_copy_busy(const file_copier_t *c)
{
    return c->inflight || !mc_list_empty(&c->failed);
}
/* b is VRAM being registered: what a same-host peer opens it by, if the runtime can say. */
void mc__file_vram_register(mc_engine_t *e, mc_buffer_t *b);
/* The CUDA runtime's copies (NULL in a build without CUDA); page-locking the bounce pool. */
extern const file_copy_ops_t *const mc__file_copy_cuda;
/* Page-lock [mem, mem+len) for every device, from device dev's context. */
int mc__file_cuda_pin(void *mem, size_t len, int dev, char *why, size_t size);
void mc__file_cuda_unpin(void *mem, int dev);

/* file_pool.c: bounce chunks and the owner's side */
file_chunk_t *mc__file_chunk_get(mc_engine_t *e, bool lend);
void mc__file_chunk_put(mc_engine_t *e, file_chunk_t *c);
int mc__file_serve(mc_engine_t *e, mc_link_t *l, const uint8_t *req, size_t len, void *ans,
                   size_t *ans_len);
void mc__file_lend_lost(mc_engine_t *e, mc_link_bound_t *b);
/* Lends that waited for a chunk take the free ones. */
void mc__file_pool_kick(mc_engine_t *e);
void mc__file_pool_timers(mc_engine_t *e, uint64_t now);
void mc__file_pool_stop(mc_engine_t *e);
void mc__file_pool_fini(mc_engine_t *e);

/* file_op.c: the initiator's side */
void mc__file_fill(mc_engine_t *e, mc_peer_t *p);
void mc__file_ctrl_reply(mc_engine_t *e, mc_slice_t *s, mc_link_t *l, int status, const void *ans,
                         size_t len);
void mc__file_op_lost(mc_engine_t *e, mc_link_bound_t *b);
/* What waited (answers, chunks, links, releases) goes on. Progress hooks. */
void mc__file_ops_kick(mc_engine_t *e);
void mc__file_ops_timers(mc_engine_t *e, uint64_t now);
void mc__file_peer_gone(mc_engine_t *e, mc_peer_t *p);
/* Transport ops grant_answer and revoke (transport.h): a same-host peer's VRAM. */
void mc__file_grant_answer(mc_engine_t *e, mc_peer_t *p, uint64_t addr, uint64_t serial, bool ok);
unsigned mc__file_revoke(mc_engine_t *e, mc_peer_t *p, uint64_t addr, uint64_t serial);
/* Close every IPC mapping (teardown, after the copies). */
void mc__file_ipc_fini(mc_engine_t *e);
void mc__file_ops_stop(mc_engine_t *e);
void mc__file_ops_fini(mc_engine_t *e);

/* file_desc.c */
extern const mc_desc_codec_t mc__file_codec;

#endif
