// The CUDA executor's class, shared by its two source files: cuda_executor.cpp (weights,
// KV cache, kept copies, the persistent step: what is set up once) and cuda_executor_step.cpp
// (a step launched and collected: inputs, fed tokens, the forward or its graph, sampling).
// Private to the engine library; make_cuda_executor (cuda_executor.h) is the way in.
#pragma once

#include "engine/cuda_executor.h"

#include "backend/cuda/moe.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstring>
#include <deque>
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
#include "backend/cuda/token_logprobs.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/log.h"
#include "core/quant_blocks.h"
#include "core/thread_pool.h"
#include "engine/cuda_executor_embed.h"
#include "engine/cuda_support.h"
#include "engine/request_sampler.h"
#include "model/forward.h"
#include "model/weights.h"

namespace hablar::engine::cuda_executor_detail {

// The device sampler's parameters of a request.
cuda::SamplingParams to_device_params(const DeviceSampling& s);

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
  // K/V snapshots (cuda_executor_kv.cpp): copies through pinned staging on the stream.
  bool kv_snapshot_layout(KvCacheLayout* layout, std::string* why) const override;
  void read_kv_blocks(std::span<const int32_t> blocks, std::span<uint8_t> out) override;
  void write_kv_blocks(std::span<const int32_t> blocks, std::span<const uint8_t> in) override;
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
  void keep_bf16_weight_copies(const CudaExecutorOptions& o);
  void copy_kv_blocks(std::span<const int32_t> blocks, uint8_t* host, size_t host_bytes,
                      bool to_host);
  void sample_on_device(std::span<const ExecChunk> chunks, std::span<const int32_t> device_chunks);
  void sample_rows(int32_t rows, const int32_t* history, int max_history, const uint32_t* masks);
  const uint32_t* stage_masks(std::span<const ExecChunk> chunks,
                              std::span<const int32_t> row_chunks);
  int32_t fed_sample(size_t chunk);
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
  // Log-probabilities of the sampled rows that ask (token_logprobs.h): per row, and the raw
  // logits of each row's history; rows [0, logprob_rows_) of the step being launched.
  cuda::DeviceBuffer<cuda::RowLogprobs> row_logprobs_;
  cuda::DeviceBuffer<float> history_raw_;
  int32_t logprob_rows_ = 0;
  // Prompt rows scored on the device (ExecChunk::row_targets): their parameters (the top n),
  // targets and results, [max_step_tokens] each; the step being launched has scored_rows_.
  cuda::DeviceBuffer<cuda::SamplingParams> scored_params_;
  cuda::DeviceBuffer<int32_t> scored_targets_;
  cuda::DeviceBuffer<cuda::RowLogprobs> scored_;
  std::vector<int32_t> scored_order_;  // their logits rows, as order_ numbers them
  void score_rows(std::span<const ExecChunk> chunks, size_t first_row);
  // Their host sides, pinned, one set per slot (below): a step's uploads and its ids' copy
  // back are asynchronous, and the next launch (which may come before this step ran) stages
  // into the other slot's.
  struct SamplingStaging {
    cuda::PinnedBuffer<cuda::SamplingParams> params;
    cuda::PinnedBuffer<int32_t> history, history_len, ids;
    cuda::PinnedBuffer<cuda::RowLogprobs> logprobs;
    cuda::PinnedBuffer<cuda::SamplingParams> scored_params;
    cuda::PinnedBuffer<int32_t> scored_targets;
    cuda::PinnedBuffer<cuda::RowLogprobs> scored;
  };
  // Launched steps until collected (at most two: the second fed by the first's samples),
  // alternating between two slots of pinned ids and events.
  struct Launched {
    int slot = 0;
    std::vector<int32_t> row_of_chunk;  // the ids_ row of each chunk's sample, -1: none
    int32_t logprob_rows = 0;           // rows whose log-probabilities came back
    int32_t scored_rows = 0;            // prompt rows scored (ExecChunk::row_targets)
    StepOutput out;                     // its logits rows, copied back when launched
    bool cold = false, profiled = false;
  };
  std::deque<Launched> launched_;
  int slot_ = 0;  // the slot of the step being launched
  std::array<SamplingStaging, 2> staging_;
  bool feeds_ = false;              // feeds_tokens()
  std::vector<int32_t> last_rows_;  // row_of_chunk of the last launched step
  std::vector<int32_t> fed_ids_;    // per chunk: -1 - the row its fed token is sampled in
  bool any_fed_ = false;            // some chunk of the step being launched is fed
  // The host's pinned inputs of the last launched step (ForwardOps' staging, the masks) are
  // read by the device once these complete: the next launch waits for them before staging.
  cuda::Event inputs_done_, masks_done_;
  bool inputs_recorded_ = false, masks_recorded_ = false;
  void stage_fed_tokens(std::span<const ExecChunk> chunks);
  bool stage_fed_history(size_t chunk, const DeviceSampling& s, int32_t* row) const;
  void check_staged_chunks();
  std::vector<SequenceChunk> checked_;  // (check_staged_chunks)
  void feed_tokens();  // after the upload: fed rows filled in, the inputs' event recorded
  // Token masks of device-sampled rows, [max_step_tokens][mask_words_] (host side pinned).
  int mask_words_ = 0;
  cuda::DeviceBuffer<uint32_t> masks_;
  cuda::PinnedBuffer<uint32_t> host_masks_;
  std::vector<int32_t> row_chunks_;  // per sampled row: its chunk, -1 for none
  // The masks a step asks for, filled by a pool of host threads where there are several (a
  // grammar's walk of its vocabulary near the token budget takes milliseconds; the requests'
  // sources are independent); the pool starts with the first step that has several.
  struct MaskJob {
    size_t row;
    TokenMaskSource* source;
    int32_t pending;
  };
  std::vector<MaskJob> mask_jobs_;
  std::unique_ptr<ThreadPool> mask_pool_;
  void fill_masks();
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

}  // namespace hablar::engine::cuda_executor_detail
