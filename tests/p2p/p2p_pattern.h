/* The bytes P2P tests publish and check: a function of a seed and the object offset, so that
 * any process can check any range without a copy of the source. */
#ifndef MC_TESTS_P2P_PATTERN_H
#define MC_TESTS_P2P_PATTERN_H

#include <stddef.h>
#include <stdint.h>

static inline uint64_t pattern_word(uint64_t seed, uint64_t index)
{
    uint64_t z = seed * 0x9e3779b97f4a7c15ull + index + 1; /* splitmix64 */

    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* The byte at object offset off. */
static inline uint8_t pattern_byte(uint64_t seed, uint64_t off)
{
    return (uint8_t)(pattern_word(seed, off / 8) >> (off % 8 * 8));
}

/* Fill len bytes that sit at object offset off. */
static inline void pattern_fill(void *buf, size_t len, uint64_t seed, uint64_t off)
{
    uint8_t *p = buf;
    size_t i = 0;

    for (; i < len && (off + i) % 8; i++)
        p[i] = pattern_byte(seed, off + i);
    for (; i + 8 <= len; i += 8) {
        uint64_t w = pattern_word(seed, (off + i) / 8);
        for (int b = 0; b < 8; b++)
            p[i + b] = (uint8_t)(w >> (8 * b));
    }
    for (; i < len; i++)
        p[i] = pattern_byte(seed, off + i);
}

/* The index of the first byte that differs, or -1. */
static inline int64_t pattern_check(const void *buf, size_t len, uint64_t seed, uint64_t off)
{
    const uint8_t *p = buf;

    for (size_t i = 0; i < len; i++)
        if (p[i] != pattern_byte(seed, off + i))
            return (int64_t)i;
    return -1;
}

#endif
