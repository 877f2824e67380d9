// The persistent decode step's device side (persistent_step.h): the phase list uploaded once,
// its workspace, and the one launch a step takes (capturable in a CUDA graph).
#pragma once

#include <cuda_runtime_api.h>

#include <span>
#include <string>

#include "backend/cuda/device_memory.h"
#include "backend/cuda/persistent_step.h"
#include "core/tensor_view.h"

namespace hablar::cuda {

// How the persistent kernel runs w (persistent_step_plan.h's PersistentMatrixRule): Q4_K
// (up to 4 chunks of 64 values per thread of its team, 2 in the gated pair) or Q6_K (a
// warp's rows within kPersistentQ6kSlotBytes), K up to kPersistentMaxWidth.
bool persistent_matrix_rule(const WeightView& w, int matrices, PersistentMatrix* out);
// Whether the kernel takes these shapes (head size 64 or 128, at most kPersistentMaxGroup
// query heads per KV head, an F16 cache, widths in whole blocks of 32); why not otherwise.
bool persistent_shapes_supported(const PersistentStepContext& ctx, std::string* why);

// A phase's kind for profiles: "qkv", "attention", "o", "gate-up", "down", "logits", ...
std::string persistent_phase_name(const PersistentPhase& p);

class PersistentStepRunner {
 public:
  // Whether this device holds the kernel's grid resident (one block per multiprocessor, with
  // about 212 KB of shared memory each); why not otherwise.
  static bool device_can_run(std::string* why);
  PersistentStepRunner(std::span<const PersistentPhase> phases, const PersistentStepContext& ctx);
  ~PersistentStepRunner();
  PersistentStepRunner(const PersistentStepRunner&) = delete;
  PersistentStepRunner& operator=(const PersistentStepRunner&) = delete;
  // The whole phase list in one launch on `stream`, after the work queued before it;
  // `stamps` (device, [phases() + 1][4], zeroed) given: per phase the times (ns,
  // %globaltimer) block 0 began it and ended its prologue, and the last block ended its
  // share; [phases()][0] the end (for benches and tests).
  void launch(cudaStream_t stream, unsigned long long* stamps = nullptr) const;
  int phases() const { return n_phases_; }

 private:
  PersistentStepContext ctx_;
  int n_phases_ = 0;
  int blocks_ = 0;
  DeviceMemory phases_, codes_, partials_, counters_;
};

}  // namespace hablar::cuda
