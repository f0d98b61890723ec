#!/usr/bin/env bash
# Mutation testing by hand: does the suite catch small real bugs? Each mutation of
# scripts/mutations.txt (an exact text substitution in one file, with the tests that should catch
# it) is applied alone to a scratch copy of this tree, which is rebuilt (make CUDA=0) and the
# mutation's tests are run; then the file is put back. Prints one line per mutation as it goes and
# a table at the end: mutation, file, the test that caught it (the first that failed) or SURVIVED.
# A tool for whoever changes code or tests, not a CI step (a full run takes some minutes).
#
# Usage: scripts/mutate.sh [--all-tests] [--keep] [--list] [--check] [WORD...]
#   WORD...       only the mutations whose name or file contains one of the words
#   --all-tests   run every listed test of a mutation, not just until one fails
#   --keep        keep the scratch copy (its path is printed); MUTATE_DIR=DIR uses DIR
#   --list        list the mutations and stop
#   --check       only check that every mutation still applies to this tree (its text is in its file),
#                 build nothing and stop (test/test_mutations.py runs it in make test)
# First the unmutated copy must pass every test selected (else the table would mean nothing).
# Tests read ../shared/real-data through WLB_REAL_DATA (as test/run.sh sets it); Python tests run
# with the python scripts/test-python.sh finds.
set -euo pipefail
cd "$(dirname "$0")/.."
export WLB_REAL_DATA=${WLB_REAL_DATA:-$(cd .. && pwd)/shared/real-data}
py=$(command -v python3 || echo /usr/bin/python3)
WLB_PYTHON=$(scripts/test-python.sh)
export WLB_PYTHON
exec "$py" - "$@" <<'PY'
import os, shutil, subprocess, sys, tempfile, time

repo = os.getcwd()
args = [a for a in sys.argv[1:]]
all_tests, keep, only_list, only_check = "--all-tests" in args, "--keep" in args, "--list" in args, "--check" in args
words = [a for a in args if not a.startswith("--")]
unknown = [a for a in args if a.startswith("--") and a not in ("--all-tests", "--keep", "--list", "--check")]
if unknown:
    sys.exit("wlbtrain: error: scripts/mutate.sh: unknown option %s (--all-tests, --keep, --list, --check)"
             % unknown[0])


def parse(path):
    muts, cur = [], None
    for no, line in enumerate(open(path, encoding="utf-8").read().split("\n"), 1):
        where = "%s:%d" % (path, no)
        if line.startswith("== "):
            cur = {"name": line[3:].strip(), "nth": 1, "tests": [], "old": [], "new": [], "where": where}
            muts.append(cur)
        elif cur is None or line.strip() == "" or line.startswith("#"):
            continue
        elif line.startswith("file "):
            cur["file"] = line[5:].strip()
        elif line.startswith("nth "):
            cur["nth"] = int(line[4:])
        elif line.startswith("tests "):
            cur["tests"] = line[6:].split()
        elif line.startswith("- ") or line == "-":
            cur["old"].append(line[2:])
        elif line.startswith("+ ") or line == "+":
            cur["new"].append(line[2:])
        else:
            sys.exit("wlbtrain: error: %s: expected file, nth, tests, '- ' or '+ ' lines" % where)
    for m in muts:
        if "file" not in m or not m["old"] or not m["tests"]:
            sys.exit("wlbtrain: error: %s: a mutation needs file, tests and '- ' lines" % m["where"])
        m["old"], m["new"] = "\n".join(m["old"]) + "\n", "\n".join(m["new"]) + "\n"
    return muts


def mutated(text, m):
    """text with the nth occurrence of m's old lines replaced, or None when there is no such one."""
    at = -1
    for _ in range(m["nth"]):
        at = text.find(m["old"], at + 1)
        if at < 0:
            return None
    return text[:at] + m["new"] + text[at + len(m["old"]):]


muts = parse("scripts/mutations.txt")
if words:
    muts = [m for m in muts if any(w in m["name"] or w in m["file"] for w in words)]
if only_list:
    for m in muts:
        print("%-70s %-32s %s" % (m["name"], m["file"], " ".join(m["tests"])))
    sys.exit(0)
if not muts:
    sys.exit("wlbtrain: error: scripts/mutate.sh: no mutation matches %s" % " ".join(words))

# Every mutation must apply to this tree before anything is built.
stale = []
for m in muts:
    try:
        with open(m["file"], encoding="utf-8") as f:
            applies = mutated(f.read(), m) is not None
    except OSError:
        applies = False
    if not applies:
        stale.append("%s: %s: the text to replace (occurrence %d) is not in %s; update scripts/mutations.txt"
                     % (m["where"], m["name"], m["nth"], m["file"]))
