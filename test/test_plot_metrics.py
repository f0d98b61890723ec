#!/usr/bin/env python3
"""scripts/plot_metrics.py and scripts/metrics_to_tensorboard.py on the metrics of a real run (a tiny
model trained 6 steps with evaluation every 3 on held-out documents, by token position too): the PNG
comes out for one run and for two overlaid on tokens; a malformed metrics file is one error line; the TensorBoard
event file holds every step's scalars, the validation loss at the steps that evaluated with the
metrics file's value (its records read back here, their CRCs checked). TAP output. Without
matplotlib or tensorboardX in this python: skipped, or with CI set failed (taplib)."""
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import zlib

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from taplib import Skip, import_module  # noqa: E402

WLBTRAIN = os.environ.get("WLBTRAIN", "./wlbtrain")
PNG = b"\x89PNG\r\n\x1a\n"


def run(*args):
    return subprocess.run(list(args), capture_output=True, text=True)


def train(tmp):
    """A byte-level corpus of 40 text documents and 6 steps of a tiny model; the metrics file."""
    docs = os.path.join(tmp, "docs")
    os.makedirs(docs)
    for i in range(40):
        with open(os.path.join(docs, f"{i:02d}.txt"), "w") as f:
            f.write(" ".join(f"line {j} of document {i}: the value is {i * j % 17}." for j in range(3 + i % 9)))
    files = sorted(os.path.join(docs, n) for n in os.listdir(docs))
    prefix = os.path.join(tmp, "corpus")
    r = run(WLBTRAIN, "convert", "--quiet", "--out", prefix, *files)
    if r.returncode != 0:
        raise AssertionError("convert: " + r.stderr)
    cfg = os.path.join(tmp, "run.yaml")
    metrics = os.path.join(tmp, "metrics.jsonl")
    with open(cfg, "w") as f:
        f.write("model: {n_layers: 2, d_model: 32, n_heads: 4, n_kv_heads: 2, d_ffn: 64, vocab_size: 257,"
                " rope_theta: 10000, norm_eps: 1.0e-5, tie_embeddings: false, max_seq_len: 256}\n"
                "parallel: {dp: 1}\n"
                f"data: {{path: {prefix}, context_window: 128, global_batch_tokens: 512, valid_fraction: 0.25}}\n"
                "balance: {hardware: cpu}\n"
                "train: {device: cpu, steps: 6, lr: 0.003, warmup_steps: 1, eval_every: 3, eval_tokens: 512,"
                " eval_position_buckets: [16, 64]}\n"
                f"log: {{every: 10, metrics: {metrics}}}\n")
    r = run(WLBTRAIN, "--config", cfg)
    if r.returncode != 0:
        raise AssertionError("train: " + r.stdout + r.stderr)
    return metrics


def read_events(path):
    """(step, tag, value) of every scalar of a TensorBoard event file: TFRecord framing (length, its
    masked CRC-32C, data, the data's masked CRC-32C) around Event protos, read with tensorboardX's."""
    from tensorboardX.proto import event_pb2
    data = open(path, "rb").read()
    out, at = [], 0
    while at < len(data):
        (n,) = struct.unpack("<Q", data[at:at + 8])
        if at + 16 + n > len(data):
            raise AssertionError(f"{path}: a record runs past the end")
        body = data[at + 12:at + 12 + n]
        (crc,) = struct.unpack("<I", data[at + 12 + n:at + 16 + n])
        if crc != masked_crc32c(body):
            raise AssertionError(f"{path}: a record fails its CRC")
        at += 16 + n
        e = event_pb2.Event.FromString(body)
        for v in e.summary.value:
            out.append((e.step, v.tag, v.simple_value))
    return out


