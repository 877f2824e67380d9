// Nesting depth of JSON text, measured without parsing it. Request bodies and model output
// are checked with this before they are parsed: every later walk over the parsed value
// (dumping it in an error, converting it into template values, comparing it) recurses once
// per level, so a value nested tens of thousands deep would overflow the stack.
#pragma once

#include <cstddef>
#include <string_view>

namespace hablar {

// The deepest nesting of '[' / '{' outside strings (0 for a scalar). It stops counting once
// past `stop_at` (returns that much plus one), so its cost does not depend on the rest.
inline size_t json_nesting_depth(std::string_view text, size_t stop_at = (size_t)-2) {
  size_t depth = 0, deepest = 0;
  bool in_string = false, escaped = false;
  for (char c : text) {
    if (in_string) {
      if (escaped)
        escaped = false;
      else if (c == '\\')
        escaped = true;
      else if (c == '"')
        in_string = false;
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > deepest) deepest = depth;
      if (deepest > stop_at) return deepest;
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return deepest;
}

// The most levels of nesting hablar accepts in JSON from outside (requests, tool-call
// arguments, model output). Real requests need fewer than 20 (tool schemas are the deepest).
constexpr size_t kMaxJsonDepth = 64;

}  // namespace hablar
