// Activation quantization for the integer matmul paths, and the layout of the quantized rows
// the kernels read. Internal to the CPU backend.
//
// Rows of the 32-value formats ("Act32"): for a row of n values (nb = n / 32 blocks)
//   int8_t qs[nb][32] | float d[nb] | float s[nb] | int32_t sum[nb]
// with d = fp16(max|x| / 127), qs = round-to-even(x * (127 / max|x|)) and
// s = fp16(d_exact * sum(qs)): the values of a Q8_0 / Q8_1
// block (core/quant_blocks.h), with the halves already widened to float; sum = sum(qs), for
// the weight formats whose codes carry an offset.
// Rows of the K formats are BlockQ8_K[n / 256] as core/quant_blocks.h defines them.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/dtype.h"
#include "core/quant_blocks.h"

namespace hablar::cpu {

enum class ActKind {
  kF32,    // the float activations themselves (F32, F16, BF16 weights)
  kAct32,  // 32-value blocks (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL)
  kQ8K,    // 256-value super-blocks (K-quants, IQ4_XS)
};

// Which activation rows a weight type's dot products use, and the row's size in bytes;
// ActKind::kF32 for types without an integer path.
ActKind act_kind_for(DType weight_type);
size_t act_row_bytes(ActKind kind, int64_t n);

// Views of one Act32 row.
struct Act32Row {
  const int8_t* qs;
  const float* d;
  const float* s;
  const int32_t* sum;
};
inline Act32Row act32_row(const void* row, int64_t n) {
  const int64_t nb = n / kQK;
  const auto* base = static_cast<const uint8_t*>(row);
  const auto* d = reinterpret_cast<const float*>(base + nb * kQK);
  return {reinterpret_cast<const int8_t*>(base), d, d + nb,
          reinterpret_cast<const int32_t*>(d + 2 * nb)};
}
// Kernels may read up to this many bytes past the end of the last activation row.
inline constexpr size_t kActReadPastEnd = 256;

// Scalar quantizers (the reference the SIMD ones are tested against).
void quantize_act32_scalar(const float* x, int64_t n, void* row);
void quantize_q8k_scalar(const float* x, int64_t n, BlockQ8_K* blocks);

// Rounding as the quantizers do it (both block kinds): to nearest, ties to even.
int round_half_even(float v);

}  // namespace hablar::cpu
