#!/usr/bin/env python3
"""test/test_export.py - `wlbtrain export`: a checkpoint as a Hugging Face model folder.

A tiny model (grouped-query heads, tied embeddings, Llama 3.1 RoPE scaling) trains 2 steps with a
checkpoint, then is exported in float32 and bfloat16.
1   config.json is the LlamaConfig of the model (every field transformers reads).
2   float32: every tensor of the checkpoint (rebuilt here from the shard files' sections and the blocks
    index.json names), under the same name and shape, bit for bit.
    The same for a checkpoint of 4 ranks (tp 2, pp 2; when mpirun is there): 4 shard files; and for
    one of 3 layers split [2, 1] over 2 pipeline stages (parallel.stage_layers): the Hugging Face model
    of 3 layers, whatever stage held them.
3   bfloat16: every tensor rounded to nearest even (recomputed here), dtype BF16.
4   transformers: LlamaForCausalLM.from_pretrained loads the float32 folder and its logits on a
    sequence equal the float64 numpy reference (ref_llama, itself checked against the C model)
    within 1e-4 relative. Needs torch and transformers in the python of $WLB_HF_PYTHON (default
    this one); skipped with that reason when they are missing.
5   errors: a missing checkpoint, a corrupted config.yaml, a malformed index.json (11 kinds, each
    given a matching checksum, computed here as docs/checkpoints.md says): one error line, exit status
    2, the output folder left as it was (or not made). 40 random one-digit edits of index.json (seeded):
    every one refused (its checksum), and the checksum this script computes equals the one wlbtrain wrote.
6   --checkpoint takes the checkpoint folder (trailing slash or not), its latest file (also as a
    relative path), a step folder: the same model.safetensors; another file, or a folder holding no
    checkpoint, is one error line.

Environment: WLBTRAIN (default ./wlbtrain), WLB_HF_PYTHON. Output: TAP.
"""
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
WLBTRAIN = os.environ.get("WLBTRAIN") or os.path.join(REPO, "wlbtrain")
HF_PYTHON = os.environ.get("WLB_HF_PYTHON") or sys.executable

from taplib import Skip, check, comment, import_numpy, require, run_tests  # noqa: E402

np = import_numpy()
if not isinstance(np, Exception):
    import ref_llama as R

MODEL = dict(n_layers=2, d_model=32, n_heads=4, n_kv_heads=2, d_ffn=64, vocab_size=320, rope_theta=500000.0,
             norm_eps=1e-5, tie_embeddings=True, rope_scaling="llama3", rope_scaling_factor=8.0,
             rope_low_freq_factor=1.0, rope_high_freq_factor=4.0, rope_original_max_seq_len=64)

CONFIG = """model: {n_layers: 2, d_model: 32, n_heads: 4, n_kv_heads: 2, d_ffn: 64, vocab_size: 320,
        rope_theta: 500000, norm_eps: 1.0e-5, tie_embeddings: true, max_seq_len: 256,
        rope_scaling: llama3, rope_scaling_factor: 8, rope_low_freq_factor: 1, rope_high_freq_factor: 4,
        rope_original_max_seq_len: 64}
parallel: {dp: 1}
data: {path: %(prefix)s, context_window: 128, global_batch_tokens: 256}
balance: {hardware: cpu}
train: {device: cpu, steps: 2, lr: 0.01, warmup_steps: 1}
checkpoint: {dir: %(ckpt)s}
"""

HF_SCRIPT = r"""
import json, sys, torch
from transformers import LlamaForCausalLM
model = LlamaForCausalLM.from_pretrained(sys.argv[1], torch_dtype=torch.float32)
model.eval()
tokens = json.loads(sys.argv[2])
with torch.no_grad():
    logits = model(torch.tensor([tokens])).logits[0].double().numpy()
print(json.dumps(logits.tolist()))
"""


def run(args, **kw):
    return subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True, **kw)


