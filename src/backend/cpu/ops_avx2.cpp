// AVX2 + FMA + F16C forms of the attention and activation ops (ops_x86.h). AVX2 is the
// minimum x86-64 level hablar supports; the dispatch in attention.cpp / ops.cpp still checks.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cpu/ops.h"
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

__m256 round_to_kv8(__m256 x, bool bf16) {
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
__m256 pow2_8(__m256 n) {
  return _mm256_castsi256_ps(
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23));
}

// exp_approx (ops.h) on 8 lanes, bit for bit.
__m256 exp8(__m256 x) {
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

}  // namespace

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

namespace {

// q·k with 16 partial sums (d mod 16) as two vectors; hd is a multiple of 16.
float dot_qk16(const float* qr, const uint16_t* k, int hd, bool bf16) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  for (int d = 0; d < hd; d += 16) {
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(qr + d), load8(k + d, bf16), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(qr + d + 8), load8(k + d + 8, bf16), acc1);
  }
  return hsum8(_mm256_add_ps(acc0, acc1));
}

// q·k with 64 partial sums (d mod 64) as eight vectors, folded and reduced as fold64 and
// reduce16 do, then the tail past the last 64 added in double; hd is a multiple of 8.
float dot_qk64(const float* qr, const uint16_t* k, int hd, bool bf16) {
  __m256 acc[8];
  for (__m256& a : acc) a = _mm256_setzero_ps();
  const int main_dims = hd / 64 * 64;
  for (int d = 0; d < main_dims; d += 64)
    for (int j = 0; j < 8; ++j)
      acc[j] = _mm256_fmadd_ps(_mm256_loadu_ps(qr + d + 8 * j), load8(k + d + 8 * j, bf16), acc[j]);
  // Lanes 0-7 of the 16 are vectors 0, 2, 4, 6 (offsets 0, 16, 32, 48); lanes 8-15 the odd ones.
  const __m256 lo = _mm256_add_ps(_mm256_add_ps(acc[0], acc[4]), _mm256_add_ps(acc[2], acc[6]));
  const __m256 hi = _mm256_add_ps(_mm256_add_ps(acc[1], acc[5]), _mm256_add_ps(acc[3], acc[7]));
  double sum = (double)hsum8(_mm256_add_ps(lo, hi));
  alignas(32) float tail[8];
  for (int d = main_dims; d < hd; d += 8) {
    _mm256_store_ps(tail, _mm256_mul_ps(_mm256_loadu_ps(qr + d), load8(k + d, bf16)));
    for (float t : tail) sum += (double)t;
  }
  return (float)sum;
}

// scores[first..pos] -> exp_approx(score - max) in place; returns their sum, taken by
// 16-position blocks from first's block (each reduce16'd in float, zeros outside
// [first, pos]) in double.
double softmax_numerators(float* scores, int first, int pos, float max_score) {
  const __m256 vmax = _mm256_set1_ps(max_score);
  double sum = 0.0;
  // A block with lanes outside [first, pos]: through a zero-padded copy.
  const auto partial_block = [&](int p) {
    alignas(32) float block[kReduceLanes] = {};
    const int lo = std::max(p, first) - p, hi = std::min(p + kReduceLanes, pos + 1) - p;
    std::copy(scores + p + lo, scores + p + hi, block + lo);
    const __m256 e0 = exp8(_mm256_sub_ps(_mm256_load_ps(block), vmax));
    const __m256 e1 = exp8(_mm256_sub_ps(_mm256_load_ps(block + 8), vmax));
    _mm256_store_ps(block, e0), _mm256_store_ps(block + 8, e1);
    for (int i = 0; i < kReduceLanes; ++i)
      if (i < lo || i >= hi) block[i] = 0.0f;
    std::copy(block + lo, block + hi, scores + p + lo);
    sum += (double)hsum8(_mm256_add_ps(_mm256_load_ps(block), _mm256_load_ps(block + 8)));
  };
  int p = first / kReduceLanes * kReduceLanes;
  if (p < first) {
    partial_block(p);
    p += kReduceLanes;
  }
  for (; p + kReduceLanes <= pos + 1; p += kReduceLanes) {
    const __m256 e0 = exp8(_mm256_sub_ps(_mm256_loadu_ps(scores + p), vmax));
    const __m256 e1 = exp8(_mm256_sub_ps(_mm256_loadu_ps(scores + p + 8), vmax));
    _mm256_storeu_ps(scores + p, e0), _mm256_storeu_ps(scores + p + 8, e1);
    sum += (double)hsum8(_mm256_add_ps(e0, e1));
  }
  if (p <= pos) partial_block(p);  // the last, partial block
  return sum;
}

