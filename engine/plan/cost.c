/* engine/plan/cost.c - the cost model (see cost.h for the formulas and where the numbers come from). */
#include "engine/plan/cost.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "util/wavefront.h"

/*
 * Profiles. Sources: ../shared/reference/performance.md.
 * H100 SXM: 989 TF dense bf16 (§1); large GEMMs reach ~780 TF (§4: MAMF 792, XLA 783-808);
 *   FA3 causal forward hd128 616 TF at 16K (§2.1) and the length curve 630 L/(L+238) (§2.2 fit);
 *   FA3 backward hd128 561 vs forward 648 TF (ratio 0.87, §2.1); HBM3 3.35 TB/s; NCCL ring busBW
 *   on NVLink ~370 GB/s (§1); 400 Gb/s RoCE per GPU (Llama 3 cluster, papers.md §3).
 * H200: same compute (989 TF), HBM3e 4.8 TB/s, same NVLink.
 * A100: 312 TF; FA2 forward+backward ~203 TF (65%, §2.3); HBM 2.0 TB/s; NVLink 3 busBW ~230 GB/s;
 *   200 Gb/s InfiniBand.
 * Overlap (parallel.overlap): what a collective hides behind is priced per collective (cost.h);
 *   comm_sm_share is the share of the SMs a communication kernel holds while it runs beside a
 *   product: 16 of H100's and H200's 132 SMs (Megatron-Bridge's default of 16 communication SMs for
 *   TP overlap, communication-overlap.md §1), 16 of A100's 108. The cpu profile's 0.5: the
 *   communication thread takes one of the two cores of the machine it is meant for (rough, like
 *   the rest of that profile).
 * cpu: the reference backend on a laptop-class core pair; rough, meant to be calibrated.
 * Device memory (train.gpu_memory_gb's default): H100 SXM 80 GB HBM3, H200 141 GB HBM3e, A100 80 GB
 *   (the 40 GB A100: set train.gpu_memory_gb: 40); the CPU's is the host's, and it is not checked.
 */
/* The published profiles price every pass at the published rates, the loss and the optimizer at
 * the HBM bandwidth. h100 and h100-fa3 are the same numbers: h100 names the GPU (with train.device
 * cuda the engine's profile replaces them, cost_model_init), h100-fa3 says what they are. */
#define H100_PUBLISHED {"h100-fa3", 989, 0.78, 0.61, 0.87, 238, 128, 3350, 370, 45, 15, 8, 16.0 / 132, 80, 0, 3350, 3350}
#define H200_PUBLISHED {"h200-fa3", 989, 0.78, 0.61, 0.87, 238, 128, 4800, 370, 45, 15, 8, 16.0 / 132, 141, 0, 4800, 4800}
static const CostHardware profiles[] = {
    [HW_H100] = H100_PUBLISHED,
    [HW_H200] = H200_PUBLISHED,
    [HW_A100] = {"a100", 312, 0.80, 0.65, 0.90, 300, 128, 2039, 230, 22, 15, 8, 16.0 / 108, 80, 0, 2039, 2039},
    [HW_CPU] = {"cpu", 0.05, 0.5, 0.3, 0.5, 8, 1, 10, 5, 1, 20, 1024, 0.5, 0, 0, 10, 10},
    [HW_H100_FA3] = H100_PUBLISHED,
    [HW_H200_FA3] = H200_PUBLISHED,
};

const CostHardware *cost_hardware_profile(HardwareKind kind)
{
    return &profiles[kind];
}

const CostEngineProfile *cost_engine_profile(HardwareKind kind)
{
    const char *path = kind == HW_H100 ? "engine/plan/profiles/h100.json"
                       : kind == HW_H200 ? "engine/plan/profiles/h200.json" : NULL;
    for (int i = 0; path && i < cost_engine_profile_count; i++)
        if (!strcmp(cost_engine_profiles[i].path, path))
            return &cost_engine_profiles[i];
    return NULL;
}

/* Where the published rates come from (printed by the dry run beside the profile's name). */
static void published_source(CostSource *src, HardwareKind kind, const Config *cfg)
{
    const char *name = config_hardware_name(kind);
    const char *what = kind == HW_CPU ? "rough rates of a laptop-class core pair, meant to be calibrated"
                       : kind == HW_A100 ? "published rates: FlashAttention-2, cuBLAS, NVLink 3 (engine/plan/cost.c)"
                                         : "published rates: FlashAttention-3's attention, cuBLAS's large products, "
                                           "HBM's bandwidth (engine/plan/cost.c); not wlbtrain's kernels";
    snprintf(src->profile, sizeof src->profile, "%s%s", name,
             (kind == HW_H100 || kind == HW_H200) && cfg->train.device != DEVICE_CUDA ? " (published rates)" : "");
    snprintf(src->text, sizeof src->text, "%s", what);
}

int cost_chunk_layers(const CostModel *m, int g)
{
    /* The split is resolved before anything is simulated (config_resolve, or the engine for auto). */
    WLB_ASSERT(m->has_split && g >= 0 && g < m->pp * m->v);
    return m->chunk_layers[g];
}

