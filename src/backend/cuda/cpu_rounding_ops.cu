// Kernels of the deterministic mode (cpu_rounding_ops.h): thin wrappers around the CPU's
// scalar numerics in cpu_rounding.cuh, one thread per value.
#include "backend/cuda/cpu_rounding_ops.h"

#include <algorithm>
#include <string>

#include "backend/cuda/cpu_rounding.cuh"
#include "backend/cuda/cuda_check.h"
#include "core/cpu_features.h"
#include "core/error.h"

namespace hablar::cuda::cpu_rounding_ops {
namespace cr = hablar::cpu_rounding;
namespace {

enum class ActKind : int { kFloat, kAct32, kQ8K };

__host__ __device__ ActKind act_kind(DType t) {
  switch (t) {
    case DType::Q4_0:
    case DType::Q4_1:
    case DType::Q5_0:
    case DType::Q5_1:
    case DType::Q8_0:
      return ActKind::kAct32;
    case DType::Q4_K:
    case DType::Q5_K:
    case DType::Q6_K:
      return ActKind::kQ8K;
    default:
      return ActKind::kFloat;
  }
}

// Bytes of one token's activation row: Act32 = qs[nb][32] | d[nb] | s[nb] | sum[nb].
size_t act_row_bytes(ActKind kind, int64_t k) {
  if (kind == ActKind::kAct32) return (size_t)(k / kQK) * (kQK + 12);
  if (kind == ActKind::kQ8K) return (size_t)(k / kQK_K) * sizeof(BlockQ8_K);
  return 0;
}

// One thread per block of one token's row (grid.y = tokens).
__global__ void quantize_act32_kernel(const float* __restrict__ x, int64_t k, size_t row_bytes,
                                      uint8_t* act) {
  const int64_t nb = k / kQK, b = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (b >= nb) return;
  uint8_t* row = act + blockIdx.y * row_bytes;
  auto* qs = reinterpret_cast<int8_t*>(row);
  auto* d = reinterpret_cast<float*>(row + nb * kQK);
  cr::quantize_block32(x + blockIdx.y * k + b * kQK, qs + b * kQK, d + b, d + nb + b,
                       reinterpret_cast<int32_t*>(d + 2 * nb) + b);
}

__global__ void quantize_q8k_kernel(const float* __restrict__ x, int64_t k, BlockQ8_K* act) {
  const int64_t nb = k / kQK_K, b = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (b >= nb) return;
  cr::quantize_block_q8k(x + blockIdx.y * k + b * kQK_K, act + blockIdx.y * nb + b);
}

// Quantized weights: a warp per (output row r, token t = blockIdx.y). The lanes make the
// terms of 32 blocks at a time (the integer work), then lane c runs chain c over them in block
// order (cpu_rounding.cuh block_terms), and lane 0 combines the chains.
constexpr int kWarpsPerBlock = 4;
__global__ void matmul_chains_kernel(DType type, const uint8_t* __restrict__ w, size_t w_row_bytes,
                                     int64_t n_rows, int64_t k, const uint8_t* __restrict__ act,
                                     size_t act_row_bytes, const uint8_t* __restrict__ roles,
                                     float* y) {
  __shared__ cr::BlockTerms terms[kWarpsPerBlock][32];
  __shared__ float chains[kWarpsPerBlock][cr::kMaxChains];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t r = (int64_t)blockIdx.x * kWarpsPerBlock + warp;
  if (r >= n_rows) return;  // the whole warp
  const int64_t t = blockIdx.y;
  const cr::KOrder order = cr::k_order_for(type, roles[t]);
  const uint8_t* wr = w + r * w_row_bytes;
  const uint8_t* a = act + t * act_row_bytes;
  const bool k_format = act_kind(type) == ActKind::kQ8K;
  const int64_t nb = k_format ? k / kQK_K : k / kQK;
  const auto* qs = reinterpret_cast<const int8_t*>(a);
  const auto* ad = reinterpret_cast<const float*>(a + nb * kQK);
  const auto* a8 = reinterpret_cast<const BlockQ8_K*>(a);
  float acc = 0.0f;  // chain `lane`, for lane < kMaxChains
  for (int64_t b0 = 0; b0 < nb; b0 += 32) {
    if (b0 + lane < nb)
      cr::block_terms(type, order, wr, qs, ad, ad + nb, a8, b0 + lane, terms[warp][lane]);
    __syncwarp();
    if (lane < cr::kMaxChains) {
      const int n = (int)(nb - b0 < 32 ? nb - b0 : 32);
      for (int i = 0; i < n; ++i) {
        const cr::BlockTerms& tm = terms[warp][i];
        for (int e = 0; e < tm.n; ++e)
          if (tm.chain[e] == lane) acc = fmaf(tm.x[e], tm.y[e], acc);
      }
    }
    __syncwarp();
  }
  if (lane < cr::kMaxChains) chains[warp][lane] = acc;
  __syncwarp();
  if (lane == 0) y[t * n_rows + r] = cr::combine_chains(type, order, chains[warp]);
}

// Float weights: y[t][r], a thread per output row r of token t = blockIdx.y.
__global__ void matmul_kernel(DType type, const uint8_t* __restrict__ w, size_t w_row_bytes,
                              int64_t n_rows, int64_t k, const float* __restrict__ x,
                              const uint8_t* __restrict__ act, size_t act_row_bytes,
                              const uint8_t* __restrict__ roles, int float_lanes, float* y) {
  const int64_t r = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= n_rows) return;
  const int64_t t = blockIdx.y;
  const uint8_t* wr = w + r * w_row_bytes;
  const uint8_t* a = act + t * act_row_bytes;
  float v;
  switch (act_kind(type)) {
    case ActKind::kAct32: {
      const int64_t nb = k / kQK;
      const auto* d = reinterpret_cast<const float*>(a + nb * kQK);
      v = cr::dot_act32(type, wr, reinterpret_cast<const int8_t*>(a), d, d + nb, nb);
      break;
    }
    case ActKind::kQ8K:
      v = cr::dot_q8k(type, wr, reinterpret_cast<const BlockQ8_K*>(a), k / kQK_K,
                      cr::k_order_for(type, roles[t]));
      break;
    default:
      v = cr::dot_float(type, wr, x + t * k, k, float_lanes);
  }
  y[t * n_rows + r] = v;
}

__global__ void rms_norm_kernel(const float* x, const float* __restrict__ weight, float* y,
                                int width, float eps) {
  const float* xr = x + (size_t)blockIdx.x * width;
  float* yr = y + (size_t)blockIdx.x * width;
  __shared__ float scale;
  if (threadIdx.x == 0) scale = cr::rms_scale(xr, width, eps);  // the CPU's sequential sum
  __syncthreads();
  for (int i = threadIdx.x; i < width; i += blockDim.x)
    yr[i] = cr::mul(cr::mul(xr[i], scale), weight[i]);
}

__global__ void swiglu_kernel(const float* gate, const float* up, float* out, int64_t n) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x)
    out[i] = cr::swiglu(gate[i], up[i]);
}

