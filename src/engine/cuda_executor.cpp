#include "engine/cuda_executor_impl.h"

namespace hablar::engine {
namespace cuda_executor_detail {
namespace {

// Q8_0 rows from IQ4_NL rows: q = kIQ4NLValues[code], d unchanged (exact).
std::vector<uint8_t> iq4nl_to_q8_0(const WeightView& w) {
  const int64_t blocks_per_row = w.cols / kQK;
  std::vector<uint8_t> out((size_t)(w.rows * blocks_per_row) * sizeof(BlockQ8_0));
  auto* dst = reinterpret_cast<BlockQ8_0*>(out.data());
  for (int64_t r = 0; r < w.rows; ++r) {
    const auto* src =
        reinterpret_cast<const BlockIQ4_NL*>(static_cast<const uint8_t*>(w.data) + r * w.row_bytes);
    for (int64_t b = 0; b < blocks_per_row; ++b, ++dst) {
      dst->d = src[b].d;
      for (int j = 0; j < kQK / 2; ++j) {
        dst->qs[j] = kIQ4NLValues[src[b].qs[j] & 0xF];
        dst->qs[j + kQK / 2] = kIQ4NLValues[src[b].qs[j] >> 4];
      }
    }
  }
  return out;
}

}  // namespace

CudaExecutor::CudaExecutor(const model::Model& model, const CudaExecutorOptions& o)
    : model_(model), max_step_tokens_(o.max_step_tokens) {
  check_cuda_cache_types(o);
  std::string reason;
  if (cuda::device_count(&reason) == 0)
    throw_error(ErrorKind::kUnsupported, "no CUDA device: " + reason);
  check_cuda_shapes(model);
  const model::ModelConfig& c = model.config();
  upload_weights();
  embedder_ = std::make_unique<CudaEmbedder>(model, weights_, stream_.get(), o.deterministic,
                                             o.profile_embeddings);
  if (c.encoder) {  // encoders only embed: no KV cache, decode buffers or sampling
    layout_ = model.kv_layout_for(1);
    report_ = fmt::format("cuda: encoder, weights {:.1f} MiB, embedding steps of any size",
                          (double)(weight_bytes_ + embedder_->weight_bytes()) / (1 << 20));
    return;
  }
  const int32_t block = kDefaultKvBlockSize;
  const int32_t max_seq = o.max_seq_len > 0   ? o.max_seq_len
                          : c.n_ctx_train > 0 ? c.n_ctx_train
                                              : 8192;
  cuda::ForwardLimits limits;
  limits.max_tokens = o.max_step_tokens;
  limits.max_blocks_per_seq = (max_seq + block - 1) / block;
  limits.deterministic = o.deterministic;
  // The step buffers first (their size does not depend on the cache's), then the cache from
  // what is left.
  layout_ = model.kv_layout_for(1, block, o.cache_type_k, o.cache_type_v);
  ops_ = std::make_unique<cuda::ForwardOps>(model::activation_dims(c), layout_, nullptr,
                                            model::ropes_for_context(c, max_seq), c.rms_eps, limits,
                                            stream_.get());
  std::vector<const WeightView*> matrices = weights_.matrices();
  ops_->reserve_product_workspace(matrices);
  if (c.n_experts > 0) {
    ops_->reserve_moe(c.n_experts, c.n_experts_used, c.n_ff_expert, c.n_ff_shared);
    for (const model::LayerWeights& l : weights_.layers)
      if (!l.exp_gate.empty())
        moe_graphs_ = moe_graphs_ && ops_->moe_sized_on_device(
                                         ExpertsView{&l.router, l.exp_gate, l.exp_up, l.exp_down});
    moe_graph_rows_ = (int32_t)std::min<int64_t>(kMaxGraphTokens, ops_->moe_device_max_tokens());
  }
  keep_bf16_weight_copies(o);
  size_kv_cache(o, ops_->workspace_bytes());
  ops_->bind_cache(kv_.get(), layout_);
  const size_t n = (size_t)o.max_step_tokens;
  params_ = cuda::DeviceBuffer<cuda::SamplingParams>(n);
  history_ = cuda::DeviceBuffer<int32_t>(n * kMaxDeviceHistory);
  history_len_ = cuda::DeviceBuffer<int32_t>(n);
  ids_ = cuda::DeviceBuffer<int32_t>(n);
  static_assert(kMaxDeviceTopLogprobs == cuda::kMaxTopLogprobs);
  row_logprobs_ = cuda::DeviceBuffer<cuda::RowLogprobs>(n);
  history_raw_ = cuda::DeviceBuffer<float>(n * kMaxDeviceHistory);
  scored_params_ = cuda::DeviceBuffer<cuda::SamplingParams>(n);
  scored_targets_ = cuda::DeviceBuffer<int32_t>(n);
  scored_ = cuda::DeviceBuffer<cuda::RowLogprobs>(n);
  for (SamplingStaging& st : staging_) {
    st.params = cuda::PinnedBuffer<cuda::SamplingParams>(n);
    st.history = cuda::PinnedBuffer<int32_t>(n * kMaxDeviceHistory);
    st.history_len = cuda::PinnedBuffer<int32_t>(n);
    st.ids = cuda::PinnedBuffer<int32_t>(n);
    st.logprobs = cuda::PinnedBuffer<cuda::RowLogprobs>(n);
    st.scored_params = cuda::PinnedBuffer<cuda::SamplingParams>(n);
    st.scored_targets = cuda::PinnedBuffer<int32_t>(n);
    st.scored = cuda::PinnedBuffer<cuda::RowLogprobs>(n);
  }
  mask_words_ = cuda::token_mask_words(c.n_vocab);
  masks_ = cuda::DeviceBuffer<uint32_t>(n * (size_t)mask_words_);
  host_masks_ = cuda::PinnedBuffer<uint32_t>(n * (size_t)mask_words_);
  plan_persistent_step(o);
  // Steps launched ahead need every sample in ids_ and no host read between steps (the
  // persistent step's profile stamps are read after each step).
  feeds_ = persistent_stamps_.size() == 0 &&
           cuda::lab_knob("HABLAR_STEP_AHEAD", o.launch_ahead ? 1 : 0) != 0;
  const std::string graphs =
      !moe_graphs_ ? std::string(
                         "no CUDA graphs (mixture of experts sized on the host: a "
                         "synchronization per layer)")
                   : fmt::format(
                         "decode steps of up to {} sequences as CUDA graphs (buckets of 1, 2, 4, "
                         "... slots and of contexts up to 1k, 4k, 16k, ... positions, captured on "
                         "first use)",
                         std::min({kMaxGraphTokens, o.max_step_tokens, moe_graph_rows_}));
  report_ = fmt::format(
      "cuda: weights {:.1f} MiB, KV cache {} blocks x {} = {} positions ({:.1f} MiB {}), "
      "workspace {:.1f} MiB (of it bf16 copies of the weight matrices for steps of many rows: "
      "{:.1f} MiB), steps up to {} tokens, sequences up to {} tokens, {}; {}{}",
      (double)weight_bytes_ / (1 << 20), layout_.n_blocks, block, (int64_t)layout_.n_blocks * block,
      (double)layout_.total_bytes() / (1 << 20), kv_dtype_name(layout_.dtype),
      (double)ops_->workspace_bytes() / (1 << 20), (double)ops_->kept_bf16_bytes() / (1 << 20),
      o.max_step_tokens, max_seq, graphs, persistent_report_,
      o.deterministic ? ", deterministic" : "");
}

const float* CudaExecutor::upload_floats(const float* host, int64_t n) {
  if (host == nullptr) return nullptr;
  cuda::DeviceMemory& d = tensors_.emplace_back((size_t)n * sizeof(float));
  cuda::copy_to_device(d.get(), host, (size_t)n * sizeof(float));
  weight_bytes_ += d.bytes();
  return static_cast<const float*>(d.get());
}

WeightView CudaExecutor::upload_matrix(const WeightView& w) {
  if (w.data == nullptr) return w;  // absent (an encoder's output head, a bert's gate)
  WeightView out = w;
  std::vector<uint8_t> converted;
  const void* src = w.data;
  if (cuda_device_type(w.type) != w.type) {
    converted = iq4nl_to_q8_0(w);
    out.type = cuda_device_type(w.type);
    out.row_bytes = dtype_row_bytes(out.type, w.cols);
    src = converted.data();
  }
  const size_t bytes = (size_t)out.rows * out.row_bytes;
  cuda::DeviceMemory& d = tensors_.emplace_back(bytes);
  cuda::copy_to_device(d.get(), src, bytes);
  weight_bytes_ += bytes;
  out.data = d.get();
  return out;
}

void CudaExecutor::upload_weights() {
  const model::ModelConfig& c = model_.config();
  const model::Weights& h = model_.weights();
  weights_.token_embd = upload_matrix(h.token_embd);
  weights_.output =
      h.output.data == h.token_embd.data ? weights_.token_embd : upload_matrix(h.output);
  for (const model::WeightVectorField& f : model::weight_vector_fields())
    weights_.*f.field = upload_floats(h.*f.field, f.length(c, h));
  weights_.layers.resize(h.layers.size());
  for (size_t i = 0; i < h.layers.size(); ++i) {
    const model::LayerWeights& s = h.layers[i];
    model::LayerWeights& d = weights_.layers[i];
    for (const model::LayerVectorField& f : model::layer_vector_fields())
      d.*f.field = upload_floats(s.*f.field, f.length(c, s));
    d.wq = upload_matrix(s.wq), d.wk = upload_matrix(s.wk), d.wv = upload_matrix(s.wv);
    d.wo = upload_matrix(s.wo);
    d.w_gate = upload_matrix(s.w_gate), d.w_up = upload_matrix(s.w_up);
    d.w_down = upload_matrix(s.w_down);
    if (s.exp_gate.empty()) continue;
    d.router = upload_matrix(s.router);
    d.exp_gate = upload_experts(s.exp_gate);
    d.exp_up = upload_experts(s.exp_up);
    d.exp_down = upload_experts(s.exp_down);
    if (s.shared_gate.data == nullptr) continue;
    d.shared_gate_inp = upload_matrix(s.shared_gate_inp);
    d.shared_gate = upload_matrix(s.shared_gate), d.shared_up = upload_matrix(s.shared_up);
    d.shared_down = upload_matrix(s.shared_down);
  }
}

// A layer's experts: slices of one 3-D tensor, uploaded in one allocation (each slice at a
// 256-byte boundary, as a matrix of its own would be) when they lie back to back in the file
// and keep their type; else slice by slice.
std::vector<WeightView> CudaExecutor::upload_experts(const std::vector<WeightView>& experts) {
  const WeightView& first = experts.front();
  const size_t slice = (size_t)first.rows * first.row_bytes;
  bool contiguous = cuda_device_type(first.type) == first.type;
  for (size_t e = 0; e < experts.size(); ++e)
    contiguous = contiguous && experts[e].type == first.type && experts[e].rows == first.rows &&
                 experts[e].row_bytes == first.row_bytes &&
                 experts[e].data == static_cast<const uint8_t*>(first.data) + e * slice;
  std::vector<WeightView> out;
  if (!contiguous) {
    for (const WeightView& w : experts) out.push_back(upload_matrix(w));
    return out;
  }
  const size_t stride = (slice + 255) / 256 * 256;
  cuda::DeviceMemory& d = tensors_.emplace_back(stride * experts.size());
  HABLAR_CUDA_CHECK(cudaMemcpy2D(d.get(), stride, first.data, slice, slice, experts.size(),
                                 cudaMemcpyHostToDevice));
  // Landed for every stream (cuda::copy_to_device says why).
  HABLAR_CUDA_CHECK(cudaStreamSynchronize(cudaStreamLegacy));
  weight_bytes_ += d.bytes();
  for (size_t e = 0; e < experts.size(); ++e) {
    out.push_back(experts[e]);
    out.back().data = static_cast<const uint8_t*>(d.get()) + e * stride;
  }
  return out;
}

// Blocks from the memory left under gpu_memory_utilization (after the weights and the step
// buffers), or exactly the positions asked for.
// Steps of many rows (prompt chunks, and decode steps from cuda::kept_bf16_min_rows()
// sequences) multiply bf16 copies of the dense matrices (the layers' and the output head)
// made once here: dequantizing each matrix for every prompt chunk cost about a third of a
// prompt's time, and at many rows cuBLAS on 2-byte weights beats dequantizing inside the
// product. Only where the copies take at most half of what this server's share leaves after
// the weights and step buffers (and of what is free beside a cache of a given size), so the
// KV cache keeps most of the memory.
void CudaExecutor::keep_bf16_weight_copies(const CudaExecutorOptions& o) {
  if (o.deterministic || !o.bf16_weight_copies || o.max_step_tokens < cuda::kept_bf16_min_rows() ||
      cuda::lab_knob("HABLAR_BF16_WEIGHT_COPIES", 1) == 0)
    return;
  std::vector<const WeightView*> dense;
  // Each layer's Q, K and V are kept as one stack, whose products are then one GEMM
  // (cuda::ForwardOps::stacked_qkv: +4% prompt throughput, +3% at 256 decoding sequences on
  // an H200, stop 61); the lab knob HABLAR_QKV_STACKED=0 keeps them apart for comparisons.
  const bool stack_qkv = cuda::lab_knob("HABLAR_QKV_STACKED", 1) != 0;
  std::vector<std::array<const WeightView*, 3>> qkv;
  size_t bytes = 0;
  auto keepable = [](const WeightView* w) {
    return w->data != nullptr && cuda::cuda_supports_weight_type(w->type);
  };
  auto add = [&](const WeightView* w) {
    if (!keepable(w)) return;
    dense.push_back(w);
    bytes += (size_t)w->rows * (size_t)w->cols * sizeof(uint16_t);
  };
  for (const model::LayerWeights& l : weights_.layers) {
    if (stack_qkv && keepable(&l.wq) && keepable(&l.wk) && keepable(&l.wv)) {
      qkv.push_back({&l.wq, &l.wk, &l.wv});
      for (const WeightView* w : {&l.wq, &l.wk, &l.wv})
        bytes += (size_t)w->rows * (size_t)w->cols * sizeof(uint16_t);
    } else {
      for (const WeightView* w : {&l.wq, &l.wk, &l.wv}) add(w);
    }
    for (const WeightView* w :
         {&l.wo, &l.w_gate, &l.w_up, &l.w_down, &l.shared_gate, &l.shared_up, &l.shared_down})
      add(w);
  }
  add(&weights_.output);
  size_t free_bytes = 0, total = 0;
  HABLAR_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total));
  const double margin = 256.0 * (1 << 20);
  const double own = (double)weight_bytes_ + (double)ops_->workspace_bytes();
  double room = std::min(o.gpu_memory_utilization * (double)total - own - margin,
                         (double)free_bytes - margin);
  if (o.kv_tokens > 0) {
    const double block_bytes = (double)layout_.block_bytes();
    const double blocks = std::ceil((double)o.kv_tokens / layout_.block_size);
    room = (double)free_bytes - margin - blocks * block_bytes;
  }
  if ((dense.empty() && qkv.empty()) || (double)bytes > 0.5 * room) return;
  ops_->keep_bf16_weights(dense, qkv);
}

