// The CUDA forward ops (see forward_ops.h): step inputs, the small kernels the forward needs
// beyond ops.h (bias, row gather), the queueing of the bias/RoPE/K-V pass (its kernels are in
// row_work.cu), norms, attention and logits; the product dispatch is forward_ops_products.cu.
#include "backend/cuda/forward_ops.h"
#include "backend/cuda/forward_ops_buffers.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "backend/cuda/attention.h"
#include "backend/cuda/attention_plan.h"
#include "backend/cuda/cpu_rounding.cuh"
#include "backend/cuda/cpu_rounding_ops.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/dependent_launch.cuh"
#include "backend/cuda/kv_elements.cuh"
#include "backend/cuda/lab_knobs.h"
#include "backend/cuda/matmul_f16.h"
#include "backend/cuda/moe.h"
#include "backend/cuda/ops.h"
#include "core/error.h"
#include "core/llama_batch_roles.h"

namespace hablar::cuda {
namespace {

__global__ void add_bias_kernel(float* x, const float* __restrict__ bias, int64_t rows, int width) {
  const int64_t n = rows * width;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x)
    x[i] += bias[i % width];
}

// out[r] = x[rows[r]], rows of `width` floats.
__global__ void gather_rows_kernel(const float* x, const int32_t* __restrict__ rows, int width,
                                   float* out) {
  begin_dependent_kernel();
  const float* src = x + (size_t)rows[blockIdx.x] * width;
  float* dst = out + (size_t)blockIdx.x * width;
  for (int i = threadIdx.x; i < width; i += blockDim.x) dst[i] = src[i];
}

int grid_for(int64_t n) {
  return (int)std::min<int64_t>((n + 255) / 256, 4096);
}

}  // namespace

namespace {

// An upper bound of decode_attention's workspace for any slot count up to max_slots and any
// context up to `capacity` positions (decode_splits' grid, at the larger block target).
size_t attention_workspace_bound(const ActivationDims& d, int32_t max_slots, int32_t capacity) {
  const int64_t target = 64LL * device_multiprocessors();
  size_t best = 0;
  for (int64_t n = 1; n <= max_slots; ++n) {
    const int64_t splits = decode_splits_for(target, n * d.n_kv_heads, capacity).grid;
    best = std::max(best, (size_t)(n * d.n_heads * splits * (d.head_dim + 2)) * 4);
  }
  return best;
}

}  // namespace

ForwardOps::ForwardOps(const ActivationDims& dims, const KvCacheLayout& layout, void* kv_cache,
                       std::span<const RopeParams> ropes, float rms_eps,
                       const ForwardLimits& limits, cudaStream_t stream)
    : dims_(dims),
      layout_(layout),
      kv_cache_(kv_cache),
      ropes_(ropes.begin(), ropes.end()),
      eps_(rms_eps),
      limits_(limits),
      stream_(stream),
      buf_(std::make_unique<Buffers>()) {
  HABLAR_CHECK(!ropes_.empty(), "cuda::ForwardOps needs a RoPE");
  for (const RopeParams& r : ropes_)
    HABLAR_CHECK(r.n_dims == ropes_[0].n_dims, "RoPE variants of different widths");
  rope_pairs_ = ropes_[0].n_dims / 2;
  for (const RopeParams& r : ropes_) angle_caches_.emplace_back(r);
  // Angles of every variant: [variants][T][n_dims / 2].
  const size_t T = (size_t)limits.max_tokens, RP = (size_t)rope_pairs_ * ropes_.size();
  const size_t MB = (size_t)limits.max_blocks_per_seq;
  HABLAR_CHECK(T > 0 && MB > 0, "cuda::ForwardOps needs max_tokens and max_blocks_per_seq");
  // Activations: x, xb, q, k, v, att, gate, up, final-normed rows, logits.
  const size_t widths[] = {(size_t)dims.n_embd,   (size_t)dims.n_embd,   (size_t)dims.q_dim(),
                           (size_t)dims.kv_dim(), (size_t)dims.kv_dim(), (size_t)dims.q_dim(),
                           (size_t)dims.n_ff,     (size_t)dims.n_ff,     (size_t)dims.n_embd,
                           (size_t)dims.n_vocab};
  size_t floats = 0;
  for (size_t w : widths) floats += round_up(T * w);
  buf_->activations = DeviceMemory(floats * sizeof(float));
  float* p = static_cast<float*>(buf_->activations.get());
  float* slots[10];
  for (int i = 0; i < 10; ++i) slots[i] = p, p += round_up(T * widths[i]);
  act_ = {slots[0], slots[1], slots[2], slots[3], slots[4], slots[5], slots[6], slots[7]};
  out_rows_ = slots[8];
  logits_ = slots[9];
  // Inputs: tokens, positions, logit rows, active flags (one word each), block tables, angles.
  Buffers& b = *buf_;
  const size_t byte_words = (T + 3) / 4;
  b.tokens = 0, b.positions = T, b.logit_rows = 2 * T, b.active = 3 * T;
  b.roles = b.active + byte_words, b.sampled = b.roles + byte_words;
  b.logit_roles = b.sampled + byte_words, b.decode_active = b.logit_roles + byte_words;
  b.prefill_first = b.decode_active + byte_words, b.prefill_count = b.prefill_first + T;
  b.prefill_cached = b.prefill_count + T, b.tables = b.prefill_cached + T;
  // The angle tables start at multiples of 4 words: the RoPE pass reads them 16 bytes at once.
  const auto round4 = [](size_t words) { return (words + 3) / 4 * 4; };
  b.cos = round4(b.tables + T * MB), b.sin = b.cos + round4(T * RP);
  b.input_words = b.sin + T * RP;
  b.inputs = DeviceMemory(b.input_words * 4);
  HABLAR_CUDA_CHECK(cudaMallocHost(&b.host_inputs, b.input_words * 4));
  b.attention_workspace_bytes =
      attention_workspace_bound(dims, (int32_t)T, (int32_t)(MB * layout.block_size));
  b.attention_workspace = DeviceMemory(b.attention_workspace_bytes);
  if (limits.deterministic) {
    const std::vector<float> table = cpu_rounding::gelu_half_table();
    b.gelu_table = DeviceMemory(table.size() * sizeof(float));
    copy_to_device(b.gelu_table.get(), table.data(), table.size() * sizeof(float));
  }
  if (limits.deterministic &&
      (int64_t)MB * layout.block_size > cpu_rounding_ops::max_attention_context())
    throw_error(ErrorKind::kInvalidArgument,
                "--deterministic supports contexts up to " +
                    std::to_string(cpu_rounding_ops::max_attention_context()) +
                    " tokens per sequence (asked " + std::to_string(MB * layout.block_size) +
                    "); set a smaller context");
}

