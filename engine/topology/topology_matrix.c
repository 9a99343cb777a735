/*
 * The NIC priority matrix: computed from a topology, read from MC_NIC_PRIORITY_MATRIX, or
 * parsed from a peer's descriptor.
 *
 * Computed rows: "cpu:N" prefers the devices on NUMA node N; "cuda:N" prefers, among the
 * devices on its GPU's NUMA node, those with the shortest PCIe path to the GPU (the hops up to
 * their deepest common bridge and down again), so a GPU behind a PCIe switch prefers the NIC
 * behind the same switch. Every device not preferred is available.
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "mooncake/error.h"
#include "topology.h"
#include "util/log.h"

#define ENV_MATRIX  "MC_NIC_PRIORITY_MATRIX"
#define ENV_DEVICES "MC_DEVICES"
#define DIST_NONE   INT_MAX

typedef struct dev_set {
    const mc_topo_dev_t **v;
    size_t n;
} dev_set_t;

/* --- matrix storage --- */

static void loc_clear(mc_topo_loc_t *loc)
{
    for (size_t i = 0; i < loc->n_preferred; i++)
        free((char *)loc->preferred[i]);
    for (size_t i = 0; i < loc->n_available; i++)
        free((char *)loc->available[i]);
    free(loc->preferred);
    free(loc->available);
    free(loc->location);
}

void mc__topo_matrix_free(mc_topo_matrix_t *m)
{
    if (!m)
        return;
    for (size_t i = 0; i < m->n_locs; i++)
        loc_clear(&m->locs[i]);
    free(m->locs);
    free(m);
}

static int list_push(const char ***v, size_t *n, const char *name)
{
    const char **nv = realloc(*v, (*n + 1) * sizeof(*nv));
    char *copy;

    if (!nv)
        return -ENOMEM;
    *v = nv;
    copy = strdup(name);
    if (!copy)
        return -ENOMEM;
    nv[(*n)++] = copy;
    return 0;
}

/* Append an empty row; returns it, or NULL when out of memory. */
static mc_topo_loc_t *matrix_add_loc(mc_topo_matrix_t *m, const char *location)
{
    mc_topo_loc_t *locs = realloc(m->locs, (m->n_locs + 1) * sizeof(*locs));
    mc_topo_loc_t *loc;

    if (!locs)
        return NULL;
    m->locs = locs;
    loc = &locs[m->n_locs];
    memset(loc, 0, sizeof(*loc));
    loc->location = strdup(location);
    if (!loc->location)
        return NULL;
    m->n_locs++;
    return loc;
}

const mc_topo_loc_t *mc__topo_matrix_find(const mc_topo_matrix_t *m, const char *location)
{
    for (size_t i = 0; m && i < m->n_locs; i++)
        if (!strcmp(m->locs[i].location, location))
            return &m->locs[i];
    return NULL;
}

/* --- JSON --- */

static json_t *list_json(const char **v, size_t n)
{
    json_t *a = json_array();

    for (size_t i = 0; a && i < n; i++)
        if (json_array_append_new(a, json_string(v[i])) < 0) {
            json_decref(a);
            return NULL;
        }
    return a;
}

int mc__topo_matrix_to_json(const mc_topo_matrix_t *m, char **json_p)
{
    json_t *root = json_object();
    char *text = NULL;

    for (size_t i = 0; root && i < m->n_locs; i++) {
        const mc_topo_loc_t *loc = &m->locs[i];
        json_t *row = json_pack("[o, o]", list_json(loc->preferred, loc->n_preferred),
                                list_json(loc->available, loc->n_available));

        if (!row || json_object_set_new(root, loc->location, row) < 0)
            break;
    }
    if (root && json_object_size(root) == m->n_locs)
        text = json_dumps(root, JSON_COMPACT);
    json_decref(root);
    if (!text)
        return mc__set_error(-ENOMEM, "topology: out of memory");
    *json_p = text;
    return 0;
}

/* "cpu:0", "cuda:7": a word, a colon, a decimal number. */
static int location_valid(const char *s)
{
    const char *colon = strchr(s, ':');

    if (!colon || colon == s || !colon[1] || strlen(s) >= MC_TOPO_NAME_MAX)
        return 0;
    for (const char *p = colon + 1; *p; p++)
        if (*p < '0' || *p > '9')
            return 0;
    return 1;
}

static int parse_list(json_t *arr, const char ***v, size_t *n)
{
    size_t i;
    json_t *el;

    if (!json_is_array(arr))
        return -MC_ECONFIG;
    json_array_foreach(arr, i, el)
    {
        const char *s = json_string_value(el);

        if (!s || !*s || strlen(s) >= MC_TOPO_NAME_MAX)
            return -MC_ECONFIG;
        if (list_push(v, n, s) < 0)
            return -ENOMEM;
    }
    return 0;
}

