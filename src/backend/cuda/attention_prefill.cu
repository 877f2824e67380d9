// Prefill attention: scatter a chunk of prompt tokens into the paged cache, then causal
// flash attention of those tokens over every cached position up to their own (GQA).
//
// Attention grid: (query tiles of 64, n_heads, n_seqs), 4 warps; warp w owns query rows
// 16w..16w+15 of the tile and holds them as mma A fragments of Q * scale. K/V tiles of 64
// positions are copied from the cache's pages into shared memory with cp.async, two stages
// (the next tile in flight while this one is used). Per tile, everything in registers:
//   S = Q · Kᵀ       mma.sync m16n8k16 (f16 or bf16 in, as the cache; f32 accumulation)
//   softmax          each lane holds 16 scores of two rows (g, g + 8); a tile state per row
//                    (causal mask), merged into the running state with softmax_merge
//                    (online_softmax.h: the same rescale as the decode path)
//   O = O * a + P·V  mma.sync, P's accumulator fragments reused as A fragments, V's B
//                    fragments through ldmatrix's transposing load, O in registers
// Fragment layouts: attention_mma.cuh. A block's query tiles are taken longest first (the
// causal tile q reads q + 1 key tiles), and a warp skips key tiles past its last row.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <string>

#include "backend/cuda/async_copy.cuh"
#include "backend/cuda/attention.h"
#include "backend/cuda/attention_mma.cuh"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kv_elements.cuh"
#include "backend/cuda/lab_knobs.h"
#include "backend/cuda/online_softmax.h"

