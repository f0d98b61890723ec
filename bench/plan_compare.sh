#!/usr/bin/env bash
# Two builds of wlbtrain side by side on the planner's benchmarks: the dry run of every row of
# bench/cp_groups.sh (bench/cp_groups/*.yaml on the four real lists, per_doc / hybrid / groups),
# of bench/wlbllm_table1.sh's eight Table 1 layouts (--compare: every packer with every CP mode, on
# the WLB-LLM list) and of the three headline configs (config/examples/llama8b, llama70b,
# llama70b-128k on the WLB-LLM list), the same configs and steps for both. For a planner change:
# predicted throughput (tokens over predicted seconds) of B over A, cp_time_imbalance and planning
# time (packer_ms, the least mean of REPEAT runs, default 3) of each, every row, then the worst and
# the mean. Both builds must have the same cost model for the ratios to mean anything.
# Usage: bench/plan_compare.sh A_BIN B_BIN [STEPS]      (default 200 steps)
#   e.g. git worktree add /tmp/before <commit> && make -C /tmp/before CUDA=0 VARIANT=release &&
#        bench/plan_compare.sh /tmp/before/build/release-nocuda/wlbtrain build/release-nocuda/wlbtrain
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 2 ] || { echo "usage: bench/plan_compare.sh A_BIN B_BIN [STEPS]" >&2; exit 2; }
a=$1 b=$2 steps=${3:-200} repeat=${REPEAT:-3}
lists=../shared/real-data/lengths
[ -d "$lists" ] || { echo "bench: $lists is absent (the real length lists live in ../shared)"; exit 0; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

echo "# wlbtrain planner, A against B: the dry run on the planner's benchmarks"
echo "machine: $(uname -n), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores;" \
     "$(date -u +%Y-%m-%d); $steps steps each; planning: the least mean of $repeat runs"
echo "A: $a ($("$a" --version 2>/dev/null | head -1))"
echo "B: $b ($("$b" --version 2>/dev/null | head -1))"
run() { # name config [--set ...]
  local name=$1 cfg=$2
  shift 2
  for side in a b; do
    local bin=$a
    [ $side = b ] && bin=$b
    for ((i = 0; i < repeat; i++)); do
      "$bin" --config "$cfg" --dry-run --no-memory-check --steps "$steps" "$@" \
        --stats-out "$out/$name@$side@$i.jsonl" >/dev/null 2>&1 ||
        { echo "bench: $bin failed on $name" >&2; exit 1; }
    done
  done
}
for cfg in bench/cp_groups/*.yaml; do
  for l in distca_wlbllm_lengths.json distca_prolong_lengths.json flexsp_wikipedia_lengths.txt \
           linux61_files_llama3_tokens.csv.gz; do
    for mode in per_doc hybrid groups; do
      run "$(basename "$cfg" .yaml) ${l%%_lengths*} $mode" "$cfg" --set "data.lengths_file=$lists/$l" \
        --set "balance.cp_sharding=$mode"
    done
  done
done
for cfg in bench/wlbllm/*.yaml; do
  run "table1-$(basename "$cfg" .yaml) compare" "$cfg" --compare --set "data.lengths_file=$lists/distca_wlbllm_lengths.json"
done
for c in llama8b llama70b llama70b-128k; do
  run "$c" "config/examples/$c.yaml" --set data.path= --set data.weights= \
    --set "data.lengths_file=$lists/distca_wlbllm_lengths.json"
done

python3 - "$out" <<'PY'
import glob, json, os, sys
out = sys.argv[1]
runs = {}  # (row, packer, mode) -> side -> summary with the least planning mean
for path in sorted(glob.glob(f"{out}/*.jsonl")):
    name, side, _ = os.path.basename(path)[:-len(".jsonl")].split("@")
    for line in open(path):
        o = json.loads(line)
        if not o.get("summary"):
            continue
        key = (name, o["packer"], o["cp_sharding"])
        kept = runs.setdefault(key, {}).get(side)
        if kept is None or o["packer_ms"]["mean"] < kept["packer_ms"]["mean"]:
            runs[key][side] = o
print("\n| row | packer | cp_sharding | B / A tokens/s | cp_t A | cp_t B | plan ms A | plan ms B |")
print("|---|---|---|---|---|---|---|---|")
ratios, cpt, ms = [], [], []
for key in sorted(runs):
    a, b = runs[key]["a"], runs[key]["b"]
    r = (b["tokens"] / b["predicted_s"]) / (a["tokens"] / a["predicted_s"])
    ratios.append((r, key))
    cpt.append((a["cp_time_imbalance"]["mean"], b["cp_time_imbalance"]["mean"]))
    ms.append((a["packer_ms"]["mean"], b["packer_ms"]["mean"]))
    print(f"| {key[0]} | {key[1]} | {key[2]} | {r:.4f} | {cpt[-1][0]:.4f} | {cpt[-1][1]:.4f} | "
          f"{ms[-1][0]:.3f} | {ms[-1][1]:.3f} |")
worst = min(ratios)
n = len(ratios)
print(f"\n{n} rows. B / A tokens/s: worst {worst[0]:.4f} ({' '.join(worst[1])}), best {max(ratios)[0]:.4f}, "
      f"mean {sum(r for r, _ in ratios) / n:.4f}; rows within 0.5%: {sum(r >= 0.995 for r, _ in ratios)} of {n}")
print(f"mean cp_time_imbalance: A {sum(x for x, _ in cpt) / n:.4f}, B {sum(y for _, y in cpt) / n:.4f}; "
      f"mean planning ms: A {sum(x for x, _ in ms) / n:.3f}, B {sum(y for _, y in ms) / n:.3f}")
PY
