// RopeAngleCache: every position's angles bit for bit rope_angles', in any order of asking,
// across pages, for each kind of RoPE scaling; pointers handed out stay valid while later
// pages are added.
#include "core/rope_angle_cache.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <vector>

#include "core/error.h"

namespace hablar {
namespace {

std::vector<RopeParams> variants() {
  RopeParams plain;
  plain.n_dims = 128, plain.freq_base = 1000000.0f;
  RopeParams neox = plain;
  neox.neox = true, neox.n_dims = 64, neox.freq_base = 10000.0f;
  RopeParams llama3 = plain;
  llama3.scaling = RopeParams::Scaling::kLlama3, llama3.factor = 8.0f;
  llama3.freq_base = 500000.0f;
  RopeParams yarn = plain;
  yarn.scaling = RopeParams::Scaling::kYarn, yarn.factor = 4.0f, yarn.original_context = 4096;
  RopeParams longrope = plain;
  longrope.n_dims = 96, longrope.attn_factor = 1.19f;
  for (int i = 0; i < 48; ++i) longrope.freq_factors.push_back(1.0f + 0.37f * (float)i);
  return {plain, neox, llama3, yarn, longrope};
}

TEST(RopeAngleCache, EveryPositionIsRopeAnglesBitForBit) {
  std::mt19937 rng(11);
  for (const RopeParams& p : variants()) {
    RopeAngleCache cache(p);
    ASSERT_EQ(cache.pairs(), p.n_dims / 2);
    // Page edges, a far page first, repeats, and random positions in random order.
    std::vector<int> positions = {0, 1, 1023, 1024, 1025, 40000, 2047, 2048, 0, 40000};
    for (int i = 0; i < 300; ++i) positions.push_back((int)(rng() % 70000));
    std::shuffle(positions.begin() + 10, positions.end(), rng);
    std::vector<const float*> first_cos;
    std::vector<float> want_cos((size_t)cache.pairs()), want_sin((size_t)cache.pairs());
    for (int pos : positions) {
      const float *c = nullptr, *s = nullptr;
      cache.angles(pos, &c, &s);
      rope_angles(pos, p, want_cos.data(), want_sin.data());
      ASSERT_EQ(std::memcmp(c, want_cos.data(), want_cos.size() * 4), 0) << "pos " << pos;
      ASSERT_EQ(std::memcmp(s, want_sin.data(), want_sin.size() * 4), 0) << "pos " << pos;
      if (pos == 1023) first_cos.push_back(c);
    }
    // The pointer for 1023, taken before the far pages existed, still reads its angles.
    rope_angles(1023, p, want_cos.data(), want_sin.data());
    ASSERT_FALSE(first_cos.empty());
    EXPECT_EQ(std::memcmp(first_cos[0], want_cos.data(), want_cos.size() * 4), 0);
  }
}

TEST(RopeAngleCache, RefusesWhatRopeAnglesRefuses) {
  RopeParams odd;
  odd.n_dims = 7;
  EXPECT_THROW(RopeAngleCache{odd}, Error);
  RopeParams zero_factor;
  zero_factor.n_dims = 64, zero_factor.scaling = RopeParams::Scaling::kLinear;
  zero_factor.factor = 0.0f;
  EXPECT_THROW(RopeAngleCache{zero_factor}, Error);
  RopeParams ok;
  ok.n_dims = 64;
  RopeAngleCache cache(ok);
  const float *c = nullptr, *s = nullptr;
  EXPECT_THROW(cache.angles(-1, &c, &s), Error);
}

}  // namespace
}  // namespace hablar
