#include "engine/cuda_executor.h"

#include "backend/cuda/moe.h"

#include <algorithm>
#include <array>
#include <deque>
#include <chrono>
#include <cmath>
#include <cstring>
#include <map>
#include <numeric>
#include <vector>

#include <fmt/format.h>

#include "backend/cuda/device_memory.h"
#include "backend/cuda/forward_ops.h"
#include "backend/cuda/lab_knobs.h"
#include "backend/cuda/matmul.h"
#include "backend/cuda/persistent_step_plan.h"
#include "backend/cuda/persistent_step_runner.h"
#include "backend/cuda/sampling.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/log.h"
#include "core/quant_blocks.h"
#include "engine/cuda_executor_embed.h"
#include "engine/cuda_support.h"
#include "engine/request_sampler.h"
#include "model/forward.h"
#include "model/weights.h"

namespace hablar::engine {
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

cuda::SamplingParams to_device_params(const DeviceSampling& s) {
  cuda::SamplingParams p;
  p.temperature = s.temperature, p.top_k = s.top_k, p.top_p = s.top_p, p.min_p = s.min_p;
  p.repetition_penalty = s.repetition_penalty;
  p.presence_penalty = s.presence_penalty, p.frequency_penalty = s.frequency_penalty;
  p.seed = s.seed, p.step = s.step;
  p.temperature_last = s.temperature_last;
  p.masked = s.allowed != nullptr;
  return p;
}

// Decode steps (one token per sequence) of at most kMaxGraphTokens sequences replay a CUDA
// graph captured for their bucket: 1 slot, 2, 4, 8, ... (capped at the step size), the
// unused ones inactive, and for their context bound (1k, 4k, 16k, ... positions: the
// attention's split grid sized for it; at 256 sequences of ~600 positions, a 32k-sized grid
// made a decode step 10% slower on an H100). (Buckets from 8 up cost a single stream 40% of
// its decode speed on the H200: the products' kernels for 8 rows are slower than for one.)
constexpr int32_t kMinGraphTokens = 1;
constexpr int32_t kMaxGraphTokens = 256;

class CudaExecutor : public StepExecutor {
 public:
  CudaExecutor(const model::Model& model, const CudaExecutorOptions& o);
  ~CudaExecutor() override {
    print_persistent_profile();
    for (auto& [key, graph] : graphs_) cudaGraphExecDestroy(graph);
    for (int32_t* ids : host_ids_)
      if (ids) cudaFreeHost(ids);
    if (host_masks_) cudaFreeHost(host_masks_);
  }

  int32_t n_vocab() const override { return model_.config().n_vocab; }
  int32_t n_kv_blocks() const override { return layout_.n_blocks; }
  int32_t kv_block_size() const override { return layout_.block_size; }
  bool samples_on_device() const override { return true; }
  std::string device_name() const override { return "cuda"; }
  bool last_step_was_cold() const override { return cold_; }
  ExecutorTimes times() const override {
    return {execute_seconds_ - times_.wait_seconds, times_.wait_seconds, times_.device_seconds,
            times_.stage_seconds};
  }
  void execute(std::span<const BlockCopy> copies, std::span<const ExecChunk> chunks,
               StepOutput& out) override {
    launch(copies, chunks);
    collect(out);
  }
  void launch(std::span<const BlockCopy> copies, std::span<const ExecChunk> chunks) override;
  void collect(StepOutput& out) override;
  bool feeds_tokens() const override { return feeds_; }
  void abandon() override;
  std::string describe() const override { return report_; }
  bool can_embed(std::string* why) const override { return embedder_->can_embed(why); }
  void embed(std::span<const EmbedChunk> chunks, EmbedOutput& out) override {
    embedder_->embed(chunks, out);  // cuda_executor_embed.cpp
  }

