/*
 * Host topology and the NIC priority matrix (internal).
 *
 * mc__topo_discover() finds NUMA nodes, network interfaces, RDMA devices and GPUs with hwloc
 * (libnuma and sysfs fill in what hwloc does not say; the CUDA runtime adds GPUs when the build
 * has it and a device is visible). mc__topo_matrix_build() then derives the priority matrix
 *
 *     {"cpu:0":  [["mlx5_0","mlx5_1"], ["mlx5_2","mlx5_3"]],
 *      "cuda:0": [["mlx5_0"],          ["mlx5_1","mlx5_2","mlx5_3"]], ...}
 *
 * where, for each location, the first list holds the preferred devices (same NUMA node; for a
 * GPU, the closest of those by PCIe path) and the second the other available ones. The matrix
 * is what the segment descriptor publishes, so a peer can pick its own side as well; peers
 * parse it back with mc__topo_matrix_parse().
 *
 * Objects here are plain data: no locking; a topology is used by one thread at a time or
 * read-only after it is built.
 */
#ifndef MC_ENGINE_TOPOLOGY_H
#define MC_ENGINE_TOPOLOGY_H

#include <stddef.h>

enum {
    MC_DEV_NET = 1,  /* a network interface (eth0, ib0): usable by tcp */
    MC_DEV_RDMA = 2, /* an RDMA device (mlx5_0): usable by verbs */
    MC_DEV_GPU = 3,  /* a CUDA device ("cuda0") */
};

#define MC_TOPO_NAME_MAX  64
#define MC_TOPO_PCI_MAX   32
#define MC_TOPO_PATH_MAX  256
#define MC_TOPO_ADDRS_MAX 512

typedef struct mc_topo_dev {
    char name[MC_TOPO_NAME_MAX]; /* "eth0", "mlx5_0", "cuda0" */
    int kind;                    /* MC_DEV_* */
    char pci[MC_TOPO_PCI_MAX];   /* "0000:11:00.0", or "" for a virtual device */
    int numa;                    /* NUMA node os index (0 when unknown) */
    int gpu_index;               /* CUDA ordinal for MC_DEV_GPU, else -1 */
    /* PCIe path from the root complex, "pci0000:00/0000:00:01.0/0000:11:00.0" ("" if none):
     * the GPU-to-NIC distance is counted on it. */
    char pci_path[MC_TOPO_PATH_MAX];
    /* Addresses of a live network interface, comma-separated ("10.0.0.1,fe80::1"); empty
     * for RDMA devices, GPUs and topologies loaded from XML. */
    char addrs[MC_TOPO_ADDRS_MAX];
} mc_topo_dev_t;

typedef struct mc_topo_numa {
    int id;                    /* os index, as in "cpu:N" */
    char cpus[64];             /* cpu list, "0-15,32-47" */
    unsigned long long memory; /* bytes of local memory, 0 when unknown */
} mc_topo_numa_t;

/* One matrix row: location "cpu:N" or "cuda:N" and its two device lists. */
typedef struct mc_topo_loc {
    char *location;
    const char **preferred; /* strings owned by the matrix */
    size_t n_preferred;
    const char **available;
    size_t n_available;
} mc_topo_loc_t;

typedef struct mc_topo_matrix {
    mc_topo_loc_t *locs;
    size_t n_locs;
} mc_topo_matrix_t;

typedef struct mc_topo {
    mc_topo_numa_t *numa;
    int n_numa;
    mc_topo_dev_t *devs;
    size_t n_devs;
    /* Why there are no GPUs, for mooncake-info: "no CUDA device (<CUDA's reason>)",
     * "no CUDA device (built without CUDA)", "no CUDA device in FILE"; "" when GPUs were found. */
    char gpu_note[128];
    mc_topo_matrix_t *matrix; /* NULL until mc__topo_matrix_build() */
} mc_topo_t;

