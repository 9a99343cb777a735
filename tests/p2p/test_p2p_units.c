/*
 * The P2P library's pure logic, white-box (linked with its static internal copy): names and
 * keys, the two JSON documents, shard pieces and checksums across buffers, and which shard
 * starts next from which holder.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include <cmocka.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "metadata/meta.h"
#include "p2p_codec.h"
#include "p2p_fetch.h"
#include "p2p_int.h"
#include "p2p_shard.h"

static void test_names(void **state)
{
    static const char *const good[] = {
        "a", "ckpt/llama-70b/v1.2", "A_b-c.d", "x/replicas", "..a", "a..", "replica_1"};
    static const char *const bad[] = {
        "",       "/a",      "a/",        "a//b",        ".",   "..",  "a/./b",
        "a/../b", "replica", "a/replica", "a/replica/b", "a b", "a:b", "\xc3\xa9"};
    char longest[MC_P2P_NAME_MAX + 1];

    (void)state;
    for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++)
        assert_int_equal(mc__p2p_name_check(good[i]), 0);
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        assert_int_equal(mc__p2p_name_check(bad[i]), -EINVAL);
    assert_int_equal(mc__p2p_name_check(NULL), -EINVAL);
    memset(longest, 'x', MC_P2P_NAME_MAX);
    longest[MC_P2P_NAME_MAX - 1] = '\0';
    assert_int_equal(mc__p2p_name_check(longest), 0);
    longest[MC_P2P_NAME_MAX - 1] = 'x';
    longest[MC_P2P_NAME_MAX] = '\0';
    assert_int_equal(mc__p2p_name_check(longest), -EINVAL);
    assert_non_null(strstr(mc_p2p_last_error(), "1 to 128 characters"));
}

static void test_keys(void **state)
{
    mc_p2p_t p2p = {.segment = "10.0.0.1:4000"};
    char key[P2P_KEY_MAX];

    (void)state;
    assert_true(mc__p2p_key(&p2p, "m/v1", "object", key) > 0);
    assert_string_equal(key, "mooncake/p2p/m/v1/object");
    assert_true(mc__p2p_replica_key(&p2p, "m/v1", key) > 0);
    assert_string_equal(key, "mooncake/p2p/m/v1/replica/10.0.0.1:4000");
    strcpy(p2p.cluster, "prod");
    assert_true(mc__p2p_key(&p2p, "m", "replica/", key) > 0);
    assert_string_equal(key, "mooncake/prod/p2p/m/replica/");
}

/* A fetch's buffers must not overlap (a shard fetched into one would overwrite another's,
 * after both were verified and advertised); a publish's may. */
static void test_bufs_disjoint(void **state)
{
    static char m[3 * 4096];
    uint64_t total;
    mc_p2p_buf_t same[2] = {{m, 8192}, {m, 8192}}, inside[2] = {{m, 8192}, {m + 4096, 100}},
                 apart[3] = {{m + 8192, 4096}, {m, 4096}, {m + 4096, 4096}};

    (void)state;
    assert_int_equal(mc__p2p_bufs_check("x", same, 2, &total), 0);
    assert_int_equal(mc__p2p_bufs_disjoint("x", same, 2), -EINVAL);
    assert_int_equal(mc__p2p_bufs_disjoint("x", inside, 2), -EINVAL);
    assert_int_equal(mc__p2p_bufs_disjoint("x", apart, 3), 0); /* adjacent, in any order */
}

