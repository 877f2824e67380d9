// Prompt lookup (n-gram) drafting: the sequence's last n tokens are looked up earlier in its
// own prompt + output, most recent occurrence first, and the tokens that followed that
// occurrence are proposed. The longest n (size_n_max) is tried first, down to size_n_min.
// No model, no state: strong where the output repeats its input (code edits, RAG answers,
// summaries quoting their source).
#pragma once

#include "engine/drafter.h"

namespace hablar::engine {

struct NgramConfig {
  int32_t size_n_max = 8;  // longest n-gram looked up (--spec-ngram-size-n)
  int32_t size_n_min = 2;  // shortest one tried
};

class NgramDrafter : public Drafter {
 public:
  explicit NgramDrafter(NgramConfig config = {});
  SpecType type() const override { return SpecType::kNgram; }
  void draft(std::span<DraftJob> jobs) override;

  // The proposal for `tokens` (up to n_max tokens; empty when no n-gram matches).
  std::vector<int32_t> lookup(std::span<const int32_t> tokens, int32_t n_max) const;

 private:
  NgramConfig config_;
};

}  // namespace hablar::engine
