#!/usr/bin/env bash
# Runs every test program of the given build variants (default build/release build/asan) and the
# script tests (test/*.py, once, against the first variant, with the python scripts/test-python.sh
# finds or makes). Prints one line per program, the log of each failure, a summary per variant, and
# last the total: "N passed, N failed, N skipped". Exit status 0 only if nothing failed.
# With CI set (CI=1, CI=true), a missing test dependency (a Python module, ../shared/real-data) is
# a failure, not a skip; only the GPU tests skip, each with its reason. With the real data present,
# the programs that read it then run once more without it (the skip path of a user's clone).
set -u
cd "$(dirname "$0")/.."
variants=("$@")
[ ${#variants[@]} -gt 0 ] || variants=(build/release build/asan)
export WLB_REAL_DATA=${WLB_REAL_DATA:-$(cd .. && pwd)/shared/real-data}
# LeakSanitizer: Open MPI and hwloc keep allocations until exit by design.
export LSAN_OPTIONS="suppressions=$PWD/test/lsan.supp:print_suppressions=0"
# fast_unwind_on_malloc=0: Open MPI's plugins have no frame pointers; the slow unwinder reaches the
# suppressed libraries through them (else their leaks show as one frame of an unknown module).
# intercept_tls_get_addr=0: GCC 12's LeakSanitizer reads a bogus dynamic-TLS range that glibc 2.36 leaves
# for Open MPI's dlopened plugins and crashes in its tracer ("Tracer caught signal 11", seen with 4 ranks).
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=0:fast_unwind_on_malloc=0:intercept_tls_get_addr=0"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1
# The tests' tiny models run the watchdog at parallel.timeout_s 3 (test_watchdog.py, test_slurm.py):
# below the users' floor of 10 s, which this test hook lowers (config_resolve.c, check_timeout).
export WLBTRAIN_TEST_TIMEOUT_FLOOR_S=1
# The Python tests and what they start get the interpreter that has their modules.
WLB_PYTHON=$(scripts/test-python.sh)
export WLB_PYTHON
echo "python for the tests: $WLB_PYTHON"
total_pass=0 total_fail=0 total_skip=0

# Counts TAP lines of one log; sets pass fail skip. A program that died early counts the tests it
# never reported (from its "1..N" plan) as failed, at least one.
count_tap() {
  local log=$1 status=$2
  # cmocka writes a skipped test as "not ok N # SKIP", TAP itself as "ok N # SKIP"; both are skips.
  skip=$(grep -Ec '^(not )?ok [0-9]+.*# SKIP' "$log")
  pass=$(( $(grep -c '^ok ' "$log") - $(grep -Ec '^ok [0-9]+.*# SKIP' "$log") ))
  fail=$(( $(grep -c '^not ok ' "$log") - $(grep -Ec '^not ok [0-9]+.*# SKIP' "$log") ))
  local plan seen
  plan=$(sed -n 's/^1\.\.\([0-9]*\)$/\1/p' "$log" | head -1)
  seen=$((pass + fail + skip))
  if [ -n "$plan" ] && [ "$seen" -lt "$plan" ]; then fail=$((fail + plan - seen)); fi
  if [ "$status" -ne 0 ] && [ "$fail" -eq 0 ]; then fail=1; fi
}

run_one() { # name log cmd...
  local name=$1 log=$2; shift 2
  local t0=$SECONDS
  timeout 900 "$@" >"$log" 2>&1
  local status=$?
  count_tap "$log" "$status"
  printf '  %-28s %3d passed, %d failed, %d skipped  (%ds)\n' "$name" "$pass" "$fail" "$skip" $((SECONDS - t0))
  if [ "$fail" -gt 0 ]; then
    [ "$status" -eq 124 ] && echo "    (timed out)"
    sed 's/^/    | /' "$log" | tail -n 60
  fi
  grep -h '^# skip' "$log" | sort -u | sed 's/^/    /'
  v_pass=$((v_pass + pass)) v_fail=$((v_fail + fail)) v_skip=$((v_skip + skip))
}

for b in "${variants[@]}"; do
  echo "== tests: $b"
  mkdir -p "$b/test-logs"
  v_pass=0 v_fail=0 v_skip=0
  export WLBTRAIN=$PWD/$b/wlbtrain WLB_TEST_BIN_DIR=$PWD/$b/test
  for t in "$b"/test/test_*; do
    [ -x "$t" ] || continue
    name=$(basename "$t")
    asan=$ASAN_OPTIONS
    # The flash-kernel emulator never starts MPI and allocates at every step of every fiber: with
    # frame pointers everywhere the fast unwinder is exact there, and the slow one takes minutes.
    [ "$name" = test_flash_emulated ] && asan=${asan/fast_unwind_on_malloc=0/fast_unwind_on_malloc=1}
    ASAN_OPTIONS=$asan CMOCKA_MESSAGE_OUTPUT=TAP run_one "$name" "$b/test-logs/$name.log" "$t"
  done
  if [ "$b" = "${variants[0]}" ]; then
    for py in test/test_*.py; do
      [ -f "$py" ] || continue
      name=$(basename "$py")
      run_one "$name" "$b/test-logs/$name.log" "$WLB_PYTHON" "$py"
    done
  fi
  echo "$b: $v_pass passed, $v_fail failed, $v_skip skipped"
  total_pass=$((total_pass + v_pass)) total_fail=$((total_fail + v_fail)) total_skip=$((total_skip + v_skip))
done

# A user's clone has no ../shared: there the tests that read the real data take their skip path,
# which a run beside ../shared never takes. When the real data is here, those programs run once more
# without it and with CI unset - the C programs of the last variant (the sanitized one: a skip that
# leaks fails) and the Python tests - and each must skip something and fail nothing.
if [ -d "$WLB_REAL_DATA" ]; then
  b=${variants[${#variants[@]} - 1]}
  echo "== tests without the real data (as in a user's clone): $b"
  no_data=$(mktemp -d)
  v_pass=0 v_fail=0 v_skip=0
  for src in $(grep -lE 'test_real_data|SKIP_WITHOUT_REAL_DATA|WLB_REAL_DATA' test/test_*.c test/test_*.cc test/test_*.py 2>/dev/null); do
    name=$(basename "$src")
    # The Python tests run against the first variant, as above.
    case $src in
      *.py) vb=${variants[0]} cmd=("$WLB_PYTHON" "$src") ;;
      *) vb=$b name=${name%.*} cmd=("$b/test/${name%.*}") ;;
    esac
    CI= WLB_REAL_DATA=$no_data WLBTRAIN=$PWD/$vb/wlbtrain WLB_TEST_BIN_DIR=$PWD/$vb/test CMOCKA_MESSAGE_OUTPUT=TAP \
      run_one "$name" "$b/test-logs/$name.no-real-data.log" "${cmd[@]}"
    if [ "$skip" -eq 0 ]; then
      echo "    $name read no real data here, yet skipped nothing: does it still find ../shared?"
      v_fail=$((v_fail + 1))
    fi
  done
  rmdir "$no_data"
  echo "$b without the real data: $v_pass passed, $v_fail failed, $v_skip skipped"
  total_pass=$((total_pass + v_pass)) total_fail=$((total_fail + v_fail)) total_skip=$((total_skip + v_skip))
fi
echo "$total_pass passed, $total_fail failed, $total_skip skipped"
[ "$total_fail" -eq 0 ]