__global__ void geglu_kernel(const float* gate, const float* up, float* out, int64_t n,
                             const float* __restrict__ table) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x)
    out[i] = cr::geglu(gate[i], up[i], table);
}

__global__ void gelu_kernel(const float* x, float* out, int64_t n,
                            const float* __restrict__ table) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x)
    out[i] = cr::geglu(x[i], 1.0f, table);  // (a product with 1 rounds to itself)
}

// One thread per row: the CPU's sequential sums (deterministic mode only, never hot).
__global__ void layernorm_kernel(const float* x, const float* __restrict__ w,
                                 const float* __restrict__ b, float* y, int64_t rows, int width,
                                 float eps) {
  const int64_t r = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (r < rows) cr::layernorm_row(x + r * width, w, b, y + r * width, width, eps);
}

__global__ void embed_kernel(DType type, const uint8_t* __restrict__ table, size_t row_bytes,
                             int64_t cols, const int32_t* __restrict__ tokens, float* x) {
  const uint8_t* row = table + (size_t)tokens[blockIdx.x] * row_bytes;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
    x[blockIdx.x * cols + c] = cr::dequantize_value(type, row, c);
}

// K and V of each active token into its sequence's blocks, rounded to the cache type.
__global__ void kv_store_kernel(AttentionArgs a) {
  const int t = blockIdx.x;
  if (!a.active[t]) return;
  const KvCacheLayout& L = a.layout;
  const int hd = L.head_dim, width = L.n_kv_heads * hd;
  const bool bf16 = L.dtype == KvDType::BF16;
  const int32_t* table = a.block_tables + (size_t)t * a.max_blocks_per_seq;
  auto* cache = static_cast<uint16_t*>(a.kv_cache);
  for (int i = threadIdx.x; i < 2 * width; i += blockDim.x) {
    const int kv = i / width, h = (i % width) / hd, d = i % hd;
    const float val = (kv == 0 ? a.k : a.v)[(size_t)t * width + h * hd + d];
    cache[L.position_offset(table, a.layer, kv, h, a.positions[t]) + d] =
        bf16 ? f32_to_bf16(val) : f32_to_fp16(val);
  }
}