class Fixture:
    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="wlbexport-")
        text = os.path.join(self.dir, "doc.txt")
        with open(text, "w") as f:
            f.write("the quick brown fox jumps over the lazy dog. " * 40)
        prefix = os.path.join(self.dir, "docs")
        r = run([WLBTRAIN, "convert", "--quiet", "--out", prefix, text])
        check(r.returncode == 0, "convert failed: %s" % r.stderr)
        self.ckpt = os.path.join(self.dir, "ckpt")
        cfg = os.path.join(self.dir, "tiny.yaml")
        with open(cfg, "w") as f:
            f.write(CONFIG % {"prefix": prefix, "ckpt": self.ckpt})
        r = run([WLBTRAIN, "--config", cfg])
        check(r.returncode == 0, "training failed: %s%s" % (r.stdout, r.stderr))
        # The same on 4 ranks (tp 2, pp 2), when mpirun is there: a checkpoint of 4 shard files.
        self.ckpt4 = None
        if shutil.which("mpirun"):
            self.ckpt4 = os.path.join(self.dir, "ckpt4")
            r = run(["mpirun", "-np", "4", WLBTRAIN, "--config", cfg, "--set", "checkpoint.dir=" + self.ckpt4,
                     "--set", "parallel.tp=2", "--set", "parallel.pp=2"], timeout=300)
            check(r.returncode == 0, "training on 4 ranks failed: %s%s" % (r.stdout, r.stderr))
            self.out4 = os.path.join(self.dir, "hf4")
            r = run([WLBTRAIN, "export", "--checkpoint", self.ckpt4, "--out", self.out4])
            check(r.returncode == 0, "export failed: %s" % r.stderr)
            comment(r.stdout.strip())
            # 3 layers, 2 on the first stage and 1 on the last.
            self.ckpt_split = os.path.join(self.dir, "ckpt-split")
            r = run(["mpirun", "-np", "2", WLBTRAIN, "--config", cfg, "--set", "checkpoint.dir=" + self.ckpt_split,
                     "--set", "model.n_layers=3", "--set", "parallel.pp=2", "--set", "parallel.stage_layers=[2, 1]"],
                    timeout=300)
            check(r.returncode == 0, "training with layers [2, 1] failed: %s%s" % (r.stdout, r.stderr))
            self.out_split = os.path.join(self.dir, "hf-split")
            r = run([WLBTRAIN, "export", "--checkpoint", self.ckpt_split, "--out", self.out_split])
            check(r.returncode == 0, "export failed: %s" % r.stderr)
            comment(r.stdout.strip())
        self.out32 = os.path.join(self.dir, "hf32")
        self.out16 = os.path.join(self.dir, "hf16")
        for out, dtype in ((self.out32, "float32"), (self.out16, "bfloat16")):
            r = run([WLBTRAIN, "export", "--checkpoint", self.ckpt, "--out", out, "--dtype", dtype])
            check(r.returncode == 0, "export failed: %s" % r.stderr)
            comment(r.stdout.strip())


def test_config(fx):
    with open(os.path.join(fx.out32, "config.json")) as f:
        c = json.load(f)
    want = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 32,
            "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
            "head_dim": 8, "vocab_size": 320, "max_position_embeddings": 256, "rms_norm_eps": 1e-5,
            "rope_theta": 500000.0, "tie_word_embeddings": True, "hidden_act": "silu", "torch_dtype": "float32",
            "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                             "original_max_position_embeddings": 64}}
    for k, v in want.items():
        check(c.get(k) == v, "config.json %s = %r, want %r" % (k, c.get(k), v))


def step_dir(fx, ckpt=None):
    ckpt = ckpt or fx.ckpt
    with open(os.path.join(ckpt, "latest")) as f:
        return os.path.join(ckpt, f.read().strip())


def read_statefile(path):
    """The sections of a util/statefile.h file: {name: bytes}."""
    with open(path, "rb") as f:
        raw = f.read()
    check(raw[:8] == b"WLBSTATE", path + ": not a state file")
    n = int.from_bytes(raw[12:16], "little")
    out = {}
    for i in range(n):
        e = raw[24 + 56 * i:24 + 56 * (i + 1)]
        name = e[:32].rstrip(b"\0").decode()
        at, size = int.from_bytes(e[32:40], "little"), int.from_bytes(e[40:48], "little")
        out[name] = raw[at:at + size]
    return out


