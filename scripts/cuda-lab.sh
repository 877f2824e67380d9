#!/usr/bin/env bash
# The CUDA lab: build the CUDA tests and benchmarks on a development machine, carry them to
# a GPU machine, and run there every CUDA test, compute-sanitizer (memcheck, racecheck) and
# the microbenchmarks, with logs in one folder.
#
#   scripts/cuda-lab.sh pack [BUILD_DIR]  build (default build-cuda) and copy the binaries and
#                                         the shared libraries a bare GPU machine lacks into
#                                         carry/cuda (ignored by git)
#   scripts/cuda-lab.sh run [LOG_DIR]     on the GPU machine, from the repository root: run
#                                         everything from carry/cuda; logs to LOG_DIR
#                                         (default $OUT, else /tmp/cuda-lab)
#   scripts/cuda-lab.sh quick [LOG_DIR]   as run, without the sanitizers and long benchmarks
#   scripts/cuda-lab.sh lab [LOG_DIR]     as quick, plus the decode and int8 tests under each
#                                         lab knob, cuda_bench --lab (the acceptance
#                                         benchmarks under each knob variant) to lab.txt, and
#                                         compute-sanitizer on the decode and int8 tests
set -u
mode=${1:-}
root=$(cd "$(dirname "$0")/.." && pwd)
carry=$root/carry/cuda
binaries="cuda_kernel_tests cuda_host_twin_tests cuda_host_twin_broken_rescale cuda_bench"

pack() {
  local build=${1:-$root/build-cuda}
  cmake -S "$root" -B "$build" -G Ninja -DHABLAR_WERROR=ON >/dev/null || exit 1
  ninja -C "$build" -j2 $binaries || exit 1
  rm -rf "$carry"
  mkdir -p "$carry/lib"
  for b in $binaries; do
    find "$build" -type f -name "$b" -perm -u+x -exec cp {} "$carry/" \;
  done
  # Shared libraries from Debian packages are absent on the GPU machine: carry them.
  for b in "$carry"/cuda_*; do
    ldd "$b" | awk '/spdlog|fmt|gtest|benchmark/ {print $3}'
  done | sort -u | while read -r lib; do cp -L "$lib" "$carry/lib/"; done
  du -sh "$carry"
}

# Runs one step with a time limit, logging to $log_dir/$2; records PASS/FAIL in the summary.
step() {
  local name=$1 log=$2 limit=$3
  shift 3
  local start=$SECONDS
  timeout "$limit" "$@" >"$log_dir/$log" 2>&1
  local rc=$?
  local verdict=PASS
  [ $rc -ne 0 ] && verdict="FAIL (exit $rc)" && failures=$((failures + 1))
  [ $rc -eq 124 ] && verdict="TIMEOUT after ${limit}s"
  printf '%-44s %-22s %4ds  %s\n' "$name" "$verdict" $((SECONDS - start)) "$log" | tee -a "$log_dir/summary.txt"
}

