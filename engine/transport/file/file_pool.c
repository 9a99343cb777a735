/* Bounce chunks, and the owner's side of peers' requests: a peer's READ of one of our file
 * ranges is read into a lend chunk and the chunk's address answered (the peer's child task then
 * reads it over whatever transport reaches us); a WRITE gets a chunk at once, the peer writes
 * into it, and COMMIT writes it to the file. Every request is checked against our file
 * registrations first. A chunk is lent to one peer engine, bound to the control link its STAGE
 * came on: when that link goes, the chunk rests in quarantine for MC_IO_TIMEOUT_MS (bytes of the
 * peer may still be on their way into it) before anyone else gets it. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../util/bytes.h"
#include "file_int.h"

/* ---- chunks ---- */

file_chunk_t *mc__file_chunk_get(mc_engine_t *e, bool lend)
{
    file_engine_t *fe = file_of(e);
    mc_list_t *n = mc_list_pop_front(lend ? &fe->free_lend : &fe->free_local);

    return n ? mc_container_of(n, file_chunk_t, link) : NULL;
}

/* Waiters are served from the progress hooks (mc__file_work), never from inside the caller. */
void mc__file_chunk_put(mc_engine_t *e, file_chunk_t *c)
{
    file_engine_t *fe = file_of(e);

    c->gen++;
    c->owner = NULL;
    mc_list_push_back(c->lend ? &fe->free_lend : &fe->free_local, &c->link);
    fe->kicked = true;
    mc__reap_mark(e, mc__file_slot);
}

static void chunk_quarantine(mc_engine_t *e, file_chunk_t *c)
{
    file_engine_t *fe = file_of(e);

    c->gen++;
    c->owner = NULL;
    c->free_at = mc__now_ns() + (uint64_t)e->cfg.io_timeout_ms * MC_MS;
    mc_list_push_back(&fe->quarantine, &c->link);
}

static uint32_t lend_id(const file_chunk_t *c)
{
    return (uint32_t)c->gen << 16 | c->index;
}

/* ---- lends ---- */

static file_lend_t *lend_alloc(file_engine_t *fe)
{
    file_lend_t *l = fe->lend_free;

    if (l)
        fe->lend_free = *(file_lend_t **)l;
    else
        l = malloc(sizeof(*l));
    if (l) {
        memset(l, 0, sizeof(*l));
        mc_list_init(&l->link);
        l->bound.kind = FB_LENT;
        l->later.bound.kind = FB_LATER;
    }
    return l;
}

/* Give back what l holds and l itself. */
static void lend_free(mc_engine_t *e, file_lend_t *l)
{
    file_engine_t *fe = file_of(e);

    if (l->chunk)
        mc__file_chunk_put(e, l->chunk);
    if (l->fb)
        mc__mem_put(e, l->fb);
    mc_list_del(&l->link);
    *(file_lend_t **)l = fe->lend_free;
    fe->lend_free = l;
}

/* The lend of id, lent to instance and in state; NULL if there is none (released, expired, its
 * link went, or not that peer's). */
static file_lend_t *lend_find(file_engine_t *fe, uint32_t id, uint64_t instance, int state)
{
    unsigned index = id & 0xffff;
    file_chunk_t *c = index < fe->n_chunks ? &fe->chunks[index] : NULL;

    if (!c || !c->lend || !c->owner || c->gen != id >> 16 || c->owner->instance != instance ||
        c->owner->state != state)
        return NULL;
    return c->owner;
}

/* l's chunk goes to the peer on link k: bound to it until released or committed. */
static void lend_hand_out(mc_engine_t *e, file_lend_t *l, mc_link_t *k, uint8_t *ans)
{
    file_engine_t *fe = file_of(e);

    l->state = LEND_LENT;
    l->since_ns = mc__now_ns();
    mc__link_bind(k, &l->bound, mc__file_slot);
    mc_list_push_back(&fe->lent, &l->link);
    mc__put64(ans, (uint64_t)(uintptr_t)l->chunk->mem);
    mc__put32(ans + 8, lend_id(l->chunk));
}

/* Answer a deferred request with an error and its reason. */
static void answer_error(mc_engine_t *e, file_lend_t *l, int err, const char *reason)
{
    mc__ctrl_answer(e, &l->later, err, reason, strlen(reason));
}

static void lend_read_done(mc_engine_t *e, file_io_t *io, int err)
{
    file_lend_t *l = mc_container_of(io, file_lend_t, io);
    mc_link_t *k = l->later.link;
    char reason[512];
    uint8_t ans[12];

    if (k && err) /* (before the put: it may let an unregister free the file it names) */
        mc__file_io_reason(io, err, reason, sizeof(reason));
    mc__mem_put(e, l->fb); /* its bytes are in the chunk now */
    l->fb = NULL;
    if (!k || err) {
        if (k)
            answer_error(e, l, err == -ENODATA ? -EIO : err, reason);
        lend_free(e, l);
        return;
    }
    mc__tp_count(e, mc__file_slot, MC_CNT_SERVED, l->len);
    lend_hand_out(e, l, k, ans);
    mc__ctrl_answer(e, &l->later, 0, ans, sizeof(ans));
}

