#include "core/rope_angle_cache.h"

#include <string>
#include <utility>

#include "core/error.h"

namespace hablar {

RopeAngleCache::RopeAngleCache(RopeParams params) : params_(std::move(params)) {
  float probe_cos[kMaxRopePairs], probe_sin[kMaxRopePairs];
  if (params_.n_dims > 2 * kMaxRopePairs)
    throw_error(ErrorKind::kInvalidArgument,
                "rope: n_dims above " + std::to_string(2 * kMaxRopePairs));
  rope_angles(0, params_, probe_cos, probe_sin);  // validates the parameters
  pairs_ = params_.n_dims / 2;
}

void RopeAngleCache::angles(int pos, const float** cos_t, const float** sin_t) {
  HABLAR_CHECK(pos >= 0, "RopeAngleCache: negative position");
  const size_t page_index = (size_t)pos / kPagePositions, slot = (size_t)pos % kPagePositions;
  if (page_index >= pages_.size()) pages_.resize(page_index + 1);
  Page& page = pages_[page_index];
  if (!page.cos) {
    page.cos = std::make_unique<float[]>((size_t)kPagePositions * pairs_);
    page.sin = std::make_unique<float[]>((size_t)kPagePositions * pairs_);
    page.ready.assign(kPagePositions, 0);
  }
  float* c = page.cos.get() + slot * pairs_;
  float* s = page.sin.get() + slot * pairs_;
  if (!page.ready[slot]) {
    rope_angles(pos, params_, c, s);
    page.ready[slot] = 1;
  }
  *cos_t = c;
  *sin_t = s;
}

}  // namespace hablar
