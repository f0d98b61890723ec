#!/usr/bin/env bash
# On the GPU machine (device tool), from the repository root, with build/release, .ompi, .devlibs and
# .devdata carried (scripts/device/prepare.sh makes them). Runs, in this order, and prints a summary:
#   1. test_cuda_ops     every op against the CPU backend
#   2. test_cuda_model   a tiny model's loss and gradients against the CPU (fp32, bf16); 50 steps
#   3. test_parallel     the 4D equivalence suite on the GPU (WLB_TEST_DEVICE=cuda): several ranks on
#                        the one GPU, messages staged through the host (parallel.comm: mpi)
#   4. the NCCL path     mpirun -np 1 with parallel.comm: nccl
#   5. test_export.py    the export loaded by the machine's transformers
#   6. bench/gpu_throughput.sh (when BENCH=1): wlbtrain against PyTorch
# Logs go to $OUT when set (the device tool brings them back).
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
out=${OUT:-/tmp/gpu_check}
mkdir -p "$out"
# Runtime libraries: Open MPI, the Debian ones, NCCL and cuBLAS from the machine's own CUDA/PyTorch.
# shellcheck source=/dev/null
source .ompi/env.sh
if [ ! -d .devlibs/root ]; then for f in .devlibs/*.deb; do dpkg-deb -x "$f" .devlibs/root; done; fi
nccl=$(python3 -c 'import nvidia.nccl as m; print(m.__path__[0])' 2>/dev/null)/lib
export LD_LIBRARY_PATH=$PWD/.devlibs/root/usr/lib/x86_64-linux-gnu:${nccl}:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export WLBTRAIN=$PWD/build/release/wlbtrain WLB_TEST_BIN_DIR=$PWD/build/release/test
export OMPI_MCA_rmaps_base_oversubscribe=1 OMP_NUM_THREADS=4
nvidia-smi -L | tee "$out/gpu.txt"
"$WLBTRAIN" --version | tee -a "$out/gpu.txt"
summary=()
step() { # name, command...
  local name=$1; shift
  local t0=$SECONDS
  "$@" >"$out/$name.log" 2>&1
  local rc=$?
  summary+=("$(printf '%-18s exit %3d  %4ds  %s' "$name" "$rc" $((SECONDS - t0)) \
    "$(grep -E '^(not )?ok|# ok|# not ok' "$out/$name.log" | grep -c '^ok') ok, $(grep -c '^not ok' "$out/$name.log") not ok")")
  grep -E '^# ' "$out/$name.log" | tail -40
}
export CMOCKA_MESSAGE_OUTPUT=TAP
step cuda_ops build/release/test/test_cuda_ops
step cuda_model build/release/test/test_cuda_model
WLB_TEST_DEVICE=cuda step parallel_gpu build/release/test/test_parallel
cat > /tmp/nccl.yaml <<'YAML'
model: {preset: tiny}
parallel: {tp: 1, cp: 1, pp: 1, dp: 1, comm: nccl}
data: {path: /tmp/nccl_docs, context_window: 512, global_batch_tokens: 4096}
train: {device: cuda, steps: 5, lr: 0.002, warmup_steps: 1}
YAML
python3 bench/make_corpus.py --out /tmp/nccl_docs --docs 2000 --vocab 512 >/dev/null 2>&1
step nccl_one_rank mpirun -np 1 "$WLBTRAIN" --config /tmp/nccl.yaml
WLB_HF_PYTHON=python3 step export python3 test/test_export.py
if [ "${BENCH:-0}" = 1 ]; then step bench bash bench/gpu_throughput.sh; tail -20 "$out/bench.log"; fi
printf '%s\n' "${summary[@]}" | tee "$out/summary.txt"
