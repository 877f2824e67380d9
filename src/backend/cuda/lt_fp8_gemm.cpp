// LtFp8Gemm (lt_gemm.h): e4m3 products with a scale per row of each operand, through cublasLt's
// outer-vector scaling (CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F: one f32 per row of W, one
// per row of x, applied to each output as their product).
#include <cublasLt.h>

#include "backend/cuda/cublas_library.h"
#include "backend/cuda/lt_gemm.h"
#include "core/error.h"

namespace hablar::cuda {
namespace {

constexpr size_t kWorkspaceBytes = 32u << 20;
constexpr size_t kMaxPlans = 512;

// The largest power of two (at most 256) dividing the address (the heuristic must only offer
// algorithms whose alignment the output meets).
int alignment_of(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  int align = 256;
  while (align > 2 && a % (uintptr_t)align != 0) align /= 2;
  return align;
}

}  // namespace

struct LtFp8Gemm::Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulAlgo_t algo{};
  bool ok = false;

  ~Plan() {
    const CublasLtLibrary& lt = cublas_lt();
    if (desc) lt.desc_destroy(desc);
    if (a) lt.layout_destroy(a);
    if (b) lt.layout_destroy(b);
    if (d) lt.layout_destroy(d);
  }
};

LtFp8Gemm::LtFp8Gemm() = default;

LtFp8Gemm::~LtFp8Gemm() {
  plans_.clear();
  if (handle_) cublas_lt().destroy(static_cast<cublasLtHandle_t>(handle_));
}

bool LtFp8Gemm::ready() {
  if (state_ == State::kUnloaded) {
    try {
      cublasLtHandle_t h = nullptr;
      HABLAR_CUBLAS_CHECK(cublas_lt().create(&h));
      handle_ = h;
      workspace_ = DeviceMemory(kWorkspaceBytes);
      state_ = State::kReady;
    } catch (const Error&) {
      state_ = State::kUnavailable;
    }
  }
  return state_ == State::kReady;
}

// Key: (n, k, m, bit 0 y in bf16, bits 1.. the output's alignment). Column-major view, as
// cuBLAS sees row-major rows: yᵀ [n x m] = (W as k x n)ᵀ · (x as k x m), the "TN" layout
// cublasLt's FP8 products require; the A scales run along W's rows (n), the B scales along
// x's rows (m).
LtFp8Gemm::Plan* LtFp8Gemm::plan_for(const Key& key) {
  if (auto it = plans_.find(key); it != plans_.end()) return it->second.get();
  if (plans_.size() >= kMaxPlans) plans_.clear();
  const auto [n, k, m, flags] = key;
  const bool y_bf16 = flags & 1;
  const uint32_t align_d = (uint32_t)(flags >> 1);
  const CublasLtLibrary& lt = cublas_lt();
  auto plan = std::make_unique<Plan>();
  Plan& p = *plan;
  auto ok = [](cublasStatus_t s) { return s == CUBLAS_STATUS_SUCCESS; };
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  const cublasLtMatmulMatrixScale_t outer = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
  bool made = ok(lt.desc_create(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F)) &&
              ok(lt.desc_set(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta)) &&
              ok(lt.desc_set(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb)) &&
              ok(lt.desc_set(p.desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &outer, sizeof outer)) &&
              ok(lt.desc_set(p.desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &outer, sizeof outer));
  // The heuristic refuses outer-vector scales without pointers (CUBLAS_STATUS_INVALID_VALUE):
  // the workspace stands in for them until run() sets each call's own.
  const void* stand_in = workspace_.get();
  made =
      made &&
      ok(lt.desc_set(p.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &stand_in, sizeof stand_in)) &&
      ok(lt.desc_set(p.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &stand_in, sizeof stand_in));
  const cudaDataType y_type = y_bf16 ? CUDA_R_16BF : CUDA_R_32F;
  made = made && ok(lt.layout_create(&p.a, CUDA_R_8F_E4M3, (uint64_t)k, (uint64_t)n, k)) &&
         ok(lt.layout_create(&p.b, CUDA_R_8F_E4M3, (uint64_t)k, (uint64_t)m, k)) &&
         ok(lt.layout_create(&p.d, y_type, (uint64_t)n, (uint64_t)m, n));
  if (made) {
    cublasLtMatmulPreference_t pref = nullptr;
    made = ok(lt.pref_create(&pref));
    const size_t ws = kWorkspaceBytes;
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    made = made &&
           ok(lt.pref_set(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws)) &&
           ok(lt.pref_set(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_d,
                          sizeof align_d)) &&
           ok(lt.pref_set(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_d,
                          sizeof align_d)) &&
           ok(lt.heuristic(static_cast<cublasLtHandle_t>(handle_), p.desc, p.a, p.b, p.d, p.d, pref,
                           1, &result, &found));
    if (pref) lt.pref_destroy(pref);
    p.ok = made && found > 0 && result.state == CUBLAS_STATUS_SUCCESS;
    if (p.ok) p.algo = result.algo;
  }
  return plans_.emplace(key, std::move(plan)).first->second.get();
}

bool LtFp8Gemm::supports(int64_t n, int64_t k, int64_t m, bool y_bf16) {
  if (!ready() || n <= 0 || k <= 0 || m <= 0 || k % 16 != 0) return false;
  return plan_for(Key{n, k, m, (y_bf16 ? 1 : 0) | (16 << 1)})->ok;  // outputs 16-byte aligned
}

bool LtFp8Gemm::run(const uint8_t* w, const float* w_scales, int64_t n, int64_t k, const uint8_t* x,
                    const float* x_scales, int64_t m, void* y, bool y_bf16, cudaStream_t stream) {
  if (!ready() || m <= 0 || k % 16 != 0) return false;
  Plan* p = plan_for(Key{n, k, m, (y_bf16 ? 1 : 0) | (alignment_of(y) << 1)});
  if (!p->ok) return false;
  const CublasLtLibrary& lt = cublas_lt();
  HABLAR_CUBLAS_CHECK(
      lt.desc_set(p->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &w_scales, sizeof w_scales));
  HABLAR_CUBLAS_CHECK(
      lt.desc_set(p->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &x_scales, sizeof x_scales));
  const float alpha = 1.0f, beta = 0.0f;
  HABLAR_CUBLAS_CHECK(lt.matmul(static_cast<cublasLtHandle_t>(handle_), p->desc, &alpha, w, p->a, x,
                                p->b, &beta, y, p->d, y, p->d, &p->algo, workspace_.get(),
                                kWorkspaceBytes, stream));
  return true;
}

}  // namespace hablar::cuda