namespace hablar::cuda {
namespace {

constexpr int kTile = 64, kWarps = 4, kPad = 8, kStages = 2;

// Sequence s's chunk: its first token row and its token count.
__device__ __forceinline__ int chunk_tokens(const PrefillAttentionParams& p, int s) {
  return p.token_count != nullptr ? p.token_count[s] : p.token_begin[s + 1] - p.token_begin[s];
}
__device__ __forceinline__ const int32_t* chunk_table(const PrefillAttentionParams& p, int s) {
  return p.block_tables +
         (size_t)(p.tables_per_token ? p.token_begin[s] : s) * p.max_blocks_per_seq;
}

// Grid (max_chunk, n_seqs), 256 threads: token i of sequence s's chunk. With Q8_0 rows each
// warp takes whole blocks of 32 dimensions (the early returns are the block's).
template <KvElem kElem>
__global__ void prefill_scatter_kernel(PrefillAttentionParams p) {
  const int s = blockIdx.y, i = blockIdx.x;
  if (i >= chunk_tokens(p, s)) return;
  const int token = p.token_begin[s] + i, pos = p.cached_len[s] + i;
  if (pos >= p.max_blocks_per_seq * p.layout.block_size) return;
  const int32_t* table = chunk_table(p, s);
  const int d_head = p.layout.head_dim, per_kv = p.layout.n_kv_heads * d_head;
  uint16_t* cache = static_cast<uint16_t*>(p.kv_cache);
  for (int i = threadIdx.x; i < 2 * per_kv; i += blockDim.x) {
    const int kv = i / per_kv, kvh = (i % per_kv) / d_head, d = i % d_head;
    const float value = (kv == 0 ? p.k_new : p.v_new)[(size_t)token * per_kv + kvh * d_head + d];
    kv_store_dim<kElem>(cache + p.layout.position_offset(table, p.layer, kv, kvh, pos), d, value);
  }
}

// Shared memory: two stages of a K tile and a V tile, kTile rows of kDim + 8 elements each
// (the padding puts the 8 rows a fragment load touches in distinct banks).
template <int kDim>
struct PrefillSmem {
  static constexpr int kLd = kDim + kPad;
  static constexpr int kTileElems = kTile * kLd;
  static constexpr size_t kBytes = sizeof(uint16_t) * 2 * kStages * kTileElems;
};

// What a lane knows of its two query rows (g and g + 8 of its warp's 16).
struct LaneRows {
  int query[2];  // index within the chunk
  int pos[2];    // cache position: the last key the row may see
};

// How a block's threads share the copies of a K/V tile: thread x copies 16-byte piece
// x % kPieces of rows x / kPieces + i * kRowStep, i < kRows.
template <int kDim>
struct TileCopy {
  static constexpr int kPieces = kDim / 8;
  static constexpr int kRowStep = kWarps * 32 / kPieces;
  static constexpr int kRows = kTile / kRowStep;
};

// The cache blocks (pages) that hold the thread's rows of the tile at t0, -1 past last_pos.
// Loaded a tile ahead of the copies that use them, so that the table's latency hides behind
// a tile's work instead of stalling each copy.
template <int kDim>
__device__ __forceinline__ void load_tile_pages(const int32_t* table, int block_size, int t0,
                                                int last_pos,
                                                int32_t (&page)[TileCopy<kDim>::kRows]) {
  using C = TileCopy<kDim>;
  const int r0 = threadIdx.x / C::kPieces;
#pragma unroll
  for (int i = 0; i < C::kRows; ++i) {
    const int pos = t0 + r0 + i * C::kRowStep;
    page[i] = pos <= last_pos ? __ldg(table + pos / block_size) : -1;
  }
}

// Where the thread's 16-byte pieces of K and V rows live: unit offset
// base + page * page_stride + slot * row (KvCacheLayout::offset with everything but the page
// and the slot fixed for the block's layer, KV head and the thread's column; column 0, the
// row's start, for Q8_0 rows, whose pieces kv_q8_load8 finds). Only the two bases are held:
// the strides come from the kernel's parameters (constant memory), keeping the registers of
// the fragments below within the budget of three blocks a multiprocessor.
struct CopyOffsets {
  size_t k_base, v_base;
  __device__ CopyOffsets(const PrefillAttentionParams& p, int kvh, int column) {
    k_base = p.layout.offset(p.layer, 0, 0, kvh, 0, column);
    v_base = p.layout.offset(p.layer, 1, 0, kvh, 0, column);
  }
};

// Issues the cp.async copies of the K and V rows of positions [t0, t0 + kTile) into one
// stage, from the pages load_tile_pages found; rows past last_pos (page -1) are zero-filled
// (their scores are masked, and a zero V row keeps P · V finite). Q8_0 rows are read and
// stored as f16 at once (kv_q8_load8), not copied asynchronously.
template <KvElem kElem, int kDim>
__device__ __forceinline__ void issue_kv_tile(const PrefillAttentionParams& p,
                                              const uint16_t* cache, const CopyOffsets& at,
                                              const int32_t (&page)[TileCopy<kDim>::kRows], int t0,
                                              uint16_t* k_stage, uint16_t* v_stage) {
  using L = PrefillSmem<kDim>;
  using C = TileCopy<kDim>;
  const KvCacheLayout& l = p.layout;
  const int r0 = threadIdx.x / C::kPieces, c = (threadIdx.x % C::kPieces) * 8;
#pragma unroll
  for (int i = 0; i < C::kRows; ++i) {
    const int r = r0 + i * C::kRowStep;
    const bool valid = page[i] >= 0;
    const size_t blk = valid ? (size_t)page[i] : 0, slot = (size_t)((t0 + r) % l.block_size);
    const uint16_t* k_row = cache + at.k_base + blk * l.block_elems(0) + slot * l.row_units(0);
    const uint16_t* v_row = cache + at.v_base + blk * l.block_elems(1) + slot * l.row_units(1);
    if constexpr (kElem == KvElem::kQ8_0) {
      const uint4 zero = make_uint4(0, 0, 0, 0);
      *reinterpret_cast<uint4*>(k_stage + r * L::kLd + c) = valid ? kv_q8_load8(k_row, c) : zero;
      *reinterpret_cast<uint4*>(v_stage + r * L::kLd + c) = valid ? kv_q8_load8(v_row, c) : zero;
    } else {
      copy16_async_or_zero(k_stage + r * L::kLd + c, k_row, valid);
      copy16_async_or_zero(v_stage + r * L::kLd + c, v_row, valid);
    }
  }
  commit_async();
}

// S = Q · Kᵀ for the warp's 16 rows and the tile's 64 keys: s[j] holds keys 8j + 2t, + 1 of
// rows g and g + 8. K's B fragments come through ldmatrix, two 8-key tiles per load (lanes
// 0-15 address keys 8j + lane % 8 at columns 16kk and 16kk + 8, lanes 16-31 the next 8 keys).
template <bool kBf16, int kDim>
__device__ __forceinline__ void tile_scores(const uint32_t (&qa)[kDim / 16][4],
                                            const uint16_t* k_stage, int lane,
                                            float (&s)[kTile / 8][4]) {
  using L = PrefillSmem<kDim>;
#pragma unroll
  for (int j = 0; j < kTile / 8; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
  const uint16_t* key_rows = k_stage + (8 * (lane / 16) + lane % 8) * L::kLd + 8 * ((lane / 8) % 2);
#pragma unroll
  for (int j = 0; j < kTile / 8; j += 2)
#pragma unroll
    for (int kk = 0; kk < kDim / 16; ++kk) {
      uint32_t b[4];
      ldmatrix_x4(key_rows + 8 * j * L::kLd + 16 * kk, b);
      mma_m16n8k16<kBf16>(s[j], qa[kk], b[0], b[1]);
      mma_m16n8k16<kBf16>(s[j + 1], qa[kk], b[2], b[3]);
    }
}

// The tile's softmax state per row (causal mask, where `mask` says the tile reaches past a
// row of the warp: key t0 + col is seen by a row whose position is at least that), merged
// into the running state; s becomes the weights P scaled by the
// merge's factor_b, and factor_a[i] is what row i's accumulator is rescaled by.
__device__ __forceinline__ void tile_softmax(const LaneRows& rows, int t0, int t, bool mask,
                                             float (&s)[kTile / 8][4], SoftmaxState (&state)[2],
                                             float (&factor_a)[2]) {
  float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int j = 0; j < kTile / 8; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int i = e / 2, key = t0 + 8 * j + 2 * t + (e & 1);
      if (mask && key > rows.pos[i]) s[j][e] = -INFINITY;
      tile_max[i] = fmaxf(tile_max[i], s[j][e]);
    }
  float tile_sum[2] = {0.0f, 0.0f};
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    tile_max[i] = fmaxf(tile_max[i], __shfl_xor_sync(0xffffffffu, tile_max[i], 1));
    tile_max[i] = fmaxf(tile_max[i], __shfl_xor_sync(0xffffffffu, tile_max[i], 2));
  }
#pragma unroll
  for (int j = 0; j < kTile / 8; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int i = e / 2;
      s[j][e] = s[j][e] == -INFINITY ? 0.0f : softmax_exp(s[j][e] - tile_max[i]);
      tile_sum[i] += s[j][e];
    }
  float factor_b[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    tile_sum[i] += __shfl_xor_sync(0xffffffffu, tile_sum[i], 1);
    tile_sum[i] += __shfl_xor_sync(0xffffffffu, tile_sum[i], 2);
    const SoftmaxMerge merge = softmax_merge(state[i], SoftmaxState{tile_max[i], tile_sum[i]});
    factor_a[i] = merge.factor_a;
    factor_b[i] = merge.factor_b;
  }
#pragma unroll
  for (int j = 0; j < kTile / 8; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) s[j][e] *= factor_b[e / 2];
}

// O = O * factor_a + P · V: P's C fragments (two adjacent 8-key tiles) are the A fragment of
// a 16-key step; V's B fragments come through ldmatrix's transposing load, two 8-column
// tiles per load (lanes 0-15 address the step's 16 key rows at column 8dj, lanes 16-31 at
// column 8dj + 8).
template <bool kBf16, int kDim>
__device__ __forceinline__ void tile_values(const float (&s)[kTile / 8][4],
                                            const float (&factor_a)[2], const uint16_t* v_stage,
                                            int lane, float (&o)[kDim / 8][4]) {
  using L = PrefillSmem<kDim>;
#pragma unroll
  for (int dj = 0; dj < kDim / 8; ++dj) {
    o[dj][0] *= factor_a[0];
    o[dj][1] *= factor_a[0];
    o[dj][2] *= factor_a[1];
    o[dj][3] *= factor_a[1];
  }
#pragma unroll
  for (int kk = 0; kk < kTile / 16; ++kk) {
    uint32_t pa[4];
    p_fragment<kBf16>(s, kk, pa);
    const uint16_t* v_rows = v_stage + (16 * kk + lane % 16) * L::kLd + 8 * (lane / 16);
#pragma unroll
    for (int dj = 0; dj < kDim / 8; dj += 2) {
      uint32_t b[4];
      ldmatrix_x4_trans(v_rows + 8 * dj, b);
      mma_m16n8k16<kBf16>(o[dj], pa, b[0], b[1]);
      mma_m16n8k16<kBf16>(o[dj + 1], pa, b[2], b[3]);
    }
  }
}

// kMinBlocks: the blocks a multiprocessor must hold at once, which bounds the registers a
// thread may use (3 blocks of 128 threads: 168; the shared memory holds 3 blocks of 70 KB).
template <KvElem kElem, int kDim, int kMinBlocks>
__global__ void __launch_bounds__(kWarps * 32, kMinBlocks)
    prefill_attention_kernel(PrefillAttentionParams p) {
  constexpr bool kBf16 = kv_elem_bf16(kElem);  // the products' inputs (f16 for Q8_0 rows)
  using L = PrefillSmem<kDim>;
  extern __shared__ __align__(128) unsigned char smem[];
  uint16_t* stages = reinterpret_cast<uint16_t*>(smem);  // [stage][K, V][kTile][kLd]

  const int s = blockIdx.z, head = blockIdx.y;
  const int first = p.token_begin[s], chunk = chunk_tokens(p, s);
  const int n_query_tiles = (chunk + kTile - 1) / kTile;
  if ((int)blockIdx.x >= n_query_tiles) return;
  const int q0 = (n_query_tiles - 1 - blockIdx.x) * kTile;  // the longest tiles start first
  const int cached = p.cached_len[s];
  const int kvh = head / (p.n_heads / p.layout.n_kv_heads);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int32_t* table = chunk_table(p, s);
  const int last_pos = cached + min(chunk, q0 + kTile) - 1;  // the tile's last query

  // Tile 0's copies in flight while Q loads; tile 1's pages loading.
  const int block_size = p.layout.block_size;
  const uint16_t* cache = static_cast<const uint16_t*>(p.kv_cache);
  const CopyOffsets copy_at(
      p, kvh, kElem == KvElem::kQ8_0 ? 0 : (threadIdx.x % TileCopy<kDim>::kPieces) * 8);
  int32_t page[TileCopy<kDim>::kRows];
  load_tile_pages<kDim>(table, block_size, 0, last_pos, page);
  issue_kv_tile<kElem, kDim>(p, cache, copy_at, page, 0, stages, stages + L::kTileElems);
  load_tile_pages<kDim>(table, block_size, kTile, last_pos, page);

  // The warp's query rows as A fragments of Q * scale (rows past the chunk are zero).
  LaneRows rows;
  for (int i = 0; i < 2; ++i) {
    rows.query[i] = q0 + warp * 16 + g + 8 * i;
    rows.pos[i] = cached + rows.query[i];
  }
  uint32_t qa[kDim / 16][4];
#pragma unroll
  for (int kk = 0; kk < kDim / 16; ++kk)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int i = e % 2, col = 16 * kk + 2 * t + 8 * (e / 2);
      float2 x = make_float2(0.0f, 0.0f);
      if (rows.query[i] < chunk)
        x = *reinterpret_cast<const float2*>(
            p.q + ((size_t)(first + rows.query[i]) * p.n_heads + head) * kDim + col);
      qa[kk][e] = pack_pair<kBf16>(x.x * p.scale, x.y * p.scale);
    }
  float o[kDim / 8][4];
#pragma unroll
  for (int dj = 0; dj < kDim / 8; ++dj) o[dj][0] = o[dj][1] = o[dj][2] = o[dj][3] = 0.0f;
  SoftmaxState state[2] = {softmax_empty(), softmax_empty()};
  // Tiles past the warp's last row are masked for all its rows: skipped (warp-uniform).
  const int warp_first_pos = cached + q0 + warp * 16;
  const int warp_last_pos = min(warp_first_pos + 15, last_pos);
  const bool warp_live = q0 + warp * 16 < chunk;

