#!/usr/bin/env python3
"""Decode speed with and without a JSON Schema, one sequence, same server, same run.

  $HABLAR_VENV/bin/python bench/grammar/decode_speed.py --url http://127.0.0.1:8080 [--runs 5]

Each run asks /completion for a list of 24 strings under the schema (temperature 1, seeded),
then the same prompt without a schema for as many tokens (ignore_eos), and compares the
server's own predicted_per_second. The first run of each kind warms up and is not counted.
"""
import argparse
import statistics

import requests

SCHEMA = {"type": "array", "items": {"type": "string", "maxLength": 40}, "minItems": 24, "maxItems": 24}


def run(url, body):
    r = requests.post(url + "/completion", json=body, timeout=600).json()
    return r["timings"]["predicted_per_second"], r["tokens_predicted"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
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
