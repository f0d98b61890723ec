/*
 * test/test_model.c - the CPU model: gradients against finite differences, the invariant of the
 * design on one process (the same documents packed differently give the same loss and gradients,
 * whatever the micro-batch split, order or packer), weights saved and loaded, AdamW and the
 * schedule against their formulas. (The comparison with an independent float64 numpy reference is
 * test/test_model_ref.py.)
 */
#include "test/testlib.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "config/config.h"
#include "cpu/cpu_ops.h"
#include "data/data_idx.h"
#include "data/data_sources.h"
#include "engine/train/batch.h"
#include "engine/plan/cost.h"
#include "engine/model/model.h"
#include "engine/train/optim.h"
#include "engine/plan/plan.h"
#include "util/rng.h"
#include "util/safetensors.h"

static const char tiny_model[] = "{n_layers: 2, d_model: 32, n_heads: 4, n_kv_heads: 2, d_ffn: 48, vocab_size: 61, "
                                 "rope_theta: 10000, norm_eps: 1.0e-5, tie_embeddings: false, max_seq_len: 256}";

static void load_config(Config *cfg, const char *yaml)
{
    Error err = {0};
    config_init(cfg);
    /* The layers split evenly unless the YAML says otherwise (auto is the engine's to place). */
    if (config_apply_set(cfg, "parallel.stage_layers=even", &err) != 0 ||
        config_load_string(cfg, yaml, "t.yaml", &err) != 0 || config_resolve(cfg, 0, &err) != 0) {
        print_error("%s\n", err.msg);
        fail();
    }
}

static void new_model(Model *m, Config *cfg)
{
    char *yaml = test_format("model: %s\nparallel: {dp: 1}\ntrain: {device: cpu}\n", tiny_model);
    load_config(cfg, yaml);
    free(yaml);
    Error err = {0};
    assert_int_equal(model_init(m, &cfg->model, cpu_ops(), NULL, RECOMPUTE_NONE, &err), 0);
    assert_int_equal(model_init_weights(m, 11, &err), 0);
}

/* A batch of documents of the given lengths, back to back, random tokens (seeded). */
typedef struct TestBatch {
    int32_t tokens[256], targets[256], positions[256];
    AttnSegment segs[16];
    ModelBatch b;
} TestBatch;

static void make_batch(TestBatch *tb, const int *lens, int n, uint64_t seed)
{
    Rng rng;
    rng_seed(&rng, seed);
    int64_t at = 0;
    for (int i = 0; i < n; i++) {
        for (int j = 0; j < lens[i]; j++) {
            tb->tokens[at + j] = (int32_t)rng_below(&rng, 61);
            tb->positions[at + j] = j;
        }
        for (int j = 0; j < lens[i]; j++)
            tb->targets[at + j] = j + 1 < lens[i] ? tb->tokens[at + j + 1] : -1;
        tb->segs[i] = (AttnSegment){at, lens[i], at, lens[i], 0};
        at += lens[i];
    }
    tb->b = (ModelBatch){.T = at, .tokens = tb->tokens, .targets = tb->targets, .positions = tb->positions, .segs = tb->segs, .n_segs = n};
}

static double loss_of(Model *m, const ModelBatch *b)
{
    Error err = {0};
    double sum;
    assert_int_equal(model_forward(m, 0, b, NULL, 0, 0, &sum, &err), 0);
    return sum;
}

