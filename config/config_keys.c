/*
 * config/config_keys.c - the table of every config key, and the generic code that reads, formats,
 * compares and frees a key's value by its type.
 */
#include "config/config_keys.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "util/parse.h"

#define OFF(field) offsetof(Config, field)
#define BIG INT64_C(1) << 50

/* Integer key with constant default (def may be NULL: required or derived, see doc). */
#define INT_KEY(n, f, lo, hi, d, doc, h) {n, KEY_INT, OFF(f), lo, hi, 0, 0, 0, NULL, d, doc, h}
#define AUTO_KEY(n, f, lo, hi, d, doc, h) {n, KEY_INT_AUTO, OFF(f), lo, hi, 0, 0, 0, NULL, d, doc, h}
#define FLOAT_KEY(n, f, lo, hi, fl, d, doc, h) {n, KEY_FLOAT, OFF(f), 0, 0, lo, hi, fl, NULL, d, doc, h}
#define BOOL_KEY(n, f, d, doc, h) {n, KEY_BOOL, OFF(f), 0, 0, 0, 0, 0, NULL, d, doc, h}
#define ENUM_KEY(n, f, ch, d, doc, h) {n, KEY_ENUM, OFF(f), 0, 0, 0, 0, 0, ch, d, doc, h}
#define STR_KEY(n, f, d, h) {n, KEY_STR, OFF(f), 0, 0, 0, 0, 0, NULL, d, NULL, h}

