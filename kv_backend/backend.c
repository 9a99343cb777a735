/*
 * An instance: one engine, its options, its errors, its connection info.
 */
#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "kv.h"
#include "sys/cudart.h"
#include "util/thread_buf.h"

#if MC_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

/* Where the plugin's defaults differ from the engine's: peers come from connection info the
 * host carries (no metadata service needed), and an engine thread moves data and delivers
 * notifications whether or not the host polls. The environment (MC_*) and the options given to
 * create() still win. */
static const mc_kv_option_t plugin_defaults[] = {
    {"METADATA", "none", NULL},
    {"PROGRESS_THREAD", "1", NULL},
};
#define N_PLUGIN_DEFAULTS (sizeof(plugin_defaults) / sizeof(plugin_defaults[0]))

static mc_kv_option_t *options;
static size_t n_options;

static const char *plugin_default(const char *name)
{
    for (size_t i = 0; i < N_PLUGIN_DEFAULTS; i++)
        if (!strcmp(plugin_defaults[i].key, name))
            return plugin_defaults[i].value;
    return NULL;
}

/* The options are the engine's settings, with the plugin's defaults. Built once (the caller
 * holds a pthread_once); on allocation failure the list is empty. */
const mc_kv_option_t *kv__options(size_t *n_p)
{
    const char *name, *def, *help;
    size_t n = 0;

    while (mc_config_setting(n, &name, &def, &help) == 0)
        n++;
    options = calloc(n ? n : 1, sizeof(*options));
    for (size_t i = 0; options && i < n; i++) {
        mc_config_setting(i, &name, &def, &help);
        options[i] = (mc_kv_option_t){name, plugin_default(name) ?: def, help};
    }
    n_options = options ? n : 0;
    *n_p = n_options;
    return options;
}

/* ---- errors ------------------------------------------------------------------------------- */

/* The calling thread's copy of the last message (on the heap: util/thread_buf.h). */
#define TLS_ERROR_MAX 512
static mc_thread_buf_t tls_error_buf = MC_THREAD_BUF_INIT(TLS_ERROR_MAX);
static __thread void *tls_error_mine;
_Static_assert(sizeof(((mc_kv_backend_t *)0)->error) <= TLS_ERROR_MAX, "a backend's message fits");

static char *tls_error(void)
{
    return mc__thread_buf(&tls_error_buf, &tls_error_mine);
}

mc_kv_status_t kv__fail(mc_kv_backend_t *b, mc_kv_status_t status, const char *fmt, ...)
{
    char msg[TLS_ERROR_MAX], *mine = tls_error();
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    if (mine)
        memcpy(mine, msg, sizeof(msg));
    if (b) {
        pthread_mutex_lock(&b->lock);
        memcpy(b->error, msg, sizeof(b->error));
        pthread_mutex_unlock(&b->lock);
    }
    return status;
}

mc_kv_status_t kv__status_of(int rc)
{
    switch (rc) {
    case 0:
        return MC_KV_SUCCESS;
    case -MC_EPEERDEAD:
    case -MC_ENOSEGMENT:
    case -MC_EAUTH:
    case -MC_EVERSION:
        return MC_KV_ERR_REMOTE_DISCONNECT;
    case -MC_ECANCELED:
        return MC_KV_ERR_CANCELED;
    case -MC_EACCESS:
    case -EACCES: /* (opening a FILE region) */
    case -EPERM:
        return MC_KV_ERR_NOT_ALLOWED;
    case -EINVAL:
    case -E2BIG:
        return MC_KV_ERR_INVALID_PARAM;
    case -ENOENT:
        return MC_KV_ERR_NOT_FOUND;
    case -EBUSY:
        return MC_KV_ERR_NOT_ALLOWED;
    case -ENOTSUP:
    case -MC_ENODEV:
        return MC_KV_ERR_NOT_SUPPORTED;
    default:
        return MC_KV_ERR_BACKEND;
    }
}

mc_kv_status_t kv__fail_input(mc_kv_backend_t *b, int rc, const char *what)
{
    /* bytes the host passed in (its side channel's) that no peer made: its call's fault, not
     * the backend's (a task failing -MC_EPROTO in flight is the backend's) */
    return rc == -MC_EPROTO ? kv__fail(b, MC_KV_ERR_INVALID_PARAM, "%s: %s", what, mc_last_error())
                            : kv__fail_engine(b, rc, what);
}

