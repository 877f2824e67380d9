#include "engine/drafter_ngram.h"

#include <algorithm>

#include "core/error.h"

namespace hablar::engine {

SpecType spec_type_from_name(const std::string& name) {
  if (name == "none") return SpecType::kNone;
  if (name == "ngram" || name == "ngram-simple") return SpecType::kNgram;
  if (name == "draft" || name == "draft-simple") return SpecType::kDraft;
  if (name == "self") return SpecType::kSelf;
  throw_error(ErrorKind::kInvalidArgument,
              "unknown speculative decoding type '" + name +
                  "' (expected none, ngram, draft or self; llama.cpp's ngram-simple and "
                  "draft-simple are accepted too)");
}

const char* spec_type_name(SpecType type) {
  switch (type) {
    case SpecType::kNone:
      return "none";
    case SpecType::kNgram:
      return "ngram";
    case SpecType::kDraft:
      return "draft";
    case SpecType::kSelf:
      return "self";
  }
  return "none";
}

void DraftParams::validate() const {
  if (n_max < 0 || n_max > 256)
    throw_error(
        ErrorKind::kInvalidArgument,
        "speculative n_max (--draft-max) must be in [0, 256], got " + std::to_string(n_max));
  if (n_min < 0 || n_min > 256)
    throw_error(
        ErrorKind::kInvalidArgument,
        "speculative n_min (--draft-min) must be in [0, 256], got " + std::to_string(n_min));
  if (!(p_min >= 0.0f && p_min <= 1.0f))
    throw_error(
        ErrorKind::kInvalidArgument,
        "speculative p_min (--draft-p-min) must be in [0, 1], got " + std::to_string(p_min));
}

NgramDrafter::NgramDrafter(NgramConfig config) : config_(config) {
  if (config_.size_n_min < 1 || config_.size_n_max < config_.size_n_min || config_.size_n_max > 64)
    throw_error(ErrorKind::kInvalidArgument,
                "n-gram drafting: need 1 <= size_n_min <= size_n_max <= 64 (--spec-ngram-size-n)");
}

std::vector<int32_t> NgramDrafter::lookup(std::span<const int32_t> tokens, int32_t n_max) const {
  const int32_t len = (int32_t)tokens.size();
  if (n_max <= 0) return {};
  for (int32_t n = std::min(config_.size_n_max, len - 1); n >= config_.size_n_min; --n) {
    const int32_t* tail = tokens.data() + (len - n);
    // Occurrences ending before the tail itself, most recent first; the proposal is what
    // followed (it may run into the tail: a repeating pattern continues).
    for (int32_t start = len - n - 1; start >= 0; --start) {
      if (tokens[(size_t)start] != tail[0] || !std::equal(tail, tail + n, tokens.data() + start))
        continue;
      const int32_t from = start + n;
      const int32_t count = std::min(n_max, len - from);
      if (count <= 0) continue;
      return std::vector<int32_t>(tokens.begin() + from, tokens.begin() + from + count);
    }
  }
  return {};
}

void NgramDrafter::draft(std::span<DraftJob> jobs) {
  for (DraftJob& j : jobs) j.draft = lookup(j.seq->tokens, j.n_max);
}

}  // namespace hablar::engine
