// Stop strings across token boundaries: hold back the longest tail of the text that is a
// prefix of some stop string; emit the rest.
#include "engine/stop_strings.h"

#include <algorithm>

namespace hablar::engine {

StopStringMatcher::StopStringMatcher(std::vector<std::string> stops) {
  for (std::string& s : stops)
    if (!s.empty()) stops_.push_back(std::move(s));
}

StopStringMatcher::Result StopStringMatcher::push(std::string_view text) {
  Result r;
  if (stopped_) return r;
  held_.append(text);
  // The earliest complete stop string wins.
  size_t best = std::string::npos;
  const std::string* best_stop = nullptr;
  for (const std::string& s : stops_) {
    const size_t at = held_.find(s);
    if (at != std::string::npos && at < best) best = at, best_stop = &s;
  }
  if (best_stop != nullptr) {
    r.text = held_.substr(0, best);
    r.stopped = stopped_ = true;
    r.matched = *best_stop;
    held_.clear();
    return r;
  }
  // Longest suffix of held_ that is a proper prefix of a stop string must wait.
  size_t keep = 0;
  for (const std::string& s : stops_) {
    const size_t max_len = std::min(s.size() - 1, held_.size());
    for (size_t len = max_len; len > keep; --len)
      if (held_.compare(held_.size() - len, len, s, 0, len) == 0) {
        keep = len;
        break;
      }
  }
  r.text = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return r;
}

std::string StopStringMatcher::flush() {
  std::string out;
  if (!stopped_) out.swap(held_);
  held_.clear();
  return out;
}

}  // namespace hablar::engine