ForwardOps::~ForwardOps() = default;

void ForwardOps::bind_cache(void* kv_cache, const KvCacheLayout& layout) {
  HABLAR_CHECK(layout.n_layers == layout_.n_layers && layout.n_kv_heads == layout_.n_kv_heads &&
                   layout.head_dim == layout_.head_dim && layout.block_size == layout_.block_size,
               "cuda::ForwardOps::bind_cache: another cache shape");
  kv_cache_ = kv_cache;
  layout_ = layout;
}

int64_t ForwardOps::one_time_events() const {
  return buf_->prefill.growths();
}

size_t ForwardOps::workspace_bytes() const {
  const size_t moe = moe_ ? moe_->floats.bytes() + moe_->ints.bytes() + moe_->single_roles.bytes() +
                                moe_->q8.bytes()
                          : 0;
  return buf_->activations.bytes() + buf_->inputs.bytes() + buf_->attention_workspace.bytes() +
         buf_->int8_workspace.bytes() + buf_->f16_rows.bytes() + buf_->f16_scratch.bytes() +
         buf_->bf16_rows.bytes() + buf_->cpu_rounding_workspace.bytes() +
         buf_->prefill.kept_bytes() + moe;
}

void ForwardOps::begin(std::span<const SequenceChunk> chunks,
                       std::span<const int32_t> logit_order) {
  stage(chunks, logit_order, 0);
  upload();
}

