// The persistent one-token decode step (persistent_step.h): one block of kThreads per
// multiprocessor walks the phase list, a grid-wide barrier between phases.
//
// Shared memory of a block: the phase's int8 input row (codes [kPersistentMaxWidth], then
// (d, d * sum) per block of 32), then one region per warp (a Q6_K warp's staged rows, or an
// attention warp's roped queries).
#include <cub/block/block_reduce.cuh>

#include <algorithm>

#include "backend/cuda/async_copy.cuh"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_memory.h"
#include "backend/cuda/glu_activation.cuh"
#include "backend/cuda/kv_elements.cuh"
#include "backend/cuda/matmul_q4k_rows.h"
#include "backend/cuda/matmul_q6k_rows.h"
#include "backend/cuda/persistent_attention.cuh"
#include "backend/cuda/persistent_step_runner.h"
#include "backend/cuda/q4k_rows_team.cuh"
#include "backend/cuda/q6k_unit.cuh"

namespace hablar::cuda {
namespace {

using namespace q4k_chunk;
constexpr int kThreads = 256, kWarps = kThreads / 32;
constexpr size_t kCodesBytes = kPersistentMaxWidth;
constexpr size_t kScalesBytes = kPersistentMaxWidth / 32 * sizeof(float2);
constexpr size_t kWarpRegion = kPersistentQ6kSlotBytes;
constexpr size_t kSmemBytes = kCodesBytes + kScalesBytes + kWarps * kWarpRegion;
static_assert(kWarpRegion % 16 == 0, "warp regions stay 16-byte aligned");

struct Workspace {
  int8_t* codes;      // [n_heads * head_dim] the attention output as int8 blocks
  float2* scales;     // [n_heads * head_dim / 32]
  float* partials;    // [n_heads][kPersistentMaxSplits][head_dim + 2]: m, l, o
  unsigned* done;     // [n_kv_heads] splits finished (reset by the warp that merges)
  unsigned* barrier;  // [2]: blocks arrived, generation
};

struct Args {
  const PersistentPhase* phases;
  int n_phases;
  PersistentStepContext ctx;
  Workspace ws;
};

__device__ __forceinline__ unsigned load_acquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// Every block of the grid reaches this point before any leaves it; the writes of each are
// visible to all after it.
__device__ void grid_barrier(unsigned* barrier) {
  __syncthreads();
  if (threadIdx.x == 0) {
    const unsigned generation = *reinterpret_cast<volatile unsigned*>(barrier + 1);
    __threadfence();
    if (atomicAdd(barrier, 1u) == gridDim.x - 1) {
      atomicExch(barrier, 0u);
      __threadfence();
      atomicAdd(barrier + 1, 1u);
    } else {
      while (load_acquire(barrier + 1) == generation) {
      }
    }
    __threadfence();
  }
  __syncthreads();
}

// ---- The row every block multiplies: normed and quantized, or quantized, into shared memory.

// rmsnorm(x + add) * w quantized to int8 blocks of 32, with the launch-per-op norm's passes
// (ops.cu: thread t takes values t + 256 j, fmaf squares in j order, one block reduction);
// x + add also stored into x_out (each block a share of it).
__device__ void norm_into_shared(const PersistentPhase& ph, float eps, int8_t* codes,
                                 float2* scales) {
  using Reduce = cub::BlockReduce<float, kThreads>;
  __shared__ typename Reduce::TempStorage temp;
  __shared__ float inv_rms;
  const int dim = ph.width;
  const auto value = [&](int i) {
    float v = __ldcg(ph.x + i);
    if (ph.add != nullptr) v += __ldcg(ph.add + i);
    return v;
  };
  float sum = 0.0f;
  for (int i = threadIdx.x; i < dim; i += kThreads) {
    const float v = value(i);
    sum = fmaf(v, v, sum);
  }
  sum = Reduce(temp).Sum(sum);
  if (threadIdx.x == 0) inv_rms = rsqrtf(sum / (float)dim + eps);
  __syncthreads();
  const float inv = inv_rms;
  const int lane = threadIdx.x % 32;
  for (int i = threadIdx.x, j = 0; i < dim; i += kThreads, ++j) {  // whole warps: dim % 32 == 0
    const float v = value(i);
    quantize_block32(v * inv * __ldg(ph.norm_weight + i), lane, codes + i, scales + i / 32);
    if (ph.x_out != nullptr && j % (int)gridDim.x == (int)blockIdx.x) ph.x_out[i] = v;
  }
  __syncthreads();
}

// f32 rows (written earlier in this launch: read through L2) quantized, a warp per block of 32.
__device__ void quantize_into_shared(const float* in, int width, int8_t* codes, float2* scales) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int b = warp; b < width / 32; b += kWarps)
    quantize_block32(__ldcg(in + 32 * b + lane), lane, codes + 32 * b + lane, scales + b);
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

// ---- Q4_K products: a team of `team` threads per row, one row per team at a time, the
// next row's chunks loaded while the current one is summed (chunk_dot in matmul_q4k_rows.cu's
// order, team_total's reduction).

struct RowOf {
  const PersistentMatrix* m;
  int row;
};
// Row r of the phase's Q4_K matrices taken one after another.
__device__ __forceinline__ RowOf q4k_row(const PersistentPhase& ph, int r) {
  for (int i = 0; i < ph.n_matrices; ++i) {
    const PersistentMatrix& m = ph.matrices[i];
    if (m.type != PersistentMatrixType::kQ4K) continue;
    if (r < m.rows) return {&m, r};
    r -= m.rows;
  }
  return {nullptr, 0};
}

template <int kCpt>
__device__ __forceinline__ void load_row(const PersistentMatrix* m, const uint8_t* data, int row,
                                         int t, int team, Chunk (&c)[kCpt]) {
  const int n_chunks = m->cols / 64;
#pragma unroll
  for (int i = 0; i < kCpt; ++i) {
    const int chunk = t + i * team;
    if (m == nullptr || chunk >= n_chunks) continue;
    const uint8_t* block =
        data + (size_t)row * m->row_bytes + (size_t)(chunk / 4) * kSuperBlockBytes;
    const uint8_t* nibbles = block + 16 + 32 * (chunk % 4);
    c[i].head = load_weights16(block, false);
    c[i].lo = load_weights16(nibbles, false);
    c[i].hi = load_weights16(nibbles + 16, false);
  }
}

template <int kCpt>
__device__ __forceinline__ float dot_row(const PersistentMatrix* m, int t, int team,
                                         const Chunk (&c)[kCpt], const int8_t* codes,
                                         const float2* scales) {
  float acc = 0.0f;
  if (m == nullptr) return acc;
  const int n_chunks = m->cols / 64;
#pragma unroll
  for (int i = 0; i < kCpt; ++i) {
    const int chunk = t + i * team;
    if (chunk >= n_chunks) continue;
    const int4* x = reinterpret_cast<const int4*>(codes + 64 * chunk);
    const float4 s = reinterpret_cast<const float4*>(scales)[chunk];
    acc += chunk_dot(c[i], chunk % 4, x[0], x[1], x[2], x[3], s);
  }
  return acc;
}

// One row group: each team's row (or gate and up rows) summed and stored.
template <int kCpt, bool kGlu>
__device__ __forceinline__ void finish_rows(const PersistentPhase& ph, const TeamPlace& at,
                                            int team, int r, const Chunk (&g)[kCpt],
                                            const Chunk (&u)[kCpt], const int8_t* codes,
                                            const float2* scales, float (*partial)[1]) {
  const RowOf row = q4k_row(ph, r);
  float acc[1] = {dot_row<kCpt>(row.m, at.t, at.team_threads, g, codes, scales)};
  const float total = team_total<1>(at, team, acc, partial);
  if constexpr (kGlu) {
    float up[1] = {dot_row<kCpt>(row.m, at.t, at.team_threads, u, codes, scales)};
    const float total_up = team_total<1>(at, team, up, partial + kWarps);
    if (at.t == 0 && row.m != nullptr) row.m->out[row.row] = glu_value(ph.act, total, total_up);
  } else {
    if (at.t == 0 && row.m != nullptr) row.m->out[row.row] = total;
  }
}

// (Not inlined: each instance gets its registers to itself, not the union of every phase's.)
template <int kCpt, bool kGlu>
__device__ __noinline__ void q4k_products(const PersistentPhase& ph, int team_threads,
                                          int total_rows, const int8_t* codes,
                                          const float2* scales) {
  __shared__ float partial[2][2 * kWarps][1];  // alternate groups: no barrier between them
  const int teams = kThreads / team_threads, team = threadIdx.x / team_threads;
  const TeamPlace at = {nullptr, 0, 0, 0, team_threads, (int)threadIdx.x % team_threads, false};
  const int groups = (total_rows + teams - 1) / teams;
  const uint8_t* up = kGlu ? static_cast<const uint8_t*>(ph.matrices[1].data) : nullptr;
  const auto load = [&](int bg, Chunk(&g)[kCpt], Chunk(&u)[kCpt]) {
    const int r = bg * teams + team;
    const RowOf row = r < total_rows ? q4k_row(ph, r) : RowOf{nullptr, 0};
    if (row.m == nullptr) return;
    load_row<kCpt>(row.m, static_cast<const uint8_t*>(row.m->data), row.row, at.t, team_threads, g);
    if constexpr (kGlu) load_row<kCpt>(row.m, up, row.row, at.t, team_threads, u);
  };
  const auto finish = [&](int bg, const Chunk(&g)[kCpt], const Chunk(&u)[kCpt], int parity) {
    const int r = bg * teams + team;
    finish_rows<kCpt, kGlu>(ph, at, team, r < total_rows ? r : 1 << 30, g, u, codes, scales,
                            partial[parity]);
  };
  Chunk ga[kCpt], gb[kCpt], ua[kCpt], ub[kCpt];  // (ua, ub unused without kGlu)
  int bg = blockIdx.x;
  if (bg < groups) load(bg, ga, ua);
  while (bg < groups) {  // the same trip count for every thread of the block
    if (bg + (int)gridDim.x < groups) load(bg + gridDim.x, gb, ub);
    finish(bg, ga, ua, 0);
    bg += gridDim.x;
    if (bg >= groups) break;
    if (bg + (int)gridDim.x < groups) load(bg + gridDim.x, ga, ua);
    finish(bg, gb, ub, 1);
    bg += gridDim.x;
  }
}

// The Q4_K products of the phase: every Q4_K matrix's rows (or the gated pair), at kCpt
// chunks per thread (1 .. 4; the planner admits no more).
__device__ void q4k_phase(const PersistentPhase& ph, const int8_t* codes, const float2* scales) {
  int rows = 0, team = 0, cols = 0;
  for (int i = 0; i < ph.n_matrices; ++i)
    if (ph.matrices[i].type == PersistentMatrixType::kQ4K && !(ph.glu && i == 1)) {
      rows += ph.matrices[i].rows;
      team = ph.matrices[i].team, cols = ph.matrices[i].cols;
    }
  if (rows == 0) return;
  const int cpt = (cols / 64 + team - 1) / team;
  if (ph.glu) {
    if (cpt == 1) return q4k_products<1, true>(ph, team, rows, codes, scales);
    return q4k_products<2, true>(ph, team, rows, codes, scales);
  }
  switch (cpt) {
    case 1:
      return q4k_products<1, false>(ph, team, rows, codes, scales);
    case 2:
      return q4k_products<2, false>(ph, team, rows, codes, scales);
    case 3:
      return q4k_products<3, false>(ph, team, rows, codes, scales);
    default:
      return q4k_products<4, false>(ph, team, rows, codes, scales);
  }
}

// ---- Q6_K products: matmul_q6k_rows.cu's warps (32 / team rows staged in the warp's
// region, lane t of a team taking half-units t, t + team, ...), looping over row groups.
__device__ __noinline__ void q6k_matrix(const PersistentMatrix& m, const int8_t* codes,
                                        const float2* scales, uint8_t* slot) {
  const int lane = threadIdx.x % 32, team = m.team, rows_per_warp = 32 / team;
  const int groups = (m.rows + rows_per_warp - 1) / rows_per_warp;
  const int half_units = m.cols / 128, t = lane % team;
  const uint8_t* w = static_cast<const uint8_t*>(m.data);
  const uint8_t* w_end = w + (size_t)m.rows * m.row_bytes;
  for (int g = blockIdx.x * kWarps + threadIdx.x / 32; g < groups; g += gridDim.x * kWarps) {
    const int row0 = g * rows_per_warp, row = row0 + lane / team;
    const int lead =
        stage_span(w + (size_t)row0 * m.row_bytes,
                   w + (size_t)min(row0 + rows_per_warp, m.rows) * m.row_bytes, w_end, slot, lane);
    wait_async_all();
    __syncwarp();
    float acc = 0.0f;
    if (row < m.rows) {
      const uint8_t* w_row = slot + lead + (size_t)(lane / team) * m.row_bytes;
      for (int h = t; h < half_units; h += team) {
        int x[32];
        const int4* xv = reinterpret_cast<const int4*>(codes + 128 * h);
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          const int4 v = xv[i];
          x[4 * i] = v.x, x[4 * i + 1] = v.y, x[4 * i + 2] = v.z, x[4 * i + 3] = v.w;
        }
        const float2 xs[4] = {scales[4 * h], scales[4 * h + 1], scales[4 * h + 2],
                              scales[4 * h + 3]};
        acc += q6k::half_unit_dot(q6k::load_half_unit(w_row + (h / 2) * q6k::kBlockBytes, h % 2), x,
                                  xs);
      }
    }
    for (int off = team / 2; off > 0; off /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, off);
    if (t == 0 && row < m.rows) m.out[row] = acc;
    __syncwarp();  // every lane is done with the slot before the next group's copies
  }
}

