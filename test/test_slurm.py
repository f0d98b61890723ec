#!/usr/bin/env python3
"""test/test_slurm.py - the Slurm job scripts of scripts/slurm/ run a 2-rank training job.

There is no Slurm here, so each script runs as a batch step would: under bash, with the
environment Slurm sets (SLURM_NTASKS, SLURM_NTASKS_PER_NODE, SLURM_CPUS_PER_TASK, SLURM_SUBMIT_DIR)
and, for the srun scripts, an `srun` on PATH that records its flags and starts the ranks with
mpirun. Each must train the tiny model on 2 ranks (dp: auto = 2) and pass the flags through.

Environment: WLBTRAIN (default ./wlbtrain). Output: TAP.
"""
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
WLBTRAIN = os.path.abspath(os.environ.get("WLBTRAIN") or os.path.join(REPO, "wlbtrain"))

SRUN = """#!/bin/bash
# test stand-in for srun: records the flags, then starts the program on SLURM_NTASKS ranks
echo "$@" > "$SRUN_LOG"
while [ $# -gt 0 ] && [ "${1#--}" != "$1" ]; do shift; done
exec mpirun --oversubscribe -np "$SLURM_NTASKS" "$@"
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


def main():
    print("1..%d" % len(CASES))
    if not os.path.exists(WLBTRAIN):
        for i, (name, _) in enumerate(CASES, 1):
            print("ok %d - %s # SKIP %s is not built" % (i, name, WLBTRAIN))
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
        for i, (name, srun_flags) in enumerate(CASES, 1):
            log = os.path.join(work, "srun.log")
            if os.path.exists(log):
                os.remove(log)
            env = dict(os.environ, PATH=bin_dir + os.pathsep + os.environ["PATH"], SLURM_NTASKS="2",
                       SLURM_NTASKS_PER_NODE="2", SLURM_CPUS_PER_TASK="1", SLURM_SUBMIT_DIR=work, SRUN_LOG=log,
                       OMPI_MCA_rmaps_base_oversubscribe="1")
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
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
