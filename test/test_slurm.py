#!/usr/bin/env python3
"""test/test_slurm.py - the Slurm job scripts of scripts/slurm/ run a 2-rank training job.

There is no Slurm here, so each script runs as a batch step would: under bash, with the
environment Slurm sets (SLURM_NTASKS, SLURM_NTASKS_PER_NODE, SLURM_CPUS_PER_TASK, SLURM_SUBMIT_DIR)
and, for the srun scripts, an `srun` on PATH that records its flags and starts the ranks with
mpirun. Each must train the tiny model on 2 ranks (dp: auto = 2) and pass the flags through.

Time limits and preemption (docs/slurm.md, "Time limits and preemption"): each script asks Slurm for
SIGUSR1 before the time limit (#SBATCH --signal=B:USR1@...) and allows requeueing (--requeue).
Sent SIGUSR1 as Slurm would (to the batch shell) once training is under way, the script passes it
to the ranks, which write a checkpoint and exit 75; the script then calls `scontrol requeue
$SLURM_JOB_ID` (an `scontrol` on PATH records it) and exits 75. Run again as the requeued job
(SLURM_RESTART_COUNT=1), it resumes from that checkpoint and finishes. A hang (one-node.sbatch, rank
1 stopping at step 3, parallel.timeout_s 3): the watchdog ends the job with 76 naming rank 1, the
script requeues it the same way, and the requeued job resumes and finishes.

Environment: WLBTRAIN (default ./wlbtrain). Output: TAP.
"""
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
WLBTRAIN = os.path.abspath(os.environ.get("WLBTRAIN") or os.path.join(REPO, "wlbtrain"))

SRUN = """#!/bin/bash
# test stand-in for srun: records the flags, then starts the program on SLURM_NTASKS ranks
echo "$@" > "$SRUN_LOG"
while [ $# -gt 0 ] && [ "${1#--}" != "$1" ]; do shift; done
exec mpirun --oversubscribe -np "$SLURM_NTASKS" "$@"
"""

SCONTROL = """#!/bin/bash
# test stand-in for scontrol: records its arguments
echo "$@" >> "$SCONTROL_LOG"
"""

CONFIG = """model: {n_layers: 2, d_model: 32, n_heads: 4, n_kv_heads: 2, d_ffn: 64, vocab_size: 260,
        rope_theta: 10000, norm_eps: 1.0e-5, tie_embeddings: false, max_seq_len: 256}
parallel: {tp: 1, cp: 1, pp: 1, dp: auto}
data: {path: docs, context_window: 64, global_batch_tokens: 256}
balance: {hardware: cpu}
train: {device: cpu, steps: 3, lr: 0.01, warmup_steps: 1}
"""

CASES = [("one-node.sbatch", "--mpi=pmix --cpu-bind=cores"),
         ("multi-node.sbatch", "--mpi=pmix --cpu-bind=cores --distribution=block:block"),
         ("multi-node-mpirun.sbatch", None)]


def slurm_env(work, bin_dir, **more):
    env = dict(os.environ, PATH=bin_dir + os.pathsep + os.environ["PATH"], SLURM_NTASKS="2",
               SLURM_NTASKS_PER_NODE="2", SLURM_CPUS_PER_TASK="1", SLURM_SUBMIT_DIR=work, SLURM_JOB_ID="4242",
               SRUN_LOG=os.path.join(work, "srun.log"), SCONTROL_LOG=os.path.join(work, "scontrol.log"),
               OMPI_MCA_rmaps_base_oversubscribe="1")
    env.pop("SLURM_RESTART_COUNT", None)
    env.update(more)
    return env


