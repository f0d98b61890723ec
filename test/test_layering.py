#!/usr/bin/env python3
"""test/test_layering.py - the folders include only what docs/architecture.md allows them to.

Dependencies point one way (docs/architecture.md, "Folders"): every project #include of every C,
CUDA and header file of the tree is checked against the table below, which is the one in the
document. A file that includes what its folder may not include is a failure, with the line.
Output: TAP.
"""
import os
import re
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# What each part may include besides itself (the same table as docs/architecture.md).
ALLOWED = {
    "util": set(),
    "config": {"util"},
    "data": {"util"},
    "engine/ops.h": set(),
    "engine/comm": {"engine/ops.h", "util"},
    "engine/plan": {"config", "data", "util"},
    "engine/model": {"engine/ops.h", "engine/comm", "config", "util"},
    "engine/backend.h": {"engine/ops.h", "engine/comm", "util"},
    "engine/train": {"engine/ops.h", "engine/backend.h", "engine/comm", "engine/plan", "engine/model", "config",
                     "data", "util"},
    "cpu": {"engine/ops.h", "engine/backend.h", "util"},
    "cuda": {"engine/ops.h", "engine/backend.h", "engine/comm", "util"},
    "cli": {"engine/backend.h", "config", "data", "util"},
    "backends.c": {"cpu", "cuda", "engine/backend.h", "engine/comm", "engine/ops.h", "util"},
    "main.c": {"cli", "config", "data", "engine/comm", "engine/plan", "engine/train", "util"},
}
FREE = ("test/", "fuzz/", "bench/")  # tests, fuzz targets and benchmarks may reach anything


def part(path):
    """The part of the table a file belongs to (None: not checked)."""
    if path.startswith(FREE):
        return None
    if path in ("engine/ops.h", "engine/backend.h", "backends.c", "main.c"):
        return path
    top = path.split("/")
    if top[0] == "engine" and len(top) > 2:
        return "engine/" + top[1]
    return top[0] if top[0] in ALLOWED else "?"


def sources():
    for root, dirs, files in os.walk(REPO):
        dirs[:] = [d for d in dirs if not d.startswith(".") and d != "build"]
        for f in files:
            if f.endswith((".c", ".h", ".cu", ".cuh")):
                yield os.path.relpath(os.path.join(root, f), REPO)


def main():
    problems, checked = [], 0
    for path in sorted(sources()):
        me = part(path)
        if me is None:
            continue
        if me == "?":
            problems.append("%s: a folder the table of docs/architecture.md does not have" % path)
            continue
        checked += 1
        with open(os.path.join(REPO, path), errors="replace") as f:
            for n, line in enumerate(f, 1):
                m = re.match(r'\s*#\s*include\s+"([^"]+)"', line)
                if not m:
                    continue
                target = part(m.group(1))
                if target in (None, me) or target in ALLOWED[me]:
                    continue
                problems.append("%s:%d: %s may not include %s" % (path, n, me, m.group(1)))
    print("1..2")
    print("ok 1 - %d source files found in the table's folders" % checked if checked > 50 else
          "not ok 1 - only %d source files found" % checked)
    if problems:
        print("not ok 2 - every include points the way docs/architecture.md allows")
        for p in problems:
            print("# " + p)
    else:
        print("ok 2 - every include points the way docs/architecture.md allows")
    return 1 if problems or checked <= 50 else 0


if __name__ == "__main__":
    sys.exit(main())
