"""Shared pieces of the Python tests: TAP comments and checks, Skip, and the test dependencies.

The modules the tests import (test/requirements.txt) come with the python that test/run.sh runs
them with (scripts/test-python.sh finds or makes it); nothing is installed here. A dependency that
is missing - a module, or a file of ../shared/real-data - makes the tests that need it skip, saying
why; with CI set (CI=1, CI=true) it makes them fail instead, since CI must run the whole suite.
import_module() and import_numpy() return the module or that exception (Skip or Missing), for the
tests to raise in each case.
"""
import os
import sys


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
