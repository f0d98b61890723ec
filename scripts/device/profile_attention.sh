#!/usr/bin/env bash
# On the GPU machine: why the attention kernels run at the speed they do, beside FlashAttention-2's.
# One document mix of the WLB-LLM length list packed into a WINDOW-token window (default 32768, seed
# 1, as bench/attention_kernels.sh draws it), llama3.2-1b heads (32 query, 8 kv, head size 64),
# through bench/attn_kernels (the deterministic backward) and bench/attn_torch.py --kernels fa2, each
# under Nsight Compute (--clock-control none): the first 24 attention launches profiled with the
# metrics below, the first launch of each kernel shown (a warm-up's). Prints one table: kernel, ms, registers per thread, shared memory per
# block, achieved occupancy, the tensor pipe's and the SMs' busy share, DRAM throughput, shared-memory
# bank conflicts, and the stall reasons that cost most (warps stalled per issued instruction).
# Metrics this ncu does not know are left out (it is asked first, --query-metrics), so a renamed
# metric costs a column, not the run. ncu serializes and replays each kernel: a minute or two.
# Usage: bash scripts/device/profile_attention.sh [WINDOW]   (OUT: where ncu's CSVs go)
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
w=${1:-32768}
out=${OUT:-/tmp/profile_attention}
mkdir -p "$out"
bin=${WLB_BENCH_BIN:-$PWD/build/device/bench}
lengths=.devdata/distca_wlbllm_lengths.json
[ -f "$lengths" ] || lengths=../shared/real-data/lengths/distca_wlbllm_lengths.json
[ -x "$bin/attn_kernels" ] || { echo "profile_attention: $bin/attn_kernels missing" >&2; exit 2; }
command -v ncu >/dev/null || { echo "profile_attention: no ncu on this machine" >&2; exit 2; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 bench/attn_mix.py "$lengths" "$w" 1 > "$work/segs"
wanted=(gpu__time_duration.sum launch__registers_per_thread launch__shared_mem_per_block_dynamic
  launch__shared_mem_per_block_static launch__grid_size launch__block_size
  sm__warps_active.avg.pct_of_peak_sustained_active
  sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active
  sm__throughput.avg.pct_of_peak_sustained_elapsed dram__throughput.avg.pct_of_peak_sustained_elapsed
  l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum smsp__inst_executed.sum)
for r in barrier long_scoreboard short_scoreboard mio_throttle math_pipe_throttle wait not_selected \
         lg_throttle dispatch_stall no_instruction selected; do
  wanted+=("smsp__average_warps_issue_stalled_${r}_per_issue_active.ratio")
done
ncu --query-metrics > "$work/known" 2>&1
metrics=$(python3 - "$work/known" "${wanted[@]}" <<'PY'
import re, sys
known = set(re.findall(r"^([a-z0-9_]+__[a-z0-9_]+)", open(sys.argv[1], errors="replace").read(), re.M))
ok = [m for m in sys.argv[2:] if m.split(".")[0] in known]
print(",".join(ok if known else sys.argv[2:]))
PY
)
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
echo "# attention kernels under Nsight Compute: window $w (WLB-LLM mix, seed 1), 32 q / 8 kv heads, D 64; ${gpu:-unknown GPU}"
ncu --csv --clock-control none --metrics "$metrics" --kernel-name regex:k_flash --launch-count 24 \
  "$bin/attn_kernels" "$work/segs" --device cuda --heads 32 --kv-heads 8 --dim 64 --iters 1 --deterministic 1 \
  > "$out/ncu_wlbtrain.csv" 2> "$out/ncu_wlbtrain.log" || { echo "profile_attention: ncu failed:"; tail -5 "$out/ncu_wlbtrain.log"; }
ncu --csv --clock-control none --metrics "$metrics" --kernel-name regex:flash_ --launch-count 24 \
  python3 bench/attn_torch.py "$work/segs" --heads 32 --kv-heads 8 --dim 64 --iters 1 --kernels fa2 \
  > "$out/ncu_fa2.csv" 2> "$out/ncu_fa2.log" || { echo "profile_attention: ncu (fa2) failed:"; tail -5 "$out/ncu_fa2.log"; }
python3 - "$out/ncu_wlbtrain.csv" "$out/ncu_fa2.csv" <<'PY'
import collections, csv, io, re, sys
short = {"gpu__time_duration.sum": "ms", "launch__registers_per_thread": "regs",
         "launch__shared_mem_per_block_dynamic": "smem dyn", "launch__shared_mem_per_block_static": "smem static",
         "launch__grid_size": "blocks", "launch__block_size": "threads",
         "sm__warps_active.avg.pct_of_peak_sustained_active": "occupancy %",
         "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active": "tensor pipe %",
         "sm__throughput.avg.pct_of_peak_sustained_elapsed": "SM %",
         "dram__throughput.avg.pct_of_peak_sustained_elapsed": "DRAM %",
         "l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum": "bank conflicts",
         "smsp__inst_executed.sum": "warp insts"}
kernels = collections.OrderedDict()  # name -> {metric: value}, the first launch of each
for path in sys.argv[1:]:
    try:
        text = open(path, errors="replace").read()
    except OSError:
        continue
    lines = [l for l in text.splitlines() if l.startswith('"')]
    for r in csv.DictReader(io.StringIO("\n".join(lines))):
        name = re.sub(r"[<(].*", "", r.get("Kernel Name", "")).replace("void ", "").strip()
        key = (name, r.get("ID"))
        first = next((k for k in kernels if k[0] == name), None)
        if first is not None and first != key:
            continue
        v = r.get("Metric Value", "").replace(",", "")
        unit = r.get("Metric Unit", "")
        try:
            x = float(v)
        except ValueError:
            continue
        if r["Metric Name"] == "gpu__time_duration.sum":
            x *= {"nsecond": 1e-6, "usecond": 1e-3, "msecond": 1.0, "second": 1e3}.get(unit, 1e-6)
        kernels.setdefault(key, {})[r["Metric Name"]] = x
if not kernels:
    print("profile_attention: no kernel was profiled")
    sys.exit(1)
cols = [m for m in short if any(m in d for d in kernels.values())]
print("| kernel | " + " | ".join(short[c] for c in cols) + " | top stalls (warps per issue) |")
print("|---|" + "---|" * (len(cols) + 1))
for (name, _), d in kernels.items():
    stalls = sorted(((v, k) for k, v in d.items() if "issue_stalled" in k), reverse=True)[:3]
    top = ", ".join("%s %.2f" % (re.sub(r".*stalled_(.*)_per_issue.*", r"\1", k), v) for v, k in stalls)
    cells = ["%.3f" % d[c] if c == "gpu__time_duration.sum" else "%.3g" % d[c] if c in d else "-" for c in cols]
    print("| %s | %s | %s |" % (name[:48], " | ".join(cells), top or "-"))
PY
