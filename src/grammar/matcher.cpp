#include "grammar/matcher.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <limits>
#include <numeric>
#include <optional>

#include "core/error.h"
#include "grammar/class_table.h"
#include "grammar/completion_length.h"
#include "grammar/utf8.h"
#include "tokenizer/tokenizer.h"

namespace hablar::grammar {

namespace {

// Mask cache entries kept per matcher before it is cleared (a bound on memory: 151,936 bits
// are 19 KB an entry).
constexpr size_t kMaxCachedMasks = 512;
// DFA states kept per matcher before it starts over (each holds 1 KB of transitions).
constexpr size_t kMaxDfaStates = 20000;

}  // namespace

Vocab::Vocab(std::vector<std::string> token_bytes, const std::vector<bool>& usable,
             std::vector<int32_t> eog)
    : bytes_(std::move(token_bytes)), eog_(std::move(eog)) {
  const size_t n = bytes_.size();
  usable_.assign(n, false);
  is_eog_.assign(n, false);
  for (int32_t id : eog_) {
    if (id >= 0 && (size_t)id < n) is_eog_[(size_t)id] = true;
  }
  std::vector<std::pair<std::string, int32_t>> entries;
  for (size_t i = 0; i < n; ++i) {
    usable_[i] = usable[i] && !is_eog_[i] && !bytes_[i].empty();
    if (usable_[i]) entries.push_back({bytes_[i], (int32_t)i});
  }
  trie_ = TokenTrie::build(std::move(entries));
}

std::shared_ptr<const Vocab> Vocab::from_tokenizer(const tokenizer::Tokenizer& tok) {
  const int32_t n = tok.n_vocab();
  std::vector<std::string> bytes((size_t)n);
  std::vector<bool> usable((size_t)n, false);
  std::vector<int32_t> eog(tok.eog_ids().begin(), tok.eog_ids().end());
  for (int32_t i = 0; i < n; ++i) {
    const auto t = tok.token_type(i);
    if (t == tokenizer::TokenType::kControl || t == tokenizer::TokenType::kUnknown ||
        t == tokenizer::TokenType::kUnused)
      continue;
    bytes[(size_t)i] = tok.token_text(i, /*show_special=*/false, /*first=*/false);
    usable[(size_t)i] = true;
  }
  return std::make_shared<Vocab>(std::move(bytes), usable, std::move(eog));
}

std::shared_ptr<const ClassTable> Vocab::class_table(const CharClass& c) const {
  const std::string key = class_signature(c);
  std::lock_guard<std::mutex> lock(tables_mu_);
  if (auto it = tables_.find(key); it != tables_.end()) {
    it->second.last_use = ++table_uses_;
    return it->second.table;
  }
  if (tables_.size() >= kMaxClassTables) {  // the least recently asked for goes
    auto oldest = tables_.begin();
    for (auto it = tables_.begin(); it != tables_.end(); ++it)
      if (it->second.last_use < oldest->second.last_use) oldest = it;
    tables_.erase(oldest);
  }
  auto table = std::make_shared<const ClassTable>(c, bytes_, usable_);
  tables_.emplace(key, KeptTable{table, ++table_uses_});
  return table;
}

size_t Vocab::class_tables_kept() const {
  std::lock_guard<std::mutex> lock(tables_mu_);
  return tables_.size();
}

namespace {

// A code point of the class (printable ASCII preferred), or nothing when it is empty.
std::optional<uint32_t> class_sample(const CharClass& c) {
  for (uint32_t cp : {(uint32_t)'a', (uint32_t)'0', (uint32_t)'A', (uint32_t)' '})
    if (c.matches(cp)) return cp;
  for (uint32_t cp = 0x21; cp < 0x7F; ++cp)
    if (c.matches(cp)) return cp;
  if (!c.negated) {
    for (const CharRange& r : c.ranges)
      for (uint32_t cp = r.lo; cp <= r.hi && cp <= 0x10FFFF; ++cp)
        if (!(cp >= 0xD800 && cp <= 0xDFFF)) return cp;
    return std::nullopt;
  }
  uint64_t next = 0x80;  // first point past the excluded ranges
  for (const CharRange& r : c.ranges)
    if (r.lo <= next && (uint64_t)r.hi + 1 > next) next = (uint64_t)r.hi + 1;
  if (next >= 0xD800 && next <= 0xDFFF) next = 0xE000;
  if (next > 0x10FFFF || !c.matches((uint32_t)next)) return std::nullopt;
  return (uint32_t)next;
}

// The bytes that can start a character of the class: ASCII members, and the lead bytes
// whose characters' range meets the class.
std::array<uint64_t, 4> class_first_bytes(const CharClass& c) {
  std::array<uint64_t, 4> set{c.ascii[0], c.ascii[1], 0, 0};
  for (uint32_t b = 0xC2; b <= 0xF4; ++b) {
    uint32_t lo = 0, hi = 0;
    if (b <= 0xDF) {
      lo = (b & 0x1F) << 6;
      hi = lo | 0x3F;
    } else if (b <= 0xEF) {
      lo = std::max<uint32_t>((b & 0x0F) << 12, 0x800);
      hi = ((b & 0x0F) << 12) | 0xFFF;
    } else {
      lo = std::max<uint32_t>((b & 0x07) << 18, 0x10000);
      hi = std::min<uint32_t>(((b & 0x07) << 18) | 0x3FFFF, 0x10FFFF);
    }
    if (c.intersects(lo, hi)) set[b >> 6] |= uint64_t{1} << (b & 63);
  }
  return set;
}

uint64_t class_size(const CharClass& c) {
  uint64_t n = 0;
  for (const CharRange& r : c.ranges) n += (uint64_t)r.hi - r.lo + 1;
  return c.negated ? 0x110000 - std::min<uint64_t>(n, 0x110000) : n;
}

}  // namespace

std::shared_ptr<const CompiledGrammar> compile(Grammar g, std::shared_ptr<const Vocab> vocab) {
  auto c = std::make_shared<CompiledGrammar>();
  c->grammar = std::move(g);
  c->vocab = std::move(vocab);
  std::map<std::string, uint32_t> ids;
  // The vocabulary tables of the big classes are taken here (built once per vocabulary and
  // class content while the vocabulary keeps them, shared by later grammars) and held by the
  // grammar, so that no sampling step pays for them.
  for (size_t k = 0; k < c->grammar.classes.size(); ++k) {
    const CharClass& cls = c->grammar.classes[k];
    auto [it, fresh] = ids.emplace(class_signature(cls), (uint32_t)c->canon_class.size());
    c->canon.push_back(it->second);
    c->first_bytes.push_back(class_first_bytes(cls));
    const auto sample = class_sample(cls);
    c->big.push_back(sample.has_value() && class_size(cls) >= 16);
    if (fresh) {
      c->canon_class.push_back((uint32_t)k);
      c->canon_sample.push_back(sample.value_or(0));
      c->canon_table.push_back(c->big.back() ? c->vocab->class_table(cls) : nullptr);
    }
  }
  c->tail = completion_tails(c->grammar);
  return c;
}

size_t GrammarMatcher::StateHash::operator()(const RecState& s) const {
  uint64_t h = 1469598103934665603ull ^ s.partial ^ ((uint64_t)s.partial_left << 40) ^
               ((uint64_t)s.partial_len << 48);
  for (int32_t id : s.stacks) h = (h ^ (uint32_t)id) * 1099511628211ull;
  return (size_t)h;
}

GrammarMatcher::GrammarMatcher(std::shared_ptr<const CompiledGrammar> g)
    : g_(std::move(g)), rec_(g_->grammar) {
  walk_.resize((size_t)g_->vocab->max_depth() + 1);
  state_ = intern(rec_.initial());
}

int32_t GrammarMatcher::intern(const RecState& s) {
  if (dtable_.size() < 2 * (dstates_.size() + 1)) {  // keep the table at most half full
    std::vector<int32_t> bigger(std::max<size_t>(64, dtable_.size() * 2), -1);
    for (size_t id = 0; id < dstates_.size(); ++id) {
      size_t i = StateHash{}(dstates_[id]) & (bigger.size() - 1);
      while (bigger[i] >= 0) i = (i + 1) & (bigger.size() - 1);
      bigger[i] = (int32_t)id;
    }
    dtable_.swap(bigger);
  }
  const size_t mask = dtable_.size() - 1;
  size_t i = StateHash{}(s)&mask;
  while (dtable_[i] >= 0) {
    if (dstates_[(size_t)dtable_[i]] == s) return dtable_[i];
    i = (i + 1) & mask;
  }
  const auto id = (int32_t)dstates_.size();
  dtable_[i] = id;
  dstates_.push_back(s);
  dfirst_.push_back(first_bytes_of(s));
  ddist_.push_back(-1);
  dnext_.emplace_back();
  dnext_.back().fill(kUnknown);
  return id;
}

int32_t GrammarMatcher::step(int32_t from, uint8_t byte) {
  int32_t& slot = dnext_[(size_t)from][byte];
  if (slot != kUnknown) return slot;
  const int32_t next =
      rec_.advance_byte(dstates_[(size_t)from], byte, scratch_) ? intern(scratch_) : kDead;
  dnext_[(size_t)from][byte] = next;  // `slot` may have moved with dnext_
  return next;
}

// Bounds the DFA's memory: past this many states it starts again from the current one.
void GrammarMatcher::reset_dfa() {
  RecState cur = dstates_[(size_t)state_];
  dstates_.clear();
  dfirst_.clear();
  ddist_.clear();
  dmax_.clear();
  dkey_.clear();
  dmask_.clear();
  profile_state_ = -1;
  dnext_.clear();
  dtable_.clear();
  mask_slot_.clear();
  pool_used_ = 0;
  uniform_.clear();
  state_ = intern(cur);
}

// The cheapest stack: its top waits for a character of a class (or, mid-character, for the
// character's last partial_left bytes), and each node below continues its caller's
// alternative at `pos` once the rule above it ends.
int32_t GrammarMatcher::state_distance(int32_t dstate) {
  int32_t& cached = ddist_[(size_t)dstate];
  if (cached >= 0) return cached;
  const RecState& s = dstates_[(size_t)dstate];
  const std::vector<int32_t>& tail = g_->tail;
  const StackArena& arena = rec_.arena();
  int32_t best = kNoCompletion;
  for (int32_t stack : s.stacks) {
    if (stack == kAccept) {
      if (s.partial_left == 0) best = 0;
      continue;
    }
    const StackNode& top = arena.at(stack);
    int32_t d = s.partial_left > 0 ? add_lengths(s.partial_left, tail[(size_t)top.pos + 1])
                                   : tail[(size_t)top.pos];
    for (int32_t n = top.parent; n >= 0 && d < best; n = arena.at(n).parent)
      d = add_lengths(d, tail[(size_t)arena.at(n).pos]);
    best = std::min(best, d);
  }
  cached = best;
  return best;
}

int32_t GrammarMatcher::distance_after(int32_t id) {
  if (finished_ || id < 0 || id >= vocab().n_vocab()) return kNoCompletion;
  if (vocab().is_eog(id)) return can_end() ? 0 : kNoCompletion;
  if (!vocab().usable(id)) return kNoCompletion;
  int32_t s = state_;
  for (char c : vocab().bytes(id)) {
    s = step(s, (uint8_t)c);
    if (s == kDead) return kNoCompletion;
  }
  return state_distance(s);
}

int32_t GrammarMatcher::restrict_to_distance(std::span<float> logits, int32_t max_distance) {
  const size_t n = std::min(logits.size(), (size_t)vocab().n_vocab());
  std::vector<int32_t> over;  // allowed tokens that would leave too little room
  int32_t fits = 0;
  for (size_t id = 0; id < n; ++id) {
    if (logits[id] == -std::numeric_limits<float>::infinity()) continue;
    if (distance_after((int32_t)id) <= max_distance)
      ++fits;
    else
      over.push_back((int32_t)id);
  }
  if (fits == 0) return (int32_t)over.size();
  for (int32_t id : over) logits[(size_t)id] = -std::numeric_limits<float>::infinity();
  return fits;
}

// Calls f(id) for each token whose bit is set, in id order, while it returns true.
template <typename F>
static void for_each_set_bit(std::span<const uint32_t> words, size_t n, F&& f) {
  for (size_t w = 0; w * 32 < n; ++w)
    for (uint32_t bits = words[w]; bits != 0; bits &= bits - 1) {
      const size_t id = w * 32 + (size_t)std::countr_zero(bits);
      if (id >= n || !f((int32_t)id)) return;
    }
}

// Where the words are the state's whole mask as the grammar keeps it (GrammarGate passes
// them so), the restriction is a function of the state and the distance: kept for every
// request of the grammar.
int32_t GrammarMatcher::restrict_mask_to_distance(std::span<uint32_t> words, int32_t max_distance) {
  const size_t n = std::min(words.size() * 32, (size_t)vocab().n_vocab());
  const bool whole = is_kept_mask(words);
  if (whole) {  // (a kept mask: the state has a key)
    if (auto kept = g_->shared->restricted(*key_of(state_), max_distance)) {
      std::copy(kept->words.begin(), kept->words.end(), words.begin());
      return kept->result;
    }
  }
  if (profile_state_ != state_) profile_state();
  const std::vector<uint8_t>& profile = profile_->per_token;
  std::vector<int32_t> over;  // allowed tokens that would leave too little room
  int32_t fits = 0;
  for_each_set_bit(words, n, [&](int32_t id) {
    const uint8_t known = profile[(size_t)id];
    if (known != SharedStates::Profile::kOver ? known <= max_distance
                                              : distance_after(id) <= max_distance)
      ++fits;
    else
      over.push_back(id);
    return true;
  });
  const int32_t result = fits == 0 ? (int32_t)over.size() : fits;
  if (fits != 0)
    for (int32_t id : over) words[(size_t)id >> 5] &= ~(1u << (id & 31));
  if (whole) {
    auto r = std::make_shared<SharedStates::Restricted>();
    r->words.assign(words.begin(), words.begin() + (ptrdiff_t)dmask_[(size_t)state_]->words.size());
    r->result = result;
    g_->shared->keep_restricted(*key_of(state_), max_distance, std::move(r));
  }
  return result;
}

bool GrammarMatcher::is_kept_mask(std::span<const uint32_t> words) const {
  if ((size_t)state_ >= dmask_.size() || !dmask_[(size_t)state_]) return false;
  const std::vector<uint32_t>& kept = dmask_[(size_t)state_]->words;
  return words.size() == kept.size() &&
         std::memcmp(words.data(), kept.data(), kept.size() * sizeof(uint32_t)) == 0;
}

int32_t GrammarMatcher::max_distance_after() {
  const auto at = (size_t)state_;
  if (at >= dmax_.size() || dmax_[at] < 0) profile_state();
  return dmax_[at];
}

void GrammarMatcher::profile_state() {
  const std::string* at = key_of(state_);
  const std::string key = at != nullptr ? *at : std::string();
  std::shared_ptr<const SharedStates::Profile> profile =
      key.empty() ? nullptr : g_->shared->profile(key);
  if (!profile) {
    const size_t n = (size_t)vocab().n_vocab();
    std::vector<uint32_t> allowed((n + 31) / 32);
    fill_mask(allowed);
    auto walked = std::make_shared<SharedStates::Profile>();
    walked->per_token.assign(n, SharedStates::Profile::kOver);
    distances_of_pure_runs(allowed, *walked);  // (their bits cleared: the rest are walked)
    for_each_set_bit(allowed, n, [&](int32_t id) {
      const int32_t d = distance_after(id);
      walked->most = std::max(walked->most, d);
      walked->per_token[(size_t)id] = (uint8_t)std::min<int32_t>(d, SharedStates::Profile::kOver);
      return true;
    });
    if (!key.empty()) profile = g_->shared->keep_profile(key, walked);
    if (!profile) profile = std::move(walked);
  }
  profile_ = std::move(profile);
  profile_state_ = state_;
  if (dmax_.size() < dstates_.size()) dmax_.resize(dstates_.size(), -1);
  dmax_[(size_t)state_] = profile_->most;
}

// In a class-uniform state (class_chain) a token that is a pure run of j characters of the
// class leads to the chain's state after j characters whatever its characters, so its
// distance is that state's: the bulk of the vocabulary in a string costs a bitset pass per
// run length, not a walk per token.
void GrammarMatcher::distances_of_pure_runs(std::vector<uint32_t>& allowed,
                                            SharedStates::Profile& profile) {
  const ClassTable* table = nullptr;
  int32_t chain[ClassTable::kMaxRun + 1];
  const int alive = class_chain(table, chain);
  const size_t n_words = std::min(allowed.size(), (profile.per_token.size() + 31) / 32);
  for (int j = 1; j < alive; ++j) {
    const int32_t d = state_distance(chain[j]);
    const auto code = (uint8_t)std::min<int32_t>(d, SharedStates::Profile::kOver);
    const std::vector<uint32_t>& upto = table->upto(j);
    const std::vector<uint32_t>& shorter = table->upto(j - 1);
    for (size_t w = 0; w < n_words && w < upto.size(); ++w) {
      uint32_t bits = allowed[w] & upto[w] & ~shorter[w];
      if (bits == 0) continue;
      allowed[w] &= ~bits;
      profile.most = std::max(profile.most, d);
      for (; bits != 0; bits &= bits - 1)
        profile.per_token[w * 32 + (size_t)std::countr_zero(bits)] = code;
    }
  }
}

const std::string* GrammarMatcher::key_of(int32_t dstate) {
  if ((size_t)dstate >= dkey_.size()) dkey_.resize(dstates_.size());
  std::string& key = dkey_[(size_t)dstate];
  if (key.empty()) {
    key = state_key(dstates_[(size_t)dstate], rec_.arena(), kMaxKeyBytes);
    if (key.empty()) key.assign(1, '\0');  // (a real key has at least six bytes)
  }
  return key.size() == 1 ? nullptr : &key;
}

bool GrammarMatcher::accept_token(int32_t id) {
  if (finished_ || id < 0 || id >= vocab().n_vocab()) return false;
  if (vocab().is_eog(id)) {
    if (!can_end()) return false;
    finished_ = true;
    return true;
  }
  if (!vocab().usable(id)) return false;
  return accept_bytes(vocab().bytes(id));
}

bool GrammarMatcher::accept_bytes(std::string_view bytes) {
  if (finished_) return false;
  int32_t s = state_;
  for (char c : bytes) {
    s = step(s, (uint8_t)c);
    if (s == kDead) return false;
  }
  state_ = s;
  if (dstates_.size() > kMaxDfaStates) reset_dfa();
  return true;
}

void GrammarMatcher::compute_mask(std::span<uint32_t> words) {
  std::fill(words.begin(), words.end(), 0u);
  const Vocab& v = vocab();
  if (finished_) return;
  if (can_end())
    for (int32_t id : v.eog()) words[(size_t)id >> 5] |= 1u << (id & 31);
  if (class_mask(words)) return;
  walk_trie(v.token_trie(), state_, words);
}

namespace {

// Whether every point of [lo, hi] is in the class (ranges sorted and merged by finish()).
bool holds_range(const CharClass& k, uint32_t lo, uint32_t hi) {
  if (k.negated) {  // none of the left-out ranges meets [lo, hi]
    for (const CharRange& r : k.ranges)
      if (r.lo <= hi && lo <= r.hi) return false;
    return true;
  }
  for (const CharRange& r : k.ranges)
    if (r.lo <= lo && hi <= r.hi) return true;
  return false;
}

// p within k.
bool class_within(const CharClass& p, const CharClass& k) {
  if (!p.negated) {
    for (const CharRange& r : p.ranges)
      if (!holds_range(k, r.lo, r.hi)) return false;
    return true;
  }
  if (!k.negated) return false;
  // Both negated: whatever k leaves out, p leaves out too.
  for (const CharRange& r : k.ranges) {
    bool inside = false;
    for (const CharRange& q : p.ranges) inside = inside || (q.lo <= r.lo && r.hi <= q.hi);
    if (!inside) return false;
  }
  return true;
}

bool classes_disjoint(const CharClass& a, const CharClass& b) {
  if (a.negated && b.negated) return false;
  // A positive class is disjoint from the other when no range of it meets the other.
  const CharClass& pos = a.negated ? b : a;
  const CharClass& other = a.negated ? a : b;
  for (const CharRange& r : pos.ranges)
    if (other.intersects(r.lo, r.hi)) return false;
  return true;
}

}  // namespace

// Every character of class canon_b is taken by a stack waiting for class_a, or none is.
bool GrammarMatcher::disjoint(uint32_t class_a, uint32_t canon_b) {
  const uint64_t key = ((uint64_t)class_a << 32) | canon_b;
  auto it = disjoint_.find(key);
  if (it != disjoint_.end()) return it->second;
  const CharClass& a = g_->grammar.classes[class_a];
  const CharClass& b = g_->grammar.classes[g_->canon_class[canon_b]];
  const bool result = classes_disjoint(a, b) || class_within(b, a);
  disjoint_.emplace(key, result);
  return result;
}

bool GrammarMatcher::uniform(int32_t state, uint32_t canon) {
  const uint64_t key = ((uint64_t)(uint32_t)state << 32) | canon;
  auto it = uniform_.find(key);
  if (it != uniform_.end()) return it->second;
  const RecState& s = dstates_[(size_t)state];
  bool result = s.partial_left == 0;
  for (int32_t id : s.stacks) {
    if (!result) break;
    if (id == kAccept) continue;
    const uint32_t k = g_->grammar.elems[(size_t)rec_.arena().at(id).pos].id;
    result = g_->canon[k] == canon || disjoint(k, canon);
  }
  uniform_.emplace(key, result);
  return result;
}

std::array<uint64_t, 4> GrammarMatcher::first_bytes_of(const RecState& s) {
  // Mid-character only continuation bytes can come; the step itself checks which.
  if (s.partial_left != 0) return {0, 0, ~0ull, 0};
  std::array<uint64_t, 4> set{0, 0, 0, 0};
  for (int32_t id : s.stacks) {
    if (id == kAccept) continue;
    const auto& f = g_->first_bytes[g_->grammar.elems[(size_t)rec_.arena().at(id).pos].id];
    for (int w = 0; w < 4; ++w) set[(size_t)w] |= f[(size_t)w];
  }
  return set;
}

void GrammarMatcher::walk_trie(const TokenTrie& trie, int32_t from, std::span<uint32_t> words) {
  walk_[0] = from;
  // First bytes the state may take and the trie has: only their subtrees are walked. A copy:
  // the walk interns new states, which may move dfirst_.
  const std::array<uint64_t, 4> first = dfirst_[(size_t)from];
  for (int w = 0; w < 4; ++w) {
    uint64_t bits = first[(size_t)w] & trie.first_bytes[(size_t)w];
    while (bits) {
      const int b = w * 64 + __builtin_ctzll(bits);
      bits &= bits - 1;
      const auto begin = (size_t)trie.first_node[(size_t)b];
      walk_subtree(trie, begin, (size_t)trie.nodes[begin].end, words);
    }
  }
}

void GrammarMatcher::walk_subtree(const TokenTrie& trie, size_t begin, size_t end,
                                  std::span<uint32_t> words) {
  for (size_t i = begin; i < end;) {
    const TokenTrie::Node& node = trie.nodes[i];
    const int32_t parent = walk_[node.depth - 1u];
    const auto& first = dfirst_[(size_t)parent];
    if (!((first[node.byte >> 6] >> (node.byte & 63)) & 1)) {
      i = (size_t)node.end;  // no stack of the state can take this byte
      continue;
    }
    const int32_t next = step(parent, node.byte);
    ++walk_steps_;
    if (next == kDead) {
      i = (size_t)node.end;
      continue;
    }
    walk_[node.depth] = next;
    for (int32_t k = node.tok_begin; k < node.tok_end; ++k) {
      const int32_t id = trie.tokens[(size_t)k];
      words[(size_t)id >> 5] |= 1u << (id & 31);
    }
    ++i;
  }
}

int GrammarMatcher::class_chain(const ClassTable*& table,
                                int32_t (&chain)[ClassTable::kMaxRun + 1]) {
  const RecState& s0 = dstates_[(size_t)state_];
  if (s0.partial_left != 0) return 0;
  // The run class: the smallest big class some stack waits for (the others must hold it
  // whole or not meet it: uniform()).
  uint32_t p = UINT32_MAX;
  uint64_t p_size = UINT64_MAX;
  for (int32_t id : s0.stacks) {
    if (id == kAccept) continue;
    const uint32_t k = g_->grammar.elems[(size_t)rec_.arena().at(id).pos].id;
    if (!g_->big[k]) continue;
    const uint64_t size = class_size(g_->grammar.classes[k]);
    if (size < p_size) {
      p = g_->canon[k];
      p_size = size;
    }
  }
  if (p == UINT32_MAX) return 0;
  table = g_->canon_table[p].get();
  if (table == nullptr) return 0;
  std::string sample;
  append_utf8(sample, g_->canon_sample[p]);
  int alive = 0;
  int32_t cur = state_;
  for (int j = 0; j <= ClassTable::kMaxRun; ++j) {
    if (!uniform(cur, p)) return 0;
    chain[j] = cur;
    alive = j + 1;
    if (j == ClassTable::kMaxRun) break;
    for (char c : sample) {
      cur = step(cur, (uint8_t)c);
      if (cur == kDead) break;
    }
    if (cur == kDead) break;
  }
  return alive;
}

bool GrammarMatcher::class_mask(std::span<uint32_t> words) {
  const ClassTable* table = nullptr;
  int32_t chain[ClassTable::kMaxRun + 1];
  const int alive = class_chain(table, chain);
  if (alive == 0) return false;
  // Pure runs of up to alive - 1 characters; cut-off characters after up to alive - 2 (one
  // more character of the class must still be allowed there).
  const std::vector<uint32_t>& pure = table->upto(alive - 1);
  for (size_t w = 0; w < words.size(); ++w) words[w] |= pure[w];
  if (alive >= 2) {
    const std::vector<uint32_t>& cut = table->partial_upto(alive - 2);
    for (size_t w = 0; w < words.size(); ++w) words[w] |= cut[w];
  }
  for (int j = 0; j < alive; ++j) walk_trie(table->rest(j), chain[j], words);
  return true;
}

// A state's mask is kept for every matcher of the grammar from its second computation on
// where the grammar's budget allows (SharedStates::seen_again: most states of a document come
// once per request, each position of an object its own state, and copying their masks cost
// about as much as computing them; states that come back, a string's next character, an
// array's next item, come back many times, and every request of a schema walks its states
// again). Past the budget, or for a state of too long a key, a matcher keeps a mask itself
// the second time the state asks for it.
void GrammarMatcher::fill_mask(std::span<uint32_t> words) {
  HABLAR_CHECK(words.size() * 32 >= (size_t)vocab().n_vocab(), "mask too small");
  const size_t n_words = ((size_t)vocab().n_vocab() + 31) / 32;
  if ((size_t)state_ >= mask_slot_.size()) mask_slot_.resize(dstates_.size(), kNever);
  if ((size_t)state_ >= dmask_.size()) dmask_.resize(dstates_.size());
  std::shared_ptr<const SharedStates::Mask>& shared = dmask_[(size_t)state_];
  if (!shared && mask_slot_[(size_t)state_] < 0)
    if (const std::string* key = key_of(state_)) shared = g_->shared->mask(*key);
  if (shared) {
    std::memcpy(words.data(), shared->words.data(), n_words * sizeof(uint32_t));
    return;
  }
  int32_t& slot = mask_slot_[(size_t)state_];
  if (slot >= 0) {
    std::memcpy(words.data(), pool_[(size_t)slot].data(), n_words * sizeof(uint32_t));
    return;
  }
  compute_mask(words.first(n_words));
  ++masks_computed_;
  const std::string* key = key_of(state_);
  if (key != nullptr && g_->shared->seen_again(*key)) {
    auto computed = std::make_shared<SharedStates::Mask>();
    computed->words.assign(words.begin(), words.begin() + (ptrdiff_t)n_words);
    shared = g_->shared->keep_mask(*key, std::move(computed));
    if (shared) return;
  }
  if (slot == kNever) {
    slot = kOnce;
    return;
  }
  if (pool_used_ >= kMaxCachedMasks) {  // start again; the buffers stay for reuse
    std::fill(mask_slot_.begin(), mask_slot_.end(), kNever);
    pool_used_ = 0;
  }
  if (pool_used_ == pool_.size()) pool_.emplace_back();
  pool_[pool_used_].assign(words.begin(), words.begin() + (ptrdiff_t)n_words);
  mask_slot_[(size_t)state_] = (int32_t)pool_used_++;
}

int32_t GrammarMatcher::apply_mask(std::span<float> logits) {
  mask_.resize((std::min(logits.size(), (size_t)vocab().n_vocab()) + 31) / 32);
  fill_mask(mask_);
  return mask_logits(mask_, logits);  // (rows past the vocabulary: refused)
}

int32_t mask_logits(std::span<const uint32_t> words, std::span<float> logits) {
  const size_t n = std::min(logits.size(), words.size() * 32);
  int32_t allowed = 0;
  const float ninf = -std::numeric_limits<float>::infinity();
  for (size_t w = 0; w * 32 < n; ++w) {
    const uint32_t bits = words[w];
    const size_t base = w * 32;
    const size_t lim = std::min<size_t>(32, n - base);
    if (bits == 0xFFFFFFFFu && lim == 32) {
      allowed += 32;
      continue;
    }
    for (size_t b = 0; b < lim; ++b) {
      if ((bits >> b) & 1u)
        ++allowed;
      else
        logits[base + b] = ninf;
    }
  }
  for (size_t i = n; i < logits.size(); ++i) logits[i] = ninf;
  return allowed;
}

}  // namespace hablar::grammar
