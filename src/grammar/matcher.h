// Token-level matching: which vocabulary tokens a grammar allows next, and advancing the
// grammar by the token that was sampled.
//
// Vocab holds each token's decoded bytes in a byte trie (preorder; a node's subtree is the
// index range up to `end`), so one walk from the grammar's state tests every token: a prefix
// no stack takes prunes the whole subtree below it. Special tokens (control, unknown,
// unused) are never allowed; end-of-generation tokens are allowed exactly when the grammar
// can end. The mask of a state is cached per matcher from its second use on: states repeat
// (hash-consed stacks), so steady-state steps cost a lookup and a copy.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "grammar/class_table.h"
#include "grammar/grammar.h"
#include "grammar/recognizer.h"
#include "grammar/shared_states.h"
#include "grammar/token_trie.h"

namespace hablar::tokenizer {
class Tokenizer;
}

namespace hablar::grammar {

class Vocab {
 public:
  using TrieNode = TokenTrie::Node;

  // token_bytes[i]: the bytes token i adds to the text; usable[i]: whether a grammar may ever
  // pick it (false for special tokens); eog: the end-of-generation tokens.
  Vocab(std::vector<std::string> token_bytes, const std::vector<bool>& usable,
        std::vector<int32_t> eog);
  static std::shared_ptr<const Vocab> from_tokenizer(const tokenizer::Tokenizer& tok);

  int32_t n_vocab() const { return (int32_t)bytes_.size(); }
  const std::string& bytes(int32_t id) const { return bytes_[(size_t)id]; }
  bool usable(int32_t id) const { return usable_[(size_t)id]; }
  bool is_eog(int32_t id) const { return is_eog_[(size_t)id]; }
  const std::vector<int32_t>& eog() const { return eog_; }
  const std::vector<TrieNode>& trie() const { return trie_.nodes; }
  const TokenTrie& token_trie() const { return trie_; }
  const std::vector<int32_t>& trie_tokens() const { return trie_.tokens; }
  int max_depth() const { return trie_.max_depth; }
  // The vocabulary split by a character class (class_table.h), built once per class
  // content and shared by every grammar over this vocabulary that holds it; the vocabulary
  // itself keeps only the kMaxClassTables most recently asked for (a table of a 150k-token
  // vocabulary takes over 1 MB, and requests may bring any number of distinct classes).
  // Thread-safe.
  std::shared_ptr<const ClassTable> class_table(const CharClass& c) const;
  static constexpr size_t kMaxClassTables = 16;
  size_t class_tables_kept() const;

 private:
  std::vector<std::string> bytes_;
  std::vector<bool> usable_;
  std::vector<bool> is_eog_;
  std::vector<int32_t> eog_;
  TokenTrie trie_;
  struct KeptTable {
    std::shared_ptr<const ClassTable> table;
    uint64_t last_use = 0;
  };
  mutable std::mutex tables_mu_;
  mutable std::map<std::string, KeptTable> tables_;
  mutable uint64_t table_uses_ = 0;
};

// A grammar ready for matching, shared by every request that uses it.
struct CompiledGrammar {
  Grammar grammar;
  std::shared_ptr<const Vocab> vocab;
  // Per class: an id shared by classes of equal content, whether it is big enough for the
  // class-uniform path (negated, or 16 code points or more), and per such id one class
  // and one code point in it.
  std::vector<uint32_t> canon;
  std::vector<bool> big;
  std::vector<uint32_t> canon_class;
  std::vector<uint32_t> canon_sample;
  // Per canonical id of a big class: its vocabulary table, held for the grammar's life.
  std::vector<std::shared_ptr<const ClassTable>> canon_table;
  // Per class: the bytes a character of it can start with (256 bits).
  std::vector<std::array<uint64_t, 4>> first_bytes;
  // Per element position: the fewest bytes that finish its alternative (completion_length.h).
  std::vector<int32_t> tail;
  // Masks, distance profiles and restricted masks of the states walked so far, kept for
  // every matcher of this grammar (shared_states.h; thread-safe).
  std::shared_ptr<SharedStates> shared = std::make_shared<SharedStates>();
};

std::shared_ptr<const CompiledGrammar> compile(Grammar g, std::shared_ptr<const Vocab> vocab);

// Sets logits[i] to -infinity where bit i of `words` is clear (every i past its bits too);
// returns how many stay allowed.
int32_t mask_logits(std::span<const uint32_t> words, std::span<float> logits);

// One request's position in its grammar. Not thread-safe; one per sequence.
class GrammarMatcher {
 public:
  explicit GrammarMatcher(std::shared_ptr<const CompiledGrammar> g);

  // Advances by a token. An end-of-generation token is taken only where the grammar can end
  // (and then finishes it). Returns false, with the state unchanged, when refused.
  bool accept_token(int32_t id);
  // Advances by raw bytes (tests and forced prefixes); false and unchanged when refused.
  bool accept_bytes(std::string_view bytes);
  // Sets bit i of `words` (n_vocab bits, 32 to a word) when token i may come next.
  void fill_mask(std::span<uint32_t> words);
  // Sets logits of refused tokens to -infinity; returns how many stay allowed.
  int32_t apply_mask(std::span<float> logits);

