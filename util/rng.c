/* util/rng.c - SplitMix64 and xoshiro256** (see rng.h). */
#include "util/rng.h"

uint64_t rng_mix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

uint64_t rng_hash3(uint64_t a, uint64_t b, uint64_t c)
{
    return rng_mix64(rng_mix64(rng_mix64(a) ^ b) ^ c);
}

void rng_seed(Rng *r, uint64_t seed)
{
    /* Four successive SplitMix64 outputs; never all zero since mix64 is a bijection of distinct inputs. */
    for (int i = 0; i < 4; i++) {
        seed += 0x9e3779b97f4a7c15ull;
        r->s[i] = rng_mix64(seed);
    }
}

static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t rng_next_u64(Rng *r)
{
    uint64_t *s = r->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

uint64_t rng_below(Rng *r, uint64_t n)
{
    /* 64x64 -> 128-bit product; the high word is uniform once low words below 2^64 mod n are rejected. */
    unsigned __int128 m = (unsigned __int128)rng_next_u64(r) * n;
    uint64_t low = (uint64_t)m;
    if (low < n) {
        uint64_t threshold = -n % n;
        while (low < threshold) {
            m = (unsigned __int128)rng_next_u64(r) * n;
            low = (uint64_t)m;
        }
    }
    return (uint64_t)(m >> 64);
}

double rng_uniform(Rng *r)
{
    return (double)(rng_next_u64(r) >> 11) * 0x1.0p-53;
}
