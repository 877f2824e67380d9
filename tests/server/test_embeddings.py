"""Embedding and rerank routes against `hablar serve`, through the clients people use:
the official openai client (float and base64), the ollama client, litellm and LangChain's
OpenAIEmbeddings, plus llama.cpp's /embedding shapes, errors, and batching across requests.

The encoder models are synthetic (bert-tiny shape, the bge WordPiece vocabulary) from
`hablar make-model`; the reranker is the one tests/golden/embedding/bert-rank-f16.json was
made from, so its scores are checked against llama.cpp's end to end (tokenization of the
query/document pair included).
"""
import base64
import json
import socket
import time
import subprocess

import numpy as np
import pytest
import requests

from conftest import BIN, REPO, TESTDATA, ServerProcess, cpu_only

pytestmark = cpu_only

VOCAB = str(TESTDATA / "vocab" / "ggml-vocab-bert-bge.gguf")
TEXTS = ["hello world", "The quick brown fox jumps over the lazy dog.",
         "Paris is the capital of France.", "a"]


def make_model(path, *args):
    subprocess.run([BIN, "make-model", "--shape", "bert-tiny", "--vocab", VOCAB, "--type", "f16",
                    "-o", str(path), *args], check=True, capture_output=True)
    return path


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
    path = make_model(tmp_path_factory.mktemp("bert") / "bert.gguf", "--arch", "bert",
                      "--seed", "11")
    s = ServerProcess("-m", str(path), "-t", "2", "--metrics").wait_ready()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def reranker(tmp_path_factory):
    path = make_model(tmp_path_factory.mktemp("rank") / "rank.gguf", "--arch", "bert",
                      "--rank-head", "--seed", "12")
    s = ServerProcess("-m", str(path), "-t", "2", "--reranking").wait_ready()
    yield s
    s.stop()


def post(server, path, body):
    return requests.post(server.url + path, json=body, timeout=120)


def unit(v):
    v = np.asarray(v, dtype=np.float64)
    return v / np.linalg.norm(v)


def test_openai_client_float_and_base64(bert):
    from openai import OpenAI
    client = OpenAI(base_url=bert.url + "/v1", api_key="unused", max_retries=0)
    f = client.embeddings.create(model="bert", input=TEXTS, encoding_format="float")
    b = client.embeddings.create(model="bert", input=TEXTS)  # the client asks for base64
    assert [d.index for d in f.data] == list(range(len(TEXTS)))
    assert f.usage.prompt_tokens == f.usage.total_tokens > len(TEXTS)
    for x, y in zip(f.data, b.data):
        assert len(x.embedding) == 128
        assert abs(np.linalg.norm(x.embedding) - 1.0) < 1e-5  # OpenAI's vectors are unit length
        np.testing.assert_allclose(x.embedding, y.embedding, rtol=0, atol=1e-6)
    # Different texts, different directions.
    assert np.dot(f.data[0].embedding, f.data[1].embedding) < 0.999


def test_base64_is_little_endian_float32(bert):
    r = post(bert, "/v1/embeddings", {"input": "hello world", "encoding_format": "base64"})
    f = post(bert, "/v1/embeddings", {"input": "hello world"}).json()["data"][0]["embedding"]
    raw = np.frombuffer(base64.b64decode(r.json()["data"][0]["embedding"]), dtype="<f4")
    np.testing.assert_allclose(raw, f, atol=1e-7)


def test_dimensions_truncate_then_normalize(bert):
    full = post(bert, "/v1/embeddings", {"input": TEXTS[1]}).json()["data"][0]["embedding"]
    short = post(bert, "/v1/embeddings", {"input": TEXTS[1], "dimensions": 32}).json()
    v = short["data"][0]["embedding"]
    assert len(v) == 32
    np.testing.assert_allclose(v, unit(full[:32]), atol=1e-6)


def test_token_id_inputs_match_text(bert):
    ids = requests.post(bert.url + "/tokenize", json={"content": "hello world",
                                                       "add_special": True}).json()["tokens"]
    by_text = post(bert, "/v1/embeddings", {"input": "hello world"}).json()["data"][0]
    by_ids = post(bert, "/v1/embeddings", {"input": ids}).json()["data"][0]
    lists = post(bert, "/v1/embeddings", {"input": [ids, ids[:2]]}).json()["data"]
    np.testing.assert_allclose(by_ids["embedding"], by_text["embedding"], atol=1e-7)
    np.testing.assert_allclose(lists[0]["embedding"], by_text["embedding"], atol=1e-7)
    assert len(lists) == 2


