// Log-probabilities of device-sampled rows (token_logprobs.h). One block of 256 threads per
// row: each thread keeps its own top kMaxTopLogprobs of a strided share of the row in
// registers (a sorted list, insertion from the back), then the block takes the best head of
// all lists n times (a 64-bit key: the value's order-preserving image, then the lowest id).
#include <cub/block/block_reduce.cuh>

#include <cfloat>
#include <climits>
#include <cuda/functional>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/float_order.cuh"
#include "backend/cuda/token_logprobs.h"
#include "core/error.h"

namespace hablar::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int K = kMaxTopLogprobs;

// a before b: a larger value, or the lower id among equal values.
__device__ __forceinline__ bool ranks_before(float a, int ia, float b, int ib) {
  return a > b || (a == b && ia < ib);
}

// Order-preserving key of (value, id): larger for a larger value, then for a lower id.
__device__ __forceinline__ unsigned long long rank_key(float f, int id) {
  return ((unsigned long long)float_key(f) << 32) | (uint32_t) ~(uint32_t)id;
}

__global__ void __launch_bounds__(kThreads)
    logprobs_before_kernel(const float* logits, int vocab, const SamplingParams* params,
                           const int32_t* history, const int32_t* history_len, int max_history,
                           float* history_raw, RowLogprobs* out) {
  using KeyReduce = cub::BlockReduce<unsigned long long, kThreads>;
  using SumReduce = cub::BlockReduce<double, kThreads>;
  __shared__ union {
    typename KeyReduce::TempStorage key;
    typename SumReduce::TempStorage sum;
  } temp;
  __shared__ unsigned long long best_key;
  __shared__ float top_value[K];
  __shared__ int top_id[K];
  const int r = blockIdx.x;
  const int asked = params[r].n_logprobs;
  if (asked < 0) {
    if (threadIdx.x == 0) out[r].n_top = -1;
    return;
  }
  const float* row = logits + (size_t)r * vocab;
  // The history's raw logits, before the sampler's penalties change them.
  if (max_history > 0) {
    const int len = min(history_len[r], max_history);
    for (int i = threadIdx.x; i < len; i += kThreads) {
      const int tok = history[(size_t)r * max_history + i];
      history_raw[(size_t)r * max_history + i] = tok >= 0 && tok < vocab ? row[tok] : 0.0f;
    }
  }
  // This thread's top K of its share, best first (registers: every index is static).
  float v[K];
  int id[K];
#pragma unroll
  for (int k = 0; k < K; ++k) v[k] = -INFINITY, id[k] = INT_MAX;
  for (int i = threadIdx.x; i < vocab; i += kThreads) {
    const float x = row[i];
    if (!ranks_before(x, i, v[K - 1], id[K - 1])) continue;
    v[K - 1] = x, id[K - 1] = i;
#pragma unroll
    for (int k = K - 1; k > 0; --k)
      if (ranks_before(v[k], id[k], v[k - 1], id[k - 1])) {
        const float tv = v[k];
        const int ti = id[k];
        v[k] = v[k - 1], id[k] = id[k - 1];
        v[k - 1] = tv, id[k - 1] = ti;
      }
  }
  // The block's best n heads, one at a time (at least the first: the maximum).
  const int n_top = min(min(asked, K), vocab);
  for (int t = 0; t < max(n_top, 1); ++t) {
    const unsigned long long head = rank_key(v[0], id[0]);
    const unsigned long long best = KeyReduce(temp.key).Reduce(head, ::cuda::maximum<>{});
    if (threadIdx.x == 0) best_key = best;
    __syncthreads();
    if (head == best_key) {  // ids are unique: one thread holds it
      top_value[t] = v[0], top_id[t] = id[0];
#pragma unroll
      for (int k = 0; k + 1 < K; ++k) v[k] = v[k + 1], id[k] = id[k + 1];
      v[K - 1] = -INFINITY, id[K - 1] = INT_MAX;
    }
    __syncthreads();
  }
  const float max_logit = top_value[0];
  double sum = 0.0;
  for (int i = threadIdx.x; i < vocab; i += kThreads) sum += (double)expf(row[i] - max_logit);
  const double total = SumReduce(temp.sum).Sum(sum);
  if (threadIdx.x == 0) {
    const double lse = (double)max_logit + log(total);
    RowLogprobs& o = out[r];
    o.lse = lse;
    o.n_top = n_top;
    for (int t = 0; t < n_top; ++t) {
      o.top_ids[t] = top_id[t];
      o.top_logprobs[t] = (float)((double)top_value[t] - lse);
    }
  }
}

__global__ void logprobs_after_kernel(const float* logits, int n_rows, int vocab,
                                      const SamplingParams* params, const int32_t* history,
                                      const int32_t* history_len, int max_history,
                                      const float* history_raw, const int32_t* tokens,
                                      RowLogprobs* out) {
  const int r = (int)(blockIdx.x * blockDim.x + threadIdx.x);
  if (r >= n_rows || params[r].n_logprobs < 0) return;
  const int tok = tokens[r];
  if (tok < 0 || tok >= vocab) {
    out[r].chosen = NAN;
    return;
  }
  float raw = logits[(size_t)r * vocab + tok];  // untouched unless the penalties saw it
  const int len = max_history > 0 ? min(history_len[r], max_history) : 0;
  for (int i = 0; i < len; ++i)
    if (history[(size_t)r * max_history + i] == tok) {
      raw = history_raw[(size_t)r * max_history + i];
      break;
    }
  out[r].chosen = (float)((double)raw - out[r].lse);
}

void check_history(int max_history, const int32_t* history, const int32_t* history_len,
                   const float* history_raw) {
  if (max_history > 0 && (!history || !history_len || !history_raw))
    throw_error(ErrorKind::kInvalidArgument, "token_logprobs: history arrays are null");
}

}  // namespace

void token_logprobs_before_sampling(const float* logits, int n_rows, int vocab,
                                    const SamplingParams* params, const int32_t* history,
                                    const int32_t* history_len, int max_history, float* history_raw,
                                    RowLogprobs* out, cudaStream_t stream) {
  if (vocab <= 0) throw_error(ErrorKind::kInvalidArgument, "token_logprobs: empty vocabulary");
  check_history(max_history, history, history_len, history_raw);
  if (n_rows <= 0) return;
  logprobs_before_kernel<<<n_rows, kThreads, 0, stream>>>(
      logits, vocab, params, history, history_len, max_history, history_raw, out);
  HABLAR_CUDA_CHECK_LAUNCH();
}

void token_logprobs_after_sampling(const float* logits, int n_rows, int vocab,
                                   const SamplingParams* params, const int32_t* history,
                                   const int32_t* history_len, int max_history,
                                   const float* history_raw, const int32_t* tokens,
                                   RowLogprobs* out, cudaStream_t stream) {
  check_history(max_history, history, history_len, history_raw);
  if (n_rows <= 0) return;
  logprobs_after_kernel<<<(n_rows + 127) / 128, 128, 0, stream>>>(
      logits, n_rows, vocab, params, history, history_len, max_history, history_raw, tokens, out);
  HABLAR_CUDA_CHECK_LAUNCH();
}

}  // namespace hablar::cuda
