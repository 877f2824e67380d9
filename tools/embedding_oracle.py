#!/usr/bin/env python3
"""Regenerates the embedding golden files (tests/golden/embedding/*.json) from llama.cpp.

The oracle is llama.cpp through llama-cpp-python (CPU) with embedding=True, one context per
pooling type, on synthetic models written by `hablar make-model` (seeded, so
tests/unit/model/embedding_golden_test.cpp writes the very same bytes again):
  * bert (bert-tiny shape, the bge WordPiece vocabulary) in F16 and Q8_0;
  * the same with a reranker's classifier head (rank pooling), and query/document pairs
    built as llama-server's /rerank builds them;
  * nomic-bert (RoPE, SwiGLU, fused qkv) in F16 and Q8_0;
  * decoder embedders: qwen3 and llama (tiny shape, synthetic vocabulary) in F16 and Q8_0;
  * gemma-embedding (EmbeddingGemma's layout, tiny shape) in F16.

Each file holds the model's options, and per text llama.cpp's token ids and, per pooling
type, the raw (unnormalized) embedding: one vector, the per-token vectors for none, the
classifier's scores for rank.

Usage (the oracle venv has llama_cpp):
  ~/.cache/hablar/oracle-venv/bin/python tools/embedding_oracle.py --hablar build/src/cli/hablar
"""
import argparse
import json
import os
import subprocess
import tempfile

from llama_cpp import Llama
from llama_cpp import llama_cpp as C

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GOLDEN = os.path.join(ROOT, "tests", "golden", "embedding")
VOCAB_DIR = "/work/shared/testdata/vocab"
BERT_VOCAB = "ggml-vocab-bert-bge.gguf"
POOLING = {"none": 0, "mean": 1, "cls": 2, "last": 3, "rank": 4}

TEXTS = [
    "hello world",
    "The quick brown fox jumps over the lazy dog.",
    "Embeddings map text to vectors; similar texts get nearby vectors, which retrieval uses "
    "to find the passages that answer a question.",
    "a",
    "Paris is the capital and most populous city of France.",
]
RERANK_QUERY = "What is the capital of France?"
RERANK_DOCS = [
    "Paris is the capital of France.",
    "The giant panda is a bear native to China.",
    "France is a country in Western Europe.",
    "Berlin is the capital of Germany.",
]

# name -> make-model options and the pooling types to record.
MODELS = []
for t in ("f16", "q8_0"):
    MODELS += [
        {"name": f"bert-{t}", "arch": "bert", "shape": "bert-tiny", "type": t,
         "vocab": BERT_VOCAB, "seed": 11, "rank_head": False,
         "poolings": ["none", "mean", "cls", "last"]},
        {"name": f"bert-rank-{t}", "arch": "bert", "shape": "bert-tiny", "type": t,
         "vocab": BERT_VOCAB, "seed": 12, "rank_head": True, "poolings": ["rank", "mean"]},
        {"name": f"nomic-bert-{t}", "arch": "nomic-bert", "shape": "bert-tiny", "type": t,
         "vocab": BERT_VOCAB, "seed": 13, "rank_head": False,
         "poolings": ["none", "mean", "cls", "last"]},
        {"name": f"qwen3-{t}", "arch": "qwen3", "shape": "tiny", "type": t, "vocab": "",
         "seed": 14, "rank_head": False, "poolings": ["mean", "last"]},
        {"name": f"llama-{t}", "arch": "llama", "shape": "tiny", "type": t, "vocab": "",
         "seed": 15, "rank_head": False, "poolings": ["mean", "last"]},
    ]
# EmbeddingGemma: both-way attention with symmetric windows (8 positions: 4 on either side in
# the tiny shape), dense projections after pooling. F16 only: over inputs of 175 tokens the
# both-way attention sums in another order than llama.cpp's (as for every encoder), and Q8_0's
# activation rounding turns those last-bit differences into 1e-4 of cosine.
MODELS.append({"name": "gemma-embedding-f16", "arch": "gemma-embedding", "shape": "tiny",
               "type": "f16", "vocab": "", "seed": 16, "rank_head": False,
               "poolings": ["none", "mean", "cls", "last"]})


