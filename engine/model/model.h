/*
 * engine/model/model.h - the Llama model of one model chunk (a pipeline stage's layers) on one rank,
 * forward and backward, written once over the ops interface (ops.h) and the collectives of comm.h.
 *
 * Architecture (Hugging Face Llama): token embedding; per layer h += Wo attn(rope(Wq a), rope(Wk a),
 * Wv a) with a = rmsnorm(h), then h += Wd (silu(Wg b) * (Wu b)) with b = rmsnorm(h); final rmsnorm;
 * logits = h W_out^T with W_out the embedding when tied; cross-entropy summed over the tokens that
 * have a target. Attention is document-causal over the micro-batch's segments; RoPE positions come
 * with every token (they restart at 0 in each document and continue from a piece's offset).
 *
 * Parallelism (Megatron's tensor parallelism; context parallelism with all-gathered K/V):
 *   TP  q, k, v, gate and up are split by output rows (column-parallel), o and down by input columns
 *       (row-parallel, their outputs all-reduced over TP); each rank has n_heads / tp query heads
 *       and n_kv_heads / tp key/value heads, or one replica of a key/value head when there are
 *       fewer of them than TP ranks. The embedding and the output projection are split by
 *       vocabulary rows; the cross-entropy reduces its max, sum and target logit over TP. The
 *       gradients of the layer inputs are all-reduced over TP.
 *   CP  a rank computes its own rows of the micro-batch; before attention the K and V rows of the
 *       documents that are sharded are all-gathered over CP into a buffer in micro-batch
 *       coordinates, and their gradients are reduce-scattered back in the backward.
 *   PP  a chunk holds layers [layer_begin, layer_end), the embedding on the first chunk, the final
 *       norm and the output projection on the last (with tied embeddings the last chunk keeps a
 *       copy of the embedding; the trainer sums the two copies' gradients).
 *
 * Parameters live in one allocation, gradients in another of the same layout, as named tensors
 * with Hugging Face names (model.layers.3.self_attn.q_proj.weight, ...), each the rank's block
 * [row0, row0 + rows) x [col0, col0 + cols) of the full tensor.
 */
#ifndef WLB_ENGINE_MODEL_H
#define WLB_ENGINE_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "config/config.h"
#include "engine/comm/comm.h"
#include "engine/ops.h"
#include "util/error.h"

typedef enum ModelTensorKind {
    T_EMBED, T_ATTN_NORM, T_WQ, T_WK, T_WV, T_WO, T_MLP_NORM, T_WGATE, T_WUP, T_WDOWN, T_FINAL_NORM, T_HEAD,
} ModelTensorKind;

enum { MODEL_LAYER_TENSORS = 9 }; /* T_ATTN_NORM .. T_WDOWN */

typedef struct ModelTensor {
    char name[96];         /* Hugging Face name */
    ModelTensorKind kind;
    int layer;             /* -1 outside the layers */
    int64_t rows, cols;    /* this rank's block */
    int64_t full_rows, full_cols, row0, col0;
    int64_t offset;        /* in floats, into params and grads */
    int decay;             /* AdamW weight decay applies */
    int is_vector;         /* a norm weight: shape [cols] in files */
    int counts;            /* this rank's block counts once in the gradient norm and in gathers
                            * (replicas: one of them does) */
} ModelTensor;

typedef struct ModelDims {
    int n_layers, d, n_heads, n_kv_heads, head_dim, d_ffn, vocab;
    float norm_eps;
    int tied;
    int layer_begin, layer_end, has_embed, has_head; /* this chunk */
    int tp, tp_rank, cp;
    int local_heads, local_kv_heads, local_ffn, kv_head0, kv_replicas;
    int64_t vocab0, local_vocab; /* this rank's vocabulary rows */
} ModelDims;

/* Where this rank sits, for the model: its TP coordinate, the CP size, and which model chunk it
 * holds (the pipeline stage, or with interleaving one of the stage's virtual stages: chunk g of
 * n_chunks holds the g-th run of layers). comm NULL: one process. */
typedef struct ModelParallel {
    int tp, tp_rank, cp, chunk, n_chunks;
    Comm *comm;
} ModelParallel;

/* What a layer's backward needs from its forward, per token row. */
typedef struct LayerActs {
    float *x, *a, *rstd1, *q, *k, *v, *att, *lse, *y, *b, *rstd2, *g, *u, *s;
    float *k_mb, *v_mb; /* with CP: K and V of the micro-batch, in micro-batch rows */
} LayerActs;

/* The activations of one micro-batch in flight (1F1B keeps up to pp of them). */
typedef struct ModelSlot {
    int64_t cap, cap_mb;
    LayerActs *layers;
    float *h, *hn, *rstd_f, *dhn, *dx; /* dx: gradient of the chunk input (to send back) */
} ModelSlot;

