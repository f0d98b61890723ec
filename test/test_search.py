#!/usr/bin/env python3
"""wlbtrain --dry-run --search, the layout search, on small clusters of an 8B model with 16K windows
and a 40 GB budget (so that the memory model prunes): the pruned search ranks exactly as planning
every layout does (--search-all); its figures for the config's own layout are a plain dry run's;
--search-out writes a config whose dry run gives the best row's figures; a model whose heads do not
divide a TP degree never gets it; a cluster too small says so in one line (exit 2) with what would
fit. Synthetic lengths; a few seconds. TAP output."""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from taplib import Skip, check, comment, run_tests  # noqa: E402

WLBTRAIN = os.environ.get("WLBTRAIN", "./wlbtrain")
CONFIG = "config/examples/llama3-8b-8gpu.yaml"
STEPS = "6"


def run(*args):
    return subprocess.run([WLBTRAIN, *args], capture_output=True, text=True)


def setup():
    if not os.path.exists(WLBTRAIN):
        raise Skip("%s is not built" % WLBTRAIN)
    tmp = tempfile.mkdtemp(prefix="wlbsearch-")
    lengths = os.path.join(tmp, "lengths.txt")
    with open(lengths, "w") as f:
        f.write("\n".join(str(50 + (i * 7919) % 3000 if i % 23 else 9000 + i) for i in range(2000)))
    sets = ["--set", "data.path=", "--set", f"data.lengths_file={lengths}", "--set", "parallel.dp=1",
            "--set", "data.context_window=16384", "--set", "data.global_batch_tokens=131072",
            "--set", "train.gpu_memory_gb=40"]
    return {"tmp": tmp, "sets": sets}


def search(fx, *extra, stats=None):
    stats = stats or os.path.join(fx["tmp"], "stats.jsonl")
    r = run("--config", CONFIG, "--dry-run", "--search", "--steps", STEPS, *fx["sets"], "--stats-out", stats, *extra)
    check(r.returncode == 0, "search failed: %s" % r.stderr)
    with open(stats) as f:
        rows = [json.loads(line) for line in f]
    return r, rows


def table_rows(out):
    """The table's rows (the lines after the header line that start with a rank)."""
    lines = out.splitlines()
    start = next(i for i, l in enumerate(lines) if l.lstrip().startswith("#  tp x cp"))
    return [l for l in lines[start + 1:] if l[:3].strip().isdigit()]


LAYOUT = ("tp", "cp", "pp", "dp", "virtual_stages", "recompute", "zero", "max_tokens_per_micro_batch", "cp_sharding")


def ranked(rows):
    return sorted((r for r in rows if r["fits"]), key=lambda r: r["rank"])


def test_pruned_equals_exhaustive(fx):
    for gpus in ("8", "16"):
        r1, pruned = search(fx, "--gpus", gpus)
        r2, every = search(fx, "--gpus", gpus, "--search-all")
        n_pruned = sum("tokens_per_s" in r for r in pruned)
        n_every = sum("tokens_per_s" in r for r in every)
        comment("%s GPUs: %d layouts planned pruned, %d exhaustive" % (gpus, n_pruned, n_every))
        check(n_pruned < n_every, "the pruning planned as many layouts as the exhaustive search")
        a, b = ranked(pruned), ranked(every)
        check(a, "no layout fits %s GPUs" % gpus)
        check([tuple(x[k] for k in LAYOUT) for x in a] == [tuple(x[k] for k in LAYOUT) for x in b],
              "the ranking differs: best %s pruned, %s exhaustive" % (a[0], b[0]))
        check([x["tokens_per_s"] for x in a] == [x["tokens_per_s"] for x in b], "the figures differ")
        check(table_rows(r1.stdout) == table_rows(r2.stdout), "the tables differ")
        # exhaustive planned what does not fit too, and ranked only what fits
        check(any("tokens_per_s" in r and not r["fits"] for r in every), "--search-all planned no unfit layout")


