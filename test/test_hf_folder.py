#!/usr/bin/env python3
"""test/test_hf_folder.py - Hugging Face model folders in (train.init_from, wlbtrain eval --init-from)
and out (wlbtrain export).

A tiny Llama (grouped-query heads, Llama 3.1's RoPE scaling scaled down: llama3, factor 8, original
context 64) with random float32 weights is written here as model folders: config.json (transformers 4's
form, rope_theta + rope_scaling, or transformers 5's rope_parameters) and model.safetensors, or
model.safetensors.index.json and 4 shards. A run "at step 0" is one step at lr 1e-30: the loss it logs
is the loss of the weights it loaded, and its checkpoint holds them unchanged, bit for bit.
1   the sharded folder loads into exactly the parameters of the one-file folder (both checkpoints
    exported and compared with the source tensors, bit for bit) and logs the same loss, bit for bit;
    a folder with both model.safetensors and an index (of other weights) loads the single file
2   that loss, on six documents in one window, = the float64 numpy reference (ref_llama) within 1e-6
3   config.json in transformers 4's and 5's forms (llama3, linear, yarn; the 5 form's theta inside
    rope_parameters) fill the same model keys; max_seq_len comes from max_position_embeddings
4.. one per model key: a YAML value other than config.json's is refused - exit 2, one line naming
    the key, both values and config.json's name for it; a preset's value too
    the folder's faults: a missing shard, a tensor absent from the index, a shard holding a tensor the
    index does not name or puts elsewhere, no config.json, another model_type - one line, exit 2
    export of a run from a folder with a tokenizer, in shards of at most 20 KB: the index and the shard
    files agree (every tensor in exactly the shard the index names, no shard over the limit,
    total_size); config.json keeps rope_scaling and the folder's bos/eos ids; generation_config.json's
    eos_token_id is the model's; tokenizer.json copied and a tokenizer_config.json made; transformers'
    AutoConfig, AutoTokenizer and GenerationConfig load it without a warning, the tokenizer's ids =
    the tokenizers library's; data.tokenizer's tokenizer.json (and the files beside it) exported, also
    over the folder's own; Llama 3's real tokenizer.json (skipped without ../shared/real-data)
    a bfloat16 folder (torch_dtype bfloat16) exported at step 0 with --dtype auto: BF16, bit for bit
    export -> init_from: the same logged loss bit for bit; wlbtrain eval --init-from gives the same
    validation loss for the one-file, the sharded and the exported folder
    with torch (WLB_HF_PYTHON; skipped otherwise): AutoModelForCausalLM (dtype float32, and "auto")
    loads five exports - float32 and bfloat16, tied and untied embeddings, RoPE llama3, linear, yarn
    (set and default beta/attention factor) and none, one file and 20 KB shards - without a missing,
    unexpected or mismatched key or any warning, tied as the model, in the export's dtype; its loss
    on the documents = wlbtrain's logged loss within 1e-5, and (llama3, none) its logits = the float64
    reference's within 1e-5 of the largest; models that transformers made and saved (float32 llama3
    in shards, bfloat16 tied yarn) load into wlbtrain with transformers' loss within 1e-5 and export
    back at step 0 (--dtype auto) to the same tensors bit for bit.

Environment: WLBTRAIN (default ./wlbtrain), WLB_HF_PYTHON. Output: TAP.
"""
import hashlib
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
WLBTRAIN = os.environ.get("WLBTRAIN") or os.path.join(REPO, "wlbtrain")
HF_PYTHON = os.environ.get("WLB_HF_PYTHON") or sys.executable
LOSS_TOL = 1e-6

from taplib import Skip, check, comment, import_module, import_numpy, need_file, require, run_tests  # noqa: E402

np = import_numpy()
if not isinstance(np, Exception):
    import ref_llama as R

MODEL = dict(n_layers=2, d_model=32, n_heads=4, n_kv_heads=2, d_ffn=64, vocab_size=320, rope_theta=500000.0,
             norm_eps=1e-5, tie_embeddings=False, rope_scaling="llama3", rope_scaling_factor=8.0,
             rope_low_freq_factor=1.0, rope_high_freq_factor=4.0, rope_original_max_seq_len=64)
MAX_POS = 512
LENGTHS = [37, 7, 64, 90, 9, 45]  # 252 tokens in one window of 256 (fixed_greedy, keep)
BOS, EOS = 0, 1                   # the test tokenizer's <|begin_of_text|>, <|end_of_text|>

CONFIG = """parallel: {dp: 1}
data: {path: %(prefix)s, context_window: 256, global_batch_tokens: 256, valid_path: %(prefix)s}
balance: {hardware: cpu, packer: fixed_greedy, long_documents: keep}
train: {device: cpu, steps: 1, lr: 1.0e-30, warmup_steps: 0, eval_tokens: 256}
"""


def run(args, **kw):
    return subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True, **kw)


def one_error(r, *expect):
    lines = r.stderr.strip().splitlines()
    check(r.returncode == 2 and len(lines) == 1 and lines[0].startswith("wlbtrain: error: "),
          "want one error line and exit 2, got status %d, stderr %r" % (r.returncode, r.stderr))
    for e in expect:
        check(e in lines[0], "the error %r does not say %r" % (lines[0], e))
    return lines[0]


def write_set(prefix, docs):
    """A Megatron data set (MMIDIDX v1, uint16 tokens, one sequence per document)."""
    lengths = np.array([len(d) for d in docs], dtype=np.int64)
    n = len(docs)
    with open(prefix + ".bin", "wb") as f:
        for d in docs:
            f.write(np.asarray(d, dtype="<u2").tobytes())
    pointers = np.concatenate([[0], np.cumsum(lengths)[:-1]]) * 2
    with open(prefix + ".idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, 8, n, n + 1))
        f.write(lengths.astype("<i4").tobytes())
        f.write(pointers.astype("<i8").tobytes())
        f.write(np.arange(n + 1, dtype="<i8").tobytes())


def bf16_bits(x):
    """float32 -> bfloat16 bits, rounded to nearest even."""
    u = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def save_st(path, tensors, dtype="F32"):
    """{name: float32 array} as a safetensors file of F32 or BF16 tensors (names sorted)."""
    header, raws, at = {}, [], 0
    for name in sorted(tensors):
        a = np.ascontiguousarray(tensors[name], dtype=np.float32)
        raw = (bf16_bits(a) if dtype == "BF16" else a).astype("<u2" if dtype == "BF16" else "<f4").tobytes()
        header[name] = {"dtype": dtype, "shape": list(a.shape), "data_offsets": [at, at + len(raw)]}
        raws.append(raw)
        at += len(raw)
    header["__metadata__"] = {"format": "pt"}
    js = json.dumps(header, separators=(",", ":")).encode()
    js += b" " * (-len(js) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(js)) + js + b"".join(raws))


def hf_config(form="t4", rope=None, **extra):
    """config.json of MODEL in transformers 4's form (rope_theta, rope_scaling) or 5's (rope_parameters)."""
    m = MODEL
    rope = rope or {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                    "original_max_position_embeddings": 64}
    c = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": m["d_model"],
         "intermediate_size": m["d_ffn"], "num_hidden_layers": m["n_layers"], "num_attention_heads": m["n_heads"],
         "num_key_value_heads": m["n_kv_heads"], "vocab_size": m["vocab_size"], "rms_norm_eps": m["norm_eps"],
         "tie_word_embeddings": m["tie_embeddings"], "max_position_embeddings": MAX_POS, "hidden_act": "silu",
         "bos_token_id": BOS, "eos_token_id": EOS, "torch_dtype": "float32"}
    if form == "t4":
        c.update(rope_theta=m["rope_theta"], rope_scaling=None if rope["rope_type"] == "default" else rope)
    else:
        c["rope_parameters"] = dict(rope, rope_theta=m["rope_theta"])
    c.update(extra)
    return c


