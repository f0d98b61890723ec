#!/usr/bin/env bash
# tokens/s and MFU of wlbtrain (CUDA backend, bf16) beside plain PyTorch (bench/torch_llama.py) on
# the same GPU, in the same run: a llama3.2-1b-shaped model, 8K and 32K windows, one GPU, 4 windows
# (4 micro-batches) a step, documents with the lengths of the WLB-LLM list (cut to the window) and
# random tokens (bench/make_corpus.py). Median over steps 3-8.
# FLOPs of a step, both sides alike: 6 N per token (N parameters; the tied output projection counts
# once) + 12 L H D per (query, key) pair that attends - causal pairs within a document only (the
# document mask), each side counting the pairs of its own batches (wlbtrain's metrics attn_pairs;
# PyTorch packs the same documents in file order). MFU = FLOPs / step time / 989 TFLOP/s (dense
# bf16 of an H100 SXM, also the H200's).
# Usage (on the GPU machine, see scripts/device/gpu_check.sh): bash bench/gpu_throughput.sh [STEPS]
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
steps=${1:-8}
out=$(mktemp -d)
lengths=.devdata/distca_wlbllm_lengths.json
[ -f "$lengths" ] || lengths=../shared/real-data/lengths/distca_wlbllm_lengths.json
wlb=${WLBTRAIN:-./wlbtrain}
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
echo "# wlbtrain (cuda, bf16) beside PyTorch, llama3.2-1b shape, one GPU: ${gpu:-unknown}; $(date -u +%Y-%m-%d)"
rows=()
for ctx in 8192 32768; do
  docs=$((ctx * steps * 4 / 2000 + 200))
  python3 bench/make_corpus.py --out "$out/c$ctx" --docs "$docs" --vocab 128256 --lengths "$lengths" \
    --max-len "$ctx" >/dev/null
  for packer in fixed wlb; do
    cat > "$out/w.yaml" <<YAML
model: {preset: llama3.2-1b}
parallel: {tp: 1, cp: 1, pp: 1, dp: 1}
data: {path: $out/c$ctx, context_window: $ctx, global_batch_tokens: $((ctx * 4))}
balance: {packer: $packer, hardware: h100, max_tokens_per_micro_batch: $ctx}
train: {device: cuda, precision: bf16, steps: $steps, lr: 3.0e-4, warmup_steps: 1}
log: {every: 1000, metrics: $out/m.jsonl}
YAML
    if "$wlb" --config "$out/w.yaml" >"$out/w.log" 2>&1; then
      n=$(sed -n 's/.*rank 0 holds \([0-9]*\) parameters.*/\1/p' "$out/w.log")
      rows+=("$(python3 - "$out/m.jsonl" "$n" "$ctx" "$packer" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])][2:]
n, ctx = int(sys.argv[2]), int(sys.argv[3])
ms = statistics.median(r["step_ms"] for r in rows)
tok = statistics.median(r["tokens"] for r in rows)
flops = statistics.median(6 * n * r["tokens"] + 12 * 16 * 32 * 64 * r["attn_pairs"] for r in rows)
print("| wlbtrain, %s | %d | %.0f | %.0f | %.1f%% | - |" % (sys.argv[4], ctx, tok / (ms / 1e3), ms,
                                                           100 * flops / (ms / 1e3) / 989e12))
PY
)")
    else
      rows+=("| wlbtrain, $packer | $ctx | failed: $(grep -m1 'error' "$out/w.log" | cut -c1-80) | | | |")
    fi
  done
  if python3 bench/torch_llama.py --data "$out/c$ctx" --ctx "$ctx" --micro 4 --steps "$steps" >"$out/t.json" 2>"$out/t.log"; then
    rows+=("$(python3 - "$out/t.json" <<'PY'
import json, sys
r = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
print("| %s | %d | %.0f | %.0f | %.1f%% | %.1f GB |" % (r["impl"], r["ctx"], r["tokens_per_s"], r["step_ms"],
      100 * r["flops_per_step"] / (r["step_ms"] / 1e3) / 989e12, r["peak_mem_gb"]))
PY
)")
  else
    rows+=("| pytorch | $ctx | failed: $(tail -1 "$out/t.log" | cut -c1-80) | | | |")
  fi
done
echo "| implementation | window | tokens/s | step ms | MFU | peak memory |"
echo "|---|---|---|---|---|---|"
printf '%s\n' "${rows[@]}"
rm -rf "$out"