static void lend_write_done(mc_engine_t *e, file_io_t *io, int err)
{
    file_lend_t *l = mc_container_of(io, file_lend_t, io);
    char reason[512];

    if (err) {
        mc__file_io_reason(io, err, reason, sizeof(reason));
        answer_error(e, l, err, reason);
    } else {
        mc__tp_count(e, mc__file_slot, MC_CNT_SERVED, l->len);
        mc__ctrl_answer(e, &l->later, 0, NULL, 0);
    }
    lend_free(e, l);
}

/* Move the bytes between l's chunk and the file (or VRAM). */
static void lend_io(mc_engine_t *e, file_lend_t *l, bool write)
{
    l->state = write ? LEND_WRITING : LEND_READING;
    mc__file_io_prep(&l->io, l->fb, l->addr, l->chunk->mem, l->len, write);
    l->io.cb = write ? lend_write_done : lend_read_done;
    mc__file_io_submit(e, &l->io);
}

/* l got its chunk: read into it, or hand it out for the peer to write into. */
static void lend_start(mc_engine_t *e, file_lend_t *l)
{
    uint8_t ans[12];

    l->chunk->owner = l;
    if (l->opcode == MC_READ) {
        lend_io(e, l, false);
        return;
    }
    mc_link_t *k = l->later.link;
    lend_hand_out(e, l, k, ans);
    mc__ctrl_answer(e, &l->later, 0, ans, sizeof(ans));
}

/* ---- requests ---- */

/* The buffer of ours a peer asks us to stage [addr, addr+n) of, referenced: a file, or VRAM. */
static mc_buffer_t *staged_get(mc_engine_t *e, uint64_t addr, uint32_t n)
{
    mc_buffer_t *b = mc__mem_get_owned(e, mc__file_slot, addr, n);

    if (!b && (b = mc__mem_get(e, addr, n)) && !b->vram) {
        mc__mem_put(e, b);
        b = NULL;
    }
    return b;
}

static int stage(mc_engine_t *e, mc_link_t *k, const uint8_t *req, size_t len, void *ans,
                 size_t *ans_len)
{
    file_engine_t *fe = file_of(e);
    uint8_t opcode = req[1];
    uint64_t addr = mc__get64(req + 8);
    uint32_t n = mc__get32(req + 16);
    mc_buffer_t *b;
    file_lend_t *l;

    if (len != FREQ_HDR || opcode > MC_WRITE || !n)
        return mc__set_error(-MC_EPROTO, "file: malformed stage request");
    if (!atomic_load(&fe->ready)) /* VRAM registered without chunks (its setup failed) */
        return mc__set_error(-MC_ENODEV, "file: %s has no bounce chunks to stage through", e->name);
    b = staged_get(e, addr, n);
    if (!b)
        return mc__set_error(-MC_EACCESS,
                             "range 0x%llx+%u is not inside a file or VRAM buffer of %s",
                             (unsigned long long)addr, n, e->name);
    if (n > fe->chunk) { /* it has a file or VRAM, so its chunks are set up */
        mc__mem_put(e, b);
        return mc__set_error(-EINVAL, "file: %s stages at most %u bytes at a time, not %u", e->name,
                             fe->chunk, n);
    }
    if (opcode == MC_WRITE && file_owned(b) && (file_buf(b)->flags & MC_FILE_READONLY)) {
        mc__mem_put(e, b);
        return mc__set_error(-MC_EACCESS, "file %s is registered read-only by %s",
                             file_buf(b)->path, e->name);
    }
    l = fe->stopping ? NULL : lend_alloc(fe);
    if (!l) {
        mc__mem_put(e, b);
        return mc__set_error(fe->stopping ? -MC_ECANCELED : -ENOMEM, "file: cannot stage now");
    }
    l->fb = b;
    l->instance = k->instance;
    l->addr = addr;
    l->len = n;
    l->opcode = opcode;
    l->chunk = mc__file_chunk_get(e, true);
    if (l->chunk && opcode == MC_WRITE) { /* answered at once */
        l->chunk->owner = l;
        lend_hand_out(e, l, k, ans);
        *ans_len = 12;
        return 0;
    }
    mc__ctrl_defer(k, mc__file_slot, &l->later);
    if (l->chunk) {
        l->chunk->owner = l;
        lend_io(e, l, false);
    } else {
        l->state = LEND_WAIT;
        mc_list_push_back(&fe->lend_wait, &l->link);
    }
    return MC_CTRL_LATER;
}

static int commit(mc_engine_t *e, mc_link_t *k, const uint8_t *req, size_t len)
{
    file_engine_t *fe = file_of(e);
    uint32_t id = mc__get32(req + 4), n = mc__get32(req + 16);
    uint64_t addr = mc__get64(req + 8);
    file_lend_t *l;

    if (len != FREQ_HDR)
        return mc__set_error(-MC_EPROTO, "file: malformed commit request");
    l = lend_find(fe, id, k->instance, LEND_LENT);
    if (!l) /* its link went (quarantine) or it expired: the peer stages it again */
        return mc__set_error(-EAGAIN, "file: %s has no chunk %08x lent to you any more", e->name,
                             id);
    if (l->opcode != MC_WRITE || l->addr != addr || l->len != n)
        return mc__set_error(-EINVAL, "file: chunk %08x was lent for another range", id);
    mc__link_unbind(&l->bound);
    mc_list_del(&l->link);
    mc__ctrl_defer(k, mc__file_slot, &l->later);
    lend_io(e, l, true);
    return MC_CTRL_LATER;
}