int cost_model_init(CostModel *m, const Config *cfg, Error *err)
{
    memset(m, 0, sizeof *m);
    const ConfigModel *md = &cfg->model;
    int head_dim = (int)(md->d_model / md->n_heads);
    m->hw = profiles[cfg->balance.hardware];
    published_source(&m->source, cfg->balance.hardware, cfg);
    /* The rates: a calibration file, else the engine's profile of the GPU when the engine runs on it
     * (train.device cuda), else the published ones. */
    const CostEngineProfile *engine = cfg->train.device == DEVICE_CUDA ? cost_engine_profile(cfg->balance.hardware)
                                                                       : NULL;
    if (cfg->balance.calibration) {
        if (calibration_load(cfg->balance.calibration, head_dim, &m->hw, &m->table, &m->source, err) != 0)
            return -1;
    } else if (engine && calibration_load_text(engine->text, engine->path, head_dim, &m->hw, &m->table, &m->source,
                                               err) != 0) {
        return -1;
    }
    m->hw.name = config_hardware_name(cfg->balance.hardware); /* the GPU's name, whichever rates */
    /* Explicit config keys win over the profile and the calibration file (0 = not set). */
    const ConfigBalance *b = &cfg->balance;
    if (b->peak_tflops > 0)
        m->hw.peak_tflops = b->peak_tflops;
    if (b->gemm_efficiency > 0)
        m->hw.gemm_efficiency = b->gemm_efficiency;
    if (b->attn_efficiency > 0)
        m->hw.attn_efficiency = b->attn_efficiency;
    if (b->attn_half_tokens > 0)
        m->hw.attn_half_tokens = b->attn_half_tokens;
    if (b->attn_tile > 0)
        m->hw.attn_tile = (int)b->attn_tile;
    if (b->hbm_gbps > 0)
        m->hw.hbm_gbps = b->hbm_gbps;
    if (b->intra_node_gbps > 0)
        m->hw.intra_node_gbps = b->intra_node_gbps;
    if (b->inter_node_gbps > 0)
        m->hw.inter_node_gbps = b->inter_node_gbps;
    if (b->gpus_per_node > 0)
        m->hw.gpus_per_node = (int)b->gpus_per_node;
    const struct {
        const char *key;
        double value;
    } rates[] = {{"balance.peak_tflops", b->peak_tflops},     {"balance.gemm_efficiency", b->gemm_efficiency},
                 {"balance.attn_efficiency", b->attn_efficiency}, {"balance.hbm_gbps", b->hbm_gbps},
                 {"balance.intra_node_gbps", b->intra_node_gbps}, {"balance.inter_node_gbps", b->inter_node_gbps}};
    for (size_t i = 0; i < sizeof rates / sizeof rates[0]; i++)
        if (rates[i].value > 0 && rates[i].value < COST_MIN_RATE)
            return error_set(err, rates[i].key, "%g is below the least rate the cost model takes (%g): its predicted "
                             "times would be infinite", rates[i].value, COST_MIN_RATE);

    int tp = (int)cfg->parallel.tp, cp = (int)cfg->parallel.cp, pp = (int)cfg->parallel.pp;
    m->tp = tp;
    m->cp = cp;
    m->pp = pp;
    m->v = (int)cfg->parallel.virtual_stages;
    m->n_layers = (int)md->n_layers;
    /* The split, once resolved (auto: by the engine, before it builds the model it plans for). */
    const ConfigIntList *split = &cfg->parallel.chunk_layers;
    m->has_split = split->n == pp * m->v && split->n <= COST_MAX_CHUNKS;
    for (int g = 0; m->has_split && g < split->n; g++)
        m->chunk_layers[g] = (int)split->v[g];
    m->head_dim = head_dim;
    m->local_heads = (int)(md->n_heads / tp);
    /* With fewer kv heads than TP ranks, each rank keeps a replica of one kv head. */
    m->local_kv_heads = md->n_kv_heads >= tp ? (int)(md->n_kv_heads / tp) : 1;
    m->sp = tp > 1 && cfg->parallel.sequence_parallel;
    double d = (double)md->d_model, f = (double)md->d_ffn / tp, dh = m->head_dim;
    m->d_model = d;
    m->ffn_local = f;
    double hq = m->local_heads, hkv = m->local_kv_heads, stream = m->sp ? tp : 1;
    double elem = cfg->train.precision == PRECISION_BF16 ? 2 : 4;
    /* q, k, v and output projections, then gate, up and down. */
    m->gemm_flops_fwd = 2 * d * dh * (2 * hq + 2 * hkv) + 6 * d * f;
    /* Element-wise reads and writes: 2 RMSNorms (4d) and 2 residual adds (6d) on the stream's rows
     * (1/tp of them with SP), RoPE on q and k, SwiGLU (3f); the backward touches about twice as
     * much: x3 in all. */
    m->elem_bytes = 3 * (10 * d / stream + 2 * (hq + hkv) * dh + 3 * f) * elem;
    /* selective recomputes each norm (read x float32, write the normed row) and SwiGLU (read g, u,
     * write the product); full recomputes the forward's third of the element-wise traffic. */
    m->recompute = cfg->train.recompute;
    m->recompute_bytes = 2 * (4 + elem) * d / stream + 3 * f * elem;
    m->vocab_local = (double)md->vocab_size / tp;
    m->head_flops_fwd = 2 * d * m->vocab_local;
    /* The partial sums travel in parallel.reduce_dtype: float32, or the compute dtype. */
    double sum_elem = cfg->parallel.reduce_dtype == REDUCE_COMPUTE ? elem : 4;
    m->act_bytes = d * elem;
    m->sum_bytes = d * sum_elem;
    m->grad_row_bytes = d * 4;
    m->p2p_bytes = d * 4 / stream;
    /* The K/V all-gather carries the compute dtype, the dK/dV reduce-scatter the partial sums' dtype
     * (and full recomputation gathers again): a direction is charged their mean. */
    m->kv_bytes = 2 * hkv * dh * (elem * (m->recompute == RECOMPUTE_FULL ? 2 : 1) + sum_elem) / 2;
    int g = m->hw.gpus_per_node;
    m->tp_bw = tp <= g ? m->hw.intra_node_gbps : m->hw.inter_node_gbps;
    m->cp_bw = tp * cp <= g ? m->hw.intra_node_gbps : m->hw.inter_node_gbps;
    m->pp_bw = tp * cp * pp <= g ? m->hw.intra_node_gbps : m->hw.inter_node_gbps;
    /* DP x CP: the ranks holding the same weights, tp * cp apart when dp is 1, else across the
     * whole layout (world rank = tp + TP (cp + CP (pp + PP dp))). */
    int64_t dp = cfg->parallel.dp > 0 ? cfg->parallel.dp : 1;
    m->dpcp = (int)(dp * cp);
    m->dp_bw = (dp == 1 ? tp * cp : tp * cp * pp * dp) <= g ? m->hw.intra_node_gbps : m->hw.inter_node_gbps;
    m->tp_chunks = (int)cfg->parallel.tp_chunks;
    m->sums_bf16 = sum_elem == 2;
    m->zero = cfg->parallel.zero != 0;
    /* A layer's weights on a rank: its products' TP shard (half their forward FLOPs per token) and
     * its two norms, whole on every rank. The embedding and the output layer: vocab_local rows each
     * (one tensor when tied on a single chunk), the final norm on the last stage. */
    m->layer_params = m->gemm_flops_fwd / 2 + 2 * d;
    m->embed_params = m->vocab_local * d;
    m->head_params = (md->tie_embeddings && pp * m->v == 1 ? 0 : m->vocab_local * d) + d;
    if (m->tp_chunks <= 0) {
        int64_t tokens = cfg->balance.max_tokens_per_micro_batch > 0 ? cfg->balance.max_tokens_per_micro_batch
                                                                      : cfg->data.context_window;
        m->tp_chunks = cost_auto_tp_chunks(m, tokens / cp);
    }
    cost_set_overlap(m, cfg->parallel.overlap);
    return 0;
}