// One block per (token, head): cpu_rounding::attend_head() in parallel (scores by position,
// the softmax sum by one thread, the weighted sum of V by dimension); scores in shared memory.
__global__ void attention_kernel(AttentionArgs a) {
  const int t = blockIdx.x, h = blockIdx.y;
  if (!a.active[t]) return;
  extern __shared__ float smem[];
  const KvCacheLayout& L = a.layout;
  const int hd = L.head_dim, group = a.n_heads / L.n_kv_heads;
  const bool bf16 = L.dtype == KvDType::BF16, lanes64 = a.sampled[t] != 0;
  const int pos = a.positions[t];
  const int first = a.window > 0 && pos >= a.window ? pos - a.window + 1 : 0;
  const cr::HeadView head{static_cast<const uint16_t*>(a.kv_cache), &L,
                          a.block_tables + (size_t)t * a.max_blocks_per_seq, a.layer, h / group};
  float* q = smem;                   // [hd]
  float* red = smem + hd;            // [blockDim.x]
  float* scores = red + blockDim.x;  // [pos + 1]
  __shared__ float max_score, inv;
  const float* qsrc = a.q + ((size_t)t * a.n_heads + h) * hd;
  for (int d = threadIdx.x; d < hd; d += blockDim.x)
    q[d] = bf16 ? cr::bf16_round(qsrc[d]) : cr::half_round(qsrc[d]);
  __syncthreads();
  float local_max = -INFINITY;
  for (int p = first + threadIdx.x; p <= pos; p += blockDim.x) {
    scores[p] =
        cr::scaled_score(cr::dot_qk(q, head.row(0, p), hd, bf16, lanes64), a.scale, a.softcap);
    local_max = fmaxf(local_max, scores[p]);
  }
  red[threadIdx.x] = local_max;
  __syncthreads();
  if (threadIdx.x == 0) {
    float m = -INFINITY;
    for (int i = 0; i < (int)blockDim.x; ++i) m = fmaxf(m, red[i]);
    max_score = m;
  }
  __syncthreads();
  for (int p = first + threadIdx.x; p <= pos; p += blockDim.x)
    scores[p] = cr::exp_approx(cr::sub(scores[p], max_score));
  __syncthreads();
  if (threadIdx.x == 0) inv = cr::softmax_inverse(scores, first, pos);
  __syncthreads();
  for (int d = threadIdx.x; d < hd; d += blockDim.x)
    a.out[((size_t)t * a.n_heads + h) * hd + d] =
        cr::weighted_v(head, scores, inv, first, pos, d, bf16, lanes64);
}

// The vector width of this machine's CPU float tiles (backend/cpu: AVX-512, AVX2, scalar),
// whose summation order the float products follow.
int host_float_lanes() {
  static const int lanes = cpu_features().has_avx512_kernels() ? 16
                           : cpu_features().has_avx2_kernels() ? 8
                                                               : 1;
  return lanes;
}

constexpr int kAttentionThreads = 128;
constexpr size_t kMaxSharedBytes = 200 * 1024;

size_t attention_shared_bytes(int hd, int32_t context) {
  return (size_t)(hd + kAttentionThreads + context) * sizeof(float);
}

}  // namespace

bool supports(DType type) {
  return act_kind(type) != ActKind::kFloat || type == DType::F32 || type == DType::F16 ||
         type == DType::BF16;
}

size_t activation_bytes(const WeightView& w, int64_t m) {
  return act_row_bytes(act_kind(w.type), w.cols) * (size_t)m;
}

void matmul(const WeightView& w, const float* x, int64_t m, const uint8_t* roles, float* y,
            void* scratch, cudaStream_t stream) {
  if (!supports(w.type))
    throw_error(ErrorKind::kUnsupported,
                "deterministic mode: no product for " + std::string(dtype_name(w.type)));
  if (m <= 0) return;
  const ActKind kind = act_kind(w.type);
  const size_t row_bytes = act_row_bytes(kind, w.cols);
  auto* act = static_cast<uint8_t*>(scratch);
  const unsigned tokens = (unsigned)m;
  if (kind == ActKind::kAct32) {
    const int64_t nb = w.cols / kQK;
    quantize_act32_kernel<<<dim3((unsigned)((nb + 63) / 64), tokens), 64, 0, stream>>>(
        x, w.cols, row_bytes, act);
  } else if (kind == ActKind::kQ8K) {
    const int64_t nb = w.cols / kQK_K;
    quantize_q8k_kernel<<<dim3((unsigned)((nb + 63) / 64), tokens), 64, 0, stream>>>(
        x, w.cols, reinterpret_cast<BlockQ8_K*>(act));
  }
  HABLAR_CUDA_CHECK_LAUNCH();
  if (kind != ActKind::kFloat) {
    matmul_chains_kernel<<<dim3((unsigned)((w.rows + kWarpsPerBlock - 1) / kWarpsPerBlock), tokens),
                           32 * kWarpsPerBlock, 0, stream>>>(
        w.type, static_cast<const uint8_t*>(w.data), w.row_bytes, w.rows, w.cols, act, row_bytes,
        roles, y);
    HABLAR_CUDA_CHECK_LAUNCH();
    return;
  }
  matmul_kernel<<<dim3((unsigned)((w.rows + 127) / 128), tokens), 128, 0, stream>>>(
      w.type, static_cast<const uint8_t*>(w.data), w.row_bytes, w.rows, w.cols, x, act, row_bytes,
      roles, host_float_lanes(), y);
  HABLAR_CUDA_CHECK_LAUNCH();
}

