// F16 products with a fused epilogue, through cublasLt:
//   y [m x n] F16 = act(x [m x k] · Wᵀ + b),  W row-major [n x k] F16 (a GGUF F16 weight),
// act GELU (tanh form, as cublasLt defines it) or none, b F16 [n] or absent. An encoder's FFN
// up-product then writes its GELU'd rows in the GEMM's own store instead of a separate
// read-modify-write pass over the widest rows of the layer (65,536 tokens × 3,072 F16: 0.8
// GB of traffic, ~0.24 ms on an H200, once per layer). Each shape's descriptors and the
// heuristic's first algorithm are kept (a few hundred shapes at most; the cache starts over
// beyond that, as a server's steps vary in rows).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <map>
#include <memory>
#include <tuple>

#include "backend/cuda/device_memory.h"

namespace hablar::cuda {

class LtGemm {
 public:
  LtGemm();
  ~LtGemm();
  LtGemm(const LtGemm&) = delete;
  LtGemm& operator=(const LtGemm&) = delete;

  // Queues the product on `stream`. False (nothing queued) when cublasLt cannot be loaded or
  // has no algorithm for the shape and epilogue: the caller then runs the unfused path.
  // Device pointers; `bias` may be null.
  bool run(const uint16_t* w, int64_t ld_w, int64_t n, int64_t k, const uint16_t* x, int64_t m,
           uint16_t* y, const uint16_t* bias, bool gelu, cudaStream_t stream);

 private:
  struct Plan;
  // (n, k, m, ld_w, W's alignment in bytes, epilogue: bit 0 bias, bit 1 GELU)
  using Key = std::tuple<int64_t, int64_t, int64_t, int64_t, int, int>;
  Plan* plan_for(const Key& key);

  enum class State { kUnloaded, kReady, kUnavailable } state_ = State::kUnloaded;
  void* handle_ = nullptr;  // cublasLtHandle_t
  DeviceMemory workspace_;
  std::map<Key, std::unique_ptr<Plan>> plans_;
};

}  // namespace hablar::cuda
