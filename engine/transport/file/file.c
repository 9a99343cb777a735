/* The file transport: its ops table, settings, setup on the first registration, teardown, and
 * the hooks that tie its parts to the progress loop. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../../util/bytes.h"
#include "file_int.h"

unsigned mc__file_slot;

#define FILE_MAX_CHUNKS 65535 /* a lend id has 16 bits for the chunk */

static int parse_io(const char *v, uint64_t *num_p)
{
    static const char *const names[] = {"auto", "uring", "thread"};

    for (unsigned i = 0; i < 3; i++)
        if (!strcmp(v, names[i])) {
            *num_p = i;
            return 0;
        }
    return mc__set_error(-MC_ECONFIG, "expected auto, uring or thread");
}

static const mc_setting_t file_settings[] = {
    {"FILE_IO", "auto", 0, 0, parse_io,
     "file I/O: auto (io_uring, else threads), uring (io_uring or fail), thread (pread/pwrite)"},
    {"FILE_QUEUE_DEPTH", "64", 1, 4096, NULL,
     "file I/O in flight (the io_uring queue depth), and VRAM copies in flight"},
    {"FILE_SLICE_SIZE", "1048576", 4096, MC_SLICE_MAX, NULL,
     "bytes per piece of file I/O or VRAM copy, and per bounce chunk"},
    {"FILE_BOUNCE_SIZE", "67108864", 8192, 1ull << 34, NULL,
     "bounce buffers once a file or VRAM is registered: half serve peers, half stage our own "
     "transfers"},
    {"FILE_THREADS", "4", 1, 256, NULL, "I/O threads where io_uring is unavailable"},
    {0},
};

static int file_init(mc_engine_t *e)
{
    file_engine_t *fe = calloc(1, sizeof(*fe));
    static const int modes[] = {-1, FILE_IO_URING, FILE_IO_THREAD};

    if (!fe)
        return mc__set_error(-ENOMEM, "out of memory");
    fe->io_mode = modes[mc__config_num(e->conf, "FILE_IO")];
    fe->depth = (unsigned)mc__config_num(e->conf, "FILE_QUEUE_DEPTH");
    fe->chunk = (uint32_t)mc__config_num(e->conf, "FILE_SLICE_SIZE");
    fe->bounce = mc__config_num(e->conf, "FILE_BOUNCE_SIZE");
    fe->threads = (unsigned)mc__config_num(e->conf, "FILE_THREADS");
    if (fe->bounce / fe->chunk < 2 || fe->bounce / fe->chunk > FILE_MAX_CHUNKS) {
        free(fe);
        return mc__set_error(-MC_ECONFIG,
                             "MC_FILE_BOUNCE_SIZE must hold 2 to %u chunks of MC_FILE_SLICE_SIZE",
                             FILE_MAX_CHUNKS);
    }
    pthread_mutex_init(&fe->setup_lock, NULL);
    pthread_mutex_init(&fe->io.ftab_lock, NULL);
    pthread_mutex_init(&fe->io.lock, NULL);
    pthread_cond_init(&fe->io.cond, NULL);
    fe->io.ev.fd = -1;
    mc__file_copy_init(&fe->copy, fe->depth);
    mc_list_init(&fe->free_local);
    mc_list_init(&fe->free_lend);
    mc_list_init(&fe->quarantine);
    mc_list_init(&fe->ops_free);
    mc_list_init(&fe->live);
    mc_list_init(&fe->held);
    mc_list_init(&fe->chunk_wait);
    mc_list_init(&fe->ctrl_wait);
    mc_list_init(&fe->answered);
    mc_list_init(&fe->rel_peers);
    mc_list_init(&fe->lend_wait);
    mc_list_init(&fe->lent);
    mc_list_init(&fe->ipc_maps);
    e->tp[mc__file_slot] = fe;
    return 0;
}

/* The bounce chunks: registered memory (every transport reaches it; the ring has it as its
 * fixed buffer), the first half ours, the second lent to peers. */
static int pool_setup(mc_engine_t *e, file_engine_t *fe)
{
    uint64_t len = fe->bounce / fe->chunk * fe->chunk;
    int rc;

    fe->pool = aligned_alloc(1u << 21, (len + (1u << 21) - 1) & ~(uint64_t)((1u << 21) - 1));
    fe->n_chunks = (unsigned)(fe->bounce / fe->chunk);
    fe->chunks = calloc(fe->n_chunks, sizeof(*fe->chunks));
    if (!fe->pool || !fe->chunks) {
        free(fe->pool);
        free(fe->chunks);
        fe->pool = NULL;
        fe->chunks = NULL;
        return mc__set_error(-ENOMEM, "out of memory for %llu bytes of bounce buffers",
                             (unsigned long long)len);
    }
    memset(fe->pool, 0, len); /* backed now, not on the first transfer */
    rc = mc__mem_register_internal(e, fe->pool, len);
    if (rc) {
        free(fe->pool);
        free(fe->chunks);
        fe->pool = NULL;
        fe->chunks = NULL;
        return rc;
    }
    for (unsigned i = 0; i < fe->n_chunks; i++) {
        file_chunk_t *c = &fe->chunks[i];
        c->mem = fe->pool + (uint64_t)i * fe->chunk;
        c->index = i;
        c->lend = i >= fe->n_chunks / 2;
        mc_list_push_back(c->lend ? &fe->free_lend : &fe->free_local, &c->link);
    }
    mc__file_io_add_buffer(&fe->io, fe->pool, (uint64_t)fe->n_chunks * fe->chunk);
    return 0;
}

