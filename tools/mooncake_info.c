/*
 * mooncake-info: what this host looks like to the transfer engine (like fi_info, ucx_info).
 *
 *   mooncake-info [--json] [--topology FILE.xml]
 *   mooncake-info --config
 *   mooncake-info --segment NAME     # its buffers, file buffers with where they lie
 *   mooncake-info --file PATH        # how a file or block device would be served here
 *
 * Prints NUMA nodes, network and RDMA devices, GPUs, the NIC priority matrix (honouring
 * MC_DEVICES and MC_NIC_PRIORITY_MATRIX), the transports of this build (file: whether io_uring
 * works here, honouring MC_FILE_IO), the ports of the RDMA devices (state, link layer, MTU, LID,
 * GIDs), the path each GPU's memory takes (GPUDirect over rdma, or staged through host memory:
 * an engine registers a little of it to see) and the version; with --config, every MC_* setting
 * with its value here (defaults and environment), its default and what it does; with --segment, the
 * buffers a segment publishes (opened through MC_METADATA, or by handshake at ip:port), its file
 * buffers with their path, offset, O_DIRECT alignment and the owner's I/O (io_uring or threads);
 * with --file, the same for a file registered here for a moment, read-only. The first thing to run
 * when something is wrong. Exit status: 0, 1 on a bad configuration or a failed look-up, 2 on bad
 * usage.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <infiniband/verbs.h>
#include <jansson.h>

#if MC_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

#include "buffer.h"
#include "mooncake/engine.h"
#include "mooncake/error.h"
#include "sys/verbs.h"
#include "topology/topology.h"
#include "transport/file/file_int.h"

#ifndef MC_VERSION_STRING
#define MC_VERSION_STRING "unknown"
#endif

#define RDMA_NAMES_MAX 512

/* RDMA devices as libibverbs sees them (opened at run time by the engine's loader, so the
 * tool runs where rdma-core is not installed), with one JSON object per port. */
typedef struct rdma_probe {
    int n; /* devices found, -1 when libibverbs is unavailable */
    char names[RDMA_NAMES_MAX];
    char note[300];
    json_t *ports; /* [{device, port, state, link_layer, active_mtu, lid, gids: [...]}] */
} rdma_probe_t;

static const char *port_state_name(enum ibv_port_state s)
{
    static const char *const names[] = {"NOP", "DOWN", "INIT", "ARMED", "ACTIVE", "ACTIVE_DEFER"};

    return (unsigned)s < sizeof(names) / sizeof(names[0]) ? names[s] : "UNKNOWN";
}

static int gid_is_v4_mapped(const union ibv_gid *gid)
{
    static const uint8_t prefix[12] = {[10] = 0xff, [11] = 0xff};

    return !memcmp(gid->raw, prefix, sizeof(prefix));
}

/* IB on an InfiniBand port; on Ethernet the provider's answer, else a guess: IPv4-mapped GIDs
 * are taken as RoCE v2. */
static const char *gid_type(struct ibv_context *ctx, uint8_t port, int index,
                            const union ibv_gid *gid, int eth)
{
    struct ibv_gid_entry ent;

    if (!eth)
        return "IB";
    if (!ibv_query_gid_ex(ctx, port, (uint32_t)index, &ent, 0))
        return ent.gid_type == IBV_GID_TYPE_ROCE_V2 ? "RoCE v2" : "RoCE v1";
    return gid_is_v4_mapped(gid) ? "RoCE v2" : "RoCE v1";
}

static json_t *port_gids(struct ibv_context *ctx, uint8_t port, const struct ibv_port_attr *a)
{
    static const union ibv_gid zero;
    int eth = a->link_layer == IBV_LINK_LAYER_ETHERNET;
    json_t *gids = json_array();
    char text[INET6_ADDRSTRLEN];
    union ibv_gid gid;

    for (int i = 0; gids && i < a->gid_tbl_len; i++) {
        if (ibv_query_gid(ctx, port, i, &gid) || !memcmp(&gid, &zero, sizeof(gid)) ||
            !inet_ntop(AF_INET6, gid.raw, text, sizeof(text)))
            continue; /* empty entries of the table */
        json_array_append_new(gids, json_pack("{s:i, s:s, s:s}", "index", i, "gid", text, "type",
                                              gid_type(ctx, port, i, &gid, eth)));
    }
    return gids;
}

