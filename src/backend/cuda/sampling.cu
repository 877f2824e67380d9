// Device sampling (see sampling.h): one block of 1024 threads per sequence. Thresholds for
// top-k and top-p are found by a bitwise search over the order-preserving integer image of
// the float values (32 counting passes over the row), so nothing is sorted.
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include <cfloat>
#include <cuda/functional>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/float_order.cuh"
#include "backend/cuda/sample_rng.h"
#include "backend/cuda/sampling.h"

namespace hablar::cuda {
namespace {

constexpr int kThreads = 1024;
using Reduce = cub::BlockReduce<float, kThreads>;
using ReduceInt = cub::BlockReduce<int, kThreads>;
using Scan = cub::BlockScan<float, kThreads>;

struct Shared {
  union {
    typename Reduce::TempStorage reduce;
    typename ReduceInt::TempStorage reduce_int;
    typename Scan::TempStorage scan;
  } temp;
  float value;
  int index;
  float prefix[kThreads + 1];
};

__device__ void apply_penalties(float* row, const SamplingParams& sp, const int32_t* hist, int len,
                                int vocab) {
  for (int i = threadIdx.x; i < len; i += kThreads) {
    const int tok = hist[i];
    if (tok < 0 || tok >= vocab) continue;
    bool first = true;
    int count = 1;
    for (int j = 0; j < len; ++j) {
      if (j == i || hist[j] != tok) continue;
      if (j < i) first = false;
      ++count;
    }
    if (!first) continue;  // each distinct token is penalized once, by its first entry
    float l = row[tok];
    if (sp.repetition_penalty != 1.0f)
      l = l > 0.0f ? l / sp.repetition_penalty : l * sp.repetition_penalty;
    l -= sp.presence_penalty + sp.frequency_penalty * (float)count;
    row[tok] = l;
  }
  __syncthreads();
}

// Refused tokens (bit clear) get -infinity: they keep no mass and never win the argmax.
__device__ void apply_mask(float* row, const uint32_t* words, int vocab) {
  for (int i = threadIdx.x; i < vocab; i += kThreads)
    if (!((words[i >> 5] >> (i & 31)) & 1u)) row[i] = -INFINITY;
  __syncthreads();
}

// Largest key t with measure(t) >= target, measure non-increasing in t: built bit by bit
// from the most significant one.
template <typename Measure>
__device__ uint32_t search_threshold(Shared& sh, float target, Measure measure) {
  uint32_t prefix = 0;
  for (int bit = 31; bit >= 0; --bit) {
    const uint32_t candidate = prefix | (1u << bit);
    const float m = Reduce(sh.temp.reduce).Sum(measure(candidate));
    if (threadIdx.x == 0) sh.value = m;
    __syncthreads();
    if (sh.value >= target) prefix = candidate;
    __syncthreads();
  }
  return prefix;
}

__global__ void __launch_bounds__(kThreads)
    sample_kernel(float* logits, int vocab, const SamplingParams* params, const int32_t* history,
                  const int32_t* history_len, int max_history, const uint32_t* allowed,
                  int mask_words, int32_t* tokens_out) {
  __shared__ Shared sh;
  const int seq = blockIdx.x;
  const SamplingParams sp = params[seq];
  float* row = logits + (size_t)seq * vocab;
  if (sp.masked && allowed) apply_mask(row, allowed + (size_t)seq * mask_words, vocab);
  if (max_history > 0)
    apply_penalties(row, sp, history + (size_t)seq * max_history,
                    min(history_len[seq], max_history), vocab);

  // Maximum (lowest index among equals).
  float best = -FLT_MAX;
  int best_i = vocab;
  for (int i = threadIdx.x; i < vocab; i += kThreads)
    if (row[i] > best) best = row[i], best_i = i;
  const float max_logit = Reduce(sh.temp.reduce).Reduce(best, ::cuda::maximum<>{});
  if (threadIdx.x == 0) sh.value = max_logit;
  __syncthreads();
  const float mx = sh.value;
  const int cand = best == mx ? best_i : vocab;
  const int argmax = ReduceInt(sh.temp.reduce_int).Reduce(cand, ::cuda::minimum<>{});
  __syncthreads();  // the reduce storage is reused below
  if (sp.temperature <= 0.0f) {
    if (threadIdx.x == 0) tokens_out[seq] = argmax < vocab ? argmax : 0;
    return;
  }
  const float inv_t = 1.0f / sp.temperature;
  // z_of: the draw's weights' exponent; zf: what the filters compare (the same, or the
  // untempered logits when the temperature comes last).
  const float filter_scale = sp.temperature_last ? 1.0f : inv_t;
  auto z_of = [&](int i) { return (row[i] - mx) * inv_t; };
  auto zf = [&](int i) { return (row[i] - mx) * filter_scale; };

  uint32_t keep = 0;  // keep tokens with float_key(z) >= keep
  if (sp.top_k > 0 && sp.top_k < vocab) {
    keep = search_threshold(sh, (float)sp.top_k, [&](uint32_t t) {
      float c = 0;
      for (int i = threadIdx.x; i < vocab; i += kThreads) c += float_key(zf(i)) >= t ? 1.f : 0.f;
      return c;
    });
  }
  const uint32_t keep_k = keep;
  auto kept_mass = [&](uint32_t t) {  // mass of the top-k survivors with key >= t
    t = max(t, keep_k);
    float s = 0;
    for (int i = threadIdx.x; i < vocab; i += kThreads) {
      const float z = zf(i);
      if (float_key(z) >= t) s += __expf(z);
    }
    return s;
  };
  if (sp.top_p < 1.0f) {
    const float total = Reduce(sh.temp.reduce).Sum(kept_mass(keep));
    if (threadIdx.x == 0) sh.value = total;
    __syncthreads();
    const float target = sp.top_p * sh.value;
    __syncthreads();  // every thread has read sh.value before the search rewrites it
    keep = max(keep_k, search_threshold(sh, target, kept_mass));
  }
  if (sp.min_p > 0.0f) keep = max(keep, float_key(logf(sp.min_p)));
  if (keep > float_key(0.0f)) keep = float_key(0.0f);  // the top token always stays

  // Draw: contiguous chunks per thread, an exclusive scan of chunk masses, one claimant.
  const int chunk = (vocab + kThreads - 1) / kThreads;
  const int begin = min(vocab, (int)threadIdx.x * chunk), end = min(vocab, begin + chunk);
  float mass = 0.0f;
  for (int i = begin; i < end; ++i)
    if (float_key(zf(i)) >= keep) mass += __expf(z_of(i));
  float excl;
  Scan(sh.temp.scan).ExclusiveSum(mass, excl);
  sh.prefix[threadIdx.x] = excl;
  __syncthreads();
  const int last = ReduceInt(sh.temp.reduce_int)
                       .Reduce(mass > 0.0f ? (int)threadIdx.x : -1, ::cuda::maximum<>{});
  if (threadIdx.x == kThreads - 1) sh.prefix[kThreads] = excl + mass;
  if (threadIdx.x == 0) sh.index = last;
  __syncthreads();
  const float target = sample_uniform(sp.seed, sp.step) * sh.prefix[kThreads];
  const bool claims = mass > 0.0f && excl <= target &&
                      (target < sh.prefix[threadIdx.x + 1] || (int)threadIdx.x == sh.index);
  if (claims) {
    float run = excl;
    int pick = -1;
    for (int i = begin; i < end; ++i) {
      if (float_key(zf(i)) < keep) continue;
      const float weight = __expf(z_of(i));
      if (weight == 0.0f) continue;  // refused (masked) or negligible: never the pick
      pick = i;
      run += weight;
      if (run > target) break;
    }
    tokens_out[seq] = pick;
  }
}

}  // namespace

void sample_tokens(float* logits, int n_seqs, int vocab, const SamplingParams* params,
                   const int32_t* history, const int32_t* history_len, int max_history,
                   const uint32_t* allowed, int mask_words, int32_t* tokens_out,
                   cudaStream_t stream) {
  if (vocab <= 0) throw_error(ErrorKind::kInvalidArgument, "sample_tokens: empty vocabulary");
  if (allowed && mask_words < token_mask_words(vocab))
    throw_error(ErrorKind::kInvalidArgument,
                "sample_tokens: token masks narrower than the vocabulary");
  if (max_history > 0 && (!history || !history_len))
    throw_error(ErrorKind::kInvalidArgument, "sample_tokens: history arrays are null");
  if (n_seqs <= 0) return;
  sample_kernel<<<n_seqs, kThreads, 0, stream>>>(logits, vocab, params, history, history_len,
                                                 max_history, allowed, mask_words, tokens_out);
  HABLAR_CUDA_CHECK_LAUNCH();
}

namespace {

__global__ void feed_sampled_tokens_kernel(const int32_t* sampled, int32_t* tokens, int n) {
  const int t = (int)(blockIdx.x * blockDim.x + threadIdx.x);
  if (t < n && tokens[t] < 0) tokens[t] = sampled[-1 - tokens[t]];
}

}  // namespace

void feed_sampled_tokens(const int32_t* sampled, int32_t* tokens, int n, cudaStream_t stream) {
  if (n <= 0) return;
  feed_sampled_tokens_kernel<<<(n + 255) / 256, 256, 0, stream>>>(sampled, tokens, n);
  HABLAR_CUDA_CHECK_LAUNCH();
}

}  // namespace hablar::cuda