const ConfigKey config_keys[] = {
    STR_KEY("model.preset", model.preset, "none",
            "named model shape: llama2-7b, llama3-8b, llama3-70b (Llama 3.0: 8K, no RoPE scaling), llama3.1-8b, "
            "llama3.1-70b, llama3-405b (Llama 3.1: 128K, llama3 scaling, factor 8), llama3.2-1b, llama3.2-3b "
            "(factor 32), stories260k, tiny; explicit model keys override it"),
    INT_KEY("model.n_layers", model.n_layers, 1, 1024, NULL, "preset", "transformer layers"),
    INT_KEY("model.d_model", model.d_model, 1, 65536, NULL, "preset", "hidden size"),
    INT_KEY("model.n_heads", model.n_heads, 1, 1024, NULL, "preset", "query heads"),
    INT_KEY("model.n_kv_heads", model.n_kv_heads, 1, 1024, NULL, "preset",
            "key/value heads (grouped-query attention); divides n_heads"),
    INT_KEY("model.d_ffn", model.d_ffn, 1, 1 << 20, NULL, "preset", "SwiGLU hidden size"),
    INT_KEY("model.vocab_size", model.vocab_size, 2, INT32_MAX, NULL, "preset",
            "rows of the embedding; every token id must be below it"),
    FLOAT_KEY("model.rope_theta", model.rope_theta, 1, 1e12, KEY_MIN_OPEN, NULL, "preset",
              "RoPE base (above 1: a base of 1 or less turns the rotation frequencies upside down)"),
    FLOAT_KEY("model.norm_eps", model.norm_eps, 0, 1, KEY_MIN_OPEN, NULL, "preset", "RMSNorm epsilon"),
    BOOL_KEY("model.tie_embeddings", model.tie_embeddings, NULL, "preset",
             "output projection shares the embedding matrix"),
    INT_KEY("model.max_seq_len", model.max_seq_len, 1, 1 << 24, NULL, "preset",
            "longest position the model is built for; context_window must not exceed it"),
    ENUM_KEY("model.rope_scaling", model.rope_scaling, "none|llama3|linear|yarn", "none", NULL,
             "RoPE frequency scaling, as Hugging Face's rope_type: llama3 is Llama 3.1's (the 3.1 and 3.2 presets "
             "set it), linear divides every frequency by the factor (position interpolation), yarn blends the two "
             "by wavelength and scales cos and sin (YaRN)"),
    FLOAT_KEY("model.rope_scaling_factor", model.rope_scaling_factor, 1, 1e6, 0, "8", NULL,
              "llama3, linear, yarn scaling: how much the low frequencies are stretched"),
    FLOAT_KEY("model.rope_low_freq_factor", model.rope_low_freq_factor, 0, 1e6, KEY_MIN_OPEN, "1", NULL,
              "llama3 scaling: wavelengths above original_max_seq_len / this are fully scaled"),
    FLOAT_KEY("model.rope_high_freq_factor", model.rope_high_freq_factor, 0, 1e6, KEY_MIN_OPEN, "4", NULL,
              "llama3 scaling: wavelengths below original_max_seq_len / this are kept"),
    INT_KEY("model.rope_original_max_seq_len", model.rope_original_max_seq_len, 1, 1 << 24, "8192", NULL,
            "llama3 and yarn scaling: the context the model was pretrained on"),
    FLOAT_KEY("model.rope_yarn_beta_fast", model.rope_yarn_beta_fast, 0, 1e6, KEY_MIN_OPEN, "32", NULL,
              "yarn scaling: dimensions turning more than this many times over original_max_seq_len are kept"),
    FLOAT_KEY("model.rope_yarn_beta_slow", model.rope_yarn_beta_slow, 0, 1e6, KEY_MIN_OPEN, "1", NULL,
              "yarn scaling: dimensions turning fewer times than this are fully scaled"),
    BOOL_KEY("model.rope_yarn_truncate", model.rope_yarn_truncate, "true", NULL,
             "yarn scaling: the ramp's ends rounded to whole dimensions (floor, ceil), as Hugging Face's default"),
    FLOAT_KEY("model.rope_attention_factor", model.rope_attention_factor, 0, 1e6, 0, "0", NULL,
              "yarn scaling: cos and sin multiplied by it (attention logits by its square); 0 = 0.1 ln(factor) + 1"),

    INT_KEY("parallel.tp", parallel.tp, 1, 1024, "1", NULL, "tensor-parallel size (fastest-varying ranks)"),
    INT_KEY("parallel.cp", parallel.cp, 1, 1024, "1", NULL, "context-parallel size"),
    INT_KEY("parallel.pp", parallel.pp, 1, 1024, "1", NULL, "pipeline-parallel stages"),
    AUTO_KEY("parallel.dp", parallel.dp, 1, 1 << 20, "auto", NULL,
             "data-parallel replicas; auto = world size / (tp*cp*pp)"),
    INT_KEY("parallel.virtual_stages", parallel.virtual_stages, 1, 64, "1", NULL,
            "model chunks per pipeline rank: 1 = 1F1B, more = interleaved 1F1B (Megatron)"),
    ENUM_KEY("parallel.comm", parallel.comm, "auto|mpi|nccl", "auto", NULL,
             "collectives: nccl on GPUs, mpi (host-staged) on CPUs or several ranks per GPU; auto picks"),
    INT_KEY("parallel.zero", parallel.zero, 0, 1, "0", NULL,
            "1 = shard optimizer state over DP x CP (ZeRO-1)"),
    {"parallel.stage_layers", KEY_CHOICE_OR_LIST, OFF(parallel.stage_layers), 0, 1024, 0, 0, 0, "even|auto", "auto",
     NULL, "how the layers are split over the pipeline stages: auto (placed by the cost model so that the slowest "
     "stage's forward + backward of a typical micro-batch of the data is least - the first stage's embedding and the "
     "last stage's output layer and loss counted - every stage within train.gpu_memory_gb, and the even split kept "
     "where the pipeline simulator finds it as fast; docs/stage-balance.md), even (n_layers / chunks each, the "
     "remainder to the first), or a list of counts, one per model chunk (pp x virtual_stages of them, chunk g on "
     "stage g % pp), adding up to model.n_layers"},
    BOOL_KEY("parallel.sequence_parallel", parallel.sequence_parallel, "true", NULL,
             "with tp > 1: the residual stream, the norms and what they keep on 1/tp of the tokens per TP "
             "rank, all-gathered before the column-parallel products and reduce-scattered after the "
             "row-parallel ones (Megatron's sequence parallelism); no effect with tp 1"),
    BOOL_KEY("parallel.overlap", parallel.overlap, "true", NULL,
             "run collectives beside the compute: each bucket of layers' gradient reduction over DP x CP "
             "starts as soon as the last micro-batch's backward has produced it, sequence parallelism's "
             "backward exchanges run beside the products that do not need them, ZeRO-1's parameter all-gather "
             "runs ahead of the next forward, the CP K/V exchange runs beside the attention of the documents held whole, "
             "and the pipeline's receives are posted ahead; false runs every collective where it is issued, in the order of the "
             "blocking engine (the same numbers either way; docs/communication-overlap.md); the dry run "
             "prices each collective exposed or hidden by what it runs beside (docs/planner.md)"),
    FLOAT_KEY("parallel.timeout_s", parallel.timeout_s, 0, 86400, 0, "600", NULL,
              "the collective watchdog: when a collective or message has waited this long with none "
              "finishing on the rank, every rank writes its flight recorder (checkpoint.dir/flight-rank-R.txt), "
              "names what it waits in, and the job ends with status 76 (a hang; the Slurm scripts requeue it); "
              "above the longest step phase (a checkpoint save, an evaluation); 0 = off, else at least 10 (docs/slurm.md)"),
    AUTO_KEY("parallel.tp_chunks", parallel.tp_chunks, 1, 16, "auto", NULL,
             "with tp > 1: pieces of rows each TP product and its exchange split into, each piece's "
             "exchange beside another piece's product (the all-gather before the QKV and gate/up products, "
             "the reduce-scatter after the attention output and down products, the gather of the stream's "
             "gradient in the backward; docs/communication-overlap.md); 1 = one exchange per product; auto = "
             "of 1, 2, 4 the fewest the cost model prices fastest (by 1%) at the largest micro-batch (each "
             "piece pays a link latency: pieces pay for large products only); the same numbers with "
             "parallel.overlap true or false"),
    ENUM_KEY("parallel.reduce_dtype", parallel.reduce_dtype, "fp32|compute", "fp32", NULL,
             "dtype the TP and CP partial sums (the products' reduce-scatters and all-reduces over TP, the "
             "embedding's and output layer's included, and the dK/dV reduce-scatter) travel and add in: fp32, "
             "or compute = train.precision's (bf16 halves their bytes, as Megatron does; measured in "
             "docs/validation.md); gradients over DP x CP always reduce in fp32; bf16 sums run where they are "
             "issued, beside nothing, even with parallel.overlap"),

    {"data.path", KEY_STR_LIST, OFF(data.path), 0, 0, 0, 0, 0, NULL, NULL, "none",
     "Megatron data set prefix (PREFIX.idx + PREFIX.bin), or a list of prefixes to blend"},
    {"data.weights", KEY_FLOAT_LIST, OFF(data.weights), 0, 0, 0, 1e12, KEY_MIN_OPEN, NULL, NULL, "equal",
     "blending weights, one per path (share of tokens)"},
    STR_KEY("data.lengths_file", data.lengths_file, "none",
            "document lengths for a dry run instead of data.path: one per line, a JSON array, or CSV "
            "with a header; .gz accepted"),
    STR_KEY("data.lengths_column", data.lengths_column, "none",
            "CSV column of the lengths; none = the last column"),
    INT_KEY("data.context_window", data.context_window, 2, 1 << 24, NULL, "model.max_seq_len",
            "tokens per fixed-length sequence; longer documents are cut into pieces of this size"),
    AUTO_KEY("data.global_batch_tokens", data.global_batch_tokens, 1, BIG, NULL,
             "pp * dp * context_window",
             "tokens per optimizer step, a multiple of dp * context_window"),
    INT_KEY("data.seed", data.seed, 0, INT64_MAX, "1234", NULL, "seed of the document shuffle"),
    {"data.valid_path", KEY_STR_LIST, OFF(data.valid_path), 0, 0, 0, 0, 0, NULL, NULL, "none",
     "Megatron prefix (or list of prefixes) of a held-out validation set: train.eval_every measures its loss"},
    FLOAT_KEY("data.valid_fraction", data.valid_fraction, 0, 1, KEY_MAX_OPEN, "0", NULL,
              "share of data.path's documents held out for validation instead (chosen by a hash of the document "
              "id: the same split for every seed and layout; never trained on); 0 = none"),
    STR_KEY("data.tokenizer", data.tokenizer, "none",
            "the Hugging Face tokenizer.json the data was tokenized with: wlbtrain export copies it into the model "
            "folder (with tokenizer_config.json and special_tokens_map.json beside it); none = train.init_from's "
            "model folder's, if any"),

    ENUM_KEY("balance.packer", balance.packer, "fixed|fixed_greedy|wlb", "wlb", NULL,
             "fixed: stream order cut at the window (Plain-4D); fixed_greedy: greedy repack into "
             "fixed lengths (Fixed-4D); wlb: workload-balanced variable lengths with outlier delay"),
    ENUM_KEY("balance.cp_sharding", balance.cp_sharding, "per_seq|per_doc|adaptive|hybrid|groups", "hybrid", NULL,
             "how a micro-batch is split over the CP ranks (groups: over aligned power-of-two blocks of them, nested or cut unevenly)"),
    AUTO_KEY("balance.plan_threads", balance.plan_threads, 1, 64, "auto", NULL,
             "threads that shard a step's micro-batches over the CP ranks (the plan is the same for "
             "any count); auto = OMP_NUM_THREADS, else the CPUs, at most 4"),
    ENUM_KEY("balance.long_documents", balance.long_documents, "auto|cut|keep", "auto", NULL,
             "cut: the stream is cut every context_window tokens (Plain-4D's loader), splitting the "
             "documents that straddle a cut; keep: a document is split only when longer than the window "
             "(into window-size pieces from its start); auto: cut for fixed and fixed_greedy, keep for wlb"),
    INT_KEY("balance.max_tokens_per_micro_batch", balance.max_tokens_per_micro_batch, 1, INT32_MAX, NULL,
            "2 * context_window", "S_max: the most tokens the wlb packer puts in one micro-batch"),
    {"balance.outlier_thresholds", KEY_INT_LIST, OFF(balance.outlier_thresholds), 1, 1 << 24, 0, 0, 0,
     NULL, NULL, "context_window x [1/8, 1/4, 1/2, 3/4]",
     "document lengths L1 < L2 < ... where the outlier queues start; [] = no delay"},
    ENUM_KEY("balance.hardware", balance.hardware, "h100|h200|a100|cpu|h100-fa3|h200-fa3", "h100", NULL,
             "hardware profile of the cost model: h100 and h200 with train.device cuda price wlbtrain's own "
             "kernels (engine/plan/profiles/, measured rates); h100-fa3 and h200-fa3 price the published "
             "FlashAttention-3 and cuBLAS rates (what a faster kernel would buy)"),
    STR_KEY("balance.calibration", balance.calibration, "none",
            "cost-model calibration file (JSON of measured rates, see docs/planner.md); overrides the profile"),
    FLOAT_KEY("balance.peak_tflops", balance.peak_tflops, 0, 1e6, 0, "0", NULL,
              "peak dense TFLOP/s of one device; 0 = from the profile or calibration"),
    FLOAT_KEY("balance.gemm_efficiency", balance.gemm_efficiency, 0, 1, 0, "0", NULL,
              "achieved/peak of large GEMMs; 0 = from the profile or calibration"),
    FLOAT_KEY("balance.attn_efficiency", balance.attn_efficiency, 0, 1, 0, "0", NULL,
              "achieved/peak of long-query attention forward; 0 = from the profile or calibration"),
    FLOAT_KEY("balance.attn_half_tokens", balance.attn_half_tokens, 0, 1e9, 0, "0", NULL,
              "query length where attention runs at half its best rate; 0 = from the profile"),
    INT_KEY("balance.attn_tile", balance.attn_tile, 0, 4096, "0", NULL,
            "query rows per attention kernel tile (short chunks are padded to it); 0 = from the profile"),
    FLOAT_KEY("balance.hbm_gbps", balance.hbm_gbps, 0, 1e6, 0, "0", NULL,
              "memory bandwidth, GB/s; 0 = from the profile or calibration"),
    FLOAT_KEY("balance.intra_node_gbps", balance.intra_node_gbps, 0, 1e6, 0, "0", NULL,
              "collective bus bandwidth inside a node, GB/s; 0 = from the profile or calibration"),
    FLOAT_KEY("balance.inter_node_gbps", balance.inter_node_gbps, 0, 1e6, 0, "0", NULL,
              "network bandwidth per device across nodes, GB/s; 0 = from the profile or calibration"),
    INT_KEY("balance.gpus_per_node", balance.gpus_per_node, 0, 1 << 16, "0", NULL,
            "devices per node (TP, CP, PP groups inside a node use its links); 0 = from the profile"),

    ENUM_KEY("train.device", train.device, "cpu|cuda", "cuda", NULL, "backend"),
    ENUM_KEY("train.precision", train.precision, "fp32|bf16", NULL, "bf16 on cuda, fp32 on cpu",
             "compute precision of products and attention, and of the activations they read (master "
             "weights, gradients and the residual stream are always fp32; bf16 on cpu is an emulation "
             "for tests)"),
    ENUM_KEY("train.recompute", train.recompute, "none|selective|full", "none", NULL,
             "activations recomputed in the backward instead of kept: selective = the norms and SwiGLU "
             "outputs, full = each layer from its input"),
    BOOL_KEY("train.deterministic", train.deterministic, "true", NULL,
             "bit-identical results run after run (no floating-point atomics); false lets the GPU use its "
             "fastest attention backward"),
    ENUM_KEY("train.attention", train.attention, "auto|cudnn|own", "auto", NULL,
             "attention kernels of train.device cuda with bf16: cudnn = cuDNN's fused attention (needs a build with "
             "the cudnn-frontend headers and libcudnn.so.9 at run time), own = wlbtrain's kernels, auto = cuDNN where "
             "it loads and its forward, on the first call of each attention shape, agreed with own's and was faster "
             "(timed once), else own; with train.deterministic true auto is own (a choice by timing could differ "
             "between runs)"),
    INT_KEY("train.logits_block", train.logits_block, 0, INT64_C(1) << 40, "0", NULL,
            "floats of one block of the output head's logits (rows x columns of the rank's vocabulary slice; the "
            "loss and its gradient are computed a block at a time): blocks of whole slices while they hold at least "
            "512 rows, else 512 rows over tiles of the vocabulary whose logits the backward recomputes; 0 = the "
            "backend's (2^24 on cpu, 2^26 on cuda: 256 MiB, about 520 rows of Llama 3's vocabulary)"),
    FLOAT_KEY("train.gpu_memory_gb", train.gpu_memory_gb, 0, 1e6, 0, "0", NULL,
              "memory of one device in GB (10^9 bytes): a layout whose predicted peak per rank exceeds it is "
              "refused before training and in the dry run; 0 = from balance.hardware (80 h100, 141 h200, 80 a100; "
              "cpu: not checked)"),
    INT_KEY("train.steps", train.steps, 1, BIG, "1000", NULL, "optimizer steps"),
    FLOAT_KEY("train.lr", train.lr, 0, 10, KEY_MIN_OPEN, "3e-4", NULL, "peak learning rate"),
    FLOAT_KEY("train.min_lr", train.min_lr, 0, 10, 0, NULL, "lr / 10", "learning rate at the end of the schedule"),
    INT_KEY("train.warmup_steps", train.warmup_steps, 0, BIG, "100", NULL, "linear warmup steps"),
    ENUM_KEY("train.schedule", train.schedule, "cosine|linear|constant", "cosine", NULL,
             "decay from lr to min_lr after warmup"),
    FLOAT_KEY("train.weight_decay", train.weight_decay, 0, 10, 0, "0.1", NULL, "AdamW decoupled weight decay"),
    FLOAT_KEY("train.beta1", train.beta1, 0, 1, KEY_MAX_OPEN, "0.9", NULL, "AdamW beta1"),
    FLOAT_KEY("train.beta2", train.beta2, 0, 1, KEY_MAX_OPEN, "0.95", NULL, "AdamW beta2"),
    FLOAT_KEY("train.eps", train.eps, 0, 1, KEY_MIN_OPEN, "1e-8", NULL, "AdamW epsilon"),
    FLOAT_KEY("train.grad_clip", train.grad_clip, 0, 1e12, 0, "1.0", NULL,
              "global gradient-norm clip; 0 = off"),
    BOOL_KEY("train.decay_norms_and_embeddings", train.decay_norms_and_embeddings, "false", NULL,
             "apply weight decay to RMSNorm weights and embeddings too (else matrices only)"),
    INT_KEY("train.seed", train.seed, 0, INT64_MAX, "42", NULL, "seed of the weight initialisation"),
    STR_KEY("train.init_from", train.init_from, "none",
            "initial weights: a Hugging Face model folder (config.json, then model.safetensors or "
            "model.safetensors.index.json and its shards; config.json fills the model keys not set and must agree "
            "with those set), one safetensors file (Hugging Face names) or a llama2.c .bin; none = random"),
    ENUM_KEY("train.nonfinite", train.nonfinite, "stop|skip", "stop", NULL,
             "a step whose loss or gradients are NaN or infinite: stop the run (exit 1), or skip its update "
             "and count it"),
    STR_KEY("train.stop_after", train.stop_after, "none",
            "end this run early, with a checkpoint: after N steps of this run (500) or the first step that "
            "ends past a wall time since its start (90s, 45m, 2h, 1h30m); the schedule stays that of "
            "train.steps; none = run to train.steps"),
    INT_KEY("train.eval_every", train.eval_every, 0, BIG, "0", NULL,
            "validation loss every N steps and after the last (needs data.valid_path or data.valid_fraction); "
            "0 = none"),
    AUTO_KEY("train.eval_tokens", train.eval_tokens, 1, BIG, "auto", NULL,
             "validation tokens an evaluation reads, the same ones every time: rounded up to whole global batches, "
             "at most the validation set's whole global batches (at least one); auto = 10 global batches"),
    {"train.eval_position_buckets", KEY_CHOICE_OR_LIST, OFF(train.eval_position_buckets), 1, 1 << 30, 0, 0, 0,
     "auto", "auto", NULL, "the validation loss by token position (the RoPE position: the token's offset in its "
     "document) is also reported in these buckets: a list of increasing edges e1 < e2 < ... (buckets [0, e1), "
     "[e1, e2), ..., [ek, and on)), or auto: edges 1024, 4096, 16384, 65536, 131072, then doubling, those below "
     "data.context_window; [] = one bucket (docs/validation.md)"},

    STR_KEY("checkpoint.dir", checkpoint.dir, "none", "folder of checkpoints; none = no checkpoints"),
    INT_KEY("checkpoint.every", checkpoint.every, 0, BIG, "0", NULL, "save every N steps; 0 = only at the end"),
    STR_KEY("checkpoint.resume", checkpoint.resume, "none",
            "none, auto (the latest in checkpoint.dir) or a checkpoint path"),
    INT_KEY("checkpoint.keep", checkpoint.keep, 1, 1 << 20, "3", NULL, "checkpoints kept"),
    STR_KEY("checkpoint.continue_from", checkpoint.continue_from, "none",
            "a checkpoint of another run (a step folder, or a checkpoint folder: its latest) this run starts from "
            "as its next stage: its weights and AdamW's moments and update count, with this config's "
            "data.context_window, model.rope_* keys, data and schedule (a shape key must not change); used when "
            "checkpoint.resume finds nothing to resume (docs/checkpoints.md, Stages); none = none"),
    ENUM_KEY("checkpoint.continue_schedule", checkpoint.continue_schedule, "restart|continue", "restart", NULL,
             "with checkpoint.continue_from: restart = this run counts its steps from 1 and runs the LR schedule "
             "(warmup included) over its own train.steps; continue = steps and schedule go on after the "
             "checkpoint's step (train.steps counts the earlier stages' steps too)"),

    INT_KEY("log.every", log.every, 1, BIG, "1", NULL, "print a line every N steps"),
    STR_KEY("log.metrics", log.metrics, "none", "JSON-lines metrics file, one object per step"),

    STR_KEY("trace.steps", trace.steps, "none",
            "the training steps to trace, such as 3-5,10: every rank writes a timeline of them "
            "(TRACE_DIR/measured/rank<R>.pt.trace.json, PyTorch profiler's JSON format: Perfetto and Holistic "
            "Trace Analysis read it; docs/timelines.md); --trace STEPS sets it; with --dry-run the predicted "
            "timelines of those steps (TRACE_DIR/predicted/); none = no tracing"),
    STR_KEY("trace.dir", trace.dir, "none",
            "the folder of the traces; none = checkpoint.dir/traces, or traces in the working directory "
            "without a checkpoint.dir"),
};
const int config_n_keys = (int)(sizeof config_keys / sizeof config_keys[0]);

