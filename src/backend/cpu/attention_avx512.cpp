// AVX-512 stages of the tiled attention (ops_x86.h): the q·k scores and the weighted V sums
// of a tile, with the same bits as the AVX2 stages (and so as attend_head) for every row.
//
// Scores. A group of 16 positions is converted to float once and transposed, kt[d][j] =
// K[position j][dimension d], so that one 16-lane register holds dimension d of 16 keys. A
// dot product's partial sums (lane l of llama.cpp's 16- or 64-lane accumulator: dimensions
// d = l mod 16, or mod 64) become whole registers, one per lane, accumulated by FMAs with q[d]
// broadcast, in the same order of d; the lane tree (fold64, reduce16) is then adds of whole
// registers, 16 keys at once. The transposed group is shared by all rows of the tile (query
// tokens x the query heads of the kv head), four rows at a time.
//
// Values. As the AVX2 stage (accumulator row = position mod 16 or 64, positions in order),
// with 16 dimensions per register and up to 64 dimensions of 4 rows held in registers, so a V
// row is converted once per 4 rows instead of once per 4 rows and 16 dimensions.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "backend/cpu/attention_int.h"
#include "backend/cpu/ops.h"
#include "backend/cpu/ops_x86.h"
#include "core/quant_blocks.h"

namespace hablar::cpu::avx512 {
namespace {

// The register blocks below only work inlined (arrays of registers across calls spill).
#define HABLAR_INLINE inline __attribute__((always_inline))

// Every cache line of a row of `bytes` bytes, into L1.
void prefetch_row(const uint16_t* row, size_t bytes) {
  const char* p = reinterpret_cast<const char*>(row);
  for (size_t i = 0; i < bytes; i += 64) _mm_prefetch(p + i, _MM_HINT_T0);
  if (bytes % 64 != 0 || (reinterpret_cast<uintptr_t>(p) & 63) != 0)
    _mm_prefetch(p + bytes - 1, _MM_HINT_T0);
}

float half_to_float(uint16_t h) {
  return _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h)));
}

// 16 values of a cache row of type T from dimension d (a multiple of 16) as float: the
// quantized types' (float)q * d, as core/quant.h dequantizes them.
template <KvDType T>
HABLAR_INLINE __m512 load16(const uint16_t* row, int d) {
  if constexpr (T == KvDType::F16) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + d)));
  } else if constexpr (T == KvDType::BF16) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + d));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  } else if constexpr (T == KvDType::Q8_0) {
    const auto* b = reinterpret_cast<const BlockQ8_0*>(row) + d / kQK;
    const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b->qs + d % kQK));
    return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q)),
                         _mm512_set1_ps(half_to_float(b->d)));
  } else {
    // Q4_0: values j < 16 in the low nibbles of qs[j], the others in the high nibbles of
    // qs[j - 16]; each minus 8. A 16-value group is one of the two halves.
    const auto* b = reinterpret_cast<const BlockQ4_0*>(row) + d / kQK;
    __m512i q = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b->qs)));
    q = d % kQK == 0 ? _mm512_and_si512(q, _mm512_set1_epi32(0x0f)) : _mm512_srli_epi32(q, 4);
    return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(q, _mm512_set1_epi32(8))),
                         _mm512_set1_ps(half_to_float(b->d)));
  }
}

// In-register transpose of 16 rows of 16 floats: r[i] lane j <- r[j] lane i.
HABLAR_INLINE void transpose16(__m512* r) {
  __m512 t[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
  }
  // t[2k] = a0 b0 a1 b1 | a4 b4 a5 b5 | ..., t[2k+1] = a2 b2 a3 b3 | ... (per 128-bit lane)
  for (int i = 0; i < 16; i += 4) {
    r[i] = _mm512_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
    r[i + 1] = _mm512_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
    r[i + 2] = _mm512_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
    r[i + 3] = _mm512_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  // r[4g + c] holds, in 128-bit lane k, column 4k + c of rows 4g..4g+3.
  for (int c = 0; c < 4; ++c) {
    const __m512 a = _mm512_shuffle_f32x4(r[c], r[4 + c], 0x88);  // lanes 0,2 | 0,2
    const __m512 b = _mm512_shuffle_f32x4(r[c], r[4 + c], 0xdd);  // lanes 1,3 | 1,3
    const __m512 e = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0x88);
    const __m512 f = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0xdd);
    t[c] = _mm512_shuffle_f32x4(a, e, 0x88);       // column c
    t[8 + c] = _mm512_shuffle_f32x4(a, e, 0xdd);   // column 8 + c
    t[4 + c] = _mm512_shuffle_f32x4(b, f, 0x88);   // column 4 + c
    t[12 + c] = _mm512_shuffle_f32x4(b, f, 0xdd);  // column 12 + c
  }
  for (int i = 0; i < 16; ++i) r[i] = t[i];
}

