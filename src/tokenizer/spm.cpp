// SentencePiece-style (BPE by piece score) and WordPiece encoders.
#include <queue>

#include "tokenizer/tokenizer_impl.h"
#include "tokenizer/unicode.h"

namespace hablar::tokenizer {
namespace {

struct SpmCandidate {
  float score;
  int32_t left, right;
  uint32_t size;
  int32_t merged;
  bool operator<(const SpmCandidate& o) const {  // top = highest score, leftmost
    return score != o.score ? score < o.score : left > o.left;
  }
};

struct SpmSymbol {
  uint32_t start, len;
  int32_t id, prev, next;
};

// WordPiece splits these CJK ideograph blocks into single-character words.
bool is_cjk_ideograph(uint32_t cp) {
  return (cp >= 0x4E00 && cp <= 0x9FFF) || (cp >= 0x3400 && cp <= 0x4DBF) ||
         (cp >= 0x20000 && cp <= 0x2A6DF) || (cp >= 0x2A700 && cp <= 0x2B73F) ||
         (cp >= 0x2B740 && cp <= 0x2B81F) || (cp >= 0x2B920 && cp <= 0x2CEAF) ||
         (cp >= 0xF900 && cp <= 0xFAFF) || (cp >= 0x2F800 && cp <= 0x2FA1F);
}

}  // namespace

// `text` has its spaces already replaced by U+2581. Symbols start as single characters
// (by lead byte), then the adjacent pair whose concatenation is the highest-scoring token
// merges, repeatedly. Symbols that are not tokens become byte tokens (<0xNN>).
void Tokenizer::Impl::encode_spm(std::string_view text, std::vector<int32_t>& out) const {
  std::vector<SpmSymbol> syms;
  syms.reserve(text.size());
  for (size_t offs = 0; offs < text.size();) {
    const size_t len =
        std::min(unicode::utf8_len(static_cast<uint8_t>(text[offs])), text.size() - offs);
    const int32_t index = static_cast<int32_t>(syms.size());
    syms.push_back({static_cast<uint32_t>(offs), static_cast<uint32_t>(len),
                    lookup(text.substr(offs, len)), index - 1,
                    offs + len == text.size() ? -1 : index + 1});
    offs += len;
  }
  if (syms.empty()) return;
  std::priority_queue<SpmCandidate> queue;
  auto consider = [&](int32_t l, int32_t r) {
    if (l < 0 || r < 0) return;
    const SpmSymbol& a = syms[l];
    const SpmSymbol& b = syms[r];
    int32_t merged = -1;
    if (a.id >= 0 && b.id >= 0) {
      const uint64_t* m = spm_pairs.find(PairTable::key_of(a.id, b.id));
      if (!m) return;
      merged = static_cast<int32_t>(*m);
    } else {
      merged = lookup(text.substr(a.start, a.len + b.len));
      if (merged < 0) return;
    }
    queue.push({scores[merged], l, r, a.len + b.len, merged});
  };
  for (int32_t i = 1; i < static_cast<int32_t>(syms.size()); ++i) consider(i - 1, i);
  while (!queue.empty()) {
    const SpmCandidate c = queue.top();
    queue.pop();
    SpmSymbol& l = syms[c.left];
    SpmSymbol& r = syms[c.right];
    if (l.len == 0 || r.len == 0 || l.len + r.len != c.size) continue;
    l.len += r.len;
    l.id = c.merged;
    r.len = 0;
    l.next = r.next;
    if (r.next >= 0) syms[r.next].prev = c.left;
    consider(l.prev, c.left);
    consider(c.left, l.next);
  }
  for (int32_t i = 0; i >= 0; i = syms[i].next) {
    const SpmSymbol& s = syms[i];
    if (s.id >= 0) {
      out.push_back(s.id);
      continue;
    }
    for (uint32_t k = 0; k < s.len; ++k) {
      const int32_t b = byte_token[static_cast<uint8_t>(text[s.start + k])];
      if (b >= 0)
        out.push_back(b);
      else if (unk >= 0)
        out.push_back(unk);
    }
  }
}

// WordPiece: lowercase, keep the first code point of each canonical decomposition (drops
// accents), drop control characters and combining marks, split on white space, punctuation, ASCII
// symbols and CJK ideographs; then each word is matched greedily longest-first against the
// vocabulary, whose word-initial pieces carry U+2581 and continuation pieces none.
void Tokenizer::Impl::encode_wpm(std::string_view text, std::vector<int32_t>& out) const {
  std::vector<std::string> words(1, std::string("\xE2\x96\x81"));
  auto finish_word = [&] {
    if (words.back().size() > 3) words.emplace_back("\xE2\x96\x81");
  };
  for (size_t pos = 0; pos < text.size();) {
    uint32_t cp = unicode::decode_one(text, pos);
    if (cp >= 0xC0) cp = unicode::nfd_first(cp);
    const uint8_t f = unicode::flags_of(cp);
    if (unicode::is_whitespace(f)) {
      finish_word();
      continue;
    }
    const auto cat = unicode::category_of(f);
    if (cp == 0 || cp == 0xFFFD || cat == unicode::kControl || cat == unicode::kMark) continue;
    const uint32_t lower =
        cp < 0x80 ? (cp >= 'A' && cp <= 'Z' ? cp + 32 : cp) : unicode::to_lower(cp);
    if (cat == unicode::kPunctuation || (cp < 0x7F && cat == unicode::kSymbol) ||
        is_cjk_ideograph(cp)) {
      finish_word();
      unicode::append_utf8(words.back(), lower);
      words.emplace_back("\xE2\x96\x81");
    } else {
      unicode::append_utf8(words.back(), lower);
    }
  }
  // Each word (with its U+2581 mark) is covered greedily by the longest token starting at
  // each position; a word with a position no token starts at becomes the unknown token.
  for (const std::string& word : words) {
    if (word.size() <= 3) continue;
    const size_t before = out.size();
    for (size_t i = 0; i < word.size();) {
      int32_t longest = -1;
      size_t longest_len = 0;
      wpm_pieces.match_at(word, i, [&](int32_t id) {
        longest = id;
        longest_len = texts[id].size();
      });
      if (longest < 0) {
        out.resize(before);
        break;
      }
      out.push_back(longest);
      i += longest_len;
    }
    if (out.size() == before && unk >= 0) out.push_back(unk);
  }
}

}  // namespace hablar::tokenizer
