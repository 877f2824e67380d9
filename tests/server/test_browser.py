"""The web page at / in headless Chromium (Debian's `chromium`), driven over the DevTools
protocol: a streamed reply, Markdown and code blocks (with a deterministic reply seeded into
localStorage, as the model's own text is random), chats kept across reloads, the chat list,
settings that persist and reach the server (/slots shows a running request's params), Stop
keeping the partial reply, errors, streamed reasoning shown collapsed, and screenshots at
desktop and phone width."""
import base64
import io
import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

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
        if "exceptionDetails" in r:
            raise RuntimeError(f"{expression}: {r['exceptionDetails']}")
        return r["result"].get("value")

    def wait(self, expression, timeout=30, what=None):
        deadline = time.time() + timeout
        while time.time() < deadline:
            value = self.eval(expression)
            if value:
                return value
            time.sleep(0.05)
        raise AssertionError(f"timed out waiting for {what or expression}")

    def open(self, url):
        self.call("Page.navigate", url=url)
        time.sleep(0.1)
        self.wait("document.readyState === 'complete' && !!document.getElementById('log')")

    def storage(self):
        return self.eval("JSON.parse(localStorage.getItem('hablar.chats') || '[]')")


@pytest.fixture(scope="module")
def browser(server):
    if CHROMIUM is None:
        pytest.fail("chromium is not installed (apt-get install chromium)")
    port = free_port()
    profile = tempfile.mkdtemp(prefix="hablar-chromium-")
    proc = subprocess.Popen([CHROMIUM, "--headless=new", "--no-sandbox", "--disable-gpu",
                             "--disable-dev-shm-usage", f"--remote-debugging-port={port}",
                             "--hide-scrollbars", f"--user-data-dir={profile}", "about:blank"],
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
        tools = DevTools(page["webSocketDebuggerUrl"])
        tools.call("Page.enable")
        tools.call("Emulation.setDeviceMetricsOverride", width=1280, height=800,
                   deviceScaleFactor=1, mobile=False)
        yield tools
    finally:
        proc.terminate()
        proc.wait(10)
        shutil.rmtree(profile, ignore_errors=True)


@pytest.fixture
def page(server, browser):
    """The page with empty storage."""
    browser.open(server.url + "/")
    browser.eval("localStorage.clear()")
    browser.open(server.url + "/")
    return browser


MARKDOWN = """## Plan

Some **bold**, *italic* and `inline <code>` with a [link](https://example.org/a?b=1&c=2).

- first item
- second *item*

1. one
2. two

| name | value |
|------|-------|
| alpha | `1` |
| beta | 2 |

```python
print("<b>not bold</b>")
x = 1 & 2
```

<img src=x onerror="window.injected=1"><script>window.injected=2</script>
[bad](javascript:window.injected=3)
"""

SEEDED = [
    {"id": "c1", "title": "Markdown chat", "titled": True, "updated": 2, "messages": [
        {"role": "user", "content": "show me markdown"},
        {"role": "assistant", "content": MARKDOWN, "reasoning": "Thinking it over first."}]},
    {"id": "c2", "title": "Second chat", "titled": False, "updated": 1, "messages": [
        {"role": "user", "content": "hello there"},
        {"role": "assistant", "content": "General Kenobi"}]},
]


def seed(browser, server, chats=SEEDED, current="c1"):
    browser.eval(f"localStorage.setItem('hablar.chats', {json.dumps(json.dumps(chats))});"
                 f"localStorage.setItem('hablar.current', {json.dumps(json.dumps(current))})")
    browser.open(server.url + "/")


def test_web_page_streams_a_reply(server, page):
    page.wait("(document.getElementById('model').textContent || '').includes('SmolLM2')",
              what="the model name from /v1/models")
    page.eval("document.getElementById('set-temperature').value = '0';"
              "document.getElementById('set-max_tokens').value = '16';"
              "document.getElementById('input').value = 'Write a short poem about the sea.'")
    page.eval("document.getElementById('send').click()")
    lengths = []
    deadline = time.time() + 60
    while time.time() < deadline:
        text = page.eval("(document.querySelector('.msg.assistant .body') || {}).textContent || ''")
        if not lengths or len(text) != lengths[-1]:
            lengths.append(len(text))
        if page.eval("document.querySelector('.stats') !== null"):
            break
        time.sleep(0.02)
    assert page.eval("document.querySelector('.msg.error') === null")
    chats = page.storage()
    assert len(chats) == 1 and [m["role"] for m in chats[0]["messages"]] == ["user", "assistant"]
    stored = chats[0]["messages"][1]["content"]
    assert stored and "stopped" not in chats[0]["messages"][1]
    # Auto-titled from the first message.
    assert chats[0]["title"] == "Write a short poem about the sea."
    final = page.eval("document.querySelector('.msg.assistant .body').textContent")
    assert final
    # Streamed: the text was seen at several intermediate lengths before the end.
    assert len([n for n in lengths if 0 < n < len(final)]) >= 2, lengths
    r = requests.post(server.url + "/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "Write a short poem about the sea."}],
        "max_tokens": 16, "temperature": 0}).json()
    assert stored == r["choices"][0]["message"]["content"]
    # Kept across a reload.
    page.open(server.url + "/")
    assert page.eval("document.querySelectorAll('#log .msg').length") == 2
    assert page.eval("document.querySelector('.msg.user').textContent") == \
        "Write a short poem about the sea."


