// The persistent one-token decode step (persistent_step.h): one block of kThreads (16 warps)
// per multiprocessor walks the phase list, a grid-wide barrier between phases; before each
// barrier every warp requests its first weight group of the next phase.
//
// Shared memory of a block: the phase's int8 input row (codes [kPersistentMaxWidth], then
// (d, d * sum) per block of 32), then one 12 KB region per warp (weight rows streaming
// through it, or an attention warp's K/V tiles and queries).
//
// Code size is speed here: each phase's code runs once a layer, so what it executes is
// fetched cold unless the whole step's code stays in the instruction cache. Loops whose
// shuffles every lane takes in step (no divergent collectives), rolled outer loops and one
// call site per piece keep it small (docs/PERFORMANCE.md: 542 KB of SASS cost 4.6 ms a step
// on the 1.5B shape; the same work in less code, 2.9 ms).
#include <algorithm>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_memory.h"
#include "backend/cuda/kv_elements.cuh"
#include "backend/cuda/matmul_q4k_rows.h"
#include "backend/cuda/matmul_q6k_rows.h"
#include "backend/cuda/persistent_attention.cuh"
#include "backend/cuda/persistent_products.cuh"
#include "backend/cuda/persistent_step_runner.h"
#include "backend/cuda/q4k_chunk.cuh"