static json_t *port_json(struct ibv_context *ctx, const char *dev, uint8_t port)
{
    struct ibv_port_attr a;
    int rc = ibv_query_port(ctx, port, &a);

    if (rc)
        return json_pack("{s:s, s:i, s:s}", "device", dev, "port", port, "error", strerror(rc));
    /* rdma-core treats an unspecified link layer as InfiniBand. */
    return json_pack("{s:s, s:i, s:s, s:s, s:i, s:i, s:o}", "device", dev, "port", port, "state",
                     port_state_name(a.state), "link_layer",
                     a.link_layer == IBV_LINK_LAYER_ETHERNET ? "Ethernet" : "InfiniBand",
                     "active_mtu", a.active_mtu ? 128 << a.active_mtu : 0, "lid", a.lid, "gids",
                     port_gids(ctx, port, &a));
}

/* Appends one object per port of the device (one with "error" when it cannot be opened). */
static void device_ports(struct ibv_device *d, json_t *ports)
{
    const char *name = ibv_get_device_name(d);
    struct ibv_context *ctx = ibv_open_device(d);
    struct ibv_device_attr da;
    int rc = ctx ? ibv_query_device(ctx, &da) : errno ? errno : EIO;

    if (rc) {
        json_array_append_new(ports,
                              json_pack("{s:s, s:s}", "device", name, "error", strerror(rc)));
        if (ctx)
            ibv_close_device(ctx);
        return;
    }
    for (int p = 1; p <= da.phys_port_cnt; p++)
        json_array_append_new(ports, port_json(ctx, name, (uint8_t)p));
    ibv_close_device(ctx);
}

static void rdma_probe(rdma_probe_t *r)
{
    struct ibv_device **list;
    const char *why;

    memset(r, 0, sizeof(*r));
    r->n = -1;
    r->ports = json_array();
    if (!mc__verbs_available(&why)) {
        snprintf(r->note, sizeof(r->note), "unavailable: %s", why);
        return;
    }
    list = ibv_get_device_list(&r->n);
    if (!list) {
        snprintf(r->note, sizeof(r->note), "ibv_get_device_list: %s", strerror(errno));
        r->n = 0;
        return;
    }
    for (int i = 0; i < r->n; i++) {
        size_t len = strlen(r->names);

        snprintf(r->names + len, sizeof(r->names) - len, "%s%s", len ? "," : "",
                 ibv_get_device_name(list[i]));
        if (r->ports)
            device_ports(list[i], r->ports);
    }
    ibv_free_device_list(list);
    snprintf(r->note, sizeof(r->note), "%d device%s via libibverbs", r->n, r->n == 1 ? "" : "s");
}

static const char *kind_name(int kind)
{
    return kind == MC_DEV_NET ? "net" : kind == MC_DEV_RDMA ? "rdma" : "gpu";
}

static const char *or_dash(const char *s)
{
    return s && *s ? s : "-";
}

static void print_list(const char **v, size_t n, int width)
{
    int used = 0;

    for (size_t i = 0; i < n; i++)
        used += printf("%s%s", i ? "," : "", v[i]);
    if (!n)
        used += printf("-");
    if (width > used)
        printf("%*s", width - used, "");
}

static void print_devices(const mc_topo_t *t)
{
    printf("\nDevices (%zu network, %zu RDMA)\n", mc__topo_count(t, MC_DEV_NET),
           mc__topo_count(t, MC_DEV_RDMA));
    printf("  %-16s %-5s %-14s %-5s %s\n", "name", "kind", "pci", "numa", "addresses");
    for (size_t i = 0; i < t->n_devs; i++) {
        const mc_topo_dev_t *d = &t->devs[i];

        if (d->kind != MC_DEV_GPU)
            printf("  %-16s %-5s %-14s %-5d %s\n", d->name, kind_name(d->kind), or_dash(d->pci),
                   d->numa, or_dash(d->addrs));
    }
    if (!mc__topo_count(t, MC_DEV_NET) && !mc__topo_count(t, MC_DEV_RDMA))
        printf("  (none)\n");
    printf("\nGPUs (%zu)\n", mc__topo_count(t, MC_DEV_GPU));
    if (!mc__topo_count(t, MC_DEV_GPU)) {
        printf("  %s\n", t->gpu_note);
        return;
    }
    printf("  %-16s %-14s %-5s\n", "name", "pci", "numa");
    for (size_t i = 0; i < t->n_devs; i++)
        if (t->devs[i].kind == MC_DEV_GPU)
            printf("  %-16s %-14s %-5d\n", t->devs[i].name, or_dash(t->devs[i].pci),
                   t->devs[i].numa);
}

