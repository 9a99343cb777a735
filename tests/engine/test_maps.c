/* Whether memory is read-only, as registrations ask it (engine/sys/maps.h): a layout of pages
 * of every kind (writable, read-only, PROT_NONE, unmapped, a file mapped PROT_READ, write-only,
 * shared), ranges over them, and every mapping of the process itself; PROCMAP_QUERY and the
 * text of /proc/self/maps must both give the expected answer. */
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

#include "sys/maps.h"

/* Both ways agree with want (the query: where the kernel has it). */
static void expect(uint64_t addr, uint64_t len, int want)
{
    int q = mc__maps_read_only_query(addr, len), t = mc__maps_read_only_text(addr, len);

    if (q != -ENOTSUP && q != want)
        fail_msg("query: [%#llx, +%#llx) is %d, expected %d", (unsigned long long)addr,
                 (unsigned long long)len, q, want);
    if (t != want)
        fail_msg("text: [%#llx, +%#llx) is %d, expected %d", (unsigned long long)addr,
                 (unsigned long long)len, t, want);
    assert_int_equal(mc__maps_read_only(addr, len), want);
}

enum { P_RW, P_RO, P_NONE, P_HOLE, P_FILE, P_RW2, P_WONLY, P_SHARED, PAGES };

static void test_layout(void **state)
{
    (void)state;
    size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    char path[] = "/tmp/test_maps_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    unlink(path);
    assert_int_equal(ftruncate(fd, (off_t)pg), 0);
    uint8_t *base =
        mmap(NULL, PAGES * pg, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    assert_true(base != MAP_FAILED);
    assert_int_equal(mprotect(base + P_RO * pg, pg, PROT_READ), 0);
    assert_int_equal(mprotect(base + P_NONE * pg, pg, PROT_NONE), 0);
    assert_int_equal(munmap(base + P_HOLE * pg, pg), 0);
    assert_true(mmap(base + P_FILE * pg, pg, PROT_READ, MAP_SHARED | MAP_FIXED, fd, 0) !=
                MAP_FAILED);
    assert_int_equal(mprotect(base + P_WONLY * pg, pg, PROT_WRITE), 0);
    assert_true(mmap(base + P_SHARED * pg, pg, PROT_READ | PROT_WRITE,
                     MAP_SHARED | MAP_ANONYMOUS | MAP_FIXED, -1, 0) != MAP_FAILED);
    uint64_t b = (uint64_t)(uintptr_t)base;
#define AT(page) (b + (uint64_t)(page)*pg)

    expect(AT(P_RW), pg, 0);
    expect(AT(P_RW), 2 * pg, 1);
    expect(AT(P_RO), pg, 1);
    expect(AT(P_RW) + pg / 2, pg / 2, 0);             /* the writable page's second half */
    expect(AT(P_RO) - 1, 2, 1);                       /* one byte of each */
    expect(AT(P_NONE), 2 * pg, 0);                    /* PROT_NONE and a hole */
    expect(AT(P_NONE), 3 * pg, 1);                    /* then the file */
    expect(AT(P_HOLE), pg, 0);                        /* nothing mapped */
    expect(AT(P_FILE) + pg - 1, 1, 1);                /* its last byte */
    expect(AT(P_RW2), PAGES * pg - AT(P_RW2) + b, 0); /* writable, write-only, shared */
    expect(AT(P_RW2), pg, 0);
    expect(AT(P_WONLY), pg, 0);
    expect(AT(P_SHARED), pg, 0);
    expect(AT(P_RW), PAGES * pg, 1); /* the whole layout */
#undef AT
    munmap(base, PAGES * pg);
    close(fd);
}

/* Every mapping of this process (libraries' code and data, the heap, the stack, vvar...), each
 * alone and each with the one after it: what its line says. */
static void test_own_mappings(void **state)
{
    (void)state;
    static struct {
        unsigned long long lo, hi;
        int ro;
    } v[4096];
    size_t n = 0;
    char line[4096];
    FILE *f = fopen("/proc/self/maps", "r");

    assert_non_null(f);
    while (n < sizeof(v) / sizeof(v[0]) && fgets(line, sizeof(line), f)) {
        char perms[5];
        if (sscanf(line, "%llx-%llx %4s", &v[n].lo, &v[n].hi, perms) != 3)
            continue;
        v[n++].ro = perms[0] == 'r' && perms[1] != 'w';
    }
    fclose(f);
    assert_true(n > 10);
    for (size_t i = 0; i < n; i++) {
        if (v[i].hi >> 63) /* [vsyscall]: not one of the process's own mappings to the query */
            continue;
        expect(v[i].lo, v[i].hi - v[i].lo, v[i].ro);
        if (i + 1 < n && !(v[i + 1].hi >> 63))
            expect(v[i].lo, v[i + 1].hi - v[i].lo, v[i].ro || v[i + 1].ro);
    }
    if (mc__maps_read_only_query(v[0].lo, 1) == -ENOTSUP)
        printf(
            "# this kernel has no PROCMAP_QUERY (before Linux 6.11): the text alone was checked\n");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layout),
        cmocka_unit_test(test_own_mappings),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
