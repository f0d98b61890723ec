#!/usr/bin/env bash
# The README's run command (`make run`): the main job on the embedded demo corpus, as far as the
# program goes today. `make run` has built ./wlbtrain and the demo corpus (data/demo/libc_headers)
# before this runs. It describes the corpus, then plans it as the 64-GPU long-context job of
# config/examples/llama3-8b-128k.yaml would (TP 8, CP 2, PP 4, 128K windows; a dry run: one
# process, no GPU), and compares every packer and CP sharding mode on it.
set -euo pipefail
cd "$(dirname "$0")/.."
cfg=config/examples/llama3-8b-128k.yaml
echo "== ./wlbtrain inspect data/demo/libc_headers"
./wlbtrain inspect data/demo/libc_headers
echo
echo "== ./wlbtrain --config $cfg --set data.path=data/demo/libc_headers --dry-run --steps 20"
mkdir -p runs/demo
./wlbtrain --config "$cfg" --set data.path=data/demo/libc_headers --dry-run --steps 20 --set log.every=5 \
  --stats-out runs/demo/dryrun.jsonl
echo
echo "== ./wlbtrain --config $cfg --set data.path=data/demo/libc_headers --dry-run --compare --steps 100"
./wlbtrain --config "$cfg" --set data.path=data/demo/libc_headers --dry-run --compare --steps 100
echo
echo "Per-step JSON lines: runs/demo/dryrun.jsonl; figures: scripts/plot_dryrun.py runs/demo/dryrun.jsonl --out runs/demo"
