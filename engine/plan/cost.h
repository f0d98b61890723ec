/*
 * engine/plan/cost.h - the cost model: predicted time of the work a rank does for a micro-batch.
 *
 * The planner, the CP sharding selector and the dry run all predict with this one model, and the
 * trainer logs its predictions beside measured times. Per transformer layer and per rank:
 *
 *   attention  For each attention segment (q_len query tokens against kv_len keys, document-causal,
 *              so query i sees kv_len - q_len + i + 1 keys) the kernel works on q_len rounded up to
 *              the tile (128 query rows on Hopper FlashAttention):
 *                  pairs  = qp * (kv_len - q_len) + qp * (qp + 1) / 2,   qp = ceil(q_len / tile) * tile
 *                  FLOPs  = 4 * head_dim * local_heads * pairs  (forward: Q K^T and P V)
 *                           x 2.5 for the backward (5 matmuls, recompute included)
 *              at an achieved rate that falls for short query chunks:
 *                  rate(qp) = peak * attn_efficiency * qp / (qp + attn_half_tokens)
 *              (a fit of FA3's forward TFLOP/s against length, performance.md §2.2: 430 TF at 512
 *              tokens to 621 at 16K on H100 is 630 * L / (L + 238) within 2%), backward at
 *              attn_bwd_ratio of the forward rate: the published rates (h100-fa3). A calibration file
 *              - the engine's profiles of engine/plan/profiles/ with train.device cuda, or
 *              balance.calibration - replaces the curve by a table measured at the model's head size
 *              (or the nearest measured).
 *   linear     GEMM FLOPs of the layer's local TP shard per token, x 3 for forward + backward,
 *              at peak * gemm_efficiency; norms, RoPE, SwiGLU and residuals as HBM bytes per token;
 *              plus launch_us per layer for a micro-batch with tokens (calibrated profiles).
 *   comm       Each collective as the engine runs it (parallel.overlap), over the bandwidth of the link
 *              its group uses (NVLink inside a node, the network across nodes), ring algorithms:
 *              TP with sequence parallelism (parallel.sequence_parallel), per layer: the forward's 2
 *              all-gathers of normed rows (compute dtype) and 2 reduce-scatters of partial sums
 *              (parallel.reduce_dtype), exposed; the backward's 2 all-gathers of the stream's gradient
 *              (exposed: the products wait for them), 2 all-gathers of the normed rows again and 2
 *              reduce-scatters of the input gradient. With overlap each all-gather of normed rows runs
 *              beside the input-gradient product of the same layer part (QKV, gate/up) and each
 *              reduce-scatter beside its weight-gradient product: hidden up to the product's time,
 *              the rest exposed. Without SP: 2 all-reduces in the forward, exposed, and 2 in the
 *              backward, each beside the weight-gradient product after it. Full recomputation
 *              runs the forward's first 2 all-gathers and 1 reduce-scatter (or 1 all-reduce) again in
 *              the backward, exposed. The pipeline is charged the mean of the two directions each way
 *              (cost_tp_comm_s), the breakdown each part (cost_tp_comm_parts).
 *              CP: all-gather of K and V of the sharded tokens (forward, compute dtype) and
 *              reduce-scatter of dK, dV (backward, parallel.reduce_dtype), a direction charged their
 *              mean. With overlap each runs beside the attention of the documents the rank holds
 *              whole (forward, backward: their attention needs nothing from the exchange): hidden up
 *              to that attention's time, the rest and the latencies exposed (cost_cp_beside); the
 *              attention of a sharded document waits for its whole exchange.
 *              PP: send/receive of the residual stream between stages (float32, a TP rank's rows: 1/tp
 *              of them with SP), timed by the pipeline simulator (sched.h): with overlap the receive is
 *              posted ahead and the message moves while the receiver computes; without, it moves when
 *              the receiver asks for it.
 *              DP: the float32 gradients all-reduced over DP x CP (ZeRO-1: reduce-scattered, and the
 *              parameters all-gathered before the next forward) in the engine's buckets (a layer each,
 *              the first layer's MLP half apart, its attention half with the embedding, the output
 *              layer's; sched.c chunk_buckets); priced by the simulator: with overlap each bucket
 *              starts as soon as the last micro-batch's backward has produced it (exposed: what
 *              outlasts the backward, at least the last bucket), and ZeRO-1's all-gather runs a
 *              bucket ahead of the first forward; without, all of it between steps.
 *              SM contention: a collective that runs beside a computation takes comm_sm_share of the
 *              device's SMs (cores), so the computation is slowed by that share of the overlapped time:
 *              charged as `contention`, comm_sm_share x the hidden seconds.
 *   recompute  train.recompute's work in the backward: selective recomputes the two norms and
 *              SwiGLU (their element-wise bytes); full runs the layer's forward again - its GEMMs,
 *              element-wise work and attention forward are added to the backward, and its TP
 *              exchanges and K/V all-gather to the exchanges (half to each direction's mean).
 * The first stage also embeds (a row gather, its TP sum - all-reduce, or reduce-scatter with SP -
 * exposed: no product to hide under - and the backward's scatter-add into the embedding's gradient,
 * after an all-gather of the rows' gradients with SP); the last also runs the output projection and
 * the cross-entropy (its forward and backward passes over the float32 logits at loss_gbps). After the
 * gradients' reduction each rank's optimizer step: the gradient norm and AdamW (cost_optimizer_s).
 */
