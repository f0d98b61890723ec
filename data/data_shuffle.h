/*
 * data/data_shuffle.h - a seeded pseudo-random permutation of [0, n) in O(1) memory.
 *
 * Shuffling a billion documents with Fisher-Yates needs gigabytes per epoch; a keyed bijection
 * needs four words. The permutation is a balanced Feistel network on the smallest even number of
 * bits 2h with 2^(2h) >= n: six rounds (L, R) -> (R, L ^ F_k(R)) with F_k(R) = SplitMix64(R ^ k)
 * cut to h bits and round keys k from (seed, epoch). A Feistel network is a bijection of
 * [0, 4^h) whatever F is; "cycle walking" (apply it again while the result is >= n) restricts it
 * to a bijection of [0, n), in fewer than 4 applications on average since 4^h < 4n. Position i of
 * the shuffled order is data_shuffle_at(s, i): random access, so a saved stream position is just
 * (epoch, i).
 */
#ifndef WLB_DATA_DATA_SHUFFLE_H
#define WLB_DATA_DATA_SHUFFLE_H

#include <stdint.h>

enum { DATA_SHUFFLE_ROUNDS = 6 };

typedef struct DataShuffle {
    uint64_t n;
    int half_bits;
    uint64_t keys[DATA_SHUFFLE_ROUNDS];
} DataShuffle;

void data_shuffle_init(DataShuffle *s, uint64_t n, uint64_t seed);
/* The element at position i (< n) of the shuffled order. */
uint64_t data_shuffle_at(const DataShuffle *s, uint64_t i);

#endif
