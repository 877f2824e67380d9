"""Helpers of the attack suite: the server process class of tests/server (loaded under its
own module name: both folders have a conftest.py), raw-socket exchanges, the check that the
server still serves."""
import importlib.util
import resource
import socket
import time
from pathlib import Path

import requests

_spec = importlib.util.spec_from_file_location(
    "hablar_server_conftest", Path(__file__).resolve().parents[1] / "server" / "conftest.py")
_server_conftest = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_server_conftest)
ServerProcess = _server_conftest.ServerProcess

MSGS = [{"role": "user", "content": "Hi"}]


def raise_fd_limit(want):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = min(hard, max(soft, want))
    resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return target


def still_serving(server):
    """The process is alive and a normal request is served."""
    assert server.proc.poll() is None, "the server died:\n" + server.log()
    r = requests.post(server.url + "/v1/chat/completions",
                      json={"messages": MSGS, "max_tokens": 2, "temperature": 0}, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] is not None


def raw_exchange(server, data: bytes, timeout=5.0):
    """Sends raw bytes; returns everything the server answers until it closes or goes quiet."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=timeout) as s:
        s.sendall(data)
        out = b""
        deadline = time.time() + timeout
        while time.time() < deadline:
            try:
                chunk = s.recv(65536)
            except socket.timeout:
                break
            except ConnectionResetError:
                break
            if not chunk:
                break
            out += chunk
            if b"\r\n\r\n" in out and b"Content-Length: " in out:
                head, _, body = out.partition(b"\r\n\r\n")
                n = int(head.split(b"Content-Length: ")[1].split(b"\r\n")[0])
                if len(body) >= n:
                    break
        return out


def status_of(response: bytes):
    if not response.startswith(b"HTTP/1."):
        return None
    return int(response.split(b" ", 2)[1])
