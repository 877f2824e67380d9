// Model summaries from GGUF metadata. Keys follow llama.cpp's naming: general.*,
// <architecture>.* hyperparameters, tokenizer.* vocabulary.
#include "formats/model_info.h"

#include <cctype>
#include <cstdio>
#include <cstdlib>

namespace hablar::gguf {

namespace {

// The shortest decimal that reads back as the same f32, as a double: an f32 1e-5 is shown
// as 1e-05, not as its exact binary value 9.99999974e-06.
double shortest_float(double value) {
  char buf[32];
  for (int digits = 1; digits <= 9; ++digits) {
    std::snprintf(buf, sizeof buf, "%.*g", digits, value);
    const double parsed = std::strtod(buf, nullptr);
    if ((float)parsed == (float)value) return parsed;
  }
  return value;
}

// Lenient readers: a summary shows what is there and skips what has an unexpected type
// (e.g. a per-layer array where one number is usual) instead of failing.
std::optional<uint64_t> opt_uint(const GgufFile& f, const std::string& key) {
  const Value* v = f.find(key);
  if (!v) return std::nullopt;
  if (auto* u = std::get_if<uint64_t>(&v->data)) return *u;
  if (auto* i = std::get_if<int64_t>(&v->data); i && *i >= 0) return (uint64_t)*i;
  return std::nullopt;
}
std::optional<double> opt_float(const GgufFile& f, const std::string& key) {
  const Value* v = f.find(key);
  if (!v) return std::nullopt;
  auto* d = std::get_if<double>(&v->data);
  if (!d) return std::nullopt;
  return v->type == ValueType::F32 ? shortest_float(*d) : *d;
}
std::optional<std::string> opt_string(const GgufFile& f, const std::string& key) {
  const Value* v = f.find(key);
  if (!v) return std::nullopt;
  if (auto* s = std::get_if<std::string>(&v->data)) return *s;
  return std::nullopt;
}
std::optional<bool> opt_bool(const GgufFile& f, const std::string& key) {
  const Value* v = f.find(key);
  if (!v) return std::nullopt;
  if (auto* b = std::get_if<bool>(&v->data)) return *b;
  return std::nullopt;
}
const Array* opt_array(const GgufFile& f, const std::string& key) {
  const Value* v = f.find(key);
  return v ? std::get_if<Array>(&v->data) : nullptr;
}

HyperParameters read_hparams(const GgufFile& f, const std::string& arch) {
  const std::string a = arch + ".";
  HyperParameters h;
  h.n_layers = opt_uint(f, a + "block_count");
  h.hidden = opt_uint(f, a + "embedding_length");
  h.n_heads = opt_uint(f, a + "attention.head_count");
  h.n_kv_heads = opt_uint(f, a + "attention.head_count_kv");
  if (!h.n_kv_heads) h.n_kv_heads = h.n_heads;  // no key: as many KV heads as heads
  h.head_dim = opt_uint(f, a + "attention.key_length");
  if (!h.head_dim && h.hidden && h.n_heads && *h.n_heads > 0) h.head_dim = *h.hidden / *h.n_heads;
  h.ffn = opt_uint(f, a + "feed_forward_length");
  h.context = opt_uint(f, a + "context_length");
  h.rope_dims = opt_uint(f, a + "rope.dimension_count");
  h.rope_base = opt_float(f, a + "rope.freq_base");
  h.rope_scaling = opt_string(f, a + "rope.scaling.type");
  h.rope_scale = opt_float(f, a + "rope.scaling.factor");
  h.rope_original_context = opt_uint(f, a + "rope.scaling.original_context_length");
  h.norm_eps = opt_float(f, a + "attention.layer_norm_rms_epsilon");
  if (!h.norm_eps) h.norm_eps = opt_float(f, a + "attention.layer_norm_epsilon");
  h.sliding_window = opt_uint(f, a + "attention.sliding_window");
  h.n_experts = opt_uint(f, a + "expert_count");
  h.n_experts_used = opt_uint(f, a + "expert_used_count");
  h.vocab_size = opt_uint(f, a + "vocab_size");
  if (const Array* tokens = opt_array(f, "tokenizer.ggml.tokens"))
    h.vocab_size = tokens->items.size();
  else if (const TensorInfo* embd = f.find_tensor("token_embd.weight");
           embd && embd->dims.size() == 2 && !h.vocab_size)
    h.vocab_size = (uint64_t)embd->dims[1];
  return h;
}

std::optional<TokenizerSummary> read_tokenizer(const GgufFile& f) {
  const Array* tokens = opt_array(f, "tokenizer.ggml.tokens");
  const std::optional<std::string> model = opt_string(f, "tokenizer.ggml.model");
  if (!tokens && !model) return std::nullopt;
  TokenizerSummary t;
  t.model = model.value_or("");
  t.pre = opt_string(f, "tokenizer.ggml.pre").value_or("");
  t.n_tokens = tokens ? tokens->items.size() : 0;
  if (const Array* merges = opt_array(f, "tokenizer.ggml.merges"))
    t.n_merges = merges->items.size();
  static constexpr const char* kRoles[][2] = {
      {"bos", "bos_token_id"},       {"eos", "eos_token_id"},     {"eot", "eot_token_id"},
      {"eom", "eom_token_id"},       {"unk", "unknown_token_id"}, {"pad", "padding_token_id"},
      {"sep", "seperator_token_id"}, {"cls", "cls_token_id"},     {"mask", "mask_token_id"}};
  for (const auto& [role, suffix] : kRoles) {
    const std::optional<uint64_t> id = opt_uint(f, std::string("tokenizer.ggml.") + suffix);
    if (!id) continue;
    std::string text;
    if (tokens && *id < tokens->items.size())
      if (auto* s = std::get_if<std::string>(&tokens->items[*id].data)) text = *s;
    t.special.push_back({role, (int64_t)*id, text});
  }
  t.add_bos = opt_bool(f, "tokenizer.ggml.add_bos_token");
  t.add_eos = opt_bool(f, "tokenizer.ggml.add_eos_token");
  return t;
}

std::string quoted(const std::string& s, size_t max_chars) {
  std::string out = "\"";
  for (char c : s.substr(0, max_chars)) {
    if (c == '\n')
      out += "\\n";
    else if (c == '"')
      out += "\\\"";
    else if ((unsigned char)c < 0x20)
      out += '?';
    else
      out += c;
  }
  out += s.size() > max_chars ? "...\"" : "\"";
  return out;
}

// llama_ftype numbers and the names quantization tools use for them.
struct FileTypeName {
  uint32_t number;
  std::string_view name;
};
constexpr FileTypeName kFileTypes[] = {
    {0, "f32"},      {1, "f16"},      {2, "q4_0"},    {3, "q4_1"},    {7, "q8_0"},
    {8, "q5_0"},     {9, "q5_1"},     {10, "q2_k"},   {11, "q3_k_s"}, {12, "q3_k_m"},
    {13, "q3_k_l"},  {14, "q4_k_s"},  {15, "q4_k_m"}, {16, "q5_k_s"}, {17, "q5_k_m"},
    {18, "q6_k"},    {19, "iq2_xxs"}, {20, "iq2_xs"}, {21, "q2_k_s"}, {22, "iq3_xs"},
    {23, "iq3_xxs"}, {24, "iq1_s"},   {25, "iq4_nl"}, {26, "iq3_s"},  {27, "iq3_m"},
    {28, "iq2_s"},   {29, "iq2_m"},   {30, "iq4_xs"}, {31, "iq1_m"},  {32, "bf16"},
};

}  // namespace

std::string file_type_name(uint64_t file_type) {
  for (const FileTypeName& f : kFileTypes)
    if (f.number == file_type) return std::string(f.name);
  return "unknown";
}

std::optional<uint32_t> file_type_from_name(std::string_view name) {
  std::string lower(name);
  for (char& c : lower) c = (char)std::tolower((unsigned char)c);
  if (lower == "q3_k") lower = "q3_k_s";  // a plain K type counts as its small mix
  if (lower == "q4_k") lower = "q4_k_s";
  if (lower == "q5_k") lower = "q5_k_s";
  for (const FileTypeName& f : kFileTypes)
    if (f.name == lower) return f.number;
  return std::nullopt;
}

std::string value_preview(const Value& v, size_t max_chars) {
  if (auto* u = std::get_if<uint64_t>(&v.data)) return std::to_string(*u);
  if (auto* i = std::get_if<int64_t>(&v.data)) return std::to_string(*i);
  if (auto* d = std::get_if<double>(&v.data)) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g", *d);
    return buf;
  }
  if (auto* b = std::get_if<bool>(&v.data)) return *b ? "true" : "false";
  if (auto* s = std::get_if<std::string>(&v.data)) return quoted(*s, max_chars);
  const Array& a = std::get<Array>(v.data);
  std::string out = "[";
  out += std::to_string(a.size());
  out += " x ";
  out += value_type_name(a.elem_type);
  out += ']';
  std::string items;
  for (size_t k = 0; k < a.size() && items.size() < max_chars; ++k) {
    if (k) items += ", ";
    items += value_preview(a.at(k), 16);
  }
  if (!items.empty()) {
    out += ' ';
    out += items;
    if (items.size() >= max_chars) out += ", ...";
  }
  return out;
}

ModelInfo summarize_model(const GgufFile& f) {
  ModelInfo m;
  m.path = f.path();
  m.version = f.version();
  m.file_size = f.file_size();
  m.alignment = f.alignment();
  m.data_offset = f.data_offset();
  m.architecture = opt_string(f, "general.architecture").value_or("");
  m.name = opt_string(f, "general.name").value_or("");
  m.file_type = opt_uint(f, "general.file_type");
  if (!m.architecture.empty()) m.hparams = read_hparams(f, m.architecture);
  m.tokenizer = read_tokenizer(f);
  m.chat_template = opt_string(f, "tokenizer.chat_template");
  for (const TensorInfo& t : f.tensors()) {
    TypeTotal& total = m.by_type[std::string(dtype_name(t.type))];
    total.n_tensors += 1;
    total.n_params += (uint64_t)t.n_elements();
    total.n_bytes += t.nbytes;
    m.n_params += (uint64_t)t.n_elements();
    m.n_bytes += t.nbytes;
  }
  return m;
}

}  // namespace hablar::gguf