  for (int t0 = 0, stage = 0; t0 <= last_pos; t0 += kTile, stage ^= 1) {
    // Prefetch the next tile into the other stage, then wait for this one.
    if (t0 + kTile <= last_pos) {
      uint16_t* next = stages + (stage ^ 1) * 2 * L::kTileElems;
      issue_kv_tile<kElem, kDim>(p, cache, copy_at, page, t0 + kTile, next, next + L::kTileElems);
      load_tile_pages<kDim>(table, block_size, t0 + 2 * kTile, last_pos, page);
      wait_async_but<1>();
    } else {
      wait_async_all();
    }
    __syncthreads();
    if (warp_live && t0 <= warp_last_pos) {
      const uint16_t* k_stage = stages + stage * 2 * L::kTileElems;
      float sc[kTile / 8][4], factor_a[2];
      tile_scores<kBf16, kDim>(qa, k_stage, lane, sc);
      tile_softmax(rows, t0, t, t0 + kTile - 1 > warp_first_pos, sc, state, factor_a);
      tile_values<kBf16, kDim>(sc, factor_a, k_stage + L::kTileElems, lane, o);
    }
    __syncthreads();  // every warp is done with this stage before it is refilled
  }

  for (int i = 0; i < 2; ++i) {
    if (rows.query[i] >= chunk) continue;
    const float inv = softmax_inverse_sum(state[i]);
    const size_t at = ((size_t)(first + rows.query[i]) * p.n_heads + head) * kDim + 2 * t;
#pragma unroll
    for (int dj = 0; dj < kDim / 8; ++dj) {
      const float2 pair = make_float2(o[dj][2 * i] * inv, o[dj][2 * i + 1] * inv);
      if (p.out != nullptr) *reinterpret_cast<float2*>(p.out + at + 8 * dj) = pair;
      if (p.out_bf16 != nullptr)
        *reinterpret_cast<__nv_bfloat162*>(p.out_bf16 + at + 8 * dj) = __float22bfloat162_rn(pair);
    }
  }
}