/* A row is [[preferred...], [available...]]; the second list may be left out. */
static int parse_row(mc_topo_matrix_t *m, const char *what, const char *key, json_t *row)
{
    mc_topo_loc_t *loc;
    size_t len = json_is_array(row) ? json_array_size(row) : 0;
    int rc;

    if (!location_valid(key))
        return mc__set_error(-MC_ECONFIG, "%s: bad location \"%s\" (want cpu:N or cuda:N)", what,
                             key);
    if (len < 1 || len > 2)
        return mc__set_error(-MC_ECONFIG, "%s: \"%s\" must be [[preferred...], [available...]]",
                             what, key);
    loc = matrix_add_loc(m, key);
    if (!loc)
        return mc__set_error(-ENOMEM, "topology: out of memory");
    rc = parse_list(json_array_get(row, 0), &loc->preferred, &loc->n_preferred);
    if (!rc && len == 2)
        rc = parse_list(json_array_get(row, 1), &loc->available, &loc->n_available);
    if (rc == -ENOMEM)
        return mc__set_error(-ENOMEM, "topology: out of memory");
    if (rc < 0)
        return mc__set_error(rc, "%s: \"%s\": each list must hold device names (strings)", what,
                             key);
    return 0;
}

int mc__topo_matrix_parse(const char *json, const char *what, mc_topo_matrix_t **m_p)
{
    json_error_t jerr;
    json_t *root = json_loads(json, JSON_REJECT_DUPLICATES, &jerr);
    mc_topo_matrix_t *m;
    const char *key;
    json_t *row;
    int rc = 0;

    if (!root)
        return mc__set_error(-MC_ECONFIG, "%s: invalid JSON at line %d column %d: %s", what,
                             jerr.line, jerr.column, jerr.text);
    if (!json_is_object(root)) {
        json_decref(root);
        return mc__set_error(-MC_ECONFIG, "%s: must be a JSON object {\"cpu:0\": [[...], [...]]}",
                             what);
    }
    m = calloc(1, sizeof(*m));
    if (!m) {
        json_decref(root);
        return mc__set_error(-ENOMEM, "topology: out of memory");
    }
    json_object_foreach(root, key, row)
    {
        rc = parse_row(m, what, key, row);
        if (rc < 0)
            break;
    }
    json_decref(root);
    if (rc < 0) {
        mc__topo_matrix_free(m);
        return rc;
    }
    *m_p = m;
    return 0;
}

/* --- building from a topology --- */

static int set_has(const dev_set_t *s, const mc_topo_dev_t *d)
{
    for (size_t i = 0; i < s->n; i++)
        if (s->v[i] == d)
            return 1;
    return 0;
}

/* Hops between two devices through their deepest common PCIe ancestor; DIST_NONE when either
 * has no PCIe path. Paths from different root complexes meet at the CPU. */
static int pci_distance(const char *a, const char *b)
{
    int la = 1, lb = 1, common = 0;

    if (!*a || !*b)
        return DIST_NONE;
    for (const char *p = a; *p; p++)
        la += *p == '/';
    for (const char *p = b; *p; p++)
        lb += *p == '/';
    while (*a && *b) {
        size_t na = strcspn(a, "/"), nb = strcspn(b, "/");

        if (na != nb || memcmp(a, b, na))
            break;
        common++;
        a += na + (a[na] == '/');
        b += nb + (b[nb] == '/');
    }
    return la + lb - 2 * common;
}

static int row_fill(mc_topo_loc_t *loc, const dev_set_t *cand, const dev_set_t *pref)
{
    for (size_t i = 0; i < cand->n; i++) {
        const mc_topo_dev_t *d = cand->v[i];
        int rc = set_has(pref, d) ? list_push(&loc->preferred, &loc->n_preferred, d->name)
                                  : list_push(&loc->available, &loc->n_available, d->name);

        if (rc < 0)
            return rc;
    }
    return 0;
}

static int row_cpu(mc_topo_matrix_t *m, const dev_set_t *cand, int node, const dev_set_t *tmp)
{
    dev_set_t pref = {tmp->v, 0};
    char location[32];
    mc_topo_loc_t *loc;

    for (size_t i = 0; i < cand->n; i++)
        if (cand->v[i]->numa == node)
            pref.v[pref.n++] = cand->v[i];
    snprintf(location, sizeof(location), "cpu:%d", node);
    loc = matrix_add_loc(m, location);
    return loc ? row_fill(loc, cand, &pref) : -ENOMEM;
}

