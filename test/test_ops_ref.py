#!/usr/bin/env python3
"""test/test_ops_ref.py - every operation of the CPU backend against float64 numpy, op by op.

$WLB_TEST_BIN_DIR/dump_ops (test/dump_ops.c) runs each op of cpu_ops() on seeded inputs and writes
inputs and results; here each result is recomputed from the operation's mathematical definition
(engine/ops.h states the contracts; the formulas below are written from the math, not from the C
code), and every backward formula used here is itself checked against central finite differences of
its forward in float64 before the C results are compared with it. A result passes when
max |C - reference| / max |reference| <= 1e-5 (float32 arithmetic on inputs of order 1); each
error is printed as a TAP comment. Complements test_model_ref.py, which checks the whole model:
here a wrong op shows by name, also where the model's tolerance would hide it (RMSNorm's eps is
checked with rows so small that eps dominates).

Environment: WLB_TEST_BIN_DIR (default build/release/test). Output: TAP.
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
BIN_DIR = os.environ.get("WLB_TEST_BIN_DIR") or os.path.join(REPO, "build/release/test")
DUMP = os.path.join(BIN_DIR, "dump_ops")
TOL = 1e-5

from taplib import Skip, check, comment, import_numpy, missing  # noqa: E402

np = import_numpy()
if not isinstance(np, Exception):
    import ref_llama as R  # only its safetensors reader

_dump = []


def dump():
    """(tensors, metadata) of one run of dump_ops."""
    if not _dump:
        if not os.path.exists(DUMP):
            raise missing("the C tool is not built yet: %s (make test builds it; WLB_TEST_BIN_DIR points elsewhere)"
                          % DUMP)
        tmp = tempfile.mkdtemp(prefix="wlb_ops_ref.")
        atexit.register(shutil.rmtree, tmp, True)
        out = os.path.join(tmp, "ops.safetensors")
        r = subprocess.run([DUMP, out], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=300)
        check(r.returncode == 0, "dump_ops exited with %d: %s" % (r.returncode, r.stdout.decode(errors="replace")))
        _dump.append(R.load_safetensors(out))
    return _dump[0]


def case(name):
    """The tensors of CASE as float64 (integers as int64), and its metadata as floats."""
    tensors, meta = dump()
    t = {k[len(name) + 1:]: (v.astype(np.int64) if v.dtype.kind == "i" else v.astype(np.float64))
         for k, v in tensors.items() if k.startswith(name + ".")}
    m = {k[len(name) + 1:]: float(v) for k, v in meta.items() if k.startswith(name + ".")}
    check(t, "no tensors of case %s in the dump" % name)
    return t, m


def compare(what, got, ref, tol=TOL):
    got, ref = np.asarray(got, dtype=np.float64), np.asarray(ref, dtype=np.float64)
    check(got.shape == ref.shape, "%s: shape %r, reference %r" % (what, got.shape, ref.shape))
    scale = np.abs(ref).max()
    err = np.abs(got - ref).max() / (scale if scale > 0 else 1.0)
    comment("%-28s relative error %.2e" % (what, err))
    check(err <= tol, "%s: relative error %.3g > %g" % (what, err, tol))


def fd_check(what, f, inputs, dout, grads, h=1e-6):
    """The reference backward against central differences of the forward f(*inputs) (float64): along
    a random direction d, sum(dout * (f(x + h d) - f(x - h d)) / 2h) must equal sum(grad * d)."""
    rng = np.random.default_rng(7)
    dirs = [rng.standard_normal(x.shape) for x in inputs]
    plus = f(*[x + h * d for x, d in zip(inputs, dirs)])
    minus = f(*[x - h * d for x, d in zip(inputs, dirs)])
    fd = float((dout * (plus - minus)).sum() / (2 * h))
    an = float(sum((g * d).sum() for g, d in zip(grads, dirs)))
    check(abs(fd - an) <= 1e-6 * max(1.0, abs(an)),
          "reference %s: backward %.12g, finite differences %.12g" % (what, an, fd))


# ---------------------------------------------------------------------------------------------
# The operations, from their definitions.

def sigmoid(x):
    return 0.5 * (1 + np.tanh(x / 2))  # = 1 / (1 + exp(-x)), without overflow


def rmsnorm(x, w, eps):
    r = 1 / np.sqrt((x * x).mean(axis=1, keepdims=True) + eps)
    return x * r * w, r[:, 0]


def rmsnorm_backward(x, w, eps, dy):
    """y_j = w_j x_j r, r = (mean(x^2) + eps)^(-1/2), dr/dx_j = -r^3 x_j / d."""
    d = x.shape[1]
    r = 1 / np.sqrt((x * x).mean(axis=1, keepdims=True) + eps)
    dx = r * w * dy - r ** 3 * x / d * (dy * w * x).sum(axis=1, keepdims=True)
    dw = (dy * x * r).sum(axis=0)
    return dx, dw


def rope(x, positions, inv_freq, n_heads, inverse=False):
    """Hugging Face's rotate_half: in every head, element i and i + half turn by positions * inv_freq[i]."""
    T, width = x.shape
    hd = width // n_heads
    half = hd // 2
    ang = positions[:, None].astype(np.float64) * inv_freq[None, :].astype(np.float64)
    if inverse:
        ang = -ang
    c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    xh = x.reshape(T, n_heads, hd)
    a, b = xh[..., :half], xh[..., half:]
    return np.concatenate([a * c - b * s, b * c + a * s], axis=-1).reshape(T, width)


