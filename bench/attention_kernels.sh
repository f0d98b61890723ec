#!/usr/bin/env bash
# bench/attention_kernels.sh - attention alone, on the GPU machine: wlbtrain's tensor-core kernels
# and its cuDNN path (train.attention: cudnn; bench/attn_kernels.c; deterministic and atomic/fastest
# backward; a skipped row where cuDNN does not load: libcudnn.so.9 on LD_LIBRARY_PATH, which
# scripts/device/gpu_check.sh sets from the image's nvidia-cudnn-cu13) beside FlexAttention
# (compiled, block mask), FlashAttention-2 varlen as PyTorch ships it, FlashAttention-3 varlen where
# the image has it, and dense causal SDPA (bench/attn_torch.py),
# on document mixes of the WLB-LLM length list packed into 8K, 32K and 128K windows; 32 query and 8
# kv heads at head size 64 (llama3.2-1b's layer) and 128 (Llama 3.1 8B's) unless HEADS/KV_HEADS/DIMS
# say otherwise. Prints a table per window and head size that names the GPU: milliseconds and
# TFLOP/s (causal pairs within documents; forward 4 D H per pair, backward 2.5 times the forward) of
# the forward and of forward + backward.
# Usage: bash bench/attention_kernels.sh [WINDOW ...]   (default 8192 32768 131072)
#   env: HEADS KV_HEADS DIMS (head sizes, default "64 128"; DIM: one) ITERS SEED; WLB_BENCH_BIN (default build/release/bench); DEVICE (default
#   cuda; cpu runs the CPU reference, to try the script without a GPU)
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
windows=("$@")
[ ${#windows[@]} -gt 0 ] || windows=(8192 32768 131072)
dev=${DEVICE:-cuda} H=${HEADS:-32} HKV=${KV_HEADS:-8} iters=${ITERS:-10} seed=${SEED:-1}
read -r -a dims <<< "${DIM:-${DIMS:-64 128}}"
bin=${WLB_BENCH_BIN:-build/release/bench}
lengths=.devdata/distca_wlbllm_lengths.json
[ -f "$lengths" ] || lengths=../shared/real-data/lengths/distca_wlbllm_lengths.json
[ -f "$lengths" ] || { echo "attention_kernels: no WLB-LLM length list (.devdata or ../shared/real-data)" >&2; exit 2; }
[ -x "$bin/attn_kernels" ] || { echo "attention_kernels: $bin/attn_kernels missing: run make first" >&2; exit 2; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
torchv=$(python3 -c 'import torch; print(torch.__version__)' 2>/dev/null)
echo "# attention kernels on ${gpu:-unknown GPU}, PyTorch ${torchv:-absent}; heads $H q / $HKV kv, head sizes ${dims[*]};"
echo "# documents from the WLB-LLM length list (seed $seed), median of $iters (PyTorch) / mean of $iters (wlbtrain)"
for w in "${windows[@]}"; do
  # one window of documents drawn from the list, the last one cut at the window's end
  python3 bench/attn_mix.py "$lengths" "$w" "$seed" > "$work/segs.$w"
  for D in "${dims[@]}"; do
  {
    "$bin/attn_kernels" "$work/segs.$w" --device "$dev" --heads "$H" --kv-heads "$HKV" --dim "$D" --iters "$iters" --deterministic 1
    "$bin/attn_kernels" "$work/segs.$w" --device "$dev" --heads "$H" --kv-heads "$HKV" --dim "$D" --iters "$iters" --deterministic 0
    if [ "$dev" = cuda ]; then
      for det in 1 0; do
        "$bin/attn_kernels" "$work/segs.$w" --device cuda --heads "$H" --kv-heads "$HKV" --dim "$D" --iters "$iters" \
          --deterministic "$det" --attention cudnn
      done
    fi
    python3 bench/attn_torch.py "$work/segs.$w" --heads "$H" --kv-heads "$HKV" --dim "$D" --iters "$iters"
  } > "$work/res.$w" 2> "$work/err.$w"
  sed 's/^/# stderr: /' "$work/err.$w" | grep -v -i warn | tail -5
  python3 - "$w" "$work/res.$w" "$D" <<'PY'
import json, sys
w, D = int(sys.argv[1]), int(sys.argv[3])
rows = [json.loads(l) for l in open(sys.argv[2]) if l.startswith("{")]
docs = next((r["segments"] for r in rows if "segments" in r and not r["kernel"].startswith("SDPA")), "?")
print(f"\n## window {w} ({docs} documents), head size {D}\n")
print("| kernel | forward ms | forward TFLOP/s | fwd + bwd ms | fwd + bwd TFLOP/s |")
print("|---|---|---|---|---|")
for r in rows:
    if "skipped" in r:
        print(f"| {r['kernel']} | skipped: {r['skipped']} | | | |")
    else:
        print(f"| {r['kernel']} | {r['fwd_ms']:.3f} | {r['fwd_tflops']:.0f} | {r['fwdbwd_ms']:.3f} | {r['fwdbwd_tflops']:.0f} |")
PY
  done
done
