// The persistent decode step's phase list as persistent_step_plan.h records it from
// model::forward, on the host (g++ alone): five phases a layer and the logits, the residual
// stream alternating between the model's x and the spare buffer, biases and RoPE gathered
// into the attention phase, and the forwards it must refuse (with their reason).
#include <gtest/gtest.h>

#include <string>

#include "backend/cuda/persistent_step_plan.h"
#include "formats/synthetic_model.h"
#include "model/forward.h"
#include "model/model.h"
#include "support/test_support.h"

namespace hablar::cuda {
namespace {

// Takes Q4_K and Q6_K matrices (the gated pair Q4_K only), as the device rule does.
bool any_k_quant(const WeightView& w, int matrices, PersistentMatrix* out) {
  if (w.type != DType::Q4_K && !(w.type == DType::Q6_K && matrices == 1)) return false;
  out->data = w.data, out->rows = (int32_t)w.rows, out->cols = (int32_t)w.cols;
  out->type = w.type == DType::Q4_K ? PersistentMatrixType::kQ4K : PersistentMatrixType::kQ6K;
  return true;
}

struct Recorded {
  std::unique_ptr<model::Model> model;
  Activations a;
  std::vector<float> buffers;
  float spare = 0, logits = 0;
  std::unique_ptr<PersistentStepPlan> plan;
};

std::unique_ptr<Recorded> record(synth::Arch arch, const std::string& type,
                                 const std::string& dir) {
  synth::SyntheticModelOptions o;
  o.arch = arch;
  o.shape = *synth::shape_from_name("tiny");
  o.type = type;
  o.seed = 3;
  const std::string path = dir + "/" + std::to_string((int)arch) + type + ".gguf";
  synth::write_synthetic_model(o, path);
  auto r = std::make_unique<Recorded>();
  r->model = model::Model::load(path);
  r->buffers.resize(8);  // distinct addresses stand for the step buffers
  float* b = r->buffers.data();
  r->a = {b, b + 1, b + 2, b + 3, b + 4, b + 5, b + 6, b + 7};
  const model::ModelConfig& c = r->model->config();
  PersistentStepContext ctx;
  ctx.n_embd = c.n_embd, ctx.n_heads = c.n_heads, ctx.n_kv_heads = c.n_kv_heads;
  ctx.head_dim = c.head_dim, ctx.n_rope_variants = 1;
  r->plan = std::make_unique<PersistentStepPlan>(r->a, ctx, &r->spare, &r->logits, any_k_quant);
  model::forward(c, r->model->weights(), *r->plan);
  return r;
}

TEST(PersistentStepPlan, RecordsFivePhasesALayerWithTheResidualAlternating) {
  const std::string dir = test::make_temp_dir("persistent-plan");
  for (const synth::Arch arch : {synth::Arch::kLlama, synth::Arch::kQwen2}) {
    auto r = record(arch, "q4_k_m", dir);
    ASSERT_TRUE(r->plan->supported()) << r->plan->reason();
    const auto& p = r->plan->phases();
    const int layers = r->model->config().n_layers;
    ASSERT_EQ((int)p.size(), 5 * layers + 1);
    const float* residual = r->a.x;
    for (int l = 0; l < layers; ++l) {
      const PersistentPhase* ph = &p[(size_t)(5 * l)];
      EXPECT_EQ(ph[0].kind, PersistentPhaseKind::kNormProducts);
      EXPECT_EQ(ph[0].n_matrices, 3);
      EXPECT_EQ(ph[0].x, residual);
      if (l > 0) {  // the down product's rows join the residual in this norm
        EXPECT_EQ(ph[0].add, r->a.xb);
        EXPECT_NE(ph[0].x_out, residual);
        residual = ph[0].x_out;
      }
      EXPECT_EQ(ph[1].kind, PersistentPhaseKind::kAttention);
      EXPECT_EQ(ph[1].layer, l);
      EXPECT_EQ(ph[1].rope_variant, 0);
      EXPECT_EQ(ph[1].bq != nullptr, arch == synth::Arch::kQwen2);
      EXPECT_EQ(ph[2].kind, PersistentPhaseKind::kProduct);
      EXPECT_EQ(ph[2].input, PersistentInput::kAttentionCodes);
      EXPECT_EQ(ph[3].kind, PersistentPhaseKind::kNormProducts);
      EXPECT_TRUE(ph[3].glu);
      EXPECT_EQ(ph[3].x, residual);
      EXPECT_EQ(ph[3].add, r->a.xb);
      EXPECT_TRUE(ph[3].x_out == r->a.x || ph[3].x_out == &r->spare);
      EXPECT_NE(ph[3].x_out, residual);
      residual = ph[3].x_out;
      EXPECT_EQ(ph[4].kind, PersistentPhaseKind::kProduct);
      EXPECT_EQ(ph[4].input, PersistentInput::kF32);
      EXPECT_EQ(ph[4].in, r->a.gate);
    }
    EXPECT_EQ(p.back().matrices[0].out, &r->logits);
    EXPECT_EQ(p.back().x, residual);
  }
}

TEST(PersistentStepPlan, RefusesWhatItCannotRunAndSaysWhy) {
  const std::string dir = test::make_temp_dir("persistent-plan-refusals");
  const std::pair<synth::Arch, const char*> cases[] = {{synth::Arch::kQwen3, "per-head norms"},
                                                       {synth::Arch::kGemma3, "scale"},
                                                       {synth::Arch::kMixtral, "mixture"}};
  for (const auto& [arch, why] : cases) {
    auto r = record(arch, "q4_k_m", dir);
    EXPECT_FALSE(r->plan->supported());
    EXPECT_NE(r->plan->reason().find(why), std::string::npos) << r->plan->reason();
  }
  auto f16 = record(synth::Arch::kLlama, "f16", dir);
  EXPECT_FALSE(f16->plan->supported());
  EXPECT_NE(f16->plan->reason().find("f16"), std::string::npos) << f16->plan->reason();
}

}  // namespace
}  // namespace hablar::cuda