namespace hablar::cuda {
namespace {

using persistent::kWarps;
constexpr int kThreads = kWarps * 32;
constexpr size_t kCodesBytes = kPersistentMaxWidth;
constexpr size_t kScalesBytes = kPersistentMaxWidth / 32 * sizeof(float2);
constexpr size_t kWarpRegion = kPersistentWarpRegion;
constexpr size_t kSmemBytes = kCodesBytes + kScalesBytes + kWarps * kWarpRegion;
static_assert(kWarpRegion % 16 == 0, "warp regions stay 16-byte aligned");

struct Workspace {
  int8_t* codes;      // [n_heads * head_dim] the attention output as int8 blocks
  float2* scales;     // [n_heads * head_dim / 32]
  float* partials;    // [n_heads][kPersistentMaxSplits][head_dim + 2]: m, l, o
  unsigned* done;     // [n_kv_heads] splits finished (reset by the warp that merges)
  unsigned* barrier;  // [2]: arrivals at barriers, blocks that left (zeroed at the end)
};

struct Args {
  const PersistentPhase* phases;
  int n_phases;
  PersistentStepContext ctx;
  Workspace ws;
  // Null, or per phase [4] times (ns, %globaltimer): block 0 starting the phase, block 0
  // done with its prologue (norm, quantization), the last block done with its share, and
  // [n_phases][0] the end.
  unsigned long long* stamps;
};

__device__ __forceinline__ unsigned long long now() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
// Block 0's time into stamps[i][what].
__device__ __forceinline__ void stamp(unsigned long long* stamps, int i, int what) {
  if (stamps != nullptr && blockIdx.x == 0 && threadIdx.x == 0) stamps[4 * i + what] = now();
}
// The latest block's time into stamps[i][2].
__device__ __forceinline__ void stamp_latest(unsigned long long* stamps, int i) {
  if (stamps != nullptr && threadIdx.x == 0) atomicMax(stamps + 4 * i + 2, now());
}

__device__ __forceinline__ unsigned load_acquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// Barrier `index` (0, 1, ... within a launch): every block reaches it before any leaves,
// and the writes of each are visible to all after it. Arrivals only ever add to one counter
// (no reset between barriers): barrier i waits for (i + 1) * blocks arrivals.
__device__ void grid_barrier(unsigned* arrivals, int index) {
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    atomicAdd(arrivals, 1u);
    const unsigned target = (unsigned)(index + 1) * gridDim.x;
    while (load_acquire(arrivals) < target) {
    }
  }
  __syncthreads();
}

// At the end of a launch: the last block to leave zeroes the counters for the next launch
// (no block reads them any more).
__device__ void reset_barrier(unsigned* arrivals, unsigned* departures) {
  __syncthreads();
  if (threadIdx.x == 0 && atomicAdd(departures, 1u) == gridDim.x - 1) {
    *arrivals = 0;
    *departures = 0;
    __threadfence();
  }
}

// ---- The row every block multiplies: normed and quantized, or quantized, into shared memory.

// The launch-per-op norm's sum of squares (ops.cu: 256 threads, thread t summing values
// t + 256 j in j order with fmaf, then cub::BlockReduce<float, 256>): warps 0..7 play those
// threads and reduce as cub's warp-reductions algorithm does (each warp by shuffles down 1,
// 2, .. 16; then the warps' sums added in warp order), so the result is that norm's bit for
// bit (persistent_step_gpu_test checks it). Every thread of the block calls it; the total is
// returned to all.
constexpr int kNormThreads = 256;
__device__ float sum_of_squares(float partial) {
  __shared__ float warp_sums[kNormThreads / 32];
  __shared__ float total;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll
  for (int off = 1; off < 32; off *= 2) {  // every warp (the others' sums are unused)
    const float other = __shfl_down_sync(0xffffffffu, partial, off);
    if (lane + off < 32) partial += other;
  }
  if (warp < kNormThreads / 32 && lane == 0) warp_sums[warp] = partial;
  __syncthreads();
  if (threadIdx.x == 0) {
    float sum = warp_sums[0];
    for (int w = 1; w < kNormThreads / 32; ++w) sum += warp_sums[w];
    total = sum;
  }
  __syncthreads();
  return total;
}

// A value's int8 block of 32 into shared memory when `store` (every lane of the warp calls
// it in control flow the warp takes whole: no divergent shuffles, little code).
__device__ __forceinline__ void quantize_into(bool store, float v, int i, int8_t* codes,
                                              float2* scales) {
  const q4k_chunk::Block32Code c = q4k_chunk::quantize_block32_code(v);
  if (!store) return;
  codes[i] = (int8_t)c.q;
  if (i % 32 == 0) scales[i / 32] = make_float2(c.d, c.d * (float)c.sum);
}

// rmsnorm(x + add) * w quantized to int8 blocks of 32 into shared memory, x + add also
// stored into x_out (each block a share of it). Threads t < 256 hold values t + 256 j (j <
// kNormHeld; wider rows are read again); the other threads take zeros, so every loop is the
// same for all (its shuffles never diverge, which keeps this code short).
constexpr int kNormHeld = 8;
__device__ __noinline__ void norm_into_shared(const PersistentPhase& ph, float eps, int8_t* codes,
                                              float2* scales) {
  const int dim = ph.width, passes = (dim + kNormThreads - 1) / kNormThreads;
  const bool sums = threadIdx.x < kNormThreads;
  const auto value = [&](int i, bool have) {
    float v = have ? __ldcg(ph.x + i) : 0.0f;
    if (ph.add != nullptr) v += have ? __ldcg(ph.add + i) : 0.0f;
    return v;
  };
  // Every load of the held values (and their weights) goes out before any is used.
  float held[kNormHeld], weight[kNormHeld];
#pragma unroll
  for (int j = 0; j < kNormHeld; ++j) {
    const int i = threadIdx.x + j * kNormThreads;
    const bool have = sums && i < dim;
    held[j] = value(i, have);
    weight[j] = have ? __ldg(ph.norm_weight + i) : 0.0f;
  }
  float partial = 0.0f;  // zeros add nothing: the sum is the 256-thread norm's
#pragma unroll
  for (int j = 0; j < kNormHeld; ++j) partial = fmaf(held[j], held[j], partial);
#pragma unroll 1
  for (int j = kNormHeld; j < passes; ++j) {
    const int i = threadIdx.x + j * kNormThreads;
    const float v = value(i, sums && i < dim);
    partial = fmaf(v, v, partial);
  }
  const float inv = rsqrtf(sum_of_squares(partial) / (float)dim + eps);
  const auto put = [&](int j, float v, float w) {
    const int i = threadIdx.x + j * kNormThreads;
    const bool have = sums && i < dim;
    quantize_into(have, v * inv * w, i, codes, scales);
    if (have && ph.x_out != nullptr && j % (int)gridDim.x == (int)blockIdx.x) ph.x_out[i] = v;
  };
#pragma unroll
  for (int j = 0; j < kNormHeld; ++j) put(j, held[j], weight[j]);
#pragma unroll 1
  for (int j = kNormHeld; j < passes; ++j) {
    const int i = threadIdx.x + j * kNormThreads;
    const bool have = sums && i < dim;
    put(j, value(i, have), have ? __ldg(ph.norm_weight + i) : 0.0f);
  }
  __syncthreads();
}

// f32 rows (written earlier in this launch: read through L2) quantized, a warp per block of
// 32, in rounds of kBatch blocks a warp whose loads go out before their quantization (the
// same rounds for every warp: no divergent shuffles, little code).
__device__ __noinline__ void quantize_into_shared(const float* in, int width, int8_t* codes,
                                                  float2* scales) {
  constexpr int kBatch = 8;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, blocks = width / 32;
  const int rounds = (blocks + kBatch * kWarps - 1) / (kBatch * kWarps);
#pragma unroll 1
  for (int r = 0; r < rounds; ++r) {
    float v[kBatch];
#pragma unroll
    for (int k = 0; k < kBatch; ++k) {
      const int b = (r * kBatch + k) * kWarps + warp;
      v[k] = b < blocks ? __ldcg(in + 32 * b + lane) : 0.0f;
    }
#pragma unroll
    for (int k = 0; k < kBatch; ++k) {
      const int b = (r * kBatch + k) * kWarps + warp;
      quantize_into(b < blocks, v[k], 32 * b + lane, codes, scales);
    }
  }
  __syncthreads();
}

// The attention's int8 rows (written earlier in this launch) copied in.
__device__ void copy_codes_into_shared(const Workspace& ws, int width, int8_t* codes,
                                       float2* scales) {
  for (int i = threadIdx.x; i < width / 16; i += kThreads)
    reinterpret_cast<int4*>(codes)[i] = __ldcg(reinterpret_cast<const int4*>(ws.codes) + i);
  for (int i = threadIdx.x; i < width / 32; i += kThreads) scales[i] = __ldcg(ws.scales + i);
  __syncthreads();
}

__global__ void __launch_bounds__(kThreads, 1) persistent_step_kernel(const Args a) {
  extern __shared__ __align__(16) uint8_t smem[];
  auto* codes = reinterpret_cast<int8_t*>(smem);
  auto* scales = reinterpret_cast<float2*>(smem + kCodesBytes);
  uint8_t* region = smem + kCodesBytes + kScalesBytes + (threadIdx.x / 32) * kWarpRegion;
  __shared__ uint64_t bars[kWarps][2];
  persistent::WarpStream stream = persistent::warp_stream(bars);
  __shared__ PersistentPhase phase;  // the current phase: its fields read from shared memory
  for (int i = 0; i < a.n_phases; ++i) {
    stamp(a.stamps, i, 0);
    for (int w = threadIdx.x; w < (int)(sizeof(PersistentPhase) / 4); w += kThreads)
      reinterpret_cast<uint32_t*>(&phase)[w] = reinterpret_cast<const uint32_t*>(a.phases + i)[w];
    __syncthreads();
    const PersistentPhase& ph = phase;
    if (ph.kind == PersistentPhaseKind::kAttention) {
      stamp(a.stamps, i, 1);
      persistent_attention(ph, a.ctx, a.ws.partials, a.ws.done, a.ws.codes, a.ws.scales, region,
                           stream);
    } else {
      // The products' input row in shared memory, then the products (one call site: the
      // kernel's code is fetched once per phase, so it is kept small).
      if (ph.kind == PersistentPhaseKind::kNormProducts)
        norm_into_shared(ph, a.ctx.rms_eps, codes, scales);
      else if (ph.input == PersistentInput::kF32)
        quantize_into_shared(ph.in, ph.width, codes, scales);
      else
        copy_codes_into_shared(a.ws, ph.width, codes, scales);
      stamp(a.stamps, i, 1);
      persistent::products(ph, codes, scales, region, stream);
    }
    __syncthreads();
    stamp_latest(a.stamps, i);
    if (i + 1 < a.n_phases) {
      persistent::prefetch_first_group(a.phases[i + 1], region, stream);
      grid_barrier(a.ws.barrier, i);
    }
  }
  __syncthreads();
  stamp(a.stamps, a.n_phases, 0);
  reset_barrier(a.ws.barrier, a.ws.barrier + 1);
}

}  // namespace

