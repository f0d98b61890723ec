#!/usr/bin/env python3
"""test/test_rope_scaling.py - wlbtrain's RoPE tables for model.rope_scaling none, llama3, linear and
yarn against a numpy port of transformers' formulas (modeling_rope_utils: _compute_default_rope_parameters,
_compute_linear_scaling_rope_parameters, _compute_llama3_parameters, _compute_yarn_parameters),
computed here in float64.

The C side is $WLB_TEST_BIN_DIR/dump_rope (test/dump_rope.c): the frequencies model_rope_table makes,
the factor cos and sin are multiplied by, and the CPU backend's rope_fwd applied to a head of ones
and zeros at each position (so scale cos(angle), scale sin(angle)).

1-4 for each scaling, over a grid of settings (theta, head_dim, factor, and per type low/high
    frequency factors, original context, beta_fast/beta_slow, truncate, attention factor):
    every frequency and the factor within 1 ulp of float32 of the port's; scale cos and scale sin at
    positions 0 to 131072 within 1 ulp of float32 of the float64 values at the table's own frequencies
    (the angle of a float32 frequency times the position, as the kernels take it in double).
5   the types differ where they should: llama3 keeps the high frequencies and divides the low ones
    by the factor, linear divides all, yarn's factor is 0.1 ln s + 1 (so a table that ignored the
    scaling would fail 1-4).
6   with torch (WLB_HF_PYTHON; skipped otherwise): the port = transformers' own functions
    (ROPE_INIT_FUNCTIONS, LlamaRotaryEmbedding's default) over the same grid, the frequencies within
    32 ulp (transformers computes them in float32), the attention factor exactly.

Environment: WLB_TEST_BIN_DIR (default build/release/test), WLB_HF_PYTHON. Output: TAP.
"""
import itertools
import json
import math
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
BIN_DIR = os.environ.get("WLB_TEST_BIN_DIR") or os.path.join(REPO, "build/release/test")
DUMP = os.path.join(BIN_DIR, "dump_rope")
HF_PYTHON = os.environ.get("WLB_HF_PYTHON") or sys.executable
POSITIONS = [0, 1, 2, 3, 7, 100, 1000, 4095, 8191, 8192, 10000, 32767, 65536, 100000, 100063, 131071, 131072]

from taplib import Skip, check, comment, import_numpy, require, run_tests  # noqa: E402

np = import_numpy()
if not isinstance(np, Exception):
    import ref_llama as R


