// Matrix products y = x · Wᵀ with quantized weights, as every linear layer needs them.
//
//   W  [N][K]  WeightView (core/tensor_view.h) whose data is DEVICE memory, any of Q4_0,
//              Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K, F16, BF16; K a multiple of the
//              type's block (256 for the K-quants, 32 otherwise)
//   x  [M][K]  f32 activations, row-major
//   y  [M][N]  f32, row-major
//
// matmul_fused(): M = 1..256, dequantization fused into the product, each weight read from
// memory once for all M rows. M <= 8 runs a bandwidth-bound kernel on CUDA cores
// (f32 math); 8 < M <= 256 dequantizes tiles to bf16 in shared memory and multiplies on
// tensor cores (WMMA, f32 accumulation).
// PrefillMatmul: large M (prompt chunks): W dequantized to bf16 once per call (or given
// already in bf16) and multiplied by cuBLAS on tensor cores.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

#include "backend/cuda/device_memory.h"
#include "core/tensor_view.h"

namespace hablar::cuda {

inline constexpr int kFusedMatmulMaxRows = 256;
// Default of kept_bf16_min_rows() (below).
inline constexpr int kKeptBf16MinRows = 17;
inline constexpr int kGemvMaxRows = 8;

bool cuda_supports_weight_type(DType type);
// Throws unless W's type has a CUDA kernel and its shape and row bytes are consistent.
void validate_weight(const WeightView& w, const char* what);

// Throws kInvalidArgument for an unsupported type, a bad K, or M outside 1..256.
// With a workspace of matmul_fused_workspace_bytes(w, m) bytes (nonzero for Q4_K, and for
// Q6_K at M = 1 or 2), x is quantized to int8 blocks of 32 and the product runs on integer
// arithmetic: for Q4_K dp4a for M <= 3, integer tensor cores (matmul_q4k_mma.cu) for
// M = 4..256; far fewer instructions, at the cost of int8 rounding of the activations
// (normalized error about 3e-3 instead of 1e-6). Without one, every type takes the f32 path.
// At M = 1 the products are matmul_q4k_rows.cu's and matmul_q6k_rows.cu's kernels (the
// latter also for Q6_K at M = 2), launched with programmatic dependent launch on a stream
// of the caller's (their weight loads overlap the end of the kernel before them).
size_t matmul_fused_workspace_bytes(const WeightView& w, int m);
void matmul_fused(const WeightView& w, const float* x, int m, float* y, cudaStream_t stream,
                  void* workspace = nullptr, size_t workspace_bytes = 0);

// The two halves of the int8 path, for products that share one input (Q, K and V; gate
// and up): quantize x once into a workspace, then run each product from it (any matrix and
// M for which matmul_fused_workspace_bytes is nonzero). The
// workspace: q8_activation_bytes(m, k) bytes at M = 1, matmul_fused_workspace_bytes(w, m)
// (which adds the tensor-core kernel's scratch) for M > 1.
size_t q8_activation_bytes(int m, int64_t k);
// The workspace's layout: int8 codes [m][k], then (d, d * sum of codes) per block of 32 at a
// 256-byte aligned offset.
struct Q8Activations {
  int8_t* codes;
  float2* scales;
};
Q8Activations q8_layout(void* workspace, int m, int64_t k);
void quantize_activations_q8(const float* x, int m, int64_t k, void* workspace,
                             size_t workspace_bytes, cudaStream_t stream);
void matmul_prequantized(const WeightView& w, int m, float* y, void* workspace,
                         cudaStream_t stream);

// Dequantizes the whole of W into out[N][K] (bf16 bits, device).
void dequantize_to_bf16(const WeightView& w, uint16_t* out, cudaStream_t stream);
// f32 -> bf16 (round to nearest even) of n values.
void convert_f32_to_bf16(const float* in, uint16_t* out, int64_t n, cudaStream_t stream);

// The fewest rows at which a product whose W has a kept bf16 copy (PrefillMatmul::keep_bf16)
// multiplies that copy through cuBLAS rather than the quantized weights: from there the
// tensor cores at full rate on 2-byte weights beat dequantizing in the product (measured on
// the H200, docs/PERFORMANCE.md). Lab knob HABLAR_KEPT_BF16_FROM.
int64_t kept_bf16_min_rows();

class PrefillMatmul {
 public:
  PrefillMatmul() = default;
  // y = x · Wᵀ for any M >= 1: W dequantized into scratch, then one cuBLAS GEMM.
  void run(const WeightView& w, const float* x, int m, float* y, cudaStream_t stream);
  // The GEMM alone, over W already in bf16 ([N][K]) and x in bf16 ([M][K]).
  void gemm_bf16(const uint16_t* w_bf16, const uint16_t* x_bf16, int64_t n, int64_t k, int m,
                 float* y, cudaStream_t stream);

