#!/usr/bin/env python3
"""test/test_layering.py - the folders include only what docs/architecture.md allows them to, and the
planner's files form no circle.

Dependencies point one way (docs/architecture.md, "Folders"): every project #include of every C,
CUDA and header file of the tree is checked against the table below, which is the one in the
document. A file that includes what its folder may not include is a failure, with the line.

Inside the folders of CIRCLE_FREE (the planner), the same holds between files. A module is a header
and the .c files that implement it: X.c belongs to X.h when there is one, else to the first header of
its own folder that it includes (plan_groups_nest.c to plan_groups.h). Every function a .c file
exports (not static) must be declared in its module's header, and a header declares only what its
module defines; and the modules' includes must form no circle (a circle is printed with the includes
that close it). Output: TAP.
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
CIRCLE_FREE = ("engine/plan", "engine/comm")  # folders whose modules must form no circle (docs/architecture.md)


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
            if f.endswith((".c", ".h", ".cu", ".cuh", ".cpp")):
                yield os.path.relpath(os.path.join(root, f), REPO)


def project_includes(path):
    """(line number, included path) of each project #include of path."""
    out = []
    with open(os.path.join(REPO, path), errors="replace") as f:
        for n, line in enumerate(f, 1):
            m = re.match(r'\s*#\s*include\s+"([^"]+)"', line)
            if m:
                out.append((n, m.group(1)))
    return out


def module_of(path):
    """The header a file belongs to: itself for a header; X.h for X.c; else the first header of the
    .c file's own folder that it includes; else the file itself."""
    stem, ext = os.path.splitext(path)
    if ext in (".h", ".cuh"):
        return path
    if os.path.exists(os.path.join(REPO, stem + ".h")):
        return stem + ".h"
    for _, inc in project_includes(path):
        if os.path.dirname(inc) == os.path.dirname(path) and inc.endswith(".h"):
            return inc
    return path


def top_level_functions(path, definitions):
    """Names of the non-static functions a file defines (definitions) or declares (not): a line at
    column 0 that begins with a type and has NAME( on it, outside comments."""
    text = open(os.path.join(REPO, path), errors="replace").read()
    text = re.sub(r"/\*.*?\*/", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)
    names, lines = [], text.split("\n")
    for i, line in enumerate(lines):
        m = re.match(r"(?!static\b|typedef\b|extern\b|return\b|#)[A-Za-z_][\w \t\*]*?\b(\w+)\(", line)
        if not m:
            continue
        # the statement's end: a definition reaches "{" before ";", a declaration ";" first
        rest = "\n".join(lines[i:i + 8])
        brace, semi = rest.find("{"), rest.find(";")
        is_def = brace >= 0 and (semi < 0 or brace < semi)
        if is_def == definitions:
            names.append((i + 1, m.group(1)))
    return names


def circles_and_declarations(paths):
    """Problems of the CIRCLE_FREE folders: exports not declared in their module's header, and
    circles among the modules."""
    problems, graph, defined = [], {}, {}
    for path in paths:
        if path.endswith(".c"):
            for _, name in top_level_functions(path, True):
                defined.setdefault(module_of(path), set()).add(name)
    for path in paths:
        if path.endswith(".h"):
            for n, name in top_level_functions(path, False):
                if name not in defined.get(path, set()):
                    problems.append("%s:%d: %s is declared here but not defined by this header's module"
                                    % (path, n, name))
        me = module_of(path)
        for n, inc in project_includes(path):
            if os.path.exists(os.path.join(REPO, inc)) and os.path.dirname(inc) == os.path.dirname(path):
                target = module_of(inc)
                if target != me:
                    graph.setdefault(me, {}).setdefault(target, "%s:%d" % (path, n))
        if path.endswith(".c"):
            declared = {name for _, name in top_level_functions(me, False)} if me.endswith(".h") else set()
            for n, name in top_level_functions(path, True):
                if name not in declared:
                    problems.append("%s:%d: %s is exported but not declared in its module's header %s"
                                    % (path, n, name, me))
    # A circle: a path back to a module from one of its includes (depth-first, each module once).
    state = {}

    def visit(v, stack):
        state[v] = 1
        for w in sorted(graph.get(v, {})):
            if state.get(w) == 1:
                ring = stack[stack.index(w):] + [w]
                where = ", ".join(graph[a][b] for a, b in zip(ring, ring[1:]))
                problems.append("circle: %s (the includes %s)" % (" -> ".join(ring), where))
            elif w not in state:
                visit(w, stack + [w])
        state[v] = 2

    for v in sorted(graph):
        if v not in state:
            visit(v, [v])
    return problems


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
    planner = [p for p in sorted(sources()) if p.startswith(tuple(f + "/" for f in CIRCLE_FREE))]
    inner = circles_and_declarations(planner)
    print("1..3")
    print("ok 1 - %d source files found in the table's folders" % checked if checked > 50 else
          "not ok 1 - only %d source files found" % checked)
    if problems:
        print("not ok 2 - every include points the way docs/architecture.md allows")
        for p in problems:
            print("# " + p)
    else:
        print("ok 2 - every include points the way docs/architecture.md allows")
    if inner or len(planner) < 10:
        print("not ok 3 - %s: each export declared in its module's header and only there, no circle among %d files"
              % (", ".join(CIRCLE_FREE), len(planner)))
        for p in inner:
            print("# " + p)
    else:
        print("ok 3 - %s: each export declared in its module's header and only there, no circle among %d files"
              % (", ".join(CIRCLE_FREE), len(planner)))
    return 1 if problems or inner or checked <= 50 or len(planner) < 10 else 0


if __name__ == "__main__":
    sys.exit(main())
