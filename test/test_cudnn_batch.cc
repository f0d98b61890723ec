/*
 * test/test_cudnn_batch.cc - the host side of cuDNN's attention path (cuda/cuda_cudnn_batch.h) on the
 * CPU: how the engine's segments become cuDNN's ragged batches and the backward's waves. cuDNN itself
 * runs only on a GPU (test_ops's test_cuda_cudnn_attention); what can be checked without one is
 * that every sequence's offsets point at its rows in every array, that lengths and padding are what
 * the graph's sizes promise, and that no two segments of one backward call share a row.
 *
 *   groups     causal and full segments go to separate calls; segments without queries to none
 *   batch      sizes rounded up to powers of two; per sequence: lengths, and the offsets of q, k/v,
 *              out, lse, dq and dk/dv (row * stride in elements, of the fused q/k/v array for q
 *              and k/v); the padding sequences empty and starting at the last one's end, so the
 *              offsets never decrease; the backward's row bounds cover every row
 *   waves      each segment in exactly one wave; within a wave no two query ranges and no two key
 *              ranges overlap (CP chunks of one document share keys: separate waves); the order of
 *              the segments kept
 *   workspace  the deterministic backward's score-sized workspace, and the bound that leaves a long
 *              document's backward to the engine's kernels
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

extern "C" {
#include <cmocka.h>
}

#include "cuda/cuda_cudnn_batch.h"

/* The layout of test_ops's cuDNN test: documents of 1, 2, 3, 63, 64, 65, 129 and 300 tokens, one
 * of 700 keys in three CP chunks (the last two sharing the first keys), a full segment, and one
 * segment without queries. */
static int64_t layout(AttnSegment *segs)
{
    int64_t rows = 0, n = 0;
    const int lens[8] = {1, 2, 3, 63, 64, 65, 129, 300};
    for (int i = 0; i < 8; i++, n++) {
        segs[n] = AttnSegment{rows, lens[i], rows, lens[i], 0};
        rows += lens[i];
    }
    segs[n++] = AttnSegment{rows, 130, rows, 130, 0};
    segs[n++] = AttnSegment{rows + 300, 65, rows, 365, 0};
    segs[n++] = AttnSegment{rows + 637, 63, rows, 700, 0};
    segs[n++] = AttnSegment{rows + 800, 100, rows + 700, 100, 1};
    segs[n++] = AttnSegment{rows + 900, 0, rows + 900, 0, 0};
    return n;
}

/* 32 query heads, 8 kv heads of 128 (llama3-8b): q, k, v as columns of one fused row, out apart. */
static const AttnShape SHAPE = {32, 8, 128, (32 + 2 * 8) * 128, (32 + 2 * 8) * 128, 32 * 128};

static void test_groups(void **state)
{
    (void)state;
    AttnSegment segs[16];
    int64_t n = layout(segs);
    std::vector<int64_t> causal = cudnn_group(segs, n, 0), full = cudnn_group(segs, n, 1);
    assert_int_equal(causal.size(), 11);
    assert_int_equal(full.size(), 1);
    assert_int_equal(full[0], 11);
    for (size_t i = 0; i < causal.size(); i++)
        assert_int_equal(causal[i], (int64_t)i);
}

