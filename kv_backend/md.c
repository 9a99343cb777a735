/*
 * Regions and agents: registration, public data, remote agents and their regions.
 *
 * A region's public data is the engine's buffer key plus the range: a peer adds the key to the
 * segment of the agent it came from, so the range is usable at once, without a metadata service
 * or a descriptor fetch. The owner still checks every access against its registrations.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "kv.h"

/* [u32 magic][u8 version][u8 type][u16 0][u64 addr][u64 len][u64 dev_id][u64 base][buffer key] */
#define KV_PUBLIC_HDR 40
#define KV_PUBLIC_LEN (KV_PUBLIC_HDR + MC_BUFFER_KEY_SIZE)

_Static_assert(KV_PUBLIC_LEN <= MC_KV_PUBLIC_MAX, "public data outgrew MC_KV_PUBLIC_MAX");

/* ---- handles ------------------------------------------------------------------------------ */

/* The instance keeps every handle it gave out, so that destroy frees those the host did not.
 * Only exclusive calls (register, load, their undoing, destroy) change the list. */
static void md_link(mc_kv_backend_t *b, mc_kv_md_t *md)
{
    md->prev = NULL;
    md->next = b->mds;
    if (md->next)
        md->next->prev = md;
    b->mds = md;
}

static void md_free(mc_kv_backend_t *b, mc_kv_md_t *md)
{
    if (md->prev)
        md->prev->next = md->next;
    else
        b->mds = md->next;
    if (md->next)
        md->next->prev = md->prev;
    free(md);
}

void kv__mds_free(mc_kv_backend_t *b)
{
    while (b->mds)
        md_free(b, b->mds);
}

/* ---- local regions ------------------------------------------------------------------------ */

static mc_kv_status_t region_location(mc_kv_backend_t *b, const mc_kv_region_t *r, char *loc,
                                      size_t room)
{
    mc_kv_caps_t caps;

    switch (r->type) {
    case MC_KV_DRAM:
        snprintf(loc, room, "*");
        return MC_KV_SUCCESS;
    case MC_KV_VRAM:
        kv__caps(b, &caps);
        if (!(caps.mem_types & (1u << MC_KV_VRAM)))
            return kv__fail(b, MC_KV_ERR_NOT_SUPPORTED,
                            "register_mem: VRAM needs a CUDA device, and this host has none");
        snprintf(loc, room, "cuda:%llu", (unsigned long long)r->dev_id);
        return MC_KV_SUCCESS;
    default:
        return kv__fail(b, MC_KV_ERR_NOT_SUPPORTED,
                        "register_mem: memory type %d is not supported (DRAM, VRAM and FILE are)",
                        (int)r->type);
    }
}

/* A FILE region (NIXL's FILE_SEG): dev_id is a file descriptor of the host's (a regular file or
 * a block device), addr the offset in the file where the region starts, len its length (0: to
 * the end of the file). The engine opens the file again through /proc/self/fd: a description of
 * its own, so that the host's file offset stays the host's. Its access follows the host's
 * descriptor: read-only, or read-write (a write-only one is refused: the engine reads the
 * file too), durable when the descriptor is O_DSYNC or O_SYNC. The region's bytes are then at
 * md->base in the engine's segment, where peers reach them as they do memory. */
