// A CUDA step launched and collected (cuda_executor_impl.h): block copies, inputs staged and
// uploaded (tokens fed from the last step's samples on the device), the forward or the
// decode graph of its bucket, sampling, and the copies back of ids and host rows.
#include "engine/cuda_executor_impl.h"

namespace hablar::engine::cuda_executor_detail {

cuda::SamplingParams to_device_params(const DeviceSampling& s) {
  cuda::SamplingParams p;
  p.temperature = s.temperature, p.top_k = s.top_k, p.top_p = s.top_p, p.min_p = s.min_p;
  p.repetition_penalty = s.repetition_penalty;
  p.presence_penalty = s.presence_penalty, p.frequency_penalty = s.frequency_penalty;
  p.seed = s.seed, p.step = s.step;
  p.temperature_last = s.temperature_last;
  p.masked = s.allowed != nullptr;
  p.n_logprobs = s.n_logprobs;
  return p;
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
  logprob_rows_ = 0;
  scored_order_.clear();
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
    step.profiled =
        graph_rows((int32_t)chunks.size()) == 1 && persistent_ && persistent_stamps_.size() > 0;
  } else {
    run_step(chunks, step.out);
  }
  end_device_span();
  step.row_of_chunk = last_rows_;
  step.logprob_rows = logprob_rows_;
  step.scored_rows = (int32_t)scored_order_.size();
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
    if (step.row_of_chunk[i] >= 0)
      out.sampled[i] = staging_[slot].ids[(size_t)step.row_of_chunk[i]];
  // A row's log-probabilities as the engine takes them (rl.chosen: the sampled or target token's).
  auto logprobs_of = [](const cuda::RowLogprobs& rl) {
    SampledLogprobs lp{true, rl.chosen, {}};
    for (int32_t t = 0; t < rl.n_top; ++t) lp.top.push_back({rl.top_ids[t], rl.top_logprobs[t]});
    return lp;
  };
  out.row_logprobs.clear();
  for (int32_t r = 0; r < step.scored_rows; ++r)
    out.row_logprobs.push_back(logprobs_of(staging_[slot].scored[(size_t)r]));
  out.logprobs.clear();
  if (step.logprob_rows > 0) {
    out.logprobs.resize(step.row_of_chunk.size());
    for (size_t i = 0; i < step.row_of_chunk.size(); ++i) {
      const int32_t row = step.row_of_chunk[i];
      if (row < 0 || row >= step.logprob_rows) continue;
      const cuda::RowLogprobs& rl = staging_[slot].logprobs[(size_t)row];
      if (rl.n_top >= 0) out.logprobs[i] = logprobs_of(rl);
    }
  }
  if (step.profiled) add_persistent_profile();
  cold_ = step.cold;
  execute_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
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
  any_fed_ = false;
  for (size_t i = 0; i < chunks.size(); ++i) {
    const ExecChunk& ec = chunks[i];
    if (ec.feed < 0) continue;
    HABLAR_CHECK(feeds_ && ec.tokens.size() == 1 && (size_t)ec.feed < last_rows_.size() &&
                     last_rows_[(size_t)ec.feed] >= 0,
                 "a fed chunk names no sample of the last launched step");
    HABLAR_CHECK(!ec.sampling || ec.sampling->history.empty() ||
                     ec.sampling->history.back() == kPendingToken,
                 "a fed chunk's penalties read a history without its pending token");
    fed_ids_[i] = -1 - last_rows_[(size_t)ec.feed];
    any_fed_ = true;
  }
}

// A fed chunk's penalty history ends with its pending token: staged, like the token, as
// -1 - r (feed_sampled_tokens fills it in on the device). Returns whether it did.
bool CudaExecutor::stage_fed_history(size_t chunk, const DeviceSampling& s, int32_t* row) const {
  if (chunk >= fed_ids_.size() || fed_ids_[chunk] >= 0 || s.history.empty()) return false;
  row[s.history.size() - 1] = fed_ids_[chunk];
  return true;
}

// The chunks as the forward stages them, fed ones pointing at their encoded ids.
static std::span<const int32_t> fed_or_own(const ExecChunk& ec, const int32_t& fed) {
  return ec.feed >= 0 ? std::span<const int32_t>(&fed, 1) : ec.tokens;
}

// model::check_step over the staged chunks, a fed token checked as id 0: it is known only on
// the device, where it becomes an id the last step sampled from the vocabulary.
void CudaExecutor::check_staged_chunks() {
  if (!any_fed_) return model::check_step(model_.config(), chunks_, layout_);
  static constexpr int32_t kSomeToken = 0;
  checked_.assign(chunks_.begin(), chunks_.end());
  for (size_t i = 0; i < checked_.size() && i < fed_ids_.size(); ++i)
    if (fed_ids_[i] < 0) checked_[i].tokens = std::span<const int32_t>(&kSomeToken, 1);
  model::check_step(model_.config(), checked_, layout_);
}

