// The interpreter's internal error: a Python-style message plus the template position where it
// arose (filled in by the innermost node that sees it). ChatTemplate turns it into hablar::Error
// "template:LINE:COL: message".
#pragma once

#include <exception>
#include <string>
#include <utility>

namespace hablar::chat::jinja {

struct SourcePos {
  int line = 0;  // 1-based; 0 = unknown
  int column = 0;
};

class JinjaError : public std::exception {
 public:
  explicit JinjaError(std::string message, SourcePos pos = {})
      : message_(std::move(message)), pos_(pos) {}
  const char* what() const noexcept override { return message_.c_str(); }
  const std::string& message() const { return message_; }
  SourcePos pos() const { return pos_; }
  void set_pos_if_unknown(SourcePos pos) {
    if (pos_.line == 0) pos_ = pos;
  }
  // "template:LINE:COL: message"
  std::string formatted() const {
    return "template:" + std::to_string(pos_.line) + ":" + std::to_string(pos_.column) + ": " +
           message_;
  }

 private:
  std::string message_;
  SourcePos pos_;
};

}  // namespace hablar::chat::jinja
