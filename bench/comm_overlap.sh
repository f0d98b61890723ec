#!/usr/bin/env bash
# bench/comm_overlap.sh - how much of the communication parallel.overlap hides, on the CPU backend
# with every rank on this machine (mpirun --oversubscribe) and a link model that makes communication
# cost time (WLB_COMM_LINK=LATENCY_US,GBPS, engine/comm/comm.h: every collective and message takes
# at least latency + its bytes on the wire / bandwidth). For a DP layout (dp 4) and a TP x DP layout
# (tp 2 x dp 2, sequence parallelism on) on 4 ranks and a Llama of LAYERS layers, three step times:
#   T_free  no link model (MPI over shared memory: nearly free), the faster of overlap off and on (on
#           an oversubscribed machine even shared memory costs the waits for a peer to be scheduled,
#           which overlap hides too)
#   T_off   the link model, parallel.overlap: false and parallel.tp_chunks: 1 (every collective where
#           it is issued, one exchange per TP product: the engine that overlaps nothing)
#   T_on    the link model, parallel.overlap: true and parallel.tp_chunks: TP_CHUNKS (default auto, the
#           config's default: TP's products and their exchanges in pieces)
# and the exposed fraction (T_on - T_free) / (T_off - T_free): the share of the communication's cost
# that overlap leaves on the step (0: all hidden, 1: none). Each time is the median of the steps
# after the first of ROUNDS runs (STEPS steps each), the three settings run in turn.
# The link is set from this machine's speed: its bandwidth makes the DP layout's gradient all-reduce
# (every parameter in float32, over a ring of 4) take SHARE (default 0.5) of the DP layout's T_free,
# less than the backward it can hide behind (about two thirds of a step). A fixed link would not
# measure the same thing on a faster or slower machine: with more communication than backward, no
# schedule hides more than the backward's worth, and the exposed fraction rises towards
# 1 - backward / communication whatever the engine does. LINK=LATENCY_US,GBPS fixes it instead.
# Prints the machine and its load: on a shared machine the times move with what else runs.
# Usage: bash bench/comm_overlap.sh            env: LAYERS (8) STEPS (6) ROUNDS (5) TP_CHUNKS (auto) SHARE (0.5)
#   LATENCY_US (100) LINK (the WLB_COMM_LINK; default: LATENCY_US and the bandwidth set from SHARE) WLBTRAIN (default ./wlbtrain) DATA (a token prefix; default data/demo/libc_headers,
#   made by `make demo` when absent)
set -euo pipefail
cd "$(dirname "$0")/.."
layers=${LAYERS:-8} steps=${STEPS:-6} rounds=${ROUNDS:-5} share=${SHARE:-0.5} latency=${LATENCY_US:-100}
cores=$(nproc)
bin=${WLBTRAIN:-./wlbtrain}
data=${DATA:-data/demo/libc_headers}
[ -x "$bin" ] || { echo "comm_overlap: $bin missing: run make first" >&2; exit 2; }
[ -f "$data.idx" ] || scripts/make-demo-corpus.sh >/dev/null
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export OMP_NUM_THREADS=1 OMPI_MCA_rmaps_base_oversubscribe=1
[ "$(id -u)" -ne 0 ] || export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
cat > "$work/bench.yaml" <<EOF
model: {n_layers: $layers, d_model: 128, n_heads: 4, n_kv_heads: 4, d_ffn: 384, vocab_size: 512,
        rope_theta: 10000, norm_eps: 1.0e-5, tie_embeddings: false, max_seq_len: 256}
