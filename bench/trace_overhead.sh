#!/usr/bin/env bash
# bench/trace_overhead.sh - what tracing (trace.steps, docs/timelines.md) costs a training step: the
# median step time over 20 steps with tracing on against 20 with it off, on CPU ranks under mpirun.
#
# Two measurements per layout:
#   interleaved  one run of 45 steps tracing the even steps 6-44 (20 steps) and not the odd ones 7-45
#                (20 steps): the machine's drift (other processes, frequency) hits both alike;
#   separate     two runs of 25 steps, one tracing steps 6-25 and one tracing nothing, steps 6-25 of
#                each (RUNS pairs, alternating; the medians over all their steps).
# A step's time is log.metrics' step_ms (its evaluation and checkpoint not in it); a traced step's
# includes everything tracing adds to it (the recording, the gather of the ranks' own figures); the
# file is written after the traced steps. The model and data are the tests' tiny ones unless CONFIG
# names another (its data.path is used as it is). Prints a table that names the machine.
# Usage: bash bench/trace_overhead.sh      env: WLBTRAIN (default build/release-nocuda/wlbtrain),
#   RANKS (4), LAYOUTS ("tp2pp2 cp2dp2 pp4v2"), RUNS (2), CONFIG (a YAML file; its parallel keys are
#   overridden by the layout)
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
bin=${WLBTRAIN:-build/release-nocuda/wlbtrain}
[ -x "$bin" ] || { echo "trace_overhead: $bin missing: run make CUDA=0 first" >&2; exit 2; }
ranks=${RANKS:-4} runs=${RUNS:-2}
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

cpu=$(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //')
echo "# tracing's cost on $(hostname): $cpu, $(getconf _NPROCESSORS_ONLN) cores (load average $(cut -d" " -f1-3 /proc/loadavg)), $ranks ranks, OMP_NUM_THREADS=$OMP_NUM_THREADS"
echo "# median step_ms over 20 steps; overhead = on / off - 1"
echo
echo "| layout | measurement | off ms | on ms | overhead | events per rank and step |"
echo "|---|---|---|---|---|---|"
even=$(seq -s, 6 2 44)
for lay in "${layouts[@]}"; do
  read -r -a sets <<< "$(layout_sets "$lay")" || exit 2
  run "$lay-i" 45 "$even" "${sets[@]}" || exit 1
  offs=() ons=()
  for r in $(seq 1 "$runs"); do
    run "$lay-on$r" 25 6-25 "${sets[@]}" || exit 1
    run "$lay-off$r" 25 none "${sets[@]}" || exit 1
    offs+=("$work/$lay-off$r.jsonl") ons+=("$work/$lay-on$r.jsonl")
  done
  python3 - "$lay" "$work/$lay-i.jsonl" "$work/traces-$lay-i/measured" "${#offs[@]}" "${offs[@]}" "${ons[@]}" <<'PY'
import glob, json, statistics, sys
lay, inter, folder, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
offs, ons = sys.argv[5:5 + n], sys.argv[5 + n:]
def rows(path):
    return [json.loads(l) for l in open(path)]
def median(xs):
    return statistics.median(xs)
events = []
for p in glob.glob(folder + "/rank*.pt.trace.json"):
    events.append(len(json.load(open(p))["traceEvents"]) / 20)
ev = "%.0f" % statistics.mean(events) if events else "?"
r = rows(inter)
on = median([x["step_ms"] for x in r if x["step"] % 2 == 0 and 6 <= x["step"] <= 44])
off = median([x["step_ms"] for x in r if x["step"] % 2 == 1 and 7 <= x["step"] <= 45])
print("| %s | interleaved (one run) | %.2f | %.2f | %+.2f%% | %s |" % (lay, off, on, 100 * (on / off - 1), ev))
off = median([x["step_ms"] for p in offs for x in rows(p) if x["step"] >= 6])
on = median([x["step_ms"] for p in ons for x in rows(p) if x["step"] >= 6])
print("| %s | separate runs (%d pairs) | %.2f | %.2f | %+.2f%% | |" % (lay, n, off, on, 100 * (on / off - 1)))
PY
done
