/* data/data_shuffle.c - Feistel permutation with cycle walking (see data_shuffle.h). */
#include "data/data_shuffle.h"

#include "util/rng.h"

void data_shuffle_init(DataShuffle *s, uint64_t n, uint64_t seed)
{
    s->n = n;
    s->half_bits = 1;
    while (s->half_bits < 32 && (UINT64_C(1) << (2 * s->half_bits)) < n)
        s->half_bits++;
    for (int r = 0; r < DATA_SHUFFLE_ROUNDS; r++)
        s->keys[r] = rng_hash3(seed, 0x5348554646ull /* "SHUFF" */, (uint64_t)r);
}

static uint64_t feistel(const DataShuffle *s, uint64_t x)
{
    int h = s->half_bits;
    uint64_t mask = (UINT64_C(1) << h) - 1;
    uint64_t left = x >> h, right = x & mask;
    for (int r = 0; r < DATA_SHUFFLE_ROUNDS; r++) {
        uint64_t next = left ^ (rng_mix64(right ^ s->keys[r]) & mask);
        left = right;
        right = next;
    }
    return (left << h) | right;
}

uint64_t data_shuffle_at(const DataShuffle *s, uint64_t i)
{
    uint64_t x = feistel(s, i);
    while (x >= s->n)
        x = feistel(s, x);
    return x;
}
