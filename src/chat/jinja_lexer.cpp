// The Jinja lexer: splits template text into data and tag tokens, applying whitespace control
// the way jinja2 does (`-` strips all white space on that side; trim_blocks drops the first
// newline after a block or comment tag; lstrip_blocks drops spaces and tabs between a line's
// start and a block or comment tag; `+` after the opener turns lstrip off for that tag).
#include "chat/jinja_ast.h"

#include <cctype>
#include <cstring>

namespace hablar::chat::jinja {
namespace {

bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

class Lexer {
 public:
  Lexer(std::string_view source, const LexerOptions& options) : options_(options) {
    normalize_newlines(source);
    line_starts_.push_back(0);
    for (std::size_t i = 0; i < src_.size(); ++i)
      if (src_[i] == '\n') line_starts_.push_back(i + 1);
  }

  std::vector<Token> run() {
    std::size_t pos = 0;
    bool strip_next = false;    // previous tag ended with '-'
    bool trim_newline = false;  // previous tag was a block/comment and trim_blocks is on
    while (pos <= src_.size()) {
      std::size_t open = find_opener(pos);
      std::string data = src_.substr(pos, open - pos);
      if (strip_next) {
        std::size_t k = 0;
        while (k < data.size() && is_space(data[k])) ++k;
        data.erase(0, k);
      } else if (trim_newline && !data.empty() && data[0] == '\n') {
        data.erase(0, 1);
      }
      strip_next = trim_newline = false;
      if (open == src_.size()) {
        push_data(std::move(data), pos);
        break;
      }
      char type = src_[open + 1];  // '{', '%' or '#'
      char modifier = open + 2 < src_.size() ? src_[open + 2] : '\0';
      if (modifier == '-') {
        while (!data.empty() && is_space(data.back())) data.pop_back();
      } else if (type != '{' && modifier != '+' && options_.lstrip_blocks) {
        lstrip_line(data, open);
      }
      push_data(std::move(data), pos);
      std::size_t body = open + 2 + ((modifier == '-' || modifier == '+') ? 1 : 0);
      bool block_like = type != '{';
      if (type == '#') {
        std::size_t close = src_.find("#}", body);
        if (close == std::string::npos) fail(open, "unexpected end of template: unclosed comment");
        strip_next = close > body && src_[close - 1] == '-';
        pos = close + 2;
      } else {
        pos = lex_tag(type, open, body, strip_next);
        if (raw_pending_) pos = lex_raw(pos, strip_next);
      }
      if (!strip_next && block_like && options_.trim_blocks) trim_newline = true;
    }
    tokens_.push_back(Token{TokenKind::kEnd, "", 0, 0, position(src_.size())});
    return std::move(tokens_);
  }

 private:
  void normalize_newlines(std::string_view source) {
    src_.reserve(source.size());
    for (std::size_t i = 0; i < source.size(); ++i) {
      if (source[i] == '\r') {
        src_ += '\n';
        if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
      } else {
        src_ += source[i];
      }
    }
    if (!options_.keep_trailing_newline && !src_.empty() && src_.back() == '\n') src_.pop_back();
  }

  SourcePos position(std::size_t offset) const {
    std::size_t lo = 0, hi = line_starts_.size();
    while (hi - lo > 1) {
      std::size_t mid = (lo + hi) / 2;
      if (line_starts_[mid] <= offset)
        lo = mid;
      else
        hi = mid;
    }
    return SourcePos{static_cast<int>(lo + 1), static_cast<int>(offset - line_starts_[lo] + 1)};
  }

  [[noreturn]] void fail(std::size_t offset, const std::string& message) const {
    throw JinjaError(message, position(offset));
  }