__device__ void products(const PersistentPhase& ph, const int8_t* codes, const float2* scales,
                         uint8_t* slot) {
  q4k_phase(ph, codes, scales);
  if (ph.glu) return;
  for (int i = 0; i < ph.n_matrices; ++i)
    if (ph.matrices[i].type == PersistentMatrixType::kQ6K)
      q6k_matrix(ph.matrices[i], codes, scales, slot);
}

__global__ void __launch_bounds__(kThreads, 1) persistent_step_kernel(const Args a) {
  extern __shared__ __align__(16) uint8_t smem[];
  auto* codes = reinterpret_cast<int8_t*>(smem);
  auto* scales = reinterpret_cast<float2*>(smem + kCodesBytes);
  uint8_t* region = smem + kCodesBytes + kScalesBytes + (threadIdx.x / 32) * kWarpRegion;
  for (int i = 0; i < a.n_phases; ++i) {
    const PersistentPhase& ph = a.phases[i];
    switch (ph.kind) {
      case PersistentPhaseKind::kNormProducts:
        norm_into_shared(ph, a.ctx.rms_eps, codes, scales);
        products(ph, codes, scales, region);
        break;
      case PersistentPhaseKind::kProduct:
        if (ph.input == PersistentInput::kF32)
          quantize_into_shared(ph.in, ph.width, codes, scales);
        else
          copy_codes_into_shared(a.ws, ph.width, codes, scales);
        products(ph, codes, scales, region);
        break;
      case PersistentPhaseKind::kAttention:
        persistent_attention(ph, a.ctx, a.ws.partials, a.ws.done, a.ws.codes, a.ws.scales,
                             reinterpret_cast<float*>(region));
        break;
    }
    if (i + 1 < a.n_phases) grid_barrier(a.ws.barrier);
  }
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
    const int64_t per_thread = (w.cols / 64 + m.team - 1) / m.team;
    if (per_thread > (matrices == 2 ? 2 : 4)) return false;
  } else if (w.type == DType::Q6_K && matrices == 1 && q6k_rows_supported(w)) {
    m.type = PersistentMatrixType::kQ6K;
    m.team = q6k_rows_team(w);
    if (q6k_rows_slot_bytes(m.team, w.row_bytes) > kPersistentQ6kSlotBytes) return false;
  } else {
    return false;
  }
  *out = m;
  return true;
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
  HABLAR_CUDA_CHECK(
      cudaMemcpy(phases_.get(), phases.data(), phases.size_bytes(), cudaMemcpyHostToDevice));
  const size_t width = (size_t)ctx.n_heads * ctx.head_dim;
  const size_t partials =
      (size_t)ctx.n_heads * kPersistentMaxSplits * (ctx.head_dim + 2) * sizeof(float);
  codes_ = DeviceMemory(width + width / 32 * sizeof(float2) + 16);
  partials_ = DeviceMemory(partials);
  counters_ = DeviceMemory((ctx.n_kv_heads + 2) * sizeof(unsigned));
  HABLAR_CUDA_CHECK(cudaMemset(counters_.get(), 0, counters_.bytes()));
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

void PersistentStepRunner::launch(cudaStream_t stream) const {
  Args a;
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
