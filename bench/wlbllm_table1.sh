#!/usr/bin/env bash
# The dry run on the eight WLB-LLM Table 1 configurations (bench/wlbllm/*.yaml; papers.md §1.7)
# and the real document length lists of ../shared/real-data/lengths. For every configuration it
# runs `wlbtrain --dry-run --compare` (every packer with every CP mode on the same stream) and prints
#   1. one table on the WLB-LLM length list: mean pp_imbalance, cp_time_imbalance, predicted speedup
#      over Plain-4D (fixed + per_seq, same stream) and planning time, for Plain-4D, Fixed-4D
#      (fixed_greedy + adaptive), WLB-LLM (wlb + adaptive) and ours (wlb + hybrid);
#   2. every packer x CP mode for one configuration (7B-128K by default);
#   3. Plain-4D against wlb + hybrid at 7B-128K on each of the four real lists;
#   4. the same like for like: with balance.long_documents cut and then keep for every packer, so
#      Plain-4D and wlb train the same pieces of the same stream: attention work per token, the
#      speedups over Plain-4D under the same rule, and wlb + hybrid's speedup at equal work (over
#      Plain-4D windows of its own pieces, step by step).
# Speedup = predicted tokens/s over the run / Plain-4D's on the same stream, same step count. By
# default (long_documents auto) Plain-4D cuts documents at window ends and wlb keeps them whole, so
# wlb trains more attention work per token: tables 1-3 mix that in; table 4 does not.
# Usage: bench/wlbllm_table1.sh [STEPS] [FULL_CONFIG]      (default 500 steps, 7b-128k)
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-500}
full=${2:-7b-128k}
lists=../shared/real-data/lengths
[ -d "$lists" ] || { echo "bench: $lists is absent (the real length lists live in ../shared)"; exit 0; }
make -s >/dev/null
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

echo "# wlbtrain dry run on WLB-LLM Table 1 configurations"
echo "machine: $(uname -n), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores;" \
     "$(date -u +%Y-%m-%d); wlbtrain $(git rev-parse --short HEAD 2>/dev/null || echo '?'); $steps steps each"
