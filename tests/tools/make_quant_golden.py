#!/usr/bin/env python3
"""Writes tests/unit/core/golden/quant_llama_cpp.bin: reference quantizations made by
llama.cpp's ggml (the quantizers llama-quantize runs when no importance matrix is given),
for the formats gguf-py cannot quantize. core_tests compares our quantize_row with it.

Needs llama-cpp-python (it ships libggml-base); CI only reads the committed file.
    python tests/tools/make_quant_golden.py [--lib path/to/libggml-base.so]

File layout (little-endian):
    "HQG1" | u32 row_length | u32 n_rows | float32 inputs[n_rows * row_length]
    then per format: u8 name_length | name (GGUF type name) | u32 n_bytes | bytes
"""

from __future__ import annotations

import argparse
import ctypes
import struct
from pathlib import Path

import numpy as np

ROW = 256
# name -> (values per block, bytes per block, entry point, takes rows)
FORMATS = {
    "q2_K": (256, 84, "quantize_q2_K", True),
    "q3_K": (256, 110, "quantize_q3_K", True),
    "q4_K": (256, 144, "quantize_q4_K", True),
    "q5_K": (256, 176, "quantize_q5_K", True),
    "q6_K": (256, 210, "quantize_q6_K", True),
    "iq4_nl": (32, 18, "quantize_iq4_nl", True),
    "iq4_xs": (256, 136, "quantize_iq4_xs", True),
    "q8_K": (256, 292, "quantize_row_q8_K_ref", False),
    "q8_1": (32, 36, "quantize_row_q8_1_ref", False),
}


def default_lib() -> Path:
    import llama_cpp  # noqa: PLC0415 (only this tool needs it)
    return Path(llama_cpp.__file__).parent / "lib" / "libggml-base.so"


def inputs(rng: np.random.Generator) -> np.ndarray:
    """Rows of many shapes: Gaussian and heavy-tailed at scales 1e-6..1e4, shifted uniform,
    sparse, outliers, constant and zero rows."""
    rows = []
    for scale in (1e-6, 1e-3, 0.02, 1.0, 1e4):
        rows.append(rng.standard_normal((8, ROW)) * scale)
        rows.append(rng.standard_t(3, (2, ROW)) * scale)
        rows.append(rng.uniform(-scale, scale, (2, ROW)) + scale / 3)
    sparse = rng.standard_normal((4, ROW))
    sparse[rng.random(sparse.shape) < 0.9] = 0
    rows.append(sparse)
    outliers = rng.standard_normal((4, ROW)) * 0.01
    outliers[:, ::37] = 5.0
    rows.append(outliers)
    rows += [np.full((1, ROW), 0.7), np.full((1, ROW), -3.25), np.zeros((2, ROW))]
    return np.ascontiguousarray(np.concatenate(rows).astype(np.float32))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lib", type=Path, default=None)
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1] /
                        "unit" / "core" / "golden" / "quant_llama_cpp.bin")
    args = parser.parse_args()
    lib = ctypes.CDLL(str(args.lib or default_lib()))
    x = inputs(np.random.default_rng(2026))
    n_rows = x.shape[0]
    blob = bytearray(b"HQG1" + struct.pack("<II", ROW, n_rows) + x.tobytes())
    for name, (block_elems, block_bytes, entry, takes_rows) in FORMATS.items():
        out = np.zeros(x.size // block_elems * block_bytes, np.uint8)
        fn = getattr(lib, entry)
        if takes_rows:
            fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64,
                           ctypes.c_void_p]
            fn.restype = ctypes.c_size_t
            fn(x.ctypes.data, out.ctypes.data, n_rows, ROW, None)
        else:
            fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
            fn.restype = None
            fn(x.ctypes.data, out.ctypes.data, x.size)
        blob += struct.pack("<B", len(name)) + name.encode() + struct.pack("<I", out.size)
        blob += out.tobytes()
        print(f"{name}: {out.size // block_bytes} blocks")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_bytes(bytes(blob))
    print(f"wrote {args.out} ({len(blob)} bytes, {n_rows} rows of {ROW})")


if __name__ == "__main__":
    main()
