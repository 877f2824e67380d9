// grammar_bench: per-token mask time of hablar's grammar engine on one vocabulary.
//
//   grammar_bench VOCAB.gguf CASES.jsonl OUT.jsonl [--dump-vocab FILE]
//
// Each line of CASES is {"schema": {...}, "doc": "..."} (or {"gbnf": "...", "doc": ...}):
// the schema is compiled, the document is tokenized with the vocabulary, and the document's
// tokens are replayed: before each token (and once more at the end, where only EOS may
// follow) the full vocabulary mask is computed and timed; then the token is accepted. Each
// output line gives the token ids, the mask times in ns and the compile time, so that
// bench_grammar.py can replay the same ids through XGrammar; then the same times for a later
// request of the same grammar (the third: a new matcher, the states the first two walked are
// the grammar's, SharedStates), and the time a token budget takes in the last 32 steps of the
// first request that asks for one and of the next. --dump-vocab writes each
// token's bytes as hex, one token a line ("-" for tokens no grammar may produce).
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "formats/gguf.h"
#include "grammar/matcher.h"
#include "grammar/regex.h"
#include "tokenizer/tokenizer.h"

using namespace hablar;
using Clock = std::chrono::steady_clock;

namespace {

double ns_since(Clock::time_point t0) {
  return (double)std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count();
}

void dump_vocab(const grammar::Vocab& v, const std::string& path) {
  std::ofstream out(path);
  static const char* hex = "0123456789abcdef";
  for (int32_t i = 0; i < v.n_vocab(); ++i) {
    if (!v.usable(i)) {
      out << (v.is_eog(i) ? "eog" : "-") << "\n";
      continue;
    }
    for (unsigned char c : v.bytes(i)) out << hex[c >> 4] << hex[c & 15];
    out << "\n";
  }
}

// One request over `ids`: before each token (and once more at the end) the mask is timed;
// with `budget`, within the last kBudgetSteps steps also what a token budget asks there
// (the largest distance after a token, and the mask restricted to the distance now + 8).
constexpr size_t kBudgetSteps = 32;
struct Replay {
  std::vector<double> ns, budget_ns;
  std::vector<int> fresh;  // per step: 1 when the mask was computed (not taken from a cache)
  bool ok = true;
};

Replay replay(const std::shared_ptr<const grammar::CompiledGrammar>& g,
              const std::vector<int32_t>& ids, std::vector<uint32_t>& mask, bool budget) {
  grammar::GrammarMatcher m(g);
  Replay r;
  for (size_t i = 0; i <= ids.size(); ++i) {
    const size_t cached = m.masks_computed();
    auto t0 = Clock::now();
    m.fill_mask(mask);
    r.ns.push_back(ns_since(t0));
    r.fresh.push_back(m.masks_computed() != cached ? 1 : 0);
    if (budget && i + kBudgetSteps >= ids.size()) {
      t0 = Clock::now();
      if (m.max_distance_after() > m.distance_to_end() + 8)
        m.restrict_mask_to_distance(mask, m.distance_to_end() + 8);
      r.budget_ns.push_back(ns_since(t0));
    }
    if (i == ids.size()) break;
    if (!m.accept_token(ids[i])) {
      r.ok = false;
      return r;
    }
  }
  r.ok = m.can_end();
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr,
                 "usage: grammar_bench VOCAB.gguf CASES.jsonl OUT.jsonl [--dump-vocab F]\n");
    return 2;
  }
  auto file = gguf::GgufFile::open(argv[1]);
  auto tok = tokenizer::Tokenizer::from_gguf(file);
  auto t0 = Clock::now();
  auto vocab = grammar::Vocab::from_tokenizer(*tok);
  std::fprintf(stderr, "vocab %d tokens, trie %zu nodes, built in %.1f ms\n", vocab->n_vocab(),
               vocab->trie().size(), ns_since(t0) / 1e6);
  if (argc >= 6 && std::string(argv[4]) == "--dump-vocab") dump_vocab(*vocab, argv[5]);
  std::ifstream in(argv[2]);
  std::ofstream out(argv[3]);
  std::vector<uint32_t> mask(((size_t)vocab->n_vocab() + 31) / 32);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    const auto c = nlohmann::ordered_json::parse(line);
    t0 = Clock::now();
    const std::string gbnf = c.contains("gbnf") ? c["gbnf"].get<std::string>()
                                                : grammar::json_schema_to_gbnf(c["schema"]);
    auto g = grammar::compile(grammar::parse_gbnf(gbnf, grammar::GbnfSource::kGenerated), vocab);
    const double compile_ns = ns_since(t0);
    const std::string doc = c["doc"].get<std::string>();
    const auto ids = tok->encode(doc, false, false);
    // Masks alone: the second request computes again what the first computed once (a state's
    // mask is kept from its second computation on); the third is what later requests see.
    // Then two requests under a token budget: the first walks the distance profiles.
    const Replay first = replay(g, ids, mask, false), second = replay(g, ids, mask, false),
                 later = replay(g, ids, mask, false), budget_first = replay(g, ids, mask, true),
                 budget_later = replay(g, ids, mask, true);
    if (!first.ok) std::fprintf(stderr, "refused or incomplete: %s\n", doc.c_str());
    nlohmann::json r = {
        {"ids", ids},
        {"ns", first.ns},
        {"fresh", first.fresh},
        {"budget_ns", budget_first.budget_ns},
        {"ns_later", later.ns},
        {"budget_ns_later", budget_later.budget_ns},
        {"compile_ns", compile_ns},
        {"ok", first.ok && second.ok && later.ok && budget_first.ok && budget_later.ok}};
    out << r.dump() << "\n";
  }
  return 0;
}
