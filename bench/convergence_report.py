#!/usr/bin/env python3
"""The tables and the figure of bench/convergence.sh, from its runs' files.

    bench/convergence_report.py OUT PLOT SEEDS "VARIANTS" STUDY.yaml

OUT holds NAME.jsonl (log.metrics) and NAME.common.json (wlbtrain eval --out) for NAME = VARIANT-SEED.
Prints markdown tables: the set-up; validation loss against tokens (mean +- seed-to-seed standard
deviation) at the evaluations; per variant the final validation loss under its own packing and
under Plain-4D's for all, the gap to Plain-4D in units of the seed spread, and the outlier queues'
delay. Draws validation loss against tokens (mean, and the band of +- one standard deviation) and
the training loss's running mean, to PLOT.
"""
import json
import math
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts"))
from plot_dryrun import need_matplotlib  # noqa: E402
from plot_metrics import load, running_mean  # noqa: E402

NAMES = {"plain4d": "Plain-4D (fixed)", "wlb": "wlb (outlier delay)", "wlb-nodelay": "wlb (no delay)",
         "wlb-cp2": "wlb + hybrid CP 2 (2 ranks)", "tp2-sum-fp32": "bf16, TP 2, fp32 partial sums",
         "tp2-sum-bf16": "bf16, TP 2, bf16 partial sums"}


def mean_sd(xs):
    m = sum(xs) / len(xs)
    sd = math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1)) if len(xs) > 1 else 0.0
    return m, sd


def cumulative_tokens(steps):
    total, out = 0, {}
    for s in steps:
        total += s["tokens"]
        out[s["step"]] = total
    return out


def delay(steps, batch):
    """Share of tokens delayed, and the mean delay of a delayed token in steps and in tokens."""
    tokens = sum(s["tokens"] for s in steps)
    delayed = sum(s.get("delayed_tokens", 0) for s in steps)
    token_steps = sum(s.get("token_delay_steps", 0) * s["tokens"] for s in steps)
    per = token_steps / delayed if delayed else 0.0
    return delayed / tokens, per, per * batch


