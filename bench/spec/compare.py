#!/usr/bin/env python3
"""Speculative decoding, side by side: hablar and llama-server, each without speculation and
with each drafter, on an input-grounded workload (repeat a ~1.5k-token C++ file with one
rename) at temperature 0; then the aggregate throughput of 8 concurrent streams with and
without hablar's prompt lookup.

Every configuration is its own server started and stopped in turn (one at a time on the
machine), warmed with a short request, then timed on the same prompt. Decode speed is the
server's own timings.predicted_per_second (first token to last); acceptance from
timings.draft_n / draft_n_accepted (both servers report them so).

  bench/spec/compare.py [--target T.gguf] [--draft D.gguf] [--n-predict 256] [--threads 2]
                        [--llama-server PATH] [--skip-llama] [--concurrent 8]

--target defaults to the default model; --draft (for draft-model speculation on both
servers) is optional: without it the draft rows are left out.
"""
import argparse
import concurrent.futures as cf
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import requests

REPO = Path(__file__).resolve().parents[2]
HABLAR = os.environ.get("HABLAR_BIN", str(REPO / "build" / "src" / "cli" / "hablar"))
LLAMA = "/work/llamacpp/build/bin/llama-server"
DEFAULT_MODEL = Path.home() / ".cache" / "hablar" / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
# A fixed input: the block manager as it stood when speculation was written (read from git),
# so that the workload does not change as the live source does.
SOURCE_COMMIT, SOURCE_PATH = "7fc155b", "src/engine/block_manager.cpp"


def source_text():
    try:
        return subprocess.run(["git", "-C", str(REPO), "show", f"{SOURCE_COMMIT}:{SOURCE_PATH}"],
                              check=True, capture_output=True, text=True).stdout
    except (OSError, subprocess.CalledProcessError):
        sys.exit(f"bench/spec/compare.py needs the git history ({SOURCE_COMMIT}:{SOURCE_PATH})")


def rewrite_prompt(lines=110):
    """A chat turn (ChatML, the default model's template) asking to repeat the file with one
    rename, the answer begun with its first lines: the model goes on copying it, which is
    what prompt lookup is for."""
    text = "\n".join(source_text().split("\n")[:lines])
    head = "\n".join(text.split("\n")[:4])
    return ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
            "Face<|im_end|>\n<|im_start|>user\nRepeat this C++ file exactly, only renaming "
            "take_free_block to pop_free_block:\n```cpp\n" + text +
            "\n```<|im_end|>\n<|im_start|>assistant\n```cpp\n" + head + "\n")


class Server:
    def __init__(self, argv, ready_pattern):
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, errors="replace")
        self.port = None
        self.lines = []
        seen = threading.Event()

        def read():
            for line in self.proc.stdout:
                self.lines.append(line)
                m = re.search(ready_pattern, line)
                if m and self.port is None:
                    self.port = int(m.group(1))
                    seen.set()
        threading.Thread(target=read, daemon=True).start()
        if not seen.wait(300):
            self.stop()
            sys.exit("server did not start:\n" + "".join(self.lines[-30:]))
        self.url = f"http://127.0.0.1:{self.port}"
        deadline = time.time() + 300
        while time.time() < deadline:
            try:
                if requests.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except requests.RequestException:
                pass
            time.sleep(0.2)
        sys.exit("server not healthy:\n" + "".join(self.lines[-30:]))

    def complete(self, prompt, n_predict):
        r = requests.post(self.url + "/completion", timeout=3600,
                          json={"prompt": prompt, "n_predict": n_predict, "temperature": 0,
                                "cache_prompt": True})
        r.raise_for_status()
        return r.json()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def hablar(args, spec_args, np=1):
    argv = [HABLAR, "serve", "-m", args.target, "--port", "0", "--host", "127.0.0.1", "-t",
            str(args.threads), "-c", "8192", "-np", str(np), *spec_args]
    return Server(argv, r"listening on http://[^:]+:(\d+)")


def llama(args, spec_args, np=1):
    port = free_port()
    argv = [args.llama_server, "-m", args.target, "--port", str(port), "--host", "127.0.0.1",
            "-t", str(args.threads), "-c", str(8192 * np), "-np", str(np), "--no-webui",
            *spec_args]
    return Server(argv, r"listening on http://[^:]+:(\d+)|(?:server is listening).*:(\d+)")


def single_stream(make, prompt, n_predict):
    s = make()
    try:
        s.complete("Hello", 4)  # warm-up: pages the weights in
        j = s.complete(prompt, n_predict)
    finally:
        s.stop()
    t = j["timings"]
    return {"tps": t["predicted_per_second"], "n": t["predicted_n"],
            "draft_n": t.get("draft_n", 0), "accepted": t.get("draft_n_accepted", 0),
            "prompt_n": t["prompt_n"], "text": j["content"]}


