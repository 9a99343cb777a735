/* softverbs: the device table, built once per process from the environment.
 *
 * SOFTVERBS_DEVICES=N (default 1) and SOFTVERBS_LINK=ib|eth (default ib) describe N devices
 * named softverbs0..N-1; SOFTVERBS_CONFIG=FILE replaces them with one line per device:
 *     device NAME [link=ib|eth] [netdev=IFNAME]
 * Device i has GUID 02:53:56:00:00:00:00:(i+1) and, on InfiniBand, LID i+1. Every process that
 * uses the same configuration computes the same table, which is how peers find each other.
 * SOFTVERBS_MAX_MR_SIZE and SOFTVERBS_MIN_TIMEOUT_MS are read at the same time.
 */
#include "sv_int.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static struct sv_device sv_devs[SV_MAX_DEVICES];
static int sv_ndevs;
static uint64_t sv_min_timeout;
static uint64_t sv_max_mr = UINT64_MAX;
static pthread_once_t sv_once = PTHREAD_ONCE_INIT;

static void sv_gid_from_guid(union ibv_gid *gid, uint64_t guid)
{
    memset(gid, 0, sizeof(*gid));
    gid->global.subnet_prefix = htobe64(0xfe80000000000000ull);
    gid->global.interface_id = htobe64(guid);
}

static void sv_gid_from_v4(union ibv_gid *gid, const struct in_addr *a)
{
    memset(gid, 0, sizeof(*gid));
    gid->raw[10] = 0xff;
    gid->raw[11] = 0xff;
    memcpy(&gid->raw[12], a, 4);
}

/* RoCE GIDs come from addresses: those of the configured netdev, or else a loopback address
 * of its own (127.0.<i/250>.<i%250+1>, all routed to lo), after the link-local GID. */
static void sv_gids_from_netdev(struct sv_device *d)
{
    struct ifaddrs *ifa, *it;

    if (getifaddrs(&ifa) != 0)
        return;
    for (it = ifa; it && d->gid_cnt < SV_MAX_GIDS; it = it->ifa_next) {
        if (!it->ifa_addr || strcmp(it->ifa_name, d->netdev) != 0)
            continue;
        if (it->ifa_addr->sa_family == AF_INET) {
            sv_gid_from_v4(&d->gid[d->gid_cnt++], &((struct sockaddr_in *)it->ifa_addr)->sin_addr);
        } else if (it->ifa_addr->sa_family == AF_INET6) {
            memcpy(d->gid[d->gid_cnt++].raw, &((struct sockaddr_in6 *)it->ifa_addr)->sin6_addr, 16);
        }
    }
    freeifaddrs(ifa);
}

static void sv_device_init(struct sv_device *d, int index, const char *name, enum sv_link link,
                           const char *netdev)
{
    struct in_addr lo;

    memset(d, 0, sizeof(*d));
    d->index = index;
    d->link = link;
    d->guid = 0x0253560000000000ull | (uint64_t)(index + 1);
    d->lid = link == SV_LINK_IB ? (uint16_t)(index + 1) : 0;
    d->ibdev.node_type = IBV_NODE_CA;
    d->ibdev.transport_type = IBV_TRANSPORT_IB;
    snprintf(d->ibdev.name, sizeof(d->ibdev.name), "%s", name);
    snprintf(d->ibdev.dev_name, sizeof(d->ibdev.dev_name), "uverbs%d", index);
    snprintf(d->ibdev.dev_path, sizeof(d->ibdev.dev_path), "/sys/class/infiniband_verbs/uverbs%d",
             index);
    snprintf(d->ibdev.ibdev_path, sizeof(d->ibdev.ibdev_path), "/sys/class/infiniband/%s", name);
    sv_gid_from_guid(&d->gid[0], d->guid);
    d->gid_cnt = 1;
    if (link != SV_LINK_ETH)
        return;
    if (netdev && *netdev) {
        snprintf(d->netdev, sizeof(d->netdev), "%s", netdev);
        sv_gids_from_netdev(d);
    } else {
        lo.s_addr = htonl(0x7f000000u | (uint32_t)(index / 250) << 8 | (uint32_t)(index % 250 + 1));
        sv_gid_from_v4(&d->gid[d->gid_cnt++], &lo);
    }
}

static enum sv_link sv_parse_link(const char *s)
{
    if (s && (strcmp(s, "eth") == 0 || strcmp(s, "roce") == 0))
        return SV_LINK_ETH;
    if (s && *s && strcmp(s, "ib") != 0)
        fprintf(stderr, "softverbs: unknown link '%s', using ib\n", s);
    return SV_LINK_IB;
}

static void sv_parse_config_line(char *line)
{
    char *tok, *save = NULL, *name = NULL, *netdev = NULL;
    enum sv_link link = SV_LINK_IB;

    tok = strtok_r(line, " \t\r\n", &save);
    if (!tok || tok[0] == '#' || strcmp(tok, "device") != 0)
        return;
    while ((tok = strtok_r(NULL, " \t\r\n", &save))) {
        if (strncmp(tok, "link=", 5) == 0)
            link = sv_parse_link(tok + 5);
        else if (strncmp(tok, "netdev=", 7) == 0)
            netdev = tok + 7;
        else if (!name)
            name = tok;
    }
    if (name && sv_ndevs < SV_MAX_DEVICES) {
        sv_device_init(&sv_devs[sv_ndevs], sv_ndevs, name, link, netdev);
        sv_ndevs++;
    }
}

