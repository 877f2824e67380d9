// Attention of query tokens over the paged F16 (or BF16) KV cache.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "backend/cpu/ops.h"
#include "backend/cpu/ops_x86.h"
#include "core/cpu_features.h"
#include "core/error.h"
#include "core/fp16.h"

namespace hablar::cpu {
namespace {

float kv_value(const uint16_t* p, bool bf16) {
  return bf16 ? bf16_to_f32(*p) : fp16_to_f32(*p);
}

// x rounded to the cache's element type (to nearest, ties to even).
float round_to_kv(float x, bool bf16) {
  return bf16 ? bf16_to_f32(f32_to_bf16(x)) : fp16_to_f32(f32_to_fp16(x));
}

// q·k of one position in the given order (ops.h SumOrder); q is already rounded.
float dot_qk(const float* qr, const uint16_t* k, int hd, bool bf16, SumOrder order) {
  if (order == SumOrder::kLanes16 && hd % kReduceLanes == 0) {
    float lanes[kReduceLanes] = {};
    for (int d = 0; d < hd; ++d) lanes[d % kReduceLanes] += qr[d] * kv_value(k + d, bf16);
    return reduce16(lanes);
  }
  const int main_dims = hd / 64 * 64;
  float part[64] = {}, folded[kReduceLanes];
  for (int d = 0; d < main_dims; ++d) part[d % 64] += qr[d] * kv_value(k + d, bf16);
  fold64(part, folded);
  double sum = (double)reduce16(folded);
  for (int d = main_dims; d < hd; ++d) sum += (double)(qr[d] * kv_value(k + d, bf16));
  return (float)sum;
}

// One head: scores over positions [first, pos], softmax, weighted sum of V. `scores` has
// room for pos + 1 values. The numerics are llama.cpp's (non-flash CPU attention), so that
// both round alike: q is rounded to the cache type before q·k; each dot product keeps 16 or
// 64 partial sums (SumOrder); softmax uses exp_approx and sums 16-position blocks (each
// reduce16'd in float; positions before `first`, masked in llama.cpp, are zeros there) in
// double; the weights are rounded to the cache type before the weighted sum of V, which
// keeps 16 or 64 partial sums by position. Every product of two cache-type values is exact
// in float, so FMA or not gives the same.
void attend_head_scalar(const uint16_t* cache, const KvCacheLayout& layout, int layer,
                        const int32_t* block_table, int first, int pos, int kv_head, const float* q,
                        float scale, float cap, SumOrder order, float* scores, float* out) {
  const int hd = layout.head_dim;
  const bool bf16 = layout.dtype == KvDType::BF16;
  const int rows = order == SumOrder::kLanes64 ? 64 : kReduceLanes;
  std::vector<float> qr((size_t)hd), acc((size_t)rows * hd, 0.0f);
  for (int d = 0; d < hd; ++d) qr[(size_t)d] = round_to_kv(q[d], bf16);
  float max_score = -INFINITY;
  for (int p = first; p <= pos; ++p) {
    const uint16_t* k = cache + layout.position_offset(block_table, layer, 0, kv_head, p);
    scores[p] = dot_qk(qr.data(), k, hd, bf16, order) * scale;
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
    const uint16_t* v = cache + layout.position_offset(block_table, layer, 1, kv_head, p);
    const float w = round_to_kv(scores[p] * inv, bf16);
    float* row = acc.data() + (size_t)(p % rows) * hd;
    for (int d = 0; d < hd; ++d) row[d] += w * kv_value(v + d, bf16);
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
  if (simd && layout.head_dim % 8 == 0) {
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

void attention_batch(const uint16_t* cache, const KvCacheLayout& layout, int layer,
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
      attend_head(cache, layout, layer, q.block_table, q.first, q.pos, h / group,
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
