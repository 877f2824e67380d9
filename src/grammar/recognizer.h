// The pushdown recognizer behind every grammar: a set of stacks over the compiled Grammar,
// advanced one byte at a time.
//
// A stack is a chain of nodes (pos, parent): the top node's pos is the terminal (a class
// element) the stack waits for; each node below holds the element to continue with once the
// rule above it ends. Nodes are hash-consed, so equal stacks are the same id, a set of stacks
// is a sorted vector of ids, and a set that comes back (a JSON string's next character, a
// list's next item) is the very same vector, which is what makes mask caching work. A call
// whose next element is its rule's last (x ::= a b c, at c) returns straight to the caller's
// continuation, so right-recursive repetition keeps stacks short.
//
// The empty stack (kAccept) in a set means the input so far is a complete sentence.
// Multi-byte UTF-8 characters are taken a byte at a time: between bytes the state holds the
// partial code point, and only stacks whose class can still match some completion survive.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "grammar/grammar.h"

namespace hablar::grammar {

constexpr int32_t kAccept = -1;

struct StackNode {
  int32_t pos = 0;
  int32_t parent = -1;  // -1: the bottom
};

// Hash-consed stack nodes. Nodes made after a mark() can be dropped with rollback(mark):
// deletions are last-in first-out, which linear probing undoes exactly.
class StackArena {
 public:
  StackArena();
  int32_t node(int32_t pos, int32_t parent);
  const StackNode& at(int32_t id) const { return nodes_[(size_t)id]; }
  size_t mark() const { return nodes_.size(); }
  void rollback(size_t mark);
  size_t size() const { return nodes_.size(); }

 private:
  size_t slot_of(int32_t pos, int32_t parent) const;
  void grow();

  std::vector<StackNode> nodes_;
  std::vector<int32_t> table_;  // node ids, -1 empty; size a power of two
  std::vector<uint32_t> slot_;  // node id -> its table slot (for rollback)
};

struct RecState {
  std::vector<int32_t> stacks;  // sorted, unique stack ids (kAccept first when present)
  uint32_t partial = 0;         // bits of an unfinished UTF-8 character
  uint8_t partial_left = 0;     // continuation bytes still to come (0: none)
  uint8_t partial_len = 0;      // bytes of that character in all (2..4)

  bool empty() const { return stacks.empty(); }
  bool operator==(const RecState& o) const {
    return partial == o.partial && partial_left == o.partial_left && partial_len == o.partial_len &&
           stacks == o.stacks;
  }
};

class Recognizer {
 public:
  // Parses alive at once past which a step throws Error(kResource): a bound on the work an
  // ambiguous grammar can ask for.
  static constexpr size_t kMaxStacks = 20000;

  explicit Recognizer(const Grammar& g);

  RecState initial();
  // next = s after one more byte; false (next empty) when no stack takes it.
  bool advance_byte(const RecState& s, uint8_t b, RecState& next);
  // Feeds bytes in place; false (and s unchanged) when one is refused.
  bool advance_bytes(RecState& s, std::string_view bytes);
  // The input so far is a complete sentence.
  static bool can_end(const RecState& s) {
    return s.partial_left == 0 && !s.stacks.empty() && s.stacks[0] == kAccept;
  }
  // Nothing but the end can follow.
  static bool must_end(const RecState& s) { return can_end(s) && s.stacks.size() == 1; }

  StackArena& arena() { return arena_; }
  const Grammar& grammar() const { return g_; }

 private:
  void expand(int32_t pos, int32_t parent, std::vector<int32_t>& out);
  void advance_cp(const std::vector<int32_t>& stacks, uint32_t cp, std::vector<int32_t>& out);
  static void normalize(std::vector<int32_t>& v);

  const Grammar& g_;
  StackArena arena_;
  std::vector<int32_t> scratch_;
  // (pos, parent) pairs expanded in this step: open addressing, emptied by a new epoch.
  class PairSet {
   public:
    void clear();
    bool insert(uint64_t key);  // false when already there

   private:
    void grow();
    std::vector<uint64_t> keys_ = std::vector<uint64_t>(64);
    std::vector<uint32_t> epoch_of_ = std::vector<uint32_t>(64, 0);
    uint32_t epoch_ = 1;
    size_t count_ = 0;
  };
  PairSet expanded_;
};

}  // namespace hablar::grammar
