"""Hugging Face checkpoints of every family hablar runs, against transformers (float32, CPU).

For each family a small model is made here with random weights (every parameter drawn, norm
weights and biases included, so that none of them can be dropped unnoticed) and saved with
save_pretrained, with a byte-level BPE tokenizer trained on the test corpus. hablar serves
the directory; the log-probabilities of the prompt tokens under teacher forcing, and the
top-1 tokens where transformers' choice is clear, must match transformers'.

Families: Phi-3 (fused qkv and gate-up; partial rotation as Phi-4-mini), Phi-2 (LayerNorm
block), Gemma 1 / 2 / 3 (norm weights stored as w and applied as 1 + w; windows, soft-caps,
local RoPE base), Mixtral and Qwen2-/Qwen3-MoE (one tensor per expert, stacked at load),
and Qwen3 for reference.
"""
import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from hablar_serve import Server  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
CORPUS = REPO / "tests" / "data" / "tokenizer-corpus" / "corpus.txt"

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

VOCAB = 512
SMALL = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)

MINISTRAL3_ROPE = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                   "original_max_position_embeddings": 16, "beta_fast": 32.0, "beta_slow": 1.0,
                   "mscale": 1.0, "mscale_all_dim": 1.0, "llama_4_scaling_beta": 0.1}


