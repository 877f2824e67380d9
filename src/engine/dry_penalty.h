// DRY ("don't repeat yourself"), llama.cpp's repetition sampler: a token that would extend a
// sequence already seen earlier in the history, once that sequence is at least
// allowed_length tokens long, loses multiplier * base^(length - allowed_length) from its
// logit. Sequence breakers (by default newline, ':', '"', '*') end the repetition a match may
// span: the match of the history's end is cut at the latest breaker.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <unordered_map>
#include <vector>

namespace hablar::engine {

// Breakers resolved against a vocabulary: each head token mapped to the token sequences that
// must follow it to complete a breaker (empty: the head alone is one, e.g. every token whose
// text holds "\n"). Built once per breaker list and model by the server (dry_breakers.h).
struct DryBreakers {
  std::unordered_multimap<int32_t, std::vector<int32_t>> heads;
  // Whether `token` is a breaker by itself (a head with an empty tail).
  bool breaks_alone(int32_t token) const;
};

struct DryParams {
  float multiplier = 0.0f;                      // 0 = off
  float base = 1.75f;                           // >= 1
  int32_t allowed_length = 2;                   // repetitions up to this long go unpunished
  int32_t penalty_last_n = 64;                  // history scanned; -1 = all of it, 0 = off
  std::shared_ptr<const DryBreakers> breakers;  // null: none

  bool on() const { return multiplier > 0.0f && base >= 1.0f && penalty_last_n != 0; }
  void validate() const;  // Error(kInvalidArgument) naming the bad field
};

// token -> penalty to subtract from its logit, for the tokens that would extend a repetition.
std::unordered_map<int32_t, float> dry_penalties(const DryParams& p,
                                                 std::span<const int32_t> history);

}  // namespace hablar::engine