static mc_kv_status_t register_file(mc_kv_backend_t *b, const mc_kv_region_t *r, mc_kv_md_t *md)
{
    mc_file_opts_t o = {.size = sizeof(o), .offset = r->addr, .length = r->len};
    mc_file_info_t info;
    struct stat st;
    char path[32];
    int fd = r->dev_id <= INT_MAX ? (int)r->dev_id : -1, fl = fd >= 0 ? fcntl(fd, F_GETFL) : -1, rc;

    if (fl < 0 || fstat(fd, &st))
        return kv__fail(b, MC_KV_ERR_INVALID_PARAM,
                        "register_mem: FILE region: dev_id %llu is not an open file descriptor",
                        (unsigned long long)r->dev_id);
    if (!S_ISREG(st.st_mode) && !S_ISBLK(st.st_mode)) /* (never opened again: a FIFO blocks) */
        return kv__fail(b, MC_KV_ERR_INVALID_PARAM,
                        "register_mem: FILE region: descriptor %d is a %s, not a regular file or "
                        "a block device",
                        fd,
                        S_ISDIR(st.st_mode)    ? "directory"
                        : S_ISFIFO(st.st_mode) ? "pipe"
                        : S_ISSOCK(st.st_mode) ? "socket"
                        : S_ISCHR(st.st_mode)  ? "character device"
                                               : "special file");
    if ((fl & O_ACCMODE) == O_WRONLY)
        return kv__fail(b, MC_KV_ERR_INVALID_PARAM,
                        "register_mem: FILE region: descriptor %d is write-only; the engine reads "
                        "the file too (open it O_RDWR, or O_RDONLY for a region peers only read)",
                        fd);
    if ((fl & O_ACCMODE) == O_RDONLY)
        o.flags |= MC_FILE_READONLY;
    if (fl & (O_DSYNC | O_SYNC))
        o.flags |= MC_FILE_DURABLE;
    snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
    if ((rc = mc_file_register(b->engine, path, &o, &md->base)) < 0)
        return kv__fail_engine(b, rc, "register_mem: FILE region");
    if ((rc = mc_file_info(b->engine, MC_SEGMENT_INVALID, md->base, &info)) < 0) {
        mc_file_unregister(b->engine, md->base);
        return kv__fail_engine(b, rc, "register_mem: FILE region");
    }
    md->addr = r->addr;
    md->len = info.length;
    return MC_KV_SUCCESS;
}

static mc_kv_status_t register_region(mc_kv_backend_t *b, const mc_kv_region_t *r, mc_kv_md_t *md)
{
    char loc[MC_LOCATION_MAX];
    mc_kv_status_t st;
    int rc;

    if (r->type == MC_KV_FILE)
        return register_file(b, r, md);
    if (!r->addr || !r->len)
        return kv__fail(b, MC_KV_ERR_INVALID_PARAM, "register_mem: an empty region");
    if ((st = region_location(b, r, loc, sizeof(loc))))
        return st;
    rc = mc_mem_register(b->engine, (void *)(uintptr_t)r->addr, r->len, loc);
    if (rc < 0)
        return kv__fail_engine(b, rc, "register_mem");
    md->addr = md->base = r->addr;
    md->len = r->len;
    return MC_KV_SUCCESS;
}

mc_kv_status_t kv__register_mem(mc_kv_backend_t *b, const mc_kv_region_t *r, mc_kv_md_t **md_p)
{
    mc_kv_md_t *md;
    mc_kv_status_t st;

    if (!r || !md_p)
        return kv__fail(b, MC_KV_ERR_INVALID_PARAM, "register_mem: NULL region or output");
    if (!(md = calloc(1, sizeof(*md))))
        return kv__fail(b, MC_KV_ERR_BACKEND, "register_mem: out of memory");
    if ((st = register_region(b, r, md))) {
        free(md);
        return st;
    }
    md->kind = KV_MD_LOCAL;
    md->type = r->type;
    md->dev_id = r->dev_id;
    md_link(b, md);
    *md_p = md;
    return MC_KV_SUCCESS;
}

mc_kv_status_t kv__deregister_mem(mc_kv_backend_t *b, mc_kv_md_t *md)
{
    unsigned users;
    int rc;

    if (!md || md->kind != KV_MD_LOCAL)
        return kv__fail(b, MC_KV_ERR_INVALID_PARAM, "deregister_mem: not a local region handle");
    if ((users = atomic_load(&md->users)))
        return kv__fail(b, MC_KV_ERR_NOT_ALLOWED,
                        "deregister_mem: region 0x%llx+%llu is used by %u prepared transfers or "
                        "loopback views; release or unload them first",
                        (unsigned long long)md->addr, (unsigned long long)md->len, users);
    rc = md->type == MC_KV_FILE
             ? mc_file_unregister(b->engine, md->base)
             : mc_mem_unregister_range(b->engine, (void *)(uintptr_t)md->addr, md->len);
    if (rc < 0)
        return kv__fail_engine(b, rc, "deregister_mem");
    md_free(b, md);
    return MC_KV_SUCCESS;
}

