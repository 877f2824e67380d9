// Synthetic model files: which tensors each architecture's file holds, with llama.cpp's names,
// shapes and order of creation, and the type each takes under a quantization mix.
#include <string>

#include "formats/synthetic_model.h"

namespace hablar::synth {
namespace {

std::string block_name(int64_t layer, std::string_view what) {
  return "blk." + std::to_string(layer) + "." + std::string(what);
}

// An encoder's tensors (llama.cpp's names and order of creation).
std::vector<PlannedTensor> plan_encoder_tensors(Arch arch, const ModelShape& s, int64_t vocab_size,
                                                const QuantMix& mix, bool rank_head) {
  using Init = PlannedTensor::Init;
  const int n_layers = (int)s.n_layers;
  const int64_t h = s.hidden, ff = s.ffn;
  std::vector<PlannedTensor> out;
  const auto add = [&](std::string name, std::vector<int64_t> dims, Init init, int layer) {
    const DType type = quant_mix_tensor_type(mix, name, layer, n_layers, dims[0], true);
    out.push_back({std::move(name), std::move(dims), type, init});
  };
  const auto norm = [&](const std::string& name, int layer) {
    add(name + ".weight", {h}, Init::kNorm, layer);
    add(name + ".bias", {h}, Init::kBias, layer);
  };
  add("token_embd.weight", {h, vocab_size}, Init::kMatrix, -1);
  // As llama.cpp's converter and quantizer leave them: token types in F32 (llama.cpp adds
  // the row to F32 activations, which needs F32), positions never quantized.
  add("token_types.weight", {h, 2}, Init::kMatrix, -1);
  out.back().type = DType::F32;
  if (arch == Arch::kBert) {
    add("position_embd.weight", {h, s.context}, Init::kMatrix, -1);
    if (out.back().type != DType::F32 && out.back().type != DType::BF16)
      out.back().type = DType::F16;
  }
  norm("token_embd_norm", -1);
  if (rank_head) {
    add("cls.weight", {h, h}, Init::kMatrix, -1);
    add("cls.bias", {h}, Init::kBias, -1);
    add("cls.output.weight", {h, 1}, Init::kMatrix, -1);
    add("cls.output.bias", {1}, Init::kBias, -1);
  }
  for (int l = 0; l < n_layers; ++l) {
    const bool bert = arch == Arch::kBert;
    if (bert) {
      for (const char* m : {"attn_q", "attn_k", "attn_v"}) {
        add(block_name(l, std::string(m) + ".weight"), {h, h}, Init::kMatrix, l);
        add(block_name(l, std::string(m) + ".bias"), {h}, Init::kBias, l);
      }
    } else {
      add(block_name(l, "attn_qkv.weight"), {h, 3 * h}, Init::kMatrix, l);
    }
    add(block_name(l, "attn_output.weight"), {h, h}, Init::kMatrix, l);
    if (bert) add(block_name(l, "attn_output.bias"), {h}, Init::kBias, l);
    norm(block_name(l, "attn_output_norm"), l);
    add(block_name(l, "ffn_up.weight"), {h, ff}, Init::kMatrix, l);
    if (bert) add(block_name(l, "ffn_up.bias"), {ff}, Init::kBias, l);
    if (!bert) add(block_name(l, "ffn_gate.weight"), {h, ff}, Init::kMatrix, l);
    add(block_name(l, "ffn_down.weight"), {ff, h}, Init::kMatrix, l);
    if (bert) add(block_name(l, "ffn_down.bias"), {h}, Init::kBias, l);
    norm(block_name(l, "layer_output_norm"), l);
  }
  return out;
}

// phi2's tensors (llama.cpp's names, as its converter writes Phi-2: q, k, v apart).
// phi2's (one LayerNorm per layer; a classifier with a bias) and starcoder2's (a LayerNorm
// before attention and one before the MLP; the classifier token_embd when the shape ties it).
std::vector<PlannedTensor> plan_layernorm_tensors(Arch arch, const ModelShape& s,
                                                  int64_t vocab_size, const QuantMix& mix) {
  const bool phi2 = arch == Arch::kPhi2;
  const bool biased = phi2 || arch == Arch::kStarCoder2;  // (Orion, Nemotron: norms' biases only)
  const bool qkv_biased = biased || arch == Arch::kStableLm;
  const bool has_output = phi2 || !s.tied_embeddings;
  using Init = PlannedTensor::Init;
  const int n_layers = (int)s.n_layers;
  const int64_t h = s.hidden, kv = s.n_kv_heads * s.head_dim, q = s.n_heads * s.head_dim;
  std::vector<PlannedTensor> out;
  const auto add = [&](std::string name, std::vector<int64_t> dims, Init init, int layer) {
    const DType type = quant_mix_tensor_type(mix, name, layer, n_layers, dims[0], has_output);
    out.push_back({std::move(name), std::move(dims), type, init});
  };
  // A matrix [rows x cols] with its bias [rows] (where the family has one).
  const auto linear = [&](const std::string& name, int64_t cols, int64_t rows, int layer) {
    add(name + ".weight", {cols, rows}, Init::kMatrix, layer);
    if (biased) add(name + ".bias", {rows}, Init::kBias, layer);
  };
  const auto norm = [&](const std::string& name, int layer) {
    add(name + ".weight", {h}, Init::kNorm, layer);
    add(name + ".bias", {h}, Init::kBias, layer);
  };
  add("token_embd.weight", {h, vocab_size}, Init::kMatrix, -1);
  for (int l = 0; l < n_layers; ++l) {
    norm(block_name(l, "attn_norm"), l);
    for (const auto& [name, rows] :
         {std::pair{"attn_q", q}, std::pair{"attn_k", kv}, std::pair{"attn_v", kv}}) {
      add(block_name(l, std::string(name) + ".weight"), {h, rows}, Init::kMatrix, l);
      if (qkv_biased) add(block_name(l, std::string(name) + ".bias"), {rows}, Init::kBias, l);
    }
    linear(block_name(l, "attn_output"), q, h, l);
    if (!phi2) norm(block_name(l, "ffn_norm"), l);
    if (arch == Arch::kOrion || arch == Arch::kStableLm)
      linear(block_name(l, "ffn_gate"), h, s.ffn, l);
    linear(block_name(l, "ffn_up"), h, s.ffn, l);
    linear(block_name(l, "ffn_down"), s.ffn, h, l);
  }
  norm("output_norm", -1);
  if (phi2) {
    linear("output", h, vocab_size, -1);
  } else if (!s.tied_embeddings) {
    add("output.weight", {h, vocab_size}, Init::kMatrix, -1);
  }
  return out;
}

}  // namespace

std::vector<PlannedTensor> plan_tensors(Arch arch, const ModelShape& s, int64_t vocab_size,
                                        const QuantMix& mix, bool rank_head) {
  if (is_encoder(arch)) return plan_encoder_tensors(arch, s, vocab_size, mix, rank_head);
  if (arch == Arch::kPhi2 || arch == Arch::kStarCoder2 || arch == Arch::kOrion ||
      arch == Arch::kNemotron || arch == Arch::kStableLm)
    return plan_layernorm_tensors(arch, s, vocab_size, mix);
  using Init = PlannedTensor::Init;
  const int n_layers = (int)s.n_layers;
  // Gemma 1 and 2 always share token_embd as their classifier.
  // (Command R's classifier is token_embd too; its LayerNorms carry no bias.)
  const bool cohere = arch == Arch::kCommandR || arch == Arch::kCohere2;
  const bool has_output = !s.tied_embeddings && arch != Arch::kGemma2 && arch != Arch::kGemma &&
                          arch != Arch::kGemmaEmbedding && !cohere;
  std::vector<PlannedTensor> out;
  const auto add = [&](std::string name, std::vector<int64_t> dims, Init init, int layer) {
    const DType type = quant_mix_tensor_type(mix, name, layer, n_layers, dims[0], has_output);
    out.push_back({std::move(name), std::move(dims), type, init});
  };
  const int64_t q_len = s.n_heads * s.head_dim;
  const int64_t kv_len = s.n_kv_heads * s.head_dim;
  add("token_embd.weight", {s.hidden, vocab_size}, Init::kMatrix, -1);
  const bool olmo2 = arch == Arch::kOlmo2 || arch == Arch::kExaone4;  // (post-norms only)
  for (int l = 0; l < n_layers; ++l) {
    if (!olmo2) add(block_name(l, "attn_norm.weight"), {s.hidden}, Init::kNorm, l);
    if (arch == Arch::kPhi3) {
      add(block_name(l, "attn_qkv.weight"), {s.hidden, q_len + 2 * kv_len}, Init::kMatrix, l);
    } else {
      add(block_name(l, "attn_q.weight"), {s.hidden, q_len}, Init::kMatrix, l);
      add(block_name(l, "attn_k.weight"), {s.hidden, kv_len}, Init::kMatrix, l);
      add(block_name(l, "attn_v.weight"), {s.hidden, kv_len}, Init::kMatrix, l);
    }
    if (arch == Arch::kQwen2 || arch == Arch::kQwen2Moe || arch == Arch::kGlm4 ||
        arch == Arch::kSeedOss) {
      add(block_name(l, "attn_q.bias"), {q_len}, Init::kBias, l);
      add(block_name(l, "attn_k.bias"), {kv_len}, Init::kBias, l);
      add(block_name(l, "attn_v.bias"), {kv_len}, Init::kBias, l);
    }
    if (arch == Arch::kQwen3 || arch == Arch::kGemma3 || arch == Arch::kQwen3Moe ||
        arch == Arch::kGemmaEmbedding || arch == Arch::kExaone4 || arch == Arch::kHunyuanDense) {
      add(block_name(l, "attn_q_norm.weight"), {s.head_dim}, Init::kNorm, l);
      add(block_name(l, "attn_k_norm.weight"), {s.head_dim}, Init::kNorm, l);
    }
    if (arch == Arch::kOlmo2 || arch == Arch::kOlmoe) {  // over whole rows
      add(block_name(l, "attn_q_norm.weight"), {q_len}, Init::kNorm, l);
      add(block_name(l, "attn_k_norm.weight"), {kv_len}, Init::kNorm, l);
    }
    add(block_name(l, "attn_output.weight"), {q_len, s.hidden}, Init::kMatrix, l);
    const bool gemma = arch == Arch::kGemma2 || arch == Arch::kGemma3 ||
                       arch == Arch::kGemmaEmbedding || olmo2 || arch == Arch::kGlm4;  // post-norms
    if (gemma) add(block_name(l, "post_attention_norm.weight"), {s.hidden}, Init::kNorm, l);
    if (!olmo2 && !cohere)
      add(block_name(l, arch == Arch::kSeedOss ? "post_attention_norm.weight" : "ffn_norm.weight"),
          {s.hidden}, Init::kNorm, l);
    const bool ffn_wide_experts =
        arch == Arch::kMixtral || arch == Arch::kOlmoe || arch == Arch::kGraniteMoe;
    if (arch == Arch::kQwen3Moe || arch == Arch::kQwen2Moe || ffn_wide_experts) {
      const int64_t fe = !ffn_wide_experts && s.ffn_expert > 0 ? s.ffn_expert : s.ffn;
      add(block_name(l, "ffn_gate_inp.weight"), {s.hidden, s.n_experts}, Init::kMatrix, l);
      add(block_name(l, "ffn_gate_exps.weight"), {s.hidden, fe, s.n_experts}, Init::kMatrix, l);
      add(block_name(l, "ffn_up_exps.weight"), {s.hidden, fe, s.n_experts}, Init::kMatrix, l);
      add(block_name(l, "ffn_down_exps.weight"), {fe, s.hidden, s.n_experts}, Init::kMatrix, l);
      if (arch == Arch::kQwen2Moe) {
        add(block_name(l, "ffn_gate_inp_shexp.weight"), {s.hidden}, Init::kMatrix, l);
        add(block_name(l, "ffn_gate_shexp.weight"), {s.hidden, s.ffn}, Init::kMatrix, l);
        add(block_name(l, "ffn_up_shexp.weight"), {s.hidden, s.ffn}, Init::kMatrix, l);
        add(block_name(l, "ffn_down_shexp.weight"), {s.ffn, s.hidden}, Init::kMatrix, l);
      }
    } else if (arch == Arch::kArcee) {  // (no gate)
      add(block_name(l, "ffn_up.weight"), {s.hidden, s.ffn}, Init::kMatrix, l);
      add(block_name(l, "ffn_down.weight"), {s.ffn, s.hidden}, Init::kMatrix, l);
    } else if (arch == Arch::kPhi3 || arch == Arch::kGlm4) {  // (gate and up fused)
      add(block_name(l, "ffn_up.weight"), {s.hidden, 2 * s.ffn}, Init::kMatrix, l);
      add(block_name(l, "ffn_down.weight"), {s.ffn, s.hidden}, Init::kMatrix, l);
    } else {
      add(block_name(l, "ffn_gate.weight"), {s.hidden, s.ffn}, Init::kMatrix, l);
      add(block_name(l, "ffn_up.weight"), {s.hidden, s.ffn}, Init::kMatrix, l);
      add(block_name(l, "ffn_down.weight"), {s.ffn, s.hidden}, Init::kMatrix, l);
    }
    if (gemma) add(block_name(l, "post_ffw_norm.weight"), {s.hidden}, Init::kNorm, l);
  }
  add("output_norm.weight", {s.hidden}, Init::kNorm, -1);
  if (has_output) add("output.weight", {s.hidden, vocab_size}, Init::kMatrix, -1);
  if (arch == Arch::kGemmaEmbedding) {
    add("dense_2.weight", {s.hidden, 4 * s.hidden}, Init::kMatrix, -1);
    add("dense_3.weight", {4 * s.hidden, s.hidden}, Init::kMatrix, -1);
  }
  return out;
}

}  // namespace hablar::synth