// kt[d * 16 + j] = K[rows[j]][d] as float, d < hd (a multiple of 16).
template <KvDType T>
void transpose_keys(const uint16_t* const* rows, int hd, float* kt) {
  __m512 r[16];
  for (int d = 0; d < hd; d += 16) {
    for (int j = 0; j < 16; ++j) r[j] = load16<T>(rows[j], d);
    transpose16(r);
    for (int i = 0; i < 16; ++i) _mm512_storeu_ps(kt + (size_t)(d + i) * 16, r[i]);
  }
}

// Lane l's partial sums of NR rows' dot products with the 16 keys: dimensions l, l + step, ...
// each an FMA from zero in order of d.
template <int NR>
HABLAR_INLINE void lane_chain(const float* const* q, const float* kt, int hd, int l, int step,
                              __m512* out) {
  for (int r = 0; r < NR; ++r) out[r] = _mm512_setzero_ps();
  for (int d = l; d < hd; d += step) {
    const __m512 k = _mm512_loadu_ps(kt + (size_t)d * 16);
    for (int r = 0; r < NR; ++r) out[r] = _mm512_fmadd_ps(_mm512_set1_ps(q[r][d]), k, out[r]);
  }
}

// Lane l of the 16 that reduce16 takes: the 16-lane order's chain, or fold64 of the 64-lane
// order's four chains, (s[l] + s[l + 32]) + (s[l + 16] + s[l + 48]).
template <int NR, bool L64>
HABLAR_INLINE void lane_value(const float* const* q, const float* kt, int hd, int l, __m512* out) {
  if constexpr (!L64) {
    lane_chain<NR>(q, kt, hd, l, 16, out);
  } else {
    __m512 s0[NR], s1[NR], s2[NR], s3[NR];
    lane_chain<NR>(q, kt, hd, l, 64, s0), lane_chain<NR>(q, kt, hd, l + 32, 64, s2);
    lane_chain<NR>(q, kt, hd, l + 16, 64, s1), lane_chain<NR>(q, kt, hd, l + 48, 64, s3);
    for (int r = 0; r < NR; ++r)
      out[r] = _mm512_add_ps(_mm512_add_ps(s0[r], s2[r]), _mm512_add_ps(s1[r], s3[r]));
  }
}

// reduce16 of the lanes, 16 keys at once: c[i] = (a[i] + a[i + 8]) + (a[i + 4] + a[i + 12]),
// then (c0 + c2) + (c1 + c3). Returns the NR rows' 16 dot products.
template <int NR, bool L64>
HABLAR_INLINE void dots16(const float* const* q, const float* kt, int hd, __m512* dot) {
  __m512 c[4][NR];
  for (int i = 0; i < 4; ++i) {
    __m512 a0[NR], a8[NR], a4[NR], a12[NR];
    lane_value<NR, L64>(q, kt, hd, i, a0), lane_value<NR, L64>(q, kt, hd, i + 8, a8);
    lane_value<NR, L64>(q, kt, hd, i + 4, a4), lane_value<NR, L64>(q, kt, hd, i + 12, a12);
    for (int r = 0; r < NR; ++r)
      c[i][r] = _mm512_add_ps(_mm512_add_ps(a0[r], a8[r]), _mm512_add_ps(a4[r], a12[r]));
  }
  for (int r = 0; r < NR; ++r)
    dot[r] = _mm512_add_ps(_mm512_add_ps(c[0][r], c[2][r]), _mm512_add_ps(c[1][r], c[3][r]));
}

// The K rows of the 16 positions from g: positions outside [v0, v1) take a stand-in row
// (their scores are never stored). The next group's rows are fetched meanwhile (a long
// cache is read from memory: without this each group waits on its misses).
void key_group_rows(const AttnScratch& sc, int base, int g, int v0, int v1, int p_end,
                    size_t row_bytes, const uint16_t* (&rows)[16]) {
  for (int j = 0; j < 16; ++j) rows[j] = sc.k_rows[(size_t)(std::clamp(g + j, v0, v1 - 1) - base)];
  for (int p = g + 16; p < std::min(g + 32, p_end); ++p)
    prefetch_row(sc.k_rows[(size_t)(p - base)], row_bytes);
}

