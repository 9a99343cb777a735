/* The memory domain: one engine, its registrations as memory handles, its buffer keys as packed
 * remote keys, and UCX_MOONCAKE_* settings mapped onto the engine's. */
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sys/mman.h>
#include <ucm/api/ucm.h>
#include <ucs/sys/sys.h>

#include "uct_mc.h"

ucs_config_field_t uct_mc_md_config_table[] = {
    {"", "", NULL, ucs_offsetof(uct_mc_md_config_t, super),
     UCS_CONFIG_TYPE_TABLE(uct_md_config_table)},
    {"DEVICES", "", "NICs the engine uses, comma-separated (MC_DEVICES); empty: all",
     ucs_offsetof(uct_mc_md_config_t, devices), UCS_CONFIG_TYPE_STRING},
    {"SLICE_SIZE", "", "bytes per slice across rails (MC_SLICE_SIZE); empty: the engine's",
     ucs_offsetof(uct_mc_md_config_t, slice_size), UCS_CONFIG_TYPE_STRING},
    {"METADATA", "none",
     "where the engine publishes its segment: none (UCX carries the addresses), file://DIR or "
     "etcd://HOST:PORT (MC_METADATA)",
     ucs_offsetof(uct_mc_md_config_t, metadata), UCS_CONFIG_TYPE_STRING},
    {"AUTH_TOKEN", "", "shared secret both sides must have (MC_AUTH_TOKEN); empty: the engine's",
     ucs_offsetof(uct_mc_md_config_t, auth_token), UCS_CONFIG_TYPE_STRING},
    {"LISTEN", "", "address:port the engine listens on (MC_LISTEN); empty: the engine's",
     ucs_offsetof(uct_mc_md_config_t, listen), UCS_CONFIG_TYPE_STRING},
    {"PROTOCOL", "", "auto, or one engine transport for every peer (MC_PROTOCOL)",
     ucs_offsetof(uct_mc_md_config_t, protocol), UCS_CONFIG_TYPE_STRING},
    {"ENGINE", "", "any other engine settings, NAME=VALUE;NAME=VALUE (names as MC_* without MC_)",
     ucs_offsetof(uct_mc_md_config_t, engine), UCS_CONFIG_TYPE_STRING},
    {"RCACHE", "yes",
     "keep registrations in UCX's registration cache (released when the memory is unmapped): "
     "UCP registers every rendezvous buffer",
     ucs_offsetof(uct_mc_md_config_t, rcache_enable), UCS_CONFIG_TYPE_BOOL},
    {"", "", NULL, ucs_offsetof(uct_mc_md_config_t, rcache),
     UCS_CONFIG_TYPE_TABLE(uct_md_config_rcache_table)},
    {NULL, NULL, NULL, 0, {NULL, NULL, NULL, NULL, NULL, NULL}}};

ucs_status_t uct_mc_status(int rc)
{
    switch (rc) {
    case 0:
        return UCS_OK;
    case -EAGAIN:
        return UCS_ERR_NO_RESOURCE;
    case -ENOMEM:
        return UCS_ERR_NO_MEMORY;
    case -EINVAL:
    case -MC_EPROTO:
    case -MC_ECONFIG:
        return UCS_ERR_INVALID_PARAM;
    case -ENOENT:
        return UCS_ERR_NO_ELEM;
    case -MC_EACCESS:
        return UCS_ERR_INVALID_ADDR;
    case -MC_EPEERDEAD:
        return UCS_ERR_CONNECTION_RESET;
    case -MC_ETIMEOUT:
        return UCS_ERR_ENDPOINT_TIMEOUT;
    case -MC_ECANCELED:
        return UCS_ERR_CANCELED;
    case -MC_EAUTH:
        return UCS_ERR_REJECTED;
    case -MC_ENOSEGMENT:
        return UCS_ERR_UNREACHABLE;
    default:
        return UCS_ERR_IO_ERROR;
    }
}

/* ---- settings ---- */

/* Whether the environment sets name (the engine takes an empty value as unset). */
static bool env_set(const char *name)
{
    const char *v = getenv(name);

    return v && *v;
}