void ForwardOps::stage(std::span<const SequenceChunk> chunks, std::span<const int32_t> logit_order,
                       int64_t pad_to) {
  Buffers& b = *buf_;
  b.pending_rows = {}, b.pending_add = {};  // left only by a forward that threw
  const size_t T_max = (size_t)limits_.max_tokens, MB = (size_t)limits_.max_blocks_per_seq;
  const int RP = rope_pairs_;
  auto* words = static_cast<int32_t*>(b.host_inputs);
  auto* floats = static_cast<float*>(b.host_inputs);
  auto* active = reinterpret_cast<uint8_t*>(words + b.active);
  auto* roles = reinterpret_cast<uint8_t*>(words + b.roles);
  auto* sampled = reinterpret_cast<uint8_t*>(words + b.sampled);
  auto* logit_roles = reinterpret_cast<uint8_t*>(words + b.logit_roles);
  std::vector<StepChunkRows> chunk_rows;  // for the attention plan (attention_plan.h)
  std::vector<int32_t> rows_in_chunk_order;
  std::vector<uint8_t> row_roles_in_chunk_order;  // the role each logit row's product takes
  int64_t t = 0;
  max_context_ = 0;
  // The block-table entries the step can read: the blocks that hold its chunks' positions.
  // Rows keep their stride of MB entries, but only the first table_width_ of each are
  // written and uploaded (a model's full context is thousands of entries a row, and a step
  // of 2,048 rows would move that many times over).
  table_width_ = 1;
  one_token_rows_ = true;
  for (const SequenceChunk& ch : chunks) {
    one_token_rows_ = one_token_rows_ && ch.tokens.size() == 1;
    const int64_t needed =
        (ch.start_pos + (int64_t)ch.tokens.size() + layout_.block_size - 1) / layout_.block_size;
    HABLAR_CHECK((size_t)needed <= MB, "a sequence is longer than the executor's context limit");
    table_width_ = std::max(table_width_, (size_t)needed);
  }
  const size_t W = table_width_;
  // Token t of the step: its id, position, sequence's block table and RoPE angles.
  const auto put = [&](int32_t token, int32_t pos, std::span<const int32_t> table, bool live) {
    HABLAR_CHECK((size_t)t < T_max, "more tokens in a step than the executor's limit");
    words[b.tokens + t] = token;
    words[b.positions + t] = pos;
    active[t] = live ? 1 : 0;
    roles[t] = 0, sampled[t] = 0;
    int32_t* row = words + b.tables + t * MB;
    const size_t n = std::min(table.size(), W);
    std::memcpy(row, table.data(), n * 4);
    std::fill(row + n, row + W, 0);
    for (size_t r = 0; r < ropes_.size(); ++r) {
      const size_t at = (r * T_max + (size_t)t) * RP;
      const float *cos_t = nullptr, *sin_t = nullptr;
      angle_caches_[r].angles(pos, &cos_t, &sin_t);
      std::memcpy(floats + b.cos + at, cos_t, RP * sizeof(float));
      std::memcpy(floats + b.sin + at, sin_t, RP * sizeof(float));
    }
  };
  for (const SequenceChunk& ch : chunks) {
    chunk_rows.push_back({(int32_t)t, (int32_t)ch.tokens.size(), ch.start_pos});
    for (size_t i = 0; i < ch.tokens.size(); ++i, ++t) {
      const int32_t pos = ch.start_pos + (int32_t)i;
      put(ch.tokens[i], pos, ch.block_table, true);
      const TokenPlace place = token_place(ch, i);
      roles[t] = place.role, sampled[t] = place.sampled ? 1 : 0;
      max_context_ = std::max(max_context_, pos + 1);
      if (ch.all_logits || i + 1 == ch.tokens.size()) {
        // As the CPU: all rows of an all-logits chunk keep their roles, a last row alone is
        // a batch of one.
        rows_in_chunk_order.push_back((int32_t)t);
        row_roles_in_chunk_order.push_back(ch.all_logits ? place.role : llama_batch_role(0, 1));
      }
    }
  }
  // Padding up to a captured graph's size: token 0 at position 0 of no sequence, inactive
  // (attention neither writes nor reads it; its other rows are computed and ignored).
  for (; t < pad_to; ++t) {
    put(0, 0, {}, false);
    rows_in_chunk_order.push_back((int32_t)t);
    row_roles_in_chunk_order.push_back(0);
  }
  // A graph's attention is sized for a bound of the step's contexts, fixed for the graph.
  if (pad_to > 0)
    max_context_ = decode_graph_context_bound(max_context_, (int32_t)(MB * layout_.block_size));
  n_tokens_ = t;
  plan_attention(chunk_rows, pad_to);
  n_logit_rows_ = (int32_t)logit_order.size();
  HABLAR_CHECK(logit_order.size() <= rows_in_chunk_order.size(), "bad logit order");
  for (size_t r = 0; r < logit_order.size(); ++r) {
    words[b.logit_rows + r] = rows_in_chunk_order[(size_t)logit_order[r]];
    logit_roles[r] = row_roles_in_chunk_order[(size_t)logit_order[r]];
  }
}

void ForwardOps::upload() {
  // Only the rows of this step: [tokens | positions | logit rows | active] for the first
  // n_tokens of each, block tables and angles of n_tokens rows.
  const Buffers& b = *buf_;
  const size_t T = (size_t)n_tokens_, MB = (size_t)limits_.max_blocks_per_seq;
  const size_t RP = (size_t)rope_pairs_, T_max = (size_t)limits_.max_tokens;
  const auto copy = [&](size_t word, size_t n_words) {
    HABLAR_CUDA_CHECK(cudaMemcpyAsync(static_cast<int32_t*>(b.inputs.get()) + word,
                                      static_cast<const int32_t*>(b.host_inputs) + word,
                                      n_words * 4, cudaMemcpyHostToDevice, stream_));
  };
  copy(b.tokens, T), copy(b.positions, T), copy(b.logit_rows, T);
  const size_t byte_words = (T + 3) / 4;
  copy(b.active, byte_words), copy(b.roles, byte_words), copy(b.sampled, byte_words);
  copy(b.logit_roles, byte_words);
  const size_t chunks = (size_t)n_prefill_chunks_;  // (none in a decode step)
  if (chunks > 0) {
    copy(b.decode_active, byte_words);
    copy(b.prefill_first, chunks), copy(b.prefill_count, chunks), copy(b.prefill_cached, chunks);
  }
  // The first table_width_ entries of each of the T rows (stride MB on both sides): the
  // kernels read no entry past the blocks of a row's own positions.
  if (T > 0)
    HABLAR_CUDA_CHECK(cudaMemcpy2DAsync(static_cast<int32_t*>(b.inputs.get()) + b.tables, MB * 4,
                                        static_cast<const int32_t*>(b.host_inputs) + b.tables,
                                        MB * 4, table_width_ * 4, T, cudaMemcpyHostToDevice,
                                        stream_));
  for (size_t r = 0; r < ropes_.size(); ++r)  // each variant's first T rows
    copy(b.cos + r * T_max * RP, T * RP), copy(b.sin + r * T_max * RP, T * RP);
}

