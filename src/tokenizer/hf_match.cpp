// Pattern matching for tokenizer.json: regexes through PCRE2 (UTF, Unicode properties,
// JIT), as `tokenizers` matches them with Oniguruma; literal strings by search.
#include <memory>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "core/error.h"
#include "formats/hf_json.h"
#include "tokenizer/hf_pipeline.h"
#include "tokenizer/unicode.h"

namespace hablar::tokenizer::hf {
namespace {

class RegexMatcher final : public Matcher {
 public:
  RegexMatcher(const std::string& pattern, const std::string& where) {
    int err = 0;
    PCRE2_SIZE at = 0;
    code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                          PCRE2_UTF | PCRE2_UCP, &err, &at, nullptr);
    if (code_ == nullptr) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof msg);
      throw_error(ErrorKind::kFormat, where + ": regex /" + pattern +
                                          "/ does not compile at offset " + std::to_string(at) +
                                          ": " + reinterpret_cast<char*>(msg));
    }
    pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE);  // falls back to the interpreter if it fails
  }
  ~RegexMatcher() override { pcre2_code_free(code_); }

  void find_all(std::string_view text,
                std::vector<std::pair<size_t, size_t>>& spans) const override {
    pcre2_match_data* md = pcre2_match_data_create_from_pattern(code_, nullptr);
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
    size_t pos = 0;
    while (pos <= text.size()) {
      int rc = pcre2_match(code_, subject, text.size(), pos, PCRE2_NO_UTF_CHECK, md, nullptr);
      if (rc < 0 && rc != PCRE2_ERROR_NOMATCH)  // e.g. the JIT stack: the interpreter has more room
        rc = pcre2_match(code_, subject, text.size(), pos, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, md,
                         nullptr);
      if (rc == PCRE2_ERROR_NOMATCH) break;
      if (rc < 0) {
        pcre2_match_data_free(md);
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(rc, msg, sizeof msg);
        throw_error(ErrorKind::kResource, "tokenizer regex: matching failed at byte " +
                                              std::to_string(pos) + ": " +
                                              reinterpret_cast<char*>(msg));
      }
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
      const size_t s = ov[0], e = ov[1];
      if (e > s) {
        spans.emplace_back(s, e);
        pos = e;
      } else {  // an empty match: step over one character
        if (s >= text.size()) break;
        pos = s + unicode::utf8_len(static_cast<uint8_t>(text[s]));
      }
    }
    pcre2_match_data_free(md);
  }

 private:
  pcre2_code* code_ = nullptr;
};

class LiteralMatcher final : public Matcher {
 public:
  explicit LiteralMatcher(std::string s) : needle_(std::move(s)) {}
  void find_all(std::string_view text,
                std::vector<std::pair<size_t, size_t>>& spans) const override {
    if (needle_.empty()) return;
    for (size_t at = text.find(needle_); at != std::string_view::npos;
         at = text.find(needle_, at + needle_.size()))
      spans.emplace_back(at, at + needle_.size());
  }

 private:
  std::string needle_;
};

}  // namespace

std::shared_ptr<const Matcher> Matcher::regex(const std::string& pattern,
                                              const std::string& where) {
  return std::make_shared<RegexMatcher>(pattern, where);
}

std::shared_ptr<const Matcher> Matcher::literal(std::string text) {
  return std::make_shared<LiteralMatcher>(std::move(text));
}

std::shared_ptr<const Matcher> Matcher::from_json(const nlohmann::json& j,
                                                  const std::string& where) {
  if (j.is_object() && j.contains("String") && j["String"].is_string())
    return literal(j["String"].get<std::string>());
  if (j.is_object() && j.contains("Regex") && j["Regex"].is_string())
    return regex(j["Regex"].get<std::string>(), where);
  throw_error(ErrorKind::kFormat,
              where + ": pattern must be {\"String\": ...} or {\"Regex\": ...}");
}

}  // namespace hablar::tokenizer::hf
