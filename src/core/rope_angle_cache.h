// The rotation angles of positions (rope.h: rope_angles), computed once per position and
// kept. A step of thousands of rows would otherwise recompute n_dims / 2 cos / sin pairs per
// row on the host before the device may start (about 0.8 ms for 2,048 rows of 64 pairs on a
// server core); a server's positions repeat from request to request. Positions are kept in
// pages of kPagePositions, each allocated when one of its positions is first asked for.
// Not thread-safe: one step thread uses it.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/rope.h"

namespace hablar {

class RopeAngleCache {
 public:
  static constexpr int kPagePositions = 1024;

  explicit RopeAngleCache(RopeParams params);  // throws as rope_angles() does for bad params

  int pairs() const { return pairs_; }
  // cos_t / sin_t [pairs()] of position pos (>= 0), bit for bit rope_angles'; the pointers
  // stay valid for the cache's lifetime.
  void angles(int pos, const float** cos_t, const float** sin_t);

 private:
  struct Page {
    std::unique_ptr<float[]> cos, sin;  // [kPagePositions][pairs]
    std::vector<uint8_t> ready;         // [kPagePositions]
  };
  RopeParams params_;
  int pairs_ = 0;
  std::vector<Page> pages_;
};

}  // namespace hablar