def families():
    t = transformers
    return {
        "qwen3": (t.Qwen3Config, t.Qwen3ForCausalLM, dict(head_dim=16)),
        "phi3": (t.Phi3Config, t.Phi3ForCausalLM, dict(partial_rotary_factor=0.75)),
        # LongRoPE (Phi-3 128k): served with a context of the original 64 positions, where
        # both take the short factors (transformers by the sequence's length).
        "phi3-longrope": (t.Phi3Config, t.Phi3ForCausalLM, dict(
            original_max_position_embeddings=64,
            rope_scaling={"rope_type": "longrope", "short_factor": [1.0 + 0.05 * i for i in range(8)],
                          "long_factor": [1.0 + 0.5 * i for i in range(8)]})),
        "phi2": (t.PhiConfig, t.PhiForCausalLM, dict(num_key_value_heads=4, partial_rotary_factor=0.4,
                                                     hidden_act="gelu_new")),
        "gemma": (t.GemmaConfig, t.GemmaForCausalLM, dict(head_dim=16,
                                                         hidden_activation="gelu_pytorch_tanh")),
        "gemma2": (t.Gemma2Config, t.Gemma2ForCausalLM, dict(head_dim=16, sliding_window=8,
                                                            query_pre_attn_scalar=16)),
        "gemma3": (t.Gemma3TextConfig, t.Gemma3ForCausalLM,
                   dict(head_dim=16, sliding_window=8, query_pre_attn_scalar=16, num_hidden_layers=3,
                        layer_types=["sliding_attention", "full_attention", "sliding_attention"])),
        # Gemma 3 with vision (4B and up): the language model of a Gemma3ForConditionalGeneration
        # checkpoint, its vision tower skipped.
        "gemma3-vision": (t.Gemma3Config, t.Gemma3ForConditionalGeneration, dict(
            text_config=dict(SMALL, head_dim=16, sliding_window=8, query_pre_attn_scalar=16,
                             num_hidden_layers=3, layer_types=["sliding_attention", "full_attention",
                                                               "sliding_attention"]),
            vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                               num_attention_heads=2, image_size=28, patch_size=14),
            mm_tokens_per_image=4, image_token_index=VOCAB - 1, boi_token_index=VOCAB - 2,
            eoi_token_index=VOCAB - 3)),
        # Mistral Small 3.1 and up: the language model of a Mistral3ForConditionalGeneration.
        "mistral3-vision": (t.Mistral3Config, t.Mistral3ForConditionalGeneration, dict(
            text_config=dict(SMALL, model_type="mistral", head_dim=16, sliding_window=None),
            vision_config=dict(model_type="pixtral", hidden_size=32, intermediate_size=64,
                               num_hidden_layers=1, num_attention_heads=2, image_size=28,
                               patch_size=14, head_dim=16),
            image_token_index=VOCAB - 1, spatial_merge_size=1)),
        # Ministral 3: YaRN, and q tempered past every 16 positions (48 here).
        "ministral3": (t.Ministral3Config, t.Ministral3ForCausalLM, dict(head_dim=16, rope_parameters=MINISTRAL3_ROPE)),
        # Ministral 3 as published: the language model of a Mistral3ForConditionalGeneration.
        "ministral3-vision": (t.Mistral3Config, t.Mistral3ForConditionalGeneration, dict(
            text_config=dict(SMALL, model_type="ministral3", head_dim=16, rope_parameters=MINISTRAL3_ROPE),
            vision_config=dict(model_type="pixtral", hidden_size=32, intermediate_size=64,
                               num_hidden_layers=1, num_attention_heads=2, image_size=28,
                               patch_size=14, head_dim=16),
            image_token_index=VOCAB - 1, spatial_merge_size=1)),
        # Mistral 7B v0.1: every layer attends through a window (8 here, over 48 tokens).
        "mistral": (t.MistralConfig, t.MistralForCausalLM, dict(head_dim=16, sliding_window=8)),
        # SmolLM3: layers 1 and 3 attend without RoPE (no_rope_layers).
        "smollm3": (t.SmolLM3Config, t.SmolLM3ForCausalLM, dict(head_dim=16, num_hidden_layers=4,
                                                               no_rope_layers=[1, 0, 1, 0])),
        # Granite 3: the llama block with its four multipliers.
        "granite": (t.GraniteConfig, t.GraniteForCausalLM, dict(
            embedding_multiplier=12.0, residual_multiplier=0.22, logits_scaling=1.5,
            attention_multiplier=0.0625)),
        "olmo2": (t.Olmo2Config, t.Olmo2ForCausalLM, dict()),
        # OLMo 3: sliding windows of 8 on three layers of four.
        "olmo3": (t.Olmo3Config, t.Olmo3ForCausalLM, dict(
            num_hidden_layers=4, sliding_window=8,
            layer_types=["sliding_attention"] * 3 + ["full_attention"])),
        "exaone4": (t.Exaone4Config, t.Exaone4ForCausalLM, dict(
            head_dim=16, sliding_window=None, layer_types=["full_attention"] * 2)),
        # GLM-4-0414: sandwich norms, q/k/v biases, half of each head rotated (interleaved).
        "glm4": (t.Glm4Config, t.Glm4ForCausalLM, dict(head_dim=16, attention_bias=True)),
        # Arcee (AFM): an ungated relu^2 MLP.
        "arcee": (t.ArceeConfig, t.ArceeForCausalLM, dict(head_dim=16)),
        # Command R (Aya): one LayerNorm feeding attention and SwiGLU side by side.
        "cohere": (t.CohereConfig, t.CohereForCausalLM, dict(logit_scale=0.25)),
        # Command R7B: windows of 8 on three layers of four, the fourth unrotated.
        "cohere2": (t.Cohere2Config, t.Cohere2ForCausalLM, dict(
            num_hidden_layers=4, sliding_window=8, logit_scale=0.25,
            layer_types=["sliding_attention"] * 3 + ["full_attention"])),
        # Nemotron: LayerNorm1P (1 + w) with biases, relu^2 MLP, half of each head rotated.
        "nemotron": (t.NemotronConfig, t.NemotronForCausalLM, dict(attention_bias=True,
                                                                  mlp_bias=True)),
        # StableLM 2: LayerNorms with biases, q/k/v biases, a quarter of each head rotated.
        "stablelm": (t.StableLmConfig, t.StableLmForCausalLM, dict(use_qkv_bias=True)),
        # Seed-OSS: the llama block with q/k/v biases.
        "seed_oss": (t.SeedOssConfig, t.SeedOssForCausalLM, dict(head_dim=16)),
        # ERNIE 4.5 (dense): the llama block, RoPE interleaved in transformers' code.
        "ernie4_5": (t.Ernie4_5Config, t.Ernie4_5ForCausalLM, dict(head_dim=16)),
        # StarCoder2: LayerNorms and projections with biases, an ungated GELU MLP, tied output.
        "starcoder2": (t.Starcoder2Config, t.Starcoder2ForCausalLM, dict(
            num_key_value_heads=2, hidden_act="gelu_pytorch_tanh", use_bias=True)),
        "mixtral": (t.MixtralConfig, t.MixtralForCausalLM, dict(num_local_experts=4,
                                                               num_experts_per_tok=2)),
        "qwen2moe": (t.Qwen2MoeConfig, t.Qwen2MoeForCausalLM,
                     dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                          shared_expert_intermediate_size=64, norm_topk_prob=False)),
        # OLMoE: q/k normed over whole rows, the chosen experts' weights as they are.
        "olmoe": (t.OlmoeConfig, t.OlmoeForCausalLM, dict(num_key_value_heads=4, num_experts=4,
                                                         num_experts_per_tok=2)),
        "qwen3moe": (t.Qwen3MoeConfig, t.Qwen3MoeForCausalLM,
                     dict(head_dim=16, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                          norm_topk_prob=True)),
    }


@pytest.fixture(scope="session")
def bpe_tokenizer(tmp_path_factory):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([CORPUS.read_text(encoding="utf-8")], trainer)
    assert tok.get_vocab_size() == VOCAB
    path = tmp_path_factory.mktemp("bpe") / "tokenizer.json"
    tok.save(str(path))
    return tok, path


def randomize(model, gemma):
    """Every parameter drawn: matrices with a unit gain, norm weights near 1 (Gemma: near 0,
    applied as 1 + w), biases small."""
    gen = torch.Generator().manual_seed(1234)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                p.copy_(torch.randn(p.shape, generator=gen) / math.sqrt(p.shape[-1]))
            elif "norm" in name and name.endswith("weight"):
                p.copy_((0.0 if gemma else 1.0) + 0.1 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))


