#!/usr/bin/env python3
"""test/test_slurm.py - the batch scripts of scripts/slurm/ under a real one-node Slurm.

scripts/slurm/local-cluster.sh starts Debian's munged, slurmctld and slurmd on this machine (as root,
no systemd; the node offers 8 CPUs so that the jobs below run side by side), and the project's own
sbatch scripts are submitted to it with sbatch, each training a tiny model on 2 ranks with
checkpoint.dir set (the scripts' #SBATCH lines for 8 GPUs are overridden on the command line:
--nodes=1 --ntasks-per-node=2 --cpus-per-task=1 --gpus-per-node=0). Each job's log.metrics is compared with an
uninterrupted run's (mpirun, the same steps): loss, lr and grad_norm of every step, bit for bit.

  - the time limit: one-node.sbatch (srun) with --time=1 --signal=B:USR1@59: Slurm's early SIGUSR1
    reaches the batch shell, the ranks stop with a checkpoint (exit 75), the script requeues the job,
    and the requeued job (its time limit raised by the test) resumes and finishes;
  - a hang under srun (one-node.sbatch) and under mpirun (multi-node-mpirun.sbatch): the test
    SIGSTOPs rank 1 once step 3 is logged (parallel.timeout_s 3, a checkpoint every 2 steps); the
    watchdog ends the job with 76, the script requeues it, and it resumes and finishes;
  - a plain `scancel` of a running job (multi-node.sbatch): the ranks stop with a checkpoint, and the
    job ends CANCELLED and is still cancelled (not pending, no restart) after longer than a
    requeue's wait;
  - a job that hangs on every start (WLBTRAIN_FAULT=hang@1:1, WLB_MAX_REQUEUES=1,
    multi-node-mpirun.sbatch): requeued once, then not again: FAILED, with the script's message.
And without Slurm: every script asks for SIGUSR1 before the time limit, allows requeueing and runs
wlbtrain through scripts/slurm/job.sh.

Needs root and Slurm (scripts/install-deps.sh test installs slurmctld, slurmd, slurm-client and munge
where it runs as root): otherwise the Slurm tests skip, saying why (under CI a missing Slurm fails).
Environment: WLBTRAIN (default ./wlbtrain). Output: TAP.
"""
import atexit
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from taplib import Skip, check, comment, missing, run_tests  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
WLBTRAIN = os.path.abspath(os.environ.get("WLBTRAIN") or os.path.join(REPO, "wlbtrain"))
SCRIPTS = ["one-node.sbatch", "multi-node.sbatch", "multi-node-mpirun.sbatch"]
REQUEUE_WAIT_S = 11  # local-cluster.sh's cred_expire (10) + 1

CONFIG = """model: {n_layers: 2, d_model: 32, n_heads: 4, n_kv_heads: 2, d_ffn: 64, vocab_size: 260,
        rope_theta: 10000, norm_eps: 1.0e-5, tie_embeddings: false, max_seq_len: 256}
parallel: {tp: 1, cp: 1, pp: 1, dp: auto}
data: {path: docs, context_window: 64, global_batch_tokens: 256}
balance: {hardware: cpu}
train: {device: cpu, steps: 3, lr: 0.01, warmup_steps: 1}
"""

# name: (script, steps, extra flags, extra environment)
JOBS = {
    # The first: slurmctld checks time limits (and sends --signal's warning) every 30 s from its start.
    "timelimit": ("one-node.sbatch", 90, [], {"WLBTRAIN_STEP_DELAY": "0.4"},
                  ["--time=1", "--signal=B:USR1@59"]),
    "hang-srun": ("one-node.sbatch", 12, ["--set", "parallel.timeout_s=3", "--set", "checkpoint.every=2"],
                  {"WLBTRAIN_STEP_DELAY": "0.3"}, []),
    "hang-mpirun": ("multi-node-mpirun.sbatch", 12, ["--set", "parallel.timeout_s=3", "--set", "checkpoint.every=2"],
                    {"WLBTRAIN_STEP_DELAY": "0.3"}, []),
    "scancel": ("multi-node.sbatch", 60, [], {"WLBTRAIN_STEP_DELAY": "0.3"}, []),
    "loop": ("multi-node-mpirun.sbatch", 12, ["--set", "parallel.timeout_s=3"],
             {"WLBTRAIN_FAULT": "hang@1:1", "WLB_MAX_REQUEUES": "1"}, []),
}


