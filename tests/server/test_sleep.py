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
    assert sleepy.rss_kib() < rss_awake - 20 * 1024, (rss_awake, sleepy.rss_kib())
    reply = chat(sleepy)
    assert reply["choices"][0]["message"]["content"] == before
    assert props(sleepy)["is_sleeping"] is False
    assert "waking: loading the model again" in "".join(sleepy.log_lines)


def test_read_only_routes_answer_asleep_without_waking(sleepy):
    chat(sleepy)
    wait_asleep(sleepy)
    metrics = [requests.get(sleepy.url + "/metrics", timeout=10).text for _ in range(2)]
    assert metrics[0] == metrics[1] and "llamacpp:tokens_predicted_total" in metrics[0]
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
    seen_awake = []
    for line in r.iter_lines():
        if line:
            seen_awake.append(props(sleepy)["is_sleeping"] is False)
    assert len(seen_awake) > 10 and all(seen_awake)


def test_bad_values_are_refused():
    r = subprocess.run([BIN, "serve", "--port", "0", "--sleep-idle-seconds", "-5"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    assert "--sleep-idle-seconds" in r.stderr
