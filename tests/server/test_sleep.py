"""--sleep-idle-seconds: the model leaves memory when idle and comes back for the next request
that needs it; read-only routes answer meanwhile without waking it."""
import concurrent.futures
import subprocess
import time

import pytest
import requests

from conftest import BIN, ServerProcess

CHAT = {"messages": [{"role": "user", "content": "Name three colours."}], "temperature": 0,
        "max_tokens": 12}


def props(s):
    r = requests.get(s.url + "/props", timeout=30)
    assert r.status_code == 200
    return r.json()


def wait_asleep(s, timeout=15):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if props(s)["is_sleeping"]:
            return
        time.sleep(0.1)
    pytest.fail("the server did not fall asleep:\n" + s.log())


@pytest.fixture(scope="module")
def sleepy():
    s = ServerProcess("-t", "2", "-np", "4", "-c", "2048", "--metrics",
                      "--sleep-idle-seconds", "1").wait_ready()
    yield s
    s.stop()


def chat(s):
    r = requests.post(s.url + "/v1/chat/completions", json=CHAT, timeout=300)
    assert r.status_code == 200, r.text
    return r.json()


def test_sleeps_frees_memory_and_wakes_to_the_same_answers(sleepy):
    before = chat(sleepy)["choices"][0]["message"]["content"]
    rss_awake = sleepy.rss_kib()
    wait_asleep(sleepy)
    # The KV cache and the model's own buffers are gone (its file mapping may stay cached).
    # /props says asleep once the server let go of the model; the last holder (the engine's
    # threads, a stream's last bytes) frees it a moment later, so the memory is polled.
    deadline = time.time() + 10
    while sleepy.rss_kib() >= rss_awake - 20 * 1024 and time.time() < deadline:
        time.sleep(0.1)
    assert sleepy.rss_kib() < rss_awake - 20 * 1024, (rss_awake, sleepy.rss_kib())
    reply = chat(sleepy)
    assert reply["choices"][0]["message"]["content"] == before
    assert props(sleepy)["is_sleeping"] is False
    assert "waking: loading the model again" in "".join(sleepy.log_lines)


def test_read_only_routes_answer_asleep_without_waking(sleepy):
    chat(sleepy)
    wait_asleep(sleepy)
    metrics = [requests.get(sleepy.url + "/metrics", timeout=10).text for _ in range(3)]
    # Counters stand still; the throughput gauges (since the previous scrape, as llama-server
    # has them) show the last activity once, then an empty window.
    def lines(text, prefix):
        return [l for l in text.splitlines() if l.startswith(prefix)]
    assert lines(metrics[0], "llamacpp:tokens_predicted_total ") == \
        lines(metrics[2], "llamacpp:tokens_predicted_total ") != []
    assert metrics[1] == metrics[2]
    assert lines(metrics[2], "llamacpp:predicted_tokens_seconds ") == ["llamacpp:predicted_tokens_seconds 0"]
    assert requests.get(sleepy.url + "/health", timeout=10).json() == {"status": "ok"}
    models = requests.get(sleepy.url + "/v1/models", timeout=10).json()
    assert len(models["data"]) == 1
    assert requests.get(sleepy.url + "/api/ps", timeout=10).json() == {"models": []}
    assert len(requests.get(sleepy.url + "/api/tags", timeout=10).json()["models"]) == 1
    slots = requests.get(sleepy.url + "/slots", timeout=10)
    assert slots.status_code == 200
    p = props(sleepy)
    assert p["is_sleeping"] is True and p["total_slots"] == 4


def test_many_requests_at_once_wake_it_once(sleepy):
    chat(sleepy)
    wait_asleep(sleepy)
    wakes = "".join(sleepy.log_lines).count("waking: loading the model again")
    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        replies = list(pool.map(lambda _: chat(sleepy), range(6)))
    assert len({r["choices"][0]["message"]["content"] for r in replies}) == 1
    assert "".join(sleepy.log_lines).count("waking: loading the model again") == wakes + 1


def test_a_busy_server_does_not_sleep(sleepy):
    chat(sleepy)
    wait_asleep(sleepy)
    # A generation running longer than the idle time keeps the model awake throughout.
    r = requests.post(sleepy.url + "/completion", timeout=300, json={
        "prompt": "Once upon a time", "n_predict": 400, "ignore_eos": True, "stream": True}, stream=True)
    # Lines read after the generation ended were buffered: the server may rightly sleep by
    # then (a loaded machine reads them late), so a check counts only while a slot still
    # processes (asked after the check, so the server was busy at the check too).
    seen_awake = []
    for line in r.iter_lines():
        if line:
            awake = props(sleepy)["is_sleeping"] is False
            slots = requests.get(sleepy.url + "/slots", timeout=30).json()
            if any(slot.get("is_processing") for slot in slots):
                seen_awake.append(awake)
    assert len(seen_awake) > 10 and all(seen_awake)


