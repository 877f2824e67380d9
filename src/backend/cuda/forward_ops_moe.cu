// The mixture-of-experts ops of cuda::ForwardOps (see forward_ops.h, moe.h): the step buffers,
// the router and routing, the experts' products sized on the device or on the host, and the
// weighted sum.
#include <algorithm>

#include "backend/cuda/cpu_rounding_ops.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/forward_ops.h"
#include "backend/cuda/forward_ops_buffers.h"
#include "backend/cuda/moe.h"
#include "backend/cuda/ops.h"
#include "core/error.h"
#include "core/llama_batch_roles.h"

namespace hablar::cuda {

void ForwardOps::reserve_moe(int n_experts, int n_used, int64_t n_ff_expert, int64_t n_ff_shared) {
  HABLAR_CHECK(n_experts > 0 && n_used > 0 && n_used <= n_experts && n_ff_expert > 0,
               "reserve_moe: bad expert counts");
  auto m = std::make_unique<MoeBuffers>();
  m->n_experts = n_experts, m->n_used = n_used;
  m->ff_expert = n_ff_expert, m->ff_shared = n_ff_shared;
  const size_t T = (size_t)limits_.max_tokens, N = T * (size_t)n_used, D = (size_t)dims_.n_embd;
  const size_t FE = (size_t)n_ff_expert, FS = (size_t)n_ff_shared;
  const size_t sizes[] = {
      T * (size_t)n_experts, N, N * D, N * FE, N * FE, N * D, T * FS, T * FS, T * D, T};
  size_t floats = 0;
  for (size_t n : sizes) floats += round_up(n);
  m->floats = DeviceMemory(floats * sizeof(float));
  float* p = static_cast<float*>(m->floats.get());
  float** slots[] = {&m->logits, &m->weights,     &m->rows,      &m->gate,        &m->up,
                     &m->down,   &m->shared_gate, &m->shared_up, &m->shared_down, &m->gate_logits};
  for (size_t i = 0; i < std::size(sizes); ++i) *slots[i] = p, p += round_up(sizes[i]);
  const size_t E1 = round_up((size_t)n_experts + 1);
  m->ints = DeviceMemory((3 * round_up(N) + 2 * E1) * sizeof(int32_t));
  auto* q = static_cast<int32_t*>(m->ints.get());
  m->chosen = q, m->order = q + round_up(N), m->position = q + 2 * round_up(N);
  m->offsets = q + 3 * round_up(N);
  m->active = m->offsets + E1;
  // Every expert row is a one-token product on the CPU (llama.cpp's mul_mat_id order).
  m->single_roles = DeviceMemory(N);
  set_device_bytes(m->single_roles.get(), llama_batch_role(0, 1), N);
  void* pinned = nullptr;
  HABLAR_CUDA_CHECK(cudaMallocHost(&pinned, ((size_t)n_experts + 1) * sizeof(int32_t)));
  m->host_offsets = static_cast<int32_t*>(pinned);
  moe_ = std::move(m);
  // The device-sized steps' int8 rows: inputs (n_embd wide) or SwiGLU outputs (n_ff_expert).
  if (!limits_.deterministic) {
    const int64_t rows = std::min<int64_t>((int64_t)T, moe_device_max_tokens()) * n_used;
    moe_->q8 = DeviceMemory(q8_activation_bytes((int)rows, (int64_t)std::max(D, FE)));
  }
}

void ForwardOps::expert_product(const WeightView& w, const float* in, int64_t m, float* out) {
  if (!limits_.deterministic) return product(w, in, m, out);
  if (w.type == DType::F16) return moe::f16_expert_matmul(w, in, m, out, stream_);
  product(w, in, m, out, static_cast<const uint8_t*>(moe_->single_roles.get()));
}

namespace {

// The distance between consecutive experts of one matrix when every expert has the first's
// type and shape and they lie at one stride (one 3-D tensor uploaded whole); 0 otherwise.
size_t expert_stride(std::span<const WeightView> experts) {
  if (experts.size() < 2)
    return experts.empty() ? 0 : (size_t)experts[0].rows * experts[0].row_bytes;
  const auto* base = static_cast<const uint8_t*>(experts[0].data);
  const ptrdiff_t stride = static_cast<const uint8_t*>(experts[1].data) - base;
  if (stride < (ptrdiff_t)(experts[0].rows * experts[0].row_bytes)) return 0;
  for (size_t e = 0; e < experts.size(); ++e) {
    const WeightView& w = experts[e];
    if (w.type != experts[0].type || w.rows != experts[0].rows || w.cols != experts[0].cols ||
        w.row_bytes != experts[0].row_bytes ||
        static_cast<const uint8_t*>(w.data) != base + (ptrdiff_t)e * stride)
      return 0;
  }
  return (size_t)stride;
}

struct ExpertStrides {
  size_t gate, up, down;
  bool all() const { return gate != 0 && up != 0 && down != 0; }
};
ExpertStrides expert_strides(const ExpertsView& ex) {
  return {expert_stride(ex.gate), expert_stride(ex.up), expert_stride(ex.down)};
}

}  // namespace

bool ForwardOps::moe_sized_on_device(const ExpertsView& ex) const {
  return !limits_.deterministic && expert_strides(ex).all();
}

// Up to about kGemvMaxRows rows per expert on average: beyond, the host-sized path's batched
// products (tensor cores, each expert's weights read once) win over the grouped kernel's
// CUDA-core rounds of 8 rows (qwen3-30b-a3b shape on the H200: pp512 1,764 t/s grouped,
// 3,476 host-sized; 64-sequence decode 1,114 against 310).
int64_t ForwardOps::moe_device_max_tokens() const {
  if (!moe_) return 0;
  return std::max<int64_t>(1, (int64_t)moe_->n_experts * kGemvMaxRows / moe_->n_used);
}

void ForwardOps::moe_ffn(const ExpertsView& ex, const float* in, float* out) {
  flush();
  MoeBuffers* mb = moe_.get();
  const int E = (int)ex.gate.size(), K = ex.n_used;
  HABLAR_CHECK(mb != nullptr && E == mb->n_experts && K == mb->n_used && ex.router != nullptr &&
                   ex.up.size() == ex.gate.size() && ex.down.size() == ex.gate.size() &&
                   ex.gate[0].rows == mb->ff_expert &&
                   (ex.shared_gate == nullptr || ex.shared_gate->rows == mb->ff_shared),
               "moe_ffn: experts unlike the reserved ones");
  const int64_t T = n_tokens_, N = T * K, D = dims_.n_embd;
  if (T == 0) return;
  // Route every token, then group the step's entries by expert.
  product(*ex.router, in, T, mb->logits);
  moe::route(mb->logits, T, E, K, ex.normalize, mb->chosen, mb->weights, stream_);
  moe::group(mb->chosen, N, E, mb->offsets, mb->order, mb->position, stream_, mb->active);
  // Each chosen expert's SwiGLU over its rows (rows [at, at + n) of the grouped buffers).
  const ExpertStrides stride = T <= moe_device_max_tokens() && !limits_.deterministic
                                   ? expert_strides(ex)
                                   : ExpertStrides{0, 0, 0};
  if (stride.all()) {
    expert_products_sized_on_device(ex, in, {stride.gate, stride.up, stride.down});
  } else {
    moe::gather(in, mb->order, N, K, D, mb->rows, stream_);
    expert_products_sized_on_host(ex, N);
  }
  // Qwen2-MoE's shared expert over every token (the step's products, as a dense FFN) and
  // its gate logit, before `out` (which may be `in`) is written.
  const bool shared = ex.shared_gate != nullptr;
  if (shared) {
    matmul_glu(*ex.shared_gate, *ex.shared_up, in, mb->shared_gate, mb->shared_up,
               GluActivation::kSilu);
    matmul(*ex.shared_down, mb->shared_gate, mb->shared_down);
    product(*ex.shared_gate_inp, in, T, mb->gate_logits);
  }
  moe::combine(mb->down, mb->position, mb->weights, T, K, D, shared ? mb->shared_down : nullptr,
               mb->gate_logits, out, stream_);
}

// Sized on the device (a CUDA graph can hold it): Q4_K experts on int8 rows
// (moe_grouped_q4k.cu: gate, up and SwiGLU in one pass), other types on the f32 grouped
// product (moe_grouped.cu) over the gathered rows.
void ForwardOps::expert_products_sized_on_device(const ExpertsView& ex, const float* in,
                                                 std::array<size_t, 3> strides) {
  const ExpertStrides stride{strides[0], strides[1], strides[2]};
  MoeBuffers* mb = moe_.get();
  const int E = (int)ex.gate.size(), K = ex.n_used;
  const int64_t N = n_tokens_ * K, D = dims_.n_embd, FE = mb->ff_expert;
  void* q8 = mb->q8.get();
  if (moe::grouped_q4k_supported(ex.gate[0], stride.gate) &&
      moe::grouped_q4k_supported(ex.up[0], stride.up)) {
    moe::quantize_rows(in, mb->order, K, N, D, q8, stream_);
    moe::grouped_q4k_glu(ex.gate[0], stride.gate, ex.up[0], stride.up, E, q8, N, mb->offsets,
                         mb->active, mb->gate, stream_);
  } else {
    moe::gather(in, mb->order, N, K, D, mb->rows, stream_);
    moe::grouped_product(ex.gate[0], stride.gate, E, mb->rows, N, mb->offsets, mb->active, mb->gate,
                         stream_);
    moe::grouped_product(ex.up[0], stride.up, E, mb->rows, N, mb->offsets, mb->active, mb->up,
                         stream_);
    swiglu(mb->gate, mb->up, mb->gate, N * FE, stream_);
  }
  if (moe::grouped_q4k_supported(ex.down[0], stride.down)) {
    moe::quantize_rows(mb->gate, nullptr, 1, N, FE, q8, stream_);
    moe::grouped_q4k_product(ex.down[0], stride.down, E, q8, N, mb->offsets, mb->active, mb->down,
                             stream_);
  } else {
    moe::grouped_product(ex.down[0], stride.down, E, mb->gate, N, mb->offsets, mb->active, mb->down,
                         stream_);
  }
}

// The experts' row counts come to the host (one synchronization), then each chosen
// expert's products run through product() (deterministic mode: the CPU's expert order).
void ForwardOps::expert_products_sized_on_host(const ExpertsView& ex, int64_t N) {
  MoeBuffers* mb = moe_.get();
  const int E = (int)ex.gate.size();
  const int64_t D = dims_.n_embd, FE = mb->ff_expert;
  HABLAR_CUDA_CHECK(cudaMemcpyAsync(mb->host_offsets, mb->offsets, ((size_t)E + 1) * 4,
                                    cudaMemcpyDeviceToHost, stream_));
  HABLAR_CUDA_CHECK(cudaStreamSynchronize(stream_));
  const int32_t* off = mb->host_offsets;
  for (int e = 0; e < E; ++e) {
    const int64_t at = off[e], n = off[e + 1] - off[e];
    if (n == 0) continue;
    expert_product(ex.gate[(size_t)e], mb->rows + at * D, n, mb->gate + at * FE);
    expert_product(ex.up[(size_t)e], mb->rows + at * D, n, mb->up + at * FE);
  }
  if (limits_.deterministic) {
    cpu_rounding_ops::swiglu(mb->gate, mb->up, mb->gate, N * FE, stream_);
  } else {
    swiglu(mb->gate, mb->up, mb->gate, N * FE, stream_);
  }
  for (int e = 0; e < E; ++e) {
    const int64_t at = off[e], n = off[e + 1] - off[e];
    if (n > 0) expert_product(ex.down[(size_t)e], mb->gate + at * FE, n, mb->down + at * D);
  }
}

}  // namespace hablar::cuda
