#!/usr/bin/env python3
"""test/test_run_folder.py - one job per run folder, log.metrics kept from other runs, free space.

Two training jobs (mpirun, 2 ranks each, a tiny model) on one checkpoint.dir:
  - started together: exactly one trains, the other exits 2 before any work, naming the holder
    (host, pid, age of the heartbeat), and the folder holds exactly the winner's run: its step
    folders, and its log.metrics identical (loss, lr, grad_norm of every step) to a run alone;
  - staggered (the second once the first has logged a step): the same, the second refused.
WLB_RUN_FOLDER_TRIALS (default 2) sets the trials of each (scripts/run-folder-trials.sh runs 20).
log.metrics: a run given another run's file (marked LOG.owner by a run with another checkpoint.dir:
fresh, and resuming its own folder) exits 2 and leaves the file as it was; a run resumed in its own
folder appends to its own file; an unmarked file (a copy) is taken; a run without checkpoint.dir is
refused the file of a run that is running, and replaces it once that run has ended. Free space: a
checkpoint.dir on a 256 KiB tmpfs, less than one checkpoint of the model (root only: mount).

Environment: WLBTRAIN (default ./wlbtrain). Output: TAP.
"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from taplib import Skip, check, comment, run_tests  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
WLBTRAIN = os.path.abspath(os.environ.get("WLBTRAIN") or os.path.join(REPO, "wlbtrain"))
TRIALS = int(os.environ.get("WLB_RUN_FOLDER_TRIALS", "2"))
STEPS = 8

CONFIG = """model: {n_layers: 2, d_model: 32, n_heads: 4, n_kv_heads: 2, d_ffn: 64, vocab_size: 260,
        rope_theta: 10000, norm_eps: 1.0e-5, tie_embeddings: false, max_seq_len: 256}
