#!/usr/bin/env python3
"""Serving benchmark for any OpenAI-compatible server (hablar, llama.cpp's server, vLLM, ...).

Drives /v1/completions with streaming at a fixed concurrency (each of N workers sends its next
request when the previous one ends) or at a Poisson arrival rate, with a fixed-length workload
(e.g. 512 prompt tokens / 128 output tokens) or a mixed one (lengths drawn from ranges), and
reports per level: request and output-token throughput, TTFT, TPOT and inter-token latency
(mean, p50, p90, p99), and the share of stalls (inter-token gaps above twice the level's median
gap: a stream visibly freezing). The mixed workload is short chats among long prompts
(--mixed-long-share of the requests have --mixed-long-input prompt tokens); TTFT is also
reported for the short ones alone. At a fixed concurrency of 32 or more the streams are
driven from several processes (one per 16 streams, up to the cores; --client-processes), since
one event loop reads many fast streams late and in bursts. Results go to JSON; --plot draws
them against concurrency, and --compare overlays several result files (e.g. hablar vs
llama-server) in one PNG and prints the ratios.

  bench_serving.py --base-url http://127.0.0.1:8080 --label hablar --concurrency 1,2,4,8 \
      --input-len 512 --output-len 128 --requests-per-level 16 --out hablar.json
  bench_serving.py --compare hablar.json llamacpp.json --plot serving.png
"""
import argparse
import asyncio
import concurrent.futures
import json
import multiprocessing
import os
import random
import statistics
import sys
import time
import zlib

import httpx

WORDS = ("time person year way day thing man world life hand part child eye woman place work week "
         "case point government company number group problem fact river mountain garden window "
         "music paper story light voice table money water history market summer winter city").split()


def make_prompt(rng, n_tokens, token_ids=None):
    # Roughly one token per word plus punctuation; the server's usage gives the exact count.
    # token_ids (lo, hi): exactly n_tokens random ids in [lo, hi) instead (both servers take
    # token-id prompts), for vocabularies that spell words byte by byte (make-model files).
    if token_ids:
        return [rng.randrange(token_ids[0], token_ids[1]) for _ in range(max(1, n_tokens))]
    words = [rng.choice(WORDS) for _ in range(max(1, int(n_tokens * 0.9)))]
    return " ".join(words).capitalize() + "."


def percentile(values, p):
    if not values:
        return None
    s = sorted(values)
    k = (len(s) - 1) * p / 100
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def summary(values, scale=1e3):
    if not values:
        return {"mean": None, "p50": None, "p90": None, "p99": None}
    return {"mean": statistics.fmean(values) * scale, "p50": percentile(values, 50) * scale,
            "p90": percentile(values, 90) * scale, "p99": percentile(values, 99) * scale}


# Open-ended enough that a random-weight model's output fills max_tokens.
NOTES_SCHEMA = {"type": "object", "required": ["title", "notes"],
                "properties": {"title": {"type": "string"},
                               "notes": {"type": "array", "items": {"type": "string"}}}}


async def one_request(client, args, prompt, max_tokens):
    body = {"model": args.model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "stream": True}
    if args.ban_tokens:
        body["logit_bias"] = {str(t): -100 for t in args.ban_tokens}
    if args.ignore_eos:
        body["ignore_eos"] = True
    if args.logprobs is not None:
        body["logprobs"] = args.logprobs
    # A share of the requests constrained to a JSON schema (chosen by the prompt, so the same
    # requests in every run): structured output's masks on the server's sampling path.
    if args.json_schema_share > 0 and zlib.crc32(repr(prompt).encode()) % 1000 < args.json_schema_share * 1000:
        body["response_format"] = {"type": "json_schema",
                                   "json_schema": {"name": "notes", "schema": NOTES_SCHEMA}}
    t0 = time.perf_counter()
    times = []
    usage = None
    error = None
    try:
        async with client.stream("POST", args.base_url + "/v1/completions", json=body) as r:
            if r.status_code != 200:
                error = f"HTTP {r.status_code}: {(await r.aread())[:200]!r}"
            else:
                async for line in r.aiter_lines():
                    if not line.startswith("data: "):
                        continue
                    data = line[6:].strip()
                    if data == "[DONE]":
                        break
                    chunk = json.loads(data)
                    if chunk.get("usage"):
                        usage = chunk["usage"]
                    for c in chunk.get("choices", []):
                        if c.get("text"):
                            times.append(time.perf_counter())
    except Exception as e:  # noqa: BLE001 - a failed request is counted, not fatal
        error = repr(e)
    end = time.perf_counter()
    n_out = (usage or {}).get("completion_tokens") or len(times)
    return {"start": t0, "end": end, "token_times": times, "n_out": n_out,
            "n_in": (usage or {}).get("prompt_tokens"), "error": error,
            "long": (len(prompt) * 6 if isinstance(prompt, list) else len(prompt)) > args.short_chars}


