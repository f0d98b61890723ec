/*
 * engine/comm/layout.h - where a rank sits in the 4D layout, and who its group peers are.
 *
 * World rank = tp + TP * (cp + CP * (pp + PP * dp)): TP varies fastest (inside a node, NVLink),
 * then CP, then PP, then DP (DESIGN.md, Llama 3's order [TP, CP, PP, DP]). Groups: TP, CP, PP and
 * DP (the ranks that differ only in that coordinate) and DP x CP (the ranks that hold the same
 * weights: gradients are reduced over it). Example, 16 ranks with every size 2: TP {0, 1},
 * CP {0, 2}, PP {0, 4}, DP {0, 8}, DP x CP {0, 2, 8, 10}.
 *
 * CP blocks (balance.cp_sharding: groups): GROUP_CP_BLOCK + k is the aligned block of 2^(k+1) CP
 * ranks this rank belongs to, CP ranks [c - c mod 2^(k+1), ..) (cut at cp). A micro-batch splits the
 * CP ranks into such blocks; each block's K/V exchange runs in its communicator, made once at start.
 */
#ifndef WLB_ENGINE_LAYOUT_H
#define WLB_ENGINE_LAYOUT_H

#ifdef __cplusplus
extern "C" {
#endif

enum { LAYOUT_CP_BLOCKS = 9 }; /* block sizes 2, 4, .., 512: every proper block of a CP group of 1024 */

typedef enum LayoutGroup {
    GROUP_TP,
    GROUP_CP,
    GROUP_PP,
    GROUP_DP,
    GROUP_DPCP,
    GROUP_WORLD,
    GROUP_CP_BLOCK,
    GROUP_COUNT = GROUP_CP_BLOCK + LAYOUT_CP_BLOCKS
} LayoutGroup;

typedef struct Layout {
    int tp, cp, pp, dp;             /* sizes */
    int rank;                       /* world rank */
    int tp_rank, cp_rank, pp_rank, dp_rank;
} Layout;

Layout layout_of(int tp, int cp, int pp, int dp, int rank);
int layout_world(const Layout *l);
int layout_rank_at(const Layout *l, int tp_rank, int cp_rank, int pp_rank, int dp_rank);
/* The world ranks of a group this rank belongs to, in group-rank order (members: size of group). */
int layout_group(const Layout *l, LayoutGroup g, int *members);
/* This rank's index within group g. */
int layout_group_rank(const Layout *l, LayoutGroup g);
/* The group of an aligned block of `size` CP ranks (a power of two): GROUP_CP when size >= cp. */
LayoutGroup layout_cp_block(const Layout *l, int size);
/* The size of block group g (GROUP_CP_BLOCK + k): 2^(k+1). */
int layout_cp_block_size(LayoutGroup g);

#ifdef __cplusplus
}
#endif

#endif
