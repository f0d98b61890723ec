#!/usr/bin/env python3
"""scripts/plot_timeline.py on a dry run's predicted timelines: a PNG with a row per rank for one
folder and for two (Plain-4D's beside the plan's), a bad folder or step is one error line; on a
one-process training run's measured-predicted folder, its predicted track. TAP output.
Without matplotlib in this python: skipped, or with CI set failed (taplib)."""
import os
import struct
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from taplib import Skip, import_module  # noqa: E402

WLBTRAIN = os.environ.get("WLBTRAIN", "./wlbtrain")
PNG = b"\x89PNG\r\n\x1a\n"


def run(*args):
    return subprocess.run(list(args), capture_output=True, text=True)


def is_png(path):
    return os.path.exists(path) and open(path, "rb").read(8) == PNG


def main():
    matplotlib = import_module("matplotlib")
    print("1..4")
    if isinstance(matplotlib, Skip):
        for i in range(1, 5):
            print(f"ok {i} # SKIP {matplotlib}")
        print(f"# skip: {matplotlib}")
        return 0
    if isinstance(matplotlib, Exception):
        for i in range(1, 5):
            print(f"not ok {i} - {matplotlib}")
        return 1
    tmp = tempfile.mkdtemp(prefix="wlbplottl-")
    lengths = os.path.join(tmp, "l.txt")
    with open(lengths, "w") as f:
        f.write("\n".join(str(50 + (i * 7919) % 3000 if i % 23 else 9000 + i) for i in range(2000)))
    traces = os.path.join(tmp, "traces")
    r1 = run(WLBTRAIN, "--config", "config/examples/llama3-8b-8gpu.yaml", "--dry-run", "--steps", "3",
             "--set", "data.path=", "--set", f"data.lengths_file={lengths}", "--set", "parallel.tp=2",
             "--set", "parallel.pp=2", "--set", "parallel.dp=2", "--set", "data.context_window=16384",
             "--set", "data.global_batch_tokens=131072", "--set", "trace.steps=2-3", "--set", f"trace.dir={traces}")
    ok = True
    out1 = os.path.join(tmp, "one.png")
    r2 = run(sys.executable, "scripts/plot_timeline.py", os.path.join(traces, "predicted"), "--out", out1)
    good = r1.returncode == 0 and r2.returncode == 0 and is_png(out1)
    print(("ok" if good else "not ok") + " 1 - one folder of predicted traces: a PNG")
    if not good:
        print("# " + (r1.stdout[-2000:] + r1.stderr + r2.stdout + r2.stderr).replace("\n", "\n# "))
    ok &= good
    out2 = os.path.join(tmp, "two.png")
    r3 = run(sys.executable, "scripts/plot_timeline.py", os.path.join(traces, "predicted-plain4d"),
             os.path.join(traces, "predicted"), "--step", "3", "--ranks", "0-3,6", "--title", "Plain-4D", "wlb", "--own-scale",
             "--out", out2)
    good = r3.returncode == 0 and is_png(out2)
    print(("ok" if good else "not ok") + " 2 - Plain-4D's and the plan's folders, step 3, some ranks: a PNG")
    if not good:
        print("# " + (r3.stdout + r3.stderr).replace("\n", "\n# "))
    ok &= good
    empty = os.path.join(tmp, "empty")
    os.mkdir(empty)
    r4 = run(sys.executable, "scripts/plot_timeline.py", empty, "--out", os.path.join(tmp, "x.png"))
    r5 = run(sys.executable, "scripts/plot_timeline.py", os.path.join(traces, "predicted"), "--step", "9",
             "--out", os.path.join(tmp, "y.png"))
    good = all(r.returncode != 0 and len(r.stderr.strip().splitlines()) == 1 and
               r.stderr.startswith("wlbtrain: error: ") for r in (r4, r5)) and "no trace files" in r4.stderr and \
        "step 9" in r5.stderr and not os.path.exists(os.path.join(tmp, "x.png"))
    print(("ok" if good else "not ok") + " 3 - a folder without traces, a step not traced: one error line each")
    if not good:
        print("# " + (r4.stderr + r5.stderr).replace("\n", "\n# "))
    ok &= good
    # A training run's merged files (measured-predicted/): each of its two tracks drawn.
    prefix = os.path.join(tmp, "docs")
    lengths = [8 + (i * 7919) % 120 for i in range(300)]
    with open(prefix + ".bin", "wb") as f:
        for i, n in enumerate(lengths):
            f.write(struct.pack("<%dH" % n, *[(i + j) % 200 for j in range(n)]))
    ptr = [2 * sum(lengths[:i]) for i in range(len(lengths))]
    with open(prefix + ".idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, 8, len(lengths), len(lengths) + 1))
        f.write(struct.pack("<%di" % len(lengths), *lengths) + struct.pack("<%dq" % len(ptr), *ptr))
        f.write(struct.pack("<%dq" % (len(lengths) + 1), *range(len(lengths) + 1)))
    cfg = os.path.join(tmp, "t.yaml")
    with open(cfg, "w") as f:
        f.write("model: {n_layers: 2, d_model: 32, n_heads: 4, n_kv_heads: 2, d_ffn: 64, vocab_size: 256, "
                "max_seq_len: 256, rope_theta: 10000, norm_eps: 1.0e-5, tie_embeddings: false}\n"
                "parallel: {dp: 1}\ndata: {path: %s, context_window: 128, global_batch_tokens: 512}\n"
                "balance: {hardware: cpu, packer: wlb}\ntrain: {device: cpu, steps: 2, lr: 0.001}\n" % prefix)
    train = run(WLBTRAIN, "--config", cfg, "--set", "trace.steps=2", "--set", f"trace.dir={tmp}/tr")
    both = os.path.join(tmp, "tr", "measured-predicted")
    outs = [os.path.join(tmp, "p.png")]  # (the measured track is drawn as any folder is, above)
    r6 = [run(sys.executable, "scripts/plot_timeline.py", both, "--track", "predicted", "--out", outs[0])]
    good = train.returncode == 0 and all(r.returncode == 0 for r in r6) and all(is_png(o) for o in outs)
    if os.path.isdir(both) or train.returncode != 0:
        print(("ok" if good else "not ok") + " 4 - a training run's measured-predicted files: the predicted track drawn")
    else:
        print("ok 4 # SKIP the training run wrote no measured-predicted folder (no measured timelines in this build)")
        good = True
    if not good:
        print("# " + (train.stderr[-2000:] + "".join(r.stderr for r in r6)).replace("\n", "\n# "))
    ok &= good
    subprocess.run(["rm", "-rf", tmp])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
