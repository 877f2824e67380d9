// Tuning knobs read from the environment, for measuring kernel variants side by side in one
// run on a GPU machine (cuda_bench --lab). Unset, every knob takes the shipped default.
#pragma once

#include <cstdlib>

namespace hablar::cuda {

inline int lab_knob(const char* name, int fallback) {
  const char* value = std::getenv(name);
  return value != nullptr && *value != '\0' ? std::atoi(value) : fallback;
}

}  // namespace hablar::cuda