static void test_desc_codec(void **state)
{
    uint64_t sums[3] = {0, UINT64_MAX, 0x0123456789abcdefull};
    p2p_desc_t d = {.id = 0xfeedull,
                    .size = 2 * 4096 + 1,
                    .shard_size = 4096,
                    .shards = 3,
                    .sums = sums,
                    .origin = "127.0.0.1:1"},
               back;
    char *json;
    size_t len;

    (void)state;
    assert_int_equal(mc__p2p_desc_encode(&d, &json, &len), 0);
    assert_non_null(strstr(json, "\"hash\":\"xxh3-64\""));
    assert_non_null(strstr(json, "\"ffffffffffffffff\""));
    assert_int_equal(mc__p2p_desc_decode(json, len, &back), 0);
    assert_int_equal(back.id, d.id);
    assert_int_equal(back.size, d.size);
    assert_int_equal(back.shards, 3);
    assert_memory_equal(back.sums, sums, sizeof(sums));
    assert_string_equal(back.origin, d.origin);
    mc__p2p_desc_free(&back);
    free(json);
    static const char *const bad[] = {
        "[]",
        "{\"v\":2}",
        "not json",
        "{\"v\":1,\"id\":\"0000000000000001\",\"size\":10,\"shard_size\":4,\"shards\":2,"
        "\"hash\":\"xxh3-64\",\"checksums\":[\"0000000000000000\",\"0000000000000000\"],"
        "\"origin\":\"o\"}", /* 10 bytes in shards of 4 are 3 */
        "{\"v\":1,\"id\":\"0000000000000001\",\"size\":4,\"shard_size\":4,\"shards\":1,"
        "\"hash\":\"crc32c\",\"checksums\":[\"0000000000000000\"],\"origin\":\"o\"}",
        "{\"v\":1,\"id\":\"0000000000000001\",\"size\":4,\"shard_size\":4,\"shards\":1,"
        "\"hash\":\"xxh3-64\",\"checksums\":[\"00000000000000zz\"],\"origin\":\"o\"}",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        assert_int_equal(mc__p2p_desc_decode(bad[i], strlen(bad[i]), &back), -EPROTO);
}

/* Bitmaps of 1, 7, 8, 9 and 1025 shards, every other bit set; complete entries. */
static void test_entry_codec(void **state)
{
    static const uint32_t counts[] = {1, 7, 8, 9, 1025};
    p2p_rbuf_t bufs[2] = {{0x7f0000001000ull, 1000}, {0x7f0000100000ull, 24}};

    (void)state;
    for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++)
        for (int complete = 0; complete < 2; complete++) {
            uint32_t k = counts[c];
            uint8_t have[129] = {0};
            for (uint32_t i = 0; i < k; i++)
                if (complete || i % 2 == 0)
                    p2p_bit_set(have, i);
            p2p_entry_t e = {.id = 42,
                             .complete = complete,
                             .shards = k,
                             .have = have,
                             .bufs = bufs,
                             .n_bufs = 2},
                        back;
            char *json;
            size_t len;
            assert_int_equal(mc__p2p_entry_encode(&e, &json, &len), 0);
            assert_int_equal(complete, strstr(json, "\"have\"") == NULL);
            assert_int_equal(mc__p2p_entry_decode(json, len, 1024, &back), 0);
            assert_int_equal(back.complete, complete);
            assert_int_equal(back.n_bufs, 2);
            assert_int_equal(back.bufs[1].addr, bufs[1].addr);
            assert_memory_equal(back.have, have, (k + 7) / 8);
            mc__p2p_entry_free(&back);
            /* buffers that do not hold the object */
            assert_int_equal(mc__p2p_entry_decode(json, len, 1025, &back), -EPROTO);
            free(json);
        }
    const char *cut = "{\"v\":1,\"id\":\"000000000000002a\",\"origin\":false,\"complete\":false,"
                      "\"shards\":9,\"bufs\":[[4096,10]],\"have\":\"AQ==\"}"; /* 1 byte, not 2 */
    p2p_entry_t back;
    assert_int_equal(mc__p2p_entry_decode(cut, strlen(cut), 10, &back), -EPROTO);
    /* Lengths whose sum wraps to the object's size: 2 * (2^63 - 1) + 4098 = 2^64 + 4096. */
    const char *wrap = "{\"v\":1,\"id\":\"000000000000002a\",\"origin\":false,\"complete\":true,"
                       "\"shards\":1,\"bufs\":[[4096,9223372036854775807],"
                       "[8192,9223372036854775807],[16384,4098]]}";
    assert_int_equal(mc__p2p_entry_decode(wrap, strlen(wrap), 4096, &back), -EPROTO);
    assert_non_null(strstr(mc_p2p_last_error(), "hold more than the object"));
}

