#!/usr/bin/env python3
"""test/test_timeline_order.py - the dry run's predicted timeline and a training run's measured one
of the same step hold the same passes in the same order on every rank (docs/timelines.md).

For each layout - tp 2 x pp 2, cp 2 x dp 2, pp 4 interleaved (virtual_stages 2) - on 4 CPU ranks
(the tiny model, 8 layers for pp 4 x 2 chunks), one config; step 2 is traced both ways:
  the dry run:  wlbtrain --config C --dry-run --set trace.steps=2   -> TRACE_DIR/predicted/
  training:     mpirun -np 4 wlbtrain --config C --trace 2 (2 steps) -> TRACE_DIR/measured/
and per rank the sequence of (name, microbatch, chunk) of the forward and backward spans of step 2,
by start time, must be the same in the two files. The training run's predicted track
(TRACE_DIR/measured-predicted/, pid 1 << 24: its own plan of the step through plan_trace_step) must
be the dry run's file: the same passes at the same offsets from the step's start, with the same
durations (to the microsecond the measured file's grid rounds to).

1-3  the three layouts: the dry run writes one file per rank (its rank in distributedInfo), and the
     two traces agree. A training run that writes no measured trace at all (a build without the
     measured timelines) skips the comparison, saying so; any difference fails.
4    a bad trace.steps: the dry run exits 2 with one error line naming trace.steps, and writes nothing.
5    HTA reads a predicted folder as a PyTorch job's (tp 2 x pp 2 and pp 4 interleaved, steps 1-2
     predicted): every rank, and per rank its computation time (HTA's temporal breakdown) within 0.2% of
     the dry run's own figure for the same steps: the time breakdown's computation of the stage
     (products, attention, element-wise, the exposed TP and CP exchanges inside the passes, contention,
     optimizer; --stats-out), since HTA counts every device-side span not named ^nccl.*Kernel as
     computation; and some communication.

Environment: WLBTRAIN (default ./wlbtrain). Output: TAP.
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
WLBTRAIN = os.path.abspath(os.environ.get("WLBTRAIN") or os.path.join(REPO, "wlbtrain"))

from taplib import Skip, check, comment, import_module, require, run_tests  # noqa: E402

CONFIG = """model: {preset: tiny, n_layers: %(layers)d}
parallel: {tp: %(tp)d, cp: %(cp)d, pp: %(pp)d, dp: %(dp)d, virtual_stages: %(v)d, comm: mpi}
data: {path: %(prefix)s, context_window: 128, global_batch_tokens: %(batch)d}
balance: {hardware: cpu, packer: wlb, cp_sharding: %(sharding)s}
train: {device: cpu, steps: 2, lr: 0.001, warmup_steps: 1}
log: {every: 1}
"""

LAYOUTS = {
    "tp2_pp2": dict(tp=2, cp=1, pp=2, dp=1, v=1, layers=4, sharding="per_seq"),
    "cp2_dp2": dict(tp=1, cp=2, pp=1, dp=2, v=1, layers=4, sharding="per_doc"),
    "pp4_interleaved": dict(tp=1, cp=1, pp=4, dp=1, v=2, layers=8, sharding="per_seq"),
}
STEP = 2
PREDICTED_PID = 1 << 24  # a measured file's predicted track (engine/train/train_trace.h)

ENV = dict(os.environ, OMP_NUM_THREADS="1", OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           OMPI_MCA_rmaps_base_oversubscribe="1")


def run(args, timeout=300):
    return subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True,
                          env=ENV, timeout=timeout)


def write_set(prefix, lengths, vocab=512):
    """A Megatron data set (MMIDIDX v1, uint16 tokens, one sequence per document)."""
    with open(prefix + ".bin", "wb") as f:
        for i, n in enumerate(lengths):
            f.write(struct.pack("<%dH" % n, *[(i * 31 + j * 7) % vocab for j in range(n)]))
    n = len(lengths)
    pointers, at = [], 0
    for length in lengths:
        pointers.append(at)
        at += 2 * length
    with open(prefix + ".idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, 8, n, n + 1))
        f.write(struct.pack("<%di" % n, *lengths))
        f.write(struct.pack("<%dq" % n, *pointers))
        f.write(struct.pack("<%dq" % (n + 1), *range(n + 1)))


class Fixture:
    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="wlbtimeline-")
        self.prefix = os.path.join(self.dir, "docs")
        # Lengths 8 .. 250 with a few near the window: the wlb packer's micro-batches differ.
        write_set(self.prefix, [8 + (i * 7919) % 120 + (100 if i % 11 == 0 else 0) for i in range(600)])

    def config(self, name, layout):
        lay = dict(layout)
        lay["batch"] = lay["dp"] * 4 * 128  # 4 micro-batches a replica (a multiple of pp for interleaving)
        lay["prefix"] = self.prefix
        path = os.path.join(self.dir, name + ".yaml")
        with open(path, "w") as f:
            f.write(CONFIG % lay)
        return path


def setup():
    if not os.path.exists(WLBTRAIN):
        raise Skip("%s is not built" % WLBTRAIN)
    if not shutil.which("mpirun"):
        raise Skip("no mpirun")
    return Fixture()


def teardown(fx):
    shutil.rmtree(fx.dir, ignore_errors=True)


def passes(path, step, rank, track):
    """The forward and backward spans of `step` by start time, of the trace file's own processes
    (track "own") or of the predicted track beside the measured ones ("beside"), and the step's start: the
    ProfilerStep#N span's of that track, or "predicted step N"'s."""
    with open(path) as f:
        trace = json.load(f)
    check(trace["distributedInfo"]["rank"] == rank, "%s: distributedInfo.rank %s, not %d"
          % (path, trace["distributedInfo"]["rank"], rank))
    mine = [e for e in trace["traceEvents"] if e.get("ph") == "X" and (e.get("pid") == PREDICTED_PID) == (track == "beside")]
    spans = [e for e in mine if e.get("name") in ("forward", "backward") and e.get("args", {}).get("step") == step]
    spans.sort(key=lambda e: e["ts"])
    marks = [e["ts"] for e in mine if e.get("name") in ("ProfilerStep#%d" % step, "predicted step %d" % step)]
    check(len(marks) == 1, "%s: %d spans of step %d's start (%s track)" % (path, len(marks), step, track))
    return spans, marks[0]


