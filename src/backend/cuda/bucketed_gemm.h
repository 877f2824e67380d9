// Products over kept bf16 copies through cublasLt, each shape's algorithm chosen once per
// bucket of row counts instead of once per row count:
//   y [batch][m x n] (f32 or bf16) = alpha · x [m x k] · W_iᵀ + beta · y,  W_i bf16 [n x k].
// A serving step's row count changes from step to step (the prompt tokens it carries), and
// cublasGemmEx chooses an algorithm for every new problem shape on the host before it queues
// the product; here the heuristic runs for the bucket's largest row count and its choice is
// kept for every row count of the bucket (rows rounded up to 16 below 64, to 64 below 512,
// to 128 above). `cuda_host_cost_lab` measures what a new shape costs the host.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <map>
#include <memory>
#include <tuple>

#include "backend/cuda/device_memory.h"

namespace hablar::cuda {

struct BucketedProblem {
  const uint16_t* w = nullptr;  // the first W_i, [n][k] bf16
  int64_t n = 0, k = 0;
  const uint16_t* x = nullptr;  // [m][k] bf16, shared by the batch
  int m = 0;
  void* y = nullptr;  // the first y_i, [m][n] of y_type
  int y_type = 0;     // cudaDataType: CUDA_R_32F or CUDA_R_16BF
  float alpha = 1.0f, beta = 0.0f;
  int batch = 1;  // W_i = w + i · stride_w, y_i = y + i · stride_y (elements)
  int64_t stride_w = 0, stride_y = 0;
};

// The bucket's largest row count for m rows (the count the heuristic is asked for).
int bucketed_rows(int m);

class BucketedGemm {
 public:
  BucketedGemm();
  ~BucketedGemm();
  BucketedGemm(const BucketedGemm&) = delete;
  BucketedGemm& operator=(const BucketedGemm&) = delete;

  // Queues the product on `stream`. False, with nothing queued, when cublasLt cannot be
  // loaded, its heuristic offers no algorithm for the bucket, or the kept algorithm refuses
  // this row count: the caller then runs cuBLAS's own call.
  bool run(const BucketedProblem& p, cudaStream_t stream);

 private:
  struct Plan;
  // (n, k, bucket rows, y type, batch, stride_w, stride_y, alignment of W, x and y in bytes)
  using Key = std::tuple<int64_t, int64_t, int, int, int, int64_t, int64_t, int, int, int>;
  Plan* plan_for(const Key& key);

  enum class State { kUnloaded, kReady, kUnavailable } state_ = State::kUnloaded;
  void* handle_ = nullptr;  // cublasLtHandle_t
  DeviceMemory workspace_;
  std::map<Key, std::unique_ptr<Plan>> plans_;
};

}  // namespace hablar::cuda
