// The CUDA executor: the model's forward (model/forward.h) over the CUDA backend's ops
// (backend/cuda/forward_ops.h), weights uploaded once in their file types, the paged KV
// cache in device memory sized from what is free, and sampling on the device, so a step
// copies only the sampled ids back (and logits rows only for requests that sample on the
// host: log-probabilities, logit bias, grammars).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "engine/executor.h"
#include "model/model.h"

namespace hablar::engine {

struct CudaExecutorOptions {
  int32_t kv_tokens = 0;                // KV cache positions; 0: from free memory
  double gpu_memory_utilization = 0.9;  // share of the device's memory hablar may hold
  int32_t max_step_tokens = 512;        // token rows of one step
  int32_t max_seq_len = 0;              // the longest sequence; 0: the model's trained context
  bool deterministic = false;           // batch-invariant kernels (forward_ops.h)
  // Steps of many rows (prompt chunks, decode steps from cuda::kept_bf16_min_rows()
  // sequences) multiply bf16 copies of the dense matrices, kept on the device when they take
  // at most half of the memory left after weights and step buffers (--no-bf16-copies: off).
  bool bf16_weight_copies = true;
  // Embedding steps: device time per kind of op, printed to stderr when the executor goes
  // (`hablar embed --profile`; the events synchronize nothing but cost a little).
  bool profile_embeddings = false;
  // One-token decode steps as one persistent launch (backend/cuda/persistent_step.h) where
  // the model's forward and weights allow it, outside deterministic mode. Experimental, off
  // by default: on the H200 it is still slower than the launch-per-op graph
  // (docs/PERFORMANCE.md); `hablar bench --persistent-decode` measures it.
  bool persistent_decode = false;
  // The persistent one-token step's phases timed on the device (%globaltimer), summed per
  // kind and printed to stderr when the executor goes (`hablar bench --profile`).
  bool profile_decode = false;
  // Steps launched before the last one's tokens reach the host (StepExecutor::feeds_tokens:
  // a chunk's token fed from the last step's samples on the device); `--no-step-ahead` turns
  // it off, and the lab knob HABLAR_STEP_AHEAD (--lab-knobs) overrides it.
  bool launch_ahead = true;
  // The cache's element types (cuda_takes_cache: the constructor refuses the others).
  KvDType cache_type_k = KvDType::F16, cache_type_v = KvDType::F16;
};

// Whether the CUDA attention takes a KV cache of these types in this mode: F16, BF16 and
// (outside deterministic mode) Q8_0, K and V of one type; false with the reason otherwise.
bool cuda_takes_cache(const CudaExecutorOptions& options, std::string* reason = nullptr);

// Whether this build has the CUDA backend and a usable device; *reason says why not.
bool cuda_available(std::string* reason = nullptr);
// Whether the CUDA backend has the kernels this model needs (head sizes, GQA ratio, weight
// types, experts per token); false with the reason otherwise.
bool cuda_can_run(const model::Model& model, std::string* reason = nullptr);

// Throws Error(kUnsupported) without a device, or naming a tensor type, head size or
// attention shape the CUDA kernels do not cover.
std::unique_ptr<StepExecutor> make_cuda_executor(const model::Model& model,
                                                 const CudaExecutorOptions& options);

}  // namespace hablar::engine
