// tokenizer.json pre-tokenizers: each splits every piece of a list into smaller pieces.
//
// A split finds the pattern's matches in a piece; the piece is then cut into alternating
// gaps and matches, which the behaviour joins or drops as `tokenizers` does:
//   Removed            matches dropped, gaps kept
//   Isolated           every gap and every match its own piece
//   MergedWithPrevious a match joins the gap before it
//   MergedWithNext     a match joins the piece after it (unless that is a match too)
//   Contiguous         consecutive matches join into one piece
// `invert` swaps matches and gaps. A character-class pattern (digits, punctuation, white
// space, one delimiter) matches each such character on its own. Empty pieces are dropped.
#include <functional>

#include <utf8proc.h>

#include "core/error.h"
#include "formats/hf_json.h"
#include "tokenizer/hf_pipeline.h"
#include "tokenizer/tokenizer_impl.h"
#include "tokenizer/unicode.h"

namespace hablar::tokenizer::hf {
namespace {

using formats::json_bool_or;
using formats::json_string_or;
using nlohmann::json;

enum class Behavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

struct Span {
  size_t begin, end;
  bool match;
};

// Cuts `p` at the spans (which cover it) per the behaviour; appends the pieces to `out`.
void cut(const Piece& p, std::vector<Span>& spans, Behavior b, bool invert,
         std::vector<Piece>& out) {
  if (invert)
    for (Span& s : spans) s.match = !s.match;
  std::vector<Span> parts;
  bool prev_match = false;
  switch (b) {
    case Behavior::kRemoved:
      for (const Span& s : spans)
        if (!s.match) parts.push_back(s);
      break;
    case Behavior::kIsolated:
      parts = spans;
      break;
    case Behavior::kMergedWithPrevious:
      for (const Span& s : spans) {
        if (s.match && !prev_match && !parts.empty())
          parts.back().end = s.end;
        else
          parts.push_back(s);
        prev_match = s.match;
      }
      break;
    case Behavior::kMergedWithNext:
      for (auto it = spans.rbegin(); it != spans.rend(); ++it) {
        if (it->match && !prev_match && !parts.empty())
          parts.back().begin = it->begin;
        else
          parts.push_back(*it);
        prev_match = it->match;
      }
      std::reverse(parts.begin(), parts.end());
      break;
    case Behavior::kContiguous:
      for (const Span& s : spans) {
        if (s.match == prev_match && !parts.empty())
          parts.back().end = s.end;
        else
          parts.push_back(s);
        prev_match = s.match;
      }
      break;
  }
  for (const Span& s : parts)
    if (s.end > s.begin)
      out.push_back({p.text.substr(s.begin, s.end - s.begin), p.at_start && s.begin == 0});
}

// Match spans -> spans covering the whole text (gaps between them as non-matches).
std::vector<Span> cover(size_t n, const std::vector<std::pair<size_t, size_t>>& matches) {
  std::vector<Span> spans;
  size_t prev = 0;
  for (const auto& [b, e] : matches) {
    if (b > prev) spans.push_back({prev, b, false});
    spans.push_back({b, e, true});
    prev = e;
  }
  if (n > prev) spans.push_back({prev, n, false});
  return spans;
}

// Each character for which pred holds is a match of its own.
std::vector<Span> char_spans(const std::string& s, const std::function<bool(uint32_t)>& pred) {
  std::vector<std::pair<size_t, size_t>> m;
  for (size_t pos = 0; pos < s.size();) {
    const size_t start = pos;
    if (pred(unicode::decode_one(s, pos))) m.emplace_back(start, pos);
  }
  return cover(s.size(), m);
}

bool is_ws(uint32_t cp) {
  return unicode::is_whitespace(unicode::flags_of(cp));
}
bool is_punct(uint32_t cp) {
  if (cp < 0x80) return cp > 0x20 && cp < 0x7F && !std::isalnum((int)cp);
  return unicode::category_of(unicode::flags_of(cp)) == unicode::kPunctuation;
}
bool is_numeric(uint32_t cp) {
  return unicode::is_number(unicode::flags_of(cp));
}

class CharSplit final : public PreTokenizer {
 public:
  CharSplit(std::function<bool(uint32_t)> pred, Behavior b) : pred_(std::move(pred)), b_(b) {}
  void apply(std::vector<Piece>& pieces) const override {
    std::vector<Piece> out;
    for (const Piece& p : pieces) {
      std::vector<Span> spans = char_spans(p.text, pred_);
      cut(p, spans, b_, false, out);
    }
    pieces = std::move(out);
  }

