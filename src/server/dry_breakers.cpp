// Breaker resolution for DRY (dry_breakers.h).
#include "server/dry_breakers.h"

#include <algorithm>
#include <map>
#include <mutex>

namespace hablar::server {
namespace {

constexpr size_t kMaxBreakerBytes = 40;
constexpr size_t kMaxTailTokens = 20;
constexpr size_t kMaxCachedLists = 32;

void add_unique(engine::DryBreakers& out, int32_t head, std::vector<int32_t> tail) {
  auto [first, last] = out.heads.equal_range(head);
  for (auto it = first; it != last; ++it)
    if (it->second == tail) return;
  out.heads.emplace(head, std::move(tail));
}

// Every way token `id` can begin breaker `b`: it holds all of it, or it ends with a
// beginning of it and the rest (tokenized) follows.
void resolve_one(const tokenizer::Tokenizer& tok, int32_t id, const std::string& b,
                 engine::DryBreakers& out) {
  const std::string word = tok.token_text(id, /*show_special=*/true, /*first=*/false);
  if (word.find(b) != std::string::npos) {
    add_unique(out, id, {});
    return;
  }
  for (size_t pos = word.find(b[0]); pos != std::string::npos; pos = word.find(b[0], pos + 1)) {
    const size_t overlap = word.size() - pos;  // < b.size(), else find() had matched
    if (word.compare(pos, overlap, b, 0, overlap) != 0) continue;
    std::vector<int32_t> tail = tok.encode(b.substr(overlap), false, false);
    if (tail.size() > kMaxTailTokens) tail.resize(kMaxTailTokens);
    add_unique(out, id, std::move(tail));
  }
}

}  // namespace

const std::vector<std::string>& default_dry_breakers() {
  static const std::vector<std::string> kDefault = {"\n", ":", "\"", "*"};
  return kDefault;
}

std::shared_ptr<const engine::DryBreakers> resolve_dry_breakers(
    const tokenizer::Tokenizer& tok, const std::vector<std::string>& breakers) {
  static std::mutex mu;
  static std::map<std::pair<const void*, std::vector<std::string>>,
                  std::shared_ptr<const engine::DryBreakers>>
      cache;
  const auto key = std::make_pair((const void*)&tok, breakers);
  {
    std::lock_guard<std::mutex> lock(mu);
    if (auto it = cache.find(key); it != cache.end()) return it->second;
  }
  auto resolved = std::make_shared<engine::DryBreakers>();
  for (std::string b : breakers) {
    if (b.empty()) continue;
    if (b.size() > kMaxBreakerBytes) b.resize(kMaxBreakerBytes);
    for (int32_t id = 0; id < tok.n_vocab(); ++id) resolve_one(tok, id, b, *resolved);
  }
  std::lock_guard<std::mutex> lock(mu);
  if (cache.size() >= kMaxCachedLists) cache.clear();
  cache[key] = resolved;
  return resolved;
}

}  // namespace hablar::server
