#!/usr/bin/env python3
"""Per-token mask time: hablar's grammar engine next to XGrammar, same run, same tokens.

  HABLAR_VENV=/work/main/.venv $HABLAR_VENV/bin/python bench/grammar/bench_grammar.py \
      [--bench build/bench/grammar/grammar_bench] [--out results.json]

For each vocabulary (SmolLM2's from the default model, Qwen2's from the shared test data)
and each schema of tests/server/schema_suite.py, one valid document (schema_suite.example)
is tokenized by hablar's tokenizer; grammar_bench replays its tokens through hablar's
matcher timing each full-vocabulary mask (including the last one, where only EOS may
follow), and this script replays the same token ids through XGrammar's GrammarMatcher
(fill_next_token_bitmask on a preallocated bitmask, then accept_token), with XGrammar's
TokenizerInfo built from the very same token bytes. Each matcher starts fresh per document,
as a request does (hablar's figures also for a later request of the same schema, whose states
the first request's walk left to the grammar, and the time a token budget takes over each
request's last 32 steps). Each side replays every document --repeat times (fresh matchers; hablar's
grammar_bench is a new process each time, so its vocabulary-wide class tables are rebuilt)
and keeps each step's fastest time, which filters out the shared machine's preemptions. Schemas XGrammar cannot compile, or whose document it refuses, are left
out of both sides and counted. XGrammar's figures include one Python call (measured and printed).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

CALL_NS = 0
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "server"))
from schema_suite import SCHEMAS, example  # noqa: E402

HOME = os.environ.get("HABLAR_HOME", os.path.expanduser("~/.cache/hablar"))
VOCABS = {
    "smollm2 (49,152)": os.path.join(HOME, "models", "SmolLM2-135M-Instruct.Q4_1.gguf"),
    "qwen2 (151,936)": os.path.join(ROOT, "..", "shared", "testdata", "vocab", "ggml-vocab-qwen2.gguf"),
}


def pct(values, q):
    v = sorted(values)
    return v[min(len(v) - 1, int(q / 100 * len(v)))]


def summary(ns):
    us = [x / 1e3 for x in ns]
    return {"n": len(us), "p50_us": pct(us, 50), "p90_us": pct(us, 90), "p99_us": pct(us, 99),
            "max_us": max(us), "mean_us": sum(us) / len(us)}


def xgrammar_side(vocab_file, cases, results, repeat):
    import numpy as np
    import xgrammar as xgr
    encoded, stops = [], []
    for i, line in enumerate(open(vocab_file).read().splitlines()):
        if line == "eog":
            stops.append(i)
            encoded.append(b"")
        elif line == "-":
            encoded.append(b"")
        else:
            encoded.append(bytes.fromhex(line))
    info = xgr.TokenizerInfo(encoded, xgr.VocabType.RAW, vocab_size=len(encoded), stop_token_ids=stops)
    compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
    global CALL_NS
    CALL_NS = python_call_ns(lambda: xgr.GrammarMatcher(compiler.compile_builtin_json_grammar()))
    words = (len(encoded) + 31) // 32
    bitmask = np.zeros((1, words), dtype=np.int32)
    out = []
    for case, ours in zip(cases, results):
        t0 = time.perf_counter_ns()
        try:
            compiled = compiler.compile_json_schema(json.dumps(case["schema"]), any_whitespace=True)
        except Exception as e:  # noqa: BLE001 - counted as unsupported
            out.append({"error": f"compile: {e}"[:120]})
            continue
        compile_ns = time.perf_counter_ns() - t0
        ns = None
        ok = True
        for _ in range(repeat):  # a fresh matcher each time; the fastest of each step is kept
            m = xgr.GrammarMatcher(compiled)
            one = []
            for i in range(len(ours["ids"]) + 1):
                t0 = time.perf_counter_ns()
                m.fill_next_token_bitmask(bitmask)
                one.append(time.perf_counter_ns() - t0)
                if i == len(ours["ids"]):
                    break
                if not m.accept_token(ours["ids"][i]):
                    ok = False
                    break
            ns = one if ns is None else [min(a, b) for a, b in zip(ns, one)]
        out.append({"ns": ns, "compile_ns": compile_ns} if ok else {"error": "refused a token"})
    return out


def python_call_ns(m_factory):
    """Median time of a trivial XGrammar call from Python (the overhead inside its figures)."""
    m = m_factory()
    times = []
    for _ in range(2000):
        t0 = time.perf_counter_ns()
        m.is_terminated()
        times.append(time.perf_counter_ns() - t0)
    return sorted(times)[len(times) // 2]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bench", default=os.path.join(ROOT, "build", "bench", "grammar", "grammar_bench"))
    ap.add_argument("--out", default=None)
    ap.add_argument("--repeat", type=int, default=3,
                    help="replays per document on each side; each step's fastest is kept")
    args = ap.parse_args()
    cases = [{"name": n, "schema": s, "doc": json.dumps(example(s))} for n, s in SCHEMAS]
    report = {}
    with tempfile.TemporaryDirectory() as tmp:
        case_file = os.path.join(tmp, "cases.jsonl")
        with open(case_file, "w") as f:
            for c in cases:
                f.write(json.dumps({"schema": c["schema"], "doc": c["doc"]}) + "\n")
        for label, path in VOCABS.items():
            out_file, vocab_file = os.path.join(tmp, "out.jsonl"), os.path.join(tmp, "vocab.txt")
            ours = None
            for _ in range(args.repeat):  # each replay with fresh matchers and grammars
                subprocess.run([args.bench, path, case_file, out_file, "--dump-vocab", vocab_file],
                               check=True)
                run = [json.loads(l) for l in open(out_file)]
                if ours is not None:
                    for o, r in zip(ours, run):
                        for k in ("ns", "ns_later", "budget_ns", "budget_ns_later"):
                            o[k] = [min(a, b) for a, b in zip(o[k], r[k])]
                        o["compile_ns"] = min(o["compile_ns"], r["compile_ns"])
                else:
                    ours = run
            theirs = xgrammar_side(vocab_file, cases, ours, args.repeat)
            h_ns, x_ns, h_first, x_first, h_comp, x_comp, skipped = [], [], [], [], [], [], []
            h_later, budget_first, budget_later = [], [], []
            for c, o, t in zip(cases, ours, theirs):
                if not o["ok"] or "error" in t:
                    skipped.append((c["name"], "hablar refused" if not o["ok"] else t["error"]))
                    continue
                h_ns += o["ns"]
                h_later += o["ns_later"]
                budget_first.append(sum(o["budget_ns"]) / 1e6)
                budget_later.append(sum(o["budget_ns_later"]) / 1e6)
                x_ns += t["ns"]
                h_first.append(o["ns"][0])
                x_first.append(t["ns"][0])
                h_comp.append(o["compile_ns"])
                x_comp.append(t["compile_ns"])
            report[label] = {"schemas": len(cases) - len(skipped), "skipped": skipped,
                             "hablar_mask": summary(h_ns), "xgrammar_mask": summary(x_ns),
                             "hablar_later_mask": summary(h_later),
                             "hablar_budget_ms_per_request": [sum(budget_first) / len(budget_first),
                                                              sum(budget_later) / len(budget_later)],
                             "hablar_compile_ms_mean": sum(h_comp) / len(h_comp) / 1e6,
                             "xgrammar_compile_ms_mean": sum(x_comp) / len(x_comp) / 1e6}
            r = report[label]
            print(f"\n{label}: {r['schemas']} schemas, {r['hablar_mask']['n']} masks each side"
                  f" ({len(skipped)} schemas left out)")
            print(f"  {'':10} {'p50 us':>9} {'p90 us':>9} {'p99 us':>9} {'max us':>9} {'mean us':>9}")
            for side, key in (("hablar", "hablar_mask"), ("xgrammar", "xgrammar_mask"),
                              ("hablar, a later request of the schema", "hablar_later_mask")):
                s = r[key]
                print(f"  {side:10} {s['p50_us']:9.1f} {s['p90_us']:9.1f} {s['p99_us']:9.1f}"
                      f" {s['max_us']:9.1f} {s['mean_us']:9.1f}")
            b = r["hablar_budget_ms_per_request"]
            print(f"  hablar's token budget over a request's last 32 steps (mean ms): first request "
                  f"{b[0]:.2f}, a later one {b[1]:.2f}")
            print(f"  compile (mean ms): hablar {r['hablar_compile_ms_mean']:.2f}, "
                  f"xgrammar {r['xgrammar_compile_ms_mean']:.2f}")
            print(f"  a trivial XGrammar call from Python takes {CALL_NS / 1e3:.2f} us (in its figures)")
            r["xgrammar_python_call_us"] = CALL_NS / 1e3
            for name, why in skipped:
                print(f"  left out: {name}: {why}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
