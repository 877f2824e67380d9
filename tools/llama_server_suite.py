#!/usr/bin/env python3
"""Runs llama.cpp's own server test suite (tools/server/tests in the llama-cpp-python sdist)
against `hablar serve`: a measure of llama-server compatibility by tests no one here wrote.

The suite starts its server through LLAMA_SERVER_BIN_PATH; this points it at a wrapper that
runs `hablar serve` with every flag as given, except the model's location: the suite's
models come from the Hugging Face hub (--hf-repo/--hf-file), which this machine does not
reach, so each of its small preset models is replaced by a stand-in of the same kind made by
`hablar make-model` (random weights: a Llama over Llama's SentencePiece vocabulary for the
stories260K models, one over a vocabulary with FIM tokens for infill, a BERT encoder over
the bge vocabulary, a BERT reranker, a Mixtral-shaped MoE), and any other hub model by the
default model (SmolLM2-135M-Instruct). Tests that assert the hub models' exact text or token
counts fail for that reason alone; the rest measure the server. The suite's session fixture
that downloads every model is turned into a no-op.

    .venv/bin/python tools/llama_server_suite.py [--sdist PATH] [--fetch] [pytest args, e.g. -k chat]
    (default files: the ones that need no multimodal, router or LoRA model)
    .venv/bin/python tools/llama_server_suite.py --fetch --passing tests/compat/llama_server_passing.txt
    (CI: only the tests hablar passes, listed by node id; any failure among them is a
    regression of llama-server compatibility)

Needs the sdist (pip download --no-deps --no-binary :all: llama-cpp-python==0.3.36) and
the suite's requirements (pytest, requests, openai, aiohttp, prometheus-client, wget,
filelock, numpy) in the Python that runs it.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
HOME = Path(os.environ.get("HABLAR_HOME", Path.home() / ".cache" / "hablar"))
DEFAULT_FILES = [
    "test_basic.py", "test_completion.py", "test_chat_completion.py", "test_tokenize.py",
    "test_security.py", "test_metrics.py", "test_ctx_shift.py", "test_infill.py",
    "test_template.py", "test_compat_anthropic.py", "test_compat_oai_responses.py",
    "test_ignore_eos.py", "test_embedding.py", "test_tool_call.py", "test_stream.py",
    "test_compat_gcp.py", "test_sleep.py", "test_rerank.py", "test_speculative.py",
]

# The suite's preset hub models -> (file name, `hablar make-model` arguments).
STAND_INS = {
    "ggml-org/test-model-stories260K":
        ("stories260K.gguf", ["--arch", "llama", "--shape", "tiny", "--vocab", "ggml-vocab-llama-spm.gguf"]),
    "ggml-org/test-model-stories260K-infill":
        ("infill.gguf", ["--arch", "llama", "--shape", "tiny", "--vocab", "ggml-vocab-deepseek-coder.gguf"]),
    "ggml-org/models/bert-bge-small/ggml-model-f16.gguf":
        ("bge.gguf", ["--arch", "bert", "--shape", "bert-tiny", "--vocab", "ggml-vocab-bert-bge.gguf"]),
    "ggml-org/models/jina-reranker-v1-tiny-en/ggml-model-f16.gguf":
        ("rerank.gguf", ["--arch", "bert", "--shape", "bert-tiny", "--rank-head",
                         "--vocab", "ggml-vocab-bert-bge.gguf"]),
    "ggml-org/stories15M_MOE/stories15M_MOE-F16.gguf":
        ("moe.gguf", ["--arch", "mixtral", "--shape", "tiny", "--vocab", "ggml-vocab-llama-spm.gguf"]),
}
# Files tests fetch themselves into tests/tmp (download_file skips one already there).
DOWNLOADS = {
    "stories15M-q4_0.gguf":  # the draft model of test_speculative.py
        ["--arch", "llama", "--shape", "tiny", "--type", "q4_0", "--vocab", "ggml-vocab-llama-spm.gguf"],
}

WRAPPER = """#!/usr/bin/env python3
import os, sys
stand_ins, default = {stand_ins!r}, {model!r}
args, out, repo, file, i = sys.argv[1:], [], None, None, 0
while i < len(args):
    if args[i] in ("--hf-repo", "-hf", "-hfr", "--model-url", "-mu"):
        repo = args[i + 1]
        i += 2
    elif args[i] in ("--hf-file", "-hff"):
        file = args[i + 1]
        i += 2
    elif args[i] == "--offline":
        i += 1
    else:
        out.append(args[i])
        i += 1
