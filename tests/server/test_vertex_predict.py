"""Vertex AI (Google Cloud) prediction: {"instances": [...]} on the predict route, each instance
run on the route its "@requestFormat" names, {"predictions": [...]} in the same order."""
import socket

import pytest
import requests

from conftest import ServerProcess


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def vertex():
    """As the platform starts a container: AIP_* variables, its own routes and port, a key."""
    import os
    port = free_port()
    env = dict(os.environ, AIP_MODE="PREDICTION", AIP_HTTP_PORT=str(port),
               AIP_PREDICT_ROUTE="/v1/endpoints/e1/deployedModels/m1:predict",
               AIP_HEALTH_ROUTE="/ping")
    s = ServerProcess("-t", "2", "-np", "4", "--api-key", "k1", env=env)
    s.wait_ready(headers={"Authorization": "Bearer k1"})
    s.predict_url = s.url + "/v1/endpoints/e1/deployedModels/m1:predict"
    s.platform_port = port
    yield s
    s.stop()


AUTH = {"Authorization": "Bearer k1"}
CHAT = {"messages": [{"role": "user", "content": "Name a colour."}], "temperature": 0}


def test_platform_port_and_health_route(vertex):
    assert vertex.port == vertex.platform_port  # AIP_HTTP_PORT wins over --port 0
    assert requests.get(vertex.url + "/ping").status_code == 200  # probes carry no key
    assert requests.post(vertex.predict_url, json={"instances": []}).status_code == 401


def test_predictions_in_instance_order_equal_the_routes_answers(vertex):
    instances = [dict(CHAT, max_tokens=n, **{"@requestFormat": "chatCompletions"}) for n in (6, 2, 4)]
    instances.append({"@requestFormat": "/completion", "prompt": "The capital of France is",
                      "n_predict": 3, "temperature": 0})
    instances.append({"@requestFormat": "tokenize", "content": "hello world"})
    r = requests.post(vertex.predict_url, json={"instances": instances}, headers=AUTH, timeout=300)
    assert r.status_code == 200, r.text
    preds = r.json()["predictions"]
    assert len(preds) == 5
    assert [p["usage"]["completion_tokens"] for p in preds[:3]] == [6, 2, 4]
    direct = requests.post(vertex.url + "/v1/chat/completions", json=dict(CHAT, max_tokens=6),
                           headers=AUTH, timeout=300).json()
    assert preds[0]["choices"][0]["message"] == direct["choices"][0]["message"]
    assert preds[0]["object"] == "chat.completion"
    assert preds[3]["tokens_predicted"] == 3 and preds[3]["stop"] is True
    tokens = requests.post(vertex.url + "/tokenize", json={"content": "hello world"}, headers=AUTH).json()
    assert preds[4] == tokens


def test_streaming_routes_answer_whole(vertex):
    # Ollama's /api/chat streams unless told not to, and a client's "stream": true is overruled.
    r = requests.post(vertex.predict_url, headers=AUTH, timeout=300, json={"instances": [
        {"@requestFormat": "apiChat", "model": "m", "messages": CHAT["messages"], "options": {"num_predict": 3}},
        dict(CHAT, max_tokens=3, stream=True, **{"@requestFormat": "/v1/chat/completions"})]})
    assert r.status_code == 200, r.text
    ollama, openai = r.json()["predictions"]
    assert ollama["done"] is True and ollama["eval_count"] == 3
    assert openai["usage"]["completion_tokens"] == 3


def test_a_bad_instance_spoils_no_other(vertex):
    r = requests.post(vertex.predict_url, headers=AUTH, timeout=300, json={"instances": [
        {"@requestFormat": "noSuchRoute"}, 7, {"max_tokens": 2},
        dict(CHAT, max_tokens=2, **{"@requestFormat": "chatCompletions"}),
        {"@requestFormat": "chatCompletions", "messages": "not a list"}]})
    assert r.status_code == 200, r.text
    preds = r.json()["predictions"]
    for p in preds[:3]:
        assert p["error"]["code"] == 400 and p["error"]["message"]
    assert "noSuchRoute" in preds[0]["error"]["message"]
    assert preds[3]["usage"]["completion_tokens"] == 2
    assert preds[4]["error"]["code"] == 400


def test_shared_parameters_under_each_instances_own(vertex):
    msgs = CHAT["messages"]
    r = requests.post(vertex.predict_url, headers=AUTH, timeout=300, json={
        "instances": [{"@requestFormat": "chatCompletions", "messages": msgs},
                      {"@requestFormat": "chatCompletions", "messages": msgs, "max_tokens": 2}],
        "parameters": {"max_tokens": 3, "temperature": 0}})
    assert r.status_code == 200, r.text
    assert [p["usage"]["completion_tokens"] for p in r.json()["predictions"]] == [3, 2]


@pytest.mark.parametrize("body", [{}, {"instances": {"a": 1}}, {"instances": [{}] * 129}, [1],
                                  {"instances": [], "parameters": [1]}])
def test_malformed_prediction_bodies_are_400(vertex, body):
    r = requests.post(vertex.predict_url, json=body, headers=AUTH)
    assert r.status_code == 400
    assert r.json()["error"]["message"]


def test_off_unless_asked(server):
    assert requests.post(server.url + "/predict", json={"instances": []}).status_code == 404


def test_flag_without_the_platform():
    s = ServerProcess("-t", "2", "--vertex-ai").wait_ready()
    try:
        r = requests.post(s.url + "/predict", timeout=300, json={"instances": [
            {"@requestFormat": "completions", "prompt": "Hi", "max_tokens": 2}]})
        assert r.status_code == 200, r.text
        assert r.json()["predictions"][0]["usage"]["completion_tokens"] == 2
    finally:
        s.stop()


def test_a_client_that_leaves_cancels_its_instances():
    import json
    import socket
    import time
    s = ServerProcess("-t", "2", "-np", "4", "--metrics", "--vertex-ai").wait_ready()
    try:
        long = {"@requestFormat": "completions", "prompt": "Once upon a time", "max_tokens": 4000,
                "ignore_eos": True, "temperature": 0}
        body = json.dumps({"instances": [long, long]}).encode()
        sock = socket.create_connection(("127.0.0.1", s.port))
        sock.sendall(b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        deadline = time.time() + 60
        while s.metrics()["hablar_requests_running"] < 2 and time.time() < deadline:
            time.sleep(0.05)
        assert s.metrics()["hablar_requests_running"] == 2
        sock.close()  # the client goes away with both generations running
        deadline = time.time() + 20
        while s.metrics()["hablar_requests_running"] > 0 and time.time() < deadline:
            time.sleep(0.05)
        m = s.metrics()
        assert m["hablar_requests_running"] == 0, "instances still ran after the client left"
        assert m["hablar_generated_tokens_total"] < 2 * 4000
    finally:
        s.stop()
