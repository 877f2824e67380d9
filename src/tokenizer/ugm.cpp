// Unigram (UGM) vocabularies from GGUF (tokenizer.ggml.model "t5": T5, XLM-R and the
// SentencePiece unigram models llama.cpp converts), tokenized as llama.cpp does:
//   normalize: at each byte, a user-defined token's text passes as it is; else the longest
//     prefix found in the precompiled charsmap becomes its replacement; else one UTF-8
//     character passes (an invalid one becomes U+FFFD); spaces become U+2581, with one
//     prepended before the first non-space (add_space_prefix) and runs collapsed
//     (remove_extra_whitespaces);
//   Viterbi over the normalized bytes: every token (normal, user-defined at score 0, unused)
//     starting at each character competes on the summed score; a character no token covers
//     alone becomes the unknown token at the lowest normal score minus 10; consecutive
//     unknown tokens collapse into one.
// The charsmap is SentencePiece's: a u32 byte count, that many bytes of an XOR-compressed
// compact double array (XCDA) over input bytes, then NUL-terminated replacement strings.
#include <algorithm>
#include <cfloat>
#include <cstring>

#include "core/error.h"
#include "tokenizer/tokenizer_impl.h"
#include "tokenizer/unicode.h"

namespace hablar::tokenizer {
namespace {

constexpr std::string_view kSpaceMark = "\xE2\x96\x81";  // U+2581

// One XCDA entry: BASE in bits 10-30 (shifted left by 8 when bit 9 is set), LCHECK in bits
// 0-7 (with bit 31, set on entries that hold a replacement offset), LEAF in bit 8.
struct Xcda {
  const std::string& blob;  // the charsmap; the array starts at byte 4
  size_t size;              // entries
  uint32_t node(size_t i) const {
    if (i >= size)
      throw_error(ErrorKind::kFormat, "tokenizer.ggml.precompiled_charsmap: node " +
                                          std::to_string(i) + " is out of range");
    uint32_t v;
    std::memcpy(&v, blob.data() + 4 + 4 * i, 4);
    return v;
  }
  uint32_t base(size_t i) const {
    const uint32_t n = node(i);
    return (n >> 10) << ((n & (1u << 9)) >> 6);
  }
  uint32_t lcheck(size_t i) const { return node(i) & ((1u << 31) | 0xFFu); }
  bool leaf(size_t i) const { return ((node(i) >> 8) & 1) != 0; }
  uint32_t value(size_t i) const { return node(i) & ((1u << 31) - 1); }
};

// Bytes of the UTF-8 character at text[pos] as llama.cpp's decoder accepts it (a lead byte
// and its continuation bytes, overlong forms allowed); 0 if it is not one.
size_t valid_char_len(std::string_view text, size_t pos) {
  const uint8_t b = static_cast<uint8_t>(text[pos]);
  size_t n = 0;
  if (b < 0x80) return 1;
  if ((b & 0x40) == 0) return 0;
  n = (b & 0x20) == 0 ? 2 : (b & 0x10) == 0 ? 3 : (b & 0x08) == 0 ? 4 : 0;
  if (n == 0 || pos + n > text.size()) return 0;
  for (size_t k = 1; k < n; ++k)
    if ((static_cast<uint8_t>(text[pos + k]) & 0xC0) != 0x80) return 0;
  return n;
}

struct Span {
  std::string_view text;  // the normalized bytes
  size_t consumed;        // input bytes they stand for
};

Span normalize_prefix(const Tokenizer::Impl& v, std::string_view in, size_t pos) {
  size_t user = 0;
  v.ugm_user.match_at(
      in, pos, [&](int32_t id) { user = std::max(user, v.texts[static_cast<size_t>(id)].size()); });
  if (user > 0) return {in.substr(pos, user), user};
  size_t best_len = 0, best_off = 0;
  const std::string& map = v.ugm_charsmap;
  if (map.size() >= 4) {
    uint32_t blob = 0;
    std::memcpy(&blob, map.data(), 4);
    const Xcda x{map, std::min<size_t>(blob, map.size() - 4) / 4};
    size_t node = x.size > 0 ? x.base(0) : 0;
    for (size_t p = pos; p < in.size() && x.size > 0; ++p) {
      const uint8_t c = static_cast<uint8_t>(in[p]);
      if (c == 0) break;
      node ^= c;
      if (x.lcheck(node) != c) break;
      const bool is_leaf = x.leaf(node);
      node ^= x.base(node);
      if (is_leaf) {
        best_len = p - pos + 1;
        best_off = x.value(node);
      }
    }
    if (best_len > 0) {
      const size_t strings = 4 + static_cast<size_t>(blob);
      const size_t at = strings + best_off;
      const size_t end = at < map.size() ? map.find('\0', at) : std::string::npos;
      if (end == std::string::npos)
        throw_error(ErrorKind::kFormat,
                    "tokenizer.ggml.precompiled_charsmap: replacement out of range");
      return {std::string_view(map).substr(at, end - at), best_len};
    }
  }
  if (const size_t n = valid_char_len(in, pos)) return {in.substr(pos, n), n};
  return {"\xEF\xBF\xBD", 1};
}

std::string normalize(const Tokenizer::Impl& v, std::string_view in) {
  std::string out;
  out.reserve(in.size() * 3);
  bool prepended = false, in_word = false;
  for (size_t pos = 0; pos < in.size();) {
    const Span s = normalize_prefix(v, in, pos);
    for (char c : s.text) {
      if (c != ' ') {
        if (!in_word) {
          in_word = true;
          if ((v.add_space_prefix && !prepended) || v.ugm_merge_spaces) {
            out += kSpaceMark;
            prepended = true;
          }
        }
        out.push_back(c);
      } else {
        in_word = false;
        if (!v.ugm_merge_spaces) out += kSpaceMark;
      }
    }
    pos += s.consumed;
  }
  return out;
}

struct Best {
  int32_t token;
  size_t from;
  double score;
};

}  // namespace

void Tokenizer::Impl::encode_ugm(std::string_view text, std::vector<int32_t>& out) const {
  const std::string s = normalize(*this, text);
  const size_t n = s.size();
  if (n == 0) return;
  std::vector<Best> best(n + 1, Best{unk, 0, -DBL_MAX});
  best[0] = Best{unk, 0, 0.0};
  for (size_t pos = 0; pos < n;) {
    const size_t char_len = std::min(unicode::utf8_len(static_cast<uint8_t>(s[pos])), n - pos);
    const double here = best[pos].score;
    bool whole_char = false;
    ugm_tokens.match_at(s, pos, [&](int32_t id) {
      const size_t len = texts[static_cast<size_t>(id)].size();
      whole_char = whole_char || len == char_len;
      const double score =
          here + (types[static_cast<size_t>(id)] == TokenType::kUserDefined ? 0.0 : scores[id]);
      if (score > best[pos + len].score) best[pos + len] = Best{id, pos, score};
    });
    if (!whole_char) {
      const double score = here + ugm_unk_score;
      if (score > best[pos + char_len].score) best[pos + char_len] = Best{unk, pos, score};
    }
    pos += char_len;
  }
  const size_t first = out.size();
  bool prev_unknown = false;
  for (size_t at = n;;) {
    const Best& b = best[at];
    const bool unknown = b.token == unk;
    if (!(prev_unknown && unknown) && b.token >= 0) out.push_back(b.token);
    if (b.from == 0) break;
    prev_unknown = unknown;
    at = b.from;
  }
  std::reverse(out.begin() + static_cast<std::ptrdiff_t>(first), out.end());
}

void build_ugm(const gguf::GgufFile& f, Tokenizer::Impl& v) {
  const int32_t n = v.n_vocab();
  if (f.has("tokenizer.ggml.precompiled_charsmap")) {
    const gguf::Array& a = f.get_array("tokenizer.ggml.precompiled_charsmap");
    if (a.elem_type != gguf::ValueType::U8 && a.elem_type != gguf::ValueType::I8)
      throw_error(ErrorKind::kFormat,
                  f.path() + ": tokenizer.ggml.precompiled_charsmap must be an array of bytes");
    v.ugm_charsmap.assign(a.packed.begin(), a.packed.end());
    if (v.ugm_charsmap.size() < 4)
      throw_error(ErrorKind::kFormat, f.path() + ": tokenizer.ggml.precompiled_charsmap is " +
                                          std::to_string(v.ugm_charsmap.size()) + " bytes");
  }
  v.ugm_merge_spaces = f.get_bool_or("tokenizer.ggml.remove_extra_whitespaces", false);
  float min_score = FLT_MAX;
  v.pieces.assign(n, std::string());
  for (int32_t id = n - 1; id >= 0; --id) {  // last id first: a repeated text maps to its last id
    const TokenType t = v.types[id];
    const std::string& text = v.texts[id];
    if (t == TokenType::kNormal) min_score = std::min(min_score, v.scores[id]);
    if (text.empty()) continue;
    if (t == TokenType::kNormal || t == TokenType::kUserDefined || t == TokenType::kUnused)
      v.ugm_tokens.add(text, id);
    if (t == TokenType::kUserDefined) v.ugm_user.add(text, id);
  }
  v.ugm_unk_score = min_score - 10.0f;  // in float, as llama.cpp sums it
  for (int32_t id = 0; id < n; ++id) {
    const TokenType t = v.types[id];
    std::string piece;
    const std::string_view text = v.texts[id];
    for (size_t at = 0; at < text.size();) {  // U+2581 -> ' ' in normal tokens
      if (t == TokenType::kNormal && text.compare(at, kSpaceMark.size(), kSpaceMark) == 0) {
        piece.push_back(' ');
        at += kSpaceMark.size();
      } else {
        piece.push_back(text[at++]);
      }
    }
    if (t == TokenType::kNormal || t == TokenType::kControl || t == TokenType::kUnknown ||
        t == TokenType::kUserDefined)
      v.pieces[id] = std::move(piece);
  }
}

}  // namespace hablar::tokenizer
