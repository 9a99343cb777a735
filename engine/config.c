/* Engine configuration: every setting with its default, the MC_* environment, set and get by
 * name. Invalid values are errors that name the setting, never silent defaults. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "config.h"
#include "engine_int.h"
#include "util/thread_buf.h"
#include "transport/transport.h"

/* ---- parsers ---- */

int mc__parse_bool(const char *v, uint64_t *num_p)
{
    static const char *const yes[] = {"1", "true", "yes", "on"}, *const no[] = {"0", "false", "no",
                                                                                "off"};

    for (int i = 0; i < 4; i++) {
        if (!strcasecmp(v, yes[i]) || !strcasecmp(v, no[i])) {
            *num_p = !strcasecmp(v, yes[i]);
            return 0;
        }
    }
    return mc__set_error(-MC_ECONFIG, "expected 0/1/true/false/yes/no/on/off");
}

int mc__parse_text(const char *v, uint64_t *num_p)
{
    (void)v;
    *num_p = 0;
    return 0;
}

static int parse_log_level(const char *v, uint64_t *num_p)
{
    int level = mc__log_level_parse(v);

    *num_p = (uint64_t)(int64_t)level;
    return level != MC_LOG_UNSET
               ? 0
               : mc__set_error(-MC_ECONFIG, "expected off, error, warn, info, debug or -1..3");
}

static int parse_name(const char *v, uint64_t *num_p)
{
    *num_p = 0;
    return strlen(v) < MC_NAME_MAX
               ? 0
               : mc__set_error(-MC_ECONFIG, "longer than %d bytes", MC_NAME_MAX - 1);
}

static int parse_cluster(const char *v, uint64_t *num_p)
{
    *num_p = 0;
    return strlen(v) < 64 && !strchr(v, '/')
               ? 0
               : mc__set_error(-MC_ECONFIG, "at most 63 bytes and no '/'");
}

static int parse_metadata(const char *v, uint64_t *num_p)
{
    *num_p = 0;
    if (!strcmp(v, "none") || !strncmp(v, "file://", 7) || !strncmp(v, "etcd://", 7))
        return 0;
    return mc__set_error(-MC_ECONFIG, "expected file://DIR, etcd://HOST:PORT or none");
}

/* auto, or the name of a transport that reaches peers: that one for every peer it reaches (the
 * control transport too, for what it carries; local ones, which own buffers that are not
 * memory, run whatever this says). */
static int parse_protocol(const char *v, uint64_t *num_p)
{
    char names[128] = "";
    int slot = mc__transport_find(v);

    *num_p = 0;
    if (!strcmp(v, "auto") || (slot >= 0 && !(mc__transports[slot]->flags & MC_TP_LOCAL)))
        return 0;
    for (unsigned i = 0; i < mc__n_transports; i++)
        if (!(mc__transports[i]->flags & MC_TP_LOCAL))
            snprintf(names + strlen(names), sizeof(names) - strlen(names), ", %s",
                     mc__transports[i]->name);
    return mc__set_error(-MC_ECONFIG, "expected auto%s", names);
}

/* The default metadata: a directory of this user's, no server needed. */
static const char *default_metadata(void)
{
    static mc_thread_buf_t tb = MC_THREAD_BUF_INIT(512);
    static __thread void *mine;
    char *buf = mc__thread_buf(&tb, &mine);
    const char *rt = getenv("XDG_RUNTIME_DIR");

    if (!buf)
        return "file:///tmp/mooncake-metadata"; /* (no memory for this user's name of it) */
    if (rt && *rt)
        snprintf(buf, tb.size, "file://%s/mooncake-metadata", rt);
    else
        snprintf(buf, tb.size, "file:///tmp/mooncake-metadata-%u", (unsigned)getuid());
    return buf;
}

/* ---- the core's settings ---- */

