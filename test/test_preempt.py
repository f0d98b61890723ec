#!/usr/bin/env python3
"""test/test_preempt.py - time limits and preemption: a run stopped early writes a checkpoint, and
resuming it gives the uninterrupted run bit for bit (docs/slurm.md, "Time limits and preemption").

Every multi-rank run is 4 ranks under mpirun (pp 2 x dp 2, the wlb packer), 12 steps, a checkpoint
every 8 steps, so a stop (after steps 3 to 5 here) must save one of its own. "The same run" means:
every line of log.metrics has the same loss, grad_norm and lr text (17 digits), and the final
checkpoint (every shard, index.json, state.bin) has the same bytes, what names the run (its id) aside.
1   train.stop_after: 5 (steps of this run), run three times with checkpoint.resume: auto: stops
    after steps 5 and 10 with exit 0 and finishes at 12; the same run as the uninterrupted one.
2   train.stop_after: 1s (rank 0's clock; WLBTRAIN_STEP_DELAY slows rank 0 so the time runs out
    after a few steps): every rank stops after the same step, exit 0; resumed: the same run.
3   SIGUSR1 sent to mpirun (which forwards it to every rank) once log.metrics shows step 2: the
    ranks finish the step in flight, write its checkpoint, exit 75; resumed: the same run.
4   SIGTERM sent to rank 3 only (a signal that reaches some ranks): all ranks stop after the same
    step, exit 75, checkpoint; resumed: the same run.
5   one process without checkpoint.dir, SIGUSR1: a warning that nothing was saved, exit 75.
6   SIGTERM, then SIGUSR1, to one process while its last step runs: the run finished - exit 0 (no
    requeue), no stop line, the last step's checkpoint.
8   SIGTERM to rank 3 in the middle of the checkpoint due after step 8 (WLBTRAIN_FAULT=savesignal@3:8):
    that save finishes and the run stops after step 8 - no step 9, no second save - exit 75;
    resumed: the same run.
7   bad train.stop_after values (--set and YAML): one "wlbtrain: error:" line, exit 2; good ones
    resolve.

Environment: WLBTRAIN (default ./wlbtrain). Output: TAP.
"""
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
WLBTRAIN = os.path.abspath(os.environ.get("WLBTRAIN") or os.path.join(REPO, "wlbtrain"))

from taplib import check, comment  # noqa: E402

PREEMPTED = 75  # TRAIN_EXIT_PREEMPTED (engine/train/train.h)
STEPS = 12

CONFIG = """model: {n_layers: 2, d_model: 32, n_heads: 4, n_kv_heads: 2, d_ffn: 64, vocab_size: 260,
        rope_theta: 10000, norm_eps: 1.0e-5, tie_embeddings: false, max_seq_len: 256}
parallel: {tp: 1, cp: 1, pp: 2, dp: auto}
data: {path: %(prefix)s, context_window: 64, global_batch_tokens: 512}
balance: {hardware: cpu, packer: wlb}
train: {device: cpu, steps: %(steps)d, lr: 0.01, warmup_steps: 2}
checkpoint: {every: 8, keep: 20}
log: {every: 1}
"""

ENV = dict(os.environ, OMP_NUM_THREADS="1", OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           OMPI_MCA_rmaps_base_oversubscribe="1")
ENV.pop("WLBTRAIN_FAULT", None)
ENV.pop("WLBTRAIN_STEP_DELAY", None)

work = None


def command(ranks, name, args, delay=None, fault=None):
    """The wlbtrain command of run NAME (checkpoint.dir WORK/NAME, log.metrics WORK/NAME.jsonl)."""
    cmd = []
    if ranks:
        cmd = ["mpirun", "--oversubscribe", "--bind-to", "none", "-np", str(ranks)]
        if delay is not None:
            cmd += ["-x", "WLBTRAIN_STEP_DELAY"]
        if fault is not None:
            cmd += ["-x", "WLBTRAIN_FAULT"]
    cmd += [WLBTRAIN, "--config", os.path.join(work, "tiny.yaml"), "--set", "log.metrics=%s/%s.jsonl" % (work, name)]
    if name:
        cmd += ["--set", "checkpoint.dir=%s/%s" % (work, name)]
    env = dict(ENV)
    if delay is not None:
        env["WLBTRAIN_STEP_DELAY"] = str(delay)
    if fault is not None:
        env["WLBTRAIN_FAULT"] = fault
    return cmd + list(args), env


def train(ranks, name, args=(), delay=None, fault=None):
    cmd, env = command(ranks, name, args, delay, fault)
    return subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True,
                          timeout=300)


