#!/usr/bin/env python3
"""Plots the metrics of training runs (log.metrics, one JSON object per step) as one PNG.

    scripts/plot_metrics.py METRICS.jsonl [MORE.jsonl ...] [--out FILE] [--label NAME ...]
                            [--x step|tokens] [--smooth N]

Four panels, every run in its own colour:
  loss          the training loss of every step (thin) and its running mean over --smooth steps,
                and the validation loss (valid_loss, dots joined) where the run evaluated
  tokens/s      training throughput of every step (the evaluation's time not in it)
  pp imbalance  the pipeline imbalance the planner predicted (solid) and the one measured (dashed)
  cp imbalance  the same for context parallelism
and when the runs evaluated with the loss by token position (valid_position_* of the metrics, the
buckets of train.eval_position_buckets; docs/validation.md), two more:
  by position   the validation loss of each position bucket (0-1K, 1K-4K, ...) at each evaluation,
                the later ones darker: whether the model learns to use its long context
  over steps    each bucket's validation loss over the steps
--x tokens puts the tokens trained so far on the horizontal axis instead of the step, so runs
with different batch sizes line up. Several runs (several packers, seeds, resumed runs) are
overlaid; --label names them in the legend (default: the file names). A resumed run's file
holds every step once (the trainer cuts it back when it resumes), so it plots as one run.
matplotlib comes from PyPI; it is installed with pip when missing (as scripts/plot_dryrun.py does).
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from plot_dryrun import json_lines, need_matplotlib  # noqa: E402


def load(path):
    """The step objects of a metrics file, in step order; exits with one error line when it is not one."""
    steps = []
    for n, obj in json_lines(path):
        if not isinstance(obj, dict) or "step" not in obj or "loss" not in obj:
            sys.exit(f"wlbtrain: error: {path}:{n}: not a step of log.metrics (no \"step\" and \"loss\")")
        steps.append(obj)
    if not steps:
        sys.exit(f"wlbtrain: error: {path}: no steps (write it with log.metrics: FILE)")
    steps.sort(key=lambda s: s["step"])
    return steps


def xs_of(steps, axis):
    if axis == "step":
        return [s["step"] for s in steps]
    total, out = 0, []
    for s in steps:
        total += s.get("tokens", 0)
        out.append(total)
    return out


def running_mean(values, n):
    out, acc = [], 0.0
    for i, v in enumerate(values):
        acc += v
        if i >= n:
            acc -= values[i - n]
        out.append(acc / min(i + 1, n))
    return out


def position_name(x):
    """A bucket edge as the trainer prints it: 512, 1K, 64K, 1M."""
    if x >= 1 << 20 and x % (1 << 20) == 0:
        return f"{x >> 20}M"
    if x >= 1024 and x % 1024 == 0:
        return f"{x >> 10}K"
    return str(x)


def bucket_names(edges):
    """["0-1K", "1K-4K", "4K+"] for the buckets' first positions [0, 1024, 4096]."""
    return [f"{position_name(a)}-{position_name(b)}" for a, b in zip(edges, edges[1:])] + \
        [f"{position_name(edges[-1])}+"]


def plot_by_position(runs, labels, colors, axis, by_pos, over_steps):
    """The two panels of the loss by token position (empty buckets, null in the metrics, left out)."""
    for k, (steps, label) in enumerate(zip(runs, labels)):
        c = colors[k % len(colors)]
        evals = [(xv, s) for xv, s in zip(xs_of(steps, axis), steps) if "valid_position_loss" in s]
        for j, (xv, s) in enumerate(evals):
            names = bucket_names(s["valid_position_from"])
            pts = [(i, v) for i, v in enumerate(s["valid_position_loss"]) if v is not None]
            if pts:
                last = j == len(evals) - 1
                by_pos.plot([p[0] for p in pts], [p[1] for p in pts], color=c, marker="o", markersize=3,
                            linewidth=1.2 if last else 0.7, alpha=1.0 if last else 0.25 + 0.5 * j / len(evals),
                            label=f"{label} (step {s['step']})" if last else None)
                by_pos.set_xticks(range(len(names)))
                by_pos.set_xticklabels(names)
        if not evals:
            continue
        names = bucket_names(evals[-1][1]["valid_position_from"])
        styles = ["-", "--", ":", "-."]
        for i, name in enumerate(names):
            pts = [(xv, s["valid_position_loss"][i]) for xv, s in evals
                   if i < len(s["valid_position_loss"]) and s["valid_position_loss"][i] is not None]
            if pts:
                over_steps.plot([p[0] for p in pts], [p[1] for p in pts], color=c, linestyle=styles[i % 4],
                                marker="o", markersize=2, alpha=0.4 + 0.6 * (i + 1) / len(names),
                                label=f"{label} {name}")