def checkpoint_tensors(step):
    """The full tensors of a sharded checkpoint, from index.json's blocks."""
    with open(os.path.join(step, "index.json")) as f:
        index = json.load(f)
    files = {name: read_statefile(os.path.join(step, name)) for name in index["files"]}
    out = {}
    for name, t in index["tensors"].items():
        shape = t["shape"]
        full = np.zeros((1 if len(shape) == 1 else shape[0], shape[-1]), dtype=np.float32)
        for b in t["blocks"]:
            vec = np.frombuffer(files[b["file"]][b["section"]], dtype=np.float32)
            n = b["rows"] * b["cols"]
            full[b["row0"]:b["row0"] + b["rows"], b["col0"]:b["col0"] + b["cols"]] = \
                vec[b["offset"]:b["offset"] + n].reshape(b["rows"], b["cols"])
        out[name] = full.reshape(shape)
    return out


def test_float32(fx):
    src = checkpoint_tensors(step_dir(fx))
    check(not os.path.exists(os.path.join(step_dir(fx), "model.safetensors")), "a gathered model.safetensors")
    out, _ = R.load_safetensors(os.path.join(fx.out32, "model.safetensors"))
    check(sorted(src) == sorted(out), "tensor names differ")
    check(sorted(out) == sorted(R.weight_names(MODEL)), "not the model's Hugging Face names")
    for n in src:
        check(out[n].dtype == np.float32 and out[n].shape == src[n].shape, n + ": dtype or shape")
        check(np.array_equal(out[n].view(np.uint32), src[n].view(np.uint32)), n + ": values differ")


def test_sharded(fx):
    if not fx.ckpt4:
        raise Skip("no mpirun")
    step = step_dir(fx, fx.ckpt4)
    check(sorted(f for f in os.listdir(step) if f.startswith("shard-")) ==
          ["shard-tp%d-pp%d-dpcp0.bin" % (t, p) for t in range(2) for p in range(2)], "not 4 shard files")
    src = checkpoint_tensors(step)
    out, _ = R.load_safetensors(os.path.join(fx.out4, "model.safetensors"))
    check(sorted(out) == sorted(R.weight_names(MODEL)), "not the model's Hugging Face names")
    for n in src:
        check(out[n].shape == src[n].shape, n + ": shape")
        check(np.array_equal(out[n].view(np.uint32), src[n].view(np.uint32)), n + ": values differ")
        check(np.isfinite(out[n]).all() and np.abs(out[n]).max() > 0, n + ": not trained weights")


def test_uneven_split(fx):
    if not fx.ckpt4:
        raise Skip("no mpirun")
    step = step_dir(fx, fx.ckpt_split)
    with open(os.path.join(step, "index.json")) as f:
        index = json.load(f)
    check(index["layout"]["stage_layers"] == [2, 1], "index.json: stage_layers %r" % index["layout"].get("stage_layers"))
    chunk_of = {b["chunk"] for b in index["tensors"]["model.layers.1.mlp.up_proj.weight"]["blocks"]}
    check(chunk_of == {0}, "layer 1 is not on the first stage: chunks %r" % chunk_of)
    chunk_of = {b["chunk"] for b in index["tensors"]["model.layers.2.mlp.up_proj.weight"]["blocks"]}
    check(chunk_of == {1}, "layer 2 is not on the last stage: chunks %r" % chunk_of)
    src = checkpoint_tensors(step)
    out, _ = R.load_safetensors(os.path.join(fx.out_split, "model.safetensors"))
    check(sorted(out) == sorted(R.weight_names(dict(MODEL, n_layers=3))), "not the 3-layer model's Hugging Face names")
    for n in src:
        check(np.array_equal(out[n].view(np.uint32), src[n].view(np.uint32)), n + ": values differ")
    with open(os.path.join(fx.out_split, "config.json")) as f:
        check(json.load(f)["num_hidden_layers"] == 3, "config.json: not 3 layers")


