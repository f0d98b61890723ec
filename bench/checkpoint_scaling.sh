#!/usr/bin/env bash
# Save and resume time of a sharded checkpoint against the number of ranks, at a fixed model size
# (CPU backend, every rank on this machine: mpirun --oversubscribe). Two series: DP with ZeRO-1 (dpcp 0
# writes the weights, every rank its moment shard) and TP x PP (every rank writes its blocks). Each
# point: one training step and its checkpoint (the "checkpoint: ... (S s)" line: all ranks' shards
# written and fsynced, index, state, rename), then a resume on the same layout (the "resume: ...
# (...; S s)" line: every rank reads its own shards; the files are in the page cache by then).
# Usage: bench/checkpoint_scaling.sh [LAYERS] [RANKS...]      (default 8 layers; 1 2 4 8 ranks)
# Environment: WLBTRAIN (default ./wlbtrain), DATA (a token prefix; default data/demo/libc_headers,
# made by `make demo` when absent).
set -euo pipefail
cd "$(dirname "$0")/.."
layers=${1:-8}
shift || true
ranks=${*:-1 2 4 8}
bin=${WLBTRAIN:-./wlbtrain}
data=${DATA:-data/demo/libc_headers}
[ -x "$bin" ] || make -s >/dev/null
[ -f "$data.idx" ] || make -s demo >/dev/null
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
export OMP_NUM_THREADS=1 OMPI_MCA_rmaps_base_oversubscribe=1
cat > "$out/bench.yaml" <<EOF
model: {n_layers: $layers, d_model: 512, n_heads: 8, n_kv_heads: 8, d_ffn: 1536, vocab_size: 16384,
        rope_theta: 10000, norm_eps: 1.0e-5, tie_embeddings: false, max_seq_len: 256}
parallel: {tp: 1, cp: 1, pp: 1, dp: 1}
data: {path: $data, context_window: 128, global_batch_tokens: 1024}
balance: {hardware: cpu}
train: {device: cpu, steps: 1, lr: 0.001, warmup_steps: 1}
checkpoint: {keep: 1}
log: {every: 1}
EOF
params=$(( 2 * 16384 * 512 + layers * (2 * 512 + 4 * 512 * 512 + 3 * 512 * 1536) + 512 ))
echo "# sharded checkpoints: save and resume time against ranks; $layers layers, d_model 512, d_ffn 1536," \
     "vocabulary 16384: $params parameters ($(( params * 12 / 1000000 )) MB of weights + AdamW moments)"
echo "machine: $(uname -n), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores," \
     "$(awk '/MemTotal/ {printf "%.0f GB", $2 / 1048576}' /proc/meminfo); $(date -u +%Y-%m-%d);" \
     "wlbtrain $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
echo
echo "| layout | ranks | files | largest file (MB) | all files (MB) | save (s) | resume (s) |"
echo "|---|---|---|---|---|---|---|"
layout() { # series, ranks -> --set flags
  local s=$1 n=$2
  if [ "$s" = dp ]; then
    echo "--set parallel.dp=$n --set parallel.zero=$([ "$n" -gt 1 ] && echo 1 || echo 0)"
  else
    case $n in 1) echo "";; 2) echo "--set parallel.tp=2";; 4) echo "--set parallel.tp=2 --set parallel.pp=2";;
               8) echo "--set parallel.tp=4 --set parallel.pp=2";; *) echo "bench: no tp x pp layout for $n" >&2; exit 2;; esac
  fi
}
for series in dp tppp; do
  for n in $ranks; do
    [ "$series" = tppp ] && [ "$n" -eq 1 ] && continue # the same run as dp 1
    ck="$out/ck-$series-$n"
    # shellcheck disable=SC2046
    mpirun -np "$n" "$bin" --config "$out/bench.yaml" $(layout "$series" "$n") --set "checkpoint.dir=$ck" \
      --set "log.metrics=$out/m.jsonl" > "$out/save.txt" 2>&1 || { cat "$out/save.txt"; exit 1; }
    save=$(sed -n 's/^checkpoint: .* (\([0-9.]*\) s)$/\1/p' "$out/save.txt")
    # shellcheck disable=SC2046
    mpirun -np "$n" "$bin" --config "$out/bench.yaml" $(layout "$series" "$n") --set "checkpoint.dir=$ck" \
      --set checkpoint.resume=auto --set "log.metrics=$out/m.jsonl" > "$out/load.txt" 2>&1 || { cat "$out/load.txt"; exit 1; }
    load=$(sed -n 's/^resume: .*; \([0-9.]*\) s).*$/\1/p' "$out/load.txt")
    step="$ck/step-00000001"
    files=$(ls "$step"/shard-*.bin | wc -l)
    big=$(ls -l "$step"/shard-*.bin | awk '{ if ($5 > m) m = $5 } END { printf "%.0f", m / 1e6 }')
    all=$(du -sb "$step" | awk '{ printf "%.0f", $1 / 1e6 }')
    name=$([ "$series" = dp ] && echo "dp $n$([ "$n" -gt 1 ] && echo ", ZeRO-1")" || \
           echo "$(layout tppp "$n" | sed 's/--set parallel\.//g; s/=/ /g; s/ tp/tp/; s/ pp/, pp/')")
    echo "| $name | $n | $files | $big | $all | $save | $load |"
    rm -rf "$ck"
  done
done
