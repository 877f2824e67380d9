#!/usr/bin/env python3
"""Dumps llama.cpp's intermediate tensors for one prompt, and compares them with hablar's.

llama.cpp (through llama-cpp-python, CPU) calls an eval callback for every graph node it
computes; this tool keeps the F32 nodes whose names it is asked for (llama.cpp's names:
attn_norm-L, Qcur-L, Kcur-L, Vcur-L, kq_soft_max-L, kqv_out-L, ffn_inp-L, ffn_norm-L,
ffn_out-L, l_out-L, result_norm, result_output, ...) as [n_tokens x width] arrays in an .npz.
hablar writes the matching intermediates when HABLAR_DUMP_DIR is set (src/model/dump.h):
one raw little-endian float32 file <name>-<layer>.f32 per intermediate, [n_tokens x width],
rows appended in evaluation order.

Usage (oracle venv has llama_cpp):
  python tools/llama_dump.py dump --prompt "The capital of France is" --decode 8 --out /tmp/ref.npz
  HABLAR_DUMP_DIR=/tmp/ours build/src/cli/hablar run -p "The capital of France is" -n 9 --temp 0
  python tools/llama_dump.py compare --ref /tmp/ref.npz --ours /tmp/ours
The comparison prints, for each intermediate in graph order, the largest absolute and
relative difference per token position, so the first op that departs beyond rounding shows.
"""
import argparse
import ctypes
import os
import sys

import numpy as np

GGML_MAX_DIMS = 4
GGML_MAX_SRC = 10
GGML_MAX_OP_PARAMS = 64
GGML_MAX_NAME = 64
GGML_TYPE_F32 = 0

# Pairs (hablar name, llama.cpp name); the llama.cpp tensor reshaped to [n_tokens x width].
NAME_MAP = [
    ("attn_norm", "attn_norm"),
    ("q_rope", "Qcur"),
    ("k_rope", "Kcur"),
    ("v", "Vcur"),
    ("attn_out", "kqv_out"),
    ("ffn_inp", "ffn_inp"),
    ("ffn_norm", "ffn_norm"),
    ("ffn_swiglu", "ffn_swiglu"),
    ("ffn_out", "ffn_out"),
    ("l_out", "l_out"),
]


