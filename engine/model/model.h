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
 *   SP  sequence parallelism (parallel.sequence_parallel, with tp > 1): the residual stream, both
 *       RMSNorms and what they keep live on 1/tp of the rows. The chunk's T rows (the CP rank's) are
 *       padded to Tp = tp ceil(T / tp), dealt out in parallel.tp_chunks pieces of consecutive rows,
 *       an equal share of each piece to each TP rank (model_sp.c; one piece: TP rank r holds rows
 *       [r Tp / tp, (r + 1) Tp / tp)); the products split with their exchanges along the pieces
 *       (model_tp.c). The
 *       normed rows are all-gathered over TP before the column-parallel products, whose outputs
 *       (heads, FFN columns) cover all T rows as without SP; the row-parallel products' partial sums
 *       are reduce-scattered instead of all-reduced; the backward mirrors both (the gradient of the
 *       residual all-gathered before the row-parallel products' backward, the input gradients
 *       reduce-scattered, the kept normed rows all-gathered again for the weight gradients). The
 *       embedding reduce-scatters, the head all-gathers the normed rows. Padding rows (at most
 *       tp - 1, in the last piece) are zero throughout: no product, attention or loss reads
 *       them. The norms' weight gradients are then partial sums over each rank's rows: the trainer
 *       sums them over TP.
 *   CP  a rank computes its own rows of the micro-batch; before attention the K and V rows of the
 *       documents that are sharded are all-gathered over CP into a buffer in micro-batch
 *       coordinates, and their gradients are reduce-scattered back in the backward.
 *   PP  a chunk holds layers [layer_begin, layer_end), the embedding on the first chunk, the final
 *       norm and the output projection on the last (with tied embeddings the last chunk keeps a
 *       copy of the embedding; the trainer sums the two copies' gradients).
 *
 * Parameters live in one allocation, gradients in another of the same layout, as named tensors
 * with Hugging Face names (model.layers.3.self_attn.q_proj.weight, ...), each the rank's block
 * [row0, row0 + rows) x [col0, col0 + cols) of the full tensor. A layer's Wq, Wk, Wv blocks are
 * consecutive, and so are Wgate, Wup: each group is one product ([q + k + v, d] and [2 ffn, d]).
 *
 * Precision (ops.h): the parameters are the float32 master weights; the products read wact, their
 * copy in the backend's compute dtype, which the optimizer writes as it updates them. Activations
 * a product or attention reads are in the compute dtype; the residual stream, its gradient, the
 * norms' statistics, attention's log-sum-exp and the logits stay float32 (see LayerActs).
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
/* What of a layer's gradients Model.grads_ready says is final. */
typedef enum ModelGradsPart { MODEL_GRADS_ALL, MODEL_GRADS_MLP } ModelGradsPart;

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
    int sp;              /* sequence parallelism on (tp > 1 and parallel.sequence_parallel) */
    int local_heads, local_kv_heads, local_ffn, kv_head0, kv_replicas;
    int64_t vocab0, local_vocab; /* this rank's vocabulary rows */
} ModelDims;

/* Where this rank sits, for the model: its TP coordinate, the CP size, and which model chunk it
 * holds (the pipeline stage, or with interleaving one of the stage's virtual stages: chunk g of
 * n_chunks holds the g-th run of layers, [layer_begin, layer_end) under the config's split,
 * config_chunk_layers). comm NULL: one process. */
typedef struct ModelParallel {
    int tp, tp_rank, cp, chunk, n_chunks;
    int layer_begin, layer_end;
    Comm *comm;
    int sequence_parallel; /* parallel.sequence_parallel (takes effect with tp > 1) */
} ModelParallel;

/* What a layer's backward needs from its forward. Act arrays are in the backend's compute dtype
 * (bf16 on the GPU), the rest float32: rstd and lse are statistics of a sum, y is the residual
 * stream (kept in float32 so that every layer adds to the full-precision sum). Under
 * train.recompute some of them are not kept per layer but recomputed in the backward into the
 * model's scratch (model_memory lists which). Rows: T the CP rank's rows of the micro-batch, R
 * those of its residual stream on this TP rank (T, or with SP ceil(T / tp): model_rows), T_mb the
 * micro-batch's. */
