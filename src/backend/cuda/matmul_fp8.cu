// Products over fp8 weight copies (matmul.h: PrefillMatmul::keep_fp8): rows quantized to e4m3
// with a scale per row (fp8_rows.h), multiplied by cublasLt on the FP8 tensor cores.
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <string>
#include <utility>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/fp8_rows.h"
#include "backend/cuda/matmul.h"
#include "core/error.h"

namespace hablar::cuda {
namespace {

constexpr int kFp8RowThreads = 256;

// The largest of every thread's v over the block (every thread gets it).
__device__ float block_max(float v) {
  __shared__ float warp_max[kFp8RowThreads / 32];
  for (int offset = 16; offset > 0; offset /= 2)
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = v;
  __syncthreads();
  v = warp_max[0];
#pragma unroll
  for (int w = 1; w < kFp8RowThreads / 32; ++w) v = fmaxf(v, warp_max[w]);
  return v;
}

// One block per row of x [rows][k] (bf16, k % 8 == 0): the row's largest magnitude, its scale,
// then 8 codes per thread and step (16 bytes read, 8 written).
__global__ void __launch_bounds__(kFp8RowThreads)
    fp8_rows_kernel(const __nv_bfloat16* x, int64_t k, uint8_t* codes, float* scales) {
  const int64_t row = blockIdx.x;
  const auto* in = reinterpret_cast<const uint4*>(x + row * k);
  const int64_t groups = k / 8;
  float amax = 0.0f;
  for (int64_t g = threadIdx.x; g < groups; g += kFp8RowThreads) {
    const uint4 v = in[g];
    const auto* pairs = reinterpret_cast<const __nv_bfloat162*>(&v);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 f = __bfloat1622float2(pairs[i]);
      amax = fmaxf(amax, fmaxf(fabsf(f.x), fabsf(f.y)));
    }
  }
  amax = block_max(amax);
  const float scale = amax > 0.0f ? __fdiv_rn(amax, kE4m3Max) : 1.0f;
  const float inverse = __fdiv_rn(1.0f, scale);
  if (threadIdx.x == 0) scales[row] = scale;
  auto* out = reinterpret_cast<uint2*>(codes + row * k);
  for (int64_t g = threadIdx.x; g < groups; g += kFp8RowThreads) {
    const uint4 v = in[g];
    const auto* pairs = reinterpret_cast<const __nv_bfloat162*>(&v);
    uint32_t packed[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const float2 lo = __bfloat1622float2(pairs[2 * i]);
      const float2 hi = __bfloat1622float2(pairs[2 * i + 1]);
      const __nv_fp8x2_storage_t a =
          __nv_cvt_float2_to_fp8x2(make_float2(__fmul_rn(lo.x, inverse), __fmul_rn(lo.y, inverse)),
                                   __NV_SATFINITE, __NV_E4M3);
      const __nv_fp8x2_storage_t b =
          __nv_cvt_float2_to_fp8x2(make_float2(__fmul_rn(hi.x, inverse), __fmul_rn(hi.y, inverse)),
                                   __NV_SATFINITE, __NV_E4M3);
      packed[i] = (uint32_t)a | ((uint32_t)b << 16);
    }
    out[g] = make_uint2(packed[0], packed[1]);
  }
}

}  // namespace

void quantize_rows_fp8(const uint16_t* x_bf16, int64_t m, int64_t k, uint8_t* codes, float* scales,
                       cudaStream_t stream) {
  if (m <= 0) return;
  HABLAR_CHECK(k > 0 && k % 8 == 0, "quantize_rows_fp8: k must be a positive multiple of 8");
  fp8_rows_kernel<<<(unsigned)m, kFp8RowThreads, 0, stream>>>(
      reinterpret_cast<const __nv_bfloat16*>(x_bf16), k, codes, scales);
  HABLAR_CUDA_CHECK_LAUNCH();
}

// Made from the kept bf16 copy: the fp8 copy's values are W's rounded once to bf16 (8
// significant bits) before the 4 of e4m3.
bool PrefillMatmul::keep_fp8(const WeightView& w, cudaStream_t stream) {
  validate_weight(w, "PrefillMatmul::keep_fp8");
  keep_bf16(w, stream);
  KeptCopy& kept = kept_.at(w.data);
  if (kept.fp8.get() != nullptr) return true;
  if (w.cols % 16 != 0 || w.rows % 4 != 0 || !fp8_gemm_.supports(w.rows, w.cols, 2048, false) ||
      !fp8_gemm_.supports(w.rows, w.cols, 2048, true))
    return false;
  kept.fp8 = DeviceMemory((size_t)w.rows * (size_t)w.cols);
  kept.fp8_scales = DeviceMemory((size_t)w.rows * sizeof(float));
  quantize_rows_fp8(static_cast<const uint16_t*>(kept.bf16.get()), w.rows, w.cols,
                    static_cast<uint8_t*>(kept.fp8.get()),
                    static_cast<float*>(kept.fp8_scales.get()), stream);
  kept_bytes_ += kept.fp8.bytes() + kept.fp8_scales.bytes();
  return true;
}

bool PrefillMatmul::keeps_fp8(const WeightView& w) const {
  return keeps(w) && kept_.at(w.data).fp8.get() != nullptr;
}

size_t PrefillMatmul::fp8_scales_offset() const {
  return ((size_t)fp8_max_rows_ * (size_t)fp8_max_cols_ + 255) / 256 * 256;
}

void PrefillMatmul::reserve_fp8_rows(int64_t max_rows, int64_t max_cols) {
  if (max_rows <= fp8_max_rows_ && max_cols <= fp8_max_cols_) return;
  fp8_max_rows_ = std::max(fp8_max_rows_, max_rows);
  fp8_max_cols_ = std::max(fp8_max_cols_, max_cols);
  fp8_rows_ = DeviceMemory(fp8_scales_offset() + (size_t)fp8_max_rows_ * sizeof(float));
  growths_ += 1;
}

void PrefillMatmul::quantize_input_fp8(const uint16_t* x_bf16, int m, int64_t k,
                                       cudaStream_t stream) {
  HABLAR_CHECK(m <= fp8_max_rows_ && k <= fp8_max_cols_,
               "PrefillMatmul: fp8 input rows beyond those reserved (reserve_fp8_rows)");
  auto* base = static_cast<uint8_t*>(fp8_rows_.get());
  quantize_rows_fp8(x_bf16, m, k, base, reinterpret_cast<float*>(base + fp8_scales_offset()),
                    stream);
}

void PrefillMatmul::multiply_fp8(const KeptCopy& w, int m, void* y, bool y_bf16,
                                 cudaStream_t stream) {
  const auto* base = static_cast<const uint8_t*>(fp8_rows_.get());
  const bool queued = fp8_gemm_.run(
      static_cast<const uint8_t*>(w.fp8.get()), static_cast<const float*>(w.fp8_scales.get()),
      w.rows, w.cols, base, reinterpret_cast<const float*>(base + fp8_scales_offset()), m, y,
      y_bf16, stream);
  if (!queued)
    throw_error(ErrorKind::kInternal, "PrefillMatmul: cublasLt has no FP8 product for " +
                                          std::to_string(w.rows) + " x " + std::to_string(w.cols) +
                                          " at " + std::to_string(m) +
                                          " rows into this output (its alignment)");
}

}  // namespace hablar::cuda