bool persistent_matrix_rule(const WeightView& w, int matrices, PersistentMatrix* out) {
  if (w.cols > kPersistentMaxWidth || w.rows > (int64_t{1} << 30)) return false;
  PersistentMatrix m;
  m.data = w.data, m.row_bytes = w.row_bytes;
  m.rows = (int32_t)w.rows, m.cols = (int32_t)w.cols;
  if (w.type == DType::Q4_K && q4k_rows_supported(w)) {
    m.type = PersistentMatrixType::kQ4K;
    m.team = q4k_rows_team(w.cols, w.rows, matrices);
    if (w.row_bytes * (size_t)matrices + 32 > kPersistentWarpRegion) return false;
  } else if (w.type == DType::Q6_K && matrices == 1 && q6k_rows_supported(w)) {
    m.type = PersistentMatrixType::kQ6K;
    m.team = q6k_rows_team(w);
    if (w.row_bytes + 32 > kPersistentWarpRegion) return false;
  } else {
    return false;
  }
  *out = m;
  return true;
}

std::string persistent_phase_name(const PersistentPhase& p) {
  switch (p.kind) {
    case PersistentPhaseKind::kAttention:
      return "attention";
    case PersistentPhaseKind::kProduct:
      return p.input == PersistentInput::kAttentionCodes ? "o" : "down";
    case PersistentPhaseKind::kNormProducts:
      break;
  }
  if (p.glu) return "gate-up";
  return p.n_matrices == 3 ? "qkv" : "norm-product";
}

