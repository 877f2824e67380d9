// The deterministic mode's ops: the CPU backend's values, bit for bit, on the device. Each
// kernel runs the functions of cpu_rounding.cuh (the CPU's scalar references, written once
// for both compilers) with one thread per output value or per (token, head), so a token's
// values never depend on the other tokens of the step. Slower than the default kernels
// (no tensor cores, no int8 tiles); the default mode's own rounding is stated in
// forward_ops.h.
//
// Host C++ (no device code here).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "core/kv_layout.h"
#include "core/tensor_view.h"

namespace hablar::cuda::cpu_rounding_ops {

// True for the weight types these products cover (the CUDA backend's types).
bool supports(DType type);
// Bytes of the quantized activation rows of m tokens for W (the CPU's Act32 rows or Q8_K
// blocks; 0 for float weights).
size_t activation_bytes(const WeightView& w, int64_t m);
// y[m][N] = x[m][K] · Wᵀ as the CPU computes it: x quantized as the CPU quantizes it into
// `scratch` (activation_bytes), each token's dot products in the order of its role
// (core/llama_batch_roles.h; roles [m], device).
void matmul(const WeightView& w, const float* x, int64_t m, const uint8_t* roles, float* y,
            void* scratch, cudaStream_t stream);
// y = (x * rms_scale) * weight per row of `width` (y may be x).
void rms_norm(const float* x, const float* weight, float* y, int64_t rows, int width, float eps,
              cudaStream_t stream);
// out = silu(gate) * up with the CPU's exp (out may alias gate or up).
void swiglu(const float* gate, const float* up, float* out, int64_t n, cudaStream_t stream);
// out = gelu(gate) * up through the CPU's GELU table (cpu_rounding.cuh gelu_half_table(),
// uploaded to the device (out may alias).
void geglu(const float* gate, const float* up, float* out, int64_t n, const float* table,
           cudaStream_t stream);
// out = gelu(x) through the same table (out may be x).
void gelu(const float* x, float* out, int64_t n, const float* table, cudaStream_t stream);
// Per row of `width`: cpu::layernorm's values (cpu_rounding.cuh layernorm_row; y may be x).
void layernorm(const float* x, const float* weight, const float* bias, float* y, int64_t rows,
               int width, float eps, cudaStream_t stream);
// x[t] = row tokens[t] of the table, dequantized with the CPU's roundings.
void embed(const WeightView& table, const int32_t* tokens, int64_t n, float* x,
           cudaStream_t stream);

// Attention of each active token over [first, pos] of its sequence (AttentionSpec): its K/V
// stored first (rounded to the cache type), then scores, softmax and the weighted sum of V
// in the CPU's orders (the one-token order for sampled tokens).
struct AttentionArgs {
  KvCacheLayout layout;
  int32_t layer = 0;
  void* kv_cache = nullptr;
  int32_t n_tokens = 0;
  int32_t n_heads = 0;
  const int32_t* block_tables = nullptr;  // [n_tokens][max_blocks_per_seq]
  int32_t max_blocks_per_seq = 0;
  const int32_t* positions = nullptr;  // [n_tokens]
  const uint8_t* active = nullptr;     // [n_tokens]: 0 for padding rows
  const uint8_t* sampled = nullptr;    // [n_tokens]: 1 for a sampled token
  const float* q = nullptr;            // [n_tokens][n_heads][head_dim]
  const float* k = nullptr;            // [n_tokens][n_kv_heads][head_dim]
  const float* v = nullptr;
  float* out = nullptr;  // [n_tokens][n_heads][head_dim]
  float scale = 0.0f;
  int32_t window = 0;
  float softcap = 0.0f;
  int32_t max_context = 0;  // the longest (position + 1) of the step
};
// Contexts up to this many positions (the scores of a head live in shared memory).
int32_t max_attention_context();
void attention(const AttentionArgs& a, cudaStream_t stream);

}  // namespace hablar::cuda::cpu_rounding_ops
