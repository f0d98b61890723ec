#!/usr/bin/env python3
"""Draws one step of wlbtrain's timelines (trace files, docs/timelines.md) as a PNG: one row per rank,
its passes coloured by micro-batch, its communication under them, its idle time hatched.

    scripts/plot_timeline.py FOLDER [FOLDER ...] --out PNG [--step N] [--title TEXT ...] [--ranks 0-7]
                             [--track measured|predicted] [--own-scale]

Each FOLDER is a folder of rank<R>.pt.trace.json files (a dry run's TRACE_DIR/predicted, or a
training run's TRACE_DIR/measured) and gets a panel of its own, all panels on one time axis (ms from
the step's start), so that two runs of the same step - Plain-4D and wlb, predicted and measured -
compare at a glance.

In a row: every forward (F) and backward (B, hatched) pass, labelled with its micro-batch and
coloured by it; "optimizer" and "contention" in grey; the communication spans (names starting with
"nccl") as a thin bar under it, their exposed part (exposed_us, in a predicted trace) in red; the
compute stream's gaps inside the step (pipeline bubbles, waits for messages or collectives) dotted.
--step: the step (ProfilerStep#N) to draw, default the first in the files; --ranks: which rows
(default all); --track: in a file that also holds the predicted track (its own process id, 1 << 24:
TRACE_DIR/measured-predicted/), which of the two to draw (default measured); --own-scale: each
panel on its own time axis (a prediction beside a measurement on a slower machine).
"""
import argparse
import glob
import json
import os
import re
import sys

PREDICTED_PID = 1 << 24


def need_matplotlib():
    try:
        import matplotlib
    except ImportError:
        sys.exit("wlbtrain: error: plot_timeline.py needs matplotlib (pip install matplotlib)")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def parse_ranks(text):
    out = set()
    for part in text.split(","):
        m = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", part)
        if not m:
            sys.exit(f"wlbtrain: error: --ranks {text}: expected ranks and ranges like 0-3,8")
        a = int(m.group(1))
        b = int(m.group(2)) if m.group(2) else a
        out.update(range(a, b + 1))
    return out


def load_folder(folder, track):
    """{rank: [events]} of the folder's trace files (the events of the chosen track)."""
    files = sorted(glob.glob(os.path.join(folder, "*.json")))
    if not files:
        sys.exit(f"wlbtrain: error: {folder}: no trace files (*.pt.trace.json) in it")
    ranks = {}
    for path in files:
        try:
            with open(path) as f:
                trace = json.load(f)
        except OSError as e:
            sys.exit(f"wlbtrain: error: {path}: cannot open: {e.strerror}")
        except json.JSONDecodeError as e:
            sys.exit(f"wlbtrain: error: {path}: not a trace file: {e.msg}")
        if not isinstance(trace, dict) or "traceEvents" not in trace:
            sys.exit(f"wlbtrain: error: {path}: not a trace file (no traceEvents)")
        rank = trace.get("distributedInfo", {}).get("rank")
        if not isinstance(rank, int):
            sys.exit(f"wlbtrain: error: {path}: no distributedInfo.rank")
        events = [e for e in trace["traceEvents"] if e.get("ph") == "X" and "dur" in e]
        has_predicted = any(e.get("pid") == PREDICTED_PID for e in events)
        if has_predicted:
            events = [e for e in events if (e.get("pid") == PREDICTED_PID) == (track == "predicted")]
        if has_predicted and track == "predicted":
            # A track beside a measured one (PLAN_TRACE_BESIDE): its step "predicted step N" and its
            # device-side spans in category "predicted" (every lane but the host's, thread 1).
            for e in events:
                m = re.fullmatch(r"predicted step (\d+)", e.get("name", ""))
                if m:
                    e["name"] = "ProfilerStep#" + m.group(1)
                elif e.get("cat") == "predicted" and e.get("tid") != 1:
                    e["cat"] = "kernel"
        ranks[rank] = events
    return ranks


def step_window(ranks, step):
    """(step number, start, end) in trace microseconds: the ProfilerStep#N spans over all ranks."""
    spans = {}
    for events in ranks.values():
        for e in events:
            m = re.fullmatch(r"ProfilerStep#(\d+)", e.get("name", ""))
            if m:
                n = int(m.group(1))
                a, b = spans.get(n, (float("inf"), float("-inf")))
                spans[n] = (min(a, e["ts"]), max(b, e["ts"] + e["dur"]))
    if not spans:
        return None
    n = step if step is not None else min(spans)
    if n not in spans:
        return None
    return (n,) + spans[n]


def is_comm(e):
    return e.get("name", "").startswith("nccl")


def device_spans(events, start, end):
    """The device-side spans (cat kernel, a stream) that overlap [start, end)."""
    return [e for e in events if e.get("cat") == "kernel" and e["ts"] < end and e["ts"] + e["dur"] > start]


