#!/usr/bin/env python3
"""Regenerates tests/golden/quantize/llama_quantize.json: what llama.cpp's quantizer
(llama_model_quantize, no importance matrix: what `llama-quantize IN OUT TYPE` does) writes
for small `hablar make-model` models. tests/python/test_quantize_golden.py runs
`hablar quantize` on the same models (make-model is seeded: the test checks the input's
SHA-256 too) and compares.

Per case the file records the output's SHA-256 and, per tensor in file order, its type and
the first 16 hex digits of the SHA-256 of its bytes.

The models: rows of 320 (tiny-odd: every K-quant falls back), 8 layers (the mixes' first
and last eighth), grouped-query heads, tied and untied outputs, fused attn_qkv (phi3),
experts (mixtral: the 8-expert rules), an encoder (bert); F32, F16 and BF16 inputs.

Usage (the oracle venv has llama_cpp; CI only reads the committed JSON):
  ~/.cache/hablar/oracle-venv/bin/python tools/quantize_oracle.py --hablar build/src/cli/hablar
"""
from __future__ import annotations

import argparse
import ctypes
import hashlib
import json
import os
import struct
import subprocess
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GOLDEN = os.path.join(ROOT, "tests", "golden", "quantize", "llama_quantize.json")

# llama_ftype numbers (llama.h) of llama-quantize's names.
FTYPES = {
    "F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q8_0": 7, "Q5_0": 8, "Q5_1": 9, "Q2_K": 10,
    "Q3_K_S": 11, "Q3_K_M": 12, "Q3_K_L": 13, "Q4_K_S": 14, "Q4_K_M": 15, "Q5_K_S": 16,
    "Q5_K_M": 17, "Q6_K": 18, "IQ4_NL": 25, "IQ4_XS": 30, "BF16": 32,
}
ALL = list(FTYPES)
# (arch, shape, input type, file types)
MODELS = [
    ("llama", "tiny-odd", "f16", ALL),
    ("qwen3", "tiny-odd", "bf16", ["Q2_K", "Q3_K_M", "Q4_0", "Q4_K_M", "IQ4_XS", "F16"]),
    ("gemma3", "tiny-odd", "f16", ["Q4_K_M", "Q5_K_S", "Q6_K", "Q8_0"]),
    ("qwen2", "tiny", "f32", ["Q3_K_L", "Q4_1", "Q4_K_M", "Q5_K_M", "IQ4_NL", "BF16"]),
    ("mixtral", "tiny", "f16", ["Q2_K", "Q3_K_S", "Q4_K_M", "IQ4_XS"]),
    ("phi3", "tiny", "f16", ["Q3_K_M", "Q4_K_M", "Q5_K_M"]),
    ("bert", "bert-tiny", "f16", ["Q4_K_M", "Q8_0"]),
]
SEED = 7

# ggml type id -> (name, values per block, bytes per block)
GGML_TYPES = {
    0: ("f32", 1, 4), 1: ("f16", 1, 2), 2: ("q4_0", 32, 18), 3: ("q4_1", 32, 20),
    6: ("q5_0", 32, 22), 7: ("q5_1", 32, 24), 8: ("q8_0", 32, 34), 10: ("q2_K", 256, 84),
    11: ("q3_K", 256, 110), 12: ("q4_K", 256, 144), 13: ("q5_K", 256, 176),
    14: ("q6_K", 256, 210), 20: ("iq4_nl", 32, 18), 23: ("iq4_xs", 256, 136),
    30: ("bf16", 1, 2),
}


def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _skip_value(buf: bytes, pos: int, vtype: int) -> int:
    sizes = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
    if vtype in sizes:
        return pos + sizes[vtype]
    if vtype == 8:  # string
        (n,) = struct.unpack_from("<Q", buf, pos)
        return pos + 8 + n
    if vtype == 9:  # array
        etype, count = struct.unpack_from("<IQ", buf, pos)
        pos += 12
        if etype in sizes:
            return pos + sizes[etype] * count
        for _ in range(count):
            pos = _skip_value(buf, pos, etype)
        return pos
    raise ValueError(f"unknown GGUF value type {vtype}")