mc_kv_status_t kv__public_data(mc_kv_backend_t *b, mc_kv_md_t *md, void *buf, size_t *len_p)
{
    unsigned char data[KV_PUBLIC_LEN] = {0};
    uint32_t magic = KV_PUBLIC_MAGIC;
    int rc;

    if (!md || md->kind != KV_MD_LOCAL || !len_p)
        return kv__fail(b, MC_KV_ERR_INVALID_PARAM, "public_data: not a local region handle");
    if (!buf || *len_p < KV_PUBLIC_LEN) {
        *len_p = KV_PUBLIC_LEN;
        return kv__fail(b, MC_KV_ERR_INVALID_PARAM, "public_data: %d bytes needed", KV_PUBLIC_LEN);
    }
    memcpy(data, &magic, 4);
    data[4] = KV_WIRE_VERSION;
    data[5] = (unsigned char)md->type;
    memcpy(data + 8, &md->addr, 8);
    memcpy(data + 16, &md->len, 8);
    memcpy(data + 24, &md->dev_id, 8);
    memcpy(data + 32, &md->base, 8);
    /* the key of this registration, not of another that starts at the same address */
    rc = mc_buffer_key_pack_range(b->engine, (void *)(uintptr_t)md->base, md->len,
                                  data + KV_PUBLIC_HDR);
    if (rc < 0)
        return kv__fail_engine(b, rc, "public_data: the region's key");
    memcpy(buf, data, KV_PUBLIC_LEN);
    *len_p = KV_PUBLIC_LEN;
    return MC_KV_SUCCESS;
}

/* ---- agents ------------------------------------------------------------------------------- */

kv_agent_t *kv__agent_find(mc_kv_backend_t *b, const char *name)
{
    for (kv_agent_t *a = b->agents; a; a = a->next)
        if (!strcmp(a->name, name))
            return a;
    return NULL;
}

void kv__agents_free(mc_kv_backend_t *b)
{
    while (b->agents) {
        kv_agent_t *a = b->agents;

        b->agents = a->next;
        free(a);
    }
}

/* A name of 1 to max - 1 bytes with no NUL at p (len bytes), copied into out. */
static bool conn_name(const unsigned char *p, size_t len, size_t max, char *out)
{
    if (!len || len >= max || memchr(p, 0, len))
        return false;
    memcpy(out, p, len);
    out[len] = 0;
    return true;
}

/* Split connection info into the agent name, the engine address and its segment name. */
static mc_kv_status_t conn_info_parse(mc_kv_backend_t *b, const unsigned char *p, size_t len,
                                      char *name, const unsigned char **addr_p, size_t *addr_len_p,
                                      char *segment)
{
    size_t name_len, addr_len, seg_len;
    uint32_t magic;

    if (!p || len < 7 || (memcpy(&magic, p, 4), magic != KV_CONN_MAGIC))
        return kv__fail(b, MC_KV_ERR_INVALID_PARAM,
                        "connection info: %zu bytes that are not a Mooncake agent's", len);
    if (p[4] != KV_CONN_VERSION)
        return kv__fail(b, MC_KV_ERR_MISMATCH,
                        "connection info of version %u, this plugin reads %u", p[4],
                        KV_CONN_VERSION);
    name_len = p[5];
    addr_len = 6 + name_len < len ? p[6 + name_len] : 0;
    seg_len = 7 + name_len + addr_len < len ? p[7 + name_len + addr_len] : 0;
    if (8 + name_len + addr_len + seg_len != len)
        return kv__fail(b, MC_KV_ERR_INVALID_PARAM, "connection info: truncated (%zu bytes)", len);
    if (!conn_name(p + 6, name_len, MC_KV_AGENT_MAX, name))
        return kv__fail(b, MC_KV_ERR_INVALID_PARAM,
                        "connection info: an agent name of %zu bytes (1 to %d, no NUL)", name_len,
                        MC_KV_AGENT_MAX - 1);
    if (!conn_name(p + 8 + name_len + addr_len, seg_len, MC_NAME_MAX, segment))
        return kv__fail(b, MC_KV_ERR_INVALID_PARAM,
                        "connection info: a segment name of %zu bytes (1 to %d, no NUL)", seg_len,
                        MC_NAME_MAX - 1);
    *addr_len_p = addr_len;
    *addr_p = p + 7 + name_len;
    return MC_KV_SUCCESS;
}

static mc_kv_status_t agent_add(mc_kv_backend_t *b, const char *name, const void *info, size_t len,
                                const unsigned char *addr, size_t addr_len, const char *segment)
{
    kv_agent_t *a = calloc(1, sizeof(*a));
    int rc;

    if (!a)
        return kv__fail(b, MC_KV_ERR_BACKEND, "load_remote_conn_info: out of memory");
    snprintf(a->name, sizeof(a->name), "%s", name);
    snprintf(a->segment, sizeof(a->segment), "%s", segment);
    memcpy(a->info, info, len);
    a->info_len = len;
    if ((rc = mc_segment_open_address(b->engine, addr, addr_len, &a->seg)) < 0) {
        free(a);
        return kv__fail_input(b, rc, "load_remote_conn_info: the agent's address");
    }
    a->next = b->agents;
    b->agents = a;
    return MC_KV_SUCCESS;
}

