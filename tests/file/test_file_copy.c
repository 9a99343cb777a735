/*
 * The staging pipeline's copier (engine/transport/file/file_copy.c) without a device: a test
 * runtime stands where CUDA's is, holding each queued copy until the test lets it finish (in
 * the order the test chooses) or fail. Checked: every piece's bytes land where its direction
 * says, callbacks come oldest first on each device and never inside the submitting call, a
 * stalled device holds back no other, no more than the depth is in flight while the rest wait
 * and start as room comes, a failed copy (at its start or later) fails its own piece with the
 * runtime's reason and no other, teardown waits for what is in flight and cancels what waits,
 * and events are reused, every stream and event created is destroyed.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "transport/file/file_int.h"

#define MAXQ 256
#define LEN  4096

/* ---- the test runtime ---- */

typedef struct tev {
    int dev;
    bool queued, done;
    int fail; /* at query: this error */
    void *dst;
    const void *src;
    size_t len;
} tev_t;

static struct {
    tev_t *q[8][MAXQ]; /* per device, in the order queued */
    unsigned nq[8];
    int streams, streams_freed, events, events_freed;
    unsigned inflight, max_inflight;
    int fail_copy_at; /* the copy call number that fails at once (0: none) */
    int copies;
} rt;

static int t_stream_create(int dev, void **s_p, char *why, size_t size)
{
    (void)why;
    (void)size;
    rt.streams++;
    *s_p = (void *)(uintptr_t)(dev + 1);
    return 0;
}

static void t_stream_destroy(int dev, void *s)
{
    assert_ptr_equal(s, (void *)(uintptr_t)(dev + 1));
    rt.streams_freed++;
}

static int t_event_create(int dev, void **ev_p, char *why, size_t size)
{
    tev_t *ev = calloc(1, sizeof(*ev));

    (void)why;
    (void)size;
    ev->dev = dev;
    rt.events++;
    *ev_p = ev;
    return 0;
}

static void t_event_destroy(int dev, void *ev)
{
    assert_int_equal(((tev_t *)ev)->dev, dev);
    assert_false(((tev_t *)ev)->queued);
    rt.events_freed++;
    free(ev);
}

static int t_copy(int dev, void *s, void *evp, void *dst, const void *src, size_t len, char *why,
                  size_t size)
{
    tev_t *ev = evp;

    assert_ptr_equal(s, (void *)(uintptr_t)(dev + 1));
    assert_int_equal(ev->dev, dev);
    assert_false(ev->queued);
    if (++rt.copies == rt.fail_copy_at) {
        snprintf(why, size, "cudaMemcpyAsync: invalid argument (test)");
        return -EIO;
    }
    *ev = (tev_t){.dev = dev, .queued = true, .dst = dst, .src = src, .len = len};
    rt.q[dev][rt.nq[dev]++] = ev;
    if (++rt.inflight > rt.max_inflight)
        rt.max_inflight = rt.inflight;
    return 0;
}

static int outcome(tev_t *ev, char *why, size_t size)
{
    ev->queued = false;
    rt.inflight--;
    if (ev->fail) {
        snprintf(why, size, "copy: an illegal memory access was encountered (test)");
        return ev->fail;
    }
    return 0;
}

static int t_query(int dev, void *evp, char *why, size_t size)
{
    tev_t *ev = evp;

    assert_int_equal(ev->dev, dev);
    assert_true(ev->queued);
    return ev->done ? outcome(ev, why, size) : -EAGAIN;
}

static int t_wait(int dev, void *evp, char *why, size_t size)
{
    tev_t *ev = evp;

    assert_int_equal(ev->dev, dev);
    if (!ev->done) {
        memcpy(ev->dst, ev->src, ev->len);
        ev->done = true;
    }
    return outcome(ev, why, size);
}

static const file_copy_ops_t test_ops = {
    .stream_create = t_stream_create,
    .stream_destroy = t_stream_destroy,
    .event_create = t_event_create,
    .event_destroy = t_event_destroy,
    .copy = t_copy,
    .query = t_query,
    .wait = t_wait,
};

/* The device finishes its k-th queued copy (its bytes move now), or fails it. */
static void finish_nth(int dev, unsigned k, int fail)
{
    tev_t *ev = rt.q[dev][k];

    assert_true(k < rt.nq[dev]);
    if (fail)
        ev->fail = fail;
    else
        memcpy(ev->dst, ev->src, ev->len);
    ev->done = true;
}

/* ---- pieces ---- */

typedef struct piece {
    file_io_t io;
    int id;
    int err;
    bool called;
    char reason[256];
    uint8_t vram[LEN], mem[LEN]; /* "device" memory and host memory */
} piece_t;

