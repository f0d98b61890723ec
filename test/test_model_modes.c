/*
 * test/test_model_modes.c - the model under its modes, on the CPU backend:
 *   train.recompute: selective and full recompute what they do not keep with the same ops, so the
 *     loss and every gradient are the same bits as with none (fp32 and bf16);
 *   train.precision: bf16 (the emulated GPU roundings) gives the fp32 loss within 1e-2 and the
 *     gradients within 5e-2, and its weights' compute copy is the rounded master weights;
 *   model_memory: exactly the bytes model_reserve allocates, per slot and for the scratch, in every
 *     mode, with and without sequence parallelism, and less memory for more recomputation;
 *   out of memory: one error that says how much was needed, how much is free, and what the other
 *     recompute modes would need;
 *   the output head's blocks (model_head_tiles): rows of whole vocabulary slices, and rows over tiles
 *     of the vocabulary whose logits the backward recomputes, give the loss and every gradient of one
 *     block of all rows (the unfused loss) to float rounding, fp32 and bf16.
 */
#include "test/testlib.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config/config.h"
#include "cpu/cpu_ops.h"
#include "engine/model/model.h"
#include "util/bf16.h"
#include "util/rng.h"

static const char tiny_model[] = "{n_layers: 3, d_model: 32, n_heads: 4, n_kv_heads: 2, d_ffn: 48, vocab_size: 61, "
                                 "rope_theta: 10000, norm_eps: 1.0e-5, tie_embeddings: false, max_seq_len: 256}";

static void new_model_par(Model *m, Config *cfg, const Ops *ops, Recompute r, const ModelParallel *par)
{
    char *yaml = test_format("model: %s\nparallel: {dp: 1}\ntrain: {device: cpu}\n", tiny_model);
    Error err = {0};
    config_init(cfg);
    if (config_load_string(cfg, yaml, "t.yaml", &err) != 0 || config_resolve(cfg, 0, &err) != 0)
        fail_msg("%s", err.msg);
    free(yaml);
    assert_int_equal(model_init(m, &cfg->model, ops, par, r, &err), 0);
    assert_int_equal(model_init_weights(m, 11, &err), 0);
}

static void new_model(Model *m, Config *cfg, const Ops *ops, Recompute r) { new_model_par(m, cfg, ops, r, NULL); }

/* Documents of the given lengths, back to back, seeded random tokens. */
typedef struct TestBatch {
    int32_t tokens[1024], targets[1024], positions[1024];
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
    tb->b = (ModelBatch){.T = at, .tokens = tb->tokens, .targets = tb->targets, .positions = tb->positions,
                         .segs = tb->segs, .n_segs = n};
}

/* Loss and gradients of one forward and backward (grads zeroed first); the gradients are copied
 * out (malloc'd). */
static float *loss_and_grads(Model *m, const ModelBatch *b, double *loss)
{
    Error err = {0};
    m->ops->zero(m->grads, m->n_params);
    assert_int_equal(model_forward(m, 0, b, NULL, 1, 0.01f, loss, &err), 0);
    assert_int_equal(model_backward(m, 0, b, NULL, &err), 0);
    float *g = malloc((size_t)m->n_params * sizeof *g);
    memcpy(g, m->grads, (size_t)m->n_params * sizeof *g);
    return g;
}

static void check_recompute_same_bits(const Ops *ops)
{
    int lens[] = {9, 40, 3, 20, 1, 33};
    TestBatch tb;
    make_batch(&tb, lens, 6, 3);
    double loss[3];
    float *g[3];
    for (int r = 0; r < 3; r++) {
        Config cfg;
        Model m;
        new_model(&m, &cfg, ops, (Recompute)r);
        /* two micro-batches through the same slot: the recomputation must not leave state behind */
        free(loss_and_grads(&m, &tb.b, &loss[r]));
        free(loss_and_grads(&m, &tb.b, &loss[r]));
        g[r] = loss_and_grads(&m, &tb.b, &loss[r]);
        if (r > 0) {
            assert_true(loss[r] == loss[0]);
            assert_memory_equal(g[r], g[0], (size_t)m.n_params * sizeof(float));
        }
        model_free(&m);
        config_free(&cfg);
    }
    printf("# %s: loss %.9f and %d gradients the same bits under none, selective and full\n", ops->name, loss[0],
           (int)(sizeof lens / sizeof lens[0]));
    for (int r = 0; r < 3; r++)
        free(g[r]);
}

static void test_recompute_gives_the_same_bits(void **state)
{
    (void)state;
    check_recompute_same_bits(cpu_ops());
    check_recompute_same_bits(cpu_ops_bf16());
}

