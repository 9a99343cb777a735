/*
 * Topology discovery and the NIC priority matrix, on hand-written hwloc XML topologies:
 *   two-socket.xml  2 NUMA nodes; per socket 2 PCIe switches, each with one NIC (mlx5_N + ibN)
 *                   and 2 GPUs: cuda0,1 | mlx5_0   cuda2,3 | mlx5_1   (node 0)
 *                               cuda4,5 | mlx5_2   cuda6,7 | mlx5_3   (node 1)
 *   one-socket.xml  1 NUMA node, 1 Ethernet NIC (eth0), no GPU
 *   no-nic.xml      1 NUMA node, nothing on PCI
 * plus a smoke test of discovery on the live host.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include <jansson.h>

#include "mooncake/error.h"
#include "topology/topology.h"

static const char *xml_path(const char *name)
{
    static char path[4096];
    const char *src = getenv("MC_SOURCE_DIR");

    snprintf(path, sizeof(path), "%s/tests/topology/%s", src ? src : ".", name);
    return path;
}

static mc_topo_t *load(const char *name)
{
    mc_topo_t *t = NULL;

    assert_int_equal(mc__topo_discover(xml_path(name), &t), 0);
    assert_non_null(t);
    return t;
}

static void join(const char **v, size_t n, char *buf, size_t len)
{
    buf[0] = '\0';
    for (size_t i = 0; i < n; i++) {
        size_t used = strlen(buf);

        snprintf(buf + used, len - used, "%s%s", i ? "," : "", v[i]);
    }
}

/* Assert one matrix row; lists written comma-separated, "" for empty. */
static void assert_row(const mc_topo_t *t, const char *loc, const char *pref, const char *avail)
{
    const char **p, **a;
    size_t np, na;
    char buf[512];

    assert_int_equal(mc__topo_matrix_get(t, loc, &p, &np, &a, &na), 0);
    join(p, np, buf, sizeof(buf));
    assert_string_equal(buf, pref);
    join(a, na, buf, sizeof(buf));
    assert_string_equal(buf, avail);
}

static void assert_matrix_json(const mc_topo_t *t, const char *want)
{
    char *json = NULL;

    assert_int_equal(mc__topo_matrix_json(t, &json), 0);
    assert_string_equal(json, want);
    free(json);
}

static void assert_config_error(int rc, const char *var, const char *word)
{
    assert_int_equal(rc, -MC_ECONFIG);
    assert_non_null(strstr(mc_last_error(), var));
    if (word)
        assert_non_null(strstr(mc_last_error(), word));
}

static void test_two_socket_discovery(void **state)
{
    mc_topo_t *t = load("two-socket.xml");
    const mc_topo_dev_t *d;

    (void)state;
    assert_int_equal(t->n_numa, 2);
    assert_int_equal(t->numa[1].id, 1);
    assert_string_equal(t->numa[1].cpus, "2-3");
    assert_int_equal(mc__topo_count(t, MC_DEV_NET), 4);
    assert_int_equal(mc__topo_count(t, MC_DEV_RDMA), 4);
    assert_int_equal(mc__topo_count(t, MC_DEV_GPU), 8);
    d = mc__topo_find(t, "mlx5_2");
    assert_non_null(d);
    assert_int_equal(d->kind, MC_DEV_RDMA);
    assert_string_equal(d->pci, "0000:51:00.0");
    assert_int_equal(d->numa, 1);
    assert_string_equal(d->pci_path, "pci0000:40/0000:40:01.0/0000:51:00.0");
    d = mc__topo_find(t, "cuda3");
    assert_non_null(d);
    assert_int_equal(d->kind, MC_DEV_GPU);
    assert_int_equal(d->gpu_index, 3);
    assert_string_equal(d->pci, "0000:23:00.0");
    assert_int_equal(d->numa, 0);
    assert_null(mc__topo_find(t, "mlx5_4"));
    assert_string_equal(t->gpu_note, "");
    mc__topo_free(t);
}

