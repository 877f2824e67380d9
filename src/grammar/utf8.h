// Small UTF-8 helpers for the grammar layer.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace hablar::grammar {

// Decodes the code point at the start of s (not empty) into cp; returns the bytes used.
// A malformed or cut-off sequence decodes as its first byte alone (as llama.cpp's parser).
inline size_t decode_utf8_lenient(std::string_view s, uint32_t& cp) {
  const auto b0 = (unsigned char)s[0];
  int n = b0 < 0x80 ? 1 : (b0 >> 5) == 0x6 ? 2 : (b0 >> 4) == 0xE ? 3 : (b0 >> 3) == 0x1E ? 4 : 0;
  if (n <= 1 || (size_t)n > s.size()) {
    cp = b0;
    return 1;
  }
  uint32_t v = b0 & (0x7F >> n);
  for (int i = 1; i < n; ++i) {
    const auto b = (unsigned char)s[(size_t)i];
    if ((b & 0xC0) != 0x80) {
      cp = b0;
      return 1;
    }
    v = (v << 6) | (b & 0x3F);
  }
  cp = v;
  return (size_t)n;
}

inline void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += (char)cp;
  } else if (cp < 0x800) {
    out += (char)(0xC0 | (cp >> 6));
    out += (char)(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += (char)(0xE0 | (cp >> 12));
    out += (char)(0x80 | ((cp >> 6) & 0x3F));
    out += (char)(0x80 | (cp & 0x3F));
  } else {
    out += (char)(0xF0 | (cp >> 18));
    out += (char)(0x80 | ((cp >> 12) & 0x3F));
    out += (char)(0x80 | ((cp >> 6) & 0x3F));
    out += (char)(0x80 | (cp & 0x3F));
  }
}

}  // namespace hablar::grammar
