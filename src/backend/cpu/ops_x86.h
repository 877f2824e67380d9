// SIMD forms of the non-matmul ops, built with AVX2 + FMA + F16C (ops_avx2.cpp); ops.cpp and
// attention.cpp call them when the CPU has those extensions, else their scalar forms.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/cpu/ops.h"
#include "core/kv_layout.h"

namespace hablar::cpu::avx2 {

uint64_t read_through(const uint8_t* p, size_t n);
void swiglu(const float* gate, const float* up, float* out, int64_t n);
void rope_apply(float* x, int n_heads, int head_dim, const RopeParams& p, const float* cos_t,
                const float* sin_t);
// head_dim must be a multiple of 8; positions [first, pos] are attended.
void attend_head(const uint16_t* cache, const KvCacheLayout& layout, int layer,
                 const int32_t* block_table, int first, int pos, int kv_head, const float* q,
                 float scale, float softcap, SumOrder order, float* scores, float* out);

// Tiled attention: the rows of a tile (query token x head) read one kv head of one sequence
// and take one summation order. Each row attends [first, pos]; the tile covers [lo, hi], their
// union. The work is split in three stages so that one tile can also be shared by threads
// (tile_scores over position ranges, tile_softmax over rows, tile_values over dimension
// ranges); every row gets attend_head's bits whatever the split, because each value is
// computed by the same operations in the same order:
//   scores:  q·k of every (row, position) of [lo, hi], each K row read (and converted) once for
//            the tile; 2 rows x 2 positions per register block, 8 positions reduced together;
//   softmax: per row, as attend_head (max, exp_approx, 16-position block sums in double, weights
//            rounded to the cache type), stored position-major;
//   values:  per row, the weighted V rows summed into row p mod 16 (or 64) in position order,
//            with the accumulators in registers across a chunk of positions (each V row read
//            once per chunk and kept in L1/L2), then folded and reduced as attend_head does.
// Scratch is [rows x (hi + 1 - base)] floats twice (base = lo rounded down to 16 or 64; once
// on the AVX-512 stages, which write the weights over the scores) plus
// [rows x lanes x head_dim]: a strip of the score matrix, never all of it.
struct AttnRow {
  const float* q;  // [head_dim]
  float* out;      // [head_dim]
  int32_t first, pos;
};
struct AttnTile {
  const int32_t* block_table;
  int32_t kv_head;
  SumOrder order;
  const AttnRow* rows;
  int32_t n_rows;
  int32_t lo, hi;
};
struct AttnContext {
  const uint16_t* cache;
  const KvCacheLayout* layout;
  int layer;
  float scale, softcap;
};
struct AttnScratch {
  std::vector<float> qr, s, acc;  // s: [row][p - base] scores, then the softmax weights
  std::vector<uint32_t> qk;  // [rows][qk_quant_row_words]: q for the integer q·k (quantized K)
  std::vector<const uint16_t*> k_rows, v_rows;  // [p - base]: the cache rows of [lo, hi]
};
// Sizes the scratch and rounds the rows' q to the cache type. head_dim a multiple of 8.
void tile_prepare(const AttnContext& c, const AttnTile& t, AttnScratch& sc);
// Scores of the positions [p_begin, p_end) of the tile (p_begin a multiple of 8).
void tile_scores(const AttnContext& c, const AttnTile& t, AttnScratch& sc, int p_begin, int p_end);
// Softmax weights of rows [r_begin, r_end).
void tile_softmax(const AttnContext& c, const AttnTile& t, AttnScratch& sc, int r_begin, int r_end);
// Outputs of dimensions [d_begin, d_end) of every row (multiples of 8).
void tile_values(const AttnContext& c, const AttnTile& t, AttnScratch& sc, int d_begin, int d_end);

// Lanes of the tile's accumulators and strips: 16 or 64 (the summation order's).
inline int tile_lanes(SumOrder order) {
  return order == SumOrder::kLanes64 ? 64 : kReduceLanes;
}
// First position of the strips: lo rounded down to the lanes.
inline int tile_base(const AttnTile& t) {
  return t.lo / tile_lanes(t.order) * tile_lanes(t.order);
}
// Score/weight strip length: positions [base, hi] rounded up to whole 16-position groups.
inline int tile_span(const AttnTile& t) {
  return (t.hi + 1 - tile_base(t) + 15) / 16 * 16;
}

}  // namespace hablar::cpu::avx2

// The AVX-512 forms of the stages (attention_avx512.cpp), the same bits; tile_scores,
// tile_softmax and tile_values take them when the CPU has AVX-512
// (cpu_features().has_avx512_kernels()) and set_avx512_attention has not turned them off:
// scores when attn_scores_supported, softmax and values (together: they share the weights'
// layout) when head_dim is a multiple of 16.
namespace hablar::cpu {
// Turns the AVX-512 stages on (the default where the CPU has them) or off (the AVX2 ones),
// for benchmarks that compare both in one process. Not to be called while attention runs.
void set_avx512_attention(bool on);
}  // namespace hablar::cpu

namespace hablar::cpu::avx512 {
using avx2::AttnContext, avx2::AttnTile, avx2::AttnScratch, avx2::tile_lanes, avx2::tile_base,
    avx2::tile_span;
// Whether attn_scores takes this order at the layout's head_dim (16-lane: a multiple of 16;
// 64-lane: a multiple of 64, no tail in double; a quantized K, whose integer q·k has one
// order: head_dim up to 512).
bool attn_scores_supported(const KvCacheLayout& layout, SumOrder order);
// tile_scores' work: positions [p_begin, p_end), 16 at a time, only those of the range stored.
void attn_scores(const AttnContext& c, const AttnTile& t, AttnScratch& sc, int p_begin, int p_end);
// tile_softmax's work, rows [r_begin, r_end), with the weights written over the row's scores
// (row-major in sc.s, zeros outside [first, pos]) instead of into sc.w.
void attn_softmax(const AttnContext& c, const AttnTile& t, AttnScratch& sc, int r_begin, int r_end);
// tile_values' accumulation (without the final reduction) from attn_softmax's weights:
// dimensions [d_begin, d_end), multiples of 16.
void attn_values(const AttnContext& c, const AttnTile& t, AttnScratch& sc, int d_begin, int d_end);
}  // namespace hablar::cpu::avx512
