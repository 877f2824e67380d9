// Two caches that give the CUDA attention the same inputs: one of Q8_0 rows, and one of F16
// elements holding the values the kernels read from those rows (each code * d rounded to
// f16, core/kv_rows.h). The attention over the first must equal the attention over the
// second bit for bit, so the well-tested F16 kernels are the Q8_0 kernels' oracle. Shared by
// the GPU tests and the host twin's (no CUDA here).
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "core/fp16.h"
#include "core/kv_layout.h"
#include "core/kv_rows.h"
#include "decode_split_case.h"

namespace hablar::test {

struct KvQ8Twins {
  KvCacheLayout f16_layout, q8_layout;
  std::vector<uint16_t> f16, q8;

  // A head row of values at (layer, kv, block, kv head, slot) into both caches.
  void put_row(int layer, int kv, int block, int kvh, int slot, const float* values) {
    auto* row =
        reinterpret_cast<BlockQ8_0*>(q8.data() + q8_layout.offset(layer, kv, block, kvh, slot, 0));
    kv_q8_0_quantize_row(values, q8_layout.head_dim, row);
    uint16_t* twin = f16.data() + f16_layout.offset(layer, kv, block, kvh, slot, 0);
    for (int d = 0; d < q8_layout.head_dim; ++d)
      twin[d] = f32_to_fp16(kv_q8_0_value_as_f16(row[d / kQK], d % kQK));
  }
  // The same through a sequence's block table.
  void put_position(int layer, int kv, const int32_t* table, int kvh, int pos,
                    const float* values) {
    const int bs = q8_layout.block_size;
    put_row(layer, kv, table[pos / bs], kvh, pos % bs, values);
  }
};

// Twins of an F16 cache: every row quantized from the F16 row's values.
inline KvQ8Twins make_kv_q8_twins(const KvCacheLayout& f16_layout,
                                  const std::vector<uint16_t>& f16_cache) {
  KvQ8Twins t;
  t.f16_layout = f16_layout;
  t.q8_layout = f16_layout;
  t.q8_layout.dtype = KvDType::Q8_0;
  t.f16.assign(f16_layout.total_elems(), 0);
  t.q8.assign(t.q8_layout.total_elems(), 0);
  std::vector<float> row(f16_layout.head_dim);
  for (int layer = 0; layer < f16_layout.n_layers; ++layer)
    for (int kv = 0; kv < 2; ++kv)
      for (int b = 0; b < f16_layout.n_blocks; ++b)
        for (int h = 0; h < f16_layout.n_kv_heads; ++h)
          for (int s = 0; s < f16_layout.block_size; ++s) {
            const uint16_t* src = f16_cache.data() + f16_layout.offset(layer, kv, b, h, s, 0);
            for (int d = 0; d < f16_layout.head_dim; ++d) row[d] = fp16_to_f32(src[d]);
            t.put_row(layer, kv, b, h, s, row.data());
          }
  return t;
}

// Twins of a decode case's cache, with this step's K/V rows (k_new, v_new of each live slot)
// already at their positions when `with_step_rows`.
inline KvQ8Twins decode_case_twins(const DecodeSplitCase& c, bool with_step_rows) {
  KvQ8Twins t = make_kv_q8_twins(c.layout, c.cache);
  if (!with_step_rows) return t;
  for (int s = 0; s < c.slots; ++s) {
    if (!c.active[s]) continue;
    const int32_t* table = &c.tables[(size_t)s * c.blocks_per_seq];
    for (int h = 0; h < c.kv_heads; ++h) {
      const size_t row = ((size_t)s * c.kv_heads + h) * c.head_dim;
      t.put_position(1, 0, table, h, c.lens[s], &c.k_new[row]);
      t.put_position(1, 1, table, h, c.lens[s], &c.v_new[row]);
    }
  }
  return t;
}

// The decode step over Q8_0 rows against the F16 cache of their values, for every head size
// (both attention kernels) with and without soft-capped scores, over many splits:
// `run(case, params, cache)` runs the step with `params` over `cache` (host data, updated with
// what the step stored) and returns its output. The Q8_0 output must equal the F16 one bit for
// bit, with this step's rows stored beforehand (kv_stored) or by the scatter, which must write
// the rows core/kv_rows.h makes.
template <typename Run>
void expect_q8_decode_equals_f16_of_its_values(Run run) {
  for (int dim : {64, 96, 128, 256})
    for (float softcap : {0.0f, 2.0f}) {
      DecodeSplitCase c(KvDType::F16, dim, 17u + (uint32_t)dim);
      c.softcap = softcap;
      KvQ8Twins stored = decode_case_twins(c, true), bare = decode_case_twins(c, false);
      auto step = [&](const KvCacheLayout& layout, std::vector<uint16_t>& cache, bool kv_stored) {
        std::vector<int32_t> lens = c.lens;
        std::vector<float> out(c.q.size(), std::numeric_limits<float>::quiet_NaN());
        cuda::DecodeAttentionParams p =
            c.params(nullptr, nullptr, lens.data(), c.active.data(), c.q.data(), c.k_new.data(),
                     c.v_new.data(), out.data());
        p.layout = layout;
        p.kv_stored = kv_stored;
        return run(c, p, cache);
      };
      const std::vector<float> want = step(stored.f16_layout, stored.f16, true);
      const std::vector<float> got = step(stored.q8_layout, stored.q8, true);
      const std::vector<float> scattered = step(bare.q8_layout, bare.q8, false);
      ASSERT_EQ(got.size(), want.size());
      ASSERT_EQ(scattered.size(), want.size());
      EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size() * sizeof(float)), 0)
          << "head_dim " << dim << " softcap " << softcap;
      EXPECT_EQ(std::memcmp(scattered.data(), want.data(), want.size() * sizeof(float)), 0)
          << "head_dim " << dim << " softcap " << softcap << " (rows stored by the scatter)";
      EXPECT_TRUE(bare.q8 == stored.q8) << "the scatter's Q8_0 rows, head_dim " << dim;
    }
}

}  // namespace hablar::test
