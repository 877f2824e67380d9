// A byte trie over token texts, in preorder: node i's subtree is the index range [i, end),
// so a walk skips a whole subtree by jumping to `end`. Each node lists the tokens whose
// bytes are exactly the path to it.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace hablar::grammar {

struct TokenTrie {
  struct Node {
    uint8_t byte = 0;
    uint16_t depth = 0;     // 1 for a first byte
    int32_t end = 0;        // index just past this node's subtree
    int32_t tok_begin = 0;  // tokens spelled exactly by the path to here: tokens[begin, end)
    int32_t tok_end = 0;
  };
  std::vector<Node> nodes;
  std::vector<int32_t> tokens;
  int max_depth = 0;
  std::array<uint64_t, 4> first_bytes{};  // bytes some entry starts with
  std::array<int32_t, 256> first_node{};  // node of each such first byte

  // entries: (bytes, token id), bytes not empty (longer than 65535 bytes: refused).
  static TokenTrie build(std::vector<std::pair<std::string, int32_t>> entries);
};

}  // namespace hablar::grammar
