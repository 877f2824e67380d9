// A grammar's states shared by its requests (shared_states.h): the keys name a state's
// content whatever the arena's numbering; masks, distance profiles and restricted masks
// taken from the grammar equal those a matcher computes alone, across matchers that walk
// different documents, at once on several threads, and with no budget at all.
#include <gtest/gtest.h>

#include <algorithm>
#include <thread>

#include "core/error.h"
#include "formats/gguf.h"
#include "grammar/completion_length.h"
#include "grammar/grammar_cache.h"
#include "grammar/matcher.h"
#include "grammar/regex.h"
#include "support/test_support.h"
#include "tokenizer/tokenizer.h"
#include "vocab_fixture.h"

namespace hablar::grammar {
namespace {

std::shared_ptr<const Vocab> qwen2_vocab() {
  return test_vocab::gguf_vocab("qwen2");
}

const char* kSchema = R"({"type": "object", "properties": {
    "title": {"type": "string", "maxLength": 40}, "year": {"type": "integer"},
    "tags": {"type": "array", "items": {"type": "string"}},
    "score": {"type": "number"}}, "required": ["title", "year", "tags"]})";

const char* kDocs[] = {
    R"({"title": "A tale of two cities", "year": 1859, "tags": ["novel", "london"], "score": 4.5})",
    R"({"title": "Hamlet", "year": 1603, "tags": []})",
    R"({"title": "Dune \"the first\"", "year": 1965, "tags": ["sf", "desert", "spice"]})",
};

// The same grammar with its own store (a budget of `budget` bytes).
std::shared_ptr<const CompiledGrammar> with_store(const std::shared_ptr<const CompiledGrammar>& g,
                                                  size_t budget) {
  auto copy = std::make_shared<CompiledGrammar>(*g);
  copy->shared = std::make_shared<SharedStates>(budget);
  return copy;
}

// What a matcher gives at each step of a document (greedy longest allowed token): the mask,
// the largest distance after a token, and the mask restricted to the distance now + 1 and
// now + 6.
struct Walk {
  std::vector<std::vector<uint32_t>> masks, restricted;
  std::vector<int32_t> most, kept;
  size_t computed = 0;
};

Walk walk(const std::shared_ptr<const CompiledGrammar>& g, const std::string& text) {
  const Vocab& v = *g->vocab;
  GrammarMatcher m(g);
  Walk w;
  std::vector<uint32_t> mask(((size_t)v.n_vocab() + 31) / 32);
  for (size_t at = 0; at < text.size();) {
    m.fill_mask(mask);
    w.masks.push_back(mask);
    w.most.push_back(m.max_distance_after());
    for (int32_t slack : {1, 6}) {  // (two distances a state: kept apart)
      m.fill_mask(mask);
      w.kept.push_back(m.restrict_mask_to_distance(mask, m.distance_to_end() + slack));
      w.restricted.push_back(mask);
    }
    m.fill_mask(mask);
    int32_t best = -1;
    size_t best_len = 0;
    for (int32_t id = 0; id < v.n_vocab(); ++id) {
      if (!((mask[(size_t)id >> 5] >> (id & 31)) & 1u) || !v.usable(id)) continue;
      const std::string& b = v.bytes(id);
      if (b.size() > best_len && text.compare(at, b.size(), b) == 0) best = id, best_len = b.size();
    }
    EXPECT_GE(best, 0) << "no allowed token continues " << text.substr(at);
    if (best < 0 || !m.accept_token(best)) break;
    at += best_len;
  }
  EXPECT_TRUE(m.can_end());
  w.computed = m.masks_computed();
  return w;
}

// The greedy longest-token spelling of `text` under no grammar.
std::vector<int32_t> text_tokens(const Vocab& v, const std::string& text) {
  std::vector<int32_t> ids;
  for (size_t at = 0; at < text.size();) {
    int32_t best = -1;
    size_t best_len = 0;
    for (int32_t id = 0; id < v.n_vocab(); ++id) {
      const std::string& b = v.bytes(id);
      if (v.usable(id) && b.size() > best_len && text.compare(at, b.size(), b) == 0)
        best = id, best_len = b.size();
    }
    if (best < 0) break;
    ids.push_back(best);
    at += best_len;
  }
  return ids;
}

void expect_same(const Walk& a, const Walk& b, const char* what) {
  ASSERT_EQ(a.masks.size(), b.masks.size()) << what;
  for (size_t i = 0; i < a.masks.size(); ++i) {
    EXPECT_EQ(a.masks[i], b.masks[i]) << what << ": mask of step " << i;
    EXPECT_EQ(a.most[i], b.most[i]) << what << ": largest distance of step " << i;
  }
  ASSERT_EQ(a.kept.size(), b.kept.size()) << what;
  for (size_t i = 0; i < a.kept.size(); ++i) {
    EXPECT_EQ(a.kept[i], b.kept[i]) << what << ": restriction's count, entry " << i;
    EXPECT_EQ(a.restricted[i], b.restricted[i]) << what << ": restricted mask, entry " << i;
  }
}