typedef struct LayerActs {
    Act *a;             /* rmsnorm(x), the input of the Q/K/V product      [R, d] */
    float *rstd1;       /*                                                  [R] */
    Act *qkv;           /* q | k | v after RoPE on q and k                  [T, q + k + v] */
    Act *k_mb, *v_mb;   /* with CP: K and V in micro-batch rows             [T_mb, k] */
    Act *att;           /* attention output                                 [T, q] */
    float *lse;         /* its log-sum-exp per row and head                 [T, heads] */
    float *y;           /* x + the attention block                          [R, d] */
    Act *b;             /* rmsnorm(y), the input of the gate/up product     [R, d] */
    float *rstd2;       /*                                                  [R] */
    Act *gu;            /* gate | up                                        [T, 2 ffn] */
    Act *s;             /* silu(gate) * up, the input of the down product   [T, ffn] */
} LayerActs;

/* The activations of one micro-batch in flight (1F1B keeps up to pp of them). */
typedef struct ModelSlot {
    int64_t cap, cap_mb;
    float **h;          /* n + 1 residual buffers [R, d]: h[0] the chunk input, h[i + 1] the output of
                         * its layer i (h[n] the chunk's output, or the final norm's input) */
    LayerActs *layers;  /* per layer: the slot's own arrays, or the model's scratch where recomputed */
    Act *hn;            /* last chunk: the final norm's output                 [R, d] */
    float *rstd_f;      /*                                                     [R] */
    float *dhn;         /* last chunk: the gradient of hn                      [R, d] */
    float *dx;          /* not the first chunk: the gradient of its input     [R, d] (to send back) */
} ModelSlot;

/* One K/V exchange of a micro-batch (CP): the aligned block of CP ranks [first, first + size) with
 * the documents sharded over exactly that block. Every rank of the block sends its rows of those
 * documents (send_rows, in its own row order) and receives everyone's, CP rank after CP rank of the
 * block (recv_counts), placed at their micro-batch rows (recv_rows). */
typedef struct CpExchange {
    int first, size;              /* the block of CP ranks (size > 1) */
    const int64_t *send_rows;     /* n_send: this rank's rows (local indices) of the block's documents */
    int64_t n_send;
    const int64_t *recv_counts;   /* size (host): how many rows each CP rank of the block sends */
    const int64_t *recv_rows;     /* micro-batch rows of everything sent, CP rank after CP rank */
} CpExchange;

/* At most one exchange per block size: log2(1024) + 1 sizes for CP up to 1024. */
enum { MODEL_MAX_CP_EXCHANGES = 11 };

/* With CP, the attention of the sharded documents runs key block by key block (model_cp.c): call c
 * reads the keys of the block's rank `src` (of exchange `ex`) that its segments' queries see, in
 * micro-batch rows (host memory; each query segment at most once a call). The calls run in this
 * order: exchange after exchange; in each, this rank's own keys first - its first call holds every
 * query segment's diagonal block (`first`: attention_merge starts there) -, then the other ranks'
 * in block order, each once its rows have arrived. */
typedef struct CpCall {
    int ex, src, first;
    const AttnSegment *segs;
    int64_t n_segs;
} CpCall;
/* The most pieces a TP product and its exchange split into (parallel.tp_chunks, model_tp.c). */
enum { MODEL_MAX_TP_CHUNKS = 16 };

/* One micro-batch as this rank computes it. */
typedef struct ModelBatch {
    int64_t T;                /* this rank's rows */
    const int32_t *tokens;    /* T (backend memory) */
    const int32_t *targets;   /* T, -1 = no target (backend memory) */
    const int32_t *positions; /* T (backend memory) */
    const AttnSegment *segs;  /* q_row: this rank's rows; kv_row: micro-batch rows (host memory) */
    int64_t n_segs;
    /* Host memory, T: NULL, or the loss of each row with a target, written by the head (rows without
     * one are left as they are): the evaluation's loss by position (engine/train/train_eval.c). */
    double *row_loss;
    /* The first n_whole_segs segments are of documents this rank holds whole (they read its own
     * rows only: no K/V exchange needed); the rest of documents sharded over CP ranks. */
    int64_t n_whole_segs;
    /* CP (cp > 1): the micro-batch's rows and the K/V exchanges (index arrays in backend memory). */
    int64_t T_mb;             /* rows of the whole micro-batch */
    const int64_t *mb_row;    /* T: micro-batch row of each of this rank's rows */
    /* One exchange per block above this rank that holds sharded documents (the whole CP group, or
     * with sharding groups possibly several nested blocks), largest block first: every rank of a
     * block calls its collectives in the same order, so nested blocks never wait on each other.
     * A row belongs to one document and a document to one block: the exchanges' rows are
     * disjoint. n_cp_ex 0: nothing to exchange. */
    CpExchange cp_ex[MODEL_MAX_CP_EXCHANGES];
    int n_cp_ex;
    const CpCall *cp_calls;   /* the sharded documents' attention, block by block (host memory) */
    int64_t n_cp_calls;
} ModelBatch;