def test_bfloat16(fx):
    src = checkpoint_tensors(step_dir(fx))
    with open(os.path.join(fx.out16, "model.safetensors"), "rb") as f:
        raw = f.read()
    n_head = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n_head])
    for n, x in src.items():
        h = header[n]
        check(h["dtype"] == "BF16" and tuple(h["shape"]) == x.shape, n + ": dtype or shape")
        a, b = h["data_offsets"]
        got = np.frombuffer(raw[8 + n_head + a:8 + n_head + b], dtype=np.uint16)
        u = x.astype(np.float32).view(np.uint32).astype(np.uint64)
        want = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
        check(np.array_equal(got, want.ravel()), n + ": not float32 rounded to nearest even")


def test_transformers(fx):
    probe = run([HF_PYTHON, "-c", "import torch, transformers"])
    if probe.returncode != 0:
        raise Skip("torch and transformers are not importable by %s (set WLB_HF_PYTHON to a python that has them)"
                   % HF_PYTHON)
    tokens = [int(t) for t in np.random.default_rng(3).integers(0, 320, size=40)]
    r = run([HF_PYTHON, "-c", HF_SCRIPT, fx.out32, json.dumps(tokens)], timeout=600)
    check(r.returncode == 0, "transformers could not run the export: %s" % r.stderr[-2000:])
    hf = np.array(json.loads(r.stdout.strip().splitlines()[-1]))
    weights, _ = R.load_safetensors(os.path.join(fx.out32, "model.safetensors"))
    n = len(tokens)
    ref = R.forward_logits(R.make_cfg(**MODEL), weights, np.array(tokens), np.arange(n), np.zeros(n, dtype=np.int64))
    err = np.abs(hf - ref).max() / np.abs(ref).max()
    comment("transformers logits against the numpy reference: max |diff| / max |ref| = %.2e" % err)
    check(err <= 1e-4, "logits differ by %.2e" % err)


def test_errors(fx):
    before = sorted(os.listdir(fx.out32))
    r = run([WLBTRAIN, "export", "--checkpoint", os.path.join(fx.dir, "none"), "--out", fx.out32])
    lines = r.stderr.strip().splitlines()
    check(r.returncode == 2 and len(lines) == 1 and lines[0].startswith("wlbtrain: error: "),
          "missing checkpoint: status %d, stderr %r" % (r.returncode, r.stderr))
    bad = os.path.join(fx.dir, "bad")
    shutil.copytree(step_dir(fx), bad)
    with open(os.path.join(bad, "config.yaml"), "a") as f:
        f.write("model: {n_layers: [\n")
    mtime = os.path.getmtime(os.path.join(fx.out32, "model.safetensors"))
    r = run([WLBTRAIN, "export", "--checkpoint", bad, "--out", fx.out32])
    lines = r.stderr.strip().splitlines()
    check(r.returncode == 2 and len(lines) == 1 and "config.yaml" in lines[0],
          "corrupted config: status %d, stderr %r" % (r.returncode, r.stderr))
    check(sorted(os.listdir(fx.out32)) == before and
          os.path.getmtime(os.path.join(fx.out32, "model.safetensors")) == mtime, "the output folder was touched")