static void test_two_socket_matrix(void **state)
{
    mc_topo_t *t = load("two-socket.xml");

    (void)state;
    assert_int_equal(mc__topo_matrix_build(t, NULL, NULL), 0);
    assert_int_equal(t->matrix->n_locs, 10);
    assert_row(t, "cpu:0", "mlx5_0,mlx5_1", "mlx5_2,mlx5_3");
    assert_row(t, "cpu:1", "mlx5_2,mlx5_3", "mlx5_0,mlx5_1");
    assert_row(t, "cuda:0", "mlx5_0", "mlx5_1,mlx5_2,mlx5_3");
    assert_row(t, "cuda:1", "mlx5_0", "mlx5_1,mlx5_2,mlx5_3");
    assert_row(t, "cuda:2", "mlx5_1", "mlx5_0,mlx5_2,mlx5_3");
    assert_row(t, "cuda:3", "mlx5_1", "mlx5_0,mlx5_2,mlx5_3");
    assert_row(t, "cuda:4", "mlx5_2", "mlx5_0,mlx5_1,mlx5_3");
    assert_row(t, "cuda:5", "mlx5_2", "mlx5_0,mlx5_1,mlx5_3");
    assert_row(t, "cuda:6", "mlx5_3", "mlx5_0,mlx5_1,mlx5_2");
    assert_row(t, "cuda:7", "mlx5_3", "mlx5_0,mlx5_1,mlx5_2");
    assert_matrix_json(t, "{\"cpu:0\":[[\"mlx5_0\",\"mlx5_1\"],[\"mlx5_2\",\"mlx5_3\"]],"
                          "\"cpu:1\":[[\"mlx5_2\",\"mlx5_3\"],[\"mlx5_0\",\"mlx5_1\"]],"
                          "\"cuda:0\":[[\"mlx5_0\"],[\"mlx5_1\",\"mlx5_2\",\"mlx5_3\"]],"
                          "\"cuda:1\":[[\"mlx5_0\"],[\"mlx5_1\",\"mlx5_2\",\"mlx5_3\"]],"
                          "\"cuda:2\":[[\"mlx5_1\"],[\"mlx5_0\",\"mlx5_2\",\"mlx5_3\"]],"
                          "\"cuda:3\":[[\"mlx5_1\"],[\"mlx5_0\",\"mlx5_2\",\"mlx5_3\"]],"
                          "\"cuda:4\":[[\"mlx5_2\"],[\"mlx5_0\",\"mlx5_1\",\"mlx5_3\"]],"
                          "\"cuda:5\":[[\"mlx5_2\"],[\"mlx5_0\",\"mlx5_1\",\"mlx5_3\"]],"
                          "\"cuda:6\":[[\"mlx5_3\"],[\"mlx5_0\",\"mlx5_1\",\"mlx5_2\"]],"
                          "\"cuda:7\":[[\"mlx5_3\"],[\"mlx5_0\",\"mlx5_1\",\"mlx5_2\"]]}");
    assert_int_equal(mc__topo_matrix_get(t, "cuda:8", &(const char **){NULL}, &(size_t){0},
                                         &(const char **){NULL}, &(size_t){0}),
                     -ENOENT);
    mc__topo_free(t);
}

