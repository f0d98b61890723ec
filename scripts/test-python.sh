#!/usr/bin/env bash
# Prints the path of a Python 3 that has every module the Python tests import (test/requirements.txt:
# numpy, matplotlib, tiktoken, tensorboardX, tokenizers, transformers, hta), making one when there is none. test/run.sh runs the Python tests
# with it. Usage: scripts/test-python.sh [--find]
#
# Where it looks, in order:
#   1. $WLB_PYTHON, when set (taken as it is: the tests then say what it lacks);
#   2. build/pyenv/bin/python, the project's virtual environment, when it has the modules;
#   3. python3 on PATH (pyenv's, a conda's, ...), then /usr/bin/python3 (Debian's), when it has them;
#   4. otherwise it makes build/pyenv: `python3 -m venv` (Debian's python3-venv package, which
#      scripts/install-deps.sh test installs), then pip installs test/requirements.txt from PyPI
#      into it (about 300 MB with HolisticTraceAnalysis's Jupyter packages, a minute or two, once per
#      clone; `make clean` removes it).
# With --find it only looks (1-3) and fails when nothing fits. When the environment cannot be made
# (no network, no venv module) it prints the best python3 there is and says why on stderr; the tests
# then report the missing modules: as skips, or with CI set as failures.
set -u
cd "$(dirname "$0")/.."
modules="numpy, matplotlib, tiktoken, tensorboardX, tokenizers, transformers, hta"
venv=build/pyenv

has_modules() { [ -x "$1" ] && "$1" -c "import $modules" >/dev/null 2>&1; }

if [ -n "${WLB_PYTHON:-}" ]; then
  echo "$WLB_PYTHON"
  exit 0
fi
if has_modules "$PWD/$venv/bin/python"; then
  echo "$PWD/$venv/bin/python"
  exit 0
fi
for py in "$(command -v python3 2>/dev/null)" /usr/bin/python3; do
  if [ -n "$py" ] && has_modules "$py"; then
    echo "$py"
    exit 0
  fi
done
[ "${1:-}" = --find ] && exit 1

# Debian's python first: the venv then does not depend on a user's pyenv or conda.
base=
for py in /usr/bin/python3 "$(command -v python3 2>/dev/null)"; do
  if [ -n "$py" ] && [ -x "$py" ] && "$py" -c 'import venv, ensurepip' >/dev/null 2>&1; then
    base=$py
    break
  fi
done
fallback=$(command -v python3 2>/dev/null || echo /usr/bin/python3)
if [ -z "$base" ]; then
  echo "test-python: no python3 with the venv module (Debian: apt-get install python3-venv); the Python tests" \
       "will miss $modules" >&2
  echo "$fallback"
  exit 0
fi
echo "test-python: making $venv ($base -m venv; pip install -r test/requirements.txt from PyPI)" >&2
rm -rf "$venv"
log=$(mktemp)
if "$base" -m venv "$venv" >"$log" 2>&1 &&
   "$venv/bin/python" -m pip install -q --disable-pip-version-check -r test/requirements.txt >>"$log" 2>&1 &&
   has_modules "$PWD/$venv/bin/python"; then
  rm -f "$log"
  echo "$PWD/$venv/bin/python"
  exit 0
fi
echo "test-python: could not make $venv; the Python tests will miss $modules. Last lines:" >&2
tail -n 5 "$log" | sed 's/^/  /' >&2
rm -f "$log"
rm -rf "$venv"
echo "$fallback"