run() {
  local full=$1
  log_dir=${2:-${OUT:-/tmp/cuda-lab}}
  failures=0
  mkdir -p "$log_dir"
  : >"$log_dir/summary.txt"
  local libs="$carry/lib"
  for d in /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib; do
    [ -e "$d/libcublas.so.13" ] && libs="$libs:$d"
  done
  if ! ls ${libs//:/ } 2>/dev/null | grep -q libcublas.so.13; then
    local pip_dir
    pip_dir=$(find / -name 'libcublas.so.13' -not -path '*/proc/*' 2>/dev/null | head -1)
    [ -n "$pip_dir" ] && libs="$libs:$(dirname "$pip_dir")"
  fi
  export LD_LIBRARY_PATH="$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  {
    nvidia-smi
    echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
    ldd "$carry/cuda_kernel_tests"
  } >"$log_dir/env.txt" 2>&1
  local sanitizer
  sanitizer=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)

  step "host twin (decode wiring, no GPU)" host_twin.txt 120 "$carry/cuda_host_twin_tests"
  step "broken rescale build must FAIL" broken_rescale.txt 120 \
    bash -c "! '$carry/cuda_host_twin_broken_rescale' --gtest_filter='*ThreeLive*:*SplitK*'"
  step "kernel tests on the GPU" kernel_tests.txt 150 "$carry/cuda_kernel_tests"
  if [ "$full" = lab ]; then
    # The changed kernels' tests again under every lab knob the benchmarks compare.
    local variant i=0
    for variant in "HABLAR_DECODE_KERNEL=0" "HABLAR_DECODE_MMA_BLOCKS=3 HABLAR_DECODE_BLOCKS_PER_SM=64" \
      "HABLAR_Q4K_KERNEL=0" "HABLAR_Q4K_TEAM=16 HABLAR_Q4K_ROWS=4" "HABLAR_Q4K_PDL=0" \
      "HABLAR_Q4K_GRID=-3 HABLAR_Q4K_L2HINT=1" "HABLAR_Q4K_GRID=-5 HABLAR_Q4K_ROWS=1" \
      "HABLAR_Q4K_GRID=0" "HABLAR_Q4K_MMA_FROM=2"; do
      i=$((i + 1))
      step "tests with $variant" "variant_tests_$i.txt" 60 env $variant \
        "$carry/cuda_kernel_tests" --gtest_filter='*Decode*:*Int8*'
    done
    step "benchmarks (quick)" bench.txt 120 "$carry/cuda_bench" --quick
    step "kernel variants (cuda_bench --lab)" lab.txt 150 "$carry/cuda_bench" --lab
  elif [ "$full" = 1 ]; then
    step "benchmarks" bench.txt 180 "$carry/cuda_bench"
  else
    step "benchmarks (quick)" bench.txt 180 "$carry/cuda_bench" --quick
  fi
  if [ "$full" = lab ] && [ -n "$sanitizer" ]; then
    # The changed kernels only (decode attention, Q4_K int8 products).
    step "memcheck (decode, int8 matmul)" memcheck.txt 60 "$sanitizer" --tool memcheck \
      --error-exitcode 9 "$carry/cuda_kernel_tests" --gtest_filter='*Decode*:*Int8*'
    step "racecheck (decode, int8 matmul)" racecheck.txt 60 "$sanitizer" --tool racecheck \
      --error-exitcode 9 "$carry/cuda_kernel_tests" --gtest_filter='*Decode*:*Int8*'
    # Every Q4_K product through the looping kernel, each block walking several row groups.
    step "memcheck, looping Q4_K kernel" memcheck_loop.txt 60 env HABLAR_Q4K_GRID=-3 \
      "$sanitizer" --tool memcheck --error-exitcode 9 "$carry/cuda_kernel_tests" \
      --gtest_filter='*Int8*'
    step "racecheck, looping Q4_K kernel" racecheck_loop.txt 60 env HABLAR_Q4K_GRID=-3 \
      "$sanitizer" --tool racecheck --error-exitcode 9 "$carry/cuda_kernel_tests" \
      --gtest_filter='*Int8*'
    step "synccheck (decode, int8 matmul)" synccheck.txt 60 "$sanitizer" --tool synccheck \
      --error-exitcode 9 "$carry/cuda_kernel_tests" --gtest_filter='*Decode*:*Int8*'
  fi
  if [ "$full" = 1 ] && [ -n "$sanitizer" ]; then
    # The large sampling draw is the same kernel as the small ones: left out to save time.
    step "compute-sanitizer memcheck" memcheck.txt 120 "$sanitizer" --tool memcheck \
      --error-exitcode 9 "$carry/cuda_kernel_tests" --gtest_filter=-*Frequencies*
    step "compute-sanitizer racecheck" racecheck.txt 120 "$sanitizer" --tool racecheck \
      --error-exitcode 9 "$carry/cuda_kernel_tests" \
      --gtest_filter=-*Frequencies*:*Greedy*:*MatchesReferenceForEveryRowCount*
    step "compute-sanitizer synccheck" synccheck.txt 120 "$sanitizer" --tool synccheck \
      --error-exitcode 9 "$carry/cuda_kernel_tests" --gtest_filter=-*Frequencies*
  fi
  echo
  grep -E "PASSED|FAILED|SKIPPED" "$log_dir/kernel_tests.txt" | head -40
  echo
  if [ "$full" = lab ]; then  # the reply shows the end of the output: the lab table last
    grep -E "limits|goal" "$log_dir/bench.txt"
    cat "$log_dir/lab.txt"
  else
    cat "$log_dir/bench.txt"
  fi
  for f in memcheck racecheck synccheck; do
    if [ -f "$log_dir/$f.txt" ]; then
      grep -E "ERROR SUMMARY|RACECHECK SUMMARY|Error" "$log_dir/$f.txt" | tail -3
    fi
  done
  echo "steps failed: $failures"
  # At most 8 files come back from a device call: every log in one archive, the summary and
  # the benchmark tables beside it.
  (cd "$log_dir" && tar -czf logs.tar.gz ./*.txt &&
    find . -maxdepth 1 -name '*.txt' ! -name summary.txt ! -name bench.txt ! -name lab.txt -delete)
  [ "$failures" -eq 0 ]
}

case $mode in
  pack) pack "${2:-}" ;;
  run) run 1 "${2:-}" ;;
  quick) run 0 "${2:-}" ;;
  lab) run lab "${2:-}" ;;
  *) sed -n '2,14p' "$0"; exit 2 ;;
esac