def test_own_layout_is_a_plain_dry_run(fx):
    budget = "--set", "train.gpu_memory_gb=48"  # the config's own layout needs 43 GB
    r, rows = search(fx, *budget)
    own = [x for x in rows if x["own"]]
    check(len(own) == 1 and own[0]["fits"], "the config's own layout: %s" % own)
    own = own[0]
    check(any(l.endswith("<- the config's") for l in r.stdout.splitlines()), "the own layout is not marked")
    stats = os.path.join(fx["tmp"], "dry.jsonl")
    d = run("--config", CONFIG, "--dry-run", "--steps", STEPS, *fx["sets"], *budget, "--stats-out", stats)
    check(d.returncode == 0, d.stderr)
    with open(stats) as f:
        summary = [json.loads(line) for line in f][-1]
    check(summary.get("summary"), "no summary line")
    check(own["tokens"] == summary["tokens"], "tokens %s vs %s" % (own["tokens"], summary["tokens"]))
    check(abs(own["predicted_s"] / summary["predicted_s"] - 1) < 1e-5,
          "predicted %s s vs the dry run's %s s" % (own["predicted_s"], summary["predicted_s"]))
    check(abs(own["pp_imbalance"] - summary["pp_imbalance"]["mean"]) < 1e-5, "pp imbalance")
    check(abs(own["cp_imbalance"] - summary["cp_imbalance"]["mean"]) < 1e-5, "cp imbalance")
    check(abs(own["peak_gb"] - summary["memory"]["peak_gb"]) < 1e-3 * summary["memory"]["peak_gb"], "memory")
    plain = summary["tokens"] / summary["baseline_s"]
    check(abs(own["plain_tokens_per_s"] / plain - 1) < 1e-5, "Plain-4D %s vs %s" % (own["plain_tokens_per_s"], plain))


def test_search_out_round_trips(fx):
    out = os.path.join(fx["tmp"], "best.yaml")
    r, rows = search(fx, "--gpus", "16", "--search-out", out)
    best = ranked(rows)[0]
    stats = os.path.join(fx["tmp"], "best.jsonl")
    d = run("--config", out, "--dry-run", "--steps", STEPS, "--stats-out", stats)
    check(d.returncode == 0, d.stderr)
    with open(stats) as f:
        summary = [json.loads(line) for line in f][-1]
    # the summary's predicted_s has 6 digits (%.6g)
    check(abs(summary["tokens"] / summary["predicted_s"] / best["tokens_per_s"] - 1) < 1e-5,
          "the written config predicts %s tokens/s, the search %s" %
          (summary["tokens"] / summary["predicted_s"], best["tokens_per_s"]))
    # and it is the best layout: searching from it finds itself first, marked as the config's own
    r3 = run("--config", out, "--dry-run", "--search", "--steps", STEPS)
    check(r3.returncode == 0, r3.stderr)
    first = table_rows(r3.stdout)[0]
    check(first.endswith("<- the config's"), "the written config is not the best of its own search: %s" % first)
    printed = run("--config", out, "--print-config")
    check(printed.returncode == 0, printed.stderr)
    for key, want in (("tp", best["tp"]), ("cp", best["cp"]), ("pp", best["pp"]), ("dp", best["dp"])):
        check("\n  %s: %s\n" % (key, want) in printed.stdout, "parallel.%s is not %s" % (key, want))


def test_heads_limit_tp(fx):
    # 12 query heads, 4 kv heads: tp 8 divides neither, tp 3 and 6 not the node's 8 GPUs
    model = ["--set", "model.d_model=1536", "--set", "model.n_heads=12", "--set", "model.n_kv_heads=4"]
    r, rows = search(fx, "--gpus", "16", *model)
    tps = sorted({x["tp"] for x in rows})
    comment("tp degrees tried: %s" % tps)
    check(tps == [1, 2, 4], "tp degrees %s" % tps)
    # 16 query heads, 4 kv heads: tp 8 would replicate kv heads (a config may), the search keeps to divisors
    r, rows = search(fx, "--gpus", "16", *model[:2], "--set", "model.n_heads=16", "--set", "model.n_kv_heads=4")
    check(sorted({x["tp"] for x in rows}) == [1, 2, 4], "with 4 kv heads: tp %s" % sorted({x["tp"] for x in rows}))
    r, rows = search(fx, "--gpus", "16", *model[:2], "--set", "model.n_heads=16", "--set", "model.n_kv_heads=16")
    check(sorted({x["tp"] for x in rows}) == [1, 2, 4, 8], "with 16 heads and kv heads tp 8 is not tried")


