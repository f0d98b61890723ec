/*
 * test/dump_model.c - runs the CPU model on a case and writes everything an independent reference
 * needs to check it (test/test_model_ref.py with test/ref_llama.py, numpy in float64).
 *
 *   dump_model CASE OUT.safetensors [--stories PATH]
 *
 * CASE: tiny, tiny-tied, tiny-llama3rope, tiny-mha (a random tiny model on a small Megatron set
 * written here, packed by the real planner into several micro-batches with the wlb packer and
 * trained for one step's gradients), or stories260k (the llama2.c model: greedy generation from
 * BOS = 1, then loss and gradients on the generated sequence).
 * The file holds the config as metadata, the weights under Hugging Face names, the batch
 * (batch.tokens, batch.targets, batch.positions, batch.doc: all micro-batches one after the other,
 * one doc id per piece, since pieces never attend to each other), result.loss (the mean over
 * tokens with targets), grad.<name> for every weight, and for stories260k the generated tokens.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config/config.h"
#include "cpu/cpu_ops.h"
#include "data/data_idx.h"
#include "data/data_sources.h"
#include "engine/train/batch.h"
#include "engine/plan/cost.h"
#include "engine/model/model.h"
#include "engine/plan/plan.h"
#include "util/rng.h"
#include "util/safetensors.h"

static void die(const Error *err)
{
    fprintf(stderr, "dump_model: %s\n", err->msg);
    exit(1);
}

/* The whole step concatenated, as the reference sees it. */
typedef struct Dump {
    int32_t *tokens, *targets, *positions, *doc;
    int64_t n, cap;
    int32_t next_doc;
} Dump;

static void dump_append(Dump *d, const BatchBuffers *bb, const ModelBatch *b)
{
    if (d->n + b->T > d->cap) {
        d->cap = (d->n + b->T) * 2;
        d->tokens = realloc(d->tokens, (size_t)d->cap * 4);
        d->targets = realloc(d->targets, (size_t)d->cap * 4);
        d->positions = realloc(d->positions, (size_t)d->cap * 4);
        d->doc = realloc(d->doc, (size_t)d->cap * 4);
        if (!d->tokens || !d->targets || !d->positions || !d->doc) {
            fputs("dump_model: out of memory\n", stderr);
            exit(1);
        }
    }
    memcpy(d->tokens + d->n, bb->d_tokens, (size_t)b->T * 4);
    memcpy(d->targets + d->n, bb->d_targets, (size_t)b->T * 4);
    memcpy(d->positions + d->n, bb->d_positions, (size_t)b->T * 4);
    /* One document per segment of keys (cp = 1: each segment is a whole piece). */
    for (int64_t s = 0; s < b->n_segs; s++) {
        for (int64_t i = 0; i < b->segs[s].q_len; i++)
            d->doc[d->n + b->segs[s].q_row + i] = d->next_doc;
        d->next_doc++;
    }
    d->n += b->T;
}

static void write_dump(const char *path, const Config *cfg, const Model *m, const Dump *d, double loss,
                       const int32_t *generated, int64_t n_generated)
{
    StWriter w = {0};
    Error err = {0};
    char buf[64];
    const ConfigModel *c = &cfg->model;
#define META(key, fmt, value)                                        \
    do {                                                             \
        snprintf(buf, sizeof buf, fmt, value);                       \
        if (st_writer_meta(&w, key, buf, &err) != 0)                 \
            die(&err);                                               \
    } while (0)
    META("n_layers", "%lld", (long long)c->n_layers);
    META("d_model", "%lld", (long long)c->d_model);
    META("n_heads", "%lld", (long long)c->n_heads);
    META("n_kv_heads", "%lld", (long long)c->n_kv_heads);
    META("d_ffn", "%lld", (long long)c->d_ffn);
    META("vocab_size", "%lld", (long long)c->vocab_size);
    META("rope_theta", "%.17g", c->rope_theta);
    META("norm_eps", "%.17g", c->norm_eps);
    META("tie_embeddings", "%s", c->tie_embeddings ? "true" : "false");
    META("rope_scaling", "%s", c->rope_scaling == ROPE_SCALING_LLAMA3 ? "llama3" : "none");
    META("rope_scaling_factor", "%.17g", c->rope_scaling_factor);
    META("rope_low_freq_factor", "%.17g", c->rope_low_freq_factor);
    META("rope_high_freq_factor", "%.17g", c->rope_high_freq_factor);
    META("rope_original_max_seq_len", "%lld", (long long)c->rope_original_max_seq_len);
#undef META
    for (int i = 0; i < m->n_tensors; i++) {
        const ModelTensor *t = &m->tensors[i];
        int64_t shape[2] = {t->rows, t->cols};
        int vec = t->kind == T_ATTN_NORM || t->kind == T_MLP_NORM || t->kind == T_FINAL_NORM;
        char name[128];
        snprintf(name, sizeof name, "grad.%s", t->name);
        if (st_writer_add(&w, t->name, ST_F32, vec ? shape + 1 : shape, vec ? 1 : 2, m->params + t->offset, &err) ||
            st_writer_add(&w, name, ST_F32, vec ? shape + 1 : shape, vec ? 1 : 2, m->grads + t->offset, &err))
            die(&err);
    }
    int64_t n = d->n, one = 1;
    float lossf = (float)loss;
    if (st_writer_add(&w, "batch.tokens", ST_I32, &n, 1, d->tokens, &err) ||
        st_writer_add(&w, "batch.targets", ST_I32, &n, 1, d->targets, &err) ||
        st_writer_add(&w, "batch.positions", ST_I32, &n, 1, d->positions, &err) ||
        st_writer_add(&w, "batch.doc", ST_I32, &n, 1, d->doc, &err) ||
        st_writer_add(&w, "result.loss", ST_F32, &one, 1, &lossf, &err))
        die(&err);
    if (generated && st_writer_add(&w, "generated", ST_I32, &n_generated, 1, generated, &err))
        die(&err);
    if (st_write(&w, path, &err) != 0)
        die(&err);
    st_writer_free(&w);
}