/* Discover the topology. xml_path NULL: this host (hwloc with I/O devices, sysfs network
 * interfaces other than lo and their addresses from getifaddrs, RDMA devices from sysfs and
 * from libibverbs' device list (userspace devices such as softverbs have no sysfs entry: NUMA
 * node 0, no PCI address), CUDA devices when built with CUDA). xml_path set: load that hwloc XML
 * file instead (tests, mooncake-info --topology); GPUs are the CUDA OS devices ("cudaN") written in
 * it. On success *topo_p is a new topology to free with mc__topo_free(); it has no matrix yet.
 * Returns 0, -ENOMEM, or -MC_ECONFIG / -MC_ENODEV when hwloc cannot load the file or the host. */
int mc__topo_discover(const char *xml_path, mc_topo_t **topo_p);

/* Free a topology and its matrix. NULL is accepted. */
void mc__topo_free(mc_topo_t *t);

/* Find a device by name; NULL if unknown. The pointer lives as long as t. */
const mc_topo_dev_t *mc__topo_find(const mc_topo_t *t, const char *name);

/* Number of devices of one kind. */
size_t mc__topo_count(const mc_topo_t *t, int kind);

/* (Re)build t's matrix. devices_filter is MC_DEVICES (comma-separated device names, NULL or ""
 * for all): the matrix then uses exactly those devices, each of which must be a network or RDMA
 * device of t. Without it the matrix uses the RDMA devices, or the network interfaces when there
 * is no RDMA device. override is MC_NIC_PRIORITY_MATRIX (a JSON matrix, or "@FILE" naming a
 * file that holds one; NULL or "" to compute it): its devices must exist in t, and a filter
 * still removes the devices it does not name. On failure the previous matrix is kept.
 * Returns 0, -ENOMEM, or -MC_ECONFIG with a reason naming the variable. */
int mc__topo_matrix_build(mc_topo_t *t, const char *devices_filter, const char *override);

/* Convenience: mc__topo_matrix_build() with getenv("MC_DEVICES") and
 * getenv("MC_NIC_PRIORITY_MATRIX"). */
int mc__topo_matrix_build_env(mc_topo_t *t);

/* t's matrix as compact JSON, malloc'ed, for the caller to free(). -EINVAL if not built. */
int mc__topo_matrix_json(const mc_topo_t *t, char **json_p);

/* Look up one location of t's matrix. The arrays and strings belong to the matrix and stay
 * valid until it is rebuilt or t is freed. Returns 0, -EINVAL if not built, -ENOENT if the
 * location is not in the matrix. */
int mc__topo_matrix_get(const mc_topo_t *t, const char *location, const char ***preferred_p,
                        size_t *np, const char ***available_p, size_t *na);

/* Everything (NUMA nodes, devices, GPUs, matrix when built) as one JSON object, malloc'ed;
 * the caller frees it. Returns 0 or -ENOMEM. */
int mc__topo_json(const mc_topo_t *t, char **json_p);

/* --- Matrices on their own (a peer's, from its segment descriptor) --- */

/* Parse a matrix from JSON text. what names its source in error reasons
 * ("MC_NIC_PRIORITY_MATRIX", "peer descriptor"). Device names are not checked. On success
 * *m_p is a new matrix for mc__topo_matrix_free(). Returns 0, -ENOMEM or -MC_ECONFIG. */
int mc__topo_matrix_parse(const char *json, const char *what, mc_topo_matrix_t **m_p);

/* Free a matrix. NULL is accepted. */
void mc__topo_matrix_free(mc_topo_matrix_t *m);

/* Serialize a matrix as compact JSON, malloc'ed. Returns 0 or -ENOMEM. */
int mc__topo_matrix_to_json(const mc_topo_matrix_t *m, char **json_p);

/* Find a row; NULL if the location is absent. */
const mc_topo_loc_t *mc__topo_matrix_find(const mc_topo_matrix_t *m, const char *location);

#endif
