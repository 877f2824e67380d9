#!/usr/bin/env python3
"""llama.cpp's ids for every pre-tokenizer name, on a corpus of tricky texts.

Run with a Python that has llama-cpp-python (e.g. ~/.cache/hablar/oracle-venv/bin/python):

  pretokenizer_oracle.py write     writes tests/golden/tokenizer/pretokenizers.json
  pretokenizer_oracle.py shipped   writes tests/golden/tokenizer/llama-shipped-vocabs.json:
                                   llama.cpp's ids on the same texts for the vocabularies
                                   of llama.cpp's models/ folder that the shared test data
                                   lacks (LLAMA_CPP_MODELS, default the vendored tree)

For each name, the Llama 3 vocabulary of the shared test data (cut, see prune) is relabelled with
tokenizer.ggml.pre = NAME (byte-level names), or first turned into a raw UTF-8 vocabulary
(names whose BPE runs over raw UTF-8 with U+2581 for spaces, see raw_vocab), then llama.cpp
tokenizes every text (no BOS/EOS, special tokens not parsed). The test
(tests/unit/tokenizer/pretokenizer_golden_test.cpp) builds the same vocabularies in memory.

Golden file (JSON): {"vocab": base file name, "texts": [...],
  "names": {NAME: {"raw": bool, "ids": [[...] per text]} or {"raw": bool, "same_as": NAME}},
  "ugm": {"vocab": ..., "variants": {VARIANT: [[...] per text]}}}

The "ugm" section is the Unigram tokenizer (tokenizer.ggml.model "t5"): the SentencePiece
vocabulary of the shared test data relabelled "t5" (no charsmap: the shared data has no
Unigram vocabulary), as it is ("plain") and with add_space_prefix and
remove_extra_whitespaces set ("spaces").
"""
import json
import os
import struct
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VOCAB_DIR = os.path.join(os.environ.get("HABLAR_TESTDATA", os.path.join(ROOT, "..", "shared",
                                                                        "testdata")), "vocab")
BASE = "ggml-vocab-llama-bpe.gguf"
CORPUS = os.path.join(ROOT, "tests", "data", "tokenizer-corpus", "corpus.txt")
GOLDEN = os.path.join(ROOT, "tests", "golden", "tokenizer", "pretokenizers.json")
SHIPPED = os.path.join(ROOT, "tests", "golden", "tokenizer", "llama-shipped-vocabs.json")
LLAMA_MODELS = os.environ.get("LLAMA_CPP_MODELS", "/work/llamacpp/llama_cpp_python-0.3.36/"
                              "vendor/llama.cpp/models")
# The base vocabulary is cut to its first tokens and merges, so that the test can build
# ninety-odd tokenizers from it in seconds (both sides cut it the same way).
KEEP_TOKENS = 32000
KEEP_MERGES = 31000

# Every tokenizer.ggml.pre value of llama.cpp's llama-vocab.cpp (the BPE branch).
NAMES = [
    "default", "minicpm5", "llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral",
    "midm-2.0", "lfm2", "jina-v5-nano", "deepseek-llm", "deepseek-coder", "deepseek-v3",
    "spark2_5", "youtu", "falcon", "mpt", "starcoder", "gpt-2", "phi-2", "jina-es", "jina-de",
    "gigachat", "jina-v2-es", "jina-v2-de", "a.x-4.0", "mellum", "modern-bert", "jais-2",
    "gemma4", "granite-embed-multi-311m", "sarvam-moe", "jina-v1-en", "jina-v2-code",
    "roberta-bpe", "whitespace", "refact", "command-r", "qwen2", "deepseek-r1-qwen", "kormo",
    "f2llmv2", "qwen35", "stablelm2", "olmo", "dbrx", "smaug-bpe", "poro-chat", "chatglm-bpe",
    "glm4", "glm5", "viking", "jais", "tekken", "smollm", "codeshell", "bloom", "gpt3-finnish",
    "exaone", "exaone4", "exaone-moe", "chameleon", "minerva-7b", "megrez", "gpt-4o", "llama4",
    "kanana2", "talkie", "granite-embed-multi-97m", "tiny_aya", "cohere2moe", "superbpe",
    "trillion", "granite-docling", "bailingmoe", "bailingmoe2", "llada-moe", "seed-coder",
    "hunyuan", "hunyuan-dense", "hy_v4", "joyai-llm", "kimi-k2", "ufakzeka", "grok-2", "afmoe",
    "laguna", "minimax-m2", "solar-open", "mellum2",
]
# Names whose BPE runs over raw UTF-8 (no GPT-2 byte alphabet).
RAW_NAMES = {"gemma4", "granite-embed-multi-311m", "sarvam-moe", "whitespace"}