typedef struct Model {
    ModelDims dims;
    const Ops *ops;
    Comm *comm;
    Recompute recompute;
    int64_t logits_floats; /* the output head's block of logits, rows x columns (model_head_tiles): the
                            * backend's ops->logits_floats unless train.logits_block sets it (set before
                            * model_reserve) */
    Dt sum_dt;          /* the TP and CP partial sums' dtype (parallel.reduce_dtype; DT_F32 unless set) */
    int tp_chunks;      /* pieces of each TP product and its exchange (parallel.tp_chunks; model_tp.c; 0: 1) */
    ModelTensor *tensors;
    int n_tensors;
    int64_t n_params;
    float *params, *grads; /* backend memory, n_params each: float32 master weights, their gradients */
    Act *wact;             /* the weights in the compute dtype, the layout of params (params itself when
                            * that is float32); written by the optimizer (model_weights_changed) */
    float *inv_freq;       /* backend memory, head_dim / 2 RoPE frequencies */
    float rope_scale;      /* what RoPE multiplies cos and sin by (yarn's attention factor; else 1) */
    ModelSlot *slots;
    int n_slots;
    /* Scratch shared by the slots (one op at a time), for up to cap rows / cap_mb micro-batch rows. */
    int64_t cap, cap_mb;
    LayerActs rc;          /* the arrays train.recompute does not keep per layer, one layer's worth */
    float *dh, *tmp, *g32; /* gradient of the residual stream [R, d], TP partial sums [Tp, d] (Tp: T
                            * padded to a multiple of tp with SP, else T), [T, max(ffn, qkv)] */
    Act *dh_act, *dgu, *datt, *dqkv;
    Act *sp_full;          /* SP: rows all-gathered over TP (normed rows, dh_act, hn)  [Tp, d] */
    float *sp_part;        /* SP: this rank's rows of an input gradient, reduce-scattered [R, d] */
    float *dk_mb, *dv_mb, *xfer, *xfer2;      /* CP: dK, dV in micro-batch rows; the exchange */
    float *att_acc, *att_acc_lse;             /* CP: the sharded rows' attention merged so far [T, q], [T, heads] */
    Act *att_part;                            /* CP: one key block's attention [T, q] */
    float *att_part_lse;                      /*     and its log-sum-exp [T, heads] */
    CommRequest *cp_req;                      /* CP: a request per piece of the exchanges (2 cp) */
    float *logits;                            /* a block of logits: rows x a tile of the vocabulary */
    Act *dlogits;                             /* their gradient */
    double *stats, *lse;                      /* backend, per row of a logits block: 3, 1 */
    double *h_stats, *h_lse;                  /* host copies, for the TP reductions */
    int32_t *h_targets;
    double comm_s;                            /* seconds spent in collectives, summed */
    /* Called by model_backward as gradients become final (NULL: nothing): with part
     * MODEL_GRADS_MLP once layer l's MLP half (its MLP norm and the three MLP products, whose
     * backward runs before the attention half's) has its gradients, with MODEL_GRADS_ALL once the
     * whole layer l has; with l = layer_end once the tensors after the layers (final norm, output
     * projection) have theirs, and with l = -1 once the embedding has its (the chunk's last act):
     * where the trainer starts the reduction of those gradients on a chunk's last micro-batch. */
    int (*grads_ready)(void *ctx, struct Model *m, int layer, ModelGradsPart part, Error *err);
    void *grads_ready_ctx;
    /* Called by the forward before it reads the weights of layer l (layer_begin .. layer_end - 1),
     * of the tensors before the layers (-1: embedding) and of those after them (layer_end: final
     * norm, output projection) (NULL: nothing): where the trainer waits for a bucket of parameters
     * still being gathered after a ZeRO-1 update. */
    int (*weights_needed)(void *ctx, struct Model *m, int layer, Error *err);
    void *weights_needed_ctx;
} Model;

/* The bytes of a model's activations: what a slot keeps for a micro-batch of T rows (T_mb
 * micro-batch rows with CP), and the scratch the slots share, under recompute mode r with
 * act_bytes-byte compute elements and logits blocks of logits_floats. model_reserve allocates
 * exactly these. */
