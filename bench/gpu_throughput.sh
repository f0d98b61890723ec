#!/usr/bin/env bash
# tokens/s, MFU and peak memory of wlbtrain (CUDA backend, bf16) beside PyTorch on the same GPU, in
# the same run: a llama3.2-1b-shaped model at 8K, 32K and 64K windows, one GPU, 4 windows (4
# micro-batches) a step, documents with the lengths of the WLB-LLM list (cut to the window) and
# random tokens (bench/make_corpus.py); then the layer shape of Llama 3.1 8B (4 of its 32 layers,
# so that one GPU holds the weights, gradients and AdamW's moments beside the activations: 32 query
# heads, 8 kv heads of 128) at 8K and 32K windows, beside PyTorch with the same 4 layers. Median over
# the steps after the second.
#
# PyTorch (bench/torch_llama.py), the same batches and FLOP count:
#   flex   FlexAttention over a document-causal block mask from document ids, every layer compiled,
#          autocast bf16, fused AdamW - the strong baseline;
#   sdpa   scaled_dot_product_attention with a dense document mask, uncompiled (8K only: the dense
#          mask of a 32K window does not fit).
# wlbtrain: packers fixed (Plain-4D's windows) and wlb; train.recompute as each row says (none
# where it fits, full at 64K); attention on wlbtrain's own kernels, and with the wlb packer also on
# cuDNN's fused attention (train.attention: cudnn with train.deterministic: false - cuDNN's
# deterministic backward needs score-sized workspace for documents padded to the longest, which this
# path declines above 2 GiB, so it would mostly time the own backward; a failed row where cuDNN does
# not load; not with SHORT=1).
# FLOPs of a step, both sides alike: 6 N per token (N parameters; the tied output projection counts
# once) + 12 L H D per (query, key) pair that attends - causal pairs within a document only (the
# document mask), each side counting the pairs of its own batches (wlbtrain's metrics attn_pairs;
# PyTorch packs the same documents in file order). MFU = FLOPs / step time / 989 TFLOP/s (dense
# bf16 of an H100 SXM, also the H200's). Peak memory: wlbtrain's most device memory in use at any
# allocation (metrics mem_peak_gb: the CUDA context and the libraries' buffers included) beside what
# its memory model predicted before the run (mem_predicted_gb, the dry run's figure; the issue's
# target: within 10%), and PyTorch's the same way (the device's memory in use before the model, plus
# torch.cuda.max_memory_reserved: bench/torch_llama.py's peak_mem_gb). GB of 10^9 bytes on both.
# Usage (on the GPU machine, see scripts/device/gpu_check.sh): bash bench/gpu_throughput.sh [STEPS]
#   WINDOWS="8192 32768" to choose the 1B windows; SKIP_8B=1 to leave out the 8B layer rows, WINDOWS_8B
#   ("8192 32768") to choose theirs; SHORT=1
#   for the rows the targets need, in a device lease: fixed, wlb and flex at 8K and 32K, wlb alone at
#   64K (does it fit), no 8B rows. Each row is printed as it is measured.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
steps=${1:-8}
out=$(mktemp -d)
lengths=.devdata/distca_wlbllm_lengths.json
[ -f "$lengths" ] || lengths=../shared/real-data/lengths/distca_wlbllm_lengths.json
wlb=${WLBTRAIN:-./wlbtrain}
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
echo "# wlbtrain (cuda, bf16) beside PyTorch, one GPU: ${gpu:-unknown}; $(date -u +%Y-%m-%d); $("$wlb" --version | head -1)"
echo "| implementation | window | tokens/s | step ms | MFU | peak memory | predicted by the memory model (vs peak) |"
echo "|---|---|---|---|---|---|---|"
short=${SHORT:-0}

# wlbtrain on corpus $1 at window $2: label, model keys, "LAYERS HEADS HEAD_DIM", packer, recompute,
# and optionally more train keys (", key: value") with the words the row's label gets for them
run_wlbtrain() {
  local corpus=$1 ctx=$2 label=$3 model=$4 shape=$5 packer=$6 recompute=$7 keys=${8:-} words=${9:-}
  cat > "$out/w.yaml" <<YAML
model: $model
parallel: {tp: 1, cp: 1, pp: 1, dp: 1}
data: {path: $corpus, context_window: $ctx, global_batch_tokens: $((ctx * 4))}
balance: {packer: $packer, hardware: h100, max_tokens_per_micro_batch: $ctx}
train: {device: cuda, precision: bf16, recompute: $recompute, steps: $steps, lr: 3.0e-4, warmup_steps: 1$keys}
log: {every: 1000, metrics: $out/m.jsonl}
YAML
  rm -f "$out/m.jsonl"
  if "$wlb" --config "$out/w.yaml" >"$out/w.log" 2>&1; then
    local n plans
    n=$(sed -n 's/.*rank 0 holds \([0-9]*\) parameters.*/\1/p' "$out/w.log")
    # cuDNN's plans are built in the steps where a new shape class first comes (the median may hold some)
    plans=$(sed -n 's/.*cuDNN built \([0-9]*\) plans.* in \([0-9.]*\) s of this run.*/; \1 cuDNN plans built in \2 s/p' "$out/w.log")
    python3 - "$out/m.jsonl" "$n" "$ctx" "$label, $packer, recompute $recompute$words$plans" $shape <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])][2:]