 private:
  void upload_weights();
  const float* upload_floats(const float* host, int64_t n);
  WeightView upload_matrix(const WeightView& w);
  std::vector<WeightView> upload_experts(const std::vector<WeightView>& experts);
  void size_kv_cache(const CudaExecutorOptions& o, size_t workspace_bytes);
  // Bytes one block of positions takes over every layer, K and V.
  size_t kv_block_bytes() const {
    return (layout_.block_elems(0) + layout_.block_elems(1)) * 2 * (size_t)layout_.n_layers;
  }
  void keep_bf16_weight_copies(const CudaExecutorOptions& o);
  void sample_on_device(std::span<const ExecChunk> chunks, std::span<const int32_t> device_chunks);
  const uint32_t* stage_masks(std::span<const ExecChunk> chunks,
                              std::span<const int32_t> row_chunks);
  void run_step(std::span<const ExecChunk> chunks, StepOutput& out);
  bool graph_eligible(std::span<const ExecChunk> chunks) const;
  void execute_graph(std::span<const ExecChunk> chunks, StepOutput& out);
  void stage_graph_sampling(std::span<const ExecChunk> chunks, int32_t rows);
  cudaGraphExec_t graph_for(int32_t rows, int32_t context_bound);
  void plan_persistent_step(const CudaExecutorOptions& o);

  const model::Model& model_;
  cuda::Stream stream_;
  std::vector<cuda::DeviceMemory> tensors_;
  model::Weights weights_;  // the same views, over device memory
  size_t weight_bytes_ = 0;
  KvCacheLayout layout_;
  cuda::DeviceMemory kv_;
  std::unique_ptr<cuda::ForwardOps> ops_;
  std::unique_ptr<CudaEmbedder> embedder_;  // embedding steps (any model it can run)
  int32_t max_step_tokens_ = 0;
  // Every MoE layer sizes its expert products on the device (ForwardOps::moe_sized_on_device)
  // in steps of up to moe_graph_rows_ tokens: such decode steps can be CUDA graphs.
  bool moe_graphs_ = true;
  int32_t moe_graph_rows_ = kMaxGraphTokens;
  int32_t graph_rows(int32_t n) const;  // the padded bucket of a decode step of n sequences
  // Sampling inputs and outputs, [max_step_tokens] each (history: [.. x kMaxDeviceHistory]).
  cuda::DeviceBuffer<cuda::SamplingParams> params_;
  cuda::DeviceBuffer<int32_t> history_, history_len_, ids_;
  std::vector<cuda::SamplingParams> host_params_;
  std::vector<int32_t> host_history_, host_history_len_;
  // Launched steps until collected (at most two: the second fed by the first's samples),
  // alternating between two slots of pinned ids and events.
  struct Launched {
    int slot = 0;
    std::vector<int32_t> row_of_chunk;  // the ids_ row of each chunk's sample, -1: none
    StepOutput out;                     // its logits rows, copied back when launched
    bool cold = false, profiled = false;
  };
  std::deque<Launched> launched_;
  int slot_ = 0;  // the slot of the step being launched
  std::array<int32_t*, 2> host_ids_{};  // pinned, [max_step_tokens] each
  bool feeds_ = false;                  // feeds_tokens()
  std::vector<int32_t> last_rows_;      // row_of_chunk of the last launched step
  std::vector<int32_t> fed_ids_;        // per chunk: -1 - the row its fed token is sampled in
  // The host's pinned inputs of the last launched step (ForwardOps' staging, the masks) are
  // read by the device once these complete: the next launch waits for them before staging.
  cuda::Event inputs_done_, masks_done_;
  bool inputs_recorded_ = false, masks_recorded_ = false;
  void stage_fed_tokens(std::span<const ExecChunk> chunks);
  void feed_tokens(std::span<const ExecChunk> chunks);
  // Token masks of device-sampled rows, [max_step_tokens][mask_words_] (host side pinned).
  int mask_words_ = 0;
  cuda::DeviceBuffer<uint32_t> masks_;
  uint32_t* host_masks_ = nullptr;
  std::vector<int32_t> row_chunks_;  // per sampled row: its chunk, -1 for none
  std::vector<SequenceChunk> chunks_;
  std::vector<int32_t> order_, device_chunks_;
  // Decode graphs by padded batch size and the context bound their attention is sized for.
  std::map<std::pair<int32_t, int32_t>, cudaGraphExec_t> graphs_;
  // The one-token decode step as one launch (null: the launch-per-op graph), the spare
  // residual buffer its phases alternate with, what the step embeds first, and why not.
  std::unique_ptr<cuda::PersistentStepRunner> persistent_;
  cuda::DeviceMemory persistent_residual_;
  WeightView persistent_embedding_;
  float* persistent_embedded_ = nullptr;
  std::string persistent_report_;
  // --profile: the stamps each persistent launch writes (persistent_step_runner.h), and per
  // phase kind the summed times (ns): whole, prologue, until the last block is done.
  cuda::DeviceBuffer<unsigned long long> persistent_stamps_;
  std::vector<std::string> persistent_kinds_;
  std::map<std::string, std::array<double, 3>> persistent_profile_;
  int64_t persistent_steps_ = 0;
  void add_persistent_profile();
  void print_persistent_profile() const;
  bool cold_ = false;  // the last collected step captured a graph or grew scratch memory
  // Seconds in launch() and collect() and, of them, in waiting for the device (collect); the
  // device's span of each step, from begin_device_span() (after the host's staging) to the
  // end of its last command (end_device_span). With steps launched ahead, a step's span may
  // begin before the device has finished the step before it.
  double execute_seconds_ = 0;
  ExecutorTimes times_;
  std::array<cuda::Event, 2> span_begin_, span_end_;  // per slot
  void begin_device_span() {
    span_begin_[(size_t)slot_].record(stream_.get());
    times_.stage_seconds +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - execute_begin_).count();
  }
  std::chrono::steady_clock::time_point execute_begin_;  // (launch()'s entry)
  void end_device_span() { span_end_[(size_t)slot_].record(stream_.get()); }
  std::string report_;
};

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
  void* pinned = nullptr;
  for (int32_t*& ids : host_ids_) {
    HABLAR_CUDA_CHECK(cudaMallocHost(&pinned, n * sizeof(int32_t)));
    ids = static_cast<int32_t*>(pinned);
  }
  mask_words_ = cuda::token_mask_words(c.n_vocab);
  masks_ = cuda::DeviceBuffer<uint32_t>(n * (size_t)mask_words_);
  HABLAR_CUDA_CHECK(cudaMallocHost(&pinned, n * (size_t)mask_words_ * sizeof(uint32_t)));
  host_masks_ = static_cast<uint32_t*>(pinned);
  plan_persistent_step(o);
  // Steps launched ahead need every sample in ids_ and no host read between steps (the
  // persistent step's profile stamps are read after each step).
  feeds_ = persistent_stamps_.size() == 0 && cuda::lab_knob("HABLAR_STEP_AHEAD", 1) != 0;
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
    const double block_bytes = (double)kv_block_bytes();
    const double blocks = std::ceil((double)o.kv_tokens / layout_.block_size);
    room = (double)free_bytes - margin - blocks * block_bytes;
  }
  if ((dense.empty() && qkv.empty()) || (double)bytes > 0.5 * room) return;
  ops_->keep_bf16_weights(dense, qkv);
}

