#!/usr/bin/env python3
"""test/test_mutations.py - every deliberate bug of scripts/mutations.txt still applies to the tree.

scripts/mutate.sh plants each bug in a copy of the tree and checks that its tests catch it; it
refuses to start when a bug's text is no longer in its file (the code moved or changed), and then no
mutation runs at all. `scripts/mutate.sh --check` does only that check, without building anything:
run here, a change that moves or rewrites code its mutations name fails make test, with the stale
ones listed, instead of the next mutation run. Output: TAP.
"""
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main():
    r = subprocess.run(["bash", os.path.join(REPO, "scripts", "mutate.sh"), "--check"], cwd=REPO,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    out = r.stdout.decode(errors="replace").strip().splitlines()
    print("1..1")
    if r.returncode == 0 and any(line.startswith("mutate: all ") for line in out):
        print("ok 1 - %s" % out[-1])
        return 0
    print("not ok 1 - every mutation of scripts/mutations.txt applies to the tree")
    for line in out:
        print("# " + line)
    return 1


if __name__ == "__main__":
    sys.exit(main())
