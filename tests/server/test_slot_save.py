"""Slot save / restore / erase (llama-server's POST /slots/{id}?action=...), black-box.

hablar's slots name token histories over one shared KV cache: saving writes the cached K/V
of the slot's history to a file in --slot-save-path, restoring puts a file's K/V back into the
prefix cache (so a prompt that continues it computes only its new tokens), erasing takes the
history's K/V out of the cache. The file format is docs/slot-files.md.
"""
import os
import struct
import subprocess

import pytest
import requests

from conftest import BIN, TESTDATA, ServerProcess

PROMPT = "What is the capital of France?"
HEADER = 12  # magic, version, payload words


def start(slot_dir, *args):
    return ServerProcess("-np", "2", "-c", "2048", "-t", "2", "--slot-save-path", str(slot_dir),
                         *args).wait_ready()


@pytest.fixture(scope="module")
def slot_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("slots")


@pytest.fixture(scope="module")
def slots(slot_dir):
    s = start(slot_dir)
    yield s
    s.stop()


def complete(server, prompt, **fields):
    body = {"prompt": prompt, "n_predict": 12, "temperature": 0, "ignore_eos": True,
            "return_tokens": True, "cache_prompt": True, **fields}
    r = requests.post(server.url + "/completion", json=body, timeout=300)
    assert r.status_code == 200, r.text
    return r.json()


def action(server, slot, name, body=None):
    url = f"{server.url}/slots/{slot}?action={name}"
    return requests.post(url, json=body, timeout=300) if body is not None else \
        requests.post(url, timeout=300)


def prompt_ids(server, text):
    r = requests.post(server.url + "/tokenize", json={"content": text, "add_special": True})
    return r.json()["tokens"]


def test_save_erase_restore_reuses_the_saved_tokens(slots, slot_dir):
    ids = prompt_ids(slots, PROMPT)
    first = complete(slots, PROMPT, id_slot=1)
    assert first["id_slot"] == 1
    assert first["timings"]["prompt_n"] == len(ids)
    # The history: prompt and generated tokens, but the last (it has no K/V yet).
    r = action(slots, 1, "save", {"filename": "france.bin"})
    assert r.status_code == 200, r.text
    saved = r.json()
    assert saved["id_slot"] == 1 and saved["filename"] == "france.bin"
    assert saved["n_saved"] == len(ids) + 12 - 1
    assert saved["n_written"] == os.path.getsize(slot_dir / "france.bin")
    assert saved["timings"]["save_ms"] >= 0
    assert not [f for f in os.listdir(slot_dir) if f.startswith(".")], "a temporary file was left"
    n_tokens = struct.unpack_from("=I", (slot_dir / "france.bin").read_bytes(), HEADER + 8)[0]
    assert n_tokens == saved["n_saved"]

    # Erased: the same prompt computes every token again.
    r = action(slots, 1, "erase")
    assert r.status_code == 200, r.text
    assert r.json() == {"id_slot": 1, "n_erased": saved["n_saved"]}
    again = complete(slots, PROMPT, id_slot=1)
    assert again["timings"]["prompt_n"] == len(ids)
    assert again["content"] == first["content"]

    # A prompt continuing the saved history, computed cold (after an erase) ...
    longer = ids + first["tokens"]
    assert action(slots, 1, "erase").status_code == 200
    cold = complete(slots, longer, id_slot=1, n_predict=8)
    assert cold["timings"]["prompt_n"] == len(longer)
    assert action(slots, 1, "erase").status_code == 200
    # ... and after restoring the file into slot 0: only its last token is computed, the
    # greedy text is the cold run's.
    r = action(slots, 0, "restore", {"filename": "france.bin"})
    assert r.status_code == 200, r.text
    restored = r.json()
    assert restored["id_slot"] == 0 and restored["n_restored"] == saved["n_saved"]
    assert restored["n_read"] == saved["n_written"] and restored["timings"]["restore_ms"] >= 0
    listing = {s["id"]: s for s in requests.get(slots.url + "/slots").json()}
    assert listing[0]["n_history_tokens"] == saved["n_saved"]
    warm = complete(slots, longer, id_slot=0, n_predict=8)
    assert warm["id_slot"] == 0
    assert warm["timings"]["prompt_n"] == 1
    assert warm["timings"]["cache_n"] == saved["n_saved"]
    assert warm["content"] == cold["content"]


def test_restore_across_a_restart_and_the_plain_token_list(tmp_path):
    s = start(tmp_path)
    try:
        first = complete(s, PROMPT, id_slot=0)
        saved = action(s, 0, "save", {"filename": "keep.bin"}).json()
    finally:
        s.stop()
    # The plain form of the token payload (just the ids, as older llama-servers wrote it).
    data = (tmp_path / "keep.bin").read_bytes()
    words = struct.unpack_from("=I", data, HEADER - 4)[0]
    n = struct.unpack_from("=I", data, HEADER + 8)[0]
    plain = bytearray(data[:HEADER] + data[HEADER + 12:HEADER + 12 + 4 * n] + data[HEADER + 4 * words:])
    struct.pack_into("=I", plain, HEADER - 4, n)
    (tmp_path / "plain.bin").write_bytes(bytes(plain))

    s = start(tmp_path)
    try:
        for name in ("keep.bin", "plain.bin"):
            r = action(s, 1, "restore", {"filename": name})
            assert r.status_code == 200, r.text
            assert r.json()["n_restored"] == saved["n_saved"]
        again = complete(s, PROMPT, id_slot=1)
        # The whole prompt is cached but its last token (kept to compute the next one).
        assert again["timings"]["prompt_n"] == 1
        assert again["content"] == first["content"]
    finally:
        s.stop()