static void print_port(json_t *p)
{
    json_t *gids = json_object_get(p, "gids"), *g;
    size_t i;

    printf("  %-16s %-4d ", json_string_value(json_object_get(p, "device")),
           (int)json_integer_value(json_object_get(p, "port")));
    if (json_object_get(p, "error")) {
        printf("error: %s\n", json_string_value(json_object_get(p, "error")));
        return;
    }
    printf("%-7s %-10s %-5d %-5d", json_string_value(json_object_get(p, "state")),
           json_string_value(json_object_get(p, "link_layer")),
           (int)json_integer_value(json_object_get(p, "active_mtu")),
           (int)json_integer_value(json_object_get(p, "lid")));
    for (i = 0; i < json_array_size(gids); i++) {
        g = json_array_get(gids, i);
        printf("%*s%-3d %s (%s)\n", i ? 55 : 1, "",
               (int)json_integer_value(json_object_get(g, "index")),
               json_string_value(json_object_get(g, "gid")),
               json_string_value(json_object_get(g, "type")));
    }
    if (!json_array_size(gids))
        printf(" -\n");
}

static void print_ports(json_t *ports)
{
    if (!json_array_size(ports))
        return;
    printf("\nRDMA ports\n  %-16s %-4s %-7s %-10s %-5s %-5s %s\n", "device", "port", "state",
           "link", "mtu", "lid", "gids (index gid (type))");
    for (size_t i = 0; i < json_array_size(ports); i++)
        print_port(json_array_get(ports, i));
}

/* Whether file I/O would go through io_uring here (MC_FILE_IO honoured), and why not. */
static const char *file_io_mode(char *why, size_t size)
{
    const char *mode = getenv("MC_FILE_IO");

    if (mode && !strcmp(mode, "thread")) {
        snprintf(why, size, "MC_FILE_IO=thread");
        return "thread";
    }
    return mc__file_io_probe(why, size) ? "io_uring" : "thread";
}

static const char *file_note(void)
{
    static char note[400];
    char why[256] = "";
    const char *io = file_io_mode(why, sizeof(why));

    if (!strcmp(io, "io_uring"))
        snprintf(note, sizeof(note), "I/O through io_uring");
    else
        snprintf(note, sizeof(note), "I/O through pread/pwrite threads (io_uring: %s)", why);
    return note;
}

/* An engine of this process, just to look: metadata as given (NULL: MC_METADATA's); with
 * metadata "none" it publishes nothing and listens on loopback only. */
static mc_engine_t *probe_engine(const char *metadata);

/* Whether rdma gives VRAM of GPU dev a memory region (GPUDirect: dmabuf or peer memory), and
 * (*ipc_p) whether it exports a CUDA IPC handle for same-host peers: an engine registers 2 MiB
 * of it as a host would. 1 or 0; -1 with the reason in why. */
static int vram_gpudirect(mc_engine_t *e, int dev, bool *ipc_p, char *why, size_t size)
{
#if MC_HAVE_CUDA
    int rdma = mc__transport_find("rdma"), direct = -1;
    char loc[16];
    void *p = NULL;
    cudaError_t err = cudaSetDevice(dev);

    if (err == cudaSuccess)
        err = cudaMalloc(&p, 2u << 20);
    if (err != cudaSuccess) {
        snprintf(why, size, "%s", cudaGetErrorString(err));
        return -1;
    }
    snprintf(loc, sizeof(loc), "cuda:%d", dev);
    if (mc_mem_register(e, p, 2u << 20, loc) == 0) {
        mc_buffer_t *b = mc__mem_get(e, (uint64_t)(uintptr_t)p, 1);
        direct = b && rdma >= 0 && e->tp[rdma] && b->tp[rdma];
        *ipc_p = b && b->tp[mc__file_slot];
        if (b)
            mc__mem_put(e, b);
        mc_mem_unregister(e, p);
    } else {
        snprintf(why, size, "%s", mc_last_error());
    }
    cudaFree(p);
    return direct;
#else
    (void)e;
    (void)dev;
    (void)ipc_p;
    snprintf(why, size, "built without CUDA");
    return -1;
#endif
}

