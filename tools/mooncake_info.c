/*
 * mooncake-info: what this host looks like to the transfer engine (like fi_info, ucx_info).
 *
 *   mooncake-info [--json] [--topology FILE.xml]
 *
 * Prints NUMA nodes, network and RDMA devices, GPUs, the NIC priority matrix (honouring
 * MC_DEVICES and MC_NIC_PRIORITY_MATRIX), the transports of this build and the version. The
 * first thing to run when something is wrong. Exit status: 0, 1 on a bad configuration, 2 on
 * bad usage.
 */
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "mooncake/error.h"
#include "topology.h"

#ifndef MC_VERSION_STRING
#define MC_VERSION_STRING "unknown"
#endif

#define RDMA_NAMES_MAX 512

/* RDMA devices as libibverbs sees them, looked up at run time so that the tool runs where
 * rdma-core is not installed. */
typedef struct rdma_probe {
    int n; /* devices found, -1 when libibverbs is absent */
    char names[RDMA_NAMES_MAX];
    char note[128];
} rdma_probe_t;

struct ibv_device;

static void rdma_probe(rdma_probe_t *r)
{
    struct ibv_device **(*get_list)(int *);
    void (*free_list)(struct ibv_device **);
    const char *(*get_name)(struct ibv_device *);
    struct ibv_device **list;
    void *lib = dlopen("libibverbs.so.1", RTLD_NOW | RTLD_LOCAL);

    memset(r, 0, sizeof(*r));
    r->n = -1;
    if (!lib) {
        snprintf(r->note, sizeof(r->note), "libibverbs.so.1 not found");
        return;
    }
    *(void **)&get_list = dlsym(lib, "ibv_get_device_list");
    *(void **)&free_list = dlsym(lib, "ibv_free_device_list");
    *(void **)&get_name = dlsym(lib, "ibv_get_device_name");
    if (!get_list || !free_list || !get_name) {
        snprintf(r->note, sizeof(r->note), "libibverbs.so.1 lacks ibv_get_device_list");
        goto out_close;
    }
    list = get_list(&r->n);
    if (!list) {
        snprintf(r->note, sizeof(r->note), "ibv_get_device_list: %s", strerror(errno));
        r->n = 0;
        goto out_close;
    }
    for (int i = 0; i < r->n; i++) {
        size_t len = strlen(r->names);

        snprintf(r->names + len, sizeof(r->names) - len, "%s%s", len ? "," : "", get_name(list[i]));
    }
    free_list(list);
    snprintf(r->note, sizeof(r->note), "%d device%s via libibverbs", r->n, r->n == 1 ? "" : "s");
out_close:
    dlclose(lib);
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
    printf("\nDevices (%zu network, %zu RDMA)\n", mc_topo_count(t, MC_DEV_NET),
           mc_topo_count(t, MC_DEV_RDMA));
    printf("  %-16s %-5s %-14s %-5s %s\n", "name", "kind", "pci", "numa", "addresses");
    for (size_t i = 0; i < t->n_devs; i++) {
        const mc_topo_dev_t *d = &t->devs[i];

        if (d->kind != MC_DEV_GPU)
            printf("  %-16s %-5s %-14s %-5d %s\n", d->name, kind_name(d->kind), or_dash(d->pci),
                   d->numa, or_dash(d->addrs));
    }
    if (!mc_topo_count(t, MC_DEV_NET) && !mc_topo_count(t, MC_DEV_RDMA))
        printf("  (none)\n");
    printf("\nGPUs (%zu)\n", mc_topo_count(t, MC_DEV_GPU));
    if (!mc_topo_count(t, MC_DEV_GPU)) {
        printf("  %s\n", t->gpu_note);
        return;
    }
    printf("  %-16s %-14s %-5s\n", "name", "pci", "numa");
    for (size_t i = 0; i < t->n_devs; i++)
        if (t->devs[i].kind == MC_DEV_GPU)
            printf("  %-16s %-14s %-5d\n", t->devs[i].name, or_dash(t->devs[i].pci),
                   t->devs[i].numa);
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
    printf("\nTransports\n  tcp: yes\n  rdma: %s%s%s%s\n", r->n > 0 ? "" : "no (", r->note,
           r->n > 0 ? ": " : ")", r->names);
}

static int print_json(const mc_topo_t *t, const rdma_probe_t *r)
{
    json_t *root, *rdma;
    char *text;
    int rc = mc_topo_json(t, &text);

    if (rc < 0)
        return rc;
    root = json_loads(text, 0, NULL);
    free(text);
    if (!root)
        return -ENOMEM;
    rdma = json_pack("{s:b, s:i, s:s, s:s}", "available", r->n > 0, "devices", r->n < 0 ? 0 : r->n,
                     "names", r->names, "note", r->note);
    json_object_set_new(root, "version", json_string(MC_VERSION_STRING));
    json_object_set_new(root, "cuda_built", json_boolean(MC_HAVE_CUDA));
    json_object_set_new(
        root, "transports",
        json_pack("{s:{s:b}, s:o}", "tcp", "available", 1, "rdma", rdma ? rdma : json_null()));
    text = json_dumps(root, JSON_INDENT(2));
    json_decref(root);
    if (!text)
        return -ENOMEM;
    printf("%s\n", text);
    free(text);
    return 0;
}

static void usage(FILE *f)
{
    fprintf(f, "usage: mooncake-info [--json] [--topology FILE.xml]\n"
               "  --json           one JSON object instead of tables\n"
               "  --topology FILE  show an hwloc XML topology instead of this host\n"
               "Honours MC_DEVICES and MC_NIC_PRIORITY_MATRIX.\n");
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
    rc = mc_topo_discover(xml, &t);
    if (rc < 0) {
        fprintf(stderr, "mooncake-info: %s\n", mc_last_error());
        return 1;
    }
    rc = mc_topo_matrix_build_env(t);
    if (rc < 0) {
        fprintf(stderr, "mooncake-info: %s\n", mc_last_error());
        mc_topo_free(t);
        return 1;
    }
    rdma_probe(&rdma);
    if (json)
        rc = print_json(t, &rdma);
    else
        print_table(t, &rdma);
    mc_topo_free(t);
    if (rc < 0) {
        fprintf(stderr, "mooncake-info: %s\n", mc_strerror(rc));
        return 1;
    }
    return 0;
}
