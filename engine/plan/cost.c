/* engine/plan/cost.c - the cost model (see cost.h for the formulas and where the numbers come from). */
#include "engine/plan/cost.h"

#include <math.h>
#include <string.h>


/*
 * Profiles. Sources: ../shared/reference/performance.md.
 * H100 SXM: 989 TF dense bf16 (§1); large GEMMs reach ~780 TF (§4: MAMF 792, XLA 783-808);
 *   FA3 causal forward hd128 616 TF at 16K (§2.1) and the length curve 630 L/(L+238) (§2.2 fit);
 *   FA3 backward hd128 561 vs forward 648 TF (ratio 0.87, §2.1); HBM3 3.35 TB/s; NCCL ring busBW
 *   on NVLink ~370 GB/s (§1); 400 Gb/s RoCE per GPU (Llama 3 cluster, papers.md §3).
 * H200: same compute (989 TF), HBM3e 4.8 TB/s, same NVLink.
 * A100: 312 TF; FA2 forward+backward ~203 TF (65%, §2.3); HBM 2.0 TB/s; NVLink 3 busBW ~230 GB/s;
 *   200 Gb/s InfiniBand.
 * TP collectives: wlbtrain's engine runs them between the products (the NCCL stream waits for the
 *   product before, the next product waits for the collective), so none hides behind a GEMM:
 *   tp_comm_overlap 0 in every profile. (Megatron's TP communication overlap, used by WLB-LLM's and
 *   Llama 3's stacks, would be 1: only TP traffic longer than the GEMMs shows.)
 * cpu: the reference backend on a laptop-class core pair; rough, meant to be calibrated.
 * Device memory (train.gpu_memory_gb's default): H100 SXM 80 GB HBM3, H200 141 GB HBM3e, A100 80 GB
 *   (the 40 GB A100: set train.gpu_memory_gb: 40); the CPU's is the host's, and it is not checked.
 */
static const CostHardware profiles[] = {
    [HW_H100] = {"h100", 989, 0.78, 0.61, 0.87, 238, 128, 3350, 370, 45, 15, 8, 0, 80, 0},
    [HW_H200] = {"h200", 989, 0.78, 0.61, 0.87, 238, 128, 4800, 370, 45, 15, 8, 0, 141, 0},
    [HW_A100] = {"a100", 312, 0.80, 0.65, 0.90, 300, 128, 2039, 230, 22, 15, 8, 0, 80, 0},
    [HW_CPU] = {"cpu", 0.05, 0.5, 0.3, 0.5, 8, 1, 10, 5, 1, 20, 1024, 0, 0, 0},
};