def show(r):
    for line in (r.stdout + r.stderr).splitlines()[-25:]:
        comment("| " + line)


def metrics(name):
    path = os.path.join(work, name + ".jsonl")
    if not os.path.exists(path):
        return []
    rows = []
    with open(path) as f:
        for line in f:
            if line.endswith("\n"):
                # The texts as written: a number parsed and printed again could hide a difference.
                o = json.loads(line, parse_float=str)
                rows.append((o["step"], o["loss"], o["grad_norm"], o["lr"]))
    return rows


def latest(name):
    with open(os.path.join(work, name, "latest")) as f:
        return f.read().strip()


def read(path):
    with open(path, "rb") as f:
        return f.read()


def content(path):
    """A checkpoint file's content but what names its run (two runs have two run ids): a state file's
    sections but its ident, index.json but its run, its files' checksums (they cover the idents) and
    its own checksum."""
    raw = read(path)
    if os.path.basename(path) == "index.json":
        d = json.loads(raw)
        return dict((k, v) for k, v in d.items() if k not in ("run", "contents", "crc32"))
    n = int.from_bytes(raw[12:16], "little")
    out = []
    for i in range(n):
        e = raw[24 + 56 * i:24 + 56 * (i + 1)]
        at, size = int.from_bytes(e[32:40], "little"), int.from_bytes(e[40:48], "little")
        if e[:32].rstrip(b"\0") != b"ident":
            out.append((e[:32], raw[at:at + size]))
    return out


def check_same_run(name, ref="whole"):
    a, b = metrics(ref), metrics(name)
    check(len(a) == STEPS, "%s: %d metrics lines" % (ref, len(a)))
    check([r[0] for r in b] == list(range(1, STEPS + 1)), "%s: steps %s" % (name, [r[0] for r in b]))
    for x, y in zip(a, b):
        check(x == y, "step %d: %s uninterrupted, %s in %s" % (x[0], x[1:], y[1:], name))
    final = "step-%08d" % STEPS
    check(latest(name) == final, "%s: latest is %s" % (name, latest(name)))
    # Every file of the checkpoint but the config (the runs were started with other flags): the
    # ranks' shards (weights and moments), the index and the training state, what names the run aside.
    files = sorted(f for f in os.listdir(os.path.join(work, ref, final)) if f != "config.yaml")
    check(any(f.startswith("shard-") for f in files) and "state.bin" in files, "%s: files %s" % (ref, files))
    check(sorted(f for f in os.listdir(os.path.join(work, name, final)) if f != "config.yaml") == files,
          "%s: other checkpoint files than the uninterrupted run's" % name)
    for f in files:
        check(content(os.path.join(work, ref, final, f)) == content(os.path.join(work, name, final, f)),
              "%s: %s/%s differs from the uninterrupted run's" % (name, final, f))


def resume(name, ranks=4, args=()):
    r = train(ranks, name, ("--set", "checkpoint.resume=auto") + tuple(args))
    if r.returncode != 0:
        show(r)
    check(r.returncode == 0, "resumed %s: exit status %d" % (name, r.returncode))
    return r


def check_stopped(r, name, status, why):
    """A run that stopped early: the status, the log line, the checkpoint of the last step. Returns that step."""
    if r.returncode != status or why not in r.stdout:
        show(r)
    check(r.returncode == status, "%s: exit status %d, expected %d" % (name, r.returncode, status))
    check(why in r.stdout, "%s: no %r in the output" % (name, why))
    done = metrics(name)
    step = len(done)
    check(0 < step < STEPS, "%s: stopped after %d steps" % (name, step))
    check([x[0] for x in done] == list(range(1, step + 1)), "%s: metrics steps %s" % (name, [x[0] for x in done]))
    check("stopped after step %d of %d" % (step, STEPS) in r.stdout, "%s: no 'stopped after step %d'" % (name, step))
    check(latest(name) == "step-%08d" % step, "%s: latest is %s after step %d" % (name, latest(name), step))
    check(os.path.exists(os.path.join(work, name, "step-%08d" % step, "state.bin")), "%s: no checkpoint" % name)
    return step


def test_stop_after_steps():
    for k, stop in enumerate((5, 10, STEPS)):
        args = ["--set", "train.stop_after=5"] + (["--set", "checkpoint.resume=auto"] if k else [])
        r = train(4, "steps", args)
        if stop < STEPS:
            check_stopped(r, "steps", 0, "stop: train.stop_after 5 reached; stopped after step %d of %d" % (stop, STEPS))
        else:
            if r.returncode != 0:
                show(r)
            check(r.returncode == 0 and "stop:" not in r.stdout, "steps: the last run did not finish")
    check_same_run("steps")


