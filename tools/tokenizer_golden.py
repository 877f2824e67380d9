#!/usr/bin/env python3
"""Tokenizer parity with llama.cpp (llama-cpp-python, vocab_only) and the golden files.

Run with a Python that has llama-cpp-python (e.g. /root/.cache/hablar/oracle-venv/bin/python).

  tokenizer_golden.py parity BENCH_BIN     full corpus: our ids (tokenizer_bench --dump)
                                           against llama.cpp's, document by document, for
                                           every vocabulary; prints the counts
  tokenizer_golden.py write                writes tests/golden/tokenizer/<vocab>.txt: the
                                           oracle's ids for a slice of the corpus, for
                                           invalid UTF-8 inputs, and for texts with special
                                           tokens (add_special + parse_special)

Golden file format (text): a header line `vocab NAME` (NAME a file in the shared vocab
folder, or `default-model`), then records of two lines each:
  `doc N plain` | `hex HEX plain` | `hex HEX special`
  the ids, space-separated (possibly empty)
"""
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VOCAB_DIR = os.environ.get("HABLAR_TESTDATA", os.path.join(ROOT, "..", "shared", "testdata"))
VOCAB_DIR = os.path.join(VOCAB_DIR, "vocab")
DEFAULT_MODEL = os.path.expanduser("~/.cache/hablar/models/SmolLM2-135M-Instruct.Q4_1.gguf")
CORPUS = os.path.join(ROOT, "tests", "data", "tokenizer-corpus", "corpus.txt")
GOLDEN_DIR = os.path.join(ROOT, "tests", "golden", "tokenizer")
DOC_SEPARATOR = "\n__hablar_corpus_doc__\n"
SLICE_STRIDE = 32  # every 32nd document goes into the golden files

VOCABS = ["bert-bge", "deepseek-coder", "deepseek-llm", "falcon", "gpt-2", "llama-bpe",
          "llama-spm", "mpt", "phi-3", "qwen2", "refact", "starcoder"]

INVALID_UTF8 = [
    b"a\xffb", b"\xe4\xb8", b"\xe4\xb8x", b"\xc3(", b"\xed\xa0\x80", b"\xc0\x80", b"\xc1\xbf",
    b"\xf0\x9f\x98", b"\xf0\x9f\x98 x", b"\x80\x80abc", b"abc\xe4", b" \xe4ab c", b"\xfe\xff",
    b"hello \xf8\x88\x80\x80\x80 world", b"\xe2\x82", b"caf\xe9 na\xefve", b"\xa0\xa1",
    b"\xef\xbf\xbd", b"\xe0\x80\xaf", b"x\xdf", b"\t\xc2\n",
]


def vocab_paths():
    out = [(v, os.path.join(VOCAB_DIR, f"ggml-vocab-{v}.gguf")) for v in VOCABS]
    out.append(("default-model", DEFAULT_MODEL))
    return out


def header_name(name):
    return "default-model" if name == "default-model" else f"ggml-vocab-{name}.gguf"


def load_docs():
    with open(CORPUS, encoding="utf-8", newline="") as f:
        return f.read().split(DOC_SEPARATOR)


def oracle(path):
    import llama_cpp
    return llama_cpp.Llama(model_path=path, vocab_only=True, verbose=False)


def special_texts(llm):
    """Texts that mix the vocabulary's own special tokens with plain text."""
    import llama_cpp
    vocab = llama_cpp.llama_model_get_vocab(llm._model.model)
    n = llama_cpp.llama_vocab_n_tokens(vocab)
    specials = []
    for i in range(n):
        attr = llama_cpp.llama_vocab_get_attr(vocab, i)
        if attr & (llama_cpp.LLAMA_TOKEN_ATTR_CONTROL | llama_cpp.LLAMA_TOKEN_ATTR_USER_DEFINED):
            text = llama_cpp.llama_vocab_get_text(vocab, i)
            if text and len(specials) < 8:
                specials.append(text.decode("utf-8", "replace"))
    texts = ["Hello world", " leading space", ""]
    joined = "".join(f"{s}Hi there {s} \n{s}  x" for s in specials)
    texts.append(joined)
    texts.append("<|im_start|>user\nWhat's 2+2?<|im_end|>\n<|im_start|>assistant\n")
    texts.append("<s>[INST] Tell me a joke [/INST] Sure</s>")
    texts.append("<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>")
    return [t.encode() for t in texts]


def write_golden():
    os.makedirs(GOLDEN_DIR, exist_ok=True)
    docs = load_docs()
    for name, path in vocab_paths():
        llm = oracle(path)
        lines = [f"vocab {header_name(name)}"]
        for i in range(0, len(docs), SLICE_STRIDE):
            ids = llm.tokenize(docs[i].encode(), add_bos=False, special=False)
            lines += [f"doc {i} plain", " ".join(map(str, ids))]
        for raw in INVALID_UTF8:
            ids = llm.tokenize(raw, add_bos=False, special=False)
            lines += [f"hex {raw.hex()} plain", " ".join(map(str, ids))]
        for raw in special_texts(llm):
            ids = llm.tokenize(raw, add_bos=True, special=True)
            lines += [f"hex {raw.hex()} special", " ".join(map(str, ids))]
        out = os.path.join(GOLDEN_DIR, f"{name}.txt")
        with open(out, "w") as f:
            f.write("\n".join(lines) + "\n")
        print(f"{name}: {(len(lines) - 1) // 2} records -> {os.path.relpath(out, ROOT)}")


def parity(bench_bin):
    docs = load_docs()
    total_bytes = sum(len(d.encode()) for d in docs)
    print(f"corpus: {len(docs)} documents, {total_bytes} bytes")
    failures = 0
    for name, path in vocab_paths():
        llm = oracle(path)
        with tempfile.NamedTemporaryFile(suffix=".ids") as tmp:
            subprocess.run([bench_bin, path, CORPUS, "--repeat", "1", "--dump", tmp.name],
                           check=True, stdout=subprocess.DEVNULL)
            ours = open(tmp.name).read().split("\n")
        same = 0
        first_bad = None
        for i, d in enumerate(docs):
            want = " ".join(map(str, llm.tokenize(d.encode(), add_bos=False, special=False)))
            if ours[i] == want:
                same += 1
            elif first_bad is None:
                first_bad = i
        failures += len(docs) - same
        msg = f"{name:16s} {same}/{len(docs)} documents identical"
        if first_bad is not None:
            msg += f" (first difference in document {first_bad})"
        print(msg, flush=True)
    return 1 if failures else 0


def main():
    if len(sys.argv) >= 2 and sys.argv[1] == "write":
        write_golden()
        return 0
    if len(sys.argv) >= 3 and sys.argv[1] == "parity":
        return parity(sys.argv[2])
    sys.exit(__doc__)


if __name__ == "__main__":
    sys.exit(main())
