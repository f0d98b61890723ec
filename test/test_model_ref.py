#!/usr/bin/env python3
"""test/test_model_ref.py - wlbtrain's CPU model (forward, loss, backward) against the float64 numpy
reference test/ref_llama.py.

The C side provides $WLB_TEST_BIN_DIR/dump_model (default build/release/test/dump_model):
    dump_model CASE OUT.safetensors [--stories PATH]
which writes one safetensors file: metadata with every model cfg key as strings (n_layers, d_model,
n_heads, n_kv_heads, d_ffn, vocab_size, rope_theta, norm_eps, tie_embeddings, rope_scaling,
rope_scaling_factor, rope_low_freq_factor, rope_high_freq_factor, rope_original_max_seq_len), the
weights under their Hugging Face names (F32), the batch ("batch.tokens", "batch.targets" (-1 = no
label), "batch.positions", "batch.doc", I32), "result.loss" (F32 [1]) and "grad.<name>" (F32) for
every weight. For stories260k also "generated" (greedy tokens from BOS = 1); its grads may be absent.

1-5 for each CASE (tiny, tiny-tied, tiny-llama3rope, tiny-mha, stories260k): the dump is complete
    and consistent (every weight with its shape, batch lengths and ranges, documents contiguous, the
    property the case is named for), and loss and gradients recomputed by ref_llama in float64 from
    the dumped weights and batch agree: |loss_c - loss_ref| / |loss_ref| <= 1e-5 and, per weight,
    ||g_c - g_ref|| / ||g_ref|| <= 1e-5 (5e-5 for stories260k, see STORIES_GRAD_TOL; each tensor's
    error is printed as a TAP comment).
6   stories260k weights: the dumped weights equal llama2c_to_hf of ref_llama's own reading of
    stories260K.bin, exactly (so the C loader's layout and q/k row permutation are right), and the
    dumped cfg is the file's.
7   stories260k generation: "generated" equals ref_llama's greedy generation from BOS on the
    llama2.c (interleaved RoPE) path.
8   stories260k loss: the batch is that sequence (tokens a prefix of it, targets the next tokens)
    and the dumped loss equals the interleaved-path loss to 1e-5.
Each test is skipped with the reason when the tool is not built yet or stories260K.bin is absent.

Environment: WLB_TEST_BIN_DIR, WLB_REAL_DATA (default ../shared/real-data). Output: TAP.
"""
import atexit
import os
import shutil
import subprocess
import sys
import tempfile
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
REAL = os.environ.get("WLB_REAL_DATA") or "../shared/real-data"
STORIES = os.path.join(REAL, "models/stories260K.bin")
BIN_DIR = os.environ.get("WLB_TEST_BIN_DIR") or os.path.join(REPO, "build/release/test")
DUMP = os.path.join(BIN_DIR, "dump_model")
TOL = 1e-5
# stories260k's gradients: a trained model predicting its own greedy text is confident (p near 1),
# and float32 softmax backward sums cancel there (dP - D in the attention, p - 1 in the loss); the
# issue asks only for its loss to match (to TOL). Its gradients are still checked, to this bound.
STORIES_GRAD_TOL = 5e-5
BOS = 1


from taplib import Skip, check, comment, import_numpy, missing  # noqa: E402

np = import_numpy()
if not isinstance(np, Exception):
    import ref_llama as R


_tmp = None
_dumps = {}


