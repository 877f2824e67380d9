// Q8_0 rows of the KV cache (core/kv_layout.h) as every backend writes them: per block of 32
// values, d = max|x| / 127 as a half and codes round-half-even(x * 127 / max|x|) (what
// llama.cpp's x86 quantizer stores for q8_0 cache rows). The CPU backend stores rows with it,
// the CUDA scatter kernels replay it (backend/cuda/kv_elements.cuh) and the CUDA host twin
// (backend/cuda/decode_attention_host.h) models them with it.
#pragma once

#include <cmath>

#include "core/fp16.h"
#include "core/quant_blocks.h"

namespace hablar {

inline void kv_q8_0_quantize_row(const float* x, int n, BlockQ8_0* blocks) {
  for (int b = 0; b < n / kQK; ++b, x += kQK) {
    float amax = 0.0f;
    for (int j = 0; j < kQK; ++j) amax = std::fmax(amax, std::fabs(x[j]));
    const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
    blocks[b].d = f32_to_fp16(amax / 127.0f);
    for (int j = 0; j < kQK; ++j) blocks[b].qs[j] = (int8_t)std::nearbyint(x[j] * id);
  }
}

// Value j of a block as the CUDA attention reads it: code * d in f32 (exact) rounded to f16.
inline float kv_q8_0_value_as_f16(const BlockQ8_0& block, int j) {
  return fp16_to_f32(f32_to_fp16((float)block.qs[j] * fp16_to_f32(block.d)));
}

}  // namespace hablar