static double tp_comm_mean(const CostModel *m, int64_t rows);

int cost_auto_tp_chunks(const CostModel *m, int64_t rows)
{
    /* Priced with overlap on whatever parallel.overlap says (as the planner decides): the pieces
     * then do not depend on it, and neither do the engine's numbers. */
    CostModel t = *m;
    t.overlap = 1;
    int best = 1;
    double best_s = 0;
    for (int k = 1; k <= 4 && m->tp > 1; k *= 2) {
        t.tp_chunks = k;
        double s = tp_comm_mean(&t, rows > 0 ? rows : 1);
        /* More pieces only when they price 1% faster: each is a smaller product, whose lower
         * efficiency the model does not price. */
        if (k == 1 || s < best_s * 0.99) {
            best = k;
            best_s = s;
        }
    }
    return best;
}

/* ---------------------------------------------------------------------------------------------- */

static int64_t pad_to_tile(const CostModel *m, int64_t q)
{
    int64_t t = m->hw.attn_tile > 0 ? m->hw.attn_tile : 1;
    return (q + t - 1) / t * t;
}

/* Query-key pairs of q_len query rows padded to qp over kv_len keys, the last q_len causal. */
static double attn_pairs_padded(double qp, int64_t q_len, int64_t kv_len)
{
    return qp * (double)(kv_len - q_len) + qp * (qp + 1) / 2;
}

double cost_attn_pairs(const CostModel *m, int64_t q_len, int64_t kv_len)
{
    return q_len <= 0 ? 0 : attn_pairs_padded((double)pad_to_tile(m, q_len), q_len, kv_len);
}

/* Linear interpolation in log2(q) through the calibration table, clamped at its ends: the forward
 * and backward rates at once (the planner asks for both at every call, and they share the
 * position of q in the table). */