static int set_one(mc_config_t *c, const char *name, const char *value)
{
    int rc;

    if (!value || !*value)
        return 0;
    rc = mc_config_set(c, name, value);
    if (rc)
        ucs_error("mooncake: UCX_MOONCAKE_%s=%s: %s", name, value, mc_last_error());
    return rc;
}

/* "NAME=VALUE;NAME=VALUE" */
static int set_list(mc_config_t *c, const char *list)
{
    char *copy = strdup(list), *save = NULL;
    int rc = 0;

    if (!copy)
        return -ENOMEM;
    for (char *kv = strtok_r(copy, ";", &save); kv && !rc; kv = strtok_r(NULL, ";", &save)) {
        char *eq = strchr(kv, '=');
        if (!eq) {
            ucs_error("mooncake: UCX_MOONCAKE_ENGINE: '%s' is not NAME=VALUE", kv);
            rc = -EINVAL;
            break;
        }
        *eq = 0;
        rc = mc_config_set(c, kv, eq + 1);
        if (rc)
            ucs_error("mooncake: UCX_MOONCAKE_ENGINE: %s", mc_last_error());
    }
    free(copy);
    return rc;
}

static int engine_config(const uct_mc_md_config_t *cfg, mc_config_t **c_p)
{
    mc_config_t *c;
    int rc = mc_config_create(&c);

    if (rc) {
        ucs_error("mooncake: %s", mc_last_error());
        return rc;
    }
    /* peers of a UCX application come and go: the engine's warnings about it are noise there,
     * unless MC_LOG_LEVEL (or LOG_LEVEL in UCX_MOONCAKE_ENGINE) asks for them */
    if (!env_set("MC_LOG_LEVEL") && (rc = mc_config_set(c, "LOG_LEVEL", "error"))) {
        mc_config_destroy(c);
        return rc;
    }
    if ((rc = set_one(c, "DEVICES", cfg->devices)) ||
        (rc = set_one(c, "SLICE_SIZE", cfg->slice_size)) ||
        (rc = set_one(c, "METADATA", cfg->metadata)) ||
        (rc = set_one(c, "AUTH_TOKEN", cfg->auth_token)) ||
        (rc = set_one(c, "LISTEN", cfg->listen)) || (rc = set_one(c, "PROTOCOL", cfg->protocol)) ||
        /* a peer's get or put needs this side's engine, whether or not the application is
         * in a UCX call: a thread serves it once progress was not driven for 100 us */
        (rc = mc_config_set(c, "PROGRESS_SERVE_US", "100")) ||
        /* what UCT took (an am_bcopy returned) is sent, as a socket's bytes are after a close:
         * closing the domain waits up to 1 s for peers to take it */
        (!env_set("MC_LINGER_MS") && (rc = mc_config_set(c, "LINGER_MS", "1000"))) ||
        /* a flush means the peer's UCP has the active messages, not its engine: a close after
         * it disconnects UCP's connection manager, and the peer's UCP then drops what its
         * worker did not take yet (a serving thread took them while the application was away) */
        (!env_set("MC_MSG_ACK_AFTER_HANDLER") &&
         (rc = mc_config_set(c, "MSG_ACK_AFTER_HANDLER", "1"))) ||
        (rc = set_list(c, cfg->engine)) ||
        /* UCT's rule: callbacks only from uct_iface_progress, so the caller drives I/O */
        (rc = mc_config_set(c, "PROGRESS_THREAD", "0")) ||
        (rc = mc_config_set(c, "PROGRESS_IMPLICIT", "0"))) {
        mc_config_destroy(c);
        return rc;
    }
    *c_p = c;
    return 0;
}

/* ---- registrations, and their cache ---- */

/* One engine registration; zero-length buffers need none (the engine refuses them). */
static int engine_reg(uct_mc_md_t *md, uct_mc_memh_t *memh, void *address, size_t length)
{
    memh->addr = address;
    memh->len = length;
    return length ? mc_mem_register(md->engine, address, length, "*") : 0;
}

