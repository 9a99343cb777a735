/* Engine configuration: defaults and MC_* environment variables. Invalid values are errors
 * that name the variable, never silent defaults. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "engine_int.h"
#include "util/sockaddr.h"

static void config_defaults(mc_config_t *c)
{
    const char *rt = getenv("XDG_RUNTIME_DIR");

    memset(c, 0, sizeof(*c));
    snprintf(c->listen, sizeof(c->listen), "127.0.0.1:0");
    if (rt && *rt)
        snprintf(c->metadata, sizeof(c->metadata), "file://%s/mooncake-metadata", rt);
    else
        snprintf(c->metadata, sizeof(c->metadata), "file:///tmp/mooncake-metadata-%u",
                 (unsigned)getuid());
    c->log_level = MC_LOG_WARN;
    c->progress_thread = 1;
    c->slice_size = 64 * 1024;
    c->retry_cnt = 9;
    c->transfer_timeout_ms = 30000;
    c->io_timeout_ms = 2000;
    c->connect_timeout_ms = 3000;
    c->tcp_conns = 2;
    c->tcp_window = 16;
    c->max_conns = 256;
    c->metadata_ttl_s = 10;
    c->handshake_max = 1 << 20;
    snprintf(c->protocol, sizeof(c->protocol), "auto");
    c->gid_index = -1;
    c->ib_port = 1;
    c->rdma_qp_depth = 64;
    c->rdma_max_qps = 256;
}

static int env_u64(const char *var, uint64_t lo, uint64_t hi, uint64_t *out)
{
    const char *v = getenv(var);
    char *end;

    if (!v || !*v)
        return 0;
    errno = 0;
    unsigned long long x = strtoull(v, &end, 0);
    if (errno || *end || v[0] == '-' || x < lo || x > hi)
        return mc__set_error(-MC_ECONFIG, "%s=%s: expected an integer in [%llu, %llu]", var, v,
                             (unsigned long long)lo, (unsigned long long)hi);
    *out = x;
    return 0;
}

static int env_uint(const char *var, uint64_t lo, uint64_t hi, unsigned *out)
{
    uint64_t x = *out;
    int rc = env_u64(var, lo, hi, &x);

    *out = (unsigned)x;
    return rc;
}

static int env_bool(const char *var, int *out)
{
    const char *v = getenv(var);

    if (!v || !*v)
        return 0;
    if (!strcmp(v, "1") || !strcasecmp(v, "true") || !strcasecmp(v, "yes") || !strcasecmp(v, "on"))
        *out = 1;
    else if (!strcmp(v, "0") || !strcasecmp(v, "false") || !strcasecmp(v, "no") ||
             !strcasecmp(v, "off"))
        *out = 0;
    else
        return mc__set_error(-MC_ECONFIG, "%s=%s: expected 0/1/true/false/yes/no/on/off", var, v);
    return 0;
}

static int env_str(const char *var, char *out, size_t size)
{
    const char *v = getenv(var);

    if (!v)
        return 0;
    if (strlen(v) >= size)
        return mc__set_error(-MC_ECONFIG, "%s: value longer than %zu bytes", var, size - 1);
    memcpy(out, v, strlen(v) + 1);
    return 0;
}

static int env_protocol(mc_config_t *c)
{
    int rc = env_str("MC_PROTOCOL", c->protocol, sizeof(c->protocol));

    if (rc)
        return rc;
    if (strcmp(c->protocol, "auto") && strcmp(c->protocol, "rdma") && strcmp(c->protocol, "tcp"))
        return mc__set_error(-MC_ECONFIG, "MC_PROTOCOL=%s: expected auto, rdma or tcp",
                             c->protocol);
    return 0;
}

static int env_rdma(mc_config_t *c)
{
    unsigned gid = 0;
    const char *v = getenv("MC_GID_INDEX");
    int rc = 0;

    if (v && *v) {
        rc = env_uint("MC_GID_INDEX", 0, 255, &gid);
        c->gid_index = (int)gid;
    }
    if (!rc)
        rc = env_uint("MC_MTU", 0, 4096, &c->mtu);
    if (!rc && c->mtu && (c->mtu < 256 || (c->mtu & (c->mtu - 1))))
        rc = mc__set_error(-MC_ECONFIG, "MC_MTU=%u: expected 256, 512, 1024, 2048 or 4096", c->mtu);
    if (!rc)
        rc = env_uint("MC_IB_PORT", 1, 255, &c->ib_port);
    if (!rc)
        rc = env_uint("MC_RDMA_QP_DEPTH", 1, 4096, &c->rdma_qp_depth);
    if (!rc)
        rc = env_uint("MC_RDMA_MAX_QPS", 1, 65536, &c->rdma_max_qps);
    return rc;
}

/* A comma-separated list of ip:port, at most MC_MAX_RAILS. */
static int env_ip_ports(const char *var, char *out, size_t size)
{
    struct sockaddr_storage sa;
    socklen_t len;
    char item[MC_NAME_MAX];
    int rc = env_str(var, out, size);
    unsigned n = 0;

    if (rc || !getenv(var))
        return rc;
    for (const char *p = out; *p; n++) {
        size_t l = strcspn(p, ",");
        if (l >= sizeof(item) || n == MC_MAX_RAILS)
            return mc__set_error(-MC_ECONFIG, "%s=%s: at most %d addresses", var, out,
                                 MC_MAX_RAILS);
        memcpy(item, p, l);
        item[l] = 0;
        if (mc__parse_ip_port(item, &sa, &len))
            return mc__set_error(-MC_ECONFIG, "%s=%s: \"%s\" is not IPv4:port or [IPv6]:port", var,
                                 out, item);
        p += l + (p[l] == ',');
    }
    return n ? 0 : mc__set_error(-MC_ECONFIG, "%s is empty", var);
}

