/*
 * test/test_train_plan.c - the trainer runs the plans it is given, whatever their shape: the same
 * documents packed into micro-batches with and without empty ones (an empty one first in the
 * pipeline, on a fresh activation slot), or all in one, give the same loss and gradients; a plan of
 * empty micro-batches only trains nothing; a plan that leaves a pipeline place without a
 * micro-batch stops with one error. And the inputs it builds for pieces of documents (positions
 * from the piece's offset, targets across the piece's end) against the data set. The plans are made here by hand (trainer_run_plan), not by the
 * planner: the engine must not rely on the packer's habits (a packer that left micro-batches empty
 * on the first step crashed it).
 */
#include "test/testlib.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "config/config.h"
#include "engine/plan/plan_shard.h"
#include "engine/train/train.h"
#include "engine/train/train_stages.h"

enum { N_MB = 4, MAX_DOCS = 8 };

typedef struct Fixture {
    char *dir;
    Config cfg;
    Comm comm;
    Trainer tr;
} Fixture;

static Fixture fx;

static int group_setup(void **state)
{
    (void)state;
    setenv("OMP_NUM_THREADS", "1", 1);
    fx.dir = test_tmpdir();
    char *prefix = test_write_docs(fx.dir, "docs", 4, 200, 0, 64);
    char *yaml = test_format(
        "model: {n_layers: 2, d_model: 32, n_heads: 4, n_kv_heads: 2, d_ffn: 64, vocab_size: 64, rope_theta: 10000,"
        " norm_eps: 1.0e-5, tie_embeddings: false, max_seq_len: 256}\n"
        "parallel: {tp: 1, cp: 1, pp: 1, dp: 1}\n"
        "data: {path: %s, context_window: 64, global_batch_tokens: 256}\n"
        "balance: {hardware: cpu}\n"
        "train: {device: cpu, steps: 2}\n",
        prefix);
    Error err = {0};
    config_init(&fx.cfg);
    int rc = config_load_string(&fx.cfg, yaml, "t.yaml", &err) != 0 || config_resolve(&fx.cfg, 1, &err) != 0 ||
             trainer_stage_layers(&fx.cfg, NULL, NULL, &err) != 0 ||
             comm_start(&fx.comm, 0, &err) != 0 || comm_split(&fx.comm, 1, 1, 1, 1, 0, &err) != 0 ||
             trainer_init(&fx.tr, &fx.cfg, &fx.comm, &err) != 0;
    if (rc)
        fprintf(stderr, "setup: %s\n", err.msg);
    free(yaml);
    free(prefix);
    return rc ? -1 : 0;
}

static int group_teardown(void **state)
{
    (void)state;
    trainer_free(&fx.tr);
    comm_finish(&fx.comm);
    config_free(&fx.cfg);
    test_rm_rf(fx.dir);
    free(fx.dir);
    return 0;
}

/* Puts a plan of N_MB micro-batches into the trainer: micro-batch i holds the whole documents
 * docs[i][0..] (-1 ends a list), runs at pipeline place order[i], sharded for one CP rank. */
static void make_plan(const int docs[N_MB][MAX_DOCS], const int order[N_MB])
{
    Trainer *tr = &fx.tr;
    StepPlan *p = &tr->plan;
    plan_reset(p, 0, 1, N_MB, 1);
    assert_non_null(p->mbs);
    Error err = {0};
    for (int i = 0; i < N_MB; i++) {
        PlanMicroBatch *mb = &p->mbs[i];
        mb->replica = 0;
        mb->order = order[i];
        mb->first_doc = p->n_docs;
        int64_t at = 0;
        for (int k = 0; docs[i][k] >= 0; k++) {
            int64_t len = (int64_t)data_source_doc_len(&tr->data.src[0], (uint64_t)docs[i][k]);
            PlanDoc d = {0, (uint64_t)docs[i][k], 0, len, at, k, 0, -1, 0, 0};
            assert_true(plan_add_doc(p, &d) >= 0);
            at += len;
            p->tokens += len;
        }
        mb->n_docs = p->n_docs - mb->first_doc;
        mb->tokens = at;
        assert_int_equal(plan_shard(p, i, CP_PER_SEQ, &tr->cost, 1 << 20, &err), 0);
    }
}

/* Runs the trainer's plan: its loss, and every gradient into grads (full tensors, one after the other). */
static double run(float *grads)
{
    Trainer *tr = &fx.tr;
    TrainStats st;
    Error err = {0};
    if (trainer_run_plan(tr, &st, &err) != 0) {
        print_error("%s\n", err.msg);
        fail();
    }
    const ModelDims *d = &tr->chunks[0].model.dims;
    int64_t at = 0;
    for (int i = 0; i < model_full_tensor_count(d); i++) {
        char name[96];
        int64_t rows, cols;
        int vec;
        model_full_tensor(d, i, name, sizeof name, &rows, &cols, &vec);
        assert_int_equal(trainer_gather(tr, name, 1, grads + at, &err), 0);
        at += rows * cols;
    }
    return st.loss;
}

static int64_t n_params(void) { return fx.tr.chunks[0].model.n_params; }

/* max |a - b| / max |b| over every gradient element. */
static double rel_diff(const float *a, const float *b)
{
    double diff = 0, scale = 0;
    for (int64_t i = 0; i < n_params(); i++) {
        diff = fmax(diff, fabs((double)a[i] - b[i]));
        scale = fmax(scale, fabs((double)b[i]));
    }
    return diff / scale;
}

