#!/usr/bin/env python3
"""test/test_train_loss.py - the loss a step logs, and the gradient it steps with, are the mean
cross-entropy over the labelled targets of the step, computed here independently (the float64 numpy
reference test/ref_llama.py, from the weights and the documents this test wrote).

The labelled targets of a step: every token but the last of each document (a document's end has
no next token) and no padding. Dividing by every token of the step instead - document ends, or
padding, included - is a few percent off here, far above the float32 rounding these bounds allow
(measured: 1e-8 relative on the loss, 6e-8 on the gradient norm).

1   wlbtrain logs (log.metrics) the reference's loss and gradient norm for one step of six whole
    documents in one window: packer fixed_greedy, long_documents keep, 252 tokens and 4 of padding.
2   the same with packer fixed and a window the documents fill exactly (256 tokens, one of 2).
3   dump_train (a hand-made plan of 2 micro-batches of 3 documents each, 154 and 204 labelled
    targets): the loss and every gradient the optimizer would see = the reference's over the 6.
4   the same on 2 ranks (parallel.dp 2, when mpirun is there): 4 micro-batches, 12 documents.

Environment: WLBTRAIN (default ./wlbtrain), WLB_TEST_BIN_DIR (dump_train). Output: TAP.
"""
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
BIN_DIR = os.environ.get("WLB_TEST_BIN_DIR") or os.path.join(REPO, "build/release/test")
DUMP_TRAIN = os.path.join(BIN_DIR, "dump_train")
LOSS_TOL = 1e-6  # relative, float32 forward against float64
GRAD_TOL = 1e-5  # relative, the gradient norm and each tensor's gradient (its norm of differences)

from taplib import Skip, check, comment, import_numpy, require, run_tests  # noqa: E402

np = import_numpy()
if not isinstance(np, Exception):
    import ref_llama as R

MODEL = dict(n_layers=2, d_model=32, n_heads=4, n_kv_heads=2, d_ffn=64, vocab_size=96)

CONFIG = """model: {n_layers: 2, d_model: 32, n_heads: 4, n_kv_heads: 2, d_ffn: 64, vocab_size: 96,
        rope_theta: 10000, norm_eps: 1.0e-5, tie_embeddings: false, max_seq_len: 256}
parallel: {dp: 1}
data: {path: %(prefix)s, context_window: 256, global_batch_tokens: %(batch)d}
balance: {hardware: cpu, packer: %(packer)s, long_documents: %(docs)s}
train: {device: cpu, steps: 1, lr: 0.001, init_from: %(weights)s}
log: {metrics: %(metrics)s}
"""


def run(args, **kw):
    return subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True, **kw)


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


def reference(fx, docs):
    """(loss, gradients) of the step that holds these documents, each whole with RoPE positions from
    0: the mean cross-entropy over every token's next token within its document."""
    tokens = np.concatenate(docs)
    targets = np.concatenate([np.append(d[1:], -1) for d in docs])
    positions = np.concatenate([np.arange(len(d)) for d in docs])
    doc = np.concatenate([np.full(len(d), i) for i, d in enumerate(docs)])
    labelled = int((targets >= 0).sum())
    check(labelled == sum(len(d) - 1 for d in docs), "labelled targets")
    return R.forward_backward(fx.cfg, fx.weights, tokens, targets, positions, doc)


class Fixture:
    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="wlbloss-")
        rng = np.random.default_rng(27)
        self.cfg = R.make_cfg(**MODEL)
        # float32 weights: the values wlbtrain trains from are exactly these.
        self.weights = {k: v.astype(np.float32) for k, v in R.random_weights(self.cfg, rng).items()}
        self.weights_path = os.path.join(self.dir, "w.safetensors")
        R.save_safetensors(self.weights_path, self.weights)
        self.docs = {}
        # One window of whole documents: 252 tokens (4 of padding: no document fits in 4) and 256.
        # Dump_train's plans take documents of 16 to 255 tokens in data-set order, 3 a micro-batch.
        for name, lengths in (("pad", [37, 7, 64, 90, 9, 45]), ("full", [37, 5, 64, 90, 2, 58]),
                              ("plan", [17, 40, 100, 23, 64, 120, 16, 30, 50, 99, 18, 77])):
            self.docs[name] = [rng.integers(0, MODEL["vocab_size"], size=n) for n in lengths]
            write_set(os.path.join(self.dir, name), self.docs[name])

    def config(self, name, packer="fixed", docs="cut", batch=256):
        path = os.path.join(self.dir, name + ".yaml")
        with open(path, "w") as f:
            f.write(CONFIG % {"prefix": os.path.join(self.dir, name), "batch": batch, "packer": packer, "docs": docs,
                              "weights": self.weights_path, "metrics": os.path.join(self.dir, name + ".jsonl")})
        return path