if repo and "--model" not in out and "-m" not in out:
    out = ["--model", stand_ins.get(repo + "/" + file if file else repo, default)] + out
os.execv({binary!r}, ["hablar", "serve"] + out)
"""


def make_model(binary: str, testdata: Path, make_args: list[str], path: Path) -> None:
    if not path.exists():
        args = [str(testdata / "vocab" / a) if a.endswith(".gguf") else a for a in make_args]
        subprocess.run([binary, "make-model", *args, "--seed", "1", "-o", str(path)],
                       check=True, capture_output=True)


def make_stand_ins(binary: str, testdata: Path, into: Path, tests: Path) -> dict[str, str]:
    """Writes the stand-in models once (kept in `into`) and the files tests download into
    tests/tmp; returns hub name -> path."""
    into.mkdir(parents=True, exist_ok=True)
    paths = {}
    for name, (file, make_args) in STAND_INS.items():
        make_model(binary, testdata, make_args, into / file)
        paths[name] = str(into / file)
    (tests / "tmp").mkdir(exist_ok=True)
    for file, make_args in DOWNLOADS.items():
        make_model(binary, testdata, make_args, into / file)
        shutil.copy(into / file, tests / "tmp" / file)
    return paths


def unpack(sdist: Path, into: Path) -> Path:
    """The sdist's llama.cpp tree (tests at tools/server/tests, templates at models/)."""
    with tarfile.open(sdist) as tar:
        members = [m for m in tar.getmembers()
                   if "/vendor/llama.cpp/tools/server/tests/" in m.name
                   or "/vendor/llama.cpp/models/templates/" in m.name]
        tar.extractall(into, members=members, filter="data")
    return next(into.glob("*/vendor/llama.cpp"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sdist", type=Path, default=HOME / "llama_cpp_python-0.3.36.tar.gz")
    ap.add_argument("--bin", default=os.environ.get("HABLAR_BIN",
                                                    str(REPO / "build" / "src" / "cli" / "hablar")))
    ap.add_argument("--model", default=str(HOME / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--fetch", action="store_true",
                    help="download the sdist from PyPI (pip) when it is not there yet")
    ap.add_argument("--passing", type=Path,
                    help="run only the node ids listed in this file (one per line, # comments)")
    args, pytest_args = ap.parse_known_args()
    if not args.sdist.exists() and args.fetch:
        args.sdist.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary",
                        ":all:", "llama-cpp-python==0.3.36", "-d", str(args.sdist.parent)],
                       check=True)
    if not args.sdist.exists():
        print(f"no sdist at {args.sdist}: pip download --no-deps --no-binary :all: "
              f"llama-cpp-python==0.3.36 -d {args.sdist.parent}", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="llama-suite-"))
    try:
        root = unpack(args.sdist, work)
        tests = root / "tools" / "server" / "tests"
        conftest = tests / "conftest.py"
        conftest.write_text(conftest.read_text().replace("ServerPreset.load_all()", "pass"))
        wrapper = tests / "hablar-server"
        binary = str(Path(args.bin).resolve())
        testdata = Path(os.environ.get("HABLAR_TESTDATA", REPO.parent / "shared" / "testdata"))
        stand_ins = make_stand_ins(binary, testdata, HOME / "llama-suite-models", tests)
        wrapper.write_text(WRAPPER.format(stand_ins=stand_ins, model=args.model, binary=binary))
        wrapper.chmod(0o755)
        files = [a for a in pytest_args if a.endswith(".py")] or \
            [f"unit/{f}" for f in DEFAULT_FILES]
        if args.passing:
            files = [line.strip() for line in args.passing.read_text().splitlines()
                     if line.strip() and not line.startswith("#")]
        rest = [a for a in pytest_args if not a.endswith(".py")]
        env = {**os.environ, "LLAMA_SERVER_BIN_PATH": str(wrapper)}
        return subprocess.call([sys.executable, "-m", "pytest", "-q", "-rf", "-p",
                                "no:cacheprovider", *files, *rest], cwd=tests, env=env)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