def dump(case):
    """(cfg, tensors, metadata) of `dump_model CASE`, run once per case."""
    global _tmp
    if case in _dumps:
        if isinstance(_dumps[case], Exception):
            raise _dumps[case]
        return _dumps[case]
    try:
        if not os.path.exists(DUMP):
            raise missing("the C tool is not built yet: %s (make test builds it; WLB_TEST_BIN_DIR points elsewhere)" % DUMP)
        if case == "stories260k" and not os.path.exists(STORIES):
            raise missing("real data absent: %s (it lives in ../shared/real-data beside the clone)" % STORIES)
        if _tmp is None:
            _tmp = tempfile.mkdtemp(prefix="wlb_model_ref.")
            atexit.register(shutil.rmtree, _tmp, True)
        out = os.path.join(_tmp, case + ".safetensors")
        cmd = [DUMP, case, out] + (["--stories", STORIES] if case == "stories260k" else [])
        r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=600)
        text = r.stdout.decode(errors="replace")
        if r.returncode != 0:
            raise AssertionError("%s exited with %d:\n%s" % (" ".join(cmd), r.returncode, text[-3000:]))
        tensors, meta = R.load_safetensors(out)
        cfg = R.cfg_from_metadata(meta)
        _dumps[case] = (cfg, tensors, meta)
    except Exception as e:
        _dumps[case] = e
        raise
    return _dumps[case]


def weights_of(cfg, tensors):
    """The dumped weights (float64), after checking every one is there with its shape."""
    shapes = R.weight_shapes(cfg)
    missing = [n for n in shapes if n not in tensors]
    check(not missing, "weights missing from the dump: %s" % ", ".join(missing))
    for n, s in shapes.items():
        check(tuple(tensors[n].shape) == s, "%s: shape %r, expected %r" % (n, tensors[n].shape, s))
    others = [n for n in tensors
              if n not in shapes and not n.startswith(("batch.", "result.", "grad.")) and n != "generated"]
    check(not others, "tensors that are no weight of this cfg: %s" % ", ".join(sorted(others)))
    return {n: tensors[n].astype(np.float64) for n in shapes}


def batch_of(cfg, tensors):
    names = ("batch.tokens", "batch.targets", "batch.positions", "batch.doc")
    for n in names:
        check(n in tensors, "%s missing from the dump" % n)
    tokens, targets, positions, doc = (tensors[n].astype(np.int64).reshape(-1) for n in names)
    N, V = len(tokens), cfg["vocab_size"]
    check(N > 0 and len(targets) == N and len(positions) == N and len(doc) == N,
          "batch lengths %r" % [len(tokens), len(targets), len(positions), len(doc)])
    check(tokens.min() >= 0 and tokens.max() < V, "tokens outside [0, %d)" % V)
    check(targets.min() >= -1 and targets.max() < V, "targets outside [-1, %d)" % V)
    check(positions.min() >= 0, "negative positions")
    starts = np.concatenate([[True], doc[1:] != doc[:-1]])
    check(len(np.unique(doc)) == int(starts.sum()), "a document's tokens are not contiguous")
    check((targets >= 0).any(), "no token has a target")
    comment("batch: %d tokens, %d documents, %d without a target, positions %d..%d"
            % (N, starts.sum(), (targets < 0).sum(), positions.min(), positions.max()))
    return tokens, targets, positions, doc


CASE_PROPERTY = {
    "tiny-tied": (lambda c: c["tie_embeddings"], "tie_embeddings is true"),
    "tiny-llama3rope": (lambda c: c["rope_scaling"] == "llama3", "rope_scaling is llama3"),
    "tiny-mha": (lambda c: c["n_kv_heads"] == c["n_heads"], "n_kv_heads == n_heads"),
    "stories260k": (lambda c: (c["d_model"], c["d_ffn"], c["n_layers"], c["n_heads"], c["n_kv_heads"], c["vocab_size"],
                               c["tie_embeddings"], c["rope_scaling"]) == (64, 172, 5, 8, 4, 512, True, "none"),
                    "the cfg is stories260K's (64, 172, 5, 8, 4, 512, tied, no rope scaling)"),
}


