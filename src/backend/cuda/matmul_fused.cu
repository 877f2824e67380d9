// Fused dequantize x matmul kernels for M = 1..256 (see matmul.h).
//
// gemv_kernel (M <= 8): a block of 128 threads owns kRowsPerGroup weight rows per
// "group" of threads; every thread walks 32-value units of its rows, dequantizes each unit
// to registers once and multiplies it with all M activation rows (x comes from L1/L2).
// Groups of 32, 64 or 128 threads per row pair keep short rows from idling threads.
//
// tile_kernel (8 < M <= 256): a block owns 64 weight rows and 128 activation rows; per step
// of 64 values it dequantizes the weight tile to bf16 in shared memory (each weight is read
// from memory once per 128 rows of M) and runs WMMA 16x16x16 bf16 products into f32.
#include <cuda_bf16.h>
#include <mma.h>

#include <algorithm>
#include <string>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/dependent_launch.cuh"
#include "backend/cuda/gemv_rows.cuh"
#include "backend/cuda/lab_knobs.h"
#include "backend/cuda/matmul.h"
#include "backend/cuda/matmul_q4k_mma.h"
#include "backend/cuda/matmul_q4k_rows.h"
#include "backend/cuda/matmul_q6k_rows.h"
#include "backend/cuda/q4k_chunk.cuh"
#include "backend/cuda/quant_device.cuh"
#include "core/dtype.h"

