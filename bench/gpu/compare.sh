#!/usr/bin/env bash
# hablar beside llama.cpp on one CUDA machine, in one call of the `device` tool (issue 14's
# method: the same GGUF files, the same GPU, the same run).
#
#   bench/gpu/compare.sh pack         here: hablar's binaries (scripts/gpu-serving.sh pack) and
#                                     the llama.cpp sources vendored in the llama-cpp-python
#                                     sdist, trimmed to what the CUDA build of llama-bench,
#                                     llama-batched-bench and llama-server needs
#                                     (.gpu/llamacpp-src.tar.gz, about 9 MB)
#   bench/gpu/compare.sh run [SHAPE ...]
#                                     on the GPU machine: build llama.cpp for sm_90, make a
#                                     Q4_K_M model of each shape (default qwen2.5-1.5b), run
#                                     llama-bench (-fa 0 and 1), llama-batched-bench (-fa on) and
#                                     hablar's bench and batched-bench, and print one table of
#                                     figures and ratios (bench/gpu/compare_table.py); decode
#                                     at depth (tg64 @ DEPTHS) by both tools too
#   bench/gpu/compare.sh serve [SHAPE]
#                                     on the GPU machine: bench/serving/bench_serving.py (512 in,
#                                     128 out, streamed) at 1, 16, 64 and 256 clients against
#                                     `hablar serve --device cuda -np 256`, then against
#                                     `llama-server -np 256 -cb -fa on` when `run` built it in
#                                     the same call; the step counts of hablar's /metrics beside
#                                     (SERVE_ARGS: extra hablar flags; SERVE_CTX: hablar's KV
#                                     pool in tokens, default 256 x 640 as llama-server's -c;
#                                     SERVE_BATCH: hablar's -b, default 2048; BENCH_ARGS: extra
#                                     bench_serving.py flags, e.g. --logprobs 5; REQUESTS: requests
#                                     per level, default one wave of the level's clients; more
#                                     give a steady state, each client sending its next request
#                                     when one ends)
#   bench/gpu/compare.sh profile [SHAPE]
#                                     on the GPU machine: ncu's kernel times over hablar's
#                                     batch-1 decode (two steady-state steps), summed by kernel
#   bench/gpu/compare.sh profile-prompt [SHAPE]
#                                     on the GPU machine: the same over the prompt steps of
#                                     batched-bench at 4 x 512 tokens (a step of `serve -b
#                                     2048`'s size; PROMPT_NPL / PROMPT_LEN change it), caches
#                                     not flushed between kernels, and nsys's timeline summary
#                                     (kernel time against the steps' wall time) where nsys is
#                                     installed
#   bench/gpu/compare.sh profile-steps [SHAPE]
#                                     on the GPU machine: ncu's kernel times of the last prompt
#                                     step and the mean decode step of batched-bench at 256 x
#                                     512 prompt tokens (STEPS_NPL / STEPS_LEN / STEPS_NTG)
#   AB="HABLAR_X=1;HABLAR_X=0" bench/gpu/compare.sh ab [SHAPE]
#                                     on the GPU machine: variants of one binary (lab knobs of
#                                     docs/CUDA.md, `--lab-knobs`) alternating ROUNDS times
#                                     (default 2): bench pp512 / pp2048, batched-bench 512 + 128
#                                     at AB_NPL (default 64,256) sequences, and unless
#                                     AB_SERVE=0 the steady state (1,024 requests over 256
#                                     clients), one line of figures per variant and round
#
# Environment: SDIST (here) the llama-cpp-python sdist folder; NPL the parallel sequence
# counts (default 8,32,64,128,256); DEPTHS the context depths of the decode-at-depth rows
# (default 4096,32000). Results go to $OUT (else /tmp/gpu-compare).
set -u
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${OUT:-/tmp/gpu-compare}
gpu=/tmp/hablar-gpu
lcp=/tmp/llamacpp-cuda
npl=${NPL:-8,32,64,128,256}
depths=${DEPTHS:-4096,32000}

pack() {
  local sdist=${SDIST:-/work/llamacpp/llama_cpp_python-0.3.36} skip=() b
  bash "$root/scripts/gpu-serving.sh" pack || exit 1
  for b in virtgpu cann openvino webgpu et metal hexagon sycl vulkan opencl zdnn; do
    skip+=(--exclude="llama.cpp/ggml/src/ggml-$b")
  done
  tar czf "$root/.gpu/llamacpp-src.tar.gz" -C "$sdist/vendor" "${skip[@]}" \
    --exclude=llama.cpp/docs --exclude=llama.cpp/models --exclude=llama.cpp/examples \
    --exclude=llama.cpp/tests --exclude=llama.cpp/media --exclude=llama.cpp/.git llama.cpp
  du -sh "$root/.gpu/llamacpp-src.tar.gz"
}

