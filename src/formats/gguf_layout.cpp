// A model from a Hugging Face directory in the layout llama.cpp's converter writes, for
// `hablar convert` / `hablar quantize` output that llama.cpp reads as it reads its own:
//  - a byte-level BPE tokenizer.json as tokenizer.ggml.* keys (hf_ggml_vocab.cpp);
//  - the llama family's q / k rows back in llama.cpp's order. transformers keeps them in
//    NeoX order (each head's rotated pairs are (i, i + d/2)) and hablar reads a directory
//    so (hablar.rope.neox = true); llama.cpp rotates adjacent pairs (2i, 2i + 1) for llama,
//    so its converter permutes the rows: row 2i + j of a head takes row j * d/2 + i.
//    qwen2 / qwen3 / phi3 / gemma rotate NeoX pairs in llama.cpp too and keep their rows.
#include <cstring>
#include <memory>

#include "core/error.h"
#include "formats/arch_rope.h"
#include "formats/hf_model.h"

namespace hablar::formats {
namespace {

bool is_q_or_k(const std::string& name) {
  return name.starts_with("blk.") &&
         (name.ends_with(".attn_q.weight") || name.ends_with(".attn_k.weight"));
}

// The rows of a [rows x cols] tensor (of any type: a row is whole blocks) reordered
// head by head from NeoX pairs to adjacent pairs.
std::vector<uint8_t> to_adjacent_pairs(const gguf::TensorInfo& t, int64_t n_heads) {
  const int64_t rows = t.rows();
  if (n_heads <= 0 || rows % n_heads != 0 || (rows / n_heads) % 2 != 0)
    throw_error(ErrorKind::kFormat, t.name + ": " + std::to_string(rows) +
                                        " rows do not split into " + std::to_string(n_heads) +
                                        " heads of even length");
  const int64_t head = rows / n_heads, half = head / 2;
  const size_t row_bytes = (size_t)(t.nbytes / (uint64_t)rows);
  std::vector<uint8_t> out(t.nbytes);
  for (int64_t h = 0; h < n_heads; ++h)
    for (int64_t i = 0; i < half; ++i)
      for (int64_t j = 0; j < 2; ++j) {
        const int64_t dst = h * head + 2 * i + j, src = h * head + j * half + i;
        std::memcpy(out.data() + (size_t)dst * row_bytes, t.data + (size_t)src * row_bytes,
                    row_bytes);
      }
  return out;
}

}  // namespace

gguf::GgufFile llama_cpp_layout(const gguf::GgufFile& f) {
  const auto vocab = ggml_vocab_from_hf(f);
  const std::string arch = f.get_string_or("general.architecture", "");
  const bool permute =
      formats::adjacent_pair_rope(arch) && f.get_bool_or("hablar.rope.neox", false);
  if (!vocab && !permute) return f;
  std::vector<std::pair<std::string, gguf::Value>> meta;
  for (const auto& [key, value] : f.metadata()) {
    if (vocab && key == "tokenizer.huggingface.json") continue;
    if (permute && key == "hablar.rope.neox") continue;  // now llama's own (adjacent) order
    meta.emplace_back(key, value);
  }
  if (vocab) meta.insert(meta.end(), vocab->begin(), vocab->end());
  auto owned = std::make_shared<std::vector<std::vector<uint8_t>>>();
  std::vector<gguf::TensorInfo> tensors = f.tensors();
  if (permute) {
    const int64_t heads = (int64_t)f.get_uint(arch + ".attention.head_count");
    const int64_t kv_heads = (int64_t)f.get_uint_or(arch + ".attention.head_count_kv", heads);
    owned->reserve(tensors.size());
    for (gguf::TensorInfo& t : tensors) {
      if (!is_q_or_k(t.name)) continue;
      owned->push_back(to_adjacent_pairs(t, t.name.ends_with(".attn_q.weight") ? heads : kv_heads));
      t.data = owned->back().data();
    }
  }
  return gguf::GgufFile::assemble(f.path(), std::move(meta), std::move(tensors), owned);
}

}  // namespace hablar::formats
