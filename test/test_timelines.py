#!/usr/bin/env python3
"""test/test_timelines.py - measured timelines (trace.steps, --trace; docs/timelines.md), read by
Holistic Trace Analysis (HTA, HolisticTraceAnalysis in test/requirements.txt) and checked against
wlbtrain's own accounting.

Three layouts of 4 CPU ranks under mpirun, 4 steps each, steps 2-3 traced: tp 2 x pp 2, cp 2 x dp 2
(ZeRO-1: its parameter gathers start in a traced step's update and run on into the next step, past
the traced window), pp 4 interleaved (2 virtual stages).
1-3 per layout:
    the files: TRACE_DIR/measured/rank<R>.pt.trace.json for every rank, JSON, with distributedInfo's
      rank and world size (and the first "rank": N in the file is R: how HTA finds a file's rank);
    the trace format's rules as Perfetto's JSON importer applies them (no Perfetto trace processor can
      be installed here): phases X, s, f, M only; X with a category, a name and ts, dur >= 0; on each
      (pid, tid) spans nest or follow each other (a partial overlap goes to an overflow track); each
      flow's s and f share id, category and name, s not after f;
    one ProfilerStep#N per traced step and none of another step; every pass of the step: per rank
      and step, a forward and a backward of the same (microbatch, chunk) pairs, each forward before
      its backward, chunk on the rank's stage (chunk % pp == stage);
    the clocks aligned across ranks: a forward of (microbatch, chunk g > 0) starts after the forward
      of (microbatch, g - 1) on the stage before ended, a backward of g < last after the backward of
      g + 1 (the message between them), within the clock pings' half round trips;
    the predicted track (TRACE_DIR/measured-predicted/: the measured events and a process "predicted"):
      per rank and step the same passes in the same order as measured, its step at the measured start;
    HTA's TraceAnalysis reads the folder: ranks 0-3; its temporal breakdown per rank - idle time and
      non-computation (communication) time - within 5% of wlbtrain's own figures for the same steps
      (log.metrics: trace_idle_s, trace_comm_s, summed over the traced steps: the ranks' accounting as
      they ran, engine/comm/comm_trace.h), and the computation time too.
4   defaults and errors: no tracing without trace.steps (no folder); trace.dir defaults to
    checkpoint.dir/traces; --trace with a malformed list: one "wlbtrain: error:" line naming
    trace.steps, exit 2, nothing written.

Environment: WLBTRAIN (default ./wlbtrain). Output: TAP.
"""
import json
import logging
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
WLBTRAIN = os.path.abspath(os.environ.get("WLBTRAIN") or os.path.join(REPO, "wlbtrain"))

from taplib import Skip, check, comment, import_module, require, run_tests  # noqa: E402

TOLERANCE = 0.05  # the target: HTA's figures within 5% of wlbtrain's own
RESOLUTION_US = 0.0015  # the files' timestamps are microseconds with 3 decimals: one nanosecond
STEPS = 4
TRACED = (2, 3)

CONFIG = """model: {n_layers: %(layers)d, d_model: 64, n_heads: 4, n_kv_heads: 2, d_ffn: 128, vocab_size: 260,
        rope_theta: 10000, norm_eps: 1.0e-5, tie_embeddings: false, max_seq_len: 512}
parallel: %(parallel)s
data: {path: %(prefix)s, context_window: 128, global_batch_tokens: 2048}
balance: {hardware: cpu, packer: wlb}
train: {device: cpu, steps: %(steps)d, lr: 0.01, warmup_steps: 2}
log: {every: 1}
"""

LAYOUTS = [
    ("tp 2 x pp 2", "{tp: 2, cp: 1, pp: 2, dp: 1}", 4, 2, 1),
    ("cp 2 x dp 2", "{tp: 1, cp: 2, pp: 1, dp: 2, zero: 1}", 4, 1, 1),
    ("pp 4 interleaved", "{tp: 1, cp: 1, pp: 4, virtual_stages: 2, dp: 1}", 8, 4, 2),
]

ENV = dict(os.environ, OMP_NUM_THREADS="1", OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           OMPI_MCA_rmaps_base_oversubscribe="1")
for k in ("WLBTRAIN_FAULT", "WLBTRAIN_STEP_DELAY", "WLB_COMM_CHAOS", "WLB_COMM_LINK"):
    ENV.pop(k, None)

MPIRUN = ["mpirun", "--oversubscribe", "--bind-to", "none", "-np", "4"]


