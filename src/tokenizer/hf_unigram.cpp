// tokenizer.json Unigram model: the segmentation of a piece into vocabulary pieces with the
// highest total score (Viterbi over character boundaries). A character no piece starts
// with becomes unk, scored (lowest score - 10) as `tokenizers` does; consecutive unks fuse
// into one, and with byte_fallback an unknown run becomes its bytes as <0xNN> tokens.
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <string>

#include "core/error.h"
#include "formats/hf_json.h"
#include "tokenizer/hf_pipeline.h"
#include "tokenizer/tokenizer_impl.h"
#include "tokenizer/unicode.h"

namespace hablar::tokenizer::hf {
namespace {

using nlohmann::json;

constexpr double kUnkPenalty = 10.0;

// A score as `tokenizers` holds it. Its JSON reader does not round every number correctly:
// it gathers the decimal digits into a 64-bit integer (digits past that are dropped), turns
// the integer into a double and then multiplies or divides by the power of ten, rounding
// twice, so about a fifth of a trained vocabulary's 17-digit scores end one ulp away from
// the correctly rounded value. Unigram segmentations whose totals differ only in those last
// bits (a piece and its doubling, "X" + "XX" against "XX" + "X") are then decided by them,
// so the scores are taken the same way: from the number's shortest decimal form (what the
// library and Python write), which the correctly parsed value gives back.
double library_rounded(double parsed) {
  char text[64];
  const auto [end, ec] = std::to_chars(text, text + sizeof text, parsed);
  if (ec != std::errc() || !std::isfinite(parsed)) return parsed;
  const char* p = text;
  const bool negative = *p == '-';
  if (negative) ++p;
  uint64_t significand = 0;
  int exponent = 0;
  bool full = false;  // the next digit would overflow the integer: later ones are dropped
  bool fraction = false;
  for (; p < end && *p != 'e'; ++p) {
    if (*p == '.') {
      fraction = true;
      continue;
    }
    const uint64_t digit = (uint64_t)(*p - '0');
    const uint64_t max = std::numeric_limits<uint64_t>::max();
    full = full || significand > max / 10 || (significand == max / 10 && digit > max % 10);
    if (full) {
      exponent += fraction ? 0 : 1;
      continue;
    }
    significand = significand * 10 + digit;
    exponent -= fraction ? 1 : 0;
  }
  if (p < end) exponent += std::atoi(p + 1);  // after 'e'
  double value = (double)significand;
  while (value != 0.0 && std::abs(exponent) > 308) {  // (only past double's own range)
    if (exponent > 0) return parsed;
    value /= 1e308, exponent += 308;
  }
  // The power of ten correctly rounded (exact up to 1e22), as the library's table holds it.
  const double scale = std::strtod(("1e" + std::to_string(std::abs(exponent))).c_str(), nullptr);
  value = exponent >= 0 ? value * scale : value / scale;
  return negative ? -value : value;
}

class Unigram final : public Model {
 public:
  Unigram(const json& j, const std::string& at) {
    const json* vocab = formats::json_array_or_null(j, "vocab", at);
    if (!vocab || vocab->empty())
      throw_error(ErrorKind::kFormat, at + ": vocab must be a non-empty array");
    if (vocab->size() >= (1u << 22)) throw_error(ErrorKind::kFormat, at + ": vocab is too large");
    double min_score = std::numeric_limits<double>::infinity();
    for (const json& e : *vocab) {
      if (!e.is_array() || e.size() != 2 || !e[0].is_string() || !e[1].is_number())
        throw_error(ErrorKind::kFormat, at + ": a vocab entry must be [piece, score]");
      const int32_t id = (int32_t)by_id_.size();
      by_id_.push_back(e[0].get<std::string>());
      scores_.push_back(library_rounded(e[1].get<double>()));
      min_score = std::min(min_score, scores_.back());
      ids_.emplace(by_id_.back(), id);
      if (!by_id_.back().empty()) trie_.add(by_id_.back(), id);
    }
    unk_score_ = min_score - kUnkPenalty;
    const int64_t unk = formats::json_int_or(j, "unk_id", -1, at);
    if (unk >= (int64_t)by_id_.size())
      throw_error(ErrorKind::kFormat, at + ": unk_id is outside the vocabulary");
    unk_ = (int32_t)unk;
    byte_fallback_ = formats::json_bool_or(j, "byte_fallback", false, at);
  }

  void encode(std::string_view piece, std::vector<int32_t>& out) const override {
    const size_t n = piece.size();
    struct Node {
      double score = -std::numeric_limits<double>::infinity();
      size_t from = SIZE_MAX;  // start of the last token of the best path ending here
      int32_t id = -1;
    };
    std::vector<Node> best(n + 1);
    best[0].score = 0, best[0].from = 0;
    for (size_t pos = 0; pos < n;) {
      const size_t clen = std::min(unicode::utf8_len((uint8_t)piece[pos]), n - pos);
      if (best[pos].from == SIZE_MAX) {  // unreachable (cannot happen: unk covers each char)
        pos += clen;
        continue;
      }
      bool single = false;
      const double here = best[pos].score;
      trie_.match_at(piece, pos, [&](int32_t id) {
        const size_t end = pos + by_id_[(size_t)id].size();
        const double s = here + scores_[(size_t)id];
        if (best[end].from == SIZE_MAX || s > best[end].score) best[end] = {s, pos, id};
        single |= end == pos + clen;
      });
      if (!single) {
        const double s = here + unk_score_;
        Node& t = best[pos + clen];
        if (t.from == SIZE_MAX || s > t.score) t = {s, pos, -1};
      }
      pos += clen;
    }
    // Back from the end: tokens in reverse, unknown spans (id -1) fused.
    std::vector<std::pair<size_t, size_t>> spans;  // [begin, end) of each token
    std::vector<int32_t> ids;
    for (size_t end = n; end > 0;) {
      const Node& nd = best[end];
      if (nd.id < 0 && !ids.empty() && ids.back() < 0)
        spans.back().first = nd.from;
      else
        spans.emplace_back(nd.from, end), ids.push_back(nd.id);
      end = nd.from;
    }
    for (size_t k = ids.size(); k-- > 0;) {
      if (ids[k] >= 0) {
        out.push_back(ids[k]);
      } else if (byte_fallback_) {
        for (size_t i = spans[k].first; i < spans[k].second; ++i) {
          static const char* kHex = "0123456789ABCDEF";
          const uint8_t b = (uint8_t)piece[i];
          auto it = ids_.find(std::string{'<', '0', 'x', kHex[b >> 4], kHex[b & 15], '>'});
          if (it != ids_.end())
            out.push_back(it->second);
          else if (unk_ >= 0)
            out.push_back(unk_);
        }
      } else if (unk_ >= 0) {
        out.push_back(unk_);
      }
    }
  }
  const std::vector<std::string>& id_to_token() const override { return by_id_; }
  int32_t unk_id() const override { return unk_; }
  bool byte_fallback() const override { return byte_fallback_; }

 private:
  std::vector<std::string> by_id_;
  std::vector<double> scores_;
  Vocab ids_;
  SpecialTrie trie_;
  double unk_score_ = 0;
  int32_t unk_ = -1;
  bool byte_fallback_ = false;
};

}  // namespace

std::unique_ptr<Model> make_unigram(const json& j, const std::string& at) {
  return std::make_unique<Unigram>(j, at);
}

}  // namespace hablar::tokenizer::hf