n, ctx, label = int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
L, H, D = int(sys.argv[5]), int(sys.argv[6]), int(sys.argv[7])
ms = statistics.median(r["step_ms"] for r in rows)
tok = statistics.median(r["tokens"] for r in rows)
flops = statistics.median(6 * n * r["tokens"] + 12 * L * H * D * r["attn_pairs"] for r in rows)
last = rows[-1]
print("| wlbtrain, %s | %d | %.0f | %.0f | %.1f%% | %.1f GB | %.1f GB (%+.1f%%) |" % (label, ctx, tok / (ms / 1e3), ms,
      100 * flops / (ms / 1e3) / 989e12, last.get("mem_peak_gb", 0), last.get("mem_predicted_gb", 0),
      100 * (last.get("mem_predicted_gb", 0) / max(last.get("mem_peak_gb", 0), 1e-9) - 1)))
PY
  else
    echo "| wlbtrain, $label, $packer, recompute $recompute$words | $ctx | failed: $(grep -m1 'error' "$out/w.log" | cut -c1-160) | | | | |"
  fi
}

# PyTorch on corpus $1 at window $2 with --attention $3; optionally the model's label ("llama3.2-1b"
# when none) and more arguments of bench/torch_llama.py (--model, --layers)
run_torch() {
  local corpus=$1 ctx=$2 attention=$3 label=${4:-llama3.2-1b}
  shift 3; [ $# -gt 0 ] && shift
  if python3 bench/torch_llama.py --data "$corpus" --ctx "$ctx" --micro 4 --steps "$steps" --attention "$attention" \
       "$@" >"$out/t.json" 2>"$out/t.log"; then
    python3 - "$out/t.json" "$label" <<'PY'
import json, sys
r = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
print("| %s, %s | %d | %.0f | %.0f | %.1f%% | %.1f GB | |" % (sys.argv[2], r["impl"], r["ctx"], r["tokens_per_s"],
      r["step_ms"], 100 * r["flops_per_step"] / (r["step_ms"] / 1e3) / 989e12, r["peak_mem_gb"]))
PY
  else
    echo "| $label, PyTorch, $attention | $ctx | failed: $(grep -v '^ ' "$out/t.log" | tail -1 | cut -c1-160) | | | | |"
  fi
}

corpus() { # window -> the corpus folder, made once
  local ctx=$1
  if [ ! -f "$out/c$ctx.idx" ]; then
    python3 bench/make_corpus.py --out "$out/c$ctx" --docs $((ctx * steps * 4 / 2000 + 200)) --vocab 128256 \
      --lengths "$lengths" --max-len "$ctx" >/dev/null
  fi
  echo "$out/c$ctx"
}

one_b="{preset: llama3.2-1b}"
for ctx in ${WINDOWS:-8192 32768 65536}; do
  c=$(corpus "$ctx")
  rc=none
  [ "$ctx" -ge 65536 ] && rc=full
  if [ "$short" = 1 ] && [ "$ctx" -ge 65536 ]; then
    run_wlbtrain "$c" "$ctx" "llama3.2-1b" "$one_b" "16 32 64" wlb "$rc"
    continue
  fi
  for packer in fixed wlb; do run_wlbtrain "$c" "$ctx" "llama3.2-1b" "$one_b" "16 32 64" "$packer" "$rc"; done
  [ "$short" != 1 ] && run_wlbtrain "$c" "$ctx" "llama3.2-1b" "$one_b" "16 32 64" wlb "$rc" ", attention: cudnn, deterministic: false" \
    ", cuDNN attention (non-deterministic)"
  # The cross-entropy's blocks of 2092 rows (2^28 floats, the default before the chunked loss) against
  # the default's 523 (docs/cuda.md, the chunked cross-entropy): time and peak memory.
  [ "$ctx" = 32768 ] && [ "$short" != 1 ] && run_wlbtrain "$c" "$ctx" "llama3.2-1b" "$one_b" "16 32 64" wlb "$rc" \
    ", logits_block: 268435456" ", logits block 2^28"
  [ "$rc" = none ] && [ "$short" != 1 ] && run_wlbtrain "$c" "$ctx" "llama3.2-1b" "$one_b" "16 32 64" wlb selective
  run_torch "$c" "$ctx" flex
  [ "$ctx" -le 8192 ] && [ "$short" != 1 ] && run_torch "$c" "$ctx" sdpa
done
# The 8B layer shape: wlbtrain without recompute (as PyTorch runs) and with selective recompute (a
# fallback where the activations do not fit), on the own kernels and on cuDNN's; PyTorch beside it.
if [ "${SKIP_8B:-0}" != 1 ] && [ "$short" != 1 ]; then
  eight_b="{preset: llama3.1-8b, n_layers: 4}"
  label="llama3.1-8b layers x 4"
  for ctx in ${WINDOWS_8B:-8192 32768}; do
    c=$(corpus "$ctx")
    for rc in none selective; do run_wlbtrain "$c" "$ctx" "$label" "$eight_b" "4 32 128" wlb "$rc"; done
    run_wlbtrain "$c" "$ctx" "$label" "$eight_b" "4 32 128" wlb none ", attention: cudnn, deterministic: false" \
      ", cuDNN attention (non-deterministic)"
    run_torch "$c" "$ctx" flex "$label" --model llama3.1-8b --layers 4
  done
fi
rm -rf "$out"