static int engine_dereg(uct_mc_md_t *md, uct_mc_memh_t *memh)
{
    int rc = 0;

    if (!memh->len)
        return 0;
    /* the cache may hold a region that starts where this one does: drop this one */
    pthread_rwlock_rdlock(&md->engine_lock);
    if (md->engine)
        rc = mc_mem_unregister_range(md->engine, memh->addr, memh->len);
    pthread_rwlock_unlock(&md->engine_lock);
    if (rc)
        ucs_error("mooncake: unregistering %p: %s", memh->addr, mc_last_error());
    return rc;
}

static ucs_status_t rcache_mem_reg(void *context, ucs_rcache_t *rcache, void *arg,
                                   ucs_rcache_region_t *region, uint16_t flags)
{
    uct_mc_memh_t *memh = ucs_container_of(region, uct_mc_memh_t, region);
    void *start = (void *)region->super.start;
    size_t len = region->super.end - region->super.start;
    int rc = engine_reg(context, memh, start, len);

    memh->cached = true;
    (void)rcache;
    (void)arg;
    if (rc && !(flags & UCS_RCACHE_MEM_REG_HIDE_ERRORS))
        ucs_error("mooncake: registering %p+%zu: %s", start, len, mc_last_error());
    return uct_mc_status(rc);
}

/* The outcome of the last region the cache unregistered on this thread: the cache calls a
 * region's invalidation callbacks right after its mem_dereg, on the same thread. */
static __thread int last_dereg_rc;

static void rcache_mem_dereg(void *context, ucs_rcache_t *rcache, ucs_rcache_region_t *region)
{
    (void)rcache;
    last_dereg_rc = engine_dereg(context, ucs_container_of(region, uct_mc_memh_t, region));
}

static void rcache_dump_region(void *context, ucs_rcache_t *rcache, ucs_rcache_region_t *region,
                               char *buf, size_t max)
{
    uct_mc_memh_t *memh = ucs_container_of(region, uct_mc_memh_t, region);

    (void)context;
    (void)rcache;
    snprintf(buf, max, "engine buffer %p+%zu", memh->addr, memh->len);
}

static const ucs_rcache_ops_t rcache_ops = {
    .mem_reg = rcache_mem_reg,
    .mem_dereg = rcache_mem_dereg,
    .dump_region = rcache_dump_region,
};

static ucs_status_t rcache_create(uct_mc_md_t *md, const uct_md_rcache_config_t *cfg)
{
    ucs_rcache_params_t p;

    memset(&p, 0, sizeof(p));
    uct_md_set_rcache_params(&p, cfg);
    p.region_struct_size = sizeof(uct_mc_memh_t);
    p.max_alignment = ucs_get_page_size();
    p.ucm_events = UCM_EVENT_VM_UNMAPPED;
    p.context = md;
    p.ops = &rcache_ops;
    return ucs_rcache_create(&p, UCT_MC_NAME, NULL, &md->rcache);
}

/* ---- the memory domain ---- */

void uct_mc_md_close(uct_md_h tl_md)
{
    uct_mc_md_t *md = ucs_derived_of(tl_md, uct_mc_md_t);
    unsigned long held = atomic_load(&md->memhs);

    if (md->rcache && !held) { /* first: its cleanups unregister from the engine */
        ucs_rcache_destroy(md->rcache);
        md->rcache = NULL;
    }
    /* the cache may still release a region (UCX's thread, on an unmap) while this goes */
    pthread_rwlock_wrlock(&md->engine_lock);
    mc_engine_destroy(md->engine); /* unregisters whatever is left */
    md->engine = NULL;
    pthread_rwlock_unlock(&md->engine_lock);
    if (md->rcache) {
        /* the cache asserts on regions in use: it stays (with the md it calls back), inert */
        ucs_warn("mooncake: %lu memory registrations not released before the memory domain "
                 "closed",
                 held);
        return;
    }
    free(md->segs_to_close); /* the engine closed them */
    pthread_mutex_destroy(&md->segs_lock);
    pthread_rwlock_destroy(&md->engine_lock);
    pthread_mutex_destroy(&md->lock);
    free(md);
}

