#!/usr/bin/env bash
# Runs the serving benchmark against hablar and against llama.cpp's server (llama-cpp-python's
# `python -m llama_cpp.server`) on the same model, threads and machine, one after the other,
# then prints the ratios and draws one PNG per workload.
#
#   bench/serving/run_vs_llamacpp.sh [OUT_DIR]
# Environment: HABLAR_BIN (default build/src/cli/hablar), ORACLE_PY (python with llama_cpp and
# its server extras), MODEL (default model path), THREADS (2), CONCURRENCY (1,2,4,8),
# INPUT_LEN/OUTPUT_LEN (512/128), REQUESTS (requests per level; default: the concurrency),
# MIXED_INPUT/MIXED_OUTPUT (ranges of the mixed workload, "64,1024" and "16,128"),
# WORKLOADS ("fixed mixed"), BENCH_PY (python with httpx + matplotlib).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
out="${1:-$repo/bench/serving/results}"
mkdir -p "$out"
bin="${HABLAR_BIN:-$repo/build/src/cli/hablar}"
oracle_py="${ORACLE_PY:-$HOME/.cache/hablar/oracle-venv/bin/python}"
bench_py="${BENCH_PY:-python3}"
model="${MODEL:-$HOME/.cache/hablar/models/SmolLM2-135M-Instruct.Q4_1.gguf}"
threads="${THREADS:-2}"
conc="${CONCURRENCY:-1,2,4,8}"
in_len="${INPUT_LEN:-512}"
out_len="${OUTPUT_LEN:-128}"
requests="${REQUESTS:-0}"
workloads="${WORKLOADS:-fixed mixed}"
mixed_in="${MIXED_INPUT:-64,1024}"
mixed_out="${MIXED_OUTPUT:-16,128}"
port_h=18230
port_l=18231
max_conc="${conc##*,}"
# SmolLM2's end-of-generation ids (<|endoftext|> 0, <|im_end|> 2) are banned so that every
# request produces its full output length on both servers.
ban="${BAN_TOKENS:-0,2}"

wait_ready() {
  for _ in $(seq 600); do
    curl -sf "$1" >/dev/null 2>&1 && return 0
    sleep 0.2
  done
  echo "server at $1 did not become ready" >&2
  return 1
}

run_bench() {  # label port workload
  "$bench_py" "$here/bench_serving.py" --base-url "http://127.0.0.1:$2" --label "$1" --model model \
    --concurrency "$conc" --workload "$3" --input-len "$in_len" --output-len "$out_len" \
    --requests-per-level "$requests" --ban-tokens "$ban" --mixed-input "$mixed_in" \
    --mixed-output "$mixed_out" --out "$out/$1-$3.json"
}

# Both servers get room for max_conc sequences of ~1,300 tokens (the mixed workload's largest).
ctx=$(( max_conc * 1408 ))

"$bin" serve -m "$model" --port $port_h -t "$threads" -np "$max_conc" -c "$ctx" --metrics \
  > "$out/hablar-server.log" 2>&1 &
pid_h=$!
wait_ready "http://127.0.0.1:$port_h/health"
for w in $workloads; do run_bench hablar $port_h "$w"; done
kill -TERM $pid_h; wait $pid_h || true

# llama-cpp-python's server: one context, requests served one at a time (it has no
# continuous batching); 2048 tokens hold any one request of the workloads.
# --interrupt_requests False: by default a new request aborts the running one.
# OMP_WAIT_POLICY=passive: ggml's OpenMP workers otherwise spin, which on a shared machine
# costs it far more than the work itself.
OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-passive}" \
"$oracle_py" -m llama_cpp.server --model "$model" --port $port_l --n_threads "$threads" \
  --n_threads_batch "$threads" --n_ctx 2048 --n_batch 512 --interrupt_requests False \
  > "$out/llamacpp-server.log" 2>&1 &
pid_l=$!
wait_ready "http://127.0.0.1:$port_l/v1/models"
for w in $workloads; do run_bench llamacpp $port_l "$w"; done
kill -TERM $pid_l; wait $pid_l || true

for w in $workloads; do
  "$bench_py" "$here/bench_serving.py" --compare "$out/hablar-$w.json" "$out/llamacpp-$w.json" \
    --plot "$out/serving-$w.png" | tee "$out/ratios-$w.txt"
done
