#!/usr/bin/env bash
# The cost model's micro-batch times against measured ones, before and after `wlbtrain calibrate`,
# and the measured micro-batch balance of the fixed and wlb packers, on one device.
#
# For each real length list (LISTS) and window (WINDOWS): a corpus of random tokens with the list's
# document lengths, cut to the window (bench/make_corpus.py); `wlbtrain calibrate` on the model and
# window; then for packers fixed and wlb, training STEPS steps twice - with the built-in profile
# ("before": balance.hardware cpu or h100) and with the calibrated one ("after"). From the metrics
# (the first step left out: warm-up) over every non-empty micro-batch of replica 0:
#   R^2        1 - sum (p - m)^2 / sum (m - mean m)^2 of the predicted (p, mb_ms_predicted) against the
#              measured (m, mb_ms_measured) forward + backward compute times;
#   worst err  max |p - m| / m;  mean err  mean |p - m| / m;
#   mb_imbalance predicted and measured (max / mean of a replica's micro-batch times: what the wlb
#              packer equalizes), their means over the steps and the mean |difference|;
#   step ms    the median step time.
# The issue's targets (GPU): after calibration R^2 >= 0.95 and worst error within 5%; wlb's measured
# mb_imbalance within 0.02 of its predicted.
#
# Usage: bench/planner_calibration.sh [STEPS]        (default 6)
#   DEVICE=cpu (default) or cuda. On cpu: the tiny model, windows 1024 and 2048 (the GPU's 32K and 64K
#   scaled down: the lengths of the lists divided by LENGTH_SCALE=32, so that they stand to the window
#   as at 32K and 64K; a 32K window of even the tiny model takes minutes a step on two cores),
#   OMP_NUM_THREADS=1. On cuda (scripts/device/gpu_check.sh calibration):
#   a llama3.2-1b-shaped model of 4 layers, bf16, windows 32768 and 65536 (full recomputation).
#   WINDOWS, LISTS (files of ../shared/real-data/lengths or .devdata), MODEL (a YAML flow mapping) override.
#   CP=2: also cp 2 with per_seq, per_doc and hybrid (wlb packer), two ranks under mpirun (on cuda
#   two ranks sharing the GPU, messages through the host).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
steps=${1:-6}
device=${DEVICE:-cpu}
wlb=${WLBTRAIN:-./wlbtrain}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} OMPI_MCA_rmaps_base_oversubscribe=1
[ "$(id -u)" = 0 ] && export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
if [ "$device" = cuda ]; then
  windows=${WINDOWS:-32768 65536}
  model=${MODEL:-"{preset: llama3.2-1b, n_layers: 4}"}
  hardware=h100
  scale=${LENGTH_SCALE:-1}
  train_extra="precision: bf16, recompute: full,"
  what=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
else
  windows=${WINDOWS:-1024 2048}
  model=${MODEL:-"{preset: tiny, max_seq_len: 65536}"}
  hardware=cpu
  scale=${LENGTH_SCALE:-32}
  train_extra=""
  what="$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $OMP_NUM_THREADS thread(s)"
fi
lists=${LISTS:-distca_wlbllm_lengths.json distca_prolong_lengths.json}
find_list() { for d in .devdata ../shared/real-data/lengths; do [ -f "$d/$1" ] && { echo "$d/$1"; return; }; done; }

echo "# predicted against measured micro-batch times, before and after wlbtrain calibrate"
echo "device: $device ($what); $(uname -n); $(date -u +%Y-%m-%d); $("$wlb" --version | head -1);" \
     "model $model; lengths / $scale; $steps steps per run, the first left out; 4 micro-batches a step"
echo
echo "| lengths | window | packer | profile | R^2 | worst err | mean err | mb_imbalance predicted | measured | mean abs diff | step ms |"
echo "|---|---|---|---|---|---|---|---|---|---|---|"

summarize() { # metrics file, row label
  python3 - "$1" "$2" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])][1:]