def masked_crc32c(b):
    crc = 0xFFFFFFFF
    for byte in b:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 & -(crc & 1))
    crc ^= 0xFFFFFFFF
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def main():
    matplotlib = import_module("matplotlib")
    tbx = import_module("tensorboardX")
    print("1..4")
    results = []
    tmp = tempfile.mkdtemp(prefix="wlbmetrics-")
    try:
        if isinstance(matplotlib, Exception):
            results += [(matplotlib, "plot_metrics draws one run"), (matplotlib, "plot_metrics overlays two runs"),
                        (matplotlib, "a malformed metrics file is one error line")]
        else:
            metrics = train(tmp)
            steps = [json.loads(line) for line in open(metrics)]
            valid = [s for s in steps if "valid_loss" in s]
            out = os.path.join(tmp, "fig", "one.png")
            r = run(sys.executable, "scripts/plot_metrics.py", metrics, "--out", out)
            good = (r.returncode == 0 and os.path.exists(out) and open(out, "rb").read(8) == PNG
                    and [s["step"] for s in valid] == [3, 6] and "6 steps, 2 evaluations, 2 by token position)" in r.stdout
                    and all(s["valid_position_from"] == [0, 16, 64] and len(s["valid_position_loss"]) == 3
                            and sum(s["valid_position_targets"]) > 0 for s in valid))
            results.append((good or r.stderr + r.stdout, "plot_metrics draws one run (train and validation loss, "
                                                         "tokens/s, imbalance, validation loss by token position)"))
            second = os.path.join(tmp, "second.jsonl")
            shutil.copy(metrics, second)
            out2 = os.path.join(tmp, "two.png")
            r = run(sys.executable, "scripts/plot_metrics.py", metrics, second, "--x", "tokens", "--label", "a",
                    "--label", "b", "--out", out2)
            good = r.returncode == 0 and open(out2, "rb").read(8) == PNG and "2 runs, 12 steps" in r.stdout
            results.append((good or r.stderr + r.stdout, "plot_metrics overlays two runs on tokens"))
            bad = os.path.join(tmp, "bad.jsonl")
            with open(bad, "w") as f:
                f.write(open(metrics).readline() + "{not json\n")
            r = run(sys.executable, "scripts/plot_metrics.py", bad, "--out", os.path.join(tmp, "bad.png"))
            good = (r.returncode != 0 and r.stderr.strip().startswith("wlbtrain: error: ")
                    and r.stderr.strip().endswith(":2: not a JSON line: Expecting property name enclosed in double "
                                                  "quotes") and len(r.stderr.strip().splitlines()) == 1)
            results.append((good or r.stderr, "a malformed metrics file is one error line"))
        if isinstance(tbx, Exception) or isinstance(matplotlib, Exception):
            results.append((tbx if isinstance(tbx, Exception) else matplotlib,
                            "metrics_to_tensorboard writes the run's scalars"))
        else:
            logdir = os.path.join(tmp, "tb")
            r = run(sys.executable, "scripts/metrics_to_tensorboard.py", metrics, "--logdir", logdir, "--name", "run")
            events = [os.path.join(logdir, "run", n) for n in os.listdir(os.path.join(logdir, "run"))] \
                if r.returncode == 0 else []
            got = read_events(events[0]) if len(events) == 1 else []
            loss = {s: v for s, t, v in got if t == "train/loss"}
            vloss = {s: v for s, t, v in got if t == "valid/loss"}
            want = {s["step"]: s["valid_loss"] for s in valid}
            good = (len(loss) == 6 and sorted(vloss) == sorted(want)
                    and all(abs(vloss[k] - want[k]) <= 1e-6 * want[k] for k in want)
                    and any(t == "balance/pp_imbalance_measured" for _, t, _ in got))
            results.append((good or (r.stderr + r.stdout + f" events {events}, {len(got)} scalars"),
                            "metrics_to_tensorboard writes every step's scalars, valid/loss at the evaluations"))
    except AssertionError as e:
        results += [(str(e), "setup")] * (4 - len(results))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    failed = 0
    for i, (res, name) in enumerate(results, 1):
        if res is True:
            print(f"ok {i} - {name}")
        elif isinstance(res, Skip):
            print(f"ok {i} # SKIP {res}")
            print(f"# skip: {res}")
        else:
            failed += 1
            print(f"not ok {i} - {name}")
            print("# " + str(res).replace("\n", "\n# "))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
