// Inline AVX2 + FMA + F16C helpers shared by the SIMD files compiled with those flags
// (ops_avx2.cpp, attention_avx2.cpp). Include only from such files.
#pragma once

#include <immintrin.h>

#include <cmath>
#include <cstdint>

namespace hablar::cpu::avx2 {

inline float hsum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline __m256 load8(const uint16_t* p, bool bf16) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  if (!bf16) return _mm256_cvtph_ps(h);
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

inline __m256 round_to_kv8(__m256 x, bool bf16) {
  if (!bf16) return _mm256_cvtph_ps(_mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT));
  // bf16: round the low 16 bits to nearest, ties to even (finite values; NaN stays NaN).
  const __m256i bits = _mm256_castps_si256(x);
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_add_epi32(bits, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), odd));
  const __m256i kept = _mm256_and_si256(rounded, _mm256_set1_epi32((int)0xffff0000u));
  const __m256 nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
  return _mm256_blendv_ps(_mm256_castsi256_ps(kept), x, nan);
}

// 2^n for integral float lanes n in [-126, 127].
inline __m256 pow2_8(__m256 n) {
  return _mm256_castsi256_ps(
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23));
}

// exp_approx (ops.h) on 8 lanes, bit for bit.
inline __m256 exp8(__m256 x) {
  const __m256 shifter = _mm256_set1_ps(0x1.8p23f);
  const __m256 n =
      _mm256_sub_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(0x1.715476p+0f), shifter), shifter);
  const __m256 b = _mm256_fnmadd_ps(n, _mm256_set1_ps(0x1.7f7d1cp-20f),
                                    _mm256_fnmadd_ps(n, _mm256_set1_ps(0x1.62e4p-1f), x));
  const __m256 u = _mm256_mul_ps(b, b);
  const __m256 j = _mm256_fmadd_ps(
      _mm256_fmadd_ps(
          _mm256_fmadd_ps(_mm256_set1_ps(0x1.0e4020p-7f), b, _mm256_set1_ps(0x1.573e2ep-5f)), u,
          _mm256_fmadd_ps(_mm256_set1_ps(0x1.555e66p-3f), b, _mm256_set1_ps(0x1.fffdb6p-2f))),
      u, _mm256_fmadd_ps(_mm256_set1_ps(0x1.ffffecp-1f), b, _mm256_set1_ps(1.0f)));
  // Scale by 2^(n - n/2) then 2^(n/2) (n/2 truncated toward zero): both factors are normal
  // floats for |n| <= 192, the first product is exact, the second rounds once.
  const __m256 big =
      _mm256_cmp_ps(_mm256_andnot_ps(_mm256_set1_ps(-0.0f), n), _mm256_set1_ps(192.0f), _CMP_GT_OQ);
  const __m256 nc = _mm256_blendv_ps(n, _mm256_setzero_ps(), big);
  const __m256 half = _mm256_round_ps(_mm256_mul_ps(nc, _mm256_set1_ps(0.5f)),
                                      _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
  const __m256 res = _mm256_mul_ps(_mm256_mul_ps(j, pow2_8(_mm256_sub_ps(nc, half))), pow2_8(half));
  const __m256 alt = _mm256_blendv_ps(_mm256_set1_ps(INFINITY), _mm256_setzero_ps(),
                                      _mm256_cmp_ps(n, _mm256_setzero_ps(), _CMP_LE_OQ));
  return _mm256_blendv_ps(res, alt, big);
}

}  // namespace hablar::cpu::avx2