def hf_inv_freq(s):
    """(inv_freq, attention_factor) as transformers computes them, in float64."""
    dim, base = s["head_dim"], s["theta"]
    inv = 1.0 / (base ** (np.arange(0, dim, 2, dtype=np.float64) / dim))
    kind = s["scaling"]
    if kind == "none":
        return inv, 1.0
    factor = s["factor"]
    if kind == "linear":
        return inv / factor, 1.0
    if kind == "llama3":
        low, high, old = s["low"], s["high"], s["original"]
        low_wl, high_wl = old / low, old / high
        wavelen = 2 * math.pi / inv
        inv_l = np.where(wavelen > low_wl, inv / factor, inv)
        smooth = (old / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * inv_l / factor + smooth * inv_l
        medium = ~(wavelen < high_wl) * ~(wavelen > low_wl)
        return np.where(medium, smoothed, inv_l), 1.0
    assert kind == "yarn"
    att = s["attention"] or None
    if att is None:
        att = 1.0 if factor <= 1 else 0.1 * math.log(factor) + 1.0

    def correction_dim(rot):
        return (dim * math.log(s["original"] / (rot * 2 * math.pi))) / (2 * math.log(base))

    lo, hi = correction_dim(s["beta_fast"]), correction_dim(s["beta_slow"])
    if s["truncate"]:
        lo, hi = math.floor(lo), math.ceil(hi)
    lo, hi = max(lo, 0), min(hi, dim - 1)
    if lo == hi:
        hi += 0.001
    ramp = np.clip((np.arange(dim // 2, dtype=np.float64) - lo) / (hi - lo), 0, 1)
    pos_freqs = base ** (np.arange(0, dim, 2, dtype=np.float64) / dim)
    extra, inter = 1.0 / pos_freqs, 1.0 / (factor * pos_freqs)
    extra_factor = 1 - ramp
    return inter * (1 - extra_factor) + extra * extra_factor, att


def grid(kind):
    base = [dict(theta=t, head_dim=d) for t, d in itertools.product([10000.0, 500000.0, 1e6], [64, 128])]
    if kind == "none":
        return [dict(b, scaling="none") for b in base]
    if kind == "linear":
        return [dict(b, scaling="linear", factor=f) for b in base for f in (2.0, 4.0, 8.0)]
    if kind == "llama3":
        return [dict(b, scaling="llama3", factor=f, low=lo, high=hi, original=o) for b in base
                for f, (lo, hi), o in itertools.product((8.0, 32.0), ((1.0, 4.0), (2.0, 8.0)), (8192, 4096))]
    return [dict(b, scaling="yarn", factor=f, original=o, beta_fast=bf, beta_slow=bs, truncate=tr, attention=a)
            for b in base for f, o, (bf, bs), tr, a in itertools.product(
                (4.0, 16.0), (4096, 8192), ((32.0, 1.0), (16.0, 2.0)), (True, False), (0.0, 1.5))]


def dump(fx, s):
    out = os.path.join(fx, "rope.safetensors")
    args = [DUMP, out] + ["%s=%s" % (k, int(v) if isinstance(v, bool) else v) for k, v in s.items()]
    args.append("positions=" + ",".join(str(p) for p in POSITIONS))
    r = subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True)
    check(r.returncode == 0, "dump_rope: %s" % r.stderr)
    t, _ = R.load_safetensors(out)
    return t


def ulps(got, want):
    """|got - want| in units of the float32 spacing at want (at least the smallest normal's)."""
    want32 = np.asarray(want, dtype=np.float32)
    spacing = np.maximum(np.spacing(np.abs(want32)), np.finfo(np.float32).tiny).astype(np.float64)
    return np.abs(np.asarray(got, dtype=np.float64) - np.asarray(want, dtype=np.float64)) / spacing


def check_kind(fx, kind):
    worst = [0.0, 0.0, 0.0]
    settings = grid(kind)
    for s in settings:
        t = dump(fx, s)
        inv, att = hf_inv_freq(s)
        e = ulps(t["inv_freq"], inv).max()
        check(e <= 1, "%r: a frequency %.2f ulp from transformers'" % (s, e))
        e2 = ulps(t["scale"][0], att)
        check(e2 <= 1, "%r: attention factor %r, transformers' %r" % (s, float(t["scale"][0]), att))
        # the rotation the kernel applies, at the table's own (float32) frequencies
        ang = np.array(POSITIONS, dtype=np.float64)[:, None] * t["inv_freq"].astype(np.float64)[None, :]
        scale = float(t["scale"][0])
        e3 = max(ulps(t["cos"], scale * np.cos(ang)).max(), ulps(t["sin"], scale * np.sin(ang)).max())
        check(e3 <= 1, "%r: cos or sin %.2f ulp off at positions up to %d" % (s, e3, POSITIONS[-1]))
        worst = [max(worst[0], e), max(worst[1], float(e2)), max(worst[2], e3)]
    comment("%s: %d settings; worst frequency %.3f ulp, factor %.3f ulp, cos/sin %.3f ulp"
            % (kind, len(settings), worst[0], worst[1], worst[2]))


def test_none(fx):
    check_kind(fx, "none")


def test_linear(fx):
    check_kind(fx, "linear")


def test_llama3(fx):
    check_kind(fx, "llama3")


def test_yarn(fx):
    check_kind(fx, "yarn")


def test_types_differ(fx):
    s = dict(theta=500000.0, head_dim=128)
    plain = dump(fx, dict(s, scaling="none"))["inv_freq"]
    l3 = dump(fx, dict(s, scaling="llama3", factor=8.0, low=1.0, high=4.0, original=8192))["inv_freq"]
    kept, divided = plain == l3, np.isclose(l3, plain / 8, rtol=1e-6)
    comment("llama3 factor 8 at theta 500000, head_dim 128: %d frequencies kept, %d divided by 8, %d blended"
            % (kept.sum(), divided.sum(), (~kept & ~divided).sum()))
    check(kept.sum() == 29 and divided.sum() == 29, "not Llama 3.1's 29 kept, 6 blended, 29 divided")
    lin = dump(fx, dict(s, scaling="linear", factor=4.0))["inv_freq"]
    check(np.allclose(lin, plain / 4, rtol=1e-6, atol=0), "linear: not every frequency divided by 4")
    y = dump(fx, dict(s, scaling="yarn", factor=16.0, original=8192, beta_fast=32.0, beta_slow=1.0, truncate=True,
                      attention=0.0))
    check(abs(y["scale"][0] - (0.1 * math.log(16) + 1)) < 1e-6, "yarn: attention factor %r" % y["scale"][0])
    check(y["inv_freq"][0] == plain[0] and abs(y["inv_freq"][-1] - plain[-1] / 16) <= 1e-6 * plain[-1] / 16,
          "yarn: the highest frequency not kept or the lowest not divided")


HF_ROPE = r"""
import json, sys
from transformers import LlamaConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
out = []
for s in json.loads(sys.argv[1]):
    rp = {"rope_theta": s["theta"], "rope_type": "default" if s["scaling"] == "none" else s["scaling"]}
    if s["scaling"] != "none":
        rp["factor"] = s["factor"]
    if s["scaling"] == "llama3":
        rp.update(low_freq_factor=s["low"], high_freq_factor=s["high"], original_max_position_embeddings=s["original"])
    if s["scaling"] == "yarn":
        rp.update(original_max_position_embeddings=s["original"], beta_fast=s["beta_fast"], beta_slow=s["beta_slow"],
                  truncate=s["truncate"])
        if s["attention"]:
            rp["attention_factor"] = s["attention"]
    c = LlamaConfig(hidden_size=4 * s["head_dim"], num_attention_heads=4, head_dim=s["head_dim"],
                    max_position_embeddings=int(s.get("original", 8192) * s.get("factor", 1)), rope_parameters=rp)
    if s["scaling"] == "none":
        inv, att = LlamaRotaryEmbedding.compute_default_rope_parameters(c)
    else:
        inv, att = ROPE_INIT_FUNCTIONS[s["scaling"]](c, "cpu")
    out.append([inv.double().tolist(), float(att)])
print(json.dumps(out))
"""
HF_ULPS = 32


def test_port_is_transformers(fx):
    """With torch (WLB_HF_PYTHON; skipped otherwise): the numpy port above = transformers' own
    functions over the whole grid: the frequencies within HF_ULPS ulp of float32 (transformers computes
    them in float32: its ramps and blends round several times), the attention factor exactly."""
    settings = [s for kind in ("none", "linear", "llama3", "yarn") for s in grid(kind)]
    r = subprocess.run([HF_PYTHON, "-c", "import torch, transformers"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    if r.returncode != 0:
        raise Skip("torch and transformers are not importable by %s (set WLB_HF_PYTHON to a python that has them)"
                   % HF_PYTHON)
    r = subprocess.run([HF_PYTHON, "-c", HF_ROPE, json.dumps(settings)], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, universal_newlines=True)
    check(r.returncode == 0, "transformers' RoPE functions: %s" % r.stderr[-3000:])
    worst = {}
    for s, (inv, att) in zip(settings, json.loads(r.stdout.strip().splitlines()[-1])):
        want, want_att = hf_inv_freq(s)
        e = ulps(np.array(inv), want).max()
        check(e <= HF_ULPS, "%r: transformers' frequencies %.1f ulp from the port's" % (s, e))
        check(att == want_att, "%r: transformers' attention factor %r, the port's %r" % (s, att, want_att))
        worst[s["scaling"]] = max(worst.get(s["scaling"], 0.0), e)
    comment("transformers' own RoPE functions against the port, %d settings: worst %s ulp"
            % (len(settings), ", ".join("%s %.2f" % kv for kv in worst.items())))


TESTS = [("rope_scaling none: frequencies and rotations = transformers' within 1 ulp", test_none),
         ("rope_scaling linear: the same over a grid of factors", test_linear),
         ("rope_scaling llama3: the same over a grid of factors, low/high, original context", test_llama3),
         ("rope_scaling yarn: the same over a grid (factor, original, betas, truncate, attention factor)", test_yarn),
         ("the scalings change the table as they should (29 kept, 29 divided for Llama 3.1)", test_types_differ),
         ("with torch: the numpy port = transformers' own RoPE functions over the grid", test_port_is_transformers)]


if __name__ == "__main__":
    sys.exit(run_tests(TESTS, lambda: require(np, DUMP) or tempfile.mkdtemp(prefix="wlbrope-"),
                       lambda d: subprocess.run(["rm", "-rf", d])))
