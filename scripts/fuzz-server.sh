#!/usr/bin/env bash
# Fuzzes the HTTP server's request parsers for a bounded time each: the HTTP/1.1 framing
# (fuzz/http_wire_fuzz), JSON request bodies through the field readers, the chat message
# checks and chat templates (fuzz/chat_request_fuzz), and the grammars a request may carry
# (GBNF, JSON Schema, regex) walked through the matcher (fuzz/grammar_fuzz). Same build
# folder and sanitizers as scripts/fuzz-gguf.sh; committed seeds in fuzz/corpus-http,
# fuzz/corpus-chat and fuzz/corpus-grammar stay untouched. Exits non-zero on any finding.
#
#   scripts/fuzz-server.sh [--time SECONDS_PER_TARGET] [--junit FILE]
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${HABLAR_FUZZ_BUILD_DIR:-$root/build-fuzz}"
seconds="${HABLAR_FUZZ_SECONDS:-60}"
junit=""
while [ $# -gt 0 ]; do
  case "$1" in
    --time) seconds="$2"; shift 2 ;;
    --junit) junit="$2"; shift 2 ;;
    *) echo "usage: $0 [--time SECONDS] [--junit FILE]" >&2; exit 2 ;;
  esac
done

sanitize="-fsanitize=address,undefined -fsanitize=fuzzer-no-link -fno-sanitize-recover=all -fno-omit-frame-pointer"
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
  -DCMAKE_C_FLAGS="$sanitize" -DCMAKE_CXX_FLAGS="$sanitize" \
  -DHABLAR_FUZZ=ON -DHABLAR_TESTS=OFF -DHABLAR_BENCH=OFF -DHABLAR_CUDA=OFF >/dev/null
ninja -C "$build" http_wire_fuzz chat_request_fuzz grammar_fuzz

status=0
cases=""
for target in http_wire_fuzz:corpus-http chat_request_fuzz:corpus-chat grammar_fuzz:corpus-grammar; do
  name="${target%%:*}"
  seeds="$root/fuzz/${target##*:}"
  work="$build/fuzz-work-$name"
  artifacts="$build/fuzz-artifacts-$name"
  log="$build/fuzz-$name.log"
  rm -rf "$work" "$artifacts"
  mkdir -p "$work" "$artifacts"
  set +e
  ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:allocator_may_return_null=1" \
  UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1" \
    "$build/fuzz/$name" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
    -max_len=16384 -print_final_stats=1 -artifact_prefix="$artifacts/" \
    "$work" "$seeds" >"$log" 2>&1
  rc=$?
  set -e
  runs="$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo 0)"
  findings="$(ls "$artifacts" 2>/dev/null | wc -l)"
  if [ "$rc" -eq 0 ] && [ "$findings" -eq 0 ]; then
    echo "fuzz-server: $name: no findings in $seconds s ($runs inputs)"
    cases="$cases  <testcase classname=\"fuzz\" name=\"${name}_${seconds}s\"><system-out>$runs inputs</system-out></testcase>"$'\n'
  else
    status=1
    tail -n 60 "$log" >&2
    echo "fuzz-server: $name: FINDING (exit $rc); reproducer(s) in $artifacts, log in $log" >&2
    cases="$cases  <testcase classname=\"fuzz\" name=\"${name}_${seconds}s\"><failure message=\"libFuzzer finding, exit $rc\">see $log</failure></testcase>"$'\n'
  fi
done

if [ -n "$junit" ]; then
  mkdir -p "$(dirname "$junit")"
  {
    echo '<?xml version="1.0" encoding="UTF-8"?>'
    echo "<testsuite name=\"fuzz-server\" tests=\"3\" failures=\"$status\">"
    printf '%s' "$cases"
    echo "</testsuite>"
  } >"$junit"
fi
exit "$status"
