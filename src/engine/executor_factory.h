// Choosing and building the executor a command runs on: the CPU, or the CUDA device when
// the build has the backend and a device is present (`--device auto`).
#pragma once

#include <memory>
#include <string>

#include "engine/cuda_executor.h"
#include "engine/executor.h"
#include "model/model.h"

namespace hablar::engine {

enum class DeviceKind { kAuto, kCpu, kCuda };
// "auto", "cpu", "cuda"; throws Error(kInvalidArgument) for another name.
DeviceKind device_kind_from_name(const std::string& name);
// "f16", "bf16", "q8_0", "q4_0" (llama.cpp's --cache-type names); throws Error(kInvalidArgument)
// for another.
KvDType kv_dtype_from_name(const std::string& name);

struct ExecutorOptions {
  DeviceKind device = DeviceKind::kAuto;
  int n_threads = 0;      // CPU threads (0: every core)
  int32_t kv_tokens = 0;  // KV cache positions; 0: 8192 on the CPU, free memory on the GPU
  // llama.cpp's -ngl: -1 unset; 0 the CPU; >= the layer count the GPU; between: an error
  // (partial offload is not supported).
  int n_gpu_layers = -1;
  // The KV cache's element types (--cache-type-k / --cache-type-v): F16, or on the CPU also
  // Q8_0 / Q4_0 (the GPU refuses those).
  KvDType cache_type_k = KvDType::F16, cache_type_v = KvDType::F16;
  CudaExecutorOptions cuda;
};

// The device the options resolve to for this model (auto: CUDA when built and present).
DeviceKind resolve_device(const model::Model& model, const ExecutorOptions& o);
std::unique_ptr<StepExecutor> make_executor(const model::Model& model, const ExecutorOptions& o);

}  // namespace hablar::engine
