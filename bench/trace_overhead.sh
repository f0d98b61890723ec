#!/usr/bin/env bash
# bench/trace_overhead.sh - what tracing (trace.steps, docs/timelines.md) costs a training step: the
# median step time over 20 steps with tracing on against 20 with it off, on CPU ranks under mpirun.
#
# Per layout, RUNS runs (default 3) of 45 steps each, tracing the even steps 6-44 (20 steps) and not
# the odd ones 7-45 (20 steps): traced and untraced steps alternate, so that the machine's drift
# (other processes, frequency) hits both alike. Per run: the median step time of each set, their
# ratio, and the median over the 20 pairs (step 2k traced, 2k + 1 not) of the pair's difference,
# over the untraced median (a paired estimate, steadier on a shared machine). With SEPARATE=1 also
# two runs of 25 steps, one tracing 6-25 and one nothing (steps 6-25 of each).
# A step's time is log.metrics' step_ms (its evaluation and checkpoint not in it); a traced step's
# includes everything tracing adds to it (the recording, its share of the step's vote); the files
# are written after the traced steps. The model and data are a small synthetic set unless CONFIG
# names a YAML file (its data.path is used as it is; the layout's keys are overridden). Prints a
# table that names the machine and its load, and the share of the step that the recording itself
# takes (bench/trace_record.c's ns per event times the events a rank records per step).
# Usage: bash bench/trace_overhead.sh      env: WLBTRAIN (default build/release-nocuda/wlbtrain),
#   RANKS (4), LAYOUTS ("tp2pp2 cp2dp2 pp4v2"), RUNS (3), SEPARATE (0), CONFIG
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
bin=${WLBTRAIN:-build/release-nocuda/wlbtrain}
[ -x "$bin" ] || { echo "trace_overhead: $bin missing: run make CUDA=0 first" >&2; exit 2; }
ranks=${RANKS:-4} runs=${RUNS:-3} separate=${SEPARATE:-0}
read -r -a layouts <<< "${LAYOUTS:-tp2pp2 cp2dp2 pp4v2}"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
       OMPI_MCA_rmaps_base_oversubscribe=1

config=${CONFIG:-}
if [ -z "$config" ]; then
  python3 - "$work/docs.jsonl" <<'PY'
import json, random, sys
rng = random.Random(5)
with open(sys.argv[1], "w") as f:
    for _ in range(4000):
        n = rng.choice([3, 10, 30, 80, 200])
        f.write(json.dumps({"text": " ".join("w%d" % rng.randint(0, 50) for _ in range(n))}) + "\n")
PY
  "$bin" convert --quiet --out "$work/docs" "$work/docs.jsonl" || exit 1
  config=$work/tiny.yaml
  cat > "$config" <<EOF
model: {n_layers: 8, d_model: 64, n_heads: 4, n_kv_heads: 2, d_ffn: 128, vocab_size: 260,
        rope_theta: 10000, norm_eps: 1.0e-5, tie_embeddings: false, max_seq_len: 512}
parallel: {tp: 1, cp: 1, pp: 1, dp: auto}
data: {path: $work/docs, context_window: 128, global_batch_tokens: 2048}
balance: {hardware: cpu, packer: wlb}
train: {device: cpu, steps: 45, lr: 0.01, warmup_steps: 2}
log: {every: 1000}
EOF
fi

layout_sets() {
  case $1 in
    tp2pp2) echo "--set parallel.tp=2 --set parallel.cp=1 --set parallel.pp=2 --set parallel.virtual_stages=1" ;;
    cp2dp2) echo "--set parallel.tp=1 --set parallel.cp=2 --set parallel.pp=1 --set parallel.virtual_stages=1" ;;
    pp4v2) echo "--set parallel.tp=1 --set parallel.cp=1 --set parallel.pp=4 --set parallel.virtual_stages=2" ;;
    *) echo "trace_overhead: unknown layout $1 (tp2pp2, cp2dp2, pp4v2)" >&2; return 1 ;;
  esac
}

