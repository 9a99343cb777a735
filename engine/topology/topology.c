/*
 * Topology discovery: hwloc first, then sysfs, libibverbs, getifaddrs and the CUDA runtime for
 * what hwloc does not report (virtual interfaces, soft RDMA devices, userspace RDMA devices with
 * no sysfs entry, GPUs without hwloc's cuda plugin).
 * The priority matrix built from it lives in topology_matrix.c.
 */
#include <arpa/inet.h>
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <ifaddrs.h>
#include <limits.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <hwloc.h>
#include <infiniband/verbs.h>
#include <jansson.h>
#include <numa.h>

#if MC_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

#include "mooncake/error.h"
#include "sys/cudart.h"
#include "topology.h"
#include "util/log.h"

#define TOPO_PCI_DEPTH_MAX 16

typedef struct topo_build {
    mc_topo_t *t;
    size_t cap;
    int live; /* discovering this host, not an XML file */
} topo_build_t;

static int topo_add_dev(topo_build_t *b, const mc_topo_dev_t *dev)
{
    mc_topo_t *t = b->t;

    if (t->n_devs == b->cap) {
        size_t cap = b->cap ? 2 * b->cap : 16;
        mc_topo_dev_t *devs = realloc(t->devs, cap * sizeof(*devs));

        if (!devs)
            return mc__set_error(-ENOMEM, "topology: out of memory");
        t->devs = devs;
        b->cap = cap;
    }
    t->devs[t->n_devs++] = *dev;
    return 0;
}

const mc_topo_dev_t *mc__topo_find(const mc_topo_t *t, const char *name)
{
    for (size_t i = 0; i < t->n_devs; i++)
        if (!strcmp(t->devs[i].name, name))
            return &t->devs[i];
    return NULL;
}

size_t mc__topo_count(const mc_topo_t *t, int kind)
{
    size_t n = 0;

    for (size_t i = 0; i < t->n_devs; i++)
        n += t->devs[i].kind == kind;
    return n;
}

/* Read a small integer from a sysfs file; def when absent or negative ("-1" = no affinity). */
static int sysfs_read_int(const char *path, int def)
{
    FILE *f = fopen(path, "r");
    int v;

    if (!f)
        return def;
    if (fscanf(f, "%d", &v) != 1 || v < 0)
        v = def;
    fclose(f);
    return v;
}

static int sysfs_pci_numa(const char *busid)
{
    char path[PATH_MAX];

    snprintf(path, sizeof(path), "/sys/bus/pci/devices/%s/numa_node", busid);
    return sysfs_read_int(path, 0);
}

/* --- hwloc --- */

static void hwloc_obj_busid(hwloc_obj_t obj, char *buf, size_t len)
{
    struct hwloc_pcidev_attr_s *pci = &obj->attr->pcidev;

    if (obj->type == HWLOC_OBJ_BRIDGE)
        pci = &obj->attr->bridge.upstream.pci;
    snprintf(buf, len, "%04x:%02x:%02x.%01x", pci->domain, pci->bus, pci->dev, pci->func);
}

/* A path element named as in /sys/devices: "pci0000:00" for a host bridge, the bus id for a
 * PCI device or PCI-to-PCI bridge. */
static void hwloc_path_elem(hwloc_obj_t obj, char *buf, size_t len)
{
    if (obj->type == HWLOC_OBJ_BRIDGE && obj->attr->bridge.upstream_type == HWLOC_OBJ_BRIDGE_HOST)
        snprintf(buf, len, "pci%04x:%02x", obj->attr->bridge.downstream.pci.domain,
                 obj->attr->bridge.downstream.pci.secondary_bus);
    else
        hwloc_obj_busid(obj, buf, len);
}

