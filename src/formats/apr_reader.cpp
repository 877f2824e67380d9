// APR v2 reader: header, metadata, index and footer checked; described as GGUF metadata +
// tensor infos (see apr.h).
#include <cstring>
#include <filesystem>

#include "core/error.h"
#include "core/fp16.h"
#include "core/mmap_file.h"
#include "formats/apr.h"
#include "formats/hf_json.h"
#include "formats/hf_model.h"
#include "formats/tensor_names.h"

namespace hablar::apr {

uint32_t crc32(std::span<const uint8_t> bytes, uint32_t crc) {
  static const auto table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  crc = ~crc;
  for (uint8_t b : bytes) crc = table[(crc ^ b) & 0xFF] ^ (crc >> 8);
  return ~crc;
}

using Metadata = std::vector<std::pair<std::string, gguf::Value>>;
void apr_metadata(const nlohmann::json& m, const std::string& name,
                  Metadata& out);  // apr_metadata.cpp

namespace {

using gguf::Value;
using nlohmann::json;

struct Keep {
  std::shared_ptr<MappedFile> map;
  std::vector<std::vector<uint8_t>> owned;
};

template <typename T>
T load(std::span<const uint8_t> b, size_t at) {
  T v;
  std::memcpy(&v, b.data() + at, sizeof(T));
  return v;
}

[[noreturn]] void fail(const std::string& name, const std::string& what) {
  throw_error(ErrorKind::kFormat, name + ": APR: " + what);
}

struct Header {
  uint16_t flags;
  uint32_t n_tensors, meta_size;
  uint64_t meta_off, index_off, data_off;
};

Header read_header(std::span<const uint8_t> b, const std::string& name) {
  if (b.size() < 68)
    fail(name, "file of " + std::to_string(b.size()) + " bytes is too small for header and footer");
  if (std::memcmp(b.data(), "APR", 3) != 0) fail(name, "bad magic: not an APR file");
  if (b[3] == '1' || b[3] == 'N')
    throw_error(ErrorKind::kUnsupported, name + ": APR version 1 is not supported (only v2)");
  if (b[3] != 0 && b[3] != '2') fail(name, "bad magic byte 3");
  if (b[4] != 2)
    throw_error(ErrorKind::kUnsupported,
                name + ": APR major version " + std::to_string(b[4]) + " (only 2 is read)");
  std::vector<uint8_t> h(b.begin(), b.begin() + 40);
  h.insert(h.end(), b.begin() + 44, b.begin() + 64);
  if (crc32(h) != load<uint32_t>(b, 40)) fail(name, "header CRC-32 mismatch (corrupt file)");
  const uint32_t footer = load<uint32_t>(b, b.size() - 4);
  if (crc32(b.first(b.size() - 4)) != footer) fail(name, "footer CRC-32 mismatch (corrupt file)");
  Header hd{load<uint16_t>(b, 6),  load<uint32_t>(b, 8),  load<uint32_t>(b, 20),
            load<uint64_t>(b, 12), load<uint64_t>(b, 24), load<uint64_t>(b, 32)};
  struct Flag {
    uint16_t bit;
    const char* what;
  };
  for (const Flag& f :
       {Flag{0x1, "LZ4-compressed"}, Flag{0x2, "zstd-compressed"}, Flag{0x4, "encrypted"},
        Flag{0x8, "signed"}, Flag{0x10, "sharded"}, Flag{0x800, "column-major"}})
    if (hd.flags & f.bit)
      throw_error(ErrorKind::kUnsupported, name + ": APR file is " + f.what + " (not supported)");
  const uint64_t end = b.size() - 4;
  if (hd.meta_off > end || hd.meta_size > end - hd.meta_off)
    fail(name, "metadata lies outside the file");
  if (hd.index_off > end || hd.data_off > end || hd.index_off > hd.data_off)
    fail(name, "index or data offset outside the file");
  if (hd.n_tensors > (end - hd.index_off) / 20)
    fail(name, "absurd tensor count " + std::to_string(hd.n_tensors));
  return hd;
}

// APR-Q4 (even value in the low nibble) -> GGML Q4_0 (value j low, j + 16 high); same scale.
std::vector<uint8_t> apr_q4_to_q4_0(const uint8_t* src, size_t blocks) {
  std::vector<uint8_t> out(blocks * 18);
  for (size_t b = 0; b < blocks; ++b) {
    const uint8_t* s = src + b * 18;
    uint8_t* d = out.data() + b * 18;
    std::memcpy(d, s, 2);
    uint8_t v[32];
    for (int k = 0; k < 16; ++k) v[2 * k] = s[2 + k] & 0xF, v[2 * k + 1] = s[2 + k] >> 4;
    for (int j = 0; j < 16; ++j) d[2 + j] = (uint8_t)(v[j] | (v[j + 16] << 4));
  }
  return out;
}

// A tensor's GGUF name: GGUF names as they are (blocks, and the model-wide tensors: embedding,
// final norm and classifier with their biases, RoPE factors, encoders' extras), HF names
// mapped; "" for a name of neither kind (skipped).
std::string gguf_name(const std::string& n) {
  static constexpr std::string_view kGgufPrefixes[] = {
      "blk.",           "token_embd.", "token_embd_norm.", "token_types.",
      "position_embd.", "output.",     "output_norm.",     "rope_factors_",
      "rope_freqs.",    "cls.",        "dense_2.",         "dense_3."};
  for (std::string_view p : kGgufPrefixes)
    if (n.starts_with(p)) return n;
  if (auto m = formats::gguf_name_of_hf(n.starts_with("layers.") ? "model." + n : n))
    return m->gguf;
  return "";
}

// One index entry at `pos` -> a tensor info (data converted into keep.owned when needed).
gguf::TensorInfo read_entry(std::span<const uint8_t> b, size_t& pos, size_t index_end,
                            const Header& h, Keep& keep, const std::string& name,
                            std::string& raw_name) {
  auto need = [&](size_t n) {
    if (n > index_end - pos) fail(name, "tensor index is truncated");
  };
  need(2);
  const uint16_t len = load<uint16_t>(b, pos);
  pos += 2;
  need(len + 2u);
  raw_name.assign(reinterpret_cast<const char*>(b.data() + pos), len);
  pos += len;
  const uint8_t dtype = b[pos], nd = b[pos + 1];
  pos += 2;
  if (nd == 0 || nd > 8)
    fail(name, "tensor " + raw_name + " has " + std::to_string(nd) + " dims (1..8)");
  need(8u * nd + 16);
  gguf::TensorInfo t;
  t.name = raw_name;
  uint64_t elems = 1;
  for (int i = 0; i < nd; ++i) {
    const uint64_t d = load<uint64_t>(b, pos + 8 * (size_t)i);
    if (d == 0 || d > (1ull << 40) || elems > (1ull << 48) / d)
      fail(name, "tensor " + raw_name + " has a bad shape");
    elems *= d;
    t.dims.insert(t.dims.begin(), (int64_t)d);  // innermost first, as GGUF
  }
  pos += 8u * nd;
  const uint64_t off = load<uint64_t>(b, pos), size = load<uint64_t>(b, pos + 8);
  pos += 16;
  const uint64_t data_end = b.size() - 4 - h.data_off;
  if (off > data_end || size > data_end - off)
    fail(name, "tensor " + raw_name + " lies outside the data section");
  const uint8_t* data = b.data() + h.data_off + off;
  auto expect = [&](uint64_t bytes) {
    if (size != bytes)
      fail(name, "tensor " + raw_name + ": " + std::to_string(size) + " bytes, its shape needs " +
                     std::to_string(bytes));
  };
  switch (dtype) {
    case 0:
    case 1:
    case 30:
    case 12:
    case 14: {
      t.type = dtype == 0    ? DType::F32
               : dtype == 1  ? DType::F16
               : dtype == 30 ? DType::BF16
               : dtype == 12 ? DType::Q4_K
                             : DType::Q6_K;
      if (t.dims[0] % dtype_traits(t.type).block_elems)
        fail(name, "tensor " + raw_name + ": row length is not a whole number of blocks");
      expect(dtype_row_bytes(t.type, t.dims[0]) * (elems / (uint64_t)t.dims[0]));
      t.data = data;
      break;
    }
    case 128:
    case 8: {  // APR-Q4
      expect((elems + 31) / 32 * 18);
      if (t.dims[0] % 32)
        fail(name, "tensor " + raw_name + ": APR-Q4 rows must hold whole 32-value blocks");
      keep.owned.push_back(apr_q4_to_q4_0(data, (size_t)(elems / 32)));
      t.type = DType::Q4_0;
      break;
    }
    case 129:
    case 9: {  // APR-Q8
      expect(4 + elems);
      const float scale = load<float>(b, h.data_off + off);
      std::vector<uint8_t> f((size_t)elems * 4);
      for (uint64_t i = 0; i < elems; ++i) {
        const float v = (float)(int8_t)data[4 + i] * scale;
        std::memcpy(f.data() + 4 * i, &v, 4);
      }
      keep.owned.push_back(std::move(f));
      t.type = DType::F32;
      break;
    }
    default:
      throw_error(ErrorKind::kUnsupported,
                  name + ": tensor " + raw_name + " has dtype byte " + std::to_string(dtype) +
                      ", which APR readers disagree on or do not define (accepted: 0 F32, 1 F16, "
                      "30 BF16, 12 Q4_K, 14 Q6_K, 128 APR-Q4, 129 APR-Q8)");
  }
  if (t.data == nullptr) t.data = keep.owned.back().data();
  t.nbytes = t.data == data ? size : keep.owned.back().size();
  return t;
}

gguf::GgufFile parse_with(std::span<const uint8_t> b, const std::string& name,
                          std::shared_ptr<Keep> keep) {
  const Header h = read_header(b, name);
  const json meta = formats::parse_json_text(
      std::string_view(reinterpret_cast<const char*>(b.data() + h.meta_off), h.meta_size),
      name + " metadata");
  if (!meta.is_object()) fail(name, "metadata is not a JSON object");
  Metadata out;
  apr_metadata(meta, name, out);
  std::vector<gguf::TensorInfo> tensors;
  size_t pos = h.index_off;
  std::string raw, prev;
  for (uint32_t i = 0; i < h.n_tensors; ++i) {
    gguf::TensorInfo t = read_entry(b, pos, h.data_off, h, *keep, name, raw);
    if (i > 0 && raw <= prev)
      fail(name, "tensor index is not sorted by name ('" + prev + "' before '" + raw + "')");
    prev = raw;
    t.name = gguf_name(raw);
    if (!t.name.empty()) tensors.push_back(std::move(t));
  }
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path beside = fs::path(name).parent_path() / "tokenizer.json";
  bool has_vocab = false;
  for (const auto& kv : out) has_vocab |= kv.first == "tokenizer.ggml.tokens";
  if (!has_vocab && fs::exists(beside, ec))
    out.emplace_back("tokenizer.huggingface.json",
                     Value::string(formats::read_small_file(beside.string(), 512ull << 20)));
  return gguf::GgufFile::assemble(name, std::move(out), std::move(tensors), std::move(keep));
}

}  // namespace

gguf::GgufFile parse(std::span<const uint8_t> bytes, const std::string& name) {
  return parse_with(bytes, name, std::make_shared<Keep>());
}

gguf::GgufFile open(const std::string& path) {
  auto keep = std::make_shared<Keep>();
  keep->map = std::make_shared<MappedFile>(path);
  const std::span<const uint8_t> bytes = keep->map->bytes();
  return parse_with(bytes, path, std::move(keep));
}

}  // namespace hablar::apr