template <KvElem kElem, int kDim, int kMinBlocks>
void launch_prefill_kernel(const PrefillAttentionParams& p, cudaStream_t stream) {
  const size_t smem = PrefillSmem<kDim>::kBytes;
  auto kernel = prefill_attention_kernel<kElem, kDim, kMinBlocks>;
  HABLAR_CUDA_CHECK(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
  const dim3 grid((p.max_chunk + kTile - 1) / kTile, p.n_heads, p.n_seqs);
  kernel<<<grid, kWarps * 32, smem, stream>>>(p);
  HABLAR_CUDA_CHECK_LAUNCH();
}

// Three blocks a multiprocessor (the lab's HABLAR_PREFILL_BLOCKS=2 lets the compiler use up
// to 255 registers a thread, two blocks: the earlier form, for comparison).
template <KvElem kElem, int kDim>
void launch_prefill(const PrefillAttentionParams& p, cudaStream_t stream) {
  if (lab_knob("HABLAR_PREFILL_BLOCKS", 3) == 2)
    launch_prefill_kernel<kElem, kDim, 1>(p, stream);
  else
    launch_prefill_kernel<kElem, kDim, 3>(p, stream);
}

template <KvElem kElem>
void prefill_for_dtype(const PrefillAttentionParams& p, cudaStream_t stream) {
  if (!p.kv_stored) {
    prefill_scatter_kernel<kElem><<<dim3(p.max_chunk, p.n_seqs), 256, 0, stream>>>(p);
    HABLAR_CUDA_CHECK_LAUNCH();
  }
  if (p.layout.head_dim == 64)
    launch_prefill<kElem, 64>(p, stream);
  else
    launch_prefill<kElem, 128>(p, stream);
}

}  // namespace

