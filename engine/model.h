/*
 * engine/model.h - the Llama model of one pipeline stage, forward and backward, written once over
 * the ops interface (ops.h).
 *
 * Architecture (Hugging Face Llama): token embedding; per layer h += Wo attn(rope(Wq a), rope(Wk a),
 * Wv a) with a = rmsnorm(h), then h += Wd (silu(Wg b) * (Wu b)) with b = rmsnorm(h); final rmsnorm;
 * logits = h W_out^T with W_out the embedding when tied; cross-entropy summed over the tokens that
 * have a target. Attention is document-causal over the micro-batch's segments; RoPE positions come
 * with every token (they restart at 0 in each document and continue from a piece's offset).
 *
 * Parameters live in one allocation, gradients in another of the same layout, as named tensors
 * with Hugging Face names (model.layers.3.self_attn.q_proj.weight, ...). A stage holds layers
 * [layer_begin, layer_end), the embedding if it is the first stage, the final norm and the output
 * projection if it is the last.
 */
#ifndef WLB_ENGINE_MODEL_H
#define WLB_ENGINE_MODEL_H

#include <stdint.h>

#include "config/config.h"
#include "engine/ops.h"
#include "util/error.h"

typedef enum ModelTensorKind {
    T_EMBED, T_ATTN_NORM, T_WQ, T_WK, T_WV, T_WO, T_MLP_NORM, T_WGATE, T_WUP, T_WDOWN, T_FINAL_NORM, T_HEAD,
} ModelTensorKind;

enum { MODEL_LAYER_TENSORS = 9 }; /* T_ATTN_NORM .. T_WDOWN */

typedef struct ModelTensor {
    char name[96];   /* Hugging Face name */
    ModelTensorKind kind;
    int layer;       /* -1 outside the layers */
    int64_t rows, cols;
    int64_t offset;  /* in floats, into params and grads */
    int decay;       /* AdamW weight decay applies */
} ModelTensor;

typedef struct ModelDims {
    int n_layers, d, n_heads, n_kv_heads, head_dim, d_ffn, vocab;
    float norm_eps;
    int tied;
    int layer_begin, layer_end, has_embed, has_head; /* this stage */
} ModelDims;

/* What a layer's backward needs from its forward, per token row. */
typedef struct LayerActs {
    float *x, *a, *rstd1, *q, *k, *v, *att, *lse, *y, *b, *rstd2, *g, *u, *s;
} LayerActs;

typedef struct Model {
    ModelDims dims;
    const Ops *ops;
    ModelTensor *tensors;
    int n_tensors;
    int64_t n_params;
    float *params, *grads; /* backend memory, n_params each */
    float *inv_freq;       /* backend memory, head_dim / 2 RoPE frequencies */
    /* Activations for up to cap_tokens rows (grown on demand). */
    int64_t cap_tokens;
    LayerActs *acts;       /* one per layer of the stage */
    float *h, *hn, *rstd_f, *dh, *dhn, *tmp_d, *tmp_d2, *datt, *dq, *dk, *dv, *dg, *du, *logits;
} Model;

/* One micro-batch as this rank computes it. */
typedef struct ModelBatch {
    int64_t T;              /* rows */
    const int32_t *tokens;  /* T (backend memory) */
    const int32_t *targets; /* T, -1 = no target (backend memory) */
    const int32_t *positions; /* T (backend memory) */
    const AttnSegment *segs; /* host memory, read by the backend's attention */
    int64_t n_segs;
} ModelBatch;

/* Builds the tensor table and allocates parameters and gradients (zero) for the whole model as
 * one stage. */
int model_init(Model *m, const ConfigModel *cfg, const Ops *ops, Error *err);
void model_free(Model *m);
/* Seeded normal(0, 0.02) for matrices and embeddings, 1 for norms, output projections (o_proj,
 * down_proj) scaled by 1 / sqrt(2 n_layers). Each row has its own stream seeded by (seed, tensor,
 * row): the values do not depend on how the model is laid out over ranks. */
void model_init_weights(Model *m, uint64_t seed);
const ModelTensor *model_tensor(const Model *m, ModelTensorKind kind, int layer);
const ModelTensor *model_tensor_by_name(const Model *m, const char *name);

/* Forward of the stage on a micro-batch, and (train = 1) the output projection's backward right
 * away, so that logits never outlive a chunk of rows: returns in *loss_sum the sum of the token
 * losses; the gradients get dloss times d(loss_sum). */
int model_forward(Model *m, const ModelBatch *b, int train, float dloss, double *loss_sum, Error *err);
/* The logits of one row (host memory, vocab floats): for generation and tests. */
int model_predict(Model *m, const ModelBatch *b, int64_t row, float *logits, Error *err);
/* Backward of the stage after model_forward(train = 1): accumulates every parameter gradient. */
int model_backward(Model *m, const ModelBatch *b, Error *err);

/* Room for the activations of T rows (grown on demand by model_forward), and the rows of logits
 * the output projection handles at a time. */
int model_reserve(Model *m, int64_t T, Error *err);
int64_t model_head_chunk(const Model *m);

/* Loads weights (init_from): safetensors with Hugging Face names, or a llama2.c checkpoint. */
int model_load(Model *m, const char *path, Error *err);

#endif
