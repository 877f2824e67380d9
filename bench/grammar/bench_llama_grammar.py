#!/usr/bin/env python3
"""Per-token mask time: hablar's grammar engine next to llama.cpp's grammar sampler, same run.

  ~/.cache/hablar/oracle-venv/bin/python bench/grammar/bench_llama_grammar.py \
      [--bench build/bench/grammar/grammar_bench] [--out results.json]

Runs in the oracle venv (llama-cpp-python). For each vocabulary and each schema of
tests/server/schema_suite.py, grammar_bench tokenizes one valid document and times hablar's
masks (as bench_grammar.py does); then the same token ids are replayed through llama.cpp's
grammar sampler, built from llama.cpp's own JSON-Schema converter
(llama_cpp.llama_grammar.json_schema_to_gbnf), timing llama_sampler_apply over the whole
vocabulary as a candidate array (the mask), then llama_sampler_accept. Schemas llama.cpp
cannot convert or parse, or whose document it refuses, are left out of both sides and
counted. Each side keeps each step's fastest of --repeat replays. llama.cpp's figures include
one ctypes call (about a microsecond, nothing beside its milliseconds). Note that llama.cpp's
own sampling first tries the sampled token alone and computes the full mask only when that
token is refused; the figures here are the full mask, the step our engine always takes.
"""
import argparse
import ctypes
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np
import llama_cpp as L
from llama_cpp.llama_grammar import json_schema_to_gbnf

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "server"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from schema_suite import SCHEMAS, example  # noqa: E402
from bench_grammar import VOCABS, pct, summary  # noqa: E402  (the same vocabularies and stats)


class LlamaSide:
    def __init__(self, path):
        params = L.llama_model_default_params()
        params.vocab_only = True
        self.model = L.llama_model_load_from_file(path.encode(), params)
        self.vocab = L.llama_model_get_vocab(self.model)
        self.n = L.llama_vocab_n_tokens(self.vocab)
        self.data = (L.llama_token_data * self.n)()
        self.ids = np.arange(self.n, dtype=np.int32)

    def replay(self, gbnf, ids):
        """Per-step mask times in ns, or None when llama.cpp refuses the grammar or a token."""
        s = L.llama_sampler_init_grammar(self.vocab, gbnf.encode(), b"root")
        if not s:
            return None
        times = []
        try:
            for i in range(len(ids) + 1):
                for k in range(self.n):  # fresh candidates, outside the timed call
                    self.data[k].id = k
                    self.data[k].logit = 0.0
                arr = L.llama_token_data_array(data=self.data, size=self.n, selected=-1, sorted=False)
                t0 = time.perf_counter_ns()
                L.llama_sampler_apply(s, ctypes.byref(arr))
                times.append(time.perf_counter_ns() - t0)
                if i == len(ids):
                    break
                if self.data[ids[i]].logit == float("-inf"):
                    return None
                L.llama_sampler_accept(s, ids[i])
        finally:
            L.llama_sampler_free(s)
        return times


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bench", default=os.path.join(ROOT, "build", "bench", "grammar", "grammar_bench"))
    ap.add_argument("--out", default=None)
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()
    L.llama_backend_init()
    report = {}
    for label, vocab_file in VOCABS.items():
        cases, gbnfs = [], []
        for name, schema in SCHEMAS:
            try:
                gbnf = json_schema_to_gbnf(json.dumps(schema))
            except Exception:  # llama.cpp's converter cannot take it
                continue
            cases.append({"name": name, "schema": schema, "doc": json.dumps(example(schema))})
            gbnfs.append(gbnf)
        with tempfile.TemporaryDirectory() as tmp:
            case_file, out_file = os.path.join(tmp, "cases.jsonl"), os.path.join(tmp, "out.jsonl")
            with open(case_file, "w") as f:
                for c in cases:
                    f.write(json.dumps({"schema": c["schema"], "doc": c["doc"]}) + "\n")
            ours = None
            for _ in range(args.repeat):
                subprocess.run([args.bench, vocab_file, case_file, out_file], check=True,
                               stderr=subprocess.DEVNULL)
                rows = [json.loads(l) for l in open(out_file)]
                ours = rows if ours is None else [
                    dict(r, ns=[min(a, b) for a, b in zip(r["ns"], o["ns"])]) for r, o in zip(rows, ours)]
        side = LlamaSide(vocab_file)
        ns_ours, ns_llama, left_out = [], [], []
        for c, gbnf, o in zip(cases, gbnfs, ours):
            best = None
            for _ in range(args.repeat):
                t = side.replay(gbnf, o["ids"])
                if t is None:
                    break
                best = t if best is None else [min(a, b) for a, b in zip(best, t)]
            if best is None or not o["ok"]:
                left_out.append(c["name"])
                continue
            ns_ours += o["ns"]
            ns_llama += best
        report[label] = {"schemas": len(cases) - len(left_out),
                         "left_out": left_out + [n for n, _ in SCHEMAS if n not in {c["name"] for c in cases}],
                         "hablar": summary(ns_ours), "llama.cpp": summary(ns_llama)}
        r = report[label]
        print(f"\n{label}: {r['schemas']} schemas, {len(ns_ours)} masks each side "
              f"({len(r['left_out'])} schemas left out)")
        print(f"  {'':10}{'p50 us':>10}{'p90 us':>10}{'p99 us':>10}{'max us':>10}{'mean us':>10}")
        for who in ("hablar", "llama.cpp"):
            s = r[who]
            print(f"  {who:10}{s['p50_us']:10.1f}{s['p90_us']:10.1f}{s['p99_us']:10.1f}"
                  f"{s['max_us']:10.1f}{s['mean_us']:10.1f}")
        print(f"  ratio llama.cpp / hablar at p50: {r['llama.cpp']['p50_us'] / r['hablar']['p50_us']:.0f}x, "
              f"p99: {r['llama.cpp']['p99_us'] / r['hablar']['p99_us']:.0f}x")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
