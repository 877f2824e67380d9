#!/usr/bin/env python3
"""Long contexts: hablar bench vs llama-bench (-fa 1), side by side in one run.

For each model both tools run the same tests, one after the other, with the same threads:
  - pp P: a prompt of P tokens from an empty cache (for each -p value);
  - tg N @ dD: N decode steps on top of D tokens already in the cache (for each -d value;
    llama-bench's -d, hablar bench's -d).
The table gives tokens/s and the ratio hablar / llama.cpp, and hablar's KV bytes per token.
hablar also runs with a Q8_0 KV cache (--cache-type-k/-v q8_0) for the decode tests, beside
its F16 figure, and llama.cpp likewise (-ctk/-ctv q8_0) when --kv-q8 is given.

Models: a Qwen2.5-0.5B-shape Q4_K_M written once by `hablar make-model` (context 32768) into
~/.cache/hablar/bench-models, and the default SmolLM2 (context 8192: only the tests that fit).

These runs are long on 2 cores (a 16k-token prompt takes minutes per tool): run them once,
with -r 1, on a quiet machine:

  python bench/llama/long_context.py -p 4096,16384 -d 4096,16384,32768 -r 1 -t 2

Usage: python bench/llama/long_context.py [--hablar build/src/cli/hablar]
         [--llama-bench /work/llamacpp/build/bin/llama-bench] [-p 4096,16384]
         [-d 4096,16384,32768] [-n 32] [-r 1] [-t 2] [--models qwen,smollm2] [--kv-q8]
"""
import argparse
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CACHE = os.path.expanduser("~/.cache/hablar")


def ints(text):
    return [int(v) for v in text.split(",") if v.strip()]


def model_paths(hablar, names):
    out = []
    for name in names:
        if name == "qwen":
            path = os.path.join(CACHE, "bench-models", "qwen2.5-0.5b-q4_k_m.gguf")
            if not os.path.exists(path):
                os.makedirs(os.path.dirname(path), exist_ok=True)
                subprocess.run([hablar, "make-model", "--arch", "qwen2", "--shape", "qwen2.5-0.5b",
                                "--type", "q4_k_m", "-o", path], check=True)
            out.append(("qwen2.5-0.5b Q4_K_M (synthetic)", path, 32768))
        elif name == "smollm2":
            out.append(("SmolLM2-135M Q4_1", os.path.join(CACHE, "models",
                                                          "SmolLM2-135M-Instruct.Q4_1.gguf"), 8192))
        else:
            sys.exit(f"unknown model {name} (qwen, smollm2)")
    return out


def run_json(cmd):
    print("+", " ".join(cmd), file=sys.stderr, flush=True)
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if p.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{p.stderr[-2000:]}")
    text = p.stdout
    return json.loads(text[text.index("["):])


def hablar_tests(args, path, p=0, n=0, d=0, kv="f16"):
    cmd = [args.hablar, "bench", "-m", path, "-p", str(p), "-n", str(n), "-d", str(d), "-r",
           str(args.r), "-t", str(args.t), "-o", "json", "--device", "cpu", "--cache-type-k", kv,
           "--cache-type-v", kv]
    rows = run_json(cmd)
    return rows[0]["avg_ts"], rows[0].get("kv_bytes_per_token", 0)


def llama_tests(args, path, p=0, n=0, d=0, kv="f16"):
    cmd = [args.llama_bench, "-m", path, "-p", str(p), "-n", str(n), "-d", str(d), "-r",
           str(args.r), "-t", str(args.t), "-fa", "1", "-o", "json", "-ctk", kv, "-ctv", kv]
    rows = run_json(cmd)
    return rows[0]["avg_ts"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hablar", default=os.path.join(ROOT, "build", "src", "cli", "hablar"))
    ap.add_argument("--llama-bench", default="/work/llamacpp/build/bin/llama-bench")
    ap.add_argument("-p", default="4096,16384", help="prompt lengths")
    ap.add_argument("-d", default="4096,16384,32768", help="decode depths")
    ap.add_argument("-n", type=int, default=32, help="decode steps per test")
    ap.add_argument("-r", type=int, default=1)
    ap.add_argument("-t", type=int, default=2)
    ap.add_argument("--models", default="qwen,smollm2")
    ap.add_argument("--kv-q8", action="store_true", help="also llama.cpp with a q8_0 KV cache")
    args = ap.parse_args()
    rows = []
    for label, path, ctx in model_paths(args.hablar, args.models.split(",")):
        for p in ints(args.p):
            if p > ctx:
                continue
            h, kvb = hablar_tests(args, path, p=p)
            l = llama_tests(args, path, p=p)
            rows.append((label, f"pp{p}", "f16", h, l, kvb))
        for d in ints(args.d):
            if d > ctx:
                continue
            for kv in ("f16", "q8_0"):
                h, kvb = hablar_tests(args, path, n=args.n, d=d, kv=kv)
                l = llama_tests(args, path, n=args.n, d=d, kv=kv) if (
                    kv == "f16" or args.kv_q8) else None
                rows.append((label, f"tg{args.n} @ d{d}", kv, h, l, kvb))
    print(f"\n{args.t} threads, -r {args.r}; llama-bench -fa 1\n")
    print("| model | test | KV | hablar t/s | llama.cpp t/s | ratio | hablar KV bytes/token |")
    print("| --- | --- | --- | ---: | ---: | ---: | ---: |")
    for label, test, kv, h, l, kvb in rows:
        ratio = f"{h / l:.2f}x" if l else "-"
        lt = f"{l:.2f}" if l else "-"
        print(f"| {label} | {test} | {kv} | {h:.2f} | {lt} | {ratio} | {kvb:.0f} |")


if __name__ == "__main__":
    main()
