// The decode-wiring scenario shared by the GPU test and its host twin (no CUDA here).
//
// One layer, 12 query heads over 2 KV heads (GQA 6:1), head_dim 128, block-table capacity
// 2048 positions. Three live sequences sit in slots 1, 4 and 6 of 8, so every per-slot
// array is padded beyond the live count; their prior lengths are 17, 11 and 5. K at
// position p grows strictly with p (and the queries are positive), so the newest position
// dominates each softmax; V differs per slot, KV head, position and dimension. Padding
// slots and unused block-table entries point at "decoy" blocks full of huge keys: any read
// of them would dominate a softmax and show.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "backend/cuda/decode_attention_params.h"
#include "core/fp16.h"

namespace hablar::test {

struct DecodeWiringCase {
  static constexpr int kHeads = 12, kKvHeads = 2, kHeadDim = 128, kSlots = 8;
  static constexpr int kMaxLen = 2048, kBlockSize = 16, kBlocksPerSeq = kMaxLen / kBlockSize;
  static constexpr int kPoolBlocks = 40, kDecoyA = 30, kDecoyB = 31;
  static constexpr float kPoison = 12345.0f;

  KvDType dtype;
  KvCacheLayout layout;
  std::vector<int> live_slots = {1, 4, 6};
  std::vector<int> prior = {17, 11, 5};
  std::vector<std::vector<int>> blocks = {{23, 5}, {17}, {9}};  // physical blocks per live seq

  std::vector<uint16_t> cache;         // initial cache
  std::vector<int32_t> block_tables;   // [kSlots][kBlocksPerSeq]
  std::vector<int32_t> seq_lens;       // [kSlots]
  std::vector<uint8_t> active;         // [kSlots]
  std::vector<float> q, k_new, v_new;  // per slot
  std::vector<float> out;              // poisoned

  explicit DecodeWiringCase(KvDType type) : dtype(type) {
    layout.n_layers = 1;
    layout.n_kv_heads = kKvHeads;
    layout.head_dim = kHeadDim;
    layout.block_size = kBlockSize;
    layout.n_blocks = kPoolBlocks;
    layout.dtype = type;
    build();
  }

  // Values the test places; rounded to the cache's element type where they are stored.
  static float key(int pos, int kvh, int d) {
    return 0.08f * (float)pos + 0.01f * (float)((d * 7 + kvh * 3) % 5);
  }
  static float value(int slot, int pos, int kvh, int d) {
    return std::sin(0.1f * (float)d + 0.7f * (float)pos + 1.3f * (float)kvh + 2.1f * (float)slot);
  }
  static float query(int slot, int head, int d) {
    return 0.5f + 0.5f * (float)((slot * 131 + head * 17 + d * 29) % 97) / 97.0f;
  }
  float stored(float x) const {
    return dtype == KvDType::F16 ? fp16_to_f32(f32_to_fp16(x)) : bf16_to_f32(f32_to_bf16(x));
  }
  uint16_t encode(float x) const { return dtype == KvDType::F16 ? f32_to_fp16(x) : f32_to_bf16(x); }

  void build() {
    cache.assign(layout.total_elems(), encode(0.0f));
    for (int b : {kDecoyA, kDecoyB})
      for (int kvh = 0; kvh < kKvHeads; ++kvh)
        for (int s = 0; s < kBlockSize; ++s)
          for (int d = 0; d < kHeadDim; ++d) {
            cache[layout.offset(0, 0, b, kvh, s, d)] = encode(60.0f);
            cache[layout.offset(0, 1, b, kvh, s, d)] = encode(-50.0f);
          }
    block_tables.assign(kSlots * kBlocksPerSeq, kDecoyA);
    seq_lens.assign(kSlots, 999);  // padding: garbage that must never be used
    active.assign(kSlots, 0);
    for (int slot = 0; slot < kSlots; ++slot)
      for (int i = 0; i < kBlocksPerSeq; ++i)
        block_tables[slot * kBlocksPerSeq + i] = (i % 2) ? kDecoyA : kDecoyB;
    for (size_t i = 0; i < live_slots.size(); ++i) {
      const int slot = live_slots[i];
      active[slot] = 1;
      seq_lens[slot] = prior[i];
      for (size_t b = 0; b < blocks[i].size(); ++b)
        block_tables[slot * kBlocksPerSeq + b] = blocks[i][b];
      const int32_t* table = &block_tables[slot * kBlocksPerSeq];
      for (int pos = 0; pos < prior[i]; ++pos)
        for (int kvh = 0; kvh < kKvHeads; ++kvh)
          for (int d = 0; d < kHeadDim; ++d) {
            cache[layout.position_offset(table, 0, 0, kvh, pos) + d] = encode(key(pos, kvh, d));
            cache[layout.position_offset(table, 0, 1, kvh, pos) + d] =
                encode(value(slot, pos, kvh, d));
          }
    }
    q.assign(kSlots * kHeads * kHeadDim, 0.0f);
    k_new.assign(kSlots * kKvHeads * kHeadDim, 0.0f);
    v_new.assign(kSlots * kKvHeads * kHeadDim, 0.0f);
    for (int slot = 0; slot < kSlots; ++slot) {
      const int pos = slot_index(slot) >= 0 ? prior[slot_index(slot)] : 0;
      for (int h = 0; h < kHeads; ++h)
        for (int d = 0; d < kHeadDim; ++d)
          q[(slot * kHeads + h) * kHeadDim + d] = query(slot, h, d);
      for (int kvh = 0; kvh < kKvHeads; ++kvh)
        for (int d = 0; d < kHeadDim; ++d) {
          k_new[(slot * kKvHeads + kvh) * kHeadDim + d] = key(pos, kvh, d);
          v_new[(slot * kKvHeads + kvh) * kHeadDim + d] = value(slot, pos, kvh, d);
        }
    }
    out.assign(kSlots * kHeads * kHeadDim, kPoison);
  }

