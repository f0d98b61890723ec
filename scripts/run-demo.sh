#!/usr/bin/env bash
# The README's run command (`make run`): the main job on the embedded demo corpus. `make run` has
# built ./wlbtrain and the demo corpus (data/demo/libc_headers) before this runs. It describes the
# corpus, trains the tiny model of config/examples/tiny-cpu.yaml on it on the CPU (300 steps, a few
# minutes on two cores; metrics in runs/tiny-cpu/metrics.jsonl), then plans the same corpus as the
# 64-GPU long-context job of config/examples/llama8b.yaml would (a dry run: one process, no
# GPU) and compares every packer and CP sharding mode on it.
set -euo pipefail
cd "$(dirname "$0")/.."
echo "== ./wlbtrain inspect data/demo/libc_headers"
./wlbtrain inspect data/demo/libc_headers
echo
echo "== ./wlbtrain --config config/examples/tiny-cpu.yaml"
./wlbtrain --config config/examples/tiny-cpu.yaml
echo
cfg=config/examples/llama8b.yaml
echo "== ./wlbtrain --config $cfg --set data.path=data/demo/libc_headers --dry-run --compare --steps 100"
./wlbtrain --config "$cfg" --set data.path=data/demo/libc_headers --dry-run --compare --steps 100