class GgmlTensor(ctypes.Structure):
    """The leading fields of struct ggml_tensor (ggml.h of the vendored llama.cpp)."""
    _fields_ = [
        ("type", ctypes.c_int),
        ("buffer", ctypes.c_void_p),
        ("ne", ctypes.c_int64 * GGML_MAX_DIMS),
        ("nb", ctypes.c_size_t * GGML_MAX_DIMS),
        ("op", ctypes.c_int),
        ("op_params", ctypes.c_int32 * (GGML_MAX_OP_PARAMS // 4)),
        ("flags", ctypes.c_int32),
        ("src", ctypes.c_void_p * GGML_MAX_SRC),
        ("view_src", ctypes.c_void_p),
        ("view_offs", ctypes.c_size_t),
        ("data", ctypes.c_void_p),
        ("name", ctypes.c_char * GGML_MAX_NAME),
    ]


def tensor_array(t):
    """A copy of an F32 tensor as a numpy array with ne[0] fastest (shape ne[3..0])."""
    ne = [t.ne[i] for i in range(GGML_MAX_DIMS)]
    nb = [t.nb[i] for i in range(GGML_MAX_DIMS)]
    span = sum((ne[i] - 1) * nb[i] for i in range(GGML_MAX_DIMS)) + 4
    buf = (ctypes.c_char * span).from_address(t.data)
    flat = np.frombuffer(bytes(buf), dtype=np.float32)
    arr = np.lib.stride_tricks.as_strided(flat, shape=tuple(reversed(ne)),
                                          strides=tuple(reversed(nb)))
    return np.array(arr)


def dump(args):
    import llama_cpp.llama_cpp as lc
    from llama_cpp import Llama

    wanted = set(args.names.split(",")) if args.names else None
    step = {}  # this evaluation's tensors
    steps = []

    def on_eval(tensor_ptr, ask, _user):
        t = GgmlTensor.from_address(tensor_ptr)
        name = t.name.decode("utf-8", "replace")
        base = name.rsplit("-", 1)[0]
        keep = t.type == GGML_TYPE_F32 and (wanted is None or base in wanted)
        if ask:
            return keep
        if keep and t.data:
            # A name may be given to several nodes (e.g. Qcur before and after RoPE): the last
            # one computed in an evaluation wins, which is the value the next op reads.
            step[name] = tensor_array(t)
        return True

    callback = lc.ggml_backend_sched_eval_callback(on_eval)
    default_params = lc.llama_context_default_params

    def params_with_callback():
        p = default_params()
        p.cb_eval = callback
        p.cb_eval_user_data = None
        return p

    lc.llama_context_default_params = params_with_callback
    kv = {}
    if args.cache_type == "q8_0":  # llama.cpp takes a quantized V only with flash attention
        kv = {"flash_attn": True, "type_k": 8, "type_v": 8}  # GGML_TYPE_Q8_0
    llm = Llama(model_path=args.model, n_ctx=1024, n_batch=1024, n_threads=2, logits_all=True,
                verbose=False, seed=0, **{"flash_attn": False, **kv})
    lc.llama_context_default_params = default_params
    ids = llm.tokenize(args.prompt.encode("utf-8"), add_bos=True, special=True)
    print("ids:", ids, file=sys.stderr)
    llm.eval(ids)
    steps.append(dict(step))
    for _ in range(args.decode):  # greedy, one token per evaluation
        tok = int(np.argmax(np.array(llm.scores[llm.n_tokens - 1])))
        ids.append(tok)
        step.clear()
        llm.eval([tok])
        steps.append(dict(step))
    print("ids with generated:", ids, file=sys.stderr)
    # Rows of every evaluation one after the other (as hablar appends them). Only token-major
    # tensors ([n_tokens x width], those compare reads) make sense as rows; tensors whose width
    # changes between evaluations are kept from the prompt only.
    out = {}
    for name in steps[0]:
        if not all(name in st for st in steps):
            print(f"{name}: missing from some evaluations, kept from the prompt only",
                  file=sys.stderr)
            out[name] = steps[0][name]
            continue
        parts = [st[name] for st in steps]
        rows = [p.reshape(n, -1) for p, n in zip(parts, [len(ids) - args.decode] +
                                                  [1] * args.decode)]
        if all(r.shape[1] == rows[0].shape[1] for r in rows):
            out[name] = np.vstack(rows)
        else:
            out[name] = steps[0][name]
    np.savez(args.out, ids=np.array(ids, dtype=np.int32), **out)
    print(f"wrote {len(out)} tensors to {args.out}", file=sys.stderr)


def as_rows(a, n_tokens):
    """[n_tokens x width] from a tensor whose outer dimensions hold the tokens."""
    return a.reshape(n_tokens, -1) if a.size % n_tokens == 0 else None


def compare(args):
    ref = np.load(args.ref)
    n_tokens = len(ref["ids"])
    layer = 0
    while True:
        any_found = False
        for ours_name, ref_name in NAME_MAP:
            key = f"{ref_name}-{layer}"
            path = os.path.join(args.ours, f"{ours_name}-{layer}.f32")
            if key not in ref.files or not os.path.exists(path):
                continue
            any_found = True
            theirs = as_rows(ref[key], n_tokens)
            ours = np.fromfile(path, dtype=np.float32)
            ours = ours[: theirs.size].reshape(theirs.shape)
            diff = np.abs(ours.astype(np.float64) - theirs)
            scale = np.maximum(np.abs(theirs).max(axis=1), 1e-30)
            per_tok = " ".join(f"{d:.2e}" for d in diff.max(axis=1) / scale)
            print(f"L{layer:02d} {ours_name:11s} max|d| {diff.max():.3e}  rel/token: {per_tok}")
        if not any_found:
            break
        layer += 1
        if args.layers and layer >= args.layers:
            break


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("dump")
    d.add_argument("--model", default=os.path.expanduser(
        "~/.cache/hablar/models/SmolLM2-135M-Instruct.Q4_1.gguf"))
    d.add_argument("--prompt", required=True)
    d.add_argument("--names", help="comma-separated llama.cpp node names (without -L); "
                   "default: every F32 node")
    d.add_argument("--decode", type=int, default=0,
                   help="then generate this many tokens greedily, one evaluation each")
    d.add_argument("--out", required=True)
    d.add_argument("--cache-type", choices=["f16", "q8_0"], default="f16",
                   help="KV cache of K and V (q8_0: llama.cpp's flash attention)")
    c = sub.add_parser("compare")
    c.add_argument("--ref", required=True)
    c.add_argument("--ours", required=True)
    c.add_argument("--layers", type=int, default=0, help="compare only the first N layers")
    args = ap.parse_args()
    dump(args) if args.cmd == "dump" else compare(args)


if __name__ == "__main__":
    main()
