// AVX-512 kernels of the embedding step (see embed_kernels.h for what each computes and why
// the GEMM's results equal cpu::matmul's bit for bit). Built with AVX-512 F/BW/VL/DQ + F16C.
#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <vector>

#include "backend/cpu/embed_kernels.h"
#include "backend/cpu/ops.h"
#include "core/error.h"

#define HABLAR_INLINE __attribute__((always_inline)) inline

namespace hablar::cpu::embed {
namespace {

constexpr int kTileTokens = 5;                 // NT: tokens of a register tile
constexpr int kTileRows = 5;                   // NR: weight rows of a register tile
constexpr int64_t kChunkRows = kTileRows * 8;  // rows a thread claims at once
constexpr int64_t kBlockBytes = 640 * 1024;    // x rows of a token block (within a 1 MiB L2)
constexpr int64_t kBlockCols = 1024;  // columns per pass over a token tile (L1-sized x rows)

// The horizontal sum of cpu::matmul's AVX-512 float tile: the halves added, then 8 lanes as
// ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7)).
HABLAR_INLINE float hsum16(__m512 v) {
  const __m256 h = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

HABLAR_INLINE float gelu_one(float v, const float* table) {
  if (v <= -10.0f) return 0.0f;
  if (v >= 10.0f) return v;
  return table[_cvtss_sh(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)];
}

template <bool kF16>
HABLAR_INLINE __m512 load_w(const uint8_t* row, int64_t c) {
  if constexpr (kF16) {
    return _mm512_cvtph_ps(
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + c * (int64_t)sizeof(uint16_t))));
  } else {
    return _mm512_loadu_ps(reinterpret_cast<const float*>(row) + c);
  }
}

// Where a tile's accumulators start and end: zero or the scratch before the columns
// [c0, c1); the scratch, or the sums (+ epilogue) into y after them.
struct alignas(64) Lanes {
  float v[16];
};
struct TileIo {
  Lanes* scratch;  // [NT][NR]
  bool first, last;
  float* y;  // y[t * y_stride + r]
  int64_t y_stride;
  const float* bias;  // [NR] of this tile, or null
  const float* gelu;  // the GELU table, or null
};

template <bool kF16, int NT, int NR>
HABLAR_INLINE void tile(const uint8_t* const* rows, const float* x, int64_t x_stride, int64_t c0,
                        int64_t c1, const TileIo& io) {
  __m512 acc[NT][NR];
  for (int t = 0; t < NT; ++t)
    for (int r = 0; r < NR; ++r)
      acc[t][r] = io.first ? _mm512_setzero_ps() : _mm512_load_ps(io.scratch[t * NR + r].v);
  for (int64_t c = c0; c < c1; c += 16) {
    __m512 w[NR];
    for (int r = 0; r < NR; ++r) w[r] = load_w<kF16>(rows[r], c);
    for (int t = 0; t < NT; ++t) {
      const __m512 xv = _mm512_loadu_ps(x + t * x_stride + c);
      for (int r = 0; r < NR; ++r) acc[t][r] = _mm512_fmadd_ps(w[r], xv, acc[t][r]);
    }
  }
  if (!io.last) {
    for (int t = 0; t < NT; ++t)
      for (int r = 0; r < NR; ++r) _mm512_store_ps(io.scratch[t * NR + r].v, acc[t][r]);
    return;
  }
  for (int t = 0; t < NT; ++t) {
    for (int r = 0; r < NR; ++r) {
      float v = hsum16(acc[t][r]);
      if (io.bias) v = v + io.bias[r];
      if (io.gelu) v = gelu_one(v, io.gelu);
      io.y[t * io.y_stride + r] = v;
    }
  }
}

// Rows [r0, r0 + NR) of tokens [t0, t0 + NT), columns [c0, c1).
template <bool kF16, int NT, int NR>
void tile_at(const GemmJob& job, const float* x, int64_t t0, int64_t r0, int64_t c0, int64_t c1,
             Lanes* scratch) {
  const WeightView& w = *job.w;
  const uint8_t* rows[NR];
  for (int r = 0; r < NR; ++r) rows[r] = w.row(r0 + r);
  const TileIo io{scratch,
                  c0 == 0,
                  c1 == w.cols,
                  job.y + t0 * w.rows + r0,
                  w.rows,
                  job.epilogue.bias ? job.epilogue.bias + r0 : nullptr,
                  job.epilogue.gelu ? gelu_table() : nullptr};
  tile<kF16, NT, NR>(rows, x + t0 * w.cols, w.cols, c0, c1, io);
}

// The tile of nt <= NT tokens x n_rows <= NR rows: the full one, or a shorter one at the
// tokens' or the chunk's end (each size its own instance, all with the same lane operations).
template <bool kF16, int NT, int NR>
void tile_sized(int nt, int n_rows, const GemmJob& job, const float* x, int64_t t0, int64_t r0,
                int64_t c0, int64_t c1, Lanes* scratch) {
  if constexpr (NT > 1) {
    if (nt < NT) return tile_sized<kF16, NT - 1, NR>(nt, n_rows, job, x, t0, r0, c0, c1, scratch);
  }
  if constexpr (NR > 1) {
    if (n_rows < NR)
      return tile_sized<kF16, NT, NR - 1>(nt, n_rows, job, x, t0, r0, c0, c1, scratch);
  }
  tile_at<kF16, NT, NR>(job, x, t0, r0, c0, c1, scratch);
}

// Every token over rows [r_begin, r_end) of one job: token tiles outermost, so the chunk's
// weight rows are read from L2 once per tile while the tile's x rows stay in L1.
template <bool kF16>
void chunk(const GemmJob& job, const float* x, int64_t t_begin, int64_t t_end, int64_t r_begin,
           int64_t r_end) {
  const int64_t cols = job.w->cols;
  const int64_t n_tiles = (r_end - r_begin + kTileRows - 1) / kTileRows;
  thread_local std::vector<Lanes> scratch;
  if (cols > kBlockCols) scratch.resize((size_t)(n_tiles * kTileTokens * kTileRows));
  for (int64_t t = t_begin; t < t_end;) {
    const int64_t nt = std::min<int64_t>(kTileTokens, t_end - t);
    for (int64_t c0 = 0; c0 < cols; c0 += kBlockCols) {
      const int64_t c1 = std::min(cols, c0 + kBlockCols);
      for (int64_t i = 0; i < n_tiles; ++i) {
        const int64_t r0 = r_begin + i * kTileRows;
        const int n_rows = (int)std::min<int64_t>(kTileRows, r_end - r0);
        Lanes* sc = scratch.empty() ? nullptr : scratch.data() + i * kTileTokens * kTileRows;
        tile_sized<kF16, kTileTokens, kTileRows>((int)nt, n_rows, job, x, t, r0, c0, c1, sc);
      }
    }
    t += nt;
  }
}

// x rounded to half precision (and back), as llama.cpp converts F16 products' activations.
void round_rows(const float* x, int64_t n, float* out) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(
        out + i, _mm512_cvtph_ps(_mm512_cvtps_ph(_mm512_loadu_ps(x + i),
                                                 _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)));
  for (; i < n; ++i)
    out[i] = _cvtsh_ss(_cvtss_sh(x[i], _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

}  // namespace

void float_gemm(std::span<const GemmJob> jobs, const float* x, int64_t n_tokens, ThreadPool& pool) {
  if (jobs.empty() || n_tokens == 0) return;
  const int64_t cols = jobs[0].w->cols;
  const bool f16 = jobs[0].w->type == DType::F16;
  for (const GemmJob& j : jobs)
    HABLAR_CHECK(j.w->cols == cols && (j.w->type == DType::F16) == f16 && float_gemm_supports(*j.w),
                 "float_gemm: the jobs' weights differ in columns or type");
  const float* in = x;
  thread_local std::vector<float> rounded;  // the caller's (a worker's name would be its own)
  if (f16) {
    rounded.resize((size_t)(n_tokens * cols));
    float* dst = rounded.data();
    pool.run([&](int i, int n) {
      const IndexRange r = split_range(n_tokens, i, n);
      round_rows(x + r.begin * cols, (r.end - r.begin) * cols, dst + r.begin * cols);
    });
    in = dst;
  }
  std::vector<int64_t> first_chunk(jobs.size() + 1, 0);  // chunks numbered over all jobs
  for (size_t j = 0; j < jobs.size(); ++j)
    first_chunk[j + 1] = first_chunk[j] + (jobs[j].w->rows + kChunkRows - 1) / kChunkRows;
  // Units of (token block, row chunk), the chunks of one token block first: a block's x rows
  // (about kBlockBytes) stay in L2 while the thread walks its chunks' weights.
  const int64_t block = std::max<int64_t>(
      16, kBlockBytes / (cols * (int64_t)sizeof(float)) / kTileTokens * kTileTokens);
  const int64_t n_chunks = first_chunk.back();
  const int64_t n_units = (n_tokens + block - 1) / block * n_chunks;
  std::atomic<int64_t> next{0};
  pool.run([&](int, int) {
    for (int64_t u = next.fetch_add(1); u < n_units; u = next.fetch_add(1)) {
      const int64_t t0 = u / n_chunks * block, t1 = std::min(n_tokens, t0 + block);
      const int64_t c = u % n_chunks;
      size_t j = 0;
      while (c >= first_chunk[j + 1]) ++j;
      const int64_t r0 = (c - first_chunk[j]) * kChunkRows;
      const int64_t r1 = std::min(jobs[j].w->rows, r0 + kChunkRows);
      if (f16) {
        chunk<true>(jobs[j], in, t0, t1, r0, r1);
      } else {
        chunk<false>(jobs[j], in, t0, t1, r0, r1);
      }
    }
  });
}

void gelu_inplace(float* x, int64_t n) {
  const float* table = gelu_table();
  int64_t i = 0;
  const __m512 lo = _mm512_set1_ps(-10.0f), hi = _mm512_set1_ps(10.0f);
  for (; i + 16 <= n; i += 16) {
    const __m512 v = _mm512_loadu_ps(x + i);
    const __m256i h = _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 g = _mm512_i32gather_ps(_mm512_cvtepu16_epi32(h), table, 4);
    g = _mm512_mask_mov_ps(g, _mm512_cmp_ps_mask(v, lo, _CMP_LE_OQ), _mm512_setzero_ps());
    g = _mm512_mask_mov_ps(g, _mm512_cmp_ps_mask(v, hi, _CMP_GE_OQ), v);
    _mm512_storeu_ps(x + i, g);
  }
  for (; i < n; ++i) x[i] = gelu_one(x[i], table);
}

}  // namespace hablar::cpu::embed