parallel: {tp: 1, cp: 1, pp: 1, dp: 4}
data: {path: $data, context_window: 256, global_batch_tokens: 1024}
balance: {hardware: cpu, packer: fixed}
train: {device: cpu, steps: $steps, lr: 0.001, warmup_steps: 1}
log: {every: 1}
EOF
# The step times (ms) of one run after its first, appended to file $4: layout flags, overlap, link
# ("" = none).
step_times() {
  local flags=$1 overlap=$2 lnk=$3 into=$4 out=$work/run.log
  local chunks="--set parallel.tp_chunks=${TP_CHUNKS:-auto}"
  [ "$overlap" = true ] || chunks="--set parallel.tp_chunks=1"
  # shellcheck disable=SC2086
  if ! WLB_COMM_LINK=$lnk mpirun --bind-to none -np 4 "$bin" --config "$work/bench.yaml" $flags $chunks \
       --set parallel.overlap="$overlap" > "$out" 2>&1; then
    echo "comm_overlap: run failed ($flags, overlap $overlap, link '$lnk'):" >&2
    tail -5 "$out" >&2
    exit 1
  fi
  grep -o '[0-9.]* ms  (' "$out" | awk 'NR > 1 {print $1}' >> "$into"
}
median() {
  sort -n "$1" | awk '{v[NR] = $1} END {if (NR == 0) {print "nan"} else if (NR % 2) {print v[(NR + 1) / 2]} else {print (v[NR / 2] + v[NR / 2 + 1]) / 2}}'
}
# The link: LINK, or LATENCY_US and the bandwidth at which the DP layout's all-reduce of its P
# float32 gradients (2 (n - 1) / n of their bytes on each rank's wire, n = 4) takes SHARE of its
# T_free, measured here (overlap off).
if [ -n "${LINK:-}" ]; then
  link=$LINK how="as given"
else
  # The faster median of two runs: a run slowed by the machine's other load would set a link slower
  # than the backward it should hide behind.
  for i in 1 2; do
    : > "$work/cal$i"
    step_times "--set parallel.dp=4 --set parallel.tp=1" false "" "$work/cal$i"
  done
  cal=$(printf '%s\n%s\n' "$(median "$work/cal1")" "$(median "$work/cal2")" | sort -n | head -1)
  link=$(awk -v ms="$cal" -v share="$share" -v lat="$latency" -v l="$layers" 'BEGIN {
    d = 128; f = 384; v = 512
    p = l * (4 * d * d + 3 * d * f + 2 * d) + 2 * v * d + d
    printf "%s,%.4f", lat, 2 * 3 / 4 * 4 * p / (share * ms / 1e3) / 1e9 }')
  how="the bandwidth at which the DP all-reduce takes $share of the DP layout's T_free, $cal ms"
fi
echo "# communication overlap on the CPU backend: 4 ranks (mpirun --oversubscribe, OMP_NUM_THREADS=1), Llama of" \
     "$layers layers, d_model 128, d_ffn 384, vocabulary 512; 1024 tokens a step (one micro-batch per DP replica) in windows of 256;" \
     "link model WLB_COMM_LINK=$link (latency us, GB/s; $how); median of steps 2..$steps of $rounds runs each"
echo "# machine: $(uname -n), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $cores cores," \
     "$(awk '/MemTotal/ {printf "%.0f GB", $2 / 1048576}' /proc/meminfo); load before: $(cut -d' ' -f1-3 /proc/loadavg);" \
     "$(date -u '+%Y-%m-%d %H:%M UTC'); wlbtrain $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
echo
echo "| layout | T_free (ms): off, on | T_off (ms) | T_on (ms) | exposed fraction |"
echo "|---|---|---|---|---|"
for layout in "dp 4" "tp 2 x dp 2"; do
  case $layout in
    "dp 4") flags="--set parallel.dp=4 --set parallel.tp=1" ;;
    *) flags="--set parallel.dp=2 --set parallel.tp=2" ;;
  esac
  : > "$work/free"; : > "$work/free_on"; : > "$work/off"; : > "$work/on"
  # The three settings in turn, ROUNDS times: a load that drifts over the minutes of a run weighs on
  # all three alike.
  for _ in $(seq "$rounds"); do
    step_times "$flags" false "" "$work/free"
    step_times "$flags" true "" "$work/free_on"
    step_times "$flags" false "$link" "$work/off"
    step_times "$flags" true "$link" "$work/on"
  done
  free_off=$(median "$work/free") free_on=$(median "$work/free_on") off=$(median "$work/off") on=$(median "$work/on")
  free=$(awk -v a="$free_off" -v b="$free_on" 'BEGIN {print (a < b ? a : b)}')
  frac=$(awk -v f="$free" -v a="$off" -v b="$on" 'BEGIN {if (a - f > 0) printf "%.2f", (b - f) / (a - f); else print "-"}')
  echo "| $layout | $free_off, $free_on | $off | $on | $frac |"
done
echo
echo "# load after: $(cut -d' ' -f1-3 /proc/loadavg)"