void CudaExecutor::feed_tokens() {
  if (any_fed_)
    cuda::feed_sampled_tokens(ids_.get(), ops_->device_tokens(), (int)ops_->n_tokens(),
                              stream_.get());
  inputs_done_.record(stream_.get());
  inputs_recorded_ = true;
}

void CudaExecutor::run_step(std::span<const ExecChunk> chunks, StepOutput& out) {
  const model::ModelConfig& c = model_.config();
  cudaStream_t stream = stream_.get();
  // Logit rows: the device-sampled chunks' first (their ids come back), then every row the
  // engine samples or scores on the host, in chunk order (none for a chunk that wants none).
  chunks_.clear(), order_.clear(), device_chunks_.clear(), scored_order_.clear();
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
      HABLAR_CHECK(
          ec.row_targets.empty() || (ec.all_logits && ec.row_targets.size() == (size_t)rows),
          "scored rows: one target per row of an all-logits chunk");
      for (int32_t r = 0; r < rows; ++r)
        (!ec.row_targets.empty() && ec.row_targets[(size_t)r] >= 0 ? scored_order_ : host_rows)
            .push_back(row + r);
    }
    row += rows;
  }
  const size_t n_device = order_.size();
  order_.insert(order_.end(), host_rows.begin(), host_rows.end());
  order_.insert(order_.end(), scored_order_.begin(), scored_order_.end());
  check_staged_chunks();
  ops_->begin(chunks_, order_);
  feed_tokens();
  begin_device_span();
  model::forward(c, weights_, *ops_);
  if (n_device > 0) sample_on_device(chunks, device_chunks_);
  if (!scored_order_.empty()) score_rows(chunks, n_device + host_rows.size());
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
  SamplingStaging& st = staging_[(size_t)slot_];
  int32_t max_history = 0;
  for (int32_t i : device_chunks)
    max_history = std::max(max_history, (int32_t)chunks[(size_t)i].sampling->history.size());
  HABLAR_CHECK(max_history <= kMaxDeviceHistory, "device sampling history too long");
  const size_t stride = (size_t)std::max(max_history, 1);
  std::fill(st.history.get(), st.history.get() + n * stride, 0);
  bool fed_history = false;
  for (size_t d = 0; d < n; ++d) {
    const size_t chunk = (size_t)device_chunks[d];
    const DeviceSampling& s = *chunks[chunk].sampling;
    st.params[d] = to_device_params(s);
    if (s.n_logprobs >= 0) logprob_rows_ = (int32_t)d + 1;
    st.history_len[d] = (int32_t)s.history.size();
    std::copy(s.history.begin(), s.history.end(), st.history.get() + d * stride);
    fed_history = stage_fed_history(chunk, s, st.history.get() + d * stride) || fed_history;
  }
  cudaStream_t stream = stream_.get();
  HABLAR_CUDA_CHECK(cudaMemcpyAsync(params_.get(), st.params.get(),
                                    n * sizeof(cuda::SamplingParams), cudaMemcpyHostToDevice,
                                    stream));
  HABLAR_CUDA_CHECK(cudaMemcpyAsync(history_len_.get(), st.history_len.get(), n * sizeof(int32_t),
                                    cudaMemcpyHostToDevice, stream));
  if (max_history > 0)
    HABLAR_CUDA_CHECK(cudaMemcpyAsync(history_.get(), st.history.get(),
                                      n * stride * sizeof(int32_t), cudaMemcpyHostToDevice,
                                      stream));
  // (ids_ still holds the last step's samples: this step's are drawn below.)
  if (fed_history) cuda::feed_sampled_tokens(ids_.get(), history_.get(), (int)(n * stride), stream);
  const uint32_t* masks = stage_masks(chunks, device_chunks);
  sample_rows((int32_t)n, max_history > 0 ? history_.get() : nullptr, max_history, masks);
}