def attention(q, k, v, segments, H, Hkv):
    """Per segment (q_row, q_len, kv_row, kv_len): query i sees keys kv_row .. kv_row + kv_len - q_len + i;
    query head h reads key/value head h // (H / Hkv); scores scaled by 1 / sqrt(head_dim).
    Returns out, lse [rows, H], and the probabilities per segment and head (for the backward)."""
    hd = q.shape[1] // H
    out, lse = np.zeros_like(q), np.zeros((q.shape[0], H))
    probs = []
    for (qr, ql, kr, kl) in segments:
        mask = np.arange(kl)[None, :] <= (kl - ql) + np.arange(ql)[:, None]
        for h in range(H):
            g = h // (H // Hkv)
            qs = q[qr:qr + ql, h * hd:(h + 1) * hd]
            ks, vs = k[kr:kr + kl, g * hd:(g + 1) * hd], v[kr:kr + kl, g * hd:(g + 1) * hd]
            z = np.where(mask, qs @ ks.T / np.sqrt(hd), -np.inf)
            m = z.max(axis=1, keepdims=True)
            e = np.exp(z - m)
            p = e / e.sum(axis=1, keepdims=True)
            out[qr:qr + ql, h * hd:(h + 1) * hd] = p @ vs
            lse[qr:qr + ql, h] = (m + np.log(e.sum(axis=1, keepdims=True)))[:, 0]
            probs.append(p)
    return out, lse, probs


def attention_backward(q, k, v, segments, H, Hkv, dout):
    """dV = P^T dO; dP = dO V^T; dS = P (dP - rowsum(P dP)); dQ = dS K / sqrt(hd); dK = dS^T Q / sqrt(hd);
    contributions of every segment summed (segments may share keys)."""
    hd = q.shape[1] // H
    _, _, probs = attention(q, k, v, segments, H, Hkv)
    dq, dk, dv = np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)
    i = 0
    for (qr, ql, kr, kl) in segments:
        for h in range(H):
            g = h // (H // Hkv)
            p = probs[i]
            i += 1
            qs = q[qr:qr + ql, h * hd:(h + 1) * hd]
            ks, vs = k[kr:kr + kl, g * hd:(g + 1) * hd], v[kr:kr + kl, g * hd:(g + 1) * hd]
            do = dout[qr:qr + ql, h * hd:(h + 1) * hd]
            dp = do @ vs.T
            ds = p * (dp - (p * dp).sum(axis=1, keepdims=True))
            dq[qr:qr + ql, h * hd:(h + 1) * hd] += ds @ ks / np.sqrt(hd)
            dk[kr:kr + kl, g * hd:(g + 1) * hd] += ds.T @ qs / np.sqrt(hd)
            dv[kr:kr + kl, g * hd:(g + 1) * hd] += p.T @ do
    return dq, dk, dv


def swiglu(g, u):
    return g * sigmoid(g) * u


def swiglu_backward(g, u, dout):
    s = sigmoid(g)
    return dout * u * (s + g * s * (1 - s)), dout * g * s


# ---------------------------------------------------------------------------------------------
# The tests.

