// BPE: pre-tokenize, map each word to symbols (its bytes through the GPT-2 byte alphabet, or
// for raw UTF-8 vocabularies its characters), merge adjacent symbols by rank (lowest rank
// first, leftmost on ties) until no ranked pair is left.
#include <queue>

#include "tokenizer/tokenizer_impl.h"
#include "tokenizer/unicode.h"

namespace hablar::tokenizer {
namespace {

constexpr uint64_t kNoMerge = ~uint64_t{0};
// Words up to this many bytes merge by repeated scans (fast for short words); longer words
// use a heap (n log n).
constexpr size_t kScanLimit = 48;

uint64_t pair_rank(const PairTable& merges, int32_t a, int32_t b) {
  const uint64_t* v = merges.find(PairTable::key_of(a, b));
  return v ? *v : kNoMerge;
}

// Raw UTF-8 mode: a character that is no symbol is -(code point + 2) (never -1, whose pair
// key is the pair table's empty key); it never merges.
void emit_bytes(const Tokenizer::Impl& v, std::string_view bytes, std::vector<int32_t>& out) {
  for (char c : bytes)
    if (const int32_t id = v.byte_token[static_cast<uint8_t>(c)]; id >= 0) out.push_back(id);
}

void emit_symbol(const Tokenizer::Impl& v, int32_t sym, std::vector<int32_t>& out) {
  if (sym < 0) {
    emit_bytes(v, unicode::to_utf8(static_cast<uint32_t>(-(sym + 2))), out);
    return;
  }
  if (sym < v.n_vocab()) {
    out.push_back(sym);
    return;
  }
  if (!v.byte_level) {  // a merge result that is not a token: its bytes' <0xXX> tokens
    emit_bytes(v, v.extra_symbols[static_cast<size_t>(sym - v.n_vocab())], out);
    return;
  }
  // A merge result that is not a token: its single characters that are tokens.
  for (char c : v.extra_symbols[static_cast<size_t>(sym - v.n_vocab())]) {
    const int32_t id = v.lookup(std::string_view(&c, 1));
    if (id >= 0) out.push_back(id);
  }
}

// init: the word's initial symbols (at most kScanLimit).
// sym_at(i): the word's initial symbol i of n (n <= kScanLimit).
template <typename SymAt>
void merge_by_scan(const Tokenizer::Impl& v, size_t n, SymAt sym_at, std::vector<int32_t>& out) {
  int32_t ids[kScanLimit];
  uint64_t ranks[kScanLimit];
  for (size_t i = 0; i < n; ++i) ids[i] = sym_at(i);
  for (size_t i = 0; i + 1 < n; ++i) ranks[i] = pair_rank(v.merges, ids[i], ids[i + 1]);
  while (n > 1) {
    size_t best = 0;
    for (size_t i = 1; i + 1 < n; ++i)
      if (ranks[i] < ranks[best]) best = i;
    if (ranks[best] == kNoMerge) break;
    ids[best] = static_cast<int32_t>(ranks[best] & 0xFFFFFFFFu);
    for (size_t i = best + 1; i + 1 < n; ++i) {
      ids[i] = ids[i + 1];
      ranks[i] = ranks[i + 1];
    }
    --n;
    if (best > 0) ranks[best - 1] = pair_rank(v.merges, ids[best - 1], ids[best]);
    if (best + 1 < n) ranks[best] = pair_rank(v.merges, ids[best], ids[best + 1]);
  }
  for (size_t i = 0; i < n; ++i) emit_symbol(v, ids[i], out);
}

struct Candidate {
  uint32_t rank;
  int32_t left, right;
  int32_t left_sym, right_sym, merged;
  bool operator<(const Candidate& o) const {  // priority_queue top = lowest rank, leftmost
    return rank != o.rank ? rank > o.rank : left > o.left;
  }
};

template <typename SymAt>
void merge_by_heap(const Tokenizer::Impl& v, size_t count, SymAt sym_at,
                   std::vector<int32_t>& out) {
  const int32_t n = static_cast<int32_t>(count);
  std::vector<int32_t> sym(n), next(n), prev(n);
  for (int32_t i = 0; i < n; ++i) {
    sym[i] = sym_at(static_cast<size_t>(i));
    prev[i] = i - 1;
    next[i] = i + 1 < n ? i + 1 : -1;
  }
  std::priority_queue<Candidate> queue;
  auto consider = [&](int32_t l, int32_t r) {
    if (l < 0 || r < 0) return;
    const uint64_t m = pair_rank(v.merges, sym[l], sym[r]);
    if (m == kNoMerge) return;
    queue.push({static_cast<uint32_t>(m >> 32), l, r, sym[l], sym[r],
                static_cast<int32_t>(m & 0xFFFFFFFFu)});
  };
  for (int32_t i = 0; i + 1 < n; ++i) consider(i, i + 1);
  while (!queue.empty()) {
    const Candidate c = queue.top();
    queue.pop();
    if (sym[c.left] != c.left_sym || sym[c.right] != c.right_sym || next[c.left] != c.right)
      continue;  // stale: one side changed since this pair was seen
    sym[c.left] = c.merged;
    sym[c.right] = -1;
    next[c.left] = next[c.right];
    if (next[c.left] >= 0) prev[next[c.left]] = c.left;
    consider(prev[c.left], c.left);
    consider(c.left, next[c.left]);
  }
  for (int32_t i = 0; i >= 0; i = next[i]) emit_symbol(v, sym[i], out);
}

// The initial symbols of a word of a raw UTF-8 vocabulary: one per character.
void char_symbols(const Tokenizer::Impl& v, std::string_view word, std::vector<int32_t>& syms) {
  syms.clear();
  size_t pos = 0;
  while (pos < word.size()) {
    const size_t start = pos;
    const uint32_t cp = unicode::decode_one(word, pos);
    const std::string_view ch = word.substr(start, pos - start);
    int32_t id = v.lookup(ch);
    if (id < 0) {
      auto it = v.extra_index.find(std::string(ch));
      id = it != v.extra_index.end() ? it->second : -static_cast<int32_t>(cp) - 2;
    }
    syms.push_back(id);
  }
}

}  // namespace

void Tokenizer::Impl::encode_bpe(std::string_view raw_input, std::vector<int32_t>& out) const {
  // SentencePiece-style vocabularies see spaces as U+2581.
  std::string escaped;
  std::string_view input = raw_input;
  if (lowercase) {
    for (uint32_t cp : unicode::decode(raw_input)) {
      const bool ws = unicode::is_whitespace(unicode::flags_of(cp));
      unicode::append_utf8(escaped, ws ? cp : unicode::to_lower(cp));
    }
    input = escaped;
  } else if (escape_spaces) {
    escaped.reserve(raw_input.size() + 16);
    for (char c : raw_input) {
      if (c == ' ')
        escaped += "\xE2\x96\x81";
      else
        escaped.push_back(c);
    }
    input = escaped;
  }
  // Invalid UTF-8 becomes U+FFFD (and overlong forms their shortest form) before splitting.
  std::string sanitized;
  std::string_view text = input;
  const std::vector<uint32_t> cps = unicode::decode(input);
  if (!unicode::is_canonical_utf8(input)) {
    sanitized.reserve(input.size() + 16);
    for (uint32_t cp : cps) unicode::append_utf8(sanitized, cp);
    text = sanitized;
  }
  std::vector<uint8_t> flags(cps.size());
  for (size_t i = 0; i < cps.size(); ++i) flags[i] = unicode::flags_of(cps[i]);
  std::vector<uint32_t> lengths;
  lengths.reserve(cps.size() / 3 + 1);
  pre.split(cps, flags, lengths);

  std::vector<int32_t> syms;
  size_t cp_pos = 0, byte_pos = 0;
  for (uint32_t len : lengths) {
    size_t bytes = 0;
    for (size_t i = cp_pos; i < cp_pos + len; ++i)
      bytes += cps[i] < 0x80 ? 1 : cps[i] < 0x800 ? 2 : cps[i] < 0x10000 ? 3 : 4;
    const std::string_view word = text.substr(byte_pos, bytes);
    const bool blank = unicode::is_whitespace(flags[cp_pos]);
    cp_pos += len;
    byte_pos += bytes;
    if (drop_whitespace && blank) continue;  // a gap between words (\S+ splits only)
    if (ignore_merges || (newline_words && word.find_first_not_of('\n') == std::string::npos)) {
      auto it = raw_to_id.find(word);
      if (it != raw_to_id.end()) {
        out.push_back(it->second);
        continue;
      }
    }
    if (word.size() == 1 && byte_level) {
      emit_symbol(*this, byte_symbol[static_cast<uint8_t>(word[0])], out);
      continue;
    }
    if (byte_level) {  // one symbol per byte
      auto byte_at = [&](size_t i) { return byte_symbol[static_cast<uint8_t>(word[i])]; };
      if (word.size() <= kScanLimit)
        merge_by_scan(*this, word.size(), byte_at, out);
      else
        merge_by_heap(*this, word.size(), byte_at, out);
      continue;
    }
    char_symbols(*this, word, syms);
    auto sym_at = [&](size_t i) { return syms[i]; };
    if (syms.size() <= kScanLimit)
      merge_by_scan(*this, syms.size(), sym_at, out);
    else
      merge_by_heap(*this, syms.size(), sym_at, out);
  }
}

}  // namespace hablar::tokenizer
