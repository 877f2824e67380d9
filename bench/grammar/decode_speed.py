#!/usr/bin/env python3
"""Decode speed with and without a JSON Schema, one sequence, same server, same run.

  $HABLAR_VENV/bin/python bench/grammar/decode_speed.py --url http://127.0.0.1:8080 [--runs 5]
      [--parallel N]

Each run asks /completion for a list of 24 strings under the schema (temperature 1, seeded),
then the same prompt without a schema for as many tokens (ignore_eos), and compares the
server's own predicted_per_second. The first run of each kind warms up and is not counted.
With --parallel N, each run sends N such requests at once (seeds apart) and compares the
aggregate decode rate: all tokens over the wall time of the batch, with and without.
"""
import argparse
import concurrent.futures as cf
import statistics
import time

import requests

SCHEMA = {"type": "array", "items": {"type": "string", "maxLength": 40}, "minItems": 24, "maxItems": 24}


def run(url, body):
    r = requests.post(url + "/completion", json=body, timeout=600).json()
    return r["timings"]["predicted_per_second"], r["tokens_predicted"]


def run_batch(url, bodies):
    """Sends the bodies at once; returns (tokens per second over the wall time, token counts)."""
    t0 = time.perf_counter()
    with cf.ThreadPoolExecutor(len(bodies)) as pool:
        results = list(pool.map(lambda b: run(url, b), bodies))
    wall = time.perf_counter() - t0
    counts = [n for _, n in results]
    return sum(counts) / wall, counts


def main_parallel(args):
    with_s, without = [], []
    for i in range(args.runs + 1):
        bases = [{"prompt": "A list of fruits in JSON:", "temperature": 1.0, "seed": 1000 * i + j}
                 for j in range(args.parallel)]
        tps, counts = run_batch(args.url, [dict(b, n_predict=400, json_schema=SCHEMA) for b in bases])
        tps0, _ = run_batch(args.url, [dict(b, n_predict=n, ignore_eos=True)
                                       for b, n in zip(bases, counts)])
        if i:
            with_s.append(tps)
            without.append(tps0)
        print(f"run {i}: {args.parallel} x ~{sum(counts) // len(counts)} tokens, "
              f"with schema {tps:.1f} tok/s, without {tps0:.1f} tok/s (aggregate)")
    a, b = statistics.median(with_s), statistics.median(without)
    print(f"median ({args.parallel} at once): with schema {a:.1f} tok/s, without {b:.1f} tok/s, "
          f"ratio {a / b:.3f}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--parallel", type=int, default=1)
    args = ap.parse_args()
    if args.parallel > 1:
        return main_parallel(args)
    with_s, without = [], []
    for i in range(args.runs + 1):
        base = {"prompt": "A list of fruits in JSON:", "temperature": 1.0, "seed": 100 + i}
        tps, n = run(args.url, dict(base, n_predict=400, json_schema=SCHEMA))
        tps0, _ = run(args.url, dict(base, n_predict=n, ignore_eos=True))
        if i:
            with_s.append(tps)
            without.append(tps0)
        print(f"run {i}: {n} tokens, with schema {tps:.1f} tok/s, without {tps0:.1f} tok/s")
    a, b = statistics.median(with_s), statistics.median(without)
    print(f"median: with schema {a:.1f} tok/s, without {b:.1f} tok/s, ratio {a / b:.3f}")


if __name__ == "__main__":
    main()
