// Warming the L2 cache ahead of one-token products. A decode step of one or a few tokens
// reads each weight matrix once, in launches too short to reach the memory's bandwidth,
// while the memory idles through the norms, RoPE and attention between them. The weights of
// the products that follow the *next* norm are requested into the L2 cache by the norm
// before it (bulk prefetches issued before it waits on the kernel ahead of it), so that
// those products read them from the cache half a layer later: at the attention's norm the
// feed-forward matrices, at the feed-forward's norm the next layer's Q/K/V and output
// projection.
//
// Which matrices follow which norm comes from the model's own forward, recorded once on the
// host by WeightOrderRecorder (a ForwardBackend whose ops launch nothing): segment n holds
// the matrices read between the n-th norm of the forward and the next one, in their order.
// ForwardOps counts its norms through a step in the same order, so the n-th norm of any
// step warms segment n + 1. The bytes warmed at once are capped at a share of the device's
// L2 (l2_warming_budget); a segment above it warms the same leading share of each matrix.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/layer_spec.h"
#include "core/step_batch.h"
#include "core/tensor_view.h"

namespace hablar::cuda {

// The ranges one kernel requests into L2 (a kernel parameter: fixed size, trivially
// copyable). Starts 16-byte aligned, sizes multiples of 16 (cp.async.bulk.prefetch.L2).
struct L2Prefetch {
  static constexpr int kMaxRanges = 4;
  const char* data[kMaxRanges] = {};
  uint32_t bytes[kMaxRanges] = {};
  int n = 0;
};

struct WeightRange {
  const void* data = nullptr;
  size_t bytes = 0;
};

// The prefetch for one segment of matrices within `budget` bytes: each matrix's leading
// share (the products walk their rows in order), trimmed inward to 16-byte bounds. Matrices
// past kMaxRanges are left out.
inline L2Prefetch l2_prefetch_for(const std::vector<WeightRange>& segment, size_t budget) {
  L2Prefetch p;
  size_t total = 0;
  for (const WeightRange& r : segment) total += r.bytes;
  if (total == 0 || budget < 4096) return p;
  const double share = std::min(1.0, (double)budget / (double)total);
  for (const WeightRange& r : segment) {
    if (p.n == L2Prefetch::kMaxRanges) break;
    const auto start = reinterpret_cast<uintptr_t>(r.data);
    const uintptr_t first = (start + 15) & ~uintptr_t{15};
    const uintptr_t end = (start + (uintptr_t)((double)r.bytes * share)) & ~uintptr_t{15};
    if (end <= first || end - first > UINT32_MAX) continue;
    p.data[p.n] = reinterpret_cast<const char*>(first);
    p.bytes[p.n++] = (uint32_t)(end - first);
  }
  return p;
}

// The order in which a forward reads its matrices, by norm: a backend for model::forward
// that records and computes nothing. A forward with experts records nothing usable (their
// matrices depend on the routing): `usable()` is then false.
class WeightOrderRecorder {
 public:
  explicit WeightOrderRecorder(const Activations& a) : a_(a) { segments_.emplace_back(); }

  const std::vector<std::vector<WeightRange>>& segments() const { return segments_; }
  bool usable() const { return usable_; }

  // ---- model::ForwardBackend
  const Activations& activations() const { return a_; }
  int64_t n_tokens() const { return 1; }
  void embed(const WeightView&, float*) {}
  void rmsnorm(const float*, const float*, float*, int64_t) { segments_.emplace_back(); }
  void matmul(const WeightView& w, const float*, float*) { note(w); }
  void matmul_qkv(const WeightView& wq, const WeightView& wk, const WeightView& wv, const float*,
                  float*, float*, float*) {
    note(wq), note(wk), note(wv);
  }
  void matmul_glu(const WeightView& gate, const WeightView& up, const float*, float*, float*,
                  GluActivation) {
    note(gate), note(up);
  }
  void add_bias(float*, const float*, int64_t) {}
  void scale(float*, float, int64_t) {}
  void scale_by_position(float*, int64_t, const PositionScale&) {}
  void head_rmsnorm(float*, const float*, int) {}
  void rope(float*, int, int) {}
  void attention(int, const AttentionSpec&, const float*, const float*, const float*, float*) {}
  void add(float*, const float*, int64_t) {}
  void moe_ffn(const ExpertsView&, const float*, float*) { usable_ = false; }
  // The final norm (not one of ForwardOps' counted norms) and the output matrix: the last
  // segment, warmed by the last counted norm.
  void logits(const float*, const float*, const WeightView& output, float) {
    segments_.emplace_back();
    note(output);
  }
  void scale_logits(float) {}
  void relu_squared(float*, int64_t) {}
  const float* host_rows(const float* rows, int64_t, std::vector<float>&) { return rows; }

 private:
  void note(const WeightView& w) {
    segments_.back().push_back({w.data, (size_t)w.rows * w.row_bytes});
  }

  const Activations& a_;
  std::vector<std::vector<WeightRange>> segments_;
  bool usable_ = true;
};

}  // namespace hablar::cuda