/* SOFTVERBS_MAX_MR_SIZE=BYTES: the largest region ibv_reg_mr accepts (default: no limit), to
 * test what programs do with a device whose max_mr_size is smaller than their buffers. */
static void sv_max_mr_parse(void)
{
    const char *s = getenv("SOFTVERBS_MAX_MR_SIZE");
    unsigned long long v;
    char *end;

    if (!s || !*s)
        return;
    errno = 0;
    v = strtoull(s, &end, 0);
    if (errno || *end || v == 0 || *s == '-') {
        fprintf(stderr, "softverbs: bad SOFTVERBS_MAX_MR_SIZE '%s', using no limit\n", s);
        return;
    }
    sv_max_mr = v;
}

static void sv_devices_build(void)
{
    const char *t = getenv("SOFTVERBS_MIN_TIMEOUT_MS");
    const char *cfg = getenv("SOFTVERBS_CONFIG");
    const char *n = getenv("SOFTVERBS_DEVICES");
    enum sv_link link = sv_parse_link(getenv("SOFTVERBS_LINK"));
    char name[IBV_SYSFS_NAME_MAX], line[512];
    int i, count = n ? atoi(n) : 1;
    FILE *f;

    sv_min_timeout = (uint64_t)(t && atol(t) > 0 ? atol(t) : 100) * 1000000ull;
    sv_max_mr_parse();
    if (cfg && *cfg) {
        f = fopen(cfg, "r");
        if (!f) {
            fprintf(stderr, "softverbs: cannot open SOFTVERBS_CONFIG %s: %s\n", cfg,
                    strerror(errno));
            return;
        }
        while (fgets(line, sizeof(line), f))
            sv_parse_config_line(line);
        fclose(f);
        return;
    }
    if (count < 0)
        count = 0;
    if (count > SV_MAX_DEVICES)
        count = SV_MAX_DEVICES;
    for (i = 0; i < count; i++) {
        snprintf(name, sizeof(name), "softverbs%d", i);
        sv_device_init(&sv_devs[i], i, name, link, NULL);
    }
    sv_ndevs = count;
}

int sv_devices_get(struct sv_device **devs_p)
{
    pthread_once(&sv_once, sv_devices_build);
    *devs_p = sv_devs;
    return sv_ndevs;
}

struct sv_device *sv_device_by_lid(uint16_t lid)
{
    struct sv_device *devs;
    int i, n = sv_devices_get(&devs);

    for (i = 0; i < n; i++)
        if (devs[i].lid && devs[i].lid == lid)
            return &devs[i];
    return NULL;
}

struct sv_device *sv_device_by_gid(const union ibv_gid *gid)
{
    struct sv_device *devs;
    int i, j, n = sv_devices_get(&devs);

    for (i = 0; i < n; i++)
        for (j = 0; j < devs[i].gid_cnt; j++)
            if (memcmp(devs[i].gid[j].raw, gid->raw, 16) == 0)
                return &devs[i];
    return NULL;
}

const char *sv_fabric(void)
{
    const char *f = getenv("SOFTVERBS_FABRIC");

    return f && *f ? f : "default";
}

const char *sv_ctl_dir(void)
{
    const char *d = getenv("SOFTVERBS_CTL_DIR");

    return d && *d ? d : "/tmp/softverbs";
}

/* Read once, with the device table: it is used for every packet. */
uint64_t sv_min_timeout_ns(void)
{
    pthread_once(&sv_once, sv_devices_build);
    return sv_min_timeout;
}

uint64_t sv_max_mr_size(void)
{
    pthread_once(&sv_once, sv_devices_build);
    return sv_max_mr;
}

SV_EXPORT struct ibv_device **ibv_get_device_list(int *num_devices)
{
    struct sv_device *devs;
    struct ibv_device **list;
    int i, n = sv_devices_get(&devs);

    list = calloc((size_t)n + 1, sizeof(*list));
    if (!list) {
        errno = ENOMEM;
        return NULL;
    }
    for (i = 0; i < n; i++)
        list[i] = &devs[i].ibdev;
    if (num_devices)
        *num_devices = n;
    return list;
}

SV_EXPORT void ibv_free_device_list(struct ibv_device **list)
{
    free(list);
}

SV_EXPORT const char *ibv_get_device_name(struct ibv_device *device)
{
    return device->name;
}

SV_EXPORT __be64 ibv_get_device_guid(struct ibv_device *device)
{
    return htobe64(((struct sv_device *)device)->guid);
}

SV_EXPORT int ibv_get_device_index(struct ibv_device *device)
{
    return ((struct sv_device *)device)->index;
}

/* Not in the installed headers; the signature is rdma-core's driver.h one. There is no sysfs
 * for these devices, so only real files are read. */
SV_EXPORT int ibv_read_sysfs_file(const char *dir, const char *file, char *buf, size_t size);
SV_EXPORT int ibv_read_sysfs_file(const char *dir, const char *file, char *buf, size_t size)
{
    char path[512];
    size_t len;
    FILE *f;

    snprintf(path, sizeof(path), "%s/%s", dir, file);
    f = fopen(path, "r");
    if (!f)
        return -1;
    len = fread(buf, 1, size ? size - 1 : 0, f);
    fclose(f);
    if (size)
        buf[len] = '\0';
    while (len > 0 && isspace((unsigned char)buf[len - 1]))
        buf[--len] = '\0';
    return (int)len;
}
