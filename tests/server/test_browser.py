"""The web page at / in headless Chromium (Debian's `chromium`), driven over the DevTools
protocol: type a message, send it, and watch the reply's text grow as it streams."""
import json
import shutil
import socket
import subprocess
import tempfile
import time

import pytest
import requests

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class DevTools:
    def __init__(self, ws_url):
        import websocket
        self.ws = websocket.create_connection(ws_url, timeout=60, suppress_origin=True)
        self.next_id = 0

    def call(self, method, **params):
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == self.next_id:
                if "error" in msg:
                    raise RuntimeError(msg["error"])
                return msg.get("result", {})

    def eval(self, expression):
        r = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        return r["result"].get("value")


@pytest.fixture
def browser(server):
    if CHROMIUM is None:
        pytest.fail("chromium is not installed (apt-get install chromium)")
    port = free_port()
    profile = tempfile.mkdtemp(prefix="hablar-chromium-")
    proc = subprocess.Popen([CHROMIUM, "--headless=new", "--no-sandbox", "--disable-gpu",
                             "--disable-dev-shm-usage", f"--remote-debugging-port={port}",
                             f"--user-data-dir={profile}", "about:blank"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 60
        targets = None
        while time.time() < deadline:
            try:
                targets = requests.get(f"http://127.0.0.1:{port}/json", timeout=2).json()
                if any(t["type"] == "page" for t in targets):
                    break
            except requests.RequestException:
                pass
            time.sleep(0.2)
        page = next(t for t in targets if t["type"] == "page")
        yield DevTools(page["webSocketDebuggerUrl"])
    finally:
        proc.terminate()
        proc.wait(10)
        shutil.rmtree(profile, ignore_errors=True)


def test_web_page_streams_a_reply(server, browser):
    browser.call("Page.enable")
    browser.call("Page.navigate", url=server.url + "/?max_tokens=16")
    deadline = time.time() + 30
    while time.time() < deadline and browser.eval("document.readyState") != "complete":
        time.sleep(0.1)
    assert browser.eval("document.title") == "hablar"
    # The model name comes from /v1/models.
    deadline = time.time() + 30
    while time.time() < deadline and "SmolLM2" not in (browser.eval("document.getElementById('model').textContent") or ""):
        time.sleep(0.1)
    browser.eval("document.getElementById('temperature').value = '0'")
    browser.eval("document.getElementById('input').value = 'Write a short poem about the sea.'")
    browser.eval("document.getElementById('send').click()")
    lengths = []
    deadline = time.time() + 180
    while time.time() < deadline:
        text = browser.eval("(document.querySelector('.msg.assistant') || {}).textContent || ''")
        if not lengths or len(text) != lengths[-1]:
            lengths.append(len(text))
        if browser.eval("document.querySelector('.stats') !== null"):
            break
        time.sleep(0.02)
    final = browser.eval("document.querySelector('.msg.assistant').textContent")
    assert final, "no reply text appeared"
    assert browser.eval("document.querySelector('.msg.error') === null")
    # Streamed: the text was seen at several intermediate lengths before the end.
    partial = [n for n in lengths if 0 < n < len(final)]
    assert len(partial) >= 2, lengths
    r = requests.post(server.url + "/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "Write a short poem about the sea."}],
        "max_tokens": 16, "temperature": 0}).json()
    assert final == r["choices"][0]["message"]["content"]
