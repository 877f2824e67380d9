// The decode-wiring test against the HOST twin of the CUDA decode step (same online-softmax
// code, same split / tile order). Builds and runs without nvcc or a GPU, so CI checks
// the algorithm; built a second time with HABLAR_ONLINE_SOFTMAX_BREAK_RESCALE, where it
// must fail (see CMakeLists.txt).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "backend/cuda/decode_attention_host.h"
#include "decode_split_case.h"
#include "decode_wiring_case.h"
#include "kv_q8_twins.h"

namespace hablar::test {
namespace {

class DecodeWiringHost : public ::testing::TestWithParam<KvDType> {};

void run_step(DecodeWiringCase& c, std::vector<uint8_t> active, std::vector<uint16_t>& cache,
              std::vector<int32_t>& lens, std::vector<float>& out) {
  cache = c.cache;
  lens = c.seq_lens;
  out = c.out;
  const auto p = c.params(cache.data(), c.block_tables.data(), lens.data(), active.data(),
                          c.q.data(), c.k_new.data(), c.v_new.data(), out.data());
  cuda::decode_attention_host(p);
}

TEST_P(DecodeWiringHost, ThreeLiveInEightSlots) {
  DecodeWiringCase c(GetParam());
  std::vector<uint16_t> cache;
  std::vector<int32_t> lens;
  std::vector<float> out;
  run_step(c, c.active, cache, lens, out);
  EXPECT_EQ(c.check(out, lens, cache, -1), "");
}

TEST_P(DecodeWiringHost, DoneSequenceIsNeitherAttendedNorAdvanced) {
  DecodeWiringCase c(GetParam());
  std::vector<uint8_t> active = c.active;
  const int done = c.live_slots[1];
  active[done] = 0;
  std::vector<uint16_t> cache;
  std::vector<int32_t> lens;
  std::vector<float> out;
  run_step(c, active, cache, lens, out);
  EXPECT_EQ(c.check(out, lens, cache, done), "");
}

TEST_P(DecodeWiringHost, SplitKLongContextMatchesOracle) {
  for (int dim : {64, 96, 128}) {
    DecodeSplitCase c(GetParam(), dim, 7u + (uint32_t)dim);
    std::vector<uint16_t> cache = c.cache;
    std::vector<int32_t> lens = c.lens;
    std::vector<float> out(c.q.size(), std::numeric_limits<float>::quiet_NaN());
    const auto p = c.params(cache.data(), c.tables.data(), lens.data(), c.active.data(), c.q.data(),
                            c.k_new.data(), c.v_new.data(), out.data());
    ASSERT_GT(cuda::decode_num_splits(p), 4) << "the case must span several splits";
    cuda::decode_attention_host(p);
    std::string fault;
    const double err = c.max_error(out, &fault);
    EXPECT_EQ(fault, "");
    EXPECT_LT(err, 2e-3) << "head_dim " << dim;
    for (int s = 0; s < c.slots; ++s) EXPECT_EQ(lens[s], c.lens[s] + (c.active[s] ? 1 : 0));
  }
}

// A sliding window of 300 (Gemma-style local layers): splits wholly before the window are
// skipped, the one it begins in starts mid-split; lengths 1500, 700, 63 and 1 cross it or not.
// With Gemma 2's soft-capped scores too (a cap of 2 bends most of these scores).
TEST_P(DecodeWiringHost, SlidingWindowMatchesOracle) {
  for (int dim : {64, 96, 128, 256}) {
    DecodeSplitCase c(GetParam(), dim, 11u + (uint32_t)dim);
    c.window = 300;
    c.softcap = dim == 128 ? 2.0f : 0.0f;
    std::vector<uint16_t> cache = c.cache;
    std::vector<int32_t> lens = c.lens;
    std::vector<float> out(c.q.size(), std::numeric_limits<float>::quiet_NaN());
    const auto p = c.params(cache.data(), c.tables.data(), lens.data(), c.active.data(), c.q.data(),
                            c.k_new.data(), c.v_new.data(), out.data());
    cuda::decode_attention_host(p);
    std::string fault;
    const double err = c.max_error(out, &fault);
    EXPECT_EQ(fault, "");
    EXPECT_LT(err, 2e-3) << "head_dim " << dim;
  }
}

// Q8_0 rows in the twin: the same step as over the F16 cache of the values it reads, the
// scatter writing the CPU backend's rows (kv_q8_twins.h; the GPU test runs the same scenario).
TEST(DecodeWiringHostQ8, Q8CacheEqualsF16CacheOfItsValues) {
  expect_q8_decode_equals_f16_of_its_values(
      [](const DecodeSplitCase& c, cuda::DecodeAttentionParams p, std::vector<uint16_t>& cache) {
        std::vector<float> out(p.out, p.out + c.q.size());
        p.kv_cache = cache.data();
        p.block_tables = c.tables.data();
        p.out = out.data();
        cuda::decode_attention_host(p);
        return out;
      });
}

INSTANTIATE_TEST_SUITE_P(KvTypes, DecodeWiringHost, ::testing::Values(KvDType::F16, KvDType::BF16),
                         [](const auto& info) {
                           return info.param == KvDType::F16 ? std::string("F16")
                                                             : std::string("BF16");
                         });

}  // namespace
}  // namespace hablar::test
