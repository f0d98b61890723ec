/*
 * util/rng.h - the named pseudo-random generators of wlbtrain (never rand()).
 *
 * SplitMix64 (Steele, Lea, Flood 2014) turns a seed into well-mixed 64-bit words; it seeds
 * xoshiro256** (Blackman, Vigna 2018), the generator used for sampling. Both are exactly defined, so
 * a seed gives the same numbers on every machine, compiler and rank, and the state is four words
 * that a checkpoint can save.
 */
#ifndef WLB_UTIL_RNG_H
#define WLB_UTIL_RNG_H

#include <stdint.h>

/* SplitMix64 finalizer: a bijective mix of one 64-bit word. */
uint64_t rng_mix64(uint64_t x);
/* Hash of several words, order-sensitive: a seed for a sub-stream such as (seed, source, epoch). */
uint64_t rng_hash3(uint64_t a, uint64_t b, uint64_t c);

typedef struct Rng {
    uint64_t s[4];
} Rng;

void rng_seed(Rng *r, uint64_t seed);
uint64_t rng_next_u64(Rng *r);
/* Uniform integer in [0, n), n > 0, without modulo bias (Lemire's multiply-and-reject). */
uint64_t rng_below(Rng *r, uint64_t n);
/* Uniform double in [0, 1) with 53 random bits. */
double rng_uniform(Rng *r);

#endif
