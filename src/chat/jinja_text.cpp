// Python str semantics over UTF-8.
#include "chat/jinja_text.h"

#include "chat/jinja_error.h"

#include <utf8proc.h>

#include <algorithm>

namespace hablar::chat::jinja::text {
namespace {

std::string encode(const std::vector<std::uint32_t>& cps, std::size_t begin, std::size_t end) {
  std::string out;
  for (std::size_t i = begin; i < end; ++i) utf8_append(out, cps[i]);
  return out;
}

bool is_cased_letter(std::uint32_t cp) {
  auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(cp));
  return cat == UTF8PROC_CATEGORY_LU || cat == UTF8PROC_CATEGORY_LL || cat == UTF8PROC_CATEGORY_LT;
}

std::uint32_t to_upper(std::uint32_t cp) {
  return static_cast<std::uint32_t>(utf8proc_toupper(static_cast<utf8proc_int32_t>(cp)));
}
std::uint32_t to_lower(std::uint32_t cp) {
  return static_cast<std::uint32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(cp)));
}

}  // namespace

std::string strip(std::string_view s, const std::optional<std::string>& chars, StripSide side) {
  auto cps = utf8_decode(s);
  std::vector<std::uint32_t> set;
  if (chars) set = utf8_decode(*chars);
  auto strip_it = [&](std::uint32_t cp) {
    return chars ? std::find(set.begin(), set.end(), cp) != set.end() : is_python_space(cp);
  };
  std::size_t begin = 0, end = cps.size();
  if (side != StripSide::kRight)
    while (begin < end && strip_it(cps[begin])) ++begin;
  if (side != StripSide::kLeft)
    while (end > begin && strip_it(cps[end - 1])) --end;
  return encode(cps, begin, end);
}

std::vector<std::string> split(std::string_view s, const std::optional<std::string>& sep,
                               std::int64_t maxsplit, bool from_right) {
  std::vector<std::string> parts;
  if (sep) {
    if (sep->empty()) throw JinjaError("empty separator");
    std::string str(s);
    if (!from_right) {
      std::size_t pos = 0;
      while (maxsplit < 0 || static_cast<std::int64_t>(parts.size()) < maxsplit) {
        std::size_t hit = str.find(*sep, pos);
        if (hit == std::string::npos) break;
        parts.push_back(str.substr(pos, hit - pos));
        pos = hit + sep->size();
      }
      parts.push_back(str.substr(pos));
      return parts;
    }
    std::size_t end = str.size();
    while (maxsplit < 0 || static_cast<std::int64_t>(parts.size()) < maxsplit) {
      if (end < sep->size()) break;
      std::size_t hit = str.rfind(*sep, end - sep->size());
      if (hit == std::string::npos) break;
      parts.push_back(str.substr(hit + sep->size(), end - hit - sep->size()));
      end = hit;
    }
    parts.push_back(str.substr(0, end));
    std::reverse(parts.begin(), parts.end());
    return parts;
  }
  auto cps = utf8_decode(s);
  std::vector<std::pair<std::size_t, std::size_t>> words;
  std::size_t i = 0;
  while (i < cps.size()) {
    while (i < cps.size() && is_python_space(cps[i])) ++i;
    if (i == cps.size()) break;
    std::size_t j = i;
    while (j < cps.size() && !is_python_space(cps[j])) ++j;
    words.emplace_back(i, j);
    i = j;
  }
  if (maxsplit < 0 || static_cast<std::int64_t>(words.size()) <= maxsplit + 0) {
    for (auto [b, e] : words) parts.push_back(encode(cps, b, e));
    return parts;
  }
  std::size_t keep = static_cast<std::size_t>(maxsplit);
  if (!from_right) {
    for (std::size_t k = 0; k < keep; ++k)
      parts.push_back(encode(cps, words[k].first, words[k].second));
    std::size_t rest_end = cps.size();
    while (rest_end > words[keep].first && is_python_space(cps[rest_end - 1])) --rest_end;
    parts.push_back(encode(cps, words[keep].first, rest_end));
    return parts;
  }
  std::size_t first_kept = words.size() - keep;
  std::size_t rest_begin = 0;
  while (rest_begin < words[first_kept - 1].second && is_python_space(cps[rest_begin]))
    ++rest_begin;
  parts.push_back(encode(cps, rest_begin, words[first_kept - 1].second));
  for (std::size_t k = first_kept; k < words.size(); ++k)
    parts.push_back(encode(cps, words[k].first, words[k].second));
  return parts;
}