parallel: {tp: 1, cp: 1, pp: 1, dp: auto}
data: {path: docs, context_window: 64, global_batch_tokens: 256}
balance: {hardware: cpu}
train: {device: cpu, steps: 8, lr: 0.01, warmup_steps: 1}
checkpoint: {every: 2, keep: 10}
"""
HELD = re.compile(r"wlbtrain: error: checkpoint\.dir: (\S+) is in use by another job: host \S+, pid \d+, started \S+, "
                  r"heartbeat \d+ s ago")


def env():
    return dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
                OMPI_MCA_rmaps_base_oversubscribe="1", OMP_NUM_THREADS="1")


def start(fx, ck, metrics, delay=None, more=()):
    e = env()
    if delay:
        e["WLBTRAIN_STEP_DELAY"] = delay
    return subprocess.Popen(["mpirun", "-np", "2", WLBTRAIN, "--config", "tiny.yaml", "--set", "checkpoint.dir=" + ck,
                             "--set", "log.metrics=" + metrics] + list(more), cwd=fx["work"], env=e,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True)


def finish(p):
    out = p.communicate(timeout=300)[0]
    return p.returncode, out


def losses(path):
    return [(o["step"], o["loss"], o["lr"], o["grad_norm"]) for o in map(json.loads, open(path))]


def setup():
    if not os.path.exists(WLBTRAIN):
        raise Skip("%s is not built" % WLBTRAIN)
    work = tempfile.mkdtemp(prefix="wlbfolder-")
    fx = {"work": work}
    text = os.path.join(work, "doc.txt")
    with open(text, "w") as f:
        f.write("a b c d e f g h i j k l m n o p\n" * 60)
    r = subprocess.run([WLBTRAIN, "convert", "--quiet", "--out", os.path.join(work, "docs"), text],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True)
    check(r.returncode == 0, r.stdout)
    with open(os.path.join(work, "tiny.yaml"), "w") as f:
        f.write(CONFIG)
    rc, out = finish(start(fx, "ck-ref", "ref.jsonl"))
    check(rc == 0, "the reference run failed:\n" + out[-2000:])
    fx["ref"] = losses(os.path.join(work, "ref.jsonl"))
    fx["ref_files"] = sorted(os.listdir(os.path.join(work, "ck-ref")))
    return fx


def teardown(fx):
    shutil.rmtree(fx["work"], ignore_errors=True)


def check_pair(fx, tag, a, b):
    """a and b: (status, output, metrics file) of the two jobs on folder ck-tag. Exactly one trained."""
    ok = [x for x in (a, b) if x[0] == 0]
    refused = [x for x in (a, b) if x[0] == 2]
    if len(ok) != 1 or len(refused) != 1:
        for x in (a, b):
            comment("exit %s:\n%s" % (x[0], x[1][-1500:]))
    check(len(ok) == 1 and len(refused) == 1, "%s: exit statuses %s and %s, expected 0 and 2" % (tag, a[0], b[0]))
    m = HELD.search(refused[0][1])
    check(m and m.group(1) == "ck-" + tag, "%s: no lock refusal naming the holder:\n%s" % (tag, refused[0][1][-1500:]))
    check(not re.search(r"^(train:|step |resume:)", refused[0][1], re.M),
          "%s: the refused job started training:\n%s" % (tag, refused[0][1][-1500:]))
    check(not os.path.exists(os.path.join(fx["work"], refused[0][2])), "%s: the refused job wrote its log.metrics" % tag)
    got = losses(os.path.join(fx["work"], ok[0][2]))
    check(got == fx["ref"], "%s: the winner's metrics differ from a run alone" % tag)
    files = sorted(os.listdir(os.path.join(fx["work"], "ck-" + tag)))
    check(files == fx["ref_files"],
          "%s: the folder holds %s, a run alone %s" % (tag, files, fx["ref_files"]))


def test_together(fx):
    t0 = time.time()
    for i in range(TRIALS):
        tag = "together-%d" % i
        p = start(fx, "ck-" + tag, tag + "-a.jsonl")
        q = start(fx, "ck-" + tag, tag + "-b.jsonl")
        a, b = finish(p), finish(q)
        check_pair(fx, tag, a + (tag + "-a.jsonl",), b + (tag + "-b.jsonl",))
    comment("%d trials started together, %.1f s" % (TRIALS, time.time() - t0))


def test_staggered(fx):
    t0 = time.time()
    for i in range(TRIALS):
        tag = "staggered-%d" % i
        p = start(fx, "ck-" + tag, tag + "-a.jsonl", delay="0.3")
        first = os.path.join(fx["work"], tag + "-a.jsonl")
        t1 = time.time()
        while p.poll() is None and time.time() - t1 < 120 and not (os.path.exists(first) and os.path.getsize(first)):
            time.sleep(0.02)
        q = start(fx, "ck-" + tag, tag + "-b.jsonl")
        b = finish(q)
        a = finish(p)
        check(a[0] == 0, "%s: the first job: exit %s\n%s" % (tag, a[0], a[1][-1500:]))
        check_pair(fx, tag, a + (tag + "-a.jsonl",), b + (tag + "-b.jsonl",))
    comment("%d staggered trials, %.1f s" % (TRIALS, time.time() - t0))


def test_metrics_of_another_run(fx):
    work = fx["work"]
    other = os.path.join(work, "ref.jsonl")
    before = open(other).read()
    ref_dir = os.path.realpath(os.path.join(work, "ck-ref"))
    check(open(other + ".owner").read() == "checkpoint.dir %s\n" % ref_dir, "ref.jsonl.owner does not name ck-ref")
    refusal = ("wlbtrain: error: log.metrics: ref.jsonl holds 8 lines (steps 1 to 8) of another run: ref.jsonl.owner "
               "says it is the log of the run in %s; this run would cut or replace them. Give a new log.metrics, or "
               "remove ref.jsonl to start it afresh (or remove ref.jsonl.owner to make it this run's)")
    # A fresh run given another run's file.
    rc, out = finish(start(fx, "ck-m1", "ref.jsonl", more=["--set", "train.steps=2"]))
    check(rc == 2, "fresh run: exit %s, expected 2\n%s" % (rc, out[-1500:]))
    check(refusal % ref_dir in out, out[-1500:])
    # A run resuming its own folder (stopped after step 4) given another run's file.
    rc, out = finish(start(fx, "ck-m2", "m2.jsonl", more=["--set", "train.stop_after=4"]))
    check(rc == 0, out[-1500:])
    rc, out = finish(start(fx, "ck-m2", "ref.jsonl", more=["--set", "checkpoint.resume=auto"]))
    check(rc == 2, "resumed run: exit %s, expected 2\n%s" % (rc, out[-1500:]))
    check(refusal % ref_dir in out, out[-1500:])
    check(open(other).read() == before, "the other run's log.metrics changed")
    # A run without checkpoint.dir given the file of a run that is running now: refused, the file kept;
    # once that run has ended, replaced (such a run can neither resume nor mark its file).
    p = start(fx, "ck-m4", "m4.jsonl", delay="1.0")  # 8 s: running while the other starts
    t1 = time.time()
    while p.poll() is None and time.time() - t1 < 120 and not os.path.exists(os.path.join(work, "m4.jsonl.owner")):
        time.sleep(0.02)
    plain = ["mpirun", "-np", "2", WLBTRAIN, "--config", "tiny.yaml", "--set", "log.metrics=m4.jsonl", "--set",
             "train.steps=2", "--set", "checkpoint.every=0"]
    r = subprocess.run(plain, cwd=work, env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       universal_newlines=True, timeout=300)
    rc, out = finish(p)
    check(rc == 0, out[-1500:])
    check(r.returncode == 2 and "of another run, running now: m4.jsonl.owner says it is the log of the run in %s;"
          % os.path.realpath(os.path.join(work, "ck-m4")) in r.stdout, r.stdout[-1500:])
    check(losses(os.path.join(work, "m4.jsonl")) == fx["ref"], "the running run's log.metrics was changed")
    r = subprocess.run(plain, cwd=work, env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       universal_newlines=True, timeout=300)
    check(r.returncode == 0 and [x[0] for x in losses(os.path.join(work, "m4.jsonl"))] == [1, 2], r.stdout[-1500:])
    # Its own file: resumed and appended to, the whole run's lines.
    rc, out = finish(start(fx, "ck-m2", "m2.jsonl", more=["--set", "checkpoint.resume=auto"]))
    check(rc == 0, out[-1500:])
    check(losses(os.path.join(work, "m2.jsonl")) == fx["ref"], "the resumed run's own log.metrics differs")
    # An unmarked file (a copy, or a run's without checkpoint.dir): taken as before, and marked.
    shutil.copy(other, os.path.join(work, "copy.jsonl"))
    rc, out = finish(start(fx, "ck-m3", "copy.jsonl", more=["--set", "train.steps=2"]))
    check(rc == 0, out[-1500:])
    check([x[0] for x in losses(os.path.join(work, "copy.jsonl"))] == [1, 2], "the copy was not replaced by the run's "
          "2 lines")
    check(open(os.path.join(work, "copy.jsonl.owner")).read().endswith("/ck-m3\n"), "copy.jsonl.owner not written")


def test_free_space(fx):
    if os.geteuid() != 0:
        raise Skip("not root: a small file system for checkpoint.dir needs mount")
    mnt = os.path.join(fx["work"], "small")
    os.mkdir(mnt)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", mnt], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, universal_newlines=True)
    if r.returncode != 0:
        raise Skip("mount -t tmpfs failed: " + r.stdout.strip())
    try:
        rc, out = finish(start(fx, os.path.join(mnt, "ck"), "small.jsonl"))
        check(rc == 2, "exit %s, expected 2\n%s" % (rc, out[-1500:]))
        m = re.search(r"wlbtrain: error: checkpoint\.dir: \S+ has (\d+\.\d) KiB free \((\d+) bytes\), less than one "
                      r"checkpoint of this model needs: (\d+\.\d) KiB \((\d+) parameters x 12 bytes: float32 weights "
                      r"and AdamW's two moments\)", out)
        check(m, "no free-space error:\n" + out[-1500:])
        check(int(m.group(2)) <= 256 * 1024 and int(m.group(4)) * 12 > int(m.group(2)), m.group(0))
        check(not os.path.exists(os.path.join(fx["work"], "small.jsonl")), "log.metrics written")
        # The estimate against a real checkpoint of the model: within 10%.
        real = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(os.path.join(fx["work"], "ck-ref",
                                                                                            "step-00000008"))
                   for f in fs)
        need = int(m.group(4)) * 12
        comment("estimate %d bytes, a real checkpoint %d bytes" % (need, real))
        check(0.9 * real <= need <= 1.1 * real, "estimate %d bytes, a real checkpoint %d" % (need, real))
    finally:
        subprocess.run(["umount", mnt])


def main():
    return run_tests([("two jobs started together on one checkpoint.dir: one trains, one refused (exit 2)",
                       test_together),
                      ("a second job on a running job's checkpoint.dir: refused before any work (exit 2)",
                       test_staggered),
                      ("log.metrics of another run refused (fresh and resumed), its own appended to",
                       test_metrics_of_another_run),
                      ("checkpoint.dir without room for one checkpoint: refused naming both sizes", test_free_space)],
                     setup, teardown)


if __name__ == "__main__":
    sys.exit(main())
