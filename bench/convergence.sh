#!/usr/bin/env bash
# The convergence study (docs/validation.md): does balanced packing change what the model learns?
# A small Llama trained on a real corpus - the Python standard library's sources of Debian's
# libpython3.X-minimal package, one document per file, byte-level tokens - with the same tokens and
# the same held-out documents under four packings:
#   plain4d      balance.packer fixed (Plain-4D: the stream cut into full windows, in order)
#   wlb          balance.packer wlb with the outlier queues (long documents delayed until a queue
#                holds one per micro-batch)
#   wlb-nodelay  wlb without queues (balance.outlier_thresholds: [])
#   wlb-cp2      wlb with the queues and hybrid CP over 2 ranks (mpirun -np 2, parallel.cp 2)
# and, asked for by VARIANTS (the first listed is the one the others are compared with), the
# partial sums' dtype (parallel.reduce_dtype) in bf16 training over TP 2 (mpirun -np 2, every
# layer's SP reduce-scatters and the embedding's and output layer's TP sums):
# (the vocabulary 258, one unused row, so that TP 2 divides it)
#   tp2-sum-fp32 train.precision bf16, parallel.tp 2, the partial sums in float32
#   tp2-sum-bf16 the same with parallel.reduce_dtype compute: the partial sums in bf16
# each with SEEDS seeds (the seed of the data order and of the weights). Every run evaluates the
# held-out 5% of the documents every EVAL_EVERY steps (its own packing rules), and its final
# checkpoint is evaluated once more by `wlbtrain eval` under one packing for all (Plain-4D's: the
# same pieces of the same documents). Prints the machine, the set-up, validation loss against
# tokens (mean and seed-to-seed spread), the final gap to Plain-4D in units of that spread, and
# the outlier queues' token delay; draws the curves (PLOT, default docs/convergence.png).
#
# Usage: bench/convergence.sh [cpu|gpu] [SEEDS]        (default: cpu, 3 seeds)
#   cpu  a 2-layer, d_model 64 model, window 1024, 90 steps of 8192 tokens (8 micro-batches) per
#        run, two runs at a time with one thread a rank: 839 CPU-s for the 12 runs, 709 s wall on a
#        2-core VM shared with other jobs (docs/validation.md). The window is 1024 rather than less so that the
#        documents (files of 39 bytes to 756 KB, median 8.5 KB) leave pieces of every length and the
#        outlier queues delay some of them (with 256, nearly every piece is a full window and a queue
#        fills within the step that read it: no delay to study)
#   gpu  train.device cuda, an 8-layer d_model 512 model, window 1024, 300 steps of 32768 tokens
#        (about 10M tokens, an epoch of the corpus); wlb-cp2's 2 ranks share the GPU (parallel.comm mpi)
# Environment: STEPS, EVAL_EVERY, EVAL_TOKENS override the mode's; VARIANTS the runs (default
# "plain4d wlb wlb-nodelay wlb-cp2"); JOBS=N runs N runs at once, each
# with one OpenMP thread a rank (default: 2 on cpu; 1 on gpu, one run after another); WLBTRAIN a
# binary (default: ./wlbtrain, built here: make CUDA=0 for cpu); OUT=DIR keeps the runs (default a
# temporary folder); PLOT=FILE.
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-cpu}
seeds=${2:-3}
case "$mode" in
  cpu)
    model="n_layers: 2, d_model: 64, n_heads: 4, n_kv_heads: 2, d_ffn: 192"
    window=1024 batch=8192 steps=${STEPS:-90} every=${EVAL_EVERY:-10} eval_tokens=${EVAL_TOKENS:-16384}
    device="device: cpu" lr=3.0e-3 warmup=10 threads=2 jobs=${JOBS:-2}
    [ -n "${WLBTRAIN:-}" ] || make -s CUDA=0 >/dev/null ;;
  gpu)
    model="n_layers: 8, d_model: 512, n_heads: 8, n_kv_heads: 4, d_ffn: 1536"
    window=1024 batch=32768 steps=${STEPS:-300} every=${EVAL_EVERY:-25} eval_tokens=${EVAL_TOKENS:-131072}
    device="device: cuda" lr=1.0e-3 warmup=30 threads=4 jobs=${JOBS:-1}
    [ -n "${WLBTRAIN:-}" ] || make -s >/dev/null ;;
  *) echo "wlbtrain: error: bench/convergence.sh: mode '$mode': expected cpu or gpu" >&2; exit 2 ;;
esac
bin=${WLBTRAIN:-./wlbtrain}
py=/usr/bin/python3
[ -x "$py" ] || { echo "wlbtrain: error: bench/convergence.sh: no /usr/bin/python3 (Debian's python3)" >&2; exit 2; }
stdlib=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["stdlib"])')
package=$(dpkg -S "$stdlib/os.py" 2>/dev/null | cut -d: -f1 || true)
[ -n "$package" ] || { echo "wlbtrain: error: bench/convergence.sh: $stdlib/os.py belongs to no Debian package" >&2; exit 2; }
out=${OUT:-$(mktemp -d)}
mkdir -p "$out"
[ -n "${OUT:-}" ] || trap 'rm -rf "$out"' EXIT
plot=${PLOT:-docs/convergence.png}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1