static void table_rates(const CostAttnTable *t, double q, double *fwd, double *bwd)
{
    if (q <= t->q[0]) {
        *fwd = t->fwd_tflops[0];
        *bwd = t->bwd_tflops[0];
        return;
    }
    for (int i = 1; i < t->n; i++)
        if (q <= t->q[i]) {
            double x = (log2(q) - t->log2_q[i - 1]) / (t->log2_q[i] - t->log2_q[i - 1]);
            *fwd = t->fwd_tflops[i - 1] + x * (t->fwd_tflops[i] - t->fwd_tflops[i - 1]);
            *bwd = t->bwd_tflops[i - 1] + x * (t->bwd_tflops[i] - t->bwd_tflops[i - 1]);
            return;
        }
    *fwd = t->fwd_tflops[t->n - 1];
    *bwd = t->bwd_tflops[t->n - 1];
}

/* The attention kernel's forward and backward rates at qp query rows (padded to the tile). */
static void attn_rates_tflops(const CostModel *m, double qp, double *fwd, double *bwd)
{
    if (m->table.n > 0) {
        table_rates(&m->table, qp, fwd, bwd);
        return;
    }
    double r = m->hw.peak_tflops * m->hw.attn_efficiency * qp / (qp + m->hw.attn_half_tokens);
    *fwd = r;
    *bwd = r * m->hw.attn_bwd_ratio;
}


double cost_attn_fwd_s(const CostModel *m, int64_t q_len, int64_t kv_len)
{
    double f, b;
    cost_attn_fb_s(m, q_len, kv_len, &f, &b);
    return f;
}

double cost_attn_bwd_s(const CostModel *m, int64_t q_len, int64_t kv_len)
{
    double f, b;
    cost_attn_fb_s(m, q_len, kv_len, &f, &b);
    return b;
}

void cost_attn_fb_s(const CostModel *m, int64_t q_len, int64_t kv_len, double *fwd, double *bwd)
{
    *fwd = *bwd = 0;
    if (q_len <= 0)
        return;
    /* The planner's hottest function: the tile padding, the FLOPs and the rates once for both. */
    double qp = (double)pad_to_tile(m, q_len), rf, rb;
    double flops = 4.0 * m->head_dim * m->local_heads * attn_pairs_padded(qp, q_len, kv_len);
    attn_rates_tflops(m, qp, &rf, &rb);
    *fwd = flops / (rf * 1e12);
    *bwd = 2.5 * flops / (rb * 1e12) + (m->recompute == RECOMPUTE_FULL ? *fwd : 0);
}

static double gemm_s(const CostModel *m, double flops)
{
    return flops / (m->hw.peak_tflops * m->hw.gemm_efficiency * 1e12);
}

/* The fixed part of a layer's pass over a micro-batch with tokens (launch_us: a third forward). */
static double launch_s(const CostModel *m, int64_t tokens, double share)
{
    return tokens > 0 ? share * m->hw.launch_us * 1e-6 : 0;
}

void cost_linear_split(const CostModel *m, int64_t tokens, int backward, double *products, double *elementwise)
{
    double n = (double)tokens, hbm = m->hw.hbm_gbps * 1e9;
    /* A third of the element-wise traffic is the forward's, two thirds the backward's. */
    *products = gemm_s(m, (backward ? 2 : 1) * m->gemm_flops_fwd * n);
    *elementwise = (backward ? 2 : 1) * m->elem_bytes / 3 * n / hbm + launch_s(m, tokens, backward ? 2.0 / 3 : 1.0 / 3);
    if (backward && m->recompute == RECOMPUTE_FULL) {
        double p, e;
        cost_linear_split(m, tokens, 0, &p, &e);
        *products += p;
        *elementwise += e;
    } else if (backward && m->recompute == RECOMPUTE_SELECTIVE) {
        *elementwise += m->recompute_bytes * n / hbm;
    }
}

double cost_linear_fwd_s(const CostModel *m, int64_t tokens)
{
    double p, e;
    cost_linear_split(m, tokens, 0, &p, &e);
    return p + e;
}

double cost_linear_bwd_s(const CostModel *m, int64_t tokens)
{
    double p, e;
    cost_linear_split(m, tokens, 1, &p, &e);
    return p + e;
}

/* One collective: bytes over a bus bandwidth (GB/s) scaled by the algorithm's factor, plus latency. */
static double collective_s(const CostModel *m, double bytes, double factor, double gbps)
{
    return bytes * factor / (gbps * 1e9) + m->hw.link_latency_us * 1e-6;
}

/* An exchange of c seconds (its bandwidth time b and one link latency) started in `pieces`
 * collectives at once, beside a product of p seconds that does not need it: each piece pays the
 * link's latency, charged exposed; the bandwidth time hides up to the product's. Both times grow in
 * proportion to the rows, so what hides is the same share of them at any count and the price stays
 * affine in the rows, as the groups search's lines take it (plan_groups.h). */
static void beside(const CostModel *m, double c, double p, int pieces, CostTpComm *out)
{
    double lat = m->hw.link_latency_us * 1e-6, bandwidth = c - lat;
    double hidden = m->overlap && p > 0 ? (bandwidth < p ? bandwidth : p) : 0;
    out->bwd_exposed += pieces * lat + bandwidth - hidden;
    out->hidden += hidden;
    out->contention += m->hw.comm_sm_share * hidden;
}

