/*
 * cpu/cpu_attention.c - document-causal attention over segments (see engine/ops.h), fp32.
 *
 * Forward, per segment, query row i and head h: s_t = q_i . k_t / sqrt(D) for the n keys it sees
 * (kv_len - q_len + i + 1 of them, or with `full` all kv_len), p = softmax(s), out_i = sum_t p_t v_t;
 * lse_i = max + log(sum exp(s - max)). Merge (cpu_attention_merge): two attentions of one query over
 * disjoint key blocks combine by their lse - the softmax over the union weighs each block's output
 * by its share of the denominator, e^(lse_block - lse_union).
 * Backward (P recomputed from lse): dP_t = dout_i . v_t, D_i = dout_i . out_i,
 * dS_t = P_t (dP_t - D_i); dq_i = sum_t dS_t k_t / sqrt(D); dk_t += dS_t q_i / sqrt(D);
 * dv_t += P_t dout_i.
 * Threads: the forward splits by (segment, head); the backward by key/value head, each thread
 * owning that head's dk, dv and the dq of its query heads, walking the segments in order (keys are
 * shared between segments, e.g. two chunks of one document): sums never depend on the thread count.
 * A query row's whole work is one function, so that its loops inline and vectorize.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/cpu_ops.h"
#include "util/error.h"

/* One query row, one head, forward: keys k[t * stride], t < n. s is scratch of n floats. */
CPU_HOT static float row_fwd(float *restrict out, const float *restrict qi, const float *restrict k,
                             const float *restrict v, int64_t stride, int64_t n, int D, float scale,
                             float *restrict s)
{
    float mx = -INFINITY;
    for (int64_t t = 0; t < n; t++) {
        const float *kt = k + t * stride;
        float dot = 0;
        for (int d = 0; d < D; d++)
            dot += qi[d] * kt[d];
        s[t] = dot * scale;
        mx = s[t] > mx ? s[t] : mx;
    }
    float sum = 0;
    for (int64_t t = 0; t < n; t++) {
        s[t] = expf(s[t] - mx);
        sum += s[t];
    }
    float inv = 1.0f / sum;
    memset(out, 0, (size_t)D * sizeof *out);
    for (int64_t t = 0; t < n; t++) {
        const float *vt = v + t * stride;
        float p = s[t] * inv;
        for (int d = 0; d < D; d++)
            out[d] += p * vt[d];
    }
    return mx + logf(sum);
}

/* One query row, one head, backward: accumulates into dqi and the n rows of dk, dv. */
CPU_HOT static void row_bwd(float *restrict dqi, float *restrict dk, float *restrict dv, const float *restrict qi,
                            const float *restrict doi, const float *restrict oi, const float *restrict k,
                            const float *restrict v, int64_t stride, int64_t n, int D, float scale, float lse)
{
    float di = 0;
    for (int d = 0; d < D; d++)
        di += doi[d] * oi[d];
    for (int64_t t = 0; t < n; t++) {
        const float *kt = k + t * stride, *vt = v + t * stride;
        float qk = 0, dp = 0;
        for (int d = 0; d < D; d++) {
            qk += qi[d] * kt[d];
            dp += doi[d] * vt[d];
        }
        float p = expf(qk * scale - lse), ds = p * (dp - di) * scale;
        float *dkt = dk + t * stride, *dvt = dv + t * stride;
        for (int d = 0; d < D; d++) {
            dqi[d] += ds * kt[d];
            dkt[d] += ds * qi[d];
            dvt[d] += p * doi[d];
        }
    }
}

/* The keys query i of segment g sees. */
static inline int64_t keys_seen(const AttnSegment *g, int64_t i)
{
    return g->full ? g->kv_len : g->kv_len - g->q_len + i + 1;
}

static int64_t longest_kv(const AttnSegment *segs, int64_t n)
{
    int64_t m = 1;
    for (int64_t i = 0; i < n; i++)
        m = segs[i].kv_len > m ? segs[i].kv_len : m;
    return m;
}

