// Embeddings against llama.cpp (tests/golden/embedding/<model>.json, made by
// tools/embedding_oracle.py from the same seeded `hablar make-model` files this test writes
// again): synthetic bert, bert with a reranker head, nomic-bert, decoder embedders (qwen3,
// llama) in F16 and Q8_0, and gemma-embedding (both-way windows, dense projections) in F16,
// every pooling type recorded. All inputs of a model run in one
// embedding step (as the engine batches them), each compared with llama.cpp's own run of it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "engine/cpu_executor.h"
#include "engine/embedding.h"
#include "formats/apr.h"
#include "model/weights.h"
#include "model_test_util.h"

namespace hablar {
namespace {

// The bound; measured: every vector of every pooling within 1 - 1.2e-7 (most within
// the golden file's rounding).
constexpr double kMinCosine = 0.9999;
// A reranker's score (one float out of an F32 classifier over F16 products) against the
// golden file's: exact where the CPU rounds as the oracle did, within 2e-3 elsewhere
// (test::golden_rounding_matches; 4.8e-4 measured).
double rank_tolerance() {
  return test::golden_rounding_matches() ? 1.0 - kMinCosine : 2e-3;
}

nlohmann::json load_embedding_golden(const std::string& name) {
  const std::string path = test::source_dir() + "/tests/golden/embedding/" + name + ".json";
  std::ifstream in(path);
  if (!in) throw std::runtime_error("missing golden file " + path);
  return nlohmann::json::parse(in);
}

std::string write_model(const std::string& dir, const nlohmann::json& spec) {
  synth::SyntheticModelOptions o;
  o.arch = *synth::arch_from_name(spec["arch"].get<std::string>());
  o.shape = *synth::shape_from_name(spec["shape"].get<std::string>());
  o.type = spec["type"].get<std::string>();
  const std::string vocab = spec["vocab"].get<std::string>();
  o.vocab_path = vocab.empty() ? "" : test::testdata_dir() + "/vocab/" + vocab;
  o.seed = spec["seed"].get<uint64_t>();
  o.rank_head = spec["rank_head"].get<bool>();
  const std::string path = dir + "/model.gguf";
  synth::write_synthetic_model(o, path);
  return path;
}

// Runs every sequence in one step with the pooling; vectors per sequence.
std::vector<std::vector<float>> embed_all(engine::CpuExecutor& ex,
                                          const std::vector<std::vector<int32_t>>& seqs,
                                          Pooling pooling) {
  std::vector<engine::EmbedChunk> chunks;
  for (const auto& s : seqs) chunks.push_back({s, pooling});
  engine::EmbedOutput out;
  ex.embed(chunks, out);
  std::vector<std::vector<float>> v;
  for (size_t c = 0; c < chunks.size(); ++c)
    v.emplace_back(out.values.begin() + out.begin[c], out.values.begin() + out.begin[c + 1]);
  return v;
}

class EmbeddingGolden : public ::testing::TestWithParam<std::string> {};

TEST_P(EmbeddingGolden, EveryPoolingMatchesLlamaCpp) {
  const nlohmann::json golden = load_embedding_golden(GetParam());
  const std::string dir = test::make_temp_dir("hablar-embed");
  auto m = model::Model::load(write_model(dir, golden["model"]));
  engine::CpuExecutor ex(*m, 1, kDefaultKvBlockSize, 2);
  std::vector<std::vector<int32_t>> seqs;
  for (const auto& in : golden["inputs"]) {
    seqs.push_back(in["ids"].get<std::vector<int32_t>>());
    // Our tokenizer gives llama.cpp's ids (with its special tokens).
    EXPECT_EQ(m->tokenizer().encode(in["text"].get<std::string>(), true, false), seqs.back())
        << in["text"];
  }
  const int64_t E = m->config().n_embd;
  for (const auto& [name, _] : golden["inputs"][0]["embeddings"].items()) {
    const Pooling pooling = *pooling_from_name(name);
    const auto got = embed_all(ex, seqs, pooling);
    double worst = 1.0;
    for (size_t i = 0; i < seqs.size(); ++i) {
      const auto& want = golden["inputs"][i]["embeddings"][name];
      std::vector<std::vector<float>> rows;  // per token for none, else one
      if (pooling == Pooling::kNone) {
        rows = want.get<std::vector<std::vector<float>>>();
      } else {
        rows.push_back(want.get<std::vector<float>>());
      }
      ASSERT_EQ(got[i].size(), rows.size() * rows[0].size()) << name << " input " << i;
      const int64_t width = pooling == Pooling::kRank ? (int64_t)rows[0].size() : E;
      for (size_t r = 0; r < rows.size(); ++r) {
        const std::span<const float> g(got[i].data() + r * width, (size_t)width);
        const bool rank = pooling == Pooling::kRank;
        const double c = rank ? 1.0 - std::fabs(g[0] - rows[r][0]) : test::cosine(g, rows[r]);
        worst = std::min(worst, c);
        EXPECT_GE(c, rank ? 1.0 - rank_tolerance() : kMinCosine)
            << GetParam() << " " << name << " input " << i << " row " << r;
      }
    }
    std::printf("%s %s: worst cosine %.9f\n", GetParam().c_str(), name.c_str(), worst);
  }
  m.reset();
  std::filesystem::remove_all(dir);
}

// An embedder converted to APR embeds bit for bit as its GGUF (gemma-embedding: its dense
// projections and pooling type travel too).
TEST(EmbeddingApr, GemmaEmbeddingRoundTrips) {
  const nlohmann::json golden = load_embedding_golden("gemma-embedding-f16");
  const std::string dir = test::make_temp_dir("hablar-embed-apr");
  auto ref = model::Model::load(write_model(dir, golden["model"]));
  const std::vector<uint8_t> bytes = apr::from_gguf(ref->file());
  std::ofstream(dir + "/model.apr", std::ios::binary)
      .write(reinterpret_cast<const char*>(bytes.data()), (std::streamsize)bytes.size());
  auto m = model::Model::load(dir + "/model.apr");
  EXPECT_EQ(m->config().pooling, ref->config().pooling);
  EXPECT_TRUE(m->weights().dense_2.data != nullptr && m->weights().dense_3.data != nullptr);
  engine::CpuExecutor a(*ref, 1, kDefaultKvBlockSize, 2), b(*m, 1, kDefaultKvBlockSize, 2);
  std::vector<std::vector<int32_t>> seqs;
  for (const auto& in : golden["inputs"]) seqs.push_back(in["ids"].get<std::vector<int32_t>>());
  for (const Pooling p : {Pooling::kMean, Pooling::kNone})
    EXPECT_EQ(embed_all(a, seqs, p), embed_all(b, seqs, p));
  m.reset(), ref.reset();
  std::filesystem::remove_all(dir);
}

// The models with a classifier head.
class RerankGolden : public EmbeddingGolden {};

// A reranker's scores for llama-server's query/document pairs, ordered as llama.cpp's.
TEST_P(RerankGolden, OrderMatchesLlamaCpp) {
  const nlohmann::json golden = load_embedding_golden(GetParam());
  ASSERT_TRUE(golden.contains("rerank")) << "the golden file has no rerank scores";
  const std::string dir = test::make_temp_dir("hablar-rerank");
  auto m = model::Model::load(write_model(dir, golden["model"]));
  engine::CpuExecutor ex(*m, 1, kDefaultKvBlockSize, 2);
  const auto pairs = golden["rerank"]["ids"].get<std::vector<std::vector<int32_t>>>();
  const auto want = golden["rerank"]["scores"].get<std::vector<float>>();
  const auto got = embed_all(ex, pairs, Pooling::kRank);
  // Every pair llama.cpp's scores set apart by more than the rounding this machine may add
  // (none where it rounds as the oracle did: the whole order then) keeps its order.
  const double tol = test::golden_rounding_matches() ? 0.0 : rank_tolerance();
  for (size_t a = 0; a < want.size(); ++a) {
    for (size_t b = 0; b < want.size(); ++b) {
      if (want[a] - want[b] <= tol) continue;
      EXPECT_GT(got[a][0], got[b][0]) << "pair " << a << " above " << b << " in llama.cpp's order";
    }
  }
  // Scores within 1e-3 (measured: 1.6e-4 at most, F16, a 16-token pair; Q8_0 closer), or the
  // looser bound where the CPU rounds otherwise.
  for (size_t i = 0; i < want.size(); ++i)
    EXPECT_NEAR(got[i][0], want[i], std::max(1e-3, rank_tolerance())) << i;
  m.reset();
  std::filesystem::remove_all(dir);
}

std::string param_name(const ::testing::TestParamInfo<std::string>& info) {
  std::string name = info.param;
  for (char& c : name)
    if (c == '-') c = '_';
  return name;
}

INSTANTIATE_TEST_SUITE_P(Models, EmbeddingGolden,
                         ::testing::Values("bert-f16", "bert-q8_0", "bert-rank-f16",
                                           "bert-rank-q8_0", "nomic-bert-f16", "nomic-bert-q8_0",
                                           "qwen3-f16", "qwen3-q8_0", "llama-f16", "llama-q8_0",
                                           "gemma-embedding-f16"),
                         param_name);
INSTANTIATE_TEST_SUITE_P(Rerankers, RerankGolden,
                         ::testing::Values("bert-rank-f16", "bert-rank-q8_0"), param_name);

}  // namespace
}  // namespace hablar
