#!/usr/bin/env python3
"""hablar bench vs llama.cpp's llama-bench, side by side in one run on this machine.

Models: the default SmolLM2-135M-Instruct Q4_1, and Qwen2.5-0.5B-shape synthetic models in
Q4_K_M and Q8_0 (written once by `hablar make-model` into ~/.cache/hablar/bench-models).
For each model both tools run the same tests (pp = prompt of P tokens, tg = N decode steps,
-r repetitions, same thread count), one after the other. The table gives tokens/s mean ± sd
and the ratio hablar / llama.cpp. Below it: decode bytes per token (weights read once per
token + KV cache) against the measured memory bandwidth (a STREAM-like copy), and hablar's
peak RSS against model file + KV cache + 64 MiB.

llama-bench: ~/.cache/hablar/llama-bench/llama-bench (build it with
bench/llama/build_llama_bench.sh, from the llama-cpp-python 0.3.36 sdist's vendored
llama.cpp). Without it, llama.cpp is timed through llama-cpp-python's eval (same method:
pp = one eval of P tokens from an empty cache, tg = N evals of one token).

On a machine that others are using, --rounds N runs both tools N times, alternating which
goes first, and keeps each tool's best round per test (the run least disturbed by the others).

Usage: python bench/llama/compare.py [--hablar build/src/cli/hablar] [-p 128] [-n 64] [-r 5] [-t 2]
                                     [--rounds 1]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CACHE = os.path.expanduser("~/.cache/hablar")
ORACLE_PY = os.path.join(CACHE, "oracle-venv", "bin", "python")


def peak_rss_of(cmd):
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    out = proc.stdout.read().decode()
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{proc.stderr.read().decode()}")
    return out, usage.ru_maxrss * 1024


def ensure_models(hablar):
    out_dir = os.path.join(CACHE, "bench-models")
    os.makedirs(out_dir, exist_ok=True)
    models = [os.path.join(CACHE, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")]
    for typ in ["q4_k_m", "q8_0"]:
        path = os.path.join(out_dir, f"qwen2.5-0.5b-{typ}.gguf")
        if not os.path.exists(path):
            subprocess.run([hablar, "make-model", "--arch", "qwen2", "--shape", "qwen2.5-0.5b",
                            "--type", typ, "--seed", "1", "-o", path], check=True)
        models.append(path)
    return models


def hablar_bench(hablar, model, args):
    cmd = [hablar, "bench", "-m", model, "-p", str(args.p), "-n", str(args.n), "-r", str(args.r),
           "-t", str(args.t), "-o", "json"]
    out, _ = peak_rss_of(cmd)
    rows = json.loads(out)
    # hablar reports its own VmHWM: a child's ru_maxrss includes this Python process's peak,
    # which the child inherits across fork + exec.
    rss = max(r["peak_rss_bytes"] for r in rows)
    return {r["test"]: (r["avg_ts"], r["stddev_ts"]) for r in rows}, rows[0], rss


def llama_bench(binary, model, args):
    cmd = [binary, "-m", model, "-p", str(args.p), "-n", str(args.n), "-r", str(args.r),
           "-t", str(args.t), "-o", "json"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    res = {}
    for r in json.loads(out):
        name = f"pp{r['n_prompt']}" if r["n_prompt"] > 0 else f"tg{r['n_gen']}"
        res[name] = (r["avg_ts"], r["stddev_ts"])
    return res


LLAMA_CPP_PYTHON_TIMER = r"""
import json, random, statistics, sys, time
from llama_cpp import Llama
model, p, n, r, t = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
llm = Llama(model_path=model, n_ctx=max(p, n) + 8, n_batch=512, n_threads=t, n_threads_batch=t, verbose=False)
rng = random.Random(1234)
toks = [rng.randrange(llm.n_vocab()) for _ in range(max(p, n))]
def pp():
    llm.reset(); t0 = time.perf_counter(); llm.eval(toks[:p]); return p / (time.perf_counter() - t0)
def tg():
    llm.reset(); t0 = time.perf_counter()
    for tok in toks[:n]: llm.eval([tok])
    return n / (time.perf_counter() - t0)
out = {}
for name, fn in ((f"pp{p}", pp), (f"tg{n}", tg)):
    fn(); s = [fn() for _ in range(r)]
    out[name] = (statistics.mean(s), statistics.stdev(s) if len(s) > 1 else 0.0)