mc_kv_status_t kv__load_remote_conn_info(mc_kv_backend_t *b, const char *agent, const void *info,
                                         size_t len)
{
    char name[MC_KV_AGENT_MAX], segment[MC_NAME_MAX];
    const unsigned char *addr = NULL;
    size_t addr_len = 0;
    mc_kv_status_t st;
    kv_agent_t *a;

    if (!agent || strlen(agent) >= MC_KV_AGENT_MAX || len > MC_KV_CONN_MAX)
        return kv__fail(b, MC_KV_ERR_INVALID_PARAM, "load_remote_conn_info: %s",
                        !agent                 ? "NULL agent"
                        : len > MC_KV_CONN_MAX ? "info longer than MC_KV_CONN_MAX"
                                               : "an agent name has at most 127 characters");
    if ((st = conn_info_parse(b, info, len, name, &addr, &addr_len, segment)))
        return st;
    if (strcmp(name, agent))
        return kv__fail(b, MC_KV_ERR_MISMATCH,
                        "load_remote_conn_info: the info is agent '%s''s, not '%s''s", name, agent);
    pthread_rwlock_wrlock(&b->agents_lock);
    a = kv__agent_find(b, agent);
    if (a && (a->info_len != len || memcmp(a->info, info, len)))
        st = kv__fail(b, MC_KV_ERR_NOT_ALLOWED,
                      "load_remote_conn_info: agent '%s' is loaded with other connection info "
                      "(a restarted process?): disconnect it first",
                      agent);
    else if (!a)
        st = agent_add(b, agent, info, len, addr, addr_len, segment);
    pthread_rwlock_unlock(&b->agents_lock);
    return st;
}

static void sleep_ms(unsigned ms)
{
    nanosleep(&(struct timespec){.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L}, NULL);
}

mc_kv_status_t kv__connect(mc_kv_backend_t *b, const char *agent)
{
    mc_segment_id_t seg;
    kv_agent_t *a;
    int state = MC_SEGMENT_OPENING;

    pthread_rwlock_rdlock(&b->agents_lock);
    a = agent ? kv__agent_find(b, agent) : NULL;
    seg = a ? a->seg : MC_SEGMENT_INVALID;
    pthread_rwlock_unlock(&b->agents_lock);
    if (!a)
        return kv__fail(b, MC_KV_ERR_NOT_FOUND, "connect: agent '%s' is not loaded",
                        agent ? agent : "(null)");
    /* The engine opens the segment (its thread, or the passes run here without one); its
     * connect timeout bounds the wait. */
    for (unsigned ms = 0; ms <= b->connect_timeout_ms + 1000; ms++) {
        if ((state = mc_segment_state(b->engine, seg)) != MC_SEGMENT_OPENING)
            break;
        mc_engine_progress(b->engine); /* (MC_PROGRESS_THREAD=0; with the thread: nothing) */
        sleep_ms(1);
    }
    if (state == MC_SEGMENT_READY)
        return MC_KV_SUCCESS;
    return kv__fail(b, MC_KV_ERR_REMOTE_DISCONNECT, "connect: agent '%s' %s", agent,
                    state == MC_SEGMENT_OPENING ? "did not answer in time"
                                                : "cannot be reached (its process is gone?)");
}

/* A flush of an agent, shared by its callback and the disconnect that may stop waiting. */
typedef struct agent_flush {
    atomic_int refs;
    atomic_bool done;
} agent_flush_t;

static void flush_put(agent_flush_t *f)
{
    if (atomic_fetch_sub(&f->refs, 1) == 1)
        free(f);
}

static void flushed(void *arg, int status)
{
    agent_flush_t *f = arg;

    (void)status; /* delivered, or the peer is gone: either way nothing is left to wait for */
    atomic_store(&f->done, true);
    flush_put(f);
}

/* What the host sent the agent before (notifications of gen_notif and of posts that ended)
 * reaches it before its segment closes: a close cancels the messages the agent has not taken
 * yet (a notification has no callback to say so). Waits up to the transfer timeout (an agent
 * whose host does not pop its notifications holds them back); false if they were not taken by
 * then. */