def test_stop_after_time():
    r = train(4, "time", ["--set", "train.stop_after=1s"], delay=0.25)
    step = check_stopped(r, "time", 0, "stop: train.stop_after 1s reached")
    comment("stop_after 1s: stopped after step %d" % step)
    resume("time")
    check_same_run("time")


def wait_for_step(name, step, proc):
    t0 = time.time()
    while len(metrics(name)) < step:
        check(proc.poll() is None, "%s ended before step %d" % (name, step))
        check(time.time() - t0 < 120, "%s: no step %d after 120 s" % (name, step))
        time.sleep(0.02)


def rank_pid(parent, rank):
    """The pid of the child of mpirun (pid parent) that is world rank `rank`."""
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % pid) as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            if ppid != parent:
                continue
            with open("/proc/%s/environ" % pid, "rb") as f:
                env = f.read().split(b"\0")
        except (OSError, IndexError, ValueError):
            continue
        if ("OMPI_COMM_WORLD_RANK=%d" % rank).encode() in env:
            return int(pid)
    return None


def signalled(name, sig, to_rank=None, ranks=4, args=(), at_step=2, delay=0.2):
    """Starts run NAME slowed down, sends sig once step at_step is logged (to mpirun, or to one rank), waits."""
    cmd, env = command(ranks, name, args, delay=delay)
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True)
    try:
        wait_for_step(name, at_step, p)
        pid = p.pid if to_rank is None else rank_pid(p.pid, to_rank)
        check(pid is not None, "no rank %s under mpirun" % to_rank)
        os.kill(pid, sig)
        out, err = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
    return subprocess.CompletedProcess(cmd, p.returncode, out, err)


def test_sigusr1_to_mpirun():
    r = signalled("usr1", signal.SIGUSR1)
    step = check_stopped(r, "usr1", PREEMPTED, "stop: SIGUSR1 received")
    comment("SIGUSR1 to mpirun after step 2: stopped after step %d" % step)
    resume("usr1")
    check_same_run("usr1")


def test_sigterm_to_one_rank():
    r = signalled("term", signal.SIGTERM, to_rank=3)
    step = check_stopped(r, "term", PREEMPTED, "stop: SIGTERM received")
    comment("SIGTERM to rank 3 after step 2: stopped after step %d" % step)
    resume("term")
    check_same_run("term")


def test_no_checkpoint_dir():
    r = signalled("", signal.SIGUSR1, ranks=0, args=["--set", "parallel.pp=1", "--set", "checkpoint.every=0"])
    if r.returncode != PREEMPTED:
        show(r)
    check(r.returncode == PREEMPTED, "exit status %d" % r.returncode)
    check("stop: SIGUSR1 received; stopped after step" in r.stdout, "no stop line")
    check("wlbtrain: warning: checkpoint.dir: not set, so no checkpoint was written" in r.stderr,
          "no warning: %r" % r.stderr)


def test_signal_in_last_step():
    # 3 steps, rank 0 sleeping 1 s at the end of each: the signal, sent once step 2 is logged,
    # arrives while step 3, the last, runs. The run finished: exit 0 (nothing for Slurm to requeue),
    # no stop line, the last step's checkpoint.
    for sig, tag in ((signal.SIGTERM, "lastterm"), (signal.SIGUSR1, "lastusr1")):
        r = signalled(tag, sig, ranks=0, at_step=2, delay=1.0,
                      args=["--set", "parallel.pp=1", "--set", "train.steps=3"])
        if r.returncode != 0 or "stop:" in r.stdout:
            show(r)
        check(r.returncode == 0, "%s in the last step: exit status %d, expected 0" % (tag, r.returncode))
        check("stop:" not in r.stdout, "%s in the last step: a stop line" % tag)
        check([x[0] for x in metrics(tag)] == [1, 2, 3], "%s: metrics steps %s" % (tag, [x[0] for x in metrics(tag)]))
        check(latest(tag) == "step-00000003", "%s: latest is %s" % (tag, latest(tag)))


def test_signal_during_save():
    r = train(4, "savesig", fault="savesignal@3:8")
    step = check_stopped(r, "savesig", PREEMPTED, "stop: SIGTERM received")
    check(step == 8, "a SIGTERM during the save after step 8: stopped after step %d" % step)
    check(r.stdout.count("checkpoint: ") == 1, "more than one save: %r" % r.stdout)
    resume("savesig")
    check_same_run("savesig")


