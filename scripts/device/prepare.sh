#!/usr/bin/env bash
# Here, before a GPU session: builds what the GPU machine runs and the folders a device call
# carries (it has CUDA, PyTorch and transformers, but no Open MPI, libyaml, jansson, PCRE2 or
# cmocka, and reaches no network):
#   build/release   wlbtrain and the test programs, with the CUDA backend (sm_80, sm_90)
#   .ompi/          the Open MPI runtime (../shared/device/openmpi-bundle.sh)
#   .devlibs/       Debian packages of the other runtime libraries
#   .devdata/       the real document length lists the benchmark packs
# Then: the device tool's run with command "bash scripts/device/gpu_check.sh" and
# carry ["build/release", ".ompi", ".devlibs", ".devdata"].
set -euo pipefail
cd "$(dirname "$0")/../.."
make >/dev/null
make VARIANT=release variant-tests >/dev/null
[ -n "$(ls build/release/obj/cuda/*.o 2>/dev/null)" ] || { echo "prepare: no CUDA objects: nvcc missing?" >&2; exit 1; }
exclude=.git/info/exclude
for d in /.ompi/ /.devlibs/ /.devdata/; do grep -qx "$d" "$exclude" 2>/dev/null || echo "$d" >> "$exclude"; done
if ! ls .ompi/*.deb >/dev/null 2>&1; then ../shared/device/openmpi-bundle.sh .ompi; fi
mkdir -p .devlibs .devdata
(cd .devlibs && apt-get download libyaml-0-2 libjansson4 libpcre2-8-0 libcmocka0 >/dev/null)
lists=../shared/real-data/lengths
if [ -d "$lists" ]; then
  cp "$lists"/distca_wlbllm_lengths.json "$lists"/distca_prolong_lengths.json .devdata/
fi
du -sh build/release .ompi .devlibs .devdata | sed 's/^/prepare: /'
