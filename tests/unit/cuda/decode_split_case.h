// A long-context decode case that exercises split-K ("flash decoding") and the reduce:
// random K/V in the cache, unequal lengths up to 1,500 positions (many splits), GQA 4:1,
// two padding slots. Shared by the GPU test and the host twin (no CUDA here).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/decode_attention_params.h"
#include "core/fp16.h"

namespace hablar::test {

struct DecodeSplitCase {
  int heads = 8, kv_heads = 2, head_dim = 64, slots = 6, block_size = 16;
  int blocks_per_seq = 96;  // capacity 1,536 positions
  int window = 0;           // > 0: a sliding window (the query sees its last `window` positions)
  int fixed_split_len = 0;  // > 0: splits of this length (many splits: the reduce in runs)
  float softcap = 0.0f;     // > 0: scores soft-capped (cap * tanh(score / cap))
  std::vector<int32_t> lens = {1500, 0, 700, 63, 0, 1};
  std::vector<uint8_t> active = {1, 0, 1, 1, 0, 1};
  KvCacheLayout layout;
  std::vector<uint16_t> cache;
  std::vector<int32_t> tables;
  std::vector<float> q, k_new, v_new;

  DecodeSplitCase(KvDType dtype, int dim, uint32_t seed, int blocks = 96)
      : head_dim(dim), blocks_per_seq(blocks) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
    layout.n_layers = 2;
    layout.n_kv_heads = kv_heads;
    layout.head_dim = head_dim;
    layout.block_size = block_size;
    layout.n_blocks = slots * blocks_per_seq;
    layout.dtype = dtype;
    cache.resize(layout.total_elems());
    for (auto& e : cache) e = encode(uni(rng) * 2.0f);
    // Each slot gets a shuffled set of physical blocks.
    std::vector<int32_t> ids(layout.n_blocks);
    for (int i = 0; i < layout.n_blocks; ++i) ids[i] = i;
    std::shuffle(ids.begin(), ids.end(), rng);
    tables = ids;
    q.resize((size_t)slots * heads * head_dim);
    for (auto& x : q) x = uni(rng);
    k_new.resize((size_t)slots * kv_heads * head_dim);
    v_new.resize(k_new.size());
    for (auto& x : k_new) x = uni(rng) * 2.0f;
    for (auto& x : v_new) x = uni(rng) * 2.0f;
  }

  uint16_t encode(float x) const {
    return layout.dtype == KvDType::F16 ? f32_to_fp16(x) : f32_to_bf16(x);
  }
  float decode(uint16_t b) const {
    return layout.dtype == KvDType::F16 ? fp16_to_f32(b) : bf16_to_f32(b);
  }

  cuda::DecodeAttentionParams params(void* kv, const int32_t* tbl, int32_t* ln, const uint8_t* act,
                                     const float* qp, const float* kp, const float* vp,
                                     float* outp) const {
    cuda::DecodeAttentionParams p;
    p.layout = layout;
    p.layer = 1;
    p.kv_cache = kv;
    p.n_slots = slots;
    p.block_tables = tbl;
    p.max_blocks_per_seq = blocks_per_seq;
    p.seq_lens = ln;
    p.active = act;
    p.n_heads = heads;
    p.q = qp;
    p.k_new = kp;
    p.v_new = vp;
    p.out = outp;
    p.scale = 1.0f / std::sqrt((float)head_dim);
    p.window = window;
    p.softcap = softcap;
    p.fixed_split_len = fixed_split_len;
    return p;
  }

  // Double-precision softmax over the slot's cached positions plus the new token (taken
  // from k_new / v_new, rounded to the cache type), read through the block table.
  std::vector<double> oracle(int slot, int head) const {
    const int kvh = head / (heads / kv_heads);
    const int32_t* table = &tables[(size_t)slot * blocks_per_seq];
    const int n = lens[slot] + 1;
    const int first = window > 0 && n > window ? n - window : 0;
    std::vector<double> scores(n, -INFINITY);
    auto at = [&](int kv, int pos, int d) -> double {
      if (pos == lens[slot]) {
        const auto& src = kv == 0 ? k_new : v_new;
        return decode(encode(src[((size_t)slot * kv_heads + kvh) * head_dim + d]));
      }
      return decode(cache[layout.position_offset(table, 1, kv, kvh, pos) + d]);
    };
    double mx = -1e300;
    for (int pos = first; pos < n; ++pos) {
      double s = 0;
      for (int d = 0; d < head_dim; ++d)
        s += (double)q[((size_t)slot * heads + head) * head_dim + d] * at(0, pos, d);
      scores[pos] = s / std::sqrt((double)head_dim);
      if (softcap > 0) scores[pos] = softcap * std::tanh(scores[pos] / softcap);
      mx = std::max(mx, scores[pos]);
    }
    double total = 0;
    for (double& s : scores) total += (s = std::exp(s - mx));
    std::vector<double> out(head_dim, 0.0);
    for (int pos = first; pos < n; ++pos)
      for (int d = 0; d < head_dim; ++d) out[d] += scores[pos] / total * at(1, pos, d);
    return out;
  }

  // Max of |got - want| / max(1, |want|) over live slots; inactive outputs must stay NaN.
  double max_error(const std::vector<float>& out, std::string* fault) const {
    double worst = 0;
    for (int s = 0; s < slots; ++s)
      for (int h = 0; h < heads; ++h) {
        const std::vector<double> want = active[s] ? oracle(s, h) : std::vector<double>();
        for (int d = 0; d < head_dim; ++d) {
          const float got = out[((size_t)s * heads + h) * head_dim + d];
          if (!active[s]) {
            if (!std::isnan(got)) *fault = "inactive slot " + std::to_string(s) + " written";
            continue;
          }
          const double err = std::fabs(got - want[d]) / std::max(1.0, std::fabs(want[d]));
          worst = std::isnan(err) ? 1e30 : std::max(worst, err);
        }
      }
    return worst;
  }
};

}  // namespace hablar::test