static void test_two_socket_devices_filter(void **state)
{
    mc_topo_t *t = load("two-socket.xml");

    (void)state;
    /* One NIC per socket, named with spaces around. */
    assert_int_equal(mc__topo_matrix_build(t, " mlx5_1 , mlx5_2", NULL), 0);
    assert_int_equal(t->matrix->n_locs, 10);
    assert_row(t, "cpu:0", "mlx5_1", "mlx5_2");
    assert_row(t, "cpu:1", "mlx5_2", "mlx5_1");
    for (int i = 0; i < 8; i++) {
        char loc[16];

        snprintf(loc, sizeof(loc), "cuda:%d", i);
        assert_row(t, loc, i < 4 ? "mlx5_1" : "mlx5_2", i < 4 ? "mlx5_2" : "mlx5_1");
    }
    /* Network interfaces instead of RDMA devices (tcp over IPoIB). */
    assert_int_equal(mc__topo_matrix_build(t, "ib3,ib0", NULL), 0);
    assert_row(t, "cpu:0", "ib0", "ib3");
    assert_row(t, "cpu:1", "ib3", "ib0");
    assert_row(t, "cuda:1", "ib0", "ib3");
    assert_row(t, "cuda:2", "ib0", "ib3");
    assert_row(t, "cuda:6", "ib3", "ib0");
    /* Only socket 0's NICs: socket 1's GPUs have no preferred device. */
    assert_int_equal(mc__topo_matrix_build(t, "mlx5_0,mlx5_1", NULL), 0);
    assert_row(t, "cpu:0", "mlx5_0,mlx5_1", "");
    assert_row(t, "cpu:1", "", "mlx5_0,mlx5_1");
    assert_row(t, "cuda:3", "mlx5_1", "mlx5_0");
    assert_row(t, "cuda:5", "", "mlx5_0,mlx5_1");
    /* An empty filter means all devices. */
    assert_int_equal(mc__topo_matrix_build(t, "", NULL), 0);
    assert_row(t, "cpu:0", "mlx5_0,mlx5_1", "mlx5_2,mlx5_3");
    mc__topo_free(t);
}

#define OVERRIDE "{\"cpu:0\": [[\"mlx5_3\"], [\"mlx5_0\", \"ib1\"]], \"cuda:0\": [[\"mlx5_1\"]]}"

static void test_two_socket_override(void **state)
{
    mc_topo_t *t = load("two-socket.xml");
    const char **p, **a;
    size_t np, na;

    (void)state;
    assert_int_equal(mc__topo_matrix_build(t, NULL, OVERRIDE), 0);
    assert_int_equal(t->matrix->n_locs, 2);
    assert_row(t, "cpu:0", "mlx5_3", "mlx5_0,ib1");
    assert_row(t, "cuda:0", "mlx5_1", "");
    assert_int_equal(mc__topo_matrix_get(t, "cpu:1", &p, &np, &a, &na), -ENOENT);
    assert_matrix_json(t, "{\"cpu:0\":[[\"mlx5_3\"],[\"mlx5_0\",\"ib1\"]],"
                          "\"cuda:0\":[[\"mlx5_1\"],[]]}");
    /* MC_DEVICES still restricts an override. */
    assert_int_equal(mc__topo_matrix_build(t, "mlx5_0,mlx5_1", OVERRIDE), 0);
    assert_row(t, "cpu:0", "", "mlx5_0");
    assert_row(t, "cuda:0", "mlx5_1", "");
    mc__topo_free(t);
}

static void test_override_file(void **state)
{
    char path[] = "/tmp/mc-topo-matrix-XXXXXX", arg[64];
    mc_topo_t *t = load("two-socket.xml");
    int fd = mkstemp(path);

    (void)state;
    assert_true(fd >= 0);
    assert_int_equal(write(fd, OVERRIDE, strlen(OVERRIDE)), (ssize_t)strlen(OVERRIDE));
    close(fd);
    snprintf(arg, sizeof(arg), "@%s", path);
    assert_int_equal(mc__topo_matrix_build(t, NULL, arg), 0);
    assert_row(t, "cpu:0", "mlx5_3", "mlx5_0,ib1");
    assert_row(t, "cuda:0", "mlx5_1", "");
    unlink(path);
    assert_config_error(mc__topo_matrix_build(t, NULL, arg), "MC_NIC_PRIORITY_MATRIX", path);
    /* The failed build kept the previous matrix. */
    assert_row(t, "cpu:0", "mlx5_3", "mlx5_0,ib1");
    mc__topo_free(t);
}