def test_too_small_cluster(fx):
    r = run("--config", CONFIG, "--dry-run", "--search", "--steps", STEPS, *fx["sets"], "--gpus", "2")
    lines = r.stderr.strip().splitlines()
    comment(r.stderr.strip())
    check(r.returncode == 2, "exit %d" % r.returncode)
    check(len(lines) == 1 and lines[0].startswith("wlbtrain: error: --search: no layout of 2 GPUs fits"),
          "not one error line: %r" % r.stderr)
    check("GPUs would fit" in lines[0] and "train.recompute: full" in lines[0], "it does not say what would fit")
    check(r.stdout == "", "a table was printed")


def test_flags(fx):
    for args, what in ((("--search",), "--search: only with --dry-run"),
                       (("--dry-run", "--gpus", "8"), "--gpus: only with --dry-run --search"),
                       (("--dry-run", "--search", "--compare"), "--search: takes"),
                       (("--dry-run", "--search-out", "x.yaml"), "--search-out: only with")):
        r = run("--config", CONFIG, *args)
        check(r.returncode == 2 and what in r.stderr, "%s: %s" % (args, r.stderr))


def stage_peaks(out):
    """The plain dry run's memory table: {stage: peak GB}."""
    lines = out.splitlines()
    start = next(i for i, l in enumerate(lines) if l.split()[:2] == ["stage", "layers"])
    peaks = {}
    for l in lines[start + 1:]:
        f = l.split()
        if not f or not f[0].isdigit():
            break
        peaks[int(f[0])] = float(f[-1])
    return peaks


def test_worst_stage_sizes(fx):
    # A layout whose largest stage is not the first: the config's own, its layers split by hand so that
    # the last stage (pp 2, [4, 28]) or a middle one (pp 4, [2, 27, 2, 1]) holds most of them. With a
    # budget between the first stage's peak and the largest's, the search must size the layout by the
    # largest (the plain dry run's worst, the largest peak of its table) and refuse it: not ranked, not
    # written by --search-out; a plain dry run at that budget refuses it naming that stage.
    for pp, cp, layers in ((2, 2, "[4, 28]"), (4, 1, "[2, 27, 2, 1]")):
        own_sets = ["--set", "parallel.pp=%d" % pp, "--set", "parallel.cp=%d" % cp,
                    "--set", "parallel.stage_layers=%s" % layers]
        d = run("--config", CONFIG, "--dry-run", "--steps", "1", *fx["sets"], *own_sets, "--no-memory-check")
        check(d.returncode == 0, d.stderr)
        peaks = stage_peaks(d.stdout)
        largest = max(peaks, key=peaks.get)
        check(len(peaks) == pp and largest != 0 and peaks[largest] > 1.5 * peaks[0],
              "pp %d, %s: the stages' peaks %s (the test needs a later stage the largest)" % (pp, layers, peaks))
        budget = (peaks[0] + peaks[largest]) / 2
        # the plain dry run refuses it too, naming the stage
        plain = run("--config", CONFIG, "--dry-run", "--steps", "1", *fx["sets"], *own_sets,
                    "--set", "train.gpu_memory_gb=%.2f" % budget)
        check(plain.returncode == 2 and "on a rank of pipeline stage %d " % largest in plain.stderr,
              "the plain dry run at %.2f GB: exit %d, %s" % (budget, plain.returncode, plain.stderr))
        # and each change its error says would fit alone does fit, at the peak it names (its worst stage's)
        hints = re.findall(r"(?:fit: |, )([a-z_.]+): ([^ ,]+) \(([0-9.]+) GB\)", plain.stderr)
        check(hints, "no change that would fit in: %s" % plain.stderr)
        for key, value, gb in hints:
            h = run("--config", CONFIG, "--dry-run", "--steps", "1", *fx["sets"], *own_sets,
                    "--set", "train.gpu_memory_gb=%.2f" % budget, "--set", "%s=%s" % (key, value))
            check(h.returncode == 0 and "memory: peak %s GB" % gb in h.stdout,
                  "%s: %s said to fit at %s GB: exit %d, %s%s" % (key, value, gb, h.returncode, h.stderr,
                                                                  [l for l in h.stdout.splitlines() if "peak" in l]))
        comment("pp %d: the error's changes that would fit alone: %s" % (pp, hints))
        out = os.path.join(fx["tmp"], "worst.yaml")
        if os.path.exists(out):
            os.remove(out)
        r, rows = search(fx, "--gpus", "16", *own_sets, "--set", "train.gpu_memory_gb=%.2f" % budget,
                         "--search-out", out)
        own = [x for x in rows if x["own"]]
        comment("pp %d, stage layers %s: stage peaks %s GB, budget %.2f GB; the search's row: %s GB, fits %s"
                % (pp, layers, peaks, budget, own[0]["peak_gb"] if own else "-", own[0]["fits"] if own else "-"))
        check(len(own) == 1 and abs(own[0]["peak_gb"] - peaks[largest]) <= 0.01,
              "the own layout is sized %s GB, its largest stage (%d) needs %s GB"
              % (own[0]["peak_gb"] if own else "-", largest, peaks[largest]))
        check(not own[0]["fits"] and "rank" not in own[0], "a layout whose stage %d does not fit is ranked: %s"
              % (largest, own[0]))
        best = ranked(rows)
        check(best and all(x["peak_gb"] <= budget for x in best), "a ranked layout over the budget: %s" % best[:1])
        with open(out) as f:
            written = f.read()
        check("stage_layers: %s" % layers not in written and "stage_layers: [%s]" % layers[1:-1] not in written,
              "--search-out wrote the layout that does not fit")