def test_paths(fx):
    """--checkpoint names the checkpoint as a user finds it: the checkpoint folder (with or without a
    trailing slash), its latest file (also relative, from inside the folder), a step folder - all the
    same export; a file that is not latest, or a folder holding no checkpoint, is one error line."""
    with open(os.path.join(fx.out32, "model.safetensors"), "rb") as f:
        want = f.read()
    out = os.path.join(fx.dir, "hf-path")
    for path, cwd in ((fx.ckpt + "/", None), (os.path.join(fx.ckpt, "latest"), None), ("latest", fx.ckpt),
                      (step_dir(fx), None)):
        shutil.rmtree(out, ignore_errors=True)
        r = run([WLBTRAIN, "export", "--checkpoint", path, "--out", out], cwd=cwd)
        check(r.returncode == 0, "--checkpoint %s: status %d, stderr %r" % (path, r.returncode, r.stderr))
        check("-> %s " % out in r.stdout and r.stdout.startswith("export: ") and "step-0000000" in r.stdout,
              "--checkpoint %s: %r" % (path, r.stdout))
        with open(os.path.join(out, "model.safetensors"), "rb") as f:
            check(f.read() == want, "--checkpoint %s: another model.safetensors" % path)
    for path, expect in ((os.path.join(step_dir(fx), "index.json"), "index.json: a file, not a checkpoint"),
                         (fx.dir, ": not a checkpoint: no latest, no index.json"),
                         (os.path.join(fx.ckpt, "nothing"), "nothing: no checkpoint here")):
        shutil.rmtree(out, ignore_errors=True)
        r = run([WLBTRAIN, "export", "--checkpoint", path, "--out", out])
        lines = r.stderr.strip().splitlines()
        check(r.returncode == 2 and len(lines) == 1 and expect in lines[0],
              "--checkpoint %s: status %d, stderr %r" % (path, r.returncode, r.stderr))
        check(not os.path.exists(out), path + ": the output folder was written")


def overlap(tensor):
    """The tensor's one block as two that share a row and leave the last one out."""
    b = tensor["blocks"][0]
    half, cols = b["rows"] // 2, b["cols"]
    tensor["blocks"] = [dict(b, rows=half + 1),
                        dict(b, row0=b["row0"] + half, rows=b["rows"] - half - 1, offset=b["offset"] + half * cols)]


def index_crc(d):
    """The checksum of an index (docs/checkpoints.md): CRC-32 of its compact, key-sorted JSON without crc32."""
    import zlib
    body = dict((k, v) for k, v in d.items() if k != "crc32")
    return "%08x" % (zlib.crc32(json.dumps(body, separators=(",", ":"), sort_keys=True).encode()) & 0xffffffff)


def test_out_checked(fx):
    """An --out that cannot be written is found before the checkpoint is read: one line, exit 2, nothing made."""
    under = os.path.join(fx.dir, "tiny.yaml", "hf")
    for out, expect in (("/proc/wlb-export/hf", "--out: /proc/wlb-export/hf cannot be written: the folder /proc takes no new file"),
                        (under, "--out: %s cannot be written: %s is a file, not a folder" % (under, os.path.join(fx.dir, "tiny.yaml")))):
        r = run([WLBTRAIN, "export", "--checkpoint", fx.ckpt, "--out", out])
        lines = r.stderr.strip().splitlines()
        check(r.returncode == 2 and len(lines) == 1 and lines[0].startswith("wlbtrain: error: " + expect),
              "%s: status %d, stderr %r" % (out, r.returncode, r.stderr))
        check(not os.path.exists(out), "%s was made" % out)


def test_digit_edits(fx):
    """One digit of index.json changed, 40 times at random places: every export refused, nothing written."""
    step = step_dir(fx)
    with open(os.path.join(step, "index.json")) as f:
        text = f.read()
    base = json.loads(text)
    check(index_crc(base) == base["crc32"], "the checksum computed here %s, wlbtrain's %s" % (index_crc(base),
                                                                                            base.get("crc32")))
    rng = random.Random(50)
    digits = [i for i, c in enumerate(text) if c.isdigit()]
    bad = os.path.join(fx.dir, "digits")
    out = os.path.join(fx.dir, "hf-digits")
    refused = 0
    for n in range(40):
        at = rng.choice(digits)
        edited = text[:at] + str((int(text[at]) + rng.randint(1, 9)) % 10) + text[at + 1:]
        shutil.rmtree(bad, ignore_errors=True)
        shutil.copytree(step, bad)
        with open(os.path.join(bad, "index.json"), "w") as f:
            f.write(edited)
        r = run([WLBTRAIN, "export", "--checkpoint", bad, "--out", out])
        lines = r.stderr.strip().splitlines()
        ok = r.returncode == 2 and len(lines) == 1 and not os.path.exists(out)
        check(ok, "digit %d (%r): status %d, stderr %r" % (at, text[max(0, at - 30):at + 5], r.returncode, r.stderr))
        refused += ok
    comment("%d of 40 one-digit edits refused" % refused)