int32_t* ForwardOps::device_tokens() const {
  return static_cast<int32_t*>(buf_->inputs.get()) + buf_->tokens;
}

void ForwardOps::embed(const WeightView& table, float* x) {
  flush();
  const auto* inputs = static_cast<const int32_t*>(buf_->inputs.get());
  if (limits_.deterministic)
    return cpu_rounding_ops::embed(table, inputs + buf_->tokens, n_tokens_, x, stream_);
  embedding_gather(table, inputs + buf_->tokens, (int)n_tokens_, x, stream_);
}

// A residual add queued on x runs inside this norm (add_rms_norm: one pass, same values);
// the normed rows are quantized for the int8 products, or converted for the f16 products, in
// the same launch where they can be.
void ForwardOps::rmsnorm(const float* x, const float* weight, float* out, int64_t width) {
  norm_rows(x, weight, out, width, true);
}

// The readers' products all over kept bf16 copies: the norm writes their bf16 rows alone.
void ForwardOps::rmsnorm_for_products(const float* x, const float* weight, float* out,
                                      int64_t width, std::span<const WeightView* const> readers) {
  const bool bf16_only = writer_writes_bf16(n_tokens_, width) &&
                         rms_norm_bf16_only_supported((int)width) &&
                         lab_knob("HABLAR_NORM_BF16_ONLY", 1) != 0 && all_take_kept_copies(readers);
  norm_rows(x, weight, out, width, !bf16_only);
}

void ForwardOps::norm_rows(const float* x, const float* weight, float* out, int64_t width,
                           bool f32_out) {
  flush_row_work();
  if (limits_.deterministic) {
    flush_add();
    return cpu_rounding_ops::rms_norm(x, weight, out, n_tokens_, (int)width, eps_, stream_);
  }
  auto& add = buf_->pending_add;
  const bool with_add = add.x != nullptr && add.x == x && add.width == width;
  if (!with_add) flush_add();
  const int rows = (int)n_tokens_, dim = (int)width;
  // The fused forms take the queued add's rows, or x alone with y = null (x only read).
  float* in = with_add ? add.x : const_cast<float*>(x);
  const float* y = with_add ? add.y : nullptr;
  if (writer_writes_bf16(n_tokens_, width)) {
    auto* bf16 = static_cast<uint16_t*>(buf_->bf16_rows.get());
    add_rms_norm_bf16(in, y, weight, f32_out ? out : nullptr, rows, dim, eps_, bf16, stream_);
    add = {};
    buf_->bf16_holds = out;
    if (!f32_out) buf_->bf16_only = out;
    return;
  }
  HABLAR_CHECK(f32_out, "ForwardOps: a norm without its f32 rows where no bf16 rows are written");
  if (writer_converts(n_tokens_, width)) {
    add_rms_norm_f16(in, y, weight, out, rows, dim, eps_, buf_->f16_rows.get(),
                     buf_->f16_rows.bytes(), stream_);
    add = {};
    buf_->f16_holds = out;
    return;
  }
  if (writer_quantizes(n_tokens_, width)) {
    add_rms_norm_q8(in, y, weight, out, rows, dim, eps_, buf_->int8_workspace.get(), stream_);
    add = {};
    buf_->q8_holds = out;
    return;
  }
  if (with_add) {
    add_rms_norm(add.x, add.y, weight, out, rows, dim, eps_, stream_);
    add = {};
    return;
  }
  rms_norm(x, weight, out, rows, dim, eps_, stream_);
}

void ForwardOps::scale(float* x, float s, int64_t width) {
  flush();
  cuda::scale(x, s, n_tokens_ * width, stream_);
}

void ForwardOps::scale_by_position(float* x, int64_t width, const PositionScale& ps) {
  flush();
  const auto* inputs = static_cast<const int32_t*>(buf_->inputs.get());
  cuda::scale_by_position(x, inputs + buf_->positions, n_tokens_, width, ps, stream_);
}

