"""Hugging Face directories as a model source, against the `tokenizers` and `transformers`
oracles (CPU, float32).

The checkpoint is the safetensors twin of the default model: transformers loads the GGUF
(dequantized to float32) and save_pretrained writes it (tools/make_hf_twin.py; cached under
~/.cache/hablar/hf). Tokenizers: the twin's, the shared GGUF vocabularies converted to
tokenizer.json by transformers, and tokenizers trained here on the corpus to cover
WordPiece, WordLevel, Unigram and the normalizers / pre-tokenizers the others lack.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BIN = os.environ.get("HABLAR_BIN", str(REPO / "build" / "src" / "cli" / "hablar"))
TESTDATA = Path(os.environ.get("HABLAR_TESTDATA", str(REPO.parent / "shared" / "testdata")))
CACHE = Path(os.environ.get("HABLAR_HOME", str(Path.home() / ".cache" / "hablar")))
GGUF = CACHE / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
CORPUS = REPO / "tests" / "data" / "tokenizer-corpus" / "corpus.txt"

sys.path.insert(0, str(REPO / "tools"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from hablar_serve import Server  # noqa: E402
tokenizers = pytest.importorskip("tokenizers")


def corpus_text():
    with open(CORPUS, encoding="utf-8", newline="") as f:  # keep its \r\n
        return f.read()


def corpus_chunks(lines_per_chunk=20):
    """The whole corpus as one text, then in chunks of 20 lines."""
    text = corpus_text()
    lines = text.split("\n")
    return [text] + ["\n".join(lines[i:i + lines_per_chunk]) for i in range(0, len(lines), lines_per_chunk)]


def hablar_encode(model_dir, texts, add_special=False):
    args = [BIN, "tokenize", "-m", str(model_dir), "--batch", "--parse-special", "-"]
    if add_special:
        args.append("--add-special")
    r = subprocess.run(args, input=json.dumps(texts), capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout)


@pytest.fixture(scope="session")
def twin():
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    if not GGUF.exists():
        pytest.fail(f"default model missing: {GGUF}")
    from make_hf_twin import make_twin
    return make_twin(GGUF, CACHE / "hf" / f"{GGUF.stem}-float32", "float32")


def converted_vocab_dirs():
    """The shared GGUF vocabularies that transformers can convert, as tokenizer.json dirs."""
    pytest.importorskip("transformers")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoTokenizer
    out = []
    for g in sorted((TESTDATA / "vocab").glob("ggml-vocab-*.gguf")):
        d = CACHE / "hf-tokenizers" / g.stem.replace("ggml-vocab-", "")
        if not (d / "tokenizer.json").exists():
            try:
                tok = AutoTokenizer.from_pretrained(str(g.parent), gguf_file=g.name)
            except ValueError:  # an architecture transformers cannot convert (bert, mpt, refact)
                continue
            tok.save_pretrained(str(d))
        out.append((d, g.with_suffix(".gguf.inp")))
    return out


def trained_tokenizer_dirs(tmp):
    """Tokenizers trained on the corpus, one per model type, with varied pipelines."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    text = CORPUS.read_text(encoding="utf-8").split("\n")
    specials = ["[UNK]", "[CLS]", "[SEP]", "<s>", "</s>"]
    made = []

    def save(name, tok):
        d = tmp / name
        d.mkdir()
        tok.save(str(d / "tokenizer.json"))
        made.append((d, None))

    wp = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    wp.normalizer = normalizers.BertNormalizer(lowercase=True)
    wp.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    wp.decoder = decoders.WordPiece()
    wp.train_from_iterator(text, trainers.WordPieceTrainer(vocab_size=3000, special_tokens=specials))
    wp.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", wp.token_to_id("[CLS]")), ("[SEP]", wp.token_to_id("[SEP]"))])
    save("wordpiece-bert", wp)

    wl = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    wl.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Lowercase(), normalizers.Strip()])
    wl.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Whitespace(), pre_tokenizers.Digits(individual_digits=True)])
    wl.train_from_iterator(text, trainers.WordLevelTrainer(vocab_size=5000, special_tokens=specials))
    save("wordlevel-whitespace-digits", wl)

    ug = Tokenizer(models.Unigram())
    ug.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Replace(" ", "\u2581")])
    ug.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first")
    ug.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme="first")
    ug.train_from_iterator(text, trainers.UnigramTrainer(vocab_size=8000, special_tokens=specials, unk_token="[UNK]"))
    save("unigram-metaspace", ug)

    bpe = Tokenizer(models.BPE(unk_token="[UNK]", byte_fallback=False))
    bpe.normalizer = normalizers.Sequence([normalizers.NFD(), normalizers.StripAccents(), normalizers.Prepend("\u2581")])
    bpe.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(pattern=" ", behavior="merged_with_next"),
        pre_tokenizers.Punctuation(behavior="isolated"),
        pre_tokenizers.Digits(individual_digits=False)])
    bpe.train_from_iterator(text, trainers.BpeTrainer(vocab_size=3000, special_tokens=specials))
    save("bpe-split-punctuation", bpe)

    # The same BPE with added tokens whose "id" fields lie far past the vocabulary (`tokenizers`
    # gives them the next ids instead) and a decoder chain (Replace, Fuse, Strip after Fuse),
    # edited into the JSON.
    spec = json.loads((made[-1][0] / "tokenizer.json").read_text(encoding="utf-8"))
    common = {"single_word": False, "lstrip": False, "rstrip": False, "normalized": False}
    spec["added_tokens"] += [{"id": 60000, "content": "<far_special>", "special": True, **common},
                             {"id": 65000, "content": "far-word", "special": False, **common}]
    spec["decoder"] = {"type": "Sequence", "decoders": [
        {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
        {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}
    d = tmp / "bpe-added-ids-reassigned"
    d.mkdir()
    (d / "tokenizer.json").write_text(json.dumps(spec), encoding="utf-8")
    made.append((d, None))
    return made


@pytest.fixture(scope="session")
def tokenizer_dirs(tmp_path_factory, request):
    """Without transformers (and torch) only the tokenizers trained here are checked."""
    dirs = trained_tokenizer_dirs(tmp_path_factory.mktemp("tok"))
    try:
        twin = request.getfixturevalue("twin")
        dirs = [(twin, None)] + converted_vocab_dirs() + dirs
    except pytest.skip.Exception:
        pass
    return dirs


def test_tokenizer_ids_identical_to_hf_tokenizers(tokenizer_dirs):
    from tokenizers import Tokenizer
    chunks = corpus_chunks()
    report = []
    for d, inp in tokenizer_dirs:
        texts = list(chunks) + ["an <far_special> and a far-word<far_special>"]
        if inp is not None and inp.exists():
            texts += inp.read_text(encoding="utf-8").split("\n__ggml_vocab_test__\n")
        ref = [e.ids for e in Tokenizer.from_file(str(d / "tokenizer.json")).encode_batch(texts, add_special_tokens=False)]
        got = hablar_encode(d, texts)
        same = sum(r == g for r, g in zip(ref, got))
        report.append(f"{d.name}: {same}/{len(texts)}")
        # Every text exact, the trained Unigram's too: its near-tied segmentations (a piece
        # and its doubling) are decided by the last bits of the scores as `tokenizers` reads
        # them (hf_unigram.cpp, library_rounded); the training differs run to run, so each
        # run brings new ties.
        assert same == len(texts), report[-1]
        # The post-processor's ids (BOS, CLS/SEP) with add_special.
        ref_sp = [e.ids for e in Tokenizer.from_file(str(d / "tokenizer.json")).encode_batch(texts[1:21], add_special_tokens=True)]
        assert hablar_encode(d, texts[1:21], add_special=True) == ref_sp, d.name
    print("\n".join(report))


def test_decode_matches_hf_tokenizers(tokenizer_dirs):
    from tokenizers import Tokenizer
    for d, _ in tokenizer_dirs:
        tok = Tokenizer.from_file(str(d / "tokenizer.json"))
        for text in ["Hello world, it's 2024!", "  two  spaces\tand a tab\nnewline", "ünïcödé 日本語 🦙",
                     "a <far_special> and a far-word"]:
            ids = tok.encode(text, add_special_tokens=False).ids
            ref = tok.decode(ids, skip_special_tokens=True)
            if "\ufffd" in ref:  # a converted vocabulary whose decoder loses bytes: no oracle
                continue
            r = subprocess.run([BIN, "detokenize", "-m", str(d), *map(str, ids)], capture_output=True, text=True)
            assert r.returncode == 0, r.stderr
            assert r.stdout[:-1] == ref, (d.name, text)


# ---- the checkpoint against transformers (float32, CPU) --------------------------------

PROMPTS = [
    "The capital of France is",
    "Here is a short story about a robot who learns to paint. Once upon a time,",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "<|im_start|>user\nWhat are three good reasons to learn a second language?<|im_end|>\n<|im_start|>assistant\n",
]


def teacher_texts():
    """A few hundred tokens each: prose, code and chat markup from the corpus and the prompts."""
    lines = CORPUS.read_text(encoding="utf-8").split("\n")
    prose = "\n".join(lines[:40])
    return [prose, PROMPTS[1] + " the robot looked at the canvas and wondered what colour the sky"
            " should be. It had seen many skies, but none of them had ever been painted by a machine.",
            PROMPTS[3] + "1. It opens doors to new cultures and friendships.\n2. It improves memory."]


@pytest.fixture(scope="session")
def hf_model(twin):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    torch.set_num_threads(2)
    tok = AutoTokenizer.from_pretrained(str(twin))
    model = AutoModelForCausalLM.from_pretrained(str(twin), dtype=torch.float32)
    model.eval()
    return tok, model


@pytest.fixture(scope="session")
def server(twin):
    s = Server(twin)
    yield s
    s.stop()


def teacher_forced(tok, model, server):
    """Top-1 agreement over every position of the teacher texts, and the largest difference
    of the actual tokens' log-probabilities."""
    import torch
    agree = total = 0
    worst = 0.0
    for text in teacher_texts():
        ids = tok(text, add_special_tokens=False).input_ids
        with torch.no_grad():
            logp = torch.log_softmax(model(torch.tensor([ids])).logits[0].double(), dim=-1)
        out = server.post("/v1/completions", {"prompt": ids, "max_tokens": 0, "echo": True, "logprobs": 1})
        lp = out["choices"][0]["logprobs"]
        assert len(lp["tokens"]) == len(ids)
        for i in range(1, len(ids)):
            want = tok.decode([int(torch.argmax(logp[i - 1]))])
            top = next(iter(lp["top_logprobs"][i]))
            total += 1
            agree += top == want or ("\ufffd" in top and "\ufffd" in want)
            worst = max(worst, abs(lp["token_logprobs"][i] - float(logp[i - 1][ids[i]])))
    return agree, total, worst


def test_teacher_forced_top1_against_transformers(hf_model, server):
    agree, total, worst = teacher_forced(*hf_model, server)
    print(f"\nfloat32: teacher-forced top-1 agreement {agree}/{total} = {agree / total:.4f}; "
          f"largest |log p| difference of the actual tokens {worst:.2e}")
    assert agree / total >= 0.99
    assert worst < 1e-2


def test_teacher_forced_top1_bf16_checkpoint(twin):
    """The bfloat16 twin run in place (BF16 kernels) against transformers on the same
    weights widened to float32."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from make_hf_twin import make_twin
    bf16 = make_twin(GGUF, CACHE / "hf" / f"{GGUF.stem}-bfloat16", "bfloat16")
    tok = AutoTokenizer.from_pretrained(str(bf16))
    model = AutoModelForCausalLM.from_pretrained(str(bf16), dtype=torch.float32).eval()
    s = Server(bf16)
    try:
        agree, total, worst = teacher_forced(tok, model, s)
    finally:
        s.stop()
    print(f"\nbfloat16: teacher-forced top-1 agreement {agree}/{total} = {agree / total:.4f}; "
          f"largest |log p| difference {worst:.2e}")
    assert agree / total >= 0.99


def test_greedy_64_tokens_equal_transformers(hf_model, twin):
    import torch
    tok, model = hf_model
    for prompt in PROMPTS:
        ids = tok(prompt, add_special_tokens=False).input_ids
        with torch.no_grad():
            ref = model.generate(torch.tensor([ids]), max_new_tokens=64, do_sample=False,
                                 eos_token_id=None, pad_token_id=tok.eos_token_id)[0][len(ids):].tolist()
        r = subprocess.run([BIN, "run", "-m", str(twin), "-p", prompt, "-n", str(len(ref)), "--temp", "0",
                            "--json", "-t", "2"], capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stderr[-2000:]
        got = json.loads(r.stdout)
        assert got["prompt_ids"] == ids
        gen = got["generated_ids"]
        # hablar stops at an end-of-generation token; transformers was told not to.
        if got["finish_reason"] == "stop":
            assert 0 < len(gen) < len(ref) and ref[len(gen)] in (tok.eos_token_id, 2) or gen[-1:] == ref[len(gen) - 1:len(gen)], prompt
            ref = ref[:len(gen)]
        if gen != ref:
            # hablar keeps its KV cache in F16: where transformers' two best logits are within
            # a few hundredths, the pick may flip. Equal up to such a near-tie, then free.
            k = next(i for i in range(min(len(gen), len(ref))) if gen[i] != ref[i])
            with torch.no_grad():
                logits = model(torch.tensor([ids + ref[:k]])).logits[0, -1]
            top2 = torch.topk(logits, 2).values
            gap = float(top2[0] - top2[1])
            print(f"\n{prompt[:30]!r}: equal for {k} tokens, then a near-tie (top-2 gap {gap:.4f})")
            assert gap < 0.05 and k >= 16, (prompt, k, gap)
        else:
            print(f"\n{prompt[:30]!r}: all {len(gen)} tokens equal")


def test_serve_chat_on_directory(server):
    out = server.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "What is the capital of France?"}],
                                              "max_tokens": 16, "temperature": 0})
    assert "Paris" in out["choices"][0]["message"]["content"]
    assert out["choices"][0]["finish_reason"] == "stop"  # <|im_end|> from the tokenizer files ends it


def test_info_on_directory(twin):
    r = subprocess.run([BIN, "info", str(twin), "--json"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    assert info["architecture"] == "llama"
    assert info["format"] == "huggingface"
    assert info["tokenizer"]["tokens"] == 49152


def test_quantize_at_load(twin):
    r = subprocess.run([BIN, "run", "-m", str(twin), "-p", "The capital of France is", "-n", "4", "--temp", "0",
                        "--json", "-t", "2", "--quantize", "q8_0"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads(r.stdout)["text"].startswith(" Paris")
    r = subprocess.run([BIN, "run", "-m", str(GGUF), "-p", "x", "-n", "1", "--quantize", "q8_0"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode != 0 and "Hugging Face directories" in r.stderr


def test_convert_to_gguf_and_apr_give_the_same_outputs(twin, tmp_path):
    """hablar convert: the directory as GGUF and as APR v2 (tokenizer.json beside it) run
    the same greedy tokens as the directory itself, and the APR file serves chat."""
    def greedy(model):
        r = subprocess.run([BIN, "run", "-m", str(model), "-p", PROMPTS[1], "-n", "32", "--temp", "0", "--json",
                            "-t", "2"], capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stderr[-2000:]
        return json.loads(r.stdout)["generated_ids"]
    want = greedy(twin)
    (tmp_path / "apr").mkdir()
    for out in [tmp_path / "model.gguf", tmp_path / "apr" / "model.apr"]:
        r = subprocess.run([BIN, "convert", str(twin), str(out)], capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stderr[-2000:]
        assert greedy(out) == want, out.name
    s = Server(tmp_path / "apr" / "model.apr")
    try:
        out = s.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "What is the capital of France?"}],
                                              "max_tokens": 16, "temperature": 0})
        assert "Paris" in out["choices"][0]["message"]["content"]
    finally:
        s.stop()
    (tmp_path / "model.gguf").unlink()
