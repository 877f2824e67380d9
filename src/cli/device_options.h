// The flags that choose where a command runs (run, bench, perplexity; serve has its own
// copy beside its other flags): --device, -ngl, --gpu-memory-utilization, --deterministic,
// --cache-type-k / --cache-type-v, --lab-knobs.
#pragma once

#include <CLI/CLI.hpp>

#include <memory>
#include <string>

#include "backend/cuda/lab_knobs.h"
#include "engine/executor_factory.h"

namespace hablar::cli {

// -ctk/--cache-type-k and -ctv/--cache-type-v, llama.cpp's names: f16, bf16, q8_0, q4_0.
inline void add_cache_type_flags(CLI::App& app, std::string& k, std::string& v) {
  app.add_option("--cache-type-k", k,
                 "KV cache type of K: f16, bf16, q8_0 or q4_0 (q4_0: CPU only; the GPU takes "
                 "K and V of one type)")
      ->check(CLI::IsMember({"f16", "bf16", "q8_0", "q4_0"}))
      ->capture_default_str();
  app.add_option("--cache-type-v", v, "KV cache type of V: f16, bf16, q8_0 or q4_0")
      ->check(CLI::IsMember({"f16", "bf16", "q8_0", "q4_0"}))
      ->capture_default_str();
}

// --no-bf16-copies: the GPU keeps no bf16 copies of the weight matrices.
inline void add_no_bf16_copies_flag(CLI::App& app, bool& no_copies) {
  app.add_flag("--no-bf16-copies", no_copies,
               "GPU: keep no bf16 copies of the weight matrices (2 bytes per weight, made where "
               "they take at most half of the memory left; prompts and steps of many sequences "
               "multiply them) and leave that memory to the KV cache");
}

// --no-step-ahead: the GPU runs one engine step at a time.
inline void add_no_step_ahead_flag(CLI::App& app, bool& no_ahead) {
  app.add_flag("--no-step-ahead", no_ahead,
               "GPU: launch each engine step only once the last one's tokens reached the host "
               "(by default the next step is launched first, its tokens fed on the device, so "
               "the host's work between steps overlaps the device's)");
}

// --lab-knobs: the HABLAR_* tuning knobs of docs/CUDA.md read from the environment.
inline void add_lab_knobs_flag(CLI::App& app) {
  app.add_flag_callback(
      "--lab-knobs", [] { cuda::enable_lab_knobs(); },
      "GPU, for measuring kernel variants: read the HABLAR_* tuning knobs of docs/CUDA.md "
      "from the environment (without it none is read)");
}

struct DeviceFlags {
  std::string device = "auto";
  int n_gpu_layers = -1;
  double gpu_memory_utilization = 0.9;
  bool deterministic = false;
  bool no_bf16_copies = false;
  bool no_step_ahead = false;
  std::string cache_type_k = "f16", cache_type_v = "f16";

  void add_to(CLI::App& app) {
    add_cache_type_flags(app, cache_type_k, cache_type_v);
    app.add_option("--device", device, "where the model runs: auto (CUDA when present), cpu, cuda")
        ->capture_default_str();
    app.add_option("--n-gpu-layers", n_gpu_layers,
                   "layers on the GPU (-ngl): 0 the CPU, >= the layer count all of them");
    app.add_option("--gpu-memory-utilization", gpu_memory_utilization,
                   "share of the GPU's memory to use")
        ->capture_default_str();
    app.add_flag("--deterministic", deterministic, "GPU: batch-invariant kernels (slower)");
    add_no_bf16_copies_flag(app, no_bf16_copies);
    add_no_step_ahead_flag(app, no_step_ahead);
    add_lab_knobs_flag(app);
  }
  // Options for an executor of `kv_tokens` positions running steps of up to `step_tokens`.
  engine::ExecutorOptions options(int n_threads, int32_t kv_tokens, int32_t step_tokens) const {
    engine::ExecutorOptions o;
    o.device = engine::device_kind_from_name(device);
    o.n_threads = n_threads;
    o.kv_tokens = kv_tokens;
    o.n_gpu_layers = n_gpu_layers;
    o.cuda.gpu_memory_utilization = gpu_memory_utilization;
    o.cuda.max_step_tokens = step_tokens;
    o.cuda.max_seq_len = kv_tokens;
    o.cuda.deterministic = deterministic;
    o.cuda.bf16_weight_copies = !no_bf16_copies;
    o.cuda.launch_ahead = !no_step_ahead;
    o.cache_type_k = engine::kv_dtype_from_name(cache_type_k);
    o.cache_type_v = engine::kv_dtype_from_name(cache_type_v);
    return o;
  }
};

}  // namespace hablar::cli