static void hwloc_pci_info(hwloc_obj_t obj, mc_topo_dev_t *dev)
{
    hwloc_obj_t chain[TOPO_PCI_DEPTH_MAX];
    int depth = 0;
    size_t off = 0;

    for (hwloc_obj_t o = obj; o && depth < TOPO_PCI_DEPTH_MAX; o = o->parent) {
        if (o->type != HWLOC_OBJ_PCI_DEVICE && o->type != HWLOC_OBJ_BRIDGE)
            continue;
        if (o->type == HWLOC_OBJ_PCI_DEVICE && !dev->pci[0])
            hwloc_obj_busid(o, dev->pci, sizeof(dev->pci));
        chain[depth++] = o;
    }
    for (int i = depth - 1; i >= 0 && off < sizeof(dev->pci_path); i--) {
        char elem[32];

        hwloc_path_elem(chain[i], elem, sizeof(elem));
        off += snprintf(dev->pci_path + off, sizeof(dev->pci_path) - off, "%s%s", off ? "/" : "",
                        elem);
    }
}

/* The NUMA node of an I/O object: its non-I/O ancestor's, when that is a single node. */
static int hwloc_io_numa(hwloc_topology_t topo, hwloc_obj_t obj, int *numa_p)
{
    hwloc_obj_t anc = hwloc_get_non_io_ancestor_obj(topo, obj);

    if (!anc || !anc->nodeset || hwloc_bitmap_weight(anc->nodeset) != 1)
        return -1;
    *numa_p = hwloc_bitmap_first(anc->nodeset);
    return 0;
}

static int hwloc_osdev_kind(hwloc_obj_t obj)
{
    switch (obj->attr->osdev.type) {
    case HWLOC_OBJ_OSDEV_NETWORK:
        return MC_DEV_NET;
    case HWLOC_OBJ_OSDEV_OPENFABRICS:
        return MC_DEV_RDMA;
    case HWLOC_OBJ_OSDEV_COPROC:
        if ((obj->subtype && !strcmp(obj->subtype, "CUDA")) || !strncmp(obj->name, "cuda", 4))
            return MC_DEV_GPU;
        return 0;
    default:
        return 0; /* block, dma, and "GPU" (nvml/rsmi/opencl) names that are not CUDA ordinals */
    }
}

static void hwloc_fill_dev(topo_build_t *b, hwloc_topology_t topo, hwloc_obj_t obj,
                           mc_topo_dev_t *dev)
{
    hwloc_pci_info(obj, dev);
    if (hwloc_io_numa(topo, obj, &dev->numa) < 0)
        dev->numa = b->live && dev->pci[0] ? sysfs_pci_numa(dev->pci) : 0;
}

static int hwloc_collect_devs(topo_build_t *b, hwloc_topology_t topo)
{
    for (hwloc_obj_t obj = NULL; (obj = hwloc_get_next_osdev(topo, obj));) {
        mc_topo_dev_t dev = {.gpu_index = -1};
        int rc;

        dev.kind = hwloc_osdev_kind(obj);
        if (!dev.kind || !obj->name || !strcmp(obj->name, "lo"))
            continue;
        snprintf(dev.name, sizeof(dev.name), "%s", obj->name);
        if (dev.kind == MC_DEV_GPU && sscanf(obj->name, "cuda%d", &dev.gpu_index) != 1)
            continue;
        hwloc_fill_dev(b, topo, obj, &dev);
        rc = topo_add_dev(b, &dev);
        if (rc < 0)
            return rc;
    }
    return 0;
}

static int hwloc_collect_numa(topo_build_t *b, hwloc_topology_t topo)
{
    mc_topo_t *t = b->t;
    int n = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_NUMANODE);

    /* hwloc always reports one node at least; libnuma is the fallback if it ever does not. */
    if (n <= 0)
        n = b->live && numa_available() >= 0 ? numa_max_node() + 1 : 1;
    t->numa = calloc((size_t)n, sizeof(*t->numa));
    if (!t->numa)
        return mc__set_error(-ENOMEM, "topology: out of memory");
    t->n_numa = n;
    for (int i = 0; i < n; i++) {
        hwloc_obj_t obj = hwloc_get_obj_by_type(topo, HWLOC_OBJ_NUMANODE, (unsigned)i);

        t->numa[i].id = obj ? (int)obj->os_index : i;
        if (!obj)
            continue;
        if (obj->cpuset)
            hwloc_bitmap_list_snprintf(t->numa[i].cpus, sizeof(t->numa[i].cpus), obj->cpuset);
        t->numa[i].memory = obj->attr->numanode.local_memory;
    }
    return 0;
}

