// Attention over the paged KV cache at long contexts, in one run:
//   - prompt: a chunk of P query tokens at depth D (causal), the tiled attention_batch beside
//     the one-head-at-a-time form (attention_one per token: every head reads its K/V again);
//   - decode: one token at depth D, the tiled form (keys split over the threads) beside the
//     one-head form, as GB/s of K/V read, next to a plain read of the same bytes
//     (read_through, the memory bound);
//   - verify: a speculative verification chunk of V tokens at depth D in the one-token (decode)
//     order, per token beside one decode token's time;
//   - the same tiled forms over Q8_0 and Q4_0 caches;
//   - each tiled case twice, with the AVX-512 stages and with the AVX2 ones (alternating
//     runs; the outputs must be the same bits).
//
//   build/bench/cpu/attention_bench [--threads=N] [--depth=D] [--prompt=P] [--heads=H/KV]
//                                   [--head-dim=HD] [--reps=R] [--verify=V] [--cpu-time]
//
// --cpu-time times the process's CPU time instead of the wall clock: with --threads=1 it
// measures the work alone on a busy host (GB/s figures are then per CPU-second).
//
// Defaults are Qwen2.5-0.5B's attention (14 query heads over 2 kv heads of 64), one layer.
// Times are the best of R runs (wall clock); ratios are AVX2 / AVX-512 in the same run.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/ops.h"
#include "backend/cpu/ops_x86.h"
#include "core/kv_layout.h"
#include "core/thread_pool.h"

namespace hablar::bench {
namespace {

struct Options {
  int threads = 2, depth = 4096, prompt = 512, n_heads = 14, n_kv_heads = 2, head_dim = 64;
  int reps = 3, verify = 9;
  bool cpu_time = false;  // time as the process's CPU time (a busy host's waits not counted)
};

bool g_cpu_time = false;

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const auto value = [&](const char* name) -> const char* {
      const std::string prefix = std::string("--") + name + "=";
      return a.rfind(prefix, 0) == 0 ? a.c_str() + prefix.size() : nullptr;
    };
    if (const char* v = value("threads"))
      o.threads = std::atoi(v);
    else if (const char* v = value("depth"))
      o.depth = std::atoi(v);
    else if (const char* v = value("prompt"))
      o.prompt = std::atoi(v);
    else if (const char* v = value("head-dim"))
      o.head_dim = std::atoi(v);
    else if (const char* v = value("reps"))
      o.reps = std::atoi(v);
    else if (const char* v = value("verify"))
      o.verify = std::atoi(v);
    else if (a == "--cpu-time")
      o.cpu_time = true;
    else if (const char* v = value("heads"))
      std::sscanf(v, "%d/%d", &o.n_heads, &o.n_kv_heads);
    else {
      std::fprintf(stderr, "unknown argument %s\n", a.c_str());
      std::exit(2);
    }
  }
  if (o.threads < 1 || o.depth < 1 || o.prompt < 1 || o.reps < 1 || o.verify < 1 ||
      o.n_kv_heads < 1 || o.n_heads % o.n_kv_heads != 0 || o.head_dim % 32 != 0) {
    std::fprintf(stderr, "bad arguments (head_dim must be a multiple of 32)\n");
    std::exit(2);
  }
  return o;
}

double now_seconds() {
  if (!g_cpu_time)
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

double best_seconds(int reps, const std::function<void()>& fn) {
  fn();  // warm-up
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const double t0 = now_seconds();
    fn();
    best = std::min(best, now_seconds() - t0);
  }
  return best;
}

// One layer's cache of n positions of random K/V, stored through kv_store.
struct Cache {
  KvCacheLayout layout;
  std::vector<uint16_t> data;
  std::vector<int32_t> table;
  Cache(const Options& o, int n, KvDType type) {
    layout.n_layers = 1, layout.n_kv_heads = o.n_kv_heads, layout.head_dim = o.head_dim;
    layout.block_size = kDefaultKvBlockSize;
    layout.n_blocks = (n + layout.block_size - 1) / layout.block_size;
    layout.dtype = type;
    data.resize(layout.total_elems());
    table.resize((size_t)layout.n_blocks);
    for (int b = 0; b < layout.n_blocks; ++b) table[(size_t)b] = (b * 7) % layout.n_blocks;
    std::mt19937 rng(1);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    std::vector<float> k((size_t)o.n_kv_heads * o.head_dim), v(k.size());
    for (int p = 0; p < n; ++p) {
      for (float& x : k) x = dist(rng);
      for (float& x : v) x = dist(rng);
      cpu::kv_store(data.data(), layout, 0, table.data(), p, k.data(), v.data());
    }
  }
  // K and V bytes of positions [0, n) of one layer.
  double bytes(int n) const { return (double)n * (double)layout.bytes_per_token(); }
};

