#include "backend/cuda/lt_gemm.h"

#include <cublasLt.h>

#include <algorithm>

#include "backend/cuda/cublas_library.h"
#include "core/error.h"

namespace hablar::cuda {
namespace {

constexpr size_t kWorkspaceBytes = 32u << 20;  // what cublasLt asks for on Hopper
constexpr size_t kMaxPlans = 512;

// The largest power of two (at most 256) dividing the address: cublasLt's algorithms state
// the alignment they need, and the heuristic must only offer ones this pointer meets.
int alignment_of(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  int align = 256;
  while (align > 2 && a % (uintptr_t)align != 0) align /= 2;
  return align;
}

}  // namespace

// One shape's descriptors and algorithm; `ok` false when the heuristic found none.
struct LtGemm::Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  bool ok = false;

  ~Plan() {
    const CublasLtLibrary& lt = cublas_lt();
    if (desc) lt.desc_destroy(desc);
    if (a) lt.layout_destroy(a);
    if (b) lt.layout_destroy(b);
    if (c) lt.layout_destroy(c);
  }
};

LtGemm::LtGemm() = default;

LtGemm::~LtGemm() {
  plans_.clear();
  if (handle_) cublas_lt().destroy(static_cast<cublasLtHandle_t>(handle_));
}

LtGemm::Plan* LtGemm::plan_for(const Key& key) {
  if (auto it = plans_.find(key); it != plans_.end()) return it->second.get();
  if (plans_.size() >= kMaxPlans) plans_.clear();
  const auto [n, k, m, ld_w, align_w, epilogue] = key;
  const CublasLtLibrary& lt = cublas_lt();
  auto plan = std::make_unique<Plan>();
  Plan& p = *plan;
  // Column-major view, as cuBLAS sees row-major rows: yᵀ [n x m] = (W as k x n)ᵀ · (x as k x m).
  HABLAR_CUBLAS_CHECK(lt.desc_create(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  HABLAR_CUBLAS_CHECK(lt.desc_set(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
  HABLAR_CUBLAS_CHECK(lt.desc_set(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
  const bool bias = epilogue & 1, gelu = epilogue & 2;
  const cublasLtEpilogue_t e = bias && gelu ? CUBLASLT_EPILOGUE_GELU_BIAS
                               : gelu       ? CUBLASLT_EPILOGUE_GELU
                               : bias       ? CUBLASLT_EPILOGUE_BIAS
                                            : CUBLASLT_EPILOGUE_DEFAULT;
  HABLAR_CUBLAS_CHECK(lt.desc_set(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &e, sizeof e));
  if (bias) {
    const cudaDataType bias_type = CUDA_R_16F;
    HABLAR_CUBLAS_CHECK(
        lt.desc_set(p.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof bias_type));
  }
  HABLAR_CUBLAS_CHECK(lt.layout_create(&p.a, CUDA_R_16F, (uint64_t)k, (uint64_t)n, ld_w));
  HABLAR_CUBLAS_CHECK(lt.layout_create(&p.b, CUDA_R_16F, (uint64_t)k, (uint64_t)m, k));
  HABLAR_CUBLAS_CHECK(lt.layout_create(&p.c, CUDA_R_16F, (uint64_t)n, (uint64_t)m, n));
  cublasLtMatmulPreference_t pref = nullptr;
  HABLAR_CUBLAS_CHECK(lt.pref_create(&pref));
  const size_t ws = kWorkspaceBytes;
  const uint32_t align_a = (uint32_t)align_w;
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  cublasStatus_t status =
      lt.pref_set(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
  if (status == CUBLAS_STATUS_SUCCESS)
    status =
        lt.pref_set(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a, sizeof align_a);
  if (status == CUBLAS_STATUS_SUCCESS)
    status = lt.heuristic(static_cast<cublasLtHandle_t>(handle_), p.desc, p.a, p.b, p.c, p.c, pref,
                          1, &result, &found);
  lt.pref_destroy(pref);
  p.ok = status == CUBLAS_STATUS_SUCCESS && found > 0 && result.state == CUBLAS_STATUS_SUCCESS;
  if (p.ok) p.algo = result.algo;
  return plans_.emplace(key, std::move(plan)).first->second.get();
}

bool LtGemm::run(const uint16_t* w, int64_t ld_w, int64_t n, int64_t k, const uint16_t* x,
                 int64_t m, uint16_t* y, const uint16_t* bias, bool gelu, cudaStream_t stream) {
  if (state_ == State::kUnloaded) {
    try {
      cublasLtHandle_t h = nullptr;
      HABLAR_CUBLAS_CHECK(cublas_lt().create(&h));
      handle_ = h;
      workspace_ = DeviceMemory(kWorkspaceBytes);
      state_ = State::kReady;
    } catch (const Error&) {
      state_ = State::kUnavailable;  // (the plain cuBLAS path serves instead)
    }
  }
  if (state_ != State::kReady || m <= 0) return false;
  const int epilogue = (bias ? 1 : 0) | (gelu ? 2 : 0);
  Plan* p = plan_for(Key{n, k, m, ld_w, alignment_of(w), epilogue});
  if (!p->ok) return false;
  const CublasLtLibrary& lt = cublas_lt();
  if (bias)
    HABLAR_CUBLAS_CHECK(
        lt.desc_set(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
  const float alpha = 1.0f, beta = 0.0f;
  HABLAR_CUBLAS_CHECK(lt.matmul(static_cast<cublasLtHandle_t>(handle_), p->desc, &alpha, w, p->a, x,
                                p->b, &beta, y, p->c, y, p->c, &p->algo, workspace_.get(),
                                kWorkspaceBytes, stream));
  return true;
}

}  // namespace hablar::cuda