print(json.dumps(out))
"""


def llama_cpp_python(model, args):
    out = subprocess.run([ORACLE_PY, "-c", LLAMA_CPP_PYTHON_TIMER, model, str(args.p), str(args.n),
                          str(args.r), str(args.t)], capture_output=True, text=True, check=True)
    return {k: tuple(v) for k, v in json.loads(out.stdout).items()}


def keep_best(best, results):
    """Keeps, per test, the (mean, sd) with the highest mean."""
    for test, value in results.items():
        if test not in best or value[0] > best[test][0]:
            best[test] = value


def memory_bandwidth_gbs():
    import numpy as np
    a = np.ones(64 * 1024 * 1024, dtype=np.float32)  # 256 MiB
    b = np.empty_like(a)
    best = 0.0
    for _ in range(5):
        t0 = time.perf_counter()
        np.copyto(b, a)
        dt = time.perf_counter() - t0
        best = max(best, 2 * a.nbytes / dt / 1e9)  # read + write
    return best


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hablar", default=os.path.join(ROOT, "build", "src", "cli", "hablar"))
    ap.add_argument("--llama-bench", default=os.path.join(CACHE, "llama-bench", "llama-bench"))
    ap.add_argument("-p", type=int, default=128)
    ap.add_argument("-n", type=int, default=64)
    ap.add_argument("-r", type=int, default=5)
    ap.add_argument("-t", type=int, default=2)
    ap.add_argument("--models", nargs="*", help="GGUF files (default: the three benchmark models)")
    ap.add_argument("--rounds", type=int, default=1,
                    help="run both tools this many times, alternating, and keep each one's best")
    args = ap.parse_args()
    models = args.models or ensure_models(args.hablar)
    use_llama_bench = os.path.exists(args.llama_bench)
    peer = "llama-bench" if use_llama_bench else "llama-cpp-python eval"
    bw = memory_bandwidth_gbs()

    rows, notes = [], []
    for model in models:
        def run_peer():
            return llama_bench(args.llama_bench, model, args) if use_llama_bench \
                else llama_cpp_python(model, args)
        ours, theirs, rss, read_gbs = {}, {}, 0, 0.0
        for k in range(max(1, args.rounds)):
            if k % 2 == 0:
                mine, meta, round_rss = hablar_bench(args.hablar, model, args)
                peer_res = run_peer()
            else:
                peer_res = run_peer()
                mine, meta, round_rss = hablar_bench(args.hablar, model, args)
            rss = max(rss, round_rss)
            read_gbs = max(read_gbs, meta.get("weight_read_gbs", 0.0))
            keep_best(ours, mine)
            keep_best(theirs, peer_res)
        name = os.path.basename(model)
        for test in (f"pp{args.p}", f"tg{args.n}"):
            (a, sa), (b, sb) = ours[test], theirs[test]
            rows.append(f"| {name} | {test} | {a:.2f} ± {sa:.2f} | {b:.2f} ± {sb:.2f} | {a / b:.2f}x |")
        kv = meta.get("kv_cache_bytes", 0)
        per_token = meta["weight_bytes_per_token"] + kv / 2  # on average half the cache is read
        tg = ours[f"tg{args.n}"][0]
        tg_peer = theirs[f"tg{args.n}"][0]
        file_size = os.path.getsize(model)
        budget = file_size + kv + 64 * 2**20
        notes.append(f"- {name}: decode reads {per_token / 1e6:.1f} MB/token -> {per_token * tg / 1e9:.2f} GB/s "
                     f"at {tg:.1f} t/s ({100 * per_token * tg / 1e9 / bw:.0f}% of {bw:.1f} GB/s measured); "
                     f"peak RSS {rss / 2**20:.0f} MiB vs file {file_size / 2**20:.0f} MiB + KV "
                     f"{kv / 2**20:.0f} MiB + 64 MiB = {budget / 2**20:.0f} MiB "
                     f"({'ok' if rss <= budget else 'OVER'})")
        if read_gbs > 0:
            # A reference for this run: both tools read the same weights at every step; how fast
            # these threads read them with no arithmetic (a plain read, best pass) bounds decode
            # up to the prefetch differences between access patterns.
            mine_gbs, peer_gbs = meta["weight_bytes_per_token"] * tg / 1e9, \
                meta["weight_bytes_per_token"] * tg_peer / 1e9
            notes.append(f"  weight reads at tg: hablar {mine_gbs:.1f} GB/s, llama.cpp {peer_gbs:.1f} GB/s, "
                         f"plain read of the same bytes {read_gbs:.1f} GB/s: "
                         f"hablar at {100 * mine_gbs / read_gbs:.0f}%, llama.cpp at "
                         f"{100 * peer_gbs / read_gbs:.0f}%; ratio if hablar decoded at the plain-read speed "
                         f"{read_gbs / peer_gbs:.2f}x")
    rounds = f", best of {args.rounds} alternating rounds" if args.rounds > 1 else ""
    print(f"threads {args.t}, {args.r} repetitions{rounds}; peer: {peer}\n")
    print("| model | test | hablar t/s | llama.cpp t/s | ratio |")
    print("| --- | --- | ---: | ---: | ---: |")
    print("\n".join(rows))
    print()
    print("\n".join(notes))


if __name__ == "__main__":
    main()
