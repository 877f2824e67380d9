// Where the values of a Q4_K sub-block and of an activation row go in the f16 tensor-core
// fragments of matmul_f16.cu (mma.sync m16n8k16, f16 x f16 -> f32). Every function is
// __host__ __device__ so that f16_fragments_host_test.cu rebuilds a whole warp's
// fragments on the host and multiplies them as the PTX fragment layout says.
//
// A product only needs the same k order on both sides, so the kernel does not take a
// sub-block's 32 values in their stored order. Lane (g = lane / 4, q = lane % 4) reads the
// 32-bit nibble word at byte 16h + 4q (h = 0, 1) of a sub-block pair's 32 bytes: bytes
// b0..b3 hold values 16h + 4q + 0..3 (low nibbles: the even sub-block, high: the odd one).
// One AND-OR (lop3) turns the nibbles of bytes 0 and 2 into the f16 pair (1024 + n0,
// 1024 + n2), and of bytes 1 and 3 after a shift by 8 into (1024 + n1, 1024 + n3). For the
// instruction over values 16h .. 16h + 15 of sub-block s the lane's A registers are
//   a0 = row g    (v0, v2)   logical k (2q, 2q + 1)
//   a2 = row g    (v1, v3)   logical k (2q + 8, 2q + 9)
//   a1, a3 = the same for row g + 8
// so B must hold activation values (v0, v2) in b0 and (v1, v3) in b1 for token g. The
// activation rows are stored with each group of four values in the order (0, 2, 1, 3)
// (stored_index), which makes b0 and b1 one 8-byte load at value 16h + 4q.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

namespace hablar::cuda::q4k_f16 {

// f16 bits of 1024.0: with a nibble n in the low mantissa bits the value is 1024 + n exactly.
constexpr uint32_t kMagicPair = 0x64006400u;

// Position in a stored activation row of value i (and, the permutation being its own
// inverse, the value at position i).
__host__ __device__ constexpr int stored_index(int i) {
  const int j = i & 3;
  return (i & ~3) | (j == 1 ? 2 : (j == 2 ? 1 : j));
}

// The power of two e of an activation row with largest magnitude `largest`: the row is
// stored times 2^(15 - e), its largest magnitude in [2^14, 2^15); rows of zeros and rows with
// inf or nan keep their values (e = 15, scale 1).
__host__ __device__ inline int f16_row_exponent(float largest) {
  int e = 15;
  if (largest > 0.0f && isfinite(largest)) frexpf(largest, &e);  // largest < 2^e
  return e;
}

// The f16 pairs (1024 + n0, 1024 + n2) and (1024 + n1, 1024 + n3) of a nibble word's four
// bytes: their low nibbles (odd = 0, the even sub-block) or high nibbles (odd = 1).
struct NibblePairs {
  uint32_t v02, v13;
};
__host__ __device__ __forceinline__ NibblePairs nibble_pairs(uint32_t word, int odd) {
  const uint32_t w = word >> (4 * odd);
  return {(w & 0x000F000Fu) | kMagicPair, ((w >> 8) & 0x000F000Fu) | kMagicPair};
}

// The six-bit (scale, min) pair of sub-block s (0..7) from the 12 scale bytes of a Q4_K
// super-block (bytes 4..15, held as the words sc0 = bytes 4..7, sc1 = 8..11, sc2 = 12..15),
// packed as the f16 bits of (1024 + scale, 1024 + min).
__host__ __device__ __forceinline__ uint32_t scale_min_pair(uint32_t sc0, uint32_t sc1,
                                                            uint32_t sc2, int s) {
  const int shift = 8 * (s & 3);
  uint32_t scale, min;
  if (s < 4) {
    scale = (sc0 >> shift) & 63u;
    min = (sc1 >> shift) & 63u;
  } else {
    scale = ((sc2 >> shift) & 0xFu) | (((sc0 >> shift) >> 6 & 3u) << 4);
    min = ((sc2 >> shift) >> 4 & 0xFu) | (((sc1 >> shift) >> 6 & 3u) << 4);
  }
  return (scale | (min << 16)) | kMagicPair;
}

}  // namespace hablar::cuda::q4k_f16
