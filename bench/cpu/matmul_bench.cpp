// matmul speed per weight type at decode (1 token), batched decode (8 sequences' sampled
// tokens, "8d": each token in the one-token order, as the forward gives them) and prefill
// (128 tokens) shapes, and at
// decode on an output head larger than the caches (memory-bound, like decode itself), hablar
// beside ggml (llama.cpp's CPU kernels, loaded at run time when present), plus the machine's
// memory bandwidth (a STREAM-like read and copy) that bounds decode.
//
//   build-*/bench/cpu/cpu_bench [--threads=N] [--cpu-time] [--isa=avx2] [google-benchmark flags]
//
// Counters: GB/s = weight bytes / time (compare with the read bandwidth at decode);
// GFLOP/s = 2 * rows * cols * tokens / time. The closing table gives hablar / ggml ratios.
#include <benchmark/benchmark.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/embed_kernels.h"
#include "backend/cpu/matmul_internal.h"
#include "backend/cpu/ops.h"
#include "core/cpu_features.h"
#include "core/quant.h"
#include "ggml_peer.h"

namespace hablar::bench {
namespace {

int g_threads = 2;
// Rates from CPU time instead of wall time (meaningful with --threads=1 on a busy machine).
bool g_cpu_time = false;
// hablar's kernels for this instruction set (--isa=scalar|avx2|avx512; default the best).
cpu::Isa g_isa = cpu::best_isa();

ThreadPool& pool() {
  static ThreadPool p(g_threads);
  return p;
}

struct Shape {
  int64_t rows, cols;
};
// SmolLM2-135M FFN up/down and Qwen2.5-0.5B FFN up/down: rows x cols (out x in). These fit in
// the last-level cache, so they time the kernels' arithmetic.
const Shape kShapes[] = {{1536, 576}, {576, 1536}, {4864, 896}, {896, 4864}};
// Qwen2.5-0.5B's attention projections (q/o and k/v): small enough for the L2 cache. Rows of
// 896 values do not fit the K formats' 256-value blocks: its Q4_K_M mix stores them as Q5_0
// (and some as Q8_0), as llama.cpp's quantizer does.
const Shape kAttentionShapes[] = {{896, 896}, {128, 896}};
const DType kAttentionTypes[] = {DType::Q8_0, DType::Q5_0};
// Qwen2.5-0.5B's tied output head (136 MB in Q8_0): far larger than the caches, so at one token
// it times how well a kernel streams weights from memory, as decode does.
const Shape kHeadShape = {151936, 896};
const DType kHeadTypes[] = {DType::Q8_0, DType::Q5_0, DType::Q4_1};
const DType kTypes[] = {DType::Q4_0,   DType::Q4_1,   DType::Q5_0, DType::Q5_1, DType::Q8_0,
                        DType::Q2_K,   DType::Q3_K,   DType::Q4_K, DType::Q5_K, DType::Q6_K,
                        DType::IQ4_NL, DType::IQ4_XS, DType::F16,  DType::BF16, DType::F32};

struct Weights {
  std::vector<uint8_t> bytes;
  WeightView view;
};
const Weights& weights(DType type, Shape s) {
  static std::map<std::tuple<int, int64_t, int64_t>, std::unique_ptr<Weights>> cache;
  auto& slot = cache[{(int)type, s.rows, s.cols}];
  if (!slot) {
    slot = std::make_unique<Weights>();
    const size_t row_bytes = dtype_row_bytes(type, s.cols);
    slot->bytes.resize(row_bytes * (size_t)s.rows);
    std::mt19937 rng(1);
    std::normal_distribution<float> dist(0.0f, 0.05f);
    std::vector<float> row((size_t)s.cols);
    for (int64_t r = 0; r < s.rows; ++r) {
      for (float& v : row) v = dist(rng);
      quantize_row(type, row.data(), slot->bytes.data() + r * row_bytes, s.cols);
    }
    slot->view = WeightView{type, s.rows, s.cols, row_bytes, slot->bytes.data()};
  }
  return *slot;
}

std::vector<float> activations(int64_t n) {
  std::mt19937 rng(2);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> x((size_t)n);
  for (float& v : x) v = dist(rng);
  return x;
}

void set_counters(benchmark::State& state, const WeightView& w, int64_t n_tokens) {
  const double bytes = (double)w.row_bytes * (double)w.rows;
  state.counters["GB/s"] =
      benchmark::Counter(bytes * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["GFLOP/s"] =
      benchmark::Counter(2.0 * (double)w.rows * (double)w.cols * (double)n_tokens * 1e-9,
                         benchmark::Counter::kIsIterationInvariantRate);
}

// n_tokens > 0: one prompt of n_tokens; n_tokens < 0: -n_tokens sequences' sampled tokens.
void bm_hablar(benchmark::State& state, DType type, Shape s, int64_t signed_tokens) {
  const bool decode_batch = signed_tokens < 0;
  const int64_t n_tokens = decode_batch ? -signed_tokens : signed_tokens;
  const WeightView& w = weights(type, s).view;
  const std::vector<float> x = activations(s.cols * n_tokens);
  std::vector<float> y((size_t)(s.rows * n_tokens));
  // The tokens as one prompt of n_tokens (the K formats' batched orders, as the forward takes
  // them for a prompt and as ggml does for one call).
  std::vector<uint8_t> roles((size_t)n_tokens);
  for (int64_t t = 0; t < n_tokens; ++t)
    roles[(size_t)t] =
        decode_batch ? cpu::llama_batch_role(0, 1) : cpu::llama_batch_role(t, n_tokens);
  for (auto _ : state) {
    cpu::matmul_with_isa(g_isa, w, x.data(), n_tokens, y.data(), pool(), roles);
    benchmark::DoNotOptimize(y.data());
  }
  set_counters(state, w, n_tokens);
}

// The embedding step's GEMM (cpu::embed::float_gemm: the same values as matmul, blocked for
// many tokens), beside matmul and ggml at BERT-base's shapes.
void bm_embed(benchmark::State& state, DType type, Shape s, int64_t n_tokens) {
  if (!cpu::embed::embed_kernels_usable()) {
    state.SkipWithError("no AVX-512 on this CPU");
    return;
  }
  const WeightView& w = weights(type, s).view;
  const std::vector<float> x = activations(s.cols * n_tokens);
  std::vector<float> y((size_t)(s.rows * n_tokens));
  const cpu::embed::GemmJob job{&w, y.data(), {}};
  for (auto _ : state) {
    cpu::embed::float_gemm({&job, 1}, x.data(), n_tokens, pool());
    benchmark::DoNotOptimize(y.data());
  }
  set_counters(state, w, n_tokens);
}

void bm_ggml(benchmark::State& state, DType type, Shape s, int64_t signed_tokens) {
  const int64_t n_tokens = std::abs(signed_tokens);  // ggml takes the 8 tokens as one batch
  const WeightView& w = weights(type, s).view;
  std::string why;
  auto peer = GgmlMatmul::create(w, n_tokens, g_threads, &why);
  if (!peer) {
    state.SkipWithError(why.c_str());
    return;
  }
  const std::vector<float> x = activations(s.cols * n_tokens);
  peer->set_input(x.data());
  for (auto _ : state) {
    peer->run();
    benchmark::DoNotOptimize(peer->output());
  }
  set_counters(state, w, n_tokens);
}

// STREAM-like: sum of a 256 MiB buffer (read) and a 128 MiB -> 128 MiB copy, over the pool.
std::vector<float>& stream_buffer() {
  static std::vector<float> buf((size_t)64 << 20, 1.0f);
  return buf;
}
void bm_memory_read(benchmark::State& state) {
  std::vector<float>& buf = stream_buffer();
  const auto* bytes = reinterpret_cast<const uint8_t*>(buf.data());
  const int64_t n = (int64_t)(buf.size() * sizeof(float));
  std::vector<uint64_t> partial((size_t)pool().size() * 8);
  for (auto _ : state) {
    // Integer xor of every word (cpu::read_through): a float sum's add latency would bound it
    // below what the memory delivers.
    pool().run([&](int i, int nt) {
      const IndexRange r = split_range(n, i, nt, 64);
      partial[(size_t)i * 8] = cpu::read_through(bytes + r.begin, (size_t)(r.end - r.begin));
    });
    benchmark::DoNotOptimize(partial.data());
  }
  state.counters["GB/s"] =
      benchmark::Counter((double)n * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}
void bm_memory_copy(benchmark::State& state) {
  std::vector<float>& buf = stream_buffer();
  const int64_t half = (int64_t)buf.size() / 2;
  for (auto _ : state) {
    pool().run([&](int i, int nt) {
      const IndexRange r = split_range(half, i, nt, 16);
      std::memcpy(buf.data() + half + r.begin, buf.data() + r.begin, (size_t)(r.end - r.begin) * 4);
    });
    benchmark::ClobberMemory();
  }
  // Bytes moved: read + write.
  state.counters["GB/s"] =
      benchmark::Counter((double)half * 8e-9, benchmark::Counter::kIsIterationInvariantRate);
}

// Collects the GB/s of each run to print hablar / ggml side by side at the end.
class RatioReporter : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    ConsoleReporter::ReportRuns(runs);
    for (const Run& run : runs) {
      if (run.error_occurred) continue;
      // Strip the "/min_time:..." and "/real_time" decorations.
      std::string name = run.benchmark_name();
      for (const char* tag : {"/min_time:", "/real_time"}) {
        const size_t at = name.find(tag);
        if (at != std::string::npos) name = name.substr(0, at);
      }
      const auto it = run.counters.find("GB/s");
      if (it != run.counters.end()) gbps_[name] = it->second.value;
    }
  }
  void Finalize() override {
    ConsoleReporter::Finalize();
    auto find = [&](const std::string& name) {
      const auto it = gbps_.find(name);
      return it == gbps_.end() ? NAN : it->second;
    };
    std::printf("\nmemory: read %.1f GB/s, copy %.1f GB/s (%d threads)\n", find("memory/read"),
                find("memory/copy"), g_threads);
    std::printf("%-8s %-10s %6s %12s %12s %8s %9s\n", "type", "shape", "tokens", "hablar GB/s",
                "ggml GB/s", "ratio", "%read bw");
    for (const auto& [name, v] : gbps_) {
      if (name.rfind("hablar/", 0) != 0) continue;
      const std::string rest = name.substr(7);
      const double peer = find("ggml/" + rest);
      char type[16], shape[32], tokens[8];
      if (std::sscanf(rest.c_str(), "%15[^/]/%31[^/]/%7[0-9d]", type, shape, tokens) != 3) continue;
      std::printf("%-8s %-10s %6s %12.2f %12.2f %8.2f %8.0f%%\n", type, shape, tokens, v, peer,
                  v / peer, 100.0 * v / find("memory/read"));
    }
  }

 private:
  std::map<std::string, double> gbps_;
};

void register_all() {
  benchmark::RegisterBenchmark("memory/read", bm_memory_read)->UseRealTime()->MinTime(0.5);
  benchmark::RegisterBenchmark("memory/copy", bm_memory_copy)->UseRealTime()->MinTime(0.5);
  for (DType type : kHeadTypes) {
    const std::string suffix = std::string(dtype_name(type)) + "/" +
                               std::to_string(kHeadShape.rows) + "x" +
                               std::to_string(kHeadShape.cols) + "/1";
    auto* mine =
        benchmark::RegisterBenchmark(("hablar/" + suffix).c_str(), bm_hablar, type, kHeadShape, 1);
    auto* peer =
        benchmark::RegisterBenchmark(("ggml/" + suffix).c_str(), bm_ggml, type, kHeadShape, 1);
    if (!g_cpu_time) {
      mine->UseRealTime();
      peer->UseRealTime();
    }
  }
  auto register_shape = [](DType type, const Shape& s, int64_t n_tokens) {
    const int64_t block = std::max<int64_t>(
        dtype_traits(type).block_elems, cpu::act_kind_for(type) == cpu::ActKind::kQ8K ? 256 : 1);
    if (s.cols % block != 0) return;  // no such matrix in this type
    const std::string suffix = std::string(dtype_name(type)) + "/" + std::to_string(s.rows) + "x" +
                               std::to_string(s.cols) + "/" + std::to_string(std::abs(n_tokens)) +
                               (n_tokens < 0 ? "d" : "");
    auto* mine =
        benchmark::RegisterBenchmark(("hablar/" + suffix).c_str(), bm_hablar, type, s, n_tokens);
    auto* peer =
        benchmark::RegisterBenchmark(("ggml/" + suffix).c_str(), bm_ggml, type, s, n_tokens);
    if (!g_cpu_time) {
      mine->UseRealTime();
      peer->UseRealTime();
    }
  };
  // BERT-base's products (q/k/v/o, FFN up, FFN down) at 4 and 32 inputs of 128 tokens (the
  // server's embedding steps are up to 4096 tokens).
  for (const Shape& s : {Shape{768, 768}, Shape{3072, 768}, Shape{768, 3072}})
    for (int64_t n : {int64_t{512}, int64_t{4096}}) {
      const std::string suffix =
          "f16/" + std::to_string(s.rows) + "x" + std::to_string(s.cols) + "/" + std::to_string(n);
      for (auto* b :
           {benchmark::RegisterBenchmark(("embed/" + suffix).c_str(), bm_embed, DType::F16, s, n),
            benchmark::RegisterBenchmark(("hablar/" + suffix).c_str(), bm_hablar, DType::F16, s, n),
            benchmark::RegisterBenchmark(("ggml/" + suffix).c_str(), bm_ggml, DType::F16, s, n)})
        if (!g_cpu_time) b->UseRealTime();
    }
  for (DType type : kAttentionTypes)
    for (const Shape& s : kAttentionShapes)
      for (int64_t n_tokens : {1, 128}) register_shape(type, s, n_tokens);
  for (DType type : kTypes)
    for (const Shape& s : kShapes)
      for (int64_t n_tokens : {1, -8, 128}) register_shape(type, s, n_tokens);
}

}  // namespace
}  // namespace hablar::bench

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const bool threads = std::strncmp(argv[i], "--threads=", 10) == 0;
    const bool cpu_time = std::strcmp(argv[i], "--cpu-time") == 0;
    const bool isa = std::strncmp(argv[i], "--isa=", 6) == 0;
    if (threads || cpu_time || isa) {
      if (threads) hablar::bench::g_threads = std::atoi(argv[i] + 10);
      if (cpu_time) hablar::bench::g_cpu_time = true;
      if (isa) {
        const std::string name = argv[i] + 6;
        using hablar::cpu::Isa;
        const Isa chosen = name == "scalar" ? Isa::kScalar
                           : name == "avx2" ? Isa::kAvx2
                                            : Isa::kAvx512;
        if (name != "scalar" && name != "avx2" && name != "avx512") {
          std::fprintf(stderr, "--isa must be scalar, avx2 or avx512\n");
          return 2;
        }
        if (hablar::cpu::isa_kernels(chosen) == nullptr) {
          std::fprintf(stderr, "this CPU has no %s kernels\n", name.c_str());
          return 2;
        }
        hablar::bench::g_isa = chosen;
      }
      for (int j = i; j + 1 < argc; ++j) argv[j] = argv[j + 1];
      --argc;
      --i;
    }
  }
  std::printf("hablar cpu bench: %d threads, isa %s, cpu: %s\n", hablar::bench::g_threads,
              hablar::cpu::isa_name(hablar::bench::g_isa),
              hablar::cpu_features().describe().c_str());
  benchmark::Initialize(&argc, argv);
  hablar::bench::register_all();
  hablar::bench::RatioReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  return 0;
}