/* One micro-batch as this rank computes it. */
typedef struct ModelBatch {
    int64_t T;                /* this rank's rows */
    const int32_t *tokens;    /* T (backend memory) */
    const int32_t *targets;   /* T, -1 = no target (backend memory) */
    const int32_t *positions; /* T (backend memory) */
    const AttnSegment *segs;  /* q_row: this rank's rows; kv_row: micro-batch rows (host memory) */
    int64_t n_segs;
    /* CP (cp > 1): the micro-batch's rows and the K/V exchange (index arrays in backend memory). */
    int64_t T_mb;             /* rows of the whole micro-batch */
    const int64_t *mb_row;    /* T: micro-batch row of each of this rank's rows */
    const int64_t *send_rows; /* n_send: this rank's rows of the sharded documents, in order */
    int64_t n_send;
    const int64_t *recv_counts; /* cp (host): how many rows each CP rank sends */
    const int64_t *recv_rows;   /* micro-batch rows of everything sent, CP rank after CP rank */
} ModelBatch;

typedef struct Model {
    ModelDims dims;
    const Ops *ops;
    Comm *comm;
    ModelTensor *tensors;
    int n_tensors;
    int64_t n_params;
    float *params, *grads; /* backend memory, n_params each */
    float *inv_freq;       /* backend memory, head_dim / 2 RoPE frequencies */
    ModelSlot *slots;
    int n_slots;
    /* Scratch shared by the slots (one op at a time), for up to cap rows / cap_mb micro-batch rows. */
    int64_t cap, cap_mb;
    float *dh, *tmp_d, *tmp_d2, *datt, *dq, *dk, *dv, *dk_mb, *dv_mb, *dg, *du, *logits, *xfer, *xfer2;
    double *row_max, *row_sum, *row_tgt;       /* backend, a head chunk of rows each */
    double *h_max, *h_sum, *h_tgt;             /* host copies, for the TP reductions */
    int32_t *h_targets;
    double comm_s;                             /* seconds spent in collectives, summed */
} Model;

/* Builds this rank's tensor table and allocates parameters and gradients (zero). par NULL: the
 * whole model in one process. */
int model_init(Model *m, const ConfigModel *cfg, const Ops *ops, const ModelParallel *par, Error *err);
void model_free(Model *m);
/* Activations for n micro-batches in flight (1 after model_init). */
int model_set_slots(Model *m, int n, Error *err);
/* Seeded normal(0, 0.02) for matrices and embeddings, 1 for norms, output projections (o_proj,
 * down_proj) scaled by 1 / sqrt(2 n_layers). Each row of a full tensor has its own stream seeded by
 * (seed, tensor, row): every rank gets its block of the same values whatever the layout. */
int model_init_weights(Model *m, uint64_t seed, Error *err);
const ModelTensor *model_tensor(const Model *m, ModelTensorKind kind, int layer);
/* The Hugging Face name of a tensor (layer: its layer, -1 outside the layers). */
void model_tensor_name(ModelTensorKind kind, int layer, char *buf, size_t size);
const ModelTensor *model_tensor_by_name(const Model *m, const char *name);

/* Forward of the chunk on a micro-batch into slot. h_in: the chunk input [T, d] (NULL on the first
 * chunk). On the last chunk the output projection runs a block of rows at a time, and with train its
 * backward too, so logits never outlive a chunk: *loss_sum gets the sum of the token losses of this
 * rank's rows, and the gradients dloss times their derivative. On other chunks the output waits in
 * model_output(m, slot). */
int model_forward(Model *m, int slot, const ModelBatch *b, const float *h_in, int train, float dloss,
                  double *loss_sum, Error *err);
/* Backward of slot after model_forward(train = 1): dh_out is the gradient of the chunk output (NULL
 * on the last chunk); accumulates every parameter gradient; the gradient of the chunk input waits
 * in model_input_grad(m, slot) (not on the first chunk). */
int model_backward(Model *m, int slot, const ModelBatch *b, const float *dh_out, Error *err);
float *model_output(const Model *m, int slot);
float *model_input_grad(const Model *m, int slot);
/* The logits of one row (host memory, vocab floats), one process only: generation and tests. */
int model_predict(Model *m, const ModelBatch *b, int64_t row, float *logits, Error *err);

/* Room for T rows (and T_mb micro-batch rows with CP) in slot and in the scratch, grown on demand;
 * and the rows of logits the output projection handles at a time. */
int model_reserve(Model *m, int slot, int64_t T, int64_t T_mb, Error *err);
int64_t model_head_chunk(const Model *m);

/* Loads weights (init_from): safetensors with Hugging Face names, or a llama2.c checkpoint; each
 * rank keeps its block. */
int model_load(Model *m, const char *path, Error *err);

/* The full tensors of a model (every rank's blocks together), in Hugging Face order: n_out gets the
 * count; names and shapes of the i-th with model_full_tensor. */
int model_full_tensor_count(const ModelDims *d);
void model_full_tensor(const ModelDims *d, int i, char *name, size_t name_size, int64_t *rows, int64_t *cols,
                       int *is_vector);
/* Copies this rank's block of full tensor `name` from full (host, rows x cols) into dst (host, the
 * rank's layout of params); 0 if the rank holds none of it. */
int model_put_block(const Model *m, const char *name, const float *full, float *dst);

#endif
