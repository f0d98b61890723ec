/*
 * engine/model/model_impl.h - what the model's source files share (model_pass.c, model_head.c,
 * model_cp.c, model_load.c, model_format.c); not for callers outside the model.
 */
#ifndef WLB_ENGINE_MODEL_IMPL_H
#define WLB_ENGINE_MODEL_IMPL_H

#include "engine/model/model.h"
#include "util/fileio.h"
#include "util/safetensors.h"

static inline float *model_param(const Model *m, ModelTensorKind kind, int layer)
{
    return m->params + model_tensor(m, kind, layer)->offset;
}

static inline float *model_grad(const Model *m, ModelTensorKind kind, int layer)
{
    return m->grads + model_tensor(m, kind, layer)->offset;
}

/* A weight in the compute dtype, as the products read it. Consecutive weights are one product:
 * model_weight(m, T_WQ, l) is [q + k + v, d], model_weight(m, T_WGATE, l) is [2 ffn, d]. */
static inline Act *model_weight(const Model *m, ModelTensorKind kind, int layer)
{
    return ops_act(m->ops, m->wact, model_tensor(m, kind, layer)->offset);
}

/* Frees every slot's activations and the scratch (model_memory.c). */
void model_free_activations(Model *m);

/* Sums x over the TP group in place (nothing with tp = 1), in parallel.reduce_dtype; the time goes
 * to m->comm_s. Started (req: the sum is there once model_comm_wait(req) returns), or with req NULL
 * run to the end. */
int model_tp_allreduce(Model *m, float *x, int64_t n, CommRequest *req, Error *err);
/* The same over f64 host arrays, sum or max. */
int model_tp_allreduce_f64(Model *m, double *x, int64_t n, int max, Error *err);

/* SP (model_sp.c): the stream's rows dealt out to the TP ranks in pieces. Piece j is rows
 * [first, first + tp rows) of the Tp (model_sp_piece_first, model_sp_piece_rows: rows per rank),
 * the first real of them below T (model_sp_piece_real); rank r holds its rows first + r rows + i
 * as its rows j c + i. */
typedef struct SpPieces {
    int64_t T, R, c; /* rows, rows per rank, rows per rank of a piece (the last may have fewer) */
    int n, tp;       /* pieces with rows; TP ranks */
} SpPieces;
/* The pieces of every TP exchange: m->tp_chunks within 1 .. MODEL_MAX_TP_CHUNKS. */
int model_tp_chunks(const Model *m);
SpPieces model_sp_pieces(const Model *m, int64_t T);
int64_t model_sp_piece_rows(const SpPieces *p, int j);
int64_t model_sp_piece_first(const SpPieces *p, int j);
int64_t model_sp_piece_real(const SpPieces *p, int j);
/* An exchange started piece by piece: one request per piece. */
typedef struct SpExchange {
    CommRequest req[MODEL_MAX_TP_CHUNKS];
} SpExchange;
/* model_sp_gather: full [Tp, d] = the stream's rows x [R, d] of every TP rank, each in its place
 * (dt: their dtype). model_sp_scatter: part [Tp, d] holds partial sums on its first T rows; its
 * padding rows are zeroed and out [R, d] gets the sums over TP of this rank's rows. */
int model_sp_gather(Model *m, const void *x, Dt dt, int64_t T, void *full, Error *err);
int model_sp_scatter(Model *m, float *part, int64_t T, float *out, Error *err);
/* The same exchanges started (comm_istart): their result is there once model_sp_wait(ex) returns;
 * x, part stay untouched and full, out unread until then (ex NULL: run to the end, as above). */
int model_sp_gather_start(Model *m, const void *x, Dt dt, int64_t T, void *full, SpExchange *ex, Error *err);
int model_sp_scatter_start(Model *m, float *part, int64_t T, float *out, SpExchange *ex, Error *err);
int model_sp_wait(Model *m, SpExchange *ex, Error *err);
/* One piece of them: piece j's rows of full, or this rank's rows of piece j in out; started (req), or
 * with req NULL run to the end by the blocking collective on this thread. */
int model_sp_gather_piece(Model *m, const void *x, Dt dt, const SpPieces *p, int j, void *full, CommRequest *req,
                          Error *err);
int model_sp_scatter_piece(Model *m, float *part, const SpPieces *p, int j, float *out, CommRequest *req, Error *err);
/* Waits for a started exchange of the model (nothing for a request that is not active); the time
 * goes to m->comm_s. */
int model_comm_wait(Model *m, CommRequest *req, Error *err);

/* The TP products with their exchanges in pieces (model_tp.c; nothing exchanged with tp = 1 or,
 * for the gathers, without SP). model_tp_gather_product: out [T, n_out] = (x's rows of every TP
 * rank, gathered) W^T, x the stream's rows of the product's input (d wide).
 * model_tp_product_allreduce: without SP, m->tmp [T, d] = x [T, n_in] W^T summed over TP.
 * model_tp_gather_backward: the gradient dh of a row-parallel product's output (the stream's rows)
 * gathered into dout, then dw += dout^T x and dx = dout W (x: the product's input, T rows). */
