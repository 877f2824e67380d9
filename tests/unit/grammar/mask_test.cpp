// Token masks against brute force: at every step of a walk through a document, the mask
// from the trie walk (and from the cache, on repeated states) equals testing each token of
// a real vocabulary one by one with accept_token on a copy of the matcher. Also: EOS only
// where the grammar can end, special tokens never, and a tiny hand-made vocabulary.
#include <gtest/gtest.h>

#include "formats/gguf.h"
#include "grammar/matcher.h"
#include "grammar/recognizer.h"
#include "grammar/regex.h"
#include "support/test_support.h"
#include "tokenizer/tokenizer.h"
#include "vocab_fixture.h"

namespace hablar::grammar {
namespace {

using test_vocab::gguf_vocab;

// The oracle: the recognizer alone (no trie, no DFA, no cache), fed the bytes accepted so
// far and then each token's bytes; EOS where the prefix is a complete sentence.
std::vector<uint32_t> brute_mask(const Grammar& g, const Vocab& v, const std::string& consumed) {
  Recognizer rec(g);
  RecState start = rec.initial();
  EXPECT_TRUE(rec.advance_bytes(start, consumed));
  std::vector<uint32_t> w(((size_t)v.n_vocab() + 31) / 32, 0);
  for (int32_t id = 0; id < v.n_vocab(); ++id) {
    bool ok = false;
    if (v.is_eog(id)) {
      ok = Recognizer::can_end(start);
    } else if (v.usable(id)) {
      RecState s = start;
      ok = rec.advance_bytes(s, v.bytes(id));
    }
    if (ok) w[(size_t)id >> 5] |= 1u << (id & 31);
  }
  return w;
}

// Walks `text` token by token (greedy longest token the grammar allows that is a prefix of
// the rest), checking the mask at each step against brute force.
void check_walk(const std::shared_ptr<const Vocab>& vocab,
                const std::shared_ptr<const CompiledGrammar>& g, const std::string& text,
                int brute_steps) {
  GrammarMatcher m(g);
  std::vector<uint32_t> mask(((size_t)vocab->n_vocab() + 31) / 32);
  size_t at = 0;
  for (int step = 0; at < text.size(); ++step) {
    m.fill_mask(mask);
    if (step < brute_steps) {
      EXPECT_EQ(mask, brute_mask(g->grammar, *vocab, text.substr(0, at)))
          << "step " << step << " at " << text.substr(at);
    }
    int32_t best = -1;
    size_t best_len = 0;
    for (int32_t id = 0; id < vocab->n_vocab(); ++id) {
      if (!((mask[(size_t)id >> 5] >> (id & 31)) & 1u) || !vocab->usable(id)) continue;
      const std::string& b = vocab->bytes(id);
      if (b.size() > best_len && text.compare(at, b.size(), b) == 0) {
        best = id;
        best_len = b.size();
      }
    }
    ASSERT_GE(best, 0) << "no allowed token continues " << text.substr(at);
    ASSERT_TRUE(m.accept_token(best));
    at += best_len;
  }
  EXPECT_TRUE(m.can_end());
  m.fill_mask(mask);
  EXPECT_EQ(mask, brute_mask(g->grammar, *vocab, text));
  for (int32_t id : vocab->eog()) EXPECT_TRUE((mask[(size_t)id >> 5] >> (id & 31)) & 1u);
}

void check_walk(const std::shared_ptr<const Vocab>& vocab, const std::string& gbnf,
                const std::string& text, int brute_steps) {
  check_walk(vocab, compile(parse_gbnf(gbnf), vocab), text, brute_steps);
}

const char* kJsonSchema = R"({"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 20}, "age": {"type": "integer", "minimum": 0,
    "maximum": 150}, "tags": {"type": "array", "items": {"enum": ["a", "bé", "c"]}}},
    "required": ["name", "age"]})";

TEST(Masks, MatchBruteForceGpt2) {
  auto v = gguf_vocab("gpt-2");
  check_walk(v, json_schema_to_gbnf(nlohmann::ordered_json::parse(kJsonSchema)),
             R"({"name": "Zoë \"Z\"", "age": 42, "tags": ["bé", "a"]})", 1000);
  check_walk(v, regex_to_gbnf("[a-z]+( [a-z]+)*\\."), "hello big world.", 1000);
}

TEST(Masks, MatchBruteForceQwen2) {
  auto v = gguf_vocab("qwen2");
  check_walk(v, json_schema_to_gbnf(nlohmann::ordered_json::parse(kJsonSchema)),
             R"({"name":"日本語","age":7})", 1000);
}

