#!/usr/bin/env bash
# Here, before a GPU session: builds what the GPU machine runs and the folders a device call
# carries (it has CUDA, PyTorch and transformers, but no Open MPI, libyaml, jansson, PCRE2 or
# cmocka, and reaches no network):
#   build/device/   only what runs there, debug info stripped: wlbtrain, the test programs
#                   scripts/device/gpu_check.sh runs (test_ops, test_cuda_model, test_parallel and
#                   the dump_train they drive) and the bench program bench/attn_kernels, all with the
#                   CUDA backend (sm_80, sm_90), copied from build/release
#   .ompi/          the Open MPI runtime, as .deb files ($WLB_SHARED/device/openmpi-bundle.sh)
#   .devlibs/       Debian packages of the other runtime libraries
#   .devdata/       the real document length lists the benchmarks pack
# All four are ignored by git (.gitignore). The device tool sends the tracked files, the untracked
# files git does not ignore, and the carried paths, at most 64 MiB in all: this prints that total
# and fails above 60 MiB (build/release is about 50 MB, its obj/ and libwlb.a included: never carry
# it). Then: the device tool's run with command "bash scripts/device/gpu_check.sh [PART]" and
# carry ["build/device", ".ompi", ".devlibs", ".devdata"].
# WLB_SHARED: the project's shared folder (default ../shared: real data, the Open MPI bundle script).
set -euo pipefail
cd "$(dirname "$0")/../.."
shared=${WLB_SHARED:-../shared}
[ -x "$shared/device/openmpi-bundle.sh" ] || { echo "prepare: no $shared/device/openmpi-bundle.sh: set WLB_SHARED" >&2; exit 1; }
make >/dev/null
make test-deps >/dev/null  # cmocka: the test programs below link it
make VARIANT=release variant-tests >/dev/null
[ -n "$(ls build/release/obj/cuda/*.o 2>/dev/null)" ] || { echo "prepare: no CUDA objects: nvcc missing?" >&2; exit 1; }

# build/device: the programs the GPU machine runs, without debug info (symbols kept for backtraces)
rm -rf build/device
mkdir -p build/device/test build/device/bench
strip --strip-debug -o build/device/wlbtrain build/release/wlbtrain
for t in test_ops test_cuda_model test_parallel dump_train; do
  strip --strip-debug -o "build/device/test/$t" "build/release/test/$t"
done
strip --strip-debug -o build/device/bench/attn_kernels build/release/bench/attn_kernels

# the runtime folders (unpacked trees are made there by gpu_check.sh: never carried from here)
rm -rf .ompi/root .devlibs/root
if ! ls .ompi/*.deb >/dev/null 2>&1; then "$shared/device/openmpi-bundle.sh" .ompi; fi
mkdir -p .devlibs .devdata
if ! ls .devlibs/*.deb >/dev/null 2>&1; then
  (cd .devlibs && apt-get download libyaml-0-2 libjansson4 libpcre2-8-0 libcmocka0 >/dev/null)
fi
lists=$shared/real-data/lengths
if [ -d "$lists" ]; then
  cp "$lists"/distca_wlbllm_lengths.json "$lists"/distca_prolong_lengths.json .devdata/
fi
carry=(build/device .ompi .devlibs .devdata)
for c in "${carry[@]}"; do
  git check-ignore -q "$c" || { echo "prepare: $c is not ignored by git: it would travel twice" >&2; exit 1; }
done

# what will travel, in bytes
files_bytes() { # NUL-separated paths on stdin: the sum of their sizes (missing files: 0)
  { xargs -0 -r stat -c %s -- 2>/dev/null || true; } | awk '{s += $1} END {print s + 0}'
}
tracked=$(git ls-files -z --cached | files_bytes)
untracked=$(git ls-files -z --others --exclude-standard | files_bytes)
carried=$(du -scb "${carry[@]}" | tail -1 | cut -f1)
inner=0
if [ -d shared ] && git check-ignore -q shared; then inner=$(du -sb shared | cut -f1); fi
du -sh "${carry[@]}" | sed 's/^/prepare: /'
total=$((tracked + untracked + carried + inner))
mib() { awk -v b="$1" 'BEGIN {printf "%.1f", b / 1048576}'; }
echo "prepare: $(mib "$total") MiB will travel: tracked files $(mib "$tracked"), untracked $(mib "$untracked"), carried $(mib "$carried")$([ "$inner" -gt 0 ] && echo ", shared/ $(mib "$inner")") (the device tool's limit: 64 MiB)"
echo "prepare: carry [\"build/device\", \".ompi\", \".devlibs\", \".devdata\"]"
if [ "$total" -gt $((60 * 1048576)) ]; then
  echo "prepare: more than 60 MiB would travel: remove untracked files, or carry less" >&2
  exit 1
fi
