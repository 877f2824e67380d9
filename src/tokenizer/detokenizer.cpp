#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

namespace hablar::tokenizer {
namespace {

// Length of the longest prefix of `s` that ends on a UTF-8 character boundary, treating
// a trailing lead byte whose continuation bytes have not all arrived as unfinished.
size_t complete_prefix(std::string_view s) {
  const size_t n = s.size();
  // Look back at most 3 bytes for the lead byte of the last character.
  for (size_t back = 1; back <= 4 && back <= n; ++back) {
    const uint8_t b = static_cast<uint8_t>(s[n - back]);
    if ((b & 0xC0) == 0x80) continue;  // continuation byte: keep looking
    if (b < 0x80) return n;            // ASCII ends the text cleanly
    const size_t need = unicode::utf8_len(b);
    if ((b & 0xC0) == 0xC0 && (b & 0xF8) != 0xF8 && need > back) return n - back;  // unfinished
    return n;
  }
  return n;
}

}  // namespace

IncrementalDetokenizer::IncrementalDetokenizer(const Tokenizer& tok, bool show_special,
                                               bool at_text_start)
    : tok_(tok), show_special_(show_special), first_(at_text_start) {}

std::string IncrementalDetokenizer::push(int32_t id) {
  std::string piece = tok_.token_text(id, show_special_, first_);
  if (!tok_.is_hidden(id, show_special_)) first_ = false;
  pending_ += piece;
  const size_t ready = complete_prefix(pending_);
  std::string out = pending_.substr(0, ready);
  pending_.erase(0, ready);
  return out;
}

std::string IncrementalDetokenizer::flush() {
  std::string out;
  // Whatever is still pending is an unfinished character: U+FFFD for each such sequence.
  size_t pos = 0;
  while (pos < pending_.size()) {
    const size_t start = pos;
    const uint32_t cp = unicode::decode_one(pending_, pos);
    if (cp == 0xFFFD && pending_.compare(start, 3, "\xEF\xBF\xBD") != 0) {
      // Skip the continuation bytes of this broken sequence.
      while (pos < pending_.size() && (static_cast<uint8_t>(pending_[pos]) & 0xC0) == 0x80) ++pos;
      out += "\xEF\xBF\xBD";
    } else {
      out.append(pending_, start, pos - start);
    }
  }
  pending_.clear();
  return out;
}

}  // namespace hablar::tokenizer
