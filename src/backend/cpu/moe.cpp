#include "backend/cpu/moe.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>

#include "backend/cpu/matmul_fused.h"
#include "core/error.h"
#include "core/fp16.h"

namespace hablar::cpu {

void softmax_row(const float* x, float* y, int n) {
  float max = -INFINITY;
  for (int i = 0; i < n; ++i) max = std::max(max, x[i]);
  double sum = 0.0;
  int i = 0;
  for (; i + kReduceLanes <= n; i += kReduceLanes) {  // the vectorized part
    float block[kReduceLanes];
    for (int l = 0; l < kReduceLanes; ++l) y[i + l] = block[l] = exp_approx(x[i + l] - max);
    sum += (double)reduce16(block);
  }
  for (; i < n; ++i) {  // the tail, with the C library's expf
    y[i] = std::exp(x[i] - max);
    sum += (double)y[i];
  }
  const float inv = (float)(1.0 / sum);
  for (int k = 0; k < n; ++k) y[k] *= inv;
}

namespace {

// y [n x w.rows] = x [n x w.cols] · Wᵀ for F16 experts in the order of llama.cpp's
// ggml_vec_dot_f16, which its mul_mat_id takes (its mul_mat takes another): x rounded to
// half, 64 partial sums by index (exact products), folded to 16 and reduced (fold64,
// reduce16), a tail past the last 64 added in double.
void f16_expert_product(const WeightView& w, const float* x, int64_t n, float* y,
                        ThreadPool& pool) {
  const int64_t cols = w.cols, main = cols / 64 * 64;
  pool.run([&](int thread, int n_threads) {
    std::vector<float> xr((size_t)cols);
    for (int64_t r = thread; r < n; r += n_threads) {
      for (int64_t c = 0; c < cols; ++c) xr[(size_t)c] = fp16_to_f32(f32_to_fp16(x[r * cols + c]));
      for (int64_t o = 0; o < w.rows; ++o) {
        const auto* wr = reinterpret_cast<const uint16_t*>(static_cast<const uint8_t*>(w.data) +
                                                           o * w.row_bytes);
        float part[64] = {}, lanes[kReduceLanes];
        for (int64_t c = 0; c < main; ++c) part[c % 64] += xr[(size_t)c] * fp16_to_f32(wr[c]);
        fold64(part, lanes);
        double sum = (double)reduce16(lanes);
        for (int64_t c = main; c < cols; ++c) sum += (double)(xr[(size_t)c] * fp16_to_f32(wr[c]));
        y[r * w.rows + o] = (float)sum;
      }
    }
  });
}

// One expert's product in llama.cpp's mul_mat_id order: its one-token dot products.
void expert_product(const WeightView& w, const float* x, int64_t n, float* y, ThreadPool& pool,
                    TokenRoles single_roles) {
  if (w.type == DType::F16) {
    f16_expert_product(w, x, n, y, pool);
  } else {
    matmul(w, x, n, y, pool, single_roles);
  }
}

void check_experts(const ExpertsView& ex, int64_t n_embd) {
  const size_t n = ex.gate.size();
  if (ex.router == nullptr || n == 0 || ex.up.size() != n || ex.down.size() != n ||
      ex.n_used <= 0 || (size_t)ex.n_used > n || ex.router->rows != (int64_t)n ||
      ex.router->cols != n_embd)
    throw_error(ErrorKind::kInvalidArgument, "moe_ffn: inconsistent expert views");
}

// Each token's chosen experts (descending probability) and their renormalized weights.
void route(const ExpertsView& ex, int64_t n_tokens, MoeScratch& s) {
  const int E = (int)ex.gate.size(), K = ex.n_used;
  s.chosen.resize((size_t)(n_tokens * K));
  s.weights.resize((size_t)(n_tokens * K));
  std::vector<float> probs((size_t)E);
  std::vector<int32_t> order((size_t)E);
  for (int64_t t = 0; t < n_tokens; ++t) {
    softmax_row(s.logits.data() + t * E, probs.data(), E);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int32_t a, int32_t b) { return probs[(size_t)a] > probs[(size_t)b]; });
    double sum = 0.0;
    for (int j = 0; j < K; ++j) sum += (double)probs[(size_t)order[(size_t)j]];
    const float total = std::max((float)sum, 6.103515625e-5f);  // as llama.cpp clamps it
    for (int j = 0; j < K; ++j) {
      const float p = probs[(size_t)order[(size_t)j]];
      s.chosen[(size_t)(t * K + j)] = order[(size_t)j];
      s.weights[(size_t)(t * K + j)] = ex.normalize ? p / total : p;
    }
  }
}

