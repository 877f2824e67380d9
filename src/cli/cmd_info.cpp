// `hablar info [FILE]`: describes a GGUF model (architecture, hyperparameters, tokenizer,
// chat template, tensors, totals) as text or, with --json, as one JSON object. The file is
// mapped and only its header is read: tensor data is never touched.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "cli/command.h"
#include "core/paths.h"
#include "formats/gguf.h"
#include "formats/hf_model.h"
#include "formats/model_info.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/tokenizer.h"

namespace hablar::cli {
namespace {

using gguf::ModelInfo;
using nlohmann::ordered_json;

struct InfoOptions {
  std::string model;
  bool json = false;
  bool show_template = false;
  bool show_metadata = false;
  bool show_tensors = true;
};

template <typename T>
ordered_json opt_json(const std::optional<T>& v) {
  return v ? ordered_json(*v) : ordered_json(nullptr);
}

std::string mib(uint64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f MiB", (double)bytes / (1024.0 * 1024.0));
  return buf;
}

ordered_json hparams_json(const gguf::HyperParameters& h) {
  return {{"layers", opt_json(h.n_layers)},
          {"hidden", opt_json(h.hidden)},
          {"heads", opt_json(h.n_heads)},
          {"kv_heads", opt_json(h.n_kv_heads)},
          {"head_dim", opt_json(h.head_dim)},
          {"ffn", opt_json(h.ffn)},
          {"context", opt_json(h.context)},
          {"vocab_size", opt_json(h.vocab_size)},
          {"rope_base", opt_json(h.rope_base)},
          {"rope_dims", opt_json(h.rope_dims)},
          {"rope_scaling", opt_json(h.rope_scaling)},
          {"rope_scale", opt_json(h.rope_scale)},
          {"rope_original_context", opt_json(h.rope_original_context)},
          {"norm_eps", opt_json(h.norm_eps)},
          {"sliding_window", opt_json(h.sliding_window)},
          {"experts", opt_json(h.n_experts)},
          {"experts_used", opt_json(h.n_experts_used)}};
}

ordered_json info_json(const gguf::GgufFile& f, const ModelInfo& m, const InfoOptions& o) {
  ordered_json j;
  j["file"] = m.path;
  j["format"] = f.get_string_or("general.source.format", "gguf");
  j["gguf_version"] = m.version;
  j["file_size"] = m.file_size;
  j["alignment"] = m.alignment;
  j["architecture"] = m.architecture;
  j["name"] = m.name;
  j["file_type"] = opt_json(m.file_type);
  j["file_type_name"] = m.file_type ? ordered_json(gguf::file_type_name(*m.file_type)) : nullptr;
  j["hyperparameters"] = hparams_json(m.hparams);
  if (m.tokenizer) {
    const gguf::TokenizerSummary& t = *m.tokenizer;
    ordered_json special = ordered_json::object();
    for (const gguf::SpecialToken& s : t.special)
      special[s.role] = {{"id", s.id}, {"text", s.text}};
    j["tokenizer"] = {{"model", t.model},
                      {"pre", t.pre},
                      {"tokens", t.n_tokens},
                      {"merges", t.n_merges},
                      {"special", special},
                      {"add_bos", opt_json(t.add_bos)},
                      {"add_eos", opt_json(t.add_eos)}};
  } else {
    j["tokenizer"] = nullptr;
  }
  j["chat_template"] = {{"present", m.chat_template.has_value()},
                        {"length", m.chat_template ? m.chat_template->size() : 0}};
  if (o.show_template) j["chat_template"]["text"] = opt_json(m.chat_template);
  if (o.show_metadata) {
    ordered_json meta = ordered_json::object();
    for (const auto& [key, value] : f.metadata()) meta[key] = gguf::value_preview(value, 200);
    j["metadata"] = meta;
  }
  ordered_json tensors = ordered_json::array();
  for (const gguf::TensorInfo& t : f.tensors())
    tensors.push_back({{"name", t.name},
                       {"type", std::string(dtype_name(t.type))},
                       {"shape", t.dims},
                       {"bytes", t.nbytes}});
  j["tensors"] = tensors;
  ordered_json by_type = ordered_json::object();
  for (const auto& [type, total] : m.by_type)
    by_type[type] = {
        {"tensors", total.n_tensors}, {"params", total.n_params}, {"bytes", total.n_bytes}};
  j["totals"] = {{"tensors", f.tensors().size()},
                 {"params", m.n_params},
                 {"bytes", m.n_bytes},
                 {"bits_per_weight", m.bits_per_weight()},
                 {"by_type", by_type}};
  return j;
}

void print_row(const char* label, const std::string& value) {
  std::printf("  %-14s %s\n", label, value.c_str());
}
template <typename T>
void print_opt(const char* label, const std::optional<T>& v) {
  if (!v) return;
  if constexpr (std::is_same_v<T, double>) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g", *v);
    print_row(label, buf);
  } else if constexpr (std::is_same_v<T, std::string>) {
    print_row(label, *v);
  } else {
    print_row(label, std::to_string(*v));
  }
}

void print_hparams(const gguf::HyperParameters& h) {
  std::printf("hyperparameters:\n");
  print_opt("layers", h.n_layers);
  print_opt("hidden", h.hidden);
  print_opt("heads", h.n_heads);
  print_opt("kv heads", h.n_kv_heads);
  print_opt("head dim", h.head_dim);
  print_opt("ffn", h.ffn);
  print_opt("context", h.context);
  print_opt("vocab size", h.vocab_size);
  print_opt("rope base", h.rope_base);
  print_opt("rope dims", h.rope_dims);
  print_row("rope scaling", h.rope_scaling.value_or("none"));
  print_opt("rope factor", h.rope_scale);
  print_opt("rope orig ctx", h.rope_original_context);
  print_opt("norm eps", h.norm_eps);
  print_opt("sliding win", h.sliding_window);
  print_opt("experts", h.n_experts);
  print_opt("experts used", h.n_experts_used);
}

void print_tokenizer(const std::optional<gguf::TokenizerSummary>& tok) {
  if (!tok) {
    std::printf("tokenizer: none\n");
    return;
  }
  std::printf("tokenizer:\n");
  print_row("model", tok->model);
  if (!tok->pre.empty()) {
    // A GGUF pre-tokenizer name hablar does not know: loading the model will fail.
    const auto known = tokenizer::PreTokenizer::supported_names();
    const bool bpe = tok->model == "gpt2" || tok->model == "gemma4" || tok->model == "whitespace";
    const bool unknown = bpe && std::find(known.begin(), known.end(), tok->pre) == known.end();
    print_row("pre",
              unknown ? tok->pre + "  (unsupported: the tokenizer will not load)" : tok->pre);
  }
  print_row("tokens", std::to_string(tok->n_tokens));
  if (tok->n_merges) print_row("merges", std::to_string(tok->n_merges));
  for (const gguf::SpecialToken& s : tok->special) {
    const std::string label = s.role + " id";
    print_row(label.c_str(),
              std::to_string(s.id) + "  " + gguf::value_preview(gguf::Value::string(s.text)));
  }
  if (tok->add_bos) print_row("add bos", *tok->add_bos ? "true" : "false");
  if (tok->add_eos) print_row("add eos", *tok->add_eos ? "true" : "false");
}

void print_text(const gguf::GgufFile& f, const ModelInfo& m, const InfoOptions& o) {
  std::printf("file:          %s\n", m.path.c_str());
  const std::string source = f.get_string_or("general.source.format", "");
  if (source == "huggingface")  // described by formats/hf_model.h
    std::printf(
        "format:        Hugging Face directory (config.json, safetensors, tokenizer.json)\n");
  else if (source == "apr")  // formats/apr.h
    std::printf("format:        APR v2\n");
  else
    std::printf("format:        GGUF v%u, %s, alignment %llu, tensor data at byte %llu\n",
                m.version, mib(m.file_size).c_str(), (unsigned long long)m.alignment,
                (unsigned long long)m.data_offset);
  std::printf("architecture:  %s\n", m.architecture.empty() ? "(none)" : m.architecture.c_str());
  if (!m.name.empty()) std::printf("name:          %s\n", m.name.c_str());
  if (m.file_type)
    std::printf("file type:     %llu (%s)\n", (unsigned long long)*m.file_type,
                gguf::file_type_name(*m.file_type).c_str());
  print_hparams(m.hparams);
  print_tokenizer(m.tokenizer);
  if (m.chat_template)
    std::printf("chat template: present (%zu chars%s)\n", m.chat_template->size(),
                o.show_template ? "" : "; --show-template prints it");
  else
    std::printf("chat template: none\n");
  if (o.show_metadata) {
    std::printf("metadata (%zu keys):\n", f.metadata().size());
    for (const auto& [key, value] : f.metadata())
      std::printf("  %-44s %s\n", key.c_str(), gguf::value_preview(value).c_str());
  }
  if (o.show_tensors) {
    std::printf("tensors (%zu):\n  %-36s %-8s %-22s %12s\n", f.tensors().size(), "name", "type",
                "shape", "bytes");
    for (const gguf::TensorInfo& t : f.tensors())
      std::printf("  %-36s %-8s %-22s %12llu\n", t.name.c_str(),
                  std::string(dtype_name(t.type)).c_str(), t.shape_string().c_str(),
                  (unsigned long long)t.nbytes);
  }
  std::printf("totals:        %zu tensors, %.2f M params, %s, %.3f bits/weight\n",
              f.tensors().size(), (double)m.n_params / 1e6, mib(m.n_bytes).c_str(),
              m.bits_per_weight());
  for (const auto& [type, total] : m.by_type)
    std::printf("  %-8s %5llu tensors %12.3f M params %14s\n", type.c_str(),
                (unsigned long long)total.n_tensors, (double)total.n_params / 1e6,
                mib(total.n_bytes).c_str());
  if (o.show_template && m.chat_template)
    std::printf("chat template text:\n%s\n", m.chat_template->c_str());
}

// A Hugging Face directory's vocabulary is its tokenizer.json, not tokenizer.ggml.* keys:
// summarised from the loaded tokenizer.
std::optional<gguf::TokenizerSummary> hf_tokenizer_summary(const gguf::GgufFile& f) {
  if (f.has("tokenizer.ggml.model") || !f.has("tokenizer.huggingface.json")) return std::nullopt;
  const auto tok = tokenizer::Tokenizer::from_gguf(f);
  gguf::TokenizerSummary t;
  t.model = std::string(tok->model_name());
  t.pre = std::string(tok->pre_name());
  t.n_tokens = (uint64_t)tok->n_vocab();
  for (const auto& [role, id] : {std::pair{"bos", tok->bos_id()}, std::pair{"eos", tok->eos_id()}})
    if (id >= 0) t.special.push_back({role, id, tok->token_piece(id)});
  t.add_bos = tok->add_bos();
  t.add_eos = tok->add_eos();
  return t;
}

int run_info(const InfoOptions& o) {
  const gguf::GgufFile f = formats::open_model_file(resolve_model_path(o.model));
  ModelInfo m = gguf::summarize_model(f);
  if (auto t = hf_tokenizer_summary(f)) m.tokenizer = std::move(t);
  if (o.json)
    std::printf("%s\n", info_json(f, m, o).dump(2).c_str());
  else
    print_text(f, m, o);
  return 0;
}

const CommandRegistration registration{
    "info",
    "Describe a model (GGUF file or Hugging Face directory): hyperparameters, tokenizer, tensors",
    [](CLI::App& app) {
      auto o = std::make_shared<InfoOptions>();
      app.add_option("model", o->model,
                     "GGUF path, Hugging Face directory or model name in the cache (default: the "
                     "default model)");
      app.add_flag("--json", o->json, "print one JSON object");
      app.add_flag("--show-template", o->show_template, "print the chat template");
      app.add_flag("--metadata", o->show_metadata, "list every metadata key");
      app.add_flag("!--no-tensors", o->show_tensors, "omit the tensor table (text output)");
      return [o] { return run_info(*o); };
    }};

}  // namespace
}  // namespace hablar::cli
