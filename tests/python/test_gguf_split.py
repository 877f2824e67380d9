"""Split GGUF models as gguf-py (PyPI gguf, the writer behind convert_hf_to_gguf.py
--split-max-tensors) writes them: hablar opens the model from any shard's path and runs it
exactly as the unsplit file."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import gguf
import pytest

REPO = Path(__file__).resolve().parents[2]
BIN = Path(os.environ.get("HABLAR_BIN", REPO / "build" / "src" / "cli" / "hablar"))
MODEL = Path(os.environ.get("HABLAR_HOME", Path.home() / ".cache" / "hablar")) / "models" / \
    "SmolLM2-135M-Instruct.Q4_1.gguf"
SHARDS = 3


def copy_metadata(reader: gguf.GGUFReader, writer: gguf.GGUFWriter) -> None:
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name == gguf.Keys.General.ARCHITECTURE:
            continue  # the header's own fields; the writer adds the architecture itself
        value_type = field.types[0]
        sub_type = field.types[-1] if value_type == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), value_type, sub_type=sub_type)


@pytest.fixture(scope="module")
def split_model(tmp_path_factory) -> list[Path]:
    assert MODEL.exists(), f"default model missing: run scripts/fetch-model.sh ({MODEL})"
    reader = gguf.GGUFReader(str(MODEL))
    arch = bytes(reader.fields["general.architecture"].parts[-1]).decode()
    per_shard = -(-len(reader.tensors) // SHARDS)
    out = tmp_path_factory.mktemp("split") / "smollm2.gguf"
    writer = gguf.GGUFWriter(str(out), arch, split_max_tensors=per_shard)
    copy_metadata(reader, writer)
    for t in reader.tensors:
        writer.add_tensor_info(t.name, t.data.shape, t.data.dtype, t.data.nbytes, t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for t in reader.tensors:
        writer.write_tensor_data(t.data)
    writer.close()
    shards = sorted(out.parent.glob("smollm2-*-of-*.gguf"))
    assert [p.name for p in shards] == [f"smollm2-{i:05d}-of-{SHARDS:05d}.gguf"
                                        for i in range(1, SHARDS + 1)]
    return shards


def generate(model: Path) -> dict:
    r = subprocess.run([str(BIN), "run", "-m", str(model), "-p", "The capital of France is",
                        "-n", "12", "--temp", "0", "--json", "-t", "1"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_every_shard_opens_the_model_and_generates_as_the_whole_file(split_model):
    want = generate(MODEL)
    assert want["text"]
    for shard in split_model:
        got = generate(shard)
        assert got["text"] == want["text"], shard.name
        assert got["generated_ids"] == want["generated_ids"], shard.name


def test_a_missing_shard_is_a_clear_error(split_model, tmp_path):
    for shard in split_model[:2]:
        os.symlink(shard, tmp_path / shard.name)
    r = subprocess.run([str(BIN), "run", "-m", str(tmp_path / split_model[0].name), "-p", "x",
                        "-n", "1"], capture_output=True, text=True, timeout=120)
    assert r.returncode != 0
    assert f"shard {SHARDS} of {SHARDS}" in r.stderr
    assert split_model[-1].name in r.stderr