_Static_assert(sizeof config_keys / sizeof config_keys[0] <= CONFIG_MAX_KEYS, "raise CONFIG_MAX_KEYS");

int config_key_find(const char *name)
{
    for (int k = 0; k < config_n_keys; k++)
        if (!strcmp(config_keys[k].name, name))
            return k;
    return -1;
}

int config_section_known(const char *name, size_t len)
{
    for (int k = 0; k < config_n_keys; k++) {
        const char *dot = strchr(config_keys[k].name, '.');
        if ((size_t)(dot - config_keys[k].name) == len && !strncmp(config_keys[k].name, name, len))
            return 1;
    }
    return 0;
}

/* Levenshtein distance, for hints; names are short, so the O(n*m) table is fine. */
static int edit_distance(const char *a, const char *b)
{
    size_t n = strlen(a), m = strlen(b);
    if (n > 63 || m > 63)
        return 99;
    int d[64][64];
    for (size_t i = 0; i <= n; i++)
        d[i][0] = (int)i;
    for (size_t j = 0; j <= m; j++)
        d[0][j] = (int)j;
    for (size_t i = 1; i <= n; i++)
        for (size_t j = 1; j <= m; j++) {
            int sub = d[i - 1][j - 1] + (a[i - 1] != b[j - 1]);
            int del = d[i - 1][j] + 1, ins = d[i][j - 1] + 1;
            d[i][j] = sub < del ? (sub < ins ? sub : ins) : (del < ins ? del : ins);
        }
    return d[n][m];
}