static void load_config(Config *cfg, const char *yaml)
{
    Error err = {0};
    config_init(cfg);
    /* The layers split evenly (auto is the engine's to place; the planner here simulates them). */
    if (config_apply_set(cfg, "parallel.stage_layers=even", &err) != 0 ||
        config_load_string(cfg, yaml, "case", &err) != 0 || config_resolve(cfg, 0, &err) != 0)
        die(&err);
}

/* A small Megatron set of random documents of 1 to 40 tokens, some longer than the window of 16. */
static void write_data(const char *prefix, int64_t vocab)
{
    DataIdxWriter w;
    Error err = {0};
    Rng rng;
    rng_seed(&rng, 77);
    if (data_idx_writer_open(&w, prefix, DATA_DTYPE_UINT16, &err) != 0)
        die(&err);
    int32_t tok[64];
    for (int doc = 0; doc < 60; doc++) {
        int64_t len = 1 + (int64_t)rng_below(&rng, rng_below(&rng, 4) ? 12 : 40);
        for (int64_t i = 0; i < len; i++)
            tok[i] = (int32_t)rng_below(&rng, (uint64_t)vocab);
        if (data_idx_writer_add(&w, tok, (uint64_t)len, &err) != 0)
            die(&err);
    }
    if (data_idx_writer_finish(&w, &err) != 0)
        die(&err);
}

static void run_tiny(const char *model_yaml, const char *out)
{
    char dir[] = "/tmp/dump_model_XXXXXX";
    if (!mkdtemp(dir)) {
        perror("dump_model: mkdtemp");
        exit(1);
    }
    char prefix[64], yaml[2048];
    snprintf(prefix, sizeof prefix, "%s/set", dir);
    snprintf(yaml, sizeof yaml,
             "model: %s\nparallel: {dp: 1}\ntrain: {device: cpu, seed: 5}\n"
             "data: {path: %s, context_window: 16, global_batch_tokens: 64, seed: 3}\n"
             "balance: {packer: wlb, outlier_thresholds: [10], hardware: cpu}\n",
             model_yaml, prefix);
    Config cfg;
    load_config(&cfg, yaml);
    write_data(prefix, cfg.model.vocab_size);
    Error err = {0};
    DataSources data;
    DataStream stream;
    CostModel cost;
    Planner pl;
    StepPlan plan = {0};
    Model m;
    BatchBuffers bb = {.ops = cpu_ops()};
    if (data_sources_open(&data, cfg.data.path.v, NULL, cfg.data.path.n, NULL, NULL, &err) ||
        data_stream_init(&stream, data.src, NULL, data.n, 3, 16, &err) || cost_model_init(&cost, &cfg, &err) ||
        plan_init(&pl, &cfg, &cost, &stream, PACKER_WLB, CP_PER_SEQ, &err) || model_init(&m, &cfg.model, cpu_ops(), NULL, RECOMPUTE_NONE, &err))
        die(&err);
    model_init_weights(&m, 5, &err);
    /* Plan two steps and take the second: outliers are queued by then and leftovers carried. */
    for (int step = 0; step < 2; step++)
        if (plan_step(&pl, &plan, &err) != 0)
            die(&err);
    int64_t n_targets = batch_step_targets(&plan, &data);
    Dump d = {0};
    double sum = 0;
    for (int64_t i = 0; i < (int64_t)plan.dp * plan.m; i++) {
        ModelBatch b;
        double mb;
        if (batch_build(&bb, &plan, i, 0, &data, m.dims.vocab, &b, &err) ||
            model_forward(&m, 0, &b, NULL, 1, 1.0f / (float)n_targets, &mb, &err) || model_backward(&m, 0, &b, NULL, &err))
            die(&err);
        sum += mb;
        dump_append(&d, &bb, &b);
    }
    write_dump(out, &cfg, &m, &d, sum / (double)n_targets, NULL, 0);
    fprintf(stderr, "dump_model: %lld tokens in %d micro-batches, %d documents, loss %.6f\n", (long long)d.n,
            plan.dp * plan.m, d.next_doc, sum / (double)n_targets);
    free(d.tokens);
    free(d.targets);
    free(d.positions);
    free(d.doc);
    batch_free(&bb);
    model_free(&m);
    plan_free(&plan);
    plan_destroy(&pl);
    data_stream_free(&stream);
    data_sources_close(&data);
    config_free(&cfg);
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "dump_model: could not remove %s\n", dir);
}