def test_without_slot_save_path_save_and_restore_are_not_supported(server):
    for name in ("save", "restore"):
        r = action(server, 0, name, {"filename": "x.bin"})
        assert r.status_code == 501, r.text
        assert "--slot-save-path" in r.json()["error"]["message"]
    assert action(server, 0, "erase").status_code == 200  # nothing to write: erase works


@pytest.mark.parametrize("filename", ["../x.bin", "a/b.bin", "", ".hidden", "..", "a\\b",
                                      "tab\there", "x" * 300, 5, None])
def test_bad_filenames_are_refused(slots, slot_dir, filename):
    for name in ("save", "restore"):
        r = action(slots, 0, name, {"filename": filename} if filename is not None else {})
        assert r.status_code == 400, (filename, r.text)
    assert not (slot_dir.parent / "x.bin").exists()


@pytest.mark.parametrize("path", ["/slots/2?action=erase", "/slots/-1?action=erase",
                                  "/slots/abc?action=erase", "/slots/?action=erase",
                                  "/slots/0?action=load", "/slots/0", "/slots/0?action="])
def test_bad_slot_ids_and_actions_are_refused(slots, path):
    r = requests.post(slots.url + path, json={"filename": "x.bin"}, timeout=30)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["message"]


def test_id_slot_is_checked_and_reported(slots):
    for bad in (2, -2, "one"):
        r = requests.post(slots.url + "/completion", json={"prompt": "Hi", "n_predict": 1, "id_slot": bad})
        assert r.status_code == 400, r.text
        r = requests.post(slots.url + "/v1/chat/completions", json={
            "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1, "id_slot": bad})
        assert r.status_code == 400, r.text
    r = requests.post(slots.url + "/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, "id_slot": 1})
    assert r.status_code == 200
    # Without one the server picks a slot; the reply names it.
    assert complete(slots, "Hello", n_predict=2)["id_slot"] in (0, 1)
    listing = requests.get(slots.url + "/slots").json()
    assert [s["id"] for s in listing] == [0, 1]
    assert not any(s["is_processing"] for s in listing)


def test_missing_corrupt_truncated_and_foreign_files_are_refused(slots, slot_dir, tmp_path):
    r = action(slots, 0, "restore", {"filename": "never-saved.bin"})
    assert r.status_code == 400 and "no slot file" in r.json()["error"]["message"]
    complete(slots, "The quick brown fox", id_slot=0)
    assert action(slots, 0, "save", {"filename": "good.bin"}).status_code == 200
    good = (slot_dir / "good.bin").read_bytes()
    flipped = bytearray(good)
    flipped[-3] ^= 0x55
    cases = {
        "flipped.bin": bytes(flipped),
        "short.bin": good[: len(good) // 2],
        "header.bin": good[:7],
        "empty.bin": b"",
        "noise.bin": os.urandom(4096),
        "llama.bin": struct.pack("=III", 0x67677371, 1, 1) + struct.pack("=i", 1) + b"\0" * 64,
    }
    for name, data in cases.items():
        (slot_dir / name).write_bytes(data)
        r = action(slots, 0, "restore", {"filename": name})
        assert r.status_code == 400, (name, r.text)
        assert r.json()["error"]["message"], name
    # A file saved by another model of the same shape (other weights) is refused by name.
    other = {}
    for seed in ("1", "2"):
        model = tmp_path / f"tiny-{seed}.gguf"
        subprocess.run([BIN, "make-model", "--arch", "llama", "--shape", "tiny", "--type", "q8_0",
                        "-t", "1", "--seed", seed,
                        "--vocab", str(TESTDATA / "vocab" / "ggml-vocab-llama-spm.gguf"),
                        "-o", str(model)], check=True, capture_output=True)
        other[seed] = model
    s = start(tmp_path, "-m", str(other["1"]))
    try:
        complete(s, "Hello there", id_slot=0)
        assert action(s, 0, "save", {"filename": "tiny.bin"}).status_code == 200
    finally:
        s.stop()
    s = start(tmp_path, "-m", str(other["2"]))
    try:
        r = action(s, 0, "restore", {"filename": "tiny.bin"})
        assert r.status_code == 400 and "another model" in r.json()["error"]["message"], r.text
    finally:
        s.stop()
    (slot_dir / "tiny.bin").write_bytes((tmp_path / "tiny.bin").read_bytes())
    r = action(slots, 0, "restore", {"filename": "tiny.bin"})
    assert r.status_code == 400, r.text
    # The server keeps serving, the good file still restores.
    assert complete(slots, "Hello", n_predict=2)["content"] is not None
    assert action(slots, 1, "restore", {"filename": "good.bin"}).status_code == 200