def setup():
    hta = import_module("hta")
    require(hta, WLBTRAIN)
    work = tempfile.mkdtemp(prefix="wlbtimelines-")
    rng = random.Random(5)
    with open(os.path.join(work, "docs.jsonl"), "w") as f:
        for _ in range(600):
            n = rng.choice([3, 10, 30, 80, 200])
            f.write(json.dumps({"text": " ".join("w%d" % rng.randint(0, 50) for _ in range(n))}) + "\n")
    prefix = os.path.join(work, "docs")
    r = subprocess.run([WLBTRAIN, "convert", "--quiet", "--out", prefix, os.path.join(work, "docs.jsonl")],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True)
    check(r.returncode == 0, r.stdout)
    return {"work": work, "prefix": prefix}


def teardown(fx):
    shutil.rmtree(fx["work"], ignore_errors=True)


def write_config(fx, name, parallel, layers):
    path = os.path.join(fx["work"], name + ".yaml")
    with open(path, "w") as f:
        f.write(CONFIG % {"layers": layers, "parallel": parallel, "prefix": fx["prefix"], "steps": STEPS})
    return path


def run(cmd):
    r = subprocess.run(cmd, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True,
                       timeout=600)
    if r.returncode != 0:
        for line in (r.stdout + r.stderr).splitlines()[-25:]:
            comment("| " + line)
    return r


def load_files(folder, world):
    files = {}
    for rank in range(world):
        path = os.path.join(folder, "rank%d.pt.trace.json" % rank)
        check(os.path.exists(path), "no trace file %s" % path)
        with open(path) as f:
            text = f.read()
        m = re.search(r'"rank":\s+(\d+)', text)  # HTA's way of finding a file's rank
        check(m and int(m.group(1)) == rank, "%s: the first \"rank\": is not %d" % (path, rank))
        doc = json.loads(text)
        info = doc["distributedInfo"]
        check(info["rank"] == rank and info["world_size"] == world, "%s: distributedInfo %s" % (path, info))
        check(doc["schemaVersion"] == 1 and isinstance(doc["baseTimeNanoseconds"], int), "%s: header" % path)
        files[rank] = doc
    check(sorted(os.listdir(folder)) == sorted("rank%d.pt.trace.json" % r for r in range(world)),
          "other files in %s: %s" % (folder, os.listdir(folder)))
    return files


def check_format(rank, doc):
    """The Trace Event Format's rules as Perfetto's JSON importer applies them."""
    lanes, flows = {}, {}
    for e in doc["traceEvents"]:
        ph = e.get("ph")
        check(ph in ("X", "s", "f", "M"), "rank %d: phase %r" % (rank, ph))
        check(isinstance(e.get("pid"), int) and isinstance(e.get("tid"), int), "rank %d: pid/tid %s" % (rank, e))
        if ph == "M":
            check(e["name"] in ("process_name", "process_labels", "process_sort_index", "thread_name",
                                "thread_sort_index"), "rank %d: metadata %s" % (rank, e))
            continue
        check(isinstance(e.get("ts"), (int, float)), "rank %d: ts %s" % (rank, e))
        if ph == "X":
            check(e.get("cat") and e.get("name") and isinstance(e.get("dur"), (int, float)) and e["dur"] >= 0,
                  "rank %d: span %s" % (rank, e))
            lanes.setdefault((e["pid"], e["tid"]), []).append((e["ts"], e["ts"] + e["dur"], e["name"]))
        else:
            flows.setdefault((e["id"], e["cat"], e["name"]), {})[ph] = e["ts"]
    for lane, spans in lanes.items():
        spans.sort(key=lambda s: (s[0], -s[1]))
        stack = []
        for a, b, name in spans:
            while stack and stack[-1][1] <= a + RESOLUTION_US:
                stack.pop()
            check(not stack or b <= stack[-1][1] + RESOLUTION_US,
                  "rank %d lane %s: %s [%.3f, %.3f] overlaps %s [%.3f, %.3f] without nesting"
                  % (rank, lane, name, a, b, stack[-1][2], stack[-1][0], stack[-1][1]) if stack else "")
            stack.append((a, b, name))
    for key, ends in flows.items():
        check(set(ends) == {"s", "f"} and ends["s"] <= ends["f"], "rank %d: flow %s: %s" % (rank, key, ends))


def passes(doc):
    """{step: [(name, microbatch, chunk, ts, end)]} of the forward and backward spans, by start."""
    out = {}
    for e in doc["traceEvents"]:
        if e.get("ph") == "X" and e.get("name") in ("forward", "backward"):
            a = e["args"]
            out.setdefault(a["step"], []).append((e["name"], a["microbatch"], a["chunk"], e["ts"], e["ts"] + e["dur"],
                                                  a["stage"]))
    for v in out.values():
        v.sort(key=lambda p: p[3])
    return out


def ping_us(doc):
    m = re.search(r"ping ([0-9.]+) us", doc.get("traceName", ""))
    return float(m.group(1)) if m else 0.0