if stale:
    sys.exit("wlbtrain: error: " + "\nwlbtrain: error: ".join(stale))
if only_check:
    print("mutate: all %d mutations apply to this tree" % len(muts))
    sys.exit(0)

scratch = os.environ.get("MUTATE_DIR") or tempfile.mkdtemp(prefix="wlb-mutate.")
files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], check=True,
                       stdout=subprocess.PIPE).stdout.decode().split("\0")
for rel in filter(None, files):
    if os.path.isfile(rel):
        os.makedirs(os.path.join(scratch, os.path.dirname(rel)), exist_ok=True)
        shutil.copy2(rel, os.path.join(scratch, rel))
print("mutate: scratch copy %s (%d mutations)" % (scratch, len(muts)), flush=True)

B = "build/release-nocuda"
env = dict(os.environ, CMOCKA_MESSAGE_OUTPUT="TAP", WLBTRAIN=os.path.join(scratch, B, "wlbtrain"),
           WLB_TEST_BIN_DIR=os.path.join(scratch, B, "test"), OMPI_ALLOW_RUN_AS_ROOT="1",
           OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMPI_MCA_rmaps_base_oversubscribe="1")
env.pop("CI", None)  # a mutant that makes a test skip must not read as caught


def build():
    r = subprocess.run(["make", "-s", "CUDA=0", "VARIANT=release", "variant-tests", "-j%d" % (os.cpu_count() or 2)],
                       cwd=scratch, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    return r.returncode == 0, r.stdout.decode(errors="replace")


def run_test(t):
    """True when the test passes (exit 0, no 'not ok' outside skips)."""
    cmd = [env["WLB_PYTHON"], os.path.join("test", t)] if t.endswith(".py") else [os.path.join(B, "test", t)]
    try:
        r = subprocess.run(cmd, cwd=scratch, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           stdin=subprocess.DEVNULL, timeout=900)
    except subprocess.TimeoutExpired:
        return False, "timed out"
    out = r.stdout.decode(errors="replace")
    bad = [l for l in out.splitlines() if l.startswith("not ok") and "# SKIP" not in l]
    return r.returncode == 0 and not bad, out


t0 = time.time()
ok, log = build()
if not ok:
    sys.exit("wlbtrain: error: scripts/mutate.sh: the unmutated copy does not build:\n" + log[-3000:])
tests = []
for m in muts:
    tests += [t for t in m["tests"] if t not in tests]
for t in tests:
    good, out = run_test(t)
    if not good:
        sys.exit("wlbtrain: error: scripts/mutate.sh: %s fails without any mutation (fix it first):\n%s"
                 % (t, out[-3000:]))
print("mutate: the unmutated copy passes %s (%.0f s)" % (" ".join(tests), time.time() - t0), flush=True)

rows = []
for m in muts:
    path = os.path.join(scratch, m["file"])
    with open(path, encoding="utf-8") as f:
        original = f.read()
    with open(path, "w", encoding="utf-8") as f:
        f.write(mutated(original, m))
    t1 = time.time()
    try:
        ok, log = build()
        caught = []
        if not ok:
            caught = ["(does not build)"]
        else:
            for t in m["tests"]:
                good, _ = run_test(t)
                if not good:
                    caught.append(t)
                    if not all_tests:
                        break
    finally:
        with open(path, "w", encoding="utf-8") as f:
            f.write(original)
    verdict = ", ".join(caught) if caught else "SURVIVED"
    if not ok:
        verdict = "DOES NOT BUILD"  # not a bug the tests could catch: fix the mutation
    rows.append((m["name"], m["file"], verdict))
    print("mutate: %-62s %s (%.0f s)" % (m["name"], verdict, time.time() - t1), flush=True)

build()  # leave the scratch build unmutated
print()
print("| mutation | file | caught by |")
print("|---|---|---|")
for name, f, verdict in rows:
    print("| %s | %s | %s |" % (name, f, "**%s**" % verdict if verdict in ("SURVIVED", "DOES NOT BUILD") else verdict))
survivors = sum(v == "SURVIVED" for _, _, v in rows)
broken = sum(v == "DOES NOT BUILD" for _, _, v in rows)
print()
print("%d mutations, %d caught, %d survived%s (%.0f s)" % (
    len(rows), len(rows) - survivors - broken, survivors,
    ", %d do not build (fix them in scripts/mutations.txt)" % broken if broken else "", time.time() - t0))
if keep or os.environ.get("MUTATE_DIR"):
    print("mutate: scratch copy kept: %s" % scratch)
else:
    shutil.rmtree(scratch, ignore_errors=True)
sys.exit(1 if survivors or broken else 0)
PY
