#!/usr/bin/env bash
# GPU serving checks on a CUDA machine (the `device` tool), with binaries built here.
#
#   scripts/gpu-serving.sh pack          build hablar and the GPU test binaries here and pack
#                                        hablar, the host twins, the shared libraries a bare
#                                        GPU machine lacks and the test vocabulary into
#                                        .gpu/bin.tar.xz, the rest into .gpu/tests1.tar.xz
#                                        (kernel tests, cuda_bench), tests2.tar.xz (engine and
#                                        embedding tests) and tests3.tar.xz (parity), and the
#                                        real models into .gpu/<model>.partN (ignored by git;
#                                        each call of the device tool carries at most 64 MiB,
#                                        the tree included: bin.tar.xz beside one tests archive
#                                        a call; SmolLM2 travels in four pieces, Gemma 3 in five)
#   scripts/gpu-serving.sh pack-site     the client libraries the server suite imports (.whl's,
#                                        plus langchain_openai, litellm and their dependencies),
#                                        for the GPU machine's Python 3.12, installed into a
#                                        folder here and packed into .gpu/site.part0..1
#   scripts/gpu-serving.sh model-part M N
#                                        on the GPU machine: save .gpu/M.partN (M: smollm2,
#                                        gemma3 or site) to /tmp/hablar-model/
#   scripts/gpu-serving.sh tests         on the GPU machine: the CUDA kernel tests, the engine
#                                        over the CUDA executor, GPU-vs-CPU parity in both
#                                        modes (PARITY_FILTER: a gtest filter; REFERENCE=1: the
#                                        float32 reference comparison too); each binary of the
#                                        tests archives carried in this call (others are named
#                                        as not carried)
#   scripts/gpu-serving.sh embed         on the GPU machine: gpu_embed_tests (CUDA embeddings
#                                        against the CPU's) and BERT-base embedding throughput
#                                        (also part of `tests`)
#   scripts/gpu-serving.sh report        on the GPU machine: bench of a make-model
#                                        qwen2.5-1.5b Q4_K_M file (tg128, pp512) and the
#                                        aggregate decode of 1/16/64 parallel clients
#   scripts/gpu-serving.sh grammar-speed on the GPU machine: decode speed of SmolLM2 with and
#                                        without a JSON Schema (bench/grammar/decode_speed.py),
#                                        one sequence and 16 at once
#   scripts/gpu-serving.sh server        on the GPU machine: the server pytest suite against
#                                        `hablar serve` on the GPU, then a compute-sanitizer
#                                        memcheck of a short batched serving run
# Logs go to $OUT (else /tmp/gpu-serving).
set -u
root=$(cd "$(dirname "$0")/.." && pwd)
gpu=/tmp/hablar-gpu  # where the binaries are unpacked on the GPU machine
mode=${1:-}
log=${OUT:-/tmp/gpu-serving}

