// Integer q·k over a quantized K cache (Q8_0 or Q4_0 rows), as llama.cpp's CPU flash
// attention computes the scores for those K types (its K type's vec_dot against q converted
// to the vec_dot type, Q8_0 for both):
//   - q is quantized once per (token, head) to Q8_0 blocks of 32 (quantize_act32's codes and
//     scales: d = fp16(max|q| / 127), codes round-to-even(q * 127 / max|q|));
//   - each block's 32 integer products k_i * q_i are summed in 8 lanes of 4 consecutive values
//     (lane j: values 4j .. 4j + 3; exact int32 sums);
//   - lane j accumulates fma(d_k * d_q, (float)isum_j, acc_j) block by block from zero, where
//     d_k * d_q is one float product (K's half widened, then times q's);
//   - the 8 lanes are reduced as llama.cpp's hsum_float_8: ((l0 + l4) + (l2 + l6)) +
//     ((l1 + l5) + (l3 + l7)).
// Q4_0 codes count as nibble - 8 (values j < 16 in the low nibbles of qs[j], the others in the
// high nibbles of qs[j - 16]). The scalar form is the definition; the AVX2 form (one key at a
// time) and the AVX-512 form (16 keys at a time, VNNI) give its bits.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/kv_layout.h"

namespace hablar::cpu {

// q of one head quantized for the integer q·k: qs [hd] codes, d [hd / 32] block scales (the
// halves widened to float), and corr [hd / 4]: -off * (the sum of the 4 codes of lane
// group w), off = 128 for a Q8_0 K (whose codes the AVX-512 form offsets by 128 to make them
// unsigned) and 8 for Q4_0 (whose nibbles are used as they are). hd a multiple of 32.
struct QkQuantRow {
  int8_t* qs;
  float* d;
  int32_t* corr;
};
// Floats of scratch one row needs (qs, d and corr packed in 4-byte units).
inline size_t qk_quant_row_words(int hd) {
  return (size_t)hd / 4 + (size_t)hd / 32 + (size_t)hd / 4;
}
// Views of a row of qk_quant_row_words(hd) 4-byte units.
QkQuantRow qk_quant_row(void* words, int hd);
void quantize_q_for_k(const float* q, int hd, KvDType k_type, const QkQuantRow& out);

// q·k of one K row (type Q8_0 or Q4_0) with the quantized q, in the order above.
float dot_qk_int_scalar(const uint16_t* k_row, KvDType k_type, const QkQuantRow& q, int hd);

namespace avx2 {
// The same bits with 8-lane vectors (llama.cpp's AVX2 vec_dot form).
float dot_qk_int(const uint16_t* k_row, KvDType k_type, const QkQuantRow& q, int hd);
}  // namespace avx2

namespace avx512 {
// The dots of one quantized q with 16 K rows (rows[j], j < 16), the same bits as the scalar
// form, out[16]. The tiled scores stage runs the same kernel over several q rows at once.
void dot_qk_int16(const uint16_t* const* rows, KvDType k_type, const QkQuantRow& q, int hd,
                  float* out);
}  // namespace avx512

}  // namespace hablar::cpu