#ifndef WLB_ENGINE_COST_H
#define WLB_ENGINE_COST_H

#include <stdint.h>

#include "config/config.h"
#include "util/error.h"

/* A hardware profile; any field can be overridden by config keys or a calibration file. */
typedef struct CostHardware {
    const char *name;
    double peak_tflops;       /* dense bf16 (fp32 for cpu) per device */
    double gemm_efficiency;   /* achieved / peak for large GEMMs */
    double attn_efficiency;   /* achieved / peak of the attention forward at long queries */
    double attn_bwd_ratio;    /* backward rate / forward rate */
    double attn_half_tokens;  /* query length at which the attention rate is half its maximum */
    int attn_tile;            /* query rows per kernel tile */
    double hbm_gbps;          /* memory bandwidth, GB/s */
    double intra_node_gbps;   /* collective bus bandwidth inside a node (NVLink), GB/s */
    double inter_node_gbps;   /* per GPU across nodes (network), GB/s */
    double link_latency_us;   /* per collective or send */
    int gpus_per_node;
    double comm_sm_share;     /* share of the compute a collective takes from what it overlaps (the
                               * SMs its kernel holds): the overlapped computation runs that much slower */
    double memory_gb;         /* device memory, 10^9 bytes: the memory check's budget (0: none, the CPU) */
    double launch_us;         /* fixed microseconds per layer per micro-batch (forward + backward) that
                               * do not grow with its tokens: kernel launches, thread starts; a third in
                               * the forward, two thirds in the backward (0 in the built-in profiles;
                               * `wlbtrain calibrate` measures it) */
    double loss_gbps;         /* the cross-entropy's passes over the float32 logits, GB/s (its bytes:
                               * cost_head_split) */
    double optimizer_gbps;    /* AdamW's update and the gradient norm's pass, GB/s (cost_optimizer_s) */
} CostHardware;

/* The least rate the cost model takes, in TFLOP/s, GB/s or as an efficiency: the calibration file's
 * and the balance.* keys' ranges start here. Below it, the products of rates underflow towards 0
 * and predicted times become infinite (1e-6 TFLOP/s x 1e-6 efficiency is still 1 FLOP/s). */
#define COST_MIN_RATE 1e-6

/* Attention rate from a calibration table: TFLOP/s measured at query lengths q[i] (ascending). */
enum { COST_TABLE_MAX = 32 };
/* Model chunks: pp * v <= model.n_layers <= 1024. */
enum { COST_MAX_CHUNKS = 1024 };
typedef struct CostAttnTable {
    int n;
    int head_dim;             /* the head size it was measured at; 0: any */
    double q[COST_TABLE_MAX], fwd_tflops[COST_TABLE_MAX], bwd_tflops[COST_TABLE_MAX];
    double log2_q[COST_TABLE_MAX]; /* log2(q[i]), once (the interpolation's abscissae) */
} CostAttnTable;