std::vector<float> random_rows(size_t n) {
  std::mt19937 rng(2);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> x(n);
  for (float& v : x) v = dist(rng);
  return x;
}

// Queries at positions [first_pos, first_pos + n), each attending [0, pos].
std::vector<cpu::AttentionQuery> queries(const Cache& c, const Options& o, int first_pos, int n,
                                         const std::vector<float>& q, std::vector<float>& out,
                                         cpu::SumOrder order) {
  const size_t width = (size_t)o.n_heads * o.head_dim;
  out.assign((size_t)n * width, 0.0f);
  std::vector<cpu::AttentionQuery> qs;
  for (int i = 0; i < n; ++i)
    qs.push_back(
        {c.table.data(), first_pos + i, q.data() + i * width, out.data() + i * width, order, 0});
  return qs;
}

// Best times of the AVX-512 and the AVX2 stages (cpu::set_avx512_attention), the two run
// alternately so that a change in the host's load touches both.
struct Pair {
  double wide = 0, narrow = 0;
};
Pair best_pair(int reps, const std::function<void()>& fn) {
  Pair best{1e30, 1e30};
  for (int r = 0; r < reps; ++r)
    for (bool wide : {true, false}) {
      cpu::set_avx512_attention(wide);
      double& b = wide ? best.wide : best.narrow;
      b = std::min(b, best_seconds(1, fn));
    }
  cpu::set_avx512_attention(true);
  return best;
}

// Output of fn with the AVX-512 stages and with the AVX2 ones: the same bits?
bool same_bits(const std::function<void()>& fn, const std::vector<float>& out) {
  cpu::set_avx512_attention(true);
  fn();
  const std::vector<float> wide = out;
  cpu::set_avx512_attention(false);
  fn();
  cpu::set_avx512_attention(true);
  return std::memcmp(wide.data(), out.data(), out.size() * sizeof(float)) == 0;
}

void prompt_case(const Options& o, ThreadPool& pool, KvDType type) {
  const int n = o.depth + o.prompt;
  const Cache c(o, n, type);
  const std::vector<float> q = random_rows((size_t)o.prompt * o.n_heads * o.head_dim);
  std::vector<float> out_tiled, out_head;
  const auto qs = queries(c, o, o.depth, o.prompt, q, out_tiled, cpu::SumOrder::kLanes16);
  const auto run = [&] { cpu::attention_batch(c.data.data(), c.layout, 0, qs, o.n_heads, pool); };
  const Pair tiled = best_pair(o.reps, run);
  bool same = same_bits(run, out_tiled);
  std::string per_head_col = "-";
  if (type == KvDType::F16) {
    out_head.assign(out_tiled.size(), 0.0f);
    const size_t width = (size_t)o.n_heads * o.head_dim;
    const double per_head = best_seconds(o.reps, [&] {
      pool.run([&](int t, int nt) {
        for (int i = t; i < o.prompt; i += nt)
          cpu::attention_one(c.data.data(), c.layout, 0, c.table.data(), o.depth + i,
                             q.data() + i * width, o.n_heads, out_head.data() + i * width);
      });
    });
    same = same && std::memcmp(out_tiled.data(), out_head.data(), out_tiled.size() * 4) == 0;
    per_head_col = std::to_string(per_head * 1e3).substr(0, 7) + " ms";
  }
  std::printf("| prompt %d @ d%d, %s | %.2f ms | %.2f ms | %.2fx | %s | %s |\n", o.prompt, o.depth,
              kv_dtype_name(type), tiled.wide * 1e3, tiled.narrow * 1e3, tiled.narrow / tiled.wide,
              per_head_col.c_str(), same ? "identical" : "DIFFERENT");
}

