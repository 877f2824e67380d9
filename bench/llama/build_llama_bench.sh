#!/usr/bin/env bash
# Builds llama.cpp's CPU llama-bench (the peer of bench/llama/compare.py) from the sources
# vendored in the PyPI sdist llama-cpp-python==0.3.36, into ~/.cache/hablar/llama-bench/.
# The sdist comes from PyPI (pip download); nothing else is fetched. Takes ~10 minutes on
# 2 cores. Usage: bash bench/llama/build_llama_bench.sh
set -euo pipefail
cache="${HABLAR_CACHE:-$HOME/.cache/hablar}/llama-bench"
version=0.3.36
mkdir -p "$cache"
if [ -x "$cache/llama-bench" ]; then
  echo "llama-bench already built: $cache/llama-bench"
  exit 0
fi
work="$cache/src"
mkdir -p "$work"
sdist="$work/llama_cpp_python-$version.tar.gz"
if [ ! -f "$sdist" ]; then
  python3 -m pip download --no-deps --no-binary :all: "llama-cpp-python==$version" -d "$work"
fi
tar xzf "$sdist" -C "$work"
src="$work/llama_cpp_python-$version/vendor/llama.cpp"
# Native build (the machine's own instruction sets, as llama.cpp's default), no shared libs.
# Without AMX: on a CPU that has it, this version's AMX matmul path crashes (SIGSEGV in
# ggml_backend_amx_mul_mat at the first prompt of a Q4_K_M model, 2026-12-02), so the peer
# runs its AVX-512 kernels as on the machines without AMX.
no_amx=""
if grep -q amx_int8 /proc/cpuinfo 2>/dev/null; then
  no_amx="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
fi
cmake -S "$src" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
  -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DGGML_NATIVE=ON \
  -DCMAKE_C_FLAGS="$no_amx" -DCMAKE_CXX_FLAGS="$no_amx" >"$work/cmake.log" 2>&1
ninja -C "$work/build" llama-bench >"$work/build.log" 2>&1
cp "$work/build/bin/llama-bench" "$cache/llama-bench"
echo "built $cache/llama-bench"