unpack_hablar() {
  mkdir -p "$out"
  [ -z "${hablar_unpacked:-}" ] || return 0  # once a process (ab's serving runs reuse it)
  hablar_unpacked=1
  rm -rf "$gpu" && mkdir -p "$gpu" && tar xJf "$root/.gpu/bin.tar.xz" -C "$gpu"
  export LD_LIBRARY_PATH="$gpu/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
}

build_llamacpp() {
  # A warm machine keeps /tmp between calls: a build of the same archive is reused.
  local sum
  sum=$(md5sum <"$root/.gpu/llamacpp-src.tar.gz")
  if [ -x "$lcp/build/bin/llama-server" ] && [ "$(cat "$lcp/src.md5" 2>/dev/null)" = "$sum" ]; then
    return 0
  fi
  rm -rf "$lcp" && mkdir -p "$lcp" && tar xzf "$root/.gpu/llamacpp-src.tar.gz" -C "$lcp"
  cmake -S "$lcp/llama.cpp" -B "$lcp/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DBUILD_SHARED_LIBS=OFF -DLLAMA_CURL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF >"$out/llamacpp-cmake.txt" 2>&1 &&
    ninja -C "$lcp/build" -j16 llama-bench llama-batched-bench llama-server \
      >"$out/llamacpp-build.txt" 2>&1 && echo "$sum" >"$lcp/src.md5"
}

make_model() {  # shape -> path of a Q4_K_M file
  local file=/tmp/$1-q4_k_m.gguf arch=qwen2
  case $1 in
    llama*) arch=llama ;; moe-small | qwen3-30b-a3b) arch=qwen3moe ;; mixtral*) arch=mixtral ;;
    qwen3*) arch=qwen3 ;; gemma3*) arch=gemma3 ;;
  esac
  [ -f "$file" ] || "$gpu/bin/hablar" make-model --arch $arch --shape "$1" --type q4_k_m \
    -o "$file" >/dev/null 2>&1
  echo "$file"
}