static int row_gpu(mc_topo_matrix_t *m, const dev_set_t *cand, const mc_topo_dev_t *gpu,
                   const dev_set_t *tmp)
{
    dev_set_t pref = {tmp->v, 0};
    int best = DIST_NONE;
    char location[32];
    mc_topo_loc_t *loc;

    for (size_t i = 0; i < cand->n; i++) {
        int dist = pci_distance(gpu->pci_path, cand->v[i]->pci_path);

        if (cand->v[i]->numa == gpu->numa && dist < best)
            best = dist;
    }
    for (size_t i = 0; i < cand->n; i++)
        if (cand->v[i]->numa == gpu->numa &&
            pci_distance(gpu->pci_path, cand->v[i]->pci_path) == best)
            pref.v[pref.n++] = cand->v[i];
    snprintf(location, sizeof(location), "cuda:%d", gpu->gpu_index);
    loc = matrix_add_loc(m, location);
    return loc ? row_fill(loc, cand, &pref) : -ENOMEM;
}

static int gpu_cmp(const void *a, const void *b)
{
    const mc_topo_dev_t *x = *(const mc_topo_dev_t *const *)a;
    const mc_topo_dev_t *y = *(const mc_topo_dev_t *const *)b;

    return (x->gpu_index > y->gpu_index) - (x->gpu_index < y->gpu_index);
}

static int matrix_compute(const mc_topo_t *t, const dev_set_t *cand, mc_topo_matrix_t *m)
{
    dev_set_t tmp = {calloc(t->n_devs + 1, sizeof(*tmp.v)), 0};
    dev_set_t gpus = {calloc(t->n_devs + 1, sizeof(*gpus.v)), 0};
    int rc = tmp.v && gpus.v ? 0 : -ENOMEM;

    for (int i = 0; !rc && i < t->n_numa; i++)
        rc = row_cpu(m, cand, t->numa[i].id, &tmp);
    /* GPUs in CUDA ordinal order, whatever order discovery found them in. */
    for (size_t i = 0; !rc && i < t->n_devs; i++)
        if (t->devs[i].kind == MC_DEV_GPU)
            gpus.v[gpus.n++] = &t->devs[i];
    if (!rc)
        qsort(gpus.v, gpus.n, sizeof(*gpus.v), gpu_cmp);
    for (size_t i = 0; !rc && i < gpus.n; i++)
        rc = row_gpu(m, cand, gpus.v[i], &tmp);
    free(gpus.v);
    free(tmp.v);
    return rc < 0 ? mc__set_error(rc, "topology: out of memory") : 0;
}

/* Without MC_DEVICES: the RDMA devices, else the network interfaces. On a live host an
 * interface without any address (down, ifb, a bridge port) cannot carry tcp, so it is left out
 * unless no interface has one; MC_DEVICES can still name it. */
static int cand_default(const mc_topo_t *t, dev_set_t *cand)
{
    int kind = mc__topo_count(t, MC_DEV_RDMA) ? MC_DEV_RDMA : MC_DEV_NET;
    int any_addr = 0;

    for (size_t i = 0; i < t->n_devs; i++)
        any_addr |= t->devs[i].kind == MC_DEV_NET && t->devs[i].addrs[0];
    for (size_t i = 0; i < t->n_devs; i++)
        if (t->devs[i].kind == kind && (kind != MC_DEV_NET || !any_addr || t->devs[i].addrs[0]))
            cand->v[cand->n++] = &t->devs[i];
    return 0;
}

static int cand_filter(const mc_topo_t *t, const char *filter, dev_set_t *cand)
{
    char *copy = strdup(filter), *save = NULL;
    int rc = copy ? 0 : mc__set_error(-ENOMEM, "topology: out of memory");

    for (char *tok = copy ? strtok_r(copy, ",", &save) : NULL; tok && !rc;
         tok = strtok_r(NULL, ",", &save)) {
        const mc_topo_dev_t *d;
        char *end = tok + strlen(tok);

        while (*tok == ' ' || *tok == '\t')
            tok++;
        while (end > tok && (end[-1] == ' ' || end[-1] == '\t'))
            *--end = '\0';
        if (!*tok)
            continue;
        d = mc__topo_find(t, tok);
        if (!d)
            rc = mc__set_error(-MC_ECONFIG, ENV_DEVICES ": unknown device \"%s\"", tok);
        else if (d->kind == MC_DEV_GPU)
            rc = mc__set_error(-MC_ECONFIG, ENV_DEVICES ": \"%s\" is a GPU, not a NIC", tok);
        else if (!set_has(cand, d))
            cand->v[cand->n++] = d;
    }
    free(copy);
    return rc;
}