def test_bad_values():
    base = [WLBTRAIN, "--config", os.path.join(work, "tiny.yaml"), "--print-config", "--set", "checkpoint.every=0"]
    for bad in ("0", "-5", "1.5h", "abc", "10x", "1m1h", "h", "5 m", "0s", "0h0m", "1h1h", "90S", "m30"):
        r = subprocess.run(base + ["--set", "train.stop_after=" + bad], env=ENV, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, universal_newlines=True, timeout=60)
        want = ("wlbtrain: error: --set train.stop_after=%s: train.stop_after: expected a step count (500) or a "
                "wall time (90s, 45m, 2h, 1h30m), got '%s'\n" % (bad, bad))
        check(r.returncode == 2 and r.stderr == want and not r.stdout,
              "%r: exit status %d, stderr %r" % (bad, r.returncode, r.stderr))
    yaml = os.path.join(work, "bad.yaml")
    with open(os.path.join(work, "tiny.yaml")) as f, open(yaml, "w") as g:
        g.write(f.read().replace("warmup_steps: 2}", "warmup_steps: 2, stop_after: 2d}"))
    r = subprocess.run([WLBTRAIN, "--config", yaml, "--print-config"], env=ENV, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, universal_newlines=True, timeout=60)
    check(r.returncode == 2 and r.stderr.startswith("wlbtrain: error: %s:6:" % yaml) and
          "train.stop_after: expected a step count" in r.stderr and r.stderr.count("\n") == 1,
          "YAML: exit status %d, stderr %r" % (r.returncode, r.stderr))
    for good in ("500", "90s", "45m", "2h", "1h30m", "1h0m30s", "2m5s"):
        r = subprocess.run(base + ["--set", "train.stop_after=" + good], env=ENV, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, universal_newlines=True, timeout=60)
        check(r.returncode == 0 and "stop_after: %s" % good in r.stdout,
              "%r: exit status %d, stderr %r" % (good, r.returncode, r.stderr))


TESTS = [("train.stop_after: 5 steps, three runs on 4 ranks, the same run as the uninterrupted one",
          test_stop_after_steps),
         ("train.stop_after: 1s on 4 ranks stops every rank after the same step, resumes the same run",
          test_stop_after_time),
         ("SIGUSR1 to mpirun: step finished, checkpoint, exit 75, resumes the same run", test_sigusr1_to_mpirun),
         ("SIGTERM to rank 3 only: all ranks stop after the same step, exit 75, resume the same run",
          test_sigterm_to_one_rank),
         ("SIGUSR1 without checkpoint.dir: a warning, exit 75", test_no_checkpoint_dir),
         ("SIGTERM and SIGUSR1 in the last step: the run finished, exit 0, no stop line", test_signal_in_last_step),
         ("bad train.stop_after values: one error line, exit 2", test_bad_values),
         ("SIGTERM during a save: the save finishes, the run stops after that step, exit 75, resumes the same run",
          test_signal_during_save)]


def main():
    global work
    print("1..%d" % len(TESTS))
    if not os.path.exists(WLBTRAIN):
        for i, (name, _) in enumerate(TESTS, 1):
            print("ok %d - %s # SKIP %s is not built" % (i, name, WLBTRAIN))
        return 0
    work = tempfile.mkdtemp(prefix="wlbpreempt-")
    failed = 0
    try:
        rng = random.Random(3)
        with open(os.path.join(work, "docs.jsonl"), "w") as f:
            for _ in range(300):
                n = rng.choice([3, 10, 30, 80])
                f.write(json.dumps({"text": " ".join("w%d" % rng.randint(0, 50) for _ in range(n))}) + "\n")
        prefix = os.path.join(work, "docs")
        r = subprocess.run([WLBTRAIN, "convert", "--quiet", "--out", prefix, os.path.join(work, "docs.jsonl")],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True)
        assert r.returncode == 0, r.stdout
        with open(os.path.join(work, "tiny.yaml"), "w") as f:
            f.write(CONFIG % {"prefix": prefix, "steps": STEPS})
        r = train(4, "whole")
        if r.returncode != 0:
            show(r)
        assert r.returncode == 0, "the uninterrupted run failed"
        for i, (name, fn) in enumerate(TESTS, 1):
            try:
                fn()
                print("ok %d - %s" % (i, name))
            except Exception:  # noqa: BLE001 - a test's failure, reported in TAP
                failed += 1
                print("not ok %d - %s" % (i, name))
                comment(traceback.format_exc())
            sys.stdout.flush()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
