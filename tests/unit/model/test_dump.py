"""HABLAR_DUMP_DIR: `hablar run` writes each layer's intermediates (src/model/dump.h), rows in
evaluation order, and they are the values the forward used: the next layer's attention norm
recomputed from the dumped residual stream, as llama.cpp rounds RMSNorm, gives the same bits."""
import json
import os
import subprocess

import numpy as np
import pytest
from gguf import GGUFReader

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
BIN = os.environ.get("HABLAR_BIN", os.path.join(ROOT, "build", "src", "cli", "hablar"))
MODEL = os.path.expanduser("~/.cache/hablar/models/SmolLM2-135M-Instruct.Q4_1.gguf")


def rmsnorm_like_llama_cpp(x, weight, eps):
    """Each square rounded to float, summed in order in double; mean and scale in float."""
    total = 0.0
    for square in (x * x).astype(np.float64):
        total += float(square)
    mean = np.float32(total / x.size)
    scale = np.float32(1.0) / np.sqrt(mean + np.float32(eps))
    return (x * scale) * weight


@pytest.fixture(scope="module")
def dump(tmp_path_factory):
    if not os.path.exists(MODEL):
        pytest.fail(f"default model missing: {MODEL}")
    out = tmp_path_factory.mktemp("dump")
    env = dict(os.environ, HABLAR_DUMP_DIR=str(out))
    r = subprocess.run([BIN, "run", "-p", "The capital of France is", "-n", "3", "--temp", "0",
                        "--json", "-t", "2"], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    return out, json.loads(r.stdout)


def test_every_layer_dumps_one_row_per_evaluated_token(dump):
    out, result = dump
    # The prompt, then each generated token but the last, which is never evaluated.
    rows = len(result["prompt_ids"]) + len(result["generated_ids"]) - 1
    widths = {"attn_norm": 576, "q_rope": 576, "k_rope": 192, "v": 192, "attn_out": 576,
              "ffn_inp": 576, "ffn_norm": 576, "ffn_swiglu": 1536, "ffn_out": 576, "l_out": 576}
    for layer in range(30):
        for name, width in widths.items():
            path = os.path.join(out, f"{name}-{layer}.f32")
            assert os.path.getsize(path) == rows * width * 4, path
    assert not os.path.exists(os.path.join(out, "attn_norm-30.f32"))


def test_dumped_norm_is_the_rmsnorm_of_the_dumped_residual(dump):
    out, _ = dump
    reader = GGUFReader(MODEL)
    eps = float(reader.get_field("llama.attention.layer_norm_rms_epsilon").contents())
    weights = {t.name: np.array(t.data, dtype=np.float32) for t in reader.tensors
               if t.name in ("blk.5.attn_norm.weight", "blk.5.ffn_norm.weight")}
    residual = np.fromfile(os.path.join(out, "l_out-4.f32"), dtype=np.float32).reshape(-1, 576)
    normed = np.fromfile(os.path.join(out, "attn_norm-5.f32"), dtype=np.float32).reshape(-1, 576)
    for row in range(residual.shape[0]):
        want = rmsnorm_like_llama_cpp(residual[row], weights["blk.5.attn_norm.weight"], eps)
        assert np.array_equal(normed[row], want), f"row {row}"
    ffn_inp = np.fromfile(os.path.join(out, "ffn_inp-5.f32"), dtype=np.float32).reshape(-1, 576)
    ffn_norm = np.fromfile(os.path.join(out, "ffn_norm-5.f32"), dtype=np.float32).reshape(-1, 576)
    for row in range(ffn_inp.shape[0]):
        want = rmsnorm_like_llama_cpp(ffn_inp[row], weights["blk.5.ffn_norm.weight"], eps)
        assert np.array_equal(ffn_norm[row], want), f"row {row}"