const char *config_key_hint(const char *name)
{
    const char *best = NULL;
    int best_d = 1 << 30;
    const char *dot = strchr(name, '.');
    for (int k = 0; k < config_n_keys; k++) {
        const char *kn = config_keys[k].name;
        int d = edit_distance(name, kn);
        /* Also match the part after the section: "parallel.ntp" vs "model.n_layers" is far, but a
         * key put in the wrong section ("model.tp") should point to "parallel.tp". */
        const char *kdot = strchr(kn, '.');
        if (dot && kdot) {
            int dk = edit_distance(dot + 1, kdot + 1) + 1;
            if (dk < d)
                d = dk;
        }
        if (d < best_d) {
            best_d = d;
            best = kn;
        }
    }
    /* Close enough to be a typo: a couple of edits, a few more for long names. */
    return best_d <= 2 + (int)(strlen(name) / 8) ? best : NULL;
}

const char *config_key_removed(const char *name)
{
    static const struct {
        const char *name, *why;
    } removed[] = {
        {"balance.tp_comm_overlap", "removed: the cost model prices each collective as exposed or hidden by what the "
                                    "engine overlaps it with (parallel.overlap, docs/planner.md); delete the line"},
        {"balance.cp_fill", "removed: the step pass it switched changed predicted throughput by under 0.2% on "
                            "every benchmarked layout (docs/planner.md); delete the line"},
    };
    for (size_t i = 0; i < sizeof removed / sizeof removed[0]; i++)
        if (strcmp(name, removed[i].name) == 0)
            return removed[i].why;
    return NULL;
}

