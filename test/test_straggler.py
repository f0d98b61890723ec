#!/usr/bin/env python3
"""test/test_straggler.py - a rank slow anywhere in the step is named the straggler
(engine/train/train_straggler.c; docs/slurm.md, "Stragglers named").

tp 2 x dp 2 (4 ranks under mpirun), the tiny model:
1   rank 1 stopped for 0.3 s at the start of every step from step 2 (WLBTRAIN_FAULT=stall@1:2: SIGSTOP,
    continued by a timer), outside its forward and backward, which compute as fast as the others':
    log.metrics names it the slowest rank of every step from 2, its busy time at least 0.2 s over the
    median (and the stop counted once, not twice: under 0.5 s), and a warning names it by step 4,
    not predicted by the plan.
2   the test stops and continues rank 1 itself (SIGSTOP / SIGCONT, 80 ms of every 120 ms), wherever
    it is - in its passes, in a collective, in the optimizer - for 8 steps of the tiny preset: a
    warning names rank 1, and it is the slowest rank of at least 5 of steps 2-8.

Environment: WLBTRAIN (default ./wlbtrain). Output: TAP.
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
WLBTRAIN = os.path.abspath(os.environ.get("WLBTRAIN") or os.path.join(REPO, "wlbtrain"))

from taplib import Skip, check, comment, run_tests, tiny_corpus  # noqa: E402

CONFIG = """model: {n_layers: 2, d_model: 32, n_heads: 4, n_kv_heads: 2, d_ffn: 64, vocab_size: 260,
        rope_theta: 10000, norm_eps: 1.0e-5, tie_embeddings: false, max_seq_len: 256}
