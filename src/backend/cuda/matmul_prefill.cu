// The large-M matmul: W dequantized to bf16, x converted to bf16, one cuBLAS GEMM with f32
// accumulation and f32 output (tensor cores).
#include <cublas_api.h>
#include <cuda_bf16.h>

#include <string>
#include <utility>

#include "backend/cuda/cublas_library.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/lab_knobs.h"
#include "backend/cuda/matmul.h"
#include "backend/cuda/quant_device.cuh"
#include "core/error.h"

namespace hablar::cuda {
namespace {

// One thread per 8 values of W: consecutive threads write consecutive 16-byte pieces.
template <DType T>
__global__ void dequantize_bf16_kernel(const uint8_t* __restrict__ w, size_t row_bytes, int64_t n,
                                       int64_t k, __nv_bfloat16* __restrict__ out) {
  const int64_t groups_per_row = k / 8;
  const int64_t group = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (group >= n * groups_per_row) return;
  const int64_t row = group / groups_per_row;
  const int g = (int)(group % groups_per_row);
  float v[8];
  dequant_group<T>(w + row * row_bytes, g, v);
  __nv_bfloat162 pairs[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) pairs[i] = __floats2bfloat162_rn(v[2 * i], v[2 * i + 1]);
  reinterpret_cast<uint4*>(out + row * k)[g] = *reinterpret_cast<const uint4*>(pairs);
}

__global__ void f32_to_bf16_kernel(const float* __restrict__ in, __nv_bfloat16* __restrict__ out,
                                   int64_t n) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x)
    out[i] = __float2bfloat16_rn(in[i]);
}

}  // namespace

int64_t kept_bf16_min_rows() {
  return lab_knob("HABLAR_KEPT_BF16_FROM", kKeptBf16MinRows);
}

void dequantize_to_bf16(const WeightView& w, uint16_t* out, cudaStream_t stream) {
  validate_weight(w, "dequantize_to_bf16");
  const int64_t groups = w.rows * (w.cols / 8);
  const int threads = 256;
  const unsigned blocks = (unsigned)((groups + threads - 1) / threads);
  dispatch_weight_type(w.type, [&]<DType T>() {
    dequantize_bf16_kernel<T>
        <<<blocks, threads, 0, stream>>>(static_cast<const uint8_t*>(w.data), w.row_bytes, w.rows,
                                         w.cols, reinterpret_cast<__nv_bfloat16*>(out));
  });
  HABLAR_CUDA_CHECK_LAUNCH();
}

void convert_f32_to_bf16(const float* in, uint16_t* out, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  const int64_t blocks = (n + 255) / 256 < 4096 ? (n + 255) / 256 : 4096;
  f32_to_bf16_kernel<<<(unsigned)blocks, 256, 0, stream>>>(
      in, reinterpret_cast<__nv_bfloat16*>(out), n);
  HABLAR_CUDA_CHECK_LAUNCH();
}

void PrefillMatmul::reserve(size_t bytes) {
  if (scratch_.bytes() >= bytes) return;
  scratch_ = DeviceMemory(bytes);
  growths_ += 1;
}

void PrefillMatmul::run(const WeightView& w, const float* x, int m, float* y, cudaStream_t stream) {
  validate_weight(w, "PrefillMatmul");
  if (m < 1) throw_error(ErrorKind::kInvalidArgument, "PrefillMatmul: M must be >= 1");
  const size_t x_elems = (size_t)m * (size_t)w.cols;
  if (keeps(w)) {
    reserve(x_elems * sizeof(uint16_t));
    auto* x_bf16 = static_cast<uint16_t*>(scratch_.get());
    convert_f32_to_bf16(x, x_bf16, (int64_t)x_elems, stream);
    return multiply_kept(w, x_bf16, m, y, stream);
  }
  const size_t w_elems = (size_t)w.rows * (size_t)w.cols;
  reserve((w_elems + x_elems) * sizeof(uint16_t) + 256);
  uint16_t* w_bf16 = static_cast<uint16_t*>(scratch_.get());
  uint16_t* x_bf16 = w_bf16 + ((w_elems + 127) / 128) * 128;
  dequantize_to_bf16(w, w_bf16, stream);
  convert_f32_to_bf16(x, x_bf16, (int64_t)x_elems, stream);
  gemm_bf16(w_bf16, x_bf16, w.rows, w.cols, m, y, stream);
}

void PrefillMatmul::keep_bf16(const WeightView& w, cudaStream_t stream) {
  validate_weight(w, "PrefillMatmul::keep_bf16");
  if (kept_.count(w.data) != 0) return;
  const size_t bytes = (size_t)w.rows * (size_t)w.cols * sizeof(uint16_t);
  DeviceMemory copy(bytes);
  auto* data = static_cast<uint16_t*>(copy.get());
  dequantize_to_bf16(w, data, stream);
  kept_.emplace(w.data, KeptCopy{std::move(copy), data, w.rows, w.cols});
  kept_bytes_ += bytes;
}

void PrefillMatmul::keep_bf16_stacked(std::span<const WeightView* const> ws, cudaStream_t stream) {
  int64_t rows = 0;
  bool stackable = !ws.empty();
  for (const WeightView* w : ws) {
    validate_weight(*w, "PrefillMatmul::keep_bf16_stacked");
    stackable = stackable && w->cols == ws[0]->cols && kept_.count(w->data) == 0;
    rows += w->rows;
  }
  for (size_t i = 0; stackable && i < ws.size(); ++i)
    for (size_t j = 0; j < i; ++j) stackable = stackable && ws[i]->data != ws[j]->data;
  if (!stackable) {
    for (const WeightView* w : ws) keep_bf16(*w, stream);
    return;
  }
  const int64_t cols = ws[0]->cols;
  stacks_.emplace_back((size_t)rows * (size_t)cols * sizeof(uint16_t));
  auto* at = static_cast<uint16_t*>(stacks_.back().get());
  for (const WeightView* w : ws) {
    dequantize_to_bf16(*w, at, stream);
    kept_.emplace(w->data, KeptCopy{DeviceMemory(), at, w->rows, w->cols});
    at += w->rows * cols;
  }
  kept_bytes_ += (size_t)rows * (size_t)cols * sizeof(uint16_t);
}