static void check_batch(const AttnSegment *segs, const std::vector<int64_t> &idx, int backward)
{
    CudnnBatch b;
    cudnn_make_batch(&b, segs, idx, SHAPE, backward, 1, 1);
    const CudnnSdpaDesc &d = b.desc;
    const int64_t n = (int64_t)idx.size(), H = (int64_t)SHAPE.n_heads * SHAPE.head_dim,
                  Hkv = (int64_t)SHAPE.n_kv_heads * SHAPE.head_dim;
    assert_int_equal(d.backward, backward);
    assert_int_equal(d.deterministic, backward);
    assert_true(d.batch >= n && d.batch < 2 * n + 1 && (d.batch & (d.batch - 1)) == 0);
    assert_int_equal(b.seq_q.size(), d.batch);
    assert_int_equal(b.segs.size(), n);
    for (int k = 0; k < CUDNN_OFFSETS; k++)
        assert_int_equal(b.off[k].size(), d.batch + 1);
    int64_t rows_q = 0, rows_kv = 0;
    for (int64_t j = 0; j < n; j++) {
        const AttnSegment &g = segs[idx[(size_t)j]];
        assert_int_equal(b.seq_q[(size_t)j], g.q_len);
        assert_int_equal(b.seq_kv[(size_t)j], g.kv_len);
        assert_true(g.q_len <= d.max_q && g.kv_len <= d.max_kv);
        assert_int_equal(b.off[CUDNN_OFF_Q][(size_t)j], g.q_row * SHAPE.q_stride);
        assert_int_equal(b.off[CUDNN_OFF_KV][(size_t)j], g.kv_row * SHAPE.kv_stride);
        assert_int_equal(b.off[CUDNN_OFF_O][(size_t)j], g.q_row * SHAPE.o_stride);
        assert_int_equal(b.off[CUDNN_OFF_STATS][(size_t)j], g.q_row * SHAPE.n_heads);
        assert_int_equal(b.off[CUDNN_OFF_DQ][(size_t)j], g.q_row * H);
        assert_int_equal(b.off[CUDNN_OFF_DKV][(size_t)j], g.kv_row * Hkv);
        rows_q = g.q_row + g.q_len > rows_q ? g.q_row + g.q_len : rows_q;
        rows_kv = g.kv_row + g.kv_len > rows_kv ? g.kv_row + g.kv_len : rows_kv;
    }
    const AttnSegment &last = segs[idx.back()];
    for (int64_t j = n; j <= d.batch; j++) {
        if (j < d.batch) {
            assert_int_equal(b.seq_q[(size_t)j], 0);
            assert_int_equal(b.seq_kv[(size_t)j], 0);
        }
        assert_int_equal(b.off[CUDNN_OFF_Q][(size_t)j], (last.q_row + last.q_len) * SHAPE.q_stride);
        assert_int_equal(b.off[CUDNN_OFF_DKV][(size_t)j], (last.kv_row + last.kv_len) * Hkv);
    }
    if (backward) {
        assert_true(d.rows_q >= rows_q && d.rows_kv >= rows_kv);
    } else {
        assert_int_equal(d.rows_q, 0);
        assert_int_equal(d.rows_kv, 0);
    }
}

static void test_batch(void **state)
{
    (void)state;
    AttnSegment segs[16];
    int64_t n = layout(segs);
    std::vector<int64_t> causal = cudnn_group(segs, n, 0);
    check_batch(segs, causal, 0);
    check_batch(segs, cudnn_group(segs, n, 1), 0);
    CudnnBatch b;
    cudnn_make_batch(&b, segs, causal, SHAPE, 0, 1, 1);
    assert_int_equal(b.desc.batch, 16);   /* 11 sequences */
    assert_int_equal(b.desc.max_q, 512);  /* the longest: 300 queries */
    assert_int_equal(b.desc.max_kv, 1024); /* 700 keys */
    assert_int_equal(b.desc.causal, 1);
    assert_int_equal(b.desc.deterministic, 0); /* a forward is never asked for it */
    /* whole documents, in row order: every offset array never decreases */
    std::vector<int64_t> docs(causal.begin(), causal.begin() + 8);
    cudnn_make_batch(&b, segs, docs, SHAPE, 1, 1, 0);
    for (int k = 0; k < CUDNN_OFFSETS; k++)
        for (size_t j = 1; j < b.off[k].size(); j++)
            assert_true(b.off[k][j] >= b.off[k][j - 1]);
    /* a short batch: one 1-token document, the smallest sizes */
    std::vector<int64_t> first(1, 0);
    cudnn_make_batch(&b, segs, first, SHAPE, 1, 1, 0);
    assert_int_equal(b.desc.batch, 1);
    assert_int_equal(b.desc.max_q, 64);
    assert_int_equal(b.desc.rows_q, 64);
    check_batch(segs, first, 1);
}

static void test_waves(void **state)
{
    (void)state;
    AttnSegment segs[16];
    int64_t n = layout(segs);
    std::vector<int64_t> causal = cudnn_group(segs, n, 0);
    std::vector<std::vector<int64_t>> waves = cudnn_waves(segs, causal);
    /* the three chunks of the 700-key document share its first keys: three waves */
    assert_int_equal(waves.size(), 3);
    std::vector<int> seen((size_t)n, 0);
    for (const std::vector<int64_t> &w : waves) {
        for (size_t i = 0; i < w.size(); i++) {
            seen[(size_t)w[i]]++;
            if (i > 0)
                assert_true(w[i] > w[i - 1]);
            for (size_t j = 0; j < i; j++) {
                const AttnSegment &a = segs[w[i]], &b = segs[w[j]];
                assert_false(a.q_row < b.q_row + b.q_len && b.q_row < a.q_row + a.q_len);
                assert_false(a.kv_row < b.kv_row + b.kv_len && b.kv_row < a.kv_row + a.kv_len);
            }
        }
        check_batch(segs, w, 1);
    }
    for (int64_t i : causal)
        assert_int_equal(seen[(size_t)i], 1);
    assert_int_equal(waves[0].size(), 9); /* the eight documents and the first chunk */
    /* documents alone: one wave */
    std::vector<int64_t> docs(causal.begin(), causal.begin() + 8);
    assert_int_equal(cudnn_waves(segs, docs).size(), 1);
    /* two segments with the same query rows (two key blocks in one call): separate waves */
    AttnSegment same_q[2] = {{0, 10, 100, 10, 1}, {0, 10, 200, 10, 1}};
    std::vector<int64_t> both = {0, 1};
    assert_int_equal(cudnn_waves(same_q, both).size(), 2);
}

