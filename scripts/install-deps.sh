#!/usr/bin/env bash
# Installs, non-interactively, the Debian packages wlbtrain builds and tests with, when any is missing.
# Called by `make` (build deps) and `make test` (also test deps); safe to run again: it only looks
# when everything is present. Usage: scripts/install-deps.sh [build|test|fuzz]
set -euo pipefail
what=${1:-build}

need=()
have_header() { printf '#include <%s>\n' "$1" | cc -E -x c - >/dev/null 2>&1; }
command -v cc >/dev/null 2>&1 || need+=(gcc libc6-dev)
command -v make >/dev/null 2>&1 || need+=(make)
command -v mpicc >/dev/null 2>&1 || need+=(libopenmpi-dev)
command -v mpirun >/dev/null 2>&1 || need+=(openmpi-bin)
have_header yaml.h || need+=(libyaml-dev)
have_header zlib.h || need+=(zlib1g-dev)
have_header jansson.h || need+=(libjansson-dev)
printf '#define PCRE2_CODE_UNIT_WIDTH 8\n#include <pcre2.h>\n' | cc -E -x c - >/dev/null 2>&1 || need+=(libpcre2-dev)
if [ "$what" = test ]; then
  printf '#include <stdarg.h>\n#include <stddef.h>\n#include <setjmp.h>\n#include <cmocka.h>\n' \
    | cc -E -x c - >/dev/null 2>&1 || need+=(libcmocka-dev)
  command -v python3 >/dev/null 2>&1 || need+=(python3)
  # The Python tests' modules (numpy, matplotlib, tiktoken) come from a python that has them or
  # from the virtual environment scripts/test-python.sh makes, which needs Debian's venv module.
  if ! "$(dirname "$0")/test-python.sh" --find >/dev/null 2>&1 && ! /usr/bin/python3 -c 'import venv, ensurepip' >/dev/null 2>&1; then
    need+=(python3-venv)
  fi
  # The real-Slurm test (test/test_slurm.py, scripts/slurm/local-cluster.sh) runs only as root, as in
  # CI: there Debian's Slurm and munge are installed; elsewhere the test says it skips, and nothing
  # here fails for want of them.
  if [ "$(id -u)" -eq 0 ]; then
    for p in slurmctld slurmd; do [ -x "/usr/sbin/$p" ] || need+=("$p"); done
    [ -x /usr/bin/sbatch ] || need+=(slurm-client)
    [ -x /usr/sbin/munged ] || need+=(munge)
  fi
fi
if [ "$what" = fuzz ]; then
  command -v clang >/dev/null 2>&1 || need+=(clang)
  printf '#include <omp.h>\n' | clang -fopenmp -E -x c - >/dev/null 2>&1 || need+=(libomp-dev)
fi

# cuDNN's graph API headers (cudnn-frontend, a header-only C++ library; PyPI's nvidia-cudnn-frontend
# wheel carries them under include/) for the CUDA build's cuDNN attention (cuda/cuda_cudnn_graph.cpp),
# pinned to one version and unpacked into build/deps/. Without them (no pip, no network) the build
# goes on with the cuDNN path compiled out (train.attention: cudnn is then refused).
cudnn_frontend() {
  local version=1.32.0 dir
  dir=$(cd "$(dirname "$0")/.." && pwd)/build/deps/cudnn-frontend-$version
  [ -f "$dir/include/cudnn_frontend.h" ] && return 0
  command -v nvcc >/dev/null 2>&1 || [ -x "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc" ] || return 0
  local py tmp
  py=$(command -v python3 || true)
  [ -n "$py" ] && "$py" -m pip --version >/dev/null 2>&1 || { echo "install-deps: no pip: the cuDNN attention is compiled out" >&2; return 0; }
  tmp=$(mktemp -d)
  # one wheel whatever this python is (the headers are the same in every wheel of the version)
  if "$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.11 --implementation cp \
       --platform manylinux_2_28_x86_64 -d "$tmp" "nvidia-cudnn-frontend==$version" >/dev/null 2>&1 &&
     "$py" - "$tmp" "$dir" <<'PY'
import glob, os, sys, zipfile
wheel = glob.glob(os.path.join(sys.argv[1], "*.whl"))[0]
with zipfile.ZipFile(wheel) as z:
    members = [m for m in z.namelist() if m.startswith("include/")]
    z.extractall(sys.argv[2] + ".tmp", members)
os.replace(sys.argv[2] + ".tmp", sys.argv[2])
PY
  then
    echo "install-deps: cudnn-frontend $version headers in $dir" >&2
  else
    echo "install-deps: could not fetch nvidia-cudnn-frontend==$version: the cuDNN attention is compiled out" >&2
    rm -rf "$dir.tmp"
  fi
  rm -rf "$tmp"
}
if [ "$what" = build ]; then
  mkdir -p "$(dirname "$0")/../build/deps"
  cudnn_frontend
fi
[ ${#need[@]} -eq 0 ] && exit 0

echo "install-deps: installing ${need[*]}" >&2
sudo=
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null 2>&1 || { echo "wlbtrain: error: install-deps: missing packages (${need[*]}) and no root or sudo to install them" >&2; exit 2; }
  sudo="sudo -n"
fi
export DEBIAN_FRONTEND=noninteractive
# A stale package list gives 404s on a fresh machine: update once, then install.
$sudo apt-get update -qq >/dev/null
$sudo apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