// The prompt rows scored on the device, logits rows [first_row, + scored_order_.size()): each
// row's target's log-probability and its chunk's top n (token_logprobs.h, no history), copied
// back to this slot's pinned staging.
void CudaExecutor::score_rows(std::span<const ExecChunk> chunks, size_t first_row) {
  SamplingStaging& st = staging_[(size_t)slot_];
  size_t n = 0;
  for (const ExecChunk& ec : chunks)
    for (int32_t target : ec.row_targets) {
      if (target < 0) continue;
      HABLAR_CHECK(target < model_.config().n_vocab, "a scored row's target is out of range");
      cuda::SamplingParams p;
      p.n_logprobs = std::clamp(ec.n_row_logprobs, 0, cuda::kMaxTopLogprobs);
      st.scored_params[n] = p;
      st.scored_targets[n] = target;
      n += 1;
    }
  HABLAR_CHECK(n == scored_order_.size(), "scored rows and targets disagree");
  cudaStream_t stream = stream_.get();
  HABLAR_CUDA_CHECK(cudaMemcpyAsync(scored_params_.get(), st.scored_params.get(),
                                    n * sizeof(cuda::SamplingParams), cudaMemcpyHostToDevice,
                                    stream));
  HABLAR_CUDA_CHECK(cudaMemcpyAsync(scored_targets_.get(), st.scored_targets.get(),
                                    n * sizeof(int32_t), cudaMemcpyHostToDevice, stream));
  const int vocab = model_.config().n_vocab;
  const float* rows = ops_->device_logits() + first_row * (size_t)vocab;
  cuda::token_logprobs_before_sampling(rows, (int)n, vocab, scored_params_.get(), nullptr, nullptr,
                                       0, nullptr, scored_.get(), stream);
  cuda::token_logprobs_after_sampling(rows, (int)n, vocab, scored_params_.get(), nullptr, nullptr,
                                      0, nullptr, scored_targets_.get(), scored_.get(), stream);
  HABLAR_CUDA_CHECK(cudaMemcpyAsync(st.scored.get(), scored_.get(), n * sizeof(cuda::RowLogprobs),
                                    cudaMemcpyDeviceToHost, stream));
}

// Rows [0, rows) of the logits sampled, with the parameters and histories uploaded: the
// log-probabilities of rows [0, logprob_rows_) first where asked (from the raw rows), the
// draw, then the ids and log-probabilities copied back to this slot's pinned staging.
void CudaExecutor::sample_rows(int32_t rows, const int32_t* history, int max_history,
                               const uint32_t* masks) {
  cudaStream_t stream = stream_.get();
  SamplingStaging& st = staging_[(size_t)slot_];
  float* logits = ops_->device_logits();
  const int vocab = model_.config().n_vocab;
  if (logprob_rows_ > 0)
    cuda::token_logprobs_before_sampling(logits, logprob_rows_, vocab, params_.get(), history,
                                         history_len_.get(), max_history, history_raw_.get(),
                                         row_logprobs_.get(), stream);
  cuda::sample_tokens(logits, rows, vocab, params_.get(), history, history_len_.get(), max_history,
                      masks, mask_words_, ids_.get(), stream);
  if (logprob_rows_ > 0) {
    cuda::token_logprobs_after_sampling(logits, logprob_rows_, vocab, params_.get(), history,
                                        history_len_.get(), max_history, history_raw_.get(),
                                        ids_.get(), row_logprobs_.get(), stream);
    HABLAR_CUDA_CHECK(cudaMemcpyAsync(st.logprobs.get(), row_logprobs_.get(),
                                      (size_t)logprob_rows_ * sizeof(cuda::RowLogprobs),
                                      cudaMemcpyDeviceToHost, stream));
  }
  HABLAR_CUDA_CHECK(cudaMemcpyAsync(st.ids.get(), ids_.get(), (size_t)rows * sizeof(int32_t),
                                    cudaMemcpyDeviceToHost, stream));
}

// A fed chunk's token on the host: the id the step launched before this one sampled in the
// row it names, once that step has ended (its ids are copied back to its slot's staging).
int32_t CudaExecutor::fed_sample(size_t chunk) {
  HABLAR_CHECK(!launched_.empty() && chunk < fed_ids_.size() && fed_ids_[chunk] < 0,
               "a fed chunk without a step before it");
  const auto slot = (size_t)launched_.back().slot;
  HABLAR_CUDA_CHECK(cudaEventSynchronize(span_end_[slot].get()));
  return staging_[slot].ids[(size_t)(-1 - fed_ids_[chunk])];
}

