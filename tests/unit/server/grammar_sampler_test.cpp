// A grammar request through the engine on an executor that samples on its device (the fake
// one, applying masks as the CUDA sampler does) and on one that samples on the host: the
// same outputs, every one a sentence of the grammar, budget refusals (a device sample that
// would leave the sentence unfinishable within max_tokens) taken again on the host.
#include <gtest/gtest.h>

#include <random>

#include "../engine/fake_executor.h"
#include "core/thread_pool.h"
#include "engine/engine.h"
#include "grammar/grammar.h"
#include "grammar/matcher.h"
#include "grammar/recognizer.h"
#include "server/structured_output.h"

namespace hablar::server {
namespace {

constexpr int32_t kVocab = 97;
constexpr int32_t kEos = 96;
constexpr int kRequests = 24;

constexpr const char* kPieces[] = {"12", "[3", ",4", "[[", "]]", "],", ",[", "567", "[[[", "0,"};

// Tokens: single characters, a few longer pieces, the end of generation last.
std::shared_ptr<const grammar::Vocab> small_vocab() {
  const std::string chars = "0123456789[],{}\":abcdefghijklmnopqrstuvwxyz ";
  std::vector<std::string> bytes;
  for (int32_t i = 0; i < kVocab - 1; ++i) {
    if (i < (int32_t)chars.size())
      bytes.push_back(std::string(1, chars[(size_t)i]));
    else  // multi-character pieces: digit runs, list openers, separators
      bytes.push_back(kPieces[(size_t)i % std::size(kPieces)]);
  }
  bytes.push_back("");  // kEos
  std::vector<bool> usable(kVocab, true);
  usable[kEos] = false;
  return std::make_shared<grammar::Vocab>(std::move(bytes), usable, std::vector<int32_t>{kEos});
}

// Lists of lists of numbers: nesting makes some tokens push the shortest completion out.
constexpr const char* kGbnf = R"(root ::= list
list ::= "[" item ("," item)* "]"
item ::= [0-9]+ | list
)";

std::string text_of(const grammar::Vocab& v, const std::vector<int32_t>& tokens) {
  std::string s;
  for (int32_t t : tokens)
    if (t != kEos) s += v.bytes(t);
  return s;
}

enum class Sampling {
  kHost,
  kDevice,       // masks computed while each step's forward runs, one step at a time
  kDeviceAhead,  // steps launched before the last one's tokens reach the host (fed)
};

struct DeviceCounts {
  int64_t masked = 0, fed = 0, outstanding = 0, sampled = 0;
};

std::vector<std::vector<int32_t>> run(Sampling mode, int32_t max_tokens, DeviceCounts* counts,
                                      int32_t host_margin = GrammarSampler::kDefaultHostMargin) {
  auto vocab = small_vocab();
  auto g = grammar::compile(grammar::parse_gbnf(kGbnf), vocab);
  engine::test::FakeExecutor exec(kVocab, 256, 4);
  exec.device_sampling = mode != Sampling::kHost;
  exec.feeds = mode == Sampling::kDeviceAhead;
  engine::EngineConfig c;
  c.n_ctx = 4096;
  c.scheduler = {.max_running = 8, .max_step_tokens = 64, .max_prefill_chunk = 32};
  c.is_eog = [](int32_t t) { return t == kEos; };
  std::vector<std::vector<int32_t>> outs;
  {
    engine::Engine e(c, exec);
    std::mt19937 rng(5);
    std::vector<std::shared_ptr<engine::RequestHandle>> handles;
    for (int i = 0; i < kRequests; ++i) {
      engine::GenerateRequest r;
      for (int j = 0; j < 3 + i % 7; ++j) r.prompt.push_back((int32_t)(rng() % (kVocab - 1)));
      r.max_tokens = max_tokens;
      engine::SamplingParams p;
      p.temperature = 0.0f;
      r.sampler = std::make_unique<GrammarSampler>(
          p, kVocab, std::make_unique<GrammarGate>(g, "", "", max_tokens), host_margin);
      handles.push_back(e.submit(std::move(r)));
    }
    for (auto& h : handles) {
      std::vector<int32_t> tokens;
      for (bool done = false; !done;) {
        std::vector<engine::StreamItem> items;
        if (!h->wait(items, std::chrono::milliseconds(10000))) {
          ADD_FAILURE() << "engine stalled";
          break;
        }
        for (const auto& it : items) {
          if (it.kind == engine::StreamItem::Kind::kFinal) {
            done = true;
            // The budget keeps a token for the end of generation: the grammar ends it.
            EXPECT_EQ(it.finish_reason, engine::FinishReason::kStop) << "max_tokens " << max_tokens;
          }
          if (it.kind == engine::StreamItem::Kind::kToken) tokens.push_back(it.token);
        }
      }
      outs.push_back(tokens);
    }
  }
  if (counts)
    *counts = {exec.device_masked, exec.fed_chunks, exec.most_outstanding, exec.device_sampled};
  return outs;
}

TEST(GrammarSampler, DeviceMasksGiveTheHostOutputsAndWholeSentences) {
  auto vocab = small_vocab();
  const grammar::Grammar parsed = grammar::parse_gbnf(kGbnf);
  // Tight budgets (margin 0, the default: the device samples up to the last token, under
  // masks limited to what fits the budget; 3 and 32: the steps near the budget go to the
  // host).
  // Launched ahead, a step's mask comes from the token the step before sampled, given to the
  // grammar before the engine has seen it; a refused one voids the step launched on it.
  for (const Sampling mode : {Sampling::kDevice, Sampling::kDeviceAhead})
    for (const int32_t margin : {0, 3, 32})
      for (const int32_t max_tokens : {6, 9, 12, 17, 40, 80}) {
        DeviceCounts counts;
        const auto host = run(Sampling::kHost, max_tokens, nullptr, margin);
        const auto device = run(mode, max_tokens, &counts, margin);
        if (margin == 0) {
          EXPECT_GT(counts.masked, 0);
        }
        // Near the budget the masks keep only tokens that fit it: one step at a time, every
        // token was sampled on the device once (none refused, none left to the host).
        if (mode == Sampling::kDevice && margin == 0) {
          int64_t tokens = 0;
          for (const auto& out : device) tokens += (int64_t)out.size();
          EXPECT_EQ(counts.sampled, tokens) << "max_tokens " << max_tokens;
        }
        if (mode == Sampling::kDeviceAhead && max_tokens >= 40) {
          EXPECT_GT(counts.fed, 0) << "max_tokens " << max_tokens << ", margin " << margin;
          EXPECT_EQ(counts.outstanding, 2);
        }
        ASSERT_EQ(host.size(), device.size());
        for (size_t i = 0; i < host.size(); ++i) {
          EXPECT_EQ(device[i], host[i]) << "request " << i << ", max_tokens " << max_tokens
                                        << ", margin " << margin << ", mode " << (int)mode;
          const std::string text = text_of(*vocab, device[i]);
          grammar::Recognizer rec(parsed);
          grammar::RecState st = rec.initial();
          EXPECT_TRUE(rec.advance_bytes(st, text) && grammar::Recognizer::can_end(st))
              << "not a sentence: " << text;
          EXPECT_LE((int32_t)device[i].size(), max_tokens);
        }
      }
}

// The CUDA executor fills a step's masks on several threads at once (one request's source per
// thread; CudaExecutor::fill_masks): requests over one compiled grammar and vocabulary, near
// their budgets (the walks of max_distance_after and the restrictions), give the same masks
// filled at once as one after another.
TEST(GrammarSampler, MasksFilledAtOnceEqualMasksFilledInTurn) {
  auto vocab = small_vocab();
  auto g = grammar::compile(grammar::parse_gbnf(kGbnf), vocab);
  constexpr int kSources = 24;
  const size_t words = (kVocab + 31) / 32;
  auto masks_of = [&](bool at_once) {
    std::vector<std::unique_ptr<GrammarSampler>> samplers;
    std::vector<std::vector<int32_t>> histories;
    std::mt19937 rng(9);
    for (int i = 0; i < kSources; ++i) {
      engine::SamplingParams p;
      p.temperature = 0.0f;
      const int32_t max_tokens = 6 + i % 10;  // near the budget: restricted masks
      samplers.push_back(std::make_unique<GrammarSampler>(
          p, kVocab, std::make_unique<GrammarGate>(g, "", "", max_tokens)));
      std::vector<int32_t> h = {1, 2, 3};
      // A few tokens of the grammar's own ("[", digits, ","), then a pending one.
      const std::vector<int32_t> opening = {10, (int32_t)(rng() % 10), 12, (int32_t)(rng() % 10)};
      h.insert(h.end(), opening.begin(), opening.begin() + 1 + i % 3);
      if (i % 2) h.push_back(engine::kPendingToken);
      engine::DeviceSampling out;
      EXPECT_TRUE(samplers.back()->device_params(h, out));
      histories.push_back(h);
    }
    std::vector<uint32_t> masks(kSources * words, 0u);
    auto fill = [&](int i) {
      const int32_t pending =
          histories[(size_t)i].back() == engine::kPendingToken ? 1 + i % 9 : engine::kPendingToken;
      samplers[(size_t)i]->fill_allowed(std::span<uint32_t>(masks.data() + i * words, words),
                                        pending);
    };
    if (at_once) {
      ThreadPool pool(6);
      std::atomic<int> next{0};
      pool.run([&](int, int) {
        for (int i; (i = next.fetch_add(1)) < kSources;) fill(i);
      });
    } else {
      for (int i = 0; i < kSources; ++i) fill(i);
    }
    return masks;
  };
  const std::vector<uint32_t> in_turn = masks_of(false);
  EXPECT_NE(std::count(in_turn.begin(), in_turn.end(), 0u), (ptrdiff_t)in_turn.size());
  for (int round = 0; round < 4; ++round) EXPECT_EQ(masks_of(true), in_turn) << "round " << round;
}

}  // namespace
}  // namespace hablar::server