def free_port_pair():
    """A port p with p and p + 1 free (slurmctld's and slurmd's)."""
    for _ in range(50):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        p = s.getsockname()[1]
        s.close()
        if p < 65000:
            t = socket.socket()
            try:
                t.bind(("127.0.0.1", p + 1))
                return p
            except OSError:
                pass
            finally:
                t.close()
    return 6917


def run(cmd, env, **kw):
    return subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True,
                          **kw)


def job_info(fx, job):
    r = run(["scontrol", "-o", "show", "job", str(job)], fx["env"])
    info = {}
    for word in r.stdout.split():
        k, _, v = word.partition("=")
        info[k] = v
    return info


def job_output(fx, name):
    path = os.path.join(fx["work"], "job-%s.out" % name)
    return open(path).read() if os.path.exists(path) else "(no output file)"


def metrics_steps(path):
    """{step: (loss, lr, grad_norm)} of a log.metrics file, and its steps in order."""
    rows, order = {}, []
    if os.path.exists(path):
        for line in open(path):
            o = json.loads(line)
            rows[o["step"]] = (o["loss"], o["lr"], o["grad_norm"])
            order.append(o["step"])
    return rows, order


def reference(fx, steps):
    """The uninterrupted run of `steps` steps (mpirun, 2 ranks), once per length."""
    if steps in fx["refs"]:
        return fx["refs"][steps]
    tag = "ref-%d" % steps
    r = run(["mpirun", "-np", "2", WLBTRAIN, "--config", "tiny.yaml", "--set", "train.steps=%d" % steps,
             "--set", "log.metrics=%s.jsonl" % tag], fx["env"], cwd=fx["work"], timeout=300)
    check(r.returncode == 0, "the reference run failed:\n" + r.stdout[-3000:])
    fx["refs"][steps] = metrics_steps(os.path.join(fx["work"], tag + ".jsonl"))[0]
    return fx["refs"][steps]


def submit(fx, name):
    script, steps, flags, extra_env, sbatch_flags = JOBS[name]
    env = dict(fx["env"], **extra_env)
    cmd = ["sbatch", "--parsable", "--job-name=" + name, "--nodes=1", "--ntasks-per-node=2", "--cpus-per-task=1",
           "--gpus-per-node=0", "--output=job-%s.out" % name] + sbatch_flags + \
          [os.path.join("scripts", "slurm", script), "tiny.yaml", "--set", "train.steps=%d" % steps,
           "--set", "checkpoint.dir=ck-" + name, "--set", "log.metrics=%s.jsonl" % name] + flags
    r = run(cmd, env, cwd=fx["work"])
    if r.returncode != 0:
        raise AssertionError("sbatch %s: %s" % (name, r.stdout))
    return int(r.stdout.strip().split(";")[0])


FINAL = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED", "BOOT_FAIL",
         "DEADLINE")


def metrics_lines(fx, name):
    path = os.path.join(fx["work"], name + ".jsonl")
    return len(open(path).readlines()) if os.path.exists(path) else 0


def rank_pid(fx, name, rank):
    """The pid of world rank `rank` of job `name`: the wlbtrain process whose environment has the job's
    SLURM_JOB_ID and PMIX_RANK=rank (srun and mpirun both set PMIX_RANK)."""
    want = [("SLURM_JOB_ID=%d" % fx["jobs"][name]).encode(), ("PMIX_RANK=%d" % rank).encode()]
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            if open("/proc/%s/comm" % pid).read().strip() != "wlbtrain":
                continue
            env = open("/proc/%s/environ" % pid, "rb").read().split(b"\0")
        except OSError:
            continue
        if all(w in env for w in want):
            return int(pid)
    return None