TEXTS = [
    "Hello world", " Hello World", "HELLO", "hello", "HeLLo WoRLD camelCaseWord XMLHttpRequest",
    "I'm sure you're right, we'll see. He'd've SAID IT'S fine; DON'T", "'s 'T 're 'VE",
    "1", "12", "123", "1234", "12345", "123456", "1234567", "12345678901234567890",
    "3.14159 and 1,000,000 and -42 and 1e10", "٣٤٥ ١٢٣٤ ²³ ½ Ⅻ", "x1234y 99bottles",
    "    four leading", "a  b   c    d", "tab\there\t\tx", "trailing spaces   ",
    "line\nbreak\n\n\nthree\r\nCRLF\r\r", "\n", "\n\n", " \n ", "   \n\n  x",
    "中文字符测试，你好！我爱北京天安门。", "日本語のテキスト、カタカナとひらがな。", "한국어 텍스트 입니다",
    "ไทย ภาษา", "ខ្មែរ", "Ελληνικά Κείμενα", "Русский текст, ПРИВЕТ", "العربية، نص۔ हिन्दी। पाठ",
    "café naïve résumé Ångström", "e\u0301 a\u0300\u0301 \u0915\u093f", "ǅungla ǈ ǋ",
    "emoji 😀🎉 👍🏽 👨‍👩‍👧 🇫🇷", "\u00a0nbsp\u00a0\u3000ideographic\u2003em space",
    "def foo(x):\n    return x**2 + 1  # comment\n", "if (a && b) { c[i] = d->e; } // done",
    "<sentinel:12> IMGIMGABCZ <html>&amp;</html>", "$var += 10; @user #tag ~tilde `tick` ^caret|",
    "...!!! ??? ,,, ;; -- __ ** //", "…。，、।۔،", "“quotes” ‘single’ — dash – en",
    "Mixed中文English123数字", "ABC中DEF", "x" + " " * 520 + "y", "0x1F 0b101 1_000",
    "https://example.com/path?q=1&r=2#frag", "e-mail: someone@example.org",
]


def load_docs():
    with open(CORPUS, encoding="utf-8", newline="") as f:
        docs = f.read().split("\n__hablar_corpus_doc__\n")
    # A few corpus documents, cut to 800 characters, for wider coverage.
    return [docs[i][:800] for i in range(0, len(docs), 71)]


# ---- a minimal GGUF reader/writer (vocabulary files have no tensors) -----------------------

SCALAR = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q",
          12: "d"}


def read_gguf(path):
    data = open(path, "rb").read()
    pos = 0

    def take(fmt):
        nonlocal pos
        v = struct.unpack_from("<" + fmt, data, pos)
        pos += struct.calcsize("<" + fmt)
        return v[0]

    def string():
        nonlocal pos
        n = take("Q")
        s = data[pos:pos + n]
        pos += n
        return s

    def value(t):
        if t == 8:
            return string()
        if t == 9:
            et, n = take("I"), take("Q")
            return (et, [value(et) for _ in range(n)])
        return take(SCALAR[t])

    assert data[:4] == b"GGUF"
    pos = 4
    version, n_tensors, n_kv = take("I"), take("Q"), take("Q")
    assert n_tensors == 0, "vocabulary files only"
    kvs = []
    for _ in range(n_kv):
        key = string().decode()
        t = take("I")
        kvs.append((key, t, value(t)))
    return version, kvs


