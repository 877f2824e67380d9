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

// The nine pointers of a grouped Q, K, V product, as kernel arguments.
struct NinePointers {
  const void* p[9];
};

__global__ void store_pointers_kernel(const void** table, NinePointers values) {
  if (threadIdx.x < 9) table[threadIdx.x] = values.p[threadIdx.x];
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
  dequantize_to_bf16(w, static_cast<uint16_t*>(copy.get()), stream);
  kept_.emplace(w.data, KeptCopy{std::move(copy), w.rows, w.cols});
  kept_bytes_ += bytes;
}

// A copy made from a view of the same bytes in another shape is not this W's.
bool PrefillMatmul::keeps(const WeightView& w) const {
  const auto kept = kept_.find(w.data);
  return kept != kept_.end() && kept->second.rows == w.rows && kept->second.cols == w.cols;
}

void PrefillMatmul::multiply_kept(const WeightView& w, const uint16_t* x_bf16, int m, float* y,
                                  cudaStream_t stream) {
  HABLAR_CHECK(keeps(w), "PrefillMatmul::multiply_kept: W has no kept copy");
  gemm_bf16(static_cast<const uint16_t*>(kept_.at(w.data).bf16.get()), x_bf16, w.rows, w.cols, m, y,
            stream);
}

void PrefillMatmul::multiply_kept_add(const WeightView& w, const uint16_t* x_bf16, int m, float* y,
                                      float alpha, cudaStream_t stream) {
  HABLAR_CHECK(keeps(w), "PrefillMatmul::multiply_kept_add: W has no kept copy");
  gemm_bf16_to(static_cast<const uint16_t*>(kept_.at(w.data).bf16.get()), x_bf16, w.rows, w.cols, m,
               y, CUDA_R_32F, stream, alpha, 1.0f);
}

void PrefillMatmul::multiply_kept_pair(const WeightView& wa, const WeightView& wb,
                                       const uint16_t* x_bf16, int m, float* ya, float* yb,
                                       cudaStream_t stream) {
  HABLAR_CHECK(keeps(wa) && keeps(wb) && wa.rows == wb.rows && wa.cols == wb.cols,
               "PrefillMatmul::multiply_kept_pair: two kept copies of one shape");
  const auto* a = static_cast<const uint16_t*>(kept_.at(wa.data).bf16.get());
  const auto* b = static_cast<const uint16_t*>(kept_.at(wb.data).bf16.get());
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

// (Never called inside a stream capture: multiply_kept_triple declines there, so the first
// call may allocate.)
const void** PrefillMatmul::pointer_table(const TableKey& key, cudaStream_t stream) {
  if (pointer_tables_.get() == nullptr)
    pointer_tables_ = DeviceMemory((size_t)kPointerTables * 9 * sizeof(void*));
  auto** tables = static_cast<const void**>(pointer_tables_.get());
  if (const auto found = table_of_.find(key); found != table_of_.end())
    return tables + (size_t)found->second * 9;
  if ((int)table_of_.size() >= kPointerTables) return nullptr;
  const int index = (int)table_of_.size();
  table_of_.emplace(key, index);
  // A = the copies, B = x for each, C = q, k, v.
  const NinePointers values{
      {key[0], key[1], key[2], key[3], key[3], key[3], key[4], key[5], key[6]}};
  store_pointers_kernel<<<1, 32, 0, stream>>>(tables + (size_t)index * 9, values);
  HABLAR_CUDA_CHECK(cudaGetLastError());
  return tables + (size_t)index * 9;
}

bool PrefillMatmul::multiply_kept_triple(const WeightView& wq, const WeightView& wk,
                                         const WeightView& wv, const uint16_t* x_bf16, int m,
                                         float* q, float* k, float* v, cudaStream_t stream) {
  HABLAR_CHECK(keeps(wq) && keeps(wk) && keeps(wv) && wk.rows == wv.rows && wq.cols == wk.cols &&
                   wk.cols == wv.cols,
               "PrefillMatmul::multiply_kept_triple: three kept copies of one width");
  if (grouped_refused_ || cublas().gemm_grouped_batched_ex == nullptr) return false;
  // Not inside a CUDA graph: the call takes its problem sizes as host arrays, and nothing
  // documents that a captured call keeps them rather than reading them again at replay.
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
  HABLAR_CUDA_CHECK(cudaStreamIsCapturing(stream, &capturing));
  if (capturing != cudaStreamCaptureStatusNone) return false;
  const TableKey key{kept_.at(wq.data).bf16.get(),
                     kept_.at(wk.data).bf16.get(),
                     kept_.at(wv.data).bf16.get(),
                     x_bf16,
                     q,
                     k,
                     v};
  const void** table = pointer_table(key, stream);
  if (table == nullptr) return false;
  // Column-major view as in gemm_bf16_to: yᵀ [N x M] = (W as K x N)ᵀ · (x as K x M).
  const cublasOperation_t ta[2] = {CUBLAS_OP_T, CUBLAS_OP_T}, tb[2] = {CUBLAS_OP_N, CUBLAS_OP_N};
  const int n[2] = {(int)wq.rows, (int)wk.rows}, rows[2] = {m, m};
  const int width[2] = {(int)wq.cols, (int)wq.cols}, ldc[2] = {(int)wq.rows, (int)wk.rows};
  const float alpha[2] = {1.0f, 1.0f}, beta[2] = {0.0f, 0.0f};
  const int group_size[2] = {1, 2};
  HABLAR_CUBLAS_CHECK(cublas().set_stream(handle_.get(), stream));
  const cublasStatus_t status = cublas().gemm_grouped_batched_ex(
      handle_.get(), ta, tb, n, rows, width, alpha, table, CUDA_R_16BF, width, table + 3,
      CUDA_R_16BF, width, beta, const_cast<void**>(table + 6), CUDA_R_32F, ldc, 2, group_size,
      CUBLAS_COMPUTE_32F);
  // Refusals come from the argument checks, before anything is queued: this library's grouped
  // call lacks these types or shapes, so the products run apart from now on.
  if (status == CUBLAS_STATUS_NOT_SUPPORTED || status == CUBLAS_STATUS_INVALID_VALUE) {
    grouped_refused_ = true;
    return false;
  }
  HABLAR_CUBLAS_CHECK(status);
  return true;
}

void PrefillMatmul::multiply_kept_to_bf16(const WeightView& w, const uint16_t* x_bf16, int m,
                                          uint16_t* y, cudaStream_t stream) {
  HABLAR_CHECK(keeps(w), "PrefillMatmul::multiply_kept_to_bf16: W has no kept copy");
  gemm_bf16_to(static_cast<const uint16_t*>(kept_.at(w.data).bf16.get()), x_bf16, w.rows, w.cols, m,
               y, CUDA_R_16BF, stream);
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