def test_markdown_and_code_blocks_render_safely(server, page):
    seed(page, server)
    q = lambda sel, prop="textContent": page.eval(  # noqa: E731
        f"Array.from(document.querySelectorAll('.msg.assistant .body {sel}')).map(e => e.{prop})")
    assert q("h2") == ["Plan"]
    assert q("strong") == ["bold"]
    assert "italic" in q("em") and "item" in q("em")
    assert q("ul > li") == ["first item", "second item"]
    assert q("ol > li") == ["one", "two"]
    assert q("a", "href") == ["https://example.org/a?b=1&c=2"]
    assert q("a", "rel") == ["noopener noreferrer"]
    assert q("th") == ["name", "value"]
    assert q("td") == ["alpha", "1", "beta", "2"]
    assert "inline <code>" in q("p > code")
    assert q(".codeblock .lang") == ["python"]
    assert q(".codeblock code") == ['print("<b>not bold</b>")\nx = 1 & 2']
    assert q(".codeblock button.copy") == ["Copy"]
    # Model text can not inject markup: no img, script or javascript: link, and the raw text shows.
    assert page.eval("document.querySelectorAll('#log img, #log script, #log b').length") == 0
    assert page.eval("window.injected === undefined")
    body = page.eval("document.querySelector('.msg.assistant .body').textContent")
    assert '<img src=x onerror="window.injected=1">' in body
    assert "[bad](javascript:window.injected=3)" in body
    # Reasoning is shown collapsed.
    assert page.eval("document.querySelector('details.reasoning').open") is False
    assert page.eval("document.querySelector('details.reasoning .thought').textContent") == \
        "Thinking it over first."
    # The copy button copies the block's code (the clipboard, or the textarea fallback).
    page.call("Browser.grantPermissions", permissions=["clipboardReadWrite", "clipboardSanitizedWrite"],
              origin=server.url)
    page.eval("document.querySelector('button.copy').click()")
    page.wait("document.querySelector('button.copy').textContent === 'Copied'")
    clip = page.eval("navigator.clipboard.readText().catch(e => 'unreadable')")
    assert clip in ('print("<b>not bold</b>")\nx = 1 & 2', "unreadable")