/* [{"gpu", "gpudirect", "path"}] for every GPU. */
static json_t *vram_paths(const mc_topo_t *t)
{
    json_t *arr = json_array();
    mc_engine_t *e = mc__topo_count(t, MC_DEV_GPU) ? probe_engine("none") : NULL;

    for (size_t i = 0; e && i < t->n_devs; i++) {
        char why[300] = "", path[400];
        int gpu = t->devs[i].gpu_index, direct;
        bool ipc = false;
        if (t->devs[i].kind != MC_DEV_GPU)
            continue;
        direct = vram_gpudirect(e, gpu, &ipc, why, sizeof(why));
        if (direct < 0)
            snprintf(path, sizeof(path), "cannot tell: %s", why);
        else
            snprintf(path, sizeof(path),
                     "%sstaged through pinned host memory by the file transport "
                     "(over shm to this host, tcp or rdma beyond)%s",
                     direct ? "rdma with GPUDirect to peers whose end a NIC reaches too; otherwise "
                            : "",
                     ipc ? "; same-host peers open it with CUDA IPC" : "");
        json_array_append_new(arr, json_pack("{s:i,s:b,s:b,s:s}", "gpu", gpu, "gpudirect",
                                             direct > 0, "cuda_ipc", ipc, "path", path));
    }
    if (e)
        mc_engine_destroy(e);
    return arr;
}

static void print_table(const mc_topo_t *t, const rdma_probe_t *r)
{
    printf("mooncake-info %s (CUDA %s)\n", MC_VERSION_STRING,
           MC_HAVE_CUDA ? "built in" : "not built in");
    printf("\nNUMA nodes (%d)\n  %-5s %-20s %s\n", t->n_numa, "node", "cpus", "memory");
    for (int i = 0; i < t->n_numa; i++)
        printf("  %-5d %-20s %.1f GiB\n", t->numa[i].id, or_dash(t->numa[i].cpus),
               (double)t->numa[i].memory / (1 << 30));
    print_devices(t);
    printf("\nPriority matrix (MC_DEVICES=%s, MC_NIC_PRIORITY_MATRIX=%s)\n",
           or_dash(getenv("MC_DEVICES")), getenv("MC_NIC_PRIORITY_MATRIX") ? "set" : "-");
    printf("  %-10s %-32s %s\n", "location", "preferred", "available");
    for (size_t i = 0; i < t->matrix->n_locs; i++) {
        const mc_topo_loc_t *loc = &t->matrix->locs[i];

        printf("  %-10s ", loc->location);
        print_list(loc->preferred, loc->n_preferred, 33);
        print_list(loc->available, loc->n_available, 0);
        printf("\n");
    }
    printf("\nTransports\n  tcp: yes (and the control link)\n  shm: yes (peers on this host)\n"
           "  rdma: %s%s%s%s\n",
           r->n > 0 ? "" : "no (", r->note, r->n > 0 ? ": " : ")", r->names);
    printf("  file: yes, %s\n", file_note());
    print_ports(r->ports);
    json_t *vram = vram_paths(t), *v;
    size_t i;
    printf("\nVRAM paths\n");
    if (!json_array_size(vram))
        printf("  none: %s\n", mc__topo_count(t, MC_DEV_GPU) ? "no engine" : t->gpu_note);
    json_array_foreach(vram, i, v)
    {
        printf("  cuda:%-3d %s\n", (int)json_integer_value(json_object_get(v, "gpu")),
               json_string_value(json_object_get(v, "path")));
    }
    json_decref(vram);
}

