#!/usr/bin/env bash
# parallel.stage_layers: even against auto, side by side, in the dry run: the three headline configs
# (config/examples/llama8b-wlbllm.yaml - WLB-LLM's 8B layout, the pipelined one; llama8b.yaml has no
# pipeline - llama70b.yaml, llama70b-128k.yaml on the WLB-LLM length list), the
# eight WLB-LLM Table 1 configurations (bench/wlbllm/*.yaml; their bench plans them past the memory
# budget, --no-memory-check, and so does this one) and Llama 3 at its 8K pre-training windows
# (bench/stage_balance/*.yaml), where the output layer over a 128,256-token vocabulary weighs most.
# For each config and split: the layers per stage (per model chunk with interleaving), the output
# layer's time in layers for a typical micro-batch (the dry run's stages line), the predicted time
# of the run (the pipeline simulator over every step), the slowest stage's share of the stages'
# busy time (1 / pp when balanced) and the peak memory of a rank.
# Usage: bench/stage_balance.sh [STEPS]      (default 200 steps; WLBTRAIN=path overrides ./wlbtrain)
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-200}
lists=../shared/real-data/lengths
[ -d "$lists" ] || { echo "bench: $lists is absent (the real length lists live in ../shared)"; exit 0; }
bin=${WLBTRAIN:-./wlbtrain}
[ -n "${WLBTRAIN:-}" ] || make -s >/dev/null
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

echo "# wlbtrain dry run: parallel.stage_layers even and auto"
echo "machine: $(uname -n), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores;" \
     "$(date -u +%Y-%m-%d); wlbtrain $(git rev-parse --short HEAD 2>/dev/null || echo '?'); $steps steps each;" \
     "cost model: hardware h100"
list=$lists/distca_wlbllm_lengths.json
run() { # name config extra-args...
  local name=$1 cfg=$2
  shift 2
  for split in even auto; do
    "$bin" --config "$cfg" --dry-run --steps "$steps" --set "parallel.stage_layers=$split" \
      --stats-out "$out/$name.$split.jsonl" "$@" > "$out/$name.$split.txt"
  done
}
for c in llama8b-wlbllm llama70b llama70b-128k; do
  run "$c" "config/examples/$c.yaml" --set data.path= --set data.weights= --set "data.lengths_file=$list"
done
for cfg in bench/wlbllm/*.yaml bench/stage_balance/*.yaml; do
  run "$(basename "$cfg" .yaml)" "$cfg" --no-memory-check
done

python3 - "$out" <<'PY'
import json, os, re, sys
out = sys.argv[1]
ROWS = ["llama8b-wlbllm", "llama70b", "llama70b-128k", "550m-64k", "550m-128k", "7b-64k", "7b-128k", "30b-64k", "30b-128k",
        "70b-64k", "70b-128k", "llama3-8b-8k", "llama3-70b-8k", "llama3-405b-8k"]

def summary(name, split):
    with open(os.path.join(out, "%s.%s.jsonl" % (name, split))) as f:
        return [json.loads(l) for l in f if '"summary"' in l][-1]

def header(name, split):
    text = open(os.path.join(out, "%s.%s.txt" % (name, split))).read()
    lay = re.search(r"\(tp (\d+), cp (\d+), pp (\d+), dp (\d+)\).*window (\d+)", text)
    ratio = re.search(r"the output layer and loss [0-9.]+ ms \(([0-9.]+) layers\)", text)
    return lay.groups(), float(ratio.group(1))

def peak(s):
    m = s["memory"]
    return "%.1f%s" % (m["peak_gb"], " (over)" if m["budget_gb"] > 0 and m["peak_gb"] > m["budget_gb"] else "")

def split_text(s):
    return "[" + ", ".join(str(n) for n in s["stage_layers"]) + "]"

print("\n| config | TP,CP,PP,DP | window | output layer (layers) | layers: even | layers: auto | predicted s: even | "
      "auto | auto / even | slowest stage share: even | auto | peak GB: even | auto |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
worst = 0
for name in ROWS:
    e, a = summary(name, "even"), summary(name, "auto")
    (tp, cp, pp, dp, w), ratio = header(name, "even")
    r = a["predicted_s"] / e["predicted_s"]
    if e["memory"]["peak_gb"] <= e["memory"]["budget_gb"]:
        worst = max(worst, r) # where the even split fits
    print("| %s | %s,%s,%s,%s | %s | %.2f | %s | %s | %.2f | %.2f | %.4f | %.1f%% | %.1f%% | %s | %s |" % (
        name, tp, cp, pp, dp, w, ratio, split_text(e), split_text(a), e["predicted_s"], a["predicted_s"], r,
        100 * e["slowest_stage_share"], 100 * a["slowest_stage_share"], peak(e), peak(a)))
print("\noutput layer (layers): the output layer and loss of a typical micro-batch over one layer's forward + backward "
      "(the dry run's stages line); predicted s: the pipeline simulator over the run; slowest stage share: its busy "
      "time over all the stages' (1/pp when balanced); auto / even: predicted time, below 1 when auto is faster "
      "(largest where the even split fits: %.4f); peak GB: the memory model's worst rank, (over) past the 80 GB of an H100" % worst)
PY