def test_llama_cpp_shapes_and_cli_agree(bert, tmp_path):
    r = post(bert, "/embedding", {"content": TEXTS, "embd_normalize": -1}).json()
    assert [x["index"] for x in r] == list(range(len(TEXTS)))
    assert all(len(x["embedding"]) == 1 and len(x["embedding"][0]) == 128 for x in r)
    # /embeddings with llama-server's {content} gives the same shape.
    r2 = post(bert, "/embeddings", {"content": TEXTS[0]}).json()
    np.testing.assert_allclose(r2[0]["embedding"][0], unit(r[0]["embedding"][0]), atol=1e-6)
    # `hablar embed` on the same model file gives the same raw vectors (one step alone vs
    # batched with other inputs in the server).
    path = [a for a in bert.args if a.endswith(".gguf")][0]
    out = subprocess.run([BIN, "embed", "-m", path, "--json", "--embd-normalize", "-1", "-t", "2",
                          *sum((["-p", t] for t in TEXTS), [])], check=True, capture_output=True,
                         text=True).stdout
    cli = json.loads(out)["data"]
    for a, b in zip(cli, r):
        np.testing.assert_allclose(a["embedding"], b["embedding"][0], rtol=1e-5, atol=1e-6)


def test_ollama_client_embed_and_legacy_embeddings(bert):
    import ollama
    c = ollama.Client(host=bert.url)
    e = c.embed(model="bert", input=TEXTS[:2])
    assert len(e["embeddings"]) == 2 and len(e["embeddings"][0]) == 128
    assert abs(np.linalg.norm(e["embeddings"][0]) - 1.0) < 1e-5
    legacy = c.embeddings(model="bert", prompt=TEXTS[0])["embedding"]
    np.testing.assert_allclose(unit(legacy), e["embeddings"][0], atol=1e-6)  # raw there


def test_ollama_truncate(bert):
    long = " ".join(["word"] * 700)  # > 512 positions
    ok = post(bert, "/api/embed", {"input": long})
    assert ok.status_code == 200 and len(ok.json()["embeddings"][0]) == 128
    refused = post(bert, "/api/embed", {"input": long, "truncate": False})
    assert refused.status_code == 400 and "context" in refused.json()["error"]


def test_litellm_embedding(bert):
    litellm = pytest.importorskip("litellm")
    r = litellm.embedding(model="openai/bert", api_base=bert.url + "/v1", api_key="x",
                          input=TEXTS[:2])
    assert len(r.data) == 2 and len(r.data[0]["embedding"]) == 128


def test_langchain_openai_embeddings(bert):
    lc = pytest.importorskip("langchain_openai")
    emb = lc.OpenAIEmbeddings(model="bert", base_url=bert.url + "/v1", api_key="x",
                              check_embedding_ctx_length=False)
    docs = emb.embed_documents(TEXTS[:3])
    q = emb.embed_query(TEXTS[2])
    assert len(docs) == 3 and len(q) == 128
    np.testing.assert_allclose(q, docs[2], atol=1e-6)


def send_request(server, path, body):
    """Writes one whole POST on a new connection without reading the answer."""
    payload = json.dumps(body).encode()
    head = (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n").encode()
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=120)
    sock.sendall(head + payload)
    return sock


def read_answer(sock):
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    sock.close()
    status, _, rest = data.partition(b"\r\n")
    assert b" 200 " in status, status
    return json.loads(rest.partition(b"\r\n\r\n")[2])


