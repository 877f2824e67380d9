// model::weight_vector_fields / layer_vector_fields against what the loader reads: every
// 1-D tensor of every family's weights (Weights::vectors owns them all) is reached by exactly
// one field of the lists, with the length it was read with. Device executors copy the vectors
// by these lists, so a field the lists miss would reach a kernel as a null pointer.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <string>

#include "formats/synthetic_model.h"
#include "model/model.h"
#include "model/weights.h"
#include "model_test_util.h"

namespace hablar {
namespace {

namespace fs = std::filesystem;

class WeightFields : public ::testing::TestWithParam<std::string> {};

TEST_P(WeightFields, ReachEveryVectorTheLoaderRead) {
  const std::string arch = GetParam();
  const fs::path dir = fs::path(::testing::TempDir()) / ("weight-fields-" + arch);
  fs::remove_all(dir);
  fs::create_directories(dir);
  synth::SyntheticModelOptions o;
  o.arch = *synth::arch_from_name(arch);
  o.shape = *synth::shape_from_name(synth::is_encoder(o.arch) ? "bert-tiny" : "tiny");
  o.type = "f16";
  o.rank_head = synth::is_encoder(o.arch);  // (the classifier's biases too)
  if (o.rank_head) o.pooling = "rank";
  const std::string path = (dir / "m.gguf").string();
  synth::write_synthetic_model(o, path);
  const auto m = model::Model::load(path);
  const model::ModelConfig& c = m->config();
  const model::Weights& w = m->weights();

  std::map<const float*, int64_t> reached;  // data -> length the lists give
  int64_t duplicates = 0;
  const auto reach = [&](const float* p, int64_t n) {
    if (p == nullptr) return;
    duplicates += reached.count(p);
    reached[p] = n;
  };
  for (const model::WeightVectorField& f : model::weight_vector_fields())
    reach(w.*f.field, f.length(c, w));
  for (const model::LayerWeights& l : w.layers)
    for (const model::LayerVectorField& f : model::layer_vector_fields())
      reach(l.*f.field, f.length(c, l));

  EXPECT_EQ(duplicates, 0) << arch;
  ASSERT_FALSE(w.vectors.empty()) << arch;
  for (const std::vector<float>& v : w.vectors) {
    const auto it = reached.find(v.data());
    ASSERT_NE(it, reached.end()) << arch << ": a vector of " << v.size()
                                 << " floats that no field of the lists reaches";
    EXPECT_EQ(it->second, (int64_t)v.size()) << arch;
  }
  EXPECT_EQ(reached.size(), w.vectors.size()) << arch << ": a field points outside the vectors";
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(EveryFamily, WeightFields,
                         ::testing::Values("llama", "qwen2", "qwen3", "gemma", "gemma2", "gemma3",
                                           "gemma-embedding", "mixtral", "qwen3moe", "phi3",
                                           "qwen2moe", "phi2", "smollm3", "granite", "ernie4_5",
                                           "olmo2", "starcoder2", "exaone4", "hunyuan-dense",
                                           "glm4", "arcee", "mistral3", "exaone", "xverse",
                                           "seed_oss", "command-r", "cohere2", "minicpm", "olmoe",
                                           "internlm2", "orion", "nemotron", "stablelm",
                                           "granitemoe", "bert", "nomic-bert"),
                         [](const auto& info) {
                           std::string name = info.param;
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

}  // namespace
}  // namespace hablar