static int hwloc_open(const char *xml_path, hwloc_topology_t *topo_p)
{
    hwloc_topology_t topo;
    int err;

    if (hwloc_topology_init(&topo) < 0)
        return mc__set_error(-ENOMEM, "topology: hwloc_topology_init failed");
    hwloc_topology_set_io_types_filter(topo, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
    if (xml_path && hwloc_topology_set_xml(topo, xml_path) < 0) {
        err = mc__set_error(-MC_ECONFIG, "topology file %s: %s", xml_path, strerror(errno));
        goto err_destroy;
    }
    if (hwloc_topology_load(topo) < 0) {
        err =
            mc__set_error(xml_path ? -MC_ECONFIG : -MC_ENODEV, "topology %s: hwloc cannot load it",
                          xml_path ? xml_path : "of this host");
        goto err_destroy;
    }
    *topo_p = topo;
    return 0;

err_destroy:
    hwloc_topology_destroy(topo);
    return err;
}

/* --- sysfs: interfaces and RDMA devices hwloc does not show (veth, ifb, rxe) --- */

/* Fill pci and pci_path from the realpath of /sys/class/<cls>/<name>/device:
 * /sys/devices/pci0000:00/0000:00:03.0/virtio0 gives "0000:00:03.0" and
 * "pci0000:00/0000:00:03.0". */
static void sysfs_pci_info(const char *cls, mc_topo_dev_t *dev)
{
    char link[PATH_MAX], real[PATH_MAX];
    char *save = NULL, *elem;
    size_t off = 0;

    snprintf(link, sizeof(link), "/sys/class/%s/%s/device", cls, dev->name);
    if (!realpath(link, real) || strncmp(real, "/sys/devices/pci", 16))
        return;
    for (elem = strtok_r(real + 13, "/", &save); elem; elem = strtok_r(NULL, "/", &save)) {
        unsigned d, bus, slot, fn;
        int is_pci = sscanf(elem, "%x:%x:%x.%x", &d, &bus, &slot, &fn) == 4;

        if (strncmp(elem, "pci", 3) && !is_pci)
            break;
        if (is_pci)
            snprintf(dev->pci, sizeof(dev->pci), "%s", elem);
        if (off < sizeof(dev->pci_path))
            off += snprintf(dev->pci_path + off, sizeof(dev->pci_path) - off, "%s%s",
                            off ? "/" : "", elem);
    }
}

static int sysfs_collect_class(topo_build_t *b, const char *cls, int kind)
{
    char path[PATH_MAX];
    struct dirent *de;
    DIR *dir;
    int rc = 0;

    snprintf(path, sizeof(path), "/sys/class/%s", cls);
    dir = opendir(path);
    if (!dir)
        return 0; /* no such class here: nothing to add */
    while (!rc && (de = readdir(dir))) {
        mc_topo_dev_t dev = {.kind = kind, .gpu_index = -1};
        size_t len = strlen(de->d_name);

        if (de->d_name[0] == '.' || !strcmp(de->d_name, "lo") || len >= sizeof(dev.name) ||
            mc__topo_find(b->t, de->d_name))
            continue;
        /* memcpy, not snprintf: the length is checked above, yet gcc in Debug builds warns
         * (-Werror) that d_name[256] may not fit. */
        memcpy(dev.name, de->d_name, len + 1);
        sysfs_pci_info(cls, &dev);
        snprintf(path, sizeof(path), "/sys/class/%s/%s/device/numa_node", cls, de->d_name);
        dev.numa = sysfs_read_int(path, 0);
        rc = topo_add_dev(b, &dev);
    }
    closedir(dir);
    return rc;
}

static void addrs_append(mc_topo_dev_t *dev, const struct sockaddr *sa)
{
    char buf[INET6_ADDRSTRLEN];
    const void *src = sa->sa_family == AF_INET
                          ? (const void *)&((const struct sockaddr_in *)sa)->sin_addr
                          : (const void *)&((const struct sockaddr_in6 *)sa)->sin6_addr;
    size_t len = strlen(dev->addrs);

    if (!inet_ntop(sa->sa_family, src, buf, sizeof(buf)))
        return;
    if (len + strlen(buf) + 2 > sizeof(dev->addrs))
        return; /* keep the ones that fit */
    snprintf(dev->addrs + len, sizeof(dev->addrs) - len, "%s%s", len ? "," : "", buf);
}

static void collect_addrs(mc_topo_t *t)
{
    struct ifaddrs *ifa_list, *ifa;

    if (getifaddrs(&ifa_list) < 0) {
        mc_warn("topology: getifaddrs: %s", strerror(errno));
        return;
    }
    for (ifa = ifa_list; ifa; ifa = ifa->ifa_next) {
        mc_topo_dev_t *dev = (mc_topo_dev_t *)mc__topo_find(t, ifa->ifa_name);

        if (!dev || dev->kind != MC_DEV_NET || !ifa->ifa_addr)
            continue;
        if (ifa->ifa_addr->sa_family == AF_INET || ifa->ifa_addr->sa_family == AF_INET6)
            addrs_append(dev, ifa->ifa_addr);
    }
    freeifaddrs(ifa_list);
}

/* --- libibverbs: RDMA devices without a sysfs entry (a userspace device such as softverbs) --- */

static int verbs_collect_devs(topo_build_t *b)
{
    struct ibv_device **list;
    char path[PATH_MAX];
    int n = 0, rc = 0;

    list = ibv_get_device_list(&n);
    if (!list)
        return 0; /* verbs unusable here (no uverbs, no permission): nothing to add */
    for (int i = 0; !rc && i < n; i++) {
        const char *name = ibv_get_device_name(list[i]);
        mc_topo_dev_t dev = {.kind = MC_DEV_RDMA, .gpu_index = -1};

        if (!name || strlen(name) >= sizeof(dev.name) || mc__topo_find(b->t, name))
            continue; /* found by hwloc or sysfs already */
        memcpy(dev.name, name, strlen(name) + 1);
        snprintf(path, sizeof(path), "/sys/class/infiniband/%s/device/numa_node", name);
        dev.numa = sysfs_read_int(path, 0);
        rc = topo_add_dev(b, &dev);
    }
    ibv_free_device_list(list);
    return rc;
}

/* --- CUDA --- */

#if MC_HAVE_CUDA
static int cuda_collect_gpus(topo_build_t *b, hwloc_topology_t topo)
{
    const char *why;
    int n = 0;

    if (!mc__cudart_available(&why)) {
        snprintf(b->t->gpu_note, sizeof(b->t->gpu_note), "no CUDA device (%s)", why);
        return 0;
    }
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n <= 0) {
        snprintf(b->t->gpu_note, sizeof(b->t->gpu_note), "no CUDA device (%s)",
                 e != cudaSuccess ? cudaGetErrorString(e) : "none visible");
        return 0;
    }
    for (int i = 0; i < n; i++) {
        mc_topo_dev_t dev = {.kind = MC_DEV_GPU, .gpu_index = i};
        hwloc_obj_t pci;
        int rc;

        snprintf(dev.name, sizeof(dev.name), "cuda%d", i);
        if (cudaDeviceGetPCIBusId(dev.pci, sizeof(dev.pci), i) == cudaSuccess) {
            for (char *p = dev.pci; *p; p++)
                *p = (char)tolower((unsigned char)*p);
            pci = hwloc_get_pcidev_by_busidstring(topo, dev.pci);
            if (pci)
                hwloc_fill_dev(b, topo, pci, &dev);
            else
                dev.numa = sysfs_pci_numa(dev.pci);
        }
        rc = topo_add_dev(b, &dev);
        if (rc < 0)
            return rc;
    }
    return 0;
}
#else
static int cuda_collect_gpus(topo_build_t *b, hwloc_topology_t topo)
{
    (void)topo;
    snprintf(b->t->gpu_note, sizeof(b->t->gpu_note), "no CUDA device (built without CUDA)");
    return 0;
}
#endif