// Rows r0 .. r0+NR-1 of 16 keys' dots (keys g .. g+15) into the score strip: scaled, only
// the keys in [v0, v1) stored, soft-capped where the model asks for it.
template <int NR>
void store_scaled_rows(const AttnContext& c, const AttnTile& t, AttnScratch& sc,
                       const __m512 (&dot)[NR], int r0, int g, int v0, int v1) {
  const int base = tile_base(t), span = tile_span(t);
  const __mmask16 keep = (__mmask16)(((1u << (v1 - g)) - 1) & ~((1u << (v0 - g)) - 1));
  for (int r = 0; r < NR; ++r) {
    float* dst = sc.s.data() + (size_t)(r0 + r) * span + (g - base);
    _mm512_mask_storeu_ps(dst, keep, _mm512_mul_ps(dot[r], _mm512_set1_ps(c.scale)));
    if (c.softcap > 0.0f) cpu::softcap(dst + (v0 - g), v1 - v0, c.softcap);
  }
}

// Scores of rows [r0, r0 + NR) for the 16 positions from g (kt transposed); only the
// positions of [v0, v1) are stored.
template <int NR, bool L64>
void store_scores(const AttnContext& c, const AttnTile& t, AttnScratch& sc, const float* kt, int r0,
                  int g, int v0, int v1) {
  const int hd = c.layout->head_dim;
  const float* q[NR];
  for (int r = 0; r < NR; ++r) q[r] = sc.qr.data() + (size_t)(r0 + r) * hd;
  __m512 dot[NR];
  dots16<NR, L64>(q, kt, hd, dot);
  store_scaled_rows<NR>(c, t, sc, dot, r0, g, v0, v1);
}

template <bool L64>
void scores_rows(const AttnContext& c, const AttnTile& t, AttnScratch& sc, const float* kt, int g,
                 int v0, int v1) {
  int r = 0;
  for (; r + 4 <= t.n_rows; r += 4) store_scores<4, L64>(c, t, sc, kt, r, g, v0, v1);
  switch (t.n_rows - r) {
    case 3:
      return store_scores<3, L64>(c, t, sc, kt, r, g, v0, v1);
    case 2:
      return store_scores<2, L64>(c, t, sc, kt, r, g, v0, v1);
    case 1:
      return store_scores<1, L64>(c, t, sc, kt, r, g, v0, v1);
    default:
      return;
  }
}

template <KvDType KT>
void scores_typed(const AttnContext& c, const AttnTile& t, AttnScratch& sc, int p_begin,
                  int p_end) {
  const int hd = c.layout->head_dim, base = tile_base(t);
  const size_t row_bytes = c.layout->row_units(0) * sizeof(uint16_t);
  thread_local std::vector<float> kt_owner;
  std::vector<float>& kt = kt_owner;
  kt.resize((size_t)16 * hd);
  const uint16_t* rows[16];
  for (int g = std::max(p_begin, t.lo) / 16 * 16; g < p_end; g += 16) {
    const int v0 = std::max({g, t.lo, p_begin}), v1 = std::min(g + 16, p_end);
    key_group_rows(sc, base, g, v0, v1, p_end, row_bytes, rows);
    transpose_keys<KT>(rows, hd, kt.data());
    if (t.order == SumOrder::kLanes64)
      scores_rows<true>(c, t, sc, kt.data(), g, v0, v1);
    else
      scores_rows<false>(c, t, sc, kt.data(), g, v0, v1);
  }
}

// Integer scores of a quantized K (attention_int.h), 16 keys at a time. The keys' codes are
// transposed at 4-byte granularity, kt[w * 16 + j] = bytes 4w .. 4w + 3 of key j's codes made
// unsigned (Q8_0: code + 128; Q4_0: the nibbles), so that one VNNI dpbusd with q's 4 codes of
// lane group w broadcast gives that group's integer sum for 16 keys; started from q's
// correction (-128 or -8 times the sum of those q codes) it is the signed sum exactly. The
// float steps then run on whole registers: per block an FMA with d_k * d_q, the 8 lanes
// reduced in hsum_float_8's tree.

// The 32 codes of block b of a key as unsigned bytes, in value order.
template <KvDType T>
HABLAR_INLINE __m256i int_codes32(const uint16_t* row, int b) {
  if constexpr (T == KvDType::Q8_0) {
    const auto* blk = reinterpret_cast<const BlockQ8_0*>(row) + b;
    return _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk->qs)),
                            _mm256_set1_epi8((char)0x80));
  } else {
    const auto* blk = reinterpret_cast<const BlockQ4_0*>(row) + b;
    const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk->qs));
    return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(raw, 4), raw), _mm256_set1_epi8(0x0f));
  }
}

