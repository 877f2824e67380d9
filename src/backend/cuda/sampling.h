// Device-side sampling: one token per sequence from its logits row, without copying logits
// to the host. Per sequence, in this order:
//   0. a token mask (a grammar's): the logits of tokens whose bit is clear become -infinity;
//   1. penalties over its token history (each distinct token once): repetition (logit / r
//      if positive, * r if not), presence (- p), frequency (- f * count); in place;
//   2. temperature <= 0: greedy (argmax, lowest index on ties) and stop;
//   3. z = (logit - max) / temperature;
//   4. top-k (k > 0): keep z >= the k-th largest z (ties at the boundary kept);
//   5. top-p (< 1): of what is kept, keep the highest z whose probability mass reaches p
//      (ties at the boundary kept);
//   6. min-p (> 0): keep z >= ln(min_p), i.e. prob >= min_p * the top prob;
//   7. draw u = sample_uniform(seed, step) and pick, in token-id order, the kept token where
//      the running sum of exp(z) passes u * (sum of kept exp(z)).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace hablar::cuda {

struct SamplingParams {
  float temperature = 1.0f;         // <= 0: greedy
  int32_t top_k = 0;                // <= 0: off
  float top_p = 1.0f;               // >= 1: off
  float min_p = 0.0f;               // <= 0: off
  float repetition_penalty = 1.0f;  // 1: off
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  uint64_t seed = 0;
  uint64_t step = 0;  // the draw's counter (e.g. the number of tokens generated so far)
  // Temperature after the filters (llama.cpp's chain, the engine's host sampler): top-k,
  // top-p and min-p see z = logit - max; the draw is from exp(z / temperature) over what
  // they keep. False: steps 3-7 as listed above.
  bool temperature_last = false;
  // Whether the sequence's row of `allowed` (sample_tokens) limits the tokens: step 0.
  bool masked = false;
  // >= 0: token_logprobs_before_sampling / _after_sampling report the row's log-probabilities
  // (token_logprobs.h); sample_tokens ignores it.
  int32_t n_logprobs = -1;
};

// logits [n_seqs][vocab] (device, penalized in place); params [n_seqs] (device);
// history [n_seqs][max_history] token ids of which the first history_len[s] count (device,
// may be null when max_history is 0); allowed [n_seqs][mask_words] bit sets over the
// vocabulary (bit t % 32 of word t / 32), read for the sequences whose params say `masked`
// (device, may be null when none does); tokens_out [n_seqs] (device). A masked sequence must
// allow at least one token.
void sample_tokens(float* logits, int n_seqs, int vocab, const SamplingParams* params,
                   const int32_t* history, const int32_t* history_len, int max_history,
                   const uint32_t* allowed, int mask_words, int32_t* tokens_out,
                   cudaStream_t stream);

// A step's token ids (device, [n]) where some are fed from the step before: an id -1 - r
// becomes sampled[r], the id that step sampled in row r (device); the others stay.
void feed_sampled_tokens(const int32_t* sampled, int32_t* tokens, int n, cudaStream_t stream);

// Words of a vocabulary's token mask: one bit per token.
inline int token_mask_words(int vocab) {
  return (vocab + 31) / 32;
}

}  // namespace hablar::cuda