def make_model(family, tokenizer_json, out_dir):
    cfg_cls, model_cls, extra = families()[family]
    kwargs = {} if "text_config" in extra else dict(SMALL)
    kwargs.update(extra)
    cfg = cfg_cls(**kwargs, bos_token_id=0, eos_token_id=0, pad_token_id=0, tie_word_embeddings=
                  family.startswith("gemma") or family in ("starcoder2", "cohere", "cohere2"))
    torch.manual_seed(0)
    model = model_cls(cfg).eval()
    randomize(model, family.startswith("gemma"))
    model.save_pretrained(str(out_dir))
    (out_dir / "tokenizer.json").write_bytes(tokenizer_json.read_bytes())
    return model


def prompts(tok):
    text = CORPUS.read_text(encoding="utf-8")
    lines = [l for l in text.split("\n") if len(l) > 40]
    return [tok.encode(lines[i] + " " + lines[i + 1]).ids[:48] for i in (0, 7)]


@pytest.mark.parametrize("family", list(families()))
def test_family_matches_transformers(family, bpe_tokenizer, tmp_path):
    tok, tok_path = bpe_tokenizer
    model = make_model(family, tok_path, tmp_path / family)
    server = Server(tmp_path / family, "-c", "64" if family.endswith("longrope") else "512")
    try:
        worst, agree, clear = 0.0, 0, 0
        for ids in prompts(tok):
            with torch.no_grad():
                logp = torch.log_softmax(model(torch.tensor([ids])).logits[0].double(), dim=-1)
            out = server.post("/v1/completions", {"prompt": ids, "max_tokens": 0, "echo": True,
                                                  "logprobs": 1})
            lp = out["choices"][0]["logprobs"]
            assert len(lp["token_logprobs"]) == len(ids)
            for i in range(1, len(ids)):
                worst = max(worst, abs(lp["token_logprobs"][i] - float(logp[i - 1][ids[i]])))
                top2 = torch.topk(logp[i - 1], 2)
                if float(top2.values[0] - top2.values[1]) > 0.05:
                    clear += 1
                    want = tok.decode([int(top2.indices[0])])
                    agree += next(iter(lp["top_logprobs"][i])) == want
    finally:
        server.stop()
    print(f"\n{family}: largest |log p| difference {worst:.2e}; top-1 {agree}/{clear} where clear")
    # The CPU rounds activations as llama.cpp does (GELU through a half-precision table,
    # F32 products on 8-bit or half rows where llama.cpp's kernels take them).
    assert worst < 2e-2, family
    assert clear >= 40 and agree >= clear - 1, (family, agree, clear)


def test_embeddinggemma_matches_transformers(bpe_tokenizer, tmp_path):
    """EmbeddingGemma as sentence-transformers keeps it: Gemma 3's base model attending both
    ways (use_bidirectional_attention) at the directory's root, mean pooling (1_Pooling) and
    two Dense modules (2_Dense, 3_Dense). hablar's /v1/embeddings against transformers'
    hidden rows pooled and projected the same way."""
    import json
    from safetensors.torch import save_file
    tok, tok_path = bpe_tokenizer
    cfg = transformers.Gemma3TextConfig(**dict(SMALL, head_dim=16, sliding_window=8,
                                              query_pre_attn_scalar=16, num_hidden_layers=3,
                                              layer_types=["sliding_attention", "full_attention",
                                                           "sliding_attention"],
                                              use_bidirectional_attention=True),
                                        bos_token_id=0, eos_token_id=0, pad_token_id=0)
    torch.manual_seed(0)
    model = transformers.Gemma3TextModel(cfg).eval()
    randomize(model, True)
    root = tmp_path / "embeddinggemma"
    model.save_pretrained(str(root))
    (root / "tokenizer.json").write_bytes(tok_path.read_bytes())
    gen = torch.Generator().manual_seed(99)
    dense = [torch.randn(256, 64, generator=gen) / 8.0, torch.randn(64, 256, generator=gen) / 16.0]
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
    (root / "1_Pooling").mkdir()
    (root / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_mean_tokens": True}))
    for i, w in enumerate(dense):
        sub = root / f"{i + 2}_Dense"
        sub.mkdir()
        save_file({"linear.weight": w.contiguous()}, str(sub / "model.safetensors"))
        (sub / "config.json").write_text(json.dumps({"in_features": w.shape[1], "out_features": w.shape[0],
                                                     "bias": False}))
        modules.append({"idx": i + 2, "name": str(i + 2), "path": f"{i + 2}_Dense",
                        "type": "sentence_transformers.models.Dense"})
    (root / "modules.json").write_text(json.dumps(modules))
    server = Server(root, "-c", "512")
    try:
        for ids in prompts(tok):
            with torch.no_grad():
                hidden = model(torch.tensor([ids])).last_hidden_state[0].double()
            want = hidden.mean(0) @ dense[0].double().T @ dense[1].double().T
            out = server.post("/v1/embeddings", {"input": [ids]})
            got = torch.tensor(out["data"][0]["embedding"], dtype=torch.float64)
            cos = float(torch.dot(got, want) / (got.norm() * want.norm()))
            print(f"\nembeddinggemma: {len(ids)} tokens, cosine {cos:.9f}")
            assert cos > 0.9999
    finally:
        server.stop()