template <KvDType T>
HABLAR_INLINE uint16_t int_scale(const uint16_t* row, int b) {
  if constexpr (T == KvDType::Q8_0)
    return (reinterpret_cast<const BlockQ8_0*>(row) + b)->d;
  else
    return (reinterpret_cast<const BlockQ4_0*>(row) + b)->d;
}

// kt as above ([hd / 4][16] words) and kd[b * 16 + j] = key j's block-b scale as float.
template <KvDType T>
void transpose_int_keys(const uint16_t* const* rows, int hd, uint32_t* kt, float* kd) {
  const int nb = hd / kQK;
  __m512 r[16];
  for (int b = 0; b < nb; b += 2) {
    const bool two = b + 1 < nb;
    for (int j = 0; j < 16; ++j) {
      const __m256i hi = two ? int_codes32<T>(rows[j], b + 1) : _mm256_setzero_si256();
      r[j] = _mm512_castsi512_ps(
          _mm512_inserti64x4(_mm512_castsi256_si512(int_codes32<T>(rows[j], b)), hi, 1));
    }
    transpose16(r);  // r[i]: word i of the pair (block b + i / 8, lane i % 8) of the 16 keys
    for (int i = 0; i < (two ? 16 : 8); ++i)
      _mm512_storeu_ps(reinterpret_cast<float*>(kt) + (size_t)(8 * b + i) * 16, r[i]);
  }
  alignas(32) uint16_t h[16];
  for (int b = 0; b < nb; ++b) {
    for (int j = 0; j < 16; ++j) h[j] = int_scale<T>(rows[j], b);
    _mm512_storeu_ps(kd + (size_t)b * 16,
                     _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(h))));
  }
}

// Lane j (of 8) of NR rows' dots with the 16 keys: fma(d_k * d_q, isum, acc) block by block.
template <int NR>
HABLAR_INLINE void int_lane(const QkQuantRow* q, const uint32_t* kt, const __m512* dd, int nb,
                            int j, __m512* out) {
  for (int r = 0; r < NR; ++r) out[r] = _mm512_setzero_ps();
  for (int b = 0; b < nb; ++b) {
    const int w = 8 * b + j;
    const __m512i k = _mm512_loadu_si512(kt + (size_t)w * 16);
    for (int r = 0; r < NR; ++r) {
      int32_t qw;
      std::memcpy(&qw, q[r].qs + 4 * w, 4);
      const __m512i isum =
          _mm512_dpbusd_epi32(_mm512_set1_epi32(q[r].corr[w]), k, _mm512_set1_epi32(qw));
      out[r] = _mm512_fmadd_ps(dd[b * NR + r], _mm512_cvtepi32_ps(isum), out[r]);
    }
  }
}

// The NR rows' 16 dots: lanes reduced as ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)).
// dd holds [nb][NR] registers of d_k * d_q.
template <int NR>
HABLAR_INLINE void int_dots16(const QkQuantRow* q, const uint32_t* kt, const __m512* dd, int nb,
                              __m512* dot) {
  __m512 x[NR], y[NR], u[NR];
  const auto pair = [&](int a, int b, __m512* sum) {
    int_lane<NR>(q, kt, dd, nb, a, sum);
    int_lane<NR>(q, kt, dd, nb, b, y);
    for (int r = 0; r < NR; ++r) sum[r] = _mm512_add_ps(sum[r], y[r]);
  };
  pair(0, 4, u), pair(2, 6, x);
  for (int r = 0; r < NR; ++r) u[r] = _mm512_add_ps(u[r], x[r]);
  pair(1, 5, dot), pair(3, 7, x);
  for (int r = 0; r < NR; ++r) dot[r] = _mm512_add_ps(u[r], _mm512_add_ps(dot[r], x[r]));
}

// The most blocks a head row may have here (head_dim 512).
constexpr int kMaxIntBlocks = 16;

template <int NR>
HABLAR_INLINE void int_dots16_rows(const QkQuantRow* q, const uint32_t* kt, const float* kd, int hd,
                                   __m512* dot) {
  const int nb = hd / kQK;
  __m512 dd[kMaxIntBlocks * NR];
  for (int b = 0; b < nb; ++b) {
    const __m512 k = _mm512_loadu_ps(kd + (size_t)b * 16);
    for (int r = 0; r < NR; ++r) dd[b * NR + r] = _mm512_mul_ps(k, _mm512_set1_ps(q[r].d[b]));
  }
  int_dots16<NR>(q, kt, dd, nb, dot);
}

