// AVX2 + FMA + F16C forms of the attention and activation ops (ops_x86.h). AVX2 is the
// minimum x86-64 level hablar supports; the dispatch in attention.cpp / ops.cpp still checks.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cpu/avx2_common.h"
#include "backend/cpu/ops.h"
#include "backend/cpu/ops_x86.h"

namespace hablar::cpu::avx2 {

uint64_t read_through(const uint8_t* p, size_t n) {
  // Four 32-byte loads per 128 bytes into two xor chains; the scalar form's result.
  __m256i a = _mm256_setzero_si256(), b = a;
  size_t i = 0;
  for (; i + 128 <= n; i += 128) {
    a = _mm256_xor_si256(a, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i)));
    b = _mm256_xor_si256(b, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i + 32)));
    a = _mm256_xor_si256(a, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i + 64)));
    b = _mm256_xor_si256(b, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i + 96)));
  }
  if (i < n) {  // one 64-byte line left
    a = _mm256_xor_si256(a, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i)));
    b = _mm256_xor_si256(b, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i + 32)));
  }
  const __m256i v = _mm256_xor_si256(a, b);
  const __m128i h = _mm_xor_si128(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  return (uint64_t)_mm_cvtsi128_si64(h) ^ (uint64_t)_mm_extract_epi64(h, 1);
}

void swiglu(const float* gate, const float* up, float* out, int64_t n) {
  int64_t i = 0;
  const __m256 one = _mm256_set1_ps(1.0f);
  for (; i + 8 <= n; i += 8) {
    const __m256 g = _mm256_loadu_ps(gate + i);
    const __m256 e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), g));
    const __m256 silu = _mm256_div_ps(g, _mm256_add_ps(one, e));
    _mm256_storeu_ps(out + i, _mm256_mul_ps(silu, _mm256_loadu_ps(up + i)));
  }
  for (; i < n; ++i) out[i] = gate[i] / (1.0f + exp_approx(-gate[i])) * up[i];
}

void rope_apply(float* x, int n_heads, int head_dim, const RopeParams& p, const float* cos_t,
                const float* sin_t) {
  const int half = p.n_dims / 2;
  for (int h = 0; h < n_heads; ++h) {
    float* v = x + (int64_t)h * head_dim;
    int i = 0;
    if (p.neox) {  // pairs (i, i + half): 8 at a time
      for (; i + 8 <= half; i += 8) {
        const __m256 x0 = _mm256_loadu_ps(v + i), x1 = _mm256_loadu_ps(v + i + half);
        const __m256 c = _mm256_loadu_ps(cos_t + i), s = _mm256_loadu_ps(sin_t + i);
        _mm256_storeu_ps(v + i, _mm256_fmsub_ps(x0, c, _mm256_mul_ps(x1, s)));
        _mm256_storeu_ps(v + i + half, _mm256_fmadd_ps(x0, s, _mm256_mul_ps(x1, c)));
      }
    }
    for (; i < half; ++i) {
      const int a = p.neox ? i : 2 * i;
      const int b = p.neox ? i + half : 2 * i + 1;
      const float x0 = v[a], x1 = v[b];
      v[a] = std::fma(x0, cos_t[i], -(x1 * sin_t[i]));
      v[b] = std::fma(x0, sin_t[i], x1 * cos_t[i]);
    }
  }
}

}  // namespace hablar::cpu::avx2