p, m = [], []
for r in rows:
    for a, b in zip(r["mb_ms_predicted"], r["mb_ms_measured"]):
        if a > 0 and b > 0:
            p.append(a)
            m.append(b)
mean = sum(m) / len(m)
ss_res = sum((a - b) ** 2 for a, b in zip(p, m))
ss_tot = sum((b - mean) ** 2 for b in m)
r2 = 1 - ss_res / ss_tot if ss_tot > 0 else float("nan")
errs = [abs(a - b) / b for a, b in zip(p, m)]
ip = [r["mb_imbalance"] for r in rows]
im = [r["mb_imbalance_measured"] for r in rows]
print("| %s | %.3f | %.1f%% | %.1f%% | %.3f | %.3f | %.3f | %.0f |" % (sys.argv[2], r2, 100 * max(errs),
      100 * sum(errs) / len(errs), sum(ip) / len(ip), sum(im) / len(im),
      sum(abs(a - b) for a, b in zip(ip, im)) / len(ip), statistics.median(r["step_ms"] for r in rows)))
PY
}

train() { # metrics file, ranks, --set arguments...
  local metrics=$1 ranks=$2
  shift 2
  local sets=()
  for s in "$@"; do sets+=(--set "$s"); done
  rm -f "$metrics"
  local launch=()
  [ "$ranks" -gt 1 ] && launch=(mpirun -np "$ranks" --bind-to none)
  "${launch[@]}" "$wlb" --config "$out/c.yaml" --steps "$steps" --set "log.metrics=$metrics" "${sets[@]}" \
    >"$out/train.log" 2>&1 || { echo "| training failed: $(grep -m1 error "$out/train.log" | cut -c1-150) |"; return 1; }
}

for list in $lists; do
  path=$(find_list "$list")
  [ -n "$path" ] || { echo "| $list: not found |"; continue; }
  for w in $windows; do
    # The list's lengths divided by the scale (the CPU's windows are the GPU's / 32: the same mix of
    # lengths relative to the window), then cut to the window.
    python3 - "$path" "$scale" "$out/lengths.json" <<'PY'
import json, sys
sys.path.insert(0, "bench")
from make_corpus import read_lengths
scale = float(sys.argv[2])
json.dump([max(1, round(x / scale)) for x in read_lengths(sys.argv[1]) if x > 0], open(sys.argv[3], "w"))
PY
    python3 bench/make_corpus.py --out "$out/docs" --docs 4000 --vocab 512 --lengths "$out/lengths.json" \
      --max-len "$w" >/dev/null
    cat > "$out/c.yaml" <<YAML
model: $model
parallel: {tp: 1, cp: 1, pp: 1, dp: 1}
data: {path: $out/docs, context_window: $w, global_batch_tokens: $((4 * w))}
balance: {hardware: $hardware}
train: {device: $device, $train_extra steps: $steps, lr: 3.0e-4, warmup_steps: 1}
log: {every: 1000}
YAML
    "$wlb" calibrate --config "$out/c.yaml" --out "$out/profile.json" >"$out/calibrate.log" 2>&1 ||
      { echo "| calibrate failed: $(grep -m1 error "$out/calibrate.log") |"; continue; }
    for packer in fixed wlb; do
      for prof in before after; do
        cal=()
        [ "$prof" = after ] && cal=("balance.calibration=$out/profile.json")
        train "$out/m.jsonl" 1 "balance.packer=$packer" "${cal[@]}" &&
          summarize "$out/m.jsonl" "$list | $w | $packer | $prof"
      done
    done
    if [ "${CP:-1}" = 2 ]; then
      for mode in per_seq per_doc hybrid; do
        train "$out/m.jsonl" 2 parallel.cp=2 balance.packer=wlb "balance.cp_sharding=$mode" \
          "balance.calibration=$out/profile.json" && summarize "$out/m.jsonl" "$list | $w | wlb, cp 2 $mode | after"
      done
    fi
  done
done