static const mc_setting_t core_settings[] = {
    {"LOG_LEVEL", "warn", 0, 0, parse_log_level, "off, error, warn, info, debug (or -1..3)"},
    {"SEGMENT_NAME", "", 0, 0, parse_name,
     "name peers open this segment by; empty: the control transport's first address"},
    {"METADATA", NULL, 0, 0, parse_metadata,
     "file://DIR, etcd://host:port[,host:port...], or none"},
    {"METADATA_CLUSTER_ID", "", 0, 0, parse_cluster,
     "adds a level to metadata keys: mooncake/<id>/ram/..."},
    {"METADATA_TTL", "10", 2, 3600, NULL, "seconds of the lease the descriptor is published under"},
    {"ETCD_USER", "", 0, 0, mc__parse_text, "etcd:// only: user name (with ETCD_PASSWORD)"},
    {"ETCD_PASSWORD", "", 0, 0, mc__parse_text, "etcd:// only: password (with ETCD_USER)"},
    {"ETCD_CACERT", "", 0, 0, mc__parse_text, "etcd:// only: CA bundle; switches to https"},
    {"ETCD_CERT", "", 0, 0, mc__parse_text, "etcd:// only: client certificate (with ETCD_KEY)"},
    {"ETCD_KEY", "", 0, 0, mc__parse_text, "etcd:// only: client key (with ETCD_CERT)"},
    {"ETCD_TIMEOUT_MS", "3000", 100, 600000, NULL, "etcd:// only: bound of every call but watches"},
    {"AUTH_TOKEN", "", 0, 0, mc__parse_text, "shared secret; both sides must have the same one"},
    {"FORCE_TCP", "0", 0, 0, mc__parse_bool, "the control transport (tcp) for every peer"},
    {"PROTOCOL", "auto", 0, 0, parse_protocol,
     "auto, or one transport for every peer it reaches (also on this host)"},
    {"PROGRESS_THREAD", "1", 0, 0, mc__parse_bool,
     "1: an internal thread drives I/O; 0: the caller"},
    {"PROGRESS_IMPLICIT", "1", 0, 0, mc__parse_bool,
     "caller progress: 1: API calls drive it too; 0: only mc_engine_progress (callbacks too)"},
    {"PROGRESS_SERVE_US", "0", 0, 10000000, NULL,
     "caller progress: a thread serves peers (no callbacks) once the host has not driven "
     "progress for this long; 0: never"},
    {"SLICE_SIZE", "65536", 4096, MC_SLICE_MAX, NULL, "bytes per slice"},
    {"RETRY_CNT", "9", 0, 100, NULL, "resubmissions of a slice after a failure"},
    {"TRANSFER_TIMEOUT", "30", 1, 86400, NULL, "seconds a task may take before it ends TIMEOUT"},
    {"IO_TIMEOUT_MS", "2000", 100, 3600000, NULL,
     "a link with work that moves no byte for this long is torn down"},
    {"CONNECT_TIMEOUT_MS", "3000", 100, 600000, NULL, "connect + handshake limit"},
    {"LINGER_MS", "0", 0, 3600000, NULL,
     "destroy first waits up to this long for live peers to take the messages sent to them"},
    {"MSG_ACK_AFTER_HANDLER", "0", 0, 0, mc__parse_bool,
     "1: a message is acknowledged once its handler ran (or, kept, was released: mc_msg_keep), "
     "also one a serving thread took; 0 (and over rdma): once it is in the handler queue"},
    {"HANDSHAKE_MAX_LENGTH", "1048576", 4096, 64 << 20, NULL,
     "largest descriptor accepted from a peer"},
    {"DEVICES", "", 0, 0, mc__parse_text, "comma-separated NICs to use; empty: all"},
    {"NIC_PRIORITY_MATRIX", "", 0, 0, mc__parse_text,
     "the NIC priority matrix as JSON, or @FILE; empty: computed from the topology"},
    {0},
};

/* ---- the configuration object ---- */

typedef struct value {
    const mc_setting_t *def;
    char *text;
    uint64_t num;
} value_t;

struct mc_config {
    size_t n;
    value_t v[];
};

/* The index-th declared setting: the core's, then each transport's in table order. */
static const mc_setting_t *setting_at(size_t index)
{
    size_t n = sizeof(core_settings) / sizeof(core_settings[0]) - 1;

    if (index < n)
        return &core_settings[index];
    index -= n;
    for (unsigned i = 0; i < mc__n_transports; i++) {
        const mc_setting_t *s =
            MC_TP_HAS(mc__transports[i], settings) ? mc__transports[i]->settings : NULL;
        for (; s && s->name; s++)
            if (index-- == 0)
                return s;
    }
    return NULL;
}

static const char *setting_default(const mc_setting_t *s)
{
    return s->def ? s->def : default_metadata();
}

/* Read text as setting s; 0 with *num_p, or -MC_ECONFIG naming the setting. */
static int setting_parse(const mc_setting_t *s, const char *text, uint64_t *num_p)
{
    char *end;
    int rc = 0;

    if (s->parse) {
        rc = s->parse(text, num_p);
    } else {
        errno = 0;
        unsigned long long x = strtoull(text, &end, 10);
        if (errno || *end || !*text || text[0] == '-' || x < s->lo || x > s->hi)
            rc = mc__set_error(-MC_ECONFIG, "expected an integer in [%llu, %llu]",
                               (unsigned long long)s->lo, (unsigned long long)s->hi);
        *num_p = x;
    }
    if (rc)
        return mc__set_error(rc, "MC_%s=%s: %s", s->name, text, mc_last_error());
    return 0;
}

static value_t *find(const mc_config_t *c, const char *name)
{
    if (!strncmp(name, "MC_", 3))
        name += 3;
    for (size_t i = 0; i < c->n; i++)
        if (!strcmp(c->v[i].def->name, name))
            return (value_t *)&c->v[i];
    return NULL;
}

static int value_set(value_t *v, const char *text)
{
    uint64_t num;
    char *copy;
    int rc = setting_parse(v->def, text, &num);

    if (rc)
        return rc;
    copy = strdup(text);
    if (!copy)
        return mc__set_error(-ENOMEM, "out of memory");
    free(v->text);
    v->text = copy;
    v->num = num;
    return 0;
}

static mc_config_t *config_alloc(void)
{
    size_t n = 0;

    while (setting_at(n))
        n++;
    mc_config_t *c = calloc(1, sizeof(*c) + n * sizeof(c->v[0]));
    if (!c)
        return NULL;
    c->n = n;
    for (size_t i = 0; i < n; i++)
        c->v[i].def = setting_at(i);
    return c;
}