  // The fewest bytes that complete a sentence from here (0: it can end now), and from the
  // state after token `id`; kNoCompletion (completion_length.h) when there is no completion
  // or the token is refused.
  int32_t distance_to_end() { return state_distance(state_); }
  int32_t distance_after(int32_t id);
  // Refuses (logit -infinity) each allowed token after which more than `max_distance` bytes
  // are needed to complete a sentence. When that would refuse every token, the logits stay
  // as they were. Returns the tokens left allowed. Walks the whole vocabulary: meant for the
  // few steps where a sampled token would not fit a budget.
  int32_t restrict_to_distance(std::span<float> logits, int32_t max_distance);
  // The same over a mask (words as fill_mask sets them, for a device that samples under
  // it): clears the bits of tokens after which more than `max_distance` bytes are needed,
  // unless that would clear every one. Returns the bits left.
  int32_t restrict_mask_to_distance(std::span<uint32_t> words, int32_t max_distance);
  // The largest distance_after over the tokens allowed now (kNoCompletion where one leaves
  // no completion): a budget of that many bytes restricts nothing here. Kept per state.
  int32_t max_distance_after();

  // States whose content takes more bytes than this are not kept for the grammar's other
  // requests (state_key, shared_states.h).
  static constexpr size_t kMaxKeyBytes = 4096;

  bool can_end() const { return Recognizer::can_end(dstates_[(size_t)state_]); }
  bool must_end() const { return Recognizer::must_end(dstates_[(size_t)state_]); }
  bool finished() const { return finished_; }
  const Vocab& vocab() const { return *g_->vocab; }
  size_t mask_cache_size() const { return pool_used_; }
  // Masks computed (not copied from the cache) so far.
  size_t masks_computed() const { return masks_computed_; }

 private:
  struct StateHash {
    size_t operator()(const RecState& s) const;
  };
  static constexpr int32_t kDead = -1;     // no stack takes the byte
  static constexpr int32_t kUnknown = -2;  // transition not computed yet
  // The lazily built DFA over recognizer states: each distinct state (hash-consed stacks)
  // gets an id and a row of 256 byte transitions, filled on first use. A trie walk then
  // costs one table lookup per node wherever it has been before (a JSON string's every
  // plain character leads back to the same state), and masks are cached per state id.
  int32_t intern(const RecState& s);
  // The class-uniform path (class_table.h): false when the state is not one (then the
  // whole trie is walked).
  bool class_mask(std::span<uint32_t> words);
  // The class-uniform view of the current state: the run class's table and the states after
  // 0, 1, 2, ... characters of it while each is uniform (chain[0] the state itself); returns
  // how many (0: not such a state).
  int class_chain(const ClassTable*& table, int32_t (&chain)[ClassTable::kMaxRun + 1]);
  // profile_state's pure class runs, whose bits it clears from `allowed`.
  void distances_of_pure_runs(std::vector<uint32_t>& allowed, SharedStates::Profile& profile);
  // Every stack of the state either waits for class `canon` or for a class disjoint from it.
  bool uniform(int32_t state, uint32_t canon);
  bool disjoint(uint32_t class_a, uint32_t canon_b);
  void walk_trie(const TokenTrie& trie, int32_t from, std::span<uint32_t> words);
  void walk_subtree(const TokenTrie& trie, size_t begin, size_t end, std::span<uint32_t> words);
  // The bytes some stack of the state may take next (a superset; mid-character: every
  // continuation byte).
  std::array<uint64_t, 4> first_bytes_of(const RecState& s);
  int32_t step(int32_t from, uint8_t byte);
  int32_t state_distance(int32_t dstate);
  void reset_dfa();
  void compute_mask(std::span<uint32_t> words);
  // The state's content as SharedStates keys it (computed once per state), or null where
  // it passes kMaxKeyBytes (such a state is computed alone, as without sharing).
  const std::string* key_of(int32_t dstate);
  // Where `words` is the current state's whole mask as the grammar keeps it.
  bool is_kept_mask(std::span<const uint32_t> words) const;

  std::shared_ptr<const CompiledGrammar> g_;
  Recognizer rec_;
  int32_t state_ = 0;  // DFA id of the current state
  bool finished_ = false;
  std::vector<RecState> dstates_;
  std::vector<std::array<int32_t, 256>> dnext_;
  std::vector<std::array<uint64_t, 4>> dfirst_;  // per state: first_bytes_of
  std::vector<int32_t> ddist_;                   // per state: state_distance, -1 not yet
  // One walk of the current state's allowed tokens (max_distance_after's, kept for the
  // restrictions that follow in that state): each token's distance_after, clamped to
  // SharedStates::Profile::kOver (past it, or not allowed there: computed again when asked),
  // of the last state walked (the grammar's where it keeps it); and per state the largest
  // (-1: not walked; grown lazily).
  void profile_state();
  int32_t profile_state_ = -1;
  std::shared_ptr<const SharedStates::Profile> profile_;
  std::vector<int32_t> dmax_;
  std::vector<std::string> dkey_;  // per state: key_of ("": not yet; one NUL: none)
  std::vector<std::shared_ptr<const SharedStates::Mask>> dmask_;  // per state: the grammar's mask
  std::vector<int32_t> dtable_;  // open addressing over dstates_ by content (-1 empty)
  // Per DFA state: its mask's slot in pool_, or kNever / kOnce (computed once, not kept).
  static constexpr int32_t kNever = -1;
  static constexpr int32_t kOnce = -2;
  std::vector<int32_t> mask_slot_;
  std::vector<std::vector<uint32_t>> pool_;  // kept masks; buffers reused after a reset
  size_t pool_used_ = 0;
  size_t masks_computed_ = 0;
  std::unordered_map<uint64_t, bool> uniform_;   // (state, canon) -> uniform
  std::unordered_map<uint64_t, bool> disjoint_;  // (class, canon) -> disjoint
  std::vector<int32_t> walk_;                    // DFA id per trie depth, reused
  size_t walk_steps_ = 0;       // trie nodes stepped while computing the current mask
  std::vector<uint32_t> mask_;  // scratch for apply_mask
  RecState scratch_;
};

}  // namespace hablar::grammar
