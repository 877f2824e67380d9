#!/usr/bin/env python3
"""Writes fuzz/corpus-hf, the seeds of fuzz/hf_fuzz: small safetensors files, config.json
files of each supported family, and small tokenizer.json files of each model type. The first
byte of a seed picks the parser (0 safetensors, 1 config.json, 2 tokenizer.json)."""
import json
import struct
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def safetensors_bytes(tensors):
    header, data = {}, b""
    for name, (dtype, shape, raw) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    header["__metadata__"] = {"format": "pt"}
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + data


def crc32(b):
    import zlib
    return zlib.crc32(b) & 0xFFFFFFFF


def apr_bytes(meta, tensors):
    """APR v2 per ../shared/formats/apr-v2.md: header, metadata, index, data, footer CRC."""
    def pad(b):
        return b + bytes(-len(b) % 64)
    m = json.dumps(meta).encode()
    body = pad(bytes(64) + m)
    index_off = len(body)
    index, data = b"", b""
    for name, dtype, shape, raw in sorted(tensors):
        index += struct.pack("<H", len(name)) + name.encode() + bytes([dtype, len(shape)])
        index += b"".join(struct.pack("<Q", d) for d in shape) + struct.pack("<QQ", len(data), len(raw))
        data += pad(raw)
    body = pad(body + index)
    data_off = len(body)
    body = bytearray(body + data)
    head = b"APR\0" + bytes([2, 0]) + struct.pack("<HIQIQQ", 0x400, len(tensors), 64, len(m), index_off, data_off)
    body[:40] = head
    body[40:44] = struct.pack("<I", crc32(bytes(body[:40]) + bytes(body[44:64])))
    return bytes(body) + struct.pack("<I", crc32(bytes(body)))


def main(out: Path):
    out.mkdir(parents=True, exist_ok=True)
    seeds = {}
    seeds["safetensors-small"] = b"\0" + safetensors_bytes({
        "model.norm.weight": ("F32", [4], struct.pack("<4f", 1, 2, 3, 4)),
        "lm_head.weight": ("BF16", [2, 4], bytes(16)),
        "model.embed_tokens.weight": ("F16", [3, 4], bytes(24))})
    base = {"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
            "num_hidden_layers": 2, "max_position_embeddings": 256, "rms_norm_eps": 1e-6, "vocab_size": 300,
            "tie_word_embeddings": True}
    seeds["config-llama"] = b"\1" + json.dumps(dict(base, model_type="llama", rope_theta=10000.0,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                      "original_max_position_embeddings": 8192})).encode()
    seeds["config-qwen2"] = b"\1" + json.dumps(dict(base, model_type="qwen2", rope_theta=1e6)).encode()
    seeds["config-qwen3"] = b"\1" + json.dumps(dict(base, model_type="qwen3", head_dim=32,
        rope_parameters={"rope_type": "default", "rope_theta": 1e6})).encode()
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    text = (REPO / "tests/data/tokenizer-corpus/corpus.txt").read_text(encoding="utf-8").split("\n")[:300]
    specials = ["[UNK]", "<s>", "</s>"]
    bl = Tokenizer(models.BPE())
    bl.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bl.decoder = decoders.ByteLevel()
    bl.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    bl.train_from_iterator(text, trainers.BpeTrainer(vocab_size=400, special_tokens=specials,
                                                     initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    wp = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    wp.normalizer = normalizers.BertNormalizer()
    wp.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    wp.decoder = decoders.WordPiece()
    wp.train_from_iterator(text, trainers.WordPieceTrainer(vocab_size=300, special_tokens=specials))
    ug = Tokenizer(models.Unigram())
    ug.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Replace(" ", "\u2581")])
    ug.pre_tokenizer = pre_tokenizers.Metaspace()
    ug.decoder = decoders.Sequence([decoders.Metaspace(), decoders.ByteFallback(), decoders.Fuse()])
    ug.train_from_iterator(text, trainers.UnigramTrainer(vocab_size=600, special_tokens=specials, unk_token="[UNK]"))
    wl = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    wl.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Whitespace(), pre_tokenizers.Digits(),
                                                pre_tokenizers.Split("-", "merged_with_previous")])
    wl.train_from_iterator(text, trainers.WordLevelTrainer(vocab_size=200, special_tokens=specials))
    for name, tok in [("bpe-bytelevel", bl), ("wordpiece", wp), ("unigram", ug), ("wordlevel", wl)]:
        seeds["tokenizer-" + name] = b"\2" + tok.to_str().encode()
    seeds["apr-small"] = b"\3" + apr_bytes({"architecture": "llama", "hidden_size": 32, "num_layers": 1,
        "num_heads": 1, "vocab_size": 4, "tokenizer.vocabulary": ["a", "b", "c", "d"], "tokenizer.model": "gpt2",
        "tokenizer.merges": []}, [("model.norm.weight", 0, [32], bytes(128)), ("lm_head.weight", 128, [4, 32], bytes(72)),
        ("model.embed_tokens.weight", 129, [4, 32], bytes(132))])
    for name, data in seeds.items():
        (out / name).write_bytes(data)
        print(f"{name}: {len(data)} bytes")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else REPO / "fuzz" / "corpus-hf")