def preempt(work, bin_dir, name):
    """Runs script `name` slowed down (WLBTRAIN_STEP_DELAY, which mpirun's ranks inherit), sends the
    batch shell SIGUSR1 once step 2 is logged, then runs it again as the requeued job. Returns the
    problems."""
    tag = name.split(".")[0]
    script = os.path.join(REPO, "scripts", "slurm", name)
    metrics = os.path.join(work, tag + ".jsonl")
    scontrol = os.path.join(work, "scontrol.log")
    for f in (metrics, scontrol):
        if os.path.exists(f):
            os.remove(f)
    args = ["bash", script, "tiny.yaml", "--set", "train.steps=12", "--set", "checkpoint.dir=ck-" + tag,
            "--set", "log.metrics=" + tag + ".jsonl"]
    p = subprocess.Popen(args, cwd="/", env=slurm_env(work, bin_dir, WLBTRAIN_STEP_DELAY="0.2"),
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True)
    problems = []
    try:
        t0 = time.time()
        while p.poll() is None and time.time() - t0 < 120:
            if os.path.exists(metrics) and len(open(metrics).readlines()) >= 2:
                break
            time.sleep(0.02)
        if p.poll() is not None:
            problems.append("the job ended before step 2")
        else:
            os.kill(p.pid, signal.SIGUSR1)
        out = p.communicate(timeout=120)[0]
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
    got = open(scontrol).read() if os.path.exists(scontrol) else "(not called)"
    latest = os.path.join(work, "ck-" + tag, "latest")
    if p.returncode != 75:
        problems.append("exit status %s, expected 75" % p.returncode)
    if "stop: SIGUSR1 received; stopped after step" not in out:
        problems.append("no 'stop: SIGUSR1 received' in the output")
    if got != "requeue 4242\n":
        problems.append("scontrol: %r, expected 'requeue 4242'" % got)
    if not os.path.exists(latest):
        problems.append("no checkpoint")
    if problems:
        for line in out.splitlines()[-20:]:
            problems.append("| " + line)
        return problems
    os.remove(scontrol)
    stopped = open(latest).read().strip()
    r = subprocess.run(args, cwd="/", env=slurm_env(work, bin_dir, SLURM_RESTART_COUNT="1"), stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, universal_newlines=True, timeout=300)
    if r.returncode != 0:
        problems.append("requeued: exit status %d" % r.returncode)
    for want in ("resume: ck-%s/%s, after step" % (tag, stopped), "step    12/12  loss "):
        if want not in r.stdout:
            problems.append("requeued: no %r in the output" % want)
    if os.path.exists(scontrol):
        problems.append("requeued: scontrol called again")
    steps = [int(re.search(r'"step":(\d+)', line).group(1)) for line in open(metrics)]
    if steps != list(range(1, 13)):
        problems.append("requeued: metrics of steps %s" % steps)
    if problems:
        problems += ["| " + line for line in r.stdout.splitlines()[-20:]]
    return problems


def hang(work, bin_dir, name):
    """Runs script `name` with one rank stopping at step 3 (WLBTRAIN_FAULT=hang@1:3) and parallel.timeout_s 3:
    the watchdog ends the job with 76, the script requeues it; run again as the requeued job it resumes and
    finishes. Returns the problems."""
    tag = "hang-" + name.split(".")[0]
    script = os.path.join(REPO, "scripts", "slurm", name)
    scontrol = os.path.join(work, "scontrol.log")
    if os.path.exists(scontrol):
        os.remove(scontrol)
    args = ["bash", script, "tiny.yaml", "--set", "train.steps=12", "--set", "checkpoint.dir=ck-" + tag,
            "--set", "log.metrics=" + tag + ".jsonl", "--set", "parallel.timeout_s=3", "--set", "checkpoint.every=2"]
    r = subprocess.run(args, cwd="/", env=slurm_env(work, bin_dir, WLBTRAIN_FAULT="hang@1:3"), stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, universal_newlines=True, timeout=120)
    problems = []
    got = open(scontrol).read() if os.path.exists(scontrol) else "(not called)"
    if r.returncode != 76:
        problems.append("exit status %s, expected 76" % r.returncode)
    if "never reached it: rank 1 " not in r.stdout:
        problems.append("rank 1 not named")
    if got != "requeue 4242\n":
        problems.append("scontrol: %r, expected 'requeue 4242'" % got)
    if problems:
        return problems + ["| " + line for line in r.stdout.splitlines()[-20:]]
    os.remove(scontrol)
    r = subprocess.run(args, cwd="/", env=slurm_env(work, bin_dir, SLURM_RESTART_COUNT="1"), stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, universal_newlines=True, timeout=300)
    if r.returncode != 0 or "resume: ck-%s/step-" % tag not in r.stdout:
        problems.append("requeued: exit status %d, no resume line" % r.returncode)
    steps = [int(re.search(r'"step":(\d+)', line).group(1)) for line in open(os.path.join(work, tag + ".jsonl"))]
    if steps != list(range(1, 13)):
        problems.append("requeued: metrics of steps %s" % steps)
    if problems:
        problems += ["| " + line for line in r.stdout.splitlines()[-20:]]
    return problems


