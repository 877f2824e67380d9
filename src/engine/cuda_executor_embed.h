// The CUDA executor's embedding steps (StepExecutor::can_embed / embed): the embedding
// forward (model/forward_encoder.h) over cuda::EmbedOps on the executor's stream, then each
// chunk's pooling on the device. The executor's uploaded weights serve as they are; what
// only the embedding forward reads (encoder biases and LayerNorms, token-type and position
// tables, a reranker's classifier head) is uploaded here into the same device views.
#pragma once

#include <cuda_runtime_api.h>

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backend/cuda/device_memory.h"
#include "backend/cuda/embed_ops.h"
#include "engine/executor.h"
#include "model/model.h"
#include "model/weights.h"

namespace hablar::engine {

class CudaEmbedder {
 public:
  // `weights`: the executor's device views (matrices uploaded), completed here.
  // `batch_invariant` (the executor's --deterministic): every input runs as a step of its
  // own, so its vector does not depend on what else the step holds (the products' cuBLAS
  // kernels and their summation orders depend on the row count); slower for many short
  // inputs. Otherwise a step's inputs share every product.
  // `profile`: device time per kind of op, printed when the embedder goes.
  CudaEmbedder(const model::Model& model, model::Weights& weights, cudaStream_t stream,
               bool batch_invariant, bool profile = false);
  // false, with the reason, for models the device path cannot run (mixtures of experts,
  // head sizes other than 32, 64, 128).
  bool can_embed(std::string* why) const;
  // As CpuExecutor::embed: kInvalidArgument for bad chunks, kUnsupported when !can_embed().
  // Any number of tokens per step (buffers grow to the step and stay).
  void embed(std::span<const EmbedChunk> chunks, EmbedOutput& out);
  size_t weight_bytes() const { return bytes_; }
  size_t buffer_bytes() const { return ops_ ? ops_->buffer_bytes() : 0; }

 private:
  const float* upload_floats(const float* host, int64_t n);
  WeightView upload_matrix(const WeightView& w);
  void upload_encoder_weights(model::Weights& d);
  void run(std::span<const std::span<const int32_t>> sequences, std::span<const Pooling> pooling,
           EmbedOutput& out);

  const model::Model& model_;
  const model::Weights& weights_;
  std::string unsupported_;  // empty: the device embeds this model
  bool batch_invariant_ = false;
  bool profile_ = false;
  std::vector<RopeParams> ropes_;
  std::vector<cuda::DeviceMemory> tensors_;
  size_t bytes_ = 0;
  cudaStream_t stream_;
  // Made on the first embedding step (its cuBLAS handles and buffers): a generation-only
  // server never pays for them.
  std::unique_ptr<cuda::EmbedOps> ops_;
};

}  // namespace hablar::engine
