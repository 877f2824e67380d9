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

#include <string>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/matmul.h"
#include "backend/cuda/quant_device.cuh"
#include "core/dtype.h"

namespace hablar::cuda {
namespace {

constexpr int kGemvThreads = 128;
constexpr int kRowsPerGroup = 2;

template <DType T, int kM>
__global__ void __launch_bounds__(kGemvThreads)
    gemv_kernel(const uint8_t* __restrict__ w, size_t row_bytes, int n, int k,
                const float* __restrict__ x, float* __restrict__ y, int group_threads) {
  const int groups = kGemvThreads / group_threads;
  const int group = threadIdx.x / group_threads, t = threadIdx.x % group_threads;
  const int row0 = (blockIdx.x * groups + group) * kRowsPerGroup;
  const int n_eights = k / 8;
  float acc[kRowsPerGroup][kM] = {};
  if (row0 < n) {
    const uint8_t* rows[kRowsPerGroup];
#pragma unroll
    for (int r = 0; r < kRowsPerGroup; ++r)
      rows[r] = w + (size_t)min(row0 + r, n - 1) * row_bytes;  // a missing last row repeats
      // Consecutive threads take consecutive groups of 8 values: weight bytes and activations
      // are both read coalesced. Unrolled so several groups' loads are in flight at once.
#pragma unroll 4
    for (int e = t; e < n_eights; e += group_threads) {
      float wv[kRowsPerGroup][8];
#pragma unroll
      for (int r = 0; r < kRowsPerGroup; ++r) dequant_group<T>(rows[r], e, wv[r]);
#pragma unroll
      for (int m = 0; m < kM; ++m) {
        const float4* xv = reinterpret_cast<const float4*>(x + (size_t)m * k + 8 * e);
        const float4 x0 = __ldg(xv), x1 = __ldg(xv + 1);
#pragma unroll
        for (int r = 0; r < kRowsPerGroup; ++r) {
          float a = wv[r][0] * x0.x;
          float b = wv[r][1] * x0.y;
          a = fmaf(wv[r][2], x0.z, a);
          b = fmaf(wv[r][3], x0.w, b);
          a = fmaf(wv[r][4], x1.x, a);
          b = fmaf(wv[r][5], x1.y, b);
          a = fmaf(wv[r][6], x1.z, a);
          b = fmaf(wv[r][7], x1.w, b);
          acc[r][m] += a + b;
        }
      }
    }
  }
  // Reduce within the warp, then across the group's warps through shared memory.
  __shared__ float partial[kGemvThreads / 32][kRowsPerGroup][kM];
#pragma unroll
  for (int r = 0; r < kRowsPerGroup; ++r)
#pragma unroll
    for (int m = 0; m < kM; ++m) {
      float v = acc[r][m];
#pragma unroll
      for (int off = 16; off > 0; off /= 2) v += __shfl_xor_sync(0xffffffffu, v, off);
      acc[r][m] = v;
    }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0)
#pragma unroll
    for (int r = 0; r < kRowsPerGroup; ++r)
#pragma unroll
      for (int m = 0; m < kM; ++m) partial[warp][r][m] = acc[r][m];
  __syncthreads();
  const int warps_per_group = group_threads / 32;
  if (t < kRowsPerGroup * kM) {
    const int r = t / kM, m = t % kM;
    float sum = 0.0f;
    for (int wi = 0; wi < warps_per_group; ++wi) sum += partial[group * warps_per_group + wi][r][m];
    if (row0 + r < n) y[(size_t)m * n + row0 + r] = sum;
  }
}

constexpr int kTileN = 128, kTileM = 128, kTileK = 64, kTilePad = 8, kTileThreads = 256;

template <DType T>
__global__ void __launch_bounds__(kTileThreads)
    tile_kernel(const uint8_t* __restrict__ w, size_t row_bytes, int n, int k,
                const float* __restrict__ x, int m, float* __restrict__ y) {
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

  for (int k0 = 0; k0 < k; k0 += kTileK) {
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
      if (r < m && c < n) y[(size_t)r * n + c] = stage[warp][i / 16][i % 16];
    }
    __syncwarp();
  }
}

template <DType T, int kM>
void launch_gemv(const WeightView& w, const float* x, float* y, cudaStream_t stream) {
  // Threads per row pair: enough warps to fill the GPU (about 32 per multiprocessor),
  // while every thread keeps at least 4 groups of 8 values to walk.
  const int64_t n_eights = w.cols / 8, row_pairs = (w.rows + 1) / 2;
  int group_threads = 32;
  while (group_threads < kGemvThreads && row_pairs * (group_threads / 32) < 132 * 32 &&
         n_eights / (group_threads * 2) >= 4)
    group_threads *= 2;
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
  const dim3 grid((m + kTileM - 1) / kTileM, (unsigned)((w.rows + kTileN - 1) / kTileN));
  tile_kernel<T><<<grid, kTileThreads, 0, stream>>>(static_cast<const uint8_t*>(w.data),
                                                    w.row_bytes, (int)w.rows, (int)w.cols, x, m, y);
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

void matmul_fused(const WeightView& w, const float* x, int m, float* y, cudaStream_t stream) {
  validate_weight(w, "matmul_fused");
  if (m < 1 || m > kFusedMatmulMaxRows)
    throw_error(ErrorKind::kInvalidArgument, "matmul_fused: M = " + std::to_string(m) +
                                                 " is outside 1.." +
                                                 std::to_string(kFusedMatmulMaxRows));
  dispatch_weight_type(w.type, [&]<DType T>() { launch_fused<T>(w, x, m, y, stream); });
}

}  // namespace hablar::cuda