def test_chat_list_switch_rename_delete(server, page):
    seed(page, server)
    titles = "Array.from(document.querySelectorAll('#chats .title')).map(e => e.textContent)"
    assert page.eval(titles) == ["Markdown chat", "Second chat"]
    assert page.eval("document.querySelector('#chats li.current').dataset.id") == "c1"
    # Switch.
    page.eval("document.querySelector('#chats li[data-id=c2] .title').click()")
    assert page.eval("document.querySelector('.msg.assistant .body').textContent") == "General Kenobi"
    assert page.eval("JSON.parse(localStorage.getItem('hablar.current'))") == "c2"
    # Rename: the title becomes a field; Enter keeps the new name.
    page.eval("document.querySelector('#chats li[data-id=c2] .rename').click()")
    page.eval("""(() => { const f = document.querySelector('#chats li[data-id=c2] input');
                 f.value = 'Renamed';
                 f.dispatchEvent(new KeyboardEvent('keydown', {key: 'Enter', bubbles: true})); })()""")
    assert page.eval(titles) == ["Markdown chat", "Renamed"]
    assert [c["title"] for c in page.storage()] == ["Markdown chat", "Renamed"]
    # The current chat survives a reload.
    page.open(server.url + "/")
    assert page.eval("document.querySelector('.msg.assistant .body').textContent") == "General Kenobi"
    # Delete the current chat: the other one becomes current.
    page.eval("document.querySelector('#chats li[data-id=c2] .delete').click()")
    assert [c["id"] for c in page.storage()] == ["c1"]
    assert page.eval(titles) == ["Markdown chat"]
    assert page.eval("document.querySelector('.msg.user').textContent") == "show me markdown"
    # New chat: empty log, listed first.
    page.eval("document.getElementById('new-chat').click()")
    assert page.eval("document.querySelectorAll('#log .msg').length") == 0
    assert page.eval(titles) == ["New chat", "Markdown chat"]


SETTINGS = {"system": "You are a pirate.", "max_tokens": "400", "temperature": "0.5",
            "top_p": "0.9", "top_k": "7", "min_p": "0.02", "repeat_penalty": "1.1", "seed": "1234"}


def test_settings_persist_reach_the_server_and_stop_keeps_the_reply(server, page):
    for k, v in SETTINGS.items():
        page.eval(f"""(() => {{ const f = document.getElementById('set-{k}'); f.value = {json.dumps(v)};
                     f.dispatchEvent(new Event('input')); }})()""")
    page.open(server.url + "/")
    for k, v in SETTINGS.items():
        assert page.eval(f"document.getElementById('set-{k}').value") == v, k
    page.eval("document.getElementById('input').value = 'Tell me a long story about ships.'")
    page.eval("document.getElementById('send').click()")
    # While it runs, /slots shows the request with the page's settings.
    running = None
    deadline = time.time() + 30
    while time.time() < deadline and running is None:
        for slot in requests.get(server.url + "/slots", timeout=5).json():
            if slot.get("is_processing") and "pirate" in slot.get("prompt", ""):
                running = slot
        time.sleep(0.05)
    assert running is not None, "the request never showed in /slots"
    p = running["params"]
    assert p["n_predict"] == 400 and p["top_k"] == 7 and p["seed"] == 1234
    for k in ("temperature", "top_p", "min_p", "repeat_penalty"):
        assert p[k] == pytest.approx(float(SETTINGS[k]), rel=1e-6), k
    # Stop once some text has arrived: the partial reply stays, marked as stopped.
    page.wait("(document.querySelector('.msg.assistant .body') || {}).textContent.length > 10", 60)
    page.eval("document.getElementById('stop').click()")
    page.wait("document.querySelector('.msg.assistant .stopped') !== null")
    assert page.eval("document.getElementById('send').disabled") is False
    reply = page.storage()[0]["messages"][-1]
    assert reply["role"] == "assistant" and reply["stopped"] is True and len(reply["content"]) > 10
    page.open(server.url + "/")
    assert page.eval("document.querySelector('.msg.assistant .stopped').textContent") == "(stopped)"
    # The server went idle (the stopped request was cancelled).
    deadline = time.time() + 10
    while time.time() < deadline and any(s.get("is_processing") for s in
                                         requests.get(server.url + "/slots", timeout=5).json()):
        time.sleep(0.05)
    assert not any(s.get("is_processing") for s in requests.get(server.url + "/slots").json())


def test_errors_are_shown(server, page):
    page.eval("""(() => { const f = document.getElementById('set-top_p'); f.value = '5';
                 f.dispatchEvent(new Event('input')); })()""")
    page.eval("document.getElementById('input').value = 'hi'; document.getElementById('send').click()")
    text = page.wait("(document.querySelector('.msg.error') || {}).textContent", what="an error")
    assert "top_p" in text