static int print_json(const mc_topo_t *t, const rdma_probe_t *r)
{
    json_t *root, *rdma;
    char *text;
    int rc = mc__topo_json(t, &text);

    if (rc < 0)
        return rc;
    root = json_loads(text, 0, NULL);
    free(text);
    if (!root)
        return -ENOMEM;
    rdma = json_pack("{s:b, s:i, s:s, s:s, s:O?}", "available", r->n > 0, "devices",
                     r->n < 0 ? 0 : r->n, "names", r->names, "note", r->note, "ports", r->ports);
    json_object_set_new(root, "version", json_string(MC_VERSION_STRING));
    json_object_set_new(root, "cuda_built", json_boolean(MC_HAVE_CUDA));
    json_object_set_new(root, "vram", vram_paths(t));
    char why[256] = "";
    const char *io = file_io_mode(why, sizeof(why));
    json_object_set_new(root, "transports",
                        json_pack("{s:{s:b}, s:{s:b}, s:o, s:{s:b, s:s, s:s}}", "tcp", "available",
                                  1, "shm", "available", 1, "rdma", rdma ? rdma : json_null(),
                                  "file", "available", 1, "io", io, "note", why));
    text = json_dumps(root, JSON_INDENT(2));
    json_decref(root);
    if (!text)
        return -ENOMEM;
    printf("%s\n", text);
    free(text);
    return 0;
}

/* Every setting: the value an engine created here would get, the default, what it does. */
static int print_config(void)
{
    const char *name, *def, *help;
    mc_config_t *cfg;
    int rc = mc_config_create(&cfg);

    if (rc < 0)
        return rc;
    printf("%-26s %-24s %-24s %s\n", "setting", "value", "default", "meaning");
    for (size_t i = 0; mc_config_setting(i, &name, &def, &help) == 0; i++) {
        char var[64];
        const char *value = mc_config_get(cfg, name);
        snprintf(var, sizeof(var), "MC_%s", name);
        if (value && *value && (strstr(name, "TOKEN") || strstr(name, "PASSWORD")))
            value = "(set)"; /* secrets stay secret */
        printf("%-26s %-24s %-24s %s\n", var, or_dash(value), or_dash(def), help);
    }
    mc_config_destroy(cfg);
    return 0;
}

/* ---- segments and files ---- */

static const char *flag_names(unsigned flags, char *buf, size_t size)
{
    snprintf(buf, size, "%s%s%s%s", flags & MC_FILE_READONLY ? "readonly " : "",
             flags & MC_FILE_DURABLE ? "durable " : "", flags & MC_FILE_CREATE ? "create " : "",
             flags & MC_FILE_BUFFERED ? "buffered " : "");
    if (*buf)
        buf[strlen(buf) - 1] = 0;
    return or_dash(buf);
}

static void print_file(const mc_file_info_t *fi)
{
    char flags[64], direct[32];

    snprintf(direct, sizeof(direct), fi->direct_align ? "O_DIRECT at %u" : "page cache",
             fi->direct_align);
    printf("      file %s, offset %llu, %s, flags %s, owner's I/O %s\n", fi->path,
           (unsigned long long)fi->offset, direct, flag_names(fi->flags, flags, sizeof(flags)),
           fi->io);
}

static mc_engine_t *probe_engine(const char *metadata)
{
    mc_config_t *cfg;
    mc_engine_t *e = NULL;
    int rc = mc_config_create(&cfg);

    if (!rc && metadata)
        rc = mc_config_set(cfg, "METADATA", metadata);
    if (!rc && metadata && !strcmp(metadata, "none"))
        rc = mc_config_set(cfg, "LISTEN", "127.0.0.1:0");
    if (!rc && !getenv("MC_LOG_LEVEL"))
        rc = mc_config_set(cfg, "LOG_LEVEL", "error");
    if (!rc)
        rc = mc_engine_create(cfg, &e);
    mc_config_destroy(cfg);
    if (rc)
        fprintf(stderr, "mooncake-info: %s\n", mc_last_error());
    return e;
}