static void test_finite_differences(void **state)
{
    (void)state;
    Config cfg;
    Model m;
    new_model(&m, &cfg);
    TestBatch tb;
    int lens[] = {9, 14, 3, 20};
    make_batch(&tb, lens, 4, 3);
    Error err = {0};
    double sum;
    /* Sharper attention than at initialisation, so that q and k get gradients worth checking. */
    for (int l = 0; l < 2; l++)
        for (ModelTensorKind k = T_WQ; k <= T_WK; k++) {
            const ModelTensor *t = model_tensor(&m, k, l);
            for (int64_t i = 0; i < t->rows * t->cols; i++)
                m.params[t->offset + i] *= 6.0f;
        }
    m.ops->zero(m.grads, m.n_params);
    assert_int_equal(model_forward(&m, 0, &tb.b, NULL, 1, 1.0f, &sum, &err), 0);
    assert_int_equal(model_backward(&m, 0, &tb.b, NULL, &err), 0);
    /* For a few tensors, the 3 entries with the largest gradient: central differences in fp32 with
     * a step of 1e-2 carry noise of about 1e-4 absolute, and curvature about 1% of the largest
     * (embedding) gradients; the gradients checked are above 1e-2. */
    const char *names[] = {"model.embed_tokens.weight",           "model.layers.0.self_attn.q_proj.weight",
                           "model.layers.0.self_attn.k_proj.weight", "model.layers.1.self_attn.q_proj.weight",
                           "model.layers.1.self_attn.v_proj.weight", "model.layers.1.mlp.down_proj.weight",
                           "model.layers.1.input_layernorm.weight",  "model.norm.weight",
                           "lm_head.weight"};
    int checked = 0;
    for (size_t k = 0; k < sizeof names / sizeof names[0]; k++) {
        const ModelTensor *t = model_tensor_by_name(&m, names[k]);
        assert_non_null(t);
        for (int pick = 0; pick < 3; pick++) {
            int64_t best = -1;
            for (int64_t i = 0; i < t->rows * t->cols; i++) {
                float g = fabsf(m.grads[t->offset + i]);
                if (g > 1e-2f && (best < 0 || g > fabsf(m.grads[t->offset + best])))
                    best = i;
            }
            if (best < 0)
                break;
            float *p = &m.params[t->offset + best], keep = *p, h = 1e-2f;
            *p = keep + h;
            double up = loss_of(&m, &tb.b);
            *p = keep - h;
            double down = loss_of(&m, &tb.b);
            *p = keep;
            double fd = (up - down) / (2 * h), g = m.grads[t->offset + best];
            if (fabs(fd - g) > 0.01 * fabs(g) + 2e-4) {
                print_error("%s[%lld]: gradient %g, finite difference %g\n", names[k], (long long)best, g, fd);
                fail();
            }
            m.grads[t->offset + best] = 0; /* next pick: the next largest */
            checked++;
        }
    }
    assert_true(checked >= 21);
    print_message("# %d entries checked\n", checked);
    model_free(&m);
    config_free(&cfg);
}

/* Loss and gradients of documents run as the given micro-batches (lists of document indices). */
static double run_packing(Model *m, const int *lens, const int *const *mbs, int n_mbs, float *grads_out)
{
    Error err = {0};
    m->ops->zero(m->grads, m->n_params);
    double total = 0;
    int64_t targets = 0;
    for (int i = 0; i < 6; i++)
        targets += lens[i] - 1;
    for (int k = 0; k < n_mbs; k++) {
        /* Documents keep their tokens (seeded by their index) whichever micro-batch they are in. */
        TestBatch tb;
        int64_t at = 0;
        int n = 0;
        for (const int *d = mbs[k]; *d >= 0; d++, n++) {
            TestBatch one;
            make_batch(&one, &lens[*d], 1, 100 + (uint64_t)*d);
            memcpy(tb.tokens + at, one.tokens, (size_t)lens[*d] * 4);
            memcpy(tb.targets + at, one.targets, (size_t)lens[*d] * 4);
            memcpy(tb.positions + at, one.positions, (size_t)lens[*d] * 4);
            tb.segs[n] = (AttnSegment){at, lens[*d], at, lens[*d], 0};
            at += lens[*d];
        }
        tb.b = (ModelBatch){.T = at, .tokens = tb.tokens, .targets = tb.targets, .positions = tb.positions, .segs = tb.segs, .n_segs = n};
        double sum;
        assert_int_equal(model_forward(m, 0, &tb.b, NULL, 1, 1.0f / (float)targets, &sum, &err), 0);
        assert_int_equal(model_backward(m, 0, &tb.b, NULL, &err), 0);
        total += sum;
    }
    memcpy(grads_out, m->grads, (size_t)m->n_params * sizeof *grads_out);
    return total / (double)targets;
}

static void assert_close(const Model *m, const float *a, const float *b)
{
    for (int i = 0; i < m->n_tensors; i++) {
        const ModelTensor *t = &m->tensors[i];
        double diff = 0, norm = 0;
        for (int64_t j = 0; j < t->rows * t->cols; j++) {
            diff += pow(a[t->offset + j] - b[t->offset + j], 2);
            norm += pow(a[t->offset + j], 2);
        }
        if (sqrt(diff) > 1e-5 * sqrt(norm)) {
            print_error("%s: gradients differ by %g relative\n", t->name, sqrt(diff / norm));
            fail();
        }
    }
}