  std::size_t find_opener(std::size_t from) const {
    for (std::size_t i = from; i + 1 < src_.size(); ++i) {
      if (src_[i] == '{' && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#'))
        return i;
    }
    return src_.size();
  }

  // Removes the spaces and tabs that precede a block tag at `open` when they start its line.
  void lstrip_line(std::string& data, std::size_t open) const {
    std::size_t j = open;
    while (j > 0 && (src_[j - 1] == ' ' || src_[j - 1] == '\t')) --j;
    if (j != 0 && src_[j - 1] != '\n') return;
    std::size_t count = open - j;
    if (count <= data.size()) data.resize(data.size() - count);
  }

  void push_data(std::string data, std::size_t offset) {
    if (data.empty()) return;
    tokens_.push_back(Token{TokenKind::kData, std::move(data), 0, 0, position(offset)});
  }

  void push(TokenKind kind, std::string text, std::size_t offset) {
    tokens_.push_back(Token{kind, std::move(text), 0, 0, position(offset)});
  }

  // Lexes the inside of {{ ... }} or {% ... %}; returns the offset after the closing tag.
  std::size_t lex_tag(char type, std::size_t open, std::size_t i, bool& strip_next) {
    const char close_char = type == '{' ? '}' : '%';
    push(type == '{' ? TokenKind::kVarBegin : TokenKind::kBlockBegin, "", open);
    std::size_t first_token = tokens_.size();
    int depth = 0;  // open brackets: a '}' inside {{ {'a': 1} }} is not the end
    while (true) {
      while (i < src_.size() && is_space(src_[i])) ++i;
      if (i >= src_.size()) fail(open, "unexpected end of template: unclosed tag");
      if (depth == 0) {
        const std::string closer = std::string(1, close_char) + "}";
        bool minus = src_[i] == '-' && src_.compare(i + 1, 2, closer) == 0;
        if (minus || src_.compare(i, 2, closer) == 0) {
          strip_next = minus;
          push(type == '{' ? TokenKind::kVarEnd : TokenKind::kBlockEnd, "", i);
          if (type == '%' && tokens_.size() == first_token + 2 &&
              tokens_[first_token].kind == TokenKind::kName && tokens_[first_token].text == "raw")
            raw_pending_ = true;
          return i + (minus ? 3 : 2);
        }
      }
      i = lex_token(i, depth);
    }
  }

  // After {% raw %}: everything up to {% endraw %} is data.
  std::size_t lex_raw(std::size_t pos, bool& strip_next) {
    raw_pending_ = false;
    tokens_.resize(tokens_.size() - 3);  // drop {% raw %}
    std::size_t search = pos;
    while (true) {
      std::size_t open = src_.find("{%", search);
      if (open == std::string::npos) fail(pos, "unexpected end of template: missing endraw");
      std::size_t k = open + 2;
      bool strip_before = k < src_.size() && src_[k] == '-';
      if (strip_before || (k < src_.size() && src_[k] == '+')) ++k;
      while (k < src_.size() && is_space(src_[k])) ++k;
      if (src_.compare(k, 6, "endraw") != 0) {
        search = open + 2;
        continue;
      }
      k += 6;
      while (k < src_.size() && is_space(src_[k])) ++k;
      bool minus = k < src_.size() && src_[k] == '-';
      if (minus) ++k;
      if (src_.compare(k, 2, "%}") != 0) fail(k, "expected '%}' after endraw");
      std::string data = src_.substr(pos, open - pos);
      if (strip_next) {
        std::size_t s = 0;
        while (s < data.size() && is_space(data[s])) ++s;
        data.erase(0, s);
      }
      if (strip_before)
        while (!data.empty() && is_space(data.back())) data.pop_back();
      push_data(std::move(data), pos);
      strip_next = minus;
      return k + 2;
    }
  }

  std::size_t lex_token(std::size_t i, int& depth) {
    char c = src_[i];
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      std::size_t j = i;
      while (j < src_.size() &&
             (std::isalnum(static_cast<unsigned char>(src_[j])) || src_[j] == '_'))
        ++j;
      push(TokenKind::kName, src_.substr(i, j - i), i);
      return j;
    }
    if (std::isdigit(static_cast<unsigned char>(c))) return lex_number(i);
    if (c == '\'' || c == '"') return lex_string(i);
    static const char* const kOps[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*",
                                       "/",  "%",  "~",  "<",  ">",  "=",  "(", ")", "[",
                                       "]",  "{",  "}",  ",",  ".",  ":",  "|", ";"};
    for (const char* op : kOps) {
      std::size_t n = std::strlen(op);
      if (src_.compare(i, n, op) == 0) {
        if (op[0] == '(' || op[0] == '[' || op[0] == '{') ++depth;
        if ((op[0] == ')' || op[0] == ']' || op[0] == '}') && depth > 0) --depth;
        push(TokenKind::kOperator, op, i);
        return i + n;
      }
    }
    fail(i, std::string("unexpected char '") + c + "'");
  }

