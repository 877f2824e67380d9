#include "engine/drafter_model.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include <fmt/format.h>

#include "core/error.h"
#include "model/forward.h"

namespace hablar::engine {
namespace {

// Views of `src`'s weights for the given layers: the per-layer structs are views themselves
// (pointers into the mapping and into src.vectors), so nothing is copied but the pointers.
model::Weights view_weights(const model::Weights& src, const std::vector<int>& layers) {
  model::Weights w;
  w.token_embd = src.token_embd;
  for (int l : layers) w.layers.push_back(src.layers[(size_t)l]);
  w.output_norm = src.output_norm;
  w.output = src.output;
  return w;
}

model::ModelConfig subset_config(const model::ModelConfig& src, const std::vector<int>& layers) {
  model::ModelConfig c = src;
  c.n_layers = (int)layers.size();
  c.layers.clear();
  for (int l : layers) c.layers.push_back(src.layers[(size_t)l]);
  return c;
}

std::vector<int> all_layers(int n) {
  std::vector<int> v((size_t)n);
  for (int i = 0; i < n; ++i) v[(size_t)i] = i;
  return v;
}

void check_same_vocab(const model::Model& target, const model::Model& draft) {
  const tokenizer::Tokenizer& a = target.tokenizer();
  const tokenizer::Tokenizer& b = draft.tokenizer();
  const std::string where = "--model-draft " + draft.file().path();
  if (a.n_vocab() != b.n_vocab() || target.config().n_vocab != draft.config().n_vocab)
    throw_error(ErrorKind::kInvalidArgument,
                fmt::format("{}: its vocabulary has {} tokens, the target's {}; speculative "
                            "decoding needs the same vocabulary",
                            where, draft.config().n_vocab, target.config().n_vocab));
  for (int32_t id = 0; id < a.n_vocab(); ++id)
    if (a.token_piece(id) != b.token_piece(id))
      throw_error(ErrorKind::kInvalidArgument,
                  fmt::format("{}: token {} is '{}' there but '{}' in the target; speculative "
                              "decoding needs the same vocabulary",
                              where, id, b.token_piece(id), a.token_piece(id)));
}

int32_t argmax_row(const float* row, int32_t n, float* top_p) {
  int32_t best = 0;
  for (int32_t v = 1; v < n; ++v)
    if (row[v] > row[best]) best = v;
  if (top_p != nullptr) {  // softmax probability of the best token
    double sum = 0;
    for (int32_t v = 0; v < n; ++v) sum += std::exp((double)row[v] - (double)row[best]);
    *top_p = (float)(1.0 / sum);
  }
  return best;
}

}  // namespace

std::vector<int> kept_layers(const std::string& skip, int n_layers) {
  std::vector<bool> skipped((size_t)n_layers, false);
  size_t at = 0;
  while (at <= skip.size()) {
    const size_t comma = std::min(skip.find(',', at), skip.size());
    const std::string item = skip.substr(at, comma - at);
    at = comma + 1;
    if (item.empty()) continue;
    int lo = -1, hi = -1;
    const size_t dash = item.find('-');
    try {
      size_t used = 0;
      lo = std::stoi(item.substr(0, dash), &used);
      if (used != (dash == std::string::npos ? item.size() : dash)) lo = -1;
      hi = dash == std::string::npos ? lo : std::stoi(item.substr(dash + 1), &used);
      if (dash != std::string::npos && used != item.size() - dash - 1) hi = -1;
    } catch (const std::exception&) {
      lo = hi = -1;
    }
    if (lo < 0 || hi < lo || hi >= n_layers)
      throw_error(ErrorKind::kInvalidArgument,
                  fmt::format("--spec-self-skip: '{}' is not a layer or range of layers in "
                              "[0, {}) (e.g. 4,6-9)",
                              item, n_layers));
    for (int l = lo; l <= hi; ++l) skipped[(size_t)l] = true;
  }
  std::vector<int> keep;
  for (int l = 0; l < n_layers; ++l)
    if (!skipped[(size_t)l]) keep.push_back(l);
  if (keep.empty() || (int)keep.size() == n_layers)
    throw_error(ErrorKind::kInvalidArgument,
                fmt::format("--spec-self-skip '{}': skip at least one of the model's {} layers "
                            "and keep at least one",
                            skip, n_layers));
  return keep;
}

// Every other layer of the middle half: the first and last quarters (where layer skipping
// hurts most) always run.
std::string default_self_skip(int n_layers) {
  std::string s;
  for (int l = n_layers / 4 + 1; l < n_layers - n_layers / 4; l += 2) {
    if (!s.empty()) s += ',';
    s += std::to_string(l);
  }
  return s.empty() ? std::to_string(n_layers / 2) : s;
}

ModelDrafter::ModelDrafter(const model::Model& target, std::unique_ptr<model::Model> draft,
                           const ModelDrafterOptions& o)
    : type_(SpecType::kDraft), owned_(std::move(draft)), source_(*owned_) {
  check_same_vocab(target, *owned_);
  config_ = owned_->config();
  weights_ = view_weights(owned_->weights(), all_layers(config_.n_layers));
  init(o);
}

ModelDrafter::ModelDrafter(const model::Model& target, const std::vector<int>& layers,
                           const ModelDrafterOptions& o)
    : type_(SpecType::kSelf), source_(target) {
  for (size_t i = 0; i < layers.size(); ++i)
    if (layers[i] < 0 || layers[i] >= target.config().n_layers ||
        (i > 0 && layers[i] <= layers[i - 1]))
      throw_error(ErrorKind::kInvalidArgument, "self-speculation: bad layer list");
  config_ = subset_config(target.config(), layers);
  weights_ = view_weights(target.weights(), layers);
  init(o);
}

ModelDrafter::~ModelDrafter() = default;

void ModelDrafter::init(const ModelDrafterOptions& o) {
  for (const model::LayerWeights& l : weights_.layers)
    for (const WeightView* v : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down})
      if (v->data != nullptr && !cpu::matmul_supports(v->type))
        throw_error(ErrorKind::kUnsupported,
                    source_.file().path() + ": the draft has a weight type with no CPU kernel");
  const int32_t n_blocks =
      std::max<int32_t>(4, (o.kv_tokens + kDefaultKvBlockSize - 1) / kDefaultKvBlockSize);
  layout_ = source_.kv_layout_for(n_blocks, kDefaultKvBlockSize);
  layout_.n_layers = config_.n_layers;
  config_.ropes = model::ropes_for_context(config_, (int64_t)n_blocks * kDefaultKvBlockSize);
  cache_.assign(layout_.total_elems(), 0);
  ThreadPool* pool = o.pool;
  if (pool == nullptr) {
    own_pool_ = std::make_unique<ThreadPool>(
        o.n_threads > 0 ? o.n_threads : (int)std::max(1u, std::thread::hardware_concurrency()));
    pool = own_pool_.get();
  }
  ops_ = std::make_unique<cpu::ForwardOps>(*pool);
  blocks_ = std::make_unique<BlockManager>(layout_.n_blocks, layout_.block_size);
}