static void test_errors(void **state)
{
    mc_topo_t *t = load("two-socket.xml"), *none = NULL;
    const char *M = "MC_NIC_PRIORITY_MATRIX";

    (void)state;
    assert_int_equal(mc__topo_matrix_build(t, NULL, NULL), 0);
    assert_config_error(mc__topo_matrix_build(t, NULL, "{\"cpu:0\": [["), M, "invalid JSON");
    assert_config_error(mc__topo_matrix_build(t, NULL, "[[\"mlx5_0\"]]"), M, "object");
    assert_config_error(mc__topo_matrix_build(t, NULL, "{\"cpu:0\": \"mlx5_0\"}"), M, "cpu:0");
    assert_config_error(mc__topo_matrix_build(t, NULL, "{\"cpu:0\": [[1]]}"), M, "cpu:0");
    assert_config_error(mc__topo_matrix_build(t, NULL, "{\"cpu:0\": [[], [], []]}"), M, NULL);
    assert_config_error(mc__topo_matrix_build(t, NULL, "{\"gpu0\": [[], []]}"), M, "gpu0");
    assert_config_error(mc__topo_matrix_build(t, NULL, "{\"cpu:0\": [[\"mlx9\"], []]}"), M, "mlx9");
    assert_config_error(mc__topo_matrix_build(t, NULL, "{\"cpu:0\": [[\"cuda0\"], []]}"), M,
                        "cuda0");
    assert_config_error(mc__topo_matrix_build(t, "mlx5_0,eth7", NULL), "MC_DEVICES", "eth7");
    assert_config_error(mc__topo_matrix_build(t, "cuda1", NULL), "MC_DEVICES", "cuda1");
    /* The computed matrix survived every failure. */
    assert_row(t, "cpu:1", "mlx5_2,mlx5_3", "mlx5_0,mlx5_1");
    mc__topo_free(t);

    assert_int_equal(mc__topo_discover("/nonexistent/topo.xml", &none), -MC_ECONFIG);
    assert_null(none);
    assert_non_null(strstr(mc_last_error(), "/nonexistent/topo.xml"));
}

static void test_one_socket(void **state)
{
    mc_topo_t *t = load("one-socket.xml");
    const mc_topo_dev_t *d;

    (void)state;
    assert_int_equal(t->n_numa, 1);
    assert_int_equal(t->n_devs, 1);
    d = mc__topo_find(t, "eth0");
    assert_non_null(d);
    assert_int_equal(d->kind, MC_DEV_NET);
    assert_string_equal(d->pci, "0000:01:00.0");
    assert_int_equal(mc__topo_count(t, MC_DEV_GPU), 0);
    assert_non_null(strstr(t->gpu_note, "no CUDA device"));
    assert_int_equal(mc__topo_matrix_build(t, NULL, NULL), 0);
    assert_matrix_json(t, "{\"cpu:0\":[[\"eth0\"],[]]}");
    assert_int_equal(mc__topo_matrix_build(t, "eth0", NULL), 0);
    assert_row(t, "cpu:0", "eth0", "");
    assert_int_equal(mc__topo_matrix_build(t, NULL, "{\"cpu:0\":[[],[\"eth0\"]]}"), 0);
    assert_row(t, "cpu:0", "", "eth0");
    mc__topo_free(t);
}

static void test_no_nic(void **state)
{
    mc_topo_t *t = load("no-nic.xml");

    (void)state;
    assert_int_equal(t->n_numa, 1);
    assert_int_equal(t->n_devs, 0);
    assert_int_equal(mc__topo_matrix_build(t, NULL, NULL), 0);
    assert_matrix_json(t, "{\"cpu:0\":[[],[]]}");
    assert_config_error(mc__topo_matrix_build(t, "eth0", NULL), "MC_DEVICES", "eth0");
    mc__topo_free(t);
}

