// The mixture-of-experts kernels (moe.h): thin launches around moe_routing.cuh.
#include "backend/cuda/moe.h"

#include <algorithm>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/moe_routing.cuh"
#include "core/error.h"

namespace hablar::cuda::moe {
namespace mr = hablar::moe_routing;
namespace cr = hablar::cpu_rounding;
namespace {

// The expf table travels by value in each launch (256 bytes), so captured graphs hold it.
const mr::ExpTable& exp_table() {
  static const mr::ExpTable table = mr::libc_expf_table();
  return table;
}

// Routing, a warp per token (kRouteWarps tokens a block; probs [kRouteWarps x E] in shared
// memory). The values are softmax_row's and route_token's: every exp is the same function of
// the same input, the block sums of 16 and their double sum keep the serial order, and the
// top-k picks (largest first, ties to the lower index) do not depend on the search order.
constexpr int kRouteWarps = 4;

// The warp's largest (value, expert) pair, ties to the lower expert; every lane gets it.
__device__ void warp_best(float& value, int& expert) {
  for (int off = 16; off > 0; off /= 2) {
    const float v = __shfl_xor_sync(0xffffffffu, value, off);
    const int e = __shfl_xor_sync(0xffffffffu, expert, off);
    if (v > value || (v == value && e < expert)) value = v, expert = e;
  }
}

// p [E] (the row's logits) -> the softmax in place, as softmax_row computes it.
__device__ void warp_softmax(float* p, int E, int lane, const mr::ExpTable& table) {
  float max = -INFINITY;
  for (int e = lane; e < E; e += 32) max = fmaxf(max, p[e]);
  for (int off = 16; off > 0; off /= 2) max = fmaxf(max, __shfl_xor_sync(0xffffffffu, max, off));
  const int full = E / 16 * 16;  // blocks of 16 take exp_approx, the tail the C library's expf
  for (int e = lane; e < E; e += 32)
    p[e] = e < full ? cr::exp_approx(cr::sub(p[e], max)) : mr::libc_expf(cr::sub(p[e], max), table);
  __syncwarp();
  double sum = 0.0;  // every lane adds the same values in the same order
  for (int b0 = 0; b0 < full / 16; b0 += 32) {
    const int b = b0 + lane;
    const float part = b < full / 16 ? cr::reduce16(p + 16 * b) : 0.0f;
    for (int j = 0; j < 32 && b0 + j < full / 16; ++j)
      sum = cr::add_d(sum, (double)__shfl_sync(0xffffffffu, part, j));
  }
  for (int e = full; e < E; ++e) sum = cr::add_d(sum, (double)p[e]);
  const float inv = (float)__ddiv_rn(1.0, sum);
  __syncwarp();
  for (int e = lane; e < E; e += 32) p[e] = cr::mul(p[e], inv);
  __syncwarp();
}

__global__ void __launch_bounds__(kRouteWarps * 32)
    route_kernel(float* logits, int64_t T, int E, int K, bool normalize, int32_t* chosen,
                 float* weights, mr::ExpTable table) {
  extern __shared__ float route_probs[];  // [kRouteWarps][E]
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t t = (int64_t)blockIdx.x * kRouteWarps + warp;
  if (t >= T) return;  // the whole warp: no block-wide barrier follows
  float* p = route_probs + (size_t)warp * E;
  float* row = logits + t * E;
  for (int e = lane; e < E; e += 32) p[e] = row[e];
  __syncwarp();
  warp_softmax(p, E, lane, table);
  for (int e = lane; e < E; e += 32) row[e] = p[e];
  // K rounds of the warp's best untaken expert. Probabilities are >= 0; a NaN ranks at -1.5
  // and a taken expert at -2, so every round finds an untaken one.
  float mine = 0.0f;  // lane j: the probability of the j-th pick
  int mine_expert = 0;
  for (int j = 0; j < K; ++j) {
    float best = -3.0f;
    int expert = 0x7fffffff;
    for (int e = lane; e < E; e += 32) {
      const float v = p[e] != p[e] ? -1.5f : p[e];
      if (v > best) best = v, expert = e;
    }
    warp_best(best, expert);
    const float prob = p[expert];  // untaken: still its probability
    __syncwarp();
    if (lane == 0) p[expert] = -2.0f;
    if (lane == j) mine = prob, mine_expert = expert;
    __syncwarp();
  }
  double sum = 0.0;  // in pick order, as route_token
  for (int j = 0; j < K; ++j) sum = cr::add_d(sum, (double)__shfl_sync(0xffffffffu, mine, j));
  const float total = fmaxf((float)sum, 6.103515625e-5f);
  if (lane < K) {
    chosen[t * K + lane] = mine_expert;
    weights[t * K + lane] = normalize ? cr::div(mine, total) : mine;
  }
}

// The exclusive prefix sums of (x, y) over the block's threads (blockDim a multiple of 32),
// and their totals. Every thread of the block calls it.
__device__ int2 block_exclusive_scan(int2 v, int2* total) {
  __shared__ int2 warp_sums[32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  int2 inclusive = v;
  for (int off = 1; off < 32; off *= 2) {
    const int x = __shfl_up_sync(0xffffffffu, inclusive.x, off);
    const int y = __shfl_up_sync(0xffffffffu, inclusive.y, off);
    if (lane >= off) inclusive.x += x, inclusive.y += y;
  }
  if (lane == 31) warp_sums[warp] = inclusive;
  __syncthreads();
  if (warp == 0) {
    int2 s = lane < warps ? warp_sums[lane] : make_int2(0, 0);
    for (int off = 1; off < 32; off *= 2) {
      const int x = __shfl_up_sync(0xffffffffu, s.x, off);
      const int y = __shfl_up_sync(0xffffffffu, s.y, off);
      if (lane >= off) s.x += x, s.y += y;
    }
    if (lane < warps) warp_sums[lane] = s;
  }
  __syncthreads();
  const int2 before = warp > 0 ? warp_sums[warp - 1] : make_int2(0, 0);
  *total = warp_sums[warps - 1];
  return make_int2(before.x + inclusive.x - v.x, before.y + inclusive.y - v.y);
}

// One block (a multiple of 32 threads). The entries pass through shared memory a tile at a
// time: thread i counts the entries of experts i, i + blockDim, ...; the offsets and the
// active experts come from one block-wide scan over contiguous ranges of experts (the
// values of expert_slots and active_experts in moe_routing.cuh); then every expert's
// entries are placed in order.
constexpr int kGroupTile = 2048;

__global__ void group_kernel(const int32_t* __restrict__ chosen, int64_t N, int E, int32_t* offsets,
                             int32_t* order, int32_t* position, int32_t* active, int n_active) {
  extern __shared__ int32_t at[];  // [E + 1]: at[e + 1] expert e's count; then its next row
  __shared__ int32_t tile[kGroupTile];
  for (int e = threadIdx.x; e < E; e += blockDim.x) at[e + 1] = 0;
  for (int64_t t0 = 0; t0 < N; t0 += kGroupTile) {
    const int n = (int)(N - t0 < kGroupTile ? N - t0 : kGroupTile);
    __syncthreads();
    for (int i = threadIdx.x; i < n; i += blockDim.x) tile[i] = chosen[t0 + i];
    __syncthreads();
    for (int e = threadIdx.x; e < E; e += blockDim.x)
      at[e + 1] += (int32_t)mr::expert_slots(tile, n, e, nullptr);
  }
  __syncthreads();
  // Thread i's range of experts [lo, hi): its entries and its experts with entries.
  const int per = (E + (int)blockDim.x - 1) / (int)blockDim.x;
  const int lo = min(E, (int)threadIdx.x * per), hi = min(E, lo + per);
  int2 mine = make_int2(0, 0);
  for (int e = lo; e < hi; ++e) mine.x += at[e + 1], mine.y += at[e + 1] > 0;
  int2 total;
  int2 before = block_exclusive_scan(mine, &total);
  for (int e = lo; e < hi; ++e) {
    offsets[e] = before.x;
    if (active != nullptr && at[e + 1] > 0 && before.y < n_active) active[before.y] = e;
    before.x += at[e + 1], before.y += at[e + 1] > 0;
  }
  if (threadIdx.x == 0) offsets[E] = total.x;
  if (active != nullptr)
    for (int s = total.y + (int)threadIdx.x; s < n_active; s += blockDim.x) active[s] = -1;
  __syncthreads();  // the offsets (global memory) are visible to the block; counts are read
  for (int e = threadIdx.x; e < E; e += blockDim.x) at[e] = offsets[e];
  for (int64_t t0 = 0; t0 < N; t0 += kGroupTile) {
    const int n = (int)(N - t0 < kGroupTile ? N - t0 : kGroupTile);
    __syncthreads();
    for (int i = threadIdx.x; i < n; i += blockDim.x) tile[i] = chosen[t0 + i];
    __syncthreads();
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
      int32_t next = at[e];  // this expert's next sorted row
      for (int i = 0; i < n; ++i)
        if (tile[i] == e) {
          order[next] = (int32_t)(t0 + i);
          position[t0 + i] = next;
          ++next;
        }
      at[e] = next;
    }
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
  HABLAR_CHECK(K >= 1 && K <= kMaxExpertsUsed && K <= E, "moe::route: bad expert counts");
  if (T == 0) return;
  static_assert(kRouteWarps * kMaxExperts * sizeof(float) <= 48 * 1024, "route's shared memory");
  HABLAR_CHECK(E <= kMaxExperts, "moe::route: at most kMaxExperts experts");
  const size_t shared = (size_t)kRouteWarps * E * sizeof(float);
  route_kernel<<<blocks_for(T, kRouteWarps), kRouteWarps * 32, shared, stream>>>(
      logits, T, E, K, normalize, chosen, weights, exp_table());
  HABLAR_CUDA_CHECK_LAUNCH();
}

void group(const int32_t* chosen, int64_t N, int E, int32_t* offsets, int32_t* order,
           int32_t* position, cudaStream_t stream, int32_t* active) {
  HABLAR_CHECK(E >= 1 && E <= 8192, "moe::group: 1 to 8192 experts (shared memory)");
  const int threads = std::min((E + 31) / 32 * 32, 1024);
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
