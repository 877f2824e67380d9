// CUDA kernel microbenchmarks, each printed next to the limit it is measured against in the
// same run: device-to-device copy bandwidth (bytes read + written) for the memory-bound
// kernels and a cuBLAS bf16 8192^3 GEMM for the compute-bound ones. Inputs are random and,
// for memory-bound kernels, rotated over enough copies to exceed the L2 cache several times.
//
// Usage: cuda_bench [--quick | --lab | --many-rows | --few-rows | --attention |
//                    --decode-attention | --prefill-attention]
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "backend/cuda/attention.h"
#include "backend/cuda/device_memory.h"
#include "backend/cuda/lab_knobs.h"
#include "backend/cuda/matmul.h"
#include "backend/cuda/matmul_f16.h"
#include "backend/cuda/matmul_q4k_rows.h"
#include "backend/cuda/ops.h"
#include "core/dtype.h"
#include "core/fp16.h"
#include "core/quant_blocks.h"

namespace hablar::cuda {

// copy_kernel.cu
void bench_copy_kernel(const void* src, void* dst, size_t bytes, cudaStream_t stream);

namespace {

constexpr size_t kRotateBytes = 512ull << 20;  // > 8x the H200's 60 MB L2

uint64_t g_state = 0x9E3779B97F4A7C15ull;
uint64_t next_random() {
  g_state ^= g_state << 13;
  g_state ^= g_state >> 7;
  g_state ^= g_state << 17;
  return g_state;
}

// Random bytes with every block's scales set to small halves (no NaN / inf on the path).
std::vector<uint8_t> random_weights(DType type, int64_t rows, int64_t cols) {
  std::vector<uint8_t> data(dtype_row_bytes(type, cols) * rows);
  for (size_t i = 0; i + 8 <= data.size(); i += 8) {
    const uint64_t r = next_random();
    std::memcpy(&data[i], &r, 8);
  }
  const auto traits = dtype_traits(type);
  const uint16_t small = f32_to_fp16(0.01f);
  for (size_t b = 0; b < data.size() / traits.block_bytes; ++b) {
    uint8_t* block = data.data() + b * traits.block_bytes;
    if (type == DType::Q6_K) {
      std::memcpy(block + 208, &small, 2);
    } else if (type == DType::F16 || type == DType::BF16) {
      for (uint32_t i = 0; i < traits.block_bytes; i += 2) std::memcpy(block + i, &small, 2);
    } else {
      std::memcpy(block, &small, 2);
      if (type == DType::Q4_1 || type == DType::Q5_1 || type == DType::Q4_K || type == DType::Q5_K)
        std::memcpy(block + 2, &small, 2);
    }
  }
  return data;
}

std::vector<float> random_floats(size_t n) {
  std::vector<float> v(n);
  for (auto& x : v) x = (float)((next_random() >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f;
  return v;
}

// Median milliseconds per call of `body` (called with the call index), timed as a CUDA
// graph of `per_graph` calls replayed `reps` times.
double time_graph_ms(Stream& stream, int per_graph, int reps,
                     const std::function<void(int)>& body) {
  for (int i = 0; i < 3; ++i) body(i);  // warm up outside the graph
  stream.synchronize();
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  HABLAR_CUDA_CHECK(cudaStreamBeginCapture(stream.get(), cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < per_graph; ++i) body(i);
  HABLAR_CUDA_CHECK(cudaStreamEndCapture(stream.get(), &graph));
  HABLAR_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  HABLAR_CUDA_CHECK(cudaGraphLaunch(exec, stream.get()));
  stream.synchronize();
  std::vector<double> times;
  Event start, stop;
  for (int r = 0; r < reps; ++r) {
    start.record(stream.get());
    HABLAR_CUDA_CHECK(cudaGraphLaunch(exec, stream.get()));
    stop.record(stream.get());
    times.push_back(stop.elapsed_ms_since(start) / per_graph);
  }
  HABLAR_CUDA_CHECK(cudaGraphExecDestroy(exec));
  HABLAR_CUDA_CHECK(cudaGraphDestroy(graph));
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

// Copy bandwidth (bytes read + written) through cudaMemcpyAsync and through a plain copy
// kernel; the larger is the limit the memory-bound kernels are held to.
double copy_bandwidth_gbs(Stream& stream) {
  const size_t bytes = 2ull << 30;
  DeviceMemory a(bytes), b(bytes);
  HABLAR_CUDA_CHECK(cudaMemset(a.get(), 1, bytes));
  const double memcpy_ms = time_graph_ms(stream, 4, 10, [&](int) {
    HABLAR_CUDA_CHECK(
        cudaMemcpyAsync(b.get(), a.get(), bytes, cudaMemcpyDeviceToDevice, stream.get()));
  });
  const double kernel_ms = time_graph_ms(stream, 4, 10, [&](int) {
    bench_copy_kernel(a.get(), b.get(), bytes, stream.get());
    HABLAR_CUDA_CHECK_LAUNCH();
  });
  const double memcpy_gbs = 2.0 * bytes / (memcpy_ms * 1e-3) / 1e9;
  const double kernel_gbs = 2.0 * bytes / (kernel_ms * 1e-3) / 1e9;
  std::printf("copy 2 GiB: cudaMemcpyAsync %.1f GB/s, copy kernel %.1f GB/s\n", memcpy_gbs,
              kernel_gbs);
  return std::max(memcpy_gbs, kernel_gbs);
}

double cublas_bf16_tflops(Stream& stream, int n) {
  DeviceBuffer<uint16_t> a((size_t)n * n), b((size_t)n * n);
  std::vector<uint16_t> host((size_t)n * n);
  for (auto& x : host) x = f32_to_bf16((float)((next_random() >> 40) * (1.0 / 16777216.0)) - 0.5f);
  a.upload(host);
  b.upload(host);
  DeviceBuffer<float> c((size_t)n * n);
  PrefillMatmul mm;
  const double ms = time_graph_ms(
      stream, 1, 10, [&](int) { mm.gemm_bf16(a.get(), b.get(), n, n, n, c.get(), stream.get()); });
  return 2.0 * n * n * n / (ms * 1e-3) / 1e12;
}

struct Row {
  std::string name;
  double us;
  double achieved;  // GB/s or TFLOP/s
  double limit;
  const char* unit;
  double goal;  // fraction of the limit the acceptance asks for (0: none)
};

void print_row(const Row& r) {
  const double ratio = r.achieved / r.limit;
  std::printf("%-46s %10.2f us %9.1f %-7s of %7.1f  = %5.1f%%%s\n", r.name.c_str(), r.us,
              r.achieved, r.unit, r.limit, 100 * ratio,
              r.goal > 0 ? (ratio >= r.goal ? "  [goal met]" : "  [below goal]") : "");
  std::fflush(stdout);
}

// Sets (or clears, for an empty value) one tuning knob of lab_knobs.h.
void set_knob(const char* name, const std::string& value) {
  if (value.empty()) {
    unsetenv(name);
  } else {
    setenv(name, value.c_str(), 1);
  }
}

// A variant: knob assignments "NAME=value" applied before a measurement (empty: defaults)
// and cleared after it.
using Variant = std::vector<std::string>;
void apply_variant(const Variant& variant, bool clear = false) {
  for (const auto& assignment : variant) {
    const auto eq = assignment.find('=');
    set_knob(assignment.substr(0, eq).c_str(), clear ? "" : assignment.substr(eq + 1));
  }
}
std::string variant_name(const Variant& variant) {
  std::string name;
  for (const auto& a : variant) {
    if (!name.empty()) name += ' ';
    name.append(a, a.find('_', 7) + 1);
  }
  return name.empty() ? "default" : name;
}
// The variant's name after a space, as a suffix of a row's name.
std::string variant_label(const Variant& variant) {
  std::string label(1, ' ');
  label.append(variant_name(variant));
  return label;
}

// int8_path: 0 f32 path; 1 x quantized to int8 in the call; 2 x quantized once beforehand
// (as Q/K/V or gate/up share one input), only the product timed.
// rotate: false keeps one copy of W, hot in the L2 cache (the kernel's own speed, not DRAM's).
// variants: knob settings measured one after another on the same weights (each printed when
// there are several); the last one's row is returned.
Row bench_decode_matmul(Stream& stream, DType type, int64_t n, int64_t k, int m, double copy_gbs,
                        double goal, int int8_path = 0, bool rotate = true,
                        const std::vector<Variant>& variants = {{}}) {
  const auto host = random_weights(type, n, k);
  const size_t bytes = host.size();
  const int copies = rotate ? (int)std::max<size_t>(2, (kRotateBytes + bytes - 1) / bytes) : 1;
  std::vector<DeviceBuffer<uint8_t>> w;
  for (int i = 0; i < copies; ++i) w.emplace_back(host);
  DeviceBuffer<float> x(random_floats((size_t)m * k)), y((size_t)m * n);
  WeightView shape{type, n, k, dtype_row_bytes(type, k), w[0].get()};
  DeviceMemory ws(int8_path ? matmul_fused_workspace_bytes(shape, m) : 0);
  if (int8_path == 2) quantize_activations_q8(x.get(), m, k, ws.get(), ws.bytes(), stream.get());
  Row row;
  for (const auto& variant : variants) {
    apply_variant(variant);
    const double ms = time_graph_ms(stream, rotate ? copies * 2 : 100, 7, [&](int i) {
      WeightView view{type, n, k, dtype_row_bytes(type, k), w[i % copies].get()};
      if (int8_path == 2) {
        matmul_prequantized(view, m, y.get(), ws.get(), stream.get());
      } else {
        matmul_fused(view, x.get(), m, y.get(), stream.get(), ws.get(), ws.bytes());
      }
    });
    const double moved = (double)bytes + 4.0 * m * (k + n);
    char name[160];
    const std::string label = variants.size() > 1 ? variant_label(variant) : std::string();
    std::snprintf(name, sizeof name, "matmul %s M=%d N=%lld K=%lld%s%s",
                  std::string(dtype_name(type)).c_str(), m, (long long)n, (long long)k,
                  rotate ? "" : " (W hot in L2)", label.c_str());
    row = Row{name, ms * 1e3, moved / (ms * 1e-3) / 1e9, copy_gbs, "GB/s", goal};
    if (variants.size() > 1) print_row(row);
    apply_variant(variant, true);
  }
  return row;
}

// A KV cache of the layout's size filled with random F16 values in [-0.5, 0.5).
DeviceBuffer<uint16_t> random_f16_cache(const KvCacheLayout& layout) {
  DeviceBuffer<uint16_t> cache(layout.total_elems());
  std::vector<uint16_t> host(layout.total_elems());
  for (auto& e : host) e = f32_to_fp16((float)((next_random() >> 40) * (1.0 / 16777216.0)) - 0.5f);
  cache.upload(host);
  return cache;
}

// Heads of the two shapes the H200 figures use: Llama-3-8B (32 query / 8 KV heads) and
// Qwen2.5-1.5B (12 / 2), head_dim 128 both.
struct AttentionHeads {
  int heads, kv_heads;
};
constexpr AttentionHeads kHeads8B{32, 8}, kHeads15B{12, 2};

// in_forward: the call as the forward makes it (K/V already stored by the RoPE pass, the
// lengths advanced once per step elsewhere): the attention and its reduce alone; otherwise
// decode_attention's whole contract (scatter, attention, reduce, advance: four launches).
Row bench_decode_attention(Stream& stream, int seqs, int context, double copy_gbs, double goal,
                           const std::vector<Variant>& variants = {{}},
                           AttentionHeads shape = kHeads8B, bool in_forward = false) {
  const int heads = shape.heads, kv_heads = shape.kv_heads, dim = 128, iters = 16;
  const int blocks_per_seq = (context + iters + 64) / 16 + 1;
  // The four calls of a timed graph read different layers where one layer is small: a
  // 1 x 32k cache of 2 KV heads (34 MB) read again and again would stay in the L2 cache.
  const double layer_bytes = (double)seqs * blocks_per_seq * 16 * kv_heads * dim * 2 * 2;
  const int layers = (int)std::clamp(std::ceil(kRotateBytes / layer_bytes), 1.0, iters / 4.0);
  KvCacheLayout layout{layers, kv_heads, dim, 16, seqs * blocks_per_seq, KvDType::F16};
  DeviceBuffer<uint16_t> cache = random_f16_cache(layout);
  std::vector<int32_t> tables((size_t)seqs * blocks_per_seq);
  for (size_t i = 0; i < tables.size(); ++i) tables[i] = (int32_t)i;
  DeviceBuffer<int32_t> dtables(tables), lens(std::vector<int32_t>(seqs, context - 1));
  DeviceBuffer<uint8_t> active(std::vector<uint8_t>(seqs, 1));
  DeviceBuffer<float> q(random_floats((size_t)seqs * heads * dim)),
      kn(random_floats((size_t)seqs * kv_heads * dim)),
      vn(random_floats((size_t)seqs * kv_heads * dim)), out((size_t)seqs * heads * dim);
  DecodeAttentionParams p;
  p.layout = layout;
  p.kv_cache = cache.get();
  p.n_slots = seqs;
  p.block_tables = dtables.get();
  p.max_blocks_per_seq = blocks_per_seq;
  p.multiprocessors = device_multiprocessors();
  p.seq_lens = lens.get();
  p.active = active.get();
  p.n_heads = heads;
  p.q = q.get();
  p.k_new = kn.get();
  p.v_new = vn.get();
  p.out = out.get();
  p.scale = 1.0f / std::sqrt((float)dim);
  p.max_context = context + iters + 48;
  p.kv_stored = in_forward;
  p.advance_lengths = !in_forward;
  p.prior_rows_settled = true;  // one token per sequence
  Row row;
  for (const auto& variant : variants) {
    apply_variant(variant);
    lens.upload(std::vector<int32_t>(seqs, context - 1));
    DeviceMemory ws(decode_attention_workspace_bytes(p));
    // Each call advances the lengths: over warm-up and graph replays the context grows from
    // `context`; bytes are counted at the mean context of the timed calls.
    const int reps = 5;
    const double ms = time_graph_ms(stream, iters / 4, reps, [&](int call) {
      p.layer = call % layers;
      decode_attention(p, ws.get(), ws.bytes(), stream.get());
    });
    const double mean_context =
        in_forward ? context : context + 3 + iters / 4 + (double)reps * (iters / 4) / 2;
    const double kv_bytes = (double)seqs * mean_context * kv_heads * dim * 2 * 2;
    char name[160];
    const std::string label = variants.size() > 1 ? variant_label(variant) : std::string();
    std::snprintf(name, sizeof name, "decode attention %d seqs x %d tok (%d/%d heads, d128)%s%s",
                  seqs, context, heads, kv_heads, in_forward ? " as in the forward" : "",
                  label.c_str());
    row = Row{name, ms * 1e3, kv_bytes / (ms * 1e-3) / 1e9, copy_gbs, "GB/s", goal};
    if (variants.size() > 1) print_row(row);
    apply_variant(variant, true);
  }
  return row;
}

// Causal prefill attention of `seqs` prompts of `chunk` tokens each (empty caches, K/V
// already stored as the forward's RoPE pass leaves them), F16 cache, head_dim 128. FLOPs are
// the causal ones: 4 * head_dim per (query, seen key) pair and head.
Row bench_prefill_attention(Stream& stream, int seqs, int chunk, int heads, int kv_heads,
                            double peak_tflops) {
  const int dim = 128, blocks_per_seq = (chunk + 15) / 16;
  KvCacheLayout layout{1, kv_heads, dim, 16, seqs * blocks_per_seq, KvDType::F16};
  DeviceBuffer<uint16_t> cache = random_f16_cache(layout);
  std::vector<int32_t> tables((size_t)seqs * blocks_per_seq), begin(seqs + 1);
  for (size_t i = 0; i < tables.size(); ++i) tables[i] = (int32_t)i;
  for (int s = 0; s <= seqs; ++s) begin[s] = s * chunk;
  DeviceBuffer<int32_t> dtables(tables), dbegin(begin), cached(std::vector<int32_t>(seqs, 0));
  const size_t rows = (size_t)seqs * chunk;
  DeviceBuffer<float> q(random_floats(rows * heads * dim)), kv(rows * kv_heads * dim),
      out(rows * heads * dim);
  PrefillAttentionParams p;
  p.layout = layout;
  p.kv_cache = cache.get();
  p.n_seqs = seqs;
  p.block_tables = dtables.get();
  p.max_blocks_per_seq = blocks_per_seq;
  p.token_begin = dbegin.get();
  p.cached_len = cached.get();
  p.kv_stored = true;
  p.total_tokens = (int)rows;
  p.max_chunk = chunk;
  p.n_heads = heads;
  p.q = q.get();
  p.k_new = kv.get();
  p.v_new = kv.get();
  p.out = out.get();
  p.scale = 1.0f / std::sqrt((float)dim);
  const double ms = time_graph_ms(stream, 4, 5, [&](int) { prefill_attention(p, stream.get()); });
  const double pairs = (double)seqs * chunk * (chunk + 1) / 2;
  const double flops = 4.0 * dim * heads * pairs;
  char name[160];
  std::snprintf(name, sizeof name, "prefill attention %d x %d tok (%d/%d heads, d128)", seqs, chunk,
                heads, kv_heads);
  return Row{name, ms * 1e3, flops / (ms * 1e-3) / 1e12, peak_tflops, "TFLOP/s", 0};
}

void run_prefill_attention(Stream& stream, double peak) {
  std::printf("\n== prefill attention (F16 KV, causal) vs cuBLAS bf16 peak measured above ==\n");
  for (const auto& [heads, kv_heads] : {std::pair{12, 2}, std::pair{32, 8}}) {
    print_row(bench_prefill_attention(stream, 1, 512, heads, kv_heads, peak));
    print_row(bench_prefill_attention(stream, 1, 2048, heads, kv_heads, peak));
    print_row(bench_prefill_attention(stream, 16, 512, heads, kv_heads, peak));
    print_row(bench_prefill_attention(stream, 64, 512, heads, kv_heads, peak));
  }
}

void bench_prefill(Stream& stream, DType type, int64_t n, int64_t k, int m, double peak_tflops) {
  const auto host = random_weights(type, n, k);
  DeviceBuffer<uint8_t> w(host);
  WeightView view{type, n, k, dtype_row_bytes(type, k), w.get()};
  DeviceBuffer<float> x(random_floats((size_t)m * k)), y((size_t)m * n);
  DeviceBuffer<uint16_t> w16((size_t)(n * k)), x16((size_t)m * k);
  dequantize_to_bf16(view, w16.get(), stream.get());
  convert_f32_to_bf16(x.get(), x16.get(), (int64_t)m * k, stream.get());
  PrefillMatmul mm;
  const double flops = 2.0 * m * n * k;
  char base[64];
  std::snprintf(base, sizeof base, "%s M=%d N=%lld K=%lld", std::string(dtype_name(type)).c_str(),
                m, (long long)n, (long long)k);
  const double gemm_ms = time_graph_ms(stream, 1, 10, [&](int) {
    mm.gemm_bf16(w16.get(), x16.get(), n, k, m, y.get(), stream.get());
  });
  print_row({std::string("prefill cuBLAS bf16 GEMM ") + base, gemm_ms * 1e3,
             flops / (gemm_ms * 1e-3) / 1e12, peak_tflops, "TFLOP/s", 0.5});
  mm.run(view, x.get(), m, y.get(), stream.get());  // sizes the scratch outside capture
  const double full_ms =
      time_graph_ms(stream, 1, 10, [&](int) { mm.run(view, x.get(), m, y.get(), stream.get()); });
  print_row({std::string("prefill dequant+GEMM ") + base, full_ms * 1e3,
             flops / (full_ms * 1e-3) / 1e12, peak_tflops, "TFLOP/s", 0});
  const double fused_ms = time_graph_ms(stream, 1, 10, [&](int) {
    for (int r = 0; r < m; r += kFusedMatmulMaxRows)
      matmul_fused(view, x.get() + (size_t)r * k, std::min(kFusedMatmulMaxRows, m - r),
                   y.get() + (size_t)r * n, stream.get());
  });
  print_row({std::string("prefill fused WMMA tiles ") + base, fused_ms * 1e3,
             flops / (fused_ms * 1e-3) / 1e12, peak_tflops, "TFLOP/s", 0});
}

// Q4_K / Q6_K products of many rows (batched decode, prompt chunks), each path with its own
// conversion of the f32 rows: f16 tensor cores (convert_rows_to_f16 + matmul_f16), the
// matmul_fused path at M <= 256 (Q4_K: int8 tensor cores; Q6_K: bf16 WMMA tiles) and W
// dequantized to bf16 + cuBLAS (PrefillMatmul) beyond. Weights rotated past the L2 as in a
// step.
void bench_many_rows(Stream& stream, DType type, int64_t n, int64_t k, int m, double peak_tflops) {
  const auto host = random_weights(type, n, k);
  const int copies = (int)std::max<size_t>(2, (kRotateBytes + host.size() - 1) / host.size());
  std::vector<DeviceBuffer<uint8_t>> w;
  for (int i = 0; i < copies; ++i) w.emplace_back(host);
  auto view = [&](int i) {
    return WeightView{type, n, k, dtype_row_bytes(type, k), w[i % copies].get()};
  };
  DeviceBuffer<float> x(random_floats((size_t)m * k)), y((size_t)m * n);
  DeviceMemory rows(f16_rows_bytes(m, k)),
      scratch(std::max({f16_product_scratch_bytes(view(0), m, 1),
                        f16_product_scratch_bytes(view(0), m, 2), size_t{256}}));
  const double flops = 2.0 * m * n * k;
  char base[96];
  std::snprintf(base, sizeof base, "%s M=%d N=%lld K=%lld", std::string(dtype_name(type)).c_str(),
                m, (long long)n, (long long)k);
  // The two ways the warps of a column share a block (matmul_f16.h): different activation
  // rows, or halves of each super-block.
  double f16_ms = 0;
  for (int parts : {1, 2}) {
    const double ms = time_graph_ms(stream, copies, 7, [&](int i) {
      convert_rows_to_f16(x.get(), m, k, rows.get(), rows.bytes(), stream.get());
      matmul_f16(view(i), rows.get(), m, y.get(), scratch.get(), stream.get(), parts);
    });
    print_row({std::string(parts == 1 ? "f16 tensor cores " : "f16, halves split ") + base,
               ms * 1e3, flops / (ms * 1e-3) / 1e12, peak_tflops, "TFLOP/s", 0});
    if (parts == 2) f16_ms = ms;  // the forward's default
  }
  // W's kept bf16 copy (PrefillMatmul::keep_bf16), rotated past the L2 like W: the rows
  // converted to bf16, then one cuBLAS GEMM (what the forward runs from kept_bf16_min_rows()).
  {
    const size_t copy_bytes = (size_t)n * (size_t)k * sizeof(uint16_t);
    const int bf16_copies = (int)std::max<size_t>(2, (kRotateBytes + copy_bytes - 1) / copy_bytes);
    std::vector<DeviceBuffer<uint16_t>> w16;
    for (int i = 0; i < bf16_copies; ++i) {
      w16.emplace_back((size_t)n * (size_t)k);
      dequantize_to_bf16(view(0), w16.back().get(), stream.get());
    }
    DeviceBuffer<uint16_t> x16((size_t)m * (size_t)k);
    PrefillMatmul mm;
    const double ms = time_graph_ms(stream, bf16_copies, 7, [&](int i) {
      convert_f32_to_bf16(x.get(), x16.get(), (int64_t)m * k, stream.get());
      mm.gemm_bf16(w16[i % bf16_copies].get(), x16.get(), n, k, m, y.get(), stream.get());
    });
    std::printf("%-46s %10.2f us   -> f16 %.2fx  (%.1f TFLOP/s, %.0f GB/s of W)\n",
                (std::string("  kept bf16 + cuBLAS ") + base).c_str(), ms * 1e3, ms / f16_ms,
                flops / (ms * 1e-3) / 1e12, (double)copy_bytes / (ms * 1e-3) / 1e9);
  }
  double other_ms = 0;
  const char* other = nullptr;
  if (m <= kFusedMatmulMaxRows) {
    DeviceMemory ws(std::max<size_t>(matmul_fused_workspace_bytes(view(0), m), 256));
    other_ms = time_graph_ms(stream, copies, 7, [&](int i) {
      matmul_fused(view(i), x.get(), m, y.get(), stream.get(), ws.get(), ws.bytes());
    });
    other = type == DType::Q4_K ? "int8" : "bf16 WMMA";
  } else {
    PrefillMatmul mm;
    mm.run(view(0), x.get(), m, y.get(), stream.get());  // sizes the scratch outside capture
    other_ms = time_graph_ms(stream, copies, 7,
                             [&](int i) { mm.run(view(i), x.get(), m, y.get(), stream.get()); });
    other = "dequant+cuBLAS";
  }
  std::printf("%-46s %10.2f us   -> f16 %.2fx\n", (std::string("  ") + other + " " + base).c_str(),
              other_ms * 1e3, other_ms / f16_ms);
}

// The copy kernel moving `bytes` per call over buffers rotated past the L2 cache, as a
// decode matmul of that many weight bytes is timed: the bandwidth one call of that size
// reaches (bytes read + written).
Row bench_copy_per_call(Stream& stream, size_t bytes, double copy_gbs) {
  const size_t stride = (bytes + 4095) / 4096 * 4096;
  const int copies = (int)std::max<size_t>(2, kRotateBytes / stride);
  DeviceMemory src(stride * copies), dst(stride * copies);
  HABLAR_CUDA_CHECK(cudaMemset(src.get(), 1, stride * copies));
  const double ms = time_graph_ms(stream, copies * 2, 7, [&](int i) {
    const size_t at = (size_t)(i % copies) * stride;
    bench_copy_kernel(static_cast<uint8_t*>(src.get()) + at, static_cast<uint8_t*>(dst.get()) + at,
                      bytes / 16 * 16, stream.get());
  });
  char name[96];
  std::snprintf(name, sizeof name, "copy kernel, %.1f MB per call", bytes / 1e6);
  return Row{name, ms * 1e3, 2.0 * bytes / (ms * 1e-3) / 1e9, copy_gbs, "GB/s", 0};
}

// --lab: the acceptance benchmarks under every kernel variant the knobs select.
void run_lab(Stream& stream, double copy_gbs) {
  const int64_t shapes[4][2] = {{1536, 8960}, {8960, 1536}, {4096, 14336}, {14336, 4096}};
  std::printf("-- the copy kernel at the weight bytes of one Q4_K call\n");
  for (const auto& shape : shapes)
    print_row(
        bench_copy_per_call(stream, dtype_row_bytes(DType::Q4_K, shape[1]) * shape[0], copy_gbs));
  std::printf("-- Q4_K M=1 (x quantized once), W from DRAM: kernels and team shapes\n");
  // The shipped choice twice (KERNEL=1 is the default), to show the spread of one run.
  const std::vector<Variant> q4k_variants = {{"HABLAR_Q4K_KERNEL=0"},
                                             {},
                                             {"HABLAR_Q4K_PDL=0"},
                                             {"HABLAR_Q4K_GRID=0"},
                                             {"HABLAR_Q4K_ROWS=4"},
                                             {"HABLAR_Q4K_GRID=4", "HABLAR_Q4K_ROWS=1"},
                                             {"HABLAR_Q4K_GRID=3", "HABLAR_Q4K_ROWS=1"},
                                             {"HABLAR_Q4K_KERNEL=1"}};
  for (const auto& shape : shapes)
    bench_decode_matmul(stream, DType::Q4_K, shape[0], shape[1], 1, copy_gbs, 0.75, 2, true,
                        q4k_variants);
  std::printf("-- Q4_K M=1, W hot in L2 (the kernel's own speed)\n");
  for (const auto& shape : {shapes[0], shapes[2]})
    bench_decode_matmul(stream, DType::Q4_K, shape[0], shape[1], 1, copy_gbs, 0, 2, false,
                        {{"HABLAR_Q4K_KERNEL=0"}, {"HABLAR_Q4K_PDL=0"}, {}});
  std::printf("-- Q4_K M=1, x quantized in the call\n");
  for (const auto& shape : shapes)
    bench_decode_matmul(stream, DType::Q4_K, shape[0], shape[1], 1, copy_gbs, 0.75, 1, true,
                        {{"HABLAR_Q4K_KERNEL=0"}, {"HABLAR_Q4K_PDL=0"}, {}});
  std::printf("-- Q4_K batched decode (x quantized once): dp4a kernel vs tensor cores\n");
  for (int m : {2, 3, 4, 8})
    bench_decode_matmul(stream, DType::Q4_K, 4096, 14336, m, copy_gbs, 0, 2, true,
                        {{"HABLAR_Q4K_MMA_FROM=9"}, {"HABLAR_Q4K_MMA_FROM=2"}});
  for (int m : {16, 32, 64, 128, 256})
    bench_decode_matmul(stream, DType::Q4_K, 4096, 14336, m, copy_gbs, 0, 2, true, {{}, {}});
  std::printf("-- the same on the f32 path (tensor cores on bf16 tiles)\n");
  for (int m : {32, 64, 128, 256})
    print_row(bench_decode_matmul(stream, DType::Q4_K, 4096, 14336, m, copy_gbs, 0, 0));
  std::vector<Variant> attention_variants = {
      {"HABLAR_DECODE_KERNEL=0", "HABLAR_DECODE_BLOCKS_PER_SM=64"}, {}};
  for (const char* per_sm : {"1", "4"})
    attention_variants.push_back({std::string("HABLAR_DECODE_BLOCKS_PER_SM=") + per_sm});
  attention_variants.push_back({"HABLAR_DECODE_KERNEL=1"});
  bench_decode_attention(stream, 128, 1024, copy_gbs, 0.60, attention_variants);
  bench_decode_attention(stream, 16, 2048, copy_gbs, 0, attention_variants);
  bench_decode_attention(stream, 1, 4096, copy_gbs, 0, attention_variants);
  for (AttentionHeads shape : {kHeads8B, kHeads15B}) {
    bench_decode_attention(stream, 1, 32768, copy_gbs, 0.60, attention_variants, shape);
    bench_decode_attention(stream, 64, 4096, copy_gbs, 0.60, attention_variants, shape);
  }
}

// Decode attention at long contexts (the H200-speed issue's goal: 60% of the copy bandwidth
// at 1 x 32k and 64 x 4k positions) and the shorter shapes beside them, for both head shapes.
void run_decode_attention(Stream& stream, double copy_gbs) {
  // HABLAR_BENCH_ATTENTION_CASE=seqs,context,heads,kv_heads: that case alone, as in the
  // forward (for a profiler's view of one shape).
  if (const char* only = std::getenv("HABLAR_BENCH_ATTENTION_CASE")) {
    int seqs = 1, context = 32768, heads = 12, kv_heads = 2;
    if (std::sscanf(only, "%d,%d,%d,%d", &seqs, &context, &heads, &kv_heads) == 4) {
      print_row(bench_decode_attention(stream, seqs, context, copy_gbs, 0.60, {{}},
                                       AttentionHeads{heads, kv_heads}, true));
      return;
    }
  }
  std::printf("\n== decode attention (F16 KV, split-K) vs copy bandwidth ==\n");
  for (AttentionHeads shape : {kHeads8B, kHeads15B}) {
    print_row(bench_decode_attention(stream, 1, 32768, copy_gbs, 0.60, {{}}, shape));
    print_row(bench_decode_attention(stream, 64, 4096, copy_gbs, 0.60, {{}}, shape));
    print_row(bench_decode_attention(stream, 128, 1024, copy_gbs, 0.60, {{}}, shape));
    print_row(bench_decode_attention(stream, 256, 576, copy_gbs, 0, {{}}, shape));
    print_row(bench_decode_attention(stream, 1, 4096, copy_gbs, 0, {{}}, shape));
  }
  std::printf(
      "-- as the forward calls it: K/V stored by the RoPE pass, lengths advanced per step\n");
  for (AttentionHeads shape : {kHeads8B, kHeads15B}) {
    print_row(bench_decode_attention(stream, 1, 32768, copy_gbs, 0.60, {{}}, shape, true));
    print_row(bench_decode_attention(stream, 64, 4096, copy_gbs, 0.60, {{}}, shape, true));
    print_row(bench_decode_attention(stream, 1, 4096, copy_gbs, 0, {{}}, shape, true));
  }
}

// The gated feed-forward's first half at one token, two ways: gate and up products and the
// activation in one launch (matmul_q4k_rows_glu), and the three launches it replaces. Weights
// rotated past the L2 cache; the input quantized beforehand (the norm before does it).
void bench_glu_fusion(Stream& stream, int64_t n, int64_t k, double copy_gbs) {
  const auto gate_host = random_weights(DType::Q4_K, n, k),
             up_host = random_weights(DType::Q4_K, n, k);
  const size_t bytes = 2 * gate_host.size();
  const int copies = (int)std::max<size_t>(2, (kRotateBytes + bytes - 1) / bytes);
  std::vector<DeviceBuffer<uint8_t>> gate, up;
  for (int i = 0; i < copies; ++i) gate.emplace_back(gate_host), up.emplace_back(up_host);
  DeviceBuffer<float> x(random_floats((size_t)k)), g((size_t)n), u((size_t)n);
  DeviceMemory ws(q8_activation_bytes(1, k));
  quantize_activations_q8(x.get(), 1, k, ws.get(), ws.bytes(), stream.get());
  const Q8Activations xa = q8_layout(ws.get(), 1, k);
  auto view = [&](std::vector<DeviceBuffer<uint8_t>>& w, int i) {
    return WeightView{DType::Q4_K, n, k, dtype_row_bytes(DType::Q4_K, k), w[i % copies].get()};
  };
  for (bool fused : {true, false}) {
    const double ms = time_graph_ms(stream, copies * 2, 7, [&](int i) {
      if (fused)
        return matmul_q4k_rows_glu(view(gate, i), view(up, i), xa.codes, xa.scales, g.get(),
                                   GluActivation::kSilu, stream.get());
      matmul_q4k_rows(view(gate, i), xa.codes, xa.scales, g.get(), stream.get());
      matmul_q4k_rows(view(up, i), xa.codes, xa.scales, u.get(), stream.get());
      swiglu(g.get(), u.get(), g.get(), n, stream.get());
    });
    char name[160];
    std::snprintf(name, sizeof name, "gate+up+SwiGLU Q4_K N=%lld K=%lld, %s", (long long)n,
                  (long long)k, fused ? "one launch" : "three launches");
    print_row(Row{name, ms * 1e3, (double)bytes / (ms * 1e-3) / 1e9, copy_gbs, "GB/s", 0});
  }
}

void run_many_rows(Stream& stream, double peak, bool quick) {
  std::printf("\n== many rows: f16 tensor cores beside the int8 / WMMA / cuBLAS paths ==\n");
  const int64_t shapes[][2] = {{1536, 1536}, {8960, 1536},  {1536, 8960},
                               {4096, 4096}, {14336, 4096}, {4096, 14336}};
  for (const auto& shape : shapes)
    for (int m : {8, 16, 32, 64, 128, 256, 512, 2048})
      if (!quick || m == 16 || m == 128 || m == 512)
        bench_many_rows(stream, DType::Q4_K, shape[0], shape[1], m, peak);
  // Q6_K: the ffn_down / attn_v of half the layers and the vocabulary of Q4_K_M files.
  const int64_t q6k_shapes[][2] = {{1536, 8960}, {256, 1536}, {151936, 1536}, {4096, 14336}};
  for (const auto& shape : q6k_shapes)
    for (int m : {16, 32, 64, 128, 256})
      if (!quick || m == 128) bench_many_rows(stream, DType::Q6_K, shape[0], shape[1], m, peak);
}

// Products of 1-4 rows (decode steps of a few sequences) in the 1.5B and 8B shapes' Q4_K and
// Q6_K matrices: the int8 path where it takes the row count (the rows kernels, dp4a, integer
// tensor cores; activations already quantized, as the forward's norms leave them) beside the
// f32 product, to place each type's crossover.
void run_few_rows(Stream& stream, double copy_gbs) {
  std::printf("\n== few rows: the int8 path beside the f32 product ==\n");
  struct Shape {
    DType type;
    int64_t n, k;
  };
  const Shape shapes[] = {{DType::Q4_K, 8960, 1536},   {DType::Q4_K, 1536, 8960},
                          {DType::Q4_K, 14336, 4096},  {DType::Q4_K, 4096, 14336},
                          {DType::Q6_K, 151936, 1536}, {DType::Q6_K, 1536, 8960},
                          {DType::Q6_K, 128256, 4096}, {DType::Q6_K, 4096, 14336}};
  for (const Shape& s : shapes)
    for (int m = 1; m <= 4; ++m) {
      const WeightView view{s.type, s.n, s.k, dtype_row_bytes(s.type, s.k), nullptr};
      for (int int8_path : {2, 0}) {
        if (int8_path != 0 && matmul_fused_workspace_bytes(view, m) == 0) continue;
        Row row = bench_decode_matmul(stream, s.type, s.n, s.k, m, copy_gbs, 0, int8_path);
        row.name = (int8_path != 0 ? "int8 " : "f32  ") + row.name;
        print_row(row);
      }
    }
}

int run(bool quick, bool lab, bool many_rows, bool few_rows, bool attention, bool prefill_only) {
  std::string reason;
  if (device_count(&reason) == 0) {
    std::printf("no CUDA device (%s): nothing to measure\n", reason.c_str());
    return 0;
  }
  cudaDeviceProp prop;
  HABLAR_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, %d SMs, L2 %d MB\n", prop.name, prop.multiProcessorCount,
              prop.l2CacheSize >> 20);
  Stream stream;
  const double copy_gbs = copy_bandwidth_gbs(stream);
  const double peak = cublas_bf16_tflops(stream, 8192);
  std::printf(
      "limits measured now: copy %.1f GB/s (read+write), cuBLAS bf16 8192^3 %.1f TFLOP/s "
      "(reference figures: 4300 GB/s, 790 TFLOP/s)\n\n",
      copy_gbs, peak);
  if (lab) {
    run_lab(stream, copy_gbs);
    return 0;
  }
  if (many_rows) {
    run_many_rows(stream, peak, false);
    return 0;
  }
  if (few_rows) {
    run_few_rows(stream, copy_gbs);
    return 0;
  }
  if (attention) {
    if (!prefill_only) run_decode_attention(stream, copy_gbs);
    if (!quick) run_prefill_attention(stream, peak);  // --decode-attention: the decode rows alone
    return 0;
  }
  std::printf("== decode matmul (fused dequant, M rows of activations) vs copy bandwidth ==\n");
  for (int int8_path : {2, 1, 0}) {
    print_row(bench_decode_matmul(stream, DType::Q4_K, 1536, 8960, 1, copy_gbs, 0.75, int8_path));
    print_row(bench_decode_matmul(stream, DType::Q4_K, 8960, 1536, 1, copy_gbs, 0.75, int8_path));
    print_row(bench_decode_matmul(stream, DType::Q4_K, 4096, 14336, 1, copy_gbs, 0.75, int8_path));
    print_row(bench_decode_matmul(stream, DType::Q4_K, 14336, 4096, 1, copy_gbs, 0.75, int8_path));
  }
  if (!quick) {
    for (DType t : {DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::Q8_0, DType::Q5_K,
                    DType::Q6_K, DType::F16, DType::BF16})
      print_row(bench_decode_matmul(stream, t, 4096, 14336, 1, copy_gbs, 0));
    for (int m : {2, 3, 4, 8, 16, 32, 64, 128, 256})
      print_row(bench_decode_matmul(stream, DType::Q4_K, 4096, 14336, m, copy_gbs, 0, 1));
    for (int m : {2, 4, 8, 16, 64, 256})
      print_row(bench_decode_matmul(stream, DType::Q4_K, 4096, 14336, m, copy_gbs, 0));
  }
  std::printf("\n== one token: Q6_K on int8 activations beside the f32 path; fused gate+up ==\n");
  for (int int8_path : {2, 0}) {
    print_row(bench_decode_matmul(stream, DType::Q6_K, 1536, 8960, 1, copy_gbs, 0, int8_path));
    print_row(bench_decode_matmul(stream, DType::Q6_K, 151936, 1536, 1, copy_gbs, 0, int8_path));
  }
  bench_glu_fusion(stream, 8960, 1536, copy_gbs);
  bench_glu_fusion(stream, 14336, 4096, copy_gbs);
  std::printf("\n== decode attention (F16 KV, split-K) vs copy bandwidth ==\n");
  print_row(bench_decode_attention(stream, 128, 1024, copy_gbs, 0.60));
  if (!quick) {
    print_row(bench_decode_attention(stream, 1, 4096, copy_gbs, 0));
    print_row(bench_decode_attention(stream, 16, 2048, copy_gbs, 0));
    print_row(bench_decode_attention(stream, 64, 512, copy_gbs, 0));
    print_row(bench_decode_attention(stream, 1, 32768, copy_gbs, 0.60));
    print_row(bench_decode_attention(stream, 64, 4096, copy_gbs, 0.60));
  }
  run_many_rows(stream, peak, quick);
  run_prefill_attention(stream, peak);
  std::printf("\n== prefill matmul vs cuBLAS bf16 peak measured above ==\n");
  bench_prefill(stream, DType::Q4_K, 14336, 4096, 512, peak);
  bench_prefill(stream, DType::Q4_K, 4096, 14336, 512, peak);
  return 0;
}

}  // namespace
}  // namespace hablar::cuda

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  const bool lab = argc > 1 && std::strcmp(argv[1], "--lab") == 0;
  // --many-rows: the many-rows products alone, under the knobs the environment sets.
  const bool many_rows = argc > 1 && std::strcmp(argv[1], "--many-rows") == 0;
  // --few-rows: the products of 1-4 rows alone, int8 path beside f32.
  const bool few_rows = argc > 1 && std::strcmp(argv[1], "--few-rows") == 0;
  // --attention: the attention kernels alone (decode at long and short contexts, prefill).
  // --decode-attention: its decode rows alone.
  const bool decode_attention = argc > 1 && std::strcmp(argv[1], "--decode-attention") == 0;
  // --prefill-attention: its prefill rows alone.
  const bool prefill_only = argc > 1 && std::strcmp(argv[1], "--prefill-attention") == 0;
  const bool attention =
      decode_attention || prefill_only || (argc > 1 && std::strcmp(argv[1], "--attention") == 0);
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // rows reach a log even when a time limit cuts the run
  // Variants set knobs through the environment (--attention: for split-sizing runs).
  if (lab || many_rows || few_rows || attention) hablar::cuda::enable_lab_knobs();
  try {
    return hablar::cuda::run(quick || decode_attention, lab, many_rows, few_rows, attention,
                             prefill_only);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cuda_bench: %s\n", e.what());
    return 1;
  }
}