def plot(plt, runs, labels, axis, smooth, out):
    positions = any("valid_position_loss" in s for r in runs for s in r)
    fig, ax = plt.subplots(3 if positions else 2, 2, figsize=(12, 12 if positions else 8))
    (loss, speed), (pp, cp) = ax[0], ax[1]
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for k, (steps, label) in enumerate(zip(runs, labels)):
        c = colors[k % len(colors)]
        x = xs_of(steps, axis)
        y = [s["loss"] for s in steps]
        loss.plot(x, y, color=c, linewidth=0.4, alpha=0.35)
        loss.plot(x, running_mean(y, smooth), color=c, linewidth=1.2, label=f"{label} train")
        valid = [(xv, s["valid_loss"]) for xv, s in zip(x, steps) if "valid_loss" in s]
        if valid:
            vx, vy = zip(*valid)
            loss.plot(vx, vy, color=c, linestyle=":", marker="o", markersize=3, label=f"{label} valid")
        speed.plot(x, [s.get("tokens_per_s", 0) for s in steps], color=c, linewidth=0.8, label=label)
        for panel, key in ((pp, "pp_imbalance"), (cp, "cp_imbalance")):
            if key in steps[0]:
                panel.plot(x, [s[key] for s in steps], color=c, linewidth=0.9, label=f"{label} predicted")
                panel.plot(x, [s.get(key + "_measured", 1.0) for s in steps], color=c, linewidth=0.9,
                           linestyle="--", label=f"{label} measured")
    xlabel = "step" if axis == "step" else "tokens trained"
    loss.set_title(f"Loss (train: running mean of {smooth} steps; valid: held-out documents)")
    loss.set_ylabel("cross-entropy (nats per token)")
    speed.set_title("Training throughput")
    speed.set_ylabel("tokens/s")
    pp.set_title("Pipeline imbalance (max micro-batch x N / total)")
    cp.set_title("Context-parallel imbalance (slowest CP rank / mean)")
    for a in (loss, speed, pp, cp):
        a.set_xlabel(xlabel)
        a.legend(fontsize=7)
    for a in (pp, cp):
        a.axhline(1.0, color="gray", linewidth=0.6)
    if positions:
        by_pos, over_steps = ax[2]
        plot_by_position(runs, labels, colors, axis, by_pos, over_steps)
        by_pos.set_title("Validation loss by token position (each evaluation; the last darkest)")
        by_pos.set_xlabel("position in the document (RoPE position)")
        over_steps.set_title("Validation loss of each position bucket")
        over_steps.set_xlabel(xlabel)
        for a in (by_pos, over_steps):
            a.set_ylabel("cross-entropy (nats per token)")
            a.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("metrics", nargs="+", help="log.metrics files (JSON lines)")
    ap.add_argument("--out", default="metrics.png", help="the PNG to write (default: metrics.png)")
    ap.add_argument("--label", action="append", help="a run's name in the legend, once per file, in order")
    ap.add_argument("--x", choices=("step", "tokens"), default="step", help="horizontal axis (default: step)")
    ap.add_argument("--smooth", type=int, default=10, help="steps in the running mean of the training loss")
    args = ap.parse_args()
    if args.label and len(args.label) != len(args.metrics):
        sys.exit(f"wlbtrain: error: --label: {len(args.label)} labels for {len(args.metrics)} files")
    if args.smooth < 1:
        sys.exit(f"wlbtrain: error: --smooth: expected a positive number of steps, got {args.smooth}")
    runs = [load(p) for p in args.metrics]
    labels = args.label or [os.path.splitext(os.path.basename(p))[0] for p in args.metrics]
    plt = need_matplotlib()
    if os.path.dirname(args.out):
        os.makedirs(os.path.dirname(args.out), exist_ok=True)
    plot(plt, runs, labels, args.x, args.smooth, args.out)
    n_valid = sum(1 for r in runs for s in r if "valid_loss" in s)
    n_pos = sum(1 for r in runs for s in r if "valid_position_loss" in s)
    print(f"plot_metrics: wrote {args.out} ({len(runs)} run{'s' if len(runs) > 1 else ''}, "
          f"{sum(len(r) for r in runs)} steps, {n_valid} evaluations"
          + (f", {n_pos} by token position)" if n_pos else ")"))


if __name__ == "__main__":
    main()
