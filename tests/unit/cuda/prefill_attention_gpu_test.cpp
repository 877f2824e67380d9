// Prefill attention (causal, GQA, over the paged cache with a cached prefix) against a
// double-precision softmax over the K/V the test placed. Q, K, V and P pass through
// f16 / bf16 on the tensor cores: normalized error under 5e-3 (f16) and 2e-2 (bf16).
#include <algorithm>
#include <numeric>
#include <utility>

#include "backend/cuda/attention.h"
#include "core/fp16.h"
#include "cuda_test_util.h"
#include "kv_q8_twins.h"

namespace hablar::test {
namespace {

using cuda::DeviceBuffer;

struct PrefillCase {
  int heads = 8, kv_heads = 2, dim;
  std::vector<int32_t> cached, chunk;
  int blocks_per_seq;  // capacity blocks_per_seq * 16 positions
  KvCacheLayout layout;
  std::vector<int32_t> token_begin, tables;
  std::vector<uint16_t> cache;
  std::vector<float> q, k, v;
  int total = 0;

  PrefillCase(KvDType dtype, int head_dim, std::vector<int32_t> cached_len,
              std::vector<int32_t> chunk_len, int blocks)
      : dim(head_dim),
        cached(std::move(cached_len)),
        chunk(std::move(chunk_len)),
        blocks_per_seq(blocks) {
    const int n = (int)cached.size();
    layout = KvCacheLayout{1, kv_heads, dim, 16, n * blocks_per_seq, dtype};
    token_begin.assign(n + 1, 0);
    for (int s = 0; s < n; ++s) token_begin[s + 1] = token_begin[s] + chunk[s];
    total = token_begin[n];
    tables.resize((size_t)n * blocks_per_seq);
    std::iota(tables.begin(), tables.end(), 0);
    std::mt19937 rng(5);
    std::shuffle(tables.begin(), tables.end(), rng);
    const auto noise = random_floats(layout.total_elems(), 6u, -1.5f, 1.5f);
    cache.resize(noise.size());
    for (size_t i = 0; i < noise.size(); ++i) cache[i] = encode(noise[i]);
    q = random_floats((size_t)total * heads * dim, 7u);
    k = random_floats((size_t)total * kv_heads * dim, 8u, -1.5f, 1.5f);
    v = random_floats((size_t)total * kv_heads * dim, 9u, -1.5f, 1.5f);
  }
  uint16_t encode(float x) const {
    return layout.dtype == KvDType::F16 ? f32_to_fp16(x) : f32_to_bf16(x);
  }
  float decode(uint16_t b) const {
    return layout.dtype == KvDType::F16 ? fp16_to_f32(b) : bf16_to_f32(b);
  }
  // K or V of sequence s at position pos: from the cache for the prefix, else the chunk.
  double kv_at(int kv, int s, int pos, int kvh, int d) const {
    if (pos >= cached[s]) {
      const auto& src = kv == 0 ? k : v;
      const int token = token_begin[s] + pos - cached[s];
      return decode(encode(src[((size_t)token * kv_heads + kvh) * dim + d]));
    }
    const int32_t* table = &tables[(size_t)s * blocks_per_seq];
    return decode(cache[layout.position_offset(table, 0, kv, kvh, pos) + d]);
  }
  std::vector<double> oracle() const {
    std::vector<double> out((size_t)total * heads * dim, 0.0);
    for (int s = 0; s < (int)cached.size(); ++s)
      for (int i = 0; i < chunk[s]; ++i)
        for (int h = 0; h < heads; ++h) {
          const int kvh = h / (heads / kv_heads), pos = cached[s] + i;
          const int token = token_begin[s] + i;
          std::vector<double> sc(pos + 1);
          double mx = -1e300;
          for (int p = 0; p <= pos; ++p) {
            double dot = 0;
            for (int d = 0; d < dim; ++d)
              dot += (double)q[((size_t)token * heads + h) * dim + d] * kv_at(0, s, p, kvh, d);
            sc[p] = dot / std::sqrt((double)dim);
            mx = std::max(mx, sc[p]);
          }
          double sum = 0;
          for (double& x : sc) sum += (x = std::exp(x - mx));
          for (int p = 0; p <= pos; ++p)
            for (int d = 0; d < dim; ++d)
              out[((size_t)token * heads + h) * dim + d] += sc[p] / sum * kv_at(1, s, p, kvh, d);
        }
    return out;
  }
};

class PrefillAttentionGpu : public ::testing::TestWithParam<std::tuple<KvDType, int>> {};

// Runs the kernel over `cache_host` with `layout` (the case's by default; the cache it wrote
// comes back in cache_host) and returns its output; with `bf16_rows`, the output as bf16 rows
// alone (out null), returned there.
std::vector<float> run_prefill(const PrefillCase& c, const KvCacheLayout& layout,
                               std::vector<uint16_t>& cache_host, bool kv_stored,
                               std::vector<uint16_t>* bf16_rows = nullptr) {
  const int dim = c.dim;
  DeviceBuffer<uint16_t> cache(cache_host);
  DeviceBuffer<int32_t> tables(c.tables), begin(c.token_begin), cached(c.cached);
  DeviceBuffer<float> q(c.q), k(c.k), v(c.v);
  DeviceBuffer<float> out(std::vector<float>(c.q.size(), NAN));
  cuda::PrefillAttentionParams p;
  p.layout = layout;
  p.kv_stored = kv_stored;
  p.kv_cache = cache.get();
  p.n_seqs = (int)c.cached.size();
  p.block_tables = tables.get();
  p.max_blocks_per_seq = c.blocks_per_seq;
  p.token_begin = begin.get();
  p.cached_len = cached.get();
  p.total_tokens = c.total;
  p.max_chunk = *std::max_element(c.chunk.begin(), c.chunk.end());
  p.n_heads = c.heads;
  p.q = q.get();
  p.k_new = k.get();
  p.v_new = v.get();
  p.out = out.get();
  DeviceBuffer<uint16_t> rows(std::vector<uint16_t>(bf16_rows ? c.q.size() : 1, 0xffff));
  if (bf16_rows != nullptr) p.out = nullptr, p.out_bf16 = rows.get();
  p.scale = 1.0f / std::sqrt((float)dim);
  cuda::prefill_attention(p, nullptr);
  HABLAR_CUDA_CHECK(cudaDeviceSynchronize());
  cache_host = cache.download();
  if (bf16_rows != nullptr) *bf16_rows = rows.download();
  return out.download();
}

// Runs the kernel on the case and checks its output and the chunk's K/V in the cache.
void check_prefill_case(PrefillCase& c, KvDType dtype, int dim) {
  std::vector<uint16_t> got_cache = c.cache;
  const std::vector<float> out = run_prefill(c, c.layout, got_cache, false);
  const double tol = dtype == KvDType::F16 ? 5e-3 : 2e-2;
  EXPECT_LT(normalized_error(out, c.oracle()), tol);
  // The chunk's K/V landed in the cache at their positions.
  const int n_seqs = (int)c.cached.size();
  for (int s = 0; s < n_seqs; ++s)
    for (int i = 0; i < c.chunk[s]; ++i)
      for (int kv = 0; kv < 2; ++kv) {
        const int32_t* table = &c.tables[(size_t)s * c.blocks_per_seq];
        const size_t at = c.layout.position_offset(table, 0, kv, 1, c.cached[s] + i) + 3;
        EXPECT_EQ(c.decode(got_cache[at]), c.kv_at(kv, s, c.cached[s] + i, 1, 3));
      }
}

TEST_P(PrefillAttentionGpu, CausalGqaOverCachedPrefixMatchesOracle) {
  HABLAR_REQUIRE_CUDA_DEVICE();
  const auto [dtype, dim] = GetParam();
  PrefillCase c(dtype, dim, {0, 37, 5}, {100, 29, 1}, 16);
  check_prefill_case(c, dtype, dim);
}

// Chunks of several query tiles over prefixes of several key tiles: the two shared-memory
// stages alternate, tiles end mid-page, and the diagonal tile of each query tile is partial.
TEST_P(PrefillAttentionGpu, LongChunksOverLongPrefixesMatchOracle) {
  HABLAR_REQUIRE_CUDA_DEVICE();
  const auto [dtype, dim] = GetParam();
  PrefillCase c(dtype, dim, {0, 130, 64, 17}, {300, 70, 190, 64}, 32);
  check_prefill_case(c, dtype, dim);
}

// The output as the output projection's bf16 rows alone (out_bf16, no f32 rows): each value
// the f32 output rounded to nearest even, and the f32 buffer untouched.
TEST_P(PrefillAttentionGpu, Bf16RowsAloneAreTheRoundedOutput) {
  HABLAR_REQUIRE_CUDA_DEVICE();
  const auto [dtype, dim] = GetParam();
  PrefillCase c(dtype, dim, {0, 130, 64, 17}, {300, 70, 190, 64}, 32);
  std::vector<uint16_t> cache_f32 = c.cache, cache_bf16 = c.cache, rows;
  const std::vector<float> wide = run_prefill(c, c.layout, cache_f32, false);
  const std::vector<float> untouched = run_prefill(c, c.layout, cache_bf16, false, &rows);
  ASSERT_EQ(rows.size(), wide.size());
  size_t differ = 0;
  for (size_t i = 0; i < wide.size(); ++i) differ += rows[i] != f32_to_bf16(wide[i]);
  EXPECT_EQ(differ, 0u);
  EXPECT_TRUE(
      std::all_of(untouched.begin(), untouched.end(), [](float x) { return std::isnan(x); }));
}

// Q8_0 rows (kv_q8_twins.h): the prompt chunks' attention over them equals the attention over
// the F16 cache of the values the kernel reads from them, bit for bit, with the chunks' rows
// stored beforehand or by the scatter (which writes the CPU backend's rows).
TEST(PrefillAttentionGpuQ8, Q8CacheEqualsF16CacheOfItsValues) {
  HABLAR_REQUIRE_CUDA_DEVICE();
  for (int dim : {64, 128}) {
    PrefillCase c(KvDType::F16, dim, {0, 130, 64, 17}, {300, 70, 190, 64}, 32);
    KvQ8Twins stored = make_kv_q8_twins(c.layout, c.cache);
    KvQ8Twins bare = stored;
    for (int s = 0; s < (int)c.cached.size(); ++s) {
      const int32_t* table = &c.tables[(size_t)s * c.blocks_per_seq];
      for (int i = 0; i < c.chunk[s]; ++i)
        for (int h = 0; h < c.kv_heads; ++h) {
          const size_t row = ((size_t)(c.token_begin[s] + i) * c.kv_heads + h) * dim;
          stored.put_position(0, 0, table, h, c.cached[s] + i, &c.k[row]);
          stored.put_position(0, 1, table, h, c.cached[s] + i, &c.v[row]);
        }
    }
    const std::vector<float> want = run_prefill(c, stored.f16_layout, stored.f16, true);
    const std::vector<float> got = run_prefill(c, stored.q8_layout, stored.q8, true);
    const std::vector<float> scattered = run_prefill(c, bare.q8_layout, bare.q8, false);
    EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size() * sizeof(float)), 0) << dim;
    EXPECT_EQ(std::memcmp(scattered.data(), want.data(), want.size() * sizeof(float)), 0) << dim;
    EXPECT_TRUE(bare.q8 == stored.q8) << "the scatter's Q8_0 rows, head_dim " << dim;
    EXPECT_LT(normalized_error(got, c.oracle()), 5e-2) << "against the F16 prefix's oracle";
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, PrefillAttentionGpu,
                         ::testing::Combine(::testing::Values(KvDType::F16, KvDType::BF16),
                                            ::testing::Values(64, 128)),
                         [](const auto& info) {
                           return std::string(std::get<0>(info.param) == KvDType::F16 ? "F16"
                                                                                      : "BF16") +
                                  "_d" + std::to_string(std::get<1>(info.param));
                         });

}  // namespace
}  // namespace hablar::test
