#!/usr/bin/env python3
"""Embedding throughput: `hablar serve` beside llama-server --embedding, in one run.

Both servers load the same synthetic BERT-base-shape GGUF (`hablar make-model --arch bert
--shape bert-base`, the bge WordPiece vocabulary, F16 by default) on the CPU with the same
thread count, and get the same work: N inputs of L tokens each ([CLS] + random word pieces +
[SEP], sent as token ids so both see exactly L tokens), in requests of --per-request inputs
from --clients concurrent clients, mean pooling. Reported: inputs/s of each and the ratio,
and the worst cosine between the two servers' vectors (they must agree).

  python3 bench/embed/bench_embed.py [--inputs 512] [--tokens 128] [--threads 2]
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


def run_load(url, inputs, per_request, clients):
    """Posts every input to url/embedding (llama-server's shape, which both serve) and times it."""
    batches = [inputs[i:i + per_request] for i in range(0, len(inputs), per_request)]

    def one(batch):
        r = requests.post(url + "/embedding", json={"content": batch}, timeout=3600)
        r.raise_for_status()
        return [np.asarray(x["embedding"][0], dtype=np.float64) for x in r.json()]

    requests.post(url + "/embedding", json={"content": [inputs[0]]}, timeout=600).raise_for_status()
    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(clients) as pool:
        out = [v for vs in pool.map(one, batches) for v in vs]
    return len(inputs) / (time.perf_counter() - t0), out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--inputs", type=int, default=512)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--type", default="f16")
    ap.add_argument("--shape", default="bert-base")
    ap.add_argument("--per-request", type=int, default=32)
    ap.add_argument("--clients", type=int, default=4)
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
    results = {}
    hablar_cmd = [HABLAR, "serve", "-m", model, "--port", "0", "-t", str(a.threads),
                  "-b", str(step), "--embedding"]
    proc, url = start(hablar_cmd, port_regex=r"listening on http://[^:]+:(\d+)")
    try:
        results["hablar"] = run_load(url, inputs, a.per_request, a.clients)
    finally:
        stop(proc)
    port = 18000 + os.getpid() % 1000
    n_par = a.clients * a.per_request
    llama_cmd = [LLAMA_SERVER, "-m", model, "--port", str(port), "-t", str(a.threads),
                 "--embedding", "--pooling", "mean", "-np", str(n_par), "-c",
                 str(n_par * a.tokens), "-b", str(step), "-ub", str(step), "--no-webui"]
    proc, url = start(llama_cmd, port=port)
    try:
        results["llama-server"] = run_load(url, inputs, a.per_request, a.clients)
    finally:
        stop(proc)

    worst = min(float(np.dot(x, y) / np.linalg.norm(x) / np.linalg.norm(y))
                for x, y in zip(results["hablar"][1], results["llama-server"][1]))
    h, l = results["hablar"][0], results["llama-server"][0]
    print(f"{a.inputs} inputs x {a.tokens} tokens, {a.shape} {a.type}, {a.threads} threads, "
          f"{a.clients} clients x {a.per_request} inputs per request")
    print(f"  hablar serve          {h:8.2f} inputs/s")
    print(f"  llama-server          {l:8.2f} inputs/s")
    print(f"  ratio hablar/llama    {h / l:8.2f}x   (worst cosine between them {worst:.6f})")
    if a.json:
        Path(a.json).write_text(json.dumps({"inputs": a.inputs, "tokens": a.tokens,
                                            "threads": a.threads, "shape": a.shape, "type": a.type,
                                            "hablar_inputs_per_s": h, "llama_inputs_per_s": l,
                                            "ratio": h / l, "worst_cosine": worst}, indent=1))


if __name__ == "__main__":
    main()