const char *config_section_hint(const char *name)
{
    static char best[32];
    int best_d = 1 << 30;
    for (int k = 0; k < config_n_keys; k++) {
        char section[32];
        snprintf(section, sizeof section, "%.*s", (int)(strchr(config_keys[k].name, '.') - config_keys[k].name),
                 config_keys[k].name);
        int d = edit_distance(name, section);
        if (d < best_d) {
            best_d = d;
            memcpy(best, section, sizeof best);
        }
    }
    return best_d <= 2 + (int)(strlen(name) / 8) ? best : NULL;
}

/* ---------------------------------------------------------------------------------------------- */
/* Reading values                                                                                  */

static int is_null_word(const char *s, int plain)
{
    return plain && (!*s || !strcmp(s, "none") || !strcmp(s, "null") || !strcmp(s, "~") ||
                     !strcmp(s, "Null") || !strcmp(s, "NULL"));
}

static int read_int(const ConfigKey *key, const char *s, int64_t *out, const char *where, Error *err)
{
    if (parse_int64(s, out) != 0)
        return error_set(err, where, "%s: expected an integer%s, got '%s'", key->name,
                         key->type == KEY_INT_AUTO ? " or auto" : "", s);
    if (*out < key->imin || *out > key->imax)
        return error_set(err, where, "%s: must be between %lld and %lld, got %lld", key->name,
                         (long long)key->imin, (long long)key->imax, (long long)*out);
    return 0;
}

