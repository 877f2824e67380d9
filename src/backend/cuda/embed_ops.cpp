#include "backend/cuda/embed_ops.h"

#include <algorithm>
#include <cstdio>
#include <string>
#include <utility>

#include "backend/cuda/cublas_library.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/embed_kernels.h"
#include "backend/cuda/ops.h"
#include "core/error.h"

namespace hablar::cuda {
namespace {

// Grows `m` to hold n values of T (contents dropped) and copies host[0..n) into it on the
// stream (pageable source: the call returns once the source has been read).
template <typename T>
T* stage(DeviceMemory& m, const T* host, size_t n, cudaStream_t stream) {
  if (m.bytes() < n * sizeof(T)) m = DeviceMemory(std::max<size_t>(n * sizeof(T), 256));
  if (n > 0)
    HABLAR_CUDA_CHECK(
        cudaMemcpyAsync(m.get(), host, n * sizeof(T), cudaMemcpyHostToDevice, stream));
  return static_cast<T*>(m.get());
}

template <typename T>
void stage_buffer(DeviceBuffer<T>& b, const std::vector<T>& host, cudaStream_t stream) {
  if (b.size() < host.size()) b = DeviceBuffer<T>(std::max<size_t>(host.size() * 5 / 4, 16));
  if (!host.empty())
    HABLAR_CUDA_CHECK(cudaMemcpyAsync(b.get(), host.data(), host.size() * sizeof(T),
                                      cudaMemcpyHostToDevice, stream));
}

}  // namespace

struct EmbedOps::Profile {
  std::vector<std::unique_ptr<Event>> events;  // pairs (start, end), reused every step
  std::vector<int> kinds;                      // per pair
  size_t used = 0;
  Event step_start, step_end;
  // Summed over the steps after the first (which also pays lazy module loading, cuBLAS's
  // set-up and the buffers' first allocation); the first step's total apart.
  double ms[kProfileKinds] = {}, total_ms = 0, first_ms = 0;
  int64_t steps = 0, tokens = 0;

