/* Descriptors (engine/descriptor.c): the parts of buffers replaced by newer keys are packed away,
 * so a peer that registers the same ranges again and again (a registration cache: every new key
 * replaces the entry of the range) keeps its descriptor's parts bounded, and the entries that
 * stay keep their bytes; with more than half the limit live too. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "descriptor.h"

#define RANGES 16
#define ROUNDS 50000
#define SLOT_A 0
#define SLOT_B 1
#define LEN_A  13 /* not a multiple of 8: parts are padded */
#define LEN_B  24

/* The bytes of range r's part of slot in generation g. */
static void part_bytes(uint8_t *out, size_t len, unsigned r, unsigned slot, unsigned g)
{
    for (size_t i = 0; i < len; i++)
        out[i] = (uint8_t)(r * 31 + slot * 7 + g * 13 + i);
}

static uint64_t range_addr(unsigned r)
{
    return 0x100000ull * (r + 1);
}

/* Take out the entry that nb, just added with its parts, replaces (the other one of its range). */
static void replace_older(mc_desc_t *d, const mc_desc_buffer_t *nb)
{
    for (size_t i = 0; i < d->n_buffers; i++)
        if (&d->buffers[i] != nb && d->buffers[i].addr == nb->addr) {
            mc__desc_buffer_replaced(d, &d->buffers[i]);
            return;
        }
}

/* Add range r in generation g, with both parts, and take out the entry it replaces. */
static void add_gen(mc_desc_t *d, unsigned r, unsigned g)
{
    uint8_t a[LEN_A], b[LEN_B];
    mc_desc_buffer_t *nb;

    assert_int_equal(mc__desc_buffer_add(d, range_addr(r), 4096, "cpu:0", &nb), 0);
    part_bytes(a, sizeof(a), r, SLOT_A, g);
    part_bytes(b, sizeof(b), r, SLOT_B, g);
    assert_int_equal(mc__desc_part_add(d, nb, SLOT_A, a, sizeof(a)), 0);
    assert_int_equal(mc__desc_part_add(d, nb, SLOT_B, b, sizeof(b)), 0);
    replace_older(d, nb);
}

/* Every range is there once, with generation gen[r]'s bytes. */
static void check_all(const mc_desc_t *d, const unsigned *gen)
{
    uint8_t want[LEN_B];

    assert_int_equal(d->n_buffers, RANGES);
    for (unsigned r = 0; r < RANGES; r++) {
        const mc_desc_buffer_t *b = mc__desc_find(d, range_addr(r), 4096);
        assert_non_null(b);
        assert_int_equal(b->part_len[SLOT_A], LEN_A);
        assert_int_equal(b->part_len[SLOT_B], LEN_B);
        part_bytes(want, LEN_A, r, SLOT_A, gen[r]);
        assert_memory_equal(mc__desc_part(d, b, SLOT_A), want, LEN_A);
        part_bytes(want, LEN_B, r, SLOT_B, gen[r]);
        assert_memory_equal(mc__desc_part(d, b, SLOT_B), want, LEN_B);
    }
}

static void test_replaced_parts_packed(void **state)
{
    mc_desc_t d = {0};
    unsigned gen[RANGES] = {0};
    size_t most = 0;

    (void)state;
    for (unsigned r = 0; r < RANGES; r++)
        add_gen(&d, r, 0);
    check_all(&d, gen);
    for (unsigned i = 1; i <= ROUNDS; i++) {
        unsigned r = i % RANGES;
        add_gen(&d, r, i);
        gen[r] = i;
        if (d.parts_len > most)
            most = d.parts_len;
        if (i % 997 == 0)
            check_all(&d, gen);
    }
    check_all(&d, gen);
    /* 50,000 replaced entries of 40 bytes (2.3 MB padded) were added; what is kept is the live
     * ones' 640 bytes and at most the dead bytes a pack waits for (64 KiB) beside them */
    printf("parts: %zu bytes at most, %zu at the end\n", most, d.parts_len);
    assert_true(most <= 2 * (64u << 10) + 1024);
    mc__desc_free(&d);
}

#define BIG_RANGES 400
#define BIG_PART   (100u << 10) /* 400 of them: 39 MiB live, more than half the 64 MiB limit */

/* Range r of generation g with one BIG_PART part; the entry it replaces taken out. */
static int add_big(mc_desc_t *d, unsigned r, unsigned g, uint8_t *bytes)
{
    mc_desc_buffer_t *nb;
    int rc;

    assert_int_equal(mc__desc_buffer_add(d, range_addr(r), 4096, "cpu:0", &nb), 0);
    part_bytes(bytes, BIG_PART, r, SLOT_A, g);
    if ((rc = mc__desc_part_add(d, nb, SLOT_A, bytes, BIG_PART)))
        return rc;
    replace_older(d, nb);
    return 0;
}

/* With more than half the limit live, the dead bytes reach the limit before they are half of
 * parts: the part that would pass it packs them away first. */
static void test_packed_at_the_limit(void **state)
{
    mc_desc_t d = {0};
    uint8_t *bytes = malloc(BIG_PART), *want = malloc(BIG_PART);

    (void)state;
    assert_non_null(bytes);
    assert_non_null(want);
    for (unsigned r = 0; r < BIG_RANGES; r++)
        assert_int_equal(add_big(&d, r, 0, bytes), 0);
    for (unsigned g = 1; g <= 2; g++)
        for (unsigned r = 0; r < BIG_RANGES; r++)
            assert_int_equal(add_big(&d, r, g, bytes), 0);
    assert_int_equal(d.n_buffers, BIG_RANGES);
    for (unsigned r = 0; r < BIG_RANGES; r++) {
        const mc_desc_buffer_t *b = mc__desc_find(&d, range_addr(r), 4096);
        assert_non_null(b);
        part_bytes(want, BIG_PART, r, SLOT_A, 2);
        assert_memory_equal(mc__desc_part(&d, b, SLOT_A), want, BIG_PART);
    }
    mc__desc_free(&d);
    free(bytes);
    free(want);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_replaced_parts_packed),
        cmocka_unit_test(test_packed_at_the_limit),
    };
    return cmocka_run_group_tests_name("desc", tests, NULL, NULL);
}