// Biases of whole heads are queued, to run with the RoPE that usually follows (q, k) or
// with the other queued rows (v): one launch instead of up to five. A queued entry of x that
// only moves its rows there (stacked_qkv) takes the bias itself (added before any RoPE).
void ForwardOps::add_bias(float* x, const float* bias, int64_t width) {
  flush_add();
  RowWorkBatch& rows = buf_->pending_rows;
  for (int i = 0; i < rows.n; ++i) {
    RowWorkEntry& e = rows.e[i];
    if (e.x == x && e.src != nullptr && e.bias == nullptr && e.variant < 0 &&
        (int64_t)e.heads * dims_.head_dim == width) {
      e.bias = bias;
      return;
    }
  }
  bool queued = false;
  for (int i = 0; i < rows.n; ++i) queued = queued || rows.e[i].x == x;
  if (queued || rows.n == 3) flush_row_work();
  if (width % dims_.head_dim == 0) {
    rows.e[rows.n++] = {x, bias, (int)(width / dims_.head_dim)};
    return;
  }
  add_bias_kernel<<<grid_for(n_tokens_ * width), 256, 0, stream_>>>(x, bias, n_tokens_, (int)width);
  HABLAR_CUDA_CHECK_LAUNCH();
}

void ForwardOps::head_rmsnorm(float* x, const float* weight, int n_heads) {
  flush();
  if (limits_.deterministic)
    return cpu_rounding_ops::rms_norm(x, weight, x, n_tokens_ * n_heads, dims_.head_dim, eps_,
                                      stream_);
  rms_norm(x, weight, x, (int)(n_tokens_ * n_heads), dims_.head_dim, eps_, stream_);
}

void ForwardOps::rope(float* x, int n_heads, int variant) {
  HABLAR_CHECK(variant >= 0 && (size_t)variant < ropes_.size(), "rope: no such RoPE variant");
  flush_add();
  const auto* inputs = static_cast<const float*>(buf_->inputs.get());
  const size_t at = (size_t)variant * (size_t)limits_.max_tokens * (size_t)rope_pairs_;
  RowWorkBatch& rows = buf_->pending_rows;
  RowWorkEntry* entry = nullptr;
  for (int i = 0; i < rows.n; ++i)
    if (rows.e[i].x == x) entry = &rows.e[i];
  if (entry != nullptr && (entry->variant >= 0 || entry->heads != n_heads)) {
    flush_row_work();
    entry = nullptr;
  }
  if (entry == nullptr) {
    if (rows.n == 3) flush_row_work();
    entry = &rows.e[rows.n++];
    *entry = {x, nullptr, n_heads};
  }
  entry->variant = variant;
  entry->cos_t = inputs + buf_->cos + at;
  entry->sin_t = inputs + buf_->sin + at;
  entry->neox = ropes_[(size_t)variant].neox;
}

void ForwardOps::flush_row_work() {
  RowWorkBatch& rows = buf_->pending_rows;
  if (rows.n == 0) return;
  if (n_tokens_ > 0) {
    launch_row_work(rows, (int)n_tokens_, dims_.head_dim, rope_pairs_, stream_);
  }
  rows = {};
}

void ForwardOps::flush_add() {
  buf_->forget_held_rows();  // every op but the products of the normed rows comes here
  auto& add = buf_->pending_add;
  if (add.x == nullptr) return;
  cuda::add(add.x, add.y, add.x, n_tokens_ * add.width, stream_);
  add = {};
}

void ForwardOps::flush() {
  flush_row_work();
  flush_add();
}

bool ForwardOps::store_kv_in_row_work(int layer, const float* k, const float* v) {
  RowWorkBatch& rows = buf_->pending_rows;
  if (rows.n == 0 || n_tokens_ == 0) return false;
  // A Q8_0 block's scale needs the maximum of its 32 dimensions, which the pass's threads
  // (a RoPE pair each) do not gather: the attention's scatter kernel writes those rows.
  if (kv_dtype_quantized(layout_.type(0)) || kv_dtype_quantized(layout_.type(1))) return false;
  const float* bufs[2] = {k, v};
  RowWorkEntry* entry[2] = {nullptr, nullptr};
  for (int i = 0; i < rows.n; ++i)
    for (int kv = 0; kv < 2; ++kv)
      if (rows.e[i].x == bufs[kv]) entry[kv] = &rows.e[i];
  const int missing = (entry[0] == nullptr) + (entry[1] == nullptr);
  if (rows.n + missing > 3) return false;
  for (RowWorkEntry* e : entry)
    if (e != nullptr && e->heads != layout_.n_kv_heads) return false;
  for (int kv = 0; kv < 2; ++kv) {
    if (entry[kv] == nullptr) {  // a copy to the cache only
      entry[kv] = &rows.e[rows.n++];
      *entry[kv] = {const_cast<float*>(bufs[kv]), nullptr, layout_.n_kv_heads};
    }
    entry[kv]->kv = kv;
  }
  auto* inputs = static_cast<int32_t*>(buf_->inputs.get());
  RowWorkCacheStore& store = rows.store;
  store.cache = static_cast<uint16_t*>(kv_cache_);
  store.layout = layout_;
  store.layer = layer;
  store.positions = inputs + buf_->positions;
  store.block_tables = inputs + buf_->tables;
  store.max_blocks_per_seq = limits_.max_blocks_per_seq;
  store.active = reinterpret_cast<const uint8_t*>(inputs + buf_->active);
  return true;
}

