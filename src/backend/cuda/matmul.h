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
#include <unordered_map>

#include "backend/cuda/device_memory.h"
#include "backend/cuda/lt_gemm.h"
#include "core/tensor_view.h"

namespace hablar::cuda {

inline constexpr int kFusedMatmulMaxRows = 256;
// Default of kept_bf16_min_rows() (below).
inline constexpr int kKeptBf16MinRows = 17;
inline constexpr int kGemvMaxRows = 8;
// Default of PrefillMatmul::fp8_min_rows(): prompt-sized steps.
inline constexpr int64_t kFp8MinRows = 1024;

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

// Rows of e4m3 codes with a scale per row (fp8_rows.h): x [m][k] bf16 bits -> codes [m][k],
// scales [m]; k a multiple of 8. One block per row reads it twice (its largest magnitude,
// then the codes).
void quantize_rows_fp8(const uint16_t* x_bf16, int64_t m, int64_t k, uint8_t* codes, float* scales,
                       cudaStream_t stream);

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
  bool keeps(const WeightView& w) const;

  // Adds an fp8 copy of W to its kept bf16 copy (made first where there is none): e4m3 with a
  // scale per row (fp8_rows.h), 1 byte per weight, where cublasLt has FP8 products of W's
  // shape; false (only the bf16 copy kept) where it has not. Products of fp8_min_rows() rows
  // or more over it (run, multiply_kept*) quantize their bf16 input rows the same way and
  // multiply on the FP8 tensor cores (at 2,048 rows 1.2-1.5x the bf16 GEMM's rate on the
  // 1.5B shape's wide matrices); fewer rows multiply the bf16 copy, where the input's
  // quantization launch and the FP8 kernel's outer-vector epilogue cost more than they save
  // (docs/PERFORMANCE.md). e4m3 rounds each operand by up to 2^-4.
  bool keep_fp8(const WeightView& w, cudaStream_t stream);
  bool keeps_fp8(const WeightView& w) const;
  void set_fp8_min_rows(int64_t rows) { fp8_min_rows_ = rows; }
  int64_t fp8_min_rows() const { return fp8_min_rows_; }
  // The fp8 input rows of the products over fp8 copies, for up to max_rows rows of up to
  // max_cols values: reserved before any such product, which then allocates nothing (so it
  // can be captured in a graph). run() reserves what it needs itself.
  void reserve_fp8_rows(int64_t max_rows, int64_t max_cols);
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
  // The same with y written as bf16 (the f32 accumulators rounded once).
  void multiply_kept_to_bf16(const WeightView& w, const uint16_t* x_bf16, int m, uint16_t* y,
                             cudaStream_t stream);

 private:
  void reserve(size_t bytes);
  // y (f32 or bf16, cudaDataType y_type) = x · Wᵀ over bf16 W [N][K] and x [M][K].
  void gemm_bf16_to(const uint16_t* w_bf16, const uint16_t* x_bf16, int64_t n, int64_t k, int m,
                    void* y, int y_type, cudaStream_t stream);
  struct KeptCopy {
    DeviceMemory bf16;        // [rows][cols] bf16 bits
    DeviceMemory fp8;         // [rows][cols] e4m3 codes, or none
    DeviceMemory fp8_scales;  // f32 [rows]
    int64_t rows = 0, cols = 0;
  };
  // Whether a product of m rows over this copy takes its fp8 form.
  bool fp8_at(const KeptCopy& c, int m) const {
    return c.fp8.get() != nullptr && m >= fp8_min_rows_;
  }
  const KeptCopy& kept_copy(const WeightView& w, const char* what) const;
  // x's rows quantized to e4m3 into fp8_rows_ (its codes; its scales at fp8_scales_offset()).
  void quantize_input_fp8(const uint16_t* x_bf16, int m, int64_t k, cudaStream_t stream);
  size_t fp8_scales_offset() const;
  // y (f32, or bf16 when y_bf16) = x · Wᵀ over W's fp8 copy and x's rows as quantize_input_fp8
  // left them.
  void multiply_fp8(const KeptCopy& w, int m, void* y, bool y_bf16, cudaStream_t stream);
  CublasHandle handle_;
  int64_t growths_ = 0;
  DeviceMemory scratch_;
  LtFp8Gemm fp8_gemm_;
  DeviceMemory fp8_rows_;  // codes [rows][cols], then f32 scales [rows] at a 256-byte offset
  int64_t fp8_max_rows_ = 0, fp8_max_cols_ = 0;
  int64_t fp8_min_rows_ = kFp8MinRows;
  std::unordered_map<const void*, KeptCopy> kept_;  // by W's data
  size_t kept_bytes_ = 0;
};

}  // namespace hablar::cuda
