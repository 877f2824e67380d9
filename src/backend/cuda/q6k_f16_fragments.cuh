// Where the values of a Q6_K super-block go in the f16 tensor-core fragments of matmul_f16.cu
// (mma.sync m16n8k16). Every function is __host__ __device__ so that f16_fragments_host_test.cu
// rebuilds a whole warp's fragments on the host and multiplies them as the PTX layout says.
//
// A 210-byte Q6_K super-block (ql[128] at byte 0, qh[64] at 128, int8 scales[16] at 192, f16 d
// at 208) holds two halves n of 128 values; value 128n + 32c + l (group c = 0..3, l = 0..31) is
//   q6 = nibble (low for c < 2, high for c >= 2) of ql[64n + 32(c & 1) + l]
//        | ((qh[32n + l] >> 2c) & 3) << 4                                   (0..63)
//   weight = d * scales[8n + 2c + l / 16] * (q6 - 32).
// So each 16-value sub-block is exactly the k extent of one instruction, with one scale.
// Lane (g, q) of the instruction over values l = 16h .. 16h + 15 of group c takes the ql word
// at byte 64n + 32(c & 1) + 16h + 4q and the qh word at byte 128 + 32n + 16h + 4q: bytes
// 0..3 of both give values l = 16h + 4q + 0..3, which the same lop3 as Q4_K's
// (q4k_f16_fragments.cuh) turns into the f16 pairs (1024 + q6_0, 1024 + q6_2) and
// (1024 + q6_1, 1024 + q6_3): a0 / a2 of row g, a1 / a3 of row g + 8, with the activation rows
// stored in the same (0, 2, 1, 3) order. Subtracting 1056 leaves q6 - 32 exactly; one multiply
// by the sub-block's f16 scale d * scales[s] rounds once.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/q4k_f16_fragments.cuh"

namespace hablar::cuda::q6k_f16 {

// f16 bits of 1056.0 twice: 1024 + q6 - 1056 = q6 - 32, exact.
constexpr uint32_t kOffsetPair = 0x64206420u;

// Byte offsets in the super-block of the ql and qh words lane q needs for group c, half h of
// half-block n (see the top of the file).
__host__ __device__ constexpr int ql_offset(int n, int c, int h, int q) {
  return 64 * n + 32 * (c & 1) + 16 * h + 4 * q;
}
__host__ __device__ constexpr int qh_offset(int n, int h, int q) {
  return 128 + 32 * n + 16 * h + 4 * q;
}

// The sub-block (0..15) whose scale covers group c, half h of half-block n.
__host__ __device__ constexpr int sub_block(int n, int c, int h) {
  return 8 * n + 2 * c + h;
}

// The f16 pairs (1024 + q0, 1024 + q2) and (1024 + q1, 1024 + q3) of the four six-bit values
// of group c held by a ql word and a qh word.
__host__ __device__ __forceinline__ q4k_f16::NibblePairs six_bit_pairs(uint32_t ql_word,
                                                                       uint32_t qh_word, int c) {
  const uint32_t low = (ql_word >> (4 * (c >> 1))) & 0x0F0F0F0Fu;
  const uint32_t high = ((qh_word >> (2 * c)) & 0x03030303u) << 4;
  const uint32_t v = low | high;
  return {(v & 0x003F003Fu) | q4k_f16::kMagicPair, ((v >> 8) & 0x003F003Fu) | q4k_f16::kMagicPair};
}

}  // namespace hablar::cuda::q6k_f16
