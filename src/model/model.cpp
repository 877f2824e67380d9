// Model loading, the KV cache memory and the checks on a forward step's input.
#include "model/model.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <string>
#include <thread>

#include "core/error.h"
#include "core/log.h"
#include "core/thread_pool.h"
#include "model/scratch.h"
#include "model/weights.h"

namespace hablar::model {

KvCache::KvCache(const KvCacheLayout& layout) : layout_(layout) {
  if (layout.n_layers <= 0 || layout.n_kv_heads <= 0 || layout.head_dim <= 0 ||
      layout.block_size <= 0 || layout.n_blocks <= 0)
    throw_error(ErrorKind::kInvalidArgument, "KV cache layout has a zero or negative size");
  if (layout.dtype != KvDType::F16)
    throw_error(ErrorKind::kUnsupported, "the CPU KV cache supports F16 elements only");
  data_.resize(layout.total_elems());
}

Model::Model(gguf::GgufFile file, const LoadOptions& opts) : file_(std::move(file)) {
  config_ = config_from_gguf(file_);
  weights_ = std::make_unique<Weights>(load_weights(file_, config_));
  tokenizer_ = tokenizer::Tokenizer::from_gguf(file_);
  if (tokenizer_->n_vocab() > config_.n_vocab)
    throw_error(ErrorKind::kFormat, file_.path() + ": vocabulary has " +
                                        std::to_string(tokenizer_->n_vocab()) +
                                        " tokens but token_embd.weight only " +
                                        std::to_string(config_.n_vocab) + " rows");
  int n_threads = opts.n_threads;
  if (n_threads < 0)
    throw_error(ErrorKind::kInvalidArgument,
                "thread count must be >= 0 (0 = all cores), got " + std::to_string(n_threads));
  if (n_threads == 0) n_threads = std::max(1u, std::thread::hardware_concurrency());
  pool_ = std::make_unique<ThreadPool>(n_threads);
  scratch_ = std::make_unique<Scratch>();
}

Model::~Model() = default;

std::unique_ptr<Model> Model::load(const std::string& path, const LoadOptions& opts) {
  gguf::GgufFile file = gguf::GgufFile::open(path);
  std::unique_ptr<Model> m(new Model(std::move(file), opts));
  const ModelConfig& c = m->config();
  log::info("loaded {}: {}, {} layers, n_embd {}, heads {}/{} x {}, ffn {}, vocab {}, {} threads",
            path, c.arch, c.n_layers, c.n_embd, c.n_heads, c.n_kv_heads, c.head_dim, c.n_ff,
            c.n_vocab, m->n_threads());
  return m;
}

int Model::n_threads() const {
  return pool_->size();
}

KvCacheLayout Model::kv_layout_for(int n_blocks, int block_size) const {
  if (n_blocks <= 0 || block_size <= 0)
    throw_error(ErrorKind::kInvalidArgument, "KV cache needs n_blocks > 0 and block_size > 0");
  KvCacheLayout l;
  l.n_layers = config_.n_layers;
  l.n_kv_heads = config_.n_kv_heads;
  l.head_dim = config_.head_dim;
  l.block_size = block_size;
  l.n_blocks = n_blocks;
  l.dtype = KvDType::F16;
  return l;
}

namespace {
// The matrices one decode step reads whole: the output head and every layer's projections.
std::vector<const WeightView*> decode_matrices(const Weights& w) {
  std::vector<const WeightView*> out{&w.output};
  for (const LayerWeights& l : w.layers)
    out.insert(out.end(), {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down});
  return out;
}
}  // namespace

size_t Model::weight_bytes_per_token() const {
  size_t total = (size_t)weights_->token_embd.row_bytes;  // plus the token's embedding row
  for (const WeightView* w : decode_matrices(*weights_)) total += (size_t)w->rows * w->row_bytes;
  return total;
}

double Model::weight_read_gbs(int passes) const {
  struct Span {
    const uint8_t* data;
    size_t bytes;
  };
  std::vector<Span> spans;
  size_t total = 0;
  auto add = [&](const WeightView& w) {
    // Whole 64-byte lines inside the matrix (its start is 32-byte aligned in a GGUF file).
    const auto start = (reinterpret_cast<uintptr_t>(w.data) + 63) & ~(uintptr_t)63;
    const size_t end_bytes = (size_t)w.rows * w.row_bytes;
    const size_t skip = start - reinterpret_cast<uintptr_t>(w.data);
    if (end_bytes <= skip) return;
    spans.push_back({reinterpret_cast<const uint8_t*>(start), (end_bytes - skip) & ~(size_t)63});
    total += spans.back().bytes;
  };
  for (const WeightView* w : decode_matrices(*weights_)) add(*w);
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

void Model::check_chunks(std::span<const SequenceChunk> chunks, const KvCache& cache) const {
  const KvCacheLayout& kl = cache.layout();
  if (kl.n_layers != config_.n_layers || kl.n_kv_heads != config_.n_kv_heads ||
      kl.head_dim != config_.head_dim)
    throw_error(ErrorKind::kInvalidArgument, "KV cache layout does not match the model");
  for (size_t i = 0; i < chunks.size(); ++i) {
    const SequenceChunk& ch = chunks[i];
    const std::string which = "chunk " + std::to_string(i);
    if (ch.tokens.empty()) throw_error(ErrorKind::kInvalidArgument, which + " has no tokens");
    if (ch.start_pos < 0)
      throw_error(ErrorKind::kInvalidArgument, which + " has a negative start position");
    const int64_t end = (int64_t)ch.start_pos + (int64_t)ch.tokens.size();
    const int64_t blocks_needed = (end + kl.block_size - 1) / kl.block_size;
    if ((int64_t)ch.block_table.size() < blocks_needed)
      throw_error(ErrorKind::kInvalidArgument,
                  which + ": block table has " + std::to_string(ch.block_table.size()) +
                      " blocks, positions up to " + std::to_string(end) + " need " +
                      std::to_string(blocks_needed));
    for (int64_t b = 0; b < blocks_needed; ++b)
      if (ch.block_table[(size_t)b] < 0 || ch.block_table[(size_t)b] >= kl.n_blocks)
        throw_error(ErrorKind::kInvalidArgument,
                    which + ": block id " + std::to_string(ch.block_table[(size_t)b]) +
                        " outside the cache's " + std::to_string(kl.n_blocks) + " blocks");
    for (int32_t t : ch.tokens)
      if (t < 0 || t >= config_.n_vocab)
        throw_error(ErrorKind::kInvalidArgument, which + ": token id " + std::to_string(t) +
                                                     " outside the vocabulary of " +
                                                     std::to_string(config_.n_vocab));
  }
}

}  // namespace hablar::model
