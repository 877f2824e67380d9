// Bidirectional attention of the embedding step in AVX-512 (embed_kernels.h). Work unit: one
// (sequence, head). Its K rows are transposed once into a strip kt[head_dim][L16] (L16 = the
// length rounded up to 16, zero-padded), so 16 keys' scores are computed together; the
// weighted sum of V rows takes head_dim / 16 vectors per query. Every value takes the
// operations of EmbedOps' plain loops in their order (which agree with llama.cpp to cosine
// 1 - 1e-7 on the goldens; a reordered softmax moved Q8_0 models' activation quantization
// and a reranker's score visibly), so the results are those loops' bits.
#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <vector>

#include "backend/cpu/embed_kernels.h"
#include "core/error.h"

#define HABLAR_TARGET_INLINE __attribute__((always_inline)) inline

namespace hablar::cpu::embed {
namespace {

struct Unit {
  const AttentionShape& sh;
  int64_t base, len;  // the sequence's first row and length
  int h;
};

// 16 keys' q·k in the plain dot's order: lane l of 8 sums q[d] * k[d] (a product, then an
// add: no FMA) over d = l, l + 8, ...; the lanes then add as ((0+4)+(1+5))+((2+6)+(3+7)).
HABLAR_TARGET_INLINE __m512 dot16(const float* q, const float* kt, int64_t l16, int HD) {
  __m512 lane[8];
  for (int l = 0; l < 8; ++l) lane[l] = _mm512_setzero_ps();
  for (int d0 = 0; d0 < HD; d0 += 8)
    for (int l = 0; l < 8; ++l)
      lane[l] = _mm512_add_ps(
          lane[l], _mm512_mul_ps(_mm512_set1_ps(q[d0 + l]), _mm512_loadu_ps(kt + (d0 + l) * l16)));
  return _mm512_add_ps(
      _mm512_add_ps(_mm512_add_ps(lane[0], lane[4]), _mm512_add_ps(lane[1], lane[5])),
      _mm512_add_ps(_mm512_add_ps(lane[2], lane[6]), _mm512_add_ps(lane[3], lane[7])));
}

// scores[j] = q · k_j * scale for the L16 keys of the strip (padding keys masked later).
void scores_of(const Unit& u, const float* q, const float* kt, int64_t l16, float* scores) {
  const __m512 scale = _mm512_set1_ps(u.sh.scale);
  for (int64_t j = 0; j < l16; j += 16)
    _mm512_storeu_ps(scores + j, _mm512_mul_ps(dot16(q, kt + j, l16, u.sh.head_dim), scale));
}

// out = softmax(scores[0..len)) · V of this head, as the plain loops compute it: e^(s - max)
// by std::exp, their sum in double in key order, p = e * float(1 / sum), and out[d] += p *
// v[d] (a product, then an add) in key order, 16 dimensions per vector.
void weighted_values(const Unit& u, const float* v, float* scores, float* out) {
  const int HD = u.sh.head_dim;
  const int64_t KVD = (int64_t)u.sh.n_kv_heads * HD;
  const int kvh = u.h / (u.sh.n_heads / u.sh.n_kv_heads);
  if (u.sh.softcap > 0.0f)
    for (int64_t j = 0; j < u.len; ++j)
      scores[j] = u.sh.softcap * std::tanh(scores[j] / u.sh.softcap);
  float mx = -INFINITY;
  for (int64_t j = 0; j < u.len; ++j) mx = std::max(mx, scores[j]);
  double sum = 0;
  for (int64_t j = 0; j < u.len; ++j) sum += (scores[j] = std::exp(scores[j] - mx));
  const float inv = (float)(1.0 / sum);
  const float* vh = v + u.base * KVD + (int64_t)kvh * HD;
  for (int d0 = 0; d0 < HD; d0 += 64) {  // up to 4 vectors of dimensions at a time
    const int nv = std::min(4, (HD - d0) / 16);
    __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(),
                     _mm512_setzero_ps()};
    for (int64_t j = 0; j < u.len; ++j) {
      const __m512 p = _mm512_set1_ps(scores[j] * inv);
      const float* row = vh + j * KVD + d0;
      for (int i = 0; i < nv; ++i)
        acc[i] = _mm512_add_ps(acc[i], _mm512_mul_ps(p, _mm512_loadu_ps(row + 16 * i)));
    }
    for (int i = 0; i < nv; ++i) _mm512_storeu_ps(out + d0 + 16 * i, acc[i]);
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
    weighted_values(u, v, scores.data(), out + t * QD + (int64_t)u.h * HD);
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