def drive(fx, timeout=300):
    """Watches every job at once and acts on it as its test says, until all have ended: the time
    limit's job, once requeued, gets a longer limit; rank 1 of the hang jobs is SIGSTOPped once step 3
    is logged; the scancel job is cancelled once step 2 is, and watched for longer than a requeue's
    wait after it ended. Fills fx["info"] (each job's last scontrol record) and fx["acts"]."""
    acts, ended, t0 = fx["acts"], {}, time.time()
    while time.time() - t0 < timeout:
        for name, job in fx["jobs"].items():
            info = fx["info"][name] = job_info(fx, job)
            state = info.get("JobState")
            if name == "timelimit" and info.get("Restarts") == "1" and name not in acts:
                r = run(["scontrol", "update", "JobId=%d" % job, "TimeLimit=10"], fx["env"])
                acts[name] = "TimeLimit=10: rc %d %s" % (r.returncode, r.stdout.strip())
            elif name.startswith("hang-") and name not in acts and state == "RUNNING" and metrics_lines(fx, name) >= 3:
                pid = rank_pid(fx, name, 1)
                if pid:
                    os.kill(pid, signal.SIGSTOP)
                    acts[name] = "SIGSTOP to rank 1 (pid %d) after step %d" % (pid, metrics_lines(fx, name))
            elif name == "scancel" and name not in acts and state == "RUNNING" and metrics_lines(fx, name) >= 2:
                r = run(["scancel", str(job)], fx["env"])
                acts[name] = "scancel: rc %d %s" % (r.returncode, r.stdout.strip())
            if state in FINAL:
                ended.setdefault(name, time.time())
            else:
                ended.pop(name, None)
        settle = REQUEUE_WAIT_S + 4
        if len(ended) == len(fx["jobs"]) and time.time() - ended["scancel"] > settle:
            return
        time.sleep(0.25)
    comment("timed out after %d s: %s" % (timeout, {n: fx["info"][n].get("JobState") for n in fx["jobs"]}))


def show(fx, name):
    """The job's action and its output's lines of Slurm, the script and wlbtrain's stop and resume, as comments."""
    out = job_output(fx, name)
    comment("%s: %s" % (name, fx["acts"].get(name, "no action")))
    comment("\n".join("  | " + line for line in out.splitlines()
                      if re.match(r"(srun|wlbtrain job|stop:|resume:|run lock:|slurmstepd|checkpoint:)", line)))
    return out


def check_resumed(fx, name, want_restarts):
    """The job ended COMPLETED after want_restarts requeues, and its metrics are the reference's."""
    info = fx["info"][name]
    out = show(fx, name)
    steps = JOBS[name][1]
    if info.get("JobState") != "COMPLETED" or info.get("Restarts") != str(want_restarts):
        comment(out[-4000:])
    check(info.get("JobState") == "COMPLETED", "job state %s (exit %s), expected COMPLETED"
          % (info.get("JobState"), info.get("ExitCode")))
    check(info.get("Restarts") == str(want_restarts), "%s restarts, expected %d" % (info.get("Restarts"), want_restarts))
    check("requeueing" in out and "resume: ck-%s/step-" % name in out, "no requeue and resume lines in the output")
    got, order = metrics_steps(os.path.join(fx["work"], name + ".jsonl"))
    check(order == list(range(1, steps + 1)), "metrics of steps %s, expected 1..%d" % (order, steps))
    ref = reference(fx, steps)
    diff = [s for s in ref if got.get(s) != ref[s]]
    check(not diff, "steps %s differ from the uninterrupted run (first: %s vs %s)"
          % (diff, got.get(diff[0]) if diff else None, ref[diff[0]] if diff else None))
    return out


