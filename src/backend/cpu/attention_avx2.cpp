// AVX2 + FMA + F16C attention over the paged F16/BF16 KV cache (ops_x86.h): the one-head
// form (attend_head) and the tiled form (tile_*), which gives the same bits as attend_head for
// every row of a tile while reading each K/V row once per tile.
#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <vector>

#include "backend/cpu/attention_int.h"
#include "backend/cpu/avx2_common.h"
#include "backend/cpu/ops.h"
#include "backend/cpu/ops_x86.h"
#include "core/cpu_features.h"
#include "core/quant_blocks.h"

namespace hablar::cpu::avx2 {
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

// The 64 partial sums of a 64-lane q·k (eight vectors, d mod 64) folded as fold64 folds them,
// lanes l and l + 8 of the 16 paired (lanes 0-7 are vectors 0, 2, 4, 6, i.e. offsets 0, 16,
// 32, 48; lanes 8-15 the odd ones): what hsum8 (or reduce8x8) finishes in reduce16's order.
[[gnu::always_inline]] inline __m256 fold64_pairs(const __m256 (&acc)[8]) {
  const __m256 lo = _mm256_add_ps(_mm256_add_ps(acc[0], acc[4]), _mm256_add_ps(acc[2], acc[6]));
  const __m256 hi = _mm256_add_ps(_mm256_add_ps(acc[1], acc[5]), _mm256_add_ps(acc[3], acc[7]));
  return _mm256_add_ps(lo, hi);
}

// q·k with 64 partial sums (d mod 64) as eight vectors, folded and reduced as fold64 and
// reduce16 do, then the tail past the last 64 added in double; hd is a multiple of 8.
// Load8 is (const T* p) -> 8 floats of k at p: the cache's halves, or a row already in float.
template <typename T, typename Load8>
float dot_qk64_with(const float* qr, const T* k, int hd, Load8 load) {
  __m256 acc[8];
  for (__m256& a : acc) a = _mm256_setzero_ps();
  const int main_dims = hd / 64 * 64;
  for (int d = 0; d < main_dims; d += 64)
    for (int j = 0; j < 8; ++j)
      acc[j] = _mm256_fmadd_ps(_mm256_loadu_ps(qr + d + 8 * j), load(k + d + 8 * j), acc[j]);
  double sum = (double)hsum8(fold64_pairs(acc));
  alignas(32) float tail[8];
  for (int d = main_dims; d < hd; d += 8) {
    _mm256_store_ps(tail, _mm256_mul_ps(_mm256_loadu_ps(qr + d), load(k + d)));
    for (float t : tail) sum += (double)t;
  }
  return (float)sum;
}

float dot_qk64(const float* qr, const uint16_t* k, int hd, bool bf16) {
  return dot_qk64_with(qr, k, hd, [bf16](const uint16_t* p) { return load8(p, bf16); });
}
// The same on a K row already converted to float (the same bits: the conversion is exact).
float dot_qk64(const float* qr, const float* k, int hd) {
  return dot_qk64_with(qr, k, hd, [](const float* p) { return _mm256_loadu_ps(p); });
}

// scores[first..pos] -> exp_approx(score - max) in place; returns their sum, taken by
// 16-position blocks from first's block (each reduce16'd in float, zeros outside
// [first, pos]) in double. Position p is at s[p - base]; base is a multiple of 16.
double softmax_numerators(float* s, int base, int first, int pos, float max_score) {
  float* scores = s - base;  // indexed by position from here on (only [first, pos] is touched)
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
void reduce_rows(const float* acc, int rows, int used_rows, int hd, float* out, int d_begin = 0,
                 int d_end = -1) {
  for (int d = d_begin; d < (d_end < 0 ? hd : d_end); d += 8) {
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
  const float inv = (float)(1.0 / softmax_numerators(scores, 0, first, pos, max_score));
  for_each_position(1, [&](int p, const uint16_t* v) {
    const float w = _mm256_cvtss_f32(round_to_kv8(_mm256_set1_ps(scores[p] * inv), bf16));
    const __m256 wv = _mm256_set1_ps(w);
    float* row = acc + (size_t)(p % rows) * hd;
    for (int d = 0; d < hd; d += 8)
      _mm256_storeu_ps(row + d, _mm256_fmadd_ps(wv, load8(v + d, bf16), _mm256_loadu_ps(row + d)));
  });
  reduce_rows(acc, rows, used_rows, hd, out);
}

namespace {

bool quantized(const KvCacheLayout& l) {
  return kv_dtype_quantized(l.type(0)) || kv_dtype_quantized(l.type(1));
}

std::atomic<bool>& avx512_switch() {
  static std::atomic<bool> on{cpu_features().has_avx512_kernels()};
  return on;
}
bool use_avx512() {
  return avx512_switch().load(std::memory_order_relaxed);
}
// Softmax and values on AVX-512 (both or neither: attn_softmax leaves the weights in sc.s).
// Dimension ranges are then multiples of 16 (attention.cpp splits them in steps of 16).
bool wide_stages(const AttnContext& c) {
  return use_avx512() && c.layout->head_dim % 16 == 0;
}

float half_to_float(uint16_t h) {
  return _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h)));
}

// 8 values of a cache row of type T from dimension d (a multiple of 8) as float: the
// quantized types' (float)q * d, as core/quant.h dequantizes them.
template <KvDType T>
__m256 load_kv8(const uint16_t* row, int d) {
  if constexpr (T == KvDType::F16 || T == KvDType::BF16) {
    return load8(row + d, T == KvDType::BF16);
  } else if constexpr (T == KvDType::Q8_0) {
    const auto* b = reinterpret_cast<const BlockQ8_0*>(row) + d / kQK;
    const __m128i q = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(b->qs + d % kQK));
    return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)),
                         _mm256_set1_ps(half_to_float(b->d)));
  } else {
    // Q4_0: values j < 16 in the low nibbles of qs[j], the others in the high nibbles of
    // qs[j - 16]; each minus 8.
    const auto* b = reinterpret_cast<const BlockQ4_0*>(row) + d / kQK;
    const int j = d % kQK;
    __m256i q = _mm256_cvtepu8_epi32(
        _mm_loadl_epi64(reinterpret_cast<const __m128i*>(b->qs + j % (kQK / 2))));
    q = j < kQK / 2 ? _mm256_and_si256(q, _mm256_set1_epi32(0x0f)) : _mm256_srli_epi32(q, 4);
    return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(q, _mm256_set1_epi32(8))),
                         _mm256_set1_ps(half_to_float(b->d)));
  }
}