 private:
  std::function<bool(uint32_t)> pred_;
  Behavior b_;
};

void split_with(const Matcher& m, const Piece& p, Behavior b, bool invert,
                std::vector<Piece>& out) {
  std::vector<std::pair<size_t, size_t>> matches;
  m.find_all(p.text, matches);
  std::vector<Span> spans = cover(p.text.size(), matches);
  cut(p, spans, b, invert, out);
}

class PatternSplit final : public PreTokenizer {
 public:
  PatternSplit(std::shared_ptr<const Matcher> m, Behavior b, bool invert)
      : m_(std::move(m)), b_(b), invert_(invert) {}
  void apply(std::vector<Piece>& pieces) const override {
    std::vector<Piece> out;
    for (const Piece& p : pieces) split_with(*m_, p, b_, invert_, out);
    pieces = std::move(out);
  }

 private:
  std::shared_ptr<const Matcher> m_;
  Behavior b_;
  bool invert_;
};

constexpr const char* kGpt2Regex =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// \w+|[^\w\s]+ with Oniguruma's Unicode \w (letters, marks, decimal digits, connector
// punctuation, joiners); PCRE2 before 10.43 leaves marks out of \w.
constexpr const char* kWhitespaceRegex =
    R"([\p{L}\p{M}\p{Nd}\p{Pc}\x{200C}\x{200D}]+|[^\p{L}\p{M}\p{Nd}\p{Pc}\x{200C}\x{200D}\s]+)";

// GPT-2's: a space prefix, the GPT-2 split, then every byte as its printable stand-in.
class ByteLevel final : public PreTokenizer {
 public:
  ByteLevel(bool prefix, bool use_regex, const std::string& where)
      : prefix_(prefix), split_(use_regex ? Matcher::regex(kGpt2Regex, where) : nullptr) {}
  void apply(std::vector<Piece>& pieces) const override {
    std::vector<Piece> out;
    for (Piece p : pieces) {
      if (prefix_ && (p.text.empty() || p.text[0] != ' ')) p.text = " " + p.text;
      if (split_) {
        split_with(*split_, p, Behavior::kIsolated, false, out);
      } else {
        out.push_back(p);
      }
    }
    for (Piece& p : out) {
      std::string mapped;
      for (char c : p.text) unicode::append_utf8(mapped, byte_to_cp(static_cast<uint8_t>(c)));
      p.text = std::move(mapped);
    }
    pieces = std::move(out);
  }

 private:
  bool prefix_;
  std::shared_ptr<const Matcher> split_;
};

// SentencePiece's spaces: ' ' -> U+2581, a U+2581 prepended (always, or only at the start
// of the input), then a cut before each U+2581.
class Metaspace final : public PreTokenizer {
 public:
  enum class Prepend { kAlways, kFirst, kNever };
  Metaspace(std::string rep, Prepend prepend, bool split)
      : rep_(std::move(rep)), prepend_(prepend), split_(split) {}
  void apply(std::vector<Piece>& pieces) const override {
    std::vector<Piece> out;
    const uint32_t rep_cp = unicode::decode(rep_).empty() ? 0 : unicode::decode(rep_)[0];
    for (Piece p : pieces) {
      std::string t;
      for (char c : p.text) {
        if (c == ' ')
          t.append(rep_);
        else
          t.push_back(c);
      }
      const bool want = prepend_ == Prepend::kAlways || (prepend_ == Prepend::kFirst && p.at_start);
      if (want && !t.starts_with(rep_)) t.insert(0, rep_);
      p.text = std::move(t);
      if (!split_) {
        out.push_back(std::move(p));
        continue;
      }
      std::vector<Span> spans = char_spans(p.text, [rep_cp](uint32_t cp) { return cp == rep_cp; });
      cut(p, spans, Behavior::kMergedWithNext, false, out);
    }
    pieces = std::move(out);
  }