void CudaExecutor::size_kv_cache(const CudaExecutorOptions& o, size_t workspace_bytes) {
  const size_t block_bytes = layout_.block_bytes();
  int64_t n_blocks = 0;
  if (o.kv_tokens > 0) {
    n_blocks = (o.kv_tokens + layout_.block_size - 1) / layout_.block_size;
  } else {
    if (!(o.gpu_memory_utilization > 0.0 && o.gpu_memory_utilization <= 1.0))
      throw_error(ErrorKind::kInvalidArgument,
                  fmt::format("--gpu-memory-utilization must be in (0, 1], got {}",
                              o.gpu_memory_utilization));
    size_t free_bytes = 0, total = 0;
    HABLAR_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total));
    // The share is this server's: its weights and step buffers count against it; what other
    // processes hold does not, but the cache never takes more than is free (256 MiB stay free
    // for cuBLAS and the driver), so a second server on one GPU starts with what is left.
    const double margin = 256.0 * (1 << 20);
    const double own = (double)weight_bytes_ + (double)workspace_bytes;
    const double budget = std::min(o.gpu_memory_utilization * (double)total - own - margin,
                                   (double)free_bytes - margin);
    n_blocks = budget > 0 ? (int64_t)(budget / (double)block_bytes) : 0;
    n_blocks = std::min<int64_t>(n_blocks, 1 << 22);
  }
  if (n_blocks < 1)
    throw_error(
        ErrorKind::kResource,
        fmt::format("no device memory is left for the KV cache ({:.1f} MiB of weights, "
                    "{:.1f} MiB of step buffers); raise --gpu-memory-utilization or "
                    "lower the step size",
                    (double)weight_bytes_ / (1 << 20), (double)workspace_bytes / (1 << 20)));
  layout_.n_blocks = (int32_t)n_blocks;
  kv_ = cuda::DeviceMemory(layout_.total_bytes());
}