pack() {
  local build=$root/build stage
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null || exit 1
  ninja -C "$build" hablar gpu_parity_tests gpu_embed_tests engine_model_tests cuda_kernel_tests \
    cuda_cpu_rounding_host_tests cuda_moe_host_twin_tests cuda_bench || exit 1
  stage=$(mktemp -d)
  mkdir -p "$stage/bin" "$stage/lib" "$stage/testdata/vocab" "$root/.gpu"
  for b in src/cli/hablar tests/unit/engine/gpu_parity_tests tests/unit/engine/gpu_embed_tests \
    tests/unit/engine/engine_model_tests \
    tests/unit/cuda/cuda_kernel_tests tests/unit/cuda/cuda_cpu_rounding_host_tests \
    tests/unit/cuda/cuda_moe_host_twin_tests bench/cuda/cuda_bench; do
    strip -o "$stage/bin/$(basename "$b")" "$build/$b"
  done
  for b in "$stage"/bin/*; do
    ldd "$b" | awk '/spdlog|fmt|gtest|httplib|utf8proc|pcre2|brotli|libz\.|ssl|crypto/ {print $3}'
  done | sort -u | while read -r lib; do cp -L "$lib" "$stage/lib/"; done
  # Every vocabulary the synthetic parity models name (phi2's GPT-2 one among them).
  grep -ho '"vocab": *"[^"]*"' "$root"/tests/golden/model/synthetic-*.json | cut -d'"' -f4 |
    sort -u | grep . | while read -r v; do
    cp "$root/../shared/testdata/vocab/$v" "$stage/testdata/vocab/"
  done
  cp -r "$root/../shared/testdata/chat-templates" "$stage/testdata/"
  rm -f "$root"/.gpu/tests*.tar.xz
  tar cf - -C "$stage" bin/cuda_kernel_tests bin/cuda_bench | xz -T2 >"$root/.gpu/tests1.tar.xz"
  tar cf - -C "$stage" bin/engine_model_tests bin/gpu_embed_tests | xz -T2 >"$root/.gpu/tests2.tar.xz"
  tar cf - -C "$stage" bin/gpu_parity_tests | xz -T2 >"$root/.gpu/tests3.tar.xz"
  tar cf - -C "$stage" bin/hablar bin/cuda_cpu_rounding_host_tests bin/cuda_moe_host_twin_tests \
    lib testdata | xz -T2 >"$root/.gpu/bin.tar.xz"
  rm -rf "$stage"
  local models=${HABLAR_HOME:-$HOME/.cache/hablar}/models
  rm -f "$root"/.gpu/{smollm2,gemma3}.part*
  split -n 4 -d -a 1 "$models/SmolLM2-135M-Instruct.Q4_1.gguf" "$root/.gpu/smollm2.part"
  if [ -f "$models/gemma-3-270m-q4_k_m.gguf" ]; then
    split -n 5 -d -a 1 "$models/gemma-3-270m-q4_k_m.gguf" "$root/.gpu/gemma3.part"
  fi
  du -sh "$root"/.gpu/*
}
# The suite's client libraries: .whl and those beyond it. The GPU machine has no network: download here for its
# interpreter (CPython 3.12, manylinux x86_64), skip what .whl or the machine already has, drop
# litellm's proxy web UI (never imported), and split the archive so that each part fits a call
# beside a model part.
pack_site() {
  local wheels site platforms=()
  wheels=$(mktemp -d) site=$(mktemp -d)
  for p in manylinux2014_x86_64 manylinux_2_17_x86_64 manylinux_2_28_x86_64 manylinux1_x86_64 \
    manylinux_2_5_x86_64 any; do platforms+=(--platform "$p"); done
  "$root/.venv/bin/python" -m pip download -q langchain_openai litellm lazy_importer -d "$wheels" \
    --python-version 3.12 --only-binary=:all: "${platforms[@]}" || exit 1
  local keep=()
  for w in "$wheels"/*.whl; do
    local name
    name=$(basename "$w" | cut -d- -f1)
    case "$name" in
      botocore | boto3 | s3transfer | hf_xet | huggingface_hub | tokenizers) continue ;;
    esac
    ls "$root"/.whl/"$name"-*.whl >/dev/null 2>&1 || keep+=("$w")
  done
  keep+=("$root"/.whl/*.whl)
  "$root/.venv/bin/python" -m pip install -q --no-index --no-deps --target "$site" \
    --python-version 3.12 --only-binary=:all: "${platforms[@]}" "${keep[@]}" || exit 1
  rm -rf "$site/litellm/proxy/_experimental"
  find "$site" -name __pycache__ -prune -exec rm -rf {} +
  mkdir -p "$root/.gpu" && rm -f "$root"/.gpu/site.part*
  tar cf - -C "$site" . | xz -T2 -9e | split -n 2 -d -a 1 - "$root/.gpu/site.part" 2>/dev/null ||
    { tar cf - -C "$site" . | xz -T2 -9e >"$wheels/site.tar.xz" &&
      split -n 2 -d -a 1 "$wheels/site.tar.xz" "$root/.gpu/site.part"; }
  rm -rf "$wheels" "$site"
  du -sh "$root"/.gpu/site.part*
}

setup_env() {
  mkdir -p "$log"
  if [ -f "$root/.gpu/bin.tar.xz" ]; then
    rm -rf "$gpu" && mkdir -p "$gpu" && tar xJf "$root/.gpu/bin.tar.xz" -C "$gpu"
  fi
  local archive
  for archive in "$root"/.gpu/tests*.tar.xz; do
    [ -f "$archive" ] && tar xJf "$archive" -C "$gpu"
  done
  export LD_LIBRARY_PATH="$gpu/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
  export HABLAR_SOURCE_DIR=$root HABLAR_TESTDATA=$gpu/testdata HABLAR_HOME=/tmp/hablar-home
  mkdir -p /tmp/hablar-home/models
  assemble smollm2 4 SmolLM2-135M-Instruct.Q4_1.gguf
  assemble gemma3 5 gemma-3-270m-q4_k_m.gguf
}

# Whether this call carried test binary $1 (a tests archive of `pack`); says so when not.
carried() {
  [ -x "$gpu/bin/$1" ] && return 0
  echo "$1: not carried in this call (.gpu/tests1..3.tar.xz)"
  return 1
}

# The model file from its N pieces, once all of them have arrived.
assemble() {
  local name=$1 n=$2 file=/tmp/hablar-home/models/$3 parts=() i
  for ((i = 0; i < n; ++i)); do parts+=("/tmp/hablar-model/$name.part$i"); done
  if [ -f "${parts[n - 1]}" ] && [ ! -f "$file" ]; then cat "${parts[@]}" >"$file"; fi
}

tests() {
  setup_env
  nvidia-smi -L
  # The host twins on this machine's CPU too: the deterministic mode follows the host's libm.
  for t in cuda_cpu_rounding_host_tests cuda_moe_host_twin_tests; do
    [ -x "$gpu/bin/$t" ] && "$gpu/bin/$t" 2>&1 | tail -1
  done
  if carried cuda_kernel_tests; then
    "$gpu/bin/cuda_kernel_tests" >"$log/kernel_tests.txt" 2>&1
    tail -3 "$log/kernel_tests.txt"
  fi
  if carried engine_model_tests; then
    "$gpu/bin/engine_model_tests" >"$log/engine_model_tests.txt" 2>&1
    tail -3 "$log/engine_model_tests.txt"
  fi
  carried gpu_embed_tests && embed_checks
  carried gpu_parity_tests || return 0
  HABLAR_PARITY_DUMP=/tmp/parity "$gpu/bin/gpu_parity_tests" --gtest_filter="${PARITY_FILTER:-*}" 2>&1 |
    tee "$log/gpu_parity.txt" | grep -E "GPU \(|smollm2|gemma3|concurrent|FAILED|PASSED|Failure" |
    head -120
  [ -n "${REFERENCE:-}" ] || return 0  # the float32 reference comparison: REFERENCE=1
  python3 -m pip install -q --no-index --no-deps --target /tmp/site-gguf "$root"/.whl/gguf-*.whl
  local name file
  for name in smollm2:SmolLM2-135M-Instruct.Q4_1.gguf gemma3-270m:gemma-3-270m-q4_k_m.gguf; do
    file=/tmp/parity-${name%%:*}.json
    [ -f "$file" ] || continue
    echo "== ${name%%:*} against a float32 reference"
    PYTHONPATH=/tmp/site-gguf python3 "$root/tools/gpu_vs_reference.py" --dump "$file" \
      --model "/tmp/hablar-home/models/${name#*:}" 2>&1 |
      tee "$log/reference-${name%%:*}.txt" | grep -vi "warn" | tail -5
  done
}

# CUDA embeddings against the CPU's (every pooling), then BERT-base throughput (512 inputs
# of 128 tokens, one step; device time per kind of op from `hablar embed --profile`).
embed_checks() {
  "$gpu/bin/gpu_embed_tests" 2>&1 | tee "$log/gpu_embed_tests.txt" |
    grep -E "worst|largest|FAILED|PASSED|Failure" | head -80
  "$gpu/bin/hablar" make-model --arch bert --shape bert-base --type f16 -o /tmp/bert-base.gguf \
    >/dev/null 2>&1 || return 1
  for tokens in 65536 8192; do
    "$gpu/bin/hablar" embed -m /tmp/bert-base.gguf --device cuda --profile \
      --bench 512x128 --batch-tokens $tokens 2>&1 | tail -2 | tee -a "$log/gpu_embed_tests.txt"
  done
}

report() {
  setup_env
  local h=$gpu/bin/hablar m=/tmp/q15.gguf
  "$h" make-model --arch qwen2 --shape qwen2.5-1.5b --type q4_k_m -o $m >/dev/null 2>&1
  for mode in "" --deterministic; do
    echo "== qwen2.5-1.5b shape, Q4_K_M ${mode:-(default mode)}" | tee -a "$log/bench.txt"
    "$h" bench -m $m -p 512 -n 128 -r 3 --device cuda $mode 2>&1 | tee -a "$log/bench.txt" |
      grep -E "pp512|tg128"
    "$h" serve -m $m --port 8411 --device cuda -np 64 -b 2048 -c 65536 $mode \
      >"$log/serve_report$mode.txt" 2>&1 &
    local pid=$!
    for _ in $(seq 120); do curl -sf localhost:8411/health >/dev/null && break; sleep 1; done
    for n in 1 16 64; do
      python3 "$root/bench/gpu/aggregate_decode.py" --base-url http://127.0.0.1:8411 --clients $n
    done 2>&1 | tee -a "$log/aggregate.txt"
    kill $pid; wait $pid
  done
}

server() {
  setup_env
  if [ -f /tmp/hablar-model/site.part1 ]; then  # from pack-site, carried in two calls
    mkdir -p /tmp/site && cat /tmp/hablar-model/site.part{0,1} | tar xJf - -C /tmp/site
    for w in "$root"/.gpu/*.whl; do  # wheels added after the site was packed
      [ -f "$w" ] && python3 -m pip install -q --no-index --no-deps --target /tmp/site "$w"
    done
  else
    python3 -m pip install -q --no-index --no-deps --target /tmp/site "$root"/.whl/*.whl 2>&1 |
      tail -2
  fi
  export PYTHONPATH=/tmp/site HABLAR_BIN=$gpu/bin/hablar HABLAR_SERVE_ARGS="--device cuda --gpu-memory-utilization 0.1 ${SERVE_MODE:-}"
  # SIGINT at the time limit: pytest stops and still prints the summary of what ran.
  (cd "$root" && timeout -s INT "${SUITE_SECONDS:-470}" python3 -m pytest ${SUITE_TESTS:-tests/server} -q -rfE \
    -p no:cacheprovider --deselect tests/server/test_browser.py 2>&1 |
    tee "$log/server_pytest.txt" | grep -vE "^\s*$" | tail -40)
  [ -n "${MEMCHECK-1}" ] || return 0  # MEMCHECK= skips it
  # memcheck over a short serving run: four requests at once (prefill and batched decode
  # steps, graphs captured and replayed), then SIGTERM to hablar itself so that the
  # sanitizer sees it exit and writes its summary.
  local h=$gpu/bin/hablar
  compute-sanitizer --tool memcheck --log-file "$log/memcheck.txt" "$h" serve --port 8412 \
    --device cuda -np 4 -c 4096 >"$log/memcheck_serve.txt" 2>&1 &
  local pid=$! pids=()
  for _ in $(seq 300); do curl -sf localhost:8412/health >/dev/null && break; sleep 1; done
  for i in 1 2 3 4; do
    curl -s localhost:8412/v1/chat/completions -H 'Content-Type: application/json' \
      -d "{\"messages\":[{\"role\":\"user\",\"content\":\"Count to $i\"}],\"max_tokens\":12}" \
      -o "$log/memcheck_reply$i.json" &
    pids+=($!)
  done
  wait "${pids[@]}"
  pkill -TERM -x hablar
  wait $pid
  echo "memcheck: $(grep -c choices "$log"/memcheck_reply*.json) replies;" \
    "$(grep -h "ERROR SUMMARY" "$log/memcheck.txt")"
}

grammar_speed() {
  setup_env
  python3 -m pip install -q --no-index --no-deps --target /tmp/site "$root"/.whl/*.whl 2>&1 | tail -2
  "$gpu/bin/hablar" serve --port 8413 --device cuda -np 16 -c 32768 >"$log/grammar_serve.txt" 2>&1 &
  local pid=$!
  for _ in $(seq 120); do curl -sf localhost:8413/health >/dev/null && break; sleep 1; done
  for n in 1 16; do
    PYTHONPATH=/tmp/site python3 "$root/bench/grammar/decode_speed.py" --url http://127.0.0.1:8413 \
      --runs "${RUNS:-7}" --parallel $n
  done 2>&1 | tee "$log/grammar_speed.txt"
  kill $pid
  wait $pid
}

case "$mode" in
  pack) pack ;;
  pack-site) pack_site ;;
  model-part) mkdir -p /tmp/hablar-model && cp "$root/.gpu/$2.part$3" /tmp/hablar-model/ &&
    ls -la /tmp/hablar-model ;;
  tests) tests ;;
  embed) setup_env && carried gpu_embed_tests && embed_checks ;;
  report) report ;;
  server) server ;;
  grammar-speed) grammar_speed ;;
  *) sed -n 2,25p "$0"; exit 2 ;;
esac