/* On the first registration of a file: the I/O backend (io) and the bounce chunks; of VRAM: the
 * chunks. Engines that never register either pay for neither. */
int mc__file_setup(mc_engine_t *e, bool io)
{
    file_engine_t *fe = file_of(e);
    int rc = 0;

    pthread_mutex_lock(&fe->setup_lock);
    if (io && fe->io.ev.fd < 0) {
        rc = mc__file_io_start(e, &fe->io, fe->io_mode, fe->depth, fe->threads);
        if (!rc && fe->pool) /* set up for VRAM before: the ring gets it now */
            mc__file_io_add_buffer(&fe->io, fe->pool, (uint64_t)fe->n_chunks * fe->chunk);
    }
    if (!rc && !atomic_load(&fe->ready)) {
        rc = pool_setup(e, fe);
        if (!rc)
            atomic_store(&fe->ready, true);
    }
    /* Progress may use the backend from here on: it may have been running all along (VRAM's
     * chunks were ready), and looked at the backend while this thread set it up. */
    if (!rc && fe->io.ev.fd >= 0 && !atomic_load(&fe->io.up))
        atomic_store_explicit(&fe->io.up, true, memory_order_release);
    pthread_mutex_unlock(&fe->setup_lock);
    return rc;
}

/* On the first registration of VRAM b: the chunks, page-locked so that the device's copies to
 * and from them run asynchronously, and the copier on the CUDA runtime (registering VRAM
 * succeeded, so the runtime is there). Without chunks the VRAM still registers: rdma moves it
 * where GPUDirect reaches it, and this transport refuses its tasks (file_accept). */
static void vram_setup(mc_engine_t *e, const mc_buffer_t *b)
{
    file_engine_t *fe = file_of(e);
    char why[256];

    if (mc__file_setup(e, false)) {
        mc_warn("file: no bounce chunks to stage VRAM through (%s): %s moves over rdma with "
                "GPUDirect only",
                mc_last_error(), b->location);
        return;
    }
    pthread_mutex_lock(&fe->setup_lock);
    if (!fe->copy.ops) {
        fe->pin_dev = atoi(b->location + 5);
        fe->pinned = !mc__file_cuda_pin(fe->pool, (uint64_t)fe->n_chunks * fe->chunk, fe->pin_dev,
                                        why, sizeof(why));
        if (!fe->pinned)
            mc_warn("file: the bounce chunks are not page-locked (%s): VRAM copies through them "
                    "do not overlap",
                    why);
        fe->copy.ops = mc__file_copy_cuda;
    }
    pthread_mutex_unlock(&fe->setup_lock);
}

void mc__file_vram_register(mc_engine_t *e, mc_buffer_t *b)
{
    const file_copy_ops_t *ops = file_of(e)->copy.ops;
    file_vram_t *v;
    char why[256];

    /* (with MC_AUTH_TOKEN set, same-host peers authenticate no better than by uid: as shm, off) */
    if (!ops || !ops->ipc_export || e->cfg.auth_token[0] || !(v = calloc(1, sizeof(*v))))
        return;
    if (ops->ipc_export(atoi(b->location + 5), b->addr, b->len, v->handle, &v->off, why,
                        sizeof(why))) {
        mc_info("file: %s at 0x%llx has no CUDA IPC handle (%s): same-host peers stage it",
                b->location, (unsigned long long)b->addr, why);
        free(v);
        return;
    }
    v->gen = b->serial;
    b->tp[mc__file_slot] = v;
}

/* Engine teardown (progress context, links closed already): what waits ends, the I/O in flight
 * is waited for. */
static void file_stop(mc_engine_t *e)
{
    file_engine_t *fe = file_of(e);

    fe->stopping = true;
    mc__file_ops_stop(e);
    mc__file_pool_stop(e);
    mc__file_io_stop(e, &fe->io);
    mc__file_copy_stop(e, &fe->copy);
    mc__file_ops_stop(e);
    mc__file_pool_stop(e);
    mc__file_ipc_fini(e); /* no copy runs any more */
}

