#include "grammar/token_trie.h"

#include <algorithm>

#include "core/error.h"

namespace hablar::grammar {

TokenTrie TokenTrie::build(std::vector<std::pair<std::string, int32_t>> entries) {
  TokenTrie t;
  std::sort(entries.begin(), entries.end());
  for (const auto& e : entries)
    HABLAR_CHECK(!e.first.empty() && e.first.size() < 65536, "token text out of range");
  t.tokens.reserve(entries.size());
  for (const auto& e : entries) t.tokens.push_back(e.second);
  auto text = [&](size_t i) -> const std::string& { return entries[i].first; };
  // A frame is the run [begin, end) of entries sharing the prefix of length depth - 1 plus
  // one more byte; a node is made for it, then its children (pushed last-first).
  struct Frame {
    size_t begin, end, depth;
  };
  std::vector<Frame> work;
  auto push_children = [&](size_t b, size_t e, size_t d) {
    size_t i = b;
    while (i < e && text(i).size() == d) ++i;  // entries ending at this node
    std::vector<Frame> kids;
    while (i < e) {
      const char c = text(i)[d];
      size_t j = i;
      while (j < e && text(j)[d] == c) ++j;
      kids.push_back({i, j, d + 1});
      i = j;
    }
    for (auto it = kids.rbegin(); it != kids.rend(); ++it) work.push_back(*it);
  };
  push_children(0, entries.size(), 0);
  std::vector<int32_t> open;  // nodes whose subtree is still being filled
  while (!work.empty()) {
    const Frame f = work.back();
    work.pop_back();
    while (!open.empty() && t.nodes[(size_t)open.back()].depth >= f.depth) {
      t.nodes[(size_t)open.back()].end = (int32_t)t.nodes.size();
      open.pop_back();
    }
    Node node;
    node.byte = (uint8_t)text(f.begin)[f.depth - 1];
    node.depth = (uint16_t)f.depth;
    node.tok_begin = (int32_t)f.begin;
    size_t k = f.begin;
    while (k < f.end && text(k).size() == f.depth) ++k;
    node.tok_end = (int32_t)k;
    t.max_depth = std::max(t.max_depth, (int)f.depth);
    open.push_back((int32_t)t.nodes.size());
    t.nodes.push_back(node);
    push_children(f.begin, f.end, f.depth);
  }
  for (int32_t n : open) t.nodes[(size_t)n].end = (int32_t)t.nodes.size();
  t.first_node.fill(-1);
  for (size_t i = 0; i < t.nodes.size(); i = (size_t)t.nodes[i].end) {
    const uint8_t b = t.nodes[i].byte;
    t.first_node[b] = (int32_t)i;
    t.first_bytes[b >> 6] |= uint64_t{1} << (b & 63);
  }
  return t;
}

}  // namespace hablar::grammar