def compare_case(case):
    cfg, tensors, meta = dump(case)
    comment("cfg: " + ", ".join("%s=%s" % (k, cfg[k]) for k in R.CFG_TYPES))
    if case in CASE_PROPERTY:
        ok, what = CASE_PROPERTY[case]
        check(ok(cfg), "case %s should have %s" % (case, what))
    W = weights_of(cfg, tensors)
    batch = batch_of(cfg, tensors)
    check("result.loss" in tensors and tensors["result.loss"].size == 1, "result.loss missing or not one value")
    loss_c = float(tensors["result.loss"].reshape(-1)[0])
    loss_ref, grads_ref = R.forward_backward(cfg, W, *batch)
    rel = abs(loss_c - loss_ref) / abs(loss_ref)
    comment("loss: C %.9g, reference %.12g, relative error %.2e" % (loss_c, loss_ref, rel))
    failures = []
    if rel > TOL:
        failures.append("loss: relative error %.3g > %g" % (rel, TOL))
    have = [n for n in W if "grad." + n in tensors]
    extra = [n for n in tensors if n.startswith("grad.") and n[5:] not in W]
    if extra:
        failures.append("gradients of no weight: %s" % ", ".join(extra))
    if case == "stories260k" and not have:
        comment("no gradients in the dump (allowed for stories260k)")
    else:
        missing = [n for n in W if n not in have]
        if missing:
            failures.append("gradients missing: %s" % ", ".join(missing))
        worst = (0.0, None)
        for n in have:
            gc, gr = tensors["grad." + n].astype(np.float64), grads_ref[n]
            if gc.shape != gr.shape:
                failures.append("grad.%s: shape %r, expected %r" % (n, gc.shape, gr.shape))
                continue
            nr = np.linalg.norm(gr)
            err = np.linalg.norm(gc - gr) / nr if nr > 0 else np.linalg.norm(gc)
            mx = np.abs(gc - gr).max() / max(np.abs(gr).max(), 1e-300)
            comment("grad %-45s rel %.2e  (max |diff| / max |g| %.2e)" % (n, err, mx))
            tol = STORIES_GRAD_TOL if case == "stories260k" else TOL
            if not err <= tol:
                failures.append("grad.%s: relative error %.3g > %g" % (n, err, tol))
            if err > worst[0]:
                worst = (err, n)
        comment("worst gradient relative error %.2e (%s)" % worst)
    check(not failures, "\n".join(failures))


def stories_reference():
    cfg, w = R.load_llama2c(STORIES)
    return cfg, w


def test_stories_weights():
    cfg_c, tensors, meta = dump("stories260k")
    cfg, w = stories_reference()
    for k in R.CFG_TYPES:
        if k.startswith("rope_") and k != "rope_theta" and cfg["rope_scaling"] == "none":
            continue
        same = abs(cfg_c[k] - cfg[k]) <= 1e-6 * abs(cfg[k]) if R.CFG_TYPES[k] is float else cfg_c[k] == cfg[k]
        check(same, "cfg %s: dumped %r, the file says %r" % (k, cfg_c[k], cfg[k]))
    hf = R.llama2c_to_hf(w, cfg)
    bad = []
    for n, ref in hf.items():
        check(n in tensors, "%s missing from the dump" % n)
        got = tensors[n]
        if got.shape != ref.shape or not np.array_equal(got.astype(np.float64), ref):
            diff = np.abs(got.astype(np.float64) - ref).max() if got.shape == ref.shape else float("nan")
            bad.append("%s (max |diff| %.3g)" % (n, diff))
            if n.endswith(("q_proj.weight", "k_proj.weight")) and got.shape == ref.shape:
                li = int(n.split(".")[2])
                raw = w["wq" if "q_proj" in n else "wk"][li]
                if np.array_equal(got.astype(np.float64), raw):
                    bad[-1] += ": the rows are not permuted (llama2.c order)"
    check(not bad, "dumped weights differ from llama2c_to_hf(stories260K.bin):\n" + "\n".join(bad))