void CudaExecutor::add_persistent_profile() {
  const std::vector<unsigned long long> t = persistent_stamps_.download();
  const size_t n = persistent_kinds_.size();
  for (size_t i = 0; i < n; ++i) {
    auto& sums = persistent_profile_[persistent_kinds_[i]];
    sums[0] += (double)(t[4 * i + 4] - t[4 * i]);
    sums[1] += (double)(t[4 * i + 1] - t[4 * i]);
    sums[2] += (double)t[4 * i + 2] - (double)t[4 * i];
  }
  ++persistent_steps_;
}

void CudaExecutor::print_persistent_profile() const {
  if (persistent_steps_ == 0) return;
  double total = 0;
  for (const auto& [kind, sums] : persistent_profile_) total += sums[0];
  fmt::print(stderr, "persistent one-token step, {} steps: {:.1f} us a step\n", persistent_steps_,
             total / 1e3 / (double)persistent_steps_);
  for (const auto& [kind, sums] : persistent_profile_)
    fmt::print(stderr,
               "  {:<12} {:8.1f} us a step ({:4.1f}%): prologue {:7.1f}, last block done {:7.1f}\n",
               kind, sums[0] / 1e3 / (double)persistent_steps_, 100.0 * sums[0] / total,
               sums[1] / 1e3 / (double)persistent_steps_,
               sums[2] / 1e3 / (double)persistent_steps_);
}

