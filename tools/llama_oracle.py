#!/usr/bin/env python3
"""Regenerates the model golden files (tests/golden/model/*.json) from llama.cpp.

The oracle is llama.cpp through llama-cpp-python (built from source, CPU), run on the same
GGUF files hablar's tests load:
  * the default model SmolLM2-135M-Instruct (Q4_1), from the model cache;
  * Gemma 3 270M (Q4_K_M), from the model cache (scripts/fetch-model.sh gemma3);
  * synthetic models written by `hablar make-model` (seeded, so the test regenerates the
    very same bytes), tiny shape, llama / qwen2 / qwen3, in every tested type.

Each golden file holds, per prompt, the prompt's token ids (llama.cpp's tokenizer) and,
under teacher forcing, for every position the top-K token ids with their log-softmax
values, plus the log-softmax at a strided sample of the vocabulary at a few positions.
The default model's file also holds greedy 64-token continuations and a perplexity.

Usage (oracle venv has llama_cpp):
  /root/.cache/hablar/oracle-venv/bin/python tools/llama_oracle.py \
      --hablar build-model/src/cli/hablar [--only smollm2|synthetic]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
from llama_cpp import Llama

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GOLDEN = os.path.join(ROOT, "tests", "golden", "model")
TOP_K = 8
PROBE_COUNT = 128  # vocabulary entries sampled at probe positions
GREEDY_TOKENS = 64

PROMPTS = [
    "The capital of France is",
    "Once upon a time, in a small village by the sea,",
    "def fibonacci(n):\n    if n < 2:\n        return n\n",
    "Translate to French: The weather is nice today.",
    "1, 1, 2, 3, 5, 8, 13, 21,",
    "Q: What is the boiling point of water at sea level?\nA:",
    "#include <stdio.h>\nint main(void) {\n",
    "The three primary colors are",
    "In 1969, Neil Armstrong",
    "SELECT name, age FROM users WHERE",
    "Photosynthesis is the process by which",
    "Dear hiring manager,\n\nI am writing to apply for",
    "List of prime numbers: 2, 3, 5, 7,",
    "The quick brown fox jumps over the lazy dog. The quick brown",
    "日本の首都は",
    "Water is made of hydrogen and",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "To be, or not to be, that is the question:",
    "The mitochondria is the powerhouse of",
    "function add(a, b) { return",
]
# Gemma's own turn markers in place of ChatML's.
GEMMA_PROMPTS = [p if not p.startswith("<|im_start|>") else
                 "<start_of_turn>user\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n"
                 for p in PROMPTS]
SYNTH_PROMPTS = PROMPTS[:6]
SYNTH_ARCHES = ["llama", "qwen2", "qwen3", "gemma", "gemma2", "gemma3", "mixtral", "qwen2moe",
                "qwen3moe", "phi3", "phi2", "smollm3", "granite", "ernie4_5", "olmo2", "starcoder2", "exaone4", "hunyuan-dense", "glm4", "arcee", "mistral3", "exaone", "xverse", "seed_oss", "command-r", "cohere2", "minicpm", "olmoe", "internlm2", "orion", "nemotron", "stablelm", "granitemoe"]
SYNTH_TYPES = ["f32", "f16", "q8_0", "q4_0", "q4_1", "q5_0", "q4_k", "q5_k", "q6_k"]
# Newer families: the float, 8-bit and usual K-quant mix.
ARCH_TYPES = {a: ["f16", "q8_0", "q4_k_m"]
              for a in ("gemma", "gemma2", "gemma3", "mixtral", "qwen2moe", "qwen3moe", "phi3",
                        "phi2", "smollm3", "granite", "ernie4_5", "olmo2", "starcoder2", "exaone4", "hunyuan-dense", "glm4", "arcee", "mistral3", "exaone", "xverse", "seed_oss", "command-r", "cohere2", "minicpm", "olmoe", "internlm2", "orion", "nemotron", "stablelm", "granitemoe")}
# Phi-3's head size; SmolLM3's 8 layers (3 and 7 without RoPE).
ARCH_SHAPES = {"phi3": "tiny-hd96", "smollm3": "tiny-odd", "ernie4_5": "tiny-odd",
               "starcoder2": "tiny-odd", "exaone4": "tiny-odd", "hunyuan-dense": "tiny-odd",
               "cohere2": "tiny-odd", "minicpm": "tiny-odd",
               "olmoe": "tiny-mha"}
ARCH_VOCABS = {"phi3": "ggml-vocab-phi-3.gguf", "phi2": "ggml-vocab-gpt-2.gguf",
               "starcoder2": "ggml-vocab-starcoder.gguf"}  # llama.cpp loads phi3 files with their own
# Variants: a golden name -> (the architecture, extra make-model options recorded in the spec).
VARIANTS = {"qwen2-yarn": ("qwen2", {"rope_scaling": "yarn", "rope_factor": 4.0,
                                     "rope_original_context": 64})}
ARCH_TYPES["qwen2-yarn"] = ["f16", "q4_k_m"]
# Phi-3 LongRoPE (short and long factor sets, attention factor from the original context): at
# the oracle's context of 256 llama.cpp takes the long factors over an original context of 64
# and the short ones over 512.
VARIANTS["phi3-longrope"] = ("phi3", {"rope_scaling": "longrope", "rope_original_context": 64})
VARIANTS["phi3-longrope-short"] = ("phi3", {"rope_scaling": "longrope",
                                            "rope_original_context": 512})
ARCH_TYPES["phi3-longrope"] = ["f16", "q8_0", "q4_k_m"]
ARCH_TYPES["phi3-longrope-short"] = ["f16"]
SYNTH_CTX = 256  # llama.cpp's context (its per-sequence context picks LongRoPE's factors)
SYNTH_SEED = 7
SYNTH_VOCAB = "ggml-vocab-llama-spm.gguf"
PPL_CTX = 256
PPL_CHUNKS = 4


def log_softmax(rows):
    rows = rows.astype(np.float64)
    m = rows.max(axis=-1, keepdims=True)
    return rows - m - np.log(np.exp(rows - m).sum(axis=-1, keepdims=True))


def open_model(path, n_ctx=512):
    # Non-flash attention (llama-cpp-python's default, stated here because hablar's attention
    # copies that path's roundings: q and the softmax weights rounded to F16).
    return Llama(model_path=path, n_ctx=n_ctx, n_batch=512, n_threads=2, logits_all=True,
                 flash_attn=False, verbose=False, seed=0)


def teacher_forced(llm, ids):
    llm.reset()
    llm.eval(ids)
    return log_softmax(np.array(llm.scores[: len(ids)]))


def prompt_record(llm, text, parse_special):
    ids = llm.tokenize(text.encode("utf-8"), add_bos=True, special=parse_special)
    lsm = teacher_forced(llm, ids)
    n_vocab = lsm.shape[1]
    top_ids, top_lsm = [], []
    for row in lsm:
        order = np.argsort(-row, kind="stable")[:TOP_K]
        top_ids.append([int(i) for i in order])
        top_lsm.append([round(float(row[i]), 5) for i in order])
    stride = max(1, n_vocab // PROBE_COUNT)
    probe_ids = list(range(0, n_vocab, stride))[:PROBE_COUNT]
    probe_pos = sorted({0, len(ids) // 2, len(ids) - 1})
    return {
        "text": text,
        "ids": [int(i) for i in ids],
        "top_ids": top_ids,
        "top_logsoftmax": top_lsm,
        "probe_ids": probe_ids,
        "probe_positions": probe_pos,
        "probe_logsoftmax": [[round(float(lsm[p][i]), 5) for i in probe_ids] for p in probe_pos],
    }


def greedy(llm, ids, n):
    llm.reset()
    llm.eval(ids)
    out = []
    for _ in range(n):
        tok = int(np.argmax(np.array(llm.scores[llm.n_tokens - 1])))
        out.append(tok)
        llm.eval([tok])
    return out


def perplexity(llm, text):
    ids = llm.tokenize(text.encode("utf-8"), add_bos=True, special=False)
    ids = ids[: PPL_CTX * PPL_CHUNKS]
    # As llama.cpp's perplexity tool: chunks start with BOS only when the vocabulary adds one.
    bos = llm.token_bos() if ids and ids[0] == llm.token_bos() else -1
    nll, count = 0.0, 0
    for c in range(PPL_CHUNKS):
        chunk = list(ids[c * PPL_CTX:(c + 1) * PPL_CTX])
        if bos >= 0:
            chunk[0] = bos
        lsm = teacher_forced(llm, chunk)
        for j in range(PPL_CTX // 2, PPL_CTX - 1):
            nll -= lsm[j][chunk[j + 1]]
            count += 1
    return {"n_ctx": PPL_CTX, "n_chunks": PPL_CHUNKS, "bos": bos, "ids": [int(i) for i in ids],
            "ppl": float(np.exp(nll / count))}


def write(name, record):
    path = os.path.join(GOLDEN, name + ".json")
    with open(path, "w") as f:
        json.dump(record, f, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {path} ({os.path.getsize(path)} bytes)", file=sys.stderr)


def smollm2_golden(model_path):
    llm = open_model(model_path, n_ctx=512)
    prompts = [prompt_record(llm, p, parse_special=True) for p in PROMPTS]
    greedy_runs = [greedy(llm, rec["ids"], GREEDY_TOKENS) for rec in prompts]
    with open(os.path.join(GOLDEN, "ppl_text.txt"), encoding="utf-8") as f:
        ppl = perplexity(llm, f.read())
    write("smollm2", {"model": os.path.basename(model_path), "top_k": TOP_K, "prompts": prompts,
                      "greedy": greedy_runs, "perplexity": ppl})


def gemma3_golden(model_path):
    llm = open_model(model_path, n_ctx=512)
    prompts = [prompt_record(llm, p, parse_special=True) for p in GEMMA_PROMPTS]
    greedy_runs = [greedy(llm, rec["ids"], GREEDY_TOKENS) for rec in prompts]
    with open(os.path.join(GOLDEN, "ppl_text.txt"), encoding="utf-8") as f:
        ppl = perplexity(llm, f.read())
    write("gemma3-270m", {"model": os.path.basename(model_path), "top_k": TOP_K,
                          "prompts": prompts, "greedy": greedy_runs, "perplexity": ppl})


def synthetic_goldens(hablar, vocab_dir, models_dir=None, types=None, arches=None):
    with tempfile.TemporaryDirectory() as tmp:
        for name in arches or SYNTH_ARCHES + list(VARIANTS):
            arch, extra = VARIANTS.get(name, (name, {}))
            for typ in types or ARCH_TYPES.get(name, SYNTH_TYPES):
                path = os.path.join(models_dir or tmp, f"{name}-{typ}.gguf")
                if not models_dir:
                    opts = [f"--{k.replace('_', '-')}={v}" for k, v in extra.items()]
                    subprocess.run([hablar, "make-model", "--arch", arch,
                                    "--shape", ARCH_SHAPES.get(arch, "tiny"),
                                    "--type", typ,
                                    "--vocab", os.path.join(vocab_dir, ARCH_VOCABS.get(arch, SYNTH_VOCAB)),
                                    "--seed", str(SYNTH_SEED), *opts, "-o", path], check=True)
                llm = open_model(path, n_ctx=SYNTH_CTX)
                prompts = [prompt_record(llm, p, parse_special=False) for p in SYNTH_PROMPTS]
                write(f"synthetic-{name}-{typ}",
                      {"model": {"arch": arch, "shape": ARCH_SHAPES.get(arch, "tiny"), "type": typ,
                                 "vocab": ARCH_VOCABS.get(arch, SYNTH_VOCAB),
                                 "seed": SYNTH_SEED, "n_ctx": SYNTH_CTX, **extra},
                       "top_k": TOP_K, "prompts": prompts})
                del llm
                if not models_dir:
                    os.remove(path)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hablar", default=os.path.join(ROOT, "build", "src", "cli", "hablar"))
    ap.add_argument("--model", default=os.path.expanduser(
        "~/.cache/hablar/models/SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--testdata", default=os.path.join(ROOT, "..", "shared", "testdata"))
    ap.add_argument("--gemma3", default=os.path.expanduser(
        "~/.cache/hablar/models/gemma-3-270m-q4_k_m.gguf"))
    ap.add_argument("--only", choices=["smollm2", "gemma3", "synthetic"])
    ap.add_argument("--types", help="comma-separated synthetic types to regenerate (default: all)")
    ap.add_argument("--arches", help="comma-separated synthetic architectures (default: all)")
    ap.add_argument("--synthetic-dir", help="read <arch>-<type>.gguf from here instead of "
                    "running make-model (files written by the same seeded generator)")
    args = ap.parse_args()
    os.makedirs(GOLDEN, exist_ok=True)
    if args.only in (None, "smollm2"):
        smollm2_golden(args.model)
    if args.only in (None, "gemma3"):
        gemma3_golden(args.gemma3)
    if args.only in (None, "synthetic"):
        synthetic_goldens(args.hablar, os.path.join(args.testdata, "vocab"), args.synthetic_dir,
                          args.types.split(",") if args.types else None,
                          args.arches.split(",") if args.arches else None)


if __name__ == "__main__":
    main()
