#!/usr/bin/env bash
# Runs the serving benchmark against hablar and llama.cpp's llama-server (the real C++ server,
# `llama-server -np N -cb -t THREADS`) on the same model, threads and machine, in one
# invocation, then prints the side-by-side table and draws one PNG per workload.
#
#   bench/serving/run_vs_llamacpp.sh [--llama-server PATH] [OUT_DIR]
#
# For each workload both servers run one after the other; which goes first alternates from
# one workload to the next (ORDER=hablar-first|llama-first picks the first workload's), so
# load that drifts over the run does not always fall on the same server. The machine's load
# average before each run is printed and stored with the results.
#
# Environment: LLAMA_SERVER (llama-server binary; also --llama-server), LLAMACPP_MODE
# (server: llama-server, the default; python: llama-cpp-python's `python -m llama_cpp.server`,
# one request at a time, with ORACLE_PY), HABLAR_BIN (default build/src/cli/hablar),
# HABLAR_ARGS (extra `hablar serve` flags), MODEL (default model path), THREADS (2),
# CONCURRENCY (1,4,8,16), INPUT_LEN/OUTPUT_LEN (512/128), REQUESTS (requests per level of the
# fixed workload; default: the concurrency), MIXED_REQUESTS (per level of the mixed one;
# default MIXED_FACTOR (2) x the concurrency, at least 8, so that arrivals meet running streams),
# WORKLOADS ("fixed mixed"), BENCH_PY (python with httpx + matplotlib).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
llama_server="${LLAMA_SERVER:-llama-server}"
if [[ "${1:-}" == "--llama-server" ]]; then llama_server="$2"; shift 2; fi
out="${1:-$repo/bench/serving/results}"
mkdir -p "$out"
bin="${HABLAR_BIN:-$repo/build/src/cli/hablar}"
mode="${LLAMACPP_MODE:-server}"
oracle_py="${ORACLE_PY:-$HOME/.cache/hablar/oracle-venv/bin/python}"
bench_py="${BENCH_PY:-python3}"
model="${MODEL:-$HOME/.cache/hablar/models/SmolLM2-135M-Instruct.Q4_1.gguf}"
threads="${THREADS:-2}"
conc="${CONCURRENCY:-1,4,8,16}"
in_len="${INPUT_LEN:-512}"
out_len="${OUTPUT_LEN:-128}"
requests="${REQUESTS:-0}"
workloads="${WORKLOADS:-fixed mixed}"
order="${ORDER:-hablar-first}"
port_h=18230
port_l=18231
max_conc=$(tr ',' '\n' <<<"$conc" | sort -n | tail -1)
# SmolLM2's end-of-generation ids (<|endoftext|> 0, <|im_end|> 2) are banned so that every
# request produces its full output length on both servers.
ban="${BAN_TOKENS:-0,2}"
# Both servers get max_conc slots of 2048 tokens (the mixed workload's longest request is
# 1536 + 128); llama-server splits -c evenly among its -np slots.
ctx=$(( max_conc * 2048 ))

wait_ready() {
  for _ in $(seq 900); do
    curl -sf "$1" >/dev/null 2>&1 && return 0
    sleep 0.2
  done
  echo "server at $1 did not become ready" >&2
  return 1
}

load_note() { echo "load $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) cores"; }

run_bench() {  # label port workload
  local reqs="$requests"
  if [[ "$3" == mixed ]]; then reqs="${MIXED_REQUESTS:-mixed}"; fi
  local note
  note="$(load_note)"
  echo "== $1 $3 ($note)"
  local levels=() c
  IFS=',' read -ra levels <<<"$conc"
  # The mixed workload's request count depends on the level: one bench call per level.
  for c in "${levels[@]}"; do
    local n="$reqs"
    [[ "$n" == mixed ]] && n=$(( ${MIXED_FACTOR:-2} * c > 8 ? ${MIXED_FACTOR:-2} * c : 8 ))
    "$bench_py" "$here/bench_serving.py" --base-url "http://127.0.0.1:$2" --label "$1" --model model \
      --concurrency "$c" --workload "$3" --input-len "$in_len" --output-len "$out_len" \
      --requests-per-level "$n" --ban-tokens "$ban" --note "$note" --out "$out/$1-$3-c$c.json"
  done
  "$bench_py" - "$out/$1-$3.json" "$out/$1-$3-c"*.json <<'PY'
import json, sys
parts = [json.load(open(f)) for f in sys.argv[2:]]
merged = dict(parts[0])
merged["levels"] = sorted((lv for p in parts for lv in p["levels"]), key=lambda lv: lv["concurrency"])
merged["note"] = "; ".join(sorted({p["note"] for p in parts}))
json.dump(merged, open(sys.argv[1], "w"), indent=1)
PY
  rm -f "$out/$1-$3-c"*.json
}

run_hablar() {  # workload
  # shellcheck disable=SC2086
  "$bin" serve -m "$model" --port $port_h -t "$threads" -np "$max_conc" -c "$ctx" --metrics \
    ${HABLAR_ARGS:-} > "$out/hablar-server-$1.log" 2>&1 &
  local pid=$!
  wait_ready "http://127.0.0.1:$port_h/health"
  run_bench hablar $port_h "$1"
  kill -TERM $pid; wait $pid || true
}

run_llama() {  # workload
  local pid
  if [[ "$mode" == python ]]; then
    # llama-cpp-python's server: one context, requests served one at a time.
    OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-passive}" \
    "$oracle_py" -m llama_cpp.server --model "$model" --port $port_l --n_threads "$threads" \
      --n_threads_batch "$threads" --n_ctx 2048 --n_batch 512 --interrupt_requests False \
      > "$out/llamacpp-server-$1.log" 2>&1 &
    pid=$!
    wait_ready "http://127.0.0.1:$port_l/v1/models"
  else
    "$llama_server" -m "$model" --port $port_l -t "$threads" -np "$max_conc" -cb -c "$ctx" \
      > "$out/llamacpp-server-$1.log" 2>&1 &
    pid=$!
    wait_ready "http://127.0.0.1:$port_l/health"
  fi
  run_bench llamacpp $port_l "$1"
  kill -TERM $pid; wait $pid || true
}

first="$order"
for w in $workloads; do
  if [[ "$first" == hablar-first ]]; then
    run_hablar "$w"; run_llama "$w"; first=llama-first
  else
    run_llama "$w"; run_hablar "$w"; first=hablar-first
  fi
done

for w in $workloads; do
  "$bench_py" "$here/bench_serving.py" --compare "$out/hablar-$w.json" "$out/llamacpp-$w.json" \
    --plot "$out/serving-$w.png" | tee "$out/ratios-$w.txt"
done
