#include "tokenizer/pretokenizer.h"

#include <algorithm>
#include <array>
#include <cstdio>

#include "core/error.h"
#include "tokenizer/unicode.h"

namespace hablar::tokenizer {
namespace {

using unicode::CpFlags;

struct Range {
  uint32_t lo, hi;
};

// Cased letters of the deepseek-llm pattern, as code-point ranges (from its tokenizer.json).
constexpr Range kDeepseekLetterRanges[] = {
    {0x41, 0x5A},       {0x61, 0x7A},       {0xB5, 0xB5},       {0xC0, 0xD6},
    {0xD8, 0xF6},       {0xF8, 0x1BA},      {0x1BC, 0x1BF},     {0x1C4, 0x293},
    {0x295, 0x2AF},     {0x370, 0x373},     {0x376, 0x377},     {0x37B, 0x37D},
    {0x37F, 0x37F},     {0x386, 0x386},     {0x388, 0x38A},     {0x38C, 0x38C},
    {0x38E, 0x3A1},     {0x3A3, 0x3F5},     {0x3F7, 0x481},     {0x48A, 0x52F},
    {0x531, 0x556},     {0x10A0, 0x10C5},   {0x13A0, 0x13F5},   {0x13F8, 0x13FD},
    {0x1C90, 0x1CBA},   {0x1CBD, 0x1CBF},   {0x1D00, 0x1D2B},   {0x1D6B, 0x1D77},
    {0x1D79, 0x1D9A},   {0x1E00, 0x1F15},   {0x1F18, 0x1F1D},   {0x1F20, 0x1F45},
    {0x1F48, 0x1F4D},   {0x1F50, 0x1F57},   {0x1F59, 0x1F59},   {0x1F5B, 0x1F5B},
    {0x1F5D, 0x1F5D},   {0x1F5F, 0x1F7D},   {0x1F80, 0x1FB4},   {0x1FB6, 0x1FBC},
    {0x1FBE, 0x1FBE},   {0x1FC2, 0x1FC4},   {0x1FC6, 0x1FCC},   {0x1FD0, 0x1FD3},
    {0x1FD6, 0x1FDB},   {0x1FE0, 0x1FEC},   {0x1FF2, 0x1FF4},   {0x1FF6, 0x1FFC},
    {0x2102, 0x2102},   {0x2107, 0x2107},   {0x210A, 0x2113},   {0x2115, 0x2115},
    {0x2119, 0x211D},   {0x2124, 0x2124},   {0x2126, 0x2126},   {0x2128, 0x2128},
    {0x212A, 0x212D},   {0x212F, 0x2134},   {0x2139, 0x2139},   {0x213C, 0x213F},
    {0x2145, 0x2149},   {0x214E, 0x214E},   {0x2183, 0x2184},   {0x2C00, 0x2C7B},
    {0x2C7E, 0x2CE4},   {0x2CEB, 0x2CEE},   {0x2CF2, 0x2CF3},   {0xA640, 0xA66D},
    {0xA680, 0xA69B},   {0xA722, 0xA76F},   {0xA771, 0xA787},   {0xA78B, 0xA78E},
    {0xAB70, 0xABBF},   {0xFB00, 0xFB06},   {0xFB13, 0xFB17},   {0xFF21, 0xFF3A},
    {0xFF41, 0xFF5A},   {0x10400, 0x1044F}, {0x104B0, 0x104D3}, {0x104D8, 0x104FB},
    {0x10C80, 0x10CB2}, {0x10CC0, 0x10CF2}, {0x118A0, 0x118DF}, {0x1E900, 0x1E943},
};
constexpr Range kDeepseekPunctRanges[] = {{0x21, 0x2F},     {0x3A, 0x7E},     {0x2018, 0x201F},
                                          {0x3000, 0x3002}, {0xFF01, 0xFF0F}, {0xFF1A, 0xFF5E}};
constexpr Range kCjkHangulRanges[] = {{0x800, 0x9FA5}, {0xAC00, 0xD7FF}};

template <size_t N>
bool in_ranges(const Range (&ranges)[N], uint32_t cp) {
  // Sorted by lo; few ranges, binary search on lo.
  const Range* it =
      std::upper_bound(ranges, ranges + N, cp, [](uint32_t c, const Range& r) { return c < r.lo; });
  return it != ranges && cp <= (it - 1)->hi;
}

bool is_ws(CpFlags f) {
  return unicode::is_whitespace(f);
}
bool is_l(CpFlags f) {
  return unicode::is_letter(f);
}
bool is_n(CpFlags f) {
  return unicode::is_number(f);
}
// [^\s\p{L}\p{N}]
bool is_other(CpFlags f) {
  return !is_ws(f) && !is_l(f) && !is_n(f) && f != unicode::kOutOfRange;
}
bool is_newline(uint32_t cp) {
  return cp == '\r' || cp == '\n';
}

bool class_has(PrePattern::Class cls, uint32_t cp, CpFlags f) {
  using C = PrePattern::Class;
  // Patterns written with explicit code-point ranges see every non-ASCII white space as a
  // white space (never as a member of a range), as the reference matcher does.
  const bool nonascii_ws = cp > 0x7F && is_ws(f);
  switch (cls) {
    case C::kNewline:
      return is_newline(cp);
    case C::kLetter:
      return is_l(f);
    case C::kNumber:
      return is_n(f);
    case C::kPunct:
      return unicode::category_of(f) == unicode::kPunctuation && f != unicode::kOutOfRange;
    case C::kAsciiDigit:
      return cp >= '0' && cp <= '9';
    case C::kPunctSymbolsFalcon:
    case C::kPunctSymbolsDefault: {
      if (unicode::category_of(f) == unicode::kPunctuation && f != unicode::kOutOfRange)
        return true;
      const std::string_view extra = cls == C::kPunctSymbolsFalcon ? "$+<=>^~|`" : "$+<=>^~|";
      return cp < 0x80 && extra.find(static_cast<char>(cp)) != std::string_view::npos;
    }
    case C::kDeepseekLetters:
      return !nonascii_ws && in_ranges(kDeepseekLetterRanges, cp);
    case C::kDeepseekPunct:
      return !nonascii_ws && in_ranges(kDeepseekPunctRanges, cp);
    case C::kCjkHangul:
      return !nonascii_ws && in_ranges(kCjkHangulRanges, cp);
    case C::kNone:
      break;
  }
  return false;
}

// Emits pieces into `lengths` while tracking the unmatched gap before each match.
struct Emitter {
  std::vector<uint32_t>& lengths;
  size_t gap_start;
  void match(size_t start, size_t end) {
    if (start > gap_start) lengths.push_back(static_cast<uint32_t>(start - gap_start));
    lengths.push_back(static_cast<uint32_t>(end - start));
    gap_start = end;
  }
  void finish(size_t end) {
    if (end > gap_start) lengths.push_back(static_cast<uint32_t>(end - gap_start));
  }
};

// Length of an English contraction at pos ('s 't 'm 'd 're 've 'll), 0 if none.
size_t contraction_len(const uint32_t* cps, size_t pos, size_t end, bool ignore_case) {
  if (cps[pos] != '\'' || pos + 1 >= end) return 0;
  auto lower = [&](uint32_t c) { return ignore_case && c >= 'A' && c <= 'Z' ? c + 32 : c; };
  const uint32_t c1 = lower(cps[pos + 1]);
  if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') return 2;
  if (pos + 2 >= end) return 0;
  const uint32_t c2 = lower(cps[pos + 2]);
  if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l')) return 3;
  return 0;
}

// \s+(?!\S)|\s+ at pos (cps[pos] is white space): the run, less its last character when
// a non-space follows inside the piece.
size_t whitespace_len(const uint8_t* fl, size_t pos, size_t end) {
  size_t n = 0;
  while (pos + n < end && is_ws(fl[pos + n])) ++n;
  return (n > 1 && pos + n < end) ? n - 1 : n;
}

void split_gpt2(const uint32_t* cps, const uint8_t* fl, size_t begin, size_t end,
                std::vector<uint32_t>& out) {
  size_t pos = begin;
  while (pos < end) {
    const size_t start = pos;
    if (size_t n = contraction_len(cps, pos, end, false)) {
      out.push_back(static_cast<uint32_t>(n));
      pos += n;
      continue;
    }
    const size_t p = (cps[pos] == ' ' && pos + 1 < end) ? pos + 1 : pos;
    const CpFlags f = fl[p];
    size_t q = p;
    if (is_l(f)) {
      while (q < end && is_l(fl[q])) ++q;
    } else if (is_n(f)) {
      while (q < end && is_n(fl[q])) ++q;
    } else if (is_other(f)) {
      while (q < end && is_other(fl[q])) ++q;
    } else {
      q = pos + std::max<size_t>(1, whitespace_len(fl, pos, end));
    }
    out.push_back(static_cast<uint32_t>(q - start));
    pos = q;
  }
}

bool is_mark(CpFlags f) {
  return unicode::category_of(f) == unicode::kMark && f != unicode::kOutOfRange;
}

// marks: letters take combining marks ([\p{L}\p{M}]+), which punctuation runs exclude.
void split_llama3(const uint32_t* cps, const uint8_t* fl, size_t begin, size_t end, int max_digits,
                  bool marks, std::vector<uint32_t>& out) {
  auto letter = [&](CpFlags f) { return is_l(f) || (marks && is_mark(f)); };
  auto other = [&](CpFlags f) { return is_other(f) && !(marks && is_mark(f)); };
  size_t pos = begin;
  while (pos < end) {
    const uint32_t c = cps[pos];
    const CpFlags f = fl[pos];
    size_t q = pos;
    if (size_t n = contraction_len(cps, pos, end, true)) {
      q = pos + n;
    } else if (!is_newline(c) && !is_n(f) &&
               (letter(f) || (pos + 1 < end && letter(fl[pos + 1])))) {
      // [^\r\n\p{L}\p{N}]?\p{L}+
      q = pos + 1;
      while (q < end && letter(fl[q])) ++q;
    } else if (is_n(f)) {
      // \p{N}{1,max_digits}
      while (q < end && q - pos < static_cast<size_t>(max_digits) && is_n(fl[q])) ++q;
    } else if (other(c == ' ' && pos + 1 < end ? fl[pos + 1] : f)) {
      // ' ?[^\s\p{L}\p{N}]+[\r\n]*'
      q = pos + (c == ' ' ? 1 : 0);
      while (q < end && other(fl[q])) ++q;
      while (q < end && is_newline(cps[q])) ++q;
    } else {
      // \s*[\r\n]+ | \s+(?!\S) | \s+
      size_t n = 0, last_newline_end = 0;
      while (pos + n < end && is_ws(fl[pos + n])) {
        if (is_newline(cps[pos + n])) last_newline_end = pos + n + 1;
        ++n;
      }
      if (last_newline_end > 0) {
        q = last_newline_end;
      } else {
        q = pos + std::max<size_t>(1, (n > 1 && pos + n < end) ? n - 1 : n);
      }
    }
    out.push_back(static_cast<uint32_t>(q - pos));
    pos = q;
  }
}

void split_class_run(const PrePattern& p, const uint32_t* cps, const uint8_t* fl, size_t begin,
                     size_t end, std::vector<uint32_t>& out) {
  Emitter em{out, begin};
  auto has = [&](size_t i) { return class_has(p.cls, cps[i], fl[i]); };
  size_t pos = begin;
  while (pos < end) {
    size_t first = pos;
    if (p.ws_prefix && is_ws(fl[pos]) && pos + 1 < end && has(pos + 1)) first = pos + 1;
    if (!has(first)) {
      ++pos;
      continue;
    }
    size_t q = first;
    if (p.count == 0) {
      while (q < end && has(q)) ++q;
    } else {
      while (q < end && q - first < static_cast<size_t>(p.count) && has(q)) ++q;
      if (q - first < static_cast<size_t>(p.count)) {
        ++pos;
        continue;
      }
    }
    em.match(pos, q);
    pos = q;
  }
  em.finish(end);
}

void split_trailing_ws(const uint8_t* fl, size_t begin, size_t end, std::vector<uint32_t>& out) {
  size_t s = end;
  while (s > begin && is_ws(fl[s - 1])) --s;
  if (s > begin) out.push_back(static_cast<uint32_t>(s - begin));
  if (end > s) out.push_back(static_cast<uint32_t>(end - s));
}

// CJK ideographs (unified, extensions A-F, compatibility): llama.cpp's \p{Han} of Kimi-K2.
bool is_han(uint32_t cp) {
  static constexpr Range kHan[] = {{0x3400, 0x4DBF},   {0x4E00, 0x9FFF},   {0xF900, 0xFAFF},
                                   {0x20000, 0x2A6DF}, {0x2A700, 0x2EBEF}, {0x2F800, 0x2FA1F}};
  return in_ranges(kHan, cp);
}

// Kimi-K2's split as llama.cpp's scanner makes it: Han runs; words of non-Han letters, one
// leading character allowed, with an English contraction after them; digits in threes;
// ' ?' and a run of other characters with the newlines after it; white space as Llama 3.
void split_kimi_k2(const uint32_t* cps, const uint8_t* fl, size_t begin, size_t end,
                   std::vector<uint32_t>& out) {
  auto word_letter = [&](size_t i) { return i < end && is_l(fl[i]) && !is_han(cps[i]); };
  size_t pos = begin;
  while (pos < end) {
    const uint32_t c = cps[pos];
    const CpFlags f = fl[pos];
    size_t q = pos;
    const bool lead = !is_newline(c) && !is_l(f) && !is_n(f);
    if (is_han(c)) {
      while (q < end && is_han(cps[q])) ++q;
    } else if (word_letter(pos) || (lead && word_letter(pos + 1))) {
      q = pos + (lead ? 1 : 0);
      while (word_letter(q)) ++q;
      q += contraction_len(cps, q, end, true);
    } else if (is_n(f)) {
      while (q < end && q - pos < 3 && is_n(fl[q])) ++q;
    } else if (is_other(c == ' ' && pos + 1 < end ? fl[pos + 1] : f)) {
      q = pos + (c == ' ' ? 1 : 0);
      while (q < end && is_other(fl[q])) ++q;
      while (q < end && is_newline(cps[q])) ++q;
    } else {
      size_t n = 0, last_newline_end = 0;
      while (pos + n < end && is_ws(fl[pos + n])) {
        if (is_newline(cps[pos + n])) last_newline_end = pos + n + 1;
        ++n;
      }
      if (last_newline_end > 0)
        q = last_newline_end;
      else
        q = pos + std::max<size_t>(1, (n > 1 && pos + n < end) ? n - 1 : n);
    }
    out.push_back(static_cast<uint32_t>(q - pos));
    pos = q;
  }
}

// A run of n digits: n % 3 leading digits, joined to the text since the last split, then
// groups of three; the text after the last run stays one piece.
void split_digit_groups(const uint8_t* fl, size_t begin, size_t end, std::vector<uint32_t>& out) {
  size_t prev = begin;
  auto cut = [&](size_t at) {
    if (at > prev) out.push_back(static_cast<uint32_t>(at - prev));
    prev = at;
  };
  size_t pos = begin;
  while (pos < end) {
    if (!is_n(fl[pos])) {
      ++pos;
      continue;
    }
    const size_t start = pos;
    while (pos < end && is_n(fl[pos])) ++pos;
    size_t at = start + (pos - start) % 3;
    cut(at);
    for (; at < pos; at += 3) cut(at + 3);
  }
  cut(end);
}

void split_newline_runs(const uint32_t* cps, size_t begin, size_t end, std::vector<uint32_t>& out) {
  size_t pos = begin;
  while (pos < end) {
    const bool newline = cps[pos] == '\n';
    const size_t start = pos;
    while (pos < end && (cps[pos] == '\n') == newline) ++pos;
    out.push_back(static_cast<uint32_t>(pos - start));
  }
}

}  // namespace

std::string detail_deepseek_letter_class() {
  std::string cls = "[";
  char buf[32];
  for (const Range& r : kDeepseekLetterRanges) {
    std::snprintf(buf, sizeof buf, "\\x{%X}-\\x{%X}", r.lo, r.hi);
    cls += buf;
  }
  return cls + "]";
}

void PreTokenizer::split_piece(const PrePattern& p, const uint32_t* cps, const uint8_t* flags,
                               size_t begin, size_t end, std::vector<uint32_t>& lengths) {
  switch (p.kind) {
    case PrePattern::Kind::kGpt2:
      return split_gpt2(cps, flags, begin, end, lengths);
    case PrePattern::Kind::kLlama3:
      return split_llama3(cps, flags, begin, end, p.max_digits, p.marks, lengths);
    case PrePattern::Kind::kClassRun:
      return split_class_run(p, cps, flags, begin, end, lengths);
    case PrePattern::Kind::kTrailingWs:
      return split_trailing_ws(flags, begin, end, lengths);
    case PrePattern::Kind::kKimiK2:
      return split_kimi_k2(cps, flags, begin, end, lengths);
    case PrePattern::Kind::kDigitGroups:
      return split_digit_groups(flags, begin, end, lengths);
    case PrePattern::Kind::kNewlineRuns:
      return split_newline_runs(cps, begin, end, lengths);
    case PrePattern::Kind::kRegex:
      return p.re->split(cps, flags, begin, end, lengths);
  }
}

void PreTokenizer::split(std::span<const uint32_t> cps, std::span<const uint8_t> flags,
                         std::vector<uint32_t>& lengths) const {
  if (cps.empty()) return;
  if (patterns_.size() == 1) {
    split_piece(patterns_[0], cps.data(), flags.data(), 0, cps.size(), lengths);
    return;
  }
  std::vector<uint32_t> pieces{static_cast<uint32_t>(cps.size())};
  std::vector<uint32_t> next;
  for (const PrePattern& pattern : patterns_) {
    next.clear();
    size_t start = 0;
    for (uint32_t len : pieces) {
      split_piece(pattern, cps.data(), flags.data(), start, start + len, next);
      start += len;
    }
    pieces.swap(next);
  }
  lengths.insert(lengths.end(), pieces.begin(), pieces.end());
}

}  // namespace hablar::tokenizer