static int release(mc_engine_t *e, mc_link_t *k, const uint8_t *req, size_t len)
{
    file_engine_t *fe = file_of(e);
    unsigned count = mc__get16(req + 2);

    if (len != 8 + 4 * (size_t)count)
        return mc__set_error(-MC_EPROTO, "file: malformed release request");
    for (unsigned i = 0; i < count; i++) {
        uint32_t id = mc__get32(req + 8 + 4 * i);
        file_lend_t *l = lend_find(fe, id, k->instance, LEND_LENT);
        if (!l)
            continue; /* gone already */
        mc__link_unbind(&l->bound);
        lend_free(e, l);
    }
    return 0;
}

int mc__file_serve(mc_engine_t *e, mc_link_t *k, const uint8_t *req, size_t len, void *ans,
                   size_t *ans_len)
{
    if (len < 8)
        return mc__set_error(-MC_EPROTO, "file: request of %zu bytes", len);
    switch (req[0]) {
    case FREQ_STAGE:
        return stage(e, k, req, len, ans, ans_len);
    case FREQ_COMMIT:
        return commit(e, k, req, len);
    case FREQ_RELEASE:
        return release(e, k, req, len);
    }
    return mc__set_error(-MC_EPROTO, "file: unknown request %u", req[0]);
}

/* A link went with b bound to it: a lent chunk (quarantined: the peer may still be moving
 * bytes), or an answer we owe (nowhere to send it now). */
void mc__file_lend_lost(mc_engine_t *e, mc_link_bound_t *b)
{
    if (b->kind == FB_LENT) {
        file_lend_t *l = mc_container_of(b, file_lend_t, bound);
        chunk_quarantine(e, l->chunk);
        l->chunk = NULL;
        lend_free(e, l);
        return;
    }
    file_lend_t *l = mc_container_of(b, file_lend_t, later.bound);
    l->later.link = NULL;
    if (l->state == LEND_WAIT) /* no chunk yet: nothing else holds it */
        lend_free(e, l);
    /* reading or writing: its I/O ends it */
}

/* Lends that waited for a chunk get the free ones. */
void mc__file_pool_kick(mc_engine_t *e)
{
    file_engine_t *fe = file_of(e);

    while (!mc_list_empty(&fe->lend_wait) && !mc_list_empty(&fe->free_lend)) {
        file_lend_t *l = mc_container_of(mc_list_pop_front(&fe->lend_wait), file_lend_t, link);
        l->chunk = mc__file_chunk_get(e, true);
        lend_start(e, l);
    }
}

/* Quarantined chunks come back; chunks lent for longer than a transfer may take are taken
 * back (the peer stalled, or never released them). */
void mc__file_pool_timers(mc_engine_t *e, uint64_t now)
{
    file_engine_t *fe = file_of(e);
    uint64_t limit = ((uint64_t)e->cfg.transfer_timeout_ms + e->cfg.io_timeout_ms) * MC_MS;

    while (!mc_list_empty(&fe->quarantine)) {
        file_chunk_t *c = mc_container_of(fe->quarantine.next, file_chunk_t, link);
        if (now < c->free_at)
            break;
        mc_list_del(&c->link);
        mc__file_chunk_put(e, c);
    }
    while (!mc_list_empty(&fe->lent)) {
        file_lend_t *l = mc_container_of(fe->lent.next, file_lend_t, link);
        if (now - l->since_ns < limit)
            break;
        mc_warn("file: a chunk lent to engine %016llx for %llu ms is taken back",
                (unsigned long long)l->instance, (unsigned long long)((now - l->since_ns) / MC_MS));
        mc__link_unbind(&l->bound);
        mc__file_lend_lost(e, &l->bound);
    }
    mc__file_pool_kick(e);
}

/* Engine teardown (links are gone: every lend that owed an answer was told). */
void mc__file_pool_stop(mc_engine_t *e)
{
    file_engine_t *fe = file_of(e);

    while (!mc_list_empty(&fe->lend_wait))
        lend_free(e, mc_container_of(fe->lend_wait.next, file_lend_t, link));
    while (!mc_list_empty(&fe->lent)) {
        file_lend_t *l = mc_container_of(fe->lent.next, file_lend_t, link);
        mc__link_unbind(&l->bound);
        lend_free(e, l);
    }
}

void mc__file_pool_fini(mc_engine_t *e)
{
    file_engine_t *fe = file_of(e);

    while (fe->lend_free) {
        file_lend_t *l = fe->lend_free;
        fe->lend_free = *(file_lend_t **)l;
        free(l);
    }
    free(fe->chunks);
    fe->chunks = NULL;
}