// Token masks for the sampled rows (row r samples chunk row_chunks[r], -1: none), asked of
// each chunk's mask source now that the forward is queued, so that the host computes them
// while the device runs it; uploaded behind the forward. Null when no row is masked.
const uint32_t* CudaExecutor::stage_masks(std::span<const ExecChunk> chunks,
                                          std::span<const int32_t> row_chunks) {
  const size_t words = (size_t)mask_words_;
  if (masks_recorded_) HABLAR_CUDA_CHECK(cudaEventSynchronize(masks_done_.get()));
  mask_jobs_.clear();
  for (size_t r = 0; r < row_chunks.size(); ++r) {
    if (row_chunks[r] < 0) continue;
    const auto chunk = (size_t)row_chunks[r];
    const DeviceSampling* s = chunks[chunk].sampling;
    if (!s || !s->allowed) continue;
    mask_jobs_.push_back(
        {r, s->allowed, chunks[chunk].feed >= 0 ? fed_sample(chunk) : kPendingToken});
  }
  if (mask_jobs_.empty()) return nullptr;
  fill_masks();
  const size_t last = mask_jobs_.back().row + 1;  // rows [0, last) are uploaded
  HABLAR_CUDA_CHECK(cudaMemcpyAsync(masks_.get(), host_masks_.get(),
                                    last * words * sizeof(uint32_t), cudaMemcpyHostToDevice,
                                    stream_.get()));
  masks_done_.record(stream_.get());
  masks_recorded_ = true;
  return masks_.get();
}

// Each job's mask into its row of the pinned masks: on this thread alone, or claimed one at a
// time by the pool's threads where there are several.
void CudaExecutor::fill_masks() {
  const size_t words = (size_t)mask_words_;
  auto fill = [&](const MaskJob& job) {
    std::span<uint32_t> mask(host_masks_.get() + job.row * words, words);
    std::fill(mask.begin(), mask.end(), 0u);
    job.source->fill_allowed(mask, job.pending);
  };
  if (mask_jobs_.size() == 1) return fill(mask_jobs_[0]);
  if (!mask_pool_)
    mask_pool_ = std::make_unique<ThreadPool>(
        (int)std::clamp(std::thread::hardware_concurrency() / 2, 1u, 8u));
  std::atomic<size_t> next{0};
  mask_pool_->run([&](int, int) {
    for (size_t j; (j = next.fetch_add(1)) < mask_jobs_.size();) fill(mask_jobs_[j]);
  });
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
  check_staged_chunks();
  order_.resize((size_t)rows);
  std::iota(order_.begin(), order_.end(), 0);
  ops_->stage(chunks_, order_, rows);
  ops_->upload();
  feed_tokens();
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
  sample_rows(rows, history_.get(), kMaxDeviceHistory, masks);
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

// Sampling parameters of every row of a graph step (padding and host-sampled rows greedy,
// with no history: their ids are ignored), histories at a fixed stride.
void CudaExecutor::stage_graph_sampling(std::span<const ExecChunk> chunks, int32_t rows) {
  SamplingStaging& st = staging_[(size_t)slot_];
  cuda::SamplingParams greedy;
  greedy.temperature = 0.0f;
  std::fill(st.params.get(), st.params.get() + rows, greedy);
  std::fill(st.history_len.get(), st.history_len.get() + rows, 0);
  bool any_history = false;
  for (size_t i = 0; i < chunks.size(); ++i) {
    const DeviceSampling* s = chunks[i].sampling;
    if (!s) continue;
    st.params[i] = to_device_params(*s);
    if (s->n_logprobs >= 0) logprob_rows_ = (int32_t)i + 1;
    st.history_len[i] = (int32_t)s->history.size();
    any_history = any_history || !s->history.empty();
  }
  cudaStream_t stream = stream_.get();
  if (any_history) {
    const size_t words = (size_t)rows * kMaxDeviceHistory;
    std::fill(st.history.get(), st.history.get() + words, 0);
    bool fed_history = false;
    for (size_t i = 0; i < chunks.size(); ++i) {
      const DeviceSampling* s = chunks[i].sampling;
      if (!s) continue;
      int32_t* row = st.history.get() + i * kMaxDeviceHistory;
      std::copy(s->history.begin(), s->history.end(), row);
      fed_history = stage_fed_history(i, *s, row) || fed_history;
    }
    HABLAR_CUDA_CHECK(cudaMemcpyAsync(history_.get(), st.history.get(), words * sizeof(int32_t),
                                      cudaMemcpyHostToDevice, stream));
    // (ids_ still holds the last step's samples: the graph's sampling comes after.)
    if (fed_history) cuda::feed_sampled_tokens(ids_.get(), history_.get(), (int)words, stream);
  }
  HABLAR_CUDA_CHECK(cudaMemcpyAsync(params_.get(), st.params.get(),
                                    (size_t)rows * sizeof(cuda::SamplingParams),
                                    cudaMemcpyHostToDevice, stream));
  HABLAR_CUDA_CHECK(cudaMemcpyAsync(history_len_.get(), st.history_len.get(),
                                    (size_t)rows * sizeof(int32_t), cudaMemcpyHostToDevice,
                                    stream));
}

// Records the model's forward into the persistent step's phases (persistent_step_plan.h):
// one-token decode steps then run as the embedding lookup and one persistent launch.
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

}  // namespace hablar::engine::cuda_executor_detail
