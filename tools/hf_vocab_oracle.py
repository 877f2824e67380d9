#!/usr/bin/env python3
"""Regenerates tests/golden/tokenizer/hf-converted-smollm2.json: llama.cpp's token ids for
the GGUF that `hablar convert` writes from the default model's Hugging Face twin
(tools/make_hf_twin.py). The twin's tokenizer.json becomes tokenizer.ggml.* keys; llama.cpp
(llama-cpp-python, vocab_only) reads that vocabulary and tokenizes the shared vector texts of
the gpt-2 vocabulary plus a few of our own. tests/python/test_hf_convert_vocab.py converts
the twin again and checks hablar's ids on the converted file against these.

Usage (the oracle venv has llama_cpp; the twin must exist, e.g. from a pytest run):
  ~/.cache/hablar/oracle-venv/bin/python tools/hf_vocab_oracle.py --hablar build/src/cli/hablar
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import pathlib
import subprocess
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "golden" / "tokenizer" / "hf-converted-smollm2.json"
TWIN = pathlib.Path.home() / ".cache/hablar/hf/SmolLM2-135M-Instruct.Q4_1-float32"
TESTDATA = pathlib.Path(os.environ.get("HABLAR_TESTDATA", ROOT.parent / "shared" / "testdata"))
OWN_TEXTS = [
    "The year 2024 had 366 days!",
    "<|im_start|>user\nWhat is 17 * 23?<|im_end|>\n<|im_start|>assistant\n",
    "naïve café — 東京 🚀 ñandú",
    "def f(x):\n\treturn x ** 2  # square\n",
    "don't you'll I've WE'RE",
]


def vector_texts() -> list[str]:
    raw = (TESTDATA / "vocab" / "ggml-vocab-gpt-2.gguf.inp").read_text(encoding="utf-8")
    return [t for t in raw.split("\n__ggml_vocab_test__\n") if t]


def main() -> None:
    import llama_cpp  # noqa: PLC0415 (only the generator needs it)

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hablar", default=str(ROOT / "build" / "src" / "cli" / "hablar"))
    ap.add_argument("--twin", default=str(TWIN))
    args = ap.parse_args()
    sink = llama_cpp.llama_log_callback(lambda level, text, user_data: None)
    llama_cpp.llama_log_set(sink, ctypes.c_void_p(0))
    texts = vector_texts() + OWN_TEXTS
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "converted.gguf")
        subprocess.run([args.hablar, "convert", args.twin, out], check=True, capture_output=True)
        vocab = llama_cpp.Llama(out, vocab_only=True, verbose=False)
        ids = [vocab.tokenize(t.encode(), add_bos=False, special=True) for t in texts]
        pre = vocab.metadata.get("tokenizer.ggml.pre")
        n_vocab = vocab.n_vocab()
    GOLDEN.write_text(json.dumps({"pre": pre, "n_vocab": n_vocab, "mode": "special tokens parsed, no BOS/EOS added",
                                  "cases": [{"text": t, "ids": i} for t, i in zip(texts, ids)]},
                                 ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {GOLDEN}: {len(texts)} texts, pre {pre}, {n_vocab} tokens")


if __name__ == "__main__":
    main()