def test_concurrent_requests_share_steps_and_match(bert):
    """Requests that wait together share embedding steps. So that they do wait together
    whatever the machine's load (a lone small request is done in about a millisecond, before
    the next one is even parsed), a long request keeps the engine busy first: once it has
    started, the 16 small ones are sent, and they queue behind it."""
    want = post(bert, "/v1/embeddings", {"input": TEXTS}).json()["data"]
    long_inputs = [" ".join(["word"] * 480)] * 96  # a few to an engine step
    steps_of = lambda m: m["hablar_embedding_steps_total"]
    before = bert.metrics()
    post(bert, "/v1/embeddings", {"input": long_inputs})
    long_alone = steps_of(bert.metrics()) - steps_of(before)
    assert long_alone >= 12

    before = bert.metrics()
    long_sock = send_request(bert, "/v1/embeddings", {"input": long_inputs})
    deadline = time.time() + 60
    while steps_of(bert.metrics()) == steps_of(before):  # the long request has started
        assert time.time() < deadline
        time.sleep(0.002)
    socks = [send_request(bert, "/v1/embeddings", {"input": TEXTS}) for _ in range(16)]
    results = [read_answer(s) for s in socks]
    assert len(read_answer(long_sock)["data"]) == len(long_inputs)
    for got in results:
        for a, b in zip(got["data"], want):
            np.testing.assert_allclose(a["embedding"], b["embedding"], atol=1e-7)
    after = bert.metrics()
    assert after["hablar_requests_total"] - before["hablar_requests_total"] == 17
    inputs = after["hablar_embedding_inputs_total"] - before["hablar_embedding_inputs_total"]
    steps = steps_of(after) - steps_of(before)
    assert inputs == len(long_inputs) + 16 * len(TEXTS)
    assert steps < long_alone + 16, (steps, long_alone)  # inputs of several requests per step


def test_empty_text_is_embedded_as_its_added_tokens(bert):
    # llama-server's behaviour (its tests: "do not crash on empty input"): [CLS] [SEP].
    empty = post(bert, "/v1/embeddings", {"input": ""})
    assert empty.status_code == 200 and empty.json()["usage"]["prompt_tokens"] == 2
    assert len(empty.json()["data"][0]["embedding"]) == 128


def test_errors_are_400s(bert):
    assert post(bert, "/v1/embeddings", {"input": []}).status_code == 400
    assert post(bert, "/v1/embeddings", {}).status_code == 400
    assert post(bert, "/v1/embeddings", {"input": "x", "encoding_format": "hex"}).status_code == 400
    assert post(bert, "/v1/embeddings", {"input": "x", "dimensions": 4096}).status_code == 400
    assert post(bert, "/v1/embeddings", {"input": [10 ** 9]}).status_code == 400
    long = post(bert, "/v1/embeddings", {"input": " ".join(["word"] * 700)})
    assert long.status_code == 400 and "too large for the context of 512" in long.json()["error"]["message"]
    chat = post(bert, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]})
    assert chat.status_code == 400 and "encoder" in chat.json()["error"]["message"]
    assert post(bert, "/v1/rerank", {"query": "q", "documents": ["d"]}).status_code == 501


