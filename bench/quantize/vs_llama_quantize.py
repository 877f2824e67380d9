#!/usr/bin/env python3
"""`hablar quantize` beside llama.cpp's `llama-quantize`, same input, same thread count, run
alternately: wall time per tool (median of --runs), the ratio, and whether the two outputs
are byte-identical.

    python bench/quantize/vs_llama_quantize.py [--llama-quantize PATH] [--shape smollm2-135m]
        [--types Q4_K_M,Q6_K,Q8_0] [--threads 2] [--runs 3]
"""
from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import subprocess
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def timed(cmd: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hablar", default=os.path.join(ROOT, "build", "src", "cli", "hablar"))
    ap.add_argument("--llama-quantize", default="/work/llamacpp/build/bin/llama-quantize")
    ap.add_argument("--shape", default="smollm2-135m")
    ap.add_argument("--arch", default="llama")
    ap.add_argument("--types", default="Q4_K_M,Q6_K,Q8_0")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "in.gguf")
        subprocess.run([args.hablar, "make-model", "--arch", args.arch, "--shape", args.shape,
                        "--type", "f16", "-o", src], check=True, capture_output=True)
        print(f"input: make-model {args.arch} {args.shape} f16, {os.path.getsize(src) >> 20} MiB, "
              f"{args.threads} threads, median of {args.runs}")
        print(f"{'type':8} {'hablar s':>9} {'llama s':>9} {'llama/hablar':>13}  identical")
        for name in args.types.split(","):
            ours, theirs = os.path.join(tmp, "h.gguf"), os.path.join(tmp, "l.gguf")
            t_ours, t_theirs = [], []
            for _ in range(args.runs):
                t_ours.append(timed([args.hablar, "quantize", "-q", "-t", str(args.threads),
                                     src, ours, name]))
                t_theirs.append(timed([args.llama_quantize, src, theirs, name,
                                       str(args.threads)]))
            a, b = statistics.median(t_ours), statistics.median(t_theirs)
            same = sha256(ours) == sha256(theirs)
            print(f"{name:8} {a:9.2f} {b:9.2f} {b / a:13.2f}  {'yes' if same else 'NO'}")


if __name__ == "__main__":
    main()
