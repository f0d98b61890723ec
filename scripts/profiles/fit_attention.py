#!/usr/bin/env python3
"""scripts/profiles/fit_attention.py - the attention table of an engine profile
(engine/plan/profiles/*.json) from what bench/attention_kernels.sh measured on a GPU.

The bench times wlbtrain's kernels over one window of documents drawn from the WLB-LLM length list
(bench/attn_mix.py, seed 1) and prints TFLOP/s over the causal pairs within the documents: forward
4 D H n (n + 1) / 2 FLOPs a document of n tokens, forward + backward 3.5x that. The cost model
prices a document as the kernel runs it: its query rows padded to the tile (qp = ceil(n / 128) 128),
qp (qp + 1) / 2 pairs, at a rate that depends on qp. With the rate written
    rate(qp) = R qp / (qp + h)
a window's seconds are (4 D H / R) sum(pairs) + (4 D H h / R) sum(pairs / qp): linear in 1 / R and
h / R, so two windows (8K and 32K) give R and h exactly - for the forward, and for the backward
(2.5x the forward's FLOPs) from the forward + backward time less the forward's. The table is the
curve at q = 128 .. 131072; past the longest document measured it is the curve's extrapolation.

Usage: python3 scripts/profiles/fit_attention.py LENGTHS_JSON HEADS DIM \
           8192 FWD_TFLOPS FB_TFLOPS 32768 FWD_TFLOPS FB_TFLOPS
"""
import json
import random
import sys

TILE = 128


def mix(lengths, window, seed=1):
    """bench/attn_mix.py's window: lengths drawn (seeded) until the window is full, the last cut."""
    rng, row, docs = random.Random(seed), 0, []
    while row < window:
        n = min(rng.choice(lengths), window - row)
        docs.append(n)
        row += n
    return docs


def sums(docs):
    """sum of causal pairs (the bench's count), sum of padded pairs, sum of padded pairs / qp."""
    exact = sum(n * (n + 1) / 2 for n in docs)
    padded = [((n + TILE - 1) // TILE * TILE) for n in docs]
    pp = sum(q * (q + 1) / 2 for q in padded)
    pq = sum(q * (q + 1) / 2 / q for q in padded)
    return exact, pp, pq


def solve(rows):
    """rows: (seconds / (4 D H), sum pp, sum pp/qp) twice -> R (FLOP/s) and h (tokens)."""
    (t1, a1, b1), (t2, a2, b2) = rows
    det = a1 * b2 - a2 * b1
    inv_r = (t1 * b2 - t2 * b1) / det
    h_over_r = (a1 * t2 - a2 * t1) / det
    return 1 / inv_r, h_over_r / inv_r


def main():
    a = sys.argv[1:]
    lengths = [x for x in json.load(open(a[0])) if x > 0]
    heads, dim = int(a[1]), int(a[2])
    fwd, bwd = [], []
    for i in range(3, len(a), 3):
        w, f, fb = int(a[i]), float(a[i + 1]) * 1e12, float(a[i + 2]) * 1e12
        exact, pp, pq = sums(mix(lengths, w))
        flops = 4 * dim * heads * exact
        t_f, t_fb = flops / f, 3.5 * flops / fb
        fwd.append((t_f / (4 * dim * heads), pp, pq))
        bwd.append(((t_fb - t_f) / (2.5 * 4 * dim * heads), pp, pq))
        print("# window %d: documents %s; forward %.3f ms, backward %.3f ms" % (w, mix(lengths, w), t_f * 1e3,
              (t_fb - t_f) * 1e3), file=sys.stderr)
    rf, hf = solve(fwd)
    rb, hb = solve(bwd)
    print("# forward R %.1f TFLOP/s h %.0f; backward R %.1f TFLOP/s h %.0f" % (rf / 1e12, hf, rb / 1e12, hb),
          file=sys.stderr)
    q = [TILE << k for k in range(11)]
    print(json.dumps({"q": q, "fwd_tflops": [round(rf * x / (x + hf) / 1e12, 1) for x in q],
                      "bwd_tflops": [round(rb * x / (x + hb) / 1e12, 1) for x in q]}))


if __name__ == "__main__":
    main()