template <int NR>
void store_int_scores(const AttnContext& c, const AttnTile& t, AttnScratch& sc, const uint32_t* kt,
                      const float* kd, int r0, int g, int v0, int v1) {
  const int hd = c.layout->head_dim;
  const size_t words = qk_quant_row_words(hd);
  QkQuantRow q[NR];
  for (int r = 0; r < NR; ++r) q[r] = qk_quant_row(sc.qk.data() + (size_t)(r0 + r) * words, hd);
  __m512 dot[NR];
  int_dots16_rows<NR>(q, kt, kd, hd, dot);
  store_scaled_rows<NR>(c, t, sc, dot, r0, g, v0, v1);
}

template <KvDType KT>
void scores_int(const AttnContext& c, const AttnTile& t, AttnScratch& sc, int p_begin, int p_end) {
  const int hd = c.layout->head_dim, base = tile_base(t);
  const size_t row_bytes = c.layout->row_units(0) * sizeof(uint16_t);
  thread_local std::vector<uint32_t> kt_owner;
  thread_local std::vector<float> kd_owner;
  std::vector<uint32_t>& kt = kt_owner;
  std::vector<float>& kd = kd_owner;
  kt.resize((size_t)4 * hd), kd.resize((size_t)hd / 2);
  const uint16_t* rows[16];
  for (int g = std::max(p_begin, t.lo) / 16 * 16; g < p_end; g += 16) {
    const int v0 = std::max({g, t.lo, p_begin}), v1 = std::min(g + 16, p_end);
    key_group_rows(sc, base, g, v0, v1, p_end, row_bytes, rows);
    transpose_int_keys<KT>(rows, hd, kt.data(), kd.data());
    int r = 0;
    for (; r + 4 <= t.n_rows; r += 4)
      store_int_scores<4>(c, t, sc, kt.data(), kd.data(), r, g, v0, v1);
    switch (t.n_rows - r) {
      case 3:
        store_int_scores<3>(c, t, sc, kt.data(), kd.data(), r, g, v0, v1);
        break;
      case 2:
        store_int_scores<2>(c, t, sc, kt.data(), kd.data(), r, g, v0, v1);
        break;
      case 1:
        store_int_scores<1>(c, t, sc, kt.data(), kd.data(), r, g, v0, v1);
        break;
      default:
        break;
    }
  }
}

}  // namespace

bool attn_scores_supported(const KvCacheLayout& layout, SumOrder order) {
  if (kv_dtype_quantized(layout.type(0))) return layout.head_dim / kQK <= kMaxIntBlocks;
  return order == SumOrder::kLanes64 ? layout.head_dim % 64 == 0 : layout.head_dim % 16 == 0;
}

void attn_scores(const AttnContext& c, const AttnTile& t, AttnScratch& sc, int p_begin, int p_end) {
  p_end = std::min(p_end, t.hi + 1);
  switch (c.layout->type(0)) {
    case KvDType::F16:
      return scores_typed<KvDType::F16>(c, t, sc, p_begin, p_end);
    case KvDType::BF16:
      return scores_typed<KvDType::BF16>(c, t, sc, p_begin, p_end);
    case KvDType::Q8_0:
      return scores_int<KvDType::Q8_0>(c, t, sc, p_begin, p_end);
    case KvDType::Q4_0:
      return scores_int<KvDType::Q4_0>(c, t, sc, p_begin, p_end);
  }
}

void dot_qk_int16(const uint16_t* const* rows, KvDType k_type, const QkQuantRow& q, int hd,
                  float* out) {
  std::vector<uint32_t> kt((size_t)4 * hd);
  std::vector<float> kd((size_t)hd / 2);
  if (k_type == KvDType::Q8_0)
    transpose_int_keys<KvDType::Q8_0>(rows, hd, kt.data(), kd.data());
  else
    transpose_int_keys<KvDType::Q4_0>(rows, hd, kt.data(), kd.data());
  __m512 dot;
  int_dots16_rows<1>(&q, kt.data(), kd.data(), hd, &dot);
  _mm512_storeu_ps(out, dot);
}

namespace {

// 2^n for integral float lanes n in [-126, 127].
__m512 pow2_16(__m512 n) {
  return _mm512_castsi512_ps(
      _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23));
}