int mc_config_create(mc_config_t **config_p)
{
    mc_config_t *c;
    char var[80];
    int rc = 0;

    if (!config_p)
        return mc__set_error(-EINVAL, "mc_config_create: NULL argument");
    c = config_alloc();
    if (!c)
        return mc__set_error(-ENOMEM, "out of memory");
    for (size_t i = 0; i < c->n && !rc; i++) {
        const char *env;
        snprintf(var, sizeof(var), "MC_%s", c->v[i].def->name);
        env = getenv(var);
        rc = value_set(&c->v[i], setting_default(c->v[i].def));
        if (!rc && env && *env)
            rc = value_set(&c->v[i], env);
    }
    if (rc) {
        mc_config_destroy(c);
        return rc;
    }
    *config_p = c;
    return 0;
}

void mc_config_destroy(mc_config_t *c)
{
    if (!c)
        return;
    for (size_t i = 0; i < c->n; i++)
        free(c->v[i].text);
    free(c);
}

int mc_config_set(mc_config_t *c, const char *name, const char *value)
{
    value_t *v;

    if (!c || !name || !value)
        return mc__set_error(-EINVAL, "mc_config_set: NULL argument");
    v = find(c, name);
    if (!v)
        return mc__set_error(-ENOENT, "no setting called %s", name);
    return value_set(v, value);
}

const char *mc_config_get(const mc_config_t *c, const char *name)
{
    const value_t *v = c && name ? find(c, name) : NULL;

    if (!v) {
        mc__set_error(-ENOENT, "no setting called %s", name ? name : "(null)");
        return NULL;
    }
    return v->text;
}

int mc_config_setting(size_t index, const char **name_p, const char **default_p,
                      const char **help_p)
{
    const mc_setting_t *s = setting_at(index);

    if (!s)
        return mc__set_error(-ENOENT, "there are fewer than %zu settings", index + 1);
    if (name_p)
        *name_p = s->name;
    if (default_p)
        *default_p = s->def ? s->def : "file://$XDG_RUNTIME_DIR/mooncake-metadata";
    if (help_p)
        *help_p = s->help;
    return 0;
}

mc_config_t *mc__config_dup(const mc_config_t *c)
{
    mc_config_t *d = config_alloc();

    for (size_t i = 0; d && i < d->n; i++) {
        d->v[i].num = c->v[i].num;
        d->v[i].text = strdup(c->v[i].text);
        if (!d->v[i].text) {
            mc_config_destroy(d);
            return NULL;
        }
    }
    return d;
}

uint64_t mc__config_num(const mc_config_t *c, const char *name)
{
    const value_t *v = find(c, name);

    return v ? v->num : 0;
}

const char *mc__config_str(const mc_config_t *c, const char *name)
{
    const value_t *v = find(c, name);

    return v ? v->text : "";
}

void mc__engine_cfg_read(const mc_config_t *c, mc_engine_cfg_t *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    cfg->log_level = (int)(int64_t)mc__config_num(c, "LOG_LEVEL");
    cfg->segment_name = mc__config_str(c, "SEGMENT_NAME");
    cfg->metadata = mc__config_str(c, "METADATA");
    cfg->cluster_id = mc__config_str(c, "METADATA_CLUSTER_ID");
    cfg->metadata_ttl_s = (unsigned)mc__config_num(c, "METADATA_TTL");
    cfg->auth_token = mc__config_str(c, "AUTH_TOKEN");
    cfg->protocol = mc__config_str(c, "PROTOCOL");
    if (mc__config_num(c, "FORCE_TCP")) /* the control transport for everything */
        cfg->protocol = mc__transports[mc__transport_control()]->name;
    cfg->progress_thread = (int)mc__config_num(c, "PROGRESS_THREAD");
    cfg->progress_implicit = (int)mc__config_num(c, "PROGRESS_IMPLICIT");
    cfg->progress_serve_us = mc__config_num(c, "PROGRESS_SERVE_US");
    cfg->slice_size = mc__config_num(c, "SLICE_SIZE");
    cfg->retry_cnt = (unsigned)mc__config_num(c, "RETRY_CNT");
    cfg->transfer_timeout_ms = (unsigned)mc__config_num(c, "TRANSFER_TIMEOUT") * 1000;
    cfg->io_timeout_ms = (unsigned)mc__config_num(c, "IO_TIMEOUT_MS");
    cfg->connect_timeout_ms = (unsigned)mc__config_num(c, "CONNECT_TIMEOUT_MS");
    cfg->linger_ms = (unsigned)mc__config_num(c, "LINGER_MS");
    cfg->msg_ack_after_handler = (bool)mc__config_num(c, "MSG_ACK_AFTER_HANDLER");
    cfg->handshake_max = mc__config_num(c, "HANDSHAKE_MAX_LENGTH");
    cfg->devices = mc__config_str(c, "DEVICES");
    cfg->matrix = mc__config_str(c, "NIC_PRIORITY_MATRIX");
}