/* An exchange of c seconds split with the product of p seconds next to it into k pieces
 * (parallel.tp_chunks, engine/model/model_tp.c): the gather before a product (piece j multiplied
 * once its gather is in) or the reduce-scatter after it (piece j's sums sent while piece j + 1 is
 * multiplied). The pieces' exchanges run one after another; of the bandwidth time b the first
 * gather's (the last reduce-scatter's) b / k has no product beside it, and each other piece shows
 * what it takes longer than a piece of the product: exposed b / k + (k - 1) / k max(0, b - p), plus
 * k link latencies. Affine in the rows, like beside(). Without overlap, or with no product (p 0:
 * bf16 sums run where they are issued), all of it is exposed. */
static void pipelined(const CostModel *m, double c, double p, double *exposed, CostTpComm *out)
{
    double lat = m->hw.link_latency_us * 1e-6, b = c - lat, k = m->tp_chunks, hidden = 0;
    if (m->overlap && p > 0 && k > 1)
        hidden = b - (b / k + (k - 1) / k * (b > p ? b - p : 0));
    *exposed += k * lat + b - hidden;
    out->hidden += hidden;
    out->contention += m->hw.comm_sm_share * hidden;
}

/* One step of a stage of the pieces' pipelines (engine/model/model_chain.c, model_chain_bwd.c): its
 * products' seconds, then the exchange it starts (seconds of the whole exchange, 0: none); sync: the
 * exchange runs where it is started (bf16 sums), the compute waiting for it. A stage is one or two
 * steps, and step t of a piece's stage first waits for the exchange that step t of the piece's
 * stage before started: the backward's QKV stage starts its sums and then runs dWqkv beside them;
 * its MLP stage starts the gather of b and then the reduce-scatter of the gate/up input gradient,
 * and the stage after it runs dWgu once b is in, before it waits for the sums. */
typedef struct ChainStep {
    double product, exchange;
    int sync;
} ChainStep;
enum { CHAIN_MAX_STEPS = 2, CHAIN_MAX_STAGES = 5, CHAIN_MAX_PIECES = 16 };
typedef struct ChainStage {
    ChainStep step[CHAIN_MAX_STEPS];
} ChainStage;

/* A pipeline of pieces as the engine runs it: n stages over k = tp_chunks pieces, in the wavefront
 * order of util/wavefront.h, simulated on two resources - the compute, running the stages' steps in
 * that order and waiting for an exchange where the piece's step needs it, and the TP group,
 * running the exchanges one after another in start order (their bandwidth time, b / k a piece).
 * What the compute waits is exposed; each piece also pays the link's latency, charged exposed, as
 * beside() and pipelined() do. Without overlap every exchange is waited for where it starts. The
 * last stage starts no exchange (the chain ends in a product or a sum), so the compute's end is the
 * chain's. The simulation is of the engine's order, not a bound. */
static void chain(const CostModel *m, const ChainStage *st, int n, double *exposed, CostTpComm *out)
{
    double lat = m->hw.link_latency_us * 1e-6, busy = 0, link = 0, products = 0, comm = 0;
    double ready[CHAIN_MAX_STAGES][CHAIN_MAX_PIECES][CHAIN_MAX_STEPS] = {{{0}}};
    int k = m->tp_chunks < CHAIN_MAX_PIECES ? m->tp_chunks : CHAIN_MAX_PIECES;
    int stage[CHAIN_MAX_STAGES * CHAIN_MAX_PIECES], piece[CHAIN_MAX_STAGES * CHAIN_MAX_PIECES];
    int steps = wavefront_order(n, k, stage, piece);
    for (int i = 0; i < steps; i++) {
        int s = stage[i], j = piece[i];
        for (int t = 0; t < CHAIN_MAX_STEPS; t++) {
            const ChainStep *x = &st[s].step[t];
            if (s > 0 && ready[s - 1][j][t] > busy)
                busy = ready[s - 1][j][t];
            busy += x->product / k;
            if (x->exchange <= 0)
                continue;
            double b = (x->exchange - lat) / k;
            if (!m->overlap || x->sync) {
                busy += b;
                ready[s][j][t] = busy;
            } else {
                link = (link > busy ? link : busy) + b;
                ready[s][j][t] = link;
            }
        }
    }
    for (int s = 0; s < n; s++)
        for (int t = 0; t < CHAIN_MAX_STEPS; t++) {
            products += st[s].step[t].product;
            if (st[s].step[t].exchange > 0) {
                comm += st[s].step[t].exchange - lat;
                *exposed += k * lat;
            }
        }
    double waited = busy - products > 0 ? busy - products : 0, hidden = comm - waited > 0 ? comm - waited : 0;
    if (!m->overlap)
        hidden = 0; /* all of it waited for (busy - products is comm, up to rounding) */
    *exposed += comm - hidden;
    out->hidden += hidden;
    out->contention += m->hw.comm_sm_share * hidden;
}