void ForwardOps::attention(int layer, const AttentionSpec& spec, const float* q, const float* k,
                           const float* v, float* out) {
  attention_rows(layer, spec, q, k, v, out, false);
}

// The readers' products all over kept bf16 copies: the attention writes their bf16 rows alone.
void ForwardOps::attention_for_products(int layer, const AttentionSpec& spec, const float* q,
                                        const float* k, const float* v, float* out,
                                        std::span<const WeightView* const> readers) {
  const bool bf16_only = writer_writes_bf16(n_tokens_, dims_.q_dim()) &&
                         !writer_quantizes(n_tokens_, dims_.q_dim()) &&
                         lab_knob("HABLAR_ATTENTION_BF16", 1) != 0 && all_take_kept_copies(readers);
  attention_rows(layer, spec, q, k, v, out, bf16_only);
}

void ForwardOps::attention_rows(int layer, const AttentionSpec& spec, const float* q,
                                const float* k, const float* v, float* out, bool bf16_only) {
  // The queued RoPE/bias pass stores this step's keys and values (no scatter kernel).
  // (The lab's HABLAR_KV_IN_ROPE=0 keeps the scatter kernel.)
  const bool kv_stored = !limits_.deterministic && lab_knob("HABLAR_KV_IN_ROPE", 1) != 0 &&
                         store_kv_in_row_work(layer, k, v);
  flush();
  // bf16_only: the rows go to the kept-copy products' bf16 rows alone (never in deterministic
  // mode, whose products take no kept copies).
  uint16_t* rows_bf16 = bf16_only ? static_cast<uint16_t*>(buf_->bf16_rows.get()) : nullptr;
  float* out_f32 = bf16_only ? nullptr : out;
  const auto mark_bf16_only = [&] {
    if (!bf16_only) return;
    buf_->bf16_holds = out;
    buf_->bf16_only = out;
  };
  if (takes_prefill_attention(spec)) {
    attention_with_prefill_chunks(layer, spec, q, k, v, out_f32, rows_bf16, kv_stored);
    return mark_bf16_only();
  }
  auto* inputs = static_cast<int32_t*>(buf_->inputs.get());
  if (limits_.deterministic) {
    cpu_rounding_ops::AttentionArgs a;
    a.layout = layout_, a.layer = layer, a.kv_cache = kv_cache_;
    a.n_tokens = (int32_t)n_tokens_, a.n_heads = dims_.n_heads;
    a.block_tables = inputs + buf_->tables, a.max_blocks_per_seq = limits_.max_blocks_per_seq;
    a.positions = inputs + buf_->positions;
    a.active = reinterpret_cast<const uint8_t*>(inputs + buf_->active);
    a.sampled = reinterpret_cast<const uint8_t*>(inputs + buf_->sampled);
    a.q = q, a.k = k, a.v = v, a.out = out;
    a.scale = spec.scale, a.window = spec.window, a.softcap = spec.softcap;
    a.max_context = max_context_;
    return cpu_rounding_ops::attention(a, stream_);
  }
  DecodeAttentionParams p = decode_params(layer, spec, q, k, v, out_f32, buf_->active);
  p.kv_stored = kv_stored;
  p.out_bf16 = rows_bf16;
  // The output rows quantized for the output projection's int8 product in the same pass.
  const bool quantize = writer_quantizes(n_tokens_, dims_.q_dim());
  if (quantize) {
    const Q8Activations q8 = q8_layout(buf_->int8_workspace.get(), (int)n_tokens_, dims_.q_dim());
    p.out_codes = q8.codes, p.out_scales = q8.scales;
  }
  decode_attention(p, buf_->attention_workspace.get(), buf_->attention_workspace_bytes, stream_);
  if (quantize) buf_->q8_holds = out;
  mark_bf16_only();
}