static void test_bf16_close_to_fp32(void **state)
{
    (void)state;
    int lens[] = {9, 40, 3, 20, 1, 33};
    TestBatch tb;
    make_batch(&tb, lens, 6, 5);
    Config c32, c16;
    Model m32, m16;
    new_model(&m32, &c32, cpu_ops(), RECOMPUTE_NONE);
    new_model(&m16, &c16, cpu_ops_bf16(), RECOMPUTE_NONE);
    /* the compute copy of the weights is the master weights rounded to nearest even */
    const uint16_t *w16 = (const uint16_t *)m16.wact;
    for (int64_t i = 0; i < m16.n_params; i++)
        assert_true(w16[i] == bf16_from_float(m16.params[i]));
    assert_true((const float *)m32.wact == m32.params);
    double l32, l16;
    float *g32 = loss_and_grads(&m32, &tb.b, &l32), *g16 = loss_and_grads(&m16, &tb.b, &l16);
    printf("# loss fp32 %.6f, bf16 %.6f (rel %.2e)\n", l32, l16, fabs(l16 - l32) / l32);
    assert_true(fabs(l16 - l32) <= 1e-2 * l32);
    double worst = 0;
    for (int i = 0; i < m32.n_tensors; i++) {
        const ModelTensor *t = &m32.tensors[i];
        double num = 0, den = 0;
        for (int64_t k = t->offset; k < t->offset + t->rows * t->cols; k++) {
            num += ((double)g16[k] - g32[k]) * ((double)g16[k] - g32[k]);
            den += (double)g32[k] * g32[k];
        }
        double e = sqrt(num / (den > 0 ? den : 1));
        if (e > worst)
            worst = e;
    }
    printf("# gradients: worst tensor's relative error %.2e\n", worst);
    assert_true(worst <= 5e-2);
    free(g32);
    free(g16);
    model_free(&m32);
    model_free(&m16);
    config_free(&c32);
    config_free(&c16);
}

/* The largest relative error of a tensor's gradient, a against the reference r. */
static double worst_tensor_error(const Model *m, const float *a, const float *r, const char **name)
{
    double worst = 0;
    for (int i = 0; i < m->n_tensors; i++) {
        const ModelTensor *t = &m->tensors[i];
        double num = 0, den = 0;
        for (int64_t k = t->offset; k < t->offset + t->rows * t->cols; k++) {
            num += ((double)a[k] - r[k]) * ((double)a[k] - r[k]);
            den += (double)r[k] * r[k];
        }
        double e = sqrt(num / (den > 0 ? den : 1));
        if (e > worst) {
            worst = e;
            *name = t->name;
        }
    }
    return worst;
}

/* The head's cuts of a 700-row micro-batch (vocabulary 61) against one block of all rows and the whole
 * vocabulary (the unfused loss): two blocks of whole slices (512 + 188 rows), blocks of 512 rows over
 * tiles of 20, 20, 20 and 1 columns (recomputed in the backward), and 100 blocks of 7 rows over tiles
 * of one column. The loss: the tiles' logits come from products of other widths, which may round
 * a logit's last bit differently (a product's summation order depends on its shape), and the
 * exponentials are summed in another order: within 1e-9 relative (a last bit of a logit of size 10
 * is 1e-6; the loss sums 695 rows of about 4). The gradients sum the rows' and tiles' parts in another order in float32 (dW over row blocks, the
 * input gradient over tiles): within 1e-5 relative in fp32 (measured: 4e-7); in bf16 the other
 * order's last bits could move a rounding of the compute dtype (2^-9) where a value sits at a
 * rounding's edge: within 1e-4 (measured: 3e-7), well below one bf16 rounding of a whole tensor. */
static void check_head_tiles(const Ops *ops, double tol)
{
    int lens[] = {200, 150, 1, 99, 250};
    TestBatch tb;
    make_batch(&tb, lens, 5, 17);
    assert_int_equal(tb.b.T, 700);
    const int64_t floats[] = {61 * 700, 61 * 512, 512 * 20, 7};
    const HeadTiles want[] = {{700, 61}, {512, 61}, {512, 20}, {7, 1}};
    double loss[4];
    float *g[4];
    for (int i = 0; i < 4; i++) {
        Config cfg;
        Model m;
        Error err = {0};
        new_model(&m, &cfg, ops, RECOMPUTE_NONE);
        m.logits_floats = floats[i];
        HeadTiles t = model_head_tiles(&m.dims, m.logits_floats, tb.b.T);
        assert_true(t.rows == want[i].rows && t.cols == want[i].cols);
        assert_int_equal(model_reserve(&m, 0, tb.b.T, 0, &err), 0);
        g[i] = loss_and_grads(&m, &tb.b, &loss[i]);
        if (i > 0) {
            const char *name = "";
            double e = worst_tensor_error(&m, g[i], g[0], &name);
            double le = fabs(loss[i] - loss[0]) / loss[0];
            printf("# %s: head blocks of %lld rows x %lld columns: loss %.12f (rel %.1e), worst gradient %s rel "
                   "%.1e\n", ops->name, (long long)t.rows, (long long)t.cols, loss[i], le, name, e);
            assert_true(le <= 1e-9);
            assert_true(e <= tol);
        }
        model_free(&m);
        config_free(&cfg);
    }
    printf("# %s: one block of 700 rows x 61 columns (unfused): loss %.12f\n", ops->name, loss[0]);
    for (int i = 0; i < 4; i++)
        free(g[i]);
}

