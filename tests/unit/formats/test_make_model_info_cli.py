"""Black-box tests of `hablar make-model` and `hablar info`, with the PyPI `gguf` package's
reader as the independent judge of what was written and of what the default model holds."""
import json
import os
import pathlib
import subprocess

import numpy as np
import pytest
from gguf import GGUFReader
from gguf.constants import GGMLQuantizationType
from gguf.quants import dequantize

REPO = pathlib.Path(__file__).resolve().parents[3]
HABLAR = os.environ.get("HABLAR_BIN", str(REPO / "build" / "src" / "cli" / "hablar"))
TESTDATA = pathlib.Path(os.environ.get("HABLAR_TESTDATA", REPO.parent / "shared" / "testdata"))
MODEL_CACHE = pathlib.Path(
    os.environ["HABLAR_HOME"] + "/models"
    if os.environ.get("HABLAR_HOME")
    else pathlib.Path.home() / ".cache" / "hablar" / "models"
)
DEFAULT_MODEL = MODEL_CACHE / "SmolLM2-135M-Instruct.Q4_1.gguf"


def hablar(*args, check=True):
    result = subprocess.run([HABLAR, *map(str, args)], capture_output=True, text=True, timeout=300)
    if check and result.returncode != 0:
        raise AssertionError(f"hablar {' '.join(map(str, args))} failed: {result.stderr}")
    return result


def tensors_by_name(reader):
    return {t.name: t for t in reader.tensors}


def field(reader, key):
    return reader.fields[key].contents()


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_make_model_is_read_by_the_gguf_package(tmp_path, arch):
    out = tmp_path / f"{arch}.gguf"
    hablar("make-model", "--arch", arch, "--shape", "tiny", "--type", "q8_0", "--seed", "5", "-o", out)
    r = GGUFReader(out)
    assert field(r, "general.architecture") == arch
    assert field(r, f"{arch}.block_count") == 2
    assert field(r, f"{arch}.embedding_length") == 256
    assert field(r, f"{arch}.attention.head_count_kv") == 2
    assert field(r, "general.file_type") == 7
    t = tensors_by_name(r)
    assert list(t["token_embd.weight"].shape) == [256, 512]
    assert t["blk.1.ffn_down.weight"].tensor_type == GGMLQuantizationType.Q8_0
    assert t["blk.1.ffn_norm.weight"].tensor_type == GGMLQuantizationType.F32
    assert ("blk.0.attn_q.bias" in t) == (arch == "qwen2")
    assert ("blk.0.attn_q_norm.weight" in t) == (arch == "qwen3")
    assert "output.weight" in t  # the tiny shape has an untied output
    # Matrix weights: uniform with std 1/sqrt(row length), decoded by gguf's own Q8_0 code.
    down = dequantize(t["blk.0.ffn_down.weight"].data, GGMLQuantizationType.Q8_0)
    assert down.shape == (256, 512)
    assert abs(float(down.std()) - 1 / np.sqrt(512)) < 0.002
    assert float(np.abs(down).max()) <= np.sqrt(3 / 512) * 1.01
    norm = np.asarray(t["blk.0.attn_norm.weight"].data)
    assert abs(float(norm.mean()) - 1.0) < 0.02 and float(np.abs(norm - 1).max()) <= 0.1 + 1e-6


def test_make_model_copies_a_real_vocabulary(tmp_path):
    vocab = TESTDATA / "vocab" / "ggml-vocab-llama-spm.gguf"
    out = tmp_path / "m.gguf"
    hablar("make-model", "--arch", "llama", "--shape", "tiny", "--type", "f16", "--vocab", vocab, "-o", out)
    want = GGUFReader(vocab)
    got = GGUFReader(out)
    tokens = field(want, "tokenizer.ggml.tokens")
    assert field(got, "tokenizer.ggml.tokens") == tokens
    assert field(got, "tokenizer.ggml.scores") == field(want, "tokenizer.ggml.scores")
    assert list(tensors_by_name(got)["token_embd.weight"].shape) == [256, len(tokens)]


def test_make_model_is_deterministic_per_seed(tmp_path):
    paths = [tmp_path / f"{name}.gguf" for name in ("a", "b", "c")]
    for path, seed in zip(paths, (1, 1, 2)):
        hablar("make-model", "--shape", "tiny", "--type", "f16", "--seed", seed, "-o", path)
    a, b, c = (p.read_bytes() for p in paths)
    assert a == b and a != c


