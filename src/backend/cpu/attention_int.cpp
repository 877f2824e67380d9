// The scalar integer q·k of a quantized K cache (attention_int.h): the definition the SIMD
// forms are tested against.
#include "backend/cpu/attention_int.h"

#include <cmath>

#include "backend/cpu/act_quant.h"
#include "core/fp16.h"
#include "core/quant_blocks.h"

namespace hablar::cpu {

QkQuantRow qk_quant_row(void* words, int hd) {
  auto* w = static_cast<uint32_t*>(words);
  return {reinterpret_cast<int8_t*>(w), reinterpret_cast<float*>(w + hd / 4),
          reinterpret_cast<int32_t*>(w + hd / 4 + hd / 32)};
}

void quantize_q_for_k(const float* q, int hd, KvDType k_type, const QkQuantRow& out) {
  // quantize_act32_scalar's codes and scales (llama.cpp's x86 quantize_row_q8_0).
  for (int b = 0; b < hd / kQK; ++b) {
    const float* x = q + b * kQK;
    float amax = 0.0f;
    for (int j = 0; j < kQK; ++j) amax = std::fmax(amax, std::fabs(x[j]));
    const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
    for (int j = 0; j < kQK; ++j) out.qs[b * kQK + j] = (int8_t)round_half_even(x[j] * id);
    out.d[b] = fp16_to_f32(f32_to_fp16(amax / 127.0f));
  }
  const int off = k_type == KvDType::Q4_0 ? 8 : 128;
  for (int w = 0; w < hd / 4; ++w) {
    const int8_t* c = out.qs + 4 * w;
    out.corr[w] = -off * ((int)c[0] + c[1] + c[2] + c[3]);
  }
}

namespace {

// Block b of a K row as 32 signed codes and its scale.
float k_block(const uint16_t* k_row, KvDType k_type, int b, int8_t* codes) {
  if (k_type == KvDType::Q8_0) {
    const BlockQ8_0& blk = reinterpret_cast<const BlockQ8_0*>(k_row)[b];
    for (int j = 0; j < kQK; ++j) codes[j] = blk.qs[j];
    return fp16_to_f32(blk.d);
  }
  const BlockQ4_0& blk = reinterpret_cast<const BlockQ4_0*>(k_row)[b];
  for (int j = 0; j < kQK / 2; ++j) {
    codes[j] = (int8_t)((blk.qs[j] & 0x0f) - 8);
    codes[j + kQK / 2] = (int8_t)((blk.qs[j] >> 4) - 8);
  }
  return fp16_to_f32(blk.d);
}

}  // namespace

float dot_qk_int_scalar(const uint16_t* k_row, KvDType k_type, const QkQuantRow& q, int hd) {
  float lanes[8] = {};
  int8_t codes[kQK];
  for (int b = 0; b < hd / kQK; ++b) {
    const float dd = k_block(k_row, k_type, b, codes) * q.d[b];
    const int8_t* qs = q.qs + b * kQK;
    for (int j = 0; j < 8; ++j) {
      int32_t isum = 0;
      for (int i = 4 * j; i < 4 * j + 4; ++i) isum += (int32_t)codes[i] * qs[i];
      lanes[j] = std::fma(dd, (float)isum, lanes[j]);
    }
  }
  return ((lanes[0] + lanes[4]) + (lanes[2] + lanes[6])) +
         ((lanes[1] + lanes[5]) + (lanes[3] + lanes[7]));
}

}  // namespace hablar::cpu
