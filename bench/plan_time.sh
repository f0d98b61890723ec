#!/usr/bin/env bash
# The planner's time per step with balance.cp_sharding: groups on the CP 16 configurations of
# bench/cp_groups/ and every real length list, for one or more wlbtrain binaries side by side (say
# a build of an older commit and this one): each binary's runs interleave with the others', and
# every cell is the least mean of REPEAT runs - on a shared machine other work only ever adds to the
# planner's time, and it drifts within minutes, so only figures taken in one such run compare.
# BINARY@N runs that binary with balance.plan_threads N (without @, the binary's default: auto).
# Usage: bench/plan_time.sh [STEPS] [REPEAT] [BINARY[@N]...]   (default 200 steps, 3 runs, ./wlbtrain)
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-200}
repeat=${2:-3}
shift $(( $# < 2 ? $# : 2 ))
bins=("$@")
lists=../shared/real-data/lengths
[ -d "$lists" ] || { echo "bench: $lists is absent (the real length lists live in ../shared)"; exit 0; }
if [ ${#bins[@]} -eq 0 ]; then
  make -s >/dev/null
  bins=(./wlbtrain)
fi
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

echo "# wlbtrain planning time per step, balance.cp_sharding: groups (least mean of $repeat runs)"
echo "machine: $(uname -n), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores;" \
     "$(date -u +%Y-%m-%d); $steps steps each"
for ((i = 0; i < repeat; i++)); do
  for cfg in bench/cp_groups/*-cp16.yaml; do
    for l in distca_prolong_lengths.json distca_wlbllm_lengths.json flexsp_wikipedia_lengths.txt \
             linux61_files_llama3_tokens.csv.gz; do
      for b in "${!bins[@]}"; do
        bin=${bins[$b]%@*} threads=()
        [ "$bin" = "${bins[$b]}" ] || threads=(--set "balance.plan_threads=${bins[$b]##*@}")
        "$bin" --config "$cfg" --dry-run --no-memory-check --steps "$steps" --set "data.lengths_file=$lists/$l" \
          --set balance.cp_sharding=groups "${threads[@]}" --stats-out "$out/$b@$(basename "$cfg" .yaml)@$l@$i.jsonl" \
          >/dev/null
      done
    done
  done
done

python3 - "$out" "${bins[@]}" <<'PY'
import glob, json, os, sys
out, bins = sys.argv[1], sys.argv[2:]
best = {}
for path in glob.glob(f"{out}/*.jsonl"):
    b, cfg, lst, _ = os.path.basename(path)[:-len(".jsonl")].split("@")
    for line in open(path):
        o = json.loads(line)
        if o.get("summary"):
            key = (cfg, lst, int(b))
            ms = o["packer_ms"]["mean"]
            best[key] = min(best.get(key, ms), ms)
print()
print("| config | lengths | " + " | ".join(f"`{b}` plan ms" for b in bins) + " |")
print("|---|---|" + "---|" * len(bins))
for cfg, lst in sorted({(c, l) for c, l, _ in best}):
    print(f"| {cfg} | {lst} | " + " | ".join(f"{best[(cfg, lst, i)]:.2f}" for i in range(len(bins))) + " |")
PY