static void test_empty_micro_batches_are_no_ops(void **state)
{
    (void)state;
    float *ref = malloc((size_t)n_params() * sizeof *ref), *got[2];
    assert_non_null(ref);
    /* Six documents. First (on the trainer's fresh activation slots) two empty micro-batches, one of
     * them first in the pipeline; then all six in one micro-batch. */
    const int with_empty[N_MB][MAX_DOCS] = {{0, 1, 2, -1}, {-1}, {3, 4, 5, -1}, {-1}};
    const int empty_first[N_MB] = {2, 0, 3, 1};
    const int all_in_one[N_MB][MAX_DOCS] = {{-1}, {5, 4, 3, 2, 1, 0, -1}, {-1}, {-1}};
    const int in_order[N_MB] = {0, 1, 2, 3};
    const int (*plans[2])[MAX_DOCS] = {with_empty, all_in_one};
    double loss[2];
    for (int k = 0; k < 2; k++) {
        assert_non_null(got[k] = malloc((size_t)n_params() * sizeof *got[k]));
        make_plan(plans[k], k == 0 ? empty_first : in_order);
        loss[k] = run(got[k]);
    }
    /* The reference: one or two documents in every micro-batch. */
    const int spread[N_MB][MAX_DOCS] = {{0, -1}, {1, 2, -1}, {3, -1}, {4, 5, -1}};
    make_plan(spread, in_order);
    double ref_loss = run(ref);
    assert_true(ref_loss > 1.0);
    for (int k = 0; k < 2; k++) {
        double d = rel_diff(got[k], ref);
        printf("# plan %d: loss %.9f (spread %.9f), gradients differ by %.2e relative\n", k, loss[k], ref_loss, d);
        assert_true(fabs(loss[k] - ref_loss) <= 1e-6 * ref_loss);
        assert_true(d <= 1e-5);
        free(got[k]);
    }
    /* Nothing to train: no loss, no gradient. */
    const int nothing[N_MB][MAX_DOCS] = {{-1}, {-1}, {-1}, {-1}};
    make_plan(nothing, in_order);
    assert_true(run(ref) == 0.0);
    for (int64_t i = 0; i < n_params(); i++)
        assert_true(ref[i] == 0.0f);
    free(ref);
}

static void test_missing_pipeline_place_is_an_error(void **state)
{
    (void)state;
    const int docs[N_MB][MAX_DOCS] = {{0, -1}, {1, -1}, {2, -1}, {3, -1}};
    const int twice[N_MB] = {0, 1, 1, 3};
    make_plan(docs, twice);
    TrainStats st;
    Error err = {0};
    assert_int_equal(trainer_run_plan(&fx.tr, &st, &err), -1);
    assert_non_null(strstr(err.msg, "replica 0 has no micro-batch at pipeline place 2"));
}


/* The inputs of a micro-batch (batch_build) against the data set read here: a piece from inside a
 * document has its tokens, RoPE positions from its offset in the document on, and as its last
 * target the document's next token; the piece that ends the document has no last target; padding
 * is token 0, positions from 0, no targets. */
static void test_batch_inputs_of_pieces(void **state)
{
    (void)state;
    Trainer *tr = &fx.tr;
    const DataIdx *idx = &tr->data.idx[0];
    uint64_t doc = 0, len = 0;
    while ((len = data_source_doc_len(&tr->data.src[0], doc)) < 12)
        doc++;
    int32_t want[64];
    Error err = {0};
    assert_int_equal(data_idx_read_tokens(idx, doc, 0, len, want, &err), 0);
    StepPlan p = {0};
    plan_reset(&p, 0, 1, 1, 1);
    PlanDoc pieces[3] = {{0, doc, 4, 6, 0, 0, 0, -1, 0, 1},                  /* tokens 4..9: inside */
                         {0, doc, 10, (int64_t)len - 10, 6, 1, 0, -1, 0, 1}, /* 10..end: ends the document */
                         {PLAN_PAD_SOURCE, 0, 0, 3, (int64_t)len - 4, -1, 0, -1, 0, 1}};
    for (int k = 0; k < 3; k++)
        assert_true(plan_add_doc(&p, &pieces[k]) >= 0);
    int64_t T = (int64_t)len - 4 + 3;
    p.mbs[0] = (PlanMicroBatch){.replica = 0, .order = 0, .tokens = T, .pad = 3, .first_doc = 0, .n_docs = 3};
    assert_int_equal(plan_shard(&p, 0, CP_PER_SEQ, &tr->cost, T, &err), 0);
    BatchBuffers bb = {.ops = tr->ops};
    ModelBatch b;
    assert_int_equal(batch_build(&bb, &p, 0, 0, &tr->data, 64, &b, &err), 0);
    assert_int_equal(b.T, T);
    const int32_t *tok = bb.d_tokens, *tgt = bb.d_targets, *pos = bb.d_positions; /* host memory (cpu) */
    for (int64_t r = 0; r < T; r++) {
        int64_t at = r + 4; /* token of the document, for the data rows */
        int pad = r >= (int64_t)len - 4;
        int32_t w_tok = pad ? 0 : want[at], w_pos = pad ? (int32_t)(r - ((int64_t)len - 4)) : (int32_t)at;
        int32_t w_tgt = pad || at + 1 >= (int64_t)len ? -1 : want[at + 1];
        if (tok[r] != w_tok || pos[r] != w_pos || tgt[r] != w_tgt) {
            print_error("row %lld: token %d position %d target %d, expected %d %d %d\n", (long long)r, tok[r], pos[r],
                        tgt[r], w_tok, w_pos, w_tgt);
            fail();
        }
    }
    batch_free(&bb);
    plan_free(&p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_empty_micro_batches_are_no_ops),
        cmocka_unit_test(test_missing_pipeline_place_is_an_error),
        cmocka_unit_test(test_batch_inputs_of_pieces),
    };
    return cmocka_run_group_tests_name("train_plan", tests, group_setup, group_teardown);
}
