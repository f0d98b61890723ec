#!/usr/bin/env python3
"""Converts training metrics (log.metrics, one JSON object per step) into TensorBoard event files.

    scripts/metrics_to_tensorboard.py METRICS.jsonl [MORE.jsonl ...] --logdir DIR [--name NAME ...]
    tensorboard --logdir DIR

Each metrics file becomes one run, DIR/NAME (default NAME: the file name without .jsonl), whose
scalars are every number of its step lines at that step:
  train/       loss, lr, grad_norm, skipped
  valid/       loss (valid_loss), tokens (valid_tokens), eval_ms - at the steps that evaluated
  throughput/  tokens, batch_fraction (of data.global_batch_tokens), tokens_per_s, step_ms, attn_pairs
  balance/     pp_imbalance, cp_imbalance and mb_imbalance, predicted and _measured; queued,
               token_delay_steps, delayed_tokens (the outlier queues)
  memory/      mem_used_gb, mem_peak_gb, mem_predicted_gb
and any other number under other/. Lists (the per-micro-batch times) are left out. A run's old
event files are replaced, so converting again after more steps gives one clean run.

The event files are written by tensorboardX (PyPI: a TensorBoard writer without TensorFlow; about
3 MB with protobuf): pip install tensorboardX. TensorBoard itself (pip install tensorboard) reads
them; so does anything that reads TensorBoard's format.
"""
import argparse
import glob
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from plot_metrics import load  # noqa: E402

GROUPS = {
    "loss": "train/loss", "lr": "train/lr", "grad_norm": "train/grad_norm", "skipped": "train/skipped",
    "valid_loss": "valid/loss", "valid_tokens": "valid/tokens", "eval_ms": "valid/eval_ms",
    "tokens": "throughput/tokens", "tokens_per_s": "throughput/tokens_per_s", "step_ms": "throughput/step_ms",
    "attn_pairs": "throughput/attn_pairs", "batch_fraction": "throughput/batch_fraction",
}
PREFIXES = (("pp_imbalance", "balance/"), ("cp_imbalance", "balance/"), ("mb_imbalance", "balance/"),
            ("queued", "balance/"), ("token_delay_steps", "balance/"), ("delayed_tokens", "balance/"),
            ("mem_", "memory/"))


def tag_of(key):
    if key in GROUPS:
        return GROUPS[key]
    for prefix, group in PREFIXES:
        if key.startswith(prefix):
            return group + key
    return "other/" + key


def scalars(step):
    """(tag, value) of every number of a step line but the step itself."""
    for key, value in step.items():
        if key != "step" and isinstance(value, (int, float)) and not isinstance(value, bool):
            yield tag_of(key), float(value)


def convert(writer_class, steps, logdir):
    os.makedirs(logdir, exist_ok=True)
    for old in glob.glob(os.path.join(logdir, "events.out.tfevents.*")):
        os.remove(old)
    writer = writer_class(logdir=logdir)
    n = 0
    for s in steps:
        for tag, value in scalars(s):
            writer.add_scalar(tag, value, global_step=int(s["step"]))
            n += 1
    writer.close()
    return n


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("metrics", nargs="+", help="log.metrics files (JSON lines)")
    ap.add_argument("--logdir", required=True, help="TensorBoard's log folder: one run in it per file")
    ap.add_argument("--name", action="append", help="a run's folder name, once per file, in order")
    args = ap.parse_args()
    if args.name and len(args.name) != len(args.metrics):
        sys.exit(f"wlbtrain: error: --name: {len(args.name)} names for {len(args.metrics)} files")
    names = args.name or [os.path.basename(p).rsplit(".jsonl", 1)[0] for p in args.metrics]
    if len(set(names)) != len(names):
        sys.exit("wlbtrain: error: two files give the same run name; name them with --name")
    runs = [load(p) for p in args.metrics]
    try:
        from tensorboardX import SummaryWriter
    except ImportError:
        sys.exit("wlbtrain: error: metrics_to_tensorboard: needs the Python package tensorboardX "
                 f"(pip install tensorboardX) in {sys.executable}")
    for steps, name in zip(runs, names):
        n = convert(SummaryWriter, steps, os.path.join(args.logdir, name))
        print(f"metrics_to_tensorboard: {os.path.join(args.logdir, name)}: {n} scalars of {len(steps)} steps")


if __name__ == "__main__":
    main()
