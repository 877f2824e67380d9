#include "grammar/grammar_cache.h"

namespace hablar::grammar {

std::shared_ptr<const CompiledGrammar> GrammarCache::get(
    const std::string& gbnf, GbnfSource source, const std::shared_ptr<const Vocab>& vocab) {
  // The vocabulary's address names it: a kept grammar holds its vocabulary, so no other can
  // take that address while the entry lives.
  const std::string key = std::to_string(reinterpret_cast<uintptr_t>(vocab.get())) + '/' +
                          (source == GbnfSource::kUser ? 'u' : 'g') + '/' + gbnf;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = entries_.find(key); it != entries_.end()) {
      order_.splice(order_.begin(), order_, it->second.at);
      return it->second.grammar;
    }
  }
  // Compiled outside the lock (milliseconds for a large schema); a grammar another thread
  // kept meanwhile wins, so that its requests share one store.
  std::shared_ptr<const CompiledGrammar> compiled = compile(parse_gbnf(gbnf, source), vocab);
  std::lock_guard<std::mutex> lock(mu_);
  ++compiles_;
  if (auto it = entries_.find(key); it != entries_.end()) return it->second.grammar;
  if (capacity_ == 0) return compiled;
  while (entries_.size() >= capacity_) {
    entries_.erase(order_.back());
    order_.pop_back();
  }
  order_.push_front(key);
  entries_.emplace(key, Entry{compiled, order_.begin()});
  return compiled;
}

size_t GrammarCache::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return entries_.size();
}

int64_t GrammarCache::compiles() const {
  std::lock_guard<std::mutex> lock(mu_);
  return compiles_;
}

}  // namespace hablar::grammar