def tensor_digests(path: str) -> list[str]:
    """["name type sha256-of-the-bytes (16 hex digits)", ...] in file order."""
    with open(path, "rb") as f:
        buf = f.read()
    magic, version, n_tensors, n_kv = struct.unpack_from("<IIQQ", buf, 0)
    assert magic == 0x46554747 and version == 3, path
    pos, alignment = 24, 32
    for _ in range(n_kv):
        (klen,) = struct.unpack_from("<Q", buf, pos)
        key = buf[pos + 8:pos + 8 + klen].decode()
        pos += 8 + klen
        (vtype,) = struct.unpack_from("<I", buf, pos)
        if key == "general.alignment":
            (alignment,) = struct.unpack_from("<I", buf, pos + 4)
        pos = _skip_value(buf, pos + 4, vtype)
    infos = []
    for _ in range(n_tensors):
        (nlen,) = struct.unpack_from("<Q", buf, pos)
        name = buf[pos + 8:pos + 8 + nlen].decode()
        pos += 8 + nlen
        (n_dims,) = struct.unpack_from("<I", buf, pos)
        dims = struct.unpack_from(f"<{n_dims}Q", buf, pos + 4)
        pos += 4 + 8 * n_dims
        ttype, offset = struct.unpack_from("<IQ", buf, pos)
        pos += 12
        infos.append((name, dims, ttype, offset))
    data_start = (pos + alignment - 1) // alignment * alignment
    out = []
    for name, dims, ttype, offset in infos:
        tname, block, block_bytes = GGML_TYPES[ttype]
        rows = 1
        for d in dims[1:]:
            rows *= d
        nbytes = dims[0] // block * block_bytes * rows
        start = data_start + offset
        digest = hashlib.sha256(buf[start:start + nbytes]).hexdigest()[:16]
        out.append(f"{name} {tname} {digest}")
    return out


def model_file_name(arch: str, shape: str, dtype: str) -> str:
    return f"{arch}-{shape}-{dtype}.gguf"


def make_model(hablar: str, arch: str, shape: str, dtype: str, out: str) -> None:
    subprocess.run([hablar, "make-model", "--arch", arch, "--shape", shape, "--type", dtype,
                    "--seed", str(SEED), "-o", out], check=True, capture_output=True)


_LOG_SINK = None


def llama_quantize(src: str, dst: str, ftype: int) -> None:
    import llama_cpp  # noqa: PLC0415 (only the generator needs it)
    global _LOG_SINK
    if _LOG_SINK is None:  # llama.cpp logs every tensor; keep the tool's output readable
        _LOG_SINK = llama_cpp.llama_log_callback(lambda level, text, user_data: None)
        llama_cpp.llama_log_set(_LOG_SINK, ctypes.c_void_p(0))
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = ftype
    params.nthread = 2
    rc = llama_cpp.llama_model_quantize(src.encode(), dst.encode(), ctypes.byref(params))
    if rc != 0:
        raise RuntimeError(f"llama_model_quantize({src}, {ftype}) returned {rc}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hablar", default=os.path.join(ROOT, "build", "src", "cli", "hablar"))
    args = ap.parse_args()
    golden = {"seed": SEED, "models": []}
    with tempfile.TemporaryDirectory() as tmp:
        for arch, shape, dtype, ftypes in MODELS:
            src = os.path.join(tmp, model_file_name(arch, shape, dtype))
            make_model(args.hablar, arch, shape, dtype, src)
            entry = {"arch": arch, "shape": shape, "type": dtype,
                     "input_sha256": sha256_file(src), "cases": {}}
            for name in ftypes:
                dst = os.path.join(tmp, "out.gguf")
                llama_quantize(src, dst, FTYPES[name])
                entry["cases"][name] = {"file_sha256": sha256_file(dst),
                                        "tensors": tensor_digests(dst)}
                os.remove(dst)
            golden["models"].append(entry)
            print(f"{arch} {shape} {dtype}: {len(ftypes)} file types")
    os.makedirs(os.path.dirname(GOLDEN), exist_ok=True)
    with open(GOLDEN, "w") as f:
        json.dump(golden, f, indent=1)
        f.write("\n")
    print(f"wrote {GOLDEN} ({os.path.getsize(GOLDEN)} bytes)")


if __name__ == "__main__":
    main()
