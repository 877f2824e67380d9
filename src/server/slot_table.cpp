#include "server/slot_table.h"

#include <algorithm>

#include "core/error.h"

namespace hablar::server {

SlotTable::SlotTable(int32_t n_slots) : slots_((size_t)std::max(1, n_slots)) {}

int32_t SlotTable::acquire(int32_t requested, std::span<const int32_t> prompt) {
  std::lock_guard<std::mutex> lock(mu_);
  HABLAR_CHECK(requested < size(), "slot id out of range");
  int32_t pick = requested;
  if (pick < 0) {
    // Idle slots first; among them the longest shared prefix, then the least recently used.
    size_t best_shared = 0;
    for (int32_t i = 0; i < size(); ++i) {
      const Slot& s = slots_[(size_t)i];
      const auto mismatch = std::ranges::mismatch(s.history, prompt);
      const size_t shared = (size_t)(mismatch.in1 - s.history.begin());
      auto better = [&](const Slot& other) {
        if ((s.running == 0) != (other.running == 0)) return s.running == 0;
        if (s.running == 0 && shared != best_shared) return shared > best_shared;
        return s.last_used < other.last_used;
      };
      if (pick < 0 || better(slots_[(size_t)pick])) {
        pick = i;
        best_shared = s.running == 0 ? shared : 0;
      }
    }
  }
  Slot& s = slots_[(size_t)pick];
  s.running += 1;
  s.last_used = ++clock_;
  return pick;
}

void SlotTable::bind(int32_t slot, uint64_t request_id) {
  std::lock_guard<std::mutex> lock(mu_);
  slots_.at((size_t)slot).request_id = request_id;
}

void SlotTable::release(int32_t slot, std::span<const int32_t> cached_tokens) {
  std::lock_guard<std::mutex> lock(mu_);
  Slot& s = slots_.at((size_t)slot);
  s.running = std::max(0, s.running - 1);
  // A request that left nothing computed (cancelled while queued, refused) leaves the
  // slot's history, whose K/V it did not touch, as it was.
  if (!cached_tokens.empty()) s.history.assign(cached_tokens.begin(), cached_tokens.end());
  s.last_used = ++clock_;
}

void SlotTable::abandon(int32_t slot) {
  std::lock_guard<std::mutex> lock(mu_);
  Slot& s = slots_.at((size_t)slot);
  s.running = std::max(0, s.running - 1);
}

std::vector<int32_t> SlotTable::history(int32_t slot) const {
  std::lock_guard<std::mutex> lock(mu_);
  return slots_.at((size_t)slot).history;
}

void SlotTable::set_history(int32_t slot, std::vector<int32_t> tokens) {
  std::lock_guard<std::mutex> lock(mu_);
  Slot& s = slots_.at((size_t)slot);
  s.history = std::move(tokens);
  s.last_used = ++clock_;
}

SlotTable::State SlotTable::state(int32_t slot) const {
  std::lock_guard<std::mutex> lock(mu_);
  const Slot& s = slots_.at((size_t)slot);
  return {s.running > 0, s.request_id, (int32_t)s.history.size()};
}

}  // namespace hablar::server