std::string ModelDrafter::describe() const {
  return fmt::format("{} drafter: {} ({} of {} layers), KV cache {} positions ({:.1f} MiB F16)",
                     spec_type_name(type_), source_.file().path(), config_.n_layers,
                     source_.config().n_layers, layout_.n_blocks * layout_.block_size,
                     (double)layout_.total_bytes() / (1 << 20));
}

void ModelDrafter::release(uint64_t seq_id) {
  auto it = states_.find(seq_id);
  if (it == states_.end()) return;
  blocks_->free(*it->second);
  states_.erase(it);
}

void ModelDrafter::forward(std::span<const SequenceChunk> chunks) {
  model::check_step(config_, chunks, layout_);
  ops_->begin(chunks, cache_.data(), layout_, model::activation_dims(config_), config_.ropes,
              config_.rms_eps);
  model::forward(config_, weights_, *ops_);
  logits_.swap(ops_->logits());
}

// Rolls the sequence's draft state back to its common prefix with the target's tokens and
// makes room for what this step runs: the missing tokens and n_max - 1 drafted ones.
bool ModelDrafter::prepare(DraftJob& job, std::vector<Active>& active) {
  const std::vector<int32_t>& t = job.seq->tokens;
  auto& slot = states_[job.seq->id];
  if (!slot) slot = std::make_unique<Sequence>();
  Sequence& st = *slot;
  size_t lcp = 0;
  while (lcp < st.tokens.size() && lcp < t.size() && st.tokens[lcp] == t[lcp]) ++lcp;
  const size_t keep = std::min(lcp, t.size() - 1);  // at least one token runs: its logits
  blocks_->truncate(st, (int32_t)keep);
  st.tokens.resize(keep);
  const int32_t n_new = (int32_t)(t.size() - keep) + job.n_max - 1;
  copies_.clear();
  if (!blocks_->allocate_slots(st, n_new, copies_)) {
    // Out of draft cache: drop the state of sequences not drafting now, then try again.
    for (auto it = states_.begin(); it != states_.end();) {
      const bool drafting = it->first == job.seq->id ||
                            std::any_of(active.begin(), active.end(), [&](const Active& a) {
                              return a.job->seq->id == it->first;
                            });
      if (drafting) {
        ++it;
        continue;
      }
      blocks_->free(*it->second);
      it = states_.erase(it);
    }
    if (!blocks_->allocate_slots(st, n_new, copies_)) {
      release(job.seq->id);
      return false;
    }
  }
  HABLAR_CHECK(copies_.empty(), "draft cache blocks are never shared");
  active.push_back({&job, &st, keep, true});
  return true;
}