static void file_fini(mc_engine_t *e)
{
    file_engine_t *fe = file_of(e);

    mc__file_ops_fini(e);
    mc__file_pool_fini(e);
    if (fe->pinned)
        mc__file_cuda_unpin(fe->pool, fe->pin_dev);
    free(fe->pool); /* its registration went with the others (mc__memtab_fini) */
    pthread_mutex_destroy(&fe->io.ftab_lock);
    pthread_mutex_destroy(&fe->io.lock);
    pthread_cond_destroy(&fe->io.cond);
    pthread_mutex_destroy(&fe->setup_lock);
    free(fe);
    e->tp[mc__file_slot] = NULL;
}

/* ---- descriptor ---- */

static int file_encode(mc_engine_t *e, json_t *root)
{
    file_engine_t *fe = file_of(e);

    if (!atomic_load(&fe->ready))
        return 0; /* no file here: nothing to say */
    return json_object_set_new(root, "file",
                               json_pack("{s:s,s:I}", "io", mc__file_io_name(&fe->io), "chunk",
                                         (json_int_t)fe->chunk))
               ? -ENOMEM
               : 0;
}

static unsigned direct_align(const file_buf_t *f)
{
    return f->fd_direct >= 0 && !atomic_load(&f->no_direct) ? f->align : 0;
}

/* Our VRAM's IPC handle: "cuda_ipc": {"handle": 128 hex digits, "offset", "gen"}. */
static int encode_ipc(const file_vram_t *v, json_t *jb)
{
    char hex[2 * FILE_IPC_HANDLE + 1];

    for (unsigned i = 0; i < FILE_IPC_HANDLE; i++)
        snprintf(hex + 2 * i, 3, "%02x", v->handle[i]);
    return json_object_set_new(jb, "cuda_ipc",
                               json_pack("{s:s,s:I,s:I}", "handle", hex, "offset",
                                         (json_int_t)v->off, "gen", (json_int_t)v->gen))
               ? -ENOMEM
               : 0;
}

static int file_encode_buffer(mc_engine_t *e, const mc_buffer_t *b, json_t *jb)
{
    const file_buf_t *f = file_buf(b);

    (void)e;
    if (b->vram && b->tp[mc__file_slot])
        return encode_ipc(b->tp[mc__file_slot], jb);
    if (!file_owned(b))
        return 0;
    return json_object_set_new(jb, "file",
                               json_pack("{s:s,s:I,s:I,s:I}", "path", f->path, "offset",
                                         (json_int_t)f->offset, "flags", (json_int_t)f->flags,
                                         "align", (json_int_t)direct_align(f)))
               ? -ENOMEM
               : 0;
}

/* Its bytes, and our chunk size: how much we stage at a time, which a peer that knows the file
 * by its key alone (our descriptor of before the file, without a file part) must not pass. */
static int file_key_pack(mc_engine_t *e, const mc_buffer_t *b, uint8_t *out, size_t cap)
{
    const file_buf_t *f = file_buf(b);

    if (!file_owned(b))
        return 0;
    if (cap < 20)
        return mc__set_error(-E2BIG, "no room for the file part of a key");
    mc__put64(out, f->offset);
    mc__put32(out + 8, f->flags);
    mc__put32(out + 12, direct_align(f));
    mc__put32(out + 16, file_of(e)->chunk);
    return 20;
}

/* ---- memory ---- */

static int file_mem_register(mc_engine_t *e, mc_buffer_t *b)
{
    if (b->vram) { /* staged here when no NIC reaches it, opened by same-host peers */
        vram_setup(e, b);
        mc__file_vram_register(e, b);
        return 0;
    }
    if (file_owned(b))
        mc__file_io_add_file(&file_of(e)->io, file_buf(b));
    return 0;
}

/* The buffer goes (or its registration failed): the file is closed. */
static void file_mem_deregister(mc_engine_t *e, mc_buffer_t *b)
{
    file_buf_t *f = file_buf(b);

    if (b->vram) { /* its IPC handle */
        free(b->tp[mc__file_slot]);
        b->tp[mc__file_slot] = NULL;
        return;
    }
    if (!file_owned(b) || !f)
        return;
    mc__file_io_remove_file(&file_of(e)->io, f);
    close(f->fd);
    if (f->fd_direct >= 0)
        close(f->fd_direct);
    free(f);
    b->tp[mc__file_slot] = NULL;
}

/* ---- peers and tasks ---- */

/* Every peer: a task to it with a file at either end is ours (the others refuse those), and one
 * with VRAM at an end that no transport before us took (rdma takes what GPUDirect registered):
 * last in every peer's order. */
static int file_peer_update(mc_engine_t *e, mc_peer_t *p)
{
    file_peer_t *fp = p->tp[mc__file_slot];

    (void)e;
    if (!fp) {
        fp = calloc(1, sizeof(*fp));
        if (!fp)
            return mc__set_error(-ENOMEM, "out of memory");
        fp->peer = p;
        mc_list_init(&fp->rel_link);
        p->tp[mc__file_slot] = fp;
    }
    p->rails[mc__file_slot].n = 0;
    return 5;
}

