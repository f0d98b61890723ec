#!/usr/bin/env bash
# Builds the demo corpus data/demo/libc_headers (.idx + .bin): the C header files of the Debian
# package libc6-dev, one document per file, as byte-level tokens (id = byte, EOD 256), written by
# `./wlbtrain convert`. Real text - code and the documentation comments around it - ~470 documents
# of very different lengths (20 bytes to 185 KB), ~2.2 MB, present wherever gcc works.
#
# Idempotent: when both files exist and are newer than this script, nothing is done. Installs
# libc6-dev (non-interactively) if it is missing. Prints one line saying what it built.
# Usage: scripts/make-demo-corpus.sh   (from anywhere; paths are relative to the repository root)
set -euo pipefail
cd "$(dirname "$0")/.."
out=data/demo/libc_headers
script=scripts/make-demo-corpus.sh

if [ -f "$out.idx" ] && [ -f "$out.bin" ] && [ "$out.idx" -nt "$script" ] && [ "$out.bin" -nt "$script" ]; then
  echo "make-demo-corpus: $out is up to date"
  exit 0
fi
[ -x ./wlbtrain ] || { echo "wlbtrain: error: make-demo-corpus: ./wlbtrain is missing (run make first)" >&2; exit 2; }

if ! dpkg -s libc6-dev >/dev/null 2>&1; then
  sudo=
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null 2>&1 || { echo "wlbtrain: error: make-demo-corpus: libc6-dev is missing and there is no root or sudo to install it" >&2; exit 2; }
    sudo="sudo -n"
  fi
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq >/dev/null
  $sudo apt-get install -y -qq --no-install-recommends libc6-dev >/dev/null
fi

# Paths only (dpkg -L also prints "diverted by" notes), regular files only, in a fixed order.
list=$(mktemp)
trap 'rm -f "$list"' EXIT
dpkg -L libc6-dev | grep '^/.*\.h$' | LC_ALL=C sort | while IFS= read -r f; do
  if [ -f "$f" ]; then printf '%s\n' "$f"; fi
done >"$list"
n=$(wc -l <"$list")
[ "$n" -gt 0 ] || { echo "wlbtrain: error: make-demo-corpus: libc6-dev lists no .h files" >&2; exit 2; }

mkdir -p "$(dirname "$out")"
summary=$(./wlbtrain convert --quiet --out "$out" --files-from "$list")
echo "make-demo-corpus: built $out from the $n C headers of libc6-dev: ${summary#convert: }"
