// Python string formatting for the Jinja interpreter: `fmt % args` and `fmt.format(...)`.
#pragma once

#include "chat/jinja_value.h"

#include <string>

namespace hablar::chat::jinja {

// printf-style `fmt % args` (args: one value, a tuple, or a dict for %(name)s).
std::string percent_format(const std::string& fmt, const Value& args);
// str.format with {} / {0} / {name}, !r / !s conversions and format specs.
std::string brace_format(const std::string& fmt, const CallArgs& args);

}  // namespace hablar::chat::jinja