void CudaExecutor::size_kv_cache(const CudaExecutorOptions& o, size_t workspace_bytes) {
  const size_t block_bytes = kv_block_bytes();
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

// A step queued on the stream: block copies, inputs (fed tokens taken from the last step's
// samples on the device), the forward, the sampling, and the copies back of the sampled ids
// (to this slot's pinned ids) and of the host-sampled rows. Returns without waiting for the
// device, unless host rows are copied back (into pageable memory, which waits).
void CudaExecutor::launch(std::span<const BlockCopy> copies, std::span<const ExecChunk> chunks) {
  if (!ops_) throw_error(ErrorKind::kUnsupported, "an encoder model only embeds");
  HABLAR_CHECK(launched_.size() < 2, "more than two steps launched");
  const auto t0 = std::chrono::steady_clock::now();
  execute_begin_ = t0;
  // The staging buffers are the last step's until the device has read them.
  if (inputs_recorded_) HABLAR_CUDA_CHECK(cudaEventSynchronize(inputs_done_.get()));
  const size_t graphs_before = graphs_.size();
  const int64_t events_before = ops_->one_time_events();
  slot_ = launched_.empty() ? 0 : 1 - launched_.back().slot;
  Launched step;
  step.slot = slot_;
  cudaStream_t stream = stream_.get();
  for (const BlockCopy& bc : copies)
    for (int layer = 0; layer < layout_.n_layers; ++layer)
      for (int kv = 0; kv < 2; ++kv) {
        auto* base = static_cast<uint16_t*>(kv_.get());
        HABLAR_CUDA_CHECK(cudaMemcpyAsync(base + layout_.offset(layer, kv, bc.dst, 0, 0, 0),
                                          base + layout_.offset(layer, kv, bc.src, 0, 0, 0),
                                          layout_.block_elems(kv) * 2, cudaMemcpyDeviceToDevice,
                                          stream));
      }
  stage_fed_tokens(chunks);
  if (graph_eligible(chunks)) {
    execute_graph(chunks, step.out);
    step.profiled = graph_rows((int32_t)chunks.size()) == 1 && persistent_ &&
                    persistent_stamps_.size() > 0;
  } else {
    run_step(chunks, step.out);
  }
  end_device_span();
  step.row_of_chunk = last_rows_;
  step.cold = graphs_.size() != graphs_before || ops_->one_time_events() != events_before;
  launched_.push_back(std::move(step));
  execute_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void CudaExecutor::collect(StepOutput& out) {
  HABLAR_CHECK(!launched_.empty(), "collecting with no step launched");
  const auto t0 = std::chrono::steady_clock::now();
  Launched step = std::move(launched_.front());
  launched_.pop_front();
  const size_t slot = (size_t)step.slot;
  HABLAR_CUDA_CHECK(cudaEventSynchronize(span_end_[slot].get()));
  const auto t1 = std::chrono::steady_clock::now();
  times_.wait_seconds += std::chrono::duration<double>(t1 - t0).count();
  times_.device_seconds += span_end_[slot].elapsed_ms_since(span_begin_[slot]) / 1e3;
  std::swap(out.logits, step.out.logits);
  out.sampled.assign(step.row_of_chunk.size(), -1);
  for (size_t i = 0; i < step.row_of_chunk.size(); ++i)
    if (step.row_of_chunk[i] >= 0) out.sampled[i] = host_ids_[slot][step.row_of_chunk[i]];
  if (step.profiled) add_persistent_profile();
  cold_ = step.cold;
  execute_seconds_ +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void CudaExecutor::abandon() {
  launched_.clear();
  cudaStreamSynchronize(stream_.get());  // (its error, if any, was the step's failure)
  cudaGetLastError();
}

// Fed chunks read their token as -1 - row (feed_sampled_tokens turns it into the id sampled
// in that row of ids_ by the last launched step, before anything reads the tokens).
void CudaExecutor::stage_fed_tokens(std::span<const ExecChunk> chunks) {
  fed_ids_.assign(chunks.size(), 0);
  for (size_t i = 0; i < chunks.size(); ++i) {
    const ExecChunk& ec = chunks[i];
    if (ec.feed < 0) continue;
    HABLAR_CHECK(feeds_ && ec.tokens.size() == 1 && (size_t)ec.feed < last_rows_.size() &&
                     last_rows_[(size_t)ec.feed] >= 0,
                 "a fed chunk names no sample of the last launched step");
    HABLAR_CHECK(!ec.sampling || (ec.sampling->history.empty() && !ec.sampling->allowed),
                 "a fed chunk's sampling reads the tokens before it");
    fed_ids_[i] = -1 - last_rows_[(size_t)ec.feed];
  }
}

// The chunks as the forward stages them, fed ones pointing at their encoded ids.
std::span<const int32_t> fed_or_own(const ExecChunk& ec, const int32_t& fed) {
  return ec.feed >= 0 ? std::span<const int32_t>(&fed, 1) : ec.tokens;
}

void CudaExecutor::feed_tokens(std::span<const ExecChunk> chunks) {
  for (const ExecChunk& ec : chunks)
    if (ec.feed >= 0) {
      cuda::feed_sampled_tokens(ids_.get(), ops_->device_tokens(), (int)ops_->n_tokens(),
                                stream_.get());
      break;
    }
  inputs_done_.record(stream_.get());
  inputs_recorded_ = true;
}

void CudaExecutor::run_step(std::span<const ExecChunk> chunks, StepOutput& out) {
  const model::ModelConfig& c = model_.config();
  cudaStream_t stream = stream_.get();
  // Logit rows: the device-sampled chunks' first (their ids come back), then every row the
  // engine samples or scores on the host, in chunk order (none for a chunk that wants none).
  chunks_.clear(), order_.clear(), device_chunks_.clear();
  std::vector<int32_t> host_rows;
  last_rows_.assign(chunks.size(), -1);
  int32_t row = 0;
  for (size_t i = 0; i < chunks.size(); ++i) {
    const ExecChunk& ec = chunks[i];
    chunks_.push_back(
        {fed_or_own(ec, fed_ids_[i]), ec.start_pos, ec.block_table, ec.all_logits, ec.prompt_len});
    const int32_t rows = ec.all_logits ? (int32_t)ec.tokens.size() : 1;
    if (ec.sampling) {
      last_rows_[i] = (int32_t)order_.size();
      order_.push_back(row), device_chunks_.push_back((int32_t)i);
    } else if (ec.wants_output || ec.all_logits) {
      for (int32_t r = 0; r < rows; ++r) host_rows.push_back(row + r);
    }
    row += rows;
  }
  const size_t n_device = order_.size();
  order_.insert(order_.end(), host_rows.begin(), host_rows.end());
  model::check_step(c, chunks_, layout_);
  ops_->begin(chunks_, order_);
  feed_tokens(chunks);
  begin_device_span();
  model::forward(c, weights_, *ops_);
  if (n_device > 0) sample_on_device(chunks, device_chunks_);
  const size_t V = (size_t)c.n_vocab;
  out.logits.resize(host_rows.size() * V);
  if (!host_rows.empty())
    HABLAR_CUDA_CHECK(cudaMemcpyAsync(out.logits.data(), ops_->device_logits() + n_device * V,
                                      host_rows.size() * V * sizeof(float), cudaMemcpyDeviceToHost,
                                      stream));
}

void CudaExecutor::sample_on_device(std::span<const ExecChunk> chunks,
                                    std::span<const int32_t> device_chunks) {
  const size_t n = device_chunks.size();
  host_params_.resize(n);
  host_history_len_.resize(n);
  int32_t max_history = 0;
  for (int32_t i : device_chunks)
    max_history = std::max(max_history, (int32_t)chunks[(size_t)i].sampling->history.size());
  HABLAR_CHECK(max_history <= kMaxDeviceHistory, "device sampling history too long");
  host_history_.assign(n * (size_t)std::max(max_history, 1), 0);
  for (size_t d = 0; d < n; ++d) {
    const DeviceSampling& s = *chunks[(size_t)device_chunks[d]].sampling;
    host_params_[d] = to_device_params(s);
    host_history_len_[d] = (int32_t)s.history.size();
    std::copy(s.history.begin(), s.history.end(),
              host_history_.begin() + (ptrdiff_t)(d * (size_t)std::max(max_history, 1)));
  }
  cudaStream_t stream = stream_.get();
  HABLAR_CUDA_CHECK(cudaMemcpyAsync(params_.get(), host_params_.data(),
                                    n * sizeof(cuda::SamplingParams), cudaMemcpyHostToDevice,
                                    stream));
  HABLAR_CUDA_CHECK(cudaMemcpyAsync(history_len_.get(), host_history_len_.data(),
                                    n * sizeof(int32_t), cudaMemcpyHostToDevice, stream));
  if (max_history > 0)
    HABLAR_CUDA_CHECK(cudaMemcpyAsync(history_.get(), host_history_.data(),
                                      host_history_.size() * sizeof(int32_t),
                                      cudaMemcpyHostToDevice, stream));
  const uint32_t* masks = stage_masks(chunks, device_chunks);
  cuda::sample_tokens(ops_->device_logits(), (int)n, model_.config().n_vocab, params_.get(),
                      max_history > 0 ? history_.get() : nullptr, history_len_.get(), max_history,
                      masks, mask_words_, ids_.get(), stream);
  HABLAR_CUDA_CHECK(
      cudaMemcpyAsync(host_ids_[(size_t)slot_], ids_.get(), n * sizeof(int32_t),
                      cudaMemcpyDeviceToHost, stream));
}

// Token masks for the sampled rows (row r samples chunk row_chunks[r], -1: none), asked of
// each chunk's mask source now that the forward is queued, so that the host computes them
// while the device runs it; uploaded behind the forward. Null when no row is masked.
const uint32_t* CudaExecutor::stage_masks(std::span<const ExecChunk> chunks,
                                          std::span<const int32_t> row_chunks) {
  const size_t words = (size_t)mask_words_;
  size_t last = 0;  // rows [0, last) are uploaded
  if (masks_recorded_) HABLAR_CUDA_CHECK(cudaEventSynchronize(masks_done_.get()));
  for (size_t r = 0; r < row_chunks.size(); ++r) {
    if (row_chunks[r] < 0) continue;
    const DeviceSampling* s = chunks[(size_t)row_chunks[r]].sampling;
    if (!s || !s->allowed) continue;
    std::span<uint32_t> mask(host_masks_ + r * words, words);
    std::fill(mask.begin(), mask.end(), 0u);
    s->allowed->fill_allowed(mask);
    last = r + 1;
  }
  if (last == 0) return nullptr;
  HABLAR_CUDA_CHECK(cudaMemcpyAsync(masks_.get(), host_masks_, last * words * sizeof(uint32_t),
                                    cudaMemcpyHostToDevice, stream_.get()));
  masks_done_.record(stream_.get());
  masks_recorded_ = true;
  return masks_.get();
}

// Mixture-of-experts steps are captured only when their expert products are sized on the
// device: otherwise each MoE layer brings its experts' row counts to the host
// (cuda::ForwardOps::moe_ffn), a synchronization that a graph cannot hold.
bool CudaExecutor::graph_eligible(std::span<const ExecChunk> chunks) const {
  if (!moe_graphs_) return false;
  if (chunks.empty() || (int32_t)chunks.size() > std::min(kMaxGraphTokens, max_step_tokens_) ||
      graph_rows((int32_t)chunks.size()) > moe_graph_rows_)
    return false;
  for (const ExecChunk& c : chunks)
    if (c.tokens.size() != 1 || c.all_logits) return false;
  return true;
}

int32_t CudaExecutor::graph_rows(int32_t n) const {
  int32_t rows = kMinGraphTokens;
  while (rows < n) rows *= 2;
  return std::min(rows, max_step_tokens_);
}

// A decode step: inputs staged and uploaded for `rows` (padded) tokens, the captured graph
// (the forward and the sampling of every row) replayed, then the sampled ids and the logits
// rows the engine samples itself copied back.
void CudaExecutor::execute_graph(std::span<const ExecChunk> chunks, StepOutput& out) {
  const model::ModelConfig& c = model_.config();
  cudaStream_t stream = stream_.get();
  const int32_t n = (int32_t)chunks.size();
  const int32_t rows = graph_rows(n);
  chunks_.clear();
  for (size_t i = 0; i < chunks.size(); ++i) {
    const ExecChunk& ec = chunks[i];
    chunks_.push_back(
        {fed_or_own(ec, fed_ids_[i]), ec.start_pos, ec.block_table, ec.all_logits, ec.prompt_len});
  }
  model::check_step(c, chunks_, layout_);
  order_.resize((size_t)rows);
  std::iota(order_.begin(), order_.end(), 0);
  ops_->stage(chunks_, order_, rows);
  ops_->upload();
  feed_tokens(chunks);
  stage_graph_sampling(chunks, rows);
  const bool profiled = rows == 1 && persistent_ && persistent_stamps_.size() > 0;
  if (profiled)
    HABLAR_CUDA_CHECK(cudaMemsetAsync(persistent_stamps_.get(), 0,
                                      persistent_stamps_.size() * sizeof(unsigned long long),
                                      stream));
  const cudaGraphExec_t graph = graph_for(rows, ops_->context_bound());  // captured on first use
  begin_device_span();
  HABLAR_CUDA_CHECK(cudaGraphLaunch(graph, stream));
  // Sampling follows the graph, so that masks are computed while the device runs it.
  row_chunks_.assign((size_t)rows, -1);
  last_rows_.assign(chunks.size(), -1);
  for (int32_t i = 0; i < n; ++i)
    if (chunks[(size_t)i].sampling) row_chunks_[(size_t)i] = i, last_rows_[(size_t)i] = i;
  const uint32_t* masks = stage_masks(chunks, row_chunks_);
  cuda::sample_tokens(ops_->device_logits(), rows, c.n_vocab, params_.get(), history_.get(),
                      history_len_.get(), kMaxDeviceHistory, masks, mask_words_, ids_.get(),
                      stream);
  HABLAR_CUDA_CHECK(cudaMemcpyAsync(host_ids_[(size_t)slot_], ids_.get(),
                                    (size_t)rows * sizeof(int32_t), cudaMemcpyDeviceToHost,
                                    stream));
  const size_t V = (size_t)c.n_vocab;
  size_t host_rows = 0;
  for (const ExecChunk& ec : chunks) host_rows += !ec.sampling && ec.wants_output ? 1 : 0;
  out.logits.resize(host_rows * V);
  size_t next = 0;
  for (int32_t i = 0; i < n; ++i)
    if (!chunks[(size_t)i].sampling && chunks[(size_t)i].wants_output)
      HABLAR_CUDA_CHECK(cudaMemcpyAsync(out.logits.data() + (next++) * V,
                                        ops_->device_logits() + (size_t)i * V, V * sizeof(float),
                                        cudaMemcpyDeviceToHost, stream));
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

// Sampling parameters of every row of a graph step (padding and host-sampled rows greedy,
// with no history: their ids are ignored), histories at a fixed stride.
void CudaExecutor::stage_graph_sampling(std::span<const ExecChunk> chunks, int32_t rows) {
  host_params_.assign((size_t)rows, cuda::SamplingParams{});
  host_history_len_.assign((size_t)rows, 0);
  for (auto& p : host_params_) p.temperature = 0.0f;
  bool any_history = false;
  for (size_t i = 0; i < chunks.size(); ++i) {
    const DeviceSampling* s = chunks[i].sampling;
    if (!s) continue;
    host_params_[i] = to_device_params(*s);
    host_history_len_[i] = (int32_t)s->history.size();
    any_history = any_history || !s->history.empty();
  }
  cudaStream_t stream = stream_.get();
  if (any_history) {
    host_history_.assign((size_t)rows * kMaxDeviceHistory, 0);
    for (size_t i = 0; i < chunks.size(); ++i)
      if (chunks[i].sampling)
        std::copy(chunks[i].sampling->history.begin(), chunks[i].sampling->history.end(),
                  host_history_.begin() + (ptrdiff_t)(i * kMaxDeviceHistory));
    HABLAR_CUDA_CHECK(cudaMemcpyAsync(history_.get(), host_history_.data(),
                                      host_history_.size() * sizeof(int32_t),
                                      cudaMemcpyHostToDevice, stream));
  }
  HABLAR_CUDA_CHECK(cudaMemcpyAsync(params_.get(), host_params_.data(),
                                    (size_t)rows * sizeof(cuda::SamplingParams),
                                    cudaMemcpyHostToDevice, stream));
  HABLAR_CUDA_CHECK(cudaMemcpyAsync(history_len_.get(), host_history_len_.data(),
                                    (size_t)rows * sizeof(int32_t), cudaMemcpyHostToDevice,
                                    stream));
}

// Records the model's forward into the persistent step's phases (persistent_step_plan.h):
// one-token decode steps then run as the embedding lookup and one persistent launch.
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

// The graph of a decode step of `rows` tokens whose contexts are within `context_bound`
// (ForwardOps::context_bound, staged), captured on first use: every launch of the forward,
// over the step buffers whose contents each replay's uploads set. (The sampling is launched
// after it, once the host has the step's token masks.)
cudaGraphExec_t CudaExecutor::graph_for(int32_t rows, int32_t context_bound) {
  const std::pair<int32_t, int32_t> key{rows, context_bound};
  if (auto it = graphs_.find(key); it != graphs_.end()) return it->second;
  const model::ModelConfig& c = model_.config();
  cudaStream_t stream = stream_.get();
  cudaGraph_t graph = nullptr;
  HABLAR_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  try {
    if (rows == 1 && persistent_) {  // the embedding lookup, then every layer in one launch
      ops_->embed(persistent_embedding_, persistent_embedded_);
      persistent_->launch(stream, persistent_stamps_.get());
    } else {
      model::forward(c, weights_, *ops_);
    }
  } catch (...) {
    cudaStreamEndCapture(stream, &graph);
    if (graph) cudaGraphDestroy(graph);
    throw;
  }
  HABLAR_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec = nullptr;
  const cudaError_t err = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  HABLAR_CUDA_CHECK(err);
  graphs_[key] = exec;
  return exec;
}

}  // namespace

std::unique_ptr<StepExecutor> make_cuda_executor(const model::Model& model,
                                                 const CudaExecutorOptions& options) {
  return std::make_unique<CudaExecutor>(model, options);
}

}  // namespace hablar::engine
