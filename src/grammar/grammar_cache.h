// Compiled grammars kept by their text and vocabulary, so that requests that bring the same
// schema (an application's usual case) share one CompiledGrammar and with it the states its
// earlier requests walked (SharedStates). Thread-safe; the least recently used grammar goes
// past the capacity (requests that hold it keep it alive).
#pragma once

#include <cstddef>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "grammar/matcher.h"

namespace hablar::grammar {

class GrammarCache {
 public:
  static constexpr size_t kDefaultCapacity = 16;
  explicit GrammarCache(size_t capacity = kDefaultCapacity) : capacity_(capacity) {}

  // The grammar of `gbnf` over `vocab`, compiled on first use (parse errors propagate and
  // nothing is kept).
  std::shared_ptr<const CompiledGrammar> get(const std::string& gbnf, GbnfSource source,
                                             const std::shared_ptr<const Vocab>& vocab);
  size_t size() const;
  int64_t compiles() const;

 private:
  using Order = std::list<std::string>;  // keys, most recently used first
  struct Entry {
    std::shared_ptr<const CompiledGrammar> grammar;
    Order::iterator at;
  };
  const size_t capacity_;
  mutable std::mutex mu_;
  Order order_;
  std::unordered_map<std::string, Entry> entries_;
  int64_t compiles_ = 0;
};

}  // namespace hablar::grammar