static int read_file(const char *path, char **text_p)
{
    FILE *f = fopen(path, "r");
    char *text = NULL;
    size_t len = 0, cap = 0, got;

    if (!f)
        return mc__set_error(-MC_ECONFIG, ENV_MATRIX ": cannot open @%s: %s", path,
                             strerror(errno));
    do {
        if (cap - len < 4096) {
            char *nt = realloc(text, cap + 65536);

            if (!nt) {
                free(text);
                fclose(f);
                return mc__set_error(-ENOMEM, "topology: out of memory");
            }
            text = nt;
            cap += 65536;
        }
        got = fread(text + len, 1, cap - len - 1, f);
        len += got;
    } while (got > 0);
    fclose(f);
    text[len] = '\0';
    *text_p = text;
    return 0;
}

/* Check the override's device names against t, and drop those MC_DEVICES leaves out. */
static int override_check_list(const mc_topo_t *t, const char *location, const char **v, size_t *n,
                               const dev_set_t *filter)
{
    size_t kept = 0;

    for (size_t i = 0; i < *n; i++) {
        const mc_topo_dev_t *d = mc__topo_find(t, v[i]);

        if (!d || d->kind == MC_DEV_GPU)
            return mc__set_error(-MC_ECONFIG, ENV_MATRIX ": unknown device \"%s\" in \"%s\"", v[i],
                                 location);
        if (filter && !set_has(filter, d)) {
            free((char *)v[i]);
            continue;
        }
        v[kept++] = v[i];
    }
    *n = kept;
    return 0;
}

static int matrix_override(const mc_topo_t *t, const char *override, const dev_set_t *filter,
                           mc_topo_matrix_t **m_p)
{
    char *text = NULL;
    mc_topo_matrix_t *m;
    int rc;

    if (override[0] == '@') {
        rc = read_file(override + 1, &text);
        if (rc < 0)
            return rc;
    }
    rc = mc__topo_matrix_parse(text ? text : override, ENV_MATRIX, &m);
    free(text);
    if (rc < 0)
        return rc;
    for (size_t i = 0; !rc && i < m->n_locs; i++) {
        mc_topo_loc_t *loc = &m->locs[i];

        rc = override_check_list(t, loc->location, loc->preferred, &loc->n_preferred, filter);
        if (!rc)
            rc = override_check_list(t, loc->location, loc->available, &loc->n_available, filter);
    }
    if (rc < 0) {
        mc__topo_matrix_free(m);
        return rc;
    }
    *m_p = m;
    return 0;
}

int mc__topo_matrix_build(mc_topo_t *t, const char *devices_filter, const char *override)
{
    dev_set_t cand = {calloc(t->n_devs + 1, sizeof(*cand.v)), 0};
    int filtered = devices_filter && *devices_filter;
    mc_topo_matrix_t *m = NULL;
    int rc;

    if (!cand.v)
        return mc__set_error(-ENOMEM, "topology: out of memory");
    rc = filtered ? cand_filter(t, devices_filter, &cand) : cand_default(t, &cand);
    if (rc < 0)
        goto out;
    if (override && *override) {
        rc = matrix_override(t, override, filtered ? &cand : NULL, &m);
    } else {
        m = calloc(1, sizeof(*m));
        rc = m ? matrix_compute(t, &cand, m) : mc__set_error(-ENOMEM, "topology: out of memory");
    }
    if (rc < 0) {
        mc__topo_matrix_free(m);
        goto out;
    }
    mc__topo_matrix_free(t->matrix);
    t->matrix = m;
out:
    free(cand.v);
    return rc;
}

int mc__topo_matrix_build_env(mc_topo_t *t)
{
    return mc__topo_matrix_build(t, getenv(ENV_DEVICES), getenv(ENV_MATRIX));
}

int mc__topo_matrix_json(const mc_topo_t *t, char **json_p)
{
    if (!t->matrix)
        return mc__set_error(-EINVAL, "topology: the priority matrix is not built");
    return mc__topo_matrix_to_json(t->matrix, json_p);
}

int mc__topo_matrix_get(const mc_topo_t *t, const char *location, const char ***preferred_p,
                        size_t *np, const char ***available_p, size_t *na)
{
    const mc_topo_loc_t *loc;

    if (!t->matrix)
        return mc__set_error(-EINVAL, "topology: the priority matrix is not built");
    loc = mc__topo_matrix_find(t->matrix, location);
    if (!loc)
        return mc__set_error(-ENOENT, "topology: no location \"%s\" in the priority matrix",
                             location);
    *preferred_p = loc->preferred;
    *np = loc->n_preferred;
    *available_p = loc->available;
    *na = loc->n_available;
    return 0;
}