static int topo_collect_live(topo_build_t *b, hwloc_topology_t topo)
{
    int rc;

    rc = sysfs_collect_class(b, "net", MC_DEV_NET);
    if (!rc)
        rc = sysfs_collect_class(b, "infiniband", MC_DEV_RDMA);
    if (!rc)
        rc = verbs_collect_devs(b);
    if (!rc && !mc__topo_count(b->t, MC_DEV_GPU))
        rc = cuda_collect_gpus(b, topo);
    if (!rc)
        collect_addrs(b->t);
    return rc;
}

int mc__topo_discover(const char *xml_path, mc_topo_t **topo_p)
{
    topo_build_t b = {.live = xml_path == NULL};
    hwloc_topology_t topo = NULL;
    int rc;

    b.t = calloc(1, sizeof(*b.t));
    if (!b.t)
        return mc__set_error(-ENOMEM, "topology: out of memory");
    rc = hwloc_open(xml_path, &topo);
    if (rc < 0)
        goto err_free;
    rc = hwloc_collect_numa(&b, topo);
    if (!rc)
        rc = hwloc_collect_devs(&b, topo);
    if (!rc && b.live)
        rc = topo_collect_live(&b, topo);
    else if (!rc && !mc__topo_count(b.t, MC_DEV_GPU))
        snprintf(b.t->gpu_note, sizeof(b.t->gpu_note), "no CUDA device in %s", xml_path);
    hwloc_topology_destroy(topo);
    if (rc < 0)
        goto err_free;
    *topo_p = b.t;
    return 0;

err_free:
    mc__topo_free(b.t);
    return rc;
}