void cost_tp_comm_parts(const CostModel *m, int64_t tokens_rank, CostTpComm *c)
{
    memset(c, 0, sizeof *c);
    if (m->tp <= 1 || tokens_rank <= 0)
        return;
    double rows = (double)tokens_rank, ring = (m->tp - 1.0) / m->tp, full = m->recompute == RECOMPUTE_FULL;
    double sums_beside = m->sums_bf16 ? 0 : 1; /* bf16 sums run beside nothing */
    /* The products' seconds: QKV, attention output, gate/up, down (forward; each backward product,
     * input or weight gradient, the same). */
    double heads = m->d_model * m->head_dim;
    double qkv = gemm_s(m, 2 * heads * (m->local_heads + 2.0 * m->local_kv_heads) * rows);
    double out = gemm_s(m, 2 * heads * m->local_heads * rows);
    double gate_up = gemm_s(m, 4 * m->d_model * m->ffn_local * rows);
    double down = gemm_s(m, 2 * m->d_model * m->ffn_local * rows);
    if (!m->sp) {
        /* Ring all-reduces of the partial sums after the attention output and the MLP down
         * projection, 2 (n - 1) / n, each in pieces beside the pieces of its product: 2 in the
         * forward, 1 more in the backward with full recomputation (the forward run again stops
         * before the down projection); 2 in the backward (the input gradients of the QKV and
         * gate/up products, each whole, beside the weight-gradient product that follows it). */
        double ar = collective_s(m, m->sum_bytes * rows, 2 * ring, m->tp_bw);
        pipelined(m, ar, sums_beside * out, &c->fwd_exposed, c);
        pipelined(m, ar, sums_beside * down, &c->fwd_exposed, c);
        if (full)
            pipelined(m, ar, sums_beside * out, &c->bwd_exposed, c);
        beside(m, ar, sums_beside * gate_up, 1, c);
        beside(m, ar, sums_beside * qkv, 1, c);
        return;
    }
    /* Ring all-gathers (compute dtype) and reduce-scatters (partial sums), (n - 1) / n each, in
     * pieces: the normed rows gathered before the QKV and gate/up products, the partial sums of the
     * output and down products reduce-scattered after them. */
    double ag = collective_s(m, m->act_bytes * rows, ring, m->tp_bw);
    double rs = collective_s(m, m->sum_bytes * rows, ring, m->tp_bw);
    /* The forward: from the attention output product on, the rows run in pieces through the layer
     * and into the next layer's QKV product (model_chain.c): out | RS, norm | AG, gate/up + down |
     * RS, norm | AG, QKV. A chunk's first layer gathers its normed rows for the QKV product on its
     * own (pipelined), and its last stops after the down product's sum: of L layers a chunk, L - 1
     * run the whole chain. With full recomputation the backward runs the forward again up to
     * silu(g) u: the QKV product on its own, then the chain's first three stages. */
    int sync = m->sums_bf16;
    double L = (double)m->n_layers / (m->pp * m->v);
    ChainStage mid[] = {{{{out, rs, sync}}}, {{{0, ag, 0}}}, {{{gate_up + down, rs, sync}}}, {{{0, ag, 0}}},
                        {{{qkv, 0, 0}}}};
    ChainStage last[] = {{{{out, rs, sync}}}, {{{0, ag, 0}}}, {{{gate_up + down, rs, sync}}}, {{{0, 0, 0}}}};
    CostTpComm fwd_mid = {0}, fwd_edge = {0};
    double fwd_mid_exposed = 0, fwd_edge_exposed = 0;
    chain(m, mid, 5, &fwd_mid_exposed, &fwd_mid);
    pipelined(m, ag, qkv, &fwd_edge_exposed, &fwd_edge);
    chain(m, last, 4, &fwd_edge_exposed, &fwd_edge);
    c->fwd_exposed += ((L - 1) * fwd_mid_exposed + fwd_edge_exposed) / L;
    c->hidden += ((L - 1) * fwd_mid.hidden + fwd_edge.hidden) / L;
    c->contention += ((L - 1) * fwd_mid.contention + fwd_edge.contention) / L;
    /* The backward. Each layer's normed rows a are gathered again beside attention' (priced beside
     * the QKV input gradient's product alone: attention's time is not the rows'). Then, without
     * full recomputation, the pieces run chained (model_chain_bwd.c) from a layer's QKV product to
     * the output product of the layer below: dqkv Wqkv | RS, dWqkv; norm' | AG dh; dWdown, ds | AG
     * b, swiglu', dgu Wgu | RS; dWgu (once b is in), norm' (once the sums are) | AG dh; dWo, datt.
     * A chunk's top layer runs the chain from the gather of dh (its last four stages), its first
     * layer the first two: of L layers a chunk, L - 1 chains are whole. */
    beside(m, ag, qkv, m->tp_chunks, c);
    if (!full) {
        ChainStage qkv_part = {{{qkv, rs, sync}, {qkv, 0, 0}}};
        ChainStage bwd_mid[] = {qkv_part, {{{0, ag, 0}}}, {{{2 * down, ag, 0}, {gate_up, rs, sync}}},
                                {{{gate_up, 0, 0}, {0, ag, 0}}}, {{{0, 0, 0}, {2 * out, 0, 0}}}};
        ChainStage bwd_bottom[] = {qkv_part, {{{0, 0, 0}}}};
        CostTpComm bwd_mid_parts = {0}, bwd_edge = {0};
        double bwd_mid_exposed = 0, bwd_edge_exposed = 0;
        chain(m, bwd_mid, 5, &bwd_mid_exposed, &bwd_mid_parts);
        chain(m, bwd_mid + 1, 4, &bwd_edge_exposed, &bwd_edge);
        chain(m, bwd_bottom, 2, &bwd_edge_exposed, &bwd_edge);
        c->bwd_exposed += ((L - 1) * bwd_mid_exposed + bwd_edge_exposed) / L;
        c->hidden += ((L - 1) * bwd_mid_parts.hidden + bwd_edge.hidden) / L;
        c->contention += ((L - 1) * bwd_mid_parts.contention + bwd_edge.contention) / L;
        return;
    }
    /* With full recomputation a layer at a time: the stream's gradient gathered before the down and
     * output products' backward (weight and input gradient, piece by piece), the forward again (2
     * all-gathers, 1 reduce-scatter); then per part (QKV, gate/up) the input gradient's partial sums
     * reduce-scattered beside the weight-gradient product, and for gate/up b gathered again beside
     * its input-gradient product. */
    ChainStage again[] = {{{{out, rs, sync}}}, {{{0, ag, 0}}}, {{{gate_up, 0, 0}}}};
    pipelined(m, ag, 2 * down, &c->bwd_exposed, c);
    pipelined(m, ag, 2 * out, &c->bwd_exposed, c);
    pipelined(m, ag, qkv, &c->bwd_exposed, c);
    chain(m, again, 3, &c->bwd_exposed, c);
    beside(m, ag, gate_up, m->tp_chunks, c);
    beside(m, rs, sums_beside * gate_up, m->tp_chunks, c);
    beside(m, rs, sums_beside * qkv, m->tp_chunks, c);
}

