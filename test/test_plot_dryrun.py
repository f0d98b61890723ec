#!/usr/bin/env python3
"""scripts/plot_dryrun.py on real dry-run stats: the three figures come out as PNG files, and a bad
stats file is one error line. TAP output. Without matplotlib in this python: skipped, or with CI set
failed (taplib)."""
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from taplib import Skip, import_module  # noqa: E402

WLBTRAIN = os.environ.get("WLBTRAIN", "./wlbtrain")
tests = []


def run(*args):
    return subprocess.run(list(args), capture_output=True, text=True)


def main():
    matplotlib = import_module("matplotlib")
    print("1..3")
    if isinstance(matplotlib, Skip):
        for i in range(1, 4):
            print(f"ok {i} # SKIP {matplotlib}")
        print(f"# skip: {matplotlib}")
        return 0
    if isinstance(matplotlib, Exception):
        for i in range(1, 4):
            print(f"not ok {i} - {matplotlib}")
        return 1
    tmp = tempfile.mkdtemp(prefix="wlbplot-")
    lengths = os.path.join(tmp, "l.txt")
    with open(lengths, "w") as f:
        f.write("\n".join(str(50 + (i * 7919) % 3000 if i % 23 else 9000 + i) for i in range(2000)))
    base = [WLBTRAIN, "--config", "config/examples/llama3-8b-8gpu.yaml", "--dry-run", "--steps", "8",
            "--set", "data.path=", "--set", f"data.lengths_file={lengths}", "--set", "parallel.dp=2",
            "--set", "data.context_window=16384", "--set", "data.global_batch_tokens=131072"]
    ok = True
    stats, cstats = os.path.join(tmp, "s.jsonl"), os.path.join(tmp, "c.jsonl")
    r1 = run(*base, "--stats-out", stats)
    r2 = run(*base, "--compare", "--stats-out", cstats)
    out = os.path.join(tmp, "fig")
    r3 = run(sys.executable, "scripts/plot_dryrun.py", stats, "--out", out)
    names = ["imbalance.png", "microbatches.png", "cp_ranks.png"]
    good = r1.returncode == 0 and r3.returncode == 0 and all(
        open(os.path.join(out, n), "rb").read(8) == b"\x89PNG\r\n\x1a\n" for n in names if os.path.exists(os.path.join(out, n))
    ) and all(os.path.exists(os.path.join(out, n)) for n in names)
    print(("ok" if good else "not ok") + " 1 - a plain run gives the three figures")
    if not good:
        print("# " + (r1.stderr + r3.stderr + r3.stdout).replace("\n", "\n# "))
    ok &= good
    out2 = os.path.join(tmp, "fig2")
    r4 = run(sys.executable, "scripts/plot_dryrun.py", cstats, "--out", out2)
    good = r2.returncode == 0 and r4.returncode == 0 and os.path.exists(os.path.join(out2, "imbalance.png"))
    print(("ok" if good else "not ok") + " 2 - a --compare run gives the imbalance figure of every packer")
    ok &= good
    bad = os.path.join(tmp, "bad.jsonl")
    with open(bad, "w") as f:
        f.write("{not json\n")
    r5 = run(sys.executable, "scripts/plot_dryrun.py", bad)
    good = r5.returncode != 0 and r5.stderr.strip().startswith("wlbtrain: error: ") and ":1: not a JSON line" in r5.stderr
    print(("ok" if good else "not ok") + " 3 - a malformed stats file is one error line")
    ok &= good
    subprocess.run(["rm", "-rf", tmp])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
