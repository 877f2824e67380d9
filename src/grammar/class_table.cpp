#include "grammar/class_table.h"

namespace hablar::grammar {

size_t decode_utf8_strict(const char* s, size_t n, uint32_t& cp) {
  const auto b0 = (unsigned char)s[0];
  if (b0 < 0x80) {
    cp = b0;
    return 1;
  }
  const size_t len = (b0 >> 5) == 0x6 ? 2 : (b0 >> 4) == 0xE ? 3 : (b0 >> 3) == 0x1E ? 4 : 0;
  if (len == 0 || len > n) return 0;
  uint32_t v = b0 & (0x7Fu >> len);
  for (size_t i = 1; i < len; ++i) {
    const auto b = (unsigned char)s[i];
    if ((b & 0xC0) != 0x80) return 0;
    v = (v << 6) | (b & 0x3F);
  }
  static constexpr uint32_t kMin[5] = {0, 0, 0x80, 0x800, 0x10000};
  if (v < kMin[len] || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) return 0;
  cp = v;
  return len;
}

namespace {

// Whether s (not empty) is the start of a valid UTF-8 character cut off before its end.
bool cut_off_start(const char* s, size_t n) {
  const auto b0 = (unsigned char)s[0];
  const size_t len = (b0 >= 0xC2 && b0 <= 0xDF)   ? 2
                     : (b0 >> 4) == 0xE           ? 3
                     : (b0 >= 0xF0 && b0 <= 0xF4) ? 4
                                                  : 0;
  if (len == 0 || n >= len) return false;
  for (size_t i = 1; i < n; ++i) {
    const auto b = (unsigned char)s[i];
    if ((b & 0xC0) != 0x80) return false;
    if (i == 1 && ((b0 == 0xE0 && b < 0xA0) || (b0 == 0xED && b > 0x9F) ||
                   (b0 == 0xF0 && b < 0x90) || (b0 == 0xF4 && b > 0x8F)))
      return false;
  }
  return true;
}

// Whether the class holds every non-ASCII character (surrogates aside).
bool holds_non_ascii(const CharClass& c) {
  if (!c.negated) return false;
  for (const CharRange& r : c.ranges)
    if (!(r.hi < 0x80 || (r.lo >= 0xD800 && r.hi <= 0xDFFF))) return false;
  return true;
}

}  // namespace

std::string class_signature(const CharClass& c) {
  std::string s = c.negated ? "^" : "+";
  for (const CharRange& r : c.ranges) s += std::to_string(r.lo) + "-" + std::to_string(r.hi) + ",";
  return s;
}

ClassTable::ClassTable(const CharClass& c, const std::vector<std::string>& bytes,
                       const std::vector<bool>& usable) {
  const size_t words = (bytes.size() + 31) / 32;
  upto_.assign(kMaxRun + 1, std::vector<uint32_t>(words, 0));
  partial_.assign(kMaxRun + 1, std::vector<uint32_t>(words, 0));
  const bool cut_offs_apart = holds_non_ascii(c);
  std::vector<std::vector<std::pair<std::string, int32_t>>> rests(kMaxRun + 1);
  for (size_t id = 0; id < bytes.size(); ++id) {
    if (!usable[id]) continue;
    const std::string& b = bytes[id];
    size_t pos = 0;
    int run = 0;
    while (pos < b.size() && run < kMaxRun) {
      uint32_t cp = 0;
      const size_t n = decode_utf8_strict(b.data() + pos, b.size() - pos, cp);
      if (n == 0 || !c.matches(cp)) break;
      pos += n;
      ++run;
    }
    if (pos == b.size()) {
      upto_[(size_t)run][id >> 5] |= 1u << (id & 31);
    } else if (cut_offs_apart && run < kMaxRun && cut_off_start(b.data() + pos, b.size() - pos)) {
      partial_[(size_t)run][id >> 5] |= 1u << (id & 31);
    } else {
      rests[(size_t)run].push_back({b.substr(pos), (int32_t)id});
    }
  }
  for (int L = 1; L <= kMaxRun; ++L) {
    for (size_t w = 0; w < words; ++w) {
      upto_[(size_t)L][w] |= upto_[(size_t)L - 1][w];
      partial_[(size_t)L][w] |= partial_[(size_t)L - 1][w];
    }
  }
  rest_.reserve(kMaxRun + 1);
  for (auto& r : rests) rest_.push_back(TokenTrie::build(std::move(r)));
}

}  // namespace hablar::grammar