def test_bad_index(fx):
    """A malformed index.json: one error line, exit 2, nothing written - never a crash or a wrong export."""
    step = step_dir(fx)
    with open(os.path.join(step, "index.json")) as f:
        base = json.load(f)
    t = "model.embed_tokens.weight"
    edits = [
        ("a newer version", lambda d: d.update(version=4), "index version 4"),
        ("a file outside the folder", lambda d: d.update(files=["../x"]), "is not a file name of the checkpoint"),
        ("moment shards short of the chunk", lambda d: d["chunks"][0]["moments"][0].update(end=3),
         "the moment shards cover 3 of"),
        ("a huge block", lambda d: d["tensors"][t]["blocks"][0].update(rows=2 ** 62, cols=4), "is outside the tensor"),
        ("a negative offset", lambda d: d["tensors"][t]["blocks"][0].update(offset=-1), "is outside the tensor"),
        ("a block twice", lambda d: d["tensors"][t]["blocks"].append(d["tensors"][t]["blocks"][0]),
         "the blocks hold 20480 of its 10240 values"),
        ("weights from a moment section", lambda d: d["tensors"][t]["blocks"][0].update(section="m.c0"),
         "not the weights of its chunk"),
        ("not an object", lambda d: d.clear(), "not a wlbtrain checkpoint index"),
        ("layers for two chunks of one", lambda d: d["layout"].update(stage_layers=[1, 1]),
         "layout.stage_layers is not a list of 1 layer counts"),
        ("a chunk of no layer", lambda d: d["layout"].update(stage_layers=[0]),
         "layout.stage_layers[0] is not a layer count"),
        ("two blocks overlapping by a row, a row missing (the area adds up)", lambda d: overlap(d["tensors"][t]),
         "blocks 0 and 1 overlap"),
    ]
    bad = os.path.join(fx.dir, "badindex")
    out = os.path.join(fx.dir, "hf-bad")
    for what, edit, expect in edits:
        d = json.loads(json.dumps(base))
        edit(d)
        if isinstance(d, dict) and d:
            d["crc32"] = index_crc(d)  # past the checksum: each check of the reader is what refuses it
        shutil.rmtree(bad, ignore_errors=True)
        shutil.copytree(step, bad)
        with open(os.path.join(bad, "index.json"), "w") as f:
            json.dump(d, f)
        r = run([WLBTRAIN, "export", "--checkpoint", bad, "--out", out])
        lines = r.stderr.strip().splitlines()
        check(r.returncode == 2 and len(lines) == 1 and expect in lines[0],
              "%s: status %d, stderr %r" % (what, r.returncode, r.stderr))
        check(not os.path.exists(out), what + ": the output folder was written")


TESTS = [("config.json is the model's LlamaConfig", test_config),
         ("float32 export: the checkpoint's tensors bit for bit", test_float32),
         ("float32 export of a 4-rank checkpoint (tp 2, pp 2): its 4 shards' blocks bit for bit", test_sharded),
         ("float32 export of layers split [2, 1] over 2 stages: the 3-layer model", test_uneven_split),
         ("bfloat16 export: rounded to nearest even", test_bfloat16),
         ("transformers loads the export; its logits = the numpy reference", test_transformers),
         ("export errors: one line, exit 2, output untouched", test_errors),
         ("--checkpoint: the checkpoint folder, its latest file, a step folder", test_paths),
         ("a malformed index.json: one line, exit 2, nothing written", test_bad_index),
         ("40 one-digit edits of index.json: each refused by its checksum", test_digit_edits),
         ("an --out that cannot be written: one line before any work", test_out_checked)]


if __name__ == "__main__":
    sys.exit(run_tests(TESTS, lambda: require(np, WLBTRAIN) or Fixture(),
                       lambda fx: shutil.rmtree(fx.dir, ignore_errors=True)))