static int read_float(const ConfigKey *key, const char *s, double *out, const char *where, Error *err)
{
    if (parse_double(s, out) != 0)
        return error_set(err, where, "%s: expected a number, got '%s'", key->name, s);
    int lo_bad = (key->flags & KEY_MIN_OPEN) ? *out <= key->fmin : *out < key->fmin;
    int hi_bad = (key->flags & KEY_MAX_OPEN) ? *out >= key->fmax : *out > key->fmax;
    if (lo_bad || hi_bad)
        return error_set(err, where, "%s: must be %s %g and %s %g, got %s", key->name,
                         (key->flags & KEY_MIN_OPEN) ? ">" : ">=", key->fmin,
                         (key->flags & KEY_MAX_OPEN) ? "<" : "<=", key->fmax, s);
    return 0;
}

/* The index of s among the key's choices, or -1; *count gets how many there are. */
static int choice_index(const ConfigKey *key, const char *s, int *count)
{
    size_t n = strlen(s);
    int i = 0, found = -1;
    for (const char *p = key->choices; *p; i++) {
        const char *bar = strchr(p, '|');
        size_t len = bar ? (size_t)(bar - p) : strlen(p);
        if (found < 0 && len == n && !strncmp(p, s, n))
            found = i;
        p += len + (bar != NULL);
    }
    *count = i;
    return found;
}

static int read_enum(const ConfigKey *key, const char *s, int *out, const char *where, Error *err)
{
    int count, i = choice_index(key, s, &count);
    if (i >= 0) {
        *out = i;
        return 0;
    }
    return error_set(err, where, "%s: expected one of %s, got '%s'", key->name, key->choices, s);
}

static const char *enum_name(const ConfigKey *key, int value, char *buf, size_t size)
{
    const char *p = key->choices;
    for (int i = 0; *p; i++) {
        const char *bar = strchr(p, '|');
        size_t len = bar ? (size_t)(bar - p) : strlen(p);
        if (i == value) {
            snprintf(buf, size, "%.*s", (int)len, p);
            return buf;
        }
        p += len + (bar != NULL);
    }
    snprintf(buf, size, "%d", value);
    return buf;
}

static char *dup_or_fail(const char *s, const char *where, Error *err)
{
    char *d = strdup(s);
    if (!d)
        error_runtime(err, where, "out of memory");
    return d;
}

int config_key_assign(Config *cfg, int k, const ConfigValue *v, const char *where, Error *err)
{
    const ConfigKey *key = &config_keys[k];
    int is_list_type = key->type == KEY_INT_LIST || key->type == KEY_FLOAT_LIST || key->type == KEY_STR_LIST ||
                       key->type == KEY_CHOICE_OR_LIST;
    if (v->is_list && !is_list_type)
        return error_set(err, where, "%s: expected a single value, got a list", key->name);
    const char *s = v->n > 0 ? v->items[0] : "";
    int plain = v->n > 0 ? v->plain[0] : 1;
    /* For a list key, a single scalar is a list of one, and a single null is the empty list. */
    int n = (!v->is_list && v->n == 1 && is_null_word(s, plain)) ? 0 : v->n;

    switch (key->type) {
    case KEY_INT:
        return read_int(key, s, CONFIG_FIELD(cfg, k, int64_t), where, err);
    case KEY_INT_AUTO:
        if (!strcmp(s, "auto")) {
            *CONFIG_FIELD(cfg, k, int64_t) = 0;
            return 0;
        }
        return read_int(key, s, CONFIG_FIELD(cfg, k, int64_t), where, err);
    case KEY_FLOAT:
        return read_float(key, s, CONFIG_FIELD(cfg, k, double), where, err);
    case KEY_BOOL:
        if (!strcmp(s, "true") || !strcmp(s, "false")) {
            *CONFIG_FIELD(cfg, k, bool) = s[0] == 't';
            return 0;
        }
        return error_set(err, where, "%s: expected true or false, got '%s'", key->name, s);
    case KEY_ENUM:
        return read_enum(key, s, CONFIG_FIELD(cfg, k, int), where, err);
    case KEY_STR: {
        char **field = CONFIG_FIELD(cfg, k, char *);
        char *copy = NULL;
        if (!is_null_word(s, plain) && !(copy = dup_or_fail(s, where, err)))
            return -1;
        free(*field);
        *field = copy;
        return 0;
    }
    case KEY_INT_LIST:
    case KEY_FLOAT_LIST: {
        /* ConfigIntList and ConfigFloatList have the same shape: a count and an array. */
        int is_int = key->type == KEY_INT_LIST;
        size_t elem = is_int ? sizeof(int64_t) : sizeof(double);
        unsigned char *vals = calloc((size_t)n + 1, elem);
        if (!vals)
            return error_runtime(err, where, "out of memory");
        for (int i = 0; i < n; i++) {
            void *at = vals + (size_t)i * elem;
            if ((is_int ? read_int(key, v->items[i], at, where, err) : read_float(key, v->items[i], at, where, err)) != 0) {
                free(vals);
                return -1;
            }
        }
        if (is_int) {
            ConfigIntList *l = CONFIG_FIELD(cfg, k, ConfigIntList);
            free(l->v);
            *l = (ConfigIntList){n, (int64_t *)(void *)vals};
        } else {
            ConfigFloatList *l = CONFIG_FIELD(cfg, k, ConfigFloatList);
            free(l->v);
            *l = (ConfigFloatList){n, (double *)(void *)vals};
        }
        return 0;
    }
    case KEY_CHOICE_OR_LIST: {
        ConfigChoiceOrList *c = CONFIG_FIELD(cfg, k, ConfigChoiceOrList);
        int count, word = choice_index(key, s, &count);
        int64_t ignored;
        if (v->is_list)
            word = -1;
        else if (v->n != 1 || (word < 0 && parse_int64(s, &ignored) != 0))
            return error_set(err, where, "%s: expected one of %s or a list of integers, got '%s'", key->name,
                             key->choices, s);
        int64_t *vals = calloc((size_t)v->n + 1, sizeof *vals);
        if (!vals)
            return error_runtime(err, where, "out of memory");
        for (int i = 0; word < 0 && i < v->n; i++)
            if (read_int(key, v->items[i], &vals[i], where, err) != 0) {
                free(vals);
                return -1;
            }
        free(c->list.v);
        c->list = (ConfigIntList){word < 0 ? v->n : 0, vals};
        c->choice = word < 0 ? count : word;
        return 0;
    }
    case KEY_STR_LIST: {
        ConfigStrList *l = CONFIG_FIELD(cfg, k, ConfigStrList);
        char **vals = calloc((size_t)n + 1, sizeof *vals);
        if (!vals)
            return error_runtime(err, where, "out of memory");
        for (int i = 0; i < n; i++) {
            if (is_null_word(v->items[i], v->plain[i])) {
                error_set(err, where, "%s: empty entry in the list", key->name);
            } else if ((vals[i] = dup_or_fail(v->items[i], where, err)) != NULL) {
                continue;
            }
            for (int j = 0; j < i; j++)
                free(vals[j]);
            free(vals);
            return -1;
        }
        config_key_free(cfg, k);
        l->v = vals;
        l->n = n;
        return 0;
    }
    }
    return error_set(err, where, "%s: unknown key type", key->name);
}

