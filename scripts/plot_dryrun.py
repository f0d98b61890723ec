#!/usr/bin/env python3
"""Turns a dry-run stats file (wlbtrain --dry-run --stats-out FILE) into PNG figures.

    scripts/plot_dryrun.py STATS.jsonl [--out DIR] [--step N]

Figures, each written only when the stats hold what it needs:
  imbalance.png     pp_imbalance of every step, one line per packer and CP mode (a --compare run
                    has them all; a plain run has one)
  microbatches.png  the predicted cost of every micro-batch of one step (--step, default the step
                    with the largest Plain-4D imbalance), the configured packer beside Plain-4D on
                    the same documents
  cp_ranks.png      the per-rank compute of that step's worst micro-batch under per_seq, per_doc
                    and hybrid sharding
matplotlib comes from PyPI; it is installed with pip when missing.
"""
import argparse
import json
import os
import subprocess
import sys


def need_matplotlib():
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print("plot_dryrun: installing matplotlib from PyPI", file=sys.stderr)
        subprocess.check_call([sys.executable, "-m", "pip", "install", "-q", "matplotlib"])
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def json_lines(path):
    """(line number, object) of every non-blank line of a JSON-lines file; one error line and exit
    when the file cannot be read or a line is not JSON (scripts/plot_metrics.py reads with it too)."""
    out = []
    try:
        f = open(path)
    except OSError as e:
        sys.exit(f"wlbtrain: error: {path}: cannot open: {e.strerror}")
    with f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                out.append((n, json.loads(line)))
            except json.JSONDecodeError as e:
                sys.exit(f"wlbtrain: error: {path}:{n}: not a JSON line: {e.msg}")
    return out


def load(path):
    steps, summaries = [], []
    for _, obj in json_lines(path):
        (summaries if obj.get("summary") else steps).append(obj)
    if not steps:
        sys.exit(f"wlbtrain: error: {path}: no step lines (write it with wlbtrain --dry-run --stats-out)")
    return steps, summaries


# The systems of WLB-LLM's evaluation and ours, when a --compare run has them; else every run.
NAMED = [(("fixed", "per_seq"), "Plain-4D (fixed + per_seq)", "#c44e52"),
         (("fixed_greedy", "adaptive"), "Fixed-4D (fixed_greedy + adaptive)", "#dd8452"),
         (("wlb", "adaptive"), "WLB-LLM (wlb + adaptive)", "#55a868"),
         (("wlb", "hybrid"), "wlbtrain (wlb + hybrid)", "#4c72b0")]


def plot_imbalance(plt, steps, out):
    runs = {}
    for s in steps:
        runs.setdefault((s["packer"], s["cp_sharding"]), []).append((s["step"], s["pp_imbalance"]))
    lines = [(runs[k], label, color) for k, label, color in NAMED if k in runs]
    if len(lines) < 2:
        lines = [(pts, f"{p} + {m}", None) for (p, m), pts in sorted(runs.items())]
    fig, ax = plt.subplots(figsize=(9, 4.5))
    for pts, label, color in lines:
        xs, ys = zip(*pts)
        ax.plot(xs, ys, label=label, color=color, linewidth=1.1)
    ax.axhline(1.0, color="gray", linewidth=0.6)
    ax.set_xlabel("step")
    ax.set_ylabel("pp imbalance (max micro-batch x N / total)")
    ax.set_title("Predicted pipeline imbalance per step")
    ax.legend(fontsize=7, ncol=3)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def pick_step(steps, wanted):
    with_base = [s for s in steps if "baseline_mb_cost_ms" in s]
    if not with_base:
        return None
    if wanted is not None:
        for s in with_base:
            if s["step"] == wanted:
                return s
        sys.exit(f"wlbtrain: error: --step {wanted}: no such step with a baseline in the stats")

    def plain_imbalance(s):
        c = s["baseline_mb_cost_ms"]
        return max(c) * len(c) / sum(c) if sum(c) > 0 else 1.0
    return max(with_base, key=plain_imbalance)


def plot_microbatches(plt, s, out):
    wlb, base = s["mb_cost_ms"], s["baseline_mb_cost_ms"]
    fig, ax = plt.subplots(figsize=(9, 4.5))
    ax.bar([i - 0.2 for i in range(len(base))], base, width=0.4, label="Plain-4D (fixed + per_seq)", color="#c44e52")
    ax.bar([i + 0.2 for i in range(len(wlb))], wlb, width=0.4, label=f"{s['packer']} + {s['cp_sharding']}",
           color="#4c72b0")
    ax.set_xticks(range(max(len(base), len(wlb))))
    ax.set_xlabel("micro-batch (empty ones pad a replica's pipeline)")
    ax.set_ylabel("predicted cost, ms (all layers, forward + backward)")
    ax.set_title(f"Step {s['step']}: the same documents, packed two ways "
                 f"(predicted {s['predicted_ms']:.0f} ms vs {s['baseline_ms']:.0f} ms)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def plot_cp_ranks(plt, s, out):
    modes = s["cp_rank_ms"]
    n = len(next(iter(modes.values())))
    fig, ax = plt.subplots(figsize=(9, 4.5))
    width = 0.8 / len(modes)
    for k, (mode, costs) in enumerate(modes.items()):
        ax.bar([r - 0.4 + width * (k + 0.5) for r in range(n)], costs, width=width, label=mode)
    ax.set_xticks(range(n))
    ax.set_xlabel("CP rank")
    ax.set_ylabel("predicted compute, ms (all layers)")
    ax.set_title(f"Step {s['step']}, micro-batch {s['cp_rank_mb']}: work of each CP rank by sharding mode")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("stats")
    ap.add_argument("--out", default=".", help="folder for the PNG files (default: here)")
    ap.add_argument("--step", type=int, help="the step of the micro-batch figures")
    args = ap.parse_args()
    steps, _ = load(args.stats)
    plt = need_matplotlib()
    os.makedirs(args.out, exist_ok=True)
    written = []
    path = os.path.join(args.out, "imbalance.png")
    plot_imbalance(plt, steps, path)
    written.append(path)
    s = pick_step(steps, args.step)
    if s is not None:
        path = os.path.join(args.out, "microbatches.png")
        plot_microbatches(plt, s, path)
        written.append(path)
        if "cp_rank_ms" in s:
            path = os.path.join(args.out, "cp_ranks.png")
            plot_cp_ranks(plt, s, path)
            written.append(path)
    print("plot_dryrun: wrote " + ", ".join(written))


if __name__ == "__main__":
    main()
