#!/usr/bin/env python3
"""Times prompt scoring, the requests of evaluation harnesses: /v1/completions with
"echo": true, "logprobs": N and "max_tokens": 0 (every prompt token's log-probability and the
top N, nothing generated), prompts of random token ids, CONCURRENCY at a time. Prints the
prompt tokens scored per second and writes the first response (--out) for comparisons."""
import argparse
import asyncio
import json
import random
import time

import httpx


async def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--base-url", default="http://127.0.0.1:8080")
    p.add_argument("--prompt-len", type=int, default=1024)
    p.add_argument("--requests", type=int, default=64)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--logprobs", type=int, default=1)
    p.add_argument("--token-ids", default="1000:30000", help="LO:HI of the random prompt ids")
    p.add_argument("--out", help="write the first response's JSON here")
    args = p.parse_args()
    lo, hi = (int(x) for x in args.token_ids.split(":"))
    rng = random.Random(7)
    prompts = [[rng.randrange(lo, hi) for _ in range(args.prompt_len)] for _ in range(args.requests)]
    sem = asyncio.Semaphore(args.concurrency)
    failed = 0

    async def one(client, i):
        nonlocal failed
        async with sem:
            body = {"prompt": prompts[i], "max_tokens": 0, "echo": True, "logprobs": args.logprobs,
                    "temperature": 0}
            r = await client.post(args.base_url + "/v1/completions", json=body)
            if r.status_code != 200:
                failed += 1
                return None
            return r.json()

    async with httpx.AsyncClient(timeout=600) as client:
        await one(client, 0)  # warm-up
        t0 = time.perf_counter()
        results = await asyncio.gather(*(one(client, i) for i in range(args.requests)))
        elapsed = time.perf_counter() - t0
    if args.out and results[0] is not None:
        with open(args.out, "w") as f:
            json.dump(results[0], f)
    scored = args.requests * (args.prompt_len - 1)
    print(f"prompt scoring: {args.requests} x {args.prompt_len} tokens, {args.concurrency} at a time,"
          f" logprobs {args.logprobs}: {elapsed:.2f} s, {scored / elapsed:,.0f} scored tokens/s,"
          f" failed {failed}")


if __name__ == "__main__":
    asyncio.run(main())