static void test_packing_invariance(void **state)
{
    (void)state;
    Config cfg;
    Model m;
    new_model(&m, &cfg);
    int lens[] = {17, 5, 30, 2, 11, 23};
    /* One micro-batch; two; three in another order; every document alone in reverse order. */
    int all[] = {0, 1, 2, 3, 4, 5, -1}, a1[] = {2, 0, -1}, a2[] = {5, 1, 4, 3, -1};
    int b1[] = {4, -1}, b2[] = {3, 2, 1, -1}, b3[] = {0, 5, -1};
    int s0[] = {5, -1}, s1[] = {4, -1}, s2[] = {3, -1}, s3[] = {2, -1}, s4[] = {1, -1}, s5[] = {0, -1};
    const int *p1[] = {all}, *p2[] = {a1, a2}, *p3[] = {b1, b2, b3}, *p4[] = {s0, s1, s2, s3, s4, s5};
    float *g1 = malloc((size_t)m.n_params * sizeof *g1), *g2 = malloc((size_t)m.n_params * sizeof *g2);
    double l1 = run_packing(&m, lens, p1, 1, g1);
    const int *const *others[] = {p2, p3, p4};
    int counts[] = {2, 3, 6};
    for (int k = 0; k < 3; k++) {
        double l = run_packing(&m, lens, others[k], counts[k], g2);
        assert_true(fabs(l - l1) <= 1e-6 * fabs(l1));
        assert_close(&m, g1, g2);
    }
    free(g1);
    free(g2);
    model_free(&m);
    config_free(&cfg);
}

/* The three packers on a stream of equal documents (no packer has to split one): one step of each
 * trains the same documents, packed in different micro-batches and orders. */
static void test_packers_give_the_same_step(void **state)
{
    (void)state;
    char *dir = test_tmpdir(), *prefix = test_format("%s/set", dir);
    DataIdxWriter w;
    Error err = {0};
    Rng rng;
    rng_seed(&rng, 9);
    assert_int_equal(data_idx_writer_open(&w, prefix, DATA_DTYPE_UINT16, &err), 0);
    for (int d = 0; d < 64; d++) {
        int32_t tok[8];
        for (int i = 0; i < 8; i++)
            tok[i] = (int32_t)rng_below(&rng, 61);
        assert_int_equal(data_idx_writer_add(&w, tok, 8, &err), 0);
    }
    assert_int_equal(data_idx_writer_finish(&w, &err), 0);
    char *yaml = test_format("model: %s\nparallel: {dp: 1}\ntrain: {device: cpu}\n"
                             "data: {path: %s, context_window: 32, global_batch_tokens: 128}\n"
                             "balance: {outlier_thresholds: [], hardware: cpu}\n",
                             tiny_model, prefix);
    Config cfg;
    load_config(&cfg, yaml);
    DataSources data;
    assert_int_equal(data_sources_open(&data, cfg.data.path.v, NULL, 1, NULL, NULL, &err), 0);
    CostModel cost;
    assert_int_equal(cost_model_init(&cost, &cfg, &err), 0);
    Model m;
    assert_int_equal(model_init(&m, &cfg.model, cpu_ops(), NULL, RECOMPUTE_NONE, &err), 0);
    assert_int_equal(model_init_weights(&m, 4, &err), 0);
    float *ref = malloc((size_t)m.n_params * sizeof *ref);
    double ref_loss = 0;
    const PackerKind packers[] = {PACKER_FIXED, PACKER_FIXED_GREEDY, PACKER_WLB};
    uint64_t layouts[3];
    for (int k = 0; k < 3; k++) {
        DataStream s;
        Planner pl;
        StepPlan p = {0};
        BatchBuffers bb = {.ops = cpu_ops()};
        assert_int_equal(data_stream_init(&s, data.src, NULL, 1, 1, 32, &err), 0);
        assert_int_equal(plan_init(&pl, &cfg, &cost, &s, packers[k], CP_PER_SEQ, &err), 0);
        assert_int_equal(plan_step(&pl, &p, &err), 0);
        assert_int_equal(p.tokens, 128);
        m.ops->zero(m.grads, m.n_params);
        int64_t n_targets = batch_step_targets(&p, &data);
        double sum = 0;
        uint64_t layout = 0;
        for (int64_t i = 0; i < (int64_t)p.dp * p.m; i++) {
            ModelBatch b;
            double mb;
            assert_int_equal(batch_build(&bb, &p, i, 0, &data, 61, &b, &err), 0);
            assert_int_equal(model_forward(&m, 0, &b, NULL, 1, 1.0f / (float)n_targets, &mb, &err), 0);
            assert_int_equal(model_backward(&m, 0, &b, NULL, &err), 0);
            sum += mb;
            for (int64_t d = 0; d < p.mbs[i].n_docs; d++)
                layout = layout * 31 + p.docs[p.mbs[i].first_doc + d].doc + 1;
        }
        layouts[k] = layout;
        if (k == 0) {
            ref_loss = sum / (double)n_targets;
            memcpy(ref, m.grads, (size_t)m.n_params * sizeof *ref);
        } else {
            assert_true(fabs(sum / (double)n_targets - ref_loss) <= 1e-6 * ref_loss);
            assert_close(&m, ref, m.grads);
        }
        batch_free(&bb);
        plan_free(&p);
        plan_destroy(&pl);
        data_stream_free(&s);
    }
    /* The packers did pack differently. */
    assert_true(layouts[0] != layouts[1] || layouts[0] != layouts[2]);
    free(ref);
    model_free(&m);
    data_sources_close(&data);
    config_free(&cfg);
    free(yaml);
    free(prefix);
    test_rm_rf(dir);
    free(dir);
}

