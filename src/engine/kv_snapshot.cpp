#include "engine/kv_snapshot.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <istream>
#include <ostream>

#include <fmt/format.h>

#include "core/error.h"
#include "engine/engine.h"

namespace hablar::engine {

static_assert(std::endian::native == std::endian::little,
              "slot files are little-endian, written as the host lays out its words");

namespace {

constexpr uint32_t kMaxArchBytes = 64;
// The K/V section's fixed part after its magic and version: fingerprint (8), arch length (4),
// n_layers, n_kv_heads, head_dim, block_size (16), K and V types and 2 zero bytes (4),
// n_tokens, n_blocks (8), block bytes and the checksum of the blocks (16); the arch name
// follows the length.
constexpr uint64_t kKvFixedBytes = 8 + 4 + 16 + 4 + 8 + 16;

// A fast 64-bit checksum of the block bytes, eight at a time (corruption, not tampering).
uint64_t checksum(std::span<const uint8_t> bytes) {
  uint64_t h = 0x243f6a8885a308d3ull ^ (bytes.size() * 0x9e3779b97f4a7c15ull);
  size_t i = 0;
  for (; i + 8 <= bytes.size(); i += 8) {
    uint64_t w;
    std::memcpy(&w, bytes.data() + i, 8);
    h = std::rotl(h ^ (w * 0x87c37b91114253d5ull), 31) * 0x4cf5ad432745937full;
  }
  for (; i < bytes.size(); ++i) h = (h ^ bytes[i]) * 0x100000001b3ull;
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  return h ^ (h >> 33);
}

size_t blocks_for(size_t n_tokens, int32_t block_size) {
  return (n_tokens + (size_t)block_size - 1) / (size_t)block_size;
}

std::string geometry_text(const KvCacheLayout& l) {
  return fmt::format("{} layers x {} KV heads x head size {}, K {} V {}, blocks of {} positions",
                     l.n_layers, l.n_kv_heads, l.head_dim, kv_dtype_name(l.type(0)),
                     kv_dtype_name(l.type(1)), l.block_size);
}

KvCacheLayout snapshot_layout(const StepExecutor& executor) {
  KvCacheLayout layout;
  std::string why;
  if (!executor.kv_snapshot_layout(&layout, &why)) throw_error(ErrorKind::kUnsupported, why);
  return layout;
}

// Little-endian words in and out of a stream; reads fail as a truncated file.
class Writer {
 public:
  explicit Writer(std::ostream& out) : out_(out) {}
  template <typename T>
  void put(T v) {
    bytes(&v, sizeof v);
  }
  void bytes(const void* p, size_t n) {
    out_.write(static_cast<const char*>(p), (std::streamsize)n);
    written_ += n;
  }
  uint64_t written() const { return written_; }

 private:
  std::ostream& out_;
  uint64_t written_ = 0;
};

class Reader {
 public:
  Reader(std::istream& in, uint64_t size) : in_(in), left_(size) {}
  template <typename T>
  T get(const char* what) {
    T v;
    bytes(&v, sizeof v, what);
    return v;
  }
  void bytes(void* p, uint64_t n, const char* what) {
    if (n > left_ || !in_.read(static_cast<char*>(p), (std::streamsize)n))
      throw_error(ErrorKind::kFormat,
                  std::string("the slot file is truncated (it ends inside ") + what + ")");
    left_ -= n;
  }
  uint64_t left() const { return left_; }