std::vector<std::string> splitlines(std::string_view s) {
  auto cps = utf8_decode(s);
  std::vector<std::string> lines;
  std::size_t begin = 0, i = 0;
  auto is_break = [](std::uint32_t cp) {
    return cp == '\n' || cp == '\r' || cp == 0x0B || cp == 0x0C || (cp >= 0x1C && cp <= 0x1E) ||
           cp == 0x85 || cp == 0x2028 || cp == 0x2029;
  };
  while (i < cps.size()) {
    if (!is_break(cps[i])) {
      ++i;
      continue;
    }
    lines.push_back(encode(cps, begin, i));
    if (cps[i] == '\r' && i + 1 < cps.size() && cps[i + 1] == '\n') ++i;
    begin = ++i;
  }
  if (begin < cps.size()) lines.push_back(encode(cps, begin, cps.size()));
  return lines;
}

std::string replace(std::string_view s, std::string_view old, std::string_view replacement,
                    std::int64_t count) {
  std::string out;
  if (old.empty()) {  // Python inserts the replacement between every character
    auto cps = utf8_decode(s);
    std::int64_t done = 0;
    for (std::size_t i = 0; i <= cps.size(); ++i) {
      if (count < 0 || done < count) {
        out += replacement;
        ++done;
      }
      if (i < cps.size()) utf8_append(out, cps[i]);
    }
    return out;
  }
  std::size_t pos = 0;
  std::int64_t done = 0;
  while (count < 0 || done < count) {
    std::size_t hit = s.find(old, pos);
    if (hit == std::string_view::npos) break;
    out.append(s.substr(pos, hit - pos));
    out.append(replacement);
    pos = hit + old.size();
    ++done;
  }
  out.append(s.substr(pos));
  return out;
}

std::string upper(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (std::uint32_t cp : utf8_decode(s)) {
    if (cp == 0xDF) {  // German sharp s upper-cases to two letters
      out += "SS";
      continue;
    }
    utf8_append(out, to_upper(cp));
  }
  return out;
}

std::string lower(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (std::uint32_t cp : utf8_decode(s)) utf8_append(out, to_lower(cp));
  return out;
}

std::string title(std::string_view s) {
  std::string out;
  bool previous_cased = false;
  for (std::uint32_t cp : utf8_decode(s)) {
    if (is_cased_letter(cp)) {
      utf8_append(out, previous_cased ? to_lower(cp) : to_upper(cp));
      previous_cased = true;
    } else {
      utf8_append(out, cp);
      previous_cased = false;
    }
  }
  return out;
}

std::string capitalize(std::string_view s) {
  auto cps = utf8_decode(s);
  std::string out;
  for (std::size_t i = 0; i < cps.size(); ++i)
    utf8_append(out, i == 0 ? to_upper(cps[i]) : to_lower(cps[i]));
  return out;
}

std::string jinja_title(std::string_view s) {
  // Words begin after runs of '-', white space, '(', '{', '[', '<'.
  auto cps = utf8_decode(s);
  std::string out;
  bool at_word_start = true;
  for (std::uint32_t cp : cps) {
    bool separator =
        cp == '-' || cp == '(' || cp == '{' || cp == '[' || cp == '<' || is_python_space(cp);
    if (separator) {
      utf8_append(out, cp);
      at_word_start = true;
    } else {
      utf8_append(out, at_word_start ? to_upper(cp) : to_lower(cp));
      at_word_start = false;
    }
  }
  return out;
}

std::int64_t find(std::string_view s, std::string_view sub, bool from_right) {
  std::size_t hit = from_right ? s.rfind(sub) : s.find(sub);
  if (hit == std::string_view::npos) return -1;
  return static_cast<std::int64_t>(utf8_length(s.substr(0, hit)));
}

std::size_t count(std::string_view s, std::string_view sub) {
  if (sub.empty()) return utf8_length(s) + 1;
  std::size_t n = 0;
  for (std::size_t pos = s.find(sub); pos != std::string_view::npos;
       pos = s.find(sub, pos + sub.size()))
    ++n;
  return n;
}

std::size_t word_count(std::string_view s) {
  std::size_t words = 0;
  bool in_word = false;
  for (std::uint32_t cp : utf8_decode(s)) {
    auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(cp));
    bool word_char = cp == '_' || (cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO) ||
                     (cat >= UTF8PROC_CATEGORY_ND && cat <= UTF8PROC_CATEGORY_NO);
    if (word_char && !in_word) ++words;
    in_word = word_char;
  }
  return words;
}

}  // namespace hablar::chat::jinja::text