const CostHardware *cost_hardware_profile(HardwareKind kind)
{
    return &profiles[kind];
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
    m->hw = profiles[cfg->balance.hardware];
    if (cfg->balance.calibration &&
        calibration_load(cfg->balance.calibration, &m->hw, &m->table, err) != 0)
        return -1;
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
    if (b->tp_comm_overlap >= 0)
        m->hw.tp_comm_overlap = b->tp_comm_overlap;
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

    const ConfigModel *md = &cfg->model;
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
    m->head_dim = (int)(md->d_model / md->n_heads);
    m->local_heads = (int)(md->n_heads / tp);
    /* With fewer kv heads than TP ranks, each rank keeps a replica of one kv head. */
    m->local_kv_heads = md->n_kv_heads >= tp ? (int)(md->n_kv_heads / tp) : 1;
    m->sp = tp > 1 && cfg->parallel.sequence_parallel;
    double d = (double)md->d_model, f = (double)md->d_ffn / tp, dh = m->head_dim;
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
    m->act_bytes = d * elem;
    m->sum_bytes = d * 4;
    m->p2p_bytes = d * 4 / stream;
    /* The K/V all-gather carries the compute dtype, the dK/dV reduce-scatter float32 sums (and full
     * recomputation gathers again): a direction is charged their mean. */
    m->kv_bytes = 2 * hkv * dh * (elem * (m->recompute == RECOMPUTE_FULL ? 2 : 1) + 4) / 2;
    int g = m->hw.gpus_per_node;
    m->tp_bw = tp <= g ? m->hw.intra_node_gbps : m->hw.inter_node_gbps;
    m->cp_bw = tp * cp <= g ? m->hw.intra_node_gbps : m->hw.inter_node_gbps;
    m->pp_bw = tp * cp * pp <= g ? m->hw.intra_node_gbps : m->hw.inter_node_gbps;
    return 0;
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
            double x = (log2(q) - log2(t->q[i - 1])) / (log2(t->q[i]) - log2(t->q[i - 1]));
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

double cost_linear_fwd_s(const CostModel *m, int64_t tokens)
{
    /* A third of the element-wise traffic is the forward's. */
    return gemm_s(m, m->gemm_flops_fwd * (double)tokens) + m->elem_bytes / 3 * (double)tokens / (m->hw.hbm_gbps * 1e9) +
           launch_s(m, tokens, 1.0 / 3);
}

double cost_linear_bwd_s(const CostModel *m, int64_t tokens)
{
    double t = gemm_s(m, 2 * m->gemm_flops_fwd * (double)tokens) +
               2 * m->elem_bytes / 3 * (double)tokens / (m->hw.hbm_gbps * 1e9) + launch_s(m, tokens, 2.0 / 3);
    if (m->recompute == RECOMPUTE_FULL)
        return t + cost_linear_fwd_s(m, tokens);
    if (m->recompute == RECOMPUTE_SELECTIVE)
        return t + m->recompute_bytes * (double)tokens / (m->hw.hbm_gbps * 1e9);
    return t;
}

/* One collective: bytes over a bus bandwidth (GB/s) scaled by the algorithm's factor, plus latency. */
static double collective_s(const CostModel *m, double bytes, double factor, double gbps)
{
    return bytes * factor / (gbps * 1e9) + m->hw.link_latency_us * 1e-6;
}

double cost_tp_comm_s(const CostModel *m, int64_t tokens_rank)
{
    if (m->tp <= 1 || tokens_rank <= 0)
        return 0;
    /* Without SP two ring all-reduces of float32 partial sums (after the attention output and the
     * MLP down projection): 2 (n - 1) / n. With SP ring all-gathers (compute dtype) and
     * reduce-scatters (float32), (n - 1) / n each: 3 and 2 a direction on the mean (cost.h). Full
     * recomputation runs the forward's again in the backward (2 all-reduces, or 2 all-gathers and
     * 2 reduce-scatters): one more of each a direction on the mean. Overlapped with the GEMMs (tp_comm_overlap of the forward GEMM time can hide it), only the
     * rest is exposed. */
    double rows = (double)tokens_rank, ring = (m->tp - 1.0) / m->tp, again = m->recompute == RECOMPUTE_FULL, t;
    if (m->sp)
        t = (3 + again) * collective_s(m, m->act_bytes * rows, ring, m->tp_bw) +
            (2 + again) * collective_s(m, m->sum_bytes * rows, ring, m->tp_bw);
    else
        t = (2 + again) * collective_s(m, m->sum_bytes * rows, 2 * ring, m->tp_bw);
    double hidden = m->hw.tp_comm_overlap * gemm_s(m, m->gemm_flops_fwd * (double)tokens_rank);
    return t > hidden ? t - hidden : 0;
}

double cost_cp_comm_s(const CostModel *m, int64_t sharded_tokens)
{
    return cost_cp_comm_group_s(m, m->cp, sharded_tokens);
}

double cost_cp_comm_group_s(const CostModel *m, int size, int64_t sharded_tokens)
{
    if (size <= 1 || sharded_tokens <= 0)
        return 0;
    /* One all-gather of K and V (backward: one reduce-scatter of dK, dV): (n - 1) / n. A block of the
     * CP group is tp * size consecutive world ranks: inside a node when they fit. */
    double bw = size >= m->cp ? m->cp_bw
                : m->tp * size <= m->hw.gpus_per_node ? m->hw.intra_node_gbps : m->hw.inter_node_gbps;
    return collective_s(m, m->kv_bytes * (double)sharded_tokens, (size - 1.0) / size, bw);
}

double cost_head_fwd_s(const CostModel *m, int64_t tokens)
{
    /* Logits GEMM, then the softmax over the local vocabulary slice: read the fp32 logits, write
     * the probabilities. */
    double softmax_bytes = 2 * 4 * m->vocab_local * (double)tokens;
    return gemm_s(m, m->head_flops_fwd * (double)tokens) + softmax_bytes / (m->hw.hbm_gbps * 1e9);
}

double cost_head_bwd_s(const CostModel *m, int64_t tokens)
{
    return gemm_s(m, 2 * m->head_flops_fwd * (double)tokens);
}

double cost_embed_fwd_s(const CostModel *m, int64_t tokens)
{
    if (tokens <= 0)
        return 0;
    /* Each TP rank writes the float32 rows of the tokens in its vocabulary slice (zeros elsewhere)
     * and the TP sum completes them - an all-reduce, or with SP a reduce-scatter onto the rank's
     * rows: with no product to run under, all of it shows. */
    double bytes = m->sum_bytes * (double)tokens, t = bytes / (m->hw.hbm_gbps * 1e9);
    if (m->tp > 1)
        t += collective_s(m, bytes, (m->sp ? 1.0 : 2.0) * (m->tp - 1) / m->tp, m->tp_bw);
    return t;
}

double cost_embed_bwd_s(const CostModel *m, int64_t tokens)
{
    if (tokens <= 0)
        return 0;
    /* The scatter-add of the rows' gradients into the embedding's: read them, read and write the
     * gradient rows; with SP the rows' gradients are all-gathered (float32) first. */
    double bytes = m->sum_bytes * (double)tokens, t = 3 * bytes / (m->hw.hbm_gbps * 1e9);
    if (m->sp)
        t += collective_s(m, bytes, (m->tp - 1.0) / m->tp, m->tp_bw);
    return t;
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