void prefill_attention(const PrefillAttentionParams& p, cudaStream_t stream) {
  auto fail = [](const std::string& what) {
    throw_error(ErrorKind::kInvalidArgument, "prefill_attention: " + what);
  };
  if (p.layout.head_dim != 64 && p.layout.head_dim != 128)
    fail("head_dim " + std::to_string(p.layout.head_dim) + " is not supported (64, 128)");
  if (p.layout.n_kv_heads <= 0 || p.n_heads % p.layout.n_kv_heads != 0)
    fail("n_heads is not a multiple of n_kv_heads");
  if (p.layer < 0 || p.layer >= p.layout.n_layers) fail("layer out of range");
  if (p.n_seqs <= 0 || p.total_tokens <= 0 || p.max_chunk <= 0) fail("empty batch");
  if (!p.kv_cache || !p.block_tables || !p.token_begin || !p.cached_len || !p.q || !p.k_new ||
      !p.v_new || (!p.out && !p.out_bf16))
    fail("a required device pointer is null");
  if (const std::string why = cuda_kv_layout_problem(p.layout); !why.empty()) fail(why);
  switch (kv_elem_of(p.layout.dtype)) {
    case KvElem::kBf16:
      prefill_for_dtype<KvElem::kBf16>(p, stream);
      break;
    case KvElem::kQ8_0:
      prefill_for_dtype<KvElem::kQ8_0>(p, stream);
      break;
    default:
      prefill_for_dtype<KvElem::kF16>(p, stream);
      break;
  }
}

}  // namespace hablar::cuda