def test_outputs_checked_first(fx):
    """--search-out and --stats-out are checked before the search; --search-out is never the config it reads;
    a huge --gpus does not count every size up to it."""
    import time
    copy = os.path.join(fx["tmp"], "input.yaml")
    shutil.copy(CONFIG, copy)
    with open(copy) as f:
        before = f.read()
    for extra, what in ((("--search-out", copy), "--search-out: %s is the config the search reads" % copy),
                        (("--search-out", "/proc/wlb/best.yaml"), "--search-out: /proc/wlb/best.yaml cannot be written"),
                        (("--stats-out", fx["tmp"]), "--stats-out: %s is a folder, not a file" % fx["tmp"])):
        t0 = time.time()
        r = run("--config", copy, "--dry-run", "--search", "--steps", STEPS, *fx["sets"], "--gpus", "16", *extra)
        lines = r.stderr.strip().splitlines()
        comment("%s: %.2f s: %s" % (extra[0], time.time() - t0, r.stderr.strip()))
        check(r.returncode == 2 and len(lines) == 1 and lines[0].startswith("wlbtrain: error: " + what),
              "%s: exit %d, %r" % (extra, r.returncode, r.stderr))
        check(r.stdout == "", "%s: the search ran" % (extra,))
    with open(copy) as f:
        check(f.read() == before, "the input config was changed")
    t0 = time.time()
    r = run("--config", CONFIG, "--dry-run", "--search", "--steps", STEPS, *fx["sets"], "--gpus", "1000000000")
    took = time.time() - t0
    comment("--gpus 1000000000: %.2f s, exit %d: %s" % (took, r.returncode, r.stderr.strip()[:200]))
    check(took < 30, "--gpus 1000000000 took %.1f s" % took)


def teardown(fx):
    shutil.rmtree(fx["tmp"], ignore_errors=True)


tests = [
    ("the pruned search ranks as planning every layout does", test_pruned_equals_exhaustive),
    ("the config's own layout: the figures of a plain dry run", test_own_layout_is_a_plain_dry_run),
    ("--search-out writes the best as a config that a dry run reproduces", test_search_out_round_trips),
    ("tp only where it divides the heads and kv heads", test_heads_limit_tp),
    ("a cluster too small: one line, exit 2, what would fit", test_too_small_cluster),
    ("the search's flags", test_flags),
    ("a layout whose later stage is the largest: sized by it, refused when it does not fit", test_worst_stage_sizes),
    ("--search-out and --stats-out checked before the search, never the input config; --gpus 1e9 quick",
     test_outputs_checked_first),
]

if __name__ == "__main__":
    sys.exit(run_tests(tests, setup, teardown))