/* What a direction is charged for the TP exchanges of `rows` rows, from the parts (the mean of the
 * two directions). */
static double tp_comm_mean(const CostModel *m, int64_t rows)
{
    CostTpComm c;
    cost_tp_comm_parts(m, rows, &c);
    return (c.fwd_exposed + c.bwd_exposed + c.contention) / 2;
}

void cost_set_overlap(CostModel *m, int overlap)
{
    m->overlap = overlap;
    /* Every part is affine in the rows (beside, pipelined): the line through 1 and 2^20 rows, once,
     * so that the planner's many calls cost a multiply-add. */
    enum { X = 1 << 20 };
    double t1 = tp_comm_mean(m, 1), tx = tp_comm_mean(m, X);
    m->tp_row_s = (tx - t1) / (X - 1);
    m->tp_fixed_s = t1 - m->tp_row_s;
}

double cost_tp_comm_s(const CostModel *m, int64_t tokens_rank)
{
    return m->tp <= 1 || tokens_rank <= 0 ? 0 : m->tp_fixed_s + m->tp_row_s * (double)tokens_rank;
}

double cost_cp_comm_s(const CostModel *m, int64_t sharded_tokens)
{
    return cost_cp_comm_group_s(m, m->cp, sharded_tokens);
}

double cost_cp_comm_group_s(const CostModel *m, int size, int64_t sharded_tokens)
{
    if (size <= 1 || sharded_tokens <= 0)
        return 0;
    /* The all-gather of K and V (backward: the reduce-scatter of dK, dV): (n - 1) / n, in one piece
     * per rank of the block (engine/model/model_cp.c), each paying the link's latency. A block of
     * the CP group is tp * size consecutive world ranks: inside a node when they fit. */
    double bw = size >= m->cp ? m->cp_bw
                : m->tp * size <= m->hw.gpus_per_node ? m->hw.intra_node_gbps : m->hw.inter_node_gbps;
    return collective_s(m, m->kv_bytes * (double)sharded_tokens, (size - 1.0) / size, bw) +
           (size - 1) * m->hw.link_latency_us * 1e-6;
}

void cost_cp_beside(const CostModel *m, double x, int pieces, double whole_s, double sharded_s, int backward,
                    CostCpComm *c)
{
    double lat = pieces * m->hw.link_latency_us * 1e-6, bandwidth = x - lat, exposed = bandwidth;
    if (m->overlap && bandwidth > 0 && pieces > 0) {
        /* Equal pieces, and the sharded documents' attention in as many equal blocks, one a piece;
         * the rank's own piece first on the link (the latest any rank's pieces arrive). */
        double piece = bandwidth / pieces, block = sharded_s / pieces, t, link = 0;
        if (!backward) { /* whole documents and the own block first, then each piece's block as it arrives */
            t = whole_s + block;
            for (int j = 1; j < pieces; j++)
                t = (t > (j + 1) * piece ? t : (j + 1) * piece) + block;
            exposed = t - whole_s - sharded_s;
        } else { /* each piece's blocks, then its reduction beside the next blocks; then the whole documents */
            for (int j = 0; j < pieces; j++)
                link = (link > (j + 1) * block ? link : (j + 1) * block) + piece;
            exposed = link - whole_s - sharded_s;
        }
        exposed = exposed > 0 ? exposed : 0;
    }
    c->exposed = exposed + lat;
    c->hidden = x - c->exposed;
    c->contention = m->hw.comm_sm_share * c->hidden;
}

