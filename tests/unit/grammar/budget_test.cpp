// Completion distances and the token budget: the fewest bytes that finish a sentence, from
// the grammar's elements and from matcher states, against hand-counted answers and against
// a brute-force search; and sampling at random under a budget always ends in a complete
// sentence (without the budget, the same sampling leaves most outputs unfinished).
#include <gtest/gtest.h>

#include <deque>
#include <random>
#include <set>

#include "formats/gguf.h"
#include "grammar/completion_length.h"
#include "grammar/matcher.h"
#include "grammar/regex.h"
#include "support/test_support.h"
#include "tokenizer/tokenizer.h"
#include "vocab_fixture.h"

namespace hablar::grammar {
namespace {

std::shared_ptr<const Vocab> gpt2_vocab() {
  return test_vocab::gguf_vocab("gpt-2");
}

// A vocabulary of single ASCII bytes plus an end token: distances in bytes are token counts.
std::shared_ptr<const Vocab> byte_vocab() {
  std::vector<std::string> bytes;
  for (int c = 0; c < 128; ++c) bytes.push_back(std::string(1, (char)c));
  bytes.push_back("");
  std::vector<bool> usable(bytes.size(), true);
  usable.back() = false;
  return std::make_shared<Vocab>(bytes, usable, std::vector<int32_t>{128});
}

// The fewest bytes (printable ASCII) after which the recognizer can end: breadth first.
int32_t brute_distance(const Grammar& g, const std::string& prefix, int32_t limit) {
  Recognizer rec(g);
  RecState start = rec.initial();
  if (!rec.advance_bytes(start, prefix)) return kNoCompletion;
  std::deque<std::pair<RecState, int32_t>> queue{{start, 0}};
  std::set<std::vector<int32_t>> seen{start.stacks};
  while (!queue.empty()) {
    auto [s, d] = queue.front();
    queue.pop_front();
    if (Recognizer::can_end(s)) return d;
    if (d == limit) continue;
    for (int c = 32; c < 127; ++c) {
      RecState next;
      if (!rec.advance_byte(s, (uint8_t)c, next)) continue;
      if (seen.insert(next.stacks).second) queue.emplace_back(next, d + 1);
    }
  }
  return kNoCompletion;
}

TEST(CompletionLength, HandCountedGrammar) {
  const Grammar g = parse_gbnf("root ::= \"ab\" x\nx ::= \"c\" | \"dd\" x\n");
  auto m = GrammarMatcher(compile(g, byte_vocab()));
  EXPECT_EQ(m.distance_to_end(), 3);  // "abc"
  ASSERT_TRUE(m.accept_bytes("ab"));
  EXPECT_EQ(m.distance_to_end(), 1);
  ASSERT_TRUE(m.accept_bytes("d"));
  EXPECT_EQ(m.distance_to_end(), 2);  // "dc"
  EXPECT_EQ(m.distance_after('d'), 1);
  EXPECT_EQ(m.distance_after('c'), kNoCompletion);  // refused after "abd"
  ASSERT_TRUE(m.accept_bytes("dc"));
  EXPECT_EQ(m.distance_to_end(), 0);
  EXPECT_EQ(class_min_bytes(parse_gbnf("root ::= [é-ë]").classes[0]), 2);
  EXPECT_EQ(class_min_bytes(parse_gbnf("root ::= [^a]").classes[0]), 1);
}

TEST(CompletionLength, MatchesBreadthFirstSearchOnJsonSchema) {
  const auto schema = nlohmann::ordered_json::parse(R"({"type": "object", "properties": {
      "name": {"type": "string", "minLength": 2}, "n": {"type": "integer"},
      "kids": {"type": "array", "items": {"$ref": "#"}, "minItems": 1, "maxItems": 2}},
      "required": ["name"]})");
  const Grammar g = parse_gbnf(json_schema_to_gbnf(schema), GbnfSource::kGenerated);
  const std::string doc = R"({"name":"ab","kids":[{"name":"cd"}]})";
  auto m = GrammarMatcher(compile(g, byte_vocab()));
  for (size_t i = 0; i <= doc.size(); ++i) {
    EXPECT_EQ(m.distance_to_end(), brute_distance(g, doc.substr(0, i), 40)) << doc.substr(0, i);
    if (i < doc.size()) {
      ASSERT_TRUE(m.accept_bytes(doc.substr(i, 1)));
    }
  }
}

