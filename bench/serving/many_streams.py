#!/usr/bin/env python3
"""Opens N streaming chat requests at once against a server and reports whether every stream
completed, how long the whole burst took, the server's thread count at its peak (with --pid)
and the latency of a small probe request sent in the middle of the burst (does the server
still answer while N clients hold connections?).

  many_streams.py --base-url http://127.0.0.1:8080 --streams 1000 --max-tokens 2 --pid PID
"""
import argparse
import asyncio
import json
import os
import time

import httpx


def thread_count(pid):
    try:
        return len(os.listdir(f"/proc/{pid}/task"))
    except OSError:
        return None


async def stream_one(client, url, i, max_tokens, opened):
    body = {"messages": [{"role": "user", "content": f"Say the number {i}."}], "max_tokens": max_tokens,
            "temperature": 0, "stream": True}
    chunks = 0
    try:
        async with client.stream("POST", url + "/v1/chat/completions", json=body) as r:
            opened.append(time.perf_counter())
            if r.status_code != 200:
                return f"HTTP {r.status_code}"
            async for line in r.aiter_lines():
                if line.startswith("data: "):
                    if line[6:] == "[DONE]":
                        return None if chunks > 0 else "no chunks"
                    json.loads(line[6:])
                    chunks += 1
        return "stream ended without [DONE]"
    except Exception as e:  # noqa: BLE001 - counted and reported
        return repr(e)


async def main_async(args):
    limits = httpx.Limits(max_connections=args.streams + 10, max_keepalive_connections=0)
    peak_threads = 0
    async with httpx.AsyncClient(timeout=httpx.Timeout(args.timeout), limits=limits) as client:
        opened = []
        t0 = time.perf_counter()
        tasks = [asyncio.create_task(stream_one(client, args.base_url, i, args.max_tokens, opened))
                 for i in range(args.streams)]
        probe_ms = None
        while not all(t.done() for t in tasks):
            if args.pid:
                peak_threads = max(peak_threads, thread_count(args.pid) or 0)
            if probe_ms is None and len(opened) >= args.streams // 2:
                p0 = time.perf_counter()
                async with httpx.AsyncClient(timeout=60) as probe:
                    r = await probe.get(args.base_url + "/health")
                    assert r.status_code == 200
                probe_ms = (time.perf_counter() - p0) * 1e3
            await asyncio.sleep(0.05)
        errors = [e for e in await asyncio.gather(*tasks) if e]
        total = time.perf_counter() - t0
    print(json.dumps({"streams": args.streams, "completed": args.streams - len(errors),
                      "errors": sorted(set(errors))[:5], "seconds": round(total, 2),
                      "connections_open_at_once": len(opened),
                      "peak_server_threads": peak_threads or None,
                      "health_probe_ms_mid_burst": None if probe_ms is None else round(probe_ms, 1)}))
    return 0 if not errors else 1


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base-url", default="http://127.0.0.1:8080")
    p.add_argument("--streams", type=int, default=1000)
    p.add_argument("--max-tokens", type=int, default=2)
    p.add_argument("--timeout", type=float, default=1800)
    p.add_argument("--pid", type=int, help="server pid, to sample its thread count")
    return asyncio.run(main_async(p.parse_args()))


if __name__ == "__main__":
    raise SystemExit(main())
