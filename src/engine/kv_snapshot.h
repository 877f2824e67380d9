// K/V snapshots: the cached K/V of a token prefix copied out of the paged cache and back in,
// and the slot files that carry them to disk (llama-server's /slots/{id}?action=save,
// restore and erase; server/routes_slots.cpp).
//
// hablar keeps one paged cache with a global prefix cache (block_manager.h), not a context
// per slot, so a snapshot is keyed by tokens, not by a slot:
//   save:    the longest prefix of the tokens whose K/V the prefix cache holds (its full
//            blocks, then an offered partial block) is read through the executor;
//   restore: blocks are allocated for the file's tokens (those whose prefix is cached
//            already are reused, not written), their K/V written through the executor, and
//            then registered in the prefix cache exactly as if a request had computed them,
//            so a later prompt with that prefix computes only its new tokens;
//   forget:  the prefix cache's entries for the tokens are taken out (erase).
// Each runs on the engine's step thread between steps (Engine::run_between_steps), so no
// step reads or writes the blocks meanwhile. The file format is docs/slot-files.md.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <span>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/kv_layout.h"
#include "engine/block_manager.h"
#include "engine/executor.h"

namespace hablar::engine {

class Engine;

// The regions block `block` occupies in a cache of layout `l`, in a snapshot's order (layer 0
// K, layer 0 V, layer 1 K, ...): fn(unit offset from the cache's base (2-byte units, as
// KvCacheLayout counts), bytes). Each executor copies blocks by these.
template <typename Fn>
void for_each_kv_region(const KvCacheLayout& l, int32_t block, Fn&& fn) {
  for (int layer = 0; layer < l.n_layers; ++layer)
    for (int kv = 0; kv < 2; ++kv) fn(l.offset(layer, kv, block, 0, 0, 0), l.block_elems(kv) * 2);
}

// The copies between a cache of layout `l` and a host buffer of `host_bytes` laid out as
// StepExecutor::read_kv_blocks writes it (the blocks one after another, each block's
// regions in for_each_kv_region order): copy(unit offset in the cache, byte offset in the
// host buffer, bytes). Throws Error(kInternal) for a buffer of the wrong size or a block id
// outside the cache. Every executor's read_kv_blocks / write_kv_blocks goes through it.
template <typename Copy>
void for_each_kv_copy(const KvCacheLayout& l, std::span<const int32_t> blocks, size_t host_bytes,
                      Copy&& copy) {
  HABLAR_CHECK(host_bytes == blocks.size() * l.block_bytes(), "K/V block copy of the wrong size");
  size_t at = 0;
  for (int32_t block : blocks) {
    HABLAR_CHECK(block >= 0 && block < l.n_blocks, "K/V block id outside the cache");
    for_each_kv_region(l, block, [&](size_t units, size_t bytes) {
      copy(units, at, bytes);
      at += bytes;
    });
  }
}

// What a snapshot's K/V depends on besides its tokens: the model that computed it (its
// architecture and model::kv_fingerprint) and the cache's geometry and element types.
struct KvIdentity {
  std::string arch;
  uint64_t model_fingerprint = 0;
  KvCacheLayout layout;  // n_blocks is no part of it (a file fits any pool large enough)
};
// "" when K/V saved under `saved` restores under `here`; else what differs, in words.
std::string identity_mismatch(const KvIdentity& saved, const KvIdentity& here);

struct KvSnapshot {
  std::vector<int32_t> tokens;  // the positions the K/V covers, from 0
  std::vector<uint8_t> kv;      // blocks_for(tokens) blocks of layout.block_bytes() each
};

// The step thread's side (inside Engine::run_between_steps). Both throw Error(kUnsupported)
// when the executor cannot copy its cache (StepExecutor::kv_snapshot_layout).
// The longest cached prefix of `tokens` and its K/V (no tokens when none is cached).
KvSnapshot read_cached_prefix(BlockManager& blocks, StepExecutor& executor,
                              std::span<const int32_t> tokens);
// The snapshot's K/V into the cache, registered in the prefix cache. Throws Error(kResource)
// when too few blocks are free (none is taken then), kInvalidArgument for a snapshot whose
// sizes disagree; a failed write registers nothing.
void write_cached_prefix(BlockManager& blocks, StepExecutor& executor, const KvSnapshot& snapshot);

// The same from any thread, run between the engine's steps; forget_prefix is
// BlockManager::forget_prefix (returns the positions the cache held).
KvSnapshot save_prefix(Engine& engine, std::span<const int32_t> tokens);
void restore_prefix(Engine& engine, const KvSnapshot& snapshot);
int32_t forget_prefix(Engine& engine, std::span<const int32_t> tokens);

// Slot files (docs/slot-files.md). write_slot_file returns the bytes written.
uint64_t write_slot_file(std::ostream& out, const KvSnapshot& snapshot, const KvIdentity& identity);
// Reads a file of `file_size` bytes and checks it against this server's identity, its KV
// pool (`here.layout.n_blocks`: a file of more blocks is refused before anything is
// allocated) and vocabulary. Throws Error(kFormat) for a malformed file (wrong magic,
// truncated, sizes that disagree, a checksum that does not match) and kInvalidArgument for
// one saved by another model or cache, each with a message that says what.
KvSnapshot read_slot_file(std::istream& in, uint64_t file_size, const KvIdentity& here,
                          int32_t n_vocab);

// The magic numbers and versions (docs/slot-files.md).
inline constexpr uint32_t kSlotFileMagic = 0x54534248;  // "HBST" (hablar slot tokens)
inline constexpr uint32_t kSlotFileVersion = 1;
inline constexpr uint32_t kPackedTokensVersion = 1;
inline constexpr uint32_t kSlotKvMagic = 0x564B4248;  // "HBKV"
inline constexpr uint32_t kSlotKvVersion = 1;

}  // namespace hablar::engine