ucs_status_t uct_mc_md_open(uct_component_t *component, const char *md_name,
                            const uct_md_config_t *config, uct_md_h *md_p)
{
    const uct_mc_md_config_t *cfg = ucs_derived_of(config, uct_mc_md_config_t);
    mc_config_t *c;
    uct_mc_md_t *md;
    int rc;

    (void)md_name;
    md = calloc(1, sizeof(*md));
    if (!md)
        return UCS_ERR_NO_MEMORY;
    pthread_mutex_init(&md->lock, NULL);
    pthread_mutex_init(&md->segs_lock, NULL);
    pthread_rwlock_init(&md->engine_lock, NULL);
    rc = engine_config(cfg, &c);
    if (rc)
        goto err_free;
    rc = mc_engine_create(c, &md->engine);
    mc_config_destroy(c);
    if (rc) {
        ucs_error("mooncake: the engine did not start: %s", mc_last_error());
        goto err_free;
    }
    if (cfg->rcache_enable && rcache_create(md, &cfg->rcache) != UCS_OK)
        ucs_diag("mooncake: no registration cache: every registration goes to the engine");
    mc_msg_handler_set(md->engine, MC_UCT_MSG_ID, uct_mc_md_on_msg, md);
    mc_peer_handler_set(md->engine, uct_mc_md_on_peer, md);
    md->super.ops = &uct_mc_md_ops;
    md->super.component = component;
    *md_p = &md->super;
    return UCS_OK;

err_free:
    pthread_rwlock_destroy(&md->engine_lock);
    pthread_mutex_destroy(&md->segs_lock);
    pthread_mutex_destroy(&md->lock);
    free(md);
    return uct_mc_status(rc);
}

int uct_mc_md_add_iface(uct_mc_md_t *md, uct_mc_iface_t *iface)
{
    int id = -1;

    pthread_mutex_lock(&md->lock);
    for (int i = 0; i < UCT_MC_MAX_IFACES; i++)
        if (!md->ifaces[i]) {
            md->ifaces[i] = iface;
            id = i;
            break;
        }
    pthread_mutex_unlock(&md->lock);
    return id;
}

void uct_mc_md_remove_iface(uct_mc_md_t *md, uct_mc_iface_t *iface)
{
    pthread_mutex_lock(&md->lock);
    md->ifaces[iface->id] = NULL;
    if (md->driver == iface)
        md->driver = NULL;
    if (md->handed == iface)
        md->handed = NULL;
    uct_mc_iface_wake_sleepers(md); /* they look again: one of them drives if it drove */
    pthread_mutex_unlock(&md->lock);
}

/* ---- segments of freed endpoints ---- */

/* Caller holds md->segs_lock. */
static void segs_push(uct_mc_md_t *md, mc_segment_id_t seg)
{
    if (md->n_segs_to_close == md->cap_segs_to_close) {
        size_t cap = md->cap_segs_to_close ? 2 * md->cap_segs_to_close : 16;
        mc_segment_id_t *a = realloc(md->segs_to_close, cap * sizeof(*a));
        if (!a) {
            ucs_error("mooncake: no memory to close segment %u later: it stays open", seg);
            return;
        }
        md->segs_to_close = a;
        md->cap_segs_to_close = cap;
    }
    md->segs_to_close[md->n_segs_to_close++] = seg;
}

static void close_later(uct_mc_md_t *md, mc_segment_id_t seg)
{
    pthread_mutex_lock(&md->segs_lock);
    segs_push(md, seg);
    pthread_mutex_unlock(&md->segs_lock);
    atomic_store(&md->segs_retry, true);
}

typedef struct seg_flush {
    uct_mc_md_t *md;
    mc_segment_id_t seg;
} seg_flush_t;

static void flushed(void *arg, int status)
{
    seg_flush_t *f = arg;

    (void)status; /* taken, or never will be (the peer died, the engine goes) */
    close_later(f->md, f->seg);
    free(f);
}

/* Closed once what was sent to it was taken (an endpoint destroyed right after its last
 * am_bcopy, which UCT counts as sent: closing the segment at once would drop the message),
 * by the next progress of any interface, outside engine callbacks (where closing is refused).
 * The domain's close waits for the flushes up to MC_LINGER_MS. */
