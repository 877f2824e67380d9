// The integer q·k of a quantized K cache (backend/cpu/attention_int.h): the scalar definition
// against hand-computed values and a float reference; the AVX2 (one key) and AVX-512 (16 keys,
// VNNI) forms against the scalar one bit for bit, over random and extreme blocks of Q8_0 and
// Q4_0 rows at head_dim 32 to 512.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "backend/cpu/act_quant.h"
#include "backend/cpu/attention_int.h"
#include "backend/cpu/ops.h"
#include "core/cpu_features.h"
#include "core/fp16.h"
#include "core/quant_blocks.h"

namespace hablar::cpu {
namespace {

// A quantized q (QkQuantRow) with its storage.
struct QRow {
  std::vector<uint32_t> words;
  QkQuantRow row;
  QRow(const std::vector<float>& q, KvDType k_type) : words(qk_quant_row_words((int)q.size())) {
    row = qk_quant_row(words.data(), (int)q.size());
    quantize_q_for_k(q.data(), (int)q.size(), k_type, row);
  }
};

// The kinds of K rows: random codes and scales, and the extremes (codes all +-127 or the
// Q4_0 ends 0 and 15, zero scales, large scales).
enum class Fill { kRandom, kExtreme, kZeroScale, kLargeScale };

std::vector<uint16_t> k_row(KvDType t, int hd, Fill fill, std::mt19937& rng) {
  const int nb = hd / kQK;
  std::vector<uint16_t> row((size_t)kv_row_units(t, hd));
  std::uniform_int_distribution<int> code8(-127, 127), code4(0, 15), bit(0, 1);
  std::uniform_real_distribution<float> scale(1e-4f, 0.05f);
  for (int b = 0; b < nb; ++b) {
    float d = scale(rng);
    if (fill == Fill::kZeroScale) d = 0.0f;
    if (fill == Fill::kLargeScale) d = 300.0f;
    const auto pick8 = [&] {
      return fill == Fill::kExtreme ? (bit(rng) ? 127 : -127) : code8(rng);
    };
    const auto pick4 = [&] { return fill == Fill::kExtreme ? (bit(rng) ? 15 : 0) : code4(rng); };
    if (t == KvDType::Q8_0) {
      auto& blk = reinterpret_cast<BlockQ8_0*>(row.data())[b];
      blk.d = f32_to_fp16(d);
      for (int8_t& c : blk.qs) c = (int8_t)pick8();
    } else {
      auto& blk = reinterpret_cast<BlockQ4_0*>(row.data())[b];
      blk.d = f32_to_fp16(d);
      for (uint8_t& c : blk.qs) c = (uint8_t)(pick4() | pick4() << 4);
    }
  }
  return row;
}

std::vector<float> random_q(int hd, std::mt19937& rng, float sd = 1.0f) {
  std::normal_distribution<float> dist(0.0f, sd);
  std::vector<float> q((size_t)hd);
  for (float& x : q) x = dist(rng);
  return q;
}

bool same_bits(float a, float b) {
  return std::memcmp(&a, &b, sizeof(float)) == 0;
}

TEST(IntegerQk, QuantizedQIsTheActivationQuantizersRow) {
  // q's codes and scales are those of the matmuls' Q8_0 activation rows (llama.cpp's x86
  // quantize_row_q8_0); the correction is -128 (Q8_0) or -8 (Q4_0) times each 4 codes' sum.
  std::mt19937 rng(1);
  const int hd = 128;
  const std::vector<float> q = random_q(hd, rng, 3.0f);
  std::vector<uint8_t> act(act_row_bytes(ActKind::kAct32, hd));
  quantize_act32_scalar(q.data(), hd, act.data());
  const Act32Row a = act32_row(act.data(), hd);
  for (KvDType t : {KvDType::Q8_0, KvDType::Q4_0}) {
    const QRow r(q, t);
    EXPECT_EQ(0, std::memcmp(r.row.qs, a.qs, hd));
    for (int b = 0; b < hd / kQK; ++b) EXPECT_TRUE(same_bits(r.row.d[b], a.d[b])) << b;
    for (int w = 0; w < hd / 4; ++w) {
      const int sum = a.qs[4 * w] + a.qs[4 * w + 1] + a.qs[4 * w + 2] + a.qs[4 * w + 3];
      EXPECT_EQ(r.row.corr[w], (t == KvDType::Q8_0 ? -128 : -8) * sum) << w;
    }
  }
}

TEST(IntegerQk, ScalarFormByHand) {
  // One Q8_0 block of codes 1..32 at scale 0.5 against q = 127 everywhere (its codes 127 at
  // scale 1): lane j holds 127 * (4j+1 + .. + 4j+4) * 0.5, and the lanes' sum is
  // 127 * 528 * 0.5 = 33528 (every step exact).
  std::vector<uint16_t> row((size_t)kv_row_units(KvDType::Q8_0, 32));
  auto& blk = *reinterpret_cast<BlockQ8_0*>(row.data());
  blk.d = f32_to_fp16(0.5f);
  for (int i = 0; i < 32; ++i) blk.qs[i] = (int8_t)(i + 1);
  const QRow q(std::vector<float>(32, 127.0f), KvDType::Q8_0);
  ASSERT_EQ(q.row.d[0], 1.0f);
  EXPECT_EQ(dot_qk_int_scalar(row.data(), KvDType::Q8_0, q.row, 32), 33528.0f);
  // Q4_0: nibbles 15 everywhere (code 7) at scale 2, q = -1 everywhere (codes -127 at 1/127):
  // 32 * 7 * -127 * (2 * fp16(1/127)).
  std::vector<uint16_t> row4((size_t)kv_row_units(KvDType::Q4_0, 32));
  auto& b4 = *reinterpret_cast<BlockQ4_0*>(row4.data());
  b4.d = f32_to_fp16(2.0f);
  std::memset(b4.qs, 0xff, sizeof(b4.qs));
  const QRow qm(std::vector<float>(32, -1.0f), KvDType::Q4_0);
  const float dd = 2.0f * qm.row.d[0];
  EXPECT_EQ(dot_qk_int_scalar(row4.data(), KvDType::Q4_0, qm.row, 32),
            8.0f * (dd * (4 * 7 * -127)));
}

TEST(IntegerQk, ScalarFormIsTheDotOfTheDequantizedRows) {
  // Against the dot of the dequantized K and q in double: only float rounding apart.
  std::mt19937 rng(2);
  for (KvDType t : {KvDType::Q8_0, KvDType::Q4_0})
    for (int hd : {32, 64, 128, 256}) {
      const std::vector<uint16_t> k = k_row(t, hd, Fill::kRandom, rng);
      const QRow q(random_q(hd, rng), t);
      std::vector<float> kf((size_t)hd);
      kv_row_to_f32(k.data(), t, hd, kf.data());
      double want = 0.0, mag = 0.0;
      for (int i = 0; i < hd; ++i) {
        const double qi = (double)q.row.qs[i] * q.row.d[i / kQK];
        want += qi * kf[(size_t)i];
        mag += std::fabs(qi * kf[(size_t)i]);
      }
      EXPECT_NEAR(dot_qk_int_scalar(k.data(), t, q.row, hd), want, 1e-6 * mag + 1e-30)
          << kv_dtype_name(t) << " hd " << hd;
    }
}

class IntegerQkSimd : public ::testing::TestWithParam<KvDType> {};

TEST_P(IntegerQkSimd, AvxTwoAndAvx512FormsGiveTheScalarBits) {
  const KvDType t = GetParam();
  const bool avx2 = cpu_features().has_avx2_kernels();
  const bool avx512 = cpu_features().has_avx512_kernels();
  if (!avx2) GTEST_SKIP() << "no AVX2";
  std::mt19937 rng(7);
  int checked = 0;
  for (int hd : {32, 64, 96, 128, 160, 256, 512})
    for (Fill fill : {Fill::kRandom, Fill::kExtreme, Fill::kZeroScale, Fill::kLargeScale})
      for (int rep = 0; rep < 3; ++rep) {
        SCOPED_TRACE("hd " + std::to_string(hd) + " fill " + std::to_string((int)fill));
        // q: random, extreme (every block's max at the first value), or all zero.
        std::vector<float> qf = random_q(hd, rng, rep == 1 ? 50.0f : 1.0f);
        if (rep == 2 && fill == Fill::kExtreme) std::fill(qf.begin(), qf.end(), 0.0f);
        const QRow q(qf, t);
        std::vector<std::vector<uint16_t>> rows;
        std::vector<const uint16_t*> ptrs;
        for (int j = 0; j < 16; ++j) rows.push_back(k_row(t, hd, fill, rng));
        for (const auto& r : rows) ptrs.push_back(r.data());
        float wide[16];
        if (avx512) avx512::dot_qk_int16(ptrs.data(), t, q.row, hd, wide);
        for (int j = 0; j < 16; ++j) {
          const float want = dot_qk_int_scalar(ptrs[(size_t)j], t, q.row, hd);
          const float got2 = avx2::dot_qk_int(ptrs[(size_t)j], t, q.row, hd);
          ASSERT_TRUE(same_bits(want, got2)) << "AVX2 key " << j << ": " << got2 << " vs " << want;
          if (avx512) {
            ASSERT_TRUE(same_bits(want, wide[j]))
                << "AVX-512 key " << j << ": " << wide[j] << " vs " << want;
          }
          ++checked;
        }
      }
  EXPECT_EQ(checked, 7 * 4 * 3 * 16);
}

INSTANTIATE_TEST_SUITE_P(KTypes, IntegerQkSimd, ::testing::Values(KvDType::Q8_0, KvDType::Q4_0),
                         [](const auto& info) { return std::string(kv_dtype_name(info.param)); });

}  // namespace
}  // namespace hablar::cpu
