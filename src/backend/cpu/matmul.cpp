// matmul: activation quantization, instruction-set dispatch and the split of the work over
// the thread pool. The kernels themselves live in kernels_*.cpp.
#include <algorithm>
#include <string>
#include <vector>

#include "backend/cpu/matmul_internal.h"
#include "backend/cpu/ops.h"
#include "core/cpu_features.h"
#include "core/error.h"

namespace hablar::cpu {

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::kScalar:
      return "scalar";
    case Isa::kAvx2:
      return "avx2";
    case Isa::kAvx512:
      return "avx512";
  }
  return "?";
}

const IsaKernels* isa_kernels(Isa isa) {
  const CpuFeatures& f = cpu_features();
  switch (isa) {
    case Isa::kScalar:
      return &scalar_kernels();
    case Isa::kAvx2:
      return f.has_avx2_kernels() ? &avx2_kernels() : nullptr;
    case Isa::kAvx512:
      return f.has_avx512_kernels() ? &avx512_kernels() : nullptr;
  }
  return nullptr;
}

Isa best_isa() {
  static const Isa best = [] {
    if (isa_kernels(Isa::kAvx512)) return Isa::kAvx512;
    if (isa_kernels(Isa::kAvx2)) return Isa::kAvx2;
    return Isa::kScalar;
  }();
  return best;
}

bool matmul_supports(DType type) {
  return scalar_kernels().gemm_for(type) != nullptr;
}

void check_matmul_args(const WeightView& w, const float* x, int64_t n_tokens, const float* y) {
  const std::string type_name(dtype_name(w.type));
  if (!matmul_supports(w.type))
    throw_error(ErrorKind::kUnsupported, "matmul: no CPU kernel for weight type " + type_name);
  if (w.data == nullptr || x == nullptr || y == nullptr)
    throw_error(ErrorKind::kInvalidArgument, "matmul: null weight, input or output pointer");
  if (w.rows <= 0 || w.cols <= 0 || n_tokens < 0)
    throw_error(ErrorKind::kInvalidArgument, "matmul: bad shape rows=" + std::to_string(w.rows) +
                                                 " cols=" + std::to_string(w.cols) +
                                                 " n_tokens=" + std::to_string(n_tokens));
  const int64_t block = dtype_traits(w.type).block_elems;
  const int64_t act_block = act_kind_for(w.type) == ActKind::kQ8K     ? kQK_K
                            : act_kind_for(w.type) == ActKind::kAct32 ? kQK
                                                                      : 1;
  if (w.cols % std::max(block, act_block) != 0)
    throw_error(ErrorKind::kInvalidArgument, "matmul: " + std::to_string(w.cols) +
                                                 " columns is not a multiple of the " + type_name +
                                                 " block");
  if (w.row_bytes < dtype_row_bytes(w.type, w.cols))
    throw_error(ErrorKind::kInvalidArgument, "matmul: row_bytes too small for " + type_name);
}

namespace {

// Scratch for the quantized activations, owned by the calling thread (matmul may be called
// from several threads with different pools).
std::vector<uint8_t>& act_scratch() {
  thread_local std::vector<uint8_t> buffer;
  return buffer;
}

void quantize_rows(const IsaKernels& k, ActKind kind, const float* x, int64_t cols, int64_t t0,
                   int64_t t1, uint8_t* act, size_t stride) {
  for (int64_t t = t0; t < t1; ++t) {
    if (kind == ActKind::kAct32) {
      k.quantize_act32(x + t * cols, cols, act + t * stride);
    } else {
      k.quantize_q8k(x + t * cols, cols, reinterpret_cast<BlockQ8_K*>(act + t * stride));
    }
  }
}

}  // namespace

void matmul_with_isa(Isa isa, const WeightView& w, const float* x, int64_t n_tokens, float* y,
                     ThreadPool& pool) {
  check_matmul_args(w, x, n_tokens, y);
  if (n_tokens == 0) return;
  const IsaKernels* kernels = isa_kernels(isa);
  if (kernels == nullptr)
    throw_error(ErrorKind::kUnsupported,
                std::string("matmul: this CPU has no ") + isa_name(isa) + " support");
  GemmFn gemm = kernels->gemm_for(w.type);
  if (gemm == nullptr) {
    kernels = &scalar_kernels();
    gemm = kernels->gemm_for(w.type);
  }
  const ActKind kind = act_kind_for(w.type);
  const uint8_t* act = reinterpret_cast<const uint8_t*>(x);
  size_t stride = (size_t)w.cols * sizeof(float);
  if (kind != ActKind::kF32) {
    stride = act_row_bytes(kind, w.cols);
    std::vector<uint8_t>& scratch = act_scratch();
    const size_t need = stride * (size_t)n_tokens + kActReadPastEnd;
    if (scratch.size() < need) scratch.resize(need);
    uint8_t* buf = scratch.data();
    // Quantizing is cheap next to the matmul; below ~1M values one thread does it, which saves
    // a synchronization of the pool (costly when the OS is slow to schedule the workers).
    if (n_tokens * w.cols < (int64_t)1 << 20 || pool.size() == 1) {
      quantize_rows(*kernels, kind, x, w.cols, 0, n_tokens, buf, stride);
    } else {
      pool.run([&](int i, int n) {
        const IndexRange r = split_range(n_tokens, i, n);
        quantize_rows(*kernels, kind, x, w.cols, r.begin, r.end, buf, stride);
      });
    }
    act = buf;
  }
  // Rows in multiples of 16 so that threads never write the same cache line of y.
  const int64_t align = w.rows >= 16 * pool.size() ? 16 : 1;
  pool.run([&](int i, int n) {
    const IndexRange r = split_range(w.rows, i, n, align);
    if (r.begin < r.end) gemm(w, r.begin, r.end, act, stride, n_tokens, y);
  });
}

void matmul(const WeightView& w, const float* x, int64_t n_tokens, float* y, ThreadPool& pool) {
  matmul_with_isa(best_isa(), w, x, n_tokens, y, pool);
}

}  // namespace hablar::cpu
