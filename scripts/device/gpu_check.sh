#!/usr/bin/env bash
# On the GPU machine (device tool), from the repository root, with build/device, .ompi, .devlibs and
# .devdata carried (scripts/device/prepare.sh makes them; build/device holds wlbtrain, the test
# programs below with the dump_train they drive, and bench/attn_kernels). Parts, named on the
# command line (default: lease), run in the order given:
#   bash scripts/device/gpu_check.sh lease      what one device lease holds, most telling first: NCCL
#                                               between ranks on the GPU (nccl's first three steps), the
#                                               tests but test_parallel (test_ops with its cuDNN
#                                               test), attention at 8K and 32K (head size 64, the
#                                               own kernels and cuDNN's: not yet timed with cuDNN),
#                                               the bench's short table, then test_parallel;
#                                               then scripts/device/targets.py's table
#   bash scripts/device/gpu_check.sh nccl       NCCL between ranks that share the one GPU (the test
#                                               mode WLB_TEST_NCCL_SHARED_GPU=1: a host id per rank,
#                                               sockets on the loopback): test_parallel's 2-rank
#                                               layouts, then pp 3-4 with tied embeddings and
#                                               interleaving, overlap on and off the same bits, the
#                                               fault order, then the rest of the suite (16 ranks last)
#   bash scripts/device/gpu_check.sh tests      1-5 below  (about 4 minutes with one model in
#                                               test_cuda_model; not yet timed with two)
#   bash scripts/device/gpu_check.sh sanitize   compute-sanitizer, see below   (about 5 minutes)
#   bash scripts/device/gpu_check.sh attention  bench/attention_kernels.sh, head sizes 64 and 128
#                                               (about 3 minutes at 64 alone; not yet timed with 128
#                                               nor with the cuDNN rows)
#   bash scripts/device/gpu_check.sh cudnn      cuDNN's attention: test_ops (its cuDNN test against
#                                               the fp32 reference and the own kernels), training
#                                               with it (test_cuda_model's test_cudnn_attention: one
#                                               rank and 2 CP ranks), then
#                                               bench/attention_kernels.sh 8192 at head sizes 64 and
#                                               128 (not yet timed)
#   bash scripts/device/gpu_check.sh bench      bench/gpu_throughput.sh        (about 8 minutes)
#   bash scripts/device/gpu_check.sh profile    scripts/device/profile.sh 8192 2
#   bash scripts/device/gpu_check.sh profile_attention  scripts/device/profile_attention.sh 32768:
#                                               the attention kernels' counters beside FA2's
#   bash scripts/device/gpu_check.sh calibration  bench/planner_calibration.sh on cuda, and the
#                                               calibrated profile kept in $OUT (about 8 minutes)
# A lease is 15 minutes of device time, the machine's start (a minute or more) included, and one
# call runs at most 10: so one call with lease, timeout_s 600, is what a lease holds. The run keeps
# to a deadline, GPU_CHECK_SECONDS (default 560) from its start: each step runs under timeout(1)
# with the time left, a step that would start with under GPU_CHECK_MIN_STEP seconds left (30) is
# skipped, and the summary says which steps timed out or were skipped. What comes back in $OUT (the
# device tool returns at most 8 files a call): summary.txt (the GPU, the version, a line per step)
# and logs.tar.gz (every step's log), both rewritten after each step, so that a run cut short still
# returns what it did; calibration adds the profile it writes.
# tests:
#   1. test_ops          every op against the CPU backend (fp32 against fp32, bf16 against the CPU's
#                        bf16 emulation), the GPU's reductions twice for the same bits (attention
#                        on the tensor cores and on the fp32 reference), products of 700 token
#                        counts, and the tensor-core attention against the fp32 reference at its
#                        tile edges
#   2. test_cuda_model   two tiny models (head size 16: the fp32 reference attention; 64: the
#                        tensor cores in bf16): loss and gradients against the CPU (fp32, bf16);
#                        recompute modes; two runs and a resumed run bit for bit; 50 steps
#   3. test_parallel     the 4D equivalence suite on the GPU (WLB_TEST_DEVICE=cuda): several ranks on
#                        the one GPU, messages staged through the host (parallel.comm: mpi)
#   4. the NCCL path     mpirun -np 1 with parallel.comm: nccl
#   5. test_export.py    the export loaded by the machine's transformers
# sanitize: compute-sanitizer over test_ops (WLB_TEST_SMALL=1: the same cases without the longest
#   windows) and test_cuda_model (WLB_TEST_SMALL=1: without its 50-step curves): memcheck with the
#   leak check, racecheck and initcheck on the project's kernels (k_*); any finding fails the step
#   (exit 99). NCCL's probing of kernel images at communicator start reports API errors that are
#   not ours: memcheck runs with --report-api-errors no (every CUDA call of the project is checked
#   by CUDA_CHECK anyway).
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
deadline=$((SECONDS + ${GPU_CHECK_SECONDS:-560}))
out=${OUT:-/tmp/gpu_check}
logs=$(mktemp -d)
mkdir -p "$out"
# Runtime libraries: Open MPI, the Debian ones, NCCL and cuBLAS from the machine's own CUDA/PyTorch.
# shellcheck source=/dev/null
source .ompi/env.sh
if [ ! -d .devlibs/root ]; then for f in .devlibs/*.deb; do dpkg-deb -x "$f" .devlibs/root; done; fi
nccl=$(python3 -c 'import nvidia.nccl as m; print(m.__path__[0])' 2>/dev/null)/lib
# cuDNN (train.attention: cudnn, opened at run time): the image's pip nvidia-cudnn-cu13, never carried
cudnn=$(python3 -c 'import nvidia.cudnn as m; print(list(m.__path__)[0])' 2>/dev/null)/lib
export LD_LIBRARY_PATH=$PWD/.devlibs/root/usr/lib/x86_64-linux-gnu:${nccl}:${cudnn}:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
bin=$PWD/build/device
[ -x "$bin/wlbtrain" ] || { echo "gpu_check: $bin/wlbtrain missing: run scripts/device/prepare.sh and carry build/device" >&2; exit 2; }
export WLBTRAIN=$bin/wlbtrain WLB_TEST_BIN_DIR=$bin/test WLB_BENCH_BIN=$bin/bench
export OMPI_MCA_rmaps_base_oversubscribe=1 OMP_NUM_THREADS=4
export PYTHONUNBUFFERED=1
{ nvidia-smi -L; "$WLBTRAIN" --version; } 2>&1 | tee "$logs/gpu.txt"
summary=()
report() { # summary.txt and logs.tar.gz in $OUT, as they stand
  { cat "$logs/gpu.txt"; printf '%s\n' "${summary[@]}"; } > "$out/summary.txt"
  tar czf "$out/logs.tar.gz" -C "$logs" . 2>/dev/null
}
step() { # name, command...: run under the time left, log in $logs/NAME.log
  local name=$1; shift
  local left=$((deadline - SECONDS)) t0=$SECONDS rc
  if [ "$left" -lt "${GPU_CHECK_MIN_STEP:-30}" ]; then
    summary+=("$(printf '%-18s skipped: %ds left of GPU_CHECK_SECONDS' "$name" "$left")")
    report
    return
  fi
  timeout -k 10 "$left" "$@" >"$logs/$name.log" 2>&1
  rc=$?
  local note=""
  [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ] && note="  timed out at the deadline"
  summary+=("$(printf '%-18s exit %3d  %4ds  %s%s' "$name" "$rc" $((SECONDS - t0)) \
    "$(grep -c '^ok' "$logs/$name.log") ok, $(grep -c '^not ok' "$logs/$name.log") not ok" "$note")")
  grep -E '^# ' "$logs/$name.log" | tail -40
  report
}
nccl_one_rank() { # mpirun -np 1 with parallel.comm: nccl, 5 steps of the tiny model
  cat > /tmp/nccl.yaml <<'YAML'
model: {preset: tiny}
parallel: {tp: 1, cp: 1, pp: 1, dp: 1, comm: nccl}
data: {path: /tmp/nccl_docs, context_window: 512, global_batch_tokens: 4096}
train: {device: cuda, steps: 5, lr: 0.002, warmup_steps: 1}
YAML
  python3 bench/make_corpus.py --out /tmp/nccl_docs --docs 2000 --vocab 512 >/dev/null 2>&1
  mpirun -np 1 "$WLBTRAIN" --config /tmp/nccl.yaml
}
export -f nccl_one_rank  # step runs it under timeout(1), in a child bash
# test_parallel over NCCL, the ranks of every layout on the one GPU (WLB_TEST_NCCL_SHARED_GPU=1; the
# suite's config leaves parallel.comm at auto). A step per filter: the 2-rank layouts first.
nccl_parallel() { # step name, test filter
  WLB_TEST_DEVICE=cuda WLB_TEST_NCCL_SHARED_GPU=1 WLB_TEST_FILTER=$2 step "$1" "$bin/test/test_parallel"
}
nccl_part() {
  nccl_parallel nccl_2_ranks 'test_??2'
  nccl_parallel nccl_pipelines test_deep_pipelines
  nccl_parallel nccl_overlap test_overlap
  nccl_parallel nccl_fault_order test_fault_order
  nccl_parallel nccl_rest '*'
}
export CMOCKA_MESSAGE_OUTPUT=TAP
parts=("$@")
[ ${#parts[@]} -gt 0 ] || parts=(lease)
for part in "${parts[@]}"; do
  case $part in
  nccl) nccl_part ;;
  lease)
    nccl_parallel nccl_2_ranks 'test_??2'
    nccl_parallel nccl_pipelines test_deep_pipelines
    nccl_parallel nccl_overlap test_overlap
    step ops "$bin/test/test_ops"
    step cuda_model "$bin/test/test_cuda_model"
    step nccl_one_rank bash -c nccl_one_rank
    WLB_HF_PYTHON=python3 step export python3 test/test_export.py
    DIMS=64 step attention bash bench/attention_kernels.sh 8192 32768
    grep -E '^(##|\||$)' "$logs/attention.log"
    SHORT=1 step bench bash bench/gpu_throughput.sh 6
    grep -E '^\|' "$logs/bench.log"
    WLB_TEST_DEVICE=cuda step parallel_gpu "$bin/test/test_parallel"
    python3 scripts/device/targets.py "$out"  # step has written $out after the last step
    ;;
  cudnn)
    step ops "$bin/test/test_ops"
    grep -E '^(# skip|not ok)' "$logs/ops.log" | head -20
    WLB_TEST_FILTER=test_cudnn_attention step cuda_model_cudnn "$bin/test/test_cuda_model"
    grep -E '^(# |not ok)' "$logs/cuda_model_cudnn.log" | head -20
    DIMS="64 128" step attention bash bench/attention_kernels.sh 8192
    grep -E '^(##|\||$)' "$logs/attention.log"
    ;;
  tests)
    step ops "$bin/test/test_ops"
    step cuda_model "$bin/test/test_cuda_model"
    WLB_TEST_DEVICE=cuda step parallel_gpu "$bin/test/test_parallel"
    step nccl_one_rank bash -c nccl_one_rank
    WLB_HF_PYTHON=python3 step export python3 test/test_export.py
    ;;
  sanitize)
    san=(compute-sanitizer --error-exitcode 99 --print-limit 20)
    k=(--kernel-name regex:k_)
    export WLB_TEST_SMALL=1
    step memcheck_ops "${san[@]}" --tool memcheck --leak-check full "$bin/test/test_ops"
    step racecheck_ops "${san[@]}" --tool racecheck "${k[@]}" "$bin/test/test_ops"
    step initcheck_ops "${san[@]}" --tool initcheck "${k[@]}" "$bin/test/test_ops"
    step memcheck_model "${san[@]}" --tool memcheck --leak-check full --report-api-errors no \
      "$bin/test/test_cuda_model"
    unset WLB_TEST_SMALL
    ;;
  attention) step attention bash bench/attention_kernels.sh; grep -E '^(##|\||$)' "$logs/attention.log" ;;
  bench) step bench bash bench/gpu_throughput.sh; grep -E '^\|' "$logs/bench.log" ;;
  profile) OUT=$logs step profile bash scripts/device/profile.sh 8192 2; cat "$logs/profile.log" 2>/dev/null ;;
  profile_attention)
    OUT=$logs step profile_attention bash scripts/device/profile_attention.sh 32768
    cat "$logs/profile_attention.log" 2>/dev/null ;;
  calibration)
    # The H100 profile to keep in the repository (config/profiles/), then the bench.
    python3 bench/make_corpus.py --out /tmp/cal_docs --docs 2000 --vocab 128256 >/dev/null 2>&1
    printf 'model: {preset: llama3.2-1b, n_layers: 4}\nparallel: {dp: 1}\ndata: {path: /tmp/cal_docs, context_window: 65536, global_batch_tokens: 262144}\ntrain: {device: cuda, precision: bf16}\n' > /tmp/cal.yaml
    step calibrate "$WLBTRAIN" calibrate --config /tmp/cal.yaml --out "$out/h100-llama3.2-1b.json"
    DEVICE=cuda WLBTRAIN=$WLBTRAIN step calibration bash bench/planner_calibration.sh
    grep -E '^(#|\||device)' "$logs/calibration.log" ;;
  *) echo "gpu_check: unknown part '$part' (nccl, lease, tests, sanitize, attention, cudnn, bench, profile, profile_attention, calibration)" >&2; exit 2 ;;
  esac
done
report
printf '%s\n' "${summary[@]}"
rm -rf "$logs"
