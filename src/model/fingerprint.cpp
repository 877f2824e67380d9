#include "model/fingerprint.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <span>
#include <string_view>

namespace hablar::model {
namespace {

// FNV-1a over bytes, then folded into 64 bits of state per item with a splitmix step.
class Hasher {
 public:
  void bytes(const void* p, size_t n) {
    uint64_t h = 0xcbf29ce484222325ull;
    const auto* b = static_cast<const uint8_t*>(p);
    for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 0x100000001b3ull;
    fold(h ^ n);
  }
  void text(std::string_view s) { bytes(s.data(), s.size()); }
  template <typename T>
  void value(T v) {
    bytes(&v, sizeof v);
  }
  uint64_t digest() const { return state_; }

 private:
  void fold(uint64_t x) {
    uint64_t z = state_ ^ (x + 0x9e3779b97f4a7c15ull + (state_ << 6) + (state_ >> 2));
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    state_ = z ^ (z >> 31);
  }
  uint64_t state_ = 0x6a09e667f3bcc908ull;
};

// Up to 64 bytes at the start, the middle and the end of a tensor's data.
void sample(Hasher& h, const uint8_t* data, uint64_t n) {
  if (data == nullptr || n == 0) return;
  const uint64_t take = std::min<uint64_t>(64, n);
  h.bytes(data, (size_t)take);
  h.bytes(data + (n - take) / 2, (size_t)take);
  h.bytes(data + n - take, (size_t)take);
}

}  // namespace

uint64_t kv_fingerprint(const Model& model, int64_t n_ctx) {
  Hasher h;
  const ModelConfig& c = model.config();
  h.text(c.arch);
  for (int v : {c.n_layers, c.n_embd, c.n_heads, c.n_kv_heads, c.head_dim, c.n_vocab}) h.value(v);
  for (const gguf::TensorInfo& t : model.file().tensors()) {
    h.text(t.name);
    for (int64_t d : t.dims) h.value(d);
    h.value((int32_t)t.type);
    sample(h, t.data, t.nbytes);
  }
  for (const RopeParams& r : ropes_for_context(c, n_ctx)) {
    h.value(r.n_dims);
    h.value(r.freq_base);
    h.value((int32_t)r.scaling);
    h.value(r.factor);
    h.value(r.attn_factor);
    h.bytes(r.freq_factors.data(), r.freq_factors.size() * sizeof(float));
  }
  return h.digest();
}

}  // namespace hablar::model