def write_folder(path, weights, n_shards=0, dtype="F32", config=None, tokenizer=None):
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config or hf_config(), f, indent=2)
    if tokenizer:
        shutil.copy(tokenizer, os.path.join(path, "tokenizer.json"))
    if not n_shards:
        save_st(os.path.join(path, "model.safetensors"), weights, dtype)
        return
    names = sorted(weights)
    parts = [names[i::n_shards] for i in range(n_shards)]  # interleaved: no shard is a run of layers
    weight_map = {}
    for i, part in enumerate(parts):
        fname = "model-%05d-of-%05d.safetensors" % (i + 1, n_shards)
        save_st(os.path.join(path, fname), {n: weights[n] for n in part}, dtype)
        weight_map.update({n: fname for n in part})
    with open(os.path.join(path, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": 0}, "weight_map": weight_map}, f, indent=2)


def make_tokenizer(path):
    """A byte-level BPE tokenizer.json of 300 ids (Llama 3's special token names at ids 0 and 1),
    trained here by the tokenizers library."""
    tk = import_module("tokenizers")
    if isinstance(tk, Exception):
        return tk
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<|begin_of_text|>", "<|end_of_text|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(["the quick brown fox jumps over the lazy dog; " * 20, "def f(x): return x + 1\n" * 20],
                            trainer)
    tok.save(path)
    return None


class Fixture:
    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="wlbhf-")
        rng = np.random.default_rng(38)
        self.cfg = R.make_cfg(**MODEL)
        self.weights = {k: v.astype(np.float32) for k, v in R.random_weights(self.cfg, rng).items()}
        self.docs = [rng.integers(0, MODEL["vocab_size"], size=n) for n in LENGTHS]
        self.prefix = os.path.join(self.dir, "docs")
        write_set(self.prefix, self.docs)
        self.tokenizer = os.path.join(self.dir, "tokenizer.json")
        self.tokenizer_missing = make_tokenizer(self.tokenizer)
        self.one = os.path.join(self.dir, "one")
        self.sharded = os.path.join(self.dir, "sharded")
        write_folder(self.one, self.weights, tokenizer=None if self.tokenizer_missing else self.tokenizer)
        write_folder(self.sharded, self.weights, n_shards=4)
        self.yaml = os.path.join(self.dir, "run.yaml")
        with open(self.yaml, "w") as f:
            f.write(CONFIG % {"prefix": self.prefix})
        self.runs = {}

    def train(self, name, init_from, *sets):
        """One step at lr 1e-30 from init_from, checkpointed: (logged loss, step folder)."""
        if name in self.runs:
            return self.runs[name]
        ckpt, metrics = os.path.join(self.dir, "ckpt-" + name), os.path.join(self.dir, name + ".jsonl")
        args = [WLBTRAIN, "--config", self.yaml, "--set", "train.init_from=" + init_from, "--set",
                "checkpoint.dir=" + ckpt, "--set", "log.metrics=" + metrics]
        for s in sets:
            args += ["--set", s]
        r = run(args, timeout=300)
        check(r.returncode == 0, "training from %s: %s%s" % (init_from, r.stdout, r.stderr))
        with open(metrics) as f:
            loss = json.loads(f.readline())["loss"]
        with open(os.path.join(ckpt, "latest")) as f:
            step = os.path.join(ckpt, f.read().strip())
        self.runs[name] = (loss, step)
        return self.runs[name]

    def export(self, step, name, *flags):
        out = os.path.join(self.dir, name)
        r = run([WLBTRAIN, "export", "--checkpoint", step, "--out", out] + list(flags))
        check(r.returncode == 0, "export: %s" % r.stderr)
        comment(r.stdout.strip())
        return out

    def print_config(self, init_from, *sets):
        args = [WLBTRAIN, "--config", self.yaml, "--print-config", "--set", "train.init_from=" + init_from]
        for s in sets:
            args += ["--set", s]
        return run(args)


def folder_tensors(path):
    """{name: array} of a folder's weights (one file or the index's shards); BF16 as uint16 bits."""
    files = ["model.safetensors"]
    index = os.path.join(path, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    out = {}
    for fn in files:
        with open(os.path.join(path, fn), "rb") as f:
            raw = f.read()
        n = struct.unpack("<Q", raw[:8])[0]
        header = json.loads(raw[8:8 + n])
        header.pop("__metadata__", None)
        for name, h in header.items():
            a, b = h["data_offsets"]
            dt = {"F32": "<f4", "BF16": "<u2"}[h["dtype"]]
            out[name] = (h["dtype"], np.frombuffer(raw[8 + n + a:8 + n + b], dtype=dt).reshape(h["shape"]))
    return out


def reference_loss(fx, weights=None):
    docs = fx.docs
    tokens = np.concatenate(docs)
    targets = np.concatenate([np.append(d[1:], -1) for d in docs])
    positions = np.concatenate([np.arange(len(d)) for d in docs])
    doc = np.concatenate([np.full(len(d), i) for i, d in enumerate(docs)])
    return R.forward_loss(fx.cfg, weights or fx.weights, tokens, targets, positions, doc)


# ---------------------------------------------------------------------------------------------------


def test_sharded_equals_one_file(fx):
    loss1, step1 = fx.train("one", fx.one)
    loss4, step4 = fx.train("sharded", fx.sharded)
    check(loss1 == loss4, "logged loss %r from one file, %r from 4 shards" % (loss1, loss4))
    for step, name in ((step1, "out-one"), (step4, "out-sharded")):
        got = folder_tensors(fx.export(step, name, "--dtype", "float32"))
        check(sorted(got) == sorted(fx.weights), "%s: not the model's tensors" % name)
        for n, w in fx.weights.items():
            check(got[n][0] == "F32" and np.array_equal(got[n][1].view(np.uint32), w.view(np.uint32)),
                  "%s: %s is not the source tensor bit for bit" % (name, n))
    comment("one file and 4 shards: the same %d tensors bit for bit, logged loss %.10f both" % (len(got), loss1))


def test_single_file_first(fx):
    """A folder holding model.safetensors and an index with shards (of other weights): the single
    file is read, as transformers takes it first."""
    d = os.path.join(fx.dir, "both")
    write_folder(d, {k: v * 2 for k, v in fx.weights.items()}, n_shards=2)
    save_st(os.path.join(d, "model.safetensors"), fx.weights)
    loss1, _ = fx.train("one", fx.one)
    loss, step = fx.train("both", d)
    check(loss == loss1, "logged loss %r from the folder with both, %r from model.safetensors" % (loss, loss1))
    got = folder_tensors(fx.export(step, "out-both", "--dtype", "float32"))
    for n, w in fx.weights.items():
        check(np.array_equal(got[n][1].view(np.uint32), w.view(np.uint32)), "%s: not model.safetensors' tensor" % n)
    comment("model.safetensors beside an index: the single file's weights, loss %.10f" % loss)


def test_loss_reference(fx):
    loss, _ = fx.train("one", fx.one)
    ref = reference_loss(fx)
    comment("logged loss %.10f, float64 reference %.10f (%d documents, %d labelled targets)"
            % (loss, ref, len(fx.docs), sum(n - 1 for n in LENGTHS)))
    check(abs(loss - ref) <= LOSS_TOL * ref, "loss %.10f, reference %.10f" % (loss, ref))


def model_section(text):
    return text[text.index("model:"):text.index("parallel:")]


SAVE_CONFIG = r"""
import sys
from transformers import LlamaConfig
LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            vocab_size=320, max_position_embeddings=512, rms_norm_eps=1e-5, tie_word_embeddings=False,
            rope_theta=500000.0, rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 64}).save_pretrained(sys.argv[1])
"""


def test_config_forms(fx):
    ropes = [{"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
              "original_max_position_embeddings": 64},
             {"rope_type": "linear", "factor": 4.0},
             {"rope_type": "yarn", "factor": 16.0, "original_max_position_embeddings": 64, "beta_fast": 16.0,
              "beta_slow": 2.0, "attention_factor": 1.25, "truncate": False},
             {"rope_type": "default"}]
    for rope in ropes:
        got = []
        for form in ("t4", "t5"):
            d = os.path.join(fx.dir, "form-" + form)
            shutil.rmtree(d, ignore_errors=True)
            os.makedirs(d)
            with open(os.path.join(d, "config.json"), "w") as f:
                json.dump(hf_config(form, rope), f)
            r = fx.print_config(d)
            check(r.returncode == 0, "%s %s: %s" % (form, rope["rope_type"], r.stderr))
            got.append(model_section(r.stdout))
        check(got[0] == got[1], "%s: the two forms give different model keys:\n%s\n%s" % (rope["rope_type"], *got))
        want = {"llama3": ["rope_scaling: llama3", "rope_scaling_factor: 8", "rope_original_max_seq_len: 64"],
                "linear": ["rope_scaling: linear", "rope_scaling_factor: 4"],
                "yarn": ["rope_scaling: yarn", "rope_scaling_factor: 16", "rope_yarn_beta_fast: 16",
                         "rope_yarn_beta_slow: 2", "rope_attention_factor: 1.25", "rope_yarn_truncate: false"],
                "default": ["rope_scaling: none"]}[rope["rope_type"]]
        for w in want + ["rope_theta: 500000", "max_seq_len: %d" % MAX_POS, "d_model: 32", "n_kv_heads: 2"]:
            check("  %s\n" % w in got[0], "%s: no '%s' in\n%s" % (rope["rope_type"], w, got[0]))
    comment("llama3, linear, yarn, none: transformers 4's and 5's config.json give the same model keys")
    # And the file transformers itself writes (no torch needed for a config).
    tf = import_module("transformers")
    if isinstance(tf, Exception):
        raise tf
    d = os.path.join(fx.dir, "form-saved")
    r = run([sys.executable, "-c", SAVE_CONFIG, d])
    check(r.returncode == 0, "transformers could not save a LlamaConfig: %s" % r.stderr[-2000:])
    r1, r2 = fx.print_config(d), fx.print_config(fx.one)
    check(r1.returncode == 0 and model_section(r1.stdout) == model_section(r2.stdout),
          "LlamaConfig.save_pretrained's config.json: %s%s" % (r1.stderr, model_section(r1.stdout)))
    comment("transformers %s's own config.json (rope_parameters): the same model keys" % tf.__version__)


# The defaults of transformers' LlamaConfig for the config.json keys wlbtrain reads and a file may
# leave out (transformers 4.x and 5.x alike): config.json's name, the model key, what wlbtrain must
# print for the model of hf_config("t4", default RoPE) without it. Each is LlamaConfig's own value
# (num_key_value_heads: None, i.e. the heads; rope_theta: 10000 in rope_theta or rope_parameters;
# rope_scaling: None), not wlbtrain's own defaults (a YAML without the key): norm_eps is 1e-5 there.
# yarn's beta_fast, beta_slow, truncate and attention_factor: YARN_MISMATCHES below (YARN has none of them).
HF_DEFAULTS = [("num_key_value_heads", "n_kv_heads", "4"), ("rms_norm_eps", "norm_eps", "1e-06"),
               ("tie_word_embeddings", "tie_embeddings", "false"), ("max_position_embeddings", "max_seq_len", "2048"),
               ("rope_theta", "rope_theta", "10000"), ("rope_scaling", "rope_scaling", "none")]
# and LlamaConfig's attribute for each, to check the table against transformers when it is installed
HF_ATTRS = {"num_key_value_heads": 4, "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
            "max_position_embeddings": 2048, "rope_theta": 10000.0, "rope_scaling": None}


def test_missing_key_defaults(fx):
    for form in ("t4", "t5"):
        for name, key, want in HF_DEFAULTS:
            if form == "t5" and name == "rope_scaling":
                continue  # transformers 5 has rope_parameters, checked by rope_theta's row
            c = hf_config(form, {"rope_type": "default"})
            if form == "t5" and name == "rope_theta":
                del c["rope_parameters"]["rope_theta"]
            else:
                c.pop(name, None)
            d = os.path.join(fx.dir, "no-%s-%s" % (name, form))
            write_folder(d, fx.weights, config=c)
            r = fx.print_config(d)
            check(r.returncode == 0, "config.json without %s: %s" % (name, r.stderr))
            line = "  %s: %s\n" % (key, want)
            got = [l for l in model_section(r.stdout).splitlines() if l.startswith("  %s:" % key)]
            check(line in model_section(r.stdout), "transformers %s, config.json without %s: model.%s is %s, "
                  "LlamaConfig's default is %s" % (form[1], name, key, got, want))
            shutil.rmtree(d)
    comment("config.json without %s: LlamaConfig's defaults (transformers 4's and 5's forms)"
            % ", ".join(n for n, _, _ in HF_DEFAULTS))
    tf = import_module("transformers")
    if isinstance(tf, Exception):
        comment("transformers is not installed: the table of defaults is not checked against LlamaConfig")
        return
    cfg = tf.LlamaConfig(num_attention_heads=4, hidden_size=32)
    got = {n: getattr(cfg, n, None) for n in HF_ATTRS}
    if getattr(cfg, "rope_parameters", None):  # transformers 5
        got["rope_theta"] = cfg.rope_parameters.get("rope_theta")
        got["rope_scaling"] = None if cfg.rope_parameters.get("rope_type") == "default" else cfg.rope_parameters
    check(got == HF_ATTRS, "transformers %s's LlamaConfig defaults %s, the table %s" % (tf.__version__, got, HF_ATTRS))
    comment("the table is transformers %s's LlamaConfig defaults" % tf.__version__)


# key, a YAML value other than the folder's, config.json's name, the folder's value as the error prints it
MISMATCHES = [("d_model", "64", "hidden_size", "32"), ("d_ffn", "128", "intermediate_size", "64"),
              ("n_layers", "3", "num_hidden_layers", "2"), ("n_heads", "8", "num_attention_heads", "4"),
              ("n_kv_heads", "4", "num_key_value_heads", "2"), ("vocab_size", "384", "vocab_size", "320"),
              ("rope_theta", "10000", "rope_theta", "500000"), ("norm_eps", "1e-06", "rms_norm_eps", "1e-05"),
              ("tie_embeddings", "true", "tie_word_embeddings", "false"), ("rope_scaling", "none", "rope_type", "llama3"),
              ("rope_scaling_factor", "4", "factor", "8"), ("rope_low_freq_factor", "2", "low_freq_factor", "1"),
              ("rope_high_freq_factor", "8", "high_freq_factor", "4"),
              ("rope_original_max_seq_len", "128", "original_max_position_embeddings", "64")]
YARN = {"rope_type": "yarn", "factor": 16.0, "original_max_position_embeddings": 64}
YARN_MISMATCHES = [("rope_yarn_beta_fast", "16", "beta_fast", "32"), ("rope_yarn_beta_slow", "2", "beta_slow", "1"),
                   ("rope_yarn_truncate", "false", "truncate", "true"),
                   ("rope_attention_factor", "1.5", "attention_factor", "0"),
                   ("rope_scaling_factor", "8", "factor", "16")]


def mismatch_test(key, value, json_name, folder_value, yarn=False):
    def test(fx):
        init = fx.one
        if yarn:
            init = os.path.join(fx.dir, "yarn")
            if not os.path.exists(init):
                write_folder(init, fx.weights, config=hf_config("t5", YARN))
        r = fx.print_config(init, "model.%s=%s" % (key, value))
        line = one_error(r, "model.%s: %s," % (key, value), "config.json has %s %s" % (json_name, folder_value),
                         "--set model.%s=%s" % (key, value))
        comment(line)
    return test


def test_preset_mismatch(fx):
    cfg = os.path.join(fx.dir, "preset.yaml")
    with open(fx.yaml) as f, open(cfg, "w") as g:
        g.write("model: {preset: llama3-8b}\n" + f.read())
    r = run([WLBTRAIN, "--config", cfg, "--print-config", "--set", "train.init_from=" + fx.one])
    comment(one_error(r, "model.d_model: 4096 (model.preset llama3-8b)", "hidden_size 32"))
    # A Llama 3.1 folder under the 3.0 preset: the RoPE scaling is named, not taken silently.
    d = os.path.join(fx.dir, "llama31-shape")
    os.makedirs(d, exist_ok=True)
    c = hf_config("t4", {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 8192}, hidden_size=4096, intermediate_size=14336,
                  num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
                  max_position_embeddings=131072)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(c, f)
    r = run([WLBTRAIN, "--config", cfg, "--print-config", "--set", "train.init_from=" + d])
    comment(one_error(r, "model.rope_scaling: none (model.preset llama3-8b)", "rope_type llama3"))
    r = run([WLBTRAIN, "--config", cfg, "--print-config", "--set", "train.init_from=" + d, "--set",
             "model.preset=llama3.1-8b"])
    check(r.returncode == 0, "the llama3.1-8b preset and a Llama 3.1 folder: %s" % r.stderr)


def broken_copy(fx, name, edit):
    d = os.path.join(fx.dir, name)
    shutil.rmtree(d, ignore_errors=True)
    shutil.copytree(fx.sharded, d)
    edit(d)
    return d


def edit_index(d, fn):
    p = os.path.join(d, "model.safetensors.index.json")
    with open(p) as f:
        ix = json.load(f)
    fn(ix["weight_map"])
    with open(p, "w") as f:
        json.dump(ix, f)


def test_folder_errors(fx):
    q = "model.layers.0.self_attn.q_proj.weight"
    shard1, shard2 = "model-00001-of-00004.safetensors", "model-00002-of-00004.safetensors"

    def rehome(m):  # q (in some shard) said to be in another
        m[q] = shard1 if m[q] != shard1 else shard2

    def extra_tensor(d):  # shard 1 also holds a tensor the index does not name
        with open(os.path.join(d, "model.safetensors.index.json")) as f:
            names = [n for n, s in json.load(f)["weight_map"].items() if s == shard1]
        save_st(os.path.join(d, shard1), dict({n: fx.weights[n] for n in names}, stray=np.zeros(4, np.float32)))

    cases = [("a missing shard", lambda d: os.remove(os.path.join(d, shard2)),
              ["model.safetensors.index.json", "shard %s is missing" % shard2]),
             ("a tensor absent from the index", lambda d: edit_index(d, lambda m: m.pop(q)),
              ["no tensor %s in weight_map" % q]),
             ("a shard holding a tensor the index does not name", extra_tensor,
              [shard1, "holds tensor stray, which the index's weight_map does not name"]),
             ("a tensor the index puts in another shard", lambda d: edit_index(d, rehome),
              [q, "model-0000"]),
             ("a shard the index names for nothing it holds", lambda d: edit_index(d, lambda m: m.update(x=shard1)),
              ["puts tensor x in %s, which does not hold it" % shard1]),
             ("no config.json", lambda d: os.remove(os.path.join(d, "config.json")), ["no config.json"]),
             ("model_type mistral", lambda d: json.dump(hf_config(model_type="mistral"),
                                                         open(os.path.join(d, "config.json"), "w")),
              ["model_type mistral"]),
             ("head_dim other than hidden_size / heads", lambda d: json.dump(hf_config(head_dim=16),
                                                                             open(os.path.join(d, "config.json"), "w")),
              ["head_dim 16"]),
             ("config.json not JSON", lambda d: open(os.path.join(d, "config.json"), "w").write("{"), ["not JSON"]),
             ("longrope", lambda d: json.dump(hf_config(rope={"rope_type": "longrope", "factor": 2.0}),
                                              open(os.path.join(d, "config.json"), "w")), ["rope_type longrope"])]
    for what, edit, expect in cases:
        d = broken_copy(fx, "broken", edit)
        r = run([WLBTRAIN, "--config", fx.yaml, "--set", "train.init_from=" + d, "--set", "checkpoint.dir=none"],
                timeout=300)
        try:
            comment("%s: %s" % (what, one_error(r, *expect)))
        except AssertionError as e:
            raise AssertionError("%s: %s" % (what, e))


def test_shard_names(fx):
    """A shard name of weight_map is a plain file name of the folder: a path (../, a subfolder, an
    absolute path), ".", ".." or "" is one error line, exit 2 - each with the shards really there, so
    that without the refusal the weights would load from outside the folder the user gave. A name
    that is a folder or a FIFO (which would block the open) is refused as not a regular file, and so
    are an index and a config.json that are FIFOs. A
    symlink of the folder is followed wherever it points: Hugging Face's cache makes every file of
    a snapshot a symlink into blobs/, and such a snapshot trains with the plain folder's loss."""
    outside = os.path.join(fx.dir, "outside")
    if not os.path.exists(outside):
        shutil.copytree(fx.sharded, outside)
    shards = sorted(f for f in os.listdir(fx.sharded) if f.endswith(".safetensors"))

    def subfolder(d):
        os.makedirs(os.path.join(d, "sub"))
        for f in shards:
            shutil.copy(os.path.join(d, f), os.path.join(d, "sub", f))
        edit_index(d, lambda m: m.update({k: "sub/" + v for k, v in m.items()}))

    def folder_shard(d):  # shard 1 a folder of that name
        os.remove(os.path.join(d, shards[0]))
        os.makedirs(os.path.join(d, shards[0]))

    def fifo(d, name):
        os.remove(os.path.join(d, name))
        os.mkfifo(os.path.join(d, name))

    def fifo_shard(d):
        fifo(d, shards[0])

    q = "model.layers.0.self_attn.q_proj.weight"
    cases = [("../outside/NAME", lambda d: edit_index(d, lambda m: m.update({k: "../outside/" + v for k, v in m.items()})),
              ["weight_map: ", ": not a file name of the folder"]),
             ("sub/NAME (the shards copied into sub/)", subfolder, ["weight_map: ", ": not a file name of the folder"]),
             ("an absolute path", lambda d: edit_index(d, lambda m: m.update({k: os.path.join(outside, v)
                                                                               for k, v in m.items()})),
              ["weight_map: ", ": not a file name of the folder"]),
             ("..", lambda d: edit_index(d, lambda m: m.update({q: ".."})), ["weight_map: %s: not a file name" % q]),
             (".", lambda d: edit_index(d, lambda m: m.update({q: "."})), ["weight_map: %s: not a file name" % q]),
             ("empty", lambda d: edit_index(d, lambda m: m.update({q: ""})), ["weight_map: %s: not a file name" % q]),
             ("a folder", folder_shard, [shards[0], "not a regular file"]),
             ("a FIFO", fifo_shard, [shards[0], "not a regular file"]),
             ("the index a FIFO", lambda d: fifo(d, "model.safetensors.index.json"),
              ["model.safetensors.index.json", "not a regular file"]),
             ("config.json a FIFO", lambda d: fifo(d, "config.json"), ["config.json", "not a regular file"])]
    for what, edit, expect in cases:
        d = broken_copy(fx, "names", edit)
        r = run([WLBTRAIN, "--config", fx.yaml, "--set", "train.init_from=" + d, "--set", "checkpoint.dir=none"],
                timeout=60)
        try:
            comment("%s: %s" % (what, one_error(r, *expect)))
        except AssertionError as e:
            raise AssertionError("%s: %s" % (what, e))
    # Hugging Face's cache: snapshots/REV/FILE -> ../../blobs/HASH for every file of the folder.
    cache = os.path.join(fx.dir, "hf-cache")
    snap = os.path.join(cache, "snapshots", "0123abc")
    if not os.path.exists(cache):
        os.makedirs(os.path.join(cache, "blobs"))
        os.makedirs(snap)
        for f in sorted(os.listdir(fx.sharded)):
            with open(os.path.join(fx.sharded, f), "rb") as g:
                blob = hashlib.sha256(g.read()).hexdigest()
            shutil.copy(os.path.join(fx.sharded, f), os.path.join(cache, "blobs", blob))
            os.symlink(os.path.join("..", "..", "blobs", blob), os.path.join(snap, f))
    want, _ = fx.train("sharded", fx.sharded)
    got, _ = fx.train("hf-cache", snap)
    check(got == want, "the HF cache snapshot's loss %r, the plain folder's %r" % (got, want))
    comment("a snapshot of Hugging Face's cache (every file a symlink into blobs/): loss %r, the plain folder's %r"
            % (got, want))


def hf_probe(script, *args):
    r = run([sys.executable, "-c", script] + list(args), env=dict(os.environ, TRANSFORMERS_VERBOSITY="info"))
    return r


LOAD_SCRIPT = r"""
import json, sys, logging
import transformers
from transformers import AutoConfig, AutoTokenizer, GenerationConfig
from tokenizers import Tokenizer
out, source_tok = sys.argv[1], sys.argv[2]
records = []
class Keep(logging.Handler):
    def emit(self, r):
        records.append((r.levelname, r.getMessage()))
h = Keep()
transformers.utils.logging.get_logger().addHandler(h)
transformers.utils.logging.set_verbosity_info()
c = AutoConfig.from_pretrained(out)
t = AutoTokenizer.from_pretrained(out)
g = GenerationConfig.from_pretrained(out)
text = "the quick brown fox; def f(x): return x + 1"
print(json.dumps({"warnings": [m for l, m in records if l in ("WARNING", "ERROR") and "PyTorch was not found" not in m],
                  "model_type": c.model_type, "rope": c.rope_parameters, "bos": c.bos_token_id, "eos": c.eos_token_id,
                  "gen_eos": g.eos_token_id, "gen_bos": g.bos_token_id, "tok_class": type(t).__name__,
                  "ids": t(text, add_special_tokens=False)["input_ids"],
                  "want": Tokenizer.from_file(source_tok).encode(text, add_special_tokens=False).ids,
                  "tok_eos": t.eos_token_id, "tok_bos": t.bos_token_id, "layers": c.num_hidden_layers}))
"""


def test_export_folder(fx):
    if fx.tokenizer_missing:
        raise fx.tokenizer_missing
    _, step = fx.train("one", fx.one)
    limit = 20000
    out = fx.export(step, "out-shards", "--max-shard-size", "20KB")
    files = sorted(os.listdir(out))
    with open(os.path.join(out, "model.safetensors.index.json")) as f:
        ix = json.load(f)
    shards = sorted(set(ix["weight_map"].values()))
    comment("export folder: %s" % ", ".join(files))
    check(len(shards) >= 3, "%d shards, want 3 or more at 20 KB" % len(shards))
    check(sorted(f for f in files if f.endswith(".safetensors")) == shards, "shard files %r, the index names %r"
          % (files, shards))
    check(shards == ["model-%05d-of-%05d.safetensors" % (i + 1, len(shards)) for i in range(len(shards))],
          "shard names %r" % shards)
    total = 0
    for s in shards:
        with open(os.path.join(out, s), "rb") as f:
            raw = f.read()
        n = struct.unpack("<Q", raw[:8])[0]
        header = json.loads(raw[8:8 + n])
        header.pop("__metadata__", None)
        check(sorted(header) == sorted(k for k, v in ix["weight_map"].items() if v == s),
              "%s holds other tensors than the index puts in it" % s)
        size = sum(h["data_offsets"][1] - h["data_offsets"][0] for h in header.values())
        check(size <= limit or len(header) == 1, "%s: %d bytes of tensors, more than %d" % (s, size, limit))
        total += size
    check(ix["metadata"]["total_size"] == total, "total_size %r, the shards hold %d" % (ix["metadata"], total))
    got = folder_tensors(out)
    for n, w in fx.weights.items():
        check(got[n][0] == "F32" and np.array_equal(got[n][1].view(np.uint32), w.view(np.uint32)), n + ": differs")
    with open(os.path.join(out, "config.json")) as f:
        c = json.load(f)
    check(c["bos_token_id"] == BOS and c["eos_token_id"] == EOS, "bos/eos %r %r" % (c["bos_token_id"], c["eos_token_id"]))
    check(c["rope_theta"] == 500000 and c["rope_scaling"]["rope_type"] == "llama3" and c["rope_scaling"]["factor"] == 8,
          "rope: %r %r" % (c["rope_theta"], c["rope_scaling"]))
    with open(os.path.join(out, "generation_config.json")) as f:
        check(json.load(f)["eos_token_id"] == c["eos_token_id"], "generation_config.json: another eos")
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        check(name in files, "no %s" % name)
    tf = import_module("transformers")
    if isinstance(tf, Exception):
        raise tf
    r = hf_probe(LOAD_SCRIPT, out, fx.tokenizer)
    check(r.returncode == 0, "transformers could not load the folder: %s" % r.stderr[-3000:])
    got = json.loads(r.stdout.strip().splitlines()[-1])
    comment("transformers: %s" % {k: got[k] for k in ("rope", "bos", "eos", "gen_eos", "tok_class", "warnings")})
    check(got["warnings"] == [], "transformers warned: %r" % got["warnings"])
    check(got["rope"]["rope_type"] == "llama3" and got["rope"]["factor"] == 8 and got["rope"]["rope_theta"] == 500000,
          "rope_parameters %r" % got["rope"])
    check(got["eos"] == EOS and got["gen_eos"] == EOS and got["tok_eos"] == EOS and got["tok_bos"] == BOS,
          "eos: config %r, generation_config %r, tokenizer %r" % (got["eos"], got["gen_eos"], got["tok_eos"]))
    check(got["ids"] == got["want"], "AutoTokenizer's ids %r, the tokenizers library's %r" % (got["ids"], got["want"]))


REAL = os.environ.get("WLB_REAL_DATA") or os.path.join(REPO, "..", "shared", "real-data")


def no_ids_folder(fx):
    """The model's folder with no bos/eos in config.json and no tokenizer (3 shards)."""
    d = os.path.join(fx.dir, "no-ids")
    if not os.path.exists(d):
        c = hf_config()
        del c["bos_token_id"], c["eos_token_id"]
        write_folder(d, fx.weights, n_shards=3, config=c)
    return d


def check_data_tokenizer_export(fx, name, tok, init, bos, eos):
    """A run from init with data.tokenizer=tok exported: tok copied byte for byte, the ids bos and eos,
    and transformers loads the folder without a warning."""
    _, step = fx.train(name, init, "data.tokenizer=" + tok)
    out = fx.export(step, "out-" + name)
    with open(os.path.join(out, "config.json")) as f:
        c = json.load(f)
    check((c["bos_token_id"], c["eos_token_id"]) == (bos, eos), "%s: bos/eos %r %r, want %d %d"
          % (tok, c["bos_token_id"], c["eos_token_id"], bos, eos))
    with open(tok, "rb") as f, open(os.path.join(out, "tokenizer.json"), "rb") as g:
        check(f.read() == g.read(), "tokenizer.json is not data.tokenizer's, byte for byte")
    tf = import_module("transformers")
    if isinstance(tf, Exception):
        raise tf
    r = hf_probe(LOAD_SCRIPT, out, tok)
    check(r.returncode == 0, "transformers could not load the folder: %s" % r.stderr[-3000:])
    got = json.loads(r.stdout.strip().splitlines()[-1])
    check(got["warnings"] == [], "transformers warned: %r" % got["warnings"])
    check((got["tok_bos"], got["tok_eos"], got["gen_eos"]) == (bos, eos, eos),
          "tokenizer bos/eos %r %r, generation_config eos %r" % (got["tok_bos"], got["tok_eos"], got["gen_eos"]))
    check(got["ids"] == got["want"], "AutoTokenizer's ids differ from the tokenizers library's")
    comment("data.tokenizer %s: bos %d, eos %d; AutoTokenizer (%s) loads the export"
            % (os.path.basename(tok), bos, eos, got["tok_class"]))


def test_export_data_tokenizer(fx):
    """No bos/eos in config.json, no tokenizer in the folder: data.tokenizer's tokenizer.json is
    copied and the ids come from its added tokens."""
    if fx.tokenizer_missing:
        raise fx.tokenizer_missing
    check_data_tokenizer_export(fx, "data-tok-0", fx.tokenizer, no_ids_folder(fx), BOS, EOS)


def test_data_tokenizer_wins(fx):
    """A folder with a tokenizer.json of its own and data.tokenizer set: data.tokenizer's is exported
    (the one the data was made with), with the tokenizer_config.json beside it, not the folder's."""
    if fx.tokenizer_missing:
        raise fx.tokenizer_missing
    other = os.path.join(fx.dir, "other-tok")
    os.makedirs(other, exist_ok=True)
    with open(fx.tokenizer) as f:
        t = json.load(f)
    tok = os.path.join(other, "tokenizer.json")
    with open(tok, "w") as f:
        json.dump(t, f, indent=1)  # the same tokenizer, other bytes than the folder's copy
    with open(os.path.join(other, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<|begin_of_text|>",
                   "eos_token": "<|end_of_text|>", "model_max_length": 4242}, f)
    with open(fx.tokenizer, "rb") as f, open(tok, "rb") as g:
        check(f.read() != g.read(), "the two tokenizer.json files are the same bytes")
    check_data_tokenizer_export(fx, "data-tok-wins", tok, fx.one, BOS, EOS)
    with open(os.path.join(fx.dir, "out-data-tok-wins", "tokenizer_config.json")) as f:
        check(json.load(f).get("model_max_length") == 4242, "tokenizer_config.json is not data.tokenizer's neighbour")


def test_export_llama3_tokenizer(fx):
    """Llama 3's real tokenizer.json as data.tokenizer (../shared/real-data): for a model of Llama 3's
    vocabulary <|begin_of_text|> 128000 and <|end_of_text|> 128001 from its added tokens; refused for
    the 320-token model (ids outside its vocabulary)."""
    llama3 = os.path.join(REAL, "tokenizers", "llama3_tokenizer.json")
    need_file(llama3)
    d = no_ids_folder(fx)
    big = llama3_vocab_folder(fx)
    _, step = fx.train("llama3-tok-small", d, "data.tokenizer=" + llama3)
    r = run([WLBTRAIN, "export", "--checkpoint", step, "--out", os.path.join(fx.dir, "out-refused")])
    comment(one_error(r, "llama3_tokenizer.json", "the bos token id 128000 (from the tokenizer) is outside the "
                      "model's vocabulary of 320"))
    check(not os.path.exists(os.path.join(fx.dir, "out-refused")), "the refused export wrote its folder")
    check_data_tokenizer_export(fx, "data-tok-1", llama3, big, 128000, 128001)


def llama3_vocab_folder(fx, name="vocab-128256", **config):
    """MODEL with Llama 3's vocabulary of 128,256 ids in folder name: config.json without bos and eos
    ids but for the keys of config, no tokenizer."""
    d = os.path.join(fx.dir, name)
    if not os.path.exists(d):
        cfg = R.make_cfg(**dict(MODEL, vocab_size=128256))
        w = {k: v.astype(np.float32) for k, v in R.random_weights(cfg, np.random.default_rng(5)).items()}
        c = hf_config(vocab_size=128256)
        del c["bos_token_id"], c["eos_token_id"]
        c.update(config)
        write_folder(d, w, config=c)
    return d


def exported_ids(fx, name, init, *sets):
    """The export of one step from init: (config.json, generation_config.json or None, the summary)."""
    _, step = fx.train(name, init, *sets)
    out = os.path.join(fx.dir, "out-" + name)
    r = run([WLBTRAIN, "export", "--checkpoint", step, "--out", out])
    check(r.returncode == 0, "export: %s" % r.stderr)
    with open(os.path.join(out, "config.json")) as f:
        c = json.load(f)
    g = None
    if os.path.exists(os.path.join(out, "generation_config.json")):
        with open(os.path.join(out, "generation_config.json")) as f:
            g = json.load(f)
    return c, g, r.stdout.strip()


def test_export_ids_by_source(fx):
    """The bos and eos ids export writes into config.json and generation_config.json, for each
    source: the model folder's config.json (first), else the tokenizer's added tokens, else for
    Llama 3's vocabulary of 128,256 the base models' <|begin_of_text|> 128000 and <|end_of_text|>
    128001 (what convert appends: not the instruct models' turn end <|eot_id|> 128009), else none -
    then no generation_config.json. No pad id is written (Llama's configs have none: generation pads
    with eos). A folder's own generation_config.json is copied as it is."""
    gen_keys = {"_from_model_config", "bos_token_id", "eos_token_id"}
    want_gen = lambda b, e: {"_from_model_config": True, "bos_token_id": b, "eos_token_id": e}  # noqa: E731
    ids_5_67 = os.path.join(fx.dir, "ids-5-67")
    if not os.path.exists(ids_5_67):
        write_folder(ids_5_67, fx.weights, config=hf_config(bos_token_id=5, eos_token_id=[6, 7]))
    cases = [("neither (Llama 3's vocabulary)", llama3_vocab_folder(fx), (), 128000, 128001, "Llama 3's vocabulary"),
             ("config.json with eos 128009 only (an instruct model's): bos from Llama 3's vocabulary",
              llama3_vocab_folder(fx, "vocab-128256-eot", eos_token_id=128009), (), 128000, 128009,
              "the model folder's config.json"),
             ("config.json's ids 5 and [6, 7] beside data.tokenizer's 0 and 1 (config.json first)", ids_5_67,
              ("data.tokenizer=" + fx.tokenizer,), 5, [6, 7], "the model folder's config.json"),
             ("the tokenizer (data.tokenizer, no ids in config.json)", no_ids_folder(fx),
              ("data.tokenizer=" + fx.tokenizer,), BOS, EOS, "the tokenizer"),
             ("neither, a vocabulary of 320", no_ids_folder(fx), (), None, None, None)]
    for k, (what, init, sets, bos, eos, source) in enumerate(cases):
        if fx.tokenizer_missing and sets:
            raise fx.tokenizer_missing
        c, g, summary = exported_ids(fx, "ids-%d" % k, init, *sets)
        comment("%s: config.json bos %r eos %r; generation_config.json %r" % (what, c.get("bos_token_id"),
                                                                               c.get("eos_token_id"), g))
        check((c["bos_token_id"], c["eos_token_id"]) == (bos, eos),
              "%s: config.json bos %r, eos %r; want %r, %r" % (what, c["bos_token_id"], c["eos_token_id"], bos, eos))
        check("pad_token_id" not in c, "%s: config.json has pad_token_id %r" % (what, c.get("pad_token_id")))
        if eos is None:
            check(g is None, "%s: a generation_config.json without an eos id: %r" % (what, g))
            continue
        check(g == want_gen(bos, eos) and set(g) == gen_keys,
              "%s: generation_config.json %r, want %r" % (what, g, want_gen(bos, eos)))
        check(("eos %s from %s" % (eos if isinstance(eos, int) else "%d and %d more" % (eos[0], len(eos) - 1), source))
              in summary, "%s: the summary %r does not say where eos came from" % (what, summary))
    # A folder's own generation_config.json: copied byte for byte (its sampling settings too).
    d = os.path.join(fx.dir, "own-gen")
    if not os.path.exists(d):
        shutil.copytree(fx.one, d)
        with open(os.path.join(d, "generation_config.json"), "w") as f:
            f.write('{"bos_token_id": 0, "eos_token_id": [1, 7], "do_sample": true, "temperature": 0.6}\n')
    _, _, summary = exported_ids(fx, "own-gen", d)
    with open(os.path.join(d, "generation_config.json"), "rb") as f, \
            open(os.path.join(fx.dir, "out-own-gen", "generation_config.json"), "rb") as g:
        check(f.read() == g.read(), "the folder's generation_config.json was not copied as it is")
    check("generation_config.json (the model folder's)" in summary, "summary: %r" % summary)


def test_export_later_stage(fx):
    """A stage continued from a run that started from a folder (its own train.init_from none): the
    export follows checkpoint.continue_from to that folder - its tokenizer.json, bos/eos ids and
    dtype - and, from a folder with none, to the first stage's data.tokenizer."""
    if fx.tokenizer_missing:
        raise fx.tokenizer_missing
    for first, sets in (("one", ()), ("data-tok-0", ("data.tokenizer=" + fx.tokenizer,))):
        init = fx.one if first == "one" else no_ids_folder(fx)
        _, step1 = fx.train(first, init, *sets)
        model = ["model.%s=%s" % (k, str(v).lower() if isinstance(v, bool) else v) for k, v in MODEL.items()]
        _, step2 = fx.train("stage2-" + first, "none", "checkpoint.continue_from=" + step1,
                            "model.max_seq_len=%d" % MAX_POS, *model)
        out = fx.export(step2, "out-stage2-" + first)
        with open(os.path.join(out, "config.json")) as f:
            c = json.load(f)
        check((c["bos_token_id"], c["eos_token_id"]) == (BOS, EOS), "%s: bos/eos %r %r"
              % (first, c["bos_token_id"], c["eos_token_id"]))
        check(c["torch_dtype"] == "float32", "%s: torch_dtype %r" % (first, c["torch_dtype"]))
        with open(fx.tokenizer, "rb") as f, open(os.path.join(out, "tokenizer.json"), "rb") as g:
            check(f.read() == g.read(), "%s: tokenizer.json is not the first stage's" % first)
    comment("a later stage's export: the first stage's folder's tokenizer and ids, and its data.tokenizer")


def test_bf16_step0(fx):
    d = os.path.join(fx.dir, "bf16")
    write_folder(d, fx.weights, n_shards=3, dtype="BF16", config=hf_config(torch_dtype="bfloat16"))
    _, step = fx.train("bf16", d)
    out = fx.export(step, "out-bf16")  # --dtype auto: what the model came in
    got = folder_tensors(out)
    for n, w in fx.weights.items():
        check(got[n][0] == "BF16", "%s exported as %s, the model came in bfloat16" % (n, got[n][0]))
        check(np.array_equal(got[n][1], bf16_bits(w)), "%s: not the source's bfloat16 bits" % n)
    with open(os.path.join(out, "config.json")) as f:
        check(json.load(f)["torch_dtype"] == "bfloat16", "config.json: torch_dtype")
    comment("bfloat16 in, 1 step at lr 1e-30, --dtype auto: %d BF16 tensors equal to the source's bits" % len(got))


def test_export_init_from(fx):
    loss, step = fx.train("one", fx.one)
    out = fx.export(step, "out-again", "--dtype", "float32")
    again, _ = fx.train("again", out)
    comment("logged loss from the source folder %r, from its export %r" % (loss, again))
    check(again == loss, "export -> init_from: loss %r, the source's %r" % (again, loss))
    losses = []
    for d in (fx.one, fx.sharded, out):
        r = run([WLBTRAIN, "eval", "--init-from", d, "--config", fx.yaml], timeout=300)
        check(r.returncode == 0, "eval --init-from %s: %s" % (d, r.stderr))
        losses.append([ln for ln in r.stdout.splitlines() if "valid_loss" in ln][-1].split()[2])
    comment("wlbtrain eval --init-from: valid_loss %s (one file, 4 shards, the export)" % ", ".join(losses))
    check(len(set(losses)) == 1, "eval losses differ: %r" % losses)


TORCH_LOSS = r"""
import json, logging, sys, warnings, torch
import transformers
from transformers import AutoModelForCausalLM
records = []
class Keep(logging.Handler):
    def emit(self, r):
        records.append((r.levelname, r.getMessage()))
transformers.utils.logging.get_logger().addHandler(Keep())
transformers.utils.logging.set_verbosity_info()
paths, docs = json.loads(sys.argv[1]), json.loads(sys.argv[2])
out = []
for path in paths:
    del records[:]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model, info = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, output_loading_info=True)
        auto = AutoModelForCausalLM.from_pretrained(path, dtype="auto")
    model.eval()
    total, count, logits = 0.0, 0, []
    with torch.no_grad():
        for d in docs:
            z = model(torch.tensor([d])).logits[0].double()
            logits.append(z.tolist())
            lse = torch.logsumexp(z[:-1], dim=-1)
            total += float((lse - z[:-1].gather(1, torch.tensor(d[1:])[:, None])[:, 0]).sum())
            count += len(d) - 1
    out.append({"loss": total / count, "logits": logits, "missing": sorted(map(str, info["missing_keys"])),
                "unexpected": sorted(map(str, info["unexpected_keys"])),
                "mismatched": sorted(map(str, info.get("mismatched_keys", []))),
                "warnings": [m for l, m in records if l in ("WARNING", "ERROR", "CRITICAL")] +
                            [str(w.message) for w in caught],
                "auto_dtype": str(auto.dtype).replace("torch.", ""),
                "tied": model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr(),
                "rope": model.config.rope_parameters})
print(json.dumps(out))
"""

SAVE_SCRIPT = r"""
import json, sys, torch
from transformers import LlamaConfig, LlamaForCausalLM
for out, spec in json.loads(sys.argv[1]):
    torch.manual_seed(0)
    c = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, vocab_size=320, max_position_embeddings=512, rms_norm_eps=1e-5,
                    tie_word_embeddings=spec["tie"], rope_parameters=dict(spec["rope"], rope_theta=500000.0),
                    bos_token_id=0, eos_token_id=1)
    m = LlamaForCausalLM(c)
    with torch.no_grad():
        for p in m.parameters():
            p.normal_(0, 0.2)
    m.to(getattr(torch, spec["dtype"])).save_pretrained(out, max_shard_size=spec["shard"])
"""


def torch_python():
    probe = run([HF_PYTHON, "-c", "import torch, transformers"])
    if probe.returncode != 0:
        raise Skip("torch and transformers are not importable by %s (set WLB_HF_PYTHON to a python that has them)"
                   % HF_PYTHON)


def torch_runs(fx, paths):
    """transformers on each folder (one process): loss and logits on the documents, loading info, warnings."""
    r = run([HF_PYTHON, "-c", TORCH_LOSS, json.dumps(paths), json.dumps([d.tolist() for d in fx.docs])], timeout=600)
    check(r.returncode == 0, "transformers could not run %s: %s" % (paths, r.stderr[-3000:]))
    return json.loads(r.stdout.strip().splitlines()[-1])


def check_torch_load(what, got, tie, dtype, rope_type):
    """AutoModelForCausalLM loaded the folder as it should: no missing, unexpected or mismatched key,
    no warning at all, the embeddings tied or not, dtype="auto" the folder's dtype, the RoPE type."""
    for k in ("missing", "unexpected", "mismatched"):
        check(not got[k], "%s: %s keys %r" % (what, k, got[k]))
    check(got["warnings"] == [], "%s: transformers warned: %r" % (what, got["warnings"]))
    check(got["tied"] == tie, "%s: lm_head %s the embeddings" % (what, "shares" if got["tied"] else "does not share"))
    check(got["auto_dtype"] == dtype, "%s: dtype=\"auto\" loads %s, want %s" % (what, got["auto_dtype"], dtype))
    check(got["rope"]["rope_type"] == rope_type, "%s: rope_parameters %r" % (what, got["rope"]))


def float_weights(path):
    """The folder's weights as float32 (BF16 bits widened)."""
    return {n: (a.astype(np.uint32) << 16).view(np.float32) if dt == "BF16" else a
            for n, (dt, a) in folder_tensors(path).items()}


LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 64}
# Exports loaded by transformers: name, the source folder's dtype and tied embeddings, its RoPE (yarn's
# factor 8 = max_position_embeddings / original, else transformers warns of the mismatch), export flags.
# The llama3 and none models' logits are also compared with the float64 reference (ref_llama has no
# linear or yarn; wlbtrain's RoPE tables for those are test_rope_scaling.py's).
EXPORTS = [("float32, untied, llama3", "F32", False, LLAMA3, ["--dtype", "float32"]),
           ("bfloat16, tied, linear, in 20 KB shards", "BF16", True, {"rope_type": "linear", "factor": 4.0},
            ["--max-shard-size", "20KB"]),
           ("float32, tied, yarn (beta 16/2, attention factor 1.25, no truncation)", "F32", True,
            {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 64, "beta_fast": 16.0,
             "beta_slow": 2.0, "attention_factor": 1.25, "truncate": False}, []),
           ("bfloat16, untied, yarn (transformers' defaults)", "BF16", False,
            {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 64}, []),
           ("float32, tied, no scaling", "F32", True, {"rope_type": "default"}, [])]
LOGITS_TOL = 1e-5


def test_transformers_loss(fx):
    """Each export loads into AutoModelForCausalLM without a missing or unexpected key or any warning,
    and transformers' loss on the documents = wlbtrain's logged loss within 1e-5 (relative)."""
    torch_python()
    runs = []
    for i, (what, dtype, tie, rope, flags) in enumerate(EXPORTS):
        if i == 0:
            src = fx.one
        else:
            src = os.path.join(fx.dir, "torch-src-%d" % i)
            cfg = R.make_cfg(**dict(MODEL, tie_embeddings=tie))
            w = {k: v.astype(np.float32) for k, v in R.random_weights(cfg, np.random.default_rng(i)).items()}
            write_folder(src, w, n_shards=2, dtype=dtype, config=hf_config(
                "t5", rope, tie_word_embeddings=tie, torch_dtype="bfloat16" if dtype == "BF16" else "float32"))
        loss, step = fx.train("torch-%d" % i, src)
        runs.append((loss, fx.export(step, "out-torch-%d" % i, *flags)))
    results = torch_runs(fx, [out for _, out in runs])
    for (what, dtype, tie, rope, flags), (loss, out), got in zip(EXPORTS, runs, results):
        check_torch_load(what, got, tie, "bfloat16" if dtype == "BF16" and "--dtype" not in flags else "float32",
                         rope["rope_type"])
        diff = abs(got["loss"] - loss)
        msg = "%s: transformers' loss %.10f, wlbtrain's %.10f (|diff| %.1e)" % (what, got["loss"], loss, diff)
        if rope["rope_type"] in ("llama3", "default"):
            cfg = R.make_cfg(**dict(MODEL, tie_embeddings=tie, rope_scaling="none" if rope["rope_type"] == "default"
                                    else "llama3"))
            weights, worst = float_weights(out), 0.0
            for d, z in zip(fx.docs, got["logits"]):
                n = len(d)
                ref = R.forward_logits(cfg, weights, d, np.arange(n), np.zeros(n, dtype=np.int64))
                worst = max(worst, float(np.abs(np.array(z) - ref).max() / np.abs(ref).max()))
            msg += "; logits: max |diff| / max |reference| %.1e" % worst
            check(worst <= LOGITS_TOL, "%s: transformers' logits differ from the float64 reference by %.1e"
                  % (what, worst))
        comment(msg)
        check(diff <= 1e-5 * loss, msg)


# Models transformers made and saved (with its own config.json: rope_parameters, dtype).
SAVED = [("float32, untied, llama3, in 20 KB shards",
          {"rope": LLAMA3, "tie": False, "dtype": "float32", "shard": "20KB"}),
         ("bfloat16, tied, yarn (attention factor 1.25)",
          {"rope": {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 64, "beta_fast": 16.0,
                    "beta_slow": 2.0, "attention_factor": 1.25, "truncate": False},
           "tie": True, "dtype": "bfloat16", "shard": "5GB"})]


def test_transformers_saved(fx):
    """Each loads into wlbtrain with transformers' loss within 1e-5, and wlbtrain's export of it at step 0
    (--dtype auto) holds the same tensors bit for bit, in the same dtype."""
    torch_python()
    dirs = [os.path.join(fx.dir, "hf-saved-%d" % i) for i in range(len(SAVED))]
    r = run([HF_PYTHON, "-c", SAVE_SCRIPT, json.dumps([[d, spec] for d, (_, spec) in zip(dirs, SAVED)])], timeout=600)
    check(r.returncode == 0, "transformers could not save a model: %s" % r.stderr[-3000:])
    wants = torch_runs(fx, dirs)
    for d, (what, spec), want in zip(dirs, SAVED, wants):
        comment("transformers saved (%s): %s" % (what, ", ".join(sorted(os.listdir(d)))))
        loss, step = fx.train(os.path.basename(d), d)
        msg = "%s: wlbtrain's loss %.10f, transformers' %.10f" % (what, loss, want["loss"])
        comment(msg)
        check(abs(want["loss"] - loss) <= 1e-5 * loss, msg)
        source, back = folder_tensors(d), folder_tensors(fx.export(step, os.path.basename(d) + "-out"))
        check(sorted(back) == sorted(source), "%s: the export holds %r, transformers saved %r"
              % (what, sorted(back), sorted(source)))
        for n, (dt, a) in source.items():
            check(back[n][0] == dt and np.array_equal(back[n][1], a),
                  "%s: %s is not transformers' %s tensor bit for bit" % (what, n, dt))


TESTS = [("a 4-shard folder loads into the one-file folder's parameters, bit for bit, same loss",
          test_sharded_equals_one_file),
         ("model.safetensors beside an index and shards: the single file is read, as transformers",
          test_single_file_first),
         ("the loss of a folder's model on 6 documents = the float64 reference", test_loss_reference),
         ("config.json in transformers 4's and 5's forms: the same model keys (llama3, linear, yarn, none)",
          test_config_forms),
         ("config.json without a key LlamaConfig defaults: transformers' default, one key at a time",
          test_missing_key_defaults)]
TESTS += [("YAML model.%s other than config.json's %s: refused, naming both" % (k, j), mismatch_test(k, v, j, fv))
          for k, v, j, fv in MISMATCHES]
TESTS += [("yarn folder: YAML model.%s other than config.json's %s: refused" % (k, j), mismatch_test(k, v, j, fv, True))
          for k, v, j, fv in YARN_MISMATCHES]
TESTS += [("a preset other than the folder: refused; Llama 3.1 folder under the 3.0 preset names rope_scaling",
           test_preset_mismatch),
          ("a broken folder (shards, index, config.json): one error line, exit 2", test_folder_errors),
          ("weight_map's shard names: a path, '.', '..', '' refused, a folder or FIFO not a regular file; "
           "an HF cache snapshot of symlinks into blobs/ trains", test_shard_names),
          ("export in shards with index, bos/eos, generation config, tokenizer; transformers loads it",
           test_export_folder),
          ("export with data.tokenizer and no ids in config.json: the tokenizer's bos/eos, AutoTokenizer loads it",
           test_export_data_tokenizer),
          ("data.tokenizer set and the folder's own tokenizer.json: data.tokenizer's is exported",
           test_data_tokenizer_wins),
          ("export with Llama 3's real tokenizer.json as data.tokenizer: 128000/128001; refused for 320 ids",
           test_export_llama3_tokenizer),
          ("export's bos/eos in config.json and generation_config.json by source: the folder's config.json, the "
           "tokenizer, Llama 3's vocabulary (128000/128001, not 128009), none; no pad id", test_export_ids_by_source),
          ("a later stage (continue_from) exports the first stage's folder's tokenizer and ids, or its data.tokenizer",
           test_export_later_stage),
          ("a bfloat16 folder exported at step 0 (--dtype auto): its tensors bit for bit", test_bf16_step0),
          ("export -> init_from: the same loss bit for bit; eval --init-from of folders agrees", test_export_init_from),
          ("transformers (torch) loads 5 exports (fp32/bf16, tied or not, llama3/linear/yarn/none) "
           "without a warning, wlbtrain's loss", test_transformers_loss),
          ("transformers-saved models (Llama 3.1-style llama3; bf16 tied yarn) load with transformers' loss, "
           "export back bit for bit", test_transformers_saved)]


if __name__ == "__main__":
    sys.exit(run_tests(TESTS, lambda: require(np, WLBTRAIN) or Fixture(),
                       lambda fx: shutil.rmtree(fx.dir, ignore_errors=True)))