run() {
  local shapes=("$@") shape m
  [ ${#shapes[@]} -gt 0 ] || shapes=(qwen2.5-1.5b)
  unpack_hablar
  nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee "$out/gpu.txt"
  local t0=$SECONDS
  build_llamacpp &
  local build_pid=$!
  for shape in "${shapes[@]}"; do make_model "$shape" >/dev/null; done
  wait $build_pid || { tail -20 "$out/llamacpp-build.txt"; exit 1; }
  echo "llama.cpp built and models made in $((SECONDS - t0)) s"
  local bin=$lcp/build/bin h=$gpu/bin/hablar
  for shape in "${shapes[@]}"; do
    m=$(make_model "$shape")
    "$bin/llama-bench" -m "$m" -ngl 99 -p 512 -n 128 -fa 0,1 -r 3 -o json \
      >"$out/$shape-llama-bench.json" 2>"$out/$shape-llama-bench.err"
    "$bin/llama-batched-bench" -m "$m" -ngl 99 -fa on -c $((256 * 256 + 512)) -b 2048 -ub 512 \
      -npp 128 -ntg 128 -npl "$npl" --output-format jsonl \
      >"$out/$shape-llama-batched.jsonl" 2>"$out/$shape-llama-batched.err"
    "$h" bench -m "$m" --device cuda -p 512 -n 128 -r 3 -o json \
      >"$out/$shape-hablar-bench.json" 2>"$out/$shape-hablar-bench.err"
    # Decode at depth (long contexts: the split-K attention), both tools on the same depths.
    "$bin/llama-bench" -m "$m" -ngl 99 -p 0 -n 64 -d "$depths" -fa 0,1 -r 2 -o json \
      >"$out/$shape-llama-bench-depth.json" 2>"$out/$shape-llama-bench-depth.err"
    "$h" bench -m "$m" --device cuda -p 0 -n 64 -d "$depths" -r 2 -o json \
      >"$out/$shape-hablar-bench-depth.json" 2>"$out/$shape-hablar-bench-depth.err"
    "$h" batched-bench -m "$m" --device cuda -npp 128 -ntg 128 -npl "$npl" -o json \
      >"$out/$shape-hablar-batched.json" 2>"$out/$shape-hablar-batched.err"
    python3 "$root/bench/gpu/compare_table.py" --dir "$out" --shape "$shape" |
      tee "$out/$shape-table.md"
  done
}

# Steps, and the seconds of prompt and decode work, from hablar's /metrics.
engine_counters() {
  curl -s "localhost:$1/metrics" | grep -E "^hablar_(steps_total|steps_launched_ahead_total|prompt_seconds_total|decode_seconds_total|generated_tokens_total|executor_host_seconds_total|executor_wait_seconds_total|executor_device_seconds_total|executor_stage_seconds_total|engine_schedule_seconds_total|engine_emit_seconds_total) "
}

wait_health() {
  for _ in $(seq 180); do curl -sf "localhost:$1/health" >/dev/null && return 0; sleep 1; done
  return 1
}

serve() {
  local shape=${1:-qwen2.5-1.5b} m levels=${LEVELS:-1,16,64,256} pid
  unpack_hablar
  python3 -m pip install -q --no-index --no-deps --target /tmp/site "$root"/.whl/*.whl >/dev/null 2>&1
  export PYTHONPATH=/tmp/site
  m=$(make_model "$shape")
  # Token-id prompts: make-model's vocabulary spells words byte by byte, so 512 words of text
  # would be about 3,700 tokens (and 256 of them more than the KV pool holds).
  # shellcheck disable=SC2206  # BENCH_ARGS: flags, split on purpose
  local bench=("$root/bench/serving/bench_serving.py" --input-len 512 --output-len 128
    --concurrency "$levels" --ignore-eos --token-ids 1000:30000 --requests-per-level "${REQUESTS:-0}"
    ${BENCH_ARGS:-})
  "$gpu/bin/hablar" serve -m "$m" --device cuda -np 256 -c "${SERVE_CTX:-$((256 * 640))}" -b "${SERVE_BATCH:-2048}" --port 8413 --metrics \
    ${SERVE_ARGS:-} >"$out/$shape-serve.log" 2>&1 &
  pid=$!
  wait_health 8413 || { tail -5 "$out/$shape-serve.log"; return 1; }
  engine_counters 8413 | tee "$out/$shape-counters-before.txt"
  python3 "${bench[@]}" --base-url http://127.0.0.1:8413 --label hablar \
    --out "$out/$shape-serving-hablar.json" 2>&1 | tail -12
  engine_counters 8413 | tee "$out/$shape-counters-after.txt"
  kill $pid && wait $pid
  [ -x "$lcp/build/bin/llama-server" ] || return 0
  "$lcp/build/bin/llama-server" -m "$m" -ngl 99 -np 256 -cb -fa on -c $((256 * 640)) --port 8414 \
    >"$out/$shape-llama-server.log" 2>&1 &
  pid=$!
  wait_health 8414 || { tail -5 "$out/$shape-llama-server.log"; return 1; }
  python3 "${bench[@]}" --base-url http://127.0.0.1:8414 --label llama-server \
    --out "$out/$shape-serving-llama.json" 2>&1 | tail -12
  kill $pid && wait $pid
  python3 "$root/bench/serving/bench_serving.py" --compare "$out/$shape-serving-hablar.json" \
    "$out/$shape-serving-llama.json" 2>&1 | tail -20
}

profile() {
  local shape=${1:-qwen2.5-1.5b} m
  unpack_hablar
  m=$(make_model "$shape")
  # tg16 after a warm-up of 16: skip the warm-up's and the first measured step's launches.
  ncu --clock-control none --metrics gpu__time_duration.sum --csv --launch-skip 3000 \
    --launch-count 1200 "$gpu/bin/hablar" bench -m "$m" --device cuda -p 0 -n 16 -r 1 \
    >"$out/ncu.csv" 2>"$out/ncu.err"
  python3 "$root/bench/gpu/compare_table.py" --ncu "$out/ncu.csv" | tee "$out/ncu-summary.txt"
}

# A prompt step's kernels (batched-bench: one prefill step of NPL x LEN tokens, then one
# decode step; its warm-up step is profiled too, so per-kernel shares are what to read).
profile_prompt() {
  local shape=${1:-qwen2.5-1.5b} m npl=${PROMPT_NPL:-4} len=${PROMPT_LEN:-512}
  unpack_hablar
  m=$(make_model "$shape")
  local cmd=("$gpu/bin/hablar" batched-bench -m "$m" --device cuda -npp "$len" -ntg 1
    -npl "$npl" -b $((npl * len)))
  ncu --clock-control none --cache-control none --metrics gpu__time_duration.sum --csv \
    "${cmd[@]}" >"$out/ncu-prompt.csv" 2>"$out/ncu-prompt.err"
  python3 "$root/bench/gpu/compare_table.py" --ncu "$out/ncu-prompt.csv" |
    tee "$out/ncu-prompt-summary.txt"
  if command -v nsys >/dev/null; then
    nsys profile -o "$out/prompt" --force-overwrite true "${cmd[@]}" >/dev/null 2>&1 &&
      nsys stats -q --report cuda_gpu_kern_sum,cuda_api_sum --format csv "$out/prompt.nsys-rep" \
        2>/dev/null | head -60
  fi
}

# The kernels of serving-sized steps: batched-bench with NPL x LEN-token prompts (steps of
# -b 2048) and NTG decode steps after them; printed: the last prompt step's kernels and the
# mean decode step's (every kernel is profiled: about a minute at 256 x 512).
profile_steps() {
  local shape=${1:-qwen2.5-1.5b} m npl=${STEPS_NPL:-256} len=${STEPS_LEN:-512} ntg=${STEPS_NTG:-4}
  unpack_hablar
  m=$(make_model "$shape")
  ncu --clock-control none --cache-control none --metrics gpu__time_duration.sum --csv \
    "$gpu/bin/hablar" batched-bench -m "$m" --device cuda -npp "$len" -ntg "$ntg" -npl "$npl" \
    -b 2048 >"$out/ncu-steps.csv" 2>"$out/ncu-steps.err"
  python3 "$root/bench/gpu/compare_table.py" --ncu-steps "$out/ncu-steps.csv" |
    tee "$out/ncu-steps-summary.txt"
}

# One variant's figures: `knobs` is a space-separated list of NAME=VALUE set for its runs.
ab_variant() {
  local m=$1 knobs=$2 h=$gpu/bin/hablar pp tg serve=""
  pp=$(env $knobs "$h" bench -m "$m" --device cuda --lab-knobs -p 512,2048 -n 0 -r 3 2>/dev/null |
    awk -F'|' '/pp[0-9]/ {split($(NF-1), v, "±"); gsub(/ /, "", v[1]); printf "%s ", v[1]}')
  tg=$(env $knobs "$h" batched-bench -m "$m" --device cuda --lab-knobs -npp 512 -ntg 128 \
    -npl "${AB_NPL:-64,256}" -b 2048 2>/dev/null |
    awk -F'|' '/^\| *[0-9]/ {gsub(/ /, ""); printf "%s seqs S_PP %s S_TG %s; ", $4, $7, $9}')
  if [ "${AB_SERVE:-1}" != 0 ]; then
    rm -f "$out/ab-serve/${3:-qwen2.5-1.5b}-serving-hablar.json"  # (llama-server: not in an A/B)
    (export ${knobs?} REQUESTS=1024 LEVELS=256 SERVE_ARGS="--lab-knobs ${SERVE_ARGS:-}"
      out=$out/ab-serve lcp=/nonexistent && serve "${3:-qwen2.5-1.5b}") >"$out/ab-serve.log" 2>&1
    serve=$(python3 -c "import json,sys; d=json.load(open(sys.argv[1]))['levels'][0]; print('serve %.0f tok/s TPOT p50 %.2f ms' % (d['output_token_throughput'], d['tpot_ms']['p50']))" \
      "$out/ab-serve/${3:-qwen2.5-1.5b}-serving-hablar.json" 2>/dev/null)
    # The steps' split: the engine's schedule and emit, the executor's host (of it stage:
    # before the device's span), wait, and the device's span.
    serve+=$(awk '/^hablar_(steps_total|steps_launched_ahead_total|(executor|engine)_[a-z]+_seconds_total) / {
      sub(/^hablar_/, "", $1); sub(/_seconds_total$/, "", $1); sub(/_total$/, "", $1);
      printf " %s %.2f", $1, $2 }' "$out/ab-serve/${3:-qwen2.5-1.5b}-counters-after.txt")
  fi
  echo "[$knobs] pp512/pp2048 $pp| $tg$serve"
}

ab() {
  local shape=${1:-qwen2.5-1.5b} m variant
  [ -n "${AB:-}" ] || { echo "AB: variants separated by ';', e.g. AB=\"HABLAR_X=1;HABLAR_X=0\"" && exit 2; }
  unpack_hablar
  m=$(make_model "$shape")
  for _ in $(seq "${ROUNDS:-2}"); do
    IFS=';' read -ra variants <<<"$AB"
    for variant in "${variants[@]}"; do ab_variant "$m" "$variant" "$shape"; done
  done
}

case "${1:-}" in
  pack) pack ;;
  run) shift && run "$@" ;;
  serve) shift && serve "$@" ;;
  profile) shift && profile "$@" ;;
  profile-prompt) shift && profile_prompt "$@" ;;
  profile-steps) shift && profile_steps "$@" ;;
  ab) shift && ab "$@" ;;
  *) sed -n '2,/Results go to/p' "$0" && exit 2 ;;
esac