// exp_approx (ops.h) on 16 lanes, bit for bit (avx2_common.h's exp8 on wider registers).
__m512 exp16(__m512 x) {
  const __m512 shifter = _mm512_set1_ps(0x1.8p23f);
  const __m512 n =
      _mm512_sub_ps(_mm512_fmadd_ps(x, _mm512_set1_ps(0x1.715476p+0f), shifter), shifter);
  const __m512 b = _mm512_fnmadd_ps(n, _mm512_set1_ps(0x1.7f7d1cp-20f),
                                    _mm512_fnmadd_ps(n, _mm512_set1_ps(0x1.62e4p-1f), x));
  const __m512 u = _mm512_mul_ps(b, b);
  const __m512 j = _mm512_fmadd_ps(
      _mm512_fmadd_ps(
          _mm512_fmadd_ps(_mm512_set1_ps(0x1.0e4020p-7f), b, _mm512_set1_ps(0x1.573e2ep-5f)), u,
          _mm512_fmadd_ps(_mm512_set1_ps(0x1.555e66p-3f), b, _mm512_set1_ps(0x1.fffdb6p-2f))),
      u, _mm512_fmadd_ps(_mm512_set1_ps(0x1.ffffecp-1f), b, _mm512_set1_ps(1.0f)));
  const __mmask16 big = _mm512_cmp_ps_mask(_mm512_abs_ps(n), _mm512_set1_ps(192.0f), _CMP_GT_OQ);
  const __m512 nc = _mm512_mask_blend_ps(big, n, _mm512_setzero_ps());
  const __m512 half = _mm512_roundscale_ps(_mm512_mul_ps(nc, _mm512_set1_ps(0.5f)),
                                           _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
  const __m512 res =
      _mm512_mul_ps(_mm512_mul_ps(j, pow2_16(_mm512_sub_ps(nc, half))), pow2_16(half));
  const __mmask16 nonpos = _mm512_cmp_ps_mask(n, _mm512_setzero_ps(), _CMP_LE_OQ);
  const __m512 alt = _mm512_mask_blend_ps(nonpos, _mm512_set1_ps(INFINITY), _mm512_setzero_ps());
  return _mm512_mask_blend_ps(big, res, alt);
}

// reduce16 (ops.h) of one register's lanes.
float reduce16_reg(__m512 v) {
  const __m256 b = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
  __m128 c = _mm_add_ps(_mm256_castps256_ps128(b), _mm256_extractf128_ps(b, 1));
  c = _mm_add_ps(c, _mm_movehl_ps(c, c));
  return _mm_cvtss_f32(_mm_add_ss(c, _mm_movehdup_ps(c)));
}

// x rounded to the cache's element type (avx2_common.h's round_to_kv8).
__m512 round_to_kv16(__m512 x, bool bf16) {
  if (!bf16) return _mm512_cvtph_ps(_mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT));
  const __m512i bits = _mm512_castps_si512(x);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_add_epi32(bits, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), odd));
  const __m512i kept = _mm512_and_si512(rounded, _mm512_set1_epi32((int)0xffff0000u));
  const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
  return _mm512_mask_blend_ps(nan, _mm512_castsi512_ps(kept), x);
}

// Lanes of the 16-position block from g that lie in [lo, hi].
__mmask16 block_mask(int g, int lo, int hi) {
  const int a = std::max(lo - g, 0), b = std::min(hi + 1 - g, 16);
  return a >= b ? (__mmask16)0 : (__mmask16)(((1u << b) - 1) & ~((1u << a) - 1));
}

// One row's softmax in place: s (indexed by position - base) goes from scores to weights.
void softmax_row(float* s, int base, int lo, int hi, int first, int pos, bool round, bool bf16) {
  __m512 vmax = _mm512_set1_ps(-INFINITY);
  for (int g = first / 16 * 16; g <= pos; g += 16)
    vmax = _mm512_max_ps(vmax, _mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY),
                                                    block_mask(g, first, pos), s + (g - base)));
  const __m512 m = _mm512_set1_ps(_mm512_reduce_max_ps(vmax));
  // Numerators and their sum: 16-position blocks from first's (zeros outside [first, pos]),
  // each reduce16'd in float, summed in double.
  double sum = 0.0;
  for (int g = first / 16 * 16; g <= pos; g += 16) {
    const __mmask16 k = block_mask(g, first, pos);
    const __m512 e =
        _mm512_maskz_mov_ps(k, exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, s + (g - base)), m)));
    _mm512_mask_storeu_ps(s + (g - base), k, e);
    sum += (double)reduce16_reg(e);
  }
  const __m512 inv = _mm512_set1_ps((float)(1.0 / sum));
  // Weights over the tile's whole strip [lo, hi]: zeros outside the row's [first, pos].
  for (int g = base; g <= hi; g += 16) {
    const __mmask16 k = block_mask(g, first, pos);
    const __m512 w = _mm512_mul_ps(_mm512_maskz_loadu_ps(k, s + (g - base)), inv);
    _mm512_mask_storeu_ps(s + (g - base), block_mask(g, lo, hi),
                          _mm512_maskz_mov_ps(k, round ? round_to_kv16(w, bf16) : w));
  }
}

}  // namespace

