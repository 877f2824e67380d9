#!/usr/bin/env bash
# Runs one libFuzzer target of fuzz/ for a bounded time: builds it with clang, libFuzzer,
# ASan and UBSan in its own build folder, runs it from a committed seed corpus (left
# untouched: new inputs go to a scratch corpus in the build folder) and exits non-zero on any
# finding (crash, sanitizer report, leak, timeout, out-of-memory). The per-target scripts
# (fuzz-gguf.sh, fuzz-hf.sh) name the target; this one does the work.
#
#   scripts/fuzz-run.sh TARGET CORPUS_DIR MAX_LEN CASE_NAME [--time SECONDS] [--junit FILE]
#
# Environment: HABLAR_FUZZ_BUILD_DIR (default build-fuzz), HABLAR_FUZZ_SECONDS (default 60).
set -euo pipefail

[ $# -ge 4 ] || { echo "usage: $0 TARGET CORPUS_DIR MAX_LEN CASE_NAME [--time S] [--junit F]" >&2; exit 2; }
target="$1" corpus="$2" max_len="$3" case_name="$4"
shift 4
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${HABLAR_FUZZ_BUILD_DIR:-$root/build-fuzz}"
seconds="${HABLAR_FUZZ_SECONDS:-60}"
junit=""
while [ $# -gt 0 ]; do
  case "$1" in
    --time) seconds="$2"; shift 2 ;;
    --junit) junit="$2"; shift 2 ;;
    *) echo "usage: [--time SECONDS] [--junit FILE]" >&2; exit 2 ;;
  esac
done

for tool in clang clang++ cmake ninja; do
  command -v "$tool" >/dev/null || { echo "$target: $tool not found (install clang, cmake, ninja-build)" >&2; exit 1; }
done

sanitize="-fsanitize=address,undefined -fsanitize=fuzzer-no-link -fno-sanitize-recover=all -fno-omit-frame-pointer"
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
  -DCMAKE_C_FLAGS="$sanitize" -DCMAKE_CXX_FLAGS="$sanitize" \
  -DHABLAR_FUZZ=ON -DHABLAR_TESTS=OFF -DHABLAR_BENCH=OFF -DHABLAR_CUDA=OFF >/dev/null
ninja -C "$build" "$target"

work="$build/$target-work"
artifacts="$build/$target-artifacts"
rm -rf "$work" "$artifacts"
mkdir -p "$work" "$artifacts"
log="$build/$target.log"

set +e
ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:allocator_may_return_null=1" \
UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1" \
  "$build/fuzz/$target" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
  -max_len="$max_len" -print_final_stats=1 -artifact_prefix="$artifacts/" \
  "$work" "$root/$corpus" >"$log" 2>&1
rc=$?
set -e

runs="$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo 0)"
findings="$(ls "$artifacts" 2>/dev/null | wc -l)"
if [ "$rc" -eq 0 ] && [ "$findings" -eq 0 ]; then
  echo "$target: no findings in $seconds s ($runs inputs)"
else
  tail -n 60 "$log" >&2
  echo "$target: FINDING (exit $rc); reproducer(s) in $artifacts, log in $log" >&2
fi

if [ -n "$junit" ]; then
  mkdir -p "$(dirname "$junit")"
  {
    echo '<?xml version="1.0" encoding="UTF-8"?>'
    echo "<testsuite name=\"fuzz\" tests=\"1\" failures=\"$([ "$rc" -eq 0 ] && [ "$findings" -eq 0 ] && echo 0 || echo 1)\">"
    echo "  <testcase classname=\"fuzz\" name=\"${case_name}_${seconds}s\">"
    if [ "$rc" -ne 0 ] || [ "$findings" -ne 0 ]; then
      echo "    <failure message=\"libFuzzer finding, exit $rc\">see $log and $artifacts</failure>"
    fi
    echo "    <system-out>$runs inputs in $seconds s</system-out>"
    echo "  </testcase>"
    echo "</testsuite>"
  } >"$junit"
fi
[ "$rc" -eq 0 ] && [ "$findings" -eq 0 ]
