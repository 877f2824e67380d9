// The sampling chain (see sampler.h for the order and the reasons).
#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <unordered_map>

#include "core/error.h"

namespace hablar::engine {
namespace {

[[noreturn]] void bad_param(const std::string& what) {
  throw_error(ErrorKind::kInvalidArgument, "invalid sampling parameter: " + what);
}

uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint64_t rotl(uint64_t x, int k) {
  return (x << k) | (x >> (64 - k));
}

// Softmax of the candidates' logits into p (max subtracted; sum in double).
template <typename Cand>
void softmax(std::vector<Cand>& cands) {
  float max_logit = -std::numeric_limits<float>::infinity();
  for (const Cand& c : cands) max_logit = std::max(max_logit, c.logit);
  double sum = 0.0;
  for (Cand& c : cands) {
    c.p = std::exp(c.logit - max_logit);
    sum += c.p;
  }
  for (Cand& c : cands) c.p = (float)(c.p / sum);
}

template <typename Cand>
void sort_descending(std::vector<Cand>& cands) {
  std::sort(cands.begin(), cands.end(), [](const Cand& a, const Cand& b) {
    return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
  });
}

}  // namespace

void SamplingParams::validate() const {
  if (std::isnan(temperature) || temperature < 0.0f)
    bad_param("temperature must be >= 0, got " + std::to_string(temperature));
  if (std::isnan(top_p) || !(top_p > 0.0f && top_p <= 1.0f))
    bad_param("top_p must be in (0, 1], got " + std::to_string(top_p));
  if (std::isnan(min_p) || min_p < 0.0f || min_p > 1.0f)
    bad_param("min_p must be in [0, 1], got " + std::to_string(min_p));
  if (std::isnan(typical_p) || !(typical_p > 0.0f && typical_p <= 1.0f))
    bad_param("typical_p must be in (0, 1], got " + std::to_string(typical_p));
  if (!std::isfinite(repeat_penalty) || repeat_penalty <= 0.0f)
    bad_param("repeat_penalty must be > 0, got " + std::to_string(repeat_penalty));
  if (repeat_last_n < -1)
    bad_param("repeat_last_n must be >= -1, got " + std::to_string(repeat_last_n));
  if (!std::isfinite(presence_penalty)) bad_param("presence_penalty must be finite");
  if (!std::isfinite(frequency_penalty)) bad_param("frequency_penalty must be finite");
  if (n_probs < 0) bad_param("n_probs must be >= 0, got " + std::to_string(n_probs));
  if (!std::isfinite(top_n_sigma)) bad_param("top_n_sigma must be finite");
  dry.validate();
  if (mirostat < 0 || mirostat > 2)
    bad_param("mirostat must be 0 (off), 1 or 2, got " + std::to_string(mirostat));
  if (!std::isfinite(mirostat_tau) || !std::isfinite(mirostat_eta))
    bad_param("mirostat_tau and mirostat_eta must be finite");
  if (std::isnan(xtc_probability) || xtc_probability < 0.0f || xtc_probability > 1.0f)
    bad_param("xtc_probability must be in [0, 1], got " + std::to_string(xtc_probability));
  if (std::isnan(xtc_threshold) || xtc_threshold < 0.0f || xtc_threshold > 1.0f)
    bad_param("xtc_threshold must be in [0, 1], got " + std::to_string(xtc_threshold));
  for (const auto& [token, bias] : logit_bias)
    if (std::isnan(bias)) bad_param("logit_bias for token " + std::to_string(token) + " is NaN");
}

SamplingParams SamplingParams::greedy() {
  SamplingParams p;
  p.temperature = 0.0f;
  return p;
}

Rng::Rng(uint64_t seed) {
  uint64_t state = seed;
  for (uint64_t& s : s_) s = splitmix64(state);
}

uint64_t Rng::next() {
  const uint64_t result = rotl(s_[1] * 5, 7) * 9;
  const uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = rotl(s_[3], 45);
  return result;
}

double Rng::uniform() {
  return (double)(next() >> 11) * 0x1.0p-53;
}

Sampler::Sampler(SamplingParams params, int32_t n_vocab)
    : params_(std::move(params)),
      n_vocab_(n_vocab),
      rng_(params_.seed),
      mirostat_mu_(2.0f * params_.mirostat_tau) {
  params_.validate();
  if (n_vocab <= 0) bad_param("vocabulary size must be > 0");
  for (const auto& [token, bias] : params_.logit_bias)
    if (token < 0 || token >= n_vocab)
      bad_param("logit_bias token " + std::to_string(token) + " is outside the vocabulary of " +
                std::to_string(n_vocab));
}

void Sampler::accept(int32_t token) {
  history_.push_back(token);
}
void Sampler::accept(std::span<const int32_t> tokens) {
  history_.insert(history_.end(), tokens.begin(), tokens.end());
}
void Sampler::reset_history() {
  history_.clear();
}
void Sampler::rewind_history(size_t n) {
  if (n < history_.size()) history_.resize(n);
}

// llama.cpp's rule: a repeated token's logit is divided by the penalty when positive and
// multiplied when negative; then count * frequency + (count > 0) * presence is subtracted.
void Sampler::apply_penalties(std::vector<Candidate>& cands) const {
  const SamplingParams& p = params_;
  if (p.repeat_last_n == 0 || history_.empty()) return;
  if (p.repeat_penalty == 1.0f && p.presence_penalty == 0.0f && p.frequency_penalty == 0.0f) return;
  const size_t window =
      p.repeat_last_n < 0 ? history_.size() : std::min(history_.size(), (size_t)p.repeat_last_n);
  std::unordered_map<int32_t, int> counts;
  for (size_t i = history_.size() - window; i < history_.size(); ++i) ++counts[history_[i]];
  for (const auto& [token, count] : counts) {
    if (token < 0 || token >= n_vocab_) continue;
    float& logit = cands[(size_t)token].logit;  // candidates are still indexed by id here
    logit = logit <= 0.0f ? logit * p.repeat_penalty : logit / p.repeat_penalty;
    logit -= (float)count * p.frequency_penalty + p.presence_penalty;
  }
}

namespace {

// Top-n-sigma: the candidates whose logit is within n population standard deviations of the
// largest (llama.cpp's top_n_sigma).
void keep_within_sigmas(std::vector<Sampler::Candidate>& cands, float n_sigma) {
  double sum = 0.0, best = -std::numeric_limits<double>::infinity();
  for (const auto& c : cands) {
    sum += c.logit;
    best = std::max(best, (double)c.logit);
  }
  const double mean = sum / (double)cands.size();
  double acc = 0.0;
  for (const auto& c : cands) acc += ((double)c.logit - mean) * ((double)c.logit - mean);
  const double threshold = best - n_sigma * std::sqrt(acc / (double)cands.size());
  std::erase_if(cands, [&](const auto& c) { return (double)c.logit < threshold; });
}

// XTC ("exclude top choices"), on candidates sorted most likely first with probabilities:
// every token at least `threshold` likely except the least likely of them is dropped.
void exclude_top_choices(std::vector<Sampler::Candidate>& cands, float threshold) {
  size_t last_above = 0;
  while (last_above + 1 < cands.size() && cands[last_above + 1].p >= threshold) ++last_above;
  if (last_above > 0 && cands.front().p >= threshold)
    cands.erase(cands.begin(), cands.begin() + (ptrdiff_t)last_above);
}

}  // namespace

int32_t Sampler::draw(std::vector<Candidate>& cands) {
  const SamplingParams& p = params_;
  if (p.top_n_sigma > 0.0f && cands.size() > 1) keep_within_sigmas(cands, p.top_n_sigma);
  // Top-k: the k largest logits, sorted.
  if (p.top_k > 0 && (size_t)p.top_k < cands.size()) {
    auto greater = [](const Candidate& a, const Candidate& b) {
      return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
    };
    std::nth_element(cands.begin(), cands.begin() + p.top_k, cands.end(), greater);
    cands.resize((size_t)p.top_k);
  }
  sort_descending(cands);
  // Typical-p: keep the tokens whose surprise is closest to the entropy, up to mass p.
  if (p.typical_p < 1.0f && cands.size() > 1) {
    softmax(cands);
    double entropy = 0.0;
    for (const Candidate& c : cands)
      if (c.p > 0.0f) entropy -= c.p * std::log(c.p);
    std::vector<std::pair<double, size_t>> shifted;
    for (size_t i = 0; i < cands.size(); ++i)
      shifted.push_back({std::abs(-std::log((double)cands[i].p) - entropy), i});
    std::stable_sort(shifted.begin(), shifted.end(),
                     [](const auto& a, const auto& b) { return a.first < b.first; });
    std::vector<Candidate> kept;
    double cum = 0.0;
    for (const auto& [score, i] : shifted) {
      kept.push_back(cands[i]);
      cum += cands[i].p;
      if (cum >= p.typical_p) break;
    }
    cands = std::move(kept);
    sort_descending(cands);
  }
  // Top-p: the smallest prefix (by probability) whose mass reaches p.
  if (p.top_p < 1.0f && cands.size() > 1) {
    softmax(cands);
    double cum = 0.0;
    size_t keep = cands.size();
    for (size_t i = 0; i < cands.size(); ++i) {
      cum += cands[i].p;
      if (cum >= p.top_p) {
        keep = i + 1;
        break;
      }
    }
    cands.resize(keep);
  }
  // Min-p: tokens at least min_p times as likely as the best one.
  if (p.min_p > 0.0f && cands.size() > 1) {
    const float threshold = cands.front().logit + std::log(p.min_p);
    size_t keep = 1;
    while (keep < cands.size() && cands[keep].logit >= threshold) ++keep;
    cands.resize(keep);
  }
  // XTC draws its own chance first (only when on, so other requests' draws are unchanged).
  if (p.xtc_probability > 0.0f && p.xtc_threshold <= 0.5f && cands.size() > 1 &&
      rng_.uniform() < p.xtc_probability) {
    softmax(cands);
    exclude_top_choices(cands, p.xtc_threshold);
  }
  for (Candidate& c : cands) c.logit /= p.temperature;
  softmax(cands);
  const double u = rng_.uniform();
  double cum = 0.0;
  for (const Candidate& c : cands) {
    cum += c.p;
    if (u < cum) return c.id;
  }
  return cands.back().id;
}

// Mirostat, after temperature, on candidates sorted with probabilities. Version 2 keeps the
// tokens whose surprise (-log2 p) is at most mu; version 1 keeps the top k, k estimated from
// the Zipf exponent of the 100 most likely tokens so that the expected surprise is mu. The
// drawn token's surprise then moves mu towards tau.
int32_t Sampler::draw_mirostat(std::vector<Candidate>& cands) {
  const SamplingParams& p = params_;
  for (Candidate& c : cands) c.logit /= p.temperature;
  sort_descending(cands);
  softmax(cands);
  size_t keep = cands.size();
  if (p.mirostat == 2) {
    keep = 0;
    while (keep < cands.size() && -std::log2(cands[keep].p) <= mirostat_mu_) ++keep;
  } else {
    constexpr size_t kZipfTokens = 100;
    double sum_tb = 0.0, sum_tt = 0.0;
    for (size_t i = 0; i + 1 < kZipfTokens && i + 1 < cands.size(); ++i) {
      const double t = std::log((double)(i + 2) / (double)(i + 1));
      sum_tb += t * std::log((double)cands[i].p / (double)cands[i + 1].p);
      sum_tt += t * t;
    }
    const double s_hat = sum_tb / sum_tt, epsilon = s_hat - 1.0;
    const double k = std::pow(epsilon * std::pow(2.0, (double)mirostat_mu_) /
                                  (1.0 - std::pow((double)n_vocab_, -epsilon)),
                              1.0 / s_hat);
    keep = std::isfinite(k) && k >= 1.0 ? (size_t)std::min(k, (double)cands.size()) : 1;
  }
  cands.resize(std::max<size_t>(keep, 1));
  softmax(cands);
  const double u = rng_.uniform();
  double cum = 0.0;
  size_t chosen = cands.size() - 1;
  for (size_t i = 0; i < cands.size(); ++i) {
    cum += cands[i].p;
    if (u < cum) {
      chosen = i;
      break;
    }
  }
  mirostat_mu_ -= p.mirostat_eta * (-std::log2(cands[chosen].p) - p.mirostat_tau);
  return cands[chosen].id;
}

SampleResult Sampler::sample(std::span<const float> logits) {
  if ((int64_t)logits.size() != n_vocab_)
    throw_error(ErrorKind::kInvalidArgument, "logits row has " + std::to_string(logits.size()) +
                                                 " values, vocabulary " + std::to_string(n_vocab_));
  cands_.resize((size_t)n_vocab_);
  for (int32_t i = 0; i < n_vocab_; ++i) cands_[(size_t)i] = {i, logits[(size_t)i], 0.0f};
  for (const auto& [token, bias] : params_.logit_bias) cands_[(size_t)token].logit += bias;
  const bool mirostat = params_.mirostat > 0 && params_.temperature > 0.0f;
  if (!mirostat) apply_penalties(cands_);
  if (params_.dry.on() && !mirostat)  // candidates are still indexed by id here
    for (const auto& [token, penalty] : dry_penalties(params_.dry, history_))
      if (token >= 0 && token < n_vocab_) cands_[(size_t)token].logit -= penalty;

  SampleResult result;
  if (params_.temperature == 0.0f) {
    int32_t best = 0;
    for (int32_t i = 1; i < n_vocab_; ++i)
      if (cands_[(size_t)i].logit > cands_[(size_t)best].logit) best = i;
    result.token = best;
    if (n_post_ > 0) {
      result.post_prob = 1.0f;
      result.post_top = {{best, 1.0f}};
    }
  } else {
    // Banned tokens (-inf) never reach the draw.
    std::erase_if(cands_, [](const Candidate& c) { return std::isinf(c.logit) && c.logit < 0; });
    if (cands_.empty()) throw_error(ErrorKind::kInvalidArgument, "logit_bias banned every token");
    result.token = mirostat ? draw_mirostat(cands_) : draw(cands_);
    if (n_post_ > 0) report_candidates(result);
  }

  // Log-probabilities only when asked for: a softmax over the whole vocabulary in double
  // costs about as much as a speculative verification row's sampling otherwise.
  if (params_.n_probs <= 0) return result;
  float max_logit = -std::numeric_limits<float>::infinity();
  for (float l : logits) max_logit = std::max(max_logit, l);
  double sum = 0.0;
  for (float l : logits) sum += std::exp((double)(l - max_logit));
  const float lse = max_logit + (float)std::log(sum);
  result.logprob = logits[(size_t)result.token] - lse;
  result.top = top_logprobs(logits, params_.n_probs);
  return result;
}

// After draw(), cands_ holds the chain's survivors, most likely first, with the
// probabilities (after temperature) the draw used.
void Sampler::report_candidates(SampleResult& result) const {
  for (const Candidate& c : cands_)
    if (c.id == result.token) result.post_prob = c.p;
  const size_t n = std::min(cands_.size(), (size_t)n_post_);
  for (size_t i = 0; i < n && cands_[i].p > 0.0f; ++i)
    result.post_top.push_back({cands_[i].id, cands_[i].p});
}

double log_sum_exp(std::span<const float> logits) {
  float max_logit = -std::numeric_limits<float>::infinity();
  for (float l : logits) max_logit = std::max(max_logit, l);
  double sum = 0.0;
  for (float l : logits) sum += std::exp((double)(l - max_logit));
  return (double)max_logit + std::log(sum);
}

void log_softmax(std::span<const float> logits, std::span<float> out) {
  HABLAR_CHECK(out.size() == logits.size(), "log_softmax output size");
  const double lse = log_sum_exp(logits);
  for (size_t i = 0; i < logits.size(); ++i) out[i] = (float)((double)logits[i] - lse);
}

std::vector<TokenLogprob> top_logprobs(std::span<const float> logits, int n) {
  return top_logprobs(logits, n, log_sum_exp(logits));
}

std::vector<TokenLogprob> top_logprobs(std::span<const float> logits, int n, double lse) {
  n = std::min<int>(n, (int)logits.size());
  if (n <= 0) return {};
  auto better = [&](int32_t a, int32_t b) {
    return logits[(size_t)a] > logits[(size_t)b] ||
           (logits[(size_t)a] == logits[(size_t)b] && a < b);
  };
  // One pass keeping the best n ids in order (insertions are rare after the first few).
  std::vector<int32_t> best;
  best.reserve((size_t)n + 1);
  for (int32_t i = 0; i < (int32_t)logits.size(); ++i) {
    if ((int)best.size() == n && !better(i, best.back())) continue;
    best.insert(std::upper_bound(best.begin(), best.end(), i, better), i);
    if ((int)best.size() > n) best.pop_back();
  }
  std::vector<TokenLogprob> out((size_t)n);
  for (int i = 0; i < n; ++i)
    out[(size_t)i] = {best[(size_t)i], (float)((double)logits[(size_t)best[(size_t)i]] - lse)};
  return out;
}

int32_t argmax(std::span<const float> logits) {
  HABLAR_CHECK(!logits.empty(), "argmax of an empty row");
  size_t best = 0;
  for (size_t i = 1; i < logits.size(); ++i)
    if (logits[i] > logits[best]) best = i;
  return (int32_t)best;
}

}  // namespace hablar::engine
