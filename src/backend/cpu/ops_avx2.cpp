// AVX2 + FMA + F16C forms of the attention and activation ops (ops_x86.h). AVX2 is the
// minimum x86-64 level hablar supports; the dispatch in attention.cpp / ops.cpp still checks.
#include <immintrin.h>

#include <algorithm>
#include <cmath>

#include "backend/cpu/ops_x86.h"

namespace hablar::cpu::avx2 {
namespace {

float hsum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

__m256 load8(const uint16_t* p, bool bf16) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  if (!bf16) return _mm256_cvtph_ps(h);
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

// e^x for float lanes: x = n ln2 + r, |r| <= ln2/2, e^r by its degree-6 Taylor polynomial
// (relative error below 4e-7), scaled by 2^n through the exponent bits. Inputs are clamped to
// [-87.3, 88.3] so that the result stays a normal float.
__m256 exp8(__m256 x) {
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.3f)), _mm256_set1_ps(88.3f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);  // ln2 high part, exact
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);      // ln2 low part
  __m256 p = _mm256_set1_ps(1.0f / 720.0f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  const __m256i bits =
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(bits));
}

}  // namespace

float exp_scalar(float x) {
  alignas(32) float v[8] = {x};
  _mm256_store_ps(v, exp8(_mm256_load_ps(v)));
  return v[0];
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
  for (; i < n; ++i) out[i] = gate[i] / (1.0f + exp_scalar(-gate[i])) * up[i];
}

// One head of one query: scores over positions [0, pos], softmax, weighted sum of V.
// head_dim is a multiple of 8; scores has room for pos + 1 values.
void attend_head(const uint16_t* cache, const KvCacheLayout& layout, int layer,
                 const int32_t* block_table, int pos, int kv_head, const float* q, float scale,
                 float* scores, float* out) {
  const int hd = layout.head_dim;
  const bool bf16 = layout.dtype == KvDType::BF16;
  const int bs = layout.block_size;
  float max_score = -INFINITY;
  for (int p0 = 0; p0 <= pos; p0 += bs) {
    const uint16_t* k = cache + layout.position_offset(block_table, layer, 0, kv_head, p0);
    const int n = std::min(bs, pos + 1 - p0);
    for (int s = 0; s < n; ++s, k += hd) {
      __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
      int d = 0;
      for (; d + 16 <= hd; d += 16) {
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + d), load8(k + d, bf16), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(q + d + 8), load8(k + d + 8, bf16), acc1);
      }
      if (d < hd) acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + d), load8(k + d, bf16), acc0);
      const float score = hsum8(_mm256_add_ps(acc0, acc1)) * scale;
      scores[p0 + s] = score;
      max_score = std::max(max_score, score);
    }
  }
  const __m256 vmax = _mm256_set1_ps(max_score);
  __m256 vsum = _mm256_setzero_ps();
  int p = 0;
  for (; p + 8 <= pos + 1; p += 8) {
    const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(scores + p), vmax));
    _mm256_storeu_ps(scores + p, e);
    vsum = _mm256_add_ps(vsum, e);
  }
  float sum = hsum8(vsum);
  for (; p <= pos; ++p) {
    scores[p] = exp_scalar(scores[p] - max_score);
    sum += scores[p];
  }
  const float inv = 1.0f / sum;
  for (int d = 0; d < hd; d += 8) _mm256_storeu_ps(out + d, _mm256_setzero_ps());
  for (int p0 = 0; p0 <= pos; p0 += bs) {
    const uint16_t* v = cache + layout.position_offset(block_table, layer, 1, kv_head, p0);
    const int n = std::min(bs, pos + 1 - p0);
    for (int s = 0; s < n; ++s, v += hd) {
      const __m256 w = _mm256_set1_ps(scores[p0 + s] * inv);
      for (int d = 0; d < hd; d += 8)
        _mm256_storeu_ps(out + d, _mm256_fmadd_ps(w, load8(v + d, bf16), _mm256_loadu_ps(out + d)));
    }
  }
}

}  // namespace hablar::cpu::avx2
