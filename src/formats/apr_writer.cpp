// APR v2 writer (see apr.h): for tests and GGUF -> APR conversion.
#include <algorithm>
#include <cstring>

#include <optional>
#include "core/error.h"

#include "formats/apr.h"
#include "formats/arch_rope.h"

namespace hablar::apr {

using nlohmann::json;

namespace {

void pad64(std::vector<uint8_t>& out) {
  out.resize((out.size() + 63) / 64 * 64, 0);
}

template <typename T>
void put(std::vector<uint8_t>& out, T v) {
  uint8_t b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));
  out.insert(out.end(), b, b + sizeof(T));
}

template <typename T>
void put_at(std::vector<uint8_t>& out, size_t at, T v) {
  std::memcpy(out.data() + at, &v, sizeof(T));
}

}  // namespace

std::vector<uint8_t> write(const json& metadata, std::vector<WriteTensor> tensors) {
  std::sort(tensors.begin(), tensors.end(),
            [](const WriteTensor& a, const WriteTensor& b) { return a.name < b.name; });
  std::vector<uint8_t> out(64, 0);
  const std::string meta = metadata.dump();
  out.insert(out.end(), meta.begin(), meta.end());
  pad64(out);
  const uint64_t index_off = out.size();
  uint64_t offset = 0;
  for (const WriteTensor& t : tensors) {
    if (t.name.size() > 0xFFFF || t.shape.empty() || t.shape.size() > 8)
      throw_error(ErrorKind::kInvalidArgument,
                  "APR writer: tensor " + t.name + " has a bad name or shape");
    put<uint16_t>(out, (uint16_t)t.name.size());
    out.insert(out.end(), t.name.begin(), t.name.end());
    out.push_back(t.dtype);
    out.push_back((uint8_t)t.shape.size());
    for (uint64_t d : t.shape) put<uint64_t>(out, d);
    put<uint64_t>(out, offset);
    put<uint64_t>(out, t.bytes.size());
    offset = (offset + t.bytes.size() + 63) / 64 * 64;
  }
  pad64(out);
  const uint64_t data_off = out.size();
  for (const WriteTensor& t : tensors) {
    out.insert(out.end(), t.bytes.begin(), t.bytes.end());
    pad64(out);
  }
  std::memcpy(out.data(), "APR\0", 4);
  out[4] = 2, out[5] = 0;
  put_at<uint16_t>(out, 6, 0x400);  // row-major
  put_at<uint32_t>(out, 8, (uint32_t)tensors.size());
  put_at<uint64_t>(out, 12, 64);
  put_at<uint32_t>(out, 20, (uint32_t)meta.size());
  put_at<uint64_t>(out, 24, index_off);
  put_at<uint64_t>(out, 32, data_off);
  std::vector<uint8_t> h(out.begin(), out.begin() + 40);
  h.insert(h.end(), out.begin() + 44, out.begin() + 64);
  put_at<uint32_t>(out, 40, crc32(h));
  put<uint32_t>(out, crc32(out));
  return out;
}

// A GGUF metadata value as JSON: numbers, booleans, strings and arrays of them (nullopt for
// nested arrays, which no <arch>.* key holds).
std::optional<json> json_of(const gguf::Value& v) {
  if (const auto* u = std::get_if<uint64_t>(&v.data)) return json(*u);
  if (const auto* i = std::get_if<int64_t>(&v.data)) return json(*i);
  if (const auto* d = std::get_if<double>(&v.data)) return json(*d);
  if (const auto* b = std::get_if<bool>(&v.data)) return json(*b);
  if (const auto* s = std::get_if<std::string>(&v.data)) return json(*s);
  const auto& a = std::get<gguf::Array>(v.data);
  if (a.elem_type == gguf::ValueType::ARRAY) return std::nullopt;
  json out = json::array();
  for (size_t i = 0; i < a.size(); ++i) {
    std::optional<json> e = json_of(a.at(i));
    if (!e) return std::nullopt;
    out.push_back(std::move(*e));
  }
  return out;
}

