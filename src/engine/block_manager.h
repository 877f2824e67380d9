// Paged KV-cache bookkeeping: which physical blocks are free, who holds each block (ref
// counts), and a prefix cache that lets sequences with a common prompt prefix share blocks.
//
// A block holds `block_size` consecutive positions of one sequence. A *full* block is
// identified by a chained hash: hash(previous block's hash, the block's tokens), so equal
// hashes mean equal whole prefixes, not just equal blocks. Full blocks are registered in a
// hash -> block map when their K/V has been computed; a new sequence whose prompt starts with
// the same blocks takes them (ref count + 1) instead of recomputing.
//
// Past the last whole block, a prompt can also take part of a block (token-granular reuse,
// as llama-server's slots and radix caches give): every block whose first positions hold
// computed K/V is offered under the chained hash of the blocks before it (full blocks and a
// sequence's partial tail alike, with the tokens it holds), and a new sequence takes the one
// whose tokens share the longest run with its own at that place. A sequence that then writes
// into a block it holds alone trims the block's offered tokens to the positions its writes
// leave intact, so an offer never names K/V that was overwritten.
//
// Freed blocks go to the back of the free list but keep their hash entry, so a later request
// can still revive them; allocation takes from the front (least recently freed) and only
// then forgets the old hash. A sequence about to write into a block others also hold gets a
// private copy first (copy-on-write): the manager picks the new block and reports the copy,
// which the runner performs on the device before the step's forward.
//
// Pure bookkeeping: no memory is touched here, so it is unit-tested without a model.
#pragma once

#include <climits>
#include <cstdint>
#include <list>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

#include "engine/sequence.h"

namespace hablar::engine {

// The runner copies block `src` to block `dst` (every layer, K and V) before the forward.
struct BlockCopy {
  int32_t src = 0;
  int32_t dst = 0;
};

class BlockManager {
 public:
  BlockManager(int32_t n_blocks, int32_t block_size);

  int32_t n_blocks() const { return (int32_t)blocks_.size(); }
  int32_t block_size() const { return block_size_; }
  int32_t n_free() const { return (int32_t)free_list_.size(); }
  int32_t n_used() const { return n_blocks() - n_free(); }
  int32_t n_cached() const { return (int32_t)hash_to_block_.size(); }
  int32_t ref_count(int32_t block) const { return blocks_.at(block).ref_count; }
  static int32_t blocks_for(int32_t n_tokens, int32_t block_size) {
    return (n_tokens + block_size - 1) / block_size;
  }

  // First scheduling of a sequence with an empty block table: takes the longest run of
  // cached full blocks that match its tokens, then the offered block that continues them
  // with the longest run of its next tokens, and sets n_computed accordingly (always leaving
  // at least one token to compute, so the step yields logits). Returns the tokens reused.
  int32_t match_prefix(Sequence& seq);

  // Makes room for positions [0, seq.n_computed + n_new): appends new blocks and, where the
  // first block to be written is shared, replaces it with a private copy (appended to
  // `copies`). Returns false, changing nothing, when too few blocks are free.
  bool allocate_slots(Sequence& seq, int32_t n_new, std::vector<BlockCopy>& copies);
  // Blocks allocate_slots would take from the free list for this request.
  int32_t blocks_needed(const Sequence& seq, int32_t n_new) const;

  // After a step: registers every newly full, computed block of the sequence in the cache,
  // and offers its partial last block (when it holds that block alone).
  // n_known: the tokens known so far (a launched step's sample is not yet): no position from
  // there is hashed or offered.
  void register_full_blocks(Sequence& seq, int32_t n_known = INT32_MAX);

  // Rolls the sequence back to its first `n_tokens` positions (speculative tokens rejected):
  // sets n_computed, releases the blocks wholly past the end and forgets the hashes of blocks
  // no longer full. Never registers anything.
  void truncate(Sequence& seq, int32_t n_tokens);

  // A block-table entry whose block was given back by release_before.
  static constexpr int32_t kReleased = -1;
  // Sliding windows (every layer slides): gives back the sequence's blocks that lie wholly
  // before position `first`, which no later query of it reads. Their table entries become
  // kReleased, so every other position keeps its entry. A block no other sequence holds
  // also loses its prefix-cache entry: a released block is never offered as a cached prefix
  // (its successors' hashes stay chained, but a prefix match stops at the first missing
  // block). Returns the number of entries released.
  int32_t release_before(Sequence& seq, int32_t first);

  // Releases all of the sequence's blocks (finish, cancel or preemption) and clears its table.
  void free(Sequence& seq);

  // Gives `child` the parent's blocks (ref counts + 1): a fork for n > 1 completions. The
  // first write into a shared partial block then copies it.
  void fork(const Sequence& parent, Sequence& child);