static void test_deterministic_workspace(void **state)
{
    (void)state;
    CudnnSdpaDesc d;
    memset(&d, 0, sizeof d);
    d.n_heads = 32, d.batch = 1, d.max_q = 8192, d.max_kv = 8192;
    /* one 8K document at 32 heads: 32 x 8192 x 8192 x 2 bytes = 4 GiB, over the bound */
    assert_int_equal(cudnn_deterministic_workspace(d), INT64_C(4) << 30);
    assert_true(cudnn_deterministic_workspace(d) > OPS_CUDNN_DP_WORKSPACE_MAX);
    d.batch = 16, d.max_q = 1000, d.max_kv = 1000; /* 16 x 32 x 1024 x 1024 x 2: 1 GiB, taken */
    assert_int_equal(cudnn_deterministic_workspace(d), INT64_C(1) << 30);
    assert_true(cudnn_deterministic_workspace(d) <= OPS_CUDNN_DP_WORKSPACE_MAX);
}

#ifdef WLB_CUDNN
/* The graphs of every call the layout makes (forward and backward, causal and full, the backward's
 * waves, deterministic or not) at the head sizes of llama3.2-1b (64) and Llama 3.1 8B (128), and one
 * 128K-token document, as cudnn-frontend validates them for Hopper (SM 90) with the libcudnn found
 * here: the rules it checks before it asks a GPU (ragged offsets with the padding mask, the bottom-
 * right diagonal, ragged statistics, the backward's bounded workspace). Whether cuDNN then runs them,
 * and right, is test_ops's test on a GPU. On Ampere (SM 80) cuDNN has no deterministic backward over
 * ragged batches: refused, which leaves such a backward to the engine's kernels. */
static void expect_graph(const CudnnSdpaDesc &d, int sm, int ok)
{
    char why[512] = "";
    int got = cuda_cudnn_check(&d, sm, why, sizeof why);
    if (got != ok)
        print_error("SM %d, %s %s%s, heads %d/%d of %d, batch %lld, %lld x %lld: %s\n", sm,
                    d.backward ? "backward" : "forward", d.causal ? "causal" : "full",
                    d.deterministic ? " deterministic" : "", d.n_heads, d.n_kv_heads, d.head_dim, (long long)d.batch,
                    (long long)d.max_q, (long long)d.max_kv, got ? "validated" : why);
    assert_int_equal(got, ok);
}

static void test_graphs(void **state)
{
    (void)state;
    char why[512];
    if (!cuda_cudnn_library(why, sizeof why)) {
        print_message("skipped: %s\n", why);
        skip();
    }
    AttnSegment segs[16];
    int64_t n = layout(segs);
    const AttnShape shapes[2] = {{32, 8, 64, 48 * 64, 48 * 64, 32 * 64}, SHAPE};
    for (const AttnShape &s : shapes)
        for (int full = 0; full < 2; full++) {
            std::vector<int64_t> idx = cudnn_group(segs, n, full);
            CudnnBatch b;
            cudnn_make_batch(&b, segs, idx, s, 0, !full, 0);
            expect_graph(b.desc, 90, 1);
            expect_graph(b.desc, 80, 1);
            for (const std::vector<int64_t> &wave : cudnn_waves(segs, idx))
                for (int det = 0; det < 2; det++) {
                    cudnn_make_batch(&b, segs, wave, s, 1, !full, det);
                    expect_graph(b.desc, 90, 1);
                    expect_graph(b.desc, 80, 0);
                }
        }
    AttnSegment longest = {0, 131072, 0, 131072, 0};
    std::vector<int64_t> one(1, 0);
    CudnnBatch b;
    for (int backward = 0; backward < 2; backward++) {
        cudnn_make_batch(&b, &longest, one, SHAPE, backward, 1, 0);
        expect_graph(b.desc, 90, 1);
    }
}
#endif

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_groups),
        cmocka_unit_test(test_batch),
        cmocka_unit_test(test_waves),
        cmocka_unit_test(test_deterministic_workspace),
#ifdef WLB_CUDNN
        cmocka_unit_test(test_graphs),
#endif
    };
    return cmocka_run_group_tests_name("cudnn batch", tests, NULL, NULL);
}
