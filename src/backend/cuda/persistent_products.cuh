// The products of the persistent decode step (persistent_step.h), on the int8 row every
// block holds in shared memory.
//
// Each warp streams its own groups of consecutive rows of one matrix (both matrices' rows
// for the gated pair) through two halves of its shared region: the next group's bulk copy
// (cp.async.bulk: one instruction a span, nothing held in registers) is in flight while the
// current group is summed, and the first group of a phase is requested before the barrier
// that starts it, so the weights stream during the barrier and the norm. A group is at most half a
// region and about the phase's rows over the grid's warps, so every warp has work.
//
// Rows are summed with the launch-per-op kernels' arithmetic, bit for bit:
//   Q4_K (matmul_q4k_rows.cu): thread t of a team of T takes chunks t, t + T, ... in order,
//     the team's sums meet by xor shuffles, and teams wider than a warp add their warps'
//     sums in warp order onto 0. Here one warp plays a whole team: for T <= 32 it holds
//     32 / T rows at a time; for T > 32 each lane plays the threads lane, lane + 32, ... of
//     the team, reducing each such "warp" of the team alone before adding them in order.
//   Q6_K (matmul_q6k_rows.cu): `team` lanes per row, half-units t, t + team, ... in order.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/async_copy.cuh"
#include "backend/cuda/glu_activation.cuh"
#include "backend/cuda/persistent_step.h"
#include "backend/cuda/q4k_chunk.cuh"
#include "backend/cuda/q6k_unit.cuh"

namespace hablar::cuda::persistent {

inline constexpr int kWarps = 16;  // per block
inline constexpr size_t kHalfRegion = kPersistentWarpRegion / 2;
static_assert(kHalfRegion % 16 == 0, "halves of a warp's region stay 16-byte aligned");

// ---- Bulk copies (the Tensor Memory Accelerator: one instruction moves a whole span, so a
// few warps keep many kilobytes in flight), completed on a per-half mbarrier.
__device__ __forceinline__ uint32_t shared_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void barrier_init(uint64_t* bar) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(shared_address(bar)) : "memory");
}
// One arrival that also expects `bytes` of copies before the barrier's phase completes.
__device__ __forceinline__ void barrier_expect(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(shared_address(bar)),
               "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void bulk_copy(void* dst, const void* src, uint32_t bytes,
                                          uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::
          "r"(shared_address(dst)),
      "l"(src), "r"(bytes), "r"(shared_address(bar))
      : "memory");
}
__device__ __forceinline__ void barrier_wait(uint64_t* bar, uint32_t parity) {
  uint32_t done = 0;
  while (!done)
    asm volatile(
        "{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, "
        "p; }"
        : "=r"(done)
        : "r"(shared_address(bar)), "r"(parity)
        : "memory");
}
// Orders this thread's earlier shared-memory accesses before later bulk copies' writes.
__device__ __forceinline__ void fence_before_bulk_copies() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

// A warp's two halves: their barriers, the parity each waits for next, and whether half 0
// already holds (or is receiving) the warp's first group of the coming phase.
struct WarpStream {
  uint64_t* bars;  // [2], in shared memory
  uint32_t parity[2] = {0, 0};
  bool prefetched = false;
};

