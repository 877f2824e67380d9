// tokenizer.json normalizers: each maps the text of a fragment to a new text.
#include <cstdlib>

#include <utf8proc.h>

#include "core/error.h"
#include "core/log.h"
#include "formats/hf_json.h"
#include "tokenizer/hf_pipeline.h"
#include "tokenizer/unicode.h"

namespace hablar::tokenizer::hf {
namespace {

using formats::json_bool_or;
using formats::json_string_or;
using nlohmann::json;

utf8proc_category_t category(uint32_t cp) {
  return utf8proc_category(static_cast<utf8proc_int32_t>(cp));
}

// Unicode normalization forms through utf8proc.
class UnicodeForm final : public Normalizer {
 public:
  explicit UnicodeForm(int options) : options_(options) {}
  void apply(std::string& s) const override {
    if (s.empty()) return;
    utf8proc_uint8_t* out = nullptr;
    const utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()),
                                            (utf8proc_ssize_t)s.size(), &out,
                                            (utf8proc_option_t)(UTF8PROC_STABLE | options_));
    if (n >= 0) s.assign(reinterpret_cast<const char*>(out), (size_t)n);
    std::free(out);
  }

 private:
  int options_;
};

// Maps every code point through fn(cp, out) (which appends the replacement).
template <typename Fn>
void map_cps(std::string& s, Fn&& fn) {
  std::string out;
  out.reserve(s.size());
  for (size_t pos = 0; pos < s.size();) fn(unicode::decode_one(s, pos), out);
  s = std::move(out);
}

class Lowercase final : public Normalizer {
 public:
  void apply(std::string& s) const override {
    map_cps(s, [](uint32_t cp, std::string& out) {
      unicode::append_utf8(out, (uint32_t)utf8proc_tolower((utf8proc_int32_t)cp));
    });
  }
};

// StripAccents drops every mark (Mn, Mc, Me); BertNormalizer's accent stripping only the
// nonspacing ones (Mn), as `tokenizers` does.
bool is_mark(uint32_t cp) {
  const auto c = category(cp);
  return c == UTF8PROC_CATEGORY_MN || c == UTF8PROC_CATEGORY_MC || c == UTF8PROC_CATEGORY_ME;
}
bool is_nonspacing_mark(uint32_t cp) {
  return category(cp) == UTF8PROC_CATEGORY_MN;
}

class StripAccents final : public Normalizer {
 public:
  explicit StripAccents(bool nonspacing_only) : nonspacing_only_(nonspacing_only) {}
  void apply(std::string& s) const override {
    map_cps(s, [&](uint32_t cp, std::string& out) {
      if (!(nonspacing_only_ ? is_nonspacing_mark(cp) : is_mark(cp))) unicode::append_utf8(out, cp);
    });
  }

 private:
  bool nonspacing_only_;
};

bool white_space(uint32_t cp) {
  return unicode::is_whitespace(unicode::flags_of(cp));
}

class Strip final : public Normalizer {
 public:
  Strip(bool left, bool right) : left_(left), right_(right) {}
  void apply(std::string& s) const override {
    const std::vector<uint32_t> cps = unicode::decode(s);
    size_t b = 0, e = cps.size();
    while (left_ && b < e && white_space(cps[b])) ++b;
    while (right_ && e > b && white_space(cps[e - 1])) --e;
    std::string out;
    for (size_t i = b; i < e; ++i) unicode::append_utf8(out, cps[i]);
    s = std::move(out);
  }

 private:
  bool left_, right_;
};

class Replace final : public Normalizer {
 public:
  Replace(std::shared_ptr<const Matcher> m, std::string content)
      : m_(std::move(m)), content_(std::move(content)) {}
  void apply(std::string& s) const override {
    std::vector<std::pair<size_t, size_t>> spans;
    m_->find_all(s, spans);
    if (spans.empty()) return;
    std::string out;
    size_t prev = 0;
    for (const auto& [b, e] : spans) {
      out.append(s, prev, b - prev);
      out += content_;
      prev = e;
    }
    out.append(s, prev, std::string::npos);
    s = std::move(out);
  }

 private:
  std::shared_ptr<const Matcher> m_;
  std::string content_;
};

class Prepend final : public Normalizer {
 public:
  explicit Prepend(std::string p) : p_(std::move(p)) {}
  void apply(std::string& s) const override {
    if (!s.empty()) s.insert(0, p_);
  }

 private:
  std::string p_;
};

