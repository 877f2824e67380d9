#include "grammar/recognizer.h"

#include <algorithm>

#include "core/error.h"

namespace hablar::grammar {

namespace {

inline uint64_t mix(int32_t pos, int32_t parent) {
  uint64_t h = ((uint64_t)(uint32_t)pos << 32) | (uint32_t)parent;
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  return h;
}

}  // namespace

StackArena::StackArena() : table_(1024, -1) {}

size_t StackArena::slot_of(int32_t pos, int32_t parent) const {
  const size_t mask = table_.size() - 1;
  size_t i = mix(pos, parent) & mask;
  while (table_[i] >= 0) {
    const StackNode& n = nodes_[(size_t)table_[i]];
    if (n.pos == pos && n.parent == parent) return i;
    i = (i + 1) & mask;
  }
  return i;
}

void StackArena::grow() {
  std::vector<int32_t> old(table_.size() * 2, -1);
  table_.swap(old);
  const size_t mask = table_.size() - 1;
  // Re-insert in id order, so that later nodes still sit after earlier ones on their probe
  // path (rollback relies on it).
  for (size_t id = 0; id < nodes_.size(); ++id) {
    size_t i = mix(nodes_[id].pos, nodes_[id].parent) & mask;
    while (table_[i] >= 0) i = (i + 1) & mask;
    table_[i] = (int32_t)id;
    slot_[id] = (uint32_t)i;
  }
}

int32_t StackArena::node(int32_t pos, int32_t parent) {
  const size_t i = slot_of(pos, parent);
  if (table_[i] >= 0) return table_[i];
  const auto id = (int32_t)nodes_.size();
  nodes_.push_back({pos, parent});
  slot_.push_back((uint32_t)i);
  table_[i] = id;
  if (nodes_.size() * 2 > table_.size()) grow();
  return id;
}

void StackArena::rollback(size_t mark) {
  while (nodes_.size() > mark) {
    table_[slot_.back()] = -1;
    slot_.pop_back();
    nodes_.pop_back();
  }
}

Recognizer::Recognizer(const Grammar& g) : g_(g) {}

void Recognizer::PairSet::clear() {
  count_ = 0;
  if (++epoch_ == 0) {  // wrapped: forget every old epoch
    std::fill(epoch_of_.begin(), epoch_of_.end(), 0u);
    epoch_ = 1;
  }
}

bool Recognizer::PairSet::insert(uint64_t key) {
  if ((count_ + 1) * 2 > keys_.size()) grow();
  const size_t mask = keys_.size() - 1;
  size_t i = (size_t)(key * 0x9E3779B97F4A7C15ull >> 20) & mask;
  while (epoch_of_[i] == epoch_) {
    if (keys_[i] == key) return false;
    i = (i + 1) & mask;
  }
  keys_[i] = key;
  epoch_of_[i] = epoch_;
  ++count_;
  return true;
}

void Recognizer::PairSet::grow() {
  std::vector<uint64_t> old_keys(keys_.size() * 2);
  std::vector<uint32_t> old_epochs(keys_.size() * 2, 0);
  old_keys.swap(keys_);
  old_epochs.swap(epoch_of_);
  const uint32_t live = epoch_;
  count_ = 0;
  for (size_t i = 0; i < old_keys.size(); ++i)
    if (old_epochs[i] == live) insert(old_keys[i]);
}

void Recognizer::normalize(std::vector<int32_t>& v) {
  std::sort(v.begin(), v.end());
  v.erase(std::unique(v.begin(), v.end()), v.end());
}

void Recognizer::expand(int32_t pos, int32_t parent, std::vector<int32_t>& out) {
  for (;;) {
    // The same (element, continuation) reached twice in one step expands the same way:
    // once is enough (without this, nullable alternatives multiply the paths).
    if (!expanded_.insert(((uint64_t)(uint32_t)pos << 32) | (uint32_t)parent)) return;
    const Elem& e = g_.elems[(size_t)pos];
    if (e.kind == ElemKind::kClass) {
      out.push_back(arena_.node(pos, parent));
      return;
    }
    if (e.kind == ElemKind::kEnd) {
      if (parent < 0) {
        out.push_back(kAccept);
        return;
      }
      const StackNode n = arena_.at(parent);
      pos = n.pos;
      parent = n.parent;
      continue;
    }
    // A rule: each alternative, returning to the element after the reference (or straight
    // to our own caller when the reference is the last element).
    const int32_t ret =
        g_.elems[(size_t)pos + 1].kind == ElemKind::kEnd ? parent : arena_.node(pos + 1, parent);
    const auto& alts = g_.rule_alts[e.id];
    for (size_t k = 0; k + 1 < alts.size(); ++k) expand((int32_t)alts[k], ret, out);
    pos = (int32_t)alts.back();
    parent = ret;
  }
}

RecState Recognizer::initial() {
  RecState s;
  expanded_.clear();
  const auto& alts = g_.rule_alts[g_.root];
  for (uint32_t a : alts) expand((int32_t)a, -1, s.stacks);
  normalize(s.stacks);
  return s;
}

void Recognizer::advance_cp(const std::vector<int32_t>& stacks, uint32_t cp,
                            std::vector<int32_t>& out) {
  out.clear();
  expanded_.clear();
  for (int32_t id : stacks) {
    if (id == kAccept) continue;
    const StackNode n = arena_.at(id);
    if (!g_.classes[g_.elems[(size_t)n.pos].id].matches(cp)) continue;
    expand(n.pos + 1, n.parent, out);
  }
  normalize(out);
  if (out.size() > kMaxStacks)
    throw_error(ErrorKind::kResource, "the grammar is too ambiguous: more than " +
                                          std::to_string(kMaxStacks) + " parses at once");
}

bool Recognizer::advance_byte(const RecState& s, uint8_t b, RecState& next) {
  // Smallest code point of each encoded length: anything below is an overlong form.
  static constexpr uint32_t kMinOfLen[5] = {0, 0, 0x80, 0x800, 0x10000};
  next.stacks.clear();
  if (s.partial_left == 0) {
    if (b < 0x80) {
      next.partial = 0;
      next.partial_left = next.partial_len = 0;
      advance_cp(s.stacks, b, next.stacks);
      return !next.stacks.empty();
    }
    int n = (b >> 5) == 0x6 ? 2 : (b >> 4) == 0xE ? 3 : (b >> 3) == 0x1E ? 4 : 0;
    if (n == 0) return false;
    next.partial = b & (0x7Fu >> n);
    next.partial_left = (uint8_t)(n - 1);
    next.partial_len = (uint8_t)n;
  } else {
    if ((b & 0xC0) != 0x80) return false;
    next.partial = (s.partial << 6) | (b & 0x3F);
    next.partial_left = (uint8_t)(s.partial_left - 1);
    next.partial_len = s.partial_len;
    if (next.partial_left == 0) {
      const uint32_t cp = next.partial;
      next.partial = 0;
      next.partial_len = 0;
      if (cp < kMinOfLen[s.partial_len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
        return false;
      advance_cp(s.stacks, cp, next.stacks);
      return !next.stacks.empty();
    }
  }
  // Mid-character: keep the stacks whose class meets some valid completion of these bits.
  const int shift = 6 * next.partial_left;
  const uint32_t lo = std::max(next.partial << shift, kMinOfLen[next.partial_len]);
  const uint32_t hi = std::min((next.partial << shift) | ((1u << shift) - 1), 0x10FFFFu);
  if (lo > hi) return false;
  for (int32_t id : s.stacks) {
    if (id == kAccept) continue;
    const StackNode& n = arena_.at(id);
    if (g_.classes[g_.elems[(size_t)n.pos].id].intersects(lo, hi)) next.stacks.push_back(id);
  }
  return !next.stacks.empty();
}

bool Recognizer::advance_bytes(RecState& s, std::string_view bytes) {
  RecState cur = s, nxt;
  for (char c : bytes) {
    if (!advance_byte(cur, (uint8_t)c, nxt)) return false;
    std::swap(cur, nxt);
  }
  s = std::move(cur);
  return true;
}

}  // namespace hablar::grammar