static void test_weights_save_and_load(void **state)
{
    (void)state;
    Config cfg;
    Model a, b;
    new_model(&a, &cfg);
    Error err = {0};
    assert_int_equal(model_init(&b, &cfg.model, cpu_ops(), NULL, RECOMPUTE_NONE, &err), 0);
    char *dir = test_tmpdir(), *path = test_format("%s/w.safetensors", dir);
    StWriter w = {0};
    for (int i = 0; i < a.n_tensors; i++) {
        const ModelTensor *t = &a.tensors[i];
        int64_t shape[2] = {t->rows, t->cols};
        int vec = t->rows == 1;
        /* Half of them in bf16 would lose bits; F32 round-trips exactly. */
        assert_int_equal(st_writer_add(&w, t->name, ST_F32, vec ? shape + 1 : shape, vec ? 1 : 2, a.params + t->offset, &err),
                         0);
    }
    assert_int_equal(st_write(&w, path, &err), 0);
    st_writer_free(&w);
    assert_int_equal(model_load(&b, path, &err), 0);
    assert_memory_equal(a.params, b.params, (size_t)a.n_params * sizeof(float));

    /* A file without one tensor, and one with a wrong shape: one error each, naming it. */
    for (int k = 0; k < 2; k++) {
        StWriter bad = {0};
        for (int i = 0; i < a.n_tensors; i++) {
            const ModelTensor *t = &a.tensors[i];
            if (k == 0 && i == 3)
                continue;
            int64_t shape[2] = {t->rows, t->cols};
            if (k == 1 && i == 3)
                shape[0] -= 1;
            int vec = t->rows == 1;
            assert_int_equal(st_writer_add(&bad, t->name, ST_F32, vec ? shape + 1 : shape, vec ? 1 : 2,
                                           a.params + t->offset, &err), 0);
        }
        assert_int_equal(st_write(&bad, path, &err), 0);
        st_writer_free(&bad);
        assert_int_equal(model_load(&b, path, &err), -1);
        assert_int_equal(err.status, 2);
        assert_non_null(strstr(err.msg, a.tensors[3].name));
        assert_non_null(strstr(err.msg, k == 0 ? "no tensor" : "has shape"));
    }
    model_free(&a);
    model_free(&b);
    config_free(&cfg);
    free(path);
    test_rm_rf(dir);
    free(dir);
}

/* A llama2.c file whose shape is not the config's: one error naming both. */
static void test_llama2c_shape_mismatch(void **state)
{
    (void)state;
    /* First, before anything is allocated: skip() leaves by longjmp (testlib.h). */
    SKIP_WITHOUT_REAL_DATA(stories, "models/stories260K.bin");
    Config cfg;
    Model m;
    new_model(&m, &cfg);
    Error err = {0};
    assert_int_equal(model_load(&m, stories, &err), -1);
    assert_int_equal(err.status, 2);
    assert_non_null(strstr(err.msg, "a llama2.c model with model.d_model 64, the config has 32"));
    model_free(&m);
    config_free(&cfg);
}