  int slot_index(int slot) const {
    for (size_t i = 0; i < live_slots.size(); ++i)
      if (live_slots[i] == slot) return (int)i;
    return -1;
  }

  // Parameters over the given (host or device) buffers.
  cuda::DecodeAttentionParams params(void* kv, const int32_t* tables, int32_t* lens,
                                     const uint8_t* act, const float* qp, const float* kp,
                                     const float* vp, float* outp) const {
    cuda::DecodeAttentionParams p;
    p.layout = layout;
    p.kv_cache = kv;
    p.n_slots = kSlots;
    p.block_tables = tables;
    p.max_blocks_per_seq = kBlocksPerSeq;
    p.seq_lens = lens;
    p.active = act;
    p.n_heads = kHeads;
    p.q = qp;
    p.k_new = kp;
    p.v_new = vp;
    p.out = outp;
    p.scale = 1.0f / std::sqrt((float)kHeadDim);
    return p;
  }

  // CPU softmax oracle over the K/V this test placed (prior positions plus the new one),
  // in double, for one live slot and head.
  std::vector<double> oracle(int slot, int head) const {
    const int n = prior[slot_index(slot)] + 1;
    const int kvh = head / (kHeads / kKvHeads);
    const double scale = 1.0 / std::sqrt((double)kHeadDim);
    std::vector<double> scores(n);
    double max_score = -1e300;
    for (int pos = 0; pos < n; ++pos) {
      double s = 0;
      for (int d = 0; d < kHeadDim; ++d)
        s += (double)query(slot, head, d) * stored(key(pos, kvh, d));
      scores[pos] = s * scale;
      max_score = std::max(max_score, scores[pos]);
    }
    double total = 0;
    for (double& s : scores) total += (s = std::exp(s - max_score));
    std::vector<double> result(kHeadDim, 0.0);
    for (int pos = 0; pos < n; ++pos)
      for (int d = 0; d < kHeadDim; ++d)
        result[d] += scores[pos] / total * stored(value(slot, pos, kvh, d));
    return result;
  }

  // Returns "" when the step's results are right, else the first fault found. `done` is a
  // live slot marked finished before the call (-1 for none).
  std::string check(const std::vector<float>& got_out, const std::vector<int32_t>& got_lens,
                    const std::vector<uint16_t>& got_cache, int done) const {
    std::vector<uint16_t> want_cache = cache;
    for (int slot = 0; slot < kSlots; ++slot) {
      const int idx = slot_index(slot);
      const bool attended = idx >= 0 && slot != done;
      const int want_len = attended ? prior[idx] + 1 : seq_lens[slot];
      if (got_lens[slot] != want_len)
        return "slot " + std::to_string(slot) + ": length " + std::to_string(got_lens[slot]) +
               ", want " + std::to_string(want_len);
      for (int h = 0; h < kHeads; ++h) {
        const std::vector<double> want = attended ? oracle(slot, h) : std::vector<double>();
        for (int d = 0; d < kHeadDim; ++d) {
          const float got = got_out[(slot * kHeads + h) * kHeadDim + d];
          if (!attended) {
            if (got != kPoison)
              return "slot " + std::to_string(slot) + " is not live but its output was written";
            continue;
          }
          const double tol = 2e-3 * std::max(1.0, std::fabs(want[d]));
          if (!(std::fabs(got - want[d]) <= tol))
            return "slot " + std::to_string(slot) + " head " + std::to_string(h) + " dim " +
                   std::to_string(d) + ": got " + std::to_string(got) + ", oracle " +
                   std::to_string(want[d]);
        }
      }
      if (attended) {
        const int32_t* table = &block_tables[slot * kBlocksPerSeq];
        for (int kvh = 0; kvh < kKvHeads; ++kvh)
          for (int d = 0; d < kHeadDim; ++d) {
            want_cache[layout.position_offset(table, 0, 0, kvh, prior[idx]) + d] =
                encode(key(prior[idx], kvh, d));
            want_cache[layout.position_offset(table, 0, 1, kvh, prior[idx]) + d] =
                encode(value(slot, prior[idx], kvh, d));
          }
      }
    }
    for (size_t i = 0; i < want_cache.size(); ++i)
      if (got_cache[i] != want_cache[i])
        return "cache element " + std::to_string(i) + " differs from the expected scatter";
    return "";
  }
};

}  // namespace hablar::test
