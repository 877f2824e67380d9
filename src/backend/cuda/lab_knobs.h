// Tuning knobs for measuring kernel variants side by side in one run on a GPU machine
// (cuda_bench --lab). Production never reads them: until enable_lab_knobs() is called (only
// cuda_bench --lab calls it) every knob is its shipped default and no environment variable
// is read.
#pragma once

#include <atomic>
#include <cstdlib>

namespace hablar::cuda {

namespace detail {
inline std::atomic<bool> lab_knobs_enabled{false};
}

// From now on, lab_knob() reads HABLAR_* variables of the environment (the lab bench only).
inline void enable_lab_knobs() {
  detail::lab_knobs_enabled.store(true, std::memory_order_relaxed);
}

inline int lab_knob(const char* name, int fallback) {
  if (!detail::lab_knobs_enabled.load(std::memory_order_relaxed)) return fallback;
  const char* value = std::getenv(name);
  return value != nullptr && *value != '\0' ? std::atoi(value) : fallback;
}

}  // namespace hablar::cuda