static void test_matrix_roundtrip(void **state)
{
    mc_topo_t *t = load("two-socket.xml");
    mc_topo_matrix_t *m = NULL;
    char *a, *b;

    (void)state;
    assert_int_equal(mc__topo_matrix_build(t, NULL, NULL), 0);
    assert_int_equal(mc__topo_matrix_json(t, &a), 0);
    assert_int_equal(mc__topo_matrix_parse(a, "peer descriptor", &m), 0);
    assert_int_equal(mc__topo_matrix_to_json(m, &b), 0);
    assert_string_equal(a, b);
    assert_non_null(mc__topo_matrix_find(m, "cuda:7"));
    assert_null(mc__topo_matrix_find(m, "cuda:8"));
    mc__topo_matrix_free(m);
    free(a);
    free(b);
    assert_int_equal(mc__topo_matrix_parse("{", "peer descriptor", &m), -MC_ECONFIG);
    assert_non_null(strstr(mc_last_error(), "peer descriptor"));
    mc__topo_free(t);
}

static void test_env(void **state)
{
    mc_topo_t *t = load("two-socket.xml");

    (void)state;
    setenv("MC_DEVICES", "mlx5_0", 1);
    setenv("MC_NIC_PRIORITY_MATRIX", "", 1);
    assert_int_equal(mc__topo_matrix_build_env(t), 0);
    assert_row(t, "cpu:1", "", "mlx5_0");
    setenv("MC_NIC_PRIORITY_MATRIX", "{\"cpu:1\":[[\"mlx5_0\"],[]]}", 1);
    assert_int_equal(mc__topo_matrix_build_env(t), 0);
    assert_row(t, "cpu:1", "mlx5_0", "");
    setenv("MC_DEVICES", "nope", 1);
    assert_config_error(mc__topo_matrix_build_env(t), "MC_DEVICES", "nope");
    unsetenv("MC_DEVICES");
    unsetenv("MC_NIC_PRIORITY_MATRIX");
    mc__topo_free(t);
}

static void test_topo_json(void **state)
{
    mc_topo_t *t = load("two-socket.xml");
    json_t *root;
    char *text;

    (void)state;
    assert_int_equal(mc__topo_matrix_build(t, NULL, NULL), 0);
    assert_int_equal(mc__topo_json(t, &text), 0);
    root = json_loads(text, 0, NULL);
    assert_non_null(root);
    assert_int_equal(json_array_size(json_object_get(root, "numa_nodes")), 2);
    assert_int_equal(json_array_size(json_object_get(root, "devices")), 8);
    assert_int_equal(json_array_size(json_object_get(root, "gpus")), 8);
    assert_int_equal(json_object_size(json_object_get(root, "matrix")), 10);
    assert_string_equal(
        json_string_value(json_object_get(json_array_get(json_object_get(root, "gpus"), 7), "pci")),
        "0000:63:00.0");
    json_decref(root);
    free(text);
    mc__topo_free(t);
}

/* This host: whatever it has, discovery succeeds and a matrix with cpu:N rows comes out. */
static void test_live_host(void **state)
{
    mc_topo_t *t = NULL;
    char *text;

    (void)state;
    assert_int_equal(mc__topo_discover(NULL, &t), 0);
    assert_true(t->n_numa >= 1);
    assert_null(mc__topo_find(t, "lo"));
    assert_int_equal(mc__topo_matrix_build(t, NULL, NULL), 0);
    assert_non_null(mc__topo_matrix_find(t->matrix, "cpu:0") ? t->matrix->locs : NULL);
    if (!mc__topo_count(t, MC_DEV_GPU))
        assert_non_null(strstr(t->gpu_note, "no CUDA device"));
    assert_int_equal(mc__topo_json(t, &text), 0);
    free(text);
    mc__topo_free(t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_two_socket_discovery),
        cmocka_unit_test(test_two_socket_matrix),
        cmocka_unit_test(test_two_socket_devices_filter),
        cmocka_unit_test(test_two_socket_override),
        cmocka_unit_test(test_override_file),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_one_socket),
        cmocka_unit_test(test_no_nic),
        cmocka_unit_test(test_matrix_roundtrip),
        cmocka_unit_test(test_env),
        cmocka_unit_test(test_topo_json),
        cmocka_unit_test(test_live_host),
    };

    unsetenv("MC_DEVICES");
    unsetenv("MC_NIC_PRIORITY_MATRIX");
    return cmocka_run_group_tests(tests, NULL, NULL);
}
