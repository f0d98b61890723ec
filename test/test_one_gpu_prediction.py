#!/usr/bin/env python3
"""The cost model against every one-GPU measurement (bench/measured/one_gpu.md): each row dry-run
with its GPU's engine profile (balance.hardware = the row's GPU, train.device: cuda) on the documents
the bench trained (the WLB-LLM length list in order, each cut to the window: bench/make_corpus.py),
the median predicted step of steps 3 to STEPS (the bench's median) within 10% of the measured step
time. Also: the dry run names the profile it priced with and where it came from, and the published
what-if profile (h100-fa3) predicts faster than the engine's. Needs ../shared/real-data. TAP output."""
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from taplib import Skip, check, comment, need_file, run_tests  # noqa: E402

WLBTRAIN = os.environ.get("WLBTRAIN", "./wlbtrain")
TABLE = "bench/measured/one_gpu.md"
LENGTHS = os.path.join(os.environ.get("WLB_REAL_DATA", "../shared/real-data"), "lengths",
                       "distca_wlbllm_lengths.json")
TOLERANCE = 0.10


def rows():
    """The table's rows as dicts keyed by its header."""
    lines = [l.strip() for l in open(TABLE) if l.strip().startswith("|")]
    head = [c.strip() for c in lines[0].strip("|").split("|")]
    return [dict(zip(head, (c.strip() for c in l.strip("|").split("|")))) for l in lines[2:]]


def setup():
    if not os.path.exists(WLBTRAIN):
        raise Skip("%s is not built" % WLBTRAIN)
    need_file(LENGTHS)
    return {"tmp": tempfile.mkdtemp(prefix="wlbonegpu-"), "lengths": [x for x in json.load(open(LENGTHS)) if x > 0]}


def predict(fx, row, hardware=None, extra=()):
    """The row's dry run: (median predicted step ms of steps 3.., median tokens, stdout)."""
    window, steps = int(row["window"]), int(row["steps"])
    # bench/gpu_throughput.sh's corpus: window * steps * 4 / 2000 + 200 documents, the list in order.
    docs = window * steps * 4 // 2000 + 200
    src = [max(1, min(x, window)) for x in fx["lengths"]]
    lengths = os.path.join(fx["tmp"], "lengths-%d.json" % window)
    with open(lengths, "w") as f:
        json.dump([src[i % len(src)] for i in range(docs)], f)
    cfg = os.path.join(fx["tmp"], "row.yaml")
    with open(cfg, "w") as f:
        f.write("model: %s\nparallel: {tp: 1, cp: 1, pp: 1, dp: 1}\n"
                "data: {lengths_file: %s, context_window: %d, global_batch_tokens: %d}\n"
                "balance: {packer: %s, hardware: %s, max_tokens_per_micro_batch: %d}\n"
                "train: {device: cuda, precision: bf16, recompute: %s, steps: %d}\n"
                % (row["model"], lengths, window, 4 * window, row["packer"], hardware or row["GPU"], window,
                   row["recompute"], steps))
    stats = os.path.join(fx["tmp"], "stats.jsonl")
    r = subprocess.run([WLBTRAIN, "--config", cfg, "--dry-run", "--steps", str(steps), "--stats-out", stats, *extra],
                       capture_output=True, text=True)
    check(r.returncode == 0, "dry run failed: %s" % r.stderr)
    with open(stats) as f:
        per_step = [json.loads(l) for l in f if '"summary"' not in l][2:]
    return (statistics.median(s["predicted_ms"] for s in per_step), statistics.median(s["tokens"] for s in per_step),
            r.stdout)


def test_every_row_within_tolerance(fx):
    worst = 0
    compared = 0
    for row in rows():
        if not row.get("comparable", "yes").startswith("yes"):
            comment("%s window %s %s on %s (%s): not compared, %s" % (row["model"], row["window"], row["packer"],
                                                                      row["GPU"], row["commit"], row["comparable"]))
            continue
        compared += 1
        ms, tokens, _ = predict(fx, row)
        measured = float(row["measured step ms"])
        ratio = ms / measured
        comment("%s window %s %s recompute %s on %s: predicted %.0f ms (%.0f tokens/s), measured %.0f ms (%s): %.3f"
                % (row["model"], row["window"], row["packer"], row["recompute"], row["GPU"], ms, tokens / ms * 1e3,
                   measured, row["measured tokens/s"], ratio))
        worst = max(worst, abs(ratio - 1))
        check(abs(ratio - 1) <= TOLERANCE, "window %s %s: predicted %.0f ms, measured %.0f ms (%.1f%% off, more than "
              "%.0f%%)" % (row["window"], row["packer"], ms, measured, 100 * (ratio - 1), 100 * TOLERANCE))
    comment("worst: %.1f%% of %d rows compared" % (100 * worst, compared))
    check(compared > 0, "no row of %s is comparable" % TABLE)


def test_the_dry_run_names_its_profile(fx):
    row = rows()[0]
    _, _, out = predict(fx, row)
    line = next((l for l in out.splitlines() if l.startswith("cost profile: ")), "")
    check(row["GPU"] in line and "engine/plan/profiles/%s.json" % row["GPU"] in line,
          "the dry run's profile line names the engine profile: %r" % line)
    _, _, out = predict(fx, row, hardware="h100-fa3")
    line = next((l for l in out.splitlines() if l.startswith("cost profile: ")), "")
    check(line.startswith("cost profile: h100-fa3: published rates"), "the what-if profile says so: %r" % line)


def test_published_rates_predict_faster(fx):
    """The what-if: FlashAttention-3's published rates price the same step faster than the engine."""
    for row in rows()[:2]:
        engine, _, _ = predict(fx, row)
        fa3, _, _ = predict(fx, row, hardware="h200-fa3")
        check(fa3 < 0.9 * engine, "window %s: h200-fa3 %.0f ms against the engine's %.0f" % (row["window"], fa3, engine))


def teardown(fx):
    shutil.rmtree(fx["tmp"], ignore_errors=True)


tests = [
    ("every one-GPU measurement predicted within 10% under its GPU's engine profile", test_every_row_within_tolerance),
    ("the dry run names its cost profile and where it came from", test_the_dry_run_names_its_profile),
    ("the published what-if (h200-fa3) prices the same steps faster", test_published_rates_predict_faster),
]

if __name__ == "__main__":
    sys.exit(run_tests(tests, setup, teardown))