def test_info_on_the_default_model_shows_the_acceptance_figures():
    assert DEFAULT_MODEL.exists(), "default model missing: run scripts/fetch-model.sh"
    info = json.loads(hablar("info", "--json").stdout)
    h = info["hyperparameters"]
    assert (h["layers"], h["hidden"], h["heads"], h["kv_heads"]) == (30, 576, 9, 3)
    assert h["vocab_size"] == 49152 and info["tokenizer"]["tokens"] == 49152
    assert info["chat_template"]["present"] and info["chat_template"]["length"] > 100
    # The real type and shape of every tensor, as the gguf package reads them.
    reader = GGUFReader(DEFAULT_MODEL)
    want = {t.name: (t.tensor_type.name.lower(), [int(d) for d in t.shape], int(t.n_bytes)) for t in reader.tensors}
    got = {t["name"]: (t["type"].lower(), t["shape"], t["bytes"]) for t in info["tensors"]}
    assert got == want
    assert info["totals"]["params"] == sum(int(t.n_elements) for t in reader.tensors)


def test_info_text_and_template(tmp_path):
    assert DEFAULT_MODEL.exists(), "default model missing: run scripts/fetch-model.sh"
    text = hablar("info", DEFAULT_MODEL).stdout
    for line in ("layers         30", "hidden         576", "heads          9", "kv heads       3",
                 "vocab size     49152", "chat template: present"):
        assert line in text
    assert "blk.0.attn_q.weight" in text and "q4_1" in text
    shown = hablar("info", "--show-template", "--no-tensors", DEFAULT_MODEL).stdout
    assert "<|im_start|>" in shown and "blk.0.attn_q.weight" not in shown


def test_info_reports_a_synthetic_model_shape(tmp_path):
    out = tmp_path / "q3.gguf"
    hablar("make-model", "--arch", "qwen3", "--shape", "tiny", "--type", "q4_0", "-o", out)
    info = json.loads(hablar("info", "--json", out).stdout)
    assert info["architecture"] == "qwen3"
    assert info["hyperparameters"]["layers"] == 2 and info["hyperparameters"]["head_dim"] == 64
    assert info["file_type_name"] == "q4_0"
    assert info["chat_template"]["present"] is False


def test_cli_errors_name_the_fault(tmp_path):
    bad_shape = hablar("make-model", "--shape", "huge", "-o", tmp_path / "x.gguf", check=False)
    assert bad_shape.returncode == 1 and "unknown shape 'huge'" in bad_shape.stderr
    bad_type = hablar("make-model", "--type", "q9_9", "-o", tmp_path / "x.gguf", check=False)
    assert bad_type.returncode == 1 and "q9_9" in bad_type.stderr
    assert not (tmp_path / "x.gguf").exists()
    cut = tmp_path / "cut.gguf"
    hablar("make-model", "--shape", "tiny", "-o", cut)
    cut.write_bytes(cut.read_bytes()[:1000])
    result = hablar("info", cut, check=False)
    assert result.returncode == 1 and str(cut) in result.stderr and "truncated" in result.stderr


# gguf package value type names -> hablar's.
TYPE_NAMES = {"UINT8": "u8", "INT8": "i8", "UINT16": "u16", "INT16": "i16", "UINT32": "u32",
              "INT32": "i32", "FLOAT32": "f32", "BOOL": "bool", "STRING": "string", "ARRAY": "array",
              "UINT64": "u64", "INT64": "i64", "FLOAT64": "f64"}


@pytest.mark.parametrize("name", ["ggml-vocab-bert-bge.gguf", "ggml-vocab-llama-spm.gguf"])
def test_metadata_of_real_files_matches_the_gguf_package(name):
    path = TESTDATA / "vocab" / name
    info = json.loads(hablar("info", "--json", "--metadata", path).stdout)
    reader = GGUFReader(path)
    want = {k: f for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    assert list(info["metadata"]) == list(want)  # same keys, same order
    for key, f in want.items():
        shown = info["metadata"][key]
        if f.types[0].name == "ARRAY":
            assert shown.startswith(f"[{len(f.data)} x {TYPE_NAMES[f.types[1].name]}]"), key
        elif f.types[0].name == "STRING":
            assert shown.startswith('"' + f.contents()[:20].replace("\n", "\\n").replace('"', '\\"')), key
        elif f.types[0].name in ("FLOAT32", "FLOAT64"):
            assert float(shown) == pytest.approx(f.contents(), rel=1e-5), key
        elif f.types[0].name == "BOOL":
            assert shown == str(bool(f.contents())).lower(), key
        else:
            assert int(shown) == f.contents(), key