def concurrent(make, prompt, n_predict, streams):
    s = make()
    try:
        s.complete("Hello", 4)
        s.complete(prompt, 1)  # the shared prompt in the prefix cache for every stream
        t0 = time.perf_counter()
        with cf.ThreadPoolExecutor(streams) as pool:
            outs = list(pool.map(lambda _: s.complete(prompt, n_predict), range(streams)))
        wall = time.perf_counter() - t0
    finally:
        s.stop()
    n = sum(o["timings"]["predicted_n"] for o in outs)
    return {"tps": n / wall, "n": n, "wall": wall,
            "draft_n": sum(o["timings"].get("draft_n", 0) for o in outs),
            "accepted": sum(o["timings"].get("draft_n_accepted", 0) for o in outs)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", default=str(DEFAULT_MODEL))
    ap.add_argument("--draft", default="")
    ap.add_argument("--n-predict", type=int, default=256)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--draft-max", type=int, default=16)
    ap.add_argument("--llama-server", default=LLAMA)
    ap.add_argument("--skip-llama", action="store_true")
    ap.add_argument("--concurrent", type=int, default=8)
    ap.add_argument("--kinds", default="none,ngram,draft,self",
                    help="drafters to run (none is always run: the baseline)")
    ap.add_argument("--no-concurrent", action="store_true")
    ap.add_argument("--json", default="", help="also write the figures here")
    args = ap.parse_args()
    prompt = rewrite_prompt()
    dm = ["--draft-max", str(args.draft_max)]
    kinds = set(args.kinds.split(","))
    rows = [("hablar", "none", lambda: hablar(args, []))]
    if "ngram" in kinds:
        rows.append(("hablar", "ngram", lambda: hablar(args, ["--spec-type", "ngram", *dm])))
    if "draft" in kinds and args.draft:
        rows.append(("hablar", "draft", lambda: hablar(
            args, ["--spec-type", "draft", "--model-draft", args.draft, "--draft-max", "8"])))
    if "self" in kinds:
        rows.append(("hablar", "self", lambda: hablar(args, ["--spec-type", "self"])))
    if not args.skip_llama:
        ldm = ["--spec-ngram-simple-size-m", str(args.draft_max)]
        rows.append(("llama.cpp", "none", lambda: llama(args, [])))
        if "ngram" in kinds:
            rows.append(("llama.cpp", "ngram",
                         lambda: llama(args, ["--spec-type", "ngram-simple", *ldm])))
        if "draft" in kinds and args.draft:
            rows.append(("llama.cpp", "draft", lambda: llama(
                args, ["--spec-type", "draft-simple", "--model-draft", args.draft,
                       "--spec-draft-n-max", "8"])))
    results = {}
    for server, kind, make in rows:
        r = single_stream(make, prompt, args.n_predict)
        results[(server, kind)] = r
        print(f"  {server:9s} {kind:6s} {r['tps']:7.2f} t/s  ({r['n']} tokens, "
              f"{r['accepted']}/{r['draft_n']} drafted accepted)", file=sys.stderr, flush=True)
    print(f"\nsingle stream, rewrite a {results[('hablar', 'none')]['prompt_n']}-token C++ file "
          f"(temperature 0, {args.n_predict} tokens, {args.threads} threads)")
    print(f"{'server':10s} {'drafter':8s} {'decode t/s':>10s} {'vs own none':>11s} "
          f"{'vs llama.cpp same':>17s} {'accepted':>14s} {'same text':>9s}")
    for (server, kind), r in results.items():
        base = results[(server, "none")]
        peer = results.get(("llama.cpp" if server == "hablar" else "hablar", kind))
        acc = f"{r['accepted']}/{r['draft_n']}" if r["draft_n"] else "-"
        if r["draft_n"]:
            acc += f" {100 * r['accepted'] / r['draft_n']:.0f}%"
        vs_peer = f"{r['tps'] / peer['tps']:.2f}x" if peer and server == "hablar" else ""
        print(f"{server:10s} {kind:8s} {r['tps']:10.2f} {r['tps'] / base['tps']:10.2f}x "
              f"{vs_peer:>17s} {acc:>14s} {str(r['text'] == base['text']):>9s}")
    conc = {}
    for kind, spec in () if args.no_concurrent else (("none", []),
                                                      ("ngram", ["--spec-type", "ngram", *dm])):
        conc[kind] = concurrent(lambda: hablar(args, spec, np=args.concurrent), prompt,
                                args.n_predict // 2, args.concurrent)
    if conc:
        print(f"\n{args.concurrent} concurrent streams (hablar, aggregate generated tokens / wall)")
    for kind, r in conc.items():
        acc = f"{r['accepted']}/{r['draft_n']}" if r["draft_n"] else "-"
        print(f"  {kind:6s} {r['tps']:8.2f} t/s  {r['tps'] / conc['none']['tps']:.2f}x  "
              f"accepted {acc}")
    if args.json:
        Path(args.json).write_text(json.dumps(
            {"single": {f"{s}/{k}": {x: v for x, v in r.items() if x != "text"}
                        for (s, k), r in results.items()},
             "concurrent": conc}, indent=1))


if __name__ == "__main__":
    main()
