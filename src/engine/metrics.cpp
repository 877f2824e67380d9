#include "engine/metrics.h"

#include <utility>

namespace hablar::engine {

Histogram::Histogram(std::vector<double> upper_bounds)
    : bounds(std::move(upper_bounds)), counts(bounds.size(), 0) {}

void Histogram::observe(double value) {
  for (size_t i = 0; i < bounds.size(); ++i)
    if (value <= bounds[i]) counts[i] += 1;
  count += 1;
  sum += value;
}

}  // namespace hablar::engine
