// Attention of query tokens over the paged F16 (or BF16) KV cache.
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

// One head: scores over positions [0, pos], softmax, weighted sum of V. `scores` has room
// for pos + 1 values.
void attend_head_scalar(const uint16_t* cache, const KvCacheLayout& layout, int layer,
                        const int32_t* block_table, int pos, int kv_head, const float* q,
                        float scale, float* scores, float* out) {
  const int hd = layout.head_dim;
  const bool bf16 = layout.dtype == KvDType::BF16;
  float max_score = -INFINITY;
  for (int p = 0; p <= pos; ++p) {
    const uint16_t* k = cache + layout.position_offset(block_table, layer, 0, kv_head, p);
    float dot = 0.0f;
    for (int d = 0; d < hd; ++d) dot += q[d] * kv_value(k + d, bf16);
    scores[p] = dot * scale;
    if (scores[p] > max_score) max_score = scores[p];
  }
  float sum = 0.0f;
  for (int p = 0; p <= pos; ++p) {
    scores[p] = std::exp(scores[p] - max_score);
    sum += scores[p];
  }
  const float inv = 1.0f / sum;
  for (int d = 0; d < hd; ++d) out[d] = 0.0f;
  for (int p = 0; p <= pos; ++p) {
    const uint16_t* v = cache + layout.position_offset(block_table, layer, 1, kv_head, p);
    const float w = scores[p] * inv;
    for (int d = 0; d < hd; ++d) out[d] += w * kv_value(v + d, bf16);
  }
}

// The AVX2 form when the CPU has it (the same one for every call, so results never depend
// on which path a query took).
void attend_head(const uint16_t* cache, const KvCacheLayout& layout, int layer,
                 const int32_t* block_table, int pos, int kv_head, const float* q, float scale,
                 float* scores, float* out) {
  static const bool simd = cpu_features().has_avx2_kernels();
  if (simd && layout.head_dim % 8 == 0) {
    avx2::attend_head(cache, layout, layer, block_table, pos, kv_head, q, scale, scores, out);
  } else {
    attend_head_scalar(cache, layout, layer, block_table, pos, kv_head, q, scale, scores, out);
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

void attention_one(const uint16_t* cache, const KvCacheLayout& layout, int layer,
                   const int32_t* block_table, int pos, const float* q, int n_heads, float* out) {
  check_attention(layout, layer, pos, n_heads);
  std::vector<float>& scores = score_scratch();
  if (scores.size() < (size_t)pos + 1) scores.resize((size_t)pos + 1);
  const int group = n_heads / layout.n_kv_heads;
  const float scale = 1.0f / std::sqrt((float)layout.head_dim);
  for (int h = 0; h < n_heads; ++h)
    attend_head(cache, layout, layer, block_table, pos, h / group, q + (int64_t)h * layout.head_dim,
                scale, scores.data(), out + (int64_t)h * layout.head_dim);
}

void attention_batch(const uint16_t* cache, const KvCacheLayout& layout, int layer,
                     std::span<const AttentionQuery> queries, int n_heads, ThreadPool& pool) {
  for (const AttentionQuery& q : queries) check_attention(layout, layer, q.pos, n_heads);
  const int64_t n_items = (int64_t)queries.size() * n_heads;
  const int group = n_heads / layout.n_kv_heads;
  const float scale = 1.0f / std::sqrt((float)layout.head_dim);
  pool.run([&](int thread, int n_threads) {
    std::vector<float>& scores = score_scratch();
    for (int64_t item = thread; item < n_items; item += n_threads) {
      const AttentionQuery& q = queries[(size_t)(item / n_heads)];
      const int h = (int)(item % n_heads);
      if (scores.size() < (size_t)q.pos + 1) scores.resize((size_t)q.pos + 1);
      attend_head(cache, layout, layer, q.block_table, q.pos, h / group,
                  q.q + (int64_t)h * layout.head_dim, scale, scores.data(),
                  q.out + (int64_t)h * layout.head_dim);
    }
  });
}

}  // namespace hablar::cpu