/* ---------------------------------------------------------------------------------------------- */
/* Formatting, comparing, freeing                                                                  */

void config_format_double(double x, char *buf, size_t size)
{
    if (x == floor(x) && fabs(x) < 1e15) {
        snprintf(buf, size, "%.0f", x);
        return;
    }
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(buf, size, "%.*g", prec, x);
        if (strtod(buf, NULL) == x)
            break;
    }
}

int config_key_count(const Config *cfg, int k)
{
    switch (config_keys[k].type) {
    case KEY_INT_LIST:
        return CONFIG_FIELD(cfg, k, ConfigIntList)->n;
    case KEY_FLOAT_LIST:
        return CONFIG_FIELD(cfg, k, ConfigFloatList)->n;
    case KEY_STR_LIST:
        return CONFIG_FIELD(cfg, k, ConfigStrList)->n;
    case KEY_STR:
        return *CONFIG_FIELD(cfg, k, char *) != NULL;
    case KEY_CHOICE_OR_LIST:
        return config_key_is_list(cfg, k) ? CONFIG_FIELD(cfg, k, ConfigChoiceOrList)->list.n : 1;
    default:
        return 1;
    }
}

int config_key_is_list(const Config *cfg, int k)
{
    const ConfigKey *key = &config_keys[k];
    if (key->type == KEY_CHOICE_OR_LIST) {
        int count;
        choice_index(key, "", &count);
        return CONFIG_FIELD(cfg, k, ConfigChoiceOrList)->choice >= count;
    }
    return key->type == KEY_INT_LIST || key->type == KEY_FLOAT_LIST || key->type == KEY_STR_LIST;
}

void config_key_format(const Config *cfg, int k, int i, char *buf, size_t size, int *quote)
{
    const ConfigKey *key = &config_keys[k];
    *quote = 0;
    switch (key->type) {
    case KEY_INT:
        snprintf(buf, size, "%lld", (long long)*CONFIG_FIELD(cfg, k, int64_t));
        return;
    case KEY_INT_AUTO: {
        int64_t v = *CONFIG_FIELD(cfg, k, int64_t);
        if (v == 0)
            snprintf(buf, size, "auto");
        else
            snprintf(buf, size, "%lld", (long long)v);
        return;
    }
    case KEY_FLOAT:
        config_format_double(*CONFIG_FIELD(cfg, k, double), buf, size);
        return;
    case KEY_BOOL:
        snprintf(buf, size, "%s", *CONFIG_FIELD(cfg, k, bool) ? "true" : "false");
        return;
    case KEY_ENUM:
        enum_name(key, *CONFIG_FIELD(cfg, k, int), buf, size);
        return;
    case KEY_STR: {
        const char *s = *CONFIG_FIELD(cfg, k, char *);
        snprintf(buf, size, "%s", s ? s : "none");
        *quote = s && is_null_word(s, 1);
        return;
    }
    case KEY_INT_LIST:
        snprintf(buf, size, "%lld", (long long)CONFIG_FIELD(cfg, k, ConfigIntList)->v[i]);
        return;
    case KEY_FLOAT_LIST:
        config_format_double(CONFIG_FIELD(cfg, k, ConfigFloatList)->v[i], buf, size);
        return;
    case KEY_CHOICE_OR_LIST: {
        const ConfigChoiceOrList *c = CONFIG_FIELD(cfg, k, ConfigChoiceOrList);
        if (config_key_is_list(cfg, k))
            snprintf(buf, size, "%lld", (long long)c->list.v[i]);
        else
            enum_name(key, c->choice, buf, size);
        return;
    }
    case KEY_STR_LIST: {
        const char *s = CONFIG_FIELD(cfg, k, ConfigStrList)->v[i];
        snprintf(buf, size, "%s", s);
        *quote = is_null_word(s, 1);
        return;
    }
    }
}

static int str_eq(const char *a, const char *b) { return (!a && !b) || (a && b && !strcmp(a, b)); }

static int int_lists_equal(const ConfigIntList *x, const ConfigIntList *y)
{
    return x->n == y->n && (x->n == 0 || !memcmp(x->v, y->v, (size_t)x->n * sizeof *x->v));
}