  std::size_t lex_number(std::size_t i) {
    std::size_t j = i;
    auto digits = [&] {
      while (j < src_.size() &&
             (std::isdigit(static_cast<unsigned char>(src_[j])) || src_[j] == '_'))
        ++j;
    };
    digits();
    bool is_float = false;
    if (j + 1 < src_.size() && src_[j] == '.' &&
        std::isdigit(static_cast<unsigned char>(src_[j + 1]))) {
      is_float = true;
      ++j;
      digits();
    }
    if (j < src_.size() && (src_[j] == 'e' || src_[j] == 'E')) {
      std::size_t k = j + 1;
      if (k < src_.size() && (src_[k] == '+' || src_[k] == '-')) ++k;
      if (k < src_.size() && std::isdigit(static_cast<unsigned char>(src_[k]))) {
        is_float = true;
        j = k;
        digits();
      }
    }
    std::string text;
    for (std::size_t k = i; k < j; ++k)
      if (src_[k] != '_') text += src_[k];
    Token t{is_float ? TokenKind::kFloat : TokenKind::kInt, text, 0, 0, position(i)};
    try {
      if (is_float)
        t.float_value = std::stod(text);
      else
        t.int_value = std::stoll(text);
    } catch (const std::exception&) {
      fail(i, "number out of range: " + text);
    }
    tokens_.push_back(std::move(t));
    return j;
  }

  std::size_t lex_string(std::size_t i) {
    char quote = src_[i];
    std::string out;
    std::size_t j = i + 1;
    while (true) {
      if (j >= src_.size()) fail(i, "unexpected end of string");
      char c = src_[j];
      if (c == quote) break;
      if (c != '\\' || j + 1 >= src_.size()) {
        out += c;
        ++j;
        continue;
      }
      j = lex_escape(j, out);
    }
    push(TokenKind::kString, std::move(out), i);
    return j + 1;
  }

  // Python string escapes; an unknown escape keeps its backslash.
  std::size_t lex_escape(std::size_t j, std::string& out) {
    char e = src_[j + 1];
    switch (e) {
      case 'n':
        out += '\n';
        return j + 2;
      case 't':
        out += '\t';
        return j + 2;
      case 'r':
        out += '\r';
        return j + 2;
      case '\\':
        out += '\\';
        return j + 2;
      case '\'':
        out += '\'';
        return j + 2;
      case '"':
        out += '"';
        return j + 2;
      case 'a':
        out += '\a';
        return j + 2;
      case 'b':
        out += '\b';
        return j + 2;
      case 'f':
        out += '\f';
        return j + 2;
      case 'v':
        out += '\v';
        return j + 2;
      case '0':
        out += '\0';
        return j + 2;
      case '\n':
        return j + 2;
      case 'x':
      case 'u':
      case 'U': {
        std::size_t n = e == 'x' ? 2 : e == 'u' ? 4 : 8;
        if (j + 2 + n > src_.size()) fail(j, "truncated \\" + std::string(1, e) + " escape");
        std::uint32_t cp = 0;
        for (std::size_t k = 0; k < n; ++k) {
          char h = src_[j + 2 + k];
          if (!std::isxdigit(static_cast<unsigned char>(h)))
            fail(j, "invalid \\" + std::string(1, e) + " escape");
          cp = cp * 16 + static_cast<std::uint32_t>(std::isdigit(static_cast<unsigned char>(h))
                                                        ? h - '0'
                                                        : (std::tolower(h) - 'a' + 10));
        }
        utf8_append(out, cp);
        return j + 2 + n;
      }
      default:
        out += '\\';
        out += e;
        return j + 2;
    }
  }

  LexerOptions options_;
  std::string src_;
  std::vector<std::size_t> line_starts_;
  std::vector<Token> tokens_;
  bool raw_pending_ = false;
};

}  // namespace

std::vector<Token> tokenize(std::string_view source, const LexerOptions& options) {
  return Lexer(source, options).run();
}

}  // namespace hablar::chat::jinja
