#include "backend/cpu/act_quant.h"

#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/fp16.h"

// The float expressions here must match the SIMD quantizers operation for operation.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("fp-contract=off")
#endif

namespace hablar::cpu {

ActKind act_kind_for(DType t) {
  switch (t) {
    case DType::Q4_0:
    case DType::Q4_1:
    case DType::Q5_0:
    case DType::Q5_1:
    case DType::Q8_0:
    case DType::IQ4_NL:
      return ActKind::kAct32;
    case DType::Q2_K:
    case DType::Q3_K:
    case DType::Q4_K:
    case DType::Q5_K:
    case DType::Q6_K:
    case DType::IQ4_XS:
      return ActKind::kQ8K;
    default:
      return ActKind::kF32;
  }
}

size_t act_row_bytes(ActKind kind, int64_t n) {
  switch (kind) {
    case ActKind::kAct32:
      return (size_t)(n / kQK) * (kQK + 2 * sizeof(float) + sizeof(int32_t));
    case ActKind::kQ8K:
      return (size_t)(n / kQK_K) * sizeof(BlockQ8_K);
    case ActKind::kF32:
      break;
  }
  return (size_t)n * sizeof(float);
}

int round_half_even(float v) {
  return (int)std::nearbyint(v);
}

void quantize_act32_scalar(const float* x, int64_t n, void* row) {
  const int64_t nb = n / kQK;
  auto* qs = static_cast<int8_t*>(row);
  auto* d_out = reinterpret_cast<float*>(static_cast<uint8_t*>(row) + nb * kQK);
  float* s_out = d_out + nb;
  auto* sum_out = reinterpret_cast<int32_t*>(s_out + nb);
  for (int64_t b = 0; b < nb; ++b, x += kQK, qs += kQK) {
    float amax = 0.0f;
    for (int j = 0; j < kQK; ++j) amax = std::fmax(amax, std::fabs(x[j]));
    const float d = amax / 127.0f;
    const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
    int sum = 0;
    for (int j = 0; j < kQK; ++j) {
      qs[j] = (int8_t)round_half_even(x[j] * id);
      sum += qs[j];
    }
    d_out[b] = fp16_to_f32(f32_to_fp16(d));
    s_out[b] = fp16_to_f32(f32_to_fp16((float)sum * d));
    sum_out[b] = sum;
  }
}

void quantize_q8k_scalar(const float* x, int64_t n, BlockQ8_K* y) {
  const int64_t nb = n / kQK_K;
  for (int64_t b = 0; b < nb; ++b, x += kQK_K) {
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < kQK_K; ++j) {
      const float ax = std::fabs(x[j]);
      if (ax > amax) {
        amax = ax;
        max = x[j];
      }
    }
    if (amax == 0.0f) {
      std::memset(&y[b], 0, sizeof(BlockQ8_K));
      continue;
    }
    const float iscale = -127.0f / max;
    for (int j = 0; j < kQK_K; ++j) {
      const int v = round_half_even(iscale * x[j]);
      y[b].qs[j] = (int8_t)(v < 127 ? v : 127);
    }
    for (int g = 0; g < kQK_K / 16; ++g) {
      int sum = 0;
      for (int j = 0; j < 16; ++j) sum += y[b].qs[16 * g + j];
      y[b].bsums[g] = (int16_t)sum;
    }
    y[b].d = 1.0f / iscale;
  }
}

}  // namespace hablar::cpu
