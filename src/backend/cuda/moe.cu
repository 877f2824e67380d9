// The mixture-of-experts kernels (moe.h): thin launches around moe_routing.cuh.
#include "backend/cuda/moe.h"

#include <algorithm>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/moe_routing.cuh"
#include "core/error.h"

namespace hablar::cuda::moe {
namespace mr = hablar::moe_routing;
namespace {

// The expf table travels by value in each launch (256 bytes), so captured graphs hold it.
const mr::ExpTable& exp_table() {
  static const mr::ExpTable table = mr::libc_expf_table();
  return table;
}

__global__ void route_kernel(float* logits, int64_t T, int E, int K, bool normalize,
                             int32_t* chosen, float* weights, mr::ExpTable table) {
  const int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= T) return;
  float* row = logits + t * E;
  mr::softmax_row(row, row, E, table);
  mr::route_token(row, E, K, normalize, chosen + t * K, weights + t * K);
}

// One block; thread i handles experts i, i + blockDim, ...; counts in shared memory [E + 1].
__global__ void group_kernel(const int32_t* __restrict__ chosen, int64_t N, int E, int32_t* offsets,
                             int32_t* order, int32_t* position, int32_t* active, int n_active) {
  extern __shared__ int32_t at[];  // [E + 1]: counts, then offsets
  for (int e = threadIdx.x; e < E; e += blockDim.x)
    at[e + 1] = (int32_t)mr::expert_slots(chosen, N, e, nullptr);
  __syncthreads();
  if (threadIdx.x == 0) {
    at[0] = 0;
    for (int e = 0; e < E; ++e) at[e + 1] += at[e];
    if (active != nullptr) mr::active_experts(at, E, active, n_active);
  }
  __syncthreads();
  for (int e = threadIdx.x; e <= E; e += blockDim.x) offsets[e] = at[e];
  for (int e = threadIdx.x; e < E; e += blockDim.x) {
    const int64_t n = mr::expert_slots(chosen, N, e, order + at[e]);
    for (int64_t r = at[e]; r < at[e] + n; ++r) position[order[r]] = (int32_t)r;
  }
}

__global__ void gather_kernel(const float* __restrict__ in, const int32_t* __restrict__ order,
                              int K, int64_t width, float* rows) {
  const float* src = in + (int64_t)(order[blockIdx.x] / K) * width;
  float* dst = rows + (int64_t)blockIdx.x * width;
  for (int64_t i = threadIdx.x; i < width; i += blockDim.x) dst[i] = src[i];
}

__global__ void f16_expert_kernel(const uint8_t* __restrict__ w, size_t row_bytes, int64_t n_rows,
                                  int64_t cols, const float* __restrict__ x, float* y) {
  const int64_t r = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= n_rows) return;
  const int64_t t = blockIdx.y;
  y[t * n_rows + r] =
      mr::f16_expert_dot(reinterpret_cast<const uint16_t*>(w + r * row_bytes), x + t * cols, cols);
}

__global__ void combine_kernel(const float* __restrict__ sorted,
                               const int32_t* __restrict__ position,
                               const float* __restrict__ weights, int K, int64_t width,
                               const float* __restrict__ shared,
                               const float* __restrict__ gate_logits, float* out,
                               mr::ExpTable table) {
  const int64_t d = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (d >= width) return;
  const int64_t t = blockIdx.y;
  const float* rows[mr::kMaxExpertsUsed];
  for (int j = 0; j < K; ++j) rows[j] = sorted + (int64_t)position[t * K + j] * width;
  const bool with_shared = shared != nullptr;
  out[t * width + d] = mr::combine_value(rows, weights + t * K, K, d, with_shared,
                                         with_shared ? shared[t * width + d] : 0.0f,
                                         with_shared ? gate_logits[t] : 0.0f, table);
}

unsigned blocks_for(int64_t n, int per_block) {
  return (unsigned)((n + per_block - 1) / per_block);
}

}  // namespace

void route(float* logits, int64_t T, int E, int K, bool normalize, int32_t* chosen, float* weights,
           cudaStream_t stream) {
  HABLAR_CHECK(K >= 1 && K <= mr::kMaxExpertsUsed && K <= E, "moe::route: bad expert counts");
  if (T == 0) return;
  route_kernel<<<blocks_for(T, 64), 64, 0, stream>>>(logits, T, E, K, normalize, chosen, weights,
                                                     exp_table());
  HABLAR_CUDA_CHECK_LAUNCH();
}

void group(const int32_t* chosen, int64_t N, int E, int32_t* offsets, int32_t* order,
           int32_t* position, cudaStream_t stream, int32_t* active) {
  HABLAR_CHECK(E >= 1 && E < 12 * 1024, "moe::group: 1 to 12287 experts (shared memory)");
  const int threads = std::min(E, 1024);
  group_kernel<<<1, threads, (size_t)(E + 1) * sizeof(int32_t), stream>>>(
      chosen, N, E, offsets, order, position, active, active_slots(N, E));
  HABLAR_CUDA_CHECK_LAUNCH();
}

void gather(const float* in, const int32_t* order, int64_t N, int K, int64_t width, float* rows,
            cudaStream_t stream) {
  if (N == 0) return;
  gather_kernel<<<(unsigned)N, 256, 0, stream>>>(in, order, K, width, rows);
  HABLAR_CUDA_CHECK_LAUNCH();
}

void f16_expert_matmul(const WeightView& w, const float* x, int64_t m, float* y,
                       cudaStream_t stream) {
  HABLAR_CHECK(w.type == DType::F16, "moe::f16_expert_matmul: an F16 matrix only");
  if (m == 0) return;
  const dim3 grid(blocks_for(w.rows, 128), (unsigned)m);
  f16_expert_kernel<<<grid, 128, 0, stream>>>(static_cast<const uint8_t*>(w.data), w.row_bytes,
                                              w.rows, w.cols, x, y);
  HABLAR_CUDA_CHECK_LAUNCH();
}

void combine(const float* sorted, const int32_t* position, const float* weights, int64_t T, int K,
             int64_t width, const float* shared, const float* gate_logits, float* out,
             cudaStream_t stream) {
  HABLAR_CHECK(K >= 1 && K <= mr::kMaxExpertsUsed, "moe::combine: bad expert count");
  if (T == 0) return;
  const dim3 grid(blocks_for(width, 256), (unsigned)T);
  combine_kernel<<<grid, 256, 0, stream>>>(sorted, position, weights, K, width, shared, gate_logits,
                                           out, exp_table());
  HABLAR_CUDA_CHECK_LAUNCH();
}

}  // namespace hablar::cuda::moe
