#!/usr/bin/env python3
"""Tokenizer speed: hablar vs llama.cpp on the same corpus, same run, every vocabulary.

Run with a Python that has llama-cpp-python:
  /root/.cache/hablar/oracle-venv/bin/python bench/tokenizer/bench_tokenizer.py \
      [--bench build/bench/tokenizer/tokenizer_bench] [--repeat 3]

Both sides encode every document of tests/data/tokenizer-corpus/corpus.txt on one thread,
without BOS/EOS and with special tokens as plain text; each figure is the best of
--repeat passes. llama.cpp is called through llama_tokenize() with a preallocated buffer,
so Python adds only a call per document (about 1 us against milliseconds of work).
"""
import argparse
import ctypes
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import tokenizer_golden as tg  # noqa: E402


def peer_seconds(path, docs, repeat):
    import llama_cpp
    llm = llama_cpp.Llama(model_path=path, vocab_only=True, verbose=False)
    vocab = llama_cpp.llama_model_get_vocab(llm._model.model)
    encoded = [d.encode() for d in docs]
    cap = max(len(e) for e in encoded) + 16
    buf = (llama_cpp.llama_token * cap)()
    best, tokens = float("inf"), 0
    for _ in range(repeat):
        t0 = time.perf_counter()
        n = 0
        for e in encoded:
            n += llama_cpp.llama_tokenize(vocab, e, len(e), buf, cap, False, False)
        best = min(best, time.perf_counter() - t0)
        tokens = n
    return best, tokens


def ours_seconds(bench, path, repeat):
    out = subprocess.run([bench, path, tg.CORPUS, "--repeat", str(repeat)], check=True,
                         capture_output=True, text=True).stdout.split()
    return float(out[3]), int(out[2]), float(out[5])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bench", default=os.path.join(ROOT, "build", "bench", "tokenizer",
                                                    "tokenizer_bench"))
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    docs = tg.load_docs()
    mb = sum(len(d.encode()) for d in docs) / 1e6
    print(f"corpus: {len(docs)} documents, {mb:.2f} MB; best of {args.repeat}; one thread")
    print(f"{'vocabulary':16s} {'hablar MB/s':>12s} {'llama.cpp MB/s':>15s} {'ratio':>7s} "
          f"{'tokens':>9s} {'same count':>10s} {'load s':>7s}")
    worst = float("inf")
    for name, path in tg.vocab_paths():
        ours_s, ours_tokens, load_s = ours_seconds(args.bench, path, args.repeat)
        peer_s, peer_tokens = peer_seconds(path, docs, args.repeat)
        ratio = peer_s / ours_s
        worst = min(worst, ratio)
        print(f"{name:16s} {mb / ours_s:12.2f} {mb / peer_s:15.2f} {ratio:6.2f}x "
              f"{ours_tokens:9d} {str(ours_tokens == peer_tokens):>10s} {load_s:7.3f}",
              flush=True)
    print(f"lowest ratio: {worst:.2f}x (goal >= 1.5x)")


if __name__ == "__main__":
    main()