TEST(Masks, ClassRunsMatchBruteForce) {
  // Long runs of one class (a free string, a bounded one, a pattern class), with escapes,
  // multi-byte characters and runs longer than the class table's kMaxRun.
  const char* schema = R"({"type": "object", "properties": {
      "free": {"type": "string"}, "short": {"type": "string", "maxLength": 5},
      "code": {"type": "string", "pattern": "^[a-z_]{1,40}\\.[a-z]{2,3}$"},
      "mail": {"type": "string", "format": "email"},
      "mixed": {"type": "string", "pattern": "^[a-f][a-z0-9]{0,40}[^a-z]{2}$"}},
      "required": ["free", "short", "code", "mail", "mixed"]})";
  const std::string doc = std::string("{\"free\": \"D\xC3\xA9j\xC3\xA0 vu \\\"quoted\\\" ") +
                          std::string(70, 'x') +
                          " \xE6\x97\xA5\xE6\x9C\xAC ok\\n\", \"short\": \"h\xC3\xA9llo\", "
                          "\"code\": \"some_very_long_module_name_here_abc.py\", "
                          "\"mail\": \"first.last+tag@mail-server.example.org\", "
                          "\"mixed\": \"abcdefghij0123456789xyz0123456789zz\xC3\xA9!\"}";
  for (const char* name : {"gpt-2", "qwen2"})
    check_walk(gguf_vocab(name), json_schema_to_gbnf(nlohmann::ordered_json::parse(schema)), doc,
               1000);
}

// Requests may bring any number of distinct big classes: the vocabulary keeps only the most
// recently asked-for tables, and a grammar holds its own, so a grammar compiled before many
// others still masks as brute force says after its table left the vocabulary's cache.
TEST(Masks, ClassTablesAreBoundedAndHeldByTheirGrammars) {
  const auto base = gguf_vocab("gpt-2");
  // A vocabulary of its own (the shared one's cache serves the other tests).
  std::vector<std::string> bytes;
  std::vector<bool> usable;
  for (int32_t id = 0; id < base->n_vocab(); ++id) {
    bytes.push_back(base->bytes(id));
    usable.push_back(base->usable(id));
  }
  auto v = std::make_shared<Vocab>(bytes, usable, base->eog());
  const std::string first = "root ::= [a-z ]+ \".\"\n";
  auto g = compile(parse_gbnf(first), v);
  EXPECT_EQ(v->class_tables_kept(), 1u);
  for (int i = 0; i < 3 * (int)Vocab::kMaxClassTables; ++i) {
    const std::string other = "root ::= [^" + std::string(1, (char)('A' + i % 26)) +
                              std::string(1, (char)('0' + i / 26)) + "]+\n";
    compile(parse_gbnf(other), v);
    EXPECT_LE(v->class_tables_kept(), Vocab::kMaxClassTables);
  }
  EXPECT_EQ(v->class_tables_kept(), Vocab::kMaxClassTables);
  check_walk(v, g, "the quick brown fox jumps over the lazy dog.", 1000);
}

TEST(Masks, SpmVocabulary) {
  auto v = gguf_vocab("llama-spm");
  check_walk(v, "root ::= \"héllo\" [ ] \"wörld\"{1,2}\n", "héllo wörldwörld", 8);
}

TEST(Masks, EosOnlyAtTheEndAndSpecialsNever) {
  std::vector<std::string> bytes = {"a", "b", "ab", "", "<s>", "\xC3", "\xA9"};
  std::vector<bool> usable = {true, true, true, false, false, true, true};
  auto v = std::make_shared<Vocab>(bytes, usable, std::vector<int32_t>{3});
  auto g = compile(parse_gbnf("root ::= \"a\" \"b\"? \"\xC3\xA9\"?\n"), v);
  GrammarMatcher m(g);
  std::vector<uint32_t> mask(1);
  m.fill_mask(mask);
  EXPECT_EQ(mask[0], (1u << 0) | (1u << 2));  // "a", "ab"
  ASSERT_TRUE(m.accept_token(0));
  m.fill_mask(mask);
  EXPECT_EQ(mask[0], (1u << 1) | (1u << 3) | (1u << 5));  // "b", EOS, first byte of é
  ASSERT_TRUE(m.accept_token(5));
  m.fill_mask(mask);
  EXPECT_EQ(mask[0], 1u << 6);  // mid-character: only its continuation, no EOS
  ASSERT_TRUE(m.accept_token(6));
  EXPECT_TRUE(m.must_end());
  m.fill_mask(mask);
  EXPECT_EQ(mask[0], 1u << 3);
  EXPECT_FALSE(m.accept_token(4));
  ASSERT_TRUE(m.accept_token(3));
  EXPECT_TRUE(m.finished());
}

TEST(Masks, ApplyMaskSetsMinusInfinity) {
  std::vector<std::string> bytes = {"x", "y", "z"};
  auto v =
      std::make_shared<Vocab>(bytes, std::vector<bool>{true, true, true}, std::vector<int32_t>{});
  GrammarMatcher m(compile(parse_gbnf("root ::= [xz]\n"), v));
  std::vector<float> logits = {1.0f, 2.0f, 3.0f};
  EXPECT_EQ(m.apply_mask(logits), 2);
  EXPECT_EQ(logits[0], 1.0f);
  EXPECT_TRUE(std::isinf(logits[1]) && logits[1] < 0);
  EXPECT_EQ(logits[2], 3.0f);
}

}  // namespace
}  // namespace hablar::grammar