bool is_cjk(uint32_t c) {
  return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) ||
         (c >= 0x20000 && c <= 0x2A6DF) || (c >= 0x2A700 && c <= 0x2B73F) ||
         (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B920 && c <= 0x2CEAF) ||
         (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

// BERT's: drop controls and U+FFFD, white space to ' ', CJK padded with spaces, accents
// stripped (NFD, marks removed), lowercased.
class BertNormalizer final : public Normalizer {
 public:
  BertNormalizer(bool clean, bool chinese, bool strip, bool lower)
      : clean_(clean), chinese_(chinese), strip_(strip), lower_(lower) {}
  void apply(std::string& s) const override {
    map_cps(s, [&](uint32_t cp, std::string& out) {
      if (clean_) {
        if (cp == 0 || cp == 0xFFFD) return;
        const bool ws = cp == '\t' || cp == '\n' || cp == '\r' || cp == ' ' ||
                        category(cp) == UTF8PROC_CATEGORY_ZS;
        if (ws) {
          out += ' ';
          return;
        }
        const auto c = category(cp);
        if (c == UTF8PROC_CATEGORY_CC || c == UTF8PROC_CATEGORY_CF || c == UTF8PROC_CATEGORY_CO ||
            c == UTF8PROC_CATEGORY_CS)  // unassigned code points (Cn) stay
          return;
      }
      if (chinese_ && is_cjk(cp)) {
        out += ' ';
        unicode::append_utf8(out, cp);
        out += ' ';
        return;
      }
      unicode::append_utf8(out, cp);
    });
    if (strip_) {
      UnicodeForm(UTF8PROC_DECOMPOSE).apply(s);
      StripAccents(true).apply(s);
    }
    if (lower_) Lowercase().apply(s);
  }

 private:
  bool clean_, chinese_, strip_, lower_;
};

class Sequence final : public Normalizer {
 public:
  explicit Sequence(std::vector<std::unique_ptr<Normalizer>> steps) : steps_(std::move(steps)) {}
  void apply(std::string& s) const override {
    for (const auto& n : steps_) n->apply(s);
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> steps_;
};

}  // namespace

std::unique_ptr<Normalizer> make_normalizer(const json& j, const std::string& where) {
  if (j.is_null()) return nullptr;
  if (!j.is_object()) throw_error(ErrorKind::kFormat, where + ": normalizer must be an object");
  const std::string type = json_string_or(j, "type", "", where);
  const std::string at = where + " normalizer " + type;
  if (type == "NFC") return std::make_unique<UnicodeForm>(UTF8PROC_COMPOSE);
  if (type == "NFD") return std::make_unique<UnicodeForm>(UTF8PROC_DECOMPOSE);
  if (type == "NFKC") return std::make_unique<UnicodeForm>(UTF8PROC_COMPOSE | UTF8PROC_COMPAT);
  if (type == "NFKD") return std::make_unique<UnicodeForm>(UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT);
  if (type == "Precompiled") {
    // SentencePiece's compiled character map is NFKC plus a few model-specific rules; it
    // is approximated by NFKC (exact for most text, not for every model).
    log::warn("{}: the Precompiled normalizer is approximated by NFKC", where);
    return std::make_unique<UnicodeForm>(UTF8PROC_COMPOSE | UTF8PROC_COMPAT);
  }
  if (type == "Lowercase") return std::make_unique<Lowercase>();
  if (type == "StripAccents") return std::make_unique<StripAccents>(false);
  if (type == "Strip")
    return std::make_unique<Strip>(json_bool_or(j, "strip_left", true, at),
                                   json_bool_or(j, "strip_right", true, at));
  if (type == "Replace") {
    if (!j.contains("pattern")) throw_error(ErrorKind::kFormat, at + ": no pattern");
    return std::make_unique<Replace>(Matcher::from_json(j["pattern"], at),
                                     json_string_or(j, "content", "", at));
  }
  if (type == "Prepend") return std::make_unique<Prepend>(json_string_or(j, "prepend", "", at));
  if (type == "BertNormalizer") {
    const bool lower = json_bool_or(j, "lowercase", true, at);
    return std::make_unique<BertNormalizer>(json_bool_or(j, "clean_text", true, at),
                                            json_bool_or(j, "handle_chinese_chars", true, at),
                                            json_bool_or(j, "strip_accents", lower, at), lower);
  }
  if (type == "Sequence") {
    const json* list = formats::json_array_or_null(j, "normalizers", at);
    std::vector<std::unique_ptr<Normalizer>> steps;
    if (list)
      for (const json& e : *list)
        if (auto n = make_normalizer(e, where)) steps.push_back(std::move(n));
    return std::make_unique<Sequence>(std::move(steps));
  }
  throw_error(ErrorKind::kUnsupported,
              where + ": unsupported normalizer '" + type +
                  "' (supported: NFC, NFD, NFKC, NFKD, Precompiled (as NFKC), Lowercase, "
                  "StripAccents, Strip, Replace, Prepend, BertNormalizer, Sequence)");
}

}  // namespace hablar::tokenizer::hf
