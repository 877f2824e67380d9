// Byte layouts of the GGUF quantized blocks. Scales are IEEE halves stored as uint16_t
// (convert with core/fp16.h). Values x are reconstructed as noted per block; "nibble j"
// of qs[i] is (qs[i] & 0xF) for j < 16 and (qs[i] >> 4) for j >= 16 in the 32-value types.
// These structs are shared by the CPU and CUDA backends; sizes are checked below.
#pragma once

#include <cstdint>

namespace hablar {

constexpr int kQK = 32;    // values per block of the simple formats
constexpr int kQK_K = 256; // values per super-block of the K-quants
constexpr int kKScaleBytes = 12;  // packed 6-bit scales/mins of Q4_K and Q5_K

// x = d * (q - 8), q a 4-bit value
struct BlockQ4_0 {
  uint16_t d;
  uint8_t qs[kQK / 2];
};
// x = d * q + m
struct BlockQ4_1 {
  uint16_t d;
  uint16_t m;
  uint8_t qs[kQK / 2];
};
// x = d * (q - 16), q = nibble | (bit j of qh) << 4
struct BlockQ5_0 {
  uint16_t d;
  uint8_t qh[4];
  uint8_t qs[kQK / 2];
};
// x = d * q + m, q as in Q5_0
struct BlockQ5_1 {
  uint16_t d;
  uint16_t m;
  uint8_t qh[4];
  uint8_t qs[kQK / 2];
};
// x = d * q, q signed 8-bit
struct BlockQ8_0 {
  uint16_t d;
  int8_t qs[kQK];
};
// Activation block for integer dot products with the *_1 formats: s = d * sum(qs).
struct BlockQ8_1 {
  uint16_t d;
  uint16_t s;
  int8_t qs[kQK];
};

// 16 sub-blocks of 16; x = d * (scales[i] & 0xF) * q - dmin * (scales[i] >> 4), q 2-bit
struct BlockQ2_K {
  uint8_t scales[kQK_K / 16];
  uint8_t qs[kQK_K / 4];
  uint16_t d;
  uint16_t dmin;
};
// 16 sub-blocks of 16; x = d * (scale6 - 32) * (q - (hmask bit ? 0 : 4)), q 2 low bits
struct BlockQ3_K {
  uint8_t hmask[kQK_K / 8];
  uint8_t qs[kQK_K / 4];
  uint8_t scales[12];
  uint16_t d;
};
// 8 sub-blocks of 32; x = d * sc * q - dmin * m, (sc, m) 6-bit, packed in scales
struct BlockQ4_K {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[kKScaleBytes];
  uint8_t qs[kQK_K / 2];
};
// As Q4_K with a fifth bit per value in qh.
struct BlockQ5_K {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[kKScaleBytes];
  uint8_t qh[kQK_K / 8];
  uint8_t qs[kQK_K / 2];
};
// 16 sub-blocks of 16; x = d * scales[i] * (q - 32), q = 4 low bits (ql) | 2 high (qh)
struct BlockQ6_K {
  uint8_t ql[kQK_K / 2];
  uint8_t qh[kQK_K / 4];
  int8_t scales[kQK_K / 16];
  uint16_t d;
};
// Activation super-block for K-quant dot products; bsums = sums of each 16 qs.
struct BlockQ8_K {
  float d;
  int8_t qs[kQK_K];
  int16_t bsums[kQK_K / 16];
};
// x = d * kIQ4NLValues[q]
struct BlockIQ4_NL {
  uint16_t d;
  uint8_t qs[kQK / 2];
};
// 8 sub-blocks of 32 with 6-bit scales (4 low bits in scales_l, 2 high in scales_h);
// x = d * (scale - 32) * kIQ4NLValues[q]
struct BlockIQ4_XS {
  uint16_t d;
  uint16_t scales_h;
  uint8_t scales_l[kQK_K / 64];
  uint8_t qs[kQK_K / 2];
};

// The non-linear 4-bit codebook of IQ4_NL and IQ4_XS.
inline constexpr int8_t kIQ4NLValues[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                            1,    13,   25,  38,  53,  69,  89,  113};

static_assert(sizeof(BlockQ4_0) == 18);
static_assert(sizeof(BlockQ4_1) == 20);
static_assert(sizeof(BlockQ5_0) == 22);
static_assert(sizeof(BlockQ5_1) == 24);
static_assert(sizeof(BlockQ8_0) == 34);
static_assert(sizeof(BlockQ8_1) == 36);
static_assert(sizeof(BlockQ2_K) == 84);
static_assert(sizeof(BlockQ3_K) == 110);
static_assert(sizeof(BlockQ4_K) == 144);
static_assert(sizeof(BlockQ5_K) == 176);
static_assert(sizeof(BlockQ6_K) == 210);
static_assert(sizeof(BlockQ8_K) == 292);
static_assert(sizeof(BlockIQ4_NL) == 18);
static_assert(sizeof(BlockIQ4_XS) == 136);

}  // namespace hablar
