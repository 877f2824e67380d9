"""`hablar serve` on a model directory or file, for the Python oracle tests: binds a free port
(read back from the log), waits for /health, posts JSON, and stops with SIGTERM."""
import os
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BIN = os.environ.get("HABLAR_BIN", str(REPO / "build" / "src" / "cli" / "hablar"))


class Server:
    def __init__(self, model, *extra_args):
        self.proc = subprocess.Popen([BIN, "serve", "-m", str(model), "--port", "0", "--host", "127.0.0.1",
                                      "-t", "2", *extra_args], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, text=True, errors="replace")
        self.lines, self.port, seen = [], None, threading.Event()

        def read():
            for line in self.proc.stderr:
                self.lines.append(line)
                m = re.search(r"listening on http://[^:]+:(\d+)", line)
                if m and self.port is None:
                    self.port = int(m.group(1))
                    seen.set()
        threading.Thread(target=read, daemon=True).start()
        if not seen.wait(120):
            self.stop()
            pytest.fail("server did not start:\n" + "".join(self.lines[-30:]))
        self.url = f"http://127.0.0.1:{self.port}"
        import requests
        for _ in range(600):
            try:
                if requests.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except requests.RequestException:
                pass
            time.sleep(0.1)
        pytest.fail("server not ready:\n" + "".join(self.lines[-30:]))

    def post(self, path, body):
        import requests
        r = requests.post(self.url + path, json=body, timeout=600)
        assert r.status_code == 200, r.text
        return r.json()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
