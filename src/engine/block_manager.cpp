#include "engine/block_manager.h"

#include <algorithm>
#include <string>

#include "core/error.h"

namespace hablar::engine {

const char* finish_reason_name(FinishReason reason) {
  switch (reason) {
    case FinishReason::kNone:
      return "none";
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kCancelled:
      return "cancelled";
    case FinishReason::kError:
      return "error";
  }
  return "unknown";
}

BlockManager::BlockManager(int32_t n_blocks, int32_t block_size) : block_size_(block_size) {
  if (n_blocks <= 0 || block_size <= 0)
    throw_error(ErrorKind::kInvalidArgument,
                "KV cache: need at least one block of at least one position (got " +
                    std::to_string(n_blocks) + " blocks of " + std::to_string(block_size) + ")");
  blocks_.resize((size_t)n_blocks);
  for (int32_t i = 0; i < n_blocks; ++i) {
    free_list_.push_back(i);
    blocks_[(size_t)i].free_pos = std::prev(free_list_.end());
    blocks_[(size_t)i].in_free_list = true;
  }
}

uint64_t BlockManager::chain_hash(uint64_t previous, std::span<const int32_t> block_tokens) {
  // splitmix64 finalizer over (previous, token...) folded one word at a time.
  auto mix = [](uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
  };
  uint64_t h = mix(previous ^ 0x6a09e667f3bcc909ull);
  for (int32_t t : block_tokens) h = mix(h ^ (uint64_t)(uint32_t)t);
  return h;
}

int32_t BlockManager::take_free_block() {
  HABLAR_CHECK(!free_list_.empty(), "no free KV block");
  int32_t id = free_list_.front();
  free_list_.pop_front();
  Block& b = blocks_[(size_t)id];
  b.in_free_list = false;
  withdraw(id);  // evict its old prefix-cache entries
  b.ref_count = 1;
  return id;
}

void BlockManager::unhash(int32_t id) {
  Block& b = blocks_[(size_t)id];
  if (!b.has_hash) return;
  auto it = hash_to_block_.find(b.hash);
  if (it != hash_to_block_.end() && it->second == id) hash_to_block_.erase(it);
  b.has_hash = false;
}

void BlockManager::withdraw(int32_t id) {
  Block& b = blocks_[(size_t)id];
  unhash(id);
  if (b.offered) {
    auto [it, end] = continuations_.equal_range(b.offer_key);
    for (; it != end; ++it)
      if (it->second == id) {
        continuations_.erase(it);
        break;
      }
    b.offered = false;
  }
  b.tokens.clear();
}

void BlockManager::offer(int32_t id, uint64_t parent, std::span<const int32_t> tokens) {
  if (tokens.empty()) return;
  Block& b = blocks_[(size_t)id];
  // A holder's partial block grows by a token a step: its offer (same prefix, same first
  // token) only takes the new ones.
  if (b.offered && !b.tokens.empty() && b.tokens.front() == tokens.front()) {
    if (tokens.size() > b.tokens.size())
      b.tokens.insert(b.tokens.end(), tokens.begin() + (std::ptrdiff_t)b.tokens.size(),
                      tokens.end());
    return;
  }
  const uint64_t key = continuation_key(parent, tokens[0]);
  if (b.offered && b.offer_key != key) withdraw(id);
  if (!b.offered) {
    continuations_.emplace(key, id);
    b.offered = true;
    b.offer_key = key;
    b.tokens.reserve((size_t)block_size_);
  }
  if (tokens.size() > b.tokens.size()) b.tokens.assign(tokens.begin(), tokens.end());
}

void BlockManager::trim(int32_t id, int32_t valid) {
  Block& b = blocks_[(size_t)id];
  if ((int32_t)b.tokens.size() <= valid) return;
  if (valid == 0) return withdraw(id);
  unhash(id);
  b.tokens.resize((size_t)valid);
}

std::pair<int32_t, int32_t> BlockManager::best_continuation(uint64_t parent,
                                                            std::span<const int32_t> want,
                                                            int32_t limit) const {
  std::pair<int32_t, int32_t> best{-1, 0};
  if (want.empty() || limit <= 0) return best;
  auto [it, end] = continuations_.equal_range(continuation_key(parent, want[0]));
  for (; it != end; ++it) {
    const std::vector<int32_t>& have = blocks_[(size_t)it->second].tokens;
    const size_t n = std::min({have.size(), want.size(), (size_t)std::max(limit, 0)});
    int32_t run = 0;
    while ((size_t)run < n && have[(size_t)run] == want[(size_t)run]) ++run;
    if (run > best.second) best = {it->second, run};
  }
  return best;
}

void BlockManager::take_cached_block(int32_t id) {
  Block& b = blocks_[(size_t)id];
  if (b.in_free_list) {
    free_list_.erase(b.free_pos);
    b.in_free_list = false;
  }
  b.ref_count += 1;
}

void BlockManager::release_block(int32_t id) {
  Block& b = blocks_[(size_t)id];
  HABLAR_CHECK(b.ref_count > 0, "KV block " + std::to_string(id) + " freed twice");
  if (--b.ref_count == 0) {
    free_list_.push_back(id);
    b.free_pos = std::prev(free_list_.end());
    b.in_free_list = true;
  }
}

BlockManager::CachedPrefix BlockManager::cached_prefix(std::span<const int32_t> tokens,
                                                       int32_t limit) const {
  CachedPrefix p;
  const size_t bs = (size_t)block_size_;
  uint64_t h = 0;
  for (size_t start = 0; start + bs <= tokens.size(); start += bs) {
    const std::span<const int32_t> toks = tokens.subspan(start, bs);
    h = chain_hash(h, toks);
    auto it = hash_to_block_.find(h);
    if (it == hash_to_block_.end()) break;
    const Block& b = blocks_[(size_t)it->second];
    if (!std::equal(b.tokens.begin(), b.tokens.end(), toks.begin(), toks.end())) break;
    p.blocks.push_back(it->second);
    p.hashes.push_back(h);
    p.n_tokens += block_size_;
  }
  // Then part of the next block: the offered continuation sharing the longest run.
  const uint64_t parent = p.hashes.empty() ? 0 : p.hashes.back();
  const auto [block, run] =
      best_continuation(parent, tokens.subspan((size_t)p.n_tokens), limit - p.n_tokens);
  if (block >= 0) {
    p.blocks.push_back(block);
    p.n_tokens += run;
  }
  return p;
}

int32_t BlockManager::match_prefix(Sequence& seq) {
  HABLAR_CHECK(seq.block_table.empty(), "match_prefix on a sequence that holds blocks");
  const int32_t n_tokens = (int32_t)seq.tokens.size();
  // The partial block's run leaves one token to compute (a run that would all be computed
  // again is not worth a copy-on-write).
  CachedPrefix p = cached_prefix(seq.tokens, n_tokens - 1);
  for (int32_t id : p.blocks) take_cached_block(id);
  seq.block_table = std::move(p.blocks);
  seq.block_hashes = std::move(p.hashes);
  // Keep one token to compute: its logits give the next token.
  seq.n_computed = std::min(p.n_tokens, n_tokens - 1);
  return seq.n_computed;
}

bool BlockManager::begin_adoption(std::span<const int32_t> tokens, Adoption& adoption,
                                  int32_t& needed) {
  const size_t bs = (size_t)block_size_;
  const size_t n_spans = (tokens.size() + bs - 1) / bs;
  std::vector<int32_t> found(n_spans, -1);
  uint64_t h = 0;
  for (size_t i = 0; i < n_spans; ++i) {
    const std::span<const int32_t> toks =
        tokens.subspan(i * bs, std::min(bs, tokens.size() - i * bs));
    if (toks.size() == bs) {
      h = chain_hash(h, toks);
      auto it = hash_to_block_.find(h);
      if (it != hash_to_block_.end() &&
          std::ranges::equal(blocks_[(size_t)it->second].tokens, toks))
        found[i] = it->second;
    } else if (const auto [block, run] = best_continuation(h, toks, (int32_t)toks.size());
               block >= 0 && run == (int32_t)toks.size()) {
      found[i] = block;
    }
  }
  needed = (int32_t)std::ranges::count(found, -1);
  int32_t found_free = 0;  // found blocks now in the free list: holding them takes them out
  for (int32_t id : found)
    if (id >= 0 && blocks_[(size_t)id].in_free_list) ++found_free;
  if (needed > n_free() - found_free) return false;
  adoption.blocks.clear();
  adoption.fresh.clear();
  adoption.tokens.assign(tokens.begin(), tokens.end());
  for (int32_t id : found)  // held first, so that taking free blocks cannot evict them
    if (id >= 0) take_cached_block(id);
  for (int32_t id : found) {
    adoption.blocks.push_back(id >= 0 ? id : take_free_block());
    adoption.fresh.push_back(id < 0);
  }
  return true;
}

void BlockManager::end_adoption(Adoption& adoption, bool written) {
  const std::span<const int32_t> tokens = adoption.tokens;
  const size_t bs = (size_t)block_size_;
  uint64_t h = 0;
  for (size_t i = 0; written && i < adoption.blocks.size(); ++i) {
    const std::span<const int32_t> toks =
        tokens.subspan(i * bs, std::min(bs, tokens.size() - i * bs));
    const uint64_t prev = h;
    if (toks.size() == bs) h = chain_hash(prev, toks);
    if (!adoption.fresh[i]) continue;
    const int32_t id = adoption.blocks[i];
    offer(id, prev, toks);
    if (toks.size() < bs || hash_to_block_.count(h)) continue;
    Block& b = blocks_[(size_t)id];
    b.has_hash = true;
    b.hash = h;
    hash_to_block_[h] = id;
  }
  // Tail first, as free() does: the free list is LRU, so the head blocks outlive the tail.
  for (auto it = adoption.blocks.rbegin(); it != adoption.blocks.rend(); ++it) release_block(*it);
  adoption = Adoption{};
}

int32_t BlockManager::forget_prefix(std::span<const int32_t> tokens) {
  const int32_t held = cached_prefix(tokens).n_tokens;
  const size_t bs = (size_t)block_size_;
  uint64_t h = 0;
  std::vector<int32_t> ids;
  for (size_t start = 0; start < tokens.size(); start += bs) {
    const std::span<const int32_t> toks =
        tokens.subspan(start, std::min(bs, tokens.size() - start));
    // Every offer at this place that starts with the same token serves part of the prefix.
    ids.clear();
    auto [it, end] = continuations_.equal_range(continuation_key(h, toks[0]));
    for (; it != end; ++it) {
      const std::vector<int32_t>& have = blocks_[(size_t)it->second].tokens;
      if (!have.empty() && have[0] == toks[0]) ids.push_back(it->second);
    }
    if (toks.size() == bs) {
      h = chain_hash(h, toks);
      if (auto f = hash_to_block_.find(h); f != hash_to_block_.end()) ids.push_back(f->second);
    }
    for (int32_t id : ids) withdraw(id);
  }
  return held;
}

int32_t BlockManager::blocks_needed(const Sequence& seq, int32_t n_new) const {
  const int32_t have = (int32_t)seq.block_table.size();
  int32_t need = std::max(0, blocks_for(seq.n_computed + n_new, block_size_) - have);
  const int32_t first = seq.n_computed / block_size_;
  if (n_new > 0 && first < have && blocks_[(size_t)seq.block_table[(size_t)first]].ref_count > 1)
    need += 1;  // copy-on-write of a shared block
  return need;
}

bool BlockManager::allocate_slots(Sequence& seq, int32_t n_new, std::vector<BlockCopy>& copies) {
  if (blocks_needed(seq, n_new) > n_free()) return false;
  const int32_t first = seq.n_computed / block_size_;
  if (n_new > 0 && first < (int32_t)seq.block_table.size()) {
    int32_t& slot = seq.block_table[(size_t)first];
    if (blocks_[(size_t)slot].ref_count > 1) {
      int32_t copy = take_free_block();
      copies.push_back({slot, copy});
      release_block(slot);
      slot = copy;
      // A private copy about to be written no longer matches the shared block's hash.
      if ((int32_t)seq.block_hashes.size() > first) seq.block_hashes.resize((size_t)first);
    }
  }
  trim_before_writing(seq, n_new);
  const int32_t want = blocks_for(seq.n_computed + n_new, block_size_);
  while ((int32_t)seq.block_table.size() < want) seq.block_table.push_back(take_free_block());
  return true;
}

void BlockManager::trim_before_writing(const Sequence& seq, int32_t n_new) {
  const int32_t first = seq.n_computed / block_size_;
  if (n_new <= 0 || first >= (int32_t)seq.block_table.size()) return;
  const int32_t id = seq.block_table[(size_t)first];
  if (id == kReleased || !blocks_[(size_t)id].offered) return;
  const std::vector<int32_t>& have = blocks_[(size_t)id].tokens;
  const int32_t start = first * block_size_;
  const int32_t end = std::min(seq.n_computed + n_new, start + (int32_t)have.size());
  // Writing a position with the token it already holds leaves its K/V as it was; the
  // positions past the known tokens (drafts, tokens yet to come) hold new ones.
  for (int32_t pos = seq.n_computed; pos < end; ++pos)
    if (pos >= (int32_t)seq.tokens.size() || seq.tokens[(size_t)pos] != have[(size_t)(pos - start)])
      return trim(id, pos - start);
}

int32_t BlockManager::release_before(Sequence& seq, int32_t first) {
  // Never the block position n_computed is written to: first <= n_computed keeps it.
  const int32_t end = std::min({std::max(first, 0) / block_size_, seq.n_computed / block_size_,
                                (int32_t)seq.block_table.size()});
  int32_t released = 0;
  for (; seq.n_released_blocks < end; ++seq.n_released_blocks, ++released) {
    int32_t& slot = seq.block_table[(size_t)seq.n_released_blocks];
    if (blocks_[(size_t)slot].ref_count == 1) withdraw(slot);
    release_block(slot);
    slot = kReleased;
  }
  return released;
}

void BlockManager::register_full_blocks(Sequence& seq, int32_t n_known) {
  const int32_t n_ready = std::min(seq.n_computed, n_known);  // computed and known
  const int32_t n_full = std::min<int32_t>(n_ready / block_size_, (int32_t)seq.block_table.size());
  while ((int32_t)seq.block_hashes.size() < n_full) {
    const size_t i = seq.block_hashes.size();
    const uint64_t prev = i == 0 ? 0 : seq.block_hashes[i - 1];
    std::span<const int32_t> toks(seq.tokens.data() + i * (size_t)block_size_, (size_t)block_size_);
    const uint64_t h = chain_hash(prev, toks);
    seq.block_hashes.push_back(h);
    const int32_t id = seq.block_table[i];
    if (id == kReleased) continue;  // behind the window: chained through, never offered
    Block& b = blocks_[(size_t)id];
    if (b.has_hash) continue;  // already registered (revived from the cache)
    offer(id, prev, toks);
    if (hash_to_block_.count(h)) continue;  // another block holds this prefix already
    b.has_hash = true;
    b.hash = h;
    hash_to_block_[h] = id;
  }
  offer_partial_tail(seq, n_ready);
}

void BlockManager::offer_partial_tail(const Sequence& seq, int32_t n_ready) {
  const int32_t i = n_ready / block_size_, held = n_ready % block_size_;
  if (held == 0 || i >= (int32_t)seq.block_table.size() || (int32_t)seq.block_hashes.size() != i)
    return;
  const int32_t id = seq.block_table[(size_t)i];
  // A block others hold too may be written by them (each copies it first, but the offer
  // would not follow): offered only by its one holder.
  if (id == kReleased || blocks_[(size_t)id].ref_count != 1 || blocks_[(size_t)id].has_hash) return;
  offer(id, i == 0 ? 0 : seq.block_hashes[(size_t)i - 1],
        std::span<const int32_t>(seq.tokens.data() + (size_t)i * block_size_, (size_t)held));
}

void BlockManager::truncate(Sequence& seq, int32_t n_tokens) {
  HABLAR_CHECK(
      n_tokens >= 0 && blocks_for(n_tokens, block_size_) <= (int32_t)seq.block_table.size(),
      "truncating a sequence to more positions than its blocks hold");
  const size_t keep = (size_t)blocks_for(n_tokens, block_size_);
  HABLAR_CHECK(n_tokens / block_size_ >= seq.n_released_blocks,
               "truncating a sequence into blocks behind its sliding window");
  while (seq.block_table.size() > keep) {
    release_block(seq.block_table.back());
    seq.block_table.pop_back();
  }
  const size_t full = (size_t)(n_tokens / block_size_);
  if (seq.block_hashes.size() > full) seq.block_hashes.resize(full);
  seq.n_computed = n_tokens;
}

void BlockManager::free(Sequence& seq) {
  // Tail first: the free list is LRU, so a prompt's head blocks outlive its tail.
  for (auto it = seq.block_table.rbegin(); it != seq.block_table.rend(); ++it)
    if (*it != kReleased) release_block(*it);
  seq.block_table.clear();
  seq.n_released_blocks = 0;
  seq.block_hashes.clear();
  seq.n_computed = 0;
}

void BlockManager::fork(const Sequence& parent, Sequence& child) {
  HABLAR_CHECK(child.block_table.empty(), "fork into a sequence that holds blocks");
  for (int32_t id : parent.block_table)
    if (id != kReleased) take_cached_block(id);
  child.block_table = parent.block_table;
  child.n_released_blocks = parent.n_released_blocks;
  child.block_hashes = parent.block_hashes;
  child.n_computed = parent.n_computed;
}

}  // namespace hablar::engine