// The step's rows between the flash prefill kernel and the decode kernel (attention_plan.h),
// into the staged inputs: the flash chunks' first rows, counts and cached lengths, and the
// decode kernel's row flags. Outside graphs (decode steps) and deterministic mode; the lab's
// HABLAR_FLASH_PREFILL=2 takes the flash kernel whatever the blocks and context.
void ForwardOps::plan_attention(std::span<const StepChunkRows> chunk_rows, int64_t pad_to) {
  Buffers& b = *buf_;
  AttentionPlanLimits limits;
  limits.flash_allowed = pad_to == 0 && !limits_.deterministic;
  limits.n_heads = dims_.n_heads;
  limits.multiprocessors = device_multiprocessors();
  limits.force_flash = lab_knob("HABLAR_FLASH_PREFILL", 1) == 2;
  const AttentionPlan plan = plan_step_attention(chunk_rows, n_tokens_, limits);
  auto* words = static_cast<int32_t*>(b.host_inputs);
  for (size_t c = 0; c < plan.flash.size(); ++c) {
    words[b.prefill_first + c] = plan.flash[c].first_row;
    words[b.prefill_count + c] = plan.flash[c].count;
    words[b.prefill_cached + c] = plan.flash[c].start_pos;
  }
  std::memcpy(words + b.decode_active, plan.decode_rows.data(), plan.decode_rows.size());
  n_prefill_chunks_ = (int32_t)plan.flash.size();
  prefill_max_chunk_ = plan.max_flash_chunk;
  n_decode_rows_ = plan.n_decode_rows;
}

// The decode attention over every row of the step, each attending over [0, its position];
// `active_at`: the staged row flags it takes (the live rows, or the decode kernel's share).
DecodeAttentionParams ForwardOps::decode_params(int layer, const AttentionSpec& spec,
                                                const float* q, const float* k, const float* v,
                                                float* out, size_t active_at) const {
  auto* inputs = static_cast<int32_t*>(buf_->inputs.get());
  DecodeAttentionParams p;
  p.layout = layout_;
  p.layer = layer;
  p.kv_cache = kv_cache_;
  p.n_slots = (int32_t)n_tokens_;
  p.block_tables = inputs + buf_->tables;
  p.max_blocks_per_seq = limits_.max_blocks_per_seq;
  p.seq_lens = inputs + buf_->positions;
  p.active = reinterpret_cast<const uint8_t*>(inputs + active_at);
  p.n_heads = dims_.n_heads;
  p.q = q, p.k_new = k, p.v_new = v, p.out = out;
  p.scale = spec.scale;
  p.window = spec.window;
  p.softcap = spec.softcap;
  p.max_context = max_context_;
  p.fixed_split_len = 0;
  p.advance_lengths = false;
  p.prior_rows_settled = one_token_rows_;
  p.multiprocessors = device_multiprocessors();
  return p;
}

bool ForwardOps::takes_prefill_attention(const AttentionSpec& spec) const {
  return n_prefill_chunks_ > 0 && (dims_.head_dim == 64 || dims_.head_dim == 128) &&
         spec.window == 0 && spec.softcap == 0.0f && lab_knob("HABLAR_FLASH_PREFILL", 1) != 0;
}

// The step's prompt chunks of kFlashPrefillMinTokens or more on the flash prefill kernel
// (query tiles of 64 rows share each K/V tile), the step's other rows (decodes, short
// chunks) on the decode kernel with those chunks' rows inactive: each kernel writes only its
// own rows of `out`. Neither quantizes its output (the output projection does).
void ForwardOps::attention_with_prefill_chunks(int layer, const AttentionSpec& spec, const float* q,
                                               const float* k, const float* v, float* out,
                                               uint16_t* out_bf16, bool kv_stored) {
  auto* inputs = static_cast<int32_t*>(buf_->inputs.get());
  if (n_decode_rows_ > 0) {  // (takes_prefill_attention: no window nor soft-cap here)
    DecodeAttentionParams p = decode_params(layer, spec, q, k, v, out, buf_->decode_active);
    p.kv_stored = kv_stored;
    p.out_bf16 = out_bf16;
    decode_attention(p, buf_->attention_workspace.get(), buf_->attention_workspace_bytes, stream_);
  }
  PrefillAttentionParams pp;
  pp.layout = layout_, pp.layer = layer, pp.kv_cache = kv_cache_;
  pp.n_seqs = n_prefill_chunks_;
  pp.block_tables = inputs + buf_->tables, pp.tables_per_token = true;
  pp.max_blocks_per_seq = limits_.max_blocks_per_seq;
  pp.token_begin = inputs + buf_->prefill_first, pp.token_count = inputs + buf_->prefill_count;
  pp.cached_len = inputs + buf_->prefill_cached;
  pp.kv_stored = kv_stored;
  pp.total_tokens = (int32_t)n_tokens_, pp.max_chunk = prefill_max_chunk_;
  pp.n_heads = dims_.n_heads;
  pp.q = q, pp.k_new = k, pp.v_new = v, pp.out = out, pp.out_bf16 = out_bf16;
  pp.scale = spec.scale;
  prefill_attention(pp, stream_);
}

// Queued: the norm that usually follows takes it into its own pass (rmsnorm above).
void ForwardOps::add(float* x, const float* y, int64_t width) {
  flush();
  buf_->pending_add = {x, y, width};
}

