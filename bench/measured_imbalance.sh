#!/usr/bin/env bash
# Predicted against measured imbalance on the CPU backend: trains the tiny model on the demo corpus
# (make demo) with a 4096-token window - long documents, so attention dominates - on two ranks
# (one per core, one OpenMP thread each: nothing oversubscribed) and prints, per run, the mean
# over the steps (the first, warm-up step left out) of the metrics' pp_imbalance and cp_imbalance
# beside pp_imbalance_measured and cp_imbalance_measured, and the step time.
#   1. cp = 2: per_seq, per_doc, hybrid (packer wlb);
#   2. dp = 2: packers fixed and wlb (cp_sharding hybrid; pp imbalance is over micro-batches).
# Usage: bench/measured_imbalance.sh [STEPS]    (default 6; about a minute per run on 2 cores)
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-6}
make -s >/dev/null
scripts/make-demo-corpus.sh >/dev/null
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
cores=$(getconf _NPROCESSORS_ONLN)
export OMPI_MCA_rmaps_base_oversubscribe=0 OMP_NUM_THREADS=1
[ "$(id -u)" = 0 ] && export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

echo "# predicted and measured imbalance, CPU backend, 2 ranks"
echo "machine: $(uname -n), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $cores cores;" \
     "$(date -u +%Y-%m-%d); wlbtrain $(git rev-parse --short HEAD 2>/dev/null || echo '?'); $steps steps per run"
echo "model tiny, demo corpus, window 4096, 16384 tokens per step, balance.hardware cpu"

run() { # name, then --set arguments
  local name=$1; shift
  local sets=()
  for s in "$@"; do sets+=(--set "$s"); done
  mpirun -np 2 --bind-to core ./wlbtrain --config config/examples/tiny-cpu.yaml --steps "$steps" \
    --set data.context_window=4096 --set data.global_batch_tokens=16384 --set log.every=1000 \
    --set "log.metrics=$out/$name.jsonl" "${sets[@]}" >/dev/null
}
for mode in per_seq per_doc hybrid; do
  run "cp-$mode" parallel.cp=2 parallel.dp=1 balance.packer=wlb "balance.cp_sharding=$mode"
done
for packer in fixed wlb; do
  run "dp-$packer" parallel.cp=1 parallel.dp=2 "balance.packer=$packer" balance.cp_sharding=hybrid
done

python3 - "$out" <<'PY'
import json, os, sys
out = sys.argv[1]
def mean(rows, k):
    return sum(r[k] for r in rows) / len(rows)
print("| run | pp_imbalance predicted | measured | cp_imbalance predicted | measured | step ms |")
print("|---|---|---|---|---|---|")
for name, label in [("cp-per_seq", "cp 2, per_seq"), ("cp-per_doc", "cp 2, per_doc"), ("cp-hybrid", "cp 2, hybrid"),
                    ("dp-fixed", "dp 2, fixed"), ("dp-wlb", "dp 2, wlb")]:
    rows = [json.loads(l) for l in open(os.path.join(out, name + ".jsonl"))][1:]
    print("| %s | %.3f | %.3f | %.3f | %.3f | %.0f |" % (label, mean(rows, "pp_imbalance"),
          mean(rows, "pp_imbalance_measured"), mean(rows, "cp_imbalance"), mean(rows, "cp_imbalance_measured"),
          mean(rows, "step_ms")))
PY