void cpu_attention_fwd(float *out, float *lse, const float *q, const float *k, const float *v,
                       const AttnSegment *segs, int64_t n_segs, AttnShape a)
{
    const int H = a.n_heads, D = a.head_dim, group = a.n_heads / a.n_kv_heads;
    const float scale = 1.0f / sqrtf((float)D);
    const int64_t max_kv = longest_kv(segs, n_segs);
    int failed = 0;
#pragma omp parallel reduction(| : failed)
    {
        float *s = malloc((size_t)max_kv * sizeof *s);
        failed = !s;
#pragma omp for schedule(dynamic)
        for (int64_t job = 0; job < n_segs * H; job++) {
            if (!s)
                continue;
            const AttnSegment *g = &segs[job / H];
            int h = (int)(job % H), kh = h / group;
            const float *kb = k + g->kv_row * a.kv_stride + kh * D, *vb = v + g->kv_row * a.kv_stride + kh * D;
            for (int64_t i = 0; i < g->q_len; i++) {
                int64_t row = g->q_row + i;
                lse[row * H + h] = row_fwd(out + row * a.o_stride + h * D, q + row * a.q_stride + h * D, kb, vb,
                                           a.kv_stride, keys_seen(g, i), D, scale, s);
            }
        }
        free(s);
    }
    if (failed)
        wlb_fatal("cpu backend: out of memory");
}

void cpu_attention_bwd(float *dq, float *dk, float *dv, const float *dout, const float *out, const float *lse,
                       const float *q, const float *k, const float *v, const AttnSegment *segs, int64_t n_segs,
                       AttnShape a)
{
    const int H = a.n_heads, D = a.head_dim, group = a.n_heads / a.n_kv_heads;
    const float scale = 1.0f / sqrtf((float)D);
#pragma omp parallel for schedule(static)
    for (int kh = 0; kh < a.n_kv_heads; kh++)
        for (int64_t si = 0; si < n_segs; si++) {
            const AttnSegment *g = &segs[si];
            int64_t kv = g->kv_row * a.kv_stride + kh * D;
            for (int h = kh * group; h < (kh + 1) * group; h++)
                for (int64_t i = 0; i < g->q_len; i++) {
                    int64_t row = g->q_row + i, at = row * a.q_stride + h * D, ot = row * a.o_stride + h * D;
                    row_bwd(dq + at, dk + kv, dv + kv, q + at, dout + ot, out + ot, k + kv, v + kv, a.kv_stride,
                            keys_seen(g, i), D, scale, lse[row * H + h]);
                }
        }
}

void cpu_attention_merge(float *acc, float *acc_lse, const float *part, const float *part_lse,
                         const AttnSegment *segs, int64_t n_segs, AttnShape a, int first)
{
    const int H = a.n_heads, D = a.head_dim;
#pragma omp parallel for schedule(dynamic)
    for (int64_t si = 0; si < n_segs; si++)
        for (int64_t row = segs[si].q_row; row < segs[si].q_row + segs[si].q_len; row++)
            for (int h = 0; h < H; h++) {
                float *o = acc + row * a.o_stride + h * D, *l = acc_lse + row * H + h;
                const float *po = part + row * a.o_stride + h * D, pl = part_lse[row * H + h];
                if (first || *l == -INFINITY) {
                    memcpy(o, po, (size_t)D * sizeof *o);
                    *l = pl;
                    continue;
                }
                if (pl == -INFINITY)
                    continue;
                float m = *l > pl ? *l : pl, wa = expf(*l - m), wb = expf(pl - m), inv = 1.0f / (wa + wb);
                for (int d = 0; d < D; d++)
                    o[d] = (o[d] * wa + po[d] * wb) * inv;
                *l = m + logf(wa + wb);
            }
}