  cudaEvent_t next() {
    if (used == events.size()) events.push_back(std::make_unique<Event>());
    return events[used++]->get();
  }
  // After the step's last event: the pairs' times added up.
  void collect(int64_t n_tokens) {
    const double step_ms = step_end.elapsed_ms_since(step_start);
    if (steps == 0) {
      first_ms = step_ms;
    } else {
      for (size_t i = 0; i < kinds.size(); ++i)
        ms[kinds[i]] += events[2 * i + 1]->elapsed_ms_since(*events[2 * i]);
      total_ms += step_ms;
      tokens += n_tokens;
    }
    used = 0, kinds.clear(), steps += 1;
  }
};

// Events around one op (no-op unless profiling); the end is recorded even when the op throws.
struct EmbedOps::Timed {
  Profile* p;
  cudaStream_t stream;
  int kind;
  Timed(Profile* profile, cudaStream_t s, int k) : p(profile), stream(s), kind(k) {
    if (p) HABLAR_CUDA_CHECK(cudaEventRecord(p->next(), stream));
  }
  ~Timed() {
    if (!p) return;
    if (cudaEventRecord(p->next(), stream) != cudaSuccess) cudaGetLastError();
    p->kinds.push_back(kind);
  }
  Timed(const Timed&) = delete;
  Timed& operator=(const Timed&) = delete;
};

EmbedOps::EmbedOps(cudaStream_t stream, bool profile) : stream_(stream) {
  act_ = {&handles_[kX], &handles_[kXb],  &handles_[kQ],    &handles_[kK],
          &handles_[kV], &handles_[kAtt], &handles_[kGate], &handles_[kUp]};
  if (profile) profile_ = std::make_unique<Profile>();
}

EmbedOps::~EmbedOps() {
  if (!profile_ || profile_->steps == 0) return;
  const Profile& p = *profile_;
  const double known = p.ms[kProducts] + p.ms[kAttention] + p.ms[kNorms];
  const double n = (double)std::max<int64_t>(1, p.steps - 1);
  std::fprintf(stderr,
               "embed profile: first step %.2f ms; then %lld steps, %lld tokens, device ms per "
               "step %.2f: products %.2f, attention %.2f, layernorm %.2f, the rest %.2f\n",
               p.first_ms, (long long)(p.steps - 1), (long long)p.tokens, p.total_ms / n,
               p.ms[kProducts] / n, p.ms[kAttention] / n, p.ms[kNorms] / n,
               (p.total_ms - known) / n);
}

bool EmbedOps::supports_head_dim(int head_dim) {
  return embed::attention_supports_head_dim(head_dim);
}

size_t EmbedOps::buffer_bytes() const {
  size_t n = 0;
  for (const Rows& r : rows_) n += r.m32.bytes() + r.m16.bytes();
  return n;
}

void EmbedOps::begin(std::span<const std::span<const int32_t>> sequences,
                     const ActivationDims& dims, std::span<const RopeParams> ropes, float rms_eps,
                     float norm_eps, bool causal) {
  dims_ = dims, rms_eps_ = rms_eps, norm_eps_ = norm_eps, causal_ = causal;
  plan_ = plan_embed_step(sequences);
  const int64_t widths[kSlots] = {dims.n_embd,   dims.n_embd,  dims.q_dim(), dims.kv_dim(),
                                  dims.kv_dim(), dims.q_dim(), dims.n_ff,    dims.n_ff,
                                  dims.n_embd,   dims.n_embd};
  // Products write F16 everywhere but into x (the decoders' f32 residual stream).
  const bool f16_preferred[kSlots] = {false, true, true, true,  true,
                                      true,  true, true, false, false};
  for (int s = 0; s < kSlots; ++s) {
    Rows& r = rows_[(size_t)s];
    r.width = widths[s], r.f16_preferred = f16_preferred[s], r.has32 = r.has16 = false;
    r.bias = nullptr;
  }
  hidden_ = nullptr;
  pending_ = {};
  if (profile_) {  // (pairs of a step that threw are dropped)
    profile_->used = 0, profile_->kinds.clear();
    profile_->step_start.record(stream_);
  }
  stage_buffer(tokens_, plan_.tokens, stream_);
  stage_buffer(positions_, plan_.positions, stream_);
  stage_buffer(seq_begin_, plan_.seq_begin, stream_);
  stage_buffer(tiles_, plan_.tiles, stream_);
  upload_rope_tables(ropes);
}

// Angle tables for positions 0..max_len-1 of every variant, kept while they cover the step.
void EmbedOps::upload_rope_tables(std::span<const RopeParams> ropes) {
  bool same = ropes.size() == ropes_.size() && plan_.max_len <= rope_positions_;
  for (size_t i = 0; same && i < ropes.size(); ++i)
    same = ropes[i].n_dims == ropes_[i].n_dims && ropes[i].freq_base == ropes_[i].freq_base &&
           ropes[i].neox == ropes_[i].neox && ropes[i].scaling == ropes_[i].scaling &&
           ropes[i].factor == ropes_[i].factor && ropes[i].freq_factors == ropes_[i].freq_factors;
  if (same) return;
  ropes_.assign(ropes.begin(), ropes.end());
  rope_positions_ = std::max(plan_.max_len, 512);
  rope_cos_.clear(), rope_sin_.clear();
  for (const RopeParams& p : ropes_) {
    const int pairs = p.n_dims / 2;
    std::vector<float> c((size_t)rope_positions_ * pairs), s(c.size());
    if (pairs > 0)
      for (int pos = 0; pos < rope_positions_; ++pos)
        rope_angles(pos, p, c.data() + (size_t)pos * pairs, s.data() + (size_t)pos * pairs);
    // On the step's stream (a copy on the legacy stream would not order with its kernels).
    stage_buffer(rope_cos_.emplace_back(), c, stream_);
    stage_buffer(rope_sin_.emplace_back(), s, stream_);
  }
}

EmbedOps::Rows& EmbedOps::raw_rows_of(const float* handle) {
  for (int s = 0; s < kSlots; ++s)
    if (handle == &handles_[(size_t)s]) return rows_[(size_t)s];
  throw_error(ErrorKind::kInternal, "cuda::EmbedOps: rows that are not one of its activations");
}

EmbedOps::Rows& EmbedOps::rows_of(const float* handle) {
  Rows& r = raw_rows_of(handle);
  if (r.bias) {  // (only F16 rows carry one)
    embed::bias_act_f16(r.f16(), r.bias, n_tokens(), r.width, false, stream_);
    r.bias = nullptr;
  }
  return r;
}

float* EmbedOps::storage32(Rows& r) {
  const size_t bytes = (size_t)(n_tokens() * r.width) * sizeof(float);
  if (r.m32.bytes() < bytes) r.m32 = DeviceMemory(bytes), r.has32 = false;
  return r.f32();
}

uint16_t* EmbedOps::storage16(Rows& r) {
  const size_t bytes = (size_t)(n_tokens() * r.width) * sizeof(uint16_t);
  if (r.m16.bytes() < bytes) r.m16 = DeviceMemory(bytes), r.has16 = false;
  return r.f16();
}

float* EmbedOps::ensure32(Rows& r) {
  float* p = storage32(r);
  if (!r.has32 && r.has16) embed::f16_to_f32(r.f16(), p, n_tokens() * r.width, stream_);
  r.has32 = true;
  return p;
}

uint16_t* EmbedOps::ensure16(Rows& r) {
  uint16_t* p = storage16(r);
  if (!r.has16 && r.has32) embed::f32_to_f16(r.f32(), p, n_tokens() * r.width, stream_);
  r.has16 = true;
  return p;
}

float* EmbedOps::write32(Rows& r) {
  float* p = storage32(r);
  r.has32 = true, r.has16 = false;
  return p;
}

uint16_t* EmbedOps::write16(Rows& r) {
  uint16_t* p = storage16(r);
  r.has16 = true, r.has32 = false;
  return p;
}

void EmbedOps::settle() {
  if (!pending_.rows) return;
  const Pending p = pending_;
  pending_ = {};
  float* x = ensure32(*p.rows);
  p.rows->has16 = false;
  embed::bias_act_f32(x, p.bias, n_tokens(), p.rows->width, false, stream_);
  if (p.residual) cuda::add(x, ensure32(*p.residual), x, n_tokens() * p.rows->width, stream_);
}

void EmbedOps::gemm_f16(const WeightView& w, const uint16_t* in, int64_t m, void* out,
                        bool out_f16) {
  // Column-major view: y^T [N x M] = (W as K x N)^T · (x as K x M).
  const float alpha = 1.0f, beta = 0.0f;
  const int lda = (int)(w.row_bytes / 2);
  HABLAR_CUBLAS_CHECK(cublas().set_stream(cublas_.get(), stream_));
  HABLAR_CUBLAS_CHECK(cublas().gemm_ex(cublas_.get(), CUBLAS_OP_T, CUBLAS_OP_N, (int)w.rows, (int)m,
                                       (int)w.cols, &alpha, w.data, CUDA_R_16F, lda, in, CUDA_R_16F,
                                       (int)w.cols, &beta, out, out_f16 ? CUDA_R_16F : CUDA_R_32F,
                                       (int)w.rows, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

bool EmbedOps::gemm_f16_gelu(const WeightView& w, const uint16_t* in, int64_t m, uint16_t* out,
                             const float* bias) {
  const uint16_t* b16 = nullptr;
  if (bias) {
    auto [it, added] = bias16_.try_emplace(bias);
    if (added) {
      it->second = DeviceBuffer<uint16_t>((size_t)w.rows);
      embed::f32_to_f16(bias, it->second.get(), w.rows, stream_);
    }
    b16 = it->second.get();
  }
  return lt_.run(static_cast<const uint16_t*>(w.data), (int64_t)(w.row_bytes / 2), w.rows, w.cols,
                 in, m, out, b16, true, stream_);
}

void EmbedOps::product(const WeightView& w, Rows& in, Rows& out, const float* bias, bool gelu) {
  HABLAR_CHECK(w.cols == in.width && w.rows == out.width, "cuda::EmbedOps: product shapes");
  const Timed timed(profile_.get(), stream_, kProducts);
  const int64_t T = n_tokens();
  const bool residual_next = &out == &rows_[kX] || &out == &rows_[kXb];
  if (w.type == DType::F16 && out.f16_preferred) {
    const uint16_t* x = ensure16(in);
    uint16_t* y = write16(out);
    if (gelu && gemm_f16_gelu(w, x, T, y, bias)) return;
    gemm_f16(w, x, T, y, true);
    if (!gelu && residual_next) {
      pending_ = {&out, bias, nullptr};  // for the LayerNorm (or any op) that reads it next
    } else if (!gelu && (&out == &rows_[kQ] || &out == &rows_[kK] || &out == &rows_[kV])) {
      out.bias = bias;  // added by attention as it reads q, k, v
    } else {
      embed::bias_act_f16(y, bias, T, out.width, gelu, stream_);
    }
    return;
  }
  float* y = nullptr;
  if (w.type == DType::F16) {
    const uint16_t* x = ensure16(in);
    y = write32(out);
    gemm_f16(w, x, T, y, false);
  } else {
    const float* x = ensure32(in);
    y = write32(out);
    prefill_.run(w, x, (int)T, y, stream_);
  }
  if (!gelu && residual_next) {
    pending_ = {&out, bias, nullptr};  // for the LayerNorm (or any op) that reads it next
    return;
  }
  embed::bias_act_f32(y, bias, T, out.width, gelu, stream_);
}

void EmbedOps::product_f32(const WeightView& w, const float* in, int64_t m, float* out) {
  if (w.type != DType::F16) return prefill_.run(w, in, (int)m, out, stream_);
  const size_t n = (size_t)(m * w.cols);
  if (f16_scratch_.bytes() < n * 2) f16_scratch_ = DeviceMemory(n * 2);
  auto* x = static_cast<uint16_t*>(f16_scratch_.get());
  embed::f32_to_f16(in, x, (int64_t)n, stream_);
  gemm_f16(w, x, m, out, false);
}

void EmbedOps::embed(const WeightView& table, float* x) {
  settle();
  embedding_gather(table, tokens_.get(), (int)n_tokens(), write32(rows_of(x)), stream_);
}

void EmbedOps::rmsnorm(const float* x, const float* weight, float* out, int64_t width) {
  settle();
  Rows &in = rows_of(x), &o = rows_of(out);
  const float* src = ensure32(in);
  float* dst = &in == &o ? ensure32(o) : write32(o);
  o.has16 = false;
  cuda::rms_norm(src, weight, dst, (int)n_tokens(), (int)width, rms_eps_, stream_);
}

void EmbedOps::matmul(const WeightView& w, const float* in, float* out) {
  settle();
  product(w, rows_of(in), rows_of(out), nullptr, false);
}

void EmbedOps::matmul_qkv(const WeightView& wq, const WeightView& wk, const WeightView& wv,
                          const float* in, float* q, float* k, float* v) {
  linear_qkv(wq, nullptr, wk, nullptr, wv, nullptr, in, q, k, v);
}

void EmbedOps::matmul_glu(const WeightView& gate, const WeightView& up, const float* in, float* out,
                          float* up_scratch, GluActivation act) {
  settle();
  Rows &x = rows_of(in), &g = rows_of(out), &u = rows_of(up_scratch);
  product(gate, x, g, nullptr, false);
  product(up, x, u, nullptr, false);
  const bool gelu = act == GluActivation::kGeluTanh;
  const int64_t n = n_tokens() * g.width;
  if (g.has16 && u.has16) {
    uint16_t* y = g.f16();
    g.has32 = false;
    return embed::glu_f16(y, u.f16(), y, n, gelu, stream_);
  }
  const float* uf = ensure32(u);
  float* gf = ensure32(g);
  g.has16 = false;
  if (gelu) return cuda::geglu(gf, uf, gf, n, stream_);
  cuda::swiglu(gf, uf, gf, n, stream_);
}

void EmbedOps::add_bias(float* x, const float* bias, int64_t width) {
  settle();
  Rows& r = rows_of(x);
  if (r.has16 && !r.has32) {
    r.has32 = false;
    return embed::bias_act_f16(r.f16(), bias, n_tokens(), width, false, stream_);
  }
  float* p = ensure32(r);
  r.has16 = false;
  embed::bias_act_f32(p, bias, n_tokens(), width, false, stream_);
}

void EmbedOps::scale(float* x, float s, int64_t width) {
  settle();
  Rows& r = rows_of(x);
  float* p = ensure32(r);
  r.has16 = false;
  cuda::scale(p, s, n_tokens() * width, stream_);
}

void EmbedOps::scale_by_position(float* x, int64_t width, const PositionScale& ps) {
  settle();
  Rows& r = rows_of(x);
  float* p = ensure32(r);
  r.has16 = false;
  cuda::scale_by_position(p, positions_.get(), n_tokens(), width, ps, stream_);
}

void EmbedOps::head_rmsnorm(float* x, const float* weight, int n_heads) {
  settle();
  Rows& r = rows_of(x);
  float* p = ensure32(r);
  r.has16 = false;
  cuda::rms_norm(p, weight, p, (int)(n_tokens() * n_heads), dims_.head_dim, rms_eps_, stream_);
}

void EmbedOps::rope(float* x, int n_heads, int variant) {
  settle();
  HABLAR_CHECK(variant >= 0 && (size_t)variant < ropes_.size(), "rope: no such RoPE variant");
  const RopeParams& p = ropes_[(size_t)variant];
  Rows& r = rows_of(x);
  float* v = ensure32(r);
  r.has16 = false;
  embed::rope_table(v, positions_.get(), rope_cos_[(size_t)variant].get(),
                    rope_sin_[(size_t)variant].get(), (int)n_tokens(), n_heads, dims_.head_dim,
                    p.n_dims / 2, p.neox, stream_);
}

void EmbedOps::attention(int, const AttentionSpec& spec, const float* q, const float* k,
                         const float* v, float* out) {
  settle();
  embed::AttentionArgs a;
  Rows &rq = raw_rows_of(q), &rk = raw_rows_of(k), &rv = raw_rows_of(v);
  a.q = ensure16(rq), a.k = ensure16(rk), a.v = ensure16(rv);
  a.bq = std::exchange(rq.bias, nullptr), a.bk = std::exchange(rk.bias, nullptr);
  a.bv = std::exchange(rv.bias, nullptr);
  a.out = write16(rows_of(out));
  a.tiles = tiles_.get(), a.n_tiles = (int32_t)plan_.tiles.size(), a.max_len = plan_.max_len;
  a.n_heads = dims_.n_heads, a.n_kv_heads = dims_.n_kv_heads, a.head_dim = dims_.head_dim;
  a.scale = spec.scale, a.softcap = spec.softcap, a.window = spec.window, a.causal = causal_;
  const Timed timed(profile_.get(), stream_, kAttention);
  embed::attention(a, stream_);
}

void EmbedOps::add(float* x, const float* y, int64_t width) {
  Rows &a = rows_of(x), &b = rows_of(y);
  if (pending_.rows == &a && !pending_.residual && &b != &a && (b.has32 || b.has16)) {
    pending_.residual = &b;  // folded into the LayerNorm that reads x
    return;
  }
  settle();
  const float* bf = ensure32(b);
  float* af = ensure32(a);
  a.has16 = false;
  cuda::add(af, bf, af, n_tokens() * width, stream_);
}

void EmbedOps::moe_ffn(const ExpertsView&, const float*, float*) {
  throw_error(ErrorKind::kUnsupported, "mixture-of-experts models do not embed on the GPU");
}

void EmbedOps::logits(const float* x, const float* norm_weight, const WeightView&, float) {
  settle();
  Rows& h = rows_[kHidden];
  const float* src = ensure32(rows_of(x));
  cuda::rms_norm(src, norm_weight, write32(h), (int)n_tokens(), dims_.n_embd, rms_eps_, stream_);
  hidden_ = &h;
}

void EmbedOps::classify(const float* x, const WeightView&, const float*) {
  settle();
  Rows& h = rows_[kHidden];
  const float* src = ensure32(rows_of(x));
  HABLAR_CUDA_CHECK(cudaMemcpyAsync(write32(h), src,
                                    (size_t)n_tokens() * (size_t)dims_.n_embd * sizeof(float),
                                    cudaMemcpyDeviceToDevice, stream_));
  hidden_ = &h;
}

const float* EmbedOps::host_rows(const float* rows, int64_t n, std::vector<float>& host) {
  settle();
  const float* src = ensure32(rows_of(rows));
  host.resize((size_t)n);
  HABLAR_CUDA_CHECK(cudaMemcpyAsync(host.data(), src, (size_t)n * sizeof(float),
                                    cudaMemcpyDeviceToHost, stream_));
  HABLAR_CUDA_CHECK(cudaStreamSynchronize(stream_));
  return host.data();
}

void EmbedOps::add_table_row(const WeightView& table, int64_t row, float* x) {
  settle();
  HABLAR_CHECK(row >= 0 && row < table.rows, "add_table_row: no such row");
  const std::vector<int32_t> id = {(int32_t)row};
  stage_buffer(row_id_, id, stream_);
  Rows& r = rows_of(x);
  float* dst = ensure32(r);
  r.has16 = false;
  Rows& s = rows_[kScratch];
  float* one = write32(s);  // (row 0 of the scratch rows)
  embedding_gather(table, row_id_.get(), 1, one, stream_);
  embed::bias_act_f32(dst, one, n_tokens(), r.width, false, stream_);
}

void EmbedOps::add_position_rows(const WeightView& table, float* x) {
  settle();
  if (plan_.max_len > table.rows)
    throw_error(ErrorKind::kInvalidArgument, "a sequence is longer than the model's " +
                                                 std::to_string(table.rows) + " positions");
  Rows& r = rows_of(x);
  float* dst = ensure32(r);
  r.has16 = false;
  float* pos = write32(rows_[kScratch]);
  embedding_gather(table, positions_.get(), (int)n_tokens(), pos, stream_);
  cuda::add(pos, dst, dst, n_tokens() * r.width, stream_);  // llama.cpp: pos + (tok + type)
}

// The output in F16 only (what the next product reads; encoders' residual stream is the
// LayerNorm's output, rounded once per layer like the products' inputs); inputs in whichever
// form is current (f32 when both are).
void EmbedOps::layernorm(const float* x, const float* weight, const float* bias, float* out,
                         int64_t width) {
  Rows &in = rows_of(x), &o = rows_of(out);
  const float* pbias = nullptr;
  Rows* residual = nullptr;
  if (pending_.rows == &in) {
    pbias = pending_.bias, residual = pending_.residual;
    pending_ = {};
  }
  settle();
  const auto form = [&](Rows& r) {
    HABLAR_CHECK(r.has32 || r.has16, "cuda::EmbedOps::layernorm: rows never written");
    return r.has32 ? embed::RowsIn{r.f32(), false} : embed::RowsIn{r.f16(), true};
  };
  const embed::RowsIn src = form(in), res = residual ? form(*residual) : embed::RowsIn{};
  uint16_t* dst = storage16(o);
  const Timed timed(profile_.get(), stream_, kNorms);
  embed::layernorm(src, pbias, res, weight, bias, nullptr, dst, (int)n_tokens(), (int)width,
                   norm_eps_, stream_);
  o.has16 = true, o.has32 = false;
}

void EmbedOps::relu_squared(float* x, int64_t width) {
  settle();
  Rows& r = rows_of(x);
  float* p = ensure32(r);
  r.has16 = false;
  cuda::relu_squared(p, n_tokens() * width, stream_);
}

void EmbedOps::gelu(float* x, int64_t width) {
  settle();
  Rows& r = rows_of(x);
  if (r.has16 && !r.has32)
    return embed::bias_act_f16(r.f16(), nullptr, n_tokens(), width, true, stream_);
  float* p = ensure32(r);
  r.has16 = false;
  embed::bias_act_f32(p, nullptr, n_tokens(), width, true, stream_);
}

void EmbedOps::linear(const WeightView& w, const float* bias, const float* in, float* out,
                      bool gelu) {
  settle();
  product(w, rows_of(in), rows_of(out), bias, gelu);
}

void EmbedOps::linear_qkv(const WeightView& wq, const float* bq, const WeightView& wk,
                          const float* bk, const WeightView& wv, const float* bv, const float* in,
                          float* q, float* k, float* v) {
  settle();
  Rows& x = rows_of(in);
  product(wq, x, rows_of(q), bq, false);
  product(wk, x, rows_of(k), bk, false);
  product(wv, x, rows_of(v), bv, false);
}

void EmbedOps::set_hidden(const float* x) {
  settle();
  hidden_ = &rows_of(x);
}

// The classifier head over the rank rows (cls_in_ [n_rank x n_embd]): result gets
// [n_rank x width] floats.
void EmbedOps::classify(const ClassifierHead& head, int32_t n_rank, std::vector<float>& result,
                        int64_t& width) {
  auto* x = static_cast<float*>(cls_in_.get());
  width = dims_.n_embd;
  const auto layer = [&](const WeightView& w, const float* b, bool tanh_act, DeviceMemory& dst) {
    const size_t bytes = (size_t)n_rank * (size_t)w.rows * sizeof(float);
    if (dst.bytes() < bytes) dst = DeviceMemory(bytes);
    auto* y = static_cast<float*>(dst.get());
    product_f32(w, x, n_rank, y);
    if (tanh_act) {
      embed::bias_tanh_f32(y, b, n_rank, w.rows, stream_);
    } else {
      embed::bias_act_f32(y, b, n_rank, w.rows, false, stream_);
    }
    x = y, width = w.rows;
  };
  if (head.cls && head.cls->data) layer(*head.cls, head.cls_b, true, cls_mid_);
  if (head.cls_out && head.cls_out->data) layer(*head.cls_out, head.cls_out_b, false, cls_out_);
  result.resize((size_t)(n_rank * width));
  HABLAR_CUDA_CHECK(cudaMemcpyAsync(result.data(), x, result.size() * sizeof(float),
                                    cudaMemcpyDeviceToHost, stream_));
}

void EmbedOps::pool(std::span<const Pooling> pooling, const ClassifierHead& head,
                    std::vector<float>& out, std::vector<int64_t>& row_begin) {
  settle();
  HABLAR_CHECK(hidden_ != nullptr, "pool: the forward left no hidden rows");
  const int64_t E = dims_.n_embd;
  int64_t rank_width = E;
  if (head.cls && head.cls->data) rank_width = head.cls->rows;
  if (head.cls_out && head.cls_out->data) rank_width = head.cls_out->rows;
  const PoolPlan pp = plan_pooling(plan_.seq_begin, pooling, E, rank_width);
  embed::PoolArgs a;
  a.hidden = ensure32(*hidden_), a.width = E, a.seq_begin = seq_begin_.get();
  a.n_seqs = (int32_t)pp.pooling.size();
  a.pooling = stage(pool_inputs_[0], pp.pooling.data(), pp.pooling.size(), stream_);
  a.out_begin = stage(pool_inputs_[1], pp.out_begin.data(), pp.out_begin.size(), stream_);
  a.rank_slot = stage(pool_inputs_[2], pp.rank_slot.data(), pp.rank_slot.size(), stream_);
  if (pooled_.bytes() < (size_t)pp.total() * sizeof(float))
    pooled_ = DeviceMemory(std::max<size_t>((size_t)pp.total() * sizeof(float), 256));
  if (pp.n_rank > 0 && cls_in_.bytes() < (size_t)(pp.n_rank * E) * sizeof(float))
    cls_in_ = DeviceMemory((size_t)(pp.n_rank * E) * sizeof(float));
  a.out = static_cast<float*>(pooled_.get()), a.rank_rows = static_cast<float*>(cls_in_.get());
  embed::pool(a, stream_);
  std::vector<float> ranked;
  int64_t width = 0;
  if (pp.n_rank > 0) classify(head, pp.n_rank, ranked, width);
  out.resize((size_t)pp.total());
  HABLAR_CUDA_CHECK(cudaMemcpyAsync(out.data(), pooled_.get(), out.size() * sizeof(float),
                                    cudaMemcpyDeviceToHost, stream_));
  if (profile_) profile_->step_end.record(stream_);
  HABLAR_CUDA_CHECK(cudaStreamSynchronize(stream_));
  if (profile_) profile_->collect(n_tokens());
  for (size_t s = 0; s < pp.rank_slot.size(); ++s) {
    if (pp.rank_slot[s] < 0) continue;
    HABLAR_CHECK(width == pp.out_begin[s + 1] - pp.out_begin[s], "pool: classifier width");
    std::copy_n(ranked.begin() + pp.rank_slot[s] * width, width, out.begin() + pp.out_begin[s]);
  }
  row_begin = pp.out_begin;
}

}  // namespace hablar::cuda
