// Scalar reference (de)quantization for every supported DType. These are the ground truth
// that SIMD and CUDA kernels are tested against; they favour clarity over speed.
//
// Dequantization is bit-exact with the GGUF format's definition: each value is computed in
// float32 in the same order of operations as the format's reference (no fused multiply-add),
// so results match other readers of the format bit for bit. Quantization reproduces the
// format's reference quantizers (llama.cpp's, without an importance matrix) byte for byte.
// The implementation files disable floating-point contraction for this reason; vector
// kernels that fuse multiply-adds are compared with these references with a tolerance.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>

#include "core/dtype.h"
#include "core/quant_blocks.h"

namespace hablar {

// dst[0..n) = values of the n-value row at src (n a multiple of the block size).
// Works for F32, F16, BF16 and every supported quantized type (and Q8_1); throws otherwise.
void dequantize_row(DType type, const void* src, float* dst, int64_t n);

// Reference quantization of n values into dst (dtype_row_bytes(type, n) bytes): round to
// nearest, with the format's usual scale search where it has one. Supported for F32, F16,
// BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K, IQ4_NL,
// IQ4_XS (has_quantizer tells). Inputs are expected finite; the scales are stored as halves,
// so the largest magnitude a block can hold is bounded by the half range times the format's
// largest code (about 65504 * 127 for Q8_0; less for the others).
void quantize_row(DType type, const float* src, void* dst, int64_t n);
bool has_quantizer(DType type);
// True when dequantize_row handles the type.
bool has_dequantizer(DType type);

// Named quantization mixes ("q4_k_m", "q5_k_m", or a plain type name): which type a
// tensor gets, from its GGUF name, the layer index, the layer count and the mix's base.
struct QuantMix {
  DType base;
  bool k_medium;  // the _M mix: some attention-value and FFN-down tensors get Q6_K
};
std::optional<QuantMix> quant_mix_from_name(std::string_view name);
// Type for one tensor under a mix. n_cols (row length) must suit the chosen type; falls
// back to a type whose block fits (e.g. Q8_0 or F16) when it does not. One-dimensional
// tensors (norms, biases: names ending in "_norm.weight" or ".bias") stay F32.
// has_output_tensor: false when the model ties its output projection to token_embd, which
// then takes the output tensor's (higher) type.
DType quant_mix_tensor_type(const QuantMix& mix, std::string_view tensor_name, int layer,
                            int n_layers, int64_t n_cols, bool has_output_tensor = true);

// Per-format reference routines, on whole blocks. dequantize_row / quantize_row dispatch
// to these; kernels may call them directly (e.g. quantize_q8_1 for activations).
namespace qref {

void dequantize_q4_0(const BlockQ4_0* x, float* y, int64_t n_blocks);
void dequantize_q4_1(const BlockQ4_1* x, float* y, int64_t n_blocks);
void dequantize_q5_0(const BlockQ5_0* x, float* y, int64_t n_blocks);
void dequantize_q5_1(const BlockQ5_1* x, float* y, int64_t n_blocks);
void dequantize_q8_0(const BlockQ8_0* x, float* y, int64_t n_blocks);
void dequantize_q8_1(const BlockQ8_1* x, float* y, int64_t n_blocks);
void dequantize_q2_k(const BlockQ2_K* x, float* y, int64_t n_blocks);
void dequantize_q3_k(const BlockQ3_K* x, float* y, int64_t n_blocks);
void dequantize_q4_k(const BlockQ4_K* x, float* y, int64_t n_blocks);
void dequantize_q5_k(const BlockQ5_K* x, float* y, int64_t n_blocks);
void dequantize_q6_k(const BlockQ6_K* x, float* y, int64_t n_blocks);
void dequantize_q8_k(const BlockQ8_K* x, float* y, int64_t n_blocks);
void dequantize_iq4_nl(const BlockIQ4_NL* x, float* y, int64_t n_blocks);
void dequantize_iq4_xs(const BlockIQ4_XS* x, float* y, int64_t n_blocks);

void quantize_q4_0(const float* x, BlockQ4_0* y, int64_t n_blocks);
void quantize_q4_1(const float* x, BlockQ4_1* y, int64_t n_blocks);
void quantize_q5_0(const float* x, BlockQ5_0* y, int64_t n_blocks);
void quantize_q5_1(const float* x, BlockQ5_1* y, int64_t n_blocks);
void quantize_q8_0(const float* x, BlockQ8_0* y, int64_t n_blocks);
void quantize_q8_1(const float* x, BlockQ8_1* y, int64_t n_blocks);
void quantize_q2_k(const float* x, BlockQ2_K* y, int64_t n_blocks);
void quantize_q3_k(const float* x, BlockQ3_K* y, int64_t n_blocks);
void quantize_q4_k(const float* x, BlockQ4_K* y, int64_t n_blocks);
void quantize_q5_k(const float* x, BlockQ5_K* y, int64_t n_blocks);
void quantize_q6_k(const float* x, BlockQ6_K* y, int64_t n_blocks);
void quantize_q8_k(const float* x, BlockQ8_K* y, int64_t n_blocks);
void quantize_iq4_nl(const float* x, BlockIQ4_NL* y, int64_t n_blocks);
void quantize_iq4_xs(const float* x, BlockIQ4_XS* y, int64_t n_blocks);

// The 6-bit (scale, min) pair j (0..7) of a Q4_K / Q5_K super-block's packed scales.
inline void kquant_scale_min(const uint8_t* packed, int j, uint8_t* scale, uint8_t* min) {
  if (j < 4) {
    *scale = packed[j] & 63;
    *min = packed[j + 4] & 63;
  } else {
    *scale = (uint8_t)((packed[j + 4] & 0xF) | ((packed[j - 4] >> 6) << 4));
    *min = (uint8_t)((packed[j + 4] >> 4) | ((packed[j] >> 6) << 4));
  }
}
// The signed 6-bit scale j (0..15) of a Q3_K super-block, minus its bias of 32.
inline int q3k_scale(const uint8_t* packed, int j) {
  const int low = j < 8 ? (packed[j] & 0xF) : (packed[j - 8] >> 4);
  const int high = (packed[8 + j % 4] >> (2 * (j / 4))) & 3;
  return (low | (high << 4)) - 32;
}
// The signed 6-bit scale of sub-block j (0..7) of an IQ4_XS super-block, minus 32.
inline int iq4xs_scale(const BlockIQ4_XS& b, int j) {
  const int low = (b.scales_l[j / 2] >> (4 * (j % 2))) & 0xF;
  const int high = (b.scales_h >> (2 * j)) & 3;
  return (low | (high << 4)) - 32;
}

}  // namespace qref
}  // namespace hablar