bool persistent_shapes_supported(const PersistentStepContext& c, std::string* why) {
  const auto no = [&](const char* reason) {
    if (why) *why = reason;
    return false;
  };
  if (c.head_dim != 64 && c.head_dim != 128) return no("head size other than 64 or 128");
  if (c.n_kv_heads <= 0 || c.n_heads % c.n_kv_heads != 0 ||
      c.n_heads / c.n_kv_heads > kPersistentMaxGroup)
    return no("more than 8 query heads per KV head");
  if (c.layout.dtype != KvDType::F16 || c.layout.v_type >= 0) return no("a cache other than F16");
  if (c.n_embd % 32 != 0 || c.n_embd > kPersistentMaxWidth ||
      c.n_heads * c.head_dim > kPersistentMaxWidth)
    return no("widths beyond the kernel's rows");
  if (c.rope_pairs * 2 > c.head_dim) return no("RoPE wider than a head");
  return true;
}

PersistentStepRunner::PersistentStepRunner(std::span<const PersistentPhase> phases,
                                           const PersistentStepContext& ctx)
    : ctx_(ctx), n_phases_((int)phases.size()) {
  phases_ = DeviceMemory(phases.size_bytes());
  copy_to_device(phases_.get(), phases.data(), phases.size_bytes());
  const size_t width = (size_t)ctx.n_heads * ctx.head_dim;
  const size_t partials =
      (size_t)ctx.n_heads * kPersistentMaxSplits * (ctx.head_dim + 2) * sizeof(float);
  codes_ = DeviceMemory(width + width / 32 * sizeof(float2) + 16);
  partials_ = DeviceMemory(partials);
  counters_ = DeviceMemory((ctx.n_kv_heads + 2) * sizeof(unsigned));
  set_device_bytes(counters_.get(), 0, counters_.bytes());
  HABLAR_CUDA_CHECK(cudaFuncSetAttribute(
      persistent_step_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)kSmemBytes));
  blocks_ = device_multiprocessors();
}

PersistentStepRunner::~PersistentStepRunner() = default;

bool PersistentStepRunner::device_can_run(std::string* why) {
  int device = 0, optin = 0;
  HABLAR_CUDA_CHECK(cudaGetDevice(&device));
  HABLAR_CUDA_CHECK(
      cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  if ((size_t)optin < kSmemBytes) {
    if (why)
      *why = "the persistent decode step needs " + std::to_string(kSmemBytes) +
             " bytes of shared memory per block; the device gives " + std::to_string(optin);
    return false;
  }
  HABLAR_CUDA_CHECK(cudaFuncSetAttribute(
      persistent_step_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)kSmemBytes));
  int per_sm = 0;
  HABLAR_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, persistent_step_kernel,
                                                                  kThreads, kSmemBytes));
  if (per_sm < 1) {
    if (why) *why = "the persistent decode step's block does not fit a multiprocessor";
    return false;
  }
  return true;
}

void PersistentStepRunner::launch(cudaStream_t stream, unsigned long long* stamps) const {
  Args a;
  a.stamps = stamps;
  a.phases = static_cast<const PersistentPhase*>(phases_.get());
  a.n_phases = n_phases_;
  a.ctx = ctx_;
  const size_t width = (size_t)ctx_.n_heads * ctx_.head_dim;
  auto* base = static_cast<uint8_t*>(codes_.get());
  a.ws.codes = reinterpret_cast<int8_t*>(base);
  a.ws.scales = reinterpret_cast<float2*>(base + (width + 15) / 16 * 16);
  a.ws.partials = static_cast<float*>(partials_.get());
  a.ws.done = static_cast<unsigned*>(counters_.get());
  a.ws.barrier = a.ws.done + ctx_.n_kv_heads;
  // One block per multiprocessor, each alone on its multiprocessor (its shared memory is
  // more than half of one): every block is resident, as the barriers need.
  persistent_step_kernel<<<blocks_, kThreads, kSmemBytes, stream>>>(a);
  HABLAR_CUDA_CHECK_LAUNCH();
}

}  // namespace hablar::cuda