int config_key_equal(const Config *a, const Config *b, int k)
{
    switch (config_keys[k].type) {
    case KEY_INT:
    case KEY_INT_AUTO:
        return *CONFIG_FIELD(a, k, int64_t) == *CONFIG_FIELD(b, k, int64_t);
    case KEY_FLOAT:
        return *CONFIG_FIELD(a, k, double) == *CONFIG_FIELD(b, k, double);
    case KEY_BOOL:
        return *CONFIG_FIELD(a, k, bool) == *CONFIG_FIELD(b, k, bool);
    case KEY_ENUM:
        return *CONFIG_FIELD(a, k, int) == *CONFIG_FIELD(b, k, int);
    case KEY_STR:
        return str_eq(*CONFIG_FIELD(a, k, char *), *CONFIG_FIELD(b, k, char *));
    case KEY_INT_LIST:
        return int_lists_equal(CONFIG_FIELD(a, k, ConfigIntList), CONFIG_FIELD(b, k, ConfigIntList));
    case KEY_CHOICE_OR_LIST: {
        const ConfigChoiceOrList *x = CONFIG_FIELD(a, k, ConfigChoiceOrList), *y = CONFIG_FIELD(b, k, ConfigChoiceOrList);
        return x->choice == y->choice && int_lists_equal(&x->list, &y->list);
    }
    case KEY_FLOAT_LIST: {
        const ConfigFloatList *x = CONFIG_FIELD(a, k, ConfigFloatList), *y = CONFIG_FIELD(b, k, ConfigFloatList);
        if (x->n != y->n)
            return 0;
        for (int i = 0; i < x->n; i++)
            if (x->v[i] != y->v[i])
                return 0;
        return 1;
    }
    case KEY_STR_LIST: {
        const ConfigStrList *x = CONFIG_FIELD(a, k, ConfigStrList), *y = CONFIG_FIELD(b, k, ConfigStrList);
        if (x->n != y->n)
            return 0;
        for (int i = 0; i < x->n; i++)
            if (!str_eq(x->v[i], y->v[i]))
                return 0;
        return 1;
    }
    }
    return 0;
}

void config_key_free(Config *cfg, int k)
{
    switch (config_keys[k].type) {
    case KEY_STR: {
        char **s = CONFIG_FIELD(cfg, k, char *);
        free(*s);
        *s = NULL;
        return;
    }
    case KEY_INT_LIST: {
        ConfigIntList *l = CONFIG_FIELD(cfg, k, ConfigIntList);
        free(l->v);
        l->v = NULL;
        l->n = 0;
        return;
    }
    case KEY_FLOAT_LIST: {
        ConfigFloatList *l = CONFIG_FIELD(cfg, k, ConfigFloatList);
        free(l->v);
        l->v = NULL;
        l->n = 0;
        return;
    }
    case KEY_CHOICE_OR_LIST: {
        ConfigIntList *l = &CONFIG_FIELD(cfg, k, ConfigChoiceOrList)->list;
        free(l->v);
        l->v = NULL;
        l->n = 0;
        return;
    }
    case KEY_STR_LIST: {
        ConfigStrList *l = CONFIG_FIELD(cfg, k, ConfigStrList);
        for (int i = 0; i < l->n; i++)
            free(l->v[i]);
        free(l->v);
        l->v = NULL;
        l->n = 0;
        return;
    }
    default:
        return;
    }
}

int config_key_copy(Config *dst, const Config *src, int k, Error *err)
{
    /* Through the text form: one code path for every type, and copying is rare (presets, tests). */
    int n = config_key_count(src, k);
    const ConfigKey *key = &config_keys[k];
    int is_list = config_key_is_list(src, k);
    char **items = calloc((size_t)n + 1, sizeof *items);
    int *plain = calloc((size_t)n + 1, sizeof *plain);
    int rc = -1;
    if (!items || !plain) {
        error_runtime(err, key->name, "out of memory");
        goto done;
    }
    for (int i = 0; i < n; i++) {
        char buf[4096];
        int quote;
        config_key_format(src, k, i, buf, sizeof buf, &quote);
        plain[i] = !quote;
        if (!(items[i] = strdup(buf))) {
            error_runtime(err, key->name, "out of memory");
            goto done;
        }
    }
    const char *none = "none";
    int none_plain = 1;
    ConfigValue v = {is_list, n, (const char *const *)items, plain};
    if (!is_list && n == 0) /* a NULL string */
        v = (ConfigValue){0, 1, &none, &none_plain};
    rc = config_key_assign(dst, k, &v, key->name, err);
done:
    for (int i = 0; items && i < n; i++)
        free(items[i]);
    free(items);
    free(plain);
    return rc;
}

void config_where(const Config *cfg, int k, char *buf, size_t size)
{
    const ConfigOrigin *o = &cfg->origin[k];
    if (o->kind == ORIGIN_FILE)
        snprintf(buf, size, "%s:%d:%d", cfg->source_path ? cfg->source_path : "config", o->line, o->col);
    else if (o->kind == ORIGIN_SET)
        snprintf(buf, size, "--set %s", o->arg);
    else if (o->kind == ORIGIN_MODEL_FOLDER && cfg->train.init_from)
        snprintf(buf, size, "%s/config.json", cfg->train.init_from);
    else
        snprintf(buf, size, "%s", cfg->source_path ? cfg->source_path : "config");
}

/* Names of enum values, in enum order (the key table's choices list them the same way; a test
 * checks that they agree). */
const char *config_packer_name(PackerKind k)
{
    static const char *const names[] = {"fixed", "fixed_greedy", "wlb"};
    return names[k];
}

const char *config_cp_sharding_name(CpSharding k)
{
    static const char *const names[] = {"per_seq", "per_doc", "adaptive", "hybrid", "groups"};
    return names[k];
}

const char *config_recompute_name(Recompute k)
{
    static const char *const names[] = {"none", "selective", "full"};
    return names[k];
}

const char *config_hardware_name(HardwareKind k)
{
    static const char *const names[] = {"h100", "h200", "a100", "cpu", "h100-fa3", "h200-fa3"};
    return names[k];
}

const char *config_stage_layers_name(StageLayers k)
{
    static const char *const names[] = {"even", "auto", "a list"};
    return names[k];
}
