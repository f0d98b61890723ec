"""Shared pieces of the Python tests: TAP comments and checks, Skip, and numpy from PyPI.

import_numpy() returns numpy, pip-installing it once if needed, or a Skip (returned, not raised)
saying why it could not be had; the tests then skip every case with that reason.
"""
import subprocess
import sys


class Skip(Exception):
    pass


def import_numpy():
    try:
        import numpy
        return numpy
    except ImportError:
        pass
    try:
        r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "numpy"],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=600)
        out = r.stdout.decode(errors="replace")
    except Exception as e:  # no pip, timeout
        out = str(e)
    try:
        import numpy
        return numpy
    except ImportError:
        lines = [l for l in out.strip().splitlines() if l.strip() and not l.startswith("WARNING: Running pip as")]
        last = (lines or ["no output"])[-1]
        return Skip("numpy is not installed and pip could not install it: %s" % last)


def comment(msg):
    for line in str(msg).splitlines():
        print("# " + line)


def check(cond, msg):
    if not cond:
        raise AssertionError(msg)