/* Object bytes [off, off+len) across buffers cut differently on both sides. */
static void test_pieces_and_hash(void **state)
{
    static uint8_t mem[350], remote_mem[350];
    mc_p2p_buf_t lb[3] = {{mem, 100}, {mem + 100, 50}, {mem + 150, 200}};
    p2p_rbuf_t rb[2] = {{(uint64_t)(uintptr_t)remote_mem, 60},
                        {(uint64_t)(uintptr_t)remote_mem + 60, 290}};
    mc_request_t reqs[8];

    (void)state;
    for (int i = 0; i < 350; i++)
        mem[i] = (uint8_t)(i * 7 + 3);
    size_t n = mc__p2p_pieces(lb, 3, rb, 2, 5, 40, 200, reqs, 8);
    assert_int_equal(n, 4); /* 40..60 | 60..100 | 100..150 | 150..240 */
    uint64_t at = 40;
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(reqs[i].opcode, MC_READ);
        assert_int_equal(reqs[i].target, 5);
        assert_ptr_equal(reqs[i].local, mem + at);
        assert_int_equal(reqs[i].target_offset, (uint64_t)(uintptr_t)remote_mem + at);
        at += reqs[i].length;
    }
    assert_int_equal(at, 240);
    assert_int_equal(mc__p2p_pieces(lb, 3, rb, 2, 5, 40, 200, NULL, 0), 4);
    assert_int_equal(mc__p2p_hash(lb, 3, 40, 200), XXH3_64bits(mem + 40, 200));
    assert_int_equal(mc__p2p_hash(lb, 3, 100, 50), XXH3_64bits(mem + 100, 50));

    p2p_desc_t d = {.size = 350, .shard_size = 128, .shards = 3};
    assert_int_equal(mc__p2p_checksum_all(&d, lb, 3), 0);
    assert_int_equal(d.sums[2], XXH3_64bits(mem + 256, 94));
    assert_int_equal(mc__p2p_verify_all(&d, lb, 3), 3);
    mem[300] ^= 1;
    assert_int_equal(mc__p2p_verify_all(&d, lb, 3), 2);
    mc__p2p_desc_free(&d);
}

/* A shard's destination pages are backed before its READs: exactly the pages that hold its
 * bytes, in every buffer it spans (unaligned ends rounded out), their contents untouched. */
