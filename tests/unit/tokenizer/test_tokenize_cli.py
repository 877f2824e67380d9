"""`hablar tokenize` and `hablar detokenize` end to end through the binary.

The ids printed for each shipped vocabulary's test texts must equal the expected ids of its
`.out` file (the same vectors the C++ tests use), and detokenize must give the text back.
Output formats (--ids, --pieces, --json), standard input, special tokens and errors are
checked on the default model's tokenizer and on the llama-spm vocabulary.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
BIN = Path(os.environ.get("HABLAR_BIN", REPO / "build" / "src" / "cli" / "hablar"))
TESTDATA = Path(os.environ.get("HABLAR_TESTDATA", REPO.parent / "shared" / "testdata"))
VOCAB = TESTDATA / "vocab"
SPM = VOCAB / "ggml-vocab-llama-spm.gguf"
QWEN = VOCAB / "ggml-vocab-qwen2.gguf"


def run(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN), *args], input=stdin, capture_output=True, timeout=120)


def ids_of(out: bytes) -> list[int]:
    return [int(x) for x in out.split()]


@pytest.mark.parametrize("vocab", ["llama-spm", "qwen2", "gpt-2", "deepseek-llm", "bert-bge"])
def test_vectors_through_stdin(vocab: str) -> None:
    path = VOCAB / f"ggml-vocab-{vocab}.gguf"
    texts = path.with_suffix(".gguf.inp").read_bytes().split(b"\n__ggml_vocab_test__\n")
    expected = path.with_suffix(".gguf.out").read_text().split("\n")
    picked = [0, 3, 7, 12, 20, 33, len(texts) - 1]
    for i in picked:
        r = run("tokenize", "-m", str(path), "-", stdin=texts[i])
        assert r.returncode == 0, r.stderr
        assert ids_of(r.stdout) == [int(x) for x in expected[i].split()], (vocab, i)


def test_detokenize_round_trip() -> None:
    text = "Hello wörld — 東京 👍🏽 tabs\tand  spaces"
    ids = ids_of(run("tokenize", "-m", str(QWEN), text).stdout)
    assert len(ids) > 5
    r = run("detokenize", "-m", str(QWEN), *map(str, ids))
    assert r.returncode == 0, r.stderr
    assert r.stdout.decode() == text + "\n"


def test_json_and_pieces() -> None:
    r = run("tokenize", "-m", str(SPM), "--json", "Hello world")
    assert r.returncode == 0, r.stderr
    j = json.loads(r.stdout)
    assert j["pieces"] == ["▁Hello", "▁world"]
    assert len(j["ids"]) == 2
    r = run("tokenize", "-m", str(SPM), "--pieces", "Hello world")
    lines = r.stdout.decode().splitlines()
    assert [json.loads(line.split("\t")[1]) for line in lines] == ["▁Hello", "▁world"]
    assert [int(line.split("\t")[0]) for line in lines] == j["ids"]
    assert run("tokenize", "-m", str(SPM), "--json", "--pieces", "x").returncode != 0


def test_add_and_parse_special() -> None:
    plain = ids_of(run("tokenize", "-m", str(SPM), "<s>Hi").stdout)
    parsed = ids_of(run("tokenize", "-m", str(SPM), "--parse-special", "<s>Hi").stdout)
    with_bos = ids_of(run("tokenize", "-m", str(SPM), "--add-special", "Hi").stdout)
    assert parsed[0] == 1 and 1 not in plain
    assert with_bos[0] == 1 and with_bos[1:] == ids_of(run("tokenize", "-m", str(SPM), "Hi").stdout)
    shown = run("detokenize", "-m", str(SPM), "--show-special", *map(str, parsed))
    assert shown.stdout.decode().startswith("<s>")


def test_errors_are_reported() -> None:
    r = run("detokenize", "-m", str(SPM), "5", "999999")
    assert r.returncode == 1
    assert b"999999" in r.stderr and b"out of range" in r.stderr
    r = run("tokenize", "-m", str(VOCAB / "no-such-file.gguf"), "x")
    assert r.returncode == 1
    assert b"no-such-file" in r.stderr


def test_unknown_pre_tokenizer_is_a_clear_error(tmp_path: Path) -> None:
    import sys
    sys.path.insert(0, str(REPO / "tools"))
    import pretokenizer_oracle as oracle  # its small GGUF reader/writer
    version, kvs = oracle.read_gguf(str(VOCAB / "ggml-vocab-gpt-2.gguf"))
    bad = tmp_path / "bad.gguf"
    oracle.write_gguf(str(bad), version, oracle.relabel(kvs, "no-such-pre"))
    r = run("tokenize", "-m", str(bad), "hello")
    assert r.returncode != 0
    err = r.stderr.decode()
    assert "unsupported pre-tokenizer" in err and "'no-such-pre'" in err
    for name in ("gpt-2", "tekken", "kimi-k2", "deepseek-v3", "gemma4", "superbpe"):
        assert name in err, name
    info = run("info", str(bad))
    assert info.returncode == 0
    assert b"no-such-pre  (unsupported" in info.stdout
    good = tmp_path / "tekken.gguf"
    oracle.write_gguf(str(good), version, oracle.relabel(kvs, "tekken"))
    assert run("tokenize", "-m", str(good), "Hello World").returncode == 0
    assert b"(unsupported" not in run("info", str(good)).stdout