/* What a model's rates are and where they came from, for the dry run to print. */
enum { COST_PROFILE_NAME_MAX = 64, COST_SOURCE_MAX = 512 };
typedef struct CostSource {
    char profile[COST_PROFILE_NAME_MAX]; /* "h100 (engine)", "h100-fa3 (published)", a file's path */
    char text[COST_SOURCE_MAX];          /* the profile's "source", or where the published rates are from */
} CostSource;

typedef struct CostModel {
    CostHardware hw;
    CostSource source;
    CostAttnTable table;      /* n == 0: use the efficiency curve */
    int tp, cp, pp, v; /* v: virtual stages (model chunks) per pipeline rank */
    int sp;            /* sequence parallelism (tp > 1 and parallel.sequence_parallel) */
    Recompute recompute; /* train.recompute: what the backward runs again */
    int n_layers;
    int has_split;            /* chunk_layers holds the config's split (resolved when the model was built) */
    int chunk_layers[COST_MAX_CHUNKS]; /* layers of each model chunk g < pp * v */
    int head_dim, local_heads, local_kv_heads;
    double d_model, ffn_local; /* d_model, and the SwiGLU width on a TP rank (d_ffn / tp) */
    /* Per token per layer, this rank's share: */
    double gemm_flops_fwd;    /* forward GEMM FLOPs */
    double elem_bytes;        /* forward + backward element-wise HBM traffic */
    double recompute_bytes;   /* selective: the norms' and SwiGLU's forward bytes run again */
    double head_flops_fwd;    /* output projection (last stage) */
    double vocab_local;       /* vocabulary rows on this TP rank */
    double act_bytes;         /* one activation row in the compute dtype: d_model * 2 bytes in bf16 */
    double sum_bytes;         /* one row of partial sums, in parallel.reduce_dtype: d_model * 4 (fp32) or
                               * * 2 (bf16) bytes */
    double grad_row_bytes;    /* one row of float32 sums that are not products' partial sums (the
                               * embedding's rows, SP's gather of their gradients): d_model * 4 bytes */
    double p2p_bytes;         /* a TP rank's part of one row of the stream sent between stages */
    double kv_bytes;          /* K and V rows of the local kv heads: the mean of the all-gather's
                               * (compute dtype) and the reduce-scatter's (parallel.reduce_dtype) */
    double tp_bw, cp_bw, pp_bw, dp_bw; /* GB/s of the link each group uses (dp: DP x CP) */
    int overlap;              /* parallel.overlap: the engine overlaps what it can */
    int tp_chunks;            /* parallel.tp_chunks: pieces each TP product and its exchange split into
                               * (auto resolved by cost_auto_tp_chunks) */
    double tp_fixed_s, tp_row_s; /* cost_tp_comm_s = tp_fixed_s + tp_row_s rows (cost_set_overlap) */
    int sums_bf16;            /* the partial sums travel in bf16 (parallel.reduce_dtype: compute, bf16): the
                               * engine runs them where they are issued, beside nothing */
    int dpcp;                 /* ranks over which gradients are reduced (dp x cp) */
    int zero;                 /* parallel.zero: gradients reduce-scattered, parameters all-gathered */
    double layer_params;      /* one layer's parameters on a rank (its TP shard, norms whole) */
    double embed_params, head_params; /* the first stage's embedding and the last's output layer
                                       * (final norm included) on a rank; 0 where tied on one chunk */
} CostModel;

/* The built-in published-rate profiles: "h100" and "h100-fa3" alike (and h200), "a100", "cpu". */
const CostHardware *cost_hardware_profile(HardwareKind kind);
/* The engine's profile of balance.hardware (a calibration file kept in engine/plan/profiles/, built
 * into the program): its text and its path in the repository, or NULL when the hardware has none
 * (a100, cpu, the -fa3 profiles). Taken by default with train.device cuda and no
 * balance.calibration. */
