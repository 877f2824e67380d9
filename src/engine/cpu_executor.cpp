#include "engine/cpu_executor.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>

#include <fmt/format.h>

#include "core/error.h"
#include "engine/kv_snapshot.h"
#include "model/forward.h"
#include "model/weights.h"

namespace hablar::engine {
namespace {

int thread_count(int n_threads) {
  if (n_threads < 0)
    throw_error(ErrorKind::kInvalidArgument,
                "thread count must be >= 0 (0 = all cores), got " + std::to_string(n_threads));
  return n_threads > 0 ? n_threads : (int)std::max(1u, std::thread::hardware_concurrency());
}

void check_cpu_kernels(const model::Model& m) {
  const model::Weights& w = m.weights();
  for (const WeightView* v : w.matrices())
    if (!cpu::matmul_supports(v->type))
      throw_error(ErrorKind::kUnsupported, m.file().path() + ": a weight matrix has type " +
                                               std::string(dtype_name(v->type)) +
                                               ", which has no CPU matmul kernel");
}

}  // namespace

CpuExecutor::CpuExecutor(const model::Model& model, int32_t n_blocks, int32_t block_size,
                         int n_threads, KvDType cache_type_k, KvDType cache_type_v)
    : model_(model),
      layout_(model.kv_layout_for(n_blocks, block_size, cache_type_k, cache_type_v)),
      pool_(std::make_unique<ThreadPool>(thread_count(n_threads))),
      ops_(*pool_),
      embed_ops_(*pool_),
      ropes_(model::ropes_for_context(model.config(), (int64_t)n_blocks * block_size)) {
  check_cpu_kernels(model);
  cache_.resize(layout_.total_elems());
}

std::string CpuExecutor::describe() const {
  return fmt::format(
      "cpu: {} threads, KV cache {} blocks x {} positions ({:.1f} MiB, K {} V {}, "
      "{} bytes per token)",
      pool_->size(), layout_.n_blocks, layout_.block_size,
      (double)layout_.total_bytes() / (1 << 20), kv_dtype_name(layout_.type(0)),
      kv_dtype_name(layout_.type(1)), layout_.bytes_per_token());
}

void CpuExecutor::copy_block(const BlockCopy& copy) {
  for (int layer = 0; layer < layout_.n_layers; ++layer)
    for (int kv = 0; kv < 2; ++kv)
      std::memcpy(cache_.data() + layout_.offset(layer, kv, copy.dst, 0, 0, 0),
                  cache_.data() + layout_.offset(layer, kv, copy.src, 0, 0, 0),
                  layout_.block_elems(kv) * 2);
}

bool CpuExecutor::kv_snapshot_layout(KvCacheLayout* layout, std::string* why) const {
  if (model_.config().embedding_only) {
    if (why) *why = "this model embeds only: it keeps no KV cache to save or restore";
    return false;
  }
  if (layout) *layout = layout_;
  return true;
}

void CpuExecutor::read_kv_blocks(std::span<const int32_t> blocks, std::span<uint8_t> out) {
  for_each_kv_copy(layout_, blocks, out.size(), [&](size_t units, size_t at, size_t bytes) {
    std::memcpy(out.data() + at, cache_.data() + units, bytes);
  });
}

void CpuExecutor::write_kv_blocks(std::span<const int32_t> blocks, std::span<const uint8_t> in) {
  for_each_kv_copy(layout_, blocks, in.size(), [&](size_t units, size_t at, size_t bytes) {
    std::memcpy(cache_.data() + units, in.data() + at, bytes);
  });
}

void CpuExecutor::forward(std::span<const SequenceChunk> chunks, std::vector<float>& logits) {
  const model::ModelConfig& c = model_.config();
  model::check_step(c, chunks, layout_);
  ops_.begin(chunks, cache_.data(), layout_, model::activation_dims(c), ropes_, c.rms_eps);
  model::forward(c, model_.weights(), ops_);
  logits.swap(ops_.logits());
}

void CpuExecutor::execute(std::span<const BlockCopy> copies, std::span<const ExecChunk> chunks,
                          StepOutput& out) {
  for (const BlockCopy& c : copies) copy_block(c);
  chunks_.clear();
  for (const ExecChunk& c : chunks) {
    HABLAR_CHECK(c.sampling == nullptr, "the CPU executor does not sample: the engine does");
    chunks_.push_back({c.tokens, c.start_pos, c.block_table, c.all_logits, c.prompt_len});
  }
  forward(chunks_, out.logits);
  out.sampled.assign(chunks.size(), -1);
  drop_unwanted_rows(chunks, out.logits);
}

// The forward gives a row for each chunk (one for every token of an all-logits chunk); the
// rows of chunks that want no output go (StepOutput's contract).
void CpuExecutor::drop_unwanted_rows(std::span<const ExecChunk> chunks,
                                     std::vector<float>& logits) {
  const size_t V = (size_t)model_.config().n_vocab;
  size_t from = 0, to = 0;
  for (const ExecChunk& c : chunks) {
    const size_t rows = c.all_logits ? c.tokens.size() : 1;
    if (c.wants_output || c.all_logits) {
      if (from != to)
        std::memmove(logits.data() + to * V, logits.data() + from * V, rows * V * sizeof(float));
      to += rows;
    }
    from += rows;
  }
  logits.resize(to * V);
}

double CpuExecutor::weight_read_gbs(int passes) const {
  struct Span {
    const uint8_t* data;
    size_t bytes;
  };
  std::vector<Span> spans;
  size_t total = 0;
  for (const WeightView* w : model_.weights().matrices()) {
    // Whole 64-byte lines inside the matrix (its start is 32-byte aligned in a GGUF file).
    const auto start = (reinterpret_cast<uintptr_t>(w->data) + 63) & ~(uintptr_t)63;
    const size_t end_bytes = (size_t)w->rows * w->row_bytes;
    const size_t skip = start - reinterpret_cast<uintptr_t>(w->data);
    if (end_bytes <= skip) continue;
    spans.push_back({reinterpret_cast<const uint8_t*>(start), (end_bytes - skip) & ~(size_t)63});
    total += spans.back().bytes;
  }
  std::atomic<uint64_t> sink{0};  // the words read, so the reads are not optimized away
  double best = 0;
  for (int pass = 0; pass < std::max(1, passes); ++pass) {
    const auto t0 = std::chrono::steady_clock::now();
    pool_->run([&](int thread, int n_threads) {
      uint64_t acc = 0;
      for (const Span& s : spans) {
        const IndexRange r = split_range((int64_t)s.bytes, thread, n_threads, 64);
        acc ^= cpu::read_through(s.data + r.begin, (size_t)(r.end - r.begin));
      }
      sink.fetch_xor(acc, std::memory_order_relaxed);
    });
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, (double)total / seconds / 1e9);
  }
  return best;
}

}  // namespace hablar::engine
