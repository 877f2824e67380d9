// libFuzzer target for the grammar engine: GBNF text, a JSON Schema or a regex (the first
// input byte picks which), compiled over a small vocabulary of single bytes, UTF-8 pieces
// and multi-character tokens, then walked token by token as a sampler would: the rest of
// the input chooses, at each step, an allowed token (and sometimes a refused one to try).
// A finding: a crash or sanitizer report; an exception other than the documented Error
// (bad grammar, too ambiguous); a mask that allows a token the matcher then refuses, or
// refuses one it would take; an accepted text the plain recognizer rejects; a completion
// distance of 0 where the grammar cannot end; a token budget (restrict_to_distance) that lets
// a refused token through, keeps one past its limit while others fit, or refuses them all.
//
// Input: <mode byte> <grammar text> '\0' <choice bytes>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "grammar/grammar.h"
#include "grammar/matcher.h"
#include "grammar/recognizer.h"
#include "grammar/regex.h"

namespace {

using namespace hablar::grammar;

// Every byte as a token (lone UTF-8 lead and continuation bytes included), pieces that
// cross grammar boundaries, whole characters of two to four bytes, and the end of
// generation last. A special token that no grammar may pick sits just before it.
std::shared_ptr<const Vocab> fuzz_vocab() {
  std::vector<std::string> bytes;
  for (int b = 1; b < 256; ++b) bytes.push_back(std::string(1, (char)b));
  for (const char* piece :
       {"{\"", "\":", "\",", "\"}",  "true",     "false", "null",  "  ",  "\n", "\n  ", "ab",
        "abc", "12",  "-1",  "0.",   "e+",       "[1",    "],",    "]]",  "[[", "\\u",  "\\\"",
        "é",   "€",   "😀",   "\xC3", "\xE2\x82", "a\xC3", "\xA9z", "::=", "()", "x*"})
    bytes.push_back(piece);
  bytes.push_back("<special>");
  bytes.push_back("");  // end of generation
  const auto n = (int32_t)bytes.size();
  std::vector<bool> usable((size_t)n, true);
  usable[(size_t)n - 2] = false;
  usable[(size_t)n - 1] = false;
  return std::make_shared<Vocab>(std::move(bytes), usable, std::vector<int32_t>{n - 1});
}

const std::shared_ptr<const Vocab>& vocab() {
  static const std::shared_ptr<const Vocab> v = fuzz_vocab();
  return v;
}

[[noreturn]] void finding(const char* what) {
  fprintf(stderr, "grammar_fuzz: %s\n", what);
  abort();
}

Grammar grammar_of(uint8_t mode, std::string_view text) {
  switch (mode % 3) {
    case 0:
      return parse_gbnf(text);
    case 1: {
      const auto schema = nlohmann::ordered_json::parse(text, nullptr, false);
      if (schema.is_discarded())
        throw hablar::Error(hablar::ErrorKind::kInvalidArgument, "not JSON");
      return parse_gbnf(json_schema_to_gbnf(schema), GbnfSource::kGenerated);
    }
    default:
      return parse_gbnf(regex_to_gbnf(text), GbnfSource::kGenerated);
  }
}

bool allowed(const std::vector<uint32_t>& words, int32_t id) {
  return (words[(size_t)id >> 5] >> (id & 31)) & 1u;
}

// The token budget's restriction (what a sampler does near max_tokens): tokens the mask
// refused stay refused; when some allowed token fits `limit`, exactly the fitting ones stay,
// and each of them is one the matcher takes.
void check_budget(GrammarMatcher& m, const std::vector<uint32_t>& words,
                  const std::vector<int32_t>& ok, int32_t limit) {
  const int32_t n_vocab = vocab()->n_vocab();
  std::vector<float> logits((size_t)n_vocab, -std::numeric_limits<float>::infinity());
  for (const int32_t id : ok) logits[(size_t)id] = 0.0f;
  bool any_fits = false;
  for (const int32_t id : ok) any_fits = any_fits || m.distance_after(id) <= limit;
  const int32_t left = m.restrict_to_distance(logits, limit);
  int32_t finite = 0;
  for (int32_t id = 0; id < n_vocab; ++id) {
    if (logits[(size_t)id] == -std::numeric_limits<float>::infinity()) continue;
    ++finite;
    if (!allowed(words, id)) finding("the budget let a refused token through");
    if (any_fits && m.distance_after(id) > limit) finding("the budget kept a token past its limit");
  }
  if (finite != left) finding("restrict_to_distance miscounted the tokens it left");
  if (any_fits && left == 0) finding("the budget refused every token while some fit");
  if (!any_fits && left != (int32_t)ok.size()) finding("the budget changed a mask none fit");
}

// Walks the grammar with the choice bytes; returns the accepted text.
std::string walk(const Grammar& parsed, std::shared_ptr<const CompiledGrammar> g,
                 std::string_view choices) {
  GrammarMatcher m(std::move(g));
  const int32_t n_vocab = vocab()->n_vocab();
  std::vector<uint32_t> words(((size_t)n_vocab + 31) / 32);
  std::vector<int32_t> ok, refused;
  std::string text;
  for (const char c : choices) {
    if (m.finished()) break;
    const auto choice = (uint8_t)c;
    m.fill_mask(words);
    ok.clear();
    refused.clear();
    for (int32_t id = 0; id < n_vocab; ++id) (allowed(words, id) ? ok : refused).push_back(id);
    const bool can_end = m.can_end();
    if (allowed(words, n_vocab - 1) != can_end) finding("the end of generation's bit is wrong");
    if (m.distance_to_end() == 0 && !can_end) finding("distance 0 where the grammar cannot end");
    if (choice & 2) check_budget(m, words, ok, choice >> 2);
    if ((choice & 1) && !refused.empty()) {  // a refused token must stay refused
      const int32_t id = refused[(size_t)(choice >> 1) % refused.size()];
      if (m.accept_token(id)) finding("the matcher took a token its mask refused");
    }
    if (ok.empty()) break;
    const int32_t id = ok[(size_t)(choice >> 1) % ok.size()];
    if (!m.accept_token(id)) finding("the matcher refused a token its mask allowed");
    if (!vocab()->is_eog(id)) text += vocab()->bytes(id);
  }
  Recognizer rec(parsed);
  RecState st = rec.initial();
  if (!rec.advance_bytes(st, text)) finding("the recognizer rejects the matcher's text");
  return text;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const std::string_view input(reinterpret_cast<const char*>(data) + 1, size - 1);
  const size_t split = input.find('\0');
  const std::string_view text = input.substr(0, split);
  const std::string_view choices =
      split == std::string_view::npos ? std::string_view() : input.substr(split + 1);
  try {
    Grammar parsed = grammar_of(data[0], text);
    auto compiled = compile(parsed, vocab());
    walk(parsed, std::move(compiled), choices);
  } catch (const hablar::Error&) {
    // A refused grammar, or one too ambiguous to follow: the documented errors.
  }
  return 0;
}