static bool flush_agent(mc_kv_backend_t *b, mc_segment_id_t seg)
{
    agent_flush_t *f = calloc(1, sizeof(*f));
    bool done = true;

    if (!f)
        return true; /* (nothing to wait with: closed as before) */
    atomic_init(&f->refs, 2);
    if (mc_peer_flush(b->engine, seg, flushed, f) < 0) { /* dead already */
        free(f);
        return true;
    }
    for (unsigned ms = 0; !(done = atomic_load(&f->done)) && ms < 1000 * b->transfer_timeout_s;
         ms++) {
        mc_engine_progress(b->engine); /* (MC_PROGRESS_THREAD=0; with the thread: nothing) */
        sleep_ms(1);
    }
    flush_put(f);
    return done;
}

/* Close an agent's segment. The regions of every transfer to it are unloaded, so its tasks
 * still in flight are those of released transfers: canceled, and let go of by the engine as
 * soon as their bytes on the wire settle (a dead peer's at once). Wait for that, bounded. */
static int segment_close(mc_kv_backend_t *b, mc_segment_id_t seg)
{
    int rc;

    for (unsigned ms = 0; (rc = mc_segment_close(b->engine, seg)) == -EBUSY; ms++) {
        if (ms >= b->connect_timeout_ms)
            break;
        mc_engine_progress(b->engine);
        sleep_ms(1);
    }
    return rc;
}

mc_kv_status_t kv__disconnect(mc_kv_backend_t *b, const char *agent)
{
    mc_kv_status_t st = MC_KV_SUCCESS;
    kv_agent_t **pp, *a;
    int rc;

    /* What was sent to the agent reaches it first, before the lock every transfer takes: the
     * wait is the agent's (disconnect is an exclusive call: the agent stays meanwhile). */
    pthread_rwlock_rdlock(&b->agents_lock);
    a = agent ? kv__agent_find(b, agent) : NULL;
    bool flush = a && !a->mds && !atomic_load(&a->xfers); /* (else refused below) */
    mc_segment_id_t seg = a ? a->seg : MC_SEGMENT_INVALID;
    pthread_rwlock_unlock(&b->agents_lock);
    if (flush && !flush_agent(b, seg))
        return kv__fail(b, MC_KV_ERR_BACKEND,
                        "disconnect: agent '%s' did not take what was sent to it within %u s "
                        "(its host does not pop notifications?); try again",
                        agent, b->transfer_timeout_s);
    pthread_rwlock_wrlock(&b->agents_lock);
    for (pp = &b->agents; *pp && strcmp((*pp)->name, agent ? agent : ""); pp = &(*pp)->next)
        ;
    if (!(a = *pp))
        st = kv__fail(b, MC_KV_ERR_NOT_FOUND, "disconnect: agent '%s' is not loaded",
                      agent ? agent : "(null)");
    else if (a->mds)
        st = kv__fail(b, MC_KV_ERR_NOT_ALLOWED,
                      "disconnect: %u regions of agent '%s' are loaded; unload them first", a->mds,
                      agent);
    else if (atomic_load(&a->xfers))
        st = kv__fail(b, MC_KV_ERR_NOT_ALLOWED,
                      "disconnect: %u transfers to agent '%s' are prepared; release them first",
                      atomic_load(&a->xfers), agent);
    else if ((rc = segment_close(b, a->seg)) < 0)
        st = kv__fail_engine(b, rc, "disconnect");
    else {
        *pp = a->next;
        free(a);
    }
    pthread_rwlock_unlock(&b->agents_lock);
    return st;
}

/* ---- remote regions ----------------------------------------------------------------------- */

static mc_kv_status_t public_parse(mc_kv_backend_t *b, const unsigned char *p, size_t len,
                                   mc_kv_md_t *md)
{
    uint32_t magic;

    if (!p || len < 8 || (memcpy(&magic, p, 4), magic != KV_PUBLIC_MAGIC))
        return kv__fail(b, MC_KV_ERR_INVALID_PARAM,
                        "load_remote_md: %zu bytes that are not a Mooncake region's public data",
                        len);
    if (p[4] != KV_WIRE_VERSION)
        return kv__fail(b, MC_KV_ERR_MISMATCH,
                        "load_remote_md: public data of version %u; this plugin reads version %u "
                        "(the peer's plugin is another release)",
                        p[4], KV_WIRE_VERSION);
    if (len != KV_PUBLIC_LEN)
        return kv__fail(b, MC_KV_ERR_INVALID_PARAM,
                        "load_remote_md: %zu bytes that are not a Mooncake region's public data",
                        len);
    md->kind = KV_MD_REMOTE;
    md->type = (mc_kv_mem_type_t)p[5];
    memcpy(&md->addr, p + 8, 8);
    memcpy(&md->len, p + 16, 8);
    memcpy(&md->dev_id, p + 24, 8);
    memcpy(&md->base, p + 32, 8);
    return MC_KV_SUCCESS;
}