def test_bad_values_are_refused():
    r = subprocess.run([BIN, "serve", "--port", "0", "--sleep-idle-seconds", "-5"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    assert "--sleep-idle-seconds" in r.stderr


# ---- Ollama's keep_alive, on a server without --sleep-idle-seconds ----------------------

@pytest.fixture(scope="module")
def ollama_server():
    s = ServerProcess("-t", "2", "-np", "2", "-c", "2048").wait_ready()
    yield s
    s.stop()


def test_keep_alive_zero_unloads_and_the_next_request_loads(ollama_server):
    import ollama
    c = ollama.Client(host=ollama_server.url)
    first = c.chat(model="m", messages=[{"role": "user", "content": "Hi"}], options={"num_predict": 4, "temperature": 0})
    assert c.ps().models[0].expires_at.year > 2100  # no keep_alive, no flag: never unloaded
    r = c.generate(model="m", prompt="", keep_alive=0)
    assert r.done and r.done_reason == "unload"
    assert props(ollama_server)["is_sleeping"] is True
    assert c.ps().models == []
    again = c.generate(model="m", prompt="", keep_alive=0)  # unloading what is unloaded: no load
    assert again.done_reason == "unload" and props(ollama_server)["is_sleeping"] is True
    # A chat loads it again and answers as before; its keep_alive sets when it goes.
    second = c.chat(model="m", messages=[{"role": "user", "content": "Hi"}], keep_alive="1500ms",
                    options={"num_predict": 4, "temperature": 0})
    assert second.message.content == first.message.content
    expires = c.ps().models[0].expires_at.timestamp()
    assert time.time() - 2 < expires < time.time() + 4
    wait_asleep(ollama_server, timeout=10)
    # An empty chat loads the model; keep_alive -1 keeps it loaded for good.
    loaded = c.chat(model="m", messages=[], keep_alive=-1)
    assert loaded.done_reason == "load" and props(ollama_server)["is_sleeping"] is False
    time.sleep(2)
    assert props(ollama_server)["is_sleeping"] is False
    assert c.ps().models[0].expires_at.year > 2100


@pytest.mark.parametrize("value", ["5 parsecs", "m5", "", True, [1]])
def test_malformed_keep_alive_is_400(ollama_server, value):
    r = requests.post(ollama_server.url + "/api/generate", timeout=60,
                      json={"model": "m", "prompt": "Hi", "keep_alive": value, "stream": False,
                            "options": {"num_predict": 1}})
    assert r.status_code == 400 and "keep_alive" in r.json()["error"]


def test_throughput_gauges_cover_the_time_since_the_previous_scrape(server):
    def rate(name):
        text = requests.get(server.url + "/metrics", timeout=10).text
        return float(next(l for l in text.splitlines() if l.startswith(name + " ")).split()[1])
    requests.post(server.url + "/completion", json={"prompt": "Hello", "n_predict": 6}, timeout=300)
    assert rate("llamacpp:predicted_tokens_seconds") > 0
    assert rate("llamacpp:predicted_tokens_seconds") == 0  # nothing ran since
    assert rate("llamacpp:prompt_tokens_seconds") == 0


@pytest.mark.parametrize("value,seconds", [("90s", 90), ("1m30s", 90), ("0.5h", 1800), (120, 120),
                                           ("1h2m3.5s", 3723.5), ("+45s", 45), ("250000ms", 250)])
def test_keep_alive_durations(ollama_server, value, seconds):
    r = requests.post(ollama_server.url + "/api/generate", timeout=60,
                      json={"model": "m", "prompt": "", "keep_alive": value})
    assert r.status_code == 200 and r.json()["done_reason"] == "load"
    from datetime import datetime
    ps = requests.get(ollama_server.url + "/api/ps", timeout=10).json()["models"][0]
    expires = datetime.fromisoformat(ps["expires_at"].replace("Z", "+00:00")).timestamp()
    assert abs(expires - (time.time() + seconds)) < 3


def test_a_request_after_an_unload_keeps_the_model_loaded(ollama_server):
    # keep_alive 0 put it to sleep; the next request, without keep_alive, loads it for good
    # (no --sleep-idle-seconds) instead of inheriting the zero window.
    import ollama
    c = ollama.Client(host=ollama_server.url)
    assert c.generate(model="m", prompt="", keep_alive=0).done_reason == "unload"
    c.generate(model="m", prompt="Hi", options={"num_predict": 2})
    time.sleep(1.0)
    assert props(ollama_server)["is_sleeping"] is False
    assert c.ps().models[0].expires_at.year > 2100
