// Bidirectional attention of the embedding step in AVX-512 (embed_kernels.h). Work unit: one
// (sequence, head). Its K rows are transposed once into a strip kt[head_dim][L16] (L16 = the
// length rounded up to 16, zero-padded), so the scores of 16 keys are one FMA chain over the
// head's dimensions; the softmax uses cpu::exp_approx's polynomial on 16 lanes; the output
// is the weighted sum of V rows, head_dim / 16 vectors per query.
#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <vector>

#include "backend/cpu/embed_kernels.h"
#include "core/error.h"

namespace hablar::cpu::embed {
namespace {

// e^x for x <= 0 (x - max of a softmax row), exp_approx's reduction and polynomial; results
// below 2^-126 flush to 0 (exp_approx keeps them as subnormals: a weight < 1e-38 either way).
__m512 exp_nonpositive(__m512 x) {
  const __m512 shifter = _mm512_set1_ps(0x1.8p23f);
  const __m512 n =
      _mm512_sub_ps(_mm512_fmadd_ps(x, _mm512_set1_ps(0x1.715476p+0f), shifter), shifter);
  const __m512 b =
      _mm512_fmadd_ps(_mm512_sub_ps(_mm512_setzero_ps(), n), _mm512_set1_ps(0x1.7f7d1cp-20f),
                      _mm512_fnmadd_ps(n, _mm512_set1_ps(0x1.62e4p-1f), x));
  const __m512 u = _mm512_mul_ps(b, b);
  const __m512 hi = _mm512_fmadd_ps(
      _mm512_fmadd_ps(_mm512_set1_ps(0x1.0e4020p-7f), b, _mm512_set1_ps(0x1.573e2ep-5f)), u,
      _mm512_fmadd_ps(_mm512_set1_ps(0x1.555e66p-3f), b, _mm512_set1_ps(0x1.fffdb6p-2f)));
  const __m512 j =
      _mm512_fmadd_ps(hi, u, _mm512_fmadd_ps(_mm512_set1_ps(0x1.ffffecp-1f), b, _mm512_set1_ps(1)));
  const __m512i ni = _mm512_cvtps_epi32(n);
  const __m512 scale =
      _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(ni, _mm512_set1_epi32(127)), 23));
  const __mmask16 tiny = _mm512_cmp_ps_mask(n, _mm512_set1_ps(-126.0f), _CMP_LT_OQ);
  return _mm512_maskz_mul_ps((__mmask16)~tiny, j, scale);
}

struct Unit {
  const AttentionShape& sh;
  int64_t base, len;  // the sequence's first row and length
  int h;
};

// scores[j] = scale * q · k_j for the L16 keys of the strip (padding keys score 0, masked later).
void scores_of(const Unit& u, const float* q, const float* kt, int64_t l16, float* scores) {
  const int HD = u.sh.head_dim;
  int64_t j = 0;
  for (; j + 64 <= l16; j += 64) {
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (int d = 0; d < HD; ++d) {
      const __m512 qd = _mm512_set1_ps(q[d]);
      const float* row = kt + d * l16 + j;
      a0 = _mm512_fmadd_ps(qd, _mm512_loadu_ps(row), a0);
      a1 = _mm512_fmadd_ps(qd, _mm512_loadu_ps(row + 16), a1);
      a2 = _mm512_fmadd_ps(qd, _mm512_loadu_ps(row + 32), a2);
      a3 = _mm512_fmadd_ps(qd, _mm512_loadu_ps(row + 48), a3);
    }
    const __m512 s = _mm512_set1_ps(u.sh.scale);
    _mm512_storeu_ps(scores + j, _mm512_mul_ps(a0, s));
    _mm512_storeu_ps(scores + j + 16, _mm512_mul_ps(a1, s));
    _mm512_storeu_ps(scores + j + 32, _mm512_mul_ps(a2, s));
    _mm512_storeu_ps(scores + j + 48, _mm512_mul_ps(a3, s));
  }
  for (; j < l16; j += 16) {
    __m512 a = _mm512_setzero_ps();
    for (int d = 0; d < HD; ++d)
      a = _mm512_fmadd_ps(_mm512_set1_ps(q[d]), _mm512_loadu_ps(kt + d * l16 + j), a);
    _mm512_storeu_ps(scores + j, _mm512_mul_ps(a, _mm512_set1_ps(u.sh.scale)));
  }
}