def logged_step(fx, name, packer, docs, want_tokens):
    r = run([WLBTRAIN, "--config", fx.config(name, packer, docs)], timeout=600)
    check(r.returncode == 0, "wlbtrain: %s%s" % (r.stdout, r.stderr))
    with open(os.path.join(fx.dir, name + ".jsonl")) as f:
        m = json.loads(f.readline())
    check(m["tokens"] == want_tokens, "the step holds %d tokens, not the %d of the data set" % (m["tokens"], want_tokens))
    loss, grads = reference(fx, fx.docs[name])
    norm = np.sqrt(sum((g ** 2).sum() for g in grads.values()))
    labelled = sum(len(d) - 1 for d in fx.docs[name])
    comment("%s: logged loss %.10f, reference %.10f (%d labelled targets of %d tokens); grad_norm %.10f, "
            "reference %.10f" % (name, m["loss"], loss, labelled, m["tokens"], m["grad_norm"], norm))
    check(abs(m["loss"] - loss) <= LOSS_TOL * loss, "logged loss %.10f, reference %.10f" % (m["loss"], loss))
    check(abs(m["grad_norm"] - norm) <= GRAD_TOL * norm, "logged grad_norm %.10f, reference %.10f"
          % (m["grad_norm"], norm))


def test_logged_padded(fx):
    logged_step(fx, "pad", "fixed_greedy", "keep", 252)


def test_logged_full(fx):
    logged_step(fx, "full", "fixed", "cut", 256)


def planned_step(fx, ranks):
    if not os.path.exists(DUMP_TRAIN):
        raise Skip("%s is not built" % DUMP_TRAIN)
    out = os.path.join(fx.dir, "plan-%d.safetensors" % ranks)
    cmd = [DUMP_TRAIN, fx.config("plan", batch=512 * ranks), out, "--layout", "0:1,0:1,0:1", "--set",
           "parallel.dp=%d" % ranks]
    if ranks > 1:
        if not shutil.which("mpirun"):
            raise Skip("no mpirun")
        cmd = ["mpirun", "-np", str(ranks)] + cmd
    r = run(cmd, timeout=600)
    check(r.returncode == 0, "dump_train: %s%s" % (r.stdout, r.stderr))
    got, _ = R.load_safetensors(out)
    docs = fx.docs["plan"][:6 * ranks]
    loss, grads = reference(fx, docs)
    comment("%d rank(s), %d micro-batches: loss %.10f, reference %.10f (labelled targets per micro-batch: %s)" % (
        ranks, 2 * ranks, got["loss"][0], loss, [sum(len(d) - 1 for d in docs[i:i + 3]) for i in range(0, len(docs), 3)]))
    check(abs(got["loss"][0] - loss) <= LOSS_TOL * loss, "loss %.10f, reference %.10f" % (got["loss"][0], loss))
    worst = 0.0
    for name, g in grads.items():
        c = got["grad." + name].astype(np.float64).reshape(g.shape)
        err = np.linalg.norm(c - g) / np.linalg.norm(g)
        worst = max(worst, err)
        check(err <= GRAD_TOL, "%s: gradient off by %.2e relative" % (name, err))
    comment("worst gradient: %.2e relative" % worst)


def test_planned_one_rank(fx):
    planned_step(fx, 1)


def test_planned_two_ranks(fx):
    planned_step(fx, 2)


TESTS = [("logged loss and grad_norm = reference: 6 documents, 4 tokens of padding", test_logged_padded),
         ("logged loss and grad_norm = reference: 6 documents filling the window", test_logged_full),
         ("2 micro-batches of 3 documents: loss and every gradient = reference", test_planned_one_rank),
         ("2 ranks (dp 2), 4 micro-batches: loss and every gradient = reference", test_planned_two_ranks)]


if __name__ == "__main__":
    sys.exit(run_tests(TESTS, lambda: require(np, WLBTRAIN) or Fixture(),
                       lambda fx: shutil.rmtree(fx.dir, ignore_errors=True)))