def main():
    print("1..%d" % (2 * len(CASES) + 2))
    if not os.path.exists(WLBTRAIN):
        for i in range(1, 2 * len(CASES) + 3):
            print("ok %d - # SKIP %s is not built" % (i, WLBTRAIN))
        return 0
    work = tempfile.mkdtemp(prefix="wlbslurm-")
    failed = 0
    try:
        text = os.path.join(work, "doc.txt")
        with open(text, "w") as f:
            f.write("a b c d e f g h i j k l m n o p\n" * 60)
        r = subprocess.run([WLBTRAIN, "convert", "--quiet", "--out", os.path.join(work, "docs"), text],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True)
        assert r.returncode == 0, r.stdout
        with open(os.path.join(work, "tiny.yaml"), "w") as f:
            f.write(CONFIG)
        os.symlink(WLBTRAIN, os.path.join(work, "wlbtrain"))
        bin_dir = os.path.join(work, "bin")
        os.mkdir(bin_dir)
        with open(os.path.join(bin_dir, "srun"), "w") as f:
            f.write(SRUN)
        os.chmod(os.path.join(bin_dir, "srun"), 0o755)
        with open(os.path.join(bin_dir, "scontrol"), "w") as f:
            f.write(SCONTROL)
        os.chmod(os.path.join(bin_dir, "scontrol"), 0o755)
        for i, (name, srun_flags) in enumerate(CASES, 1):
            log = os.path.join(work, "srun.log")
            if os.path.exists(log):
                os.remove(log)
            env = slurm_env(work, bin_dir)
            script = os.path.join(REPO, "scripts", "slurm", name)
            r = subprocess.run(["bash", script, "tiny.yaml", "--set", "log.every=1"], cwd="/", env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True, timeout=300)
            problems = []
            if r.returncode != 0:
                problems.append("exit status %d" % r.returncode)
            for want in ("train: 2 ranks: tp 1, cp 1, pp 1, dp 2;", "step     3/3  loss "):
                if want not in r.stdout:
                    problems.append("no %r in the output" % want)
            if srun_flags is not None:
                got = open(log).read().strip() if os.path.exists(log) else "(srun not called)"
                if not got.startswith(srun_flags + " ./wlbtrain --config tiny.yaml --set log.every=1"):
                    problems.append("srun got: " + got)
            if problems:
                failed += 1
                print("not ok %d - %s trains on 2 ranks" % (i, name))
                for p in problems:
                    print("# " + p)
                for line in r.stdout.splitlines()[-20:]:
                    print("# | " + line)
            else:
                print("ok %d - %s trains on 2 ranks" % (i, name))
        for i, (name, _) in enumerate(CASES, len(CASES) + 1):
            problems = preempt(work, bin_dir, name)
            print("%sok %d - %s: SIGUSR1 before the time limit: checkpoint, exit 75, requeue, resumed"
                  % ("not " if problems else "", i, name))
            failed += bool(problems)
            for p in problems:
                print("# " + p)
        problems = hang(work, bin_dir, CASES[0][0])
        print("%sok %d - %s: a rank hangs: the watchdog ends the job (exit 76), requeue, resumed"
              % ("not " if problems else "", 2 * len(CASES) + 1, CASES[0][0]))
        failed += bool(problems)
        for p in problems:
            print("# " + p)
        problems = []
        for name, _ in CASES:
            text = open(os.path.join(REPO, "scripts", "slurm", name)).read()
            for want in (r"^#SBATCH --signal=B:USR1@\d+$", r"^#SBATCH --requeue$", r'scontrol requeue "\$SLURM_JOB_ID"',
                         r"^trap .*USR1", r'^elif \[ "\$status" -eq 76 \]; then$'):
                if not re.search(want, text, re.M):
                    problems.append("%s: no line matching %s" % (name, want))
        print("%sok %d - every script asks for SIGUSR1 before the time limit and requeues (75 and 76)"
              % ("not " if problems else "", 2 * len(CASES) + 2))
        failed += bool(problems)
        for p in problems:
            print("# " + p)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
