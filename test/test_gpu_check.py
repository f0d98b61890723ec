#!/usr/bin/env python3
"""test/test_gpu_check.py - scripts/device/gpu_check.sh keeps to its deadline and returns what it did.

A device lease is 15 minutes, one call at most 10, and a call returns at most 8 files: the script's
lease part runs every check it can inside GPU_CHECK_SECONDS, and a call cut short must still bring
back a summary and the logs. No GPU is needed to test that: the script runs here over a fake tree
(fake test programs and benches, a fake nvidia-smi and mpirun on PATH) with a deadline of a few
seconds, in which one test fails, the bench outlives the deadline and the last step finds no time.
Output: TAP.
"""
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import taplib  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEADLINE = 6  # GPU_CHECK_SECONDS of the run

FAKES = {
    "build/device/wlbtrain": 'if [ "${1:-}" = --version ]; then echo "wlbtrain fake"; fi\n',
    "build/device/test/test_ops": 'printf "1..2\\nok 1 - products\\nok 2 - attention\\n"\n',
    "build/device/test/test_cuda_model": 'printf "1..1\\nnot ok 1 - bf16 loss\\n# loss differs\\n"; exit 1\n',
    "build/device/test/test_parallel": "sleep 60\n",
    "bench/attention_kernels.sh": 'echo "# attention kernels on fake"; echo "| kernel | 1 |"\n',
    "bench/gpu_throughput.sh": 'echo "| implementation |"; echo "| wlbtrain, 8192 | 1 |"; sleep 60\n',
    "bench/make_corpus.py": "",
    "test/test_export.py": 'print("1..1")\nprint("ok 1 - export")\n',
    ".ompi/env.sh": "",
    "bin/nvidia-smi": 'echo "GPU 0: Fake H100 (UUID: GPU-0)"\n',
    "bin/mpirun": 'shift 2; exec "$@"\n',
}


def setup():
    root = tempfile.mkdtemp(prefix="gpu_check.")
    os.makedirs(os.path.join(root, "scripts", "device"))
    shutil.copy(os.path.join(REPO, "scripts", "device", "gpu_check.sh"), os.path.join(root, "scripts", "device"))
    os.makedirs(os.path.join(root, ".devlibs", "root"))
    for path, body in FAKES.items():
        full = os.path.join(root, path)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        with open(full, "w") as f:
            f.write(("" if path.endswith(".py") else "#!/usr/bin/env bash\n") + body)
        os.chmod(full, 0o755)
    out = os.path.join(root, "out")
    env = dict(os.environ, OUT=out, GPU_CHECK_SECONDS=str(DEADLINE), GPU_CHECK_MIN_STEP="2",
               PATH=os.path.join(root, "bin") + os.pathsep + os.environ["PATH"])
    t0 = time.monotonic()
    r = subprocess.run(["bash", "scripts/device/gpu_check.sh", "lease"], cwd=root, env=env,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, timeout=120)
    bad = subprocess.run(["bash", "scripts/device/gpu_check.sh", "nosuch"], cwd=root, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, timeout=60)
    return {"root": root, "out": out, "run": r, "seconds": time.monotonic() - t0, "bad": bad,
            "text": r.stdout.decode(errors="replace")}


def summary(fx):
    with open(os.path.join(fx["out"], "summary.txt")) as f:
        return {line.split()[0]: line for line in f.read().splitlines() if line.strip()}


def test_deadline(fx):
    taplib.comment(fx["text"])
    taplib.check(fx["seconds"] < DEADLINE + 30, "the lease ran %.0f s with a deadline of %d s" % (fx["seconds"], DEADLINE))


def test_summary(fx):
    s = summary(fx)
    taplib.check("GPU" in s and "Fake H100" in s["GPU"], "no GPU line in summary.txt: %s" % s)
    taplib.check("exit   0" in s.get("ops", "") and "2 ok, 0 not ok" in s["ops"], "ops: %s" % s.get("ops"))
    taplib.check("exit   1" in s.get("cuda_model", "") and "0 ok, 1 not ok" in s["cuda_model"],
                 "cuda_model: %s" % s.get("cuda_model"))
    for name in ("nccl_one_rank", "export", "attention"):
        taplib.check("exit   0" in s.get(name, ""), "%s: %s" % (name, s.get(name)))
    taplib.check("timed out" in s.get("bench", ""), "bench outlived the deadline: %s" % s.get("bench"))
    taplib.check("skipped" in s.get("parallel_gpu", ""), "parallel_gpu had no time: %s" % s.get("parallel_gpu"))


def test_files_back(fx):
    files = sorted(os.listdir(fx["out"]))
    taplib.check(files == ["logs.tar.gz", "summary.txt"], "files in $OUT: %s" % files)
    with tarfile.open(os.path.join(fx["out"], "logs.tar.gz")) as t:
        logs = {os.path.basename(n): t.extractfile(n).read().decode() for n in t.getnames() if t.extractfile(n)}
    for name in ("gpu.txt", "ops.log", "cuda_model.log", "attention.log", "bench.log"):
        taplib.check(name in logs, "%s missing from logs.tar.gz: %s" % (name, sorted(logs)))
    taplib.check("# loss differs" in logs["cuda_model.log"], "cuda_model.log: %r" % logs["cuda_model.log"])
    taplib.check("| wlbtrain, 8192 | 1 |" in logs["bench.log"], "the bench's rows before the deadline are lost")
    taplib.check("| wlbtrain, 8192 | 1 |" in fx["text"], "the bench's rows are not printed")


def test_unknown_part(fx):
    out = fx["bad"].stdout.decode(errors="replace")
    taplib.check(fx["bad"].returncode == 2 and "unknown part 'nosuch'" in out, "rc %d: %s" % (fx["bad"].returncode, out))


if __name__ == "__main__":
    sys.exit(taplib.run_tests([
        ("lease keeps to GPU_CHECK_SECONDS, each step under the time left", test_deadline),
        ("summary.txt: the GPU, each step's exit and TAP counts, timed out and skipped steps", test_summary),
        ("$OUT holds two files, the logs of every step packed, a cut step's output kept", test_files_back),
        ("an unknown part is exit 2", test_unknown_part),
    ], setup, lambda fx: shutil.rmtree(fx["root"], ignore_errors=True)))