void mc__topo_free(mc_topo_t *t)
{
    if (!t)
        return;
    mc__topo_matrix_free(t->matrix);
    free(t->devs);
    free(t->numa);
    free(t);
}

/* --- JSON for mooncake-info --- */

static const char *kind_name(int kind)
{
    return kind == MC_DEV_NET ? "net" : kind == MC_DEV_RDMA ? "rdma" : "gpu";
}

static json_t *dev_json(const mc_topo_dev_t *d)
{
    json_t *addrs = json_array();
    char buf[MC_TOPO_ADDRS_MAX], *save = NULL;

    snprintf(buf, sizeof(buf), "%s", d->addrs);
    for (char *a = strtok_r(buf, ",", &save); a; a = strtok_r(NULL, ",", &save))
        json_array_append_new(addrs, json_string(a));
    return json_pack("{s:s, s:s, s:s, s:i, s:s, s:o}", "name", d->name, "kind", kind_name(d->kind),
                     "pci", d->pci, "numa", d->numa, "pci_path", d->pci_path, "addrs", addrs);
}

static json_t *topo_to_jansson(const mc_topo_t *t)
{
    json_t *numa = json_array(), *devs = json_array(), *gpus = json_array();
    json_t *matrix = NULL;
    char *mtext;

    for (int i = 0; i < t->n_numa; i++)
        json_array_append_new(numa,
                              json_pack("{s:i, s:s, s:I}", "id", t->numa[i].id, "cpus",
                                        t->numa[i].cpus, "memory", (json_int_t)t->numa[i].memory));
    for (size_t i = 0; i < t->n_devs; i++)
        json_array_append_new(t->devs[i].kind == MC_DEV_GPU ? gpus : devs, dev_json(&t->devs[i]));
    if (t->matrix && !mc__topo_matrix_to_json(t->matrix, &mtext)) {
        matrix = json_loads(mtext, 0, NULL);
        free(mtext);
    }
    return json_pack("{s:o, s:o, s:o, s:s, s:o}", "numa_nodes", numa, "devices", devs, "gpus", gpus,
                     "gpu_note", t->gpu_note, "matrix", matrix ? matrix : json_object());
}

int mc__topo_json(const mc_topo_t *t, char **json_p)
{
    json_t *root = topo_to_jansson(t);
    char *text;

    if (!root)
        return mc__set_error(-ENOMEM, "topology: out of memory");
    text = json_dumps(root, JSON_COMPACT);
    json_decref(root);
    if (!text)
        return mc__set_error(-ENOMEM, "topology: out of memory");
    *json_p = text;
    return 0;
}