static int order[MAXQ], n_order;

static void piece_cb(mc_engine_t *e, file_io_t *io, int err)
{
    piece_t *p = mc_container_of(io, piece_t, io);

    assert_null(e);
    assert_false(p->called);
    p->called = true;
    p->err = err;
    if (err)
        mc__file_io_reason(io, err, p->reason, sizeof(p->reason));
    order[n_order++] = p->id;
}

static piece_t *pieces(int n, int dev)
{
    piece_t *ps = calloc((size_t)n, sizeof(*ps));

    for (int i = 0; i < n; i++) {
        piece_t *p = &ps[i];
        p->id = i;
        for (int k = 0; k < LEN; k++) {
            p->vram[k] = (uint8_t)(i * 7 + k * 13);
            p->mem[k] = (uint8_t)(i * 5 + k * 3 + 1);
        }
        p->io.vram = true;
        p->io.dev = dev;
        p->io.pos = (uint64_t)(uintptr_t)p->vram;
        p->io.mem = p->mem;
        p->io.len = LEN;
        p->io.write = i % 2; /* odd: host to device */
        p->io.cb = piece_cb;
    }
    return ps;
}

/* Both copies of p hold what its direction moved. */
static void assert_moved(const piece_t *p)
{
    assert_int_equal(p->err, 0);
    assert_memory_equal(p->vram, p->mem, LEN);
    assert_int_equal(p->io.done, LEN);
    uint8_t expect = p->io.write ? (uint8_t)(p->id * 5 + 1) : (uint8_t)(p->id * 7);
    assert_int_equal(p->mem[0], expect);
}

static int setup(void **state)
{
    file_copier_t *c = calloc(1, sizeof(*c));

    memset(&rt, 0, sizeof(rt));
    n_order = 0;
    mc__file_copy_init(c, 4);
    c->ops = &test_ops;
    *state = c;
    return 0;
}

static int teardown(void **state)
{
    file_copier_t *c = *state;

    mc__file_copy_stop(NULL, c);
    assert_int_equal(rt.streams, rt.streams_freed);
    assert_int_equal(rt.events, rt.events_freed);
    assert_int_equal(rt.inflight, 0);
    free(c);
    return 0;
}

/* ---- tests ---- */

/* Copies finish one by one: each reap runs exactly the finished callbacks, oldest first; the
 * bytes go device to host for reads, host to device for writes. */
static void test_in_order(void **state)
{
    file_copier_t *c = *state;
    piece_t *ps = pieces(4, 0);

    for (int i = 0; i < 4; i++)
        mc__file_copy_submit(NULL, c, &ps[i].io);
    assert_int_equal(n_order, 0); /* never inside the submitting call */
    assert_true(mc__file_copy_busy(c));
    mc__file_copy_reap(NULL, c);
    assert_int_equal(n_order, 0);
    for (unsigned k = 0; k < 4; k++) {
        finish_nth(0, k, 0);
        mc__file_copy_reap(NULL, c);
        assert_int_equal(n_order, (int)k + 1);
        assert_int_equal(order[k], (int)k);
        assert_moved(&ps[k]);
    }
    assert_false(mc__file_copy_busy(c));
    assert_int_equal(rt.streams, 1);
    free(ps);
}

/* A later copy reported done while an earlier one is not: nothing is reported until the
 * earlier one is, then both, in order. */
static void test_oldest_first(void **state)
{
    file_copier_t *c = *state;
    piece_t *ps = pieces(3, 0);

    for (int i = 0; i < 3; i++)
        mc__file_copy_submit(NULL, c, &ps[i].io);
    finish_nth(0, 1, 0);
    finish_nth(0, 2, 0);
    mc__file_copy_reap(NULL, c);
    assert_int_equal(n_order, 0);
    finish_nth(0, 0, 0);
    mc__file_copy_reap(NULL, c);
    assert_int_equal(n_order, 3);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(order[i], i);
        assert_moved(&ps[i]);
    }
    free(ps);
}

/* A stalled device holds back no other device's completions. */
static void test_devices_apart(void **state)
{
    file_copier_t *c = *state;
    piece_t *ps = pieces(2, 0);

    ps[1].io.dev = 3;
    mc__file_copy_submit(NULL, c, &ps[0].io);
    mc__file_copy_submit(NULL, c, &ps[1].io);
    finish_nth(3, 0, 0);
    mc__file_copy_reap(NULL, c);
    assert_int_equal(n_order, 1);
    assert_int_equal(order[0], 1);
    assert_moved(&ps[1]);
    assert_false(ps[0].called);
    assert_int_equal(rt.streams, 2);
    finish_nth(0, 0, 0);
    mc__file_copy_reap(NULL, c);
    assert_int_equal(n_order, 2);
    assert_moved(&ps[0]);
    free(ps);
}

