#!/usr/bin/env python3
"""Aggregate decode throughput of a running server: N clients at once, each a prompt of about
P tokens and G generated tokens (ignore_eos, greedy), through llama.cpp's /completion route.
Prints the output tokens per second over the whole burst and the mean of each stream's own
decode rate (the server's `timings`).

  aggregate_decode.py --base-url http://127.0.0.1:8080 --clients 64 --prompt-words 100 --gen 128
"""
import argparse
import asyncio
import time

import httpx


async def one(client, url, i, words, gen):
    prompt = f"Request {i}. " + " ".join(f"word{(i * 7 + k) % 997}" for k in range(words))
    body = {"prompt": prompt, "n_predict": gen, "ignore_eos": True, "temperature": 0,
            "cache_prompt": False}
    r = await client.post(url + "/completion", json=body)
    r.raise_for_status()
    return r.json()["timings"]


async def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base-url", required=True)
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--prompt-words", type=int, default=100)
    ap.add_argument("--gen", type=int, default=128)
    a = ap.parse_args()
    limits = httpx.Limits(max_connections=a.clients + 8)
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:
        await one(client, a.base_url, -1, a.prompt_words, 8)  # warm-up
        t0 = time.perf_counter()
        timings = await asyncio.gather(
            *[one(client, a.base_url, i, a.prompt_words, a.gen) for i in range(a.clients)])
        wall = time.perf_counter() - t0
    generated = sum(t["predicted_n"] for t in timings)
    per_stream = sum(t["predicted_per_second"] for t in timings) / len(timings)
    prompt = sum(t["prompt_n"] for t in timings)
    print(f"clients {a.clients}: {generated} tokens generated in {wall:.2f} s -> "
          f"{generated / wall:.0f} output tok/s aggregate; per-stream decode "
          f"{per_stream:.0f} tok/s; {prompt} prompt tokens")


if __name__ == "__main__":
    asyncio.run(main())