void CudaExecutor::plan_persistent_step(const CudaExecutorOptions& o) {
  std::string why;
  const cuda::PersistentStepContext ctx = ops_->persistent_context();
  if (!o.persistent_decode || o.deterministic) {
    why = o.deterministic ? "deterministic mode" : "off; experimental";
  } else if (cuda::persistent_shapes_supported(ctx, &why) &&
             cuda::PersistentStepRunner::device_can_run(&why)) {
    persistent_residual_ = cuda::DeviceMemory((size_t)model_.config().n_embd * sizeof(float));
    cuda::PersistentStepPlan plan(ops_->activations(), ctx,
                                  static_cast<float*>(persistent_residual_.get()),
                                  ops_->device_logits(), cuda::persistent_matrix_rule);
    bool recorded = true;
    try {  // (a family whose ops the plan lacks, phi2's LayerNorm block, refuses here)
      model::forward(model_.config(), weights_, plan);
    } catch (const Error& e) {
      recorded = false, why = e.what();
    }
    if (recorded && plan.supported()) {
      persistent_ = std::make_unique<cuda::PersistentStepRunner>(plan.phases(), ctx);
      if (o.profile_decode) {
        persistent_stamps_ = cuda::DeviceBuffer<unsigned long long>(4 * plan.phases().size() + 4);
        for (const cuda::PersistentPhase& p : plan.phases())
          persistent_kinds_.push_back(cuda::persistent_phase_name(p));
      }
      persistent_embedding_ = plan.embedding();
      persistent_embedded_ = plan.embedded_rows();
      persistent_report_ = fmt::format("one-token steps as one persistent launch ({} phases)",
                                       persistent_->phases());
      return;
    }
    if (recorded) why = plan.reason();
  }
  persistent_report_ = "one-token steps launch per op (persistent step: " + why + ")";
}

}  // namespace cuda_executor_detail

std::unique_ptr<StepExecutor> make_cuda_executor(const model::Model& model,
                                                 const CudaExecutorOptions& options) {
  return std::make_unique<cuda_executor_detail::CudaExecutor>(model, options);
}

}  // namespace hablar::engine
