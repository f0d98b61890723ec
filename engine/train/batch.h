/*
 * engine/train/batch.h - the inputs of one micro-batch on one CP rank, from the step's plan and the data.
 *
 * For every document piece of the micro-batch the rank holds: its tokens (read from the Megatron
 * set), their targets (the next token of the same document; the last token of a document has
 * none, a piece that stops inside its document takes the document's next token), and their RoPE
 * positions (the piece's offset in its document onward). Padding pieces are token 0 with no
 * target. The rank's rows are its ranges of the micro-batch, in the plan's order; its attention
 * segments point at its own rows for the queries and at micro-batch coordinates for the keys,
 * which with CP = 1 are the same rows.
 */
#ifndef WLB_ENGINE_BATCH_H
#define WLB_ENGINE_BATCH_H

#include "data/data_sources.h"
#include "engine/model/model.h"
#include "engine/plan/plan.h"

typedef struct BatchBuffers {
    const Ops *ops;
    int32_t *tokens, *targets, *positions;      /* host, micro-batch rows (one allocation) */
    int32_t *d_tokens, *d_targets, *d_positions; /* backend copies of this rank's rows */
    int64_t cap, d_cap;
    AttnSegment *segs;
    int64_t cap_segs;
    /* CP: host index arrays (one allocation: mb_row, send_rows, recv_rows, the block of each
     * micro-batch row) and their backend copies; recv_counts per CP rank of each exchange's block. */
    int64_t *index, *d_index, *recv_counts;
    int64_t cap_index, d_cap_index, cap_counts;
    /* CP: the sharded documents' attention calls over key blocks and their segments (host). */
    CpCall *cp_calls;
    AttnSegment *block_segs;
    int64_t cap_calls, cap_block_segs;
} BatchBuffers;

/* Labeled tokens (tokens with a target) of a step: the loss is their mean. */
int64_t batch_step_targets(const StepPlan *p, const DataSources *data);

/* Fills out with micro-batch i of p as CP rank `rank` computes it, with the K/V exchanges of the
 * documents sharded over CP ranks when p->cp > 1 (one per block of CP ranks, largest first). Token ids must be below vocab (a data set with larger
 * ids is an Error naming it). */
int batch_build(BatchBuffers *bb, const StepPlan *p, int64_t i, int rank, const DataSources *data, int64_t vocab,
                ModelBatch *out, Error *err);
/* The backend's room for any micro-batch of at most mb_tokens tokens, rank_rows of them on this CP
 * rank (plan_largest), taken now: batch_build then allocates no device memory in a step. */
int batch_reserve(BatchBuffers *bb, int64_t mb_tokens, int64_t rank_rows, int cp, Error *err);
void batch_free(BatchBuffers *bb);

/* The sharded documents' attention of the micro-batch mb in out (its segments and exchanges made)
 * as calls over key blocks, out->cp_calls (batch_blocks.c, for batch_build); blk: the block of CP
 * ranks each micro-batch row's document is sharded over (plan.h's tree; 0: none). */
int batch_cp_blocks(BatchBuffers *bb, const StepPlan *p, const PlanMicroBatch *mb, int rank, const int64_t *blk,
                    ModelBatch *out, Error *err);

#endif
