#include "grammar/completion_length.h"

#include <algorithm>

namespace hablar::grammar {

int32_t class_min_bytes(const CharClass& c) {
  // UTF-8 lengths 1..4 cover these code point ranges.
  static constexpr uint32_t kUpper[4] = {0x7F, 0x7FF, 0xFFFF, 0x10FFFF};
  uint32_t lo = 0;
  for (int len = 1; len <= 4; ++len) {
    if (c.intersects(lo, kUpper[len - 1])) return len;
    lo = kUpper[len - 1] + 1;
  }
  return kNoCompletion;
}

namespace {

// tail[] of every alternative from the rules' current lengths; true when some value fell.
bool relax_tails(const Grammar& g, const std::vector<int32_t>& class_bytes,
                 const std::vector<int32_t>& rule_len, std::vector<int32_t>& tail) {
  bool changed = false;
  for (const auto& alts : g.rule_alts) {
    for (uint32_t start : alts) {
      size_t end = start;
      while (g.elems[end].kind != ElemKind::kEnd) ++end;
      int32_t sum = 0;
      tail[end] = 0;
      for (size_t i = end; i-- > start;) {
        const Elem& e = g.elems[i];
        const int32_t cost = e.kind == ElemKind::kClass ? class_bytes[e.id] : rule_len[e.id];
        sum = add_lengths(sum, cost);
        if (sum < tail[i]) tail[i] = sum, changed = true;
      }
    }
  }
  return changed;
}

}  // namespace

std::vector<int32_t> completion_tails(const Grammar& g) {
  std::vector<int32_t> class_bytes(g.classes.size());
  for (size_t k = 0; k < g.classes.size(); ++k) class_bytes[k] = class_min_bytes(g.classes[k]);
  std::vector<int32_t> tail(g.elems.size(), kNoCompletion);
  std::vector<int32_t> rule_len(g.n_rules(), kNoCompletion);
  // Bellman-Ford style: each round can only lower values, and a shortest completion uses
  // each rule at most once per nesting level, so this ends within n_rules + 1 rounds.
  for (size_t round = 0; round <= g.n_rules() + 1; ++round) {
    bool changed = relax_tails(g, class_bytes, rule_len, tail);
    for (size_t r = 0; r < g.n_rules(); ++r) {
      int32_t best = kNoCompletion;
      for (uint32_t start : g.rule_alts[r]) best = std::min(best, tail[start]);
      if (best < rule_len[r]) rule_len[r] = best, changed = true;
    }
    if (!changed) break;
  }
  return tail;
}

}  // namespace hablar::grammar
