#!/usr/bin/env bash
# The planner's cost in instructions, which unlike its time on a shared VM does not move from run
# to run: callgrind counts the instructions of plan_step (packing, CP sharding, replica order) per
# step of the dry run, for hybrid and for groups, on the CP 16 configurations of bench/cp_groups/
# and every real length list.
# Ratios between columns are what to read; the groups vs hybrid planning-time ratio of
# bench/cp_groups.sh measured beside it converts them to milliseconds on the machine at hand.
# Usage: bench/plan_instructions.sh [STEPS]      (default 20; needs valgrind; WLBTRAIN=path overrides ./wlbtrain)
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-20}
lists=../shared/real-data/lengths
[ -d "$lists" ] || { echo "bench: $lists is absent (the real length lists live in ../shared)"; exit 0; }
command -v valgrind >/dev/null || { echo "bench: valgrind is not installed (apt-get install valgrind)"; exit 0; }
bin=${WLBTRAIN:-./wlbtrain}
[ -n "${WLBTRAIN:-}" ] || make -s >/dev/null
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

# Instructions of plan_step (inclusive) per step, in millions: on one planning thread, since the
# instructions of other threads are not under plan_step.
count() { # config list sharding
  local f="$out/cg"
  valgrind --tool=callgrind --callgrind-out-file="$f" "$bin" --config "$1" --dry-run --no-memory-check \
    --steps "$steps" --set "data.lengths_file=$2" --set "balance.cp_sharding=$3" \
    --set balance.plan_threads=1 >/dev/null 2>&1
  callgrind_annotate --inclusive=yes "$f" 2>/dev/null |
    awk -v s="$steps" '/engine\/plan\/plan.c:plan_step / { gsub(",", "", $1); printf "%.2f", $1 / s / 1e6; exit }'
  rm -f "$f"
}

echo "# wlbtrain planner instructions per step (callgrind, plan_step inclusive, millions)"
echo "machine: $(uname -n), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); $(date -u +%Y-%m-%d);" \
     "wlbtrain $(git rev-parse --short HEAD 2>/dev/null || echo '?'); $steps steps each"
echo
echo "| config | lengths | hybrid | groups | groups / hybrid |"
echo "|---|---|---|---|---|"
for cfg in bench/cp_groups/*-cp16.yaml; do
  for l in distca_wlbllm_lengths.json distca_prolong_lengths.json flexsp_wikipedia_lengths.txt \
           linux61_files_llama3_tokens.csv.gz; do
    h=$(count "$cfg" "$lists/$l" hybrid)
    g=$(count "$cfg" "$lists/$l" groups)
    ratio=$(awk -v a="$g" -v b="$h" 'BEGIN { printf "%.1f", a / b }')
    echo "| $(basename "$cfg" .yaml) | $l | $h | $g | $ratio |"
  done
done
