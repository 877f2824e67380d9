"""Server lifecycle and guards: /health while loading, API keys, CORS, queue limits and a
graceful SIGTERM."""
import concurrent.futures as cf
import json
import time

import requests

from conftest import ServerProcess

MSGS = [{"role": "user", "content": "Hi"}]


def test_health_is_503_while_loading_then_200(tmp_path):
    s = ServerProcess("-t", "1")
    try:
        statuses = []
        deadline = time.time() + 120
        while time.time() < deadline:
            try:
                r = requests.get(s.url + "/health", timeout=2)
            except requests.RequestException:
                time.sleep(0.01)
                continue
            statuses.append(r.status_code)
            if r.status_code == 503:
                assert r.json()["error"]["type"] == "unavailable_error"
                posted = requests.post(s.url + "/v1/chat/completions", json={"messages": MSGS})
                if posted.status_code != 503:
                    # Loading finished between the two requests: then it must be over for good.
                    assert posted.status_code == 200
                    assert requests.get(s.url + "/health", timeout=2).status_code == 200
            if r.status_code == 200:
                break
            time.sleep(0.01)
        assert statuses[-1] == 200
        assert 503 in statuses, "never saw the loading state"
    finally:
        assert s.stop() == 0


def test_api_key_and_cors(tmp_path):
    key_file = tmp_path / "keys.txt"
    key_file.write_text("# keys\nsecret-one\n")
    s = ServerProcess("--api-key", "secret-two", "--api-key-file", str(key_file), "--cors-origins",
                      "http://good.example", "-t", "1").wait_ready()
    try:
        url = s.url + "/v1/models"
        assert requests.get(s.url + "/health").status_code == 200  # open
        r = requests.get(url)
        assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
        assert requests.get(url, headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert requests.get(url, headers={"Authorization": "Bearer secret-one"}).status_code == 200
        assert requests.get(url, headers={"Authorization": "Bearer secret-two"}).status_code == 200
        pre = requests.options(s.url + "/v1/chat/completions",
                               headers={"Origin": "http://good.example",
                                        "Access-Control-Request-Method": "POST"})
        assert pre.status_code == 200
        assert pre.headers["Access-Control-Allow-Origin"] == "http://good.example"
        assert "Authorization" in pre.headers["Access-Control-Allow-Headers"]
        bad = requests.get(url, headers={"Origin": "http://evil.example", "Authorization": "Bearer secret-one"})
        assert "Access-Control-Allow-Origin" not in bad.headers
    finally:
        s.stop()


def test_queue_full_is_503_with_retry_after():
    s = ServerProcess("-np", "1", "--max-queue", "2", "-t", "1").wait_ready()
    try:
        body = {"messages": [{"role": "user", "content": "Tell me a story."}], "max_tokens": 64,
                "temperature": 0}

        def send(_):
            r = requests.post(s.url + "/v1/chat/completions", json=body, timeout=600)
            return r.status_code, r.headers.get("Retry-After"), r.json()

        with cf.ThreadPoolExecutor(16) as pool:
            results = list(pool.map(send, range(16)))
        codes = [c for c, _, _ in results]
        assert 200 in codes and 503 in codes, codes
        for code, retry, j in results:
            if code == 503:
                assert retry is not None
                assert "queue" in j["error"]["message"]
    finally:
        s.stop()


def test_sigterm_ends_streams_cleanly_and_exits_zero():
    s = ServerProcess("-t", "1", "--shutdown-grace", "2").wait_ready()
    body = {"messages": [{"role": "user", "content": "Write a long story."}], "max_tokens": 400,
            "temperature": 0, "stream": True}
    r = requests.post(s.url + "/v1/chat/completions", json=body, stream=True, timeout=120)
    lines = r.iter_lines(decode_unicode=True)
    events = []
    for line in lines:
        if line.startswith("data: "):
            events.append(line[6:])
            if len(events) == 2:
                break
    t0 = time.time()
    code_holder = {}
    import threading
    th = threading.Thread(target=lambda: code_holder.setdefault("rc", s.stop(timeout=60)))
    th.start()
    for line in lines:
        if line.startswith("data: "):
            events.append(line[6:])
    th.join()
    assert events[-1] == "[DONE]"
    last = json.loads(events[-2])
    # Finished within the grace period: a normal finish. Cut at its end: an error event
    # (503), never a finish that looks like success.
    if "error" in last:
        assert last["error"]["code"] == 503
        finishes = [c["finish_reason"] for e in events[:-1] for c in json.loads(e).get("choices", [])
                    if c.get("finish_reason")]
        assert finishes == [], finishes
    else:
        assert last["choices"][0]["finish_reason"] in ("stop", "length")
    assert code_holder["rc"] == 0
    assert time.time() - t0 < 30
