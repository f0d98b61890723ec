/*
 * util/wavefront.h - the order in which one thread runs a pipeline of stages over pieces of work,
 * when each stage of a piece ends by starting an exchange that the next stage of the same piece
 * waits for, and the exchanges run one after another in the order they are started.
 *
 * Piece j runs stages 0, 1, ..., n_stages - 1 in turn, and each stage takes the pieces in turn.
 * Stage s of piece j runs at step j + WAVEFRONT_LAG s; within a step the later stage first:
 *
 *     step 0: (0,0)   step 1: (0,1)   step 2: (1,0) (0,2)   step 3: (1,1) (0,3)   step 4: (2,0) (1,2) ...
 *
 * A stage's exchange is waited for two steps after it starts, with the work of the stages run in
 * between beside it; and since exchanges run in start order, an exchange started late in a step
 * does not hold up the early stages of the next. The lag of two was chosen by simulating the TP
 * forward of engine/model/model_chain.c against other orders (lag one or three, earlier stage
 * first) over random product and exchange times: the least exposed time on average, and never more
 * than the products' exchanges pipelined one product at a time. The engine runs this order and the
 * cost model (engine/plan/cost.c) prices it by simulating it, so both see the same schedule.
 */
#ifndef WLB_UTIL_WAVEFRONT_H
#define WLB_UTIL_WAVEFRONT_H

#ifdef __cplusplus
extern "C" {
#endif

enum { WAVEFRONT_LAG = 2 };

/* The pipeline's n_stages x n_pieces stage runs in order: stage[i], piece[i] for i below the count
 * returned (n_stages n_pieces; 0 when either is not positive). */
int wavefront_order(int n_stages, int n_pieces, int *stage, int *piece);

#ifdef __cplusplus
}
#endif

#endif