def pass_sequence(path, step, rank):
    """(name, microbatch, chunk) of the forward and backward spans of `step`, by start time, in the
    trace file's own process tracks (not a predicted track beside the measured one)."""
    spans, _ = passes(path, step, rank, "own")
    return [(e["name"], e["args"]["microbatch"], e["args"]["chunk"]) for e in spans]


def compare(fx, name):
    layout = LAYOUTS[name]
    world = layout["tp"] * layout["cp"] * layout["pp"] * layout["dp"]
    cfg = fx.config(name, layout)
    traces = os.path.join(fx.dir, name + "-traces")
    dry = run([WLBTRAIN, "--config", cfg, "--dry-run", "--set", "trace.steps=%d" % STEP, "--set",
               "trace.dir=" + traces])
    check(dry.returncode == 0, "the dry run: %s%s" % (dry.stdout, dry.stderr))
    predicted = os.path.join(traces, "predicted")
    files = sorted(os.listdir(predicted))
    check(files == sorted("rank%d.pt.trace.json" % r for r in range(world)),
          "the dry run wrote %s, not one file per rank of %d" % (files, world))
    train = run(["mpirun", "--oversubscribe", "--bind-to", "none", "-np", str(world), WLBTRAIN, "--config", cfg,
                 "--set", "trace.steps=%d" % STEP, "--set", "trace.dir=" + traces], timeout=600)
    check(train.returncode == 0, "training: %s%s" % (train.stdout[-3000:], train.stderr[-3000:]))
    measured = os.path.join(traces, "measured")
    if not os.path.isdir(measured) or not os.listdir(measured):
        raise Skip("the training run wrote no measured trace (this build has no measured timelines): "
                   "the predicted side alone was checked")
    total = 0
    for rank in range(world):
        want = pass_sequence(os.path.join(predicted, "rank%d.pt.trace.json" % rank), STEP, rank)
        got = pass_sequence(os.path.join(measured, "rank%d.pt.trace.json" % rank), STEP, rank)
        check(len(want) > 0, "rank %d: no pass of step %d in the predicted trace" % (rank, STEP))
        if got != want:
            first = next((i for i in range(min(len(got), len(want))) if got[i] != want[i]), min(len(got), len(want)))
            raise AssertionError("rank %d, step %d: %d measured passes, %d predicted; the first difference at %d: "
                                 "measured %s, predicted %s" % (rank, STEP, len(got), len(want), first,
                                                                got[first:first + 3], want[first:first + 3]))
        total += len(want)
        # The training run's predicted track: the dry run's passes, where and as long as it put them.
        dry, dry0 = passes(os.path.join(predicted, "rank%d.pt.trace.json" % rank), STEP, rank, "own")
        beside, beside0 = passes(os.path.join(traces, "measured-predicted", "rank%d.pt.trace.json" % rank), STEP, rank,
                                 "beside")
        check(len(beside) == len(dry), "rank %d: %d passes on the training run's predicted track, %d in the dry run's"
              % (rank, len(beside), len(dry)))
        for a, b in zip(beside, dry):
            same = (a["name"], a["args"]["microbatch"], a["args"]["chunk"]) == (b["name"], b["args"]["microbatch"],
                                                                                b["args"]["chunk"])
            # (beside a measured track the spans lie on whole microseconds: their ends rounded)
            check(same and abs((a["ts"] - beside0) - (b["ts"] - dry0)) <= 1.01 and abs(a["dur"] - b["dur"]) <= 1.01,
                  "rank %d: the predicted track's %s mb %s chunk %s at +%.3f us for %.3f us; the dry run's %s mb %s "
                  "chunk %s at +%.3f us for %.3f us" % (rank, a["name"], a["args"]["microbatch"], a["args"]["chunk"],
                                                        a["ts"] - beside0, a["dur"], b["name"], b["args"]["microbatch"],
                                                        b["args"]["chunk"], b["ts"] - dry0, b["dur"]))
    comment("%s: %d ranks, %d passes of step %d, in the same order in both traces; the training run's predicted "
            "track the dry run's" % (name, world, total, STEP))