namespace hablar::cuda {
namespace {

template <DType T, int kM>
__global__ void __launch_bounds__(kGemvThreads)
    gemv_kernel(const uint8_t* __restrict__ w, size_t row_bytes, int n, int k,
                const float* __restrict__ x, float* __restrict__ y, int group_threads) {
  gemv_rows<T, kM>(w, row_bytes, n, k, x, y, group_threads);
}

// ---- Q4_K with int8 activations (M <= 3, when the caller gives a workspace): x is first
// quantized to int8 in blocks of 32 (scale d, and d * sum of the codes); then each thread
// takes a whole 32-value sub-block of a weight row: its 32 nibbles meet the 32 int8
// activations in 8 dp4a instructions, and the scales apply once per sub-block:
//   sum_l (d*sc*q_l - dmin*m) * x_l  ~  d*sc * dx * sum_l q_l*xq_l  -  dmin*m * dx*sum_l xq_l
// About 1.5 instructions per weight instead of about 8 on the f32 path, which is
// instruction-bound for 4-bit weights.

__global__ void quantize_x_q8_kernel(const float* x, int64_t n_blocks, int8_t* __restrict__ xq,
                                     float2* __restrict__ xs) {
  begin_dependent_kernel();
  const int64_t block = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (block >= n_blocks) return;  // whole warps leave together
  q4k_chunk::quantize_block32(x[block * 32 + lane], lane, xq + block * 32 + lane, xs + block);
}

template <int kM>
__global__ void __launch_bounds__(kGemvThreads)
    gemv_q4k_q8_kernel(const uint8_t* __restrict__ w, size_t row_bytes, int n, int k,
                       const int8_t* __restrict__ xq, const float2* __restrict__ xs,
                       float* __restrict__ y, int group_threads) {
  const int groups = kGemvThreads / group_threads;
  const int group = threadIdx.x / group_threads, t = threadIdx.x % group_threads;
  const int row0 = (blockIdx.x * groups + group) * kRowsPerGroup;
  const int n_sub = k / 32;
  float acc[kRowsPerGroup][kM] = {};
  if (row0 < n) {
    const uint8_t* rows[kRowsPerGroup];
#pragma unroll
    for (int r = 0; r < kRowsPerGroup; ++r) rows[r] = w + (size_t)min(row0 + r, n - 1) * row_bytes;
#pragma unroll 2
    for (int sb = t; sb < n_sub; sb += group_threads) {
      const int j = sb % 8;
      uint32_t qw[kRowsPerGroup][8];
      float dq[kRowsPerGroup], dm[kRowsPerGroup];
#pragma unroll
      for (int r = 0; r < kRowsPerGroup; ++r) {
        const uint8_t* b = rows[r] + (size_t)(sb / 8) * sizeof(BlockQ4_K);
        const uint4* qs = reinterpret_cast<const uint4*>(b + 16 + 32 * (j / 2));
        const uint4 lo = qs[0], hi = qs[1];
        const int shift = (j & 1) * 4;
        const uint32_t raw[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
#pragma unroll
        for (int i = 0; i < 8; ++i) qw[r][i] = (raw[i] >> shift) & 0x0F0F0F0Fu;
        float sc, mn;
        k_scale_min(b + 4, j, &sc, &mn);
        dq[r] = half_at(b) * sc;
        dm[r] = half_at(b + 2) * mn;
      }
#pragma unroll
      for (int m = 0; m < kM; ++m) {
        const uint4* xv = reinterpret_cast<const uint4*>(xq + (size_t)m * k + 32 * sb);
        const uint4 a = __ldg(xv), c = __ldg(xv + 1);
        const int xw[8] = {(int)a.x, (int)a.y, (int)a.z, (int)a.w,
                           (int)c.x, (int)c.y, (int)c.z, (int)c.w};
        const float2 ds = __ldg(xs + (size_t)m * n_sub + sb);
#pragma unroll
        for (int r = 0; r < kRowsPerGroup; ++r) {
          int dot = 0;
#pragma unroll
          for (int i = 0; i < 8; ++i) dot = __dp4a((int)qw[r][i], xw[i], dot);
          acc[r][m] += dq[r] * ds.x * (float)dot - dm[r] * ds.y;
        }
      }
    }
  }
  __shared__ float partial[kGemvThreads / 32][kRowsPerGroup][kM];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll
  for (int r = 0; r < kRowsPerGroup; ++r)
#pragma unroll
    for (int m = 0; m < kM; ++m) {
      float v = acc[r][m];
#pragma unroll
      for (int off = 16; off > 0; off /= 2) v += __shfl_xor_sync(0xffffffffu, v, off);
      if (lane == 0) partial[warp][r][m] = v;
    }
  __syncthreads();
  const int warps_per_group = group_threads / 32;
  if (t < kRowsPerGroup * kM) {
    const int r = t / kM, m = t % kM;
    float sum = 0.0f;
    for (int wi = 0; wi < warps_per_group; ++wi) sum += partial[group * warps_per_group + wi][r][m];
    if (row0 + r < n) y[(size_t)m * n + row0 + r] = sum;
  }
}

int gemv_group_threads(int64_t rows, int64_t units_per_row, int min_units, int target_warps) {
  // Threads per row pair: enough warps to fill the GPU (target_warps in all), while every
  // thread keeps at least min_units units (groups of 8, or sub-blocks) to walk.
  const int64_t row_pairs = (rows + 1) / 2;
  int group_threads = 32;
  while (group_threads < kGemvThreads && row_pairs * (group_threads / 32) < target_warps &&
         units_per_row / (group_threads * 2) >= min_units)
    group_threads *= 2;
  return group_threads;
}

template <int kM>
void launch_q4k_q8(const WeightView& w, const Q8Activations& xa, float* y, cudaStream_t stream) {
  const int group_threads =
      gemv_group_threads(w.rows, w.cols / 32, 2, device_multiprocessors() * 24);
  const int rows_per_block = kGemvThreads / group_threads * kRowsPerGroup;
  const int blocks = (int)((w.rows + rows_per_block - 1) / rows_per_block);
  gemv_q4k_q8_kernel<kM><<<blocks, kGemvThreads, 0, stream>>>(
      static_cast<const uint8_t*>(w.data), w.row_bytes, (int)w.rows, (int)w.cols, xa.codes,
      xa.scales, y, group_threads);
  HABLAR_CUDA_CHECK_LAUNCH();
}

constexpr int kTileN = 128, kTileM = 128, kTileK = 64, kTilePad = 8, kTileThreads = 256;

template <DType T>
__global__ void __launch_bounds__(kTileThreads)
    tile_kernel(const uint8_t* __restrict__ w, size_t row_bytes, int n, int k,
                const float* __restrict__ x, int m, float* __restrict__ y, int k_chunk) {
  using namespace nvcuda;
  __shared__ __align__(32) __nv_bfloat16 ws[kTileN][kTileK + kTilePad];
  __shared__ __align__(32) __nv_bfloat16 xs[kTileM][kTileK + kTilePad];
  __shared__ __align__(32) float stage[kTileThreads / 32][16][16];
  const int m0 = blockIdx.x * kTileM, n0 = blockIdx.y * kTileN;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const bool warp_live = m0 + warp * 16 < m;
  const int n_units = k / 32;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[kTileN / 16];
#pragma unroll
  for (int f = 0; f < kTileN / 16; ++f) wmma::fill_fragment(acc[f], 0.0f);

  // Split-K: block z covers [z * k_chunk, ...); partial products are added into y.
  const int k_begin = blockIdx.z * k_chunk, k_end = min(k, k_begin + k_chunk);
  const bool split = gridDim.z > 1;
  for (int k0 = k_begin; k0 < k_end; k0 += kTileK) {
    if (threadIdx.x < kTileN * (kTileK / 32)) {  // one 32-value weight unit per thread
      const int r = threadIdx.x / (kTileK / 32), part = threadIdx.x % (kTileK / 32);
      const int u = k0 / 32 + part;
      float v[32];
      if (n0 + r < n && u < n_units) {
        dequant_unit<T>(w + (size_t)(n0 + r) * row_bytes, u, v);
      } else {
#pragma unroll
        for (int i = 0; i < 32; ++i) v[i] = 0.0f;
      }
#pragma unroll
      for (int i = 0; i < 32; i += 2)
        *reinterpret_cast<__nv_bfloat162*>(&ws[r][part * 32 + i]) =
            __floats2bfloat162_rn(v[i], v[i + 1]);
    }
    for (int idx = threadIdx.x; idx < kTileM * kTileK / 4; idx += kTileThreads) {
      const int r = idx / (kTileK / 4), c = (idx % (kTileK / 4)) * 4;
      float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
      if (m0 + r < m && k0 + c < k)
        v = *reinterpret_cast<const float4*>(x + (size_t)(m0 + r) * k + k0 + c);
      *reinterpret_cast<__nv_bfloat162*>(&xs[r][c]) = __floats2bfloat162_rn(v.x, v.y);
      *reinterpret_cast<__nv_bfloat162*>(&xs[r][c + 2]) = __floats2bfloat162_rn(v.z, v.w);
    }
    __syncthreads();
    if (warp_live) {
#pragma unroll
      for (int kk = 0; kk < kTileK; kk += 16) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> a;
        wmma::load_matrix_sync(a, &xs[warp * 16][kk], kTileK + kTilePad);
#pragma unroll
        for (int f = 0; f < kTileN / 16; ++f) {
          wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> b;
          wmma::load_matrix_sync(b, &ws[f * 16][kk], kTileK + kTilePad);
          wmma::mma_sync(acc[f], a, b, acc[f]);
        }
      }
    }
    __syncthreads();
  }
  if (!warp_live) return;
#pragma unroll
  for (int f = 0; f < kTileN / 16; ++f) {
    wmma::store_matrix_sync(&stage[warp][0][0], acc[f], 16, wmma::mem_row_major);
    __syncwarp();
    for (int i = lane; i < 256; i += 32) {
      const int r = m0 + warp * 16 + i / 16, c = n0 + f * 16 + i % 16;
      if (r < m && c < n) {
        if (split) {
          atomicAdd(&y[(size_t)r * n + c], stage[warp][i / 16][i % 16]);
        } else {
          y[(size_t)r * n + c] = stage[warp][i / 16][i % 16];
        }
      }
    }
    __syncwarp();
  }
}

template <DType T, int kM>
void launch_gemv(const WeightView& w, const float* x, float* y, cudaStream_t stream) {
  const int group_threads =
      gemv_group_threads(w.rows, w.cols / 8, 4, device_multiprocessors() * 32);
  const int rows_per_block = kGemvThreads / group_threads * kRowsPerGroup;
  const int blocks = (int)((w.rows + rows_per_block - 1) / rows_per_block);
  gemv_kernel<T, kM><<<blocks, kGemvThreads, 0, stream>>>(static_cast<const uint8_t*>(w.data),
                                                          w.row_bytes, (int)w.rows, (int)w.cols, x,
                                                          y, group_threads);
  HABLAR_CUDA_CHECK_LAUNCH();
}

template <DType T>
void launch_fused(const WeightView& w, const float* x, int m, float* y, cudaStream_t stream) {
  switch (m) {
    case 1:
      return launch_gemv<T, 1>(w, x, y, stream);
    case 2:
      return launch_gemv<T, 2>(w, x, y, stream);
    case 3:
      return launch_gemv<T, 3>(w, x, y, stream);
    case 4:
      return launch_gemv<T, 4>(w, x, y, stream);
    case 5:
      return launch_gemv<T, 5>(w, x, y, stream);
    case 6:
      return launch_gemv<T, 6>(w, x, y, stream);
    case 7:
      return launch_gemv<T, 7>(w, x, y, stream);
    case 8:
      return launch_gemv<T, 8>(w, x, y, stream);
    default:
      break;
  }
  // Split K until the grid covers the GPU about twice (small M gives few tiles); each
  // split keeps at least 4 steps of kTileK values.
  const int tiles = ((m + kTileM - 1) / kTileM) * (int)((w.rows + kTileN - 1) / kTileN);
  const int max_splits = std::max(1, (int)(w.cols / (4 * kTileK)));
  const int splits =
      std::min(max_splits, std::max(1, (2 * device_multiprocessors() + tiles - 1) / tiles));
  const int k_chunk = (int)((w.cols / kTileK + splits - 1) / splits) * kTileK;
  const dim3 grid((m + kTileM - 1) / kTileM, (unsigned)((w.rows + kTileN - 1) / kTileN),
                  (unsigned)((w.cols + k_chunk - 1) / k_chunk));
  if (grid.z > 1) HABLAR_CUDA_CHECK(cudaMemsetAsync(y, 0, sizeof(float) * m * w.rows, stream));
  tile_kernel<T><<<grid, kTileThreads, 0, stream>>>(
      static_cast<const uint8_t*>(w.data), w.row_bytes, (int)w.rows, (int)w.cols, x, m, y, k_chunk);
  HABLAR_CUDA_CHECK_LAUNCH();
}

}  // namespace

bool cuda_supports_weight_type(DType type) {
  switch (type) {
    case DType::Q4_0:
    case DType::Q4_1:
    case DType::Q5_0:
    case DType::Q5_1:
    case DType::Q8_0:
    case DType::Q4_K:
    case DType::Q5_K:
    case DType::Q6_K:
    case DType::F16:
    case DType::BF16:
    case DType::F32:
      return true;
    default:
      return false;
  }
}

void validate_weight(const WeightView& w, const char* what) {
  if (!cuda_supports_weight_type(w.type))
    throw_error(ErrorKind::kUnsupported, std::string(what) + ": weight type " +
                                             std::string(dtype_name(w.type)) +
                                             " has no CUDA kernel");
  const int64_t block = dtype_traits(w.type).block_elems;
  const int64_t unit = block > 32 ? block : 32;
  if (w.cols <= 0 || w.cols % unit != 0 || w.rows <= 0)
    throw_error(ErrorKind::kInvalidArgument,
                std::string(what) + ": a " + std::string(dtype_name(w.type)) + " matrix of " +
                    std::to_string(w.rows) + " x " + std::to_string(w.cols) +
                    " needs rows of a multiple of " + std::to_string(unit) + " values");
  if (w.row_bytes != dtype_row_bytes(w.type, w.cols))
    throw_error(ErrorKind::kInvalidArgument, std::string(what) + ": row_bytes " +
                                                 std::to_string(w.row_bytes) +
                                                 " does not match the type and row length");
}

Q8Activations q8_layout(void* workspace, int m, int64_t k) {
  int8_t* codes = static_cast<int8_t*>(workspace);
  return {codes, reinterpret_cast<float2*>(codes + ((m * k + 255) / 256) * 256)};
}

size_t q8_activation_bytes(int m, int64_t k) {
  return (size_t)((m * k + 255) / 256) * 256 + (size_t)(m * k / 32) * sizeof(float2);
}

// The workspace: the quantized activations, then (tensor-core kernel) the partial sums of
// its K slices.
size_t mma_scratch_offset(int m, int64_t k) {
  return (q8_activation_bytes(m, k) + 255) / 256 * 256;
}

size_t matmul_fused_workspace_bytes(const WeightView& w, int m) {
  if (w.type == DType::Q6_K && m >= 1 && m <= kQ6kRowsMaxM && q6k_rows_supported(w))
    return q8_activation_bytes(m, w.cols);
  if (w.type != DType::Q4_K || m < 1 || m > kFusedMatmulMaxRows) return 0;
  if (m == 1) return q8_activation_bytes(m, w.cols);
  return mma_scratch_offset(m, w.cols) + q4k_mma_scratch_bytes(w, m);
}

void quantize_activations_q8(const float* x, int m, int64_t k, void* workspace,
                             size_t workspace_bytes, cudaStream_t stream) {
  if (m < 1 || k <= 0 || k % 32 != 0 || workspace_bytes < q8_activation_bytes(m, k))
    throw_error(ErrorKind::kInvalidArgument,
                "quantize_activations_q8: needs K a multiple of 32 and " +
                    std::to_string(q8_activation_bytes(m, k)) + " bytes of workspace");
  const Q8Activations xa = q8_layout(workspace, m, k);
  const int64_t n_blocks = m * k / 32;
  launch_dependent(quantize_x_q8_kernel, dim3((unsigned)((n_blocks * 32 + 255) / 256)), dim3(256),
                   0, stream, x, n_blocks, xa.codes, xa.scales);
}

void matmul_prequantized(const WeightView& w, int m, float* y, void* workspace,
                         cudaStream_t stream) {
  validate_weight(w, "matmul_prequantized");
  if (matmul_fused_workspace_bytes(w, m) == 0)
    throw_error(ErrorKind::kInvalidArgument,
                "matmul_prequantized: needs Q4_K weights and M in 1.." +
                    std::to_string(kFusedMatmulMaxRows) + ", or Q6_K weights and M in 1.." +
                    std::to_string(kQ6kRowsMaxM));
  const Q8Activations xa = q8_layout(workspace, m, w.cols);
  if (w.type == DType::Q6_K) return matmul_q6k_rows(w, xa.codes, xa.scales, y, stream, m);
  // M = 1 or 2 (decode of one or two sequences), or 3 and 4 for small matrices: the rows
  // kernel (matmul_q4k_rows.cu, q4k_rows_take); HABLAR_Q4K_KERNEL=0 selects the sub-block
  // kernel below for the lab.
  if (q4k_rows_take(w, m) && lab_knob("HABLAR_Q4K_KERNEL", 1) != 0)
    return matmul_q4k_rows(w, xa.codes, xa.scales, y, stream, m);
  // From M = HABLAR_Q4K_MMA_FROM (default 4) up: integer tensor cores (matmul_q4k_mma.cu);
  // below, the dp4a kernel (docs/CUDA.md).
  const int mma_from = std::clamp(lab_knob("HABLAR_Q4K_MMA_FROM", 4), 2, kGemvMaxRows + 1);
  if (m >= mma_from && q4k_mma_supported(w))
    return matmul_q4k_mma(w, xa.codes, xa.scales, m, y,
                          static_cast<uint8_t*>(workspace) + mma_scratch_offset(m, w.cols), stream);
  if (m > kGemvMaxRows)
    throw_error(ErrorKind::kInvalidArgument, "matmul_prequantized: M > " +
                                                 std::to_string(kGemvMaxRows) +
                                                 " needs 16-byte aligned Q4_K rows");
  switch (m) {
    case 1:
      return launch_q4k_q8<1>(w, xa, y, stream);
    case 2:
      return launch_q4k_q8<2>(w, xa, y, stream);
    case 3:
      return launch_q4k_q8<3>(w, xa, y, stream);
    case 4:
      return launch_q4k_q8<4>(w, xa, y, stream);
    case 5:
      return launch_q4k_q8<5>(w, xa, y, stream);
    case 6:
      return launch_q4k_q8<6>(w, xa, y, stream);
    case 7:
      return launch_q4k_q8<7>(w, xa, y, stream);
    default:
      return launch_q4k_q8<8>(w, xa, y, stream);
  }
}

void matmul_fused(const WeightView& w, const float* x, int m, float* y, cudaStream_t stream,
                  void* workspace, size_t workspace_bytes) {
  validate_weight(w, "matmul_fused");
  if (m < 1 || m > kFusedMatmulMaxRows)
    throw_error(ErrorKind::kInvalidArgument, "matmul_fused: M = " + std::to_string(m) +
                                                 " is outside 1.." +
                                                 std::to_string(kFusedMatmulMaxRows));
  const size_t need = matmul_fused_workspace_bytes(w, m);
  if (need > 0 && workspace != nullptr) {
    quantize_activations_q8(x, m, w.cols, workspace, workspace_bytes, stream);
    return matmul_prequantized(w, m, y, workspace, stream);
  }
  dispatch_weight_type(w.type, [&]<DType T>() { launch_fused<T>(w, x, m, y, stream); });
}

}  // namespace hablar::cuda