void uct_mc_md_defer_close(uct_mc_md_t *md, mc_segment_id_t seg)
{
    seg_flush_t *f = malloc(sizeof(*f));

    if (f) {
        *f = (seg_flush_t){md, seg};
        if (!mc_peer_flush(md->engine, seg, flushed, f))
            return;
        free(f); /* dead: nothing to wait for */
    }
    close_later(md, seg);
}

/* A segment the engine still has tasks to (-EBUSY: tasks an interface left to it as it closed,
 * drain_batches) stays on the list: the callback that lets go of such a task asks for another
 * try. No lock is held across mc_segment_close, which waits for a pass of the engine, whose
 * callbacks take interface locks. */
void uct_mc_md_close_segments(uct_mc_md_t *md)
{
    mc_segment_id_t *segs;
    size_t n;

    atomic_store(&md->segs_retry, false);
    pthread_mutex_lock(&md->segs_lock);
    segs = md->segs_to_close;
    n = md->n_segs_to_close;
    md->segs_to_close = NULL;
    md->n_segs_to_close = md->cap_segs_to_close = 0;
    pthread_mutex_unlock(&md->segs_lock);
    for (size_t i = 0; i < n; i++) {
        int rc = mc_segment_close(md->engine, segs[i]);
        if (rc == -EBUSY) {
            pthread_mutex_lock(&md->segs_lock);
            segs_push(md, segs[i]);
            pthread_mutex_unlock(&md->segs_lock);
        } else if (rc) {
            ucs_debug("mooncake: closing segment %u: %s", segs[i], mc_last_error());
        }
    }
    free(segs);
}

ucs_status_t uct_mc_md_query(uct_md_h tl_md, uct_md_attr_t *attr)
{
    (void)tl_md;
    memset(attr, 0, sizeof(*attr));
    attr->cap.flags =
        UCT_MD_FLAG_REG | UCT_MD_FLAG_NEED_MEMH | UCT_MD_FLAG_NEED_RKEY | UCT_MD_FLAG_INVALIDATE;
    attr->cap.reg_mem_types = UCS_BIT(UCS_MEMORY_TYPE_HOST);
    attr->cap.access_mem_types = UCS_BIT(UCS_MEMORY_TYPE_HOST);
    attr->cap.max_reg = ULONG_MAX;
    attr->rkey_packed_size = MC_BUFFER_KEY_SIZE;
    /* one engine registration: a few microseconds, and no pinning on tcp or shm */
    attr->reg_cost = ucs_linear_func_make(2e-6, 0);
    snprintf(attr->component_name, sizeof(attr->component_name), "%s", UCT_MC_NAME);
    memset(&attr->local_cpus, 0xff, sizeof(attr->local_cpus));
    return UCS_OK;
}

ucs_status_t uct_mc_mem_reg(uct_md_h tl_md, void *address, size_t length, unsigned flags,
                            uct_mem_h *memh_p)
{
    uct_mc_md_t *md = ucs_derived_of(tl_md, uct_mc_md_t);
    ucs_rcache_region_t *region;
    uct_mc_memh_t *memh;
    ucs_status_t st;
    int rc;

    /* What the application maps itself (ucp_mem_map asks for every access, atomics too) must
     * be unreachable once it unmaps it: only UCP's own registrations (rendezvous buffers, its
     * pools) are cached, where a dereg just returns the region. */
    if (md->rcache && length && !(flags & UCT_MD_MEM_ACCESS_REMOTE_ATOMIC)) {
        st = ucs_rcache_get(md->rcache, address, length, PROT_READ | PROT_WRITE, &flags, &region);
        if (st == UCS_OK) {
            atomic_fetch_add(&md->memhs, 1);
            *memh_p = ucs_container_of(region, uct_mc_memh_t, region);
        }
        return st;
    }
    memh = calloc(1, sizeof(*memh));
    if (!memh)
        return UCS_ERR_NO_MEMORY;
    rc = engine_reg(md, memh, address, length);
    if (rc) {
        uct_md_log_mem_reg_error(flags, "mooncake: registering %p+%zu: %s", address, length,
                                 mc_last_error());
        free(memh);
        return uct_mc_status(rc);
    }
    *memh_p = memh;
    return UCS_OK;
}