mc_kv_status_t kv__fail_engine(mc_kv_backend_t *b, int rc, const char *what)
{
    const char *why = mc_last_error();

    return kv__fail(b, kv__status_of(rc), "%s: %s (%s)", what, *why ? why : mc_strerror(rc),
                    mc_err_name(rc));
}

const char *kv__last_error(mc_kv_backend_t *b)
{
    char *mine = tls_error();

    if (!mine)
        return "out of memory (the message could not be kept)";
    if (b) {
        pthread_mutex_lock(&b->lock);
        memcpy(mine, b->error, sizeof(b->error));
        pthread_mutex_unlock(&b->lock);
    }
    return mine;
}

/* ---- create / destroy --------------------------------------------------------------------- */

/* Keys are the engine's setting names, in any case, with or without MC_. */
static int option_set(mc_kv_backend_t *b, mc_config_t *cfg, const char *key, const char *value)
{
    char name[64];
    size_t i;
    int rc;

    if (!key || !value)
        return kv__fail(b, MC_KV_ERR_INVALID_PARAM, "option with a NULL key or value");
    for (i = 0; key[i] && i + 1 < sizeof(name); i++)
        name[i] = (char)toupper((unsigned char)key[i]);
    name[i] = 0;
    rc = mc_config_set(cfg, name, value);
    if (rc == -ENOENT)
        return kv__fail(b, MC_KV_ERR_INVALID_PARAM,
                        "unknown option '%s' (the plugin table's options list the known ones)",
                        key);
    if (rc < 0)
        return kv__fail(b, MC_KV_ERR_INVALID_PARAM, "option %s=%s: %s", key, value,
                        mc_last_error());
    return 0;
}

static mc_kv_status_t config_build(const mc_kv_init_t *init, mc_config_t **cfg_p)
{
    char env[80];
    mc_config_t *cfg;
    int rc = mc_config_create(&cfg);

    if (rc < 0)
        return kv__fail_engine(NULL, rc, "engine settings from the environment");
    for (size_t i = 0; i < N_PLUGIN_DEFAULTS; i++) {
        snprintf(env, sizeof(env), "MC_%s", plugin_defaults[i].key);
        if (!getenv(env))
            mc_config_set(cfg, plugin_defaults[i].key, plugin_defaults[i].value);
    }
    for (size_t i = 0; i < init->n_options; i++) {
        if ((rc = option_set(NULL, cfg, init->options[i].key, init->options[i].value)) < 0) {
            mc_config_destroy(cfg);
            return rc;
        }
    }
    *cfg_p = cfg;
    return MC_KV_SUCCESS;
}

/* A boolean setting that says no (the engine checked it when it was set). */
static bool setting_off(const mc_config_t *cfg, const char *name)
{
    const char *v = mc_config_get(cfg, name);
    uint64_t on = 1;

    return v && !mc__parse_bool(v, &on) && !on;
}

static mc_kv_status_t init_check(const mc_kv_init_t *init, mc_kv_backend_t **backend_p)
{
    if (!init || !backend_p)
        return kv__fail(NULL, MC_KV_ERR_INVALID_PARAM, "create: NULL init or output pointer");
    if (init->size < sizeof(mc_kv_init_t))
        return kv__fail(NULL, MC_KV_ERR_INVALID_PARAM,
                        "create: init.size %zu is smaller than mc_kv_init_t (%zu)", init->size,
                        sizeof(mc_kv_init_t));
    if (!init->agent || !*init->agent || strlen(init->agent) >= MC_KV_AGENT_MAX)
        return kv__fail(NULL, MC_KV_ERR_INVALID_PARAM,
                        "create: the agent name must have 1 to %d characters", MC_KV_AGENT_MAX - 1);
    if (init->n_options && !init->options)
        return kv__fail(NULL, MC_KV_ERR_INVALID_PARAM, "create: n_options without options");
    return MC_KV_SUCCESS;
}

