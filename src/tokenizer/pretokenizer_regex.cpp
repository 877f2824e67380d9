// LlamaRegex: a pre-tokenizer regex with llama.cpp's matching rules (see pretokenizer.h),
// run by PCRE2 over 32-bit code units without UTF or UCP, so that \s, \d and \w are ASCII
// as in std::regex under the "C" locale.
#define PCRE2_CODE_UNIT_WIDTH 32
#include <pcre2.h>

#include <array>

#include "core/error.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/unicode.h"

namespace hablar::tokenizer {

struct LlamaRegex::Code {
  pcre2_code* code = nullptr;
  ~Code() { pcre2_code_free(code); }
};

namespace {

// The category names llama.cpp collapses, the stand-in of each, and the ASCII members the
// stand-in is joined by inside a class (written for PCRE2).
struct CollapsedCategory {
  const char* name;
  const char* members;
};
constexpr CollapsedCategory kNumber{"\\xD1", "0-9"};
constexpr CollapsedCategory kLetter{"\\xD2", "A-Za-z"};
constexpr CollapsedCategory kPunct{"\\xD3", "!-#%-*,-/:-;?-@\\[-\\]_\\{\\}"};
constexpr CollapsedCategory kMark{"\\xD4", ""};
constexpr CollapsedCategory kSymbol{"\\xD5", "\\$\\+<->\\^`\\|~"};

const CollapsedCategory* category_named(std::string_view p) {
  if (p == "\\p{N}") return &kNumber;
  if (p == "\\p{L}" || p == "\\p{Lu}" || p == "\\p{Ll}" || p == "\\p{Lt}" || p == "\\p{Lm}" ||
      p == "\\p{Lo}")
    return &kLetter;
  if (p == "\\p{P}") return &kPunct;
  if (p == "\\p{M}") return &kMark;
  if (p == "\\p{S}") return &kSymbol;
  return nullptr;
}

bool names_category(const std::string& regex) {
  for (const char* p : {"\\p{N}", "\\p{L}", "\\p{P}", "\\p{M}", "\\p{S}", "\\p{Lu}", "\\p{Ll}",
                        "\\p{Lt}", "\\p{Lm}", "\\p{Lo}"})
    if (regex.find(p) != std::string::npos) return true;
  return false;
}

// The regex over collapsed text: each category becomes its stand-in and ASCII members, in
// a class of its own outside brackets. A bracket counts as opening or closing unless a
// backslash precedes it (llama.cpp's rule; its classes never nest).
std::string collapse_regex(const std::string& re) {
  std::string out;
  bool inside = false;
  for (size_t i = 0; i < re.size(); ++i) {
    const bool escaped = i > 0 && re[i - 1] == '\\';
    if (re[i] == '[' && !escaped) {
      inside = true;
    } else if (re[i] == ']' && inside && !escaped) {
      inside = false;
    } else if (re.compare(i, 3, "\\p{") == 0) {
      const size_t close = re.find('}', i + 3);
      if (close != std::string::npos && close <= i + 10) {
        if (const CollapsedCategory* c =
                category_named(std::string_view(re).substr(i, close - i + 1))) {
          out += inside ? "" : "[";
          out += c->name;
          out += c->members;
          out += inside ? "" : "]";
          i = close;
          continue;
        }
      }
    }
    out.push_back(re[i]);
  }
  return out;
}

uint32_t collapse(uint32_t cp, unicode::CpFlags f) {
  if (cp < 0x80) return cp;
  if (unicode::is_whitespace(f)) return 0x0B;
  if (f == unicode::kOutOfRange) return 0xD0;
  switch (unicode::category_of(f)) {
    case unicode::kNumber:
      return 0xD1;
    case unicode::kLetter:
      return 0xD2;
    case unicode::kPunctuation:
      return 0xD3;
    case unicode::kMark:
      return 0xD4;
    case unicode::kSymbol:
      return 0xD5;
    default:
      return 0xD0;
  }
}

std::string pcre2_message(int code) {
  std::array<PCRE2_UCHAR, 256> msg{};
  pcre2_get_error_message(code, msg.data(), msg.size());
  std::string s;
  for (PCRE2_UCHAR c : msg) {
    if (c == 0) break;
    s.push_back(c < 0x80 ? static_cast<char>(c) : '?');
  }
  return s;
}

}  // namespace

LlamaRegex::LlamaRegex(const std::string& regex) {
  collapsed_ = names_category(regex);
  compiled_form_ = collapsed_ ? collapse_regex(regex) : regex;
  const std::vector<uint32_t> units = unicode::decode(compiled_form_);
  int err = 0;
  PCRE2_SIZE at = 0;
  pcre2_code* code =
      pcre2_compile(units.data(), units.size(), PCRE2_DOLLAR_ENDONLY, &err, &at, nullptr);
  if (code == nullptr)
    throw_error(ErrorKind::kFormat, "pre-tokenizer regex /" + regex +
                                        "/ does not compile at offset " + std::to_string(at) +
                                        ": " + pcre2_message(err));
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // the interpreter runs it if this fails
  auto holder = std::make_shared<Code>();
  holder->code = code;
  code_ = std::move(holder);
}

void LlamaRegex::split(const uint32_t* cps, const uint8_t* flags, size_t begin, size_t end,
                       std::vector<uint32_t>& lengths) const {
  const size_t n = end - begin;
  std::vector<uint32_t> subject(n);
  for (size_t i = 0; i < n; ++i) {
    const uint32_t cp = cps[begin + i];
    const unicode::CpFlags f = flags[begin + i];
    subject[i] = collapsed_                                  ? collapse(cp, f)
                 : (cp >= 0x80 && unicode::is_whitespace(f)) ? 0x0Bu
                                                             : cp;
  }
  pcre2_match_data* md = pcre2_match_data_create_from_pattern(code_->code, nullptr);
  size_t pos = 0, gap = 0;
  bool after_empty = false;  // the last match was empty at pos: retry there, non-empty only
  while (pos <= n) {
    const uint32_t opts = after_empty ? PCRE2_NOTEMPTY_ATSTART | PCRE2_ANCHORED : 0;
    int rc = pcre2_match(code_->code, subject.data(), n, pos, opts, md, nullptr);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT)
      rc = pcre2_match(code_->code, subject.data(), n, pos, opts | PCRE2_NO_JIT, md, nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) {
      if (!after_empty) break;
      after_empty = false;
      ++pos;  // then search on from the next character
      continue;
    }
    if (rc < 0) {
      pcre2_match_data_free(md);
      throw_error(ErrorKind::kResource, "pre-tokenizer regex: matching failed at character " +
                                            std::to_string(begin + pos) + ": " + pcre2_message(rc));
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    const size_t s = ov[0], e = ov[1];
    if (s > gap) lengths.push_back(static_cast<uint32_t>(s - gap));
    if (e > s) lengths.push_back(static_cast<uint32_t>(e - s));
    gap = e;
    pos = e;
    after_empty = e == s;
    if (after_empty && e == n) break;
  }
  if (n > gap) lengths.push_back(static_cast<uint32_t>(n - gap));
  pcre2_match_data_free(md);
}

}  // namespace hablar::tokenizer
