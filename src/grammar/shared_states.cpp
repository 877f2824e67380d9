#include "grammar/shared_states.h"

#include <algorithm>
#include <cstring>
#include <mutex>

#include "grammar/recognizer.h"

namespace hablar::grammar {

namespace {

void append_i32(std::string& out, int32_t v) {
  char bytes[sizeof v];
  std::memcpy(bytes, &v, sizeof v);
  out.append(bytes, sizeof v);
}

}  // namespace

// Layout: partial (4 bytes), partial_left, partial_len, then per stack its positions from the
// top down and a -2 after the bottom (kAccept: one -1); stacks in byte order of their parts.
std::string state_key(const RecState& s, const StackArena& arena, size_t max_bytes) {
  std::vector<std::string> stacks;
  stacks.reserve(s.stacks.size());
  size_t total = 6;
  for (int32_t id : s.stacks) {
    std::string chain;
    if (id == kAccept) {
      append_i32(chain, -1);
    } else {
      for (int32_t n = id; n >= 0 && total + chain.size() <= max_bytes; n = arena.at(n).parent)
        append_i32(chain, arena.at(n).pos);
      append_i32(chain, -2);
    }
    total += chain.size();
    if (total > max_bytes) return "";
    stacks.push_back(std::move(chain));
  }
  std::sort(stacks.begin(), stacks.end());
  std::string key;
  append_i32(key, (int32_t)s.partial);
  key.push_back((char)s.partial_left);
  key.push_back((char)s.partial_len);
  for (const std::string& chain : stacks) key += chain;
  return key;
}

template <typename T>
std::shared_ptr<const T> SharedStates::find(const Map<T>& map, const std::string& key) const {
  std::shared_lock lock(mu_);
  auto it = map.find(key);
  return it == map.end() ? nullptr : it->second;
}

template <typename T>
std::shared_ptr<const T> SharedStates::keep(Map<T>& map, const std::string& key,
                                            std::shared_ptr<const T> value, size_t bytes) {
  bytes += key.size() + sizeof(T) + 64;  // (the map's node and the control block, roughly)
  std::unique_lock lock(mu_);
  if (auto it = map.find(key); it != map.end()) return it->second;
  if (bytes_ + bytes > budget_) return nullptr;
  bytes_ += bytes;
  map.emplace(key, value);
  return value;
}

std::shared_ptr<const SharedStates::Mask> SharedStates::mask(const std::string& key) const {
  return find(masks_, key);
}

std::shared_ptr<const SharedStates::Profile> SharedStates::profile(const std::string& key) const {
  return find(profiles_, key);
}

std::shared_ptr<const SharedStates::Restricted> SharedStates::restricted(const std::string& key,
                                                                         int32_t distance) const {
  return find(restricted_, key + '#' + std::to_string(distance));
}

std::shared_ptr<const SharedStates::Mask> SharedStates::keep_mask(const std::string& key,
                                                                  std::shared_ptr<const Mask> m) {
  const size_t bytes = m->words.size() * sizeof(uint32_t);
  return keep(masks_, key, std::move(m), bytes);
}

std::shared_ptr<const SharedStates::Profile> SharedStates::keep_profile(
    const std::string& key, std::shared_ptr<const Profile> p) {
  const size_t bytes = p->per_token.size();
  return keep(profiles_, key, std::move(p), bytes);
}

std::shared_ptr<const SharedStates::Restricted> SharedStates::keep_restricted(
    const std::string& key, int32_t distance, std::shared_ptr<const Restricted> r) {
  const size_t bytes = r->words.size() * sizeof(uint32_t);
  return keep(restricted_, key + '#' + std::to_string(distance), std::move(r), bytes);
}

bool SharedStates::seen_again(const std::string& key) {
  {
    std::shared_lock lock(mu_);
    if (seen_.count(key) != 0) return true;
  }
  std::unique_lock lock(mu_);
  const size_t bytes = key.size() + 64;
  if (bytes_ + bytes > budget_) return false;
  if (!seen_.insert(key).second) return true;
  bytes_ += bytes;
  return false;
}

size_t SharedStates::bytes_kept() const {
  std::shared_lock lock(mu_);
  return bytes_;
}

size_t SharedStates::entries() const {
  std::shared_lock lock(mu_);
  return masks_.size() + profiles_.size() + restricted_.size();
}

}  // namespace hablar::grammar
