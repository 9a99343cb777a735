/* Peer descriptors cached and refreshed by watch: with etcd down, a segment seen before can be
 * opened again, and memory it registered while etcd was up (learned through the watch) can be
 * written. Two engines in this process, a real etcd from the fixture. */
#include <errno.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <mooncake/engine.h>

#include "etcd_proc.h"

#define LEN (1u << 20)

static etcd_proc_t etcd;

static mc_engine_t *engine(void)
{
    mc_config_t *cfg;
    mc_engine_t *e;

    assert_int_equal(mc_config_create(&cfg), 0);
    assert_int_equal(mc_config_set(cfg, "METADATA", etcd.url), 0);
    assert_int_equal(mc_config_set(cfg, "METADATA_TTL", "5"), 0);
    assert_int_equal(mc_engine_create(cfg, &e), 0);
    mc_config_destroy(cfg);
    return e;
}

static int xfer(mc_engine_t *e, mc_opcode_t op, void *local, mc_segment_id_t seg, void *remote)
{
    mc_batch_t *b;
    mc_batch_status_t st;
    mc_request_t r = {.opcode = op,
                      .local = local,
                      .target = seg,
                      .target_offset = (uint64_t)(uintptr_t)remote,
                      .length = LEN};

    assert_int_equal(mc_batch_create(e, 1, &b), 0);
    assert_int_equal(mc_batch_submit(b, &r, 1, NULL), 0);
    assert_int_equal(mc_batch_wait(b, 30000), 0);
    assert_int_equal(mc_batch_status(b, &st), 0);
    while (mc_batch_destroy(b) == -EBUSY)
        etcd_test_sleep_ms(1);
    return st.state;
}

static void test_cache(void **state)
{
    (void)state;
    mc_engine_t *a = engine(), *b = engine();
    uint8_t *abuf, *abuf2, *bbuf;
    mc_segment_id_t seg;

    assert_int_equal(mc_mem_alloc(a, LEN, "*", (void **)&abuf), 0);
    assert_int_equal(mc_mem_alloc(b, LEN, "*", (void **)&bbuf), 0);
    memset(bbuf, 0x5a, LEN);

    /* Opened once through etcd: the descriptor is cached and the prefix watched. */
    assert_int_equal(mc_segment_open(b, mc_engine_segment_name(a), &seg), 0);
    assert_int_equal(xfer(b, MC_WRITE, bbuf, seg, abuf), MC_TASK_COMPLETED);
    assert_memory_equal(abuf, bbuf, LEN);

    /* A registers more memory while etcd is up; b learns of it only through the watch. */
    assert_int_equal(mc_mem_alloc(a, LEN, "*", (void **)&abuf2), 0);
    etcd_test_sleep_ms(1500);

    etcd_proc_kill(&etcd, SIGKILL);
    memset(bbuf, 0xc3, LEN);
    assert_int_equal(xfer(b, MC_WRITE, bbuf, seg, abuf2), MC_TASK_COMPLETED);
    assert_memory_equal(abuf2, bbuf, LEN);

    /* Closed and opened again by name with etcd still down: served from the cache. */
    assert_int_equal(mc_segment_close(b, seg), 0);
    assert_int_equal(mc_segment_open(b, mc_engine_segment_name(a), &seg), 0);
    memset(bbuf, 0x17, LEN);
    assert_int_equal(xfer(b, MC_WRITE, bbuf, seg, abuf), MC_TASK_COMPLETED);
    assert_memory_equal(abuf, bbuf, LEN);

    /* A name never seen fails cleanly (no cache entry, no etcd). */
    mc_segment_id_t none;
    int rc = mc_segment_open(b, "never-published", &none);
    assert_true(rc < 0);

    assert_int_equal(etcd_proc_restart(&etcd), 0);
    assert_int_equal(mc_segment_close(b, seg), 0);
    mc_mem_free(a, abuf);
    mc_mem_free(a, abuf2);
    mc_mem_free(b, bbuf);
    mc_engine_destroy(b);
    mc_engine_destroy(a);
}

int main(void)
{
    int rc = etcd_proc_start(&etcd, NULL);

    if (rc == 77)
        return 77;
    if (rc)
        return 1;
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_cache)};
    rc = cmocka_run_group_tests(tests, NULL, NULL);
    etcd_proc_stop(&etcd);
    return rc;
}
