"""The vocabularies llama.cpp's source tree ships (models/ggml-vocab-*.gguf) that the shared
test data lacks: Aquila, Baichuan, Command-R, Gemma 4 (BPE over raw UTF-8), GPT-NeoX,
nomic-bert-moe (Unigram with a precompiled charsmap), Qwen3.5.

`hablar tokenize --batch` must give llama.cpp's ids (tests/golden/tokenizer/
llama-shipped-vocabs.json, from tools/pretokenizer_oracle.py shipped) on the pre-tokenizer
texts, and every vocabulary that comes with llama.cpp's test vectors (.inp/.out) must pass
them. The vocabularies are read from LLAMA_CPP_MODELS (default: the vendored llama.cpp tree
of the llama-cpp-python sdist), which a CI machine does not have: this is a check to run by
hand where that tree exists (`.venv/bin/python -m pytest tools/check_llama_shipped_vocabs.py`),
not part of the test suite; a missing vocabulary fails it.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BIN = Path(os.environ.get("HABLAR_BIN", REPO / "build" / "src" / "cli" / "hablar"))
MODELS = Path(os.environ.get(
    "LLAMA_CPP_MODELS", "/work/llamacpp/llama_cpp_python-0.3.36/vendor/llama.cpp/models"))
GOLDEN = json.loads((REPO / "tests" / "golden" / "tokenizer" /
                     "llama-shipped-vocabs.json").read_text(encoding="utf-8"))


def tokenize_all(vocab: Path, texts: list[str]) -> list[list[int]]:
    r = subprocess.run([str(BIN), "tokenize", "-m", str(vocab), "--batch", "-"],
                       input=json.dumps(texts).encode(), capture_output=True, timeout=300)
    assert r.returncode == 0, r.stderr.decode(errors="replace")
    return json.loads(r.stdout)


def need(vocab: Path) -> None:
    assert vocab.exists(), f"{vocab} not present (set LLAMA_CPP_MODELS)"


@pytest.mark.parametrize("name", sorted(GOLDEN["vocabs"]))
def test_ids_match_llama_cpp(name: str) -> None:
    vocab = MODELS / name
    need(vocab)
    texts = GOLDEN["texts"]
    got = tokenize_all(vocab, texts)
    want = GOLDEN["vocabs"][name]
    bad = [i for i in range(len(texts)) if got[i] != want[i]]
    assert not bad, f"{name}: {len(bad)}/{len(texts)} texts differ, first #{bad[0]} " \
                    f"{texts[bad[0]]!r}: {got[bad[0]]} != {want[bad[0]]}"


WITH_VECTORS = sorted(n for n in GOLDEN["vocabs"]
                      if (MODELS / n).with_suffix(".gguf.inp").exists())


@pytest.mark.parametrize("name", WITH_VECTORS)
def test_shipped_vectors(name: str) -> None:
    vocab = MODELS / name
    need(vocab)
    inp = vocab.with_suffix(".gguf.inp")
    texts = inp.read_text(encoding="utf-8").split("\n__ggml_vocab_test__\n")
    lines = vocab.with_suffix(".gguf.out").read_text(encoding="utf-8").split("\n")
    want = [[int(x) for x in line.split()] for line in lines[:len(texts)]]
    got = tokenize_all(vocab, texts)
    bad = [i for i in range(len(texts)) if got[i] != want[i]]
    assert not bad, f"{name}: {len(bad)}/{len(texts)} vectors differ, first #{bad[0]}"