def main():
    out, plot, seeds, variants = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4].split()
    study = open(sys.argv[5]).read()
    batch = int(study.split("global_batch_tokens: ")[1].split(",")[0].split("}")[0])
    runs, common = {}, {}
    for v in variants:
        for s in range(1, seeds + 1):
            runs[(v, s)] = load(os.path.join(out, f"{v}-{s}.jsonl"))
            common[(v, s)] = json.load(open(os.path.join(out, f"{v}-{s}.common.json")))
    first = runs[(variants[0], 1)]
    evals = [st["step"] for st in first if "valid_loss" in st]
    vtokens = next(st["valid_tokens"] for st in first if "valid_loss" in st)
    print("\nconfig (every run; the variants set balance.* and parallel.cp on top):\n")
    print("```yaml\n" + "\n".join(line for line in study.splitlines() if not line.startswith("log:")) + "\n```")
    print(f"\nvalidation: {vtokens} tokens of the held-out documents at each evaluation (the same ones every "
          f"time), after steps {evals[0]}, {evals[1]}, ... {evals[-1]}")

    print("\nValidation loss against tokens trained (mean +- standard deviation over the seeds; each variant "
          "evaluated under its own packing rules):\n")
    picks = sorted(set([evals[0], evals[len(evals) // 4], evals[len(evals) // 2], evals[3 * len(evals) // 4],
                        evals[-1]]))
    print("| step | tokens | " + " | ".join(NAMES[v] for v in variants) + " |")
    print("|---|---|" + "---|" * len(variants))
    for step in picks:
        toks = cumulative_tokens(first)[step]
        cells = []
        for v in variants:
            xs = [next(st["valid_loss"] for st in runs[(v, s)] if st["step"] == step) for s in range(1, seeds + 1)]
            m, sd = mean_sd(xs)
            cells.append(f"{m:.4f} +- {sd:.4f}")
        print(f"| {step} | {toks:,} | " + " | ".join(cells) + " |")

    base_own = [runs[(variants[0], s)][-1]["valid_loss"] for s in range(1, seeds + 1)]
    base_common = [common[(variants[0], s)]["valid_loss"] for s in range(1, seeds + 1)]
    print("\nAt the end. own: the run's last evaluation (its own packing); common: `wlbtrain eval` of its final "
          "checkpoint with Plain-4D's packing for all (the same pieces); gap: the difference to Plain-4D's mean in "
          "units of the pooled seed-to-seed standard deviation; delay: of the tokens trained, the share read at an "
          "earlier step than the one that trained them, and the mean delay of such a token:\n")
    print("| variant | tokens trained | valid_loss own | gap / spread | valid_loss common | gap / spread | "
          "tokens delayed | mean delay of a delayed token |")
    print("|---|---|---|---|---|---|---|---|")
    rows = {}
    for v in variants:
        own = [runs[(v, s)][-1]["valid_loss"] for s in range(1, seeds + 1)]
        com = [common[(v, s)]["valid_loss"] for s in range(1, seeds + 1)]
        toks = [sum(st["tokens"] for st in runs[(v, s)]) for s in range(1, seeds + 1)]
        d = [delay(runs[(v, s)], batch) for s in range(1, seeds + 1)]
        cells = []
        for xs, base in ((own, base_own), (com, base_common)):
            m, sd = mean_sd(xs)
            bm, bsd = mean_sd(base)
            pooled = math.sqrt((sd * sd + bsd * bsd) / 2)
            gap = "-" if v == variants[0] else (f"{(m - bm) / pooled:+.2f}" if pooled > 0 else "n/a")
            cells += [f"{m:.4f} +- {sd:.4f}", gap]
        share = sum(x[0] for x in d) / len(d)
        steps_late = sum(x[1] for x in d) / len(d)
        rows[v] = (own, com)
        print(f"| {NAMES[v]} | {sum(toks) / len(toks):,.0f} | {cells[0]} | {cells[1]} | {cells[2]} | {cells[3]} | "
              f"{100 * share:.1f}% | {steps_late:.2f} steps ({steps_late * batch:,.0f} tokens) |")

    plt = need_matplotlib()
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(12, 4.6))
    colors = {"plain4d": "#c44e52", "wlb": "#4c72b0", "wlb-nodelay": "#55a868", "wlb-cp2": "#8172b2"}
    for v in variants:
        xs, ms, lo, hi = [], [], [], []
        for step in evals:
            vals = [next(st["valid_loss"] for st in runs[(v, s)] if st["step"] == step) for s in range(1, seeds + 1)]
            toks = sum(cumulative_tokens(runs[(v, s)])[step] for s in range(1, seeds + 1)) / seeds
            m, sd = mean_sd(vals)
            xs.append(toks)
            ms.append(m)
            lo.append(m - sd)
            hi.append(m + sd)
        ax.plot(xs, ms, color=colors.get(v), label=NAMES[v], linewidth=1.2, marker="o", markersize=2.5)
        ax.fill_between(xs, lo, hi, color=colors.get(v), alpha=0.18, linewidth=0)
        for s in range(1, seeds + 1):
            st = runs[(v, s)]
            cum = cumulative_tokens(st)
            bx.plot([cum[x["step"]] for x in st], running_mean([x["loss"] for x in st], 10), color=colors.get(v),
                    linewidth=0.7, alpha=0.7, label=NAMES[v] if s == 1 else None)
    ax.set_title(f"Validation loss (held-out documents; mean +- sd of {seeds} seeds)")
    ax.set_xlabel("tokens trained")
    ax.set_ylabel("cross-entropy (nats per byte)")
    ax.legend(fontsize=8)
    bx.set_title("Training loss (running mean of 10 steps; every seed)")
    bx.set_xlabel("tokens trained")
    bx.legend(fontsize=8)
    fig.tight_layout()
    if os.path.dirname(plot):
        os.makedirs(os.path.dirname(plot), exist_ok=True)
    fig.savefig(plot, dpi=110)
    plt.close(fig)
    print(f"\nfigure: {plot}")


if __name__ == "__main__":
    main()