/* A cached region's invalidation callback, right after its unregister: that one's outcome. */
static void invalidated(void *comp)
{
    uct_invoke_completion(comp, uct_mc_status(last_dereg_rc));
}

/* With UCT_MD_MEM_DEREG_FLAG_INVALIDATE (UCP's error handling, for a request whose peer failed:
 * no rendezvous lane without it), comp completes once no peer reaches the memory any more: the
 * engine's unregister returns only then (it waits for peers' I/O in progress, and cuts a
 * same-host peer that does not let go of its mapping within MC_IO_TIMEOUT_MS). A cached region
 * leaves the cache at once and is unregistered when its last user puts it. */
ucs_status_t uct_mc_mem_dereg(uct_md_h tl_md, const uct_md_mem_dereg_params_t *params)
{
    uct_mc_md_t *md = ucs_derived_of(tl_md, uct_mc_md_t);
    unsigned flags = UCT_MD_MEM_DEREG_FIELD_VALUE(params, flags, FIELD_FLAGS, 0);
    uct_completion_t *comp = UCT_MD_MEM_DEREG_FIELD_VALUE(params, comp, FIELD_COMPLETION, NULL);
    bool invalidate = flags & UCT_MD_MEM_DEREG_FLAG_INVALIDATE;
    uct_mc_memh_t *memh;

    if (!(params->field_mask & UCT_MD_MEM_DEREG_FIELD_MEMH) || !params->memh ||
        (invalidate && !comp))
        return UCS_ERR_INVALID_PARAM;
    memh = params->memh;
    if (memh->cached) {
        if (invalidate)
            ucs_rcache_region_invalidate(md->rcache, &memh->region, invalidated, comp);
        ucs_rcache_region_put(md->rcache, &memh->region);
        atomic_fetch_sub(&md->memhs, 1);
        return UCS_OK;
    }
    int rc = engine_dereg(md, memh);
    free(memh);
    if (invalidate)
        uct_invoke_completion(comp, uct_mc_status(rc));
    /* -MC_ETIMEOUT: a same-host peer's copy may still touch the memory, which stays registered
     * in the engine (engine.h): the caller is told rather than led to free it at once */
    return !invalidate && rc == -MC_ETIMEOUT ? uct_mc_status(rc) : UCS_OK;
}

ucs_status_t uct_mc_mkey_pack(uct_md_h tl_md, uct_mem_h tl_memh,
                              const uct_md_mkey_pack_params_t *params, void *rkey_buffer)
{
    uct_mc_md_t *md = ucs_derived_of(tl_md, uct_mc_md_t);
    uct_mc_memh_t *memh = tl_memh;
    int rc;

    (void)params;
    if (!memh->len) { /* no buffer: a key that matches nothing */
        memset(rkey_buffer, 0, MC_BUFFER_KEY_SIZE);
        return UCS_OK;
    }
    rc = mc_buffer_key_pack_range(md->engine, memh->addr, memh->len, rkey_buffer);
    if (rc)
        ucs_error("mooncake: packing the key of %p: %s", memh->addr, mc_last_error());
    return uct_mc_status(rc);
}

/* ---- remote keys ---- */

ucs_status_t uct_mc_rkey_unpack(uct_component_t *component, const void *rkey_buffer,
                                uct_rkey_t *rkey_p, void **handle_p)
{
    uct_mc_rkey_t *rkey = calloc(1, sizeof(*rkey));

    (void)component;
    if (!rkey)
        return UCS_ERR_NO_MEMORY;
    memcpy(rkey->key, rkey_buffer, MC_BUFFER_KEY_SIZE);
    *rkey_p = (uct_rkey_t)rkey;
    *handle_p = NULL;
    return UCS_OK;
}

ucs_status_t uct_mc_rkey_release(uct_component_t *component, uct_rkey_t rkey, void *handle)
{
    (void)component;
    (void)handle;
    free((void *)rkey);
    return UCS_OK;
}
