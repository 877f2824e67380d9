"""Our reference (de)quantizers against gguf-py's (gguf.quants, PyPI gguf 0.19.0).

Dequantization: random blocks (random bytes, with the half-precision scale fields set to
finite random halves) must dequantize bit for bit as gguf.quants.dequantize does them.
Quantization: for the types gguf-py can quantize, our blocks must equal its blocks byte for
byte on random data of many shapes and scales.

The C++ side is tests/tools/hablar_quant_tool, found at $HABLAR_QUANT_TOOL, else beside
$HABLAR_BIN's build tree, else <repo>/build/tests/tools/hablar_quant_tool.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf import quants
from gguf.constants import GGML_QUANT_SIZES

REPO = Path(__file__).resolve().parents[2]
N_BLOCKS = 4096  # per type; the brief's floor is 1,000
SEED = 20260

# Byte offsets of the half-precision scale fields in each block (see core/quant_blocks.h).
HALF_FIELDS: dict[T, tuple[int, ...]] = {
    T.Q4_0: (0,),
    T.Q4_1: (0, 2),
    T.Q5_0: (0,),
    T.Q5_1: (0, 2),
    T.Q8_0: (0,),
    T.Q2_K: (80, 82),
    T.Q3_K: (108,),
    T.Q4_K: (0, 2),
    T.Q5_K: (0, 2),
    T.Q6_K: (208,),
    T.IQ4_NL: (0,),
    T.IQ4_XS: (0,),
}
# Plain float formats: every bit pattern is a value (NaN and infinities included).
FLOAT_TYPES = (T.F32, T.F16, T.BF16)
DEQUANT_TYPES = FLOAT_TYPES + tuple(HALF_FIELDS)
QUANT_TYPES = (T.F32, T.F16, T.BF16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0)


def tool_path() -> Path:
    if env := os.environ.get("HABLAR_QUANT_TOOL"):
        return Path(env)
    if env := os.environ.get("HABLAR_BIN"):
        candidate = Path(env).resolve().parents[2] / "tests" / "tools" / "hablar_quant_tool"
        if candidate.exists():
            return candidate
    return REPO / "build" / "tests" / "tools" / "hablar_quant_tool"


def run_tool(verb: str, qtype: T, data: bytes) -> bytes:
    tool = tool_path()
    assert tool.exists(), f"{tool} is missing: build the hablar_quant_tool target"
    with tempfile.TemporaryDirectory(prefix="hablar-quant-") as tmp:
        src, dst = Path(tmp) / "in.bin", Path(tmp) / "out.bin"
        src.write_bytes(data)
        name = "f32" if qtype == T.F32 else qtype.name.lower()
        proc = subprocess.run([str(tool), verb, name, str(src), str(dst)],
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        return dst.read_bytes()


def finite_random_halves(rng: np.random.Generator, count: int) -> np.ndarray:
    """Random half bit patterns, all finite (exponent 31 replaced by 30); subnormals kept."""
    bits = rng.integers(0, 1 << 16, size=count, dtype=np.uint32).astype(np.uint16)
    exponent_all_ones = (bits & 0x7C00) == 0x7C00
    bits[exponent_all_ones] &= np.uint16(0xFBFF)
    return bits


def random_blocks(qtype: T, rng: np.random.Generator) -> np.ndarray:
    block_elems, block_bytes = GGML_QUANT_SIZES[qtype]
    n_bytes = N_BLOCKS * block_bytes
    blocks = rng.integers(0, 256, size=n_bytes, dtype=np.uint16).astype(np.uint8)
    blocks = blocks.reshape(N_BLOCKS, block_bytes)
    for offset in HALF_FIELDS.get(qtype, ()):
        halves = finite_random_halves(rng, N_BLOCKS)
        blocks[:, offset:offset + 2] = halves.view(np.uint8).reshape(N_BLOCKS, 2)
    return blocks


def assert_same_floats(ours: np.ndarray, theirs: np.ndarray, what: str) -> None:
    """Bit-exact float32 equality; NaNs must be NaN in both (payloads may differ)."""
    assert ours.shape == theirs.shape, what
    nan_ours, nan_theirs = np.isnan(ours), np.isnan(theirs)
    assert np.array_equal(nan_ours, nan_theirs), f"{what}: NaN positions differ"
    a = ours[~nan_ours].view(np.uint32)
    b = theirs[~nan_theirs].view(np.uint32)
    mismatch = np.flatnonzero(a != b)
    assert mismatch.size == 0, (
        f"{what}: {mismatch.size} values differ, first at {mismatch[0]}: "
        f"{a[mismatch[0]]:#010x} vs {b[mismatch[0]]:#010x}")


@pytest.mark.parametrize("qtype", DEQUANT_TYPES, ids=lambda t: t.name)
def test_dequantize_matches_gguf_bit_for_bit(qtype: T) -> None:
    rng = np.random.default_rng(SEED + int(qtype))
    blocks = random_blocks(qtype, rng)
    theirs = quants.dequantize(blocks.reshape(-1), qtype).astype(np.float32).reshape(-1)
    ours = np.frombuffer(run_tool("dequantize", qtype, blocks.tobytes()), dtype=np.float32)
    assert ours.size == N_BLOCKS * GGML_QUANT_SIZES[qtype][0]
    assert_same_floats(ours, theirs, qtype.name)
    print(f"dequantize {qtype.name}: {N_BLOCKS} blocks, {ours.size} values bit-exact")


def quantization_inputs(rng: np.random.Generator) -> np.ndarray:
    """Rows of 256 values: Gaussian at scales from 1e-6 to 1e4, uniform, sparse, constant
    and all-zero blocks, and rows whose extreme value repeats with both signs."""
    rows = []
    for scale in (1e-6, 1e-3, 0.02, 1.0, 30.0, 1e4):
        rows.append(rng.standard_normal((64, 256)) * scale)
        rows.append(rng.uniform(-scale, scale, (16, 256)) + scale / 3)
    sparse = rng.standard_normal((32, 256))
    sparse[rng.random(sparse.shape) < 0.9] = 0
    rows.append(sparse)
    rows.append(np.full((4, 256), 0.7))
    rows.append(np.full((4, 256), -3.25))
    rows.append(np.zeros((4, 256)))
    ties = rng.standard_normal((8, 256))
    ties[:, ::32] = 2.0
    ties[:, 1::32] = -2.0
    rows.append(ties)
    return np.concatenate(rows).astype(np.float32)


@pytest.mark.parametrize("qtype", QUANT_TYPES, ids=lambda t: t.name)
def test_quantize_matches_gguf_bit_for_bit(qtype: T) -> None:
    rng = np.random.default_rng(SEED + 100 + int(qtype))
    values = quantization_inputs(rng)
    theirs = np.ascontiguousarray(quants.quantize(values, qtype)).view(np.uint8).reshape(-1)
    ours = np.frombuffer(run_tool("quantize", qtype, values.tobytes()), dtype=np.uint8)
    assert ours.size == theirs.size
    block_elems, block_bytes = GGML_QUANT_SIZES[qtype]
    differing = np.flatnonzero((ours != theirs).reshape(-1, block_bytes).any(axis=1))
    assert differing.size == 0, (
        f"{qtype.name}: {differing.size} of {ours.size // block_bytes} blocks differ, first "
        f"block {differing[0]}")
    print(f"quantize {qtype.name}: {values.size // block_elems} blocks byte-exact")