// out = softmax(scores[0..len)) · V of this head.
void weighted_values(const Unit& u, const float* v, float* scores, int64_t l16, float* out) {
  const int HD = u.sh.head_dim;
  const int64_t KVD = (int64_t)u.sh.n_kv_heads * HD;
  const int kvh = u.h / (u.sh.n_heads / u.sh.n_kv_heads);
  if (u.sh.softcap > 0.0f)
    for (int64_t j = 0; j < u.len; ++j)
      scores[j] = u.sh.softcap * std::tanh(scores[j] / u.sh.softcap);
  for (int64_t j = u.len; j < l16; ++j) scores[j] = -INFINITY;
  __m512 m = _mm512_set1_ps(-INFINITY);
  for (int64_t j = 0; j < l16; j += 16) m = _mm512_max_ps(m, _mm512_loadu_ps(scores + j));
  const __m512 mx = _mm512_set1_ps(_mm512_reduce_max_ps(m));
  __m512 sum = _mm512_setzero_ps();
  for (int64_t j = 0; j < l16; j += 16) {
    const __m512 e = exp_nonpositive(_mm512_sub_ps(_mm512_loadu_ps(scores + j), mx));
    _mm512_storeu_ps(scores + j, e);
    sum = _mm512_add_ps(sum, e);
  }
  const float inv = 1.0f / _mm512_reduce_add_ps(sum);
  const float* vh = v + u.base * KVD + (int64_t)kvh * HD;
  for (int d0 = 0; d0 < HD; d0 += 64) {  // up to 4 vectors of dimensions at a time
    const int nv = std::min(4, (HD - d0) / 16);
    __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(),
                     _mm512_setzero_ps()};
    for (int64_t j = 0; j < u.len; ++j) {
      const __m512 p = _mm512_set1_ps(scores[j]);
      const float* row = vh + j * KVD + d0;
      for (int i = 0; i < nv; ++i)
        acc[i] = _mm512_fmadd_ps(p, _mm512_loadu_ps(row + 16 * i), acc[i]);
    }
    for (int i = 0; i < nv; ++i)
      _mm512_storeu_ps(out + d0 + 16 * i, _mm512_mul_ps(acc[i], _mm512_set1_ps(inv)));
  }
}

void run_unit(const Unit& u, const float* q, const float* k, const float* v, float* out,
              std::vector<float>& kt, std::vector<float>& scores) {
  const int HD = u.sh.head_dim;
  const int64_t QD = (int64_t)u.sh.n_heads * HD, KVD = (int64_t)u.sh.n_kv_heads * HD;
  const int kvh = u.h / (u.sh.n_heads / u.sh.n_kv_heads);
  const int64_t l16 = (u.len + 15) / 16 * 16;
  kt.assign((size_t)(HD * l16), 0.0f);
  scores.resize((size_t)l16);
  for (int64_t j = 0; j < u.len; ++j) {
    const float* kr = k + (u.base + j) * KVD + (int64_t)kvh * HD;
    for (int d = 0; d < HD; ++d) kt[(size_t)(d * l16 + j)] = kr[d];
  }
  for (int64_t i = 0; i < u.len; ++i) {
    const int64_t t = u.base + i;
    scores_of(u, q + t * QD + (int64_t)u.h * HD, kt.data(), l16, scores.data());
    weighted_values(u, v, scores.data(), l16, out + t * QD + (int64_t)u.h * HD);
  }
}

}  // namespace

void bidirectional_attention(const AttentionShape& shape, std::span<const int64_t> seq_begin,
                             const float* q, const float* k, const float* v, float* out,
                             ThreadPool& pool) {
  HABLAR_CHECK(
      shape.head_dim % 16 == 0 && shape.n_kv_heads > 0 && shape.n_heads % shape.n_kv_heads == 0,
      "bidirectional_attention: head_dim must be a multiple of 16");
  const int64_t n_seq = (int64_t)seq_begin.size() - 1;
  const int64_t units = n_seq * shape.n_heads;
  std::atomic<int64_t> next{0};
  pool.run([&](int, int) {
    std::vector<float> kt, scores;
    for (int64_t i = next.fetch_add(1); i < units; i = next.fetch_add(1)) {
      const int64_t s = i / shape.n_heads;
      const Unit u{shape, seq_begin[(size_t)s], seq_begin[(size_t)s + 1] - seq_begin[(size_t)s],
                   (int)(i % shape.n_heads)};
      run_unit(u, q, k, v, out, kt, scores);
    }
  });
}

}  // namespace hablar::cpu::embed
