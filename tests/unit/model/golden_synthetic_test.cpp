// Synthetic llama / qwen2 / qwen3 models in every tested type against llama.cpp
// (tests/golden/model/synthetic-<arch>-<type>.json, made by tools/llama_oracle.py from the
// same seeded `hablar make-model` files this test writes again).
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>

#include "model_test_util.h"

namespace hablar {
namespace {

// Bounds against llama.cpp, as measured (6 prompts, 98 positions per model). F32 weights
// agree to 1e-5 (the golden file's rounding): every op rounds as llama.cpp's does. F16 weights
// agree to 0.0042: llama.cpp rounds the activations to F16 before an F16 matmul, ours keep
// them in float. Quantized weights agree to 0.055 (probes 0.062): the float accumulation
// order inside the quantized dot products differs (see golden_smollm2_test.cpp), and random
// weights give flat distributions with near-ties, so top-1 agrees at 96 to 98 of 98 positions.
bool is_float_type(const std::string& t) {
  return t == "f32" || t == "f16";
}
double logsoftmax_tol(const std::string& t) {
  return is_float_type(t) ? 0.01 : 0.1;
}
double top1_fraction(const std::string& t) {
  return is_float_type(t) ? 0.99 : 0.95;
}

struct SynthCase {
  std::string arch;
  std::string type;
};

class SyntheticGolden : public ::testing::TestWithParam<SynthCase> {};

TEST_P(SyntheticGolden, TeacherForcedLogitsMatchLlamaCpp) {
  const SynthCase& sc = GetParam();
  const nlohmann::json golden = test::load_model_golden("synthetic-" + sc.arch + "-" + sc.type);
  const auto& spec = golden["model"];
  const std::string dir = test::make_temp_dir("hablar-synth");
  const std::string path = test::write_synthetic(dir, spec["arch"], spec["type"], spec["vocab"],
                                                 spec["seed"].get<uint64_t>(), spec["shape"]);
  auto m = model::Model::load(path, {});
  const test::GoldenComparison c = test::compare_with_golden(*m, golden);
  std::printf("%s %s: top-1 equal %d/%d; max |dlogsoftmax| top %.5f (%s), probes %.5f\n",
              sc.arch.c_str(), sc.type.c_str(), c.top1_equal, c.positions, c.max_abs_top,
              c.worst.c_str(), c.max_abs_probe);
  EXPECT_GE(c.top1_equal, (int)std::ceil(top1_fraction(sc.type) * c.positions));
  EXPECT_LE(c.max_abs_top, logsoftmax_tol(sc.type));
  EXPECT_LE(c.max_abs_probe, logsoftmax_tol(sc.type));
  m.reset();
  std::filesystem::remove_all(dir);
}

std::vector<SynthCase> all_cases() {
  std::vector<SynthCase> cases;
  for (const char* arch : {"llama", "qwen2", "qwen3"})
    for (const char* type : {"f32", "f16", "q8_0", "q4_0", "q4_1", "q4_k", "q5_k", "q6_k"})
      cases.push_back({arch, type});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(AllArchesAndTypes, SyntheticGolden, ::testing::ValuesIn(all_cases()),
                         [](const auto& info) { return info.param.arch + "_" + info.param.type; });

}  // namespace
}  // namespace hablar