static void test_adamw_and_schedule(void **state)
{
    (void)state;
    Config cfg;
    load_config(&cfg, "model: {preset: tiny}\nparallel: {dp: 1}\n"
                      "train: {device: cpu, lr: 0.01, min_lr: 0.001, warmup_steps: 10, steps: 110, "
                      "weight_decay: 0.1, grad_clip: 0}\n");
    const ConfigTrain *t = &cfg.train;
    assert_true(fabs(optim_lr(t, 1) - 0.001) < 1e-12);
    assert_true(fabs(optim_lr(t, 10) - 0.01) < 1e-12);
    assert_true(fabs(optim_lr(t, 60) - (0.001 + 0.009 * 0.5)) < 1e-12); /* half-way down the cosine */
    assert_true(fabs(optim_lr(t, 110) - 0.001) < 1e-12);
    /* AdamW on a model's first tensor against the formula in double, 3 steps. */
    Model m;
    Error err = {0};
    assert_int_equal(model_init(&m, &cfg.model, cpu_ops(), NULL, RECOMPUTE_NONE, &err), 0);
    assert_int_equal(model_init_weights(&m, 1, &err), 0);
    Optim o;
    assert_int_equal(optim_init(&o, t, &m, 0, m.n_params, &err), 0);
    const ModelTensor *wq = model_tensor(&m, T_WQ, 0), *emb = model_tensor(&m, T_EMBED, -1);
    double p = m.params[wq->offset], pe = m.params[emb->offset], mm = 0, vv = 0, me = 0, ve = 0;
    for (int step = 1; step <= 3; step++) {
        for (int64_t i = 0; i < m.n_params; i++)
            m.grads[i] = 0.5f - 0.25f * step;
        double g = 0.5 - 0.25 * step;
        double lr = optim_update(&o, &m, m.grads, sqrt(optim_grad_sumsq(&o, &m, m.grads)), 1);
        double want_lr = optim_lr(t, step);
        assert_true(fabs(lr - want_lr) < 1e-12);
        mm = 0.9 * mm + 0.1 * g;
        vv = 0.95 * vv + 0.05 * g * g;
        p -= want_lr * 0.1 * p; /* q_proj decays */
        p -= want_lr * (mm / (1 - pow(0.9, step))) / (sqrt(vv / (1 - pow(0.95, step))) + 1e-8);
        me = mm, ve = vv;
        pe -= want_lr * (me / (1 - pow(0.9, step))) / (sqrt(ve / (1 - pow(0.95, step))) + 1e-8); /* no decay */
    }
    assert_true(fabs(m.params[wq->offset] - p) < 1e-6);
    assert_true(fabs(m.params[emb->offset] - pe) < 1e-6);
    optim_free(&o, &m);
    model_free(&m);
    config_free(&cfg);
}


/* Global gradient-norm clipping: a step whose gradient norm exceeds grad_clip scales every gradient
 * by exactly grad_clip / norm before AdamW, so after one step AdamW's first moments are clip / norm
 * times those of the same step unclipped, the second moments (clip / norm)^2 times, and the
 * parameters are those of an unclipped step on the scaled gradients; a step under the threshold is
 * not touched (bit for bit the unclipped step). */
