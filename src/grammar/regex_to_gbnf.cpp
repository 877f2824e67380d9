// Regular expressions (the common subset of ECMA-262 / Python syntax) -> GBNF expressions.
//
// Supported: literals, escapes (\d \D \w \W \s \S, \n \t \r \f \v, \xHH, \uHHHH, escaped
// punctuation), classes with ranges and negation, '.', groups (capturing and (?:...)),
// alternation, quantifiers * + ? {m} {m,} {m,n} (a lazy '?' after them changes nothing
// here: the language is the same), and ^ / $ at the very start / end. Refused with an
// error: lookaround, backreferences, word boundaries, anchors elsewhere, possessive
// quantifiers, inline flags.
//
// In JSON mode the expression describes a JSON string's *decoded* value written inside the
// quotes: characters that JSON must escape are written escaped, and classes and '.' leave
// out '"', '\' and control characters (a subset of the regex's language that is always
// valid JSON, which keeps it simple).
#include <algorithm>

#include "core/error.h"
#include "grammar/grammar.h"
#include "grammar/regex.h"
#include "grammar/utf8.h"

namespace hablar::grammar {

namespace {

constexpr uint32_t kMaxCodePoint = 0x10FFFF;

using Ranges = std::vector<CharRange>;

Ranges normalized(Ranges r) {
  std::sort(r.begin(), r.end(), [](const CharRange& a, const CharRange& b) { return a.lo < b.lo; });
  Ranges out;
  for (const CharRange& x : r) {
    if (!out.empty() && (uint64_t)out.back().hi + 1 >= x.lo) {
      out.back().hi = std::max(out.back().hi, x.hi);
    } else {
      out.push_back(x);
    }
  }
  return out;
}

Ranges complement(const Ranges& in) {
  Ranges r = normalized(in), out;
  uint32_t next = 0;
  for (const CharRange& x : r) {
    if (x.lo > next) out.push_back({next, x.lo - 1});
    next = x.hi + 1;
  }
  if (next <= kMaxCodePoint) out.push_back({next, kMaxCodePoint});
  return out;
}

Ranges subtract(const Ranges& a, const Ranges& b) {
  Ranges na = normalized(a), nb = complement(b), out;
  for (const CharRange& x : na)
    for (const CharRange& y : nb) {
      const uint32_t lo = std::max(x.lo, y.lo), hi = std::min(x.hi, y.hi);
      if (lo <= hi) out.push_back({lo, hi});
    }
  return out;
}

std::string class_char(uint32_t cp) {
  if ((cp >= '0' && cp <= '9') || (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z'))
    return std::string(1, (char)cp);
  static const char* hex = "0123456789ABCDEF";
  std::string s;
  int digits = cp < 0x100 ? 2 : cp < 0x10000 ? 4 : 8;
  s += digits == 2 ? "\\x" : digits == 4 ? "\\u" : "\\U";
  for (int i = digits - 1; i >= 0; --i) s += hex[(cp >> (4 * i)) & 15];
  return s;
}

std::string class_text(const Ranges& r) {
  if (r.empty()) return "[^\\x00-\\U0010FFFF]";  // matches nothing
  std::string s = "[";
  for (const CharRange& x : r) {
    s += class_char(x.lo);
    if (x.hi != x.lo) {
      s += '-';
      s += class_char(x.hi);
    }
  }
  return s + "]";
}

class RegexParser {
 public:
  RegexParser(std::string_view re, bool json) : s_(re), json_(json) {}

  std::string run() {
    if (peek() == '^') {
      ++pos_;
      anchored_start_ = true;
    }
    std::string e = alternation();
    if (pos_ < s_.size()) fail("unexpected ')'");
    if (!json_) return e;  // guided regex: the whole text matches
    // A JSON Schema pattern matches anywhere in the string unless anchored.
    const std::string any = "( " + class_text(json_safe(complement({}))) + " )*";
    if (!anchored_start_) e = any + " " + e;
    if (!anchored_end_) e = e + " " + any;
    return e;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw_error(ErrorKind::kInvalidArgument, "regex '" + std::string(s_) + "': " + what +
                                                 " (at offset " + std::to_string(pos_) + ")");
  }
  char peek(size_t k = 0) const { return pos_ + k < s_.size() ? s_[pos_ + k] : '\0'; }
  bool at_end() const { return pos_ >= s_.size(); }

  Ranges json_safe(const Ranges& r) const {
    if (!json_) return r;
    return subtract(r, {{0, 0x1F}, {'"', '"'}, {'\\', '\\'}});
  }

  std::string literal(uint32_t cp) const {
    std::string text;
    if (json_) {
      switch (cp) {
        case '"':
          return "\"\\\\\\\"\"";  // the two characters \" in the JSON text
        case '\\':
          return "\"\\\\\\\\\"";
        case '\n':
          return "\"\\\\n\"";
        case '\t':
          return "\"\\\\t\"";
        case '\r':
          return "\"\\\\r\"";
        default:
          if (cp < 0x20) return "[^\\x00-\\U0010FFFF]";  // other controls: not offered
      }
    }
    append_utf8(text, cp);
    return gbnf_literal(text);
  }

  std::string alternation() {
    std::vector<std::string> alts{concat()};
    while (peek() == '|') {
      ++pos_;
      alts.push_back(concat());
    }
    if (alts.size() == 1) return alts[0];
    std::string s = "(";
    for (size_t i = 0; i < alts.size(); ++i) s += (i ? " | " : " ") + alts[i];
    return s + " )";
  }

  std::string concat() {
    std::string s;
    while (!at_end() && peek() != '|' && peek() != ')') {
      if (peek() == '$') {
        ++pos_;
        if (!(at_end() || (peek() == ')' && depth_ == 0))) fail("'$' is supported only at the end");
        anchored_end_ = true;
        continue;
      }
      if (peek() == '^') fail("'^' is supported only at the start");
      std::string a = atom();
      a = quantified(a);
      s += (s.empty() ? "" : " ") + a;
    }
    return s.empty() ? "\"\"" : s;
  }

  std::string quantified(const std::string& a) {
    const char c = peek();
    std::string q;
    if (c == '*' || c == '+' || c == '?') {
      ++pos_;
      q = std::string(1, c);
    } else if (c == '{' && (peek(1) >= '0' && peek(1) <= '9')) {
      const size_t close = s_.find('}', pos_);
      if (close == std::string_view::npos) fail("unclosed '{'");
      q = std::string(s_.substr(pos_, close - pos_ + 1));
      pos_ = close + 1;
      for (char d : q)
        if (!(d == '{' || d == '}' || d == ',' || (d >= '0' && d <= '9')))
          fail("bad repetition " + q);
    } else {
      return a;
    }
    if (peek() == '?') ++pos_;  // lazy: same language
    if (peek() == '+') fail("possessive quantifiers are not supported");
    return "(" + a + ")" + q;
  }

  uint32_t hex(int digits) {
    uint32_t v = 0;
    for (int i = 0; i < digits; ++i) {
      const char c = peek();
      int d = (c >= '0' && c <= '9')   ? c - '0'
              : (c >= 'a' && c <= 'f') ? c - 'a' + 10
              : (c >= 'A' && c <= 'F') ? c - 'A' + 10
                                       : -1;
      if (d < 0) fail("bad hex escape");
      v = v * 16 + (uint32_t)d;
      ++pos_;
    }
    return v;
  }

  // An escape after '\' (already consumed): a class (ranges) or one code point.
  bool escape(Ranges& cls, uint32_t& cp) {
    const char c = peek();
    ++pos_;
    switch (c) {
      case 'd':
        cls = {{'0', '9'}};
        return true;
      case 'D':
        cls = complement({{'0', '9'}});
        return true;
      case 'w':
        cls = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
        return true;
      case 'W':
        cls = complement({{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}});
        return true;
      case 's':
        cls = {{'\t', '\r'}, {' ', ' '}};
        return true;
      case 'S':
        cls = complement({{'\t', '\r'}, {' ', ' '}});
        return true;
      case 'n':
        cp = '\n';
        return false;
      case 't':
        cp = '\t';
        return false;
      case 'r':
        cp = '\r';
        return false;
      case 'f':
        cp = '\f';
        return false;
      case 'v':
        cp = '\v';
        return false;
      case 'x':
        cp = hex(2);
        return false;
      case 'u':
        cp = hex(4);
        return false;
      case 'b':
      case 'B':
        fail("word boundaries are not supported");
      case '\0':
        fail("a trailing backslash");
      default:
        if (c >= '0' && c <= '9') fail("backreferences are not supported");
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'))
          fail(std::string("unknown escape \\") + c);
        cp = (uint32_t)(unsigned char)c;
        return false;
    }
  }

  uint32_t next_cp() {
    uint32_t cp = 0;
    pos_ += decode_utf8_lenient(s_.substr(pos_), cp);
    return cp;
  }

  std::string bracket() {
    ++pos_;  // '['
    bool negate = false;
    if (peek() == '^') {
      negate = true;
      ++pos_;
    }
    Ranges r;
    bool first = true;
    while (first || peek() != ']') {
      if (at_end()) fail("unclosed '['");
      first = false;
      uint32_t lo = 0;
      if (peek() == '\\') {
        ++pos_;
        Ranges cls;
        if (escape(cls, lo)) {
          r.insert(r.end(), cls.begin(), cls.end());
          continue;
        }
      } else {
        lo = next_cp();
      }
      uint32_t hi = lo;
      if (peek() == '-' && peek(1) != ']' && pos_ + 1 < s_.size()) {
        ++pos_;
        if (peek() == '\\') {
          ++pos_;
          Ranges cls;
          if (escape(cls, hi)) fail("a class escape cannot end a range");
        } else {
          hi = next_cp();
        }
        if (hi < lo) fail("a range out of order");
      }
      r.push_back({lo, hi});
    }
    ++pos_;  // ']'
    return class_text(json_safe(negate ? complement(r) : normalized(r)));
  }

  std::string atom() {
    const char c = peek();
    if (c == '(') {
      ++pos_;
      if (peek() == '?') {
        if (peek(1) != ':') fail("lookaround and inline flags are not supported");
        pos_ += 2;
      }
      ++depth_;
      std::string inner = alternation();
      --depth_;
      if (peek() != ')') fail("unclosed '('");
      ++pos_;
      return "(" + inner + ")";
    }
    if (c == '[') return bracket();
    if (c == '.') {
      ++pos_;
      return class_text(json_safe(complement({{'\n', '\n'}})));
    }
    if (c == '*' || c == '+' || c == '?' || c == '{') fail("nothing to repeat");
    if (c == '\\') {
      ++pos_;
      Ranges cls;
      uint32_t cp = 0;
      if (escape(cls, cp)) return class_text(json_safe(normalized(cls)));
      return literal(cp);
    }
    return literal(next_cp());
  }

  std::string_view s_;
  bool json_;
  size_t pos_ = 0;
  int depth_ = 0;
  bool anchored_start_ = false;
  bool anchored_end_ = false;
};

}  // namespace

std::string regex_to_gbnf_expr(std::string_view regex, bool json_string) {
  return RegexParser(regex, json_string).run();
}

std::string regex_to_gbnf(std::string_view regex) {
  return "root ::= " + regex_to_gbnf_expr(regex, false) + "\n";
}

std::string choices_to_gbnf(const std::vector<std::string>& choices) {
  if (choices.empty()) throw_error(ErrorKind::kInvalidArgument, "the choice list is empty");
  std::string s = "root ::=";
  for (size_t i = 0; i < choices.size(); ++i) s += (i ? " | " : " ") + gbnf_literal(choices[i]);
  return s + "\n";
}

}  // namespace hablar::grammar