def rounds_as_golden_oracle():
    """Whether hablar's CPU kernels sum float dot products as the golden files' oracle did.

    The goldens come from a llama.cpp build with AVX-512 (16-lane F16/F32 sums), which hablar's
    AVX-512 kernels reproduce; without AVX-512 the sums run in 8-lane order and a reranker's
    scores move by up to ~5e-4 (tests/unit/model/model_test_util.h says the same)."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((ln.split(":", 1)[1].split() for ln in f if ln.startswith("flags")), [])
    except OSError:
        return False
    return {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni"} <= set(flags)


def test_rerank_matches_llama_cpp_order(reranker):
    golden = json.loads((REPO / "tests/golden/embedding/bert-rank-f16.json").read_text())["rerank"]
    r = post(reranker, "/v1/rerank", {"query": golden["query"], "documents": golden["documents"],
                                      "return_documents": True})
    assert r.status_code == 200, r.text
    results = r.json()["results"]
    scores = golden["scores"]
    want = sorted(range(len(scores)), key=lambda i: -scores[i])
    got_rank = {x["index"]: place for place, x in enumerate(results)}
    assert sorted(got_rank) == list(range(len(scores))) and len(results) == len(scores)
    # Every pair llama.cpp's scores set apart by more than this CPU's rounding may move them
    # (nothing where it rounds as the oracle did: then the whole order) keeps its order.
    tol = 0.0 if rounds_as_golden_oracle() else 2e-3
    for a in range(len(scores)):
        for b in range(len(scores)):
            if scores[a] - scores[b] > tol:
                assert got_rank[a] < got_rank[b], (a, b, results)
    for x in results:
        assert abs(x["relevance_score"] - scores[x["index"]]) < max(1e-3, tol)
        assert x["document"]["text"] == golden["documents"][x["index"]]
    top = post(reranker, "/rerank", {"query": golden["query"], "documents": golden["documents"],
                                     "top_n": 2}).json()["results"]
    assert [x["index"] for x in top] == want[:2] and "document" not in top[0]
    # A reranker does not give embeddings.
    assert post(reranker, "/v1/embeddings", {"input": "x"}).status_code == 400


def test_rerank_in_text_embeddings_inference_shape(reranker):
    """TEI's request ({query, texts}) gets TEI's answer: a bare list, best first, scores through
    a sigmoid unless raw_scores; text with return_text; top_n applies."""
    golden = json.loads((REPO / "tests/golden/embedding/bert-rank-f16.json").read_text())["rerank"]
    plain = post(reranker, "/rerank", {"query": golden["query"], "documents": golden["documents"]})
    logits = {x["index"]: x["relevance_score"] for x in plain.json()["results"]}
    tei = post(reranker, "/rerank", {"query": golden["query"], "texts": golden["documents"],
                                     "return_text": True})
    assert tei.status_code == 200, tei.text
    body = tei.json()
    assert isinstance(body, list) and len(body) == len(golden["documents"])
    assert [x["index"] for x in body] == [x["index"] for x in plain.json()["results"]]
    for x in body:
        assert set(x) == {"index", "score", "text"} and x["text"] == golden["documents"][x["index"]]
        assert abs(x["score"] - 1 / (1 + np.exp(-logits[x["index"]]))) < 1e-6
    raw = post(reranker, "/rerank", {"query": golden["query"], "texts": golden["documents"],
                                     "raw_scores": True, "top_n": 2}).json()
    assert len(raw) == 2 and all(set(x) == {"index", "score"} for x in raw)
    assert all(abs(x["score"] - logits[x["index"]]) < 1e-6 for x in raw)


def test_generative_model_needs_embedding_flag(server):
    r = post(server, "/v1/embeddings", {"input": "hello"})
    assert r.status_code == 501 and "--embedding" in r.json()["error"]["message"]


def test_decoder_embedder_serves_embeddings_and_chat():
    s = ServerProcess("--embedding", "--pooling", "last", "-t", "2", "-c", "1024").wait_ready()
    try:
        r = post(s, "/v1/embeddings", {"input": ["hello", "goodbye"]})
        assert r.status_code == 200, r.text
        vs = [d["embedding"] for d in r.json()["data"]]
        assert len(vs[0]) == 576 and abs(np.linalg.norm(vs[0]) - 1) < 1e-5
        assert np.dot(vs[0], vs[1]) < 0.9999
        chat = post(s, "/v1/chat/completions",
                    {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
        assert chat.status_code == 200
    finally:
        s.stop()


def test_every_prompt_form_llama_server_reads(bert):
    """Texts, ids, ids mixed with texts, {prompt_string} and {content: [text parts]} objects,
    alone or in lists: each form embeds as the same text given plainly."""
    ids = requests.post(bert.url + "/tokenize", json={"content": "hello world",
                                                      "add_special": True}).json()["tokens"]
    plain = post(bert, "/v1/embeddings", {"input": "hello world"}).json()["data"][0]["embedding"]
    forms = [ids, {"prompt_string": "hello world"},
             {"content": [{"type": "text", "text": "hello "}, {"type": "text", "text": "world"}]}]
    for form in forms:
        r = post(bert, "/v1/embeddings", {"input": form})
        assert r.status_code == 200, (form, r.text)
        np.testing.assert_allclose(r.json()["data"][0]["embedding"], plain, atol=1e-6)
    many = post(bert, "/v1/embeddings", {"input": ["hello world", *forms]}).json()["data"]
    assert len(many) == 4
    for d in many:
        np.testing.assert_allclose(d["embedding"], plain, atol=1e-6)
    # ids and text in one list are one prompt
    mixed = post(bert, "/v1/embeddings", {"input": [ids[0], "hello", ids[-1]]})
    assert mixed.status_code == 200 and len(mixed.json()["data"]) == 1


def test_prompt_forms_that_are_refused(bert):
    for bad in [[], {"content": "text"}, {"content": [{"type": "unknown"}]},
                {"content": [{"type": "image_url", "image_url": {"url": "data:,"}}]},
                {"prompt_string": "x", "multimodal_data": ["AAAA"]}, {"other": 1}]:
        r = post(bert, "/v1/embeddings", {"input": bad})
        assert r.status_code == 400, (bad, r.text)
        assert r.json()["error"]["message"]
    long = post(bert, "/v1/embeddings", {"input": "word " * 5000})
    assert long.status_code == 400 and "too large" in long.json()["error"]["message"]
