#!/usr/bin/env bash
# On the GPU machine: where a training step's GPU time goes, kernel by kernel. Runs wlbtrain (CUDA,
# bf16) on a llama3.2-1b-shaped model with LAYERS layers for 2 steps of 4 windows of CTX tokens
# (documents from the WLB-LLM length list) under Nsight Compute, which times every kernel launch
# (gpu__time_duration), and prints a table: kernel (template arguments dropped), launches, total ms,
# share of the kernel time. Nsight Systems is not on the device machines; ncu serializes kernels, so
# the shares are those of kernel time, not of the step's wall time.
# Usage: bash scripts/device/profile.sh [CTX] [LAYERS] [extra --set KEY=VALUE ...]
#   e.g. bash scripts/device/profile.sh 8192 2 --set train.recompute=selective
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
ctx=${1:-8192}
layers=${2:-2}
shift $(($# > 2 ? 2 : $#))
out=${OUT:-/tmp/profile}
mkdir -p "$out"
wlb=${WLBTRAIN:-$PWD/build/device/wlbtrain}
lengths=.devdata/distca_wlbllm_lengths.json
[ -f "$lengths" ] || lengths=../shared/real-data/lengths/distca_wlbllm_lengths.json
work=$(mktemp -d)
python3 bench/make_corpus.py --out "$work/c" --docs 400 --vocab 128256 --lengths "$lengths" --max-len "$ctx" >/dev/null
cat > "$work/p.yaml" <<YAML
model: {preset: llama3.2-1b, n_layers: $layers}
parallel: {tp: 1, cp: 1, pp: 1, dp: 1}
data: {path: $work/c, context_window: $ctx, global_batch_tokens: $((ctx * 4))}
balance: {packer: wlb, hardware: h100, max_tokens_per_micro_batch: $ctx}
train: {device: cuda, precision: bf16, steps: 2, lr: 3.0e-4, warmup_steps: 1}
YAML
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
echo "# kernel time of 2 steps: llama3.2-1b shape, $layers layers, 4 x $ctx tokens, bf16; ${gpu:-unknown GPU}; $*"
if ! ncu --csv --metrics gpu__time_duration.sum --clock-control none "$wlb" --config "$work/p.yaml" "$@" \
     >"$out/ncu.csv" 2>"$out/ncu.log"; then
  echo "profile: ncu failed:"; tail -20 "$out/ncu.log"; rm -rf "$work"; exit 1
fi
python3 - "$out/ncu.csv" <<'PY'
import collections, csv, io, re, sys
text = open(sys.argv[1], errors="replace").read()
lines = [l for l in text.splitlines() if l.startswith('"')]  # ncu's CSV rows; the program's output is not quoted
rows = list(csv.DictReader(io.StringIO("\n".join(lines))))
scale = {"nsecond": 1e-6, "usecond": 1e-3, "msecond": 1.0, "second": 1e3}
total = collections.Counter()
calls = collections.Counter()
for r in rows:
    if r.get("Metric Name") != "gpu__time_duration.sum":
        continue
    name = re.sub(r"[<(].*", "", r["Kernel Name"]).strip()
    ms = float(r["Metric Value"].replace(",", "")) * scale.get(r.get("Metric Unit", "nsecond"), 1e-6)
    total[name] += ms
    calls[name] += 1
all_ms = sum(total.values())
print("| kernel | launches | ms | share |")
print("|---|---|---|---|")
for name, ms in total.most_common(25):
    print("| %s | %d | %.1f | %.1f%% |" % (name[:70], calls[name], ms, 100 * ms / all_ms))
print("| (all %d kernels) | %d | %.1f | 100%% |" % (len(total), sum(calls.values()), all_ms))
PY
rm -rf "$work"