# The corpus: every non-empty .py file of the standard library, in a fixed order.
find "$stdlib" -name '*.py' -type f -size +0c | LC_ALL=C sort >"$out/files.txt"
"$bin" convert --quiet --out "$out/pystd" --files-from "$out/files.txt" >"$out/convert.txt"

cat >"$out/study.yaml" <<EOF
model: {$model, vocab_size: 257, rope_theta: 10000, norm_eps: 1.0e-5, tie_embeddings: false, max_seq_len: $window}
parallel: {tp: 1, cp: 1, pp: 1, dp: 1, comm: mpi}
data: {path: $out/pystd, context_window: $window, global_batch_tokens: $batch, valid_fraction: 0.05}
balance: {packer: wlb, cp_sharding: hybrid, hardware: $([ "$mode" = cpu ] && echo cpu || echo h100)}
train: {$device, steps: $steps, lr: $lr, warmup_steps: $warmup, weight_decay: 0.1, eval_every: $every, eval_tokens: $eval_tokens}
log: {every: 1000000}
EOF

variant_sets() { # the --set arguments of a variant
  case "$1" in
    plain4d) echo "--set balance.packer=fixed --set balance.cp_sharding=per_seq" ;;
    wlb) echo "" ;;
    wlb-nodelay) echo "--set balance.outlier_thresholds=[]" ;;
    wlb-cp2) echo "--set parallel.cp=2" ;;
    tp2-sum-fp32) echo "--set parallel.tp=2 --set model.vocab_size=258 --set train.precision=bf16 --set parallel.reduce_dtype=fp32" ;;
    tp2-sum-bf16) echo "--set parallel.tp=2 --set model.vocab_size=258 --set train.precision=bf16 --set parallel.reduce_dtype=compute" ;;
    *) echo "wlbtrain: error: bench/convergence.sh: no variant '$1'" >&2; exit 2 ;;
  esac
}

one_run() { # VARIANT SEED: the run, then its final weights under one packing for every variant
  local v=$1 seed=$2 name=$1-$2 launch=() omp=$threads
  if [ "$v" = wlb-cp2 ] || [ "${v#tp2-}" != "$v" ]; then launch=(mpirun -np 2 --bind-to none -x OMP_NUM_THREADS=1) omp=1; fi
  # shellcheck disable=SC2046
  OMP_NUM_THREADS=$omp "${launch[@]}" "$bin" --config "$out/study.yaml" $(variant_sets "$v") \
    --set "data.seed=$seed" --set "train.seed=$seed" --set "checkpoint.dir=$out/ck-$name" \
    --set "log.metrics=$out/$name.jsonl" >"$out/$name.log"
  # Plain-4D's pieces of the held-out documents, the same for all.
  OMP_NUM_THREADS=$threads "$bin" eval --checkpoint "$out/ck-$name" --set balance.packer=fixed \
    --set balance.cp_sharding=per_seq --out "$out/$name.common.json" >"$out/$name.eval.log"
  echo "convergence: $name done ($(( $(date +%s) - t0 )) s)" >&2
}

variants=${VARIANTS:-plain4d wlb wlb-nodelay wlb-cp2}
# Every name checked before anything runs (variant_sets runs in a command substitution below, where
# its exit would not stop the script).
for v in $variants; do variant_sets "$v" >/dev/null; done
if [ "$jobs" -gt 1 ]; then threads=1; fi
t0=$(date +%s)
cpu0=$(awk '{print $14 + $15 + $16 + $17}' /proc/$$/stat)
failed=0
for seed in $(seq 1 "$seeds"); do
  for v in $variants; do
    while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n || failed=1; done
    one_run "$v" "$seed" &
  done
done
while [ "$(jobs -rp | wc -l)" -gt 0 ]; do wait -n || failed=1; done
[ "$failed" = 0 ] || { echo "wlbtrain: error: bench/convergence.sh: a run failed (logs in $out)" >&2; exit 1; }
wall=$(( $(date +%s) - t0 ))
cpu=$(awk -v hz="$(getconf CLK_TCK)" -v c0="$cpu0" '{printf "%.0f", ($14 + $15 + $16 + $17 - c0) / hz}' /proc/$$/stat)

echo "# convergence study: $variants (the first the baseline), the same tokens, $seeds seeds ($mode)"
echo "machine: $(uname -n), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores," \
     "load average $(cut -d' ' -f1-3 /proc/loadavg) at the end; $(date -u +%Y-%m-%d); wlbtrain $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
echo "corpus: $stdlib/**/*.py of Debian's $package ($(dpkg-query -W -f='${Version}' "${package%%:*}" 2>/dev/null || echo '?')): $(sed 's/^convert: //' "$out/convert.txt")"
echo "run: $wall s wall, $cpu CPU-s for the $((seeds * 4)) runs and their evaluations ($jobs at a time, $threads OpenMP thread(s) a rank)"
WLB_PYTHON=${WLB_PYTHON:-$(scripts/test-python.sh)}
"$WLB_PYTHON" bench/convergence_report.py "$out" "$plot" "$seeds" "$variants" "$out/study.yaml"
