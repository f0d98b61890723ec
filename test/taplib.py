"""Shared pieces of the Python tests: TAP comments and checks, Skip, the test dependencies, and a
runner for tests that share one fixture (run_tests).

The modules the tests import (test/requirements.txt) come with the python that test/run.sh runs
them with (scripts/test-python.sh finds or makes it); nothing is installed here. A dependency that
is missing - a module, or a file of ../shared/real-data - makes the tests that need it skip, saying
why; with CI set (CI=1, CI=true) it makes them fail instead, since CI must run the whole suite.
import_module() and import_numpy() return the module or that exception (Skip or Missing), for the
tests to raise in each case.
"""
import json
import os
import random
import subprocess
import sys
import traceback


class Skip(Exception):
    pass


class Missing(Exception):
    """A test dependency that CI must have: a failure, not a skip."""


def in_ci():
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def missing(what):
    """Skip, or under CI Missing, saying what is missing."""
    return (Missing if in_ci() else Skip)(what)


def import_module(name):
    try:
        return __import__(name)
    except ImportError as e:
        return missing("%s is not importable by %s (%s); test/run.sh runs the tests with the python "
                       "scripts/test-python.sh finds or makes (build/pyenv), or set WLB_PYTHON"
                       % (name, sys.executable, e))


def import_numpy():
    return import_module("numpy")


def need_file(path):
    """Raises Skip (Missing under CI) when a file of the real data is absent."""
    if not os.path.exists(path):
        raise missing("real data absent: %s (it lives in ../shared/real-data beside the clone)" % path)


def comment(msg):
    for line in str(msg).splitlines():
        print("# " + line)


def check(cond, msg):
    if not cond:
        raise AssertionError(msg)


def require(module, *programs):
    """Raises what import_module returned for a module that is missing (Skip, or Missing under CI),
    and Skip for a program that is not built."""
    if isinstance(module, Exception):
        raise module
    for p in programs:
        if not os.path.exists(p):
            raise Skip("%s is not built" % p)


def run_tests(tests, setup, teardown=None, first=1, plan=True):
    """Prints the TAP plan and runs tests, a list of (name, fn), each as fn(fixture), where
    fixture = setup(). When setup raises Skip every test skips with its reason; any other exception
    (Missing under CI among them) fails every test. A test may raise Skip itself. teardown(fixture)
    runs at the end. Returns the exit status: 1 when a test failed. first, plan: the number of the
    first test and whether to print the plan (False: the caller printed it and ran tests before)."""
    if plan:
        print("1..%d" % len(tests))
    fx, why, failure = None, None, None
    try:
        fx = setup()
    except Skip as s:
        why = str(s)
    except Exception as e:
        failure = "".join(traceback.format_exception_only(type(e), e)).strip()
    failed = 0
    for i, (name, fn) in enumerate(tests, first):
        if why:
            print("ok %d - %s # SKIP %s" % (i, name, why))
            print("# skip: %s" % why)
            continue
        if failure:
            print("not ok %d - %s" % (i, name))
            comment("fixture failed: " + failure)
            failed += 1
            continue
        try:
            fn(fx)
            print("ok %d - %s" % (i, name))
        except Skip as s:
            print("ok %d - %s # SKIP %s" % (i, name, s))
            print("# skip: %s" % s)  # test/run.sh lists these lines once each
        except Exception:
            print("not ok %d - %s" % (i, name))
            comment(traceback.format_exc())
            failed += 1
    if fx is not None and teardown:
        teardown(fx)
    return 1 if failed else 0


def tiny_corpus(wlbtrain, folder, seed, docs=300):
    """A small byte-level data set FOLDER/docs (.idx + .bin) for the multi-rank tests: `docs` documents
    of 3 to 80 words drawn with `seed`, made by `wlbtrain convert`. Returns its prefix."""
    rng = random.Random(seed)
    text = os.path.join(folder, "docs.jsonl")
    with open(text, "w") as f:
        for _ in range(docs):
            n = rng.choice([3, 10, 30, 80])
            f.write(json.dumps({"text": " ".join("w%d" % rng.randint(0, 50) for _ in range(n))}) + "\n")
    prefix = os.path.join(folder, "docs")
    r = subprocess.run([wlbtrain, "convert", "--quiet", "--out", prefix, text],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True)
    check(r.returncode == 0, r.stdout)
    return prefix
