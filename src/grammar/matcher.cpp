#include "grammar/matcher.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <numeric>

#include "core/error.h"
#include "tokenizer/tokenizer.h"

namespace hablar::grammar {

namespace {

// Mask cache entries kept per matcher before it is cleared (a bound on memory: 151,936 bits
// are 19 KB an entry).
constexpr size_t kMaxCachedMasks = 512;
// DFA states kept per matcher before it starts over (each holds 1 KB of transitions).
constexpr size_t kMaxDfaStates = 20000;

}  // namespace

Vocab::Vocab(std::vector<std::string> token_bytes, const std::vector<bool>& usable,
             std::vector<int32_t> eog)
    : bytes_(std::move(token_bytes)), eog_(std::move(eog)) {
  const size_t n = bytes_.size();
  usable_.assign(n, false);
  is_eog_.assign(n, false);
  for (int32_t id : eog_) {
    if (id >= 0 && (size_t)id < n) is_eog_[(size_t)id] = true;
  }
  std::vector<int32_t> order;
  for (size_t i = 0; i < n; ++i) {
    usable_[i] = usable[i] && !is_eog_[i] && !bytes_[i].empty();
    if (usable_[i]) order.push_back((int32_t)i);
  }
  std::sort(order.begin(), order.end(),
            [&](int32_t a, int32_t b) { return bytes_[(size_t)a] < bytes_[(size_t)b]; });
  tokens_ = order;
  // Preorder trie from the sorted list: node (prefix p) covers the run of tokens starting
  // with p; a token equal to p sits first in that run.
  struct Frame {
    int32_t node;
    size_t begin, end;
  };
  std::vector<Frame> stack;
  // Builds children of the range [b, e) whose common prefix has length d.
  auto children = [&](size_t b, size_t e, size_t d, std::vector<Frame>& out) {
    size_t i = b;
    while (i < e && bytes_[(size_t)tokens_[i]].size() == d) ++i;  // tokens ending here
    std::vector<Frame> kids;
    while (i < e) {
      const auto c = (uint8_t)bytes_[(size_t)tokens_[i]][d];
      size_t j = i;
      while (j < e && (uint8_t)bytes_[(size_t)tokens_[j]][d] == c) ++j;
      kids.push_back({-1, i, j});
      i = j;
    }
    // Pushed in reverse so that the first child is processed first.
    for (auto it = kids.rbegin(); it != kids.rend(); ++it) out.push_back(*it);
  };
  // Iterative preorder: each frame makes its node, then its children.
  std::vector<std::pair<Frame, size_t>> work;  // (frame, depth)
  {
    std::vector<Frame> top;
    children(0, tokens_.size(), 0, top);
    for (auto& f : top) work.push_back({f, 1});
  }
  std::vector<int32_t> open;  // nodes whose subtree is still being built, with their depth
  while (!work.empty()) {
    auto [f, depth] = work.back();
    work.pop_back();
    while (!open.empty() && trie_[(size_t)open.back()].depth >= depth) {
      trie_[(size_t)open.back()].end = (int32_t)trie_.size();
      open.pop_back();
    }
    TrieNode node;
    node.byte = (uint8_t)bytes_[(size_t)tokens_[f.begin]][depth - 1];
    node.depth = (uint16_t)depth;
    node.tok_begin = (int32_t)f.begin;
    size_t k = f.begin;
    while (k < f.end && bytes_[(size_t)tokens_[k]].size() == depth) ++k;
    node.tok_end = (int32_t)k;
    max_depth_ = std::max(max_depth_, (int)depth);
    open.push_back((int32_t)trie_.size());
    trie_.push_back(node);
    std::vector<Frame> kids;
    children(f.begin, f.end, depth, kids);
    for (auto& kf : kids) work.push_back({kf, depth + 1});
  }
  while (!open.empty()) {
    trie_[(size_t)open.back()].end = (int32_t)trie_.size();
    open.pop_back();
  }
}

std::shared_ptr<const Vocab> Vocab::from_tokenizer(const tokenizer::Tokenizer& tok) {
  const int32_t n = tok.n_vocab();
  std::vector<std::string> bytes((size_t)n);
  std::vector<bool> usable((size_t)n, false);
  std::vector<int32_t> eog;
  for (int32_t i = 0; i < n; ++i) {
    if (tok.is_eog(i)) eog.push_back(i);
    const auto t = tok.token_type(i);
    if (t == tokenizer::TokenType::kControl || t == tokenizer::TokenType::kUnknown ||
        t == tokenizer::TokenType::kUnused)
      continue;
    bytes[(size_t)i] = tok.token_text(i, /*show_special=*/false, /*first=*/false);
    usable[(size_t)i] = true;
  }
  return std::make_shared<Vocab>(std::move(bytes), usable, std::move(eog));
}

std::shared_ptr<const CompiledGrammar> compile(Grammar g, std::shared_ptr<const Vocab> vocab) {
  auto c = std::make_shared<CompiledGrammar>();
  c->grammar = std::move(g);
  c->vocab = std::move(vocab);
  return c;
}

size_t GrammarMatcher::StateHash::operator()(const RecState& s) const {
  uint64_t h = 1469598103934665603ull ^ s.partial ^ ((uint64_t)s.partial_left << 40) ^
               ((uint64_t)s.partial_len << 48);
  for (int32_t id : s.stacks) h = (h ^ (uint32_t)id) * 1099511628211ull;
  return (size_t)h;
}

GrammarMatcher::GrammarMatcher(std::shared_ptr<const CompiledGrammar> g)
    : g_(std::move(g)), rec_(g_->grammar) {
  walk_.resize((size_t)g_->vocab->max_depth() + 1);
  state_ = intern(rec_.initial());
}

int32_t GrammarMatcher::intern(const RecState& s) {
  auto it = dindex_.find(s);
  if (it != dindex_.end()) return it->second;
  const auto id = (int32_t)dstates_.size();
  dstates_.push_back(s);
  dnext_.emplace_back();
  dnext_.back().fill(kUnknown);
  dindex_.emplace(s, id);
  return id;
}

int32_t GrammarMatcher::step(int32_t from, uint8_t byte) {
  int32_t& slot = dnext_[(size_t)from][byte];
  if (slot != kUnknown) return slot;
  const int32_t next = rec_.advance_byte(dstates_[(size_t)from], byte, scratch_)
                           ? intern(scratch_)
                           : kDead;
  dnext_[(size_t)from][byte] = next;  // `slot` may have moved with dnext_
  return next;
}

// Bounds the DFA's memory: past this many states it starts again from the current one.
void GrammarMatcher::reset_dfa() {
  RecState cur = dstates_[(size_t)state_];
  dstates_.clear();
  dnext_.clear();
  dindex_.clear();
  masks_.clear();
  state_ = intern(cur);
}

bool GrammarMatcher::accept_token(int32_t id) {
  if (finished_ || id < 0 || id >= vocab().n_vocab()) return false;
  if (vocab().is_eog(id)) {
    if (!can_end()) return false;
    finished_ = true;
    return true;
  }
  if (!vocab().usable(id)) return false;
  return accept_bytes(vocab().bytes(id));
}

bool GrammarMatcher::accept_bytes(std::string_view bytes) {
  if (finished_) return false;
  int32_t s = state_;
  for (char c : bytes) {
    s = step(s, (uint8_t)c);
    if (s == kDead) return false;
  }
  state_ = s;
  if (dstates_.size() > kMaxDfaStates) reset_dfa();
  return true;
}

void GrammarMatcher::compute_mask(std::span<uint32_t> words) {
  std::fill(words.begin(), words.end(), 0u);
  const Vocab& v = vocab();
  if (finished_) return;
  if (can_end())
    for (int32_t id : v.eog()) words[(size_t)id >> 5] |= 1u << (id & 31);
  const auto& trie = v.trie();
  const auto& toks = v.trie_tokens();
  walk_[0] = state_;
  for (size_t i = 0; i < trie.size();) {
    const Vocab::TrieNode& node = trie[i];
    const int32_t next = step(walk_[node.depth - 1u], node.byte);
    if (next == kDead) {
      i = (size_t)node.end;
      continue;
    }
    walk_[node.depth] = next;
    for (int32_t k = node.tok_begin; k < node.tok_end; ++k) {
      const int32_t id = toks[(size_t)k];
      words[(size_t)id >> 5] |= 1u << (id & 31);
    }
    ++i;
  }
}

void GrammarMatcher::fill_mask(std::span<uint32_t> words) {
  HABLAR_CHECK(words.size() * 32 >= (size_t)vocab().n_vocab(), "mask too small");
  const size_t n_words = ((size_t)vocab().n_vocab() + 31) / 32;
  auto it = masks_.find(state_);
  if (it != masks_.end()) {
    std::memcpy(words.data(), it->second.data(), n_words * sizeof(uint32_t));
    return;
  }
  compute_mask(words.first(n_words));
  if (masks_.size() >= kMaxCachedMasks) masks_.clear();
  masks_.emplace(state_, std::vector<uint32_t>(words.begin(), words.begin() + (ptrdiff_t)n_words));
}

int32_t GrammarMatcher::apply_mask(std::span<float> logits) {
  const size_t n = std::min(logits.size(), (size_t)vocab().n_vocab());
  mask_.resize((n + 31) / 32);
  fill_mask(mask_);
  int32_t allowed = 0;
  const float ninf = -std::numeric_limits<float>::infinity();
  for (size_t w = 0; w < mask_.size(); ++w) {
    const uint32_t bits = mask_[w];
    const size_t base = w * 32;
    const size_t lim = std::min<size_t>(32, n - base);
    if (bits == 0xFFFFFFFFu && lim == 32) {
      allowed += 32;
      continue;
    }
    allowed += __builtin_popcount(bits);
    for (size_t b = 0; b < lim; ++b)
      if (!((bits >> b) & 1u)) logits[base + b] = ninf;
  }
  for (size_t i = n; i < logits.size(); ++i) logits[i] = ninf;
  return allowed;
}

}  // namespace hablar::grammar