// Expert e's SwiGLU over the rows routed to it; results land in their (token, slot) rows of
// s.slots [n_tokens x n_used x n_embd].
void run_expert(const ExpertsView& ex, int e, const float* in, int64_t n_tokens, int64_t n_embd,
                ThreadPool& pool, MoeScratch& s) {
  const int K = ex.n_used;
  std::vector<int64_t> slots;  // token * K + j of each routed row
  for (int64_t i = 0; i < n_tokens * K; ++i)
    if (s.chosen[(size_t)i] == e) slots.push_back(i);
  if (slots.empty()) return;
  const int64_t n = (int64_t)slots.size(), FE = ex.gate[(size_t)e].rows;
  s.rows.resize((size_t)(n * n_embd));
  for (int64_t r = 0; r < n; ++r)
    std::copy_n(in + slots[(size_t)r] / K * n_embd, n_embd, s.rows.data() + r * n_embd);
  s.roles.assign((size_t)n, llama_batch_role(0, 1));
  s.gate.resize((size_t)(n * FE)), s.up.resize((size_t)(n * FE)),
      s.down.resize((size_t)(n * n_embd));
  const WeightView &gate = ex.gate[(size_t)e], &up = ex.up[(size_t)e];
  if (gate.type == DType::F16 || up.type == DType::F16) {
    expert_product(gate, s.rows.data(), n, s.gate.data(), pool, s.roles);
    expert_product(up, s.rows.data(), n, s.up.data(), pool, s.roles);
    swiglu(s.gate.data(), s.up.data(), s.gate.data(), n * FE);
  } else {  // both quantized: one quantization of the rows for the pair
    matmul_glu(gate, up, s.rows.data(), n, s.gate.data(), s.up.data(), pool, s.roles,
               GluActivation::kSilu);
  }
  expert_product(ex.down[(size_t)e], s.gate.data(), n, s.down.data(), pool, s.roles);
  for (int64_t r = 0; r < n; ++r)
    std::copy_n(s.down.data() + r * n_embd, n_embd, s.slots.data() + slots[(size_t)r] * n_embd);
}

// Whether every expert runs through matmul's kernels (no F16 matrix, whose mul_mat_id order
// is f16_expert_product's) with one width: then all experts go in two grouped regions.
bool groupable(const ExpertsView& ex) {
  const int64_t fe = ex.gate[0].rows;
  for (size_t e = 0; e < ex.gate.size(); ++e)
    for (const WeightView* w : {&ex.gate[e], &ex.up[e], &ex.down[e]})
      if (w->type == DType::F16 || ex.gate[e].rows != fe) return false;
  return true;
}