static mc_kv_status_t remote_md_add(mc_kv_backend_t *b, kv_agent_t *a, const unsigned char *data,
                                    mc_kv_md_t *tmpl, mc_kv_md_t **md_p)
{
    mc_kv_md_t *md;
    int rc = mc_segment_add_buffer(b->engine, a->seg, data + KV_PUBLIC_HDR, MC_BUFFER_KEY_SIZE);

    if (rc == -MC_ENOSEGMENT)
        return kv__fail(b, MC_KV_ERR_MISMATCH,
                        "load_remote_md: the public data is of another instance than agent '%s'",
                        a->name);
    if (rc < 0)
        return kv__fail_input(b, rc, "load_remote_md");
    if (!(md = malloc(sizeof(*md))))
        return kv__fail(b, MC_KV_ERR_BACKEND, "load_remote_md: out of memory");
    *md = *tmpl;
    memcpy(md->key, data + KV_PUBLIC_HDR, MC_BUFFER_KEY_SIZE);
    md->agent = a;
    a->mds++;
    md_link(b, md);
    *md_p = md;
    return MC_KV_SUCCESS;
}

mc_kv_status_t kv__load_remote_md(mc_kv_backend_t *b, const char *agent, const void *data,
                                  size_t len, mc_kv_md_t **md_p)
{
    mc_kv_md_t tmpl = {0};
    mc_kv_status_t st;
    kv_agent_t *a;

    if (!md_p || !agent)
        return kv__fail(b, MC_KV_ERR_INVALID_PARAM, "load_remote_md: NULL agent or output");
    if ((st = public_parse(b, data, len, &tmpl)))
        return st;
    pthread_rwlock_wrlock(&b->agents_lock);
    if (!(a = kv__agent_find(b, agent)))
        st = kv__fail(b, MC_KV_ERR_NOT_FOUND,
                      "load_remote_md: agent '%s' is not loaded (load its connection info first)",
                      agent);
    else
        st = remote_md_add(b, a, data, &tmpl, md_p);
    pthread_rwlock_unlock(&b->agents_lock);
    return st;
}

/* The loopback view: the instance is an agent of its own, reached through its own address. */
mc_kv_status_t kv__load_local_md(mc_kv_backend_t *b, mc_kv_md_t *local, mc_kv_md_t **md_p)
{
    unsigned char info[MC_KV_CONN_MAX], data[KV_PUBLIC_LEN];
    size_t info_len = sizeof(info), data_len = sizeof(data);
    mc_kv_status_t st;

    if (!local || local->kind != KV_MD_LOCAL || !md_p)
        return kv__fail(b, MC_KV_ERR_INVALID_PARAM, "load_local_md: not a local region handle");
    if ((st = kv__conn_info(b, info, &info_len)) ||
        (st = kv__load_remote_conn_info(b, b->agent, info, info_len)) ||
        (st = kv__public_data(b, local, data, &data_len)) ||
        (st = kv__load_remote_md(b, b->agent, data, data_len, md_p)))
        return st;
    (*md_p)->local = local;
    atomic_fetch_add(&local->users, 1);
    return MC_KV_SUCCESS;
}

mc_kv_status_t kv__unload_md(mc_kv_backend_t *b, mc_kv_md_t *md)
{
    unsigned users;

    if (!md || md->kind != KV_MD_REMOTE)
        return kv__fail(b, MC_KV_ERR_INVALID_PARAM, "unload_md: not a remote region handle");
    if ((users = atomic_load(&md->users)))
        return kv__fail(b, MC_KV_ERR_NOT_ALLOWED,
                        "unload_md: %u prepared transfers use it; release them first", users);
    pthread_rwlock_wrlock(&b->agents_lock);
    md->agent->mds--;
    pthread_rwlock_unlock(&b->agents_lock);
    if (md->local)
        atomic_fetch_sub(&md->local->users, 1);
    md_free(b, md);
    return MC_KV_SUCCESS;
}