def test_bad_steps(fx):
    cfg = fx.config("bad", LAYOUTS["tp2_pp2"])
    traces = os.path.join(fx.dir, "bad-traces")
    for bad in ("2-1", "x", "3,"):
        r = run([WLBTRAIN, "--config", cfg, "--dry-run", "--set", "trace.steps=" + bad, "--set", "trace.dir=" + traces])
        lines = r.stderr.strip().splitlines()
        check(r.returncode == 2 and len(lines) == 1 and lines[0].startswith("wlbtrain: error: ") and
              "trace.steps" in lines[0],
              "trace.steps=%s: exit %d, stderr %r" % (bad, r.returncode, r.stderr))
        check(not os.path.exists(traces), "trace.steps=%s: %s was made" % (bad, traces))


def test_hta_reads_predicted(fx):
    hta = import_module("hta")
    require(hta)
    import logging
    logging.disable(logging.WARNING)
    from hta.trace_analysis import TraceAnalysis
    for name in ("tp2_pp2", "pp4_interleaved"):
        layout = LAYOUTS[name]
        world = layout["tp"] * layout["cp"] * layout["pp"] * layout["dp"]
        cfg = fx.config(name + "-hta", layout)
        traces, stats = os.path.join(fx.dir, name + "-hta"), os.path.join(fx.dir, name + "-hta.jsonl")
        r = run([WLBTRAIN, "--config", cfg, "--dry-run", "--steps", "2", "--set", "trace.steps=1-2", "--set",
                 "trace.dir=" + traces, "--stats-out", stats])
        check(r.returncode == 0, "the dry run: %s%s" % (r.stdout, r.stderr))
        with open(stats) as f:
            summary = [json.loads(line) for line in f if '"summary"' in line][0]
        stages = summary["time_breakdown"]["stages"]
        analysis = TraceAnalysis(trace_dir=os.path.join(traces, "predicted"), include_last_profiler_step=True)
        check(sorted(analysis.t.get_ranks()) == list(range(world)), "HTA's ranks: %s" % analysis.t.get_ranks())
        breakdown = analysis.get_temporal_breakdown(visualize=False)
        check(len(breakdown) == world, "HTA's breakdown has %d ranks, not %d" % (len(breakdown), world))
        comment("%s: rank, HTA computation / the dry run's (us)" % name)
        for _, row in breakdown.iterrows():
            rank = int(row["rank"])
            b = stages[rank // (layout["tp"] * layout["cp"]) % layout["pp"]]
            own = 1e6 * sum(b[k] for k in ("products", "attention", "elementwise", "tp_exposed", "cp_exposed",
                                           "contention", "optimizer"))
            got = row["compute_time(us)"]
            comment("  %d  %.0f / %.0f" % (rank, got, own))
            check(abs(got - own) <= 0.002 * own, "%s rank %d: HTA's computation %.0f us, the dry run's %.0f us"
                  % (name, rank, got, own))
            check(row["non_compute_time(us)"] > 0, "%s rank %d: HTA finds no communication" % (name, rank))


TESTS = [("tp 2 x pp 2: the same passes in the same order", lambda fx: compare(fx, "tp2_pp2")),
         ("cp 2 x dp 2: the same passes in the same order", lambda fx: compare(fx, "cp2_dp2")),
         ("pp 4 interleaved: the same passes in the same order", lambda fx: compare(fx, "pp4_interleaved")),
         ("a bad trace.steps is one error line, exit 2, nothing written", test_bad_steps),
         ("HTA reads a predicted folder: every rank, its computation time the dry run's", test_hta_reads_predicted)]

if __name__ == "__main__":
    sys.exit(run_tests(TESTS, setup, teardown))