def workload(args, n, seed):
    rng = random.Random(seed)
    items = []
    for _ in range(n):
        if args.workload == "mixed":
            long = rng.random() < args.mixed_long_share
            n_in = rng.randint(*(args.mixed_long_input if long else args.mixed_input))
            n_out = rng.randint(args.mixed_output[0], args.mixed_output[1])
        else:
            n_in, n_out = args.input_len, args.output_len
        items.append((make_prompt(rng, n_in, args.token_ids), n_out))
    return items


def client_processes(args, concurrency):
    """Processes that drive a level's streams. One Python event loop parses some 10,000-20,000
    stream events a second: at 64 or more streams a few ms apart it reads them late and in
    bursts (inter-token gaps of 0 that the server never made), so by default each process
    drives at most 16 streams, up to the machine's cores (--client-processes: a fixed count)."""
    if args.rate:
        return 1
    if args.client_processes > 0:
        return min(args.client_processes, concurrency)
    return max(1, min(os.cpu_count() or 1, concurrency // 16))


async def drive_workers(args, items, workers, start_at):
    """`workers` streams at a time over `items`, each sending its next request when the last
    ends, from the moment start_at (time.perf_counter: CLOCK_MONOTONIC, one clock for every
    process of the machine)."""
    limits = httpx.Limits(max_connections=workers + 4, max_keepalive_connections=workers + 4)
    async with httpx.AsyncClient(timeout=httpx.Timeout(3600.0), limits=limits) as client:
        await asyncio.sleep(max(0.0, start_at - time.perf_counter()))
        queue = list(items)
        results = []

        async def worker():
            while queue:
                prompt, n_out = queue.pop()
                results.append(await one_request(client, args, prompt, n_out))
        await asyncio.gather(*(worker() for _ in range(workers)))
    return results


def drive_workers_in_process(args, items, workers, start_at):
    return asyncio.run(drive_workers(args, items, workers, start_at))


def drive_in_processes(args, items, concurrency, n_proc):
    """The level's workers split over n_proc processes (each its own event loop and client),
    all starting at one moment; their results gathered."""
    start_at = time.perf_counter() + 1.0 + 0.1 * n_proc  # past the processes' start-up
    groups = [(items[p::n_proc], concurrency // n_proc + (1 if p < concurrency % n_proc else 0))
              for p in range(n_proc)]
    ctx = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(max_workers=n_proc, mp_context=ctx) as pool:
        futures = [pool.submit(drive_workers_in_process, args, group, workers, start_at)
                   for group, workers in groups if workers > 0 and group]
        results = [r for f in futures for r in f.result()]
    return results, start_at


async def run_level(args, concurrency, index):
    # A level's prompts are its own: a level repeated (LEVELS=256,256) must not find the
    # first one's prompts in the server's prefix cache.
    seed = concurrency + 1_000_003 * index
    items = workload(args, args.requests_per_level or max(2, concurrency), seed=seed)
    n_proc = client_processes(args, concurrency)
    if args.rate:
        limits = httpx.Limits(max_connections=concurrency + 4,
                              max_keepalive_connections=concurrency + 4)
        async with httpx.AsyncClient(timeout=httpx.Timeout(3600.0), limits=limits) as client:
            t_start = time.perf_counter()
            rng = random.Random(1)
            tasks = []
            for prompt, n_out in items:
                tasks.append(asyncio.create_task(one_request(client, args, prompt, n_out)))
                await asyncio.sleep(rng.expovariate(args.rate))
            results = await asyncio.gather(*tasks)
        duration = time.perf_counter() - t_start
    elif n_proc > 1:
        results, t_start = drive_in_processes(args, items, concurrency, n_proc)
        duration = max(r["end"] for r in results) - t_start
    else:
        t_start = time.perf_counter()
        results = await drive_workers(args, items, concurrency, t_start)
        duration = time.perf_counter() - t_start
    ok = [r for r in results if not r["error"]]
    ttft = [r["token_times"][0] - r["start"] for r in ok if r["token_times"]]
    tpot = [(r["end"] - r["token_times"][0]) / (r["n_out"] - 1) for r in ok
            if r["token_times"] and r["n_out"] > 1]
    itl = [b - a for r in ok for a, b in zip(r["token_times"], r["token_times"][1:])]
    itl_p50 = percentile(itl, 50)
    stalls = sum(1 for g in itl if g > 2 * itl_p50) / len(itl) if itl else None
    ttft_short = [r["token_times"][0] - r["start"] for r in ok if r["token_times"] and not r["long"]]
    out_tokens = sum(r["n_out"] for r in ok)
    in_tokens = sum(r["n_in"] or 0 for r in ok)
    level = {
        "concurrency": concurrency, "rate": args.rate, "client_processes": n_proc, "requests": len(results), "failed": len(results) - len(ok),
        "errors": sorted({r["error"] for r in results if r["error"]})[:3],
        "duration_s": duration, "request_throughput": len(ok) / duration,
        "output_token_throughput": out_tokens / duration,
        "total_token_throughput": (out_tokens + in_tokens) / duration,
        "prompt_tokens_mean": in_tokens / len(ok) if ok else None,
        "output_tokens_mean": out_tokens / len(ok) if ok else None,
        "ttft_ms": summary(ttft), "tpot_ms": summary(tpot), "itl_ms": summary(itl),
        "ttft_short_ms": summary(ttft_short), "stall_share": stalls,
        "itl_max_ms": max(itl) * 1e3 if itl else None,
    }
    return level


def print_level(label, lv):
    f = lambda v: "-" if v is None else f"{v:.1f}"  # noqa: E731
    print(f"[{label}] c={lv['concurrency']:>3} req/s={lv['request_throughput']:.3f} "
          f"out tok/s={lv['output_token_throughput']:.1f} TTFT p50={f(lv['ttft_ms']['p50'])} ms "
          f"p99={f(lv['ttft_ms']['p99'])} ms TPOT p50={f(lv['tpot_ms']['p50'])} ms "
          f"ITL p50={f(lv['itl_ms']['p50'])} p90={f(lv['itl_ms']['p90'])} p99={f(lv['itl_ms']['p99'])} ms "
          f"stalls>2xp50={100 * (lv['stall_share'] or 0):.1f}% failed={lv['failed']}",
          flush=True)


def plot(results, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    panels = [("output_token_throughput", None, "output tokens/s"), ("ttft_ms", "p50", "TTFT p50 (ms)"),
              ("tpot_ms", "p50", "TPOT p50 (ms)"), ("itl_ms", "p50", "ITL p50 (ms)"),
              ("itl_ms", "p99", "ITL p99 (ms)"), ("stall_share", None, "stalls > 2x ITL p50 (share)")]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 4.2))
    for res in results:
        xs = [lv["concurrency"] for lv in res["levels"]]
        for ax, (key, sub, title) in zip(axes, panels):
            ys = [(lv[key] or {}).get(sub) if sub else lv.get(key) for lv in res["levels"]]
            ax.plot(xs, ys, marker="o", label=res["label"])
            ax.set_title(title)
            ax.set_xlabel("concurrency")
            ax.set_xscale("log", base=2)
            if key in ("ttft_ms", "itl_ms") and sub == "p99":
                ax.set_yscale("log")  # stalls can be 10x the typical gap
            ax.grid(alpha=.3)
    axes[0].legend()
    w = results[0]["workload"]
    note = results[0].get("note", "")
    fig.suptitle(f"{w['kind']} workload: {w['desc']} - {results[0].get('model', '')} {note}")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    print(f"plot written to {path}")


def compare(results):
    base = results[0]
    r = lambda a, b: a / b if a and b else float("nan")  # noqa: E731
    for other in results[1:]:
        print(f"\n{base['label']} vs {other['label']} ({base['workload']['kind']}: {base['workload']['desc']})")
        print("  conc | out tok/s (ratio)        | TTFT p50 ms          | TPOT p50 ms   | "
              "ITL p50 ms    | ITL p90 ms    | ITL p99 ms      | stalls >2x p50")
        by_c = {lv["concurrency"]: lv for lv in other["levels"]}
        for lv in base["levels"]:
            o = by_c.get(lv["concurrency"])
            if not o:
                continue
            a, b = lv["output_token_throughput"], o["output_token_throughput"]
            g = lambda x, k, s: x[k][s] or 0  # noqa: E731
            print(f"  {lv['concurrency']:>4} | {a:6.1f} vs {b:6.1f} ({r(a, b):.2f}x) | "
                  f"{g(lv, 'ttft_ms', 'p50'):7.0f} vs {g(o, 'ttft_ms', 'p50'):7.0f} | "
                  f"{g(lv, 'tpot_ms', 'p50'):5.1f} vs {g(o, 'tpot_ms', 'p50'):5.1f} | "
                  f"{g(lv, 'itl_ms', 'p50'):5.1f} vs {g(o, 'itl_ms', 'p50'):5.1f} | "
                  f"{g(lv, 'itl_ms', 'p90'):5.1f} vs {g(o, 'itl_ms', 'p90'):5.1f} | "
                  f"{g(lv, 'itl_ms', 'p99'):6.1f} vs {g(o, 'itl_ms', 'p99'):6.1f} | "
                  f"{100 * (lv['stall_share'] or 0):4.1f}% vs {100 * (o['stall_share'] or 0):4.1f}%")
        if base["workload"]["kind"] == "mixed":
            print("  TTFT p50 of the short requests alone (ms):",
                  ", ".join(f"c={lv['concurrency']}: {g(lv, 'ttft_short_ms', 'p50'):.0f} vs "
                            f"{g(by_c[lv['concurrency']], 'ttft_short_ms', 'p50'):.0f}"
                            for lv in base["levels"] if lv["concurrency"] in by_c))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base-url", default="http://127.0.0.1:8080")
    p.add_argument("--model", default="default")
    p.add_argument("--label", default="server")
    p.add_argument("--concurrency", default="1,2,4,8", help="comma-separated levels")
    p.add_argument("--rate", type=float, default=0.0, help="Poisson arrivals per second instead of workers")
    p.add_argument("--workload", choices=["fixed", "mixed"], default="fixed")
    p.add_argument("--input-len", type=int, default=512)
    p.add_argument("--token-ids", type=lambda s: tuple(int(x) for x in s.split(":")), default=None,
                   metavar="LO:HI", help="prompts of exactly --input-len random token ids in [LO, HI) "
                   "instead of words (synthetic vocabularies spell words byte by byte)")
    p.add_argument("--output-len", type=int, default=128)
    rng_arg = lambda s: tuple(map(int, s.split(",")))  # noqa: E731
    p.add_argument("--mixed-input", type=rng_arg, default=(32, 160), help="short chats' prompt tokens")
    p.add_argument("--mixed-long-input", type=rng_arg, default=(768, 1536), help="long prompts' tokens")
    p.add_argument("--mixed-long-share", type=float, default=0.25, help="share of long prompts")
    p.add_argument("--mixed-output", type=rng_arg, default=(32, 128))
    p.add_argument("--note", default="", help="free text stored with the results (e.g. the load)")
    p.add_argument("--requests-per-level", type=int, default=0, help="default: the concurrency (at least 2): one full wave")
    p.add_argument("--ban-tokens", type=lambda s: [int(x) for x in s.split(",") if x], default=[],
                   help="token ids to ban (end-of-generation ids, so outputs have their full length)")
    p.add_argument("--ignore-eos", action="store_true",
                   help="send llama-server's ignore_eos (outputs of full length without a logit bias, "
                        "which a GPU server samples on the host)")
    p.add_argument("--logprobs", type=int, default=None,
                   help="ask for each token's log-probability and the top N (completions' logprobs)")
    p.add_argument("--json-schema-share", type=float, default=0.0,
                   help="share of requests with a JSON-schema response_format (structured output)")
    p.add_argument("--warmup", type=int, default=1, help="requests sent before measuring")
    p.add_argument("--client-processes", type=int, default=0,
                   help="processes driving the streams at a fixed concurrency (0: one per 16 "
                        "streams, up to the cores)")
    p.add_argument("--out", help="write results JSON here")
    p.add_argument("--plot", help="write a PNG here")
    p.add_argument("--compare", nargs="+", help="result JSON files to overlay and compare (first = base)")
    args = p.parse_args()
    # Prompts up to this many characters count as short (the mixed workload's TTFT split).
    args.short_chars = int(args.mixed_input[1] * 8)

    if args.compare:
        results = [json.load(open(f)) for f in args.compare]
        compare(results)
        if args.plot:
            plot(results, args.plot)
        return 0

    async def run_all():
        async with httpx.AsyncClient(timeout=3600) as c:
            for i in range(args.warmup):
                await one_request(c, args, make_prompt(random.Random(99 + i), 32), 4)
        levels = []
        for index, conc in enumerate(int(x) for x in args.concurrency.split(",")):
            lv = await run_level(args, conc, index)
            print_level(args.label, lv)
            levels.append(lv)
        return levels

    levels = asyncio.run(run_all())
    desc = (f"{args.input_len} in / {args.output_len} out" if args.workload == "fixed" else
            f"{100 * (1 - args.mixed_long_share):.0f}% in {args.mixed_input[0]}-{args.mixed_input[1]}, "
            f"{100 * args.mixed_long_share:.0f}% in {args.mixed_long_input[0]}-{args.mixed_long_input[1]}, "
            f"out {args.mixed_output[0]}-{args.mixed_output[1]}")
    result = {"label": args.label, "base_url": args.base_url, "model": args.model, "note": args.note,
              "workload": {"kind": args.workload, "desc": desc,
                           "mode": f"poisson {args.rate}/s" if args.rate else "fixed concurrency"},
              "levels": levels}
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    if args.plot:
        plot([result], args.plot)
    return 0 if all(lv["failed"] == 0 for lv in levels) else 1


if __name__ == "__main__":
    sys.exit(main())