def make_model(hablar, spec, path):
    cmd = [hablar, "make-model", "--arch", spec["arch"], "--shape", spec["shape"], "--type",
           spec["type"], "--seed", str(spec["seed"]), "-o", path]
    if spec["vocab"]:
        cmd += ["--vocab", os.path.join(VOCAB_DIR, spec["vocab"])]
    if spec["rank_head"]:
        cmd += ["--rank-head"]
    subprocess.run(cmd, check=True, capture_output=True)


def rounded(v):
    return [float("%.7g" % x) for x in v]


def embed_ids(llm, ids, pooling):
    """Raw embedding of one token sequence, as llama-cpp-python's embed() reads it."""
    llm._batch.reset()
    llm._batch.add_sequence(ids, 0, pooling == "none")
    llm._ctx.kv_cache_clear()
    llm._ctx.decode(llm._batch)
    n = llm.n_embd()
    if pooling == "none":
        ptr = C.llama_get_embeddings(llm._ctx.ctx)
        return [rounded(ptr[j * n:(j + 1) * n]) for j in range(len(ids))]
    ptr = C.llama_get_embeddings_seq(llm._ctx.ctx, 0)
    if pooling == "rank":
        return rounded(ptr[:C.llama_model_n_cls_out(llm._model.model)])
    return rounded(ptr[:n])


def rerank_ids(llm, query, doc):
    """[BOS] query [EOS] [SEP] doc [EOS], each where the vocabulary adds it (llama-server)."""
    vocab = C.llama_model_get_vocab(llm._model.model)
    q = llm.tokenize(query.encode(), add_bos=False, special=False)
    d = llm.tokenize(doc.encode(), add_bos=False, special=False)
    eos = C.llama_vocab_eos(vocab)
    if eos < 0:
        eos = C.llama_vocab_sep(vocab)
    ids = [C.llama_vocab_bos(vocab)] if C.llama_vocab_get_add_bos(vocab) else []
    ids += q
    if C.llama_vocab_get_add_eos(vocab):
        ids.append(eos)
    if C.llama_vocab_get_add_sep(vocab):
        ids.append(C.llama_vocab_sep(vocab))
    ids += d
    if C.llama_vocab_get_add_eos(vocab):
        ids.append(eos)
    return ids


def golden_for(path, spec):
    record = {"model": {k: spec[k] for k in ("arch", "shape", "type", "vocab", "seed",
                                             "rank_head")},
              "inputs": [{"text": t} for t in TEXTS]}
    for pooling in spec["poolings"]:
        llm = Llama(model_path=path, embedding=True, pooling_type=POOLING[pooling],
                    n_ctx=512, n_batch=512, n_ubatch=512, n_threads=2, verbose=False)
        for item in record["inputs"]:
            ids = llm.tokenize(item["text"].encode(), add_bos=True, special=False)
            item["ids"] = ids
            item.setdefault("embeddings", {})[pooling] = embed_ids(llm, ids, pooling)
        if pooling == "rank":
            pairs = [rerank_ids(llm, RERANK_QUERY, d) for d in RERANK_DOCS]
            record["rerank"] = {"query": RERANK_QUERY, "documents": RERANK_DOCS, "ids": pairs,
                                "scores": [embed_ids(llm, p, "rank")[0] for p in pairs]}
        del llm
    return record


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hablar", required=True)
    ap.add_argument("--only", default="", help="comma-separated model names")
    args = ap.parse_args()
    os.makedirs(GOLDEN, exist_ok=True)
    only = set(filter(None, args.only.split(",")))
    with tempfile.TemporaryDirectory() as tmp:
        for spec in MODELS:
            if only and spec["name"] not in only:
                continue
            path = os.path.join(tmp, spec["name"] + ".gguf")
            make_model(args.hablar, spec, path)
            record = golden_for(path, spec)
            out = os.path.join(GOLDEN, spec["name"] + ".json")
            with open(out, "w", encoding="utf-8") as f:
                json.dump(record, f, separators=(",", ":"))
                f.write("\n")
            print("wrote", out)


if __name__ == "__main__":
    main()
