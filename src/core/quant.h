// Scalar reference (de)quantization for every supported DType. These are the ground truth
// that SIMD and CUDA kernels are tested against; they favour clarity over speed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>

#include "core/dtype.h"

namespace hablar {

// dst[0..n) = values of the n-value row at src (n a multiple of the block size).
// Works for F32, F16, BF16 and every supported quantized type; throws otherwise.
void dequantize_row(DType type, const void* src, float* dst, int64_t n);

// Reference quantization of n values into dst (dtype_row_bytes(type, n) bytes): round to
// nearest, with the format's usual scale search where it has one. Supported for F32, F16,
// BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K, IQ4_NL, IQ4_XS
// (has_quantizer tells).
void quantize_row(DType type, const float* src, void* dst, int64_t n);
bool has_quantizer(DType type);

// Named quantization mixes ("q4_k_m", "q5_k_m", or a plain type name): which type a
// tensor gets, from its GGUF name, the layer index, the layer count and the mix's base.
struct QuantMix {
  DType base;
  bool k_medium;  // the _M mix: some attention-value and FFN-down tensors get Q6_K
};
std::optional<QuantMix> quant_mix_from_name(std::string_view name);
// Type for one tensor under a mix. n_cols (row length) must suit the chosen type; falls
// back to a type whose block fits (e.g. Q8_0 or F16) when it does not.
DType quant_mix_tensor_type(const QuantMix& mix, std::string_view tensor_name, int layer,
                            int n_layers, int64_t n_cols);

}  // namespace hablar