std::vector<uint8_t> from_gguf(const gguf::GgufFile& f) {
  const std::string a = f.get_string("general.architecture");
  json m = {{"architecture", a}};
  auto num = [&](const char* key, const std::string& gguf_key) {
    if (const gguf::Value* v = f.find(gguf_key)) {
      if (auto* u = std::get_if<uint64_t>(&v->data)) m[key] = *u;
      if (auto* d = std::get_if<double>(&v->data)) m[key] = *d;
    }
  };
  num("num_layers", a + ".block_count");
  num("hidden_size", a + ".embedding_length");
  num("num_heads", a + ".attention.head_count");
  num("num_kv_heads", a + ".attention.head_count_kv");
  num("intermediate_size", a + ".feed_forward_length");
  num("max_position_embeddings", a + ".context_length");
  num("head_dim", a + ".attention.key_length");
  num("rms_norm_eps", a + ".attention.layer_norm_rms_epsilon");
  num("rope_theta", a + ".rope.freq_base");
  // 2 = NeoX halves: qwen2/qwen3 and the others, and any checkpoint in transformers' q/k order.
  m["rope_type"] = f.get_bool_or("hablar.rope.neox", !formats::adjacent_pair_rope(a)) ? 2 : 0;
  m["tied_embeddings"] = f.find_tensor("output.weight") == nullptr;
  if (f.has("tokenizer.ggml.tokens")) {
    m["tokenizer.vocabulary"] = f.get_string_array("tokenizer.ggml.tokens");
    m["tokenizer.model"] = f.get_string_or("tokenizer.ggml.model", "gpt2");
    if (f.has("tokenizer.ggml.merges"))
      m["tokenizer.merges"] = f.get_string_array("tokenizer.ggml.merges");
    if (f.has("tokenizer.ggml.scores"))
      m["tokenizer.scores"] = f.get_f32_array("tokenizer.ggml.scores");
    if (f.has("tokenizer.ggml.token_type"))
      m["tokenizer.token_type"] = f.get_i32_array("tokenizer.ggml.token_type");
    if (f.has("tokenizer.ggml.pre")) m["tokenizer.pre_type"] = f.get_string("tokenizer.ggml.pre");
    for (const char* role : {"bos", "eos"})
      if (auto id = f.uint_or_none(std::string("tokenizer.ggml.") + role + "_token_id"))
        m[std::string("tokenizer.") + role + "_token_id"] = *id;
    if (f.has("tokenizer.ggml.add_bos_token"))
      m["tokenizer.add_bos_token"] = f.get_bool("tokenizer.ggml.add_bos_token");
  }
  if (f.has("tokenizer.chat_template"))
    m["chat_template"] = f.get_string("tokenizer.chat_template");
  // Every other hyperparameter (LayerNorm epsilon, partial RoPE, scaling, experts, windows,
  // soft-caps, pooling, ...) under its own GGUF key, an extra top-level key the reader
  // takes back (apr_metadata.cpp).
  for (const auto& [key, value] : f.metadata())
    if (key.starts_with(a + ".") || key.starts_with("hablar."))
      if (std::optional<json> j = json_of(value)) m[key] = std::move(*j);
  std::vector<WriteTensor> tensors;
  for (const gguf::TensorInfo& t : f.tensors()) {
    uint8_t dtype;
    switch (t.type) {
      case DType::F32:
        dtype = 0;
        break;
      case DType::F16:
        dtype = 1;
        break;
      case DType::BF16:
        dtype = 30;
        break;
      case DType::Q4_K:
        dtype = 12;
        break;
      case DType::Q6_K:
        dtype = 14;
        break;
      default:
        throw_error(ErrorKind::kUnsupported,
                    f.path() + ": tensor " + t.name + " has type " +
                        std::string(dtype_name(t.type)) +
                        ", which APR cannot hold (F32, F16, BF16, Q4_K, Q6_K)");
    }
    tensors.push_back(
        {t.name, dtype, {t.dims.rbegin(), t.dims.rend()}, {t.data, t.data + t.nbytes}});
  }
  return write(m, std::move(tensors));
}

}  // namespace hablar::apr