def non_background_fraction(png, box):
    """The share of pixels in box (left, top, right, bottom) that differ from the box's corner."""
    import numpy as np
    from PIL import Image
    px = np.asarray(Image.open(io.BytesIO(png)).convert("RGB").crop(box)).astype(int)
    differs = np.abs(px - px[0, 0]).max(axis=2) > 24
    return float(differs.mean())


def screenshot(browser, width, height):
    browser.call("Emulation.setDeviceMetricsOverride", width=width, height=height,
                 deviceScaleFactor=1, mobile=width < 500)
    time.sleep(0.2)
    png = base64.b64decode(browser.call("Page.captureScreenshot", format="png")["data"])
    from PIL import Image
    assert Image.open(io.BytesIO(png)).size == (width, height)
    return png


@pytest.mark.parametrize("width,height", [(1280, 800), (375, 740)])
def test_screenshots_at_desktop_and_phone_width(server, page, width, height, tmp_path):
    seed(page, server)
    try:
        png = screenshot(page, width, height)
        # HABLAR_SCREENSHOTS=DIR keeps them for a look.
        out = Path(os.environ.get("HABLAR_SCREENSHOTS", str(tmp_path)))
        out.mkdir(parents=True, exist_ok=True)
        (out / f"page-{width}.png").write_bytes(png)
        rect = page.eval("(() => { const r = document.getElementById('log').getBoundingClientRect();"
                         " return [r.left, r.top, r.right, r.bottom]; })()")
        box = tuple(int(v) for v in rect)
        # The message area shows text, tables and code: a good share of it is not background.
        assert non_background_fraction(png, box) > 0.02
        # Nothing is wider than the window (no sideways scrolling of the page itself).
        assert page.eval("document.documentElement.scrollWidth") <= width
        assert box[2] - box[0] <= width
        sidebar_right = page.eval("document.getElementById('sidebar').getBoundingClientRect().right")
        if width < 500:
            # The chat list hides behind the menu button and slides in on a tap.
            assert sidebar_right <= 0 and page.eval(
                "getComputedStyle(document.getElementById('menu')).display") != "none"
            assert box[2] - box[0] >= width - 2
            page.eval("document.getElementById('menu').click()")
            page.wait("document.getElementById('sidebar').getBoundingClientRect().left >= 0")
        else:
            assert sidebar_right > 100 and box[0] >= sidebar_right - 1
    finally:
        page.call("Emulation.setDeviceMetricsOverride", width=1280, height=800,
                  deviceScaleFactor=1, mobile=False)


def test_streamed_reasoning_shows_collapsed(browser):
    # DeepSeek-R1's template opens the think block: the reply streams reasoning_content first.
    from conftest import TESTDATA, ServerProcess
    r1 = ServerProcess("--chat-template-file",
                       str(TESTDATA / "chat-templates" / "llama-cpp-deepseek-r1.jinja"),
                       "-t", "1").wait_ready()
    try:
        browser.open(r1.url + "/")
        browser.eval("localStorage.clear()")
        browser.open(r1.url + "/")
        browser.eval("""(() => { for (const [k, v] of [['temperature', '0'], ['max_tokens', '8']]) {
                       const f = document.getElementById('set-' + k); f.value = v;
                       f.dispatchEvent(new Event('input')); } })()""")
        browser.eval("document.getElementById('input').value = 'What is 2+2?';"
                     "document.getElementById('send').click()")
        browser.wait("document.querySelector('.stats') !== null", 60, "the reply")
        reply = browser.storage()[0]["messages"][-1]
        want = requests.post(r1.url + "/v1/chat/completions", json={
            "messages": [{"role": "user", "content": "What is 2+2?"}], "temperature": 0,
            "max_tokens": 8}).json()["choices"][0]["message"]
        assert reply["reasoning"].strip() == want["reasoning_content"]
        assert browser.eval("document.querySelector('details.reasoning').open") is False
        assert browser.eval("document.querySelector('details.reasoning .thought').textContent") == \
            reply["reasoning"]
    finally:
        r1.stop()
