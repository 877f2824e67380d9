// Attention of query tokens over the paged F16 (or BF16) KV cache.
#include <algorithm>
#include <atomic>
#include <climits>
#include <cmath>
#include <string>
#include <vector>

#include "backend/cpu/attention_int.h"
#include "backend/cpu/ops.h"
#include "backend/cpu/ops_x86.h"
#include "core/cpu_features.h"
#include "core/error.h"
#include "core/fp16.h"

namespace hablar::cpu {
namespace {

// x rounded to the cache's element type (to nearest, ties to even).
float round_to_kv(float x, bool bf16) {
  return bf16 ? bf16_to_f32(f32_to_bf16(x)) : fp16_to_f32(f32_to_fp16(x));
}

// q·k of one position in the given order (ops.h SumOrder); q and k as float. Each partial
// sum is one fused multiply-add per value, as the SIMD forms take it (for F16/BF16 rows the
// products are exact, so this is also llama.cpp's unfused order).
float dot_qk(const float* qr, const float* k, int hd, SumOrder order) {
  if (order == SumOrder::kLanes16 && hd % kReduceLanes == 0) {
    float lanes[kReduceLanes] = {};
    for (int d = 0; d < hd; ++d)
      lanes[d % kReduceLanes] = std::fma(qr[d], k[d], lanes[d % kReduceLanes]);
    return reduce16(lanes);
  }
  const int main_dims = hd / 64 * 64;
  float part[64] = {}, folded[kReduceLanes];
  for (int d = 0; d < main_dims; ++d) part[d % 64] = std::fma(qr[d], k[d], part[d % 64]);
  fold64(part, folded);
  double sum = (double)reduce16(folded);
  for (int d = main_dims; d < hd; ++d) sum += (double)(qr[d] * k[d]);
  return (float)sum;
}

// One head: scores over positions [first, pos], softmax, weighted sum of V. `scores` has
// room for pos + 1 values. The numerics are llama.cpp's (non-flash CPU attention), so that
// both round alike: q is rounded to the cache type before q·k; each dot product keeps 16 or
// 64 partial sums (SumOrder); softmax uses exp_approx and sums 16-position blocks (each
// reduce16'd in float; positions before `first`, masked in llama.cpp, are zeros there) in
// double; the weights are rounded to the cache type before the weighted sum of V, which
// keeps 16 or 64 partial sums by position. Every product of two cache-type values is exact
// in float, so FMA or not gives the same. A quantized K or V (ops.h): no roundings of q or
// the weights, the 16-lane order; a quantized K's scores are the integer q·k
// (attention_int.h), a quantized V's rows are dequantized.
void attend_head_scalar(const uint16_t* cache, const KvCacheLayout& layout, int layer,
                        const int32_t* block_table, int first, int pos, int kv_head, const float* q,
                        float scale, float cap, SumOrder order, float* scores, float* out) {
  const int hd = layout.head_dim;
  const bool bf16 = layout.dtype == KvDType::BF16;
  const bool quant = kv_dtype_quantized(layout.type(0)) || kv_dtype_quantized(layout.type(1));
  if (quant) order = SumOrder::kLanes16;
  const int rows = order == SumOrder::kLanes64 ? 64 : kReduceLanes;
  std::vector<float> qr((size_t)hd), row((size_t)hd), acc((size_t)rows * hd, 0.0f);
  for (int d = 0; d < hd; ++d) qr[(size_t)d] = quant ? q[d] : round_to_kv(q[d], bf16);
  const auto load = [&](int kv, int p) {
    kv_row_to_f32(cache + layout.position_offset(block_table, layer, kv, kv_head, p),
                  layout.type(kv), hd, row.data());
    return row.data();
  };
  // A quantized K: the integer q·k of llama.cpp's flash attention (attention_int.h).
  const KvDType kt = layout.type(0);
  std::vector<uint32_t> qk(kv_dtype_quantized(kt) ? qk_quant_row_words(hd) : 0);
  if (kv_dtype_quantized(kt)) quantize_q_for_k(q, hd, kt, qk_quant_row(qk.data(), hd));
  const auto dot = [&](int p) {
    if (!kv_dtype_quantized(kt)) return dot_qk(qr.data(), load(0, p), hd, order);
    return dot_qk_int_scalar(cache + layout.position_offset(block_table, layer, 0, kv_head, p), kt,
                             qk_quant_row(qk.data(), hd), hd);
  };
  float max_score = -INFINITY;
  for (int p = first; p <= pos; ++p) {
    scores[p] = dot(p) * scale;
    if (cap > 0.0f) softcap(scores + p, 1, cap);
    if (scores[p] > max_score) max_score = scores[p];
  }
  double sum = 0.0;
  for (int p0 = first / kReduceLanes * kReduceLanes; p0 <= pos; p0 += kReduceLanes) {
    float block[kReduceLanes] = {};
    for (int p = std::max(p0, first); p <= pos && p < p0 + kReduceLanes; ++p) {
      scores[p] = exp_approx(scores[p] - max_score);
      block[p - p0] = scores[p];
    }
    sum += (double)reduce16(block);
  }
  const float inv = (float)(1.0 / sum);
  for (int p = first; p <= pos; ++p) {
    const float* v = load(1, p);
    const float w = quant ? scores[p] * inv : round_to_kv(scores[p] * inv, bf16);
    float* a = acc.data() + (size_t)(p % rows) * hd;
    for (int d = 0; d < hd; ++d) a[d] = std::fma(w, v[d], a[d]);
  }
  for (int d = 0; d < hd; ++d) {
    float part[64], lanes[kReduceLanes];
    for (int r = 0; r < rows; ++r) part[r] = acc[(size_t)r * hd + d];
    if (rows == 64) {
      fold64(part, lanes);
    } else {
      std::copy(part, part + kReduceLanes, lanes);
    }
    out[d] = reduce16(lanes);
  }
}

// The AVX2 form when the CPU has it (the same one for every call, so results never depend
// on which path a query took).
void attend_head(const uint16_t* cache, const KvCacheLayout& layout, int layer,
                 const int32_t* block_table, int first, int pos, int kv_head, const float* q,
                 float scale, float cap, SumOrder order, float* scores, float* out) {
  static const bool simd = cpu_features().has_avx2_kernels();
  const bool quant = kv_dtype_quantized(layout.type(0)) || kv_dtype_quantized(layout.type(1));
  if (simd && layout.head_dim % 8 == 0 && !quant) {
    avx2::attend_head(cache, layout, layer, block_table, first, pos, kv_head, q, scale, cap, order,
                      scores, out);
  } else {
    attend_head_scalar(cache, layout, layer, block_table, first, pos, kv_head, q, scale, cap, order,
                       scores, out);
  }
}

void check_attention(const KvCacheLayout& layout, int layer, int pos, int n_heads) {
  if (layer < 0 || layer >= layout.n_layers)
    throw_error(ErrorKind::kInvalidArgument,
                "attention: layer " + std::to_string(layer) + " out of range");
  if (pos < 0) throw_error(ErrorKind::kInvalidArgument, "attention: negative position");
  if (layout.n_kv_heads <= 0 || n_heads % layout.n_kv_heads != 0)
    throw_error(ErrorKind::kInvalidArgument, "attention: n_heads " + std::to_string(n_heads) +
                                                 " is not a multiple of n_kv_heads " +
                                                 std::to_string(layout.n_kv_heads));
}

std::vector<float>& score_scratch() {
  thread_local std::vector<float> scores;
  return scores;
}

}  // namespace

namespace {

using HeadFn = void (*)(const uint16_t*, const KvCacheLayout&, int, const int32_t*, int, int, int,
                        const float*, float, float, SumOrder, float*, float*);

void attention_one_with(HeadFn head, const uint16_t* cache, const KvCacheLayout& layout, int layer,
                        const int32_t* block_table, int pos, const float* q, int n_heads,
                        float* out, SumOrder order) {
  check_attention(layout, layer, pos, n_heads);
  std::vector<float>& scores = score_scratch();
  if (scores.size() < (size_t)pos + 1) scores.resize((size_t)pos + 1);
  const int group = n_heads / layout.n_kv_heads;
  const float scale = 1.0f / std::sqrt((float)layout.head_dim);
  for (int h = 0; h < n_heads; ++h)
    head(cache, layout, layer, block_table, 0, pos, h / group, q + (int64_t)h * layout.head_dim,
         scale, 0.0f, order, scores.data(), out + (int64_t)h * layout.head_dim);
}

}  // namespace

void attention_one(const uint16_t* cache, const KvCacheLayout& layout, int layer,
                   const int32_t* block_table, int pos, const float* q, int n_heads, float* out,
                   SumOrder order) {
  attention_one_with(&attend_head, cache, layout, layer, block_table, pos, q, n_heads, out, order);
}

void attention_one_scalar(const uint16_t* cache, const KvCacheLayout& layout, int layer,
                          const int32_t* block_table, int pos, const float* q, int n_heads,
                          float* out, SumOrder order) {
  attention_one_with(&attend_head_scalar, cache, layout, layer, block_table, pos, q, n_heads, out,
                     order);
}

namespace {

// Rows per tile strip: a tile's scores and weights take at most this many floats each
// (rows x positions, 2 MiB). Larger than L2: the strips are streamed (written once, read by
// the softmax and the values in order), and more query rows per tile share each converted K
// group and V row (attention_bench, one thread, prompt 64 @ d16384: 2^17 131 ms, 2^19 73 ms,
// 2^20 75 ms, 2^21 83 ms; 256 @ d4096: 75, 72, 78, 80 ms).
constexpr int64_t kStripFloats = 1 << 19;
constexpr int kMaxQueryTile = 16;
// Positions per work item when the keys of a few long sequences are split over threads.
constexpr int kScoreChunk = 1024;

struct TilePlan {
  std::vector<avx2::AttnRow> rows;
  std::vector<avx2::AttnTile> tiles;
};

// Groups the queries into tiles: consecutive tokens of one sequence (same block table and
// order, consecutive positions), at most kMaxQueryTile of them and fewer for long sequences,
// times one kv head with its group of query heads.
void plan_tiles(std::span<const AttentionQuery> queries, int n_heads, int n_kv_heads, int hd,
                bool quant, int n_threads, TilePlan& plan) {
  const int group = n_heads / n_kv_heads;
  plan.rows.clear(), plan.tiles.clear();
  std::vector<size_t> row_begin;
  // Few queries (a speculative verification chunk of one sequence: 9 tokens, 3 kv heads)
  // would make fewer tiles than the threads can share evenly (3 tiles on 2 threads: one
  // thread idle a third of the time): at most this many tokens per tile then, so that there
  // are about two tiles per thread.
  const int64_t even_cap = std::max<int64_t>(
      1, ((int64_t)queries.size() * n_kv_heads + 2 * n_threads - 1) / (2 * n_threads));
  for (size_t i = 0; i < queries.size();) {
    const AttentionQuery& a = queries[i];
    const int64_t tq =
        std::clamp<int64_t>(kStripFloats / ((int64_t)group * (a.pos + 1)), 1, kMaxQueryTile);
    size_t j = i + 1;
    while (j < queries.size() && (int64_t)(j - i) < tq && queries[j].block_table == a.block_table &&
           queries[j].order == a.order && queries[j].pos == queries[j - 1].pos + 1)
      ++j;
    if ((int64_t)(j - i) > even_cap) {  // equal parts of at most even_cap tokens
      const int64_t parts = ((int64_t)(j - i) + even_cap - 1) / even_cap;
      j = i + (size_t)(((int64_t)(j - i) + parts - 1) / parts);
    }
    for (int kv = 0; kv < n_kv_heads; ++kv) {
      const SumOrder order = quant ? SumOrder::kLanes16 : a.order;
      avx2::AttnTile t{a.block_table, kv, order, nullptr, 0, INT32_MAX, -1};
      row_begin.push_back(plan.rows.size());
      for (size_t k = i; k < j; ++k) {
        const AttentionQuery& q = queries[k];
        for (int h = kv * group; h < (kv + 1) * group; ++h)
          plan.rows.push_back({q.q + (int64_t)h * hd, q.out + (int64_t)h * hd, q.first, q.pos});
        t.lo = std::min(t.lo, q.first), t.hi = std::max(t.hi, q.pos);
      }
      t.n_rows = (int32_t)((j - i) * (size_t)group);
      plan.tiles.push_back(t);
    }
    i = j;
  }
  for (size_t t = 0; t < plan.tiles.size(); ++t)
    plan.tiles[t].rows = plan.rows.data() + row_begin[t];
}

// Runs fn(item) for items [0, n) over the pool, claimed one at a time from the last (the
// tiles of a prompt grow with the position, so the largest go first).
template <typename Fn>
void claim_items(ThreadPool& pool, int64_t n, const Fn& fn) {
  std::atomic<int64_t> next{0};
  pool.run([&](int, int) {
    for (int64_t i; (i = next.fetch_add(1, std::memory_order_relaxed)) < n;) fn(n - 1 - i);
  });
}

// A few long tiles (decoding a few sequences): each stage split over the threads, the keys of
// one tile among several of them (same bits: every value is computed as in the one-thread
// form).
void run_staged(const avx2::AttnContext& c, const TilePlan& plan, ThreadPool& pool) {
  // Named by reference: a lambda run on a worker would see the worker's own thread_local.
  thread_local std::vector<avx2::AttnScratch> scratch_owner;
  std::vector<avx2::AttnScratch>& scratch = scratch_owner;
  const auto& tiles = plan.tiles;
  if (scratch.size() < tiles.size()) scratch.resize(tiles.size());
  struct Item {
    int tile, begin, end;
  };
  std::vector<Item> score_items, row_items, dim_items;
  const int hd = c.layout->head_dim, step = hd % 16 == 0 ? 16 : 8;
  const int dim_parts =
      std::clamp((pool.size() + (int)tiles.size() - 1) / (int)tiles.size(), 1, hd / step);
  for (int i = 0; i < (int)tiles.size(); ++i) {
    const avx2::AttnTile& t = tiles[(size_t)i];
    avx2::tile_prepare(c, t, scratch[(size_t)i]);
    for (int p = t.lo / 16 * 16; p <= t.hi; p += kScoreChunk)
      score_items.push_back({i, p, p + kScoreChunk});
    for (int r = 0; r < t.n_rows; ++r) row_items.push_back({i, r, r + 1});
    for (int part = 0; part < dim_parts; ++part) {
      const IndexRange d = split_range(hd, part, dim_parts, step);
      if (d.begin < d.end) dim_items.push_back({i, (int)d.begin, (int)d.end});
    }
  }
  const auto stage = [&](const std::vector<Item>& items, auto fn) {
    claim_items(pool, (int64_t)items.size(), [&](int64_t k) {
      const Item& it = items[(size_t)k];
      fn(tiles[(size_t)it.tile], scratch[(size_t)it.tile], it.begin, it.end);
    });
  };
  stage(score_items, [&](const avx2::AttnTile& t, avx2::AttnScratch& s, int b, int e) {
    avx2::tile_scores(c, t, s, b, e);
  });
  stage(row_items, [&](const avx2::AttnTile& t, avx2::AttnScratch& s, int b, int e) {
    avx2::tile_softmax(c, t, s, b, e);
  });
  stage(dim_items, [&](const avx2::AttnTile& t, avx2::AttnScratch& s, int b, int e) {
    avx2::tile_values(c, t, s, b, e);
  });
}

void run_tiled(const avx2::AttnContext& c, std::span<const AttentionQuery> queries, int n_heads,
               ThreadPool& pool) {
  thread_local TilePlan plan_owner;
  TilePlan& plan = plan_owner;  // by reference: the workers read the caller's plan
  const KvCacheLayout& layout = *c.layout;
  plan_tiles(queries, n_heads, layout.n_kv_heads, layout.head_dim,
             kv_dtype_quantized(layout.type(0)) || kv_dtype_quantized(layout.type(1)), pool.size(),
             plan);
  int longest = 0;
  for (const avx2::AttnTile& t : plan.tiles) longest = std::max(longest, t.hi + 1 - t.lo);
  if (pool.size() > 1 && (int)plan.tiles.size() < 2 * pool.size() && longest >= 2 * kScoreChunk)
    return run_staged(c, plan, pool);
  claim_items(pool, (int64_t)plan.tiles.size(), [&](int64_t i) {
    thread_local avx2::AttnScratch sc;
    const avx2::AttnTile& t = plan.tiles[(size_t)i];
    avx2::tile_prepare(c, t, sc);
    avx2::tile_scores(c, t, sc, t.lo / 8 * 8, t.hi + 1);
    avx2::tile_softmax(c, t, sc, 0, t.n_rows);
    avx2::tile_values(c, t, sc, 0, layout.head_dim);
  });
}

}  // namespace

void attention_batch(const uint16_t* cache, const KvCacheLayout& layout, int layer,
                     std::span<const AttentionQuery> queries, int n_heads, float scale,
                     float softcap, ThreadPool& pool) {
  for (const AttentionQuery& q : queries) {
    check_attention(layout, layer, q.pos, n_heads);
    if (q.first < 0 || q.first > q.pos)
      throw_error(ErrorKind::kInvalidArgument, "attention: first position out of range");
  }
  static const bool simd = cpu_features().has_avx2_kernels();
  if (simd && layout.head_dim % 8 == 0) {
    // Tiled: same bits as attend_head per (query, head), K/V read once per tile.
    return run_tiled({cache, &layout, layer, scale, softcap}, queries, n_heads, pool);
  }
  attention_batch_scalar(cache, layout, layer, queries, n_heads, scale, softcap, pool);
}

void attention_batch_scalar(const uint16_t* cache, const KvCacheLayout& layout, int layer,
                            std::span<const AttentionQuery> queries, int n_heads, float scale,
                            float softcap, ThreadPool& pool) {
  for (const AttentionQuery& q : queries) {
    check_attention(layout, layer, q.pos, n_heads);
    if (q.first < 0 || q.first > q.pos)
      throw_error(ErrorKind::kInvalidArgument, "attention: first position out of range");
  }
  const int64_t n_items = (int64_t)queries.size() * n_heads;
  const int group = n_heads / layout.n_kv_heads;
  pool.run([&](int thread, int n_threads) {
    std::vector<float>& scores = score_scratch();
    for (int64_t item = thread; item < n_items; item += n_threads) {
      const AttentionQuery& q = queries[(size_t)(item / n_heads)];
      const int h = (int)(item % n_heads);
      if (scores.size() < (size_t)q.pos + 1) scores.resize((size_t)q.pos + 1);
      attend_head_scalar(cache, layout, layer, q.block_table, q.first, q.pos, h / group,
                         q.q + (int64_t)h * layout.head_dim, scale, softcap, q.order, scores.data(),
                         q.out + (int64_t)h * layout.head_dim);
    }
  });
}

void attention_batch(const uint16_t* cache, const KvCacheLayout& layout, int layer,
                     std::span<const AttentionQuery> queries, int n_heads, ThreadPool& pool) {
  attention_batch(cache, layout, layer, queries, n_heads, 1.0f / std::sqrt((float)layout.head_dim),
                  0.0f, pool);
}

}  // namespace hablar::cpu
