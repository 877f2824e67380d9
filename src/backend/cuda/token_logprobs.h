// Log-probabilities of device-sampled rows, without copying logits to the host: the sampled
// token's and the n most likely tokens', under log_softmax of the row as the model gave it
// (before the sampler's mask and penalties, which change the row in place). Two launches
// around sample_tokens (sampling.h):
//   before: for each row whose params ask (SamplingParams::n_logprobs >= 0), the row's
//     log-sum-exp (the sum in double), its top n (value descending, the lowest id among
//     equals), and the raw logits of its history's tokens, the only ones the penalties
//     change besides the masked (never sampled) ones;
//   after: the sampled token's log-probability, its raw logit read from the row or, for a
//     token of the history, from what `before` kept.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "backend/cuda/sampling.h"

namespace hablar::cuda {

inline constexpr int kMaxTopLogprobs = 20;

struct RowLogprobs {
  double lse = 0;      // log(sum(exp(logit))) over the raw row
  float chosen = 0;    // the sampled token's log-probability
  int32_t n_top = -1;  // -1: the row asked for none; else min(n_logprobs, vocab) entries
  int32_t top_ids[kMaxTopLogprobs] = {};
  float top_logprobs[kMaxTopLogprobs] = {};
};

// logits [n_rows][vocab] (device, not yet sampled); params [n_rows]; history as
// sample_tokens reads it (may be null when max_history is 0); history_raw [n_rows][max_history]
// (device scratch, may be null when max_history is 0); out [n_rows] (device). Rows whose
// params ask for none get n_top = -1; n_logprobs beyond kMaxTopLogprobs counts as that many.
void token_logprobs_before_sampling(const float* logits, int n_rows, int vocab,
                                    const SamplingParams* params, const int32_t* history,
                                    const int32_t* history_len, int max_history, float* history_raw,
                                    RowLogprobs* out, cudaStream_t stream);

// After sample_tokens wrote tokens [n_rows] from the same rows: out[r].chosen.
void token_logprobs_after_sampling(const float* logits, int n_rows, int vocab,
                                   const SamplingParams* params, const int32_t* history,
                                   const int32_t* history_len, int max_history,
                                   const float* history_raw, const int32_t* tokens,
                                   RowLogprobs* out, cudaStream_t stream);

}  // namespace hablar::cuda
