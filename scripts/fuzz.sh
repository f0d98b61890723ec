#!/usr/bin/env bash
# Fuzzes the eight input readers with libFuzzer (clang, -fsanitize=fuzzer,address,undefined) for a
# bounded time each: the YAML config loader, the Megatron .idx/.bin reader, the checkpoint reader,
# the sharded checkpoint's index.json reader, the safetensors reader (with model_load's format
# sniffing), the document length lists (with the planner over them), the tokenizer readers (tiktoken
# ranks, tokenizer.json) and BPE encoder, and the calibration file (with the cost model over it)
# (fuzz/fuzz_targets.h says what each target checks). Seeds: test/fuzz/TARGET/. Every input that
# crashes, trips a sanitizer or times out is copied into test/fuzz/TARGET/ as crash-*, where
# test/test_fuzz_corpus (in make test) replays it from then on; the script then exits 1.
# Usage: scripts/fuzz.sh [SECONDS_PER_TARGET] [TARGET...]
#        (default 60 s; config idx checkpoint ckpt_index safetensors lengths tokenizer calibration)
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-60}
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(config idx checkpoint ckpt_index safetensors lengths tokenizer calibration)
scripts/install-deps.sh fuzz
out=build/fuzz
mkdir -p "$out/obj"

# Everything the targets reach, built once with clang and the fuzzer's instrumentation.
flags="-std=c11 -D_GNU_SOURCE -D_FILE_OFFSET_BITS=64 -I. -g -O1 -fopenmp -fsanitize=fuzzer-no-link,address,undefined
       -fno-sanitize-recover=undefined -Wno-unused-command-line-argument $(mpicc --showme:compile)"
# The engine's cost profiles, built into the program as the Makefile does (cost_engine_profiles).
scripts/embed_profiles.sh engine/plan/profiles/*.json > "$out/engine_profiles.c.tmp"
cmp -s "$out/engine_profiles.c.tmp" "$out/engine_profiles.c" || mv "$out/engine_profiles.c.tmp" "$out/engine_profiles.c"
srcs="$(ls backends.c util/*.c config/*.c data/*.c engine/*/*.c cpu/*.c fuzz/fuzz_targets.c) $out/engine_profiles.c"
objs=()
for s in $srcs; do
  o="$out/obj/${s//\//_}.o"
  if [ ! -f "$o" ] || [ "$s" -nt "$o" ] || [ -n "$(find engine util config data cpu fuzz -name '*.h' -newer "$o" | head -1)" ]; then
    clang $flags -c "$s" -o "$o"
  fi
  objs+=("$o")
done
libs="-lyaml -lz -ljansson -lpcre2-8 -lm $(mpicc --showme:link)"

status=0
echo "# fuzzing, $secs s per target; $(date -u +%Y-%m-%dT%H:%MZ); $(clang --version | head -1)"
for t in "${targets[@]}"; do
  clang $flags -fsanitize=fuzzer "fuzz/fuzz_$t.c" "${objs[@]}" $libs -o "$out/fuzz_$t"
  corpus="$out/corpus-$t"
  mkdir -p "$corpus" "$out/crashes-$t"
  cp -n test/fuzz/"$t"/* "$corpus"/ 2>/dev/null || true
  log="$out/fuzz_$t.log"
  # detect_leaks=0: the targets keep a few buffers on purpose (the tiny model of the weights mode).
  ASAN_OPTIONS=detect_leaks=0 "$out/fuzz_$t" "$corpus" -max_total_time="$secs" -timeout=20 -rss_limit_mb=4096 \
    -print_final_stats=1 -artifact_prefix="$out/crashes-$t/" >"$log" 2>&1 || true
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 | cut -d' ' -f2)
  found=$(ls "$out/crashes-$t" | wc -l)
  printf '%-11s %8s inputs run, coverage %5s edges, corpus %4d inputs, %d finding(s)\n' \
    "$t" "${runs:-?}" "${cov:-?}" "$(ls "$corpus" | wc -l)" "$found"
  if [ "$found" -gt 0 ]; then
    status=1
    for c in "$out/crashes-$t"/*; do
      cp "$c" "test/fuzz/$t/crash-$(basename "$c" | sed 's/^[a-z-]*-//' | cut -c1-16)"
      echo "  kept test/fuzz/$t/crash-$(basename "$c" | sed 's/^[a-z-]*-//' | cut -c1-16) ($(basename "$c"))"
    done
    grep -m3 -A12 'ERROR:\|==ABORTING\|deadly signal\|runtime error' "$log" | sed 's/^/  | /' | head -30
    rm -f "$out/crashes-$t"/*
  fi
done
exit $status