/* Greedy generation from BOS with the llama2.c model, then loss and gradients on the sequence. */
static void run_stories(const char *path, const char *out)
{
    enum { N = 200 };
    Config cfg;
    load_config(&cfg, "model: {preset: stories260k}\nparallel: {dp: 1}\ntrain: {device: cpu}\n");
    Model m;
    Error err = {0};
    if (model_init(&m, &cfg.model, cpu_ops(), NULL, RECOMPUTE_NONE, &err) || model_load(&m, path, &err))
        die(&err);
    int32_t tokens[N + 1], targets[N + 1], positions[N + 1], doc[N + 1];
    float logits[512];
    tokens[0] = 1;
    for (int n = 1; n <= N; n++) {
        for (int i = 0; i < n; i++)
            positions[i] = i;
        AttnSegment seg = {0, n, 0, n, 0};
        ModelBatch b = {.T = n, .tokens = tokens, .targets = tokens, .positions = positions, .segs = &seg, .n_segs = 1};
        if (model_predict(&m, &b, n - 1, logits, &err) != 0)
            die(&err);
        int best = 0;
        for (int v = 1; v < 512; v++)
            best = logits[v] > logits[best] ? v : best;
        tokens[n] = best;
    }
    /* The sequence: tokens 0..N-1 predicting 1..N. */
    for (int i = 0; i < N; i++) {
        targets[i] = tokens[i + 1];
        doc[i] = 0;
    }
    AttnSegment seg = {0, N, 0, N, 0};
    ModelBatch b = {.T = N, .tokens = tokens, .targets = targets, .positions = positions, .segs = &seg, .n_segs = 1};
    double sum;
    if (model_forward(&m, 0, &b, NULL, 1, 1.0f / N, &sum, &err) || model_backward(&m, 0, &b, NULL, &err))
        die(&err);
    Dump d = {tokens, targets, positions, doc, N, N, 1};
    write_dump(out, &cfg, &m, &d, sum / N, tokens, N + 1);
    fprintf(stderr, "dump_model: stories260k, %d generated tokens, loss %.6f\n", N, sum / N);
    model_free(&m);
    config_free(&cfg);
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fputs("usage: dump_model CASE OUT.safetensors [--stories PATH]\n", stderr);
        return 2;
    }
    const char *c = argv[1], *out = argv[2];
    static const char *const tiny =
        "{n_layers: 2, d_model: 32, n_heads: 4, d_ffn: 48, vocab_size: 61, norm_eps: 1.0e-5, max_seq_len: 256";
    char yaml[512];
    if (!strcmp(c, "tiny"))
        snprintf(yaml, sizeof yaml, "%s, n_kv_heads: 2, rope_theta: 10000, tie_embeddings: false}", tiny);
    else if (!strcmp(c, "tiny-tied"))
        snprintf(yaml, sizeof yaml, "%s, n_kv_heads: 2, rope_theta: 10000, tie_embeddings: true}", tiny);
    else if (!strcmp(c, "tiny-mha"))
        snprintf(yaml, sizeof yaml, "%s, n_kv_heads: 4, rope_theta: 10000, tie_embeddings: false}", tiny);
    else if (!strcmp(c, "tiny-llama3rope"))
        /* theta 100 and an original context of 64: with head size 8 the four frequencies fall in
         * all three regimes of the llama3 rule (kept, blended, slowed). */
        snprintf(yaml, sizeof yaml, "%s, n_kv_heads: 2, tie_embeddings: false, rope_theta: 100, "
                 "rope_scaling: llama3, rope_scaling_factor: 8, rope_original_max_seq_len: 64}", tiny);
    else if (!strcmp(c, "stories260k")) {
        if (argc < 5 || strcmp(argv[3], "--stories")) {
            fputs("dump_model: stories260k needs --stories PATH\n", stderr);
            return 2;
        }
        run_stories(argv[4], out);
        return 0;
    } else {
        fprintf(stderr, "dump_model: unknown case %s\n", c);
        return 2;
    }
    run_tiny(yaml, out);
    return 0;
}