/* Depth 4: of 10 pieces 4 are in flight, the others wait and start as room comes; all finish
 * in the order submitted; events are reused (no more than the depth are ever created). */
static void test_bounded(void **state)
{
    file_copier_t *c = *state;
    piece_t *ps = pieces(10, 1);

    for (int i = 0; i < 10; i++)
        mc__file_copy_submit(NULL, c, &ps[i].io);
    assert_int_equal(rt.nq[1], 4);
    assert_int_equal(c->inflight, 4);
    for (unsigned k = 0; k < 10; k++) {
        finish_nth(1, k, 0);
        mc__file_copy_reap(NULL, c);
        assert_int_equal(n_order, (int)k + 1);
        assert_int_equal(rt.nq[1], k + 5 < 10 ? k + 5 : 10); /* one more started */
    }
    assert_int_equal(rt.max_inflight, 4);
    for (int i = 0; i < 10; i++) {
        assert_int_equal(order[i], i);
        assert_moved(&ps[i]);
    }
    assert_int_equal(rt.events, 4);
    free(ps);
}

/* One copy fails on the device, another cannot start: each fails its own piece with the
 * runtime's reason (the one that could not start from the next reap, not inside submit); the
 * others move their bytes. */
static void test_failure_is_its_own(void **state)
{
    file_copier_t *c = *state;
    piece_t *ps = pieces(4, 2);

    rt.fail_copy_at = 3;
    for (int i = 0; i < 4; i++)
        mc__file_copy_submit(NULL, c, &ps[i].io);
    assert_int_equal(n_order, 0);
    assert_int_equal(rt.nq[2], 3); /* pieces 0, 1, 3 */
    finish_nth(2, 0, 0);
    finish_nth(2, 1, -EIO);
    finish_nth(2, 2, 0);
    mc__file_copy_reap(NULL, c);
    assert_int_equal(n_order, 4);
    assert_moved(&ps[0]);
    assert_moved(&ps[3]);
    assert_int_equal(ps[1].err, -EIO);
    assert_non_null(strstr(ps[1].reason, "cuda:2: copy of 4096 bytes to VRAM"));
    assert_non_null(strstr(ps[1].reason, "illegal memory access"));
    assert_int_equal(ps[2].err, -EIO);
    assert_non_null(strstr(ps[2].reason, "from VRAM"));
    assert_non_null(strstr(ps[2].reason, "cudaMemcpyAsync: invalid argument"));
    assert_int_equal(ps[1].vram[0], (uint8_t)(1 * 7)); /* failed copies moved nothing */
    assert_int_equal(ps[2].mem[0], (uint8_t)(2 * 5 + 1));
    free(ps);
}

/* Teardown with 4 in flight and 2 waiting: the 4 are waited for (their bytes move), the 2 are
 * canceled. */
static void test_stop(void **state)
{
    file_copier_t *c = *state;
    piece_t *ps = pieces(6, 0);

    for (int i = 0; i < 6; i++)
        mc__file_copy_submit(NULL, c, &ps[i].io);
    mc__file_copy_stop(NULL, c);
    assert_int_equal(n_order, 6);
    for (int i = 0; i < 4; i++)
        assert_moved(&ps[i]);
    for (int i = 4; i < 6; i++) {
        assert_int_equal(ps[i].err, -ECANCELED);
        assert_non_null(strstr(ps[i].reason, "canceled"));
    }
    assert_int_equal(rt.streams_freed, 1);
    assert_int_equal(rt.events_freed, rt.events);
    free(ps);
}

/* Without a device runtime (no VRAM registered) a copy fails with a reason, from the reap. */
static void test_no_runtime(void **state)
{
    file_copier_t *c = *state;
    piece_t *ps = pieces(1, 0);

    c->ops = NULL;
    mc__file_copy_submit(NULL, c, &ps[0].io);
    assert_int_equal(n_order, 0);
    mc__file_copy_reap(NULL, c);
    assert_int_equal(ps[0].err, -MC_ENODEV);
    assert_non_null(strstr(ps[0].reason, "no CUDA runtime"));
    c->ops = &test_ops;
    free(ps);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_in_order, setup, teardown),
        cmocka_unit_test_setup_teardown(test_oldest_first, setup, teardown),
        cmocka_unit_test_setup_teardown(test_devices_apart, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bounded, setup, teardown),
        cmocka_unit_test_setup_teardown(test_failure_is_its_own, setup, teardown),
        cmocka_unit_test_setup_teardown(test_stop, setup, teardown),
        cmocka_unit_test_setup_teardown(test_no_runtime, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