static int env_metadata(mc_config_t *c)
{
    int rc = env_str("MC_METADATA", c->metadata, sizeof(c->metadata));

    if (rc)
        return rc;
    if (strcmp(c->metadata, "none") && strncmp(c->metadata, "file://", 7) &&
        strncmp(c->metadata, "etcd://", 7))
        return mc__set_error(-MC_ECONFIG,
                             "MC_METADATA=%s: expected file://DIR, etcd://HOST:PORT "
                             "or none",
                             c->metadata);
    return 0;
}

int mc_config_init(mc_config_t *c)
{
    unsigned timeout_s;
    int rc;

    config_defaults(c);
    timeout_s = c->transfer_timeout_ms / 1000;
    rc = mc__log_init_from_env();
    if (!rc)
        rc = env_ip_ports("MC_LISTEN", c->listen, sizeof(c->listen));
    if (!rc)
        rc = env_str("MC_SEGMENT_NAME", c->segment_name, sizeof(c->segment_name));
    if (!rc)
        rc = env_metadata(c);
    if (!rc)
        rc = env_str("MC_METADATA_CLUSTER_ID", c->cluster_id, sizeof(c->cluster_id));
    if (!rc)
        rc = env_str("MC_AUTH_TOKEN", c->auth_token, sizeof(c->auth_token));
    if (!rc)
        rc = env_bool("MC_FORCE_TCP", &c->force_tcp);
    if (!rc)
        rc = env_bool("MC_PROGRESS_THREAD", &c->progress_thread);
    if (!rc)
        rc = env_u64("MC_SLICE_SIZE", 4096, MC_SLICE_MAX, &c->slice_size);
    if (!rc)
        rc = env_uint("MC_RETRY_CNT", 0, 100, &c->retry_cnt);
    if (!rc)
        rc = env_uint("MC_TRANSFER_TIMEOUT", 1, 86400, &timeout_s);
    if (!rc)
        rc = env_uint("MC_IO_TIMEOUT_MS", 100, 3600000, &c->io_timeout_ms);
    if (!rc)
        rc = env_uint("MC_CONNECT_TIMEOUT_MS", 100, 600000, &c->connect_timeout_ms);
    if (!rc)
        rc = env_uint("MC_TCP_CONNS", 1, 64, &c->tcp_conns);
    if (!rc)
        rc = env_uint("MC_TCP_WINDOW", 1, 1024, &c->tcp_window);
    if (!rc)
        rc = env_uint("MC_MAX_CONNS", 1, 65536, &c->max_conns);
    if (!rc)
        rc = env_uint("MC_METADATA_TTL", 2, 3600, &c->metadata_ttl_s);
    if (!rc)
        rc = env_u64("MC_HANDSHAKE_MAX_LENGTH", 4096, 64 << 20, &c->handshake_max);
    if (!rc)
        rc = env_protocol(c);
    if (!rc)
        rc = env_rdma(c);
    if (rc) {
        config_defaults(c);
        return rc;
    }
    c->transfer_timeout_ms = timeout_s * 1000;
    c->log_level = mc__log_level;
    return 0;
}