typedef struct CostEngineProfile {
    const char *path, *text;
} CostEngineProfile;
const CostEngineProfile *cost_engine_profile(HardwareKind kind);
/* The JSON files of engine/plan/profiles/, built into the program (generated by the Makefile). */
extern const CostEngineProfile cost_engine_profiles[];
extern const int cost_engine_profile_count;
/* Builds the model for a resolved config (profile, config overrides, calibration file). */
int cost_model_init(CostModel *m, const Config *cfg, Error *err);

/* Number of (query, key) pairs the kernel computes for a segment, with the tile rounding. */
double cost_attn_pairs(const CostModel *m, int64_t q_len, int64_t kv_len);
/* Seconds of one layer's attention forward / backward for one segment. */
double cost_attn_fwd_s(const CostModel *m, int64_t q_len, int64_t kv_len);
double cost_attn_bwd_s(const CostModel *m, int64_t q_len, int64_t kv_len);
/* Both at once (the same figures, the shared work done once). */
void cost_attn_fb_s(const CostModel *m, int64_t q_len, int64_t kv_len, double *fwd, double *bwd);
/* Seconds of one layer's GEMMs and element-wise work, forward / backward, for n tokens on a rank. */
double cost_linear_fwd_s(const CostModel *m, int64_t tokens);
double cost_linear_bwd_s(const CostModel *m, int64_t tokens);
/* Seconds of one layer's communication in one direction (the backward mirrors the forward):
 * the TP exchanges of a rank's tokens_rank activation rows (with SP the mean of the two
 * directions), and the CP all-gather (backward: reduce-scatter) of the K/V rows of the
 * micro-batch's sharded_tokens. */
double cost_tp_comm_s(const CostModel *m, int64_t tokens_rank);
/* Sets m->overlap and derives again what depends on it and on the other fields (the line of
 * cost_tp_comm_s): call after changing a field of an initialised model. */
void cost_set_overlap(CostModel *m, int overlap);
/* The same TP exchanges part by part: exposed seconds in each direction, the seconds hidden beside
 * the backward's products, and the contention they cause (comm_sm_share x hidden).
 * cost_tp_comm_s = (fwd_exposed + bwd_exposed + contention) / 2. */
typedef struct CostTpComm {
    double fwd_exposed, bwd_exposed, hidden, contention;
} CostTpComm;
void cost_tp_comm_parts(const CostModel *m, int64_t tokens_rank, CostTpComm *c);
/* parallel.tp_chunks: auto - of 1, 2, 4 pieces the one that prices the TP exchanges of a
 * micro-batch of `rows` rows on a rank lowest, a count doubled only for 1% less, overlap on
 * (cost_model_init: the largest micro-batch's, S_max / cp). Each piece pays a link latency and
 * hides bandwidth time beside a piece of its product: pieces pay for long products, not for small
 * ones. 1 with tp 1. */
int cost_auto_tp_chunks(const CostModel *m, int64_t rows);
/* The products (GEMMs) and the rest (element-wise work and launch_us) of cost_linear_fwd_s /
 * cost_linear_bwd_s, which are their sums. */
void cost_linear_split(const CostModel *m, int64_t tokens, int backward, double *products, double *elementwise);
/* The same for the first stage's embedding (elementwise: its rows; comm: its TP exchange) and the
 * last stage's output layer and loss (products: the logits GEMMs; elementwise: the softmax). */
void cost_embed_split(const CostModel *m, int64_t tokens, int backward, double *elementwise, double *comm);
void cost_head_split(const CostModel *m, int64_t tokens, int backward, double *products, double *elementwise);
/* DP x CP: seconds of one bucket's gradient reduction (all-reduce, or ZeRO-1's reduce-scatter) and of
 * ZeRO-1's parameter all-gather (0 without ZeRO-1), for `params` parameters of a rank; 0 when dp x cp
 * is 1. */
