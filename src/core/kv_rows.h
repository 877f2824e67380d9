// Head rows of the KV cache (core/kv_layout.h) as every backend writes and reads them. Q8_0: per
// block of 32 values, d = max|x| / 127 as a half and codes round-half-even(x * 127 / max|x|) (what
// llama.cpp's x86 quantizer stores for q8_0 cache rows); Q4_0 by the reference quantizer,
// which llama.cpp's CPU uses for q4_0 rows. The CPU backend stores rows with kv_store_row, the
// CUDA scatter kernels replay its Q8_0 rule (backend/cuda/kv_elements.cuh) and the CUDA host
// twin (backend/cuda/decode_attention_host.h) models them with it.
#pragma once

#include <cmath>
#include <cstdint>

#include "core/fp16.h"
#include "core/kv_layout.h"
#include "core/quant.h"
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

// The head row of hd values at `row` back to float (the quantized types' d * q exactly).
inline void kv_row_to_f32(const uint16_t* row, KvDType type, int hd, float* out) {
  switch (type) {
    case KvDType::F16:
      for (int d = 0; d < hd; ++d) out[d] = fp16_to_f32(row[d]);
      return;
    case KvDType::BF16:
      for (int d = 0; d < hd; ++d) out[d] = bf16_to_f32(row[d]);
      return;
    case KvDType::Q8_0:
      qref::dequantize_q8_0(reinterpret_cast<const BlockQ8_0*>(row), out, hd / kQK);
      return;
    case KvDType::Q4_0:
      qref::dequantize_q4_0(reinterpret_cast<const BlockQ4_0*>(row), out, hd / kQK);
      return;
  }
}

// One head row of hd values into the cache at dst (2-byte units), in the type.
inline void kv_store_row(uint16_t* dst, const float* x, int hd, KvDType type) {
  switch (type) {
    case KvDType::F16:
      for (int d = 0; d < hd; ++d) dst[d] = f32_to_fp16(x[d]);
      return;
    case KvDType::BF16:
      for (int d = 0; d < hd; ++d) dst[d] = f32_to_bf16(x[d]);
      return;
    case KvDType::Q8_0:
      kv_q8_0_quantize_row(x, hd, reinterpret_cast<BlockQ8_0*>(dst));
      return;
    case KvDType::Q4_0:
      qref::quantize_q4_0(x, reinterpret_cast<BlockQ4_0*>(dst), hd / kQK);
      return;
  }
}

}  // namespace hablar