mc_kv_status_t kv__create(const mc_kv_init_t *init, mc_kv_backend_t **backend_p)
{
    mc_kv_backend_t *b;
    mc_config_t *cfg = NULL;
    mc_kv_status_t st;
    int rc;

    if ((st = init_check(init, backend_p)) || (st = config_build(init, &cfg)))
        return st;
    b = calloc(1, sizeof(*b));
    if (!b || !(b->notif = malloc(sizeof(*b->notif)))) {
        st = kv__fail(NULL, MC_KV_ERR_BACKEND, "create: out of memory");
        goto err_free;
    }
    snprintf(b->agent, sizeof(b->agent), "%s", init->agent);
    b->connect_timeout_ms = (unsigned)strtoul(mc_config_get(cfg, "CONNECT_TIMEOUT_MS"), NULL, 10);
    b->transfer_timeout_s = (unsigned)strtoul(mc_config_get(cfg, "TRANSFER_TIMEOUT"), NULL, 10);
    /* The table has no progress call: with neither the engine's thread nor the implicit
     * progress of its calls, check_xfer and get_notif are the host's progress. */
    b->drives_progress =
        setting_off(cfg, "PROGRESS_THREAD") && setting_off(cfg, "PROGRESS_IMPLICIT");
    if ((rc = mc_engine_create(cfg, &b->engine)) < 0) {
        st = kv__fail_engine(NULL, rc, "create: the transfer engine");
        goto err_free;
    }
    mc_config_destroy(cfg);
    pthread_rwlock_init(&b->agents_lock, NULL);
    pthread_mutex_init(&b->lock, NULL);
    *backend_p = b;
    return MC_KV_SUCCESS;

err_free:
    if (b)
        free(b->notif);
    free(b);
    mc_config_destroy(cfg);
    return st;
}

void kv__destroy(mc_kv_backend_t *b)
{
    if (!b)
        return;
    kv__xfers_release_all(b);
    mc_engine_destroy(b->engine); /* unregisters the regions' memory */
    kv__mds_free(b);
    kv__agents_free(b);
    pthread_rwlock_destroy(&b->agents_lock);
    pthread_mutex_destroy(&b->lock);
    free(b->notif);
    free(b);
}

/* ---- capabilities, connection info -------------------------------------------------------- */

static bool have_gpu(void)
{
#if MC_HAVE_CUDA
    int n = 0;

    return mc__cudart_available(NULL) && cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
#else
    return false;
#endif
}

mc_kv_status_t kv__caps(mc_kv_backend_t *b, mc_kv_caps_t *caps_p)
{
    if (!b || !caps_p)
        return kv__fail(b, MC_KV_ERR_INVALID_PARAM, "caps: NULL argument");
    *caps_p = (mc_kv_caps_t){
        .supports_remote = 1,
        .supports_local = 1,
        .supports_notif = 1,
        .mem_types = (1u << MC_KV_DRAM) | (1u << MC_KV_FILE) | (have_gpu() ? 1u << MC_KV_VRAM : 0),
    };
    return MC_KV_SUCCESS;
}

/* [u32 magic][u8 version][u8 agent length][agent][u8 address length][engine address]
 * [u8 segment name length][segment name]. The segment name is what a receiver's engine names
 * the sender of this instance's notifications: it checks the agent name they carry by it. */
mc_kv_status_t kv__conn_info(mc_kv_backend_t *b, void *buf, size_t *len_p)
{
    unsigned char info[6 + MC_KV_AGENT_MAX + 1 + MC_ADDRESS_MAX + 1 + MC_NAME_MAX], *p = info;
    const char *segment = mc_engine_segment_name(b->engine);
    size_t name_len = strlen(b->agent), addr_len = MC_ADDRESS_MAX, seg_len = strlen(segment);
    uint32_t magic = KV_CONN_MAGIC;
    int rc;

    if (!len_p)
        return kv__fail(b, MC_KV_ERR_INVALID_PARAM, "conn_info: NULL length");
    memcpy(p, &magic, 4);
    p[4] = KV_CONN_VERSION;
    p[5] = (unsigned char)name_len;
    memcpy(p + 6, b->agent, name_len);
    p += 6 + name_len;
    if ((rc = mc_engine_address(b->engine, p + 1, &addr_len)) < 0)
        return kv__fail_engine(b, rc, "conn_info: the engine's address");
    p[0] = (unsigned char)addr_len;
    p += 1 + addr_len;
    p[0] = (unsigned char)seg_len;
    memcpy(p + 1, segment, seg_len);
    p += 1 + seg_len;
    if (p - info > MC_KV_CONN_MAX)
        return kv__fail(b, MC_KV_ERR_BACKEND,
                        "conn_info: %zu bytes, more than MC_KV_CONN_MAX (%d): shorten the agent "
                        "name (%zu) or the segment name '%s' (SEGMENT_NAME)",
                        (size_t)(p - info), MC_KV_CONN_MAX, name_len, segment);
    if (!buf || *len_p < (size_t)(p - info)) {
        *len_p = (size_t)(p - info);
        return kv__fail(b, MC_KV_ERR_INVALID_PARAM, "conn_info: %zu bytes needed", *len_p);
    }
    *len_p = (size_t)(p - info);
    memcpy(buf, info, *len_p);
    return MC_KV_SUCCESS;
}