def test_embedding():
    t, m = case("embedding")
    row0, table, tokens = int(m["row0"]), t["table"], t["tokens"]
    rows = table.shape[0]
    ref = np.zeros_like(t["out"])
    dtable = t["dtable_before"].copy()
    for i, tok in enumerate(tokens):
        if row0 <= tok < row0 + rows:
            ref[i] = table[tok - row0]
            dtable[tok - row0] += t["dout"][i]
    compare("embedding forward", t["out"], ref)
    compare("embedding backward (+=)", t["dtable"], dtable)


def check_rmsnorm(name):
    t, m = case(name)
    x, w, eps, dy = t["x"], t["w"], m["eps"], t["dout"]
    y, r = rmsnorm(x, w, eps)
    dx, dw = rmsnorm_backward(x, w, eps, dy)
    fd_check("rmsnorm", lambda x_, w_: rmsnorm(x_, w_, eps)[0], [x, w], dy, [dx, dw])
    comment("eps %g, mean(x^2) of the rows %.3g .. %.3g" % (eps, (x * x).mean(axis=1).min(), (x * x).mean(axis=1).max()))
    compare(name + " out", t["out"], y)
    compare(name + " rstd", t["rstd"], r)
    compare(name + " dx (+=)", t["dx"], t["dx_before"] + dx)
    compare(name + " dx in the compute dtype", t["dx_act"], t["dx"], tol=0)
    compare(name + " dw (+=)", t["dw"], t["dw_before"] + dw)


def test_matmul():
    t, _ = case("matmul")
    x, w, dy = t["x"], t["w"], t["dout"]
    compare("matmul forward x W^T", t["out"], x @ w.T)
    compare("matmul forward c + x W^T", t["out_plus"], t["addend"] + x @ w.T)
    compare("matmul dx = dout W", t["dx"], dy @ w)
    compare("matmul dx += dout W", t["dx_acc"], t["dx_acc_before"] + dy @ w)
    compare("matmul dW += dout^T x (twice)", t["dw"], t["dw_before"] + 2 * dy.T @ x)


def test_rope():
    """Rows of heads + 1 heads: the first `heads` rotate, the last (v in a fused row) stays."""
    t, m = case("rope")
    heads = int(m["n_heads"])
    x = t["x"]
    hd = 2 * t["inv_freq"].shape[0]
    rot = heads * hd
    ref = x.copy()
    ref[:, :rot] = rope(x[:, :rot], t["positions"], t["inv_freq"], heads)
    back = x.copy()
    back[:, :rot] = rope(x[:, :rot], t["positions"], t["inv_freq"], heads, inverse=True)
    check(np.allclose(rope(ref[:, :rot], t["positions"], t["inv_freq"], heads, inverse=True), x[:, :rot], atol=1e-12),
          "reference rope: the inverse does not undo the rotation")
    comment("positions %s" % [int(p) for p in t["positions"]])
    compare("rope", t["out"], ref)
    compare("rope backward (inverse rotation)", t["inverse"], back)
    compare("rope leaves the last head", t["out"][:, rot:], x[:, rot:], tol=0)


def check_attention(name):
    t, m = case(name)
    H, Hkv = int(m["n_heads"]), int(m["n_kv_heads"])
    q, k, v, dout = t["q"], t["k"], t["v"], t["dout"]
    segments = [tuple(int(x) for x in s) for s in t["segments"]]
    out, lse, _ = attention(q, k, v, segments, H, Hkv)
    dq, dk, dv = attention_backward(q, k, v, segments, H, Hkv, dout)
    fd_check("attention", lambda q_, k_, v_: attention(q_, k_, v_, segments, H, Hkv)[0], [q, k, v], dout,
             [dq, dk, dv])
    comment("segments (q_row, q_len, kv_row, kv_len): %s; %d heads, %d kv heads" % (segments, H, Hkv))
    compare(name + " out", t["out"], out)
    rows = sorted({r for (qr, ql, _, _) in segments for r in range(qr, qr + ql)})
    compare(name + " lse", t["lse"][rows], lse[rows])
    compare(name + " dq", t["dq"], dq)
    compare(name + " dk", t["dk"], dk)
    compare(name + " dv", t["dv"], dv)


def test_swiglu():
    t, _ = case("swiglu")
    g, u, dout = t["gate"], t["up"], t["dout"]
    dg, du = swiglu_backward(g, u, dout)
    fd_check("swiglu", swiglu, [g, u], dout, [dg, du])
    compare("swiglu forward", t["out"], swiglu(g, u))
    compare("swiglu dgate", t["dgate"], dg)
    compare("swiglu dup", t["dup"], du)