// Every selected expert at once: the routed rows sorted by expert (a stable counting sort, so
// each expert's rows keep their slot order), the gate/up pairs of all experts in one parallel
// region, their down products in a second, then each result copied to its (token, slot) row
// of s.slots. The same products as run_expert's, row for row (one-token order each).
void run_experts_grouped(const ExpertsView& ex, const float* in, int64_t n_tokens, int64_t n_embd,
                         ThreadPool& pool, MoeScratch& s) {
  const int E = (int)ex.gate.size(), K = ex.n_used;
  const int64_t N = n_tokens * K, FE = ex.gate[0].rows;
  s.offsets.assign((size_t)E + 1, 0);
  for (int64_t i = 0; i < N; ++i) ++s.offsets[(size_t)s.chosen[(size_t)i] + 1];
  for (int e = 0; e < E; ++e) s.offsets[(size_t)e + 1] += s.offsets[(size_t)e];
  s.order.resize((size_t)N);
  std::vector<int64_t> cursor(s.offsets.begin(), s.offsets.end() - 1);
  for (int64_t i = 0; i < N; ++i) s.order[(size_t)cursor[(size_t)s.chosen[(size_t)i]]++] = i;
  s.rows.resize((size_t)(N * n_embd));
  for (int64_t r = 0; r < N; ++r)
    std::copy_n(in + s.order[(size_t)r] / K * n_embd, n_embd, s.rows.data() + r * n_embd);
  s.roles.assign((size_t)N, llama_batch_role(0, 1));
  s.gate.resize((size_t)(N * FE)), s.up.resize((size_t)(N * FE)),
      s.down.resize((size_t)(N * n_embd));
  std::vector<GroupedProduct> pairs, downs;
  for (int e = 0; e < E; ++e) {
    const int64_t at = s.offsets[(size_t)e], n = s.offsets[(size_t)e + 1] - at;
    if (n == 0) continue;
    const TokenRoles roles(s.roles.data() + at, (size_t)n);
    pairs.push_back({&ex.gate[(size_t)e], &ex.up[(size_t)e], s.rows.data() + at * n_embd, n,
                     s.gate.data() + at * FE, s.up.data() + at * FE, roles});
    downs.push_back({&ex.down[(size_t)e], nullptr, s.gate.data() + at * FE, n,
                     s.down.data() + at * n_embd, nullptr, roles});
  }
  matmul_grouped(pairs, pool, GluActivation::kSilu);
  matmul_grouped(downs, pool);
  for (int64_t r = 0; r < N; ++r)
    std::copy_n(s.down.data() + r * n_embd, n_embd, s.slots.data() + s.order[(size_t)r] * n_embd);
}

}  // namespace

void moe_ffn(const ExpertsView& ex, const float* in, int64_t n_tokens, int64_t n_embd, float* out,
             ThreadPool& pool, MoeScratch& s, TokenRoles roles) {
  check_experts(ex, n_embd);
  const int E = (int)ex.gate.size(), K = ex.n_used;
  s.logits.resize((size_t)(n_tokens * E));
  matmul(*ex.router, in, n_tokens, s.logits.data(), pool, roles);
  route(ex, n_tokens, s);
  s.slots.resize((size_t)(n_tokens * K * n_embd));
  if (groupable(ex)) {
    run_experts_grouped(ex, in, n_tokens, n_embd, pool, s);
  } else {
    for (int e = 0; e < E; ++e) run_expert(ex, e, in, n_tokens, n_embd, pool, s);
  }
  // The shared expert (dense over every token, as any FFN) and its gate, before `in` is
  // overwritten: shared[t] = swiglu FFN(in[t]) * sigmoid(in[t] · g), the sigmoid taken as
  // silu(x) / x as llama.cpp does.
  const bool shared = ex.shared_gate != nullptr;
  if (shared) {
    const int64_t FS = ex.shared_gate->rows;
    s.gate.resize((size_t)(n_tokens * FS)), s.up.resize((size_t)(n_tokens * FS));
    s.down.resize((size_t)(n_tokens * n_embd)), s.logits.resize((size_t)n_tokens);
    matmul_glu(*ex.shared_gate, *ex.shared_up, in, n_tokens, s.gate.data(), s.up.data(), pool,
               roles, GluActivation::kSilu);
    matmul(*ex.shared_down, s.gate.data(), n_tokens, s.down.data(), pool, roles);
    matmul(*ex.shared_gate_inp, in, n_tokens, s.logits.data(), pool, roles);
  }
  // out[t] = (w0 e0 + w1 e1) + w2 e2 ...: the weighted rows added in the experts' order.
  for (int64_t t = 0; t < n_tokens; ++t) {
    float* o = out + t * n_embd;
    for (int j = 0; j < K; ++j) {
      const float w = s.weights[(size_t)(t * K + j)];
      const float* y = s.slots.data() + (t * K + j) * n_embd;
      for (int64_t d = 0; d < n_embd; ++d) o[d] = j == 0 ? y[d] * w : o[d] + y[d] * w;
    }
    if (shared) {
      const float g = s.logits[(size_t)t];
      const float gate = g / (1.0f + std::exp(-g)) / g;
      for (int64_t d = 0; d < n_embd; ++d) o[d] += s.down[(size_t)(t * n_embd + d)] * gate;
    }
  }
}

}  // namespace hablar::cpu