// out[d] = the rows' partial sums (rows 16 or 64; those from used_rows on are zeros) folded
// (fold64) and reduced (reduce16), 8 dimensions at a time.
void reduce_rows(const float* acc, int rows, int used_rows, int hd, float* out) {
  for (int d = 0; d < hd; d += 8) {
    const auto row = [&](int i) {
      return i < used_rows ? _mm256_loadu_ps(acc + (size_t)i * hd + d) : _mm256_setzero_ps();
    };
    __m256 t[kReduceLanes], b[8], c[4];
    for (int l = 0; l < kReduceLanes; ++l)
      t[l] = rows == 64 ? _mm256_add_ps(_mm256_add_ps(row(l), row(l + 32)),
                                        _mm256_add_ps(row(l + 16), row(l + 48)))
                        : row(l);
    for (int i = 0; i < 8; ++i) b[i] = _mm256_add_ps(t[i], t[i + 8]);
    for (int i = 0; i < 4; ++i) c[i] = _mm256_add_ps(b[i], b[i + 4]);
    _mm256_storeu_ps(out + d, _mm256_add_ps(_mm256_add_ps(c[0], c[2]), _mm256_add_ps(c[1], c[3])));
  }
}

}  // namespace

// attend_head_scalar (attention.cpp) with 8-lane vectors, bit for bit: q·k in dot_qk16 or
// dot_qk64; the V sum in rows of hd values, row = position mod 16 (or 64), then reduce_rows.
// head_dim is a multiple of 8; scores has room for pos + 1 values.
void attend_head(const uint16_t* cache, const KvCacheLayout& layout, int layer,
                 const int32_t* block_table, int first, int pos, int kv_head, const float* q,
                 float scale, float softcap, SumOrder order, float* scores, float* out) {
  const int hd = layout.head_dim;
  const bool bf16 = layout.dtype == KvDType::BF16;
  const int bs = layout.block_size;
  const int rows = order == SumOrder::kLanes64 ? 64 : kReduceLanes;
  const bool qk16 = order == SumOrder::kLanes16 && hd % kReduceLanes == 0;
  thread_local std::vector<float> scratch;
  if (scratch.size() < (size_t)(rows + 1) * (size_t)hd) scratch.resize((size_t)(rows + 1) * hd);
  float* qr = scratch.data();
  float* acc = qr + hd;
  // Rows past these stay zeros: position p adds to row p % rows.
  const int used_rows = std::min(rows, pos + 1);
  for (int64_t i = 0; i < (int64_t)used_rows * hd; i += 8)
    _mm256_storeu_ps(acc + i, _mm256_setzero_ps());
  for (int d = 0; d < hd; d += 8)
    _mm256_storeu_ps(qr + d, round_to_kv8(_mm256_loadu_ps(q + d), bf16));
  float max_score = -INFINITY;
  // Positions [first, pos] block by block of the paged cache.
  const auto for_each_position = [&](int kv, const auto& fn) {
    for (int p0 = first / bs * bs; p0 <= pos; p0 += bs) {
      const int s0 = std::max(first - p0, 0), n = std::min(bs, pos + 1 - p0);
      const uint16_t* row = cache + layout.position_offset(block_table, layer, kv, kv_head, p0);
      for (int s = s0; s < n; ++s) fn(p0 + s, row + (size_t)s * hd);
    }
  };
  for_each_position(0, [&](int p, const uint16_t* k) {
    const float dot = qk16 ? dot_qk16(qr, k, hd, bf16) : dot_qk64(qr, k, hd, bf16);
    scores[p] = dot * scale;
    if (softcap > 0.0f) cpu::softcap(scores + p, 1, softcap);
    max_score = std::max(max_score, scores[p]);
  });
  const float inv = (float)(1.0 / softmax_numerators(scores, first, pos, max_score));
  for_each_position(1, [&](int p, const uint16_t* v) {
    const float w = _mm256_cvtss_f32(round_to_kv8(_mm256_set1_ps(scores[p] * inv), bf16));
    const __m256 wv = _mm256_set1_ps(w);
    float* row = acc + (size_t)(p % rows) * hd;
    for (int d = 0; d < hd; d += 8)
      _mm256_storeu_ps(row + d, _mm256_fmadd_ps(wv, load8(v + d, bf16), _mm256_loadu_ps(row + d)));
  });
  reduce_rows(acc, rows, used_rows, hd, out);
}

}  // namespace hablar::cpu::avx2