static void test_gradient_clipping(void **state)
{
    (void)state;
    const char *base = "model: {preset: tiny}\nparallel: {dp: 1}\n"
                       "train: {device: cpu, lr: 0.01, warmup_steps: 0, weight_decay: 0.1, grad_clip: %s}\n";
    Config clipped, unclipped;
    char *a = test_format(base, "0.5"), *b = test_format(base, "0");
    load_config(&clipped, a);
    load_config(&unclipped, b);
    free(a);
    free(b);
    enum { RUNS = 4 };
    Model m[RUNS];
    Optim o[RUNS];
    Error err = {0};
    for (int k = 0; k < RUNS; k++) {
        assert_int_equal(model_init(&m[k], &clipped.model, cpu_ops(), NULL, RECOMPUTE_NONE, &err), 0);
        assert_int_equal(model_init_weights(&m[k], 5, &err), 0);
        assert_int_equal(optim_init(&o[k], k % 2 ? &unclipped.train : &clipped.train, &m[k], 0, m[k].n_params, &err), 0);
    }
    int64_t n = m[0].n_params;
    /* Seeded gradients of norm about 5, ten times the clip of 0.5. */
    Rng rng;
    rng_seed(&rng, 8);
    for (int64_t i = 0; i < n; i++)
        m[0].grads[i] = (float)((int64_t)rng_below(&rng, 2001) - 1000) * 1e-5f;
    double norm = sqrt(optim_grad_sumsq(&o[0], &m[0], m[0].grads)), s = 0.5 / norm;
    printf("# gradient norm %.4f, clip 0.5: scale %.6f\n", norm, s);
    assert_true(norm > 5);
    /* 0: clipped; 1: unclipped; 3: unclipped on the gradients scaled here by clip / norm. */
    for (int64_t i = 0; i < n; i++) {
        m[1].grads[i] = m[0].grads[i];
        m[3].grads[i] = (float)((double)m[0].grads[i] * s);
    }
    optim_update(&o[0], &m[0], m[0].grads, norm, 1);
    optim_update(&o[1], &m[1], m[1].grads, norm, 1);
    optim_update(&o[3], &m[3], m[3].grads, sqrt(optim_grad_sumsq(&o[3], &m[3], m[3].grads)), 1);
    double worst_m = 0, worst_v = 0, worst_p = 0;
    for (int64_t i = 0; i < n; i++) {
        if (o[1].m[i] != 0)
            worst_m = fmax(worst_m, fabs(o[0].m[i] / o[1].m[i] - s) / s);
        if (o[1].v[i] != 0)
            worst_v = fmax(worst_v, fabs(o[0].v[i] / o[1].v[i] - s * s) / (s * s));
        worst_p = fmax(worst_p, fabs(m[0].params[i] - m[3].params[i]));
    }
    printf("# moments against the unclipped step: m off clip / norm by %.2e, v off its square by %.2e; "
           "parameters against the step on scaled gradients: %.2e\n", worst_m, worst_v, worst_p);
    assert_true(worst_m <= 1e-5 && worst_v <= 1e-5 && worst_p <= 1e-6);
    /* Under the threshold: 2 has a clip (0.5) above its norm, 1 has none; they must stay equal. */
    for (int64_t i = 0; i < n; i++) {
        m[2].grads[i] = m[1].grads[i] = (float)((int64_t)rng_below(&rng, 2001) - 1000) * 1e-8f;
        m[2].params[i] = m[1].params[i];
    }
    memcpy(o[2].m, o[1].m, (size_t)n * sizeof *o[2].m);
    memcpy(o[2].v, o[1].v, (size_t)n * sizeof *o[2].v);
    o[2].step = o[1].step;
    double small = sqrt(optim_grad_sumsq(&o[1], &m[1], m[1].grads));
    assert_true(small < 0.5);
    optim_update(&o[1], &m[1], m[1].grads, small, 1);
    optim_update(&o[2], &m[2], m[2].grads, small, 1);
    assert_memory_equal(m[1].params, m[2].params, (size_t)n * sizeof(float));
    assert_memory_equal(o[1].m, o[2].m, (size_t)n * sizeof(float));
    for (int k = 0; k < RUNS; k++) {
        optim_free(&o[k], &m[k]);
        model_free(&m[k]);
    }
    config_free(&clipped);
    config_free(&unclipped);
}

/* The backend out of memory: the error names the model's parameter count (model_free cleared it
 * before the message was made, issue 50: "out of memory for 0 parameters"). */
static void *alloc_nothing(size_t bytes)
{
    (void)bytes;
    return NULL;
}

static void test_out_of_memory_names_the_count(void **state)
{
    (void)state;
    Config cfg;
    char *yaml = test_format("model: %s\nparallel: {dp: 1}\ntrain: {device: cpu}\n", tiny_model);
    load_config(&cfg, yaml);
    free(yaml);
    Ops failing = *cpu_ops();
    failing.alloc = alloc_nothing;
    Model m, ok;
    Error err = {0};
    assert_int_equal(model_init(&ok, &cfg.model, cpu_ops(), NULL, RECOMPUTE_NONE, &err), 0);
    assert_int_equal(model_init(&m, &cfg.model, &failing, NULL, RECOMPUTE_NONE, &err), -1);
    char want[96];
    snprintf(want, sizeof want, "model: out of memory for %lld parameters", (long long)ok.n_params);
    assert_true(ok.n_params > 0);
    assert_string_equal(err.msg, want);
    model_free(&ok);
    config_free(&cfg);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_finite_differences),
        cmocka_unit_test(test_out_of_memory_names_the_count),
        cmocka_unit_test(test_packing_invariance),
        cmocka_unit_test(test_packers_give_the_same_step),
        cmocka_unit_test(test_weights_save_and_load),
        cmocka_unit_test(test_llama2c_shape_mismatch),
        cmocka_unit_test(test_adamw_and_schedule),
        cmocka_unit_test(test_gradient_clipping),
    };
    return cmocka_run_group_tests_name("model", tests, NULL, NULL);
}