void attn_softmax(const AttnContext& c, const AttnTile& t, AttnScratch& sc, int r_begin,
                  int r_end) {
  const int base = tile_base(t), span = tile_span(t);
  const bool bf16 = c.layout->dtype == KvDType::BF16;
  const bool round =
      !kv_dtype_quantized(c.layout->type(0)) && !kv_dtype_quantized(c.layout->type(1));
  for (int r = r_begin; r < r_end; ++r)
    softmax_row(sc.s.data() + (size_t)r * span, base, t.lo, t.hi, t.rows[r].first, t.rows[r].pos,
                round, bf16);
}

namespace {

// Positions per lane row and chunk of the value stage (as the AVX2 stage's).
constexpr int kValueChunkPerLane = 16;

// Accumulators of rows [r0, r0 + NR), dimensions [d, d + 16 * NV), lane row `lane`, over the
// positions p = lane (mod lanes) of [c0, c1) ∩ [lo, hi], in increasing order. A quantized V
// is read from vf when given, the chunk's rows already in float ([p - c0][hd]).
template <KvDType VT, int NR, int NV>
void values_block(const AttnTile& t, AttnScratch& sc, const float* vf, int hd, int lane, int d,
                  int r0, int c0, int c1) {
  const int L = tile_lanes(t.order), base = tile_base(t);
  const size_t span = (size_t)tile_span(t);
  float* acc = sc.acc.data();
  __m512 a[NR][NV];
  for (int r = 0; r < NR; ++r)
    for (int j = 0; j < NV; ++j)
      a[r][j] = c0 == base ? _mm512_setzero_ps()
                           : _mm512_loadu_ps(acc + ((size_t)(r0 + r) * L + lane) * hd + d + 16 * j);
  for (int p = std::max(c0 + lane, t.lo + (lane - t.lo % L + L) % L); p < c1 && p <= t.hi; p += L) {
    __m512 vv[NV];
    if (kv_dtype_quantized(VT) && vf != nullptr) {
      for (int j = 0; j < NV; ++j) vv[j] = _mm512_loadu_ps(vf + (size_t)(p - c0) * hd + d + 16 * j);
    } else {
      const uint16_t* v = sc.v_rows[(size_t)(p - base)];
      for (int j = 0; j < NV; ++j) vv[j] = load16<VT>(v, d + 16 * j);
    }
    const float* w = sc.s.data() + (size_t)r0 * span + (size_t)(p - base);
    for (int r = 0; r < NR; ++r) {
      const __m512 wr = _mm512_set1_ps(w[(size_t)r * span]);
      for (int j = 0; j < NV; ++j) a[r][j] = _mm512_fmadd_ps(wr, vv[j], a[r][j]);
    }
  }
  for (int r = 0; r < NR; ++r)
    for (int j = 0; j < NV; ++j)
      _mm512_storeu_ps(acc + ((size_t)(r0 + r) * L + lane) * hd + d + 16 * j, a[r][j]);
}

template <KvDType VT, int NV>
void values_rows(const AttnTile& t, AttnScratch& sc, const float* vf, int hd, int lane, int d,
                 int r0, int c0, int c1) {
  switch (std::min(4, t.n_rows - r0)) {
    case 4:
      return values_block<VT, 4, NV>(t, sc, vf, hd, lane, d, r0, c0, c1);
    case 3:
      return values_block<VT, 3, NV>(t, sc, vf, hd, lane, d, r0, c0, c1);
    case 2:
      return values_block<VT, 2, NV>(t, sc, vf, hd, lane, d, r0, c0, c1);
    default:
      return values_block<VT, 1, NV>(t, sc, vf, hd, lane, d, r0, c0, c1);
  }
}

// The 32 values of the block from dimension d (a multiple of 32) as float into dst: load16's
// values (d * q, exact), the block's scale converted once.
template <KvDType VT>
HABLAR_INLINE void store_block32(const uint16_t* row, int d, float* dst) {
  __m512i lo, hi;
  uint16_t scale;
  if constexpr (VT == KvDType::Q8_0) {
    const auto* b = reinterpret_cast<const BlockQ8_0*>(row) + d / kQK;
    const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b->qs));
    lo = _mm512_cvtepi8_epi32(_mm256_castsi256_si128(q));
    hi = _mm512_cvtepi8_epi32(_mm256_extracti128_si256(q, 1));
    scale = b->d;
  } else {
    const auto* b = reinterpret_cast<const BlockQ4_0*>(row) + d / kQK;
    const __m512i q =
        _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b->qs)));
    lo = _mm512_sub_epi32(_mm512_and_si512(q, _mm512_set1_epi32(0x0f)), _mm512_set1_epi32(8));
    hi = _mm512_sub_epi32(_mm512_srli_epi32(q, 4), _mm512_set1_epi32(8));
    scale = b->d;
  }
  const __m512 dv = _mm512_set1_ps(half_to_float(scale));
  _mm512_storeu_ps(dst, _mm512_mul_ps(_mm512_cvtepi32_ps(lo), dv));
  _mm512_storeu_ps(dst + 16, _mm512_mul_ps(_mm512_cvtepi32_ps(hi), dv));
}

