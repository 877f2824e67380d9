// What one grammar's states give every request that matches it: a state's token mask, its
// distance profile (how many bytes each allowed token leaves to finish a sentence) and its
// masks restricted to a distance. Every request of an application's schema walks the same
// states, and the first walk of a state over a 150k-token vocabulary takes up to
// milliseconds (a profile outside a class run: about 5 ms on Qwen's), so each is computed
// once per grammar, not per request.
//
// Matchers number their states themselves (each has its own stack arena), so entries are
// keyed by a state's content: state_key() writes the partial character and each stack as the
// chain of element positions from its top, the stacks sorted. Thread-safe (a step's masks
// are filled by a pool of threads); entries are immutable once kept and handed out as
// shared pointers. Memory is bounded: past the byte budget nothing more is kept and matchers
// compute what is missing themselves, as without sharing.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <shared_mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace hablar::grammar {

struct RecState;
class StackArena;

// The canonical content of a recognizer state (see above), or "" where it would pass
// max_bytes (a state of thousands of stacks is not worth keeping by its content).
std::string state_key(const RecState& s, const StackArena& arena, size_t max_bytes);

class SharedStates {
 public:
  // Bytes kept per grammar by default: about 1,300 masks of a 150k-token vocabulary, or 150
  // distance profiles.
  static constexpr size_t kDefaultBudget = size_t{24} << 20;

  explicit SharedStates(size_t byte_budget = kDefaultBudget) : budget_(byte_budget) {}

  struct Mask {
    std::vector<uint32_t> words;
  };
  // Per token: its distance after the state, clamped to kOver (also: not allowed there);
  // `most`: the largest over the allowed tokens.
  struct Profile {
    static constexpr uint8_t kOver = 255;
    int32_t most = 0;
    std::vector<uint8_t> per_token;
  };
  // A state's mask restricted to a distance, and the count that restriction returned.
  struct Restricted {
    std::vector<uint32_t> words;
    int32_t result = 0;
  };

  std::shared_ptr<const Mask> mask(const std::string& key) const;
  std::shared_ptr<const Profile> profile(const std::string& key) const;
  std::shared_ptr<const Restricted> restricted(const std::string& key, int32_t distance) const;
  // Each keeps the entry unless the budget is spent and returns the entry now kept under the
  // key (another thread's where one came first), or null.
  std::shared_ptr<const Mask> keep_mask(const std::string& key, std::shared_ptr<const Mask> m);
  std::shared_ptr<const Profile> keep_profile(const std::string& key,
                                              std::shared_ptr<const Profile> p);
  std::shared_ptr<const Restricted> keep_restricted(const std::string& key, int32_t distance,
                                                    std::shared_ptr<const Restricted> r);

  // Whether a mask of this state was computed before (by any matcher of the grammar); notes
  // it otherwise. Masks are kept from their state's second computation on: most states of a
  // document come once per request, and copying a 19 KB mask costs about as much as a
  // cheap mask's computation, so the first request pays no copies and the second the one
  // computation more.
  bool seen_again(const std::string& key);

  size_t bytes_kept() const;
  size_t entries() const;

 private:
  template <typename T>
  using Map = std::unordered_map<std::string, std::shared_ptr<const T>>;
  template <typename T>
  std::shared_ptr<const T> find(const Map<T>& map, const std::string& key) const;
  template <typename T>
  std::shared_ptr<const T> keep(Map<T>& map, const std::string& key, std::shared_ptr<const T> value,
                                size_t bytes);

  const size_t budget_;
  mutable std::shared_mutex mu_;
  size_t bytes_ = 0;
  Map<Mask> masks_;
  Map<Profile> profiles_;
  Map<Restricted> restricted_;  // key: the state's key, '#', the distance
  std::unordered_set<std::string> seen_;
};

}  // namespace hablar::grammar