def setup():
    if not os.path.exists(WLBTRAIN):
        raise Skip("%s is not built" % WLBTRAIN)
    if os.geteuid() != 0:
        raise Skip("not root: a local Slurm (slurmd) must run as root (make test runs this test where it is root, "
                   "as in CI)")
    for prog in ("munged", "slurmctld", "slurmd", "sbatch", "scontrol"):
        if not shutil.which(prog) and not os.path.exists("/usr/sbin/" + prog):
            raise missing("no %s: apt-get install slurmctld slurmd slurm-client munge (scripts/install-deps.sh test "
                          "does, as root)" % prog)
    work = tempfile.mkdtemp(prefix="wlbslurm-")
    os.chmod(work, 0o755)
    cluster = os.path.join(work, "cluster")
    env = dict(os.environ, PATH="/usr/sbin:" + os.environ["PATH"], WLB_SLURM_PORT=str(free_port_pair()),
               WLB_SLURM_CPUS="8", SLURM_CONF=os.path.join(cluster, "slurm.conf"), OMPI_ALLOW_RUN_AS_ROOT="1",
               OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMPI_MCA_rmaps_base_oversubscribe="1", OMP_NUM_THREADS="1")
    for k in list(env):
        if k.startswith("SLURM_") and k != "SLURM_CONF":
            del env[k]
    fx = {"work": work, "cluster": cluster, "env": env, "jobs": {}, "refs": {}, "t0": time.time(), "info": {},
          "acts": {}}
    # The jobs cancelled and the daemons stopped however the test ends (a timeout's SIGTERM included).
    atexit.register(teardown, fx)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(124))
    r = run([os.path.join(REPO, "scripts", "slurm", "local-cluster.sh"), "start", cluster], env)
    if r.returncode != 0:
        raise AssertionError("local-cluster.sh start failed:\n" + r.stdout)
    text = os.path.join(work, "doc.txt")
    with open(text, "w") as f:
        f.write("a b c d e f g h i j k l m n o p\n" * 60)
    r = run([WLBTRAIN, "convert", "--quiet", "--out", os.path.join(work, "docs"), text], env)
    check(r.returncode == 0, r.stdout)
    with open(os.path.join(work, "tiny.yaml"), "w") as f:
        f.write(CONFIG)
    os.symlink(WLBTRAIN, os.path.join(work, "wlbtrain"))
    os.symlink(os.path.join(REPO, "scripts"), os.path.join(work, "scripts"))
    for name in JOBS:
        fx["jobs"][name] = submit(fx, name)
    drive(fx)
    return fx


def teardown(fx):
    if fx.get("down"):
        return
    fx["down"] = True
    if fx["jobs"]:
        run(["scancel"] + [str(j) for j in fx["jobs"].values()], fx["env"])
        # their processes gone before slurmd is (KillWait 5 s)
        t0 = time.time()
        while time.time() - t0 < 15 and any(job_info(fx, j).get("JobState") not in FINAL for j in fx["jobs"].values()):
            time.sleep(0.25)
    run([os.path.join(REPO, "scripts", "slurm", "local-cluster.sh"), "stop", fx["cluster"]], fx["env"])
    comment("the Slurm jobs took %.0f s (cluster start to stop)" % (time.time() - fx["t0"]))
    shutil.rmtree(fx["work"], ignore_errors=True)


def test_time_limit(fx):
    out = check_resumed(fx, "timelimit", 1)
    for want in ("SIGUSR1 received (the time limit is near)", "stop: SIGUSR1 received; stopped after step",
                 "stopped with a checkpoint before the time limit (exit 75): requeueing"):
        check(want in out, "no %r in the output" % want)


def hang(fx, name):
    out = check_resumed(fx, name, 1)
    check("never reached it: rank 1" in out, "rank 1 not named")
    check("the watchdog ended a hung job (exit 76" in out, "the script did not see exit 76")