static void test_head_tiles_equal_the_unfused_loss(void **state)
{
    (void)state;
    check_head_tiles(cpu_ops(), 1e-5);
    check_head_tiles(cpu_ops_bf16(), 1e-4);
    /* Llama 3's vocabulary: the GPU's block is whole slices of 523 rows (2093 at the 2^28 before); a
     * 32K-row micro-batch with a block of 2^24 floats goes over tiles of 32768 columns (4 tiles). */
    ModelDims d = {.local_vocab = 128256, .has_head = 1};
    HeadTiles t = model_head_tiles(&d, OPS_LOGITS_FLOATS_GPU, 32768);
    assert_true(t.rows == 523 && t.cols == 128256);
    t = model_head_tiles(&d, 1 << 28, 32768);
    assert_true(t.rows == 2092 && t.cols == 128256);
    t = model_head_tiles(&d, 1 << 24, 32768);
    assert_true(t.rows == 512 && t.cols == 32768);
    t = model_head_tiles(&d, OPS_LOGITS_FLOATS_GPU, 100); /* a micro-batch smaller than a block */
    assert_true(t.rows == 100 && t.cols == 128256);
}

/* ---------------------------------------------------------------------------------------------- */
/* An Ops whose memory is counted, and may run out                                                 */

static Ops counting;
static int64_t live_bytes, limit_bytes = -1;

typedef struct Header {
    size_t bytes;
    double align;
} Header;

static void *count_alloc(size_t bytes)
{
    if (limit_bytes >= 0 && live_bytes + (int64_t)bytes > limit_bytes)
        return NULL;
    Header *h = calloc(1, sizeof *h + (bytes ? bytes : 1));
    if (!h)
        return NULL;
    h->bytes = bytes;
    live_bytes += (int64_t)bytes;
    return h + 1;
}

static void count_free(void *p)
{
    if (!p)
        return;
    Header *h = (Header *)p - 1;
    live_bytes -= (int64_t)h->bytes;
    free(h);
}

static void count_memory(size_t *free_bytes, size_t *total_bytes)
{
    *total_bytes = (size_t)(limit_bytes >= 0 ? limit_bytes : 1 << 30);
    *free_bytes = *total_bytes - (size_t)live_bytes;
}

static const Ops *counting_ops(const Ops *base)
{
    counting = *base;
    counting.alloc = count_alloc;
    counting.free = count_free;
    counting.memory = count_memory;
    counting.logits_floats = 61 * 64; /* blocks of 64 rows */
    return &counting;
}