int model_tp_gather_product(Model *m, MatOut out, const Act *x, const Act *w, int64_t T, int64_t n_out, Error *err);
int model_tp_product_allreduce(Model *m, const Act *x, const Act *w, int64_t T, int64_t n_in, Error *err);
int model_tp_gather_backward(Model *m, const Act *dh, const Act *x, const Act *w, float *dw, MatOut dx, int64_t T,
                             int64_t n_in, Error *err);

/* With SP, layer l's forward from its attention output to its output, and on to the next layer's
 * QKV product (before RoPE), in pieces of rows (model_chain.c). */
typedef struct ModelChainLayer {
    LayerActs *a;             /* the layer's: att read; y, rstd2, b, gu, s written */
    const float *x;           /* its input, the stream's rows */
    float *out;               /* its output, the stream's rows; NULL: stop at s (a recomputation) */
    const Act *wo, *wgu, *wdown;
    const float *mlp_norm;
    int64_t q_width;          /* columns of att: the rank's query heads' */
    LayerActs *next;          /* the next layer of the chunk (a, rstd1, qkv written); NULL: none */
    const float *next_norm;
    const Act *next_wqkv;
    int64_t next_qkv_width;
} ModelChainLayer;
int model_chain_forward(Model *m, const ModelChainLayer *in, int64_t T, Error *err);

/* With SP, the backward from layer `upper`'s QKV product (its input gradient and dWqkv, then its
 * first norm's backward into m->dh, m->dh_act) through layer upper - 1's MLP and attention output
 * product (into m->datt), in pieces of rows (model_chain_bwd.c). upper = layer_end: the chunk's top
 * layer's MLP and output product from the dh there; upper = layer_begin: its QKV product alone. */
typedef struct ModelChainBack {
    const ModelSlot *slot; /* the micro-batch's activations */
    int upper;
    const Act *a_full;     /* upper's a, all T rows, gathered by a_gather (piece by piece) */
    SpExchange *a_gather;
} ModelChainBack;
int model_chain_backward(Model *m, const ModelChainBack *in, int64_t T, Error *err);

/* CP (model_cp.c): layer a's attention forward over the micro-batch's segments, into a->att, a->lse:
 * K and V of this rank's rows (columns of a->qkv) into a->k_mb, a->v_mb at their micro-batch rows,
 * the rows of the sharded documents exchanged with the CP ranks of their blocks piece by piece,
 * the documents held whole computed beside the pieces and the sharded ones block by block as the
 * pieces arrive (b->cp_calls). And its backward from m->datt: dq into dqkv's query columns, dK and dV
 * of this rank's rows into its K and V columns (float32, width of the fused q | k | v row), the
 * sharded rows' shares summed over their block's ranks, piece by piece as the blocks are done. */
int model_cp_attention_fwd(Model *m, LayerActs *a, const ModelBatch *b, AttnShape shape, Error *err);
int model_cp_attention_bwd(Model *m, LayerActs *a, const ModelBatch *b, float *dqkv, AttnShape shape, Error *err);

/* The vocabulary-parallel embedding of the first chunk, into h (all-reduced over TP; with SP
 * reduce-scattered: h has R rows), and its backward from dh (R rows: all-gathered with SP). */
int model_embed_fwd(Model *m, float *h, const ModelBatch *b, Error *err);
int model_embed_bwd(Model *m, const float *dh, const ModelBatch *b, Error *err);
/* The output projection and the vocabulary-parallel cross-entropy of the last chunk on slot's
 * normalized rows, in chunks of rows; with train, slot->dhn gets their gradient. */
int model_head_fwd(Model *m, ModelSlot *s, const ModelBatch *b, int train, float dloss, double *loss_sum,
                   Error *err);

/* The header of a llama2.c checkpoint: its seven int32 (vocab as a size; shared: the classifier is
 * the embedding, stored as a negative vocab_size) and the floats of weights and RoPE tables after it. */
typedef struct Llama2cHeader {
    int32_t dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab, seq_len;
    int shared;
    int64_t floats;
} Llama2cHeader;

enum { WEIGHTS_SAFETENSORS = 1, WEIGHTS_LLAMA2C = 2 };

/* The format of the weight file at path, mapped (model_format.c): WEIGHTS_SAFETENSORS, or
 * WEIGHTS_LLAMA2C with its header in h; -1 with err saying what the name promised and what the
 * content is when it is neither. */
int model_weight_format(const char *path, const MappedFile *map, Llama2cHeader *h, Error *err);

/* A buffer of floats for the largest full tensor of the model (malloc; NULL out of memory). */
float *model_full_buffer(const Model *m);
/* Safetensors tensor s (of the file at path) as the full tensor t: its shape and dtype checked, read
 * into full as float32, the rank's block copied into host (the layout of params). */
int model_load_tensor(const Model *m, const ModelTensor *t, const StTensor *s, const char *path, float *full,
                      float *host, Error *err);
/* A Hugging Face model folder (model_folder.c): model.safetensors (first, as transformers), else
 * model.safetensors.index.json and the shards it names. */
int model_load_folder(Model *m, const char *dir, Error *err);

#endif