 private:
  std::istream& in_;
  uint64_t left_;
};

// The token payload (llama-server's layout: payload_size words after the outer header),
// packed (-1, version, n, ids) or a plain list of ids.
std::vector<int32_t> read_tokens(Reader& r, const KvIdentity& here, int32_t n_vocab) {
  if (r.get<uint32_t>("the header") != kSlotFileMagic)
    throw_error(ErrorKind::kFormat, "not a hablar slot file (its magic number is not \"HBST\")");
  const uint32_t version = r.get<uint32_t>("the header");
  if (version != kSlotFileVersion)
    throw_error(ErrorKind::kFormat,
                fmt::format("slot file version {} is not supported (this server reads {})", version,
                            kSlotFileVersion));
  const uint32_t words = r.get<uint32_t>("the header");
  const uint64_t max_tokens = (uint64_t)here.layout.n_blocks * (uint64_t)here.layout.block_size;
  if ((uint64_t)words * 4 > r.left())
    throw_error(ErrorKind::kFormat,
                fmt::format("the slot file is truncated or corrupt: its token list of {} words "
                            "is longer than the file",
                            words));
  if (words > max_tokens + 3)
    throw_error(ErrorKind::kInvalidArgument,
                fmt::format("the slot file holds {} tokens; this server's KV cache holds {} "
                            "positions in all",
                            words, max_tokens));
  std::vector<int32_t> tokens(words);
  r.bytes(tokens.data(), (uint64_t)words * 4, "the token list");
  if (words >= 3 && tokens[0] == -1) {  // packed: -1 (no token), version, n, ids
    if ((uint32_t)tokens[1] != kPackedTokensVersion || (uint32_t)tokens[2] != words - 3)
      throw_error(ErrorKind::kFormat,
                  "the slot file's packed token list has an unknown version or a count that "
                  "disagrees with its size");
    tokens.erase(tokens.begin(), tokens.begin() + 3);
  }
  for (int32_t t : tokens)
    if (t < 0 || t >= n_vocab)
      throw_error(ErrorKind::kInvalidArgument,
                  fmt::format("the slot file holds token id {}, outside this model's vocabulary "
                              "[0, {}): it was saved by another model",
                              t, n_vocab));
  return tokens;
}

// The K/V section's header, checked against this server's identity.
struct KvHeader {
  KvIdentity identity;
  uint32_t n_tokens = 0, n_blocks = 0;
  uint64_t block_bytes = 0, sum = 0;
};

KvHeader read_kv_header(Reader& r) {
  if (r.left() == 0)
    throw_error(ErrorKind::kFormat,
                "the slot file holds tokens only, no K/V section (hablar restores K/V)");
  if (r.get<uint32_t>("the K/V header") != kSlotKvMagic)
    throw_error(ErrorKind::kFormat, "the slot file's K/V section has a wrong magic number");
  const uint32_t version = r.get<uint32_t>("the K/V header");
  if (version != kSlotKvVersion)
    throw_error(ErrorKind::kFormat,
                fmt::format("the slot file's K/V section has version {} (this server reads {})",
                            version, kSlotKvVersion));
  KvHeader h;
  h.identity.model_fingerprint = r.get<uint64_t>("the K/V header");
  const uint32_t arch_len = r.get<uint32_t>("the K/V header");
  if (arch_len > kMaxArchBytes)
    throw_error(ErrorKind::kFormat, "the slot file's architecture name is too long");
  h.identity.arch.resize(arch_len);
  r.bytes(h.identity.arch.data(), arch_len, "the K/V header");
  KvCacheLayout& l = h.identity.layout;
  l.n_layers = r.get<int32_t>("the K/V header");
  l.n_kv_heads = r.get<int32_t>("the K/V header");
  l.head_dim = r.get<int32_t>("the K/V header");
  l.block_size = r.get<int32_t>("the K/V header");
  const auto k_type = r.get<uint8_t>("the K/V header"), v_type = r.get<uint8_t>("the K/V header");
  (void)r.get<uint16_t>("the K/V header");
  if (k_type > (uint8_t)KvDType::Q4_0 || v_type > (uint8_t)KvDType::Q4_0)
    throw_error(ErrorKind::kFormat, "the slot file names an unknown KV cache type");
  l.dtype = (KvDType)k_type;
  l.v_type = v_type == k_type ? -1 : (int8_t)v_type;
  h.n_tokens = r.get<uint32_t>("the K/V header");
  h.n_blocks = r.get<uint32_t>("the K/V header");
  h.block_bytes = r.get<uint64_t>("the K/V header");
  h.sum = r.get<uint64_t>("the K/V header");
  return h;
}

}  // namespace

std::string identity_mismatch(const KvIdentity& saved, const KvIdentity& here) {
  if (saved.arch != here.arch)
    return "it was saved by a " + saved.arch + " model; this server runs a " + here.arch + " model";
  const KvCacheLayout &a = saved.layout, &b = here.layout;
  if (a.n_layers != b.n_layers || a.n_kv_heads != b.n_kv_heads || a.head_dim != b.head_dim ||
      a.block_size != b.block_size || a.type(0) != b.type(0) || a.type(1) != b.type(1))
    return "its KV cache is " + geometry_text(a) + "; this server's is " + geometry_text(b);
  if (saved.model_fingerprint != here.model_fingerprint)
    return fmt::format(
        "it was saved by another model of the same shape (weights fingerprint {:016x}; this "
        "server's is {:016x})",
        saved.model_fingerprint, here.model_fingerprint);
  return "";
}

KvSnapshot read_cached_prefix(BlockManager& blocks, StepExecutor& executor,
                              std::span<const int32_t> tokens) {
  const KvCacheLayout layout = snapshot_layout(executor);
  const BlockManager::CachedPrefix p = blocks.cached_prefix(tokens);
  KvSnapshot s;
  s.tokens.assign(tokens.begin(), tokens.begin() + p.n_tokens);
  s.kv.resize(p.blocks.size() * layout.block_bytes());
  if (!p.blocks.empty()) executor.read_kv_blocks(p.blocks, s.kv);
  return s;
}

void write_cached_prefix(BlockManager& blocks, StepExecutor& executor, const KvSnapshot& s) {
  const KvCacheLayout layout = snapshot_layout(executor);
  const size_t block_bytes = layout.block_bytes();
  const size_t n_blocks = blocks_for(s.tokens.size(), layout.block_size);
  if (s.kv.size() != n_blocks * block_bytes)
    throw_error(ErrorKind::kInvalidArgument,
                fmt::format("a K/V snapshot of {} tokens needs {} bytes, not {}", s.tokens.size(),
                            n_blocks * block_bytes, s.kv.size()));
  if (s.tokens.empty()) return;
  BlockManager::Adoption a;
  int32_t needed = 0;
  if (!blocks.begin_adoption(s.tokens, a, needed))
    throw_error(ErrorKind::kResource,
                fmt::format("the KV cache cannot hold the restored tokens: they need {} more "
                            "blocks of {} positions, {} are free (of {}); retry when fewer "
                            "requests run, or start with a larger -c",
                            needed, layout.block_size, blocks.n_free(), blocks.n_blocks()));
  try {
    // Runs of fresh blocks, each written from its stretch of the snapshot.
    for (size_t i = 0; i < a.blocks.size();) {
      if (!a.fresh[i]) {
        ++i;
        continue;
      }
      size_t end = i;
      while (end < a.blocks.size() && a.fresh[end]) ++end;
      executor.write_kv_blocks(
          std::span<const int32_t>(a.blocks).subspan(i, end - i),
          std::span<const uint8_t>(s.kv).subspan(i * block_bytes, (end - i) * block_bytes));
      i = end;
    }
  } catch (...) {
    blocks.end_adoption(a, /*written=*/false);
    throw;
  }
  blocks.end_adoption(a, /*written=*/true);
}

KvSnapshot save_prefix(Engine& engine, std::span<const int32_t> tokens) {
  KvSnapshot s;
  engine.run_between_steps(
      [&](BlockManager& b, StepExecutor& e) { s = read_cached_prefix(b, e, tokens); });
  return s;
}

void restore_prefix(Engine& engine, const KvSnapshot& snapshot) {
  engine.run_between_steps(
      [&](BlockManager& b, StepExecutor& e) { write_cached_prefix(b, e, snapshot); });
}

int32_t forget_prefix(Engine& engine, std::span<const int32_t> tokens) {
  int32_t n = 0;
  engine.run_between_steps([&](BlockManager& b, StepExecutor&) { n = b.forget_prefix(tokens); });
  return n;
}

uint64_t write_slot_file(std::ostream& out, const KvSnapshot& s, const KvIdentity& id) {
  const KvCacheLayout& l = id.layout;
  const size_t block_bytes = l.block_bytes();
  const size_t n_blocks = blocks_for(s.tokens.size(), l.block_size);
  HABLAR_CHECK(s.kv.size() == n_blocks * block_bytes, "a snapshot's K/V of the wrong size");
  HABLAR_CHECK(id.arch.size() <= kMaxArchBytes, "architecture name too long for a slot file");
  Writer w(out);
  w.put(kSlotFileMagic);
  w.put(kSlotFileVersion);
  w.put((uint32_t)(3 + s.tokens.size()));  // payload words: packed header and ids
  w.put((int32_t)-1);
  w.put(kPackedTokensVersion);
  w.put((uint32_t)s.tokens.size());
  w.bytes(s.tokens.data(), s.tokens.size() * 4);
  w.put(kSlotKvMagic);
  w.put(kSlotKvVersion);
  w.put(id.model_fingerprint);
  w.put((uint32_t)id.arch.size());
  w.bytes(id.arch.data(), id.arch.size());
  for (int32_t v : {l.n_layers, l.n_kv_heads, l.head_dim, l.block_size}) w.put(v);
  w.put((uint8_t)l.type(0));
  w.put((uint8_t)l.type(1));
  w.put((uint16_t)0);
  w.put((uint32_t)s.tokens.size());
  w.put((uint32_t)n_blocks);
  w.put((uint64_t)block_bytes);
  w.put(checksum(s.kv));
  w.bytes(s.kv.data(), s.kv.size());
  return w.written();
}

KvSnapshot read_slot_file(std::istream& in, uint64_t file_size, const KvIdentity& here,
                          int32_t n_vocab) {
  Reader r(in, file_size);
  KvSnapshot s;
  s.tokens = read_tokens(r, here, n_vocab);
  const KvHeader h = read_kv_header(r);
  if (std::string why = identity_mismatch(h.identity, here); !why.empty())
    throw_error(ErrorKind::kInvalidArgument, "the slot file does not fit this server: " + why);
  const KvCacheLayout& l = here.layout;
  if (h.n_tokens != s.tokens.size() || h.n_blocks != blocks_for(h.n_tokens, l.block_size) ||
      h.block_bytes != l.block_bytes())
    throw_error(ErrorKind::kFormat,
                "the slot file's K/V section disagrees with its token list or geometry "
                "(token count, block count or block size)");
  if (h.n_blocks > (uint32_t)l.n_blocks)
    throw_error(ErrorKind::kInvalidArgument,
                fmt::format("the slot file holds {} KV blocks; this server's whole cache has {}",
                            h.n_blocks, l.n_blocks));
  const uint64_t kv_bytes = (uint64_t)h.n_blocks * h.block_bytes;
  if (r.left() != kv_bytes)
    throw_error(ErrorKind::kFormat,
                fmt::format("the slot file's K/V data is {} bytes; its header says {}{}", r.left(),
                            kv_bytes, r.left() < kv_bytes ? " (the file is truncated)" : ""));
  s.kv.resize(kv_bytes);
  r.bytes(s.kv.data(), kv_bytes, "the K/V data");
  if (checksum(s.kv) != h.sum)
    throw_error(ErrorKind::kFormat, "the slot file's K/V data is corrupt (checksum mismatch)");
  return s;
}

}  // namespace hablar::engine