void ForwardOps::relu_squared(float* x, int64_t width) {
  flush();
  cuda::relu_squared(x, n_tokens_ * width, stream_);
}

void ForwardOps::scale_logits(float s) {
  flush();
  if (n_logit_rows_ > 0) cuda::scale(logits_, s, (int64_t)n_logit_rows_ * dims_.n_vocab, stream_);
}

void ForwardOps::gather_logit_rows(const float* x) {
  const auto* inputs = static_cast<const int32_t*>(buf_->inputs.get());
  launch_dependent(gather_rows_kernel, dim3(n_logit_rows_), dim3(256), 0, stream_, x,
                   inputs + buf_->logit_rows, (int)dims_.n_embd, out_rows_);
}

void ForwardOps::logits(const float* x, const float* norm_weight, const WeightView& output,
                        float softcap) {
  flush();
  if (n_logit_rows_ == 0) return;
  const auto* inputs = static_cast<const int32_t*>(buf_->inputs.get());
  gather_logit_rows(x);
  if (limits_.deterministic) {
    cpu_rounding_ops::rms_norm(out_rows_, norm_weight, out_rows_, n_logit_rows_, dims_.n_embd, eps_,
                               stream_);
    product(output, out_rows_, n_logit_rows_, logits_,
            reinterpret_cast<const uint8_t*>(inputs + buf_->logit_roles));
  } else if (writer_writes_bf16(n_logit_rows_, dims_.n_embd)) {
    rms_norm_bf16(out_rows_, norm_weight, out_rows_, n_logit_rows_, dims_.n_embd, eps_,
                  static_cast<uint16_t*>(buf_->bf16_rows.get()), stream_);
    buf_->bf16_holds = out_rows_;
    const WeightView* ws[] = {&output};
    float* outs[] = {logits_};
    products_of_one_input(out_rows_, n_logit_rows_, ws, outs);
  } else if (writer_converts(n_logit_rows_, dims_.n_embd)) {
    rms_norm_f16(out_rows_, norm_weight, out_rows_, n_logit_rows_, dims_.n_embd, eps_,
                 buf_->f16_rows.get(), buf_->f16_rows.bytes(), stream_);
    buf_->f16_holds = out_rows_;
    const WeightView* ws[] = {&output};
    float* outs[] = {logits_};
    products_of_one_input(out_rows_, n_logit_rows_, ws, outs);
  } else if (writer_quantizes(n_logit_rows_, dims_.n_embd)) {
    rms_norm_q8(out_rows_, norm_weight, out_rows_, n_logit_rows_, dims_.n_embd, eps_,
                buf_->int8_workspace.get(), stream_);
    buf_->q8_holds = out_rows_;
    const WeightView* ws[] = {&output};
    float* outs[] = {logits_};
    products_of_one_input(out_rows_, n_logit_rows_, ws, outs);
  } else {
    rms_norm(out_rows_, norm_weight, out_rows_, n_logit_rows_, dims_.n_embd, eps_, stream_);
    product(output, out_rows_, n_logit_rows_, logits_);
  }
  if (softcap > 0.0f)
    cuda::softcap(logits_, (int64_t)n_logit_rows_ * output.rows, softcap, stream_);
}

PersistentStepContext ForwardOps::persistent_context() const {
  PersistentStepContext c;
  c.n_embd = (int32_t)dims_.n_embd, c.n_heads = dims_.n_heads, c.n_kv_heads = dims_.n_kv_heads;
  c.head_dim = dims_.head_dim;
  c.rms_eps = eps_;
  c.layout = layout_;
  c.kv_cache = kv_cache_;
  const auto* words = static_cast<const int32_t*>(buf_->inputs.get());
  const auto* floats = static_cast<const float*>(buf_->inputs.get());
  c.position = words + buf_->positions;
  c.block_table = words + buf_->tables;
  c.max_blocks_per_seq = limits_.max_blocks_per_seq;
  c.rope_pairs = rope_pairs_;
  c.n_rope_variants = (int32_t)std::min<size_t>(ropes_.size(), kPersistentMaxRopeVariants);
  for (int r = 0; r < c.n_rope_variants; ++r) {
    const size_t at = (size_t)r * (size_t)limits_.max_tokens * (size_t)rope_pairs_;
    c.rope_cos[r] = floats + buf_->cos + at;
    c.rope_sin[r] = floats + buf_->sin + at;
    c.rope_neox[r] = ropes_[(size_t)r].neox;
  }
  return c;
}

const float* ForwardOps::host_rows(const float* rows, int64_t n, std::vector<float>& host) {
  flush();
  host.resize((size_t)n);
  HABLAR_CUDA_CHECK(cudaStreamSynchronize(stream_));
  HABLAR_CUDA_CHECK(cudaMemcpy(host.data(), rows, (size_t)n * 4, cudaMemcpyDeviceToHost));
  return host.data();
}

}  // namespace hablar::cuda
