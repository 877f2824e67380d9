#include "tokenizer/unicode.h"

#include <utf8proc.h>

#include <memory>
#include <mutex>

namespace hablar::tokenizer::unicode {
namespace {

constexpr uint32_t kMaxCodePoint = 0x10FFFF;
constexpr uint32_t kReplacement = 0xFFFD;

Category category_from_utf8proc(utf8proc_category_t c) {
  switch (c) {
    case UTF8PROC_CATEGORY_CN:
      return kUndefined;
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO:
      return kLetter;
    case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_MC:
    case UTF8PROC_CATEGORY_ME:
      return kMark;
    case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_NO:
      return kNumber;
    case UTF8PROC_CATEGORY_PC:
    case UTF8PROC_CATEGORY_PD:
    case UTF8PROC_CATEGORY_PS:
    case UTF8PROC_CATEGORY_PE:
    case UTF8PROC_CATEGORY_PI:
    case UTF8PROC_CATEGORY_PF:
    case UTF8PROC_CATEGORY_PO:
      return kPunctuation;
    case UTF8PROC_CATEGORY_SM:
    case UTF8PROC_CATEGORY_SC:
    case UTF8PROC_CATEGORY_SK:
    case UTF8PROC_CATEGORY_SO:
      return kSymbol;
    case UTF8PROC_CATEGORY_ZS:
    case UTF8PROC_CATEGORY_ZL:
    case UTF8PROC_CATEGORY_ZP:
      return kSeparator;
    default:
      return kControl;
  }
}

// White_Space (PropList.txt): the Z categories plus TAB..CR and NEL. utf8proc has no
// White_Space property; this is its definition in terms of categories.
bool white_space(uint32_t cp, utf8proc_category_t c) {
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x85 || c == UTF8PROC_CATEGORY_ZS ||
         c == UTF8PROC_CATEGORY_ZL || c == UTF8PROC_CATEGORY_ZP;
}

const CpFlags* flag_table() {
  static std::unique_ptr<CpFlags[]> table;
  static std::once_flag once;
  std::call_once(once, [] {
    table = std::make_unique<CpFlags[]>(kMaxCodePoint + 1);
    for (uint32_t cp = 0; cp <= kMaxCodePoint; ++cp) {
      const auto c = utf8proc_category(static_cast<utf8proc_int32_t>(cp));
      CpFlags f = category_from_utf8proc(c);
      if (cp >= 0xD800 && cp <= 0xDFFF) f = kControl;  // Cs
      if (white_space(cp, c)) f |= kWhitespaceBit;
      table[cp] = f;
    }
  });
  return table.get();
}

}  // namespace

CpFlags flags_of(uint32_t cp) {
  static const CpFlags* table = flag_table();
  return cp <= kMaxCodePoint ? table[cp] : kOutOfRange;
}

uint32_t decode_one(std::string_view text, size_t& pos) {
  const auto byte = [&](size_t i) { return static_cast<uint8_t>(text[i]); };
  const uint8_t b0 = byte(pos);
  if (b0 < 0x80) {
    pos += 1;
    return b0;
  }
  const size_t len = utf8_len(b0);
  bool ok = (b0 & 0x40) != 0 && (b0 & 0xF8) != 0xF8 && pos + len <= text.size();
  for (size_t i = 1; ok && i < len; ++i) ok = (byte(pos + i) & 0xC0) == 0x80;
  if (!ok) {
    pos += 1;
    return kReplacement;
  }
  uint32_t cp = len == 2 ? (b0 & 0x1F) : len == 3 ? (b0 & 0x0F) : (b0 & 0x07);
  for (size_t i = 1; i < len; ++i) cp = (cp << 6) | (byte(pos + i) & 0x3F);
  if (cp > kMaxCodePoint) {
    pos += 1;
    return kReplacement;
  }
  pos += len;
  return cp;
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

std::string to_utf8(uint32_t cp) {
  std::string s;
  append_utf8(s, cp);
  return s;
}

std::vector<uint32_t> decode(std::string_view text) {
  std::vector<uint32_t> cps;
  cps.reserve(text.size());
  for (size_t pos = 0; pos < text.size();) cps.push_back(decode_one(text, pos));
  return cps;
}

bool is_canonical_utf8(std::string_view text) {
  size_t pos = 0;
  while (pos < text.size()) {
    if (static_cast<uint8_t>(text[pos]) < 0x80) {
      ++pos;
      continue;
    }
    const size_t start = pos;
    const uint32_t cp = decode_one(text, pos);
    const size_t want = cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4;
    if (pos - start != want) return false;
    if (cp == kReplacement && text.compare(start, 3, "\xEF\xBF\xBD") != 0) return false;
  }
  return true;
}

uint32_t to_lower(uint32_t cp) {
  return static_cast<uint32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(cp)));
}

uint32_t nfd_first(uint32_t cp) {
  if (cp < 0xC0 || cp > kMaxCodePoint) return cp;
  utf8proc_int32_t buf[8];
  int last_boundclass = 0;
  const auto n =
      utf8proc_decompose_char(static_cast<utf8proc_int32_t>(cp), buf, 8,
                              static_cast<utf8proc_option_t>(UTF8PROC_DECOMPOSE), &last_boundclass);
  return n > 0 ? static_cast<uint32_t>(buf[0]) : cp;
}

}  // namespace hablar::tokenizer::unicode
