#include "backend/cuda/bucketed_gemm.h"

#include <cublasLt.h>

#include <algorithm>
#include <array>

#include "backend/cuda/cublas_library.h"
#include "backend/cuda/cuda_check.h"
#include "core/error.h"

namespace hablar::cuda {
namespace {

constexpr size_t kWorkspaceBytes = 32u << 20;  // what cublasLt asks for on Hopper
constexpr size_t kMaxPlans = 1024;             // (shapes x buckets x placements; starts over)

// The largest power of two (at most 256) dividing both the address and the batch stride in
// bytes: the heuristic must only offer algorithms whose loads and stores these rows meet.
int alignment_of(const void* p, int64_t stride_bytes) {
  const auto a = reinterpret_cast<uintptr_t>(p) | (uintptr_t)stride_bytes;
  int align = 256;
  while (align > 2 && a % (uintptr_t)align != 0) align /= 2;
  return align;
}

size_t element_bytes(int type) {
  return type == CUDA_R_32F ? 4 : 2;
}

}  // namespace

int bucketed_rows(int m) {
  const int step = m <= 64 ? 16 : m <= 512 ? 64 : 128;
  return (m + step - 1) / step * step;
}

// One bucket's descriptors and algorithm; `ok` false when the heuristic found none.
struct BucketedGemm::Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  bool ok = false;

  ~Plan() {
    const CublasLtLibrary& lt = cublas_lt();
    if (desc) lt.desc_destroy(desc);
    for (cublasLtMatrixLayout_t l : {a, b, c})
      if (l) lt.layout_destroy(l);
  }
};

BucketedGemm::BucketedGemm() = default;

BucketedGemm::~BucketedGemm() {
  plans_.clear();
  if (handle_) cublas_lt().destroy(static_cast<cublasLtHandle_t>(handle_));
}

namespace {

// A column-major layout of `rows` x `cols` (leading dimension ld), batched with `stride`.
cublasLtMatrixLayout_t make_layout(int type, uint64_t rows, uint64_t cols, int64_t ld, int batch,
                                   int64_t stride) {
  const CublasLtLibrary& lt = cublas_lt();
  cublasLtMatrixLayout_t l = nullptr;
  HABLAR_CUBLAS_CHECK(lt.layout_create(&l, static_cast<cudaDataType>(type), rows, cols, ld));
  if (batch > 1) {
    const int32_t count = batch;
    HABLAR_CUBLAS_CHECK(lt.layout_set(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof count));
    HABLAR_CUBLAS_CHECK(
        lt.layout_set(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof stride));
  }
  return l;
}

}  // namespace

BucketedGemm::Plan* BucketedGemm::plan_for(const Key& key) {
  if (auto it = plans_.find(key); it != plans_.end()) return it->second.get();
  if (plans_.size() >= kMaxPlans) plans_.clear();
  const auto [n, k, rows, y_type, batch, stride_w, stride_y, align_a, align_b, align_c] = key;
  const CublasLtLibrary& lt = cublas_lt();
  auto plan = std::make_unique<Plan>();
  Plan& p = *plan;
  // Column-major view, as cuBLAS sees row-major rows: yᵀ [n x m] = (W as k x n)ᵀ · (x as k x m).
  HABLAR_CUBLAS_CHECK(lt.desc_create(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  HABLAR_CUBLAS_CHECK(lt.desc_set(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
  HABLAR_CUBLAS_CHECK(lt.desc_set(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
  p.a = make_layout(CUDA_R_16BF, (uint64_t)k, (uint64_t)n, k, batch, stride_w);
  p.b = make_layout(CUDA_R_16BF, (uint64_t)k, (uint64_t)rows, k, batch, 0);
  p.c = make_layout(y_type, (uint64_t)n, (uint64_t)rows, n, batch, stride_y);
  cublasLtMatmulPreference_t pref = nullptr;
  HABLAR_CUBLAS_CHECK(lt.pref_create(&pref));
  const size_t ws = kWorkspaceBytes;
  const std::array<std::pair<cublasLtMatmulPreferenceAttributes_t, uint32_t>, 4> aligns{{
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, (uint32_t)align_a},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, (uint32_t)align_b},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, (uint32_t)align_c},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, (uint32_t)align_c},
  }};
  cublasStatus_t status =
      lt.pref_set(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
  for (const auto& [attr, value] : aligns)
    if (status == CUBLAS_STATUS_SUCCESS) status = lt.pref_set(pref, attr, &value, sizeof value);
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  if (status == CUBLAS_STATUS_SUCCESS)
    status = lt.heuristic(static_cast<cublasLtHandle_t>(handle_), p.desc, p.a, p.b, p.c, p.c, pref,
                          1, &result, &found);
  lt.pref_destroy(pref);
  p.ok = status == CUBLAS_STATUS_SUCCESS && found > 0 && result.state == CUBLAS_STATUS_SUCCESS;
  if (p.ok) p.algo = result.algo;
  return plans_.emplace(key, std::move(plan)).first->second.get();
}

bool BucketedGemm::run(const BucketedProblem& q, cudaStream_t stream) {
  if (state_ == State::kUnloaded) {
    try {
      cublasLtHandle_t h = nullptr;
      HABLAR_CUBLAS_CHECK(cublas_lt().create(&h));
      handle_ = h;
      workspace_ = DeviceMemory(kWorkspaceBytes);
      state_ = State::kReady;
    } catch (const Error&) {
      state_ = State::kUnavailable;  // (cuBLAS's own call serves instead)
    }
  }
  if (state_ != State::kReady || q.m <= 0) return false;
  const size_t y_bytes = element_bytes(q.y_type);
  const Key key{q.n,
                q.k,
                bucketed_rows(q.m),
                q.y_type,
                q.batch,
                q.batch > 1 ? q.stride_w : 0,
                q.batch > 1 ? q.stride_y : 0,
                alignment_of(q.w, q.batch > 1 ? q.stride_w * 2 : 0),
                alignment_of(q.x, 0),
                alignment_of(q.y, q.batch > 1 ? q.stride_y * (int64_t)y_bytes : 0)};
  Plan* p = plan_for(key);
  if (!p->ok) return false;
  const CublasLtLibrary& lt = cublas_lt();
  const uint64_t cols = (uint64_t)q.m;  // this call's rows (the layouts are the bucket's)
  HABLAR_CUBLAS_CHECK(lt.layout_set(p->b, CUBLASLT_MATRIX_LAYOUT_COLS, &cols, sizeof cols));
  HABLAR_CUBLAS_CHECK(lt.layout_set(p->c, CUBLASLT_MATRIX_LAYOUT_COLS, &cols, sizeof cols));
  const cublasStatus_t status =
      lt.matmul(static_cast<cublasLtHandle_t>(handle_), p->desc, &q.alpha, q.w, p->a, q.x, p->b,
                &q.beta, q.y, p->c, q.y, p->c, &p->algo, workspace_.get(), kWorkspaceBytes, stream);
  // The bucket's algorithm may not take a smaller row count: nothing was queued, the caller
  // runs cuBLAS's own call for this one.
  if (status == CUBLAS_STATUS_NOT_SUPPORTED || status == CUBLAS_STATUS_INVALID_VALUE) return false;
  HABLAR_CUBLAS_CHECK(status);
  return true;
}

}  // namespace hablar::cuda