 private:
  std::string rep_;
  Prepend prepend_;
  bool split_;
};

class Sequence final : public PreTokenizer {
 public:
  explicit Sequence(std::vector<std::unique_ptr<PreTokenizer>> steps) : steps_(std::move(steps)) {}
  void apply(std::vector<Piece>& pieces) const override {
    for (const auto& s : steps_) s->apply(pieces);
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> steps_;
};

Behavior behavior_of(const std::string& name, const std::string& where) {
  if (name == "Removed") return Behavior::kRemoved;
  if (name == "Isolated") return Behavior::kIsolated;
  if (name == "MergedWithPrevious") return Behavior::kMergedWithPrevious;
  if (name == "MergedWithNext") return Behavior::kMergedWithNext;
  if (name == "Contiguous") return Behavior::kContiguous;
  throw_error(ErrorKind::kFormat, where + ": unknown split behavior '" + name + "'");
}

std::unique_ptr<PreTokenizer> make_metaspace(const json& j, const std::string& at) {
  const std::string rep = json_string_or(j, "replacement", std::string(kMetaspace), at);
  if (rep.empty()) throw_error(ErrorKind::kFormat, at + ": empty replacement");
  Metaspace::Prepend prepend = json_bool_or(j, "add_prefix_space", true, at)
                                   ? Metaspace::Prepend::kAlways
                                   : Metaspace::Prepend::kNever;
  const std::string scheme = json_string_or(j, "prepend_scheme", "", at);
  if (scheme == "always")
    prepend = Metaspace::Prepend::kAlways;
  else if (scheme == "first")
    prepend = Metaspace::Prepend::kFirst;
  else if (scheme == "never")
    prepend = Metaspace::Prepend::kNever;
  else if (!scheme.empty())
    throw_error(ErrorKind::kFormat, at + ": unknown prepend_scheme '" + scheme + "'");
  return std::make_unique<Metaspace>(rep, prepend, json_bool_or(j, "split", true, at));
}

}  // namespace

std::unique_ptr<PreTokenizer> make_pre_tokenizer(const json& j, const std::string& where) {
  if (j.is_null()) return nullptr;
  if (!j.is_object()) throw_error(ErrorKind::kFormat, where + ": pre_tokenizer must be an object");
  const std::string type = json_string_or(j, "type", "", where);
  const std::string at = where + " pre_tokenizer " + type;
  if (type == "ByteLevel")
    return std::make_unique<ByteLevel>(json_bool_or(j, "add_prefix_space", true, at),
                                       json_bool_or(j, "use_regex", true, at), at);
  if (type == "Split") {
    if (!j.contains("pattern")) throw_error(ErrorKind::kFormat, at + ": no pattern");
    return std::make_unique<PatternSplit>(
        Matcher::from_json(j["pattern"], at),
        behavior_of(json_string_or(j, "behavior", "Isolated", at), at),
        json_bool_or(j, "invert", false, at));
  }
  if (type == "Metaspace") return make_metaspace(j, at);
  if (type == "Whitespace")
    return std::make_unique<PatternSplit>(Matcher::regex(kWhitespaceRegex, at), Behavior::kRemoved,
                                          true);
  if (type == "WhitespaceSplit") return std::make_unique<CharSplit>(is_ws, Behavior::kRemoved);
  if (type == "Digits")
    return std::make_unique<CharSplit>(is_numeric, json_bool_or(j, "individual_digits", false, at)
                                                       ? Behavior::kIsolated
                                                       : Behavior::kContiguous);
  if (type == "Punctuation")
    return std::make_unique<CharSplit>(
        is_punct, behavior_of(json_string_or(j, "behavior", "Isolated", at), at));
  if (type == "CharDelimiterSplit") {
    const std::vector<uint32_t> d = unicode::decode(json_string_or(j, "delimiter", "", at));
    if (d.size() != 1) throw_error(ErrorKind::kFormat, at + ": delimiter must be one character");
    const uint32_t cp = d[0];
    return std::make_unique<CharSplit>([cp](uint32_t c) { return c == cp; }, Behavior::kRemoved);
  }
  if (type == "BertPreTokenizer") {
    std::vector<std::unique_ptr<PreTokenizer>> steps;
    steps.push_back(std::make_unique<CharSplit>(is_ws, Behavior::kRemoved));
    steps.push_back(std::make_unique<CharSplit>(is_punct, Behavior::kIsolated));
    return std::make_unique<Sequence>(std::move(steps));
  }
  if (type == "Sequence") {
    const json* list = formats::json_array_or_null(j, "pretokenizers", at);
    std::vector<std::unique_ptr<PreTokenizer>> steps;
    if (list)
      for (const json& e : *list)
        if (auto p = make_pre_tokenizer(e, where)) steps.push_back(std::move(p));
    return std::make_unique<Sequence>(std::move(steps));
  }
  throw_error(ErrorKind::kUnsupported,
              where + ": unsupported pre_tokenizer '" + type +
                  "' (supported: ByteLevel, Split, Metaspace, Whitespace, WhitespaceSplit, Digits, "
                  "Punctuation, CharDelimiterSplit, BertPreTokenizer, Sequence)");
}

}  // namespace hablar::tokenizer::hf
