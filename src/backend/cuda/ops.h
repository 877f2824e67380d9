// The element-wise and row-wise ops of a transformer layer, on device f32 activations.
// Every function launches on `stream` and returns at once; shapes are row-major.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/layer_spec.h"
#include "core/tensor_view.h"

namespace hablar::cuda {

// out[r] = x[r] / sqrt(mean(x[r]^2) + eps) * weight, for rows x [rows][dim]; out may be x.
void rms_norm(const float* x, const float* weight, float* out, int rows, int dim, float eps,
              cudaStream_t stream);
// x += y, then out = rms_norm(x) (per row of dim values): the residual add and the next
// norm in one pass, with the same rounding as add() followed by rms_norm().
void add_rms_norm(float* x, const float* y, const float* weight, float* out, int rows, int dim,
                  float eps, cudaStream_t stream);
// In the three fused forms below, add_* also takes y = null: the norm of x alone (x only
// read), as the plain form.
// rms_norm / add_rms_norm with the same values, the output rows also
// quantized to int8 into q8_workspace (quantize_activations_q8's layout and rounding, matmul.h)
// for the int8 products that read them: one launch instead of two. dim a multiple of 32.
void rms_norm_q8(const float* x, const float* weight, float* out, int rows, int dim, float eps,
                 void* q8_workspace, cudaStream_t stream);
void add_rms_norm_q8(float* x, const float* y, const float* weight, float* out, int rows, int dim,
                     float eps, void* q8_workspace, cudaStream_t stream);
// rms_norm / add_rms_norm with the same values, the output rows also written into
// f16_workspace as the f16 rows of the f16 tensor-core products (convert_rows_to_f16's
// layout, values and scales: matmul_f16.h): one launch instead of two. dim a multiple of 4.
void rms_norm_f16(const float* x, const float* weight, float* out, int rows, int dim, float eps,
                  void* f16_workspace, size_t f16_bytes, cudaStream_t stream);
void add_rms_norm_f16(float* x, const float* y, const float* weight, float* out, int rows, int dim,
                      float eps, void* f16_workspace, size_t f16_bytes, cudaStream_t stream);
// rms_norm / add_rms_norm with the same values, the output rows also written as bf16 rows
// ([rows][dim], round to nearest even) for the products over kept bf16 copies of W
// (matmul.h: PrefillMatmul::multiply_kept): one launch instead of two.
void rms_norm_bf16(const float* x, const float* weight, float* out, int rows, int dim, float eps,
                   uint16_t* bf16_rows, cudaStream_t stream);
void add_rms_norm_bf16(float* x, const float* y, const float* weight, float* out, int rows, int dim,
                       float eps, uint16_t* bf16_rows, cudaStream_t stream);
// Whether rows of dim values may skip the f32 output (out == nullptr above: the bf16 rows
// alone, where only products over kept copies read them): the one-launch form's widths.
bool rms_norm_bf16_only_supported(int dim);

// Rotary embedding in place on x [tokens][heads][head_dim], the first rot_dim dims of each
// head. kNormal rotates adjacent pairs (2i, 2i+1) (Llama GGUF); kNeox rotates (i, i + rot/2)
// (Qwen2, NeoX). Pair i turns by positions[t] * theta^(-2i / rot_dim).
enum class RopeStyle { kNormal, kNeox };
void rope(float* x, const int32_t* positions, int tokens, int heads, int head_dim, int rot_dim,
          float theta, RopeStyle style, cudaStream_t stream);

// out = silu(gate) * up over n values; out may alias either input.
void swiglu(const float* gate, const float* up, float* out, int64_t n, cudaStream_t stream);

// out = gelu_tanh(gate) * up over n values (GeGLU); out may alias either input.
void geglu(const float* gate, const float* up, float* out, int64_t n, cudaStream_t stream);

// out = act(gate) * up over n values (swiglu's / geglu's values), also written as bf16 values
// for the products over kept bf16 copies of W; out may alias either input.
void glu_to_bf16(const float* gate, const float* up, GluActivation act, float* out,
                 uint16_t* bf16_values, int64_t n, cudaStream_t stream);

// out = act(gate) * up over n bf16 values, in f32 and rounded once to bf16: the gated
// activation between products whose outputs and inputs are bf16 (the gate and up products
// over kept bf16 copies writing bf16, the down product reading it). out may alias either.
void glu_bf16_rows(const uint16_t* gate, const uint16_t* up, GluActivation act, uint16_t* out,
                   int64_t n, cudaStream_t stream);

// x = cap * tanh(x / cap) over n values (soft-capped logits).
void softcap(float* x, int64_t n, float cap, cudaStream_t stream);

// x *= s over n values.
void scale(float* x, float s, int64_t n, cudaStream_t stream);
// (The count and the factor swapped would convert silently, to a count of 0: refused.)
void scale(float* x, int64_t n, float s, cudaStream_t stream) = delete;
// Rows x [n_rows x width]: row t *= ps.factor(positions[t]) (Mistral 3's query temperature).
void scale_by_position(float* x, const int32_t* positions, int64_t n_rows, int64_t width,
                       const PositionScale& ps, cudaStream_t stream);
// x = max(x, 0)^2 in place (Arcee's MLP activation; exact: one rounding, as the CPU's).
void relu_squared(float* x, int64_t n, cudaStream_t stream);

// out = a + b over n values (the residual add); out may alias a or b.
void add(const float* a, const float* b, float* out, int64_t n, cudaStream_t stream);

// out[t] = row ids[t] of `table` dequantized to f32 (table.data on the device, any type of
// cuda_supports_weight_type). An id outside 0..rows-1 yields a row of zeros.
void embedding_gather(const WeightView& table, const int32_t* ids, int n, float* out,
                      cudaStream_t stream);

}  // namespace hablar::cuda