// A quantized V chunk's rows [c0, c1) ∩ [lo, hi], dimensions [d_begin, d_end), to float
// once (load16's exact d * q) for every row block and lane row that reads them.
template <KvDType VT>
const float* convert_chunk(const AttnTile& t, AttnScratch& sc, int hd, int d_begin, int d_end,
                           int c0, int c1) {
  // Two row blocks or fewer (decoding: one kv head's 7 query heads) convert in place: the
  // buffer's stores and loads cost more than a second conversion.
  if constexpr (!kv_dtype_quantized(VT)) {
    return nullptr;
  } else if (t.n_rows <= 8) {
    return nullptr;
  } else {
    thread_local std::vector<float> vf_owner;
    std::vector<float>& vf = vf_owner;
    vf.resize((size_t)(c1 - c0) * hd);
    const int base = tile_base(t);
    for (int p = std::max(c0, t.lo); p < c1 && p <= t.hi; ++p) {
      const uint16_t* v = sc.v_rows[(size_t)(p - base)];
      float* dst = vf.data() + (size_t)(p - c0) * hd;
      for (int d = d_begin; d < d_end;) {
        if (d % kQK == 0 && d + kQK <= d_end) {
          store_block32<VT>(v, d, dst + d);
          d += kQK;
        } else {
          _mm512_storeu_ps(dst + d, load16<VT>(v, d));
          d += 16;
        }
      }
    }
    return vf.data();
  }
}

// Dimensions [d_begin, d_end) of one chunk, 64 at a time (then 48, 32 or 16).
template <KvDType VT>
void values_chunk(const AttnTile& t, AttnScratch& sc, int hd, int d_begin, int d_end, int c0) {
  const int c1 = c0 + kValueChunkPerLane * tile_lanes(t.order);
  // The next chunk's V rows on their way to L2 while this chunk is summed.
  const int base = tile_base(t);
  const size_t row_bytes = (size_t)kv_row_units(VT, hd) * sizeof(uint16_t);
  for (int p = std::max(c1, t.lo); p < c1 + (c1 - c0) && p <= t.hi; ++p) {
    const char* v = reinterpret_cast<const char*>(sc.v_rows[(size_t)(p - base)]);
    for (size_t i = 0; i < row_bytes; i += 64) _mm_prefetch(v + i, _MM_HINT_T1);
  }
  const float* vf = convert_chunk<VT>(t, sc, hd, d_begin, d_end, c0, c1);
  for (int r0 = 0; r0 < t.n_rows; r0 += 4)
    for (int lane = 0; lane < tile_lanes(t.order); ++lane)
      for (int d = d_begin; d < d_end; d += 64) {
        switch (std::min(4, (d_end - d) / 16)) {
          case 4:
            values_rows<VT, 4>(t, sc, vf, hd, lane, d, r0, c0, c1);
            break;
          case 3:
            values_rows<VT, 3>(t, sc, vf, hd, lane, d, r0, c0, c1);
            break;
          case 2:
            values_rows<VT, 2>(t, sc, vf, hd, lane, d, r0, c0, c1);
            break;
          default:
            values_rows<VT, 1>(t, sc, vf, hd, lane, d, r0, c0, c1);
            break;
        }
      }
}

}  // namespace

void attn_values(const AttnContext& c, const AttnTile& t, AttnScratch& sc, int d_begin, int d_end) {
  const int hd = c.layout->head_dim, L = tile_lanes(t.order);
  for (int c0 = tile_base(t); c0 <= t.hi; c0 += kValueChunkPerLane * L) {
    switch (c.layout->type(1)) {
      case KvDType::F16:
        values_chunk<KvDType::F16>(t, sc, hd, d_begin, d_end, c0);
        break;
      case KvDType::BF16:
        values_chunk<KvDType::BF16>(t, sc, hd, d_begin, d_end, c0);
        break;
      case KvDType::Q8_0:
        values_chunk<KvDType::Q8_0>(t, sc, hd, d_begin, d_end, c0);
        break;
      case KvDType::Q4_0:
        values_chunk<KvDType::Q4_0>(t, sc, hd, d_begin, d_end, c0);
        break;
    }
  }
}

}  // namespace hablar::cpu::avx512
