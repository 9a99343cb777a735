/*
 * Discovery of RDMA devices that only libibverbs knows: run over softverbs (LD_LIBRARY_PATH at
 * the stand-in, SOFTVERBS_DEVICES=2), whose devices have no /sys/class/infiniband entry. The
 * live topology must list softverbs0 and softverbs1 once each as RDMA devices, and the matrix
 * must use them; an XML topology must not pick them up. Exits 77 (skipped) when libibverbs
 * shows no softverbs device.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include <infiniband/verbs.h>

#include "topology/topology.h"

static const char *const sv_names[] = {"softverbs0", "softverbs1"};

static size_t count_named(const mc_topo_t *t, const char *name)
{
    size_t n = 0;

    for (size_t i = 0; i < t->n_devs; i++)
        n += !strcmp(t->devs[i].name, name);
    return n;
}

static int in_list(const char **v, size_t n, const char *name)
{
    for (size_t i = 0; i < n; i++)
        if (!strcmp(v[i], name))
            return 1;
    return 0;
}

static void test_discovered(void **state)
{
    mc_topo_t *t = NULL;

    (void)state;
    assert_int_equal(mc__topo_discover(NULL, &t), 0);
    for (size_t i = 0; i < 2; i++) {
        const mc_topo_dev_t *d = mc__topo_find(t, sv_names[i]);

        assert_non_null(d);
        assert_int_equal(d->kind, MC_DEV_RDMA);
        assert_string_equal(d->pci, "");
        assert_int_equal(d->numa, 0);
        assert_int_equal(count_named(t, sv_names[i]), 1);
    }
    for (size_t i = 0; i < t->n_devs; i++)
        assert_int_equal(count_named(t, t->devs[i].name), 1);
    mc__topo_free(t);
}

/* Every row of the computed matrix offers both devices: preferred on node 0, available
 * elsewhere. */
static void test_matrix(void **state)
{
    const char **p, **a;
    mc_topo_t *t = NULL;
    size_t np, na;

    (void)state;
    assert_int_equal(mc__topo_discover(NULL, &t), 0);
    assert_int_equal(mc__topo_matrix_build(t, NULL, NULL), 0);
    assert_int_equal(mc__topo_matrix_get(t, "cpu:0", &p, &np, &a, &na), 0);
    assert_true(in_list(p, np, "softverbs0") && in_list(p, np, "softverbs1"));
    for (size_t r = 0; r < t->matrix->n_locs; r++) {
        const mc_topo_loc_t *loc = &t->matrix->locs[r];

        for (size_t i = 0; i < 2; i++)
            assert_true(in_list(loc->preferred, loc->n_preferred, sv_names[i]) ||
                        in_list(loc->available, loc->n_available, sv_names[i]));
    }
    /* MC_DEVICES accepts them like any RDMA device. */
    assert_int_equal(mc__topo_matrix_build(t, "softverbs1", NULL), 0);
    assert_int_equal(mc__topo_matrix_get(t, "cpu:0", &p, &np, &a, &na), 0);
    assert_int_equal(np, 1);
    assert_string_equal(p[0], "softverbs1");
    assert_int_equal(na, 0);
    mc__topo_free(t);
}

/* A topology file describes another host: this host's verbs devices do not belong in it. */
static void test_xml_has_none(void **state)
{
    const char *src = getenv("MC_SOURCE_DIR");
    char path[4096];
    mc_topo_t *t = NULL;

    (void)state;
    snprintf(path, sizeof(path), "%s/tests/topology/one-socket.xml", src ? src : ".");
    assert_int_equal(mc__topo_discover(path, &t), 0);
    assert_null(mc__topo_find(t, "softverbs0"));
    assert_int_equal(mc__topo_count(t, MC_DEV_RDMA), 0);
    mc__topo_free(t);
}

static int have_softverbs(void)
{
    struct ibv_device **list;
    int n = 0, found = 0;

    list = ibv_get_device_list(&n);
    for (int i = 0; list && i < n; i++)
        found += !strcmp(ibv_get_device_name(list[i]), "softverbs1");
    if (list)
        ibv_free_device_list(list);
    return found;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_discovered),
        cmocka_unit_test(test_matrix),
        cmocka_unit_test(test_xml_has_none),
    };

    if (!have_softverbs()) {
        printf("no softverbs1 device (LD_LIBRARY_PATH at softverbs, SOFTVERBS_DEVICES=2?): "
               "skipped\n");
        return 77;
    }
    unsetenv("MC_DEVICES");
    unsetenv("MC_NIC_PRIORITY_MATRIX");
    return cmocka_run_group_tests(tests, NULL, NULL);
}