const uint16_t* PrefillMatmul::stacked_copies(std::span<const WeightView* const> ws) const {
  const uint16_t* next = nullptr;
  for (const WeightView* w : ws) {
    if (!keeps(*w)) return nullptr;
    const KeptCopy& copy = kept_.at(w->data);
    if (next != nullptr && copy.data != next) return nullptr;
    next = copy.data + w->rows * w->cols;
  }
  return ws.empty() ? nullptr : kept_.at(ws[0]->data).data;
}

// A copy made from a view of the same bytes in another shape is not this W's.
bool PrefillMatmul::keeps(const WeightView& w) const {
  const auto kept = kept_.find(w.data);
  return kept != kept_.end() && kept->second.rows == w.rows && kept->second.cols == w.cols;
}

void PrefillMatmul::multiply_kept(const WeightView& w, const uint16_t* x_bf16, int m, float* y,
                                  cudaStream_t stream) {
  HABLAR_CHECK(keeps(w), "PrefillMatmul::multiply_kept: W has no kept copy");
  gemm_bf16(kept_.at(w.data).data, x_bf16, w.rows, w.cols, m, y, stream);
}

void PrefillMatmul::multiply_kept_add(const WeightView& w, const uint16_t* x_bf16, int m, float* y,
                                      float alpha, cudaStream_t stream) {
  HABLAR_CHECK(keeps(w), "PrefillMatmul::multiply_kept_add: W has no kept copy");
  gemm_bf16_to(kept_.at(w.data).data, x_bf16, w.rows, w.cols, m, y, CUDA_R_32F, stream, alpha,
               1.0f);
}

void PrefillMatmul::multiply_kept_pair(const WeightView& wa, const WeightView& wb,
                                       const uint16_t* x_bf16, int m, float* ya, float* yb,
                                       cudaStream_t stream) {
  HABLAR_CHECK(keeps(wa) && keeps(wb) && wa.rows == wb.rows && wa.cols == wb.cols,
               "PrefillMatmul::multiply_kept_pair: two kept copies of one shape");
  const auto* a = kept_.at(wa.data).data;
  const auto* b = kept_.at(wb.data).data;
  if (b < a && yb < ya) std::swap(a, b), std::swap(ya, yb);  // the batch from the lower pair
  const long long stride_w = b - a, stride_y = yb - ya;
  if (stride_w < 0 || stride_y < 0) {
    gemm_bf16(a, x_bf16, wa.rows, wa.cols, m, ya, stream);
    gemm_bf16(b, x_bf16, wa.rows, wa.cols, m, yb, stream);
    return;
  }
  // Column-major view as in gemm_bf16_to: yᵀ_i [N x M] = (W_i as K x N)ᵀ · (x as K x M), x shared.
  const float alpha = 1.0f, beta = 0.0f;
  const int n = (int)wa.rows, k = (int)wa.cols;
  HABLAR_CUBLAS_CHECK(cublas().set_stream(handle_.get(), stream));
  HABLAR_CUBLAS_CHECK(cublas().gemm_strided_batched_ex(
      handle_.get(), CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, &alpha, a, CUDA_R_16BF, k, stride_w, x_bf16,
      CUDA_R_16BF, k, 0, &beta, ya, CUDA_R_32F, n, stride_y, 2, CUBLAS_COMPUTE_32F,
      CUBLAS_GEMM_DEFAULT));
}

void PrefillMatmul::multiply_kept_to_bf16(const WeightView& w, const uint16_t* x_bf16, int m,
                                          uint16_t* y, cudaStream_t stream) {
  HABLAR_CHECK(keeps(w), "PrefillMatmul::multiply_kept_to_bf16: W has no kept copy");
  gemm_bf16_to(kept_.at(w.data).data, x_bf16, w.rows, w.cols, m, y, CUDA_R_16BF, stream);
}

void PrefillMatmul::gemm_bf16(const uint16_t* w_bf16, const uint16_t* x_bf16, int64_t n, int64_t k,
                              int m, float* y, cudaStream_t stream) {
  gemm_bf16_to(w_bf16, x_bf16, n, k, m, y, CUDA_R_32F, stream);
}

void PrefillMatmul::gemm_bf16_to(const uint16_t* w_bf16, const uint16_t* x_bf16, int64_t n,
                                 int64_t k, int m, void* y, int y_type, cudaStream_t stream,
                                 float alpha, float beta) {
  // Column-major view: y^T [N x M] = (W as K x N)^T · (x as K x M).
  HABLAR_CUBLAS_CHECK(cublas().set_stream(handle_.get(), stream));
  HABLAR_CUBLAS_CHECK(cublas().gemm_ex(handle_.get(), CUBLAS_OP_T, CUBLAS_OP_N, (int)n, m, (int)k,
                                       &alpha, w_bf16, CUDA_R_16BF, (int)k, x_bf16, CUDA_R_16BF,
                                       (int)k, &beta, y, static_cast<cudaDataType>(y_type), (int)n,
                                       CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

}  // namespace hablar::cuda