static void test_memory_is_what_is_allocated(void **state)
{
    (void)state;
    const Ops *bases[2] = {cpu_ops(), cpu_ops_bf16()};
    /* One process, and the middle chunk of three of TP rank 1 of 2 with sequence parallelism (its
     * stream on 101 of 201 rows, one padding row). */
    const ModelParallel sp = {2, 1, 1, 1, 3, 1, 2, NULL, 1};
    for (int b = 0; b < 2; b++)
        for (int r = 0; r < 6; r++) {
            Config cfg;
            Model m;
            limit_bytes = -1;
            new_model_par(&m, &cfg, counting_ops(bases[b]), (Recompute)(r % 3), r < 3 ? NULL : &sp);
            Error err = {0};
            int64_t T = r < 3 ? 200 : 201;
            assert_int_equal(model_set_slots(&m, 3, &err), 0);
            int64_t before = live_bytes;
            assert_int_equal(model_reserve(&m, 0, T, 0, &err), 0);
            ModelMemory mem = model_memory(&m.dims, T, 0, (Recompute)(r % 3), m.ops->act_bytes, m.ops->logits_floats);
            assert_int_equal(live_bytes - before, mem.slot_bytes + mem.scratch_bytes);
            int64_t one = live_bytes;
            assert_int_equal(model_reserve(&m, 1, T, 0, &err), 0);
            assert_int_equal(live_bytes - one, mem.slot_bytes); /* the scratch is shared */
            printf("# %s, recompute %d%s: %lld bytes per slot, %lld of scratch at %lld rows\n", bases[b]->name, r % 3,
                   r < 3 ? "" : ", sequence parallel", (long long)mem.slot_bytes, (long long)mem.scratch_bytes,
                   (long long)T);
            if (r == 5) /* full: the layer's input and the chunk's, and the input gradient, on 101 rows */
                assert_int_equal(mem.slot_bytes, 3 * 101 * 32 * 4);
            model_free(&m);
            config_free(&cfg);
            assert_int_equal(live_bytes, 0);
        }
    /* more recomputation keeps less per slot (the 8B layer shape at 32K tokens) */
    ModelDims d = {.n_layers = 4, .d = 4096, .n_heads = 32, .n_kv_heads = 8, .head_dim = 128, .d_ffn = 14336,
                   .vocab = 128256, .layer_begin = 0, .layer_end = 4, .has_embed = 1, .has_head = 1, .tp = 1, .cp = 1,
                   .local_heads = 32, .local_kv_heads = 8, .local_ffn = 14336, .kv_replicas = 1, .local_vocab = 128256};
    ModelMemory none = model_memory(&d, 32768, 0, RECOMPUTE_NONE, 2, 1 << 28);
    ModelMemory sel = model_memory(&d, 32768, 0, RECOMPUTE_SELECTIVE, 2, 1 << 28);
    ModelMemory full = model_memory(&d, 32768, 0, RECOMPUTE_FULL, 2, 1 << 28);
    printf("# 8B layers x 4 at 32K tokens, bf16: kept per micro-batch %.1f / %.1f / %.1f GiB (none / selective / "
           "full)\n", none.slot_bytes / 1073741824.0, sel.slot_bytes / 1073741824.0, full.slot_bytes / 1073741824.0);
    assert_true(none.slot_bytes > sel.slot_bytes && sel.slot_bytes > full.slot_bytes);
    /* full keeps the 5 residual buffers [T, d] float32 and the final norm's output, rstd and gradient */
    assert_int_equal(full.slot_bytes, 5 * 32768LL * 4096 * 4 + 32768LL * 4096 * (2 + 4) + 32768LL * 4);
    /* With TP 8 and sequence parallelism all of them on R = ceil(T / 8) rows (T = 32769: R = 4097). */
    d.tp = 8;
    d.sp = 1;
    d.local_heads = 4;
    d.local_kv_heads = 1;
    d.local_ffn = 14336 / 8;
    d.local_vocab = 128256 / 8;
    full = model_memory(&d, 32769, 0, RECOMPUTE_FULL, 2, 1 << 28);
    assert_int_equal(full.slot_bytes, 5 * 4097LL * 4096 * 4 + 4097LL * 4096 * (2 + 4) + 4097LL * 4);
}

static void test_out_of_memory_says_what_would_fit(void **state)
{
    (void)state;
    Config cfg;
    Model m;
    limit_bytes = -1;
    new_model(&m, &cfg, counting_ops(cpu_ops()), RECOMPUTE_NONE);
    Error err = {0};
    limit_bytes = live_bytes + 100000; /* room for some activations, not for 200 rows */
    assert_int_equal(model_reserve(&m, 0, 200, 0, &err), -1);
    printf("# %s\n", err.msg);
    assert_int_equal(err.status, ERROR_RUNTIME);
    const char *want[] = {"model: out of memory for the activations of 200 tokens: they need ",
                          "the device has 0.1 MiB free of ", "train.recompute: selective would need",
                          "train.recompute: full would need", "balance.max_tokens_per_micro_batch"};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        if (!strstr(err.msg, want[i]))
            fail_msg("no '%s' in: %s", want[i], err.msg);
    /* nothing of the failed reservation stays allocated, and a smaller one still works */
    assert_int_equal(model_reserve(&m, 0, 8, 0, &err), 0);
    limit_bytes = -1;
    model_free(&m);
    config_free(&cfg);
    assert_int_equal(live_bytes, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_recompute_gives_the_same_bits),
        cmocka_unit_test(test_bf16_close_to_fp32),
        cmocka_unit_test(test_head_tiles_equal_the_unfused_loss),
        cmocka_unit_test(test_memory_is_what_is_allocated),
        cmocka_unit_test(test_out_of_memory_says_what_would_fit),
    };
    return cmocka_run_group_tests_name("model_modes", tests, NULL, NULL);
}
