#!/usr/bin/env python3
"""Embedding throughput: `hablar serve` beside llama-server --embedding, in one run.

Both servers load the same synthetic BERT-base-shape GGUF (`hablar make-model --arch bert
--shape bert-base`, the bge WordPiece vocabulary, F16 by default) on the CPU with the same
thread count, and get the same work: N inputs of L tokens each ([CLS] + random word pieces +
[SEP], sent as token ids so both see exactly L tokens), in requests of --per-request inputs
from --clients concurrent clients, mean pooling. Both servers stay up for the whole run and
take the inputs in --rounds alternating parts (hablar first in even rounds, llama-server first
in odd ones), so a change in the load of a shared machine falls on both alike. Reported:
inputs/s of each (wall clock) and the ratio; inputs per CPU-second of each server process
(its user + system time over the same parts: less sensitive to other processes on the cores)
and that ratio; the load average; the worst cosine between the two servers' vectors.

  python3 bench/embed/bench_embed.py [--inputs 512] [--tokens 128] [--threads 2] [--rounds 4]
"""
import argparse
import concurrent.futures
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import requests

REPO = Path(__file__).resolve().parents[2]
HABLAR = os.environ.get("HABLAR_BIN", str(REPO / "build" / "src" / "cli" / "hablar"))
LLAMA_SERVER = os.environ.get("LLAMA_SERVER", "/work/llamacpp/build/bin/llama-server")
VOCAB = os.environ.get("HABLAR_BERT_VOCAB",
                       str(REPO.parent / "shared" / "testdata" / "vocab" / "ggml-vocab-bert-bge.gguf"))


def start(cmd, port_regex=None, port=None):
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            errors="replace")
    if port is None:  # hablar: --port 0, read back from the log
        for line in proc.stderr:
            m = re.search(port_regex, line)
            if m:
                port = int(m.group(1))
                break
    # Keep reading the log: a server blocked on a full stderr pipe stops answering.
    threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()
    url = f"http://127.0.0.1:{port}"
    for _ in range(1200):
        try:
            if requests.get(url + "/health", timeout=1).status_code == 200:
                return proc, url
        except requests.RequestException:
            pass
        if proc.poll() is not None:
            sys.exit(f"server exited: {' '.join(cmd)}")
        time.sleep(0.1)
    sys.exit("server not ready")


def stop(proc):
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()


def cpu_seconds(proc):
    """User + system CPU time of a process (all its threads) so far."""
    fields = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_part(url, proc, inputs, per_request, clients):
    """Posts inputs to url/embedding (llama-server's shape, which both serve); returns the wall
    seconds, the server's CPU seconds and the vectors."""
    batches = [inputs[i:i + per_request] for i in range(0, len(inputs), per_request)]

    def one(batch):
        r = requests.post(url + "/embedding", json={"content": batch}, timeout=3600)
        r.raise_for_status()
        return [np.asarray(x["embedding"][0], dtype=np.float64) for x in r.json()]

    c0, t0 = cpu_seconds(proc), time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(clients) as pool:
        out = [v for vs in pool.map(one, batches) for v in vs]
    return time.perf_counter() - t0, cpu_seconds(proc) - c0, out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--inputs", type=int, default=512)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--type", default="f16")
    ap.add_argument("--shape", default="bert-base")
    ap.add_argument("--per-request", type=int, default=32)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=4, help="alternating parts of the inputs")
    ap.add_argument("--model", default="", help="an existing GGUF instead of a synthetic one")
    ap.add_argument("--json", default="", help="write the figures here")
    a = ap.parse_args()

    tmp = tempfile.mkdtemp(prefix="hablar-embed-bench-")
    model = a.model or os.path.join(tmp, f"bert-{a.shape}-{a.type}.gguf")
    if not a.model:
        subprocess.run([HABLAR, "make-model", "--arch", "bert", "--shape", a.shape, "--type", a.type,
                        "--vocab", VOCAB, "--seed", "1", "-o", model], check=True,
                       capture_output=True)
    rng = random.Random(0)
    inputs = [[101] + [rng.randrange(1000, 29000) for _ in range(a.tokens - 2)] + [102]
              for _ in range(a.inputs)]
    step = max(2048, a.per_request * a.tokens)
    hablar_cmd = [HABLAR, "serve", "-m", model, "--port", "0", "-t", str(a.threads),
                  "-b", str(step), "--embedding"]
    port = 18000 + os.getpid() % 1000
    n_par = a.clients * a.per_request
    llama_cmd = [LLAMA_SERVER, "-m", model, "--port", str(port), "-t", str(a.threads),
                 "--embedding", "--pooling", "mean", "-np", str(n_par), "-c",
                 str(n_par * a.tokens), "-b", str(step), "-ub", str(step), "--no-webui"]
    servers = {}
    try:
        servers["hablar"] = start(hablar_cmd, port_regex=r"listening on http://[^:]+:(\d+)")
        servers["llama-server"] = start(llama_cmd, port=port)
        for proc, url in servers.values():  # warm-up
            requests.post(url + "/embedding", json={"content": [inputs[0]]},
                          timeout=600).raise_for_status()
        load0 = os.getloadavg()[0]
        totals = {name: [0.0, 0.0, []] for name in servers}
        part = (len(inputs) + a.rounds - 1) // a.rounds
        for r in range(a.rounds):
            chunk = inputs[r * part:(r + 1) * part]
            order = list(servers) if r % 2 == 0 else list(reversed(servers))
            for name in order:
                proc, url = servers[name]
                wall, cpu, vecs = run_part(url, proc, chunk, a.per_request, a.clients)
                totals[name][0] += wall
                totals[name][1] += cpu
                totals[name][2] += vecs
        load1 = os.getloadavg()[0]
    finally:
        for proc, _ in servers.values():
            stop(proc)
    results = {name: (len(inputs) / t[0], t[2]) for name, t in totals.items()}
    per_cpu = {name: len(inputs) / t[1] for name, t in totals.items()}

    worst = min(float(np.dot(x, y) / np.linalg.norm(x) / np.linalg.norm(y))
                for x, y in zip(results["hablar"][1], results["llama-server"][1]))
    h, l = results["hablar"][0], results["llama-server"][0]
    print(f"{a.inputs} inputs x {a.tokens} tokens, {a.shape} {a.type}, {a.threads} threads, "
          f"{a.clients} clients x {a.per_request} inputs per request")
    print(f"  hablar serve          {h:8.2f} inputs/s")
    print(f"  llama-server          {l:8.2f} inputs/s")
    print(f"  ratio hablar/llama    {h / l:8.2f}x   (worst cosine between them {worst:.6f})")
    hc, lc = per_cpu["hablar"], per_cpu["llama-server"]
    print(f"  per CPU-second        hablar {hc:.3f}, llama-server {lc:.3f} inputs: {hc / lc:.2f}x")
    print(f"  load average          {load0:.2f} at the start, {load1:.2f} at the end "
          f"({os.cpu_count()} cores)")
    if a.json:
        Path(a.json).write_text(json.dumps({"inputs": a.inputs, "tokens": a.tokens,
                                            "threads": a.threads, "shape": a.shape, "type": a.type,
                                            "hablar_inputs_per_s": h, "llama_inputs_per_s": l,
                                            "ratio": h / l, "hablar_inputs_per_cpu_s": hc,
                                            "llama_inputs_per_cpu_s": lc, "cpu_ratio": hc / lc,
                                            "load_start": load0, "load_end": load1,
                                            "worst_cosine": worst}, indent=1))


if __name__ == "__main__":
    main()
