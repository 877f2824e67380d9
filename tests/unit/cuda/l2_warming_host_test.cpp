// The L2 warming plan (l2_warming.h) on the host (g++ alone): the matrices recorded after
// each norm of model::forward, in the order the products read them, and the prefetch ranges
// a norm issues for a segment within a byte budget.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "backend/cuda/l2_warming.h"
#include "formats/synthetic_model.h"
#include "model/forward.h"
#include "model/model.h"
#include "support/test_support.h"

namespace hablar::cuda {
namespace {

std::unique_ptr<model::Model> tiny_model(synth::Arch arch, const std::string& dir) {
  synth::SyntheticModelOptions o;
  o.arch = arch;
  o.shape = *synth::shape_from_name("tiny");
  o.type = "q4_k_m";
  o.seed = 5;
  const std::string path = dir + "/" + std::to_string((int)arch) + ".gguf";
  synth::write_synthetic_model(o, path);
  return model::Model::load(path);
}

bool same(const WeightRange& r, const WeightView& w) {
  return r.data == w.data && r.bytes == (size_t)w.rows * w.row_bytes;
}

TEST(L2Warming, SegmentsFollowTheNormsInTheOrderOfTheProducts) {
  const std::string dir = test::make_temp_dir("l2-warming");
  for (const synth::Arch arch : {synth::Arch::kLlama, synth::Arch::kQwen2}) {
    auto m = tiny_model(arch, dir);
    std::vector<float> buffers(8);
    float* b = buffers.data();
    const Activations a{b, b + 1, b + 2, b + 3, b + 4, b + 5, b + 6, b + 7};
    WeightOrderRecorder recorder(a);
    model::forward(m->config(), m->weights(), recorder);
    ASSERT_TRUE(recorder.usable());
    const auto& s = recorder.segments();
    const int layers = m->config().n_layers;
    // Nothing before the first norm, two norms a layer, then the output head's segment.
    ASSERT_EQ((int)s.size(), 2 * layers + 2);
    EXPECT_TRUE(s[0].empty());
    for (int l = 0; l < layers; ++l) {
      const model::LayerWeights& lw = m->weights().layers[(size_t)l];
      const auto& attn = s[(size_t)(2 * l + 1)];
      const auto& ffn = s[(size_t)(2 * l + 2)];
      ASSERT_EQ(attn.size(), 4u) << "layer " << l;
      EXPECT_TRUE(same(attn[0], lw.wq) && same(attn[1], lw.wk) && same(attn[2], lw.wv) &&
                  same(attn[3], lw.wo));
      ASSERT_EQ(ffn.size(), 3u) << "layer " << l;
      EXPECT_TRUE(same(ffn[0], lw.w_gate) && same(ffn[1], lw.w_up) && same(ffn[2], lw.w_down));
    }
    ASSERT_EQ(s.back().size(), 1u);
    EXPECT_TRUE(same(s.back()[0], m->weights().output));
  }
}

TEST(L2Warming, ExpertsMakeTheOrderUnusable) {
  const std::string dir = test::make_temp_dir("l2-warming-moe");
  auto m = tiny_model(synth::Arch::kQwen3Moe, dir);
  std::vector<float> buffers(8);
  float* b = buffers.data();
  const Activations a{b, b + 1, b + 2, b + 3, b + 4, b + 5, b + 6, b + 7};
  WeightOrderRecorder recorder(a);
  model::forward(m->config(), m->weights(), recorder);
  EXPECT_FALSE(recorder.usable());
}

TEST(L2Warming, PrefetchTakesEachMatrixsLeadingShareOnSixteenByteBounds) {
  alignas(16) static char blob[1 << 20];
  // Two matrices of 64 KB and 192 KB, the first starting 8 bytes past a 16-byte bound.
  const std::vector<WeightRange> seg = {{blob + 8, 65536}, {blob + 131072, 196608}};
  const L2Prefetch all = l2_prefetch_for(seg, 1 << 20);
  ASSERT_EQ(all.n, 2);
  EXPECT_EQ(all.data[0], blob + 16);  // trimmed inward to the bounds
  EXPECT_EQ(all.bytes[0], 65536u - 16u);
  EXPECT_EQ(all.data[1], blob + 131072);
  EXPECT_EQ(all.bytes[1], 196608u);
  // A budget of a quarter of the 256 KB: a quarter of each.
  const L2Prefetch quarter = l2_prefetch_for(seg, 65536);
  ASSERT_EQ(quarter.n, 2);
  EXPECT_EQ(quarter.bytes[0], 16384u - 16u);
  EXPECT_EQ(quarter.bytes[1], 49152u);
  for (int i = 0; i < quarter.n; ++i) {
    EXPECT_EQ(reinterpret_cast<uintptr_t>(quarter.data[i]) % 16, 0u);
    EXPECT_EQ(quarter.bytes[i] % 16, 0u);
  }
  // Nothing to warm, or a budget too small to matter.
  EXPECT_EQ(l2_prefetch_for({}, 1 << 20).n, 0);
  EXPECT_EQ(l2_prefetch_for(seg, 1024).n, 0);
}

}  // namespace
}  // namespace hablar::cuda
