"""`hablar quantize` against llama.cpp's quantizer (llama_model_quantize, what llama-quantize
runs without an importance matrix): the same seeded `make-model` inputs must give files whose
bytes are identical, tensor by tensor and as a whole. The expected digests are in
tests/golden/quantize/llama_quantize.json, written by tools/quantize_oracle.py."""
from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import subprocess

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
HABLAR = os.environ.get("HABLAR_BIN", str(REPO / "build" / "src" / "cli" / "hablar"))
GOLDEN = json.loads((REPO / "tests" / "golden" / "quantize" / "llama_quantize.json").read_text())

_spec = importlib.util.spec_from_file_location("quantize_oracle", REPO / "tools" / "quantize_oracle.py")
oracle = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(oracle)  # stdlib only unless it generates (then it needs llama_cpp)

CASES = [(m["arch"], m["shape"], m["type"], name) for m in GOLDEN["models"] for name in m["cases"]]


def hablar(*args, check=True):
    r = subprocess.run([HABLAR, *map(str, args)], capture_output=True, text=True, errors="replace",
                       timeout=300)
    if check and r.returncode != 0:
        raise AssertionError(f"hablar {' '.join(map(str, args))} failed: {r.stderr}")
    return r


def golden_model(arch, shape, dtype):
    return next(m for m in GOLDEN["models"]
                if (m["arch"], m["shape"], m["type"]) == (arch, shape, dtype))


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    """make-model outputs, made once per model and checked against the oracle's input."""
    root = tmp_path_factory.mktemp("quantize-inputs")
    made = {}

    def get(arch, shape, dtype):
        key = (arch, shape, dtype)
        if key not in made:
            path = root / oracle.model_file_name(arch, shape, dtype)
            oracle.make_model(HABLAR, arch, shape, dtype, str(path))
            assert oracle.sha256_file(str(path)) == golden_model(*key)["input_sha256"], (
                f"make-model no longer writes the oracle's input for {key}")
            made[key] = path
        return made[key]

    return get


def first_differences(got, want, limit=5):
    diffs = [f"{g!r} != {w!r}" for g, w in zip(got, want) if g != w]
    if len(got) != len(want):
        diffs.append(f"{len(got)} tensors, expected {len(want)}")
    return diffs[:limit]


@pytest.mark.parametrize("arch,shape,dtype,ftype", CASES)
def test_quantize_is_byte_identical_to_llama_cpp(tmp_path, inputs, arch, shape, dtype, ftype):
    src = inputs(arch, shape, dtype)
    out = tmp_path / "out.gguf"
    hablar("quantize", "-q", "-t", "2", src, out, ftype)
    want = golden_model(arch, shape, dtype)["cases"][ftype]
    got = oracle.tensor_digests(str(out))
    assert got == want["tensors"], first_differences(got, want["tensors"])
    assert oracle.sha256_file(str(out)) == want["file_sha256"]


def test_lowercase_names_and_aliases(tmp_path, inputs):
    src = inputs("llama", "tiny-odd", "f16")
    out = tmp_path / "alias.gguf"
    hablar("quantize", "-q", src, out, "q4_k")  # llama-quantize's alias of Q4_K_M
    want = golden_model("llama", "tiny-odd", "f16")["cases"]["Q4_K_M"]["file_sha256"]
    assert oracle.sha256_file(str(out)) == want


def test_quantized_model_loads_and_generates(tmp_path, inputs):
    out = tmp_path / "q4km.gguf"
    hablar("quantize", "-q", inputs("qwen3", "tiny-odd", "bf16"), out, "Q4_K_M")
    info = hablar("info", out).stdout
    assert "qwen3" in info
    r = hablar("run", "-m", out, "-p", "hello", "-n", "4", "--temp", "0")
    assert r.returncode == 0


def test_apr_input_gives_the_same_tensors(tmp_path, inputs):
    apr = tmp_path / "model.apr"
    hablar("convert", inputs("llama", "tiny-odd", "f16"), apr)
    out = tmp_path / "from-apr.gguf"
    hablar("quantize", "-q", apr, out, "Q4_K_M")
    want = golden_model("llama", "tiny-odd", "f16")["cases"]["Q4_K_M"]["tensors"]
    got = oracle.tensor_digests(str(out))
    assert got == want, first_differences(got, want)


def test_requantizing_needs_the_flag(tmp_path, inputs):
    q8 = tmp_path / "q8.gguf"
    hablar("quantize", "-q", inputs("llama", "tiny-odd", "f16"), q8, "Q8_0")
    r = hablar("quantize", "-q", q8, tmp_path / "q4.gguf", "Q4_K_M", check=False)
    assert r.returncode != 0
    assert "already q8_0" in r.stderr and "--allow-requantize" in r.stderr
    assert not (tmp_path / "q4.gguf").exists()
    hablar("quantize", "-q", "--allow-requantize", q8, tmp_path / "q4.gguf", "Q4_K_M")
    digests = oracle.tensor_digests(str(tmp_path / "q4.gguf"))
    assert any(" q4_K " in d for d in digests) and any(" q6_K " in d for d in digests)


def test_bad_arguments_name_the_fault(tmp_path, inputs):
    src = inputs("llama", "tiny-odd", "f16")
    r = hablar("quantize", src, tmp_path / "x.gguf", "Q4_K_XL", check=False)
    assert r.returncode != 0 and "unknown type 'Q4_K_XL'" in r.stderr and "Q4_K_M" in r.stderr
    r = hablar("quantize", src, tmp_path / "x.bin", "Q8_0", check=False)
    assert r.returncode != 0 and "must end in .gguf" in r.stderr
    r = hablar("quantize", tmp_path / "missing.gguf", tmp_path / "x.gguf", "Q8_0", check=False)
    assert r.returncode != 0 and "missing.gguf" in r.stderr
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + bytes(12))
    r = hablar("quantize", bad, tmp_path / "x.gguf", "Q8_0", check=False)
    assert r.returncode != 0 and "bad.gguf" in r.stderr


def test_golden_covers_the_named_types():
    covered = {name for m in GOLDEN["models"] for name in m["cases"]}
    assert covered >= {"Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K_M", "Q4_K_S", "Q5_K_M",
                       "Q6_K", "Q2_K", "Q3_K_S", "Q3_K_M", "Q3_K_L", "Q5_K_S", "IQ4_NL",
                       "IQ4_XS", "F16", "BF16", "F32"}