// 32 codes of a quantized K block as signed bytes, in value order (Q4_0: nibble - 8).
__m256i k_codes32(const uint16_t* k_row, KvDType k_type, int b, float* d) {
  if (k_type == KvDType::Q8_0) {
    const BlockQ8_0& blk = reinterpret_cast<const BlockQ8_0*>(k_row)[b];
    *d = half_to_float(blk.d);
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk.qs));
  }
  const BlockQ4_0& blk = reinterpret_cast<const BlockQ4_0*>(k_row)[b];
  *d = half_to_float(blk.d);
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk.qs));
  const __m256i nib =
      _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(raw, 4), raw), _mm256_set1_epi8(0x0f));
  return _mm256_sub_epi8(nib, _mm256_set1_epi8(8));
}

void row_to_f32(const uint16_t* row, KvDType type, int hd, float* out) {
  for (int d = 0; d < hd; d += 8) {
    switch (type) {
      case KvDType::F16:
        _mm256_storeu_ps(out + d, load_kv8<KvDType::F16>(row, d));
        break;
      case KvDType::BF16:
        _mm256_storeu_ps(out + d, load_kv8<KvDType::BF16>(row, d));
        break;
      case KvDType::Q8_0:
        _mm256_storeu_ps(out + d, load_kv8<KvDType::Q8_0>(row, d));
        break;
      case KvDType::Q4_0:
        _mm256_storeu_ps(out + d, load_kv8<KvDType::Q4_0>(row, d));
        break;
    }
  }
}

const uint16_t* kv_row(const AttnContext& c, const AttnTile& t, int kv, int p) {
  return c.cache + c.layout->position_offset(t.block_table, c.layer, kv, t.kv_head, p);
}