def draw_panel(ax, ranks, shown, window, t0, colors, title):
    n, start, end = window
    rows = sorted(r for r in ranks if shown is None or r in shown)
    for y, rank in enumerate(rows):
        spans = device_spans(ranks[rank], start, end)
        compute = sorted((e for e in spans if not is_comm(e)), key=lambda e: e["ts"])
        for e in compute:
            x, w = (e["ts"] - t0) / 1e3, e["dur"] / 1e3
            args = e.get("args", {})
            name = e["name"]
            if name in ("forward", "backward"):
                mb = args.get("microbatch", 0)
                ax.broken_barh([(x, w)], (y - 0.3, 0.6), facecolors=colors(mb), edgecolor="black",
                               linewidth=0.3, hatch="///" if name == "backward" else None)
                label = ("B" if name == "backward" else "F") + str(mb)
                if w > (end - start) / 1e3 / 60:
                    ax.text(x + w / 2, y, label, ha="center", va="center", fontsize=6)
            else:
                ax.broken_barh([(x, w)], (y - 0.3, 0.6), facecolors="#555555" if name == "optimizer" else "#b39ddb",
                               edgecolor="none")
        # Idle: the compute stream's gaps inside the step.
        at = start
        for e in compute:
            if e["ts"] > at:
                ax.broken_barh([((at - t0) / 1e3, (e["ts"] - at) / 1e3)], (y - 0.3, 0.6), facecolors="none",
                               edgecolor="#bbbbbb", hatch="....", linewidth=0)
            at = max(at, e["ts"] + e["dur"])
        if end > at:
            ax.broken_barh([((at - t0) / 1e3, (end - at) / 1e3)], (y - 0.3, 0.6), facecolors="none",
                           edgecolor="#bbbbbb", hatch="....", linewidth=0)
        for e in (e for e in spans if is_comm(e)):
            x, w = (e["ts"] - t0) / 1e3, e["dur"] / 1e3
            ax.broken_barh([(x, w)], (y + 0.32, 0.12), facecolors="#9e9e9e", edgecolor="none")
            exposed = e.get("args", {}).get("exposed_us", 0) / 1e3
            if exposed > 0:
                ax.broken_barh([(x + w - min(exposed, w), min(exposed, w))], (y + 0.32, 0.12), facecolors="#d32f2f",
                               edgecolor="none")
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([f"rank {r}" for r in rows], fontsize=7)
    ax.set_ylim(len(rows) - 0.4, -0.6)
    ax.set_title(f"{title}: step {n}, {(end - start) / 1e3:.1f} ms", fontsize=9, loc="left")
    ax.tick_params(axis="x", labelsize=7)
    ax.axvline((end - t0) / 1e3, color="black", linewidth=0.8, linestyle="--")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("folders", nargs="+")
    ap.add_argument("--out", required=True)
    ap.add_argument("--step", type=int)
    ap.add_argument("--title", nargs="*", default=[])
    ap.add_argument("--ranks")
    ap.add_argument("--track", choices=("measured", "predicted"), default="measured")
    ap.add_argument("--own-scale", action="store_true")
    a = ap.parse_args()
    shown = parse_ranks(a.ranks) if a.ranks else None
    panels = []
    for i, folder in enumerate(a.folders):
        ranks = load_folder(folder, a.track)
        window = step_window(ranks, a.step)
        if window is None:
            which = f"step {a.step}" if a.step is not None else "a step"
            sys.exit(f"wlbtrain: error: {folder}: no ProfilerStep span of {which} in its trace files")
        title = a.title[i] if i < len(a.title) else folder
        panels.append((ranks, window, title))
    plt = need_matplotlib()
    from matplotlib.patches import Patch
    tab10 = plt.get_cmap("tab10")
    palette = [tab10(i) for i in (0, 1, 2, 4, 5, 6, 8, 9)]  # no red: red is exposed communication

    def colors(mb):
        return palette[mb % len(palette)]
    rows = [len([r for r in p[0] if shown is None or r in shown]) for p in panels]
    height = 0.9 + sum(0.32 * r + 0.45 for r in rows) + (0.25 * len(panels) if a.own_scale else 0)
    fig, axes = plt.subplots(len(panels), 1, figsize=(10, height), sharex=not a.own_scale,
                             gridspec_kw={"height_ratios": [max(r, 1) for r in rows]}, squeeze=False)
    for ax, (ranks, window, title) in zip(axes[:, 0], panels):
        draw_panel(ax, ranks, shown, window, window[1], colors, title)
    for ax in axes[:, 0] if a.own_scale else axes[-1:, 0]:
        ax.set_xlabel("ms from the step's start", fontsize=7)
    legend = [Patch(facecolor=colors(0), edgecolor="black", label="forward (colour: micro-batch)"),
              Patch(facecolor=colors(0), edgecolor="black", hatch="///", label="backward"),
              Patch(facecolor="#555555", label="optimizer"),
              Patch(facecolor="#9e9e9e", label="communication"),
              Patch(facecolor="#d32f2f", label="exposed communication"),
              Patch(facecolor="none", edgecolor="#bbbbbb", hatch="....", label="idle: bubble, waits")]
    fig.legend(handles=legend, loc="lower center", ncol=6, fontsize=7, frameon=False)
    fig.tight_layout(rect=(0, 0.3 / height, 1, 1))  # the legend's 0.3 inch below the axes
    try:
        fig.savefig(a.out, dpi=90)
    except OSError as e:
        sys.exit(f"wlbtrain: error: {a.out}: cannot write: {e.strerror}")
    print(f"plot_timeline: {a.out}")


if __name__ == "__main__":
    main()