def test_stories_generated():
    cfg_c, tensors, meta = dump("stories260k")
    check("generated" in tensors, "'generated' missing from the dump")
    gen = [int(t) for t in tensors["generated"].reshape(-1)]
    cfg, w = stories_reference()
    with_bos = len(gen) > 0 and gen[0] == BOS
    n = len(gen) if with_bos else len(gen) + 1
    mine, logits = R.greedy_generate_llama2c(cfg, w, BOS, n, return_logits=True)
    mine_cmp = mine if with_bos else mine[1:]
    comment("C generated %d tokens (%s BOS): %s ..."
            % (len(gen), "with" if with_bos else "without", " ".join(map(str, gen[:30]))))
    if gen == mine_cmp:
        return
    m = min(len(gen), len(mine_cmp))  # equal lengths by construction
    k = next(i for i in range(m) if gen[i] != mine_cmp[i])
    step = k if with_bos else k + 1  # index into mine
    z = logits[step - 1]
    order = np.argsort(-z)
    gap = z[order[0]] - z[order[1]]
    msg = ("generated tokens differ from the reference at index %d: C %r, reference %r (reference top-2 %d, %d, "
           "logit gap %.3g)" % (k, gen[k] if k < len(gen) else None, mine_cmp[k] if k < len(mine_cmp) else None,
                                order[0], order[1], gap))
    if k < len(gen) and gen[k] == int(order[1]) and gap < 1e-4:
        comment(msg + ": a near-tie float32 can flip; the prefix before it agrees")
        return
    raise AssertionError(msg)


def test_stories_loss():
    cfg_c, tensors, meta = dump("stories260k")
    tokens, targets, positions, doc = batch_of(cfg_c, tensors)
    N = len(tokens)
    check(np.array_equal(positions, np.arange(N)) and (doc == doc[0]).all(),
          "the stories260k batch should be one document at positions 0..N-1")
    if "generated" in tensors:
        gen = [int(t) for t in tensors["generated"].reshape(-1)]
        full = gen if gen and gen[0] == BOS else [BOS] + gen
        check(list(tokens) == full[:N], "batch.tokens is not the generated sequence")
        lab = np.nonzero(targets >= 0)[0]
        check(all(i + 1 < len(full) and targets[i] == full[i + 1] for i in lab),
              "batch.targets are not the next generated tokens")
    cfg, w = stories_reference()
    ref = R.forward_loss_llama2c(cfg, w, tokens, targets)
    loss_c = float(tensors["result.loss"].reshape(-1)[0])
    rel = abs(loss_c - ref) / abs(ref)
    comment("stories260k loss on %d tokens: C %.9g, reference (llama2.c interleaved path) %.12g, relative error %.2e"
            % (N, loss_c, ref, rel))
    check(rel <= TOL, "loss relative error %.3g > %g" % (rel, TOL))


CASES = ["tiny", "tiny-tied", "tiny-llama3rope", "tiny-mha", "stories260k"]
TESTS = [("%s: loss and every gradient = float64 reference" % c, (lambda c=c: compare_case(c))) for c in CASES] + [
    ("stories260k: dumped weights = llama2c_to_hf(stories260K.bin)", test_stories_weights),
    ("stories260k: generated tokens = reference greedy generation from BOS", test_stories_generated),
    ("stories260k: loss = llama2.c interleaved-RoPE path", test_stories_loss),
]


def main():
    print("1..%d" % len(TESTS))
    comment("dump_model: %s" % DUMP)
    failed = 0
    for n, (name, fn) in enumerate(TESTS, 1):
        try:
            if isinstance(np, Exception):
                raise np
            fn()
            print("ok %d - %s" % (n, name))
        except Skip as e:
            print("ok %d # SKIP %s" % (n, e))
            print("# skip: %s" % e)  # test/run.sh lists these lines once each
        except Exception:
            failed += 1
            print("not ok %d - %s" % (n, name))
            comment(traceback.format_exc())
        sys.stdout.flush()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
