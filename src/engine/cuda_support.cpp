// What the CUDA executor takes, decided before anything is allocated (engine/cuda_support.h),
// and the checks behind cuda_available / cuda_can_run / cuda_takes_cache (cuda_executor.h).
#include <fmt/format.h>

#include "backend/cuda/device_memory.h"
#include "backend/cuda/embed_ops.h"
#include "backend/cuda/matmul.h"
#include "backend/cuda/moe.h"
#include "core/error.h"
#include "engine/cuda_executor.h"
#include "engine/cuda_support.h"
#include "model/model.h"
#include "model/weights.h"

namespace hablar::engine {

// The type a matrix has on the device: its own, or one the load converts it to without
// loss (IQ4_NL's codebook values are int8, so a block is a Q8_0 block with the same scale).
DType cuda_device_type(DType t) {
  return t == DType::IQ4_NL ? DType::Q8_0 : t;
}

// The KV cache types the CUDA attention takes: f16, bf16 and q8_0, K and V of one type. Not
// q8_0 in deterministic mode, whose attention replays the CPU's f16/bf16 arithmetic.
void check_cuda_cache_types(const CudaExecutorOptions& o) {
  const auto refuse = [&](const std::string& why) {
    throw_error(ErrorKind::kUnsupported,
                fmt::format("the CUDA backend's KV cache (asked for K {}, V {}): {}",
                            kv_dtype_name(o.cache_type_k), kv_dtype_name(o.cache_type_v), why));
  };
  if (o.cache_type_k != o.cache_type_v) refuse("K and V must be of one type here");
  switch (o.cache_type_k) {
    case KvDType::F16:
    case KvDType::BF16:
      return;
    case KvDType::Q8_0:
      if (o.deterministic) refuse("deterministic mode takes f16 or bf16");
      return;
    default:
      refuse("f16, bf16 or q8_0 here; q4_0 runs on the CPU (--device cpu)");
  }
}

void check_cuda_shapes(const model::Model& m) {
  const model::ModelConfig& c = m.config();
  if (c.arch_kind == model::Arch::kGemmaEmbedding)
    throw_error(ErrorKind::kUnsupported,
                "gemma-embedding (two-way windows, dense projections) embeds on the CPU for now "
                "(--device cpu)");
  if (c.n_experts > 0 && (c.n_experts_used < 1 || c.n_experts_used > cuda::moe::kMaxExpertsUsed))
    throw_error(ErrorKind::kUnsupported,
                fmt::format("the CUDA mixture of experts takes 1 to {} experts per token; this "
                            "model uses {}",
                            cuda::moe::kMaxExpertsUsed, c.n_experts_used));
  if (c.n_experts > cuda::moe::kMaxExperts)
    throw_error(ErrorKind::kUnsupported,
                fmt::format("the CUDA mixture of experts routes up to {} experts; this model has "
                            "{}",
                            cuda::moe::kMaxExperts, c.n_experts));
  std::vector<const WeightView*> all = m.weights().matrices();
  all.push_back(&m.weights().token_embd);
  for (const WeightView* w : all) {
    WeightView as_loaded = *w;
    as_loaded.type = cuda_device_type(w->type);
    as_loaded.row_bytes = dtype_row_bytes(as_loaded.type, w->cols);
    cuda::validate_weight(as_loaded, "a weight matrix");
  }
  if (c.encoder) {  // encoders only embed (no decode attention)
    if (!cuda::EmbedOps::supports_head_dim(c.head_dim))
      throw_error(ErrorKind::kUnsupported,
                  fmt::format("CUDA embeddings support head sizes 32, 64 and 128; this encoder "
                              "has {}",
                              c.head_dim));
    return;
  }
  if (c.head_dim != 64 && c.head_dim != 96 && c.head_dim != 128 && c.head_dim != 256)
    throw_error(ErrorKind::kUnsupported, fmt::format("CUDA attention supports head sizes 64, 96, "
                                                     "128 and 256; this model has {}",
                                                     c.head_dim));
  if (c.n_heads % c.n_kv_heads != 0 || c.n_heads / c.n_kv_heads > 8)
    throw_error(ErrorKind::kUnsupported,
                fmt::format("CUDA attention supports up to 8 query heads per KV head; this model "
                            "has {} over {}",
                            c.n_heads, c.n_kv_heads));
}

bool cuda_available(std::string* reason) {
  return cuda::device_count(reason) > 0;
}

namespace {

// Whether check() returns without an Error; *reason gets its message when it throws.
template <typename Check>
bool passes(Check&& check, std::string* reason) {
  try {
    check();
    return true;
  } catch (const Error& e) {
    if (reason) *reason = e.what();
    return false;
  }
}

}  // namespace

bool cuda_can_run(const model::Model& model, std::string* reason) {
  return passes([&] { check_cuda_shapes(model); }, reason);
}

bool cuda_takes_cache(const CudaExecutorOptions& options, std::string* reason) {
  return passes([&] { check_cuda_cache_types(options); }, reason);
}

}  // namespace hablar::engine