def write_gguf(path, version, kvs):
    out = bytearray(b"GGUF")
    out += struct.pack("<IQQ", version, 0, len(kvs))

    def put(t, v):
        if t == 8:
            out.extend(struct.pack("<Q", len(v)) + v)
        elif t == 9:
            et, items = v
            out.extend(struct.pack("<IQ", et, len(items)))
            for item in items:
                put(et, item)
        else:
            out.extend(struct.pack("<" + SCALAR[t], v))

    for key, t, v in kvs:
        k = key.encode()
        out += struct.pack("<Q", len(k)) + k + struct.pack("<I", t)
        put(t, v)
    out += b"\0" * (-len(out) % 32)
    open(path, "wb").write(out)


def byte_decoder():
    """GPT-2's byte alphabet: printable stand-in character -> byte."""
    bs = list(range(0x21, 0x7F)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def to_raw(text, dec):
    """A byte-level token text as raw UTF-8 with U+2581 for spaces; None if not UTF-8."""
    if any(c not in dec for c in text):
        return None
    try:
        s = bytes(dec[c] for c in text).decode("utf-8")
    except UnicodeDecodeError:
        return None
    return s.replace(" ", "\u2581")


def raw_vocab(kvs):
    """The byte-level vocabulary over raw UTF-8: in id order, a token whose bytes are UTF-8 becomes
    that text (spaces as U+2581) unless an earlier token has it; otherwise it keeps its text,
    or if that is taken too becomes "<dupID>" (llama.cpp wants unique texts). 256 <0xXX>
    byte tokens are appended; merges whose both sides decode are kept, converted."""
    dec = byte_decoder()
    out = []
    for key, t, v in kvs:
        if key == "tokenizer.ggml.tokens":
            et, items = v
            conv, used = [], set()
            for i, b in enumerate(items):
                r = to_raw(b.decode("utf-8"), dec)
                text = r.encode() if r is not None and r.encode() not in used else b
                if text in used:
                    text = f"<dup{i}>".encode()
                used.add(text)
                conv.append(text)
            conv += [f"<0x{i:02X}>".encode() for i in range(256)]
            assert not used.intersection(conv[len(items):])
            v = (et, conv)
        elif key == "tokenizer.ggml.token_type":
            et, items = v
            v = (et, items + [6] * 256)
        elif key == "tokenizer.ggml.scores":
            et, items = v
            v = (et, items + [0.0] * 256)
        elif key == "tokenizer.ggml.merges":
            et, items = v
            kept = []
            for m in items:
                left, right = m.decode("utf-8").split(" ", 1)
                a, b = to_raw(left, dec), to_raw(right, dec)
                if a is not None and b is not None:
                    kept.append(f"{a} {b}".encode())
            v = (et, kept)
        out.append((key, t, v))
    return out


def prune(kvs):
    """The first KEEP_TOKENS tokens (with their types and scores) and KEEP_MERGES merges."""
    out = []
    for k, t, v in kvs:
        if k in ("tokenizer.ggml.tokens", "tokenizer.ggml.token_type", "tokenizer.ggml.scores"):
            v = (v[0], v[1][:KEEP_TOKENS])
        elif k == "tokenizer.ggml.merges":
            v = (v[0], v[1][:KEEP_MERGES])
        out.append((k, t, v))
    return out


def relabel(kvs, name):
    """kvs with tokenizer.ggml.pre = name; the "whitespace" pre-tokenizer goes with the
    "whitespace" tokenizer model (llama.cpp's BPE asserts on the white space it keeps)."""
    out = []
    for k, t, v in kvs:
        if k == "tokenizer.ggml.pre":
            v = name.encode()
        elif k == "tokenizer.ggml.model" and name == "whitespace":
            v = b"whitespace"
        out.append((k, t, v))
    return out


UGM_BASE = "ggml-vocab-llama-spm.gguf"
UGM_VARIANTS = {"plain": [], "spaces": [("tokenizer.ggml.add_space_prefix", 7, True),
                                         ("tokenizer.ggml.remove_extra_whitespaces", 7, True)]}


def ugm_vocab(kvs, extra):
    out = [(k, t, b"t5" if k == "tokenizer.ggml.model" else v) for k, t, v in kvs]
    return out + extra


def write_ugm(texts, tmp):
    import llama_cpp
    version, kvs = read_gguf(os.path.join(VOCAB_DIR, UGM_BASE))
    variants = {}
    for name, extra in UGM_VARIANTS.items():
        path = os.path.join(tmp, "ugm.gguf")
        write_gguf(path, version, ugm_vocab(kvs, extra))
        llm = llama_cpp.Llama(model_path=path, vocab_only=True, verbose=False)
        variants[name] = [llm.tokenize(t.encode(), add_bos=False, special=False) for t in texts]
        del llm
        print(f"ugm {name:22s} {sum(map(len, variants[name])):6d} ids", flush=True)
    return {"vocab": UGM_BASE, "variants": variants}


def write():
    import llama_cpp
    version, kvs = read_gguf(os.path.join(VOCAB_DIR, BASE))
    kvs = prune(kvs)
    raw_kvs = raw_vocab(kvs)
    texts = TEXTS + load_docs()
    names = {}
    seen = {}  # (raw, ids) -> first name with them
    with tempfile.TemporaryDirectory() as tmp:
        for name in NAMES:
            raw = name in RAW_NAMES
            path = os.path.join(tmp, "vocab.gguf")
            write_gguf(path, version, relabel(raw_kvs if raw else kvs, name))
            llm = llama_cpp.Llama(model_path=path, vocab_only=True, verbose=False)
            ids = [llm.tokenize(t.encode(), add_bos=False, special=False) for t in texts]
            del llm
            key = json.dumps(ids)
            if key in seen:
                names[name] = {"raw": raw, "same_as": seen[key]}
            else:
                seen[key] = name
                names[name] = {"raw": raw, "ids": ids}
            print(f"{name:26s} {sum(map(len, ids)):6d} ids"
                  + (f" (as {names[name]['same_as']})" if "same_as" in names[name] else ""),
                  flush=True)
        ugm = write_ugm(texts, tmp)
    with open(GOLDEN, "w", encoding="utf-8") as f:
        json.dump({"vocab": BASE, "keep_tokens": KEEP_TOKENS, "keep_merges": KEEP_MERGES,
                   "texts": texts, "names": names, "ugm": ugm}, f, ensure_ascii=False,
                  separators=(",", ":"))
        f.write("\n")
    print(f"{len(names)} names, {len(seen)} distinct -> {os.path.relpath(GOLDEN, ROOT)}")


def write_shipped():
    import glob
    import llama_cpp
    texts = TEXTS + load_docs()
    vocabs = {}
    for path in sorted(glob.glob(os.path.join(LLAMA_MODELS, "ggml-vocab-*.gguf"))):
        name = os.path.basename(path)
        if os.path.exists(os.path.join(VOCAB_DIR, name)):
            continue  # covered by tests/golden/tokenizer/<vocab>.txt
        llm = llama_cpp.Llama(model_path=path, vocab_only=True, verbose=False)
        vocabs[name] = [llm.tokenize(t.encode(), add_bos=False, special=False) for t in texts]
        del llm
        print(f"{name:34s} {sum(map(len, vocabs[name])):6d} ids", flush=True)
    with open(SHIPPED, "w", encoding="utf-8") as f:
        json.dump({"texts": texts, "vocabs": vocabs}, f, ensure_ascii=False,
                  separators=(",", ":"))
        f.write("\n")


def main():
    if len(sys.argv) == 2 and sys.argv[1] == "write":
        write()
        return 0
    if len(sys.argv) == 2 and sys.argv[1] == "shipped":
        write_shipped()
        return 0
    sys.exit(__doc__)


if __name__ == "__main__":
    sys.exit(main())
