// Token sampling: turns one row of logits into the next token, per request.
//
// The chain, in order (as llama.cpp orders its default chain):
//   logit bias -> repetition / presence / frequency penalties over the last n tokens
//   -> greedy if temperature == 0, else: top-k -> typical-p -> top-p -> min-p
//   -> temperature -> draw with the request's own seeded RNG.
// Same seed and same logits give the same tokens, whatever else runs in the process.
// Log-probabilities (the chosen token's and the top n) are those of the model's raw
// distribution, log_softmax(logits), before any sampling transform, as OpenAI reports them.
// On request (keep_candidates), a sample also reports the distribution after the chain: the
// tokens still candidates with the probabilities the draw used (llama-server's
// post_sampling_probs).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "engine/dry_penalty.h"

namespace hablar::engine {

struct SamplingParams {
  float temperature = 0.8f;        // 0 = greedy (argmax after bias and penalties)
  int top_k = 40;                  // <= 0: off
  float top_p = 0.95f;             // (0, 1]; 1 = off
  float min_p = 0.05f;             // [0, 1]; 0 = off
  float typical_p = 1.0f;          // (0, 1]; 1 = off
  float repeat_penalty = 1.0f;     // > 0; 1 = off (llama.cpp's divide/multiply rule)
  int repeat_last_n = 64;          // window of past tokens the penalties see; -1 = all, 0 = off
  float presence_penalty = 0.0f;   // subtracted once from each token present in the window
  float frequency_penalty = 0.0f;  // subtracted per occurrence in the window
  float top_n_sigma = -1.0f;       // <= 0: off; keeps logits within n standard deviations of
                                   // the best (over the candidates), before top-k
  float xtc_probability = 0.0f;    // [0, 1]; 0 = off. "Exclude top choices": with this chance,
  DryParams dry;                   // DRY repetition penalty (off unless dry.multiplier > 0)
  // Mirostat (1 or 2; 0 = off) replaces the chain after the logit bias, as in llama.cpp: no
  // penalties, DRY, top-k/p, min-p, typical-p or XTC; temperature, then a truncation that
  // steers each token's surprise (-log2 p) towards tau, learning at rate eta.
  int mirostat = 0;
  float mirostat_tau = 5.0f;
  float mirostat_eta = 0.1f;
  float xtc_threshold = 0.1f;  // the tokens at least this likely (all but the least likely
                               // of them) are dropped, after min-p; above 0.5: off
  std::vector<std::pair<int32_t, float>> logit_bias;  // added to a token's logit (-inf bans)
  uint64_t seed = 0xC0FFEEull;                        // per request
  int n_probs = 0;  // top-n log-probabilities to report per token (0 = none, nor the token's own)

  // Throws Error(kInvalidArgument) naming the bad parameter: NaN or negative temperature,
  // top_p outside (0, 1], min_p outside [0, 1], typical_p outside (0, 1], repeat_penalty <= 0,
  // repeat_last_n < -1, n_probs < 0, non-finite penalties. Bias token ids are checked
  // against n_vocab by the Sampler.
  void validate() const;
  // The llama.cpp defaults with greedy decoding (temperature 0).
  static SamplingParams greedy();
};

struct TokenLogprob {
  int32_t token = -1;
  float logprob = 0.0f;
};

struct TokenProb {
  int32_t token = -1;
  float prob = 0.0f;
};

struct SampleResult {
  int32_t token = -1;
  float logprob = 0.0f;           // of `token` under log_softmax(raw logits) (n_probs > 0)
  std::vector<TokenLogprob> top;  // n_probs best, most likely first (empty if n_probs == 0)
  // With keep_candidates(n): `token`'s probability after the chain, and the n most likely
  // remaining candidates (most likely first; zero-probability ones left out). Greedy
  // decoding keeps one candidate, the chosen token, with probability 1.
  float post_prob = 0.0f;
  std::vector<TokenProb> post_top;
};

// Small, fast, seedable generator (xoshiro256**), identical on every platform.
class Rng {
 public:
  explicit Rng(uint64_t seed);
  uint64_t next();
  double uniform();  // [0, 1), 53 random bits

 private:
  uint64_t s_[4];
};

class Sampler {
 public:
  // Validates the params (Error on a bad one, incl. a bias token outside [0, n_vocab)).
  Sampler(SamplingParams params, int32_t n_vocab);

  // Adds a token to the history the penalties look at (callers usually accept the prompt
  // tokens, then every generated token).
  void accept(int32_t token);
  void accept(std::span<const int32_t> tokens);
  void reset_history();
  // Forgets all but the first n tokens of the history (a speculative step's rejected drafts).
  void rewind_history(size_t n);
  const std::vector<int32_t>& history() const { return history_; }

  // Samples from one logits row of n_vocab values (not modified). Does not accept the token.
  SampleResult sample(std::span<const float> logits);
  // Reports the post-chain distribution (SampleResult::post_prob, post_top) from now on:
  // n > 0 candidates at most; 0 turns it off.
  void keep_candidates(int n) { n_post_ = n; }

  const SamplingParams& params() const { return params_; }

  // One token of the chain: its logit, and its probability where a stage computed one.
  struct Candidate {
    int32_t id;
    float logit;
    float p;
  };

 private:
  void apply_penalties(std::vector<Candidate>& cands) const;
  int32_t draw(std::vector<Candidate>& cands);
  int32_t draw_mirostat(std::vector<Candidate>& cands);
  void report_candidates(SampleResult& result) const;

  SamplingParams params_;
  int32_t n_vocab_;
  Rng rng_;
  std::vector<int32_t> history_;
  std::vector<Candidate> cands_;  // reused between calls
  int n_post_ = 0;                // keep_candidates
  float mirostat_mu_;             // the surprise bound mirostat steers (2 tau at first)
};

// log(sum(exp(logit))) of a row, numerically stable (max subtracted, sum in double).
double log_sum_exp(std::span<const float> logits);
// log_softmax of a logits row into out (same size): logit - log_sum_exp, rounded to float.
void log_softmax(std::span<const float> logits, std::span<float> out);
// The n largest logits, most likely first (the lowest id among equals), with their
// log-probabilities; `lse` the row's log_sum_exp when the caller has it.
std::vector<TokenLogprob> top_logprobs(std::span<const float> logits, int n);
std::vector<TokenLogprob> top_logprobs(std::span<const float> logits, int n, double lse);
// Index of the largest logit (the lowest index among equals).
int32_t argmax(std::span<const float> logits);

}  // namespace hablar::engine