def check_layout(fx, name, parallel, layers, pp, v):
    folder = os.path.join(fx["work"], "traces-" + name.replace(" ", "_"))
    metrics = os.path.join(fx["work"], name.replace(" ", "_") + ".jsonl")
    cfg = write_config(fx, name.replace(" ", "_"), parallel, layers)
    r = run(MPIRUN + [WLBTRAIN, "--config", cfg, "--trace", "%d-%d" % TRACED, "--set", "trace.dir=" + folder,
                      "--set", "log.metrics=" + metrics])
    check(r.returncode == 0, "%s: the traced run failed" % name)
    files = load_files(os.path.join(folder, "measured"), 4)
    steps_seen = set()
    for rank, doc in files.items():
        check_format(rank, doc)
        names = {e["name"] for e in doc["traceEvents"] if e.get("ph") == "X"}
        check({"ProfilerStep#%d" % s for s in TRACED} <= names, "rank %d: no ProfilerStep spans" % rank)
        check(not [n for n in names if n.startswith("ProfilerStep#") and int(n[13:]) not in TRACED],
              "rank %d: an untraced step's ProfilerStep" % rank)
        check(any(n.startswith("ncclKernel_") for n in names), "rank %d: no communication" % rank)
        by_step = passes(doc)
        check(sorted(by_step) == list(TRACED), "rank %d: passes of steps %s" % (rank, sorted(by_step)))
        stage = (rank // (parallel_size(parallel, "tp") * parallel_size(parallel, "cp"))) % pp
        for step, ps in by_step.items():
            fwd = [(p[1], p[2]) for p in ps if p[0] == "forward"]
            bwd = [(p[1], p[2]) for p in ps if p[0] == "backward"]
            check(fwd and sorted(fwd) == sorted(bwd) and len(set(fwd)) == len(fwd),
                  "rank %d step %d: forwards %s, backwards %s" % (rank, step, fwd, bwd))
            check(all(p[2] % pp == stage and p[5] == stage for p in ps), "rank %d: a chunk off stage %d" % (rank, stage))
            check(len({c for _, c in fwd}) == v, "rank %d step %d: chunks %s" % (rank, step, {c for _, c in fwd}))
            first = {}
            for i, p in enumerate(ps):
                first.setdefault((p[0], p[1], p[2]), i)
            check(all(first[("forward", k, c)] < first[("backward", k, c)] for k, c in fwd),
                  "rank %d step %d: a backward before its forward" % (rank, step))
            steps_seen.add(step)
    check(steps_seen == set(TRACED), "traced steps %s" % steps_seen)
    # the predicted track: the same passes in the same order, from the measured step's start
    both = os.path.join(folder, "measured-predicted")
    for rank, doc in load_files(both, 4).items():
        pids = {e["pid"]: e["args"]["name"] for e in doc["traceEvents"]
                if e.get("ph") == "M" and e["name"] == "process_name"}
        predicted = [p for p, n in pids.items() if n == "predicted"]
        check(len(predicted) == 1, "rank %d: processes %s" % (rank, pids))
        own = [e for e in doc["traceEvents"] if e["pid"] != predicted[0]]
        check_format(rank, doc)  # the predicted track too: on the measured grid, no lane overlaps
        other = [e for e in doc["traceEvents"] if e["pid"] == predicted[0]]
        check(len(own) == len(files[rank]["traceEvents"]), "rank %d: the measured events are not all there" % rank)
        mine, pred = passes({"traceEvents": own}), passes({"traceEvents": other})
        for step in TRACED:
            check([p[:3] for p in mine[step]] == [p[:3] for p in pred.get(step, [])],
                  "rank %d step %d: predicted passes %s, measured %s" % (rank, step, pred.get(step), mine[step]))
            starts = [e["ts"] for e in doc["traceEvents"]
                      if e.get("name") in ("ProfilerStep#%d" % step, "predicted step %d" % step)]
            check(len(starts) == 2 and abs(starts[0] - starts[1]) <= 1, "rank %d: step %d starts %s" % (rank, step, starts))
    if pp > 1:  # the clocks: a pass after the one on the previous stage whose message it takes
        tp = parallel_size(parallel, "tp") * parallel_size(parallel, "cp")
        span = {}
        slack = {}
        for rank, doc in files.items():
            st = (rank // tp) % pp
            slack[st] = max(slack.get(st, 0.0), ping_us(doc) / 2)
            for step, ps in passes(doc).items():
                for p in ps:
                    span[(step, p[0], p[1], p[2])] = (p[3], p[4], st)
        n_chunks = pp * v
        checked = 0
        for (step, kind, k, g), (a, b, st) in span.items():
            dep = (step, kind, k, g - 1) if kind == "forward" else (step, kind, k, g + 1)
            if dep in span:
                before = span[dep]
                tol = slack[st] + slack[before[2]] + 2.0
                check(a >= before[1] - tol, "%s: step %d %s of micro-batch %d chunk %d starts at %.1f us, before "
                      "the pass it takes its input from ended (%.1f us): clocks not aligned"
                      % (name, step, kind, k, g, a, before[1]))
                checked += 1
        check(checked > 0 and n_chunks > 1, "no pass pair across stages checked")
    # HTA against wlbtrain's own accounting
    logging.disable(logging.WARNING)
    from hta.trace_analysis import TraceAnalysis
    analysis = TraceAnalysis(trace_dir=os.path.join(folder, "measured"), include_last_profiler_step=True)
    check(sorted(analysis.t.get_ranks()) == [0, 1, 2, 3], "HTA's ranks: %s" % analysis.t.get_ranks())
    breakdown = analysis.get_temporal_breakdown(visualize=False)
    with open(metrics) as f:
        rows = [json.loads(line) for line in f]
    traced = [row for row in rows if "trace_idle_s" in row]
    check([row["step"] for row in traced] == list(TRACED), "log.metrics: traced steps %s" % [row["step"] for row in traced])
    comment("%s: rank, HTA idle / own idle, HTA communication / own communication, HTA compute / own compute (us)"
            % name)
    for _, row in breakdown.iterrows():
        rank = int(row["rank"])
        own = {k: 1e6 * sum(t[k][rank] for t in traced) for k in ("trace_idle_s", "trace_comm_s", "trace_compute_s")}
        hta = {"trace_idle_s": row["idle_time(us)"], "trace_comm_s": row["non_compute_time(us)"],
               "trace_compute_s": row["compute_time(us)"]}
        comment("  %d  %.0f / %.0f  %.0f / %.0f  %.0f / %.0f" % (rank, hta["trace_idle_s"], own["trace_idle_s"],
                                                              hta["trace_comm_s"], own["trace_comm_s"],
                                                              hta["trace_compute_s"], own["trace_compute_s"]))
        for k in ("trace_idle_s", "trace_comm_s", "trace_compute_s"):
            check(own[k] > 0, "%s rank %d: no %s of its own" % (name, rank, k))
            check(abs(hta[k] - own[k]) <= TOLERANCE * own[k], "%s rank %d: HTA's %s %.0f us against wlbtrain's %.0f us "
                  "(more than %.0f%% apart)" % (name, rank, k, hta[k], own[k], 100 * TOLERANCE))


def parallel_size(parallel, key):
    m = re.search(r"\b%s: (\d+)" % key, parallel)
    return int(m.group(1)) if m else 1


def layout_test(i):
    name, parallel, layers, pp, v = LAYOUTS[i]
    return ("%s: the traces HTA reads, their figures within 5%% of wlbtrain's own" % name,
            lambda fx: check_layout(fx, name, parallel, layers, pp, v))


def test_defaults_and_errors(fx):
    cfg = write_config(fx, "single", "{tp: 1, cp: 1, pp: 1, dp: 1}", 2)
    work = fx["work"]
    here = os.path.join(work, "plain")
    os.makedirs(here)
    r = subprocess.run([WLBTRAIN, "--config", cfg, "--steps", "2"], cwd=here, env=ENV, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, universal_newlines=True, timeout=300)
    check(r.returncode == 0, r.stdout)
    check(os.listdir(here) == [], "an untraced run wrote %s" % os.listdir(here))
    ckpt = os.path.join(work, "ckpt")
    r = subprocess.run([WLBTRAIN, "--config", cfg, "--steps", "2", "--trace", "1", "--set", "checkpoint.dir=" + ckpt],
                       env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True, timeout=300)
    check(r.returncode == 0, r.stdout)
    load_files(os.path.join(ckpt, "traces", "measured"), 1)
    for bad in ("5-3", "0", "2,x", "1-"):
        out = os.path.join(work, "bad")
        r = subprocess.run([WLBTRAIN, "--config", cfg, "--trace", bad, "--set", "trace.dir=" + out], env=ENV,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True, timeout=300)
        lines = r.stderr.strip().splitlines()
        check(r.returncode == 2 and len(lines) == 1 and lines[0].startswith("wlbtrain: error:") and
              "trace.steps" in lines[0], "--trace %s: exit %d, %s" % (bad, r.returncode, r.stderr))
        check(not os.path.exists(out), "--trace %s wrote %s" % (bad, out))


TESTS = [layout_test(0), layout_test(1), layout_test(2),
         ("no trace without trace.steps; trace.dir's default; malformed --trace: exit 2", test_defaults_and_errors)]

if __name__ == "__main__":
    sys.exit(run_tests(TESTS, setup, teardown))