  // K/V snapshots (engine/kv_snapshot.h) ------------------------------------------------
  // The blocks that hold the K/V of the longest cached prefix of `tokens`: the registered
  // full blocks that match, in order, then the offered block continuing them with the
  // longest run of the next tokens (that run ending at `limit` tokens at most, which bounds
  // only this partial block). n_tokens: the positions they hold; hashes: the chained hash of
  // each full block among them.
  struct CachedPrefix {
    std::vector<int32_t> blocks;
    std::vector<uint64_t> hashes;
    int32_t n_tokens = 0;
  };
  CachedPrefix cached_prefix(std::span<const int32_t> tokens, int32_t limit = INT32_MAX) const;

  // Restoring the K/V of positions [0, tokens.size()) into the cache, in two halves around
  // the executor's writes. begin_adoption gives each block-sized span of the tokens a block:
  // the one already caching that prefix (held, not written), else a free one to write
  // (`fresh`). It changes nothing and returns false when the free blocks (cached ones
  // evicted first, as any allocation does) are too few; `needed` says how many it wanted.
  struct Adoption {
    std::vector<int32_t> blocks;  // one per block of the tokens
    std::vector<bool> fresh;      // whose K/V the caller writes
    std::vector<int32_t> tokens;
  };
  bool begin_adoption(std::span<const int32_t> tokens, Adoption& adoption, int32_t& needed);
  // Once the fresh blocks hold their K/V (written = true): registers them in the prefix cache
  // as a sequence's computed blocks are (full blocks hashed and offered, a partial last block
  // offered with its tokens). written = false (the writes failed): nothing is registered.
  // Either way every block of the adoption is released (free, cached ones still cached).
  void end_adoption(Adoption& adoption, bool written);

  // Takes every prefix-cache entry of the tokens' blocks out of the cache: the full blocks'
  // hashes and the offers (of full and partial blocks) at each of their block positions that
  // start with the same token. Sequences holding those blocks keep using them; they are no
  // longer found. Returns the positions the cache held before (cached_prefix's n_tokens).
  int32_t forget_prefix(std::span<const int32_t> tokens);

  // Chained hash of one full block of tokens.
  static uint64_t chain_hash(uint64_t previous, std::span<const int32_t> block_tokens);
  // Where blocks continuing the prefix `previous` with `first_token` are offered.
  static uint64_t continuation_key(uint64_t previous, int32_t first_token) {
    return chain_hash(previous ^ 0x5851f42d4c957f2dull, std::span<const int32_t>(&first_token, 1));
  }

 private:
  struct Block {
    int32_t ref_count = 0;
    bool has_hash = false;  // a full block in hash_to_block_
    uint64_t hash = 0;
    bool offered = false;    // in continuations_ under `offer_key`
    uint64_t offer_key = 0;  // continuation_key(the chained hash before it, its first token)
    // The tokens whose K/V its first positions hold: all of them for a full block (guards
    // against hash collisions), fewer for an offered partial block.
    std::vector<int32_t> tokens;
    std::list<int32_t>::iterator free_pos;
    bool in_free_list = false;
  };

  int32_t take_free_block();
  void release_block(int32_t id);
  void take_cached_block(int32_t id);
  // Offers block `id` after the prefix `parent` as holding `tokens` (or keeps its offer when
  // that one is longer: both describe the same positions).
  void offer(int32_t id, uint64_t parent, std::span<const int32_t> tokens);
  // Cuts a block's offer to its first `valid` tokens; a full block so cut leaves the hash map.
  void trim(int32_t id, int32_t valid);
  // Takes a full block out of the hash map (when it is the block the map names).
  void unhash(int32_t id);
  // Forgets everything the caches hold of block `id`.
  void withdraw(int32_t id);
  // The offered block that continues `parent` with the longest run of `want`'s tokens (at
  // most `limit` of them): {block, run}, block -1 when none shares a token.
  std::pair<int32_t, int32_t> best_continuation(uint64_t parent, std::span<const int32_t> want,
                                                int32_t limit) const;
  // Before the sequence writes positions [n_computed, n_computed + n_new): the offer of the
  // block it writes first (held alone) keeps only the tokens those writes leave as they are.
  void trim_before_writing(const Sequence& seq, int32_t n_new);
  // Offers the sequence's partial last block with the tokens computed into it.
  void offer_partial_tail(const Sequence& seq, int32_t n_ready);

  int32_t block_size_;
  std::vector<Block> blocks_;
  std::list<int32_t> free_list_;  // front = next to allocate (least recently freed)
  std::unordered_map<uint64_t, int32_t> hash_to_block_;
  // continuation_key(chained hash of the blocks before, first token) -> offered blocks.
  std::unordered_multimap<uint64_t, int32_t> continuations_;
};

}  // namespace hablar::engine