void rms_norm(const float* x, const float* weight, float* y, int64_t rows, int width, float eps,
              cudaStream_t stream) {
  if (rows <= 0) return;
  rms_norm_kernel<<<(unsigned)rows, 128, 0, stream>>>(x, weight, y, width, eps);
  HABLAR_CUDA_CHECK_LAUNCH();
}

void swiglu(const float* gate, const float* up, float* out, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  const unsigned blocks = (unsigned)std::min<int64_t>((n + 255) / 256, 4096);
  swiglu_kernel<<<blocks, 256, 0, stream>>>(gate, up, out, n);
  HABLAR_CUDA_CHECK_LAUNCH();
}

void geglu(const float* gate, const float* up, float* out, int64_t n, const float* table,
           cudaStream_t stream) {
  if (n <= 0) return;
  const unsigned blocks = (unsigned)std::min<int64_t>((n + 255) / 256, 4096);
  geglu_kernel<<<blocks, 256, 0, stream>>>(gate, up, out, n, table);
  HABLAR_CUDA_CHECK_LAUNCH();
}

void gelu(const float* x, float* out, int64_t n, const float* table, cudaStream_t stream) {
  if (n <= 0) return;
  const unsigned blocks = (unsigned)std::min<int64_t>((n + 255) / 256, 4096);
  gelu_kernel<<<blocks, 256, 0, stream>>>(x, out, n, table);
  HABLAR_CUDA_CHECK_LAUNCH();
}

void layernorm(const float* x, const float* weight, const float* bias, float* y, int64_t rows,
               int width, float eps, cudaStream_t stream) {
  if (rows <= 0) return;
  layernorm_kernel<<<(unsigned)((rows + 63) / 64), 64, 0, stream>>>(x, weight, bias, y, rows, width,
                                                                    eps);
  HABLAR_CUDA_CHECK_LAUNCH();
}

void embed(const WeightView& table, const int32_t* tokens, int64_t n, float* x,
           cudaStream_t stream) {
  if (!supports(table.type))
    throw_error(ErrorKind::kUnsupported,
                "deterministic mode: no embedding for " + std::string(dtype_name(table.type)));
  if (n <= 0) return;
  embed_kernel<<<(unsigned)n, 128, 0, stream>>>(table.type, static_cast<const uint8_t*>(table.data),
                                                table.row_bytes, table.cols, tokens, x);
  HABLAR_CUDA_CHECK_LAUNCH();
}

int32_t max_attention_context() {
  return (int32_t)(kMaxSharedBytes / sizeof(float)) - 2 * kAttentionThreads - 256;
}

void attention(const AttentionArgs& a, cudaStream_t stream) {
  if (a.n_tokens <= 0) return;
  HABLAR_CHECK(!kv_dtype_quantized(a.layout.type(0)) && !kv_dtype_quantized(a.layout.type(1)),
               "deterministic mode: F16 or BF16 KV cache only");
  if (a.max_context > max_attention_context())
    throw_error(ErrorKind::kInvalidArgument,
                "deterministic mode: contexts up to " + std::to_string(max_attention_context()) +
                    " positions (asked " + std::to_string(a.max_context) + ")");
  kv_store_kernel<<<(unsigned)a.n_tokens, 128, 0, stream>>>(a);
  HABLAR_CUDA_CHECK_LAUNCH();
  const size_t smem = attention_shared_bytes(a.layout.head_dim, a.max_context);
  static const bool attribute_set = [] {  // once per process, before any capture
    HABLAR_CUDA_CHECK(cudaFuncSetAttribute(
        attention_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)kMaxSharedBytes));
    return true;
  }();
  (void)attribute_set;
  attention_kernel<<<dim3((unsigned)a.n_tokens, (unsigned)a.n_heads), kAttentionThreads, smem,
                     stream>>>(a);
  HABLAR_CUDA_CHECK_LAUNCH();
}

}  // namespace hablar::cuda::cpu_rounding_ops
