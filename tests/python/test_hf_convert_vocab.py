"""A GGUF converted from a Hugging Face directory carries llama.cpp's tokenizer.ggml.* keys:
hablar's tokenizer on the converted file gives llama.cpp's ids on it (golden from
tools/hf_vocab_oracle.py), and the converted file generates as the directory does."""
from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
BIN = os.environ.get("HABLAR_BIN", str(REPO / "build" / "src" / "cli" / "hablar"))
GOLDEN = json.loads((REPO / "tests" / "golden" / "tokenizer" / "hf-converted-smollm2.json")
                    .read_text(encoding="utf-8"))
CACHE = pathlib.Path(os.environ["HABLAR_HOME"]) if os.environ.get("HABLAR_HOME") else (
    pathlib.Path.home() / ".cache" / "hablar")
GGUF = CACHE / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
sys.path.insert(0, str(REPO / "tools"))


def hablar(*args, stdin=None):
    r = subprocess.run([BIN, *map(str, args)], input=stdin, capture_output=True, text=True,
                       errors="replace", timeout=600)
    assert r.returncode == 0, f"hablar {' '.join(map(str, args))}: {r.stderr[-2000:]}"
    return r


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    if not GGUF.exists():
        pytest.fail(f"default model missing: {GGUF}")
    from make_hf_twin import make_twin
    twin = make_twin(GGUF, CACHE / "hf" / f"{GGUF.stem}-float32", "float32")
    out = tmp_path_factory.mktemp("hf-convert") / "smollm2.gguf"
    hablar("convert", twin, out)
    return twin, out


def test_converted_gguf_has_llama_cpp_vocabulary_keys(converted):
    from gguf import GGUFReader
    r = GGUFReader(converted[1])
    fields = r.fields
    assert fields["tokenizer.ggml.model"].contents() == "gpt2"
    assert fields["tokenizer.ggml.pre"].contents() == GOLDEN["pre"]
    assert len(fields["tokenizer.ggml.tokens"].contents()) == GOLDEN["n_vocab"]
    assert len(fields["tokenizer.ggml.merges"].contents()) > 40000
    types = fields["tokenizer.ggml.token_type"].contents()
    assert types[0] == 3 and types[1] == 3 and types[100] == 1  # <|endoftext|>, <|im_start|>
    assert fields["tokenizer.ggml.bos_token_id"].contents() == 1
    assert fields["tokenizer.ggml.eos_token_id"].contents() == 2
    assert "tokenizer.huggingface.json" not in fields  # one vocabulary, the GGUF one
    assert "tokenizer.chat_template" in fields


def test_hablar_ids_on_the_converted_gguf_equal_llama_cpp(converted):
    texts = [c["text"] for c in GOLDEN["cases"]]
    got = json.loads(hablar("tokenize", "-m", converted[1], "--batch", "--parse-special", "-",
                            stdin=json.dumps(texts)).stdout)
    for case, ids in zip(GOLDEN["cases"], got):
        assert ids == case["ids"], case["text"]


def test_converted_gguf_generates_as_the_directory(converted):
    twin, gguf = converted
    args = ["run", "-p", "The capital of France is", "-n", "12", "--temp", "0", "--json"]
    want = json.loads(hablar(*args, "-m", twin).stdout)["generated_ids"]
    assert len(want) == 12
    assert json.loads(hablar(*args, "-m", gguf).stdout)["generated_ids"] == want


def test_quantizing_the_directory_equals_converting_then_quantizing(converted, tmp_path):
    twin, gguf = converted
    direct, via = tmp_path / "direct.gguf", tmp_path / "via.gguf"
    hablar("quantize", "-q", "-t", "2", twin, direct, "Q8_0")
    hablar("quantize", "-q", "-t", "2", gguf, via, "Q8_0")
    assert direct.read_bytes() == via.read_bytes()


def test_llama_qk_rows_are_back_in_llama_cpp_order(converted):
    """transformers un-permuted the default model's q/k rows into NeoX order; the converted
    GGUF has them as llama.cpp's converter writes them: equal to the original GGUF's rows
    (dequantized, as transformers read them)."""
    import numpy as np
    from gguf import GGUFReader
    from gguf.quants import dequantize
    original = {t.name: t for t in GGUFReader(GGUF).tensors}
    ours = {t.name: t for t in GGUFReader(converted[1]).tensors}
    fields = GGUFReader(converted[1]).fields
    assert "hablar.rope.neox" not in fields
    for name in ["blk.0.attn_q.weight", "blk.0.attn_k.weight", "blk.29.attn_k.weight"]:
        want = dequantize(original[name].data, original[name].tensor_type)
        got = np.asarray(ours[name].data, dtype=np.float32).reshape(want.shape)
        np.testing.assert_array_equal(got, want, err_msg=name)