// Uniform sampling over the allowed tokens for at most max_tokens tokens; with `budget`,
// as the server samples (a draw that does not fit is taken again among the tokens that do).
bool sample_completes(const std::shared_ptr<const CompiledGrammar>& cg, int32_t max_tokens,
                      uint32_t seed, bool budget) {
  GrammarMatcher m(cg);
  std::mt19937 rng(seed);
  std::vector<float> logits((size_t)cg->vocab->n_vocab());
  const auto draw = [&] {
    std::vector<int32_t> allowed;
    for (size_t i = 0; i < logits.size(); ++i)
      if (logits[i] != -std::numeric_limits<float>::infinity()) allowed.push_back((int32_t)i);
    return allowed[std::uniform_int_distribution<size_t>(0, allowed.size() - 1)(rng)];
  };
  for (int32_t left = max_tokens; left > 0 && !m.finished(); --left) {
    std::fill(logits.begin(), logits.end(), 0.0f);
    if (m.apply_mask(logits) == 0) return false;
    int32_t token = draw();
    const int32_t limit = std::max(left - 1, m.distance_to_end() - 1);
    if (budget && m.distance_after(token) > limit) {
      m.restrict_to_distance(logits, limit);
      token = draw();
    }
    EXPECT_TRUE(m.accept_token(token));
  }
  return m.can_end();
}

TEST(TokenBudget, RandomSamplingEndsAsAWholeDocument) {
  const auto schema = nlohmann::ordered_json::parse(R"({"type": "object", "properties": {
      "label": {"type": "string"}, "children": {"type": "array", "items": {"$ref": "#"}}},
      "required": ["label", "children"]})");
  auto cg = compile(parse_gbnf(json_schema_to_gbnf(schema), GbnfSource::kGenerated), gpt2_vocab());
  int with_budget = 0, without = 0;
  const int n = 12;
  for (uint32_t seed = 0; seed < (uint32_t)n; ++seed) {
    with_budget += sample_completes(cg, 60, seed, true);
    without += sample_completes(cg, 60, seed, false);
  }
  EXPECT_EQ(with_budget, n);
  EXPECT_LT(without, n / 2) << "uniform sampling should rarely close the tree unaided";
}

// The mask's form of the restriction (for a device that samples under the mask) keeps the
// same tokens as the logits' form, and the per-state bound says exactly when it restricts
// anything: along random walks of a recursive JSON schema, at every limit up to the bound.
TEST(TokenBudget, MaskRestrictionEqualsTheLogitsOneAndItsBound) {
  const auto schema = nlohmann::ordered_json::parse(R"({"type": "object", "properties": {
      "label": {"type": "string"}, "children": {"type": "array", "items": {"$ref": "#"}}},
      "required": ["label", "children"]})");
  auto cg = compile(parse_gbnf(json_schema_to_gbnf(schema), GbnfSource::kGenerated), gpt2_vocab());
  const size_t n = (size_t)cg->vocab->n_vocab(), n_words = (n + 31) / 32;
  const float ninf = -std::numeric_limits<float>::infinity();
  int restricted = 0;
  for (uint32_t seed = 0; seed < 3; ++seed) {
    GrammarMatcher m(cg);
    std::mt19937 rng(seed);
    for (int step = 0; step < 24 && !m.finished(); ++step) {
      std::vector<uint32_t> mask(n_words);
      m.fill_mask(mask);
      int32_t most = 0;  // brute force over the allowed tokens
      std::vector<int32_t> allowed;
      for (size_t id = 0; id < n; ++id)
        if ((mask[id / 32] >> (id % 32)) & 1u) {
          allowed.push_back((int32_t)id);
          most = std::max(most, m.distance_after((int32_t)id));
        }
      ASSERT_FALSE(allowed.empty());
      auto check = [&](int32_t limit) {
        std::vector<float> logits(n, 0.0f);
        mask_logits(mask, logits);
        const int32_t left = m.restrict_to_distance(logits, limit);
        std::vector<uint32_t> words = mask;
        EXPECT_EQ(m.restrict_mask_to_distance(words, limit), left);
        for (size_t id = 0; id < n; ++id)
          ASSERT_EQ((words[id / 32] >> (id % 32)) & 1u, logits[id] != ninf ? 1u : 0u)
              << "token " << id << ", limit " << limit;
        restricted += words != mask ? 1 : 0;
        if (limit >= most) {
          EXPECT_EQ(words, mask);  // at the bound nothing is cleared
        }
      };
      const int32_t tightest = std::max(0, m.distance_to_end() - 1);
      check(tightest);  // (a state first seen: walked; after max_distance_after: its distances)
      EXPECT_EQ(m.max_distance_after(), most) << "seed " << seed << " step " << step;
      // Every limit near the end (a token's distance off by one shows there), then every third.
      for (int32_t limit = tightest; limit <= most; limit += limit < tightest + 6 ? 1 : 3)
        check(limit);
      ASSERT_TRUE(m.accept_token(allowed[rng() % allowed.size()]));
    }
  }
  EXPECT_GT(restricted, 0);
}

TEST(TokenBudget, NoFittingTokenChangesNothing) {
  auto cg = compile(parse_gbnf("root ::= \"abcdef\""), byte_vocab());
  GrammarMatcher m(cg);
  std::vector<float> logits(129, 0.0f);
  m.apply_mask(logits);
  EXPECT_EQ(m.restrict_to_distance(logits, 2), 1);  // only "a" is allowed, and it stays
  EXPECT_EQ(logits['a'], 0.0f);
}

}  // namespace
}  // namespace hablar::grammar
