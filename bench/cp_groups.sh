#!/usr/bin/env bash
# Heterogeneous CP groups (balance.cp_sharding: groups) beside per_doc and hybrid: the dry run of
# Llama 3 70B and 405B shapes at 128K windows with CP 8 and CP 16 (bench/cp_groups/*.yaml: TP 8 in a
# node, CP across nodes, wlb packer, H100 profile) on every real length list, and the WLB-LLM
# Table 1 configurations (bench/wlbllm/*.yaml) on the WLB-LLM list. For each run: mean cp_imbalance
# (compute), mean cp_time_imbalance (exchange included), predicted seconds over the run, planning ms
# per step (mean and max), and groups' predicted gain over hybrid. Every run is made REPEAT times
# (default 3): the plans are the same each time (checked), and the planning figures are the run's
# with the least mean, since on a shared machine other work only ever adds to a run's CPU time.
# Usage: bench/cp_groups.sh [STEPS]      (default 200 steps; WLBTRAIN=path overrides ./wlbtrain;
#        REPEAT=n the runs per cell)
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-200}
repeat=${REPEAT:-3}
lists=../shared/real-data/lengths
[ -d "$lists" ] || { echo "bench: $lists is absent (the real length lists live in ../shared)"; exit 0; }
bin=${WLBTRAIN:-./wlbtrain}
[ -n "${WLBTRAIN:-}" ] || make -s >/dev/null
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

echo "# wlbtrain dry run: per_doc, hybrid and groups"
echo "machine: $(uname -n), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores;" \
     "$(date -u +%Y-%m-%d); wlbtrain $(git rev-parse --short HEAD 2>/dev/null || echo '?'); $steps steps each;" \
     "planning: the least mean of $repeat runs"
run() { # name config list mode
  for ((i = 0; i < repeat; i++)); do
    "$bin" --config "$2" --dry-run --no-memory-check --steps "$steps" --set "data.lengths_file=$3" \
      --set "balance.cp_sharding=$4" --stats-out "$out/$1.$4.$i.jsonl" >/dev/null
  done
}
for cfg in bench/cp_groups/*.yaml; do
  for l in distca_wlbllm_lengths.json distca_prolong_lengths.json flexsp_wikipedia_lengths.txt \
           linux61_files_llama3_tokens.csv.gz; do
    for mode in per_doc hybrid groups; do run "$(basename "$cfg" .yaml)@$l" "$cfg" "$lists/$l" "$mode"; done
  done
done
for cfg in bench/wlbllm/*.yaml; do
  for mode in per_doc hybrid groups; do
    run "table1-$(basename "$cfg" .yaml)@distca_wlbllm_lengths.json" "$cfg" "$lists/distca_wlbllm_lengths.json" "$mode"
  done
done

python3 - "$out" <<'PY'
import glob, json, os, sys
out = sys.argv[1]
runs = {}
for path in sorted(glob.glob(f"{out}/*.jsonl")):
    name, mode, _ = os.path.basename(path)[:-len(".jsonl")].rsplit(".", 2)
    for line in open(path):
        o = json.loads(line)
        if not o.get("summary"):
            continue
        kept = runs.setdefault(name, {}).get(mode)
        if kept is None:
            runs[name][mode] = o
            continue
        # The repeats plan the same; only the planning time may differ.
        same = {k: v for k, v in o.items() if k != "packer_ms"} == {k: v for k, v in kept.items() if k != "packer_ms"}
        if not same:
            sys.exit(f"bench: repeated runs of {name} {mode} planned differently")
        if o["packer_ms"]["mean"] < kept["packer_ms"]["mean"]:
            runs[name][mode] = o
MODES = ["per_doc", "hybrid", "groups"]

def row(name):
    r = runs[name]
    cells = []
    for m in MODES:
        o = r[m]
        cells.append(f"{o['cp_imbalance']['mean']:.3f} / {o['cp_time_imbalance']['mean']:.3f} / "
                     f"{o['predicted_s']:.1f} / {o['packer_ms']['mean']:.2f} ({o['packer_ms']['max']:.2f})")
    gain = r["hybrid"]["predicted_s"] / r["groups"]["predicted_s"] - 1
    return cells, gain

head = ("| " + " | ".join(f"{m}: cp / cp_t / s / plan ms (max)" for m in MODES) + " | groups vs hybrid |")
sep = "|---" * (len(MODES) + 2) + "|"
print("\n#### CP 8 and CP 16 at 128K, every real list\n")
print("| config | lengths " + head)
print(sep + "---|")
for name in sorted(n for n in runs if not n.startswith("table1-")):
    cfg, lst = name.split("@")
    cells, gain = row(name)
    print(f"| {cfg} | {lst} | " + " | ".join(cells) + f" | {gain * 100:+.1f}% |")
print("\n#### WLB-LLM Table 1 configurations, WLB-LLM list\n")
print("| config " + head)
print(sep)
for name in sorted(n for n in runs if n.startswith("table1-")):
    cells, gain = row(name)
    print(f"| {name[len('table1-'):].split('@')[0]} | " + " | ".join(cells) + f" | {gain * 100:+.1f}% |")
print("\ncp: mean cp_imbalance (slowest CP rank's compute / mean, worst micro-batch of a step); cp_t: the same with "
      "each rank's exchange counted; s: predicted seconds for the run; plan ms: planning time per step, the "
      "run with the least mean of the repeats")
PY
