// Splitting special tokens out of the text before encoding.
//
// Semantics (those of the reference tokenizer): special tokens are taken longest text
// first; for each, its leftmost non-overlapping occurrences that lie wholly inside text not
// yet claimed become that token. A token marked lstrip / rstrip also swallows the ASCII
// white space next to it on that side. Whatever is left is raw text for the encoder.
#include <algorithm>

#include "tokenizer/tokenizer_impl.h"

namespace hablar::tokenizer {

void SpecialTrie::add(std::string_view text, int32_t rank) {
  int32_t node = root_[static_cast<uint8_t>(text[0])];
  if (node == 0) {
    node = static_cast<int32_t>(nodes_.size());
    nodes_.emplace_back();
    root_[static_cast<uint8_t>(text[0])] = node;
  }
  for (size_t i = 1; i < text.size(); ++i) {
    const uint8_t b = static_cast<uint8_t>(text[i]);
    int32_t next = child(nodes_[node], b);
    if (next == 0) {
      next = static_cast<int32_t>(nodes_.size());
      nodes_.emplace_back();
      nodes_[node].edges.emplace_back(b, next);
    }
    node = next;
  }
  if (nodes_[node].rank < 0) nodes_[node].rank = rank;
}

namespace {

enum : uint8_t { kFree = 0, kClaimed = 1, kStripped = 2 };

bool ascii_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r';
}

}  // namespace

std::vector<Fragment> Tokenizer::Impl::partition(std::string_view text, bool parse_special,
                                                 std::span<const uint32_t> text_only) const {
  std::vector<Fragment> frags;
  if (text.empty()) return frags;
  const SpecialTrie& trie = parse_special ? all_specials : user_specials;
  // Every occurrence of every special token: (rank, position).
  std::vector<std::pair<int32_t, uint32_t>> hits;
  if (!trie.empty()) {
    for (size_t pos = 0; pos < text.size(); ++pos)
      trie.match_at(text, pos, [&](int32_t rank) { hits.emplace_back(rank, pos); });
  }
  if (hits.empty()) {
    frags.push_back({0, text.size(), -1});
    return frags;
  }
  std::sort(hits.begin(), hits.end());
  std::vector<uint8_t> state(text.size(), kFree);
  std::vector<std::pair<size_t, int32_t>> matches;  // (position, token id)
  int32_t current_rank = -1;
  size_t rank_end = 0;  // end of the last accepted occurrence of the current token
  for (const auto& [rank, pos] : hits) {
    if (rank != current_rank) current_rank = rank, rank_end = 0;
    const int32_t id = special_tokens[rank];
    const size_t len = texts[id].size();
    if (pos < rank_end) continue;
    // A position that must stay text inside [pos, pos + len) rules this occurrence out.
    auto blocked = std::lower_bound(text_only.begin(), text_only.end(), (uint32_t)pos);
    if (blocked != text_only.end() && *blocked < pos + len) continue;
    if (std::any_of(state.begin() + pos, state.begin() + pos + len,
                    [](uint8_t s) { return s != kFree; }))
      continue;
    std::fill(state.begin() + pos, state.begin() + pos + len, kClaimed);
    matches.emplace_back(pos, id);
    rank_end = pos + len;
    if (lstrip[id])
      for (size_t i = pos; i > 0 && state[i - 1] == kFree && ascii_space(text[i - 1]); --i)
        state[i - 1] = kStripped;
    if (rstrip[id])
      for (size_t i = pos + len; i < text.size() && state[i] == kFree && ascii_space(text[i]); ++i)
        state[i] = kStripped;
  }
  std::sort(matches.begin(), matches.end());
  size_t m = 0;
  for (size_t pos = 0; pos < text.size();) {
    if (state[pos] == kClaimed) {
      const int32_t id = matches[m++].second;
      frags.push_back({pos, texts[id].size(), id});
      pos += texts[id].size();
    } else if (state[pos] == kStripped) {
      ++pos;
    } else {
      size_t end = pos;
      while (end < text.size() && state[end] == kFree) ++end;
      frags.push_back({pos, end - pos, -1});
      pos = end;
    }
  }
  return frags;
}

}  // namespace hablar::tokenizer