// The reduce16 of 8 vectors' lanes at once (v[j] holds dot product j's 16 partial sums
// already paired as a[l] + a[l + 8]), in hsum8's order: halves, then lanes (0+2, 1+3), then
// the two. Returns the 8 sums in order j = 0..7.
__m256 reduce8x8(const __m256* v) {
  __m256 w[4], x[2];
  for (int i = 0; i < 4; ++i)
    w[i] = _mm256_add_ps(_mm256_permute2f128_ps(v[2 * i], v[2 * i + 1], 0x20),
                         _mm256_permute2f128_ps(v[2 * i], v[2 * i + 1], 0x31));
  for (int i = 0; i < 2; ++i)
    x[i] = _mm256_add_ps(_mm256_shuffle_ps(w[2 * i], w[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm256_shuffle_ps(w[2 * i], w[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  const __m256 y = _mm256_add_ps(_mm256_shuffle_ps(x[0], x[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                 _mm256_shuffle_ps(x[0], x[1], _MM_SHUFFLE(3, 1, 3, 1)));
  // y holds j = 0, 2, 4, 6 in its low half and 1, 3, 5, 7 in its high half.
  return _mm256_permutevar8x32_ps(y, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

// dot_qk16 of rows q0, q1 with keys ka, kb (F32 rows), as the paired partial sums
// out[0] = (q0, ka), out[1] = (q0, kb), out[2] = (q1, ka), out[3] = (q1, kb).
void qk16_2x2(const float* q0, const float* q1, const float* ka, const float* kb, int hd,
              __m256* out) {
  __m256 a[8];
  for (__m256& v : a) v = _mm256_setzero_ps();
  for (int d = 0; d < hd; d += 16) {
    const __m256 q00 = _mm256_loadu_ps(q0 + d), q01 = _mm256_loadu_ps(q0 + d + 8);
    const __m256 q10 = _mm256_loadu_ps(q1 + d), q11 = _mm256_loadu_ps(q1 + d + 8);
    const __m256 ka0 = _mm256_loadu_ps(ka + d), ka1 = _mm256_loadu_ps(ka + d + 8);
    const __m256 kb0 = _mm256_loadu_ps(kb + d), kb1 = _mm256_loadu_ps(kb + d + 8);
    a[0] = _mm256_fmadd_ps(q00, ka0, a[0]), a[1] = _mm256_fmadd_ps(q01, ka1, a[1]);
    a[2] = _mm256_fmadd_ps(q00, kb0, a[2]), a[3] = _mm256_fmadd_ps(q01, kb1, a[3]);
    a[4] = _mm256_fmadd_ps(q10, ka0, a[4]), a[5] = _mm256_fmadd_ps(q11, ka1, a[5]);
    a[6] = _mm256_fmadd_ps(q10, kb0, a[6]), a[7] = _mm256_fmadd_ps(q11, kb1, a[7]);
  }
  for (int i = 0; i < 4; ++i) out[i] = _mm256_add_ps(a[2 * i], a[2 * i + 1]);
}

// The K rows of positions [g, g + 8) in float (kf[j * hd ..]), those outside [lo, p_end)
// replaced by the nearest valid one (computed, never read); [valid0, valid1) the valid ones.
void convert_key_group(const AttnContext& c, const AttnTile& t, const AttnScratch& sc, int g,
                       int p_end, float* kf, int& valid0, int& valid1) {
  const int hd = c.layout->head_dim, base = tile_base(t);
  valid0 = std::max(g, t.lo), valid1 = std::min(g + 8, p_end);
  for (int j = 0; j < 8; ++j)
    row_to_f32(sc.k_rows[(size_t)(std::clamp(g + j, valid0, valid1 - 1) - base)], c.layout->type(0),
               hd, kf + j * hd);
}

// Scores of the 8 positions [g, g + 8) for every row (16-lane order, head_dim a multiple of
// 16); positions outside [lo, p_end) are computed on a stand-in row and never read.
void scores16_group(const AttnContext& c, const AttnTile& t, AttnScratch& sc, int g, int p_end,
                    float* kf) {
  const int hd = c.layout->head_dim, R = t.n_rows, base = tile_base(t), span = tile_span(t);
  int valid0, valid1;
  convert_key_group(c, t, sc, g, p_end, kf, valid0, valid1);
  const __m256 scale = _mm256_set1_ps(c.scale);
  for (int r = 0; r < R; r += 2) {
    const float* q0 = sc.qr.data() + (size_t)r * hd;
    const float* q1 = r + 1 < R ? q0 + hd : q0;
    __m256 v[2][8];
    for (int j = 0; j < 8; j += 2) {
      __m256 o[4];
      qk16_2x2(q0, q1, kf + j * hd, kf + (j + 1) * hd, hd, o);
      v[0][j] = o[0], v[0][j + 1] = o[1], v[1][j] = o[2], v[1][j + 1] = o[3];
    }
    for (int i = 0; i < 2 && r + i < R; ++i) {
      float* dst = sc.s.data() + (size_t)(r + i) * span + (g - base);
      _mm256_storeu_ps(dst, _mm256_mul_ps(reduce8x8(v[i]), scale));
      if (c.softcap > 0.0f) cpu::softcap(dst + (valid0 - g), valid1 - valid0, c.softcap);
    }
  }
}

// One row's q·k with a key (both F32, head_dim a multiple of 64) in dot_qk64's order, up to
// its final hsum8 (fold64_pairs); reduce8x8 finishes eight of these at once in hsum8's order.
[[gnu::always_inline]] inline __m256 qk64_pairs(const float* q, const float* k, int hd) {
  __m256 acc[8];
  for (__m256& a : acc) a = _mm256_setzero_ps();
  for (int d = 0; d < hd; d += 64)
    for (int j = 0; j < 8; ++j)
      acc[j] =
          _mm256_fmadd_ps(_mm256_loadu_ps(q + d + 8 * j), _mm256_loadu_ps(k + d + 8 * j), acc[j]);
  return fold64_pairs(acc);
}

// The same with head_dim 64 and the row's q already in registers (q[j] = dims 8j..8j+7).
[[gnu::always_inline]] inline __m256 qk64_pairs(const __m256 (&q)[8], const float* k) {
  __m256 acc[8];
  for (int j = 0; j < 8; ++j)
    acc[j] = _mm256_fmadd_ps(q[j], _mm256_loadu_ps(k + 8 * j), _mm256_setzero_ps());
  return fold64_pairs(acc);
}

// Scores of the 8 positions [g, g + 8) for every row in the 64-lane (decode) order, head_dim a
// multiple of 64: the bits of dot_qk64 per (row, position), with one horizontal reduction per
// eight positions instead of one per position (decode at 1.5k positions spent a quarter of
// its step in those). Positions outside [lo, p_end) as in scores16_group.
void scores64_group(const AttnContext& c, const AttnTile& t, AttnScratch& sc, int g, int p_end,
                    float* kf) {
  const int hd = c.layout->head_dim, R = t.n_rows, base = tile_base(t), span = tile_span(t);
  int valid0, valid1;
  convert_key_group(c, t, sc, g, p_end, kf, valid0, valid1);
  const __m256 scale = _mm256_set1_ps(c.scale);
  for (int r = 0; r < R; ++r) {
    const float* qr = sc.qr.data() + (size_t)r * hd;
    __m256 v[8];
    if (hd == 64) {
      __m256 q[8];
      for (int j = 0; j < 8; ++j) q[j] = _mm256_loadu_ps(qr + 8 * j);
      for (int j = 0; j < 8; ++j) v[j] = qk64_pairs(q, kf + j * 64);
    } else {
      for (int j = 0; j < 8; ++j) v[j] = qk64_pairs(qr, kf + j * hd, hd);
    }
    float* dst = sc.s.data() + (size_t)r * span + (g - base);
    _mm256_storeu_ps(dst, _mm256_mul_ps(reduce8x8(v), scale));
    if (c.softcap > 0.0f) cpu::softcap(dst + (valid0 - g), valid1 - valid0, c.softcap);
  }
}

}  // namespace

// llama.cpp's AVX2 vec_dot of a Q8_0 / Q4_0 row with Q8_0 (attention_int.h's order): per
// block, |k| times q with k's signs (maddubs, pairs of int16, then int32 lanes of 4 values:
// exact, |k| <= 128 and |q| <= 127), converted and accumulated by an FMA with d_k * d_q.
float dot_qk_int(const uint16_t* k_row, KvDType k_type, const QkQuantRow& q, int hd) {
  __m256 acc = _mm256_setzero_ps();
  const __m256i ones = _mm256_set1_epi16(1);
  for (int b = 0; b < hd / kQK; ++b) {
    float dk;
    const __m256i kx = k_codes32(k_row, k_type, b, &dk);
    const __m256i qy = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q.qs + b * kQK));
    const __m256i prod = _mm256_maddubs_epi16(_mm256_sign_epi8(kx, kx), _mm256_sign_epi8(qy, kx));
    const __m256 isum = _mm256_cvtepi32_ps(_mm256_madd_epi16(ones, prod));
    acc = _mm256_fmadd_ps(_mm256_set1_ps(dk * q.d[b]), isum, acc);
  }
  return hsum8(acc);
}

void tile_prepare(const AttnContext& c, const AttnTile& t, AttnScratch& sc) {
  const int hd = c.layout->head_dim, R = t.n_rows;
  const bool bf16 = c.layout->dtype == KvDType::BF16;
  const size_t span = (size_t)tile_span(t);
  sc.qr.resize((size_t)R * hd);
  if (sc.s.size() < span * R) sc.s.resize(span * R);
  sc.acc.resize((size_t)R * tile_lanes(t.order) * hd);
  const int base = tile_base(t);
  sc.k_rows.resize(span), sc.v_rows.resize(span);
  // Block by block of the paged cache: a block's rows are consecutive, row_units(kv) apart.
  const int bs = c.layout->block_size;
  for (int kv = 0; kv < 2; ++kv) {
    const size_t step = c.layout->row_units(kv);
    const uint16_t** rows = (kv == 0 ? sc.k_rows : sc.v_rows).data();
    for (int p0 = t.lo; p0 <= t.hi;) {
      const int p1 = std::min((p0 / bs + 1) * bs, t.hi + 1);
      const uint16_t* row = kv_row(c, t, kv, p0);
      for (int p = p0; p < p1; ++p, row += step) rows[p - base] = row;
      p0 = p1;
    }
  }
  const bool round = !quantized(*c.layout);
  const KvDType kt = c.layout->type(0);
  if (kv_dtype_quantized(kt)) {
    // The integer q·k's q (attention_int.h), once per row of the tile.
    const size_t words = qk_quant_row_words(hd);
    sc.qk.resize((size_t)R * words);
    for (int r = 0; r < R; ++r)
      quantize_q_for_k(t.rows[r].q, hd, kt, qk_quant_row(sc.qk.data() + (size_t)r * words, hd));
  }
  for (int r = 0; r < R; ++r)
    for (int d = 0; d < hd; d += 8) {
      const __m256 q = _mm256_loadu_ps(t.rows[r].q + d);
      _mm256_storeu_ps(sc.qr.data() + (size_t)r * hd + d, round ? round_to_kv8(q, bf16) : q);
    }
}

void tile_scores(const AttnContext& c, const AttnTile& t, AttnScratch& sc, int p_begin, int p_end) {
  const KvDType kt = c.layout->type(0);
  if (use_avx512() && avx512::attn_scores_supported(*c.layout, t.order))
    return avx512::attn_scores(c, t, sc, p_begin, p_end);
  const int hd = c.layout->head_dim, R = t.n_rows, base = tile_base(t), span = tile_span(t);
  p_end = std::min(p_end, t.hi + 1);
  if (kv_dtype_quantized(kt)) {
    // Integer q·k (attention_int.h), one key and one row at a time.
    const size_t words = qk_quant_row_words(hd);
    for (int p = std::max(p_begin, t.lo); p < p_end; ++p)
      for (int r = 0; r < R; ++r) {
        const QkQuantRow q = qk_quant_row(sc.qk.data() + (size_t)r * words, hd);
        float* dst = sc.s.data() + (size_t)r * span + (p - base);
        *dst = dot_qk_int(sc.k_rows[(size_t)(p - base)], kt, q, hd) * c.scale;
        if (c.softcap > 0.0f) cpu::softcap(dst, 1, c.softcap);
      }
    return;
  }
  if (t.order == SumOrder::kLanes16 && hd % kReduceLanes == 0) {
    thread_local std::vector<float> kf;
    kf.resize((size_t)8 * hd);
    for (int g = std::max(p_begin, t.lo) / 8 * 8; g < p_end; g += 8)
      scores16_group(c, t, sc, g, p_end, kf.data());
    return;
  }
  if (t.order == SumOrder::kLanes64 && hd % 64 == 0) {
    thread_local std::vector<float> kf;
    kf.resize((size_t)8 * hd);
    for (int g = std::max(p_begin, t.lo) / 8 * 8; g < p_end; g += 8)
      scores64_group(c, t, sc, g, p_end, kf.data());
    return;
  }
  // The 64-lane order at other head dims: each K row converted once for the tile's rows.
  thread_local std::vector<float> kf;
  kf.resize((size_t)hd);
  for (int p = std::max(p_begin, t.lo); p < p_end; ++p) {
    row_to_f32(sc.k_rows[(size_t)(p - base)], c.layout->type(0), hd, kf.data());
    for (int r = 0; r < R; ++r) {
      float* dst = sc.s.data() + (size_t)r * span + (p - base);
      *dst = dot_qk64(sc.qr.data() + (size_t)r * hd, kf.data(), hd) * c.scale;
      if (c.softcap > 0.0f) cpu::softcap(dst, 1, c.softcap);
    }
  }
}

void tile_softmax(const AttnContext& c, const AttnTile& t, AttnScratch& sc, int r_begin,
                  int r_end) {
  if (wide_stages(c)) return avx512::attn_softmax(c, t, sc, r_begin, r_end);
  const int base = tile_base(t), span = tile_span(t);
  const bool bf16 = c.layout->dtype == KvDType::BF16, round = !quantized(*c.layout);
  for (int r = r_begin; r < r_end; ++r) {
    const AttnRow& row = t.rows[r];
    float* s = sc.s.data() + (size_t)r * span;
    // The maximum (exact in any order; a NaN score is passed over, as std::max does).
    __m256 vmax = _mm256_set1_ps(-INFINITY);
    int p = row.first;
    for (; p + 8 <= row.pos + 1; p += 8)
      vmax = _mm256_max_ps(_mm256_loadu_ps(s + (p - base)), vmax);
    alignas(32) float tmp[8];
    _mm256_store_ps(tmp, vmax);
    float max_score = -INFINITY;
    for (float m : tmp) max_score = std::max(max_score, m);
    for (; p <= row.pos; ++p) max_score = std::max(max_score, s[p - base]);
    const float inv = (float)(1.0 / softmax_numerators(s, base, row.first, row.pos, max_score));
    // The weights over the row's scores (row-major, as the AVX-512 stages keep them), zeros
    // outside [first, pos] where the tile's values stage reads.
    std::fill(s + (t.lo - base), s + (row.first - base), 0.0f);
    std::fill(s + (row.pos + 1 - base), s + (t.hi + 1 - base), 0.0f);
    const __m256 vinv = _mm256_set1_ps(inv);
    for (p = row.first; p + 8 <= row.pos + 1; p += 8) {
      const __m256 w8 = _mm256_mul_ps(_mm256_loadu_ps(s + (p - base)), vinv);
      _mm256_storeu_ps(s + (p - base), round ? round_to_kv8(w8, bf16) : w8);
    }
    if (p <= row.pos) {
      const int n = row.pos + 1 - p;
      std::copy(s + (p - base), s + (p - base) + n, tmp);
      const __m256 w8 = _mm256_mul_ps(_mm256_load_ps(tmp), vinv);
      _mm256_store_ps(tmp, round ? round_to_kv8(w8, bf16) : w8);
      std::copy(tmp, tmp + n, s + (p - base));
    }
  }
}

namespace {

// Positions per lane row and chunk of the value stage: the V rows of a chunk (16 per lane
// row) stay in L1/L2 while every (lane row, dimension block, row block) passes over them.
constexpr int kValueChunkPerLane = 16;

// Accumulators of rows [r0, r0 + NR), dimensions [d, d + 8 * NV), lane row `lane`, over the
// positions p = lane (mod lanes) of [c0, c1) ∩ [lo, hi], in increasing order.
template <KvDType VT, int NR, int NV>
void values_block(const AttnContext& c, const AttnTile& t, AttnScratch& sc, int lane, int d, int r0,
                  int c0, int c1) {
  const int hd = c.layout->head_dim, L = tile_lanes(t.order), base = tile_base(t);
  const size_t span = (size_t)tile_span(t);
  // Locals, so that the accumulators stay in registers (with the vectors' data pointers
  // reloaded in the loop, GCC kept them on the stack: a store per FMA).
  float* const acc = sc.acc.data();
  const uint16_t* const* const v_rows = sc.v_rows.data();
  const float* w_rows[NR];  // row r's weight of position p at w_rows[r][p - base]
#pragma GCC unroll 4
  for (int r = 0; r < NR; ++r) w_rows[r] = sc.s.data() + (size_t)(r0 + r) * span;
  __m256 a[NR][NV];
#pragma GCC unroll 4
  for (int r = 0; r < NR; ++r)
#pragma GCC unroll 2
    for (int j = 0; j < NV; ++j)
      a[r][j] = c0 == base ? _mm256_setzero_ps()
                           : _mm256_loadu_ps(acc + ((size_t)(r0 + r) * L + lane) * hd + d + 8 * j);
  int p = c0 + lane;
  while (p < t.lo) p += L;
  for (const int end = std::min(c1, t.hi + 1); p < end; p += L) {
    const uint16_t* v = v_rows[p - base];
    __m256 vv[NV];
#pragma GCC unroll 2
    for (int j = 0; j < NV; ++j) vv[j] = load_kv8<VT>(v, d + 8 * j);
#pragma GCC unroll 4
    for (int r = 0; r < NR; ++r) {
      const __m256 wr = _mm256_broadcast_ss(w_rows[r] + (p - base));
#pragma GCC unroll 2
      for (int j = 0; j < NV; ++j) a[r][j] = _mm256_fmadd_ps(wr, vv[j], a[r][j]);
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < NR; ++r)
#pragma GCC unroll 2
    for (int j = 0; j < NV; ++j)
      _mm256_storeu_ps(acc + ((size_t)(r0 + r) * L + lane) * hd + d + 8 * j, a[r][j]);
}

template <KvDType VT, int NV>
void values_rows(const AttnContext& c, const AttnTile& t, AttnScratch& sc, int lane, int d, int r0,
                 int c0, int c1) {
  switch (std::min(4, t.n_rows - r0)) {
    case 4:
      return values_block<VT, 4, NV>(c, t, sc, lane, d, r0, c0, c1);
    case 3:
      return values_block<VT, 3, NV>(c, t, sc, lane, d, r0, c0, c1);
    case 2:
      return values_block<VT, 2, NV>(c, t, sc, lane, d, r0, c0, c1);
    default:
      return values_block<VT, 1, NV>(c, t, sc, lane, d, r0, c0, c1);
  }
}

// One chunk of positions [c0, c0 + 16 * lanes) for dimensions [d_begin, d_end): block of 4
// rows by block, so that the block's weights of the chunk stay in L1.
template <KvDType VT>
void values_chunk(const AttnContext& c, const AttnTile& t, AttnScratch& sc, int d_begin, int d_end,
                  int c0) {
  const int c1 = c0 + kValueChunkPerLane * tile_lanes(t.order);
  for (int r0 = 0; r0 < t.n_rows; r0 += 4)
    for (int lane = 0; lane < tile_lanes(t.order); ++lane) {
      int d = d_begin;
      for (; d + 16 <= d_end; d += 16) values_rows<VT, 2>(c, t, sc, lane, d, r0, c0, c1);
      if (d < d_end) values_rows<VT, 1>(c, t, sc, lane, d, r0, c0, c1);
    }
}

}  // namespace

void tile_values(const AttnContext& c, const AttnTile& t, AttnScratch& sc, int d_begin, int d_end) {
  const int hd = c.layout->head_dim, L = tile_lanes(t.order), base = tile_base(t);
  const bool wide = wide_stages(c);
  for (int c0 = base; c0 <= t.hi && !wide; c0 += kValueChunkPerLane * L) {
    switch (c.layout->type(1)) {
      case KvDType::F16:
        values_chunk<KvDType::F16>(c, t, sc, d_begin, d_end, c0);
        break;
      case KvDType::BF16:
        values_chunk<KvDType::BF16>(c, t, sc, d_begin, d_end, c0);
        break;
      case KvDType::Q8_0:
        values_chunk<KvDType::Q8_0>(c, t, sc, d_begin, d_end, c0);
        break;
      case KvDType::Q4_0:
        values_chunk<KvDType::Q4_0>(c, t, sc, d_begin, d_end, c0);
        break;
    }
  }
  if (wide) avx512::attn_values(c, t, sc, d_begin, d_end);
  for (int r = 0; r < t.n_rows; ++r)
    reduce_rows(sc.acc.data() + (size_t)r * L * hd, L, L, hd, t.rows[r].out, d_begin, d_end);
}

}  // namespace hablar::cpu::avx2

namespace hablar::cpu {
void set_avx512_attention(bool on) {
  avx2::avx512_switch().store(on && cpu_features().has_avx512_kernels());
}
}  // namespace hablar::cpu
