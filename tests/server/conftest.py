"""Fixtures that start the real `hablar serve` on the default model.

Each ServerProcess binds a free port (--port 0, read back from the log), waits for /health,
and is stopped with SIGTERM at the end. Tests keep max_tokens small: the suite runs on two
shared CPU cores.
"""
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import requests

REPO = Path(__file__).resolve().parents[2]
BIN = os.environ.get("HABLAR_BIN", str(REPO / "build" / "src" / "cli" / "hablar"))
TESTDATA = Path(os.environ.get("HABLAR_TESTDATA", str(REPO.parent / "shared" / "testdata")))
# Extra flags for every server under test, e.g. "--device cuda" to run the suite on a GPU.
EXTRA_ARGS = os.environ.get("HABLAR_SERVE_ARGS", "").split()
# Tests of the CPU executor only skip, saying so, when the suite runs on a GPU (they run in
# CI, on the CPU): quantized KV caches are CPU-only, and the embedding tests hold llama.cpp's
# golden vectors to the CPU's tolerance (the CUDA embeddings have their own, against the CPU
# executor: tests/unit/engine/gpu_embed_test.cpp).
ON_GPU = "cuda" in EXTRA_ARGS or "gpu" in EXTRA_ARGS
cpu_only = pytest.mark.skipif(ON_GPU, reason="CPU executor only: quantized KV caches, and "
                              "embeddings held to the CPU's golden tolerance")
DEFAULT_MODEL = Path(os.environ.get("HABLAR_HOME", str(Path.home() / ".cache" / "hablar"))) / \
    "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"


class ServerProcess:
    def __init__(self, *args, env=None):
        if not Path(BIN).exists():
            pytest.fail(f"hablar binary not found at {BIN} (build it or set HABLAR_BIN)")
        if not DEFAULT_MODEL.exists():
            pytest.fail(f"default model not found at {DEFAULT_MODEL}")
        self.args = [BIN, "serve", "--port", "0", "--host", "127.0.0.1", *args, *EXTRA_ARGS]
        self.log_lines = []
        self.port = None
        self.proc = subprocess.Popen(self.args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     text=True, errors="replace", env=env)
        self._port_seen = threading.Event()
        self._reader = threading.Thread(target=self._read_log, daemon=True)
        self._reader.start()
        if not self._port_seen.wait(30):
            self.stop()
            pytest.fail("server did not start listening:\n" + self.log())
        self.url = f"http://127.0.0.1:{self.port}"

    def _read_log(self):
        for line in self.proc.stderr:
            self.log_lines.append(line)
            m = re.search(r"listening on http://[^:]+:(\d+)", line)
            if m and self.port is None:
                self.port = int(m.group(1))
                self._port_seen.set()

    def log(self):
        return "".join(self.log_lines[-50:])

    def wait_ready(self, timeout=120, headers=None):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                pytest.fail("server exited while loading:\n" + self.log())
            try:
                r = requests.get(self.url + "/health", timeout=2, headers=headers)
                if r.status_code == 200:
                    return self
            except requests.RequestException:
                pass
            time.sleep(0.05)
        pytest.fail("server not ready in time:\n" + self.log())

    def stop(self, timeout=30):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def rss_kib(self):
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        return 0

    def metrics(self):
        """Prometheus text as {name: value} for unlabelled samples."""
        text = requests.get(self.url + "/metrics", timeout=10).text
        out = {}
        for line in text.splitlines():
            if line.startswith("#") or not line.strip():
                continue
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
        return out


@pytest.fixture(scope="session")
def server():
    """The default server: default model and template, metrics on, 8 sequences at once."""
    s = ServerProcess("--metrics", "-np", "8", "-c", "4096", "-t", "2").wait_ready()
    yield s
    s.stop()


@pytest.fixture(scope="session")
def client(server):
    from openai import OpenAI
    return OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=300)


def chat(server, body, **kw):
    return requests.post(server.url + "/v1/chat/completions", json=body, timeout=300, **kw)


def sse_events_iter(response):
    """The data payloads of an SSE response as they arrive."""
    for line in response.iter_lines(decode_unicode=True):
        if line and line.startswith("data: "):
            yield line[len("data: "):]


def sse_events(response):
    """The data payloads of an SSE response, in order (raw strings)."""
    out = []
    for line in response.iter_lines(decode_unicode=True):
        if line and line.startswith("data: "):
            out.append(line[len("data: "):])
    return out