def test_cross_entropy():
    t, m = case("ce")
    z, targets, vocab0, dloss = t["logits"], t["targets"], int(m["vocab0"]), m["dloss"]
    T, V = z.shape
    compare("ce row max", t["row_max"], z.max(axis=1), tol=0)
    compare("ce row sum of exp(z - max)", t["row_sumexp"], np.exp(z - t["row_max"][:, None]).sum(axis=1))
    inside = (targets >= vocab0) & (targets < vocab0 + V)
    zt = np.where(inside, z[np.arange(T), np.clip(targets - vocab0, 0, V - 1)], 0.0)
    compare("ce target logit", t["target_logit"], zt, tol=0)
    # d loss / d z of loss = dloss (lse - z_target), lse given: softmax - one-hot at the target.
    lse = t["lse"]
    ref = dloss * np.exp(z - lse[:, None])
    ref[np.arange(T)[inside], (targets - vocab0)[inside]] -= dloss
    ref[targets < 0] = 0
    fd_check("cross-entropy", lambda z_: dloss * (np.log(np.exp(z_).sum(axis=1)) - np.where(
        inside, z_[np.arange(T), np.clip(targets - vocab0, 0, V - 1)], 0.0)), [z], np.ones(T),
        [dloss * (np.exp(z - np.log(np.exp(z).sum(axis=1))[:, None]) - np.where(
            np.arange(V)[None, :] == (targets - vocab0)[:, None], 1.0, 0.0))])
    comment("targets %s, slice [%d, %d)" % ([int(x) for x in targets], vocab0, vocab0 + V))
    compare("ce gradient", t["dlogits"], ref)


def test_rows():
    t, _ = case("rows")
    rows, src = t["rows"], t["src"]
    compare("gather rows", t["gathered"], src[rows], tol=0)
    ref = t["dst_before"].copy()
    ref[rows] = src[rows]
    compare("scatter rows", t["scattered"], ref, tol=0)


def test_vec():
    t, m = case("vec")
    a, b = t["a"], t["b"]
    compare("add", t["add"], a + b)
    compare("add in place", t["add_inplace"], a + b)
    compare("copy", t["copy"], b, tol=0)
    check(not t["zero"].any(), "zero left %d nonzero" % np.count_nonzero(t["zero"]))
    compare("sum of squares", t["sum_squares"], [(a * a).sum()], tol=1e-12)


def test_adamw():
    t, m = case("adamw")
    p, mm, vv = t["p_before"], t["m_before"], t["v_before"]
    g = t["g"] * m["grad_scale"]  # the clipping scale, applied to the gradient first
    mm = m["beta1"] * mm + (1 - m["beta1"]) * g
    vv = m["beta2"] * vv + (1 - m["beta2"]) * g * g
    # Decoupled weight decay (Loshchilov & Hutter; PyTorch's AdamW), per element from its span, then
    # the bias-corrected step.
    p = p * (1 - m["lr"] * t["weight_decay"])
    p = p - m["lr"] * (mm / m["bias1"]) / (np.sqrt(vv / m["bias2"]) + m["eps"])
    compare("adamw m", t["m"], mm)
    compare("adamw v", t["v"], vv)
    compare("adamw p", t["p"], p)
    compare("adamw update", t["p"] - t["p_before"], p - t["p_before"], tol=1e-4)
    compare("adamw compute-dtype copy", t["p_act"], t["p"], tol=0)


TESTS = [("embedding forward and backward", test_embedding)] + [
    ("RMSNorm %s: forward, backward" % n[8:].replace("_", " "), (lambda n=n: check_rmsnorm(n)))
    for n in ("rmsnorm_small_eps", "rmsnorm_large_eps", "rmsnorm_tiny_rows")] + [
    ("matmul forward and backward", test_matmul),
    ("RoPE and its inverse", test_rope)] + [
    ("attention %s: forward, lse, backward" % n[10:], (lambda n=n: check_attention(n)))
    for n in ("attention_docs", "attention_cp")] + [
    ("SwiGLU forward and backward", test_swiglu),
    ("cross-entropy pieces on a vocabulary slice", test_cross_entropy),
    ("gather and scatter rows", test_rows),
    ("add, copy, zero, sum of squares", test_vec),
    ("AdamW step", test_adamw),
]


def main():
    print("1..%d" % len(TESTS))
    comment("dump_ops: %s" % DUMP)
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