parallel: {tp: 2, cp: 1, pp: 1, dp: 2, timeout_s: 60}
data: {path: %(prefix)s, context_window: 64, global_batch_tokens: 512}
balance: {hardware: cpu, packer: wlb}
train: {device: cpu, steps: %(steps)d, lr: 0.01, warmup_steps: 2}
checkpoint: {dir: none}
log: {every: 1}
"""

ENV = dict(os.environ, OMP_NUM_THREADS="1", OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           OMPI_MCA_rmaps_base_oversubscribe="1")
for k in ("WLBTRAIN_FAULT", "WLBTRAIN_FAULT_SLOW_S", "WLBTRAIN_STEP_DELAY"):
    ENV.pop(k, None)


class Fx:
    pass


def start(fx, name, steps, fault=None, slow_s=None, args=()):
    cmd = ["mpirun", "--oversubscribe", "--bind-to", "none", "-np", "4"]
    env = dict(ENV)
    for var, value in (("WLBTRAIN_FAULT", fault), ("WLBTRAIN_FAULT_SLOW_S", slow_s)):
        if value:
            cmd += ["-x", var]
            env[var] = value
    cmd += [WLBTRAIN, "--config", fx.cfg, "--steps", str(steps), "--set", "log.metrics=%s/%s.jsonl" % (fx.dir, name)] + list(args)
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True)


def finish(p, fx, name):
    try:
        out, err = p.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        p.kill()
        out, err = p.communicate()
    if p.returncode != 0:
        for line in (out + err).splitlines()[-20:]:
            comment("| " + line)
    check(p.returncode == 0, "exit status %d" % p.returncode)
    with open(os.path.join(fx.dir, name + ".jsonl")) as f:
        rows = [json.loads(line) for line in f]
    warn = [l for l in err.splitlines() if "straggler: rank" in l]
    comment(warn[0] if warn else "no straggler warning")
    return rows, warn


def step_of(line):
    return int(line.split(" in step ")[1].split(",")[0])


def test_stall_outside_the_passes(fx):
    rows, warn = finish(start(fx, "stall", 6, "stall@1:2", "0.3"), fx, "stall")
    excess = []
    for o in rows[1:]:
        comment("step %d: slowest rank %d, busy %.3f s, median %.3f s; computed %.3f s, median %.3f s"
                % (o["step"], o["slowest_rank"], o["slowest_busy_s"], o["median_busy_s"], o["slowest_compute_s"],
                   o["median_compute_s"]))
        check(o["slowest_rank"] == 1, "step %d: slowest rank %d" % (o["step"], o["slowest_rank"]))
        excess.append(o["slowest_busy_s"] - o["median_busy_s"])
        check(excess[-1] >= 0.2, "step %d: rank 1 busy %.3f s over the median" % (o["step"], excess[-1]))
    excess.sort()
    check(excess[len(excess) // 2] < 0.5, "a median excess of %.3f s: the stop counted twice?" % excess[len(excess) // 2])
    check(warn and warn[0].startswith("wlbtrain: warning: straggler: rank 1 was busy") and step_of(warn[0]) <= 4 and
          "not predicted: the machine is slow" in warn[0], "the warning: %r" % warn)


def rank_pid(parent, rank):
    """The pid of world rank `rank` among the processes mpirun `parent` started (and only those)."""
    def ppid(pid):
        try:
            with open("/proc/%d/stat" % pid) as f:
                return int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            return 0
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        pid, up = int(d), int(d)
        while up > 1 and up != parent:
            up = ppid(up)
        if up != parent:
            continue
        try:
            with open("/proc/%d/environ" % pid, "rb") as f:
                env = f.read().split(b"\0")
            exe = os.readlink("/proc/%d/exe" % pid)
        except OSError:
            continue
        if b"OMPI_COMM_WORLD_RANK=%d" % rank in env and os.path.basename(exe) == "wlbtrain":
            return pid
    return None


def test_stop_continue_duty_cycle(fx):
    # the tiny preset: steps long enough that every one holds stops
    steps = 8
    p = start(fx, "duty", steps, args=["--set", "model.preset=tiny", "--set", "data.context_window=256",
                                       "--set", "data.global_batch_tokens=2048"])
    lines = []

    def read():  # stdout as it comes (a full pipe would stall rank 0)
        for line in p.stdout:
            lines.append(line)
    reader = threading.Thread(target=read)
    reader.start()
    pid = None
    while pid is None and p.poll() is None:
        pid = rank_pid(p.pid, 1)
        time.sleep(0.02)
    stops = 0
    while pid and p.poll() is None:
        try:
            os.kill(pid, signal.SIGSTOP)
            stops += 1
            time.sleep(0.08)
            os.kill(pid, signal.SIGCONT)
            time.sleep(0.04)
        except ProcessLookupError:
            break
    reader.join()
    err = p.stderr.read()
    p.wait()
    if p.returncode != 0:
        for line in (lines + err.splitlines())[-20:]:
            comment("| " + line.rstrip())
    check(p.returncode == 0, "exit status %d" % p.returncode)
    check(pid is not None, "rank 1's process not found")
    with open(os.path.join(fx.dir, "duty.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    warn = [l for l in err.splitlines() if "straggler: rank" in l]
    comment(warn[0] if warn else "no straggler warning")
    for o in rows:
        comment("step %d: slowest rank %d, busy %.3f s, median %.3f s; computed %.3f s, median %.3f s"
                % (o["step"], o["slowest_rank"], o["slowest_busy_s"], o["median_busy_s"], o["slowest_compute_s"],
                   o["median_compute_s"]))
    slowest = [o["slowest_rank"] for o in rows]
    comment("%d stops (80 ms of every 120 ms); the slowest rank of steps 1-%d: %s" % (stops, steps, slowest))
    check(warn and warn[0].startswith("wlbtrain: warning: straggler: rank 1 was busy"), "the warning: %r" % warn)
    check(slowest[1:].count(1) >= 5, "rank 1 the slowest in %d of steps 2-%d" % (slowest[1:].count(1), steps))


def setup():
    if not os.path.exists(WLBTRAIN):
        raise Skip("%s is not built" % WLBTRAIN)
    if not shutil.which("mpirun"):
        raise Skip("no mpirun")
    fx = Fx()
    fx.dir = tempfile.mkdtemp(prefix="wlbstraggler-")
    prefix = tiny_corpus(WLBTRAIN, fx.dir, 5)
    fx.cfg = os.path.join(fx.dir, "tiny.yaml")
    with open(fx.cfg, "w") as f:
        f.write(CONFIG % {"prefix": prefix, "steps": 10})
    return fx


TESTS = [("tp 2 x dp 2, rank 1 stopped 0.3 s outside its passes each step: the slowest of every step, a warning "
          "by step 4", test_stall_outside_the_passes),
         ("tp 2 x dp 2, rank 1 stopped and continued by the test (80 ms of 120 ms): named", test_stop_continue_duty_cycle)]

if __name__ == "__main__":
    sys.exit(run_tests(TESTS, setup, lambda fx: shutil.rmtree(fx.dir, ignore_errors=True)))
