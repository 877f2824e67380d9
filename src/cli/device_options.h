// The flags that choose where a command runs (run, bench, perplexity; serve has its own
// copy beside its other flags): --device, -ngl, --gpu-memory-utilization, --deterministic.
#pragma once

#include <CLI/CLI.hpp>

#include <memory>
#include <string>

#include "engine/executor_factory.h"

namespace hablar::cli {

struct DeviceFlags {
  std::string device = "auto";
  int n_gpu_layers = -1;
  double gpu_memory_utilization = 0.9;
  bool deterministic = false;

  void add_to(CLI::App& app) {
    app.add_option("--device", device, "where the model runs: auto (CUDA when present), cpu, cuda")
        ->capture_default_str();
    app.add_option("--n-gpu-layers", n_gpu_layers,
                   "layers on the GPU (-ngl): 0 the CPU, >= the layer count all of them");
    app.add_option("--gpu-memory-utilization", gpu_memory_utilization,
                   "share of the GPU's memory to use")
        ->capture_default_str();
    app.add_flag("--deterministic", deterministic, "GPU: batch-invariant kernels (slower)");
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
    return o;
  }
};

}  // namespace hablar::cli