def test_hang_srun(fx):
    hang(fx, "hang-srun")


def test_hang_mpirun(fx):
    hang(fx, "hang-mpirun")


def test_scancel(fx):
    name = "scancel"
    info, out = fx["info"][name], show(fx, name)
    if info.get("JobState") != "CANCELLED" or info.get("Restarts") != "0":
        comment(out[-3000:])
    check(name in fx["acts"], "never cancelled (the job ended before step 2 was logged)")
    check(info.get("JobState") == "CANCELLED", "job state %s %d s after it ended, expected CANCELLED"
          % (info.get("JobState"), REQUEUE_WAIT_S + 4))
    check(info.get("Restarts") == "0", "%s restarts, expected 0" % info.get("Restarts"))
    check("requeueing" not in out, "the script requeued a cancelled job")
    # the ranks' stop signal: the script's SIGUSR1, or Slurm's own SIGTERM to the step, whichever came first
    check(re.search(r"^stop: SIG(USR1|TERM) received; stopped after step", out, re.M) and
          os.path.exists(os.path.join(fx["work"], "ck-scancel", "latest")), "no checkpoint of the cancelled job")


def test_requeue_loop(fx):
    name = "loop"
    info, out = fx["info"][name], show(fx, name)
    if info.get("JobState") != "FAILED" or info.get("Restarts") != "1":
        comment(out[-4000:])
    check(info.get("JobState") == "FAILED", "job state %s, expected FAILED" % info.get("JobState"))
    check(info.get("Restarts") == "1", "%s restarts, expected 1 (WLB_MAX_REQUEUES 1)" % info.get("Restarts"))
    check(re.search(r"but not requeued: 1 requeue in a row without a new checkpoint", out),
          "no 'not requeued' message")


def test_scripts_lines(fx):
    problems = []
    for name in SCRIPTS:
        text = open(os.path.join(REPO, "scripts", "slurm", name)).read()
        for want in (r"^#SBATCH --signal=B:USR1@\d+$", r"^#SBATCH --requeue$", r"^#SBATCH --open-mode=append$",
                     r"^source scripts/slurm/job\.sh$", r'^wlb_job "\$config" "\$@"$', r"^launcher=\("):
            if not re.search(want, text, re.M):
                problems.append("%s: no line matching %s" % (name, want))
        if re.search(r"^launcher=\(srun", text, re.M) and \
                not re.search(r"^launcher=\(srun .*--kill-on-bad-exit=1", text, re.M):
            problems.append("%s: srun without --kill-on-bad-exit=1" % name)
    check(not problems, "; ".join(problems))


def main():
    tests = [("one-node.sbatch: the time limit's SIGUSR1: checkpoint, exit 75, requeued, resumed bit for bit",
              test_time_limit),
             ("one-node.sbatch (srun): a rank SIGSTOPped: exit 76, requeued, resumed bit for bit", test_hang_srun),
             ("multi-node-mpirun.sbatch: a rank SIGSTOPped: exit 76, requeued, resumed bit for bit", test_hang_mpirun),
             ("multi-node.sbatch: a plain scancel stays cancelled", test_scancel),
             ("multi-node-mpirun.sbatch: a job that hangs on every start stops requeueing", test_requeue_loop)]
    # The scripts' lines first, without Slurm; then the jobs (run_tests prints the plan).
    print("1..%d" % (len(tests) + 1))
    status = 0
    try:
        test_scripts_lines(None)
        print("ok 1 - every script asks for SIGUSR1 before the time limit, may be requeued, runs job.sh")
    except AssertionError as e:
        print("not ok 1 - every script asks for SIGUSR1 before the time limit, may be requeued, runs job.sh")
        comment(str(e))
        status = 1
    return max(status, run_tests(tests, setup, teardown, first=2, plan=False))


if __name__ == "__main__":
    sys.exit(main())