echo "cost model: hardware h100 (bench/wlbllm/*.yaml: interleaved 1F1B, v = 2, layers split evenly, as in the paper's stack)"
for cfg in bench/wlbllm/*.yaml; do
  name=$(basename "$cfg" .yaml)
  ./wlbtrain --config "$cfg" --dry-run --no-memory-check --compare --steps "$steps" --stats-out "$out/$name.jsonl" >/dev/null
done
for l in distca_wlbllm_lengths.json distca_prolong_lengths.json flexsp_wikipedia_lengths.txt \
         linux61_files_llama3_tokens.csv.gz; do
  ./wlbtrain --config "bench/wlbllm/$full.yaml" --dry-run --no-memory-check --compare --steps "$steps" \
    --set "data.lengths_file=$lists/$l" --stats-out "$out/list-$l.jsonl" >/dev/null
  for ld in cut keep; do
    ./wlbtrain --config "bench/wlbllm/$full.yaml" --dry-run --no-memory-check --compare --steps "$steps" \
      --set "data.lengths_file=$lists/$l" --set "balance.long_documents=$ld" --stats-out "$out/ld-$ld-$l.jsonl" >/dev/null
  done
done

python3 - "$out" "$full" <<'PY'
import glob, json, os, sys
out, full = sys.argv[1], sys.argv[2]
ORDER = ["550m-64k", "550m-128k", "7b-64k", "7b-128k", "30b-64k", "30b-128k", "70b-64k", "70b-128k"]

def summaries(path):
    runs = {}
    for line in open(path):
        o = json.loads(line)
        if o.get("summary"):
            tps = o["tokens"] / o["predicted_s"] if o["predicted_s"] > 0 else 0
            runs[(o["packer"], o["cp_sharding"])] = dict(o, tps=tps)
    plain = runs[("fixed", "per_seq")]["tps"]
    for r in runs.values():
        r["speedup"] = r["tps"] / plain if plain else 1
    return runs

def layout(name):
    import re
    text = open(f"bench/wlbllm/{name}.yaml").read()
    m = re.search(r"parallel: \{tp: (\d+), cp: (\d+), pp: (\d+), dp: (\d+)", text)
    return tuple(int(x) for x in m.groups())

SYSTEMS = [("fixed", "per_seq", "Plain-4D"), ("fixed_greedy", "adaptive", "Fixed-4D"),
           ("wlb", "adaptive", "WLB-LLM"), ("wlb", "hybrid", "wlb+hybrid")]
print("\n## 1. Table 1 configurations, WLB-LLM length list (distca_wlbllm_lengths.json)\n")
print("| config | TP,CP,PP,DP | " + " | ".join(f"{s[2]} pp / cp_t / speedup" for s in SYSTEMS) + " | plan ms (wlb+hybrid) |")
print("|---|---|" + "---|" * len(SYSTEMS) + "---|")
for name in ORDER:
    runs = summaries(os.path.join(out, name + ".jsonl"))
    cells = []
    for p, m, _ in SYSTEMS:
        r = runs[(p, m)]
        cells.append(f"{r['pp_imbalance']['mean']:.3f} / {r['cp_time_imbalance']['mean']:.3f} / {r['speedup']:.3f}x")
    h = runs[("wlb", "hybrid")]
    print(f"| {name} | {','.join(map(str, layout(name)))} | " + " | ".join(cells) +
          f" | {h['packer_ms']['mean']:.3f} (max {h['packer_ms']['max']:.2f}) |")

print(f"\n## 2. Every packer and CP mode, {full}, WLB-LLM length list\n")
print("| packer | cp_sharding | pp_imbalance mean | p95 | cp_imbalance mean | cp_time_imbalance mean | speedup | "
      "plan ms mean | token delay (steps) |")
print("|---|---|---|---|---|---|---|---|---|")
runs = summaries(os.path.join(out, full + ".jsonl"))
for (p, m), r in sorted(runs.items(), key=lambda kv: (["fixed", "fixed_greedy", "wlb"].index(kv[0][0]),
                                                      ["per_seq", "per_doc", "adaptive", "hybrid", "groups"].index(kv[0][1]))):
    print(f"| {p} | {m} | {r['pp_imbalance']['mean']:.3f} | {r['pp_imbalance']['p95']:.3f} | "
          f"{r['cp_imbalance']['mean']:.3f} | {r['cp_time_imbalance']['mean']:.3f} | {r['speedup']:.3f}x | {r['packer_ms']['mean']:.3f} | "
          f"{r['token_delay_steps']:.2f} |")

print(f"\n## 3. {full} on each real length list\n")
print("| lengths | Plain-4D pp_imbalance | WLB-LLM pp / speedup | wlb+hybrid pp / cp_t / speedup |")
print("|---|---|---|---|")
for path in sorted(glob.glob(os.path.join(out, "list-*.jsonl"))):
    runs = summaries(path)
    pl, w, h = runs[("fixed", "per_seq")], runs[("wlb", "adaptive")], runs[("wlb", "hybrid")]
    print(f"| {os.path.basename(path)[5:-6]} | {pl['pp_imbalance']['mean']:.3f} | "
          f"{w['pp_imbalance']['mean']:.3f} / {w['speedup']:.3f}x | "
          f"{h['pp_imbalance']['mean']:.3f} / {h['cp_time_imbalance']['mean']:.3f} / {h['speedup']:.3f}x |")

print(f"\n## 4. {full} on each real length list, like for like (balance.long_documents the same for every packer)\n")
print("| lengths | documents | attention pairs per token: Plain-4D / wlb | WLB-LLM (wlb + per_doc) pp / speedup | "
      "wlb + hybrid pp / speedup | wlb + hybrid at equal work |")
print("|---|---|---|---|---|---|")
for l in ["distca_wlbllm_lengths.json", "distca_prolong_lengths.json", "flexsp_wikipedia_lengths.txt",
          "linux61_files_llama3_tokens.csv.gz"]:
    for ld in ["cut", "keep"]:
        path = os.path.join(out, f"ld-{ld}-{l}.jsonl")
        runs = summaries(path)
        pl, d, h = runs[("fixed", "per_seq")], runs[("wlb", "per_doc")], runs[("wlb", "hybrid")]
        print(f"| {l} | {ld} | {pl['attn_pairs_per_token']:.0f} / {h['attn_pairs_per_token']:.0f} | "
              f"{d['pp_imbalance']['mean']:.3f} / {d['speedup']:.3f}x | {h['pp_imbalance']['mean']:.3f} / "
              f"{h['speedup']:.3f}x | {h['throughput_speedup_equal_work']:.3f}x |")
PY