// Runs the missing tokens of sequences that have more than max_chunk of them (a new prompt)
// in pieces, until each has at most max_chunk left for the first drafting forward.
void ModelDrafter::catch_up(std::vector<Active>& active, size_t max_chunk) {
  for (;;) {
    chunks_.clear();
    std::vector<Active*> ran;
    for (Active& a : active) {
      const std::vector<int32_t>& t = a.job->seq->tokens;
      if (t.size() - a.pending_from <= max_chunk) continue;
      chunks_.push_back({std::span<const int32_t>(t).subspan(a.pending_from, max_chunk),
                         a.state->n_computed, a.state->block_table, false, a.job->seq->n_prompt});
      ran.push_back(&a);
    }
    if (chunks_.empty()) return;
    forward(chunks_);
    for (Active* a : ran) {
      const std::vector<int32_t>& t = a->job->seq->tokens;
      a->state->tokens.insert(a->state->tokens.end(), t.begin() + (std::ptrdiff_t)a->pending_from,
                              t.begin() + (std::ptrdiff_t)(a->pending_from + max_chunk));
      a->state->n_computed += (int32_t)max_chunk;
      a->pending_from += max_chunk;
    }
  }
}

void ModelDrafter::draft(std::span<DraftJob> jobs) {
  std::vector<Active> active;
  active.reserve(jobs.size());
  for (DraftJob& j : jobs)
    if (j.n_max > 0) prepare(j, active);
  if (active.empty()) return;
  catch_up(active, 256);
  // The price per drafted position leaves the catch-up out (a new sequence's whole prompt:
  // seconds at once, which would price drafting out for a long while after).
  const auto t_draft = std::chrono::steady_clock::now();
  // Feed: first the missing tokens, then each drafted token.
  std::vector<std::vector<int32_t>> feed(active.size());
  for (size_t i = 0; i < active.size(); ++i) {
    const std::vector<int32_t>& t = active[i].job->seq->tokens;
    feed[i].assign(t.begin() + (std::ptrdiff_t)active[i].pending_from, t.end());
  }
  const int32_t n_vocab = config_.n_vocab;
  int32_t positions = 0;
  std::vector<size_t> ran;
  for (;;) {
    chunks_.clear();
    ran.clear();
    for (size_t i = 0; i < active.size(); ++i) {
      if (!active[i].open) continue;
      const Active& a = active[i];
      chunks_.push_back(
          {feed[i], a.state->n_computed, a.state->block_table, false, a.job->seq->n_prompt});
      ran.push_back(i);
    }
    if (chunks_.empty()) break;
    forward(chunks_);
    positions += 1;
    for (size_t r = 0; r < ran.size(); ++r) {
      Active& a = active[ran[r]];
      std::vector<int32_t>& f = feed[ran[r]];
      a.state->tokens.insert(a.state->tokens.end(), f.begin(), f.end());
      a.state->n_computed += (int32_t)f.size();
      float top_p = 1.0f;
      const int32_t tok = argmax_row(logits_.data() + r * (size_t)n_vocab, n_vocab,
                                     a.job->p_min > 0 ? &top_p : nullptr);
      if (top_p < a.job->p_min) {  // the draft is unsure: stop here
        a.open = false;
        continue;
      }
      a.job->draft.push_back(tok);
      a.open = (int32_t)a.job->draft.size() < a.job->n_max;
      f.assign(1, tok);
    }
  }
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t_draft).count();
  const double per = ms / std::max(1, positions);
  ms_per_position_ = ms_per_position_ == 0 ? per : 0.8 * ms_per_position_ + 0.2 * per;
}

}  // namespace hablar::engine