static int show_segment(const char *name)
{
    mc_engine_t *e = probe_engine(NULL);
    mc_buffer_info_t bi[256];
    mc_segment_id_t id;
    size_t n = 0;
    int rc;

    if (!e)
        return 1;
    rc = mc_segment_open(e, name, &id);
    if (!rc)
        rc = mc_segment_buffers(e, id, bi, 256, &n);
    if (rc) {
        fprintf(stderr, "mooncake-info: %s: %s\n", name, mc_last_error());
        mc_engine_destroy(e);
        return 1;
    }
    printf("Segment %s: %zu buffers\n  %-20s %-16s %s\n", name, n, "address", "length", "location");
    for (size_t i = 0; i < n && i < 256; i++) {
        mc_file_info_t fi;
        printf("  0x%-18llx %-16llu %s\n", (unsigned long long)bi[i].addr,
               (unsigned long long)bi[i].length, bi[i].location);
        if (mc_file_info(e, id, bi[i].addr, &fi) == 0)
            print_file(&fi);
    }
    mc_segment_close(e, id);
    mc_engine_destroy(e);
    return 0;
}

static int show_file(const char *path)
{
    mc_engine_t *e = probe_engine("none");
    mc_file_opts_t o = {.size = sizeof(o), .flags = MC_FILE_READONLY};
    mc_file_info_t fi;
    uint64_t addr;
    int rc;

    if (!e)
        return 1;
    rc = mc_file_register(e, path, &o, &addr);
    if (!rc)
        rc = mc_file_info(e, MC_SEGMENT_INVALID, addr, &fi);
    if (rc) {
        fprintf(stderr, "mooncake-info: %s\n", mc_last_error());
        mc_engine_destroy(e);
        return 1;
    }
    printf("File %s: %llu bytes as a buffer\n", path, (unsigned long long)fi.length);
    print_file(&fi);
    mc_file_unregister(e, addr);
    mc_engine_destroy(e);
    return 0;
}

static void usage(FILE *f)
{
    fprintf(f, "usage: mooncake-info [--json] [--topology FILE.xml]\n"
               "       mooncake-info --config\n"
               "       mooncake-info --segment NAME | --file PATH\n"
               "  --json           one JSON object instead of tables\n"
               "  --topology FILE  show an hwloc XML topology instead of this host\n"
               "  --config         every MC_* setting: its value here, default and meaning\n"
               "  --segment NAME   the buffers segment NAME publishes (MC_METADATA, or ip:port),\n"
               "                   with where its file buffers lie and how they are served\n"
               "  --file PATH      how a file or block device would be served here\n"
               "Honours MC_DEVICES, MC_NIC_PRIORITY_MATRIX and MC_FILE_IO.\n");
}

int main(int argc, char **argv)
{
    const char *xml = NULL;
    int json = 0, rc;
    rdma_probe_t rdma;
    mc_topo_t *t;

    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json")) {
            json = 1;
        } else if (!strcmp(argv[i], "--config") && argc == 2) {
            if (print_config() == 0)
                return 0;
            fprintf(stderr, "mooncake-info: %s\n", mc_last_error());
            return 1;
        } else if (!strcmp(argv[i], "--segment") && argc == 3) {
            return show_segment(argv[2]);
        } else if (!strcmp(argv[i], "--file") && argc == 3) {
            return show_file(argv[2]);
        } else if (!strcmp(argv[i], "--topology") && i + 1 < argc) {
            xml = argv[++i];
        } else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            usage(stdout);
            return 0;
        } else {
            usage(stderr);
            return 2;
        }
    }
    rc = mc__topo_discover(xml, &t);
    if (rc < 0) {
        fprintf(stderr, "mooncake-info: %s\n", mc_last_error());
        return 1;
    }
    rc = mc__topo_matrix_build_env(t);
    if (rc < 0) {
        fprintf(stderr, "mooncake-info: %s\n", mc_last_error());
        mc__topo_free(t);
        return 1;
    }
    rdma_probe(&rdma);
    if (json)
        rc = print_json(t, &rdma);
    else
        print_table(t, &rdma);
    json_decref(rdma.ports);
    mc__topo_free(t);
    if (rc < 0) {
        fprintf(stderr, "mooncake-info: %s\n", mc_strerror(rc));
        return 1;
    }
    return 0;
}