// Every warp's barriers, made once per launch by its lane 0 (then visible to the copies).
__device__ __forceinline__ WarpStream warp_stream(uint64_t (*bars)[2]) {
  WarpStream s;
  s.bars = bars[threadIdx.x / 32];
  if (threadIdx.x % 32 == 0) {
    barrier_init(&s.bars[0]);
    barrier_init(&s.bars[1]);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncwarp();
  return s;
}

// A group of rows staged in a half region: matrix, first row, count, and where the first
// row starts in the half (Q6_K rows are only 2-byte aligned).
struct Staged {
  const PersistentMatrix* m = nullptr;
  int row0 = 0, rows = 0, lead = 0;
};

// Whether the phase's groups fit half a region each (two in flight per warp) or take the
// whole region one at a time (rows wider than half a region).
__device__ __forceinline__ bool double_buffered(const PersistentPhase& ph) {
  for (int i = 0; i < ph.n_matrices; ++i)
    if (ph.matrices[i].row_bytes * (ph.glu ? 2 : 1) + 32 > kHalfRegion) return false;
  return true;
}

// Where group s's first row lands in its half: the row's offset within 16 bytes.
__device__ __forceinline__ int lead_of(const Staged& s) {
  return (int)((reinterpret_cast<uintptr_t>(s.m->data) + (size_t)s.row0 * s.m->row_bytes) & 15);
}

// Rows per group of matrix m: within its buffer (half a region, or all of it), with the
// gated pair's second matrix and room for the lead, and no more than the phase's rows over
// the grid's warps.
__device__ __forceinline__ int group_rows(const PersistentPhase& ph, const PersistentMatrix& m,
                                          int phase_rows) {
  const size_t row_bytes = m.row_bytes * (ph.glu ? 2 : 1);
  const size_t buffer = double_buffered(ph) ? kHalfRegion : kPersistentWarpRegion;
  const int by_bytes = (int)((buffer - 32) / row_bytes);
  const int warps = gridDim.x * kWarps;
  return max(1, min(by_bytes, (phase_rows + warps - 1) / warps));
}

// The phase's matrices whose rows are its outputs (not the gated pair's up matrix).
__device__ __forceinline__ int output_matrices(const PersistentPhase& ph) {
  return ph.glu ? 1 : ph.n_matrices;
}

__device__ __forceinline__ int phase_rows(const PersistentPhase& ph) {
  int rows = 0;
  for (int i = 0; i < output_matrices(ph); ++i) rows += ph.matrices[i].rows;
  return rows;
}

// Group g of the phase (groups numbered matrix by matrix); rows == 0 past the last.
__device__ __forceinline__ Staged group_at(const PersistentPhase& ph, int total_rows, int g) {
  for (int i = 0; i < output_matrices(ph); ++i) {
    const PersistentMatrix& m = ph.matrices[i];
    const int per = group_rows(ph, m, total_rows), groups = (m.rows + per - 1) / per;
    if (g < groups) return {&m, g * per, min(per, m.rows - g * per), 0};
    g -= groups;
  }
  return {};
}

__device__ __forceinline__ int phase_groups(const PersistentPhase& ph, int total_rows) {
  int groups = 0;
  for (int i = 0; i < output_matrices(ph); ++i) {
    const PersistentMatrix& m = ph.matrices[i];
    const int per = group_rows(ph, m, total_rows);
    groups += (m.rows + per - 1) / per;
  }
  return groups;
}

// Lane 0 starts the copies of group s (and for the gated pair the up matrix's same rows,
// after it) into half `h` of the warp's region; s.lead is set in every lane.
__device__ __forceinline__ void stage_group(const PersistentPhase& ph, Staged& s, uint8_t* region,
                                            WarpStream& ws, int h, int lane) {
  const PersistentMatrix& m = *s.m;
  const auto* w = static_cast<const uint8_t*>(m.data);
  const uint8_t* w_end = w + (size_t)m.rows * m.row_bytes;
  const size_t first = (size_t)s.row0 * m.row_bytes, bytes = (size_t)s.rows * m.row_bytes;
  uint8_t* half = region + h * kHalfRegion;
  s.lead = lead_of(s);
  if (lane != 0) return;
  fence_before_bulk_copies();  // the warp's reads of this half (before its __syncwarp) first
  const SpanPieces rows = span_pieces(w + first, w + first + bytes, w_end);
  SpanPieces up = {};
  uint8_t* up_dst = half + (bytes + 15) / 16 * 16;
  if (ph.glu) {
    const auto* u = static_cast<const uint8_t*>(ph.matrices[1].data);
    up = span_pieces(u + first, u + first + bytes, u + (w_end - w));
  }
  // The copies' total is known before they start: expect it, then copy.
  barrier_expect(&ws.bars[h], 16u * (uint32_t)(rows.whole + up.whole));
  const auto copy = [&](const SpanPieces& span, uint8_t* dst) {
    if (span.whole > 0) bulk_copy(dst, span.first, 16u * span.whole, &ws.bars[h]);
    copy_span_tail(span, dst);
  };
  copy(rows, half);
  if (ph.glu) copy(up, up_dst);
}

// Waits until half h's copies have landed (every lane).
__device__ __forceinline__ void wait_half(WarpStream& ws, int h) {
  barrier_wait(&ws.bars[h], ws.parity[h]);
  ws.parity[h] ^= 1u;
}

// chunk_dot of chunk c of a staged Q4_K row against the shared int8 row.
__device__ __forceinline__ float staged_chunk_dot(const uint8_t* row, int c, const int8_t* codes,
                                                  const float2* scales) {
  using namespace q4k_chunk;
  const uint8_t* block = row + (size_t)(c / 4) * kSuperBlockBytes;
  const uint8_t* nibbles = block + 16 + 32 * (c % 4);
  Chunk ch;
  ch.head = *reinterpret_cast<const uint4*>(block);
  ch.lo = *reinterpret_cast<const uint4*>(nibbles);
  ch.hi = *reinterpret_cast<const uint4*>(nibbles + 16);
  const int4* x = reinterpret_cast<const int4*>(codes + 64 * c);
  return chunk_dot(ch, c % 4, x[0], x[1], x[2], x[3], reinterpret_cast<const float4*>(scales)[c]);
}

// Thread t (of T) of a Q4_K team: its chunks t, t + T, ... of the row, summed in order.
__device__ __forceinline__ float q4k_thread_sum(const uint8_t* row, int t, int team, int n_chunks,
                                                const int8_t* codes, const float2* scales) {
  float acc = 0.0f;
#pragma unroll 1
  for (int c = t; c < n_chunks; c += team) acc += staged_chunk_dot(row, c, codes, scales);
  return acc;
}

__device__ __forceinline__ float xor_sum(float v, int width) {
  for (int off = width / 2; off > 0; off /= 2) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

// The team total of a staged Q4_K row whose team is wider than a warp (every lane gets it).
__device__ __forceinline__ float q4k_wide_row(const uint8_t* row, int team, int n_chunks, int lane,
                                              const int8_t* codes, const float2* scales) {
  float total = 0.0f;
#pragma unroll 1
  for (int w = 0; w < team / 32; ++w)
    total += xor_sum(q4k_thread_sum(row, 32 * w + lane, team, n_chunks, codes, scales), 32);
  return total;
}

__device__ __forceinline__ void store_row(const PersistentPhase& ph, const Staged& s, int r,
                                          float gate, float up) {
  s.m->out[s.row0 + r] = ph.glu ? glu_value(ph.act, gate, up) : gate;
}

__device__ void q4k_group(const PersistentPhase& ph, const Staged& s, const uint8_t* half,
                          const int8_t* codes, const float2* scales, int lane) {
  const PersistentMatrix& m = *s.m;
  const int team = m.team, n_chunks = m.cols / 64;
  const uint8_t* up = half + ((size_t)s.rows * m.row_bytes + 15) / 16 * 16;
  if (team > 32) {
#pragma unroll 1
    for (int r = 0; r < s.rows; ++r) {
      const size_t at = (size_t)r * m.row_bytes;
      const float g = q4k_wide_row(half + at, team, n_chunks, lane, codes, scales);
      const float u = ph.glu ? q4k_wide_row(up + at, team, n_chunks, lane, codes, scales) : 0.0f;
      if (lane == 0) store_row(ph, s, r, g, u);
    }
    return;
  }
  const int per_pass = 32 / team, t = lane % team;
#pragma unroll 1
  for (int r0 = 0; r0 < s.rows; r0 += per_pass) {
    const int r = r0 + lane / team;
    const size_t at = (size_t)min(r, s.rows - 1) * m.row_bytes;
    const float g = xor_sum(q4k_thread_sum(half + at, t, team, n_chunks, codes, scales), team);
    const float u =
        ph.glu ? xor_sum(q4k_thread_sum(up + at, t, team, n_chunks, codes, scales), team) : 0.0f;
    if (t == 0 && r < s.rows) store_row(ph, s, r, g, u);
  }
}

__device__ void q6k_group(const Staged& s, const uint8_t* half, const int8_t* codes,
                          const float2* scales, int lane) {
  const PersistentMatrix& m = *s.m;
  const int team = m.team, per_pass = 32 / team, t = lane % team, half_units = m.cols / 128;
#pragma unroll 1
  for (int r0 = 0; r0 < s.rows; r0 += per_pass) {
    const int r = r0 + lane / team;
    float acc = 0.0f;
    if (r < s.rows) {
      const uint8_t* row = half + s.lead + (size_t)r * m.row_bytes;
#pragma unroll 1
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
        acc +=
            q6k::half_unit_dot(q6k::load_half_unit(row + (h / 2) * q6k::kBlockBytes, h % 2), x, xs);
      }
    }
    acc = xor_sum(acc, team);
    if (t == 0 && r < s.rows) m.out[s.row0 + r] = acc;
  }
}

// Every output row of the phase, the warp's groups g = its index, + the grid's warps, ...
// through the two halves of `region` (the first group in half 0, perhaps already staged by
// prefetch_first_group before the phase began).
__device__ __noinline__ void products(const PersistentPhase& ph, const int8_t* codes,
                                      const float2* scales, uint8_t* region, WarpStream& ws) {
  const int lane = threadIdx.x % 32, warps = gridDim.x * kWarps;
  const int total_rows = phase_rows(ph), groups = phase_groups(ph, total_rows);
  int g = blockIdx.x * kWarps + threadIdx.x / 32;
  const bool prefetched = ws.prefetched;
  ws.prefetched = false;
  if (g >= groups) return;
  Staged cur = group_at(ph, total_rows, g), next;
  if (prefetched)
    cur.lead = lead_of(cur);
  else
    stage_group(ph, cur, region, ws, 0, lane);
  const bool two = double_buffered(ph);
#pragma unroll 1
  for (int h = 0; g < groups; g += warps, h = two ? h ^ 1 : 0) {
    const bool more = g + warps < groups;
    if (more) next = group_at(ph, total_rows, g + warps);
    if (more && two) stage_group(ph, next, region, ws, h ^ 1, lane);
    wait_half(ws, h);
    __syncwarp();  // (and lane 0's 2-byte copies of a matrix's last bytes)
    const uint8_t* half = region + h * kHalfRegion;
    if (cur.m->type == PersistentMatrixType::kQ4K)
      q4k_group(ph, cur, half, codes, scales, lane);
    else
      q6k_group(cur, half, codes, scales, lane);
    __syncwarp();  // the buffer is free for a later group
    if (more && !two) stage_group(ph, next, region, ws, 0, lane);
    cur = next;
  }
}

// Before the barrier that ends a phase: starts copying the warp's first group of the next
// phase (weights never depend on the activations) into half 0, which the next phase then
// takes as staged. The warp's halves are idle here (its attention queries live in half 1).
__device__ void prefetch_first_group(const PersistentPhase& next_phase, uint8_t* region,
                                     WarpStream& ws) {
  if (next_phase.kind == PersistentPhaseKind::kAttention || next_phase.n_matrices == 0) return;
  const int total_rows = phase_rows(next_phase);
  const int g = blockIdx.x * kWarps + threadIdx.x / 32;
  if (g >= phase_groups(next_phase, total_rows)) return;
  Staged s = group_at(next_phase, total_rows, g);
  __syncwarp();
  stage_group(next_phase, s, region, ws, 0, threadIdx.x % 32);
  ws.prefetched = true;
}

}  // namespace hablar::cuda::persistent