void cost_head_split(const CostModel *m, int64_t tokens, int backward, double *products, double *elementwise)
{
    /* The logits product (its float32 logits written by the product), then the cross-entropy over
     * the local vocabulary slice as the engine runs it (cuda_loss.cu): the forward's pass reads each
     * float32 logit once for the maximum, the sum of exponentials and the target's logit (4 bytes a
     * logit); the loss's backward reads it again and writes the bf16 gradient of the logit (6
     * bytes), then the two gradient products. Both passes at loss_gbps. */
    double n = (double)tokens;
    *products = gemm_s(m, (backward ? 2 : 1) * m->head_flops_fwd * n);
    *elementwise = (backward ? 6 : 4) * m->vocab_local * n / (m->hw.loss_gbps * 1e9);
}

double cost_optimizer_s(const CostModel *m, double params)
{
    if (params <= 0)
        return 0;
    int shard = m->zero && m->dpcp > 1;
    double range = shard ? params / m->dpcp : params;
    double bytes = (4 + 30) * range + (shard ? 6 * params : 0);
    return bytes / (m->hw.optimizer_gbps * 1e9);
}

double cost_head_fwd_s(const CostModel *m, int64_t tokens)
{
    double p, e;
    cost_head_split(m, tokens, 0, &p, &e);
    return p + e;
}

double cost_head_bwd_s(const CostModel *m, int64_t tokens)
{
    double p, e;
    cost_head_split(m, tokens, 1, &p, &e);
    return p + e;
}

void cost_embed_split(const CostModel *m, int64_t tokens, int backward, double *elementwise, double *comm)
{
    *elementwise = *comm = 0;
    if (tokens <= 0)
        return;
    /* Forward: each TP rank writes the float32 rows of the tokens in its vocabulary slice (zeros
     * elsewhere) and the TP sum completes them - an all-reduce, or with SP a reduce-scatter onto the
     * rank's rows: with no product to run under, all of it shows. Backward: the scatter-add of the
     * rows' gradients into the embedding's (read them, read and write the gradient rows); with SP
     * the rows' gradients are all-gathered (float32) first. */
    double bytes = m->grad_row_bytes * (double)tokens, pieces = m->sp ? m->tp_chunks - 1 : 0;
    *elementwise = (backward ? 3 : 1) * bytes / (m->hw.hbm_gbps * 1e9);
    /* (With SP the exchange is one collective per piece of the stream's rows, model_sp.c.) */
    if (!backward && m->tp > 1)
        *comm = collective_s(m, bytes, (m->sp ? 1.0 : 2.0) * (m->tp - 1) / m->tp, m->tp_bw) +
                pieces * m->hw.link_latency_us * 1e-6;
    if (backward && m->sp)
        *comm = collective_s(m, bytes, (m->tp - 1.0) / m->tp, m->tp_bw) + pieces * m->hw.link_latency_us * 1e-6;
}

double cost_embed_fwd_s(const CostModel *m, int64_t tokens)
{
    double e, c;
    cost_embed_split(m, tokens, 0, &e, &c);
    return e + c;
}

double cost_embed_bwd_s(const CostModel *m, int64_t tokens)
{
    double e, c;
    cost_embed_split(m, tokens, 1, &e, &c);
    return e + c;
}

double cost_dp_reduce_s(const CostModel *m, double params)
{
    if (m->dpcp <= 1 || params <= 0)
        return 0;
    /* float32 gradients: a ring all-reduce 2 (n - 1) / n, ZeRO-1's reduce-scatter (n - 1) / n. */
    double n = m->dpcp;
    return collective_s(m, 4 * params, (m->zero ? 1 : 2) * (n - 1) / n, m->dp_bw);
}

double cost_dp_gather_s(const CostModel *m, double params)
{
    if (!m->zero || m->dpcp <= 1 || params <= 0)
        return 0;
    /* ZeRO-1: every rank's float32 shard of the updated parameters, (n - 1) / n. */
    double n = m->dpcp;
    return collective_s(m, 4 * params, (n - 1) / n, m->dp_bw);
}

double cost_p2p_s(const CostModel *m, int64_t tokens)
{
    if (m->pp <= 1 || tokens <= 0)
        return 0;
    return m->p2p_bytes * (double)tokens / (m->pp_bw * 1e9) + m->hw.link_latency_us * 1e-6;
}

double cost_doc_s(const CostModel *m, int64_t n)
{
    return cost_attn_fwd_s(m, n, n) + cost_attn_bwd_s(m, n, n) + cost_linear_fwd_s(m, n) + cost_linear_bwd_s(m, n);
}