std::shared_ptr<const CompiledGrammar> schema_grammar() {
  return compile(parse_gbnf(json_schema_to_gbnf(nlohmann::ordered_json::parse(kSchema))),
                 qwen2_vocab());
}

TEST(SharedStates, KeysNameAStatesContentWhateverTheArenasNumbering) {
  const Grammar g = parse_gbnf(json_schema_to_gbnf(nlohmann::ordered_json::parse(kSchema)));
  Recognizer plain(g), detoured(g);
  RecState other = detoured.initial();  // nodes made in another order first
  ASSERT_TRUE(detoured.advance_bytes(other, R"({"title": "x", "year": 12, "tags": ["q)"));
  RecState a = plain.initial(), b = detoured.initial();
  ASSERT_TRUE(plain.advance_bytes(a, R"({"title": "ab)"));
  ASSERT_TRUE(detoured.advance_bytes(b, R"({"title": "ab)"));
  EXPECT_EQ(state_key(a, plain.arena(), 4096), state_key(b, detoured.arena(), 4096));
  RecState c = b;
  ASSERT_TRUE(detoured.advance_bytes(c, "\""));
  EXPECT_NE(state_key(c, detoured.arena(), 4096), state_key(b, detoured.arena(), 4096));
  RecState mid = a;  // half a two-byte character
  ASSERT_TRUE(plain.advance_bytes(mid, "\xC3"));
  EXPECT_NE(state_key(mid, plain.arena(), 4096), state_key(a, plain.arena(), 4096));
}

// A state whose key would pass the bound (here: a thousand nested parentheses) is not kept
// by content; its masks are still right.
TEST(SharedStates, StatesOfLongKeysAreComputedAloneAndStillRight) {
  const auto v = qwen2_vocab();
  const auto g = compile(parse_gbnf("root ::= \"(\" root \")\" | \"x\"\n"), v);
  Recognizer rec(g->grammar);
  RecState deep = rec.initial();
  ASSERT_TRUE(rec.advance_bytes(deep, std::string(1000, '(')));
  EXPECT_EQ(state_key(deep, rec.arena(), GrammarMatcher::kMaxKeyBytes), "");
  EXPECT_NE(state_key(deep, rec.arena(), 1 << 20), "");
  GrammarMatcher m(g), alone(with_store(g, 0));
  ASSERT_TRUE(m.accept_bytes(std::string(1000, '(')));
  ASSERT_TRUE(alone.accept_bytes(std::string(1000, '(')));
  const size_t kept = g->shared->entries();
  std::vector<uint32_t> a(((size_t)v->n_vocab() + 31) / 32), b(a.size());
  m.fill_mask(a);
  alone.fill_mask(b);
  EXPECT_EQ(a, b);
  EXPECT_EQ(g->shared->entries(), kept);
  EXPECT_GT(std::count_if(a.begin(), a.end(), [](uint32_t w) { return w != 0; }), 0);
}

TEST(SharedStates, LaterRequestsTakeTheGrammarsStatesAndGetWhatTheyWouldCompute) {
  const auto shared = schema_grammar();
  for (const char* doc : kDocs) {
    const Walk alone = walk(with_store(shared, 0), doc);
    const Walk first = walk(shared, doc);
    const Walk again = walk(shared, doc);
    expect_same(alone, first, "first request");
    expect_same(alone, again, "second request");
    EXPECT_GT(alone.computed, 0u);
    EXPECT_EQ(again.computed, 0u) << "a request after one over the same document computes no mask";
  }
  // The documents share most states: a fourth request over another document of the schema
  // computes few of its masks.
  const Walk later = walk(shared, R"({"title": "Emma", "year": 1815, "tags": ["novel"]})");
  const Walk later_alone =
      walk(with_store(shared, 0), R"({"title": "Emma", "year": 1815, "tags": ["novel"]})");
  expect_same(later_alone, later, "another document");
  EXPECT_LT(later.computed * 4, later_alone.computed);
  EXPECT_GT(shared->shared->entries(), 0u);
  EXPECT_LE(shared->shared->bytes_kept(), SharedStates::kDefaultBudget);
}

// Masks alone (no budget): a state's mask is kept from its second computation on, so the
// first request copies nothing it met once, the second computes those once more, and the
// third computes none.
TEST(SharedStates, MasksAreKeptFromTheirSecondComputation) {
  const auto g = schema_grammar();
  const auto masks_computed = [&](const std::string& text) {
    GrammarMatcher m(g);
    std::vector<std::vector<uint32_t>> masks;
    std::vector<uint32_t> mask(((size_t)g->vocab->n_vocab() + 31) / 32);
    for (int32_t id : text_tokens(*g->vocab, text)) {
      m.fill_mask(mask);
      masks.push_back(mask);
      EXPECT_TRUE(m.accept_token(id));
    }
    return std::pair{m.masks_computed(), masks};
  };
  const auto [first, masks1] = masks_computed(kDocs[0]);
  const size_t kept_after_first = g->shared->entries();
  const auto [second, masks2] = masks_computed(kDocs[0]);
  const auto [third, masks3] = masks_computed(kDocs[0]);
  EXPECT_GT(first, 0u);
  EXPECT_GT(second, 0u);
  EXPECT_LE(second, first);
  EXPECT_EQ(third, 0u);
  EXPECT_GT(g->shared->entries(), kept_after_first);
  EXPECT_EQ(masks1, masks2);
  EXPECT_EQ(masks1, masks3);
}

TEST(SharedStates, RequestsOnSeveralThreadsAtOnceGetWhatTheyWouldCompute) {
  const auto shared = schema_grammar();
  std::vector<Walk> alone;
  for (const char* doc : kDocs) alone.push_back(walk(with_store(shared, 0), doc));
  std::vector<Walk> got(6);
  std::vector<std::thread> threads;
  for (size_t t = 0; t < got.size(); ++t)
    threads.emplace_back([&, t] { got[t] = walk(shared, kDocs[t % 3]); });
  for (auto& th : threads) th.join();
  for (size_t t = 0; t < got.size(); ++t) expect_same(alone[t % 3], got[t], kDocs[t % 3]);
}

TEST(SharedStates, ABudgetSpentKeepsNothingMoreAndChangesNoMask) {
  const auto base = schema_grammar();
  const Walk alone = walk(with_store(base, 0), kDocs[0]);
  // Room for a handful of masks (19 KB each over Qwen's vocabulary), no profile.
  const auto small = with_store(base, size_t{100} << 10);
  const Walk first = walk(small, kDocs[0]), second = walk(small, kDocs[0]);
  expect_same(alone, first, "small store, first");
  expect_same(alone, second, "small store, second");
  EXPECT_LE(small->shared->bytes_kept(), size_t{100} << 10);
  EXPECT_GT(small->shared->entries(), 0u);
  EXPECT_GT(second.computed, 0u);
  EXPECT_LT(second.computed, alone.computed);
}

// Requests with the same constraint get one compiled grammar (so one store of states); other
// texts, sources or vocabularies get their own; the least recently used goes past the
// capacity; a text that does not parse throws and leaves nothing.
TEST(GrammarCache, SameTextAndVocabularyShareOneGrammar) {
  const auto v = qwen2_vocab();
  GrammarCache cache(2);
  const std::string a = "root ::= \"a\"+\n", b = "root ::= [0-9]+\n", c = "root ::= \"c\"\n";
  const auto first = cache.get(a, GbnfSource::kUser, v);
  EXPECT_EQ(cache.get(a, GbnfSource::kUser, v), first);
  EXPECT_EQ(cache.compiles(), 1);
  EXPECT_NE(cache.get(a, GbnfSource::kGenerated, v), first);
  const auto other_vocab = std::make_shared<Vocab>(
      std::vector<std::string>{"a", "b"}, std::vector<bool>{true, true}, std::vector<int32_t>{});
  EXPECT_NE(cache.get(a, GbnfSource::kUser, other_vocab), first);
  EXPECT_EQ(cache.compiles(), 3);
  EXPECT_EQ(cache.size(), 2u);
  const auto kept_b = cache.get(b, GbnfSource::kUser, v);
  EXPECT_EQ(cache.get(b, GbnfSource::kUser, v), kept_b);
  cache.get(c, GbnfSource::kUser, v);  // b was used last: the other vocabulary's grammar goes
  EXPECT_EQ(cache.get(b, GbnfSource::kUser, v), kept_b);
  EXPECT_EQ(cache.compiles(), 5);
  EXPECT_THROW(cache.get("root ::= (\n", GbnfSource::kUser, v), hablar::Error);
  EXPECT_EQ(cache.size(), 2u);
  // A grammar that left the cache stays whole for the requests that hold it.
  GrammarMatcher m(first);
  EXPECT_TRUE(m.accept_bytes("aaa"));
  EXPECT_TRUE(m.can_end());
}

}  // namespace
}  // namespace hablar::grammar