static void file_peer_close(mc_engine_t *e, mc_peer_t *p)
{
    mc__file_peer_gone(e, p);
    free(p->tp[mc__file_slot]);
    p->tp[mc__file_slot] = NULL;
}

static const char *file_accept(mc_engine_t *e, mc_task_t *t, const mc_desc_buffer_t *rb)
{
    if (!file_staged(t->lbuf) && !file_desc_staged(rb))
        return "neither end is a file or VRAM";
    if (t->lbuf->vram && !atomic_load(&file_of(e)->ready))
        return "no bounce chunks here to stage VRAM through (see the log)";
    return NULL;
}

/* A disk's piece, and no more than the owner of the far file stages at a time. */
static uint32_t file_slice_max(mc_engine_t *e, mc_peer_t *p)
{
    const file_desc_t *d = p->desc.tp[mc__file_slot];
    uint32_t max = file_of(e)->chunk;

    return d && p->desc.instance != e->instance && d->chunk < max ? d->chunk : max;
}

/* ---- progress ---- */

static void file_work(mc_engine_t *e)
{
    file_engine_t *fe = file_of(e);

    fe->kicked = false;
    mc__file_ops_kick(e);
    if (atomic_load(&fe->ready))
        mc__file_pool_kick(e);
}

/* Nothing registered here that stages (no file, no VRAM: no chunks, I/O or copies) and no op of
 * ours in flight or just ended: an engine that moves memory only pays one look per hook. */
static bool file_quiet(const file_engine_t *fe)
{
    return !fe->n_ops && !fe->kicked && mc_list_empty(&fe->rel_peers) &&
           !atomic_load_explicit(&fe->ready, memory_order_relaxed);
}

static void file_progress(mc_engine_t *e)
{
    if (file_quiet(file_of(e)))
        return;
    mc__reap_mark(e, mc__file_slot);
    mc__file_io_reap(e);
    mc__file_copy_reap(e, &file_of(e)->copy);
    file_work(e);
}

/* An express pass only while there is nothing to do here. */
static bool file_express(mc_engine_t *e)
{
    return file_quiet(file_of(e));
}

/* A device's copies signal nothing the loop can sleep on: it keeps polling while any is in
 * flight. */
static bool file_idle(mc_engine_t *e)
{
    return mc__file_copy_busy(&file_of(e)->copy);
}

static void file_timers(mc_engine_t *e, uint64_t now)
{
    mc__file_ops_timers(e, now);
    if (atomic_load(&file_of(e)->ready))
        mc__file_pool_timers(e, now);
}

/* End of the pass: what its callbacks left, then the I/O prepared during the pass goes to the
 * kernel in one call. What ended here may let more slices go: another pass. */
static void file_reap(mc_engine_t *e)
{
    file_engine_t *fe = file_of(e);

    if (fe->stopping || file_quiet(fe))
        return;
    file_work(e);
    mc__file_io_flush(e);
    if (fe->kicked)
        mc__doorbell(e);
}

/* ---- control requests ---- */

static int file_ctrl_recv(mc_engine_t *e, mc_link_t *l, const void *req, size_t len, void *ans,
                          size_t *ans_len)
{
    return mc__file_serve(e, l, req, len, ans, ans_len);
}

static void file_link_lost(mc_engine_t *e, mc_link_bound_t *b)
{
    if (b->kind == FB_OP)
        mc__file_op_lost(e, b);
    else
        mc__file_lend_lost(e, b);
}

const mc_transport_ops_t mc__file_ops = {
    .size = sizeof(mc_transport_ops_t),
    .name = "file",
    .slot = &mc__file_slot,
    .flags = MC_TP_LOCAL,
    .codec = &mc__file_codec,
    .settings = file_settings,
    .init = file_init,
    .stop = file_stop,
    .fini = file_fini,
    .encode = file_encode,
    .encode_buffer = file_encode_buffer,
    .mem_register = file_mem_register,
    .mem_deregister = file_mem_deregister,
    .peer_update = file_peer_update,
    .peer_close = file_peer_close,
    .accept = file_accept,
    .fill = mc__file_fill,
    .progress = file_progress,
    .timers = file_timers,
    .reap = file_reap,
    .ctrl_recv = file_ctrl_recv,
    .ctrl_reply = mc__file_ctrl_reply,
    .link_lost = file_link_lost,
    .key_pack = file_key_pack,
    .slice_max = file_slice_max,
    .idle = file_idle,
    .grant_answer = mc__file_grant_answer,
    .revoke = mc__file_revoke,
    .express = file_express,
    .reap_marked = true,
};