typedef struct ModelMemory {
    int64_t slot_bytes, scratch_bytes;
} ModelMemory;
ModelMemory model_memory(const ModelDims *d, int64_t T, int64_t T_mb, Recompute r, size_t act_bytes,
                         int64_t logits_floats);

/* The shapes of a rank's share of the model (par NULL: the whole model in one process), and the
 * parameters it holds (-1: out of host memory): what model_init would allocate, without allocating. */
void model_dims(ModelDims *d, const ConfigModel *c, const ModelParallel *par);
int64_t model_param_count(const ConfigModel *c, const ModelParallel *par);
/* The tensor table of that share (par->comm unused), malloc'd into *tensors (n of them, n_params
 * parameters): what a checkpoint's index is made from. */
int model_tensor_table(const ConfigModel *c, const ModelParallel *par, ModelTensor **tensors, int *n, int64_t *n_params,
                       Error *err);

/* Builds this rank's tensor table and allocates parameters and gradients (zero). par NULL: the
 * whole model in one process. recompute: train.recompute. */
int model_init(Model *m, const ConfigModel *cfg, const Ops *ops, const ModelParallel *par, Recompute recompute,
               Error *err);
void model_free(Model *m);
/* Activations for n micro-batches in flight (1 after model_init). */
int model_set_slots(Model *m, int n, Error *err);
/* Seeded normal(0, 0.02) for matrices and embeddings, 1 for norms, output projections (o_proj,
 * down_proj) scaled by 1 / sqrt(2 n_layers). Each row of a full tensor has its own stream seeded by
 * (seed, tensor, row): every rank gets its block of the same values whatever the layout. */
int model_init_weights(Model *m, uint64_t seed, Error *err);
/* After params changed other than through the optimizer's update (init, load, resume, a gather):
 * writes the compute-dtype copy of the weights (nothing when it is params itself). */
void model_weights_changed(Model *m);
/* The same for params [begin, end) only. */
void model_weights_changed_range(Model *m, int64_t begin, int64_t end);
const ModelTensor *model_tensor(const Model *m, ModelTensorKind kind, int layer);
/* The Hugging Face name of a tensor (layer: its layer, -1 outside the layers). */
void model_tensor_name(ModelTensorKind kind, int layer, char *buf, size_t size);
const ModelTensor *model_tensor_by_name(const Model *m, const char *name);

/* Forward of the chunk on a micro-batch into slot. h_in: the chunk input [R, d] (NULL on the first
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

/* The rows of the residual stream of a micro-batch of T rows (a CP rank's) on this TP rank: T, or
 * with sequence parallelism ceil(T / tp) (the stream's rows padded to a multiple of tp). Chunk
 * inputs, outputs and their gradients (model_output, model_input_grad) have this many rows. */
int64_t model_rows(const ModelDims *d, int64_t T);
/* The largest partial sum the model makes (parallel.reduce_dtype: compute sums them in bfloat16),
 * for a micro-batch of at most mb_tokens tokens, rank_rows on this CP rank: a TP sum of the stream's
 * rows (with SP the rows of every TP rank), or the K/V gradients of a micro-batch's rows over CP
 * (model_cp.c's exchange buffer). */
int64_t model_largest_sum(const ModelDims *d, int64_t rank_rows, int64_t mb_tokens);

/* Room for T rows (and T_mb micro-batch rows with CP) in slot and in the scratch, grown on demand;
 * out of memory is an Error that says how much was needed, how much is free and which keys would
 * help. */
int model_reserve(Model *m, int slot, int64_t T, int64_t T_mb, Error *err);

/* How the output head cuts its logits for micro-batches of up to T rows (model_head.c): blocks of
 * `rows` rows, each a tile of `cols` columns of the rank's vocabulary slice at a time (cols = the
 * whole slice: the logits of a block are computed once; fewer: the backward recomputes each tile's
 * product), rows x cols <= logits_floats. The blocks of whole slices while they hold at least
 * MODEL_HEAD_MIN_ROWS rows (or all T); else blocks of that many rows over tiles of the vocabulary. */
enum { MODEL_HEAD_MIN_ROWS = 512 };
typedef struct HeadTiles {
    int64_t rows, cols;
} HeadTiles;
HeadTiles model_head_tiles(const ModelDims *d, int64_t logits_floats, int64_t T);

/* The RoPE table of model.rope_* (model_rope.c): the head_dim / 2 frequencies into inv_freq; returns
 * the factor cos and sin are multiplied by (1 but for yarn). */
float model_rope_table(const ConfigModel *c, int head_dim, float *inv_freq);

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
