#!/usr/bin/env bash
# How the default outlier thresholds (balance.outlier_thresholds) were chosen: the wlb packer with
# hybrid CP on four WLB-LLM Table 1 configurations (550M-64K, 7B-64K, 7B-128K, 30B-128K) and the
# four real length lists, for candidate thresholds given as fractions of the context window W.
# For each candidate: pp_imbalance (mean over the 16 runs, the worst run's mean and the worst run's
# p95 over its steps), the worst run's mean cp_time_imbalance, the mean delay of a token in steps, and the
# predicted speedup over Plain-4D on the same documents.
# WLB-LLM's aim: the best balance at a delay of about half a step (its Table 2: 2 queues, 1.05).
# Usage: bench/outlier_thresholds.sh [STEPS]      (default 300)
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-300}
lists=../shared/real-data/lengths
[ -d "$lists" ] || { echo "bench: $lists is absent (the real length lists live in ../shared)"; exit 0; }
make -s >/dev/null
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
echo "# outlier thresholds: wlb + hybrid, $steps steps per run"
echo "machine: $(uname -n), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores;" \
     "$(date -u +%Y-%m-%d); wlbtrain $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
candidates="none 1/2 1/4,1/2 1/2,3/4 1/8,1/4,1/2 1/4,1/2,3/4 3/8,3/4 1/8,1/4,1/2,3/4 1/4,1/2,3/4,4/4"
for cfg in 550m-64k 7b-64k 7b-128k 30b-128k; do
  w=$(awk '/context_window:/ {print $2}' "bench/wlbllm/$cfg.yaml")
  for l in distca_wlbllm_lengths.json distca_prolong_lengths.json flexsp_wikipedia_lengths.txt \
           linux61_files_llama3_tokens.csv.gz; do
    for c in $candidates; do
      th="[]"
      [ "$c" = none ] || th="[$(echo "$c" | tr ',' '\n' | while IFS=/ read -r a b; do echo $((w * a / b)); done | paste -sd,)]"
      ./wlbtrain --config "bench/wlbllm/$cfg.yaml" --dry-run --no-memory-check --steps "$steps" --set "data.lengths_file=$lists/$l" \
        --set "balance.outlier_thresholds=$th" --stats-out "$out/$cfg-$l-${c//\//_}.jsonl" >/dev/null
    done
  done
done
python3 - "$out" "$candidates" <<'PY'
import glob, json, os, sys
out, candidates = sys.argv[1], sys.argv[2].split()
print("\n| thresholds (x W) | pp_imbalance mean | worst run | worst run p95 | worst run cp_time_imbalance | token delay (steps) | speedup vs Plain-4D |")
print("|---|---|---|---|---|---|---|")
for c in candidates:
    rows = []
    for path in glob.glob(os.path.join(out, f"*-{c.replace('/', '_')}.jsonl")):
        s = [json.loads(l) for l in open(path)][-1]
        rows.append((s["pp_imbalance"]["mean"], s["token_delay_steps"], s["throughput_speedup"],
                     s["pp_imbalance"]["p95"], s["cp_time_imbalance"]["mean"]))
    n = len(rows)
    print(f"| {c if c != 'none' else 'none (no delay)'} | {sum(r[0] for r in rows) / n:.3f} | "
          f"{max(r[0] for r in rows):.3f} | {max(r[3] for r in rows):.3f} | {max(r[4] for r in rows):.4f} | "
          f"{sum(r[1] for r in rows) / n:.2f} | {sum(r[2] for r in rows) / n:.3f}x |")
PY
