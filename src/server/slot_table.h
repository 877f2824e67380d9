// llama-server's slots over hablar's unified KV cache. llama-server gives each of its -np
// slots a context of its own; hablar runs every request on one paged cache whose prefix
// cache is shared by all (engine/block_manager.h), so here a slot is only a name for a token
// history: the tokens whose K/V the last request that ran on it left in the cache. Requests
// pick a slot (their id_slot, or the server picks one) and report it; /slots lists them; and
// /slots/{id}?action=save|restore|erase (routes_slots.cpp) save the K/V of a slot's history
// to a file, restore a file (the slot's history becomes its tokens), or take the history's
// K/V out of the prefix cache. The engine does not limit requests by slot: several requests
// may run on one slot at once (the last to end sets its history).
#pragma once

#include <cstdint>
#include <mutex>
#include <span>
#include <vector>

namespace hablar::server {

class SlotTable {
 public:
  explicit SlotTable(int32_t n_slots);

  int32_t size() const { return (int32_t)slots_.size(); }

  // The slot a request runs on, marked processing: `requested` when >= 0 (the caller checked
  // it is < size()); else the slot not processing whose history shares the longest prefix
  // with `prompt` (none shares a token: the least recently used), or, all of them
  // processing, the least recently used one.
  int32_t acquire(int32_t requested, std::span<const int32_t> prompt);
  // The request now running on the slot (what /slots shows of it).
  void bind(int32_t slot, uint64_t request_id);
  // A request on the slot ended, leaving the K/V of `cached_tokens` in the cache: that is
  // the slot's history now (none: the history stays as it was).
  void release(int32_t slot, std::span<const int32_t> cached_tokens);
  // The request could not start: the slot is as it was (but for its use time).
  void abandon(int32_t slot);

  std::vector<int32_t> history(int32_t slot) const;
  void set_history(int32_t slot, std::vector<int32_t> tokens);

  struct State {
    bool processing = false;
    uint64_t request_id = 0;  // the last request bound to it (0: none yet)
    int32_t n_history = 0;    // tokens in its history
  };
  State state(int32_t slot) const;

 private:
  struct Slot {
    int32_t running = 0;  // requests running on it
    uint64_t request_id = 0;
    std::vector<int32_t> history;
    uint64_t last_used = 0;  // clock_ at its last acquire or release
  };
  mutable std::mutex mu_;
  std::vector<Slot> slots_;
  uint64_t clock_ = 0;
};

}  // namespace hablar::server