static void test_prefault(void **state)
{
    const size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    uint8_t *m = mmap(NULL, 16 * pg, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    mc_p2p_buf_t b[2] = {{m + 100, 3 * pg - 100}, {m + 5 * pg + 10, 4 * pg}};
    unsigned char in[16];

    (void)state;
    assert_true(m != MAP_FAILED);
    if (madvise(m + 15 * pg, pg, MADV_POPULATE_WRITE)) { /* the kernel has none (< 5.14) */
        munmap(m, 16 * pg);
        skip();
    }
    m[6 * pg + 7] = 0xab;
    /* object bytes from page 1 + 101 (in b[0]) to page 7 + 15 (in b[1]) */
    mc__p2p_prefault(b, 2, pg + 1, (3 * pg - 100) - (pg + 1) + 2 * pg + 5);
    assert_int_equal(mincore(m, 16 * pg, in), 0);
    for (unsigned i = 0; i < 16; i++)
        if ((in[i] & 1) != (i == 1 || i == 2 || (i >= 5 && i <= 7) || i == 15))
            fail_msg("page %u is %sresident", i, in[i] & 1 ? "" : "not ");
    assert_int_equal(m[6 * pg + 7], 0xab);
    assert_int_equal(m[5 * pg + 10], 0);
    munmap(m, 16 * pg);
}

/* ---- choosing ---- */

static mc_p2p_t chooser_node = {.segment = "me:1"};

/* A fetch of 4 shards whose holders are listed from entries (have: one bit per shard). */
static p2p_fetch_t *chooser(const char *const *segs, const unsigned *haves, size_t n)
{
    p2p_fetch_t *f = calloc(1, sizeof(*f));
    mc_meta_kv_t kvs[8];
    p2p_rbuf_t rb = {4096, 4 * 4096};

    f->p2p = &chooser_node;
    f->d = (p2p_desc_t){.id = 7,
                        .size = 4 * 4096,
                        .shard_size = 4096,
                        .shards = 4,
                        .sums = NULL,
                        .origin = "origin:1"};
    f->state = calloc(4, 1);
    f->avail = calloc(4, sizeof(*f->avail));
    f->perm = malloc(4 * sizeof(*f->perm));
    f->last_holder = malloc(4 * sizeof(*f->last_holder));
    f->rng = 12345;
    f->avail_gen = UINT64_MAX;
    for (uint32_t i = 0; i < 4; i++) {
        f->perm[i] = i;
        f->last_holder[i] = SIZE_MAX;
    }
    strcpy(f->replica_prefix, "mooncake/p2p/x/replica/");
    for (size_t i = 0; i < n; i++) {
        uint8_t have = (uint8_t)haves[i];
        p2p_entry_t e = {.id = 7,
                         .complete = haves[i] == 15,
                         .shards = 4,
                         .have = &have,
                         .bufs = &rb,
                         .n_bufs = 1};
        kvs[i].key = malloc(64);
        snprintf(kvs[i].key, 64, "mooncake/p2p/x/replica/%s", segs[i]);
        assert_int_equal(mc__p2p_entry_encode(&e, &kvs[i].value, &kvs[i].value_len), 0);
    }
    mc__p2p_holders_listed(f, kvs, n);
    for (size_t i = 0; i < n; i++) {
        free(kvs[i].key);
        free(kvs[i].value);
    }
    return f;
}

static void chooser_free(p2p_fetch_t *f)
{
    mc__p2p_holders_free(f);
    free(f->state);
    free(f->avail);
    free(f->perm);
    free(f->last_holder);
    free(f);
}

static const char *holder_of(p2p_fetch_t *f, uint32_t *shard_p)
{
    size_t h;

    if (!mc__p2p_pick(f, shard_p, &h))
        return NULL;
    return f->holders[h].segment;
}

static void test_choose(void **state)
{
    const char *const segs[] = {"origin:1", "r1:1", "r2:1", "r3:1", "me:1"};
    const unsigned haves[] = {15, 3, 6, 8, 15}; /* r1: 0,1  r2: 1,2  r3: 3 */
    p2p_fetch_t *f = chooser(segs, haves, 5);
    uint32_t shard;

    (void)state;
    assert_int_equal(f->n_holders, 4); /* our own entry is not a holder */
    f->holders[2].bad = true;          /* r2 sent a corrupt shard */
    f->holders[3].dead = true;         /* r3 died */
    f->holders_gen++;
    /* shards a replica has first (the origin's link is everyone's): 0 and 1, from r1 however
     * loaded */
    f->holders[1].inflight = 5;
    assert_string_equal(holder_of(f, &shard), "r1:1");
    assert_true(shard == 0 || shard == 1);
    f->state[0] = f->state[1] = SHARD_DONE;
    /* then the shards only the origin has, the first in the permutation */
    assert_string_equal(holder_of(f, &shard), "origin:1");
    assert_int_equal(shard, 2);
    /* ... while few of ours are in flight from it */
    f->holders[0].inflight = P2P_ORIGIN_INFLIGHT;
    assert_null(holder_of(f, &shard));
    /* r1 failed shard 0 last: the origin gets it, as a shard a replica has */
    f->state[0] = SHARD_MISSING;
    f->last_holder[0] = 1;
    assert_string_equal(holder_of(f, &shard), "origin:1");
    assert_int_equal(shard, 0);
    /* the origin only: no bound on what is in flight from it */
    f->last_holder[0] = SIZE_MAX;
    f->o.origin_only = 1;
    f->holders_gen++;
    assert_string_equal(holder_of(f, &shard), "origin:1");
    chooser_free(f);
}

/* Least loaded among the replicas, holders that keep failing last, nothing from the bad. */
static void test_least_loaded(void **state)
{
    const char *const segs[] = {"origin:1", "r1:1", "r2:1"};
    const unsigned haves[] = {15, 15, 15};
    p2p_fetch_t *f = chooser(segs, haves, 3);
    uint32_t shard;

    (void)state;
    f->holders[1].inflight = 2;
    f->holders[2].inflight = 1;
    assert_string_equal(holder_of(f, &shard), "r2:1");
    f->holders[2].fails = P2P_HOLDER_FAILS;
    assert_string_equal(holder_of(f, &shard), "r1:1");
    f->holders[1].fails = P2P_HOLDER_FAILS;
    assert_string_equal(holder_of(f, &shard), "origin:1");
    f->holders[0].bad = true;
    f->holders_gen++;
    assert_string_equal(holder_of(f, &shard), "r2:1"); /* fewer in flight than r1 */
    f->holders[1].bad = f->holders[2].bad = true;
    f->holders_gen++;
    assert_null(holder_of(f, &shard));
    assert_int_equal(mc__p2p_stall_reason(f, &shard), -EILSEQ);
    f->holders[0].present = f->holders[1].present = f->holders[2].present = false;
    assert_int_equal(mc__p2p_stall_reason(f, &shard), -MC_EPEERDEAD);
    chooser_free(f);
}

/* A holder's key rewritten with an entry of another publication (a forced replacement of the
 * object, its old entry never deleted) or one this code cannot read: the holder no longer
 * serves this object, and its shards come from elsewhere. */
static void test_entry_replaced(void **state)
{
    const char *const segs[] = {"origin:1", "r1:1"};
    const unsigned haves[] = {15, 15};
    p2p_fetch_t *f = chooser(segs, haves, 2);
    uint8_t have = 15;
    p2p_rbuf_t rb = {4096, 4 * 4096};
    p2p_entry_t e = {.id = 8, .shards = 4, .have = &have, .bufs = &rb, .n_bufs = 1};
    mc_meta_event_t ev = {.type = MC_META_PUT};
    uint32_t shard;

    (void)state;
    assert_string_equal(holder_of(f, &shard), "r1:1");
    ev.kv.key = "mooncake/p2p/x/replica/r1:1";
    assert_int_equal(mc__p2p_entry_encode(&e, &ev.kv.value, &ev.kv.value_len), 0);
    mc__p2p_holders_event(f, &ev); /* id 8: another publication */
    assert_false(f->holders[1].present);
    assert_string_equal(holder_of(f, &shard), "origin:1");
    free(ev.kv.value);
    e.id = 7; /* ours again */
    assert_int_equal(mc__p2p_entry_encode(&e, &ev.kv.value, &ev.kv.value_len), 0);
    mc__p2p_holders_event(f, &ev);
    free(ev.kv.value);
    assert_true(f->holders[1].present);
    assert_string_equal(holder_of(f, &shard), "r1:1");
    ev.kv.value = "{\"v\":2}"; /* a newer format */
    ev.kv.value_len = strlen(ev.kv.value);
    mc__p2p_holders_event(f, &ev);
    assert_false(f->holders[1].present);
    assert_string_equal(holder_of(f, &shard), "origin:1");
    chooser_free(f);
}

/* A holder we could not reach (a blip: -MC_EPEERDEAD from one failed task) rests and is tried
 * again; unreachable P2P_HOLDER_LOST times in a row it is dead, and with no holder left the
 * fetch has nothing to wait for. */
static void test_holder_lost(void **state)
{
    const char *const segs[] = {"origin:1", "r1:1"};
    const unsigned haves[] = {15, 15};
    p2p_fetch_t *f = chooser(segs, haves, 2);
    p2p_held_t held = {.name = "x"};
    p2p_holder_t *o = &f->holders[0], *r1 = &f->holders[1];
    uint64_t now = mc__p2p_now_ms();
    uint32_t shard;

    (void)state;
    f->h = &held;
    assert_string_equal(holder_of(f, &shard), "r1:1");
    mc__p2p_holder_lost(f, r1, -MC_EPEERDEAD);
    mc__p2p_holder_lost(f, r1, -MC_EPEERDEAD); /* another shard in flight from it then */
    assert_int_equal(r1->lost, 1);
    assert_false(r1->dead);
    assert_true(r1->rest_until_ms >= now + P2P_LOST_REST_MS);
    assert_true(mc__p2p_holders_rest(f, mc__p2p_now_ms()));
    assert_string_equal(holder_of(f, &shard), "origin:1"); /* r1 rests */
    assert_false(mc__p2p_holders_rest(f, r1->rest_until_ms));
    assert_string_equal(holder_of(f, &shard), "r1:1"); /* tried again */
    /* still unreachable: a longer rest, then dead */
    now = mc__p2p_now_ms();
    mc__p2p_holder_lost(f, r1, -MC_ENOSEGMENT);
    assert_true(r1->rest_until_ms >= now + 2 * P2P_LOST_REST_MS);
    for (int i = 2; i < P2P_HOLDER_LOST; i++) {
        mc__p2p_holders_rest(f, r1->rest_until_ms);
        mc__p2p_holder_lost(f, r1, -MC_EPEERDEAD);
    }
    assert_true(r1->dead);
    assert_false(mc__p2p_holders_rest(f, UINT64_MAX)); /* nobody is waited for */
    assert_string_equal(holder_of(f, &shard), "origin:1");
    /* the origin goes the same way: no holder left */
    for (int i = 0; i < P2P_HOLDER_LOST; i++) {
        mc__p2p_holders_rest(f, UINT64_MAX);
        mc__p2p_holder_lost(f, o, -MC_EPEERDEAD);
    }
    assert_true(o->dead);
    assert_false(mc__p2p_holders_rest(f, UINT64_MAX));
    assert_null(holder_of(f, &shard));
    assert_int_equal(mc__p2p_stall_reason(f, &shard), -MC_EPEERDEAD);
    chooser_free(f);
}

/* Entries of another publication of the name, or unreadable ones, are no holders. */
static void test_foreign_entries(void **state)
{
    const char *const segs[] = {"origin:1"};
    const unsigned haves[] = {15};
    p2p_fetch_t *f = chooser(segs, haves, 1);
    mc_meta_event_t ev = {.type = MC_META_PUT};
    char key[] = "mooncake/p2p/x/replica/old:1";
    char val[] = "{\"v\":1,\"id\":\"0000000000000008\",\"origin\":false,\"complete\":true,"
                 "\"shards\":4,\"bufs\":[[4096,16384]]}";

    (void)state;
    ev.kv.key = key;
    ev.kv.value = val;
    ev.kv.value_len = strlen(val);
    mc__p2p_holders_event(f, &ev);
    assert_int_equal(f->n_holders, 1);
    val[28] = '7'; /* this publication's id */
    mc__p2p_holders_event(f, &ev);
    assert_int_equal(f->n_holders, 2);
    ev.type = MC_META_DELETE;
    mc__p2p_holders_event(f, &ev);
    assert_false(f->holders[1].present);
    chooser_free(f);
}

/* ---- a store that loses answers ---- */

/* Wrapped around a node's store: the next lose_cas CASes are applied but answered -MC_EMETA
 * (the answer is lost), after which the store is down if then_down: every call fails so,
 * unapplied. */
typedef struct lossy {
    struct mc_meta base;
    mc_meta_t *inner;
    int lose_cas;
    bool then_down, down;
} lossy_t;

static lossy_t *lossy_of(mc_meta_t *m)
{
    return (lossy_t *)m;
}

static int lossy_down(mc_meta_t *m)
{
    return lossy_of(m)->down ? -MC_EMETA : 0;
}

static void lossy_close(mc_meta_t *m)
{
    mc_meta_close(lossy_of(m)->inner);
    free(m);
}

static int lossy_get(mc_meta_t *m, const void *key, size_t key_len, mc_meta_kv_t *kv_p)
{
    return lossy_down(m) ?: mc_meta_get(lossy_of(m)->inner, key, key_len, kv_p);
}

static int lossy_put(mc_meta_t *m, const void *key, size_t key_len, const void *val, size_t val_len,
                     int64_t lease, int64_t *rev_p)
{
    return lossy_down(m)
               ?: mc_meta_put(lossy_of(m)->inner, key, key_len, val, val_len, lease, rev_p);
}

static int lossy_del(mc_meta_t *m, const void *key, size_t key_len, int64_t rev)
{
    return lossy_down(m) ?: mc_meta_delete(lossy_of(m)->inner, key, key_len, rev);
}

static int lossy_list(mc_meta_t *m, const void *prefix, size_t prefix_len, mc_meta_kv_t **kvs_p,
                      size_t *count_p, int64_t *rev_p)
{
    return lossy_down(m)
               ?: mc_meta_list(lossy_of(m)->inner, prefix, prefix_len, kvs_p, count_p, rev_p);
}

static int lossy_cas(mc_meta_t *m, const void *key, size_t key_len, int64_t expected,
                     const void *val, size_t val_len, int64_t lease, int64_t *rev_p)
{
    lossy_t *l = lossy_of(m);
    int rc =
        lossy_down(m) ?: mc_meta_cas(l->inner, key, key_len, expected, val, val_len, lease, rev_p);

    if (rc || l->lose_cas == 0)
        return rc;
    l->lose_cas--;
    l->down = l->then_down;
    return -MC_EMETA;
}

static const mc_meta_ops_t lossy_ops = {.size = sizeof(mc_meta_ops_t),
                                        .version = 2,
                                        .scheme = "lossy",
                                        .close = lossy_close,
                                        .get = lossy_get,
                                        .put = lossy_put,
                                        .del = lossy_del,
                                        .list = lossy_list,
                                        .cas = lossy_cas};

/* Publish "lossy", 64 KiB of value, while the store loses the CAS's answer (and then stays
 * down for the rest of the call if then_down); the result. */
static int publish_lossy(mc_p2p_t *p2p, lossy_t *l, uint8_t *buf, int value, bool then_down)
{
    mc_p2p_register_opts_t o = {.size = sizeof(o), .shard_size = 16384};
    int rc;

    memset(buf, value, 65536);
    l->lose_cas = 1;
    l->then_down = then_down;
    rc = mc_p2p_register(p2p, "lossy", &(mc_p2p_buf_t){buf, 65536}, 1, &o);
    l->lose_cas = 0;
    l->down = false; /* the store is back */
    return rc;
}

/* The "id" of a JSON document at key in the store: 0 if there is none. */
static uint64_t doc_id(mc_meta_t *meta, const char *key)
{
    mc_meta_kv_t kv;
    uint64_t id = 0;

    if (mc_meta_get(meta, key, strlen(key), &kv) == 0) {
        const char *s = strstr(kv.value, "\"id\":\"");
        if (s)
            id = strtoull(s + 6, NULL, 16);
        mc_meta_kv_free(&kv);
    }
    return id;
}

/* The CAS that writes a description is applied but its answer lost: retried while the store
 * answers, it finds our own description (success); when the store stays down the register
 * fails and leaves the description behind, with no owner. Registering the same bytes again
 * adopts it (before, -EEXIST forever: nobody could unregister it); other bytes do not. */
static void test_lost_cas(void **state)
{
    char dir[] = "/tmp/mc-p2p-units-XXXXXX", url[64], key[P2P_KEY_MAX], rkey[P2P_KEY_MAX];
    static uint8_t buf[65536];
    mc_p2p_object_info_t info;
    mc_config_t *cfg;
    mc_p2p_t *p2p;
    mc_meta_t *meta;

    (void)state;
    assert_non_null(mkdtemp(dir));
    snprintf(url, sizeof(url), "file://%s", dir);
    assert_int_equal(mc_config_create(&cfg), 0);
    assert_int_equal(mc_config_set(cfg, "METADATA", url), 0);
    assert_int_equal(mc_config_set(cfg, "LISTEN", "127.0.0.1:0"), 0);
    assert_int_equal(mc_config_set(cfg, "CONNECT_TIMEOUT_MS", "300"), 0); /* retries' bound */
    assert_int_equal(mc_p2p_create(cfg, &p2p), 0);
    mc_config_destroy(cfg);
    lossy_t *l = calloc(1, sizeof(*l));
    assert_non_null(l);
    l->base.ops = &lossy_ops;
    l->inner = p2p->meta;
    p2p->meta = &l->base;
    assert_int_equal(mc_meta_open(url, &meta), 0);
    assert_true(mc__p2p_key(p2p, "lossy", "object", key) > 0);
    assert_true(mc__p2p_replica_key(p2p, "lossy", rkey) > 0);

    /* the answer lost once: the retry finds ours */
    assert_int_equal(publish_lossy(p2p, l, buf, 1, false), 0);
    assert_int_equal(mc_p2p_unregister(p2p, "lossy", 0), 0);
    assert_int_equal(doc_id(meta, key), 0);

    /* lost, and the store down until the call gives up: the description stays, ownerless */
    assert_int_equal(publish_lossy(p2p, l, buf, 2, true), -MC_EMETA);
    uint64_t id = doc_id(meta, key);
    assert_int_not_equal(id, 0);
    assert_int_equal(doc_id(meta, rkey), 0);
    /* the same bytes again: adopted, with its id */
    assert_int_equal(publish_lossy(p2p, l, buf, 2, false), 0);
    assert_int_equal(doc_id(meta, key), id);
    assert_int_equal(doc_id(meta, rkey), id);
    assert_int_equal(mc_p2p_stat(p2p, "lossy", &info), 0);
    assert_int_equal(info.complete_holders, 1);
    assert_int_equal(mc_p2p_unregister(p2p, "lossy", 0), 0);
    assert_int_equal(doc_id(meta, key), 0);

    /* other bytes under the name of an ownerless description of ours: not adopted */
    assert_int_equal(publish_lossy(p2p, l, buf, 3, true), -MC_EMETA);
    assert_int_equal(publish_lossy(p2p, l, buf, 4, false), -EEXIST);
    assert_int_equal(mc_p2p_remove(p2p, "lossy", 0), 0);

    mc_meta_close(meta);
    mc_p2p_destroy(p2p);
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_names),         cmocka_unit_test(test_keys),
        cmocka_unit_test(test_bufs_disjoint), cmocka_unit_test(test_desc_codec),
        cmocka_unit_test(test_entry_codec),   cmocka_unit_test(test_pieces_and_hash),
        cmocka_unit_test(test_prefault),      cmocka_unit_test(test_choose),
        cmocka_unit_test(test_least_loaded),  cmocka_unit_test(test_entry_replaced),
        cmocka_unit_test(test_holder_lost),   cmocka_unit_test(test_foreign_entries),
        cmocka_unit_test(test_lost_cas),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