double cost_dp_reduce_s(const CostModel *m, double params);
double cost_dp_gather_s(const CostModel *m, double params);
double cost_cp_comm_s(const CostModel *m, int64_t sharded_tokens);
/* The same exchange inside a group of `size` CP ranks (an aligned block of the CP group, sharding
 * `groups`): (size - 1) / size of the group's sharded K/V rows, over NVLink when tp * size ranks fit
 * in a node, in one piece per rank of the group, each paying the link's latency. size 1 exchanges
 * nothing; size cp is cost_cp_comm_s. */
double cost_cp_comm_group_s(const CostModel *m, int size, int64_t sharded_tokens);
/* A rank's K/V exchange in one direction, x seconds (the sum of cost_cp_comm_group_s over the blocks
 * it exchanges in: `pieces` pieces in all), as the engine runs it (engine/model/model_cp.c). Forward:
 * the pieces start after RoPE; the attention of the documents the rank holds whole (whole_s: they
 * read its own rows only) and of its sharded documents' queries over its own keys runs first, then
 * over each other rank's keys as that rank's piece arrives. Backward: the sharded documents'
 * attention backward rank by rank of the keys, each rank's dK, dV reduced as soon as its blocks are
 * done, beside the next; then the whole documents'. Priced with equal pieces and the sharded
 * attention (sharded_s) in as many equal blocks, the rank's own piece first on the link: what the
 * compute waits for is exposed, as are the pieces' latencies; without overlap (and bf16 sums in the
 * backward: sharded_s and whole_s 0) all of it. contention = comm_sm_share x hidden. */
typedef struct CostCpComm {
    double exposed, hidden, contention;
} CostCpComm;
void cost_cp_beside(const CostModel *m, double x, int pieces, double whole_s, double sharded_s, int backward,
                    CostCpComm *c);
/* Seconds of the output projection + loss (last stage) forward / backward for n tokens on a rank. */
double cost_head_fwd_s(const CostModel *m, int64_t tokens);
double cost_head_bwd_s(const CostModel *m, int64_t tokens);
/* Seconds of the embedding (first stage) forward / backward for n tokens on a rank. */
double cost_embed_fwd_s(const CostModel *m, int64_t tokens);
double cost_embed_bwd_s(const CostModel *m, int64_t tokens);
/* Seconds of the optimizer step of a rank holding `params` parameters (a stage's): the gradient
 * norm's pass over its float32 gradients (4 bytes a parameter) and AdamW's update (read the
 * parameter, gradient and both moments, write the parameter, the moments and the bf16 copy: 30
 * bytes), over the rank's range - all of them, or ZeRO-1's 1/(DP x CP) shard, whose all-gathered
 * parameters are then cast to bf16 whole (6 bytes a parameter) - at optimizer_gbps. */
double cost_optimizer_s(const CostModel *m, double params);
/* Seconds to send n tokens' activations to the next stage. */
double cost_p2p_s(const CostModel *m, int64_t tokens);
/* A whole document of n tokens on one rank (no CP), one layer, forward + backward: the packer's
 * workload estimate W_a(n) + W_l(n). */
double cost_doc_s(const CostModel *m, int64_t n);

/* Layers of model chunk g (0 .. pp * v - 1) under the config's split (parallel.chunk_layers, which
 * must be resolved when the model was built). */
int cost_chunk_layers(const CostModel *m, int g);

/* The calibration file (calibration.c, which documents its fields): its rates into hw and table (of
 * several attention tables the one for head_dim: its own, else one for any head size, else the
 * nearest; 0: the first), its name and source into src (NULL: not wanted). Any fault is one error
 * (status 2) naming the file. calibration_load_text reads the text of one, `where` naming it. */
enum { CALIBRATION_VERSION = 2 };
int calibration_load(const char *path, int head_dim, CostHardware *hw, CostAttnTable *table, CostSource *src,
                     Error *err);
int calibration_load_text(const char *text, const char *where, int head_dim, CostHardware *hw, CostAttnTable *table,
                          CostSource *src, Error *err);

#endif