# run NAME STEPS TRACE [SETS...]: log.metrics in $work/NAME.jsonl
run() {
  local name=$1 steps=$2 trace=$3; shift 3
  local t=()
  [ "$trace" = none ] || t=(--trace "$trace" --set "trace.dir=$work/traces-$name")
  mpirun --oversubscribe --bind-to none -np "$ranks" "$bin" --config "$config" --steps "$steps" "${t[@]}" \
    --set "log.metrics=$work/$name.jsonl" "$@" > "$work/$name.log" 2>&1 ||
    { echo "trace_overhead: run $name failed:" >&2; tail -5 "$work/$name.log" >&2; return 1; }
}

# The recording's own cost, measured alone (bench/trace_record.c: ns per event, best of 7 rounds):
# times the events a rank records per step, over the step (with more ranks than cores, each core
# records for ranks / cores ranks), it is the share of the step that recording takes, steadier than
# the step times on a loaded machine.
rec=$(dirname "$bin")/bench/trace_record
ns=$([ -x "$rec" ] && "$rec" | awk '{print $2}')
cores=$(getconf _NPROCESSORS_ONLN)
cpu=$(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //')
echo "# tracing's cost on $(hostname): $cpu, $(getconf _NPROCESSORS_ONLN) cores (load average $(cut -d" " -f1-3 /proc/loadavg)), $ranks ranks, OMP_NUM_THREADS=$OMP_NUM_THREADS"
echo "# median step_ms over 20 steps; on / off - 1, and paired: the median of (traced step - the untraced one after it)"
echo "# over the untraced median; recording: events x ${ns:-?} ns an event (bench/trace_record) x ranks per core, over the step"
echo
echo "| layout | run | off ms | on ms | on / off | paired | events per rank and step | recording |"
echo "|---|---|---|---|---|---|---|---|"
even=$(seq -s, 6 2 44)
for lay in "${layouts[@]}"; do
  read -r -a sets <<< "$(layout_sets "$lay")" || exit 2
  for r in $(seq 1 "$runs"); do
    run "$lay-i$r" 45 "$even" "${sets[@]}" || exit 1
    python3 - "$lay" "$r" "$work/$lay-i$r.jsonl" "$work/traces-$lay-i$r/measured" "${ns:-0}" "$ranks" "$cores" <<'PY'
import glob, json, statistics, sys
lay, r, path, folder = sys.argv[1:5]
ns, ranks, cores = float(sys.argv[5]), int(sys.argv[6]), int(sys.argv[7])
rows = {x["step"]: x["step_ms"] for x in map(json.loads, open(path))}
on = [rows[s] for s in range(6, 45, 2)]
off = [rows[s + 1] for s in range(6, 45, 2)]
paired = statistics.median([a - b for a, b in zip(on, off)]) / statistics.median(off)
events = [len(json.load(open(p))["traceEvents"]) / 20 for p in glob.glob(folder + "/rank*.pt.trace.json")]
ev = statistics.mean(events)
rec = ev * ns * 1e-6 * max(1.0, ranks / cores) / statistics.median(off)
print("| %s | %s | %.2f | %.2f | %+.2f%% | %+.2f%% | %.0f | %s |" % (lay, r, statistics.median(off), statistics.median(on),
      100 * (statistics.median(on) / statistics.median(off) - 1), 100 * paired, ev,
      "%.2f%%" % (100 * rec) if ns > 0 else "?"))
PY
  done
  if [ "$separate" = 1 ]; then
    run "$lay-on" 25 6-25 "${sets[@]}" || exit 1
    run "$lay-off" 25 none "${sets[@]}" || exit 1
    python3 - "$lay" "$work/$lay-off.jsonl" "$work/$lay-on.jsonl" <<'PY'
import json, statistics, sys
lay, off, on = sys.argv[1:4]
med = lambda p: statistics.median([x["step_ms"] for x in map(json.loads, open(p)) if x["step"] >= 6])
a, b = med(off), med(on)
print("| %s | separate runs | %.2f | %.2f | %+.2f%% | | | |" % (lay, a, b, 100 * (b / a - 1)))
PY
  fi
done