void decode_case(const Options& o, ThreadPool& pool, KvDType type) {
  const int n = o.depth + 1;
  const Cache c(o, n, type);
  const std::vector<float> q = random_rows((size_t)o.n_heads * o.head_dim);
  std::vector<float> out;
  const auto qs = queries(c, o, o.depth, 1, q, out, cpu::SumOrder::kLanes64);
  const auto run = [&] { cpu::attention_batch(c.data.data(), c.layout, 0, qs, o.n_heads, pool); };
  const Pair tiled = best_pair(o.reps * 5, run);
  bool same = same_bits(run, out);
  // The plain read: the same threads reading the sequence's K/V bytes (the whole pools).
  const auto* bytes = reinterpret_cast<const uint8_t*>(c.data.data());
  const size_t total = c.layout.total_bytes() / 64 * 64;
  uint64_t sink = 0;
  const double read = best_seconds(o.reps * 5, [&] {
    pool.run([&](int t, int nt) {
      const IndexRange r = split_range((int64_t)total, t, nt, 64);
      const uint64_t x = cpu::read_through(bytes + r.begin, (size_t)(r.end - r.begin));
      if (t == 0) sink ^= x;
    });
  });
  const double gbs = c.bytes(n) / tiled.wide / 1e9, gbs2 = c.bytes(n) / tiled.narrow / 1e9;
  const double read_gbs = (double)total / read / 1e9;
  std::string per_head_col = "-";
  if (type == KvDType::F16) {
    std::vector<float> out_head(out.size());
    const double per_head = best_seconds(o.reps * 5, [&] {
      cpu::attention_one(c.data.data(), c.layout, 0, c.table.data(), o.depth, q.data(), o.n_heads,
                         out_head.data(), cpu::SumOrder::kLanes64);
    });
    same = same && std::memcmp(out.data(), out_head.data(), out.size() * 4) == 0;
    per_head_col = std::to_string(per_head * 1e3).substr(0, 6) + " ms";
  }
  std::printf(
      "| decode @ d%d, %s | %.3f ms | %.3f ms | %.2fx | %s | %s; K/V read at %.1f vs %.1f GB/s, "
      "plain read %.1f GB/s (%.0f%% vs %.0f%%) |\n",
      o.depth, kv_dtype_name(type), tiled.wide * 1e3, tiled.narrow * 1e3, tiled.narrow / tiled.wide,
      per_head_col.c_str(), same ? "identical" : "DIFFERENT", gbs, gbs2, read_gbs,
      100.0 * gbs / read_gbs, 100.0 * gbs2 / read_gbs);
}

// A verification chunk: V consecutive tokens of one sequence at depth D, each in the
// one-token order (what speculative decoding computes), against V separate decode calls.
void verify_case(const Options& o, ThreadPool& pool, KvDType type) {
  const int n = o.depth + o.verify;
  const Cache c(o, n, type);
  const std::vector<float> q = random_rows((size_t)o.verify * o.n_heads * o.head_dim);
  std::vector<float> out, one;
  const auto qs = queries(c, o, o.depth, o.verify, q, out, cpu::SumOrder::kLanes64);
  const auto run = [&] { cpu::attention_batch(c.data.data(), c.layout, 0, qs, o.n_heads, pool); };
  const Pair chunk = best_pair(o.reps * 3, run);
  const bool same = same_bits(run, out);
  const auto q1 = queries(c, o, o.depth, 1, q, one, cpu::SumOrder::kLanes64);
  const double decode = best_seconds(
      o.reps * 5, [&] { cpu::attention_batch(c.data.data(), c.layout, 0, q1, o.n_heads, pool); });
  std::printf(
      "| verify %d @ d%d, %s | %.3f ms | %.3f ms | %.2fx | - | %s; per token %.3f ms (AVX2), "
      "%.2fx one decode token's %.3f ms |\n",
      o.verify, o.depth, kv_dtype_name(type), chunk.wide * 1e3, chunk.narrow * 1e3,
      chunk.narrow / chunk.wide, same ? "identical" : "DIFFERENT", chunk.narrow / o.verify * 1e3,
      chunk.narrow / o.verify / decode, decode * 1e3);
}

}  // namespace
}  // namespace hablar::bench

int main(int argc, char** argv) {
  using namespace hablar;
  const bench::Options o = bench::parse(argc, argv);
  bench::g_cpu_time = o.cpu_time;
  ThreadPool pool(o.threads);
  std::printf("attention, %d threads, %d/%d heads x %d, one layer, %s\n\n", o.threads, o.n_heads,
              o.n_kv_heads, o.head_dim, o.cpu_time ? "process CPU time" : "wall time");
  std::printf(
      "| case | tiled, AVX-512 stages | tiled, AVX2 stages | AVX2 / AVX-512 | one head at a "
      "time | note |\n| --- | ---: | ---: | ---: | ---: | --- |\n");
  for (KvDType t : {KvDType::F16, KvDType::Q8_0, KvDType::Q4_0}) bench::prompt_case(o, pool, t);
  for (KvDType t : {KvDType::F16, KvDType::Q8_0, KvDType::Q4_0}) bench::decode_case(o, pool, t);
  bench::verify_case(o, pool, KvDType::F16);
  return 0;
}