  // Times the scratch grew (a device allocation: one-time work, slow the first time).
  int64_t growths() const { return growths_; }

  // Makes a bf16 copy of W ([N][K]) now and keeps it: run() then multiplies it instead of
  // dequantizing W on every call (about a third of a prompt chunk's time), at 2 bytes per
  // weight of device memory.
  void keep_bf16(const WeightView& w, cudaStream_t stream);
  size_t kept_bytes() const { return kept_bytes_; }
  // Keeps the copies of matrices of one width one after another in one allocation, in the
  // order given (Q, K and V: their products are then one GEMM, stacked_copies). Matrices
  // kept already, or of another width, are kept apart.
  void keep_bf16_stacked(std::span<const WeightView* const> ws, cudaStream_t stream);
  // The first row of the matrices' kept copies where they lie one after another in that
  // order ([sum of rows][cols] bf16: one GEMM gives their products side by side in each
  // output row); null where they do not.
  const uint16_t* stacked_copies(std::span<const WeightView* const> ws) const;
  bool keeps(const WeightView& w) const;
  // y = x · Wᵀ over W's kept copy (keeps(w)) and x already in bf16 ([M][K]): one cuBLAS GEMM,
  // no scratch, so it can be captured in a CUDA graph.
  void multiply_kept(const WeightView& w, const uint16_t* x_bf16, int m, float* y,
                     cudaStream_t stream);
  // y_a = x · W_aᵀ and y_b = x · W_bᵀ for two matrices of one shape with kept copies, in one
  // strided-batched GEMM (the strides: the distances between the copies and between the
  // outputs; two GEMMs where their signs differ). Half the launches of the narrow K and V
  // products, whose single GEMMs fill few multiprocessors.
  void multiply_kept_pair(const WeightView& wa, const WeightView& wb, const uint16_t* x_bf16, int m,
                          float* ya, float* yb, cudaStream_t stream);
  // y += alpha · x · Wᵀ over W's kept copy: the product accumulating into y (cuBLAS beta = 1),
  // for a residual stream that takes the product without a separate add.
  void multiply_kept_add(const WeightView& w, const uint16_t* x_bf16, int m, float* y, float alpha,
                         cudaStream_t stream);
  // The same with y written as bf16 (the f32 accumulators rounded once).
  void multiply_kept_to_bf16(const WeightView& w, const uint16_t* x_bf16, int m, uint16_t* y,
                             cudaStream_t stream);

 private:
  void reserve(size_t bytes);
  // y (f32 or bf16, cudaDataType y_type) = alpha · x · Wᵀ + beta · y over bf16 W [N][K] and
  // x [M][K].
  void gemm_bf16_to(const uint16_t* w_bf16, const uint16_t* x_bf16, int64_t n, int64_t k, int m,
                    void* y, int y_type, cudaStream_t stream, float alpha = 1.0f,
                    float beta = 0.0f);
  CublasHandle handle_;
  int64_t growths_ = 0;
  DeviceMemory scratch_;
  struct KeptCopy {
    DeviceMemory own;                // [rows][cols]; empty for a part of a stack
    const uint16_t* data = nullptr;  // own's bytes, or the copy's rows within its stack
    int64_t rows = 0, cols = 0;
  };
  std::vector<DeviceMemory> stacks_;                // keep_bf16_stacked's allocations
  std::unordered_map<const void*, KeptCopy> kept_;  // by W's data
  size_t kept_bytes_ = 0;
};

}  // namespace hablar::cuda
