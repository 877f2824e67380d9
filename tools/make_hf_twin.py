#!/usr/bin/env python3
"""Writes the Hugging Face twin of a GGUF model: transformers loads the GGUF (dequantized to
float32) and save_pretrained writes config.json, model.safetensors, tokenizer.json,
tokenizer_config.json and generation_config.json. No model hub is contacted.

    tools/make_hf_twin.py [--gguf PATH] [--out DIR] [--dtype float32|bfloat16]
"""
import argparse
import os
import sys
from pathlib import Path

DEFAULT_GGUF = Path.home() / ".cache/hablar/models/SmolLM2-135M-Instruct.Q4_1.gguf"


def make_twin(gguf: Path, out: Path, dtype: str = "float32") -> Path:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if (out / "config.json").exists() and (out / "tokenizer.json").exists():
        return out
    tmp = out.with_name(out.name + ".tmp")
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=getattr(torch, dtype))
    # The GGUF was dequantized on load; what remains is a plain model (transformers still
    # marks it as "quantized with gguf", which only blocks saving).
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    tmp.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(tmp))
    tok.save_pretrained(str(tmp))
    tmp.rename(out)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--gguf", type=Path, default=DEFAULT_GGUF)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    a = ap.parse_args()
    out = a.out or Path.home() / ".cache/hablar/hf" / f"{a.gguf.stem}-{a.dtype}"
    print(make_twin(a.gguf, out, a.dtype))
    return 0


if __name__ == "__main__":
    sys.exit(main())
